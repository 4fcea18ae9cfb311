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

use std::time::Duration;

use bytes::Bytes;
use kvd::{
    CompactionRequest, Compare, CompareResult, CompareTarget, DeleteRangeRequest,
    LeaseGrantRequest, PutRequest, RangeRequest, RequestOp, SortOrder, SortTarget, TxnRequest,
    WatchCreateRequest, prefix_end,
};

use super::ops::{Op, Seq, StreamKind};
use super::rng::{ByteSource, Source, SplitMix64};
use super::state::{Limits, Model};

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
];

/// Range ends that are not keys.
const ENDS: &[&[u8]] = &[b"k", b"k5", b"z", b"\xff", b"\x00\x00", b"a0"];

const VALUES: &[&[u8]] = &[b"", b"v0", b"v1", b"v2", b"v10", b"x", b"\x00", b"\xff"];

/// Lease ids that grants ask for and operations name (granted or not at the time).
const LEASES: &[i64] = &[1, 2, 3, 7, 1 << 40, i64::MAX, -1];

/// Lease TTLs asked for: below the minimum (raised to 2 s), short ones that the clock
/// overtakes, long ones, the maximum and just above it.
const TTLS: &[i64] = &[-5, 0, 1, 2, 3, 4, 5, 8, 10, 30, 100, 9_000_000_000];

/// Clock steps, in milliseconds: fractions of a second test TTL truncation.
const CLOCK_STEPS_MS: &[u64] = &[250, 1_000, 1_500, 2_000, 3_000, 5_000, 10_000, 60_000];

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
/// are cheap to build.
fn pick_limits(src: &mut impl Source) -> Limits {
    match src.below(8) {
        0..=3 => Limits::default(),
        choice => Limits {
            max_txn_ops: 3 + src.below(6) as usize,
            max_request_bytes: [1024, 2048, 4096, 1_572_864][choice as usize - 4],
        },
    }
}

/// Builds operations from an entropy source, keeping a model to know the revisions.
struct Builder<S: Source> {
    src: S,
    model: Model,
    ops: Vec<Op>,
}

impl<S: Source> Builder<S> {
    fn new(src: S, limits: Limits) -> Builder<S> {
        Builder {
            src,
            model: Model::new(limits),
            ops: Vec::new(),
        }
    }

    /// Appends one operation (or none, if the drawn txn has an undefined outcome), or now
    /// and then a burst of writes (see [`Builder::burst`]).
    fn step(&mut self) {
        let op = match self.src.below(256) {
            0..=63 => Op::Put(self.put()),
            64..=83 => Op::DeleteRange(self.delete()),
            84..=134 => {
                let budget = self.model.limits().max_txn_ops;
                Op::Txn(self.txn(0, budget))
            }
            135..=183 => Op::Range(self.range(true)),
            184 if self.chance(40) => return self.burst(),
            184 => Op::SettleWatches,
            185..=194 => Op::Compact(self.compact()),
            195 => Op::Reopen,
            196..=205 => Op::HashKv(self.hash_revision()),
            206..=218 => Op::LeaseGrant(self.lease_grant()),
            219..=223 => Op::LeaseRevoke(self.lease_id()),
            224..=228 => Op::LeaseKeepAlive(self.lease_id()),
            229..=233 => Op::LeaseTimeToLive {
                id: self.lease_id(),
                keys: self.chance(70),
            },
            234..=235 => Op::LeaseLeases,
            236..=243 => Op::AdvanceClock(Duration::from_millis(self.pick(CLOCK_STEPS_MS))),
            _ => self.watch(),
        };
        self.emit(op);
    }

    /// Appends `op` unless its outcome is undefined.
    fn emit(&mut self, op: Op) {
        if self.model.op_defined(&op) {
            self.model.apply(&op);
            self.ops.push(op);
        }
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

    /// A txn whose op lists may hold `budget` ops (etcd's recursive budget, §4.1). Now and
    /// then one list has exactly `budget` or `budget + 1` ops, to hit the limit from both
    /// sides.
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
    /// check ignores, §4.1), so that most txns are accepted.
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
