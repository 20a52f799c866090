//! Harness self-tests plus a basic "does every service answer" check:
//! each client constructor of `harness::Server` is exercised against ephd
//! and (to validate the expectations themselves) against stock etcd.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ephd::proto::etcdserverpb::{
    watch_request, LeaseGrantRequest, MemberListRequest, PutRequest, RangeRequest, StatusRequest,
    WatchCreateRequest, WatchRequest,
};
use tokio_stream::StreamExt;

use crate::harness::{Ephd, Server, StockEtcd, RPC_TIMEOUT};
use crate::support;

/// Awaits `fut` for at most `RPC_TIMEOUT`, naming `what` on timeout.
async fn bounded<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(RPC_TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} timed out after {RPC_TIMEOUT:?}"))
}

/// One call through every client kind the harness hands out.
async fn every_client_answers(server: &impl Server, name: &str) {
    let endpoint = server.endpoint();

    let mut client = server.client().await;
    bounded("etcd_client put", client.put("smoke", "1", None))
        .await
        .expect("etcd_client put");
    let got = bounded("etcd_client get", client.get("smoke", None))
        .await
        .expect("etcd_client get");
    assert_eq!(got.kvs()[0].value(), b"1");

    let mut kv = server.kv().await;
    let put = PutRequest {
        key: Bytes::from_static(b"smoke"),
        value: Bytes::from_static(b"2"),
        prev_kv: true,
        ..PutRequest::default()
    };
    let put = bounded("raw put", kv.put(put))
        .await
        .expect("raw put")
        .into_inner();
    assert_eq!(put.header.expect("header").revision, 3);
    assert_eq!(put.prev_kv.expect("prev kv").value.as_ref(), b"1");
    let range = RangeRequest {
        key: Bytes::from_static(b"smoke"),
        ..RangeRequest::default()
    };
    let range = bounded("raw range", kv.range(range))
        .await
        .expect("raw range")
        .into_inner();
    assert_eq!(range.count, 1);
    assert_eq!(range.kvs[0].version, 2);

    let mut maintenance = server.maintenance().await;
    let status = bounded("status", maintenance.status(StatusRequest {}))
        .await
        .expect("status")
        .into_inner();
    let member_id = status.header.as_ref().expect("header").member_id;
    assert_ne!(member_id, 0);
    assert_eq!(status.leader, member_id);

    let mut cluster = server.cluster().await;
    let members = bounded(
        "member list",
        cluster.member_list(MemberListRequest::default()),
    )
    .await
    .expect("member list")
    .into_inner();
    assert_eq!(members.members.len(), 1, "{members:?}");
    assert_eq!(members.members[0].name, name);
    assert_eq!(members.members[0].id, member_id);
    assert_eq!(members.members[0].client_ur_ls, vec![endpoint]);

    let mut lease = server.lease().await;
    let granted = bounded(
        "lease grant",
        lease.lease_grant(LeaseGrantRequest { ttl: 60, id: 0 }),
    )
    .await
    .expect("lease grant")
    .into_inner();
    assert_ne!(granted.id, 0);
    assert_eq!(granted.ttl, 60);

    let mut watch = server.watch().await;
    let create = WatchRequest {
        request_union: Some(watch_request::RequestUnion::CreateRequest(
            WatchCreateRequest {
                key: Bytes::from_static(b"smoke"),
                start_revision: 2,
                ..WatchCreateRequest::default()
            },
        )),
    };
    let mut stream = bounded("watch", watch.watch(tokio_stream::iter([create])))
        .await
        .expect("watch")
        .into_inner();
    let created = bounded("created", stream.next())
        .await
        .expect("stream open")
        .expect("ok");
    assert!(created.created, "{created:?}");
    let mut values = Vec::new();
    while values.len() < 2 {
        let resp = bounded("watch events", stream.next())
            .await
            .expect("stream open")
            .expect("ok");
        values.extend(
            resp.events
                .iter()
                .map(|e| e.kv.as_ref().expect("kv").value.clone()),
        );
    }
    assert_eq!(values, [Bytes::from_static(b"1"), Bytes::from_static(b"2")]);
}

#[tokio::test]
async fn harness_ephd_answers_every_client_kind() {
    let ephd = support::ephd(&["--name", "smoke"]);
    assert_eq!(ephd.endpoint(), format!("http://127.0.0.1:{}", ephd.port()));
    assert_ne!(ephd.pid(), 0);
    every_client_answers(&ephd, "smoke").await;
}

/// Validates the expectations of `every_client_answers` on the reference.
#[tokio::test]
async fn harness_stock_etcd_answers_every_client_kind() {
    let etcd = StockEtcd::start();
    every_client_answers(&etcd, "default").await;
}

/// Parallel tests rely on distinct ports and on Drop killing the process.
#[test]
fn harness_servers_get_distinct_ports_and_die_on_drop() {
    let servers: Vec<Ephd> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..3).map(|_| s.spawn(|| Ephd::start(&[]))).collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("start"))
            .collect()
    });
    let mut ports: Vec<u16> = servers.iter().map(Ephd::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), servers.len(), "ports collided: {ports:?}");

    for ephd in servers {
        let port = ephd.port();
        assert!(TcpStream::connect(("127.0.0.1", port)).is_ok());
        drop(ephd);
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(("127.0.0.1", port)).is_ok() {
            assert!(Instant::now() < deadline, "ephd still listening after drop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
