//! The RAII guard, the hold it shares, and the lease state the renewal task
//! keeps alive.
//!
//! Ownership, from the outside in: a [`LockGuard`] holds an `Arc<Share>`;
//! every guard that re-entered the lock in one scope holds the same
//! `Share`. The `Share` owns the [`Hold`] (the lock as this process holds
//! it: lease plus renewal task). When the last guard goes, the `Share` gives
//! the `Hold` back to the name's queue, which hands it to the next local
//! waiter or releases it on disk.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::backend::{BackendLock, Kept, Renewal, Tokens};
use crate::error::{Error, LossReason, Result};
use crate::owner::Owner;
use crate::queue::Slot;
use crate::renew::{Registration, Renewer};
use crate::stats::{Counters, bump};
use crate::store::StoreLock as Held;
use crate::sys;

/// A held lock. Dropping it releases the lock.
///
/// The guard owns a share in a background task that renews the lease every
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
///   syscalls under the directory's lock, so when `drop` returns another
///   process can take it at once. (If a process frozen while holding the
///   directory lock keeps it, the drop waits for it up to half a second,
///   then leaves the lock for others to judge: its holder is gone.)
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
#[derive(Debug)]
pub struct LockGuard {
    /// `None` once `release` took it.
    share: Option<Arc<Share>>,
    lease: Arc<Lease>,
    lost: watch::Receiver<Option<LossReason>>,
    token: Option<u64>,
}

/// One holding of a lock (one acquisition), shared by the guards that
/// re-entered it.
#[derive(Debug)]
pub(crate) struct Share {
    hold: Mutex<Option<Hold>>,
    /// The hold's lease, for guards to observe.
    lease: Arc<Lease>,
    slot: Arc<Slot>,
    token: std::sync::OnceLock<Option<u64>>,
}

/// How a new share gets its fencing token.
#[derive(Debug)]
pub(crate) enum TokenStep {
    /// At hand (or fencing is off).
    Ready(Result<Option<u64>>),
    /// The reserved block is used up: call `next_token` on the blocking
    /// pool.
    FromDisk(Arc<Lease>),
}

/// The lock as this process holds it. It moves from guard to guard on an
/// in-process handoff, lease and renewal included.
#[derive(Debug)]
pub(crate) struct Hold {
    lease: Arc<Lease>,
    /// When this hold was taken from the disk (handoffs do not reset it).
    since: Instant,
}

/// State shared between a hold and the renewal thread (which holds only a
/// `Weak` to it).
#[derive(Debug)]
pub(crate) struct Lease {
    name: Arc<str>,
    held: Mutex<Option<Held>>,
    lost: watch::Sender<Option<LossReason>>,
    owner: Owner,
    renew_interval: Duration,
    margin_ms: u64,
    /// The lease's end on the boot clock, as last written to disk.
    deadline_ms: AtomicU64,
    /// Fencing tokens left in the block reserved on disk.
    tokens: Mutex<Option<Tokens>>,
    counters: Arc<Counters>,
    registration: Mutex<Option<Registration>>,
    /// The error of the last renewal, while renewals are failing: the
    /// true reason if the lease then runs out.
    failing: Mutex<Option<String>>,
}

/// What the renewal task should do next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Renew again after this long.
    Again(Duration),
    /// The lock is released or lost: stop.
    Stop,
}

/// Turns a lock just taken into a [`Hold`] whose lease is kept alive.
///
/// The code that wrote the record calls [`hold`](Self::hold) the moment the
/// record is on disk, on whatever thread that is (the blocking pool, the
/// runtime's thread, the session thread of a server): the lease runs from
/// the record's own renewal time, so renewal must not wait until the
/// acquiring task is polled again, which a stalled runtime can delay past
/// the lease. A hold whose acquiring future is gone is dropped where it
/// stands, and dropping it releases the lock.
#[derive(Debug, Clone)]
pub(crate) struct Keeper {
    pub(crate) lease: Duration,
    pub(crate) renew_interval: Duration,
    pub(crate) counters: Arc<Counters>,
    pub(crate) renewer: Renewer,
}

