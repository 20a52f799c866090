//! A new cluster's first instant: clients write through every member from
//! the moment the processes start (retrying until the cluster answers),
//! while the first leader proposes the initial revision. Every write the
//! cluster acknowledged must sit above the initial revision (writes wait
//! for it, `cluster/log/initial_gate.rs`), so every member reads it back at
//! its revision instead of answering "compacted".

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{
    kv_client::KvClient, lease_client::LeaseClient, request_op, LeaseGrantRequest,
    LeaseTimeToLiveRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use tonic::transport::{Channel, Endpoint};

use crate::harness::{EphdCluster, Server};
use crate::support::within;

const ARGS: &[&str] = &["--heartbeat-interval=50", "--election-timeout=500"];
/// Acknowledged writes each member's client collects.
const ACKS: usize = 30;
/// Longer than the server's request timeout (5 s + two election
/// timeouts), so the server, not the client, decides a write's fate.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(8);
const LIMIT: Duration = Duration::from_secs(60);

/// A write the cluster acknowledged.
#[derive(Debug)]
enum Ack {
    /// A put or a txn's put of `key`, at `revision`.
    Key { key: String, revision: i64 },
    /// A lease grant, answered with header `revision`.
    Lease { id: i64, revision: i64 },
}

impl Ack {
    fn revision(&self) -> i64 {
        match self {
            Ack::Key { revision, .. } | Ack::Lease { revision, .. } => *revision,
        }
    }
}

fn lazy(endpoint: &str) -> Channel {
    Endpoint::from_shared(endpoint.to_string())
        .unwrap()
        .connect_timeout(Duration::from_millis(200))
        .connect_lazy()
}

/// Puts, txns and lease grants through `endpoint` from the first instant,
/// retrying every failure at once, until `ACKS` are acknowledged.
async fn hammer(endpoint: String, member: usize) -> Vec<Ack> {
    let channel = lazy(&endpoint);
    let mut kv = KvClient::new(channel.clone());
    let mut leases = LeaseClient::new(channel);
    let deadline = Instant::now() + LIMIT;
    let mut acks = Vec::new();
    let mut seq = 0usize;
    while acks.len() < ACKS {
        assert!(
            Instant::now() < deadline,
            "m{member}: {} of {ACKS} writes acknowledged in {LIMIT:?}",
            acks.len()
        );
        seq += 1;
        let key = format!("w/{member}/{seq}");
        let put = PutRequest {
            key: key.clone().into_bytes().into(),
            value: b"v".to_vec().into(),
            ..Default::default()
        };
        let ack = match seq % 3 {
            0 => {
                let txn = TxnRequest {
                    success: vec![RequestOp {
                        request: Some(request_op::Request::RequestPut(put)),
                    }],
                    ..Default::default()
                };
                tokio::time::timeout(CLIENT_TIMEOUT, kv.txn(txn))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .map(|r| Ack::Key {
                        key,
                        revision: r.into_inner().header.unwrap().revision,
                    })
            }
            1 => {
                let grant = LeaseGrantRequest { ttl: 600, id: 0 };
                tokio::time::timeout(CLIENT_TIMEOUT, leases.lease_grant(grant))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .map(|r| {
                        let r = r.into_inner();
                        Ack::Lease {
                            id: r.id,
                            revision: r.header.unwrap().revision,
                        }
                    })
            }
            _ => tokio::time::timeout(CLIENT_TIMEOUT, kv.put(put))
                .await
                .ok()
                .and_then(Result::ok)
                .map(|r| Ack::Key {
                    key,
                    revision: r.into_inner().header.unwrap().revision,
                }),
        };
        match ack {
            Some(a) => acks.push(a),
            None => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
    acks
}

async fn get(kv: &mut KvClient<Channel>, key: &[u8], revision: i64) -> Result<i64, tonic::Status> {
    let req = RangeRequest {
        key: key.to_vec().into(),
        revision,
        ..Default::default()
    };
    let r = within("range", kv.range(req)).await?.into_inner();
    Ok(r.kvs.first().map_or(0, |kv| kv.mod_revision))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_from_the_first_instant_all_land_above_the_initial_revision() {
    let cluster = EphdCluster::spawn(3, ARGS, "http");
    let writers: Vec<_> = cluster
        .running()
        .into_iter()
        .map(|(i, m)| tokio::spawn(hammer(m.endpoint(), i)))
        .collect();
    let mut acks = Vec::new();
    for (i, w) in writers.into_iter().enumerate() {
        match w.await {
            Ok(a) => acks.extend(a.into_iter().map(|a| (i, a))),
            Err(e) => panic!("writer m{i}: {e}\n{}", cluster.logs()),
        }
    }

    // Every member holds the same initial revision.
    let mut initial = BTreeMap::new();
    for (i, m) in cluster.running() {
        let mut kv = m.kv().await;
        let req = RangeRequest {
            key: b"compact_rev_key".to_vec().into(),
            ..Default::default()
        };
        let r = within("compact_rev_key", kv.range(req))
            .await
            .unwrap()
            .into_inner();
        let value = std::str::from_utf8(&r.kvs[0].value).unwrap().to_string();
        initial.insert(i, value.parse::<i64>().unwrap());
    }
    let base = initial[&0];
    assert!(initial.values().all(|v| *v == base), "{initial:?}");

    for (from, ack) in &acks {
        assert!(
            ack.revision() > base,
            "m{from} acknowledged {ack:?} below the initial revision {base}"
        );
    }
    for (i, m) in cluster.running() {
        let mut kv = m.kv().await;
        let mut leases = m.lease().await;
        for (from, ack) in &acks {
            match ack {
                Ack::Key { key, revision } => {
                    // Now, and at its own revision (not compacted).
                    let now = get(&mut kv, key.as_bytes(), 0).await.unwrap();
                    assert_eq!(now, *revision, "m{i}: {key} written through m{from}");
                    let then = get(&mut kv, key.as_bytes(), *revision).await;
                    assert_eq!(
                        then.as_ref().ok(),
                        Some(revision),
                        "m{i}: {key} at its revision: {then:?}"
                    );
                }
                Ack::Lease { id, .. } => {
                    let req = LeaseTimeToLiveRequest {
                        id: *id,
                        keys: false,
                    };
                    let ttl = within("ttl", leases.lease_time_to_live(req))
                        .await
                        .unwrap()
                        .into_inner()
                        .ttl;
                    assert!(ttl > 0, "m{i}: lease {id:x} granted through m{from}");
                }
            }
        }
    }
}
