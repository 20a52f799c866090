//! The space quota (`--quota-backend-bytes`), checked before a write is
//! applied or proposed, never while it is applied.
//!
//! As in etcd, the member that receives a write decides with its own flag
//! and its own accounting whether the write fits. When it does not, that
//! member raises the NOSPACE alarm under its own ID (in a cluster by
//! proposing the alarm through the log, so every member records the same
//! alarm) and refuses the write with "database space exceeded". The apply
//! path itself refuses writes only from the alarm table, which every member
//! holds alike: a member's quota can never make its store differ from the
//! others'.

use super::alarms;
use super::entry::Entry;
use super::store::Store;
use super::types::AlarmAction;
use crate::error::{Error, Result};

/// What `entry` costs the space quota; 0 for entries that take no space
/// (deletes, revokes, read-only txns), which always pass.
pub fn space_cost(entry: &Entry) -> i64 {
    match entry {
        Entry::Put(req) => alarms::put_cost(req),
        Entry::Txn(req) if alarms::txn_takes_space(req) => alarms::txn_cost(req),
        Entry::LeaseGrant { .. } => alarms::LEASE_COST,
        Entry::Authorized { entry, .. } => space_cost(entry),
        _ => 0,
    }
}

impl Store {
    /// Whether `entry` would bring the accounted memory above this member's
    /// own quota (its `--quota-backend-bytes`, whatever a leader
    /// replicated).
    pub fn over_quota(&self, entry: &Entry) -> bool {
        let Some(quota) = self.config().quota_bytes else {
            return false;
        };
        let cost = space_cost(entry);
        if cost == 0 {
            return false;
        }
        self.stats().memory_bytes() + cost > quota
    }

    /// Logs that this member raises NOSPACE (once per raise, not per
    /// refused write).
    pub fn log_nospace_raised(&self) {
        tracing::warn!(
            used_bytes = self.stats().memory_bytes(),
            quota_bytes = self.config().quota_bytes,
            member_id = self.config().member_id,
            "space quota reached: raising the NOSPACE alarm; writes that take space fail \
             until space is freed (delete, compact) and the alarm is disarmed"
        );
    }

    /// Whether this member's NOSPACE alarm is raised already (then a write
    /// over the quota need not raise it again).
    pub fn own_nospace_raised(&self) -> bool {
        let me = self.config().member_id;
        self.alarm_table()
            .all()
            .iter()
            .any(|a| a.alarm == alarms::ALARM_NOSPACE && a.member_id == me)
    }

    /// A single member's quota check: when `entry` does not fit, raises
    /// NOSPACE under this member's ID through the apply path and refuses.
    /// (A cluster member proposes the alarm instead: `cluster::Proposer`.)
    pub(crate) fn refuse_over_quota(&self, entry: &Entry) -> Result<()> {
        if !self.over_quota(entry) {
            return Ok(());
        }
        if !self.own_nospace_raised() {
            self.log_nospace_raised();
            self.apply(Entry::Alarm {
                action: AlarmAction::Activate,
                member_id: self.config().member_id,
                alarm: alarms::ALARM_NOSPACE,
            })?;
        }
        Err(Error::NoSpace)
    }
}
