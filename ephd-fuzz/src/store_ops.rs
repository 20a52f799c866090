//! Target `store_ops`: a sequence of operations applied both to a fresh
//! [`Store`] through its public API and to the reference [`Model`], with
//! every answer compared.
//!
//! The op space is kept small on purpose, so that the model stays simple
//! and every check is exact: five keys (two sharing a prefix), a handful of
//! range ends (including `"\0"` and ends below their key), four values,
//! three lease IDs. Within it, everything a client can send is reachable:
//! puts with the ignore flags and leases, range deletes, ranges at past
//! revisions with limits, sorts and filters, txns with compares of every
//! target and result and one level of nested txns, compactions at any
//! revision, lease grants, revokes, expiry (through the same revoke entry a
//! server's expiry task applies), keep-alives and lease queries.
//!
//! After every op the current and compacted revisions must match; at the
//! end, every retained revision is read back whole and the change log is
//! compared event by event.

use crate::model::{same_range, Model};
use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use ephd::mvcc::{
    Compare, CompareResult, CompareTarget, DeleteRequest, PutRequest, RangeRequest, RequestOp,
    ResponseOp, SortOrder, SortTarget, Store, StoreConfig, TxnRequest, TxnResponse,
};
use std::time::{Duration, Instant};

/// Most ops one input runs, so that one input stays fast to replay.
const MAX_OPS: usize = 64;
/// Most compares or ops per txn branch the generator makes.
const MAX_TXN_OPS: usize = 3;

const KEYS: [&[u8]; 5] = [b"a", b"b", b"ba", b"c", b"d"];
/// Range ends: a single key, every key from `key` on, and plain ends, some
/// below some keys (an empty range).
const ENDS: [&[u8]; 8] = [b"", b"\0", b"b", b"bb", b"c", b"d", b"e", b"a"];
const VALUES: [&[u8]; 4] = [b"", b"x", b"y", b"zz"];
/// Lease numbers map to these IDs; 0 is "no lease".
const LEASES: [i64; 4] = [0, 1, 2, 3];

fn pick<T: Copy>(from: &[T], n: u8) -> T {
    from[n as usize % from.len()]
}

fn bytes(b: &[u8]) -> Bytes {
    Bytes::copy_from_slice(b)
}

/// A revision a request may name, relative to the current one: from just
/// below every compaction up to one past the current revision.
fn revision(n: u8, current: i64) -> i64 {
    n as i64 % (current + 3) - 1
}

/// One store operation, as the fuzzer's bytes choose it.
#[derive(Arbitrary, Debug)]
pub enum Op {
    /// A unary Put.
    Put(PutOp),
    /// A unary DeleteRange.
    Delete(DeleteOp),
    /// A unary Range.
    Range(RangeOp),
    /// A Txn.
    Txn(TxnOp),
    /// A compaction at a revision near the current one.
    Compact(u8),
    /// A lease grant (TTL byte 255 asks for more than etcd's maximum).
    Grant {
        /// Lease number.
        lease: u8,
        /// TTL choice.
        ttl: u8,
    },
    /// A lease revoke.
    Revoke(u8),
    /// Every lease expires (the clock jumps far ahead).
    ExpireAll,
    /// A keep-alive.
    KeepAlive(u8),
    /// A time-to-live query with keys.
    TimeToLive(u8),
    /// The lease list.
    Leases,
}

/// A Put's choices.
#[derive(Arbitrary, Debug, Clone)]
pub struct PutOp {
    key: u8,
    value: u8,
    lease: u8,
    prev_kv: bool,
    ignore_value: bool,
    ignore_lease: bool,
}

/// A DeleteRange's choices.
#[derive(Arbitrary, Debug, Clone)]
pub struct DeleteOp {
    key: u8,
    end: u8,
    prev_kv: bool,
}

/// A Range's choices.
#[derive(Arbitrary, Debug, Clone)]
pub struct RangeOp {
    key: u8,
    end: u8,
    revision: Option<u8>,
    limit: u8,
    sort_order: u8,
    sort_target: u8,
    keys_only: bool,
    count_only: bool,
    filters: [Option<u8>; 4],
}

