//! Quota configurations: the request form, the validated form, the registry of non-default
//! configurations, and the changes an UPDATE_QUOTA makes to it.
//!
//! Owns: [`RawQuotaConfig`] (a `QuotaConfig` as it arrives, doubles unchecked),
//! [`QuotaConfig`] (validated, fixed point), [`Registry`], [`Change`], [`apply`] and
//! [`get_quota`].
//!
//! Invariants:
//! - QUOTA-7: the registry holds only non-default configurations, each under its own role:
//!   `registry[r].role == r` and `!registry[r].is_default()`. A default configuration (no
//!   guarantee above zero, no limit at all) means "this role has no entry" (spec §10 Q1), so
//!   [`apply`] deletes instead of storing it and [`get_quota`] never lists one.
//! - Registry order is role order (byte order), so GET_QUOTA is sorted by role (Q2).
//!
//! Contact points: `validate.rs` turns raw configurations into [`Change`]s; the engine
//! commits them in one write transaction together with the validation, and decodes stored
//! rows back through [`crate::quota::validate_config`].

use std::collections::BTreeMap;

use super::limits::ResourceLimits;
use super::quantities::ResourceQuantities;

/// A `QuotaConfig` as an UPDATE_QUOTA request carries it: a role and two maps of raw doubles.
/// Maps are visited in name order, which is the order checks run and errors are found in.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawQuotaConfig {
    /// The role the configuration is for.
    pub role: String,
    /// Guaranteed amounts; an absent name has no guarantee.
    pub guarantees: BTreeMap<String, f64>,
    /// Limits; an absent name is unlimited, zero is a limit.
    pub limits: BTreeMap<String, f64>,
}

/// A validated quota configuration: what a role is guaranteed and what it may not exceed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct QuotaConfig {
    /// The role the configuration is for.
    pub role: String,
    /// Guaranteed quantities; zero guarantees are dropped, absent means none.
    pub guarantees: ResourceQuantities,
    /// Limits; absent means unlimited, zero limits are kept.
    pub limits: ResourceLimits,
}

impl QuotaConfig {
    /// Returns `true` when this is Mesos's `DEFAULT_QUOTA`: no guarantees and no limits. Such a
    /// configuration is never stored; setting it deletes the role's entry (QUOTA-7).
    pub fn is_default(&self) -> bool {
        self.guarantees.is_empty() && self.limits.is_empty()
    }
}

impl From<&QuotaConfig> for RawQuotaConfig {
    /// Returns the request form of a stored configuration, as GET_QUOTA reports it.
    fn from(config: &QuotaConfig) -> RawQuotaConfig {
        RawQuotaConfig {
            role: config.role.clone(),
            guarantees: config
                .guarantees
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_f64()))
                .collect(),
            limits: config
                .limits
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_f64()))
                .collect(),
        }
    }
}

/// The quota registry: every role with a non-default configuration, by role (QUOTA-7).
pub type Registry = BTreeMap<String, QuotaConfig>;

/// One change an accepted UPDATE_QUOTA makes to the registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Insert or replace the role's entry with this non-default configuration.
    Set(QuotaConfig),
    /// Remove the role's entry, if it has one (the request set it to the default quota).
    Delete(String),
}

impl Change {
    /// Returns the role the change is for.
    pub fn role(&self) -> &str {
        match self {
            Change::Set(config) => &config.role,
            Change::Delete(role) => role,
        }
    }
}

/// Applies `changes` to `registry` in order. A `Set` of a default configuration deletes, so
/// the registry keeps QUOTA-7 even if a caller builds changes by hand.
pub fn apply(registry: &mut Registry, changes: impl IntoIterator<Item = Change>) {
    for change in changes {
        match change {
            Change::Set(config) if config.is_default() => {
                registry.remove(&config.role);
            }
            Change::Set(config) => {
                registry.insert(config.role.clone(), config);
            }
            Change::Delete(role) => {
                registry.remove(&role);
            }
        }
    }
}

/// Returns every configuration in the registry, sorted by role: the GET_QUOTA answer before
/// the caller drops the roles the principal may not see.
pub fn get_quota(registry: &Registry) -> Vec<&QuotaConfig> {
    registry
        .values()
        .filter(|config| !config.is_default())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::test_support::{config, l, q};

    #[test]
    fn default_quota_is_no_guarantee_and_no_limit() {
        let cases: &[(&str, &str, bool)] = &[
            ("", "", true),
            ("cpus:0", "", true),
            ("cpus:0.0004;mem:0", "", true),
            ("cpus:1", "", false),
            ("", "cpus:0", false),
            ("", "cpus:10", false),
        ];
        for (guarantees, limits, default) in cases {
            let config = QuotaConfig {
                role: "r".to_string(),
                guarantees: q(guarantees),
                limits: l(limits),
            };
            assert_eq!(
                config.is_default(),
                *default,
                "guarantees {guarantees} limits {limits}"
            );
        }
    }

    #[test]
    fn apply_sets_replaces_and_deletes() {
        let mut registry = Registry::new();
        apply(
            &mut registry,
            [
                Change::Set(config("b", "cpus:1", "")),
                Change::Set(config("a", "", "mem:5")),
            ],
        );
        let roles: Vec<&str> = get_quota(&registry)
            .iter()
            .map(|c| c.role.as_str())
            .collect();
        assert_eq!(roles, ["a", "b"]);

        apply(&mut registry, [Change::Set(config("a", "", "mem:6"))]);
        assert_eq!(registry["a"].limits, l("mem:6"));

        apply(
            &mut registry,
            [
                Change::Delete("a".to_string()),
                Change::Delete("zz".to_string()),
            ],
        );
        assert_eq!(registry.keys().collect::<Vec<_>>(), ["b"]);

        // A hand-made Set of the default quota deletes rather than stores.
        apply(&mut registry, [Change::Set(config("b", "cpus:0", ""))]);
        assert!(registry.is_empty());
    }

    #[test]
    fn change_names_its_role() {
        assert_eq!(Change::Set(config("a", "", "cpus:1")).role(), "a");
        assert_eq!(Change::Delete("b".to_string()).role(), "b");
    }

    #[test]
    fn raw_form_of_a_stored_config() {
        let raw = RawQuotaConfig::from(&config("dev", "cpus:1.5", "cpus:2;mem:0"));
        assert_eq!(raw.role, "dev");
        assert_eq!(raw.guarantees, BTreeMap::from([("cpus".to_string(), 1.5)]));
        assert_eq!(
            raw.limits,
            BTreeMap::from([("cpus".to_string(), 2.0), ("mem".to_string(), 0.0)])
        );
    }
}
