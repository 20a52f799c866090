//! A small reference model of etcd's MVCC semantics, for the `store_ops`
//! target: every key's full history in a `BTreeMap`, a revision counter, the
//! lease table and the change log, with no concurrency, no indexes and no
//! pruning. It is meant to be obviously right rather than fast: each rule is
//! written the plain way (a txn works on a copy that is committed or thrown
//! away; a read walks every key), so that when it and the store disagree,
//! the store is the suspect.
//!
//! It answers in the store's own response types so the two can be compared
//! with `==`; [`same_range`] allows for the one freedom etcd leaves (the
//! order of kvs that tie under a non-key sort).

use bytes::Bytes;
use ephd::error::Error;
use ephd::mvcc::{
    Compare, CompareResult, CompareTarget, DeleteRequest, DeleteResponse, Event, EventKind,
    KeyValue, Kv, PutRequest, PutResponse, RangeRequest, RangeResponse, RequestOp, ResponseOp,
    SortOrder, SortTarget, TxnRequest, TxnResponse,
};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// etcd's lease TTL floor (`LessorConfig::default().min_ttl`).
pub const MIN_TTL: i64 = 2;

/// One key's history: `(revision, value)` in revision order, `None` for a
/// deletion. At most one entry per revision: a txn that writes a key twice
/// leaves its last write.
type History = Vec<(i64, Option<Kv>)>;

/// The model's whole state.
#[derive(Debug, Clone)]
pub struct Model {
    /// The current revision (1 in an empty store, as in etcd).
    pub revision: i64,
    /// The compacted revision, -1 until the first compaction.
    pub compacted: i64,
    /// Every key's every version, never pruned.
    pub history: BTreeMap<Bytes, History>,
    /// Granted leases: ID → TTL.
    pub leases: BTreeMap<i64, i64>,
    /// Every event ever committed, with its revision, in order.
    pub events: Vec<(i64, Event)>,
    /// For each range answered since the checker last cleared it, in order:
    /// every kv that matched before the limit (what [`same_range`] needs to
    /// judge an answer whose ties are ordered differently).
    pub matched: RefCell<Vec<Vec<Kv>>>,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            revision: 1,
            compacted: -1,
            history: BTreeMap::new(),
            leases: BTreeMap::new(),
            events: Vec::new(),
            matched: RefCell::new(Vec::new()),
        }
    }
}

/// Whether `k` is in `[key, end)` with etcd's conventions: an empty end is
/// the single key, `"\0"` means no upper bound.
pub fn in_range(k: &[u8], key: &[u8], end: &[u8]) -> bool {
    match end {
        [] => k == key,
        [0] => k >= key,
        _ => key <= k && k < end,
    }
}

impl Model {
    /// The version of `key` a reader at `rev` sees.
    pub fn get(&self, key: &[u8], rev: i64) -> Option<Kv> {
        let h = self.history.get(key)?;
        h.iter().rev().find(|(r, _)| *r <= rev)?.1.clone()
    }

    /// The newest version of `key`, including writes of the txn running.
    fn latest(&self, key: &[u8]) -> Option<Kv> {
        self.history.get(key)?.last()?.1.clone()
    }

    /// Every kv a reader at `rev` sees in the range, in key order.
    pub fn visible(&self, key: &[u8], end: &[u8], rev: i64) -> Vec<Kv> {
        self.history
            .keys()
            .filter(|k| in_range(k, key, end))
            .filter_map(|k| self.get(k, rev))
            .collect()
    }

    /// Keys attached to `lease`: live keys whose newest version names it.
    pub fn lease_keys(&self, lease: i64) -> Vec<Bytes> {
        self.history
            .keys()
            .filter(|k| self.latest(k).is_some_and(|kv| kv.lease == lease))
            .cloned()
            .collect()
    }

