//! Maintenance, Cluster and Auth services: Status, Alarm, Defragment,
//! Hash/HashKV, MemberList, AuthStatus, and the RPCs ephd does not serve.

use ephd::proto::etcdserverpb::{auth_client::AuthClient, AuthStatusRequest};
use etcd_client::{AlarmAction, AlarmType, Client, GetOptions, Txn, TxnOp};
use tonic::Code;

use crate::harness::Server;
use crate::support::{assert_err, ephd, grpc_status, rev, within};

const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";
const FUTURE: &str = "etcdserver: mvcc: required revision is a future revision";

async fn put(c: &mut Client, key: &str, value: &str) -> i64 {
    rev(within("put", c.put(key, value, None))
        .await
        .expect("put succeeds")
        .header())
}

/// "3.6.5" → (3, 6, 5); panics on anything that is not MAJOR.MINOR.PATCH.
fn semver(v: &str) -> (u64, u64, u64) {
    let core = v.split(['-', '+']).next().unwrap();
    let parts: Vec<u64> = core
        .split('.')
        .map(|p| p.parse().unwrap_or_else(|_| panic!("bad version {v:?}")))
        .collect();
    assert_eq!(parts.len(), 3, "version {v:?} is not MAJOR.MINOR.PATCH");
    (parts[0], parts[1], parts[2])
}

#[tokio::test]
async fn status_reports_version_size_index_and_revision() {
    let server = ephd(&[]);
    let mut c = server.client().await;
    let before = within("status", c.status()).await.unwrap();
    let version = semver(before.version());
    assert!(
        version >= (3, 5, 13),
        "kube-apiserver needs >= 3.5.13 for watch progress requests, got {}",
        before.version()
    );
    let header = before.header().unwrap();
    assert_eq!(header.revision(), 1);
    assert_eq!(before.leader(), header.member_id(), "the only member leads");
    assert!(before.raft_term() >= 1);
    assert!(before.errors().is_empty());
    assert!(!before.is_learner());

    let value = "v".repeat(100);
    for i in 0..10 {
        put(&mut c, &format!("k{i}"), &value).await;
    }
    let after = within("status", c.status()).await.unwrap();
    assert_eq!(rev(after.header()), 11);
    assert!(
        after.db_size() >= 1000,
        "1000 bytes of values stored, db_size {}",
        after.db_size()
    );
    assert!(
        after.raft_index() > before.raft_index(),
        "raft index {} -> {}",
        before.raft_index(),
        after.raft_index()
    );
    assert!(after.raft_applied_index() >= before.raft_applied_index() + 10);
}

#[tokio::test]
async fn alarms_are_empty_and_defragment_succeeds() {
    let server = ephd(&[]);
    let mut c = server.client().await;
    put(&mut c, "k", "v").await;
    let alarms = within("alarm", c.alarm(AlarmAction::Get, AlarmType::None, None))
        .await
        .unwrap();
    assert!(alarms.alarms().is_empty());
    assert!(
        alarms.header().is_some(),
        "etcd 3.6's Alarm answer has a header"
    );

    let d = within("defragment", c.defragment()).await.unwrap();
    assert!(
        d.header().is_none(),
        "etcd's Defragment answer has no header"
    );
    let kvs = within("get", c.get("k", None)).await.unwrap();
    assert_eq!(kvs.kvs()[0].value(), b"v", "defragment keeps the data");
}

/// The same history on any server: puts, overwrites, deletes, a txn and a
/// compaction. Ends at revision 7, compacted at 3.
async fn feed(c: &mut Client) {
    put(c, "a", "1").await; // r2
    put(c, "b", "2").await; // r3
    put(c, "a", "3").await; // r4
    within("delete", c.delete("b", None)).await.unwrap(); // r5
    within(
        "txn",
        c.txn(Txn::new().and_then([TxnOp::put("c", "4", None), TxnOp::put("d", "5", None)])),
    )
    .await
    .unwrap(); // r6
    put(c, "a", "6").await; // r7
    within("compact", c.compact(3, None)).await.unwrap();
}

