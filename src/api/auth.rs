//! The Auth service: a thin adapter over the store's auth module
//! (`crate::auth`), which holds etcd's rules. Changes go through the
//! backend as `Entry::Auth`; the slow, random parts (bcrypt hashing and
//! checking, drawing a token) run here, on the member that proposes, off
//! the async workers. Reads (UserGet, UserList, RoleGet, RoleList) are
//! answered from this member's copy, with etcd's checks: `root` may read
//! everything, a user its own roles and the roles it has.

use super::{authz, status, Shared};
use crate::auth::{self, AuthInfo, AuthOp, PermKind, Permission};
use crate::backend::Backend;
use crate::proto::authpb;
use crate::proto::etcdserverpb::{self as pb, auth_server::Auth};
use bytes::Bytes;
use tonic::{Request, Response, Status};

/// Serves every Auth RPC.
pub struct AuthService(pub Shared);

impl AuthService {
    /// Proposes `op` by the caller of `req`; returns the header.
    async fn change<T>(
        &self,
        req: &Request<T>,
        op: AuthOp,
    ) -> Result<Option<pb::ResponseHeader>, Status> {
        let by = authz::caller(&self.0, req).await?;
        self.propose(by, op).await
    }

    async fn propose(
        &self,
        by: Option<AuthInfo>,
        op: AuthOp,
    ) -> Result<Option<pb::ResponseHeader>, Status> {
        let revision = self.0.backend.auth(by, op).await.map_err(status)?;
        Ok(self.0.info.header(revision))
    }

    fn header(&self) -> Option<pb::ResponseHeader> {
        self.0.info.header(self.0.store.current_revision())
    }

    /// A bcrypt hash of `password` (off the async workers: it is slow by
    /// design).
    async fn hash(&self, password: String) -> Result<String, Status> {
        let cost = self.0.store.auth().config().bcrypt_cost;
        tokio::task::spawn_blocking(move || auth::hash_password(&password, cost))
            .await
            .map_err(|e| Status::internal(format!("password hashing failed: {e}")))
    }

    /// etcd's rule for reading users and roles: `root`, or `allowed`.
    async fn may_read<T>(
        &self,
        req: &Request<T>,
        allowed: impl FnOnce(&AuthInfo) -> bool,
    ) -> Result<(), Status> {
        let Some(by) = authz::caller(&self.0, req).await? else {
            return Ok(());
        };
        match self.0.store.auth().check_admin(Some(&by)) {
            Err(_) if allowed(&by) => Ok(()),
            r => r.map_err(status),
        }
    }
}

