//! The contract every backend speaks.
//!
//! A backend is where locks live: files in a lock directory
//! (`fs`) or advisory locks on a PostgreSQL server (`postgres`).
//! Everything above it — the queue, the
//! guard, the lease and its renewal, waiting — is the same for all of them
//! and speaks to a backend only through the traits here: a small core
//! every backend keeps, [`Backend`] for the store as a whole and
//! [`BackendLock`] for one lock it gave out, and a trait for each thing
//! only some backends offer ([`Inline`] attempts, a [`Line`] of waiters
//! across processes, locks [`OnDisk`]). `store` is the one place that
//! dispatches over the backends, and says what a backend without one of
//! those does instead; neither backend imports the other.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use crate::error::{LossReason, Result};
pub(crate) use crate::mode::Mode;
use crate::name::LockName;
use crate::owner::Owner;
use crate::record::OwnRecord;
use crate::stale::StaleReason;

/// What the renewal thread renews (a lease; an exclusive waiter's
/// announcement), as far as the thread knows. Part of the contract: a
/// backend's announcements are renewed this way, so the type lives here and
/// the renewal thread (`renew.rs`) serves it.
pub(crate) trait Renewable: Send + Sync {
    /// Renews once (or finds the lease lost or released) and says when to
    /// come back.
    fn renew_once(&self) -> Step;
}

/// What the renewal thread should do next with a lease.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Renew again after this long.
    Again(Duration),
    /// The lock is released or lost: stop.
    Stop,
}

/// The result of one attempt to take a lock. `K` is what the caller's
/// `arm` made of the lock: the lock with its renewal running.
#[derive(Debug)]
// `Busy` carries the holder's record, owner fields and all; an attempt is
// moved once or twice, on the contended path, where a copy is nothing
// beside the syscalls that made it.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Attempt<K> {
    /// Ours, its renewal armed, with fencing tokens reserved when fencing
    /// is on.
    Acquired(K),
    /// Someone else holds it.
    Busy {
        /// The holder, if it could be read.
        owner: Option<Owner>,
        /// When the lock could next become stale without any event (its
        /// lease runs out, or an unreadable record's grace ends).
        recheck_at: Option<SystemTime>,
        /// Held by shared holders (or semaphore permits): an exclusive
        /// waiter should [announce](Backend::announce) itself, so that no
        /// new ones join ahead of it.
        sharers: bool,
    },
}

/// What a reader finds of one lock.
#[derive(Debug)]
pub(crate) struct Inspection {
    pub(crate) owner: Owner,
    /// Every holder: the owner alone for an exclusive lock, every live
    /// shared holder (or permit holder) otherwise.
    pub(crate) holders: Vec<Owner>,
    /// How it is held.
    pub(crate) mode: Mode,
    /// Why the next attempt would reclaim it; `None` while it is held.
    pub(crate) stale: Option<StaleReason>,
    /// Where it lives, for a backend with paths.
    pub(crate) path: Option<PathBuf>,
}

/// What a renewal found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Renewal {
    Renewed,
    /// The lock is no longer ours, for this reason (the boot clock passed
    /// the cutoff before the renewal could be made: `LeaseExpired`).
    Lost(LossReason),
}

/// A block of fencing tokens reserved in the store, `next..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tokens {
    pub(crate) next: u64,
    pub(crate) last: u64,
}

impl Tokens {
    /// The next unused token, if any is left.
    pub(crate) fn take(&mut self) -> Option<u64> {
        if self.next > self.last {
            return None;
        }
        let token = self.next;
        // At `u64::MAX` the block is simply used up (`next > last` cannot
        // hold then, so `last` is lowered instead of wrapping `next`).
        match self.next.checked_add(1) {
            Some(next) => self.next = next,
            None => self.last = self.next - 1,
        }
        Some(token)
    }
}

/// A lock with its renewal running: what the caller's `arm` makes of a
/// lock the moment the backend has it, so that the lease is kept from the
/// instant the record exists, on whatever thread took it.
pub(crate) trait Kept {
    /// Reserves the first block of fencing tokens. `Ok(false)` when the
    /// lock is no longer ours (or the store is busy): the backend drops the
    /// kept lock, which releases it.
    fn reserve_tokens(&self) -> Result<bool>;
}

/// Whom a backend tells that a lock may have become free (a release, a
/// holder's death), so that the waiter for it tries again at once.
pub(crate) trait Wake: Send + Sync {
    /// The lock whose [`LockName::file_name`] is `key` may be free.
    fn changed(&self, key: &str);
    /// Any lock may be free (events were lost).
    fn all_changed(&self);
}

