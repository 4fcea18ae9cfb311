//! The engine's auth surface: Auth requests through the apply path, reads of the auth
//! store, and the permission checks the server runs before each request once auth is
//! enabled.
//!
//! Identities are user names (`None`: the caller presented none); the server resolves them
//! from tokens or certificates. Reads are checked when they run; writes also when they are
//! applied (PERM-4).
//!
//! Invariants:
//! - PERM-1 and PERM-2 (`auth::check`): ranges are covered without gaps, Txns checked on
//!   every compare and every op of both branches, nested Txns included.
//! - PERM-3: a Put on a lease needs write on every key already attached to that lease, and
//!   a LeaseRevoke write on every attached key (etcd: else a user could delete keys they
//!   cannot write by revoking a lease).
//! - PERM-4: a write submitted with a caller (`WriteOptions::caller`) is checked again in
//!   the apply thread, just before it is applied, against the store as every request before
//!   it in apply order left it; a refusal there changes nothing. So a write admitted before
//!   a permission is revoked, and applied after the revoke, is refused, as etcd's applier
//!   refuses it.
//! - PERM-5: a request's own checks that etcd makes before its permission check (the alarm
//!   gate of a write, etcd's quota check; then validation, VAL-1) come first, so a request
//!   both invalid and denied gets etcd's error, which is the validation's (etcd checks
//!   permissions when it applies or serves a request, after its gRPC layer validated it). A
//!   write submitted with a caller is checked right after its admission, once, before it
//!   takes a queue slot; while auth is on, the `auth_check_*` calls run the same checks in
//!   the same order for callers that check before submitting.
//!
//! Contact points: `server::auth` and the KV, Watch, Lease and Maintenance services.

use super::proposal::{Authorized, Proposal};
use super::{Engine, Shared, wait};
use crate::api::{DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest};
use crate::auth::{Access, AuthRequest, Role, User};
use crate::engine::Completion;
use crate::error::{Result, StorageError};
use crate::mvcc::validate;
use crate::storage::WriteBatch;
use crate::sync;

impl Engine {
    /// Applies an Auth request through the apply path; answers the auth revision after it.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// let add = kvd::AuthRequest::RoleAdd { name: "dev".into() };
    /// assert_eq!(engine.auth(add.clone()).unwrap(), 2);
    /// assert_eq!(engine.auth(add).unwrap_err().to_string(), "etcdserver: role name already exists");
    /// ```
    pub fn auth(&self, request: AuthRequest) -> Result<u64> {
        wait(|done| self.submit_auth(request, done))
    }

    /// Submits an Auth request; `done` receives the answer as with [`Engine::submit_put`].
    pub fn submit_auth(&self, request: AuthRequest, done: Completion<u64>) {
        self.enqueue(Proposal::Auth(request, done));
    }

    /// Returns whether auth is enabled, and the auth revision.
    pub fn auth_status(&self) -> Result<(bool, u64)> {
        let auth = sync::read(&self.shared()?.auth);
        Ok((auth.enabled(), auth.revision()))
    }

    /// Returns the user named `name`, if any.
    pub fn auth_user(&self, name: &str) -> Result<Option<User>> {
        Ok(sync::read(&self.shared()?.auth).user(name).cloned())
    }

    /// Returns every user name, sorted.
    pub fn auth_user_names(&self) -> Result<Vec<String>> {
        Ok(sync::read(&self.shared()?.auth).user_names())
    }

    /// Returns the role named `name`, if any.
    pub fn auth_role(&self, name: &str) -> Result<Option<Role>> {
        Ok(sync::read(&self.shared()?.auth).role(name).cloned())
    }

    /// Returns every role name, sorted.
    pub fn auth_role_names(&self) -> Result<Vec<String>> {
        Ok(sync::read(&self.shared()?.auth).role_names())
    }

    /// Checks that `user` may access `(key, range_end)` for `access`; always allowed while
    /// auth is disabled.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// assert!(engine.auth_check(None, b"k", b"", kvd::Access::Write).is_ok());
    /// ```
    pub fn auth_check(
        &self,
        user: Option<&str>,
        key: &[u8],
        range_end: &[u8],
        access: Access,
    ) -> Result<()> {
        let auth = sync::read(&self.shared()?.auth);
        Ok(auth.check_key(user, key, range_end, access)?)
    }

