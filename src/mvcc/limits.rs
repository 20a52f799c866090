//! The settings that decide what applying an entry does ([`Limits`]): the
//! space quota, the most ops a txn may have, and whether a put naming an
//! unknown lease adopts it. A single member takes them from its flags. In
//! a cluster every member must decide every entry alike, so the leader
//! replicates its own ([`Entry::Limits`]) and every member applies those,
//! whatever its flags say (`server/limits.rs`); a snapshot carries them.
//!
//! [`Entry::Limits`]: super::Entry::Limits

use super::store::Store;
use parking_lot::RwLock;

/// Apply-affecting settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `--max-txn-ops`.
    pub max_txn_ops: usize,
    /// `--quota-backend-bytes` (the derived value when 0 was given);
    /// `None`: no quota.
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
}

impl Store {
    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits_cell().now.read().0
    }

    /// Whether the limits in force were replicated (applied from the log
    /// or installed with a snapshot) rather than taken from the flags.
    pub fn limits_replicated(&self) -> bool {
        self.limits_cell().now.read().1
    }

    /// The limits this store's own settings (its member's flags) give.
    pub fn own_limits(&self) -> Limits {
        let c = self.config();
        Limits {
            max_txn_ops: c.max_txn_ops,
            quota_bytes: c.quota_bytes,
            adopt_unknown_ttl: c.lessor.adopt_unknown_ttl,
        }
    }

    /// Puts `limits` in force, as replicated ones.
    pub(super) fn set_limits(&self, limits: Limits) {
        let before = std::mem::replace(&mut *self.limits_cell().now.write(), (limits, true));
        self.lessor()
            .set_adopt_unknown_ttl(limits.adopt_unknown_ttl);
        if before.0 != limits {
            let own = self.own_limits();
            if limits == own {
                tracing::info!(
                    ?limits,
                    "limits in force: the leader's, the same as this member's"
                );
            } else {
                tracing::warn!(
                    ?limits,
                    flags = ?own,
                    "limits in force: the leader's, not this member's flags (--max-txn-ops, \
                     --quota-backend-bytes, --lease-adopt-unknown-ttl): every member applies \
                     the leader's so that all decide alike; give every member the same values"
                );
            }
        }
    }
}
