//! A many-to-one hand-off between threads: producers push, one consumer takes everything
//! queued at once and sleeps on a condition variable when there is nothing. It carries
//! proposals to the apply thread and committed batches to the commit thread.
//!
//! Invariants:
//! - MAIL-1: a consumer takes items in the order they were pushed, each exactly once.
//! - MAIL-2: no lost wake-up: a push that happens while the consumer waits wakes it, and a
//!   push that happens before it waits is seen before it sleeps (both under one mutex).
//! - MAIL-3: nobody spins: an empty consumer sleeps until a push, `close` or its timeout.
//!   One lock per push, and one notification per sleep of the consumer (the first push
//!   after it fell asleep); taking a whole burst costs one lock.
//! - MAIL-4: a consumer that waits for several items (`take_at_least`) is woken by the push
//!   that brings them, by `close` or `nudge`, or by its timeout, never by a push before;
//!   MAIL-2 holds for that push.
//!
//! Contact points: `engine::Engine` pushes proposals; `engine::apply` takes them and pushes
//! committed batches; `engine::commit` takes those. `loom-tests/` models this file.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::sync::{self, Condvar, Mutex, lock};

/// A queue with one consumer that sleeps while it is empty.
#[derive(Debug)]
pub struct Mailbox<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
}

#[derive(Debug)]
struct State<T> {
    items: VecDeque<T>,
    closed: bool,
    /// True while the consumer sleeps and no push has woken it yet: a push notifies only
    /// then, and clears it (MAIL-3).
    waiting: bool,
    /// How many queued items the sleeping consumer waits for: a push that leaves fewer
    /// queued does not wake it (MAIL-4). 1 except during `take_at_least`.
    want: usize,
    /// Set by `nudge`: the next `take` returns even if nothing is queued.
    nudged: bool,
}

/// What [`Mailbox::take`] found.
#[derive(Debug)]
pub struct Taken<T> {
    /// The items, oldest first (MAIL-1).
    pub items: Vec<T>,
    /// True once the mailbox is closed; no item will follow the ones returned.
    pub closed: bool,
}

impl<T> Mailbox<T> {
    /// Returns an empty, open mailbox.
    pub fn new() -> Mailbox<T> {
        Mailbox {
            state: Mutex::new(State {
                items: VecDeque::new(),
                closed: false,
                waiting: false,
                want: 1,
                nudged: false,
            }),
            ready: Condvar::new(),
        }
    }

    /// Queues `item`; gives it back if the mailbox is closed.
    pub fn push(&self, item: T) -> Result<(), T> {
        let mut state = lock(&self.state);
        if state.closed {
            return Err(item);
        }
        state.items.push_back(item);
        // The first push to a sleeping consumer that brings what it waits for wakes it and
        // clears the flag, so the pushes that follow before it runs add no notification
        // (MAIL-3, MAIL-4).
        let wake = state.waiting && state.items.len() >= state.want;
        if wake {
            state.waiting = false;
        }
        drop(state);
        if wake {
            self.ready.notify_one();
        }
        Ok(())
    }

    /// Closes the mailbox: later pushes fail, and the consumer sees `closed` once it has
    /// taken what is queued.
    pub fn close(&self) {
        lock(&self.state).closed = true;
        self.ready.notify_one();
    }

    /// Makes the consumer's current or next `take` return, with nothing if nothing is queued:
    /// for a change the consumer must look at that is not an item (a manual clock moved).
    pub fn nudge(&self) {
        let mut state = lock(&self.state);
        state.nudged = true;
        let wake = std::mem::replace(&mut state.waiting, false);
        drop(state);
        if wake {
            self.ready.notify_one();
        }
    }

    /// Returns true if nothing is queued.
    pub fn is_empty(&self) -> bool {
        lock(&self.state).items.is_empty()
    }

    /// Returns true if the consumer sleeps with nothing queued and the mailbox is open: it
    /// has finished everything pushed so far. A push may follow at once, so only a
    /// producer that excludes the others (the sole producer, or one holding the
    /// consumer's state) may act on it.
    pub fn consumer_idle(&self) -> bool {
        let state = lock(&self.state);
        state.waiting && state.items.is_empty() && !state.closed
    }

    /// Takes up to `max` queued items, oldest first; if there are none, sleeps until one is
    /// pushed, the mailbox closes, or `timeout` passes (`None` waits without limit,
    /// `Some(ZERO)` does not wait).
    pub fn take(&self, max: usize, timeout: Option<Duration>) -> Taken<T> {
        self.take_at_least(max, 1, timeout)
    }

