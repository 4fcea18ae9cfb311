//! The reference the simulation checks the engine against: etcd's revision rules over a small
//! key space, written independently of the engine's code.
//!
//! State: every key's changes in revision order (so a Range at any past revision is a lookup),
//! the current and compaction revisions, the leases with their deadlines on the manual clock,
//! and the NOSPACE alarm. [`Model::apply`] runs one write and returns the reply etcd gives;
//! it is deterministic, so a write whose outcome the engine left unknown can be replayed on a
//! copy to get the state "with it" next to the state "without it".
//!
//! What it covers: Put (lease, prev_kv), DeleteRange (one key or an interval, prev_kv), Txn
//! with compares on version, create, mod, value and lease and branches of Range, Put and
//! single-key DeleteRange ops on distinct keys, Compact, LeaseGrant with an explicit id,
//! LeaseRevoke, expiry, keep-alive, and the NOSPACE gate of the filesystem guard (a write with
//! a cost is refused when the room above the reserve is below its cost, and the first refusal
//! raises the alarm). Not covered: nested txns, ignore_value/ignore_lease, sorting and the
//! revision filters of Range, watches, the quota registry.

use std::collections::BTreeMap;

use bytes::Bytes;
use kvd::{
    AlarmMember, AlarmResponse, AlarmType, CompactionRequest, CompactionResponse, Compare,
    CompareResult, CompareTarget, DeleteRangeRequest, DeleteRangeResponse, Error, KeyValue,
    LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeResponse, PutRequest, PutResponse,
    RangeRequest, RangeResponse, RequestOp, ResponseHeader, ResponseOp, TxnRequest, TxnResponse,
};

/// etcd's default minimum lease TTL, which the engine's default configuration keeps.
pub const LEASE_TTL_MIN_SECONDS: i64 = 2;
/// etcd's cost of a Put beyond its key and value, and of a LeaseGrant.
const PUT_OVERHEAD_BYTES: u64 = 256;
const LEASE_GRANT_COST_BYTES: u64 = 64;

/// A write the simulation sends, as plain data so it can be replayed on the model.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Put(PutRequest),
    Delete(DeleteRangeRequest),
    Txn(TxnRequest),
    Compact(CompactionRequest),
    Grant(LeaseGrantRequest),
    Revoke(i64),
    /// Deactivates the NOSPACE alarm of member 0 (etcd's disarm).
    Disarm,
}

/// The reply to an [`Op`].
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Put(PutResponse),
    Delete(DeleteRangeResponse),
    Txn(TxnResponse),
    Compact(CompactionResponse),
    Grant(LeaseGrantResponse),
    Revoke(LeaseRevokeResponse),
    Alarm(AlarmResponse),
}

/// What a write sees of the world besides the store: the clock and the free space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Env {
    /// The manual clock, in whole seconds.
    pub now: u64,
    /// Bytes free above the filesystem reserve when the write is applied.
    pub room: u64,
}

/// One lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The granted TTL after the minimum was applied.
    pub ttl: i64,
    /// When it expires, in whole seconds of the manual clock.
    pub deadline: u64,
}

/// The alarm member the engine raises NOSPACE as (`Config::member_id` 0).
pub const NOSPACE_MEMBER: AlarmMember = AlarmMember {
    member_id: 0,
    alarm: AlarmType::NoSpace,
};

/// The reference state.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    /// The current revision (1 on a fresh store).
    pub revision: i64,
    /// The compaction revision (-1 before the first compaction).
    pub compact: i64,
    /// Every key's changes in revision order: the main revision and the value from then on
    /// (`None`: deleted).
    history: BTreeMap<Bytes, Vec<(i64, Option<KeyValue>)>>,
    pub leases: BTreeMap<i64, Lease>,
    pub nospace: bool,
}

impl Model {
    /// Returns the state of a fresh store.
    pub fn new() -> Model {
        Model {
            revision: 1,
            compact: -1,
            history: BTreeMap::new(),
            leases: BTreeMap::new(),
            nospace: false,
        }
    }

