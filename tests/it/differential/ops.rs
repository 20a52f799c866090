//! The operations of the differential suite and their seeded generator.
//!
//! Keys come from a small space with shared prefixes so that operations
//! collide. Server-chosen lease ids cannot be known in advance, so requests
//! refer to "the n-th server-chosen lease" through `issued_lease(n)` markers
//! that each target resolves to its own id before sending.

use bytes::Bytes;
use ephd::proto::etcdserverpb::{
    compare, range_request, request_op, watch_create_request, CompactionRequest, Compare,
    DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest,
    LeaseTimeToLiveRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, WatchCreateRequest,
};

use super::rng::Rng;

/// Lease ids at and above this value are markers for server-chosen leases.
pub const ISSUED_BASE: i64 = 0x7EEE_0000_0000_0000;
/// Stands for a lease a target failed to issue (never exists anywhere).
pub const UNKNOWN_LEASE: i64 = 0x7EED_0000_0000_0001;

/// Marker for the `n`-th lease granted with ID 0 (server-chosen).
pub fn issued_lease(n: usize) -> i64 {
    ISSUED_BASE + n as i64
}

/// Client-chosen lease ids. Assumed never to be picked by a server itself
/// early on (etcd's generated ids are large member-derived numbers).
pub const CLIENT_LEASE_IDS: [i64; 4] = [1, 2, 1000, i64::MAX];

/// A lease id that no test ever grants.
const NEVER_GRANTED: i64 = 777_777;

/// The key space: few keys with shared prefixes, so that ops collide.
pub const KEYS: [&str; 20] = [
    "a", "a/1", "a/2", "a/b", "a/b/c", "ab", "b", "b/1", "b/2", "ba", "foo", "foo/bar", "foo/baz",
    "foo0", "fop", "k", "k/x", "k/y", "z", "zz",
];
const MISSING_KEYS: [&str; 3] = ["a/0", "m", "nokey"];
const PREFIXES: [&str; 10] = ["a", "a/", "a/b", "b", "b/", "foo", "foo/", "k/", "z", "q"];
const VALUES: [&[u8]; 8] = [
    b"",
    b"v",
    b"v1",
    b"v2",
    b"x",
    b"value-3",
    b"\xff\x00binary",
    b"a somewhat longer value to vary the sizes",
];

/// One differential operation (lease fields may hold issued-lease markers).
#[derive(Debug, Clone)]
pub enum Op {
    Put(PutRequest),
    Range(RangeRequest),
    Delete(DeleteRangeRequest),
    Txn(TxnRequest),
    Compact(CompactionRequest),
    LeaseGrant(LeaseGrantRequest),
    /// Grant (edge-case or short TTL) and, if granted, revoke right away, so
    /// no time-based expiry can make the run nondeterministic.
    LeaseGrantRevoke(LeaseGrantRequest),
    LeaseRevoke(LeaseRevokeRequest),
    LeaseTimeToLive(LeaseTimeToLiveRequest),
    LeaseLeases,
    LeaseKeepAlive(LeaseKeepAliveRequest),
    WatchCreate {
        stream: usize,
        req: WatchCreateRequest,
    },
    WatchProgress {
        stream: usize,
    },
}

/// What the generator knows about the reference server's state.
#[derive(Debug, Default)]
pub struct Model {
    /// Latest store revision seen in a reference response header.
    pub rev: i64,
    /// Latest successful compaction revision (0 = none).
    pub compact_rev: i64,
    /// How many leases were granted with ID 0 so far.
    pub issued: usize,
    /// How many watches were created so far.
    pub watches: usize,
    /// Per ordinary stream: `None` while it has no live watch, else whether
    /// all of its watches started at the current revision. etcd 3.6
    /// answers a progress request only while every watcher of the stream
    /// is synced, and a watcher replaying history syncs on a 100 ms loop,
    /// so requests go only to streams that are `Some(true)`, where its
    /// answer is deterministic.
    pub progress_streams: [Option<bool>; WATCH_STREAMS],
}

/// Number of ordinary watch streams per target (the history watch has its
/// own extra stream).
pub const WATCH_STREAMS: usize = 3;
/// Upper bound of watches created per run, to keep the final sync cheap.
const MAX_WATCHES: usize = 30;

fn bytes(s: &[u8]) -> Bytes {
    Bytes::copy_from_slice(s)
}

/// etcd's prefix range end: increment the last byte below 0xff.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Seeded generator of ops; reads the model to pick relevant revisions.
pub struct Generator {
    rng: Rng,
}

