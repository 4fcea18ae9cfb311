//! Reads etcd's snapshot file (a bbolt database, see the parent module): validates the
//! metas, then walks every top-level bucket from the root, in key order.
//!
//! The reader never scans pages in file order: etcd's files hold stale, unreferenced pages,
//! so only what the root reaches is data.
//!
//! Invariants:
//! - BREAD-1: every read is bounds-checked: a page id at or past the high-water mark, a
//!   page extent past the file, elements or key/value bytes outside their node, a page of a
//!   type that does not fit where it was reached, a page reached twice, a tree deeper than
//!   [`TREE_DEPTH_MAX`] and keys that do not strictly increase all give a [`BboltError`]
//!   (BBOLT-2), never a panic.
//! - BREAD-2: the walk reports a bucket's entries in strictly increasing key order, and the
//!   buckets in name order.
//!
//! Contact points: `engine::etcd_snapshot` imports from it; `kvd snapshot status` and the
//! fuzz target `bbolt_read` call [`Reader::open`] and [`Reader::visit`].

use super::{
    BUCKET_HEADER_BYTES, BboltError, ELEMENT_BYTES, FLAG_BRANCH, FLAG_BUCKET, FLAG_LEAF, FLAG_META,
    MAGIC, PAGE_HEADER_BYTES, VERSION, fnv1a64, invalid,
};

/// Deepest tree the reader follows (bbolt's trees are balanced and shallow).
pub const TREE_DEPTH_MAX: usize = 32;
/// Smallest page size the reader accepts (etcdctl's trailer detection needs a multiple).
pub const PAGE_BYTES_MIN: usize = 512;
/// Largest page size the reader accepts.
pub const PAGE_BYTES_MAX: usize = 64 * 1024;
/// Bytes of etcd's SHA-256 trailer.
pub const TRAILER_BYTES: usize = 32;
/// etcdctl's trailer test: a file with one has this remainder modulo 512.
const TRAILER_MODULUS: usize = 512;

/// Splits a snapshot file into the database and etcd's SHA-256 trailer, found as etcdctl
/// finds it: by the length being 32 more than a multiple of 512.
pub fn split_trailer(file: &[u8]) -> (&[u8], Option<&[u8]>) {
    if file.len() % TRAILER_MODULUS == TRAILER_BYTES {
        let (db, trailer) = file.split_at(file.len() - TRAILER_BYTES);
        (db, Some(trailer))
    } else {
        (file, None)
    }
}

/// A validated meta page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Meta {
    page_size: usize,
    root: u64,
    high_water: u64,
    txid: u64,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Parses the meta page at byte `at` of `data`.
fn meta_at(data: &[u8], at: usize) -> Result<Meta, BboltError> {
    let m = at + PAGE_HEADER_BYTES;
    let short = || invalid("file too small for a bbolt meta page");
    let flags = u16_at(data, at + 8).ok_or_else(short)?;
    let magic = u32_at(data, m).ok_or_else(short)?;
    if magic != MAGIC {
        return Err(invalid("invalid database (not a bbolt file: bad magic)"));
    }
    if flags != FLAG_META {
        return Err(invalid("meta page without the meta flag"));
    }
    let version = u32_at(data, m + 4).ok_or_else(short)?;
    if version != VERSION {
        return Err(invalid(format!("bbolt version mismatch ({version})")));
    }
    let body = data.get(m..m + 56).ok_or_else(short)?;
    let checksum = u64_at(data, m + 56).ok_or_else(short)?;
    // bbolt accepts a zero checksum unchecked.
    if checksum != 0 && checksum != fnv1a64(body) {
        return Err(invalid("meta checksum error"));
    }
    let page_size = u32_at(data, m + 8).ok_or_else(short)? as usize;
    if !(PAGE_BYTES_MIN..=PAGE_BYTES_MAX).contains(&page_size) || !page_size.is_power_of_two() {
        return Err(invalid(format!("unsupported page size {page_size}")));
    }
    Ok(Meta {
        page_size,
        root: u64_at(data, m + 16).ok_or_else(short)?,
        high_water: u64_at(data, m + 40).ok_or_else(short)?,
        txid: u64_at(data, m + 48).ok_or_else(short)?,
    })
}

/// Where a bucket's entries are.
#[derive(Debug, Clone, Copy)]
enum BucketRoot<'a> {
    /// The bucket's tree starts at this page.
    Page(u64),
    /// An inline bucket: a leaf page inside the bucket value.
    Inline(&'a [u8]),
}

/// One node: its page flags, element count and bytes (from its header to the end of its
/// extent).
struct Node<'a> {
    flags: u16,
    count: usize,
    bytes: &'a [u8],
}

/// What a walk calls for each entry: bucket name, key, value.
pub type Visit<'v> = dyn FnMut(&[u8], &[u8], &[u8]) -> Result<(), BboltError> + 'v;

