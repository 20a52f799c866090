use crate::error::{Error, Result};
use bytes::Bytes;
use parking_lot::Mutex;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
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

struct Lease {
    ttl: i64,
    expiry: Instant,
    keys: HashSet<Bytes>,
}

struct Inner {
    leases: HashMap<i64, Lease>,
    // Min-heap of (expiry, id); entries go stale on refresh/revoke and are
    // checked against the map when popped.
    expiries: BinaryHeap<Reverse<(Instant, i64)>>,
    next_id: i64,
}

/// Owner of all leases; see the module docs.
pub struct Lessor {
    config: LessorConfig,
    inner: Mutex<Inner>,
}

impl Lessor {
    /// A lessor with no leases.
    pub fn new(config: LessorConfig) -> Self {
        // Server-chosen IDs start from a random 63-bit base so that IDs from
        // different runs rarely collide in a client's cache.
        let base = (rand::random::<u64>() >> 2) as i64 | 1;
        Lessor {
            config,
            inner: Mutex::new(Inner {
                leases: HashMap::new(),
                expiries: BinaryHeap::new(),
                next_id: base,
            }),
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &LessorConfig {
        &self.config
    }

    fn effective_ttl(&self, ttl: i64) -> Result<i64> {
        if ttl > MAX_LEASE_TTL {
            return Err(Error::LeaseTtlTooLarge);
        }
        Ok(ttl.max(self.config.min_ttl))
    }

    /// Grants a lease. `id == 0` lets the server choose a positive ID.
    /// Returns the ID and the effective TTL.
    pub fn grant(&self, id: i64, ttl: i64) -> Result<(i64, i64)> {
        let ttl = self.effective_ttl(ttl)?;
        let mut inner = self.inner.lock();
        let id = if id == 0 {
            loop {
                let candidate = inner.next_id & i64::MAX;
                inner.next_id = inner.next_id.wrapping_add(1);
                if candidate != 0 && !inner.leases.contains_key(&candidate) {
                    break candidate;
                }
            }
        } else {
            if inner.leases.contains_key(&id) {
                return Err(Error::LeaseExist);
            }
            id
        };
        insert_lease(&mut inner, id, ttl, Instant::now() + secs(ttl));
        Ok((id, ttl))
    }

    /// Restores a lease with a known remaining time (persistence).
    pub fn restore(&self, id: i64, ttl: i64, remaining: Duration, keys: Vec<Bytes>) {
        let mut inner = self.inner.lock();
        insert_lease(&mut inner, id, ttl, Instant::now() + remaining);
        if let Some(lease) = inner.leases.get_mut(&id) {
            lease.keys.extend(keys);
        }
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
                match self.config.adopt_unknown_ttl {
                    Some(ttl) => {
                        let ttl = ttl.clamp(self.config.min_ttl, MAX_LEASE_TTL);
                        insert_lease(&mut inner, *id, ttl, Instant::now() + secs(ttl));
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

    /// Refreshes a lease in memory. Returns its TTL, or `None` if unknown.
    pub fn renew(&self, id: i64) -> Option<i64> {
        let mut inner = self.inner.lock();
        let now = Instant::now();
        let lease = inner.leases.get_mut(&id)?;
        if lease.expiry <= now {
            return None; // expired, waiting to be revoked
        }
        let ttl = lease.ttl;
        let expiry = now + secs(ttl);
        lease.expiry = expiry;
        inner.expiries.push(Reverse((expiry, id)));
        maybe_rebuild_heap(&mut inner);
        Some(ttl)
    }

    /// TTL information about one lease, or `None` if unknown.
    pub fn info(&self, id: i64, with_keys: bool) -> Option<LeaseInfo> {
        let inner = self.inner.lock();
        let lease = inner.leases.get(&id)?;
        Some(lease_info(id, lease, with_keys, Instant::now()))
    }

    /// Every lease, for listing and persistence, ordered by ID.
    pub fn all(&self, with_keys: bool) -> Vec<LeaseInfo> {
        let now = Instant::now();
        let inner = self.inner.lock();
        let mut all: Vec<LeaseInfo> = inner
            .leases
            .iter()
            .map(|(id, l)| lease_info(*id, l, with_keys, now))
            .collect();
        all.sort_by_key(|l| l.id);
        all
    }

    /// Number of granted leases.
    pub fn len(&self) -> usize {
        self.inner.lock().leases.len()
    }

    /// Whether no lease is granted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// IDs of leases whose expiry is at or before `now`, at most `max` of
    /// them. They stay granted until the store revokes them.
    pub fn expired(&self, now: Instant, max: usize) -> Vec<i64> {
        let mut inner = self.inner.lock();
        let mut out = Vec::new();
        while out.len() < max {
            let Some(Reverse((at, id))) = inner.expiries.peek().copied() else {
                break;
            };
            if at > now {
                break;
            }
            inner.expiries.pop();
            // Stale entries (refreshed or revoked since) are skipped.
            if inner.leases.get(&id).is_some_and(|l| l.expiry == at) {
                out.push(id);
            }
        }
        out
    }

    /// When the next lease expires, if any lease exists.
    pub fn next_expiry(&self) -> Option<Instant> {
        let inner = self.inner.lock();
        inner.expiries.peek().map(|Reverse((at, _))| *at)
    }
}

fn secs(ttl: i64) -> Duration {
    Duration::from_secs(ttl.max(0) as u64)
}

fn insert_lease(inner: &mut Inner, id: i64, ttl: i64, expiry: Instant) {
    inner.leases.insert(
        id,
        Lease {
            ttl,
            expiry,
            keys: HashSet::new(),
        },
    );
    inner.expiries.push(Reverse((expiry, id)));
}

fn maybe_rebuild_heap(inner: &mut Inner) {
    if inner.expiries.len() > 2 * inner.leases.len() + 1024 {
        let fresh: BinaryHeap<_> = inner
            .leases
            .iter()
            .map(|(id, l)| Reverse((l.expiry, *id)))
            .collect();
        inner.expiries = fresh;
    }
}

fn lease_info(id: i64, lease: &Lease, with_keys: bool, now: Instant) -> LeaseInfo {
    let remaining = lease.expiry.saturating_duration_since(now);
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
        assert_eq!(l.grant(7, 1).unwrap(), (7, 2));
        assert_eq!(l.grant(7, 10), Err(Error::LeaseExist));
        assert_eq!(l.grant(8, MAX_LEASE_TTL + 1), Err(Error::LeaseTtlTooLarge));
        let (id, ttl) = l.grant(0, 30).unwrap();
        assert!(id > 0);
        assert_eq!(ttl, 30);
    }

    #[test]
    fn attach_requires_existing_lease_unless_adopting() {
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
        let info = adopt.info(5, true).unwrap();
        assert_eq!(info.granted_ttl, 60);
        assert_eq!(info.keys, vec![Bytes::from_static(b"k")]);
    }

    #[test]
    fn expired_returns_only_due_leases() {
        let l = Lessor::new(LessorConfig::default());
        l.grant(1, 2).unwrap();
        l.grant(2, 100).unwrap();
        assert!(l.expired(Instant::now(), 10).is_empty());
        let later = Instant::now() + Duration::from_secs(3);
        assert_eq!(l.expired(later, 10), vec![1]);
        // A renewed lease is not reported by its stale heap entry.
        assert_eq!(l.renew(2), Some(100));
        assert!(l.expired(Instant::now(), 10).is_empty());
    }
}
