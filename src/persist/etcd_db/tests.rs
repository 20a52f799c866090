use super::*;
use crate::auth::{AuthImage, PermKind, Permission, Role, State, User};
use crate::lease::LeaseInfo;
use crate::mvcc::KeyValue;
use std::sync::Arc;

fn kv(key: &str, create: i64, modified: i64, version: i64, lease: i64) -> crate::mvcc::Kv {
    Arc::new(KeyValue {
        key: key.as_bytes().to_vec().into(),
        create_revision: create,
        mod_revision: modified,
        version,
        value: format!("v-{key}").into_bytes().into(),
        lease,
    })
}

fn auth() -> AuthImage {
    let mut state = State {
        enabled: true,
        ..State::default()
    };
    state.users.insert(
        "root".into(),
        User {
            password_hash: Some("$2a$04$abcdefghijklmnopqrstuv".into()),
            roles: vec!["root".into()],
        },
    );
    state.users.insert(
        "cert-only".into(),
        User {
            password_hash: None,
            roles: vec!["app".into()],
        },
    );
    state.roles.insert(
        "app".into(),
        Role {
            perms: vec![Permission {
                kind: PermKind::ReadWrite,
                key: b"/app/".to_vec(),
                range_end: b"/app0".to_vec(),
            }],
        },
    );
    AuthImage {
        state,
        revision: 9,
        tokens: Vec::new(),
    }
}

#[test]
fn what_is_written_reads_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    // b and c were written by one txn at revision 7; the store is at 12.
    let kvs = vec![
        kv("a", 2, 9, 3, 0),
        kv("b", 7, 7, 1, 0x55),
        kv("c", 7, 7, 1, 0),
        kv("d", 4, 4, 1, 0),
    ];
    let leases = vec![LeaseInfo {
        id: 0x55,
        granted_ttl: 60,
        remaining_ttl: 42,
        remaining_ms: 42_500,
        keys: vec![],
    }];
    let image = auth();
    write(
        &path,
        &Contents {
            revision: 12,
            kvs: &kvs,
            leases: &leases,
            auth: &image,
        },
    )
    .unwrap();
    let head = std::fs::read(&path).unwrap();
    assert!(has_bbolt_magic(&head));
    let back = read(&path, 1_000).unwrap();
    assert_eq!(back.revision, 12, "compacted at the snapshot's revision");
    let got: Vec<KeyValue> = back.kvs.clone();
    let want: Vec<KeyValue> = kvs.iter().map(|k| (**k).clone()).collect();
    assert_eq!(got, want);
    assert_eq!(back.leases.len(), 1);
    assert_eq!(
        (
            back.leases[0].id,
            back.leases[0].ttl,
            back.leases[0].remaining.as_secs()
        ),
        (0x55, 60, 42)
    );
    assert_eq!(back.auth, Some(image));
}

#[test]
fn a_checksum_after_the_database_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let image = AuthImage::pristine();
    write(
        &path,
        &Contents {
            revision: 3,
            kvs: &[kv("k", 3, 3, 1, 0)],
            leases: &[],
            auth: &image,
        },
    )
    .unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let sum = ring::digest::digest(&ring::digest::SHA256, &bytes);
    let good = dir.path().join("good.snap");
    let mut with_sum = bytes.clone();
    with_sum.extend_from_slice(sum.as_ref());
    std::fs::write(&good, &with_sum).unwrap();
    let back = read(&good, 0).unwrap();
    assert_eq!((back.revision, back.kvs.len(), back.auth), (3, 1, None));

    let bad = dir.path().join("bad.snap");
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    bytes.extend_from_slice(sum.as_ref());
    std::fs::write(&bad, &bytes).unwrap();
    match read(&bad, 0) {
        Err(crate::persist::ReadError::Damaged { reason, .. }) => {
            assert!(reason.contains("SHA-256"), "{reason}")
        }
        other => panic!("{:?}", other.map(|r| r.revision)),
    }
}

