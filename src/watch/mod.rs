//! Watch: streams of the changes to a key or a range, from any revision not compacted.
//!
//! A watcher is either **synced** (it has seen every revision up to the published one and
//! gets new revisions as they are published, from the thread that finishes each batch,
//! normally the commit thread) or **unsynced** (it is behind and the sync thread feeds it
//! from the history in short read transactions). A synced watcher whose buffer is full
//! becomes unsynced, so a slow consumer never blocks apply; an unsynced one that has caught
//! up rejoins the synced set.
//!
//! Why no event is lost or sent twice across the switch: the thread that finishes a batch
//! (normally the commit thread, after the batch's log sync) publishes a revision and hands
//! its events to the synced watchers in one critical section of the hub lock
//! ([`Hub::publish`]). The sync thread decides under the same lock: a watcher whose next
//! revision is above the published one joins the synced set right there (so the next
//! publish includes it); otherwise it reads history only up to that published revision. So
//! every revision is delivered either from history (≤ the published revision seen under the
//! lock) or live (> it), never both and never neither. `loom-tests/` models this protocol.
//!
//! Invariants:
//! - WATCH-1: a watcher's responses carry strictly increasing revisions, each revision's
//!   events in one response, in `sub` order.
//! - WATCH-2: `next_rev` of a watcher is greater than every revision it has been given and at
//!   most the first matching revision it has not; a synced watcher has been given every
//!   matching revision up to `published` at every moment the hub lock is free. Debug builds
//!   assert the first part at every live delivery.
//! - WATCH-3: a watcher holds at most `WATCH_PENDING_RESPONSES_MAX` undelivered event
//!   responses, plus its control responses (created, canceled, progress: at most one per
//!   request of the consumer or per progress tick); publishing never waits for a consumer.
//! - WATCH-4: a watcher whose next revision falls below the compaction revision is canceled
//!   with that revision (etcd's compacted notice) instead of skipping history.
//! - WATCH-5: `publish` (on the thread that finishes a batch, normally the commit thread)
//!   finds the watchers of a change by key lookup (single-key watchers) and
//!   by distinct range (range watchers); idle watchers on other keys cost nothing per write.
//! - WATCH-6: `publish` builds a revision's events once and hands every watcher that gets them
//!   a reference to that one list with the positions it wants ([`Picked`]); the events are
//!   copied into a watcher's response by the stream's consumer, not by apply, so the
//!   writer's cost per watcher is a reference count and a queue push.
//!
//! Contact points: the engine calls [`Hub::publish`] after each commit; [`WatchStream`] is
//! the public handle, received from blocking or asynchronously ([`queue`], WATCHQ-1..3); the
//! sync thread runs [`Hub::sync_pass`].

mod queue;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use self::queue::DeliveryQueue;

use crate::api::{Event, EventType, KeyValue, ResponseHeader, WatchCreateRequest, WatchResponse};
use crate::error::{Error, StorageError};
use crate::mvcc::Revision;
use crate::mvcc::index::{Index, KeyRange};
use crate::mvcc::record::Record;
use crate::mvcc::write::Change;
use crate::storage::Store;
use crate::sync::{self, Arc, AtomicUsize, Mutex, Ordering, RwLock};

/// Undelivered responses a watcher may hold before it falls back to catching up (etcd's
/// per-stream channel of 128).
pub const WATCH_PENDING_RESPONSES_MAX: usize = 128;
/// History records read per catch-up step (one short read transaction).
pub const WATCH_CATCH_UP_RECORDS: usize = 1_000;
/// Unsynced watchers served per pass of the sync thread (etcd's 512).
pub const WATCH_SYNC_WATCHERS_PER_PASS: usize = 512;
/// `Hub::publish` walks the watchers in order instead of searching for each matched one
/// when at least one in this many matches.
const WATCH_WALK_RATIO: usize = 16;
/// How often the sync thread looks at unsynced watchers without being woken.
pub const WATCH_SYNC_INTERVAL: Duration = Duration::from_millis(100);

const CANCEL_REASON_EMPTY_RANGE: &str = "mvcc: watcher range is empty";
const CANCEL_REASON_DUPLICATE_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";

