//! The usage counters of the consumption tables: charges and releases as writes and
//! compactions happen, the limit checks that refuse a write before it changes anything
//! (ACCT-4), and the recount from the index and the records that ACCT-1 is stated against.

use std::collections::{BTreeMap, BTreeSet};

use super::Column;
use super::{Accounts, Counters, KV_BYTES, KV_KEYS, MILLI, chain};
use crate::error::Error;
use crate::mvcc::index::{Index, KeyRange};
use crate::quota::{self, Scalar};

impl Accounts {
    /// Returns usage recounted from scratch: every key of `index` charged to its owner,
    /// every record to its role (ACCT-1).
    pub fn recount(&self, index: &Index) -> BTreeMap<(String, String), Counters> {
        let mut usage: BTreeMap<(String, String), Counters> = BTreeMap::new();
        let mut add = |role: &str, resource: &str, delta: Counters| {
            for r in chain(role) {
                usage
                    .entry((r.to_owned(), resource.to_owned()))
                    .or_default()
                    .add(&delta, 1);
            }
        };
        index.visit_range(KeyRange::new(b"\0", b"\0"), |key, cost, alive| {
            let owner = quota::charged_role(key, &self.registry);
            add(
                owner,
                KV_BYTES,
                Counters::of(Column::Allocated, cost as i64 * MILLI),
            );
            if alive {
                add(owner, KV_KEYS, Counters::of(Column::Allocated, MILLI));
            }
        });
        for r in self.reservations.values() {
            for (name, value) in r.resources.iter() {
                let in_use = r.in_use.get(name).milli();
                add(
                    &r.role,
                    name,
                    Counters {
                        reserved: value.milli(),
                        reserved_in_use: in_use,
                        ..Counters::default()
                    },
                );
            }
        }
        for a in self.allocations.values() {
            let counter = if a.preparing {
                Column::Offered
            } else {
                Column::Allocated
            };
            for (name, value) in a.resources.iter() {
                add(&a.role, name, Counters::of(counter, value.milli()));
            }
        }
        usage.retain(|_, c| !c.is_zero());
        usage
    }

    /// Returns the differences between the usage counters and a recount: (role, resource,
    /// counted, recounted). Empty when ACCT-1 holds.
    pub fn drift(&self, index: &Index) -> Vec<(String, String, Counters, Counters)> {
        let recount = self.recount(index);
        let keys: BTreeSet<_> = recount.keys().chain(self.usage.keys()).cloned().collect();
        keys.into_iter()
            .filter_map(|key| {
                let counted = self.usage.get(&key).copied().unwrap_or_default();
                let truth = recount.get(&key).copied().unwrap_or_default();
                (counted != truth).then_some((key.0, key.1, counted, truth))
            })
            .collect()
    }

    /// Replaces the usage counters with a recount; returns how many changed.
    pub fn repair(&mut self, index: &Index) -> usize {
        let drift = self.drift(index);
        for (role, resource, _, truth) in &drift {
            let key = (role.clone(), resource.clone());
            if truth.is_zero() {
                self.usage.remove(&key);
            } else {
                self.usage.insert(key.clone(), *truth);
            }
        }
        drift.len()
    }

    pub(super) fn charge(&mut self, role: &str, resource: &str, delta: Counters, sign: i64) {
        for r in chain(role) {
            // The probe's strings keep their capacity, so charging a row that exists (every
            // Put but a role's first) allocates nothing.
            let probe = &mut self.usage_probe;
            probe.0.clear();
            probe.0.push_str(r);
            probe.1.clear();
            probe.1.push_str(resource);
            if let Some(row) = self.usage.get_mut(probe) {
                row.add(&delta, sign);
                if row.is_zero() {
                    self.usage.remove(probe);
                }
                continue;
            }
            let mut row = Counters::default();
            row.add(&delta, sign);
            if !row.is_zero() {
                self.usage.insert(probe.clone(), row);
            }
        }
    }

    /// Returns the counters of `role` and `resource` (zero if it has none).
    fn counters(&self, role: &str, resource: &str) -> Counters {
        self.usage
            .get(&(role.to_owned(), resource.to_owned()))
            .copied()
            .unwrap_or_default()
    }

    /// Charges a Put of `cost` bytes to the owner of `key`; `new_key` if it was not alive.
    pub fn charge_put(&mut self, key: &[u8], cost: u32, new_key: bool) {
        let owner = self.owner(key);
        self.charge(
            owner,
            KV_BYTES,
            Counters::of(Column::Allocated, i64::from(cost) * MILLI),
            1,
        );
        if new_key {
            self.charge(owner, KV_KEYS, Counters::of(Column::Allocated, MILLI), 1);
        }
    }

    /// Uncharges a deleted key from its owner (deletes free `kv_keys`, not `kv_bytes`).
    pub fn charge_delete(&mut self, key: &[u8]) {
        let owner = self.owner(key);
        self.charge(owner, KV_KEYS, Counters::of(Column::Allocated, MILLI), -1);
    }

