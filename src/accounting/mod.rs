//! Consumption tables and the quota registry in the engine: per role and resource, what is
//! allocated, reserved and offered, counted in the same transaction as the writes and
//! records that make it up, and checked against the registry's limits.
//!
//! The model (`docs/design/quota.md`): a key belongs to the deepest role with a registry
//! entry whose namespace (`/role/`) prefixes it, else to `*`. Built-in resources: `kv_bytes`
//! (etcd's Put cost of every revision the index retains; released when compaction drops
//! the revision) and `kv_keys` (live keys). Application resources (cpus, mem, ...) come from
//! reservation and allocation records. Every amount charged to a role is also charged to all
//! its ancestors, so a role's row is its whole subtree.
//!
//! Invariants:
//! - ACCT-1 (conservation): every usage counter equals a recount from the index and the records
//!   ([`Accounts::recount`]).
//! - ACCT-2: registry rows and records change in the same storage transaction as the data
//!   they describe, and the usage counters change in the same apply step as the writes they
//!   count; a refused request changes none of them. The counters are derived state, not
//!   stored: open rebuilds them from the index and the records (ACCT-1), which costs one pass
//!   over the keys and spares every batch a usage-row insert per role and resource (the
//!   benchmark measured 36% with 1,000 roles when they were stored).
//! - ACCT-3: `consumed = allocated + reserved - reserved_in_use`; offered is shown, not
//!   counted.
//! - ACCT-4: a write that would take its role or an ancestor past a limit is refused before
//!   it changes anything; deletes are never refused.
//! - ACCT-5: a registry change that gives a role its first entry (or removes its last) moves
//!   the consumption of the keys whose owner changes, before the limit check sees it.
//!
//! Contact points: `engine::apply` calls the charge, check and record operations inside its
//! batch; `quota` (the pure Mesos core) validates updates and formats values.

mod codec;

use std::collections::{BTreeMap, BTreeSet};

use crate::api::prefix_end;
use crate::error::{Error, StorageError};
use crate::mvcc::index::{Index, KeyRange};
use crate::quota::{
    self, QuotaConfig, RawQuotaConfig, Registry, ResourceQuantities, STAR_ROLE, Scalar,
};
use crate::storage::{RowTable, Snapshot, WriteBatch};

/// The built-in resource counting the bytes of retained revisions (etcd's cost model).
pub const KV_BYTES: &str = "kv_bytes";
/// The built-in resource counting live keys.
pub const KV_KEYS: &str = "kv_keys";
/// Registry rows: role → encoded [`QuotaConfig`].
pub const REGISTRY_TABLE: RowTable = RowTable::new("quota_registry");
/// Agents: id → state and total resources.
pub const AGENTS_TABLE: RowTable = RowTable::new("agents");
/// Reservations: id → role, agent, resources.
pub const RESERVATIONS_TABLE: RowTable = RowTable::new("reservations");
/// Allocations: id → role, agent, resources, what they drew from reservations.
pub const ALLOCATIONS_TABLE: RowTable = RowTable::new("allocations");
/// Every table of this module, for the engine to register.
pub const TABLES: [RowTable; 4] = [
    REGISTRY_TABLE,
    AGENTS_TABLE,
    RESERVATIONS_TABLE,
    ALLOCATIONS_TABLE,
];

/// Milli-units per byte or key of the built-in resources (1 byte = 1 unit).
const MILLI: i64 = quota::SCALAR_MILLI_PER_UNIT;

/// The counters of one role and resource, in milli-units, whole subtree included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Allocated (built-in resources count here).
    pub allocated: i64,
    /// Reserved, allocated or not.
    pub reserved: i64,
    /// The part of `reserved` that allocations drew on.
    pub reserved_in_use: i64,
    /// Offered: shown, not counted.
    pub offered: i64,
}

impl Counters {
    /// Returns what counts against limits (ACCT-3).
    pub fn consumed(&self) -> i64 {
        self.allocated + self.reserved - self.reserved_in_use
    }

    fn is_zero(&self) -> bool {
        *self == Counters::default()
    }

    fn add(&mut self, other: &Counters, sign: i64) {
        self.allocated += sign * other.allocated;
        self.reserved += sign * other.reserved;
        self.reserved_in_use += sign * other.reserved_in_use;
        self.offered += sign * other.offered;
    }
}

