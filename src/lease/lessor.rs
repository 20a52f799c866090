use crate::error::{Error, Result};
use bytes::Bytes;
use parking_lot::Mutex;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

/// etcd's largest allowed TTL, in seconds.
pub const MAX_LEASE_TTL: i64 = 9_000_000_000;

/// Lessor settings.
#[derive(Debug, Clone)]
pub struct LessorConfig {
    /// Shortest TTL a grant gets (etcd: 1.5 × election timeout, rounded up: 2 s).
    pub min_ttl: i64,
    /// When set, a put naming an unknown lease ID adopts it with this TTL
    /// instead of failing (see the README: apiserver lease reuse after a restart).
    pub adopt_unknown_ttl: Option<i64>,
}

impl Default for LessorConfig {
    fn default() -> Self {
        LessorConfig {
            min_ttl: 2,
            adopt_unknown_ttl: None,
        }
    }
}

/// A snapshot of one lease for TimeToLive and persistence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    /// Lease ID.
    pub id: i64,
    /// TTL the lease was granted with (after the minimum was applied).
    pub granted_ttl: i64,
    /// Whole seconds until expiry (truncated, like etcd).
    pub remaining_ttl: i64,
    /// Milliseconds until expiry (for persistence).
    pub remaining_ms: i64,
    /// Keys attached now, sorted.
    pub keys: Vec<Bytes>,
}

/// A lease as a snapshot restores it: the remaining time already reduced by
/// the downtime. Defined here, below the store and persistence, so that
/// both can name it without depending on each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoredLease {
    /// Lease ID.
    pub id: i64,
    /// Granted TTL in seconds.
    pub ttl: i64,
    /// Time left (zero if it expired while ephd was down).
    pub remaining: Duration,
}

struct Lease {
    ttl: i64,
    keys: HashSet<Bytes>,
    /// When the lease expires; `None` until the clock's owner arms it.
    deadline: Option<Instant>,
    /// Cluster mode: the time left in the leader's last checkpoint of this
    /// lease, in ms (`None`: the full TTL). A new leader resumes from it.
    checkpoint_ms: Option<i64>,
}

struct Inner {
    leases: HashMap<i64, Lease>,
    // Min-heap of (deadline, id); entries go stale on refresh/revoke and are
    // checked against the map when popped.
    deadlines: BinaryHeap<Reverse<(Instant, i64)>>,
    // Leases created by the apply path and not yet armed.
    unarmed: Vec<i64>,
}

/// Owner of all leases; see the module docs.
pub struct Lessor {
    config: LessorConfig,
    /// `config.adopt_unknown_ttl` as replicated in a cluster (0: none).
    adopt: AtomicI64,
    inner: Mutex<Inner>,
    has_unarmed: AtomicBool,
    next_id: AtomicI64,
}

impl Lessor {
    /// A lessor with no leases.
    pub fn new(config: LessorConfig) -> Self {
        // Server-chosen IDs start from a random 63-bit base so that IDs from
        // different runs rarely collide in a client's cache.
        let base = (rand::random::<u64>() >> 2) as i64 | 1;
        Lessor {
            adopt: AtomicI64::new(config.adopt_unknown_ttl.unwrap_or(0)),
            config,
            inner: Mutex::new(Inner {
                leases: HashMap::new(),
                deadlines: BinaryHeap::new(),
                unarmed: Vec::new(),
            }),
            has_unarmed: AtomicBool::new(false),
            next_id: AtomicI64::new(base),
        }
    }

    /// Sets the TTL unknown lease IDs are adopted with (`None`: refused),
    /// as a cluster replicates it (`mvcc/limits.rs`).
    pub fn set_adopt_unknown_ttl(&self, ttl: Option<i64>) {
        self.adopt.store(ttl.unwrap_or(0), Ordering::Relaxed);
    }

    /// The settings in force.
    pub fn config(&self) -> &LessorConfig {
        &self.config
    }

    // ------------------------------------------------- the caller's choices

    /// A positive lease ID no lease has now, for a grant that let the server
    /// choose. Called before the grant is applied: the apply path itself
    /// never chooses IDs.
    pub fn choose_id(&self) -> i64 {
        let inner = self.inner.lock();
        loop {
            let candidate = self.next_id.fetch_add(1, Ordering::Relaxed) & i64::MAX;
            if candidate != 0 && !inner.leases.contains_key(&candidate) {
                return candidate;
            }
        }
    }