fn perm_to_wire(p: Permission) -> authpb::Permission {
    authpb::Permission {
        perm_type: p.kind.as_i32(),
        key: Bytes::from(p.key),
        range_end: Bytes::from(p.range_end),
    }
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_status(
        &self,
        req: Request<pb::AuthStatusRequest>,
    ) -> Result<Response<pb::AuthStatusResponse>, Status> {
        // Root only once enabled, as etcd checks every auth admin call.
        if self.0.store.auth().enabled() {
            super::authz::require_root(&self.0, &req).await?;
        }
        let auth = self.0.store.auth();
        Ok(Response::new(pb::AuthStatusResponse {
            header: self.header(),
            enabled: auth.enabled(),
            auth_revision: auth.revision(),
        }))
    }

    async fn auth_enable(
        &self,
        req: Request<pb::AuthEnableRequest>,
    ) -> Result<Response<pb::AuthEnableResponse>, Status> {
        let header = self.change(&req, AuthOp::Enable).await?;
        Ok(Response::new(pb::AuthEnableResponse { header }))
    }

    async fn auth_disable(
        &self,
        req: Request<pb::AuthDisableRequest>,
    ) -> Result<Response<pb::AuthDisableResponse>, Status> {
        let header = self.change(&req, AuthOp::Disable).await?;
        Ok(Response::new(pb::AuthDisableResponse { header }))
    }

    async fn authenticate(
        &self,
        req: Request<pb::AuthenticateRequest>,
    ) -> Result<Response<pb::AuthenticateResponse>, Status> {
        let pb::AuthenticateRequest { name, password } = req.into_inner();
        let store = self.0.store.clone();
        let checked = name.clone();
        tokio::task::spawn_blocking(move || store.auth().check_password(&checked, &password))
            .await
            .map_err(|e| Status::internal(format!("password check failed: {e}")))?
            .map_err(status)?;
        let drawn = self.0.store.auth().new_token();
        let op = AuthOp::Authenticate {
            name: name.clone(),
            token: drawn.clone(),
        };
        let header = self.propose(None, op).await?;
        let token = self
            .0
            .store
            .auth()
            .issue_token(&name, drawn)
            .map_err(status)?;
        Ok(Response::new(pb::AuthenticateResponse { header, token }))
    }

    async fn user_add(
        &self,
        req: Request<pb::AuthUserAddRequest>,
    ) -> Result<Response<pb::AuthUserAddResponse>, Status> {
        let by = authz::caller(&self.0, &req).await?;
        let r = req.into_inner();
        let no_password = r.options.is_some_and(|o| o.no_password);
        let password_hash = if no_password || r.name.is_empty() {
            None
        } else {
            Some(self.hash(r.password).await?)
        };
        let op = AuthOp::UserAdd {
            name: r.name,
            password_hash,
        };
        let header = self.propose(by, op).await?;
        Ok(Response::new(pb::AuthUserAddResponse { header }))
    }

    async fn user_get(
        &self,
        req: Request<pb::AuthUserGetRequest>,
    ) -> Result<Response<pb::AuthUserGetResponse>, Status> {
        let name = req.get_ref().name.clone();
        self.may_read(&req, |by| by.user == name).await?;
        let roles = self.0.store.auth().user_roles(&name).map_err(status)?;
        Ok(Response::new(pb::AuthUserGetResponse {
            header: self.header(),
            roles,
        }))
    }

    async fn user_list(
        &self,
        req: Request<pb::AuthUserListRequest>,
    ) -> Result<Response<pb::AuthUserListResponse>, Status> {
        self.may_read(&req, |_| false).await?;
        Ok(Response::new(pb::AuthUserListResponse {
            header: self.header(),
            users: self.0.store.auth().user_names(),
        }))
    }

    async fn user_delete(
        &self,
        req: Request<pb::AuthUserDeleteRequest>,
    ) -> Result<Response<pb::AuthUserDeleteResponse>, Status> {
        let name = req.get_ref().name.clone();
        let header = self.change(&req, AuthOp::UserDelete { name }).await?;
        Ok(Response::new(pb::AuthUserDeleteResponse { header }))
    }

    async fn user_change_password(
        &self,
        req: Request<pb::AuthUserChangePasswordRequest>,
    ) -> Result<Response<pb::AuthUserChangePasswordResponse>, Status> {
        let by = authz::caller(&self.0, &req).await?;
        let r = req.into_inner();
        let password_hash = Some(self.hash(r.password).await?);
        let op = AuthOp::UserChangePassword {
            name: r.name,
            password_hash,
        };
        let header = self.propose(by, op).await?;
        Ok(Response::new(pb::AuthUserChangePasswordResponse { header }))
    }

    async fn user_grant_role(
        &self,
        req: Request<pb::AuthUserGrantRoleRequest>,
    ) -> Result<Response<pb::AuthUserGrantRoleResponse>, Status> {
        let pb::AuthUserGrantRoleRequest { user, role } = req.get_ref().clone();
        let header = self
            .change(&req, AuthOp::UserGrantRole { user, role })
            .await?;
        Ok(Response::new(pb::AuthUserGrantRoleResponse { header }))
    }

    async fn user_revoke_role(
        &self,
        req: Request<pb::AuthUserRevokeRoleRequest>,
    ) -> Result<Response<pb::AuthUserRevokeRoleResponse>, Status> {
        let pb::AuthUserRevokeRoleRequest { name, role } = req.get_ref().clone();
        let header = self
            .change(&req, AuthOp::UserRevokeRole { name, role })
            .await?;
        Ok(Response::new(pb::AuthUserRevokeRoleResponse { header }))
    }

    async fn role_add(
        &self,
        req: Request<pb::AuthRoleAddRequest>,
    ) -> Result<Response<pb::AuthRoleAddResponse>, Status> {
        let name = req.get_ref().name.clone();
        let header = self.change(&req, AuthOp::RoleAdd { name }).await?;
        Ok(Response::new(pb::AuthRoleAddResponse { header }))
    }

    async fn role_get(
        &self,
        req: Request<pb::AuthRoleGetRequest>,
    ) -> Result<Response<pb::AuthRoleGetResponse>, Status> {
        let role = req.get_ref().role.clone();
        let auth = self.0.store.auth();
        self.may_read(&req, |by| auth.has_role(&by.user, &role))
            .await?;
        let perm = auth.role_perms(&role).map_err(status)?;
        Ok(Response::new(pb::AuthRoleGetResponse {
            header: self.header(),
            perm: perm.into_iter().map(perm_to_wire).collect(),
        }))
    }

    async fn role_list(
        &self,
        req: Request<pb::AuthRoleListRequest>,
    ) -> Result<Response<pb::AuthRoleListResponse>, Status> {
        self.may_read(&req, |_| false).await?;
        Ok(Response::new(pb::AuthRoleListResponse {
            header: self.header(),
            roles: self.0.store.auth().role_names(),
        }))
    }

    async fn role_delete(
        &self,
        req: Request<pb::AuthRoleDeleteRequest>,
    ) -> Result<Response<pb::AuthRoleDeleteResponse>, Status> {
        let role = req.get_ref().role.clone();
        let header = self.change(&req, AuthOp::RoleDelete { role }).await?;
        Ok(Response::new(pb::AuthRoleDeleteResponse { header }))
    }

    async fn role_grant_permission(
        &self,
        req: Request<pb::AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<pb::AuthRoleGrantPermissionResponse>, Status> {
        let r = req.get_ref().clone();
        let perm = r.perm.map(|p| Permission {
            kind: PermKind::from_i32(p.perm_type),
            key: p.key.to_vec(),
            range_end: p.range_end.to_vec(),
        });
        let op = AuthOp::RoleGrantPermission { name: r.name, perm };
        let header = self.change(&req, op).await?;
        Ok(Response::new(pb::AuthRoleGrantPermissionResponse {
            header,
        }))
    }

    async fn role_revoke_permission(
        &self,
        req: Request<pb::AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<pb::AuthRoleRevokePermissionResponse>, Status> {
        let r = req.get_ref().clone();
        let op = AuthOp::RoleRevokePermission {
            role: r.role,
            key: r.key.to_vec(),
            range_end: r.range_end.to_vec(),
        };
        let header = self.change(&req, op).await?;
        Ok(Response::new(pb::AuthRoleRevokePermissionResponse {
            header,
        }))
    }
}
