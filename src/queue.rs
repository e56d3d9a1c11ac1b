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
use std::time::Duration;

use tokio::sync::{Notify, oneshot};

use crate::guard::Hold;

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
#[derive(Debug, Default)]
pub(crate) struct Slot {
    state: Mutex<State>,
    /// Woken when the lock file may have become free; awaited by the head.
    pub(crate) changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Someone holds the turn.
    busy: bool,
    next_ticket: u64,
    waiting: VecDeque<(u64, oneshot::Sender<Turn>)>,
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
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the turn if it is free, else joins the back of the queue.
    pub(crate) fn join(self: &Arc<Self>) -> Join {
        let mut state = self.state();
        if !state.busy {
            state.busy = true;
            return Join::Head(Head::new(self));
        }
        let id = state.next_ticket;
        state.next_ticket += 1;
        let (tx, rx) = oneshot::channel();
        state.waiting.push_back((id, tx));
        Join::Queued(Ticket {
            slot: Arc::clone(self),
            id,
            rx,
            done: false,
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
    fn offer(&self, mut hold: Hold) -> Option<Hold> {
        let mut state = self.state();
        while let Some((_, tx)) = state.waiting.pop_front() {
            match tx.send(Turn::Handoff(hold)) {
                Ok(()) => return None,
                Err(turn) => hold = turn.into_hold()?,
            }
        }
        Some(hold)
    }

    /// Passes the turn, without a lock, to the next waiter, or frees it.
    pub(crate) fn pass_fresh(&self, courtesy: bool) {
        let mut state = self.state();
        while let Some((_, tx)) = state.waiting.pop_front() {
            if tx.send(Turn::Fresh { courtesy }).is_ok() {
                return;
            }
        }
        state.busy = false;
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
    slot: Arc<Slot>,
    id: u64,
    rx: oneshot::Receiver<Turn>,
    done: bool,
}

impl Ticket {
    pub(crate) async fn wait(mut self) -> Turn {
        let turn = (&mut self.rx).await;
        self.done = true;
        // The sender is only dropped unsent when the slot is; it cannot be
        // while we hold it. Should it happen, going to the disk is safe.
        turn.unwrap_or(Turn::Fresh { courtesy: false })
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.slot.state().waiting.retain(|(id, _)| *id != self.id);
        // Popped (and sent to) before we could leave: pass the turn on.
        match self.rx.try_recv() {
            Ok(Turn::Handoff(hold)) => self.slot.pass_on(hold),
            Ok(Turn::Fresh { courtesy }) => self.slot.pass_fresh(courtesy),
            Err(_) => {}
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

    pub(crate) fn get(&self, file_name: &str) -> Arc<Slot> {
        let mut map = self.map();
        if let Some(slot) = map.get(file_name) {
            return Arc::clone(slot);
        }
        // Forget idle queues now and then, so a service that locks many
        // distinct names does not keep one queue per name forever.
        if map.len() >= 64 && map.len().is_power_of_two() {
            // Only the map holds an idle queue.
            map.retain(|_, slot| Arc::strong_count(slot) > 1);
        }
        let slot = Arc::new(Slot::default());
        map.insert(file_name.to_owned(), Arc::clone(&slot));
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
