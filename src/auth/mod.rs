//! The auth store: etcd's users, roles, permissions, the enabled flag and the auth
//! revision, persisted in their own tables and changed only through the apply path.
//!
//! Passwords are opaque hash strings here: the server hashes (bcrypt) and verifies, so the
//! engine holds no hashing code and apply stays cheap and deterministic.
//!
//! Invariants:
//! - AUTH-STORE-1: the store in memory equals the `auth_users`, `auth_roles` and
//!   `auth_meta` tables; every change writes its rows in the batch of the request that made
//!   it, so the store survives restarts and travels in snapshots.
//! - AUTH-STORE-2: the auth revision starts at 1 and moves up by one on every successful
//!   change but AuthEnable (etcd): user add/delete/password/grant/revoke, role
//!   add/delete/grant/revoke, and AuthDisable; a refused request and a no-op grant of a
//!   role already held change nothing.
//! - AUTH-STORE-3: a user's roles are sorted and unique; a role's permissions are sorted by
//!   key, at most one per (key, range end).
//! - AUTH-STORE-4: auth can only be enabled while user `root` exists and holds role `root`;
//!   while enabled, user `root`, role `root` and root's grant of it cannot be removed.
//!
//! Contact points: `engine::apply` applies [`AuthRequest`]s; `engine::auth` answers the
//! reads and the permission checks the server asks for; `engine::recover` loads the store.

mod check;
mod codec;

use std::collections::BTreeMap;

pub use check::{Interval, covers, interval};

use crate::error::{AuthError, StorageError};
use crate::storage::{RowTable, Snapshot, WriteBatch};

/// The storage table of users: user name → user row (`auth::codec`).
pub const AUTH_USERS_TABLE: RowTable = RowTable::new("auth_users");
/// The storage table of roles: role name → role row (`auth::codec`).
pub const AUTH_ROLES_TABLE: RowTable = RowTable::new("auth_roles");
/// The storage table of the enabled flag and the auth revision.
pub const AUTH_META_TABLE: RowTable = RowTable::new("auth_meta");
/// Every table the auth store owns.
pub const AUTH_TABLES: [RowTable; 3] = [AUTH_USERS_TABLE, AUTH_ROLES_TABLE, AUTH_META_TABLE];

/// The name of etcd's administrator user.
pub const ROOT_USER: &str = "root";
/// The name of the role that passes every check.
pub const ROOT_ROLE: &str = "root";

/// `auth_meta` key of the enabled flag (one byte, 0 or 1).
pub(crate) const ENABLED_KEY: &[u8] = b"enabled";
/// `auth_meta` key of the auth revision (8-byte big-endian).
pub(crate) const REVISION_KEY: &[u8] = b"revision";

pub(crate) use codec::{encode_role as role_row, encode_user as user_row};

/// What a permission allows (etcd's `authpb.Permission.Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermissionType {
    /// Reads (Range, Watch, compares).
    Read,
    /// Writes (Put, DeleteRange, LeaseRevoke of attached keys).
    Write,
    /// Both.
    ReadWrite,
}

impl PermissionType {
    /// Returns etcd's enum number.
    pub fn number(self) -> u8 {
        match self {
            PermissionType::Read => 0,
            PermissionType::Write => 1,
            PermissionType::ReadWrite => 2,
        }
    }

    /// Returns the type of etcd's enum number.
    pub fn from_number(number: u8) -> Option<PermissionType> {
        match number {
            0 => Some(PermissionType::Read),
            1 => Some(PermissionType::Write),
            2 => Some(PermissionType::ReadWrite),
            _ => None,
        }
    }

    fn allows(self, access: Access) -> bool {
        matches!(
            (self, access),
            (PermissionType::ReadWrite, _)
                | (PermissionType::Read, Access::Read)
                | (PermissionType::Write, Access::Write)
        )
    }
}