    /// etcd's rule for the revision a read may ask for.
    fn read_revision(&self, requested: i64, current: i64) -> Result<i64, Error> {
        if requested > current {
            return Err(Error::FutureRev);
        }
        let rev = if requested <= 0 { current } else { requested };
        if rev < self.compacted {
            return Err(Error::Compacted);
        }
        Ok(rev)
    }

    /// A Range at the current revision (or the one asked for).
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, Error> {
        let rev = self.read_revision(req.revision, self.revision)?;
        Ok(self.range_at(req, rev, self.revision))
    }

    /// A Range read at `rev`, reporting `header` as its revision.
    fn range_at(&self, req: &RangeRequest, rev: i64, header: i64) -> RangeResponse {
        let all = self.visible(&req.key, &req.range_end, rev);
        let count = all.len() as i64;
        if req.count_only {
            self.matched.borrow_mut().push(Vec::new());
            return RangeResponse {
                revision: header,
                kvs: Vec::new(),
                more: false,
                count,
                keys_only: req.keys_only,
            };
        }
        let keep = |kv: &Kv| {
            (req.min_mod_revision == 0 || kv.mod_revision >= req.min_mod_revision)
                && (req.max_mod_revision == 0 || kv.mod_revision <= req.max_mod_revision)
                && (req.min_create_revision == 0 || kv.create_revision >= req.min_create_revision)
                && (req.max_create_revision == 0 || kv.create_revision <= req.max_create_revision)
        };
        let filtered = req.min_mod_revision != 0
            || req.max_mod_revision != 0
            || req.min_create_revision != 0
            || req.max_create_revision != 0;
        let mut kvs: Vec<Kv> = all.into_iter().filter(keep).collect();
        // etcd's quirk: without a sort order or filters, it reads only one
        // kv past the limit (in key order) and sorts those, even when a
        // non-key target makes it sort ascending below.
        if req.sort_order == SortOrder::None && !filtered && req.limit > 0 {
            kvs.truncate(req.limit as usize + 1);
        }
        // Stable sorts: ties stay in key order (the store may order them
        // otherwise; see `same_range`).
        let key = sort_key(req.sort_target);
        match effective_order(req) {
            SortOrder::Ascend => kvs.sort_by_key(key),
            SortOrder::Descend => kvs.sort_by_key(|kv| std::cmp::Reverse(key(kv))),
            _ => {}
        }
        self.matched.borrow_mut().push(kvs.clone());
        let limit = usize::try_from(req.limit).unwrap_or(0);
        let more = limit > 0 && kvs.len() > limit;
        if more {
            kvs.truncate(limit);
        }
        RangeResponse {
            revision: header,
            kvs,
            more,
            count,
            keys_only: req.keys_only,
        }
    }

    /// Compacts at `rev`; returns the current revision.
    pub fn compact(&mut self, rev: i64) -> Result<i64, Error> {
        if rev <= self.compacted {
            return Err(Error::Compacted);
        }
        if rev > self.revision {
            return Err(Error::FutureRev);
        }
        self.compacted = rev;
        Ok(self.revision)
    }

    /// Grants lease `id`; returns the effective TTL.
    pub fn grant(&mut self, id: i64, ttl: i64) -> Result<i64, Error> {
        if ttl > ephd::lease::MAX_LEASE_TTL {
            return Err(Error::LeaseTtlTooLarge);
        }
        if self.leases.contains_key(&id) {
            return Err(Error::LeaseExist);
        }
        let ttl = ttl.max(MIN_TTL);
        self.leases.insert(id, ttl);
        Ok(ttl)
    }

    /// Revokes lease `id`, deleting its keys at one new revision (none when
    /// it has no keys); returns the revision after.
    pub fn revoke(&mut self, id: i64) -> Result<i64, Error> {
        if self.leases.remove(&id).is_none() {
            return Err(Error::LeaseNotFound);
        }
        let keys = self.lease_keys(id);
        if keys.is_empty() {
            return Ok(self.revision);
        }
        let mut w = Write::begin(self);
        for k in keys {
            w.delete_key(&k);
        }
        Ok(w.commit())
    }

