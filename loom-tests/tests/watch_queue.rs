//! loom models of a watch stream's hand-off (WATCHQ-1, WATCHQ-2): compiled from the real
//! `src/watch/queue.rs`. The apply thread and the sync thread push; the consumer is an
//! asynchronous task that registers its waker whenever the queue is empty. A lost wake-up
//! would leave that task parked forever, which loom reports as a deadlock.

use std::future::poll_fn;

use kvd_loom_tests::sync::Arc;
use kvd_loom_tests::watch_queue::DeliveryQueue;

/// Two pushers (the apply and the sync thread) racing an asynchronous consumer: every item
/// arrives exactly once, and the consumer is never left waiting on a pushed item.
#[test]
fn async_consumer_gets_every_item_once_without_a_lost_wake_up() {
    loom::model(|| {
        let queue = Arc::new(DeliveryQueue::default());
        let pushers: Vec<_> = [1, 10]
            .into_iter()
            .map(|item| {
                let queue = queue.clone();
                loom::thread::spawn(move || queue.push(item))
            })
            .collect();
        let mut got = loom::future::block_on(async {
            let mut got = Vec::new();
            while got.len() < 2 {
                got.push(poll_fn(|cx| queue.poll_pop(cx)).await);
            }
            got
        });
        for pusher in pushers {
            pusher.join().unwrap();
        }
        got.sort_unstable();
        assert_eq!(got, vec![1, 10]);
        assert_eq!(queue.len(), 0);
    });
}

/// One pusher of several items and an asynchronous consumer: the items arrive in push order
/// (WATCHQ-1), whichever of the consumer's polls each push falls between.
#[test]
fn async_consumer_gets_one_pushers_items_in_order() {
    loom::model(|| {
        let queue = Arc::new(DeliveryQueue::default());
        let pusher = {
            let queue = queue.clone();
            loom::thread::spawn(move || {
                for item in [1, 2, 3] {
                    queue.push(item);
                }
            })
        };
        let got = loom::future::block_on(async {
            let mut got = Vec::new();
            while got.len() < 3 {
                got.push(poll_fn(|cx| queue.poll_pop(cx)).await);
            }
            got
        });
        pusher.join().unwrap();
        assert_eq!(got, vec![1, 2, 3]);
    });
}

/// A consumer that switches from blocking to asynchronous receives (the library and the
/// server use the same stream type) still sees every item once.
#[test]
fn blocking_and_async_receives_share_one_order() {
    loom::model(|| {
        let queue = Arc::new(DeliveryQueue::default());
        let pusher = {
            let queue = queue.clone();
            loom::thread::spawn(move || {
                queue.push(1);
                queue.push(2);
            })
        };
        let mut got = Vec::new();
        while got.is_empty() {
            got.extend(queue.pop());
            loom::thread::yield_now();
        }
        let second = loom::future::block_on(poll_fn(|cx| queue.poll_pop(cx)));
        got.push(second);
        pusher.join().unwrap();
        assert_eq!(got, vec![1, 2]);
    });
}
