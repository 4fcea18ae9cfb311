//! Operation reconciliation: the state of operations a client names (explicit) or of every
//! retained one (implicit), in Mesos's `RECONCILE_OPERATIONS` shape.
//!
//! Invariants:
//! - RECON-2: an explicit query is answered, in this order, `OPERATION_FINISHED`
//!   (with the revision) for a retained outcome, `OPERATION_PENDING` for an operation
//!   admitted and not yet applied, and otherwise by Mesos's agent branches: recovered →
//!   `OPERATION_RECOVERING`, registered → `OPERATION_UNKNOWN`, unreachable →
//!   `OPERATION_UNREACHABLE`, gone → `OPERATION_GONE_BY_OPERATOR`, agent given but unknown
//!   or no agent given → `OPERATION_UNKNOWN`, each with Mesos's message. Every query gets an
//!   answer (unlike task reconciliation's branch 2).
//!
//! Contact points: the engine's reconcile call runs it in the apply thread with the
//! pending ids admission tracks.

use std::collections::BTreeMap;
use std::time::Duration;

use super::Operations;
use crate::accounting::{Accounts, AgentState};

/// One operation of an explicit query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperationQuery {
    /// The operation id.
    pub operation_id: String,
    /// The agent it was for, if the client knows.
    pub agent_id: Option<String>,
}

/// Mesos's operation states that reconciliation answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperationState {
    /// Applied; its outcome is retained.
    Finished,
    /// Admitted, not yet applied.
    Pending,
    /// Unknown; its agent is recovered and has not registered again.
    Recovering,
    /// Unknown.
    Unknown,
    /// Unknown; its agent is unreachable.
    Unreachable,
    /// Unknown; its agent was marked gone.
    GoneByOperator,
}

impl OperationState {
    /// Mesos's name of the state.
    pub fn name(self) -> &'static str {
        match self {
            OperationState::Finished => "OPERATION_FINISHED",
            OperationState::Pending => "OPERATION_PENDING",
            OperationState::Recovering => "OPERATION_RECOVERING",
            OperationState::Unknown => "OPERATION_UNKNOWN",
            OperationState::Unreachable => "OPERATION_UNREACHABLE",
            OperationState::GoneByOperator => "OPERATION_GONE_BY_OPERATOR",
        }
    }
}

/// One answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationStatus {
    /// The operation id.
    pub operation_id: String,
    /// The agent the query gave.
    pub agent_id: Option<String>,
    /// The state.
    pub state: OperationState,
    /// Mesos's message, for the branches that have one.
    pub message: Option<&'static str>,
    /// The revision of a finished operation.
    pub revision: Option<i64>,
}

/// The inputs of one reconciliation.
pub struct ReconcileView<'a> {
    /// The retained outcomes.
    pub operations: &'a Operations,
    /// Ids admitted and not yet answered, with how many writes carry each.
    pub pending: &'a BTreeMap<String, usize>,
    /// The agents.
    pub accounts: &'a Accounts,
    /// Wall-clock now and the retention age (OPER-4: older outcomes do not count).
    pub now: Duration,
    /// The retention age.
    pub age: Duration,
}

impl ReconcileView<'_> {
    /// Answers an explicit query (RECON-2), or with no queries every retained and pending
    /// operation whose id starts with `prefix`, in id order.
    pub fn reconcile(&self, queries: &[OperationQuery], prefix: &str) -> Vec<OperationStatus> {
        if queries.is_empty() {
            let mut out: BTreeMap<&str, OperationStatus> = BTreeMap::new();
            for (id, _) in self
                .pending
                .range(prefix.to_owned()..)
                .take_while(|(id, _)| id.starts_with(prefix))
            {
                out.insert(id, self.status(id, None));
            }
            for (id, _) in self.operations.with_prefix(prefix, self.now, self.age) {
                out.insert(id, self.status(id, None));
            }
            return out.into_values().collect();
        }
        queries
            .iter()
            .map(|q| self.status(&q.operation_id, q.agent_id.as_deref()))
            .collect()
    }

    fn status(&self, id: &str, agent_id: Option<&str>) -> OperationStatus {
        let answer = |state, message: Option<&'static str>, revision| OperationStatus {
            operation_id: id.to_owned(),
            agent_id: agent_id.map(str::to_owned),
            state,
            message,
            revision,
        };
        if let Some(entry) = self.operations.get(id, self.now, self.age) {
            return answer(OperationState::Finished, None, Some(entry.revision));
        }
        if self.pending.contains_key(id) {
            return answer(OperationState::Pending, None, None);
        }
        let Some(agent_id) = agent_id else {
            return answer(
                OperationState::Unknown,
                Some("Reconciliation: Operation is unknown and no 'agent_id' was provided"),
                None,
            );
        };
        let (state, message) = match self.accounts.agent(agent_id).map(|a| a.state) {
            Some(AgentState::Recovered) => (
                OperationState::Recovering,
                "Reconciliation: Agent is recovered but has not re-registered",
            ),
            Some(AgentState::Registered) => (
                OperationState::Unknown,
                "Reconciliation: Operation is unknown",
            ),
            Some(AgentState::Unreachable) => (
                OperationState::Unreachable,
                "Reconciliation: Agent is unreachable",
            ),
            Some(AgentState::Gone) => (
                OperationState::GoneByOperator,
                "Reconciliation: Agent marked gone by operator",
            ),
            None => (
                OperationState::Unknown,
                "Reconciliation: Both operation and agent are unknown",
            ),
        };
        answer(state, Some(message), None)
    }
}
