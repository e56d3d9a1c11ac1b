//! The blocking API, for synchronous code: build scripts, plain `#[test]`s,
//! services without a runtime.
//!
//! Every acquiring and inspecting method has a `blocking_` twin here that
//! returns what the async one does: exclusive, shared, semaphore and
//! closure acquisitions, the questions of `inspect.rs`, and a guard's
//! `ensure_held` and `release`. Each is one call of [`block_on`] on its
//! twin's future, so the two cannot drift apart.
//!
//! Each call polls the async future to completion on the calling
//! thread, parked between polls, under the handle of a small runtime of
//! leasehold's own (one per process, made on first use, with no worker
//! threads: only its blocking pool, which the attempts already run on). The guard it returns needs no runtime: leases
//! are renewed on a thread of their own, and dropping the guard releases
//! the lock synchronously.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tokio::runtime::Runtime;

use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::locker::{Locker, ReleasedLock};
use crate::owner::{LockInfo, Owner};
use crate::semaphore::Semaphore;

/// The refusal in async code, where blocking would stall a worker.
const IN_RUNTIME: &str = "leasehold's blocking_* methods cannot run in async code driven by a Tokio \
     runtime, where they would block a worker thread: use the async methods there \
     (`locker.acquire(name).await`), or call them from `tokio::task::spawn_blocking`";

/// The refusal on a thread that is exiting, whose Tokio context is gone.
const EXITING: &str = "leasehold's blocking_* methods cannot run on a thread that is exiting (in the \
     destructor of a thread-local value, after Tokio's own thread-local context is gone): \
     call them from another thread";

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
    /// called from async code a Tokio runtime drives (a task on a worker
    /// thread, the body of `#[tokio::main]` or `#[tokio::test]`, of either
    /// flavor), where it would block a thread the runtime counts on: use
    /// `acquire(name).await` there. It never blocks in that case: it
    /// returns the error at once. Like Tokio's own `blocking_*` methods, it
    /// works in `spawn_blocking`, in `block_in_place`, and on a thread that
    /// only entered a runtime's handle; unlike them, it also works in the
    /// future of a multi-thread runtime's `block_on` run
    /// `tokio::task::unconstrained`, a thread no worker needs (Tokio does
    /// not tell it apart from `block_in_place` there). Also
    /// [`Error::Unsupported`] on a thread that is exiting, from the
    /// destructor of a thread-local value once Tokio's own thread-local
    /// context is gone. It never panics, wherever it is called.
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

impl Locker {
    /// [`acquire_shared`](Self::acquire_shared) for synchronous code:
    /// blocks the calling thread until `name` is held shared, however long
    /// that takes.
    ///
    /// Readers overlap, in this process and others; a writer
    /// ([`blocking_acquire`](Self::blocking_acquire) or its async twin)
    /// never runs with them, and once one waits, new readers queue behind
    /// it.
    ///
    /// # Errors
    ///
    /// As [`acquire_shared`](Self::acquire_shared); and
    /// [`Error::Unsupported`] in async code a Tokio runtime drives, at
    /// once, as for [`blocking_acquire`](Self::blocking_acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// fn main() -> leasehold::Result<()> {
    ///     let dir = tempfile::tempdir().unwrap();
    ///     let locker = leasehold::Locker::new(dir.path())?;
    ///     let other = leasehold::Locker::new(dir.path())?; // as another process
    ///
    ///     let a = locker.blocking_acquire_shared("catalog")?;
    ///     let b = other.blocking_acquire_shared("catalog")?; // readers overlap
    ///     assert!(a.is_shared() && b.is_shared());
    ///     assert!(other.blocking_try_acquire("catalog")?.is_none()); // a writer does not
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_acquire_shared(&self, name: &str) -> Result<LockGuard> {
        block_on(self.acquire_shared(name))
    }

