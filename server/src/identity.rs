//! The member id and cluster id of a data directory: random on first start, then read back
//! from `<data-dir>/member_id` and `<data-dir>/cluster_id` on every later start.
//!
//! Owns: those two files.
//!
//! Invariants:
//! - ID-1: once written, an id never changes for the life of the data directory; a file that
//!   does not parse is an error, never silently replaced (clients and `etcdctl endpoint
//!   status` use the member id to recognise the member).
//! - ID-2: ids are never 0 (etcd uses 0 for "no member" and "no leader").
//! - ID-3: a new id file appears whole or not at all: it is written to a temporary file,
//!   synced, renamed into place, and the directory is synced.
//! - ID-4: the files are read or created only while the engine holds the data directory's
//!   lock, so two servers cannot race to create them.
//!
//! Contact points: `server::run` calls [`load_or_create`] after opening the engine.

use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Write};
use std::path::Path;

/// The member id file, under the data directory.
pub const MEMBER_ID_FILE: &str = "member_id";
/// The cluster id file, under the data directory.
pub const CLUSTER_ID_FILE: &str = "cluster_id";

/// A data directory's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// The cluster id.
    pub cluster_id: u64,
    /// The member id.
    pub member_id: u64,
}

/// Returns the identity stored in `dir`, creating the files with random ids the first time.
pub fn load_or_create(dir: &Path) -> io::Result<Identity> {
    let member_id = load_or_create_id(dir, MEMBER_ID_FILE)?;
    let cluster_id = load_or_create_id(dir, CLUSTER_ID_FILE)?;
    Ok(Identity {
        cluster_id,
        member_id,
    })
}

fn load_or_create_id(dir: &Path, name: &str) -> io::Result<u64> {
    let path = dir.join(name);
    match fs::read_to_string(&path) {
        Ok(text) => parse_id(&text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} does not hold a 16-digit hexadecimal id (found {:?}); \
                     restore it or remove it to get a new id",
                    path.display(),
                    text.trim()
                ),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let id = random_id();
            write_atomically(dir, name, &format!("{id:016x}\n"))?;
            Ok(id)
        }
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("read {}: {e}", path.display()),
        )),
    }
}

/// Returns the id in `text`: 16 hex digits, surrounding white space allowed, not 0 (ID-2).
fn parse_id(text: &str) -> Option<u64> {
    let digits = text.trim();
    if digits.len() != 16 {
        return None;
    }
    u64::from_str_radix(digits, 16).ok().filter(|id| *id != 0)
}

/// Returns a random non-zero id. The standard library's `RandomState` is seeded from the
/// operating system's random source; the time and process id are mixed in as well.
fn random_id() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    hasher.write_u128(nanos);
    hasher.write_u32(std::process::id());
    match hasher.finish() {
        0 => 1,
        id => id,
    }
}

fn write_atomically(dir: &Path, name: &str, contents: &str) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let target = dir.join(name);
    let context = |e: io::Error, what: &str| io::Error::new(e.kind(), format!("{what}: {e}"));
    let mut file = fs::File::create(&tmp).map_err(|e| context(e, "create id file"))?;
    file.write_all(contents.as_bytes())
        .map_err(|e| context(e, "write id file"))?;
    file.sync_all().map_err(|e| context(e, "sync id file"))?;
    fs::rename(&tmp, &target).map_err(|e| context(e, "rename id file"))?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| context(e, "sync data dir"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_created_once_and_then_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path()).unwrap();
        assert_ne!(first.member_id, 0);
        assert_ne!(first.cluster_id, 0);
        assert_eq!(load_or_create(dir.path()).unwrap(), first);
    }

    #[test]
    fn damaged_id_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(MEMBER_ID_FILE), "not an id\n").unwrap();
        let err = load_or_create(dir.path()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("member_id"));
    }

    #[test]
    fn ids_parse_strictly() {
        assert_eq!(parse_id("b71f75320dc06a6c\n"), Some(0xb71f_7532_0dc0_6a6c));
        assert_eq!(parse_id("0000000000000000"), None);
        assert_eq!(parse_id("abc"), None);
    }
}
