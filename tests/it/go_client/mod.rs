//! etcd's own Go client (clientv3 of etcd 3.4, from Debian's
//! `golang-etcd-server-dev`, built with Debian's Go 1.19) against a
//! three-member ephd cluster, and the same scenario against a three-member
//! stock etcd cluster for reference: the real grpc-go balancer spreading
//! requests over every endpoint, `WithRequireLeader` watches, and the
//! client's retries while the leader is killed.
//!
//! The driver (tests/go/clientv3-driver) is built once per test run into
//! the target dir (Go's build cache sits there too, so a rebuild is fast);
//! a missing Go or clientv3 fails the test loudly, it is never skipped:
//! scripts/install-go-client.sh installs both (scripts/test.sh runs it).

mod scenarios;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::Value;

/// Where Debian's golang-1.19-go puts the go tool.
const DEBIAN_GO: &str = "/usr/lib/go-1.19/bin/go";

/// Debian's GOPATH of Go library sources (golang-*-dev packages).
const GOCODE: &str = "/usr/share/gocode";

/// The go tool: `$EPHD_TEST_GO` when set, else Debian's Go 1.19.
fn go_tool() -> PathBuf {
    let go = std::env::var_os("EPHD_TEST_GO")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEBIAN_GO));
    assert!(
        go.is_file(),
        "Go not found at {}: run scripts/install-go-client.sh (scripts/test.sh does) \
         to install golang-1.19-go and golang-etcd-server-dev",
        go.display()
    );
    let clientv3 = Path::new(GOCODE).join("src/go.etcd.io/etcd/clientv3");
    assert!(
        clientv3.is_dir(),
        "etcd's Go client sources not found at {}: run scripts/install-go-client.sh \
         (Debian package golang-etcd-server-dev)",
        clientv3.display()
    );
    go
}

/// Builds the driver once per test run (GOPATH mode over Debian's Go
/// sources, no network) and returns its path.
pub fn driver_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let go = go_tool();
        let out_dir = Path::new(env!("CARGO_BIN_EXE_ephd"))
            .parent()
            .expect("target dir")
            .join("go-clientv3-driver");
        let bin = out_dir.join("clientv3-driver");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/go/clientv3-driver");
        let output = Command::new(&go)
            .args(["build", "-o"])
            .arg(&bin)
            .arg(".")
            .current_dir(&src)
            .env("GO111MODULE", "off")
            .env("GOPATH", GOCODE)
            .env("GOCACHE", out_dir.join("cache"))
            .env("GOFLAGS", "")
            .env("GOPROXY", "off")
            .env("CGO_ENABLED", "0")
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", go.display()));
        assert!(
            output.status.success(),
            "building the clientv3 driver failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        bin
    })
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
        let mut child = Command::new(driver_binary())
            .arg(format!("-endpoints={}", endpoints.join(",")))
            .arg(format!("-scenario={scenario}"))
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the clientv3 driver");
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