/// The access a request needs on a key or range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read permission.
    Read,
    /// Write permission.
    Write,
}

/// A permission on a key (`range_end` empty), a range, or everything from `key` on
/// (`range_end` "\0").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permission {
    /// What it allows.
    pub perm_type: PermissionType,
    /// The first key.
    pub key: Vec<u8>,
    /// The range end, etcd's encoding.
    pub range_end: Vec<u8>,
}

/// A user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The name.
    pub name: String,
    /// The password hash the server made (bcrypt), empty for a password-less user.
    pub password_hash: String,
    /// Created with `no_password`: only a certificate identity can act as this user.
    pub no_password: bool,
    /// The roles held, sorted (AUTH-STORE-3).
    pub roles: Vec<String>,
}

/// A role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Role {
    /// The name; a role named like a quota role is the same tenant.
    pub name: String,
    /// The permissions, sorted by key (AUTH-STORE-3).
    pub permissions: Vec<Permission>,
}

/// A change to the auth store, applied in order with the writes (etcd's Auth RPCs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthRequest {
    /// AuthEnable.
    Enable,
    /// AuthDisable.
    Disable,
    /// UserAdd; `password_hash` is `None` for a `no_password` user.
    UserAdd {
        /// The user name.
        name: String,
        /// The hash of the password, or `None` for a password-less user.
        password_hash: Option<String>,
    },
    /// UserDelete.
    UserDelete {
        /// The user name.
        name: String,
    },
    /// UserChangePassword.
    UserChangePassword {
        /// The user name.
        name: String,
        /// The hash of the new password.
        password_hash: String,
    },
    /// UserGrantRole.
    UserGrantRole {
        /// The user name.
        user: String,
        /// The role name.
        role: String,
    },
    /// UserRevokeRole.
    UserRevokeRole {
        /// The user name.
        user: String,
        /// The role name.
        role: String,
    },
    /// RoleAdd.
    RoleAdd {
        /// The role name.
        name: String,
    },
    /// RoleDelete (also revokes the role from every user).
    RoleDelete {
        /// The role name.
        name: String,
    },
    /// RoleGrantPermission; `None` when the request carried no permission.
    RoleGrantPermission {
        /// The role name.
        role: String,
        /// The permission.
        permission: Option<Permission>,
    },
    /// RoleRevokePermission of the permission of exactly this key and range end.
    RoleRevokePermission {
        /// The role name.
        role: String,
        /// The permission's key.
        key: Vec<u8>,
        /// The permission's range end.
        range_end: Vec<u8>,
    },
}

impl AuthRequest {
    /// Returns the request's size as etcd would count it (about its message's bytes).
    pub fn encoded_len(&self) -> usize {
        match self {
            AuthRequest::Enable | AuthRequest::Disable => 0,
            AuthRequest::UserAdd {
                name,
                password_hash,
            } => name.len() + password_hash.as_ref().map_or(2, String::len) + 4,
            AuthRequest::UserDelete { name } | AuthRequest::RoleAdd { name } => name.len() + 2,
            AuthRequest::RoleDelete { name } => name.len() + 2,
            AuthRequest::UserChangePassword {
                name,
                password_hash,
            } => name.len() + password_hash.len() + 4,
            AuthRequest::UserGrantRole { user, role }
            | AuthRequest::UserRevokeRole { user, role } => user.len() + role.len() + 4,
            AuthRequest::RoleGrantPermission { role, permission } => {
                role.len()
                    + permission
                        .as_ref()
                        .map_or(0, |p| p.key.len() + p.range_end.len() + 8)
                    + 4
            }
            AuthRequest::RoleRevokePermission {
                role,
                key,
                range_end,
            } => role.len() + key.len() + range_end.len() + 6,
        }
    }
}

/// The users, roles, flag and revision (AUTH-STORE-1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthStore {
    users: BTreeMap<String, User>,
    roles: BTreeMap<String, Role>,
    enabled: bool,
    revision: u64,
}

