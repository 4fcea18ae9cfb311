//! The space quota and the alarms, as the model knows them: etcd's cost of a write, the
//! quota in force, the filesystem reserve, the alarm set, and what the model can say about a
//! write's space check without knowing how many pages redb allocates.
//!
//! The rules, as etcd and kvd's design document them:
//! - **Cost** (etcd's quota cost): a Put costs 256 + |key| + |value| (the request's value,
//!   so an `ignore_value` Put costs only its key); a Txn costs the larger of its two branches,
//!   a branch the sum of its Puts and of its nested Txns' own costs (Ranges and DeleteRanges
//!   cost 0; etcd 3.5.33, 3.6.14 and main cost nested Txns, older versions do not); a
//!   LeaseGrant costs 64; everything else costs 0 and is never refused for space.
//! - **Quota**: `--quota-backend-bytes` 0 means 2 GiB, a negative value disables the quota,
//!   anything else is the quota in bytes.
//! - **Filesystem reserve**: a write with cost `c` is refused while the free space is below
//!   `reserve + c`; the reserve is an eighth of the quota and at least 64 MiB. A free figure
//!   that cannot be read refuses nothing.
//! - **kvd's space check**: a write with cost `c` is accepted only if `in_use + 2c + 16 KiB <
//!   quota` (`in_use`: the bytes of the pages redb has allocated; 16 KiB: one commit's page
//!   allowance), stricter than etcd's `size + c < quota`. The first refusal raises NOSPACE
//!   for member 0 in the same commit.
//! - **Alarms** are (member, type) pairs, listed by member, then type. Only a Deactivate clears
//!   one. Under NOSPACE every write with a cost is refused; under CORRUPT every write (cost 0
//!   or not, registry and record requests included) is refused; reads, read-only Txns,
//!   Alarm requests and defrag always work. Lease expiry waits while CORRUPT is active.
//!
//! The model cannot know `in_use`. It knows a lower bound (the bytes of every live key and
//! value: redb stores them uncompressed) and two upper bounds of what the engine decides on:
//! right after the harness measured, the figure the engine's running estimate starts from;
//! and the file's length (the pages in use lie within the file, and the engine measures
//! exactly before it refuses). So it sorts each check into [`Verdict`]s: must refuse, must
//! accept, or either (the engine decides, and the model follows and checks that the refusal
//! changed nothing and latched the alarm).

use std::collections::BTreeSet;

use kvd::{AlarmMember, AlarmType, RequestOp, TxnRequest};

use super::wire::alarm_type_number;

/// etcd's kvOverhead: a Put's cost beyond its key and value.
pub const PUT_OVERHEAD_BYTES: u64 = 256;
/// etcd's leaseOverhead: the cost of a LeaseGrant.
pub const LEASE_GRANT_COST_BYTES: u64 = 64;
/// etcd's default quota (`--quota-backend-bytes` 0).
pub const QUOTA_DEFAULT_BYTES: u64 = 2 << 30;
/// The smallest filesystem reserve.
pub const FS_RESERVE_MIN_BYTES: u64 = 64 << 20;
/// The page allowance kvd adds to twice a write's cost.
pub const COMMIT_ALLOWANCE_BYTES: u64 = 16 << 10;
/// Slack between an upper bound of the pages in use and the quota before the model insists
/// on acceptance: background compaction steps commit between the reading and the write, and
/// may move the allocated pages a little.
pub const MUST_ACCEPT_SLACK_BYTES: u64 = 64 << 10;

/// Returns etcd's cost of a Put of this key and value.
pub fn put_cost(key: &[u8], value: &[u8]) -> u64 {
    PUT_OVERHEAD_BYTES + key.len() as u64 + value.len() as u64
}

/// Returns etcd's cost of a Txn: the costlier branch, nested Txns counted.
pub fn txn_cost(txn: &TxnRequest) -> u64 {
    branch_cost(&txn.success).max(branch_cost(&txn.failure))
}

fn branch_cost(ops: &[RequestOp]) -> u64 {
    let mut total = 0;
    for op in ops {
        total += match op {
            RequestOp::Put(p) => put_cost(&p.key, &p.value),
            RequestOp::Txn(t) => txn_cost(t),
            RequestOp::Range(_) | RequestOp::DeleteRange(_) => 0,
        };
    }
    total
}

