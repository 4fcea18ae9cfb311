//! loom models of the one-slot hand-off under the blocking API (REPLY-1, REPLY-2):
//! compiled from the real `src/engine/reply.rs`. A lost wake-up would leave the caller
//! asleep forever, which loom reports as a deadlock.

use kvd_loom_tests::reply;

/// The answer comes from another thread, before or after the caller starts waiting: the
/// caller gets it exactly once.
#[test]
fn an_answer_reaches_the_waiting_caller() {
    loom::model(|| {
        let (answerer, awaited) = reply::slot::<u32>();
        let answering = loom::thread::spawn(move || answerer.answer(7));
        assert_eq!(awaited.wait(), Some(7));
        answering.join().unwrap();
    });
}

/// The answering end is dropped unanswered on another thread: the caller wakes with
/// `None` instead of sleeping forever.
#[test]
fn an_abandoned_slot_ends_the_wait() {
    loom::model(|| {
        let (answerer, awaited) = reply::slot::<u32>();
        let dropping = loom::thread::spawn(move || drop(answerer));
        assert_eq!(awaited.wait(), None);
        dropping.join().unwrap();
    });
}
