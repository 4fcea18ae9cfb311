//! The in-memory index of every key: key → [`KeyIndex`], plus the compaction revision
//! (etcd's treeIndex).
//!
//! Invariants:
//! - IDX-1: `compact_revision` and the key indexes change together under the index's lock,
//!   so a reader that checked its revision against `compact_revision` finds every revision it
//!   needs in the index.
//! - IDX-2: no [`KeyIndex`] in the map is empty (a compaction that empties one removes it).
//! - IDX-3: the index may hold revisions above the published current revision (a batch
//!   being applied); readers only ask for revisions at or below the published one, so they
//!   never see them.
//! - IDX-4: the map orders keys bytewise, as etcd does. Each key carries its first eight
//!   bytes as a big-endian number (zero-padded) beside its heap bytes: two keys whose heads
//!   differ order as their heads do, and equal heads fall back to the whole keys, so most
//!   comparisons of a search read no heap memory. (The key-index search was the largest
//!   single cost of a Put; this made it about twice as fast for keys whose first bytes
//!   differ. Keys sharing their first eight bytes tie on their heads and compare as they
//!   did before: no faster, no slower.)
//!
//! Contact points: the engine's readers take it under a read lock; the apply thread under
//! a write lock, one request at a time.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::ops::Bound;

use super::Revision;
use super::key_index::{Found, KeyIndex};

/// The bounds of a [`KeyRange`] in the index's map.
type KeyBounds<'a> = (Bound<&'a [u8]>, Bound<&'a [u8]>);

/// A key range as etcd expresses it: `end` empty = the single key, `end == "\0"` = every key
/// from `key` on, otherwise `[key, end)`.
#[derive(Debug, Clone, Copy)]
pub struct KeyRange<'a> {
    /// The first key.
    pub key: &'a [u8],
    /// The range end.
    pub end: &'a [u8],
}

impl<'a> KeyRange<'a> {
    /// Returns the range of `key` and `end` in etcd's conventions.
    pub fn new(key: &'a [u8], end: &'a [u8]) -> KeyRange<'a> {
        KeyRange { key, end }
    }

    fn bounds(&self) -> Option<KeyBounds<'a>> {
        if self.end.is_empty() {
            return Some((Bound::Included(self.key), Bound::Included(self.key)));
        }
        if self.end == b"\0" {
            return Some((Bound::Included(self.key), Bound::Unbounded));
        }
        if self.key >= self.end {
            return None;
        }
        Some((Bound::Included(self.key), Bound::Excluded(self.end)))
    }

    /// Returns true if `key` lies in the range.
    pub fn contains(&self, key: &[u8]) -> bool {
        match self.bounds() {
            None => false,
            Some((_, Bound::Included(end))) => key == end && key == self.key,
            Some((_, Bound::Unbounded)) => key >= self.key,
            Some((_, Bound::Excluded(end))) => key >= self.key && key < end,
        }
    }
}

/// Whether [`Index::probe`] found the key in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probed {
    /// The index has an entry for the key (alive or not).
    Present,
    /// It has none.
    Absent,
}

/// A key as the map compares it (IDX-4): the stored keys and the keys a search is given.
trait Ordered {
    /// The first eight bytes, big-endian, zero-padded.
    fn head(&self) -> u64;
    /// The whole key.
    fn bytes(&self) -> &[u8];
}

/// Returns the head of `key` (IDX-4).
fn head_of(key: &[u8]) -> u64 {
    let mut head = [0u8; 8];
    let n = key.len().min(head.len());
    head[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(head)
}

/// Compares two keys by head, then by their bytes (IDX-4).
fn compare(a: &(impl Ordered + ?Sized), b: &(impl Ordered + ?Sized)) -> Ordering {
    a.head()
        .cmp(&b.head())
        .then_with(|| a.bytes().cmp(b.bytes()))
}

/// A key held by the map.
#[derive(Debug, Clone)]
struct StoredKey {
    head: u64,
    bytes: Box<[u8]>,
}

impl StoredKey {
    fn new(key: &[u8]) -> StoredKey {
        StoredKey {
            head: head_of(key),
            bytes: key.into(),
        }
    }
}

/// A key a search is given, borrowed.
#[derive(Debug, Clone, Copy)]
struct KeyRef<'a> {
    head: u64,
    bytes: &'a [u8],
}

