//! Random operation sequences, from a seed ([`generate`]) or from fuzzer bytes ([`decode`]).
//!
//! Both drive the same [`Builder`], which keeps a model alongside so that it can aim
//! revisions at interesting places (just compacted, current, future), name leases that exist
//! (and now and then ones that do not), and skip the txns whose outcome etcd leaves
//! undefined. The key space is small so that keys collide; a few keys hold 0x00 and 0xFF
//! bytes, and empty keys, oversized txns and oversized values show up now and then to
//! exercise the errors. Lease ids come from a small pool so that grants collide and Puts can
//! name them; a grant of id 0 lets the engine choose, and since the generator cannot know
//! that id, later operations never name it. Clock steps (a quarter second to a minute) let
//! short leases expire; watches start anywhere (compacted, at the compaction revision, in
//! the past, now, in the future, negative) on a key, a prefix, everything or an arbitrary
//! (possibly empty) range. Now and then a burst of writes makes a lazily read watch fall
//! behind (see [`Builder::burst`]). The n-th op of a seed does not depend on the sequence
//! length, so a failure at op i replays with `i + 1` ops.
//!
//! Space: three sequences in eight run under a small space quota (384 KiB to 1 MiB), with
//! values of up to 24 KiB and now and then one of half the quota (which can never fit), and
//! more deletes, compactions, defrags, measurements and NOSPACE disarms; one in eight runs
//! with the quota disabled. Every sequence has short episodes where the free space the
//! filesystem guard reads sits just above its reserve, and rarer ones under a CORRUPT alarm.
//!
//! Quota: keys under `/a/`, `/a/b/`, `/x/`, `/t/` ... fall in the namespaces of the roles the
//! registry requests name (`a`, `a/b`, `a/b/c`, `x`, `x/y`, `t`, `*`, and invalid names now
//! and then); UPDATE_QUOTA sets small `kv_keys`, `kv_bytes` and `cpus` limits and `cpus`
//! guarantees (sometimes above the limit, sometimes forced), agents come and go, and
//! reservations and allocations of cpus and mem are made and removed on them.
//!
//! The prepare queue: every sequence has a small `prepare_queue_length` (4 to 16), and now
//! and then a queue burst ([`Builder::queue_burst`]) submits a few to a few dozen Puts of new
//! keys of one to three roles while nothing is answered, so that roles reach their share
//! and the queue its bound. Not in small-quota sequences, where a Put of the burst could be
//! refused for space.

use std::time::Duration;

use std::collections::BTreeMap;

use bytes::Bytes;
use kvd::quota::RawQuotaConfig;
use kvd::{
    AgentState, AlarmAction, AlarmRequest, AlarmType, CompactionRequest, Compare, CompareResult,
    CompareTarget, DeleteRangeRequest, LeaseGrantRequest, PutRequest, RangeRequest, RequestOp,
    SortOrder, SortTarget, TxnRequest, WatchCreateRequest, prefix_end,
};

use super::ops::{Op, QuotaOp, Seq, StreamKind};
use super::rng::{ByteSource, Source, SplitMix64};
use super::space;
use super::state::{FREE_SPACE_PLENTY_BYTES, Limits, Model};

/// The key space.
pub const KEYS: &[&[u8]] = &[
    b"\x00",
    b"a",
    b"a/b",
    b"a/c",
    b"a\xff",
    b"b",
    b"k0",
    b"k1",
    b"k2",
    b"k3",
    b"k4",
    b"k5",
    b"k6",
    b"k7",
    b"k8",
    b"\xff",
    b"\xff\xff",
    b"/",
    b"/a/1",
    b"/a/b",
    b"/a/b/1",
    b"/a/b/c/1",
    b"/ab/1",
    b"/x/1",
    b"/x/y/1",
    b"/t/1",
    b"/t/2",
];

/// Range ends that are not keys.
const ENDS: &[&[u8]] = &[
    b"k",
    b"k5",
    b"z",
    b"\xff",
    b"\x00\x00",
    b"a0",
    b"/b",
    b"/a/c",
];

/// Roles the registry and record requests name (valid ones).
const ROLES: &[&str] = &["a", "a/b", "a/b/c", "x", "x/y", "t", "*"];

/// Invalid role names, one per Mesos rule.
const BAD_ROLES: &[&str] = &["", "/a", "a/", "a//b", "a b", "-x", "a/./b", "x/*"];

/// Agents records name ("nowhere" is never registered).
const AGENTS: &[&str] = &["ag1", "ag2", "ag3", "nowhere"];

/// The small space quotas of space sequences.
const SMALL_QUOTAS_BYTES: &[i64] = &[384 << 10, 768 << 10, 1 << 20];

/// Value lengths of space sequences' big values.
const BIG_VALUE_BYTES: &[usize] = &[1 << 10, 4 << 10, 8 << 10, 16 << 10, 24 << 10];

