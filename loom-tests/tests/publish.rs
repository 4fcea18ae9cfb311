//! loom models of how the apply thread publishes committed revisions to readers
//! (ENG-1, ENG-2, PUB-1, PUB-2) and of how a reader's snapshot is protected from
//! compaction by the index lock (ENG-3).

use kvd_loom_tests::publish::Published;
use kvd_loom_tests::sync::{Arc, AtomicI64, Ordering, RwLock};

/// Storage's commit is modelled as a relaxed store: the only ordering a reader may rely on
/// is the one `Published` gives (PUB-2). A reader that loads revision `r` must find every
/// commit up to `r`, and never a published revision going backwards.
#[test]
fn reader_never_sees_a_revision_before_its_commit() {
    loom::model(|| {
        let committed = Arc::new(AtomicI64::new(1));
        let published = Arc::new(Published::new(1));
        let apply = {
            let (committed, published) = (committed.clone(), published.clone());
            loom::thread::spawn(move || {
                for revision in 2..=3 {
                    committed.store(revision, Ordering::Relaxed);
                    published.publish(revision);
                }
            })
        };
        let mut seen = 1;
        for _ in 0..2 {
            let revision = published.load();
            assert!(revision >= seen, "published revision went backwards");
            assert!(
                committed.load(Ordering::Relaxed) >= revision,
                "revision visible before its commit"
            );
            seen = revision;
        }
        apply.join().unwrap();
        assert_eq!(published.load(), 3);
    });
}

/// The model of ENG-3: the reader looks a revision up in the index and opens its storage
/// snapshot under the index read lock; compaction removes the revision from the index under
/// the write lock and only then deletes the record. A reader that found the revision in the
/// index always finds the record in its snapshot.
#[test]
fn snapshot_opened_under_index_lock_survives_compaction() {
    loom::model(|| {
        // Index: does it still list revision 2? Storage: version counter; the record is
        // present in every storage version below `deleted_at`.
        let index = Arc::new(RwLock::new(true));
        let storage_version = Arc::new(AtomicI64::new(0));
        let deleted_at = Arc::new(AtomicI64::new(i64::MAX));
        let compactor = {
            let (index, storage_version, deleted_at) =
                (index.clone(), storage_version.clone(), deleted_at.clone());
            loom::thread::spawn(move || {
                *index.write().unwrap() = false;
                let next = storage_version.fetch_add(1, Ordering::AcqRel) + 1;
                deleted_at.store(next, Ordering::Release);
            })
        };
        let (listed, snapshot) = {
            let guard = index.read().unwrap();
            (*guard, storage_version.load(Ordering::Acquire))
        };
        if listed {
            assert!(
                snapshot < deleted_at.load(Ordering::Acquire),
                "record deleted under a reader's snapshot"
            );
        }
        compactor.join().unwrap();
    });
}