impl KeyRef<'_> {
    fn new(key: &[u8]) -> KeyRef<'_> {
        KeyRef {
            head: head_of(key),
            bytes: key,
        }
    }
}

impl Ordered for StoredKey {
    fn head(&self) -> u64 {
        self.head
    }
    fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl Ordered for KeyRef<'_> {
    fn head(&self) -> u64 {
        self.head
    }
    fn bytes(&self) -> &[u8] {
        self.bytes
    }
}

impl<'a> Borrow<dyn Ordered + 'a> for StoredKey {
    fn borrow(&self) -> &(dyn Ordered + 'a) {
        self
    }
}

impl PartialEq for dyn Ordered + '_ {
    fn eq(&self, other: &Self) -> bool {
        compare(self, other).is_eq()
    }
}

impl Eq for dyn Ordered + '_ {}

impl PartialOrd for dyn Ordered + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for dyn Ordered + '_ {
    fn cmp(&self, other: &Self) -> Ordering {
        compare(self, other)
    }
}

impl PartialEq for StoredKey {
    fn eq(&self, other: &Self) -> bool {
        compare(self, other).is_eq()
    }
}

impl Eq for StoredKey {}

impl PartialOrd for StoredKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for StoredKey {
    fn cmp(&self, other: &Self) -> Ordering {
        compare(self, other)
    }
}

/// The index of every key.
#[derive(Debug, Default)]
pub struct Index {
    keys: BTreeMap<StoredKey, KeyIndex>,
    /// The compaction revision: reads below it fail. -1 until the first compaction.
    pub compact_revision: i64,
}

/// One key found by a range lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    /// The revision holding the key's value at the asked revision.
    pub revision: Revision,
    /// The generation's create revision.
    pub created: i64,
    /// The version at that revision.
    pub version: i64,
}

impl Index {
    /// Returns an empty index that was never compacted.
    pub fn new() -> Index {
        Index {
            keys: BTreeMap::new(),
            compact_revision: -1,
        }
    }

    /// Returns the entry of `key`, if it has one.
    fn entry(&self, key: &[u8]) -> Option<&KeyIndex> {
        self.keys.get(&KeyRef::new(key) as &dyn Ordered)
    }

    /// Returns the entry of `key` to change, if it has one.
    fn entry_mut(&mut self, key: &[u8]) -> Option<&mut KeyIndex> {
        self.keys.get_mut(&KeyRef::new(key) as &dyn Ordered)
    }

