//! Counters behind `Locker::stats()`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::stale::StaleReason;

/// A snapshot of what a [`Locker`](crate::Locker) has done since it was
/// built. Cheap to take: a handful of relaxed atomic loads.
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
    /// Acquisitions whose wait was measured (all of them but re-entrant).
    pub wait_count: u64,
    /// Total time spent waiting in `acquire*`.
    pub wait_total: Duration,
    /// The longest single wait.
    pub wait_max: Duration,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) acquisitions: AtomicU64,
    pub(crate) shared_acquisitions: AtomicU64,
    pub(crate) permit_acquisitions: AtomicU64,
    pub(crate) contended: AtomicU64,
    pub(crate) reentrant: AtomicU64,
    pub(crate) handoffs: AtomicU64,
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
    pub(crate) wait_count: AtomicU64,
    pub(crate) wait_total_ns: AtomicU64,
    pub(crate) wait_max_ns: AtomicU64,
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Relaxed);
}

impl Counters {
    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            acquisitions: self.acquisitions.load(Relaxed),
            shared_acquisitions: self.shared_acquisitions.load(Relaxed),
            permit_acquisitions: self.permit_acquisitions.load(Relaxed),
            contended: self.contended.load(Relaxed),
            reentrant: self.reentrant.load(Relaxed),
            handoffs: self.handoffs.load(Relaxed),
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
            wait_count: self.wait_count.load(Relaxed),
            wait_total: Duration::from_nanos(self.wait_total_ns.load(Relaxed)),
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

    pub(crate) fn waited(&self, waited: Duration) {
        let ns = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.wait_count.fetch_add(1, Relaxed);
        self.wait_total_ns.fetch_add(ns, Relaxed);
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
