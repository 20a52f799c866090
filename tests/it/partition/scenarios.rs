//! Each scenario runs on a three- (or five-) member stock etcd, then on
//! ephd with the same flags, in a network of namespaces (`net.rs`), under
//! the workload of `workload.rs` and the linearizability clients of
//! `lincheck`. Both must come through with:
//! * a linearizable history of puts, reads and compare-and-sets;
//! * every acknowledged write in the final state and in the watch, at the
//!   revision its answer gave;
//! * a gapless watch: revisions in order, none twice, nothing that no
//!   client wrote;
//! * no lease expired before its TTL ran out after its last acknowledged
//!   renewal, and the lease whose renewals stopped did expire;
//! * every member at the same revision with the same HashKV.
//!
//! A case that stock etcd comes through and ephd does not is a bug in
//! ephd; one that etcd fails too is a bug in the scenario.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{
    kv_client::KvClient, maintenance_client::MaintenanceClient, HashKvRequest, RangeRequest,
    StatusRequest,
};

use super::members::{Kind, NetCluster};
use super::workload::{self, channel, Workload, DROPPED_KEY, KEPT_KEY, LEASE_TTL, PREFIX};
use crate::lincheck::checker::{check, Ret};
use crate::lincheck::recorder::{run_client, History};

/// etcd's 1:10 heartbeat to election ratio, ten times faster than its
/// defaults.
const TIMING: &[&str] = &["--heartbeat-interval=50", "--election-timeout=500"];

/// A small log, so a member cut off for a few seconds falls behind what
/// the leader keeps and needs a snapshot.
const SMALL_LOG: &[&str] = &["--snapshot-count=200", "--snapshot-catchup-entries=100"];

/// Load before the fault, how long a fault holds, load after the heal.
const BEFORE: Duration = Duration::from_secs(2);
const HOLD: Duration = Duration::from_secs(3);
const AFTER: Duration = Duration::from_secs(3);

/// A flapping link: this many cuts, each this long, as long apart.
const FLAPS: usize = 6;
const FLAP: Duration = Duration::from_millis(400);

/// Writes a cut-off member must miss in the retention scenario: well past
/// the leader's log (`SMALL_LOG`).
const MISSED_WRITES: usize = 400;

/// How many times longer than the defaults faults hold and load runs
/// after them (`EPHD_PARTITION_SCALE`; `bench/partitions.sh` soaks with it).
fn scale() -> u32 {
    std::env::var("EPHD_PARTITION_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(1)
}

/// How long the cluster may take to agree after the heal.
const SETTLE: Duration = Duration::from_secs(30);

/// Linearizability clients, and the registers they share.
const LIN_CLIENTS: usize = 3;
const LIN_KEYS: usize = 4;

/// What the network does to the cluster.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// The leader cut off from the others both ways.
    LeaderIsolated,
    /// Nothing the leader sends reaches the others; what they send
    /// reaches it.
    LeaderCannotSend,
    /// One member's links cut and mended over and over, a different
    /// member each time, the leader first.
    Flapping,
    /// Five members split two against three, the leader among the two.
    LeaderInMinorityOfFive,
    /// A follower cut off while more is written than the leader's log
    /// keeps, so it catches up by snapshot.
    FollowerBeyondLogRetention,
}

impl Fault {
    fn members(self) -> usize {
        match self {
            Fault::LeaderInMinorityOfFive => 5,
            _ => 3,
        }
    }

    fn args(self) -> Vec<&'static str> {
        let mut args = TIMING.to_vec();
        if let Fault::FollowerBeyondLogRetention = self {
            args.extend_from_slice(SMALL_LOG);
        }
        args
    }
}

