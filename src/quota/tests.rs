//! UPDATE_QUOTA validation tests: every branch of spec §3.1 with its exact message, in Mesos's
//! order, plus force, default-means-delete, duplicates, nested roles and all-or-nothing.
//!
//! Owns: scenario tests across `validate.rs`, `config.rs` and `role.rs`; the unit tests of
//! each file sit next to its code.
//!
//! Invariants exercised: QUOTA-5 (messages), QUOTA-7 (registry), QUOTA-8 (order), QUOTA-9
//! (all or nothing, and the registry invariants after every accepted batch), QUOTA-10.
//!
//! Contact points: `test_support.rs` for the notation and the `World` runner.

use super::test_support::{World, config, l, q, raw, registry};
use super::{Change, RawQuotaConfig, Registry, get_quota, parent, validate_config};

/// A capacity large enough that the overcommit check never interferes.
const AMPLE: &str = "cpus:1000000;mem:1000000;disk:1000000;gpus:1000000";

/// Asserts that `validate_config` rejects each configuration with its message.
fn check_config_errors(cases: &[(RawQuotaConfig, &str)]) {
    for (raw, message) in cases {
        assert_eq!(validate_config(raw), Err(message.to_string()), "{raw:?}");
    }
}

/// Asserts that UPDATE_QUOTA in `world` rejects `configs` with `message` and changes nothing.
fn check_rejected(world: &World, configs: &[RawQuotaConfig], force: bool, message: &str) {
    assert_eq!(
        world.update(configs, force),
        Err(message.to_string()),
        "{configs:?}"
    );
}

/// Returns the roles of `changes` with `+` for a set and `-` for a delete: `["+a", "-b"]`.
fn summary(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .map(|change| match change {
            Change::Set(config) => format!("+{}", config.role),
            Change::Delete(role) => format!("-{role}"),
        })
        .collect()
}

// ---- A3: one configuration -------------------------------------------------------------------

#[test]
fn role_name_errors_are_prefixed() {
    check_config_errors(&[
        (
            raw("", "", ""),
            "Invalid 'QuotaConfig.role': Role names cannot be the empty string",
        ),
        (
            raw("/foo", "", ""),
            "Invalid 'QuotaConfig.role': Role '/foo' cannot start with a slash",
        ),
        (
            raw("a//b", "", ""),
            "Invalid 'QuotaConfig.role': Role 'a//b' cannot contain two adjacent slashes",
        ),
        (
            raw("a/*", "", ""),
            "Invalid 'QuotaConfig.role': Role 'a/*' cannot include '*' as a component",
        ),
        (
            raw("dev team", "", ""),
            "Invalid 'QuotaConfig.role': Role component 'dev team' is invalid because it \
             contains backspace or whitespace",
        ),
        // The role is checked before any value.
        (
            raw("-x", "cpus:-1", "cpus:2e12"),
            "Invalid 'QuotaConfig.role': Role component '-x' is invalid because it starts with \
             a dash",
        ),
    ]);
}

/// Returns Mesos's cap message for `{'name': printed}` in `field`, for the cap of `name`.
fn too_large(field: &str, name: &str, printed: &str) -> String {
    let cap = if name == "mem" || name == "disk" {
        "1 exabyte (1099511627776)"
    } else {
        "1 trillion (1000000000000)"
    };
    format!(
        "Invalid 'QuotaConfig.{field}': {{'{name}': {printed}}} is invalid: values greater than \
         {cap} are not supported"
    )
}