impl Generator {
    /// A generator whose op sequence is fixed by `seed` (given the same
    /// reference answers, which drive `Model`).
    pub fn new(seed: u64) -> Generator {
        Generator {
            rng: Rng::new(seed),
        }
    }

    /// The next op, choosing revisions and leases relevant to `m`.
    pub fn next_op(&mut self, m: &Model) -> Op {
        let r = &mut self.rng;
        match r.below(100) {
            0..=21 => Op::Put(self.put(m, true)),
            22..=39 => Op::Range(self.range(m, true)),
            40..=47 => Op::Delete(self.delete(true)),
            48..=65 => {
                let mut txn = self.txn(m, 0);
                avoid_etcd_txn_panic(&mut txn);
                Op::Txn(txn)
            }
            66..=67 => Op::Compact(self.compact(m)),
            68..=70 => Op::LeaseGrant(self.lease_grant()),
            71 => Op::LeaseGrantRevoke(self.lease_grant_edge()),
            72..=73 => Op::LeaseRevoke(LeaseRevokeRequest {
                id: self.lease_ref(m),
            }),
            74..=77 => Op::LeaseTimeToLive(LeaseTimeToLiveRequest {
                id: self.lease_ref(m),
                keys: self.rng.chance(60),
            }),
            78..=79 => Op::LeaseLeases,
            80..=81 => Op::LeaseKeepAlive(LeaseKeepAliveRequest {
                id: self.lease_ref(m),
            }),
            82..=86 if m.watches < MAX_WATCHES => Op::WatchCreate {
                stream: self.rng.below(WATCH_STREAMS),
                req: self.watch_create(m),
            },
            82..=88 => {
                let streams: Vec<usize> = (0..WATCH_STREAMS)
                    .filter(|s| m.progress_streams[*s] == Some(true))
                    .collect();
                if streams.is_empty() {
                    Op::Put(self.put(m, true))
                } else {
                    Op::WatchProgress {
                        stream: streams[self.rng.below(streams.len())],
                    }
                }
            }
            _ => Op::Put(self.put(m, true)),
        }
    }

    fn key(&mut self) -> Bytes {
        let r = &mut self.rng;
        if r.chance(8) {
            bytes(r.pick(&MISSING_KEYS).as_bytes())
        } else {
            bytes(r.pick(&KEYS).as_bytes())
        }
    }

    /// A (key, range_end) pair: single key, prefix, from-key, all keys,
    /// explicit range, or (rarely) the invalid empty key.
    fn key_range(&mut self, allow_empty_key: bool) -> (Bytes, Bytes) {
        let r = &mut self.rng;
        match r.below(100) {
            0..=39 => (self.key(), Bytes::new()),
            40..=64 => {
                let p = r.pick(&PREFIXES).as_bytes();
                (bytes(p), bytes(&prefix_end(p)))
            }
            65..=74 => (self.key(), bytes(b"\0")),
            75..=82 => (bytes(b"\0"), bytes(b"\0")),
            83..=96 => {
                let a = r.pick(&KEYS).as_bytes();
                let b = r.pick(&KEYS).as_bytes();
                let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
                if r.chance(15) {
                    (bytes(hi), bytes(lo)) // end before start: empty range
                } else {
                    (bytes(lo), bytes(hi))
                }
            }
            _ if allow_empty_key => (Bytes::new(), Bytes::new()),
            _ => (self.key(), Bytes::new()),
        }
    }

    fn value(&mut self) -> Bytes {
        bytes(self.rng.pick::<&[u8]>(&VALUES))
    }

    /// A lease reference: none, issued, client-chosen, or never granted.
    fn lease_ref(&mut self, m: &Model) -> i64 {
        let r = &mut self.rng;
        match r.below(100) {
            0..=49 if m.issued > 0 => issued_lease(r.below(m.issued)),
            0..=79 => *r.pick(&CLIENT_LEASE_IDS),
            _ => NEVER_GRANTED,
        }
    }

    fn put_lease(&mut self, m: &Model) -> i64 {
        if self.rng.chance(70) {
            0
        } else {
            self.lease_ref(m)
        }
    }