    /// [`try_acquire_shared`](Self::try_acquire_shared) for synchronous
    /// code: takes `name` shared if that needs no wait, else returns
    /// `Ok(None)` at once (a writer holds it, or waits for it).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_shared`](Self::try_acquire_shared); and
    /// [`Error::Unsupported`] in async code, as for
    /// [`blocking_acquire`](Self::blocking_acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// fn main() -> leasehold::Result<()> {
    ///     let dir = tempfile::tempdir().unwrap();
    ///     let locker = leasehold::Locker::new(dir.path())?;
    ///     let writer = locker.blocking_acquire("catalog")?;
    ///     assert!(locker.blocking_try_acquire_shared("catalog")?.is_none());
    ///     drop(writer);
    ///     assert!(locker.blocking_try_acquire_shared("catalog")?.is_some());
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_try_acquire_shared(&self, name: &str) -> Result<Option<LockGuard>> {
        block_on(self.try_acquire_shared(name))
    }

    /// [`acquire_shared_timeout`](Self::acquire_shared_timeout) for
    /// synchronous code: blocks the calling thread until `name` is held
    /// shared, or `timeout` has passed.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when a writer still held it (or still waited for
    /// it) at the deadline; otherwise as
    /// [`blocking_acquire_shared`](Self::blocking_acquire_shared).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// fn main() -> leasehold::Result<()> {
    ///     let dir = tempfile::tempdir().unwrap();
    ///     let locker = leasehold::Locker::new(dir.path())?;
    ///     let _writer = locker.blocking_acquire("catalog")?;
    ///     let err = locker
    ///         .blocking_acquire_shared_timeout("catalog", Duration::from_millis(50))
    ///         .unwrap_err();
    ///     assert!(err.is_timeout());
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_acquire_shared_timeout(&self, name: &str, timeout: Duration) -> Result<LockGuard> {
        block_on(self.acquire_shared_timeout(name, timeout))
    }

    /// [`with_lock`](Self::with_lock) for synchronous code: acquires
    /// `name`, blocking as long as it takes, runs `f` while holding it,
    /// releases it, and returns `f`'s output.
    ///
    /// `f` runs on the calling thread inside a [`scope`](Self::scope):
    /// blocking acquisitions of `name` through this `Locker` nested in it
    /// re-enter the lock instead of waiting for it. A synchronous `f`
    /// cannot be stopped halfway: if the lock is lost while it runs, it
    /// runs to its end, and then [`Error::Lost`] is returned instead of
    /// its output (which was computed partly without the lock). To stop a
    /// long task on a loss, take the guard with
    /// [`blocking_acquire`](Self::blocking_acquire) and check
    /// [`is_lost`](LockGuard::is_lost) between its steps.
    ///
    /// # Errors
    ///
    /// As [`with_lock`](Self::with_lock); and [`Error::Unsupported`] in
    /// async code, at once and without calling `f`, as for
    /// [`blocking_acquire`](Self::blocking_acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// fn main() -> leasehold::Result<()> {
    ///     let dir = tempfile::tempdir().unwrap();
    ///     let locker = leasehold::Locker::new(dir.path())?;
    ///     let total = locker.blocking_with_lock("ledger", || {
    ///         // A nested acquisition of the name re-enters the lock.
    ///         let _again = locker.blocking_acquire("ledger")?;
    ///         Ok::<_, leasehold::Error>(40 + 2)
    ///     })??;
    ///     assert_eq!(total, 42);
    ///     assert!(!locker.blocking_is_held("ledger")?);
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_with_lock<T>(&self, name: &str, f: impl FnOnce() -> T) -> Result<T> {
        // `f` runs in the polled future, so that the scope's task-local is
        // set around it (nested blocking calls poll theirs inside it).
        block_on(self.with_lock(name, async { f() }))
    }

    /// [`with_lock_timeout`](Self::with_lock_timeout) for synchronous
    /// code: as [`blocking_with_lock`](Self::blocking_with_lock), waiting at
    /// most `timeout` for the lock (`f` itself is not timed).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the lock was still held at the deadline
    /// (`f` is then not called); otherwise as
    /// [`blocking_with_lock`](Self::blocking_with_lock).
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
    ///     let other = leasehold::Locker::new(dir.path())?;
    ///     let err = other
    ///         .blocking_with_lock_timeout("deploy", Duration::from_millis(50), || unreachable!())
    ///         .unwrap_err();
    ///     assert!(err.is_timeout());
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_with_lock_timeout<T>(
        &self,
        name: &str,
        timeout: Duration,
        f: impl FnOnce() -> T,
    ) -> Result<T> {
        block_on(self.with_lock_timeout(name, timeout, async { f() }))
    }

