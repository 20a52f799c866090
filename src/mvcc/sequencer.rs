//! The revision sequencer: hands out revisions to writers and publishes
//! them to readers strictly in order.
//!
//! # Invariants
//! * `allocated` is the newest revision handed out; every revision in
//!   `(committed, allocated]` belongs to a write still being applied or
//!   waiting in `pending` for an earlier one.
//! * `committed` (the watermark) is the highest revision with every
//!   revision at or below it applied. It never moves backwards and never
//!   passes a revision that is not applied, so a reader at the watermark sees
//!   all of `1..=committed` and nothing above it.
//! * The change log receives each revision's events exactly once, in
//!   revision order, before the watermark reaches that revision: a watcher
//!   woken for revision N finds N in the log.
//! * Every allocated revision is committed exactly once. A [`Ticket`] that
//!   is dropped without [`Ticket::finish`] (a panic while applying) commits
//!   its revision empty, so writers and watchers waiting for it never hang.
//! * With a journal attached (`journal.rs`), each revision's record is
//!   handed to it in revision order, and the watermark moves only over
//!   revisions the journal has reported durable ([`Sequencer::release`]).

use super::journal::{Change, Journal};
use super::log::EventLog;
use super::types::Event;
use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};

/// See the module docs.
pub(crate) struct Sequencer {
    allocated: AtomicI64,
    committed: AtomicI64,
    pending: Mutex<Pending>,
    log: EventLog,
    journal: OnceLock<Arc<dyn Journal>>,
    /// Tasks waiting in [`Sequencer::visible`], by the revision they wait for.
    waiters: Mutex<BTreeMap<i64, Vec<std::task::Waker>>>,
}

/// Revisions finished but not yet published.
#[derive(Default)]
struct Pending {
    /// Finished above the next one in order, with their records.
    waiting: BTreeMap<i64, (Vec<Event>, Option<Vec<u8>>)>,
    /// The newest revision handed to the journal (in order, with a journal).
    handed: i64,
    /// Handed to the journal and waiting for it to report them durable.
    unreleased: VecDeque<(i64, Vec<Event>)>,
}

impl Sequencer {
    /// A sequencer whose first allocated revision will be `start + 1`.
    pub(crate) fn new(start: i64) -> Self {
        Sequencer {
            allocated: AtomicI64::new(start),
            committed: AtomicI64::new(start),
            pending: Mutex::new(Pending {
                handed: start,
                ..Pending::default()
            }),
            log: EventLog::new(start),
            journal: OnceLock::new(),
            waiters: Mutex::new(BTreeMap::new()),
        }
    }

    /// Hands every later revision to `journal` and publishes it only once
    /// released. The caller holds off every write (nothing is in flight).
    pub(crate) fn attach(&self, journal: Arc<dyn Journal>) {
        let mut pending = self.pending.lock();
        pending.handed = self.committed();
        if self.journal.set(journal).is_err() {
            panic!("a store takes one journal");
        }
    }

    /// The attached journal, if any.
    pub(crate) fn journal(&self) -> Option<Arc<dyn Journal>> {
        self.journal.get().cloned()
    }

    /// The watermark: every revision up to it is visible.
    pub(crate) fn committed(&self) -> i64 {
        self.committed.load(Ordering::Acquire)
    }

    /// The newest allocated revision: what a write that changes nothing
    /// reports, since every key it looked at is at or below it.
    pub(crate) fn allocated(&self) -> i64 {
        self.allocated.load(Ordering::Acquire)
    }

    /// The change log the sequencer feeds.
    pub(crate) fn log(&self) -> &EventLog {
        &self.log
    }

    /// Moves both revisions to `revision` and replaces the change log with
    /// `events` (installing a snapshot image: the caller holds the store
    /// exclusively, so no write is in flight). Watchers are woken by the
    /// caller's publish once the rest of the state is in place.
    pub(crate) fn reset(&self, revision: i64, events: Vec<super::log::LoggedEvent>) {
        let mut pending = self.pending.lock();
        pending.waiting.clear();
        pending.unreleased.clear();
        pending.handed = revision;
        self.log.replace(events);
        self.allocated.store(revision, Ordering::Release);
        self.committed.store(revision, Ordering::Release);
        drop(pending);
        self.wake_up_to(revision);
    }