#[test]
fn values_above_the_caps_are_rejected_with_the_cap_message() {
    const TRILLION_AND_ONE: &str = "1000000000001";
    const EXABYTE_AND_ONE: &str = "1099511627777";
    let cases: &[(RawQuotaConfig, &str, &str, &str)] = &[
        (
            raw("r", "cpus:1000000000001", ""),
            "guarantees",
            "cpus",
            TRILLION_AND_ONE,
        ),
        (
            raw("r", "cpus:1e12", "cpus:1000000000001"),
            "limits",
            "cpus",
            TRILLION_AND_ONE,
        ),
        (
            raw("r", "mem:1099511627776", "mem:1099511627777"),
            "limits",
            "mem",
            EXABYTE_AND_ONE,
        ),
        (
            raw("r", "disk:1099511627777", ""),
            "guarantees",
            "disk",
            EXABYTE_AND_ONE,
        ),
        (
            raw("r", "gpus:1000000000001", ""),
            "guarantees",
            "gpus",
            TRILLION_AND_ONE,
        ),
        (
            raw("r", "ports:1000000000001", ""),
            "guarantees",
            "ports",
            TRILLION_AND_ONE,
        ),
        (
            raw("r", "", "foobars:1000000000001"),
            "limits",
            "foobars",
            TRILLION_AND_ONE,
        ),
        // The cap compares the raw double; the message prints it rounded to milli-units.
        (
            raw("r", "cpus:1000000000000.0004", ""),
            "guarantees",
            "cpus",
            "1000000000000",
        ),
        // +inf is "too large", not "infinite" (spec §10 Q11).
        (raw("r", "cpus:inf", ""), "guarantees", "cpus", "inf"),
        (raw("r", "", "mem:inf"), "limits", "mem", "inf"),
        // Beyond fixed point the real value is printed (spec §10 Q3).
        (raw("r", "cpus:1e16", ""), "guarantees", "cpus", "1e+16"),
        (raw("r", "cpus:1e15", ""), "guarantees", "cpus", "1e+15"),
        // Names are visited in order: cpus before mem.
        (
            raw("r", "mem:2e12;cpus:2e12", ""),
            "guarantees",
            "cpus",
            "2000000000000",
        ),
        // Both maps' caps come before any value check.
        (
            raw("r", "cpus:-1", "cpus:2e12"),
            "limits",
            "cpus",
            "2000000000000",
        ),
    ];
    for (raw, field, name, printed) in cases {
        assert_eq!(
            validate_config(raw),
            Err(too_large(field, name, printed)),
            "{raw:?}"
        );
    }
}

#[test]
fn values_at_the_caps_are_accepted() {
    let at_caps = "disk:1099511627776;mem:1099511627776;cpus:1e12;ports:1e12;foobars:1e12";
    assert!(validate_config(&raw("r", at_caps, at_caps)).is_ok());
    // mem and disk get the larger cap.
    assert!(validate_config(&raw("r", "mem:1000000000001", "disk:1000000000001")).is_ok());
}

#[test]
fn invalid_values_get_the_scalar_reason() {
    check_config_errors(&[
        (
            raw("r", "cpus:NaN", ""),
            "Invalid guarantee configuration {'cpus': nan}: NaN not supported",
        ),
        (
            raw("r", "cpus:-inf", ""),
            "Invalid guarantee configuration {'cpus': -inf}: Infinite values not supported",
        ),
        (
            raw("r", "cpus:-1", ""),
            "Invalid guarantee configuration {'cpus': -1}: Negative values not supported",
        ),
        (
            raw("r", "cpus:-2.5", ""),
            "Invalid guarantee configuration {'cpus': -2.5}: Negative values not supported",
        ),
        // Negative even though it rounds to zero; printed rounded, as Mesos prints it.
        (
            raw("r", "cpus:-0.0001", ""),
            "Invalid guarantee configuration {'cpus': 0}: Negative values not supported",
        ),
        (
            raw("r", "cpus:5e-324", ""),
            "Invalid guarantee configuration {'cpus': 0}: Subnormal values not supported",
        ),
        (
            raw("r", "", "mem:-1"),
            "Invalid limit configuration {'mem': -1}: Negative values not supported",
        ),
        (
            raw("r", "", "mem:NaN"),
            "Invalid limit configuration {'mem': nan}: NaN not supported",
        ),
        (
            raw("r", "", "disk:-inf"),
            "Invalid limit configuration {'disk': -inf}: Infinite values not supported",
        ),
        // Guarantee values are checked before limit values, names in order.
        (
            raw("r", "mem:-1", "cpus:NaN"),
            "Invalid guarantee configuration {'mem': -1}: Negative values not supported",
        ),
        (
            raw("r", "mem:-1;cpus:-2", ""),
            "Invalid guarantee configuration {'cpus': -2}: Negative values not supported",
        ),
    ]);
}