    /// [`holder`](Self::holder) for synchronous code: who holds `name`
    /// now, or `None` if nobody does (or only a stale lock is left).
    ///
    /// # Errors
    ///
    /// As [`holder`](Self::holder); and [`Error::Unsupported`] in async
    /// code, at once, as for [`blocking_acquire`](Self::blocking_acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// fn main() -> leasehold::Result<()> {
    ///     let dir = tempfile::tempdir().unwrap();
    ///     let locker = leasehold::Locker::new(dir.path())?;
    ///     assert!(locker.blocking_holder("reindex")?.is_none());
    ///     let _guard = locker.blocking_acquire("reindex")?;
    ///     let owner = locker.blocking_holder("reindex")?.expect("held");
    ///     assert_eq!(owner.pid(), Some(std::process::id()));
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_holder(&self, name: &str) -> Result<Option<Owner>> {
        block_on(self.holder(name))
    }

    /// [`holders`](Self::holders) for synchronous code: every live holder
    /// of `name` (the exclusive one, or every shared or permit holder),
    /// oldest first; empty when nobody holds it.
    ///
    /// # Errors
    ///
    /// As [`blocking_holder`](Self::blocking_holder).
    ///
    /// # Examples
    ///
    /// ```
    /// fn main() -> leasehold::Result<()> {
    ///     let dir = tempfile::tempdir().unwrap();
    ///     let one = leasehold::Locker::new(dir.path())?;
    ///     let two = leasehold::Locker::new(dir.path())?;
    ///     let _a = one.blocking_acquire_shared("catalog")?;
    ///     let _b = two.blocking_acquire_shared("catalog")?;
    ///     assert_eq!(one.blocking_holders("catalog")?.len(), 2);
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_holders(&self, name: &str) -> Result<Vec<Owner>> {
        block_on(self.holders(name))
    }

