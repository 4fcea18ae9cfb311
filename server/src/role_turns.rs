//! Turns of the RPC layer shared fairly between the roles that own the writes, so that a
//! role whose calls take the server's CPU does not make another role's calls wait for all
//! of them.
//!
//! The connection turns (CONN-7, `server::fair_streams`) serve connections in the runtime's
//! order, one turn each: a polite call still waits for one turn of every greedy connection,
//! twice (when its request arrives and when its answer is ready). Here every connection's
//! task is wrapped in a [`Gated`] future that charges the time its polls take to the role
//! the connection last wrote for (`Engine::owning_role` of a write's key, noted by the KV
//! handlers), and a role that is ahead of another role waiting for a turn lets that role go
//! first: its connections return at once and are woken when the other role has caught up or
//! stopped waiting. A connection counts as waiting from the moment its task is woken (by its
//! socket or by one of its calls), so the greedy connections already queued in the runtime
//! step aside when they are polled.
//!
//! Invariants:
//! - TURN-1: a connection of role R is polled only if R's charged time is at most
//!   [`TURN_SLACK`] beyond the least charged time of the roles with a connection waiting for a
//!   turn; so the role with the least charged time always runs, and a lone role never waits.
//!   A connection whose role is not known yet (no write seen) is never held.
//! - TURN-2: a role that starts waiting after a pause is charged at least the virtual clock
//!   (the least charged time of the waiting roles, never decreasing) minus [`TURN_CREDIT`]:
//!   idleness buys at most `TURN_CREDIT` of precedence, and a role that was never seen starts
//!   with that credit.
//! - TURN-3: a held connection is woken once whatever held it may have changed: a turn
//!   ended, a waiting connection stopped waiting or went away, or a connection changed role.
//!   Nothing spins: a held connection's task sleeps until then.
//!
//! Contact points: `server::connections` wraps each connection's task in [`gated`] with the
//! server's one [`RoleTurns`]; `server::kv` calls [`note_owner`] for each write it is about
//! to submit, inside the connection's turn.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use kvd::sync::{Arc, Mutex, Name, lock};

/// How far a role's charged time may run ahead of the least charged waiting role's (TURN-1).
pub const TURN_SLACK: Duration = Duration::from_millis(1);

/// The precedence a role that starts waiting after a pause gets at most (TURN-2). Larger than
/// [`TURN_SLACK`], so such a role's first turn comes before the next turn of a busy role.
pub const TURN_CREDIT: Duration = Duration::from_millis(2);

/// Roles with no connection waiting are forgotten once more than this many are known.
const IDLE_ROLES_KEPT: usize = 1024;

/// The server's shared account of the roles' turns.
#[derive(Debug, Default)]
pub struct RoleTurns {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    roles: HashMap<Name, RoleTurn>,
    /// The virtual clock (TURN-2), in nanoseconds of charged time.
    clock: u64,
}

#[derive(Debug, Default)]
struct RoleTurn {
    /// Nanoseconds of poll time charged to the role.
    charged: u64,
    /// The role's connections waiting for a turn.
    waiting: usize,
    /// Tasks of the role's connections held by TURN-1.
    held: Vec<Waker>,
}

impl State {
    /// The least charged time of the roles with a waiting connection.
    fn least_waiting(&self) -> Option<u64> {
        self.roles
            .values()
            .filter(|role| role.waiting > 0)
            .map(|role| role.charged)
            .min()
    }

    fn may_run(&self, charged: u64) -> bool {
        self.least_waiting()
            .is_none_or(|least| charged <= least.saturating_add(nanos(TURN_SLACK)))
    }

    fn want(&mut self, role: &Name) {
        let clock = self.clock;
        let turn = self.roles.entry(role.clone()).or_default();
        if turn.waiting == 0 {
            // TURN-2: a pause buys at most the credit.
            turn.charged = turn.charged.max(clock.saturating_sub(nanos(TURN_CREDIT)));
        }
        turn.waiting += 1;
    }

    /// Ends one wait of `role`; returns the tasks that may run now (TURN-3).
    fn unwant(&mut self, role: &Name) -> Vec<Waker> {
        if let Some(turn) = self.roles.get_mut(role) {
            turn.waiting = turn.waiting.saturating_sub(1);
        }
        self.settle()
    }