const VALUES: &[&[u8]] = &[b"", b"v0", b"v1", b"v2", b"v10", b"x", b"\x00", b"\xff"];

/// Lease ids that grants ask for and operations name (granted or not at the time).
const LEASES: &[i64] = &[1, 2, 3, 7, 1 << 40, i64::MAX, -1];

/// Lease TTLs asked for: below the minimum (raised to 2 s), short ones that the clock
/// overtakes, long ones, the maximum and just above it.
const TTLS: &[i64] = &[-5, 0, 1, 2, 3, 4, 5, 8, 10, 30, 100, 9_000_000_000];

/// Clock steps, in milliseconds: fractions of a second test TTL truncation.
const CLOCK_STEPS_MS: &[u64] = &[250, 1_000, 1_500, 2_000, 3_000, 5_000, 10_000, 60_000];

/// Key groups of queue bursts: the namespaces of each group's roles (`""` for keys of no
/// role's namespace, which belong to `*`). Roles of different groups share no ancestor, so
/// the limits that decide a burst Put's answer see only the Puts of its own role.
const BURST_GROUPS: &[&[&str]] = &[&["a", "a/b", "a/b/c"], &["x", "x/y"], &["t"], &[""]];

/// Clock steps (whole seconds) tried before a queue burst whose shares are uncertain; 11 s
/// always makes every earlier admission older than the 10 to 11 s the engine may count.
const BURST_CLOCK_STEPS_S: &[u64] = &[1, 2, 3, 5, 8, 11];

/// The longest sequence [`decode`] produces.
pub const MAX_DECODED_OPS: usize = 256;

/// Returns the first `ops` operations of the sequence of `seed`.
pub fn generate(seed: u64, ops: usize) -> Seq {
    let mut rng = SplitMix64::new(seed);
    let limits = pick_limits(&mut rng);
    let mut b = Builder::new(rng, limits);
    while b.ops.len() < ops {
        b.step();
    }
    // A burst may have gone past the length asked for.
    b.ops.truncate(ops);
    Seq {
        label: format!("seed {seed}"),
        limits,
        ops: b.ops,
    }
}

/// Decodes arbitrary bytes into a valid sequence of at most [`MAX_DECODED_OPS`] operations
/// (total: every input decodes; the empty input gives an empty sequence).
pub fn decode(bytes: &[u8]) -> Seq {
    let mut src = ByteSource::new(bytes);
    let limits = pick_limits(&mut src);
    let mut b = Builder::new(src, limits);
    while !b.src.exhausted() && b.ops.len() < MAX_DECODED_OPS {
        b.step();
    }
    b.ops.truncate(MAX_DECODED_OPS);
    Seq {
        label: format!("decoded from {} bytes", bytes.len()),
        limits,
        ops: b.ops,
    }
}

/// Default limits half the time; otherwise small ones, so that oversized txns and requests
/// are cheap to build. Then the space quota: etcd's default half the time, disabled one time
/// in eight, else small (with the default request limit, so big values get to the quota).
fn pick_limits(src: &mut impl Source) -> Limits {
    let mut limits = match src.below(8) {
        0..=3 => Limits::default(),
        choice => Limits {
            max_txn_ops: 3 + src.below(6) as usize,
            max_request_bytes: [1024, 2048, 4096, 1_572_864][choice as usize - 4],
            ..Limits::default()
        },
    };
    limits.quota_backend_bytes = match src.below(8) {
        0..=3 => 0,
        4 => -1,
        _ => {
            limits.max_request_bytes = Limits::default().max_request_bytes;
            SMALL_QUOTAS_BYTES[src.below(SMALL_QUOTAS_BYTES.len() as u64) as usize]
        }
    };
    limits.prepare_queue_length = 4 + src.below(13) as usize;
    limits
}

/// What a step of the generator makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Put,
    Delete,
    Once,
    Txn,
    Range,
    Burst,
    QueueBurst,
    Settle,
    Compact,
    Reopen,
    HashKv,
    Grant,
    Revoke,
    KeepAlive,
    TimeToLive,
    Leases,
    Clock,
    Watch,
    Quota,
    Alarm,
    Defrag,
    Measure,
    FreeSpaceEpisode,
    CorruptEpisode,
    NospaceEpisode,
}

/// Weights of each kind per 1024 steps: (kind, ordinary sequence, small-quota sequence).
const MIX: &[(Kind, u64, u64)] = &[
    (Kind::Put, 226, 250),
    (Kind::Delete, 76, 110),
    (Kind::Once, 40, 30),
    (Kind::Txn, 184, 120),
    (Kind::Range, 170, 95),
    (Kind::Burst, 2, 1),
    (Kind::QueueBurst, 10, 0),
    (Kind::Settle, 2, 2),
    (Kind::Compact, 40, 60),
    (Kind::Reopen, 4, 6),
    (Kind::HashKv, 36, 20),
    (Kind::Grant, 50, 30),
    (Kind::Revoke, 20, 15),
    (Kind::KeepAlive, 18, 10),
    (Kind::TimeToLive, 18, 10),
    (Kind::Leases, 8, 5),
    (Kind::Clock, 32, 20),
    (Kind::Watch, 44, 25),
    (Kind::Quota, 64, 50),
    (Kind::Alarm, 8, 50),
    (Kind::Defrag, 3, 12),
    (Kind::Measure, 14, 75),
    (Kind::FreeSpaceEpisode, 3, 4),
    (Kind::CorruptEpisode, 2, 2),
    (Kind::NospaceEpisode, 2, 2),
];