    /// Releases `cost` bytes of revisions of `key` that a compaction dropped.
    pub fn release_bytes(&mut self, key: &[u8], cost: u64) {
        let owner = self.owner(key);
        let delta = Counters::of(
            Column::Allocated,
            i64::try_from(cost).unwrap_or(i64::MAX) * MILLI,
        );
        self.charge(owner, KV_BYTES, delta, -1);
    }

    /// Checks that charging `amounts` (resource → milli-units) to `role` keeps what it and
    /// every ancestor hold (consumed + offered) within their limits (ACCT-4).
    pub fn check_limits(&self, role: &str, amounts: &BTreeMap<&str, i64>) -> Result<(), Error> {
        for r in chain(role) {
            let Some(config) = self.registry.get(r) else {
                continue;
            };
            for (resource, amount) in amounts {
                if *amount <= 0 {
                    continue;
                }
                let Some(limit) = config.limits.get(resource) else {
                    continue;
                };
                let counters = self.counters(r, resource);
                if counters.held().saturating_add(*amount) > limit.milli() {
                    return Err(exceeded(r, resource, &counters, *amount, limit));
                }
            }
        }
        Ok(())
    }

    /// Returns true if some role has a quota, so [`Accounts::check_puts`] can refuse a
    /// write; with none, a write's Puts need not be planned for it.
    pub fn checks_puts(&self) -> bool {
        !self.registry.is_empty()
    }

    /// Checks the built-in resources of a write: `puts` are (key, cost, new key) (ACCT-4).
    pub fn check_puts(&self, puts: &[(Vec<u8>, u32, bool)]) -> Result<(), Error> {
        if self.registry.is_empty() {
            return Ok(());
        }
        if let [(key, cost, new_key)] = puts {
            // One Put, the common case: no maps to build.
            let owner = self.owner(key);
            // Ancestors first: role-name order, as the multi-Put path below reports.
            let roles: Vec<&str> = chain(owner).collect();
            for &r in roles.iter().rev() {
                let Some(config) = self.registry.get(r) else {
                    continue;
                };
                let bytes = i64::from(*cost) * MILLI;
                let keys = if *new_key { MILLI } else { 0 };
                for (resource, amount) in [(KV_BYTES, bytes), (KV_KEYS, keys)] {
                    if let Some(limit) = config.limits.get(resource) {
                        let counters = self.counters(r, resource);
                        if amount > 0 && counters.held().saturating_add(amount) > limit.milli() {
                            return Err(exceeded(r, resource, &counters, amount, limit));
                        }
                    }
                }
            }
            return Ok(());
        }
        let mut by_owner: BTreeMap<&str, BTreeMap<&str, i64>> = BTreeMap::new();
        for (key, cost, new_key) in puts {
            let amounts = by_owner.entry(self.owner(key)).or_default();
            *amounts.entry(KV_BYTES).or_default() += i64::from(*cost) * MILLI;
            if *new_key {
                *amounts.entry(KV_KEYS).or_default() += MILLI;
            }
        }
        // Charges to sibling roles meet at shared ancestors: check the sums there too.
        let mut totals: BTreeMap<&str, BTreeMap<&str, i64>> = BTreeMap::new();
        for (owner, amounts) in &by_owner {
            for r in chain(owner) {
                for (resource, amount) in amounts {
                    *totals.entry(r).or_default().entry(resource).or_default() += amount;
                }
            }
        }
        for (role, amounts) in &totals {
            self.check_limits_here(role, amounts)?;
        }
        Ok(())
    }

    fn check_limits_here(&self, role: &str, amounts: &BTreeMap<&str, i64>) -> Result<(), Error> {
        let Some(config) = self.registry.get(role) else {
            return Ok(());
        };
        for (resource, amount) in amounts {
            let Some(limit) = config.limits.get(resource) else {
                continue;
            };
            let counters = self.counters(role, resource);
            if *amount > 0 && counters.held().saturating_add(*amount) > limit.milli() {
                return Err(exceeded(role, resource, &counters, *amount, limit));
            }
        }
        Ok(())
    }
}

/// Returns the refusal of a charge of `amount` to `role` that its `limit` on `resource` does
/// not allow (ACCT-4); the message names the role, the resource, the consumption, what
/// preparing allocations hold (only when they hold some), the request and the limit.
fn exceeded(role: &str, resource: &str, held: &Counters, amount: i64, limit: Scalar) -> Error {
    let offered = match held.offered {
        0 => String::new(),
        milli => format!(" + offered {}", show(milli)),
    };
    Error::QuotaExceeded(format!(
        "kvd: quota exceeded for role '{role}': {resource} consumption {}{offered} + request {} > limit {limit}",
        show(held.consumed()),
        show(amount)
    ))
}

/// Prints milli-units as Mesos prints scalars.
fn show(milli: i64) -> String {
    Scalar::from_milli(milli).map_or_else(|| format!("-{}", show(-milli)), |s| s.to_string())
}
