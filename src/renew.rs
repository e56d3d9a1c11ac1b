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

pub(crate) use crate::backend::{Renewable, Step};

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
    leases: HashMap<u64, (Instant, Weak<dyn Renewable>)>,
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
    pub(crate) fn add<R: Renewable + 'static>(
        &self,
        lease: &Arc<R>,
        first: Duration,
    ) -> Option<Registration> {
        self.add_weak(Arc::downgrade(lease) as Weak<dyn Renewable>, first)
    }

    /// As [`add`](Self::add), for a renewable known only as a trait object.
    pub(crate) fn add_weak(&self, weak: Weak<dyn Renewable>, first: Duration) -> Option<Registration> {
        let mut state = self.shared.state();
        let id = state.next_id;
        state.next_id += 1;
        let now = Instant::now();
        let at = now.checked_add(first).unwrap_or(now);
        // The thread sleeps until the earliest due renewal; only a lease due
        // sooner than that (or an idle thread) needs to wake it.
        let sooner = state.sleeping_until.is_none_or(|until| at < until);
        state.leases.insert(id, (at, weak));
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A lease that logs its renewals and asks to come back as told.
    struct Fake {
        id: u32,
        log: Arc<Mutex<Vec<(u32, Instant)>>>,
        again: Mutex<Vec<Step>>,
    }

    impl Renewable for Fake {
        fn renew_once(&self) -> Step {
            self.log.lock().unwrap().push((self.id, Instant::now()));
            self.again.lock().unwrap().pop().unwrap_or(Step::Stop)
        }
    }

    fn fake(id: u32, log: &Arc<Mutex<Vec<(u32, Instant)>>>, again: Vec<Step>) -> Arc<Fake> {
        Arc::new(Fake {
            id,
            log: Arc::clone(log),
            again: Mutex::new(again),
        })
    }

    fn wait_for(log: &Arc<Mutex<Vec<(u32, Instant)>>>, n: usize) {
        let give_up = Instant::now() + Duration::from_secs(10);
        while log.lock().unwrap().len() < n {
            assert!(Instant::now() < give_up, "only {:?}", log.lock().unwrap());
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn leases_are_renewed_in_deadline_order() {
        let renewer = Renewer::default();
        let log = Arc::default();
        let late = fake(2, &log, vec![]);
        let soon = fake(1, &log, vec![]);
        let start = Instant::now();
        // Far apart: a stall of a slow machine (100 ms and more) between
        // the two `add`s must not put the late one first.
        let _late = renewer.add(&late, Duration::from_secs(2));
        let _soon = renewer.add(&soon, Duration::from_millis(20));
        wait_for(&log, 2);
        let log = log.lock().unwrap();
        assert_eq!(log.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [1, 2]);
        assert!(
            log[0].1 >= start + Duration::from_millis(20),
            "not before it was due"
        );
        assert!(
            log[1].1 >= start + Duration::from_secs(2),
            "not before it was due"
        );
    }

    #[test]
    fn a_lease_comes_back_after_the_delay_it_asked_for() {
        let renewer = Renewer::default();
        let log = Arc::default();
        // Popped from the back: 30 ms, then 10 ms, then stop.
        let lease = fake(
            1,
            &log,
            vec![
                Step::Again(Duration::from_millis(10)),
                Step::Again(Duration::from_millis(30)),
            ],
        );
        let _registration = renewer.add(&lease, Duration::ZERO);
        wait_for(&log, 3);
        let at: Vec<Instant> = log.lock().unwrap().iter().map(|(_, at)| *at).collect();
        // "Delay" scheduling: each gap is at least what was asked, counted
        // from when the renewal ran, however late it ran.
        assert!(at[1] - at[0] >= Duration::from_millis(30), "{at:?}");
        assert!(at[2] - at[1] >= Duration::from_millis(10), "{at:?}");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(log.lock().unwrap().len(), 3, "stopped when told");
    }

    #[test]
    fn a_lease_due_sooner_than_the_thread_sleeps_wakes_it() {
        let renewer = Renewer::default();
        let log = Arc::default();
        let far = fake(1, &log, vec![]);
        let _far = renewer.add(&far, Duration::from_secs(3600));
        // The thread now sleeps for an hour; a lease due at once must not
        // wait for that.
        std::thread::sleep(Duration::from_millis(20));
        let near = fake(2, &log, vec![]);
        let _near = renewer.add(&near, Duration::ZERO);
        wait_for(&log, 1);
        assert_eq!(log.lock().unwrap()[0].0, 2);
    }

    #[test]
    fn a_removed_lease_is_not_renewed() {
        let renewer = Renewer::default();
        let log = Arc::default();
        let removed = fake(1, &log, vec![]);
        let kept = fake(2, &log, vec![]);
        let registration = renewer.add(&removed, Duration::from_millis(30));
        let _kept = renewer.add(&kept, Duration::from_millis(60));
        drop(registration);
        wait_for(&log, 1);
        std::thread::sleep(Duration::from_millis(50));
        let ids: Vec<u32> = log.lock().unwrap().iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, [2]);
        assert!(renewer.shared.state().leases.is_empty(), "stopped and forgotten");
    }

    #[test]
    fn a_dropped_lease_is_skipped() {
        let renewer = Renewer::default();
        let log = Arc::default();
        let gone = fake(1, &log, vec![Step::Again(Duration::from_millis(1))]);
        let registration = renewer.add(&gone, Duration::from_millis(10));
        drop(gone); // only the thread's weak reference is left
        std::thread::sleep(Duration::from_millis(60));
        assert!(log.lock().unwrap().is_empty());
        drop(registration);
    }
}