    /// Moves both revisions up to `revision`, keeping the log (the
    /// initial-revision entry; the caller holds the store exclusively).
    pub(crate) fn bump(&self, revision: i64) {
        self.pending.lock().handed = revision;
        self.allocated.store(revision, Ordering::Release);
        self.committed.store(revision, Ordering::Release);
        self.wake_up_to(revision);
    }

    /// Allocates the next revision. Callers hold the locks of every key they
    /// will write, and are certain to change something.
    pub(crate) fn next(&self) -> Ticket<'_> {
        let rev = self.allocated.fetch_add(1, Ordering::AcqRel) + 1;
        Ticket {
            seq: self,
            rev,
            done: false,
        }
    }

    /// Publishes `rev` with its events once every earlier revision is
    /// published; with a journal, hands its record on in order instead and
    /// leaves publishing to [`Sequencer::release`].
    fn commit(&self, rev: i64, events: Vec<Event>, record: Option<Vec<u8>>) {
        let mut pending = self.pending.lock();
        if let Some(journal) = self.journal.get() {
            pending.waiting.insert(rev, (events, record));
            loop {
                let next = pending.handed + 1;
                let Some((events, record)) = pending.waiting.remove(&next) else {
                    break;
                };
                pending.handed = next;
                let record = record.unwrap_or_else(|| journal.encode(Change::Empty));
                journal.append(Some(next), record);
                pending.unreleased.push_back((next, events));
            }
            return;
        }
        let mut next = self.committed.load(Ordering::Acquire) + 1;
        if rev != next {
            pending.waiting.insert(rev, (events, None));
            return;
        }
        self.log.append(rev, events);
        while let Some((events, _)) = pending.waiting.remove(&(next + 1)) {
            next += 1;
            self.log.append(next, events);
        }
        self.committed.store(next, Ordering::Release);
        // Wake watchers and writers waiting in `visible` only now that the
        // revisions are readable.
        self.log.publish(next);
        drop(pending);
        self.wake_up_to(next);
    }

    /// Publishes every revision up to `up_to` that the journal has taken:
    /// the journal reports them durable.
    pub(crate) fn release(&self, up_to: i64) {
        let mut pending = self.pending.lock();
        let mut newest = None;
        while pending
            .unreleased
            .front()
            .is_some_and(|(rev, _)| *rev <= up_to)
        {
            let (rev, events) = pending.unreleased.pop_front().expect("checked");
            self.log.append(rev, events);
            newest = Some(rev);
        }
        if let Some(rev) = newest {
            self.committed.store(rev, Ordering::Release);
            self.log.publish(rev);
            drop(pending);
            self.wake_up_to(rev);
        }
    }

    /// Waits until revision `rev` is visible to readers, so that a client
    /// that got a response for it can read it back (linearizability).
    /// Blocks the calling thread; async code uses [`Sequencer::visible`].
    pub(crate) fn wait_visible(&self, rev: i64) {
        let mut spins = 0u32;
        while self.committed() < rev {
            if spins < 64 {
                std::hint::spin_loop();
            } else if spins < 128 || self.journal.get().is_none() {
                std::thread::yield_now();
            } else {
                // Waiting on the journal's disk write: sleep, not spin.
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            spins = spins.saturating_add(1);
        }
    }

    /// Completes once revision `rev` is visible to readers. The revisions
    /// below it belong to writes in flight on other threads, which finish in
    /// microseconds unless their thread was preempted (or, with a journal,
    /// are being written); then this task parks until the sequencer
    /// publishes `rev`, instead of holding its worker thread. Only the
    /// tasks whose revision was published are woken.
    pub(crate) async fn visible(&self, rev: i64) {
        if self.journal.get().is_none() {
            for _ in 0..32 {
                if self.committed() >= rev {
                    return;
                }
                std::hint::spin_loop();
            }
        }
        std::future::poll_fn(|cx| {
            if self.committed() >= rev {
                return std::task::Poll::Ready(());
            }
            let mut waiters = self.waiters.lock();
            // Checked again under the lock that publishing takes after it
            // moved the watermark: a publish in between is not missed.
            if self.committed() >= rev {
                return std::task::Poll::Ready(());
            }
            waiters.entry(rev).or_default().push(cx.waker().clone());
            std::task::Poll::Pending
        })
        .await
    }

    /// Wakes the tasks waiting for revisions up to `rev`, now visible.
    fn wake_up_to(&self, rev: i64) {
        let ready = {
            let mut waiters = self.waiters.lock();
            if waiters
                .first_key_value()
                .is_none_or(|(first, _)| *first > rev)
            {
                return;
            }
            let later = waiters.split_off(&(rev + 1));
            std::mem::replace(&mut *waiters, later)
        };
        for waker in ready.into_values().flatten() {
            waker.wake();
        }
    }
}