    /// Advances the clock and takes the held tasks whose role may run now.
    fn settle(&mut self) -> Vec<Waker> {
        let Some(least) = self.least_waiting() else {
            self.forget_idle();
            // Nobody waits: nobody can be held.
            return self
                .roles
                .values_mut()
                .flat_map(|r| r.held.drain(..))
                .collect();
        };
        self.clock = self.clock.max(least);
        let limit = least.saturating_add(nanos(TURN_SLACK));
        let mut woken = Vec::new();
        for turn in self.roles.values_mut() {
            if turn.charged <= limit {
                woken.append(&mut turn.held);
            }
        }
        woken
    }

    fn forget_idle(&mut self) {
        if self.roles.len() > IDLE_ROLES_KEPT {
            self.roles
                .retain(|_, turn| turn.waiting > 0 || !turn.held.is_empty());
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn wake_all(wakers: Vec<Waker>) {
    for waker in wakers {
        waker.wake();
    }
}

impl RoleTurns {
    /// Returns the shared account, with no role known.
    pub fn new() -> Arc<RoleTurns> {
        Arc::new(RoleTurns::default())
    }

    fn want(&self, role: &Name) {
        lock(&self.state).want(role);
    }

    fn unwant(&self, role: &Name) {
        let woken = lock(&self.state).unwant(role);
        wake_all(woken);
    }

    /// Starts a turn of one waiting connection of `role`: true if it may run now (its wait
    /// ends), else `task` is held until it may (TURN-1, TURN-3).
    fn enter(&self, role: &Name, task: &Waker) -> bool {
        let mut state = lock(&self.state);
        let charged = state.roles.get(role).map_or(0, |turn| turn.charged);
        if state.may_run(charged) {
            let woken = state.unwant(role);
            drop(state);
            wake_all(woken);
            return true;
        }
        let turn = state.roles.entry(role.clone()).or_default();
        if !turn.held.iter().any(|held| held.will_wake(task)) {
            turn.held.push(task.clone());
        }
        false
    }

    /// Charges `spent` to `role` at the end of a turn and wakes whoever may run now.
    fn charge(&self, role: &Name, spent: Duration) {
        let woken = {
            let mut state = lock(&self.state);
            let turn = state.roles.entry(role.clone()).or_default();
            turn.charged = turn.charged.saturating_add(nanos(spent));
            state.settle()
        };
        wake_all(woken);
    }
}

/// One connection's place in the turns.
#[derive(Debug)]
struct Connection {
    turns: Arc<RoleTurns>,
    state: Mutex<ConnectionState>,
}

#[derive(Debug, Default)]
struct ConnectionState {
    /// The role of the connection's latest write, once one was seen.
    role: Option<Name>,
    /// True while the connection is counted as waiting for a turn of its role.
    waiting: bool,
    /// The task's waker from its latest poll.
    task: Option<Waker>,
    /// True once the connection's task ended: a late wake (a call's answer after the
    /// connection closed) must not count it as waiting again.
    closed: bool,
}

impl Connection {
    /// Counts the connection as waiting, once (its role known), in its locked `state`.
    fn want(&self, state: &mut ConnectionState) {
        if !state.waiting
            && !state.closed
            && let Some(role) = &state.role
        {
            self.turns.want(role);
            state.waiting = true;
        }
    }

    /// Notes that the connection now writes for `role` (TURN-3 if it changed).
    fn note_role(&self, role: &str) {
        let mut state = lock(&self.state);
        if state.role.as_deref() == Some(role) {
            return;
        }
        let role = Name::from(role);
        if state.waiting && !state.closed {
            if let Some(old) = &state.role {
                self.turns.unwant(old);
            }
            self.turns.want(&role);
        }
        state.role = Some(role);
    }
}

impl Wake for Connection {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let task = {
            let mut state = lock(&self.state);
            self.want(&mut state);
            state.task.clone()
        };
        if let Some(task) = task {
            task.wake();
        }
    }
}

impl Drop for Gated {
    fn drop(&mut self) {
        let mut state = lock(&self.connection.state);
        state.closed = true;
        if state.waiting {
            state.waiting = false;
            if let Some(role) = &state.role {
                self.connection.turns.unwant(role);
            }
        }
    }
}

thread_local! {
    /// The connection whose turn runs on this thread, if any.
    static CURRENT: RefCell<Option<Arc<Connection>>> = const { RefCell::new(None) };
}

/// Marks `connection`'s turn as the one running on this thread until dropped (also when the
/// poll panics).
struct CurrentTurn {
    previous: Option<Arc<Connection>>,
}

impl CurrentTurn {
    fn enter(connection: &Arc<Connection>) -> CurrentTurn {
        let previous = CURRENT.with(|c| c.replace(Some(connection.clone())));
        CurrentTurn { previous }
    }
}

impl Drop for CurrentTurn {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
    }
}

/// Notes, for the connection whose turn is running, that it writes for the role `owner`
/// returns (TURN-1 holds a connection by the role of its latest write). Outside a turn (a
/// call running in a task of its own) it does nothing and does not call `owner`.
pub fn note_owner<'k>(owner: impl FnOnce() -> &'k str) {
    CURRENT.with(|current| {
        if let Some(connection) = current.borrow().as_ref() {
            connection.note_role(owner());
        }
    });
}