/// What a stream's consumer receives: a response, and whether to fill in `prev_kv`.
#[derive(Debug)]
struct Delivery {
    response: WatchResponse,
    /// Live events shared with the revision's other watchers (WATCH-6): the consumer copies
    /// the picked ones into `response`.
    shared: Option<(Arc<[Event]>, Picked)>,
    wants_prev_kv: bool,
    /// The watcher whose pending count this response is in (WATCH-3), if any. Keyed by the
    /// hub's own id, not the watch id, which a client may reuse after a cancel.
    counted: Option<u64>,
}

/// One watch.
#[derive(Debug)]
struct Watcher {
    /// The hub's id of this watcher.
    id: u64,
    stream: u64,
    watch_id: i64,
    key: Bytes,
    end: Bytes,
    /// The first revision this watcher has not been given (WATCH-2).
    next_rev: i64,
    /// Events below this revision are not wanted.
    start_rev: i64,
    prev_kv: bool,
    no_put: bool,
    no_delete: bool,
    progress_notify: bool,
    synced: bool,
    /// Something was sent since the last progress tick.
    sent_since_tick: bool,
    pending: Arc<AtomicUsize>,
    queue: Arc<DeliveryQueue<Delivery>>,
}

impl Watcher {
    fn is_single_key(&self) -> bool {
        self.end.is_empty()
    }

    fn wants(&self, event: &Event) -> bool {
        match event.kind {
            EventType::Put => !self.no_put,
            EventType::Delete => !self.no_delete,
        }
    }

    /// Queues `response`, with the shared events it carries if any, if the watcher has
    /// room (WATCH-3); returns false if it has not. The consumer's waker goes to `wakes` if
    /// given (the caller wakes it later), else it is woken now.
    fn offer(
        &mut self,
        response: WatchResponse,
        shared: Option<(Arc<[Event]>, Picked)>,
        wakes: Option<&mut Vec<Waker>>,
    ) -> bool {
        if self.pending.load(Ordering::Acquire) >= WATCH_PENDING_RESPONSES_MAX {
            return false;
        }
        self.pending.fetch_add(1, Ordering::AcqRel);
        self.sent_since_tick = true;
        let delivery = Delivery {
            response,
            shared,
            wants_prev_kv: self.prev_kv,
            counted: Some(self.id),
        };
        match wakes {
            Some(wakes) => wakes.extend(self.queue.push_waking_later(delivery)),
            None => self.queue.push(delivery),
        }
        true
    }

    /// Sends a control response (created, canceled, progress) regardless of room: there
    /// is at most one per request of the consumer, so they cannot pile up.
    fn control(&self, response: WatchResponse) {
        self.pending.fetch_add(1, Ordering::AcqRel);
        self.queue.push(Delivery {
            response,
            shared: None,
            wants_prev_kv: false,
            counted: Some(self.id),
        });
    }
}

/// Which of a revision's shared events a watcher gets, by position (WATCH-6).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Picked {
    All,
    One(u32),
    Many(Vec<u32>),
}

impl Picked {
    fn push(&mut self, position: u32) {
        match self {
            Picked::All => {}
            Picked::One(first) => *self = Picked::Many(vec![*first, position]),
            Picked::Many(positions) => positions.push(position),
        }
    }

    /// Keeps the positions whose event `keep` accepts; `None` if none is left. A pick of
    /// every one of `events` becomes [`Picked::All`].
    fn retain(self, events: &[Event], keep: impl Fn(&Event) -> bool) -> Option<Picked> {
        let positions: Vec<u32> = match self {
            Picked::All => (0..events.len() as u32).collect(),
            Picked::One(p) => vec![p],
            Picked::Many(positions) => positions,
        };
        let kept: Vec<u32> = positions
            .into_iter()
            .filter(|p| keep(&events[*p as usize]))
            .collect();
        match kept.len() {
            0 => None,
            n if n == events.len() => Some(Picked::All),
            1 => Some(Picked::One(kept[0])),
            _ => Some(Picked::Many(kept)),
        }
    }