    /// Returns the entries within `bounds`, in key order.
    fn in_range(
        &self,
        (start, end): KeyBounds<'_>,
    ) -> std::collections::btree_map::Range<'_, StoredKey, KeyIndex> {
        let (start, end) = (start.map(KeyRef::new), end.map(KeyRef::new));
        self.keys.range::<dyn Ordered, _>((
            start.as_ref().map(|key| key as &dyn Ordered),
            end.as_ref().map(|key| key as &dyn Ordered),
        ))
    }

    /// Returns the number of keys with any recorded history.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Returns the keys alive at main revision `at` in `range`, in key order.
    pub fn range(&self, range: KeyRange<'_>, at: i64) -> Vec<Hit> {
        let Some(bounds) = range.bounds() else {
            return Vec::new();
        };
        self.in_range(bounds)
            .filter_map(|(_, ki)| ki.get(at))
            .map(|f: Found| Hit {
                revision: f.modified,
                created: f.created,
                version: f.version,
            })
            .collect()
    }

    /// Returns the keys alive at main revision `at` in `range` with their key bytes.
    pub fn range_keys(&self, range: KeyRange<'_>, at: i64) -> Vec<(Box<[u8]>, Hit)> {
        let Some(bounds) = range.bounds() else {
            return Vec::new();
        };
        self.in_range(bounds)
            .filter_map(|(k, ki)| {
                ki.get(at).map(|f| {
                    let hit = Hit {
                        revision: f.modified,
                        created: f.created,
                        version: f.version,
                    };
                    (k.bytes.clone(), hit)
                })
            })
            .collect()
    }

    /// Returns the key's state at `at`.
    pub fn get(&self, key: &[u8], at: i64) -> Option<Hit> {
        self.probe(key, at).0
    }

    /// Returns the key's state at `at`, and whether the index holds the key at all (alive
    /// or not), which [`Index::put_probed`] takes to spare itself a search.
    pub fn probe(&self, key: &[u8], at: i64) -> (Option<Hit>, Probed) {
        match self.entry(key) {
            None => (None, Probed::Absent),
            Some(ki) => {
                let hit = ki.get(at).map(|found| Hit {
                    revision: found.modified,
                    created: found.created,
                    version: found.version,
                });
                (hit, Probed::Present)
            }
        }
    }

    /// Records a Put of `key` at `rev`, where `probed` is what [`Index::probe`] said of the
    /// key with nothing changed in the index since: a key it found absent is inserted with
    /// one search instead of two.
    pub fn put_probed(&mut self, key: &[u8], rev: Revision, cost: u32, probed: Probed) {
        if probed == Probed::Present {
            return self.put(key, rev, cost);
        }
        debug_assert!(self.entry(key).is_none(), "probed absent, but present");
        self.insert_put(key, rev, cost);
    }

    /// Records a Put of `key` at `rev`.
    pub fn put(&mut self, key: &[u8], rev: Revision, cost: u32) {
        match self.entry_mut(key) {
            Some(ki) => ki.put(rev, cost),
            None => self.insert_put(key, rev, cost),
        }
    }

    /// Inserts `key`, absent from the index, with its first Put at `rev`.
    fn insert_put(&mut self, key: &[u8], rev: Revision, cost: u32) {
        let mut ki = KeyIndex::new();
        ki.put(rev, cost);
        self.keys.insert(StoredKey::new(key), ki);
    }

    /// Records a delete of `key` at `rev`. Returns false if the key was not alive.
    pub fn tombstone(&mut self, key: &[u8], rev: Revision) -> bool {
        self.entry_mut(key).is_some_and(|ki| ki.tombstone(rev))
    }

    /// Records a history record met while rebuilding the index on open.
    pub fn restore(
        &mut self,
        key: &[u8],
        rev: Revision,
        tombstone: bool,
        created: i64,
        version: i64,
        cost: u32,
    ) {
        match (self.entry_mut(key), tombstone) {
            (Some(ki), false) => ki.put(rev, cost),
            (Some(ki), true) => {
                // A tombstone of a key whose generation was compacted away except for the
                // tombstone itself cannot follow another record; a plain one closes the
                // generation.
                if !ki.tombstone(rev) {
                    ki.restore_tombstone(rev);
                }
            }
            (None, false) => {
                let mut ki = KeyIndex::new();
                ki.restore(rev, created, version, cost);
                self.keys.insert(StoredKey::new(key), ki);
            }
            (None, true) => {
                let mut ki = KeyIndex::new();
                ki.restore_tombstone(rev);
                self.keys.insert(StoredKey::new(key), ki);
            }
        }
    }

    /// Returns true if `rev` of `key` is recorded (kept by every compaction so far).
    pub fn contains(&self, key: &[u8], rev: Revision) -> bool {
        self.entry(key).is_some_and(|ki| ki.contains(rev))
    }

    /// Compacts every key at `at` and records `at` as the compaction revision (IDX-1,
    /// IDX-2). Returns, for each key that lost revisions with a cost, the cost released.
    pub fn compact(&mut self, at: i64) -> Vec<(Box<[u8]>, u64)> {
        debug_assert!(at > self.compact_revision);
        self.compact_revision = at;
        let mut released = Vec::new();
        self.keys.retain(|key, ki| {
            let cost = ki.compact(at);
            if cost > 0 {
                released.push((key.bytes.clone(), cost));
            }
            !ki.is_empty()
        });
        released
    }

    /// Calls `visit` with each key in `range` that has history, its retained cost and
    /// whether it is alive now.
    pub fn visit_range(&self, range: KeyRange<'_>, mut visit: impl FnMut(&[u8], u64, bool)) {
        let Some(bounds) = range.bounds() else {
            return;
        };
        for (key, ki) in self.in_range(bounds) {
            visit(&key.bytes, ki.retained_cost(), ki.is_alive());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_range_follows_etcd_conventions() {
        let single = KeyRange::new(b"b", b"");
        assert!(single.contains(b"b") && !single.contains(b"ba"));
        let from = KeyRange::new(b"b", b"\0");
        assert!(from.contains(b"b") && from.contains(b"zzz") && !from.contains(b"a"));
        let half_open = KeyRange::new(b"b", b"d");
        assert!(half_open.contains(b"c") && !half_open.contains(b"d"));
        let empty = KeyRange::new(b"d", b"b");
        assert!(!empty.contains(b"c") && !empty.contains(b"d"));
    }

    #[test]
    fn index_range_skips_deleted_keys_and_respects_revision() {
        let mut index = Index::new();
        index.put(b"a", Revision::new(2, 0), 1);
        index.put(b"b", Revision::new(3, 0), 1);
        assert!(index.tombstone(b"a", Revision::new(4, 0)));
        let at3: Vec<_> = index
            .range(KeyRange::new(b"a", b"\0"), 3)
            .iter()
            .map(|h| h.revision.main)
            .collect();
        assert_eq!(at3, vec![2, 3]);
        let at4: Vec<_> = index
            .range(KeyRange::new(b"a", b"\0"), 4)
            .iter()
            .map(|h| h.revision.main)
            .collect();
        assert_eq!(at4, vec![3]);
        index.compact(4);
        assert_eq!(
            index.len(),
            2,
            "the tombstone at the compaction revision is kept"
        );
        index.compact(5);
        assert_eq!(index.len(), 1, "a later compaction drops it");
    }

    /// IDX-4: the map's order is the bytes' order, whatever the keys' lengths and zero
    /// bytes, and a range finds exactly the keys a bytewise filter finds.
    #[test]
    fn the_map_orders_keys_as_their_bytes() {
        let mut keys: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"\0".to_vec(),
            b"\0\0".to_vec(),
            b"a".to_vec(),
            b"a\0".to_vec(),
            b"a\0\0\0\0\0\0\0".to_vec(),
            b"a\0\0\0\0\0\0\0\0".to_vec(),
            b"a\0\0\0\0\0\0\0\x01".to_vec(),
            b"a\x01".to_vec(),
            b"abcdefgh".to_vec(),
            b"abcdefgh\0".to_vec(),
            b"abcdefgha".to_vec(),
            b"abcdefgi".to_vec(),
            vec![0xff; 8],
            vec![0xff; 9],
        ];
        // A fixed pseudo-random sequence adds keys of 0..12 bytes drawn from a few values.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..300 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = (state % 12) as usize;
            let key = (0..len)
                .map(|i| [0u8, 1, 0x7f, 0x80, 0xff][((state >> (5 + 3 * i)) % 5) as usize])
                .collect();
            keys.push(key);
        }
        let mut index = Index::new();
        for (i, key) in keys.iter().enumerate() {
            index.put(key, Revision::new(i as i64 + 2, 0), 1);
        }
        let mut sorted = keys.clone();
        sorted.sort();
        sorted.dedup();
        let everything = index.range_keys(KeyRange::new(b"", b"\0"), NEWEST_FOR_TESTS);
        let found: Vec<Vec<u8>> = everything.iter().map(|(k, _)| k.to_vec()).collect();
        assert_eq!(found, sorted);
        for start in sorted.iter().step_by(3) {
            for end in sorted.iter().step_by(3) {
                let range = KeyRange::new(start, end);
                let expected: Vec<&Vec<u8>> = sorted.iter().filter(|k| range.contains(k)).collect();
                let got = index.range_keys(range, NEWEST_FOR_TESTS);
                let got: Vec<&[u8]> = got.iter().map(|(k, _)| &k[..]).collect();
                assert_eq!(got.len(), expected.len(), "{start:?}..{end:?}");
                assert!(got.iter().zip(&expected).all(|(g, e)| *g == e.as_slice()));
            }
        }
        for key in &sorted {
            assert!(index.probe(key, NEWEST_FOR_TESTS).0.is_some());
        }
    }

    const NEWEST_FOR_TESTS: i64 = i64::MAX;
}
