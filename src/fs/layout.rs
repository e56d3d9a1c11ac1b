//! The two ways a lock can be laid out on disk, the typed front of the
//! filesystem backend's sub-dispatch: [`file`](super::file) and
//! [`directory`](super::directory) implement them.

use crate::sys::syscall::Kind;

/// How locks are laid out on disk.
///
/// Processes that share a lock must use the same strategy (and
/// [`PathStyle`](crate::PathStyle)): a directory-strategy `Locker` that finds a plain file at
/// a lock's path reports [`Error::UnexpectedFile`](crate::Error::UnexpectedFile), and the reverse.
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
///     .strategy(Strategy::Directory)
///     .build()?;
/// # drop(locker); Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Strategy {
    /// One file per lock, created with `O_CREAT | O_EXCL | O_NOFOLLOW`,
    /// mode 0600, holding the owner record. The holder keeps `flock` on it,
    /// which lets other leasehold processes tell a dead holder at once.
    /// Compatible with the lock files of pi-research's `FileLockService`.
    #[default]
    ExclusiveFile,
    /// One directory per lock holding `owner.json`, published by renaming a
    /// fully written private directory onto the lock path, so nobody ever
    /// sees a half-written record; renewal replaces `owner.json` atomically.
    /// Compatible with the lock directories of velocious's
    /// `AdvisoryLockFileBackend`. On Linux it needs
    /// a filesystem with `renameat2(RENAME_NOREPLACE)` (ext4, xfs, btrfs,
    /// tmpfs, ...); elsewhere [`Error::Unsupported`](crate::Error::Unsupported) is returned.
    Directory,
}

impl Strategy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Strategy::ExclusiveFile => "exclusive-file",
            Strategy::Directory => "directory",
        }
    }

    /// What this strategy creates at a lock path.
    pub(crate) fn expected_kind(self) -> Kind {
        match self {
            Strategy::ExclusiveFile => Kind::File,
            Strategy::Directory => Kind::Dir,
        }
    }
}
