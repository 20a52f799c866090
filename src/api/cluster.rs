//! The Cluster service: ephd is always a cluster of one member.

use super::{status, Shared};
use crate::error::Error;
use crate::proto::etcdserverpb::{self as pb, cluster_server::Cluster};
use tonic::{Request, Response, Status};

/// Serves MemberList; membership changes are not supported.
pub struct ClusterService(pub Shared);

impl ClusterService {
    fn members(&self) -> Vec<pb::Member> {
        let info = &self.0.info;
        if !info.members.is_empty() {
            // Cluster mode: every member of the initial cluster; only this
            // member's client URLs are known (members do not publish theirs
            // to each other yet).
            return info
                .members
                .iter()
                .map(|m| pb::Member {
                    id: m.id,
                    name: m.name.clone(),
                    peer_ur_ls: m.peer_urls.clone(),
                    client_ur_ls: if m.id == info.member_id {
                        info.client_urls.clone()
                    } else {
                        Vec::new()
                    },
                    is_learner: false,
                })
                .collect();
        }
        vec![pb::Member {
            id: info.member_id,
            name: info.name.clone(),
            peer_ur_ls: info.peer_urls.clone(),
            client_ur_ls: info.client_urls.clone(),
            is_learner: false,
        }]
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        _r: Request<pb::MemberAddRequest>,
    ) -> Result<Response<pb::MemberAddResponse>, Status> {
        Err(status(Error::MembershipUnsupported))
    }

    async fn member_remove(
        &self,
        _r: Request<pb::MemberRemoveRequest>,
    ) -> Result<Response<pb::MemberRemoveResponse>, Status> {
        Err(status(Error::MembershipUnsupported))
    }

    async fn member_update(
        &self,
        _r: Request<pb::MemberUpdateRequest>,
    ) -> Result<Response<pb::MemberUpdateResponse>, Status> {
        Err(status(Error::MembershipUnsupported))
    }

    async fn member_list(
        &self,
        _r: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
        let Shared { store, info, .. } = &self.0;
        Ok(Response::new(pb::MemberListResponse {
            header: info.header(store.current_revision()),
            members: self.members(),
        }))
    }

    async fn member_promote(
        &self,
        _r: Request<pb::MemberPromoteRequest>,
    ) -> Result<Response<pb::MemberPromoteResponse>, Status> {
        Err(status(Error::MembershipUnsupported))
    }
}
