//! UPDATE_QUOTA validation: Mesos's `quota::validate` for one configuration and
//! `QuotaHandler::update` for a batch, in Mesos's order and with its messages (spec §3.1).
//!
//! Owns: [`validate_config`], [`validate_update`], and the value caps.
//!
//! Invariants:
//! - QUOTA-8: checks run in Mesos's order and the first failure is the answer: per
//!   configuration in request order, the role name, the guarantee caps, the limit caps, the
//!   guarantee values, the limit values, guarantees within limits; then per configuration,
//!   limits not below current consumption (`force` skips); then the hierarchy; then the sum of
//!   guarantees against capacity (`force` skips). Maps are visited in name order.
//! - QUOTA-9: all or nothing. [`validate_update`] is a pure function of its arguments; it
//!   returns either one error or the complete list of changes, and applying that list to
//!   `current` yields a registry that keeps QUOTA-7, has guarantees within limits for every
//!   entry, and has every role's guarantees covering the sum of its children's.
//! - QUOTA-10: the result depends only on the arguments (no hash order, clock or randomness).
//!
//! Contact points: the engine calls [`validate_update`] inside the write transaction that
//! commits the returned changes (so nothing can change in between; spec §10 Q5), passing
//! consumption and capacity read in that same transaction; the operator API returns an `Err`
//! as a 400 with the message as the body. Authorization (Mesos phase E) is the caller's and
//! comes after this, so an invalid request is a 400 even for a principal who would get 403.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use super::config::{Change, QuotaConfig, RawQuotaConfig, Registry};
use super::limits::ResourceLimits;
use super::messages;
use super::quantities::ResourceQuantities;
use super::role::{ROLE_SEPARATOR, ancestors, parent, validate_role};
use super::scalar::{SCALAR_MILLI_PER_UNIT, Scalar, format_input};

/// The largest `mem` or `disk` value a configuration may hold: one exbibyte expressed in
/// megabytes, `1024^4`. Mesos calls it "1 exabyte".
pub const QUOTA_MEGABYTES_MAX: i64 = 1024 * 1024 * 1024 * 1024;

/// The largest value of any other resource (`cpus`, `gpus`, `ports`, custom names): 10^12.
pub const QUOTA_UNITS_MAX: i64 = 1_000_000_000_000;

/// Resources measured in megabytes, which get [`QUOTA_MEGABYTES_MAX`].
const MEGABYTE_RESOURCES: [&str; 2] = ["mem", "disk"];

/// How many values at the larger cap must sum without saturating (QUOTA-1). Mesos picked its
/// caps far below the fixed-point overflow for this headroom.
const QUOTA_CAPPED_SUMMANDS_MIN: i64 = 1000;

// The caps are compared with raw doubles, so they must convert to f64 exactly.
const _: () = assert!(QUOTA_MEGABYTES_MAX < (1 << 53) && QUOTA_UNITS_MAX < (1 << 53));
const _: () = assert!(QUOTA_UNITS_MAX < QUOTA_MEGABYTES_MAX);
const _: () =
    assert!(QUOTA_MEGABYTES_MAX * SCALAR_MILLI_PER_UNIT <= i64::MAX / QUOTA_CAPPED_SUMMANDS_MIN);

/// Validates one configuration as Mesos's `quota::validate` does (phase A3 of spec §3.1) and
/// returns its fixed-point form. The error is Mesos's message without the
/// `Invalid QuotaConfig: ` prefix that [`validate_update`] adds.
///
/// Rows read back from the registry are not validated again: every config was validated
/// before it was written, and its seal (ROW-1) shows it is as written.
pub fn validate_config(raw: &RawQuotaConfig) -> Result<QuotaConfig, String> {
    validate_role(&raw.role).map_err(|error| messages::config_role_invalid(&error))?;
    check_caps("guarantees", &raw.guarantees)?;
    check_caps("limits", &raw.limits)?;
    let guarantees: ResourceQuantities = convert_values("guarantee", &raw.guarantees)?;
    let limits: ResourceLimits = convert_values("limit", &raw.limits)?;
    if !limits.contains(&guarantees) {
        return Err(messages::guarantees_exceed_limits(
            &format_raw_map(&raw.guarantees),
            &format_raw_map(&raw.limits),
        ));
    }
    Ok(QuotaConfig {
        role: raw.role.clone(),
        guarantees,
        limits,
    })
}

