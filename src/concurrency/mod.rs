//! etcd's concurrency recipes (the mutex and the election of clientv3's
//! `concurrency` package) run inside the server, for the `v3lockpb.Lock`
//! and `v3electionpb.Election` services.
//!
//! Why the recipes and not a lock table of our own: clients that implement
//! locks and elections themselves (`etcdctl lock`, `etcdctl elect`, Go's
//! clientv3 `concurrency`, most other client libraries) and the server-side
//! services must exclude each other on the same names. So every step is the
//! same KV operation etcd's server makes through its in-process client, in
//! the same order, with the same key layout:
//!
//! * a session is a lease; a waiter or candidate is the key
//!   `<name>/<lease ID in lowercase hex>` attached to it, created with
//!   a create-if-absent txn that also reads the current owner;
//! * the owner (lock holder, leader) is the key under `<name>/` with the
//!   lowest create revision;
//! * a waiter waits until every key under the prefix created before its
//!   own is deleted: it repeatedly finds the newest such key and waits for
//!   its deletion.
//!
//! Writes go through the backend, so this works in cluster mode; reads
//! are linearizable there (read barrier first), as clientv3's are; waits
//! follow the store's change log through the watch hub (`wait::Follow`).
//!
//! A request whose client goes away while it waits (its future is dropped)
//! removes its key, as etcd's server does when the request's context ends:
//! `Cleanup` runs the removal on a short task of its own.

mod recipe_error;
mod wait;

pub use recipe_error::RecipeError;

use crate::backend::{Backend, Mode};
use crate::error::Error;
use crate::mvcc::{
    Compare, CompareResult, CompareTarget, DeleteRequest, EventKind, Kv, PutRequest, RangeRequest,
    RangeResponse, RequestOp, ResponseOp, SortOrder, SortTarget, Store, TxnRequest, TxnResponse,
};
use bytes::Bytes;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use wait::Follow;

/// TTL of the session lease the server grants when a request names lease 0,
/// as clientv3's sessions default to.
pub const SESSION_TTL: i64 = 60;

/// What a recipe returns on failure.
pub type Result<T> = std::result::Result<T, RecipeError>;

/// A lock held: its key, and the revision of the response header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locked {
    /// `<name>/<lease hex>`.
    pub key: Bytes,
    /// Header revision (see [`Recipes::lock`]).
    pub revision: i64,
}

/// A leader key: what a campaign wins and Proclaim and Resign name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaderKey {
    /// The election's name.
    pub name: Bytes,
    /// `<name>/<lease hex>`.
    pub key: Bytes,
    /// The key's create revision.
    pub rev: i64,
    /// The session lease.
    pub lease: i64,
}

/// One observation of an election's leader: the header revision and the
/// leader's key-value.
pub type Observed = (i64, Kv);

/// The recipes over one store; cheap to clone.
#[derive(Clone)]
pub struct Recipes {
    store: Arc<Store>,
    backend: Mode,
    stop: watch::Receiver<bool>,
}

/// `name` + `/`: the prefix of every key of a lock or election.
fn prefix_of(name: &[u8]) -> Bytes {
    let mut p = Vec::with_capacity(name.len() + 1);
    p.extend_from_slice(name);
    p.push(b'/');
    Bytes::from(p)
}

/// The end of the range of every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Bytes::from(end);
        }
    }
    Bytes::from_static(b"\0")
}

/// A session's key under `prefix`: the lease ID as Go's `%x` prints an
/// int64 (lowercase hex, a minus sign before negative IDs).
pub fn session_key(prefix: &[u8], lease: i64) -> Bytes {
    let hex = if lease < 0 {
        format!("-{:x}", lease.unsigned_abs())
    } else {
        format!("{lease:x}")
    };
    let mut k = Vec::with_capacity(prefix.len() + hex.len());
    k.extend_from_slice(prefix);
    k.extend_from_slice(hex.as_bytes());
    Bytes::from(k)
}

/// The key under `prefix` with the lowest (`Ascend`) or highest create
/// revision, at most `max_create` (0 for any).
fn by_create(prefix: &Bytes, order: SortOrder, max_create: i64) -> RangeRequest {
    RangeRequest {
        key: prefix.clone(),
        range_end: prefix_end(prefix),
        limit: 1,
        sort_order: order,
        sort_target: SortTarget::Create,
        max_create_revision: max_create,
        ..Default::default()
    }
}

fn get(key: &Bytes) -> RequestOp {
    RequestOp::Range(RangeRequest {
        key: key.clone(),
        ..Default::default()
    })
}

