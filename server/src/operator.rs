//! The operator API on the client port: Mesos's v1 operator calls for quota on
//! `POST /api/v1` (`UPDATE_QUOTA`, `GET_QUOTA`), kvd's calls for agents (`REGISTER_AGENT`,
//! Mesos's `MARK_AGENT_UNREACHABLE`, `MARK_AGENT_GONE`, `GET_AGENTS`), reservations,
//! allocations (preparing ones, `START`, and the allocation prepare queue length,
//! `UPDATE_PREPARE_QUEUE`), Mesos's reconciliation calls (`RECONCILE_OPERATIONS`, and
//! `RECONCILE` over the allocations, which play Mesos's tasks) and consumption
//! reconciliation on the same endpoint, and Mesos's `GET /roles` (`docs/api.md` is the
//! reference with examples).
//!
//! Owns: the JSON shapes of these requests and answers, the decoding of a request and the
//! messages for a malformed one, and the HTTP code of every engine error an operator call can
//! return.
//!
//! Invariants:
//! - OPS-1: a request is decoded completely before the engine is called, so a malformed
//!   request changes nothing; it gets a 4xx whose plain-text body says what is wrong and
//!   where (`Failed to parse body into JSON: ...`, `Failed to convert JSON into Call protobuf:
//!   ...` naming the field, `Failed to validate master::Call: Expecting '<field>' to be
//!   present`), in Mesos's order of checks (`Content-Type`, `Accept`, JSON, shape).
//! - OPS-2: engine calls run on the blocking pool (NODE-1), one engine call per request
//!   (`RECONCILE_CONSUMPTION` with `repair`: the drift check, then the repair).
//! - OPS-3: every engine error becomes an HTTP answer through one exhaustive `match` with no
//!   `_` arm ([`http_code`]). A refused request (`QuotaRequest`, `QuotaExceeded`) is a 400
//!   whose plain-text body is the engine's message verbatim: Mesos's text for UPDATE_QUOTA,
//!   which operators and clients match. A full allocation prepare queue is a 429 with
//!   `Retry-After` (the engine's `ALLOCATION_RETRY_AFTER`, Velero's requeue interval).
//! - OPS-4: a scalar is printed as Mesos prints it (QUOTA-2: three decimals, then fifteen
//!   significant digits), as a JSON integer when that is whole (`{"value":1}`), else as the
//!   shortest decimal that reads back as it (`1.2345` was stored as `1.235` and prints
//!   `1.235`).
//! - OPS-5: answers are deterministic: configurations and roles sorted by role, resources by
//!   name, object keys in Mesos's order. Empty maps and lists are left out of GET_QUOTA, as
//!   Mesos leaves them out; `/roles` always shows every field, `{}` when empty.
//! - OPS-6: a call that changes something may carry a top-level `"operation_id"` beside
//!   `"type"` (checked as OPID-1; on any other call it is refused), which the engine makes
//!   exactly-once (OPER-2): a retry with the same id and the same call gets the same answer
//!   without being applied again, another call under the id gets a 409. The reconciliation
//!   calls are answered synchronously, in apply order: kvd has no event stream.
//! - OPS-7: while auth is enabled every call (and `GET /roles`) needs a token of a user
//!   with role `root` (`Authorization: <token>`, `Bearer ` accepted, or a `token` header),
//!   checked before anything else: 401 without a live token, 403 for another user. Auth
//!   roles and quota roles are one namespace: role `dev` of the Auth API is quota role
//!   `dev`.
//!
//! Contact points: `server::http` routes `POST /api/v1` to [`api`] and `GET /roles` to
//! [`roles`]; the engine's quota methods (`Engine::update_quota`, `get_quota`, `roles`,
//! `register_agent`, `reserve`, `unreserve`, `allocate`, `prepare_allocation`,
//! `start_allocation`, `release`, `update_prepare_queue`, `consumption_drift`,
//! `repair_consumption`) do the work; `server::metrics` renders the same registry and
//! consumption as Prometheus gauges.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::node::Node;
use crate::operation;
use kvd::Engine;
use kvd::quota::{QuotaConfig, RawQuotaConfig, SCALAR_MILLI_PER_UNIT, Scalar};
use kvd::sync::Arc;
use kvd::{AccountingRequest, Agent, AgentState, Counters, RecordKind, RoleQueue, RoleUsage};
use kvd::{AuthError, Error, StorageError};
use kvd::{OperationQuery, OperationStatus, TaskQuery, TaskStatus, WriteOptions};

/// Mesos's prefix for a body that is not JSON.
const PARSE_PREFIX: &str = "Failed to parse body into JSON: ";
/// Mesos's prefix for JSON that does not have the shape of a call.
const CONVERT_PREFIX: &str = "Failed to convert JSON into Call protobuf: ";
/// Mesos's prefix for a call that lacks the object its type needs.
const VALIDATE_PREFIX: &str = "Failed to validate master::Call: ";
/// How messages name the top-level object of a request.
const ROOT_PATH: &str = "Call";
/// The only media type the API reads and writes.
const JSON_MEDIA_TYPE: &str = "application/json";
/// The call types `POST /api/v1` serves, as the unknown-type message lists them.
const CALL_TYPES: [&str; 15] = [
    "GET_QUOTA",
    "UPDATE_QUOTA",
    "REGISTER_AGENT",
    "MARK_AGENT_UNREACHABLE",
    "MARK_AGENT_GONE",
    "GET_AGENTS",
    "RESERVE_RESOURCES",
    "UNRESERVE_RESOURCES",
    "ALLOCATE",
    "START",
    "RELEASE",
    "UPDATE_PREPARE_QUEUE",
    "RECONCILE_OPERATIONS",
    "RECONCILE",
    "RECONCILE_CONSUMPTION",
];
/// The top-level field that carries a write's operation id (OPS-6).
const OPERATION_ID_FIELD: &str = "operation_id";
/// Whole doubles below this are exact integers (2^53).
const WHOLE_F64_MAX: f64 = 9_007_199_254_740_992.0;
/// The weight `/roles` shows: kvd has no role weights, and Mesos's default is 1.
const ROLE_WEIGHT_DEFAULT: f64 = 1.0;

/// One decoded `POST /api/v1` call (OPS-1: nothing in it is checked by the engine yet).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Call {
    GetQuota,
    /// A registry, agent or record change, applied as the engine's own request with the
    /// call's operation id (OPS-6).
    Write(AccountingRequest, WriteOptions),
    GetAgents,
    ReconcileOperations {
        queries: Vec<OperationQuery>,
        prefix: String,
    },
    Reconcile {
        tasks: Vec<TaskQuery>,
        partition_aware: bool,
    },
    ReconcileConsumption {
        repair: bool,
    },
}

/// A request the API does not carry out: an HTTP code and a plain-text message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) code: StatusCode,
    pub(crate) message: String,
    /// Seconds for a `Retry-After` header (a full prepare queue).
    pub(crate) retry_after_secs: Option<u64>,
}

