//! Counters behind `Locker::stats()`.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use crate::stale::StaleReason;

/// A snapshot of what a [`Locker`](crate::Locker) has done since it was
/// built. Cheap to take: a few dozen relaxed atomic loads, and no lock.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// let dir = tempfile::tempdir().unwrap();
/// let locker = leasehold::Locker::new(dir.path())?;
/// drop(locker.acquire("a").await?);
/// let stats = locker.stats();
/// assert_eq!(stats.acquisitions, 1);
/// assert_eq!(stats.contended, 0);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Locks handed to callers (not counting re-entrant guards), of every
    /// kind.
    pub acquisitions: u64,
    /// Of `acquisitions`, the shared ones ([`Locker::acquire_shared`](crate::Locker::acquire_shared)
    /// and its kin), counting each guard, also those that joined a shared
    /// hold this process already had.
    pub shared_acquisitions: u64,
    /// Of `acquisitions`, the semaphore permits
    /// ([`Semaphore::acquire`](crate::Semaphore::acquire) and its kin).
    pub permit_acquisitions: u64,
    /// Acquisitions that had to wait for another holder first.
    pub contended: u64,
    /// Re-entrant guards handed out inside a [`scope`](crate::Locker::scope).
    pub reentrant: u64,
    /// Acquisitions served by passing a held lock from one task to the next
    /// in this process, without touching the disk.
    pub handoffs: u64,
    /// `acquire_timeout` calls that timed out.
    pub timeouts: u64,
    /// Attempts to take a lock on disk (create, or inspect and maybe
    /// reclaim). Waiters queued behind another task make none.
    pub fs_attempts: u64,
    /// Tasks waiting on the disk for a lock right now: at most one per name.
    pub fs_waiters: u64,
    /// The most tasks that were ever waiting on the disk at once.
    pub fs_waiters_max: u64,
    /// Stale locks reclaimed because their owner was dead (including a
    /// reused pid or a previous boot).
    pub reclaimed_dead_owner: u64,
    /// Stale locks reclaimed because their lease had expired.
    pub reclaimed_expired_lease: u64,
    /// Stale locks reclaimed because their record stayed unreadable.
    pub reclaimed_unreadable: u64,
    /// Successful lease renewals.
    pub renewals: u64,
    /// Failed lease renewals (the lock is lost only if they keep failing).
    pub renewal_failures: u64,
    /// Locks lost while held.
    pub lost: u64,
    /// Acquisitions whose wait was measured: all of them but re-entrant
    /// guards and shared acquisitions that joined, at once, a shared hold
    /// this process already had.
    pub wait_count: u64,
    /// Total time spent waiting in `acquire*`.
    pub wait_total: Duration,
    /// The longest single wait.
    pub wait_max: Duration,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// The counters every acquisition moves, one set per stripe (below).
    stripes: [Stripe; STRIPES],
    /// Shared acquisitions that joined this process's hold at once: no
    /// wait measured, so counted apart from the stripes' `measured`.
    pub(crate) joined_locally: AtomicU64,
    pub(crate) shared_acquisitions: AtomicU64,
    pub(crate) permit_acquisitions: AtomicU64,
    pub(crate) reentrant: AtomicU64,
    pub(crate) timeouts: AtomicU64,
    pub(crate) fs_attempts: AtomicU64,
    pub(crate) fs_waiters: AtomicU64,
    pub(crate) fs_waiters_max: AtomicU64,
    pub(crate) reclaimed_dead_owner: AtomicU64,
    pub(crate) reclaimed_expired_lease: AtomicU64,
    pub(crate) reclaimed_unreadable: AtomicU64,
    pub(crate) renewals: AtomicU64,
    pub(crate) renewal_failures: AtomicU64,
    pub(crate) lost: AtomicU64,
    pub(crate) wait_max_ns: AtomicU64,
}

/// How many sets of the hot counters a `Locker` keeps.
const STRIPES: usize = 8;

/// The calling thread's stripe: threads take the stripes in turn, the
/// first time each counts.
fn stripe_index() -> usize {
    thread_local! {
        static STRIPE: Cell<Option<usize>> = const { Cell::new(None) };
    }
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    STRIPE
        .try_with(|stripe| {
            stripe.get().unwrap_or_else(|| {
                let at = NEXT.fetch_add(1, Relaxed) % STRIPES;
                stripe.set(Some(at));
                at
            })
        })
        .unwrap_or(0)
}

/// The counters every acquisition moves, kept apart per thread: a
/// thread adds to its own stripe, on a cache line no other thread of the
/// runtime writes (unless more threads than stripes count at once, which
/// shares a line but loses nothing), and [`Counters::snapshot`] adds the
/// stripes up. One shared set had the runtime's workers pass its line
/// back and forth on every handoff. An in-process handoff moves three:
/// `Stats::wait_count` is `measured`, `Stats::acquisitions` adds
/// `joined_locally`, and `Stats::contended` is `contended` and `handoffs`
/// (a handoff always waited for its giver).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Stripe {
    /// Acquisitions whose wait was measured.
    measured: AtomicU64,
    /// Of those, the ones that waited for another holder and were not
    /// handoffs.
    contended: AtomicU64,
    handoffs: AtomicU64,
    wait_total_ns: AtomicU64,
}

impl Stripe {
    /// Counts a lock handed to a caller after `waited`, and how it came.
    pub(crate) fn acquired(&self, came: Came, waited: Duration) {
        bump(&self.measured);
        match came {
            Came::Free => {}
            Came::AfterWaiting => bump(&self.contended),
            Came::Handoff => bump(&self.handoffs),
        }
        let ns = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.wait_total_ns.fetch_add(ns, Relaxed);
    }
}