#[test]
fn zero_and_negative_zero_are_valid() {
    let cases = [
        raw("r", "cpus:0", ""),
        raw("r", "cpus:-0", "cpus:-0"),
        raw("r", "", "cpus:0"),
    ];
    for case in cases {
        assert!(validate_config(&case).is_ok(), "{case:?}");
    }
}

#[test]
fn guarantees_must_be_within_limits() {
    check_config_errors(&[
        (
            raw("r", "cpus:2", "cpus:1"),
            "'QuotaConfig.guarantees' { cpus: 2 } is not contained within the \
             'QuotaConfig.limits' { cpus: 1 }",
        ),
        (
            raw("r", "cpus:0.001", "cpus:0"),
            "'QuotaConfig.guarantees' { cpus: 0.001 } is not contained within the \
             'QuotaConfig.limits' { cpus: 0 }",
        ),
        // The maps print whole, zeros and unrelated names included, sorted by name.
        (
            raw("r", "mem:0;cpus:1.2345", "disk:5;cpus:1.2"),
            "'QuotaConfig.guarantees' { cpus: 1.235, mem: 0 } is not contained within the \
             'QuotaConfig.limits' { cpus: 1.2, disk: 5 }",
        ),
    ]);
    let accepted = [
        raw("r", "cpus:5", "mem:1"),
        raw("r", "cpus:1", "cpus:1"),
        raw("r", "cpus:0", "cpus:0"),
        raw("r", "cpus:0.0004", "cpus:0"),
        raw("r", "cpus:1.0004", "cpus:1"),
        raw("r", "cpus:1;mem:2", "cpus:1;mem:2;disk:0"),
    ];
    for case in accepted {
        assert!(validate_config(&case).is_ok(), "{case:?}");
    }
}

#[test]
fn a_valid_config_is_converted_to_fixed_point() {
    let config = validate_config(&raw("dev", "cpus:1.2345;mem:0", "cpus:2;disk:0")).unwrap();
    assert_eq!(config.role, "dev");
    assert_eq!(config.guarantees, q("cpus:1.235"));
    assert_eq!(config.limits, l("cpus:2;disk:0"));
}

// ---- The batch: prefix, order of phases ------------------------------------------------------

#[test]
fn config_errors_are_prefixed_and_the_first_config_wins() {
    let world = World::with_capacity(AMPLE);
    check_rejected(
        &world,
        &[raw("a", "cpus:-1", ""), raw("/b", "", "")],
        false,
        "Invalid QuotaConfig: Invalid guarantee configuration {'cpus': -1}: Negative values not \
         supported",
    );
    check_rejected(
        &world,
        &[raw("a", "cpus:1", ""), raw("/b", "", "")],
        false,
        "Invalid QuotaConfig: Invalid 'QuotaConfig.role': Role '/b' cannot start with a slash",
    );
    // force bypasses none of the per-configuration checks.
    check_rejected(
        &world,
        &[raw("a", "cpus:2", "cpus:1")],
        true,
        "Invalid QuotaConfig: 'QuotaConfig.guarantees' { cpus: 2 } is not contained within the \
         'QuotaConfig.limits' { cpus: 1 }",
    );
}

