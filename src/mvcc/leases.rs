//! Every lease rule clients see, in one place: grant, revoke, keep-alive,
//! time-to-live, the lease list, expiry, and etcd's answers for unknown
//! leases. The gRPC adapter only converts these to and from the wire.
//!
//! Mutations (grant, revoke, expiry) go through the apply path as entries;
//! this file makes the decisions the apply path must not: choosing a lease
//! ID for a grant that left it to the server, arming new leases' timers, and
//! deciding which leases expired, all with the clock.

use super::command::{LeaseGrant, LeaseRevoke};
use super::entry::{Applied, Entry};
use super::store::Store;
use super::types::*;
use crate::error::{Error, Result};
use crate::lease::LeaseInfo;
use std::time::Instant;

/// How often a server-chosen lease ID is re-drawn when a client-chosen
/// lease took it between the choice and the grant.
const ID_ATTEMPTS: usize = 16;

impl Store {
    /// Grants a lease. `id == 0` lets the server choose a positive ID.
    pub fn lease_grant(&self, id: i64, ttl: i64) -> Result<LeaseGrantResponse> {
        let mut draws = IdDraws::new(id);
        loop {
            match self.apply_command(self.grant_of(id, ttl), None) {
                Err(e) if draws.again(&e) => {}
                done => return done,
            }
        }
    }

    /// [`Store::lease_grant`] for async callers.
    pub async fn lease_grant_async(&self, id: i64, ttl: i64) -> Result<LeaseGrantResponse> {
        let mut draws = IdDraws::new(id);
        loop {
            match self.apply_command_async(self.grant_of(id, ttl), None).await {
                Err(e) if draws.again(&e) => {}
                done => return done,
            }
        }
    }

    /// The grant of lease `id` for `ttl` seconds; `id == 0` gets an ID
    /// drawn now. In cluster mode the proposing member draws it and the
    /// entry carries it.
    pub fn grant_of(&self, id: i64, ttl: i64) -> LeaseGrant {
        let id = if id == 0 {
            self.lessor().choose_id()
        } else {
            id
        };
        LeaseGrant { id, ttl }
    }

    /// Revokes a lease: every key still attached to it is deleted at one
    /// revision, in key order, with DELETE events. Returns the revision
    /// after. Waits on the calling thread.
    pub fn lease_revoke(&self, id: i64) -> Result<i64> {
        self.apply_command(LeaseRevoke { id }, None)
    }

    /// Refreshes a lease in memory. As in etcd, the header revision is read
    /// before the refresh (a lease revoked at revision N never shows a
    /// successful keep-alive at N or later), and an unknown or expired lease
    /// gets TTL 0 rather than an error.
    pub fn lease_keep_alive(&self, id: i64) -> LeaseKeepAliveResponse {
        let revision = self.current_revision();
        let ttl = self.lessor().renew(id, Instant::now()).unwrap_or(0);
        LeaseKeepAliveResponse { revision, id, ttl }
    }

    /// TTL information of one lease; an unknown lease gets TTL -1 rather
    /// than an error, as in etcd.
    pub fn lease_time_to_live(&self, id: i64, keys: bool) -> LeaseTimeToLiveResponse {
        let revision = self.current_revision();
        match self.lessor().info(id, keys, Instant::now()) {
            Some(l) => LeaseTimeToLiveResponse {
                revision,
                id: l.id,
                ttl: l.remaining_ttl,
                granted_ttl: l.granted_ttl,
                keys: l.keys,
            },
            None => LeaseTimeToLiveResponse {
                revision,
                id,
                ttl: -1,
                granted_ttl: 0,
                keys: Vec::new(),
            },
        }
    }

    /// Every granted lease.
    pub fn lease_leases(&self) -> LeaseLeasesResponse {
        let revision = self.current_revision();
        let ids = self.lessor().ids();
        LeaseLeasesResponse { revision, ids }
    }

    /// Revokes up to `max` leases whose time ran out by `now`, each as a
    /// revoke entry. Returns each lease with the revision of its deletes, or
    /// the error (a lease revoked by a client meanwhile is gone already).
    pub fn revoke_expired(&self, now: Instant, max: usize) -> Vec<(i64, Result<i64>)> {
        self.lessor()
            .expired(now, max)
            .into_iter()
            .map(|id| (id, self.lease_revoke(id)))
            .collect()
    }

    /// The leases whose time ran out by `now` (at most `max`), without
    /// revoking them: in cluster mode the leader proposes their revokes.
    /// Each is handed out once; a lease renewed meanwhile is not.
    pub fn expired_leases(&self, now: Instant, max: usize) -> Vec<i64> {
        self.lessor().expired(now, max)
    }

    /// What a cluster member does with each committed entry: applies it,
    /// then starts the countdown of the leases it created (on every
    /// member, so whichever becomes leader can expire them).
    pub fn apply_replicated(&self, entry: Entry) -> Result<Applied> {
        let applied = self.apply(entry);
        self.arm_new_leases();
        applied
    }

    /// Cluster mode, on becoming leader: every lease restarts its
    /// countdown from the last checkpoint (or its full TTL).
    pub fn lease_promote(&self, now: Instant) {
        self.arm_new_leases();
        self.lessor().promote(now);
    }

    /// Cluster mode: whether a keep-alive of this lease must replicate a
    /// checkpoint reset before it is acknowledged.
    pub fn lease_checkpointed(&self, id: i64) -> bool {
        self.lessor().checkpointed(id)
    }

    /// Cluster mode: what the leader's checkpoint carries (see
    /// `Lessor::remaining_for_checkpoint`).
    pub fn lease_remaining_for_checkpoint(
        &self,
        now: Instant,
        longer_than: std::time::Duration,
    ) -> Vec<(i64, i64)> {
        self.lessor().remaining_for_checkpoint(now, longer_than)
    }

    /// Every lease with its remaining time, for persistence.
    pub fn leases_for_snapshot(&self) -> Vec<LeaseInfo> {
        self.lessor().all(false, Instant::now())
    }

    /// Number of granted leases.
    pub fn lease_count(&self) -> usize {
        self.lessor().len()
    }

    /// Starts the countdown of leases granted or adopted by writes just
    /// applied. The apply path reads no clock, so its caller does this.
    pub(super) fn arm_new_leases(&self) {
        if self.lessor().has_unarmed() {
            self.lessor().arm_new(Instant::now());
        }
    }
}

/// The draws of a server-chosen lease ID for one grant: a grant that left
/// the ID to the server and lost it to a lease granted meanwhile (`lease
/// already exists`) is tried again with a new draw, a few times.
pub struct IdDraws {
    server_chosen: bool,
    attempts: usize,
}

impl IdDraws {
    /// The draws for a grant that asked for `requested` (0: any ID).
    pub fn new(requested: i64) -> Self {
        IdDraws {
            server_chosen: requested == 0,
            attempts: 0,
        }
    }

    /// Whether a grant that failed with `e` is tried again.
    pub fn again(&mut self, e: &Error) -> bool {
        let again = self.server_chosen && *e == Error::LeaseExist && self.attempts < ID_ATTEMPTS;
        self.attempts += usize::from(again);
        again
    }
}
