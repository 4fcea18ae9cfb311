//! etcd's Auth service for a server without authentication: AuthStatus says auth is
//! disabled, Authenticate answers etcd's own "not enabled", everything else is refused.
//!
//! Owns: the exact answer each Auth RPC gives.
//!
//! Invariants:
//! - AUTH-1: AuthStatus answers `enabled = false`; Authenticate answers etcd's own
//!   `FailedPrecondition "etcdserver: authentication is not enabled"`, which etcd's Go client
//!   takes as "go on without a token", so `etcdctl --user ...` keeps working; every other Auth
//!   RPC is refused with `Unimplemented` (STATUS-3).
//!
//! Contact points: `server::status` (messages), `server::node` (headers).

use tonic::{Request, Response, Status};

use crate::node::Node;
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::auth_server::Auth;
use crate::status;
use kvd::sync::Arc;

/// The auth revision AuthStatus reports. A fresh etcd 3.5 answers 1 as far as we know; no
/// etcd 3.4 client calls AuthStatus, so this was not checked against the oracle.
const AUTH_REVISION: u64 = 1;

/// The Auth service (AUTH-1).
#[derive(Debug, Clone)]
pub struct AuthService {
    node: Arc<Node>,
}

impl AuthService {
    /// Returns the service over `node`.
    pub fn new(node: Arc<Node>) -> AuthService {
        AuthService { node }
    }
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_status(
        &self,
        _request: Request<pb::AuthStatusRequest>,
    ) -> Result<Response<pb::AuthStatusResponse>, Status> {
        let header = self.node.current_header().await?;
        Ok(Response::new(pb::AuthStatusResponse {
            header: Some(header),
            enabled: false,
            auth_revision: AUTH_REVISION,
        }))
    }

    async fn authenticate(
        &self,
        _request: Request<pb::AuthenticateRequest>,
    ) -> Result<Response<pb::AuthenticateResponse>, Status> {
        Err(Status::failed_precondition(status::AUTH_NOT_ENABLED))
    }

    async fn auth_enable(
        &self,
        _request: Request<pb::AuthEnableRequest>,
    ) -> Result<Response<pb::AuthEnableResponse>, Status> {
        Err(status::unimplemented(status::AUTH_NOT_SUPPORTED))
    }

    async fn auth_disable(
        &self,
        _request: Request<pb::AuthDisableRequest>,
    ) -> Result<Response<pb::AuthDisableResponse>, Status> {
        Err(status::unimplemented(status::AUTH_NOT_SUPPORTED))
    }

    async fn user_add(
        &self,
        _request: Request<pb::AuthUserAddRequest>,
    ) -> Result<Response<pb::AuthUserAddResponse>, Status> {
        Err(status::unimplemented(status::AUTH_NOT_SUPPORTED))
    }

    async fn user_get(
        &self,
        _request: Request<pb::AuthUserGetRequest>,
    ) -> Result<Response<pb::AuthUserGetResponse>, Status> {
        Err(status::unimplemented(status::AUTH_NOT_SUPPORTED))
    }

    async fn user_list(
        &self,
        _request: Request<pb::AuthUserListRequest>,
    ) -> Result<Response<pb::AuthUserListResponse>, Status> {
        Err(status::unimplemented(status::AUTH_NOT_SUPPORTED))
    }

    async fn user_delete(
        &self,
        _request: Request<pb::AuthUserDeleteRequest>,
    ) -> Result<Response<pb::AuthUserDeleteResponse>, Status> {
        Err(status::unimplemented(status::AUTH_NOT_SUPPORTED))
    }

    async fn user_change_password(
        &self,
        _request: Request<pb::AuthUserChangePasswordRequest>,
    ) -> Result<Response<pb::AuthUserChangePasswordResponse>, Status> {
        Err(status::unimplemented(status::AUTH_NOT_SUPPORTED))
    }

    async fn user_grant_role(
        &self,
        _request: Request<pb::AuthUserGrantRoleRequest>,
    ) -> Result<Response<pb::AuthUserGrantRoleResponse>, Status> {
        Err(status::unimplemented(status::AUTH_NOT_SUPPORTED))
    }

    async fn user_revoke_role(
        &self,
        _request: Request<pb::AuthUserRevokeRoleRequest>,
    ) -> Result<Response<pb::AuthUserRevokeRoleResponse>, Status> {
        Err(status::unimplemented(status::AUTH_NOT_SUPPORTED))
    }

    async fn role_add(
        &self,
        _request: Request<pb::AuthRoleAddRequest>,
    ) -> Result<Response<pb::AuthRoleAddResponse>, Status> {
        Err(status::unimplemented(status::AUTH_NOT_SUPPORTED))
    }

    async fn role_get(
        &self,
        _request: Request<pb::AuthRoleGetRequest>,
    ) -> Result<Response<pb::AuthRoleGetResponse>, Status> {
        Err(status::unimplemented(status::AUTH_NOT_SUPPORTED))
    }

    async fn role_list(
        &self,
        _request: Request<pb::AuthRoleListRequest>,
    ) -> Result<Response<pb::AuthRoleListResponse>, Status> {
        Err(status::unimplemented(status::AUTH_NOT_SUPPORTED))
    }

    async fn role_delete(
        &self,
        _request: Request<pb::AuthRoleDeleteRequest>,
    ) -> Result<Response<pb::AuthRoleDeleteResponse>, Status> {
        Err(status::unimplemented(status::AUTH_NOT_SUPPORTED))
    }

    async fn role_grant_permission(
        &self,
        _request: Request<pb::AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<pb::AuthRoleGrantPermissionResponse>, Status> {
        Err(status::unimplemented(status::AUTH_NOT_SUPPORTED))
    }

    async fn role_revoke_permission(
        &self,
        _request: Request<pb::AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<pb::AuthRoleRevokePermissionResponse>, Status> {
        Err(status::unimplemented(status::AUTH_NOT_SUPPORTED))
    }
}
