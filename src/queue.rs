//! The per-name FIFO queue of one `Locker`, generic over what it hands on.
//!
//! Exactly one task per name holds the *turn*: either it is getting the
//! lock from the store (the only task of this `Locker` that touches the
//! store for that name), or it holds the lock. Everyone else waits in
//! arrival order for the turn to be passed on, with a payload (the lock
//! itself, handed over without touching the store) or without one (take
//! it from the store yourself). The queue knows nothing of locks, guards
//! or disks: when to hand a lock on, and how to release one, is the
//! guard's release policy, which the queue is given as a function
//! ([`Dispose`]) and applies to a payload whose waiter went away before
//! picking it up.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use tokio::sync::Notify;

use crate::name::LockName;
use crate::owner::Owner;
use crate::sync::{Mutex, MutexGuard};

/// What the head of the queue receives.
#[derive(Debug)]
pub(crate) enum Turn<T> {
    /// Take the lock from the store yourself (after a courtesy pause if
    /// set).
    Fresh { courtesy: bool },
    /// The previous holder's lock, still held.
    Handoff(T),
}

/// What becomes of a payload that was granted to a waiter that went away
/// before picking it up: the owner's release policy, which either offers it
/// to the next waiter ([`Queue::offer`]) or releases it and passes a fresh
/// turn ([`Queue::pass_fresh`]). Either way the turn must move on.
pub(crate) type Dispose<T> = fn(T, &Queue<T>);

/// One name's queue.
///
/// A queued task costs one entry here (its ticket number and waker) and
/// nothing else: there is at most one turn in flight, so the turn being
/// passed waits in [`State::granted`] rather than in a channel per waiter.
#[derive(Debug)]
pub(crate) struct Queue<T> {
    /// The name this queue is for, shared with the tasks queued on it.
    pub(crate) name: LockName,
    state: Mutex<State<T>>,
    /// Woken when the lock may have become free; awaited by the head.
    pub(crate) changed: Notify,
    /// The holder the head last found at the lock while it waited, for a
    /// queued waiter's timeout to name; cleared when that head stops
    /// waiting, however it stops.
    /// (std's lock even in the model checks, which leave it to the engine.)
    pub(crate) last_seen: std::sync::Mutex<Option<Box<Owner>>>,
    dispose: Dispose<T>,
}

#[derive(Debug)]
struct State<T> {
    /// Someone holds the turn (or it is granted and not yet picked up).
    busy: bool,
    next_ticket: u64,
    /// Waiting tasks in arrival order, so sorted by ticket number.
    waiting: VecDeque<Waiter>,
    /// The turn, popped off `waiting` with this ticket number and not yet
    /// picked up by its task. Only the turn's holder passes it on, so there
    /// is never more than one.
    granted: Option<(u64, Turn<T>)>,
}

impl<T> Default for State<T> {
    fn default() -> Self {
        State {
            busy: false,
            next_ticket: 0,
            waiting: VecDeque::new(),
            granted: None,
        }
    }
}

#[derive(Debug)]
struct Waiter {
    ticket: u64,
    waker: Waker,
    /// Whether a payload (the previous holder's lock) may be handed to it.
    takes_handoff: bool,
}

impl<T> State<T> {
    fn position(&self, ticket: u64) -> Option<usize> {
        self.waiting.binary_search_by_key(&ticket, |w| w.ticket).ok()
    }

    /// Gives `turn` to the first waiter; gives it back if there is none.
    fn grant(&mut self, turn: Turn<T>) -> Result<Waker, Turn<T>> {
        let Some(waiter) = self.waiting.pop_front() else {
            return Err(turn);
        };
        debug_assert!(self.granted.is_none(), "two turns in flight");
        self.granted = Some((waiter.ticket, turn));
        Ok(waiter.waker)
    }

    fn take_granted(&mut self, ticket: u64) -> Option<Turn<T>> {
        match &self.granted {
            Some((granted, _)) if *granted == ticket => self.granted.take().map(|(_, turn)| turn),
            _ => None,
        }
    }
}

/// Where `join` put the caller.
#[derive(Debug)]
pub(crate) enum Join<T> {
    /// The turn is ours at once.
    Head(Head<T>),
    /// Wait for the turn.
    Queued(Ticket<T>),
}

