//! The exclusive-file strategy.
//!
//! A lock is one regular file, `<dir>/<name>.lock`, mode 0600. It appears
//! at the lock path whole: the creator makes it under a private name in
//! the lock directory, `<name>.lock.pending-<12 hex>` (`O_CREAT | O_EXCL |
//! O_NOFOLLOW | O_CLOEXEC`), takes `flock(LOCK_EX)` on it, writes the
//! record in one `pwrite` and (by default) `fdatasync`s it, then renames
//! it onto the lock path with `renameat2(RENAME_NOREPLACE)`, which fails
//! with `EEXIST` if the path is taken (where there is none: `link`s it to
//! the lock path, which fails alike, and removes the private name). So a
//! leasehold lock file is never seen
//! without its record and its flock, and a creator that dies at any
//! instant leaves either nothing at the lock path or a record whose flock
//! is free, taken over at once. What it leaves under the private name is
//! collected as a leftover once its flock is free. It keeps the
//! descriptor, and so the `flock`, for as long as it holds the lock.
//!
//! Where the filesystem can do neither (some FUSE and FAT filesystems), the
//! file is created at the lock path itself and flocked before anything
//! is written; a creator that dies before writing then leaves an empty
//! file, taken over after the grace period.
//!
//! Renewal rewrites the record in place through that descriptor with a
//! record of the same length, then checks that the path still names the
//! same `(dev, ino)`: it can never write into a file someone else created.
//! A reader may see a torn renewal, so a reclaim that relies on the record's
//! content (lease expiry, a foreign owner's pid) re-reads it under the
//! directory's mutation lock and backs off if it changed.

use crate::sys::syscall::{Flock, WriteAt};
use std::fs::{File, TryLockError};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::context::Ctx;
use crate::error::{Error, IoResultExt, Result};
use crate::name::LockName;
use crate::record::{OwnRecord, unique_bits};
use crate::sys::syscall::{self, Errno, Open};
use crate::sys::{self, RenameError};

/// How the creator holds a new lock file's flock: exclusively (a lock),
/// or shared (a shared lock's marker, which every holder shares).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hold {
    Exclusive,
    Shared,
}

/// A lock file this process just made at the lock path: flocked, its
/// record written.
#[derive(Debug)]
pub(super) struct Made {
    pub(super) file: File,
    /// The same file opened by the lock path's name, where it was made by
    /// `link` (see [`link`]).
    pub(super) named: Option<File>,
    pub(super) dev: u64,
    pub(super) ino: u64,
    /// The length of the record on disk.
    pub(super) len: usize,
}

/// The private name of a lock file being made: `<lock>.pending-<12 hex>`,
/// unique within this process, random across processes. No lock's file
/// name has this shape in any path style (see `name.rs`), and the sweep
/// removes one whose maker is gone (`leftover.rs`).
pub(super) fn pending_name(name: &LockName) -> String {
    format!(
        "{}.pending-{:012x}",
        name.file_name(),
        unique_bits().1 & 0xffff_ffff_ffff
    )
}

/// Makes the lock file of `name` holding `bytes` (synced if durable), its
/// flock held as `hold` before anything is written; `None` if the path
/// is taken. Impatient callers (running on the runtime's thread) never
/// sleep here.
pub(super) fn create(
    ctx: &Ctx,
    name: &LockName,
    hold: Hold,
    patient: bool,
    bytes: &[u8],
) -> Result<Option<Made>> {
    if ctx.no_link.load(Ordering::Relaxed) {
        return create_in_place(ctx, name, hold, patient, bytes);
    }
    // Taken: no need to make a file only to find it out.
    match syscall::stat_at(ctx.dir.fd(), name.file_name()) {
        Ok(_) => return Ok(None),
        Err(Errno::ENOENT) => {}
        Err(e) => return Err(e).context("look at lock path", || ctx.path_of(name.file_name())),
    }
    let mut pending = Pending {
        ctx,
        name: pending_name(name),
        armed: false,
    };
    let mut tries = 0;
    let file = loop {
        match syscall::open_at(ctx.dir.fd(), pending.name.as_str(), Open::CreateNew) {
            Ok(file) => break file,
            // Another process's private name, once in 2^48.
            Err(Errno::EEXIST) if tries < 4 => {
                tries += 1;
                pending.name = pending_name(name);
            }
            Err(e) => return Err(e).context("create lock file", || ctx.path_of(&pending.name)),
        }
    };
    pending.armed = true;
    let path = || ctx.path_of(&pending.name);
    // Only a sweep of leftovers can hold the flock of a private name, and
    // only of one left this young for `LEFTOVER_SETTLE` (a creator that
    // stood still that long): then it may remove it, and it is no lock of
    // ours to make.
    let meta = match lock_new(&file, hold, patient, path)? {
        Locked::Held(meta) => meta,
        Locked::Lost => {
            pending.armed = false;
            return Ok(None);
        }
        Locked::Failed(e) => return Err(e),
    };
    write_bytes(&file, bytes, ctx.settings.durable, path)?;
    failpoint!("file.create.before_publish").context("create lock file", || ctx.path_of(name.file_name()))?;
    let named = match sys::rename_exclusive(ctx.dir.fd(), &pending.name, name.file_name()) {
        Ok(()) => {
            pending.armed = false;
            None
        }
        Err(RenameError::Exists) => return Ok(None),
        Err(RenameError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            pending.armed = false;
            return Ok(None);
        }
        Err(RenameError::Io(e)) => {
            return Err(e).context("create lock file", || ctx.path_of(name.file_name()));
        }
        Err(RenameError::Unsupported) => match link(ctx, name, &pending, &meta)? {
            Linked::Yes(named) => named,
            Linked::Taken => return Ok(None),
            Linked::Unsupported => {
                drop(pending);
                return create_in_place(ctx, name, hold, patient, bytes);
            }
        },
    };
    // Ours now. A private name linked to it is removed as `pending` drops,
    // or collected as a leftover if this process dies first (once its
    // flock is free).
    let _ = failpoint!("file.create.after_publish");
    Ok(Some(Made {
        file,
        named,
        dev: meta.dev(),
        ino: meta.ino(),
        len: bytes.len(),
    }))
}

