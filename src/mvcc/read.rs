//! Reads: Range, read-only txns, the change log for watchers, HashKV and
//! the list of live keys persistence writes.
//!
//! Every read picks a revision at or below the committed watermark and
//! reads each key under its own lock ([`LockedRead`]); none takes the
//! range-writer lock, so reads never wait for writers of other keys.

use super::compare::Path;
use super::log::LoggedEvent;
use super::range::{execute_range, execute_range_counted, walks_only_to_count, KvSource};
use super::store::Store;
use super::types::*;
use super::validate;
use super::view::LockedRead;
use crate::error::Result;
use bytes::Bytes;
use std::ops::Bound;

impl Store {
    /// Range with etcd's semantics.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse> {
        validate::check_range(req)?;
        let _gate = self.compaction_gate().read();
        let current = self.current_revision();
        let rev = self.check_read_revision(req.revision, current)?;
        if !walks_only_to_count(req) {
            return Ok(execute_range(req, rev, current, &LockedRead(self.index())));
        }
        // A page of a paged list: the page before it may have left its count.
        let pages = self.page_counts();
        let known = pages.get(&req.key, &req.range_end, rev);
        let resp = execute_range_counted(req, rev, current, &LockedRead(self.index()), known);
        if let (true, Some(last)) = (resp.more, resp.kvs.last()) {
            let left = resp.count - resp.kvs.len() as i64;
            pages.remember(&last.key, &req.range_end, rev, left);
        }
        Ok(resp)
    }

    /// A validated read-only txn, at the current revision.
    pub(super) fn read_txn(&self, req: &TxnRequest) -> Result<TxnResponse> {
        let _gate = self.compaction_gate().read();
        let rev = self.current_revision();
        let view = LockedRead(self.index());
        let path = Path::evaluate(req, &view, rev);
        path.visit(req, &mut |op| match op {
            RequestOp::Range(r) => self.check_read_revision(r.revision, rev).map(drop),
            _ => Ok(()),
        })?;
        let responses = path
            .ops(req)
            .iter()
            .map(|op| match op {
                RequestOp::Range(r) => {
                    let at = if r.revision > 0 { r.revision } else { rev };
                    ResponseOp::Range(execute_range(r, at, rev, &view))
                }
                _ => unreachable!("read-only txns hold only ranges"),
            })
            .collect();
        Ok(TxnResponse {
            revision: rev,
            succeeded: path.succeeded,
            responses,
        })
    }

    /// The events of the change log's revisions at or after `from`, up to
    /// `max_revisions` revisions or about `max_bytes` of keys and values
    /// (see [`EventLog::read_from`](super::EventLog::read_from)), with the
    /// compacted revision read atomically with them: a watcher checked
    /// against that revision can never miss revisions trimmed by a
    /// compaction racing the read.
    pub fn read_log(
        &self,
        from: i64,
        max_revisions: usize,
        max_bytes: usize,
    ) -> (i64, Vec<LoggedEvent>, bool) {
        let _gate = self.compaction_gate().read();
        let (events, limited) = self.log().read_from(from, max_revisions, max_bytes);
        (self.compacted_revision(), events, limited)
    }

    /// Every live key-value at the current revision, in key order, with that
    /// revision: what persistence writes.
    pub fn live_kvs(&self) -> (i64, Vec<Kv>) {
        let _gate = self.compaction_gate().read();
        let rev = self.current_revision();
        (rev, self.visible_kvs(rev))
    }

    /// Every key-value visible at `rev`, in key order; the caller holds the
    /// compaction gate, so the versions at `rev` stay.
    pub(super) fn visible_kvs(&self, rev: i64) -> Vec<Kv> {
        let mut out = Vec::new();
        LockedRead(self.index()).for_each_visible(
            &Bytes::from_static(b"\0"),
            &Bytes::from_static(b"\0"),
            rev,
            &mut |kv| out.push(kv.clone()),
        );
        out
    }

    /// A hash of every version in `(compacted, rev]`, stable for identical
    /// histories; the analogue of etcd's HashKV. Returns (hash, compacted, rev).
    pub fn hash_kv(&self, rev: i64) -> Result<(u32, i64, i64)> {
        let _gate = self.compaction_gate().read();
        let current = self.current_revision();
        let rev = self.check_read_revision(rev, current)?;
        let compacted = self.compacted_revision();
        let mut h: u32 = 0x811c_9dc5;
        let mut mix = |bytes: &[u8]| {
            for b in bytes {
                h ^= *b as u32;
                h = h.wrapping_mul(0x0100_0193);
            }
        };
        self.index()
            .for_range(Bound::Unbounded, None, &mut |entry| {
                let versions = entry.versions.read();
                for v in versions.iter().filter(|v| v.rev <= rev) {
                    mix(&entry.key);
                    mix(&v.rev.to_be_bytes());
                    match &v.kv {
                        Some(kv) => {
                            mix(&kv.value);
                            mix(&kv.lease.to_be_bytes());
                        }
                        None => mix(b"\xfftombstone"),
                    }
                }
                true
            });
        Ok((h, compacted, rev))
    }
}