impl<T> Queue<T> {
    pub(crate) fn new(name: LockName, dispose: Dispose<T>) -> Self {
        Self {
            name,
            state: Mutex::default(),
            changed: Notify::new(),
            last_seen: std::sync::Mutex::default(),
            dispose,
        }
    }

    fn state(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the turn if it is free, else joins the back of the queue, to
    /// be woken through `waker` when the turn comes. A waiter that does not
    /// `take_handoff` is never handed a payload: the turn comes to it
    /// fresh.
    pub(crate) fn join(self: &Arc<Self>, waker: &Waker, takes_handoff: bool) -> Join<T> {
        let mut state = self.state();
        if !state.busy {
            state.busy = true;
            return Join::Head(Head::new(self));
        }
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.waiting.push_back(Waiter {
            ticket,
            waker: waker.clone(),
            takes_handoff,
        });
        Join::Queued(Ticket {
            queue: Some(Arc::clone(self)),
            ticket,
        })
    }

    /// Takes the turn only if it is free.
    pub(crate) fn try_head(self: &Arc<Self>) -> Option<Head<T>> {
        let mut state = self.state();
        if state.busy {
            return None;
        }
        state.busy = true;
        Some(Head::new(self))
    }

    /// Hands `payload` (and the turn) to the next waiter; gives it back if
    /// nobody is waiting (or the next one takes no handoff), the caller
    /// keeping the turn.
    pub(crate) fn offer(&self, payload: T) -> Option<T> {
        let mut state = self.state();
        if !state.waiting.front().is_some_and(|w| w.takes_handoff) {
            return Some(payload);
        }
        let granted = state.grant(Turn::Handoff(payload));
        drop(state);
        match granted {
            Ok(waker) => {
                waker.wake();
                None
            }
            Err(Turn::Handoff(payload)) => Some(payload),
            Err(Turn::Fresh { .. }) => unreachable!("offered a handoff"),
        }
    }

    /// Passes the turn, without a payload, to the next waiter, or frees it.
    pub(crate) fn pass_fresh(&self, courtesy: bool) {
        let mut state = self.state();
        match state.grant(Turn::Fresh { courtesy }) {
            Ok(waker) => {
                drop(state);
                waker.wake();
            }
            Err(_) => state.busy = false,
        }
    }

    /// Passes on a turn that was granted but will never be used: a fresh
    /// one as it is, a payload through the owner's policy.
    fn pass_unused(&self, turn: Turn<T>) {
        match turn {
            Turn::Handoff(payload) => (self.dispose)(payload, self),
            Turn::Fresh { courtesy } => self.pass_fresh(courtesy),
        }
    }

    pub(crate) fn has_waiters(&self) -> bool {
        !self.state().waiting.is_empty()
    }

    /// Wakes every queued task and the head: each looks again at whether
    /// it should still wait (after `Locker::release_all`, it should not).
    pub(crate) fn wake_all(&self) {
        let wakers: Vec<Waker> = self.state().waiting.iter().map(|w| w.waker.clone()).collect();
        self.changed.notify_waiters();
        // Woken after unlocking: waking can run arbitrary code.
        wakers.into_iter().for_each(Waker::wake);
    }
}

/// A place in the queue. Dropping it before the turn arrives leaves the
/// queue as if it had never joined; if the turn arrived but was never
/// taken, it is passed on.
#[derive(Debug)]
pub(crate) struct Ticket<T> {
    /// `None` once the turn was taken.
    queue: Option<Arc<Queue<T>>>,
    ticket: u64,
}

impl<T> Ticket<T> {
    /// The holder the queue's head last found at the lock, if it is still
    /// waiting for it (and this ticket has not taken its turn).
    pub(crate) fn last_seen(&self) -> Option<Owner> {
        let queue = self.queue.as_ref()?;
        let seen = queue.last_seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.as_deref().cloned()
    }

