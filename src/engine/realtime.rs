//! Real-time scheduling of the write pipeline's threads (`Config::pipeline_priority`).
//!
//! Under the kernel's fair scheduler a woken apply or commit thread waits for the CPU until
//! the running thread (a busy connection thread of the server, say) has used its time slice,
//! and a write crosses several such wake-ups: with one tenant flooding the server, another
//! tenant's write waited for those slices, not for the queue. Under `SCHED_FIFO` the two
//! pipeline threads run as soon as they are woken. They do bounded work and sleep, so they
//! cannot keep the CPU from the connection threads for long; the kernel's real-time
//! throttling (by default 95 % of each second) bounds even a bug.
//!
//! Invariants:
//! - RT-1: with a priority configured, the apply and commit threads run under `SCHED_FIFO`
//!   at that priority before `Engine::open` returns, or open fails (nothing is left
//!   running) with an error that says what the process lacks.
//! - RT-2: a thread at real-time priority gives way on purpose while a batch gathers
//!   (`apply::run`, APPLY-6): it would otherwise take every write as it arrives, one batch
//!   and one sync each.
//!
//! Contact points: `Engine::open` calls [`raise`] for each pipeline thread.

use std::thread::JoinHandle;

use crate::error::{Error, Result};

/// The lowest and highest `SCHED_FIFO` priorities Linux accepts.
pub const PRIORITY_RANGE: std::ops::RangeInclusive<u8> = 1..=99;

/// Checks a configured priority before anything is opened.
pub fn validate(priority: Option<u8>) -> Result<()> {
    match priority {
        Some(p) if !PRIORITY_RANGE.contains(&p) => Err(Error::InvalidArgument(format!(
            "pipeline_priority must be between {} and {} (SCHED_FIFO), not {p}",
            PRIORITY_RANGE.start(),
            PRIORITY_RANGE.end()
        ))),
        Some(_) if !cfg!(target_os = "linux") => Err(Error::InvalidArgument(
            "pipeline_priority (SCHED_FIFO threads) is supported on Linux only".into(),
        )),
        _ => Ok(()),
    }
}

/// Puts `thread` under `SCHED_FIFO` at `priority` (RT-1).
#[cfg(target_os = "linux")]
pub fn raise(thread: &JoinHandle<()>, name: &str, priority: u8) -> Result<()> {
    use std::os::unix::thread::JoinHandleExt;
    use thread_priority::{
        RealtimeThreadSchedulePolicy, ThreadPriority, ThreadPriorityValue, ThreadSchedulePolicy,
        set_thread_priority_and_policy,
    };
    let value = ThreadPriorityValue::try_from(priority).map_err(Error::InvalidArgument)?;
    set_thread_priority_and_policy(
        thread.as_pthread_t(),
        ThreadPriority::Crossplatform(value),
        ThreadSchedulePolicy::Realtime(RealtimeThreadSchedulePolicy::Fifo),
    )
    .map_err(|e| {
        let why = match e {
            thread_priority::Error::OS(code) => {
                let err = std::io::Error::from_raw_os_error(code);
                if err.kind() == std::io::ErrorKind::PermissionDenied {
                    format!("{err}: it needs root, CAP_SYS_NICE or an RLIMIT_RTPRIO of {priority} or more")
                } else {
                    err.to_string()
                }
            }
            other => format!("{other:?}"),
        };
        Error::InvalidArgument(format!(
            "cannot run the {name} thread under SCHED_FIFO at priority {priority}: {why}"
        ))
    })
}

/// Real-time threads are refused by [`validate`] outside Linux.
#[cfg(not(target_os = "linux"))]
pub fn raise(_thread: &JoinHandle<()>, _name: &str, _priority: u8) -> Result<()> {
    Ok(())
}
