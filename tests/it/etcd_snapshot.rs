//! etcd's snapshot format both ways, side by side with stock etcd: a
//! snapshot `etcdctl snapshot save` takes from ephd is checked by
//! `etcdutl snapshot status` and restored by `etcdutl snapshot restore`
//! into a stock etcd that serves the same keys, revisions, leases, users
//! and roles; a snapshot of a stock etcd (or its data dir's database)
//! restores into ephd the same way (from etcd 3.4, 3.6 and 3.7); and the
//! round trips through both keep everything.

use crate::auth::client_as;
use crate::harness::{Ephd, Server, StockEtcd};
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, LeaseGrantOptions, Permission, Txn, TxnOp,
};
use std::path::{Path, PathBuf};
use std::process::Command;

const FAST: &str = "--bcrypt-cost=4";

/// The same history on any server: puts, overwrites, a delete, one txn
/// writing two keys, a key on a lease, users and roles, auth enabled, and
/// a last delete so the revision is above every key's.
async fn fill(c: &mut Client) {
    for i in 0..20 {
        c.put(format!("/app/k{i:02}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    c.put("/app/k01", "again", None).await.unwrap();
    c.put("/app/k01", "and again", None).await.unwrap();
    c.delete("/app/k02", None).await.unwrap();
    c.txn(
        Txn::new()
            .when([Compare::version("/txn/a", CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put("/txn/a", "1", None),
                TxnOp::put("/txn/b", "2", None),
            ]),
    )
    .await
    .unwrap();
    c.lease_grant(600, Some(LeaseGrantOptions::new().with_id(0x4c45)))
        .await
        .unwrap();
    c.put(
        "/leased",
        "x",
        Some(etcd_client::PutOptions::new().with_lease(0x4c45)),
    )
    .await
    .unwrap();
    c.put("/gone", "soon", None).await.unwrap();
    c.delete("/gone", None).await.unwrap();
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

/// Everything a restore must keep, as text: the revision, every key with
/// its revisions, version, value and lease, the leases with their granted
/// TTLs, users with their roles, roles with their permissions, and whether
/// u1's password still works.
async fn state(endpoint: &str) -> String {
    let mut c = client_as(endpoint, "root", "pw").await.unwrap();
    let mut out = Vec::new();
    let all = c
        .get("\0", Some(GetOptions::new().with_from_key()))
        .await
        .unwrap();
    out.push(format!("revision {}", all.header().unwrap().revision()));
    for kv in all.kvs() {
        out.push(format!(
            "{} = {} create {} mod {} version {} lease {:x}",
            kv.key_str().unwrap(),
            kv.value_str().unwrap(),
            kv.create_revision(),
            kv.mod_revision(),
            kv.version(),
            kv.lease()
        ));
    }
    for lease in c.leases().await.unwrap().leases() {
        let ttl = c.lease_time_to_live(lease.id(), None).await.unwrap();
        assert!(
            ttl.ttl() > 0 && ttl.ttl() <= ttl.granted_ttl(),
            "lease {:x}: {} of {}",
            lease.id(),
            ttl.ttl(),
            ttl.granted_ttl()
        );
        out.push(format!(
            "lease {:x} granted {}",
            lease.id(),
            ttl.granted_ttl()
        ));
    }
    for user in c.user_list().await.unwrap().users() {
        let roles = c.user_get(user.as_str()).await.unwrap().roles().to_vec();
        out.push(format!("user {user} roles {roles:?}"));
    }
    for role in c.role_list().await.unwrap().roles() {
        let perms: Vec<String> = c
            .role_get(role.as_str())
            .await
            .unwrap()
            .permissions()
            .iter()
            .map(|p| format!("{:?} {:?}..{:?}", p.get_type(), p.key(), p.range_end()))
            .collect();
        out.push(format!("role {role} {perms:?}"));
    }
    let anonymous = crate::harness::connect_client(endpoint)
        .await
        .get("/app/k00", None)
        .await;
    out.push(format!(
        "without a user: {:?}",
        anonymous.map(drop).map_err(crate::auth::status_of)
    ));
    let u1 = client_as(endpoint, "u1", "p").await;
    out.push(format!("u1 logs in {}", u1.is_ok()));
    out.join("\n")
}

fn save(endpoint: &str, file: &Path) {
    let out = crate::cli::run(
        endpoint,
        &[
            "--user=root:pw".to_string(),
            "snapshot".to_string(),
            "save".to_string(),
            file.display().to_string(),
        ],
        None,
    );
    assert_eq!(out.code, Some(0), "etcdctl snapshot save: {out:?}");
}

fn etcdutl(args: &[&str]) -> String {
    let out = Command::new(crate::references::binary("etcdutl-3.6"))
        .args(args)
        .output()
        .expect("run etcdutl");
    assert!(out.status.success(), "etcdutl {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn restored_ephd(file: &Path) -> Ephd {
    let file = file.display().to_string();
    Ephd::start(&["--etcd-compat", FAST, "--restore-snapshot", &file])
}

async fn etcd_with_history() -> StockEtcd {
    let etcd = StockEtcd::start();
    fill(&mut etcd.client().await).await;
    etcd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_ephd_restores_into_stock_etcd_with_everything() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ephd.db");
    let ephd = Ephd::start(&["--etcd-compat", FAST]);
    fill(&mut ephd.client().await).await;
    let before = state(&ephd.endpoint()).await;
    save(&ephd.endpoint(), &file);

    let status = etcdutl(&[
        "snapshot",
        "status",
        &file.display().to_string(),
        "-w",
        "json",
    ]);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["totalKey"], 22, "{status}");
    assert_eq!(status["version"], "3.6.0", "{status}");

    let etcd = StockEtcd::start_from_snapshot(&file);
    assert_eq!(state(&etcd.endpoint()).await, before);
    // And it goes on from there as etcd does.
    let mut c = client_as(&etcd.endpoint(), "root", "pw").await.unwrap();
    let next = c.put("/after", "x", None).await.unwrap();
    let rev = |s: &str| s.lines().next().unwrap().to_string();
    assert_eq!(
        format!("revision {}", next.header().unwrap().revision() - 1),
        rev(&before)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_stock_etcd_or_its_data_dir_restores_into_ephd() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("etcd.db");
    let mut etcd = etcd_with_history().await;
    let before = state(&etcd.endpoint()).await;
    save(&etcd.endpoint(), &file);
    let ephd = restored_ephd(&file);
    assert_eq!(state(&ephd.endpoint()).await, before);

    // The database in a stopped etcd's data dir, without a checksum.
    let db: PathBuf = etcd.stop().join("member/snap/db");
    let copy = dir.path().join("member-snap-db");
    std::fs::copy(&db, &copy).unwrap();
    let from_dir = restored_ephd(&copy);
    assert_eq!(state(&from_dir.endpoint()).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_through_etcd_and_ephd_keep_everything() {
    let dir = tempfile::tempdir().unwrap();
    // etcd -> ephd -> etcd.
    let etcd = etcd_with_history().await;
    let original = state(&etcd.endpoint()).await;
    let first = dir.path().join("1.db");
    save(&etcd.endpoint(), &first);
    let ephd = restored_ephd(&first);
    let second = dir.path().join("2.db");
    save(&ephd.endpoint(), &second);
    let back = StockEtcd::start_from_snapshot(&second);
    assert_eq!(state(&back.endpoint()).await, original);

    // ephd -> etcd -> ephd.
    let source = Ephd::start(&["--etcd-compat", FAST]);
    fill(&mut source.client().await).await;
    let original = state(&source.endpoint()).await;
    let third = dir.path().join("3.db");
    save(&source.endpoint(), &third);
    let etcd = StockEtcd::start_from_snapshot(&third);
    let fourth = dir.path().join("4.db");
    save(&etcd.endpoint(), &fourth);
    let back = restored_ephd(&fourth);
    assert_eq!(state(&back.endpoint()).await, original);
}

/// The other releases an etcd may be moved from: 3.4 (Debian's) and 3.7.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_of_etcd_34_and_37_restore_into_ephd() {
    let dir = tempfile::tempdir().unwrap();
    for (name, etcd) in [
        (
            "3.4",
            StockEtcd::start_binary(&crate::references::debian_etcd_34(), &[]),
        ),
        ("3.7", StockEtcd::start_release("etcd-3.7", &[])),
    ] {
        fill(&mut etcd.client().await).await;
        let before = state(&etcd.endpoint()).await;
        let file = dir.path().join(format!("etcd-{name}.db"));
        save(&etcd.endpoint(), &file);
        let ephd = restored_ephd(&file);
        assert_eq!(state(&ephd.endpoint()).await, before, "etcd {name}");
    }
}
