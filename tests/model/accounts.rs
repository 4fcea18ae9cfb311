//! The quota registry, the agents, the reservation and allocation records, and consumption,
//! as the model computes them. Written from kvd's design documents and Mesos's rules, with
//! none of kvd's accounting or quota helpers: the engine's counters are judged against what
//! this file computes.
//!
//! The rules:
//! - **Amounts** are whole thousandths of a unit (`round(v × 1000)`, halves away from zero).
//!   A byte or a key is one unit. Quantities (guarantees, resources, consumption) drop zero
//!   entries and treat an absent name as 0; limits keep zeros and treat an absent name as
//!   unlimited.
//! - **Owner of a key**: the deepest role with a registry entry whose namespace `/role/`
//!   prefixes the key; `*` if there is none. A key is charged to its owner and to every
//!   ancestor of the owner (`a/b/c`, `a/b`, `a`), so a role's counters cover its subtree.
//! - **Counters** per (role, resource): `allocated`, `reserved`, `reserved_in_use`,
//!   `offered`. `kv_bytes` is allocated: 256 + |key| + |value| for every Put revision the
//!   index retains (tombstones cost nothing). `kv_keys` is allocated: one per live key. A
//!   reservation adds its amounts to `reserved` and what allocations drew on it to
//!   `reserved_in_use`; an allocation adds its amounts to `allocated`. Nothing writes
//!   `offered`. Consumed = allocated + reserved − reserved_in_use.
//! - **Limits on a write** (Put, or the Puts of the branches a Txn runs, nested ones
//!   included): per owner the bytes of each Put and one key per Put of a key not alive before
//!   the request (deletes of the same Txn make no room), summed at every ancestor; checked in
//!   role-name order, resources in name order: `consumed + amount > limit` refuses with
//!   `kvd: quota exceeded for role 'R': RES consumption C + request A > limit L`.
//! - **Records** (RESERVE_RESOURCES, ALLOCATE, UNRESERVE_RESOURCES, RELEASE, REGISTER_AGENT):
//!   the refusals and their order are kvd's operator API's; a record's limits are checked
//!   deepest role first. An allocation first draws on its role's reservations on the same
//!   agent, in reservation-id order, and only the rest is checked and adds to consumption.
//! - **UPDATE_QUOTA**: Mesos's phases in order: A (role name, guarantees within limits),
//!   B (limits against the consumption the batch would leave, unless `force`), C (every
//!   role's guarantees contain its children's), D (capacity contains the top-level
//!   guarantees, unless `force`). Phase B sees the keys that change owner with the batch.
//!   The caps and the invalid-number checks of phase A are not modelled: the generator does
//!   not produce them (`src/quota`'s unit tests cover them).

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use kvd::AgentState;
use kvd::quota::RawQuotaConfig;

/// Resource name → amount in thousandths of a unit.
pub type Amounts = BTreeMap<String, i64>;

/// (role, resource) → counters: the whole consumption table.
pub type UsageMap = BTreeMap<(String, String), Usage>;

/// The built-in resource counting retained revisions' bytes.
pub const KV_BYTES: &str = "kv_bytes";
/// The built-in resource counting live keys.
pub const KV_KEYS: &str = "kv_keys";
/// Thousandths per unit.
pub const MILLI: i64 = 1000;
/// The largest amount (a saturated sum); also an unlimited `kv_keys` capacity.
pub const AMOUNT_MAX: i64 = i64::MAX;

/// The counters of one role and resource (the model's own type; compared field by field with
/// the engine's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Usage {
    /// Allocated (the built-in resources count here).
    pub allocated: i64,
    /// Reserved, allocated or not.
    pub reserved: i64,
    /// The part of `reserved` that allocations drew on.
    pub reserved_in_use: i64,
    /// Offered: nothing writes it.
    pub offered: i64,
}

impl Usage {
    /// Returns what counts against limits.
    pub fn consumed(&self) -> i64 {
        self.allocated + self.reserved - self.reserved_in_use
    }

    fn is_zero(&self) -> bool {
        *self == Usage::default()
    }
}

/// A registry entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entry {
    /// Guarantees (no zero entries).
    pub guarantees: Amounts,
    /// Limits (zeros kept).
    pub limits: Amounts,
}