    /// Returns this watcher's copy of the picked events.
    fn copy(&self, events: &[Event]) -> Vec<Event> {
        match self {
            Picked::All => events.to_vec(),
            Picked::One(p) => vec![events[*p as usize].clone()],
            Picked::Many(positions) => positions
                .iter()
                .map(|p| events[*p as usize].clone())
                .collect(),
        }
    }
}

/// Every watcher of the engine.
#[derive(Debug, Default)]
struct HubState {
    /// The published revision, as of the last [`Hub::publish`] (changes only under the lock).
    published: i64,
    next_watcher: u64,
    next_stream: u64,
    watchers: BTreeMap<u64, Watcher>,
    /// Synced single-key watchers by key (WATCH-5).
    by_key: BTreeMap<Bytes, BTreeSet<u64>>,
    /// Synced range watchers by distinct range (WATCH-5).
    by_range: BTreeMap<(Bytes, Bytes), BTreeSet<u64>>,
    unsynced: BTreeSet<u64>,
    /// Per stream: watch id → watcher, and the next automatic watch id.
    streams: BTreeMap<u64, StreamWatches>,
}

#[derive(Debug, Default)]
struct StreamWatches {
    ids: BTreeMap<i64, u64>,
    next_id: i64,
}

impl HubState {
    fn join_synced(&mut self, id: u64) {
        let Some(w) = self.watchers.get_mut(&id) else {
            return;
        };
        w.synced = true;
        self.unsynced.remove(&id);
        if w.is_single_key() {
            self.by_key.entry(w.key.clone()).or_default().insert(id);
        } else {
            self.by_range
                .entry((w.key.clone(), w.end.clone()))
                .or_default()
                .insert(id);
        }
    }

    fn leave_synced(&mut self, id: u64) {
        let Some(w) = self.watchers.get_mut(&id) else {
            return;
        };
        if w.synced {
            w.synced = false;
            let (key, end) = (w.key.clone(), w.end.clone());
            let single = w.is_single_key();
            remove_from(&mut self.by_key, &key, id, single);
            remove_from(&mut self.by_range, &(key, end), id, !single);
        }
    }

    fn remove(&mut self, id: u64) -> Option<Watcher> {
        self.leave_synced(id);
        self.unsynced.remove(&id);
        let w = self.watchers.remove(&id)?;
        if let Some(stream) = self.streams.get_mut(&w.stream) {
            stream.ids.remove(&w.watch_id);
        }
        Some(w)
    }
}

