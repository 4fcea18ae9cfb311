//! etcd's Auth service, simple tokens, the rate limit of failed logins, and the resolution
//! of a request's caller ([`authenticated_user`]) that every other service checks with.
//!
//! Owns: the tokens (in memory only, as etcd's simple tokens: a restart invalidates them)
//! and the failed-login counters; bcrypt hashing and verification, always on the blocking
//! pool so a login never stalls a reactor thread.
//!
//! Invariants:
//! - AUTHN-1: a token names one user and expires after `--auth-token-ttl` of idleness (etcd:
//!   300 s, sliding); every use pushes its expiry. UserChangePassword and UserDelete drop
//!   the user's tokens once applied, AuthDisable drops all; a dropped, expired, unknown or
//!   forged token is `etcdserver: invalid auth token` (Unauthenticated).
//! - AUTHN-2: a token is issued only if the auth revision is the one the password was
//!   verified at, read under the token lock; the drops of AUTHN-1 happen under the same
//!   lock after the change is applied, so a login racing a password change or a deletion
//!   either fails or has its token dropped.
//! - AUTHN-3: after [`LOGIN_FAILURES_FREE`] failed logins of one user name, each further
//!   attempt of that name waits for its own slot, spaced by a delay that doubles per
//!   failure from [`LOGIN_DELAY_MIN`] up to [`LOGIN_DELAY_MAX`]; a success clears the count,
//!   and so do [`LOGIN_FAILURE_MEMORY`] without failures. The limit only delays: the answer
//!   is etcd's, unchanged.
//! - AUTHN-4: while auth is disabled, tokens are ignored (etcd 3.6) and every check passes.
//! - AUTHN-5: every Auth RPC but Authenticate and AuthStatus needs an administrator (role
//!   `root`) while auth is enabled, checked before the request's own validation; UserGet
//!   of oneself and RoleGet of a role one holds need no more.
//! - AUTHN-6: a call that needs no permission (Compact, LeaseGrant, an Alarm listing) still
//!   refuses a token that is not live with `invalid auth token` while auth is enabled, as
//!   etcd does for every request through raft, so a client learns to log in again.
//!
//! Contact points: `server::node` holds the [`Sessions`]; the KV, Watch, Lease and
//! Maintenance services and the operator API call [`authenticated_user`] (or
//! [`authenticated_http_user`]) and the engine's `auth_check_*`; the Watch, Lock and
//! Election services keep a request's [`Caller`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use crate::node::Node;
use crate::pb::authpb;
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::auth_server::Auth;
use crate::status;
use crate::tls::ClientCertificate;
use kvd::sync::{Arc, AtomicU64, Mutex, Ordering};
use kvd::{AuthError, AuthRequest, Error, Permission, PermissionType};

/// etcd's `--auth-token-ttl` default: a token idle this long is invalid.
pub const AUTH_TOKEN_TTL_DEFAULT: Duration = Duration::from_secs(300);
/// etcd's default bcrypt cost.
pub const BCRYPT_COST: u32 = 10;
/// Failed logins of one user name answered without delay (AUTHN-3).
pub const LOGIN_FAILURES_FREE: u32 = 5;
/// The delay after the first failure past the free ones (AUTHN-3).
pub const LOGIN_DELAY_MIN: Duration = Duration::from_millis(200);
/// The longest delay between two attempts of one user name (AUTHN-3).
pub const LOGIN_DELAY_MAX: Duration = Duration::from_secs(10);
/// A user name's failures are forgotten after this long without one (AUTHN-3).
pub const LOGIN_FAILURE_MEMORY: Duration = Duration::from_secs(900);
/// Most user names whose failures are remembered; past it the oldest are forgotten.
pub const LOGIN_NAMES_MAX: usize = 10_000;
/// Most live tokens; past it the one closest to expiry is dropped.
pub const TOKENS_MAX: usize = 100_000;
/// How often Authenticate verifies again when the auth store moved under it (AUTHN-2).
const AUTHENTICATE_ATTEMPTS_MAX: usize = 4;
/// The random letters of a token (etcd's simple token length).
const TOKEN_LETTERS: usize = 16;

