//! The Lock service (`v3lockpb.Lock`): etcd's distributed lock, served by
//! the mutex recipe in [`crate::concurrency`] on ephd's own KV, leases and
//! watches, so it excludes client-side lockers (`etcdctl lock`) too.

use super::Shared;
use crate::concurrency::{RecipeError, Recipes};
use crate::proto::v3lockpb::{self as pb, lock_server::Lock};
use tonic::{Request, Response, Status};

/// Serves Lock and Unlock.
pub struct LockService {
    shared: Shared,
    recipes: Recipes,
}

impl LockService {
    /// The service over the server's store, backend and stop signal.
    pub fn new(shared: Shared) -> Self {
        let recipes = Recipes::new(
            shared.store.clone(),
            shared.backend.clone(),
            shared.stop.clone(),
        );
        LockService { shared, recipes }
    }
}

#[tonic::async_trait]
impl Lock for LockService {
    async fn lock(
        &self,
        req: Request<pb::LockRequest>,
    ) -> Result<Response<pb::LockResponse>, Status> {
        let req = req.into_inner();
        let locked = self
            .recipes
            .lock(&req.name, req.lease)
            .await
            .map_err(recipe_status)?;
        Ok(Response::new(pb::LockResponse {
            header: self.shared.info.header(locked.revision),
            key: locked.key,
        }))
    }

    async fn unlock(
        &self,
        req: Request<pb::UnlockRequest>,
    ) -> Result<Response<pb::UnlockResponse>, Status> {
        let key = req.into_inner().key;
        let rev = self.recipes.unlock(key).await.map_err(recipe_status)?;
        Ok(Response::new(pb::UnlockResponse {
            header: self.shared.info.header(rev),
        }))
    }
}

/// The status etcd's lock and election servers answer a failed recipe
/// with: they return their in-process client's error as it is, which gRPC
/// sends with code Unknown and the error's text. Shutdown ends a request
/// as every other stream of the server ends then.
pub(super) fn recipe_status(e: RecipeError) -> Status {
    match e {
        RecipeError::ShuttingDown => super::shutting_down(),
        e => Status::unknown(e.message()),
    }
}