fn remove_from<K: Ord>(map: &mut BTreeMap<K, BTreeSet<u64>>, key: &K, id: u64, applies: bool) {
    if !applies {
        return;
    }
    if let Some(set) = map.get_mut(key) {
        set.remove(&id);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

/// What a sync pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncPass {
    /// Some watcher moved: run another pass at once.
    pub progressed: bool,
    /// Watchers are still behind (perhaps waiting for their consumer to read): retry after
    /// `WATCH_STALLED_RETRY`, as etcd retries its victims.
    pub behind: bool,
}

/// How soon the sync thread retries watchers that could not move (etcd: 10 ms).
pub const WATCH_STALLED_RETRY: Duration = Duration::from_millis(10);

/// The registry of watchers, shared by the apply thread, the sync thread and the streams.
#[derive(Debug)]
pub struct Hub {
    state: Mutex<HubState>,
    /// Wakes the sync thread when a watcher falls behind.
    wake: Sender<()>,
    wakeups: Receiver<()>,
}

impl Hub {
    /// Returns a hub whose published revision is `published`.
    pub fn new(published: i64) -> Hub {
        let (wake, wakeups) = crossbeam_channel::bounded(1);
        Hub {
            state: Mutex::new(HubState {
                published,
                ..HubState::default()
            }),
            wake,
            wakeups,
        }
    }

    /// Publishes `revision` and gives the batch's changes to the synced watchers, in one
    /// critical section (the switch protocol in the module doc). `publish_revision` makes
    /// the revision visible to readers. Returns the wakers of the streams' asynchronous
    /// consumers that now have something to take: the caller must wake them (WATCHQ-2), and
    /// the commit thread does so after answering the batch's writers, so that a writer's
    /// answer is not scheduled behind the fan-out its write caused.
    #[must_use]
    pub fn publish(
        &self,
        revision: i64,
        events: &[(i64, Vec<Change>)],
        publish_revision: impl FnOnce(i64),
    ) -> Vec<Waker> {
        let mut wakes = Vec::new();
        let mut state = sync::lock(&self.state);
        publish_revision(revision);
        state.published = revision;
        let mut fell_behind = Vec::new();
        for (rev, changes) in events {
            let matched = matching_watchers(&state, changes);
            if matched.is_empty() {
                continue;
            }
            // WATCH-6: the revision's events, built once for all its watchers.
            let shared: Arc<[Event]> = changes.iter().map(event_of_change).collect();
            // Both are in id order: when many watchers match, one walk along the map finds
            // them all instead of one search each.
            let mut give = |w: &mut Watcher, picked: Picked| {
                if give_live(w, *rev, &shared, picked, &mut wakes) == Given::NoRoom {
                    fell_behind.push(w.id);
                }
            };
            if matched.len().saturating_mul(WATCH_WALK_RATIO) >= state.watchers.len() {
                let mut watchers = state.watchers.iter_mut().peekable();
                for (id, picked) in matched {
                    while watchers.next_if(|(other, _)| **other < id).is_some() {}
                    if let Some((_, w)) = watchers.next_if(|(other, _)| **other == id) {
                        give(w, picked);
                    }
                }
            } else {
                for (id, picked) in matched {
                    if let Some(w) = state.watchers.get_mut(&id) {
                        give(w, picked);
                    }
                }
            }
            for id in fell_behind.drain(..) {
                state.leave_synced(id);
                state.unsynced.insert(id);
            }
        }
        if !state.unsynced.is_empty() {
            let _ = self.wake.try_send(());
        }
        wakes
    }

    /// Opens a stream.
    fn open_stream(&self) -> u64 {
        let mut state = sync::lock(&self.state);
        let id = state.next_stream;
        state.next_stream += 1;
        state.streams.insert(id, StreamWatches::default());
        id
    }

    /// Creates a watch on `stream`; its answers arrive on the stream.
    fn create(
        &self,
        stream: u64,
        queue: &Arc<DeliveryQueue<Delivery>>,
        pending: &Mutex<BTreeMap<u64, Arc<AtomicUsize>>>,
        req: WatchCreateRequest,
        compact_revision: i64,
    ) -> i64 {
        let mut state = sync::lock(&self.state);
        let published = state.published;
        let header = ResponseHeader {
            revision: published,
        };
        let refuse = |watch_id: i64, reason: &str| {
            let response = WatchResponse {
                header,
                watch_id,
                created: true,
                canceled: true,
                cancel_reason: reason.to_owned(),
                ..WatchResponse::default()
            };
            queue.push(Delivery {
                response,
                shared: None,
                wants_prev_kv: false,
                counted: None,
            });
            watch_id
        };
        let key = if req.key.is_empty() {
            Bytes::from_static(b"\0")
        } else {
            req.key.clone()
        };
        if !req.range_end.is_empty() && req.range_end[..] != b"\0"[..] && key >= req.range_end {
            return refuse(-1, CANCEL_REASON_EMPTY_RANGE);
        }
        if req.start_revision < 0 {
            return refuse(-1, &Error::Compacted.to_string());
        }
        let Some(watches) = state.streams.get_mut(&stream) else {
            return -1;
        };
        let watch_id = if req.watch_id != 0 {
            if watches.ids.contains_key(&req.watch_id) {
                return refuse(-1, CANCEL_REASON_DUPLICATE_ID);
            }
            req.watch_id
        } else {
            // etcd: a per-stream counter from 0 that skips ids in use and never goes back.
            while watches.ids.contains_key(&watches.next_id) {
                watches.next_id += 1;
            }
            let id = watches.next_id;
            watches.next_id += 1;
            id
        };
        let id = state.next_watcher;
        state.next_watcher += 1;
        if let Some(watches) = state.streams.get_mut(&stream) {
            watches.ids.insert(watch_id, id);
        }
        let counter = Arc::new(AtomicUsize::new(0));
        sync::lock(pending).insert(id, counter.clone());
        let caught_up = req.start_revision == 0 || req.start_revision > published;
        let start_rev = req.start_revision.max(published + 1);
        let watcher = Watcher {
            id,
            stream,
            watch_id,
            key,
            end: req.range_end,
            next_rev: if caught_up {
                start_rev
            } else {
                req.start_revision
            },
            start_rev: req.start_revision,
            prev_kv: req.prev_kv,
            no_put: req.no_put,
            no_delete: req.no_delete,
            progress_notify: req.progress_notify,
            synced: false,
            sent_since_tick: false,
            pending: counter,
            queue: queue.clone(),
        };
        watcher.control(WatchResponse {
            header,
            watch_id,
            created: true,
            ..WatchResponse::default()
        });
        state.watchers.insert(id, watcher);
        if caught_up {
            state.join_synced(id);
        } else if req.start_revision < compact_revision {
            // WATCH-4, at creation: etcd sends created, then the compacted cancel.
            cancel_compacted(&mut state, id, compact_revision);
        } else {
            state.unsynced.insert(id);
            let _ = self.wake.try_send(());
        }
        watch_id
    }

    /// Cancels watch `watch_id` of `stream`; answers with a canceled response if it existed.
    fn cancel(&self, stream: u64, watch_id: i64) {
        let mut state = sync::lock(&self.state);
        let header = ResponseHeader {
            revision: state.published,
        };
        let Some(id) = state
            .streams
            .get(&stream)
            .and_then(|s| s.ids.get(&watch_id))
            .copied()
        else {
            return;
        };
        if let Some(w) = state.remove(id) {
            w.control(WatchResponse {
                header,
                watch_id,
                canceled: true,
                ..WatchResponse::default()
            });
        }
    }

    /// Answers a progress request: the current revision, if every watch of the stream is
    /// synced (etcd 3.5.8+), else nothing.
    fn progress(&self, stream: u64, queue: &DeliveryQueue<Delivery>) {
        let state = sync::lock(&self.state);
        let all_synced = state.streams.get(&stream).is_some_and(|s| {
            s.ids
                .values()
                .all(|id| state.watchers.get(id).is_some_and(|w| w.synced))
        });
        if all_synced {
            let response = WatchResponse {
                header: ResponseHeader {
                    revision: state.published,
                },
                watch_id: -1,
                ..WatchResponse::default()
            };
            queue.push(Delivery {
                response,
                shared: None,
                wants_prev_kv: false,
                counted: None,
            });
        }
    }

    /// Drops every watch of `stream`.
    fn close_stream(&self, stream: u64) {
        let mut state = sync::lock(&self.state);
        let ids: Vec<u64> = state
            .streams
            .remove(&stream)
            .map(|s| s.ids.into_values().collect())
            .unwrap_or_default();
        for id in ids {
            state.remove(id);
        }
    }

    /// Returns the number of watchers.
    pub fn watchers(&self) -> usize {
        sync::lock(&self.state).watchers.len()
    }

    /// Wakes the sync thread's wait now (the engine is stopping: it then sees the flag at
    /// once instead of after its interval).
    pub fn wake_sync_thread(&self) {
        let _ = self.wake.try_send(());
    }

    /// Waits until a watcher falls behind or `timeout` passes.
    pub fn wait_for_work(&self, timeout: Duration) -> bool {
        match self.wakeups.recv_timeout(timeout) {
            Ok(()) => true,
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => false,
        }
    }

    /// Feeds unsynced watchers from the history: one catch-up step each for up to
    /// `WATCH_SYNC_WATCHERS_PER_PASS` of them.
    pub fn sync_pass(
        &self,
        store: &Store,
        index: &RwLock<Index>,
    ) -> Result<SyncPass, StorageError> {
        let ids: Vec<u64> = sync::lock(&self.state)
            .unsynced
            .iter()
            .take(WATCH_SYNC_WATCHERS_PER_PASS)
            .copied()
            .collect();
        let mut progressed = false;
        for id in ids {
            progressed |= self.catch_up(id, store, index)?;
        }
        let behind = !sync::lock(&self.state).unsynced.is_empty();
        Ok(SyncPass { progressed, behind })
    }

    /// One catch-up step of watcher `id`: join the synced set if caught up, else read one
    /// chunk of history up to the published revision and deliver it. Returns true if the
    /// watcher moved (joined, advanced or was canceled), false if it could not.
    fn catch_up(
        &self,
        id: u64,
        store: &Store,
        index: &RwLock<Index>,
    ) -> Result<bool, StorageError> {
        let (key, end, next_rev, published) = {
            let mut state = sync::lock(&self.state);
            let published = state.published;
            let Some(w) = state.watchers.get(&id) else {
                return Ok(false);
            };
            if w.pending.load(Ordering::Acquire) >= WATCH_PENDING_RESPONSES_MAX {
                return Ok(false); // Still slow: try again on a later pass.
            }
            if w.next_rev > published {
                state.join_synced(id);
                return Ok(true);
            }
            (w.key.clone(), w.end.clone(), w.next_rev, published)
        };
        // ENG-3's rule: check the compaction revision and open the snapshot under the index
        // lock, so no record at or above the check can be deleted under the snapshot.
        let snapshot = {
            let index = sync::read(index);
            if next_rev < index.compact_revision {
                let compact = index.compact_revision;
                drop(index);
                cancel_compacted(&mut sync::lock(&self.state), id, compact);
                return Ok(true);
            }
            store.snapshot()?
        };
        let range = KeyRange::new(&key, &end);
        let from = Revision::new(next_rev, 0).to_key();
        let to = Revision::new(published.saturating_add(1), 0).to_key();
        let mut events = Vec::new();
        let mut last_main = next_rev - 1;
        let mut reached_end = true;
        let mut records = 0;
        snapshot.scan_history(
            (Bound::Included(from), Bound::Excluded(to)),
            usize::MAX,
            |k, value| {
                let rev = Revision::from_key(k);
                // Stop at a revision boundary once the chunk is full, never inside a revision.
                if records >= WATCH_CATCH_UP_RECORDS && rev.main != last_main {
                    reached_end = false;
                    return Ok(false);
                }
                records += 1;
                last_main = rev.main;
                let head = Record::decode_head(k, value)?;
                if range.contains(head.key) {
                    events.push(event_of(head.record_in(value), rev.main));
                }
                Ok(true)
            },
        )?;
        drop(snapshot);
        let delivered_up_to = if reached_end { published } else { last_main };
        let mut state = sync::lock(&self.state);
        let Some(w) = state.watchers.get_mut(&id) else {
            return Ok(false);
        };
        let events: Vec<Event> = events
            .into_iter()
            .filter(|e| e.kv.mod_revision >= w.start_rev && w.wants(e))
            .collect();
        if !events.is_empty() {
            let response = WatchResponse {
                header: ResponseHeader {
                    revision: published,
                },
                watch_id: w.watch_id,
                events,
                ..WatchResponse::default()
            };
            if !w.offer(response, None, None) {
                return Ok(false); // No room after all: retry the same chunk later.
            }
        }
        w.next_rev = delivered_up_to + 1;
        Ok(true)
    }

    /// Sends a progress response to every synced watcher with `progress_notify` that got
    /// nothing since the last tick.
    pub fn progress_tick(&self) {
        let mut state = sync::lock(&self.state);
        let header = ResponseHeader {
            revision: state.published,
        };
        for w in state.watchers.values_mut() {
            if w.synced && w.progress_notify && !w.sent_since_tick {
                w.control(WatchResponse {
                    header,
                    watch_id: w.watch_id,
                    ..WatchResponse::default()
                });
            }
            w.sent_since_tick = false;
        }
    }
}

/// What [`give_live`] did with a revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Given {
    /// Queued, or not wanted (filtered, or before the watcher's start).
    Done,
    /// No room (WATCH-3): the watcher must catch up from history from this revision.
    NoRoom,
}