impl Refusal {
    fn new(code: StatusCode, message: String) -> Refusal {
        Refusal {
            code,
            message,
            retry_after_secs: None,
        }
    }

    fn bad_request(message: String) -> Refusal {
        Refusal::new(StatusCode::BAD_REQUEST, message)
    }

    /// Returns the refusal for an engine error (OPS-3).
    fn from_engine(err: &Error) -> Refusal {
        Refusal {
            code: http_code(err),
            message: err.to_string(),
            // HTTP counts whole seconds: round the engine's hint up.
            retry_after_secs: err.retry_after_ms().map(|ms| ms.div_ceil(1000).max(1)),
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut response = (self.code, self.message).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// Returns the HTTP code of an engine error (OPS-3: no `_` arm).
fn http_code(err: &Error) -> StatusCode {
    match err {
        // Mesos answers its validation errors with 400 and the message as the body.
        Error::QuotaRequest(_) | Error::QuotaExceeded(_) | Error::InvalidArgument(_) => {
            StatusCode::BAD_REQUEST
        }
        Error::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Error::TooManyRequests { .. } | Error::AllocationPrepareQueueFull(_) => {
            StatusCode::TOO_MANY_REQUESTS
        }
        Error::NoSpace => StatusCode::INSUFFICIENT_STORAGE,
        // The id names another request's outcome (OPER-2).
        Error::OperationIdReused(_) => StatusCode::CONFLICT,
        Error::Corrupt | Error::Closed => StatusCode::SERVICE_UNAVAILABLE,
        // Key and lease errors: no operator call produces them. Should one arrive, it refused
        // the request, so it is the client's 400 rather than a server failure.
        Error::KeyNotProvided
        | Error::KeyNotFound
        | Error::ValueProvided
        | Error::LeaseProvided
        | Error::TooManyTxnOps
        | Error::DuplicateKey
        | Error::Compacted
        | Error::FutureRevision
        | Error::LeaseNotFound
        | Error::LeaseExists
        | Error::LeaseTtlTooLarge => StatusCode::BAD_REQUEST,
        Error::Auth(auth) => match auth {
            AuthError::UserEmpty | AuthError::InvalidAuthToken => StatusCode::UNAUTHORIZED,
            AuthError::PermissionDenied | AuthError::UserNotFound => StatusCode::FORBIDDEN,
            AuthError::RootUserNotExist
            | AuthError::RootRoleNotGranted
            | AuthError::UserAlreadyExist
            | AuthError::RoleAlreadyExist
            | AuthError::RoleNotFound
            | AuthError::RoleEmpty
            | AuthError::AuthFailed
            | AuthError::RoleNotGranted
            | AuthError::PermissionNotGranted
            | AuthError::AuthNotEnabled
            | AuthError::InvalidAuthMgmt
            | AuthError::AuthOldRevision
            | AuthError::PermissionNotGiven
            | AuthError::NoPasswordUser => StatusCode::BAD_REQUEST,
        },
        Error::Storage(storage) => match storage {
            // The request may succeed once the operator repairs the disk and restarts.
            StorageError::Locked { .. } | StorageError::Io(_) | StorageError::Poisoned(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            StorageError::Corrupted(_)
            | StorageError::UnsupportedSchema { .. }
            | StorageError::OlderSchema { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        },
    }
}

/// `POST /api/v1`: decodes the call (OPS-1), runs it on the engine (OPS-2) and answers.
pub async fn api(State(node): State<Arc<Node>>, headers: HeaderMap, body: Bytes) -> Response {
    let checked = require_root(&node, &headers)
        .and_then(|()| check_headers(&headers))
        .and_then(|()| decode_call(&body));
    let answer = match checked {
        Ok(call) => execute(&node, call).await,
        Err(refusal) => Err(refusal),
    };
    match answer {
        Ok(response) => response,
        Err(refusal) => {
            tracing::debug!(code = refusal.code.as_u16(), message = %refusal.message, "operator call refused");
            refusal.into_response()
        }
    }
}

/// `GET /roles`: every role with a quota, consumption or a reservation.
pub async fn roles(State(node): State<Arc<Node>>, headers: HeaderMap) -> Response {
    if let Err(refusal) = require_root(&node, &headers) {
        return refusal.into_response();
    }
    let all = |engine: &Engine| Ok((engine.roles()?, engine.prepare_queue()?, engine.agents()?));
    match run(&node, all).await {
        Ok((roles, queue, agents)) => {
            let mut body = roles_json(&roles, &queue);
            body["agents"] = agents_json(&agents);
            json_response(&body)
        }
        Err(refusal) => refusal.into_response(),
    }
}

/// Checks that the caller holds role `root` while auth is enabled (OPS-7): 401 without a
/// live token, 403 for a user without the role.
fn require_root(node: &Node, headers: &HeaderMap) -> Result<(), Refusal> {
    let user = crate::auth::authenticated_http_user(node, headers).map_err(|e| {
        Refusal::new(
            http_code(&e),
            format!(
                "{e}: the operator API needs a token of a user with role root while \
                 authentication is enabled (Authenticate, then send the token in the \
                 Authorization header)"
            ),
        )
    })?;
    let Some(user) = user else {
        if !node
            .auth_enabled()
            .map_err(|_| Refusal::from_engine(&Error::Closed))?
        {
            return Ok(());
        }
        return Err(Refusal::new(
            StatusCode::UNAUTHORIZED,
            "kvd: authentication is enabled: the operator API needs a token of a user with \
             role root (Authenticate, then send the token in the Authorization header)"
                .to_owned(),
        ));
    };
    match node.quick(|e| e.auth_is_root(Some(&user))) {
        Ok(true) => Ok(()),
        Ok(false) => Err(Refusal::new(
            StatusCode::FORBIDDEN,
            format!("kvd: the operator API needs role root; user '{user}' does not hold it"),
        )),
        Err(_) => Err(Refusal::from_engine(&Error::Closed)),
    }
}

/// Checks the media types as Mesos's `/api/v1` does: a JSON body, and an answer the client
/// accepts as JSON.
fn check_headers(headers: &HeaderMap) -> Result<(), Refusal> {
    let Some(content_type) = headers.get(header::CONTENT_TYPE) else {
        return Err(Refusal::bad_request(
            "Expecting 'Content-Type' to be present".to_owned(),
        ));
    };
    if media_type(content_type).as_deref() != Some(JSON_MEDIA_TYPE) {
        return Err(Refusal::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("Expecting 'Content-Type' of {JSON_MEDIA_TYPE}"),
        ));
    }
    let accepted = headers.get_all(header::ACCEPT).iter().all(|accept| {
        accept.to_str().is_ok_and(|ranges| {
            ranges.split(',').any(|range| {
                let media = range.split(';').next().unwrap_or("").trim();
                media.eq_ignore_ascii_case(JSON_MEDIA_TYPE)
                    || media.eq_ignore_ascii_case("application/*")
                    || media == "*/*"
            })
        })
    });
    if !accepted {
        return Err(Refusal::new(
            StatusCode::NOT_ACCEPTABLE,
            format!("Expecting 'Accept' to allow {JSON_MEDIA_TYPE}"),
        ));
    }
    Ok(())
}

/// Returns the media type of a header value, lower case, without parameters.
fn media_type(value: &HeaderValue) -> Option<String> {
    let text = value.to_str().ok()?;
    Some(text.split(';').next()?.trim().to_ascii_lowercase())
}

/// Decodes a call from its JSON body (OPS-1).
pub(crate) fn decode_call(body: &[u8]) -> Result<Call, Refusal> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| Refusal::bad_request(format!("{PARSE_PREFIX}{e}")))?;
    decode_value(&value)
}

/// Decodes a call from parsed JSON: the shape first, then the arguments its type needs.
fn decode_value(value: &Value) -> Result<Call, Refusal> {
    let convert = |message: String| Refusal::bad_request(format!("{CONVERT_PREFIX}{message}"));
    let call = Fields::of(value, ROOT_PATH).map_err(convert)?;
    let Some(kind) = call.string("type").map_err(convert)? else {
        return Err(Refusal::bad_request(format!(
            "{VALIDATE_PREFIX}Expecting 'type' to be present"
        )));
    };
    let options = decode_operation_id(&call)?;
    let call = decode_type(&call, kind)?;
    match (call, options.operation_id) {
        (Call::Write(request, _), operation_id) => Ok(Call::Write(
            request,
            WriteOptions {
                operation_id,
                ..WriteOptions::default()
            },
        )),
        (call, None) => Ok(call),
        (_, Some(_)) => Err(Refusal::bad_request(format!(
            "{VALIDATE_PREFIX}'{OPERATION_ID_FIELD}' is only accepted on calls that change \
             something, not on {kind}"
        ))),
    }
}

/// Decodes the top-level `"operation_id"` (OPS-6, OPID-1).
fn decode_operation_id(call: &Fields<'_>) -> Result<WriteOptions, Refusal> {
    let convert = |message: String| Refusal::bad_request(format!("{CONVERT_PREFIX}{message}"));
    let Some(id) = call.string(OPERATION_ID_FIELD).map_err(convert)? else {
        return Ok(WriteOptions::default());
    };
    match operation::check_id(id) {
        Ok(()) => Ok(WriteOptions::with_operation_id(id)),
        // OPS-1: a decoding refusal keeps Mesos's prefix; the reason is the engine's.
        Err(kvd::Error::InvalidArgument(what)) => {
            Err(Refusal::bad_request(format!("{VALIDATE_PREFIX}{what}")))
        }
        Err(other) => Err(Refusal::bad_request(format!("{VALIDATE_PREFIX}{other}"))),
    }
}

/// Decodes the arguments of a call of type `kind`; a write comes without its options.
fn decode_type(call: &Fields<'_>, kind: &str) -> Result<Call, Refusal> {
    let convert = |message: String| Refusal::bad_request(format!("{CONVERT_PREFIX}{message}"));
    // The object that carries a type's arguments is named after the type in lower case.
    let field = kind.to_ascii_lowercase();
    let write = |request| Call::Write(request, WriteOptions::default());
    let agent_id = |call: &Fields<'_>| -> Result<String, Refusal> {
        required(call, &field)?
            .required_string("agent_id")
            .map(str::to_owned)
            .map_err(convert)
    };
    let decoded = match kind {
        "GET_QUOTA" => Ok(Call::GetQuota),
        "UPDATE_QUOTA" => decode_update_quota(&required(call, &field)?),
        "REGISTER_AGENT" => decode_agent(&required(call, &field)?),
        "MARK_AGENT_UNREACHABLE" => Ok(write(AccountingRequest::MarkAgentUnreachable {
            id: agent_id(call)?,
        })),
        "MARK_AGENT_GONE" => Ok(write(AccountingRequest::MarkAgentGone {
            id: agent_id(call)?,
        })),
        "GET_AGENTS" => Ok(Call::GetAgents),
        "RECONCILE_OPERATIONS" => match call.object(&field).map_err(convert)? {
            Some(f) => decode_reconcile_operations(&f),
            None => Ok(Call::ReconcileOperations {
                queries: Vec::new(),
                prefix: String::new(),
            }),
        },
        "RECONCILE" => match call.object(&field).map_err(convert)? {
            Some(f) => decode_reconcile(&f),
            None => Ok(Call::Reconcile {
                tasks: Vec::new(),
                partition_aware: false,
            }),
        },
        "RESERVE_RESOURCES" => decode_record(RecordKind::Reservation, &required(call, &field)?),
        "ALLOCATE" => decode_record(RecordKind::Allocation, &required(call, &field)?),
        "START" => required(call, &field)?
            .required_string("id")
            .map(|id| write(AccountingRequest::Start { id: id.to_owned() })),
        "UNRESERVE_RESOURCES" => decode_removal(RecordKind::Reservation, &required(call, &field)?),
        "RELEASE" => decode_removal(RecordKind::Allocation, &required(call, &field)?),
        "UPDATE_PREPARE_QUEUE" => required(call, &field)?
            .required_u64("allocation_prepare_queue_length")
            .map(|allocation_prepare_queue_length| {
                write(AccountingRequest::UpdatePrepareQueue {
                    allocation_prepare_queue_length,
                })
            }),
        "RECONCILE_CONSUMPTION" => match call.object(&field).map_err(convert)? {
            Some(f) => f.bool("repair").map(|repair| Call::ReconcileConsumption {
                repair: repair.unwrap_or(false),
            }),
            None => Ok(Call::ReconcileConsumption { repair: false }),
        },
        unknown => Err(format!(
            "Unknown call type '{unknown}'; kvd serves {}",
            CALL_TYPES.join(", ")
        )),
    };
    decoded.map_err(convert)
}

/// Returns the object `field` of `call`, which its type needs (Mesos's validation message if
/// it is absent).
fn required<'v>(call: &Fields<'v>, field: &str) -> Result<Fields<'v>, Refusal> {
    match call.object(field) {
        Ok(Some(fields)) => Ok(fields),
        Ok(None) => Err(Refusal::bad_request(format!(
            "{VALIDATE_PREFIX}Expecting '{field}' to be present"
        ))),
        Err(message) => Err(Refusal::bad_request(format!("{CONVERT_PREFIX}{message}"))),
    }
}

