//! Kubernetes' own storage conformance: the shared suites of
//! `k8s.io/apiserver/pkg/storage/testing` run on the apiserver's etcd3
//! `storage.Interface` (tests/go/storage-conformance, built by
//! scripts/install-references.sh) against stock etcd 3.6 as control, a
//! single ephd, and a follower of a three-member ephd cluster.
//!
//! Every suite gets a fresh server, as the etcd3 store's own tests do. Every
//! suite that passes on etcd 3.6 must pass on ephd; one that fails on etcd
//! too is reported and not held against ephd.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::cluster_snapshot::leader;
use crate::harness::{Ephd, EphdCluster, Server, StockEtcd};
use crate::references;

/// The watch progress interval the watch suites expect of the server (the
/// etcd3 store tests start etcd with it).
const PROGRESS: &str = "--experimental-watch-progress-notify-interval=1s";

/// How long one suite may take (the slowest take a few seconds).
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
fn run_suite(name: &str, endpoints: &str) -> (bool, String) {
    let started = Instant::now();
    let out = Command::new(references::binary("storage-conformance.test"))
        .arg(format!("-test.run=^{name}$"))
        .arg(format!("-test.timeout={}s", SUITE_LIMIT.as_secs()))
        .env("EPHD_STORE_ENDPOINTS", endpoints)
        .output()
        .expect("run a storage suite");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let failures: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("_test.go:") || l.contains("_tests.go:") || l.contains("utils.go:"))
        .take(12)
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

/// Runs every suite, each against a server `start` starts; returns the
/// names of the suites that failed, with their output.
fn run_all<S>(start: impl Fn() -> (S, String)) -> Vec<(String, String)> {
    let mut failed = Vec::new();
    for name in suites() {
        let (server, endpoint) = start();
        let (passed, said) = run_suite(&name, &endpoint);
        drop(server);
        if !passed {
            failed.push((name, said));
        }
    }
    failed
}

fn etcd_failures() -> Vec<(String, String)> {
    run_all(|| {
        let etcd = StockEtcd::start_with(&[PROGRESS]);
        let endpoint = etcd.endpoint();
        (etcd, endpoint)
    })
}

/// Asserts that ephd failed no suite that etcd 3.6 passed.
fn assert_no_more_failures(what: &str, ephd: Vec<(String, String)>) {
    if ephd.is_empty() {
        return;
    }
    let etcd = etcd_failures();
    let regressions: Vec<&(String, String)> = ephd
        .iter()
        .filter(|(name, _)| !etcd.iter().any(|(n, _)| n == name))
        .collect();
    assert!(
        regressions.is_empty(),
        "{} storage suites pass on etcd 3.6 and fail on {what}:\n{}",
        regressions.len(),
        regressions
            .iter()
            .map(|(_, said)| said.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn apiserver_storage_suites_pass_on_ephd() {
    let failed = run_all(|| {
        let ephd = Ephd::start(&[PROGRESS]);
        let endpoint = ephd.endpoint();
        (ephd, endpoint)
    });
    assert_no_more_failures("ephd", failed);
}

#[test]
fn apiserver_storage_suites_pass_through_a_cluster_follower() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let failed = run_all(|| {
        let cluster = EphdCluster::start(3, &[PROGRESS]);
        let lead = runtime.block_on(leader(&cluster));
        let follower = cluster
            .running()
            .into_iter()
            .find(|(i, _)| *i != lead)
            .map(|(_, m)| m.endpoint())
            .expect("a follower");
        (cluster, follower)
    });
    assert_no_more_failures("a follower of a three-member ephd", failed);
}

#[test]
fn apiserver_storage_suites_run_on_etcd_as_control() {
    // The control run proves the suites themselves work here: if most of
    // them failed on etcd 3.6, "no more failures than etcd" would mean
    // nothing.
    let failed = etcd_failures();
    assert!(
        failed.len() <= 2,
        "{} storage suites fail on stock etcd 3.6:\n{}",
        failed.len(),
        failed
            .iter()
            .map(|(_, said)| said.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}