/// What [`link`] made of the lock path.
enum Linked {
    /// Ours, and the lock file opened by its own name, if it could be.
    Yes(Option<File>),
    Taken,
    Unsupported,
}

/// Links the private name `pending` (the file `meta`) to the lock path,
/// where `rename` cannot refuse to replace: `link(2)` fails if the path
/// exists. Then opens the lock by its own name too: a close is reported to
/// inotify watchers under the name a file was opened by, and waiters wake
/// on the close of the lock path when this process dies.
fn link(ctx: &Ctx, name: &LockName, pending: &Pending<'_>, meta: &syscall::Meta) -> Result<Linked> {
    match syscall::link_at(ctx.dir.fd(), &pending.name, name.file_name()) {
        Ok(()) => {}
        Err(Errno::EEXIST | Errno::ENOENT) => return Ok(Linked::Taken),
        Err(Errno::EPERM | Errno::EOPNOTSUPP | Errno::ENOSYS) => {
            ctx.no_link.store(true, Ordering::Relaxed);
            tracing::debug!(
                directory = %ctx.dir.path().display(),
                "link(2) is not supported here; lock files are made in place"
            );
            return Ok(Linked::Unsupported);
        }
        Err(e) => return Err(e).context("create lock file", || ctx.path_of(name.file_name())),
    }
    let named = syscall::open_at(ctx.dir.fd(), name.file_name(), Open::Write).ok();
    let same = |f: &File| syscall::meta(f).is_ok_and(|m| (m.dev(), m.ino()) == (meta.dev(), meta.ino()));
    Ok(Linked::Yes(named.filter(same)))
}

/// A private name to remove when dropped, unless disarmed.
struct Pending<'a> {
    ctx: &'a Ctx,
    name: String,
    armed: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = syscall::unlink_at(self.ctx.dir.fd(), self.name.as_str());
        }
    }
}

/// What taking the flock of a file just made came to.
enum Locked {
    /// Ours, with its identity.
    Held(syscall::Meta),
    /// Someone else holds the flock (only a reader testing an abandoned
    /// file can, briefly: `patient` callers try a few times), or the file
    /// was removed before we held it.
    Lost,
    /// The flock itself failed: nobody holds one on the file.
    Failed(Error),
}

