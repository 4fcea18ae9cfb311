//! The services kvd answers only with refusals for now: Watch and Lease (they land with
//! their own engine work) and Auth (kvd has no authentication; AuthStatus says so).
//!
//! Owns: the exact refusal each of these RPCs gives.
//!
//! Invariants:
//! - STUB-1: Watch answers `Unimplemented "kvd: watch is not implemented yet"`, every Lease
//!   RPC `Unimplemented "kvd: leases are not implemented yet"` (STATUS-3).
//! - STUB-2: AuthStatus answers `enabled = false`; Authenticate answers etcd's own
//!   `FailedPrecondition "etcdserver: authentication is not enabled"`, which etcd's Go client
//!   takes as "go on without a token", so `etcdctl --user ...` keeps working; every other Auth
//!   RPC is refused with `Unimplemented`.
//!
//! Contact points: `server::status` (messages), `server::node` (headers).

use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status, Streaming};

use crate::server::node::Node;
use crate::server::pb::etcdserverpb as pb;
use crate::server::pb::etcdserverpb::auth_server::Auth;
use crate::server::pb::etcdserverpb::lease_server::Lease;
use crate::server::pb::etcdserverpb::watch_server::Watch;
use crate::server::status;
use crate::sync::Arc;

/// The auth revision AuthStatus reports. A fresh etcd 3.5 answers 1 as far as we know; no
/// etcd 3.4 client calls AuthStatus, so this was not checked against the oracle.
const AUTH_REVISION: u64 = 1;

/// The Watch service (refuses, STUB-1).
#[derive(Debug, Clone, Copy, Default)]
pub struct WatchService;

#[tonic::async_trait]
impl Watch for WatchService {
    type WatchStream = BoxStream<pb::WatchResponse>;

    async fn watch(
        &self,
        _request: Request<Streaming<pb::WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(status::unimplemented(status::WATCH_NOT_IMPLEMENTED))
    }
}

/// The Lease service (refuses, STUB-1).
#[derive(Debug, Clone, Copy, Default)]
pub struct LeaseService;

#[tonic::async_trait]
impl Lease for LeaseService {
    type LeaseKeepAliveStream = BoxStream<pb::LeaseKeepAliveResponse>;

    async fn lease_keep_alive(
        &self,
        _request: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        Err(status::unimplemented(status::LEASE_NOT_IMPLEMENTED))
    }

    async fn lease_grant(
        &self,
        _request: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        Err(status::unimplemented(status::LEASE_NOT_IMPLEMENTED))
    }

    async fn lease_revoke(
        &self,
        _request: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        Err(status::unimplemented(status::LEASE_NOT_IMPLEMENTED))
    }

    async fn lease_time_to_live(
        &self,
        _request: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        Err(status::unimplemented(status::LEASE_NOT_IMPLEMENTED))
    }

    async fn lease_leases(
        &self,
        _request: Request<pb::LeaseLeasesRequest>,
    ) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        Err(status::unimplemented(status::LEASE_NOT_IMPLEMENTED))
    }
}

/// The Auth service (STUB-2).
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
