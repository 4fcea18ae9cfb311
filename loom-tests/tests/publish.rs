//! loom models of how committed revisions are published to readers (ENG-1, ENG-2, PUB-1,
//! PUB-2), with the real `engine/publish.rs`.

use kvd_loom_tests::publish::Published;
use kvd_loom_tests::sync::{Arc, AtomicI64, Ordering};

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
