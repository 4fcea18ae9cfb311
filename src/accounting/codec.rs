//! The byte encodings of the accounting tables. Total decoders: bad bytes give
//! `Corrupted`, never a panic (STORE-4).
//!
//! Every value starts with a format byte (1). Strings are a big-endian u32 length and UTF-8
//! bytes; a quantity map is a u32 count of (string name, big-endian i64 milli-units).
//!
//! An allocation row has two formats: format 1 is a running allocation (the only kind
//! before the prepare queue, so every older row is one, and a file that never prepares an
//! allocation stays readable by older builds); format 2 is format 1's fields followed by
//! one state byte (1 = preparing). A running allocation is always written as format 1. A
//! setting row is the format byte and a big-endian u64. An agent row is format 1 (state byte,
//! quantities) or, for an agent with an unreachable time, format 2: format 1's fields and
//! the big-endian u64 wall-clock nanoseconds it became unreachable.

use std::collections::BTreeMap;

use super::{Agent, AgentState, Allocation, Reservation};
use crate::codec::Reader;
use crate::error::StorageError;
use crate::quota::{QuotaConfig, ResourceLimits, ResourceQuantities, Scalar};

const FORMAT: u8 = 1;
/// The allocation row format that carries a state byte after format 1's fields.
const ALLOCATION_FORMAT_STATE: u8 = 2;
/// The agent row format that carries the time the agent became unreachable.
const AGENT_FORMAT_SINCE: u8 = 2;
/// The state byte of a preparing allocation.
const STATE_PREPARING: u8 = 1;

/// What the error messages call these values.
const ROW: &str = "accounting row";

fn corrupted(what: &str) -> StorageError {
    StorageError::Corrupted(format!("{ROW}: {what}"))
}

/// The accounting reads on top of the shared reader: name/amount pairs, quantities, the
/// format byte.
trait RowReader {
    fn pairs(&mut self) -> Result<Vec<(String, i64)>, StorageError>;
    fn quantities(&mut self) -> Result<ResourceQuantities, StorageError>;
    fn format(&mut self) -> Result<(), StorageError>;
}

impl RowReader for Reader<'_> {
    fn pairs(&mut self) -> Result<Vec<(String, i64)>, StorageError> {
        let count = self.u32()?;
        let mut out = Vec::new();
        for _ in 0..count {
            out.push((self.string()?, self.i64()?));
        }
        Ok(out)
    }

    fn quantities(&mut self) -> Result<ResourceQuantities, StorageError> {
        let mut q = ResourceQuantities::default();
        for (name, milli) in self.pairs()? {
            q.add_resource(
                &name,
                Scalar::from_milli(milli).ok_or_else(|| corrupted("negative quantity"))?,
            );
        }
        Ok(q)
    }

    fn format(&mut self) -> Result<(), StorageError> {
        if self.u8()? != FORMAT {
            return Err(corrupted("unknown format"));
        }
        Ok(())
    }
}

/// Returns a reader of an accounting row.
fn reader(value: &[u8]) -> Reader<'_> {
    Reader::new(value, ROW)
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&u32::try_from(s.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_pairs<'a>(out: &mut Vec<u8>, pairs: impl Iterator<Item = (&'a str, i64)>) {
    let pairs: Vec<_> = pairs.collect();
    out.extend_from_slice(&u32::try_from(pairs.len()).unwrap_or(u32::MAX).to_be_bytes());
    for (name, milli) in pairs {
        put_string(out, name);
        out.extend_from_slice(&milli.to_be_bytes());
    }
}

fn put_quantities(out: &mut Vec<u8>, q: &ResourceQuantities) {
    put_pairs(out, q.iter().map(|(n, v)| (n, v.milli())));
}

/// Encodes a registry row's value.
pub fn encode_config(config: &QuotaConfig) -> Vec<u8> {
    let mut out = vec![FORMAT];
    put_quantities(&mut out, &config.guarantees);
    put_pairs(&mut out, config.limits.iter().map(|(n, v)| (n, v.milli())));
    out
}