/// Runs `fault` on stock etcd, then on ephd; panics with every broken
/// promise of either.
pub async fn on_etcd_and_ephd(fault: Fault) {
    let mut failures = Vec::new();
    for kind in [Kind::Etcd, Kind::Ephd] {
        match run(kind, fault).await {
            Ok(report) => eprintln!("{fault:?} on {kind:?}: {report}"),
            Err(e) => failures.push(format!("{kind:?}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{fault:?}:\n{}", failures.join("\n\n"));
}

/// One look at members `among`: the index of the leader they all name,
/// when every one answers and it is one of them; otherwise the leader IDs
/// they named (0 for no answer).
async fn agreed_leader(cluster: &NetCluster, among: &[usize]) -> Result<usize, Vec<u64>> {
    let mut named = Vec::new();
    let mut ids = Vec::new();
    for &i in among {
        let mut m = MaintenanceClient::new(channel(&cluster.endpoint(i)));
        match m.status(StatusRequest {}).await {
            Ok(s) => {
                let s = s.into_inner();
                named.push(s.leader);
                ids.push((i, s.header.map_or(0, |h| h.member_id)));
            }
            Err(_) => named.push(0),
        }
    }
    let agreed = named.iter().all(|l| *l == named[0] && *l != 0);
    match ids.iter().find(|(_, id)| *id == named[0]) {
        Some(&(i, _)) if agreed => Ok(i),
        _ => Err(named),
    }
}

/// The index of the member every member names as leader.
async fn leader(cluster: &NetCluster) -> usize {
    let all: Vec<usize> = (0..cluster.net.members()).collect();
    let deadline = Instant::now() + SETTLE;
    loop {
        match agreed_leader(cluster, &all).await {
            Ok(i) => return i,
            Err(named) => assert!(Instant::now() < deadline, "no agreed leader: {named:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every member's revision once they all agree on one at least `least`;
/// `Err` when they do not within [`SETTLE`].
async fn settled_revision(cluster: &NetCluster, least: i64) -> Result<i64, String> {
    let deadline = Instant::now() + SETTLE;
    let mut last = Vec::new();
    loop {
        let mut revisions = Vec::new();
        for endpoint in cluster.endpoints() {
            let mut m = MaintenanceClient::new(channel(&endpoint));
            revisions.push(match m.status(StatusRequest {}).await {
                Ok(s) => s.into_inner().header.map_or(-1, |h| h.revision),
                Err(_) => -1,
            });
        }
        if revisions.iter().all(|r| *r == revisions[0] && *r >= least) && revisions == last {
            return Ok(revisions[0]);
        }
        if Instant::now() > deadline {
            return Err(format!("members never agreed on a revision: {revisions:?}"));
        }
        last = revisions;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether `among` agree on a leader of their own (one of them, not
/// `old`) within [`SETTLE`]: the cut really cut.
async fn new_leader_among(cluster: &NetCluster, among: &[usize], old: usize) -> Result<(), String> {
    let deadline = Instant::now() + SETTLE;
    loop {
        match agreed_leader(cluster, among).await {
            Ok(_) => return Ok(()),
            Err(named) if Instant::now() > deadline => {
                return Err(format!(
                    "m{among:?} elected no leader of their own while cut off from m{old}: {named:?}"
                ))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Does to the cluster what `fault` says, and undoes it; returns when the
/// network is whole again, with whatever went wrong meanwhile.
async fn inflict(fault: Fault, cluster: &NetCluster, workload: &Workload) -> Result<(), String> {
    let net = &cluster.net;
    let n = net.members();
    let l = leader(cluster).await;
    let others: Vec<usize> = (0..n).filter(|i| *i != l).collect();
    workload.drop_lease.store(true, Ordering::SeqCst);
    match fault {
        Fault::LeaderIsolated => {
            net.split(&[l], &others);
            let started = Instant::now();
            let elected = new_leader_among(cluster, &others, l).await;
            tokio::time::sleep((HOLD * scale()).saturating_sub(started.elapsed())).await;
            net.join(&[l], &others);
            elected
        }
        Fault::LeaderCannotSend => {
            for &o in &others {
                net.cut(l, o);
            }
            let started = Instant::now();
            let elected = new_leader_among(cluster, &others, l).await;
            tokio::time::sleep((HOLD * scale()).saturating_sub(started.elapsed())).await;
            for &o in &others {
                net.mend(l, o);
            }
            elected
        }
        Fault::Flapping => {
            for flap in 0..FLAPS * scale() as usize {
                let victim = (l + flap) % n;
                let rest: Vec<usize> = (0..n).filter(|i| *i != victim).collect();
                net.split(&[victim], &rest);
                tokio::time::sleep(FLAP).await;
                net.join(&[victim], &rest);
                tokio::time::sleep(FLAP).await;
            }
            Ok(())
        }
        Fault::LeaderInMinorityOfFive => {
            let minority = [l, others[0]];
            let majority = &others[1..];
            net.split(&minority, majority);
            let started = Instant::now();
            let elected = new_leader_among(cluster, majority, l).await;
            tokio::time::sleep((HOLD * scale()).saturating_sub(started.elapsed())).await;
            net.join(&minority, majority);
            elected
        }
        Fault::FollowerBeyondLogRetention => {
            let f = others[0];
            let rest: Vec<usize> = (0..n).filter(|i| *i != f).collect();
            let before = workload.record.lock().unwrap().acked.len();
            net.split(&[f], &rest);
            let deadline = Instant::now() + SETTLE;
            let mut missed = Ok(());
            while workload.record.lock().unwrap().acked.len()
                < before + MISSED_WRITES * scale() as usize
            {
                if Instant::now() > deadline {
                    missed = Err(format!("too few writes while m{f} was cut off"));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            net.join(&[f], &rest);
            missed
        }
    }
}

/// One scenario on one kind of server: a report, or every broken promise.
async fn run(kind: Kind, fault: Fault) -> Result<String, String> {
    let cluster = NetCluster::start(kind, fault.members(), &fault.args());
    let endpoints = cluster.endpoints();
    let (workload, [kept, dropped, events_lease]) = Workload::prepare(endpoints.clone()).await;
    let history = History::new();
    let watch_done = Arc::new(AtomicBool::new(false));
    let watch = tokio::spawn(workload.clone().watch(watch_done.clone()));
    let mut writers = vec![
        tokio::spawn(workload.clone().events(0, events_lease)),
        tokio::spawn(workload.clone().events(1, events_lease)),
        tokio::spawn(workload.clone().heartbeats(0)),
        tokio::spawn(workload.clone().heartbeats(1)),
        tokio::spawn(workload.clone().keep_alive(kept, KEPT_KEY, false)),
        tokio::spawn(workload.clone().keep_alive(dropped, DROPPED_KEY, true)),
    ];
    let keys: Vec<String> = (0..LIN_KEYS).map(|k| format!("lin/k{k}")).collect();
    for id in 0..LIN_CLIENTS {
        writers.push(tokio::spawn(run_client(
            id,
            endpoints.clone(),
            keys.clone(),
            history.clone(),
        )));
    }

    tokio::time::sleep(BEFORE).await;
    let fault_at = workload.now();
    let mut failures = Vec::new();
    failures.extend(inflict(fault, &cluster, &workload).await.err());
    let healed_at = workload.now();
    tokio::time::sleep(AFTER * scale()).await;
    workload.stop();
    history.stop();
    for w in writers {
        w.await.expect("workload task");
    }

    // The dropped lease must expire: its DELETE comes through the watch.
    let deadline = Instant::now() + SETTLE;
    while !deleted(&workload, DROPPED_KEY) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A last write under the prefix marks where the watch must get to.
    let end = workload.end().await;
    let revision = match settled_revision(&cluster, end).await {
        Ok(r) => r,
        Err(e) => {
            failures.push(e);
            0
        }
    };
    let deadline = Instant::now() + SETTLE;
    while workload.watched_up_to() < end && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    watch_done.store(true, Ordering::SeqCst);
    watch.await.expect("watch task");

    if revision > 0 {
        failures.extend(same_hash(&cluster, revision).await.err());
    }
    failures.extend(final_state(&cluster, &workload).await.err());
    let record = workload.record.lock().unwrap();
    failures.extend(watch_complete(&record, end).err());
    failures.extend(leases_on_time(&record).err());
    let lin = history.events();
    if let Err(v) = check(&lin) {
        failures.push(format!("not linearizable: {v}"));
    }
    let acked_after = |t: Duration| record.acked.iter().filter(|a| a.at > t).count();
    if acked_after(healed_at) < 10 {
        failures.push(format!(
            "only {} writes acknowledged after the heal",
            acked_after(healed_at)
        ));
    }
    let lin_acked = lin
        .iter()
        .filter(|e| matches!(e.ret, Ret::Put | Ret::Cas(true)))
        .count();
    if lin_acked < 20 {
        failures.push(format!("only {lin_acked} register writes acknowledged"));
    }
    let report = format!(
        "{} writes acknowledged ({} during the fault, {} after), longest gap between \
         acknowledgements {:?}; {} register operations; the watch resumed {} times; \
         settled at revision {revision}",
        record.acked.len(),
        acked_after(fault_at) - acked_after(healed_at),
        acked_after(healed_at),
        longest_gap(&record.acked, fault_at),
        lin.len(),
        record.resumes.len(),
    );
    if failures.is_empty() {
        Ok(report)
    } else {
        Err(format!(
            "{}\n({report}; watch resumes: {:?})\n{}",
            failures.join("\n"),
            record.resumes,
            cluster.logs()
        ))
    }
}

/// Whether the watch saw `key` deleted.
fn deleted(workload: &Workload, key: &str) -> bool {
    let record = workload.record.lock().unwrap();
    record.seen.iter().any(|s| s.key == key && s.delete)
}

/// The longest time without an acknowledged write from `since` on.
fn longest_gap(acked: &[workload::Acked], since: Duration) -> Duration {
    let mut times: Vec<Duration> = acked.iter().map(|a| a.at).filter(|t| *t >= since).collect();
    times.sort();
    times
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default()
}

/// Every member's HashKV at `revision` is the same.
async fn same_hash(cluster: &NetCluster, revision: i64) -> Result<(), String> {
    let mut hashes = Vec::new();
    for endpoint in cluster.endpoints() {
        let mut m = MaintenanceClient::new(channel(&endpoint));
        let h = m
            .hash_kv(HashKvRequest { revision })
            .await
            .map_err(|s| format!("HashKV on {endpoint}: {s:?}"))?
            .into_inner();
        hashes.push(h.hash);
    }
    if hashes.iter().all(|h| *h == hashes[0]) {
        Ok(())
    } else {
        Err(format!("members differ at revision {revision}: {hashes:?}"))
    }
}

/// Every acknowledged write is in the final state: its key holds it or a
/// later write.
async fn final_state(cluster: &NetCluster, workload: &Workload) -> Result<(), String> {
    let mut kv = KvClient::new(channel(&cluster.endpoint(0)));
    let r = kv
        .range(RangeRequest {
            key: PREFIX.as_bytes().to_vec().into(),
            range_end: b"/registry0".to_vec().into(),
            ..Default::default()
        })
        .await
        .map_err(|s| format!("final range: {s:?}"))?
        .into_inner();
    let now: HashMap<String, (i64, String)> = r
        .kvs
        .into_iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(&kv.key).into_owned(),
                (
                    kv.mod_revision,
                    String::from_utf8_lossy(&kv.value).into_owned(),
                ),
            )
        })
        .collect();
    let record = workload.record.lock().unwrap();
    let mut last: BTreeMap<&str, &workload::Acked> = BTreeMap::new();
    for a in &record.acked {
        let e = last.entry(&a.key).or_insert(a);
        if a.revision > e.revision {
            *e = a;
        }
    }
    let mut lost = Vec::new();
    for (key, a) in last {
        match now.get(key) {
            Some((rev, value))
                if *rev > a.revision || (*rev == a.revision && *value == a.value) => {}
            other => lost.push(format!("{key}: acknowledged {a:?}, now {other:?}")),
        }
    }
    if lost.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} acknowledged writes lost: {}",
            lost.len(),
            lost.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
        ))
    }
}

/// The watch delivered every acknowledged write at its revision, in
/// revision order, each once, and only what clients wrote, up to `end`
/// (the last write).
fn watch_complete(record: &workload::Record, end: i64) -> Result<(), String> {
    let mut problems = Vec::new();
    let mut by_revision: HashMap<(i64, &str), &workload::Seen> = HashMap::new();
    let mut previous = 0;
    for s in &record.seen {
        if s.revision < previous {
            problems.push(format!("revision {} after {previous}", s.revision));
        }
        previous = s.revision;
        if by_revision.insert((s.revision, &s.key), s).is_some() {
            problems.push(format!("{} at {} delivered twice", s.key, s.revision));
        }
        let ours = s.delete || s.value == "held" || record.attempted.contains(&s.value);
        if !ours {
            problems.push(format!("{s:?} was never written"));
        }
    }
    if previous < end {
        problems.push(format!("the watch stopped at {previous} of {end}"));
    }
    let missed: Vec<_> = record
        .acked
        .iter()
        .filter(|a| match by_revision.get(&(a.revision, a.key.as_str())) {
            Some(s) => s.value != a.value || s.delete,
            None => true,
        })
        .collect();
    if !missed.is_empty() {
        problems.push(format!(
            "{} acknowledged writes missing from the watch, first {:?}",
            missed.len(),
            missed[0]
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        problems.truncate(5);
        Err(format!("watch: {}", problems.join("; ")))
    }
}

/// No lease expired before its TTL after its last acknowledged renewal,
/// and the one whose renewals stopped expired.
fn leases_on_time(record: &workload::Record) -> Result<(), String> {
    let ttl = Duration::from_secs(LEASE_TTL as u64);
    let mut problems = Vec::new();
    for key in [KEPT_KEY, DROPPED_KEY] {
        let deleted = record.seen.iter().find(|s| s.key == key && s.delete);
        let last = record
            .renewed
            .get(key)
            .and_then(|r| r.iter().max().copied());
        match (deleted, last) {
            (Some(d), Some(last)) if d.at < last + ttl => problems.push(format!(
                "{key} expired early: its delete was seen at {:?}, its TTL ran until {:?} at least",
                d.at,
                last + ttl
            )),
            (None, _) if key == DROPPED_KEY => {
                problems.push(format!("{key}'s lease never expired"))
            }
            _ => {}
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// The checks are not blind: a record with a write missing from the
/// watch, a revision out of order, or a lease deleted before its TTL ran
/// out is refused, and the same record whole is accepted.
#[test]
fn the_checks_refuse_what_they_exist_to_catch() {
    let at = Duration::from_secs;
    let seen = |revision, key: &str, value: &str, delete, t| workload::Seen {
        revision,
        key: key.into(),
        value: value.into(),
        delete,
        at: at(t),
    };
    let acked = |revision, key: &str, value: &str| workload::Acked {
        key: key.into(),
        value: value.into(),
        revision,
        at: at(1),
    };
    let mut whole = workload::Record::default();
    whole.attempted.insert("a".into());
    whole.attempted.insert("b".into());
    whole.acked = vec![acked(5, "/registry/x", "a"), acked(6, "/registry/y", "b")];
    whole.seen = vec![
        seen(5, "/registry/x", "a", false, 1),
        seen(6, "/registry/y", "b", false, 1),
        seen(7, DROPPED_KEY, "", true, 10),
    ];
    whole.renewed.insert(DROPPED_KEY.into(), vec![at(2)]);
    assert_eq!(watch_complete(&whole, 7), Ok(()));
    assert_eq!(leases_on_time(&whole), Ok(()));

    let mut gap = whole.clone();
    gap.seen.remove(0);
    assert!(watch_complete(&gap, 7).is_err(), "a missed write");
    let mut disorder = whole.clone();
    disorder.seen.swap(0, 1);
    assert!(watch_complete(&disorder, 7).is_err(), "out of order");
    let mut phantom = whole.clone();
    phantom.seen[1].value = "never".into();
    assert!(watch_complete(&phantom, 7).is_err(), "a value nobody wrote");
    assert!(watch_complete(&whole, 8).is_err(), "short of the end");
    let mut early = whole.clone();
    early.seen[2].at = at(5);
    assert!(
        leases_on_time(&early).is_err(),
        "deleted 3 s after a renewal"
    );
    let mut kept = whole.clone();
    kept.seen.pop();
    assert!(
        leases_on_time(&kept).is_err(),
        "the dropped lease never expired"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_cut_off_from_the_others() {
    on_etcd_and_ephd(Fault::LeaderIsolated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_hears_the_others_but_they_do_not_hear_it() {
    on_etcd_and_ephd(Fault::LeaderCannotSend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_flapping_member_after_member() {
    on_etcd_and_ephd(Fault::Flapping).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_members_split_with_the_leader_among_two() {
    on_etcd_and_ephd(Fault::LeaderInMinorityOfFive).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_past_the_leaders_log() {
    on_etcd_and_ephd(Fault::FollowerBeyondLogRetention).await;
}
