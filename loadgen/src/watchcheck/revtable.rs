//! The ledger the checking watchers are audited against: per revision,
//! when the write's response arrived and how many watchers received its
//! event. It is the one piece of state writers and watch streams share,
//! touched on every write and every event from different tasks, so it is
//! lock-free on the hot path (atomics in fixed chunks, a lock only to add
//! a chunk) and kept apart from the per-stream checks in the parent module.

use parking_lot::RwLock;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

const CHUNK: usize = 1 << 14;
/// Revisions tracked at most (64 Mi, ~800 MB); later ones go unchecked.
const MAX_CHUNKS: usize = 4096;

struct Chunk {
    written: Vec<AtomicU64>,
    seen: Vec<AtomicU32>,
}

impl Chunk {
    fn new() -> Self {
        Chunk {
            written: (0..CHUNK).map(|_| AtomicU64::new(0)).collect(),
            seen: (0..CHUNK).map(|_| AtomicU32::new(0)).collect(),
        }
    }
}

/// Per-revision write times and receipt counts; see the module docs of
/// `watchcheck`.
pub struct RevTable {
    base: i64,
    epoch: Instant,
    chunks: RwLock<Vec<Chunk>>,
    max_written: AtomicI64,
    untracked: AtomicU64,
}

/// Result of [`RevTable::audit`].
#[derive(Debug, Default)]
pub struct Audit {
    /// Successful writes recorded.
    pub writes: u64,
    /// Events expected: writes × watchers.
    pub expected: u64,
    /// Expected events never received.
    pub lost: u64,
    /// Receipts beyond one per watcher.
    pub extra: u64,
    /// PUT receipts for revisions with no recorded write.
    pub unexpected: u64,
    /// First few revisions with lost events.
    pub lost_revisions: Vec<i64>,
}

impl RevTable {
    /// A table for writes above `base` (the revision before the run).
    pub fn new(base: i64) -> Arc<Self> {
        Arc::new(RevTable {
            base,
            epoch: Instant::now(),
            chunks: RwLock::new(Vec::new()),
            max_written: AtomicI64::new(base),
            untracked: AtomicU64::new(0),
        })
    }

    pub(super) fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    fn with_slot<R>(&self, rev: i64, f: impl FnOnce(&Chunk, usize) -> R) -> Option<R> {
        if rev <= self.base {
            return None;
        }
        let idx = (rev - self.base - 1) as usize;
        let (c, i) = (idx / CHUNK, idx % CHUNK);
        if c >= MAX_CHUNKS {
            return None;
        }
        {
            let chunks = self.chunks.read();
            if let Some(ch) = chunks.get(c) {
                return Some(f(ch, i));
            }
        }
        let mut chunks = self.chunks.write();
        while chunks.len() <= c {
            chunks.push(Chunk::new());
        }
        Some(f(&chunks[c], i))
    }

    /// Records that the write at `rev` just got its response.
    pub fn written(&self, rev: i64) {
        let t = self.now_ns();
        if self
            .with_slot(rev, |c, i| c.written[i].store(t, Ordering::Release))
            .is_none()
        {
            self.untracked.fetch_add(1, Ordering::Relaxed);
        }
        self.max_written.fetch_max(rev, Ordering::AcqRel);
    }

    /// Records one watcher's receipt of the PUT at `rev` at `now`; returns
    /// the lag in µs, or `None` when the write's response is not in yet.
    pub(super) fn seen(&self, rev: i64, now: u64) -> Option<u64> {
        self.with_slot(rev, |c, i| {
            c.seen[i].fetch_add(1, Ordering::AcqRel);
            let w = c.written[i].load(Ordering::Acquire);
            (w != 0).then(|| now.saturating_sub(w) / 1000)
        })
        .flatten()
    }

    /// The highest revision written so far (the base if none).
    pub fn max_written(&self) -> i64 {
        self.max_written.load(Ordering::Acquire)
    }

    /// Compares writes with receipts, for `watchers` watchers each.
    pub fn audit(&self, watchers: u32) -> Audit {
        let mut a = Audit::default();
        let chunks = self.chunks.read();
        for (c, ch) in chunks.iter().enumerate() {
            for i in 0..CHUNK {
                let written = ch.written[i].load(Ordering::Acquire) != 0;
                let seen = ch.seen[i].load(Ordering::Acquire);
                if written {
                    a.writes += 1;
                    a.expected += watchers as u64;
                    if seen < watchers {
                        a.lost += (watchers - seen) as u64;
                        if a.lost_revisions.len() < 10 {
                            a.lost_revisions
                                .push(self.base + 1 + (c * CHUNK + i) as i64);
                        }
                    } else {
                        a.extra += (seen - watchers) as u64;
                    }
                } else {
                    a.unexpected += seen as u64;
                }
            }
        }
        a.writes += self.untracked.load(Ordering::Relaxed);
        a
    }
}
