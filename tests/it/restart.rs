//! Restarts as kube-apiserver lives through them: ephd is stopped with
//! SIGTERM and started again on the same port while the apiserver's clients
//! keep their connections (clientv3 reconnects and resumes watches).
//!
//! * without `--data-dir`: revisions continue above everything issued before
//!   (the old range reads as compacted, `compact_rev_key` exists, resumed
//!   watches are canceled as compacted), and unknown lease IDs are adopted;
//! * with `--data-dir`: a rolling restart mid-traffic loses no acknowledged
//!   write, keys keep their revisions/versions/leases, leases keep counting
//!   down; damaged snapshots are never restored in part (`recovery`).

mod recovery;
mod wal;

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb as pb;
use ephd::proto::mvccpb::{event::EventType, KeyValue};

use crate::harness::free_port;
use crate::kubernetes::apiserver::{
    b, cache_watch, direct_watch, header_rev, text, Apiserver, Compactor, LeaseManager, Outcome,
    Tick, Watcher, COMPACT_REV_KEY, ERR_COMPACTED, ERR_FUTURE_REV, ERR_LEASE_NOT_FOUND, EVENTS,
    EVENT_LEASE_TTL, LEASES,
};
use crate::support::{assert_err, assert_raw_err, within, within_for};

/// How long ephd may take to exit after SIGTERM (it waits up to 5 s for
/// in-flight requests, then writes the snapshot).
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// An ephd process on a fixed port, so a successor can take over the port
/// the apiserver's clients keep dialing.
struct Proc {
    child: Child,
    port: u16,
    log: Arc<Mutex<Vec<u8>>>,
    exited: Option<ExitStatus>,
}

impl Proc {
    fn spawn(port: u16, args: &[&str]) -> Proc {
        let url = format!("http://127.0.0.1:{port}");
        let mut child = Command::new(env!("CARGO_BIN_EXE_ephd"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            // Text lines: the tests read fields as `key=value`.
            .arg("--logger=capnslog")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ephd");
        let log = Arc::new(Mutex::new(Vec::new()));
        let out: Box<dyn Read + Send> = Box::new(child.stdout.take().expect("stdout"));
        let err: Box<dyn Read + Send> = Box::new(child.stderr.take().expect("stderr"));
        for mut src in [out, err] {
            let log = log.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                while let Ok(n) = src.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    log.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            });
        }
        Proc {
            child,
            port,
            log,
            exited: None,
        }
    }

    /// Starts ephd on `port` and waits (bounded) until it answers a Range.
    async fn start(port: u16, args: &[&str]) -> Proc {
        let mut p = Proc::spawn(port, args);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = p.child.try_wait().expect("try_wait") {
                panic!("ephd exited during start with {status}:\n{}", p.logs());
            }
            if p.probe().await {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "ephd on port {port} not ready within {READY_TIMEOUT:?}:\n{}",
                p.logs()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn probe(&self) -> bool {
        let probe = async {
            let ch = tonic::transport::Endpoint::from_shared(self.endpoint())
                .ok()?
                .connect()
                .await
                .ok()?;
            pb::kv_client::KvClient::new(ch)
                .range(pb::RangeRequest {
                    key: b("probe"),
                    ..Default::default()
                })
                .await
                .ok()
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(1), probe).await,
            Ok(Some(_))
        )
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn logs(&self) -> String {
        String::from_utf8_lossy(&self.log.lock().unwrap()).into_owned()
    }

    /// Waits (bounded) for the process to exit on its own.
    async fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                self.exited = Some(status);
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "ephd did not exit within {limit:?}:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// SIGTERM (what the kubelet sends), then waits for a clean exit.
    async fn sigterm(&mut self) -> ExitStatus {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: plain kill(2) on our own child, which has not been reaped.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill(SIGTERM)");
        let status = self.wait_exit(STOP_TIMEOUT).await;
        assert!(
            status.success(),
            "ephd exits cleanly on SIGTERM, got {status}:\n{}",
            self.logs()
        );
        status
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "----- ephd on port {} log -----\n{}\n----- end -----",
                self.port,
                self.logs()
            );
        }
    }
}