impl Keeper {
    /// Arms renewal of `held`, the first one due `renew_interval` after the
    /// record was written.
    pub(crate) fn hold(&self, name: &str, held: Held, tokens: Option<Tokens>) -> Hold {
        let lease_ms = u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX);
        let renew_ms = u64::try_from(self.renew_interval.as_millis()).unwrap_or(u64::MAX);
        let first = renewal_due_in(&held, self.renew_interval);
        let lease = Arc::new(Lease {
            name: name.into(),
            owner: Owner::from_record(&held.record().parsed()),
            deadline_ms: AtomicU64::new(lease_deadline_boot_ms(&held)),
            held: Mutex::new(Some(held)),
            lost: watch::Sender::new(None),
            renew_interval: self.renew_interval,
            margin_ms: margin_ms(lease_ms, renew_ms),
            tokens: Mutex::new(tokens),
            counters: Arc::clone(&self.counters),
            registration: Mutex::new(None),
            failing: Mutex::new(None),
        });
        let registration = self.renewer.add(&lease, first);
        *lock(&lease.registration) = registration;
        Hold {
            lease,
            since: Instant::now(),
        }
    }
}

/// How long until `held` is due for renewal: `interval` after its record
/// was last written, measured on the boot clock the record was stamped
/// with, however long ago that was.
fn renewal_due_in(held: &Held, interval: Duration) -> Duration {
    let written = held.record().renewed_at_boot;
    let since = Duration::from_millis(sys::boot_clock_ms().saturating_sub(written));
    interval.saturating_sub(since)
}

/// The boot-clock millisecond at which the lease last written runs out.
fn lease_deadline_boot_ms(held: &Held) -> u64 {
    let record = held.record();
    record.renewed_at_boot.saturating_add(record.lease_ms)
}

impl Kept for Hold {
    fn reserve_tokens(&self) -> Result<bool> {
        let mut held = self.lease.held();
        let Some(block) = held.as_mut().map(Held::reserve_tokens).transpose()?.flatten() else {
            return Ok(false);
        };
        *lock(&self.lease.tokens) = Some(block);
        Ok(true)
    }
}

