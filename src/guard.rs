//! The RAII guard, the grant it shares, and the release policy.
//!
//! Ownership, from the outside in: a [`LockGuard`] holds an `Arc<Grant>`;
//! every guard that re-entered the lock in one scope holds the same
//! `Grant`. The `Grant` owns the [`Hold`] (the lock as this process holds
//! it: lease plus renewal). When the last guard goes, [`decide`], the one
//! owner of release, says what becomes of the hold, for `Drop`,
//! `release()` and the queue alike: it passes to the next local waiter
//! through the name's queue, or it goes back to the store (dropping a
//! `Hold` gives it back) and the queue is told.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::backend::{Mode, ReleaseNow};
use crate::error::{Error, Result};
use crate::lease::{Hold, Lease};
use crate::owner::Owner;
use crate::pool::blocking;
use crate::queue::Queue;

/// How long a lock may pass between the tasks of one `Locker` before it is
/// released in the store for other processes...
pub(crate) const HANDOFF_WINDOW: Duration = Duration::from_millis(10);

/// ...and how long at most, since it was taken from the store, while at
/// the end of each window nobody of another process is seen waiting for
/// it (a waiter the store cannot show, a shared one or another program's,
/// waits this long; where the store can show nobody, as where the files'
/// line is off, every window ends in the store).
pub(crate) const HANDOFF_STRETCH: Duration = Duration::from_millis(100);
const _: () = assert!(HANDOFF_WINDOW.as_nanos() < HANDOFF_STRETCH.as_nanos());

/// How long the next local waiter holds back after such a release, so
/// that waiters in other processes get their chance.
pub(crate) const COURTESY: Duration = Duration::from_millis(1);

/// A held lock. Dropping it releases the lock.
///
/// The guard owns a share in a background thread that renews the lease every
/// `renew_interval`. If the lock is lost anyway (the lease ran out while the
/// process was paused, someone removed the lock file, the disk failed),
/// [`lost`](Self::lost) resolves and [`is_lost`](Self::is_lost) turns true;
/// nothing panics.
///
/// Dropping the guard stops the renewal task and releases the lock
/// without an `.await`, so it works outside a runtime too, for example
/// after the runtime has shut down. How, depends on where the locks live:
///
/// - **Files** (both strategies): the lock is removed synchronously, a few
///   syscalls under the name's mutation lock, so when `drop` returns another
///   process can take it at once. The drop waits at most a millisecond for
///   anything another process holds: if another process is changing that
///   same name at that instant and does not finish (it is frozen while it
///   does), the removal is handed to a thread of leasehold's, which
///   finishes it as soon as it can, the lock still ours until then. (A
///   process that exits meanwhile leaves the lock behind with its `flock`
///   free, which leasehold takes over at once.)
/// - **PostgreSQL**: the unlock is queued on the `Locker`'s session and
///   sent by its thread at once, without waiting for the server; other
///   hosts see the name free a round trip later.
///   [`release`](Self::release)`.await` waits for the server's answer.
///
/// Failures while dropping are reported through `tracing`; call [`release`](Self::release) to get
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
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct LockGuard {
    /// `None` once `release` took it.
    grant: Option<Arc<Grant>>,
    lease: Arc<Lease>,
    token: Option<u64>,
}

/// One grant of a lock to this process (one acquisition), shared by the
/// guards that re-entered it.
#[derive(Debug)]
pub(crate) struct Grant {
    hold: Mutex<Option<Hold>>,
    /// The hold's lease, for guards to observe.
    lease: Arc<Lease>,
    queue: Arc<Queue<Hold>>,
    token: TokenCell,
}

/// A grant's fencing token, written once: with the grant when it is at
/// hand, else by its first guard. Re-entrant guards read it. Two atomics
/// rather than a `OnceLock`, whose every initialization (even
/// `OnceLock::from`) runs its one-time gate: a call and two atomic
/// writes on the hot path of each in-process handoff.
#[derive(Debug)]
struct TokenCell {
    value: AtomicU64,
    /// `UNSET`, `WRITING`, `NO_TOKEN` (fencing is off) or `TOKEN` (`value`).
    state: AtomicU8,
}

const UNSET: u8 = 0;
const WRITING: u8 = 1;
const NO_TOKEN: u8 = 2;
const TOKEN: u8 = 3;