    // --------------------------------- the apply path: deterministic, no clock

    /// Grants lease `id` (chosen by the caller) with etcd's TTL rules.
    /// Returns the effective TTL. The lease does not count down until it is
    /// armed ([`Lessor::arm_new`]).
    pub fn grant(&self, id: i64, ttl: i64) -> Result<i64> {
        if ttl > MAX_LEASE_TTL {
            return Err(Error::LeaseTtlTooLarge);
        }
        let ttl = ttl.max(self.config.min_ttl);
        let mut inner = self.inner.lock();
        if inner.leases.contains_key(&id) {
            return Err(Error::LeaseExist);
        }
        self.insert_unarmed(&mut inner, id, ttl);
        Ok(ttl)
    }

    fn insert_unarmed(&self, inner: &mut Inner, id: i64, ttl: i64) {
        inner.leases.insert(
            id,
            Lease {
                ttl,
                keys: HashSet::new(),
                deadline: None,
                checkpoint_ms: None,
            },
        );
        inner.unarmed.push(id);
        self.has_unarmed.store(true, Ordering::Release);
    }

    /// Whether a lease is currently granted.
    pub fn contains(&self, id: i64) -> bool {
        self.inner.lock().leases.contains_key(&id)
    }

    /// Checks that every lease named exists (adopting unknown ones when so
    /// configured), then attaches each key to its lease, atomically with
    /// respect to [`Lessor::take_for_revoke`]: a key attached here is always
    /// in the key set a later revoke sees.
    pub fn attach_all(&self, attachments: &[(i64, Bytes)]) -> Result<()> {
        if attachments.is_empty() {
            return Ok(());
        }
        let mut inner = self.inner.lock();
        for (id, _) in attachments {
            if !inner.leases.contains_key(id) {
                match Some(self.adopt.load(Ordering::Relaxed)).filter(|t| *t > 0) {
                    Some(ttl) => {
                        let ttl = ttl.clamp(self.config.min_ttl, MAX_LEASE_TTL);
                        self.insert_unarmed(&mut inner, *id, ttl);
                        tracing::info!(lease = id, ttl, "adopted unknown lease ID");
                    }
                    None => return Err(Error::LeaseNotFound),
                }
            }
        }
        for (id, key) in attachments {
            if let Some(lease) = inner.leases.get_mut(id) {
                lease.keys.insert(key.clone());
            }
        }
        Ok(())
    }

    /// Detaches a key from a lease (the key was overwritten or deleted).
    pub fn detach(&self, id: i64, key: &Bytes) {
        if let Some(lease) = self.inner.lock().leases.get_mut(&id) {
            lease.keys.remove(key);
        }
    }

