//! Shared (reader/writer) acquisition: many shared holders or one
//! exclusive one, across processes.
//!
//! The `Locker` side of it. How the store keeps a name held shared is the
//! backend's (files: `fs/group`; PostgreSQL: shared advisory locks); the
//! queue, the guards and the leases are those of exclusive locks.

use std::future::Future;
use std::time::Duration;

use tracing::Instrument;

use crate::acquire::Acquire;
use crate::backend::Mode;
use crate::error::Result;
use crate::guard::LockGuard;
use crate::locker::Locker;

impl Locker {
    /// Acquires `name` shared, waiting as long as it takes: any number of
    /// shared guards, in any processes, may hold a name at once, but never
    /// together with an exclusive guard ([`acquire`](Self::acquire) and
    /// its kin).
    ///
    /// **Writers do not starve.** Once an exclusive acquisition waits for
    /// the name, in this process or another, new shared acquisitions queue
    /// behind it; the shared holders it found finish, it runs, then the
    /// shared acquisitions behind it go on together.
    ///
    /// Everything else is as for exclusive locks: each shared holder keeps
    /// a lease of its own, renewed in the background, and reports its loss
    /// through [`LockGuard::lost`]; a dead holder's share is freed at once
    /// (a frozen one's when its lease runs out); [`holders`](Self::holders)
    /// and [`list`](Self::list) show every holder. The shared guards of
    /// one `Locker` share one hold in the store (one record, one renewal),
    /// released when the last of them goes.
    ///
    /// With [`fencing`](crate::LockerBuilder::fencing) on, a shared
    /// guard's token is the name's fencing counter as it stood when the
    /// shared hold was taken: no less than the token of every exclusive
    /// acquisition before it, less than that of every exclusive acquisition
    /// after it. Shared guards may share a token.
    ///
    /// Inside a [`scope`](Self::scope) that holds the name exclusively, a
    /// shared acquisition re-enters the exclusive hold (and its guard says
    /// `is_shared() == false`); one that holds it shared is re-entered.
    ///
    /// # Errors
    ///
    /// [`Error::KindMismatch`](crate::Error::KindMismatch) if the name is
    /// held as a semaphore; otherwise as [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let readers = leasehold::Locker::new(dir.path())?;
    /// let writer = leasehold::Locker::new(dir.path())?; // another process, say
    ///
    /// let a = readers.acquire_shared("catalog").await?;
    /// let b = writer.acquire_shared("catalog").await?; // readers overlap
    /// assert!(writer.try_acquire("catalog").await?.is_none()); // a writer does not
    /// drop((a, b));
    /// assert!(writer.try_acquire("catalog").await?.is_some());
    /// # Ok(()) }
    /// ```
    pub fn acquire_shared(&self, name: &str) -> impl Future<Output = Result<LockGuard>> + Send + use<'_> {
        Acquire::new(&self.engine, "acquire_shared", name, None, Mode::Shared)
    }

    /// Acquires `name` shared if that can be done without waiting:
    /// `Ok(None)` when an exclusive guard holds it, or an exclusive
    /// acquisition waits for it (in this process or another).
    ///
    /// # Errors
    ///
    /// As [`acquire_shared`](Self::acquire_shared).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let writer = locker.acquire("catalog").await?;
    /// assert!(locker.try_acquire_shared("catalog").await?.is_none());
    /// drop(writer);
    /// assert!(locker.try_acquire_shared("catalog").await?.is_some());
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire_shared(&self, name: &str) -> Result<Option<LockGuard>> {
        self.engine
            .try_acquire(name, Mode::Shared)
            .instrument(self.engine.span("try_acquire_shared", name))
            .await
    }

    /// Acquires `name` shared, waiting at most `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`](crate::Error::Timeout) when it was still held
    /// exclusively (or an exclusive acquisition was still waiting) at the
    /// deadline; otherwise as [`acquire_shared`](Self::acquire_shared).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use std::time::Duration;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _writer = locker.acquire("catalog").await?;
    /// let err = locker
    ///     .acquire_shared_timeout("catalog", Duration::from_millis(30))
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.is_timeout());
    /// # Ok(()) }
    /// ```
    pub fn acquire_shared_timeout(
        &self,
        name: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<LockGuard>> + Send + use<'_> {
        Acquire::new(
            &self.engine,
            "acquire_shared_timeout",
            name,
            Some(timeout),
            Mode::Shared,
        )
    }
}
