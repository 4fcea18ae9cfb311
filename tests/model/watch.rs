//! Watches in the model harness: creates them on an engine's watch streams, reads and checks
//! every response, and at the end of a segment (before a Reopen, and at the end of the
//! sequence) checks each watch's whole event list against the model's history.
//!
//! What a watch must see (etcd's watch semantics, kvd's `WatchResponse` doc):
//! - A refused create (empty range; negative start revision) gets one response, `created`
//!   and `canceled`, watch id -1, the reason, the current revision in the header.
//! - Any other create gets `created` first (header = the current revision, the id the stream
//!   assigned: a per-stream counter from 0 for id 0, else the id asked for).
//! - A start revision below the compaction revision at creation: then `canceled` with that
//!   `compact_revision`, header revision 0, no events.
//! - Otherwise the events of every revision from the first wanted one (the start revision,
//!   or the next revision for start 0 or a future start) to the last one, in (revision, sub)
//!   order, in the key range, without the filtered kinds. A Put event carries the full new
//!   KeyValue; a Delete event only the key and the mod revision. With `prev_kv`, every event
//!   but a Put that created its key carries the key at `mod_revision - 1`, unless that
//!   revision is compacted at the time the stream hands the response out (the engine reads
//!   it then, as etcd's sendLoop does), so the harness records the compaction revision at
//!   each receive.
//! - Per response: events non-empty; never the same revision in two responses; revisions
//!   ascending; header revision at least the last event's revision (a live response carries
//!   exactly its event revision; a catch-up response may group revisions and carry the
//!   revision current when it was read) and at most the current one.
//! - A progress response for one watch (`progress_notify`, sent to synced watches only) with
//!   revision P means the watch has been given every event up to P; a stream-wide progress
//!   response (to `request_progress`, sent only when every watch of the stream is synced)
//!   means the same for every open watch of the stream.
//!
//! The compaction race: a watch that is behind (it started in the past and is still catching
//! up, or it fell behind because its consumer did not read, which the lazy stream does on
//! purpose) is canceled with the compaction revision C as soon as a compaction passes its
//! next revision (WATCH-4). Whether a compaction issued after its creation catches it depends
//! on thread timing, so for a watch that was not compacted at creation the harness accepts
//! either the full event list, or a prefix of it that ends at a revision boundary followed by
//! a compacted cancel whose C is a compaction revision applied after the watch was created,
//! above every delivered revision (and above the first wanted revision).
//!
//! End of a segment: the harness asks each stream for progress until the stream-wide
//! progress response arrives with the current revision (bounded: 10 s), then reads what is
//! left and checks every watch of the stream as above.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, VecDeque};
use std::fmt::Debug;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kvd::{
    Engine, Error, Event, EventType, KeyValue, ResponseHeader, WatchCreateRequest, WatchResponse,
    WatchStream,
};

use super::ops::StreamKind;
use super::state::Model;

/// The longest the harness waits for a stream to settle at the end of a segment.
pub const SETTLE_PATIENCE: Duration = Duration::from_secs(10);

/// How long one read waits while settling before asking for progress again.
const SETTLE_POLL: Duration = Duration::from_millis(5);

/// Why a watch check failed: what, and the engine's and the model's side.
#[derive(Debug)]
pub struct Mismatch {
    /// What was compared.
    pub what: String,
    /// What the engine did.
    pub engine: String,
    /// What the model says.
    pub model: String,
}

fn mismatch(what: impl Into<String>, engine: &dyn Debug, model: &dyn Debug) -> Mismatch {
    Mismatch {
        what: what.into(),
        engine: format!("{engine:?}"),
        model: format!("{model:?}"),
    }
}

/// Counts of what the watch checks covered, for the test's summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchCoverage {
    /// Watches created (refused ones included).
    pub created: usize,
    /// Creates refused (empty range, negative start).
    pub refused: usize,
    /// Watches canceled at creation because their start was compacted.
    pub compacted_at_create: usize,
    /// Watches canceled by a compaction while behind (the accepted race).
    pub compacted_while_behind: usize,
    /// Watches whose full event list was checked.
    pub full: usize,
    /// Events checked against the model.
    pub events: usize,
    /// Responses that grouped several revisions (catch-up from the history).
    pub grouped_responses: usize,
    /// Per-watch progress responses checked.
    pub progress: usize,
}