/// Gives synced watcher `w` its pick of live revision `rev`'s shared events (WATCH-6).
fn give_live(
    w: &mut Watcher,
    rev: i64,
    shared: &Arc<[Event]>,
    picked: Picked,
    wakes: &mut Vec<Waker>,
) -> Given {
    if rev < w.start_rev {
        return Given::Done;
    }
    debug_assert!(w.next_rev <= rev, "WATCH-2: revision {rev} given twice");
    // `matching_watchers` already made a pick of every change `All`; only the put/delete
    // filters can narrow it.
    let picked = if w.no_put || w.no_delete {
        picked.retain(shared, |e| w.wants(e))
    } else {
        Some(picked)
    };
    let Some(picked) = picked else {
        w.next_rev = rev + 1;
        return Given::Done;
    };
    let response = WatchResponse {
        header: ResponseHeader { revision: rev },
        watch_id: w.watch_id,
        ..WatchResponse::default()
    };
    if w.offer(response, Some((shared.clone(), picked)), Some(wakes)) {
        w.next_rev = rev + 1;
        Given::Done
    } else {
        w.next_rev = rev;
        Given::NoRoom
    }
}

fn cancel_compacted(state: &mut HubState, id: u64, compact_revision: i64) {
    if let Some(w) = state.remove(id) {
        w.control(WatchResponse {
            watch_id: w.watch_id,
            canceled: true,
            compact_revision,
            ..WatchResponse::default()
        });
    }
}

