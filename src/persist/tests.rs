//! Damage of every kind is an error, never a partial restore; generations
//! are kept, pruned and moved aside by the rules in the module docs.

use super::format::{
    self, frame, End, LeaseRecord, Meta, ALIGN_BLOCK, ALIGN_REST, KIND_END, KIND_KV, KIND_LEASE,
    KIND_META, KIND_PAD, MAGIC_V1, MAGIC_V2,
};
use super::*;
use crate::lease::LeaseInfo;
use crate::mvcc::Kv;
use crate::proto::mvccpb;
use bytes::Bytes;
use prost::Message;
use std::sync::Arc;
use std::time::Duration;

pub(super) const NOW: i64 = 1_700_000_000_000;

fn kv(k: &str, rev: i64, lease: i64) -> Kv {
    Arc::new(KeyValue {
        key: Bytes::copy_from_slice(k.as_bytes()),
        create_revision: rev,
        mod_revision: rev,
        version: 1,
        value: Bytes::from(format!("value of {k}")),
        lease,
    })
}

fn lease(id: i64, remaining_ms: i64) -> LeaseInfo {
    LeaseInfo {
        id,
        granted_ttl: 60,
        remaining_ttl: remaining_ms / 1000,
        remaining_ms,
        keys: vec![],
    }
}

pub(super) fn sample() -> (Vec<Kv>, Vec<LeaseInfo>) {
    (
        vec![kv("a", 2, 0), kv("b", 3, 7), kv("c", 5, 8)],
        vec![lease(7, 59_000), lease(8, 30_000)],
    )
}

fn encoded(revision: i64) -> Vec<u8> {
    let (kvs, leases) = sample();
    let mut out = Vec::new();
    let n = format::encode(
        &mut out,
        &format::Meta::at(revision, NOW, None),
        &kvs,
        &leases,
        None,
        false,
    )
    .unwrap();
    assert_eq!(n as usize, out.len());
    out
}

/// Decodes one second after the snapshot was written.
fn decode(bytes: &[u8]) -> Result<Restored, ReadError> {
    format::decode(bytes, NOW + 1000)
}

#[track_caller]
fn damaged(result: Result<Restored, ReadError>) -> String {
    match result {
        Err(ReadError::Damaged { reason, .. }) => reason,
        Err(ReadError::Io(e)) => panic!("expected damage, got an I/O error {e}"),
        Ok(r) => panic!("a damaged file restored {} keys", r.kvs.len()),
    }
}

/// A record as (kind, payload).
pub(super) type Record = (u8, Vec<u8>);

/// A file assembled from (kind, payload) records, with a correct end record.
pub(super) fn assemble(magic: &[u8], records: &[(u8, Vec<u8>)], v2_end: bool) -> Vec<u8> {
    let mut out = magic.to_vec();
    for (kind, payload) in records {
        let (head, body) = frame(*kind, payload);
        out.extend_from_slice(&head);
        out.extend_from_slice(&body);
    }
    let end = End {
        records: records.len() as u64,
        digest: if v2_end { crc32fast::hash(&out) } else { 0 },
        bytes: if v2_end { out.len() as u64 } else { 0 },
    };
    let (head, body) = frame(KIND_END, &end.encode_to_vec());
    out.extend_from_slice(&head);
    out.extend_from_slice(&body);
    out
}

pub(super) fn meta(revision: i64) -> (u8, Vec<u8>) {
    let m = Meta {
        revision,
        written_unix_ms: NOW,
        wal_position: None,
    };
    (KIND_META, m.encode_to_vec())
}

pub(super) fn kv_record(key: &str, mod_revision: i64) -> (u8, Vec<u8>) {
    let pb = mvccpb::KeyValue {
        key: Bytes::copy_from_slice(key.as_bytes()),
        create_revision: 1,
        mod_revision,
        version: 1,
        value: Bytes::from_static(b"v"),
        lease: 0,
    };
    (KIND_KV, pb.encode_to_vec())
}

#[test]
fn round_trip_keeps_every_record() {
    let r = decode(&encoded(5)).unwrap();
    assert_eq!(r.revision, 5);
    assert_eq!(r.written_unix_ms, NOW);
    let (kvs, _) = sample();
    let want: Vec<KeyValue> = kvs.iter().map(|kv| (**kv).clone()).collect();
    assert_eq!(r.kvs, want);
    let leases: Vec<_> = r
        .leases
        .iter()
        .map(|l| (l.id, l.ttl, l.remaining))
        .collect();
    assert_eq!(
        leases,
        vec![
            (7, 60, Duration::from_millis(58_000)),
            (8, 60, Duration::from_millis(29_000))
        ],
        "the second of downtime is taken off each lease"
    );
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = encoded(5);
    for cut in 0..bytes.len() {
        let reason = damaged(decode(&bytes[..cut]));
        assert!(reason.contains("cut short"), "cut at {cut}: {reason}");
    }
}