/// A connection's task, polled only when its role's turn allows (TURN-1).
pub struct Gated {
    connection: Arc<Connection>,
    /// The waker handed to the connection's future: it counts the connection as waiting.
    waker: Waker,
    inner: Pin<Box<dyn Future<Output = ()> + Send>>,
}

/// Wraps a connection's task in the turns of `turns`.
pub fn gated(turns: &Arc<RoleTurns>, inner: impl Future<Output = ()> + Send + 'static) -> Gated {
    let connection = Arc::new(Connection {
        turns: turns.clone(),
        state: Mutex::new(ConnectionState::default()),
    });
    Gated {
        waker: Waker::from(connection.clone()),
        connection,
        inner: Box::pin(inner),
    }
}

impl Future for Gated {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let role = {
            let mut state = lock(&this.connection.state);
            if !state.task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                state.task = Some(cx.waker().clone());
            }
            // Polled without a wake of ours (the first poll), it waits all the same.
            this.connection.want(&mut state);
            let role = state.role.clone();
            if let Some(role) = &role {
                // The wait is counted once (just above, or by the wake); `enter` ends it if
                // the turn may run, else the connection stays waiting, held.
                state.waiting = false;
                if !this.connection.turns.enter(role, cx.waker()) {
                    state.waiting = true;
                    return Poll::Pending;
                }
            }
            role
        };
        let started = Instant::now();
        let polled = {
            let _current = CurrentTurn::enter(&this.connection);
            let mut inner_cx = Context::from_waker(&this.waker);
            this.inner.as_mut().poll(&mut inner_cx)
        };
        if let Some(role) = role {
            this.connection.turns.charge(&role, started.elapsed());
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(role: &str) -> Name {
        Name::from(role)
    }

    fn noop() -> Waker {
        Waker::noop().clone()
    }

    /// One connection of `role` wakes, must be let through, and spends `spent`.
    fn run_turn(turns: &RoleTurns, role: &Name, spent: Duration) {
        turns.want(role);
        assert!(turns.enter(role, &noop()), "TURN-1: {role} may run");
        turns.charge(role, spent);
    }

    #[test]
    fn a_lone_role_is_never_held() {
        let turns = RoleTurns::new();
        let greedy = name("greedy");
        for _ in 0..100 {
            run_turn(&turns, &greedy, Duration::from_millis(5));
        }
    }

    #[test]
    fn a_role_arriving_beside_a_busy_one_goes_first_and_then_they_alternate() {
        let turns = RoleTurns::new();
        let (greedy, polite) = (name("greedy"), name("polite"));
        for _ in 0..50 {
            run_turn(&turns, &greedy, Duration::from_micros(500));
        }
        // Two greedy connections queued, then a polite one wakes.
        turns.want(&greedy);
        turns.want(&greedy);
        turns.want(&polite);
        assert!(
            !turns.enter(&greedy, &noop()),
            "TURN-2: the newcomer's credit puts the busy role more than the slack ahead"
        );
        assert!(turns.enter(&polite, &noop()));
        turns.charge(&polite, Duration::from_micros(50));
        // The polite role no longer waits: the greedy one runs again.
        assert!(turns.enter(&greedy, &noop()));
        turns.charge(&greedy, Duration::from_micros(500));

        // Both busy: each has one connection, ready again right after each of its turns
        // (as a connection that yields after a turn is); neither gets more than the slack
        // and one turn ahead of the other.
        let mut spent = HashMap::from([(greedy.clone(), 0u64), (polite.clone(), 0u64)]);
        turns.want(&greedy);
        turns.want(&polite);
        for _ in 0..1000 {
            for role in [&greedy, &polite] {
                if turns.enter(role, &noop()) {
                    let cost = if role == &greedy { 400 } else { 100 };
                    turns.charge(role, Duration::from_micros(cost));
                    *spent.get_mut(role).unwrap() += cost;
                    turns.want(role);
                }
            }
        }
        let (g, p) = (spent[&greedy], spent[&polite]);
        assert!(
            g.abs_diff(p) <= 2_000,
            "shares drift apart: greedy {g} us, polite {p} us"
        );
    }

    #[test]
    fn a_pause_buys_at_most_the_credit() {
        let turns = RoleTurns::new();
        let (a, b) = (name("a"), name("b"));
        run_turn(&turns, &b, Duration::from_millis(1));
        // `b` stops; `a` runs alone for a long time.
        for _ in 0..100 {
            run_turn(&turns, &a, Duration::from_millis(10));
        }
        // `b` comes back: it runs first, but only for about the credit (TURN-2).
        turns.want(&a);
        turns.want(&b);
        let mut b_turns = 0;
        while !turns.enter(&a, &noop()) {
            assert!(turns.enter(&b, &noop()));
            turns.charge(&b, Duration::from_micros(100));
            turns.want(&b);
            b_turns += 1;
            assert!(b_turns < 100, "the paused role took more than its credit");
        }
        assert!(
            (10..=30).contains(&b_turns),
            "{b_turns} turns of 100 us before the busy role ran again"
        );
    }

    #[test]
    fn a_held_connection_is_woken_when_the_role_ahead_stops_waiting() {
        struct Flag(std::sync::atomic::AtomicBool);
        impl Wake for Flag {
            fn wake(self: std::sync::Arc<Self>) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let flag = std::sync::Arc::new(Flag(false.into()));
        let held = Waker::from(flag.clone());
        let turns = RoleTurns::new();
        let (greedy, polite) = (name("greedy"), name("polite"));
        run_turn(&turns, &greedy, Duration::from_millis(10));
        turns.want(&greedy);
        turns.want(&polite);
        assert!(!turns.enter(&greedy, &held));
        assert!(!flag.0.load(std::sync::atomic::Ordering::SeqCst));
        // The polite connection goes away without a turn: TURN-3 wakes the held one.
        turns.unwant(&polite);
        assert!(
            flag.0.load(std::sync::atomic::Ordering::SeqCst),
            "TURN-3: held until woken"
        );
        assert!(turns.enter(&greedy, &noop()));
    }

    #[tokio::test]
    async fn a_gated_connection_learns_its_role_from_the_writes_noted_in_its_turn() {
        let turns = RoleTurns::new();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<&'static str>();
        let (ack_tx, mut ack) = tokio::sync::mpsc::unbounded_channel::<()>();
        let task = tokio::spawn(gated(&turns, async move {
            while let Some(role) = rx.recv().await {
                note_owner(|| role);
                ack_tx.send(()).expect("the test listens");
            }
        }));
        let wait = Duration::from_secs(5);
        tx.send("polite").expect("the task listens");
        tokio::time::timeout(wait, ack.recv()).await.expect("noted");
        assert!(
            !lock(&turns.state).roles.contains_key("polite"),
            "the turn that saw the first write ran before its role was known"
        );
        // The next wake counts the connection as waiting for that role, and its turn is
        // charged to it.
        tx.send("polite").expect("the task listens");
        tokio::time::timeout(wait, ack.recv()).await.expect("noted");
        assert!(lock(&turns.state).roles.contains_key("polite"));
        drop(tx);
        tokio::time::timeout(wait, task)
            .await
            .expect("the connection ends")
            .expect("without a panic");
        let state = lock(&turns.state);
        assert_eq!(
            state.roles.values().map(|r| r.waiting).sum::<usize>(),
            0,
            "an ended connection waits no more"
        );
    }
}
