//! The clientv3 scenarios, each run against a three-member ephd cluster
//! and a three-member stock etcd cluster with the same timing flags and
//! the same assertions: what passes on etcd is what ephd must do.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{
    kv_client::KvClient, maintenance_client::MaintenanceClient, RangeRequest, StatusRequest,
};
use serde_json::Value;

use super::Driver;
use crate::etcd_cluster::StockEtcdCluster;
use crate::harness::{connect_channel, EphdCluster, Server};
use crate::operations::http_get;
use crate::support::prefix_end;

/// Same for both: etcd's 1:10 ratio, ten times faster than its defaults.
const TIMING: &[&str] = &["--heartbeat-interval=50", "--election-timeout=500"];

/// The system under test.
enum Target {
    Ephd(EphdCluster),
    Etcd(StockEtcdCluster),
}

impl Target {
    fn start(ephd: bool) -> Target {
        if ephd {
            Target::Ephd(EphdCluster::start(3, TIMING))
        } else {
            Target::Etcd(StockEtcdCluster::start(3, TIMING))
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Target::Ephd(_) => "ephd",
            Target::Etcd(_) => "etcd",
        }
    }

    /// (index, client endpoint, port serving /metrics) of running members.
    fn members(&self) -> Vec<(usize, String, u16)> {
        match self {
            Target::Ephd(c) => c
                .running()
                .into_iter()
                .map(|(i, m)| (i, m.endpoint(), m.metrics_port()))
                .collect(),
            Target::Etcd(c) => c
                .running()
                .into_iter()
                .map(|(i, m)| (i, m.endpoint(), m.client_port()))
                .collect(),
        }
    }

    fn endpoints(&self) -> Vec<String> {
        self.members().into_iter().map(|(_, e, _)| e).collect()
    }

    fn kill(&mut self, i: usize) {
        match self {
            Target::Ephd(c) => c.kill(i),
            Target::Etcd(c) => c.kill(i),
        }
    }

    fn logs(&self) -> String {
        match self {
            Target::Ephd(c) => c.logs(),
            Target::Etcd(c) => c.logs(),
        }
    }