/// The gRPC metadata keys a token may come in: etcd's clients send `token`, etcd's JSON
/// gateway forwards HTTP `Authorization` as `authorization`.
const TOKEN_METADATA: [&str; 2] = ["token", "authorization"];

/// The tokens and the failed-login counters of one server.
#[derive(Debug)]
pub struct Sessions {
    ttl: Duration,
    tokens: Mutex<BTreeMap<String, Token>>,
    logins: Mutex<BTreeMap<String, Failures>>,
    issued: AtomicU64,
}

#[derive(Debug, Clone)]
struct Token {
    user: String,
    expires: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
    next_slot: Instant,
}

impl Sessions {
    /// Returns an empty token store whose tokens expire after `ttl` of idleness.
    pub fn new(ttl: Duration) -> Sessions {
        Sessions {
            ttl,
            tokens: Mutex::new(BTreeMap::new()),
            logins: Mutex::new(BTreeMap::new()),
            issued: AtomicU64::new(0),
        }
    }

    /// Returns the user of a live token and pushes its expiry (AUTHN-1).
    pub fn user_of(&self, token: &str) -> Option<String> {
        let now = Instant::now();
        let mut tokens = kvd::sync::lock(&self.tokens);
        let entry = tokens.get_mut(token)?;
        if entry.expires <= now {
            tokens.remove(token);
            return None;
        }
        entry.expires = now + self.ttl;
        Some(entry.user.clone())
    }

    /// Issues a token for `user` if `still_current()` holds under the token lock (AUTHN-2).
    fn issue_if(&self, user: &str, still_current: impl FnOnce() -> bool) -> Option<String> {
        let now = Instant::now();
        let mut tokens = kvd::sync::lock(&self.tokens);
        if !still_current() {
            return None;
        }
        tokens.retain(|_, t| t.expires > now);
        while tokens.len() >= TOKENS_MAX {
            let oldest = tokens
                .iter()
                .min_by_key(|(_, t)| t.expires)
                .map(|(k, _)| k.clone())?;
            tokens.remove(&oldest);
        }
        let serial = self.issued.fetch_add(1, Ordering::Relaxed) + 1;
        let token = format!("{}.{serial}", random_letters()?);
        tokens.insert(
            token.clone(),
            Token {
                user: user.to_owned(),
                expires: now + self.ttl,
            },
        );
        Some(token)
    }

    /// Drops every token of `user` (AUTHN-1).
    pub fn drop_user(&self, user: &str) {
        kvd::sync::lock(&self.tokens).retain(|_, t| t.user != user);
    }

    /// Drops every token (AUTHN-1).
    pub fn drop_all(&self) {
        kvd::sync::lock(&self.tokens).clear();
    }

    /// Returns when the next login attempt of `user` may run, reserving that slot
    /// (AUTHN-3); `None`: at once.
    fn login_slot(&self, user: &str) -> Option<Instant> {
        let now = Instant::now();
        let mut logins = kvd::sync::lock(&self.logins);
        let entry = logins.get_mut(user)?;
        if now.duration_since(entry.last) >= LOGIN_FAILURE_MEMORY {
            logins.remove(user);
            return None;
        }
        if entry.count < LOGIN_FAILURES_FREE {
            return None;
        }
        let slot = entry.next_slot.max(now);
        entry.next_slot = slot + login_delay(entry.count);
        Some(slot)
    }

    /// Counts a failed login of `user` (AUTHN-3).
    fn login_failed(&self, user: &str) {
        let now = Instant::now();
        let mut logins = kvd::sync::lock(&self.logins);
        if logins.len() >= LOGIN_NAMES_MAX && !logins.contains_key(user) {
            let oldest = logins
                .iter()
                .min_by_key(|(_, f)| f.last)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                logins.remove(&oldest);
            }
        }
        let entry = logins.entry(user.to_owned()).or_insert(Failures {
            count: 0,
            last: now,
            next_slot: now,
        });
        entry.count = entry.count.saturating_add(1);
        entry.last = now;
    }

    /// Clears the failures of `user` after a successful login (AUTHN-3).
    fn login_succeeded(&self, user: &str) {
        kvd::sync::lock(&self.logins).remove(user);
    }
}

