//! The settings that decide what applying an entry does ([`Limits`]): the
//! most ops a txn may have, and whether a put naming an
//! unknown lease adopts it. A single member takes them from its flags. In
//! a cluster every member must decide every entry alike, so the leader
//! replicates its own ([`Entry::Limits`]) and every member applies those,
//! whatever its flags say (`server/limits.rs`); a snapshot carries them.
//! The store's side is `store_limits.rs`.
//!
//! [`Entry::Limits`]: super::Entry::Limits

use parking_lot::RwLock;

/// Apply-affecting settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `--max-txn-ops`.
    pub max_txn_ops: usize,
    /// `--quota-backend-bytes` as this member's store has it; `None`: no
    /// quota. Carried for the log's and snapshots' format, but never
    /// applied: each member checks writes against its own quota before
    /// proposing them (`quota.rs`), as etcd members do.
    pub quota_bytes: Option<i64>,
    /// `--lease-adopt-unknown-ttl`; `None`: unknown lease IDs are refused.
    pub adopt_unknown_ttl: Option<i64>,
}

/// The limits in force, and whether they came from the log.
#[derive(Debug)]
pub(super) struct LimitsCell {
    now: RwLock<(Limits, bool)>,
}

impl LimitsCell {
    pub(super) fn new(limits: Limits) -> Self {
        LimitsCell {
            now: RwLock::new((limits, false)),
        }
    }

    /// The limits in force, and whether they were replicated.
    pub(super) fn get(&self) -> (Limits, bool) {
        *self.now.read()
    }

    /// Puts `limits` in force as replicated ones; returns those before.
    pub(super) fn replace(&self, limits: Limits) -> Limits {
        std::mem::replace(&mut *self.now.write(), (limits, true)).0
    }
}
