//! Revisions `(main, sub)` and their 16-byte big-endian key encoding.
//!
//! Owns: the ordering and encoding of revisions.
//!
//! Invariants:
//! - REV-1: the encoding is order-preserving: `a < b` iff `a.to_key() < b.to_key()` bytewise,
//!   for revisions with non-negative fields (the only ones stored).
//! - REV-2: `from_key(to_key(r)) == r`; `from_key` is total on 16 bytes.
//!
//! Contact points: `storage` keys the history table with [`Revision::to_key`].

use crate::storage::RevisionKey;

/// One change in the store: `main` is the write request, `sub` the change's index in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision {
    /// The write request's revision: one per request that changes something.
    pub main: i64,
    /// The index of the change inside its request.
    pub sub: i64,
}

impl Revision {
    /// Returns the revision `(main, sub)`.
    ///
    /// ```
    /// let r = kvd::Revision::new(2, 0);
    /// assert!(r < kvd::Revision::new(2, 1));
    /// ```
    pub const fn new(main: i64, sub: i64) -> Revision {
        Revision { main, sub }
    }

    /// Returns the 16-byte key: big-endian `main` then big-endian `sub` (REV-1).
    pub fn to_key(self) -> RevisionKey {
        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&self.main.to_be_bytes());
        key[8..].copy_from_slice(&self.sub.to_be_bytes());
        key
    }

    /// Returns the revision encoded in `key` (REV-2).
    pub fn from_key(key: &RevisionKey) -> Revision {
        let mut main = [0u8; 8];
        let mut sub = [0u8; 8];
        main.copy_from_slice(&key[..8]);
        sub.copy_from_slice(&key[8..]);
        Revision {
            main: i64::from_be_bytes(main),
            sub: i64::from_be_bytes(sub),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revision_key_order_matches_revision_order() {
        let revs = [
            (0, 0),
            (1, 0),
            (1, 1),
            (1, 255),
            (1, 256),
            (2, 0),
            (255, 3),
            (256, 0),
        ];
        for pair in revs.windows(2) {
            let a = Revision::new(pair[0].0, pair[0].1);
            let b = Revision::new(pair[1].0, pair[1].1);
            assert!(a < b);
            assert!(a.to_key() < b.to_key(), "REV-1 broken for {a:?} < {b:?}");
            assert_eq!(Revision::from_key(&a.to_key()), a);
        }
    }
}
