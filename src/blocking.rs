//! The blocking API, for synchronous code: build scripts, plain `#[test]`s,
//! services without a runtime.
//!
//! Each call drives the async acquisition to completion on the calling
//! thread, on a small runtime of leasehold's own (one per process, made on
//! first use, with no worker threads: only its blocking pool, which the
//! attempts already run on). The guard it returns needs no runtime: leases
//! are renewed on a thread of their own, and dropping the guard releases
//! the lock synchronously.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use tokio::runtime::Runtime;

use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::locker::Locker;

/// The refusal inside a runtime, where blocking would stall a worker.
const IN_RUNTIME: &str = "leasehold's blocking_* methods cannot run inside a Tokio runtime, \
     where they would block a worker thread: use the async methods there \
     (`locker.acquire(name).await`), or, in `spawn_blocking`, \
     `Handle::current().block_on(locker.acquire(name))`";

impl Locker {
    /// [`acquire`](Self::acquire) for synchronous code: blocks the calling
    /// thread until the lock is held, however long that takes.
    ///
    /// Works from any thread outside a Tokio runtime, including a plain
    /// `fn main` with no runtime anywhere; waiting costs no CPU (the
    /// thread sleeps until the lock's file changes, with polling as a
    /// safety net). The guard works as any other: it renews its lease in
    /// the background, reports a loss through
    /// [`is_lost`](LockGuard::is_lost), and releases the lock when dropped.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire); and [`Error::Unsupported`] when
    /// called inside a Tokio runtime's context: on a worker thread or in
    /// an `async` block, where it would block a thread the runtime counts
    /// on (use `acquire(name).await` there); and also in `spawn_blocking`
    /// or under a `Handle::enter` guard, where blocking would be harmless
    /// but leasehold cannot tell such a thread from a worker (use
    /// `Handle::current().block_on(locker.acquire(name))` there). It
    /// never blocks in that case: it returns the error at once.
    ///
    /// # Examples
    ///
    /// ```
    /// fn main() -> leasehold::Result<()> {
    ///     let dir = tempfile::tempdir().unwrap();
    ///     let locker = leasehold::Locker::new(dir.path())?;
    ///
    ///     let guard = locker.blocking_acquire("codegen")?;
    ///     // ... regenerate the files no other build may touch meanwhile ...
    ///     assert!(!guard.is_lost());
    ///     drop(guard); // released here
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_acquire(&self, name: &str) -> Result<LockGuard> {
        block_on(self.acquire(name))
    }

    /// [`try_acquire`](Self::try_acquire) for synchronous code: takes the
    /// lock if it is free, else returns `Ok(None)` at once.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire); and [`Error::Unsupported`]
    /// inside a Tokio runtime, as for
    /// [`blocking_acquire`](Self::blocking_acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// fn main() -> leasehold::Result<()> {
    ///     let dir = tempfile::tempdir().unwrap();
    ///     let locker = leasehold::Locker::new(dir.path())?;
    ///     let other = leasehold::Locker::new(dir.path())?; // as another process
    ///
    ///     let guard = locker.blocking_try_acquire("nightly")?.expect("free");
    ///     assert!(other.blocking_try_acquire("nightly")?.is_none());
    ///     drop(guard);
    ///     assert!(other.blocking_try_acquire("nightly")?.is_some());
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_try_acquire(&self, name: &str) -> Result<Option<LockGuard>> {
        block_on(self.try_acquire(name))
    }

    /// [`acquire_timeout`](Self::acquire_timeout) for synchronous code:
    /// blocks the calling thread until the lock is held, or `timeout` has
    /// passed.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the lock was still held at the deadline (it
    /// names the holder); otherwise as
    /// [`blocking_acquire`](Self::blocking_acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// fn main() -> leasehold::Result<()> {
    ///     let dir = tempfile::tempdir().unwrap();
    ///     let locker = leasehold::Locker::new(dir.path())?;
    ///     let _held = locker.blocking_acquire("deploy")?;
    ///
    ///     let other = leasehold::Locker::new(dir.path())?;
    ///     let err = other.blocking_acquire_timeout("deploy", Duration::from_millis(50)).unwrap_err();
    ///     assert!(err.is_timeout());
    ///     assert_eq!(err.holder().and_then(|h| h.pid()), Some(std::process::id()));
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_acquire_timeout(&self, name: &str, timeout: Duration) -> Result<LockGuard> {
        block_on(self.acquire_timeout(name, timeout))
    }
}

/// Runs `fut` to completion on this thread, on leasehold's own runtime;
/// refused inside a runtime.
fn block_on<T>(fut: impl Future<Output = Result<T>>) -> Result<T> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Error::Unsupported { what: IN_RUNTIME });
    }
    runtime()?.block_on(fut)
}

/// The process's runtime for blocking calls. A current-thread runtime
/// without drivers: each caller drives its own acquisition on its own
/// thread (several at once, as `block_on` allows), and the attempts run on
/// its blocking pool. leasehold waits on a timer of its own, so no time
/// driver is needed.
fn runtime() -> Result<&'static Runtime> {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    let built = tokio::runtime::Builder::new_current_thread()
        .thread_name("leasehold-blocking")
        .build()
        .map_err(|_| Error::Runtime {
            op: "start the runtime for leasehold's blocking calls",
        })?;
    // Another thread may have won the race: its runtime is kept, ours dropped.
    Ok(RUNTIME.get_or_init(|| built))
}
