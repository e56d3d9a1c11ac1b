//! The renewal thread that keeps a `Locker`'s leases alive.
//!
//! Renewal runs on a plain thread, not on the Tokio runtime: a lease must be
//! kept (or its loss reported) when the runtime is saturated, has no timer
//! driver, or has shut down while guards are still alive. One thread per
//! `Locker` serves all its leases from a deadline queue; it starts with the
//! first lease and ends when none is left. Each entry holds only a `Weak`
//! to its lease. Scheduling is "delay": a renewal that runs late is followed
//! by the next one a full interval later, never by a burst.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crate::guard::{Lease, Step};

/// Hands leases to the renewal thread. Clones share the thread.
#[derive(Debug, Default, Clone)]
pub(crate) struct Renewer {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct State {
    due: BinaryHeap<Reverse<(Instant, u64)>>,
    leases: HashMap<u64, (Instant, Weak<Lease>)>,
    next_id: u64,
    running: bool,
    /// When the thread will wake by itself; `None` while it idles.
    sleeping_until: Option<Instant>,
}

/// A lease's place in the queue; dropping it takes the lease out.
#[derive(Debug)]
pub(crate) struct Registration {
    shared: Weak<Shared>,
    id: u64,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Renewer {
    /// Schedules `lease` for its first renewal `first` from now (the lease
    /// then says when the next one is due), starting the thread if needed.
    /// `None` if no thread could be started; the lease then lapses, and its
    /// guard reports the loss from the clock.
    pub(crate) fn add(&self, lease: &Arc<Lease>, first: Duration) -> Option<Registration> {
        let mut state = self.shared.state();
        let id = state.next_id;
        state.next_id += 1;
        let now = Instant::now();
        let at = now.checked_add(first).unwrap_or(now);
        // The thread sleeps until the earliest due renewal; only a lease due
        // sooner than that (or an idle thread) needs to wake it.
        let sooner = state.sleeping_until.is_none_or(|until| at < until);
        state.leases.insert(id, (at, Arc::downgrade(lease)));
        state.due.push(Reverse((at, id)));
        if state.running {
            if sooner {
                self.shared.wake.notify_one();
            }
        } else {
            let shared = Arc::clone(&self.shared);
            let spawned = std::thread::Builder::new()
                .name("leasehold-renew".into())
                .spawn(move || run(&shared));
            if let Err(error) = spawned {
                tracing::error!(%error, "cannot start the lease renewal thread");
                state.leases.remove(&id);
                return None;
            }
            state.running = true;
        }
        Some(Registration {
            shared: Arc::downgrade(&self.shared),
            id,
        })
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            let mut state = shared.state();
            state.leases.remove(&self.id);
            let State { due, leases, .. } = &mut *state;
            crate::timer::compact(due, leases);
        }
    }
}

/// How long the thread waits for new leases once it has none: starting a
/// thread costs more than a whole uncontended acquisition, so a `Locker`
/// that takes locks one after another keeps it.
const IDLE_LINGER: Duration = Duration::from_secs(5);

fn run(shared: &Arc<Shared>) {
    let mut state = shared.state();
    loop {
        if state.leases.is_empty() {
            // The Locker is gone (only this thread holds the queue), or
            // nothing came for a while: stop.
            if Arc::strong_count(shared) == 1 {
                state.running = false;
                return;
            }
            state.sleeping_until = None;
            let (next, timeout) = shared
                .wake
                .wait_timeout(state, IDLE_LINGER)
                .unwrap_or_else(|e| e.into_inner());
            state = next;
            if timeout.timed_out() && state.leases.is_empty() {
                state.running = false;
                return;
            }
            continue;
        }
        let now = Instant::now();
        let Some(&Reverse((at, id))) = state.due.peek() else {
            // Every lease is scheduled; an empty heap cannot have leases.
            state.running = false;
            return;
        };
        if at > now {
            state.sleeping_until = Some(at);
            state = shared
                .wake
                .wait_timeout(state, at - now)
                .map(|(s, _)| s)
                .unwrap_or_else(|e| e.into_inner().0);
            continue;
        }
        state.due.pop();
        let lease = match state.leases.get(&id) {
            Some((scheduled, lease)) if *scheduled == at => lease.upgrade(),
            // Removed, or rescheduled since: a stale heap entry.
            _ => continue,
        };
        drop(state);
        let step = lease.map_or(Step::Stop, |lease| lease.renew_once());
        state = shared.state();
        match step {
            Step::Again(after) => {
                if let Some(entry) = state.leases.get_mut(&id) {
                    let next = Instant::now() + after;
                    entry.0 = next;
                    state.due.push(Reverse((next, id)));
                }
            }
            Step::Stop => {
                state.leases.remove(&id);
            }
        }
    }
}
