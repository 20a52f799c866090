//! Running the stock `etcdctl` binary with bounded waits: one-shot commands
//! and background `watch` processes that are killed once they printed enough.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Upper bound for one etcdctl invocation; etcdctl's own `--command-timeout`
/// is shorter, so hitting this means etcdctl itself hung.
pub const ETCDCTL_TIMEOUT: Duration = Duration::from_secs(20);

/// What one etcdctl run produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmdOutput {
    /// Exit code; `None` when killed by a signal (e.g. after a watch).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Locates stock etcdctl of the reference release; panics (never skips)
/// when it is missing so a machine without it cannot produce a green run.
pub fn etcdctl_path() -> PathBuf {
    crate::references::etcdctl()
}

/// Builds an etcdctl v3 command against `endpoint` with short client
/// timeouts, so a broken server fails fast instead of retrying for long.
///
/// The endpoint is passed as `host:port`, as most runbooks write it, so the
/// outputs that echo it stay comparable; the `http://host:port` form (which
/// etcdctl 3.4 sends as the HTTP/2 `:authority`) has its own tests in
/// `authority.rs` through [`run_with_endpoints`].
fn etcdctl_command(endpoint: &str, args: &[String]) -> Command {
    let host_port = endpoint.strip_prefix("http://").unwrap_or(endpoint);
    etcdctl_command_verbatim(host_port, args)
}

/// An etcdctl v3 command with `--endpoints` exactly as given.
fn etcdctl_command_verbatim(endpoints: &str, args: &[String]) -> Command {
    let mut cmd = Command::new(etcdctl_path());
    cmd.arg(format!("--endpoints={endpoints}"))
        .arg("--dial-timeout=3s")
        .arg("--command-timeout=5s")
        .args(args);
    cmd
}

/// Runs `etcdctl ARGS` against `endpoint` (as `host:port`), feeding `stdin`
/// (if any), and waits at most `ETCDCTL_TIMEOUT` for it to exit.
pub fn run(endpoint: &str, args: &[String], stdin: Option<&str>) -> CmdOutput {
    run_command(etcdctl_command(endpoint, args), args, stdin)
}

/// [`run`] with `--endpoints` exactly as given (e.g. `http://host:port`).
pub fn run_with_endpoints(endpoints: &str, args: &[String], stdin: Option<&str>) -> CmdOutput {
    run_command(etcdctl_command_verbatim(endpoints, args), args, stdin)
}

fn run_command(mut cmd: Command, args: &[String], stdin: Option<&str>) -> CmdOutput {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn etcdctl");
    let mut input = child.stdin.take().expect("piped stdin");
    let stdin = stdin.unwrap_or("").to_string();
    // A writer thread: etcdctl may not read all input before exiting.
    std::thread::spawn(move || {
        let _ = input.write_all(stdin.as_bytes());
    });
    let stdout = read_all_in_background(child.stdout.take().expect("piped stdout"));
    let stderr = read_all_in_background(child.stderr.take().expect("piped stderr"));
    let code = wait_bounded(&mut child, ETCDCTL_TIMEOUT)
        .unwrap_or_else(|| panic!("etcdctl {args:?} did not exit within {ETCDCTL_TIMEOUT:?}"));
    CmdOutput {
        code,
        stdout: stdout.recv_timeout(ETCDCTL_TIMEOUT).unwrap_or_default(),
        stderr: stderr.recv_timeout(ETCDCTL_TIMEOUT).unwrap_or_default(),
    }
}

/// Runs `etcdctl watch ARGS` in the background and collects its stdout
/// until a line equal to `until` appeared (then kills it) or `timeout`
/// passed (then kills it too; the caller's comparison shows what is missing).
/// Watch never exits by itself, so this is the only bounded way to use it.
pub fn watch_until(endpoint: &str, args: &[String], until: &str, timeout: Duration) -> CmdOutput {
    let mut cmd = etcdctl_command(endpoint, args);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn etcdctl watch");
    let (tx, lines) = mpsc::channel::<String>();
    let out = child.stdout.take().expect("piped stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let stderr = read_all_in_background(child.stderr.take().expect("piped stderr"));
    let deadline = Instant::now() + timeout;
    let mut stdout = String::new();
    let exited_by_itself = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                let done = line == until;
                stdout.push_str(&line);
                stdout.push('\n');
                if done {
                    break false;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => break false,
            // stdout closed: etcdctl is exiting (e.g. watch canceled by server).
            Err(mpsc::RecvTimeoutError::Disconnected) => break true,
        }
    };
    let code = if exited_by_itself {
        wait_bounded(&mut child, ETCDCTL_TIMEOUT).unwrap_or_else(|| {
            panic!("etcdctl {args:?} closed stdout but did not exit within {ETCDCTL_TIMEOUT:?}")
        })
    } else {
        let _ = child.kill();
        child.wait().expect("wait etcdctl watch").code()
    };
    CmdOutput {
        code,
        stdout,
        stderr: stderr.recv_timeout(ETCDCTL_TIMEOUT).unwrap_or_default(),
    }
}

fn read_all_in_background(mut src: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = src.read_to_end(&mut buf);
        let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
    });
    rx
}

/// Polls `child` until it exits (returns its exit code, `None` if killed by
/// a signal) or `timeout` passes (kills it and returns `None` from the
/// outer Option).
fn wait_bounded(child: &mut Child, timeout: Duration) -> Option<Option<i32>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait etcdctl") {
            return Some(status.code());
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