/// Decodes a registry row.
pub fn decode_config(key: &[u8], value: &[u8]) -> Result<QuotaConfig, StorageError> {
    let role = String::from_utf8(key.to_vec()).map_err(|_| corrupted("role is not UTF-8"))?;
    let mut r = reader(value);
    r.format()?;
    let guarantees = r.quantities()?;
    let mut limits = ResourceLimits::default();
    for (name, milli) in r.pairs()? {
        limits.set(
            &name,
            Scalar::from_milli(milli).ok_or_else(|| corrupted("negative limit"))?,
        );
    }
    r.end()?;
    Ok(QuotaConfig {
        role,
        guarantees,
        limits,
    })
}

/// Decodes a record id (a UTF-8 key).
pub fn decode_id(key: &[u8]) -> Result<String, StorageError> {
    String::from_utf8(key.to_vec()).map_err(|_| corrupted("id is not UTF-8"))
}

/// Encodes an agent.
pub fn encode_agent(agent: &Agent) -> Vec<u8> {
    let state = match agent.state {
        // A recovered agent is a registered one that has not come back yet.
        AgentState::Registered | AgentState::Recovered => 0,
        AgentState::Unreachable => 1,
        AgentState::Gone => 2,
    };
    let format = if agent.unreachable_since.is_some() {
        AGENT_FORMAT_SINCE
    } else {
        FORMAT
    };
    let mut out = vec![format, state];
    put_quantities(&mut out, &agent.resources);
    if let Some(since) = agent.unreachable_since {
        out.extend_from_slice(&since.to_be_bytes());
    }
    out
}

/// Decodes an agent.
pub fn decode_agent(value: &[u8]) -> Result<Agent, StorageError> {
    let mut r = reader(value);
    let format = r.u8()?;
    if format != FORMAT && format != AGENT_FORMAT_SINCE {
        return Err(corrupted("unknown format"));
    }
    let state = match r.u8()? {
        0 => AgentState::Registered,
        1 => AgentState::Unreachable,
        2 => AgentState::Gone,
        _ => return Err(corrupted("unknown agent state")),
    };
    let resources = r.quantities()?;
    let unreachable_since = if format == AGENT_FORMAT_SINCE {
        Some(r.u64()?)
    } else {
        None
    };
    r.end()?;
    Ok(Agent {
        state,
        resources,
        unreachable_since,
    })
}

/// Encodes a reservation.
pub fn encode_reservation(reservation: &Reservation) -> Vec<u8> {
    let mut out = vec![FORMAT];
    put_string(&mut out, &reservation.role);
    put_string(&mut out, &reservation.agent);
    put_quantities(&mut out, &reservation.resources);
    put_quantities(&mut out, &reservation.in_use);
    out
}

/// Decodes a reservation.
pub fn decode_reservation(value: &[u8]) -> Result<Reservation, StorageError> {
    let mut r = reader(value);
    r.format()?;
    let reservation = Reservation {
        role: r.string()?,
        agent: r.string()?,
        resources: r.quantities()?,
        in_use: r.quantities()?,
    };
    r.end()?;
    Ok(reservation)
}

