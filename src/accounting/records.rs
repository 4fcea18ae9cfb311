//! Agents, reservations and allocations: the records Mesos's reconciliation and the
//! consumption tables are built on. A reservation and an allocation take the same path:
//! check the record, work out what it adds to the role's consumption, check the limits,
//! charge, write the row (ACCT-2, ACCT-4). They differ in one step: an allocation draws
//! first on its role's unallocated reservations on the same agent, and only the rest counts
//! as new consumption (ACCT-3).
//!
//! An allocation may be placed *preparing*: it draws on reservations as a running one does,
//! but its resources count as `offered` instead of `allocated`, and it takes a slot of the
//! prepare queue (ACCT-6, `prepare`). START turns it into a running one (`offered` to
//! `allocated`, nothing else moves), RELEASE ends either kind.

use std::collections::BTreeMap;
use std::time::Duration;

use super::Column;
use super::{
    AGENTS_TABLE, ALLOCATIONS_TABLE, Accounts, Agent, AgentState, Allocation, Counters,
    RESERVATIONS_TABLE, Reservation, codec,
};
use crate::error::Error;
use crate::quota::{self, ResourceQuantities, STAR_ROLE, Scalar};
use crate::storage::WriteBatch;

/// Which kind of record a request places or removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// Resources set aside for a role on an agent (counted as `reserved`).
    Reservation,
    /// Resources in use by a role on an agent (counted as `allocated`).
    Allocation,
}

impl RecordKind {
    /// The word Mesos's messages use for this kind of record.
    fn noun(self) -> &'static str {
        match self {
            RecordKind::Reservation => "reservation",
            RecordKind::Allocation => "allocation",
        }
    }
}

impl Accounts {
    /// Registers or updates an agent and its total resources; a recovered or unreachable
    /// agent becomes registered again. `state` other than registered is the same as the
    /// matching mark call at wall time `now`. A gone agent cannot register again.
    pub fn register_agent(
        &mut self,
        id: &str,
        state: AgentState,
        resources: ResourceQuantities,
        now: Duration,
        batch: &mut WriteBatch<'_>,
    ) -> Result<(), Error> {
        if id.is_empty() {
            return Err(Error::QuotaRequest("Agent id must be set".into()));
        }
        if self
            .agents
            .get(id)
            .is_some_and(|a| a.state == AgentState::Gone)
        {
            return Err(Error::QuotaRequest(format!(
                "Agent '{id}' was marked gone and cannot register again"
            )));
        }
        match state {
            AgentState::Registered => {}
            AgentState::Recovered => {
                return Err(Error::QuotaRequest(
                    "An agent cannot be registered as RECOVERED".into(),
                ));
            }
            AgentState::Unreachable | AgentState::Gone => {
                // The resources are updated with the state.
                let agent = Agent {
                    resources,
                    ..self.agents.get(id).cloned().unwrap_or_default()
                };
                self.put_agent(id, agent, batch)?;
                return if state == AgentState::Gone {
                    self.mark_gone(id, batch)
                } else {
                    self.mark_unreachable(id, now, batch)
                };
            }
        }
        let agent = Agent {
            state,
            resources,
            unreachable_since: None,
        };
        self.put_agent(id, agent, batch)
    }

    /// Marks an agent unreachable since wall time `now` (MARK_AGENT_UNREACHABLE). An agent
    /// already unreachable keeps the time it became so; a gone one stays gone (refused).
    pub fn mark_unreachable(
        &mut self,
        id: &str,
        now: Duration,
        batch: &mut WriteBatch<'_>,
    ) -> Result<(), Error> {
        let agent = self.known_agent(id)?;
        match agent.state {
            AgentState::Gone => Err(Error::QuotaRequest(format!("Agent '{id}' was marked gone"))),
            AgentState::Unreachable => Ok(()),
            AgentState::Registered | AgentState::Recovered => {
                let since = u64::try_from(now.as_nanos()).unwrap_or(u64::MAX);
                let agent = Agent {
                    state: AgentState::Unreachable,
                    unreachable_since: Some(since),
                    ..agent
                };
                self.put_agent(id, agent, batch)
            }
        }
    }

    /// Marks an agent gone (MARK_AGENT_GONE): terminal; its allocations and then its
    /// reservations are released, so its consumption goes, in this batch. Marking a gone
    /// agent again changes nothing.
    pub fn mark_gone(&mut self, id: &str, batch: &mut WriteBatch<'_>) -> Result<(), Error> {
        let agent = self.known_agent(id)?;
        if agent.state == AgentState::Gone {
            return Ok(());
        }
        // Allocations first: they give back what they drew from the reservations.
        let on_agent = |records: &mut dyn Iterator<Item = (&String, &str)>| -> Vec<String> {
            records
                .filter(|(_, agent)| *agent == id)
                .map(|(record, _)| record.clone())
                .collect()
        };
        let allocations = on_agent(&mut self.allocations.iter().map(|(k, a)| (k, &*a.agent)));
        let reservations = on_agent(&mut self.reservations.iter().map(|(k, r)| (k, &*r.agent)));
        for (kind, ids) in [
            (RecordKind::Allocation, allocations),
            (RecordKind::Reservation, reservations),
        ] {
            for record in ids {
                self.remove(kind, &record, batch)?;
            }
        }
        let agent = Agent {
            state: AgentState::Gone,
            ..agent
        };
        self.put_agent(id, agent, batch)
    }