#[test]
fn every_flipped_bit_is_an_error() {
    let bytes = encoded(5);
    for at in 0..bytes.len() {
        for bit in 0..8 {
            let mut bad = bytes.clone();
            bad[at] ^= 1 << bit;
            damaged(decode(&bad));
        }
    }
}

#[test]
fn trailing_bytes_are_an_error() {
    let mut bytes = encoded(5);
    bytes.push(0);
    assert!(damaged(decode(&bytes)).contains("follow the end record"));
}

#[test]
fn records_intact_one_by_one_but_wrong_together_are_errors() {
    let (kvs, _) = sample();
    let pb = |kv: &Kv| format::kv_payload(kv);
    let l = |id| {
        LeaseRecord {
            id,
            ttl: 60,
            remaining_ms: 1000,
        }
        .encode_to_vec()
    };
    let good = vec![
        meta(5),
        (KIND_KV, pb(&kvs[0])),
        (KIND_KV, pb(&kvs[1])),
        (KIND_LEASE, l(7)),
    ];
    assert_eq!(
        decode(&assemble(MAGIC_V2, &good, true)).unwrap().kvs.len(),
        2
    );

    // A record dropped with the count fixed up: the whole-file checksum
    // still describes the original contents.
    let bytes = assemble(MAGIC_V2, &good, true);
    let original = last_end(&bytes);
    let mut forged = assemble(MAGIC_V2, &good[..3], true);
    let cut = forged.len() - last_end_len(&forged);
    forged.truncate(cut);
    push_end(
        &mut forged,
        End {
            records: 3,
            digest: original.digest,
            bytes: cut as u64,
        },
    );
    assert!(damaged(decode(&forged)).contains("whole-file checksum"));

    // A count that does not match.
    let mut miscounted = bytes.clone();
    miscounted.truncate(bytes.len() - last_end_len(&bytes));
    push_end(
        &mut miscounted,
        End {
            records: 9,
            ..original
        },
    );
    assert!(damaged(decode(&miscounted)).contains("counts 9 records"));

    // Keys swapped, duplicated; revisions above the snapshot's; kinds out
    // of place or unknown; no meta record first.
    let cases: Vec<(Vec<Record>, &str)> = vec![
        (
            vec![meta(5), (KIND_KV, pb(&kvs[1])), (KIND_KV, pb(&kvs[0]))],
            "out of order",
        ),
        (
            vec![meta(5), (KIND_KV, pb(&kvs[0])), (KIND_KV, pb(&kvs[0]))],
            "out of order",
        ),
        (vec![meta(5), kv_record("x", 6)], "impossible revisions"),
        (vec![meta(5), kv_record("x", 0)], "impossible revisions"),
        (vec![kv_record("x", 1)], "not the meta record"),
        (vec![meta(5), meta(5)], "second meta record"),
        (vec![meta(5), (0x42, vec![1, 2, 3])], "unknown kind"),
        (
            vec![meta(5), (KIND_KV, vec![0xff, 0xff])],
            "does not decode",
        ),
    ];
    for (records, want) in cases {
        let reason = damaged(decode(&assemble(MAGIC_V2, &records, true)));
        assert!(reason.contains(want), "{want}: {reason}");
    }
}

fn push_end(out: &mut Vec<u8>, end: End) {
    let (head, body) = frame(KIND_END, &end.encode_to_vec());
    out.extend_from_slice(&head);
    out.extend_from_slice(&body);
}

/// The end record of a well-formed file.
fn last_end(bytes: &[u8]) -> End {
    let len = last_end_len(bytes);
    End::decode(&bytes[bytes.len() - len + 9..]).unwrap()
}

/// The length of the last record (the end record), found by walking the
/// records from the start.
fn last_end_len(bytes: &[u8]) -> usize {
    let mut at = 10;
    loop {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if at + 8 + len == bytes.len() {
            return 8 + len;
        }
        at += 8 + len;
    }
}

#[test]
fn the_legacy_format_is_read_with_the_same_strictness() {
    let records = vec![meta(9), kv_record("a", 3), kv_record("b", 9)];
    let v1 = assemble(MAGIC_V1, &records, false);
    let r = decode(&v1).unwrap();
    assert_eq!(r.revision, 9);
    assert_eq!(r.kvs.len(), 2);
    for cut in 0..v1.len() {
        damaged(decode(&v1[..cut]));
    }
    for at in 0..v1.len() {
        let mut bad = v1.clone();
        bad[at] ^= 0x10;
        damaged(decode(&bad));
    }
    let mut trailing = v1.clone();
    trailing.extend_from_slice(b"x");
    damaged(decode(&trailing));
}

