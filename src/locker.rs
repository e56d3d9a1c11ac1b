//! [`Locker`], the public facade: what a user calls to take locks. The
//! work is done by the engine; [`LockerBuilder`] makes a `Locker`; what a
//! `Locker` tells about the store (`holder`, `list`, `clean`, ...) is in
//! `inspect.rs`.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::acquire::Acquire;
use crate::backend::Mode;
use crate::builder::LockerBuilder;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::name::LockName;
use crate::owner::LockKind;
use crate::scope;
use crate::stats::Stats;

/// A handle to a lock directory, from which named locks are acquired.
///
/// `Locker` is cheap to clone: clones share one instance. All its methods
/// take `&self`, and it is `Send + Sync`, so one `Locker` can serve a whole
/// service.
///
/// # Waiting
///
/// Within one `Locker`, tasks waiting for the same name form a FIFO queue:
/// they get the lock in the order they asked, and only the task at the head
/// touches the disk, so a thousand waiting tasks cost one filesystem waiter.
/// Waiters for different names never wait for each other.
///
/// The head waits for the filesystem to say the lock may be free: on Linux
/// an inotify watch on the lock directory (one per `Locker`, shared by all
/// names) wakes it when a lock file is removed or its holder's descriptor
/// is closed, which includes the holder dying. It also wakes when the
/// holder's lease runs out, and checks at least every
/// `max(poll_interval, 1 s)` as a safety net. Where the directory cannot be
/// watched, it polls every `poll_interval` with ±25 % jitter.
///
/// # Fairness
///
/// When a guard is dropped while another task of the same `Locker` waits
/// for the name, the lock passes straight to that task, without touching
/// the disk (the owner record still names this `Locker`). Such handoffs
/// continue for 10 ms in a row; then the lock is released on disk and the
/// next local waiter holds back for 1 ms, so that waiters in other
/// processes get their turn. If at the end of those 10 ms no other process
/// is seen waiting for the lock in the waiting line (below), the handoffs
/// go on for another 10 ms, and so on, but never past 100 ms since the
/// lock was taken from the disk: a lock nobody else wants is not worth
/// the disk's round trip and the pause. A waiter in line is served at the
/// end of the window it joined the line in, as before. A waiter the line
/// cannot show (a shared acquisition or a `try_acquire` loop of another
/// process, a program other than leasehold) gets its chance every 100 ms
/// instead of every 10 ms: the lock released on disk and 1 ms before the
/// next local waiter tries again. Where there is no line (below), nobody
/// can be seen, and the lock goes back to the disk every 10 ms.
///
/// Across processes, waiters for an exclusive lock in a lock directory
/// stand in line in the order they began to wait: each holds a byte of
/// the lock directory at its *ticket* with an `fcntl` OFD lock (which
/// the kernel drops when the process dies, and which nothing else reads),
/// and a waiter lets an older one take a released lock first. A holder
/// that takes the lock again and again while others wait does so for a
/// *turn* of at most 32 acquisitions or 10 ms, then lines up behind them.
/// The line only decides *when* a process tries for the lock, never
/// whether taking it is safe: a waiter behind a frozen one tries anyway
/// once the lock has stopped changing hands for 10 ms, so a frozen waiter
/// costs the others a few milliseconds per handoff and never blocks them.
/// A semaphore's waiters stand in the same line for its permits (a permit
/// changing hands moves it, as a lock changing hands does; a turn is 4
/// permits or 10 ms). On a network
/// filesystem, for shared locks, and for `try_acquire`, there is no line:
/// whoever takes the lock first after a release gets it.
///
/// # Not blocking the runtime
///
/// An attempt to take a lock is a short batch of syscalls on the lock
/// directory (create, flock, write; or open, read, judge, maybe reclaim).
/// The uncontended case without fencing runs inline, on the task's own
/// thread: a create, a flock, a stat and a write, a few microseconds each.
/// Whatever can take longer runs as **one** call on Tokio's blocking
/// pool: an attempt that finds the lock taken (judging, reclaiming), one
/// that reserves fencing tokens (which syncs the counter), and, with
/// [`durable(true)`](LockerBuilder::durable), one that syncs its record
/// to a disk (a lock directory in memory, such as tmpfs, has nothing to
/// sync, and stays inline).
///
/// The runtime needs no driver: waits sleep on leasehold's own timer
/// thread, not on Tokio's timers, so a runtime built without
/// `enable_time` works. Under Tokio's paused test clock (`start_paused`),
/// waits are Tokio sleeps on that clock instead, so they take part in its
/// auto-advance like your test's own timers. Renewals run on a thread of
/// their own, never on the runtime. Release in [`LockGuard`]'s
/// `Drop` is a few syscalls done inline, which is what makes the lock free
/// the moment `drop` returns.
///
/// # Re-entrancy and self-deadlock
///
/// A lock is held by a guard, not by a task or a process. Outside a
/// [`scope`](Self::scope), acquiring a name that a guard of this same
/// `Locker` already holds waits for that guard like any other waiter, so
/// acquiring twice in one task without releasing waits forever. Inside a
/// scope, acquiring a name that the scope holds, or that an enclosing
/// scope held when it started, is re-entrant and returns at once; the
/// lock is released when the last of its guards goes.
///
/// Re-entrancy is meant for nested code (a function called by the holder)
/// and stays out of concurrent code: a task spawned in a scope is not in
/// it, and branches of one task (`join!`, `select!`, `FuturesUnordered`)
/// that each run in a scope of their own exclude each other. Branches
/// *without* scopes of their own share the scope around them, and re-enter
/// each other's locks: two of them can run one critical section together.
/// What a nested scope acquires stays its own: a guard returned out of it
/// is not re-entered by the scope around it, where acquiring that name
/// again waits for the guard, so in one flow it deadlocks. See
/// [`scope`](Self::scope) for the details and an example.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// use leasehold::Locker;
///
/// let dir = tempfile::tempdir().unwrap();
/// let locker = Locker::new(dir.path())?;
/// {
///     let _guard = locker.acquire("reindex").await?;
///     // ... only one process at a time runs this ...
/// } // released here
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Locker {
    pub(crate) engine: Arc<Engine>,
}
impl Locker {
    /// A `Locker` on `directory` with default settings.
    ///
    /// # Errors
    ///
    /// As [`LockerBuilder::build`].
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path().join("locks"))?;
    /// assert!(locker.directory().ends_with("locks"));
    /// # Ok(()) }
    /// ```
    pub fn new(directory: impl AsRef<Path>) -> Result<Self> {
        Self::builder().directory(directory).build()
    }

    /// A builder with default settings; see [`LockerBuilder`] for each
    /// setting and its default.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// use std::time::Duration;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::builder()
    ///     .directory(dir.path())
    ///     .lease(Duration::from_secs(10))
    ///     .build()?;
    /// assert_eq!(locker.directory(), dir.path().canonicalize().unwrap());
    /// # Ok(()) }
    /// ```
    pub fn builder() -> LockerBuilder {
        LockerBuilder::default()
    }

    fn from_engine(engine: Engine) -> Self {
        Locker {
            engine: Arc::new(engine),
        }
    }

    /// The absolute path of the lock directory (empty for the PostgreSQL
    /// backend, which has none).
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path().join("locks"))?; // created
    /// assert!(locker.directory().is_absolute());
    /// assert!(locker.directory().ends_with("locks"));
    /// # Ok(()) }
    /// ```
    pub fn directory(&self) -> &Path {
        self.engine.store.directory().unwrap_or(Path::new(""))
    }

    /// The path of the lock `name` inside the directory, for diagnostics and
    /// for sharing a lock with other programs.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for an empty name or one containing NUL;
    /// [`Error::Unsupported`] on the PostgreSQL backend, whose locks have no
    /// path.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let path = locker.lock_path("reindex")?;
    /// assert_eq!(path.file_name().unwrap(), "reindex-2ad945a5430f00fa.lock");
    /// assert!(locker.lock_path("../../etc/passwd")?.starts_with(locker.directory()));
    /// # Ok(()) }
    /// ```
    pub fn lock_path(&self, name: &str) -> Result<PathBuf> {
        let name = LockName::new(name, self.engine.path_style)?;
        match self.engine.store.lock_path(&name) {
            Some(path) => Ok(path),
            None => Err(Error::Unsupported {
                what: "lock paths on the PostgreSQL backend",
            }),
        }
    }

    /// Acquires the lock `name`, waiting as long as it takes.
    ///
    /// Takes the lock if it is free, or reclaims it if its holder is provably
    /// gone or its lease ran out (see the crate docs, *Staleness*);
    /// otherwise waits until it may have become free (woken by filesystem
    /// events where the platform has them, by `poll_interval` with jitter
    /// where it has not) and tries again.
    ///
    /// Tasks of one `Locker` that want the same name queue in arrival order,
    /// and only the first of them waits on the disk. The name is checked
    /// (and the tracing span made) when `acquire` is called, so the future
    /// does not borrow it; the task joins the queue when the future is
    /// first polled. A task waiting in the queue costs about as much as
    /// one waiting on a `tokio::sync::Mutex` (about 0.5 kB, see
    /// `BENCHMARKS.md`).
    ///
    /// Inside a [`scope`](Self::scope), a name that the scope holds, or
    /// that an enclosing scope held when it started, is re-entered at once
    /// instead; concurrent branches of one task (`join!`, `select!`) share
    /// their scope's locks unless each runs in a scope of its own (see
    /// *Concurrent branches in one task* on `scope`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for an empty name or one containing NUL;
    /// [`Error::UnexpectedFile`] when something other than a lock file
    /// occupies the lock's path; I/O and permission errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. Dropping the future leaves nothing behind: a lock that
    /// an in-flight attempt creates after the drop is removed by that
    /// attempt.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let guard = locker.acquire("reindex").await?;
    /// assert!(locker.is_held("reindex").await?);
    /// drop(guard);
    /// assert!(!locker.is_held("reindex").await?);
    /// # Ok(()) }
    /// ```
    pub fn acquire(&self, name: &str) -> impl Future<Output = Result<LockGuard>> + Send + use<'_> {
        Acquire::new(&self.engine, "acquire", name, None, Mode::Exclusive)
    }

    /// Acquires the lock `name` if that can be done without waiting.
    ///
    /// Returns `Ok(None)` when a live holder has it. A stale lock is
    /// reclaimed on the way, as [`acquire`](Self::acquire) would.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
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
    /// let first = locker.try_acquire("cron").await?;
    /// assert!(first.is_some());
    /// assert!(locker.try_acquire("cron").await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(&self, name: &str) -> Result<Option<LockGuard>> {
        self.engine
            .try_acquire(name, Mode::Exclusive)
            .instrument(self.engine.span("try_acquire", name))
            .await
    }

    /// Acquires the lock `name`, waiting at most `timeout`.
    ///
    /// At least one attempt is made, even with a zero timeout; the deadline
    /// is checked between attempts. On a PostgreSQL server it also ends an
    /// attempt that the server is slow to answer (see *PostgreSQL* in the
    /// crate docs).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the lock was still held at the deadline;
    /// otherwise as [`acquire`](Self::acquire).
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
    /// let _held = locker.acquire("deploy").await?;
    /// let err = locker.acquire_timeout("deploy", Duration::from_millis(30)).await.unwrap_err();
    /// assert!(err.is_timeout());
    /// # Ok(()) }
    /// ```
    pub fn acquire_timeout(
        &self,
        name: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<LockGuard>> + Send + use<'_> {
        Acquire::new(
            &self.engine,
            "acquire_timeout",
            name,
            Some(timeout),
            Mode::Exclusive,
        )
    }

    /// Runs `fut` in a re-entrancy scope.
    ///
    /// Inside the scope, acquiring a name that the scope holds through this
    /// `Locker` returns at once another guard on the same lock (no waiting,
    /// no disk access), through [`acquire`](Self::acquire),
    /// [`try_acquire`](Self::try_acquire) and
    /// [`acquire_timeout`](Self::acquire_timeout) alike. The lock is
    /// released when the last guard on it goes, in whatever order they
    /// drop, in whichever task.
    ///
    /// Re-entrancy is for *nested* code, such as a function called by the
    /// holder that takes the same lock without knowing its caller has it.
    /// Without a scope, acquiring a name that this `Locker` already holds
    /// waits for that guard, so a nested acquisition outside a scope
    /// deadlocks; wrap such code in `scope`.
    ///
    /// # Nested scopes
    ///
    /// Each call opens a scope of its own, nested in the scope it runs in.
    /// A scope re-enters what it acquired itself, and what its enclosing
    /// scopes held when it started: a function called by the holder
    /// re-enters its caller's lock whether it opens a scope of its own or
    /// not. What a scope acquires is its own: neither the scope around it
    /// nor a sibling scope sees it. That holds also for a guard returned
    /// out of the inner scope: in the scope around it, `try_acquire` of
    /// that name returns `Ok(None)` and `acquire` waits for the returned
    /// guard (in the same flow, forever). Take the lock in the outer scope
    /// first if the inner one should re-enter it.
    ///
    /// # Concurrent branches in one task
    ///
    /// `tokio::join!`, `tokio::select!` and `FuturesUnordered` run several
    /// branches of work concurrently in one task. A branch that is not in
    /// a scope of its own runs in the scope around it, with these
    /// consequences:
    ///
    /// - Outside any scope, such branches exclude each other, like any two
    ///   acquirers.
    /// - **Inside a scope, they share its locks.** A branch that acquires a
    ///   name another branch of the same scope holds gets a re-entrant
    ///   guard at once, and both run the critical section together. (Two
    ///   branches that ask while neither holds the lock yet queue as usual,
    ///   so whether they overlap depends on timing: never rely on either.)
    ///
    /// To run branches concurrently and keep them apart, wrap **each
    /// branch** in its own `locker.scope(..)`, as in the second example
    /// below. A branch's acquisitions are then its own, and the branches
    /// exclude each other; a branch's own callees still re-enter its
    /// locks. One thing stays shared: the names the enclosing scope
    /// already held when a branch started are held by every branch (they
    /// all run inside that critical section, which the holder chose to
    /// run concurrently); do not acquire such a name in branches that must
    /// not run together. A scope does not see what the scope around it
    /// acquires after it started, so a sibling branch left unscoped shares
    /// with the scoped ones only what it held before they started.
    ///
    /// A task spawned inside a scope is *not* in it (Tokio's task-locals
    /// are not inherited): it runs concurrently with the scope, so it waits
    /// for the lock like anyone else.
    ///
    /// A hold belongs to the scope that took it, wherever its guards go: a
    /// guard moved out of the scope (into a spawned task, over a channel)
    /// still lets the scope re-enter the lock while the other task works
    /// under it, and the two then run together. Move a guard out of its
    /// scope only when the scope is done with that name, or take the lock
    /// in the spawned task instead.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `fut`; guards it held are released as
    /// usual.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    ///
    /// locker
    ///     .scope(async {
    ///         let outer = locker.acquire("ledger").await?;
    ///         let inner = locker.acquire("ledger").await?; // re-entrant: no wait
    ///         drop(outer);
    ///         assert!(locker.is_held("ledger").await?); // `inner` still holds it
    ///         drop(inner);
    ///         assert!(!locker.is_held("ledger").await?);
    ///         Ok::<_, leasehold::Error>(())
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Concurrent branches, each in a scope of its own, never run the
    /// critical section together:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use std::sync::Mutex;
    /// use std::time::Duration;
    /// use leasehold::Locker;
    ///
    /// async fn post(locker: &Locker, log: &Mutex<Vec<&str>>, who: &'static str) -> leasehold::Result<()> {
    ///     let _guard = locker.acquire("ledger").await?;
    ///     log.lock().unwrap().push(who);
    ///     tokio::time::sleep(Duration::from_millis(5)).await;
    ///     log.lock().unwrap().push(who);
    ///     Ok(())
    /// }
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = Locker::new(dir.path())?;
    /// let log = Mutex::new(Vec::new());
    /// locker
    ///     .scope(async {
    ///         // Without the inner `scope`s, both branches would be this
    ///         // scope's flow, and could enter together.
    ///         let (a, b) = tokio::join!(
    ///             locker.scope(post(&locker, &log, "a")),
    ///             locker.scope(post(&locker, &log, "b")),
    ///         );
    ///         a.and(b)
    ///     })
    ///     .await?;
    /// let log = log.into_inner().unwrap();
    /// assert!(log == ["a", "a", "b", "b"] || log == ["b", "b", "a", "a"]);
    /// # Ok(()) }
    /// ```
    pub async fn scope<F: Future>(&self, fut: F) -> F::Output {
        scope::run(fut).await
    }

    /// Releases every lock this `Locker` and its clones hold, now, and
    /// takes no more: for a service shutting down (on SIGTERM, say) with
    /// guards spread over tasks it will not wait for.
    ///
    /// When it returns:
    ///
    /// - every lock held through this `Locker` (exclusive, shared,
    ///   semaphore permits, on every backend) has been released in the
    ///   store, so another process can take each name at once; a lock
    ///   that an acquisition was taking at the moment of the call is
    ///   released with the rest;
    /// - each of their guards reports the loss: [`LockGuard::lost`]
    ///   resolves, [`LockGuard::is_lost`] is true, and
    ///   [`ensure_held`](LockGuard::ensure_held) and
    ///   [`release`](LockGuard::release) return [`Error::Lost`] with
    ///   [`LossReason::ReleasedAtShutdown`](crate::LossReason::ReleasedAtShutdown).
    ///   Stop the work those guards protect: someone else may hold the
    ///   lock now. Dropping such a guard later does nothing (it never
    ///   touches a lock another holder took since);
    /// - every acquisition through this `Locker` or a clone (its
    ///   [`Semaphore`](crate::Semaphore)s, `with_lock`, the `blocking_*`
    ///   forms), later or waiting at the moment of the call, fails with
    ///   [`Error::ShutDown`]. There is no way back: build a new `Locker`.
    ///
    /// It waits for attempts already under way to end (each is one
    /// bounded attempt on the store) and for the store's answer to each
    /// release, as [`LockGuard::release`] does; a release that finds the
    /// name's mutation lock held by another process for long is finished
    /// by leasehold's release thread, as for `release`. Inspecting
    /// (`holder`, `list`, ...) still works. Calling it again returns what
    /// is left, nothing.
    ///
    /// Returns one [`ReleasedLock`] per lock it released: one per
    /// acquisition from the store (guards that re-entered one in a
    /// [`scope`](Self::scope), and the shared guards of one name, share
    /// it), one per semaphore permit. A lock whose guard was being
    /// released or dropped at that instant is released by that guard
    /// (this call waits for it) and not listed.
    ///
    /// # Cancel safety
    ///
    /// The shutdown happens whether or not the future is polled to the
    /// end: from the first poll, acquisitions fail, and the releases
    /// finish on a thread of their own.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use leasehold::{Error, LockKind, Locker, LossReason};
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = Locker::new(dir.path())?;
    ///
    /// // A worker holds a lock in a task the service will not wait for.
    /// let guard = locker.acquire("reindex").await?;
    /// let worker = tokio::spawn(async move {
    ///     tokio::select! {
    ///         _ = guard.lost() => guard.release().await,
    ///         _ = std::future::pending::<()>() => unreachable!(), // the work
    ///     }
    /// });
    ///
    /// // SIGTERM arrived (see below for the signal itself):
    /// let released = locker.release_all().await;
    /// assert_eq!(released.len(), 1);
    /// assert_eq!((released[0].name(), released[0].kind()), ("reindex", LockKind::Exclusive));
    /// assert!(released[0].error().is_none());
    ///
    /// // The worker saw why it stopped; another process may take the name.
    /// match worker.await.unwrap() {
    ///     Err(Error::Lost { reason: LossReason::ReleasedAtShutdown, .. }) => {}
    ///     other => panic!("{other:?}"),
    /// }
    /// let other = Locker::new(dir.path())?; // as another process
    /// assert!(other.try_acquire("reindex").await?.is_some());
    /// assert!(matches!(locker.acquire("reindex").await, Err(Error::ShutDown { .. })));
    /// # Ok(()) }
    /// ```
    ///
    /// Waiting for the signal in a service:
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// // ... tasks take locks through clones of `locker` ...
    ///
    /// async fn terminated() -> std::io::Result<()> {
    ///     #[cfg(unix)]
    ///     {
    ///         use tokio::signal::unix::{SignalKind, signal};
    ///         signal(SignalKind::terminate())?.recv().await;
    ///         Ok(())
    ///     }
    ///     #[cfg(not(unix))]
    ///     tokio::signal::ctrl_c().await
    /// }
    ///
    /// terminated().await?;
    /// for lock in locker.release_all().await {
    ///     match lock.error() {
    ///         None => eprintln!("released {}", lock.name()),
    ///         Some(error) => eprintln!("releasing {}: {error}", lock.name()),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn release_all(&self) -> Vec<ReleasedLock> {
        let roll = &self.engine.keeper.roll;
        // Refused from now on; whoever waits looks again, and fails.
        roll.close();
        self.engine.queues.wake_all();
        // On a thread of its own, not Tokio's blocking pool: it waits for
        // the attempts under way, whose blocking part may be queued on that
        // pool behind it (a small pool would never run it).
        let (tx, rx) = tokio::sync::oneshot::channel();
        let rolled = Arc::clone(roll);
        let spawned = std::thread::Builder::new()
            .name("leasehold-release-all".into())
            .spawn(move || {
                let _ = tx.send(rolled.shut_down());
            });
        let released = match spawned {
            Ok(_) => rx.await.ok(),
            Err(_) => None,
        };
        // No thread could be started (or it failed): here, then (what it
        // did release, it released; this finds the rest).
        let released = released.unwrap_or_else(|| roll.shut_down());
        let released: Vec<ReleasedLock> = released
            .into_iter()
            .map(|(lease, outcome)| ReleasedLock {
                name: lease.name().to_owned(),
                kind: LockKind::from_mode(lease.mode()),
                error: match outcome {
                    Ok(None) => None,
                    Ok(Some(reason)) => Some(Error::Lost {
                        name: lease.name().to_owned(),
                        reason,
                    }),
                    Err(error) => Some(error),
                },
            })
            .collect();
        tracing::debug!(released = released.len(), "released every lock at shutdown");
        released
    }

    /// A snapshot of this `Locker`'s counters.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// assert!(locker.try_acquire("a").await?.is_some());
    /// assert_eq!(locker.stats().fs_attempts, 1);
    /// # Ok(()) }
    /// ```
    pub fn stats(&self) -> Stats {
        self.engine.counters.snapshot()
    }
}

