//! Quota registry updates (Mesos's UPDATE_QUOTA) in the engine: the capacity guarantees must
//! fit in, and the consumption that moves when a role gains or loses its entry (ACCT-5),
//! validated by the pure core in `quota` and committed with the registry rows.

use std::collections::{BTreeMap, BTreeSet};

use super::Column;
use super::{
    Accounts, AgentState, Counters, KV_BYTES, KV_KEYS, MILLI, REGISTRY_TABLE, chain, codec,
};
use crate::api::prefix_end;
use crate::error::Error;
use crate::mvcc::index::{Index, KeyRange};
use crate::quota::{self, RawQuotaConfig, Registry, ResourceQuantities, Scalar};
use crate::storage::WriteBatch;

impl Accounts {
    /// Returns the capacity guarantees must fit in: the space quota for `kv_bytes`,
    /// unlimited `kv_keys`, and the registered agents' totals for the rest.
    fn capacity(&self, quota_bytes: Option<u64>) -> ResourceQuantities {
        let mut capacity = ResourceQuantities::default();
        for agent in self
            .agents
            .values()
            .filter(|a| a.state == AgentState::Registered)
        {
            for (name, value) in agent.resources.iter() {
                capacity.add_resource(name, value);
            }
        }
        let bytes = quota_bytes.map_or(Scalar::MAX, |q| {
            Scalar::from_milli(i64::try_from(q).unwrap_or(i64::MAX).saturating_mul(MILLI))
                .unwrap_or(Scalar::MAX)
        });
        capacity.add_resource(KV_BYTES, bytes);
        capacity.add_resource(KV_KEYS, Scalar::MAX);
        capacity
    }

    /// Applies an UPDATE_QUOTA: moves consumption for roles gaining or losing their entry
    /// (ACCT-5), validates with Mesos's rules against the moved consumption, and on success
    /// commits the registry rows in `batch`. On failure nothing changes.
    pub fn update_quota(
        &mut self,
        configs: &[RawQuotaConfig],
        force: bool,
        quota_bytes: Option<u64>,
        index: &Index,
        batch: &mut WriteBatch<'_>,
    ) -> Result<(), Error> {
        let capacity = self.capacity(quota_bytes);
        // The registry as the batch would leave it, to know whose keys move (ACCT-5).
        let mut tentative = self.registry.clone();
        for raw in configs {
            match quota::validate_config(raw) {
                Ok(config) if config.is_default() => {
                    tentative.remove(&config.role);
                }
                Ok(config) => {
                    tentative.insert(config.role.clone(), config);
                }
                // Invalid: validate_update below reports it, and nothing changes.
                Err(_) => {}
            }
        }
        let moved = self.moved_usage(&tentative, index);
        // What a role holds: preparing allocations count, since START makes them consumption
        // without a check (ACCT-4).
        let consumption = |role: &str| {
            let mut quantities = ResourceQuantities::default();
            for ((r, resource), counters) in &moved {
                if r == role
                    && let Some(value) = Scalar::from_milli(counters.held())
                {
                    quantities.add_resource(resource, value);
                }
            }
            quantities
        };
        let changes =
            quota::validate_update(configs, force, &self.registry, &consumption, &capacity)
                .map_err(Error::QuotaRequest)?;
        for change in &changes {
            match change {
                quota::Change::Set(config) => batch.put_row(
                    REGISTRY_TABLE,
                    config.role.as_bytes(),
                    &codec::encode_config(config),
                )?,
                quota::Change::Delete(role) => {
                    batch.delete_row(REGISTRY_TABLE, role.as_bytes())?;
                }
            }
        }
        quota::apply(&mut self.registry, changes);
        self.usage = moved;
        Ok(())
    }

    /// Returns the usage after owners change from the current registry to `tentative`.
    fn moved_usage(
        &self,
        tentative: &Registry,
        index: &Index,
    ) -> BTreeMap<(String, String), Counters> {
        let mut usage = self.usage.clone();
        let changed: BTreeSet<&String> = self
            .registry
            .keys()
            .chain(tentative.keys())
            .filter(|role| self.registry.contains_key(*role) != tentative.contains_key(*role))
            .collect();
        // Keys outside the namespaces of changed roles keep their owner; nested changed
        // roles are covered by their outermost changed ancestor's scan.
        let outermost: Vec<&&String> = changed
            .iter()
            .filter(|role| !quota::ancestors(role).any(|a| changed.contains(&a.to_owned())))
            .collect();
        for role in outermost {
            let prefix = quota::namespace_prefix(role);
            let end = prefix_end(prefix.as_bytes());
            index.visit_range(
                KeyRange::new(prefix.as_bytes(), &end),
                |key, cost, alive| {
                    let before = quota::charged_role(key, &self.registry);
                    let after = quota::charged_role(key, tentative);
                    if before == after {
                        return;
                    }
                    let bytes = Counters::of(Column::Allocated, cost as i64 * MILLI);
                    let keys = Counters::of(Column::Allocated, if alive { MILLI } else { 0 });
                    for (owner, sign) in [(before, -1), (after, 1)] {
                        for r in chain(owner) {
                            usage
                                .entry((r.to_owned(), KV_BYTES.to_owned()))
                                .or_default()
                                .add(&bytes, sign);
                            usage
                                .entry((r.to_owned(), KV_KEYS.to_owned()))
                                .or_default()
                                .add(&keys, sign);
                        }
                    }
                },
            );
        }
        usage.retain(|_, c| !c.is_zero());
        usage
    }
}
