//! Which HTTP path calls which gRPC method, as etcd 3.4's grpc-gateway maps
//! them (the `google.api.http` annotations of etcd's `rpc.proto`,
//! `v3lock.proto` and `v3election.proto`, checked against a running etcd
//! 3.4). Every path is served under each of [`PREFIXES`].

/// The version prefixes the gateway answers under. etcd 3.4 serves `/v3`
/// and `/v3beta`; `/v3alpha` is what etcd 3.2 served and older gateway
/// clients still default to, so ephd answers it too.
pub const PREFIXES: &[&str] = &["v3", "v3beta", "v3alpha"];

/// How the HTTP body and response map onto the gRPC call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One JSON request, one JSON response.
    Unary,
    /// One JSON request, a stream of `{"result":…}` lines.
    ServerStream,
    /// A stream of JSON requests in the body, a stream of `{"result":…}`
    /// lines; the gRPC request side is closed when the body ends.
    BidiStream,
    /// As [`Shape::BidiStream`], but the gRPC request side stays open after
    /// the body ends, until the client goes away: a watch created by the
    /// body keeps delivering events, as etcd's gateway does.
    BidiHeld,
}

/// One gateway route.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    /// The path after the version prefix, e.g. `kv/range`.
    pub path: &'static str,
    /// The gRPC method's path, e.g. `/etcdserverpb.KV/Range`.
    pub method: &'static str,
    /// Fully qualified request message name.
    pub request: &'static str,
    /// Fully qualified response message name.
    pub response: &'static str,
    /// Unary or streaming.
    pub shape: Shape,
}

const fn r(
    path: &'static str,
    method: &'static str,
    request: &'static str,
    response: &'static str,
    shape: Shape,
) -> Route {
    Route {
        path,
        method,
        request,
        response,
        shape,
    }
}

use Shape::{BidiHeld, BidiStream, ServerStream, Unary};

