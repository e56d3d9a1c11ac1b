//! The per-name FIFO queue of one `Locker`.
//!
//! Exactly one task per name holds the *turn*: either it is waiting on the
//! disk for the lock (the only task of this `Locker` that touches the disk
//! for that name), or it holds the lock. Everyone else waits in arrival
//! order for the turn to be passed on. A holder that finishes passes the
//! lock itself to the next waiter, without touching the disk, for up to
//! [`HANDOFF_WINDOW`] in a row; then it releases the lock on disk and the
//! next waiter, after a [`COURTESY`] pause, competes for it afresh, so
//! waiters in other processes get their chance.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::sync::Notify;

use crate::guard::Hold;
use crate::name::LockName;

/// How long a lock may pass between the tasks of one `Locker` before it is
/// released on disk for other processes.
pub(crate) const HANDOFF_WINDOW: Duration = Duration::from_millis(10);

/// How long the next local waiter holds back after such a release.
pub(crate) const COURTESY: Duration = Duration::from_millis(1);

/// What the head of the queue receives.
#[derive(Debug)]
pub(crate) enum Turn {
    /// Take the lock from the disk yourself (after a courtesy pause if set).
    Fresh { courtesy: bool },
    /// The previous holder's lock, still held and renewed.
    Handoff(Hold),
}

/// One name's queue.
///
/// A queued task costs one entry here (its ticket number and waker) and
/// nothing else: there is at most one turn in flight, so the turn being
/// passed waits in [`State::granted`] rather than in a channel per waiter.
#[derive(Debug)]
pub(crate) struct Slot {
    /// The name this queue is for, shared with the tasks queued on it.
    pub(crate) name: LockName,
    state: Mutex<State>,
    /// Woken when the lock file may have become free; awaited by the head.
    pub(crate) changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Someone holds the turn (or it is granted and not yet picked up).
    busy: bool,
    next_ticket: u64,
    /// Waiting tasks in arrival order, so sorted by ticket number.
    waiting: VecDeque<Waiter>,
    /// The turn, popped off `waiting` with this ticket number and not yet
    /// picked up by its task. Only the turn's holder passes it on, so there
    /// is never more than one.
    granted: Option<(u64, Turn)>,
}

#[derive(Debug)]
struct Waiter {
    ticket: u64,
    waker: Waker,
}

impl State {
    fn position(&self, ticket: u64) -> Option<usize> {
        self.waiting.binary_search_by_key(&ticket, |w| w.ticket).ok()
    }

    /// Gives `turn` to the first waiter; gives it back if there is none.
    fn grant(&mut self, turn: Turn) -> Result<Waker, Turn> {
        let Some(waiter) = self.waiting.pop_front() else {
            return Err(turn);
        };
        debug_assert!(self.granted.is_none(), "two turns in flight");
        self.granted = Some((waiter.ticket, turn));
        Ok(waiter.waker)
    }

    fn take_granted(&mut self, ticket: u64) -> Option<Turn> {
        match &self.granted {
            Some((granted, _)) if *granted == ticket => self.granted.take().map(|(_, turn)| turn),
            _ => None,
        }
    }
}

/// Where `join` put the caller.
#[derive(Debug)]
pub(crate) enum Join {
    /// The turn is ours at once.
    Head(Head),
    /// Wait for the turn.
    Queued(Ticket),
}

impl Slot {
    fn new(name: LockName) -> Self {
        Self {
            name,
            state: Mutex::default(),
            changed: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the turn if it is free, else joins the back of the queue, to
    /// be woken through `waker` when the turn comes.
    pub(crate) fn join(self: &Arc<Self>, waker: &Waker) -> Join {
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
        });
        Join::Queued(Ticket {
            slot: Some(Arc::clone(self)),
            ticket,
        })
    }

    /// Takes the turn only if it is free.
    pub(crate) fn try_head(self: &Arc<Self>) -> Option<Head> {
        let mut state = self.state();
        if state.busy {
            return None;
        }
        state.busy = true;
        Some(Head::new(self))
    }

    /// Hands a held lock to the next waiter; gives it back if nobody is
    /// waiting.
    fn offer(&self, hold: Hold) -> Option<Hold> {
        let granted = self.state().grant(Turn::Handoff(hold));
        match granted {
            Ok(waker) => {
                waker.wake();
                None
            }
            Err(turn) => turn.into_hold(),
        }
    }

    /// Passes the turn, without a lock, to the next waiter, or frees it.
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

