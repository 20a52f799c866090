//! Seed inputs: a few valid inputs per target, so that fuzzing starts from
//! requests that decode and snapshots that read instead of rediscovering
//! the wire format. `write_seeds` (a binary of this crate) writes them to
//! `fuzz/seeds/<target>/`; the replay test runs them from there and from
//! here.

use crate::decode::frame;
use crate::snapshot::Snapshot;
use bytes::Bytes;
use ephd::lease::LeaseInfo;
use ephd::mvcc::KeyValue;
use ephd::proto::etcdserverpb::{
    self as pb, compare, request_op::Request, watch_request::RequestUnion,
};
use prost::Message;

/// The seeds of `target`, named.
pub fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    match target {
        "decode_requests" => decode_requests(),
        "store_ops" => store_ops(),
        "snapshot" => snapshot(),
        "etcd_db" => etcd_db(),
        other => panic!("no fuzz target called {other}"),
    }
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// One valid request of every kind the decode target serves, each alone and
/// all in one input.
fn decode_requests() -> Vec<(String, Vec<u8>)> {
    let put = |k: &str| pb::RequestOp {
        request: Some(Request::RequestPut(pb::PutRequest {
            key: b(k),
            value: b("v2"),
            prev_kv: true,
            ..Default::default()
        })),
    };
    let range = pb::RangeRequest {
        key: b("a"),
        range_end: b("\0"),
        limit: 2,
        sort_order: 2,
        sort_target: 3,
        ..Default::default()
    };
    let txn = pb::TxnRequest {
        compare: vec![pb::Compare {
            result: 0,
            target: 1,
            key: b("a"),
            target_union: Some(compare::TargetUnion::CreateRevision(3)),
            ..Default::default()
        }],
        success: vec![
            put("a"),
            pb::RequestOp {
                request: Some(Request::RequestTxn(pb::TxnRequest {
                    success: vec![put("n")],
                    ..Default::default()
                })),
            },
        ],
        failure: vec![pb::RequestOp {
            request: Some(Request::RequestRange(range.clone())),
        }],
    };
    let watch = pb::WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(pb::WatchCreateRequest {
            key: b("a"),
            range_end: b("z"),
            start_revision: 1,
            prev_kv: true,
            ..Default::default()
        })),
    };
    let requests: Vec<(&str, u8, Vec<u8>)> = vec![
        ("range", 0, range.encode_to_vec()),
        (
            "put",
            1,
            pb::PutRequest {
                key: b("k"),
                value: b("v"),
                lease: 7,
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "delete",
            2,
            pb::DeleteRangeRequest {
                key: b("a"),
                range_end: b("c"),
                prev_kv: true,
            }
            .encode_to_vec(),
        ),
        ("txn", 3, txn.encode_to_vec()),
        (
            "compact",
            4,
            pb::CompactionRequest {
                revision: 3,
                physical: false,
            }
            .encode_to_vec(),
        ),
        ("watch", 5, watch.encode_to_vec()),
        (
            "lease_grant",
            6,
            pb::LeaseGrantRequest { ttl: 10, id: 9 }.encode_to_vec(),
        ),
        (
            "lease_revoke",
            7,
            pb::LeaseRevokeRequest { id: 7 }.encode_to_vec(),
        ),
        (
            "keep_alive",
            8,
            pb::LeaseKeepAliveRequest { id: 7 }.encode_to_vec(),
        ),
        (
            "time_to_live",
            9,
            pb::LeaseTimeToLiveRequest { id: 7, keys: true }.encode_to_vec(),
        ),
        ("leases", 10, pb::LeaseLeasesRequest {}.encode_to_vec()),
        (
            "alarm",
            11,
            pb::AlarmRequest {
                action: 1,
                member_id: 1,
                alarm: 1,
            }
            .encode_to_vec(),
        ),
        (
            "hash_kv",
            12,
            pb::HashKvRequest { revision: 0 }.encode_to_vec(),
        ),
    ];
    let mut out: Vec<(String, Vec<u8>)> = requests
        .iter()
        .map(|(name, kind, payload)| (name.to_string(), frame(*kind, payload)))
        .collect();
    out.push((
        "all".to_string(),
        requests
            .iter()
            .flat_map(|(_, kind, payload)| frame(*kind, payload))
            .collect(),
    ));
    out
}

