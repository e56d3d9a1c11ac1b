//! The lease of a held lock, and what keeps it: [`Keeper`] arms renewal
//! the moment a lock is taken, [`Hold`] is the lock as this process holds
//! it (moved whole on an in-process handoff), and [`Lease`] is the state
//! the renewal thread ([`renew`](crate::renew)) works on, deciding for each
//! renewal whether to go on, retry, or report the lock lost. [`Roll`]
//! lists every lease a `Locker` armed, for `Locker::release_all`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::backend::{BackendLock, Kept, Mode, ReleaseNow, Renewal, Tokens};
use crate::error::{Error, LossReason, Result};
use crate::owner::Owner;
use crate::renew::{Registration, Renewable, Renewer, Step};
use crate::stats::{Counters, bump};
use crate::store::StoreLock;
use crate::sys;

/// The lock as this process holds it. It moves from guard to guard on an
/// in-process handoff, lease and renewal included.
#[derive(Debug)]
pub(crate) struct Hold {
    lease: Arc<Lease>,
    /// When this hold was taken from the disk (handoffs do not reset it).
    since: Instant,
    /// When its current handoff window began: `since`, or later if the
    /// window was renewed because nobody else waited (`guard::decide`).
    window: Instant,
    /// When the last holder handed it on to the next local waiter (read
    /// once by the giver, for its handoff window): that waiter's wait
    /// ends there, which spares the taker a clock read.
    handed_at: Option<Instant>,
}

/// State shared between a hold and the renewal thread (which holds only a
/// `Weak` to it).
#[derive(Debug)]
pub(crate) struct Lease {
    name: Arc<str>,
    /// What kind of holding it is.
    mode: Mode,
    held: Mutex<Option<StoreLock>>,
    lost: watch::Sender<Option<LossReason>>,
    /// Whether `lost` was sent a reason: set first, read by
    /// [`is_lost`](Lease::is_lost) on every in-process handoff without
    /// the watch's lock.
    reported: AtomicBool,
    owner: Owner,
    renew_interval: Duration,
    margin_ms: u64,
    /// The lease's end on the boot clock, as last written to disk.
    deadline_ms: AtomicU64,
    /// Fencing tokens left in the block reserved on disk.
    tokens: Mutex<Option<Tokens>>,
    counters: Arc<Counters>,
    /// `LockerBuilder::fair`: see [`Lease::fair`].
    fair: bool,
    registration: Mutex<Option<Registration>>,
    /// The error of the last renewal, while renewals are failing: the
    /// true reason if the lease then runs out.
    failing: Mutex<Option<String>>,
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
    /// Every lease armed here, and whether the `Locker` was shut down.
    pub(crate) roll: Arc<Roll>,
    /// Whether holds are passed among this `Locker`'s tasks while another
    /// process is seen waiting (`LockerBuilder::fair`: not).
    pub(crate) fair: bool,
}

impl Keeper {
    /// Arms renewal of `held`, the first one due `renew_interval` after the
    /// record was written.
    pub(crate) fn hold(&self, name: &str, mode: Mode, held: StoreLock, tokens: Option<Tokens>) -> Hold {
        let lease_ms = u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX);
        let renew_ms = u64::try_from(self.renew_interval.as_millis()).unwrap_or(u64::MAX);
        let first = renewal_due_in(&held, self.renew_interval);
        let lease = Arc::new(Lease {
            name: name.into(),
            mode,
            owner: Owner::from_own(held.record()),
            deadline_ms: AtomicU64::new(lease_deadline_boot_ms(&held)),
            held: Mutex::new(Some(held)),
            lost: watch::Sender::new(None),
            reported: AtomicBool::new(false),
            renew_interval: self.renew_interval,
            margin_ms: margin_ms(lease_ms, renew_ms),
            tokens: Mutex::new(tokens),
            counters: Arc::clone(&self.counters),
            fair: self.fair,
            registration: Mutex::new(None),
            failing: Mutex::new(None),
        });
        let registration = self.renewer.add(&lease, first);
        *lock(&lease.registration) = registration;
        self.roll.add(&lease);
        let now = Instant::now();
        Hold {
            lease,
            since: now,
            window: now,
            handed_at: None,
        }
    }
}