fn decode_update_quota(fields: &Fields<'_>) -> Result<Call, String> {
    let force = fields.bool("force")?.unwrap_or(false);
    let mut configs = Vec::new();
    for (i, item) in fields.array("quota_configs")?.iter().enumerate() {
        let config = Fields::of(item, &format!("{}.quota_configs[{i}]", fields.path))?;
        configs.push(RawQuotaConfig {
            role: config.required_string("role")?.to_owned(),
            guarantees: config.scalars("guarantees")?,
            limits: config.scalars("limits")?,
        });
    }
    Ok(Call::Write(
        AccountingRequest::UpdateQuota { configs, force },
        WriteOptions::default(),
    ))
}

/// Decodes RECONCILE_OPERATIONS: the operations asked about (none: every retained one) and
/// the id prefix of an implicit query.
fn decode_reconcile_operations(fields: &Fields<'_>) -> Result<Call, String> {
    let mut queries = Vec::new();
    for (i, item) in fields.array("operations")?.iter().enumerate() {
        let operation = Fields::of(item, &format!("{}.operations[{i}]", fields.path))?;
        queries.push(OperationQuery {
            operation_id: operation.required_string("operation_id")?.to_owned(),
            agent_id: operation.string("agent_id")?.map(str::to_owned),
        });
    }
    Ok(Call::ReconcileOperations {
        queries,
        prefix: fields.string("prefix")?.unwrap_or("").to_owned(),
    })
}

