//! The threads that serve client connections: one single-threaded tokio runtime per CPU,
//! each serving whole connections, instead of one work-stealing runtime shared by all.
//!
//! Why: in tokio's work-stealing runtime a worker that finds work wakes another parked
//! worker so that it may steal ("the last searching worker notifies one more"), and a task
//! scheduled while the worker's next-task slot is taken does the same. With one client
//! doing one call at a time there is nothing to steal, yet every call woke the other worker
//! about 1.9 times: etcd's benchmark with one client measured 4.9 voluntary context
//! switches per put across the server's threads, 3.1 with connections on these threads, and
//! the server's CPU per put fell by about 15 %. A connection is one task whose unary calls
//! are polled inside it, its long streams tasks of their own on the same thread (CONN-7),
//! so stealing could only ever move whole connections between workers; placing each
//! connection on a thread when it is accepted gives the same spread without the wake-ups.
//!
//! Invariants:
//! - THREAD-1: a connection's task, its calls and every task they spawn run on the one
//!   connection thread its connection was given when accepted; the thread runs a
//!   current-thread runtime, so waking a task of its own never wakes another thread.
//! - THREAD-2: a new connection goes to the thread with the fewest open connections (the
//!   lowest index among equals); a connection counts from its placement until its task
//!   ends or is dropped.
//! - THREAD-3: [`ConnectionThreads::stop`] ends every thread's runtime (tasks still there
//!   are dropped, blocking calls get at most [`crate::SHUTDOWN_BLOCKING_MAX`]) and joins the
//!   threads, so no connection outlives the server's shutdown.
//! - THREAD-4: [`alone_here`] is true only on a connection thread whose count of open
//!   connections (THREAD-2) is at most one; on every other thread it is false.
//! - THREAD-5: while a connection thread answers calls with `ResourceExhausted` (the
//!   prepare queue refusing writes, or the space quota; [`note_answer`]; the last one
//!   within [`OVERLOAD_WINDOW`]), it offers its CPU ([`share_cpu`], `sched_yield`) at the
//!   end of a connection's turn once it has run [`SHARE_CPU_AFTER`] since it last woke or
//!   offered it. Otherwise it never does. Why: a connection thread serving a flood runs
//!   until the scheduler's next tick (4 ms at 250 Hz) while the apply thread, woken by its
//!   log sync or a new write on the same CPU, waits for it; those waits were most of a
//!   polite tenant's tail beside a flood (`perf sched`, `docs/benchmarks-features.md`).
//!   Below overload the yield is not made: in etcd's 64-client put benchmark it cost about
//!   3 % more CPU per put.
//!
//! Contact points: `server::run` starts the threads before serving and stops them after;
//! `server::connections` places each accepted connection with [`ConnectionThreads::spawn`].

use std::cell::{Cell, OnceCell};
use std::future::Future;
use std::io;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvd::sync::{Arc, AtomicUsize, Mutex, Ordering, lock};
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::{AbortHandle, JoinSet};

use crate::{BLOCKING_THREADS_MAX, RUNTIME_POLL_INTERVAL, SHUTDOWN_BLOCKING_MAX};

thread_local! {
    /// On a connection thread, its count of open connections (THREAD-2); unset elsewhere.
    static OPEN_HERE: OnceCell<Arc<AtomicUsize>> = const { OnceCell::new() };
    /// On a connection thread, when it last woke or offered its CPU (THREAD-5).
    static RUNNING_SINCE: Cell<Option<Instant>> = const { Cell::new(None) };
    /// When this thread last answered a write refused for overload (THREAD-5).
    static OVERLOADED_AT: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// How long a connection thread runs without sleeping, while it refuses writes for
/// overload, before it offers its CPU to the threads waiting for one (THREAD-5).
pub const SHARE_CPU_AFTER: Duration = Duration::from_micros(500);

/// How long after its last refusal for overload a thread keeps offering its CPU (THREAD-5).
pub const OVERLOAD_WINDOW: Duration = Duration::from_secs(1);

/// Records, if `code` is `ResourceExhausted` (a write refused for overload, or for space),
/// that this thread is overloaded (THREAD-5). Called with the code of every gRPC and
/// gateway answer.
pub fn note_answer(code: tonic::Code) {
    if code == tonic::Code::ResourceExhausted {
        OVERLOADED_AT.set(Some(Instant::now()));
    }
}

/// Offers the CPU to other runnable threads if this connection thread is overloaded and has
/// run [`SHARE_CPU_AFTER`] since it last woke or offered it (THREAD-5). Costs one
/// thread-local read when there is no overload.
pub fn share_cpu() {
    let Some(overloaded_at) = OVERLOADED_AT.get() else {
        return;
    };
    match sharing(Instant::now(), RUNNING_SINCE.get(), overloaded_at) {
        Sharing::Over => OVERLOADED_AT.set(None),
        Sharing::Keep => {}
        Sharing::Offer => {
            std::thread::yield_now();
            RUNNING_SINCE.set(Some(Instant::now()));
        }
    }
}

/// What [`share_cpu`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sharing {
    /// The overload is over: forget it.
    Over,
    /// Keep the CPU.
    Keep,
    /// Offer the CPU.
    Offer,
}