/// The registry: role → entry, only non-default entries.
pub type Registry = BTreeMap<String, Entry>;

/// An agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Agent {
    /// REGISTERED (counted in capacity, takes records); false for RECOVERED (after a
    /// restart, until it registers again), UNREACHABLE and GONE.
    pub registered: bool,
    /// GONE: terminal, it cannot register again; its records were released.
    pub gone: bool,
    /// Its total resources.
    pub resources: Amounts,
}

/// A reservation record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reservation {
    /// The role.
    pub role: String,
    /// The agent.
    pub agent: String,
    /// Reserved amounts.
    pub resources: Amounts,
    /// What allocations drew on it.
    pub in_use: Amounts,
}

/// An allocation record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocation {
    /// The role.
    pub role: String,
    /// The agent.
    pub agent: String,
    /// Allocated amounts.
    pub resources: Amounts,
    /// Per reservation id, what it drew.
    pub drawn: BTreeMap<String, Amounts>,
}

/// What the recount needs to know of one key: the bytes of its retained Put revisions and
/// whether it is alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFacts {
    /// The key.
    pub key: Bytes,
    /// Σ (256 + |key| + |value|) over the Put revisions the index retains.
    pub retained_bytes: u64,
    /// Alive at the current revision.
    pub alive: bool,
}

/// A planned Put of a write request, for its limit check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedPut {
    /// The key.
    pub key: Bytes,
    /// The kv_bytes the Put adds.
    pub bytes: u64,
    /// The key was not alive before the request.
    pub new_key: bool,
}

/// The registry, the agents and the records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Accounts {
    /// Non-default quota entries.
    pub registry: Registry,
    /// Agents by id.
    pub agents: BTreeMap<String, Agent>,
    /// Reservations by id.
    pub reservations: BTreeMap<String, Reservation>,
    /// Allocations by id.
    pub allocations: BTreeMap<String, Allocation>,
}

// ---- Roles --------------------------------------------------------------------------------

/// Returns `role` followed by its ancestors, nearest first.
pub fn with_ancestors(role: &str) -> Vec<&str> {
    let mut out = vec![role];
    let mut rest = role;
    while let Some(cut) = rest.rfind('/') {
        rest = &rest[..cut];
        out.push(rest);
    }
    out
}

/// Returns the parent of `role`, if it has one.
fn parent_of(role: &str) -> Option<&str> {
    role.rfind('/').map(|cut| &role[..cut])
}

/// Returns the owner of `key` under `registry`.
pub fn owner<'r>(key: &[u8], registry: &'r Registry) -> &'r str {
    let mut best: Option<&'r str> = None;
    for role in registry.keys() {
        let namespace = format!("/{role}/");
        let longer = best.is_none_or(|b| role.len() > b.len());
        if key.starts_with(namespace.as_bytes()) && longer {
            best = Some(role);
        }
    }
    best.unwrap_or("*")
}

/// Mesos's role-name rules, in Mesos's order; returns the first failure's message.
pub fn check_role(role: &str) -> Result<(), String> {
    if role == "*" {
        return Ok(());
    }
    if role.starts_with('/') {
        return Err(format!("Role '{role}' cannot start with a slash"));
    }
    if role.ends_with('/') {
        return Err(format!("Role '{role}' cannot end with a slash"));
    }
    if role.contains("//") {
        return Err(format!("Role '{role}' cannot contain two adjacent slashes"));
    }
    if role.is_empty() {
        return Err("Role names cannot be the empty string".to_owned());
    }
    for component in role.split('/') {
        if matches!(component, "." | ".." | "*") {
            return Err(format!(
                "Role '{role}' cannot include '{component}' as a component"
            ));
        }
        if component.starts_with('-') {
            return Err(format!(
                "Role component '{component}' is invalid because it starts with a dash"
            ));
        }
        let blank = ['\t', '\n', '\x0b', '\x0c', '\r', ' ', '\x7f'];
        if component.chars().any(|c| blank.contains(&c)) {
            return Err(format!(
                "Role component '{component}' is invalid because it contains backspace or \
                 whitespace"
            ));
        }
    }
    Ok(())
}