/// Returns the quota in force for `--quota-backend-bytes = configured` (None: disabled).
pub fn quota_in_force(configured: i64) -> Option<u64> {
    if configured == 0 {
        Some(QUOTA_DEFAULT_BYTES)
    } else if configured < 0 {
        None
    } else {
        Some(configured as u64)
    }
}

/// Returns the default filesystem reserve under `quota`.
pub fn fs_reserve(quota: Option<u64>) -> u64 {
    match quota {
        Some(q) => (q / 8).max(FS_RESERVE_MIN_BYTES),
        None => FS_RESERVE_MIN_BYTES,
    }
}

/// Returns the room kvd checks a write of cost `cost` for.
pub fn room_needed(cost: u64) -> u64 {
    2 * cost + COMMIT_ALLOWANCE_BYTES
}

/// What the model can say about the space check of one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Even the smallest possible in-use size leaves no room.
    MustRefuse,
    /// The estimate the engine starts from (a fresh measurement) leaves room with slack.
    MustAccept,
    /// Depends on pages the model cannot see: the engine decides.
    Either,
}

/// Returns the verdict for a write of `cost` under `quota`, with `live_bytes` of live keys and
/// values and an upper bound of what the engine decides on, if the harness has one.
pub fn verdict(quota: Option<u64>, cost: u64, live_bytes: u64, in_use_max: Option<u64>) -> Verdict {
    let Some(quota) = quota else {
        return Verdict::MustAccept;
    };
    let need = room_needed(cost);
    if live_bytes.saturating_add(need) >= quota {
        return Verdict::MustRefuse;
    }
    match in_use_max {
        Some(m)
            if m.saturating_add(need)
                .saturating_add(MUST_ACCEPT_SLACK_BYTES)
                < quota =>
        {
            Verdict::MustAccept
        }
        _ => Verdict::Either,
    }
}

/// Counts of how the model decided space checks, for the run's report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpaceStats {
    /// Writes refused because NOSPACE was already latched (at admission or at apply).
    pub refused_latched: usize,
    /// Writes refused by the filesystem reserve.
    pub refused_fs: usize,
    /// Writes the model knew had to be refused for the quota.
    pub refused_must: usize,
    /// Writes the engine refused where either answer was allowed.
    pub refused_either: usize,
    /// Writes with a cost the model knew had to be accepted under a quota.
    pub accepted_must: usize,
    /// Of which the bound was a fresh measurement.
    pub accepted_measured: usize,
    /// Writes the engine accepted where either answer was allowed.
    pub accepted_either: usize,
    /// Writes with a cost accepted after NOSPACE had been raised and cleared since.
    pub accepted_after_disarm: usize,
    /// Writes refused because CORRUPT was active.
    pub refused_corrupt: usize,
    /// NOSPACE alarms cleared by a Deactivate.
    pub disarms: usize,
}

/// The alarm set: (member, type), in list order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Alarms {
    set: BTreeSet<(u64, u64)>,
}

impl Alarms {
    /// Returns true if some member has a NOSPACE alarm.
    pub fn nospace(&self) -> bool {
        self.set.iter().any(|&(_, t)| t == 1)
    }

    /// Returns true if some member has a CORRUPT alarm.
    pub fn corrupt(&self) -> bool {
        self.set.iter().any(|&(_, t)| t == 2)
    }

    /// Adds an alarm; returns true if it was not active.
    pub fn activate(&mut self, member: AlarmMember) -> bool {
        self.set
            .insert((member.member_id, alarm_type_number(member.alarm)))
    }

    /// Removes an alarm; returns true if it was active.
    pub fn deactivate(&mut self, member: AlarmMember) -> bool {
        self.set
            .remove(&(member.member_id, alarm_type_number(member.alarm)))
    }

    /// Returns the alarms of type `filter` (every type for NONE), by member then type.
    pub fn list(&self, filter: AlarmType) -> Vec<AlarmMember> {
        let wanted = alarm_type_number(filter);
        self.set
            .iter()
            .filter(|&&(_, t)| wanted == 0 || t == wanted)
            .map(|&(member_id, t)| AlarmMember {
                member_id,
                alarm: match t {
                    1 => AlarmType::NoSpace,
                    _ => AlarmType::Corrupt,
                },
            })
            .collect()
    }
}
