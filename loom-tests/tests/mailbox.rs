//! loom models of the mailbox that carries proposals to the apply thread and applied
//! batches to the commit thread (MAIL-1, MAIL-2): compiled from the real
//! `src/engine/mailbox.rs`. A lost wake-up would leave the consumer asleep forever, which
//! loom reports as a deadlock.

use kvd_loom_tests::mailbox::Mailbox;
use kvd_loom_tests::sync::Arc;

/// One producer thread per list, each pushing its items in order.
fn spawn_producers(
    mailbox: &Arc<Mailbox<i32>>,
    lists: Vec<Vec<i32>>,
) -> Vec<loom::thread::JoinHandle<()>> {
    lists
        .into_iter()
        .map(|items| {
            let mailbox = mailbox.clone();
            loom::thread::spawn(move || {
                for item in items {
                    mailbox.push(item).unwrap();
                }
            })
        })
        .collect()
}

/// Two producers, one consumer that sleeps whenever the mailbox is empty: every item
/// arrives exactly once, each producer's items in push order.
#[test]
fn consumer_gets_every_item_once_in_order_without_a_lost_wake_up() {
    loom::model(|| {
        let mailbox = Arc::new(Mailbox::new());
        let producers = spawn_producers(&mailbox, vec![vec![1, 2], vec![10, 11]]);
        let mut got = Vec::new();
        while got.len() < 4 {
            got.extend(mailbox.take(8, None).items);
        }
        for p in producers {
            p.join().unwrap();
        }
        let mine = |low: i32| {
            got.iter()
                .copied()
                .filter(|i| (low..low + 9).contains(i))
                .collect::<Vec<_>>()
        };
        assert_eq!(mine(1), vec![1, 2], "{got:?}");
        assert_eq!(mine(10), vec![10, 11], "{got:?}");
    });
}

/// Close after a push: the consumer sees the item, then `closed`, and never sleeps
/// forever.
#[test]
fn close_wakes_the_consumer_after_what_was_queued() {
    loom::model(|| {
        let mailbox = Arc::new(Mailbox::new());
        let producer = {
            let mailbox = mailbox.clone();
            loom::thread::spawn(move || {
                mailbox.push(7).unwrap();
                mailbox.close();
                assert_eq!(mailbox.push(8), Err(8), "closed refuses");
            })
        };
        let mut got = Vec::new();
        loop {
            let taken = mailbox.take(1, None);
            got.extend(taken.items);
            if taken.closed {
                break;
            }
        }
        producer.join().unwrap();
        assert_eq!(got, vec![7]);
    });
}

/// A consumer that waits for three items (`take_at_least`, MAIL-4) while two producers push
/// them, one and two: it is woken by the push that brings the third, never left asleep,
/// and then takes all three.
#[test]
fn a_consumer_waiting_for_several_items_is_woken_by_the_last_of_them() {
    loom::model(|| {
        let mailbox = Arc::new(Mailbox::new());
        let producers = spawn_producers(&mailbox, vec![vec![1], vec![10, 11]]);
        let mut got = mailbox.take_at_least(8, 3, None).items;
        got.sort_unstable();
        assert_eq!(got, vec![1, 10, 11]);
        for p in producers {
            p.join().unwrap();
        }
    });
}