    /// The keys attached to a lease (none if unknown), for the permission
    /// check of a revoke while auth is enabled.
    pub fn keys(&self, id: i64) -> Vec<Bytes> {
        self.inner
            .lock()
            .leases
            .get(&id)
            .map(|l| l.keys.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Removes a lease and returns its attached keys, sorted; the caller
    /// (the store) then deletes them at one revision.
    pub fn take_for_revoke(&self, id: i64) -> Result<Vec<Bytes>> {
        let lease = self
            .inner
            .lock()
            .leases
            .remove(&id)
            .ok_or(Error::LeaseNotFound)?;
        let mut keys: Vec<Bytes> = lease.keys.into_iter().collect();
        keys.sort();
        Ok(keys)
    }

    // ------------------------------------------- the clock's owner: timers

    /// Whether leases granted or adopted by the apply path wait to be
    /// armed: one atomic load, so callers can skip reading the clock.
    pub fn has_unarmed(&self) -> bool {
        self.has_unarmed.load(Ordering::Acquire)
    }

    /// Starts the countdown of every lease granted or adopted since the
    /// last call: each expires `ttl` seconds after `now`.
    pub fn arm_new(&self, now: Instant) {
        if !self.has_unarmed() {
            return;
        }
        let mut inner = self.inner.lock();
        self.has_unarmed.store(false, Ordering::Release);
        let ids = std::mem::take(&mut inner.unarmed);
        for id in ids {
            if let Some(lease) = inner.leases.get_mut(&id) {
                if lease.deadline.is_none() {
                    let deadline = now + secs(lease.ttl);
                    lease.deadline = Some(deadline);
                    inner.deadlines.push(Reverse((deadline, id)));
                }
            }
        }
    }

    /// Forgets every lease (a cluster member installing a snapshot, which
    /// then restores its leases).
    pub fn clear(&self) {
        let mut inner = self.inner.lock();
        inner.leases.clear();
        inner.deadlines.clear();
        inner.unarmed.clear();
        self.has_unarmed.store(false, Ordering::Release);
    }

    /// Restores a lease with a known remaining time (persistence).
    pub fn restore(&self, id: i64, ttl: i64, remaining: Duration, keys: Vec<Bytes>, now: Instant) {
        let mut inner = self.inner.lock();
        let deadline = now + remaining;
        inner.leases.insert(
            id,
            Lease {
                ttl,
                keys: keys.into_iter().collect(),
                deadline: Some(deadline),
                checkpoint_ms: None,
            },
        );
        inner.deadlines.push(Reverse((deadline, id)));
    }

    /// Refreshes a lease in memory at `now`. Returns its TTL, or `None` if
    /// unknown or already expired (waiting to be revoked).
    pub fn renew(&self, id: i64, now: Instant) -> Option<i64> {
        let mut inner = self.inner.lock();
        let lease = inner.leases.get_mut(&id)?;
        if lease.deadline.is_some_and(|d| d <= now) {
            return None;
        }
        let ttl = lease.ttl;
        let deadline = now + secs(ttl);
        lease.deadline = Some(deadline);
        inner.deadlines.push(Reverse((deadline, id)));
        maybe_rebuild_heap(&mut inner);
        Some(ttl)
    }

    /// TTL information about one lease at `now`, or `None` if unknown.
    pub fn info(&self, id: i64, with_keys: bool, now: Instant) -> Option<LeaseInfo> {
        let inner = self.inner.lock();
        let lease = inner.leases.get(&id)?;
        Some(lease_info(id, lease, with_keys, now))
    }

    /// Every lease at `now`, for listing and persistence, ordered by ID.
    pub fn all(&self, with_keys: bool, now: Instant) -> Vec<LeaseInfo> {
        let inner = self.inner.lock();
        let mut all: Vec<LeaseInfo> = inner
            .leases
            .iter()
            .map(|(id, l)| lease_info(*id, l, with_keys, now))
            .collect();
        all.sort_by_key(|l| l.id);
        all
    }

    /// Every granted lease's ID, ascending.
    pub fn ids(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self.inner.lock().leases.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Number of granted leases.
    pub fn len(&self) -> usize {
        self.inner.lock().leases.len()
    }

    /// Whether no lease is granted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    // --------------------------- cluster mode: checkpoints and leader change

    /// Records the leader's checkpoint of a lease (apply path: no clock, so
    /// every member records the same). Negative `remaining_ms` means the
    /// full TTL: a keep-alive renewed the lease after a shorter checkpoint.
    pub fn checkpoint(&self, id: i64, remaining_ms: i64) {
        if let Some(lease) = self.inner.lock().leases.get_mut(&id) {
            lease.checkpoint_ms = (remaining_ms >= 0).then_some(remaining_ms);
        }
    }

    /// Whether a new leader would resume this lease from a checkpoint
    /// shorter than its TTL: a keep-alive must then replicate a reset
    /// before it is acknowledged, or a leader change could shorten it.
    pub fn checkpointed(&self, id: i64) -> bool {
        self.inner
            .lock()
            .leases
            .get(&id)
            .is_some_and(|l| l.checkpoint_ms.is_some())
    }

    /// Restarts every lease's countdown at `now` from its last checkpoint,
    /// or from its full TTL when it has none (what a member does when it
    /// becomes leader: its own timers never saw the keep-alives the
    /// previous leader took).
    pub fn promote(&self, now: Instant) {
        let mut inner = self.inner.lock();
        for lease in inner.leases.values_mut() {
            let left = lease
                .checkpoint_ms
                .map_or(secs(lease.ttl), |ms| Duration::from_millis(ms as u64));
            lease.deadline = Some(now + left);
        }
        let fresh: BinaryHeap<_> = inner
            .leases
            .iter()
            .filter_map(|(id, l)| l.deadline.map(|d| Reverse((d, *id))))
            .collect();
        inner.deadlines = fresh;
    }

    /// (ID, milliseconds left) of every armed lease whose TTL is longer
    /// than `longer_than`, for the leader's checkpoint: shorter leases lose
    /// no more than their TTL to a leader change anyway.
    pub fn remaining_for_checkpoint(&self, now: Instant, longer_than: Duration) -> Vec<(i64, i64)> {
        let inner = self.inner.lock();
        let mut out: Vec<(i64, i64)> = inner
            .leases
            .iter()
            .filter(|(_, l)| secs(l.ttl) > longer_than)
            .filter_map(|(id, l)| {
                let left = l.deadline?.saturating_duration_since(now);
                Some((*id, left.as_millis() as i64))
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// IDs of leases whose deadline is at or before `now`, at most `max` of
    /// them. They stay granted until the store revokes them.
    pub fn expired(&self, now: Instant, max: usize) -> Vec<i64> {
        let mut inner = self.inner.lock();
        let mut out = Vec::new();
        while out.len() < max {
            let Some(Reverse((at, id))) = inner.deadlines.peek().copied() else {
                break;
            };
            if at > now {
                break;
            }
            inner.deadlines.pop();
            // Stale entries (refreshed or revoked since) are skipped.
            if inner
                .leases
                .get(&id)
                .is_some_and(|l| l.deadline == Some(at))
            {
                out.push(id);
            }
        }
        out
    }
}

fn secs(ttl: i64) -> Duration {
    Duration::from_secs(ttl.max(0) as u64)
}

fn maybe_rebuild_heap(inner: &mut Inner) {
    if inner.deadlines.len() > 2 * inner.leases.len() + 1024 {
        let fresh: BinaryHeap<_> = inner
            .leases
            .iter()
            .filter_map(|(id, l)| l.deadline.map(|d| Reverse((d, *id))))
            .collect();
        inner.deadlines = fresh;
    }
}

fn lease_info(id: i64, lease: &Lease, with_keys: bool, now: Instant) -> LeaseInfo {
    // A lease not armed yet has its whole TTL left.
    let remaining = lease
        .deadline
        .map_or(secs(lease.ttl), |d| d.saturating_duration_since(now));
    let mut keys: Vec<Bytes> = if with_keys {
        lease.keys.iter().cloned().collect()
    } else {
        Vec::new()
    };
    keys.sort();
    LeaseInfo {
        id,
        granted_ttl: lease.ttl,
        remaining_ttl: remaining.as_secs() as i64,
        remaining_ms: remaining.as_millis() as i64,
        keys,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_applies_minimum_and_rejects_duplicates() {
        let l = Lessor::new(LessorConfig::default());
        assert_eq!(l.grant(7, 1), Ok(2));
        assert_eq!(l.grant(7, 10), Err(Error::LeaseExist));
        assert_eq!(l.grant(8, MAX_LEASE_TTL + 1), Err(Error::LeaseTtlTooLarge));
        assert_eq!(l.grant(8, MAX_LEASE_TTL), Ok(MAX_LEASE_TTL));
        let id = l.choose_id();
        assert!(id > 0 && id != 7 && id != 8);
        assert_ne!(l.choose_id(), id, "chosen IDs do not repeat");
    }

    #[test]
    fn attach_requires_existing_lease_unless_adopting() {
        let now = Instant::now();
        let l = Lessor::new(LessorConfig::default());
        assert_eq!(
            l.attach_all(&[(5, Bytes::from_static(b"k"))]),
            Err(Error::LeaseNotFound)
        );
        let adopt = Lessor::new(LessorConfig {
            adopt_unknown_ttl: Some(60),
            ..Default::default()
        });
        adopt.attach_all(&[(5, Bytes::from_static(b"k"))]).unwrap();
        let info = adopt.info(5, true, now).unwrap();
        assert_eq!(info.granted_ttl, 60);
        assert_eq!(info.keys, vec![Bytes::from_static(b"k")]);
        // An adopted lease counts down once armed, like a granted one.
        adopt.arm_new(now);
        assert_eq!(adopt.expired(now + Duration::from_secs(61), 10), vec![5]);
    }

    #[test]
    fn leases_count_down_only_once_armed() {
        let t0 = Instant::now();
        let l = Lessor::new(LessorConfig::default());
        l.grant(1, 2).unwrap();
        l.grant(2, 100).unwrap();
        let much_later = t0 + Duration::from_secs(1_000);
        assert!(
            l.expired(much_later, 10).is_empty(),
            "unarmed leases never expire"
        );
        assert_eq!(l.info(1, false, much_later).unwrap().remaining_ttl, 2);
        l.arm_new(t0);
        assert!(l.expired(t0, 10).is_empty());
        let t3 = t0 + Duration::from_secs(3);
        assert_eq!(
            l.info(1, false, t0 + Duration::from_millis(500))
                .unwrap()
                .remaining_ttl,
            1
        );
        assert_eq!(l.expired(t3, 10), vec![1]);
        // A renewed lease is not reported by its stale heap entry.
        assert_eq!(l.renew(2, t3), Some(100));
        assert!(l.expired(t0 + Duration::from_secs(101), 10).is_empty());
        assert_eq!(l.expired(t3 + Duration::from_secs(100), 10), vec![2]);
    }

    #[test]
    fn renew_answers_none_for_unknown_and_expired_leases() {
        let t0 = Instant::now();
        let l = Lessor::new(LessorConfig::default());
        assert_eq!(l.renew(9, t0), None);
        l.grant(9, 5).unwrap();
        assert_eq!(l.renew(9, t0), Some(5), "renewing arms an unarmed lease");
        assert_eq!(
            l.renew(9, t0 + Duration::from_secs(5)),
            None,
            "expired, awaiting revoke"
        );
        assert_eq!(l.take_for_revoke(9), Ok(vec![]));
        assert_eq!(l.take_for_revoke(9), Err(Error::LeaseNotFound));
    }

    #[test]
    fn revoke_returns_attached_keys_sorted_without_detached_ones() {
        let l = Lessor::new(LessorConfig::default());
        l.grant(3, 10).unwrap();
        let k = |s: &'static str| Bytes::from_static(s.as_bytes());
        l.attach_all(&[(3, k("b")), (3, k("a")), (3, k("c"))])
            .unwrap();
        l.detach(3, &k("c"));
        assert_eq!(l.take_for_revoke(3), Ok(vec![k("a"), k("b")]));
    }

    #[test]
    fn promote_resumes_from_the_checkpoint_or_the_full_ttl() {
        let l = Lessor::new(LessorConfig::default());
        let t0 = Instant::now();
        l.grant(1, 100).unwrap();
        l.grant(2, 100).unwrap();
        l.grant(3, 3).unwrap();
        l.arm_new(t0);
        // The leader's checkpoint: 40 s left of lease 1, lease 2 renewed.
        let at = t0 + Duration::from_secs(60);
        let cps = l.remaining_for_checkpoint(at, Duration::from_secs(5));
        assert_eq!(
            cps,
            vec![(1, 40_000), (2, 40_000)],
            "short leases are left out"
        );
        l.checkpoint(1, 40_000);
        l.checkpoint(2, 40_000);
        l.checkpoint(2, -1);
        assert!(l.checkpointed(1) && !l.checkpointed(2) && !l.checkpointed(3));
        // A new leader, 2 s later: lease 1 from its checkpoint, the others
        // from their full TTL; nothing expired early.
        let promoted = at + Duration::from_secs(2);
        l.promote(promoted);
        assert_eq!(l.info(1, false, promoted).unwrap().remaining_ms, 40_000);
        assert_eq!(l.info(2, false, promoted).unwrap().remaining_ms, 100_000);
        assert_eq!(l.info(3, false, promoted).unwrap().remaining_ms, 3_000);
        assert!(l.expired(promoted + Duration::from_secs(2), 10).is_empty());
        assert_eq!(l.expired(promoted + Duration::from_secs(3), 10), vec![3]);
        assert_eq!(l.expired(promoted + Duration::from_secs(40), 10), vec![1]);
    }
}