    /// A unary Put.
    pub fn put(&mut self, req: &PutRequest) -> Result<PutResponse, Error> {
        check_put(req)?;
        if req.lease != 0 && !self.leases.contains_key(&req.lease) {
            return Err(Error::LeaseNotFound);
        }
        let op = RequestOp::Put(req.clone());
        self.check_writes(&[&op])?;
        let mut w = Write::begin(self);
        let resp = w.put(req);
        w.commit();
        // A put always writes, so its response already has the new revision.
        Ok(resp)
    }

    /// A unary DeleteRange.
    pub fn delete(&mut self, req: &DeleteRequest) -> Result<DeleteResponse, Error> {
        if req.key.is_empty() {
            return Err(Error::EmptyKey);
        }
        let mut w = Write::begin(self);
        let resp = w.delete(req);
        let rev = w.commit();
        Ok(DeleteResponse {
            revision: rev,
            ..resp
        })
    }

    /// A Txn with etcd's checks, in etcd's order.
    pub fn txn(&mut self, req: &TxnRequest, max_ops: usize) -> Result<TxnResponse, Error> {
        check_ops(req, max_ops as i64)?;
        check_no_double_writes(&req.success)?;
        check_no_double_writes(&req.failure)?;
        // Every compare, nested ones too, sees the state before the txn.
        let taken = self.taken_ops(req);
        let read_only = req
            .success
            .iter()
            .chain(&req.failure)
            .all(|op| matches!(op, RequestOp::Range(_)));
        if read_only {
            for op in &taken {
                if let RequestOp::Range(r) = op {
                    self.read_revision(r.revision, self.revision)?;
                }
            }
            let rev = self.revision;
            let responses = self
                .branch(req)
                .iter()
                .map(|op| match op {
                    RequestOp::Range(r) => {
                        let at = if r.revision > 0 { r.revision } else { rev };
                        ResponseOp::Range(self.range_at(r, at, rev))
                    }
                    _ => unreachable!("read-only"),
                })
                .collect();
            return Ok(TxnResponse {
                revision: rev,
                succeeded: self.holds(req),
                responses,
            });
        }
        self.check_writes(&taken)?;
        for op in &taken {
            if let RequestOp::Range(r) = op {
                self.read_revision(r.revision, self.revision)?;
            }
        }
        let before = self.clone();
        let mut w = Write::begin(self);
        let mut resp = w.run(&before, req);
        resp.revision = w.commit();
        Ok(resp)
    }

    /// Whether every compare of `req` holds now.
    fn holds(&self, req: &TxnRequest) -> bool {
        req.compare.iter().all(|c| self.compare(c))
    }

    fn branch<'r>(&self, req: &'r TxnRequest) -> &'r [RequestOp] {
        if self.holds(req) {
            &req.success
        } else {
            &req.failure
        }
    }

    /// The non-txn ops the txn will run, in order, nested txns flattened.
    fn taken_ops<'r>(&self, req: &'r TxnRequest) -> Vec<&'r RequestOp> {
        let mut out = Vec::new();
        for op in self.branch(req) {
            match op {
                RequestOp::Txn(t) => out.extend(self.taken_ops(t)),
                op => out.push(op),
            }
        }
        out
    }

    /// The checks a write makes against the state before it changes
    /// anything: a put that keeps the value or lease needs the key, a put
    /// with a lease needs the lease.
    fn check_writes(&self, ops: &[&RequestOp]) -> Result<(), Error> {
        for op in ops {
            if let RequestOp::Put(p) = op {
                if (p.ignore_value || p.ignore_lease) && self.latest(&p.key).is_none() {
                    return Err(Error::KeyNotFound);
                }
                if p.lease != 0 && !self.leases.contains_key(&p.lease) {
                    return Err(Error::LeaseNotFound);
                }
            }
        }
        Ok(())
    }

    /// Whether compare `c` holds: for every live key in its range, or, when
    /// there is none, for an all-zero key (a value compare then fails).
    pub fn compare(&self, c: &Compare) -> bool {
        let kvs = self.visible(&c.key, &c.range_end, self.revision);
        if kvs.is_empty() {
            if matches!(c.target, CompareTarget::Value(_)) {
                return false;
            }
            return compare_one(c, &KeyValue::default());
        }
        kvs.iter().all(|kv| compare_one(c, kv))
    }
}