/// The state of an agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AgentState {
    /// Counted in capacity.
    #[default]
    Registered,
    /// Not counted in capacity; its records stay.
    Unreachable,
    /// Gone for good; not counted.
    Gone,
}

/// A registered agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Agent {
    /// Its state.
    pub state: AgentState,
    /// Its total resources.
    pub resources: ResourceQuantities,
}

/// A reservation record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reservation {
    /// The role it is for.
    pub role: String,
    /// The agent it is on.
    pub agent: String,
    /// The reserved resources.
    pub resources: ResourceQuantities,
    /// The part allocations drew on.
    pub in_use: ResourceQuantities,
}

/// An allocation record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocation {
    /// The role it is for.
    pub role: String,
    /// The agent it is on.
    pub agent: String,
    /// The allocated resources.
    pub resources: ResourceQuantities,
    /// What it drew from each reservation, by reservation id.
    pub drawn: BTreeMap<String, ResourceQuantities>,
}

/// One role as the operator API shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoleUsage {
    /// The role.
    pub role: String,
    /// Its registry entry, if any.
    pub quota: Option<QuotaConfig>,
    /// Per resource, its counters (subtree included).
    pub resources: BTreeMap<String, Counters>,
}

/// The registry, the usage counters and the records.
#[derive(Debug, Default)]
pub struct Accounts {
    registry: Registry,
    usage: BTreeMap<(String, String), Counters>,
    agents: BTreeMap<String, Agent>,
    reservations: BTreeMap<String, Reservation>,
    allocations: BTreeMap<String, Allocation>,
}

/// Returns `role` and its ancestors, deepest first.
fn chain(role: &str) -> impl Iterator<Item = &str> {
    std::iter::once(role).chain(quota::ancestors(role))
}