/// A lock that [`Locker::release_all`] released.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// use leasehold::LockKind;
///
/// let dir = tempfile::tempdir().unwrap();
/// let locker = leasehold::Locker::new(dir.path())?;
/// let _permit = locker.semaphore("gpu", 2)?.acquire().await?;
/// let released = locker.release_all().await;
/// assert_eq!(released[0].name(), "gpu");
/// assert_eq!(released[0].kind(), LockKind::Semaphore { permits: 2 });
/// assert!(released[0].error().is_none());
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct ReleasedLock {
    name: String,
    kind: LockKind,
    error: Option<Error>,
}

impl ReleasedLock {
    /// The lock name, as given to `acquire`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _guard = locker.acquire("reports/nightly").await?;
    /// assert_eq!(locker.release_all().await[0].name(), "reports/nightly");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How it was held: exclusive, shared, or a semaphore permit.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _reader = locker.acquire_shared("catalog").await?;
    /// assert_eq!(locker.release_all().await[0].kind(), leasehold::LockKind::Shared);
    /// # Ok(()) }
    /// ```
    pub fn kind(&self) -> LockKind {
        self.kind
    }

    /// What went wrong, if anything: [`Error::Lost`] when the lock turned
    /// out not to be this `Locker`'s any more (removed or replaced by
    /// someone else, its server session ended; there was nothing to
    /// release), an I/O or server error when releasing it failed. `None`
    /// when it was held to the end and is released.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _guard = locker.acquire("ledger").await?;
    /// std::fs::remove_file(locker.lock_path("ledger")?).unwrap(); // someone removes it
    /// let released = locker.release_all().await;
    /// assert!(released[0].error().is_some_and(leasehold::Error::is_lost));
    /// # Ok(()) }
    /// ```
    pub fn error(&self) -> Option<&Error> {
        self.error.as_ref()
    }
}