/// Decides THREAD-5 at `now` for a thread running since `running_since` (`None`: not a
/// connection thread) that last refused a write for overload at `overloaded_at`.
fn sharing(now: Instant, running_since: Option<Instant>, overloaded_at: Instant) -> Sharing {
    if now.saturating_duration_since(overloaded_at) > OVERLOAD_WINDOW {
        return Sharing::Over;
    }
    match running_since {
        Some(since) if now.saturating_duration_since(since) >= SHARE_CPU_AFTER => Sharing::Offer,
        _ => Sharing::Keep,
    }
}

/// Returns true if the caller runs on a connection thread that serves one connection at
/// most (THREAD-4): a connection's task then has no other connection to yield to. False
/// on any other thread.
pub fn alone_here() -> bool {
    OPEN_HERE.with(|here| {
        here.get()
            .is_some_and(|open| open.load(Ordering::Relaxed) <= 1)
    })
}

/// The connection threads of one server.
#[derive(Debug)]
pub struct ConnectionThreads {
    threads: Vec<Thread>,
    /// The stop signals and the threads to join; emptied by [`ConnectionThreads::stop`].
    running: Mutex<Vec<(oneshot::Sender<()>, JoinHandle<()>)>>,
}

#[derive(Debug)]
struct Thread {
    runtime: Handle,
    /// Connections placed here whose task has not ended (THREAD-2).
    open: Arc<AtomicUsize>,
}

/// Decrements its thread's count of open connections when the connection's task ends or
/// is dropped (THREAD-2).
struct Placed(Arc<AtomicUsize>);

impl Drop for Placed {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ConnectionThreads {
    /// Starts `count` connection threads (at least one). Their blocking pools share
    /// [`BLOCKING_THREADS_MAX`] between them.
    pub fn start(count: usize) -> io::Result<ConnectionThreads> {
        let count = count.max(1);
        let blocking_max = (BLOCKING_THREADS_MAX / count).max(1);
        let mut threads = Vec::with_capacity(count);
        let mut running = Vec::with_capacity(count);
        for index in 0..count {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .max_blocking_threads(blocking_max)
                .thread_name(format!("kvd-conn-{index}"))
                .event_interval(RUNTIME_POLL_INTERVAL)
                .global_queue_interval(RUNTIME_POLL_INTERVAL)
                .on_thread_unpark(|| RUNNING_SINCE.set(Some(Instant::now())))
                .build()?;
            let (stop, stopped) = oneshot::channel::<()>();
            let open = Arc::new(AtomicUsize::new(0));
            threads.push(Thread {
                runtime: runtime.handle().clone(),
                open: open.clone(),
            });
            let joined = std::thread::Builder::new()
                .name(format!("kvd-conn-{index}"))
                .spawn(move || {
                    OPEN_HERE.with(|here| {
                        here.get_or_init(|| open);
                    });
                    // A dropped sender also means stop (THREAD-3).
                    let _ = runtime.block_on(stopped);
                    runtime.shutdown_timeout(SHUTDOWN_BLOCKING_MAX);
                })?;
            running.push((stop, joined));
        }
        Ok(ConnectionThreads {
            threads,
            running: Mutex::new(running),
        })
    }

    /// Returns one thread per CPU this process may use, as `std` counts them.
    pub fn per_cpu() -> usize {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    }

