//! One connection's requests, run inside the connection's own task a few at a time, so that
//! the runtime serves connections in turn rather than requests in arrival order.
//!
//! hyper hands every HTTP/2 stream (a gRPC call) to an executor. With the runtime as the
//! executor, each call is a task of its own, and the runtime runs ready tasks first come,
//! first served: a tenant with a thousand calls in flight puts a thousand tasks ahead of a
//! polite tenant's one, and when the server's CPU is the bottleneck the polite call waits
//! for all of them before it even reaches the prepare queue. Here the executor is the
//! connection: [`StreamExecutor`] queues each call's future on its connection's
//! [`Streams`], which the connection's task polls beside the HTTP/2 connection itself, at
//! most [`POLLS_PER_TURN`] call polls before it yields to the runtime.
//!
//! Invariants:
//! - FAIR-1: a call's future is polled only after its waker fired (or once when it
//!   arrives), and every wake is eventually followed by a poll while the connection task
//!   runs: a woken call is queued once, and a turn that leaves queued calls wakes its own
//!   task before it yields.
//! - FAIR-2: one turn polls at most [`POLLS_PER_TURN`] calls, so a connection with many
//!   ready calls holds the runtime for a bounded stretch before other connections' turns.
//! - FAIR-3: a call's future is dropped when it completes or when its connection's task
//!   ends (the connection closed: its calls can no longer answer).
//! - FAIR-4: a call polled while more calls of its connection are ready is polled inside
//!   `kvd::in_burst`, so a write it submits is never applied inline in this thread
//!   (the engine's APPLY-5): the writes of one turn share a batch and a log sync, where
//!   inline each would wait for the sync of the one before it.
//!
//! Contact points: `server::connections` builds each connection's HTTP server with a
//! [`StreamExecutor`] and polls the [`Streams`] in the connection's select loop.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Wake, Waker};

use kvd::sync::{Arc, Mutex, lock};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// Call polls one turn may make (FAIR-2).
pub const POLLS_PER_TURN: usize = 8;

type Call = Pin<Box<dyn Future<Output = ()> + Send>>;

/// hyper's executor for one connection: queues each call on the connection's [`Streams`].
#[derive(Clone, Debug)]
pub struct StreamExecutor {
    calls: UnboundedSender<Call>,
}

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, call: F) {
        if let Err(refused) = self.calls.send(Box::pin(call)) {
            // The connection's task has ended (FAIR-3): nothing can answer this call any
            // more, so it is dropped as the runtime would drop it at shutdown.
            drop(refused);
        }
    }
}

/// The calls of one connection, polled in turns by the connection's task.
pub struct Streams {
    arriving: UnboundedReceiver<Call>,
    /// Slot `i` holds call `i` until it completes; completed slots are reused.
    calls: Vec<Option<Call>>,
    /// The waker of each slot, made once.
    wakers: Vec<Waker>,
    free: Vec<usize>,
    wakes: Arc<Wakes>,
}

impl std::fmt::Debug for Streams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streams")
            .field("calls", &(self.calls.len() - self.free.len()))
            .finish()
    }
}

/// Which calls were woken, shared with their wakers.
#[derive(Default)]
struct Wakes {
    state: Mutex<WakeState>,
}

#[derive(Default)]
struct WakeState {
    /// Woken calls in wake order, each at most once (FAIR-1).
    ready: VecDeque<usize>,
    queued: Vec<bool>,
    /// The connection task's waker, from its latest turn.
    task: Option<Waker>,
}

/// The waker of call `slot`.
struct CallWaker {
    slot: usize,
    wakes: Arc<Wakes>,
}

impl Wake for CallWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let task = {
            let mut state = lock(&self.wakes.state);
            mark_ready(&mut state, self.slot);
            state.task.clone()
        };
        if let Some(task) = task {
            task.wake();
        }
    }
}

fn mark_ready(state: &mut WakeState, slot: usize) {
    if state.queued.len() <= slot {
        state.queued.resize(slot + 1, false);
    }
    if !state.queued[slot] {
        state.queued[slot] = true;
        state.ready.push_back(slot);
    }
}

/// Returns a connection's executor and the calls it queues.
pub fn streams() -> (StreamExecutor, Streams) {
    let (calls, arriving) = unbounded_channel();
    let streams = Streams {
        arriving,
        calls: Vec::new(),
        wakers: Vec::new(),
        free: Vec::new(),
        wakes: Arc::new(Wakes::default()),
    };
    (StreamExecutor { calls }, streams)
}

