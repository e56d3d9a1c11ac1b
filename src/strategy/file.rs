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
use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;
use nix::unistd::{UnlinkatFlags, unlinkat};

use super::{Ctx, names};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::record::OwnRecord;

/// A lock file this process created. Dropping it removes the file if, and
/// only if, the path still names it.
#[derive(Debug)]
pub(crate) struct FileLock {
    ctx: Arc<Ctx>,
    name: LockName,
    file: File,
    dev: u64,
    ino: u64,
    record: OwnRecord,
    record_len: usize,
    armed: bool,
}

/// Creates the lock file; `None` if the path is taken. Impatient callers
/// (running on the runtime's thread) never sleep here.
pub(super) fn create(ctx: &Arc<Ctx>, name: &LockName, patient: bool) -> Result<Option<FileLock>> {
    let path = || ctx.dir.path_of(name.file_name());
    let flags = OFlag::O_CREAT
        | OFlag::O_EXCL
        | OFlag::O_WRONLY
        | OFlag::O_NOFOLLOW
        | OFlag::O_CLOEXEC
        | OFlag::O_NOCTTY;
    let file = match openat(
        ctx.dir.fd(),
        name.file_name(),
        flags,
        Mode::from_bits_truncate(0o600),
    ) {
        Ok(fd) => File::from(fd),
        Err(Errno::EEXIST) => return Ok(None),
        Err(e) => return Err(Error::errno("create lock file", path(), e)),
    };
    // The flock must be ours before the record is readable, so that a
    // reader who sees a complete record may take a free flock as proof that
    // the holder is gone. Only a reader testing a record older than the
    // grace period can hold it briefly, so a few tries suffice.
    let mut tries = 0;
    loop {
        match file.try_lock() {
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
                let _ = unlinkat(ctx.dir.fd(), name.file_name(), UnlinkatFlags::NoRemoveDir);
                return Err(flock_error(e, path()));
            }
        }
    }
    // Taken after the flock: a file that a reclaimer judged abandoned
    // and removed before our flock has no links left, and is nobody's lock.
    let meta = file
        .metadata()
        .map_err(|e| Error::io("inspect new lock file", path(), e))?;
    if meta.nlink() == 0 {
        return Ok(None);
    }
    let record = ctx.own_record(name);
    let bytes = record.to_bytes(0);
    // Armed from here on: any failure below removes the half-made lock.
    let lock = FileLock {
        ctx: Arc::clone(ctx),
        name: name.clone(),
        file,
        dev: meta.dev(),
        ino: meta.ino(),
        record,
        record_len: bytes.len(),
        armed: true,
    };
    lock.file
        .write_all_at(&bytes, 0)
        .map_err(|e| Error::io("write lock record", path(), e))?;
    if ctx.durable {
        lock.file
            .sync_data()
            .map_err(|e| Error::io("sync lock record", path(), e))?;
    }
    Ok(Some(lock))
}

/// `flock` failing outright (not just contended) means the filesystem
/// cannot do it, which the staleness rules depend on.
fn flock_error(e: std::io::Error, path: std::path::PathBuf) -> Error {
    if e.kind() == std::io::ErrorKind::Unsupported || e.raw_os_error() == Some(Errno::ENOLCK as i32) {
        Error::Unsupported {
            what: "lock files on a filesystem without flock(2)",
        }
    } else {
        Error::io("lock new lock file", path, e)
    }
}

/// Removes the lock file; the caller holds the mutation lock and has
/// checked that the path names the inode it judged.
pub(super) fn unlink(ctx: &Ctx, name: &LockName) -> Result<bool> {
    match unlinkat(ctx.dir.fd(), name.file_name(), UnlinkatFlags::NoRemoveDir) {
        Ok(()) => Ok(true),
        Err(Errno::ENOENT) => Ok(false),
        Err(e) => Err(Error::errno(
            "remove lock file",
            ctx.dir.path_of(name.file_name()),
            e,
        )),
    }
}

impl FileLock {
    pub(crate) fn record(&self) -> &OwnRecord {
        &self.record
    }

    pub(crate) fn parts(&self) -> (&Arc<Ctx>, &LockName, u64, u64) {
        (&self.ctx, &self.name, self.dev, self.ino)
    }

    /// Rewrites the record in place through our descriptor, padded to the
    /// length already on disk so no stale bytes remain.
    pub(crate) fn write_record(&mut self, record: OwnRecord) -> Result<()> {
        let bytes = record.to_bytes(self.record_len);
        self.file.write_all_at(&bytes, 0).map_err(|e| {
            Error::io(
                "rewrite lock record",
                self.ctx.dir.path_of(self.name.file_name()),
                e,
            )
        })?;
        self.record_len = bytes.len();
        self.record = record;
        Ok(())
    }

    pub(crate) fn release(mut self) -> Result<bool> {
        self.armed = false;
        self.remove()
    }

    fn remove(&self) -> Result<bool> {
        let _mutation = self.ctx.dir.mutation_lock()?;
        if !names(&self.ctx, &self.name, self.dev, self.ino)? {
            return Ok(false);
        }
        unlink(&self.ctx, &self.name)
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        if std::mem::take(&mut self.armed) {
            super::log_drop_failure(&self.name, self.remove());
        }
    }
}
