//! Users, roles and the enabled flag outlive the process like the keys do:
//! a restart from `--data-dir` and a restore of an `etcdctl snapshot save`
//! file bring them back (auth stays enabled, passwords and permissions
//! hold), while tokens do not survive (clients authenticate again, as
//! after an etcd restart).

use std::path::Path;
use std::time::Duration;

use crate::auth::{auth_status, client_as, raw_get, raw_token, status_of};
use crate::cli;
use crate::harness::{connect_client, Ephd, Server};

const FAST: &[&str] = &["--bcrypt-cost", "4"];

fn arg(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_string()
}

/// root (password `pw`), u1 (password `p`) with read-write on `/app/`,
/// auth enabled; a key written by u1.
async fn set_up(endpoint: &str) {
    let mut c = connect_client(endpoint).await;
    crate::auth::set_up(&mut c).await;
    let mut u1 = client_as(endpoint, "u1", "p").await.unwrap();
    u1.put("/app/k", "v", None).await.unwrap();
}

/// What a server that came back with the auth state of [`set_up`] answers.
async fn assert_auth_came_back(endpoint: &str, old_token: &str, auth_revision: u64) {
    let status = auth_status(endpoint).await;
    assert!(status.enabled, "auth still enabled");
    assert_eq!(status.auth_revision, auth_revision, "auth revision kept");
    // Without credentials: refused, as by any auth-enabled etcd.
    let mut anonymous = connect_client(endpoint).await;
    let (code, msg) = status_of(anonymous.put("/app/k", "x", None).await.unwrap_err());
    assert_eq!(
        (code, msg.as_str()),
        (
            tonic::Code::InvalidArgument,
            "etcdserver: user name is empty"
        )
    );
    // The old token is gone; the passwords and permissions are not.
    let e = raw_get(endpoint, old_token, "/app/k").await.unwrap_err();
    assert_eq!(e.message(), "etcdserver: invalid auth token");
    assert!(client_as(endpoint, "u1", "wrong").await.is_err());
    let mut u1 = client_as(endpoint, "u1", "p").await.unwrap();
    let got = u1.get("/app/k", None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"v");
    u1.put("/app/k2", "v2", None).await.unwrap();
    let (code, _) = status_of(u1.put("/other", "x", None).await.unwrap_err());
    assert_eq!(code, tonic::Code::PermissionDenied);
    let mut root = client_as(endpoint, "root", "pw").await.unwrap();
    let users = root.user_list().await.unwrap();
    assert_eq!(users.users(), ["root".to_string(), "u1".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_roles_and_the_enabled_flag_survive_a_restart_from_the_data_dir() {
    let dir = tempfile::tempdir().expect("data dir");
    let data = arg(dir.path());
    let mut args = FAST.to_vec();
    args.extend(["--data-dir", &data]);
    let mut first = Ephd::start(&args);
    set_up(&first.endpoint()).await;
    let token = raw_token(&first.endpoint(), "u1", "p").await;
    let auth_revision = auth_status(&first.endpoint()).await.auth_revision;
    // SIGTERM: ephd writes its last snapshot and exits.
    assert!(
        first.terminate(Duration::from_secs(15)),
        "ephd did not stop cleanly:\n{}",
        first.logs()
    );
    drop(first);

    let second = Ephd::start(&args);
    assert_auth_came_back(&second.endpoint(), &token, auth_revision).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_snapshot_restores_users_roles_and_the_enabled_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("backup.db");
    let source = Ephd::start(FAST);
    set_up(&source.endpoint()).await;
    let token = raw_token(&source.endpoint(), "u1", "p").await;
    let auth_revision = auth_status(&source.endpoint()).await.auth_revision;
    // Only root may take a snapshot once auth is on, as in etcd.
    let save = |user: Option<&str>| {
        let mut args = vec!["snapshot".to_string(), "save".to_string(), arg(&file)];
        if let Some(u) = user {
            args.push(format!("--user={u}"));
        }
        cli::run(&source.endpoint(), &args, None)
    };
    let refused = save(Some("u1:p"));
    assert_ne!(
        refused.code,
        Some(0),
        "u1 may not take a snapshot: {refused:?}"
    );
    assert!(refused.stderr.contains("permission denied"), "{refused:?}");
    let saved = save(Some("root:pw"));
    assert_eq!(saved.code, Some(0), "etcdctl snapshot save: {saved:?}");

    let restored = Ephd::start(&[FAST[0], FAST[1], "--restore-snapshot", &arg(&file)]);
    assert_auth_came_back(&restored.endpoint(), &token, auth_revision).await;
}