/// Deterministic pseudo-random bytes (xorshift), which `arbitrary` turns
/// into op sequences of every kind.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn store_ops() -> Vec<(String, Vec<u8>)> {
    (1..=8u64)
        .map(|i| (format!("noise-{i}"), noise(i, 64 * i as usize)))
        .collect()
}

fn snapshot() -> Vec<(String, Vec<u8>)> {
    let kv = |k: &str, create, rev, version| KeyValue {
        key: b(k),
        create_revision: create,
        mod_revision: rev,
        version,
        value: b("value"),
        lease: 0,
    };
    let s = Snapshot {
        revision: 12,
        written_unix_ms: 1_700_000_000_000,
        kvs: vec![kv("a", 2, 5, 3), kv("b", 7, 7, 1), kv("c", 3, 12, 9)],
        leases: vec![LeaseInfo {
            id: 7,
            granted_ttl: 60,
            remaining_ttl: 0,
            remaining_ms: 30_000,
            keys: Vec::new(),
        }],
    };
    let mut raw = vec![0u8];
    raw.extend(s.encode());
    let mut out = vec![("raw".to_string(), raw)];
    for i in 1..=4u64 {
        let mut damage = vec![i as u8];
        damage.extend(noise(i, 96));
        out.push((format!("damage-{i}"), damage));
    }
    out
}

/// Databases written as Maintenance.Snapshot writes them: keys, a txn's
/// two keys at one revision, a lease, users and roles.
fn etcd_db() -> Vec<(String, Vec<u8>)> {
    use ephd::auth::{AuthImage, PermKind, Permission, Role, State, User};
    use ephd::persist::etcd_db::{write, Contents};
    use std::sync::Arc;
    let kv = |k: &str, create, rev, version, lease| {
        Arc::new(KeyValue {
            key: b(k),
            create_revision: create,
            mod_revision: rev,
            version,
            value: b("value"),
            lease,
        })
    };
    let kvs = [
        kv("a", 2, 5, 3, 0),
        kv("b", 7, 7, 1, 9),
        kv("c", 7, 7, 1, 0),
    ];
    let leases = [LeaseInfo {
        id: 9,
        granted_ttl: 60,
        remaining_ttl: 30,
        remaining_ms: 30_000,
        keys: Vec::new(),
    }];
    let mut state = State {
        enabled: true,
        ..State::default()
    };
    state.users.insert(
        "root".into(),
        User {
            password_hash: Some("$2a$04$0000000000000000000000".into()),
            roles: vec!["root".into()],
        },
    );
    state.roles.insert(
        "r".into(),
        Role {
            perms: vec![Permission {
                kind: PermKind::Read,
                key: b"/a".to_vec(),
                range_end: Vec::new(),
            }],
        },
    );
    let auth = AuthImage {
        state,
        revision: 4,
        tokens: Vec::new(),
    };
    let mut out = Vec::new();
    for (name, kvs, leases, auth) in [
        ("keys-leases-auth", &kvs[..], &leases[..], auth),
        ("empty", &[][..], &[][..], AuthImage::pristine()),
    ] {
        // One file per process, thread and seed: tests make seeds at once.
        let thread: String = format!("{:?}", std::thread::current().id())
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect();
        let path = std::env::temp_dir().join(format!(
            "ephd-fuzz-seed-{}-{thread}-{name}.db",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        write(
            &path,
            &Contents {
                revision: 12,
                kvs,
                leases,
                auth: &auth,
            },
        )
        .expect("write a seed database");
        out.push((
            name.to_string(),
            std::fs::read(&path).expect("read it back"),
        ));
        let _ = std::fs::remove_file(&path);
    }
    out
}