impl TokenCell {
    fn unset() -> Self {
        Self {
            value: AtomicU64::new(0),
            state: AtomicU8::new(UNSET),
        }
    }

    fn new(token: Option<u64>) -> Self {
        Self {
            value: AtomicU64::new(token.unwrap_or(0)),
            state: AtomicU8::new(if token.is_some() { TOKEN } else { NO_TOKEN }),
        }
    }

    /// Writes `token` unless a token was written already; returns the one
    /// kept.
    fn set_once(&self, token: Option<u64>) -> Option<u64> {
        // A load first: a grant made with its token (a handoff's) needs no
        // locked instruction here.
        if self.state.load(Ordering::Acquire) != UNSET
            || self
                .state
                .compare_exchange(UNSET, WRITING, Ordering::Acquire, Ordering::Acquire)
                .is_err()
        {
            return self.get();
        }
        self.value.store(token.unwrap_or(0), Ordering::Relaxed);
        let state = if token.is_some() { TOKEN } else { NO_TOKEN };
        self.state.store(state, Ordering::Release);
        token
    }

    /// The token, if written (and fencing is on).
    fn get(&self) -> Option<u64> {
        (self.state.load(Ordering::Acquire) == TOKEN).then(|| self.value.load(Ordering::Relaxed))
    }
}

/// How a new grant gets its fencing token.
#[derive(Debug)]
pub(crate) enum TokenStep {
    /// At hand (or fencing is off).
    Ready(Result<Option<u64>>),
    /// The reserved block is used up: call `next_token` on the blocking
    /// pool.
    FromDisk(Arc<Lease>),
}

/// What the release policy made of a hold whose last guard went.
#[derive(Debug)]
enum Next {
    /// A local waiter has it now (and the queue's turn).
    HandedOn,
    /// Give it back to the store, then tell the queue.
    GiveBack { hold: Hold, then: Then },
}

/// What the name's queue is told once a hold went back to the store.
#[derive(Debug, Clone, Copy)]
enum Then {
    /// An exclusive hold had the queue's turn: it passes on, after a
    /// [`COURTESY`] pause for the next local waiter if set.
    PassTurn { courtesy: bool },
    /// A shared hold or a permit never held the turn: wake the local
    /// waiters, which look at the store again.
    Wake,
}

impl Then {
    fn tell(self, queue: &Queue<Hold>) {
        match self {
            Then::PassTurn { courtesy } => queue.pass_fresh(courtesy),
            Then::Wake => queue.changed.notify_waiters(),
        }
    }
}