/// Returns the delay between two attempts after `failures` failed ones (AUTHN-3).
fn login_delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(LOGIN_FAILURES_FREE).min(16);
    LOGIN_DELAY_MIN
        .saturating_mul(1 << doublings)
        .min(LOGIN_DELAY_MAX)
}

/// Returns 16 random ASCII letters, as etcd's simple tokens start.
fn random_letters() -> Option<String> {
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut bytes = [0u8; TOKEN_LETTERS];
    getrandom::fill(&mut bytes).ok()?;
    // 52 letters: the modulo bias (256 = 4*52 + 48) leaves well over 80 bits of entropy.
    Some(
        bytes
            .iter()
            .map(|b| char::from(LETTERS[usize::from(*b) % LETTERS.len()]))
            .collect(),
    )
}

fn refusal(err: AuthError) -> Status {
    status::from_error(&Error::Auth(err))
}

/// Returns the token a request carries (`token`, else `authorization` metadata).
fn token_of(metadata: &MetadataMap) -> Option<String> {
    let value = TOKEN_METADATA
        .iter()
        .find_map(|key| metadata.get(*key))
        .and_then(|v| v.to_str().ok())?;
    Some(without_bearer(value))
}

/// Returns a token as sent, without the `Bearer ` prefix etcd 3.6.13+ strips.
fn without_bearer(value: &str) -> String {
    value.strip_prefix("Bearer ").unwrap_or(value).to_owned()
}

/// Returns the authenticated user of a gRPC request: `Ok(None)` while auth is disabled
/// (AUTHN-4) or when the request presents no identity; a token that is not live is refused
/// (AUTHN-1).
///
/// This is the one place a request's identity is resolved. A token comes first, as in
/// etcd; with none, the common name of a verified client certificate (the
/// `ClientCertificate` request extension, `--client-cert-auth`) is the user.
pub fn authenticated_user<T>(node: &Node, request: &Request<T>) -> Result<Option<String>, Status> {
    let certificate = request.extensions().get::<ClientCertificate>();
    authenticated_user_of(node, request.metadata(), certificate)
}

/// Resolves the caller of `request` and checks it is an administrator (a user holding role
/// `root`) while auth is enabled: the admin-only calls of the Auth, Maintenance and Cluster
/// services (AUTHN-5, MAINT-6, CLUSTER-3).
pub fn require_admin<T>(node: &Node, request: &Request<T>) -> Result<(), Status> {
    let user = authenticated_user(node, request)?;
    node.quick(|e| e.auth_check_admin(user.as_deref()))
}

/// [`authenticated_user`] from a request's metadata and client certificate alone (a Watch
/// stream keeps both and resolves its caller again at each create). With no token, the
/// common name of a verified client certificate (`--client-cert-auth`) is the user, as in
/// etcd.
pub fn authenticated_user_of(
    node: &Node,
    metadata: &MetadataMap,
    certificate: Option<&ClientCertificate>,
) -> Result<Option<String>, Status> {
    if !node.auth_enabled()? {
        return Ok(None);
    }
    match token_of(metadata) {
        Some(token) => node
            .sessions
            .user_of(&token)
            .map(Some)
            .ok_or_else(|| refusal(AuthError::InvalidAuthToken)),
        None => Ok(certificate.and_then(|c| c.common_name.clone())),
    }
}

/// Returns the authenticated user of an HTTP request of the operator API: a token in the
/// `Authorization` header (with or without `Bearer `) or a `token` header, as
/// [`authenticated_user`]; `Err` carries etcd's refusal.
pub fn authenticated_http_user(
    node: &Node,
    headers: &axum::http::HeaderMap,
) -> Result<Option<String>, Error> {
    let enabled = node.auth_enabled().map_err(|_| Error::Closed)?;
    if !enabled {
        return Ok(None);
    }
    let token = TOKEN_METADATA
        .iter()
        .find_map(|key| headers.get(*key))
        .and_then(|v| v.to_str().ok())
        .map(without_bearer);
    match token {
        Some(token) => node
            .sessions
            .user_of(&token)
            .map(Some)
            .ok_or(Error::Auth(AuthError::InvalidAuthToken)),
        None => Ok(None),
    }
}