/// Encodes an allocation: format 1 if running, format 2 with its state byte if preparing.
pub fn encode_allocation(allocation: &Allocation) -> Vec<u8> {
    let format = if allocation.preparing {
        ALLOCATION_FORMAT_STATE
    } else {
        FORMAT
    };
    let mut out = vec![format];
    put_string(&mut out, &allocation.role);
    put_string(&mut out, &allocation.agent);
    put_quantities(&mut out, &allocation.resources);
    out.extend_from_slice(
        &u32::try_from(allocation.drawn.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    for (id, amounts) in &allocation.drawn {
        put_string(&mut out, id);
        put_quantities(&mut out, amounts);
    }
    if allocation.preparing {
        out.push(STATE_PREPARING);
    }
    out
}

/// Decodes an allocation of either format.
pub fn decode_allocation(value: &[u8]) -> Result<Allocation, StorageError> {
    let mut r = reader(value);
    let format = r.u8()?;
    if format != FORMAT && format != ALLOCATION_FORMAT_STATE {
        return Err(corrupted("unknown format"));
    }
    let (role, agent, resources) = (r.string()?, r.string()?, r.quantities()?);
    let mut drawn = BTreeMap::new();
    for _ in 0..r.u32()? {
        drawn.insert(r.string()?, r.quantities()?);
    }
    let preparing = match format {
        FORMAT => false,
        _ => match r.u8()? {
            STATE_PREPARING => true,
            _ => return Err(corrupted("unknown allocation state")),
        },
    };
    r.end()?;
    Ok(Allocation {
        role,
        agent,
        resources,
        drawn,
        preparing,
    })
}

/// Encodes a setting's value.
pub fn encode_setting(value: u64) -> Vec<u8> {
    let mut out = vec![FORMAT];
    out.extend_from_slice(&value.to_be_bytes());
    out
}

/// Decodes a setting's value.
pub fn decode_setting(value: &[u8]) -> Result<u64, StorageError> {
    let mut r = reader(value);
    r.format()?;
    let setting = r.u64()?;
    r.end()?;
    Ok(setting)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounting_rows_round_trip_and_reject_bad_bytes() {
        let mut resources = ResourceQuantities::default();
        resources.add_resource("cpus", Scalar::from_units(2));
        let reservation = Reservation {
            role: "a/b".into(),
            agent: "agent-1".into(),
            resources: resources.clone(),
            in_use: resources,
        };
        let encoded = encode_reservation(&reservation);
        assert_eq!(decode_reservation(&encoded), Ok(reservation));
        for len in 0..encoded.len() {
            assert!(
                decode_reservation(&encoded[..len]).is_err(),
                "prefix of {len} bytes decoded"
            );
        }
    }

    fn allocation(preparing: bool) -> Allocation {
        let mut resources = ResourceQuantities::default();
        resources.add_resource("cpus", Scalar::from_units(3));
        let mut drawn = ResourceQuantities::default();
        drawn.add_resource("cpus", Scalar::from_units(1));
        Allocation {
            role: "ml".into(),
            agent: "a1".into(),
            resources,
            drawn: [("r1".to_owned(), drawn)].into(),
            preparing,
        }
    }

    #[test]
    fn allocation_rows_of_both_formats_round_trip_and_old_rows_decode_as_running() {
        // A row as builds before the prepare queue wrote it, byte by byte.
        let mut old = vec![1];
        for s in ["ml", "a1"] {
            old.extend_from_slice(&(s.len() as u32).to_be_bytes());
            old.extend_from_slice(s.as_bytes());
        }
        let cpus = |out: &mut Vec<u8>, milli: i64| {
            out.extend_from_slice(&1u32.to_be_bytes());
            out.extend_from_slice(&4u32.to_be_bytes());
            out.extend_from_slice(b"cpus");
            out.extend_from_slice(&milli.to_be_bytes());
        };
        cpus(&mut old, 3000);
        old.extend_from_slice(&1u32.to_be_bytes());
        old.extend_from_slice(&2u32.to_be_bytes());
        old.extend_from_slice(b"r1");
        cpus(&mut old, 1000);
        assert_eq!(decode_allocation(&old), Ok(allocation(false)));
        // Running allocations are still written in the old format.
        assert_eq!(encode_allocation(&allocation(false)), old);
        let preparing = encode_allocation(&allocation(true));
        assert_eq!(preparing[0], 2);
        assert_eq!(decode_allocation(&preparing), Ok(allocation(true)));
        for len in 0..preparing.len() {
            assert!(decode_allocation(&preparing[..len]).is_err(), "{len} bytes");
        }
        let mut bad_state = preparing.clone();
        *bad_state.last_mut().unwrap() = 7;
        assert!(decode_allocation(&bad_state).is_err());
        assert_eq!(decode_setting(&encode_setting(42)), Ok(42));
        assert!(decode_setting(&encode_setting(42)[..8]).is_err());
    }
}
