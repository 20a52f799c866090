//! Kubernetes' own storage conformance: the shared suites of
//! `k8s.io/apiserver/pkg/storage/testing` run on the apiserver's etcd3
//! `storage.Interface`, and on the watch cache (`cacher`) in front of it
//! (tests/go/storage-conformance, built by scripts/install-references.sh),
//! against stock etcd 3.6 as control, a single ephd, and a follower of a
//! three-member ephd cluster.
//!
//! Every suite gets a fresh server, as the apiserver's own tests do, and
//! every suite must pass on each (they all pass on etcd 3.6). The store
//! suites get the 1 s progress interval the etcd3 store's tests give etcd;
//! the cacher suites get the server's defaults, as the cacher's tests do
//! (some expect a list at the newest revision to reach the store, which a
//! cache kept fresh by progress notifications would answer itself).
//!
//! Not run on ephd's defaults, with the reason: the sub-cases that assume
//! a fresh store's revisions start at 1 ([`FROM_REVISION_1`]): watches
//! from resource version 1, and cacher list cases that expect the store
//! to be asked for revision 5, 6, 7 and 8 exactly. By default ephd starts
//! its revisions above every earlier run's (README, "Restarts") and
//! answers older ones as compacted, so that kube-apiserver relists after a
//! restart instead of resuming from a revision of a store that no longer
//! exists. With `--revision-continuity=false` ephd starts at 1 like etcd,
//! and there every suite runs, those sub-cases included.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::cluster::snapshot::leader;
use crate::harness::{Ephd, EphdCluster, Server, StockEtcd};
use crate::references;

/// The watch progress interval the watch suites expect of the server (the
/// etcd3 store tests start etcd with it).
const PROGRESS: &str = "--experimental-watch-progress-notify-interval=1s";

/// The sub-cases that assume a fresh store's revisions start at 1 (a Go
/// test pattern: alternatives, each a test name and a sub-case name).
const FROM_REVISION_1: &str = "^TestWatchSemantics$/RV=1$\
    |^TestCacherWatchSemantics$/RV=1$\
    |^TestCacherList(ConsistentFromCache|FromStore)$/^test_List_with_resource_version_of_[a-z]+_write,_match=Exact$";

/// The flags a suite's server gets: the store suites run with the
/// progress interval, the cacher suites on the server's defaults.
fn flags_for(suite: &str) -> &'static [&'static str] {
    if suite.starts_with("TestCacher") {
        &[]
    } else {
        &[PROGRESS]
    }
}

/// How long one suite may take (the slowest, the cacher suites that wait
/// for the cache to see a compaction, take about 18 s).
const SUITE_LIMIT: Duration = Duration::from_secs(120);

fn suites() -> Vec<String> {
    let out = Command::new(references::binary("storage-conformance.test"))
        .args(["-test.list", "."])
        .output()
        .expect("list the storage suites");
    assert!(out.status.success(), "{out:?}");
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("Test"))
        .map(str::to_string)
        .collect();
    assert!(names.len() > 40, "too few suites: {names:?}");
    names
}

/// Runs one suite against `endpoints`; returns whether it passed and the
/// tail of what it printed.
fn run_suite(name: &str, endpoints: &str, skip: Option<&str>) -> (bool, String) {
    let started = Instant::now();
    let out = Command::new(references::binary("storage-conformance.test"))
        .arg(format!("-test.run=^{name}$"))
        .args(skip.map(|s| format!("-test.skip={s}")))
        .arg(format!("-test.timeout={}s", SUITE_LIMIT.as_secs()))
        .env("EPHD_STORE_ENDPOINTS", endpoints)
        .output()
        .expect("run a storage suite");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // The failing sub-cases and the assertions' lines, with the first
    // assertion's whole message (a diff, often).
    let lines: Vec<&str> = text.lines().collect();
    let is_assertion =
        |l: &&str| l.contains("_test.go:") || l.contains("_tests.go:") || l.contains("utils.go:");
    let first_message = lines
        .iter()
        .position(is_assertion)
        .map(|at| {
            lines[at..]
                .iter()
                .skip(1)
                .take_while(|l| !is_assertion(l) && !l.trim_start().starts_with("--- "))
                .take(30)
                .copied()
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let failures: Vec<&str> = lines
        .iter()
        .filter(|l| l.trim_start().starts_with("--- FAIL") || is_assertion(l))
        .take(24)
        .copied()
        .chain(first_message)
        .collect();
    (
        out.status.success(),
        format!(
            "{name} ({:.1?}): {}",
            started.elapsed(),
            failures.join("\n    ")
        ),
    )
}

/// Runs every suite, each against a server `start` starts with the flags
/// it is given; returns the names of the suites that failed, with their
/// output.
fn run_all<S>(skip: Option<&str>, start: impl Fn(&[&str]) -> (S, String)) -> Vec<(String, String)> {
    let mut failed = Vec::new();
    for name in suites() {
        let (server, endpoint) = start(flags_for(&name));
        let (passed, said) = run_suite(&name, &endpoint, skip);
        drop(server);
        if !passed {
            failed.push((name, said));
        }
    }
    failed
}

fn etcd_failures() -> Vec<(String, String)> {
    run_all(None, |flags| {
        let etcd = StockEtcd::start_with(flags);
        let endpoint = etcd.endpoint();
        (etcd, endpoint)
    })
}

/// Asserts that every suite passed on `what` (the control test shows
/// they all pass on etcd 3.6).
fn assert_all_passed(what: &str, failed: Vec<(String, String)>) {
    assert!(
        failed.is_empty(),
        "{} storage suites fail on {what} (all pass on etcd 3.6):\n{}",
        failed.len(),
        failed
            .iter()
            .map(|(_, said)| said.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn apiserver_storage_suites_pass_on_ephd() {
    let failed = run_all(Some(FROM_REVISION_1), |flags| {
        let ephd = Ephd::start(flags);
        let endpoint = ephd.endpoint();
        (ephd, endpoint)
    });
    assert_all_passed("ephd", failed);
}

#[test]
fn apiserver_storage_suites_pass_on_ephd_starting_at_revision_1() {
    let failed = run_all(None, |flags| {
        let ephd = Ephd::start(&[flags, &["--revision-continuity=false"]].concat());
        let endpoint = ephd.endpoint();
        (ephd, endpoint)
    });
    assert_all_passed("ephd --revision-continuity=false", failed);
}

#[test]
fn apiserver_storage_suites_pass_through_a_cluster_follower() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let failed = run_all(Some(FROM_REVISION_1), |flags| {
        let cluster = EphdCluster::start(3, flags);
        let lead = runtime.block_on(leader(&cluster));
        let follower = cluster
            .running()
            .into_iter()
            .find(|(i, _)| *i != lead)
            .map(|(_, m)| m.endpoint())
            .expect("a follower");
        (cluster, follower)
    });
    assert_all_passed("a follower of a three-member ephd", failed);
}

#[test]
fn apiserver_storage_suites_pass_on_etcd_as_control() {
    // The control proves the suites and this runner work here: "passes on
    // ephd" means something only if they pass on etcd 3.6.
    assert_all_passed("stock etcd 3.6", etcd_failures());
}