    /// The turn, once it is this ticket's; until then the latest waker is
    /// kept in the queue.
    pub(crate) fn poll_turn(&mut self, cx: &Context<'_>) -> Poll<(Turn<T>, Arc<Queue<T>>)> {
        let Some(queue) = &self.queue else {
            // Polled again after the turn was taken: a caller bug, and
            // waiting forever would hide it.
            panic!("queue ticket polled after its turn was taken");
        };
        let mut state = queue.state();
        if let Some(turn) = state.take_granted(self.ticket) {
            drop(state);
            let queue = self.queue.take().expect("checked above");
            return Poll::Ready((turn, queue));
        }
        match state.position(self.ticket) {
            Some(at) => {
                let waker = &mut state.waiting[at].waker;
                if !waker.will_wake(cx.waker()) {
                    // The old waker is dropped after unlocking: dropping a
                    // waker can run arbitrary code.
                    let old = std::mem::replace(waker, cx.waker().clone());
                    drop(state);
                    drop(old);
                }
                Poll::Pending
            }
            // Neither waiting nor granted cannot happen while we hold the
            // ticket. Should it, the queue stays sound: take the turn if it
            // is free, else queue again at the back, rather than make a
            // second holder of the turn.
            None => {
                debug_assert!(false, "queue ticket {} lost its place", self.ticket);
                if !state.busy {
                    state.busy = true;
                    drop(state);
                    let queue = self.queue.take().expect("checked above");
                    return Poll::Ready((Turn::Fresh { courtesy: false }, queue));
                }
                self.ticket = state.next_ticket;
                state.next_ticket += 1;
                state.waiting.push_back(Waiter {
                    ticket: self.ticket,
                    waker: cx.waker().clone(),
                    takes_handoff: false,
                });
                Poll::Pending
            }
        }
    }
}

impl<T> Drop for Ticket<T> {
    fn drop(&mut self) {
        let Some(queue) = self.queue.take() else {
            return;
        };
        let mut state = queue.state();
        if let Some(at) = state.position(self.ticket) {
            let left = state.waiting.remove(at);
            // Its waker is dropped after unlocking.
            drop(state);
            drop(left);
            return;
        }
        // Granted before we could leave: pass the turn on.
        let unused = state.take_granted(self.ticket);
        drop(state);
        if let Some(turn) = unused {
            queue.pass_unused(turn);
        }
    }
}

/// The turn, held by a task that is going to the store for the lock.
/// Passed on if dropped (the attempt failed, timed out or was cancelled).
#[derive(Debug)]
pub(crate) struct Head<T> {
    queue: Arc<Queue<T>>,
    armed: bool,
}

impl<T> Head<T> {
    fn new(queue: &Arc<Queue<T>>) -> Self {
        Self {
            queue: Arc::clone(queue),
            armed: true,
        }
    }

    /// The turn, received from the queue, of a task that must now go to
    /// the store.
    pub(crate) fn adopt(queue: &Arc<Queue<T>>) -> Self {
        Self::new(queue)
    }

    /// The lock was taken: the turn now travels with it.
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl<T> Drop for Head<T> {
    fn drop(&mut self) {
        if self.armed {
            self.queue.pass_fresh(false);
        }
    }
}

/// Every queue of one `Locker`, by lock file name.
#[derive(Debug)]
pub(crate) struct Queues<T> {
    map: Mutex<HashMap<String, Arc<Queue<T>>>>,
    dispose: Dispose<T>,
}

impl<T> Queues<T> {
    /// Queues whose unused payloads go to `dispose`.
    pub(crate) fn new(dispose: Dispose<T>) -> Self {
        Queues {
            map: Mutex::default(),
            dispose,
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Queue<T>>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn get(&self, name: &LockName) -> Arc<Queue<T>> {
        let mut map = self.map();
        if let Some(queue) = map.get(name.file_name()) {
            return Arc::clone(queue);
        }
        // Forget idle queues now and then, so a service that locks many
        // distinct names does not keep one queue per name forever.
        if map.len() >= 64 && map.len().is_power_of_two() {
            // Only the map holds an idle queue.
            map.retain(|_, queue| Arc::strong_count(queue) > 1);
        }
        let queue = Arc::new(Queue::new(name.clone(), self.dispose));
        map.insert(name.file_name().to_owned(), Arc::clone(&queue));
        queue
    }

    /// Wakes the head waiting for `file_name`, if any.
    pub(crate) fn changed(&self, file_name: &str) {
        if let Some(queue) = self.map().get(file_name) {
            queue.changed.notify_waiters();
        }
    }

    /// Wakes every task waiting in every queue (see [`Queue::wake_all`]).
    pub(crate) fn wake_all(&self) {
        let queues: Vec<Arc<Queue<T>>> = self.map().values().cloned().collect();
        queues.iter().for_each(|queue| queue.wake_all());
    }

    /// Wakes every head (events were lost).
    pub(crate) fn all_changed(&self) {
        for queue in self.map().values() {
            queue.changed.notify_waiters();
        }
    }
}

#[cfg(all(test, leasehold_loom))]
mod model;

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use super::*;

    /// A waker that counts its wake-ups.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waker() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count::default());
        (Arc::clone(&count), Waker::from(count))
    }

