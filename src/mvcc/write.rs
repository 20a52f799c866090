//! How a write changes key histories: a write txn (Put and DeleteRange are
//! one-op txns) and a lease revocation, each at one new revision.
//!
//! Called only from the apply path (`apply.rs`), which has validated the
//! request. The order of etcd's checks is kept: puts along the whole taken
//! path first (the ignore flags, then the lease, op by op), then ranges,
//! all before anything changes, so a failed check changes nothing.

use super::compare::Path;
use super::entry::Entry;
use super::history::Version;
use super::index::EntryRef;
use super::journal::Change;
use super::locks::{KeyAccess, LockPlan, WriteView};
use super::range::execute_range;
use super::store::Store;
use super::types::*;
use crate::error::{Error, Result};
use bytes::Bytes;
use std::sync::Arc;

/// The state of one write while its ops run.
struct Pending {
    /// The write's revision (the current one if it changes nothing).
    rev: i64,
    /// The revision before it.
    begin: i64,
    /// Whether an op has changed something yet.
    changed: bool,
    /// The events so far, in op order.
    events: Vec<Event>,
}

impl Pending {
    /// A write at `rev`, the revision after `begin`; for a write that
    /// changes nothing, `rev == begin`.
    fn new(rev: i64, begin: i64) -> Self {
        Pending {
            rev,
            begin,
            changed: false,
            events: Vec::new(),
        }
    }
}

impl Store {
    /// Runs a validated write txn with its keys locked. Returns the response
    /// and the revision to wait for before answering. A journal records the
    /// revision it takes as `recorded_as`, or as this txn when that is None.
    pub(super) fn write_txn(
        &self,
        req: &TxnRequest,
        recorded_as: Option<&Entry>,
    ) -> Result<(TxnResponse, i64)> {
        let plan = LockPlan::for_txn(req);
        if plan.all_keys {
            let _all = self.range_writers().write();
            self.check_running()?;
            self.write_with(req, recorded_as, &mut KeyAccess::AllKeys)
        } else {
            let _shared = self.range_writers().read();
            self.check_running()?;
            let entries: Vec<EntryRef> = plan
                .keys
                .iter()
                .map(|k| self.index().get_or_insert(k))
                .collect();
            let mut access = KeyAccess::lock(&entries);
            self.write_with(req, recorded_as, &mut access)
        }
    }

    fn write_with(
        &self,
        req: &TxnRequest,
        recorded_as: Option<&Entry>,
        access: &mut KeyAccess<'_>,
    ) -> Result<(TxnResponse, i64)> {
        let view = WriteView {
            index: self.index(),
            access: &*access,
        };
        let path = Path::evaluate(req, &view, i64::MAX);
        let begin = self.sequencer().allocated();

        let mut changes = false;
        let mut attachments: Vec<(i64, Bytes)> = Vec::new();
        let adopting = self.limits().adopt_unknown_ttl.is_some();
        // One pass over the taken branches in op order, as etcd 3.6 checks
        // a txn: the first op that cannot run decides the error.
        path.visit(req, &mut |op| {
            match op {
                RequestOp::Put(p) => {
                    changes = true;
                    if p.ignore_value || p.ignore_lease {
                        view.latest(&p.key).ok_or(Error::KeyNotFound)?;
                    }
                    if p.lease != 0 {
                        if !adopting && !self.lessor().contains(p.lease) {
                            return Err(Error::LeaseNotFound);
                        }
                        // The lessor keeps the key as long as the lease lives.
                        attachments.push((p.lease, access.owned_key(&p.key)));
                    }
                }
                RequestOp::Delete(d) => {
                    changes = changes || !view.latest_range(&d.key, &d.range_end).is_empty();
                }
                RequestOp::Range(r) => {
                    self.check_read_revision(r.revision, begin)?;
                }
                _ => {}
            }
            Ok(())
        })?;
        self.lessor().attach_all(&attachments)?;

        if !changes {
            let mut pending = Pending::new(begin, begin);
            let mut resp = self.run_ops(req, &path, access, &mut pending);
            resp.revision = begin;
            return Ok((resp, begin));
        }
        let ticket = self.sequencer().next();
        let rev = ticket.revision();
        let mut pending = Pending::new(rev, rev - 1);
        let mut resp = self.run_ops(req, &path, access, &mut pending);
        resp.revision = rev;
        self.stats().applied();
        let change = match recorded_as {
            Some(entry) => Change::Entry(entry),
            None => Change::Write(req),
        };
        ticket.finish(pending.events, Some(change));
        Ok((resp, rev))
    }