/// An opened bbolt file.
#[derive(Debug)]
pub struct Reader<'a> {
    data: &'a [u8],
    meta: Meta,
}

impl<'a> Reader<'a> {
    /// Validates the metas of `data` (the database, without a trailer) and picks the one
    /// bbolt would.
    pub fn open(data: &'a [u8]) -> Result<Reader<'a>, BboltError> {
        let first = meta_at(data, 0);
        let second = match &first {
            Ok(m) => meta_at(data, m.page_size),
            Err(_) => [4096usize, 8192, 16384, 65536, 1024, 2048, 512]
                .iter()
                .map(|ps| meta_at(data, *ps))
                .find(|m| matches!(m, Ok(m) if data.len() >= m.page_size))
                .unwrap_or_else(|| Err(invalid("no valid meta page"))),
        };
        let meta = match (first, second) {
            (Ok(a), Ok(b)) => {
                if b.txid > a.txid && b.page_size == a.page_size {
                    b
                } else {
                    a
                }
            }
            (Ok(a), Err(_)) => a,
            (Err(_), Ok(b)) => b,
            (Err(e), Err(_)) => return Err(e),
        };
        let body = meta
            .high_water
            .checked_mul(meta.page_size as u64)
            .ok_or_else(|| invalid("high-water mark overflows"))?;
        if meta.high_water < 3 {
            return Err(invalid("high-water mark below 3 pages"));
        }
        if (data.len() as u64) < body {
            return Err(invalid(format!(
                "truncated: the metas say {body} bytes, the file has {}",
                data.len()
            )));
        }
        if meta.root < 2 || meta.root >= meta.high_water {
            return Err(invalid(format!("root page {} out of bounds", meta.root)));
        }
        Ok(Reader { data, meta })
    }

    /// Returns the page size.
    pub fn page_size(&self) -> usize {
        self.meta.page_size
    }

    /// Returns the database's size: high-water mark × page size.
    pub fn size(&self) -> u64 {
        self.meta.high_water * self.meta.page_size as u64
    }

    /// Returns the txid of the meta in use.
    pub fn txid(&self) -> u64 {
        self.meta.txid
    }

    /// Walks every top-level bucket in name order, calling `visit` for each of its entries
    /// in key order (BREAD-1, BREAD-2). Top-level entries that are not buckets are skipped.
    pub fn visit(&self, visit: &mut Visit<'_>) -> Result<(), BboltError> {
        self.visit_buckets(&mut |_| Ok(()), visit)
    }

    /// Like [`Reader::visit`], and calls `bucket` with each bucket's name before its
    /// entries (empty buckets included).
    pub fn visit_buckets(
        &self,
        bucket: &mut dyn FnMut(&[u8]) -> Result<(), BboltError>,
        visit: &mut Visit<'_>,
    ) -> Result<(), BboltError> {
        let mut walk = Walk {
            reader: self,
            seen: vec![false; usize::try_from(self.meta.high_water).unwrap_or(usize::MAX)],
        };
        let mut buckets: Vec<(&'a [u8], BucketRoot<'a>)> = Vec::new();
        let mut last: Option<Vec<u8>> = None;
        walk.tree(
            BucketRoot::Page(self.meta.root),
            0,
            &mut last,
            &mut |flags, k, v| {
                if flags & FLAG_BUCKET != 0 {
                    buckets.push((k, bucket_root(v)?));
                }
                Ok(())
            },
        )?;
        for (name, root) in buckets {
            bucket(name)?;
            let mut last = None;
            walk.tree(root, 0, &mut last, &mut |flags, k, v| {
                if flags & FLAG_BUCKET != 0 {
                    return Err(invalid(format!(
                        "nested bucket in {:?}: not an etcd snapshot",
                        String::from_utf8_lossy(name)
                    )));
                }
                visit(name, k, v)
            })?;
        }
        Ok(())
    }
}

/// Parses a bucket value.
fn bucket_root(value: &[u8]) -> Result<BucketRoot<'_>, BboltError> {
    let root = u64_at(value, 0).ok_or_else(|| invalid("bucket value shorter than its header"))?;
    if root == 0 {
        let page = value
            .get(BUCKET_HEADER_BYTES..)
            .filter(|p| p.len() >= PAGE_HEADER_BYTES)
            .ok_or_else(|| invalid("inline bucket without its page"))?;
        Ok(BucketRoot::Inline(page))
    } else {
        Ok(BucketRoot::Page(root))
    }
}

/// One walk over the file: the pages it has reached.
struct Walk<'r, 'a> {
    reader: &'r Reader<'a>,
    seen: Vec<bool>,
}

type LeafVisit<'v, 'a> = dyn FnMut(u32, &'a [u8], &'a [u8]) -> Result<(), BboltError> + 'v;

