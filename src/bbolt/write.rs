//! Writes etcd's snapshot file (a bbolt database, see the parent module) from one read
//! snapshot of kvd, streamed in caller-sized chunks.
//!
//! Layout of the file it writes (page ids grow in this order):
//! - pages 0 and 1: the metas (txids 2 and 1, the same root and high-water mark);
//! - the leaves of the `key` bucket, in revision order, each one page unless a single entry
//!   needs more (then one leaf with `overflow`), then the branch levels above them, bottom up;
//! - the pages of any other bucket too large to be inline (built in memory: leases, alarms
//!   and the member records are small tables kvd already holds whole in memory);
//! - the root page: one leaf of bucket headers, sorted by name, small buckets inline.
//!
//! The metas come first but name the root and the high-water mark, so the writer makes a
//! sizing pass over the history before it writes a byte: it packs the leaves (counts and
//! sizes only) and keeps each leaf's entry count and first key, about 30 bytes per 4 KiB
//! page. The writing pass then reads the same snapshot again, one leaf at a time.
//!
//! Invariants:
//! - BWRITE-1: the file is exactly `high_water × PAGE_BYTES` bytes, every page header id
//!   equals its position, and no page is unreferenced (so no freelist is needed).
//! - BWRITE-2: the writing pass sees exactly the entries the sizing pass planned (one read
//!   snapshot); if it does not, the stream fails with `Corrupted` rather than emit a file
//!   whose metas lie.
//! - BWRITE-3: memory between chunks is the leaf plan plus the small buckets' pages; one
//!   leaf (one page, or one entry's pages) is built at a time.
//!
//! Contact points: `engine::etcd_snapshot` feeds it a [`History`] and the small buckets.

use std::collections::VecDeque;

use super::{
    BUCKET_HEADER_BYTES, BUCKET_KEY, ELEMENT_BYTES, FLAG_BRANCH, FLAG_BUCKET, FLAG_LEAF, FLAG_META,
    INLINE_BUCKET_BYTES_MAX, MAGIC, NO_FREELIST, NODE_ELEMENTS_MAX, PAGE_BYTES, PAGE_HEADER_BYTES,
    VERSION, etcd_revision_key, fnv1a64,
};
use crate::error::StorageError;
use crate::mvcc::Revision;
use crate::mvcc::record::Record;
use crate::mvcc::wire::KeyValueFields;
use crate::storage::RevisionKey;

/// History records read per scan call of the sizing pass.
const SIZING_SCAN_BATCH: usize = 4096;

/// What a [`History`] scan calls for each record; false stops the scan.
pub type HistoryVisit<'v> = dyn FnMut(&RevisionKey, &[u8]) -> Result<bool, StorageError> + 'v;

/// A source of kvd's history records in revision order.
pub trait History {
    /// Calls `visit` for each record after `after` (from the start if None), in order, at
    /// most `limit` of them; `visit` returns false to stop early.
    fn scan(
        &self,
        after: Option<RevisionKey>,
        limit: usize,
        visit: &mut HistoryVisit<'_>,
    ) -> Result<(), StorageError>;
}

impl History for crate::storage::Snapshot {
    fn scan(
        &self,
        after: Option<RevisionKey>,
        limit: usize,
        visit: &mut HistoryVisit<'_>,
    ) -> Result<(), StorageError> {
        use std::ops::Bound;
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.scan_history((from, Bound::Unbounded), limit, |k, v| visit(k, v))?;
        Ok(())
    }
}

impl History for std::collections::BTreeMap<RevisionKey, Vec<u8>> {
    fn scan(
        &self,
        after: Option<RevisionKey>,
        limit: usize,
        visit: &mut HistoryVisit<'_>,
    ) -> Result<(), StorageError> {
        use std::ops::Bound;
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        for (k, v) in self.range((from, Bound::Unbounded)).take(limit) {
            if !visit(k, v)? {
                break;
            }
        }
        Ok(())
    }
}