/// A compare's choices.
#[derive(Arbitrary, Debug, Clone)]
pub struct CompareOp {
    key: u8,
    ranged: Option<u8>,
    target: u8,
    result: u8,
    operand: i8,
    value: u8,
}

/// An op inside a nested txn (no further nesting).
#[derive(Arbitrary, Debug, Clone)]
pub enum LeafOp {
    /// A put.
    Put(PutOp),
    /// A delete.
    Delete(DeleteOp),
    /// A range.
    Range(RangeOp),
}

/// An op of a top-level txn.
#[derive(Arbitrary, Debug, Clone)]
pub enum BranchOp {
    /// A put, delete or range.
    Leaf(LeafOp),
    /// A nested txn.
    Nested(Box<TxnOf<LeafOp>>),
    /// An op with no request (etcd refuses it).
    Empty,
}

/// A txn whose branches hold ops of type `O`.
#[derive(Arbitrary, Debug, Clone)]
pub struct TxnOf<O> {
    compares: Vec<CompareOp>,
    success: Vec<O>,
    failure: Vec<O>,
}

/// A top-level txn.
pub type TxnOp = TxnOf<BranchOp>;

impl PutOp {
    fn request(&self) -> PutRequest {
        PutRequest {
            key: bytes(pick(&KEYS, self.key)),
            value: bytes(pick(&VALUES, self.value)),
            lease: pick(&LEASES, self.lease),
            prev_kv: self.prev_kv,
            ignore_value: self.ignore_value,
            ignore_lease: self.ignore_lease,
        }
    }
}

impl DeleteOp {
    fn request(&self) -> DeleteRequest {
        DeleteRequest {
            key: bytes(pick(&KEYS, self.key)),
            range_end: bytes(pick(&ENDS, self.end)),
            prev_kv: self.prev_kv,
        }
    }
}

impl RangeOp {
    fn request(&self, current: i64) -> RangeRequest {
        let filter = |f: Option<u8>| f.map_or(0, |n| revision(n, current));
        RangeRequest {
            key: bytes(pick(&KEYS, self.key)),
            range_end: bytes(pick(&ENDS, self.end)),
            limit: (self.limit % 4) as i64,
            revision: self.revision.map_or(0, |n| revision(n, current)),
            sort_order: pick(
                &[SortOrder::None, SortOrder::Ascend, SortOrder::Descend],
                self.sort_order,
            ),
            sort_target: pick(
                &[
                    SortTarget::Key,
                    SortTarget::Version,
                    SortTarget::Create,
                    SortTarget::Mod,
                    SortTarget::Value,
                ],
                self.sort_target,
            ),
            keys_only: self.keys_only,
            count_only: self.count_only,
            min_mod_revision: filter(self.filters[0]),
            max_mod_revision: filter(self.filters[1]),
            min_create_revision: filter(self.filters[2]),
            max_create_revision: filter(self.filters[3]),
        }
    }
}

impl CompareOp {
    fn compare(&self, current: i64) -> Compare {
        let n = self.operand as i64;
        let target = match self.target % 5 {
            0 => CompareTarget::Version(n % 4),
            1 => CompareTarget::Create(revision(self.operand as u8, current)),
            2 => CompareTarget::Mod(revision(self.operand as u8, current)),
            3 => CompareTarget::Value(bytes(pick(&VALUES, self.value))),
            _ => CompareTarget::Lease(pick(&LEASES, self.value)),
        };
        Compare {
            result: pick(
                &[
                    CompareResult::Equal,
                    CompareResult::Greater,
                    CompareResult::Less,
                    CompareResult::NotEqual,
                ],
                self.result,
            ),
            target,
            key: bytes(pick(&KEYS, self.key)),
            range_end: self.ranged.map_or(Bytes::new(), |e| bytes(pick(&ENDS, e))),
        }
    }
}

