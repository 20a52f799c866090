//! The Cluster service. In cluster mode it lists and changes the
//! replicated membership (`cluster/membership.rs`, `cluster/reconfig.rs`)
//! with etcd 3.4's checks and errors. A single member (no
//! `--initial-cluster` naming others) answers as a single-member etcd
//! does, except that it cannot grow into a cluster while running: MemberAdd
//! and a MemberUpdate that changes its peer URLs are refused.

use super::{status, Shared};
use crate::cluster::{check_urls, Node};
use crate::error::Error;
use crate::proto::etcdserverpb::{self as pb, cluster_server::Cluster};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// Serves the Cluster API.
pub struct ClusterService(pub Shared);

impl ClusterService {
    fn node(&self) -> Option<&Arc<Node>> {
        self.0.proposer.node()
    }

    fn header(&self) -> Option<pb::ResponseHeader> {
        self.0.info.header(self.0.store.current_revision())
    }

    /// A single member: itself.
    fn single(&self) -> Vec<pb::Member> {
        let info = &self.0.info;
        vec![pb::Member {
            id: info.member_id,
            name: info.name.clone(),
            peer_ur_ls: info.peer_urls.clone(),
            client_ur_ls: info.client_urls.clone(),
            is_learner: false,
        }]
    }

    fn members(&self) -> Vec<pb::Member> {
        match self.node() {
            Some(node) => node.membership().to_pb(),
            None => self.single(),
        }
    }

    /// A single member's answer to a change of member `id`: etcd's, where
    /// the only member can be neither removed nor promoted.
    fn single_change(&self, id: u64, for_self: Error) -> Status {
        if id == self.0.info.member_id {
            status(for_self)
        } else {
            status(Error::MemberNotFound)
        }
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        r: Request<pb::MemberAddRequest>,
    ) -> Result<Response<pb::MemberAddResponse>, Status> {
        let r = r.into_inner();
        check_urls(&r.peer_ur_ls).map_err(status)?;
        let Some(node) = self.node() else {
            return Err(status(Error::MembershipUnsupported));
        };
        let (member, after) = node
            .member_add(r.peer_ur_ls, r.is_learner)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::MemberAddResponse {
            header: self.header(),
            member: Some(member.to_pb()),
            members: after.to_pb(),
        }))
    }

    async fn member_remove(
        &self,
        r: Request<pb::MemberRemoveRequest>,
    ) -> Result<Response<pb::MemberRemoveResponse>, Status> {
        let id = r.into_inner().id;
        let Some(node) = self.node() else {
            return Err(self.single_change(id, Error::MemberNotEnoughStarted));
        };
        let after = node.member_remove(id).await.map_err(status)?;
        Ok(Response::new(pb::MemberRemoveResponse {
            header: self.header(),
            members: after.to_pb(),
        }))
    }

    async fn member_update(
        &self,
        r: Request<pb::MemberUpdateRequest>,
    ) -> Result<Response<pb::MemberUpdateResponse>, Status> {
        // etcd checks no URLs here (MemberAdd does).
        let r = r.into_inner();
        let Some(node) = self.node() else {
            let unchanged = {
                let (mut a, mut b) = (r.peer_ur_ls.clone(), self.0.info.peer_urls.clone());
                a.sort();
                b.sort();
                a == b
            };
            if r.id == self.0.info.member_id && unchanged {
                return Ok(Response::new(pb::MemberUpdateResponse {
                    header: self.header(),
                    members: self.single(),
                }));
            }
            return Err(self.single_change(r.id, Error::MembershipUnsupported));
        };
        let after = node
            .member_update(r.id, r.peer_ur_ls)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::MemberUpdateResponse {
            header: self.header(),
            members: after.to_pb(),
        }))
    }

    async fn member_list(
        &self,
        _r: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
        Ok(Response::new(pb::MemberListResponse {
            header: self.header(),
            members: self.members(),
        }))
    }

    async fn member_promote(
        &self,
        r: Request<pb::MemberPromoteRequest>,
    ) -> Result<Response<pb::MemberPromoteResponse>, Status> {
        let id = r.into_inner().id;
        let Some(node) = self.node() else {
            return Err(self.single_change(id, Error::MemberNotLearner));
        };
        let after = node.member_promote(id).await.map_err(status)?;
        Ok(Response::new(pb::MemberPromoteResponse {
            header: self.header(),
            members: after.to_pb(),
        }))
    }
}