/// A backend's way to its [`Wake`]: weak, so a backend thread that
/// outlives its `Locker` finds nobody and stops.
pub(crate) type Waiters = Weak<dyn Wake>;

/// How a backend hands a lock it just took to the layers above.
pub(crate) type Arm<'a, L, K> = &'a dyn Fn(L, Option<Tokens>) -> K;

/// A store of named locks.
///
/// Every method may block (syscalls, a server round trip): the engine calls
/// them on the blocking pool ([`Inline::attempt_inline`] is the one
/// attempt made on the caller's thread).
pub(crate) trait Backend {
    /// One lock this backend gave out.
    type Lock: BackendLock;

    /// A short name for logs and spans.
    fn kind(&self) -> &'static str;

    /// One attempt to take `name`. A lock taken is passed to `arm` at once
    /// (with the tokens already reserved for it, if the backend reserves
    /// them together with the lock), before anything else can fail.
    /// `deadline` bounds a backend that may wait on a server.
    fn attempt<K: Kept>(
        &self,
        name: &LockName,
        mode: Mode,
        deadline: Option<Instant>,
        arm: Arm<'_, Self::Lock, K>,
    ) -> Result<Attempt<K>>;

    /// Says in the store that an exclusive acquisition waits for `name`,
    /// which shared holders (or permit holders) hold, so that new ones
    /// queue behind it (writer preference across processes). The
    /// announcement lasts while the returned value lives and is renewed
    /// through it; `None` while another waiter's announcement stands.
    fn announce(&self, name: &LockName) -> Result<Option<Arc<dyn Renewable>>>;

    /// The lock `name` as the store has it, held or stale.
    fn inspect(&self, name: &LockName) -> Result<Option<Inspection>>;

    /// Every lock in the store, held or stale.
    fn list(&self) -> Result<Vec<(LockName, Inspection)>>;

    /// Makes sure a waiter for `name` is woken by events when the lock may
    /// have become free; `false` when it must poll instead.
    fn watch(&self, name: &LockName) -> bool;
}

/// A backend that can often make an attempt without blocking the
/// caller's thread (files: the uncontended create; a join, or a busy
/// group, under a mutation lock that is free).
pub(crate) trait Inline: Backend {
    /// The attempt, made whole without blocking the caller's thread (and
    /// then the same as [`attempt`](Self::attempt)'s), or `None` when
    /// that cannot be done cheaply; then `attempt` on the blocking pool.
    fn attempt_inline<K: Kept>(
        &self,
        name: &LockName,
        mode: Mode,
        arm: Arm<'_, Self::Lock, K>,
    ) -> Result<Option<Attempt<K>>>;
}

/// A backend whose waiters in different processes take turns through a
/// line of its own (files: `fs/line.rs`); a server orders its waiters
/// itself.
pub(crate) trait Line: Backend {
    /// How long a waiter for `name` should keep off the lock before its
    /// next attempt, to let a process that has waited longer go first
    /// (see `fs/line.rs`); `None`: try now. Must not block.
    fn stand_back(&self, name: &LockName, mode: Mode) -> Option<Duration>;

    /// An acquisition of `name` as `mode` found it held and will wait:
    /// it stands in the line of other processes' waiters until
    /// [`stopped_waiting`](Self::stopped_waiting). Called by the waiting
    /// loop itself, never by an attempt (an attempt may finish after its
    /// waiter is gone, and `try_acquire` never waits). Must not block.
    fn wait_in_line(&self, name: &LockName, mode: Mode);

    /// An acquisition of `name` that waited stopped waiting, with the lock
    /// (`acquired`) or without it. Must not block.
    fn stopped_waiting(&self, name: &LockName, acquired: bool);

    /// Whether a new shared acquisition may join the shared hold this
    /// process already has of `name` without asking the store: not while an
    /// exclusive acquisition waits for the name in another process (or the
    /// readers of this one would starve it), and not when the backend cannot
    /// tell cheaply. Must not block: it runs on the caller's thread.
    fn may_join_locally(&self, name: &LockName) -> bool;
}

