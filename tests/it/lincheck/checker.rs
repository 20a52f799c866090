//! A linearizability checker for a key-value store seen as one register per
//! key: put, linearizable get, and compare-and-set (a txn comparing the
//! value).
//!
//! Why a checker of our own instead of `stateright`'s
//! `LinearizabilityTester` (evaluated, see CLUSTER.md "Testing"): that
//! tester searches interleavings by plain backtracking, without remembering
//! the states it has already ruled out, and clones its per-thread maps at
//! every step. A linearizable history is usually found quickly, but a
//! history that is NOT linearizable (the case a checker exists for) makes
//! it try every interleaving, which is exponential in the number of
//! concurrent operations: in a release build it took 18 s to accept a
//! 1,200-operation register history and did not finish rejecting an
//! 81-operation one within 60 s. The search here is the one of Wing & Gong with Lowe's
//! memoisation (as in Knossos and Porcupine): a state is the set of
//! operations already linearized plus the register's value, and each state
//! is explored once, so a rejection costs about as much as an acceptance.
//! Keys are independent registers, so each key's sub-history is checked on
//! its own (linearizability is compositional).
//!
//! Operations whose outcome is unknown (timed out, connection lost, any
//! error from a write) are kept with no return time: they may take effect
//! at any point after their invocation, or never (linearizing them after
//! every other operation, where nothing observes them, is the same as
//! never). Reads that failed are dropped: they cannot change the state.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

/// An operation on one key. Values are unique numbers, so a read tells
/// exactly which write it saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Put the value.
    Put(u64),
    /// Linearizable read.
    Get,
    /// Txn: if the value equals `expect`, put `new`.
    Cas { expect: u64, new: u64 },
}

/// What the client got back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ret {
    /// The put was acknowledged.
    Put,
    /// The read returned this value (`None`: key absent).
    Get(Option<u64>),
    /// The txn answered with this `succeeded`.
    Cas(bool),
    /// No answer, or an error that does not say whether it took effect.
    Unknown,
}

/// One operation of a client history. Times are nanoseconds on one
/// monotonic clock of the test process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Which client (for failure reports only).
    pub client: usize,
    /// The key (register) operated on.
    pub key: String,
    /// What was asked.
    pub op: Op,
    /// What came back.
    pub ret: Ret,
    /// When the request was sent.
    pub call: u64,
    /// When the answer arrived; `None` when the outcome is unknown.
    pub returned: Option<u64>,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ret = match self.returned {
            Some(t) => format!("{:.3}s", t as f64 / 1e9),
            None => "never".to_string(),
        };
        write!(
            f,
            "client {:>2} {:<8} [{:.3}s .. {ret}] {:?} -> {:?}",
            self.client,
            self.key,
            self.call as f64 / 1e9,
            self.op,
            self.ret
        )
    }
}

/// The register after `op` answered `ret` on `state`, or `None` when that
/// answer is impossible in that state.
fn step(state: Option<u64>, op: Op, ret: Ret) -> Option<Option<u64>> {
    match (op, ret) {
        (Op::Put(v), Ret::Put | Ret::Unknown) => Some(Some(v)),
        (Op::Get, Ret::Get(seen)) => (seen == state).then_some(state),
        (Op::Get, Ret::Unknown) => Some(state),
        (Op::Cas { expect, new }, Ret::Cas(true)) => (state == Some(expect)).then_some(Some(new)),
        (Op::Cas { expect, .. }, Ret::Cas(false)) => (state != Some(expect)).then_some(state),
        (Op::Cas { expect, new }, Ret::Unknown) => Some(if state == Some(expect) {
            Some(new)
        } else {
            state
        }),
        _ => None,
    }
}

/// Why a history is not linearizable: the key, the operations of that key
/// around the point where every ordering got stuck, and how far it got.
#[derive(Debug)]
pub struct Violation {
    /// The register whose history cannot be linearized.
    pub key: String,
    /// How many of the key's operations the longest ordering placed.
    pub placed: usize,
    /// How many operations the key has.
    pub total: usize,
    /// Operations near the place where the longest ordering got stuck,
    /// in invocation order (at most [`WINDOW`]).
    pub around: Vec<Event>,
}

/// How many operations a [`Violation`] shows.
pub const WINDOW: usize = 24;

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "key {:?} is not linearizable: the longest valid order places {} of {} operations; \
             the operations around where it got stuck:",
            self.key, self.placed, self.total
        )?;
        for e in &self.around {
            writeln!(f, "  {e}")?;
        }
        Ok(())
    }
}