impl Hold {
    pub(crate) fn since(&self) -> Instant {
        self.since
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// The next fencing token of this hold's reserved block; `Ok(None)` when
    /// fencing is off. Refills the block from disk (blocking I/O) when it is
    /// used up.
    pub(crate) fn next_token(&self) -> Result<Option<u64>> {
        self.lease.next_token()
    }

    /// Whether taking the next token needs the disk.
    pub(crate) fn tokens_exhausted(&self) -> bool {
        lock(&self.lease.tokens).is_some_and(|t| t.is_used_up())
    }

    /// Removes the lock from disk if it is still ours; failures go to
    /// `tracing`. The renewal thread finds the lease empty and drops it.
    pub(crate) fn release_sync(self) {
        match self.lease.release_now(false) {
            Ok(None) => {}
            Ok(Some(reason)) => {
                tracing::debug!(lock = &*self.lease.name, %reason, "released a lock that was no longer ours");
            }
            Err(error) => tracing::warn!(lock = &*self.lease.name, %error, "releasing a lock failed"),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks cannot leave the data torn.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Share {
    /// A share holding `hold`.
    pub(crate) fn new(hold: Hold, slot: Arc<Slot>) -> Arc<Self> {
        Arc::new(Share {
            lease: Arc::clone(&hold.lease),
            hold: Mutex::new(Some(hold)),
            slot,
            token: std::sync::OnceLock::new(),
        })
    }

    /// This acquisition's fencing token, without I/O if it is at hand.
    pub(crate) fn take_token(&self) -> TokenStep {
        let slot = lock(&self.hold);
        let Some(hold) = slot.as_ref() else {
            return TokenStep::Ready(Ok(None));
        };
        if hold.tokens_exhausted() {
            TokenStep::FromDisk(Arc::clone(&hold.lease))
        } else {
            TokenStep::Ready(hold.next_token())
        }
    }

    /// The guard of the acquisition that created this share.
    pub(crate) fn first_guard(self: &Arc<Self>, token: Option<u64>) -> LockGuard {
        let token = *self.token.get_or_init(|| token);
        LockGuard {
            share: Some(Arc::clone(self)),
            lost: self.lease.lost.subscribe(),
            lease: Arc::clone(&self.lease),
            token,
        }
    }

    fn take(&self) -> Option<Hold> {
        lock(&self.hold).take()
    }

    /// Another guard on this share (a re-entry): `None` if it was released,
    /// `Err(Lost)` if the lock was lost.
    pub(crate) fn guard(self: &Arc<Self>) -> Option<Result<LockGuard>> {
        lock(&self.hold).as_ref()?;
        let lease = Arc::clone(&self.lease);
        if lease.is_lost() {
            return Some(Err(lease.lost_error()));
        }
        Some(Ok(LockGuard {
            share: Some(Arc::clone(self)),
            lost: lease.lost.subscribe(),
            lease,
            token: self.token.get().copied().flatten(),
        }))
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        if let Some(hold) = self.take() {
            self.slot.pass_on(hold);
        }
    }
}

impl LockGuard {
    /// The lock name, as given to `acquire`.
    pub fn name(&self) -> &str {
        &self.lease.name
    }

    /// The record written when the lock was taken from the disk.
    pub fn owner(&self) -> &Owner {
        &self.lease.owner
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
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
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
        let held = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => runtime
                .spawn_blocking(move || lease.verify())
                .await
                .map_err(|e| Error::io("check lock", "", std::io::Error::other(e)))??,
            Err(_) => lease.verify()?,
        };
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
    /// then return [`Error::Lost`] whose [`LossReason`] says which.
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
        let lost = |guard: &Self| Err(guard.lease.lost_error());
        let Some(share) = self.share.take() else {
            return Ok(());
        };
        let Ok(share) = Arc::try_unwrap(share) else {
            // Other guards of a scope still hold it.
            return if self.is_lost() { lost(&self) } else { Ok(()) };
        };
        let Some(hold) = share.take() else {
            return Ok(());
        };
        if hold.is_lost() {
            hold.release_sync();
            share.slot.pass_fresh(false);
            return lost(&self);
        }
        let slot = Arc::clone(&share.slot);
        if slot.has_waiters() {
            slot.pass_on(hold);
            return Ok(());
        }
        // Release on the blocking pool. The queue's turn is passed on when
        // this future completes or is dropped, whichever comes first.
        struct PassOn(Arc<Slot>);
        impl Drop for PassOn {
            fn drop(&mut self) {
                self.0.pass_fresh(false);
            }
        }
        let _pass_on = PassOn(slot);
        let lease = Arc::clone(&hold.lease);
        let released = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => runtime
                .spawn_blocking(move || lease.release_now(true))
                .await
                .map_err(|e| Error::io("release lock", "", std::io::Error::other(e)))??,
            // Polled outside Tokio: do it here, as `Drop` would.
            Err(_) => lease.release_now(true)?,
        };
        match released {
            None => Ok(()),
            Some(reason) => Err(Error::Lost {
                name: self.lease.name.to_string(),
                reason,
            }),
        }
    }
}

/// `min(renew_interval, lease / 4)`.
fn margin_ms(lease_ms: u64, renew_ms: u64) -> u64 {
    renew_ms.min(lease_ms / 4)
}

impl Lease {
    fn held(&self) -> MutexGuard<'_, Option<Held>> {
        lock(&self.held)
    }

    /// The boot-clock millisecond after which this lease must not be
    /// renewed any more, and the holder counts it as lost.
    fn cutoff(&self) -> u64 {
        self.deadline_ms
            .load(Ordering::Acquire)
            .saturating_sub(self.margin_ms)
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.borrow().is_some() || sys::boot_clock_ms() >= self.cutoff()
    }

    /// Why the lock was lost; a loss not reported yet can only be the
    /// clock reaching the cutoff.
    fn loss_reason(&self) -> LossReason {
        self.lost.borrow().clone().unwrap_or(LossReason::LeaseExpired)
    }

    fn lost_error(&self) -> Error {
        Error::Lost {
            name: self.name.to_string(),
            reason: self.loss_reason(),
        }
    }

    pub(crate) fn next_token(&self) -> Result<Option<u64>> {
        let mut tokens = lock(&self.tokens);
        let Some(block) = tokens.as_mut() else {
            return Ok(None);
        };
        if let Some(token) = block.take() {
            return Ok(Some(token));
        }
        let mut held = self.held();
        let refill = match held.as_mut() {
            Some(held) => held.reserve_tokens()?,
            None => None,
        };
        let Some(mut block) = refill else {
            return Err(self.lost_error());
        };
        let token = block.take();
        *tokens = Some(block);
        Ok(token)
    }

    /// Whether the lock is still ours on disk; marks it lost if not.
    fn verify(&self) -> Result<bool> {
        let mut slot = self.held();
        let lost = match slot.as_ref() {
            Some(held) => held.check()?,
            None => Some(self.loss_reason()),
        };
        match lost {
            None => Ok(true),
            Some(reason) => {
                if self.lost.borrow().is_none() {
                    self.lose(&mut slot, reason);
                }
                Ok(false)
            }
        }
    }

    /// Releases if still held. `Ok(None)` when the lock was ours to the
    /// end; otherwise why it was not (already lost, taken over, or in a
    /// directory that was moved).
    ///
    /// `confirm` waits for a lock server's answer; without it an unlock on
    /// a server is only queued (files are always removed at once).
    pub(crate) fn release_now(&self, confirm: bool) -> Result<Option<LossReason>> {
        let held = self.held().take();
        *lock(&self.registration) = None;
        match held {
            Some(held) => held.release(confirm),
            None => Ok(Some(self.loss_reason())),
        }
    }

    /// One renewal, run on the renewal thread.
    pub(crate) fn renew_once(&self) -> Step {
        let mut slot = match self.held.try_lock() {
            Ok(slot) => slot,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            // Busy reserving fencing tokens (which may wait for the
            // directory lock) or being released: come back shortly rather
            // than hold up the thread every lease shares.
            Err(std::sync::TryLockError::WouldBlock) => {
                return Step::Again(
                    (self.renew_interval / 16).clamp(Duration::from_millis(1), Duration::from_millis(10)),
                );
            }
        };
        let Some(held) = slot.as_mut() else {
            return Step::Stop;
        };
        let cutoff = self.cutoff();
        if sys::boot_clock_ms() >= cutoff {
            let reason = match lock(&self.failing).take() {
                Some(error) => LossReason::RenewalFailed { error },
                None => LossReason::LeaseExpired,
            };
            self.lose(&mut slot, reason);
            return Step::Stop;
        }
        match held.renew(cutoff) {
            Ok(Renewal::Renewed) => {
                self.deadline_ms
                    .store(lease_deadline_boot_ms(held), Ordering::Release);
                bump(&self.counters.renewals);
                *lock(&self.failing) = None;
                tracing::trace!(lock = &*self.name, "lease renewed");
                Step::Again(renewal_due_in(held, self.renew_interval))
            }
            Ok(Renewal::Lost(reason)) => {
                self.lose(&mut slot, reason);
                Step::Stop
            }
            Err(error) => {
                bump(&self.counters.renewal_failures);
                let now = sys::boot_clock_ms();
                if now >= cutoff {
                    let error = error.to_string();
                    self.lose(&mut slot, LossReason::RenewalFailed { error });
                    return Step::Stop;
                }
                tracing::warn!(lock = &*self.name, %error, "lease renewal failed; retrying");
                *lock(&self.failing) = Some(error.to_string());
                let retry = (self.renew_interval / 4).max(Duration::from_millis(1));
                Step::Again(retry.min(Duration::from_millis(cutoff - now)))
            }
        }
    }

    fn lose(&self, slot: &mut MutexGuard<'_, Option<Held>>, reason: LossReason) {
        tracing::warn!(lock = &*self.name, %reason, "lock lost");
        bump(&self.counters.lost);
        // Tell the holder first: cleaning up below may wait on the disk.
        self.lost.send_replace(Some(reason));
        if let Some(held) = slot.take() {
            // Still ours on disk (say our lease ran out while we were
            // paused, and nobody took it yet)? Then free it for others.
            if let Err(error) = held.release(false) {
                tracing::debug!(lock = &*self.name, %error, "could not remove a lost lock");
            }
        }
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
