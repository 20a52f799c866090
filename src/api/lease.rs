//! The Lease service. Keep-alives refresh leases in memory only.

use super::{status, Shared};
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
        let req = req.into_inner();
        let Shared { store, info, .. } = &self.0;
        let (id, ttl) = store.lease_grant(req.id, req.ttl).map_err(status)?;
        self.0.metrics.lease_granted.inc();
        Ok(Response::new(pb::LeaseGrantResponse {
            header: info.header(store.current_revision()),
            id,
            ttl,
            error: String::new(),
        }))
    }

    async fn lease_revoke(
        &self,
        req: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        let id = req.into_inner().id;
        let Shared { store, info, .. } = &self.0;
        let rev = store.lease_revoke_async(id).await.map_err(status)?;
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
        let mut inbound = req.into_inner();
        let shared = self.0.clone();
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            let mut stop = shared.stop.clone();
            loop {
                let req = tokio::select! {
                    msg = inbound.message() => match msg {
                        Ok(Some(req)) => req,
                        _ => return,
                    },
                    _ = crate::api::stopped(&mut stop) => {
                        let _ = tx.send(Err(super::shutting_down())).await;
                        return;
                    }
                };
                // etcd answers an unknown (or just expired) lease with TTL 0.
                let ttl = shared.store.lessor().renew(req.id).unwrap_or(0);
                shared.metrics.lease_renewed.inc();
                let resp = pb::LeaseKeepAliveResponse {
                    header: shared.info.header(shared.store.current_revision()),
                    id: req.id,
                    ttl,
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
        let Shared { store, info, .. } = &self.0;
        let header = info.header(store.current_revision());
        // etcd reports an unknown lease with TTL -1 rather than an error.
        let resp = match store.lease_time_to_live(req.id, req.keys) {
            Some(l) => pb::LeaseTimeToLiveResponse {
                header,
                id: l.id,
                ttl: l.remaining_ttl,
                granted_ttl: l.granted_ttl,
                keys: l.keys,
            },
            None => pb::LeaseTimeToLiveResponse {
                header,
                id: req.id,
                ttl: -1,
                granted_ttl: 0,
                keys: Vec::new(),
            },
        };
        Ok(Response::new(resp))
    }

    async fn lease_leases(
        &self,
        _req: Request<pb::LeaseLeasesRequest>,
    ) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        let Shared { store, info, .. } = &self.0;
        let leases = store
            .lessor()
            .all(false)
            .into_iter()
            .map(|l| pb::LeaseStatus { id: l.id })
            .collect();
        Ok(Response::new(pb::LeaseLeasesResponse {
            header: info.header(store.current_revision()),
            leases,
        }))
    }
}
