//! What the load tool's tests share: finding this build's ephd and
//! reading figures out of a JSON report.

use serde_json::Value;
use std::path::PathBuf;

/// The server binary: the `ephd` next to `ephd-bench` in the target
/// directory (`cargo test --workspace` builds it), or `EPHD_BIN`. A
/// missing binary fails the test with a message saying so.
pub fn ephd_bin(bench: &str) -> PathBuf {
    let bin = std::env::var_os("EPHD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(bench).with_file_name("ephd"));
    assert!(
        bin.is_file(),
        "no ephd binary at {}: run `cargo build -p ephd` (or the whole workspace's tests), or set EPHD_BIN",
        bin.display()
    );
    bin
}

/// The report's figure `name`; fails the test when it has none.
pub fn figure<'a>(report: &'a Value, name: &str) -> &'a Value {
    report
        .get(name)
        .unwrap_or_else(|| panic!("the report has no {name}: {report}"))
}