    /// Marks every recovered agent unreachable since wall time `now`: they did not register
    /// again within the timeout. Returns how many.
    pub fn recovered_timed_out(
        &mut self,
        now: Duration,
        batch: &mut WriteBatch<'_>,
    ) -> Result<usize, Error> {
        let recovered: Vec<String> = self
            .agents
            .iter()
            .filter(|(_, a)| a.state == AgentState::Recovered)
            .map(|(k, _)| k.clone())
            .collect();
        for id in &recovered {
            self.mark_unreachable(id, now, batch)?;
        }
        Ok(recovered.len())
    }

    /// Returns true if an agent is recovered and has not registered again.
    pub fn has_recovered_agents(&self) -> bool {
        self.agents
            .values()
            .any(|a| a.state == AgentState::Recovered)
    }

    /// Returns the agent `id`, if known.
    pub fn agent(&self, id: &str) -> Option<&Agent> {
        self.agents.get(id)
    }

    /// Returns every agent, by id.
    pub fn agents(&self) -> &BTreeMap<String, Agent> {
        &self.agents
    }

    fn known_agent(&self, id: &str) -> Result<Agent, Error> {
        self.agents
            .get(id)
            .cloned()
            .ok_or_else(|| Error::QuotaRequest(format!("Unknown agent '{id}'")))
    }

    fn put_agent(
        &mut self,
        id: &str,
        agent: Agent,
        batch: &mut WriteBatch<'_>,
    ) -> Result<(), Error> {
        batch.put_row(AGENTS_TABLE, id.as_bytes(), &codec::encode_agent(&agent))?;
        self.agents.insert(id.to_owned(), agent);
        Ok(())
    }