impl LeafOp {
    fn request(&self, current: i64) -> RequestOp {
        match self {
            LeafOp::Put(p) => RequestOp::Put(p.request()),
            LeafOp::Delete(d) => RequestOp::Delete(d.request()),
            LeafOp::Range(r) => RequestOp::Range(r.request(current)),
        }
    }
}

impl BranchOp {
    fn request(&self, current: i64) -> RequestOp {
        match self {
            BranchOp::Leaf(op) => op.request(current),
            BranchOp::Nested(t) => RequestOp::Txn(t.request(current, LeafOp::request)),
            BranchOp::Empty => RequestOp::Empty,
        }
    }
}

impl<O> TxnOf<O> {
    fn request(&self, current: i64, op: impl Fn(&O, i64) -> RequestOp) -> TxnRequest {
        let ops = |v: &[O]| v.iter().take(MAX_TXN_OPS).map(|o| op(o, current)).collect();
        TxnRequest {
            compare: self
                .compares
                .iter()
                .take(MAX_TXN_OPS)
                .map(|c| c.compare(current))
                .collect(),
            success: ops(&self.success),
            failure: ops(&self.failure),
        }
    }
}

/// Runs one input; panics on a finding.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let store = Store::new(StoreConfig::default());
    let mut model = Model::default();
    for _ in 0..MAX_OPS {
        if u.is_empty() {
            break;
        }
        let Ok(op) = Op::arbitrary(&mut u) else {
            break;
        };
        apply(&store, &mut model, &op);
        assert_eq!(
            (store.current_revision(), store.compacted_revision()),
            (model.revision, model.compacted),
            "current and compacted revision after {op:?}"
        );
    }
    check_history(&store, &model);
}

/// Applies `op` to both and compares the answers.
pub fn apply(store: &Store, model: &mut Model, op: &Op) {
    model.matched.borrow_mut().clear();
    let current = model.revision;
    match op {
        Op::Put(p) => {
            let req = p.request();
            let want = model.put(&req);
            assert_eq!(store.put(req.clone()), want, "{req:?}");
        }
        Op::Delete(d) => {
            let req = d.request();
            let want = model.delete(&req);
            assert_eq!(store.delete_range(req.clone()), want, "{req:?}");
        }
        Op::Range(r) => {
            let req = r.request(current);
            let want = model.range(&req);
            let got = store.range(&req);
            let matched = model.matched.borrow();
            match (&want, &got) {
                (Ok(w), Ok(g)) => assert!(
                    same_range(&req, w, g, &matched[0]),
                    "{req:?}\nmodel: {w:?}\nstore: {g:?}"
                ),
                _ => assert_eq!(got, want, "{req:?}"),
            }
        }
        Op::Txn(t) => {
            let req = t.request(current, BranchOp::request);
            let want = model.txn(&req, StoreConfig::default().max_txn_ops);
            let got = store.txn(req.clone());
            match (&want, &got) {
                (Ok(w), Ok(g)) => {
                    let matched = model.matched.borrow();
                    let mut matched = matched.iter();
                    assert!(
                        same_txn(&req, w, g, &mut matched),
                        "{req:#?}\nmodel: {w:#?}\nstore: {g:#?}"
                    );
                }
                _ => assert_eq!(got, want, "{req:#?}"),
            }
        }
        Op::Compact(n) => {
            let rev = revision(*n, current);
            assert_eq!(store.compact(rev), model.compact(rev), "compact {rev}");
        }
        Op::Grant { lease, ttl } => {
            let id = pick(&LEASES[1..], *lease);
            let ttl = match ttl {
                255 => ephd::lease::MAX_LEASE_TTL + 1,
                n => *n as i64 - 10,
            };
            let got = store
                .lease_grant(id, ttl)
                .map(|g| (g.id, g.ttl, g.revision));
            let want = model.grant(id, ttl).map(|t| (id, t, model.revision));
            assert_eq!(got, want, "grant {id} ttl {ttl}");
        }
        Op::Revoke(lease) => {
            let id = pick(&LEASES[1..], *lease);
            assert_eq!(store.lease_revoke(id), model.revoke(id), "revoke {id}");
        }
        Op::ExpireAll => {
            let later = Instant::now() + Duration::from_secs(100_000_000);
            let expired = store.revoke_expired(later, usize::MAX);
            let mut ids: Vec<i64> = expired.iter().map(|(id, _)| *id).collect();
            ids.sort_unstable();
            let granted: Vec<i64> = model.leases.keys().copied().collect();
            assert_eq!(ids, granted, "every lease expires");
            for (id, got) in expired {
                assert_eq!(got, model.revoke(id), "expiry of lease {id}");
            }
        }
        Op::KeepAlive(lease) => {
            let id = pick(&LEASES[1..], *lease);
            let got = store.lease_keep_alive(id);
            let ttl = model.leases.get(&id).copied().unwrap_or(0);
            assert_eq!((got.id, got.ttl, got.revision), (id, ttl, current));
        }
        Op::TimeToLive(lease) => {
            let id = pick(&LEASES[1..], *lease);
            let got = store.lease_time_to_live(id, true);
            assert_eq!((got.id, got.revision), (id, current));
            match model.leases.get(&id) {
                Some(&ttl) => {
                    assert_eq!(got.granted_ttl, ttl, "granted TTL of {id}");
                    assert!((0..=ttl).contains(&got.ttl), "{got:?}");
                    assert_eq!(got.keys, model.lease_keys(id), "keys of lease {id}");
                }
                None => assert_eq!((got.ttl, got.granted_ttl, got.keys.len()), (-1, 0, 0)),
            }
        }
        Op::Leases => {
            let got = store.lease_leases();
            let want: Vec<i64> = model.leases.keys().copied().collect();
            assert_eq!((got.ids, got.revision), (want, current));
        }
    }
}

