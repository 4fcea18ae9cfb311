//! Test helpers for the quota core: a compact text notation for quantities, limits and
//! configurations, and a one-call UPDATE_QUOTA runner.
//!
//! Owns: nothing the library uses; compiled only for tests.
//!
//! Invariants: the notation is Mesos's `fromString` form, `"cpus:1;mem:1024"`, with values
//! parsed as Rust `f64` (`inf`, `-inf`, `NaN`, `-1`, `1e16` included) so that tests can write
//! the invalid values validation must reject.
//!
//! Contact points: the `tests` modules of every file in `quota/`.

use std::collections::BTreeMap;

use super::{
    Change, QuotaConfig, RawQuotaConfig, Registry, ResourceLimits, ResourceQuantities, Scalar,
    apply, validate_update,
};

/// Parses `"name:value;name:value"` into raw pairs, in the order written.
pub(crate) fn pairs(text: &str) -> Vec<(String, f64)> {
    text.split(';')
        .filter(|token| !token.trim().is_empty())
        .map(|token| {
            let (name, value) = token.split_once(':').unwrap();
            (
                name.trim().to_string(),
                value.trim().parse::<f64>().unwrap(),
            )
        })
        .collect()
}

/// Returns the raw map of `text`; a later duplicate replaces an earlier one.
pub(crate) fn raw_map(text: &str) -> BTreeMap<String, f64> {
    pairs(text).into_iter().collect()
}

/// Returns the quantities written as `"cpus:1;mem:2"` (duplicates summed, zeros dropped).
pub(crate) fn q(text: &str) -> ResourceQuantities {
    pairs(text)
        .into_iter()
        .map(|(name, value)| (name, Scalar::from_f64(value).unwrap()))
        .collect()
}

/// Returns the limits written as `"cpus:0;mem:2"` (zeros kept).
pub(crate) fn l(text: &str) -> ResourceLimits {
    pairs(text)
        .into_iter()
        .map(|(name, value)| (name, Scalar::from_f64(value).unwrap()))
        .collect()
}

/// Returns a raw configuration, as a request would carry it.
pub(crate) fn raw(role: &str, guarantees: &str, limits: &str) -> RawQuotaConfig {
    RawQuotaConfig {
        role: role.to_string(),
        guarantees: raw_map(guarantees),
        limits: raw_map(limits),
    }
}

/// Returns a validated configuration built directly (no validation).
pub(crate) fn config(role: &str, guarantees: &str, limits: &str) -> QuotaConfig {
    QuotaConfig {
        role: role.to_string(),
        guarantees: q(guarantees),
        limits: l(limits),
    }
}

/// Returns a registry holding `configs`.
pub(crate) fn registry(configs: &[QuotaConfig]) -> Registry {
    let mut registry = Registry::new();
    apply(&mut registry, configs.iter().cloned().map(Change::Set));
    registry
}

/// The world an UPDATE_QUOTA runs against: the registry, per-role consumption, capacity.
pub(crate) struct World {
    pub(crate) registry: Registry,
    pub(crate) consumption: BTreeMap<String, ResourceQuantities>,
    pub(crate) capacity: ResourceQuantities,
}

impl World {
    /// Returns an empty registry, no consumption, and `capacity`.
    pub(crate) fn with_capacity(capacity: &str) -> World {
        World {
            registry: Registry::new(),
            consumption: BTreeMap::new(),
            capacity: q(capacity),
        }
    }

    /// Adds an existing registry entry.
    pub(crate) fn entry(mut self, role: &str, guarantees: &str, limits: &str) -> World {
        apply(
            &mut self.registry,
            [Change::Set(config(role, guarantees, limits))],
        );
        self
    }

    /// Sets what `role` (subtree included) consumes now.
    pub(crate) fn consuming(mut self, role: &str, consumed: &str) -> World {
        self.consumption.insert(role.to_string(), q(consumed));
        self
    }

    /// Runs UPDATE_QUOTA with `configs` and `force`.
    pub(crate) fn update(
        &self,
        configs: &[RawQuotaConfig],
        force: bool,
    ) -> Result<Vec<Change>, String> {
        let consumption = |role: &str| self.consumption.get(role).cloned().unwrap_or_default();
        validate_update(configs, force, &self.registry, &consumption, &self.capacity)
    }

    /// Runs UPDATE_QUOTA and, if it succeeds, applies the changes to this world's registry.
    pub(crate) fn commit(
        &mut self,
        configs: &[RawQuotaConfig],
        force: bool,
    ) -> Result<Vec<Change>, String> {
        let changes = self.update(configs, force)?;
        apply(&mut self.registry, changes.clone());
        Ok(changes)
    }
}
