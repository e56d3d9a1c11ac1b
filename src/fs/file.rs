//! The exclusive-file strategy.
//!
//! A lock is one regular file, `<dir>/<name>.lock`, created with
//! `O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC`, mode 0600. The creator takes
//! `flock(LOCK_EX)` on it *before* writing the record, writes the record in
//! one `pwrite` and (by default) `fdatasync`s it, and keeps the descriptor,
//! and so the `flock`, for as long as it holds the lock.
//!
//! Renewal rewrites the record in place through that descriptor with a
//! record of the same length, then checks that the path still names the
//! same `(dev, ino)`: it can never write into a file someone else created.
//! A reader may see a torn renewal, so a reclaim that relies on the record's
//! content (lease expiry, a foreign owner's pid) re-reads it under the
//! directory's mutation lock and backs off if it changed.

use std::fs::{File, TryLockError};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::time::Duration;

use super::context::Ctx;
use super::syscall::{self, Errno, Open};
use crate::error::{Error, IoResultExt, Result};
use crate::name::LockName;
use crate::record::OwnRecord;

/// Creates the lock file and takes its `flock`, before anything is
/// written; `None` if the path is taken. Returns the file and its
/// identity. Impatient callers (running on the runtime's thread) never
/// sleep here.
pub(super) fn create(ctx: &Ctx, name: &LockName, patient: bool) -> Result<Option<(File, u64, u64)>> {
    let path = || ctx.path_of(name.file_name());
    let file = match syscall::open_at(ctx.dir.fd(), name.file_name(), Open::CreateNew) {
        Ok(file) => file,
        Err(Errno::EEXIST) => return Ok(None),
        Err(e) => return Err(e).context("create lock file", path),
    };
    // The flock must be ours before the record is readable, so that a
    // reader who sees a complete record may take a free flock as proof that
    // the holder is gone. Only a reader testing a record older than the
    // grace period can hold it briefly, so a few tries suffice.
    let mut tries = 0;
    loop {
        let locked = failpoint!("file.create.after_open").map_err(TryLockError::Error);
        match locked.and_then(|()| file.try_lock()) {
            Ok(()) => break,
            Err(TryLockError::WouldBlock) if patient && tries < 50 => {
                tries += 1;
                std::thread::sleep(Duration::from_micros(200));
            }
            // Someone judged our empty file abandoned (a clock far off).
            // We cannot tell whether the path is still ours, so we leave
            // it: empty and without a flock, it is reclaimed after the
            // grace period.
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(TryLockError::Error(e)) => {
                // No flock on this filesystem: then nobody can hold one on
                // our file either, and the path is still ours to remove.
                let _ = syscall::unlink_at(ctx.dir.fd(), name.file_name());
                return Err(flock_error(e, path()));
            }
        }
    }
    // Taken after the flock: a file that a reclaimer judged abandoned
    // and removed before our flock has no links left, and is nobody's lock.
    let meta = failpoint!("file.create.after_flock")
        .and_then(|()| file.metadata())
        .context("inspect new lock file", path)?;
    if meta.nlink() == 0 {
        return Ok(None);
    }
    Ok(Some((file, meta.dev(), meta.ino())))
}

/// `flock` failing outright (not just contended) means the filesystem
/// cannot do it, which the staleness rules depend on.
fn flock_error(e: std::io::Error, path: PathBuf) -> Error {
    if e.kind() == std::io::ErrorKind::Unsupported || e.raw_os_error() == Some(Errno::ENOLCK as i32) {
        Error::Unsupported {
            what: "lock files on a filesystem without flock(2)",
        }
    } else {
        Error::io("lock new lock file", path, e)
    }
}

/// Writes `record` in place through the lock's descriptor, padded to
/// `record_len` (the length already on disk) so no stale bytes remain,
/// and syncs it if `sync`; returns the new length on disk.
pub(super) fn write(
    file: &File,
    record_len: usize,
    record: &OwnRecord,
    sync: bool,
    path: impl Fn() -> PathBuf,
) -> Result<usize> {
    let bytes = record.to_bytes(record_len);
    failpoint!("file.write.before_pwrite")
        .and_then(|()| file.write_all_at(&bytes, 0))
        .context("write lock record", &path)?;
    if sync {
        failpoint!("file.write.before_sync")
            .and_then(|()| file.sync_data())
            .context("sync lock record", &path)?;
    }
    Ok(bytes.len())
}

/// Removes the lock file; the caller holds the mutation lock and has
/// checked that the path names the inode it judged.
pub(super) fn unlink(ctx: &Ctx, name: &LockName) -> Result<bool> {
    let unlinked = failpoint!("file.unlink.before_unlink").map_err(|_| Errno::EIO);
    match unlinked.and_then(|()| syscall::unlink_at(ctx.dir.fd(), name.file_name())) {
        Ok(()) => Ok(true),
        Err(Errno::ENOENT) => Ok(false),
        Err(e) => Err(e).context("remove lock file", || ctx.path_of(name.file_name())),
    }
}
