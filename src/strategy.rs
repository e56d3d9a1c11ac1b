//! On-disk strategies behind one internal contract.
//!
//! A strategy can `try_acquire` (create a lock or report who holds it,
//! reclaiming a stale one on the way), `inspect` a lock, and through the
//! [`Held`] it returns `renew`, `verify` and `release` exactly the lock it
//! created. Dispatch is a closed enum rather than a trait object.

mod file;

use std::sync::Arc;
use std::time::Duration;

use crate::dir::LockDir;
use crate::error::Result;
use crate::name::LockName;
use crate::owner::Owner;
use crate::stale::StaleReason;
use crate::stats::Counters;

pub(crate) use file::FileLock;

/// How locks are laid out on disk.
///
/// # Examples
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// use leasehold::{Locker, Strategy};
///
/// let dir = tempfile::tempdir().unwrap();
/// let locker = Locker::builder()
///     .directory(dir.path())
///     .strategy(Strategy::ExclusiveFile)
///     .build()?;
/// # drop(locker); Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Strategy {
    /// One file per lock, created with `O_CREAT | O_EXCL | O_NOFOLLOW`,
    /// mode 0600, holding the owner record. The holder keeps `flock` on it,
    /// which lets other leasehold processes tell a dead holder at once.
    /// Compatible with the second seed's lock files.
    #[default]
    ExclusiveFile,
}

impl Strategy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Strategy::ExclusiveFile => "exclusive-file",
        }
    }
}

/// What every strategy needs from its `Locker`.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) dir: LockDir,
    pub(crate) strategy: Strategy,
    pub(crate) lease: Duration,
    pub(crate) grace: Duration,
    pub(crate) durable: bool,
    pub(crate) holder_id: String,
    pub(crate) counters: Arc<Counters>,
}

/// The result of one attempt to take a lock.
#[derive(Debug)]
pub(crate) enum Attempt {
    Acquired(Held),
    /// Someone else holds it.
    Busy {
        /// The holder, if the lock file could be read.
        owner: Option<Owner>,
        /// When the lock could next become stale without any event on disk
        /// (its lease runs out, or an unreadable record's grace ends).
        recheck_at: Option<std::time::SystemTime>,
    },
}

/// A lock this process created and still holds. Dropping it releases it
/// (synchronously, reporting failures through `tracing`), so a lock created
/// by an attempt whose caller went away is never orphaned.
#[derive(Debug)]
pub(crate) enum Held {
    File(FileLock),
}

/// What a renewal found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Renewal {
    Renewed,
    /// The lock path no longer names our lock.
    NotOurs(&'static str),
}

/// What a reader finds at a lock path.
#[derive(Debug)]
pub(crate) struct Inspection {
    pub(crate) owner: Owner,
    pub(crate) stale: Option<StaleReason>,
}

impl Ctx {
    pub(crate) fn try_acquire(self: &Arc<Self>, name: &LockName) -> Result<Attempt> {
        match self.strategy {
            Strategy::ExclusiveFile => file::try_acquire(self, name),
        }
    }

    pub(crate) fn inspect(&self, name: &LockName) -> Result<Option<Inspection>> {
        match self.strategy {
            Strategy::ExclusiveFile => file::inspect(self, name),
        }
    }
}

impl Held {
    pub(crate) fn owner(&self) -> Owner {
        match self {
            Held::File(f) => f.owner(),
        }
    }

    /// The boot-clock millisecond at which the lease last written runs out.
    pub(crate) fn lease_deadline_boot_ms(&self) -> u64 {
        match self {
            Held::File(f) => f.lease_deadline_boot_ms(),
        }
    }

    pub(crate) fn renew(&mut self) -> Result<Renewal> {
        match self {
            Held::File(f) => f.renew(),
        }
    }

    /// Removes the lock if, and only if, the path still names it. Returns
    /// whether it did.
    pub(crate) fn release(self) -> Result<bool> {
        match self {
            Held::File(f) => f.release(),
        }
    }
}
