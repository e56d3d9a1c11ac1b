//! The RAII guard, the hold it shares, and the lease state the renewal task
//! keeps alive.
//!
//! Ownership, from the outside in: a [`LockGuard`] holds an `Arc<Share>`;
//! every guard that re-entered the lock in one scope holds the same
//! `Share`. The `Share` owns the [`Hold`] (the lock as this process holds
//! it: lease plus renewal task). When the last guard goes, the `Share` gives
//! the `Hold` back to the name's queue, which hands it to the next local
//! waiter or releases it on disk.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::owner::Owner;
use crate::queue::Slot;
use crate::renew::Renewer;
use crate::stats::{Counters, bump};
use crate::strategy::{Held, Renewal};
use crate::sys;

/// A held lock. Dropping it releases the lock.
///
/// The guard owns a share in a background task that renews the lease every
/// `renew_interval`. If the lock is lost anyway (the lease ran out while the
/// process was paused, someone removed the lock file, the disk failed),
/// [`lost`](Self::lost) resolves and [`is_lost`](Self::is_lost) turns true;
/// nothing panics.
///
/// Dropping the guard stops the renewal task and removes the lock
/// synchronously (a few syscalls, no `.await`), so when `drop` returns
/// another process can take the lock at once. It works outside a runtime
/// too, for example after the runtime has shut down. Failures while dropping
/// are reported through `tracing`; call [`release`](Self::release) to get
/// them as a `Result`. Two exceptions, both by design: a task of the same
/// [`Locker`](crate::Locker) waiting for the name receives the lock directly
/// instead (see *Fairness* on `Locker`), and inside a
/// [`scope`](crate::Locker::scope) the lock is released when the *last*
/// guard of that name goes.
///
/// The guard is an owned permit: `Send + Sync + 'static`, no `Deref`. It can
/// be moved to another task or thread.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// let dir = tempfile::tempdir().unwrap();
/// let locker = leasehold::Locker::new(dir.path())?;
///
/// let guard = locker.acquire("migrations").await?;
/// assert_eq!(guard.name(), "migrations");
/// assert!(!guard.is_lost());
/// guard.release().await?;
/// assert!(!locker.is_held("migrations").await?);
/// # Ok(()) }
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct LockGuard {
    /// `None` once `release` took it.
    share: Option<Arc<Share>>,
    name: Arc<str>,
    lost: watch::Receiver<Option<Arc<str>>>,
    owner: Owner,
}

/// One holding of a lock, shared by the guards that re-entered it.
#[derive(Debug)]
pub(crate) struct Share {
    hold: Mutex<Option<Hold>>,
    slot: Arc<Slot>,
}

/// The lock as this process holds it. It moves from guard to guard on an
/// in-process handoff, renewal task and all.
#[derive(Debug)]
pub(crate) struct Hold {
    lease: Arc<Lease>,
    renewer: JoinHandle<()>,
    /// When this hold was taken from the disk (handoffs do not reset it).
    since: Instant,
}

/// State shared between a hold and its renewal task (which holds only a
/// `Weak` to it).
#[derive(Debug)]
pub(crate) struct Lease {
    name: Arc<str>,
    held: Mutex<Option<Held>>,
    lost: watch::Sender<Option<Arc<str>>>,
    owner: Owner,
    renew_interval: Duration,
    margin_ms: u64,
    counters: Arc<Counters>,
}

/// What the renewal task should do next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Renew again after this long.
    Again(Duration),
    /// The lock is released or lost: stop.
    Stop,
}

impl Hold {
    pub(crate) fn new(
        name: &str,
        held: Held,
        lease: Duration,
        renew_interval: Duration,
        counters: &Arc<Counters>,
    ) -> Self {
        let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        let renew_ms = u64::try_from(renew_interval.as_millis()).unwrap_or(u64::MAX);
        let lease = Arc::new(Lease {
            name: name.into(),
            owner: held.owner(),
            held: Mutex::new(Some(held)),
            lost: watch::Sender::new(None),
            renew_interval,
            margin_ms: margin_ms(lease_ms, renew_ms),
            counters: Arc::clone(counters),
        });
        let renewer = tokio::spawn(Renewer::new(&lease, renew_interval).run());
        Hold {
            lease,
            renewer,
            since: Instant::now(),
        }
    }