    /// Called when the last guard of a hold goes: hand the lock on, or
    /// release it on disk and pass the turn.
    pub(crate) fn pass_on(&self, hold: Hold) {
        let within_window = hold.since().elapsed() < HANDOFF_WINDOW;
        let hold = if within_window && !hold.is_lost() {
            match self.offer(hold) {
                None => return,
                Some(hold) => hold,
            }
        } else {
            hold
        };
        let courtesy = !within_window && self.has_waiters();
        hold.release_sync();
        self.pass_fresh(courtesy);
    }

    /// Passes on a turn that was granted but will never be used.
    fn pass_unused(&self, turn: Turn) {
        match turn {
            Turn::Handoff(hold) => self.pass_on(hold),
            Turn::Fresh { courtesy } => self.pass_fresh(courtesy),
        }
    }

    pub(crate) fn has_waiters(&self) -> bool {
        !self.state().waiting.is_empty()
    }
}

impl Turn {
    fn into_hold(self) -> Option<Hold> {
        match self {
            Turn::Handoff(hold) => Some(hold),
            Turn::Fresh { .. } => None,
        }
    }
}

/// A place in the queue. Dropping it before the turn arrives leaves the
/// queue as if it had never joined; if the turn arrived but was never
/// taken, it is passed on.
#[derive(Debug)]
pub(crate) struct Ticket {
    /// `None` once the turn was taken.
    slot: Option<Arc<Slot>>,
    ticket: u64,
}

impl Ticket {
    /// The turn, once it is this ticket's; until then the latest waker is
    /// kept in the queue.
    pub(crate) fn poll_turn(&mut self, cx: &Context<'_>) -> Poll<(Turn, Arc<Slot>)> {
        let Some(slot) = &self.slot else {
            // Polled again after the turn was taken: a caller bug, and
            // waiting forever would hide it.
            panic!("queue ticket polled after its turn was taken");
        };
        let mut state = slot.state();
        if let Some(turn) = state.take_granted(self.ticket) {
            drop(state);
            let slot = self.slot.take().expect("checked above");
            return Poll::Ready((turn, slot));
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
                    let slot = self.slot.take().expect("checked above");
                    return Poll::Ready((Turn::Fresh { courtesy: false }, slot));
                }
                self.ticket = state.next_ticket;
                state.next_ticket += 1;
                state.waiting.push_back(Waiter {
                    ticket: self.ticket,
                    waker: cx.waker().clone(),
                });
                Poll::Pending
            }
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        let mut state = slot.state();
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
            slot.pass_unused(turn);
        }
    }
}

/// The turn, held by a task that is going to the disk for the lock. Passed
/// on if dropped (the attempt failed, timed out or was cancelled).
#[derive(Debug)]
pub(crate) struct Head {
    slot: Arc<Slot>,
    armed: bool,
}

impl Head {
    fn new(slot: &Arc<Slot>) -> Self {
        Self {
            slot: Arc::clone(slot),
            armed: true,
        }
    }

    /// The turn, received from the queue, of a task that must now go to
    /// the disk.
    pub(crate) fn adopt(slot: &Arc<Slot>) -> Self {
        Self::new(slot)
    }

    /// The lock was taken: the turn now travels with the hold.
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Head {
    fn drop(&mut self) {
        if self.armed {
            self.slot.pass_fresh(false);
        }
    }
}

/// Every queue of one `Locker`, by lock file name.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    map: Mutex<HashMap<String, Arc<Slot>>>,
}

impl Slots {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn get(&self, name: &LockName) -> Arc<Slot> {
        let mut map = self.map();
        if let Some(slot) = map.get(name.file_name()) {
            return Arc::clone(slot);
        }
        // Forget idle queues now and then, so a service that locks many
        // distinct names does not keep one queue per name forever.
        if map.len() >= 64 && map.len().is_power_of_two() {
            // Only the map holds an idle queue.
            map.retain(|_, slot| Arc::strong_count(slot) > 1);
        }
        let slot = Arc::new(Slot::new(name.clone()));
        map.insert(name.file_name().to_owned(), Arc::clone(&slot));
        slot
    }

    /// Wakes the head waiting for `file_name`, if any.
    pub(crate) fn changed(&self, file_name: &str) {
        if let Some(slot) = self.map().get(file_name) {
            slot.changed.notify_waiters();
        }
    }

    /// Wakes every head (events were lost).
    pub(crate) fn all_changed(&self) {
        for slot in self.map().values() {
            slot.changed.notify_waiters();
        }
    }
}