    /// Places a reservation or an allocation of `resources` for `role` on `agent`, checked
    /// against the limits of the role and its ancestors; a `prepare`d allocation is also
    /// checked against the prepare queue at `now` (engine clock). On a refusal nothing
    /// changes.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &mut self,
        kind: RecordKind,
        id: &str,
        role: &str,
        agent: &str,
        resources: ResourceQuantities,
        prepare: bool,
        now: Duration,
        batch: &mut WriteBatch<'_>,
    ) -> Result<(), Error> {
        let exists = match kind {
            RecordKind::Reservation => self.reservations.contains_key(id),
            RecordKind::Allocation => self.allocations.contains_key(id),
        };
        if prepare && kind == RecordKind::Reservation {
            return Err(Error::QuotaRequest(
                "Only an allocation can be prepared".into(),
            ));
        }
        self.check_record(id, role, agent, exists)?;
        let drawn = match kind {
            RecordKind::Reservation => BTreeMap::new(),
            RecordKind::Allocation => self.draw(role, agent, &resources),
        };
        // What the record adds to the role's consumption: all of it, less what an allocation
        // draws from reservations (already counted as reserved).
        let added: BTreeMap<&str, i64> = resources
            .iter()
            .map(|(name, value)| {
                let from_reservations: i64 = drawn.values().map(|q| q.get(name).milli()).sum();
                (name, value.milli() - from_reservations)
            })
            .collect();
        self.check_limits(role, &added)?;
        if prepare {
            self.prepare.check(role, now)?;
        }
        match kind {
            RecordKind::Reservation => {
                self.charge_each(role, &resources, Column::Reserved, 1);
                let reservation = Reservation {
                    role: role.to_owned(),
                    agent: agent.to_owned(),
                    resources,
                    ..Reservation::default()
                };
                let row = codec::encode_reservation(&reservation);
                batch.put_row(RESERVATIONS_TABLE, id.as_bytes(), &row)?;
                self.reservations.insert(id.to_owned(), reservation);
            }
            RecordKind::Allocation => {
                self.move_in_use(role, &drawn, 1, batch)?;
                let counter = if prepare {
                    Column::Offered
                } else {
                    Column::Allocated
                };
                self.charge_each(role, &resources, counter, 1);
                let allocation = Allocation {
                    role: role.to_owned(),
                    agent: agent.to_owned(),
                    resources,
                    drawn,
                    preparing: prepare,
                };
                let row = codec::encode_allocation(&allocation);
                batch.put_row(ALLOCATIONS_TABLE, id.as_bytes(), &row)?;
                self.allocations.insert(id.to_owned(), allocation);
                if prepare {
                    self.prepare.admitted(role, now);
                }
            }
        }
        Ok(())
    }

    /// Turns a preparing allocation into a running one: its resources move from `offered`
    /// to `allocated`, in the row and the counters. Never refused for quota (ACCT-4): what
    /// the role holds stays as it was.
    pub fn start(&mut self, id: &str, batch: &mut WriteBatch<'_>) -> Result<(), Error> {
        let Some(allocation) = self.allocations.get(id) else {
            return Err(Error::QuotaRequest(format!("Unknown allocation '{id}'")));
        };
        if !allocation.preparing {
            return Err(Error::QuotaRequest(format!(
                "Allocation '{id}' is not preparing"
            )));
        }
        let started = Allocation {
            preparing: false,
            ..allocation.clone()
        };
        batch.put_row(
            ALLOCATIONS_TABLE,
            id.as_bytes(),
            &codec::encode_allocation(&started),
        )?;
        let (role, resources) = (started.role.clone(), started.resources.clone());
        self.charge_each(&role, &resources, Column::Offered, -1);
        self.charge_each(&role, &resources, Column::Allocated, 1);
        self.prepare.ended(&role);
        self.allocations.insert(id.to_owned(), started);
        Ok(())
    }

    /// Removes a reservation no allocation draws on, or an allocation, preparing or running
    /// (giving back what it drew from reservations, and its prepare queue slot).
    pub fn remove(
        &mut self,
        kind: RecordKind,
        id: &str,
        batch: &mut WriteBatch<'_>,
    ) -> Result<(), Error> {
        let unknown = || Error::QuotaRequest(format!("Unknown {} '{id}'", kind.noun()));
        match kind {
            RecordKind::Reservation => {
                let reservation = self.reservations.get(id).ok_or_else(unknown)?;
                if !reservation.in_use.is_empty() {
                    return Err(Error::QuotaRequest(format!(
                        "Reservation '{id}' is in use by allocations"
                    )));
                }
                let (role, resources) = (reservation.role.clone(), reservation.resources.clone());
                self.charge_each(&role, &resources, Column::Reserved, -1);
                batch.delete_row(RESERVATIONS_TABLE, id.as_bytes())?;
                self.reservations.remove(id);
            }
            RecordKind::Allocation => {
                let allocation = self.allocations.get(id).ok_or_else(unknown)?.clone();
                self.move_in_use(&allocation.role, &allocation.drawn, -1, batch)?;
                let (resources, role) = (&allocation.resources, &allocation.role);
                if allocation.preparing {
                    self.charge_each(role, resources, Column::Offered, -1);
                    self.prepare.ended(role);
                } else {
                    self.charge_each(role, resources, Column::Allocated, -1);
                }
                batch.delete_row(ALLOCATIONS_TABLE, id.as_bytes())?;
                self.allocations.remove(id);
            }
        }
        Ok(())
    }

    /// Returns what an allocation of `resources` for `role` on `agent` draws from the role's
    /// unallocated reservations there, by reservation id.
    fn draw(
        &self,
        role: &str,
        agent: &str,
        resources: &ResourceQuantities,
    ) -> BTreeMap<String, ResourceQuantities> {
        let mut drawn: BTreeMap<String, ResourceQuantities> = BTreeMap::new();
        for (name, wanted) in resources.iter() {
            let mut left = wanted.milli();
            for (rid, r) in &self.reservations {
                if left == 0 {
                    break;
                }
                if r.role != role || r.agent != agent {
                    continue;
                }
                let free = r.resources.get(name).milli() - r.in_use.get(name).milli();
                let take = free.min(left);
                if take > 0
                    && let Some(value) = Scalar::from_milli(take)
                {
                    left -= take;
                    drawn
                        .entry(rid.clone())
                        .or_default()
                        .add_resource(name, value);
                }
            }
        }
        drawn
    }

    /// Adds (`sign` 1) or gives back (-1) what an allocation drew from reservations: their
    /// `in_use` rows and the role's `reserved_in_use` counters.
    fn move_in_use(
        &mut self,
        role: &str,
        drawn: &BTreeMap<String, ResourceQuantities>,
        sign: i64,
        batch: &mut WriteBatch<'_>,
    ) -> Result<(), Error> {
        for (rid, amounts) in drawn {
            if let Some(r) = self.reservations.get_mut(rid) {
                for (name, value) in amounts.iter() {
                    let now = if sign > 0 {
                        r.in_use.get(name).saturating_add(value)
                    } else {
                        r.in_use.get(name).saturating_sub(value)
                    };
                    r.in_use = without(&r.in_use, name);
                    if !now.is_zero() {
                        r.in_use.add_resource(name, now);
                    }
                }
                let row = codec::encode_reservation(r);
                batch.put_row(RESERVATIONS_TABLE, rid.as_bytes(), &row)?;
            }
            self.charge_each(role, amounts, Column::ReservedInUse, sign);
        }
        Ok(())
    }

    /// Charges (`sign` 1) or uncharges (-1) each resource of `quantities` to `role`, as the
    /// counter `field` makes of its milli-units.
    fn charge_each(
        &mut self,
        role: &str,
        quantities: &ResourceQuantities,
        column: Column,
        sign: i64,
    ) {
        for (name, value) in quantities.iter() {
            self.charge(role, name, Counters::of(column, value.milli()), sign);
        }
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
