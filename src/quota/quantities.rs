//! `ResourceQuantities`: amounts of named resources where an absent name means zero (spec §1.4).
//!
//! Owns: [`ResourceQuantities`], its arithmetic, `contains`, and how it prints.
//!
//! Invariants:
//! - QUOTA-3: every stored value is greater than zero; zero (judged in milli-units) is never
//!   stored, so `{cpus:0}` and `{}` are the same value and compare equal. Subtraction floors at
//!   zero and drops the entry; nothing is ever negative.
//! - Names are kept in ascending byte order (a `BTreeMap`), which is also the print order.
//!
//! Contact points: guarantees in `config.rs`, consumption and capacity handed to
//! `validate.rs` by the engine, the right-hand side of `ResourceLimits::contains`.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::{Add, AddAssign, Sub, SubAssign};

use super::scalar::Scalar;

/// Quantities of named resources; an absent name is zero (QUOTA-3).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ResourceQuantities {
    entries: BTreeMap<String, Scalar>,
}

impl ResourceQuantities {
    /// Returns the empty quantities, `{}`.
    pub const fn new() -> ResourceQuantities {
        ResourceQuantities {
            entries: BTreeMap::new(),
        }
    }

    /// Adds `value` to the quantity of `name`, as Mesos's `ResourceQuantities::add`: zero is
    /// ignored and an existing entry is summed (saturating, QUOTA-1).
    pub fn add_resource(&mut self, name: &str, value: Scalar) {
        if value.is_zero() {
            return;
        }
        match self.entries.get_mut(name) {
            Some(existing) => *existing = existing.saturating_add(value),
            None => {
                self.entries.insert(name.to_string(), value);
            }
        }
    }

    /// Returns the quantity of `name`, zero when absent.
    pub fn get(&self, name: &str) -> Scalar {
        self.entries.get(name).copied().unwrap_or(Scalar::ZERO)
    }

    /// Returns the entries in ascending name order; every value is non-zero.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Scalar)> {
        self.entries
            .iter()
            .map(|(name, value)| (name.as_str(), *value))
    }

    /// Returns the number of names with a non-zero quantity.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Returns `true` when every quantity is zero.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Returns `true` when `self[name] >= other[name]` for every name in `other`, an absent
    /// name in `self` counting as zero: `{}` contains `{}`, `{cpus:1}` contains `{}`, `{}` does
    /// not contain `{cpus:1}`.
    pub fn contains(&self, other: &ResourceQuantities) -> bool {
        other.iter().all(|(name, value)| self.get(name) >= value)
    }
}

impl<S: AsRef<str>> FromIterator<(S, Scalar)> for ResourceQuantities {
    /// Builds quantities by adding each pair with [`ResourceQuantities::add_resource`]:
    /// duplicate names are summed and zeros dropped, like Mesos's constructor from a map.
    fn from_iter<I: IntoIterator<Item = (S, Scalar)>>(pairs: I) -> ResourceQuantities {
        let mut quantities = ResourceQuantities::new();
        for (name, value) in pairs {
            quantities.add_resource(name.as_ref(), value);
        }
        quantities
    }
}

impl AddAssign<&ResourceQuantities> for ResourceQuantities {
    /// Adds `other` name by name.
    fn add_assign(&mut self, other: &ResourceQuantities) {
        for (name, value) in other.iter() {
            self.add_resource(name, value);
        }
    }
}

impl SubAssign<&ResourceQuantities> for ResourceQuantities {
    /// Subtracts `other` name by name: a result at or below zero removes the entry, and a
    /// name only in `other` is ignored (QUOTA-3).
    fn sub_assign(&mut self, other: &ResourceQuantities) {
        self.entries.retain(|name, value| {
            *value = value.saturating_sub(other.get(name));
            !value.is_zero()
        });
    }
}

impl Add<&ResourceQuantities> for &ResourceQuantities {
    type Output = ResourceQuantities;

    fn add(self, other: &ResourceQuantities) -> ResourceQuantities {
        let mut sum = self.clone();
        sum += other;
        sum
    }
}

impl Sub<&ResourceQuantities> for &ResourceQuantities {
    type Output = ResourceQuantities;

    fn sub(self, other: &ResourceQuantities) -> ResourceQuantities {
        let mut difference = self.clone();
        difference -= other;
        difference
    }
}

