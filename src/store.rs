//! The one place that dispatches over backends.
//!
//! A closed enum per side of the contract ([`Store`] for
//! [`Backend`] and the traits only some backends offer, [`StoreLock`] for
//! [`BackendLock`]): static dispatch, and the compiler lists every place
//! to touch when a backend is added. What a backend without one of the
//! optional traits does instead is said here, once.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{
    Arm, Attempt, Backend, BackendLock, Inline, Inspection, Kept, Line, Mode, OnDisk, ReleaseNow, Renewable,
    Renewal, Tokens, Upgrade,
};
use crate::error::{LossReason, Result};
use crate::fs::{Fs, FsLock};
use crate::name::LockName;
#[cfg(feature = "postgres")]
use crate::postgres::{Pg, PgLock};
use crate::record::OwnRecord;

/// Where a `Locker`'s locks live. Cheap to clone, for the blocking pool.
#[derive(Debug, Clone)]
pub(crate) enum Store {
    /// Files in a lock directory.
    Fs(Arc<Fs>),
    /// Advisory locks on a PostgreSQL server.
    #[cfg(feature = "postgres")]
    Postgres(Arc<Pg>),
}

/// A lock of either backend.
#[derive(Debug)]
pub(crate) enum StoreLock {
    Fs(FsLock),
    #[cfg(feature = "postgres")]
    Postgres(PgLock),
}

/// `$body` with `$b` bound to the backend (or its lock), whichever it is.
macro_rules! each {
    ($enum:ident, $value:expr, $b:ident => $body:expr) => {
        match $value {
            $enum::Fs($b) => $body,
            #[cfg(feature = "postgres")]
            $enum::Postgres($b) => $body,
        }
    };
}

/// The core of the contract, which every backend keeps.
impl Store {
    pub(crate) fn kind(&self) -> &'static str {
        each!(Store, self, b => b.kind())
    }

    pub(crate) fn attempt<K: Kept>(
        &self,
        name: &LockName,
        mode: Mode,
        deadline: Option<Instant>,
        arm: Arm<'_, StoreLock, K>,
    ) -> Result<Attempt<K>> {
        match self {
            Store::Fs(fs) => fs.attempt(name, mode, deadline, &|lock, tokens| {
                arm(StoreLock::Fs(lock), tokens)
            }),
            #[cfg(feature = "postgres")]
            Store::Postgres(pg) => pg.attempt(name, mode, deadline, &|lock, tokens| {
                arm(StoreLock::Postgres(lock), tokens)
            }),
        }
    }

    pub(crate) fn announce(&self, name: &LockName) -> Result<Option<Arc<dyn Renewable>>> {
        each!(Store, self, b => b.announce(name))
    }

    pub(crate) fn inspect(&self, name: &LockName) -> Result<Option<Inspection>> {
        each!(Store, self, b => b.inspect(name))
    }

    pub(crate) fn list(&self) -> Result<Vec<(LockName, Inspection)>> {
        each!(Store, self, b => b.list())
    }

    pub(crate) fn watch(&self, name: &LockName) -> bool {
        each!(Store, self, b => b.watch(name))
    }
}

/// What only some backends offer, and what the others do instead.
impl Store {
    /// [`Inline::attempt_inline`]; `None` (go to the blocking pool) for a
    /// server, which no attempt reaches without a round trip.
    pub(crate) fn attempt_inline<K: Kept>(
        &self,
        name: &LockName,
        mode: Mode,
        arm: Arm<'_, StoreLock, K>,
    ) -> Result<Option<Attempt<K>>> {
        match self {
            Store::Fs(fs) => fs.attempt_inline(name, mode, &|lock, tokens| arm(StoreLock::Fs(lock), tokens)),
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => Ok(None),
        }
    }