impl Default for AuthStore {
    fn default() -> AuthStore {
        AuthStore {
            users: BTreeMap::new(),
            roles: BTreeMap::new(),
            enabled: false,
            revision: 1,
        }
    }
}

impl AuthStore {
    /// Loads the store from its tables (AUTH-STORE-1); a fresh database gives the empty
    /// store at revision 1.
    pub fn load(snapshot: &Snapshot) -> Result<AuthStore, StorageError> {
        let mut store = AuthStore::default();
        for (key, value) in snapshot.rows(AUTH_USERS_TABLE)? {
            let user = codec::decode_user(&key, &value)?;
            store.users.insert(user.name.clone(), user);
        }
        for (key, value) in snapshot.rows(AUTH_ROLES_TABLE)? {
            let role = codec::decode_role(&key, &value)?;
            store.roles.insert(role.name.clone(), role);
        }
        for (key, value) in snapshot.rows(AUTH_META_TABLE)? {
            match key.as_slice() {
                ENABLED_KEY => store.enabled = value.first() == Some(&1),
                REVISION_KEY => store.revision = crate::storage::decode_u64(&value)?,
                _ => {
                    return Err(StorageError::Corrupted("unknown auth meta row".to_owned()));
                }
            }
        }
        Ok(store)
    }

    /// Returns true while auth is enabled.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Returns the auth revision (AUTH-STORE-2).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Returns the user named `name`.
    pub fn user(&self, name: &str) -> Option<&User> {
        self.users.get(name)
    }

    /// Returns the role named `name`.
    pub fn role(&self, name: &str) -> Option<&Role> {
        self.roles.get(name)
    }

    /// Returns every user name, sorted.
    pub fn user_names(&self) -> Vec<String> {
        self.users.keys().cloned().collect()
    }

    /// Returns every role name, sorted.
    pub fn role_names(&self) -> Vec<String> {
        self.roles.keys().cloned().collect()
    }

    /// Applies `request`, writing the rows it changes in `batch`; answers the auth
    /// revision after it, or the refusal (which changed nothing).
    pub fn apply(
        &mut self,
        request: &AuthRequest,
        batch: &mut WriteBatch<'_>,
    ) -> Result<Result<u64, AuthError>, StorageError> {
        let mut next = self.clone();
        let changed = match next.change(request) {
            Ok(changed) => changed,
            Err(refusal) => return Ok(Err(refusal)),
        };
        if changed.bump {
            next.revision += 1;
        }
        next.persist(&changed, batch)?;
        *self = next;
        Ok(Ok(self.revision))
    }

