//! Linearizability of a three-member cluster under faults: several clients
//! spread over every member run puts, linearizable gets and
//! compare-and-sets on a few keys while a leader or a follower is killed or
//! paused; every operation is recorded with its invocation and return time
//! (or as of unknown outcome when it timed out or failed), and the history
//! is checked against a register per key by [`checker`]. The checker's own
//! tests feed it hand-made histories it must reject or accept.

pub(crate) mod checker;
#[cfg(test)]
mod checker_tests;
mod faults;
pub(crate) mod recorder;
