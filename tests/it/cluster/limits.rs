//! Apply-affecting settings in a cluster (`src/mvcc/limits.rs`,
//! `src/server/limits.rs`): members whose `--max-txn-ops` or
//! `--lease-adopt-unknown-ttl` differ still decide every entry alike,
//! because every member applies the leader's. Without that, a txn
//! proposed through one member fails to apply on a member with a smaller
//! limit, and a put on an unknown lease is adopted on one member and
//! refused on another: their stores part ways.

use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{request_op, PutRequest, RequestOp, TxnRequest};

use crate::cluster::{agreed_leader, put, same_everywhere, TIMING};
use crate::harness::{EphdCluster, Server};
use crate::support::within;

fn txn(ops: usize) -> TxnRequest {
    TxnRequest {
        success: (0..ops)
            .map(|i| RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: format!("t{i:02}").into_bytes().into(),
                    value: b"v".to_vec().into(),
                    ..Default::default()
                })),
            })
            .collect(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_with_different_flags_decide_every_entry_alike() {
    let mut cluster = EphdCluster::start(3, TIMING);
    let (leader, _) = agreed_leader(&cluster, None).await;
    put(cluster.member(leader).unwrap(), "first", "1").await;
    // A follower restarted with a smaller txn limit and no lease adoption
    // (it rejoins under a new ID).
    let odd = (leader + 1) % 3;
    cluster.kill(odd);
    cluster
        .start_member_with(
            &format!("m{odd}"),
            "new",
            Some(odd),
            &["--max-txn-ops=4", "--lease-adopt-unknown-ttl=0"],
        )
        .unwrap_or_else(|e| panic!("restart m{odd}: {e}"));
    let (leader, _) = agreed_leader(&cluster, None).await;
    assert_ne!(leader, odd, "the restarted member does not lead yet");
    let rev = put(cluster.member(leader).unwrap(), "second", "2").await;
    same_everywhere(&cluster, rev).await;

    // Ten puts in one txn through the leader: over the odd member's own
    // limit, within the leader's; every member applies it.
    let mut kv = cluster.member(leader).unwrap().kv().await;
    let r = within("txn", kv.txn(txn(10)))
        .await
        .expect("a 10-op txn within the leader's limit")
        .into_inner();
    assert!(r.succeeded);
    let at = r.header.unwrap().revision;
    // A put on a lease nobody granted: adopted under the leader's
    // --lease-adopt-unknown-ttl (the harness default), everywhere.
    let adopted = within(
        "put",
        kv.put(PutRequest {
            key: b"adopted".to_vec().into(),
            value: b"v".to_vec().into(),
            lease: 0x5eed,
            ..Default::default()
        }),
    )
    .await
    .expect("an unknown lease is adopted under the leader's setting")
    .into_inner()
    .header
    .unwrap()
    .revision;
    assert!(adopted > at);
    let kvs = same_everywhere(&cluster, adopted).await;
    assert!(kvs
        .iter()
        .any(|kv| kv.key[..] == b"t09"[..] && kv.mod_revision == at));
    assert!(kvs
        .iter()
        .any(|kv| kv.key[..] == b"adopted"[..] && kv.lease == 0x5eed));

    // It says it applies the leader's limits, not its flags.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !cluster
        .logs()
        .contains("limits in force: the leader's, not this member's flags")
    {
        assert!(Instant::now() < deadline, "no warning\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
