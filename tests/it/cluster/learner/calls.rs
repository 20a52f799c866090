//! Every client RPC once, against one member: what it answers (gRPC code
//! and message, or "ok"), so that a learner of ephd and a learner of stock
//! etcd 3.4 can be compared call by call. The calls are made so that, if a
//! member did serve them, they would change nothing a later call depends
//! on (unknown IDs, invalid URLs, a lease that does not exist).

use std::time::Duration;

use ephd::proto::etcdserverpb::{
    auth_client::AuthClient, lease_client::LeaseClient, AlarmRequest, AuthDisableRequest,
    AuthEnableRequest, AuthRoleGetRequest, AuthRoleListRequest, AuthUserGetRequest,
    AuthUserListRequest, AuthenticateRequest, CompactionRequest, DefragmentRequest,
    DeleteRangeRequest, HashKvRequest, HashRequest, LeaseGrantRequest, LeaseKeepAliveRequest,
    LeaseLeasesRequest, LeaseRevokeRequest, LeaseTimeToLiveRequest, MemberAddRequest,
    MemberListRequest, MemberPromoteRequest, MemberRemoveRequest, MemberUpdateRequest,
    MoveLeaderRequest, PutRequest, RangeRequest, SnapshotRequest, StatusRequest, TxnRequest,
    WatchCreateRequest, WatchRequest,
};
use ephd::proto::v3electionpb::{
    election_client::ElectionClient, CampaignRequest, LeaderKey, LeaderRequest, ProclaimRequest,
    ResignRequest,
};
use ephd::proto::v3lockpb::{lock_client::LockClient, LockRequest, UnlockRequest};
use tokio_stream::StreamExt;
use tonic::{Response, Status, Streaming};
use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};

use crate::harness::Server;

/// How long a call may take before it counts as "no answer" (a learner
/// that served a linearizable call without a way to answer it would hang).
const CALL: Duration = Duration::from_secs(3);

/// A lease that exists nowhere.
const NO_LEASE: i64 = 0x1234_5678;
/// A member that exists nowhere.
const NO_MEMBER: u64 = 0x1234_5678;

/// "ok", or the gRPC code and message.
fn outcome<T>(r: Result<T, Status>) -> String {
    match r {
        Ok(_) => "ok".to_string(),
        Err(s) => format!("{:?}: {}", s.code(), s.message()),
    }
}

/// A unary call, bounded by [`CALL`].
async fn unary<T>(f: impl std::future::Future<Output = Result<Response<T>, Status>>) -> String {
    match tokio::time::timeout(CALL, f).await {
        Ok(r) => outcome(r),
        Err(_) => "no answer".to_string(),
    }
}

/// A streaming call: refused when it opens, or its first message.
async fn stream<T>(
    f: impl std::future::Future<Output = Result<Response<Streaming<T>>, Status>>,
) -> String {
    let first = async {
        let mut s = f.await?.into_inner();
        match s.message().await? {
            Some(_) => Ok(()),
            None => Err(Status::unknown("stream ended without a message")),
        }
    };
    match tokio::time::timeout(CALL, first).await {
        Ok(r) => outcome(r),
        Err(_) => "no answer".to_string(),
    }
}

/// One message, then a request stream that stays open (a bidirectional
/// stream whose client has not finished).
fn one_then_open<T: Send + 'static>(m: T) -> impl tokio_stream::Stream<Item = T> + Send {
    tokio_stream::iter(vec![m]).chain(tokio_stream::pending())
}

