//! The digest of a write request, which tells a retry (same request) from a reuse of an
//! operation id for another request.
//!
//! The digest is 12 bytes: a 64-bit FNV-1a hash and a CRC-32 of the same stream, the
//! stream being the request's fields as `std::hash::Hash` feeds them (derived on the
//! request types; floating-point resources by their bit patterns), after a tag naming the
//! kind of request. Neither is a cryptographic hash: a client choosing its own ids has no
//! reason to forge a collision with itself, and 96 bits make an accidental one negligible.
//!
//! Invariants:
//! - DIGEST-1: equal requests give equal digests, in every process of the same
//!   build on the same platform (`Hash` writes integers in the platform's byte order); a
//!   retry after an upgrade that changed a request type is seen as a different request.

use std::hash::{Hash, Hasher};

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// A request digest.
pub type Digest = [u8; 12];

/// Feeds FNV-1a and CRC-32 at once.
struct DigestHasher {
    fnv: u64,
    crc: crc32fast::Hasher,
}

impl Hasher for DigestHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.fnv ^= u64::from(*b);
            self.fnv = self.fnv.wrapping_mul(FNV_PRIME);
        }
        self.crc.update(bytes);
    }

    fn finish(&self) -> u64 {
        self.fnv
    }
}

/// Returns the digest of `request`, tagged with `kind` (so a Put and a Txn that happen to
/// feed the same bytes differ).
pub fn digest(kind: &str, request: &impl Hash) -> Digest {
    let mut hasher = DigestHasher {
        fnv: FNV_OFFSET,
        crc: crc32fast::Hasher::new(),
    };
    kind.hash(&mut hasher);
    request.hash(&mut hasher);
    let mut out = [0u8; 12];
    out[..8].copy_from_slice(&hasher.fnv.to_be_bytes());
    out[8..].copy_from_slice(&hasher.crc.clone().finalize().to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::digest;
    use crate::api::PutRequest;

    #[test]
    fn equal_requests_agree_and_any_field_changes_the_digest() {
        let base = PutRequest::new("k", "v");
        assert_eq!(digest("put", &base), digest("put", &base.clone()));
        assert_ne!(
            digest("put", &base),
            digest("txn", &base),
            "the kind counts"
        );
        let changed = [
            PutRequest::new("k", "w"),
            PutRequest::new("kk", "v"),
            PutRequest {
                lease: 1,
                ..base.clone()
            },
            PutRequest {
                prev_kv: true,
                ..base.clone()
            },
        ];
        for other in changed {
            assert_ne!(digest("put", &base), digest("put", &other), "{other:?}");
        }
    }
}