/// Takes the flock of a file just made, as `hold`. Fails only when its
/// `fstat` does, after the flock.
fn lock_new(file: &File, hold: Hold, patient: bool, path: impl Fn() -> PathBuf) -> Result<Locked> {
    let mut tries = 0;
    loop {
        let locked = failpoint!("file.create.after_open").map_err(TryLockError::Error);
        let locked = locked.and_then(|()| match hold {
            Hold::Exclusive => file.try_flock(),
            Hold::Shared => file.try_flock_shared(),
        });
        match locked {
            Ok(()) => break,
            Err(TryLockError::WouldBlock) if patient && tries < 50 => {
                tries += 1;
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(TryLockError::WouldBlock) => return Ok(Locked::Lost),
            Err(TryLockError::Error(e)) => return Ok(Locked::Failed(flock_error(e, path()))),
        }
    }
    // Taken after the flock: a file that was judged abandoned and removed
    // before our flock has no links left, and is nobody's lock.
    let meta = failpoint!("file.create.after_flock")
        .and_then(|()| syscall::meta(file))
        .context("inspect new lock file", path)?;
    Ok(match meta.nlink() {
        0 => Locked::Lost,
        _ => Locked::Held(meta),
    })
}

/// [`create`] where `link` is not supported: the file is made at the lock
/// path and flocked before anything is written, so a creator that dies
/// before its write leaves an empty file (taken over after the grace
/// period).
fn create_in_place(
    ctx: &Ctx,
    name: &LockName,
    hold: Hold,
    patient: bool,
    bytes: &[u8],
) -> Result<Option<Made>> {
    let path = || ctx.path_of(name.file_name());
    let file = match syscall::open_at(ctx.dir.fd(), name.file_name(), Open::CreateNew) {
        Ok(file) => file,
        Err(Errno::EEXIST) => return Ok(None),
        Err(e) => return Err(e).context("create lock file", path),
    };
    // The flock must be ours before the record is readable, so that a
    // reader who sees a complete record may take a free flock as proof that
    // the holder is gone.
    let meta = match lock_new(&file, hold, patient, path)? {
        Locked::Held(meta) => meta,
        // Someone judged our empty file abandoned (a clock far off), or
        // removed it. We cannot tell whether the path is still ours, so
        // we leave it: empty and without a flock, it is reclaimed after
        // the grace period.
        Locked::Lost => return Ok(None),
        Locked::Failed(e) => {
            // No flock: then nobody can hold one on our file either, and
            // the path is still ours to remove.
            let _ = syscall::unlink_at(ctx.dir.fd(), name.file_name());
            return Err(e);
        }
    };
    if let Err(e) = write_bytes(&file, bytes, ctx.settings.durable, path) {
        // Flocked by us, the path still names it: ours to remove.
        if ctx.names(name, meta.dev(), meta.ino()).unwrap_or(false) {
            let _ = syscall::unlink_at(ctx.dir.fd(), name.file_name());
        }
        return Err(e);
    }
    Ok(Some(Made {
        file,
        named: None,
        dev: meta.dev(),
        ino: meta.ino(),
        len: bytes.len(),
    }))
}

/// `flock` failing outright (not just contended) means the filesystem
/// cannot do it, which the staleness rules depend on.
fn flock_error(e: std::io::Error, path: PathBuf) -> Error {
    if syscall::flock_unsupported(&e) {
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
    write_bytes(file, &bytes, sync, path)?;
    Ok(bytes.len())
}

/// Writes `bytes` at the start of `file`, and syncs them if `sync`.
fn write_bytes(file: &File, bytes: &[u8], sync: bool, path: impl Fn() -> PathBuf) -> Result<()> {
    failpoint!("file.write.before_pwrite")
        .and_then(|()| file.write_all_at(bytes, 0))
        .context("write lock record", &path)?;
    if sync {
        failpoint!("file.write.before_sync")
            .and_then(|()| file.sync_data())
            .context("sync lock record", &path)?;
    }
    Ok(())
}

/// Removes a lock file judged stale (`judged`: its device and inode),
/// under the mutation lock: only if the path still names it, looked at
/// right before the unlink, with no step between the two. A program that
/// does not take the mutation lock (pi-research's code) may have replaced
/// the file since the caller judged it, while this process was paused:
/// its live lock is then left alone. (What remains is the instant between
/// the look and the unlink.)
pub(super) fn unlink_judged(ctx: &Ctx, name: &LockName, judged: (u64, u64)) -> Result<bool> {
    unlink_if(ctx, name, Some(judged))
}

/// Removes the lock file; the caller holds the mutation lock and has
/// checked that the path names the inode it judged.
pub(super) fn unlink(ctx: &Ctx, name: &LockName) -> Result<bool> {
    unlink_if(ctx, name, None)
}

/// Removes the lock file, if `judged`, only if the path names that
/// device and inode at the last moment.
fn unlink_if(ctx: &Ctx, name: &LockName, judged: Option<(u64, u64)>) -> Result<bool> {
    failpoint!("file.unlink.before_unlink").context("remove lock file", || ctx.path_of(name.file_name()))?;
    if let Some((dev, ino)) = judged
        && !ctx.names(name, dev, ino)?
    {
        return Ok(false);
    }
    match syscall::unlink_at(ctx.dir.fd(), name.file_name()) {
        Ok(()) => Ok(true),
        Err(Errno::ENOENT) => Ok(false),
        Err(e) => Err(e).context("remove lock file", || ctx.path_of(name.file_name())),
    }
}