/// How one watch ended, for tests that assert particular outcomes by hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchLog {
    /// The index of the op that created it.
    pub op: usize,
    /// The id the stream gave it (-1 if refused).
    pub id: i64,
    /// Refused at creation (empty range or negative start).
    pub refused: bool,
    /// Canceled by a compaction, with this compaction revision.
    pub compacted: Option<i64>,
    /// The events received, in order.
    pub events: Vec<Event>,
}

/// What a watch should end up with.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expect {
    /// One created+canceled response with this reason, watch id -1.
    Refused(String),
    /// Created, then canceled with this compaction revision.
    CompactedAtCreate(i64),
    /// Created, then the events of every revision from `first`.
    Events { first: i64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The created (or refused) response has not been read yet.
    Awaiting,
    Refused,
    Open,
    /// Canceled with this compaction revision.
    Canceled(i64),
}

/// One event as received, with the compaction revision at the time it was handed out.
#[derive(Debug, Clone)]
struct Received {
    event: Event,
    compact: i64,
}

#[derive(Debug)]
struct Watch {
    op: usize,
    kind: StreamKind,
    req: WatchCreateRequest,
    /// The key the engine watches (an empty key means "\0").
    key: Bytes,
    id: i64,
    /// The current revision when it was created.
    created_rev: i64,
    /// How many compactions had been applied when it was created.
    compactions_before: usize,
    expect: Expect,
    phase: Phase,
    received: Vec<Received>,
    /// The revision of the last event received (0 if none).
    last_rev: i64,
}

struct Stream {
    stream: WatchStream,
    next_auto_id: i64,
    /// Watches whose created/refused response has not been read, in creation order.
    awaiting: VecDeque<usize>,
    /// Open watches by id.
    open: BTreeMap<i64, usize>,
}

/// The watches of the engine incarnation being run.
#[derive(Default)]
pub struct Watches {
    streams: BTreeMap<StreamKind, Stream>,
    watches: Vec<Watch>,
    /// Every compaction revision applied so far, in order.
    compactions: Vec<i64>,
    /// What the checks covered so far.
    pub coverage: WatchCoverage,
    /// How every checked watch ended, in creation order.
    pub logs: Vec<WatchLog>,
}

impl Watches {
    /// Returns an empty set of watches.
    pub fn new() -> Watches {
        Watches::default()
    }

    /// Records a compaction the model accepted.
    pub fn compacted(&mut self, revision: i64) {
        self.compactions.push(revision);
    }

    /// Creates the watch of op `op` on `engine`, predicting what it should see from `model`.
    pub fn create(
        &mut self,
        op: usize,
        kind: StreamKind,
        req: &WatchCreateRequest,
        engine: &Engine,
        model: &Model,
    ) -> Result<(), Mismatch> {
        let stream = match self.streams.entry(kind) {
            Entry::Occupied(stream) => stream.into_mut(),
            Entry::Vacant(slot) => {
                let stream = engine
                    .watch_stream()
                    .map_err(|e| mismatch("Engine::watch_stream", &e, &"a stream"))?;
                slot.insert(Stream {
                    stream,
                    next_auto_id: 0,
                    awaiting: VecDeque::new(),
                    open: BTreeMap::new(),
                })
            }
        };
        let key = if req.key.is_empty() {
            Bytes::from_static(b"\0")
        } else {
            req.key.clone()
        };
        let end = &req.range_end;
        let cur = model.current_revision();
        let compact = model.compact_revision();
        let (id, expect) = if !end.is_empty() && end[..] != b"\0"[..] && key >= *end {
            (
                -1,
                Expect::Refused("mvcc: watcher range is empty".to_owned()),
            )
        } else if req.start_revision < 0 {
            (-1, Expect::Refused(Error::Compacted.to_string()))
        } else {
            let id = if req.watch_id != 0 {
                req.watch_id
            } else {
                stream.next_auto_id += 1;
                stream.next_auto_id - 1
            };
            let expect = if req.start_revision == 0 || req.start_revision > cur {
                Expect::Events {
                    first: req.start_revision.max(cur + 1),
                }
            } else if req.start_revision < compact {
                Expect::CompactedAtCreate(compact)
            } else {
                Expect::Events {
                    first: req.start_revision,
                }
            };
            (id, expect)
        };
        let got = stream.stream.create(req.clone());
        if got != Ok(id) {
            return Err(mismatch(
                "WatchStream::create returned",
                &got,
                &Ok::<i64, Error>(id),
            ));
        }
        self.coverage.created += 1;
        stream.awaiting.push_back(self.watches.len());
        self.watches.push(Watch {
            op,
            kind,
            req: req.clone(),
            key,
            id,
            created_rev: cur,
            compactions_before: self.compactions.len(),
            expect,
            phase: Phase::Awaiting,
            received: Vec::new(),
            last_rev: 0,
        });
        Ok(())
    }