fn compare_one(c: &Compare, kv: &KeyValue) -> bool {
    use std::cmp::Ordering::*;
    let ord = match &c.target {
        CompareTarget::Version(v) => kv.version.cmp(v),
        CompareTarget::Create(v) => kv.create_revision.cmp(v),
        CompareTarget::Mod(v) => kv.mod_revision.cmp(v),
        CompareTarget::Lease(v) => kv.lease.cmp(v),
        CompareTarget::Value(v) => kv.value.cmp(v),
        CompareTarget::Unknown => Equal,
    };
    match c.result {
        CompareResult::Equal => ord == Equal,
        CompareResult::NotEqual => ord != Equal,
        CompareResult::Greater => ord == Greater,
        CompareResult::Less => ord == Less,
        CompareResult::Unknown => true,
    }
}

/// etcd sorts ascending when a non-key target comes without an order.
fn effective_order(req: &RangeRequest) -> SortOrder {
    match (req.sort_order, req.sort_target) {
        (SortOrder::None, SortTarget::Key) => SortOrder::None,
        (SortOrder::None, _) => SortOrder::Ascend,
        (order, _) => order,
    }
}

/// What a sort compares; ties are possible for every target but the key.
fn sort_key(target: SortTarget) -> impl Fn(&Kv) -> (i64, Bytes) {
    move |kv: &Kv| match target {
        SortTarget::Version => (kv.version, Bytes::new()),
        SortTarget::Create => (kv.create_revision, Bytes::new()),
        SortTarget::Mod => (kv.mod_revision, Bytes::new()),
        SortTarget::Value => (0, kv.value.clone()),
        SortTarget::Key | SortTarget::Unknown => (0, kv.key.clone()),
    }
}

/// Whether `got` is an answer etcd could give where the model answered
/// `want` to `req`, `matched` being every kv the model found before the
/// limit: equal, except that kvs tying under a non-key sort may come in any
/// order, and a limit may cut between ties anywhere.
pub fn same_range(
    req: &RangeRequest,
    want: &RangeResponse,
    got: &RangeResponse,
    matched: &[Kv],
) -> bool {
    if want == got {
        return true;
    }
    if req.sort_target == SortTarget::Key || effective_order(req) == SortOrder::None {
        return false;
    }
    let key = sort_key(req.sort_target);
    let sort_keys = |r: &RangeResponse| r.kvs.iter().map(&key).collect::<Vec<_>>();
    let distinct: BTreeSet<&Bytes> = got.kvs.iter().map(|kv| &kv.key).collect();
    (want.revision, want.more, want.count, want.keys_only)
        == (got.revision, got.more, got.count, got.keys_only)
        && sort_keys(want) == sort_keys(got)
        && distinct.len() == got.kvs.len()
        && got.kvs.iter().all(|kv| matched.contains(kv))
}

/// etcd's stateless Put checks.
fn check_put(p: &PutRequest) -> Result<(), Error> {
    if p.key.is_empty() {
        return Err(Error::EmptyKey);
    }
    if p.ignore_value && !p.value.is_empty() {
        return Err(Error::ValueProvided);
    }
    if p.ignore_lease && p.lease != 0 {
        return Err(Error::LeaseProvided);
    }
    Ok(())
}