/// How an acquisition whose wait was measured got its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Came {
    /// Nobody held it: not contended.
    Free,
    /// After waiting for another holder (contended).
    AfterWaiting,
    /// Handed over by the previous holder in this process (contended).
    Handoff,
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Relaxed);
}

impl Counters {
    /// The calling thread's stripe of the hot counters.
    pub(crate) fn stripe(&self) -> &Stripe {
        &self.stripes[stripe_index()]
    }

    /// One of the hot counters, added up over the stripes.
    fn sum(&self, counter: impl Fn(&Stripe) -> &AtomicU64) -> u64 {
        self.stripes.iter().fold(0u64, |sum, stripe| {
            sum.saturating_add(counter(stripe).load(Relaxed))
        })
    }

    pub(crate) fn snapshot(&self) -> Stats {
        // Each sum read once, so that one snapshot agrees with itself
        // (`handoffs <= contended`, `wait_count <= acquisitions`) however
        // the counters move meanwhile.
        let measured = self.sum(|s| &s.measured);
        let handoffs = self.sum(|s| &s.handoffs);
        Stats {
            acquisitions: measured.saturating_add(self.joined_locally.load(Relaxed)),
            shared_acquisitions: self.shared_acquisitions.load(Relaxed),
            permit_acquisitions: self.permit_acquisitions.load(Relaxed),
            contended: self.sum(|s| &s.contended).saturating_add(handoffs),
            reentrant: self.reentrant.load(Relaxed),
            handoffs,
            timeouts: self.timeouts.load(Relaxed),
            fs_attempts: self.fs_attempts.load(Relaxed),
            fs_waiters: self.fs_waiters.load(Relaxed),
            fs_waiters_max: self.fs_waiters_max.load(Relaxed),
            reclaimed_dead_owner: self.reclaimed_dead_owner.load(Relaxed),
            reclaimed_expired_lease: self.reclaimed_expired_lease.load(Relaxed),
            reclaimed_unreadable: self.reclaimed_unreadable.load(Relaxed),
            renewals: self.renewals.load(Relaxed),
            renewal_failures: self.renewal_failures.load(Relaxed),
            lost: self.lost.load(Relaxed),
            wait_count: measured,
            wait_total: Duration::from_nanos(self.sum(|s| &s.wait_total_ns)),
            wait_max: Duration::from_nanos(self.wait_max_ns.load(Relaxed)),
        }
    }

    pub(crate) fn reclaimed(&self, reason: StaleReason) {
        bump(match reason {
            StaleReason::DeadOwner | StaleReason::ReusedPid | StaleReason::PreviousBoot => {
                &self.reclaimed_dead_owner
            }
            StaleReason::LeaseExpired => &self.reclaimed_expired_lease,
            StaleReason::Unreadable | StaleReason::Leftover => &self.reclaimed_unreadable,
        });
    }

    /// Counts a lock handed to a caller after `waited` (see
    /// [`Stripe::acquired`]), and keeps the longest wait.
    pub(crate) fn acquired(&self, came: Came, waited: Duration) {
        self.stripe().acquired(came, waited);
        let ns = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        // Most waits set no record: a load, not a write to a shared line.
        if ns > self.wait_max_ns.load(Relaxed) {
            self.wait_max_ns.fetch_max(ns, Relaxed);
        }
    }

    /// Counts a task starting to wait on the disk; the returned token
    /// counts it out again when dropped.
    pub(crate) fn fs_waiter(&self) -> FsWaiter<'_> {
        let now = self.fs_waiters.fetch_add(1, Relaxed) + 1;
        self.fs_waiters_max.fetch_max(now, Relaxed);
        FsWaiter(self)
    }
}

#[derive(Debug)]
pub(crate) struct FsWaiter<'a>(&'a Counters);

impl Drop for FsWaiter<'_> {
    fn drop(&mut self) {
        self.0.fs_waiters.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More threads than stripes, each counting on its own: nothing is
    /// lost, and the snapshot adds every stripe up.
    #[test]
    fn counts_from_many_threads_add_up() {
        let counters = Counters::default();
        let threads = STRIPES * 2 + 3;
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    for _ in 0..1_000 {
                        counters.acquired(Came::Free, Duration::from_nanos(3));
                        counters.acquired(Came::AfterWaiting, Duration::from_nanos(4));
                        counters.acquired(Came::Handoff, Duration::from_nanos(5));
                        bump(&counters.joined_locally);
                    }
                });
            }
        });
        let stats = counters.snapshot();
        let n = u64::try_from(threads).unwrap() * 1_000;
        assert_eq!(stats.acquisitions, 4 * n);
        assert_eq!(stats.contended, 2 * n);
        assert_eq!(stats.handoffs, n);
        assert_eq!(stats.wait_count, 3 * n);
        assert_eq!(stats.wait_total, Duration::from_nanos(12 * n));
        assert_eq!(stats.wait_max, Duration::from_nanos(5));
    }

    /// One thread keeps to one stripe; threads are spread over them.
    #[test]
    fn a_thread_keeps_its_stripe() {
        let counters = Counters::default();
        let first: *const Stripe = counters.stripe();
        assert!(std::ptr::eq(first, counters.stripe()));
        let others: Vec<usize> = (0..STRIPES)
            .map(|_| std::thread::spawn(stripe_index).join().unwrap())
            .collect();
        let mut distinct = others.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 1, "threads all on one stripe: {others:?}");
    }
}