    /// Returns `key`'s value at main revision `at`.
    pub fn kv_at(&self, key: &[u8], at: i64) -> Option<&KeyValue> {
        let changes = self.history.get(key)?;
        let newest = changes.partition_point(|(rev, _)| *rev <= at);
        changes[..newest].last().and_then(|(_, kv)| kv.as_ref())
    }

    /// Returns the keys alive at `at` in `[key, range_end)` (etcd's range forms), in order.
    fn live_in(&self, key: &[u8], range_end: &[u8], at: i64) -> Vec<&KeyValue> {
        let inside = |k: &[u8]| match range_end {
            [] => k == key,
            [0] => k >= key,
            end => k >= key && k < end,
        };
        self.history
            .keys()
            .filter(|k| inside(k))
            .filter_map(|k| self.kv_at(k, at))
            .collect()
    }

    /// Answers a standalone Range as etcd does: future revisions first, then compacted ones.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, Error> {
        if req.revision > self.revision {
            return Err(Error::FutureRevision);
        }
        let at = if req.revision <= 0 {
            self.revision
        } else {
            req.revision
        };
        if at < self.compact {
            return Err(Error::Compacted);
        }
        Ok(self.range_at(req, at, self.revision))
    }

    fn range_at(&self, req: &RangeRequest, at: i64, header: i64) -> RangeResponse {
        let live = self.live_in(&req.key, &req.range_end, at);
        let count = live.len() as i64;
        let mut kvs: Vec<KeyValue> = if req.count_only {
            Vec::new()
        } else {
            live.into_iter().cloned().collect()
        };
        let mut more = false;
        if req.limit > 0 && kvs.len() as i64 > req.limit {
            kvs.truncate(req.limit as usize);
            more = true;
        }
        if req.keys_only {
            for kv in &mut kvs {
                kv.value = Bytes::new();
            }
        }
        RangeResponse {
            header: ResponseHeader { revision: header },
            kvs,
            more,
            count,
        }
    }

    /// Returns every key alive at `at`, for whole-store comparisons.
    pub fn all_at(&self, at: i64) -> Vec<KeyValue> {
        self.live_in(b"\0", b"\0", at)
            .into_iter()
            .cloned()
            .collect()
    }

    /// Applies one write and returns etcd's reply; a refusal changes nothing except that the
    /// first NOSPACE refusal raises the alarm.
    pub fn apply(&mut self, op: &Op, env: Env) -> Result<Reply, Error> {
        match op {
            Op::Put(req) => {
                self.gate(put_cost(req), env.room)?;
                self.check_lease(req.lease)?;
                let prev = self.put_at(req, self.revision + 1);
                self.revision += 1;
                Ok(Reply::Put(PutResponse {
                    header: self.header(),
                    prev_kv: if req.prev_kv { prev } else { None },
                }))
            }
            Op::Delete(req) => {
                let main = self.revision + 1;
                let prev_kvs = self.delete_at(&req.key, &req.range_end, main);
                if !prev_kvs.is_empty() {
                    self.revision = main;
                }
                Ok(Reply::Delete(DeleteRangeResponse {
                    header: self.header(),
                    deleted: prev_kvs.len() as i64,
                    prev_kvs: if req.prev_kv { prev_kvs } else { Vec::new() },
                }))
            }
            Op::Txn(req) => self.txn(req, env).map(Reply::Txn),
            Op::Compact(req) => {
                if req.revision <= self.compact {
                    return Err(Error::Compacted);
                }
                if req.revision > self.revision {
                    return Err(Error::FutureRevision);
                }
                self.compact = req.revision;
                Ok(Reply::Compact(CompactionResponse {
                    header: self.header(),
                }))
            }
            Op::Grant(req) => {
                self.gate(LEASE_GRANT_COST_BYTES, env.room)?;
                if self.leases.contains_key(&req.id) {
                    return Err(Error::LeaseExists);
                }
                let ttl = req.ttl.max(LEASE_TTL_MIN_SECONDS);
                let deadline = env.now + ttl as u64;
                self.leases.insert(req.id, Lease { ttl, deadline });
                Ok(Reply::Grant(LeaseGrantResponse {
                    header: self.header(),
                    id: req.id,
                    ttl,
                }))
            }
            Op::Revoke(id) => self.revoke(*id).map(Reply::Revoke),
            Op::Disarm => {
                let was = std::mem::replace(&mut self.nospace, false);
                Ok(Reply::Alarm(AlarmResponse {
                    header: self.header(),
                    alarms: if was {
                        vec![NOSPACE_MEMBER]
                    } else {
                        Vec::new()
                    },
                }))
            }
        }
    }

    /// Answers a Txn whose every op reads: the engine serves it without the apply thread.
    pub fn read_only_txn(&self, req: &TxnRequest) -> TxnResponse {
        let mut copy = self.clone();
        let env = Env { now: 0, room: 0 };
        match copy.txn(req, env) {
            Ok(response) => response,
            Err(e) => unreachable!("a read-only txn at revision 0 is never refused: {e}"),
        }
    }

    fn header(&self) -> ResponseHeader {
        ResponseHeader {
            revision: self.revision,
        }
    }

    /// The space gate: cost-free writes pass; the others need the alarm down and room for
    /// their cost, and the first refusal raises the alarm.
    fn gate(&mut self, cost: u64, room: u64) -> Result<(), Error> {
        if cost == 0 {
            return Ok(());
        }
        if self.nospace {
            return Err(Error::NoSpace);
        }
        if room < cost {
            self.nospace = true;
            return Err(Error::NoSpace);
        }
        Ok(())
    }

    fn check_lease(&self, lease: i64) -> Result<(), Error> {
        if lease != 0 && !self.leases.contains_key(&lease) {
            return Err(Error::LeaseNotFound);
        }
        Ok(())
    }

    /// Writes `req` at main revision `main`; returns the previous value.
    fn put_at(&mut self, req: &PutRequest, main: i64) -> Option<KeyValue> {
        let prev = self.kv_at(&req.key, i64::MAX).cloned();
        let kv = KeyValue {
            key: req.key.clone(),
            create_revision: prev.as_ref().map_or(main, |p| p.create_revision),
            mod_revision: main,
            version: prev.as_ref().map_or(1, |p| p.version + 1),
            value: req.value.clone(),
            lease: req.lease,
        };
        self.history
            .entry(req.key.clone())
            .or_default()
            .push((main, Some(kv)));
        prev
    }

    /// Deletes the live keys of a range at `main`; returns their values, in key order.
    fn delete_at(&mut self, key: &[u8], range_end: &[u8], main: i64) -> Vec<KeyValue> {
        let doomed: Vec<KeyValue> = self
            .live_in(key, range_end, i64::MAX)
            .into_iter()
            .cloned()
            .collect();
        for kv in &doomed {
            if let Some(changes) = self.history.get_mut(&kv.key) {
                changes.push((main, None));
            }
        }
        doomed
    }

    fn revoke(&mut self, id: i64) -> Result<LeaseRevokeResponse, Error> {
        if !self.leases.contains_key(&id) {
            return Err(Error::LeaseNotFound);
        }
        let keys = self.lease_keys(id);
        let main = self.revision + 1;
        for key in &keys {
            self.delete_at(key, b"", main);
        }
        if !keys.is_empty() {
            self.revision = main;
        }
        self.leases.remove(&id);
        Ok(LeaseRevokeResponse {
            header: self.header(),
        })
    }

    /// Returns the keys attached to lease `id`: the live keys whose last Put named it.
    pub fn lease_keys(&self, id: i64) -> Vec<Bytes> {
        self.all_at(i64::MAX)
            .into_iter()
            .filter(|kv| kv.lease == id)
            .map(|kv| kv.key)
            .collect()
    }

    fn txn(&mut self, req: &TxnRequest, env: Env) -> Result<TxnResponse, Error> {
        let read_only = req
            .success
            .iter()
            .chain(&req.failure)
            .all(|op| matches!(op, RequestOp::Range(_)));
        if !read_only {
            self.gate(txn_cost(req), env.room)?;
        }
        let begin = self.revision;
        let succeeded = req.compare.iter().all(|c| self.holds(c, begin));
        let branch = if succeeded {
            &req.success
        } else {
            &req.failure
        };
        for op in branch {
            if let RequestOp::Put(p) = op {
                self.check_lease(p.lease)?;
            }
        }
        let main = begin + 1;
        let mut changed = false;
        let mut responses = Vec::with_capacity(branch.len());
        for op in branch {
            let view = if changed { main } else { begin };
            responses.push(match op {
                RequestOp::Range(r) => ResponseOp::Range(self.range_at(r, view, view)),
                RequestOp::Put(p) => {
                    let prev = self.put_at(p, main);
                    changed = true;
                    ResponseOp::Put(PutResponse {
                        header: ResponseHeader { revision: main },
                        prev_kv: if p.prev_kv { prev } else { None },
                    })
                }
                RequestOp::DeleteRange(d) => {
                    let prev_kvs = self.delete_at(&d.key, &d.range_end, main);
                    changed |= !prev_kvs.is_empty();
                    ResponseOp::DeleteRange(DeleteRangeResponse {
                        header: ResponseHeader {
                            revision: if changed { main } else { begin },
                        },
                        deleted: prev_kvs.len() as i64,
                        prev_kvs: if d.prev_kv { prev_kvs } else { Vec::new() },
                    })
                }
                RequestOp::Txn(_) => unreachable!("the simulation sends no nested txn"),
            });
        }
        if changed {
            self.revision = main;
        }
        Ok(TxnResponse {
            header: self.header(),
            succeeded,
            responses,
        })
    }

    /// Evaluates one compare at `at`: a missing key compares as the all-zero key-value,
    /// except that a value compare on it fails (etcd).
    fn holds(&self, compare: &Compare, at: i64) -> bool {
        let zero = KeyValue::default();
        let kv = match self.kv_at(&compare.key, at) {
            Some(kv) => kv,
            None if matches!(compare.target, CompareTarget::Value(_)) => return false,
            None => &zero,
        };
        let ordering = match &compare.target {
            CompareTarget::Version(v) => kv.version.cmp(v),
            CompareTarget::Create(v) => kv.create_revision.cmp(v),
            CompareTarget::Mod(v) => kv.mod_revision.cmp(v),
            CompareTarget::Value(v) => kv.value.cmp(v),
            CompareTarget::Lease(v) => kv.lease.cmp(v),
        };
        match compare.result {
            CompareResult::Equal => ordering.is_eq(),
            CompareResult::NotEqual => ordering.is_ne(),
            CompareResult::Greater => ordering.is_gt(),
            CompareResult::Less => ordering.is_lt(),
        }
    }

    /// Revokes every lease whose deadline is at or before `now`, soonest first (ties by id),
    /// as the engine's expiry does; returns their ids.
    pub fn expire(&mut self, now: u64) -> Vec<i64> {
        let mut due: Vec<(u64, i64)> = self
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(id, l)| (l.deadline, *id))
            .collect();
        due.sort_unstable();
        for (_, id) in &due {
            if let Err(e) = self.revoke(*id) {
                unreachable!("revoking a lease the model holds: {e}");
            }
        }
        due.into_iter().map(|(_, id)| id).collect()
    }

    /// Renews lease `id` to its full TTL; returns the TTL, or 0 if it does not exist.
    pub fn keep_alive(&mut self, id: i64, now: u64) -> i64 {
        match self.leases.get_mut(&id) {
            Some(lease) if lease.deadline > now => {
                lease.deadline = now + lease.ttl as u64;
                lease.ttl
            }
            _ => 0,
        }
    }

    /// What a reopen does to the state: every lease gets its full TTL from now (deadlines are
    /// memory only).
    pub fn reopened(&mut self, now: u64) {
        for lease in self.leases.values_mut() {
            lease.deadline = now + lease.ttl as u64;
        }
    }
}

