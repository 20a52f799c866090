//! The compaction safety net (`--compaction-safety-net`): history that
//! nothing compacts is compacted by ephd itself, keeping at least the
//! configured duration of it; a client that compacts regularly keeps it
//! out of the way. Durations are tiny here so the tests run in seconds.

use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions};

use crate::harness::{Ephd, Server};
use crate::support::{rev, within, within_for};

/// The WARN the safety net logs each time it compacts.
const NET_WARN: &str = "compaction safety net: nothing compacted history";

fn ephd_with_net(window: &str) -> Ephd {
    Ephd::start(&[
        "--revision-continuity",
        "false",
        "--compaction-safety-net",
        window,
    ])
}

/// Whether revision `r` can still be read (it is not compacted).
async fn readable(c: &mut Client, r: i64) -> bool {
    match within(
        "read at a revision",
        c.get("k", Some(GetOptions::new().with_revision(r))),
    )
    .await
    {
        Ok(_) => true,
        Err(e) => {
            let s = crate::support::grpc_status(e);
            assert_eq!(
                s.message(),
                "etcdserver: mvcc: required revision has been compacted"
            );
            false
        }
    }
}

/// The compacted revision, found with reads: the lowest readable revision
/// in `[low, high]`, where `high` is readable.
async fn compacted_revision(c: &mut Client, mut low: i64, mut high: i64) -> i64 {
    while low < high {
        let mid = low + (high - low) / 2;
        if readable(c, mid).await {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    high
}

async fn put(c: &mut Client, value: usize) -> i64 {
    rev(within("put", c.put("k", value.to_string(), None))
        .await
        .expect("put succeeds")
        .header())
}

/// Nobody compacts: the net compacts by itself, to a revision that was
/// current at least the configured duration before, and says so at WARN.
#[tokio::test]
async fn history_nobody_compacts_is_compacted_by_the_safety_net() {
    let window = Duration::from_secs(2);
    let server = ephd_with_net("2s");
    let mut c = server.client().await;
    // (time the put was sent, its revision)
    let mut writes: Vec<(Instant, i64)> = Vec::new();
    let first = put(&mut c, 0).await;
    let seen = within_for(Duration::from_secs(60), "a safety-net compaction", async {
        for i in 1.. {
            let sent = Instant::now();
            writes.push((sent, put(&mut c, i).await));
            if !readable(&mut c, first).await {
                return Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        unreachable!()
    })
    .await;
    let last = writes.last().unwrap().1;
    let compacted = compacted_revision(&mut c, first, last).await;
    assert!(compacted > first, "something was compacted");
    // The net compacted to the revision current at some time s at least
    // `window` before it acted, and it acted before `seen`; a put sent at
    // or after s got a higher revision. So every put sent at or after
    // `seen - window` is above the compaction: that much history was kept.
    let (sent, kept) = *writes
        .iter()
        .find(|(sent, _)| *sent + window >= seen)
        .expect("puts were sent during the last window");
    assert!(
        compacted < kept,
        "compacted at {compacted}, but the put sent {:?} before the compaction was seen got {kept}",
        seen - sent
    );
    let logs = server.logs();
    assert!(logs.contains(NET_WARN), "no WARN:\n{logs}");
    assert!(
        logs.contains("--compaction-safety-net=0"),
        "says how to turn it off"
    );
}

/// A client that compacts regularly, but keeps far more history than the
/// net's duration: the net never compacts (it would have moved the
/// compacted revision past the client's), and logs nothing.
#[tokio::test]
async fn the_safety_net_stays_away_while_a_client_compacts() {
    let server = ephd_with_net("4s");
    let mut c = server.client().await;
    let mut writer = server.client().await;
    let first = put(&mut c, 0).await;
    let mut compacted = first;
    let mut writes: Vec<(Instant, i64)> = Vec::new();
    let started = Instant::now();
    let mut i = 0;
    // Ten seconds: two and a half of the net's durations. The client
    // compacts every ten puts, each time one revision further, so it stays
    // far behind anything the net would compact to.
    while started.elapsed() < Duration::from_secs(10) {
        for _ in 0..10 {
            i += 1;
            writes.push((Instant::now(), put(&mut writer, i).await));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        compacted += 1;
        within("compact", c.compact(compacted, None))
            .await
            .expect("the client's compaction succeeds: nobody compacted further");
    }
    // Had the net compacted at the end, its target (a revision current 4 s
    // earlier, or later) would be above the client's compaction.
    let end = Instant::now();
    let (_, four_seconds_ago) = *writes
        .iter()
        .rev()
        .find(|(sent, _)| *sent + Duration::from_secs(4) <= end)
        .expect("writes more than 4 s before the end");
    assert!(
        four_seconds_ago > compacted,
        "the test's precondition: history grew past the client's compaction"
    );
    assert!(readable(&mut c, compacted).await);
    assert!(!readable(&mut c, compacted - 1).await);
    let logs = server.logs();
    assert!(!logs.contains(NET_WARN), "the net compacted:\n{logs}");
}