    /// A payload that records its drop.
    #[derive(Debug)]
    struct Payload(u32, Arc<AtomicUsize>);

    impl Drop for Payload {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The simplest policy: offer it on, else drop it and free the turn.
    fn pass_along(payload: Payload, queue: &Queue<Payload>) {
        if let Some(payload) = queue.offer(payload) {
            drop(payload);
            queue.pass_fresh(false);
        }
    }

    fn queue() -> Arc<Queue<Payload>> {
        Arc::new(Queue::new(LockName::from_file_name("q"), pass_along))
    }

    fn queued(join: Join<Payload>) -> Ticket<Payload> {
        match join {
            Join::Queued(ticket) => ticket,
            Join::Head(_) => panic!("expected to queue"),
        }
    }

    fn head(join: Join<Payload>) -> Head<Payload> {
        match join {
            Join::Head(head) => head,
            Join::Queued(_) => panic!("expected the turn"),
        }
    }

    fn poll(ticket: &mut Ticket<Payload>) -> Poll<Turn<Payload>> {
        let (_, w) = waker();
        ticket.poll_turn(&Context::from_waker(&w)).map(|(turn, _)| turn)
    }

    #[test]
    fn turns_come_in_arrival_order() {
        let q = queue();
        let (_, w) = waker();
        let first = head(q.join(&w, true));
        let mut tickets: Vec<_> = (0..5).map(|_| queued(q.join(&w, true))).collect();
        first.disarm();
        for i in 0..5 {
            q.pass_fresh(false);
            for (j, ticket) in tickets.iter_mut().enumerate().skip(i) {
                let ready = poll(ticket).is_ready();
                assert_eq!(ready, j == i, "after {i} passes, ticket {j}");
                if ready {
                    break;
                }
            }
        }
        // Everyone had the turn; the last one passes it back to nobody.
        q.pass_fresh(false);
        assert!(q.try_head().is_some(), "the turn is free again");
    }

    #[test]
    fn a_handoff_reaches_the_next_waiter_with_its_payload() {
        let q = queue();
        let dropped = Arc::new(AtomicUsize::new(0));
        let (woken, w) = waker();
        head(q.join(&w, true)).disarm();
        let mut next = queued(q.join(&w, true));
        assert!(
            q.offer(Payload(7, Arc::clone(&dropped))).is_none(),
            "taken by the waiter"
        );
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "the waiter was woken");
        match poll(&mut next) {
            Poll::Ready(Turn::Handoff(Payload(7, _))) => {}
            other => panic!("expected the handoff, got {other:?}"),
        }
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            1,
            "delivered, then dropped by the test"
        );
    }

    #[test]
    fn an_offer_without_waiters_comes_back() {
        let q = queue();
        let dropped = Arc::new(AtomicUsize::new(0));
        let (_, w) = waker();
        head(q.join(&w, true)).disarm();
        let back = q.offer(Payload(1, Arc::clone(&dropped)));
        assert!(matches!(back, Some(Payload(1, _))));
        assert!(q.try_head().is_none(), "the offerer keeps the turn");
    }

