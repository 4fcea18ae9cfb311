//! The independent drift check: the consumption the engine reports through its public API
//! (`Engine::roles`) against the model's recount from its own history and records
//! ([`super::accounts::Accounts::recount`]). It shares nothing with the engine's counters,
//! its recount or its owner rule, so a wrong charge, a missed release or a wrong owner in the
//! engine shows up as a [`Drift`].

use std::collections::{BTreeMap, BTreeSet};

use kvd::RoleUsage;

use super::accounts::{Amounts, Entry, Registry, Usage, UsageMap};

/// One disagreement between the engine's report and the recount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drift {
    /// A (role, resource) row differs (absent rows are all zero).
    Row {
        /// The role.
        role: String,
        /// The resource.
        resource: String,
        /// As the engine reports it.
        reported: Usage,
        /// As the model recounts it.
        recounted: Usage,
    },
    /// The engine lists a role the model does not, or misses one.
    Listed {
        /// The role.
        role: String,
        /// Listed by the engine.
        reported: bool,
    },
    /// A role's registry entry differs.
    Entry {
        /// The role.
        role: String,
        /// As the engine reports it.
        reported: Option<Entry>,
        /// As the model has it.
        expected: Option<Entry>,
    },
}

/// The consumption table, the listed roles and their entries, as the engine reported them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reported {
    /// (role, resource) → counters.
    pub usage: UsageMap,
    /// The roles listed.
    pub roles: BTreeSet<String>,
    /// The entries shown with them.
    pub entries: BTreeMap<String, Entry>,
}

/// Reads the engine's answer into the model's types (field by field, nothing computed).
pub fn reported(roles: &[RoleUsage]) -> Reported {
    let mut out = Reported::default();
    for r in roles {
        out.roles.insert(r.role.clone());
        for (resource, c) in &r.resources {
            out.usage.insert(
                (r.role.clone(), resource.clone()),
                Usage {
                    allocated: c.allocated,
                    reserved: c.reserved,
                    reserved_in_use: c.reserved_in_use,
                    offered: c.offered,
                },
            );
        }
        if let Some(q) = &r.quota {
            let guarantees: Amounts = q
                .guarantees
                .iter()
                .map(|(n, v)| (n.to_owned(), v.milli()))
                .collect();
            let limits: Amounts = q
                .limits
                .iter()
                .map(|(n, v)| (n.to_owned(), v.milli()))
                .collect();
            out.entries
                .insert(r.role.clone(), Entry { guarantees, limits });
        }
    }
    out
}

/// Returns every disagreement between `reported` and the model's `usage`, `roles` and
/// `registry` (roles listed with an entry must show it; others must show none).
pub fn compare(
    reported: &Reported,
    usage: &UsageMap,
    roles: &BTreeSet<String>,
    registry: &Registry,
) -> Vec<Drift> {
    let mut out = Vec::new();
    let rows: BTreeSet<&(String, String)> = reported.usage.keys().chain(usage.keys()).collect();
    for key in rows {
        let got = reported.usage.get(key).copied().unwrap_or_default();
        let want = usage.get(key).copied().unwrap_or_default();
        if got != want {
            out.push(Drift::Row {
                role: key.0.clone(),
                resource: key.1.clone(),
                reported: got,
                recounted: want,
            });
        }
    }
    for role in reported.roles.symmetric_difference(roles) {
        out.push(Drift::Listed {
            role: role.clone(),
            reported: reported.roles.contains(role),
        });
    }
    let named: BTreeSet<&String> = reported.entries.keys().chain(registry.keys()).collect();
    for role in named {
        let got = reported.entries.get(role);
        let want = registry.get(role);
        if got != want {
            out.push(Drift::Entry {
                role: role.clone(),
                reported: got.cloned(),
                expected: want.cloned(),
            });
        }
    }
    out
}
