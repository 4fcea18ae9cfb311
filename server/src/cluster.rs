//! etcd's Cluster service for a single member: MemberList answers this member; membership
//! changes are refused.
//!
//! Owns: the member record kvd shows.
//!
//! Invariants:
//! - CLUSTER-1: MemberList lists exactly one member whose id equals `header.member_id`,
//!   named by `--name`, with the advertised client URLs and `isLearner = false`.
//! - CLUSTER-2: the header carries the cluster id, member id and raft term but no revision,
//!   as etcd's MemberList header does.
//!
//! Contact points: `server::node` (identity and settings).

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
        _request: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        Err(status::unimplemented(status::MEMBERSHIP_NOT_SUPPORTED))
    }

    async fn member_remove(
        &self,
        _request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        Err(status::unimplemented(status::MEMBERSHIP_NOT_SUPPORTED))
    }

    async fn member_update(
        &self,
        _request: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        Err(status::unimplemented(status::MEMBERSHIP_NOT_SUPPORTED))
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
        _request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        Err(status::unimplemented(status::MEMBERSHIP_NOT_SUPPORTED))
    }
}