    /// Changes the store in memory; returns what to persist.
    fn change(&mut self, request: &AuthRequest) -> Result<Changed, AuthError> {
        let mut changed = Changed::default();
        match request {
            AuthRequest::Enable => {
                if !self.enabled {
                    let root = self
                        .users
                        .get(ROOT_USER)
                        .ok_or(AuthError::RootUserNotExist)?;
                    if !holds(root, ROOT_ROLE) {
                        return Err(AuthError::RootRoleNotGranted);
                    }
                    self.enabled = true;
                    changed.meta = true;
                }
                return Ok(changed);
            }
            AuthRequest::Disable => {
                if self.enabled {
                    self.enabled = false;
                    changed.meta = true;
                    changed.bump = true;
                }
                return Ok(changed);
            }
            AuthRequest::UserAdd {
                name,
                password_hash,
            } => {
                if name.is_empty() {
                    return Err(AuthError::UserEmpty);
                }
                if self.users.contains_key(name) {
                    return Err(AuthError::UserAlreadyExist);
                }
                self.users.insert(
                    name.clone(),
                    User {
                        name: name.clone(),
                        password_hash: password_hash.clone().unwrap_or_default(),
                        no_password: password_hash.is_none(),
                        roles: Vec::new(),
                    },
                );
                changed.users.push(name.clone());
            }
            AuthRequest::UserDelete { name } => {
                if self.enabled && name == ROOT_USER {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                self.users.remove(name).ok_or(AuthError::UserNotFound)?;
                changed.users.push(name.clone());
            }
            AuthRequest::UserChangePassword {
                name,
                password_hash,
            } => {
                let user = self.users.get_mut(name).ok_or(AuthError::UserNotFound)?;
                // etcd 3.4 keeps a password-less user password-less.
                if !user.no_password {
                    user.password_hash.clone_from(password_hash);
                }
                changed.users.push(name.clone());
            }
            AuthRequest::UserGrantRole { user, role } => {
                if !self.users.contains_key(user) {
                    return Err(AuthError::UserNotFound);
                }
                if role != ROOT_ROLE && !self.roles.contains_key(role) {
                    return Err(AuthError::RoleNotFound);
                }
                let held = self.users.get_mut(user).ok_or(AuthError::UserNotFound)?;
                match held.roles.binary_search(role) {
                    Ok(_) => return Ok(changed),
                    Err(at) => held.roles.insert(at, role.clone()),
                }
                changed.users.push(user.clone());
            }
            AuthRequest::UserRevokeRole { user, role } => {
                if self.enabled && user == ROOT_USER && role == ROOT_ROLE {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                let held = self.users.get_mut(user).ok_or(AuthError::UserNotFound)?;
                let at = held
                    .roles
                    .binary_search(role)
                    .map_err(|_| AuthError::RoleNotGranted)?;
                held.roles.remove(at);
                changed.users.push(user.clone());
            }
            AuthRequest::RoleAdd { name } => {
                if name.is_empty() {
                    return Err(AuthError::RoleEmpty);
                }
                if self.roles.contains_key(name) {
                    return Err(AuthError::RoleAlreadyExist);
                }
                self.roles.insert(
                    name.clone(),
                    Role {
                        name: name.clone(),
                        permissions: Vec::new(),
                    },
                );
                changed.roles.push(name.clone());
            }
            AuthRequest::RoleDelete { name } => {
                if self.enabled && name == ROOT_ROLE {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                self.roles.remove(name).ok_or(AuthError::RoleNotFound)?;
                changed.roles.push(name.clone());
                for user in self.users.values_mut() {
                    if let Ok(at) = user.roles.binary_search(name) {
                        user.roles.remove(at);
                        changed.users.push(user.name.clone());
                    }
                }
            }
            AuthRequest::RoleGrantPermission { role, permission } => {
                let permission = permission.as_ref().ok_or(AuthError::PermissionNotGiven)?;
                validate_permission(permission)?;
                let held = self.roles.get_mut(role).ok_or(AuthError::RoleNotFound)?;
                let same = held
                    .permissions
                    .iter_mut()
                    .find(|p| p.key == permission.key && p.range_end == permission.range_end);
                match same {
                    Some(p) => p.perm_type = permission.perm_type,
                    None => {
                        held.permissions.push(permission.clone());
                        held.permissions
                            .sort_by(|a, b| (&a.key, &a.range_end).cmp(&(&b.key, &b.range_end)));
                    }
                }
                changed.roles.push(role.clone());
            }
            AuthRequest::RoleRevokePermission {
                role,
                key,
                range_end,
            } => {
                let held = self.roles.get_mut(role).ok_or(AuthError::RoleNotFound)?;
                let at = held
                    .permissions
                    .iter()
                    .position(|p| &p.key == key && &p.range_end == range_end)
                    .ok_or(AuthError::PermissionNotGranted)?;
                held.permissions.remove(at);
                changed.roles.push(role.clone());
            }
        }
        changed.bump = true;
        changed.meta = true;
        Ok(changed)
    }

    /// Writes the rows `changed` names as they are now, deleting the ones gone.
    fn persist(&self, changed: &Changed, batch: &mut WriteBatch<'_>) -> Result<(), StorageError> {
        for name in &changed.users {
            match self.users.get(name) {
                Some(user) => {
                    batch.put_row(AUTH_USERS_TABLE, name.as_bytes(), &codec::encode_user(user))?
                }
                None => {
                    batch.delete_row(AUTH_USERS_TABLE, name.as_bytes())?;
                }
            }
        }
        for name in &changed.roles {
            match self.roles.get(name) {
                Some(role) => {
                    batch.put_row(AUTH_ROLES_TABLE, name.as_bytes(), &codec::encode_role(role))?
                }
                None => {
                    batch.delete_row(AUTH_ROLES_TABLE, name.as_bytes())?;
                }
            }
        }
        if changed.meta {
            batch.put_row(AUTH_META_TABLE, ENABLED_KEY, &[u8::from(self.enabled)])?;
            batch.put_row(AUTH_META_TABLE, REVISION_KEY, &self.revision.to_be_bytes())?;
        }
        Ok(())
    }

    /// Returns the user of an identity for a key check, in etcd's order: no identity is
    /// `user name is empty`, an unknown user is `permission denied`.
    fn checked_user(&self, user: Option<&str>) -> Result<&User, AuthError> {
        let name = user.ok_or(AuthError::UserEmpty)?;
        self.users.get(name).ok_or(AuthError::PermissionDenied)
    }

    /// Returns true if `user` holds role `root`.
    pub fn is_root(&self, user: Option<&str>) -> bool {
        user.and_then(|u| self.users.get(u))
            .is_some_and(|u| holds(u, ROOT_ROLE))
    }

    /// Checks that `user` may access `(key, range_end)` for `access` (etcd's
    /// `isOpPermitted`): allowed while auth is disabled and for role `root`.
    pub fn check_key(
        &self,
        user: Option<&str>,
        key: &[u8],
        range_end: &[u8],
        access: Access,
    ) -> Result<(), AuthError> {
        if !self.enabled {
            return Ok(());
        }
        let user = self.checked_user(user)?;
        if holds(user, ROOT_ROLE) {
            return Ok(());
        }
        let intervals: Vec<Interval> = user
            .roles
            .iter()
            .filter_map(|r| self.roles.get(r))
            .flat_map(|r| &r.permissions)
            .filter(|p| p.perm_type.allows(access))
            .map(|p| interval(&p.key, &p.range_end))
            .collect();
        if covers(&intervals, key, range_end) {
            Ok(())
        } else {
            Err(AuthError::PermissionDenied)
        }
    }

    /// Checks that `user` is an administrator (etcd's `IsAdminPermitted`).
    pub fn check_admin(&self, user: Option<&str>) -> Result<(), AuthError> {
        if !self.enabled {
            return Ok(());
        }
        let name = user.ok_or(AuthError::UserEmpty)?;
        let user = self.users.get(name).ok_or(AuthError::UserNotFound)?;
        if holds(user, ROOT_ROLE) {
            Ok(())
        } else {
            Err(AuthError::PermissionDenied)
        }
    }
}

/// What a change touched.
#[derive(Debug, Default)]
struct Changed {
    users: Vec<String>,
    roles: Vec<String>,
    meta: bool,
    bump: bool,
}

fn holds(user: &User, role: &str) -> bool {
    user.roles
        .binary_search_by(|r| r.as_str().cmp(role))
        .is_ok()
}

/// etcd 3.6 refuses a permission on an empty key or an inverted range.
fn validate_permission(p: &Permission) -> Result<(), AuthError> {
    if p.key.is_empty() {
        return Err(AuthError::InvalidAuthMgmt);
    }
    let open = p.range_end.is_empty() || p.range_end == [0];
    if !open && p.key >= p.range_end {
        return Err(AuthError::InvalidAuthMgmt);
    }
    Ok(())
}