/// Returns the synced watchers of `changes` (WATCH-5) in id order, each once, with the
/// positions of the changes it watches; a watcher of every change gets [`Picked::All`].
fn matching_watchers(state: &HubState, changes: &[Change]) -> Vec<(u64, Picked)> {
    let mut picks: Vec<(u64, u32)> = Vec::new();
    for (position, change) in (0u32..).zip(changes) {
        if let Some(ids) = state.by_key.get(&change.kv().key) {
            picks.extend(ids.iter().map(|id| (*id, position)));
        }
        for ((key, end), ids) in &state.by_range {
            if KeyRange::new(key, end).contains(&change.kv().key) {
                picks.extend(ids.iter().map(|id| (*id, position)));
            }
        }
    }
    // One set's ids come in id order, which the sort finds sorted in one pass. A watcher
    // is in one set only, so no (id, position) comes twice.
    picks.sort_unstable();
    let mut out: Vec<(u64, Picked)> = Vec::new();
    for (id, position) in picks {
        match out.last_mut() {
            Some((last, picked)) if *last == id => picked.push(position),
            _ => out.push((id, Picked::One(position))),
        }
    }
    let every = changes.len();
    for (_, picked) in &mut out {
        let whole = match picked {
            Picked::One(_) => every == 1,
            Picked::Many(positions) => positions.len() == every,
            Picked::All => true,
        };
        if whole {
            *picked = Picked::All;
        }
    }
    out
}

