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
//! - ACCT-3: `consumed = allocated + reserved - reserved_in_use`; `offered` is what
//!   preparing allocations hold, shown apart from consumed. A role *holds* `consumed +
//!   offered`; nothing is counted in both.
//! - ACCT-4: a write or a record that would take what its role or an ancestor holds
//!   (`consumed + offered + request`) past a limit is refused before it changes anything;
//!   deletes, releases and STARTs are never refused for quota (a START moves an
//!   allocation's resources from `offered` to `allocated`, which leaves what the role holds
//!   as it was).
//! - ACCT-5: a registry change that gives a role its first entry (or removes its last) moves
//!   the consumption of the keys whose owner changes, before the limit check sees it.
//! - ACCT-6 (the allocation prepare queue, `prepare`): with a queue length `N > 0` at most
//!   `N` allocations are admitted preparing at once, each role within its fair share; the
//!   count is exact at every commit, because the check runs in the apply thread inside the
//!   write transaction that admits.
//!
//! Contact points: `engine::apply` calls the charge, check and record operations inside its
//! batch; `quota` (the pure Mesos core) validates updates and formats values.
//!
//! Files: this one holds the types, the tables and [`Accounts`] with its load; `ledger`
//! the usage counters (charges, limit checks, recount, drift, repair); `registry` the quota
//! updates and the consumption they move; `records` agents, reservations and allocations
//! (one code path for both kinds of record); `prepare` the allocation prepare queue;
//! `requests` the operator request type and its dispatch; `codec` the rows.

pub(crate) mod codec;
mod ledger;
mod prepare;
mod reconcile;
mod records;
mod registry;
mod requests;

use std::collections::BTreeMap;

use crate::error::StorageError;
use crate::mvcc::index::Index;
use crate::quota::{self, QuotaConfig, Registry, ResourceQuantities};
use crate::storage::{RowTable, Snapshot};

pub use prepare::{ALLOCATION_ACTIVE_WINDOW, ALLOCATION_RETRY_AFTER, AllocationPrepareQueue};
pub use reconcile::{TaskQuery, TaskState, TaskStatus};
pub use records::RecordKind;
pub use requests::AccountingRequest;

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
/// Allocations: id → role, agent, resources, what they drew from reservations, and whether
/// they are preparing.
pub const ALLOCATIONS_TABLE: RowTable = RowTable::new("allocations");
/// Settings the operator changes at run time: name → value (the allocation prepare queue
/// length).
pub const SETTINGS_TABLE: RowTable = RowTable::new("settings");
/// Every table of this module, for the engine to register.
pub const TABLES: [RowTable; 5] = [
    REGISTRY_TABLE,
    AGENTS_TABLE,
    RESERVATIONS_TABLE,
    ALLOCATIONS_TABLE,
    SETTINGS_TABLE,
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
    /// Offered: what preparing allocations hold; checked against limits with the
    /// consumption, shown apart from it.
    pub offered: i64,
}

impl Counters {
    /// Counters with only `column` set, to `milli`.
    pub fn of(column: Column, milli: i64) -> Counters {
        let mut counters = Counters::default();
        *match column {
            Column::Allocated => &mut counters.allocated,
            Column::Reserved => &mut counters.reserved,
            Column::ReservedInUse => &mut counters.reserved_in_use,
            Column::Offered => &mut counters.offered,
        } = milli;
        counters
    }

    /// Returns the consumption: allocations plus unallocated reservations (ACCT-3).
    pub fn consumed(&self) -> i64 {
        self.allocated + self.reserved - self.reserved_in_use
    }

    /// Returns what the role holds, what limits are checked against: the consumption plus
    /// what preparing allocations hold (ACCT-3, ACCT-4).
    pub fn held(&self) -> i64 {
        self.consumed() + self.offered
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

/// One column of [`Counters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    /// `allocated`.
    Allocated,
    /// `reserved`.
    Reserved,
    /// `reserved_in_use`.
    ReservedInUse,
    /// `offered`.
    Offered,
}

/// The state of an agent (Mesos's agent states as its master sees them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum AgentState {
    /// Registered: counted in capacity, takes new records.
    #[default]
    Registered,
    /// Known from before the engine's restart and not yet registered again: not counted in
    /// capacity and takes no new records; its records stay. Never stored: a registered
    /// agent's row reads as recovered at open.
    Recovered,
    /// Unreachable since a time: not counted, takes no new records; its records stay.
    Unreachable,
    /// Marked gone by the operator: terminal; its records were released.
    Gone,
}

impl AgentState {
    /// Mesos's name of the state.
    pub fn name(self) -> &'static str {
        match self {
            AgentState::Registered => "REGISTERED",
            AgentState::Recovered => "RECOVERED",
            AgentState::Unreachable => "UNREACHABLE",
            AgentState::Gone => "GONE",
        }
    }
}

/// An agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Agent {
    /// Its state.
    pub state: AgentState,
    /// Its total resources.
    pub resources: ResourceQuantities,
    /// When it became unreachable: wall-clock nanoseconds since the Unix epoch (engine
    /// clock), for an unreachable agent.
    pub unreachable_since: Option<u64>,
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
    /// Preparing (its resources count as `offered`) until START; else running (`allocated`).
    pub preparing: bool,
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
    /// A reused key for looking up `usage` without allocating (every Put charges it).
    usage_probe: (String, String),
    agents: BTreeMap<String, Agent>,
    reservations: BTreeMap<String, Reservation>,
    allocations: BTreeMap<String, Allocation>,
    prepare: prepare::PrepareQueue,
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
            let mut agent = codec::decode_agent(&value)?;
            // An agent registered before the restart has to register again (Mesos's
            // recovered agents).
            if agent.state == AgentState::Registered {
                agent.state = AgentState::Recovered;
            }
            accounts.agents.insert(codec::decode_id(&key)?, agent);
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
        let mut length = None;
        for (key, value) in snapshot.rows(SETTINGS_TABLE)? {
            // A setting this build does not know cannot change what it does.
            if key == prepare::PREPARE_QUEUE_LENGTH_KEY {
                length = Some(codec::decode_setting(&value)?);
            }
        }
        accounts.prepare = prepare::PrepareQueue::new(length, accounts.count_preparing());
        accounts.usage = accounts.recount(index);
        Ok(accounts)
    }

    /// Returns the owner of `key` (QUOTA-6).
    pub fn owner<'k>(&self, key: &'k [u8]) -> &'k str {
        quota::charged_role(key, &self.registry)
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
}
