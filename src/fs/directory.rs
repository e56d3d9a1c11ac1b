//! The directory strategy, laid out as velocious's `AdvisoryLockFileBackend`
//! lays it out.
//!
//! A lock is a directory, `<dir>/<name>.lock/`, holding `owner.json`. It is
//! published by filling a private directory, `<name>.lock.pending-XXXXXX`
//! (mode 0700), and renaming it onto the lock path without replacing
//! anything there — not even an empty directory, which a plain `rename(2)`
//! would replace. The holder keeps the directory open with `flock(LOCK_EX)`
//! on it, the liveness signal other leasehold processes read.
//!
//! Renewal writes `owner.json.next` inside the directory it published,
//! through its descriptor, and renames it over `owner.json`, so nobody ever
//! reads a half-written record and a directory that someone else published
//! at the same path is never written into. Release and reclaim first move
//! the whole directory to a private `<name>.lock.trash-XXXX` name, so the
//! lock path never holds an emptied directory that a newcomer's rename
//! could land on; the trash is emptied and removed after.

use crate::sys::syscall::{Flock, WriteAt};
use std::fs::{File, TryLockError};
use std::io;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::context::Ctx;
use super::context::read_record;
use super::dir::LockDir;
use super::mutex::MutationLock;
use crate::error::{Error, IoResultExt, Result};
use crate::name::LockName;
use crate::record::{OwnRecord, unique_bits};
use crate::sys::syscall::{self, Errno, Open};
use crate::sys::{self, RenameError};

const OWNER: &str = "owner.json";
const NEXT: &str = "owner.json.next";

/// A private name's 12 hex digits: unique within this process, random
/// across processes.
fn suffix() -> String {
    format!("{:012x}", unique_bits().1 & 0xffff_ffff_ffff)
}

/// A lock directory this process just published.
pub(super) struct Published {
    /// The directory, flocked.
    pub(super) dir: File,
    /// Its `owner.json`, kept open.
    pub(super) record_file: File,
    pub(super) record: OwnRecord,
    pub(super) dev: u64,
    pub(super) ino: u64,
}

/// Publishes a new lock directory holding a new owner record; `None` if
/// the path is taken.
pub(super) fn create(ctx: &Ctx, name: &LockName) -> Result<Option<Published>> {
    let mut record = None;
    let published = publish(ctx, name, false, &mut || {
        let made = ctx.own_record(name);
        let bytes = made.to_bytes(0);
        record = Some(made);
        bytes
    })?;
    Ok(published.and_then(|(dir, record_file, dev, ino)| {
        Some(Published {
            dir,
            record_file,
            record: record.take()?,
            dev,
            ino,
        })
    }))
}

/// Publishes a lock directory whose `owner.json` holds `bytes` (a shared
/// lock's marker), flocked shared rather than exclusively: every holder
/// of the shared lock holds a share of it. Returns the directory, or
/// `None` if the path is taken.
pub(super) fn publish_bytes(ctx: &Ctx, name: &LockName, bytes: &[u8]) -> Result<Option<File>> {
    Ok(publish(ctx, name, true, &mut || bytes.to_vec())?.map(|(dir, ..)| dir))
}