    pub(crate) fn since(&self) -> Instant {
        self.since
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lease.lost.borrow().is_some()
    }

    /// Stops renewal and removes the lock from disk if it is still ours;
    /// failures go to `tracing`.
    pub(crate) fn release_sync(self) {
        self.renewer.abort();
        if let Err(error) = self.lease.release_now() {
            tracing::warn!(lock = &*self.lease.name, %error, "releasing a lock failed");
        }
    }
}

impl Share {
    /// A share holding `hold`, and its first guard.
    pub(crate) fn new(hold: Hold, slot: Arc<Slot>) -> (Arc<Self>, LockGuard) {
        let lease = &hold.lease;
        let (name, lost, owner) = (
            Arc::clone(&lease.name),
            lease.lost.subscribe(),
            lease.owner.clone(),
        );
        let share = Arc::new(Share {
            hold: Mutex::new(Some(hold)),
            slot,
        });
        let guard = LockGuard {
            share: Some(Arc::clone(&share)),
            name,
            lost,
            owner,
        };
        (share, guard)
    }

    fn take(&self) -> Option<Hold> {
        self.hold.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// A guard on this share (a new acquisition or a re-entry).
    pub(crate) fn guard(self: &Arc<Self>) -> Option<LockGuard> {
        let slot = self.hold.lock().unwrap_or_else(|e| e.into_inner());
        let lease = &slot.as_ref()?.lease;
        Some(LockGuard {
            name: Arc::clone(&lease.name),
            lost: lease.lost.subscribe(),
            owner: lease.owner.clone(),
            share: Some(Arc::clone(self)),
        })
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        if let Some(hold) = self.take() {
            self.slot.pass_on(hold);
        }
    }
}

impl LockGuard {
    /// The lock name, as given to `acquire`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The record written when the lock was taken from the disk.
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// Whether the lock has been lost (see [`lost`](Self::lost)).
    ///
    /// This is what the renewal task last found; it does not touch the disk.
    pub fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// Resolves once the lock has been lost: the lease ran out before it
    /// could be renewed, renewal found the lock file removed or replaced, or
    /// renewals kept failing until less than the safety margin of the lease
    /// was left (the margin is `min(renew_interval, lease / 4)`, so the
    /// holder learns before anyone may legally take over). Loss is noticed
    /// at the next renewal, so within one `renew_interval`.
    ///
    /// Stop the critical section when this resolves: someone else may hold
    /// the lock now.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use std::time::Duration;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let guard = locker.acquire("sync").await?;
    /// tokio::select! {
    ///     _ = guard.lost() => eprintln!("lost the lock, stopping"),
    ///     _ = tokio::time::sleep(Duration::from_millis(10)) => {} // the real work
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn lost(&self) {
        let mut rx = self.lost.clone();
        // An error means every sender is gone, which only happens once the
        // lock is released; treat it as lost.
        let _ = rx.wait_for(Option::is_some).await;
    }