#[test]
fn a_file_that_is_not_a_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("junk");
    std::fs::write(&path, vec![7u8; 8192]).unwrap();
    assert!(!has_bbolt_magic(&std::fs::read(&path).unwrap()));
    assert!(matches!(
        read(&path, 0),
        Err(crate::persist::ReadError::Damaged { .. })
    ));
}

fn many(n: usize) -> Vec<crate::mvcc::Kv> {
    (0..n)
        .map(|i| {
            // Every 500th value spans overflow pages.
            let size = if i % 500 == 0 { 20_000 } else { 40 };
            Arc::new(KeyValue {
                key: format!("/registry/events/ns/{i:06}").into_bytes().into(),
                create_revision: i as i64 + 1,
                mod_revision: i as i64 + 1,
                version: 1,
                value: vec![b'x'; size].into(),
                lease: 0,
            })
        })
        .collect()
}

#[test]
fn a_large_tree_with_overflow_pages_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let kvs = many(5_000);
    let image = AuthImage::pristine();
    let contents = Contents {
        revision: 5_000,
        kvs: &kvs,
        leases: &[],
        auth: &image,
    };
    write(&path, &contents).unwrap();
    let back = read(&path, 0).unwrap();
    assert_eq!(back.revision, 5_000);
    let want: Vec<KeyValue> = kvs.iter().map(|k| (**k).clone()).collect();
    assert!(back.kvs == want, "{} keys back", back.kvs.len());
}

#[test]
fn a_damaged_database_is_an_error_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let image = auth();
    let kvs = many(300);
    write(
        &path,
        &Contents {
            revision: 300,
            kvs: &kvs,
            leases: &[],
            auth: &image,
        },
    )
    .unwrap();
    let good = std::fs::read(&path).unwrap();
    let bad = dir.path().join("bad");
    // Cut short anywhere, and single bytes changed all over the file.
    for cut in (0..good.len()).step_by(997) {
        std::fs::write(&bad, &good[..cut]).unwrap();
        let back = read(&bad, 0);
        if cut < 2 * 4096 {
            assert!(back.is_err(), "a file without its meta pages ({cut} bytes)");
        }
    }
    let mut refused = 0;
    for at in (0..good.len()).step_by(61) {
        let mut b = good.clone();
        b[at] = b[at].wrapping_add(0x5b);
        std::fs::write(&bad, &b).unwrap();
        refused += usize::from(read(&bad, 0).is_err());
    }
    assert!(refused > 0, "no damaged byte was noticed");
}

#[test]
fn the_same_contents_write_the_same_bytes_whatever_memory_held() {
    let dir = tempfile::tempdir().unwrap();
    let image = auth();
    let kvs = many(600);
    let mut files = Vec::new();
    for i in 0..6u8 {
        // Heap memory freed just before, holding other patterns each time.
        let noise: Vec<Vec<u8>> = (0..200).map(|j| vec![0xA0 + i; 1000 + j]).collect();
        drop(noise);
        for (name, kvs) in [("empty", &[][..]), ("keys", &kvs[..])] {
            let path = dir.path().join(format!("{name}-{i}"));
            let contents = Contents {
                revision: 600,
                kvs,
                leases: &[],
                auth: &image,
            };
            write(&path, &contents).unwrap();
            files.push((name, std::fs::read(&path).unwrap()));
        }
    }
    for (name, bytes) in &files {
        let first = &files.iter().find(|(n, _)| n == name).unwrap().1;
        assert!(bytes == first, "two writes of the same {name} state differ");
        // Meta page 0 holds 16 + 64 bytes; the rest of the page is slack.
        assert!(
            bytes[80..4096].iter().all(|b| *b == 0),
            "{name}: slack not cleared"
        );
    }
    assert_eq!(read(&dir.path().join("keys-0"), 0).unwrap().kvs.len(), 600);
}
