//! What `etcdctl snapshot status` reports for a bbolt file, computed the same way: the
//! CRC-32C (Castagnoli) over every bucket name, key and value in walk order, the main
//! revision of the last entry of `key`, the number of entries over all buckets, and the
//! database size (high-water mark × page size).
//!
//! Invariants:
//! - BSTATUS-1: the numbers equal etcdctl's for the same file (checked against etcdctl in
//!   the server's tests).
//!
//! Contact points: `kvd snapshot status`.

use super::read::Reader;
use super::{BUCKET_KEY, BboltError, parse_etcd_revision_key};

/// The CRC-32C polynomial, reflected.
const CASTAGNOLI_REFLECTED: u32 = 0x82F6_3B78;

/// A CRC-32C in progress, bit by bit through a 256-entry table.
struct Crc32c {
    table: [u32; 256],
    crc: u32,
}

impl Crc32c {
    fn new() -> Crc32c {
        let mut table = [0u32; 256];
        for (i, slot) in table.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ CASTAGNOLI_REFLECTED
                } else {
                    c >> 1
                };
            }
            *slot = c;
        }
        Crc32c { table, crc: !0 }
    }

    fn update(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.crc = self.table[((self.crc ^ u32::from(*b)) & 0xFF) as usize] ^ (self.crc >> 8);
        }
    }

    fn finish(&self) -> u32 {
        !self.crc
    }
}

/// `etcdctl snapshot status`'s four numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BboltStatus {
    /// CRC-32C of the buckets' contents.
    pub hash: u32,
    /// Main revision of the last entry of `key` (0 if none).
    pub revision: i64,
    /// Entries summed over every bucket.
    pub total_keys: u64,
    /// Database bytes, without the trailer.
    pub total_size: u64,
}

/// Computes the status of `db` (a bbolt file without its trailer).
pub fn status(db: &[u8]) -> Result<BboltStatus, BboltError> {
    let reader = Reader::open(db)?;
    let mut total_keys = 0u64;
    let mut revision = 0i64;
    // Both callbacks feed the one checksum, in walk order.
    let crc = std::cell::RefCell::new(Crc32c::new());
    reader.visit_buckets(
        &mut |name| {
            crc.borrow_mut().update(name);
            Ok(())
        },
        &mut |bucket, key, value| {
            let mut crc = crc.borrow_mut();
            crc.update(key);
            crc.update(value);
            total_keys += 1;
            if bucket == BUCKET_KEY {
                revision = parse_etcd_revision_key(key)?.0;
            }
            Ok(())
        },
    )?;
    let hash = crc.borrow().finish();
    Ok(BboltStatus {
        hash,
        revision,
        total_keys,
        total_size: reader.size(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_check_value() {
        let mut c = Crc32c::new();
        c.update(b"123456789");
        assert_eq!(c.finish(), 0xE306_9283);
    }
}
