//! The state every service of one kvd server shares: the engine, the member's identity and
//! the settings that show in answers.
//!
//! Owns: the bridge from async handlers to the synchronous engine.
//!
//! Invariants:
//! - NODE-1: every engine call runs on tokio's blocking pool ([`Node::call`]), never on a
//!   reactor thread: the engine blocks on locks, on the apply thread and on disk.
//! - NODE-2: the node holds no state of its own beyond configuration; everything a client
//!   sees comes from the engine at the time of the call (surfaces hold no state).
//!
//! Contact points: the gRPC services and the HTTP routes hold an `Arc<Node>`.

use tonic::Status;

use crate::api;
use crate::engine::Engine;
use crate::error::Result;
use crate::server::convert::HeaderIds;
use crate::server::status;
use crate::sync::Arc;

/// The version kvd reports as its etcd server version (Status `version`, `/version`).
///
/// kvd follows etcd 3.6 semantics where 3.4 and 3.6 differ (`design/product.md`, decision 1),
/// so it reports the etcd API level it implements, not its own crate version.
pub const ETCD_SERVER_VERSION: &str = "3.6.0";
/// The cluster version kvd reports (`/version` `etcdcluster`, Status `storageVersion`).
pub const ETCD_CLUSTER_VERSION: &str = "3.6.0";
/// etcd's default `--quota-backend-bytes` (2 GiB), used when the flag is 0.
pub const QUOTA_BACKEND_BYTES_DEFAULT: i64 = 2 << 30;

/// The settings that show in answers.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// The member name (`--name`).
    pub name: String,
    /// The client URLs advertised in MemberList.
    pub advertise_client_urls: Vec<String>,
    /// The peer URL shown in MemberList; kvd has no peers, so it is only a placeholder.
    pub peer_url: String,
    /// The space quota reported in Status (`dbSizeQuota`); 0 when the quota is disabled.
    pub quota_bytes: i64,
    /// `--max-txn-ops`, needed to order the errors of a Txn with an empty op.
    pub max_txn_ops: usize,
}

/// One running server's shared state.
#[derive(Debug)]
pub struct Node {
    engine: Arc<Engine>,
    /// The identity that goes into every response header.
    pub ids: HeaderIds,
    /// The settings that show in answers.
    pub settings: NodeSettings,
}

impl Node {
    /// Returns a node serving `engine`.
    pub fn new(engine: Arc<Engine>, ids: HeaderIds, settings: NodeSettings) -> Node {
        Node {
            engine,
            ids,
            settings,
        }
    }

    /// Runs `f` against the engine on the blocking pool (NODE-1) and maps its error to
    /// etcd's gRPC status.
    pub async fn call<T, F>(&self, f: F) -> std::result::Result<T, Status>
    where
        F: FnOnce(&Engine) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let engine = self.engine.clone();
        match tokio::task::spawn_blocking(move || f(&engine)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(status::from_error(&err)),
            Err(join) => {
                tracing::error!(error = %join, "engine call did not finish");
                Err(status::from_join_error(&join))
            }
        }
    }

    /// Returns the engine's status (revisions, sizes, applied index).
    pub async fn status(&self) -> std::result::Result<api::Status, Status> {
        self.call(Engine::status).await
    }

    /// Returns a full response header at the current revision.
    pub async fn current_header(
        &self,
    ) -> std::result::Result<crate::server::pb::etcdserverpb::ResponseHeader, Status> {
        let status = self.status().await?;
        Ok(self.ids.header(status.header.revision))
    }
}
