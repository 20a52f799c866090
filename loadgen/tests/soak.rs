//! The fault soak, bounded for CI: `ephd-bench soak` against the `ephd`
//! binary of this build, every fault kind at least once in about 70
//! seconds (debug builds), and a report with no violation.
//!
//! The server binary is the `ephd` next to `ephd-bench` in the target
//! directory, which `cargo test --workspace` (what CI runs) builds; run
//! `cargo build -p ephd` first when testing this crate alone, or point
//! `EPHD_BIN` at another build. A missing binary fails the test with a
//! message saying so, never skips it.

mod common;

use common::{ephd_bin, figure};
use serde_json::Value;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The soak bounds itself (the rounds stop at `--duration`, every call has
/// a timeout); this is the backstop if it hangs anyway.
const WATCHDOG: Duration = Duration::from_secs(420);

const KINDS: [&str; 8] = [
    "drop_clients",
    "stall_watchers",
    "malformed",
    "lease_burst",
    "sigkill_restart",
    "compact_mid_watch",
    "list_storm",
    "damaged_snapshot",
];

fn count(report: &Value, name: &str) -> u64 {
    figure(report, name)
        .as_u64()
        .unwrap_or_else(|| panic!("{name} is not a count: {report}"))
}

#[test]
fn soak_with_every_fault_kind_finds_no_violation() {
    let bench = env!("CARGO_BIN_EXE_ephd-bench");
    let ephd = ephd_bin(bench);
    let mut child = Command::new(bench)
        .args([
            "soak",
            "--duration",
            "70s",
            "--round",
            "6s",
            "--nodes",
            "300",
            "--event-rate",
            "80",
            "--storm",
            "30",
            "--pods",
            "1500",
            "--json",
            "--no-progress",
            "--ephd-bin",
        ])
        .arg(&ephd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ephd-bench soak");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for the soak") {
            break Some(s);
        }
        if started.elapsed() > WATCHDOG {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    let Some(status) = status else {
        panic!("the soak did not end within {WATCHDOG:?}:\n{stderr}");
    };
    let report: Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON report ({status}):\n{stdout}\n{stderr}"));
    assert!(
        status.success() && count(&report, "violations") == 0,
        "the soak failed ({status}): {}\n{stderr}",
        report.get("failures").unwrap_or(&Value::Null)
    );
    let faults = figure(&report, "faults");
    for kind in KINDS {
        assert!(
            faults.get(kind).and_then(Value::as_u64).unwrap_or(0) >= 1,
            "fault {kind} was never injected: {faults}"
        );
    }
    let acked = figure(&report, "writes_acked");
    for family in ["node_leases", "events", "pods"] {
        assert!(
            acked.get(family).and_then(Value::as_u64).unwrap_or(0) > 100,
            "too few {family} writes acknowledged to mean anything: {acked}"
        );
    }
    assert!(count(&report, "restarts") >= 2, "{report}");
    assert!(count(&report, "watch_events_checked") > 1000, "{report}");
    assert!(count(&report, "watch_state_compares") > 0, "{report}");
    assert!(count(&report, "burst_deletes_checked") >= 1000, "{report}");
    assert!(count(&report, "malformed_cases") > 10, "{report}");
    assert!(count(&report, "storm_lists_ok") > 0, "{report}");
    assert!(count(&report, "damaged_moved_aside") >= 1, "{report}");
    assert_eq!(count(&report, "server_panics"), 0, "{report}");
    let rss = figure(&report, "peak_rss_mib").as_f64().unwrap_or(f64::MAX);
    assert!(
        rss > 0.0 && rss < count(&report, "rss_budget_mib") as f64,
        "{report}"
    );
}
