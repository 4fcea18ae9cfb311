//! Task reconciliation over the allocation records, which play Mesos's tasks: a scheduler
//! that lost track (its own failover, or the engine's restart) asks for the true state of
//! its allocations and gets Mesos's answers, branch for branch.
//!
//! Invariants:
//! - RECON-1: an explicit query is answered by the first matching branch of Mesos's
//!   six, in Mesos's order: (1) a live allocation is a known task and gets its latest state;
//!   (2) an unknown task whose agent is recovered (or, with no agent given, while any agent
//!   is recovered) gets no answer at all, since the agent may still report it; (3) agent
//!   registered: `TASK_GONE`; (4) agent unreachable: `TASK_UNREACHABLE` with the time;
//!   (5) agent gone: `TASK_GONE_BY_OPERATOR`; (6) otherwise `TASK_UNKNOWN`. A scheduler that
//!   is not partition-aware gets `TASK_LOST` wherever a partition-aware one gets a state
//!   other than running. Every answer carries `REASON_RECONCILIATION` and `SOURCE_MASTER`.
//!
//! Contact points: the engine's reconcile call runs it in the apply thread, so it sees
//! every record applied before it; `operations::reconcile` uses [`Accounts::agent`] for
//! its agent branches.

use super::{Accounts, AgentState};

/// One task of an explicit query: an allocation id and, optionally, its agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskQuery {
    /// The allocation id.
    pub task_id: String,
    /// The agent the scheduler thinks it is on.
    pub agent_id: Option<String>,
}

/// Mesos's task states that reconciliation answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    /// A live allocation.
    Running,
    /// Unknown to a registered agent (partition-aware).
    Gone,
    /// What a scheduler that is not partition-aware gets for the other states.
    Lost,
    /// On an unreachable agent (partition-aware).
    Unreachable,
    /// On an agent marked gone (partition-aware).
    GoneByOperator,
    /// Neither task nor agent known (partition-aware).
    Unknown,
}

impl TaskState {
    /// Mesos's name of the state.
    pub fn name(self) -> &'static str {
        match self {
            TaskState::Running => "TASK_RUNNING",
            TaskState::Gone => "TASK_GONE",
            TaskState::Lost => "TASK_LOST",
            TaskState::Unreachable => "TASK_UNREACHABLE",
            TaskState::GoneByOperator => "TASK_GONE_BY_OPERATOR",
            TaskState::Unknown => "TASK_UNKNOWN",
        }
    }
}

/// One reconciliation answer (Mesos's `TaskStatus` fields that apply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskStatus {
    /// The allocation id asked about.
    pub task_id: String,
    /// The agent: the allocation's for a known task, else the one the query gave.
    pub agent_id: Option<String>,
    /// The state.
    pub state: TaskState,
    /// Mesos's message for the branch.
    pub message: &'static str,
    /// When the agent became unreachable, wall-clock nanoseconds since the Unix epoch.
    pub unreachable_time: Option<u64>,
}

impl TaskStatus {
    /// Always `REASON_RECONCILIATION`.
    pub const REASON: &'static str = "REASON_RECONCILIATION";
    /// Always `SOURCE_MASTER`.
    pub const SOURCE: &'static str = "SOURCE_MASTER";
}

const LATEST: &str = "Reconciliation: Latest task state";

impl Accounts {
    /// Answers a task reconciliation (RECON-1): implicit with no tasks (every live
    /// allocation, in id order), else explicit, one answer per task except branch 2.
    pub fn reconcile_tasks(&self, tasks: &[TaskQuery], partition_aware: bool) -> Vec<TaskStatus> {
        let lost_unless_aware = |state| {
            if partition_aware {
                state
            } else {
                TaskState::Lost
            }
        };
        let latest = |task_id: &str| {
            let allocation = self.allocations.get(task_id)?;
            let agent = self.agents.get(&allocation.agent);
            let (state, unreachable_time) = match agent.map(|a| a.state) {
                Some(AgentState::Unreachable) => (
                    lost_unless_aware(TaskState::Unreachable),
                    agent.and_then(|a| a.unreachable_since),
                ),
                _ => (TaskState::Running, None),
            };
            Some(TaskStatus {
                task_id: task_id.to_owned(),
                agent_id: Some(allocation.agent.clone()),
                state,
                message: LATEST,
                unreachable_time,
            })
        };
        if tasks.is_empty() {
            return self
                .allocations
                .keys()
                .filter_map(|id| latest(id))
                .collect();
        }
        let any_recovered = self.has_recovered_agents();
        let mut out = Vec::new();
        for query in tasks {
            if let Some(status) = latest(&query.task_id) {
                out.push(status);
                continue;
            }
            let agent = query.agent_id.as_deref().and_then(|id| self.agents.get(id));
            let recovered = match &query.agent_id {
                Some(_) => agent.is_some_and(|a| a.state == AgentState::Recovered),
                None => any_recovered,
            };
            if recovered {
                continue;
            }
            let (state, message, unreachable_time) = match agent.map(|a| a.state) {
                Some(AgentState::Registered) => (
                    lost_unless_aware(TaskState::Gone),
                    "Reconciliation: Task is unknown to the agent",
                    None,
                ),
                Some(AgentState::Unreachable) => (
                    lost_unless_aware(TaskState::Unreachable),
                    "Reconciliation: Task is unreachable",
                    agent.and_then(|a| a.unreachable_since),
                ),
                Some(AgentState::Gone) => (
                    lost_unless_aware(TaskState::GoneByOperator),
                    "Reconciliation: Task is gone",
                    None,
                ),
                Some(AgentState::Recovered) | None => (
                    lost_unless_aware(TaskState::Unknown),
                    "Reconciliation: Task is unknown",
                    None,
                ),
            };
            out.push(TaskStatus {
                task_id: query.task_id.clone(),
                agent_id: query.agent_id.clone(),
                state,
                message,
                unreachable_time,
            });
        }
        out
    }
}
