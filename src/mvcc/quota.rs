//! The space quota (`--quota-backend-bytes`, counted as etcd counts its
//! backend: `backend_size.rs`) and the memory bound (the stored data's
//! share of the memory limit, in accounted memory), checked before a write
//! is applied or proposed, never while it is applied.
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
use super::backend_size;
use super::entry::Entry;
use super::store::Store;
use super::types::{AlarmAction, PutRequest, RequestOp};

/// What `entry` costs, each put priced by `put`: the puts of a put or of
/// a txn's costlier branch (top level only, as etcd counts), a lease
/// grant's table entry; 0 for entries that take no space (deletes,
/// revokes, read-only txns), which always pass.
fn cost(entry: &Entry, put: &dyn Fn(&PutRequest) -> i64) -> i64 {
    let branch = |ops: &[RequestOp]| -> i64 {
        ops.iter()
            .map(|op| match op {
                RequestOp::Put(p) => put(p),
                _ => 0,
            })
            .sum()
    };
    match entry {
        Entry::Put(req) => put(req),
        Entry::Txn(req) if alarms::txn_takes_space(req) => {
            branch(&req.success).max(branch(&req.failure))
        }
        Entry::LeaseGrant { .. } => alarms::LEASE_COST,
        Entry::Authorized { entry, .. } => cost(entry, put),
        _ => 0,
    }
}

/// What `entry` adds to the accounted memory ([`super::Stats::memory_bytes`]).
pub fn space_cost(entry: &Entry) -> i64 {
    cost(entry, &alarms::put_cost)
}

/// What etcd's quota charges `entry` in its backend measure
/// ([`super::Stats::backend_bytes`]).
fn backend_cost(entry: &Entry) -> i64 {
    cost(entry, &|p| {
        backend_size::put_cost((p.key.len() + p.value.len()) as i64)
    })
}

/// What the space check decides for a write ([`Store::check_space`]).
#[derive(Debug)]
pub enum Space {
    /// It fits: apply or propose it.
    Fits,
    /// It does not fit, and this member's NOSPACE alarm is raised already:
    /// refuse it with "database space exceeded".
    Full,
    /// It does not fit: apply (single member) or propose (cluster member)
    /// this NOSPACE alarm under this member's ID, then refuse it.
    Raise(Entry),
}

impl Store {
    /// Checks `entry` against this member's own limits (its flags, whatever
    /// a leader replicated): the space quota, counted as etcd counts its
    /// backend (etcd's rule: the size plus the write's cost must stay below
    /// the quota), and the memory bound, counted in accounted memory.
    pub fn check_space(&self, entry: &Entry) -> Space {
        let (config, stats) = (self.config(), self.stats());
        let over_quota = config.quota_bytes.is_some_and(|quota| {
            let cost = backend_cost(entry);
            cost > 0 && stats.backend_bytes() + cost >= quota
        });
        let over_memory = config.memory_bound_bytes.is_some_and(|bound| {
            let cost = space_cost(entry);
            cost > 0 && stats.memory_bytes() + cost > bound
        });
        if !over_quota && !over_memory {
            return Space::Fits;
        }
        let me = config.member_id;
        let raised = self
            .alarm_table()
            .all()
            .iter()
            .any(|a| a.alarm == alarms::ALARM_NOSPACE && a.member_id == me);
        if raised {
            return Space::Full;
        }
        tracing::warn!(
            db_size = stats.backend_bytes(),
            quota_bytes = config.quota_bytes,
            memory_bytes = stats.memory_bytes(),
            memory_bound_bytes = config.memory_bound_bytes,
            member_id = me,
            "space quota or memory bound reached: raising the NOSPACE alarm; writes that take \
             space fail until space is freed (delete, compact) and the alarm is disarmed"
        );
        Space::Raise(Entry::Alarm {
            action: AlarmAction::Activate,
            member_id: me,
            alarm: alarms::ALARM_NOSPACE,
        })
    }
}
