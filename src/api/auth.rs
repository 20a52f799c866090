//! The Auth service. ephd serves without authentication: AuthStatus says
//! so, Authenticate gets etcd's answer for an auth-disabled server (which
//! clients configured with a user name tolerate), and every other Auth RPC
//! answers Unimplemented with a clear message rather than pretending to
//! store users and roles.

use super::{status, Shared};
use crate::error::Error;
use crate::proto::etcdserverpb::{self as pb, auth_server::Auth};
use tonic::{Request, Response, Status};

/// Serves AuthStatus and Authenticate; the rest of the Auth service is not
/// implemented.
pub struct AuthService(pub Shared);

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_status(
        &self,
        _req: Request<pb::AuthStatusRequest>,
    ) -> Result<Response<pb::AuthStatusResponse>, Status> {
        let Shared { store, info, .. } = &self.0;
        Ok(Response::new(pb::AuthStatusResponse {
            header: info.header(store.current_revision()),
            enabled: false,
            auth_revision: 0,
        }))
    }

    async fn auth_enable(
        &self,
        _r: Request<pb::AuthEnableRequest>,
    ) -> Result<Response<pb::AuthEnableResponse>, Status> {
        Err(status(Error::AuthUnsupported))
    }

    async fn auth_disable(
        &self,
        _r: Request<pb::AuthDisableRequest>,
    ) -> Result<Response<pb::AuthDisableResponse>, Status> {
        Err(status(Error::AuthUnsupported))
    }

    async fn authenticate(
        &self,
        _r: Request<pb::AuthenticateRequest>,
    ) -> Result<Response<pb::AuthenticateResponse>, Status> {
        // etcd's answer on an auth-disabled server, which clients tolerate.
        Err(status(Error::AuthNotEnabled))
    }

    async fn user_add(
        &self,
        _r: Request<pb::AuthUserAddRequest>,
    ) -> Result<Response<pb::AuthUserAddResponse>, Status> {
        Err(status(Error::AuthUnsupported))
    }

    async fn user_get(
        &self,
        _r: Request<pb::AuthUserGetRequest>,
    ) -> Result<Response<pb::AuthUserGetResponse>, Status> {
        Err(status(Error::AuthUnsupported))
    }

    async fn user_list(
        &self,
        _r: Request<pb::AuthUserListRequest>,
    ) -> Result<Response<pb::AuthUserListResponse>, Status> {
        Err(status(Error::AuthUnsupported))
    }

    async fn user_delete(
        &self,
        _r: Request<pb::AuthUserDeleteRequest>,
    ) -> Result<Response<pb::AuthUserDeleteResponse>, Status> {
        Err(status(Error::AuthUnsupported))
    }

    async fn user_change_password(
        &self,
        _r: Request<pb::AuthUserChangePasswordRequest>,
    ) -> Result<Response<pb::AuthUserChangePasswordResponse>, Status> {
        Err(status(Error::AuthUnsupported))
    }

    async fn user_grant_role(
        &self,
        _r: Request<pb::AuthUserGrantRoleRequest>,
    ) -> Result<Response<pb::AuthUserGrantRoleResponse>, Status> {
        Err(status(Error::AuthUnsupported))
    }

    async fn user_revoke_role(
        &self,
        _r: Request<pb::AuthUserRevokeRoleRequest>,
    ) -> Result<Response<pb::AuthUserRevokeRoleResponse>, Status> {
        Err(status(Error::AuthUnsupported))
    }

    async fn role_add(
        &self,
        _r: Request<pb::AuthRoleAddRequest>,
    ) -> Result<Response<pb::AuthRoleAddResponse>, Status> {
        Err(status(Error::AuthUnsupported))
    }

    async fn role_get(
        &self,
        _r: Request<pb::AuthRoleGetRequest>,
    ) -> Result<Response<pb::AuthRoleGetResponse>, Status> {
        Err(status(Error::AuthUnsupported))
    }

    async fn role_list(
        &self,
        _r: Request<pb::AuthRoleListRequest>,
    ) -> Result<Response<pb::AuthRoleListResponse>, Status> {
        Err(status(Error::AuthUnsupported))
    }

    async fn role_delete(
        &self,
        _r: Request<pb::AuthRoleDeleteRequest>,
    ) -> Result<Response<pb::AuthRoleDeleteResponse>, Status> {
        Err(status(Error::AuthUnsupported))
    }

    async fn role_grant_permission(
        &self,
        _r: Request<pb::AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<pb::AuthRoleGrantPermissionResponse>, Status> {
        Err(status(Error::AuthUnsupported))
    }

    async fn role_revoke_permission(
        &self,
        _r: Request<pb::AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<pb::AuthRoleRevokePermissionResponse>, Status> {
        Err(status(Error::AuthUnsupported))
    }
}