    /// [`inspect`](Self::inspect) for synchronous code: the lock `name` as
    /// found in the store, held or stale, or `None` if there is none.
    ///
    /// # Errors
    ///
    /// As [`blocking_holder`](Self::blocking_holder).
    ///
    /// # Examples
    ///
    /// ```
    /// fn main() -> leasehold::Result<()> {
    ///     let dir = tempfile::tempdir().unwrap();
    ///     let locker = leasehold::Locker::new(dir.path())?;
    ///     let _guard = locker.blocking_acquire_shared("catalog")?;
    ///     let info = locker.blocking_inspect("catalog")?.expect("a lock is there");
    ///     assert_eq!(info.kind(), leasehold::LockKind::Shared);
    ///     assert!(!info.is_stale());
    ///     assert!(locker.blocking_inspect("nothing")?.is_none());
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        block_on(self.inspect(name))
    }

    /// [`list`](Self::list) for synchronous code: every lock in the store,
    /// with its holders and whether it is stale.
    ///
    /// # Errors
    ///
    /// As [`list`](Self::list); and [`Error::Unsupported`] in async code,
    /// at once, as for [`blocking_acquire`](Self::blocking_acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// fn main() -> leasehold::Result<()> {
    ///     let dir = tempfile::tempdir().unwrap();
    ///     let locker = leasehold::Locker::new(dir.path())?;
    ///     let _a = locker.blocking_acquire("a")?;
    ///     let _b = locker.blocking_acquire_shared("b")?;
    ///     let mut names: Vec<String> =
    ///         locker.blocking_list()?.iter().map(|l| l.name().to_owned()).collect();
    ///     names.sort();
    ///     assert_eq!(names, ["a", "b"]);
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_list(&self) -> Result<Vec<LockInfo>> {
        block_on(self.list())
    }

    /// [`clean`](Self::clean) for synchronous code: removes every stale
    /// lock in the store, and what crashed processes left behind,
    /// returning what was removed (or, with `dry_run`, what would be). Live
    /// locks are never touched.
    ///
    /// # Errors
    ///
    /// As [`clean`](Self::clean); and [`Error::Unsupported`] in async
    /// code, at once (nothing is removed), as for
    /// [`blocking_acquire`](Self::blocking_acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// fn main() -> leasehold::Result<()> {
    ///     let dir = tempfile::tempdir().unwrap();
    ///     let locker = leasehold::Locker::new(dir.path())?;
    ///     let _live = locker.blocking_acquire("live")?;
    ///     // A lock whose owner process is gone.
    ///     std::fs::write(locker.lock_path("crashed")?, r#"{"uuid":"x","pid":999999999}"#).unwrap();
    ///     assert_eq!(locker.blocking_clean(true)?.len(), 1); // only says
    ///     let removed = locker.blocking_clean(false)?;
    ///     assert_eq!(removed[0].stale_reason(), Some(leasehold::StaleReason::DeadOwner));
    ///     assert!(locker.blocking_clean(false)?.is_empty());
    ///     assert!(locker.blocking_is_held("live")?);
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_clean(&self, dry_run: bool) -> Result<Vec<LockInfo>> {
        block_on(self.clean(dry_run))
    }

    /// [`is_held`](Self::is_held) for synchronous code: whether a live
    /// holder has `name` now (an answer that may be out of date as soon as
    /// it is returned: for diagnostics, not to decide whether to acquire).
    ///
    /// # Errors
    ///
    /// As [`blocking_holder`](Self::blocking_holder).
    ///
    /// # Examples
    ///
    /// ```
    /// fn main() -> leasehold::Result<()> {
    ///     let dir = tempfile::tempdir().unwrap();
    ///     let locker = leasehold::Locker::new(dir.path())?;
    ///     assert!(!locker.blocking_is_held("reindex")?);
    ///     let guard = locker.blocking_acquire("reindex")?;
    ///     assert!(locker.blocking_is_held("reindex")?);
    ///     drop(guard);
    ///     assert!(!locker.blocking_is_held("reindex")?);
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_is_held(&self, name: &str) -> Result<bool> {
        block_on(self.is_held(name))
    }

    /// [`release_all`](Self::release_all) for synchronous code: releases
    /// every lock this `Locker` and its clones hold, and takes no more,
    /// returning what it released.
    ///
    /// # Errors
    ///
    /// Only [`Error::Unsupported`], inside a Tokio runtime, at once, as
    /// for [`blocking_acquire`](Self::blocking_acquire) (nothing is
    /// released then: call `release_all().await` there).
    ///
    /// # Examples
    ///
    /// ```
    /// fn main() -> leasehold::Result<()> {
    ///     let dir = tempfile::tempdir().unwrap();
    ///     let locker = leasehold::Locker::new(dir.path())?;
    ///     let guard = locker.blocking_acquire("codegen")?;
    ///
    ///     let released = locker.blocking_release_all()?;
    ///     assert_eq!(released[0].name(), "codegen");
    ///     assert!(guard.is_lost());
    ///     let other = leasehold::Locker::new(dir.path())?; // as another process
    ///     assert!(other.blocking_try_acquire("codegen")?.is_some());
    ///     assert!(matches!(
    ///         locker.blocking_acquire("codegen"),
    ///         Err(leasehold::Error::ShutDown { .. })
    ///     ));
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_release_all(&self) -> Result<Vec<ReleasedLock>> {
        block_on(async { Ok(self.release_all().await) })
    }
}

