//! `ResourceLimits`: per-resource caps where an absent name means unlimited and a zero limit is
//! kept (spec §1.5).
//!
//! Owns: [`ResourceLimits`], its two `contains` relations, subtracting quantities from it, and
//! how it prints.
//!
//! Invariants:
//! - QUOTA-4: an absent name is no limit at all; a present name, zero included, is a finite
//!   limit. `{cpus:0}` means "no cpus" and is not the same value as `{}`.
//! - Names are kept in ascending byte order, which is also the print order.
//!
//! Contact points: limits in `config.rs`; `validate.rs` checks guarantees and current
//! consumption against them; the engine's admission check uses [`ResourceLimits::contains`]
//! with a role's consumption after a write.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::{Sub, SubAssign};

use super::quantities::{ResourceQuantities, write_entries};
use super::scalar::Scalar;

/// Finite limits on named resources; an absent name is unlimited (QUOTA-4).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ResourceLimits {
    entries: BTreeMap<String, Scalar>,
}

impl ResourceLimits {
    /// Returns no limits at all, `{}`.
    pub const fn new() -> ResourceLimits {
        ResourceLimits {
            entries: BTreeMap::new(),
        }
    }

    /// Sets the limit of `name` to `limit`, replacing any earlier one; zero is kept.
    pub fn set(&mut self, name: &str, limit: Scalar) {
        self.entries.insert(name.to_string(), limit);
    }

    /// Returns the limit of `name`, or `None` when it is unlimited.
    pub fn get(&self, name: &str) -> Option<Scalar> {
        self.entries.get(name).copied()
    }

    /// Returns the finite limits in ascending name order, zeros included.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Scalar)> {
        self.entries
            .iter()
            .map(|(name, value)| (name.as_str(), *value))
    }

    /// Returns the number of limited resources.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Returns `true` when nothing is limited.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Returns `true` when every quantity that has a finite limit is within it; names without
    /// a limit are ignored. `{}` contains anything; `{cpus:0}` contains `{mem:5}` but not
    /// `{cpus:0.001}`.
    pub fn contains(&self, quantities: &ResourceQuantities) -> bool {
        quantities
            .iter()
            .all(|(name, value)| self.get(name).is_none_or(|limit| limit >= value))
    }

    /// Returns `true` when `self` is at least as permissive as `other`: every name finite in
    /// `self` is also finite in `other`, and no smaller there. `{}` contains anything;
    /// `{cpus:1}` does not contain `{}`; `{cpus:1;mem:1}` contains `{cpus:1;mem:1;disk:1}`.
    pub fn contains_limits(&self, other: &ResourceLimits) -> bool {
        self.iter()
            .all(|(name, limit)| other.get(name).is_some_and(|theirs| limit >= theirs))
    }
}

impl<S: AsRef<str>> FromIterator<(S, Scalar)> for ResourceLimits {
    /// Builds limits by calling [`ResourceLimits::set`] on each pair in turn: zeros are kept and a
    /// later pair for the same name replaces an earlier one.
    fn from_iter<I: IntoIterator<Item = (S, Scalar)>>(pairs: I) -> ResourceLimits {
        let mut limits = ResourceLimits::new();
        for (name, limit) in pairs {
            limits.set(name.as_ref(), limit);
        }
        limits
    }
}

impl SubAssign<&ResourceQuantities> for ResourceLimits {
    /// Lowers each finite limit by the quantity of the same name, flooring at zero (the entry
    /// is kept); unlimited names stay unlimited. `{cpus:1} - {cpus:2} = {cpus:0}`.
    fn sub_assign(&mut self, quantities: &ResourceQuantities) {
        for (name, limit) in &mut self.entries {
            *limit = limit.saturating_sub(quantities.get(name));
        }
    }
}

impl Sub<&ResourceQuantities> for &ResourceLimits {
    type Output = ResourceLimits;

    fn sub(self, quantities: &ResourceQuantities) -> ResourceLimits {
        let mut remaining = self.clone();
        remaining -= quantities;
        remaining
    }
}

impl fmt::Display for ResourceLimits {
    /// Prints as Mesos does: `cpus:0; mem:5`, sorted by name, and `{}` when unlimited.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_entries(f, self.entries.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::test_support::{l, q};

    #[test]
    fn zero_limit_is_kept_and_differs_from_unlimited() {
        assert_eq!(l("cpus:0").get("cpus"), Some(Scalar::ZERO));
        assert_eq!(l("cpus:0.0004").get("cpus"), Some(Scalar::ZERO));
        assert_eq!(l("").get("cpus"), None);
        assert_ne!(l("cpus:0"), l(""));
        assert_eq!(l("cpus:0").len(), 1);
        assert_eq!(l("cpus:0").to_string(), "cpus:0");
    }

    #[test]
    fn contains_quantities_cases_from_the_spec() {
        let cases: &[(&str, &str, bool)] = &[
            ("", "", true),
            ("", "cpus:100;mem:5", true),
            ("cpus:0", "cpus:0.001", false),
            ("cpus:0", "mem:5", true),
            ("cpus:0", "", true),
            ("cpus:0", "cpus:0.0004", true),
            ("cpus:1", "cpus:1", true),
            ("cpus:1", "cpus:1.001", false),
            ("cpus:1;mem:10", "cpus:1;mem:11", false),
            ("cpus:1;mem:10", "cpus:1;disk:1000", true),
        ];
        for (limits, quantities, expected) in cases {
            assert_eq!(
                l(limits).contains(&q(quantities)),
                *expected,
                "{{{limits}}} ⊇ {{{quantities}}}"
            );
        }
    }

    #[test]
    fn contains_limits_cases_from_the_spec() {
        let cases: &[(&str, &str, bool)] = &[
            ("", "", true),
            ("", "cpus:1", true),
            ("cpus:1", "", false),
            ("cpus:1;mem:1", "cpus:1;mem:1;disk:1", true),
            ("cpus:1;mem:1", "cpus:1;disk:1", false),
            ("cpus:1;disk:1", "cpus:1;mem:1", false),
            ("cpus:2", "cpus:1", true),
            ("cpus:1", "cpus:2", false),
            ("cpus:0", "cpus:0", true),
        ];
        for (left, right, expected) in cases {
            assert_eq!(
                l(left).contains_limits(&l(right)),
                *expected,
                "{{{left}}} ⊇ {{{right}}}"
            );
        }
    }

    #[test]
    fn subtracting_quantities_floors_at_zero_and_keeps_unlimited() {
        let cases: &[(&str, &str, &str)] = &[
            ("cpus:1", "cpus:2", "cpus:0"),
            ("", "cpus:10", "{}"),
            ("cpus:1;mem:10", "cpus:1;mem:5;disk:10", "cpus:0; mem:5"),
            ("cpus:0", "", "cpus:0"),
        ];
        for (limits, quantities, remaining) in cases {
            assert_eq!((&l(limits) - &q(quantities)).to_string(), *remaining);
        }
    }

    #[test]
    fn prints_like_mesos() {
        assert_eq!(l("mem:5;cpus:0").to_string(), "cpus:0; mem:5");
        assert_eq!(l("").to_string(), "{}");
        assert_eq!(l("cpus:0.5;cpus:2").to_string(), "cpus:2");
    }
}