impl<'a> Walk<'_, 'a> {
    /// Returns page `id`'s node, marking its extent as reached.
    fn page(&mut self, id: u64) -> Result<Node<'a>, BboltError> {
        let meta = self.reader.meta;
        if id < 2 || id >= meta.high_water {
            return Err(invalid(format!("page {id} out of bounds")));
        }
        let ps = meta.page_size;
        let start = id as usize * ps;
        let header = &self.reader.data[start..start + PAGE_HEADER_BYTES];
        let stored = u64_at(header, 0).unwrap_or(u64::MAX);
        if stored != id {
            return Err(invalid(format!(
                "page {id} holds the header of page {stored}"
            )));
        }
        let overflow = u64::from(u32_at(header, 12).unwrap_or(u32::MAX));
        let end_page = id
            .checked_add(overflow)
            .filter(|last| *last < meta.high_water)
            .ok_or_else(|| invalid(format!("page {id}: overflow past the high-water mark")))?;
        for p in id..=end_page {
            let slot = &mut self.seen[p as usize];
            if *slot {
                return Err(invalid(format!("page {p}: multiple references")));
            }
            *slot = true;
        }
        let end = (end_page as usize + 1) * ps;
        Ok(Node {
            flags: u16_at(header, 8).unwrap_or(0),
            count: usize::from(u16_at(header, 10).unwrap_or(0)),
            bytes: &self.reader.data[start..end],
        })
    }

    /// Walks the tree at `root`, calling `visit` with each leaf element's flags, key and
    /// value in key order; `last` is the previous key of the bucket.
    fn tree(
        &mut self,
        root: BucketRoot<'a>,
        depth: usize,
        last: &mut Option<Vec<u8>>,
        visit: &mut LeafVisit<'_, 'a>,
    ) -> Result<(), BboltError> {
        if depth > TREE_DEPTH_MAX {
            return Err(invalid("tree deeper than the reader follows (a cycle?)"));
        }
        let node = match root {
            BucketRoot::Page(id) => self.page(id)?,
            BucketRoot::Inline(bytes) => {
                let node = Node {
                    flags: u16_at(bytes, 8).unwrap_or(0),
                    count: usize::from(u16_at(bytes, 10).unwrap_or(0)),
                    bytes,
                };
                if node.flags != FLAG_LEAF {
                    return Err(invalid("inline bucket whose page is not a leaf"));
                }
                node
            }
        };
        let elements_end = PAGE_HEADER_BYTES + ELEMENT_BYTES * node.count;
        if elements_end > node.bytes.len() {
            return Err(invalid(format!(
                "{} elements do not fit their page",
                node.count
            )));
        }
        match node.flags {
            FLAG_LEAF => {
                for i in 0..node.count {
                    let at = PAGE_HEADER_BYTES + ELEMENT_BYTES * i;
                    let e = &node.bytes[at..at + ELEMENT_BYTES];
                    let flags = u32_at(e, 0).unwrap_or(0);
                    let (pos, ksize, vsize) = (field(e, 4), field(e, 8), field(e, 12));
                    let key = slice(node.bytes, at, pos, ksize)?;
                    let value = slice(node.bytes, at, pos + ksize, vsize)?;
                    ordered(last, key)?;
                    visit(flags, key, value)?;
                }
                Ok(())
            }
            FLAG_BRANCH => {
                if node.count == 0 {
                    return Err(invalid("empty branch page"));
                }
                for i in 0..node.count {
                    let at = PAGE_HEADER_BYTES + ELEMENT_BYTES * i;
                    let e = &node.bytes[at..at + ELEMENT_BYTES];
                    let (pos, ksize) = (field(e, 0), field(e, 4));
                    slice(node.bytes, at, pos, ksize)?;
                    let child = u64_at(e, 8).unwrap_or(0);
                    self.tree(BucketRoot::Page(child), depth + 1, last, visit)?;
                }
                Ok(())
            }
            other => Err(invalid(format!(
                "page of type {other:#x} where a bucket page belongs"
            ))),
        }
    }
}

/// Reads a u32 element field as a `u64` (so sums of them cannot overflow).
fn field(e: &[u8], at: usize) -> u64 {
    u64::from(u32_at(e, at).unwrap_or(u32::MAX))
}

/// Returns `len` bytes at `element + offset` of `node`, if they lie inside it.
fn slice(node: &[u8], element: usize, offset: u64, len: u64) -> Result<&[u8], BboltError> {
    let start = (element as u64).checked_add(offset);
    let end = start.and_then(|s| s.checked_add(len));
    match (start, end) {
        (Some(s), Some(e)) if e <= node.len() as u64 => Ok(&node[s as usize..e as usize]),
        _ => Err(invalid("key or value outside its page")),
    }
}

/// Checks that `key` sorts after `last`, then records it.
fn ordered(last: &mut Option<Vec<u8>>, key: &[u8]) -> Result<(), BboltError> {
    if let Some(previous) = last.as_deref()
        && key <= previous
    {
        return Err(invalid("keys out of order"));
    }
    let slot = last.get_or_insert_with(Vec::new);
    slot.clear();
    slot.extend_from_slice(key);
    Ok(())
}