/// What names a request's caller, kept beyond the request: its token metadata (the keys of
/// [`TOKEN_METADATA`] only) and its verified client certificate, if any. A Watch stream
/// resolves it again at each create; the Lock and Election services make their KV requests
/// as it (CONC-1).
#[derive(Debug, Clone)]
pub struct Caller {
    metadata: MetadataMap,
    certificate: Option<ClientCertificate>,
}

impl Caller {
    /// Returns the caller of `request`.
    pub fn of<T>(request: &Request<T>) -> Caller {
        let mut metadata = MetadataMap::new();
        for key in TOKEN_METADATA {
            if let Some(value) = request.metadata().get(key) {
                metadata.insert(key, value.clone());
            }
        }
        Caller {
            metadata,
            certificate: request.extensions().get::<ClientCertificate>().cloned(),
        }
    }

    /// Returns the caller's user, as [`authenticated_user`] resolves it now.
    pub fn user(&self, node: &Node) -> Result<Option<String>, Status> {
        authenticated_user_of(node, &self.metadata, self.certificate.as_ref())
    }

    /// Returns a request of `message` made by this caller: its token and client certificate,
    /// and nothing else of the request it came from (no operation id).
    pub fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        *request.metadata_mut() = self.metadata.clone();
        if let Some(certificate) = &self.certificate {
            request.extensions_mut().insert(certificate.clone());
        }
        request
    }
}

/// The Auth service.
#[derive(Debug, Clone)]
pub struct AuthService {
    node: Arc<Node>,
}

impl AuthService {
    /// Returns the service over `node`.
    pub fn new(node: Arc<Node>) -> AuthService {
        AuthService { node }
    }

    /// Resolves the caller and checks it is an administrator (AUTHN-5).
    fn admin<T>(&self, request: &Request<T>) -> Result<(), Status> {
        require_admin(&self.node, request)
    }

    /// Applies `change` through the engine's apply path.
    async fn apply(&self, change: AuthRequest) -> Result<u64, Status> {
        self.node
            .submit(move |engine, done| engine.submit_auth(change, done))
            .await
    }

    async fn header(&self) -> Result<Option<pb::ResponseHeader>, Status> {
        Ok(Some(self.node.current_header()?))
    }
}

/// Hashes `password` with bcrypt at etcd's cost, on the blocking pool.
async fn hash(password: String) -> Result<String, Status> {
    let hashed = tokio::task::spawn_blocking(move || bcrypt::hash(password, BCRYPT_COST))
        .await
        .map_err(|e| status::from_join_error(&e))?;
    hashed.map_err(|e| Status::internal(format!("kvd: bcrypt: {e}")))
}

/// Verifies `password` against `hash` on the blocking pool; a malformed hash never
/// matches.
async fn verify(password: String, hash: String) -> Result<bool, Status> {
    let verified = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash))
        .await
        .map_err(|e| status::from_join_error(&e))?;
    Ok(verified.unwrap_or(false))
}

/// Returns the wire form of a permission.
fn permission_to_wire(p: &Permission) -> authpb::Permission {
    authpb::Permission {
        perm_type: i32::from(p.perm_type.number()),
        key: p.key.clone().into(),
        range_end: p.range_end.clone().into(),
    }
}

