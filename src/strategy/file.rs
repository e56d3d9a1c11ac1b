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

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;
use nix::unistd::{UnlinkatFlags, unlinkat};

use super::{Ctx, Renewal, names};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::record::OwnRecord;
use crate::sys;

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

/// Creates the lock file; `None` if the path is taken.
pub(super) fn create(ctx: &Arc<Ctx>, name: &LockName) -> Result<Option<FileLock>> {
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
    let meta = file
        .metadata()
        .map_err(|e| Error::io("inspect new lock file", path(), e))?;
    let record = ctx.own_record();
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
    // The flock must be ours before the record is readable, so that a
    // reader who sees a complete record may take a free flock as proof that
    // the holder is gone. Only a reader testing a record older than the
    // grace period can hold it briefly, so a few tries suffice.
    let mut tries = 0;
    while lock.file.try_lock().is_err() {
        tries += 1;
        if tries == 50 {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
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

    pub(crate) fn renew(&mut self) -> Result<Renewal> {
        let mut record = self.record.clone();
        record.renew(SystemTime::now(), sys::boot_clock_ms());
        let bytes = record.to_bytes(self.record_len);
        self.file
            .write_all_at(&bytes, 0)
            .map_err(|e| Error::io("renew lease in", self.ctx.dir.path_of(self.name.file_name()), e))?;
        self.record_len = bytes.len();
        self.record = record;
        if names(&self.ctx, &self.name, self.dev, self.ino)? {
            Ok(Renewal::Renewed)
        } else {
            Ok(Renewal::NotOurs("the lock file was removed or replaced"))
        }
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
        if !self.armed {
            return;
        }
        self.armed = false;
        if let Err(error) = self.remove() {
            tracing::warn!(
                lock = self.name.as_str(),
                %error,
                "releasing a dropped lock failed; it stays until it is judged stale"
            );
        }
    }
}