impl Semaphore {
    /// [`acquire`](Self::acquire) for synchronous code: blocks the calling
    /// thread until a permit is held, however long that takes.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire); and [`Error::Unsupported`] in async
    /// code a Tokio runtime drives, at once, as for
    /// [`Locker::blocking_acquire`].
    ///
    /// # Examples
    ///
    /// ```
    /// fn main() -> leasehold::Result<()> {
    ///     let dir = tempfile::tempdir().unwrap();
    ///     let locker = leasehold::Locker::new(dir.path())?;
    ///     let gpu = locker.semaphore("gpu", 2)?;
    ///     let first = gpu.blocking_acquire()?;
    ///     let second = gpu.blocking_acquire()?;
    ///     assert!(gpu.blocking_try_acquire()?.is_none()); // both permits are taken
    ///     drop((first, second));
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_acquire(&self) -> Result<LockGuard> {
        block_on(self.acquire())
    }

    /// [`try_acquire`](Self::try_acquire) for synchronous code: takes a
    /// permit if one is free now, else returns `Ok(None)` at once.
    ///
    /// # Errors
    ///
    /// As [`blocking_acquire`](Self::blocking_acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// fn main() -> leasehold::Result<()> {
    ///     let dir = tempfile::tempdir().unwrap();
    ///     let locker = leasehold::Locker::new(dir.path())?;
    ///     let one = locker.semaphore("gpu", 1)?;
    ///     let held = one.blocking_try_acquire()?.expect("a free permit");
    ///     assert!(one.blocking_try_acquire()?.is_none());
    ///     drop(held);
    ///     assert!(one.blocking_try_acquire()?.is_some());
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_try_acquire(&self) -> Result<Option<LockGuard>> {
        block_on(self.try_acquire())
    }

    /// [`acquire_timeout`](Self::acquire_timeout) for synchronous code:
    /// blocks the calling thread until a permit is held, or `timeout` has
    /// passed.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when no permit came free in time; otherwise as
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
    ///     let one = locker.semaphore("gpu", 1)?;
    ///     let _held = one.blocking_acquire()?;
    ///     let err = one.blocking_acquire_timeout(Duration::from_millis(50)).unwrap_err();
    ///     assert!(err.is_timeout());
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_acquire_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        block_on(self.acquire_timeout(timeout))
    }
}

impl LockGuard {
    /// [`ensure_held`](Self::ensure_held) for synchronous code: checks in
    /// the store, now, that the lock is still this guard's.
    ///
    /// # Errors
    ///
    /// As [`ensure_held`](Self::ensure_held); and [`Error::Unsupported`]
    /// in async code, at once, as for [`Locker::blocking_acquire`].
    ///
    /// # Examples
    ///
    /// ```
    /// fn main() -> leasehold::Result<()> {
    ///     let dir = tempfile::tempdir().unwrap();
    ///     let locker = leasehold::Locker::new(dir.path())?;
    ///     let guard = locker.blocking_acquire("ledger")?;
    ///     guard.blocking_ensure_held()?;
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_ensure_held(&self) -> Result<()> {
        block_on(self.ensure_held())
    }

    /// [`release`](Self::release) for synchronous code: releases the lock
    /// now and reports what happened (dropping the guard releases it too,
    /// but reports a failure only through `tracing`).
    ///
    /// # Errors
    ///
    /// As [`release`](Self::release). [`Error::Unsupported`] in async code,
    /// at once; the guard is then dropped, which releases the lock as
    /// `Drop` does.
    ///
    /// # Examples
    ///
    /// ```
    /// fn main() -> leasehold::Result<()> {
    ///     let dir = tempfile::tempdir().unwrap();
    ///     let locker = leasehold::Locker::new(dir.path())?;
    ///     let guard = locker.blocking_acquire("backup")?;
    ///     guard.blocking_release()?;
    ///     assert!(!locker.blocking_is_held("backup")?);
    ///     Ok(())
    /// }
    /// ```
    pub fn blocking_release(self) -> Result<()> {
        block_on(self.release())
    }
}