    fn put(&mut self, m: &Model, top: bool) -> PutRequest {
        // Empty keys are invalid; rarer inside txns, where they fail it all.
        let key = if self.rng.below(200) < if top { 4 } else { 1 } {
            Bytes::new()
        } else {
            self.key()
        };
        let ignore_value = self.rng.chance(8);
        let value = if ignore_value && self.rng.chance(75) {
            Bytes::new()
        } else {
            self.value()
        };
        let ignore_lease = self.rng.chance(8);
        let lease = if ignore_lease && self.rng.chance(75) {
            0
        } else {
            self.put_lease(m)
        };
        PutRequest {
            key,
            value,
            lease,
            prev_kv: self.rng.chance(40),
            ignore_value,
            ignore_lease,
        }
    }

    /// A revision to read at: current, historical, compacted or future.
    fn read_revision(&mut self, m: &Model) -> i64 {
        let r = &mut self.rng;
        match r.below(100) {
            0..=49 => 0,
            50..=59 => m.rev,
            60..=79 => r.between(1, m.rev.max(1)),
            80..=84 => m.compact_rev,
            85..=89 => (m.compact_rev - 1).max(0),
            90..=94 => m.rev + 1,
            _ => m.rev + r.between(2, 10),
        }
    }

    fn range(&mut self, m: &Model, top: bool) -> RangeRequest {
        let (key, range_end) = self.key_range(top);
        let r = &mut self.rng;
        let limit = *r.pick(&[0, 0, 0, 0, 1, 2, 3, 10]);
        let rev_filter = |r: &mut Rng| {
            if r.chance(85) {
                0
            } else {
                r.between(1, m.rev.max(1) + 1)
            }
        };
        let (min_mod, max_mod) = (rev_filter(r), rev_filter(r));
        let (min_create, max_create) = (rev_filter(r), rev_filter(r));
        let sort_order = if r.chance(60) { 0 } else { r.below(3) as i32 };
        let sort_target = if r.chance(50) { 0 } else { r.below(5) as i32 };
        RangeRequest {
            key,
            range_end,
            limit,
            revision: self.read_revision(m),
            sort_order,
            sort_target,
            serializable: self.rng.chance(30),
            keys_only: self.rng.chance(15),
            count_only: self.rng.chance(10),
            min_mod_revision: min_mod,
            max_mod_revision: max_mod,
            min_create_revision: min_create,
            max_create_revision: max_create,
        }
    }

    fn delete(&mut self, top: bool) -> DeleteRangeRequest {
        let (key, range_end) = self.key_range(top);
        DeleteRangeRequest {
            key,
            range_end,
            prev_kv: self.rng.chance(50),
        }
    }

    fn compare(&mut self, m: &Model) -> Compare {
        use compare::{CompareTarget, TargetUnion};
        let r = &mut self.rng;
        let result = r.below(4) as i32;
        let target = r.below(5) as i32;
        let key = self.key();
        let range_end = match self.rng.below(10) {
            0 => bytes(&prefix_end(&key)),
            1 => bytes(b"\0"),
            _ => Bytes::new(),
        };
        let r = &mut self.rng;
        let union = match CompareTarget::try_from(target).expect("valid target") {
            CompareTarget::Version => TargetUnion::Version(r.between(0, 4)),
            CompareTarget::Create => TargetUnion::CreateRevision(r.between(0, m.rev + 1)),
            CompareTarget::Mod => TargetUnion::ModRevision(r.between(0, m.rev + 1)),
            CompareTarget::Value => TargetUnion::Value(bytes(r.pick::<&[u8]>(&VALUES))),
            CompareTarget::Lease => {
                let lease = if r.chance(40) { 0 } else { self.lease_ref(m) };
                TargetUnion::Lease(lease)
            }
        };
        Compare {
            result,
            target,
            key,
            range_end,
            target_union: Some(union),
        }
    }

    fn request_op(&mut self, m: &Model, depth: usize) -> RequestOp {
        use request_op::Request;
        let request = match self.rng.below(100) {
            0..=39 => Request::RequestPut(self.put(m, false)),
            40..=69 => Request::RequestRange(self.range(m, false)),
            70..=89 => Request::RequestDeleteRange(self.delete(false)),
            _ if depth < 2 => Request::RequestTxn(self.txn(m, depth + 1)),
            _ => Request::RequestRange(self.range(m, false)),
        };
        RequestOp {
            request: Some(request),
        }
    }

    fn ops(&mut self, m: &Model, depth: usize) -> Vec<RequestOp> {
        let n = self.rng.below(4);
        (0..n).map(|_| self.request_op(m, depth)).collect()
    }

    fn txn(&mut self, m: &Model, depth: usize) -> TxnRequest {
        let n = self.rng.below(4);
        TxnRequest {
            compare: (0..n).map(|_| self.compare(m)).collect(),
            success: self.ops(m, depth),
            failure: self.ops(m, depth),
        }
    }