fn event_of_change(change: &Change) -> Event {
    match change {
        Change::Put(kv) => Event {
            kind: EventType::Put,
            kv: kv.clone(),
            prev_kv: None,
        },
        Change::Delete(kv) => Event {
            kind: EventType::Delete,
            kv: kv.clone(),
            prev_kv: None,
        },
    }
}

fn event_of(record: Record, main: i64) -> Event {
    if record.tombstone {
        let kv = KeyValue {
            key: record.key,
            mod_revision: main,
            ..KeyValue::default()
        };
        Event {
            kind: EventType::Delete,
            kv,
            prev_kv: None,
        }
    } else {
        Event {
            kind: EventType::Put,
            kv: record.into_key_value(main),
            prev_kv: None,
        }
    }
}

/// A stream of watches (etcd's Watch RPC stream): create and cancel watches, receive their
/// responses in order. Dropping it cancels every watch on it.
#[derive(Debug)]
pub struct WatchStream {
    hub: Arc<Hub>,
    stream: u64,
    queue: Arc<DeliveryQueue<Delivery>>,
    pending: Mutex<BTreeMap<u64, Arc<AtomicUsize>>>,
    engine: crate::sync::Weak<dyn WatchSource>,
}

/// What a stream needs from the engine: the compaction revision, and reads of previous
/// key-values.
pub trait WatchSource: Send + Sync + std::fmt::Debug {
    /// Returns the compaction revision.
    fn compact_revision(&self) -> i64;
    /// Returns `key` at `revision`, or `None` if absent or compacted.
    fn kv_at(&self, key: &Bytes, revision: i64) -> Option<KeyValue>;
}

