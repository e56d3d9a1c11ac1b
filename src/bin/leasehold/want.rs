//! How `run` holds NAME: exclusive, shared, or one permit of a semaphore;
//! the three kinds take the lock through the same three calls.

use std::time::Duration;

use leasehold::{LockGuard, Locker, Semaphore};

use super::args::RunArgs;

/// How `run` holds NAME.
pub(super) enum Want {
    Exclusive,
    Shared,
    Permit(Semaphore),
}

impl Want {
    pub(super) fn new(args: &RunArgs, locker: &Locker, name: &str) -> Result<Self, leasehold::Error> {
        Ok(match (args.shared, args.permits) {
            (_, Some(permits)) => Want::Permit(locker.semaphore(name, permits)?),
            (true, None) => Want::Shared,
            (false, None) => Want::Exclusive,
        })
    }

    /// Every acquisition below is cancel safe, as the library's are.
    pub(super) async fn try_acquire(
        &self,
        locker: &Locker,
        name: &str,
    ) -> leasehold::Result<Option<LockGuard>> {
        match self {
            Want::Exclusive => locker.try_acquire(name).await,
            Want::Shared => locker.try_acquire_shared(name).await,
            Want::Permit(semaphore) => semaphore.try_acquire().await,
        }
    }

    pub(super) async fn acquire(&self, locker: &Locker, name: &str) -> leasehold::Result<LockGuard> {
        match self {
            Want::Exclusive => locker.acquire(name).await,
            Want::Shared => locker.acquire_shared(name).await,
            Want::Permit(semaphore) => semaphore.acquire().await,
        }
    }

    pub(super) async fn acquire_timeout(
        &self,
        locker: &Locker,
        name: &str,
        wait: Duration,
    ) -> leasehold::Result<LockGuard> {
        match self {
            Want::Exclusive => locker.acquire_timeout(name, wait).await,
            Want::Shared => locker.acquire_shared_timeout(name, wait).await,
            Want::Permit(semaphore) => semaphore.acquire_timeout(wait).await,
        }
    }
}