#[tokio::test]
async fn hashes_agree_for_the_same_history_and_change_on_writes() {
    let one = ephd(&[]);
    let two = ephd(&[]);
    let mut c1 = one.client().await;
    let mut c2 = two.client().await;
    feed(&mut c1).await;
    feed(&mut c2).await;

    let h1 = within("hash_kv", c1.hash_kv(0)).await.unwrap();
    let h2 = within("hash_kv", c2.hash_kv(0)).await.unwrap();
    assert_eq!(h1.hash(), h2.hash(), "same history, same HashKV");
    assert_eq!((h1.hash_revision(), h1.compact_version()), (7, 3));
    assert_eq!((h2.hash_revision(), h2.compact_version()), (7, 3));
    let old1 = within("hash_kv", c1.hash_kv(5)).await.unwrap();
    let old2 = within("hash_kv", c2.hash_kv(5)).await.unwrap();
    assert_eq!(old1.hash(), old2.hash());
    assert_eq!(old1.hash_revision(), 5);
    assert_ne!(old1.hash(), h1.hash(), "the hash covers revisions 6 and 7");
    let full1 = within("hash", c1.hash()).await.unwrap();
    let full2 = within("hash", c2.hash()).await.unwrap();
    assert_eq!(full1.hash(), full2.hash(), "same history, same Hash");

    put(&mut c1, "a", "7").await; // r8 on `one` only
    let changed = within("hash_kv", c1.hash_kv(0)).await.unwrap();
    assert_eq!(changed.hash_revision(), 8);
    assert_ne!(changed.hash(), h1.hash(), "a write changes HashKV");
    let at7 = within("hash_kv", c1.hash_kv(7)).await.unwrap();
    assert_eq!(at7.hash(), h2.hash(), "history up to 7 is unchanged");
    let full = within("hash", c1.hash()).await.unwrap();
    assert_ne!(full.hash(), full2.hash(), "a write changes Hash");

    assert_err(c1.hash_kv(2).await, Code::OutOfRange, COMPACTED);
    assert_err(c1.hash_kv(9).await, Code::OutOfRange, FUTURE);
}

#[tokio::test]
async fn member_list_has_one_member_with_the_advertised_url() {
    let server = ephd(&[]);
    let mut c = server.client().await;
    let list = within("member list", c.member_list()).await.unwrap();
    let members = list.members();
    assert_eq!(members.len(), 1);
    let m = &members[0];
    assert_eq!(m.client_urls(), [server.endpoint()]);
    assert_eq!(m.name(), "default");
    assert!(!m.is_learner());
    assert_ne!(m.id(), 0);
    assert_eq!(m.id(), list.header().unwrap().member_id());
    let status = within("status", c.status()).await.unwrap();
    assert_eq!(status.leader(), m.id());
}

/// The peer URLs shown are etcd's default, or those given, as a stock
/// etcd shows them.
#[tokio::test]
async fn member_list_shows_the_peer_urls_given_as_etcd_does() {
    let given = "http://127.0.0.1:2390,http://10.0.0.9:2390";
    let peer_urls = |list: &etcd_client::MemberListResponse| list.members()[0].peer_urls().to_vec();
    let plain = ephd(&[]);
    let list = within("member list", plain.client().await.member_list())
        .await
        .unwrap();
    assert_eq!(peer_urls(&list), ["http://localhost:2380"]);
    let told = ephd(&["--initial-advertise-peer-urls", given]);
    let ours = within("member list", told.client().await.member_list())
        .await
        .unwrap();
    let cluster = "--initial-cluster=default=http://127.0.0.1:2390,default=http://10.0.0.9:2390";
    let etcd =
        crate::harness::StockEtcd::start_with(&["--initial-advertise-peer-urls", given, cluster]);
    let theirs = within("member list", etcd.client().await.member_list())
        .await
        .unwrap();
    assert_eq!(peer_urls(&ours), peer_urls(&theirs));
    let mut shown = peer_urls(&ours);
    shown.sort();
    assert_eq!(shown, ["http://10.0.0.9:2390", "http://127.0.0.1:2390"]);
}

#[tokio::test]
async fn auth_starts_disabled_and_unsupported_rpcs_are_unimplemented() {
    let server = ephd(&[]);
    let mut c = server.client().await;
    let status = within(
        "auth status",
        AuthClient::new(server.channel().await).auth_status(AuthStatusRequest {}),
    )
    .await
    .unwrap()
    .into_inner();
    assert!(!status.enabled);
    assert_eq!(status.header.unwrap().revision, 1);

    let unimplemented = |r: Result<(), etcd_client::Error>, what: &str| {
        let s = grpc_status(r.expect_err(what));
        assert_eq!(s.code(), Code::Unimplemented, "{what}: {s:?}");
        assert!(!s.message().is_empty(), "{what} explains itself");
    };
    // Auth changes (auth.rs tests them) take no revision of the key space.
    within("user add", c.user_add("u", "p", None))
        .await
        .unwrap();
    within("role add", c.role_add("r")).await.unwrap();
    unimplemented(
        within("member add", c.member_add(["http://127.0.0.1:1"], None))
            .await
            .map(drop),
        "MemberAdd",
    );
    // No key changed.
    let all = within("get", c.get("", Some(GetOptions::new().with_all_keys())))
        .await
        .unwrap();
    assert_eq!((all.count(), rev(all.header())), (0, 1));
}