/// One bucket entry: key and value bytes.
pub type Entry = (Vec<u8>, Vec<u8>);

/// Converts one kvd history record into etcd's `key` bucket entry; `scratch` is reused.
pub fn history_entry(key: &RevisionKey, record: &[u8]) -> Result<Entry, StorageError> {
    let revision = Revision::from_key(key);
    let head = Record::decode_head(key, record)?;
    let etcd_key = etcd_revision_key(revision.main, revision.sub, head.tombstone);
    let kv = if head.tombstone {
        // etcd stores a tombstone as a KeyValue holding only the key.
        KeyValueFields {
            key: head.key,
            create_revision: 0,
            mod_revision: 0,
            version: 0,
            value: &[],
            lease: 0,
        }
    } else {
        KeyValueFields {
            key: head.key,
            create_revision: head.create_revision,
            mod_revision: revision.main,
            version: head.version,
            value: head.value_in(record),
            lease: head.lease,
        }
    };
    let mut value = Vec::with_capacity(kv.key.len() + kv.value.len() + 40);
    kv.put_message(&mut value);
    Ok((etcd_key, value))
}

/// Bytes a leaf element takes in its node.
fn leaf_element_bytes(key_len: usize, value_len: usize) -> usize {
    ELEMENT_BYTES + key_len + value_len
}

/// Returns the pages a node of `bytes` takes.
fn pages_for(bytes: usize) -> u64 {
    bytes.div_ceil(PAGE_BYTES).max(1) as u64
}

/// One planned leaf of a paged bucket.
#[derive(Debug, Clone)]
struct LeafPlan {
    count: usize,
    pages: u64,
    first_key: Vec<u8>,
}

/// Packs entries into leaves: greedy, one page each, a lone entry larger than a page alone
/// on a leaf of several pages.
#[derive(Debug, Default)]
struct LeafPacker {
    leaves: Vec<LeafPlan>,
    open: Option<(LeafPlan, usize)>,
    total_bytes: usize,
}

impl LeafPacker {
    fn add(&mut self, key: &[u8], value_len: usize) {
        let element = leaf_element_bytes(key.len(), value_len);
        self.total_bytes += element;
        if let Some((plan, bytes)) = &mut self.open
            && *bytes + element <= PAGE_BYTES
            && plan.count < NODE_ELEMENTS_MAX
        {
            plan.count += 1;
            *bytes += element;
            plan.pages = pages_for(*bytes);
            return;
        }
        self.close();
        let bytes = PAGE_HEADER_BYTES + element;
        self.open = Some((
            LeafPlan {
                count: 1,
                pages: pages_for(bytes),
                first_key: key.to_vec(),
            },
            bytes,
        ));
    }

    fn close(&mut self) {
        if let Some((plan, _)) = self.open.take() {
            self.leaves.push(plan);
        }
    }

    fn finish(mut self) -> (Vec<LeafPlan>, usize) {
        self.close();
        (self.leaves, PAGE_HEADER_BYTES + self.total_bytes)
    }
}

/// Writes a page header.
fn put_header(out: &mut Vec<u8>, id: u64, flags: u16, count: usize, overflow: u64) {
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    // Counts are at most NODE_ELEMENTS_MAX and overflows at most a value's pages.
    out.extend_from_slice(&(count as u16).to_le_bytes());
    out.extend_from_slice(&(overflow as u32).to_le_bytes());
}

/// Returns a leaf node at page `id`, padded to whole pages unless `inline`.
fn leaf_node(id: u64, entries: &[(u32, &[u8], &[u8])], inline: bool) -> Vec<u8> {
    let data: usize = entries.iter().map(|(_, k, v)| k.len() + v.len()).sum();
    let bytes = PAGE_HEADER_BYTES + ELEMENT_BYTES * entries.len() + data;
    let pages = pages_for(bytes);
    let mut out = Vec::with_capacity(if inline {
        bytes
    } else {
        pages as usize * PAGE_BYTES
    });
    put_header(
        &mut out,
        id,
        FLAG_LEAF,
        entries.len(),
        if inline { 0 } else { pages - 1 },
    );
    let mut pos = ELEMENT_BYTES * entries.len();
    for (flags, k, v) in entries {
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&(pos as u32).to_le_bytes());
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        // The next element starts 16 bytes further on; its data starts after this one's.
        pos = pos - ELEMENT_BYTES + k.len() + v.len();
    }
    for (_, k, v) in entries {
        out.extend_from_slice(k);
        out.extend_from_slice(v);
    }
    if !inline {
        out.resize(pages as usize * PAGE_BYTES, 0);
    }
    out
}

