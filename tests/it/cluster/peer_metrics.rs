//! etcd's peer network metrics (`etcd_network_peer_*`,
//! `etcd_network_active_peers`, `etcd_network_disconnected_peers_total`)
//! on a cluster member's `/metrics`: per peer, under the member IDs that
//! MemberList gives, in etcd's hex label format; the same families, types
//! and label names as a three-member stock etcd shows, healthy and after a
//! member is lost; and, as on a single stock etcd, none on a single member.
//! Every member names itself in `etcd_server_id`, as etcd does.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{MemberListRequest, PutRequest, StatusRequest};

use crate::cluster::snapshot::leader;
use crate::cluster::TIMING;
use crate::etcd_cluster::StockEtcdCluster;
use crate::harness::{free_port, Ephd, EphdCluster, Server, StockEtcd};
use crate::metrics::scrape_text;
use crate::support::within;

/// How long the metrics may take to show what the test waits for (etcd
/// observes its round trips from its prober).
const SETTLE: Duration = Duration::from_secs(45);

/// The families this test is about.
fn is_peer_family(name: &str) -> bool {
    name.starts_with("etcd_network_peer_")
        || name == "etcd_network_active_peers"
        || name == "etcd_network_disconnected_peers_total"
}

/// One scrape, peer families only: each family's type, and its series as
/// (sample name, labels) with their values.
#[derive(Debug, Default)]
struct Scrape {
    types: BTreeMap<String, String>,
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl Scrape {
    /// Each family with its type and the label names its samples carry.
    fn shape(&self) -> BTreeMap<String, (String, BTreeSet<String>)> {
        let mut shape: BTreeMap<String, (String, BTreeSet<String>)> = self
            .types
            .iter()
            .map(|(n, t)| (n.clone(), (t.clone(), BTreeSet::new())))
            .collect();
        for (name, labels, _) in &self.samples {
            let family = shape
                .keys()
                .filter(|f| name.starts_with(f.as_str()))
                .max_by_key(|f| f.len())
                .cloned()
                .unwrap_or_else(|| panic!("sample {name} of no family"));
            let names = &mut shape.get_mut(&family).expect("family").1;
            names.extend(labels.keys().cloned());
        }
        shape
    }

    /// The value of sample `name` whose labels include `want`.
    fn value(&self, name: &str, want: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|(n, labels, _)| {
                n == name
                    && want
                        .iter()
                        .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, _, v)| *v)
    }
}

fn parse(text: &str) -> Scrape {
    let mut s = Scrape::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE line");
            if is_peer_family(name) {
                s.types.insert(name.to_string(), kind.to_string());
            }
            continue;
        }
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .filter(|base| s.types.get(*base).is_some_and(|t| t == "histogram"))
            .unwrap_or(name);
        if line.starts_with('#') || !is_peer_family(family) {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("sample line");
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').expect("closing brace");
                let labels = body
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(|p| {
                        let (k, v) = p.split_once('=').expect("label=value");
                        (k.to_string(), v.trim_matches('"').to_string())
                    })
                    .collect();
                (name, labels)
            }
            None => (series, BTreeMap::new()),
        };
        let value = value.parse().unwrap_or_else(|_| panic!("value in {line}"));
        s.samples.push((name.to_string(), labels, value));
    }
    s
}

/// GETs `/metrics` on `port` over HTTP/1.0 (stock etcd answers an HTTP/1.1
/// request chunked), peer families only.
fn scrape(port: u16) -> Scrape {
    parse(&scrape_text(port))
}

