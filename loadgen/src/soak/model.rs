//! What the server must hold: every write the soak sent, keyed by object,
//! with what became of it.
//!
//! A write is recorded *before* it is sent (so a watch event or a read
//! that beats the response still finds it), then resolved: acknowledged at
//! a revision, refused (a failed CAS), or left unknown when the call failed
//! without an answer (a killed server, a dropped connection, a timeout).
//! Watch events and reads resolve unknown writes too: a value the soak
//! wrote that shows up at revision R was applied at R.
//!
//! From that record the model answers the soak's questions:
//! * at a read revision R, every object must show the newest write known
//!   to be applied at or below R (acknowledged or observed), or a write
//!   whose outcome is unknown; an object may only be missing when its
//!   lease may have expired ([`Model::check_at`]);
//! * after a SIGKILL, the restored state must be the state at the
//!   restored snapshot's revision, and writes acknowledged after it are
//!   the crash window's losses ([`Model::rebase`]);
//! * which acknowledged revisions each watcher had to receive
//!   ([`Model::acked_between`]).
//!
//! Objects never change family: node Leases are only updated by CAS
//! (never deleted), Events are created once and deleted only by their
//! lease's expiry, Pods are written once.

use bytes::Bytes;
use ephd::proto::mvccpb::KeyValue;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

/// Node Lease objects (CAS heartbeats).
pub const LEASES_PREFIX: &str = "/registry/leases/kube-node-lease/";
/// Event objects (creates attached to shared leases, lease-expiry bursts).
pub const EVENTS_PREFIX: &str = "/registry/events/";
/// A fixed set of larger objects for the list storms.
pub const PODS_PREFIX: &str = "/registry/pods/";
/// Keys of the lease-expiry bursts, under the events prefix.
pub const BURST_PREFIX: &str = "/registry/events/soak-burst-";

/// The three kinds of objects the soak writes, one key prefix each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// Node Leases.
    Leases,
    /// Events.
    Events,
    /// Pods.
    Pods,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 3] = [Family::Leases, Family::Events, Family::Pods];

    /// The key prefix.
    pub fn prefix(self) -> &'static str {
        match self {
            Family::Leases => LEASES_PREFIX,
            Family::Events => EVENTS_PREFIX,
            Family::Pods => PODS_PREFIX,
        }
    }

    /// The family a key belongs to, if any.
    pub fn of(key: &[u8]) -> Option<Family> {
        Family::ALL
            .into_iter()
            .find(|f| key.starts_with(f.prefix().as_bytes()))
    }

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Family::Leases => "leases",
            Family::Events => "events",
            Family::Pods => "pods",
        }
    }
}

/// A 64-bit digest of a value: values are unique per write, so the digest
/// names the write without keeping its bytes.
pub fn digest(value: &[u8]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// One version of a key as a read or a watcher sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Val {
    /// create_revision.
    pub create: i64,
    /// mod_revision.
    pub rev: i64,
    /// version.
    pub version: i64,
    /// Digest of the value.
    pub hash: u64,
    /// Lease ID, 0 for none.
    pub lease: i64,
}

impl Val {
    /// The version a protobuf key-value describes.
    pub fn of(kv: &KeyValue) -> Val {
        Val {
            create: kv.create_revision,
            rev: kv.mod_revision,
            version: kv.version,
            hash: digest(&kv.value),
            lease: kv.lease,
        }
    }
}

/// Objects as one read (or a snapshot file) shows them.
pub type Served = HashMap<Bytes, Val>;

/// A change of one key known to have been applied.
#[derive(Clone, Copy, Debug)]
struct Change {
    rev: i64,
    /// The value's digest; `None` for a deletion.
    hash: Option<u64>,
    /// Acknowledged to a writer (rather than only observed).
    acked: bool,
}

struct KeyModel {
    family: Family,
    lease: i64,
    /// Known changes, by ascending revision.
    changes: Vec<Change>,
    /// Writes in flight or with an unknown outcome.
    unknown: Vec<Pending>,
}

