//! Operation ids on the wire: the `kvd-operation-id` gRPC metadata that makes a write
//! exactly-once (the engine's `WriteOptions`), and the test failpoint that drops the
//! response of a committed write so that tests can retry it.
//!
//! Owns: the metadata key, the checks of an id a client sends, and the failpoint's counter.
//!
//! Invariants:
//! - OPID-1: an id is checked before the engine is called: present at most once, valid
//!   UTF-8 (printable ASCII is the portable form), non-empty and at most
//!   [`kvd::OPERATION_ID_BYTES_MAX`] bytes. A bad one is `InvalidArgument` and changes
//!   nothing.
//! - OPID-2: the failpoint drops only responses of writes that carried an id and that the
//!   engine answered with success, so the write it drops is committed and recorded; it
//!   drops at most the number it was armed with, counted down atomically, and is disarmed
//!   (0) unless a test arms it through `KVD_TEST_DROP_RESPONSE_AFTER_COMMIT`.
//!
//! Contact points: `server::kv`, `server::lease` (gRPC writes) and `server::operator` (the
//! operator API, whose `"operation_id"` field it checks with [`check_id`]); the binary
//! reads the failpoint's variable into `ServerConfig`.

use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

use crate::status;
use kvd::WriteOptions;
use kvd::sync::{AtomicU64, Ordering};

/// The gRPC metadata key that carries a write's operation id.
pub const OPERATION_ID_METADATA: &str = "kvd-operation-id";

/// The environment variable that arms the failpoint (tests only): the number of responses
/// of committed writes with an operation id to drop.
pub const DROP_RESPONSE_AFTER_COMMIT_ENV: &str = "KVD_TEST_DROP_RESPONSE_AFTER_COMMIT";

/// The message of a response the failpoint dropped.
pub const DROPPED_MESSAGE: &str =
    "kvd: test failpoint: the write was committed and its response dropped";

/// Returns the write options of a gRPC request: its operation id, if it carries one
/// (OPID-1).
pub fn write_options(metadata: &MetadataMap) -> Result<WriteOptions, Status> {
    let mut values = metadata.get_all(OPERATION_ID_METADATA).iter();
    let Some(value) = values.next() else {
        return Ok(WriteOptions::default());
    };
    if values.next().is_some() {
        return Err(invalid(format!(
            "metadata '{OPERATION_ID_METADATA}' is given more than once"
        )));
    }
    let Ok(id) = std::str::from_utf8(value.as_encoded_bytes()) else {
        return Err(invalid(format!(
            "metadata '{OPERATION_ID_METADATA}' is not UTF-8"
        )));
    };
    check_id(id).map_err(|err| status::from_error(&err))?;
    Ok(WriteOptions::with_operation_id(id))
}

/// Checks an operation id (OPID-1), with the engine's rule and message.
pub fn check_id(id: &str) -> kvd::Result<()> {
    kvd::validate_operation_id(id)
}

fn invalid(what: String) -> Status {
    status::from_error(&kvd::Error::InvalidArgument(what))
}

/// The failpoint that drops responses of committed writes (OPID-2).
#[derive(Debug, Default)]
pub struct DropAfterCommit {
    remaining: AtomicU64,
}

impl DropAfterCommit {
    /// Returns a failpoint that drops the next `count` responses (0: never).
    pub fn new(count: u64) -> DropAfterCommit {
        DropAfterCommit {
            remaining: AtomicU64::new(count),
        }
    }

    /// Returns true, and counts one down, if the response of a committed write carrying
    /// `options` must be dropped.
    pub fn take(&self, options: &WriteOptions) -> bool {
        if options.operation_id.is_none() {
            return false;
        }
        self.remaining
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Returns `Err(Unavailable)` in place of `response` if the failpoint takes it. The
    /// status carries the encoded response it replaces in its details, so a test can
    /// compare it with what the retry gets.
    pub fn check<M: prost::Message>(
        &self,
        options: &WriteOptions,
        response: &M,
    ) -> Result<(), Status> {
        if !self.take(options) {
            return Ok(());
        }
        tracing::warn!(
            operation_id = options.operation_id.as_deref().unwrap_or(""),
            "test failpoint: dropping the response of a committed write"
        );
        Err(Status::with_details(
            Code::Unavailable,
            DROPPED_MESSAGE,
            response.encode_to_vec().into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataValue;

    fn options(values: &[&[u8]]) -> Result<WriteOptions, Status> {
        let mut metadata = MetadataMap::new();
        for value in values {
            let value = MetadataValue::try_from(*value).unwrap();
            metadata.append(OPERATION_ID_METADATA, value);
        }
        write_options(&metadata)
    }

    #[test]
    fn ids_are_checked() {
        assert_eq!(options(&[]).unwrap(), WriteOptions::default());
        assert_eq!(
            options(&[b"client-7/1"]).unwrap(),
            WriteOptions::with_operation_id("client-7/1")
        );
        let long = vec![b'x'; kvd::OPERATION_ID_BYTES_MAX + 1];
        for bad in [&[][..], &long, b"\xff\xfe"] {
            let status = options(&[bad]).unwrap_err();
            assert_eq!(status.code(), Code::InvalidArgument, "{bad:?}");
            assert!(status.message().starts_with("kvd: invalid argument: "));
        }
        let twice = options(&[b"a", b"b"]).unwrap_err();
        assert_eq!(twice.code(), Code::InvalidArgument);
        assert!(twice.message().contains("more than once"), "{twice:?}");
    }

    #[test]
    fn the_failpoint_drops_as_many_as_armed_and_only_with_an_id() {
        let failpoint = DropAfterCommit::new(2);
        let with_id = WriteOptions::with_operation_id("o");
        assert!(!failpoint.take(&WriteOptions::default()));
        assert!(failpoint.take(&with_id));
        assert!(failpoint.take(&with_id));
        assert!(!failpoint.take(&with_id));
        assert!(!DropAfterCommit::default().take(&with_id));
    }
}