/// A data directory as a flag value.
fn arg(dir: &std::path::Path) -> String {
    dir.to_str().expect("utf-8 path").to_string()
}

/// `logs` without ANSI colour sequences (ESC [ ... m).
fn plain(logs: &str) -> String {
    let mut plain = String::with_capacity(logs.len());
    let mut chars = logs.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

/// The revision of the last "snapshot written" line in ephd's log.
fn logged_snapshot_revision(logs: &str) -> i64 {
    let plain = plain(logs);
    let line = plain
        .lines()
        .rev()
        .find(|l| l.contains("snapshot written"))
        .unwrap_or_else(|| panic!("no snapshot written on SIGTERM:\n{plain}"));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("revision="))
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no revision in {line:?}"))
}

/// clientv3 retries Range on Unavailable (up to 100 × ~25 ms): the first
/// read after a restart, on the client's existing connection.
async fn range_retrying(api: &Apiserver, req: pb::RangeRequest) -> pb::RangeResponse {
    let mut last = None;
    for _ in 0..100 {
        match api.range(req.clone()).await {
            Ok(r) => return r,
            Err(s) if s.code() == tonic::Code::Unavailable => last = Some(s),
            Err(s) => panic!("Range after restart failed with a non-retryable {s:?}"),
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("Range still Unavailable after 100 retries: {last:?}");
}

fn current_rv_req() -> pb::RangeRequest {
    pb::RangeRequest {
        key: b(LEASES.trim_end_matches('/')),
        limit: 1,
        ..Default::default()
    }
}

fn node_key(i: usize) -> String {
    format!("{LEASES}kube-node-lease/node-{i:03}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revisions_continue_across_a_restart_without_data_dir() {
    let port = free_port();
    let mut a = Proc::start(port, &[]).await;
    let api = Apiserver::connect(&a.endpoint()).await;

    // Some traffic, a compactor with local version 2, a watch cache.
    let mut c = Compactor::default();
    assert!(matches!(c.tick(&api).await, Tick::Lost { version: 1, .. }));
    let mut revs = HashMap::new();
    for i in 0..10 {
        let rev = api
            .create(&node_key(i), b"lease", 0)
            .await
            .expect("Txn")
            .expect("new");
        revs.insert(i, rev);
    }
    assert!(matches!(
        c.tick(&api).await,
        Tick::Won {
            compacted: Some((_, Ok(_)))
        }
    ));
    assert_eq!(c.time, 2);
    for i in 0..10 {
        match api
            .update(&node_key(i), b"renewed", 0, revs[&i])
            .await
            .expect("Txn")
        {
            Outcome::Done(r) => revs.insert(i, r),
            other => panic!("{other:?}"),
        };
    }
    let listed = api.list(LEASES, 10_000, 0).await.expect("list");
    let mut cache = Watcher::open(api.channel(), cache_watch(LEASES, listed.revision + 1)).await;
    let r = api.current_rv(LEASES).await;
    assert!(r >= *revs.values().max().unwrap());

    a.sigterm().await;
    // Open watches end with Unavailable: clientv3 resumes them transparently
    // (anything else, even a clean EOF, would be a "halt" for every watch).
    let end = cache.ended(Duration::from_secs(5)).await;
    assert_eq!(
        end.code(),
        tonic::Code::Unavailable,
        "watch stream end on SIGTERM: {end:?}"
    );

    let b_ = Proc::start(port, &[]).await;
    // The apiserver's client keeps its connection object and reconnects.
    let first = range_retrying(&api, current_rv_req()).await;
    let rev_b = header_rev(&first.header);
    assert!(
        rev_b > r,
        "first revision after restart {rev_b} must exceed {r}"
    );
    assert!(api.current_rv(LEASES).await > r);
    // Everything at or below the old revisions reads as compacted.
    assert_raw_err(
        api.get_at(&node_key(0), r).await,
        tonic::Code::OutOfRange,
        ERR_COMPACTED,
    );
    assert_raw_err(
        api.list(LEASES, 5, r).await.map(|l| l.revision),
        tonic::Code::OutOfRange,
        ERR_COMPACTED,
    );
    // No data dir: the keys are gone (documented), nodes re-create them.
    let (_, kv) = api.get(&node_key(0)).await.expect("get");
    assert!(kv.is_none());
    // A heartbeat from the stale cache copy gets NotFound (the kubelet then
    // creates its lease again).
    assert_eq!(
        api.update(&node_key(0), b"x", 0, revs[&0])
            .await
            .expect("Txn"),
        Outcome::NotFound
    );

    // compact_rev_key exists: the compactor's CAS with its old local version
    // (2) fails and the failure Range has kvs[0] (version 1) to adopt.
    match c.tick(&api).await {
        Tick::Lost { version, value } => {
            assert_eq!(version, 1);
            let v: i64 = text(&value).parse().expect("integer value");
            assert!(
                v > r,
                "compact_rev_key's value {v} is the new start revision"
            );
        }
        other => panic!("compactor CAS after restart: {other:?}"),
    }
    assert!(c.rev >= rev_b);
    match c.tick(&api).await {
        Tick::Won {
            compacted: Some((_, Ok(_))),
        } => {}
        other => panic!("the next tick wins and compacts: {other:?}"),
    }

    // The transparent resume of the cache watch (last event rev + 1):
    // created, then canceled as compacted → 410 → the reflector relists.
    let resumed = Watcher::open(api.channel(), cache_watch(LEASES, r + 1)).await;
    let cancel = resumed.canceled().await;
    assert!(
        cancel.compact_revision > r + 1 && cancel.compact_revision <= rev_b,
        "compact_revision {} (old rev {r}, new {rev_b})",
        cancel.compact_revision
    );
    // The relist + new watch work as on a fresh server.
    let relist = api.list(LEASES, 10_000, 0).await.expect("relist");
    assert!(relist.kvs.is_empty());
    let cache = Watcher::open(api.channel(), cache_watch(LEASES, relist.revision + 1)).await;
    let rev = api
        .create(&node_key(0), b"again", 0)
        .await
        .expect("Txn")
        .expect("new");
    assert!(rev > rev_b);
    let target = api.current_rv(LEASES).await;
    cache.wait_until_fresh(target).await;
    cache.assert_clean();
    cache.seen(|s| assert_eq!(s.events.len(), 1));
    drop(b_);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_revision_continuity_a_restart_starts_at_revision_one() {
    let port = free_port();
    let flags = ["--revision-continuity=false"];
    let mut a = Proc::start(port, &flags).await;
    let api = Apiserver::connect(&a.endpoint()).await;
    assert_eq!(
        api.current_rv(LEASES).await,
        1,
        "a fresh etcd is at revision 1"
    );
    let (_, kv) = api.get(COMPACT_REV_KEY).await.expect("get");
    assert!(kv.is_none(), "no compact_rev_key without continuity");
    for i in 0..3 {
        api.create(&node_key(i), b"v", 0)
            .await
            .expect("Txn")
            .expect("new");
    }
    assert_eq!(api.current_rv(LEASES).await, 4);
    a.sigterm().await;
    let _b = Proc::start(port, &flags).await;
    let first = range_retrying(&api, current_rv_req()).await;
    assert_eq!(
        header_rev(&first.header),
        1,
        "etcd's plain behaviour: an empty store at revision 1 again"
    );
    api.get_at(&node_key(0), 1)
        .await
        .expect("revision 1 readable");
    assert_raw_err(
        api.get_at(&node_key(0), 4).await,
        tonic::Code::OutOfRange,
        ERR_FUTURE_REV,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_event_lease_ids_are_adopted_after_a_restart() {
    let port = free_port();
    let mut a = Proc::start(port, &[]).await;
    let api = Apiserver::connect(&a.endpoint()).await;
    let lease = api.grant(EVENT_LEASE_TTL).await;
    let e1 = format!("{EVENTS}default/e1");
    api.create(&e1, b"k8s\x00e1", lease)
        .await
        .expect("Txn")
        .expect("new");
    a.sigterm().await;

    // Default flags: the apiserver's cached lease ID keeps working.
    let mut b_ = Proc::start(port, &[]).await;
    range_retrying(&api, current_rv_req()).await;
    let e2 = format!("{EVENTS}default/e2");
    api.create(&e2, b"k8s\x00e2", lease)
        .await
        .expect("a Txn naming the old lease is accepted")
        .expect("new");
    let ttl = api.time_to_live(lease, true).await;
    assert_eq!(ttl.id, lease);
    assert_eq!(
        ttl.granted_ttl, 3660,
        "adopted with --lease-adopt-unknown-ttl"
    );
    assert!(ttl.ttl > 3600 && ttl.ttl <= 3660, "remaining {}", ttl.ttl);
    assert_eq!(ttl.keys, vec![b(&e2)]);
    // A unary Put naming another unknown ID is adopted too.
    let mut etcd = crate::harness::connect_client(&b_.endpoint()).await;
    let other = lease ^ 0x5555;
    within(
        "put",
        etcd.put(
            format!("{EVENTS}default/e3"),
            "v",
            Some(etcd_client::PutOptions::new().with_lease(other)),
        ),
    )
    .await
    .expect("a Put naming an unknown lease is accepted");
    assert_eq!(api.time_to_live(other, false).await.granted_ttl, 3660);
    b_.sigterm().await;

    // --lease-adopt-unknown-ttl 0: etcd's behaviour, NotFound.
    let c = Proc::start(port, &["--lease-adopt-unknown-ttl", "0"]).await;
    range_retrying(&api, current_rv_req()).await;
    assert_raw_err(
        api.create(&format!("{EVENTS}default/e4"), b"v", lease)
            .await,
        tonic::Code::NotFound,
        ERR_LEASE_NOT_FOUND,
    );
    let mut etcd = crate::harness::connect_client(&c.endpoint()).await;
    assert_err(
        within(
            "put",
            etcd.put(
                "k",
                "v",
                Some(etcd_client::PutOptions::new().with_lease(lease)),
            ),
        )
        .await,
        tonic::Code::NotFound,
        ERR_LEASE_NOT_FOUND,
    );
    assert_eq!(api.time_to_live(lease, false).await.ttl, -1);
    assert_eq!(api.count(EVENTS).await, 0, "nothing was written");
}

/// What a writer knows about one key it wrote.
#[derive(Debug, Clone, PartialEq)]
struct Obj {
    value: String,
    mod_rev: i64,
    create_rev: i64,
    version: i64,
    lease: i64,
}

/// Acknowledged writes, and writes whose outcome is unknown (the RPC failed
/// because the server was stopping: applied or not).
#[derive(Default)]
struct Tracked {
    /// Set to end the traffic (the writers check it before every write).
    stop: bool,
    acked: BTreeMap<String, Obj>,
    maybe: HashMap<String, (Vec<u8>, i64)>,
    max_rev: i64,
}

type Track = Arc<Mutex<Tracked>>;

fn ack(track: &Track, key: &str, obj: Obj) {
    let mut t = track.lock().unwrap();
    t.max_rev = t.max_rev.max(obj.mod_rev);
    t.acked.insert(key.to_string(), obj);
}

/// A kubelet renewing `keys` until an RPC fails.
async fn heartbeats(api: Apiserver, track: Track, keys: Vec<String>) {
    let mut state: HashMap<String, (i64, i64, i64)> = HashMap::new(); // rev, create, version
    for n in 0.. {
        for key in &keys {
            if track.lock().unwrap().stop {
                return;
            }
            let (rev, create, version) = state.get(key).copied().unwrap_or((0, 0, 0));
            let value = format!("k8s\x00{key} renew {n}").into_bytes();
            match api.update(key, &value, 0, rev).await {
                Ok(Outcome::Done(r)) => {
                    let create = if create == 0 { r } else { create };
                    state.insert(key.clone(), (r, create, version + 1));
                    ack(
                        &track,
                        key,
                        Obj {
                            value: text(&value),
                            mod_rev: r,
                            create_rev: create,
                            version: version + 1,
                            lease: 0,
                        },
                    );
                }
                Ok(other) => panic!("heartbeat {key}: {other:?}"),
                Err(_) => {
                    track.lock().unwrap().maybe.insert(key.clone(), (value, 0));
                    return;
                }
            }
        }
    }
}

/// An apiserver creating events with the lease manager's lease until an RPC
/// fails.
async fn event_creates(api: Apiserver, track: Track, leases: Arc<LeaseManager>, w: usize) {
    for n in 0.. {
        if track.lock().unwrap().stop {
            return;
        }
        let Ok(lease) = leases.try_get_lease().await else {
            return;
        };
        let key = format!("{EVENTS}ns-{w}/ev-{n:05}");
        let value = format!("k8s\x00event {w}/{n}").into_bytes();
        match api.create(&key, &value, lease).await {
            Ok(Some(r)) => ack(
                &track,
                &key,
                Obj {
                    value: text(&value),
                    mod_rev: r,
                    create_rev: r,
                    version: 1,
                    lease,
                },
            ),
            Ok(None) => panic!("{key} existed"),
            Err(_) => {
                track.lock().unwrap().maybe.insert(key, (value, lease));
                return;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_restart_after_a_pause_in_writes_loses_nothing() {
    rolling_restart(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_restart_mid_traffic_loses_no_acknowledged_write() {
    rolling_restart(true).await;
}

/// Node-lease and event traffic against ephd with `--data-dir`, SIGTERM
/// (mid-traffic, or after the writers paused), restart on the same port
/// with the same data dir, then check everything that was acknowledged.
async fn rolling_restart(mid_traffic: bool) {
    const SHORT_TTL: u64 = 10;
    let dir = tempfile::tempdir().expect("data dir");
    let dir_arg = dir.path().to_str().expect("utf-8 path").to_string();
    // Snapshots alone, as with `--wal none`: the final snapshot holds every
    // acknowledged write, and revisions jump at the restart. Restarts that
    // replay the write-ahead log are `wal.rs`'s.
    let args = ["--data-dir", dir_arg.as_str(), "--wal", "none"];
    let port = free_port();
    let mut a = Proc::start(port, &args).await;
    let api = Apiserver::connect(&a.endpoint()).await;
    let track: Track = Arc::default();

    // Short-lived events whose lease must keep counting down across the
    // restart (not restart from its TTL, not vanish).
    let before_grant = Instant::now();
    let short = api.grant(SHORT_TTL as i64).await;
    let mut short_keys = Vec::new();
    for i in 0..20 {
        let key = format!("{EVENTS}short/ev-{i:02}");
        let rev = api
            .create(&key, b"k8s\x00short", short)
            .await
            .expect("Txn")
            .expect("new");
        ack(
            &track,
            &key,
            Obj {
                value: "k8s\x00short".to_string(),
                mod_rev: rev,
                create_rev: rev,
                version: 1,
                lease: short,
            },
        );
        short_keys.push(key);
    }

    // The apiserver's compactor (local version 2 after two ticks) and the
    // leases watch cache.
    let mut compactor = Compactor::default();
    assert!(matches!(
        compactor.tick(&api).await,
        Tick::Lost { version: 1, .. }
    ));
    assert!(matches!(
        compactor.tick(&api).await,
        Tick::Won {
            compacted: Some((_, Ok(_)))
        }
    ));
    let listed = api.list(LEASES, 10_000, 0).await.expect("list");
    let mut cache = Watcher::open(api.channel(), cache_watch(LEASES, listed.revision + 1)).await;

    // Traffic: 8 kubelets × 5 node leases, and event writers: many of them
    // when ephd is stopped mid-traffic, so that plenty of writes are in
    // flight when SIGTERM arrives.
    let event_writers = if mid_traffic { 16 } else { 4 };
    let leases = Arc::new(LeaseManager::new(api.clone(), EVENT_LEASE_TTL));
    let mut writers = Vec::new();
    for k in 0..8 {
        let keys = (0..5).map(|i| node_key(k * 5 + i)).collect();
        let api = Apiserver::connect(&a.endpoint()).await;
        writers.push(tokio::spawn(heartbeats(api, track.clone(), keys)));
    }
    for w in 0..event_writers {
        let api = Apiserver::connect(&a.endpoint()).await;
        writers.push(tokio::spawn(event_creates(
            api,
            track.clone(),
            leases.clone(),
            w,
        )));
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    let mut ttl_before = HashMap::new();
    for id in leases.granted().into_iter().chain([short]) {
        let ttl = api.time_to_live(id, false).await;
        ttl_before.insert(id, (ttl.ttl, ttl.granted_ttl));
    }
    if mid_traffic {
        a.sigterm().await;
    }
    track.lock().unwrap().stop = true;
    for w in writers {
        within_for(Duration::from_secs(10), "writer stops", w)
            .await
            .expect("writer task");
    }
    if !mid_traffic {
        assert!(
            track.lock().unwrap().maybe.is_empty(),
            "no write failed before SIGTERM"
        );
        a.sigterm().await;
    }
    let snapshot_rev = logged_snapshot_revision(&a.logs());
    let (acked, maybe, max_rev) = {
        let t = track.lock().unwrap();
        (t.acked.clone(), t.maybe.clone(), t.max_rev)
    };
    assert!(acked.len() > 60, "traffic ran: {} keys", acked.len());

    let _b = Proc::start(port, &args).await;
    let first = range_retrying(&api, current_rv_req()).await;
    let rev_b = header_rev(&first.header);
    assert!(
        rev_b > max_rev,
        "revision {rev_b} after restart, {max_rev} before"
    );

    // The cache's stream ended with Unavailable; its transparent resume from
    // the last event + 1 is canceled as compacted (history is not kept), and
    // the reflector relists.
    let end = cache.ended(Duration::from_secs(5)).await;
    assert_eq!(end.code(), tonic::Code::Unavailable, "{end:?}");
    cache.assert_clean();
    let resume = cache.rv() + 1;
    let resumed = Watcher::open(api.channel(), cache_watch(LEASES, resume)).await;
    let cancel = resumed.canceled().await;
    assert!(cancel.compact_revision > resume, "{cancel:?}");

    // Every acknowledged write is there, byte for byte, with its revisions,
    // version and lease; a write whose RPC failed may or may not be.
    let mut all = api.list(EVENTS, 1000, 0).await.expect("list events").kvs;
    all.extend(api.list(LEASES, 1000, 0).await.expect("list leases").kvs);
    let restored: BTreeMap<String, KeyValue> =
        all.into_iter().map(|kv| (text(&kv.key), kv)).collect();
    let mut lost = Vec::new();
    for (key, obj) in &acked {
        let Some(kv) = restored.get(key) else {
            lost.push(format!("{key} (mod_revision {}) missing", obj.mod_rev));
            continue;
        };
        let got = Obj {
            value: text(&kv.value),
            mod_rev: kv.mod_revision,
            create_rev: kv.create_revision,
            version: kv.version,
            lease: kv.lease,
        };
        if got == *obj {
            continue;
        }
        let applied_maybe = maybe.get(key).is_some_and(|(value, lease)| {
            got.value == text(value)
                && got.lease == *lease
                && got.version == obj.version + 1
                && got.mod_rev > obj.mod_rev
                && got.create_rev == obj.create_rev
        });
        if !applied_maybe {
            lost.push(format!("{key}: acknowledged {obj:?}, restored {got:?}"));
        }
    }
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged writes lost or changed by the rolling restart: the final \
         snapshot was taken at revision {snapshot_rev}, yet writes up to revision {max_rev} were \
         acknowledged before ephd exited:\n{}",
        lost.len(),
        acked.len(),
        lost.join("\n")
    );
    for key in restored.keys() {
        assert!(
            acked.contains_key(key) || maybe.contains_key(key),
            "{key} restored but never written"
        );
    }

    // Leases are restored with the time they had left, not reset.
    for (id, (before, granted)) in &ttl_before {
        let now = api.time_to_live(*id, true).await;
        assert_eq!(now.granted_ttl, *granted, "lease {id} granted TTL");
        assert!(
            now.ttl >= 0 && now.ttl <= *before,
            "lease {id}: {} s left after the restart, {before} s before",
            now.ttl
        );
        let mut want: Vec<_> = restored
            .values()
            .filter(|kv| kv.lease == *id)
            .map(|kv| kv.key.clone())
            .collect();
        want.sort();
        assert_eq!(now.keys, want, "keys attached to lease {id}");
    }

    // The watch cache's copies stay valid: a heartbeat based on the
    // pre-restart mod_revision succeeds.
    let (key, obj) = acked
        .iter()
        .find(|(k, _)| k.starts_with(LEASES) && !maybe.contains_key(*k))
        .expect("a node lease");
    match api
        .update(key, b"after", 0, obj.mod_rev)
        .await
        .expect("Txn")
    {
        Outcome::Done(r) => assert!(r > rev_b),
        other => panic!("heartbeat from the cached copy after restart: {other:?}"),
    }
    // History before the restart is not kept.
    assert_raw_err(
        api.get_at(key, max_rev).await,
        tonic::Code::OutOfRange,
        ERR_COMPACTED,
    );

    // compact_rev_key was restored with its version: the compactor's CAS
    // wins, and its Compact at a pre-restart revision is answered with
    // ErrCompacted (logged by the apiserver; the next tick compacts).
    let prev = compactor.rev;
    match compactor.tick(&api).await {
        Tick::Won {
            compacted: Some((rev, Err((code, msg)))),
        } => {
            assert_eq!(rev, prev);
            assert_eq!(
                (code, msg.as_str()),
                (tonic::Code::OutOfRange, ERR_COMPACTED)
            );
        }
        other => panic!("first compactor tick after the restart: {other:?}"),
    }
    assert_eq!(compactor.time, 3);
    assert!(matches!(
        compactor.tick(&api).await,
        Tick::Won {
            compacted: Some((_, Ok(_)))
        }
    ));

    // The short lease expires on its original schedule.
    let watch = Watcher::open(
        api.channel(),
        direct_watch(&format!("{EVENTS}short/"), api.current_rv(EVENTS).await + 1),
    )
    .await;
    let due = before_grant + Duration::from_secs(SHORT_TTL);
    watch
        .wait_for(
            "short lease expiry after the restart",
            Duration::from_secs(SHORT_TTL + 5),
            |s| s.events.len() >= short_keys.len(),
        )
        .await;
    let at = Instant::now();
    assert!(
        at + Duration::from_millis(200) >= due,
        "expired {:?} before its TTL ran out",
        due - at
    );
    assert!(
        at <= due + Duration::from_secs(3),
        "expired {:?} late (lease TTL reset by the restart?)",
        at - due
    );
    watch.assert_clean();
    watch.seen(|s| {
        let rev = s.events[0].kv.as_ref().unwrap().mod_revision;
        for e in &s.events {
            assert_eq!(e.r#type, EventType::Delete as i32);
            assert_eq!(e.kv.as_ref().unwrap().mod_revision, rev, "one revision");
            assert_eq!(e.prev_kv.as_ref().expect("prev_kv").lease, short);
        }
    });
}