/// Publishes a new lock directory whose `owner.json` holds what `record`
/// makes (once the pending directory is ours): the directory (flocked),
/// the record file, and the directory's identity; `None` if the path is
/// taken.
fn publish(
    ctx: &Ctx,
    name: &LockName,
    shared: bool,
    record: &mut dyn FnMut() -> Vec<u8>,
) -> Result<Option<(File, File, u64, u64)>> {
    let mut pending = format!("{}.pending-{}", name.file_name(), suffix());
    // Another process's pending directory could have the same name, once
    // in 2^48; then another name is tried, a few times at most.
    let mut tries = 0;
    while let Err(e) = syscall::mkdir_at(ctx.dir.fd(), &pending) {
        tries += 1;
        if e != Errno::EEXIST || tries == 4 {
            return Err(e).context("create pending lock directory", || ctx.path_of(&pending));
        }
        pending = format!("{}.pending-{}", name.file_name(), suffix());
    }
    let path = || ctx.path_of(&pending);
    let mut cleanup = Pending {
        ctx,
        name: &pending,
        armed: true,
    };
    failpoint!("dir.publish.after_mkdir").context("open pending lock directory", path)?;
    let Some(dir) = take_pending(&ctx.dir, &pending, shared)? else {
        return Ok(None);
    };
    let meta = failpoint!("dir.publish.after_flock")
        .and_then(|()| syscall::meta(&dir))
        .context("inspect pending lock directory", path)?;
    let record_file = match write_owner(&dir, OWNER, &record(), ctx.settings.durable) {
        Ok(file) => file,
        // Collected by a sweep between our open and our flock (see
        // `take_pending`): no lock was made.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).context("write lock record", path),
    };
    let renamed = failpoint!("dir.publish.before_rename").map_err(RenameError::Io);
    match renamed.and_then(|()| sys::rename_noreplace(ctx.dir.fd(), &pending, name.file_name())) {
        Ok(()) => {}
        Err(RenameError::Exists) => return Ok(None),
        Err(RenameError::Io(e)) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(RenameError::Unsupported) => {
            return Err(Error::Unsupported {
                what: "the directory strategy on a filesystem without renameat2(RENAME_NOREPLACE); \
                       use Strategy::ExclusiveFile",
            });
        }
        Err(RenameError::Io(e)) => return Err(e).context("publish lock directory", path),
    }
    cleanup.armed = false;
    Ok(Some((dir, record_file, meta.dev(), meta.ino())))
}

/// A lock directory that took the place of another at the lock path
/// ([`replace`]).
pub(super) struct Replaced {
    /// The new lock directory, exclusively flocked, now at the lock path.
    pub(super) published: Published,
    /// The private (trash) name the old lock directory now has; the caller
    /// removes it ([`remove_dir`]) once it is done with it.
    pub(super) old_name: String,
}

/// Replaces the lock directory `old` (identity `old_id`) at the lock path
/// by a new one, made under a private name with our exclusive flock and
/// `record` as its `owner.json`, in one atomic exchange of the two names
/// ([`sys::exchange_at`]): the lock path never names anything but a
/// flocked lock directory with a record. For an upgrade (`fs/upgrade.rs`),
/// under the name's mutation lock. `old` itself is never written: a
/// holder frozen in its unlocked marker signing, which renames its record
/// over `owner.json` through the descriptor of the lock directory it
/// found, renames it into `old` when it runs again (now at a private
/// name, or removed), never into the new lock.
///
/// `None` if it could not be done this time (the pending directory taken
/// by a sweep, or the lock path not naming `old` after all: then the
/// exchange is undone).
pub(super) fn replace(
    ctx: &Ctx,
    name: &LockName,
    old_id: (u64, u64),
    record: OwnRecord,
) -> Result<Option<Replaced>> {
    let pending = format!("{}.pending-{}", name.file_name(), suffix());
    syscall::mkdir_at(ctx.dir.fd(), &pending)
        .context("create pending lock directory", || ctx.path_of(&pending))?;
    let path = || ctx.path_of(&pending);
    let mut cleanup = Pending {
        ctx,
        name: &pending,
        armed: true,
    };
    let Some(dir) = take_pending(&ctx.dir, &pending, false)? else {
        return Ok(None);
    };
    let meta = syscall::meta(&dir).context("inspect pending lock directory", path)?;
    let record_file = match write_owner(&dir, OWNER, &record.to_bytes(0), ctx.settings.durable) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).context("write lock record", path),
    };
    match sys::exchange_at(ctx.dir.fd(), &pending, name.file_name()) {
        Ok(()) => {}
        Err(RenameError::Unsupported) => return Err(Error::Unsupported { what: NO_EXCHANGE }),
        Err(RenameError::Exists) => return Ok(None),
        Err(RenameError::Io(e)) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(RenameError::Io(e)) => return Err(e).context("exchange lock directory", path),
    }
    // Under the mutation lock no cooperating process can have replaced
    // the lock path since the caller checked it; one that ignores the
    // lock can: then put it back, and replace nothing.
    let swapped = syscall::stat_at(ctx.dir.fd(), &pending);
    if !matches!(&swapped, Ok(st) if (st.dev, st.ino) == old_id) {
        if let Err(error) = sys::exchange_at(ctx.dir.fd(), &pending, name.file_name()) {
            cleanup.armed = false;
            tracing::warn!(
                path = %ctx.path_of(&pending).display(),
                ?error,
                "the lock path was replaced behind the directory lock; left what was there under a private name"
            );
        }
        swapped.context("inspect replaced lock directory", path)?;
        return Ok(None);
    }
    cleanup.armed = false;
    drop(cleanup);
    // The old one under a trash name, which a sweep takes as soon as
    // nobody holds it (a pending name is spared while young): if we die
    // before we remove it, it goes at the next sweep.
    let trash = format!("{}.trash-{}", name.file_name(), suffix());
    let old_name = match syscall::rename_at(ctx.dir.fd(), &pending, &trash) {
        Ok(()) => trash,
        Err(error) => {
            tracing::debug!(dir = pending, %error, "could not move a replaced lock directory to the trash");
            pending
        }
    };
    Ok(Some(Replaced {
        published: Published {
            dir,
            record_file,
            record,
            dev: meta.dev(),
            ino: meta.ino(),
        },
        old_name,
    }))
}