    /// Reads and checks whatever the eager stream has ready (after every op).
    pub fn poll_eager(&mut self, model: &Model) -> Result<(), Mismatch> {
        self.poll(StreamKind::Eager, model)
    }

    fn poll(&mut self, kind: StreamKind, model: &Model) -> Result<(), Mismatch> {
        loop {
            let Some(stream) = self.streams.get(&kind) else {
                return Ok(());
            };
            match stream.stream.try_recv() {
                Ok(Some(resp)) => {
                    self.route(kind, resp, model)?;
                }
                Ok(None) => return Ok(()),
                Err(e) => return Err(mismatch("WatchStream::try_recv", &e, &"a response")),
            }
        }
    }

    /// Settles every stream: each open watch then has exactly its events up to the current
    /// revision (checked on the stream-wide progress response).
    pub fn settle_all(&mut self, model: &Model) -> Result<(), Mismatch> {
        let kinds: Vec<StreamKind> = self.streams.keys().copied().collect();
        for kind in kinds {
            self.settle(kind, model)?;
        }
        Ok(())
    }

    /// Settles every stream and checks every watch; then drops the streams (the engine is
    /// about to close, or the sequence ends).
    pub fn finish_segment(&mut self, model: &Model) -> Result<(), Mismatch> {
        self.settle_all(model)?;
        for w in 0..self.watches.len() {
            self.check_final(w, model)?;
        }
        self.streams.clear();
        for watch in self.watches.drain(..) {
            self.logs.push(WatchLog {
                op: watch.op,
                id: watch.id,
                refused: watch.phase == Phase::Refused,
                compacted: match watch.phase {
                    Phase::Canceled(c) => Some(c),
                    _ => None,
                },
                events: watch.received.into_iter().map(|r| r.event).collect(),
            });
        }
        Ok(())
    }