#[test]
fn every_config_is_checked_before_consumption() {
    // The first configuration breaks its consumption check, the second has a bad role; the
    // role error wins because phase A covers the whole batch before phase B starts.
    let world = World::with_capacity(AMPLE).consuming("a", "cpus:5");
    check_rejected(
        &world,
        &[raw("a", "", "cpus:1"), raw("b c", "", "")],
        false,
        "Invalid QuotaConfig: Invalid 'QuotaConfig.role': Role component 'b c' is invalid \
         because it contains backspace or whitespace",
    );
}

// ---- B: limits against current consumption ---------------------------------------------------

#[test]
fn limits_below_consumption_need_force() {
    let world = World::with_capacity(AMPLE).consuming("dev", "cpus:2;mem:1024;ports:100");
    let lowered = [raw("dev", "", "cpus:1")];
    check_rejected(
        &world,
        &lowered,
        false,
        "Invalid QuotaConfig: Role 'dev' is already consuming 'cpus:2; mem:1024; ports:100'; \
         this is more than the requested limits 'cpus:1' (use 'force' flag to bypass this check)",
    );
    assert_eq!(summary(&world.update(&lowered, true).unwrap()), ["+dev"]);
}

#[test]
fn consumption_check_cases() {
    let world = World::with_capacity(AMPLE)
        .consuming("dev", "cpus:0.001")
        .consuming("a", "mem:5");
    check_rejected(
        &world,
        &[raw("dev", "", "cpus:0")],
        false,
        "Invalid QuotaConfig: Role 'dev' is already consuming 'cpus:0.001'; this is more than \
         the requested limits 'cpus:0' (use 'force' flag to bypass this check)",
    );
    let accepted = [
        // A limit equal to consumption, or on a resource not consumed, is fine.
        vec![raw("dev", "", "cpus:0.001")],
        vec![raw("dev", "", "mem:0")],
        vec![raw("a", "", "cpus:0;mem:5")],
        // Deleting the quota lifts every limit.
        vec![raw("dev", "", "")],
        // Roles that consume nothing accept any limit.
        vec![raw("idle", "", "cpus:0;mem:0")],
    ];
    for configs in accepted {
        assert!(world.update(&configs, false).is_ok(), "{configs:?}");
    }
}

#[test]
fn every_occurrence_of_a_duplicate_role_is_checked_against_consumption() {
    // The last configuration would win, but the first one is still checked, as in Mesos.
    let world = World::with_capacity(AMPLE).consuming("dev", "cpus:2");
    check_rejected(
        &world,
        &[raw("dev", "", "cpus:1"), raw("dev", "", "cpus:10")],
        false,
        "Invalid QuotaConfig: Role 'dev' is already consuming 'cpus:2'; this is more than the \
         requested limits 'cpus:1' (use 'force' flag to bypass this check)",
    );
}

#[test]
fn consumption_is_checked_before_the_hierarchy() {
    let world = World::with_capacity(AMPLE).consuming("a", "cpus:5");
    let configs = [raw("a", "", "cpus:1"), raw("b/c", "cpus:1", "")];
    check_rejected(
        &world,
        &configs,
        false,
        "Invalid QuotaConfig: Role 'a' is already consuming 'cpus:5'; this is more than the \
         requested limits 'cpus:1' (use 'force' flag to bypass this check)",
    );
    // force skips phase B and uncovers phase C, which force does not skip.
    check_rejected(
        &world,
        &configs,
        true,
        "Invalid QuotaConfig: Invalid quota configuration. Parent role 'b' with guarantees ({}) \
         does not contain the sum of its children's guarantees (cpus:1)",
    );
}

// ---- C: nested roles -------------------------------------------------------------------------

#[test]
fn nested_roles_are_accepted_when_parents_cover_children() {
    let mut world = World::with_capacity(AMPLE);
    let changes = world
        .commit(
            &[
                raw("a", "cpus:2;mem:10", ""),
                raw("a/b", "cpus:1", "cpus:4"),
                raw("a/c", "cpus:1;mem:10", ""),
                raw("a/b/d", "cpus:1", ""),
                raw("a/b/e", "", "cpus:100"),
            ],
            false,
        )
        .unwrap();
    assert_eq!(
        summary(&changes),
        ["+a", "+a/b", "+a/b/d", "+a/b/e", "+a/c"]
    );
    // A child with limits only needs nothing from its parent; limits are not nested-checked.
    assert!(world.update(&[raw("x/y", "", "cpus:5")], false).is_ok());
}