    fn run_ops(
        &self,
        req: &TxnRequest,
        path: &Path,
        access: &mut KeyAccess<'_>,
        w: &mut Pending,
    ) -> TxnResponse {
        let mut nested = path.nested.iter();
        let mut responses = Vec::new();
        for op in path.ops(req) {
            let resp = match op {
                RequestOp::Range(r) => {
                    let current = if w.changed { w.rev } else { w.begin };
                    let at = if r.revision > 0 { r.revision } else { current };
                    let view = WriteView {
                        index: self.index(),
                        access: &*access,
                    };
                    ResponseOp::Range(execute_range(r, at, current, &view))
                }
                RequestOp::Put(p) => ResponseOp::Put(self.put_one(p, access, w)),
                RequestOp::Delete(d) => ResponseOp::Delete(self.delete_range_in(d, access, w)),
                RequestOp::Txn(t) => {
                    let p = nested.next().expect("a path per nested txn");
                    ResponseOp::Txn(self.run_ops(t, p, access, w))
                }
                RequestOp::Empty => unreachable!("rejected by validation"),
            };
            responses.push(resp);
        }
        TxnResponse {
            revision: 0,
            succeeded: path.succeeded,
            responses,
        }
    }

    fn put_one(&self, p: &PutRequest, access: &mut KeyAccess<'_>, w: &mut Pending) -> PutResponse {
        let view = WriteView {
            index: self.index(),
            access: &*access,
        };
        let prev = view.latest(&p.key);
        // Watchers get the key as it was before this revision (etcd reads it
        // at `rev - 1`), which differs from `prev` only when one txn touched
        // the key twice (a from-key delete and a put, which etcd allows).
        let event_prev = view.at(&p.key, w.rev - 1);
        let (create_revision, version) = match &prev {
            Some(kv) => (kv.create_revision, kv.version + 1),
            None => (w.rev, 1),
        };
        let value = match (&prev, p.ignore_value) {
            (Some(kv), true) => kv.value.clone(),
            _ => Bytes::copy_from_slice(&p.value),
        };
        let lease = match (&prev, p.ignore_lease) {
            (Some(kv), true) => kv.lease,
            _ => p.lease,
        };
        if let Some(old) = prev.as_ref().map(|kv| kv.lease) {
            if old != 0 && old != lease {
                self.lessor().detach(old, &p.key);
            }
        }
        let rev = w.rev;
        let kv = access.with_history(self.index(), &p.key, |key, versions| {
            let kv = Arc::new(KeyValue {
                key,
                create_revision,
                mod_revision: rev,
                version,
                value,
                lease,
            });
            self.stats().push_version(
                versions,
                Version {
                    rev,
                    kv: Some(kv.clone()),
                },
            );
            kv
        });
        w.changed = true;
        w.events.push(Event {
            kind: EventKind::Put,
            kv,
            prev_kv: event_prev,
        });
        PutResponse {
            revision: w.rev,
            prev_kv: if p.prev_kv { prev } else { None },
        }
    }

    fn delete_range_in(
        &self,
        d: &DeleteRequest,
        access: &mut KeyAccess<'_>,
        w: &mut Pending,
    ) -> DeleteResponse {
        let doomed = WriteView {
            index: self.index(),
            access: &*access,
        }
        .latest_range(&d.key, &d.range_end);
        for prev in &doomed {
            self.delete_one(access, prev, w);
        }
        let deleted = doomed.len() as i64;
        DeleteResponse {
            revision: if deleted > 0 || w.changed {
                w.rev
            } else {
                w.begin
            },
            deleted,
            prev_kvs: if d.prev_kv { doomed } else { Vec::new() },
        }
    }

    fn delete_one(&self, access: &mut KeyAccess<'_>, prev: &Kv, w: &mut Pending) {
        if prev.lease != 0 {
            self.lessor().detach(prev.lease, &prev.key);
        }
        let event_prev = WriteView {
            index: self.index(),
            access: &*access,
        }
        .at(&prev.key, w.rev - 1);
        let rev = w.rev;
        access.with_history(self.index(), &prev.key, |_, versions| {
            self.stats()
                .push_version(versions, Version { rev, kv: None });
        });
        w.changed = true;
        w.events.push(Event {
            kind: EventKind::Delete,
            kv: Arc::new(KeyValue {
                key: prev.key.clone(),
                mod_revision: rev,
                ..Default::default()
            }),
            prev_kv: event_prev,
        });
    }

    /// Revokes a lease and deletes the keys still attached to it at one
    /// revision, in key order. Returns the revision the caller must wait to
    /// be visible before it answers.
    pub(super) fn revoke_lease(&self, lease: i64) -> Result<i64> {
        let _shared = self.range_writers().read();
        self.check_running()?;
        let keys = self.lessor().take_for_revoke(lease)?;
        let entries: Vec<EntryRef> = keys.iter().map(|k| self.index().get_or_insert(k)).collect();
        let mut access = KeyAccess::lock(&entries);
        let doomed: Vec<Kv> = {
            let view = WriteView {
                index: self.index(),
                access: &access,
            };
            keys.iter()
                .filter_map(|k| view.latest(k))
                .filter(|kv| kv.lease == lease)
                .collect()
        };
        self.stats().applied();
        if doomed.is_empty() {
            return Ok(self.sequencer().allocated());
        }
        let ticket = self.sequencer().next();
        let rev = ticket.revision();
        let mut w = Pending::new(rev, rev - 1);
        for kv in &doomed {
            self.delete_one(&mut access, kv, &mut w);
        }
        ticket.finish(
            w.events,
            Some(Change::Entry(&Entry::LeaseRevoke { id: lease })),
        );
        Ok(rev)
    }
}