    #[test]
    fn a_waiter_cancelled_before_its_turn_leaves_no_trace() {
        let q = queue();
        let (_, w) = waker();
        head(q.join(&w, true)).disarm();
        let gone = queued(q.join(&w, true));
        let mut stays = queued(q.join(&w, true));
        drop(gone);
        q.pass_fresh(false);
        assert!(poll(&mut stays).is_ready(), "the cancelled waiter was skipped");
        assert!(!q.has_waiters());
    }

    #[test]
    fn a_fresh_turn_granted_to_a_cancelled_waiter_moves_on() {
        let q = queue();
        let (_, w) = waker();
        head(q.join(&w, true)).disarm();
        let gone = queued(q.join(&w, true));
        let mut next = queued(q.join(&w, true));
        q.pass_fresh(true);
        drop(gone); // granted, never picked up
        match poll(&mut next) {
            Poll::Ready(Turn::Fresh { courtesy: true }) => {}
            other => panic!("expected the fresh turn, got {other:?}"),
        }
    }

    #[test]
    fn a_handoff_left_by_a_cancelled_waiter_goes_through_the_owners_policy() {
        // A policy that never hands on: drop (release) and pass fresh.
        fn release(payload: Payload, queue: &Queue<Payload>) {
            drop(payload);
            queue.pass_fresh(true);
        }
        let q = Arc::new(Queue::new(LockName::from_file_name("q"), release));
        let dropped = Arc::new(AtomicUsize::new(0));
        let (_, w) = waker();
        head(q.join(&w, true)).disarm();
        let gone = queued(q.join(&w, true));
        let mut next = queued(q.join(&w, true));
        assert!(q.offer(Payload(5, Arc::clone(&dropped))).is_none());
        drop(gone);
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "released by the policy");
        match poll(&mut next) {
            Poll::Ready(Turn::Fresh { courtesy: true }) => {}
            other => panic!("expected the policy's fresh turn, got {other:?}"),
        }
    }

    #[test]
    fn a_handoff_to_a_cancelled_waiter_moves_on_or_is_dropped() {
        let q = queue();
        let dropped = Arc::new(AtomicUsize::new(0));
        let (_, w) = waker();
        head(q.join(&w, true)).disarm();
        let gone = queued(q.join(&w, true));
        let mut next = queued(q.join(&w, true));
        assert!(q.offer(Payload(3, Arc::clone(&dropped))).is_none());
        drop(gone);
        let turn = poll(&mut next);
        assert!(
            matches!(turn, Poll::Ready(Turn::Handoff(Payload(3, _)))),
            "{turn:?}"
        );
        drop(turn);
        assert_eq!(dropped.load(Ordering::SeqCst), 1);

        // Nobody left to take it: the payload is dropped (released) and
        // the turn is free.
        let gone = queued(q.join(&w, true));
        assert!(q.offer(Payload(4, Arc::clone(&dropped))).is_none());
        drop(gone);
        assert_eq!(dropped.load(Ordering::SeqCst), 2, "dropped, so released");
        assert!(q.try_head().is_some(), "and the turn is free");
    }

    #[test]
    fn a_dropped_head_passes_the_turn() {
        let q = queue();
        let (_, w) = waker();
        let first = head(q.join(&w, true));
        let mut next = queued(q.join(&w, true));
        assert!(poll(&mut next).is_pending());
        drop(first); // the attempt failed or was cancelled
        assert!(matches!(
            poll(&mut next),
            Poll::Ready(Turn::Fresh { courtesy: false })
        ));
    }

    #[test]
    fn the_latest_waker_is_the_one_woken() {
        let q = queue();
        let (_, w) = waker();
        head(q.join(&w, true)).disarm();
        let mut ticket = queued(q.join(&w, true));
        let (later, w2) = waker();
        assert!(ticket.poll_turn(&Context::from_waker(&w2)).is_pending());
        q.pass_fresh(false);
        assert_eq!(later.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn idle_queues_are_forgotten() {
        let queues: Queues<Payload> = Queues::new(pass_along);
        let kept = queues.get(&LockName::from_file_name("kept"));
        for i in 0..200 {
            drop(queues.get(&LockName::from_file_name(&format!("n{i}"))));
        }
        assert!(queues.map().len() < 200, "idle queues were dropped");
        assert!(Arc::ptr_eq(&kept, &queues.get(&LockName::from_file_name("kept"))));
    }
}
