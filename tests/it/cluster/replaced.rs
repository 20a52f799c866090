//! Leases after a member is replaced: a member added later (MemberAdd,
//! started with `--initial-cluster-state existing`) that replaced a
//! removed one and then became leader (MoveLeader) is reached by every
//! other member. Lease grants, keep-alives and TimeToLive work through
//! every member, and a lease kept alive through the members of the initial
//! cluster, which forward keep-alives to the new leader, outlives its TTL
//! several times over.

use std::time::{Duration, Instant};

use ephd::proto::etcdserverpb::{
    lease_client::LeaseClient, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseTimeToLiveRequest,
    MoveLeaderRequest, PutRequest, RangeRequest,
};
use tonic::transport::Channel;

use crate::cluster::members::{add, members, remove};
use crate::cluster::{agreed_leader, SETTLE, TIMING};
use crate::harness::{free_port, ClusterMember, EphdCluster, Server};

/// A lease TTL a few election timeouts long (TIMING's is 500 ms), shorter
/// than the checkpoint interval.
const TTL: i64 = 2;

/// Waits until `m` lists a member `id` that has published its name, as a
/// voter.
async fn started_voter(m: &ClusterMember, id: u64) {
    let deadline = Instant::now() + SETTLE;
    while !members(m)
        .await
        .iter()
        .any(|x| x.id == id && !x.name.is_empty() && !x.is_learner)
    {
        assert!(Instant::now() < deadline, "{id:x} never started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One keep-alive of lease `id` through `m`; the TTL it answers.
async fn keep_alive(m: &ClusterMember, id: i64) -> i64 {
    let mut lease = m.lease().await;
    let req = tokio_stream::iter(vec![LeaseKeepAliveRequest { id }]);
    let call = async {
        let mut s = lease.lease_keep_alive(req).await?.into_inner();
        s.message()
            .await?
            .ok_or_else(|| tonic::Status::unknown("keep-alive stream ended"))
    };
    match tokio::time::timeout(Duration::from_secs(10), call).await {
        Ok(Ok(r)) => r.ttl,
        Ok(Err(s)) => panic!("keep-alive of {id:x} through {}: {s:?}", m.endpoint()),
        Err(_) => panic!("keep-alive of {id:x} through {}: no answer", m.endpoint()),
    }
}

/// Lease `id`'s remaining TTL, as `m` answers it.
async fn time_to_live(lease: &mut LeaseClient<Channel>, id: i64) -> (i64, i64) {
    let r = lease
        .lease_time_to_live(LeaseTimeToLiveRequest { id, keys: false })
        .await
        .expect("time to live")
        .into_inner();
    (r.ttl, r.granted_ttl)
}

/// Moves leadership to `target` (asked of whoever leads), and waits until
/// every member agrees.
async fn move_leader(cluster: &EphdCluster, target: u64) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let (at, leader) = agreed_leader(cluster, None).await;
        if leader == target {
            return;
        }
        let mut m = cluster.member(at).unwrap().maintenance().await;
        let r = m.move_leader(MoveLeaderRequest { target_id: target }).await;
        assert!(
            r.is_ok() || Instant::now() < deadline,
            "move leader to {target:x}: {r:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_work_through_every_member_after_a_replacement_member_becomes_leader() {
    let mut cluster = EphdCluster::start(3, TIMING);
    agreed_leader(&cluster, None).await;
    // Replace m2: a new member joins, then m2 is removed (and stops).
    let c = cluster.member(0).unwrap().cluster().await;
    let port = free_port();
    let fresh = add(&c, &format!("http://127.0.0.1:{port}"), false)
        .await
        .expect("add the replacement");
    let n = cluster
        .start_joining("m3", port)
        .unwrap_or_else(|e| panic!("m3 did not join: {e}"));
    started_voter(cluster.member(0).unwrap(), fresh.id).await;
    let (old, _, _) = crate::cluster::status(cluster.member(2).unwrap())
        .await
        .expect("status of m2");
    remove(&c, old).await.expect("remove m2");
    cluster
        .exited(2, SETTLE)
        .unwrap_or_else(|| panic!("m2 still runs after its removal"));
    // The replacement leads: MoveLeader accepts it as a voter.
    move_leader(&cluster, fresh.id).await;
    let through = [0, 1, n];
    // Grants, keep-alives and TimeToLive through every member.
    let mut leases = Vec::new();
    for i in through {
        let m = cluster.member(i).unwrap();
        let g = m
            .lease()
            .await
            .lease_grant(LeaseGrantRequest { ttl: TTL, id: 0 })
            .await
            .unwrap_or_else(|s| panic!("grant through m{i}: {s:?}"))
            .into_inner();
        assert_eq!(g.ttl, TTL);
        leases.push(g.id);
    }
    for i in through {
        let m = cluster.member(i).unwrap();
        let mut lease = m.lease().await;
        for id in &leases {
            assert_eq!(keep_alive(m, *id).await, TTL, "through m{i}");
            let (ttl, granted) = time_to_live(&mut lease, *id).await;
            assert_eq!(granted, TTL, "through m{i}");
            assert!(ttl > 0 && ttl <= TTL, "{ttl} through m{i}");
        }
    }
    // A key on a lease kept alive through the two old members (forwarded
    // to the new leader) outlives three TTLs.
    let kept = leases[0];
    let put = PutRequest {
        key: b"kept".to_vec().into(),
        value: b"v".to_vec().into(),
        lease: kept,
        ..Default::default()
    };
    cluster
        .member(0)
        .unwrap()
        .kv()
        .await
        .put(put)
        .await
        .expect("put on the lease");
    let until = Instant::now() + Duration::from_secs(3 * TTL as u64);
    let mut k = 0;
    while Instant::now() < until {
        let m = cluster.member(through[k % 2]).unwrap();
        assert_eq!(
            keep_alive(m, kept).await,
            TTL,
            "kept alive through m{}",
            k % 2
        );
        k += 1;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    for i in through {
        let m = cluster.member(i).unwrap();
        let r = m
            .kv()
            .await
            .range(RangeRequest {
                key: b"kept".to_vec().into(),
                ..Default::default()
            })
            .await
            .expect("range")
            .into_inner();
        assert_eq!(r.kvs.len(), 1, "the kept lease's key is gone on m{i}");
        let (ttl, _) = time_to_live(&mut m.lease().await, kept).await;
        assert!(ttl > 0, "the kept lease expired (m{i} says {ttl})");
    }
}
