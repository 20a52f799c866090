//! The Maintenance service: status, alarms (kept by the store core, see
//! `mvcc/alarms.rs`), hashes, snapshots (`snapshot.rs`). There is no disk,
//! so defragmentation has nothing to do.

use super::snapshot::SnapshotOut;
use super::{status, Shared, ETCD_VERSION, STORAGE_VERSION};
use crate::backend::Backend;
use crate::error::Error;
use crate::mvcc::{AlarmAction, AlarmChange, AlarmMember};
use crate::proto::etcdserverpb::{self as pb, maintenance_server::Maintenance};
use tonic::{Request, Response, Status};

/// Serves Status, Alarm, Defragment, Hash, HashKV and Snapshot.
pub struct MaintenanceService(pub Shared);

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn alarm(
        &self,
        r: Request<pb::AlarmRequest>,
    ) -> Result<Response<pb::AlarmResponse>, Status> {
        // etcd 3.6: any user may look at the alarms, only root change them.
        if r.get_ref().action == 1 || r.get_ref().action == 2 {
            super::authz::require_root(&self.0, &r).await?;
        } else {
            super::authz::require_user(&self.0, &r).await?;
        }
        let r = r.into_inner();
        let Shared {
            store,
            backend,
            info,
            ..
        } = &self.0;
        let action = match r.action {
            1 => AlarmAction::Activate,
            2 => AlarmAction::Deactivate,
            // GET, and actions etcd does not define (etcd's own answer to
            // those is a response it cannot send).
            _ => AlarmAction::Get,
        };
        let change = AlarmChange {
            action,
            member_id: r.member_id,
            alarm: r.alarm,
        };
        let alarms = backend
            .alarm(change)
            .await
            .map_err(status)?
            .into_iter()
            .map(|a| pb::AlarmMember {
                member_id: a.member_id,
                alarm: a.alarm,
            })
            .collect();
        Ok(Response::new(pb::AlarmResponse {
            header: info.header(store.current_revision()),
            alarms,
        }))
    }

    async fn status(
        &self,
        r: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        super::authz::require_user(&self.0, &r).await?;
        let Shared {
            store,
            backend,
            info,
            ..
        } = &self.0;
        let stats = store.stats();
        let raft = backend.raft_view();
        Ok(Response::new(pb::StatusResponse {
            header: info.header(store.current_revision()),
            version: ETCD_VERSION.to_string(),
            db_size: stats.backend_bytes(),
            db_size_in_use: stats.backend_in_use(),
            leader: raft.leader,
            raft_index: raft.committed_index,
            raft_term: raft.term,
            raft_applied_index: raft.applied_index,
            errors: store.alarms().iter().map(alarm_text).collect(),
            is_learner: raft.is_learner,
            storage_version: STORAGE_VERSION.to_string(),
            // The quota this member refuses writes at (0: none).
            db_size_quota: store.config().quota_bytes.unwrap_or(0),
            // No downgrade is ever in progress.
            downgrade_info: Some(pb::DowngradeInfo::default()),
        }))
    }

    async fn defragment(
        &self,
        r: Request<pb::DefragmentRequest>,
    ) -> Result<Response<pb::DefragmentResponse>, Status> {
        super::authz::require_root(&self.0, &r).await?;
        // Nothing to defragment in memory; etcd's answer carries no header.
        Ok(Response::new(pb::DefragmentResponse { header: None }))
    }

    async fn hash(
        &self,
        r: Request<pb::HashRequest>,
    ) -> Result<Response<pb::HashResponse>, Status> {
        super::authz::require_root(&self.0, &r).await?;
        let Shared { store, info, .. } = &self.0;
        let (hash, _, rev) = store.hash_kv(0).map_err(status)?;
        Ok(Response::new(pb::HashResponse {
            header: info.header(rev),
            hash,
        }))
    }

    async fn hash_kv(
        &self,
        r: Request<pb::HashKvRequest>,
    ) -> Result<Response<pb::HashKvResponse>, Status> {
        super::authz::require_root(&self.0, &r).await?;
        let Shared { store, info, .. } = &self.0;
        let (hash, compact_revision, hash_revision) =
            store.hash_kv(r.into_inner().revision).map_err(status)?;
        Ok(Response::new(pb::HashKvResponse {
            header: info.header(store.current_revision()),
            hash,
            compact_revision,
            hash_revision,
        }))
    }

    type SnapshotStream = SnapshotOut;

    async fn snapshot(
        &self,
        r: Request<pb::SnapshotRequest>,
    ) -> Result<Response<SnapshotOut>, Status> {
        super::authz::require_root(&self.0, &r).await?;
        // In cluster mode this is the member's own applied state.
        super::snapshot::stream(self.0.store.clone()).map(Response::new)
    }

    async fn move_leader(
        &self,
        r: Request<pb::MoveLeaderRequest>,
    ) -> Result<Response<pb::MoveLeaderResponse>, Status> {
        super::authz::require_root(&self.0, &r).await?;
        let waits = super::deadline::client_timeout(r.metadata());
        let target = r.into_inner().target_id;
        self.0.backend.move_leader(target, waits).await?;
        // etcd 3.4 answers with an empty response (no header).
        Ok(Response::new(pb::MoveLeaderResponse::default()))
    }

    async fn downgrade(
        &self,
        _r: Request<pb::DowngradeRequest>,
    ) -> Result<Response<pb::DowngradeResponse>, Status> {
        Err(status(Error::DowngradeUnsupported))
    }
}

/// An alarm as etcd 3.4 lists it in Status.errors: the protobuf text form
/// of its AlarmMember.
fn alarm_text(a: &AlarmMember) -> String {
    let name = pb::AlarmType::try_from(a.alarm)
        .map(|t| t.as_str_name().to_string())
        .unwrap_or_else(|_| a.alarm.to_string());
    format!("memberID:{} alarm:{} ", a.member_id, name)
}
