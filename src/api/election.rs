//! The Election service (`v3electionpb.Election`): etcd's leader election,
//! served by the election recipe in [`crate::concurrency`] on ephd's own
//! KV, leases and watches, so server-side candidates and client-side ones
//! (`etcdctl elect`) take part in the same elections.

use super::lock::recipe_status;
use super::{convert, shutting_down, Shared};
use crate::concurrency::{LeaderKey, RecipeError, Recipes};
use crate::proto::v3electionpb::{self as pb, election_server::Election};
use futures::Stream;
use std::pin::Pin;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// Serves Campaign, Proclaim, Leader, Observe and Resign.
pub struct ElectionService {
    shared: Shared,
    recipes: Recipes,
}

impl ElectionService {
    /// The service over the server's store, backend and stop signal.
    pub fn new(shared: Shared) -> Self {
        let recipes = Recipes::new(
            shared.store.clone(),
            shared.backend.clone(),
            shared.stop.clone(),
        );
        ElectionService { shared, recipes }
    }
}

fn leader_key(k: pb::LeaderKey) -> LeaderKey {
    LeaderKey {
        name: k.name,
        key: k.key,
        rev: k.rev,
        lease: k.lease,
    }
}

type ObserveOut = Pin<Box<dyn Stream<Item = Result<pb::LeaderResponse, Status>> + Send>>;

/// Responses an Observe stream holds for a client that reads slowly; the
/// observer waits (holding only its cursor) while they are unread.
const OBSERVE_BUFFER: usize = 16;

#[tonic::async_trait]
impl Election for ElectionService {
    async fn campaign(
        &self,
        req: Request<pb::CampaignRequest>,
    ) -> Result<Response<pb::CampaignResponse>, Status> {
        let req = req.into_inner();
        let (leader, rev) = self
            .recipes
            .campaign(req.name, req.lease, req.value)
            .await
            .map_err(recipe_status)?;
        Ok(Response::new(pb::CampaignResponse {
            header: self.shared.info.header(rev),
            leader: Some(pb::LeaderKey {
                name: leader.name,
                key: leader.key,
                rev: leader.rev,
                lease: leader.lease,
            }),
        }))
    }

    async fn proclaim(
        &self,
        req: Request<pb::ProclaimRequest>,
    ) -> Result<Response<pb::ProclaimResponse>, Status> {
        let req = req.into_inner();
        let leader = req.leader.map(leader_key);
        let rev = self
            .recipes
            .proclaim(leader, req.value)
            .await
            .map_err(recipe_status)?;
        Ok(Response::new(pb::ProclaimResponse {
            header: self.shared.info.header(rev),
        }))
    }

    async fn leader(
        &self,
        req: Request<pb::LeaderRequest>,
    ) -> Result<Response<pb::LeaderResponse>, Status> {
        let name = req.into_inner().name;
        let (rev, kv) = self.recipes.leader(&name).await.map_err(recipe_status)?;
        Ok(Response::new(pb::LeaderResponse {
            header: self.shared.info.header(rev),
            kv: Some(convert::kv(&kv, false)),
        }))
    }

    type ObserveStream = ObserveOut;

    async fn observe(
        &self,
        req: Request<pb::LeaderRequest>,
    ) -> Result<Response<ObserveOut>, Status> {
        let name = req.into_inner().name;
        let (tx, rx) = mpsc::channel(OBSERVE_BUFFER);
        let (seen_tx, mut seen) = mpsc::channel(1);
        let recipes = self.recipes.clone();
        let info = self.shared.info.clone();
        // The observer and the forwarder end together: when the client goes
        // away (`tx` closes), when the server stops, or when the observer
        // cannot follow the store any more (the stream then ends with OK,
        // as etcd's does).
        tokio::spawn(async move {
            let observer = recipes.observe(&name, &seen_tx);
            tokio::pin!(observer);
            loop {
                tokio::select! {
                    biased;
                    ended = &mut observer => {
                        // What it sent just before it ended still goes out.
                        while let Ok((rev, kv)) = seen.try_recv() {
                            let resp = pb::LeaderResponse {
                                header: info.header(rev),
                                kv: Some(convert::kv(&kv, false)),
                            };
                            if tx.send(Ok(resp)).await.is_err() {
                                return;
                            }
                        }
                        if let Err(RecipeError::ShuttingDown) = ended {
                            let _ = tx.send(Err(shutting_down())).await;
                        }
                        return;
                    }
                    next = seen.recv() => {
                        let Some((rev, kv)) = next else { return };
                        let resp = pb::LeaderResponse {
                            header: info.header(rev),
                            kv: Some(convert::kv(&kv, false)),
                        };
                        if tx.send(Ok(resp)).await.is_err() {
                            return;
                        }
                    }
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn resign(
        &self,
        req: Request<pb::ResignRequest>,
    ) -> Result<Response<pb::ResignResponse>, Status> {
        let leader = req.into_inner().leader.map(leader_key);
        let rev = self.recipes.resign(leader).await.map_err(recipe_status)?;
        Ok(Response::new(pb::ResignResponse {
            header: self.shared.info.header(rev),
        }))
    }
}