/// Returns a branch node at page `id` over `children` (first key, pgid).
fn branch_node(id: u64, children: &[(Vec<u8>, u64)]) -> Vec<u8> {
    let data: usize = children.iter().map(|(k, _)| k.len()).sum();
    let bytes = PAGE_HEADER_BYTES + ELEMENT_BYTES * children.len() + data;
    let pages = pages_for(bytes);
    let mut out = Vec::with_capacity(pages as usize * PAGE_BYTES);
    put_header(&mut out, id, FLAG_BRANCH, children.len(), pages - 1);
    let mut pos = ELEMENT_BYTES * children.len();
    for (k, child) in children {
        out.extend_from_slice(&(pos as u32).to_le_bytes());
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&child.to_le_bytes());
        pos = pos - ELEMENT_BYTES + k.len();
    }
    for (k, _) in children {
        out.extend_from_slice(k);
    }
    out.resize(pages as usize * PAGE_BYTES, 0);
    out
}

/// Lays out the branch levels over `children` (first key, pgid, pages), allocating from
/// `*next`; returns the pages built and the root pgid.
fn branch_levels(mut children: Vec<(Vec<u8>, u64)>, next: &mut u64) -> (Vec<Vec<u8>>, u64) {
    let mut pages = Vec::new();
    while children.len() > 1 {
        let mut parents = Vec::new();
        let mut group: Vec<(Vec<u8>, u64)> = Vec::new();
        let mut bytes = PAGE_HEADER_BYTES;
        let mut emit = |group: &mut Vec<(Vec<u8>, u64)>, next: &mut u64| {
            let node = branch_node(*next, group);
            let first = group.first().map(|(k, _)| k.clone()).unwrap_or_default();
            parents.push((first, *next));
            *next += (node.len() / PAGE_BYTES) as u64;
            pages.push(node);
            group.clear();
        };
        for child in children {
            let element = ELEMENT_BYTES + child.0.len();
            if !group.is_empty()
                && (bytes + element > PAGE_BYTES || group.len() == NODE_ELEMENTS_MAX)
            {
                emit(&mut group, next);
                bytes = PAGE_HEADER_BYTES;
            }
            bytes += element;
            group.push(child);
        }
        if !group.is_empty() {
            emit(&mut group, next);
        }
        children = parents;
    }
    let root = children.first().map_or(0, |(_, id)| *id);
    (pages, root)
}

