//! The public error type, `kvd::Error`, and the per-layer errors it is built from.
//!
//! Owns: every error a caller of the engine can see, and its message.
//!
//! Invariants:
//! - ERR-1: the `Display` text of every etcd-facing variant is etcd's client-visible message,
//!   verbatim; the Go client matches errors by this text.
//! - ERR-2: operating errors (bad request, compacted revision, ...) change nothing; fatal
//!   states (`Storage` with `is_poisoned()` or `is_corrupted()`) stop writes until the
//!   operator reopens the data directory.
//!
//! Contact points: `storage` produces [`StorageError`]; the engine produces the rest; the
//! server maps every variant to a gRPC status in one exhaustive match.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// How long a client refused by a full prepare queue should wait before it retries
/// (Velero's requeue interval); the operator API sends it as `Retry-After`.
pub const ALLOCATION_RETRY_AFTER: Duration = Duration::from_secs(5);

/// A failure of the storage layer.
///
/// ```
/// let e = kvd::Error::from(kvd::StorageError::Poisoned("disk gone".into()));
/// assert!(e.is_poisoned() && e.to_string().contains("reopen"));
/// ```
// Exhaustive on purpose: the server maps every variant to a gRPC code, and a new variant
// must fail its build until it is mapped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageError {
    /// Another process (or another engine in this process) holds the data directory.
    Locked {
        /// The data directory.
        dir: PathBuf,
    },
    /// The database bytes do not decode: a truncated or damaged file.
    Corrupted(String),
    /// An I/O error from the operating system or the database file.
    Io(String),
    /// An earlier I/O error left the database in an unknown state; it refuses writes until
    /// it is reopened (redb repairs on open).
    Poisoned(String),
    /// The on-disk schema is not the one this build reads.
    UnsupportedSchema {
        /// The schema version found in the file.
        found: u64,
    },
    /// The file's schema is older than this build's, and the caller asked that it not be
    /// raised (`kvd check` without `--upgrade`): an open would raise it, after which older
    /// builds refuse the file.
    OlderSchema {
        /// The schema version found in the file.
        found: u64,
        /// The schema version this build writes.
        current: u64,
    },
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageError::Locked { dir } => write!(
                f,
                "kvd: data directory {} is in use by another kvd process (lock held)",
                dir.display()
            ),
            StorageError::Corrupted(what) => write!(f, "kvd: database corrupted: {what}"),
            StorageError::Io(what) => write!(f, "kvd: storage I/O error: {what}"),
            StorageError::Poisoned(cause) => write!(
                f,
                "kvd: storage refused writes after an earlier I/O error ({cause}); \
                 close and reopen the data directory to recover"
            ),
            StorageError::UnsupportedSchema { found } => {
                write!(
                    f,
                    "kvd: database schema version {found} is newer than this build"
                )
            }
            StorageError::OlderSchema { found, current } => {
                write!(
                    f,
                    "kvd: database schema version {found} is older than this build's \
                     {current}: an open raises it, after which older builds refuse the directory"
                )
            }
        }
    }
}

/// Every error the engine returns.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
/// let err = engine.range(&kvd::RangeRequest { revision: 5, ..kvd::RangeRequest::key("k") }).unwrap_err();
/// assert!(err.is_future_revision());
/// assert_eq!(err.to_string(), "etcdserver: mvcc: required revision is a future revision");
/// ```
// Exhaustive on purpose, as `StorageError`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The request's key (or a compare or op key) is empty.
    KeyNotProvided,
    /// `ignore_value`/`ignore_lease` on a missing key, or an empty Txn op.
    KeyNotFound,
    /// `ignore_value` with a value.
    ValueProvided,
    /// `ignore_lease` with a lease.
    LeaseProvided,
    /// The request is larger than `max_request_bytes`.
    RequestTooLarge,
    /// A Txn has more operations than `max_txn_ops`.
    TooManyTxnOps,
    /// A Txn writes one key twice in one branch.
    DuplicateKey,
    /// The revision asked for has been compacted.
    Compacted,
    /// The revision asked for is above the current revision.
    FutureRevision,
    /// The lease does not exist.
    LeaseNotFound,
    /// A grant named a lease id that exists.
    LeaseExists,
    /// A grant asked for a TTL above the maximum.
    LeaseTtlTooLarge,
    /// The prepare queue (or the role's fair share of it) is full; retry later. Nothing of
    /// the write was applied.
    TooManyRequests {
        /// When a retry is likely to find room, from the queue's drain rate (the server
        /// sends it as `retry-after-ms` metadata and an HTTP `Retry-After`).
        retry_after_ms: u64,
    },
    /// The write needs space and the space quota, the filesystem reserve or an active
    /// NOSPACE alarm says there is none.
    NoSpace,
    /// A CORRUPT alarm is active: writes are refused until it is cleared.
    Corrupt,
    /// A write or a record would take a role past a quota limit; the text names the role,
    /// the resource, the consumption, the request and the limit.
    QuotaExceeded(String),
    /// A quota registry or record request was refused; the text is Mesos's message.
    QuotaRequest(String),
    /// An allocation asked to be prepared while the allocation prepare queue is full, or its
    /// role holds its fair share of it; retry after `ALLOCATION_RETRY_AFTER`. The text
    /// starts with `kvd: prepare queue is full` and gives the count and the limit.
    AllocationPrepareQueueFull(String),
    /// A write carried an operation id whose retained outcome is of another request
    /// (OPER-2); nothing changed.
    OperationIdReused(String),
    /// A request argument is out of its domain; the text says which.
    InvalidArgument(String),
    /// The engine is closed.
    Closed,
    /// The storage layer failed.
    Storage(StorageError),
    /// An Auth request or a permission check was refused; nothing changed.
    Auth(AuthError),
}