/// Decodes RECONCILE: the allocations asked about as Mesos's tasks (none: every live one)
/// and whether the caller is partition-aware (default: not, as a Mesos framework that
/// does not declare the capability).
fn decode_reconcile(fields: &Fields<'_>) -> Result<Call, String> {
    let mut tasks = Vec::new();
    for (i, item) in fields.array("tasks")?.iter().enumerate() {
        let task = Fields::of(item, &format!("{}.tasks[{i}]", fields.path))?;
        tasks.push(TaskQuery {
            task_id: task.required_string("task_id")?.to_owned(),
            agent_id: task.string("agent_id")?.map(str::to_owned),
        });
    }
    Ok(Call::Reconcile {
        tasks,
        partition_aware: fields.bool("partition_aware")?.unwrap_or(false),
    })
}

fn decode_agent(fields: &Fields<'_>) -> Result<Call, String> {
    let state = match fields.string("state")? {
        None | Some("REGISTERED") => AgentState::Registered,
        Some("UNREACHABLE") => AgentState::Unreachable,
        Some("GONE") => AgentState::Gone,
        Some(other) => {
            return Err(format!(
                "Unknown agent state '{other}' for field '{}.state'; expected REGISTERED, \
                 UNREACHABLE or GONE",
                fields.path
            ));
        }
    };
    Ok(Call::Write(
        AccountingRequest::RegisterAgent {
            id: fields.required_string("agent_id")?.to_owned(),
            state,
            resources: fields.scalars("resources")?,
        },
        WriteOptions::default(),
    ))
}

/// Decodes RESERVE_RESOURCES or ALLOCATE: the id, role, agent and resources of a record,
/// and for ALLOCATE whether it is `prepare`d (RESERVE_RESOURCES ignores the field, as any
/// unknown field).
fn decode_record(kind: RecordKind, fields: &Fields<'_>) -> Result<Call, String> {
    let prepare = match kind {
        RecordKind::Allocation => fields.bool("prepare")?.unwrap_or(false),
        RecordKind::Reservation => false,
    };
    Ok(Call::Write(
        AccountingRequest::Record {
            kind,
            id: fields.required_string("id")?.to_owned(),
            role: fields.required_string("role")?.to_owned(),
            agent: fields.required_string("agent_id")?.to_owned(),
            resources: fields.scalars("resources")?,
            prepare,
        },
        WriteOptions::default(),
    ))
}

/// Decodes UNRESERVE_RESOURCES or RELEASE: the id of the record to remove.
fn decode_removal(kind: RecordKind, fields: &Fields<'_>) -> Result<Call, String> {
    let id = fields.required_string("id")?.to_owned();
    Ok(Call::Write(
        AccountingRequest::Remove { kind, id },
        WriteOptions::default(),
    ))
}

/// A JSON object being decoded, with its path for messages (`update_quota.quota_configs[0]`).
/// A field that is `null` counts as absent.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    path: String,
}

impl<'a> Fields<'a> {
    /// Returns `value` as an object at `path`, or says what it is instead.
    fn of(value: &'a Value, path: &str) -> Result<Fields<'a>, String> {
        match value {
            Value::Object(map) => Ok(Fields {
                map,
                path: path.to_owned(),
            }),
            other => Err(wrong_type("object", other, path)),
        }
    }

    /// Returns the path of field `name`; the top-level object is the call itself (`Call` in
    /// messages about it), so its fields are named without a prefix (`update_quota.force`).
    fn field_path(&self, name: &str) -> String {
        if self.path == ROOT_PATH {
            name.to_owned()
        } else {
            format!("{}.{name}", self.path)
        }
    }

    fn get(&self, name: &str) -> Option<&'a Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    fn string(&self, name: &str) -> Result<Option<&'a str>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(wrong_type("string", other, &self.field_path(name))),
        }
    }

    fn required_string(&self, name: &str) -> Result<&'a str, String> {
        self.string(name)?
            .ok_or_else(|| format!("Missing required fields: {}", self.field_path(name)))
    }

    /// Returns the required non-negative integer `name`: a JSON number, or a string holding
    /// one (protobuf's JSON form of a 64-bit integer).
    fn required_u64(&self, name: &str) -> Result<u64, String> {
        let path = self.field_path(name);
        let parsed = match self.get(name) {
            None => return Err(format!("Missing required fields: {path}")),
            Some(Value::Number(n)) => n.as_u64(),
            Some(Value::String(s)) => s.trim().parse::<u64>().ok(),
            Some(other) => return Err(wrong_type("number", other, &path)),
        };
        parsed.ok_or_else(|| {
            format!(
                "Failed to parse {} as a non-negative integer for field '{path}'",
                self.get(name).map_or_else(String::new, Value::to_string)
            )
        })
    }

    fn bool(&self, name: &str) -> Result<Option<bool>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(wrong_type("boolean", other, &self.field_path(name))),
        }
    }

    fn object(&self, name: &str) -> Result<Option<Fields<'a>>, String> {
        self.get(name)
            .map(|value| Fields::of(value, &self.field_path(name)))
            .transpose()
    }

    /// Returns the array `name`; an absent one is empty (a repeated protobuf field).
    fn array(&self, name: &str) -> Result<&'a [Value], String> {
        match self.get(name) {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(other) => Err(wrong_type("array", other, &self.field_path(name))),
        }
    }

    /// Returns the map `name` of `Value.Scalar`s (`{"cpus":{"value":1}}`) as raw doubles;
    /// absent is empty. A value may be a JSON number or a string holding one (`"inf"`,
    /// `"nan"`), as Mesos's JSON conversion accepts strings for numeric fields; the engine
    /// judges the double.
    fn scalars(&self, name: &str) -> Result<BTreeMap<String, f64>, String> {
        let Some(value) = self.get(name) else {
            return Ok(BTreeMap::new());
        };
        let map = Fields::of(value, &self.field_path(name))?;
        let mut out = BTreeMap::new();
        for (resource, entry) in map.map {
            let entry = Fields::of(entry, &format!("{}[{resource}]", map.path))?;
            let path = entry.field_path("value");
            let number = match entry.get("value") {
                None => return Err(format!("Missing required fields: {path}")),
                Some(Value::Number(n)) => n.as_f64(),
                Some(Value::String(s)) => s.trim().parse::<f64>().ok(),
                Some(other) => return Err(wrong_type("number", other, &path)),
            };
            let Some(number) = number else {
                return Err(format!(
                    "Failed to parse {} as a number for field '{path}'",
                    entry
                        .get("value")
                        .map_or_else(String::new, Value::to_string)
                ));
            };
            out.insert(resource.clone(), number);
        }
        Ok(out)
    }
}