/// Why an upgradable lock cannot be had on the directory layout here.
pub(crate) const NO_EXCHANGE: &str = "upgradable locks on the directory layout where there is no atomic exchange of \
     two directories (renameat2(RENAME_EXCHANGE) on Linux with glibc, renameatx_np(RENAME_SWAP) on macOS; \
     not FreeBSD, musl or this filesystem); use Strategy::ExclusiveFile";

/// Opens our new pending directory `pending` and takes its flock (shared
/// for a shared lock's marker), which is ours before the directory can be
/// seen at the lock path; `None` if it is no longer ours to publish.
///
/// A sweep of abandoned pending directories (`clean_dir_leftovers`) may
/// have found it between our `mkdir` and now: it spares one this young
/// without touching it, so only a publisher that stood still in between
/// for `LEFTOVER_SETTLE` or the unreadable grace, whichever is shorter
/// (or whose clock jumped), meets one. Then the sweep may have removed
/// it, or holds its flock while it judges (and maybe removes) it: either
/// way no lock is made here, and the caller looks at the lock path again,
/// with a fresh pending name if it publishes again.
fn take_pending(dir: &LockDir, pending: &str, shared: bool) -> Result<Option<File>> {
    let path = || dir.path_of(pending);
    let node = match syscall::open_at(dir.fd(), pending, Open::Dir) {
        Ok(node) => node,
        Err(Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(e).context("open pending lock directory", path),
    };
    let locked = if shared {
        node.try_flock_shared()
    } else {
        node.try_flock()
    };
    match locked {
        Ok(()) => Ok(Some(node)),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(e)) => Err(e).context("lock pending lock directory", path),
    }
}

/// Writes a record to `file_name` inside `dir`, replacing any old one of
/// that name (only ever our own pending or `.next` file), and returns it
/// still open.
fn write_owner(dir: &File, file_name: &str, bytes: &[u8], durable: bool) -> io::Result<File> {
    let file = syscall::open_at(dir, file_name, Open::Replace)?;
    failpoint!("dir.owner.before_write")?;
    file.write_all_at(bytes, 0)?;
    if durable {
        failpoint!("dir.owner.before_sync")?;
        file.sync_data()?;
    }
    Ok(file)
}

/// Replaces `owner.json` atomically inside the directory we published:
/// written as `owner.json.next` through our descriptor, then renamed.
/// Returns the new record file, kept open (see [`Node::Dir`]).
pub(super) fn rewrite(dir: &File, record: &OwnRecord, path: impl Fn() -> PathBuf) -> Result<File> {
    rewrite_bytes(dir, &record.to_bytes(0), path)
}