/// A refusal of the auth store (users, roles, tokens, permission checks), each with
/// etcd's client-visible message (ERR-1).
///
/// ```
/// let e = kvd::Error::Auth(kvd::AuthError::PermissionDenied);
/// assert_eq!(e.to_string(), "etcdserver: permission denied");
/// ```
// Exhaustive on purpose, as `Error`: the server maps every variant to etcd's gRPC code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    /// AuthEnable without a user named `root`.
    RootUserNotExist,
    /// AuthEnable while user `root` lacks role `root`.
    RootRoleNotGranted,
    /// UserAdd of an existing name.
    UserAlreadyExist,
    /// UserAdd with an empty name, or a checked call without an identity.
    UserEmpty,
    /// The named user does not exist.
    UserNotFound,
    /// RoleAdd of an existing name.
    RoleAlreadyExist,
    /// The named role does not exist.
    RoleNotFound,
    /// RoleAdd with an empty name.
    RoleEmpty,
    /// Authenticate with an unknown user, a wrong password or an empty name.
    AuthFailed,
    /// A key check or an admin check failed.
    PermissionDenied,
    /// UserRevokeRole of a role the user does not hold.
    RoleNotGranted,
    /// RoleRevokePermission with no permission of exactly that key and range end.
    PermissionNotGranted,
    /// Authenticate while auth is disabled.
    AuthNotEnabled,
    /// An unknown, expired, forged or invalidated token.
    InvalidAuthToken,
    /// Deleting user or role `root`, or revoking `root` from `root`, while auth is
    /// enabled; a permission with an empty key or an inverted range.
    InvalidAuthMgmt,
    /// The caller's identity was resolved at an auth revision older than the store's.
    AuthOldRevision,
    /// RoleGrantPermission without a permission.
    PermissionNotGiven,
    /// Authenticate of a user created with `no_password`.
    NoPasswordUser,
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AuthError::RootUserNotExist => "etcdserver: root user does not exist",
            AuthError::RootRoleNotGranted => "etcdserver: root user does not have root role",
            AuthError::UserAlreadyExist => "etcdserver: user name already exists",
            AuthError::UserEmpty => "etcdserver: user name is empty",
            AuthError::UserNotFound => "etcdserver: user name not found",
            AuthError::RoleAlreadyExist => "etcdserver: role name already exists",
            AuthError::RoleNotFound => "etcdserver: role name not found",
            AuthError::RoleEmpty => "etcdserver: role name is empty",
            AuthError::AuthFailed => {
                "etcdserver: authentication failed, invalid user ID or password"
            }
            AuthError::PermissionDenied => "etcdserver: permission denied",
            AuthError::RoleNotGranted => "etcdserver: role is not granted to the user",
            AuthError::PermissionNotGranted => "etcdserver: permission is not granted to the role",
            AuthError::AuthNotEnabled => "etcdserver: authentication is not enabled",
            AuthError::InvalidAuthToken => "etcdserver: invalid auth token",
            AuthError::InvalidAuthMgmt => "etcdserver: invalid auth management",
            AuthError::AuthOldRevision => "etcdserver: revision of auth store is old",
            AuthError::PermissionNotGiven => "etcdserver: permission not given",
            AuthError::NoPasswordUser => {
                "auth: authentication failed, password was given for no password user"
            }
        })
    }
}

impl From<AuthError> for Error {
    fn from(e: AuthError) -> Error {
        Error::Auth(e)
    }
}

impl Error {
    /// Returns true for the compacted-revision error.
    ///
    /// ```
    /// assert!(kvd::Error::Compacted.is_compacted());
    /// ```
    pub fn is_compacted(&self) -> bool {
        matches!(self, Error::Compacted)
    }

