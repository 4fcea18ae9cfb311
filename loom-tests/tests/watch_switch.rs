//! loom model of the watch catch-up/live switch (`src/watch/mod.rs`, WATCH-1, WATCH-2): the
//! apply thread publishes a revision and delivers it to synced watchers in one critical
//! section of the hub lock; the sync thread, under the same lock, either joins the synced
//! set (when its next revision is above the published one) or reads history up to the
//! published revision. Every revision must reach the watcher exactly once, in order.
//!
//! This is a model of the protocol, written with kvd's `sync` module: the real `Hub` also
//! needs channels, the storage snapshot and the index, which loom cannot run.

use kvd_loom_tests::sync::{Arc, AtomicI64, Mutex, Ordering};

#[derive(Default)]
struct HubModel {
    published: i64,
    synced: bool,
    next_rev: i64,
    delivered: Vec<i64>,
}

/// One catch-up step; returns true once the watcher is synced.
fn catch_up(hub: &Mutex<HubModel>, committed: &AtomicI64) -> bool {
    let (from, to) = {
        let mut h = hub.lock().unwrap();
        if h.synced {
            // Synced watchers are not in the unsynced set: the sync thread never sees them.
            return true;
        }
        if h.next_rev > h.published {
            h.synced = true;
            return true;
        }
        (h.next_rev, h.published)
    };
    // Reading history: every revision up to the published one is committed.
    assert!(
        committed.load(Ordering::Acquire) >= to,
        "history read beyond the commit"
    );
    let mut h = hub.lock().unwrap();
    h.delivered.extend(from..=to);
    h.next_rev = to + 1;
    false
}

#[test]
fn every_revision_reaches_a_catching_up_watcher_exactly_once() {
    loom::model(|| {
        // Revision 1 is history; the watcher starts there, unsynced.
        let hub = Arc::new(Mutex::new(HubModel {
            published: 1,
            next_rev: 1,
            ..HubModel::default()
        }));
        let committed = Arc::new(AtomicI64::new(1));
        let apply = {
            let (hub, committed) = (hub.clone(), committed.clone());
            loom::thread::spawn(move || {
                for revision in 2..=3 {
                    committed.store(revision, Ordering::Release);
                    let mut h = hub.lock().unwrap();
                    h.published = revision;
                    if h.synced {
                        h.delivered.push(revision);
                        h.next_rev = revision + 1;
                    }
                }
            })
        };
        // Bounded: each step either joins or advances next_rev past the published revision.
        for _ in 0..3 {
            if catch_up(&hub, &committed) {
                break;
            }
        }
        apply.join().unwrap();
        while !catch_up(&hub, &committed) {}
        let h = hub.lock().unwrap();
        assert_eq!(
            h.delivered,
            vec![1, 2, 3],
            "lost or duplicated across the switch: {:?}",
            h.delivered
        );
    });
}
