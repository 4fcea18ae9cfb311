//! The one-slot hand-off under the blocking API: a completion fills the slot and the
//! caller's thread sleeps on a condition variable until it is filled.
//!
//! Invariants:
//! - REPLY-1: the waiting thread never spins or yields: it sleeps until the answer is in
//!   the slot or the answering end was dropped unanswered (then it gets `None`).
//!   A channel's receive spins and yields before it parks, and with many blocked writers
//!   those yields took the CPU from the apply and commit threads.
//! - REPLY-2: one lock and at most one notification per answer.
//!
//! Contact points: `Engine`'s blocking methods (`engine::wait`); `loom-tests/` models
//! this file.

use crate::sync::{Arc, Condvar, Mutex, lock, wait};

/// What the slot holds.
enum Slot<T> {
    Empty,
    Answered(T),
    /// The answering end was dropped without an answer (the engine stopped).
    Abandoned,
}

struct Shared<T> {
    slot: Mutex<Slot<T>>,
    filled: Condvar,
}

/// The answering end: answers once; dropped unanswered, it abandons the slot.
pub struct Answerer<T> {
    shared: Arc<Shared<T>>,
    answered: bool,
}

/// The waiting caller's end.
pub struct Awaited<T> {
    shared: Arc<Shared<T>>,
}

/// Returns the two ends of an empty slot.
pub fn slot<T>() -> (Answerer<T>, Awaited<T>) {
    let shared = Arc::new(Shared {
        slot: Mutex::new(Slot::Empty),
        filled: Condvar::new(),
    });
    let answerer = Answerer {
        shared: shared.clone(),
        answered: false,
    };
    (answerer, Awaited { shared })
}

impl<T> Answerer<T> {
    /// Puts `answer` in the slot and wakes the waiting caller (REPLY-2).
    pub fn answer(mut self, answer: T) {
        self.answered = true;
        self.fill(Slot::Answered(answer));
    }

    fn fill(&self, slot: Slot<T>) {
        *lock(&self.shared.slot) = slot;
        self.shared.filled.notify_one();
    }
}

impl<T> Drop for Answerer<T> {
    fn drop(&mut self) {
        if !self.answered {
            self.fill(Slot::Abandoned);
        }
    }
}

impl<T> Awaited<T> {
    /// Sleeps until the slot is filled and returns its answer, or `None` if the answering
    /// end was dropped unanswered (REPLY-1).
    pub fn wait(self) -> Option<T> {
        let mut slot = lock(&self.shared.slot);
        loop {
            match std::mem::replace(&mut *slot, Slot::Empty) {
                Slot::Empty => {}
                Slot::Answered(answer) => return Some(answer),
                Slot::Abandoned => return None,
            }
            slot = wait(&self.shared.filled, slot);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn an_answer_from_another_thread_wakes_the_caller() {
        let (answerer, awaited) = slot::<u32>();
        let answering = std::thread::spawn(move || answerer.answer(7));
        assert_eq!(awaited.wait(), Some(7));
        answering.join().unwrap();
    }

    #[test]
    fn an_answer_given_before_the_wait_is_kept() {
        let (answerer, awaited) = slot::<u32>();
        answerer.answer(3);
        assert_eq!(awaited.wait(), Some(3));
    }

    #[test]
    fn an_answerer_dropped_unanswered_ends_the_wait_with_none() {
        let (answerer, awaited) = slot::<u32>();
        let dropping = std::thread::spawn(move || drop(answerer));
        assert_eq!(awaited.wait(), None);
        dropping.join().unwrap();
    }
}
