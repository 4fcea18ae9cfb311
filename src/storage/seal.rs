//! The checksum that ends every stored row of a registered table and every meta value, so a
//! changed byte in them is an error and never a wrong lease, limit, password hash or
//! revision. History records carry their own (`mvcc::record`, REC-4).
//!
//! A sealed value is the value's bytes followed by a 4-byte big-endian CRC-32 (IEEE,
//! `crc32fast`) of: the table's name length (u32) and name, the row's key length (u32) and
//! key, and the value. A meta integer is sealed as a row of the table `meta` whose key is the
//! integer's name: 12 bytes.
//!
//! Invariants:
//! - ROW-1: every row and every meta value but the schema version that storage writes is
//!   sealed, and every read through storage (`Snapshot::rows`, `WriteBatch::get_row`,
//!   `Snapshot::get_meta`, replay, dump) checks the seal: a changed byte, a value read under
//!   another key or table, or a value shorter than its checksum gives `Corrupted`. What
//!   layers above storage see and what the log and dumps carry are the values without their
//!   seals. The schema version stays 8 bytes so that every build, older ones included, reads
//!   it and refuses a newer file by its version ([`UNSEALED_META`]).
//! - ROW-2: the one exception is a file of schema version 2 or older, whose rows and meta
//!   values have no seal: `Store::open` seals them all in one durable commit that also
//!   raises the schema version, before anything else reads a row; until then only the
//!   schema version and the log mark (STORE-7) are read. Those reads and the sealing read
//!   meta values through [`meta_any`], which takes an unsealed 8-byte integer too. A file
//!   whose version says 2 or older but whose integers are sealed is refused as damaged, not
//!   sealed twice (a changed byte of the unsealed version).
//!
//! Contact points: `storage` (`WriteBatch`, `Snapshot`, replay, the migration at open),
//! `storage::dump` (dumps carry unsealed values; restores seal them).

use crate::error::StorageError;

/// Bytes of the checksum at the end of a sealed value.
pub const SEAL_BYTES: usize = 4;
/// The table name meta values are sealed under.
const META_TABLE_NAME: &str = "meta";
/// Bytes of a sealed meta integer.
const META_SEALED_BYTES: usize = 8 + SEAL_BYTES;
/// The name of the one meta integer stored without a seal: the schema version (ROW-1).
pub const UNSEALED_META: &str = "schema_version";

/// The stored bytes of a meta integer: 8, or 12 with the seal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaBytes {
    bytes: [u8; META_SEALED_BYTES],
    len: usize,
}

impl std::ops::Deref for MetaBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

fn checksum(table: &str, key: &[u8], value: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    // Names and keys are bounded far below 4 GiB (the request-size limit).
    for part in [table.as_bytes(), key] {
        hasher.update(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_be_bytes());
        hasher.update(part);
    }
    hasher.update(value);
    hasher.finalize()
}

/// Appends `value` and its seal for `key` of `table` to `out`.
pub fn seal_into(table: &str, key: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.reserve(value.len() + SEAL_BYTES);
    out.extend_from_slice(value);
    out.extend_from_slice(&checksum(table, key, value).to_be_bytes());
}

/// Returns `value` sealed for `key` of `table`.
pub fn seal(table: &str, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    seal_into(table, key, value, &mut out);
    out
}

/// Returns the value inside `stored`, the sealed bytes of `key` in `table` (ROW-1).
pub fn open<'v>(table: &str, key: &[u8], stored: &'v [u8]) -> Result<&'v [u8], StorageError> {
    let corrupted = |what: &str| {
        StorageError::Corrupted(format!(
            "row of table {table} at key \"{}\": {what}",
            shown(key)
        ))
    };
    let end = stored.len().checked_sub(SEAL_BYTES).ok_or_else(|| {
        corrupted(&format!(
            "{} bytes, shorter than its checksum",
            stored.len()
        ))
    })?;
    let (value, sum) = stored.split_at(end);
    let mut found = [0u8; SEAL_BYTES];
    found.copy_from_slice(sum);
    if u32::from_be_bytes(found) != checksum(table, key, value) {
        return Err(corrupted("checksum mismatch"));
    }
    Ok(value)
}

/// Returns the stored bytes of the meta integer `name`: sealed, but for the schema version.
pub fn meta(name: &str, value: u64) -> MetaBytes {
    let mut bytes = [0u8; META_SEALED_BYTES];
    bytes[..8].copy_from_slice(&value.to_be_bytes());
    if name == UNSEALED_META {
        return MetaBytes { bytes, len: 8 };
    }
    let sum = checksum(META_TABLE_NAME, name.as_bytes(), &bytes[..8]);
    bytes[8..].copy_from_slice(&sum.to_be_bytes());
    MetaBytes {
        bytes,
        len: META_SEALED_BYTES,
    }
}