#[test]
fn hierarchy_errors_name_the_full_parent_role() {
    let cases: &[(&[RawQuotaConfig], &str)] = &[
        (
            &[raw("a/b", "cpus:1", "")],
            "Parent role 'a' with guarantees ({}) does not contain the sum of its children's \
             guarantees (cpus:1)",
        ),
        (
            &[
                raw("a", "cpus:2", ""),
                raw("a/b", "cpus:1.5", ""),
                raw("a/c", "cpus:1", ""),
            ],
            "Parent role 'a' with guarantees (cpus:2) does not contain the sum of its children's \
             guarantees (cpus:2.5)",
        ),
        (
            &[raw("a", "cpus:2", ""), raw("a/b", "mem:1", "")],
            "Parent role 'a' with guarantees (cpus:2) does not contain the sum of its children's \
             guarantees (mem:1)",
        ),
        // Mesos would print the basename 'b' here (spec §10 Q4).
        (
            &[
                raw("a", "cpus:5", ""),
                raw("a/b", "cpus:1", ""),
                raw("a/b/c", "cpus:2", ""),
            ],
            "Parent role 'a/b' with guarantees (cpus:1) does not contain the sum of its \
             children's guarantees (cpus:2)",
        ),
        // An implicit intermediate role has no guarantees.
        (
            &[raw("a", "cpus:5", ""), raw("a/b/c", "cpus:1", "")],
            "Parent role 'a/b' with guarantees ({}) does not contain the sum of its children's \
             guarantees (cpus:1)",
        ),
    ];
    for (configs, message) in cases {
        let world = World::with_capacity(AMPLE);
        check_rejected(
            &world,
            configs,
            false,
            &format!("Invalid QuotaConfig: Invalid quota configuration. {message}"),
        );
        check_rejected(
            &world,
            configs,
            true,
            &format!("Invalid QuotaConfig: Invalid quota configuration. {message}"),
        );
    }
}

#[test]
fn hierarchy_reports_children_before_parents_and_siblings_in_order() {
    let world = World::with_capacity(AMPLE);
    // Both a/b and a fail; a/b is visited first.
    check_rejected(
        &world,
        &[
            raw("a", "cpus:1", ""),
            raw("a/b", "cpus:2", ""),
            raw("a/b/c", "cpus:3", ""),
        ],
        false,
        "Invalid QuotaConfig: Invalid quota configuration. Parent role 'a/b' with guarantees \
         (cpus:2) does not contain the sum of its children's guarantees (cpus:3)",
    );
    // Both a and b fail; a comes first.
    check_rejected(
        &world,
        &[raw("b/y", "cpus:1", ""), raw("a/x", "mem:1", "")],
        false,
        "Invalid QuotaConfig: Invalid quota configuration. Parent role 'a' with guarantees ({}) \
         does not contain the sum of its children's guarantees (mem:1)",
    );
}

