//! Every broken promise the soak finds, from any task. The soak carries on
//! after one (later rounds may find more, and the report says how many), and
//! exits non-zero at the end if there was any.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Messages kept in full; the rest are only counted.
const KEEP: usize = 50;

/// The violations found so far.
#[derive(Default)]
pub struct Violations {
    count: AtomicU64,
    kept: Mutex<Vec<String>>,
    /// Every violation counted by its kind (the text before the first
    /// `": "`), so that the ones past the first 50 are still told apart.
    kinds: Mutex<BTreeMap<String, u64>>,
}

impl Violations {
    /// Records one violation (also printed on stderr at once, so a long run
    /// shows it when it happens).
    pub fn add(&self, what: impl Into<String>) {
        let what = what.into();
        let kind: String = what
            .split(": ")
            .next()
            .unwrap_or_default()
            .chars()
            .take(60)
            .collect();
        *self.kinds.lock().entry(kind).or_default() += 1;
        let n = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        if n <= KEEP as u64 {
            eprintln!("soak: VIOLATION: {what}");
            self.kept.lock().push(what);
        }
    }

    /// Records each of `all`.
    pub fn extend(&self, all: impl IntoIterator<Item = String>) {
        for v in all {
            self.add(v);
        }
    }

    /// How many were found.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The first ones, in order.
    pub fn first(&self) -> Vec<String> {
        self.kept.lock().clone()
    }

    /// How many of each kind.
    pub fn kinds(&self) -> BTreeMap<String, u64> {
        self.kinds.lock().clone()
    }
}
