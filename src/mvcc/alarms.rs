//! Alarms: what etcd raises when a member runs out of space (NOSPACE) or
//! finds its data corrupt (CORRUPT), and what either does to writes.
//!
//! As in etcd, alarms are raised and cleared through the apply path (any
//! client may do it, for any member ID) and change what later entries may
//! do: while NOSPACE is raised, writes that take space (puts, txns with a
//! put in a branch, lease grants) fail with "database space exceeded";
//! while CORRUPT is raised, every write fails with "corrupt cluster".
//! Deletes, compaction and revokes still work under NOSPACE so space can be
//! freed; reads always work.

use super::types::*;
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU8, Ordering};

/// etcd's alarm type numbers.
pub const ALARM_NONE: i32 = 0;
/// Out of space.
pub const ALARM_NOSPACE: i32 = 1;
/// Data corruption detected.
pub const ALARM_CORRUPT: i32 = 2;

const NOSPACE_BIT: u8 = 1;
const CORRUPT_BIT: u8 = 2;

/// The raised alarms, and a summary every write reads with one atomic load.
#[derive(Default)]
pub(crate) struct Alarms {
    raised: Mutex<BTreeSet<(i32, u64)>>,
    effects: AtomicU8,
}

impl Alarms {
    fn get(set: &BTreeSet<(i32, u64)>, alarm: i32) -> Vec<AlarmMember> {
        set.iter()
            .filter(|(a, _)| alarm == ALARM_NONE || *a == alarm)
            .map(|&(alarm, member_id)| AlarmMember { member_id, alarm })
            .collect()
    }

    /// Lists, raises or clears; returns what etcd's answer lists.
    pub(crate) fn apply(
        &self,
        action: AlarmAction,
        member_id: u64,
        alarm: i32,
    ) -> Vec<AlarmMember> {
        let mut set = self.raised.lock();
        let member = AlarmMember { member_id, alarm };
        let out = match action {
            AlarmAction::Get => Self::get(&set, alarm),
            // Raising a raised alarm answers with it again, as etcd does.
            AlarmAction::Activate => {
                set.insert((alarm, member_id));
                vec![member]
            }
            AlarmAction::Deactivate => {
                if set.remove(&(alarm, member_id)) {
                    vec![member]
                } else {
                    Vec::new()
                }
            }
        };
        let mut effects = 0;
        for (a, _) in set.iter() {
            effects |= match *a {
                ALARM_NOSPACE => NOSPACE_BIT,
                ALARM_CORRUPT => CORRUPT_BIT,
                _ => 0,
            };
        }
        self.effects.store(effects, Ordering::Release);
        out
    }

    /// Clears every alarm (installing a snapshot image, which then raises
    /// its own).
    pub(crate) fn clear(&self) {
        self.raised.lock().clear();
        self.effects.store(0, Ordering::Release);
    }

    /// Every raised alarm, in (type, member) order.
    pub(crate) fn all(&self) -> Vec<AlarmMember> {
        Self::get(&self.raised.lock(), ALARM_NONE)
    }

    /// Fails a write the raised alarms forbid; `takes_space` for writes
    /// that NOSPACE stops.
    pub(crate) fn check_write(&self, takes_space: bool) -> Result<()> {
        let effects = self.effects.load(Ordering::Acquire);
        if effects & CORRUPT_BIT != 0 {
            return Err(Error::Corrupt);
        }
        if takes_space && effects & NOSPACE_BIT != 0 {
            return Err(Error::NoSpace);
        }
        Ok(())
    }
}

/// What a put adds to the accounted memory: its key and value plus the
/// overhead of the version it adds.
pub(crate) fn put_cost(req: &PutRequest) -> i64 {
    (req.key.len() + req.value.len()) as i64 + super::stats::VERSION_OVERHEAD
}

/// What a lease grant costs the quota and the memory bound (its table
/// entry; etcd's lease overhead).
pub(crate) const LEASE_COST: i64 = 64;

/// Whether a txn takes space in etcd's accounting: a put at the top level
/// of either branch (etcd's quota looks no deeper).
pub(crate) fn txn_takes_space(req: &TxnRequest) -> bool {
    req.success
        .iter()
        .chain(req.failure.iter())
        .any(|op| matches!(op, RequestOp::Put(_)))
}
