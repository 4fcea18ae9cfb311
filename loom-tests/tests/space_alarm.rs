//! loom models of issue 4's concurrency: raising the NOSPACE alarm against concurrent
//! admission (ALARM-3), and the defrag file swap against concurrent readers (DEFRAG-3).
//! Models of the protocols, written with kvd's `sync` module; the real code needs redb.

use std::collections::VecDeque;

use kvd_loom_tests::sync::{Arc, AtomicBool, Mutex, Ordering, RwLock};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proposal {
    Activate,
    Put,
}

/// Admission reads the alarm flag and queues; the apply thread applies in queue order and
/// re-checks the flag for every write with a cost. After the activation is applied, no Put
/// is applied, whatever admission saw.
#[test]
fn no_costly_write_is_applied_after_the_alarm() {
    loom::model(|| {
        let nospace = Arc::new(AtomicBool::new(false));
        let queue = Arc::new(Mutex::new(VecDeque::new()));
        let client = {
            let (nospace, queue) = (nospace.clone(), queue.clone());
            loom::thread::spawn(move || {
                for _ in 0..2 {
                    if !nospace.load(Ordering::Acquire) {
                        queue.lock().unwrap().push_back(Proposal::Put);
                    }
                }
            })
        };
        queue.lock().unwrap().push_back(Proposal::Activate);
        // The apply thread (this thread) drains the queue twice, around the client.
        let mut applied = Vec::new();
        let apply = |applied: &mut Vec<Proposal>| {
            while let Some(p) = queue.lock().unwrap().pop_front() {
                match p {
                    Proposal::Activate => {
                        nospace.store(true, Ordering::Release);
                        applied.push(p);
                    }
                    Proposal::Put if !nospace.load(Ordering::Acquire) => applied.push(p),
                    Proposal::Put => {}
                }
            }
        };
        apply(&mut applied);
        client.join().unwrap();
        apply(&mut applied);
        let activation = applied
            .iter()
            .position(|p| *p == Proposal::Activate)
            .unwrap();
        assert!(
            applied[activation..].iter().all(|p| *p != Proposal::Put),
            "{applied:?}"
        );
    });
}

struct Generation {
    id: u8,
    closed: AtomicBool,
}

/// Defrag puts a new database in service under the write lock; a reader clones the one in
/// service under the read lock and reads only from it. A reader never sees a closed file
/// nor a mix of the two.
#[test]
fn readers_finish_on_the_file_they_started_on() {
    loom::model(|| {
        let current = Arc::new(RwLock::new(Arc::new(Generation {
            id: 1,
            closed: AtomicBool::new(false),
        })));
        let swapper = {
            let current = current.clone();
            loom::thread::spawn(move || {
                let old = std::mem::replace(
                    &mut *current.write().unwrap(),
                    Arc::new(Generation {
                        id: 2,
                        closed: AtomicBool::new(false),
                    }),
                );
                // The old file is closed when its last holder lets go: here, if no reader
                // holds it any more.
                if Arc::strong_count(&old) == 1 {
                    old.closed.store(true, Ordering::Release);
                }
            })
        };
        let file = current.read().unwrap().clone();
        let first = file.id;
        assert!(
            !file.closed.load(Ordering::Acquire),
            "read from a closed file"
        );
        let second = file.id;
        assert_eq!(first, second, "one reader saw two files");
        drop(file);
        swapper.join().unwrap();
        assert_eq!(current.read().unwrap().id, 2);
    });
}