    /// Takes up to `max` queued items, oldest first, once at least `want` are queued; sleeps
    /// until then, or until the mailbox closes, a nudge, or `timeout` passes, and then takes
    /// what there is, possibly fewer than `want` or none (MAIL-4).
    pub fn take_at_least(&self, max: usize, want: usize, timeout: Option<Duration>) -> Taken<T> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut state = lock(&self.state);
        while state.items.len() < want.max(1) && !state.closed && !state.nudged {
            let wait = match deadline {
                None => None,
                Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => break,
                },
            };
            state.waiting = true;
            state.want = want.max(1);
            state = match wait {
                None => sync::wait(&self.ready, state),
                Some(left) => sync::wait_timeout(&self.ready, state, left),
            };
            state.waiting = false;
            state.want = 1;
        }
        state.nudged = false;
        let n = state.items.len().min(max);
        let items: Vec<T> = state.items.drain(..n).collect();
        let closed = state.closed && state.items.is_empty();
        Taken { items, closed }
    }
}

impl<T> Default for Mailbox<T> {
    fn default() -> Mailbox<T> {
        Mailbox::new()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn takes_a_burst_in_order_and_at_most_max() {
        let mailbox = Mailbox::new();
        for i in 0..5 {
            mailbox.push(i).unwrap();
        }
        let first = mailbox.take(3, None);
        assert_eq!((first.items, first.closed), (vec![0, 1, 2], false));
        mailbox.close();
        assert_eq!(mailbox.push(9), Err(9), "closed refuses");
        let rest = mailbox.take(10, None);
        assert_eq!((rest.items, rest.closed), (vec![3, 4], true));
    }

    #[test]
    fn empty_take_with_zero_timeout_returns_at_once() {
        let mailbox: Mailbox<u8> = Mailbox::new();
        let taken = mailbox.take(1, Some(Duration::ZERO));
        assert!(taken.items.is_empty() && !taken.closed);
    }

    #[test]
    fn sleeping_consumer_wakes_on_push() {
        let mailbox = crate::sync::Arc::new(Mailbox::new());
        let consumer = {
            let mailbox = mailbox.clone();
            std::thread::spawn(move || mailbox.take(8, None).items)
        };
        mailbox.push(7).unwrap();
        assert_eq!(consumer.join().unwrap(), vec![7]);
    }

    #[test]
    fn only_the_first_push_to_a_sleeping_consumer_notifies() {
        let mailbox = crate::sync::Arc::new(Mailbox::new());
        let consumer = {
            let mailbox = mailbox.clone();
            std::thread::spawn(move || mailbox.take(8, None).items)
        };
        // Wait until the consumer sleeps (it sets the flag under the lock, then waits).
        while !lock(&mailbox.state).waiting {
            std::thread::yield_now();
        }
        mailbox.push(1).unwrap();
        // Whether or not the consumer has run yet, nobody is left to notify: the first push
        // claimed the wake-up (MAIL-3), so this one must not notify.
        assert!(!lock(&mailbox.state).waiting);
        mailbox.push(2).unwrap();
        assert!(!lock(&mailbox.state).waiting);
        let taken = consumer.join().unwrap();
        // The consumer took the first push, or both if the second came before it ran.
        assert!(taken == vec![1] || taken == vec![1, 2], "took {taken:?}");
    }

    #[test]
    fn take_at_least_sleeps_until_enough_are_queued_or_the_timeout() {
        let mailbox = crate::sync::Arc::new(Mailbox::new());
        let consumer = {
            let mailbox = mailbox.clone();
            std::thread::spawn(move || mailbox.take_at_least(8, 3, None).items)
        };
        while !lock(&mailbox.state).waiting {
            std::thread::yield_now();
        }
        mailbox.push(1).unwrap();
        mailbox.push(2).unwrap();
        // Two of the three wanted: the consumer still sleeps, unwoken (MAIL-4).
        assert!(lock(&mailbox.state).waiting);
        mailbox.push(3).unwrap();
        assert!(!lock(&mailbox.state).waiting, "the third push woke it");
        assert_eq!(consumer.join().unwrap(), vec![1, 2, 3]);
        assert_eq!(lock(&mailbox.state).want, 1, "an ordinary take follows");

        // Fewer than wanted by the timeout: it takes what there is.
        mailbox.push(4).unwrap();
        let started = Instant::now();
        let short = mailbox.take_at_least(8, 5, Some(Duration::from_millis(20)));
        assert!(started.elapsed() >= Duration::from_millis(20));
        assert_eq!((short.items, short.closed), (vec![4], false));
        // A close ends the wait at once.
        mailbox.push(5).unwrap();
        mailbox.close();
        let last = mailbox.take_at_least(8, 5, None);
        assert_eq!((last.items, last.closed), (vec![5], true));
    }

    #[test]
    fn nudge_ends_one_wait_with_nothing_taken() {
        let mailbox = crate::sync::Arc::new(Mailbox::<u8>::new());
        let consumer = {
            let mailbox = mailbox.clone();
            std::thread::spawn(move || mailbox.take(8, None))
        };
        mailbox.nudge();
        let taken = consumer.join().unwrap();
        assert!(taken.items.is_empty() && !taken.closed);
        // The nudge is spent: the next take waits for its timeout again.
        let started = Instant::now();
        let again = mailbox.take(8, Some(Duration::from_millis(20)));
        assert!(again.items.is_empty());
        assert!(started.elapsed() >= Duration::from_millis(20));
    }
}
