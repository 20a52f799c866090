//! Concurrent clients that record what they did: each client works on one
//! member at a time, moves to the next member when a request fails or
//! times out (as a client cycling through endpoints does), and also every
//! few hundred operations, so every member serves every kind of request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{
    compare, kv_client::KvClient, request_op, Compare, PutRequest, RangeRequest, RequestOp,
    TxnRequest,
};
use tonic::transport::{Channel, Endpoint};

use super::checker::{Event, Op, Ret};

/// A request that has not answered within this is recorded as of unknown
/// outcome; short, so a client stuck on a dead or paused member moves on.
pub const OP_TIMEOUT: Duration = Duration::from_secs(1);

/// How many operations a client runs against one member before it moves
/// to the next one anyway.
const OPS_PER_MEMBER: usize = 150;

/// The shared record of every client's operations.
pub struct History {
    start: Instant,
    events: Mutex<Vec<Event>>,
    stop: AtomicBool,
}

impl History {
    /// An empty history whose clock starts now.
    pub fn new() -> Arc<History> {
        Arc::new(History {
            start: Instant::now(),
            events: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        })
    }

    /// Nanoseconds since the history started: the clock of every event.
    pub fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Tells every client to finish its current operation and stop.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Everything recorded so far.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }
}

/// A lazily connected KV client (connecting to a dead member must not
/// block the client: the request fails or times out instead).
fn kv_client(endpoint: &str) -> KvClient<Channel> {
    let channel = Endpoint::from_shared(endpoint.to_string())
        .expect("endpoint URL")
        .connect_timeout(OP_TIMEOUT)
        .connect_lazy();
    KvClient::new(channel)
}

fn encode(v: u64) -> Vec<u8> {
    v.to_string().into_bytes()
}

fn decode(bytes: &[u8]) -> u64 {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a value no client wrote: {bytes:?}"))
}

/// Runs client `id` over `endpoints` (starting at `id % len`) on `keys`
/// until `history.stop()`, recording every operation.
pub async fn run_client(
    id: usize,
    endpoints: Vec<String>,
    keys: Vec<String>,
    history: Arc<History>,
) {
    let mut at = id % endpoints.len();
    let mut kv = kv_client(&endpoints[at]);
    let mut on_member = 0;
    let mut seq = 0u64;
    let mut last_seen: HashMap<String, u64> = HashMap::new();
    while !history.stop.load(Ordering::SeqCst) {
        let key = keys[rand::random_range(0..keys.len())].clone();
        seq += 1;
        let fresh = ((id as u64 + 1) << 32) | seq;
        let dice = rand::random_range(0..10);
        let op = match (dice, last_seen.get(&key)) {
            (0..=3, _) => Op::Get,
            (4..=5, Some(&expect)) => Op::Cas { expect, new: fresh },
            _ => Op::Put(fresh),
        };
        let call = history.now();
        let ret = tokio::time::timeout(OP_TIMEOUT, invoke(&mut kv, &key, op)).await;
        let returned = history.now();
        let ret = match ret {
            Ok(Ok(ret)) => ret,
            _ => Ret::Unknown,
        };
        match ret {
            Ret::Get(Some(v)) => {
                last_seen.insert(key.clone(), v);
            }
            Ret::Put => {
                last_seen.insert(key.clone(), fresh);
            }
            Ret::Cas(true) => {
                last_seen.insert(key.clone(), fresh);
            }
            _ => {}
        }
        history.events.lock().unwrap().push(Event {
            client: id,
            key,
            op,
            ret,
            call,
            returned: (ret != Ret::Unknown).then_some(returned),
        });
        on_member += 1;
        if ret == Ret::Unknown || on_member >= OPS_PER_MEMBER {
            at = (at + 1) % endpoints.len();
            kv = kv_client(&endpoints[at]);
            on_member = 0;
            if ret == Ret::Unknown {
                // Do not hammer a member that just failed.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // Leave the shared machine some air, and vary the interleavings.
        tokio::time::sleep(Duration::from_millis(rand::random_range(0..3))).await;
    }
}

/// Sends one operation; any error is an unknown outcome for the caller.
async fn invoke(kv: &mut KvClient<Channel>, key: &str, op: Op) -> Result<Ret, tonic::Status> {
    let key_bytes = key.as_bytes().to_vec();
    match op {
        Op::Get => {
            let resp = kv
                .range(RangeRequest {
                    key: key_bytes.into(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            Ok(Ret::Get(resp.kvs.first().map(|kv| decode(&kv.value))))
        }
        Op::Put(v) => {
            kv.put(PutRequest {
                key: key_bytes.into(),
                value: encode(v).into(),
                ..Default::default()
            })
            .await?;
            Ok(Ret::Put)
        }
        Op::Cas { expect, new } => {
            let resp = kv
                .txn(TxnRequest {
                    compare: vec![Compare {
                        result: compare::CompareResult::Equal as i32,
                        target: compare::CompareTarget::Value as i32,
                        key: key_bytes.clone().into(),
                        target_union: Some(compare::TargetUnion::Value(encode(expect).into())),
                        ..Default::default()
                    }],
                    success: vec![RequestOp {
                        request: Some(request_op::Request::RequestPut(PutRequest {
                            key: key_bytes.into(),
                            value: encode(new).into(),
                            ..Default::default()
                        })),
                    }],
                    failure: vec![],
                })
                .await?
                .into_inner();
            Ok(Ret::Cas(resp.succeeded))
        }
    }
}