/// Returns the message for a field of the wrong JSON type.
fn wrong_type(expected: &str, found: &Value, path: &str) -> String {
    let found = match found {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    format!("Expecting a JSON {expected} for field '{path}', found a JSON {found}")
}

/// Runs `f` on the engine's blocking pool (OPS-2) and maps its error (OPS-3).
async fn run<T, F>(node: &Node, f: F) -> Result<T, Refusal>
where
    F: FnOnce(&Engine) -> kvd::Result<T> + Send + 'static,
    T: Send + 'static,
{
    // The engine's own error is kept (not turned into a gRPC status) so that it maps to
    // its HTTP code; the outer error is only a task that did not finish.
    match node.call(move |engine| Ok(f(engine))).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(Refusal::from_engine(&err)),
        Err(status) => {
            let code = if status.code() == tonic::Code::Unavailable {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::INTERNAL_SERVER_ERROR
            };
            Err(Refusal::new(code, status.message().to_owned()))
        }
    }
}

/// Runs a decoded call and returns its answer.
async fn execute(node: &Node, call: Call) -> Result<Response, Refusal> {
    match call {
        Call::GetQuota => {
            let configs = run(node, Engine::get_quota).await?;
            Ok(json_response(&get_quota_json(&configs)))
        }
        Call::Write(request, options) => {
            let logged = format!("{request:?}");
            let with = options.clone();
            run(node, move |engine| {
                engine.apply_accounting_with(request, &with)
            })
            .await?;
            tracing::info!(
                request = %logged,
                operation_id = options.operation_id.as_deref().unwrap_or(""),
                "operator request applied"
            );
            if node.drop_after_commit.take(&options) {
                tracing::warn!("test failpoint: dropping the answer of an applied operator call");
                return Err(Refusal::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    operation::DROPPED_MESSAGE.to_owned(),
                ));
            }
            Ok(StatusCode::OK.into_response())
        }
        Call::GetAgents => {
            let agents = run(node, Engine::agents).await?;
            Ok(json_response(&json!({
                "type": "GET_AGENTS",
                "get_agents": { "agents": agents_json(&agents) },
            })))
        }
        Call::ReconcileOperations { queries, prefix } => {
            let statuses = run(node, move |engine| {
                engine.reconcile_operations(queries, &prefix)
            })
            .await?;
            let statuses: Vec<Value> = statuses.iter().map(operation_status_json).collect();
            Ok(json_response(&json!({
                "type": "RECONCILE_OPERATIONS",
                "reconcile_operations": { "operation_statuses": statuses },
            })))
        }
        Call::Reconcile {
            tasks,
            partition_aware,
        } => {
            let statuses = run(node, move |engine| {
                engine.reconcile_tasks(tasks, partition_aware)
            })
            .await?;
            let statuses: Vec<Value> = statuses.iter().map(task_status_json).collect();
            Ok(json_response(&json!({
                "type": "RECONCILE",
                "reconcile": { "statuses": statuses },
            })))
        }
        Call::ReconcileConsumption { repair } => {
            let drift = run(node, Engine::consumption_drift).await?;
            let repaired = if repair {
                let changed = run(node, Engine::repair_consumption).await?;
                tracing::info!(
                    drifted = drift.len(),
                    repaired = changed,
                    "consumption reconciled"
                );
                Some(changed)
            } else {
                None
            };
            Ok(json_response(&reconcile_json(&drift, repaired)))
        }
    }
}

/// Returns a 200 with a JSON body.
fn json_response(body: &Value) -> Response {
    let mut response = (StatusCode::OK, body.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(JSON_MEDIA_TYPE),
    );
    response
}

/// Returns milli-units as a JSON number in units (OPS-4).
fn units(milli: i64) -> Value {
    if milli % SCALAR_MILLI_PER_UNIT == 0 {
        return Value::from(milli / SCALAR_MILLI_PER_UNIT);
    }
    // Scalar prints Mesos's way (three decimals, then %.15g); the shortest double that reads
    // back as that text prints as the same digits.
    let magnitude = Scalar::from_milli(milli.saturating_abs()).unwrap_or(Scalar::MAX);
    let value = magnitude.to_string().parse::<f64>().unwrap_or(f64::NAN);
    let value = if milli < 0 { -value } else { value };
    // Fifteen significant digits can round a fraction away (1000000000000.001 prints as
    // 1000000000000): print what is left as an integer too.
    if value.fract() == 0.0 && value.abs() < WHOLE_F64_MAX {
        // Exact: a whole double below 2^53 converts to i64 without loss.
        return Value::from(value as i64);
    }
    Value::from(value)
}

/// Returns `{"name": number, ...}` for resources with non-zero amounts, sorted by name.
fn quantities_json<'a>(amounts: impl IntoIterator<Item = (&'a str, i64)>) -> Value {
    Value::Object(
        amounts
            .into_iter()
            .filter(|(_, milli)| *milli != 0)
            .map(|(name, milli)| (name.to_owned(), units(milli)))
            .collect(),
    )
}

/// Returns `{"name": {"value": number}, ...}`, a protobuf `map<string, Value.Scalar>`.
fn scalar_map_json<'a>(entries: impl IntoIterator<Item = (&'a str, Scalar)>) -> Map<String, Value> {
    entries
        .into_iter()
        .map(|(name, value)| (name.to_owned(), json!({ "value": units(value.milli()) })))
        .collect()
}

/// The GET_QUOTA answer: legacy `infos` (guarantees only) and `configs`, empty
/// maps and lists left out.
pub(crate) fn get_quota_json(configs: &[QuotaConfig]) -> Value {
    let mut status = Map::new();
    if !configs.is_empty() {
        let infos: Vec<Value> = configs.iter().map(info_json).collect();
        let configs: Vec<Value> = configs.iter().map(config_json).collect();
        status.insert("infos".to_owned(), Value::Array(infos));
        status.insert("configs".to_owned(), Value::Array(configs));
    }
    json!({ "type": "GET_QUOTA", "get_quota": { "status": status } })
}

/// A legacy `QuotaInfo`: the role and its guarantees as scalar `Resource`s.
fn info_json(config: &QuotaConfig) -> Value {
    let mut info = Map::new();
    info.insert("role".to_owned(), Value::from(config.role.as_str()));
    let guarantee: Vec<Value> = config
        .guarantees
        .iter()
        .map(|(name, value)| {
            json!({ "name": name, "type": "SCALAR", "scalar": { "value": units(value.milli()) } })
        })
        .collect();
    if !guarantee.is_empty() {
        info.insert("guarantee".to_owned(), Value::Array(guarantee));
    }
    Value::Object(info)
}