/// What an auth-disabled server answers to Authenticate (clients configured
/// with a user name call it first and tolerate exactly this answer), and
/// whether Defragment's answer carries a header: the same on ephd as on
/// stock etcd.
#[tokio::test]
async fn authenticate_and_defragment_answer_like_etcd() {
    use ephd::proto::etcdserverpb::{
        maintenance_client::MaintenanceClient, AuthenticateRequest, DefragmentRequest,
    };
    async fn answers(endpoint: &str) -> (Option<(tonic::Code, String)>, bool) {
        let channel = crate::harness::connect_channel(endpoint).await;
        let auth = within(
            "authenticate",
            AuthClient::new(channel.clone()).authenticate(AuthenticateRequest {
                name: "root".into(),
                password: "secret".into(),
            }),
        )
        .await
        .err()
        .map(|s| (s.code(), s.message().to_string()));
        let defrag = within(
            "defragment",
            MaintenanceClient::new(channel).defragment(DefragmentRequest {}),
        )
        .await
        .expect("defragment succeeds")
        .into_inner();
        (auth, defrag.header.is_some())
    }
    let etcd = crate::harness::StockEtcd::start();
    let ephd = crate::support::ephd(&[]);
    let want = answers(&etcd.endpoint()).await;
    assert_eq!(
        want.0,
        Some((
            tonic::Code::FailedPrecondition,
            "etcdserver: authentication is not enabled".to_string()
        ))
    );
    assert_eq!(answers(&ephd.endpoint()).await, want);
}