/// The release policy, the one place that decides what becomes of a
/// hold whose last guard went, for `Drop`, [`LockGuard::release`] and the
/// queue (a hold handed to a waiter that went away) alike.
///
/// A shared hold or a permit goes back to the store. An exclusive one,
/// within [`HANDOFF_WINDOW`] of taking the lock from the store and not
/// lost, passes straight to the next local waiter; otherwise it goes
/// back to the store, and the next local waiter (after a [`COURTESY`]
/// pause) competes for it afresh with other processes. A window that
/// ends with nobody of another process seen waiting (the store looks
/// once, cheaply: [`Hold::unwaited`]) is followed by another, up to
/// [`HANDOFF_STRETCH`] since the lock was taken from the store: a lock
/// nobody else wants is not worth the disk's round trip and the pause.
///
/// A lock that was lost is never handed on as held: the local waiter
/// that receives it checks, as it takes it, and goes to the store
/// instead. `check_lost` also looks here, for [`LockGuard::release`],
/// which must report the loss; `Drop` leaves it to the receiver, and
/// saves a clock read per handoff.
fn decide(hold: Hold, queue: &Queue<Hold>, check_lost: bool) -> Next {
    if hold.lease().mode() != Mode::Exclusive {
        return Next::GiveBack {
            hold,
            then: Then::Wake,
        };
    }
    // The one clock read of a handoff on the giver's side: the window's,
    // and the end of the taker's wait (`Hold::handed_at`).
    let now = Instant::now();
    let mut hold = hold;
    // A window renewed near the stretch's end ends with it (the first
    // window ends well before).
    let within_stretch = now.saturating_duration_since(hold.since()) < HANDOFF_STRETCH;
    let mut within_window = within_stretch && now.saturating_duration_since(hold.window()) < HANDOFF_WINDOW;
    // Fair: another `Locker`'s ticket in line ends the window (a look or
    // a few, `Lines::ticket_in_line`; only when there is someone here to
    // hand it to).
    if within_window && hold.lease().fair() && queue.has_waiters() && hold.waited() {
        within_window = false;
    }
    if !within_window && within_stretch && queue.has_waiters() && hold.unwaited() {
        // Nobody else wants it: another window, without the disk's round
        // trip and the pause.
        hold.renew_window(now);
        within_window = true;
    }
    let hold = if within_window && !(check_lost && hold.is_lost()) {
        hold.hand_at(now);
        match queue.offer(hold) {
            None => return Next::HandedOn,
            Some(hold) => hold,
        }
    } else {
        hold
    };
    let courtesy = !within_window && queue.has_waiters();
    Next::GiveBack {
        hold,
        then: Then::PassTurn { courtesy },
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks cannot leave the data torn.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Grant {
    /// A grant holding `hold`, whose queue is `queue`.
    pub(crate) fn new(hold: Hold, queue: Arc<Queue<Hold>>) -> Arc<Self> {
        Arc::new(Grant {
            lease: Arc::clone(hold.lease()),
            hold: Mutex::new(Some(hold)),
            queue,
            token: TokenCell::unset(),
        })
    }

    /// A grant holding `hold` whose fencing token is known already
    /// (`token_at_hand`): no `take_token`, and no first write of the
    /// token (a one-time initialization costs a call on the hot path of a
    /// handoff).
    pub(crate) fn with_token(hold: Hold, queue: Arc<Queue<Hold>>, token: Option<u64>) -> Arc<Self> {
        Arc::new(Grant {
            lease: Arc::clone(hold.lease()),
            hold: Mutex::new(Some(hold)),
            queue,
            token: TokenCell::new(token),
        })
    }

    /// What kind of holding this is.
    pub(crate) fn mode(&self) -> Mode {
        self.lease.mode()
    }

    /// Whether the lock was lost.
    pub(crate) fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// This acquisition's fencing token, without I/O if it is at hand.
    /// Called on a new grant, which holds its hold.
    pub(crate) fn take_token(&self) -> TokenStep {
        match self.lease.token_at_hand() {
            Some(token) => TokenStep::Ready(token),
            None => TokenStep::FromDisk(Arc::clone(&self.lease)),
        }
    }

    /// The guard of the acquisition that made this grant.
    pub(crate) fn first_guard(self: Arc<Self>, token: Option<u64>) -> LockGuard {
        let token = self.token.set_once(token);
        LockGuard {
            lease: Arc::clone(&self.lease),
            grant: Some(self),
            token,
        }
    }

    fn take(&self) -> Option<Hold> {
        lock(&self.hold).take()
    }

    /// The hold back out of a grant no guard was made of, so that its
    /// drop does not pass it on: for a handoff that turned out not to be
    /// ours, whose taker keeps the queue's turn and goes to the store.
    pub(crate) fn take_hold(&self) -> Option<Hold> {
        self.take()
    }

    /// Another guard on this grant (a re-entry): `None` if it was released,
    /// `Err(Lost)` if the lock was lost.
    pub(crate) fn guard(self: &Arc<Self>) -> Option<Result<LockGuard>> {
        lock(&self.hold).as_ref()?;
        let lease = Arc::clone(&self.lease);
        if lease.is_lost() {
            return Some(Err(lease.lost_error()));
        }
        Some(Ok(LockGuard {
            grant: Some(Arc::clone(self)),
            lease,
            token: self.token.get(),
        }))
    }
}

/// The release policy carried out without waiting: hand the hold on, or
/// give it back to the store (dropping a hold does, see `Hold`'s `Drop`)
/// and tell the queue. What `Drop` does, and what the queue does with a
/// hold whose waiter went away before picking it up (its
/// [`Dispose`](crate::queue::Dispose)).
pub(crate) fn pass_on(hold: Hold, queue: &Queue<Hold>) {
    // Only an exclusive hold is ever offered to a waiter, so only one can
    // come back here from the queue, whose turn must then move on.
    if let Next::GiveBack { hold, then } = decide(hold, queue, false) {
        drop(hold);
        then.tell(queue);
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if let Some(hold) = self.take() {
            pass_on(hold, &self.queue);
        }
    }
}

impl LockGuard {
    /// This guard's lease (for `upgradable.rs`).
    pub(crate) fn lease_of(&self) -> &Arc<Lease> {
        &self.lease
    }
}

impl LockGuard {
    /// The lock name, as given to `acquire`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let guard = locker.acquire("reports/nightly").await?;
    /// assert_eq!(guard.name(), "reports/nightly");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        self.lease.name()
    }

    /// The record written when the lock was taken from the disk (or the
    /// server): what other processes see as the holder, through
    /// [`Locker::holder`](crate::Locker::holder).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let guard = locker.acquire("reindex").await?;
    /// assert_eq!(guard.owner().pid(), Some(std::process::id()));
    /// let seen = locker.holder("reindex").await?.expect("held");
    /// assert_eq!(seen.uuid(), guard.owner().uuid());
    /// # Ok(()) }
    /// ```
    pub fn owner(&self) -> &Owner {
        self.lease.owner()
    }

    /// Whether this guard holds the name shared (from
    /// [`acquire_shared`](crate::Locker::acquire_shared) and its kin):
    /// other shared guards, in this process or others, may hold it at the
    /// same time, but no exclusive one. `false` for an exclusive guard, for
    /// a semaphore permit, and for a shared acquisition that re-entered an
    /// exclusive hold of its [`scope`](crate::Locker::scope) (which holds
    /// the name exclusively).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let reader = locker.acquire_shared("catalog").await?;
    /// let other = locker.acquire_shared("catalog").await?;
    /// assert!(reader.is_shared() && other.is_shared());
    /// assert!(locker.try_acquire("catalog").await?.is_none());
    /// # Ok(()) }
    /// ```
    pub fn is_shared(&self) -> bool {
        self.lease.mode() == Mode::Shared
    }

    /// This acquisition's fencing token, when the `Locker` was built with
    /// [`fencing(true)`](crate::LockerBuilder::fencing); `None` otherwise.
    ///
    /// Every acquisition of a name, in any process sharing the directory,
    /// gets a token greater than every earlier acquisition's, across
    /// crashes and restarts. Hand it to the resource the lock protects and
    /// have the resource refuse any token lower than one it has seen: a
    /// holder that was paused past its lease is then refused, however late
    /// it wakes. Re-entrant guards share their acquisition's token.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::builder().directory(dir.path()).fencing(true).build()?;
    /// let first = locker.acquire("ledger").await?.fencing_token().unwrap();
    /// let second = locker.acquire("ledger").await?.fencing_token().unwrap();
    /// assert!(second > first);
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> Option<u64> {
        self.token
    }

    /// Whether the lock has been lost (see [`lost`](Self::lost)).
    ///
    /// True once the renewal thread found the lock gone or taken, or once
    /// the lease has come within its safety margin of running out without
    /// a renewal, whether or not the renewal thread has run. It does not
    /// touch the disk; [`ensure_held`](Self::ensure_held) does.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let guard = locker.acquire("reindex").await?;
    /// assert!(!guard.is_lost());
    ///
    /// // Someone removes the lock file behind the holder's back.
    /// std::fs::remove_file(locker.lock_path("reindex")?).unwrap();
    /// assert!(guard.ensure_held().await.is_err());
    /// assert!(guard.is_lost());
    /// # Ok(()) }
    /// ```
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// How long this holder can still count on its lock without another
    /// renewal: the time until it would count the lock lost if no renewal
    /// landed, by its own clock (the boot clock where there is one); zero
    /// once the lock is lost. Each renewal pushes it back, to about the
    /// lease less `min(renew_interval, lease / 4)`; the lease itself, as
    /// other processes judge it, runs at least that margin longer. It does
    /// not touch the disk.
    ///
    /// Useful before a step that must finish under the lock: one that
    /// takes longer than this may outlast the lease if renewals fail.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use std::time::Duration;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::builder()
    ///     .directory(dir.path())
    ///     .lease(Duration::from_secs(8))
    ///     .build()?;
    /// let guard = locker.acquire("reindex").await?;
    /// // Fresh: the lease less its margin (2 s here), give or take a tick.
    /// let left = guard.lease_left();
    /// assert!(left > Duration::from_secs(5) && left <= Duration::from_secs(6));
    ///
    /// // Lost (the lock file removed behind its back): nothing left.
    /// std::fs::remove_file(locker.lock_path("reindex")?).unwrap();
    /// assert!(guard.ensure_held().await.is_err());
    /// assert_eq!(guard.lease_left(), Duration::ZERO);
    /// # Ok(()) }
    /// ```
    pub fn lease_left(&self) -> Duration {
        self.lease.left()
    }

    /// Checks on disk, now, that the lock is still this guard's.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] if it is not (the guard then reports the loss through
    /// [`lost`](Self::lost) too), and I/O errors from looking.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only looks.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let guard = locker.acquire("ledger").await?;
    /// guard.ensure_held().await?;
    /// std::fs::remove_file(locker.lock_path("ledger")?).unwrap();
    /// assert!(guard.ensure_held().await.unwrap_err().is_lost());
    /// assert!(guard.is_lost());
    /// # Ok(()) }
    /// ```
    pub async fn ensure_held(&self) -> Result<()> {
        if self.is_lost() {
            return Err(self.lease.lost_error());
        }
        let lease = Arc::clone(&self.lease);
        let held = blocking(move || lease.verify()).await??;
        if held {
            Ok(())
        } else {
            Err(self.lease.lost_error())
        }
    }

    /// Resolves once the lock has been lost: the lease ran out before it
    /// could be renewed, renewal found the lock file removed or replaced,
    /// the lock directory's path came to name another directory (or none),
    /// or renewals kept failing until less than the safety margin of the
    /// lease was left (the margin is `min(renew_interval, lease / 4)`, so
    /// the holder learns before anyone may legally take over). Loss is
    /// noticed at the next renewal, so within one `renew_interval`.
    /// [`ensure_held`](Self::ensure_held) and [`release`](Self::release)
    /// then return [`Error::Lost`] whose [`LossReason`](crate::LossReason) says which.
    ///
    /// Stop the critical section when this resolves: someone else may hold
    /// the lock now. A lock the directory still shows as this holder's (a
    /// lease that ran out while the process was paused, nobody having
    /// taken it yet) is removed before this resolves, unless the name is
    /// busy that instant (another process changing it, or a shared lock or
    /// permit, or a lock on a server) or renewals failed (the store may be
    /// slow to answer), in which case it is removed just after: a process
    /// that exits on the news of an expired lease leaves nothing behind.
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
        // Subscribed here rather than with every guard: a loss reported
        // before is the value already there, which `wait_for` sees first.
        let mut rx = self.lease.subscribe();
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
        let Some(grant) = self.grant.take() else {
            return Ok(());
        };
        let Ok(grant) = Arc::try_unwrap(grant) else {
            // Other guards of a scope still hold it.
            return if self.is_lost() {
                Err(self.lease.lost_error())
            } else {
                Ok(())
            };
        };
        let Some(hold) = grant.take() else {
            return Ok(());
        };
        let Next::GiveBack { hold, then } = decide(hold, &grant.queue, true) else {
            return Ok(());
        };
        // The queue is told when this future completes or is dropped,
        // whichever comes first; the release itself finishes on the
        // blocking pool either way.
        struct Tell(Arc<Queue<Hold>>, Then);
        impl Drop for Tell {
            fn drop(&mut self) {
                self.1.tell(&self.0);
            }
        }
        let _tell = Tell(Arc::clone(&grant.queue), then);
        let lost = hold.is_lost();
        // Inline when the name's mutation lock is free this instant
        // (almost always: it is held only for a few syscalls), as `Drop`
        // does; on the blocking pool when that would mean waiting (and
        // always for a shared hold, a permit, or a lock on a server).
        let released = match hold.release_now(true) {
            ReleaseNow::Done(released) => released?,
            ReleaseNow::Busy(hold) => blocking(move || hold.release(true)).await??,
        };
        if lost {
            return Err(self.lease.lost_error());
        }
        match released {
            None => Ok(()),
            Some(reason) => Err(Error::Lost {
                name: self.lease.name().to_owned(),
                reason,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_cell_is_written_once() {
        let cell = TokenCell::unset();
        assert_eq!(cell.get(), None);
        assert_eq!(cell.set_once(Some(7)), Some(7));
        assert_eq!(cell.get(), Some(7));
        assert_eq!(cell.set_once(Some(9)), Some(7), "a second write is ignored");
        assert_eq!(cell.get(), Some(7));

        let off = TokenCell::unset();
        assert_eq!(off.set_once(None), None);
        assert_eq!(off.set_once(Some(3)), None, "fencing off stays off");
        assert_eq!(off.get(), None);

        assert_eq!(TokenCell::new(Some(u64::MAX)).get(), Some(u64::MAX));
        assert_eq!(TokenCell::new(Some(0)).set_once(Some(5)), Some(0));
        assert_eq!(TokenCell::new(None).set_once(Some(5)), None);
    }

    #[test]
    fn guard_is_an_owned_permit() {
        fn assert_owned<T: Send + Sync + 'static>() {}
        assert_owned::<LockGuard>();
    }

    /// Polls `fut` once, with this task's waker.
    async fn poll_once<F: std::future::Future + ?Sized>(
        fut: &mut std::pin::Pin<Box<F>>,
    ) -> std::task::Poll<F::Output> {
        std::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx))).await
    }

    /// The lock directory as another `Locker` (another process, to the
    /// line) opens it for its line's bytes: on Windows, the line file.
    fn line_bytes_of(dir: &std::path::Path) -> std::fs::File {
        let dir = crate::sys::syscall::open_dir(dir).unwrap();
        crate::sys::line_file(&dir, true).unwrap_or(dir)
    }

    /// Past its 10 ms window, a lock passes on to a local waiter only while
    /// nobody of another `Locker` stands in the name's line, and only up
    /// to [`HANDOFF_STRETCH`] after it was taken from the store; a waiter
    /// of another process in line gets its turn at the window's end as
    /// before (the line's byte held as another `Locker` holds it, on an
    /// open file description of its own).
    #[tokio::test(flavor = "current_thread")]
    async fn past_the_window_a_lock_goes_on_only_while_nobody_else_waits() {
        let dir = tempfile::tempdir().unwrap();
        let locker = crate::Locker::builder()
            .directory(dir.path())
            .durable(false)
            .build()
            .unwrap();
        let bytes = line_bytes_of(dir.path());
        // Where there is no line to look at (no OFD locks), the lock goes
        // back to the store at every window's end, as it always did.
        let line_on = crate::sys::byte_range_locks() && !crate::sys::fs_is_remote(&bytes);
        let mut exercised = [false; 3];
        for round in 0..60 {
            // 0: nobody else waits, 15 ms after the lock was taken;
            // 1: the same, past the stretch; 2: another `Locker` in line.
            let case = round % 3;
            if exercised[case] {
                continue;
            }
            let name = format!("w{round}");
            let file_name = crate::name::LockName::new(&name, crate::PathStyle::default()).unwrap();
            let other = crate::fs::line::Lines::default();
            // The hold's age lies between these two's.
            let asked = Instant::now();
            let first = locker.acquire(&name).await.unwrap();
            let taken = Instant::now();
            let first_uuid = first.owner().uuid().unwrap().to_owned();
            let mut next = Box::pin(locker.acquire(&name));
            assert!(poll_once(&mut next).await.is_pending());
            if case == 2 {
                other.wait_on(&bytes, file_name.file_name());
            }
            let hold_for = if case == 1 {
                HANDOFF_STRETCH + HANDOFF_WINDOW
            } else {
                HANDOFF_WINDOW + HANDOFF_WINDOW / 2
            };
            std::thread::sleep(hold_for.saturating_sub(taken.elapsed()));
            let handoffs = locker.stats().handoffs;
            let (oldest, youngest) = (asked.elapsed(), taken.elapsed());
            drop(first);
            if case == 2 {
                other.stopped_waiting(&bytes, file_name.file_name());
            }
            let next = tokio::time::timeout(Duration::from_secs(5), next)
                .await
                .expect("the next waiter got the lock")
                .unwrap();
            let handed_on = locker.stats().handoffs - handoffs == 1;
            assert_eq!(
                handed_on,
                next.owner().uuid() == Some(first_uuid.as_str()),
                "a handoff keeps the acquisition, the store makes another"
            );
            drop(next);
            // Dropped at an age outside what this case is about (a slow
            // machine): again.
            let past_window = youngest >= HANDOFF_WINDOW;
            let in_stretch = oldest < HANDOFF_STRETCH;
            let past_stretch = youngest >= HANDOFF_STRETCH;
            if !past_window || (case == 1) != past_stretch || (case != 1 && !in_stretch) {
                continue;
            }
            let expected = case == 0 && line_on;
            assert_eq!(
                handed_on, expected,
                "case {case}, dropped {youngest:?} to {oldest:?} after it was taken, line {line_on}"
            );
            exercised[case] = true;
        }
        assert_eq!(exercised, [true; 3], "a case was never dropped in time");
    }
}