    /// The index of the member that every running member names leader.
    async fn leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let mut leaders = BTreeSet::new();
            let mut ids = Vec::new();
            for (i, endpoint, _) in self.members() {
                let mut c = MaintenanceClient::new(connect_channel(&endpoint).await);
                match tokio::time::timeout(Duration::from_secs(2), c.status(StatusRequest {})).await
                {
                    Ok(Ok(s)) => {
                        let s = s.into_inner();
                        leaders.insert(s.leader);
                        ids.push((i, s.header.map_or(0, |h| h.member_id)));
                    }
                    _ => {
                        leaders.insert(0);
                    }
                }
            }
            if let (1, Some(&id)) = (leaders.len(), leaders.iter().next()) {
                if let Some(&(i, _)) = ids.iter().find(|(_, m)| *m == id && id != 0) {
                    return i;
                }
            }
            assert!(
                Instant::now() < deadline,
                "{}: no agreed leader: {leaders:?}",
                self.name()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Successful Puts member `port` has served, from its `/metrics`.
fn puts_served(port: u16) -> u64 {
    let (_, body) = http_get(port, "/metrics");
    body.lines()
        .filter(|l| {
            l.starts_with("grpc_server_handled_total{")
                && l.contains(r#"grpc_method="Put""#)
                && l.contains(r#"grpc_code="OK""#)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

async fn basic(ephd: bool) {
    let target = Target::start(ephd);
    let name = target.name();
    let before: Vec<u64> = target.members().iter().map(|m| puts_served(m.2)).collect();
    let mut d = Driver::start("basic", &target.endpoints(), &[]);
    let limit = Duration::from_secs(30);
    let members = d.step("members", limit);
    assert_eq!(
        members["names"].as_array().map(Vec::len),
        Some(3),
        "{name}{}",
        d.said()
    );
    let status = d.step("status", limit);
    assert_eq!(
        status["distinct_leaders"], 1,
        "{name}: every endpoint names one leader"
    );
    let kv = d.step("kv", limit);
    for field in ["put_errors", "get_errors", "mismatches"] {
        assert_eq!(kv[field], 0, "{name} {field}: {kv}{}", d.said());
    }
    assert_eq!(kv["count"], 90, "{name}: {kv}");
    assert_eq!(d.step("txn", limit)["succeeded"], true, "{name}");
    let watch = d.step("watch", limit);
    assert_eq!(
        (&watch["events"], &watch["ordered"], &watch["canceled"]),
        (&Value::from(30), &Value::from(true), &Value::from("")),
        "{name}: the WithRequireLeader watch saw every put once, in order: {watch}{}",
        d.said()
    );
    d.step("done", limit);
    // The balancer spread the puts over every member.
    let served: Vec<u64> = target
        .members()
        .iter()
        .zip(&before)
        .map(|(m, b)| puts_served(m.2) - b)
        .collect();
    assert!(
        served.iter().all(|&n| n > 0),
        "{name}: puts served per member (a member with none: the balancer did not spread) {served:?}"
    );
    eprintln!("{name}: puts served per member through clientv3's balancer: {served:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clientv3_balances_reads_writes_and_watches_over_an_ephd_cluster() {
    basic(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clientv3_balances_reads_writes_and_watches_over_a_stock_etcd_cluster() {
    basic(false).await;
}

/// Every key under `prefix` a linearizable read through `endpoint` finds.
async fn keys_under(endpoint: &str, prefix: &[u8]) -> BTreeSet<Vec<u8>> {
    let mut kv = KvClient::new(connect_channel(endpoint).await);
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        kv.range(RangeRequest {
            key: prefix.to_vec().into(),
            range_end: prefix_end(prefix).into(),
            keys_only: true,
            ..Default::default()
        }),
    )
    .await
    .expect("range in time")
    .expect("range")
    .into_inner();
    resp.kvs.into_iter().map(|kv| kv.key.to_vec()).collect()
}

async fn failover(ephd: bool) {
    let mut target = Target::start(ephd);
    let name = target.name();
    let leader = target.leader().await;
    let mut d = Driver::start("failover", &target.endpoints(), &["-duration=6s"]);
    d.step("writing", Duration::from_secs(20));
    target.kill(leader);
    d.tell("killed");
    let sum = d.step("failover", Duration::from_secs(40));
    let said = d.said();
    d.step("done", Duration::from_secs(5));
    eprintln!("{name}: clientv3 failover summary: {sum}");
    let num = |f: &str| {
        sum[f]
            .as_i64()
            .unwrap_or_else(|| panic!("{name}: {f} in {sum}"))
    };
    let (acked, at_kill) = (num("acked"), num("acked_at_kill"));
    assert!(
        at_kill >= 50,
        "{name}: kill not seen by the driver: {sum}{said}"
    );
    assert!(
        acked - at_kill >= 20,
        "{name}: writes did not resume after the leader was killed: {sum}{said}\n{}",
        target.logs()
    );
    // A put caught by the kill may hang until its 3 s deadline; etcd's
    // own gap is printed above for comparison.
    assert!(
        num("max_gap_ms") < 10_000,
        "{name}: longest write gap too long: {sum}{said}"
    );
    for f in ["watch_dups", "watch_out_of_order", "watch_missing_acked"] {
        assert_eq!(num(f), 0, "{name} {f}: {sum}{said}");
    }
    assert_eq!(sum["watch_err"], "", "{name}: {sum}{said}");
    // Every acknowledged put is on every surviving member.
    let failed: BTreeSet<i64> = sum["failed"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default();
    let attempted = num("attempted");
    for (i, endpoint, _) in target.members() {
        let keys = keys_under(&endpoint, b"fo/k").await;
        let lost: Vec<i64> = (1..=attempted)
            .filter(|n| !failed.contains(n))
            .filter(|n| !keys.contains(format!("fo/k{n:06}").as_bytes()))
            .collect();
        assert!(
            lost.is_empty(),
            "{name}: member {i} lacks acknowledged puts {lost:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clientv3_keeps_writing_and_watching_when_the_ephd_leader_is_killed() {
    failover(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clientv3_keeps_writing_and_watching_when_the_etcd_leader_is_killed() {
    failover(false).await;
}

/// A member left without a leader (the other two killed): clientv3's
/// `WithRequireLeader` watch on it ends with `etcdserver: no leader`, and
/// a `WithRequireLeader` get fails with it, as kube-apiserver expects
/// before it moves to another member.
async fn no_leader(ephd: bool) {
    let mut target = Target::start(ephd);
    let name = target.name();
    let leader = target.leader().await;
    let survivor = (leader + 1) % 3;
    let endpoint = target
        .members()
        .into_iter()
        .find(|m| m.0 == survivor)
        .expect("survivor runs")
        .1;
    let mut d = Driver::start("noleader", &[endpoint], &[]);
    d.step("watching", Duration::from_secs(20));
    for i in 0..3 {
        if i != survivor {
            target.kill(i);
        }
    }
    d.tell("killed");
    let sum = d.step("noleader", Duration::from_secs(30));
    eprintln!("{name}: clientv3 on a member without a leader: {sum}");
    let said = d.said();
    assert_eq!(
        sum["watch_err"], "etcdserver: no leader",
        "{name}: {sum}{said}"
    );
    assert_eq!(
        sum["get_err"], "etcdserver: no leader",
        "{name}: {sum}{said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clientv3_require_leader_watch_ends_on_a_leaderless_etcd_member() {
    no_leader(false).await;
}

/// The same against ephd, which reads the "hasleader" metadata (issue 10
/// item 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clientv3_require_leader_watch_ends_on_a_leaderless_ephd_member() {
    no_leader(true).await;
}