    /// Whether every event that may free an exclusive lock held by one
    /// exclusive holder already reaches this `Locker`'s waiters, so that a
    /// waiter whose attempt begins after this asks misses none of them and
    /// need not look again when it starts to watch. `false` when unsure
    /// (a server's notifications are its own affair).
    pub(crate) fn watching(&self) -> bool {
        match self {
            Store::Fs(fs) => fs.watching(),
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => false,
        }
    }

    /// Whether every attempt of an upgradable acquisition opens a
    /// connection: on a server it starts the upgradable holding's own
    /// session (`postgres.rs`), where a lock directory costs a few syscalls.
    pub(crate) fn upgradable_attempts_connect(&self) -> bool {
        match self {
            Store::Fs(_) => false,
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => true,
        }
    }

    /// [`Line::stand_back`]; a server orders its waiters itself: try now.
    pub(crate) fn stand_back(&self, name: &LockName, mode: Mode) -> Option<Duration> {
        match self {
            Store::Fs(fs) => fs.stand_back(name, mode),
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => None,
        }
    }

    /// [`Line::wait_in_line`]; nothing on a server.
    pub(crate) fn wait_in_line(&self, name: &LockName, mode: Mode) {
        match self {
            Store::Fs(fs) => fs.wait_in_line(name, mode),
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => {}
        }
    }

    /// [`Line::stopped_waiting`]; nothing on a server.
    pub(crate) fn stopped_waiting(&self, name: &LockName, acquired: bool) {
        match self {
            Store::Fs(fs) => fs.stopped_waiting(name, acquired),
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => {}
        }
    }

    /// [`Line::may_join_locally`]; never on a server, which cannot tell
    /// without a round trip whether a writer waits.
    pub(crate) fn may_join_locally(&self, name: &LockName) -> bool {
        match self {
            Store::Fs(fs) => fs.may_join_locally(name),
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => false,
        }
    }

    /// [`OnDisk::directory`]; `None` for a server.
    pub(crate) fn directory(&self) -> Option<&Path> {
        match self {
            Store::Fs(fs) => Some(fs.directory()),
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => None,
        }
    }

    /// [`OnDisk::lock_path`]; `None` for a server.
    pub(crate) fn lock_path(&self, name: &LockName) -> Option<PathBuf> {
        match self {
            Store::Fs(fs) => Some(fs.lock_path(name)),
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => None,
        }
    }

    /// [`OnDisk::clean`]; on a server, which drops a dead session's locks
    /// itself, the owner rows of holders gone for good.
    pub(crate) fn clean(&self, dry_run: bool) -> Result<Vec<(LockName, Inspection)>> {
        match self {
            Store::Fs(fs) => fs.clean(dry_run),
            #[cfg(feature = "postgres")]
            Store::Postgres(pg) => pg.clean(dry_run),
        }
    }
}

impl BackendLock for StoreLock {
    fn record(&self) -> &OwnRecord {
        each!(StoreLock, self, lock => lock.record())
    }

    fn renew(&mut self, cutoff: u64) -> Result<Renewal> {
        each!(StoreLock, self, lock => lock.renew(cutoff))
    }

    fn check(&self) -> Result<Option<LossReason>> {
        each!(StoreLock, self, lock => lock.check())
    }

    fn reserve_tokens(&mut self) -> Result<Option<Tokens>> {
        each!(StoreLock, self, lock => lock.reserve_tokens())
    }

    fn release(self, confirm: bool) -> Result<Option<LossReason>> {
        each!(StoreLock, self, lock => lock.release(confirm))
    }

    fn unwaited(&self) -> bool {
        each!(StoreLock, self, lock => lock.unwaited())
    }

    fn waited(&self) -> bool {
        each!(StoreLock, self, lock => lock.waited())
    }

    fn release_now(self, confirm: bool) -> ReleaseNow<Self> {
        match self {
            StoreLock::Fs(lock) => lock.release_now(confirm).map_busy(StoreLock::Fs),
            #[cfg(feature = "postgres")]
            pg @ StoreLock::Postgres(_) => ReleaseNow::Busy(pg),
        }
    }
}

