//! The one place that dispatches over backends.
//!
//! A closed enum per side of the contract ([`Store`] for
//! [`Backend`], [`StoreLock`] for [`BackendLock`]): static dispatch, and
//! the compiler lists every place to touch when a backend is added.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::backend::Renewable;
use crate::backend::{
    Arm, Attempt, Backend, BackendLock, Inspection, Kept, Mode, ReleaseNow, Renewal, Tokens,
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

impl Backend for Store {
    type Lock = StoreLock;

    fn kind(&self) -> &'static str {
        match self {
            Store::Fs(fs) => fs.kind(),
            #[cfg(feature = "postgres")]
            Store::Postgres(pg) => pg.kind(),
        }
    }

    fn attempt<K: Kept>(
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

    fn attempt_inline<K: Kept>(
        &self,
        name: &LockName,
        mode: Mode,
        arm: Arm<'_, StoreLock, K>,
    ) -> Result<Option<K>> {
        match self {
            Store::Fs(fs) => fs.attempt_inline(name, mode, &|lock, tokens| arm(StoreLock::Fs(lock), tokens)),
            #[cfg(feature = "postgres")]
            Store::Postgres(pg) => {
                pg.attempt_inline(name, mode, &|lock, tokens| arm(StoreLock::Postgres(lock), tokens))
            }
        }
    }

    fn stand_back(&self, name: &LockName, mode: Mode) -> Option<std::time::Duration> {
        match self {
            Store::Fs(fs) => fs.stand_back(name, mode),
            #[cfg(feature = "postgres")]
            Store::Postgres(pg) => pg.stand_back(name, mode),
        }
    }

    fn wait_in_line(&self, name: &LockName, mode: Mode) {
        match self {
            Store::Fs(fs) => fs.wait_in_line(name, mode),
            #[cfg(feature = "postgres")]
            Store::Postgres(pg) => pg.wait_in_line(name, mode),
        }
    }

    fn stopped_waiting(&self, name: &LockName) {
        match self {
            Store::Fs(fs) => fs.stopped_waiting(name),
            #[cfg(feature = "postgres")]
            Store::Postgres(pg) => pg.stopped_waiting(name),
        }
    }

    fn may_join_locally(&self, name: &LockName) -> bool {
        match self {
            Store::Fs(fs) => fs.may_join_locally(name),
            #[cfg(feature = "postgres")]
            Store::Postgres(pg) => pg.may_join_locally(name),
        }
    }

    fn announce(&self, name: &LockName) -> Result<Option<Arc<dyn Renewable>>> {
        match self {
            Store::Fs(fs) => fs.announce(name),
            #[cfg(feature = "postgres")]
            Store::Postgres(pg) => pg.announce(name),
        }
    }

    fn inspect(&self, name: &LockName) -> Result<Option<Inspection>> {
        match self {
            Store::Fs(fs) => fs.inspect(name),
            #[cfg(feature = "postgres")]
            Store::Postgres(pg) => pg.inspect(name),
        }
    }

    fn list(&self) -> Result<Vec<(LockName, Inspection)>> {
        match self {
            Store::Fs(fs) => fs.list(),
            #[cfg(feature = "postgres")]
            Store::Postgres(pg) => pg.list(),
        }
    }

    fn clean(&self, dry_run: bool) -> Result<Vec<(LockName, Inspection)>> {
        match self {
            Store::Fs(fs) => fs.clean(dry_run),
            #[cfg(feature = "postgres")]
            Store::Postgres(pg) => pg.clean(dry_run),
        }
    }

    fn watch(&self, name: &LockName) -> bool {
        match self {
            Store::Fs(fs) => fs.watch(name),
            #[cfg(feature = "postgres")]
            Store::Postgres(pg) => pg.watch(name),
        }
    }

    fn directory(&self) -> Option<&Path> {
        match self {
            Store::Fs(fs) => fs.directory(),
            #[cfg(feature = "postgres")]
            Store::Postgres(pg) => pg.directory(),
        }
    }

    fn lock_path(&self, name: &LockName) -> Option<PathBuf> {
        match self {
            Store::Fs(fs) => fs.lock_path(name),
            #[cfg(feature = "postgres")]
            Store::Postgres(pg) => pg.lock_path(name),
        }
    }
}

impl BackendLock for StoreLock {
    fn record(&self) -> &OwnRecord {
        match self {
            StoreLock::Fs(lock) => lock.record(),
            #[cfg(feature = "postgres")]
            StoreLock::Postgres(lock) => lock.record(),
        }
    }

    fn renew(&mut self, cutoff: u64) -> Result<Renewal> {
        match self {
            StoreLock::Fs(lock) => lock.renew(cutoff),
            #[cfg(feature = "postgres")]
            StoreLock::Postgres(lock) => lock.renew(cutoff),
        }
    }

    fn check(&self) -> Result<Option<LossReason>> {
        match self {
            StoreLock::Fs(lock) => lock.check(),
            #[cfg(feature = "postgres")]
            StoreLock::Postgres(lock) => lock.check(),
        }
    }

    fn reserve_tokens(&mut self) -> Result<Option<Tokens>> {
        match self {
            StoreLock::Fs(lock) => lock.reserve_tokens(),
            #[cfg(feature = "postgres")]
            StoreLock::Postgres(lock) => lock.reserve_tokens(),
        }
    }

    fn release(self, confirm: bool) -> Result<Option<LossReason>> {
        match self {
            StoreLock::Fs(lock) => lock.release(confirm),
            #[cfg(feature = "postgres")]
            StoreLock::Postgres(lock) => lock.release(confirm),
        }
    }

    fn release_now(self, confirm: bool) -> ReleaseNow<Self> {
        match self {
            StoreLock::Fs(lock) => lock.release_now(confirm).map_busy(StoreLock::Fs),
            #[cfg(feature = "postgres")]
            pg @ StoreLock::Postgres(_) => ReleaseNow::Busy(pg),
        }
    }
}
