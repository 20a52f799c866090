//! ephd and the apiserver restarted under a running control plane: the
//! apiserver's watch caches and client-go informers recover with at most
//! one relist per resource and never loop on `resource version too old`.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::ControlPlane;
use crate::go_client::Driver;

const LEASE_CACHE: &str = "apiserver_watch_cache_initializations_total";
const LEASES: &str = "resource=\"leases\"";

/// Asks the informers for their counts until `done` accepts them.
fn informer_counts(informers: &mut Driver, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        informers.tell("counts");
        let counts = informers.step("counts", Duration::from_secs(10));
        if done(&counts) {
            return counts;
        }
        assert!(
            Instant::now() < deadline,
            "informers never {what}: {counts}{}",
            informers.said()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn restart_ephd_under_informers(keep_data: bool) {
    let data = tempfile::tempdir().expect("data dir");
    let data_flag = format!("--data-dir={}", data.path().display());
    let ephd_args: &[&str] = if keep_data { &[&data_flag] } else { &[] };
    let mut plane = ControlPlane::start(ephd_args);
    let before = plane.driver("leases", &["-nodes=10", "-renewals=1", "-prefix=before"]);
    assert_eq!(before["renewed"], 10, "{before}");
    let events = plane.driver("events", &["-events=10", "-prefix=before"]);
    assert_eq!(events["watched"], 10, "{events}");

    let mut informers = plane.driver_running("informers", &[]);
    informers.step("synced", Duration::from_secs(60));
    let synced = informer_counts(&mut informers, "synced", |c| c["node_leases"] == 10);
    let caches_before = plane.metric(LEASE_CACHE, LEASES);

    plane.stop_ephd();
    plane.start_ephd();

    // Writes through the apiserver work again, and the informers see them.
    let after = plane.driver("leases", &["-nodes=5", "-renewals=2", "-prefix=after"]);
    assert_eq!(after["renewed"], 10, "{after}");
    // Without a data dir the restart lost the earlier leases, and the
    // informers must see that too.
    let expected_leases = if keep_data { 15 } else { 5 };
    let counts = informer_counts(&mut informers, "saw the new leases", |c| {
        c["node_leases"] == expected_leases
    });
    if keep_data {
        // Nothing was lost, and nobody had to list again.
        let listed = plane.driver("leases", &["-nodes=10", "-renewals=0", "-prefix=before"]);
        assert_eq!(listed["listed"], 15, "{listed}");
    }

    // Two more compactor cycles on ephd: a "too old" loop would relist
    // (and re-initialize the apiserver's cache) again and again meanwhile.
    plane.wait_compactions(2, Duration::from_secs(40));
    let caches_after = plane.metric(LEASE_CACHE, LEASES);
    let final_counts = informer_counts(&mut informers, "answered", |_| true);
    assert!(
        caches_after - caches_before <= 1.0,
        "the apiserver's lease cache was initialized {} times after one ephd restart",
        caches_after - caches_before
    );
    for resource in ["lease_lists", "event_lists"] {
        let lists = final_counts[resource].as_i64().unwrap_or(0);
        let first = synced[resource].as_i64().unwrap_or(0);
        assert!(
            lists - first <= 1,
            "informer {resource}: {first} before the restart, {lists} after: {final_counts}"
        );
    }
    assert_eq!(
        final_counts["node_leases"], counts["node_leases"],
        "the informer's leases changed with no writes: {final_counts}"
    );
}

#[test]
fn ephd_restart_without_data_dir_costs_one_relist_at_most() {
    restart_ephd_under_informers(false);
}

#[test]
fn ephd_restart_with_data_dir_loses_nothing_and_costs_one_relist_at_most() {
    restart_ephd_under_informers(true);
}

#[test]
fn apiserver_restart_loses_nothing() {
    let mut plane = ControlPlane::start(&[]);
    let leases = plane.driver("leases", &["-nodes=10", "-renewals=2"]);
    assert_eq!(leases["renewed"], 20, "{leases}");
    let events = plane.driver("events", &["-events=20"]);
    assert_eq!(events["listed"], 20, "{events}");

    plane.restart_apiserver();

    let again = plane.driver("leases", &["-nodes=10", "-renewals=1"]);
    let logs = || plane.server_logs();
    assert_eq!(again["listed"], 10, "{again}{}", logs());
    assert_eq!(again["renewed"], 10, "{again}{}", logs());
    assert_eq!(again["stale"], 0, "{again}{}", logs());
    let events = plane.driver("events", &["-events=0"]);
    assert_eq!(events["listed"], 20, "{events}{}", logs());
}
