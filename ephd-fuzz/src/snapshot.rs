//! Target `snapshot`: the snapshot reader on arbitrary and on damaged
//! input.
//!
//! The first byte picks a mode:
//! * 0, raw: the rest is a file. Reading it must not panic; when it is
//!   accepted, what it yields must obey the format's rules (keys strictly
//!   ascending, `1 <= create <= mod <= revision`, versions from 1), must
//!   write back to a file that reads the same, and no shorter prefix of the
//!   file may be accepted.
//! * otherwise, damage: the rest chooses a snapshot, which is encoded with
//!   the server's writer and must read back exactly; then one byte is
//!   changed, inserted or the file cut short. A cut or an insertion must be
//!   refused; a changed byte must be refused or (only where the change does
//!   not alter what the file says, such as the format-1 magic) read the
//!   same. A damaged file is never partly accepted.

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use ephd::lease::{LeaseInfo, RestoredLease};
use ephd::mvcc::KeyValue;
use ephd::persist::{decode_in_memory, encode_in_memory, Restored};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Runs one input; panics on a finding.
pub fn run(data: &[u8]) {
    match data.split_first() {
        Some((0, file)) => raw(file),
        Some((_, choices)) => {
            let mut u = Unstructured::new(choices);
            if let Ok(s) = Snapshot::arbitrary(&mut u) {
                damaged(&s, &mut u);
            }
        }
        None => {}
    }
}

/// What a snapshot holds, as the writer takes it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The revision it was taken at.
    pub revision: i64,
    /// When it was written.
    pub written_unix_ms: i64,
    /// Live kvs in key order.
    pub kvs: Vec<KeyValue>,
    /// Leases.
    pub leases: Vec<LeaseInfo>,
}

impl<'a> Arbitrary<'a> for Snapshot {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let revision = i64::from(u.int_in_range(1..=1000u16)?);
        let written_unix_ms = i64::arbitrary(u)?;
        let mut by_key = BTreeMap::new();
        for _ in 0..u.int_in_range(0..=8u8)? {
            let key_len = u.int_in_range(1..=4)?;
            let key = Bytes::from(u.bytes(key_len)?.to_vec());
            let create_revision = u.int_in_range(1..=revision)?;
            let mod_revision = u.int_in_range(create_revision..=revision)?;
            let value_len = u.int_in_range(0..=16)?;
            let kv = KeyValue {
                key: key.clone(),
                create_revision,
                mod_revision,
                version: u.int_in_range(1..=mod_revision - create_revision + 1)?,
                value: Bytes::from(u.bytes(value_len)?.to_vec()),
                lease: i64::arbitrary(u)?,
            };
            by_key.insert(key, kv);
        }
        let mut leases = Vec::new();
        for _ in 0..u.int_in_range(0..=3u8)? {
            leases.push(LeaseInfo {
                id: i64::arbitrary(u)?,
                granted_ttl: i64::arbitrary(u)?,
                remaining_ttl: 0,
                remaining_ms: i64::arbitrary(u)?,
                keys: Vec::new(),
            });
        }
        Ok(Snapshot {
            revision,
            written_unix_ms,
            kvs: by_key.into_values().collect(),
            leases,
        })
    }
}

impl Snapshot {
    /// The file the server writes for it.
    pub fn encode(&self) -> Vec<u8> {
        let kvs: Vec<_> = self.kvs.iter().cloned().map(Arc::new).collect();
        encode_in_memory(
            self.revision,
            self.written_unix_ms,
            &kvs,
            &self.leases,
            None,
        )
    }

    /// What reading that file back at `now_unix_ms` must give.
    fn expected(&self, now_unix_ms: i64) -> Summary {
        let downtime = now_unix_ms.saturating_sub(self.written_unix_ms).max(0);
        Summary {
            revision: self.revision,
            written_unix_ms: self.written_unix_ms,
            kvs: self.kvs.clone(),
            leases: self
                .leases
                .iter()
                .map(|l| RestoredLease {
                    id: l.id,
                    ttl: l.granted_ttl,
                    remaining: Duration::from_millis(
                        l.remaining_ms.saturating_sub(downtime).max(0) as u64,
                    ),
                })
                .collect(),
        }
    }
}

/// A [`Restored`] in a comparable form.
#[derive(Debug, PartialEq)]
struct Summary {
    revision: i64,
    written_unix_ms: i64,
    kvs: Vec<KeyValue>,
    leases: Vec<RestoredLease>,
}

impl From<Restored> for Summary {
    fn from(r: Restored) -> Self {
        Summary {
            revision: r.revision,
            written_unix_ms: r.written_unix_ms,
            kvs: r.kvs,
            leases: r.leases,
        }
    }
}

/// The clock the reader is given in raw mode.
const NOW_UNIX_MS: i64 = 1_700_000_000_000;

fn raw(file: &[u8]) {
    let Ok(restored) = decode_in_memory(file, NOW_UNIX_MS) else {
        return;
    };
    let got = Summary::from(restored);
    assert!(
        got.kvs.windows(2).all(|w| w[0].key < w[1].key),
        "keys out of order: {got:?}"
    );
    for kv in &got.kvs {
        assert!(
            1 <= kv.create_revision
                && kv.create_revision <= kv.mod_revision
                && kv.mod_revision <= got.revision
                && kv.version >= 1,
            "impossible revisions accepted: {kv:?} at revision {}",
            got.revision
        );
    }
    // What was accepted writes back to a file that reads the same.
    let again = Snapshot {
        revision: got.revision,
        written_unix_ms: got.written_unix_ms,
        kvs: got.kvs.clone(),
        leases: got
            .leases
            .iter()
            .map(|l| LeaseInfo {
                id: l.id,
                granted_ttl: l.ttl,
                remaining_ttl: 0,
                remaining_ms: l.remaining.as_millis() as i64,
                keys: Vec::new(),
            })
            .collect(),
    };
    let reread = decode_in_memory(&again.encode(), got.written_unix_ms).map(Summary::from);
    assert_eq!(reread.as_ref().ok(), Some(&got), "{reread:?}");
    for cut in [0, file.len() / 2, file.len() - 1] {
        assert!(
            decode_in_memory(&file[..cut], NOW_UNIX_MS).is_err(),
            "a prefix of {cut} bytes of an accepted file was accepted too"
        );
    }
}

fn damaged(s: &Snapshot, u: &mut Unstructured<'_>) {
    let now = i64::arbitrary(u).unwrap_or(s.written_unix_ms);
    let file = s.encode();
    let read = |bytes: &[u8]| decode_in_memory(bytes, now).map(Summary::from);
    let intact = read(&file).expect("a snapshot just written reads");
    assert_eq!(intact, s.expected(now));
    let Ok(at) = u.choose_index(file.len()) else {
        return;
    };
    let mut bad = file.clone();
    match u8::arbitrary(u).unwrap_or(0) % 3 {
        0 => {
            bad.truncate(at);
            assert!(read(&bad).is_err(), "cut to {at} bytes, still accepted");
        }
        1 => {
            bad.insert(at, u8::arbitrary(u).unwrap_or(0));
            assert!(read(&bad).is_err(), "a byte inserted at {at} was accepted");
        }
        _ => {
            let flip = u8::arbitrary(u).unwrap_or(0).max(1);
            bad[at] ^= flip;
            match read(&bad) {
                Err(_) => {}
                Ok(got) => assert_eq!(
                    got, intact,
                    "byte {at} changed (^{flip:#x}) and the file still read, differently"
                ),
            }
        }
    }
}
