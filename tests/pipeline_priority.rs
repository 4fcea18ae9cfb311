//! `Config::pipeline_priority` (RT-1, RT-2, APPLY-6): the apply and commit threads under
//! `SCHED_FIFO`, or an open that fails and says why; writes from many threads at once
//! (batches that gather) all applied once. Its own test binary, so no other test's engine
//! runs real-time threads beside it.

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use kvd::{Config, Engine, PutRequest, RangeRequest};

/// The threads of this process under `SCHED_FIFO`: (name, real-time priority), from
/// `/proc/self/task/*/stat` (fields 40 and 41: `rt_priority` and `policy`, 1 = FIFO).
fn fifo_threads() -> Vec<(String, u64)> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        // A thread may end between the listing and the read.
        let Ok(stat) = std::fs::read_to_string(task.unwrap().path().join("stat")) else {
            continue;
        };
        let (open, close) = (stat.find('(').unwrap(), stat.rfind(')').unwrap());
        let name = stat[open + 1..close].to_string();
        // After the name come the fields from the third (state) on.
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        let field = |n: usize| fields[n - 3].parse::<u64>().unwrap();
        if field(41) == 1 {
            found.push((name, field(40)));
        }
    }
    found.sort();
    found
}

/// Whether this process may run threads under `SCHED_FIFO` at `priority`: it holds
/// CAP_SYS_NICE (bit 23 of `CapEff` in `/proc/self/status`; CI runs as root, so there it
/// does), or its soft `RLIMIT_RTPRIO` (`/proc/self/limits`) allows the priority.
fn may_use_sched_fifo(priority: u64) -> bool {
    const CAP_SYS_NICE: u32 = 23;
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let effective = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .map(|hex| u64::from_str_radix(hex.trim(), 16).unwrap())
        .expect("CapEff in /proc/self/status");
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let rtprio = limits
        .lines()
        .find_map(|line| line.strip_prefix("Max realtime priority"))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("Max realtime priority in /proc/self/limits");
    effective & (1 << CAP_SYS_NICE) != 0
        || rtprio == "unlimited"
        || rtprio.parse::<u64>().unwrap() >= priority
}

#[test]
fn the_pipeline_threads_run_under_sched_fifo_or_open_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        pipeline_priority: Some(3),
        ..Config::default()
    };
    let privileged = may_use_sched_fifo(3);
    match Engine::open(dir.path(), config) {
        Ok(engine) => {
            assert!(
                privileged,
                "SCHED_FIFO granted without CAP_SYS_NICE or RLIMIT_RTPRIO"
            );
            assert_eq!(
                fifo_threads(),
                vec![("kvd-apply".to_string(), 3), ("kvd-commit".to_string(), 3)],
                "exactly the two pipeline threads, at the priority asked"
            );
            // Eight writers at once: batches of more than one, which then gather (APPLY-6).
            let engine = Arc::new(engine);
            let writers: Vec<_> = (0..8)
                .map(|w| {
                    let engine = engine.clone();
                    std::thread::spawn(move || {
                        for i in 0..200 {
                            engine
                                .put(PutRequest::new(format!("k/{w}/{i:03}"), "v"))
                                .unwrap();
                        }
                    })
                })
                .collect();
            for w in writers {
                w.join().unwrap();
            }
            let all = engine.range(&RangeRequest::prefix("k/")).unwrap();
            assert_eq!(all.count, 1_600);
            assert_eq!(all.header.revision, 1_601, "each put applied once");
            drop(Arc::into_inner(engine).expect("the writers are done"));
            assert_eq!(fifo_threads(), vec![], "closed: no thread left");
        }
        Err(err) => {
            // Without the privilege (no CAP_SYS_NICE, RLIMIT_RTPRIO below 3): a clear
            // refusal. With it, the open must succeed.
            let text = err.to_string();
            assert!(
                !privileged,
                "refused although the process may use SCHED_FIFO: {text}"
            );
            assert!(
                text.contains("under SCHED_FIFO at priority 3") && text.contains("CAP_SYS_NICE"),
                "{text}"
            );
            assert_eq!(fifo_threads(), vec![]);
            // RT-1: nothing was left running; the directory opens again.
            let engine = Engine::open(dir.path(), Config::default()).unwrap();
            engine.put(PutRequest::new("k", "v")).unwrap();
        }
    }
}

#[test]
fn a_priority_outside_1_to_99_is_refused_before_anything_opens() {
    for priority in [0, 100] {
        let dir = tempfile::tempdir().unwrap();
        let config = Config {
            pipeline_priority: Some(priority),
            ..Config::default()
        };
        let err = Engine::open(dir.path().join("data"), config).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "kvd: invalid argument: pipeline_priority must be between 1 and 99 (SCHED_FIFO), not {priority}"
            )
        );
        assert!(!dir.path().join("data").exists(), "nothing created");
    }
}
