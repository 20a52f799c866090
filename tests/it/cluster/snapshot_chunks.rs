//! A snapshot's data travels to a member catching up in chunks, outside
//! any single protobuf message (`RaftTransport/SendSnapshot`), so a store
//! whose snapshot is larger than one message may be still catches a member
//! up. The chunk size is set tiny (`--experimental-snapshot-chunk-bytes`,
//! 4 KiB) so a snapshot of about a megabyte provably travels in hundreds of
//! chunks: the receiving member logs how many, and must then hold every
//! key, value and version the leader holds.

use ephd::proto::etcdserverpb::{DeleteRangeRequest, PutRequest};

use crate::cluster::peer_metrics::member_id;
use crate::cluster::snapshot::{
    all_at, caught_up, initialized, leader, metric, signal, status, write_until_log_passes, ARGS,
};
use crate::harness::{EphdCluster, Server};
use crate::support::within;

const CHUNK: u64 = 4096;
const VALUE: usize = 2048;

/// The `chunks` and `bytes` of every "raft snapshot received" line in a
/// JSON log.
fn received(log: &str) -> Vec<(u64, u64)> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["msg"] == "raft snapshot received")
        .map(|v| (v["chunks"].as_u64().unwrap(), v["bytes"].as_u64().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_catches_up_from_a_snapshot_sent_in_many_chunks() {
    let logs = tempfile::tempdir().unwrap();
    let log_flag = format!(
        "--log-outputs=stderr,{}/{{name}}.log",
        logs.path().display()
    );
    let chunk_flag = format!("--experimental-snapshot-chunk-bytes={CHUNK}");
    let mut args: Vec<&str> = ARGS.to_vec();
    args.extend([log_flag.as_str(), chunk_flag.as_str()]);
    let cluster = EphdCluster::start(3, &args);
    let li = leader(&cluster).await;
    let fi = (li + 1) % 3;
    let (l, f) = (cluster.member(li).unwrap(), cluster.member(fi).unwrap());
    initialized(&cluster).await;
    let mut kv = l.kv().await;
    let put = |i: usize| PutRequest {
        key: format!("k{:03}", i % 150).into_bytes().into(),
        value: vec![b'a' + (i % 26) as u8; VALUE].into(),
        ..Default::default()
    };

    // The follower stops answering while the leader writes well past its
    // kept log: about a megabyte of history, two versions of most keys,
    // some deleted.
    let applied_at_pause = status(f).await.expect("status").2;
    signal(f, libc::SIGSTOP);
    for i in 0..400 {
        within("put", kv.put(put(i)))
            .await
            .expect("put while the follower is paused");
        if i % 25 == 0 {
            let key = format!("k{:03}", (i + 7) % 150).into_bytes().into();
            let req = DeleteRangeRequest {
                key,
                ..Default::default()
            };
            within("delete", kv.delete_range(req))
                .await
                .expect("delete");
        }
    }
    write_until_log_passes(l, &mut kv, "k-more", applied_at_pause).await;
    signal(f, libc::SIGCONT);

    let current = caught_up(&cluster, l, f).await;
    assert!(
        metric(f, "ephd_raft_snapshots_installed_total") >= 1,
        "caught up by snapshot\n{}",
        cluster.logs()
    );

    // Every key, value and version, as the leader has them.
    let (a, b) = (
        all_at(l, current).await.unwrap(),
        all_at(f, current).await.unwrap(),
    );
    assert!(a.kvs.len() > 100, "{} keys", a.kvs.len());
    assert!(
        a.kvs == b.kvs,
        "the follower's keys differ from the leader's"
    );

    // It came in many chunks of the size asked for.
    let log = std::fs::read_to_string(logs.path().join(format!("m{fi}.log"))).unwrap();
    let got = received(&log);
    assert!(!got.is_empty(), "no chunked snapshot received:\n{log}");
    for &(chunks, bytes) in &got {
        assert!(bytes > 500_000, "a snapshot of {bytes} bytes");
        assert_eq!(
            chunks,
            bytes.div_ceil(CHUNK),
            "{bytes} bytes in {chunks} chunks"
        );
    }

    // etcd's peer byte counters hold the snapshots' data, both ways.
    let data: u64 = got.iter().map(|(_, bytes)| *bytes).sum();
    let (lid, fid) = (member_id(l).await, member_id(f).await);
    let sent = metric(
        l,
        &format!("etcd_network_peer_sent_bytes_total{{To=\"{fid:x}\"}}"),
    );
    let from = format!("etcd_network_peer_received_bytes_total{{From=\"{lid:x}\"}}");
    let received = metric(f, &from);
    assert!(
        sent >= data && received >= data,
        "{data} bytes of snapshots; sent {sent}, received {received}"
    );
}
