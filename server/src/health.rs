//! The standard gRPC health service (`grpc.health.v1.Health`), which etcd registers on its
//! client port: Kubernetes `grpc:` probes, `grpc_health_probe` and gRPC load balancers call
//! it.
//!
//! Invariants:
//! - HEALTH-1: `Check` of the server as a whole (the empty service name) answers `SERVING`
//!   whenever kvd answers at all, as etcd 3.4 does; any other name is `NotFound "unknown
//!   service"`, as in gRPC-go's health server, which etcd uses. The finer signals (alarms, a
//!   poisoned store) are `/health`'s (HTTP-3).
//! - HEALTH-2: `Watch` sends the status `Check` would give (`SERVICE_UNKNOWN` for another
//!   name) and ends the stream: the status never changes while kvd runs, so a watcher holds
//!   no stream open across a shutdown.
//!
//! Contact points: `server::http` routes `/grpc.health.v1.Health/...` here.

use tonic::codegen::BoxStream;
use tonic::codegen::tokio_stream;
use tonic::{Request, Response, Status};

use crate::pb::grpc_health_v1::health_check_response::ServingStatus;
use crate::pb::grpc_health_v1::health_server::Health;
use crate::pb::grpc_health_v1::{HealthCheckRequest, HealthCheckResponse};

/// The health service: stateless (HEALTH-1).
#[derive(Debug, Default)]
pub struct HealthService;

/// The status of `service` (HEALTH-1): the server's own, or none for another name.
fn status_of(service: &str) -> Option<ServingStatus> {
    service.is_empty().then_some(ServingStatus::Serving)
}

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        match status_of(&request.get_ref().service) {
            Some(status) => Ok(Response::new(HealthCheckResponse {
                status: status as i32,
            })),
            None => Err(Status::not_found("unknown service")),
        }
    }

    type WatchStream = BoxStream<HealthCheckResponse>;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        // HEALTH-2.
        let status = status_of(&request.get_ref().service).unwrap_or(ServingStatus::ServiceUnknown);
        Ok(Response::new(Box::pin(tokio_stream::once(Ok(
            HealthCheckResponse {
                status: status as i32,
            },
        )))))
    }
}