/// Upgradable shared locks: every backend has them, but for the
/// mismatched pairs below (a lock of one backend given to another), which
/// never happen.
impl Store {
    pub(crate) fn join_upgradable<K: Kept>(
        &self,
        name: &LockName,
        arm: Arm<'_, StoreLock, K>,
    ) -> Result<Attempt<K>> {
        match self {
            Store::Fs(fs) => fs.join_upgradable(name, &|lock, tokens| arm(StoreLock::Fs(lock), tokens)),
            #[cfg(feature = "postgres")]
            Store::Postgres(pg) => {
                pg.join_upgradable(name, &|lock, tokens| arm(StoreLock::Postgres(lock), tokens))
            }
        }
    }

    /// [`Backend::announce`] for the upgrade of `share`: on a server, on
    /// the upgradable holding's own session (see `postgres.rs`).
    pub(crate) fn announce_upgrade(
        &self,
        name: &LockName,
        share: Option<&StoreLock>,
    ) -> Result<Option<Arc<dyn Renewable>>> {
        match (self, share) {
            #[cfg(feature = "postgres")]
            (Store::Postgres(pg), Some(StoreLock::Postgres(share))) => pg.announce_on(share, name),
            _ => self.announce(name),
        }
    }

    /// See [`Upgrade::upgrade`]; `share` is the lock of the upgradable
    /// holding, taken on success.
    pub(crate) fn upgrade<K: Kept>(
        &self,
        name: &LockName,
        share: &mut Option<StoreLock>,
        arm: Arm<'_, StoreLock, K>,
    ) -> Result<Attempt<K>> {
        match (self, share.take()) {
            (Store::Fs(fs), Some(StoreLock::Fs(lock))) => {
                let mut lock = Some(lock);
                let attempt = fs.upgrade(name, &mut lock, &|lock, tokens| arm(StoreLock::Fs(lock), tokens));
                *share = lock.map(StoreLock::Fs);
                attempt
            }
            #[cfg(feature = "postgres")]
            (Store::Postgres(pg), Some(StoreLock::Postgres(lock))) => {
                let mut lock = Some(lock);
                let attempt = pg.upgrade(name, &mut lock, &|lock, tokens| {
                    arm(StoreLock::Postgres(lock), tokens)
                });
                *share = lock.map(StoreLock::Postgres);
                attempt
            }
            (_, other) => {
                *share = other;
                Err(mismatched())
            }
        }
    }

    /// See [`Upgrade::downgrade`].
    pub(crate) fn downgrade<K: Kept>(
        &self,
        name: &LockName,
        lock: &mut Option<StoreLock>,
        arm: Arm<'_, StoreLock, K>,
    ) -> Result<Option<K>> {
        match (self, lock.take()) {
            (Store::Fs(fs), Some(StoreLock::Fs(inner))) => {
                let mut inner = Some(inner);
                let done = fs.downgrade(name, &mut inner, &|lock, tokens| arm(StoreLock::Fs(lock), tokens));
                *lock = inner.map(StoreLock::Fs);
                done
            }
            #[cfg(feature = "postgres")]
            (Store::Postgres(pg), Some(StoreLock::Postgres(inner))) => {
                let mut inner = Some(inner);
                let done = pg.downgrade(name, &mut inner, &|lock, tokens| {
                    arm(StoreLock::Postgres(lock), tokens)
                });
                *lock = inner.map(StoreLock::Postgres);
                done
            }
            (_, other) => {
                *lock = other;
                Err(mismatched())
            }
        }
    }
}

/// A lock given to a backend that did not make it (or none: the lock was
/// lost meanwhile).
fn mismatched() -> crate::error::Error {
    crate::error::Error::Unsupported {
        what: "converting a lock that is no longer held, or that another backend made",
    }
}
