//! The one place where an engine error becomes a gRPC status.
//!
//! Owns: the gRPC code of every [`kvd::Error`] and [`kvd::StorageError`] variant, the
//! statuses kvd answers for RPCs it does not serve, and the error log line of an answer
//! that reports damaged data.
//!
//! Invariants:
//! - STATUS-1: the message of every etcd-facing error is the engine's `Display` text, which
//!   is etcd's client-visible message verbatim (ERR-1); the code is etcd's, except that
//!   `too many requests` is `ResourceExhausted` (etcd sends it as `Unknown`, a plain Go
//!   error), with its retry hint in the `retry-after-ms` metadata. etcd's Go client
//!   recognises errors by their text.
//! - STATUS-2: the mapping is one exhaustive `match` per error enum with no `_` arm, so a new
//!   variant does not compile until someone decides its code.
//! - STATUS-3: RPCs kvd does not serve answer `Unimplemented` with a message that starts with
//!   `kvd:` and says what is missing, never a bare "not implemented".
//! - STATUS-4: the Election service's own refusals ([`election`]) are etcd's plain Go errors
//!   with their text verbatim (`election: not leader`, `election: no leader`, `"leader"
//!   field must be provided`), so their code is `Unknown`, as gRPC-go answers them. The KV
//!   errors of the operations the Lock and Election services make keep their KV codes
//!   (`etcdserver: requested lease not found` is `NotFound`), where etcd 3.4 passes them on
//!   as `Unknown`: the text is the same, and etcd's Go client recognises them by it.
//!
//! Contact points: every service in `server/` maps its `Err` through [`from_error`].

use tonic::{Code, Status};

use kvd::{AuthError, Error, StorageError};

/// The metadata key of the retry hint of a `too many requests` refusal, in milliseconds.
pub const RETRY_AFTER_MS_METADATA: &str = "retry-after-ms";

/// Returns the gRPC status etcd answers for `err`, with the retry hint of a refusal that
/// has one.
pub fn from_error(err: &Error) -> Status {
    if err.is_corrupted() {
        // A client sees DataLoss; the operator needs to hear of it too (REC-4).
        tracing::error!(
            error = %err,
            "a request met damaged data: stop kvd and run `kvd check` on its data directory"
        );
    }
    let mut status = Status::new(code_of(err), err.to_string());
    if let Some(ms) = err.retry_after_ms() {
        status
            .metadata_mut()
            .insert(RETRY_AFTER_MS_METADATA, ms.into());
    }
    status
}

/// Returns the gRPC code of `err` (STATUS-2: no `_` arm).
fn code_of(err: &Error) -> Code {
    match err {
        Error::KeyNotProvided
        | Error::KeyNotFound
        | Error::ValueProvided
        | Error::LeaseProvided
        | Error::RequestTooLarge
        | Error::TooManyTxnOps
        | Error::DuplicateKey
        | Error::InvalidArgument(_) => Code::InvalidArgument,
        Error::Compacted | Error::FutureRevision => Code::OutOfRange,
        Error::LeaseNotFound => Code::NotFound,
        Error::LeaseExists => Code::FailedPrecondition,
        // The id names another request's outcome: retrying cannot help (OPER-2).
        Error::OperationIdReused(_) => Code::FailedPrecondition,
        Error::LeaseTtlTooLarge => Code::OutOfRange,
        // etcd sends this one as a plain Go error, so gRPC-go answers `Unknown`; etcd's Go
        // client recognises it by its text. kvd answers `ResourceExhausted`, the code a
        // client can act on, with the same text and a retry hint (STATUS-1).
        Error::TooManyRequests { .. } => Code::ResourceExhausted,
        // No gRPC call allocates; should one, a full prepare queue is a resource to retry.
        Error::NoSpace | Error::QuotaExceeded(_) | Error::AllocationPrepareQueueFull(_) => {
            Code::ResourceExhausted
        }
        Error::QuotaRequest(_) => Code::InvalidArgument,
        Error::Corrupt => Code::DataLoss,
        // etcd's "server stopped" is Unavailable: the client may try another endpoint.
        Error::Closed => Code::Unavailable,
        Error::Storage(storage) => storage_code(storage),
        Error::Auth(auth) => auth_code(*auth),
    }
}

/// Returns etcd's gRPC code of an auth refusal (STATUS-2: no `_` arm).
fn auth_code(err: AuthError) -> Code {
    match err {
        AuthError::UserEmpty
        | AuthError::RoleEmpty
        | AuthError::AuthFailed
        | AuthError::InvalidAuthMgmt
        | AuthError::AuthOldRevision
        | AuthError::PermissionNotGiven => Code::InvalidArgument,
        AuthError::RootUserNotExist
        | AuthError::RootRoleNotGranted
        | AuthError::UserAlreadyExist
        | AuthError::UserNotFound
        | AuthError::RoleAlreadyExist
        | AuthError::RoleNotFound
        | AuthError::RoleNotGranted
        | AuthError::PermissionNotGranted
        | AuthError::AuthNotEnabled => Code::FailedPrecondition,
        AuthError::PermissionDenied => Code::PermissionDenied,
        AuthError::InvalidAuthToken => Code::Unauthenticated,
        // etcd has no gRPC mapping for it: clients see Unknown with the internal text.
        AuthError::NoPasswordUser => Code::Unknown,
    }
}

