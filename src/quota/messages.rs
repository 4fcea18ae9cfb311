//! Every client-visible message of the quota core, in one table, with the Mesos source each
//! one is copied from.
//!
//! Owns: the text of role-name errors (`roles::validate`, `src/common/roles.cpp`) and of
//! UPDATE_QUOTA errors (`quota::validate`, `src/master/quota.cpp`; `QuotaHandler::update` and
//! `QuotaTree`, `src/master/quota_handler.cpp`).
//!
//! Invariants:
//! - QUOTA-5: each message is Mesos's, byte for byte, given the same inputs, except the two
//!   documented deviations: the hierarchy error names the full role path (spec §10 Q4), and
//!   a raw value outside fixed point prints its real value (Q3). Operators and clients match
//!   these strings; change one only together with `docs/design/quota-values.md`.
//!
//! Contact points: `role.rs` and `validate.rs` build errors only through these functions;
//! the operator API returns them as the plain-text body of a 400.

/// The prefix Mesos puts before every UPDATE_QUOTA validation error except the nested-role one.
pub(crate) const INVALID_QUOTA_CONFIG_PREFIX: &str = "Invalid QuotaConfig: ";

// ---- roles::validate, in the order the checks run -------------------------------------------

pub(crate) fn role_starts_with_slash(role: &str) -> String {
    format!("Role '{role}' cannot start with a slash")
}

pub(crate) fn role_ends_with_slash(role: &str) -> String {
    format!("Role '{role}' cannot end with a slash")
}

pub(crate) fn role_has_adjacent_slashes(role: &str) -> String {
    format!("Role '{role}' cannot contain two adjacent slashes")
}

pub(crate) fn role_is_empty() -> String {
    "Role names cannot be the empty string".to_string()
}

/// `component` is one of the reserved names `.`, `..` and `*`.
pub(crate) fn role_has_reserved_component(role: &str, component: &str) -> String {
    format!("Role '{role}' cannot include '{component}' as a component")
}

pub(crate) fn role_component_starts_with_dash(component: &str) -> String {
    format!("Role component '{component}' is invalid because it starts with a dash")
}

pub(crate) fn role_component_has_whitespace(component: &str) -> String {
    format!("Role component '{component}' is invalid because it contains backspace or whitespace")
}

// ---- quota::validate(QuotaConfig) -------------------------------------------------------------

pub(crate) fn config_role_invalid(role_error: &str) -> String {
    format!("Invalid 'QuotaConfig.role': {role_error}")
}

/// `field` is `guarantees` or `limits`; `value` is already printed (`format_input`);
/// `cap_words` is `1 exabyte` or `1 trillion`.
pub(crate) fn config_value_too_large(
    field: &str,
    name: &str,
    value: &str,
    cap_words: &str,
    cap: i64,
) -> String {
    format!(
        "Invalid 'QuotaConfig.{field}': {{'{name}': {value}}} is invalid: \
         values greater than {cap_words} ({cap}) are not supported"
    )
}

/// `kind` is `guarantee` or `limit`; `reason` is a `ScalarError` text.
pub(crate) fn config_value_invalid(kind: &str, name: &str, value: &str, reason: &str) -> String {
    format!("Invalid {kind} configuration {{'{name}': {value}}}: {reason}")
}

/// Both maps are printed in protobuf-map form, `{ cpus: 2, mem: 1024 }`.
pub(crate) fn guarantees_exceed_limits(guarantees: &str, limits: &str) -> String {
    format!(
        "'QuotaConfig.guarantees' {guarantees} is not contained within the \
         'QuotaConfig.limits' {limits}"
    )
}

// ---- QuotaHandler::update ---------------------------------------------------------------------

/// `consumed` is a quantities string, `limits` a limits string.
pub(crate) fn limits_below_consumption(role: &str, consumed: &str, limits: &str) -> String {
    format!(
        "{INVALID_QUOTA_CONFIG_PREFIX}Role '{role}' is already consuming '{consumed}'; \
         this is more than the requested limits '{limits}' \
         (use 'force' flag to bypass this check)"
    )
}

/// Mesos prints the node's last path component as `role`; kvd prints the full role (Q4).
pub(crate) fn parent_guarantees_too_small(role: &str, guarantees: &str, children: &str) -> String {
    format!(
        "{INVALID_QUOTA_CONFIG_PREFIX}Invalid quota configuration. Parent role '{role}' \
         with guarantees ({guarantees}) does not contain the sum of its children's \
         guarantees ({children})"
    )
}

pub(crate) fn guarantees_exceed_capacity(total: &str, capacity: &str) -> String {
    format!(
        "{INVALID_QUOTA_CONFIG_PREFIX}total quota guarantees '{total}' exceed cluster \
         capacity '{capacity}' (use 'force' flag to bypass this check)"
    )
}