/// `n` puts through `s`, each retried until [`SETTLE`] while the cluster
/// elects a leader.
async fn write(s: &impl Server, n: usize) {
    let mut kv = s.kv().await;
    for i in 0..n {
        let req = PutRequest {
            key: format!("peer-metrics/{i}").into_bytes().into(),
            value: vec![b'v'; 100].into(),
            ..Default::default()
        };
        let deadline = Instant::now() + SETTLE;
        while let Err(e) = within("put", kv.put(req.clone())).await {
            assert!(Instant::now() < deadline, "put {i}: {e:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The member IDs as MemberList through `s` gives them, by peer URL.
async fn member_ids(s: &impl Server) -> BTreeMap<String, u64> {
    let mut c = s.cluster().await;
    let list = within("member list", c.member_list(MemberListRequest::default()))
        .await
        .expect("member list")
        .into_inner();
    list.members
        .into_iter()
        .map(|m| (m.peer_ur_ls.first().cloned().unwrap_or_default(), m.id))
        .collect()
}

/// The member ID `s` reports in Status.
pub(crate) async fn member_id(s: &impl Server) -> u64 {
    let mut c = s.maintenance().await;
    let status = within("status", c.status(StatusRequest {}))
        .await
        .expect("status")
        .into_inner();
    status.header.expect("header").member_id
}

/// Whether `s`, scraped from member `me`, shows traffic both ways with
/// each of `peers`, each of them active, and nothing else active.
fn shows_every_peer(s: &Scrape, me: u64, peers: &[u64]) -> Result<(), String> {
    let local = format!("{me:x}");
    for p in peers {
        let id = format!("{p:x}");
        for (sample, label) in [
            ("etcd_network_peer_sent_bytes_total", "To"),
            ("etcd_network_peer_received_bytes_total", "From"),
            ("etcd_network_peer_round_trip_time_seconds_count", "To"),
        ] {
            match s.value(sample, &[(label, &id)]) {
                Some(v) if v > 0.0 => {}
                other => return Err(format!("{sample}{{{label}={id}}}: {other:?}")),
            }
        }
        let active = s.value(
            "etcd_network_active_peers",
            &[("Local", &local), ("Remote", &id)],
        );
        if active != Some(1.0) {
            return Err(format!("active peer {local}->{id}: {active:?}"));
        }
    }
    let total: f64 = s
        .samples
        .iter()
        .filter(|(n, _, _)| n == "etcd_network_active_peers")
        .map(|(_, _, v)| v)
        .sum();
    if total != peers.len() as f64 {
        return Err(format!("{total} active peers, want {}", peers.len()));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_counts_its_traffic_with_each_peer_under_etcd_labels() {
    let cluster = EphdCluster::start(3, TIMING);
    let l = leader(&cluster).await;
    let leader_member = cluster.member(l).expect("leader runs");
    let ids = member_ids(leader_member).await;
    assert_eq!(ids.len(), 3, "{ids:?}");
    write(leader_member, 20).await;

    for (i, m) in cluster.running() {
        let me = ids[&m.peer_url()];
        let peers: Vec<u64> = ids.values().copied().filter(|&id| id != me).collect();
        let deadline = Instant::now() + SETTLE;
        let s = loop {
            let s = scrape(m.metrics_port());
            match shows_every_peer(&s, me, &peers) {
                Ok(()) => break s,
                Err(e) if Instant::now() > deadline => {
                    panic!("m{i} ({me:x}): {e}\n{s:#?}\n{}", cluster.logs())
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        // The member's own ID, as etcd serves it.
        let text = scrape_text(m.metrics_port());
        let own = format!("etcd_server_id{{server_id=\"{me:x}\"}} 1");
        assert!(text.contains(&own), "m{i}: no {own}");
        // Every ID label names another member, in etcd's hex format.
        let names: BTreeSet<String> = peers.iter().map(|p| format!("{p:x}")).collect();
        for (name, labels, _) in &s.samples {
            for key in ["To", "From", "Remote"] {
                if let Some(v) = labels.get(key) {
                    assert!(names.contains(v), "m{i}: {name} {key}={v}, peers {names:?}");
                }
            }
            if let Some(v) = labels.get("Local") {
                assert_eq!(*v, format!("{me:x}"), "m{i}: {name}");
            }
        }
    }
}

/// Families, types and label names of every running member's scrape.
fn shapes(ports: &[u16]) -> BTreeMap<String, (String, BTreeSet<String>)> {
    let mut all = BTreeMap::new();
    for &p in ports {
        all.extend(scrape(p).shape());
    }
    all
}

/// Where the running members of each cluster serve `/metrics`: stock
/// etcd on its client port, ephd on its metrics port.
fn scrape_ports(etcd: &StockEtcdCluster, ephd: &EphdCluster) -> (Vec<u16>, Vec<u16>) {
    (
        etcd.running()
            .iter()
            .map(|(_, m)| m.client_port())
            .collect(),
        ephd.running()
            .iter()
            .map(|(_, m)| m.metrics_port())
            .collect(),
    )
}

/// Waits until the scrapes of `ports` show every family of `want`.
async fn shape_with(
    what: &str,
    ports: &[u16],
    want: &[&str],
) -> BTreeMap<String, (String, BTreeSet<String>)> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let shape = shapes(ports);
        if want.iter().all(|f| shape.contains_key(*f)) {
            return shape;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {want:?} not all in {shape:#?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_metric_families_are_stock_etcds_healthy_and_after_a_loss() {
    let mut etcd = StockEtcdCluster::start(3, &[]);
    let mut ephd = EphdCluster::start(3, TIMING);
    leader(&ephd).await;
    write(etcd.running()[0].1, 10).await;
    write(ephd.running()[0].1, 10).await;

    let healthy = [
        "etcd_network_active_peers",
        "etcd_network_peer_received_bytes_total",
        "etcd_network_peer_round_trip_time_seconds",
        "etcd_network_peer_sent_bytes_total",
    ];
    let (etcd_ports, ephd_ports) = scrape_ports(&etcd, &ephd);
    let want = shape_with("stock etcd", &etcd_ports, &healthy).await;
    let got = shape_with("ephd", &ephd_ports, &healthy).await;
    for f in healthy {
        assert!(!want[f].1.is_empty(), "{f}: stock etcd shows no labels");
        assert_eq!(got[f], want[f], "{f}: ephd against stock etcd");
    }

    // Stock etcd's ID labels are its member IDs in hex (and "0", which it
    // uses for bytes whose sender it does not know).
    let etcd_ids = member_ids(etcd.running()[0].1).await;
    let hex: BTreeSet<String> = etcd_ids.values().map(|id| format!("{id:x}")).collect();
    for &p in &etcd_ports {
        for (name, labels, _) in scrape(p).samples {
            for (k, v) in labels.iter().filter(|(k, _)| *k != "le") {
                assert!(
                    hex.contains(v) || v == "0",
                    "stock etcd {name} {k}={v}: {hex:?}"
                );
            }
        }
    }

    // A member lost: the others count send failures and a disconnection.
    etcd.kill(2);
    ephd.kill(2);
    write(etcd.running()[0].1, 5).await;
    write(ephd.running()[0].1, 5).await;
    let lost = [
        "etcd_network_disconnected_peers_total",
        "etcd_network_peer_sent_failures_total",
    ];
    let all: Vec<&str> = healthy.iter().chain(&lost).copied().collect();
    let (etcd_ports, ephd_ports) = scrape_ports(&etcd, &ephd);
    let want = shape_with("stock etcd after a loss", &etcd_ports, &all).await;
    let got = shape_with("ephd after a loss", &ephd_ports, &all).await;
    assert_eq!(got, want, "ephd against stock etcd, one member lost");
}

#[tokio::test]
async fn a_single_member_lists_no_peers_as_single_etcd() {
    let etcd = StockEtcd::start();
    let metrics_port = free_port();
    let url = format!("http://127.0.0.1:{metrics_port}");
    let ephd = Ephd::start(&["--listen-metrics-urls", &url]);
    write(&etcd, 3).await;
    write(&ephd, 3).await;
    let etcd_port = etcd
        .endpoint()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("etcd's client port");
    for (who, port) in [("stock etcd", etcd_port), ("ephd", metrics_port)] {
        let text = scrape_text(port);
        assert!(text.contains("etcd_server_has_leader 1"), "{who}: {text}");
        // Both name themselves with the ID Status gives, in hex.
        let id = if who == "ephd" {
            member_id(&ephd).await
        } else {
            member_id(&etcd).await
        };
        let own = format!("etcd_server_id{{server_id=\"{id:x}\"}} 1");
        assert!(text.contains(&own), "{who}: no {own} in {text}");
        let s = parse(&text);
        assert!(
            s.types.is_empty() && s.samples.is_empty(),
            "{who} lists peer metrics: {s:#?}"
        );
    }
}
