//! The Cluster service: lists and changes the members through the backend,
//! with etcd's checks and errors. A cluster member changes its replicated
//! membership; a single member answers as a single-member etcd does,
//! except that it cannot grow into a cluster while running (MemberAdd and
//! a MemberUpdate that changes its peer URLs are refused).

use super::{status, Shared};
use crate::backend::{Backend, Members};
use crate::proto::etcdserverpb::{self as pb, cluster_server::Cluster};
use tonic::{Request, Response, Status};

/// Serves the Cluster API.
pub struct ClusterService(pub Shared);

impl ClusterService {
    fn header(&self) -> Option<pb::ResponseHeader> {
        self.0.info.header(self.0.store.current_revision())
    }
}

fn to_pb(members: Members) -> Vec<pb::Member> {
    members.iter().map(|m| m.to_pb()).collect()
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        r: Request<pb::MemberAddRequest>,
    ) -> Result<Response<pb::MemberAddResponse>, Status> {
        let r = r.into_inner();
        let (member, after) = self
            .0
            .backend
            .member_add(r.peer_ur_ls, r.is_learner)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::MemberAddResponse {
            header: self.header(),
            member: Some(member.to_pb()),
            members: to_pb(after),
        }))
    }

    async fn member_remove(
        &self,
        r: Request<pb::MemberRemoveRequest>,
    ) -> Result<Response<pb::MemberRemoveResponse>, Status> {
        let id = r.into_inner().id;
        let after = self.0.backend.member_remove(id).await.map_err(status)?;
        Ok(Response::new(pb::MemberRemoveResponse {
            header: self.header(),
            members: to_pb(after),
        }))
    }

    async fn member_update(
        &self,
        r: Request<pb::MemberUpdateRequest>,
    ) -> Result<Response<pb::MemberUpdateResponse>, Status> {
        let r = r.into_inner();
        let after = self
            .0
            .backend
            .member_update(r.id, r.peer_ur_ls)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::MemberUpdateResponse {
            header: self.header(),
            members: to_pb(after),
        }))
    }

    async fn member_list(
        &self,
        _r: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
        Ok(Response::new(pb::MemberListResponse {
            header: self.header(),
            members: to_pb(self.0.backend.members()),
        }))
    }

    async fn member_promote(
        &self,
        r: Request<pb::MemberPromoteRequest>,
    ) -> Result<Response<pb::MemberPromoteResponse>, Status> {
        let id = r.into_inner().id;
        let after = self.0.backend.member_promote(id).await.map_err(status)?;
        Ok(Response::new(pb::MemberPromoteResponse {
            header: self.header(),
            members: to_pb(after),
        }))
    }
}