/// Checks a whole history (every key, initially absent). `Ok` gives the
/// number of operations checked.
pub fn check(history: &[Event]) -> Result<usize, Violation> {
    let mut by_key: BTreeMap<&str, Vec<Event>> = BTreeMap::new();
    for e in history {
        if e.op == Op::Get && e.ret == Ret::Unknown {
            continue;
        }
        by_key.entry(&e.key).or_default().push(e.clone());
    }
    let mut checked = 0;
    for (key, ops) in by_key {
        checked += ops.len();
        check_key(key, ops)?;
    }
    Ok(checked)
}

/// The memoised search on one key's operations.
///
/// Operations with an answer ("known") are sorted by invocation; those of
/// unknown outcome follow. A known operation may be placed next when it was
/// invoked before every unplaced known operation returned; unknown ones
/// never return, so they never hold anything back, and the history is
/// linearizable once every known operation is placed (unplaced unknown
/// ones go last, where nothing observes them). Every known operation
/// before `first` is placed, and a placed one after it was invoked before
/// `first` returned, so the memo key is the placed set of that window plus
/// the unknown ones: a step costs the width of the concurrency, not the
/// length of the history.
fn check_key(key: &str, ops: Vec<Event>) -> Result<(), Violation> {
    let (mut known, mut unknown): (Vec<Event>, Vec<Event>) =
        ops.into_iter().partition(|e| e.returned.is_some());
    known.sort_by_key(|e| e.call);
    unknown.sort_by_key(|e| e.call);
    let k = known.len();
    let ops: Vec<Event> = known.into_iter().chain(unknown).collect();
    let n = ops.len();
    let ret_at: Vec<u64> = ops.iter().map(|e| e.returned.unwrap_or(u64::MAX)).collect();
    let mut done = vec![false; n];
    let mut seen: HashSet<(usize, Vec<bool>, Option<u64>)> = HashSet::new();
    // Depth-first: each frame is (state before, `first` before, op placed).
    let mut stack: Vec<(Option<u64>, usize, usize)> = Vec::new();
    let mut state: Option<u64> = None;
    let mut first = 0usize;
    // Candidates are tried in index order; after a backtrack, resume
    // after the op just undone.
    let mut resume = 0usize;
    let mut placed_known = 0usize;
    let mut best = (0usize, 0usize); // (known placed, `first` then)
    loop {
        if placed_known == k {
            return Ok(());
        }
        // The earliest return among unplaced known ops: only ops invoked
        // before the current minimum can lower it.
        let mut min_ret = u64::MAX;
        let mut end = first;
        while end < k && ops[end].call <= min_ret {
            if !done[end] {
                min_ret = min_ret.min(ret_at[end]);
            }
            end += 1;
        }
        let candidates = (first.max(resume)..end).chain(k.max(resume)..n);
        let mut moved = false;
        for i in candidates {
            if done[i] || ops[i].call > min_ret {
                continue;
            }
            let Some(s) = step(state, ops[i].op, ops[i].ret) else {
                continue;
            };
            done[i] = true;
            let mut new_first = first;
            while new_first < k && done[new_first] {
                new_first += 1;
            }
            let key = (
                new_first,
                memo_window(&ops, &ret_at, &done, new_first, k),
                s,
            );
            if seen.insert(key) {
                stack.push((state, first, i));
                state = s;
                first = new_first;
                placed_known += usize::from(i < k);
                resume = 0;
                moved = true;
                break;
            }
            done[i] = false;
        }
        if moved {
            if placed_known > best.0 {
                best = (placed_known, first);
            }
            continue;
        }
        // Dead end: undo the last placement and try the ops after it.
        match stack.pop() {
            Some((before, old_first, i)) => {
                done[i] = false;
                placed_known -= usize::from(i < k);
                state = before;
                first = old_first;
                resume = i + 1;
            }
            None => {
                let stuck = best.1.min(k.saturating_sub(1));
                let from = stuck.saturating_sub(WINDOW / 2);
                let to = (from + WINDOW).min(k);
                let mut around = ops[from..to].to_vec();
                let until = ops.get(to).map_or(u64::MAX, |e| e.call);
                around.extend(ops[k..].iter().filter(|e| e.call <= until).cloned());
                return Err(Violation {
                    key: key.to_string(),
                    placed: best.0,
                    total: n,
                    around,
                });
            }
        }
    }
}

/// The placed flags that, with `first`, identify the placed set: known ops
/// from `first` while invoked before `first` returned (no later op can be
/// placed yet), then every op of unknown outcome.
fn memo_window(ops: &[Event], ret_at: &[u64], done: &[bool], first: usize, k: usize) -> Vec<bool> {
    let limit = ret_at
        .get(first)
        .copied()
        .filter(|_| first < k)
        .unwrap_or(0);
    let mut end = first;
    while end < k && ops[end].call <= limit {
        end += 1;
    }
    done[first..end].iter().chain(&done[k..]).copied().collect()
}
