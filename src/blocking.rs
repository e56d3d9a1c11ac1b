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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tokio::runtime::Runtime;

use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::locker::Locker;

/// The refusal in async code, where blocking would stall a worker.
const IN_RUNTIME: &str = "leasehold's blocking_* methods cannot run in async code driven by a Tokio \
     runtime, where they would block a worker thread: use the async methods there \
     (`locker.acquire(name).await`), or call them from `tokio::task::spawn_blocking`";

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
    /// only entered a runtime's handle.
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
    if in_async_context() {
        return Err(Error::Unsupported { what: IN_RUNTIME });
    }
    runtime()?.block_on(fut)
}

/// Whether this thread runs asynchronous code for a Tokio runtime: a task
/// on a worker, or the future of a runtime's `block_on` (`#[tokio::main]`,
/// `#[tokio::test]`), of either flavor. There, Tokio's own blocking calls
/// (`blocking_lock`, `blocking_recv`) panic, and so would our runtime's
/// `block_on`. A thread of the blocking pool (`spawn_blocking`), one in
/// `block_in_place`, one that only entered a runtime's handle, or one with
/// no runtime at all may block.
///
/// Tokio has no public question for this; two things it does tell apart,
/// through its public API:
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
/// `block_on` run `unconstrained`, which is no worker (it blocks only
/// itself).
fn in_async_context() -> bool {
    if tokio::runtime::Handle::try_current().is_err() {
        return false;
    }
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