fn create_is(key: &Bytes, rev: i64) -> Compare {
    Compare {
        result: CompareResult::Equal,
        target: CompareTarget::Create(rev),
        key: key.clone(),
        range_end: Bytes::new(),
    }
}

fn put(key: &Bytes, value: Bytes, lease: i64) -> RequestOp {
    RequestOp::Put(PutRequest {
        key: key.clone(),
        value,
        lease,
        ..Default::default()
    })
}

fn delete(key: &Bytes) -> RequestOp {
    RequestOp::Delete(DeleteRequest {
        key: key.clone(),
        ..Default::default()
    })
}

/// The key-values of the `i`th response of a txn (a Range op).
fn kvs(resp: &TxnResponse, i: usize) -> &[Kv] {
    match resp.responses.get(i) {
        Some(ResponseOp::Range(r)) => &r.kvs,
        _ => &[],
    }
}

/// Removes a waiter's key when the request ends without handing it to the
/// client (the client went away, or the server stops): the txn runs on a
/// task of its own, which ends once it is applied.
struct Cleanup {
    recipes: Option<Recipes>,
    txn: TxnRequest,
}

impl Cleanup {
    fn new(recipes: &Recipes, txn: TxnRequest) -> Self {
        Cleanup {
            recipes: Some(recipes.clone()),
            txn,
        }
    }

    /// The request handed the key over: nothing to clean up.
    fn disarm(mut self) {
        self.recipes = None;
    }