// ---- Numbers ------------------------------------------------------------------------------

/// Returns a request value in thousandths, or the reason Mesos rejects it.
pub fn to_milli(value: f64) -> Result<i64, &'static str> {
    if value.is_infinite() {
        return Err("Infinite values not supported");
    }
    if value.is_nan() {
        return Err("NaN not supported");
    }
    if value.is_subnormal() {
        return Err("Subnormal values not supported");
    }
    if value < 0.0 {
        return Err("Negative values not supported");
    }
    Ok((value * 1000.0).round() as i64)
}

/// Returns `milli` printed as Mesos prints a scalar: as a double, with C's `%.15g`.
pub fn show(milli: i64) -> String {
    let value = (milli / MILLI) as f64 + (milli % MILLI) as f64 / 1000.0;
    g15(value)
}

/// C's `%.15g`.
fn g15(value: f64) -> String {
    if value == 0.0 {
        return "0".to_owned();
    }
    let scientific = format!("{value:.14e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if !(-4..15).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        return format!("{}e{sign}{:02}", trim_zeros(mantissa), exponent.abs());
    }
    let decimals = (14 - exponent) as usize;
    trim_zeros(&format!("{value:.decimals$}"))
}

fn trim_zeros(text: &str) -> String {
    if !text.contains('.') {
        return text.to_owned();
    }
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// `cpus:2; mem:1024`, or `{}` when empty.
pub fn show_amounts(amounts: &Amounts) -> String {
    if amounts.is_empty() {
        return "{}".to_owned();
    }
    amounts
        .iter()
        .map(|(name, v)| format!("{name}:{}", show(*v)))
        .collect::<Vec<_>>()
        .join("; ")
}

/// `amounts` without the resources that have no real bound (`AMOUNT_MAX`), which
/// capacity messages leave out.
fn without_unbounded(amounts: &Amounts) -> Amounts {
    amounts
        .iter()
        .filter(|(_, v)| **v != AMOUNT_MAX)
        .map(|(name, v)| (name.clone(), *v))
        .collect()
}

/// `{ cpus: 2, mem: 0 }`: a request map as protobuf prints it, values rounded, zeros kept.
fn show_request_map(map: &BTreeMap<String, f64>) -> String {
    let entries: Vec<String> = map
        .iter()
        .map(|(name, v)| format!("{name}: {}", show((v * 1000.0).round() as i64)))
        .collect();
    format!("{{ {} }}", entries.join(", "))
}

/// Parses quantities: zeros dropped.
fn quantities(raw: &BTreeMap<String, f64>) -> Result<Amounts, (String, &'static str)> {
    let mut out = Amounts::new();
    for (name, v) in raw {
        let milli = to_milli(*v).map_err(|reason| (name.clone(), reason))?;
        if milli > 0 {
            out.insert(name.clone(), milli);
        }
    }
    Ok(out)
}

/// Parses limits: zeros kept.
fn limits(raw: &BTreeMap<String, f64>) -> Amounts {
    raw.iter()
        .map(|(name, v)| (name.clone(), to_milli(*v).unwrap_or(0)))
        .collect()
}

/// Returns true if `limits` allow `amounts` (every amount with a limit is within it).
fn within(limits: &Amounts, amounts: &Amounts) -> bool {
    amounts
        .iter()
        .all(|(name, v)| limits.get(name).is_none_or(|limit| v <= limit))
}

/// Returns true if `big` holds at least every amount of `small`.
fn holds(big: &Amounts, small: &Amounts) -> bool {
    small
        .iter()
        .all(|(name, v)| big.get(name).copied().unwrap_or(0) >= *v)
}

fn add_into(total: &mut Amounts, amounts: &Amounts) {
    for (name, v) in amounts {
        let slot = total.entry(name.clone()).or_insert(0);
        *slot = slot.saturating_add(*v);
    }
}

fn quota_exceeded(role: &str, resource: &str, consumed: i64, amount: i64, limit: i64) -> String {
    format!(
        "kvd: quota exceeded for role '{role}': {resource} consumption {} + request {} > limit {}",
        show(consumed),
        show(amount),
        show(limit)
    )
}

/// Returns what `role` consumes of `resource` in `usage`.
fn consumed_in(usage: &UsageMap, role: &str, resource: &str) -> i64 {
    usage
        .get(&(role.to_owned(), resource.to_owned()))
        .map_or(0, Usage::consumed)
}

impl Accounts {
    // ---- The recount -------------------------------------------------------------------

    /// Returns the consumption table for these keys and the records, owners taken from
    /// `registry` (the current one, or a tentative one during UPDATE_QUOTA).
    pub fn recount(&self, keys: &[KeyFacts], registry: &Registry) -> UsageMap {
        let mut usage = UsageMap::new();
        let mut charge = |role: &str, resource: &str, add: Usage| {
            for r in with_ancestors(role) {
                let row = usage
                    .entry((r.to_owned(), resource.to_owned()))
                    .or_default();
                row.allocated += add.allocated;
                row.reserved += add.reserved;
                row.reserved_in_use += add.reserved_in_use;
                row.offered += add.offered;
            }
        };
        for facts in keys {
            let role = owner(&facts.key, registry);
            let bytes = Usage {
                allocated: facts.retained_bytes as i64 * MILLI,
                ..Usage::default()
            };
            charge(role, KV_BYTES, bytes);
            if facts.alive {
                let key = Usage {
                    allocated: MILLI,
                    ..Usage::default()
                };
                charge(role, KV_KEYS, key);
            }
        }
        for r in self.reservations.values() {
            for (name, v) in &r.resources {
                let add = Usage {
                    reserved: *v,
                    reserved_in_use: r.in_use.get(name).copied().unwrap_or(0),
                    ..Usage::default()
                };
                charge(&r.role, name, add);
            }
        }
        for a in self.allocations.values() {
            for (name, v) in &a.resources {
                let add = Usage {
                    allocated: *v,
                    ..Usage::default()
                };
                charge(&a.role, name, add);
            }
        }
        usage.retain(|_, u| !u.is_zero());
        usage
    }

    /// Returns the roles the engine lists: every role with an entry or a nonzero counter.
    pub fn listed_roles(&self, usage: &UsageMap) -> BTreeSet<String> {
        let mut roles: BTreeSet<String> = self.registry.keys().cloned().collect();
        roles.extend(usage.keys().map(|(role, _)| role.clone()));
        roles
    }

    // ---- Limits on writes --------------------------------------------------------------

    /// Checks the Puts of one write request against the limits (see the module doc). A
    /// refusal lists every (role, resource) over its limit, the documented first one first.
    pub fn check_write(&self, usage: &UsageMap, puts: &[PlannedPut]) -> Result<(), Vec<String>> {
        if self.registry.is_empty() {
            return Ok(());
        }
        let mut totals: BTreeMap<String, Amounts> = BTreeMap::new();
        for put in puts {
            let role = owner(&put.key, &self.registry);
            for r in with_ancestors(role) {
                let sums = totals.entry(r.to_owned()).or_default();
                *sums.entry(KV_BYTES.to_owned()).or_insert(0) += put.bytes as i64 * MILLI;
                if put.new_key {
                    *sums.entry(KV_KEYS.to_owned()).or_insert(0) += MILLI;
                }
            }
        }
        let mut over = Vec::new();
        for (role, sums) in &totals {
            let Some(entry) = self.registry.get(role) else {
                continue;
            };
            for (resource, amount) in sums {
                let Some(limit) = entry.limits.get(resource) else {
                    continue;
                };
                let consumed = consumed_in(usage, role, resource);
                if *amount > 0 && consumed.saturating_add(*amount) > *limit {
                    over.push(quota_exceeded(role, resource, consumed, *amount, *limit));
                }
            }
        }
        if over.is_empty() { Ok(()) } else { Err(over) }
    }

    /// Checks a record's `amounts` for `role` and its ancestors, deepest first.
    fn check_record_limits(
        &self,
        usage: &UsageMap,
        role: &str,
        amounts: &Amounts,
    ) -> Result<(), String> {
        for r in with_ancestors(role) {
            let Some(entry) = self.registry.get(r) else {
                continue;
            };
            for (resource, amount) in amounts {
                let Some(limit) = entry.limits.get(resource) else {
                    continue;
                };
                let consumed = consumed_in(usage, r, resource);
                if *amount > 0 && consumed.saturating_add(*amount) > *limit {
                    return Err(quota_exceeded(r, resource, consumed, *amount, *limit));
                }
            }
        }
        Ok(())
    }

    // ---- Records -----------------------------------------------------------------------

    /// REGISTER_AGENT.
    pub fn register_agent(
        &mut self,
        id: &str,
        state: AgentState,
        raw: &BTreeMap<String, f64>,
    ) -> Result<(), Refusal> {
        let resources = quantities(raw).map_err(invalid_value)?;
        if id.is_empty() {
            return Err(Refusal::Request("Agent id must be set".to_owned()));
        }
        if self.agents.get(id).is_some_and(|a| a.gone) {
            return Err(Refusal::Request(format!(
                "Agent '{id}' was marked gone and cannot register again"
            )));
        }
        let gone = match state {
            AgentState::Recovered => {
                return Err(Refusal::Request(
                    "An agent cannot be registered as RECOVERED".to_owned(),
                ));
            }
            AgentState::Gone => true,
            AgentState::Registered | AgentState::Unreachable => false,
        };
        self.agents.insert(
            id.to_owned(),
            Agent {
                registered: state == AgentState::Registered,
                gone,
                resources,
            },
        );
        if gone {
            // Its allocations go first, giving back what they drew, then its reservations.
            let allocations: Vec<String> = self
                .allocations
                .iter()
                .filter(|(_, a)| a.agent == id)
                .map(|(k, _)| k.clone())
                .collect();
            for allocation in allocations {
                self.release(&allocation)?;
            }
            let reservations: Vec<String> = self
                .reservations
                .iter()
                .filter(|(_, r)| r.agent == id)
                .map(|(k, _)| k.clone())
                .collect();
            for reservation in reservations {
                self.unreserve(&reservation)?;
            }
        }
        Ok(())
    }

    /// A restart: registered agents become recovered (not registered until they register
    /// again). Whether the engine has since timed a recovered agent out to unreachable
    /// changes nothing the model checks: both take no records, count for no capacity and
    /// register again alike.
    pub fn recover_agents(&mut self) {
        for agent in self.agents.values_mut() {
            agent.registered = false;
        }
    }

    /// The checks RESERVE_RESOURCES and ALLOCATE share, in the operator API's order.
    fn check_new_record(
        &self,
        id: &str,
        taken: bool,
        role: &str,
        agent: &str,
    ) -> Result<(), Refusal> {
        if id.is_empty() {
            return Err(Refusal::Request("Record id must be set".to_owned()));
        }
        if taken {
            return Err(Refusal::Request(format!("Record '{id}' already exists")));
        }
        check_role(role).map_err(Refusal::Request)?;
        if role == "*" {
            return Err(Refusal::Request(
                "Resources cannot be reserved or allocated to role '*'".to_owned(),
            ));
        }
        match self.agents.get(agent) {
            None => Err(Refusal::Request(format!("Unknown agent '{agent}'"))),
            Some(a) if !a.registered => Err(Refusal::Request(format!(
                "Agent '{agent}' is not registered"
            ))),
            Some(_) => Ok(()),
        }
    }

    /// RESERVE_RESOURCES, checked against `usage` (the current consumption).
    pub fn reserve(
        &mut self,
        usage: &UsageMap,
        id: &str,
        role: &str,
        agent: &str,
        raw: &BTreeMap<String, f64>,
    ) -> Result<(), Refusal> {
        let resources = quantities(raw).map_err(invalid_value)?;
        self.check_new_record(id, self.reservations.contains_key(id), role, agent)?;
        self.check_record_limits(usage, role, &resources)
            .map_err(Refusal::Limit)?;
        self.reservations.insert(
            id.to_owned(),
            Reservation {
                role: role.to_owned(),
                agent: agent.to_owned(),
                resources,
                in_use: Amounts::new(),
            },
        );
        Ok(())
    }

    /// UNRESERVE_RESOURCES.
    pub fn unreserve(&mut self, id: &str) -> Result<(), Refusal> {
        let Some(r) = self.reservations.get(id) else {
            return Err(Refusal::Request(format!("Unknown reservation '{id}'")));
        };
        if r.in_use.values().any(|v| *v > 0) {
            return Err(Refusal::Request(format!(
                "Reservation '{id}' is in use by allocations"
            )));
        }
        self.reservations.remove(id);
        Ok(())
    }

    /// ALLOCATE: draws on the role's reservations on the agent first.
    pub fn allocate(
        &mut self,
        usage: &UsageMap,
        id: &str,
        role: &str,
        agent: &str,
        raw: &BTreeMap<String, f64>,
    ) -> Result<(), Refusal> {
        let resources = quantities(raw).map_err(invalid_value)?;
        self.check_new_record(id, self.allocations.contains_key(id), role, agent)?;
        let mut drawn: BTreeMap<String, Amounts> = BTreeMap::new();
        let mut rest = Amounts::new();
        for (name, wanted) in &resources {
            let mut left = *wanted;
            for (rid, r) in &self.reservations {
                if left == 0 {
                    break;
                }
                if r.role != role || r.agent != agent {
                    continue;
                }
                let reserved = r.resources.get(name).copied().unwrap_or(0);
                let used = r.in_use.get(name).copied().unwrap_or(0);
                let take = (reserved - used).min(left);
                if take > 0 {
                    left -= take;
                    drawn
                        .entry(rid.clone())
                        .or_default()
                        .insert(name.clone(), take);
                }
            }
            rest.insert(name.clone(), left);
        }
        self.check_record_limits(usage, role, &rest)
            .map_err(Refusal::Limit)?;
        for (rid, amounts) in &drawn {
            if let Some(r) = self.reservations.get_mut(rid) {
                add_into(&mut r.in_use, amounts);
            }
        }
        self.allocations.insert(
            id.to_owned(),
            Allocation {
                role: role.to_owned(),
                agent: agent.to_owned(),
                resources,
                drawn,
            },
        );
        Ok(())
    }

    /// RELEASE: gives back what the allocation drew.
    pub fn release(&mut self, id: &str) -> Result<(), Refusal> {
        let Some(a) = self.allocations.remove(id) else {
            return Err(Refusal::Request(format!("Unknown allocation '{id}'")));
        };
        for (rid, amounts) in &a.drawn {
            if let Some(r) = self.reservations.get_mut(rid) {
                for (name, v) in amounts {
                    let left = r.in_use.get(name).copied().unwrap_or(0) - v;
                    if left > 0 {
                        r.in_use.insert(name.clone(), left);
                    } else {
                        r.in_use.remove(name);
                    }
                }
            }
        }
        Ok(())
    }

    // ---- UPDATE_QUOTA ------------------------------------------------------------------

    /// Returns the capacity guarantees must fit in: registered agents, the space quota as
    /// `kv_bytes` (unlimited without one) and an unlimited `kv_keys`.
    fn capacity(&self, quota_bytes: Option<u64>) -> Amounts {
        let mut capacity = Amounts::new();
        for agent in self.agents.values().filter(|a| a.registered) {
            add_into(&mut capacity, &agent.resources);
        }
        let bytes = quota_bytes.map_or(AMOUNT_MAX, |q| (q as i64).saturating_mul(MILLI));
        add_into(
            &mut capacity,
            &Amounts::from([(KV_BYTES.to_owned(), bytes)]),
        );
        add_into(
            &mut capacity,
            &Amounts::from([(KV_KEYS.to_owned(), AMOUNT_MAX)]),
        );
        capacity
    }

    /// Validates an UPDATE_QUOTA batch; returns the registry it leaves, or the refusal.
    /// `usage_under` recounts consumption with the owners a registry gives.
    pub fn update_quota(
        &self,
        configs: &[RawQuotaConfig],
        force: bool,
        quota_bytes: Option<u64>,
        usage_under: &dyn Fn(&Registry) -> UsageMap,
    ) -> Result<Registry, String> {
        let fail = |text: String| format!("Invalid QuotaConfig: {text}");
        // Phase A, one configuration after the other.
        for raw in configs {
            check_role(&raw.role).map_err(|m| fail(format!("Invalid 'QuotaConfig.role': {m}")))?;
            let guarantees = quantities(&raw.guarantees).unwrap_or_default();
            if !within(&limits(&raw.limits), &guarantees) {
                return Err(fail(format!(
                    "'QuotaConfig.guarantees' {} is not contained within the \
                     'QuotaConfig.limits' {}",
                    show_request_map(&raw.guarantees),
                    show_request_map(&raw.limits)
                )));
            }
        }
        let mut tentative = self.registry.clone();
        for raw in configs {
            let entry = Entry {
                guarantees: quantities(&raw.guarantees).unwrap_or_default(),
                limits: limits(&raw.limits),
            };
            if entry.guarantees.is_empty() && entry.limits.is_empty() {
                tentative.remove(&raw.role);
            } else {
                tentative.insert(raw.role.clone(), entry);
            }
        }
        // Phase B: limits against what each role would consume.
        if !force {
            let usage = usage_under(&tentative);
            for raw in configs {
                let consumed: Amounts = usage
                    .iter()
                    .filter(|((role, _), u)| *role == raw.role && u.consumed() > 0)
                    .map(|((_, resource), u)| (resource.clone(), u.consumed()))
                    .collect();
                let wanted = limits(&raw.limits);
                if !within(&wanted, &consumed) {
                    return Err(fail(format!(
                        "Role '{}' is already consuming '{}'; this is more than the requested \
                         limits '{}' (use 'force' flag to bypass this check)",
                        raw.role,
                        show_amounts(&consumed),
                        show_amounts(&wanted)
                    )));
                }
            }
        }
        // Phase C: every node's guarantees hold the sum of its children's.
        check_hierarchy(&tentative).map_err(fail)?;
        // Phase D: the top-level guarantees fit the capacity.
        if !force {
            let mut total = Amounts::new();
            for (role, entry) in &tentative {
                if !role.contains('/') {
                    add_into(&mut total, &entry.guarantees);
                }
            }
            let capacity = self.capacity(quota_bytes);
            if !holds(&capacity, &total) {
                return Err(fail(format!(
                    "total quota guarantees '{}' exceed cluster capacity '{}' (use 'force' flag \
                     to bypass this check)",
                    show_amounts(&total),
                    show_amounts(&without_unbounded(&capacity))
                )));
            }
        }
        Ok(tentative)
    }
}

/// Mesos's QuotaTree check on `registry`: children before parents, siblings by name.
fn check_hierarchy(registry: &Registry) -> Result<(), String> {
    let mut nodes: BTreeSet<&str> = BTreeSet::new();
    for role in registry.keys() {
        nodes.extend(with_ancestors(role));
    }
    let guarantees = |role: &str| {
        registry
            .get(role)
            .map(|e| e.guarantees.clone())
            .unwrap_or_default()
    };
    let children = |role: &str| -> Vec<&str> {
        nodes
            .iter()
            .copied()
            .filter(|n| parent_of(n) == Some(role))
            .collect()
    };
    // Post-order walk with an explicit stack: (node, children already pushed).
    let mut stack: Vec<(&str, bool)> = nodes
        .iter()
        .copied()
        .filter(|n| !n.contains('/'))
        .rev()
        .map(|n| (n, false))
        .collect();
    while let Some((node, expanded)) = stack.pop() {
        let kids = children(node);
        if !expanded {
            stack.push((node, true));
            stack.extend(kids.iter().rev().map(|k| (*k, false)));
            continue;
        }
        let mut sum = Amounts::new();
        for kid in &kids {
            add_into(&mut sum, &guarantees(kid));
        }
        let own = guarantees(node);
        if !holds(&own, &sum) {
            return Err(format!(
                "Invalid quota configuration. Parent role '{node}' with guarantees ({}) does not \
                 contain the sum of its children's guarantees ({})",
                show_amounts(&own),
                show_amounts(&sum)
            ));
        }
    }
    Ok(())
}

/// Why the model refuses a registry or record request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A malformed or impossible request (`Error::QuotaRequest`).
    Request(String),
    /// A limit (`Error::QuotaExceeded`).
    Limit(String),
}

fn invalid_value((name, reason): (String, &'static str)) -> Refusal {
    Refusal::Request(format!("Invalid value for resource '{name}': {reason}"))
}
