//! The [`Proposer`] calls of requests that may come from an authenticated
//! user: without a caller (auth off) they take the usual path unchanged;
//! with one, the request travels as `Entry::Authorized` and its
//! permissions are checked where it applies.

use super::Proposer;
use crate::auth::AuthInfo;
use crate::error::Result;
use crate::mvcc::{
    Applied, DeleteRequest, DeleteResponse, Entry, PutRequest, PutResponse, Store, TxnRequest,
    TxnResponse,
};

impl Proposer {
    /// Put by `by` (see [`Proposer::put`]).
    pub async fn put_by(
        &self,
        store: &Store,
        by: Option<AuthInfo>,
        req: PutRequest,
    ) -> Result<PutResponse> {
        let Some(by) = by else {
            return self.put(store, req).await;
        };
        match self.apply_as(store, by, Entry::Put(req)).await? {
            Applied::Put(p) => Ok(p),
            other => unreachable!("a put applied as {other:?}"),
        }
    }

    /// DeleteRange by `by` (see [`Proposer::delete_range`]).
    pub async fn delete_range_by(
        &self,
        store: &Store,
        by: Option<AuthInfo>,
        req: DeleteRequest,
    ) -> Result<DeleteResponse> {
        let Some(by) = by else {
            return self.delete_range(store, req).await;
        };
        match self.apply_as(store, by, Entry::Delete(req)).await? {
            Applied::Delete(d) => Ok(d),
            other => unreachable!("a delete applied as {other:?}"),
        }
    }

    /// Txn by `by` (see [`Proposer::txn`]).
    pub async fn txn_by(
        &self,
        store: &Store,
        by: Option<AuthInfo>,
        req: TxnRequest,
    ) -> Result<TxnResponse> {
        let Some(by) = by else {
            return self.txn(store, req).await;
        };
        match self.apply_as(store, by, Entry::Txn(req)).await? {
            Applied::Txn(t) => Ok(t),
            other => unreachable!("a txn applied as {other:?}"),
        }
    }

    /// LeaseRevoke by `by` (see [`Proposer::lease_revoke`]): etcd requires
    /// WRITE on every key attached to the lease.
    pub async fn lease_revoke_by(
        &self,
        store: &Store,
        by: Option<AuthInfo>,
        id: i64,
    ) -> Result<i64> {
        let Some(by) = by else {
            return self.lease_revoke(store, id).await;
        };
        match self.apply_as(store, by, Entry::LeaseRevoke { id }).await? {
            Applied::LeaseRevoke { revision } => Ok(revision),
            other => unreachable!("a revoke applied as {other:?}"),
        }
    }
}
