//! Mesos's recommended client algorithm for task reconciliation, for library users that keep
//! their allocations in kvd: ask for the tasks not yet answered, back off, ask again, until
//! every task has an answer or the attempts run out; only one run at a time.
//!
//! Engine answers are synchronous, so "an update arrived after the start" is "the task was
//! answered in some round of this run". The only unanswered tasks are those of Mesos's
//! branch 2 (the agent is recovered and has not registered again), which an agent's
//! re-registration or the re-registration timeout settles.
//!
//! Invariants:
//! - RECONCILER-1: a run asks only for the tasks no round of the same run has answered yet,
//!   and each answer it returns is the first one a round gave for that task.
//! - RECONCILER-2: at most one run is current per `Reconciler`: starting a run makes every
//!   earlier one stop before its next round, with what it had.
//! - RECONCILER-3: the pause before round `n + 1` is `initial * 2^n`, at most `max`
//!   (truncated exponential backoff), and it is taken through the caller's `sleep`, so a
//!   test runs without waiting.
//!
//! Contact points: [`Engine::reconcile_tasks`] only.

use std::time::Duration;

use crate::accounting::{TaskQuery, TaskStatus};
use crate::engine::Engine;
use crate::error::Result;
use crate::sync::{Arc, AtomicU64, Ordering};

/// Runs Mesos's reconciliation algorithm; see the module doc.
///
/// ```
/// # use std::collections::BTreeMap;
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
/// engine.register_agent("a1", kvd::AgentState::Registered, BTreeMap::new()).unwrap();
/// engine.allocate("x1", "ml", "a1", BTreeMap::from([("cpus".to_owned(), 1.0)])).unwrap();
/// let reconciler = kvd::Reconciler::default();
/// let tasks = vec![kvd::TaskQuery { task_id: "x1".into(), agent_id: None }];
/// let run = reconciler.reconcile_tasks(&engine, tasks, true, |_| {}).unwrap();
/// assert_eq!(run.statuses[0].state, kvd::TaskState::Running);
/// assert!(run.unanswered.is_empty() && !run.superseded);
/// ```
#[derive(Debug, Clone)]
pub struct Reconciler {
    /// The pause after the first round.
    pub initial_backoff: Duration,
    /// The longest pause.
    pub max_backoff: Duration,
    /// Rounds per run, at most.
    pub rounds_max: u32,
    current: Arc<AtomicU64>,
}

impl Default for Reconciler {
    fn default() -> Reconciler {
        Reconciler::new(Duration::from_millis(500), Duration::from_secs(60), 16)
    }
}

/// What a run ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileRun {
    /// The answers, in the order the tasks were answered.
    pub statuses: Vec<TaskStatus>,
    /// The tasks no round answered (Mesos's branch 2 each time).
    pub unanswered: Vec<TaskQuery>,
    /// Rounds asked.
    pub rounds: u32,
    /// True if a newer run started and this one stopped early (RECONCILER-2).
    pub superseded: bool,
}

impl Reconciler {
    /// Returns a reconciler pausing `initial_backoff`, doubling up to `max_backoff`, for at
    /// most `rounds_max` rounds per run (at least 1).
    pub fn new(initial_backoff: Duration, max_backoff: Duration, rounds_max: u32) -> Reconciler {
        Reconciler {
            initial_backoff,
            max_backoff,
            rounds_max: rounds_max.max(1),
            current: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Reconciles `tasks` (explicitly; an empty list asks once, implicitly, for every live
    /// allocation) until each is answered, the rounds run out or a newer run starts;
    /// `sleep` takes the pauses (RECONCILER-3).
    pub fn reconcile_tasks(
        &self,
        engine: &Engine,
        tasks: Vec<TaskQuery>,
        partition_aware: bool,
        mut sleep: impl FnMut(Duration),
    ) -> Result<ReconcileRun> {
        let run = self.current.fetch_add(1, Ordering::AcqRel) + 1;
        let mut out = ReconcileRun {
            statuses: Vec::new(),
            unanswered: Vec::new(),
            rounds: 0,
            superseded: false,
        };
        if tasks.is_empty() {
            out.statuses = engine.reconcile_tasks(Vec::new(), partition_aware)?;
            out.rounds = 1;
            return Ok(out);
        }
        let mut remaining = tasks;
        let mut pause = self.initial_backoff;
        while !remaining.is_empty() && out.rounds < self.rounds_max {
            if out.rounds > 0 {
                sleep(pause);
                pause = (pause * 2).min(self.max_backoff);
            }
            if self.current.load(Ordering::Acquire) != run {
                out.superseded = true;
                break;
            }
            let answers = engine.reconcile_tasks(remaining.clone(), partition_aware)?;
            out.rounds += 1;
            // RECONCILER-1: drop every task this round answered.
            remaining.retain(|t| !answers.iter().any(|s| s.task_id == t.task_id));
            out.statuses.extend(answers);
        }
        out.unanswered = remaining;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::Reconciler;
    use crate::accounting::{AgentState, TaskQuery, TaskState};
    use crate::engine::{Config, Engine};

    fn cpus() -> BTreeMap<String, f64> {
        BTreeMap::from([("cpus".to_owned(), 1.0)])
    }

    fn query(id: &str, agent: &str) -> TaskQuery {
        TaskQuery {
            task_id: id.into(),
            agent_id: Some(agent.into()),
        }
    }

    #[test]
    fn backs_off_until_the_recovered_agent_registers_and_a_newer_run_supersedes() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(dir.path(), Config::default()).unwrap();
        engine
            .register_agent("a1", AgentState::Registered, cpus())
            .unwrap();
        engine.allocate("x1", "ml", "a1", cpus()).unwrap();
        engine.close().unwrap();
        let engine = Engine::open(dir.path(), Config::default()).unwrap();
        let reconciler = Reconciler::new(Duration::from_secs(1), Duration::from_secs(4), 8);
        let mut pauses = Vec::new();
        // a1 is recovered: the unknown task gets no answer (branch 2) until a1 registers
        // again, which happens during the third pause.
        let run = reconciler
            .reconcile_tasks(
                &engine,
                vec![query("x1", "a1"), query("gone-task", "a1")],
                true,
                |pause| {
                    pauses.push(pause);
                    if pauses.len() == 3 {
                        engine
                            .register_agent("a1", AgentState::Registered, cpus())
                            .unwrap();
                    }
                },
            )
            .unwrap();
        let secs: Vec<u64> = pauses.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 2, 4], "doubling, truncated at the maximum");
        assert_eq!(run.rounds, 4);
        let states: Vec<_> = run
            .statuses
            .iter()
            .map(|s| (s.task_id.as_str(), s.state))
            .collect();
        assert_eq!(
            states,
            [("x1", TaskState::Running), ("gone-task", TaskState::Gone)]
        );
        assert!(run.unanswered.is_empty());

        // Starting a run stops an older one before its next round.
        engine.close().unwrap();
        let engine = Engine::open(dir.path(), Config::default()).unwrap();
        let mut newer = None;
        let older = reconciler
            .reconcile_tasks(&engine, vec![query("never", "a1")], true, |_| {
                if newer.is_none() {
                    newer = Some(reconciler.reconcile_tasks(&engine, vec![], true, |_| {}));
                }
            })
            .unwrap();
        assert!(older.superseded);
        assert_eq!((older.rounds, older.unanswered.len()), (1, 1));
        let newer = newer.unwrap().unwrap();
        assert_eq!(newer.statuses.len(), 1, "implicit: the live allocation x1");
    }
}
