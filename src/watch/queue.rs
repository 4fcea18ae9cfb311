//! The hand-off of one watch stream: the thread that finishes a batch (normally the commit
//! thread), the watch sync thread and the stream's own requests push responses; the
//! stream's one consumer takes them, either blocking a thread (library users) or as a
//! future polled by an asynchronous runtime (the server), so a stream costs no thread of
//! its own.
//!
//! Owns: the queued items, the consumer's waker, and the count of blocked consumers.
//!
//! Invariants:
//! - WATCHQ-1: every pushed item is taken exactly once, in push order.
//! - WATCHQ-2: a consumer that found the queue empty is woken by the next push. Its waker is
//!   stored under the lock that a push takes to append, so no push falls between the
//!   consumer's look at the queue and its registration (`loom-tests/tests/watch_queue.rs`).
//! - WATCHQ-3: a push never waits for the consumer: it holds the lock only to append and
//!   take the waker, and wakes after releasing it.
//!
//! The queue itself is unbounded; what bounds it is the watch hub's per-watcher count of
//! undelivered responses (WATCH-3).
//!
//! Contact points: `watch::WatchStream` (the only user).

use std::collections::VecDeque;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::sync::{self, Condvar, Mutex};

/// A queue with one consumer that can wait on it blocking or asynchronously.
#[derive(Debug)]
pub struct DeliveryQueue<T> {
    state: Mutex<QueueState<T>>,
    ready: Condvar,
}

#[derive(Debug)]
struct QueueState<T> {
    items: VecDeque<T>,
    /// The asynchronous consumer waiting for the next push, if any (WATCHQ-2).
    waker: Option<Waker>,
    /// Threads blocked in [`DeliveryQueue::pop_timeout`].
    blocked: usize,
}

impl<T> Default for DeliveryQueue<T> {
    fn default() -> Self {
        DeliveryQueue {
            state: Mutex::new(QueueState {
                items: VecDeque::new(),
                waker: None,
                blocked: 0,
            }),
            ready: Condvar::new(),
        }
    }
}

impl<T> DeliveryQueue<T> {
    /// Appends `item` and wakes the consumer if it waits (WATCHQ-2, WATCHQ-3).
    pub fn push(&self, item: T) {
        if let Some(waker) = self.push_waking_later(item) {
            waker.wake();
        }
    }

    /// Appends `item`, wakes a blocked consumer thread, and returns the asynchronous
    /// consumer's waker, if it waits, for the caller to wake once it has done what must come
    /// first (the commit thread answers the batch's writers before it wakes watch streams).
    /// The caller must wake it (WATCHQ-2).
    #[must_use]
    pub fn push_waking_later(&self, item: T) -> Option<Waker> {
        let (waker, blocked) = {
            let mut state = sync::lock(&self.state);
            state.items.push_back(item);
            (state.waker.take(), state.blocked > 0)
        };
        if blocked {
            self.ready.notify_one();
        }
        waker
    }

    /// Takes the oldest item, if any.
    pub fn pop(&self) -> Option<T> {
        sync::lock(&self.state).items.pop_front()
    }

    /// Takes the oldest item, waiting at most `timeout` for one.
    pub fn pop_timeout(&self, timeout: Duration) -> Option<T> {
        let deadline = Instant::now() + timeout;
        let mut state = sync::lock(&self.state);
        loop {
            if let Some(item) = state.items.pop_front() {
                return Some(item);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            state.blocked += 1;
            state = sync::wait_timeout(&self.ready, state, left);
            state.blocked -= 1;
        }
    }

    /// Takes the oldest item, or registers `cx`'s waker to be woken by the next push
    /// (WATCHQ-2). Only the latest waker is kept: one consumer at a time.
    pub fn poll_pop(&self, cx: &mut Context<'_>) -> Poll<T> {
        let mut state = sync::lock(&self.state);
        if let Some(item) = state.items.pop_front() {
            return Poll::Ready(item);
        }
        match &mut state.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Returns the number of queued items.
    pub fn len(&self) -> usize {
        sync::lock(&self.state).items.len()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::{Arc, AtomicUsize, Ordering};
    use std::task::Wake;

    struct CountWakes(AtomicUsize);

    impl Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn items_come_out_once_in_push_order() {
        let queue = DeliveryQueue::default();
        for i in 0..5 {
            queue.push(i);
        }
        assert_eq!(queue.len(), 5);
        let taken: Vec<i32> = std::iter::from_fn(|| queue.pop()).collect();
        assert_eq!(taken, vec![0, 1, 2, 3, 4]);
        assert_eq!(queue.pop_timeout(Duration::from_millis(1)), None);
    }

    #[test]
    fn a_registered_waker_is_woken_once_by_the_next_push() {
        let queue = DeliveryQueue::default();
        let wakes = Arc::new(CountWakes(AtomicUsize::new(0)));
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(queue.poll_pop(&mut cx).is_pending());
        assert!(
            queue.poll_pop(&mut cx).is_pending(),
            "polling again keeps one waker"
        );
        queue.push(7);
        queue.push(8);
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            1,
            "only the first push finds the waker"
        );
        assert_eq!(queue.poll_pop(&mut cx), Poll::Ready(7));
        assert_eq!(queue.poll_pop(&mut cx), Poll::Ready(8));
    }

    #[test]
    fn a_blocked_consumer_is_woken_by_a_push_from_another_thread() {
        let queue = Arc::new(DeliveryQueue::default());
        let pusher = {
            let queue = queue.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                queue.push("late");
            })
        };
        assert_eq!(queue.pop_timeout(Duration::from_secs(30)), Some("late"));
        pusher.join().expect("pusher");
    }
}