impl WatchStream {
    /// Opens a stream on `hub`.
    pub fn new(hub: Arc<Hub>, engine: crate::sync::Weak<dyn WatchSource>) -> WatchStream {
        let stream = hub.open_stream();
        WatchStream {
            hub,
            stream,
            queue: Arc::new(DeliveryQueue::default()),
            pending: Mutex::new(BTreeMap::new()),
            engine,
        }
    }

    /// Creates a watch; returns its id (-1 if refused). The created (or refused) response
    /// is the first one this watch puts on the stream.
    pub fn create(&self, req: WatchCreateRequest) -> Result<i64, Error> {
        let engine = self.engine.upgrade().ok_or(Error::Closed)?;
        let compact = engine.compact_revision();
        Ok(self
            .hub
            .create(self.stream, &self.queue, &self.pending, req, compact))
    }

    /// Cancels a watch; a canceled response follows if it existed.
    pub fn cancel(&self, watch_id: i64) {
        self.hub.cancel(self.stream, watch_id);
    }

    /// Asks for a progress response (sent only if every watch of the stream is synced).
    pub fn request_progress(&self) {
        self.hub.progress(self.stream, &self.queue);
    }

    /// Returns the next response, waiting at most `timeout`; `Ok(None)` on timeout.
    /// `Err(Closed)` once the engine is closed and nothing is left to receive.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Option<WatchResponse>, Error> {
        match self.queue.pop_timeout(timeout) {
            Some(delivery) => Ok(Some(self.finish(delivery))),
            None => self.open().map(|()| None),
        }
    }

    /// Returns the number of responses waiting on this stream (bounded by WATCH-3 per
    /// watch, plus control responses).
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Returns the next response if one is ready.
    pub fn try_recv(&self) -> Result<Option<WatchResponse>, Error> {
        match self.queue.pop() {
            Some(delivery) => Ok(Some(self.finish(delivery))),
            None => self.open().map(|()| None),
        }
    }

    /// Returns the next response, or registers `cx` to be woken when one arrives
    /// (WATCHQ-2): the asynchronous receive, which holds no thread while it waits. One
    /// consumer at a time. `Err(Closed)` once the engine is closed and nothing is left.
    pub fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Result<WatchResponse, Error>> {
        match self.queue.poll_pop(cx) {
            Poll::Ready(delivery) => Poll::Ready(Ok(self.finish(delivery))),
            Poll::Pending => match self.open() {
                Ok(()) => Poll::Pending,
                Err(err) => Poll::Ready(Err(err)),
            },
        }
    }

    /// `Err(Closed)` if the engine behind this stream is gone.
    fn open(&self) -> Result<(), Error> {
        match self.engine.upgrade() {
            Some(_) => Ok(()),
            None => Err(Error::Closed),
        }
    }

    fn finish(&self, delivery: Delivery) -> WatchResponse {
        let mut response = delivery.response;
        if let Some((events, picked)) = &delivery.shared {
            response.events = picked.copy(events);
        }
        if let Some(watcher) = delivery.counted {
            let mut pending = sync::lock(&self.pending);
            if response.canceled {
                // The watcher is gone: its last response.
                pending.remove(&watcher);
            } else if let Some(counter) = pending.get(&watcher) {
                let _ =
                    counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
            }
        }
        if delivery.wants_prev_kv
            && let Some(engine) = self.engine.upgrade()
        {
            for event in &mut response.events {
                // etcd: no previous value for the Put that created the key.
                let created = event.kind == EventType::Put
                    && event.kv.create_revision == event.kv.mod_revision;
                if !created {
                    event.prev_kv = engine.kv_at(&event.kv.key, event.kv.mod_revision - 1);
                }
            }
        }
        response
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        self.hub.close_stream(self.stream);
    }
}