/// Returns the engine's form of a wire permission; an unknown type number is refused as
/// etcd 3.6 refuses a malformed permission.
fn permission_from_wire(p: authpb::Permission) -> Result<Permission, Status> {
    let perm_type = u8::try_from(p.perm_type)
        .ok()
        .and_then(PermissionType::from_number)
        .ok_or_else(|| refusal(AuthError::InvalidAuthMgmt))?;
    Ok(Permission {
        perm_type,
        key: p.key.to_vec(),
        range_end: p.range_end.to_vec(),
    })
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_status(
        &self,
        _request: Request<pb::AuthStatusRequest>,
    ) -> Result<Response<pb::AuthStatusResponse>, Status> {
        let (enabled, auth_revision) = self.node.quick(kvd::Engine::auth_status)?;
        Ok(Response::new(pb::AuthStatusResponse {
            header: self.header().await?,
            enabled,
            auth_revision,
        }))
    }

    async fn authenticate(
        &self,
        request: Request<pb::AuthenticateRequest>,
    ) -> Result<Response<pb::AuthenticateResponse>, Status> {
        let pb::AuthenticateRequest { name, password } = request.into_inner();
        if !self.node.auth_enabled()? {
            return Err(refusal(AuthError::AuthNotEnabled));
        }
        if let Some(slot) = self.node.sessions.login_slot(&name) {
            tokio::time::sleep_until(slot.into()).await;
        }
        let sessions = &self.node.sessions;
        for _ in 0..AUTHENTICATE_ATTEMPTS_MAX {
            let (revision, user) = self.node.quick(|e| {
                let revision = e.auth_status()?.1;
                Ok((revision, e.auth_user(&name)?))
            })?;
            let Some(user) = user else {
                sessions.login_failed(&name);
                return Err(refusal(AuthError::AuthFailed));
            };
            if user.no_password {
                sessions.login_failed(&name);
                return Err(Status::unknown(AuthError::NoPasswordUser.to_string()));
            }
            if !verify(password.clone(), user.password_hash.clone()).await? {
                sessions.login_failed(&name);
                return Err(refusal(AuthError::AuthFailed));
            }
            let current = || {
                self.node
                    .quick(|e| e.auth_status())
                    .is_ok_and(|(_, r)| r == revision)
            };
            if let Some(token) = sessions.issue_if(&name, current) {
                sessions.login_succeeded(&name);
                return Ok(Response::new(pb::AuthenticateResponse {
                    header: self.header().await?,
                    token,
                }));
            }
        }
        Err(refusal(AuthError::AuthOldRevision))
    }

    async fn auth_enable(
        &self,
        request: Request<pb::AuthEnableRequest>,
    ) -> Result<Response<pb::AuthEnableResponse>, Status> {
        self.admin(&request)?;
        self.apply(AuthRequest::Enable).await?;
        tracing::info!("authentication enabled");
        Ok(Response::new(pb::AuthEnableResponse {
            header: self.header().await?,
        }))
    }

    async fn auth_disable(
        &self,
        request: Request<pb::AuthDisableRequest>,
    ) -> Result<Response<pb::AuthDisableResponse>, Status> {
        self.admin(&request)?;
        self.apply(AuthRequest::Disable).await?;
        self.node.sessions.drop_all();
        tracing::info!("authentication disabled");
        Ok(Response::new(pb::AuthDisableResponse {
            header: self.header().await?,
        }))
    }

    async fn user_add(
        &self,
        request: Request<pb::AuthUserAddRequest>,
    ) -> Result<Response<pb::AuthUserAddResponse>, Status> {
        self.admin(&request)?;
        let req = request.into_inner();
        if req.name.is_empty() {
            return Err(refusal(AuthError::UserEmpty));
        }
        let no_password = req.options.is_some_and(|o| o.no_password);
        let password_hash = if no_password {
            None
        } else {
            Some(hash(req.password).await?)
        };
        self.apply(AuthRequest::UserAdd {
            name: req.name,
            password_hash,
        })
        .await?;
        Ok(Response::new(pb::AuthUserAddResponse {
            header: self.header().await?,
        }))
    }

    async fn user_get(
        &self,
        request: Request<pb::AuthUserGetRequest>,
    ) -> Result<Response<pb::AuthUserGetResponse>, Status> {
        let caller = authenticated_user(&self.node, &request)?;
        let name = request.into_inner().name;
        let admin = self.node.quick(|e| e.auth_check_admin(caller.as_deref()));
        if admin.is_err() && caller.as_deref() != Some(name.as_str()) {
            return Err(admin
                .err()
                .unwrap_or_else(|| refusal(AuthError::PermissionDenied)));
        }
        let user = self
            .node
            .quick(|e| e.auth_user(&name))?
            .ok_or_else(|| refusal(AuthError::UserNotFound))?;
        Ok(Response::new(pb::AuthUserGetResponse {
            header: self.header().await?,
            roles: user.roles,
        }))
    }

    async fn user_list(
        &self,
        request: Request<pb::AuthUserListRequest>,
    ) -> Result<Response<pb::AuthUserListResponse>, Status> {
        self.admin(&request)?;
        let users = self.node.quick(kvd::Engine::auth_user_names)?;
        Ok(Response::new(pb::AuthUserListResponse {
            header: self.header().await?,
            users,
        }))
    }

    async fn user_delete(
        &self,
        request: Request<pb::AuthUserDeleteRequest>,
    ) -> Result<Response<pb::AuthUserDeleteResponse>, Status> {
        self.admin(&request)?;
        let name = request.into_inner().name;
        self.apply(AuthRequest::UserDelete { name: name.clone() })
            .await?;
        self.node.sessions.drop_user(&name);
        Ok(Response::new(pb::AuthUserDeleteResponse {
            header: self.header().await?,
        }))
    }

    async fn user_change_password(
        &self,
        request: Request<pb::AuthUserChangePasswordRequest>,
    ) -> Result<Response<pb::AuthUserChangePasswordResponse>, Status> {
        self.admin(&request)?;
        let req = request.into_inner();
        let password_hash = hash(req.password).await?;
        self.apply(AuthRequest::UserChangePassword {
            name: req.name.clone(),
            password_hash,
        })
        .await?;
        self.node.sessions.drop_user(&req.name);
        Ok(Response::new(pb::AuthUserChangePasswordResponse {
            header: self.header().await?,
        }))
    }

    async fn user_grant_role(
        &self,
        request: Request<pb::AuthUserGrantRoleRequest>,
    ) -> Result<Response<pb::AuthUserGrantRoleResponse>, Status> {
        self.admin(&request)?;
        let req = request.into_inner();
        self.apply(AuthRequest::UserGrantRole {
            user: req.user,
            role: req.role,
        })
        .await?;
        Ok(Response::new(pb::AuthUserGrantRoleResponse {
            header: self.header().await?,
        }))
    }

    async fn user_revoke_role(
        &self,
        request: Request<pb::AuthUserRevokeRoleRequest>,
    ) -> Result<Response<pb::AuthUserRevokeRoleResponse>, Status> {
        self.admin(&request)?;
        let req = request.into_inner();
        self.apply(AuthRequest::UserRevokeRole {
            user: req.name,
            role: req.role,
        })
        .await?;
        Ok(Response::new(pb::AuthUserRevokeRoleResponse {
            header: self.header().await?,
        }))
    }

    async fn role_add(
        &self,
        request: Request<pb::AuthRoleAddRequest>,
    ) -> Result<Response<pb::AuthRoleAddResponse>, Status> {
        self.admin(&request)?;
        let name = request.into_inner().name;
        self.apply(AuthRequest::RoleAdd { name }).await?;
        Ok(Response::new(pb::AuthRoleAddResponse {
            header: self.header().await?,
        }))
    }

    async fn role_get(
        &self,
        request: Request<pb::AuthRoleGetRequest>,
    ) -> Result<Response<pb::AuthRoleGetResponse>, Status> {
        let caller = authenticated_user(&self.node, &request)?;
        let name = request.into_inner().role;
        let admin = self.node.quick(|e| e.auth_check_admin(caller.as_deref()));
        if let Err(denied) = admin {
            let holder = caller
                .as_deref()
                .map(|c| self.node.quick(|e| e.auth_user(c)))
                .transpose()?
                .flatten();
            if !holder.is_some_and(|u| u.roles.contains(&name)) {
                return Err(denied);
            }
        }
        let role = self
            .node
            .quick(|e| e.auth_role(&name))?
            .ok_or_else(|| refusal(AuthError::RoleNotFound))?;
        Ok(Response::new(pb::AuthRoleGetResponse {
            header: self.header().await?,
            perm: role.permissions.iter().map(permission_to_wire).collect(),
        }))
    }

    async fn role_list(
        &self,
        request: Request<pb::AuthRoleListRequest>,
    ) -> Result<Response<pb::AuthRoleListResponse>, Status> {
        self.admin(&request)?;
        let roles = self.node.quick(kvd::Engine::auth_role_names)?;
        Ok(Response::new(pb::AuthRoleListResponse {
            header: self.header().await?,
            roles,
        }))
    }

    async fn role_delete(
        &self,
        request: Request<pb::AuthRoleDeleteRequest>,
    ) -> Result<Response<pb::AuthRoleDeleteResponse>, Status> {
        self.admin(&request)?;
        let name = request.into_inner().role;
        self.apply(AuthRequest::RoleDelete { name }).await?;
        Ok(Response::new(pb::AuthRoleDeleteResponse {
            header: self.header().await?,
        }))
    }

    async fn role_grant_permission(
        &self,
        request: Request<pb::AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<pb::AuthRoleGrantPermissionResponse>, Status> {
        self.admin(&request)?;
        let req = request.into_inner();
        let permission = req.perm.map(permission_from_wire).transpose()?;
        self.apply(AuthRequest::RoleGrantPermission {
            role: req.name,
            permission,
        })
        .await?;
        Ok(Response::new(pb::AuthRoleGrantPermissionResponse {
            header: self.header().await?,
        }))
    }

    async fn role_revoke_permission(
        &self,
        request: Request<pb::AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<pb::AuthRoleRevokePermissionResponse>, Status> {
        self.admin(&request)?;
        let req = request.into_inner();
        self.apply(AuthRequest::RoleRevokePermission {
            role: req.role,
            key: req.key.to_vec(),
            range_end: req.range_end.to_vec(),
        })
        .await?;
        Ok(Response::new(pb::AuthRoleRevokePermissionResponse {
            header: self.header().await?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_expire_when_idle_and_drop_by_user() {
        let sessions = Sessions::new(Duration::from_secs(60));
        let alice = sessions.issue_if("alice", || true).unwrap();
        let bob = sessions.issue_if("bob", || true).unwrap();
        assert_ne!(alice, bob);
        assert_eq!(alice.split('.').next().map(str::len), Some(16));
        assert!(sessions.issue_if("carol", || false).is_none(), "AUTHN-2");
        assert_eq!(sessions.user_of(&alice).as_deref(), Some("alice"));
        assert_eq!(sessions.user_of("forged.1"), None);
        sessions.drop_user("alice");
        assert_eq!(sessions.user_of(&alice), None);
        assert_eq!(sessions.user_of(&bob).as_deref(), Some("bob"));
        sessions.drop_all();
        assert_eq!(sessions.user_of(&bob), None);
        let short = Sessions::new(Duration::ZERO);
        let token = short.issue_if("alice", || true).unwrap();
        assert_eq!(short.user_of(&token), None, "expired");
    }

    #[test]
    fn empty_passwords_hash_and_verify_as_in_etcd() {
        // etcd accepts an empty password; a low cost keeps the test fast.
        let hash = bcrypt::hash("", 4).unwrap();
        assert!(bcrypt::verify("", &hash).unwrap());
        assert!(!bcrypt::verify("x", &hash).unwrap());
        assert!(
            bcrypt::verify("x", "not a hash").is_err(),
            "verify() maps this to false"
        );
    }

    #[test]
    fn failed_logins_past_the_free_ones_get_spaced_slots() {
        let sessions = Sessions::new(AUTH_TOKEN_TTL_DEFAULT);
        for _ in 0..LOGIN_FAILURES_FREE {
            assert!(sessions.login_slot("alice").is_none());
            sessions.login_failed("alice");
        }
        let first = sessions.login_slot("alice").unwrap();
        let second = sessions.login_slot("alice").unwrap();
        assert!(
            second >= first + LOGIN_DELAY_MIN,
            "AUTHN-3: slots are spaced"
        );
        assert!(sessions.login_slot("bob").is_none(), "per user name");
        sessions.login_succeeded("alice");
        assert!(sessions.login_slot("alice").is_none());
        assert_eq!(login_delay(LOGIN_FAILURES_FREE), LOGIN_DELAY_MIN);
        assert_eq!(login_delay(u32::MAX), LOGIN_DELAY_MAX);
    }
}