impl LockerBuilder {
    /// Checks the settings, creates and opens the directory, and checks
    /// that it can hold locks, so that a directory that cannot fails here
    /// rather than at the first acquisition.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when the lease is below 200 ms or above a
    /// year, the renew interval is above half the lease (see
    /// [`renew_interval`](Self::renew_interval)), or another duration is
    /// zero, and when the directory path names something that is not a
    /// directory;
    /// [`Error::InsecureDirectory`] for a world-writable directory without
    /// the sticky bit, or a default directory owned by another user or open
    /// to others;
    /// [`Error::PermissionDenied`] for a directory this process (by its
    /// effective user and groups) cannot list, search and write (list and
    /// search only, with [`read_only`](Self::read_only)); an I/O
    /// error (`EROFS`) for a directory on a read-only mount; I/O errors
    /// from creating or opening the directory (a dangling symlink, a file
    /// on the way; a missing one, with
    /// [`create_directory(false)`](LockerBuilder::create_directory)). An explicit directory owned by another user is
    /// accepted when this process can use it and it is not open to
    /// everyone without the sticky bit: that is how a lock directory is
    /// shared between users;
    /// [`Error::Backend`] when the PostgreSQL server cannot be reached;
    /// [`Error::InvalidConfig`] also when a setting for lock files
    /// (`directory`, `strategy`, `path_style`, `allow_insecure_directory`,
    /// `create_directory`, `read_only`, `durable`, `unreadable_grace`, `foreign_lease`) is combined with
    /// `postgres`.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let file = dir.path().join("not-a-directory");
    /// std::fs::write(&file, b"").unwrap();
    ///
    /// let refused = leasehold::Locker::builder().directory(&file).build();
    /// assert!(matches!(refused, Err(leasehold::Error::InvalidConfig { .. })));
    /// let locker = leasehold::Locker::builder().directory(dir.path()).build()?;
    /// # drop(locker);
    /// # Ok(()) }
    /// ```
    pub fn build(self) -> Result<Locker> {
        Ok(Locker::from_engine(self.engine()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locker_is_shareable() {
        fn assert_shareable<T: Clone + Send + Sync + 'static>() {}
        assert_shareable::<Locker>();
    }
}