/// A `QuotaConfig`; a zero limit is kept, empty maps are left out.
fn config_json(config: &QuotaConfig) -> Value {
    let mut out = Map::new();
    out.insert("role".to_owned(), Value::from(config.role.as_str()));
    let guarantees = scalar_map_json(config.guarantees.iter());
    if !guarantees.is_empty() {
        out.insert("guarantees".to_owned(), Value::Object(guarantees));
    }
    let limits = scalar_map_json(config.limits.iter());
    if !limits.is_empty() {
        out.insert("limits".to_owned(), Value::Object(limits));
    }
    Value::Object(out)
}

/// The `/roles` answer. kvd has no frameworks and no weights: `frameworks` is
/// always empty and `weight` is Mesos's default.
/// The `/roles` answer: every role with usage or a quota, and every role with writes in the
/// prepare queue or refused by it, each with its `prepare_queue` figures.
fn roles_json(roles: &[RoleUsage], queue: &[RoleQueue]) -> Value {
    let mut all: BTreeMap<&str, (Option<&RoleUsage>, Option<&RoleQueue>)> = BTreeMap::new();
    for role in roles {
        all.entry(role.role.as_str()).or_default().0 = Some(role);
    }
    for q in queue {
        all.entry(q.role.as_str()).or_default().1 = Some(q);
    }
    let roles: Vec<Value> = all
        .into_iter()
        .map(|(name, (usage, q))| {
            let empty = RoleUsage {
                role: name.to_owned(),
                ..RoleUsage::default()
            };
            let mut value = role_json(usage.unwrap_or(&empty));
            value["prepare_queue"] = json!({
                "queued": q.map_or(0, |q| q.queued),
                "refused": q.map_or(0, |q| q.refused),
            });
            value
        })
        .collect();
    json!({ "roles": roles })
}

fn role_json(role: &RoleUsage) -> Value {
    let counters = |f: fn(&Counters) -> i64| {
        quantities_json(role.resources.iter().map(|(n, c)| (n.as_str(), f(c))))
    };
    let (guarantee, limit) = match &role.quota {
        Some(config) => (
            quantities_json(config.guarantees.iter().map(|(n, v)| (n, v.milli()))),
            // A zero limit is a limit: it stays in the map.
            Value::Object(
                config
                    .limits
                    .iter()
                    .map(|(n, v)| (n.to_owned(), units(v.milli())))
                    .collect(),
            ),
        ),
        None => (json!({}), json!({})),
    };
    json!({
        "name": role.role,
        "weight": ROLE_WEIGHT_DEFAULT,
        "quota": {
            "role": role.role,
            "guarantee": guarantee,
            "limit": limit,
            "consumed": counters(Counters::consumed),
        },
        "allocated": counters(|c| c.allocated),
        "offered": counters(|c| c.offered),
        "reserved": counters(|c| c.reserved),
        // Mesos's deprecated field: allocated plus offered.
        "resources": counters(|c| c.allocated.saturating_add(c.offered)),
        "frameworks": [],
    })
}

/// Every agent as GET_AGENTS and `/roles` show it, by id: its state, total resources and,
/// for an unreachable one, since when (`{"nanoseconds": N}`, Mesos's `TimeInfo`).
fn agents_json(agents: &BTreeMap<String, Agent>) -> Value {
    let agents: Vec<Value> = agents
        .iter()
        .map(|(id, agent)| {
            let mut out = Map::new();
            out.insert("agent_id".to_owned(), Value::from(id.as_str()));
            out.insert("state".to_owned(), Value::from(agent.state.name()));
            out.insert(
                "resources".to_owned(),
                Value::Object(scalar_map_json(agent.resources.iter())),
            );
            if let Some(nanos) = agent.unreachable_since {
                out.insert("unreachable_time".to_owned(), time_json(nanos));
            }
            Value::Object(out)
        })
        .collect();
    Value::Array(agents)
}

/// Mesos's `TimeInfo`: nanoseconds since the Unix epoch.
fn time_json(nanos: u64) -> Value {
    json!({ "nanoseconds": nanos })
}

/// One RECONCILE_OPERATIONS answer; absent fields are left out.
fn operation_status_json(status: &OperationStatus) -> Value {
    let mut out = Map::new();
    out.insert(
        "operation_id".to_owned(),
        Value::from(status.operation_id.as_str()),
    );
    if let Some(agent) = &status.agent_id {
        out.insert("agent_id".to_owned(), Value::from(agent.as_str()));
    }
    out.insert("state".to_owned(), Value::from(status.state.name()));
    if let Some(message) = status.message {
        out.insert("message".to_owned(), Value::from(message));
    }
    if let Some(revision) = status.revision {
        out.insert("revision".to_owned(), Value::from(revision));
    }
    Value::Object(out)
}

/// One RECONCILE answer, a Mesos `TaskStatus` with the fields that apply.
fn task_status_json(status: &TaskStatus) -> Value {
    let mut out = Map::new();
    out.insert("task_id".to_owned(), Value::from(status.task_id.as_str()));
    if let Some(agent) = &status.agent_id {
        out.insert("agent_id".to_owned(), Value::from(agent.as_str()));
    }
    out.insert("state".to_owned(), Value::from(status.state.name()));
    out.insert("message".to_owned(), Value::from(status.message));
    out.insert("reason".to_owned(), Value::from(TaskStatus::REASON));
    out.insert("source".to_owned(), Value::from(TaskStatus::SOURCE));
    if let Some(nanos) = status.unreachable_time {
        out.insert("unreachable_time".to_owned(), time_json(nanos));
    }
    Value::Object(out)
}

/// One drift entry's counters, in units.
fn counters_json(c: &Counters) -> Value {
    json!({
        "allocated": units(c.allocated),
        "reserved": units(c.reserved),
        "reserved_in_use": units(c.reserved_in_use),
        "offered": units(c.offered),
        "consumed": units(c.consumed()),
    })
}