/// A write not (yet) known to be applied or refused.
#[derive(Clone, Copy, Debug)]
struct Pending {
    hash: u64,
    /// Its call failed without an answer (else it is still in flight).
    failed: bool,
}

impl KeyModel {
    fn find(&self, rev: i64) -> Result<usize, usize> {
        self.changes.binary_search_by_key(&rev, |c| c.rev)
    }

    /// Records an applied change; an error when another one is known at
    /// the same revision.
    fn add(&mut self, change: Change) -> Result<(), String> {
        match self.find(change.rev) {
            Ok(i) => {
                let c = &mut self.changes[i];
                if c.hash != change.hash {
                    return Err(format!(
                        "two different changes at revision {}: {:?} and {:?}",
                        change.rev, c.hash, change.hash
                    ));
                }
                c.acked |= change.acked;
                Ok(())
            }
            Err(i) => {
                self.changes.insert(i, change);
                Ok(())
            }
        }
    }

    /// The newest change at or below `rev`.
    fn at(&self, rev: i64) -> Option<Change> {
        match self.find(rev) {
            Ok(i) => Some(self.changes[i]),
            Err(0) => None,
            Err(i) => Some(self.changes[i - 1]),
        }
    }

    /// Takes `hash` out of the unknown writes; `Some(failed)` when it was
    /// there.
    fn take_unknown(&mut self, hash: u64) -> Option<bool> {
        let i = self.unknown.iter().position(|p| p.hash == hash)?;
        Some(self.unknown.swap_remove(i).failed)
    }
}

struct LeaseModel {
    /// When the grant request was sent: the server's deadline is at most
    /// this plus the TTL.
    sent: Instant,
    ttl: i64,
}

/// Counters the report shows.
#[derive(Debug, Default, Clone)]
pub struct ModelStats {
    /// Acknowledged writes, per family (leases, events, pods).
    pub acked: [u64; 3],
    /// Writes whose call failed without an answer.
    pub unknown_outcome: u64,
    /// Of those, writes later found applied (by a read, a watch event or
    /// a failed CAS's Get).
    pub resolved_unknown: u64,
    /// Writes a watch event or a read showed applied before their
    /// response arrived.
    pub seen_before_ack: u64,
    /// CAS writes refused because the object had moved on.
    pub cas_conflicts: u64,
    /// Acknowledged writes lost in a SIGKILL's crash window (after the
    /// snapshot that was restored).
    pub lost_in_window: u64,
    /// Acknowledged writes lost because the snapshot holding them was
    /// damaged on purpose and an older generation was restored.
    pub lost_to_damage: u64,
    /// Objects found deleted by lease expiry at a check.
    pub expired_seen: u64,
}

/// The model; see the module docs. Shared by writers, watchers and checks
/// behind one lock.
pub struct Model {
    keys: HashMap<Bytes, KeyModel>,
    /// Acknowledged revisions of the current server run, for the watchers'
    /// completeness checks.
    acked: BTreeMap<i64, (Family, Bytes)>,
    leases: HashMap<i64, LeaseModel>,
    /// The highest revision any response of this run carried.
    pub max_rev: i64,
    /// Counters.
    pub stats: ModelStats,
    /// Slack on lease deadlines (clock reads, restore rounding).
    slack: Duration,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            keys: HashMap::new(),
            acked: BTreeMap::new(),
            leases: HashMap::new(),
            max_rev: 0,
            stats: ModelStats::default(),
            slack: Duration::from_secs(2),
        }
    }
}

