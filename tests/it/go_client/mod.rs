//! etcd's own Go client (clientv3 3.6, the one kube-apiserver 1.34+
//! vendors) against a three-member ephd cluster, and the same scenario
//! against a three-member stock etcd cluster for reference: the real grpc-go
//! balancer spreading
//! requests over every endpoint, `WithRequireLeader` watches, and the
//! client's retries while the leader is killed.
//!
//! The driver (tests/go/clientv3-driver, a Go module of ours requiring
//! `go.etcd.io/etcd/client/v3`) is built by scripts/install-references.sh;
//! a missing driver fails the test loudly, it is never skipped.

mod scenarios;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

/// The driver, built by scripts/install-references.sh on clientv3 3.6 from
/// its Go module; a missing driver fails the test with that command.
pub fn driver_binary() -> PathBuf {
    crate::references::binary("clientv3-driver")
}

/// A running driver: its JSON lines arrive on a channel; its stderr (grpc
/// and clientv3 logs) is kept for failure messages.
pub struct Driver {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    stderr: Arc<Mutex<String>>,
}

impl Driver {
    /// Starts `scenario` against `endpoints` with `extra` driver flags.
    pub fn start(scenario: &str, endpoints: &[String], extra: &[&str]) -> Driver {
        let mut cmd = Command::new(driver_binary());
        cmd.arg(format!("-endpoints={}", endpoints.join(",")))
            .arg(format!("-scenario={scenario}"))
            .args(extra);
        Driver::spawn(cmd)
    }

    /// Starts any driver that speaks the same JSON lines (one object with
    /// a "step" per line, "fatal" on failure), for example the kube-driver.
    pub fn spawn(mut cmd: Command) -> Driver {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn the driver {cmd:?}: {e}"));
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err_pipe = child.stderr.take().expect("stderr");
        let keep = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = err_pipe.read(&mut buf) {
                let mut s = keep.lock().unwrap();
                s.push_str(&String::from_utf8_lossy(&buf[..n]));
                if s.len() > 64 * 1024 {
                    let cut = s.len() - 32 * 1024;
                    let cut = (cut..s.len()).find(|&i| s.is_char_boundary(i)).unwrap_or(0);
                    s.drain(..cut);
                }
            }
        });
        let stdin = child.stdin.take();
        Driver {
            child,
            stdin,
            lines,
            seen: Vec::new(),
            stderr,
        }
    }

    /// Waits (at most `limit`) for the line whose "step" is `step`; panics
    /// with everything the driver said when it does not come, or when the
    /// driver reports a fatal error.
    pub fn step(&mut self, step: &str, limit: Duration) -> Value {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(e) => panic!("no {step:?} line from the driver ({e}){}", self.said()),
            };
            self.seen.push(line.clone());
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("driver line {line:?}: {e}{}", self.said()));
            if v.get("fatal").is_some() {
                panic!("driver failed: {line}{}", self.said());
            }
            if v["step"] == step {
                return v;
            }
        }
    }

    /// Writes a line on the driver's stdin (the failover scenario's "the
    /// leader is dead now").
    pub fn tell(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("write to driver");
        stdin.flush().expect("flush driver stdin");
    }

    /// What the driver printed so far, for failure messages.
    pub fn said(&self) -> String {
        format!(
            "\n--- driver stdout ---\n{}\n--- driver stderr (tail) ---\n{}",
            self.seen.join("\n"),
            self.stderr.lock().unwrap()
        )
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