#[test]
fn hierarchy_includes_existing_entries() {
    let world = World::with_capacity(AMPLE)
        .entry("a", "cpus:2", "")
        .entry("a/b", "cpus:2", "");
    let too_small = "Invalid QuotaConfig: Invalid quota configuration. Parent role 'a' with \
                     guarantees (cpus:1) does not contain the sum of its children's guarantees \
                     (cpus:2)";
    check_rejected(&world, &[raw("a", "cpus:1", "")], false, too_small);
    // Deleting the parent leaves the child's guarantee uncovered.
    check_rejected(
        &world,
        &[raw("a", "", "")],
        false,
        "Invalid QuotaConfig: Invalid quota configuration. Parent role 'a' with guarantees ({}) \
         does not contain the sum of its children's guarantees (cpus:2)",
    );
    // Adding a sibling must still fit.
    check_rejected(
        &world,
        &[raw("a/c", "cpus:0.001", "")],
        false,
        "Invalid QuotaConfig: Invalid quota configuration. Parent role 'a' with guarantees \
         (cpus:2) does not contain the sum of its children's guarantees (cpus:2.001)",
    );
    // Lowering child and parent together, or deleting both, is fine.
    assert!(
        world
            .update(&[raw("a/b", "cpus:1", ""), raw("a", "cpus:1", "")], false)
            .is_ok()
    );
    assert_eq!(
        summary(
            &world
                .update(&[raw("a", "", ""), raw("a/b", "", "")], false)
                .unwrap()
        ),
        ["-a", "-a/b"]
    );
}

// ---- D: overcommit ---------------------------------------------------------------------------

#[test]
fn guarantees_beyond_capacity_need_force() {
    let world = World::with_capacity("cpus:10;mem:100");
    let configs = [raw("a", "cpus:11", "")];
    check_rejected(
        &world,
        &configs,
        false,
        "Invalid QuotaConfig: total quota guarantees 'cpus:11' exceed cluster capacity \
         'cpus:10; mem:100' (use 'force' flag to bypass this check)",
    );
    assert_eq!(summary(&world.update(&configs, true).unwrap()), ["+a"]);
}

#[test]
fn capacity_check_cases() {
    let world = World::with_capacity("cpus:10").entry("x", "cpus:6", "");
    check_rejected(
        &world,
        &[raw("a", "cpus:5", "")],
        false,
        "Invalid QuotaConfig: total quota guarantees 'cpus:11' exceed cluster capacity \
         'cpus:10' (use 'force' flag to bypass this check)",
    );
    // A resource the capacity lacks cannot be guaranteed.
    check_rejected(
        &world,
        &[raw("a", "gpus:1", "")],
        false,
        "Invalid QuotaConfig: total quota guarantees 'cpus:6; gpus:1' exceed cluster capacity \
         'cpus:10' (use 'force' flag to bypass this check)",
    );
    let accepted: &[&[RawQuotaConfig]] = &[
        // Replacing an entry counts its new value, not old plus new.
        &[raw("x", "cpus:10", "")],
        &[raw("a", "cpus:4", "")],
        // Children are inside their parents' guarantees and are not counted again.
        &[
            raw("a", "cpus:4", ""),
            raw("a/b", "cpus:4", ""),
            raw("a/b/c", "cpus:4", ""),
        ],
        // Limits are never checked against capacity (spec §10 Q6).
        &[raw("a", "", "cpus:1000;gpus:5")],
    ];
    for configs in accepted {
        assert!(world.update(configs, false).is_ok(), "{configs:?}");
    }
}

#[test]
fn an_empty_batch_still_checks_existing_guarantees() {
    let world = World::with_capacity("cpus:5").entry("x", "cpus:6", "");
    check_rejected(
        &world,
        &[],
        false,
        "Invalid QuotaConfig: total quota guarantees 'cpus:6' exceed cluster capacity 'cpus:5' \
         (use 'force' flag to bypass this check)",
    );
    assert_eq!(world.update(&[], true), Ok(vec![]));
    assert!(world.update(&[raw("x", "cpus:5", "")], false).is_ok());
    let empty = World::with_capacity("");
    assert_eq!(empty.update(&[], false), Ok(vec![]));
    check_rejected(
        &empty,
        &[raw("a", "cpus:1", "")],
        false,
        "Invalid QuotaConfig: total quota guarantees 'cpus:1' exceed cluster capacity '{}' (use \
         'force' flag to bypass this check)",
    );
}