/// A backend with upgradable shared locks (files; see `fs/upgrade.rs`
/// and `upgradable.rs`): one shared holder at a time may be the
/// upgradable one, and turn its share into the exclusive lock (and back)
/// with no instant at which anyone else could take it.
pub(crate) trait Upgrade: Backend {
    /// One attempt to join the holders of `name` as its upgradable holder:
    /// busy while another holds it so, or a writer holds it or waits.
    fn join_upgradable<K: Kept>(&self, name: &LockName, arm: Arm<'_, Self::Lock, K>) -> Result<Attempt<K>>;

    /// One attempt to turn `share`, this process's upgradable holding of
    /// `name`, into its exclusive lock: busy while other holders remain.
    /// On success `share` is taken (it became the lock handed to `arm`).
    fn upgrade<K: Kept>(
        &self,
        name: &LockName,
        share: &mut Option<Self::Lock>,
        arm: Arm<'_, Self::Lock, K>,
    ) -> Result<Attempt<K>>;

    /// Turns `lock`, this process's exclusive lock of `name`, into its
    /// upgradable shared holding; `None` when the store is busy (try
    /// again). On success `lock` is taken.
    fn downgrade<K: Kept>(
        &self,
        name: &LockName,
        lock: &mut Option<Self::Lock>,
        arm: Arm<'_, Self::Lock, K>,
    ) -> Result<Option<K>>;
}

/// A backend that keeps its locks on disk, where crashed processes leave
/// things behind.
pub(crate) trait OnDisk: Backend {
    /// The lock directory.
    fn directory(&self) -> &Path;

    /// The path of the lock `name`.
    fn lock_path(&self, name: &LockName) -> PathBuf;

    /// Removes stale locks and what crashed processes left behind (or, with
    /// `dry_run`, reports them).
    fn clean(&self, dry_run: bool) -> Result<Vec<(LockName, Inspection)>>;
}

/// One lock a backend gave out. Dropping it releases it without waiting
/// for anything that could block for long, reporting failures through
/// `tracing`.
pub(crate) trait BackendLock: Send {
    /// The record written (or kept) for this holding.
    fn record(&self) -> &OwnRecord;

    /// Extends the lease, unless the boot clock has reached `cutoff`.
    fn renew(&mut self, cutoff: u64) -> Result<Renewal>;

    /// `None` while the lock is still ours; otherwise why it is not.
    fn check(&self) -> Result<Option<LossReason>>;

    /// Reserves the next block of fencing tokens and records the first in
    /// the owner record. `None` if the lock is no longer ours.
    fn reserve_tokens(&mut self) -> Result<Option<Tokens>>;

    /// Releases the lock if it is still ours. `None` when it was ours to
    /// the end; otherwise why it was not. `confirm`: the caller waits for
    /// the whole truth (on a server, the answer; in a directory, also
    /// whether the directory was moved).
    fn release(self, confirm: bool) -> Result<Option<LossReason>>;

    /// [`release`](Self::release), if that can be done at once without
    /// waiting for anyone (to run on the runtime's thread); the lock back
    /// otherwise.
    fn release_now(self, confirm: bool) -> ReleaseNow<Self>
    where
        Self: Sized,
    {
        let _ = confirm;
        ReleaseNow::Busy(self)
    }

    /// Whether a cheap look shows that no other process waits for this
    /// lock right now (files: nobody stands in the line of `fs/line.rs`),
    /// so that passing it on within this process keeps nobody out. `false`
    /// whenever the backend cannot tell. Must not block.
    fn unwaited(&self) -> bool {
        false
    }

    /// Whether a cheap look shows someone of another process waiting for
    /// this lock right now (files: in the line of `fs/line.rs`). `false`
    /// whenever the backend cannot tell. Must not block.
    fn waited(&self) -> bool {
        false
    }
}

/// What [`BackendLock::release_now`] did.
#[derive(Debug)]
pub(crate) enum ReleaseNow<T> {
    /// Released, as [`BackendLock::release`] says.
    Done(Result<Option<LossReason>>),
    /// Releasing would have meant waiting: the lock, still held.
    Busy(T),
}

impl<T> ReleaseNow<T> {
    pub(crate) fn map_busy<U>(self, f: impl FnOnce(T) -> U) -> ReleaseNow<U> {
        match self {
            ReleaseNow::Done(done) => ReleaseNow::Done(done),
            ReleaseNow::Busy(busy) => ReleaseNow::Busy(f(busy)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_block_ending_at_the_top_is_used_up_not_wrapped() {
        let mut block = Tokens {
            next: u64::MAX - 1,
            last: u64::MAX,
        };
        assert_eq!(block.take(), Some(u64::MAX - 1));
        assert_eq!(block.take(), Some(u64::MAX));
        assert_eq!(block.take(), None);
        assert_eq!(block.take(), None);
    }
}