/// Alarms as a client sees them, side by side with stock etcd: raising and
/// clearing for any member ID, listing (all, or one type), Status.errors,
/// and what NOSPACE and CORRUPT do to writes and reads.
#[tokio::test]
async fn alarms_behave_like_etcds() {
    use ephd::proto::etcdserverpb::{
        alarm_request::AlarmAction as Action, kv_client::KvClient, lease_client::LeaseClient,
        maintenance_client::MaintenanceClient, AlarmRequest, AlarmType, CompactionRequest,
        DeleteRangeRequest, LeaseGrantRequest, PutRequest, RangeRequest, StatusRequest,
    };
    async fn transcript(endpoint: &str) -> Vec<String> {
        let channel = crate::harness::connect_channel(endpoint).await;
        let mut m = MaintenanceClient::new(channel.clone());
        let mut kv = KvClient::new(channel.clone());
        let mut lease = LeaseClient::new(channel);
        let own = within("status", m.status(StatusRequest {}))
            .await
            .unwrap()
            .into_inner()
            .header
            .unwrap()
            .member_id;
        let name = |id: u64| {
            if id == own {
                "self".to_string()
            } else {
                id.to_string()
            }
        };
        let mut out = Vec::new();
        let outcome = |r: Result<String, tonic::Status>| match r {
            Ok(s) => s,
            Err(e) => format!("{:?}: {}", e.code(), e.message()),
        };
        macro_rules! alarm {
            ($action:expr, $member:expr, $alarm:expr) => {{
                let r = within(
                    "alarm",
                    m.alarm(AlarmRequest {
                        action: $action as i32,
                        member_id: $member,
                        alarm: $alarm as i32,
                    }),
                )
                .await
                .map(|r| {
                    let mut v: Vec<String> = r
                        .into_inner()
                        .alarms
                        .iter()
                        .map(|a| format!("{}:{}", name(a.member_id), a.alarm))
                        .collect();
                    v.sort(); // etcd lists from a map
                    v.join(",")
                });
                outcome(r)
            }};
        }
        macro_rules! put {
            ($key:expr) => {{
                let r = within(
                    "put",
                    kv.put(PutRequest {
                        key: $key.as_bytes().to_vec().into(),
                        value: b"v".to_vec().into(),
                        ..Default::default()
                    }),
                )
                .await
                .map(|_| "ok".to_string());
                outcome(r)
            }};
        }
        macro_rules! writes {
            () => {{
                let del = within(
                    "delete",
                    kv.delete_range(DeleteRangeRequest {
                        key: b"a".to_vec().into(),
                        ..Default::default()
                    }),
                )
                .await
                .map(|r| format!("deleted {}", r.into_inner().deleted));
                let get = within(
                    "range",
                    kv.range(RangeRequest {
                        key: b"a".to_vec().into(),
                        range_end: b"z".to_vec().into(),
                        ..Default::default()
                    }),
                )
                .await
                .map(|r| format!("count {}", r.into_inner().count));
                let grant = within(
                    "grant",
                    lease.lease_grant(LeaseGrantRequest { ttl: 60, id: 0 }),
                )
                .await
                .map(|_| "granted".to_string());
                let compact = within(
                    "compact",
                    kv.compact(CompactionRequest {
                        revision: 1,
                        physical: false,
                    }),
                )
                .await
                .map(|_| "compacted".to_string());
                vec![
                    put!("a"),
                    outcome(del),
                    outcome(get),
                    outcome(grant),
                    outcome(compact),
                ]
                .join(" | ")
            }};
        }
        out.push(format!("get: {}", alarm!(Action::Get, 0, AlarmType::None)));
        out.push(format!("put before: {}", put!("a")));
        out.push(format!(
            "raise nospace: {}",
            alarm!(Action::Activate, own, AlarmType::Nospace)
        ));
        out.push(format!(
            "raise again: {}",
            alarm!(Action::Activate, own, AlarmType::Nospace)
        ));
        out.push(format!(
            "raise for 42: {}",
            alarm!(Action::Activate, 42, AlarmType::Nospace)
        ));
        out.push(format!(
            "get all: {}",
            alarm!(Action::Get, 0, AlarmType::None)
        ));
        out.push(format!(
            "get corrupt: {}",
            alarm!(Action::Get, 0, AlarmType::Corrupt)
        ));
        let mut errors: Vec<String> = within("status", m.status(StatusRequest {}))
            .await
            .unwrap()
            .into_inner()
            .errors
            .iter()
            .map(|e| e.replace(&own.to_string(), "self"))
            .collect();
        errors.sort();
        out.push(format!("status errors: {errors:?}"));
        out.push(format!("under nospace: {}", writes!()));
        out.push(format!(
            "clear 42: {}",
            alarm!(Action::Deactivate, 42, AlarmType::Nospace)
        ));
        out.push(format!(
            "clear 42 again: {}",
            alarm!(Action::Deactivate, 42, AlarmType::Nospace)
        ));
        out.push(format!(
            "clear self: {}",
            alarm!(Action::Deactivate, own, AlarmType::Nospace)
        ));
        out.push(format!("after clearing: {}", writes!()));
        out.push(format!(
            "raise corrupt: {}",
            alarm!(Action::Activate, own, AlarmType::Corrupt)
        ));
        out.push(format!("under corrupt: {}", writes!()));
        out.push(format!(
            "clear corrupt: {}",
            alarm!(Action::Deactivate, own, AlarmType::Corrupt)
        ));
        out.push(format!("after corrupt: {}", put!("b")));
        out
    }
    let etcd = crate::harness::StockEtcd::start();
    let ephd = crate::support::ephd(&[]);
    let want = transcript(&etcd.endpoint()).await;
    let got = transcript(&ephd.endpoint()).await;
    for (w, g) in want.iter().zip(&got) {
        assert_eq!(g, w);
    }
    assert_eq!(got.len(), want.len());
    assert!(want.iter().any(|l| l.contains("database space exceeded")));
}

/// `grpc.health.v1.Health`, which Kubernetes `grpc:` probes and load
/// balancers call: the server as a whole is SERVING, as on stock etcd, and
/// an unknown service is NotFound on both (grpc-go says "unknown service",
/// tonic "service not registered").
#[tokio::test]
async fn grpc_health_answers_like_etcd() {
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    async fn check(endpoint: &str, service: &str) -> Result<i32, tonic::Code> {
        let channel = crate::harness::connect_channel(endpoint).await;
        within(
            "health check",
            HealthClient::new(channel).check(HealthCheckRequest {
                service: service.to_string(),
            }),
        )
        .await
        .map(|r| r.into_inner().status)
        .map_err(|s| s.code())
    }
    let etcd = crate::harness::StockEtcd::start();
    let ephd = ephd(&[]);
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    assert_eq!(check(&etcd.endpoint(), "").await, Ok(serving));
    assert_eq!(check(&ephd.endpoint(), "").await, Ok(serving));
    assert_eq!(
        check(&ephd.endpoint(), "no.such.Service").await,
        check(&etcd.endpoint(), "no.such.Service").await
    );
}