    /// Asks `kind` for progress until the stream-wide progress response with the current
    /// revision arrives, reading and checking everything on the way.
    fn settle(&mut self, kind: StreamKind, model: &Model) -> Result<(), Mismatch> {
        let started = Instant::now();
        loop {
            let Some(stream) = self.streams.get(&kind) else {
                return Ok(());
            };
            stream.stream.request_progress();
            let mut settled = false;
            loop {
                let Some(stream) = self.streams.get(&kind) else {
                    return Ok(());
                };
                match stream.stream.recv_timeout(SETTLE_POLL) {
                    // The stream answers in order: once the progress response at the current
                    // revision is routed, every event before it has been read.
                    Ok(Some(resp)) => {
                        if self.route(kind, resp, model)? {
                            settled = true;
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => return Err(mismatch("WatchStream::recv_timeout", &e, &"a response")),
                }
            }
            if settled {
                return Ok(());
            }
            if started.elapsed() > SETTLE_PATIENCE {
                let unsettled: Vec<String> = self
                    .watches
                    .iter()
                    .filter(|w| w.kind == kind && w.phase == Phase::Open)
                    .map(|w| self.describe(w, model))
                    .collect();
                return Err(mismatch(
                    format!(
                        "{kind:?} watch stream: no stream-wide progress response at the current \
                         revision within {SETTLE_PATIENCE:?} (some watch never caught up)"
                    ),
                    &unsettled,
                    &format!(
                        "every watch synced at revision {}",
                        model.current_revision()
                    ),
                ));
            }
        }
    }

    /// Checks one response of stream `kind` and records what it says. Returns true for a
    /// stream-wide progress response (every open watch then has all its events).
    fn route(
        &mut self,
        kind: StreamKind,
        resp: WatchResponse,
        model: &Model,
    ) -> Result<bool, Mismatch> {
        let Some(stream) = self.streams.get_mut(&kind) else {
            return Ok(false);
        };
        if resp.created {
            let Some(w) = stream.awaiting.pop_front() else {
                return Err(mismatch(
                    format!("{kind:?} stream: a created response but no create is awaiting one"),
                    &resp,
                    &"nothing",
                ));
            };
            let watch = &mut self.watches[w];
            let (want, phase) = match &watch.expect {
                Expect::Refused(reason) => (
                    WatchResponse {
                        header: ResponseHeader {
                            revision: watch.created_rev,
                        },
                        watch_id: -1,
                        created: true,
                        canceled: true,
                        cancel_reason: reason.clone(),
                        ..WatchResponse::default()
                    },
                    Phase::Refused,
                ),
                _ => (
                    WatchResponse {
                        header: ResponseHeader {
                            revision: watch.created_rev,
                        },
                        watch_id: watch.id,
                        created: true,
                        ..WatchResponse::default()
                    },
                    Phase::Open,
                ),
            };
            if resp != want {
                return Err(mismatch(
                    format!("first response of the watch of op #{}", watch.op),
                    &resp,
                    &want,
                ));
            }
            watch.phase = phase;
            if phase == Phase::Open {
                let id = watch.id;
                if let Some(other) = stream.open.insert(id, w) {
                    return Err(mismatch(
                        format!("watch id {id} given twice on one stream"),
                        &format!(
                            "ops #{} and #{}",
                            self.watches[other].op, self.watches[w].op
                        ),
                        &"distinct ids",
                    ));
                }
            } else {
                self.coverage.refused += 1;
            }
            return Ok(false);
        }
        if resp.watch_id == -1 {
            return self.stream_progress(kind, resp, model).map(|()| true);
        }
        let Some(&w) = stream.open.get(&resp.watch_id) else {
            return Err(mismatch(
                format!(
                    "{kind:?} stream: a response for watch id {} which is not open",
                    resp.watch_id
                ),
                &resp,
                &stream.open.keys().collect::<Vec<_>>(),
            ));
        };
        if resp.canceled {
            stream.open.remove(&resp.watch_id);
            return self.canceled(w, resp);
        }
        if resp.events.is_empty() {
            return self.watch_progress(w, resp, model).map(|()| false);
        }
        self.events(w, resp, model).map(|()| false)
    }

    fn stream_progress(
        &mut self,
        kind: StreamKind,
        resp: WatchResponse,
        model: &Model,
    ) -> Result<(), Mismatch> {
        let want = WatchResponse {
            header: ResponseHeader {
                revision: model.current_revision(),
            },
            watch_id: -1,
            ..WatchResponse::default()
        };
        if resp != want {
            return Err(mismatch(
                format!("{kind:?} stream: stream-wide progress response"),
                &resp,
                &want,
            ));
        }
        let Some(stream) = self.streams.get(&kind) else {
            return Ok(());
        };
        if let Some(&w) = stream.awaiting.front() {
            return Err(mismatch(
                "stream-wide progress before the created response of a watch",
                &resp,
                &format!("created response of op #{}", self.watches[w].op),
            ));
        }
        let open: Vec<usize> = stream.open.values().copied().collect();
        for w in open {
            self.check_prefix_up_to(w, model.current_revision(), model, "stream-wide progress")?;
        }
        Ok(())
    }

    fn watch_progress(
        &mut self,
        w: usize,
        resp: WatchResponse,
        model: &Model,
    ) -> Result<(), Mismatch> {
        let watch = &self.watches[w];
        let p = resp.header.revision;
        let well_formed = watch.req.progress_notify
            && resp.compact_revision == 0
            && resp.cancel_reason.is_empty()
            && p >= watch.created_rev
            && p <= model.current_revision();
        if !well_formed {
            return Err(mismatch(
                format!(
                    "watch of op #{}: an empty response (progress) that it did not ask for or \
                     with a revision outside [created {}, current {}]",
                    watch.op,
                    watch.created_rev,
                    model.current_revision()
                ),
                &resp,
                &watch.req,
            ));
        }
        self.coverage.progress += 1;
        self.check_prefix_up_to(w, p, model, "progress notification")
    }

    /// Checks that watch `w` has received exactly its events up to revision `upto`.
    fn check_prefix_up_to(
        &self,
        w: usize,
        upto: i64,
        model: &Model,
        what: &str,
    ) -> Result<(), Mismatch> {
        let watch = &self.watches[w];
        let Expect::Events { first } = watch.expect else {
            if watch.phase == Phase::Open {
                return Err(mismatch(
                    format!(
                        "watch of op #{} ({what} at {upto}): open, but it should have been \
                         canceled at creation",
                        watch.op
                    ),
                    &self.describe(watch, model),
                    &watch.expect,
                ));
            }
            return Ok(());
        };
        let want = self.expected(watch, first, upto, model);
        let got = self.unsuperseded(watch.received.iter().map(|r| &r.event).collect());
        let want_refs = self.unsuperseded(want.iter().collect());
        if got != want_refs {
            return Err(mismatch(
                format!(
                    "watch of op #{} ({:?} stream, {:?}): after a {what} at revision {upto}, the \
                     events received differ from the model's history",
                    watch.op, watch.kind, watch.req
                ),
                &got,
                &want,
            ));
        }
        Ok(())
    }

    fn canceled(&mut self, w: usize, resp: WatchResponse) -> Result<bool, Mismatch> {
        let watch = &self.watches[w];
        let c = resp.compact_revision;
        let shape = WatchResponse {
            watch_id: watch.id,
            canceled: true,
            compact_revision: c,
            ..WatchResponse::default()
        };
        let valid = match watch.expect {
            Expect::CompactedAtCreate(at) => c == at && watch.received.is_empty(),
            Expect::Events { first } => {
                self.compactions[watch.compactions_before..].contains(&c)
                    && c > first
                    && c > watch.last_rev
            }
            Expect::Refused(_) => false,
        };
        if resp != shape || !valid {
            let after: Vec<i64> = self.compactions[watch.compactions_before..].to_vec();
            return Err(mismatch(
                format!(
                    "watch of op #{} ({:?}): canceled, but a compacted cancel (header revision \
                     0) must name the compaction revision at creation when the start was \
                     compacted, else a compaction applied after creation that is above its \
                     first wanted revision and every revision delivered (compactions since \
                     creation: {after:?}, last delivered revision {})",
                    watch.op, watch.req, watch.last_rev
                ),
                &resp,
                &watch.expect,
            ));
        }
        if matches!(watch.expect, Expect::CompactedAtCreate(_)) {
            self.coverage.compacted_at_create += 1;
        } else {
            self.coverage.compacted_while_behind += 1;
        }
        self.watches[w].phase = Phase::Canceled(c);
        Ok(false)
    }

    fn events(&mut self, w: usize, resp: WatchResponse, model: &Model) -> Result<(), Mismatch> {
        let watch = &self.watches[w];
        let revs: Vec<i64> = resp.events.iter().map(|e| e.kv.mod_revision).collect();
        let first = revs[0];
        let last = revs[revs.len() - 1];
        let ascending = revs.windows(2).all(|p| p[0] <= p[1]);
        let well_formed = resp.compact_revision == 0
            && resp.cancel_reason.is_empty()
            && ascending
            && first > watch.last_rev
            && resp.header.revision >= last
            && resp.header.revision <= model.current_revision();
        if !well_formed {
            return Err(mismatch(
                format!(
                    "watch of op #{} ({:?} stream): a response must hold events in revision \
                     order, never repeat or split a revision (last revision received: {}), and \
                     carry a header revision between its last event's and the current one ({})",
                    watch.op,
                    watch.kind,
                    watch.last_rev,
                    model.current_revision()
                ),
                &resp,
                &watch.req,
            ));
        }
        if first != last {
            self.coverage.grouped_responses += 1;
        }
        let compact = model.compact_revision();
        let watch = &mut self.watches[w];
        watch.last_rev = last;
        watch.received.extend(
            resp.events
                .into_iter()
                .map(|event| Received { event, compact }),
        );
        Ok(())
    }

    /// The final check of watch `w`, once its stream has settled.
    fn check_final(&mut self, w: usize, model: &Model) -> Result<(), Mismatch> {
        let watch = &self.watches[w];
        let cur = model.current_revision();
        match (&watch.expect, watch.phase) {
            (_, Phase::Awaiting) => Err(mismatch(
                format!("watch of op #{}: no created response", watch.op),
                &self.describe(watch, model),
                &watch.expect,
            )),
            (Expect::Refused(_), Phase::Refused) => Ok(()),
            (Expect::CompactedAtCreate(_), Phase::Canceled(_)) => Ok(()),
            (Expect::Events { .. }, Phase::Open) => {
                self.check_prefix_up_to(w, cur, model, "settled stream")?;
                self.coverage.full += 1;
                self.coverage.events += self.watches[w].received.len();
                Ok(())
            }
            (Expect::Events { first }, Phase::Canceled(c)) => {
                let want = self.expected(watch, *first, cur, model);
                let want = self.unsuperseded(want.iter().collect());
                let got = self.unsuperseded(watch.received.iter().map(|r| &r.event).collect());
                let n = got.len();
                let prefix = n <= want.len()
                    && got.iter().zip(&want).all(|(g, w)| g == w)
                    && (n == 0
                        || n == want.len()
                        || want[n].kv.mod_revision != want[n - 1].kv.mod_revision);
                if !prefix {
                    return Err(mismatch(
                        format!(
                            "watch of op #{} ({:?} stream, {:?}): canceled by the compaction at \
                             {c}; what it received before must be the model's events up to a \
                             revision boundary",
                            watch.op, watch.kind, watch.req
                        ),
                        &got,
                        &want,
                    ));
                }
                self.coverage.events += n;
                Ok(())
            }
            (expect, phase) => Err(mismatch(
                format!("watch of op #{} ({:?}): how it ended", watch.op, watch.req),
                &format!("{phase:?}: {}", self.describe(watch, model)),
                expect,
            )),
        }
    }

    /// `events` without those at a compaction revision that a later event of the same key in
    /// the same revision supersedes. A compaction at revision C keeps only the last change of
    /// each key at or below C (etcd's `keyIndex.compact` compares main revisions), so a watch
    /// that starts at C gets such an event if it read revision C before the compaction ran,
    /// and not after: both lists are compared without them.
    fn unsuperseded<'e>(&self, events: Vec<&'e Event>) -> Vec<&'e Event> {
        let superseded = |i: usize| {
            let e = events[i];
            self.compactions.contains(&e.kv.mod_revision)
                && events[i + 1..]
                    .iter()
                    .take_while(|later| later.kv.mod_revision == e.kv.mod_revision)
                    .any(|later| later.kv.key == e.kv.key)
        };
        (0..events.len())
            .filter(|&i| !superseded(i))
            .map(|i| events[i])
            .collect()
    }