/// Runs `fut` to completion on this thread, under leasehold's own runtime;
/// refused inside a runtime.
///
/// The future is polled here, with the thread parked between polls, and
/// not by `Runtime::block_on`: that one "enters" the runtime, which Tokio
/// refuses with a panic on a thread that is in a runtime's `block_on`
/// already, and some such threads may block (see [`in_async_context`]).
/// Entering a handle (what `spawn_blocking` needs to find leasehold's
/// blocking pool) is allowed anywhere.
fn block_on<T>(fut: impl Future<Output = Result<T>>) -> Result<T> {
    match tokio::runtime::Handle::try_current() {
        Err(e) if e.is_thread_local_destroyed() => return Err(Error::Unsupported { what: EXITING }),
        Err(_) => {}
        Ok(_) if in_async_context() => return Err(Error::Unsupported { what: IN_RUNTIME }),
        Ok(_) => {}
    }
    let _entered = runtime()?.handle().enter();
    park_on(fut)
}

/// Polls `fut` until it is ready, parking this thread while it waits.
fn park_on<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(output) = fut.as_mut().poll(&mut cx) {
            return output;
        }
        // A wake before this park makes it return at once; a spurious
        // return costs one more poll.
        std::thread::park();
    }
}

/// Whether this thread runs asynchronous code for a Tokio runtime: a task
/// on a worker, or the future of a runtime's `block_on` (`#[tokio::main]`,
/// `#[tokio::test]`), of either flavor. There, Tokio's own blocking calls
/// (`blocking_lock`, `blocking_recv`) panic, and a wait could stall the
/// tasks this thread should run. A thread of the blocking pool
/// (`spawn_blocking`), one in `block_in_place`, one that only entered a
/// runtime's handle, one dropping a current-thread runtime, or one with no
/// runtime at all may block.
///
/// Tokio has no public question for this (whether a thread has "entered" a
/// runtime, which is what its own blocking calls check, it keeps to
/// itself); two things it does tell apart, through its public API:
///
/// - Every poll Tokio makes of a task or of a `block_on` future runs on a
///   cooperative budget (a count of at most 255); `spawn_blocking`,
///   `block_in_place` and code outside a runtime run unconstrained. Taking
///   budget until none is left shows which, and the budget is then put
///   back as it was.
/// - A task that opted out of the budget (`tokio::task::unconstrained`)
///   still runs under a scheduler, which keeps a yielding task's waker for
///   later; outside one, `yield_now` wakes it at once.
///
/// One case escapes both: the future of a multi-thread runtime's
/// `block_on` run `unconstrained` (directly, or in a `LocalSet`'s task),
/// which is no worker: it may block, as `block_in_place` lets it, and it
/// then blocks only itself (and that `LocalSet`'s tasks). It looks the same
/// as `block_in_place` in that `block_on`, which may block too.
fn in_async_context() -> bool {
    budgeted() || defers_wake_ups()
}

/// Whether this thread's code runs on a limited cooperative budget.
fn budgeted() -> bool {
    use tokio::task::coop;
    let mut cx = Context::from_waker(Waker::noop());
    let mut taken = Vec::new();
    let budgeted = loop {
        if !coop::has_budget_remaining() {
            break true;
        }
        // A budget fits in a `u8`: past that, there is none.
        if taken.len() > usize::from(u8::MAX) {
            break false;
        }
        match coop::poll_proceed(&mut cx) {
            Poll::Ready(restore) => taken.push(restore),
            Poll::Pending => break true,
        }
    };
    // Each restores the budget as it was before its own step: the first
    // one taken, dropped last, leaves it as it was before all of them.
    while let Some(restore) = taken.pop() {
        drop(restore);
    }
    budgeted
}

/// Whether a scheduler on this thread keeps a yielding task's waker for
/// later instead of waking it at once.
fn defers_wake_ups() -> bool {
    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::Relaxed);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = Waker::from(Arc::clone(&flag));
    let mut yielded = std::pin::pin!(tokio::task::yield_now());
    let polled = yielded.as_mut().poll(&mut Context::from_waker(&waker));
    polled.is_pending() && !flag.0.load(Ordering::Relaxed)
}

/// The process's runtime for blocking calls. A current-thread runtime
/// without drivers, never driven itself: each caller polls its own
/// acquisition on its own thread (several at once), and the attempts run
/// on its blocking pool. leasehold waits on a timer of its own, so no time
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
