//! Overload shedding over the wire: lists beyond the response budget wait,
//! and past the queue timeout are refused with etcd's retryable "too many
//! requests", while single-key requests and later lists go on working.

use ephd::proto::etcdserverpb::{kv_client::KvClient, PutRequest, RangeRequest};
use futures::future::join_all;

use crate::harness::{connect_channel, Server};
use crate::support::{ephd, within};

const KEYS: usize = 500;
const VALUE: usize = 4096;

async fn kv(endpoint: &str) -> KvClient<tonic::transport::Channel> {
    KvClient::new(connect_channel(endpoint).await).max_decoding_message_size(usize::MAX)
}

fn list() -> RangeRequest {
    RangeRequest {
        key: b"/list/".to_vec().into(),
        range_end: b"/list0".to_vec().into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_beyond_the_budget_are_shed_with_too_many_requests() {
    // A budget smaller than one list: lists go one at a time, and one that
    // cannot start within 1 ms is shed.
    let server = ephd(&[
        "--max-response-bytes-in-flight",
        "1024",
        "--overload-queue-timeout",
        "1ms",
    ]);
    let endpoint = server.endpoint();
    let mut c = kv(&endpoint).await;
    for i in 0..KEYS {
        c.put(PutRequest {
            key: format!("/list/{i:04}").into_bytes().into(),
            value: vec![b'v'; VALUE].into(),
            ..Default::default()
        })
        .await
        .expect("preload");
    }
    // 40 concurrent lists of ~2 MB over 4 connections.
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(kv(&endpoint).await);
    }
    let lists = (0..40).map(|i| {
        let mut c = clients[i % 4].clone();
        async move { c.range(list()).await.map(|r| r.into_inner().kvs.len()) }
    });
    let heartbeat = async {
        let mut c = kv(&endpoint).await;
        let mut ok = 0;
        for i in 0..20 {
            c.put(PutRequest {
                key: b"/heartbeat".to_vec().into(),
                value: format!("{i}").into_bytes().into(),
                ..Default::default()
            })
            .await
            .expect("a heartbeat is never shed");
            ok += 1;
        }
        ok
    };
    let (results, beats) =
        within("storm", async { tokio::join!(join_all(lists), heartbeat) }).await;
    assert_eq!(beats, 20);
    let mut shed = 0;
    for r in &results {
        match r {
            Ok(n) => assert_eq!(*n, KEYS, "a list that succeeds is complete"),
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{s:?}");
                assert_eq!(s.message(), "etcdserver: too many requests");
                shed += 1;
            }
        }
    }
    assert!(shed > 0, "some of 40 lists were shed: {results:?}");
    assert!(shed < results.len(), "some lists got through");
    // The budget comes back: a list after the storm succeeds. The server
    // hands a response's budget back once the response is gone from it,
    // which can be a moment after the client has read it; so a list shed
    // right after the storm is retried, within a deadline.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let after = loop {
        match within("list after storm", c.range(list())).await {
            Ok(r) => break r,
            Err(s)
                if s.code() == tonic::Code::ResourceExhausted
                    && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
            Err(s) => panic!("the budget did not come back after the storm: {s:?}"),
        }
    };
    assert_eq!(after.into_inner().kvs.len(), KEYS);
    let single = c
        .range(RangeRequest {
            key: b"/list/0001".to_vec().into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(single.into_inner().kvs.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_within_the_budget_all_succeed() {
    // Default budget (a share of the machine's memory): 40 lists of ~2 MB
    // all fit, none is shed.
    let server = ephd(&[]);
    let endpoint = server.endpoint();
    let mut c = kv(&endpoint).await;
    for i in 0..KEYS {
        c.put(PutRequest {
            key: format!("/list/{i:04}").into_bytes().into(),
            value: vec![b'v'; VALUE].into(),
            ..Default::default()
        })
        .await
        .expect("preload");
    }
    let lists = (0..40).map(|_| {
        let mut c = c.clone();
        async move { c.range(list()).await.map(|r| r.into_inner().kvs.len()) }
    });
    let results = within("lists", join_all(lists)).await;
    for r in results {
        assert_eq!(r.expect("no list is shed"), KEYS);
    }
}
