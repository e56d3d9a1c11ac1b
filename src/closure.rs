//! The closure form: take a lock, run a future under it, let it go.
//!
//! pi-research's `FileLockService` calls its `withLock(callback)` "the
//! preferred way to use the lock service"; [`Locker::with_lock`] is the
//! same, with one more promise: the future never runs on without the lock.

use std::future::Future;
use std::time::Duration;

use crate::error::{Error, LossReason, Result};
use crate::guard::LockGuard;
use crate::locker::Locker;

impl Locker {
    /// Acquires `name`, runs `fut` while holding it, releases it, and
    /// returns `fut`'s output.
    ///
    /// `fut` runs inside a [`scope`](Self::scope), so acquisitions of
    /// `name` nested in it (a helper that takes the same lock) are
    /// re-entrant. If the lock is lost while `fut` runs (see
    /// [`LockGuard::lost`]), `fut` is dropped at once, at its next
    /// `.await`, and [`Error::Lost`] is returned: the critical section never
    /// goes on without the lock. Otherwise the lock is released when `fut`
    /// finishes, and a loss noticed by that release is also
    /// [`Error::Lost`] (the output is then dropped: it was computed partly
    /// without the lock).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), and [`Error::Lost`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the returned future drops `fut` and releases
    /// the lock.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let total = locker
    ///     .with_lock("ledger", async {
    ///         // Nested acquisitions of the name re-enter the lock.
    ///         let _again = locker.acquire("ledger").await?;
    ///         Ok::<_, leasehold::Error>(40 + 2)
    ///     })
    ///     .await??;
    /// assert_eq!(total, 42);
    /// assert!(!locker.is_held("ledger").await?);
    /// # Ok(()) }
    /// ```
    pub async fn with_lock<F: Future>(&self, name: &str, fut: F) -> Result<F::Output> {
        // Taken inside the scope, so that the scope remembers it.
        self.scope(async {
            let guard = self.acquire(name).await?;
            run_holding(guard, fut).await
        })
        .await
    }

    /// As [`with_lock`](Self::with_lock), waiting at most `timeout` for the
    /// lock (the future itself is not timed).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the lock was still held at the deadline;
    /// otherwise as [`with_lock`](Self::with_lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`with_lock`](Self::with_lock).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use std::time::Duration;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _held = locker.acquire("deploy").await?;
    /// let other = leasehold::Locker::new(dir.path())?;
    /// let err = other
    ///     .with_lock_timeout("deploy", Duration::from_millis(30), async {})
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.is_timeout());
    /// # Ok(()) }
    /// ```
    pub async fn with_lock_timeout<F: Future>(
        &self,
        name: &str,
        timeout: Duration,
        fut: F,
    ) -> Result<F::Output> {
        self.scope(async {
            let guard = self.acquire_timeout(name, timeout).await?;
            run_holding(guard, fut).await
        })
        .await
    }
}

/// Runs `fut` while `guard` holds its lock, until it ends or the lock is
/// lost (then `fut` is dropped), and releases the lock.
async fn run_holding<F: Future>(guard: LockGuard, fut: F) -> Result<F::Output> {
    let out = tokio::select! {
        biased;
        () = guard.lost() => None,
        out = fut => Some(out),
    };
    match out {
        Some(out) => {
            guard.release().await?;
            Ok(out)
        }
        None => {
            let name = guard.name().to_owned();
            let error = guard.ensure_held().await.err();
            drop(guard);
            Err(error.unwrap_or(Error::Lost {
                name,
                reason: LossReason::LeaseExpired,
            }))
        }
    }
}
