//! `ephd-bench lease-expiry` against the `ephd` of this build, small: 2000
//! leases whose deadlines fall within about a second, every key gone
//! through the watch, none before its lease's TTL, and a report with the
//! storm's figures. The server binary is found as in `soak.rs`.

mod common;

use common::ephd_bin;
use serde_json::Value;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LEASES: u64 = 2000;

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("bound").port()
}

/// The server, killed when the test ends however it ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_ephd(bin: &PathBuf, port: u16) -> Server {
    let url = format!("http://127.0.0.1:{port}");
    let child = Command::new(bin)
        .args([
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
        ])
        .arg("--listen-metrics-urls")
        .arg(format!("http://127.0.0.1:{}", free_port()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("ephd starts");
    let mut server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = server.0.try_wait() {
            panic!("ephd exited at start with {status}");
        }
        assert!(Instant::now() < deadline, "ephd did not listen within 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    server
}

fn figure(report: &Value, name: &str) -> f64 {
    common::figure(report, name)
        .as_f64()
        .unwrap_or_else(|| panic!("{name} is not a number: {report}"))
}

#[test]
fn an_expiry_storm_expires_every_key_after_its_ttl_and_reports_it() {
    let bench = env!("CARGO_BIN_EXE_ephd-bench");
    let port = free_port();
    let _server = start_ephd(&ephd_bin(bench), port);
    let out = Command::new(bench)
        .args(["lease-expiry", "--endpoints"])
        .arg(format!("127.0.0.1:{port}"))
        .args([
            "--leases",
            &LEASES.to_string(),
            "--ttl",
            "3",
            "--clients",
            "20",
        ])
        .args([
            "--expiry-timeout",
            "30s",
            "--max-time",
            "2m",
            "--json",
            "--no-progress",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("ephd-bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "lease-expiry failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let line = stdout.lines().last().expect("a JSON line");
    let report: Value = serde_json::from_str(line).expect("the report is JSON");
    assert_eq!(figure(&report, "leases"), LEASES as f64, "{report}");
    assert_eq!(figure(&report, "expired"), LEASES as f64, "{report}");
    assert_eq!(figure(&report, "early_expiries"), 0.0, "{report}");
    assert_eq!(figure(&report, "keys_remaining"), 0.0, "{report}");
    // The grants' TTLs put every deadline within about a second.
    assert!(figure(&report, "deadline_spread_s") < 1.5, "{report}");
    assert!(figure(&report, "expiry_lag_max_ms") > 0.0, "{report}");
    assert!(figure(&report, "ops") > 0.0, "no heartbeat: {report}");
    assert!(figure(&report, "heartbeat_storm_p99_ms") > 0.0, "{report}");
}