/// etcd's stateless txn checks: the op count (nested txns get what their
/// parent left of the budget), then compare keys, then every op of both
/// branches in order.
fn check_ops(req: &TxnRequest, budget: i64) -> Result<(), Error> {
    let ops = req
        .compare
        .len()
        .max(req.success.len())
        .max(req.failure.len()) as i64;
    if ops > budget {
        return Err(Error::TooManyOps);
    }
    if req.compare.iter().any(|c| c.key.is_empty()) {
        return Err(Error::EmptyKey);
    }
    for op in req.success.iter().chain(&req.failure) {
        match op {
            RequestOp::Range(r) if r.key.is_empty() => return Err(Error::EmptyKey),
            RequestOp::Range(r)
                if r.sort_order == SortOrder::Unknown || r.sort_target == SortTarget::Unknown =>
            {
                return Err(Error::InvalidSortOption)
            }
            RequestOp::Put(p) => check_put(p)?,
            RequestOp::Delete(d) if d.key.is_empty() => return Err(Error::EmptyKey),
            RequestOp::Txn(t) => check_ops(t, budget - ops)?,
            RequestOp::Empty => return Err(Error::KeyNotFound),
            _ => {}
        }
    }
    Ok(())
}

/// What one branch writes: the keys it puts and the intervals it deletes
/// (as `(key, end)`; a `"\0"` end is compared as plain bytes, so it covers
/// nothing here, as in etcd).
struct Writes {
    puts: BTreeSet<Bytes>,
    deletes: Vec<(Bytes, Bytes)>,
}

fn deleted(deletes: &[(Bytes, Bytes)], k: &Bytes) -> bool {
    deletes.iter().any(|(key, end)| {
        if end.is_empty() {
            k == key
        } else {
            key <= k && k < end
        }
    })
}

/// etcd's rule that a txn writes no key twice: within a branch, no key is
/// put twice or put inside a deleted interval, counting the writes of nested
/// txns, whose own two branches exclude each other.
fn check_no_double_writes(ops: &[RequestOp]) -> Result<(), Error> {
    branch_writes(ops).map(drop)
}

fn branch_writes(ops: &[RequestOp]) -> Result<Writes, Error> {
    // This level's deletes count against every put, nested or not, whatever
    // their order; a nested txn's deletes count against the puts of this
    // level and of the nested txns after it.
    let mut deletes: Vec<(Bytes, Bytes)> = ops
        .iter()
        .filter_map(|op| match op {
            RequestOp::Delete(d) => Some((d.key.clone(), d.range_end.clone())),
            _ => None,
        })
        .collect();
    let mut puts = BTreeSet::new();
    for op in ops {
        let RequestOp::Txn(t) = op else { continue };
        let then = branch_writes(&t.success)?;
        let otherwise = branch_writes(&t.failure)?;
        for k in &then.puts {
            if puts.contains(k) || deleted(&deletes, k) {
                return Err(Error::DuplicateKey);
            }
        }
        for k in &otherwise.puts {
            let clash = puts.contains(k) && !then.puts.contains(k);
            if clash || deleted(&deletes, k) {
                return Err(Error::DuplicateKey);
            }
        }
        puts.extend(then.puts);
        puts.extend(otherwise.puts);
        deletes.extend(then.deletes);
        deletes.extend(otherwise.deletes);
    }
    for op in ops {
        let RequestOp::Put(p) = op else { continue };
        if puts.contains(&p.key) || deleted(&deletes, &p.key) {
            return Err(Error::DuplicateKey);
        }
        puts.insert(p.key.clone());
    }
    Ok(Writes { puts, deletes })
}

/// One write in progress: it writes straight into the model at the next
/// revision, and [`Write::commit`] advances the revision only if something
/// was written.
struct Write<'m> {
    model: &'m mut Model,
    rev: i64,
    events: Vec<Event>,
}

impl<'m> Write<'m> {
    fn begin(model: &'m mut Model) -> Self {
        let rev = model.revision + 1;
        Write {
            model,
            rev,
            events: Vec::new(),
        }
    }

