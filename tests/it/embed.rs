//! Exact-etcd mode (`--etcd-compat`) and the embedding API (`ephd::embed`):
//! a fresh test server must answer a test suite's first requests exactly
//! as a fresh stock etcd does, and an embedded one must start, serve real
//! clients and stop from inside a test.

use std::net::TcpStream;
use std::time::Duration;

use ephd::embed::Embedded;
use etcd_client::{Client, GetOptions, PutOptions};

use crate::harness::{Ephd, Server, StockEtcd};

/// What a test suite typically checks on a fresh etcd, as comparable text:
/// the revision of a first and second put, the key count, a put naming an
/// unknown lease, and the header revision of a read of nothing.
async fn fresh_start_answers(endpoint: &str) -> Vec<String> {
    let mut client = Client::connect([endpoint], None).await.expect("connect");
    let mut out = Vec::new();
    let empty = client
        .get(
            "",
            Some(GetOptions::new().with_all_keys().with_count_only()),
        )
        .await
        .expect("count on a fresh server");
    out.push(format!(
        "fresh: count {} revision {}",
        empty.count(),
        empty.header().expect("header").revision()
    ));
    for (key, value) in [("a", "1"), ("b", "2")] {
        let put = client.put(key, value, None).await.expect("put");
        out.push(format!(
            "put {key}: revision {}",
            put.header().expect("header").revision()
        ));
    }
    let unknown = client
        .put("c", "3", Some(PutOptions::new().with_lease(0x1234)))
        .await;
    out.push(match unknown {
        Ok(r) => format!(
            "unknown lease: accepted at {:?}",
            r.header().map(|h| h.revision())
        ),
        Err(etcd_client::Error::GRpcStatus(s)) => {
            format!("unknown lease: {:?} {:?}", s.code(), s.message())
        }
        Err(e) => format!("unknown lease: {e}"),
    });
    let all = client
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .expect("get all");
    let keys: Vec<String> = all
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect();
    out.push(format!("keys {keys:?} count {}", all.count()));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_compat_answers_a_fresh_start_like_stock_etcd() {
    let etcd = StockEtcd::start();
    let ephd = Ephd::start(&["--etcd-compat"]);
    let expected = fresh_start_answers(&etcd.endpoint()).await;
    let got = fresh_start_answers(&ephd.endpoint()).await;
    assert_eq!(got, expected, "ephd --etcd-compat against stock etcd");
    assert_eq!(
        expected[0], "fresh: count 0 revision 1",
        "etcd's own baseline"
    );
    let logs = ephd.logs();
    assert!(logs.contains("mode: exact etcd"), "mode logged:\n{logs}");
    assert!(
        logs.contains("never point kube-apiserver at this server"),
        "restart warning logged:\n{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_mode_stays_kubernetes_safe() {
    let ephd = Ephd::start(&[]);
    let mut client = ephd.client().await;
    let fresh = client
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .expect("get all");
    let keys: Vec<&[u8]> = fresh.kvs().iter().map(|kv| kv.key()).collect();
    assert_eq!(keys, vec![b"compact_rev_key".as_slice()], "pre-created key");
    assert!(fresh.header().expect("header").revision() > 1_000_000);
    client
        .put("x", "1", Some(PutOptions::new().with_lease(0x1234)))
        .await
        .expect("an unknown lease is adopted by default");
    assert!(ephd.logs().contains("mode: Kubernetes-safe"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_flag_wins_over_etcd_compat() {
    let ephd = Ephd::start(&["--etcd-compat", "--lease-adopt-unknown-ttl=60"]);
    let mut client = ephd.client().await;
    let put = client
        .put("x", "1", Some(PutOptions::new().with_lease(0x99)))
        .await
        .expect("adopted: the explicit flag kept");
    assert_eq!(
        put.header().expect("header").revision(),
        2,
        "still revision 1 first"
    );
    let logs = ephd.logs();
    assert!(
        logs.contains("--lease-adopt-unknown-ttl keeps the value given for it"),
        "{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_server_serves_like_stock_etcd_and_stops() {
    let etcd = StockEtcd::start();
    let embedded = Embedded::start().expect("embedded ephd starts");
    assert!(embedded.endpoint().starts_with("http://127.0.0.1:"));
    let expected = fresh_start_answers(&etcd.endpoint()).await;
    let got = fresh_start_answers(embedded.endpoint()).await;
    assert_eq!(got, expected, "embedded ephd against stock etcd");

    // MemberList advertises the port actually bound, not the 0 asked for.
    let mut client = Client::connect([embedded.endpoint()], None)
        .await
        .expect("connect");
    let members = client.member_list().await.expect("member list");
    let urls: Vec<String> = members
        .members()
        .iter()
        .flat_map(|m| m.client_urls().to_vec())
        .collect();
    assert_eq!(urls, vec![embedded.endpoint().to_string()]);
    drop(client);

    let addr = embedded.addr();
    // stop() joins the server's thread: keep it off this runtime's workers.
    tokio::task::spawn_blocking(move || embedded.stop())
        .await
        .expect("join")
        .expect("clean stop");
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(),
        "nothing listens after stop"
    );
}

#[test]
fn embedded_servers_start_side_by_side_from_a_plain_test_and_report_bind_errors() {
    let first = Embedded::start().expect("first");
    let second = Embedded::start().expect("second");
    assert_ne!(first.addr(), second.addr(), "each gets its own free port");

    let mut taken = ephd::config::Config::etcd_compat();
    taken.listen_client_urls = vec![first.endpoint().to_string()];
    let err = Embedded::start_with(taken).expect_err("the port is in use");
    assert!(err.contains("cannot listen on"), "{err}");

    let addr = second.addr();
    drop(second);
    assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err());
    first.stop().expect("clean stop");
}
