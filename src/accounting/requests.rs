//! The operator requests on the registry and the records ([`AccountingRequest`]), as they
//! travel the apply path, and their dispatch to [`Accounts`] inside a batch (ACCT-2: a
//! refused request changes nothing).

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use super::records::{RecordKind, parse_resources};
use super::{Accounts, AgentState};
use crate::error::{Error, StorageError};
use crate::mvcc::index::Index;
use crate::quota::RawQuotaConfig;
use crate::storage::WriteBatch;

/// An operator request on the registry or the records, applied through the apply path.
#[derive(Debug, Clone, PartialEq)]
pub enum AccountingRequest {
    /// Mesos's UPDATE_QUOTA.
    UpdateQuota {
        /// The configurations, all or nothing.
        configs: Vec<RawQuotaConfig>,
        /// Skip the consumption and capacity checks.
        force: bool,
    },
    /// Register or update an agent and its total resources.
    RegisterAgent {
        /// The agent id.
        id: String,
        /// Its state.
        state: AgentState,
        /// Its total resources.
        resources: BTreeMap<String, f64>,
    },
    /// Reserve (RESERVE_RESOURCES) or allocate (ALLOCATE) resources on an agent for a role.
    Record {
        /// A reservation or an allocation.
        kind: RecordKind,
        /// The record id.
        id: String,
        /// The role.
        role: String,
        /// The agent.
        agent: String,
        /// The resources.
        resources: BTreeMap<String, f64>,
        /// Place the allocation preparing (its resources count as offered, and it takes a
        /// prepare queue slot) rather than running. Only allocations can be prepared.
        prepare: bool,
    },
    /// Turn a preparing allocation into a running one (START).
    Start {
        /// The allocation id.
        id: String,
    },
    /// Set the allocation prepare queue length (UPDATE_PREPARE_QUEUE); 0 turns it off.
    UpdatePrepareQueue {
        /// At most this many allocations preparing at once.
        allocation_prepare_queue_length: u64,
    },
    /// Remove a reservation (UNRESERVE_RESOURCES) or an allocation (RELEASE).
    Remove {
        /// Which kind of record `id` names.
        kind: RecordKind,
        /// The record id.
        id: String,
    },
    /// Replace the usage counters with a recount (reconciliation of consumption).
    Repair,
    /// Mark an agent unreachable (MARK_AGENT_UNREACHABLE).
    MarkAgentUnreachable {
        /// The agent id.
        id: String,
    },
    /// Mark an agent gone (MARK_AGENT_GONE): terminal, releases its records.
    MarkAgentGone {
        /// The agent id.
        id: String,
    },
    /// Mark every recovered agent unreachable: the engine's own request once the
    /// re-registration timeout passed.
    RecoveredTimedOut,
}

/// Hashes a map of resources by name and bit pattern (f64 has no `Hash`).
fn hash_resources<H: Hasher>(resources: &BTreeMap<String, f64>, state: &mut H) {
    resources.len().hash(state);
    for (name, value) in resources {
        name.hash(state);
        value.to_bits().hash(state);
    }
}

impl Hash for AccountingRequest {
    fn hash<H: Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            AccountingRequest::UpdateQuota { configs, force } => {
                configs.len().hash(state);
                for c in configs {
                    c.role.hash(state);
                    hash_resources(&c.guarantees, state);
                    hash_resources(&c.limits, state);
                }
                force.hash(state);
            }
            AccountingRequest::RegisterAgent {
                id,
                state: agent_state,
                resources,
            } => {
                id.hash(state);
                agent_state.hash(state);
                hash_resources(resources, state);
            }
            AccountingRequest::Record {
                kind,
                id,
                role,
                agent,
                resources,
                prepare,
            } => {
                kind.hash(state);
                (id, role, agent).hash(state);
                hash_resources(resources, state);
                prepare.hash(state);
            }
            AccountingRequest::Start { id }
            | AccountingRequest::Remove { id, .. }
            | AccountingRequest::MarkAgentUnreachable { id }
            | AccountingRequest::MarkAgentGone { id } => {
                if let AccountingRequest::Remove { kind, .. } = self {
                    kind.hash(state);
                }
                id.hash(state);
            }
            AccountingRequest::UpdatePrepareQueue {
                allocation_prepare_queue_length,
            } => allocation_prepare_queue_length.hash(state),
            AccountingRequest::Repair | AccountingRequest::RecoveredTimedOut => {}
        }
    }
}