/// Returns the bucket header: `root` then sequence 0.
fn bucket_header(root: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(BUCKET_HEADER_BYTES);
    out.extend_from_slice(&root.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out
}

/// Returns true if a bucket of these entries is written inline (bbolt's rule).
fn fits_inline(entries: &[Entry]) -> bool {
    let bytes: usize = PAGE_HEADER_BYTES
        + entries
            .iter()
            .map(|(k, v)| leaf_element_bytes(k.len(), v.len()))
            .sum::<usize>();
    bytes <= INLINE_BUCKET_BYTES_MAX
}

/// Lays out an in-memory bucket: returns its value in the root leaf and appends its pages.
fn small_bucket(entries: &[Entry], next: &mut u64, pages: &mut Vec<Vec<u8>>) -> Vec<u8> {
    if fits_inline(entries) {
        let elements: Vec<(u32, &[u8], &[u8])> = entries
            .iter()
            .map(|(k, v)| (0, k.as_slice(), v.as_slice()))
            .collect();
        let mut value = bucket_header(0);
        value.extend_from_slice(&leaf_node(0, &elements, true));
        return value;
    }
    let mut packer = LeafPacker::default();
    for (k, v) in entries {
        packer.add(k, v.len());
    }
    let (leaves, _) = packer.finish();
    let mut children = Vec::with_capacity(leaves.len());
    let mut at = 0;
    for leaf in &leaves {
        let elements: Vec<(u32, &[u8], &[u8])> = entries[at..at + leaf.count]
            .iter()
            .map(|(k, v)| (0, k.as_slice(), v.as_slice()))
            .collect();
        at += leaf.count;
        children.push((leaf.first_key.clone(), *next));
        pages.push(leaf_node(*next, &elements, false));
        *next += leaf.pages;
    }
    let (branches, root) = branch_levels(children, next);
    pages.extend(branches);
    bucket_header(root)
}

/// Returns a meta page.
fn meta_page(id: u64, root: u64, high_water: u64, txid: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(PAGE_BYTES);
    put_header(&mut out, id, FLAG_META, 0, 0);
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(PAGE_BYTES as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&root.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&NO_FREELIST.to_le_bytes());
    out.extend_from_slice(&high_water.to_le_bytes());
    out.extend_from_slice(&txid.to_le_bytes());
    let checksum = fnv1a64(&out[PAGE_HEADER_BYTES..]);
    out.extend_from_slice(&checksum.to_le_bytes());
    out.resize(PAGE_BYTES, 0);
    out
}

/// Where the writer is.
#[derive(Debug)]
enum Phase {
    Metas,
    /// The `key` bucket's leaf at this index, history after this key.
    KeyLeaves(usize, Option<RevisionKey>),
    /// The pages built in memory.
    Tail,
    Done,
}

/// An etcd snapshot file being written (see the module documentation).
pub struct EtcdWriter<H: History> {
    history: H,
    key_leaves: Vec<LeafPlan>,
    /// The pages after the key leaves, in order.
    tail: VecDeque<Vec<u8>>,
    root: u64,
    high_water: u64,
    /// The page id of the next key leaf.
    next_leaf_page: u64,
    phase: Phase,
}

impl<H: History> std::fmt::Debug for EtcdWriter<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdWriter")
            .field("phase", &self.phase)
            .field("high_water", &self.high_water)
            .finish_non_exhaustive()
    }
}

impl<H: History> EtcdWriter<H> {
    /// Plans the file: sizes the `key` bucket from `history` and lays out the other buckets
    /// (`buckets`: name and entries sorted by key; names other than `key`).
    pub fn new(history: H, mut buckets: Vec<(Vec<u8>, Vec<Entry>)>) -> Result<Self, StorageError> {
        let mut packer = LeafPacker::default();
        let mut after = None;
        loop {
            let mut seen = 0;
            history.scan(after, SIZING_SCAN_BATCH, &mut |key, record| {
                let (etcd_key, value) = history_entry(key, record)?;
                packer.add(&etcd_key, value.len());
                after = Some(*key);
                seen += 1;
                Ok(true)
            })?;
            if seen < SIZING_SCAN_BATCH {
                break;
            }
        }
        let (mut leaves, key_bytes) = packer.finish();
        let mut next: u64 = 2;
        let mut tail = Vec::new();
        let key_value = if leaves.len() == 1 && key_bytes <= INLINE_BUCKET_BYTES_MAX {
            // Small enough to be inline: read it whole now (at most a quarter page).
            let mut entries = Vec::new();
            history.scan(None, leaves[0].count, &mut |key, record| {
                entries.push(history_entry(key, record)?);
                Ok(true)
            })?;
            leaves.clear();
            small_bucket(&entries, &mut next, &mut tail)
        } else if leaves.is_empty() {
            small_bucket(&[], &mut next, &mut tail)
        } else {
            let mut children = Vec::with_capacity(leaves.len());
            for leaf in &leaves {
                children.push((leaf.first_key.clone(), next));
                next += leaf.pages;
            }
            let (branches, root) = branch_levels(children, &mut next);
            tail.extend(branches);
            bucket_header(root)
        };
        buckets.retain(|(name, _)| name != BUCKET_KEY);
        let mut root_entries: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(buckets.len() + 1);
        root_entries.push((BUCKET_KEY.to_vec(), key_value));
        for (name, entries) in &buckets {
            let value = small_bucket(entries, &mut next, &mut tail);
            root_entries.push((name.clone(), value));
        }
        root_entries.sort_by(|a, b| a.0.cmp(&b.0));
        let elements: Vec<(u32, &[u8], &[u8])> = root_entries
            .iter()
            .map(|(k, v)| (FLAG_BUCKET, k.as_slice(), v.as_slice()))
            .collect();
        let root = next;
        let root_page = leaf_node(root, &elements, false);
        next += (root_page.len() / PAGE_BYTES) as u64;
        tail.push(root_page);
        Ok(EtcdWriter {
            history,
            key_leaves: leaves,
            tail: tail.into(),
            root,
            high_water: next,
            next_leaf_page: 2,
            phase: Phase::Metas,
        })
    }