#[test]
fn the_hierarchy_is_checked_before_capacity() {
    let world = World::with_capacity("");
    check_rejected(
        &world,
        &[raw("a/b", "cpus:1", "")],
        false,
        "Invalid QuotaConfig: Invalid quota configuration. Parent role 'a' with guarantees ({}) \
         does not contain the sum of its children's guarantees (cpus:1)",
    );
}

// ---- Changes: default means delete, duplicates, all or nothing -------------------------------

#[test]
fn the_default_quota_means_delete() {
    let mut world = World::with_capacity(AMPLE).entry("dev", "cpus:1", "cpus:2");
    for deleting in [
        raw("dev", "", ""),
        raw("dev", "cpus:0", ""),
        raw("dev", "cpus:0.0004;mem:0", ""),
    ] {
        assert_eq!(
            world.update(std::slice::from_ref(&deleting), false),
            Ok(vec![Change::Delete("dev".to_string())]),
            "{deleting:?}"
        );
    }
    world.commit(&[raw("dev", "", "")], false).unwrap();
    assert!(get_quota(&world.registry).is_empty());
    // Deleting a role that has no entry is accepted and changes nothing when applied.
    assert_eq!(
        world.commit(&[raw("ghost", "", "")], false),
        Ok(vec![Change::Delete("ghost".to_string())])
    );
    assert!(world.registry.is_empty());
}

#[test]
fn a_zero_limit_is_not_the_default_quota() {
    let world = World::with_capacity(AMPLE);
    assert_eq!(
        world.update(&[raw("dev", "cpus:0", "cpus:0")], false),
        Ok(vec![Change::Set(config("dev", "", "cpus:0"))])
    );
}

#[test]
fn one_change_per_role_sorted_and_the_last_occurrence_wins() {
    let world = World::with_capacity(AMPLE).entry("c", "cpus:1", "");
    let changes = world
        .update(
            &[
                raw("b", "cpus:1", ""),
                raw("a", "cpus:1", ""),
                raw("b", "cpus:2", ""),
                raw("c", "cpus:3", ""),
                raw("c", "", ""),
            ],
            false,
        )
        .unwrap();
    assert_eq!(
        changes,
        [
            Change::Set(config("a", "cpus:1", "")),
            Change::Set(config("b", "cpus:2", "")),
            Change::Delete("c".to_string()),
        ]
    );
    // Every occurrence is validated even though only the last one is applied.
    check_rejected(
        &world,
        &[raw("b", "cpus:-1", ""), raw("b", "cpus:1", "")],
        false,
        "Invalid QuotaConfig: Invalid guarantee configuration {'cpus': -1}: Negative values not \
         supported",
    );
}

#[test]
fn the_hierarchy_and_capacity_see_the_last_occurrence() {
    let world = World::with_capacity("cpus:3");
    // The first 'a' would overcommit and would not cover a/b; the last one does neither.
    let changes = world
        .update(
            &[
                raw("a", "cpus:5", ""),
                raw("a/b", "cpus:2", ""),
                raw("a", "cpus:3", ""),
            ],
            false,
        )
        .unwrap();
    assert_eq!(
        changes,
        [
            Change::Set(config("a", "cpus:3", "")),
            Change::Set(config("a/b", "cpus:2", ""))
        ]
    );
}

#[test]
fn a_rejected_batch_changes_nothing() {
    let mut world = World::with_capacity("cpus:10")
        .entry("x", "cpus:1", "")
        .consuming("y", "mem:5");
    let before: Registry = world.registry.clone();
    let rejected: &[&[RawQuotaConfig]] = &[
        &[
            raw("a", "cpus:1", ""),
            raw("x", "", ""),
            raw("b", "cpus:-1", ""),
        ],
        &[raw("a", "cpus:1", ""), raw("y", "", "mem:1")],
        &[raw("x", "", ""), raw("c/d", "cpus:1", "")],
        &[raw("x", "cpus:2", ""), raw("a", "cpus:9", "")],
    ];
    for configs in rejected {
        assert!(world.commit(configs, false).is_err(), "{configs:?}");
        assert_eq!(world.registry, before, "{configs:?}");
    }
}