/// As [`rewrite`], with the record's bytes.
pub(super) fn rewrite_bytes(dir: &File, bytes: &[u8], path: impl Fn() -> PathBuf) -> Result<File> {
    let path = || path().join(OWNER);
    let next = write_owner(dir, NEXT, bytes, false).context("rewrite lock record", path)?;
    failpoint!("dir.rewrite.before_rename")
        .and_then(|()| Ok(syscall::rename_at(dir, NEXT, OWNER)?))
        .context("rewrite lock record", path)?;
    Ok(next)
}

/// Removes `owner.json` from a lock directory that is no longer ours, to
/// help whoever retired it empty it.
pub(super) fn forget_record(dir: &File) {
    let _ = syscall::unlink_at(dir, OWNER);
}

/// Reads `owner.json` from an open lock directory: its bytes and mtime, or
/// `None` if there is none (or it is not a regular file, which is never
/// followed).
pub(super) fn read_owner(dir: &File) -> io::Result<Option<(Vec<u8>, SystemTime)>> {
    let file = match syscall::open_at(dir, OWNER, Open::Read) {
        Ok(file) => file,
        Err(Errno::ENOENT | Errno::ELOOP | Errno::ENXIO | Errno::EISDIR) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let meta = syscall::meta(&file)?;
    if !meta.is_file() {
        return Ok(None);
    }
    Ok(Some((read_record(&file)?, meta.modified().unwrap_or(UNIX_EPOCH))))
}

/// Whether the lock directory `dir` holds anything but a lock record: an
/// entry other than `owner.json` (and `owner.json.next`, a renewal's), or
/// an `owner.json` that is not a regular file. Neither leasehold nor
/// velocious makes one; a reclaim would empty it. A directory that cannot
/// be listed is left to the other checks.
pub(super) fn holds_other_files(dir: &File) -> bool {
    let Ok(entries) = syscall::list_at(dir) else {
        return false;
    };
    if entries.iter().any(|e| e != OWNER && e != NEXT) {
        return true;
    }
    matches!(syscall::stat_at(dir, OWNER), Ok(st) if st.kind != syscall::Kind::File)
}

/// Moves the lock directory at the lock path to a private trash name and
/// empties it. The caller holds the mutation lock (released here once the
/// lock path is free, after `then` ran) and has checked that the path
/// names `node`.
pub(super) fn retire(
    ctx: &Ctx,
    name: &LockName,
    node: &File,
    mutation: MutationLock<'_>,
    then: &dyn Fn(),
) -> Result<bool> {
    let trash = format!("{}.trash-{}", name.file_name(), suffix());
    let renamed = failpoint!("dir.retire.before_rename").map_err(|_| Errno::EIO);
    match renamed.and_then(|()| syscall::rename_at(ctx.dir.fd(), name.file_name(), &trash)) {
        Ok(()) => {}
        Err(Errno::ENOENT) => return Ok(false),
        Err(e) => return Err(e).context("move lock directory away", || ctx.path_of(name.file_name())),
    }
    // Under the directory lock no cooperating process can have replaced
    // the path since the caller checked it; a process that ignores the
    // lock can. What was moved is then not what was judged: put it back
    // (if the path is still free) and remove nothing.
    let moved = failpoint!("dir.retire.after_rename")
        .map_err(|_| Errno::EIO)
        .and_then(|()| syscall::stat_at(ctx.dir.fd(), &trash));
    let judged = syscall::meta(node);
    let same =
        matches!((&moved, &judged), (Ok(st), Ok(meta)) if st.dev == meta.dev() && st.ino == meta.ino());
    if !same {
        if sys::rename_noreplace(ctx.dir.fd(), &trash, name.file_name()).is_err() {
            tracing::warn!(
                path = %ctx.path_of(&trash).display(),
                "the lock path was replaced behind the directory lock; left what was there in the trash"
            );
        }
        // Not being able to tell is no replacement: report the failure
        // (put back all the same, in case it was not what we judged).
        moved.context("inspect retired lock directory", || ctx.path_of(&trash))?;
        judged.context("inspect lock directory", || ctx.path_of(name.file_name()))?;
        return Ok(false);
    }
    then();
    drop(mutation);
    remove_dir(ctx, &trash, node);
    Ok(true)
}

/// Empties and removes the directory `dir_name`, opened as `node`.
/// Best effort: a holder that has not yet noticed it lost the lock may
/// still rename a renewal into it, hence the retries; what cannot be
/// removed is logged.
pub(super) fn remove_dir(ctx: &Ctx, dir_name: &str, node: &File) {
    // Usually the record is all there is: try without listing first.
    let _ = syscall::unlink_at(node, OWNER);
    let removed = failpoint!("dir.remove.after_unlink_owner").map_err(|_| Errno::EIO);
    if let Ok(()) | Err(Errno::ENOENT) = removed.and_then(|()| syscall::rmdir_at(ctx.dir.fd(), dir_name)) {
        return;
    }
    for attempt in 0..5 {
        if let Err(error) = empty(node) {
            tracing::debug!(dir = dir_name, %error, "emptying a lock directory failed");
        }
        match syscall::rmdir_at(ctx.dir.fd(), dir_name) {
            Ok(()) | Err(Errno::ENOENT) => return,
            Err(Errno::ENOTEMPTY | Errno::EEXIST) if attempt < 4 => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => {
                tracing::warn!(
                    path = %ctx.path_of(dir_name).display(),
                    error = %e,
                    "could not remove a retired lock directory"
                );
                return;
            }
        }
    }
}

/// Unlinks every non-directory entry of `node`; subdirectories, which
/// leasehold never creates, are left alone.
fn empty(node: &File) -> io::Result<()> {
    for name in syscall::list_at(node)? {
        match syscall::unlink_at(node, name.as_os_str()) {
            Ok(()) | Err(Errno::ENOENT | Errno::EISDIR | Errno::EPERM) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Removes a pending directory that was never published.
struct Pending<'a> {
    ctx: &'a Ctx,
    name: &'a str,
    armed: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Usually still empty: removed without a descriptor, which matters
        // when the attempt failed for want of descriptors (EMFILE).
        if let Ok(()) | Err(Errno::ENOENT) = syscall::rmdir_at(self.ctx.dir.fd(), self.name) {
            return;
        }
        match syscall::open_at(self.ctx.dir.fd(), self.name, Open::Dir) {
            Ok(node) => remove_dir(self.ctx, self.name, &node),
            Err(error) => {
                tracing::warn!(dir = self.name, %error, "could not remove a pending lock directory")
            }
        }
    }
}

// The directory layout: Windows refuses it (a directory cannot carry the
// liveness mark there; `LockFileEx` fails on a directory handle).
#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// A pending directory whose flock a sweep holds (while it judges it),
    /// or that a sweep removed, is no lock and no error: the publisher
    /// gives it up and looks at the lock path again.
    #[test]
    fn a_pending_directory_a_sweep_holds_or_removed_is_given_up() {
        let root = tempfile::tempdir().unwrap();
        let dir = LockDir::open(root.path(), false).unwrap();
        let pending = "job.lock.pending-0123456789ab";
        syscall::mkdir_at(dir.fd(), pending).unwrap();
        // The sweep's flock, on a descriptor of its own.
        let sweep = File::open(root.path().join(pending)).unwrap();
        sweep.lock().unwrap();
        for shared in [false, true] {
            assert!(
                take_pending(&dir, pending, shared).unwrap().is_none(),
                "shared: {shared}"
            );
        }
        drop(sweep);
        // Free again: ours, and a sweep now finds it busy.
        let ours = take_pending(&dir, pending, false).unwrap().expect("free");
        let sweep = File::open(root.path().join(pending)).unwrap();
        assert!(matches!(sweep.try_flock(), Err(TryLockError::WouldBlock)));
        drop((ours, sweep));
        // Removed by a sweep before our open.
        std::fs::remove_dir(root.path().join(pending)).unwrap();
        assert!(take_pending(&dir, pending, false).unwrap().is_none());
    }
}