    /// Releases the lock now and reports what happened.
    ///
    /// Removes the lock only if it is still this guard's; a lock that was
    /// taken over is left to its new holder. Inside a
    /// [`scope`](crate::Locker::scope) that re-entered the lock, only the
    /// last guard releases it; earlier ones return `Ok(())` at once.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] if the lock had been lost.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before completion the release still
    /// happens, on the blocking pool.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let guard = locker.acquire("backup").await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn release(mut self) -> Result<()> {
        let lost = |guard: &Self| {
            Err(Error::Lost {
                name: guard.name.to_string(),
                reason: match guard.lost.borrow().as_deref() {
                    Some(reason) => reason.to_owned(),
                    None => "the lock file was removed or replaced".to_owned(),
                },
            })
        };
        let Some(share) = self.share.take() else {
            return Ok(());
        };
        let Ok(share) = Arc::try_unwrap(share) else {
            // Other guards of a scope still hold it.
            return if self.is_lost() { lost(&self) } else { Ok(()) };
        };
        let Some(hold) = share.take() else {
            return Ok(());
        };
        if hold.is_lost() {
            hold.release_sync();
            share.slot.pass_fresh(false);
            return lost(&self);
        }
        let slot = Arc::clone(&share.slot);
        if slot.has_waiters() {
            slot.pass_on(hold);
            return Ok(());
        }
        // Release on the blocking pool. The queue's turn is passed on when
        // this future completes or is dropped, whichever comes first.
        struct PassOn(Arc<Slot>);
        impl Drop for PassOn {
            fn drop(&mut self) {
                self.0.pass_fresh(false);
            }
        }
        let _pass_on = PassOn(slot);
        hold.renewer.abort();
        let lease = Arc::clone(&hold.lease);
        let released = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => runtime
                .spawn_blocking(move || lease.release_now())
                .await
                .map_err(|e| Error::io("release lock", "", std::io::Error::other(e)))??,
            // Polled outside Tokio: do it here, as `Drop` would.
            Err(_) => lease.release_now()?,
        };
        if released { Ok(()) } else { lost(&self) }
    }
}

/// `min(renew_interval, lease / 4)`.
fn margin_ms(lease_ms: u64, renew_ms: u64) -> u64 {
    renew_ms.min(lease_ms / 4)
}

impl Lease {
    fn held(&self) -> MutexGuard<'_, Option<Held>> {
        // A panic while holding this lock cannot leave the Option torn.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Releases if still held; `Ok(false)` when it was already gone or not
    /// ours any more.
    pub(crate) fn release_now(&self) -> Result<bool> {
        let held = self.held().take();
        match held {
            Some(held) => held.release(),
            None => Ok(false),
        }
    }

    /// One renewal, run on the blocking pool.
    pub(crate) fn renew_once(&self) -> Step {
        let mut slot = self.held();
        let Some(held) = slot.as_mut() else {
            return Step::Stop;
        };
        let deadline = held.lease_deadline_boot_ms();
        let now = sys::boot_clock_ms();
        if now >= deadline {
            self.lose(&mut slot, "the lease expired before it could be renewed".into());
            return Step::Stop;
        }
        match held.renew() {
            Ok(Renewal::Renewed) => {
                bump(&self.counters.renewals);
                tracing::trace!(lock = &*self.name, "lease renewed");
                Step::Again(self.renew_interval)
            }
            Ok(Renewal::NotOurs(why)) => {
                self.lose(&mut slot, why.into());
                Step::Stop
            }
            Err(error) => {
                bump(&self.counters.renewal_failures);
                let give_up_at = deadline.saturating_sub(self.margin_ms);
                if now >= give_up_at {
                    self.lose(&mut slot, format!("renewal kept failing ({error})"));
                    return Step::Stop;
                }
                tracing::warn!(lock = &*self.name, %error, "lease renewal failed; retrying");
                let retry = (self.renew_interval / 4).max(Duration::from_millis(1));
                Step::Again(retry.min(Duration::from_millis(give_up_at - now)))
            }
        }
    }

    fn lose(&self, slot: &mut MutexGuard<'_, Option<Held>>, reason: String) {
        tracing::warn!(lock = &*self.name, reason, "lock lost");
        bump(&self.counters.lost);
        if let Some(held) = slot.take() {
            // Still ours on disk (say our lease ran out while we were
            // paused, and nobody took it yet)? Then free it for others.
            if let Err(error) = held.release() {
                tracing::debug!(lock = &*self.name, %error, "could not remove a lost lock");
            }
        }
        self.lost.send_replace(Some(reason.into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn margin_is_bounded_by_both_settings() {
        assert_eq!(margin_ms(30_000, 10_000), 7_500);
        assert_eq!(margin_ms(30_000, 1_000), 1_000);
    }

    #[test]
    fn guard_is_an_owned_permit() {
        fn assert_owned<T: Send + Sync + 'static>() {}
        assert_owned::<LockGuard>();
    }
}