impl AccountingRequest {
    /// Returns an estimate of the request's encoded size, for the request-size limit.
    pub fn encoded_len(&self) -> usize {
        let names = |m: &mut dyn Iterator<Item = &String>| m.map(|k| k.len() + 12).sum::<usize>();
        match self {
            AccountingRequest::UpdateQuota { configs, .. } => configs
                .iter()
                .map(|c| c.role.len() + 8 + names(&mut c.guarantees.keys().chain(c.limits.keys())))
                .sum(),
            AccountingRequest::RegisterAgent { id, resources, .. } => {
                id.len() + names(&mut resources.keys())
            }
            AccountingRequest::Record {
                id,
                role,
                agent,
                resources,
                ..
            } => id.len() + role.len() + agent.len() + names(&mut resources.keys()) + 2,
            AccountingRequest::Remove { id, .. }
            | AccountingRequest::Start { id }
            | AccountingRequest::MarkAgentUnreachable { id }
            | AccountingRequest::MarkAgentGone { id } => id.len(),
            AccountingRequest::UpdatePrepareQueue { .. } => 10,
            AccountingRequest::Repair | AccountingRequest::RecoveredTimedOut => 0,
        }
    }

    /// Applies the request to `accounts` in `batch` at `now` (engine clock, for the prepare
    /// queue's fair share) and `wall` (the engine's wall clock, for the time an agent became
    /// unreachable), returning the rows a repair changed (else 0). ACCT-2: on a refusal
    /// nothing changed; a storage error is the outer error.
    #[allow(clippy::too_many_arguments)]
    pub fn apply(
        &self,
        accounts: &mut Accounts,
        quota_bytes: Option<u64>,
        index: &Index,
        now: Duration,
        wall: Duration,
        batch: &mut WriteBatch<'_>,
    ) -> Result<Result<usize, Error>, StorageError> {
        let result = match self {
            AccountingRequest::UpdateQuota { configs, force } => accounts
                .update_quota(configs, *force, quota_bytes, index, batch)
                .map(|()| 0),
            AccountingRequest::RegisterAgent {
                id,
                state,
                resources,
            } => parse_resources(resources)
                .and_then(|resources| accounts.register_agent(id, *state, resources, wall, batch))
                .map(|()| 0),
            AccountingRequest::Record {
                kind,
                id,
                role,
                agent,
                resources,
                prepare,
            } => parse_resources(resources)
                .and_then(|resources| {
                    accounts.record(*kind, id, role, agent, resources, *prepare, now, batch)
                })
                .map(|()| 0),
            AccountingRequest::Start { id } => accounts.start(id, batch).map(|()| 0),
            AccountingRequest::UpdatePrepareQueue {
                allocation_prepare_queue_length,
            } => accounts
                .set_prepare_queue_length(*allocation_prepare_queue_length, batch)
                .map_err(Error::Storage)
                .map(|()| 0),
            AccountingRequest::Remove { kind, id } => accounts.remove(*kind, id, batch).map(|()| 0),
            AccountingRequest::Repair => Ok(accounts.repair(index)),
            AccountingRequest::MarkAgentUnreachable { id } => {
                accounts.mark_unreachable(id, wall, batch).map(|()| 0)
            }
            AccountingRequest::MarkAgentGone { id } => accounts.mark_gone(id, batch).map(|()| 0),
            AccountingRequest::RecoveredTimedOut => accounts.recovered_timed_out(wall, batch),
        };
        match result {
            Err(Error::Storage(e)) => Err(e),
            other => Ok(other),
        }
    }
}