/// How long until `held` is due for renewal: `interval` after its record
/// was last written, measured on the boot clock the record was stamped
/// with, however long ago that was.
fn renewal_due_in(held: &StoreLock, interval: Duration) -> Duration {
    let written = held.record().renewed_at_boot;
    let since = Duration::from_millis(sys::boot_clock_ms().saturating_sub(written));
    interval.saturating_sub(since)
}

/// The boot-clock millisecond at which the lease last written runs out.
fn lease_deadline_boot_ms(held: &StoreLock) -> u64 {
    let record = held.record();
    record.renewed_at_boot.saturating_add(record.lease_ms)
}

impl Kept for Hold {
    fn reserve_tokens(&self) -> Result<bool> {
        let mut held = self.lease.held();
        let Some(block) = held
            .as_mut()
            .map(StoreLock::reserve_tokens)
            .transpose()?
            .flatten()
        else {
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

    /// When its current handoff window began.
    pub(crate) fn window(&self) -> Instant {
        self.window
    }

    /// Begins a new handoff window at `at` (on the monotonic clock).
    pub(crate) fn renew_window(&mut self, at: Instant) {
        self.window = at;
    }

    /// Whether a cheap look shows nobody in another process waiting for
    /// this lock (see [`BackendLock::unwaited`]): `false` too when the
    /// lock is gone, or the renewal thread is at it this instant (never
    /// waited for: this runs on the runtime's thread).
    pub(crate) fn unwaited(&self) -> bool {
        let held = match self.lease.held.try_lock() {
            Ok(held) => held,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        held.as_ref().is_some_and(BackendLock::unwaited)
    }

    /// Whether a cheap look shows someone in another process waiting for
    /// this lock (see [`BackendLock::waited`]): `false` when it cannot
    /// tell, when the lock is gone, or when the renewal thread is at it
    /// this instant (never waited for: this runs on the runtime's thread).
    pub(crate) fn waited(&self) -> bool {
        let held = match self.lease.held.try_lock() {
            Ok(held) => held,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        held.as_ref().is_some_and(BackendLock::waited)
    }

    /// When it was last handed on to a local waiter, if it was.
    pub(crate) fn handed_at(&self) -> Option<Instant> {
        self.handed_at
    }

    /// Marks it as handed on at `at` (on the monotonic clock).
    pub(crate) fn hand_at(&mut self, at: Instant) {
        self.handed_at = Some(at);
    }

    pub(crate) fn lease(&self) -> &Arc<Lease> {
        &self.lease
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// Releases the lock if it is still ours, and says what happened:
    /// `None` when it was ours to the end; otherwise why it was not.
    /// `confirm` waits for the whole truth (see [`BackendLock::release`]).
    pub(crate) fn release(self, confirm: bool) -> Result<Option<LossReason>> {
        self.lease
            .release_held(confirm)
            .unwrap_or_else(|| Ok(Some(self.lease.loss_reason())))
    }

    /// [`release`](Self::release), if that can be done at once without
    /// waiting for another thread or process (on the runtime's thread);
    /// the hold back otherwise, still renewed.
    pub(crate) fn release_now(self, confirm: bool) -> ReleaseNow<Self> {
        // The renewal thread keeps this while renewing (a few syscalls,
        // but maybe a slow disk): never wait for it here.
        let lease = Arc::clone(&self.lease);
        let mut held = match lease.held.try_lock() {
            Ok(held) => held,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return ReleaseNow::Busy(self),
        };
        let Some(store_lock) = held.take() else {
            drop(held);
            *lock(&self.lease.registration) = None;
            return ReleaseNow::Done(Ok(Some(self.lease.loss_reason())));
        };
        match store_lock.release_now(confirm) {
            ReleaseNow::Done(released) => {
                drop(held);
                *lock(&self.lease.registration) = None;
                ReleaseNow::Done(released)
            }
            ReleaseNow::Busy(store_lock) => {
                *held = Some(store_lock);
                drop(held);
                ReleaseNow::Busy(self)
            }
        }
    }
}

impl Drop for Hold {
    /// Releases the lock if it is still ours, without waiting on a server;
    /// failures go to `tracing`. A hold is dropped when nobody will use it
    /// any more: its last guard went (and no local waiter took it over),
    /// or its acquisition was abandoned.
    fn drop(&mut self) {
        // Reported lost: whoever reported it (the renewal thread,
        // `release_all`) took the lock out of the lease, under the lease's
        // lock, and lets it go, maybe waiting for another process while it
        // keeps that lock. Nothing is left here, and nothing to wait for:
        // a guard dropped as `lost()` fires must not block its thread.
        if self.lease.lost.borrow().is_some() {
            return;
        }
        let Some(released) = self.lease.release_held(false) else {
            return;
        };
        match released {
            Ok(None) => {}
            Ok(Some(reason)) => {
                tracing::debug!(lock = &*self.lease.name, %reason, "released a lock that was no longer ours");
            }
            Err(error) => tracing::warn!(lock = &*self.lease.name, %error, "releasing a lock failed"),
        }
    }
}

/// Every lease a `Locker` (and its clones) armed, for
/// `Locker::release_all`, and the gate every attempt on the store passes.
///
/// Closing it ([`close`](Self::close)) refuses every later attempt
/// ([`enter`](Self::enter)); [`shut_down`](Self::shut_down) then waits for
/// the attempts already under way (one attempt each: bounded by the
/// store), so that a lock one of them takes is on the roll before the
/// roll is read, and releases everything on it.
#[derive(Debug, Default)]
pub(crate) struct Roll {
    state: Mutex<RollState>,
    /// `state.closed`, readable without the lock: every acquisition asks,
    /// and a queued one at every poll. Set under the lock, with it.
    closed: AtomicBool,
    /// Signalled when the last attempt under way ends.
    idle: Condvar,
}

#[derive(Debug, Default)]
struct RollState {
    closed: bool,
    in_flight: usize,
    leases: Vec<Weak<Lease>>,
    /// When to forget the leases that are gone: amortized, at twice the
    /// count left after the last time.
    prune_at: usize,
}

/// An attempt on the store under way; its end is counted when dropped.
#[derive(Debug)]
pub(crate) struct Flight(Arc<Roll>);

/// What `Roll::shut_down` released: each lease it found holding a lock,
/// with what the release said (as `Hold::release` says it).
pub(crate) type ShutDown = Vec<(Arc<Lease>, Result<Option<LossReason>>)>;

impl Roll {
    fn state(&self) -> MutexGuard<'_, RollState> {
        lock(&self.state)
    }

    fn add(&self, lease: &Arc<Lease>) {
        let mut state = self.state();
        if state.leases.len() >= state.prune_at {
            state.leases.retain(|lease| lease.strong_count() > 0);
            state.prune_at = (state.leases.len() * 2).max(64);
        }
        state.leases.push(Arc::downgrade(lease));
    }

    /// Whether the `Locker` was shut down.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The error of an acquisition of `name` after the shut down, if it was.
    pub(crate) fn check(&self, name: &str) -> Result<()> {
        if self.is_closed() {
            return Err(Error::ShutDown {
                name: name.to_owned(),
            });
        }
        Ok(())
    }

    /// Lets an attempt on the store for `name` begin, unless the `Locker`
    /// was shut down.
    pub(crate) fn enter(self: &Arc<Self>, name: &str) -> Result<Flight> {
        let mut state = self.state();
        if state.closed {
            return Err(Error::ShutDown {
                name: name.to_owned(),
            });
        }
        state.in_flight += 1;
        Ok(Flight(Arc::clone(self)))
    }

    /// Refuses every attempt from now on.
    pub(crate) fn close(&self) {
        let mut state = self.state();
        state.closed = true;
        self.closed.store(true, Ordering::Release);
    }

    /// Closes the roll, waits for the attempts under way, and releases
    /// every lock on it. Blocks: for the blocking pool.
    pub(crate) fn shut_down(&self) -> ShutDown {
        let leases = {
            let mut state = self.state();
            state.closed = true;
            self.closed.store(true, Ordering::Release);
            while state.in_flight > 0 {
                state = self.idle.wait(state).unwrap_or_else(|e| e.into_inner());
            }
            // Kept: a second `release_all` at the same time must wait for
            // these releases too (each lease's lock is held while it goes).
            state.leases.clone()
        };
        leases
            .iter()
            .filter_map(Weak::upgrade)
            .filter_map(|lease| lease.shut_down().map(|released| (lease, released)))
            .collect()
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.in_flight -= 1;
        // Only `shut_down` waits, and it closes the roll first, under this
        // lock: an open roll has nobody to wake, and a notification is a
        // system call on every attempt.
        if state.in_flight == 0 && state.closed {
            self.0.idle.notify_all();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks cannot leave the data torn.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `min(renew_interval, lease / 4)`.
fn margin_ms(lease_ms: u64, renew_ms: u64) -> u64 {
    renew_ms.min(lease_ms / 4)
}

impl Lease {
    fn held(&self) -> MutexGuard<'_, Option<StoreLock>> {
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
        self.reported.load(Ordering::Acquire) || sys::boot_clock_ms() >= self.cutoff()
    }

    /// The time until the cutoff by the boot clock, less a millisecond
    /// (the clock's milliseconds are truncated); zero once lost.
    pub(crate) fn left(&self) -> Duration {
        if self.lost.borrow().is_some() {
            return Duration::ZERO;
        }
        let now = sys::boot_clock_ms().saturating_add(1);
        Duration::from_millis(self.cutoff().saturating_sub(now))
    }

    /// Why the lock was lost; a loss not reported yet can only be the
    /// clock reaching the cutoff.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn owner(&self) -> &Owner {
        &self.owner
    }

    pub(crate) fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether its `Locker` is fair (`LockerBuilder::fair`): it keeps an
    /// exclusive lock among its own tasks only while nobody of another
    /// process is seen waiting for it.
    pub(crate) fn fair(&self) -> bool {
        self.fair
    }

    /// A receiver for the loss report.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<LossReason>> {
        self.lost.subscribe()
    }

    /// Releases the lock if the lease still has it, ending renewal: the
    /// one way a lock leaves its lease to be let go, for a hold's
    /// `release` and `Drop` and for [`shut_down`](Self::shut_down). `None`
    /// when the lease had nothing left to release.
    ///
    /// The lease's lock is kept while the store works, so that a
    /// `release_all` running at the same time waits for this release to
    /// be done rather than find nothing and return while the lock still
    /// stands (the renewal thread only tries it, and comes back later).
    fn release_held(&self, confirm: bool) -> Option<Result<Option<LossReason>>> {
        self.let_go(confirm, None)
    }

    /// Releases the lock for `Locker::release_all`: tells the guards
    /// first ([`LossReason::ReleasedAtShutdown`]), then lets the lock go
    /// as a hold's `release` does, waiting for the store's answer. `None`
    /// when the lease held nothing any more (released, or lost, before).
    /// A renewal in flight is waited for: it holds the lease's lock.
    pub(crate) fn shut_down(&self) -> Option<Result<Option<LossReason>>> {
        self.let_go(true, Some(LossReason::ReleasedAtShutdown))
    }

    /// [`release_held`](Self::release_held), telling the guards `reason`
    /// first if one is given: before the lock goes, since someone else
    /// may take it the moment it does.
    fn let_go(&self, confirm: bool, reason: Option<LossReason>) -> Option<Result<Option<LossReason>>> {
        let mut slot = self.held();
        let held = slot.take()?;
        *lock(&self.registration) = None;
        if let Some(reason) = reason {
            self.report(reason);
        }
        Some(held.release(confirm))
    }

    /// Runs `f` on this lease's lock, for an upgrade or a downgrade
    /// (`upgradable.rs`), which may take it to make another kind of
    /// holding of it. Once taken, this lease is over: renewal stops and
    /// its holders hear that the lock was replaced.
    ///
    /// `Error::Lost`, without calling `f`, when the lease is lost: the
    /// renewal thread took the lock out (the holder was frozen, say,
    /// between its last look and this), or the lease is past its cutoff,
    /// after which it is never renewed, so never made into a new holding
    /// either (another process may count it as over).
    pub(crate) fn convert<T>(&self, f: impl FnOnce(&mut Option<StoreLock>) -> Result<T>) -> Result<T> {
        let mut held = self.held();
        if held.is_none() || sys::boot_clock_ms() >= self.cutoff() {
            drop(held);
            return Err(self.lost_error());
        }
        let out = f(&mut held);
        if held.is_none() {
            drop(held);
            *lock(&self.registration) = None;
            self.report(LossReason::Replaced);
        }
        out
    }

    /// Tells the guards (and `is_lost`) that the lock is gone, and why.
    /// The flag is set under the watch's lock, with the reason in place
    /// already: whoever sees the flag and asks for the reason waits for
    /// that lock, never finds the reason missing (which would read as the
    /// lease's end); and the flag is set before the guards awaiting
    /// `lost()` are woken.
    fn report(&self, reason: LossReason) {
        self.lost.send_modify(|lost| {
            *lost = Some(reason);
            self.reported.store(true, Ordering::Release);
        });
    }

    fn loss_reason(&self) -> LossReason {
        self.lost.borrow().clone().unwrap_or(LossReason::LeaseExpired)
    }

    pub(crate) fn lost_error(&self) -> Error {
        Error::Lost {
            name: self.name.to_string(),
            reason: self.loss_reason(),
        }
    }

    /// The next fencing token if it is at hand, in one look (`Ok(None)`
    /// without fencing); `None` when the block reserved is used up and
    /// the next one must come from the store ([`next_token`](Self::next_token)).
    pub(crate) fn token_at_hand(&self) -> Option<Result<Option<u64>>> {
        match lock(&self.tokens).as_mut() {
            None => Some(Ok(None)),
            Some(block) => block.take().map(|token| Ok(Some(token))),
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
    pub(crate) fn verify(&self) -> Result<bool> {
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

    fn lose(&self, slot: &mut MutexGuard<'_, Option<StoreLock>>, reason: LossReason) {
        tracing::warn!(lock = &*self.name, %reason, "lock lost");
        bump(&self.counters.lost);
        // Still ours in the store (say our lease ran out while we were
        // paused, and nobody took it yet)? Then free it for others: before
        // the holder hears of the loss when that takes no waiting (the
        // name's mutation lock free this instant: almost always), so that
        // a holder that exits on the news leaves nothing behind; after,
        // when it would mean waiting on the store, or when the store is
        // failing (renewals failed until the safety margin: its calls may
        // each take a timeout, and the holder must hear within the margin).
        let failing = matches!(reason, LossReason::RenewalFailed { .. });
        let busy = match slot.take() {
            Some(held) if failing => Some(held),
            Some(held) => match held.release_now(false) {
                ReleaseNow::Done(released) => {
                    self.unremoved(released);
                    None
                }
                ReleaseNow::Busy(held) => Some(held),
            },
            None => None,
        };
        self.report(reason);
        if let Some(held) = busy {
            self.unremoved(held.release(false));
        }
    }

    /// Logs a lost lock's failed removal.
    fn unremoved(&self, released: Result<Option<LossReason>>) {
        if let Err(error) = released {
            tracing::debug!(lock = &*self.name, %error, "could not remove a lost lock");
        }
    }
}

impl Renewable for Lease {
    /// One renewal, run on the renewal thread.
    fn renew_once(&self) -> Step {
        let mut slot = match self.held.try_lock() {
            Ok(slot) => slot,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            // Busy reserving fencing tokens (which may wait briefly for the
            // name's mutation lock) or being released: come back shortly rather
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn margin_is_bounded_by_both_settings() {
        assert_eq!(margin_ms(30_000, 10_000), 7_500);
        assert_eq!(margin_ms(30_000, 1_000), 1_000);
    }
}
