//! Auth side by side: one scripted sequence of Auth, KV, Lease, Watch and
//! Maintenance calls, made with the raw generated clients against stock
//! etcd and against ephd; every step's gRPC code and message (or the
//! response's meaningful fields) must be the same.

mod helpers;

use crate::harness::{Ephd, Server, StockEtcd};
use ephd::proto::authpb;
use ephd::proto::etcdserverpb as pb;
use helpers::*;

/// The script; `s` carries no token.
async fn script(s: Session) -> Vec<String> {
    use authpb::permission::Type::{Read, Readwrite, Write};
    let mut out = Vec::new();
    macro_rules! step {
        ($name:expr, $call:expr, $ok:expr) => {
            out.push(format!("{}: {}", $name, shown($call.await, $ok)))
        };
    }
    let a = || s.auth();
    authenticate(&s, "root", "pw", &mut out).await;
    step!(
        "enable without root",
        a().auth_enable(s.req(pb::AuthEnableRequest {})),
        done
    );
    step!(
        "user add empty",
        a().user_add(s.req(user_add("", "x"))),
        done
    );
    step!(
        "user add root",
        a().user_add(s.req(user_add("root", "pw"))),
        done
    );
    step!(
        "enable without role",
        a().auth_enable(s.req(pb::AuthEnableRequest {})),
        done
    );
    step!(
        "role add empty",
        a().role_add(s.req(pb::AuthRoleAddRequest { name: "".into() })),
        done
    );
    let grant = |u: &str, r: &str| pb::AuthUserGrantRoleRequest {
        user: u.into(),
        role: r.into(),
    };
    step!(
        "grant root before the role exists",
        a().user_grant_role(s.req(grant("root", "root"))),
        done
    );
    step!(
        "role add root",
        a().role_add(s.req(pb::AuthRoleAddRequest {
            name: "root".into()
        })),
        done
    );
    step!(
        "user add u1",
        a().user_add(s.req(user_add("u1", "p"))),
        done
    );
    step!(
        "user add u1 again",
        a().user_add(s.req(user_add("u1", "p"))),
        done
    );
    let np = pb::AuthUserAddRequest {
        name: "np".into(),
        options: Some(authpb::UserAddOptions { no_password: true }),
        ..Default::default()
    };
    step!("user add no password", a().user_add(s.req(np)), done);
    step!(
        "user add empty password",
        a().user_add(s.req(user_add("ep", ""))),
        done
    );
    step!(
        "role add r1",
        a().role_add(s.req(pb::AuthRoleAddRequest { name: "r1".into() })),
        done
    );
    step!(
        "role add r1 again",
        a().role_add(s.req(pb::AuthRoleAddRequest { name: "r1".into() })),
        done
    );
    let gp = |role: &str, p| pb::AuthRoleGrantPermissionRequest {
        name: role.into(),
        perm: p,
    };
    step!(
        "grant prefix",
        a().role_grant_permission(s.req(gp("r1", perm(Readwrite, "/a/", "/a0")))),
        done
    );
    step!(
        "grant key",
        a().role_grant_permission(s.req(gp("r1", perm(Read, "k1", "")))),
        done
    );
    step!(
        "grant range",
        a().role_grant_permission(s.req(gp("r1", perm(Write, "k2", "k5")))),
        done
    );
    step!(
        "grant again",
        a().role_grant_permission(s.req(gp("r1", perm(Readwrite, "k2", "k5")))),
        done
    );
    step!(
        "grant to unknown role",
        a().role_grant_permission(s.req(gp("nope", perm(Read, "x", "")))),
        done
    );
    // (A grant without a permission crashes etcd 3.4; ephd answers etcd
    // 3.5's "permission not given", see the unit tests.)
    let role_get = |r: &str| pb::AuthRoleGetRequest { role: r.into() };
    let perms = |r: pb::AuthRoleGetResponse| format!("{:?}", r.perm);
    step!("role get r1", a().role_get(s.req(role_get("r1"))), perms);
    step!(
        "role get nope",
        a().role_get(s.req(role_get("nope"))),
        perms
    );
    step!(
        "grant u1 r1",
        a().user_grant_role(s.req(grant("u1", "r1"))),
        done
    );
    step!(
        "grant u1 r1 again",
        a().user_grant_role(s.req(grant("u1", "r1"))),
        done
    );
    step!(
        "grant unknown role",
        a().user_grant_role(s.req(grant("u1", "nope"))),
        done
    );
    step!(
        "grant to unknown user",
        a().user_grant_role(s.req(grant("nope", "r1"))),
        done
    );
    let revoke = |u: &str, r: &str| pb::AuthUserRevokeRoleRequest {
        name: u.into(),
        role: r.into(),
    };
    step!(
        "revoke ungranted role",
        a().user_revoke_role(s.req(revoke("u1", "rX"))),
        done
    );
    step!(
        "revoke from unknown user",
        a().user_revoke_role(s.req(revoke("nope", "r1"))),
        done
    );
    let rp = |r: &str, k: &str, e: &str| pb::AuthRoleRevokePermissionRequest {
        role: r.into(),
        key: k.as_bytes().to_vec().into(),
        range_end: e.as_bytes().to_vec().into(),
    };
    step!(
        "revoke unknown perm",
        a().role_revoke_permission(s.req(rp("r1", "zz", ""))),
        done
    );
    step!(
        "revoke perm of unknown role",
        a().role_revoke_permission(s.req(rp("nope", "k1", ""))),
        done
    );
    let user_get = |u: &str| pb::AuthUserGetRequest { name: u.into() };
    let roles = |r: pb::AuthUserGetResponse| format!("{:?}", r.roles);
    step!("user get u1", a().user_get(s.req(user_get("u1"))), roles);
    step!(
        "user get nope",
        a().user_get(s.req(user_get("nope"))),
        roles
    );
    step!(
        "user list",
        a().user_list(s.req(pb::AuthUserListRequest {})),
        |r| format!("{:?}", r.users)
    );
    step!(
        "role list",
        a().role_list(s.req(pb::AuthRoleListRequest {})),
        |r| format!("{:?}", r.roles)
    );
    let pw = |u: &str, p: &str| pb::AuthUserChangePasswordRequest {
        name: u.into(),
        password: p.into(),
        ..Default::default()
    };
    step!(
        "password of unknown user",
        a().user_change_password(s.req(pw("nope", "x"))),
        done
    );
    step!(
        "enable",
        a().auth_enable(s.req(pb::AuthEnableRequest {})),
        done
    );
    step!(
        "enable again",
        a().auth_enable(s.req(pb::AuthEnableRequest {})),
        done
    );

    // Enabled: no token.
    step!("put without token", s.kv().put(s.req(put("x", 0))), done);
    step!(
        "range without token",
        s.kv().range(s.req(range("x", ""))),
        keys
    );
    step!(
        "user list without token",
        a().user_list(s.req(pb::AuthUserListRequest {})),
        |r| format!("{:?}", r.users)
    );
    step!(
        "auth status without token",
        a().auth_status(s.req(pb::AuthStatusRequest {})),
        |r| format!("enabled {}", r.enabled)
    );
    step!(
        "status without token",
        s.maint().status(s.req(pb::StatusRequest {})),
        done
    );
    step!(
        "alarm list without token",
        s.maint().alarm(s.req(pb::AlarmRequest::default())),
        |r| format!("{:?}", r.alarms)
    );
    step!(
        "grant without token",
        a().user_grant_role(s.req(grant("u1", "r1"))),
        done
    );
    authenticate(&s, "u1", "bad", &mut out).await;
    authenticate(&s, "nobody", "p", &mut out).await;
    authenticate(&s, "np", "", &mut out).await;
    authenticate(&s, "", "", &mut out).await;
    let bad = s.with_token(Some("nonsense.1".into()));
    step!(
        "range with an unknown token",
        bad.kv().range(bad.req(range("x", ""))),
        keys
    );
    step!(
        "put with an unknown token",
        bad.kv().put(bad.req(put("x", 0))),
        done
    );

    // u1.
    let u1 = s.with_token(authenticate(&s, "u1", "p", &mut out).await);
    step!(
        "u1 status",
        u1.maint().status(u1.req(pb::StatusRequest {})),
        done
    );
    step!(
        "u1 alarm list",
        u1.maint().alarm(u1.req(pb::AlarmRequest::default())),
        |r| format!("{:?}", r.alarms)
    );
    step!(
        "u1 alarm raise",
        u1.maint().alarm(u1.req(pb::AlarmRequest {
            action: 1,
            member_id: 0,
            alarm: 1,
        })),
        |r| format!("{:?}", r.alarms)
    );
    step!(
        "u1 put in prefix",
        u1.kv().put(u1.req(put("/a/x", 0))),
        done
    );
    step!("u1 put outside", u1.kv().put(u1.req(put("/b", 0))), done);
    step!(
        "u1 put read-only key",
        u1.kv().put(u1.req(put("k1", 0))),
        done
    );
    step!(
        "u1 put in write range",
        u1.kv().put(u1.req(put("k3", 0))),
        done
    );
    step!("u1 get key", u1.kv().range(u1.req(range("k1", ""))), keys);
    step!(
        "u1 get range beyond key",
        u1.kv().range(u1.req(range("k1", "k3"))),
        keys
    );
    step!(
        "u1 get prefix",
        u1.kv().range(u1.req(range("/a/", "/a0"))),
        keys
    );
    step!(
        "u1 get everything",
        u1.kv().range(u1.req(range("\0", "\0"))),
        keys
    );
    let del = |k: &str, e: &str, prev| pb::DeleteRangeRequest {
        key: k.as_bytes().to_vec().into(),
        range_end: e.as_bytes().to_vec().into(),
        prev_kv: prev,
    };
    step!(
        "u1 delete outside",
        u1.kv().delete_range(u1.req(del("/b", "", false))),
        done
    );
    step!(
        "u1 delete write-only range with prev",
        u1.kv().delete_range(u1.req(del("k3", "", true))),
        done
    );
    let cmp = |k: &str| pb::Compare {
        key: k.as_bytes().to_vec().into(),
        target: pb::compare::CompareTarget::Version as i32,
        result: pb::compare::CompareResult::Equal as i32,
        target_union: Some(pb::compare::TargetUnion::Version(0)),
        ..Default::default()
    };
    let op_put = |k: &str| pb::RequestOp {
        request: Some(pb::request_op::Request::RequestPut(put(k, 0))),
    };
    let txn = |c: &str, then: &str, otherwise: &str| pb::TxnRequest {
        compare: vec![cmp(c)],
        success: vec![op_put(then)],
        failure: vec![op_put(otherwise)],
    };
    let succeeded = |t: pb::TxnResponse| format!("succeeded={}", t.succeeded);
    step!(
        "u1 txn inside",
        u1.kv().txn(u1.req(txn("/a/c", "/a/d", "/a/e"))),
        succeeded
    );
    step!(
        "u1 txn compare outside",
        u1.kv().txn(u1.req(txn("/b", "/a/d", "/a/e"))),
        succeeded
    );
    step!(
        "u1 txn failure branch outside",
        u1.kv().txn(u1.req(txn("/a/c", "/a/d", "/b"))),
        succeeded
    );
    let grant_lease = pb::LeaseGrantRequest {
        ttl: 60,
        id: 0x1234,
    };
    step!(
        "u1 lease grant",
        u1.lease().lease_grant(u1.req(grant_lease)),
        |r| format!("id={:x}", r.id)
    );
    step!(
        "u1 put with lease",
        u1.kv().put(u1.req(put("/a/l", 0x1234))),
        done
    );
    step!(
        "u1 user list",
        a().user_list(u1.req(pb::AuthUserListRequest {})),
        |r| format!("{:?}", r.users)
    );
    step!(
        "u1 user get self",
        a().user_get(u1.req(user_get("u1"))),
        roles
    );
    step!(
        "u1 user get root",
        a().user_get(u1.req(user_get("root"))),
        roles
    );
    step!(
        "u1 role get own",
        a().role_get(u1.req(role_get("r1"))),
        perms
    );
    step!(
        "u1 role get root",
        a().role_get(u1.req(role_get("root"))),
        perms
    );
    step!(
        "u1 role add",
        a().role_add(u1.req(pb::AuthRoleAddRequest { name: "r9".into() })),
        done
    );
    step!(
        "u1 disable",
        a().auth_disable(u1.req(pb::AuthDisableRequest {})),
        done
    );
    step!(
        "u1 hash kv",
        u1.maint()
            .hash_kv(u1.req(pb::HashKvRequest { revision: 0 })),
        done
    );
    step!(
        "u1 status",
        u1.maint().status(u1.req(pb::StatusRequest {})),
        done
    );
    step!(
        "u1 watch outside",
        async { Ok::<_, tonic::Status>(tonic::Response::new(watch_once(&u1, "/b", "").await)) },
        |w| w
    );
    step!(
        "u1 watch prefix",
        async { Ok::<_, tonic::Status>(tonic::Response::new(watch_once(&u1, "/a/", "/a0").await)) },
        |w| w
    );

    // root.
    let root = s.with_token(authenticate(&s, "root", "pw", &mut out).await);
    step!(
        "auth status",
        a().auth_status(root.req(pb::AuthStatusRequest {})),
        |r| format!("enabled {} auth revision {}", r.enabled, r.auth_revision)
    );
    step!(
        "root put anywhere",
        root.kv().put(root.req(put("/b", 0x1234))),
        done
    );
    step!(
        "u1 revoke lease with a key outside",
        u1.lease()
            .lease_revoke(u1.req(pb::LeaseRevokeRequest { id: 0x1234 })),
        done
    );
    step!(
        "root delete root",
        a().user_delete(root.req(pb::AuthUserDeleteRequest {
            name: "root".into()
        })),
        done
    );
    step!(
        "root delete root role",
        a().role_delete(root.req(pb::AuthRoleDeleteRequest {
            role: "root".into()
        })),
        done
    );
    step!(
        "root revoke root from root",
        a().user_revoke_role(root.req(revoke("root", "root"))),
        done
    );
    step!(
        "root hash kv",
        root.maint()
            .hash_kv(root.req(pb::HashKvRequest { revision: 0 })),
        done
    );
    step!(
        "root user list",
        a().user_list(root.req(pb::AuthUserListRequest {})),
        |r| format!("{:?}", r.users)
    );
    step!(
        "root changes u1's password",
        a().user_change_password(root.req(pw("u1", "q"))),
        done
    );
    step!(
        "u1's old token",
        u1.kv().range(u1.req(range("k1", ""))),
        keys
    );
    let u1 = s.with_token(authenticate(&s, "u1", "q", &mut out).await);
    step!(
        "u1 revoke own lease",
        u1.lease()
            .lease_revoke(u1.req(pb::LeaseRevokeRequest { id: 0x1234 })),
        done
    );
    step!(
        "root revokes r1 from u1",
        a().user_revoke_role(root.req(revoke("u1", "r1"))),
        done
    );
    step!(
        "u1 after losing r1",
        u1.kv().put(u1.req(put("/a/x", 0))),
        done
    );
    step!(
        "root deletes a permission",
        a().role_revoke_permission(root.req(rp("r1", "k1", ""))),
        done
    );
    step!(
        "root deletes r1",
        a().role_delete(root.req(pb::AuthRoleDeleteRequest { role: "r1".into() })),
        done
    );
    step!(
        "root disable",
        a().auth_disable(root.req(pb::AuthDisableRequest {})),
        done
    );
    step!(
        "root's token after disable",
        root.kv().range(root.req(range("x", ""))),
        keys
    );
    step!(
        "no token after disable",
        s.kv().put(s.req(put("x", 0))),
        done
    );
    step!(
        "disable again",
        a().auth_disable(s.req(pb::AuthDisableRequest {})),
        done
    );
    authenticate(&s, "root", "pw", &mut out).await;
    step!(
        "delete root while disabled",
        a().user_delete(s.req(pb::AuthUserDeleteRequest {
            name: "root".into()
        })),
        done
    );
    step!(
        "user list at the end",
        a().user_list(s.req(pb::AuthUserListRequest {})),
        |r| format!("{:?}", r.users)
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_answers_match_stock_etcd() {
    let etcd = StockEtcd::start_with(&["--bcrypt-cost", "4"]);
    let ephd = Ephd::start(&["--bcrypt-cost", "4", "--etcd-compat"]);
    let (want, got) = tokio::join!(
        async {
            script(Session {
                ch: etcd.channel().await,
                token: None,
            })
            .await
        },
        async {
            script(Session {
                ch: ephd.channel().await,
                token: None,
            })
            .await
        }
    );
    let diffs: Vec<String> = want
        .iter()
        .zip(&got)
        .filter(|(w, g)| w != g)
        .map(|(w, g)| format!("  etcd: {w}\n  ephd: {g}"))
        .collect();
    assert_eq!(want.len(), got.len());
    assert!(
        diffs.is_empty(),
        "{} of {} steps differ:\n{}\n\nfull etcd run:\n{}",
        diffs.len(),
        want.len(),
        diffs.join("\n"),
        want.join("\n")
    );
    // The script reached its enforcement steps on both.
    assert!(
        want.iter()
            .any(|l| l.contains("u1 put outside: PermissionDenied")),
        "{want:#?}"
    );
}
