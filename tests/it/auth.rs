//! Auth through real clients: the `etcd-client` crate (users, roles,
//! permissions, tokens it refreshes), raw requests for token edge cases,
//! `etcdctl --user` side by side with stock etcd, and a cluster where a
//! token issued by one member is valid on the others.

use crate::cli;
use crate::harness::{connect_channel, Ephd, EphdCluster, Server, StockEtcd, RPC_TIMEOUT};
use ephd::proto::etcdserverpb::{self as pb, kv_client::KvClient};
use etcd_client::{Client, ConnectOptions, Permission, PermissionType};
use std::time::Duration;
use tonic::Request;

/// Faster hashing: tests add users and authenticate often.
const FAST: &[&str] = &["--bcrypt-cost", "4"];

pub(crate) async fn client_as(
    endpoint: &str,
    user: &str,
    password: &str,
) -> Result<Client, etcd_client::Error> {
    let opts = ConnectOptions::new()
        .with_user(user, password)
        .with_auto_token_refresh(true)
        .with_connect_timeout(RPC_TIMEOUT)
        .with_timeout(RPC_TIMEOUT);
    Client::connect([endpoint], Some(opts)).await
}

pub(crate) fn status_of(e: etcd_client::Error) -> (tonic::Code, String) {
    match e {
        etcd_client::Error::GRpcStatus(s) => (s.code(), s.message().to_string()),
        other => panic!("not a gRPC status: {other:?}"),
    }
}

/// root (password `pw`) with the root role, and u1 (password `p`) whose
/// role may read and write `/app/`; auth enabled.
pub(crate) async fn set_up(c: &mut Client) {
    c.user_add("root", "pw", None).await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.user_add("u1", "p", None).await.unwrap();
    c.role_add("app").await.unwrap();
    c.role_grant_permission("app", Permission::read_write("/app/").with_prefix())
        .await
        .unwrap();
    c.user_grant_role("u1", "app").await.unwrap();
    c.auth_enable().await.unwrap();
}

pub(crate) fn with_token<T>(msg: T, token: &str) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut().insert("token", token.parse().unwrap());
    r
}

pub(crate) async fn raw_token(endpoint: &str, user: &str, password: &str) -> String {
    let mut auth = pb::auth_client::AuthClient::new(connect_channel(endpoint).await);
    auth.authenticate(pb::AuthenticateRequest {
        name: user.into(),
        password: password.into(),
    })
    .await
    .unwrap()
    .into_inner()
    .token
}

pub(crate) async fn raw_get(
    endpoint: &str,
    token: &str,
    key: &str,
) -> Result<pb::RangeResponse, tonic::Status> {
    let mut kv = KvClient::new(connect_channel(endpoint).await);
    let req = pb::RangeRequest {
        key: key.as_bytes().to_vec().into(),
        ..Default::default()
    };
    kv.range(with_token(req, token))
        .await
        .map(|r| r.into_inner())
}

/// AuthStatus, as root (`pw`, [`set_up`]'s) once auth is enabled: etcd
/// answers it only to root then.
pub(crate) async fn auth_status(endpoint: &str) -> pb::AuthStatusResponse {
    let mut auth = pb::auth_client::AuthClient::new(connect_channel(endpoint).await);
    match auth.auth_status(pb::AuthStatusRequest {}).await {
        Ok(r) => r.into_inner(),
        Err(s) if s.message() == "etcdserver: user name is empty" => {
            let token = raw_token(endpoint, "root", "pw").await;
            auth.auth_status(with_token(pb::AuthStatusRequest {}, &token))
                .await
                .unwrap()
                .into_inner()
        }
        Err(s) => panic!("auth status: {s:?}"),
    }
}

#[tokio::test]
async fn enable_without_root_fails_as_in_etcd() {
    let ephd = Ephd::start(FAST);
    let mut c = ephd.client().await;
    let e = c.auth_enable().await.unwrap_err();
    assert_eq!(
        status_of(e),
        (
            tonic::Code::FailedPrecondition,
            "etcdserver: root user does not exist".to_string()
        )
    );
    c.user_add("root", "pw", None).await.unwrap();
    let e = c.auth_enable().await.unwrap_err();
    assert_eq!(
        status_of(e).1,
        "etcdserver: root user does not have root role"
    );
    assert!(!auth_status(&ephd.endpoint()).await.enabled);
}