    fn changed(&self) -> bool {
        !self.events.is_empty()
    }

    /// The revision a reader inside the txn is at now.
    fn current(&self) -> i64 {
        if self.changed() {
            self.rev
        } else {
            self.model.revision
        }
    }

    fn record(&mut self, key: &Bytes, kv: Option<Kv>) {
        let h = self.model.history.entry(key.clone()).or_default();
        if h.last().is_some_and(|(r, _)| *r == self.rev) {
            h.pop();
        }
        h.push((self.rev, kv));
    }

    fn put(&mut self, p: &PutRequest) -> PutResponse {
        let prev = self.model.latest(&p.key);
        let before = self.model.get(&p.key, self.rev - 1);
        let kv = Arc::new(KeyValue {
            key: p.key.clone(),
            create_revision: prev.as_ref().map_or(self.rev, |kv| kv.create_revision),
            mod_revision: self.rev,
            version: prev.as_ref().map_or(1, |kv| kv.version + 1),
            value: match (&prev, p.ignore_value) {
                (Some(kv), true) => kv.value.clone(),
                _ => p.value.clone(),
            },
            lease: match (&prev, p.ignore_lease) {
                (Some(kv), true) => kv.lease,
                _ => p.lease,
            },
        });
        self.record(&p.key, Some(kv.clone()));
        self.events.push(Event {
            kind: EventKind::Put,
            kv,
            prev_kv: before,
        });
        PutResponse {
            revision: self.rev,
            prev_kv: if p.prev_kv { prev } else { None },
        }
    }

    fn delete_key(&mut self, key: &Bytes) -> Option<Kv> {
        let prev = self.model.latest(key)?;
        let before = self.model.get(key, self.rev - 1);
        self.record(key, None);
        self.events.push(Event {
            kind: EventKind::Delete,
            kv: Arc::new(KeyValue {
                key: key.clone(),
                mod_revision: self.rev,
                ..Default::default()
            }),
            prev_kv: before,
        });
        Some(prev)
    }

    fn delete(&mut self, d: &DeleteRequest) -> DeleteResponse {
        let keys: Vec<Bytes> = self
            .model
            .history
            .keys()
            .filter(|k| in_range(k, &d.key, &d.range_end))
            .cloned()
            .collect();
        let prev: Vec<Kv> = keys.iter().filter_map(|k| self.delete_key(k)).collect();
        DeleteResponse {
            revision: self.current(),
            deleted: prev.len() as i64,
            prev_kvs: if d.prev_kv { prev } else { Vec::new() },
        }
    }

    /// Runs the branch of `req` that `before` (the state before the txn)
    /// chooses, nested txns included.
    fn run(&mut self, before: &Model, req: &TxnRequest) -> TxnResponse {
        let succeeded = before.holds(req);
        let ops = if succeeded {
            &req.success
        } else {
            &req.failure
        };
        let responses = ops
            .iter()
            .map(|op| match op {
                RequestOp::Range(r) => {
                    let current = self.current();
                    let at = if r.revision > 0 { r.revision } else { current };
                    ResponseOp::Range(self.model.range_at(r, at, current))
                }
                RequestOp::Put(p) => ResponseOp::Put(self.put(p)),
                RequestOp::Delete(d) => ResponseOp::Delete(self.delete(d)),
                RequestOp::Txn(t) => ResponseOp::Txn(self.run(before, t)),
                RequestOp::Empty => unreachable!("refused by the checks"),
            })
            .collect();
        TxnResponse {
            revision: 0,
            succeeded,
            responses,
        }
    }

    /// Makes the write's revision current if it wrote anything; returns the
    /// revision after.
    fn commit(self) -> i64 {
        if self.changed() {
            self.model.revision = self.rev;
            let rev = self.rev;
            self.model
                .events
                .extend(self.events.into_iter().map(|e| (rev, e)));
        }
        self.model.revision
    }
}