/// Every route, etcd's names. `maintenance/hashkv` is ephd's addition:
/// etcd annotates HashKV with Hash's path, where Hash wins, so etcd's
/// gateway cannot reach HashKV at all. `auth/status` is etcd 3.5's path
/// (etcd 3.4 has no AuthStatus route).
#[rustfmt::skip]
pub const ROUTES: &[Route] = &[
    // KV
    r("kv/range", "/etcdserverpb.KV/Range", "etcdserverpb.RangeRequest", "etcdserverpb.RangeResponse", Unary),
    r("kv/put", "/etcdserverpb.KV/Put", "etcdserverpb.PutRequest", "etcdserverpb.PutResponse", Unary),
    r("kv/deleterange", "/etcdserverpb.KV/DeleteRange", "etcdserverpb.DeleteRangeRequest", "etcdserverpb.DeleteRangeResponse", Unary),
    r("kv/txn", "/etcdserverpb.KV/Txn", "etcdserverpb.TxnRequest", "etcdserverpb.TxnResponse", Unary),
    r("kv/compaction", "/etcdserverpb.KV/Compact", "etcdserverpb.CompactionRequest", "etcdserverpb.CompactionResponse", Unary),
    // Watch
    r("watch", "/etcdserverpb.Watch/Watch", "etcdserverpb.WatchRequest", "etcdserverpb.WatchResponse", BidiHeld),
    // Lease
    r("lease/grant", "/etcdserverpb.Lease/LeaseGrant", "etcdserverpb.LeaseGrantRequest", "etcdserverpb.LeaseGrantResponse", Unary),
    r("lease/revoke", "/etcdserverpb.Lease/LeaseRevoke", "etcdserverpb.LeaseRevokeRequest", "etcdserverpb.LeaseRevokeResponse", Unary),
    r("kv/lease/revoke", "/etcdserverpb.Lease/LeaseRevoke", "etcdserverpb.LeaseRevokeRequest", "etcdserverpb.LeaseRevokeResponse", Unary),
    r("lease/keepalive", "/etcdserverpb.Lease/LeaseKeepAlive", "etcdserverpb.LeaseKeepAliveRequest", "etcdserverpb.LeaseKeepAliveResponse", BidiStream),
    r("lease/timetolive", "/etcdserverpb.Lease/LeaseTimeToLive", "etcdserverpb.LeaseTimeToLiveRequest", "etcdserverpb.LeaseTimeToLiveResponse", Unary),
    r("kv/lease/timetolive", "/etcdserverpb.Lease/LeaseTimeToLive", "etcdserverpb.LeaseTimeToLiveRequest", "etcdserverpb.LeaseTimeToLiveResponse", Unary),
    r("lease/leases", "/etcdserverpb.Lease/LeaseLeases", "etcdserverpb.LeaseLeasesRequest", "etcdserverpb.LeaseLeasesResponse", Unary),
    r("kv/lease/leases", "/etcdserverpb.Lease/LeaseLeases", "etcdserverpb.LeaseLeasesRequest", "etcdserverpb.LeaseLeasesResponse", Unary),
    // Cluster
    r("cluster/member/add", "/etcdserverpb.Cluster/MemberAdd", "etcdserverpb.MemberAddRequest", "etcdserverpb.MemberAddResponse", Unary),
    r("cluster/member/remove", "/etcdserverpb.Cluster/MemberRemove", "etcdserverpb.MemberRemoveRequest", "etcdserverpb.MemberRemoveResponse", Unary),
    r("cluster/member/update", "/etcdserverpb.Cluster/MemberUpdate", "etcdserverpb.MemberUpdateRequest", "etcdserverpb.MemberUpdateResponse", Unary),
    r("cluster/member/list", "/etcdserverpb.Cluster/MemberList", "etcdserverpb.MemberListRequest", "etcdserverpb.MemberListResponse", Unary),
    r("cluster/member/promote", "/etcdserverpb.Cluster/MemberPromote", "etcdserverpb.MemberPromoteRequest", "etcdserverpb.MemberPromoteResponse", Unary),
    // Maintenance
    r("maintenance/alarm", "/etcdserverpb.Maintenance/Alarm", "etcdserverpb.AlarmRequest", "etcdserverpb.AlarmResponse", Unary),
    r("maintenance/status", "/etcdserverpb.Maintenance/Status", "etcdserverpb.StatusRequest", "etcdserverpb.StatusResponse", Unary),
    r("maintenance/defragment", "/etcdserverpb.Maintenance/Defragment", "etcdserverpb.DefragmentRequest", "etcdserverpb.DefragmentResponse", Unary),
    r("maintenance/hash", "/etcdserverpb.Maintenance/Hash", "etcdserverpb.HashRequest", "etcdserverpb.HashResponse", Unary),
    r("maintenance/hashkv", "/etcdserverpb.Maintenance/HashKV", "etcdserverpb.HashKVRequest", "etcdserverpb.HashKVResponse", Unary),
    r("maintenance/snapshot", "/etcdserverpb.Maintenance/Snapshot", "etcdserverpb.SnapshotRequest", "etcdserverpb.SnapshotResponse", ServerStream),
    r("maintenance/transfer-leadership", "/etcdserverpb.Maintenance/MoveLeader", "etcdserverpb.MoveLeaderRequest", "etcdserverpb.MoveLeaderResponse", Unary),
    // Auth
    r("auth/enable", "/etcdserverpb.Auth/AuthEnable", "etcdserverpb.AuthEnableRequest", "etcdserverpb.AuthEnableResponse", Unary),
    r("auth/disable", "/etcdserverpb.Auth/AuthDisable", "etcdserverpb.AuthDisableRequest", "etcdserverpb.AuthDisableResponse", Unary),
    r("auth/status", "/etcdserverpb.Auth/AuthStatus", "etcdserverpb.AuthStatusRequest", "etcdserverpb.AuthStatusResponse", Unary),
    r("auth/authenticate", "/etcdserverpb.Auth/Authenticate", "etcdserverpb.AuthenticateRequest", "etcdserverpb.AuthenticateResponse", Unary),
    r("auth/user/add", "/etcdserverpb.Auth/UserAdd", "etcdserverpb.AuthUserAddRequest", "etcdserverpb.AuthUserAddResponse", Unary),
    r("auth/user/get", "/etcdserverpb.Auth/UserGet", "etcdserverpb.AuthUserGetRequest", "etcdserverpb.AuthUserGetResponse", Unary),
    r("auth/user/list", "/etcdserverpb.Auth/UserList", "etcdserverpb.AuthUserListRequest", "etcdserverpb.AuthUserListResponse", Unary),
    r("auth/user/delete", "/etcdserverpb.Auth/UserDelete", "etcdserverpb.AuthUserDeleteRequest", "etcdserverpb.AuthUserDeleteResponse", Unary),
    r("auth/user/changepw", "/etcdserverpb.Auth/UserChangePassword", "etcdserverpb.AuthUserChangePasswordRequest", "etcdserverpb.AuthUserChangePasswordResponse", Unary),
    r("auth/user/grant", "/etcdserverpb.Auth/UserGrantRole", "etcdserverpb.AuthUserGrantRoleRequest", "etcdserverpb.AuthUserGrantRoleResponse", Unary),
    r("auth/user/revoke", "/etcdserverpb.Auth/UserRevokeRole", "etcdserverpb.AuthUserRevokeRoleRequest", "etcdserverpb.AuthUserRevokeRoleResponse", Unary),
    r("auth/role/add", "/etcdserverpb.Auth/RoleAdd", "etcdserverpb.AuthRoleAddRequest", "etcdserverpb.AuthRoleAddResponse", Unary),
    r("auth/role/get", "/etcdserverpb.Auth/RoleGet", "etcdserverpb.AuthRoleGetRequest", "etcdserverpb.AuthRoleGetResponse", Unary),
    r("auth/role/list", "/etcdserverpb.Auth/RoleList", "etcdserverpb.AuthRoleListRequest", "etcdserverpb.AuthRoleListResponse", Unary),
    r("auth/role/delete", "/etcdserverpb.Auth/RoleDelete", "etcdserverpb.AuthRoleDeleteRequest", "etcdserverpb.AuthRoleDeleteResponse", Unary),
    r("auth/role/grant", "/etcdserverpb.Auth/RoleGrantPermission", "etcdserverpb.AuthRoleGrantPermissionRequest", "etcdserverpb.AuthRoleGrantPermissionResponse", Unary),
    r("auth/role/revoke", "/etcdserverpb.Auth/RoleRevokePermission", "etcdserverpb.AuthRoleRevokePermissionRequest", "etcdserverpb.AuthRoleRevokePermissionResponse", Unary),
    // Lock
    r("lock/lock", "/v3lockpb.Lock/Lock", "v3lockpb.LockRequest", "v3lockpb.LockResponse", Unary),
    r("lock/unlock", "/v3lockpb.Lock/Unlock", "v3lockpb.UnlockRequest", "v3lockpb.UnlockResponse", Unary),
    // Election
    r("election/campaign", "/v3electionpb.Election/Campaign", "v3electionpb.CampaignRequest", "v3electionpb.CampaignResponse", Unary),
    r("election/proclaim", "/v3electionpb.Election/Proclaim", "v3electionpb.ProclaimRequest", "v3electionpb.ProclaimResponse", Unary),
    r("election/leader", "/v3electionpb.Election/Leader", "v3electionpb.LeaderRequest", "v3electionpb.LeaderResponse", Unary),
    r("election/observe", "/v3electionpb.Election/Observe", "v3electionpb.LeaderRequest", "v3electionpb.LeaderResponse", ServerStream),
    r("election/resign", "/v3electionpb.Election/Resign", "v3electionpb.ResignRequest", "v3electionpb.ResignResponse", Unary),
];