    /// Returns true for the future-revision error.
    ///
    /// ```
    /// assert!(kvd::Error::FutureRevision.is_future_revision());
    /// ```
    pub fn is_future_revision(&self) -> bool {
        matches!(self, Error::FutureRevision)
    }

    /// Returns true if the storage is poisoned and needs a reopen.
    ///
    /// ```
    /// assert!(!kvd::Error::Closed.is_poisoned());
    /// ```
    pub fn is_poisoned(&self) -> bool {
        matches!(self, Error::Storage(StorageError::Poisoned(_)))
    }

    /// Returns true if the database file is damaged.
    ///
    /// ```
    /// assert!(!kvd::Error::Closed.is_corrupted());
    /// ```
    pub fn is_corrupted(&self) -> bool {
        matches!(self, Error::Storage(StorageError::Corrupted(_)))
    }

    /// Returns true if the data directory is held by another engine.
    ///
    /// ```
    /// assert!(!kvd::Error::Closed.is_locked());
    /// ```
    pub fn is_locked(&self) -> bool {
        matches!(self, Error::Storage(StorageError::Locked { .. }))
    }

    /// Returns true for the NOSPACE refusal.
    ///
    /// ```
    /// assert!(kvd::Error::NoSpace.is_no_space());
    /// ```
    pub fn is_no_space(&self) -> bool {
        matches!(self, Error::NoSpace)
    }

    /// Returns true if the request was refused because the prepare queue is full.
    ///
    /// ```
    /// let err = kvd::Error::TooManyRequests { retry_after_ms: 20 };
    /// assert!(err.is_too_many_requests());
    /// assert_eq!(err.retry_after_ms(), Some(20));
    /// assert_eq!(err.to_string(), "etcdserver: too many requests");
    /// ```
    pub fn is_too_many_requests(&self) -> bool {
        matches!(self, Error::TooManyRequests { .. })
    }

    /// Returns the retry hint of a refusal that has one: `TooManyRequests`, and
    /// `AllocationPrepareQueueFull` (`ALLOCATION_RETRY_AFTER`, Velero's requeue interval).
    ///
    /// ```
    /// let err = kvd::Error::AllocationPrepareQueueFull("kvd: prepare queue is full".into());
    /// assert_eq!(err.retry_after_ms(), Some(5_000));
    /// ```
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            Error::TooManyRequests { retry_after_ms } => Some(*retry_after_ms),
            Error::AllocationPrepareQueueFull(_) => {
                u64::try_from(ALLOCATION_RETRY_AFTER.as_millis()).ok()
            }
            _ => None,
        }
    }

    /// Returns true if an allocation was refused because the allocation prepare queue is
    /// full (or its role holds its share of it).
    ///
    /// ```
    /// assert!(kvd::Error::AllocationPrepareQueueFull("kvd: prepare queue is full".into()).is_allocation_prepare_queue_full());
    /// ```
    pub fn is_allocation_prepare_queue_full(&self) -> bool {
        matches!(self, Error::AllocationPrepareQueueFull(_))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Error::KeyNotProvided => "etcdserver: key is not provided",
            Error::KeyNotFound => "etcdserver: key not found",
            Error::ValueProvided => "etcdserver: value is provided",
            Error::LeaseProvided => "etcdserver: lease is provided",
            Error::RequestTooLarge => "etcdserver: request is too large",
            Error::TooManyTxnOps => "etcdserver: too many operations in txn request",
            Error::DuplicateKey => "etcdserver: duplicate key given in txn request",
            Error::Compacted => "etcdserver: mvcc: required revision has been compacted",
            Error::FutureRevision => "etcdserver: mvcc: required revision is a future revision",
            Error::LeaseNotFound => "etcdserver: requested lease not found",
            Error::LeaseExists => "etcdserver: lease already exists",
            Error::LeaseTtlTooLarge => "etcdserver: too large lease TTL",
            Error::TooManyRequests { .. } => "etcdserver: too many requests",
            Error::NoSpace => "etcdserver: mvcc: database space exceeded",
            Error::Corrupt => "etcdserver: corrupt cluster",
            Error::InvalidArgument(what) => return write!(f, "kvd: invalid argument: {what}"),
            Error::QuotaExceeded(what) | Error::QuotaRequest(what) => what,
            Error::AllocationPrepareQueueFull(what) => what,
            Error::OperationIdReused(id) => {
                return write!(
                    f,
                    "kvd: operation id '{id}' was already used for a different request"
                );
            }
            Error::Closed => "kvd: engine is closed",
            Error::Storage(e) => return e.fmt(f),
            Error::Auth(e) => return e.fmt(f),
        };
        f.write_str(text)
    }
}

impl std::error::Error for Error {}

impl From<StorageError> for Error {
    fn from(e: StorageError) -> Error {
        Error::Storage(e)
    }
}

/// The result type of the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;
