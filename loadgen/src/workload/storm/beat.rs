//! The heartbeat writer: one small write every `--heartbeat-interval`, on
//! its own connection and its own thread, timed from when it was due.
//!
//! This is the request the storm must not starve: a kubelet's node Lease
//! renewal (or the apiserver's own lease) going to the same server as the
//! lists. It runs open-loop: write `i` is due at start + i × interval and is
//! sent then whatever happened to the ones before, so a server stall shows
//! up as the latency of every write due during it, not as one slow write
//! followed by a gap in which nothing was measured (coordinated omission).
//! Each write's latency is taken both from its due time (what a client
//! experiences, the headline figure) and from its actual send (the
//! server's service time).
//!
//! Its own thread and runtime keep the storm's client work (hundreds of
//! replies streaming in on the main runtime) from delaying the heartbeat's
//! timers and sends: only the machine's cores are shared, which is what the
//! floor run measures.

use crate::keys::value_with;
use crate::ops::{cas_txn, create_txn, failed_cas_rev, get_op, header_rev};
use crate::options::Common;
use crate::pool::{call, Kv, Pool};
use bytes::Bytes;
use ephd::proto::etcdserverpb::{PutRequest, TxnRequest};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Where the heartbeat keys live: node Leases, as kubelets renew them.
const PREFIX: &str = "/registry/leases/kube-node-lease/";

/// What each heartbeat sends (`--heartbeat-op`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeatOp {
    /// A plain Put of the Lease object.
    Put,
    /// The apiserver's update, `Txn(MOD(key) == rev → Put, else Get)`,
    /// with the key's revision kept from the previous write of it.
    Cas,
}

/// How the heartbeat runs.
pub struct BeatConfig {
    /// Options for its connection: `endpoints` is the one heartbeat
    /// endpoint, one connection, the lean client.
    pub common: Common,
    /// Time between two due times.
    pub interval: Duration,
    /// What each heartbeat sends.
    pub op: BeatOp,
    /// Lease keys written in turn.
    pub keys: u64,
    /// Value size, bytes.
    pub val_size: usize,
    /// Bound on each write; a slower one is a failure.
    pub timeout: Duration,
    /// The run's time origin: due times are reported from it.
    pub epoch: Instant,
}

/// One heartbeat write.
#[derive(Debug, Clone)]
pub struct Beat {
    /// When it was due, from the run's epoch.
    pub due: Duration,
    /// From its due time to its reply (or failure), µs.
    pub late_us: u64,
    /// From its actual send to its reply, µs.
    pub service_us: u64,
    /// Why it failed, if it did: (category, message).
    pub err: Option<(String, String)>,
    /// A CAS that found the key moved (`--heartbeat-op cas` only; the write
    /// still got an answer, so it is not a failure).
    pub cas_failed: bool,
}

/// A running heartbeat writer.
pub struct Heartbeat {
    stop: Arc<AtomicBool>,
    done: oneshot::Receiver<Result<Vec<Beat>, String>>,
    thread: std::thread::JoinHandle<()>,
}

impl Heartbeat {
    /// Connects (and with `cas` creates its keys), then starts writing;
    /// returns once the first write is about to go.
    pub async fn start(cfg: BeatConfig) -> Result<Heartbeat, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = oneshot::channel();
        let (done_tx, done_rx) = oneshot::channel();
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("heartbeat runtime: {e}")));
                        return;
                    }
                };
                let out = rt.block_on(beat_loop(cfg, stop2, ready_tx));
                let _ = done_tx.send(out);
                rt.shutdown_background();
            })
            .map_err(|e| format!("cannot start the heartbeat thread: {e}"))?;
        match ready_rx.await {
            Ok(Ok(())) => Ok(Heartbeat {
                stop,
                done: done_rx,
                thread,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("the heartbeat thread ended before it started".into()),
        }
    }

    /// Stops sending, waits for the writes in flight (each bounded by its
    /// timeout) and returns every write's record, in due order.
    pub async fn stop(self) -> Result<Vec<Beat>, String> {
        self.stop.store(true, Ordering::Relaxed);
        let out = self
            .done
            .await
            .unwrap_or_else(|_| Err("the heartbeat thread died".into()));
        let _ = self.thread.join();
        out.map(|mut beats| {
            beats.sort_by_key(|b| b.due);
            beats
        })
    }
}