/// Builds operations from an entropy source, keeping a model to know the revisions.
struct Builder<S: Source> {
    src: S,
    model: Model,
    ops: Vec<Op>,
    /// Keys made so far for queue bursts (each burst key is new).
    burst_keys: usize,
}

impl<S: Source> Builder<S> {
    fn new(src: S, limits: Limits) -> Builder<S> {
        Builder {
            src,
            model: Model::new(limits),
            ops: Vec::new(),
            burst_keys: 0,
        }
    }

    /// True for a sequence under a small space quota.
    fn small_quota(&self) -> bool {
        self.model.limits().quota_backend_bytes > 0
    }

    /// Draws the kind of the next step from [`MIX`].
    fn kind(&mut self) -> Kind {
        let small = self.small_quota();
        let weight =
            |&(_, ordinary, spaced): &(Kind, u64, u64)| if small { spaced } else { ordinary };
        let total: u64 = MIX.iter().map(weight).sum();
        let mut draw = self.src.below(total);
        for entry in MIX {
            if draw < weight(entry) {
                return entry.0;
            }
            draw -= weight(entry);
        }
        Kind::Range
    }

    /// Appends one operation (or none, if the drawn txn has an undefined outcome), or now
    /// and then a burst or an episode of several.
    fn step(&mut self) {
        match self.kind() {
            Kind::Burst => self.burst(),
            Kind::QueueBurst => {
                self.queue_burst();
                if self.chance(30) {
                    // Another one at once, while the first one's roles are still active.
                    self.queue_burst();
                }
            }
            Kind::FreeSpaceEpisode => self.free_space_episode(),
            Kind::CorruptEpisode => self.corrupt_episode(),
            Kind::NospaceEpisode => self.nospace_episode(),
            Kind::Measure => {
                self.emit(Op::MeasureSpace);
                // Often a write right after: the model then knows whether it must fit.
                if self.chance(60) {
                    let op = Op::Put(self.put());
                    self.emit(op);
                }
            }
            kind => {
                let op = self.plain(kind);
                self.emit(op);
            }
        }
    }

    /// One operation of a kind that is a single operation.
    fn plain(&mut self, kind: Kind) -> Op {
        match kind {
            Kind::Put => Op::Put(self.put()),
            Kind::Delete => Op::DeleteRange(self.delete()),
            Kind::Once => self.once(),
            Kind::Txn => {
                let budget = self.model.limits().max_txn_ops;
                Op::Txn(self.txn(0, budget))
            }
            Kind::Compact => Op::Compact(self.compact()),
            Kind::Reopen => Op::Reopen,
            Kind::HashKv => Op::HashKv(self.hash_revision()),
            Kind::Grant => Op::LeaseGrant(self.lease_grant()),
            Kind::Revoke => Op::LeaseRevoke(self.lease_id()),
            Kind::KeepAlive => Op::LeaseKeepAlive(self.lease_id()),
            Kind::TimeToLive => Op::LeaseTimeToLive {
                id: self.lease_id(),
                keys: self.chance(70),
            },
            Kind::Leases => Op::LeaseLeases,
            Kind::Clock => Op::AdvanceClock(Duration::from_millis(self.pick(CLOCK_STEPS_MS))),
            Kind::Watch => self.watch(),
            Kind::Settle => Op::SettleWatches,
            Kind::Quota => Op::Quota(self.quota()),
            Kind::Alarm => Op::Alarm(self.alarm()),
            Kind::Defrag => Op::Defrag,
            Kind::Range
            | Kind::Burst
            | Kind::QueueBurst
            | Kind::Measure
            | Kind::FreeSpaceEpisode
            | Kind::CorruptEpisode
            | Kind::NospaceEpisode => Op::Range(self.range(true)),
        }
    }

    /// The free space sits just above (or below) the filesystem reserve for a few operations:
    /// writes whose cost does not fit are refused with NOSPACE, which also latches; then the
    /// space comes back and NOSPACE is cleared.
    fn free_space_episode(&mut self) {
        let reserve = space::fs_reserve(self.model.space_quota());
        let tight = match self.below(5) {
            0 => reserve.saturating_sub(1),
            1 => reserve + 64,
            2 => reserve + 300,
            3 => reserve + 2_000,
            _ => reserve + 20_000,
        };
        self.emit(Op::SetFreeSpace(Some(tight)));
        for _ in 0..1 + self.below(4) {
            let op = match self.below(4) {
                0 => Op::LeaseGrant(self.lease_grant()),
                1 => Op::DeleteRange(self.delete()),
                _ => Op::Put(self.put()),
            };
            self.emit(op);
        }
        let after = if self.chance(15) {
            None
        } else {
            Some(FREE_SPACE_PLENTY_BYTES)
        };
        self.emit(Op::SetFreeSpace(after));
        self.emit(Op::Alarm(disarm(0)));
    }