    /// Checks that `user` is an administrator (holds role `root`); always allowed while
    /// auth is disabled.
    pub fn auth_check_admin(&self, user: Option<&str>) -> Result<()> {
        Ok(sync::read(&self.shared()?.auth).check_admin(user)?)
    }

    /// Returns true if `user` exists and holds role `root`.
    pub fn auth_is_root(&self, user: Option<&str>) -> Result<bool> {
        Ok(sync::read(&self.shared()?.auth).is_root(user))
    }

    /// Checks a Range: its validation, then read on its range (PERM-5).
    pub fn auth_check_range(&self, user: Option<&str>, req: &RangeRequest) -> Result<()> {
        if !self.auth_enabled()? {
            return Ok(());
        }
        validate::check_range(req)?;
        self.auth_check(user, &req.key, &req.range_end, Access::Read)
    }

    /// Checks a Put: the checks before it is queued (PERM-5), then write on its key, write
    /// on the keys of its lease (PERM-3), read on its key for `prev_kv`.
    pub fn auth_check_put(&self, user: Option<&str>, req: &PutRequest) -> Result<()> {
        if !self.auth_enabled()? {
            return Ok(());
        }
        self.admit_put(req)?;
        check_put(self.shared()?, user, req)
    }

    /// Checks a DeleteRange: its validation (PERM-5), then read on its range for
    /// `prev_kv`, then write on it.
    pub fn auth_check_delete_range(
        &self,
        user: Option<&str>,
        req: &DeleteRangeRequest,
    ) -> Result<()> {
        if !self.auth_enabled()? {
            return Ok(());
        }
        validate::check_delete(req)?;
        check_delete_range(self.shared()?, user, req)
    }

    /// Checks a Txn: the checks before it is queued or served (PERM-5), then every compare
    /// needs read, every op of both branches its own check, nested Txns included (PERM-2).
    pub fn auth_check_txn(&self, user: Option<&str>, req: &TxnRequest) -> Result<()> {
        if !self.auth_enabled()? {
            return Ok(());
        }
        self.admit_txn(req)?;
        check_txn(self.shared()?, user, req)
    }

    /// Checks a write submitted with a caller (`WriteOptions::caller`) once its own checks
    /// passed (PERM-5); it is checked again when applied (PERM-4).
    pub(super) fn check_caller(&self, caller: Option<&str>, proposal: &Proposal) -> Result<()> {
        check_write(self.shared()?, caller, proposal)
    }

    /// Checks a read-only Txn submitted with a caller once its own checks passed (PERM-5).
    pub(super) fn auth_check_txn_as(&self, caller: Option<&str>, req: &TxnRequest) -> Result<()> {
        check_txn(self.shared()?, caller, req)
    }

    /// Whether auth is on. While it is off every check passes, and the request's own
    /// checks are left to its submission.
    fn auth_enabled(&self) -> Result<bool> {
        Ok(sync::read(&self.shared()?.auth).enabled())
    }

    /// Checks a LeaseRevoke: write on every key attached to the lease (PERM-3); a lease
    /// without keys (or an unknown one) may be revoked by anyone.
    pub fn auth_check_lease_revoke(&self, user: Option<&str>, id: i64) -> Result<()> {
        check_lease_revoke(self.shared()?, user, id)
    }
}

fn check_key(
    shared: &Shared,
    user: Option<&str>,
    key: &[u8],
    range_end: &[u8],
    access: Access,
) -> Result<()> {
    Ok(sync::read(&shared.auth).check_key(user, key, range_end, access)?)
}

fn check_put(shared: &Shared, user: Option<&str>, req: &PutRequest) -> Result<()> {
    if !sync::read(&shared.auth).enabled() {
        return Ok(());
    }
    let lease_keys = lease_keys(shared, req.lease);
    let auth = sync::read(&shared.auth);
    auth.check_key(user, &req.key, b"", Access::Write)?;
    if !auth.is_root(user) {
        for key in &lease_keys {
            auth.check_key(user, key, b"", Access::Write)?;
        }
    }
    if req.prev_kv {
        auth.check_key(user, &req.key, b"", Access::Read)?;
    }
    Ok(())
}