    /// Cleans up now, in the request itself.
    async fn run(mut self) {
        if let Some(r) = self.recipes.take() {
            let txn = std::mem::take(&mut self.txn);
            let _ = r.backend.txn(None, txn).await;
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (Some(r), Ok(rt)) = (self.recipes.take(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        let txn = std::mem::take(&mut self.txn);
        rt.spawn(async move {
            if let Err(e) = r.backend.txn(None, txn).await {
                let error = e.message();
                tracing::warn!(error, "removing an abandoned lock or campaign key failed");
            }
        });
    }
}

impl Recipes {
    /// The recipes over `store`, writing through `backend`; waits end when
    /// `stop` turns true.
    pub fn new(store: Arc<Store>, backend: Mode, stop: watch::Receiver<bool>) -> Self {
        Recipes {
            store,
            backend,
            stop,
        }
    }

    /// A Range as clientv3's Get makes it: linearizable in cluster mode.
    async fn range(&self, req: RangeRequest) -> Result<RangeResponse> {
        self.backend.read_index().await?;
        Ok(self.store.range(&req)?)
    }

    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        Ok(self.backend.txn(None, req).await?)
    }

    /// The session lease for a request naming `lease`: 0 gets a new lease
    /// of [`SESSION_TTL`] seconds, which nobody keeps alive (etcd's server
    /// orphans the sessions it creates). With `check`, a lease that does
    /// not exist is refused with etcd's "requested lease not found" even
    /// when ephd adopts unknown lease IDs on puts (its Kubernetes-safe
    /// default): a session cannot start on a lease that is gone.
    async fn session(&self, lease: i64, check: bool) -> Result<i64> {
        if lease == 0 {
            let granted = self.backend.lease_grant(0, SESSION_TTL).await?;
            return Ok(granted.id);
        }
        if check && self.store.limits().adopt_unknown_ttl.is_some() {
            self.backend.read_index().await?;
            if self.store.lease_time_to_live(lease, false).ttl == -1 {
                return Err(Error::LeaseNotFound.into());
            }
        }
        Ok(lease)
    }

    /// Waits until every key under `prefix` created at or before
    /// `max_create` is deleted; returns the revision of the read that
    /// found none.
    async fn wait_deletes(&self, prefix: &Bytes, max_create: i64) -> Result<i64> {
        loop {
            let resp = self
                .range(by_create(prefix, SortOrder::Descend, max_create))
                .await?;
            let Some(last) = resp.kvs.first() else {
                return Ok(resp.revision);
            };
            let mut follow = Follow::new(
                &self.store,
                last.key.clone(),
                Bytes::new(),
                resp.revision,
                self.stop.clone(),
            )?;
            while follow.next().await?.kind != EventKind::Delete {}
        }
    }

    /// Lock: queue `<name>/<lease>` and wait until it is the oldest key
    /// under `<name>/`. The header revision is the acquiring txn's when the
    /// lock was free, else that of the read that found the key still there
    /// after the wait. A key whose lease expired during the wait fails with
    /// [`RecipeError::SessionExpired`], as etcd 3.6's mutex does.
    pub async fn lock(&self, name: &[u8], lease: i64) -> Result<Locked> {
        let lease = self.session(lease, true).await?;
        let prefix = prefix_of(name);
        let key = session_key(&prefix, lease);
        let owner = RequestOp::Range(by_create(&prefix, SortOrder::Ascend, 0));
        let resp = self
            .txn(TxnRequest {
                compare: vec![create_is(&key, 0)],
                success: vec![put(&key, Bytes::new(), lease), owner.clone()],
                failure: vec![get(&key), owner],
            })
            .await?;
        let mine = if resp.succeeded {
            resp.revision
        } else {
            kvs(&resp, 0).first().map_or(0, |kv| kv.create_revision)
        };
        match kvs(&resp, 1).first() {
            Some(first) if first.create_revision != mine => {}
            _ => {
                return Ok(Locked {
                    key,
                    revision: resp.revision,
                })
            }
        }
        let unlock = TxnRequest {
            success: vec![delete(&key)],
            ..Default::default()
        };
        let cleanup = Cleanup::new(self, unlock);
        match self.wait_deletes(&prefix, mine - 1).await {
            Ok(_) => cleanup.disarm(),
            Err(RecipeError::ShuttingDown) => {
                cleanup.run().await;
                return Err(RecipeError::ShuttingDown);
            }
            Err(_) => {
                // etcd unlocks and then finds its key gone.
                cleanup.run().await;
                return Err(RecipeError::SessionExpired);
            }
        }
        let now = self.range(RangeRequest {
            key: key.clone(),
            ..Default::default()
        });
        let now = now.await?;
        if now.kvs.is_empty() {
            return Err(RecipeError::SessionExpired);
        }
        Ok(Locked {
            key,
            revision: now.revision,
        })
    }

    /// Unlock: deletes `key` (any key: etcd does not check it is a lock);
    /// returns the header revision.
    pub async fn unlock(&self, key: Bytes) -> Result<i64> {
        let req = DeleteRequest {
            key,
            ..Default::default()
        };
        Ok(self.backend.delete_range(None, req).await?.revision)
    }

    /// Campaign: put `<name>/<lease>` with `value` (or proclaim `value` on
    /// it when it exists with another value) and wait until every older
    /// candidate is gone. Returns the leader key and the header revision,
    /// which is that of the first txn, as etcd answers.
    pub async fn campaign(
        &self,
        name: Bytes,
        lease: i64,
        value: Bytes,
    ) -> Result<(LeaderKey, i64)> {
        let lease = self.session(lease, true).await?;
        let prefix = prefix_of(&name);
        let key = session_key(&prefix, lease);
        let resp = self
            .txn(TxnRequest {
                compare: vec![create_is(&key, 0)],
                success: vec![put(&key, value.clone(), lease)],
                failure: vec![get(&key)],
            })
            .await?;
        let mut leader = LeaderKey {
            name,
            key: key.clone(),
            rev: resp.revision,
            lease,
        };
        if !resp.succeeded {
            let existing = kvs(&resp, 0).first().cloned();
            if let Some(kv) = existing {
                leader.rev = kv.create_revision;
                if kv.value != value {
                    if let Err(e) = self.proclaim_as(&leader, value).await {
                        let _ = self.txn(self.resign_txn(&leader)).await;
                        return Err(e);
                    }
                }
            }
        }
        let cleanup = Cleanup::new(self, self.resign_txn(&leader));
        match self.wait_deletes(&prefix, leader.rev - 1).await {
            Ok(_) => cleanup.disarm(),
            Err(RecipeError::ShuttingDown) => {
                cleanup.run().await;
                return Err(RecipeError::ShuttingDown);
            }
            Err(e) => {
                // etcd resigns only when the request's context ended.
                cleanup.disarm();
                return Err(e);
            }
        }
        Ok((leader, resp.revision))
    }

    fn resign_txn(&self, leader: &LeaderKey) -> TxnRequest {
        TxnRequest {
            compare: vec![create_is(&leader.key, leader.rev)],
            success: vec![delete(&leader.key)],
            failure: Vec::new(),
        }
    }

    async fn proclaim_as(&self, leader: &LeaderKey, value: Bytes) -> Result<i64> {
        let resp = self
            .txn(TxnRequest {
                compare: vec![create_is(&leader.key, leader.rev)],
                success: vec![put(&leader.key, value, leader.lease)],
                failure: Vec::new(),
            })
            .await?;
        if !resp.succeeded {
            return Err(RecipeError::NotLeader);
        }
        Ok(resp.revision)
    }

    /// Proclaim: a new value on the leader key, if it still exists with the
    /// create revision campaigned. Returns the header revision.
    pub async fn proclaim(&self, leader: Option<LeaderKey>, value: Bytes) -> Result<i64> {
        let mut leader = leader.ok_or(RecipeError::MissingLeaderKey)?;
        leader.lease = self.session(leader.lease, false).await?;
        if self.store.limits().adopt_unknown_ttl.is_some()
            && self.store.lease_time_to_live(leader.lease, false).ttl == -1
        {
            // etcd's order: the compare decides first, then the put's lease.
            let now = self.range(RangeRequest {
                key: leader.key.clone(),
                ..Default::default()
            });
            return Err(match now.await?.kvs.first() {
                Some(kv) if kv.create_revision == leader.rev => Error::LeaseNotFound.into(),
                _ => RecipeError::NotLeader,
            });
        }
        self.proclaim_as(&leader, value).await
    }

    /// Resign: deletes the leader key if it still exists with the create
    /// revision campaigned; succeeds either way, as etcd does. Returns the
    /// header revision.
    pub async fn resign(&self, leader: Option<LeaderKey>) -> Result<i64> {
        let mut leader = leader.ok_or(RecipeError::MissingLeaderKey)?;
        // etcd opens a session for it, granting a lease for lease 0.
        leader.lease = self.session(leader.lease, false).await?;
        Ok(self.txn(self.resign_txn(&leader)).await?.revision)
    }

    /// Leader: the oldest candidate's key-value, with the read's revision.
    pub async fn leader(&self, name: &[u8]) -> Result<Observed> {
        let prefix = prefix_of(name);
        let resp = self.range(by_create(&prefix, SortOrder::Ascend, 0)).await?;
        match resp.kvs.first() {
            Some(kv) => Ok((resp.revision, kv.clone())),
            None => Err(RecipeError::NoLeader),
        }
    }

    /// Observe: sends the leader, then every new value it proclaims, then
    /// the next leader once it is deleted, and so on, as etcd's observer
    /// does. Returns when `out` is closed, with [`RecipeError::ShuttingDown`]
    /// when the server stops, and quietly (the stream ends) when the store
    /// cannot be followed any more (compaction), as etcd's stream does.
    pub async fn observe(&self, name: &[u8], out: &mpsc::Sender<Observed>) -> Result<()> {
        let prefix = prefix_of(name);
        loop {
            let resp = match self.range(by_create(&prefix, SortOrder::Ascend, 0)).await {
                Ok(r) => r,
                Err(RecipeError::ShuttingDown) => return Err(RecipeError::ShuttingDown),
                Err(_) => return Ok(()),
            };
            let (header, kv) = match resp.kvs.first() {
                Some(kv) => (resp.revision, kv.clone()),
                None => {
                    // The first put under the prefix, from the read on.
                    let end = prefix_end(&prefix);
                    let first = self.first_put(prefix.clone(), end, resp.revision).await;
                    match first {
                        Ok(kv) => (kv.mod_revision, kv),
                        Err(RecipeError::ShuttingDown) => return Err(RecipeError::ShuttingDown),
                        Err(_) => return Ok(()),
                    }
                }
            };
            if out.send((header, kv.clone())).await.is_err() {
                return Ok(());
            }
            let follow = Follow::new(
                &self.store,
                kv.key.clone(),
                Bytes::new(),
                header + 1,
                self.stop.clone(),
            );
            let mut follow = match follow {
                Ok(f) => f,
                Err(_) => return Ok(()),
            };
            loop {
                match follow.next().await {
                    Ok(e) if e.kind == EventKind::Delete => break,
                    Ok(e) => {
                        if out.send((e.kv.mod_revision, e.kv)).await.is_err() {
                            return Ok(());
                        }
                    }
                    Err(RecipeError::ShuttingDown) => return Err(RecipeError::ShuttingDown),
                    Err(_) => return Ok(()),
                }
            }
        }
    }

    async fn first_put(&self, key: Bytes, end: Bytes, from: i64) -> Result<Kv> {
        let mut follow = Follow::new(&self.store, key, end, from, self.stop.clone())?;
        loop {
            let e = follow.next().await?;
            if e.kind == EventKind::Put {
                return Ok(e.kv);
            }
        }
    }
}

#[cfg(test)]
mod tests;