impl fmt::Display for ResourceQuantities {
    /// Prints as Mesos does: `cpus:2; disk:1024; mem:1024`, sorted by name, and `{}` when
    /// empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_entries(f, self.entries.iter())
    }
}

/// Writes `name:value` pairs joined by `"; "`, or `{}` when there are none; shared with
/// `ResourceLimits`, which Mesos prints the same way.
pub(crate) fn write_entries<'a>(
    f: &mut fmt::Formatter<'_>,
    entries: impl ExactSizeIterator<Item = (&'a String, &'a Scalar)>,
) -> fmt::Result {
    if entries.len() == 0 {
        return f.write_str("{}");
    }
    for (index, (name, value)) in entries.enumerate() {
        if index > 0 {
            f.write_str("; ")?;
        }
        write!(f, "{name}:{value}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::test_support::q;

    #[test]
    fn zero_is_dropped_and_absent_is_zero() {
        assert_eq!(q("cpus:0"), q(""));
        assert_eq!(q("cpus:0.0004"), q(""));
        assert_eq!(q("cpus:0.0004").len(), 0);
        assert_eq!(q("mem:5").get("cpus"), Scalar::ZERO);
        assert!(q("cpus:0;mem:0").is_empty());
        assert_eq!(q("cpus:1;cpus:2").get("cpus"), Scalar::from_units(3));
    }

    #[test]
    fn contains_cases_from_the_spec() {
        let cases: &[(&str, &str, bool)] = &[
            ("", "", true),
            ("cpus:1", "", true),
            ("", "cpus:1", false),
            ("cpus:1;mem:1", "cpus:1;disk:1", false),
            ("cpus:1;mem:1", "cpus:1;mem:1", true),
            ("cpus:2;mem:1", "cpus:1", true),
            ("cpus:1", "cpus:1.0004", true),
            ("cpus:1", "cpus:1.0005", false),
            ("cpus:1", "cpus:0", true),
        ];
        for (left, right, expected) in cases {
            assert_eq!(
                q(left).contains(&q(right)),
                *expected,
                "{{{left}}} ⊇ {{{right}}}"
            );
        }
    }

    #[test]
    fn addition_merges_by_name() {
        let cases: &[(&str, &str, &str)] = &[
            ("", "", "{}"),
            ("cpus:1", "", "cpus:1"),
            ("cpus:1", "mem:2", "cpus:1; mem:2"),
            ("cpus:1;mem:1", "cpus:0.5;disk:3", "cpus:1.5; disk:3; mem:1"),
        ];
        for (left, right, sum) in cases {
            assert_eq!((&q(left) + &q(right)).to_string(), *sum, "{left} + {right}");
        }
    }

    #[test]
    fn subtraction_never_goes_negative() {
        let cases: &[(&str, &str, &str)] = &[
            ("cpus:2", "cpus:1", "cpus:1"),
            ("cpus:1", "cpus:1", "{}"),
            ("cpus:1", "cpus:2", "{}"),
            ("cpus:1", "mem:5", "cpus:1"),
            ("", "cpus:1", "{}"),
            ("cpus:3;mem:10", "cpus:1;mem:20;disk:1", "cpus:2"),
        ];
        for (left, right, difference) in cases {
            assert_eq!(
                (&q(left) - &q(right)).to_string(),
                *difference,
                "{left} - {right}"
            );
        }
    }

    #[test]
    fn sums_saturate_instead_of_wrapping() {
        let mut big = ResourceQuantities::new();
        big.add_resource("mem", Scalar::MAX);
        big.add_resource("mem", Scalar::from_units(1));
        assert_eq!(big.get("mem"), Scalar::MAX);
    }

    #[test]
    fn prints_sorted_like_mesos() {
        assert_eq!(
            q("mem:1024;disk:1024;cpus:2").to_string(),
            "cpus:2; disk:1024; mem:1024"
        );
        assert_eq!(q("cpus:1").to_string(), "cpus:1");
        assert_eq!(q("").to_string(), "{}");
        assert_eq!(q("cpus:1.2345").to_string(), "cpus:1.235");
        // Byte order: upper case before lower case, '-' before '/' before letters.
        assert_eq!(q("b:1;B:2;a-b:3").to_string(), "B:2; a-b:3; b:1");
    }
}
