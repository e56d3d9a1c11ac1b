//! The blocking API, for synchronous code: build scripts, plain `#[test]`s,
//! services without a runtime.
//!
//! Each call polls the async acquisition to completion on the calling
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
use crate::locker::Locker;

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