    /// Returns the length of the file (BWRITE-1).
    pub fn total_bytes(&self) -> u64 {
        self.high_water * PAGE_BYTES as u64
    }

    /// Appends whole pages to `out` until it holds at least `chunk_bytes` or the file is
    /// complete. Returns false once the last page has been appended.
    pub fn fill(&mut self, out: &mut Vec<u8>, chunk_bytes: usize) -> Result<bool, StorageError> {
        while out.len() < chunk_bytes {
            self.phase = match std::mem::replace(&mut self.phase, Phase::Done) {
                Phase::Metas => {
                    out.extend_from_slice(&meta_page(0, self.root, self.high_water, 2));
                    out.extend_from_slice(&meta_page(1, self.root, self.high_water, 1));
                    Phase::KeyLeaves(0, None)
                }
                Phase::KeyLeaves(index, after) => match self.key_leaves.get(index) {
                    Some(_) => {
                        let after = self.write_leaf(index, after, out)?;
                        Phase::KeyLeaves(index + 1, Some(after))
                    }
                    None => Phase::Tail,
                },
                Phase::Tail => match self.tail.pop_front() {
                    Some(page) => {
                        out.extend_from_slice(&page);
                        Phase::Tail
                    }
                    None => Phase::Done,
                },
                Phase::Done => return Ok(false),
            };
        }
        Ok(!matches!(self.phase, Phase::Done))
    }

    /// Writes the key bucket's leaf `index`, whose entries follow `after`; returns the last
    /// history key it holds (BWRITE-2).
    fn write_leaf(
        &mut self,
        index: usize,
        after: Option<RevisionKey>,
        out: &mut Vec<u8>,
    ) -> Result<RevisionKey, StorageError> {
        let plan = &self.key_leaves[index];
        let mut entries = Vec::with_capacity(plan.count);
        let mut last = None;
        self.history.scan(after, plan.count, &mut |key, record| {
            entries.push(history_entry(key, record)?);
            last = Some(*key);
            Ok(true)
        })?;
        let id = self.next_leaf_page;
        let planned = entries.len() == plan.count
            && entries.first().map(|(k, _)| k.as_slice()) == Some(plan.first_key.as_slice());
        let elements: Vec<(u32, &[u8], &[u8])> = entries
            .iter()
            .map(|(k, v)| (0, k.as_slice(), v.as_slice()))
            .collect();
        let page = leaf_node(id, &elements, false);
        match last {
            Some(last) if planned && page.len() as u64 == plan.pages * PAGE_BYTES as u64 => {
                out.extend_from_slice(&page);
                self.next_leaf_page += plan.pages;
                Ok(last)
            }
            _ => Err(StorageError::Corrupted(
                "etcd snapshot: the history changed between the sizing and the writing pass".into(),
            )),
        }
    }
}