#[test]
fn quota_on_the_star_role_is_allowed() {
    let world = World::with_capacity(AMPLE);
    assert_eq!(
        world.update(&[raw("*", "cpus:1", "cpus:2")], false),
        Ok(vec![Change::Set(config("*", "cpus:1", "cpus:2"))])
    );
}

#[test]
fn resubmitting_get_quota_changes_nothing() {
    let mut world = World::with_capacity(AMPLE);
    world
        .commit(
            &[
                raw("a", "cpus:1.5;mem:2048", "cpus:2;disk:0"),
                raw("a/b", "cpus:0.25", ""),
                raw("z", "", "gpus:1"),
            ],
            false,
        )
        .unwrap();
    let before = world.registry.clone();
    let resubmitted: Vec<RawQuotaConfig> = get_quota(&world.registry)
        .into_iter()
        .map(RawQuotaConfig::from)
        .collect();
    assert_eq!(
        resubmitted
            .iter()
            .map(|c| c.role.as_str())
            .collect::<Vec<_>>(),
        ["a", "a/b", "z"]
    );
    world.commit(&resubmitted, false).unwrap();
    assert_eq!(world.registry, before);
    assert_eq!(
        registry(&[
            config("a", "cpus:1.5;mem:2048", "cpus:2;disk:0"),
            config("a/b", "cpus:0.25", ""),
            config("z", "", "gpus:1")
        ]),
        before
    );
}

/// Random batches over a small role tree: after every accepted batch the registry keeps
/// QUOTA-7 and QUOTA-9; a rejected batch leaves it as it was.
#[test]
fn registry_invariants_hold_after_every_accepted_batch() {
    const ROLES: [&str; 7] = ["a", "a/b", "a/b/c", "a/d", "b", "b/x", "*"];
    const VALUES: [&str; 5] = ["", "0", "1", "2", "3"];
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |bound: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % bound as u64) as usize
    };
    let mut world = World::with_capacity("cpus:6;mem:6")
        .consuming("a", "cpus:1")
        .consuming("b/x", "mem:2");
    let (mut accepted, mut rejected) = (0, 0);
    for _ in 0..3000 {
        let mut configs = Vec::new();
        for _ in 0..next(4) {
            let text = |name: &str, next: &mut dyn FnMut(usize) -> usize| {
                let value = VALUES[next(VALUES.len())];
                if value.is_empty() {
                    String::new()
                } else {
                    format!("{name}:{value}")
                }
            };
            let guarantees = format!("{};{}", text("cpus", &mut next), text("mem", &mut next));
            let limits = format!("{};{}", text("cpus", &mut next), text("mem", &mut next));
            configs.push(raw(ROLES[next(ROLES.len())], &guarantees, &limits));
        }
        let force = next(4) == 0;
        let before = world.registry.clone();
        match world.commit(&configs, force) {
            Ok(_) => accepted += 1,
            Err(_) => {
                rejected += 1;
                assert_eq!(world.registry, before);
            }
        }
        check_registry_invariants(&world.registry);
    }
    assert!(
        accepted > 100 && rejected > 100,
        "accepted {accepted}, rejected {rejected}"
    );
}

fn check_registry_invariants(registry: &Registry) {
    for (role, config) in registry {
        assert_eq!(role, &config.role);
        assert!(!config.is_default(), "{role} stored with the default quota");
        assert!(
            config.limits.contains(&config.guarantees),
            "{role}: guarantees above limits"
        );
        if let Some(above) = parent(role) {
            let parent_guarantees = registry
                .get(above)
                .map(|c| c.guarantees.clone())
                .unwrap_or_default();
            let mut children = q("");
            for (other, other_config) in registry {
                if parent(other) == Some(above) {
                    children += &other_config.guarantees;
                }
            }
            assert!(
                parent_guarantees.contains(&children),
                "{above} does not cover its children"
            );
        }
    }
}