/// Reads the meta integer `name`, checking its seal (ROW-1); the schema version has none.
pub fn read_meta(name: &str, stored: &[u8]) -> Result<u64, StorageError> {
    if name == UNSEALED_META {
        return super::decode_u64(stored);
    }
    let value = open(META_TABLE_NAME, name.as_bytes(), stored)?;
    super::decode_u64(value)
}

/// Returns true if `stored` is the meta integer `name` with a seal that checks.
pub fn is_sealed_meta(name: &str, stored: &[u8]) -> bool {
    name != UNSEALED_META
        && stored.len() == META_SEALED_BYTES
        && open(META_TABLE_NAME, name.as_bytes(), stored).is_ok()
}

/// Reads the meta integer `name`, sealed or as a file of schema version 2 or older stored
/// it (8 bytes, ROW-2).
pub fn meta_any(name: &str, stored: &[u8]) -> Result<u64, StorageError> {
    if stored.len() == 8 {
        super::decode_u64(stored)
    } else {
        read_meta(name, stored)
    }
}

/// Shows at most 64 bytes of a key, escaped, for an error message.
fn shown(key: &[u8]) -> String {
    let cut = &key[..key.len().min(64)];
    let more = if cut.len() < key.len() { "…" } else { "" };
    format!("{}{more}", cut.escape_ascii())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_to_itself_under_its_own_key_only() {
        let stored = seal("leases", b"\x00\x07", b"ttl=60");
        assert_eq!(stored.len(), 6 + SEAL_BYTES);
        assert_eq!(open("leases", b"\x00\x07", &stored), Ok(&b"ttl=60"[..]));
        for (table, key) in [("leases", &b"\x00\x08"[..]), ("alarms", b"\x00\x07")] {
            assert_eq!(
                open(table, key, &stored),
                Err(StorageError::Corrupted(format!(
                    "row of table {table} at key \"{}\": checksum mismatch",
                    key.escape_ascii()
                ))),
                "ROW-1: a value read under another key or table"
            );
        }
        let empty = seal("t", b"k", b"");
        assert_eq!(open("t", b"k", &empty), Ok(&b""[..]));
    }

    #[test]
    fn every_changed_bit_and_every_cut_is_refused() {
        let stored = seal("quota_registry", b"role/a", b"limit 1024");
        for byte in 0..stored.len() {
            for bit in 0..8 {
                let mut changed = stored.clone();
                changed[byte] ^= 1 << bit;
                assert!(
                    open("quota_registry", b"role/a", &changed).is_err(),
                    "ROW-1: bit {bit} of byte {byte}"
                );
            }
        }
        for len in 0..stored.len() {
            assert!(open("quota_registry", b"role/a", &stored[..len]).is_err());
        }
        assert_eq!(
            open("t", b"k", b"abc"),
            Err(StorageError::Corrupted(
                "row of table t at key \"k\": 3 bytes, shorter than its checksum".into()
            ))
        );
    }

    #[test]
    fn meta_integers_are_sealed_and_old_ones_read_unsealed() {
        let stored = meta("current_revision", 42);
        assert_eq!(stored.len(), META_SEALED_BYTES);
        assert!(is_sealed_meta("current_revision", &stored));
        assert!(!is_sealed_meta("current_revision", &42u64.to_be_bytes()));
        assert_eq!(read_meta("current_revision", &stored), Ok(42));
        assert!(
            read_meta("applied_index", &stored).is_err(),
            "ROW-1: another name"
        );
        assert!(
            read_meta("current_revision", &42u64.to_be_bytes()).is_err(),
            "ROW-1: an unsealed integer is refused where the schema promises seals"
        );
        assert_eq!(meta_any("current_revision", &42u64.to_be_bytes()), Ok(42));
        assert_eq!(meta_any("current_revision", &stored), Ok(42));
        let mut changed = stored.to_vec();
        changed[7] ^= 1;
        assert!(meta_any("current_revision", &changed).is_err());
        assert!(!is_sealed_meta("current_revision", &changed));

        // Every build reads the schema version, so it has no seal.
        let version = meta(UNSEALED_META, 3);
        assert_eq!(&*version, &3u64.to_be_bytes()[..]);
        assert_eq!(read_meta(UNSEALED_META, &version), Ok(3));
        assert!(!is_sealed_meta(UNSEALED_META, &version));
    }

    #[test]
    fn long_keys_are_cut_in_messages() {
        let key = vec![b'k'; 100];
        let Err(StorageError::Corrupted(message)) = open("t", &key, b"xxxxx") else {
            panic!("a mismatch");
        };
        assert!(
            message.contains(&format!("\"{}…\"", "k".repeat(64))),
            "{message}"
        );
    }
}