    /// Runs `task` on the thread with the fewest open connections (THREAD-2), in `tasks`.
    /// The task is polled there from the start, so anything it binds to a runtime (a
    /// socket turned into a tokio stream, a timer) binds to that thread's.
    pub fn spawn<F>(&self, tasks: &mut JoinSet<()>, task: F) -> AbortHandle
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Some(thread) = self
            .threads
            .iter()
            .min_by_key(|t| t.open.load(Ordering::Relaxed))
        else {
            // `start` makes at least one thread; without any, the connection would be
            // served where it was accepted.
            return tasks.spawn(task);
        };
        thread.open.fetch_add(1, Ordering::Relaxed);
        let placed = Placed(thread.open.clone());
        tasks.spawn_on(
            async move {
                let _placed = placed;
                task.await;
            },
            &thread.runtime,
        )
    }

    /// Returns each thread's count of open connections, in thread order.
    #[cfg(test)]
    fn open_connections(&self) -> Vec<usize> {
        self.threads
            .iter()
            .map(|t| t.open.load(Ordering::Relaxed))
            .collect()
    }

    /// Ends every thread's runtime and joins the threads (THREAD-3). Later calls do nothing.
    pub fn stop(&self) {
        let running = std::mem::take(&mut *lock(&self.running));
        let mut joins = Vec::with_capacity(running.len());
        for (stop, joined) in running {
            // The thread may have ended already; its runtime is then gone too.
            let _ = stop.send(());
            joins.push(joined);
        }
        for joined in joins {
            if joined.join().is_err() {
                tracing::error!("a connection thread panicked");
            }
        }
    }
}

impl Drop for ConnectionThreads {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_is_offered_only_under_recent_overload_after_a_long_run() {
        let start = Instant::now();
        let at = |us: u64| start + Duration::from_micros(us);
        let after = SHARE_CPU_AFTER.as_micros() as u64;
        let window = OVERLOAD_WINDOW.as_micros() as u64;
        // Overloaded, running long enough: offer.
        assert_eq!(sharing(at(after), Some(at(0)), at(0)), Sharing::Offer);
        assert_eq!(sharing(at(after + 10), Some(at(0)), at(5)), Sharing::Offer);
        // Overloaded, but woke or offered the CPU too recently: keep it.
        assert_eq!(sharing(at(after - 1), Some(at(0)), at(0)), Sharing::Keep);
        // Not a connection thread: never offers.
        assert_eq!(sharing(at(after * 10), None, at(0)), Sharing::Keep);
        // The last refusal is older than the window: the overload is over.
        assert_eq!(sharing(at(window + 1), Some(at(0)), at(0)), Sharing::Over);
        assert_eq!(sharing(at(window), Some(at(0)), at(0)), Sharing::Offer);
    }

    #[test]
    fn share_cpu_forgets_an_old_overload_and_restarts_the_run_after_offering() {
        std::thread::spawn(|| {
            // No overload: a long run keeps the CPU, so its start is left as it was.
            let long_ago = Instant::now() - SHARE_CPU_AFTER * 4;
            RUNNING_SINCE.set(Some(long_ago));
            share_cpu();
            assert_eq!(
                RUNNING_SINCE.get(),
                Some(long_ago),
                "no offer without overload"
            );
            assert_eq!(OVERLOADED_AT.get(), None);
            // A recent refusal and a long run: the CPU is offered and the run starts again.
            note_answer(tonic::Code::Ok);
            assert_eq!(
                OVERLOADED_AT.get(),
                None,
                "only a refusal for overload counts"
            );
            note_answer(tonic::Code::ResourceExhausted);
            share_cpu();
            let restarted = RUNNING_SINCE.get().expect("set");
            assert!(restarted > long_ago, "the run restarts after the offer");
            assert!(OVERLOADED_AT.get().is_some());
            // A refusal older than the window is forgotten.
            OVERLOADED_AT.set(Some(Instant::now() - OVERLOAD_WINDOW * 2));
            share_cpu();
            assert_eq!(OVERLOADED_AT.get(), None);
            assert_eq!(RUNNING_SINCE.get(), Some(restarted));
        })
        .join()
        .expect("the test thread");
    }

