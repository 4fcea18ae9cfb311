//! The pure core of kvd's quota registry: Mesos quota values, role names, and UPDATE_QUOTA
//! validation (product decisions 6–8;
//! `docs/design/quota-values.md`).
//!
//! Owns: fixed-point scalars ([`Scalar`]), quantities where absent means zero
//! ([`ResourceQuantities`]), limits where absent means unlimited ([`ResourceLimits`]), role
//! names and the key namespace each role owns ([`validate_role`], [`charged_role`]), quota
//! configurations and the registry ([`QuotaConfig`], [`Registry`]), and the validation that
//! turns an UPDATE_QUOTA batch into registry changes ([`validate_update`]). Nothing here does
//! I/O, reads a clock, or keeps state: the engine passes the current registry, consumption and
//! capacity in, and commits the returned changes itself.
//!
//! Invariants (each is stated in full, and tested, in the file named):
//! - QUOTA-1 `scalar.rs`: scalars are non-negative whole milli-units; comparisons are exact;
//!   arithmetic saturates instead of wrapping.
//! - QUOTA-2 `scalar.rs`, `format.rs`: numbers print as Mesos prints them.
//! - QUOTA-3 `quantities.rs`: quantities never hold zero or negative entries.
//! - QUOTA-4 `limits.rs`: an absent limit is unlimited, a zero limit is kept.
//! - QUOTA-5 `role.rs`, `messages.rs`: role rules and every message are Mesos's.
//! - QUOTA-6 `role.rs`: a key is charged to the deepest role with an entry owning it, else `*`.
//! - QUOTA-7 `config.rs`: the registry holds only non-default configurations.
//! - QUOTA-8, QUOTA-9, QUOTA-10 `validate.rs`: Mesos's check order, all or nothing,
//!   deterministic.
//!
//! Contact points: the engine's registry table stores [`QuotaConfig`]s and commits
//! [`Change`]s in the transaction that ran [`validate_update`]; the consumption tables supply
//! the `consumption` and `capacity` arguments and check writes with
//! [`ResourceLimits::contains`]; the write path calls [`charged_role`] and [`ancestors`]; the
//! operator API (JSON lives there, not here) maps an `Err(String)` to a 400 with that body.

mod config;
mod format;
mod limits;
mod messages;
mod quantities;
mod role;
mod scalar;
mod validate;

#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;

pub use config::{Change, QuotaConfig, RawQuotaConfig, Registry, apply, get_quota};
pub use limits::ResourceLimits;
pub use quantities::ResourceQuantities;
pub use role::{
    ROLE_SEPARATOR, RoleEntries, STAR_ROLE, ancestors, charged_role, is_ancestor,
    is_strict_subrole, namespace_prefix, parent, validate_role,
};
pub use scalar::{SCALAR_MILLI_PER_UNIT, Scalar, ScalarError, format_input};
pub use validate::{QUOTA_MEGABYTES_MAX, QUOTA_UNITS_MAX, validate_config, validate_update};