impl Streams {
    /// Runs one turn (FAIR-2): takes the calls that arrived, polls at most
    /// [`POLLS_PER_TURN`] woken ones, and is ready once it polled any, so the caller can
    /// yield to the runtime before the next turn; ready with true if woken calls still wait
    /// for the next turn. Pending when nothing was woken.
    pub fn poll_turn(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        lock(&self.wakes.state).task = Some(cx.waker().clone());
        while let Poll::Ready(Some(call)) = self.arriving.poll_recv(cx) {
            let slot = match self.free.pop() {
                Some(slot) => {
                    self.calls[slot] = Some(call);
                    slot
                }
                None => {
                    let slot = self.calls.len();
                    self.calls.push(Some(call));
                    self.wakers.push(Waker::from(Arc::new(CallWaker {
                        slot,
                        wakes: self.wakes.clone(),
                    })));
                    slot
                }
            };
            mark_ready(&mut lock(&self.wakes.state), slot);
        }
        let mut polled = 0;
        while polled < POLLS_PER_TURN {
            let (slot, more_ready) = {
                let mut state = lock(&self.wakes.state);
                let Some(slot) = state.ready.pop_front() else {
                    break;
                };
                state.queued[slot] = false;
                (slot, !state.ready.is_empty())
            };
            let Some(call) = self.calls[slot].as_mut() else {
                continue;
            };
            polled += 1;
            let mut call_cx = Context::from_waker(&self.wakers[slot]);
            // FAIR-4: with more calls ready behind this one, a write it submits waits for
            // theirs in the apply thread's batch instead of taking its own sync here.
            let poll = if more_ready {
                kvd::in_burst(|| call.as_mut().poll(&mut call_cx))
            } else {
                call.as_mut().poll(&mut call_cx)
            };
            if poll.is_ready() {
                self.calls[slot] = None;
                self.free.push(slot);
            }
        }
        if polled == 0 {
            return Poll::Pending;
        }
        let more_ready = !lock(&self.wakes.state).ready.is_empty();
        if more_ready {
            // FAIR-1: calls are still queued; come back after other tasks had their turn.
            cx.waker().wake_by_ref();
        }
        Poll::Ready(more_ready)
    }

    /// Waits for and runs the next turn; returns true if woken calls still wait for the
    /// next one.
    pub async fn turn(&mut self) -> bool {
        std::future::poll_fn(|cx| self.poll_turn(cx)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Executor;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn every_call_runs_to_completion_a_bounded_number_per_turn() {
        let (executor, mut streams) = streams();
        let done = Arc::new(AtomicUsize::new(0));
        let calls = POLLS_PER_TURN * 3 + 1;
        let (release, released) = tokio::sync::watch::channel(false);
        for _ in 0..calls {
            let (done, mut released) = (done.clone(), released.clone());
            executor.execute(async move {
                released.wait_for(|go| *go).await.expect("the sender lives");
                done.fetch_add(1, Ordering::SeqCst);
            });
        }
        // First turns: each call polled once (parked on the watch), at most a turn's worth
        // at a time.
        let mut turns = Vec::new();
        while let Poll::Ready(more_ready) =
            std::future::poll_fn(|cx| Poll::Ready(streams.poll_turn(cx))).await
        {
            turns.push(more_ready);
        }
        assert_eq!(turns.len(), calls.div_ceil(POLLS_PER_TURN));
        assert!(
            turns
                .split_last()
                .is_some_and(|(last, before)| !last && before.iter().all(|m| *m)),
            "every turn but the last leaves calls ready: {turns:?}"
        );
        assert_eq!(done.load(Ordering::SeqCst), 0);
        release.send(true).expect("calls listen");
        while done.load(Ordering::SeqCst) < calls {
            tokio::time::timeout(std::time::Duration::from_secs(5), streams.turn())
                .await
                .expect("a woken call is polled (FAIR-1)");
        }
        assert_eq!(
            streams.calls.len() - streams.free.len(),
            0,
            "completed calls are dropped"
        );
    }
    #[tokio::test]
    async fn a_call_with_more_ready_behind_it_is_polled_as_part_of_a_burst() {
        let (executor, mut streams) = streams();
        let seen = Arc::new(Mutex::new(Vec::new()));
        for call in 0..3 {
            let seen = seen.clone();
            executor.execute(async move {
                lock(&seen).push((call, kvd::burst_hinted()));
            });
        }
        streams.turn().await;
        // FAIR-4: the first two had a ready call behind them, the last had none; and the
        // hint ends with the poll.
        assert_eq!(*lock(&seen), [(0, true), (1, true), (2, false)]);
        assert!(!kvd::burst_hinted());
    }
}
