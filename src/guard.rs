//! The RAII guard and the lease state it shares with its renewal task.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::owner::Owner;
use crate::renew::Renewer;
use crate::strategy::{Held, Renewal};
use crate::sys;

/// A held lock. Dropping it releases the lock.
///
/// The guard owns a background task that renews the lease every
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
/// them as a `Result`.
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
    /// `None` once released; `Drop` and `release` share this one path.
    active: Option<Active>,
    name: Arc<str>,
    lost: watch::Receiver<Option<Arc<str>>>,
    owner: Owner,
}

#[derive(Debug)]
struct Active {
    lease: Arc<Lease>,
    renewer: JoinHandle<()>,
}

impl Active {
    /// Stops renewal and hands back the lease, ready to release.
    fn stop(self) -> Arc<Lease> {
        self.renewer.abort();
        self.lease
    }
}

/// State shared between a guard and its renewal task (which holds only a
/// `Weak` to it).
#[derive(Debug)]
pub(crate) struct Lease {
    name: Arc<str>,
    held: Mutex<Option<Held>>,
    lost: watch::Sender<Option<Arc<str>>>,
    renew_interval: Duration,
    margin_ms: u64,
}

/// What the renewal task should do next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Renew again after this long.
    Again(Duration),
    /// The lock is released or lost: stop.
    Stop,
}

impl LockGuard {
    pub(crate) fn new(name: &str, held: Held, lease: Duration, renew_interval: Duration) -> Self {
        let owner = held.owner();
        let (lost_tx, lost_rx) = watch::channel(None);
        let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        let renew_ms = u64::try_from(renew_interval.as_millis()).unwrap_or(u64::MAX);
        let name: Arc<str> = name.into();
        let lease = Arc::new(Lease {
            name: Arc::clone(&name),
            held: Mutex::new(Some(held)),
            lost: lost_tx,
            renew_interval,
            margin_ms: margin_ms(lease_ms, renew_ms),
        });
        let renewer = tokio::spawn(Renewer::new(&lease, renew_interval).run());
        LockGuard {
            active: Some(Active { lease, renewer }),
            name,
            lost: lost_rx,
            owner,
        }
    }

    /// The lock name, as given to `acquire`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The record this guard wrote when it took the lock.
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
        // An error means the sender is gone, which only happens with the
        // guard itself; treat it as lost.
        let _ = rx.wait_for(Option::is_some).await;
    }

    /// Releases the lock now and reports what happened.
    ///
    /// Removes the lock only if it is still this guard's; a lock that was
    /// taken over is left to its new holder.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] if the lock was no longer ours (lost earlier or found
    /// replaced now), and I/O errors from removing the lock file.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before completion the release still happens,
    /// on the blocking pool or in the guard's drop.
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
        let Some(active) = self.active.take() else {
            return Ok(());
        };
        let lease = active.stop();
        // If this future is dropped, the blocking task still runs; if the
        // runtime refuses it, dropping the closure drops the lease, whose
        // lock removes itself.
        let released = tokio::task::spawn_blocking(move || lease.release_now())
            .await
            .map_err(|e| Error::io("release lock", "", std::io::Error::other(e)))??;
        if released {
            return Ok(());
        }
        let reason = match self.lost.borrow().as_deref() {
            Some(reason) => reason.to_owned(),
            None => "the lock file was removed or replaced".to_owned(),
        };
        Err(Error::Lost {
            name: self.name.to_string(),
            reason,
        })
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(active) = self.active.take()
            && let Err(error) = active.stop().release_now()
        {
            tracing::warn!(lock = &*self.name, %error, "releasing a dropped guard failed");
        }
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
                tracing::trace!(lock = &*self.name, "lease renewed");
                Step::Again(self.renew_interval)
            }
            Ok(Renewal::NotOurs(why)) => {
                self.lose(&mut slot, why.into());
                Step::Stop
            }
            Err(error) => {
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