/// The RECONCILE_CONSUMPTION answer: the drift found, and with `repair` how many rows the
/// repair changed.
fn reconcile_json(
    drift: &[(String, String, Counters, Counters)],
    repaired: Option<usize>,
) -> Value {
    let entries: Vec<Value> = drift
        .iter()
        .map(|(role, resource, counted, recounted)| {
            json!({
                "role": role,
                "resource": resource,
                "counted": counters_json(counted),
                "recounted": counters_json(recounted),
            })
        })
        .collect();
    let mut body = Map::new();
    body.insert("drift".to_owned(), Value::Array(entries));
    if let Some(changed) = repaired {
        body.insert("repaired".to_owned(), Value::from(changed));
    }
    json!({ "type": "RECONCILE_CONSUMPTION", "reconcile_consumption": body })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(body: &str) -> Result<Call, String> {
        decode_call(body.as_bytes()).map_err(|r| r.message)
    }

    fn write(request: AccountingRequest) -> Call {
        Call::Write(request, WriteOptions::default())
    }

    #[test]
    fn units_print_as_mesos_prints_scalars() {
        let cases: [(i64, &str); 9] = [
            (1000, "1"),
            (0, "0"),
            (500, "0.5"),
            (1235, "1.235"),
            (2_048_000, "2048"),
            (1, "0.001"),
            (-1500, "-1.5"),
            // Fifteen significant digits, as Mesos prints them.
            (1_000_000_000_000_001, "1000000000000"),
            (1_000_000_000_000_500, "1000000000000.5"),
        ];
        for (milli, text) in cases {
            assert_eq!(units(milli).to_string(), text, "{milli}");
        }
    }

    #[test]
    fn calls_decode_with_defaults() {
        assert_eq!(decode(r#"{"type":"GET_QUOTA"}"#), Ok(Call::GetQuota));
        assert_eq!(
            decode(r#"{"type":"UPDATE_QUOTA","update_quota":{}}"#),
            Ok(write(AccountingRequest::UpdateQuota {
                configs: vec![],
                force: false
            }))
        );
        assert_eq!(
            decode(r#"{"type":"REGISTER_AGENT","register_agent":{"agent_id":"a"}}"#),
            Ok(write(AccountingRequest::RegisterAgent {
                id: "a".into(),
                state: AgentState::Registered,
                resources: BTreeMap::new()
            }))
        );
        assert_eq!(
            decode(r#"{"type":"RECONCILE_CONSUMPTION"}"#),
            Ok(Call::ReconcileConsumption { repair: false })
        );
        let limits = decode(
            r#"{"type":"UPDATE_QUOTA","update_quota":{"quota_configs":[{"role":"r","limits":{"cpus":{"value":"inf"},"mem":{"value":2}}}]}}"#,
        );
        let Ok(Call::Write(AccountingRequest::UpdateQuota { configs, .. }, _)) = limits else {
            panic!("{limits:?}");
        };
        assert_eq!(configs[0].limits["mem"], 2.0);
        assert!(configs[0].limits["cpus"].is_infinite());
    }

    #[test]
    fn operation_ids_decode_on_writes_only() {
        assert_eq!(
            decode(r#"{"type":"START","operation_id":"c7/1","start":{"id":"x"}}"#),
            Ok(Call::Write(
                AccountingRequest::Start { id: "x".into() },
                WriteOptions::with_operation_id("c7/1")
            ))
        );
        assert_eq!(
            decode(
                r#"{"type":"MARK_AGENT_GONE","mark_agent_gone":{"agent_id":"a3"},"operation_id":"g"}"#
            ),
            Ok(Call::Write(
                AccountingRequest::MarkAgentGone { id: "a3".into() },
                WriteOptions::with_operation_id("g")
            ))
        );
        let long = "x".repeat(kvd::OPERATION_ID_BYTES_MAX + 1);
        for (body, message) in [
            (
                r#"{"type":"START","operation_id":"","start":{"id":"x"}}"#.to_owned(),
                format!("{VALIDATE_PREFIX}operation id must not be empty"),
            ),
            (
                format!(r#"{{"type":"START","operation_id":"{long}","start":{{"id":"x"}}}}"#),
                format!("{VALIDATE_PREFIX}operation id is 257 bytes, more than 256"),
            ),
            (
                r#"{"type":"START","operation_id":7,"start":{"id":"x"}}"#.to_owned(),
                format!(
                    "{CONVERT_PREFIX}Expecting a JSON string for field 'operation_id', found a JSON number"
                ),
            ),
            (
                r#"{"type":"GET_AGENTS","operation_id":"o"}"#.to_owned(),
                format!(
                    "{VALIDATE_PREFIX}'operation_id' is only accepted on calls that change something, not on GET_AGENTS"
                ),
            ),
        ] {
            assert_eq!(decode(&body), Err(message), "{body}");
        }
    }

    #[test]
    fn new_calls_pass_the_fuzz_harness_checks() {
        // The harness writes each decoded call back as JSON and requires the same decoding
        // (OPS-1); these bodies exercise the calls and fields its corpus predates.
        for body in [
            r#"{"type":"ALLOCATE","operation_id":"s/1","allocate":{"id":"x","role":"r","agent_id":"a","resources":{"cpus":{"value":1.5}},"prepare":true}}"#,
            r#"{"type":"UPDATE_QUOTA","operation_id":"q","update_quota":{"quota_configs":[{"role":"r","limits":{"cpus":{"value":1}}}]}}"#,
            r#"{"type":"MARK_AGENT_UNREACHABLE","operation_id":"u","mark_agent_unreachable":{"agent_id":"a2"}}"#,
            r#"{"type":"MARK_AGENT_GONE","mark_agent_gone":{"agent_id":"a3"}}"#,
            r#"{"type":"GET_AGENTS"}"#,
            r#"{"type":"RECONCILE_OPERATIONS","reconcile_operations":{"operations":[{"operation_id":"o1","agent_id":"a1"},{"operation_id":"o2"}],"prefix":"c/"}}"#,
            r#"{"type":"RECONCILE_OPERATIONS"}"#,
            r#"{"type":"RECONCILE","reconcile":{"partition_aware":true,"tasks":[{"task_id":"x1","agent_id":"a1"},{"task_id":"x2"}]}}"#,
            r#"{"type":"RECONCILE"}"#,
            r#"{"type":"START","operation_id":"","start":{"id":"x"}}"#,
            r#"{"type":"GET_QUOTA","operation_id":"o"}"#,
            r#"{"type":"RECONCILE","reconcile":{"tasks":[{"task_id":7}]}}"#,
        ] {
            crate::fuzzing::operator_call(body.as_bytes());
        }
    }

    #[test]
    fn agent_and_reconciliation_calls_decode() {
        assert_eq!(
            decode(
                r#"{"type":"MARK_AGENT_UNREACHABLE","mark_agent_unreachable":{"agent_id":"a2"}}"#
            ),
            Ok(write(AccountingRequest::MarkAgentUnreachable {
                id: "a2".into()
            }))
        );
        assert_eq!(
            decode(r#"{"type":"MARK_AGENT_GONE","mark_agent_gone":{}}"#),
            Err(format!(
                "{CONVERT_PREFIX}Missing required fields: mark_agent_gone.agent_id"
            ))
        );
        assert_eq!(decode(r#"{"type":"GET_AGENTS"}"#), Ok(Call::GetAgents));
        assert_eq!(
            decode(r#"{"type":"RECONCILE_OPERATIONS"}"#),
            Ok(Call::ReconcileOperations {
                queries: vec![],
                prefix: String::new()
            })
        );
        assert_eq!(
            decode(
                r#"{"type":"RECONCILE_OPERATIONS","reconcile_operations":{"operations":[{"operation_id":"o1","agent_id":"a1"},{"operation_id":"o2"}],"prefix":"c7/"}}"#
            ),
            Ok(Call::ReconcileOperations {
                queries: vec![
                    OperationQuery {
                        operation_id: "o1".into(),
                        agent_id: Some("a1".into())
                    },
                    OperationQuery {
                        operation_id: "o2".into(),
                        agent_id: None
                    },
                ],
                prefix: "c7/".into()
            })
        );
        assert_eq!(
            decode(
                r#"{"type":"RECONCILE","reconcile":{"partition_aware":true,"tasks":[{"task_id":"x1","agent_id":"a1"}]}}"#
            ),
            Ok(Call::Reconcile {
                tasks: vec![TaskQuery {
                    task_id: "x1".into(),
                    agent_id: Some("a1".into())
                }],
                partition_aware: true
            })
        );
        assert_eq!(
            decode(r#"{"type":"RECONCILE","reconcile":{"tasks":[{"agent_id":"a1"}]}}"#),
            Err(format!(
                "{CONVERT_PREFIX}Missing required fields: reconcile.tasks[0].task_id"
            ))
        );
        assert_eq!(
            decode(r#"{"type":"RECONCILE"}"#),
            Ok(Call::Reconcile {
                tasks: vec![],
                partition_aware: false
            })
        );
    }

    #[test]
    fn prepare_queue_calls_decode() {
        let allocate = |prepare: &str| {
            decode(&format!(
                r#"{{"type":"ALLOCATE","allocate":{{"id":"x","role":"r","agent_id":"a"{prepare}}}}}"#
            ))
        };
        let record = |prepare| {
            Ok(write(AccountingRequest::Record {
                kind: RecordKind::Allocation,
                id: "x".into(),
                role: "r".into(),
                agent: "a".into(),
                resources: BTreeMap::new(),
                prepare,
            }))
        };
        assert_eq!(allocate(""), record(false));
        assert_eq!(allocate(r#","prepare":true"#), record(true));
        assert_eq!(
            decode(r#"{"type":"START","start":{"id":"x"}}"#),
            Ok(write(AccountingRequest::Start { id: "x".into() }))
        );
        for length in ["4", r#""4""#] {
            assert_eq!(
                decode(&format!(
                    r#"{{"type":"UPDATE_PREPARE_QUEUE","update_prepare_queue":{{"allocation_prepare_queue_length":{length}}}}}"#
                )),
                Ok(write(AccountingRequest::UpdatePrepareQueue {
                    allocation_prepare_queue_length: 4
                }))
            );
        }
        let field = "update_prepare_queue.allocation_prepare_queue_length";
        for (length, message) in [
            (
                "-1",
                format!("Failed to parse -1 as a non-negative integer for field '{field}'"),
            ),
            (
                "1.5",
                format!("Failed to parse 1.5 as a non-negative integer for field '{field}'"),
            ),
            (
                "true",
                format!("Expecting a JSON number for field '{field}', found a JSON boolean"),
            ),
        ] {
            assert_eq!(
                decode(&format!(
                    r#"{{"type":"UPDATE_PREPARE_QUEUE","update_prepare_queue":{{"allocation_prepare_queue_length":{length}}}}}"#
                )),
                Err(format!("{CONVERT_PREFIX}{message}"))
            );
        }
        assert_eq!(
            decode(r#"{"type":"UPDATE_PREPARE_QUEUE","update_prepare_queue":{}}"#),
            Err(format!("{CONVERT_PREFIX}Missing required fields: {field}"))
        );
        assert_eq!(
            decode(r#"{"type":"START"}"#),
            Err("Failed to validate master::Call: Expecting 'start' to be present".to_owned())
        );
    }

    #[test]
    fn a_full_prepare_queue_is_a_429_with_retry_after() {
        let refusal = Refusal::from_engine(&Error::AllocationPrepareQueueFull(
            "kvd: prepare queue is full".into(),
        ));
        assert_eq!(refusal.code, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refusal.retry_after_secs, Some(5));
        let response = refusal.into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "5");
        let quota = Refusal::from_engine(&Error::QuotaExceeded("x".into())).into_response();
        assert!(quota.headers().get(header::RETRY_AFTER).is_none());
    }

    #[test]
    fn malformed_calls_name_the_field() {
        let cases = [
            (
                r#"{"type":"UPDATE_QUOTA","update_quota":{"quota_configs":[{"limits":{}}]}}"#,
                "Failed to convert JSON into Call protobuf: Missing required fields: update_quota.quota_configs[0].role",
            ),
            (
                r#"{"type":"UPDATE_QUOTA","update_quota":{"quota_configs":[{"role":"r","limits":{"cpus":{}}}]}}"#,
                "Failed to convert JSON into Call protobuf: Missing required fields: update_quota.quota_configs[0].limits[cpus].value",
            ),
            (
                r#"{"type":"UPDATE_QUOTA","update_quota":{"quota_configs":[{"role":"r","limits":{"cpus":{"value":"lots"}}}]}}"#,
                "Failed to convert JSON into Call protobuf: Failed to parse \"lots\" as a number for field 'update_quota.quota_configs[0].limits[cpus].value'",
            ),
            (
                r#"{"type":7}"#,
                "Failed to convert JSON into Call protobuf: Expecting a JSON string for field 'type', found a JSON number",
            ),
            (
                r#"[]"#,
                "Failed to convert JSON into Call protobuf: Expecting a JSON object for field 'Call', found a JSON array",
            ),
            (
                r#"{"type":"RELEASE"}"#,
                "Failed to validate master::Call: Expecting 'release' to be present",
            ),
        ];
        for (body, message) in cases {
            assert_eq!(decode(body), Err(message.to_owned()), "{body}");
        }
    }

    #[test]
    fn every_engine_refusal_is_a_client_error() {
        for err in [
            Error::QuotaRequest("x".into()),
            Error::QuotaExceeded("x".into()),
            Error::InvalidArgument("x".into()),
        ] {
            let refusal = Refusal::from_engine(&err);
            assert_eq!(refusal.code, StatusCode::BAD_REQUEST);
            assert_eq!(refusal.message, err.to_string());
        }
        assert_eq!(http_code(&Error::Closed), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            http_code(&Error::TooManyRequests { retry_after_ms: 1 }),
            StatusCode::TOO_MANY_REQUESTS
        );
    }

    #[test]
    fn a_full_queue_answers_429_with_retry_after_in_whole_seconds() {
        for (ms, secs) in [(1, "1"), (1_000, "1"), (1_001, "2"), (4_500, "5")] {
            let response = Refusal::from_engine(&Error::TooManyRequests { retry_after_ms: ms })
                .into_response();
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
            let header = response.headers().get(header::RETRY_AFTER);
            assert_eq!(header.and_then(|v| v.to_str().ok()), Some(secs), "{ms} ms");
        }
        let other = Refusal::from_engine(&Error::NoSpace).into_response();
        assert!(other.headers().get(header::RETRY_AFTER).is_none());
    }
}