fn key_str(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

impl Model {
    /// Notes a revision seen in a response header.
    pub fn saw_revision(&mut self, rev: i64) {
        self.max_rev = self.max_rev.max(rev);
    }

    /// A lease was granted; `sent` is when its grant request left.
    pub fn lease_granted(&mut self, id: i64, ttl: i64, sent: Instant) {
        self.leases.insert(id, LeaseModel { sent, ttl });
    }

    /// Whether lease `id` may have expired by `now` (unknown leases: yes).
    fn lease_may_have_expired(&self, id: i64, now: Instant) -> bool {
        match self.leases.get(&id) {
            Some(l) => now + self.slack >= l.sent + Duration::from_secs(l.ttl.max(0) as u64),
            None => true,
        }
    }

    /// A write of `value` (digest `hash`) to `key` is about to be sent.
    pub fn sent(&mut self, key: &Bytes, family: Family, hash: u64, lease: i64) {
        let km = self.keys.entry(key.clone()).or_insert_with(|| KeyModel {
            family,
            lease,
            changes: Vec::new(),
            unknown: Vec::new(),
        });
        km.lease = lease;
        km.unknown.push(Pending {
            hash,
            failed: false,
        });
    }

    /// The write `hash` to `key` was acknowledged at `rev`. Errors are
    /// violations: two acknowledged writes at one revision, or one at a
    /// revision where another change is known.
    pub fn acked(&mut self, key: &Bytes, rev: i64, hash: u64) -> Result<(), String> {
        self.saw_revision(rev);
        let Some(km) = self.keys.get_mut(key) else {
            return Err(format!("ack for {} that was never sent", key_str(key)));
        };
        let _ = km.take_unknown(hash);
        self.stats.acked[km.family as usize] += 1;
        let family = km.family;
        km.add(Change {
            rev,
            hash: Some(hash),
            acked: true,
        })
        .map_err(|e| format!("{}: {e}", key_str(key)))?;
        // A later ack means every earlier write of this key has settled: a
        // CAS write in flight before it can no longer apply.
        if family == Family::Leases {
            km.unknown.clear();
        }
        if let Some((_, other)) = self.acked.insert(rev, (family, key.clone())) {
            if other != key {
                return Err(format!(
                    "two acknowledged writes share revision {rev}: {} and {}",
                    key_str(&other),
                    key_str(key)
                ));
            }
        }
        Ok(())
    }

    /// The write was refused (a failed compare): it was not applied.
    pub fn refused(&mut self, key: &Bytes, hash: u64) {
        if let Some(km) = self.keys.get_mut(key) {
            let _ = km.take_unknown(hash);
        }
        self.stats.cas_conflicts += 1;
    }

    /// The call writing `hash` to `key` failed without an answer: the
    /// write stays unknown.
    pub fn failed(&mut self, key: &Bytes, hash: u64) {
        self.stats.unknown_outcome += 1;
        if let Some(p) = self
            .keys
            .get_mut(key)
            .and_then(|k| k.unknown.iter_mut().find(|p| p.hash == hash))
        {
            p.failed = true;
        }
    }

    /// Counts a pending write found applied.
    fn found_applied(stats: &mut ModelStats, failed: bool) {
        if failed {
            stats.resolved_unknown += 1;
        } else {
            stats.seen_before_ack += 1;
        }
    }

    /// A CAS found `key` at `served` (mod revision, digest) instead of the
    /// revision it compared against; resolves an unknown write, or returns
    /// a violation when the object holds something we never wrote or an
    /// older version than one acknowledged.
    pub fn cas_found(&mut self, key: &Bytes, served: Option<(i64, u64)>) -> Result<(), String> {
        let Some(km) = self.keys.get_mut(key) else {
            return Ok(());
        };
        let latest = km.changes.last().copied();
        match served {
            None => match latest {
                Some(c) if c.hash.is_some() => Err(format!(
                    "{} vanished: a CAS found it missing after the write at revision {}",
                    key_str(key),
                    c.rev
                )),
                _ => Ok(()),
            },
            Some((rev, hash)) => {
                if let Ok(i) = km.find(rev) {
                    let c = km.changes[i];
                    if c.hash != Some(hash) {
                        return Err(format!(
                            "{} at revision {rev} holds another value than the write known there",
                            key_str(key)
                        ));
                    }
                    if latest.is_some_and(|l| l.rev > rev) {
                        return Err(format!(
                            "{} served at revision {rev}, older than its write at revision {}",
                            key_str(key),
                            latest.map_or(0, |l| l.rev)
                        ));
                    }
                    return Ok(());
                }
                if let Some(failed) = km.take_unknown(hash) {
                    Self::found_applied(&mut self.stats, failed);
                    return km
                        .add(Change {
                            rev,
                            hash: Some(hash),
                            acked: false,
                        })
                        .map_err(|e| format!("{}: {e}", key_str(key)));
                }
                Err(format!(
                    "{} holds a value at revision {rev} that the soak never wrote",
                    key_str(key)
                ))
            }
        }
    }

    /// The newest known mod revision of `key` (`None` when it does not
    /// exist as far as the model knows): what a CAS compares against.
    pub fn current(&self, key: &Bytes) -> Option<i64> {
        let c = self.keys.get(key)?.changes.last()?;
        c.hash.map(|_| c.rev)
    }

    /// A watcher received a PUT of `key` at `rev`. `Ok(true)` when it
    /// resolved an unknown write; an error when the soak never sent that
    /// value, or another change is known at that revision.
    pub fn observed_put(&mut self, key: &Bytes, rev: i64, hash: u64) -> Result<bool, String> {
        let Some(km) = self.keys.get_mut(key) else {
            return Err(format!(
                "watch event: PUT of {} at revision {rev}, a key the soak never wrote",
                key_str(key)
            ));
        };
        if let Ok(i) = km.find(rev) {
            if km.changes[i].hash == Some(hash) {
                return Ok(false);
            }
            return Err(format!(
                "watch event: PUT of {} at revision {rev} carries another value than the write acknowledged there",
                key_str(key)
            ));
        }
        if let Some(failed) = km.take_unknown(hash) {
            Self::found_applied(&mut self.stats, failed);
            km.add(Change {
                rev,
                hash: Some(hash),
                acked: false,
            })
            .map_err(|e| format!("{}: {e}", key_str(key)))?;
            return Ok(true);
        }
        Err(format!(
            "watch event: PUT of {} at revision {rev} with a value the soak never sent (or already saw applied elsewhere)",
            key_str(key)
        ))
    }

    /// A watcher received a DELETE of `key` at `rev` (lease expiry). An
    /// error for objects that are never deleted, or a key never written.
    pub fn observed_delete(&mut self, key: &Bytes, rev: i64) -> Result<(), String> {
        let Some(km) = self.keys.get_mut(key) else {
            return Err(format!(
                "watch event: DELETE of {} at revision {rev}, a key the soak never wrote",
                key_str(key)
            ));
        };
        if km.lease == 0 {
            return Err(format!(
                "watch event: DELETE of {} at revision {rev}, an object without a lease that nobody deletes",
                key_str(key)
            ));
        }
        km.add(Change {
            rev,
            hash: None,
            acked: false,
        })
        .map_err(|e| format!("{}: {e}", key_str(key)))
    }

    /// Acknowledged writes of this server run above `rev` (a snapshot
    /// written on a graceful stop must have none).
    pub fn acked_above(&self, rev: i64) -> u64 {
        self.acked.range(rev + 1..).count() as u64
    }

    /// Acknowledged revisions of `family` in `(lo, hi]`, ascending.
    pub fn acked_between(&self, family: Family, lo: i64, hi: i64) -> Vec<i64> {
        if hi <= lo {
            return Vec::new();
        }
        self.acked
            .range(lo + 1..=hi)
            .filter(|(_, (f, _))| *f == family)
            .map(|(r, _)| *r)
            .collect()
    }

    /// Forgets acknowledged revisions at or below `rev` (every watcher has
    /// been checked past them).
    pub fn forget_acked_upto(&mut self, rev: i64) {
        self.acked = self.acked.split_off(&(rev + 1));
    }

    /// Checks `served` (the objects of `family` as read at revision `at`)
    /// against the model; returns the violations. Also resolves unknown
    /// writes the read shows applied, and notes objects found deleted by
    /// lease expiry.
    pub fn check_at(
        &mut self,
        family: Family,
        at: i64,
        served: &Served,
        now: Instant,
    ) -> Vec<String> {
        let mut v = Vec::new();
        let mut expired = Vec::new();
        let lease_expired: HashMap<i64, bool> = self
            .keys
            .values()
            .filter(|k| k.family == family && k.lease != 0)
            .map(|k| (k.lease, self.lease_may_have_expired(k.lease, now)))
            .collect();
        for (key, km) in self.keys.iter_mut().filter(|(_, k)| k.family == family) {
            let known = km.at(at);
            let shown = served.get(key);
            let name = key_str(key);
            match (known, shown) {
                (_, Some(s)) if s.rev > at => v.push(format!(
                    "{name}: read at revision {at} shows mod revision {}",
                    s.rev
                )),
                (Some(c), Some(s)) if s.rev == c.rev => {
                    if c.hash != Some(s.hash) {
                        v.push(format!(
                            "{name}: revision {} holds another value than the write known there",
                            s.rev
                        ));
                    }
                }
                (Some(c), Some(s)) if s.rev < c.rev => v.push(format!(
                    "{name}: the {} at revision {} is not readable at revision {at}: the read shows the older revision {}",
                    if c.hash.is_none() {
                        "deletion"
                    } else if c.acked {
                        "acknowledged write"
                    } else {
                        "write observed applied"
                    },
                    c.rev,
                    s.rev
                )),
                (_, Some(s)) => {
                    // Newer than anything known at `at`: must be a write in
                    // flight or with an unknown outcome.
                    if let Some(failed) = km.take_unknown(s.hash) {
                        Self::found_applied(&mut self.stats, failed);
                        if let Err(e) = km.add(Change {
                            rev: s.rev,
                            hash: Some(s.hash),
                            acked: false,
                        }) {
                            v.push(format!("{name}: {e}"));
                        }
                    } else {
                        v.push(format!(
                            "{name}: read at revision {at} shows a value at revision {} that the soak never wrote",
                            s.rev
                        ));
                    }
                }
                (Some(c), None) if c.hash.is_some() => {
                    if km.lease != 0 && lease_expired.get(&km.lease).copied().unwrap_or(true) {
                        expired.push(key.clone());
                    } else {
                        v.push(format!(
                            "{name}: the {} write at revision {} is not readable at revision {at} (object missing{})",
                            if c.acked { "acknowledged" } else { "observed" },
                            c.rev,
                            if km.lease != 0 {
                                format!(", and its lease {:x} cannot have expired yet", km.lease)
                            } else {
                                String::new()
                            }
                        ));
                    }
                }
                (Some(_), None) | (None, None) => {}
            }
        }
        for key in expired {
            if let Some(km) = self.keys.get_mut(&key) {
                if km.find(at).is_err() && km.changes.last().is_some_and(|c| c.rev < at) {
                    km.changes.push(Change {
                        rev: at,
                        hash: None,
                        acked: false,
                    });
                    self.stats.expired_seen += 1;
                }
            }
        }
        for key in served.keys() {
            if Family::of(key) == Some(family) && !self.keys.contains_key(key) {
                v.push(format!(
                    "{}: served at revision {at} but the soak never wrote it",
                    key_str(key)
                ));
            }
        }
        v
    }

    /// After a restart that restored the snapshot at `snap_rev` (0: none):
    /// counts the acknowledged writes after it as lost (`damaged`: to a
    /// damaged snapshot, else to the crash window), forgets every change
    /// after it and every unknown write, and takes `served` (what the new
    /// server holds, already checked with [`Model::check_at`]) as each
    /// object's state. Returns the writes lost.
    pub fn rebase(&mut self, snap_rev: i64, served: &Served, damaged: bool) -> u64 {
        let mut lost = 0;
        for (key, km) in self.keys.iter_mut() {
            lost += km
                .changes
                .iter()
                .filter(|c| c.rev > snap_rev && c.acked && c.hash.is_some())
                .count() as u64;
            km.changes.retain(|c| c.rev <= snap_rev);
            km.unknown.clear();
            match served.get(key) {
                Some(s) => {
                    if km.changes.last().is_none_or(|c| c.rev != s.rev) {
                        km.changes.push(Change {
                            rev: s.rev,
                            hash: Some(s.hash),
                            acked: false,
                        });
                    }
                }
                None => {
                    if km.changes.last().is_some_and(|c| c.hash.is_some()) {
                        km.changes.push(Change {
                            rev: snap_rev.max(km.changes.last().map_or(0, |c| c.rev)),
                            hash: None,
                            acked: false,
                        });
                    }
                }
            }
        }
        // Objects that no longer exist and never will again.
        self.keys
            .retain(|_, k| k.changes.last().is_some_and(|c| c.hash.is_some()));
        self.acked.clear();
        if damaged {
            self.stats.lost_to_damage += lost;
        } else {
            self.stats.lost_in_window += lost;
        }
        lost
    }

    /// Drops history no check can need any more: per object, the changes
    /// before the newest one at or below `floor` (the oldest snapshot a
    /// restart could still restore), and objects deleted at or below it.
    pub fn prune(&mut self, floor: i64) {
        for km in self.keys.values_mut() {
            let keep_from = match km.find(floor) {
                Ok(i) => i,
                Err(i) => i.saturating_sub(1),
            };
            if keep_from > 0 {
                km.changes.drain(..keep_from);
            }
        }
        self.keys.retain(|_, k| {
            !(k.unknown.is_empty()
                && k.changes.len() == 1
                && k.changes[0].hash.is_none()
                && k.changes[0].rev <= floor)
        });
    }

    /// Objects tracked (for the report).
    pub fn tracked(&self) -> usize {
        self.keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Bytes {
        Bytes::from(s.to_string())
    }

    fn val(rev: i64, hash: u64) -> Val {
        Val {
            create: 1,
            rev,
            version: 1,
            hash,
            lease: 0,
        }
    }

    #[test]
    fn acknowledged_writes_must_be_readable_at_later_revisions() {
        let mut m = Model::default();
        let k = key("/registry/leases/kube-node-lease/n1");
        m.sent(&k, Family::Leases, 1, 0);
        m.acked(&k, 10, 1).unwrap();
        m.sent(&k, Family::Leases, 2, 0);
        m.acked(&k, 20, 2).unwrap();
        let now = Instant::now();
        let ok: Served = [(k.clone(), val(20, 2))].into_iter().collect();
        assert!(m.check_at(Family::Leases, 25, &ok, now).is_empty());
        // At revision 15 the first write is the state.
        let old: Served = [(k.clone(), val(10, 1))].into_iter().collect();
        assert!(m.check_at(Family::Leases, 15, &old, now).is_empty());
        // An older version at 25 is a lost acknowledged write.
        let v = m.check_at(Family::Leases, 25, &old, now);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("acknowledged write at revision 20"), "{v:?}");
        // Missing altogether, without a lease, too.
        assert_eq!(m.check_at(Family::Leases, 25, &Served::new(), now).len(), 1);
        // A value never written is a violation.
        let foreign: Served = [(k.clone(), val(22, 99))].into_iter().collect();
        assert_eq!(m.check_at(Family::Leases, 25, &foreign, now).len(), 1);
    }

    #[test]
    fn unknown_outcomes_resolve_when_seen_and_never_count_as_lost() {
        let mut m = Model::default();
        let k = key("/registry/leases/kube-node-lease/n1");
        m.sent(&k, Family::Leases, 1, 0);
        m.acked(&k, 10, 1).unwrap();
        m.sent(&k, Family::Leases, 2, 0);
        m.failed(&k, 2);
        // The read shows the unknown write applied at 12.
        let shown: Served = [(k.clone(), val(12, 2))].into_iter().collect();
        assert!(m
            .check_at(Family::Leases, 30, &shown, Instant::now())
            .is_empty());
        assert_eq!(m.current(&k), Some(12));
        assert_eq!(m.stats.resolved_unknown, 1);
        // A CAS that finds it resolves the same way.
        m.sent(&k, Family::Leases, 3, 0);
        assert!(m.cas_found(&k, Some((14, 3))).is_ok());
        assert!(m.cas_found(&k, Some((16, 77))).is_err());
    }

    #[test]
    fn the_crash_window_is_what_was_acknowledged_after_the_snapshot() {
        let mut m = Model::default();
        let a = key("/registry/leases/kube-node-lease/a");
        let b = key("/registry/pods/b");
        m.sent(&a, Family::Leases, 1, 0);
        m.acked(&a, 10, 1).unwrap();
        m.sent(&b, Family::Pods, 5, 0);
        m.acked(&b, 11, 5).unwrap();
        m.sent(&a, Family::Leases, 2, 0);
        m.acked(&a, 12, 2).unwrap();
        // Snapshot at 11: a at 10 and b at 11 must be there.
        let restored: Served = [(a.clone(), val(10, 1)), (b.clone(), val(11, 5))]
            .into_iter()
            .collect();
        assert!(m
            .check_at(Family::Leases, 11, &restored, Instant::now())
            .is_empty());
        assert!(m
            .check_at(Family::Pods, 11, &restored, Instant::now())
            .is_empty());
        // Losing b, acknowledged at 11, would not be within the window.
        let lossy: Served = [(a.clone(), val(10, 1))].into_iter().collect();
        assert_eq!(
            m.check_at(Family::Pods, 11, &lossy, Instant::now()).len(),
            1
        );
        assert_eq!(m.rebase(11, &restored, false), 1);
        assert_eq!(m.stats.lost_in_window, 1);
        assert_eq!(m.current(&a), Some(10));
        assert!(m.acked_between(Family::Leases, 0, 100).is_empty());
    }

    #[test]
    fn objects_with_expired_leases_may_be_missing_others_may_not() {
        let mut m = Model::default();
        let past = Instant::now() - Duration::from_secs(60);
        m.lease_granted(7, 5, past);
        m.lease_granted(8, 3600, Instant::now());
        let e1 = key("/registry/events/ns/e1");
        let e2 = key("/registry/events/ns/e2");
        m.sent(&e1, Family::Events, 1, 7);
        m.acked(&e1, 10, 1).unwrap();
        m.sent(&e2, Family::Events, 2, 8);
        m.acked(&e2, 11, 2).unwrap();
        let v = m.check_at(Family::Events, 20, &Served::new(), Instant::now());
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("/e2"), "{v:?}");
        assert_eq!(m.stats.expired_seen, 1);
        assert!(m.observed_delete(&e1, 15).is_ok());
        // Node leases have no lease: a DELETE of one is a violation.
        let n = key("/registry/leases/kube-node-lease/n");
        m.sent(&n, Family::Leases, 3, 0);
        m.acked(&n, 12, 3).unwrap();
        assert!(m.observed_delete(&n, 13).is_err());
    }

    #[test]
    fn watch_events_are_matched_against_writes() {
        let mut m = Model::default();
        let k = key("/registry/pods/p");
        m.sent(&k, Family::Pods, 1, 0);
        // The event may beat the response.
        assert_eq!(m.observed_put(&k, 10, 1), Ok(true));
        m.acked(&k, 10, 1).unwrap();
        assert_eq!(m.observed_put(&k, 10, 1), Ok(false));
        assert!(m.observed_put(&k, 10, 2).is_err());
        assert!(m.observed_put(&key("/registry/pods/zz"), 11, 1).is_err());
        assert_eq!(m.acked_between(Family::Pods, 9, 10), vec![10]);
        assert!(m.acked_between(Family::Leases, 9, 10).is_empty());
        let other = key("/registry/pods/q");
        m.sent(&other, Family::Pods, 3, 0);
        assert!(
            m.acked(&other, 10, 3).is_err(),
            "two writes at one revision"
        );
    }
}