/// Returns the gRPC code of a storage failure (STATUS-2: no `_` arm).
fn storage_code(err: &StorageError) -> Code {
    match err {
        // Only seen at open; a running server never answers with it.
        StorageError::Locked { .. } => Code::Unavailable,
        // The data is damaged: etcd answers its "corrupt cluster" with DataLoss.
        StorageError::Corrupted(_) => Code::DataLoss,
        // An I/O error or the poisoned state after one: the request may succeed after the
        // operator fixes the disk and restarts, so the client should retry elsewhere or later.
        StorageError::Io(_) | StorageError::Poisoned(_) => Code::Unavailable,
        StorageError::UnsupportedSchema { .. } | StorageError::OlderSchema { .. } => {
            Code::FailedPrecondition
        }
    }
}

/// Returns the status for an engine call whose blocking task did not finish: it panicked
/// (a bug, reported in the log) or the runtime is shutting down.
pub fn from_join_error(err: &tokio::task::JoinError) -> Status {
    if err.is_cancelled() {
        Status::unavailable("kvd: server is shutting down")
    } else {
        Status::internal("kvd: the request failed inside the server; see the server log")
    }
}

/// Returns the `Unimplemented` status for something kvd does not serve (STATUS-3).
pub fn unimplemented(message: &'static str) -> Status {
    Status::unimplemented(message)
}

/// A refusal of the Election service's own (STATUS-4), with one of the messages below.
pub fn election(message: &'static str) -> Status {
    Status::unknown(message)
}

/// etcd's `ErrElectionNotLeader`: the leader key given is gone or is another generation.
pub const ELECTION_NOT_LEADER: &str = "election: not leader";
/// etcd's `ErrElectionNoLeader`: no candidate holds a key under the election's name.
pub const ELECTION_NO_LEADER: &str = "election: no leader";
/// etcd's `ErrMissingLeaderKey`: Proclaim or Resign without its `leader`.
pub const MISSING_LEADER_KEY: &str = "\"leader\" field must be provided";

/// The message of the cluster reconfiguration RPCs that would change this member or add one.
pub const MEMBERSHIP_NOT_SUPPORTED: &str =
    "kvd: member reconfiguration is not supported: kvd is a single-member server";
/// etcd's `ErrGRPCMemberNotFound` (NotFound): a member id that is not this member's.
pub const MEMBER_NOT_FOUND: &str = "etcdserver: member not found";
/// etcd's `ErrGRPCMemberNotLearner` (FailedPrecondition): MemberPromote of a voting member.
pub const MEMBER_NOT_LEARNER: &str = "etcdserver: can only promote a learner member";
/// etcd's `ErrGRPCNotEnoughStartedMembers` (FailedPrecondition): MemberRemove of the only
/// voting member.
pub const NOT_ENOUGH_STARTED_MEMBERS: &str =
    "etcdserver: re-configuration failed due to not enough started members";
/// etcd's `ErrGRPCBadLeaderTransferee` (FailedPrecondition): MoveLeader to a member id that
/// is not this member's.
pub const BAD_LEADER_TRANSFEREE: &str = "etcdserver: bad leader transferee";
/// The message of Maintenance.Downgrade.
pub const DOWNGRADE_NOT_SUPPORTED: &str = "kvd: downgrade is not supported";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_carries_its_retry_hint() {
        let status = from_error(&Error::TooManyRequests {
            retry_after_ms: 250,
        });
        assert_eq!(status.code(), Code::ResourceExhausted);
        let hint = status.metadata().get(RETRY_AFTER_MS_METADATA);
        assert_eq!(hint.and_then(|v| v.to_str().ok()), Some("250"));
        assert!(from_error(&Error::NoSpace).metadata().is_empty());
    }

    #[test]
    fn etcd_errors_keep_their_code_and_message() {
        let cases = [
            (
                Error::KeyNotProvided,
                Code::InvalidArgument,
                "etcdserver: key is not provided",
            ),
            (
                Error::KeyNotFound,
                Code::InvalidArgument,
                "etcdserver: key not found",
            ),
            (
                Error::RequestTooLarge,
                Code::InvalidArgument,
                "etcdserver: request is too large",
            ),
            (
                Error::TooManyTxnOps,
                Code::InvalidArgument,
                "etcdserver: too many operations in txn request",
            ),
            (
                Error::DuplicateKey,
                Code::InvalidArgument,
                "etcdserver: duplicate key given in txn request",
            ),
            (
                Error::Compacted,
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
            (
                Error::FutureRevision,
                Code::OutOfRange,
                "etcdserver: mvcc: required revision is a future revision",
            ),
            (
                Error::LeaseNotFound,
                Code::NotFound,
                "etcdserver: requested lease not found",
            ),
            (
                Error::TooManyRequests { retry_after_ms: 7 },
                Code::ResourceExhausted,
                "etcdserver: too many requests",
            ),
        ];
        for (err, code, message) in cases {
            let status = from_error(&err);
            assert_eq!(
                (status.code(), status.message()),
                (code, message),
                "{err:?}"
            );
        }
    }

    #[test]
    fn storage_errors_say_what_happened() {
        let corrupted = from_error(&Error::Storage(StorageError::Corrupted("bad page".into())));
        assert_eq!(corrupted.code(), Code::DataLoss);
        assert!(corrupted.message().contains("bad page"));
        let poisoned = from_error(&Error::Storage(StorageError::Poisoned("EIO".into())));
        assert_eq!(poisoned.code(), Code::Unavailable);
        assert!(poisoned.message().contains("reopen"));
    }
}