#[test]
fn a_streamed_snapshot_is_padded_to_the_length_etcdctl_accepts() {
    for keys in 0..40 {
        let kvs: Vec<Kv> = (0..keys)
            .map(|i| kv(&format!("key/{i:03}"), 2 + i as i64, 0))
            .collect();
        let leases = vec![lease(7, 59_000)];
        let mut out = Vec::new();
        let n = format::encode(
            &mut out,
            &format::Meta::at(100, NOW, None),
            &kvs,
            &leases,
            None,
            true,
        )
        .unwrap();
        assert_eq!(n as usize, out.len());
        assert_eq!(out.len() as u64 % ALIGN_BLOCK, ALIGN_REST, "{keys} keys");
        let r = decode(&out).unwrap();
        assert_eq!(r.kvs.len(), keys);
        assert_eq!(r.leases.len(), 1);
    }
}

#[test]
fn padding_must_be_zeros_and_come_last() {
    let not_zeros = assemble(MAGIC_V2, &[meta(5), (KIND_PAD, vec![0, 1])], true);
    assert!(damaged(decode(&not_zeros)).contains("padding that is not zeros"));
    let not_last = assemble(
        MAGIC_V2,
        &[meta(5), (KIND_PAD, vec![0; 3]), kv_record("a", 2)],
        true,
    );
    assert!(damaged(decode(&not_last)).contains("follows the padding record"));
    let fine = assemble(
        MAGIC_V2,
        &[meta(5), kv_record("a", 2), (KIND_PAD, vec![])],
        true,
    );
    assert_eq!(decode(&fine).unwrap().kvs.len(), 1);
}

/// An auth image with a user, a role, auth enabled and a token.
fn auth_image() -> crate::auth::AuthImage {
    let mut image = crate::auth::AuthImage::pristine();
    let root = crate::auth::User {
        password_hash: Some("$2b$04$hash".into()),
        roles: vec!["root".into()],
    };
    image.state.users.insert("root".into(), root);
    image.state.enabled = true;
    image.revision = 4;
    image.tokens = vec![("tok.1".into(), "root".into())];
    image
}

#[test]
fn the_auth_state_is_kept_without_its_tokens() {
    let (kvs, leases) = sample();
    let image = auth_image();
    let mut out = Vec::new();
    format::encode(
        &mut out,
        &format::Meta::at(9, NOW, None),
        &kvs,
        &leases,
        Some(&image),
        false,
    )
    .unwrap();
    let restored = decode(&out).unwrap();
    let auth = restored.auth.expect("auth restored");
    assert_eq!(auth.state, image.state);
    assert_eq!(auth.revision, 4);
    assert!(auth.tokens.is_empty(), "tokens are never written");
    assert_eq!(restored.kvs.len(), kvs.len());
    // Streamed (padded) snapshots carry it too.
    let mut padded = Vec::new();
    format::encode(
        &mut padded,
        &format::Meta::at(9, NOW, None),
        &kvs,
        &leases,
        Some(&image),
        true,
    )
    .unwrap();
    assert_eq!(decode(&padded).unwrap().auth.unwrap().state, image.state);
}

#[test]
fn an_unused_auth_state_writes_nothing() {
    let (kvs, leases) = sample();
    let pristine = crate::auth::AuthImage::pristine();
    let mut out = Vec::new();
    format::encode(
        &mut out,
        &format::Meta::at(9, NOW, None),
        &kvs,
        &leases,
        Some(&pristine),
        false,
    )
    .unwrap();
    assert_eq!(out, encoded(9), "the same bytes as without auth");
    assert!(decode(&out).unwrap().auth.is_none());
}

/// A format-2 file of `records` (kind, payload) after the magic, with a
/// correct end record.
fn file_of(records: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut bytes = MAGIC_V2.to_vec();
    for (kind, payload) in records {
        let (head, body) = frame(*kind, payload);
        bytes.extend_from_slice(&head);
        bytes.extend_from_slice(&body);
    }
    let end = End {
        records: records.len() as u64,
        digest: crc32fast::hash(&bytes),
        bytes: bytes.len() as u64,
    };
    let (head, body) = frame(KIND_END, &end.encode_to_vec());
    bytes.extend_from_slice(&head);
    bytes.extend_from_slice(&body);
    bytes
}

#[test]
fn a_second_or_damaged_auth_record_makes_the_file_damaged() {
    let meta = Meta {
        revision: 9,
        written_unix_ms: NOW,
        wal_position: None,
    }
    .encode_to_vec();
    let auth = auth_image().encode();
    let well_formed = file_of(&[(KIND_META, meta.clone()), (format::KIND_AUTH, auth.clone())]);
    assert!(decode(&well_formed).unwrap().auth.is_some());
    let twice = file_of(&[
        (KIND_META, meta.clone()),
        (format::KIND_AUTH, auth.clone()),
        (format::KIND_AUTH, auth),
    ]);
    let bad = file_of(&[
        (KIND_META, meta),
        (format::KIND_AUTH, vec![0xff, 0xff, 0xff]),
    ]);
    for bytes in [twice, bad] {
        match decode(&bytes) {
            Err(ReadError::Damaged { reason, .. }) => {
                assert!(reason.contains("auth"), "{reason}")
            }
            other => panic!("not damaged: {other:?}"),
        }
    }
}