/// Validates an UPDATE_QUOTA batch against the current registry and returns the changes to
/// commit, one per distinct role in the batch, sorted by role (QUOTA-8, QUOTA-9).
///
/// - `force` skips the consumption check and the capacity check, nothing else.
/// - `consumption(role)` returns what `role` consumes now, its whole subtree included
///   (allocations plus unallocated reservations, spec §5.3).
/// - `capacity` is the total the guarantees must fit in.
///
/// When a role appears more than once, each occurrence is validated, and the last one is
/// the one applied (Mesos's behaviour, spec §10 Q10). A configuration equal to the default
/// quota becomes [`Change::Delete`]. An empty batch still runs the capacity check against
/// the existing guarantees, as in Mesos.
pub fn validate_update(
    configs: &[RawQuotaConfig],
    force: bool,
    current: &Registry,
    consumption: &dyn Fn(&str) -> ResourceQuantities,
    capacity: &ResourceQuantities,
) -> Result<Vec<Change>, String> {
    let validated = configs
        .iter()
        .map(|raw| {
            validate_config(raw)
                .map_err(|error| format!("{}{error}", messages::INVALID_QUOTA_CONFIG_PREFIX))
        })
        .collect::<Result<Vec<QuotaConfig>, String>>()?;
    if !force {
        validated
            .iter()
            .try_for_each(|config| check_consumption(config, consumption))?;
    }
    // Later configurations for the same role replace earlier ones.
    let batch: BTreeMap<&str, &QuotaConfig> = validated
        .iter()
        .map(|config| (config.role.as_str(), config))
        .collect();
    let tree = guarantee_tree(current, &batch);
    check_hierarchy(&tree)?;
    if !force {
        check_capacity(&tree, capacity)?;
    }
    Ok(batch.into_values().map(change_for).collect())
}

/// Rejects the first value above its cap. The comparison is on the raw double, as in Mesos: the
/// cap itself passes, `+inf` fails here (not as "Infinite"), NaN and negatives pass on to
/// [`convert_values`].
fn check_caps(field: &str, values: &BTreeMap<String, f64>) -> Result<(), String> {
    for (name, value) in values {
        let (cap, cap_words) = if MEGABYTE_RESOURCES.contains(&name.as_str()) {
            (QUOTA_MEGABYTES_MAX, "1 exabyte")
        } else {
            (QUOTA_UNITS_MAX, "1 trillion")
        };
        if *value > cap as f64 {
            return Err(messages::config_value_too_large(
                field,
                name,
                &format_input(*value),
                cap_words,
                cap,
            ));
        }
    }
    Ok(())
}

/// Converts every value to fixed point, or returns Mesos's message for the first invalid one;
/// `kind` is `guarantee` or `limit`.
fn convert_values<C: FromIterator<(String, Scalar)>>(
    kind: &str,
    values: &BTreeMap<String, f64>,
) -> Result<C, String> {
    values
        .iter()
        .map(|(name, value)| match Scalar::from_f64(*value) {
            Ok(scalar) => Ok((name.clone(), scalar)),
            Err(reason) => Err(messages::config_value_invalid(
                kind,
                name,
                &format_input(*value),
                &reason.to_string(),
            )),
        })
        .collect()
}

/// Prints a request map as Mesos prints a protobuf map: `{ cpus: 2, mem: 1024 }`, sorted by
/// name (spec §10 Q2), each value rounded to milli-units; `{  }` when empty, as stout does.
fn format_raw_map(values: &BTreeMap<String, f64>) -> String {
    let entries: Vec<String> = values
        .iter()
        .map(|(name, value)| format!("{name}: {}", format_input(*value)))
        .collect();
    format!("{{ {} }}", entries.join(", "))
}

/// Phase B: the new limits must not be below what the role already consumes.
fn check_consumption(
    config: &QuotaConfig,
    consumption: &dyn Fn(&str) -> ResourceQuantities,
) -> Result<(), String> {
    let consumed = consumption(&config.role);
    if config.limits.contains(&consumed) {
        Ok(())
    } else {
        Err(messages::limits_below_consumption(
            &config.role,
            &consumed.to_string(),
            &config.limits.to_string(),
        ))
    }
}

/// Returns every role's guarantees after the batch, the current entries overlaid with the
/// batch, plus every ancestor of those roles with no guarantees of its own (Mesos's
/// `QuotaTree` creates those nodes implicitly).
fn guarantee_tree<'a>(
    current: &'a Registry,
    batch: &BTreeMap<&'a str, &'a QuotaConfig>,
) -> BTreeMap<&'a str, ResourceQuantities> {
    let mut tree: BTreeMap<&str, ResourceQuantities> = current
        .iter()
        .map(|(role, config)| (role.as_str(), config.guarantees.clone()))
        .collect();
    for (role, config) in batch {
        tree.insert(role, config.guarantees.clone());
    }
    let explicit: Vec<&str> = tree.keys().copied().collect();
    for role in explicit {
        for ancestor in ancestors(role) {
            tree.entry(ancestor).or_default();
        }
    }
    tree
}