/// Compares txn responses op by op, ranges with [`same_range`], taking each
/// range's matched kvs from `matched` in the order the model answered them.
fn same_txn<'m>(
    req: &TxnRequest,
    want: &TxnResponse,
    got: &TxnResponse,
    matched: &mut impl Iterator<Item = &'m Vec<ephd::mvcc::Kv>>,
) -> bool {
    if (want.revision, want.succeeded, want.responses.len())
        != (got.revision, got.succeeded, got.responses.len())
    {
        return false;
    }
    let ops = if want.succeeded {
        &req.success
    } else {
        &req.failure
    };
    ops.iter()
        .zip(want.responses.iter().zip(&got.responses))
        .all(|(op, pair)| match (op, pair) {
            (RequestOp::Range(r), (ResponseOp::Range(w), ResponseOp::Range(g))) => {
                let m = matched.next().expect("the model matched every range");
                same_range(r, w, g, m)
            }
            (RequestOp::Txn(t), (ResponseOp::Txn(w), ResponseOp::Txn(g))) => {
                same_txn(t, w, g, matched)
            }
            (_, (w, g)) => w == g,
        })
}

/// Reads every retained revision back whole, checks that compacted ones
/// are refused, and compares the change log.
pub fn check_history(store: &Store, model: &Model) {
    let everything = |revision| RangeRequest {
        key: Bytes::from_static(b"\0"),
        range_end: Bytes::from_static(b"\0"),
        revision,
        ..Default::default()
    };
    for rev in 1..=model.revision {
        let got = store.range(&everything(rev));
        if rev < model.compacted {
            assert_eq!(
                got.map(drop),
                Err(ephd::error::Error::Compacted),
                "revision {rev}"
            );
            continue;
        }
        let got = got.expect("a retained revision reads");
        assert_eq!(
            got.kvs,
            model.visible(b"\0", b"\0", rev),
            "everything at revision {rev}"
        );
    }
    let (compacted, events, limited) = store.read_log(0, usize::MAX, usize::MAX);
    assert_eq!(compacted, model.compacted);
    assert!(!limited);
    let got: Vec<_> = events.into_iter().map(|e| (e.revision, e.event)).collect();
    let want: Vec<_> = model
        .events
        .iter()
        .filter(|(rev, _)| *rev >= model.compacted)
        .cloned()
        .collect();
    assert_eq!(got, want, "the change log");
}
