//! The Lease service: converts between the wire and the store's lease
//! entry point (`mvcc/leases.rs`), where every lease rule lives.

use super::{authz, status, Shared};
use crate::backend::{Backend, LeaderLoss};
use crate::proto::etcdserverpb::{self as pb, lease_server::Lease};
use futures::Stream;
use std::pin::Pin;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// Serves LeaseGrant, LeaseRevoke, LeaseKeepAlive, LeaseTimeToLive, LeaseLeases.
pub struct LeaseService(pub Shared);

type KeepAliveOut = Pin<Box<dyn Stream<Item = Result<pb::LeaseKeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        req: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        // etcd 3.4 checks no permission to grant, only that a token, if
        // given, is valid.
        authz::caller(&self.0, &req).await?;
        let req = req.into_inner();
        let Shared { backend, info, .. } = &self.0;
        let granted = backend.lease_grant(req.id, req.ttl).await.map_err(status)?;
        self.0.metrics.lease_granted.inc();
        Ok(Response::new(pb::LeaseGrantResponse {
            header: info.header(granted.revision),
            id: granted.id,
            ttl: granted.ttl,
            error: String::new(),
        }))
    }

    async fn lease_revoke(
        &self,
        req: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        let by = authz::caller(&self.0, &req).await?;
        let id = req.into_inner().id;
        let Shared { backend, info, .. } = &self.0;
        let rev = backend.lease_revoke(by, id).await.map_err(status)?;
        self.0.metrics.lease_revoked.inc();
        Ok(Response::new(pb::LeaseRevokeResponse {
            header: info.header(rev),
        }))
    }

    type LeaseKeepAliveStream = KeepAliveOut;

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<KeepAliveOut>, Status> {
        let mut lost = self.0.backend.leader_loss(req.metadata());
        let mut inbound = req.into_inner();
        let shared = self.0.clone();
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            let mut stop = shared.stop.clone();
            loop {
                let req = tokio::select! {
                    // `hasleader` and no leader for three election timeouts.
                    _ = lost.wait() => {
                        let _ = tx.send(Err(LeaderLoss::status())).await;
                        return;
                    }
                    msg = inbound.message() => match msg {
                        Ok(Some(req)) => req,
                        Ok(None) => return,
                        Err(status) => {
                            let _ = tx.send(Err(super::limits::as_grpc_go(status))).await;
                            return;
                        }
                    },
                    _ = crate::api::stopped(&mut stop) => {
                        let _ = tx.send(Err(super::shutting_down())).await;
                        return;
                    }
                };
                // A failure ends the stream, as in etcd.
                let renewed = match shared.backend.lease_keep_alive(req.id).await {
                    Ok(r) => r,
                    Err(s) => {
                        let _ = tx.send(Err(s)).await;
                        return;
                    }
                };
                shared.metrics.lease_renewed.inc();
                let resp = pb::LeaseKeepAliveResponse {
                    header: shared.info.header(renewed.revision),
                    id: renewed.id,
                    ttl: renewed.ttl,
                };
                if tx.send(Ok(resp)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn lease_time_to_live(
        &self,
        req: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        let req = req.into_inner();
        let Shared { backend, info, .. } = &self.0;
        let l = backend.lease_time_to_live(req.id, req.keys).await?;
        Ok(Response::new(pb::LeaseTimeToLiveResponse {
            header: info.header(l.revision),
            id: l.id,
            ttl: l.ttl,
            granted_ttl: l.granted_ttl,
            keys: l.keys,
        }))
    }

    async fn lease_leases(
        &self,
        _req: Request<pb::LeaseLeasesRequest>,
    ) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        let Shared { store, info, .. } = &self.0;
        let all = store.lease_leases();
        Ok(Response::new(pb::LeaseLeasesResponse {
            header: info.header(all.revision),
            leases: all
                .ids
                .into_iter()
                .map(|id| pb::LeaseStatus { id })
                .collect(),
        }))
    }
}