    /// The events watch `watch` must receive from revision `first` to `upto`, with prev_kv
    /// resolved against the compaction revision each received event was handed out under
    /// (the current one past the received events).
    fn expected(&self, watch: &Watch, first: i64, upto: i64, model: &Model) -> Vec<Event> {
        let changes = model.changes(&watch.key, &watch.req.range_end, first, upto);
        let mut events: Vec<Event> = changes
            .into_iter()
            .filter(|c| {
                if c.entry.kv.is_some() {
                    !watch.req.no_put
                } else {
                    !watch.req.no_delete
                }
            })
            .map(|c| match c.entry.kv {
                Some(kv) => Event {
                    kind: EventType::Put,
                    kv,
                    prev_kv: None,
                },
                None => Event {
                    kind: EventType::Delete,
                    kv: KeyValue {
                        key: c.key,
                        mod_revision: c.entry.rev,
                        ..KeyValue::default()
                    },
                    prev_kv: None,
                },
            })
            .collect();
        if watch.req.prev_kv {
            for (i, event) in events.iter_mut().enumerate() {
                let compact = watch
                    .received
                    .get(i)
                    .map_or(model.compact_revision(), |r| r.compact);
                let created = event.kind == EventType::Put
                    && event.kv.create_revision == event.kv.mod_revision;
                let at = event.kv.mod_revision - 1;
                if !created && at >= compact {
                    event.prev_kv = model.kv_at(&event.kv.key, at);
                }
            }
        }
        events
    }

    fn describe(&self, watch: &Watch, model: &Model) -> String {
        format!(
            "watch of op #{} on the {:?} stream, id {}, {:?}, created at revision {}, phase \
             {:?}, {} events received (last revision {}), model current {} compact {}",
            watch.op,
            watch.kind,
            watch.id,
            watch.req,
            watch.created_rev,
            watch.phase,
            watch.received.len(),
            watch.last_rev,
            model.current_revision(),
            model.compact_revision()
        )
    }
}