/// A Lease-shaped value of `size` bytes.
fn lease_value(key: u64, n: u64, size: usize) -> Bytes {
    value_with(
        &format!(
            "{{\"kind\":\"Lease\",\"metadata\":{{\"name\":\"storm-hb-{key}\",\"namespace\":\"kube-node-lease\"}},\"spec\":{{\"holderIdentity\":\"storm-hb-{key}\",\"leaseDurationSeconds\":40,\"renew\":{n}}}}}"
        ),
        size,
    )
}

/// Creates (or adopts) the keys for CAS writes and returns their revisions.
async fn create_keys(kv: &mut Kv, keys: &[Bytes], cfg: &BeatConfig) -> Result<Vec<i64>, String> {
    let mut revs = Vec::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        let req = create_txn(key, lease_value(i as u64, 0, cfg.val_size), 0);
        let r = call(cfg.timeout, kv.txn(req))
            .await
            .map_err(|(k, m)| format!("creating heartbeat keys: {k}: {m}"))?;
        let rev = if r.succeeded {
            header_rev(&r.header)
        } else {
            let get = TxnRequest {
                success: vec![get_op(key)],
                ..Default::default()
            };
            let r = call(cfg.timeout, kv.txn(get))
                .await
                .map_err(|(k, m)| format!("reading heartbeat keys: {k}: {m}"))?;
            failed_cas_rev(&r)
        };
        revs.push(rev);
    }
    Ok(revs)
}

/// The writer: runs on its own thread until `stop`.
async fn beat_loop(
    cfg: BeatConfig,
    stop: Arc<AtomicBool>,
    ready: oneshot::Sender<Result<(), String>>,
) -> Result<Vec<Beat>, String> {
    let setup = async {
        let pool = Pool::connect(&cfg.common).await?;
        let keys: Vec<Bytes> = (0..cfg.keys.max(1))
            .map(|i| Bytes::from(format!("{PREFIX}storm-hb-{i:04}")))
            .collect();
        let revs = match cfg.op {
            BeatOp::Cas => create_keys(&mut pool.kv(0), &keys, &cfg).await?,
            BeatOp::Put => vec![0; keys.len()],
        };
        let revs: Vec<AtomicI64> = revs.into_iter().map(AtomicI64::new).collect();
        Ok::<_, String>((pool, Arc::new(keys), Arc::new(revs)))
    };
    let (pool, keys, revs) = match setup.await {
        Ok(s) => s,
        Err(e) => {
            let _ = ready.send(Err(e.clone()));
            return Err(e);
        }
    };
    let _ = ready.send(Ok(()));

    let beats = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    let start = tokio::time::Instant::now();
    let mut n: u32 = 0;
    while !stop.load(Ordering::Relaxed) {
        let due = start + cfg.interval * n;
        tokio::time::sleep_until(due).await;
        let slot = n as usize % keys.len();
        n += 1;
        let (mut kv, keys, revs, beats) = (pool.kv(0), keys.clone(), revs.clone(), beats.clone());
        let (op, timeout, val_size, epoch) = (cfg.op, cfg.timeout, cfg.val_size, cfg.epoch);
        tasks.spawn(async move {
            let key = &keys[slot];
            let value = lease_value(slot as u64, u64::from(n), val_size);
            let sent = Instant::now();
            let mut cas_failed = false;
            let err = match op {
                BeatOp::Put => {
                    let req = PutRequest {
                        key: key.clone(),
                        value,
                        ..Default::default()
                    };
                    call(timeout, kv.put(req)).await.err()
                }
                BeatOp::Cas => {
                    let rev = revs[slot].load(Ordering::Relaxed);
                    match call(timeout, kv.txn(cas_txn(key, rev, value, 0))).await {
                        Ok(r) => {
                            cas_failed = !r.succeeded;
                            let new = if r.succeeded {
                                header_rev(&r.header)
                            } else {
                                failed_cas_rev(&r)
                            };
                            revs[slot].store(new, Ordering::Relaxed);
                            None
                        }
                        Err(e) => Some(e),
                    }
                }
            };
            let now = Instant::now();
            let due = due.into_std();
            let beat = Beat {
                due: due.saturating_duration_since(epoch),
                late_us: now.saturating_duration_since(due).as_micros() as u64,
                service_us: now.saturating_duration_since(sent).as_micros() as u64,
                err,
                cas_failed,
            };
            beats.lock().expect("no panics while held").push(beat);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let out = std::mem::take(&mut *beats.lock().expect("no panics while held"));
    Ok(out)
}
