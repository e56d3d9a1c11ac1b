//! Counting semaphores across processes: at most `permits` holders of a
//! name at once.

use std::time::Duration;

use tracing::Instrument;

use crate::acquire::Acquire;
use crate::backend::Mode;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::locker::Locker;
use crate::name::LockName;

/// A counting semaphore: at most [`permits`](Self::permits) guards hold
/// its name at once, across every process sharing the `Locker`'s store.
///
/// Made by [`Locker::semaphore`]. Each permit is a [`LockGuard`] with
/// everything an exclusive lock has: a lease renewed in the background,
/// [`lost`](LockGuard::lost), release on drop, and a dead holder's permit
/// freed at once (a frozen one's when its lease runs out). Waiters of one
/// `Locker` are served in arrival order; waiters in other processes are
/// woken by filesystem events when a permit is returned.
///
/// **Every process must agree on the count.** The count is part of the
/// name's state while anyone holds a permit: an acquisition with another
/// count fails with [`Error::KindMismatch`] instead of making more holders
/// than either side allows. So does a shared acquisition of the name; an
/// exclusive acquisition of it waits until every permit is returned (and,
/// as for shared locks, new permits wait behind it).
///
/// With [`fencing`](crate::LockerBuilder::fencing) on, every permit
/// acquisition gets a token of its own from the name's counter, greater
/// than every token handed out before it for the name.
///
/// Inside a [`scope`](Locker::scope) that holds a permit of the semaphore,
/// acquiring another re-enters it (the scope holds one permit).
///
/// Cheap to clone; `Send + Sync`.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// let dir = tempfile::tempdir().unwrap();
/// let locker = leasehold::Locker::new(dir.path())?;
/// let gpu = locker.semaphore("gpu", 2)?;
///
/// let first = gpu.acquire().await?;
/// let second = gpu.acquire().await?;
/// assert!(gpu.try_acquire().await?.is_none()); // both permits are taken
/// drop(first);
/// assert!(gpu.try_acquire().await?.is_some());
/// # drop(second); Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    locker: Locker,
    name: String,
    permits: u32,
}

impl Locker {
    /// A counting semaphore named `name` with `permits` permits (see
    /// [`Semaphore`]). Nothing is taken until a permit is acquired.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for zero permits; [`Error::InvalidName`]
    /// for a name `acquire` would refuse.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let builds = locker.semaphore("builds", 4)?;
    /// assert_eq!(builds.permits(), 4);
    /// assert!(locker.semaphore("builds", 0).is_err());
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        if permits == 0 {
            return Err(Error::InvalidConfig {
                reason: "a semaphore needs at least one permit".into(),
            });
        }
        LockName::new(name, self.engine.path_style)?;
        Ok(Semaphore {
            locker: self.clone(),
            name: name.to_owned(),
            permits,
        })
    }
}

impl Semaphore {
    /// The semaphore's name.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let uploads = locker.semaphore("uploads", 4)?;
    /// assert_eq!(uploads.name(), "uploads");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many holders it allows at once.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let uploads = locker.semaphore("uploads", 2)?;
    /// assert_eq!(uploads.permits(), 2);
    /// let _a = uploads.acquire().await?;
    /// let _b = uploads.acquire().await?;
    /// assert!(uploads.try_acquire().await?.is_none()); // both permits taken
    /// # Ok(()) }
    /// ```
    pub fn permits(&self) -> u32 {
        self.permits
    }

    fn mode(&self) -> Mode {
        Mode::Permit(self.permits)
    }

    /// Acquires a permit, waiting as long as it takes.
    ///
    /// # Errors
    ///
    /// [`Error::KindMismatch`] when the name is held with another permit
    /// count, or shared; otherwise as [`Locker::acquire`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Locker::acquire`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let permit = locker.semaphore("gpu", 2)?.acquire().await?;
    /// assert!(!permit.is_shared());
    /// # Ok(()) }
    /// ```
    pub async fn acquire(&self) -> Result<LockGuard> {
        let engine = &self.locker.engine;
        Acquire::new(engine, "semaphore_acquire", &self.name, None, self.mode()).await
    }

    /// Acquires a permit if one is free now: `Ok(None)` when all are taken
    /// (or an exclusive acquisition of the name waits).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Locker::acquire`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let one = locker.semaphore("gpu", 1)?;
    /// let held = one.try_acquire().await?;
    /// assert!(held.is_some());
    /// assert!(one.try_acquire().await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        let engine = &self.locker.engine;
        engine
            .try_acquire(&self.name, self.mode())
            .instrument(engine.span("semaphore_try_acquire", &self.name))
            .await
    }

    /// Acquires a permit, waiting at most `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when no permit came free in time; otherwise as
    /// [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Locker::acquire`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use std::time::Duration;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let one = locker.semaphore("gpu", 1)?;
    /// let _held = one.acquire().await?;
    /// let err = one.acquire_timeout(Duration::from_millis(30)).await.unwrap_err();
    /// assert!(err.is_timeout());
    /// # Ok(()) }
    /// ```
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        let engine = &self.locker.engine;
        Acquire::new(
            engine,
            "semaphore_acquire_timeout",
            &self.name,
            Some(timeout),
            self.mode(),
        )
        .await
    }
}
