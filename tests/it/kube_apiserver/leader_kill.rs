//! The override store as a three-member cluster whose leader is killed
//! while kubelets renew their Leases through the apiserver: three-member
//! ephd beside three-member stock etcd 3.6, same load, same run. Each side
//! must recover by itself (renewals succeed again, every Lease renews
//! afterwards); the apiserver-side failures and the longest gap between
//! acknowledged renewals are printed side by side.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::ControlPlane;
use crate::cluster::leader::leader_of;
use crate::etcd_cluster::StockEtcdCluster;
use crate::harness::{EphdCluster, Server};

/// The same Raft timings for both (etcd's flags; ephd takes them too).
const TIMING: &[&str] = &["--heartbeat-interval=100", "--election-timeout=1000"];
const NODES: &str = "-nodes=40";
/// Long enough for the election and the apiserver's clients to move on.
const LOAD: &str = "-duration=20s";

/// The store's current revision, read from `endpoint`.
async fn revision(endpoint: &str) -> i64 {
    let mut client = crate::harness::connect_client(endpoint).await;
    let resp = client.get("any", None).await.expect("range");
    resp.header().expect("header").revision()
}

/// Runs the load on `plane`, kills the leader among `endpoints` once the
/// renewals have moved the store on by two rounds, and returns the load's
/// result.
fn load_with_leader_kill(
    plane: &ControlPlane,
    endpoints: &[String],
    kill: impl FnOnce(usize),
) -> Value {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (lead, _) = runtime.block_on(leader_of(endpoints, None));
    let follower = endpoints[(lead + 1) % endpoints.len()].clone();
    let mut load = plane.driver_running("load", &[NODES, "-interval=1s", "-events-per-s=5", LOAD]);
    load.step("created", Duration::from_secs(60));
    let start = runtime.block_on(revision(&follower));
    let deadline = Instant::now() + Duration::from_secs(15);
    while runtime.block_on(revision(&follower)) < start + 80 {
        assert!(
            Instant::now() < deadline,
            "the renewals never reached the store"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    kill(lead);
    let result = load.step("load", Duration::from_secs(90));
    load.step("done", Duration::from_secs(10));
    result
}

fn assert_recovered(what: &str, plane: &ControlPlane, result: &Value) {
    let stall = result["longest_stall_ms"].as_f64().unwrap_or(f64::MAX);
    assert!(
        stall < 15_000.0,
        "{what}: renewals never resumed within the load: {result}"
    );
    let after = plane.driver("leases", &[NODES, "-renewals=1"]);
    assert!(after["failed"].is_null(), "{what}: {after}");
    assert_eq!(after["renewed"], 40, "{what}: {after}");
}

#[test]
fn a_killed_override_leader_costs_the_apiserver_a_short_stall_only() {
    let mut ours = EphdCluster::start(3, TIMING);
    let ephd_endpoints: Vec<String> = ours.running().iter().map(|(_, m)| m.endpoint()).collect();
    let ephd_plane = ControlPlane::start_with_override(&ephd_endpoints.join(";"));
    let ephd_result = load_with_leader_kill(&ephd_plane, &ephd_endpoints, |i| ours.kill(i));
    assert_recovered("ephd", &ephd_plane, &ephd_result);
    drop(ephd_plane);

    let mut theirs = StockEtcdCluster::start(3, TIMING);
    let etcd_endpoints: Vec<String> = (0..3)
        .filter_map(|i| theirs.member(i))
        .map(|m| format!("http://127.0.0.1:{}", m.client_port()))
        .collect();
    let etcd_plane = ControlPlane::start_with_override(&etcd_endpoints.join(";"));
    let etcd_result = load_with_leader_kill(&etcd_plane, &etcd_endpoints, |i| theirs.kill(i));
    assert_recovered("etcd", &etcd_plane, &etcd_result);

    for (name, r) in [("ephd", &ephd_result), ("etcd 3.6", &etcd_result)] {
        eprintln!(
            "leader killed under load, {name}: {} renewals, {} failed, p99 {} ms, longest stall {} ms",
            r["renewals"], r["failed"], r["p99_ms"], r["longest_stall_ms"]
        );
    }
}