    /// An operator raises NOSPACE (for the engine's member or another) for a few operations,
    /// then clears it.
    fn nospace_episode(&mut self) {
        let member_id = self.pick(&[0, 9]);
        self.emit(Op::Alarm(AlarmRequest {
            action: AlarmAction::Activate,
            member_id,
            alarm: AlarmType::NoSpace,
        }));
        for _ in 0..1 + self.below(4) {
            let kind = self.pick(&[
                Kind::Put,
                Kind::Txn,
                Kind::Delete,
                Kind::Grant,
                Kind::Compact,
            ]);
            let op = self.plain(kind);
            self.emit(op);
        }
        self.emit(Op::Alarm(disarm(member_id)));
    }

    /// Under CORRUPT for a few operations: every write is refused (registry and records
    /// included), reads, alarms and defrag work; then the alarm is cleared.
    fn corrupt_episode(&mut self) {
        let raise = AlarmRequest {
            action: AlarmAction::Activate,
            member_id: 3,
            alarm: AlarmType::Corrupt,
        };
        self.emit(Op::Alarm(raise));
        for _ in 0..2 + self.below(5) {
            let kind = self.pick(&[
                Kind::Put,
                Kind::Delete,
                Kind::Txn,
                Kind::Range,
                Kind::Compact,
                Kind::Grant,
                Kind::Revoke,
                Kind::KeepAlive,
                Kind::Quota,
                Kind::Alarm,
                Kind::Defrag,
                Kind::HashKv,
                Kind::Reopen,
            ]);
            let op = self.plain(kind);
            self.emit(op);
        }
        self.emit(Op::Alarm(AlarmRequest {
            action: AlarmAction::Deactivate,
            ..raise
        }));
    }

    /// An Alarm request: mostly the disarm of the engine's NOSPACE; an operator's NOSPACE
    /// for another member and its disarm; Gets; unknown and NONE pairs.
    fn alarm(&mut self) -> AlarmRequest {
        let filter = self.pick(&[AlarmType::None, AlarmType::NoSpace, AlarmType::Corrupt]);
        match self.below(12) {
            0..=5 => disarm(0),
            6 | 7 => AlarmRequest {
                action: AlarmAction::Get,
                member_id: 0,
                alarm: filter,
            },
            8 | 9 => disarm(9),
            10 => AlarmRequest {
                action: self.pick(&[AlarmAction::Activate, AlarmAction::Deactivate]),
                member_id: 4,
                alarm: AlarmType::None,
            },
            _ => AlarmRequest {
                action: AlarmAction::Deactivate,
                member_id: 4,
                alarm: AlarmType::Corrupt,
            },
        }
    }

    /// A registry or record request.
    fn quota(&mut self) -> QuotaOp {
        match self.below(100) {
            0..=37 => self.update_quota(),
            38..=45 => QuotaOp::RegisterAgent {
                id: if self.chance(4) {
                    String::new()
                } else {
                    self.pick(&AGENTS[..3]).to_owned()
                },
                state: match self.below(10) {
                    0 => AgentState::Unreachable,
                    1 => AgentState::Gone,
                    _ => AgentState::Registered,
                },
                resources: self.amounts(40, 8192),
            },
            46..=63 => QuotaOp::Reserve {
                id: self.record_id('r'),
                role: self.record_role(),
                agent: self.pick(AGENTS).to_owned(),
                resources: self.amounts(8, 1024),
            },
            64..=81 => QuotaOp::Allocate {
                id: self.record_id('x'),
                role: self.record_role(),
                agent: self.pick(AGENTS).to_owned(),
                resources: self.amounts(8, 1024),
            },
            82..=89 => QuotaOp::Unreserve(self.record_id('r')),
            90..=96 => QuotaOp::Release(self.record_id('x')),
            _ => QuotaOp::Repair,
        }
    }

    /// `prefix` and a digit, from a small pool so that ids collide; now and then empty.
    fn record_id(&mut self, prefix: char) -> String {
        if self.chance(2) {
            return String::new();
        }
        format!("{prefix}{}", self.below(6))
    }

    /// A role for a record: mostly a valid one (`*` included, which records refuse).
    fn record_role(&mut self) -> String {
        if self.chance(6) {
            self.pick(BAD_ROLES).to_owned()
        } else {
            self.pick(ROLES).to_owned()
        }
    }

