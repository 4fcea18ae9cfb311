//! loom model of the write prepare queue's admission count (PREP-1, PREP-3): compiled from
//! the real `src/engine/prepare.rs`. Admissions, refusals and releases race; the count never
//! passes the bound, every attempt is either admitted or counted as refused, and every slot
//! is given back.

use kvd_loom_tests::clock::{Clock, ManualClock};
use kvd_loom_tests::prepare::PrepareQueue;
use kvd_loom_tests::sync::Arc;

/// Two writers of two roles against a queue of one slot: each admits, checks the bound while
/// it holds its slot, and releases. (Two threads keep the interleavings few enough for loom
/// to try them all.)
#[test]
fn admissions_refusals_and_releases_keep_the_bound() {
    loom::model(|| {
        // loom's Arc does not coerce to a trait object; it wraps a std one that does.
        let clock: std::sync::Arc<dyn Clock> = std::sync::Arc::new(ManualClock::new());
        let queue = Arc::new(PrepareQueue::new(1, Arc::from_std(clock)));
        let writers: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|role| {
                let queue = queue.clone();
                loom::thread::spawn(move || match PrepareQueue::admit(&queue, role) {
                    Ok(slot) => {
                        assert!(queue.depth() <= 1, "PREP-1: {} in the queue", queue.depth());
                        drop(slot);
                        true
                    }
                    Err(_) => false,
                })
            })
            .collect();
        let admitted = writers
            .into_iter()
            .map(|w| w.join().unwrap())
            .filter(|admitted| *admitted)
            .count();
        assert_eq!(queue.depth(), 0, "every slot given back");
        let refused: u64 = queue.roles().iter().map(|r| r.refused).sum();
        assert_eq!(
            admitted as u64 + refused,
            2,
            "PREP-3: each attempt counted once"
        );
        assert!(admitted >= 1);
    });
}