fn check_delete_range(shared: &Shared, user: Option<&str>, req: &DeleteRangeRequest) -> Result<()> {
    if req.prev_kv {
        check_key(shared, user, &req.key, &req.range_end, Access::Read)?;
    }
    check_key(shared, user, &req.key, &req.range_end, Access::Write)
}

fn check_txn(shared: &Shared, user: Option<&str>, req: &TxnRequest) -> Result<()> {
    if !sync::read(&shared.auth).enabled() {
        return Ok(());
    }
    for compare in &req.compare {
        check_key(shared, user, &compare.key, &compare.range_end, Access::Read)?;
    }
    for op in req.success.iter().chain(&req.failure) {
        match op {
            RequestOp::Range(r) => check_key(shared, user, &r.key, &r.range_end, Access::Read)?,
            RequestOp::Put(p) => check_put(shared, user, p)?,
            RequestOp::DeleteRange(d) => check_delete_range(shared, user, d)?,
            RequestOp::Txn(t) => check_txn(shared, user, t)?,
        }
    }
    Ok(())
}

fn check_lease_revoke(shared: &Shared, user: Option<&str>, id: i64) -> Result<()> {
    if !sync::read(&shared.auth).enabled() {
        return Ok(());
    }
    let keys = lease_keys(shared, id);
    let auth = sync::read(&shared.auth);
    if auth.is_root(user) {
        return Ok(());
    }
    for key in &keys {
        auth.check_key(user, key, b"", Access::Write)?;
    }
    Ok(())
}

/// Returns the keys attached to lease `id` (none for 0 or an unknown lease).
fn lease_keys(shared: &Shared, id: i64) -> Vec<bytes::Bytes> {
    if id == 0 {
        return Vec::new();
    }
    let now = shared.config.clock.now();
    let lessor = sync::lock(&shared.lessor);
    lessor
        .time_to_live(id, now, true)
        .map(|t| t.keys)
        .unwrap_or_default()
}

/// Returns `proposal` to be checked as `caller` when applied (PERM-4).
pub(super) fn authorized(proposal: Proposal, caller: Option<String>) -> Proposal {
    Proposal::Authorized(Box::new(Authorized {
        caller,
        inner: proposal,
    }))
}

/// Checks a write as `caller` against the auth store as it stands: at submission, after
/// the write's own checks (PERM-5), and again in the apply thread, against the store as
/// every earlier request left it (PERM-4); writes without keys pass.
pub(super) fn check_write(
    shared: &Shared,
    caller: Option<&str>,
    proposal: &Proposal,
) -> Result<()> {
    match proposal {
        Proposal::Put(r, _) => check_put(shared, caller, r),
        Proposal::DeleteRange(r, _) => check_delete_range(shared, caller, r),
        Proposal::Txn(r, _) => check_txn(shared, caller, r),
        Proposal::LeaseRevoke(r, _) => check_lease_revoke(shared, caller, r.id),
        Proposal::Identified(op) => check_write(shared, caller, &op.inner),
        Proposal::Authorized(a) => check_write(shared, a.caller.as_deref(), &a.inner),
        Proposal::Compaction(..)
        | Proposal::LeaseGrant(..)
        | Proposal::Alarm(..)
        | Proposal::Accounting(..)
        | Proposal::Auth(..)
        | Proposal::Defrag(_)
        | Proposal::Reconcile(..) => Ok(()),
    }
}

/// Applies an Auth request in the apply thread, its rows in `batch` (AUTH-STORE-1).
pub(super) fn apply_auth(
    shared: &Shared,
    req: &AuthRequest,
    batch: &mut WriteBatch<'_>,
) -> std::result::Result<Result<u64>, StorageError> {
    let mut auth = sync::write(&shared.auth);
    Ok(auth.apply(req, batch)?.map_err(crate::Error::from))
}
