//! etcd's Cluster service for a single member: MemberList answers this member; membership
//! changes are refused, each as etcd refuses it on a one-member cluster where etcd would
//! refuse it too.
//!
//! Owns: the member record kvd shows.
//!
//! Invariants:
//! - CLUSTER-1: MemberList lists exactly one member whose id equals `header.member_id`,
//!   named by `--name`, with the advertised client URLs and `isLearner = false`.
//! - CLUSTER-2: the header carries the cluster id, member id and raft term but no revision,
//!   as etcd's MemberList header does.
//! - CLUSTER-3: MemberAdd, MemberRemove, MemberUpdate and MemberPromote need an
//!   administrator while auth is enabled, checked first (as etcd does), and change nothing.
//!   An id other than this member's is `NotFound "etcdserver: member not found"`; this
//!   member's: Remove is etcd's `FailedPrecondition` for the last voting member, Promote
//!   etcd's `FailedPrecondition` for a member that is no learner, Update with the peer URLs
//!   it already has succeeds and lists the member, as etcd's does. What etcd would carry
//!   out (MemberAdd, Update to other URLs) is `Unimplemented` with
//!   [`status::MEMBERSHIP_NOT_SUPPORTED`].
//!
//! Contact points: `server::node` (identity and settings), `server::auth` (the admin
//! check).

use tonic::{Request, Response, Status};

use crate::node::Node;
use crate::pb::etcdserverpb::cluster_server::Cluster;
use crate::pb::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};
use crate::status;
use kvd::sync::Arc;

/// The Cluster service.
#[derive(Debug, Clone)]
pub struct ClusterService {
    node: Arc<Node>,
}

impl ClusterService {
    /// Returns the service over `node`.
    pub fn new(node: Arc<Node>) -> ClusterService {
        ClusterService { node }
    }

    /// Checks that the caller is an administrator while auth is enabled (CLUSTER-3).
    fn admin<T>(&self, request: &Request<T>) -> Result<(), Status> {
        crate::auth::require_admin(&self.node, request)
    }

    /// Refuses an id that is not this member's, as etcd refuses an unknown one (CLUSTER-3).
    fn known(&self, id: u64) -> Result<(), Status> {
        if id == self.node.ids.member_id {
            Ok(())
        } else {
            Err(Status::not_found(status::MEMBER_NOT_FOUND))
        }
    }

    fn this_member(&self) -> Member {
        let settings = &self.node.settings;
        Member {
            id: self.node.ids.member_id,
            name: settings.name.clone(),
            peer_ur_ls: vec![settings.peer_url.clone()],
            client_ur_ls: settings.advertise_client_urls.clone(),
            is_learner: false,
        }
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        request: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        self.admin(&request)?;
        Err(status::unimplemented(status::MEMBERSHIP_NOT_SUPPORTED))
    }

    async fn member_remove(
        &self,
        request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        self.admin(&request)?;
        self.known(request.get_ref().id)?;
        Err(Status::failed_precondition(
            status::NOT_ENOUGH_STARTED_MEMBERS,
        ))
    }

    async fn member_update(
        &self,
        request: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        self.admin(&request)?;
        let req = request.into_inner();
        self.known(req.id)?;
        if req.peer_ur_ls != [self.node.settings.peer_url.clone()] {
            return Err(status::unimplemented(status::MEMBERSHIP_NOT_SUPPORTED));
        }
        Ok(Response::new(MemberUpdateResponse {
            header: Some(self.node.ids.header_without_revision()),
            members: vec![self.this_member()],
        }))
    }

    async fn member_list(
        &self,
        _request: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        Ok(Response::new(MemberListResponse {
            header: Some(self.node.ids.header_without_revision()),
            members: vec![self.this_member()],
        }))
    }

    async fn member_promote(
        &self,
        request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        self.admin(&request)?;
        self.known(request.get_ref().id)?;
        Err(Status::failed_precondition(status::MEMBER_NOT_LEARNER))
    }
}