/// Every client RPC once through `m`, each as `(call, outcome)`.
pub async fn answers(m: &impl Server) -> Vec<(&'static str, String)> {
    let ch = m.channel().await;
    let mut kv = m.kv().await;
    let mut watch = m.watch().await;
    let mut lease = LeaseClient::new(ch.clone());
    let mut cluster = m.cluster().await;
    let mut maint = m.maintenance().await;
    let mut auth = AuthClient::new(ch.clone());
    let mut lock = LockClient::new(ch.clone());
    let mut election = ElectionClient::new(ch.clone());
    let mut health = HealthClient::new(ch);
    let key = || b"learner-probe".to_vec().into();
    let range = |serializable| RangeRequest {
        key: key(),
        serializable,
        ..Default::default()
    };
    let leader_key = || LeaderKey {
        name: b"learner-election".to_vec().into(),
        key: b"learner-election/1".to_vec().into(),
        rev: 1,
        lease: NO_LEASE,
    };
    let mut out = Vec::new();
    out.push(("Range serializable", unary(kv.range(range(true))).await));
    out.push(("Range linearizable", unary(kv.range(range(false))).await));
    let put = PutRequest {
        key: key(),
        value: b"v".to_vec().into(),
        ..Default::default()
    };
    out.push(("Put", unary(kv.put(put)).await));
    let del = DeleteRangeRequest {
        key: key(),
        ..Default::default()
    };
    out.push(("DeleteRange", unary(kv.delete_range(del)).await));
    out.push(("Txn", unary(kv.txn(TxnRequest::default())).await));
    let compact = CompactionRequest {
        revision: 1,
        physical: false,
    };
    out.push(("Compact", unary(kv.compact(compact)).await));
    let create = WatchRequest {
        request_union: Some(
            ephd::proto::etcdserverpb::watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key: key(),
                    ..Default::default()
                },
            ),
        ),
    };
    out.push(("Watch", stream(watch.watch(one_then_open(create))).await));
    let grant = LeaseGrantRequest { ttl: 60, id: 0 };
    out.push(("LeaseGrant", unary(lease.lease_grant(grant)).await));
    let revoke = LeaseRevokeRequest { id: NO_LEASE };
    out.push(("LeaseRevoke", unary(lease.lease_revoke(revoke)).await));
    let ka = LeaseKeepAliveRequest { id: NO_LEASE };
    out.push((
        "LeaseKeepAlive",
        stream(lease.lease_keep_alive(one_then_open(ka))).await,
    ));
    let ttl = LeaseTimeToLiveRequest {
        id: NO_LEASE,
        keys: false,
    };
    out.push((
        "LeaseTimeToLive",
        unary(lease.lease_time_to_live(ttl)).await,
    ));
    out.push((
        "LeaseLeases",
        unary(lease.lease_leases(LeaseLeasesRequest {})).await,
    ));
    let add = MemberAddRequest {
        peer_ur_ls: vec!["bad".into()],
        is_learner: true,
    };
    out.push(("MemberAdd", unary(cluster.member_add(add)).await));
    let remove = MemberRemoveRequest { id: NO_MEMBER };
    out.push(("MemberRemove", unary(cluster.member_remove(remove)).await));
    let update = MemberUpdateRequest {
        id: NO_MEMBER,
        peer_ur_ls: vec!["http://127.0.0.1:1".into()],
    };
    out.push(("MemberUpdate", unary(cluster.member_update(update)).await));
    out.push((
        "MemberList",
        unary(cluster.member_list(MemberListRequest::default())).await,
    ));
    let promote = MemberPromoteRequest { id: NO_MEMBER };
    out.push((
        "MemberPromote",
        unary(cluster.member_promote(promote)).await,
    ));
    out.push(("Alarm", unary(maint.alarm(AlarmRequest::default())).await));
    out.push(("Status", unary(maint.status(StatusRequest {})).await));
    out.push((
        "Defragment",
        unary(maint.defragment(DefragmentRequest {})).await,
    ));
    out.push(("Hash", unary(maint.hash(HashRequest {})).await));
    out.push((
        "HashKV",
        unary(maint.hash_kv(HashKvRequest { revision: 0 })).await,
    ));
    out.push(("Snapshot", stream(maint.snapshot(SnapshotRequest {})).await));
    let mv = MoveLeaderRequest {
        target_id: NO_MEMBER,
    };
    out.push(("MoveLeader", unary(maint.move_leader(mv)).await));
    out.push((
        "AuthEnable",
        unary(auth.auth_enable(AuthEnableRequest {})).await,
    ));
    out.push((
        "AuthDisable",
        unary(auth.auth_disable(AuthDisableRequest {})).await,
    ));
    let authenticate = AuthenticateRequest {
        name: "nobody".into(),
        password: "x".into(),
    };
    out.push(("Authenticate", unary(auth.authenticate(authenticate)).await));
    let user = AuthUserGetRequest {
        name: "nobody".into(),
    };
    out.push(("UserGet", unary(auth.user_get(user)).await));
    out.push((
        "UserList",
        unary(auth.user_list(AuthUserListRequest {})).await,
    ));
    let role = AuthRoleGetRequest {
        role: "nobody".into(),
    };
    out.push(("RoleGet", unary(auth.role_get(role)).await));
    out.push((
        "RoleList",
        unary(auth.role_list(AuthRoleListRequest {})).await,
    ));
    let l = LockRequest {
        name: b"learner-lock".to_vec().into(),
        lease: NO_LEASE,
    };
    out.push(("Lock", unary(lock.lock(l)).await));
    let u = UnlockRequest {
        key: b"learner-lock/1".to_vec().into(),
    };
    out.push(("Unlock", unary(lock.unlock(u)).await));
    let campaign = CampaignRequest {
        name: b"learner-election".to_vec().into(),
        lease: NO_LEASE,
        value: b"v".to_vec().into(),
    };
    out.push(("Campaign", unary(election.campaign(campaign)).await));
    let proclaim = ProclaimRequest {
        leader: Some(leader_key()),
        value: b"v".to_vec().into(),
    };
    out.push(("Proclaim", unary(election.proclaim(proclaim)).await));
    let leader = LeaderRequest {
        name: b"learner-election".to_vec().into(),
    };
    out.push(("Leader", unary(election.leader(leader.clone())).await));
    out.push(("Observe", stream(election.observe(leader)).await));
    let resign = ResignRequest {
        leader: Some(leader_key()),
    };
    out.push(("Resign", unary(election.resign(resign)).await));
    let check = HealthCheckRequest {
        service: String::new(),
    };
    out.push(("Health.Check", unary(health.check(check.clone())).await));
    out.push(("Health.Watch", stream(health.watch(check)).await));
    out
}