    fn compact(&mut self, m: &Model) -> CompactionRequest {
        let r = &mut self.rng;
        let revision = match r.below(10) {
            0..=4 => r.between(m.compact_rev + 1, m.rev),
            5 => m.rev,
            6 => m.compact_rev,
            7 => (m.compact_rev - 1).max(0),
            8 => m.rev + 1,
            _ => m.rev + 100,
        };
        CompactionRequest {
            revision,
            physical: r.chance(50),
        }
    }

    fn lease_grant(&mut self) -> LeaseGrantRequest {
        let r = &mut self.rng;
        LeaseGrantRequest {
            ttl: *r.pick(&[600, 1000, 3600]),
            id: if r.chance(60) {
                0
            } else {
                *r.pick(&CLIENT_LEASE_IDS)
            },
        }
    }

    fn lease_grant_edge(&mut self) -> LeaseGrantRequest {
        let r = &mut self.rng;
        LeaseGrantRequest {
            ttl: *r.pick(&[-1, 0, 1, 2, 5, 9_000_000_000, 9_000_000_001]),
            id: if r.chance(60) { 0 } else { 4242 },
        }
    }

    fn watch_create(&mut self, m: &Model) -> WatchCreateRequest {
        use watch_create_request::FilterType;
        let (key, range_end) = loop {
            let (k, e) = self.key_range(false);
            // Inverted ranges are left to Range/DeleteRange: their watch
            // semantics are not something clients rely on.
            if e.is_empty() || e.as_ref() == b"\0" || k < e {
                break (k, e);
            }
        };
        let r = &mut self.rng;
        let start_revision = match r.below(10) {
            0..=3 => 0,
            4..=6 => r.between(1, m.rev.max(1)),
            7 => (m.compact_rev - 1).max(0),
            8 => m.rev,
            _ => m.rev + 1,
        };
        // etcd compacts away tombstones *at* the compaction revision (in
        // the background unless physical), so a watch starting exactly
        // there may or may not report those deletes: avoid that race.
        let start_revision = if start_revision == m.compact_rev && start_revision > 0 {
            start_revision + 1
        } else {
            start_revision
        };
        let mut filters = Vec::new();
        if r.chance(20) {
            filters.push(FilterType::Noput as i32);
        }
        if r.chance(20) {
            filters.push(FilterType::Nodelete as i32);
        }
        WatchCreateRequest {
            key,
            range_end,
            start_revision,
            progress_notify: false,
            filters,
            prev_kv: r.chance(50),
            watch_id: 0,
            fragment: false,
        }
    }
}

/// etcd 3.4's duplicate-key check ignores from-key deletes (`range_end`
/// "\0"), so a txn may delete a key and then put it; if that put has
/// `ignore_value` / `ignore_lease`, etcd finds no key while applying and
/// panics ("unexpected error during txn") — the server dies. Such txns say
/// nothing about ephd, so drop the ignore flags whenever the txn contains a
/// from-key delete anywhere.
fn avoid_etcd_txn_panic(txn: &mut TxnRequest) {
    fn has_from_key_delete(t: &TxnRequest) -> bool {
        t.success
            .iter()
            .chain(&t.failure)
            .any(|op| match &op.request {
                Some(request_op::Request::RequestDeleteRange(d)) => d.range_end.as_ref() == b"\0",
                Some(request_op::Request::RequestTxn(t)) => has_from_key_delete(t),
                _ => false,
            })
    }
    fn clear_ignore_flags(t: &mut TxnRequest) {
        for op in t.success.iter_mut().chain(t.failure.iter_mut()) {
            match &mut op.request {
                Some(request_op::Request::RequestPut(p)) => {
                    p.ignore_value = false;
                    p.ignore_lease = false;
                }
                Some(request_op::Request::RequestTxn(t)) => clear_ignore_flags(t),
                _ => {}
            }
        }
    }
    if has_from_key_delete(txn) {
        clear_ignore_flags(txn);
    }
}

/// True when `key` lies in etcd's interpretation of (`start`, `end`).
pub fn in_range(key: &[u8], start: &[u8], end: &[u8]) -> bool {
    match end {
        [] => key == start,
        [0] => key >= start,
        _ => key >= start && key < end,
    }
}

/// Sort targets whose ties etcd orders with Go's unstable sort.
pub fn sorts_by_non_key(req: &RangeRequest) -> bool {
    req.sort_target != range_request::SortTarget::Key as i32
}