/// An allocated revision that must be committed exactly once; see the
/// module docs.
pub(crate) struct Ticket<'a> {
    seq: &'a Sequencer,
    rev: i64,
    done: bool,
}

impl Ticket<'_> {
    /// The allocated revision.
    pub(crate) fn revision(&self) -> i64 {
        self.rev
    }

    /// Commits the revision with the events it produced; with a journal,
    /// `change` is what its record replays (None: an empty revision).
    pub(crate) fn finish(mut self, events: Vec<Event>, change: Option<Change<'_>>) {
        self.done = true;
        let record = match (self.seq.journal.get(), change) {
            (Some(journal), Some(change)) => Some(journal.encode(change)),
            _ => None,
        };
        self.seq.commit(self.rev, events, record);
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.done {
            tracing::error!(
                revision = self.rev,
                "a write failed mid-apply; committing its revision empty"
            );
            self.seq.commit(self.rev, Vec::new(), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::{EventKind, KeyValue};
    use bytes::Bytes;
    use std::sync::Arc;

    fn event(rev: i64) -> Vec<Event> {
        vec![Event {
            kind: EventKind::Put,
            kv: Arc::new(KeyValue {
                key: Bytes::from(format!("k{rev}")),
                mod_revision: rev,
                ..Default::default()
            }),
            prev_kv: None,
        }]
    }

    fn logged(seq: &Sequencer) -> Vec<i64> {
        seq.log()
            .read_from(0, usize::MAX, usize::MAX)
            .0
            .iter()
            .map(|e| e.revision)
            .collect()
    }

    #[test]
    fn out_of_order_commits_publish_in_order() {
        let seq = Sequencer::new(10);
        let (a, b, c) = (seq.next(), seq.next(), seq.next());
        assert_eq!((a.revision(), b.revision(), c.revision()), (11, 12, 13));
        assert_eq!(seq.allocated(), 13);
        c.finish(event(13), None);
        b.finish(event(12), None);
        assert_eq!(seq.committed(), 10, "11 is still being applied");
        assert!(logged(&seq).is_empty(), "nothing reaches the log early");
        a.finish(event(11), None);
        assert_eq!(seq.committed(), 13);
        assert_eq!(seq.log().latest(), 13);
        assert_eq!(logged(&seq), vec![11, 12, 13]);
    }

    #[test]
    fn a_dropped_ticket_commits_empty_and_unblocks_later_revisions() {
        let seq = Sequencer::new(0);
        let a = seq.next();
        let b = seq.next();
        b.finish(event(2), None);
        drop(a);
        assert_eq!(seq.committed(), 2);
        assert_eq!(logged(&seq), vec![2], "the dropped revision has no events");
        seq.wait_visible(2);
    }

    #[test]
    fn the_watermark_never_passes_an_unapplied_revision_under_concurrency() {
        let seq = Arc::new(Sequencer::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let seq = seq.clone();
                std::thread::spawn(move || {
                    for _ in 0..2_000 {
                        let t = seq.next();
                        let rev = t.revision();
                        // Every revision below the watermark is published.
                        assert!(seq.committed() < rev);
                        t.finish(event(rev), None);
                        seq.wait_visible(rev);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(seq.committed(), 8_000);
        let revs = logged(&seq);
        assert_eq!(
            revs,
            (1..=8_000).collect::<Vec<_>>(),
            "each revision once, in order"
        );
    }

    #[tokio::test]
    async fn visible_parks_until_the_revision_is_published() {
        let seq = Arc::new(Sequencer::new(0));
        let t = seq.next();
        let waiter = {
            let seq = seq.clone();
            tokio::spawn(async move { seq.visible(1).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        t.finish(event(1), None);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("woken by the publish")
            .unwrap();
    }
}
