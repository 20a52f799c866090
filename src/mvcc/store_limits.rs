//! The store's side of replicated limits (`limits.rs`): what is in force,
//! this member's own, and applying the leader's.

use super::limits::Limits;
use super::store::Store;

impl Store {
    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits_cell().get().0
    }

    /// Whether the limits in force were replicated (applied from the log
    /// or installed with a snapshot) rather than taken from the flags.
    pub fn limits_replicated(&self) -> bool {
        self.limits_cell().get().1
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
        let before = self.limits_cell().replace(limits);
        self.lessor()
            .set_adopt_unknown_ttl(limits.adopt_unknown_ttl);
        if before != limits {
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