/// Phase C: every role's guarantees must contain the sum of its children's. With several
/// failures the one reported is the first in Mesos's traversal, children before parents and
/// siblings in name order.
fn check_hierarchy(tree: &BTreeMap<&str, ResourceQuantities>) -> Result<(), String> {
    let mut children_sums: BTreeMap<&str, ResourceQuantities> = BTreeMap::new();
    for (role, guarantees) in tree {
        if let Some(parent) = parent(role) {
            *children_sums.entry(parent).or_default() += guarantees;
        }
    }
    let first_failure = tree
        .iter()
        .filter_map(|(role, own)| {
            let children = children_sums.get(role)?;
            (!own.contains(children)).then_some((*role, own, children))
        })
        .min_by(|left, right| children_first(left.0, right.0));
    match first_failure {
        Some((role, own, children)) => Err(messages::parent_guarantees_too_small(
            role,
            &own.to_string(),
            &children.to_string(),
        )),
        None => Ok(()),
    }
}

/// Orders roles as a depth-first, children-first walk of the role tree with siblings in name
/// order: `a/b/c` < `a/b` < `a/c` < `a` < `b`. Iterative, so a deep role cannot exhaust
/// the stack.
fn children_first(left: &str, right: &str) -> Ordering {
    let mut left_components = left.split(ROLE_SEPARATOR);
    let mut right_components = right.split(ROLE_SEPARATOR);
    loop {
        match (left_components.next(), right_components.next()) {
            (Some(l), Some(r)) if l == r => continue,
            (Some(l), Some(r)) => return l.cmp(r),
            // The longer role is a descendant of the shorter one and comes first.
            (Some(_), None) => return Ordering::Less,
            (None, Some(_)) => return Ordering::Greater,
            (None, None) => return Ordering::Equal,
        }
    }
}

/// Phase D: the guarantees of the top-level roles (children are already inside their
/// parents') must fit in `capacity`.
fn check_capacity(
    tree: &BTreeMap<&str, ResourceQuantities>,
    capacity: &ResourceQuantities,
) -> Result<(), String> {
    let mut total = ResourceQuantities::new();
    for (_, guarantees) in tree.iter().filter(|(role, _)| parent(role).is_none()) {
        total += guarantees;
    }
    if capacity.contains(&total) {
        Ok(())
    } else {
        // A resource without a real bound (`Scalar::MAX`, such as `kv_keys`) is left out of
        // the message: printing it would show a made-up number, and it cannot be exceeded.
        let mut bounded = ResourceQuantities::new();
        for (name, value) in capacity.iter().filter(|(_, v)| *v != Scalar::MAX) {
            bounded.add_resource(name, value);
        }
        Err(messages::guarantees_exceed_capacity(
            &total.to_string(),
            &bounded.to_string(),
        ))
    }
}

fn change_for(config: &QuotaConfig) -> Change {
    if config.is_default() {
        Change::Delete(config.role.clone())
    } else {
        Change::Set(config.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_first_orders_a_tree_walk() {
        let mut roles = vec!["b", "a", "a/c", "a/b", "a/b/c", "a-b", "*", "a/b/c/d"];
        roles.sort_by(|l, r| children_first(l, r));
        assert_eq!(
            roles,
            ["*", "a/b/c/d", "a/b/c", "a/b", "a/c", "a", "a-b", "b"]
        );
    }

    #[test]
    fn unbounded_resources_are_left_out_of_the_capacity_message() {
        let mut guarantees = ResourceQuantities::new();
        guarantees.add_resource("cpus", Scalar::from_units(2));
        let tree = BTreeMap::from([("a", guarantees)]);
        let mut capacity = ResourceQuantities::new();
        capacity.add_resource("cpus", Scalar::from_units(1));
        capacity.add_resource("kv_keys", Scalar::MAX);
        let message = check_capacity(&tree, &capacity).unwrap_err();
        assert!(
            message.ends_with(
                "exceed cluster capacity 'cpus:1' (use 'force' flag to bypass this check)"
            ),
            "{message}"
        );
    }

    #[test]
    fn raw_maps_print_like_protobuf_maps() {
        let map = |pairs: &[(&str, f64)]| -> BTreeMap<String, f64> {
            pairs.iter().map(|(n, v)| (n.to_string(), *v)).collect()
        };
        assert_eq!(format_raw_map(&map(&[("cpus", 2.0)])), "{ cpus: 2 }");
        assert_eq!(
            format_raw_map(&map(&[("mem", 1024.0), ("cpus", 1.2345), ("disk", 0.0)])),
            "{ cpus: 1.235, disk: 0, mem: 1024 }"
        );
        assert_eq!(format_raw_map(&map(&[])), "{  }");
    }
}