impl Accounts {
    /// Loads the registry and the records from `snapshot`, and recounts usage from them and
    /// from `index` (ACCT-1 holds from the start).
    pub fn load(snapshot: &Snapshot, index: &Index) -> Result<Accounts, StorageError> {
        let mut accounts = Accounts::default();
        for (key, value) in snapshot.rows(REGISTRY_TABLE)? {
            let config = codec::decode_config(&key, &value)?;
            accounts.registry.insert(config.role.clone(), config);
        }
        for (key, value) in snapshot.rows(AGENTS_TABLE)? {
            accounts
                .agents
                .insert(codec::decode_id(&key)?, codec::decode_agent(&value)?);
        }
        for (key, value) in snapshot.rows(RESERVATIONS_TABLE)? {
            accounts
                .reservations
                .insert(codec::decode_id(&key)?, codec::decode_reservation(&value)?);
        }
        for (key, value) in snapshot.rows(ALLOCATIONS_TABLE)? {
            accounts
                .allocations
                .insert(codec::decode_id(&key)?, codec::decode_allocation(&value)?);
        }
        accounts.usage = accounts.recount(index);
        Ok(accounts)
    }

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
                Counters {
                    allocated: cost as i64 * MILLI,
                    ..Counters::default()
                },
            );
            if alive {
                add(
                    owner,
                    KV_KEYS,
                    Counters {
                        allocated: MILLI,
                        ..Counters::default()
                    },
                );
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
            for (name, value) in a.resources.iter() {
                add(
                    &a.role,
                    name,
                    Counters {
                        allocated: value.milli(),
                        ..Counters::default()
                    },
                );
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

    /// Returns the owner of `key` (QUOTA-6).
    pub fn owner<'k>(&self, key: &'k [u8]) -> &'k str {
        quota::charged_role(key, &self.registry)
    }

    fn charge(&mut self, role: &str, resource: &str, delta: Counters, sign: i64) {
        for r in chain(role) {
            let key = (r.to_owned(), resource.to_owned());
            let row = self.usage.entry(key.clone()).or_default();
            row.add(&delta, sign);
            if row.is_zero() {
                self.usage.remove(&key);
            }
        }
    }

    fn consumed(&self, role: &str, resource: &str) -> i64 {
        self.usage
            .get(&(role.to_owned(), resource.to_owned()))
            .map_or(0, Counters::consumed)
    }

    /// Charges a Put of `cost` bytes to the owner of `key`; `new_key` if it was not alive.
    pub fn charge_put(&mut self, key: &[u8], cost: u32, new_key: bool) {
        let owner = self.owner(key).to_owned();
        self.charge(
            &owner,
            KV_BYTES,
            Counters {
                allocated: i64::from(cost) * MILLI,
                ..Counters::default()
            },
            1,
        );
        if new_key {
            self.charge(
                &owner,
                KV_KEYS,
                Counters {
                    allocated: MILLI,
                    ..Counters::default()
                },
                1,
            );
        }
    }

    /// Uncharges a deleted key from its owner (deletes free `kv_keys`, not `kv_bytes`).
    pub fn charge_delete(&mut self, key: &[u8]) {
        let owner = self.owner(key).to_owned();
        self.charge(
            &owner,
            KV_KEYS,
            Counters {
                allocated: MILLI,
                ..Counters::default()
            },
            -1,
        );
    }

    /// Releases `cost` bytes of revisions of `key` that a compaction dropped.
    pub fn release_bytes(&mut self, key: &[u8], cost: u64) {
        let owner = self.owner(key).to_owned();
        let delta = Counters {
            allocated: i64::try_from(cost).unwrap_or(i64::MAX) * MILLI,
            ..Counters::default()
        };
        self.charge(&owner, KV_BYTES, delta, -1);
    }

    /// Checks that charging `amounts` (resource → milli-units) to `role` keeps it and every
    /// ancestor within their limits (ACCT-4).
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
                let consumed = self.consumed(r, resource);
                if consumed.saturating_add(*amount) > limit.milli() {
                    return Err(exceeded(r, resource, consumed, *amount, limit));
                }
            }
        }
        Ok(())
    }

    /// Checks the built-in resources of a write: `puts` are (key, cost, new key) (ACCT-4).
    pub fn check_puts(&self, puts: &[(Vec<u8>, u32, bool)]) -> Result<(), Error> {
        if self.registry.is_empty() {
            return Ok(());
        }
        if let [(key, cost, new_key)] = puts {
            // One Put, the common case: no maps to build.
            let owner = self.owner(key);
            for r in chain(owner) {
                let Some(config) = self.registry.get(r) else {
                    continue;
                };
                let bytes = i64::from(*cost) * MILLI;
                let keys = if *new_key { MILLI } else { 0 };
                for (resource, amount) in [(KV_BYTES, bytes), (KV_KEYS, keys)] {
                    if let Some(limit) = config.limits.get(resource) {
                        let consumed = self.consumed(r, resource);
                        if amount > 0 && consumed.saturating_add(amount) > limit.milli() {
                            return Err(exceeded(r, resource, consumed, amount, limit));
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
            let consumed = self.consumed(role, resource);
            if *amount > 0 && consumed.saturating_add(*amount) > limit.milli() {
                return Err(exceeded(role, resource, consumed, *amount, limit));
            }
        }
        Ok(())
    }

    /// Returns the registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Returns every role with a quota, consumption or a reservation, sorted by role.
    pub fn roles(&self) -> Vec<RoleUsage> {
        let mut roles: BTreeMap<String, RoleUsage> = BTreeMap::new();
        for role in self.registry.keys() {
            roles.entry(role.clone()).or_insert_with(|| RoleUsage {
                role: role.clone(),
                ..RoleUsage::default()
            });
        }
        for ((role, resource), counters) in &self.usage {
            let entry = roles.entry(role.clone()).or_insert_with(|| RoleUsage {
                role: role.clone(),
                ..RoleUsage::default()
            });
            entry.resources.insert(resource.clone(), *counters);
        }
        for (role, usage) in roles.iter_mut() {
            usage.quota = self.registry.get(role).cloned();
        }
        roles.into_values().collect()
    }

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
        let consumption = |role: &str| {
            let mut quantities = ResourceQuantities::default();
            for ((r, resource), counters) in &moved {
                if r == role
                    && let Some(value) = Scalar::from_milli(counters.consumed())
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
        let keys: BTreeSet<_> = self.usage.keys().chain(moved.keys()).cloned().collect();
        for key in keys {
            if self.usage.get(&key) != moved.get(&key) {}
        }
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
                    let bytes = Counters {
                        allocated: cost as i64 * MILLI,
                        ..Counters::default()
                    };
                    let keys = Counters {
                        allocated: if alive { MILLI } else { 0 },
                        ..Counters::default()
                    };
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

    /// Registers or updates an agent.
    pub fn register_agent(
        &mut self,
        id: &str,
        agent: Agent,
        batch: &mut WriteBatch<'_>,
    ) -> Result<(), Error> {
        if id.is_empty() {
            return Err(Error::QuotaRequest("Agent id must be set".into()));
        }
        batch.put_row(AGENTS_TABLE, id.as_bytes(), &codec::encode_agent(&agent))?;
        self.agents.insert(id.to_owned(), agent);
        Ok(())
    }

    /// Records a reservation, checked against the limits of its role and ancestors.
    pub fn reserve(
        &mut self,
        id: &str,
        reservation: Reservation,
        batch: &mut WriteBatch<'_>,
    ) -> Result<(), Error> {
        self.check_record(
            id,
            &reservation.role,
            &reservation.agent,
            self.reservations.contains_key(id),
        )?;
        let amounts: BTreeMap<&str, i64> = reservation
            .resources
            .iter()
            .map(|(n, v)| (n, v.milli()))
            .collect();
        self.check_limits(&reservation.role, &amounts)?;
        for (name, value) in reservation.resources.iter() {
            self.charge(
                &reservation.role,
                name,
                Counters {
                    reserved: value.milli(),
                    ..Counters::default()
                },
                1,
            );
        }
        batch.put_row(
            RESERVATIONS_TABLE,
            id.as_bytes(),
            &codec::encode_reservation(&reservation),
        )?;
        self.reservations.insert(id.to_owned(), reservation);
        Ok(())
    }

    /// Removes a reservation no allocation draws on.
    pub fn unreserve(&mut self, id: &str, batch: &mut WriteBatch<'_>) -> Result<(), Error> {
        let Some(reservation) = self.reservations.get(id) else {
            return Err(Error::QuotaRequest(format!("Unknown reservation '{id}'")));
        };
        if !reservation.in_use.is_empty() {
            return Err(Error::QuotaRequest(format!(
                "Reservation '{id}' is in use by allocations"
            )));
        }
        let reservation = reservation.clone();
        for (name, value) in reservation.resources.iter() {
            self.charge(
                &reservation.role,
                name,
                Counters {
                    reserved: value.milli(),
                    ..Counters::default()
                },
                -1,
            );
        }
        batch.delete_row(RESERVATIONS_TABLE, id.as_bytes())?;
        self.reservations.remove(id);
        Ok(())
    }

    /// Records an allocation: it draws first on the role's unallocated reservations on the
    /// same agent, so nothing counts twice; the rest is checked against the limits.
    pub fn allocate(
        &mut self,
        id: &str,
        mut allocation: Allocation,
        batch: &mut WriteBatch<'_>,
    ) -> Result<(), Error> {
        self.check_record(
            id,
            &allocation.role,
            &allocation.agent,
            self.allocations.contains_key(id),
        )?;
        let mut drawn: BTreeMap<String, ResourceQuantities> = BTreeMap::new();
        let mut extra: BTreeMap<&str, i64> = BTreeMap::new();
        for (name, wanted) in allocation.resources.iter() {
            let mut left = wanted.milli();
            for (rid, r) in &self.reservations {
                if left == 0 {
                    break;
                }
                if r.role != allocation.role || r.agent != allocation.agent {
                    continue;
                }
                let free = r.resources.get(name).milli() - r.in_use.get(name).milli();
                let take = free.min(left);
                if take > 0 {
                    left -= take;
                    if let Some(value) = Scalar::from_milli(take) {
                        drawn
                            .entry(rid.clone())
                            .or_default()
                            .add_resource(name, value);
                    }
                }
            }
            extra.insert(name, left);
        }
        self.check_limits(&allocation.role, &extra)?;
        for (rid, amounts) in &drawn {
            if let Some(r) = self.reservations.get_mut(rid) {
                for (name, value) in amounts.iter() {
                    r.in_use.add_resource(name, value);
                }
                let encoded = codec::encode_reservation(r);
                batch.put_row(RESERVATIONS_TABLE, rid.as_bytes(), &encoded)?;
            }
            for (name, value) in amounts.iter() {
                let delta = Counters {
                    reserved_in_use: value.milli(),
                    ..Counters::default()
                };
                self.charge(&allocation.role.clone(), name, delta, 1);
            }
        }
        for (name, value) in allocation.resources.iter() {
            self.charge(
                &allocation.role.clone(),
                name,
                Counters {
                    allocated: value.milli(),
                    ..Counters::default()
                },
                1,
            );
        }
        allocation.drawn = drawn;
        batch.put_row(
            ALLOCATIONS_TABLE,
            id.as_bytes(),
            &codec::encode_allocation(&allocation),
        )?;
        self.allocations.insert(id.to_owned(), allocation);
        Ok(())
    }

    /// Removes an allocation and gives back what it drew from reservations.
    pub fn release(&mut self, id: &str, batch: &mut WriteBatch<'_>) -> Result<(), Error> {
        let Some(allocation) = self.allocations.remove(id) else {
            return Err(Error::QuotaRequest(format!("Unknown allocation '{id}'")));
        };
        for (rid, amounts) in &allocation.drawn {
            if let Some(r) = self.reservations.get_mut(rid) {
                for (name, value) in amounts.iter() {
                    let left = r.in_use.get(name).saturating_sub(value);
                    r.in_use = without(&r.in_use, name);
                    if !left.is_zero() {
                        r.in_use.add_resource(name, left);
                    }
                }
                let encoded = codec::encode_reservation(r);
                batch.put_row(RESERVATIONS_TABLE, rid.as_bytes(), &encoded)?;
            }
            for (name, value) in amounts.iter() {
                self.charge(
                    &allocation.role,
                    name,
                    Counters {
                        reserved_in_use: value.milli(),
                        ..Counters::default()
                    },
                    -1,
                );
            }
        }
        for (name, value) in allocation.resources.iter() {
            self.charge(
                &allocation.role,
                name,
                Counters {
                    allocated: value.milli(),
                    ..Counters::default()
                },
                -1,
            );
        }
        batch.delete_row(ALLOCATIONS_TABLE, id.as_bytes())?;
        Ok(())
    }

    fn check_record(&self, id: &str, role: &str, agent: &str, exists: bool) -> Result<(), Error> {
        if id.is_empty() {
            return Err(Error::QuotaRequest("Record id must be set".into()));
        }
        if exists {
            return Err(Error::QuotaRequest(format!("Record '{id}' already exists")));
        }
        quota::validate_role(role).map_err(Error::QuotaRequest)?;
        if role == STAR_ROLE {
            return Err(Error::QuotaRequest(
                "Resources cannot be reserved or allocated to role '*'".into(),
            ));
        }
        match self.agents.get(agent) {
            Some(a) if a.state == AgentState::Registered => Ok(()),
            Some(_) => Err(Error::QuotaRequest(format!(
                "Agent '{agent}' is not registered"
            ))),
            None => Err(Error::QuotaRequest(format!("Unknown agent '{agent}'"))),
        }
    }
}

/// Returns `quantities` without `name`.
fn without(quantities: &ResourceQuantities, name: &str) -> ResourceQuantities {
    let mut out = ResourceQuantities::default();
    for (n, v) in quantities.iter() {
        if n != name {
            out.add_resource(n, v);
        }
    }
    out
}

/// Returns the refusal of a charge of `amount` to `role` that its `limit` on `resource` does
/// not allow (ACCT-4); the message names all five.
fn exceeded(role: &str, resource: &str, consumed: i64, amount: i64, limit: Scalar) -> Error {
    Error::QuotaExceeded(format!(
        "kvd: quota exceeded for role '{role}': {resource} consumption {} + request {} > limit {limit}",
        show(consumed),
        show(amount)
    ))
}

/// Prints milli-units as Mesos prints scalars.
fn show(milli: i64) -> String {
    Scalar::from_milli(milli).map_or_else(|| format!("-{}", show(-milli)), |s| s.to_string())
}

/// Parses a request's resource map (Mesos's scalar rules: finite, non-negative).
pub fn parse_resources(raw: &BTreeMap<String, f64>) -> Result<ResourceQuantities, Error> {
    let mut out = ResourceQuantities::default();
    for (name, value) in raw {
        let scalar = Scalar::from_f64(*value).map_err(|e| {
            Error::QuotaRequest(format!("Invalid value for resource '{name}': {e}"))
        })?;
        out.add_resource(name, scalar);
    }
    Ok(out)
}

/// An operator request on the registry or the records, applied through the apply path.
#[derive(Debug, Clone, PartialEq)]
pub enum AccountingRequest {
    /// Mesos's UPDATE_QUOTA.
    UpdateQuota {
        /// The configurations, all or nothing.
        configs: Vec<RawQuotaConfig>,
        /// Skip the consumption and capacity checks.
        force: bool,
    },
    /// Register or update an agent and its total resources.
    RegisterAgent {
        /// The agent id.
        id: String,
        /// Its state.
        state: AgentState,
        /// Its total resources.
        resources: BTreeMap<String, f64>,
    },
    /// Reserve resources on an agent for a role.
    Reserve {
        /// The record id.
        id: String,
        /// The role.
        role: String,
        /// The agent.
        agent: String,
        /// The resources.
        resources: BTreeMap<String, f64>,
    },
    /// Remove a reservation.
    Unreserve {
        /// The record id.
        id: String,
    },
    /// Allocate resources on an agent to a role.
    Allocate {
        /// The record id.
        id: String,
        /// The role.
        role: String,
        /// The agent.
        agent: String,
        /// The resources.
        resources: BTreeMap<String, f64>,
    },
    /// Remove an allocation.
    Release {
        /// The record id.
        id: String,
    },
    /// Replace the usage counters with a recount (reconciliation of consumption).
    Repair,
}

impl AccountingRequest {
    /// Returns an estimate of the request's encoded size, for the request-size limit.
    pub fn encoded_len(&self) -> usize {
        let map = |m: &BTreeMap<String, f64>| m.keys().map(|k| k.len() + 12).sum::<usize>();
        match self {
            AccountingRequest::UpdateQuota { configs, .. } => configs
                .iter()
                .map(|c| {
                    c.role.len()
                        + 8
                        + c.guarantees
                            .keys()
                            .chain(c.limits.keys())
                            .map(|k| k.len() + 12)
                            .sum::<usize>()
                })
                .sum(),
            AccountingRequest::RegisterAgent { id, resources, .. } => id.len() + map(resources),
            AccountingRequest::Reserve {
                id,
                role,
                agent,
                resources,
            }
            | AccountingRequest::Allocate {
                id,
                role,
                agent,
                resources,
            } => id.len() + role.len() + agent.len() + map(resources),
            AccountingRequest::Unreserve { id } | AccountingRequest::Release { id } => id.len(),
            AccountingRequest::Repair => 0,
        }
    }

    /// Applies the request to `accounts` in `batch` (ACCT-2: on error nothing changed).
    pub fn apply(
        &self,
        accounts: &mut Accounts,
        quota_bytes: Option<u64>,
        index: &Index,
        batch: &mut WriteBatch<'_>,
    ) -> Result<Result<usize, Error>, StorageError> {
        let result = match self {
            AccountingRequest::UpdateQuota { configs, force } => accounts
                .update_quota(configs, *force, quota_bytes, index, batch)
                .map(|()| 0),
            AccountingRequest::RegisterAgent {
                id,
                state,
                resources,
            } => parse_resources(resources)
                .and_then(|resources| {
                    accounts.register_agent(
                        id,
                        Agent {
                            state: *state,
                            resources,
                        },
                        batch,
                    )
                })
                .map(|()| 0),
            AccountingRequest::Reserve {
                id,
                role,
                agent,
                resources,
            } => parse_resources(resources)
                .and_then(|resources| {
                    let r = Reservation {
                        role: role.clone(),
                        agent: agent.clone(),
                        resources,
                        ..Reservation::default()
                    };
                    accounts.reserve(id, r, batch)
                })
                .map(|()| 0),
            AccountingRequest::Unreserve { id } => accounts.unreserve(id, batch).map(|()| 0),
            AccountingRequest::Allocate {
                id,
                role,
                agent,
                resources,
            } => parse_resources(resources)
                .and_then(|resources| {
                    let a = Allocation {
                        role: role.clone(),
                        agent: agent.clone(),
                        resources,
                        ..Allocation::default()
                    };
                    accounts.allocate(id, a, batch)
                })
                .map(|()| 0),
            AccountingRequest::Release { id } => accounts.release(id, batch).map(|()| 0),
            AccountingRequest::Repair => Ok(accounts.repair(index)),
        };
        match result {
            Err(Error::Storage(e)) => Err(e),
            other => Ok(other),
        }
    }
}