    /// Runs `f` on a current-thread runtime of the test's own.
    fn on_runtime<T>(f: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    /// Places a connection that sends its thread's name, then waits for `released`.
    async fn place(
        threads: &ConnectionThreads,
        tasks: &mut JoinSet<()>,
        released: oneshot::Receiver<()>,
    ) -> Option<String> {
        let (name, named) = oneshot::channel();
        threads.spawn(tasks, async move {
            let _ = name.send(std::thread::current().name().map(str::to_owned));
            let _ = released.await;
        });
        named.await.expect("the task runs")
    }

    #[test]
    fn connections_go_to_the_thread_with_the_fewest_and_run_there() {
        let threads = ConnectionThreads::start(2).expect("start");
        on_runtime(async {
            let mut tasks = JoinSet::new();
            let mut releases = Vec::new();
            let mut seen = Vec::new();
            for _ in 0..3 {
                let (release, released) = oneshot::channel();
                releases.push(release);
                seen.push(place(&threads, &mut tasks, released).await);
            }
            let expected = ["kvd-conn-0", "kvd-conn-1", "kvd-conn-0"];
            assert_eq!(seen, expected.map(|n| Some(n.to_owned())));
            assert_eq!(threads.open_connections(), [2, 1]);
            // The second connection on thread 0 ends: thread 0 is among the least loaded
            // again, and the lowest index wins the tie.
            releases.remove(2).send(()).expect("the task waits");
            tasks.join_next().await.expect("a task").expect("it ended");
            assert_eq!(threads.open_connections(), [1, 1]);
            let (release, released) = oneshot::channel();
            let fourth = place(&threads, &mut tasks, released).await;
            assert_eq!(fourth.as_deref(), Some("kvd-conn-0"));
            drop((releases, release));
            while tasks.join_next().await.is_some() {}
            assert_eq!(threads.open_connections(), [0, 0]);
        });
    }

    /// Places a connection that reports [`alone_here`] once `ask` fires, then waits for
    /// `released`.
    async fn place_asking(
        threads: &ConnectionThreads,
        tasks: &mut JoinSet<()>,
        ask: oneshot::Receiver<()>,
        released: oneshot::Receiver<()>,
    ) -> oneshot::Receiver<bool> {
        let (answer, answered) = oneshot::channel();
        threads.spawn(tasks, async move {
            let _ = ask.await;
            let _ = answer.send(alone_here());
            let _ = released.await;
        });
        answered
    }

    #[test]
    fn alone_here_only_on_a_connection_thread_with_one_connection() {
        assert!(!alone_here(), "not a connection thread");
        let threads = ConnectionThreads::start(1).expect("start");
        on_runtime(async {
            let mut tasks = JoinSet::new();
            let (ask_first, first_asked) = oneshot::channel();
            let (release_first, first_released) = oneshot::channel();
            let first = place_asking(&threads, &mut tasks, first_asked, first_released).await;
            ask_first.send(()).expect("the task waits");
            assert!(
                first.await.expect("answered"),
                "one connection on the thread"
            );
            let (ask_second, second_asked) = oneshot::channel();
            let (release_second, second_released) = oneshot::channel();
            let second = place_asking(&threads, &mut tasks, second_asked, second_released).await;
            ask_second.send(()).expect("the task waits");
            assert!(!second.await.expect("answered"), "two connections share it");
            drop((release_first, release_second));
            while tasks.join_next().await.is_some() {}
        });
        assert!(
            !alone_here(),
            "the test's own thread is still no connection thread"
        );
    }

    /// Counts its drops.
    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn stop_drops_the_connections_still_open_and_joins_the_threads() {
        let threads = ConnectionThreads::start(2).expect("start");
        let mut tasks = JoinSet::new();
        let dropped = Arc::new(AtomicUsize::new(0));
        on_runtime(async {
            for _ in 0..2 {
                let counted = Counted(dropped.clone());
                let (started, running) = oneshot::channel();
                threads.spawn(&mut tasks, async move {
                    let _counted = counted;
                    let _ = started.send(());
                    std::future::pending::<()>().await;
                });
                running.await.expect("the task runs");
            }
        });
        assert_eq!(threads.open_connections(), [1, 1]);
        threads.stop();
        // Both never-ending connections were dropped before stop returned.
        assert_eq!(dropped.load(Ordering::SeqCst), 2);
        assert_eq!(threads.open_connections(), [0, 0]);
        threads.stop();
        on_runtime(async {
            while let Some(joined) = tasks.join_next().await {
                assert!(joined.expect_err("dropped, not ended").is_cancelled());
            }
        });
    }
}