/// etcd's cost of a Put: its key and value plus a fixed overhead.
pub fn put_cost(req: &PutRequest) -> u64 {
    PUT_OVERHEAD_BYTES + req.key.len() as u64 + req.value.len() as u64
}

/// etcd's cost of a Txn: the larger of its branches' Put costs.
pub fn txn_cost(req: &TxnRequest) -> u64 {
    let branch = |ops: &[RequestOp]| -> u64 {
        ops.iter()
            .map(|op| match op {
                RequestOp::Put(p) => put_cost(p),
                _ => 0,
            })
            .sum()
    };
    branch(&req.success).max(branch(&req.failure))
}

/// Returns the cost the space gate checks for `op`.
pub fn op_cost(op: &Op) -> u64 {
    match op {
        Op::Put(p) => put_cost(p),
        Op::Txn(t) => txn_cost(t),
        Op::Grant(_) => LEASE_GRANT_COST_BYTES,
        Op::Delete(_) | Op::Compact(_) | Op::Revoke(_) | Op::Disarm => 0,
    }
}

#[test]
fn model_follows_etcds_revision_rules() {
    let env = Env {
        now: 0,
        room: u64::MAX,
    };
    let mut m = Model::new();
    let put = |k: &str, v: &str| Op::Put(PutRequest::new(k.to_owned(), v.to_owned()));
    m.apply(&put("a", "1"), env).unwrap();
    m.apply(&put("a", "2"), env).unwrap();
    m.apply(&put("b", "1"), env).unwrap();
    let a = m.kv_at(b"a", 4).unwrap();
    assert_eq!((a.create_revision, a.mod_revision, a.version), (2, 3, 2));
    assert_eq!(m.kv_at(b"a", 2).unwrap().value, "1");
    // A delete of nothing keeps the revision; a txn is one revision for all its writes.
    m.apply(&Op::Delete(DeleteRangeRequest::key("zz")), env)
        .unwrap();
    assert_eq!(m.revision, 4);
    let txn = TxnRequest {
        compare: vec![Compare::new(
            "a",
            CompareResult::Equal,
            CompareTarget::Version(2),
        )],
        success: vec![
            RequestOp::Put(PutRequest::new("c", "1")),
            RequestOp::DeleteRange(DeleteRangeRequest::key("b")),
            RequestOp::Range(RangeRequest::key("c")),
        ],
        failure: vec![],
    };
    let Reply::Txn(t) = m.apply(&Op::Txn(txn), env).unwrap() else {
        unreachable!()
    };
    assert!(t.succeeded);
    assert_eq!((t.header.revision, m.revision), (5, 5));
    let ResponseOp::Range(seen) = &t.responses[2] else {
        unreachable!()
    };
    assert_eq!(seen.count, 1, "a txn's range sees its own put");
    // Compaction: reads below fail, reads at it work; no space raises the alarm once.
    m.apply(
        &Op::Compact(CompactionRequest {
            revision: 4,
            physical: true,
        }),
        env,
    )
    .unwrap();
    let old = RangeRequest {
        revision: 3,
        ..RangeRequest::key("a")
    };
    assert_eq!(m.range(&old), Err(Error::Compacted));
    assert_eq!(
        m.range(&RangeRequest {
            revision: 4,
            ..RangeRequest::key("b")
        })
        .unwrap()
        .count,
        1
    );
    let tight = Env { now: 0, room: 10 };
    assert_eq!(m.apply(&put("d", "1"), tight), Err(Error::NoSpace));
    assert!(m.nospace);
    assert_eq!(m.apply(&put("d", "1"), env), Err(Error::NoSpace), "latched");
    m.apply(&Op::Delete(DeleteRangeRequest::key("a")), env)
        .unwrap();
    // Leases: keys go with their lease in one revision; expiry is soonest first.
    m.apply(&Op::Disarm, env).unwrap();
    m.apply(&Op::Grant(LeaseGrantRequest { ttl: 1, id: 9 }), env)
        .unwrap();
    assert_eq!(m.leases[&9].ttl, LEASE_TTL_MIN_SECONDS);
    let leased = PutRequest {
        lease: 9,
        ..PutRequest::new("e", "1")
    };
    m.apply(&Op::Put(leased.clone()), env).unwrap();
    m.apply(
        &Op::Put(PutRequest {
            key: "f".into(),
            ..leased
        }),
        env,
    )
    .unwrap();
    let before = m.revision;
    assert_eq!(m.expire(2), vec![9]);
    assert_eq!(m.revision, before + 1);
    assert!(m.kv_at(b"e", i64::MAX).is_none() && m.kv_at(b"f", i64::MAX).is_none());
}
