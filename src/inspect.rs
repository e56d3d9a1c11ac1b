//! What a [`Locker`] can tell about the locks in its store, for
//! diagnostics: who holds a name, every lock and whether it is stale, and
//! cleaning up what is stale. Reads and cleans go through the backend
//! contract on the blocking pool.

use crate::backend::Inspection;
use crate::error::Result;
use crate::locker::Locker;
use crate::name::LockName;
use crate::owner::{LockInfo, LockKind, Owner};
use crate::pool::blocking;

impl Locker {
    /// Who holds `name` now, or `None` if nobody does (no lock, or a stale
    /// one that the next `acquire` would reclaim).
    ///
    /// A record that is still being written is held, with an [`Owner`] whose
    /// fields are all `None`.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// assert!(locker.holder("reindex").await?.is_none());
    /// let _guard = locker.acquire("reindex").await?;
    /// let owner = locker.holder("reindex").await?.unwrap();
    /// assert_eq!(owner.pid(), Some(std::process::id()));
    /// # Ok(()) }
    /// ```
    pub async fn holder(&self, name: &str) -> Result<Option<Owner>> {
        let name = LockName::new(name, self.engine.path_style)?;
        let inspection = self.lookup(Some(name)).await?.pop();
        Ok(inspection
            .filter(|(_, i)| i.stale.is_none())
            .map(|(_, i)| i.owner))
    }

    /// Every live holder of `name`: the one exclusive holder, or every
    /// shared holder (every permit holder of a semaphore), oldest first.
    /// Empty when nobody holds it.
    ///
    /// # Errors
    ///
    /// As [`holder`](Self::holder).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let one = leasehold::Locker::new(dir.path())?;
    /// let two = leasehold::Locker::new(dir.path())?;
    /// let _a = one.acquire_shared("catalog").await?;
    /// let _b = two.acquire_shared("catalog").await?;
    /// let holders = one.holders("catalog").await?;
    /// assert_eq!(holders.len(), 2);
    /// assert!(holders.iter().all(|h| h.pid() == Some(std::process::id())));
    /// # Ok(()) }
    /// ```
    pub async fn holders(&self, name: &str) -> Result<Vec<Owner>> {
        let name = LockName::new(name, self.engine.path_style)?;
        let inspection = self.lookup(Some(name)).await?.pop();
        Ok(inspection
            .filter(|(_, i)| i.stale.is_none())
            .map(|(_, i)| i.holders)
            .unwrap_or_default())
    }

    /// One lock (or, with `None`, every lock) as the store has it.
    async fn lookup(&self, name: Option<LockName>) -> Result<Vec<(LockName, Inspection)>> {
        let store = self.engine.store.clone();
        blocking(move || match name {
            Some(name) => Ok(store.inspect(&name)?.map(|i| (name, i)).into_iter().collect()),
            None => store.list(),
        })
        .await?
    }

    /// The lock `name` as found on disk, held or stale, or `None` if there
    /// is none. Unlike [`holder`](Self::holder), a stale lock is returned,
    /// with the reason the next `acquire` would reclaim it.
    ///
    /// # Errors
    ///
    /// As [`holder`](Self::holder).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// std::fs::write(locker.lock_path("job")?, r#"{"uuid":"x","pid":999999999}"#).unwrap();
    /// let info = locker.inspect("job").await?.expect("a lock file is there");
    /// assert_eq!(info.stale_reason(), Some(leasehold::StaleReason::DeadOwner));
    /// assert!(locker.holder("job").await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let name = LockName::new(name, self.engine.path_style)?;
        let found = self.lookup(Some(name)).await?;
        Ok(self.infos(found).pop())
    }

    /// Every lock in the directory (of this `Locker`'s strategy), with its
    /// owner and whether it is stale, for diagnostics. Temporary and trash
    /// entries, fencing counters, locks of the other strategy, and files
    /// of data whose names end in `.lock` (content no lock writer produces,
    /// such as a `Cargo.lock` or a pid file; see
    /// [`Error::UnexpectedFile`](crate::Error::UnexpectedFile)) are left
    /// out.
    ///
    /// # Errors
    ///
    /// I/O and permission errors from reading the directory or a record.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _a = locker.acquire("a").await?;
    /// let _b = locker.acquire("b").await?;
    /// let names: Vec<String> = locker.list().await?.iter().map(|l| l.name().to_owned()).collect();
    /// assert_eq!(names.len(), 2);
    /// assert!(names.contains(&"a".to_owned()) && names.contains(&"b".to_owned()));
    /// # Ok(()) }
    /// ```
    pub async fn list(&self) -> Result<Vec<LockInfo>> {
        let locks = self.lookup(None).await?;
        Ok(self.infos(locks))
    }

    /// Removes every stale lock in the directory, and what crashed
    /// processes left behind, returning what was removed (or, with
    /// `dry_run`, what would be). Live locks are never touched: each lock
    /// is judged, and reclaimed, exactly as an `acquire` would. What holds
    /// no lock (a file of data whose name ends in `.lock`) is not a lock,
    /// and never removed.
    ///
    /// # Errors
    ///
    /// I/O and permission errors from reading the directory or removing an
    /// entry.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future lets the cleaning finish on the blocking pool.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _live = locker.acquire("live").await?;
    /// // A lock whose owner process is gone.
    /// std::fs::write(locker.lock_path("crashed")?, r#"{"uuid":"x","pid":999999999}"#).unwrap();
    /// let removed = locker.clean(false).await?;
    /// assert_eq!(removed.len(), 1);
    /// assert_eq!(removed[0].stale_reason(), Some(leasehold::StaleReason::DeadOwner));
    /// assert!(locker.is_held("live").await?);
    /// # Ok(()) }
    /// ```
    pub async fn clean(&self, dry_run: bool) -> Result<Vec<LockInfo>> {
        let store = self.engine.store.clone();
        let cleaned = blocking(move || store.clean(dry_run)).await??;
        Ok(self.infos(cleaned))
    }

    fn infos(&self, locks: Vec<(LockName, Inspection)>) -> Vec<LockInfo> {
        locks
            .into_iter()
            .map(|(name, inspection)| {
                let display = inspection.owner.name().unwrap_or(name.as_str()).to_owned();
                LockInfo::new(inspection.path, display, inspection.owner, inspection.stale)
                    .with_holders(LockKind::from_mode(inspection.mode), inspection.holders)
            })
            .collect()
    }

    /// Whether a live holder has `name` now. The answer may be out of date
    /// as soon as it is returned; use it for diagnostics, not to decide
    /// whether to acquire.
    ///
    /// # Errors
    ///
    /// As [`holder`](Self::holder).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// assert!(!locker.is_held("reindex").await?);
    /// # Ok(()) }
    /// ```
    pub async fn is_held(&self, name: &str) -> Result<bool> {
        Ok(self.holder(name).await?.is_some())
    }
}