#[tokio::test]
async fn users_roles_and_permissions_are_enforced() {
    let ephd = Ephd::start(FAST);
    let ep = ephd.endpoint();
    let mut admin = ephd.client().await;
    let before = auth_status(&ep).await.auth_revision;
    set_up(&mut admin).await;
    let status = auth_status(&ep).await;
    assert!(status.enabled);
    assert_eq!(
        status.auth_revision,
        before + 6,
        "one revision per change, enabling aside"
    );

    // Without credentials nothing passes.
    let e = admin.put("/app/x", "1", None).await.unwrap_err();
    assert_eq!(
        status_of(e),
        (
            tonic::Code::InvalidArgument,
            "etcdserver: user name is empty".to_string()
        )
    );
    // Wrong password.
    let e = client_as(&ep, "u1", "bad")
        .await
        .err()
        .expect("wrong password refused");
    assert_eq!(
        status_of(e).1,
        "etcdserver: authentication failed, invalid user ID or password"
    );

    let mut u1 = client_as(&ep, "u1", "p").await.unwrap();
    u1.put("/app/x", "1", None).await.unwrap();
    assert_eq!(u1.get("/app/x", None).await.unwrap().kvs()[0].value(), b"1");
    let e = u1.put("/other", "1", None).await.unwrap_err();
    assert_eq!(
        status_of(e),
        (
            tonic::Code::PermissionDenied,
            "etcdserver: permission denied".to_string()
        )
    );
    let e = u1
        .get("/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap_err();
    assert_eq!(status_of(e).0, tonic::Code::PermissionDenied);
    let e = u1.user_list().await.unwrap_err();
    assert_eq!(status_of(e).0, tonic::Code::PermissionDenied);
    // A user reads its own roles and the roles it has.
    assert_eq!(
        u1.user_get("u1").await.unwrap().roles(),
        ["app".to_string()]
    );
    let perms = u1.role_get("app").await.unwrap();
    assert_eq!(
        perms.permissions()[0].get_type(),
        PermissionType::Readwrite as i32
    );
    assert_eq!(perms.permissions()[0].key(), b"/app/");

    let mut root = client_as(&ep, "root", "pw").await.unwrap();
    root.put("/other", "by root", None).await.unwrap();
    let e = root.user_delete("root").await.unwrap_err();
    assert_eq!(status_of(e).1, "etcdserver: invalid auth management");
    let mut users = root.user_list().await.unwrap().users().to_vec();
    users.sort();
    assert_eq!(users, ["root", "u1"]);

    // Revoking the permission takes effect at once.
    root.role_revoke_permission(
        "app",
        "/app/",
        Some(etcd_client::RoleRevokePermissionOptions::new().with_prefix()),
    )
    .await
    .unwrap();
    let e = u1.put("/app/x", "2", None).await.unwrap_err();
    assert_eq!(status_of(e).0, tonic::Code::PermissionDenied);
}

#[tokio::test]
async fn tokens_die_with_disable_and_clients_refresh_them() {
    let ephd = Ephd::start(FAST);
    let ep = ephd.endpoint();
    set_up(&mut ephd.client().await).await;
    let token = raw_token(&ep, "root", "pw").await;
    raw_get(&ep, &token, "k").await.unwrap();
    let mut root = client_as(&ep, "root", "pw").await.unwrap();
    root.auth_disable().await.unwrap();
    // While auth is off a token is not looked at (etcd 3.6).
    raw_get(&ep, &token, "k")
        .await
        .expect("a token is ignored while auth is off");
    // Enabled again, the old token stays dead and clients authenticate anew.
    ephd.client().await.auth_enable().await.unwrap();
    assert_eq!(
        raw_get(&ep, &token, "k").await.unwrap_err().code(),
        tonic::Code::Unauthenticated
    );
    root.put("k", "v", None)
        .await
        .expect("etcd-client re-authenticates on an invalid token");
}

#[tokio::test]
async fn tokens_lapse_after_the_ttl() {
    let ephd = Ephd::start(&["--bcrypt-cost", "4", "--auth-token-ttl", "1"]);
    let ep = ephd.endpoint();
    set_up(&mut ephd.client().await).await;
    let token = raw_token(&ep, "u1", "p").await;
    raw_get(&ep, &token, "/app/k").await.unwrap();
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let e = raw_get(&ep, &token, "/app/k").await.unwrap_err();
    assert_eq!(e.message(), "etcdserver: invalid auth token");
}

#[tokio::test]
async fn a_token_from_one_member_works_on_the_others() {
    let cluster = EphdCluster::start(3, FAST);
    let members: Vec<String> = cluster
        .running()
        .iter()
        .map(|(_, m)| m.endpoint())
        .collect();
    let mut first = connect_with_retry(&members[0]).await;
    set_up(&mut first).await;
    let token = raw_token(&members[0], "u1", "p").await;
    let mut kv = KvClient::new(connect_channel(&members[1]).await);
    let put = pb::PutRequest {
        key: b"/app/replicated".to_vec().into(),
        value: b"v".to_vec().into(),
        ..Default::default()
    };
    kv.put(with_token(put, &token))
        .await
        .expect("token valid on another member");
    let outside = pb::PutRequest {
        key: b"/nope".to_vec().into(),
        ..Default::default()
    };
    let e = kv.put(with_token(outside, &token)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    let status = raw_get(&members[2], &token, "/app/replicated")
        .await
        .unwrap();
    assert_eq!(status.kvs.len(), 1);
}

/// A cluster member answers once it has a leader; retry the first call.
pub(crate) async fn connect_with_retry(endpoint: &str) -> Client {
    for _ in 0..50 {
        let mut c = crate::harness::connect_client(endpoint).await;
        if c.put("probe", "", None).await.is_ok() {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("cluster at {endpoint} never accepted a write");
}

/// etcdctl's auth commands, run against stock etcd and ephd: same exit
/// codes and output.
#[test]
fn etcdctl_user_commands_match_stock_etcd() {
    let etcd = StockEtcd::start_with(FAST);
    let ephd = Ephd::start(FAST);
    let script: &[&[&str]] = &[
        &["user", "add", "root", "--new-user-password=pw"],
        &["user", "add", "u1", "--new-user-password=p"],
        &["role", "add", "app"],
        &[
            "role",
            "grant-permission",
            "app",
            "readwrite",
            "/app/",
            "--prefix",
        ],
        &["role", "grant-permission", "app", "read", "k1"],
        &["user", "grant-role", "u1", "app"],
        &["auth", "enable"],
        &["put", "k", "v"],
        &["--user", "root:pw", "put", "k", "v"],
        &["--user", "root:pw", "get", "k"],
        &["--user", "u1:p", "put", "/app/a", "1"],
        &["--user", "u1:p", "put", "/b", "1"],
        &["--user", "u1:p", "get", "/app/", "--prefix"],
        &["--user", "u1:bad", "get", "k1"],
        &["--user", "root:pw", "role", "get", "app"],
        &["--user", "root:pw", "user", "get", "u1"],
        &["--user", "root:pw", "user", "list"],
        &["--user", "root:pw", "role", "list"],
        &["--user", "u1:p", "user", "list"],
        &["--user", "root:pw", "user", "delete", "root"],
        &[
            "--user",
            "root:pw",
            "role",
            "revoke-permission",
            "app",
            "k1",
        ],
        &["--user", "root:pw", "user", "revoke-role", "u1", "app"],
        &["--user", "root:pw", "auth", "disable"],
        &["get", "k"],
    ];
    let run = |endpoint: String| {
        script
            .iter()
            .map(|args| {
                let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
                let out = cli::run(&endpoint, &args, None);
                let stderr: String = out
                    .stderr
                    .lines()
                    .filter(|l| !l.starts_with("{\"level\":"))
                    .collect::<Vec<_>>()
                    .join("\n");
                format!(
                    "etcdctl {}: {:?} {:?} {:?}",
                    args.join(" "),
                    out.code,
                    out.stdout,
                    stderr
                )
            })
            .collect::<Vec<_>>()
    };
    let (want, got) = std::thread::scope(|s| {
        let w = s.spawn(|| run(etcd.endpoint()));
        let g = run(ephd.endpoint());
        (w.join().unwrap(), g)
    });
    let diffs: Vec<String> = want
        .iter()
        .zip(&got)
        .filter(|(w, g)| w != g)
        .map(|(w, g)| format!("  etcd: {w}\n  ephd: {g}"))
        .collect();
    assert!(diffs.is_empty(), "etcdctl differs:\n{}", diffs.join("\n"));
    assert!(
        got.iter().any(|l| l.contains("permission denied")),
        "{got:#?}"
    );
}