    /// cpus (up to `cpus` whole or half units) and sometimes mem; now and then a negative
    /// value, which is refused.
    fn amounts(&mut self, cpus: usize, mem: usize) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        if self.chance(85) {
            out.insert("cpus".to_owned(), self.below(2 * cpus + 1) as f64 / 2.0);
        }
        if self.chance(35) {
            out.insert("mem".to_owned(), self.below(mem + 1) as f64);
        }
        if self.chance(3) {
            out.insert("cpus".to_owned(), -1.0);
        }
        out
    }

    /// An UPDATE_QUOTA: one configuration (now and then two, or none), each a reset to the
    /// default quota or small limits and guarantees.
    fn update_quota(&mut self) -> QuotaOp {
        let count = match self.below(20) {
            0 => 0,
            1..=3 => 2,
            _ => 1,
        };
        let configs = (0..count).map(|_| self.quota_config()).collect();
        QuotaOp::UpdateQuota {
            configs,
            force: self.chance(30),
        }
    }

    fn quota_config(&mut self) -> RawQuotaConfig {
        let role = if self.chance(5) {
            self.pick(BAD_ROLES).to_owned()
        } else {
            self.pick(ROLES).to_owned()
        };
        let mut config = RawQuotaConfig {
            role,
            ..RawQuotaConfig::default()
        };
        if self.chance(20) {
            return config;
        }
        if self.chance(45) {
            config
                .limits
                .insert("kv_keys".to_owned(), self.below(7) as f64);
        }
        if self.chance(30) {
            let bytes = 300 + 300 * self.below(20);
            config.limits.insert("kv_bytes".to_owned(), bytes as f64);
        }
        if self.chance(30) {
            config
                .limits
                .insert("cpus".to_owned(), self.below(21) as f64 / 2.0);
        }
        if self.chance(25) {
            config
                .guarantees
                .insert("cpus".to_owned(), self.below(13) as f64 / 2.0);
        }
        if self.chance(5) {
            config.guarantees.insert("mem".to_owned(), 64.0);
        }
        config
    }

    /// Appends `op` unless its outcome is undefined.
    /// A Put or DeleteRange with one of a few operation ids: often a retry of the write
    /// the id was first used for, sometimes another write under a used id.
    fn once(&mut self) -> Op {
        let id = format!("op{}", self.below(6));
        let op = match self.model.recorded_operation(&id) {
            Some(first) if self.chance(60) => first,
            _ if self.chance(70) => Op::Put(self.put()),
            _ => Op::DeleteRange(self.delete()),
        };
        Op::Once {
            id,
            op: Box::new(op),
        }
    }

    fn emit(&mut self, op: Op) {
        self.model.apply(&op);
        self.ops.push(op);
    }

    /// A lazy watch on a wide range, then 128 to 191 Puts: more responses than a watch may
    /// hold undelivered (128, WATCH-3), so the watch falls behind and must catch up from the
    /// history once read. Then either the harness settles the watches (the catch-up must
    /// lose nothing) or a compaction passes the watch's next revision first (it must be
    /// canceled after a correct prefix).
    fn burst(&mut self) {
        let (key, range_end) = match self.below(3) {
            0 => (Bytes::new(), Bytes::from_static(b"\0")),
            1 => (Bytes::from_static(b"a"), Bytes::from_static(b"\xff")),
            _ => (Bytes::from_static(b"k"), Bytes::from_static(b"l")),
        };
        let compact = self.model.compact_revision();
        let start_revision = if self.chance(50) { 0 } else { compact.max(1) };
        let req = WatchCreateRequest {
            key,
            range_end,
            start_revision,
            prev_kv: self.chance(50),
            ..WatchCreateRequest::default()
        };
        self.emit(Op::Watch {
            stream: StreamKind::Lazy,
            req,
        });
        for _ in 0..128 + self.below(64) {
            let key = Bytes::from_static(self.pick(&KEYS[1..]));
            let put = PutRequest::new(key, Bytes::from_static(self.pick(VALUES)));
            self.emit(Op::Put(put));
        }
        if self.chance(50) {
            self.emit(Op::SettleWatches);
        } else {
            let revision = self.model.current_revision() - self.below(8) as i64;
            let physical = self.chance(50);
            self.emit(Op::Compact(CompactionRequest { revision, physical }));
        }
    }

    /// A queue burst: Puts of new keys of one to three roles from different
    /// [`BURST_GROUPS`], interleaved at random or one role after the other; a few (mostly
    /// all admitted) or half the queue per role and up to the queue's length more (past
    /// the shares, and with several roles past the bound), now and then after a quiet spell in
    /// which every role went idle. If a role's last admission is 10 to 11 s old, the clock
    /// first moves past that second; a burst whose answers could still depend on timing is
    /// not emitted.
    fn queue_burst(&mut self) {
        if self.small_quota() {
            return;
        }
        let capacity = self.model.limits().prepare_queue_length;
        let wanted = match self.below(10) {
            0..=4 => 1,
            5..=7 => 2,
            _ => 3,
        };
        let mut groups: Vec<usize> = (0..BURST_GROUPS.len()).collect();
        let mut prefixes = Vec::new();
        for _ in 0..wanted {
            let group = groups.remove(self.below(groups.len()));
            prefixes.push(self.pick(BURST_GROUPS[group]));
        }
        let count = match self.below(4) {
            0 => 2 + self.below(capacity / 2),
            _ => capacity / 2 * wanted + self.below(capacity + 1),
        };
        let mut chosen: Vec<&str> = (0..count).map(|_| self.pick(&prefixes)).collect();
        if self.chance(50) {
            // One role after the other: each later role finds the earlier ones' slots taken,
            // and the third may find the queue full.
            chosen.sort_by_key(|p| prefixes.iter().position(|q| q == p));
        }
        let puts: Vec<PutRequest> = chosen
            .into_iter()
            .map(|prefix| {
                self.burst_keys += 1;
                let key = if prefix.is_empty() {
                    format!("q{}", self.burst_keys)
                } else {
                    format!("/{prefix}/q{}", self.burst_keys)
                };
                PutRequest::new(key, Bytes::from_static(b"q"))
            })
            .collect();
        if self.chance(40) {
            // A quiet spell first: every role is idle, so the first role alone gets half.
            let quiet = Duration::from_secs(11 + self.below(20) as u64);
            self.emit(Op::AdvanceClock(quiet));
        }
        if self.model.burst_unpredictable(&puts).is_some() {
            let step = BURST_CLOCK_STEPS_S.iter().copied().find(|s| {
                let mut later = self.model.clone();
                later.advance_clock(Duration::from_secs(*s));
                later.burst_unpredictable(&puts).is_none()
            });
            let Some(step) = step else { return };
            self.emit(Op::AdvanceClock(Duration::from_secs(step)));
        }
        self.emit(Op::QueueBurst(puts));
    }

    fn below(&mut self, n: usize) -> usize {
        self.src.below(n as u64) as usize
    }

    /// True with `percent`% probability. A zero draw (what an exhausted byte source gives)
    /// is false, so fuzz inputs that run out end in ordinary ops.
    fn chance(&mut self, percent: u64) -> bool {
        self.src.below(100) >= 100 - percent.min(100)
    }

    fn pick<T: Copy>(&mut self, choices: &[T]) -> T {
        choices[self.below(choices.len())]
    }

    fn key(&mut self, empty_percent: u64) -> Bytes {
        if self.chance(empty_percent) {
            return Bytes::new();
        }
        Bytes::from_static(self.pick(KEYS))
    }

    /// A key not in `used`, most of the time, to keep DuplicateKey errors occasional.
    fn fresh_key(&mut self, used: &[Bytes]) -> Bytes {
        let mut key = self.key(1);
        for _ in 0..4 {
            if !used.contains(&key) {
                break;
            }
            key = self.key(1);
        }
        key
    }

    fn range_end(&mut self, key: &Bytes) -> Bytes {
        match self.below(10) {
            0..=3 => Bytes::new(),
            4 => Bytes::from_static(b"\0"),
            5 | 6 => prefix_end(key),
            7 | 8 => Bytes::from_static(self.pick(KEYS)),
            _ => Bytes::from_static(self.pick(ENDS)),
        }
    }

    fn value(&mut self) -> Bytes {
        if self.small_quota() {
            if self.below(600) == 0 {
                // Half the quota: twice its cost can never fit.
                let half = self.model.limits().quota_backend_bytes as usize / 2;
                return Bytes::from(vec![b'H'; half]);
            }
            if self.chance(30) {
                let len = self.pick(BIG_VALUE_BYTES) + self.below(512);
                return Bytes::from(vec![b'B'; len]);
            }
        }
        let max = self.model.limits().max_request_bytes;
        // Values around the request-size limit: common with small limits, rare with 1.5 MiB.
        let near_limit = if max <= 4096 {
            self.chance(4)
        } else {
            self.below(1000) == 999
        };
        if near_limit {
            let len = max - 48 + self.below(64);
            return Bytes::from(vec![b'L'; len]);
        }
        if self.chance(80) {
            return Bytes::from_static(self.pick(VALUES));
        }
        let len = self.below(6);
        (0..len)
            .map(|_| self.pick(&[b'a', b'b', 0, 0xff]))
            .collect::<Vec<u8>>()
            .into()
    }

    /// A revision to read at: current, compacted, exactly compacted, future, negative or
    /// (mostly) somewhere in the readable window.
    fn revision(&mut self) -> i64 {
        let cur = self.model.current_revision();
        let compact = self.model.compact_revision();
        let low = compact.max(1);
        match self.below(12) {
            0 => 0,
            1 => -1 - self.below(3) as i64,
            2 => cur + 1 + self.below(2) as i64,
            3 => compact,
            4 => compact - 1,
            _ => low + self.src.below((cur - low + 1) as u64) as i64,
        }
    }

    fn range(&mut self, standalone: bool) -> RangeRequest {
        let key = self.key(if standalone { 2 } else { 1 });
        let range_end = self.range_end(&key);
        let limit = match self.below(8) {
            0..=3 => 0,
            4 => -1,
            _ => 1 + self.below(4) as i64,
        };
        // A txn with a Range at a bad revision fails as a whole: keep those rarer.
        let revision = if self.chance(if standalone { 50 } else { 80 }) {
            0
        } else {
            self.revision()
        };
        let sort_order = self.pick(&[
            SortOrder::None,
            SortOrder::None,
            SortOrder::Ascend,
            SortOrder::Descend,
        ]);
        let sort_target = self.pick(&[
            SortTarget::Key,
            SortTarget::Key,
            SortTarget::Version,
            SortTarget::Create,
            SortTarget::Mod,
            SortTarget::Value,
        ]);
        let mut req = RangeRequest {
            key,
            range_end,
            limit,
            revision,
            sort_order,
            sort_target,
            serializable: self.chance(50),
            keys_only: self.chance(15),
            count_only: self.chance(10),
            ..RangeRequest::default()
        };
        if self.chance(20) {
            req.min_mod_revision = self.filter();
            req.max_mod_revision = self.filter();
            req.min_create_revision = self.filter();
            req.max_create_revision = self.filter();
        }
        req
    }

    fn filter(&mut self) -> i64 {
        if self.chance(60) { 0 } else { self.revision() }
    }

    fn put(&mut self) -> PutRequest {
        let key = self.key(2);
        self.put_at(key)
    }

    fn put_at(&mut self, key: Bytes) -> PutRequest {
        let ignore_value = self.chance(6);
        let ignore_lease = self.chance(6);
        let value = if ignore_value && self.chance(85) {
            Bytes::new()
        } else {
            self.value()
        };
        let lease = if ignore_lease && self.chance(85) || self.chance(60) {
            0
        } else {
            self.lease_id()
        };
        PutRequest {
            key,
            value,
            lease,
            prev_kv: self.chance(50),
            ignore_value,
            ignore_lease,
        }
    }

    fn delete(&mut self) -> DeleteRangeRequest {
        let key = self.key(2);
        let range_end = self.range_end(&key);
        DeleteRangeRequest {
            key,
            range_end,
            prev_kv: self.chance(50),
        }
    }

    /// A txn whose op lists may hold `budget` ops (etcd's recursive budget: a nested txn has
    /// what its parent left). Now and then one list has exactly `budget` or `budget + 1` ops,
    /// to hit the limit from both sides.
    fn txn(&mut self, depth: u32, budget: usize) -> TxnRequest {
        let oversized = if self.chance(3) {
            Some(self.below(3))
        } else {
            None
        };
        let big = budget + self.below(2);
        // Lists within the budget, unless oversized on purpose.
        let lens = [
            self.below(budget.min(3) + 1),
            self.below(budget.min(4) + 1),
            self.below(budget.min(3) + 1),
        ];
        let lens: Vec<usize> = (0..3)
            .map(|i| if oversized == Some(i) { big } else { lens[i] })
            .collect();
        let inner_budget = budget.saturating_sub(lens.iter().copied().max().unwrap_or(0));
        let compare = (0..lens[0]).map(|_| self.compare()).collect();
        let success = self.branch(depth, inner_budget, lens[1], oversized == Some(1));
        let failure = self.branch(depth, inner_budget, lens[2], oversized == Some(2));
        TxnRequest {
            compare,
            success,
            failure,
        }
    }

    fn branch(&mut self, depth: u32, budget: usize, len: usize, cheap: bool) -> Vec<RequestOp> {
        if cheap {
            // A long list: plain single-key reads, so that it costs little.
            return (0..len)
                .map(|_| RequestOp::Range(RangeRequest::key(self.key(0))))
                .collect();
        }
        let mut used = Vec::new();
        let mut ops = Vec::with_capacity(len);
        for _ in 0..len {
            let op = match self.below(20) {
                0..=6 => RequestOp::Range(self.range(false)),
                7..=13 => {
                    let key = self.fresh_key(&used);
                    used.push(key.clone());
                    RequestOp::Put(self.put_at(key))
                }
                14..=16 => RequestOp::DeleteRange(self.txn_delete()),
                _ if depth < 2 => RequestOp::Txn(self.txn(depth + 1, budget)),
                _ => RequestOp::Range(self.range(false)),
            };
            ops.push(op);
        }
        ops
    }

    /// Deletes in txns are mostly single keys or `"\0"` ranges (which the duplicate-key
    /// check ignores), so that most txns are accepted.
    fn txn_delete(&mut self) -> DeleteRangeRequest {
        let key = self.key(1);
        let range_end = match self.below(10) {
            0..=5 => Bytes::new(),
            6..=8 => Bytes::from_static(b"\0"),
            _ => self.range_end(&key),
        };
        DeleteRangeRequest {
            key,
            range_end,
            prev_kv: self.chance(50),
        }
    }

    fn compare(&mut self) -> Compare {
        let key = self.key(1);
        let range_end = match self.below(10) {
            0..=6 => Bytes::new(),
            7 => Bytes::from_static(b"\0"),
            _ => self.range_end(&key),
        };
        let result = self.pick(&[
            CompareResult::Equal,
            CompareResult::Greater,
            CompareResult::Less,
            CompareResult::NotEqual,
        ]);
        let target = match self.below(5) {
            0 => CompareTarget::Version(self.below(4) as i64),
            1 => CompareTarget::Create(if self.chance(30) { 0 } else { self.revision() }),
            2 => CompareTarget::Mod(if self.chance(30) { 0 } else { self.revision() }),
            3 => CompareTarget::Value(Bytes::from_static(self.pick(VALUES))),
            _ => CompareTarget::Lease(if self.chance(20) { 0 } else { self.lease_id() }),
        };
        Compare {
            key,
            range_end,
            result,
            target,
        }
    }

    fn compact(&mut self) -> CompactionRequest {
        let cur = self.model.current_revision();
        let compact = self.model.compact_revision();
        let revision = match self.below(10) {
            0 => compact,
            1 => cur + 1,
            2 => -(self.below(2) as i64),
            3 => cur,
            // Anywhere above the last compaction (compact(0) on a fresh store included).
            _ => compact + 1 + self.src.below((cur - compact) as u64) as i64,
        };
        CompactionRequest {
            revision,
            physical: self.chance(50),
        }
    }

    /// A lease id: mostly one that exists, else one from the pool (which may exist too).
    fn lease_id(&mut self) -> i64 {
        let granted = self.model.lease_ids();
        if !granted.is_empty() && self.chance(80) {
            return granted[self.below(granted.len())];
        }
        self.pick(LEASES)
    }

    fn lease_grant(&mut self) -> LeaseGrantRequest {
        let ttl = if self.below(100) == 99 {
            9_000_000_001
        } else {
            self.pick(TTLS)
        };
        let id = if self.chance(15) {
            0
        } else {
            self.pick(LEASES)
        };
        LeaseGrantRequest { ttl, id }
    }

    /// A watch: a key, a prefix, everything, or an arbitrary (possibly empty) range; from the
    /// next revision, the current one, the past (the compaction revision and just below it
    /// included), the future, or a negative revision; random filters and prev_kv.
    fn watch(&mut self) -> Op {
        let stream = if self.chance(35) {
            StreamKind::Lazy
        } else {
            StreamKind::Eager
        };
        let (key, range_end) = match self.below(10) {
            0..=2 => (self.key(0), Bytes::new()),
            3..=4 => {
                let key = self.key(0);
                let end = prefix_end(&key);
                (key, end)
            }
            5..=6 => (Bytes::from_static(b"\0"), Bytes::from_static(b"\0")),
            7 => (Bytes::new(), self.range_end(&Bytes::new())),
            _ => {
                let key = self.key(0);
                let end = self.range_end(&key);
                (key, end)
            }
        };
        let cur = self.model.current_revision();
        let compact = self.model.compact_revision();
        let start_revision = match self.below(20) {
            0..=5 => 0,
            6..=7 => cur,
            8 => cur + 1 + self.below(3) as i64,
            9..=10 => compact.max(1),
            11..=12 => compact - 1,
            13 => 1,
            14 => -1 - self.below(2) as i64,
            _ => {
                let low = compact.max(1);
                low + self.src.below((cur - low + 1) as u64) as i64
            }
        };
        let watch_id = if self.chance(10) {
            // Explicit ids far above the automatic ones (a per-stream counter from 0), and
            // unique: the op index makes each one different.
            (1 << 32) + self.ops.len() as i64
        } else {
            0
        };
        Op::Watch {
            stream,
            req: WatchCreateRequest {
                key,
                range_end,
                start_revision,
                progress_notify: self.chance(20),
                no_put: self.chance(10),
                no_delete: self.chance(10),
                prev_kv: self.chance(40),
                watch_id,
            },
        }
    }

    fn hash_revision(&mut self) -> i64 {
        let cur = self.model.current_revision();
        let compact = self.model.compact_revision();
        let revision = match self.below(6) {
            0..=2 => 0,
            3 => compact.max(1) + self.src.below((cur - compact.max(1) + 1) as u64) as i64,
            4 => compact - 1,
            _ => cur + 1,
        };
        revision.max(0)
    }
}

/// The Deactivate of `member`'s NOSPACE alarm.
fn disarm(member_id: u64) -> AlarmRequest {
    AlarmRequest {
        action: AlarmAction::Deactivate,
        member_id,
        alarm: AlarmType::NoSpace,
    }
}
