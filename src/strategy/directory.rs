//! The directory strategy, laid out as the first seed lays it out.
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

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat, renameat};
use nix::sys::stat::{Mode, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use super::{Ctx, LEFTOVER_SETTLE, Leftover, leftover_kind, names, read_record, unique_bits};
use crate::dir::MutationLock;
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::record::OwnRecord;
use crate::sys::{self, RenameError};

const OWNER: &str = "owner.json";
const NEXT: &str = "owner.json.next";

/// A lock directory this process published. Dropping it removes the
/// directory if, and only if, the path still names it.
#[derive(Debug)]
pub(crate) struct DirLock {
    ctx: Arc<Ctx>,
    name: LockName,
    dir: File,
    /// The current `owner.json`, kept open for writing only so that its
    /// close — at renewal, or when this process dies — is an inotify event
    /// that wakes waiters.
    _record_file: File,
    dev: u64,
    ino: u64,
    record: OwnRecord,
    armed: bool,
}

/// A private name's 12 hex digits: unique within this process, random
/// across processes.
fn suffix() -> String {
    format!("{:012x}", unique_bits().1 & 0xffff_ffff_ffff)
}

/// Publishes a new lock directory; `None` if the path is taken.
pub(super) fn create(ctx: &Arc<Ctx>, name: &LockName) -> Result<Option<DirLock>> {
    let mut pending = format!("{}.pending-{}", name.file_name(), suffix());
    // Another process's pending directory could have the same name, once
    // in 2^48; then another name is tried, a few times at most.
    let mut tries = 0;
    while let Err(e) = mkdirat(ctx.dir.fd(), pending.as_str(), Mode::from_bits_truncate(0o700)) {
        tries += 1;
        if e != Errno::EEXIST || tries == 4 {
            return Err(Error::errno(
                "create pending lock directory",
                ctx.dir.path_of(&pending),
                e,
            ));
        }
        pending = format!("{}.pending-{}", name.file_name(), suffix());
    }
    let path = || ctx.dir.path_of(&pending);
    let mut cleanup = Pending {
        ctx,
        name: &pending,
        armed: true,
    };
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let dir = match openat(ctx.dir.fd(), pending.as_str(), flags, Mode::empty()) {
        Ok(fd) => File::from(fd),
        // Collected as abandoned while this process stood still between
        // mkdir and flock (see `clean_leftovers`): no lock was made; the
        // caller looks at the lock path again.
        Err(Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(Error::errno("open pending lock directory", path(), e)),
    };
    let meta = dir
        .metadata()
        .map_err(|e| Error::io("inspect pending lock directory", path(), e))?;
    // Nobody else knows this directory yet, so the flock is free; it is
    // ours before the directory can be seen at the lock path.
    dir.try_lock().map_err(|e| {
        Error::io(
            "lock pending lock directory",
            path(),
            io::Error::other(e.to_string()),
        )
    })?;
    let record = ctx.own_record(name);
    let record_file = match write_owner(&dir, OWNER, &record, ctx.durable) {
        Ok(file) => file,
        // As above: the pending directory was collected before our flock.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("write lock record", path(), e)),
    };
    match sys::rename_noreplace(ctx.dir.fd(), &pending, name.file_name()) {
        Ok(()) => {}
        Err(RenameError::Exists) => return Ok(None),
        Err(RenameError::Io(e)) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(RenameError::Unsupported) => {
            return Err(Error::Unsupported {
                what: "the directory strategy on a filesystem without renameat2(RENAME_NOREPLACE); \
                       use Strategy::ExclusiveFile",
            });
        }
        Err(RenameError::Io(e)) => return Err(Error::io("publish lock directory", path(), e)),
    }
    cleanup.armed = false;
    Ok(Some(DirLock {
        ctx: Arc::clone(ctx),
        name: name.clone(),
        dir,
        _record_file: record_file,
        dev: meta.dev(),
        ino: meta.ino(),
        record,
        armed: true,
    }))
}

/// Writes a record to `file_name` inside `dir`, replacing any old one of
/// that name (only ever our own pending or `.next` file), and returns it
/// still open.
fn write_owner(dir: &File, file_name: &str, record: &OwnRecord, durable: bool) -> io::Result<File> {
    let flags = OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let file = File::from(openat(dir, file_name, flags, Mode::from_bits_truncate(0o600))?);
    file.write_all_at(&record.to_bytes(0), 0)?;
    if durable {
        file.sync_data()?;
    }
    Ok(file)
}

/// Reads `owner.json` from an open lock directory: its bytes and mtime, or
/// `None` if there is none (or it is not a regular file, which is never
/// followed).
pub(super) fn read_owner(dir: &File) -> io::Result<Option<(Vec<u8>, SystemTime)>> {
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
    let file = match openat(dir, OWNER, flags, Mode::empty()) {
        Ok(fd) => File::from(fd),
        Err(Errno::ENOENT | Errno::ELOOP | Errno::ENXIO | Errno::EISDIR) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Ok(None);
    }
    Ok(Some((read_record(&file)?, meta.modified().unwrap_or(UNIX_EPOCH))))
}

/// Moves the lock directory at the lock path to a private trash name and
/// empties it. The caller holds the mutation lock (released here once the
/// lock path is free) and has checked that the path names `node`.
pub(super) fn retire(ctx: &Ctx, name: &LockName, node: &File, mutation: MutationLock<'_>) -> Result<bool> {
    let trash = format!("{}.trash-{}", name.file_name(), suffix());
    match renameat(ctx.dir.fd(), name.file_name(), ctx.dir.fd(), trash.as_str()) {
        Ok(()) => {}
        Err(Errno::ENOENT) => return Ok(false),
        Err(e) => {
            return Err(Error::errno(
                "move lock directory away",
                ctx.dir.path_of(name.file_name()),
                e,
            ));
        }
    }
    // Under the directory lock no cooperating process can have replaced
    // the path since the caller checked it; a process that ignores the
    // lock can. What was moved is then not what was judged: put it back
    // (if the path is still free) and remove nothing.
    let moved = nix::sys::stat::fstatat(
        ctx.dir.fd(),
        trash.as_str(),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    );
    let judged = node.metadata().ok();
    let same = matches!((&moved, &judged), (Ok(st), Some(meta)) if st.st_dev == meta.dev() && st.st_ino == meta.ino());
    if !same {
        if sys::rename_noreplace(ctx.dir.fd(), &trash, name.file_name()).is_err() {
            tracing::warn!(
                path = %ctx.dir.path_of(&trash).display(),
                "the lock path was replaced behind the directory lock; left what was there in the trash"
            );
        }
        return Ok(false);
    }
    drop(mutation);
    remove_dir(ctx, &trash, node);
    Ok(true)
}

/// Empties and removes the directory `dir_name`, opened as `node`.
/// Best effort: a holder that has not yet noticed it lost the lock may
/// still rename a renewal into it, hence the retries; what cannot be
/// removed is logged.
fn remove_dir(ctx: &Ctx, dir_name: &str, node: &File) {
    // Usually the record is all there is: try without listing first.
    let _ = unlinkat(node, OWNER, UnlinkatFlags::NoRemoveDir);
    if let Ok(()) | Err(Errno::ENOENT) = unlinkat(ctx.dir.fd(), dir_name, UnlinkatFlags::RemoveDir) {
        return;
    }
    for attempt in 0..5 {
        if let Err(error) = empty(node) {
            tracing::debug!(dir = dir_name, %error, "emptying a lock directory failed");
        }
        match unlinkat(ctx.dir.fd(), dir_name, UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => return,
            Err(Errno::ENOTEMPTY | Errno::EEXIST) if attempt < 4 => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => {
                tracing::warn!(
                    path = %ctx.dir.path_of(dir_name).display(),
                    error = %e,
                    "could not remove a retired lock directory"
                );
                return;
            }
        }
    }
}

/// Removes `.pending-*` directories whose publisher is gone (no flock, and
/// unchanged for [`LEFTOVER_SETTLE`] or the grace period, whichever is
/// shorter) and `.trash-*` directories nobody holds (a releaser that died
/// while emptying one); nobody else uses either. At most `limit` are
/// removed.
pub(super) fn clean_leftovers(
    ctx: &Ctx,
    dry_run: bool,
    limit: usize,
) -> Result<Vec<(LockName, super::Inspection)>> {
    let names =
        ctx.entries(|name| matches!(leftover_kind(name), Some(Leftover::Pending | Leftover::Trash)))?;
    let mut cleaned = Vec::new();
    for name in names {
        if cleaned.len() >= limit {
            break;
        }
        let open = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let Ok(fd) = openat(ctx.dir.fd(), name.as_str(), open, Mode::empty()) else {
            continue;
        };
        let node = File::from(fd);
        // A publisher flocks its pending directory right after creating it,
        // and a holder keeps its flock on a directory it is retiring: busy
        // means in use. A pending directory is also spared while younger
        // than the grace period, for the instant between mkdir and flock.
        if node.try_lock().is_err() {
            continue;
        }
        let young = leftover_kind(&name) == Some(Leftover::Pending)
            && node
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                // Its publisher takes the flock two syscalls after `mkdir`:
                // only one that stood still this long in between finds it
                // gone, and then makes no lock and looks again.
                .is_none_or(|age| age < ctx.grace.min(LEFTOVER_SETTLE));
        if young {
            continue;
        }
        if !dry_run {
            remove_dir(ctx, &name, &node);
        }
        cleaned.push((LockName::from_file_name(&name), super::Inspection::leftover()));
    }
    Ok(cleaned)
}

/// Unlinks every non-directory entry of `node`; subdirectories, which
/// leasehold never creates, are left alone.
fn empty(node: &File) -> io::Result<()> {
    // A fresh open each time: a duplicate would share the directory offset,
    // and a second pass would see nothing.
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut listing = nix::dir::Dir::openat(node, ".", flags, Mode::empty())?;
    let names: Vec<std::ffi::CString> = listing
        .iter()
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_owned())
        .filter(|name| name.as_bytes() != b"." && name.as_bytes() != b"..")
        .collect();
    for name in names {
        match unlinkat(node, name.as_c_str(), UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT | Errno::EISDIR | Errno::EPERM) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

impl DirLock {
    pub(crate) fn record(&self) -> &OwnRecord {
        &self.record
    }

    pub(crate) fn parts(&self) -> (&Arc<Ctx>, &LockName, u64, u64) {
        (&self.ctx, &self.name, self.dev, self.ino)
    }

    /// Replaces `owner.json` atomically inside the directory we published:
    /// written as `owner.json.next` through our descriptor, then renamed.
    pub(crate) fn write_record(&mut self, record: OwnRecord) -> Result<()> {
        let path = || self.ctx.dir.path_of(self.name.file_name()).join(OWNER);
        let next = write_owner(&self.dir, NEXT, &record, false)
            .map_err(|e| Error::io("rewrite lock record", path(), e))?;
        renameat(&self.dir, NEXT, &self.dir, OWNER)
            .map_err(|e| Error::errno("rewrite lock record", path(), e))?;
        self._record_file = next;
        self.record = record;
        Ok(())
    }

    pub(crate) fn release(mut self) -> Result<bool> {
        self.armed = false;
        self.remove()
    }

    fn remove(&self) -> Result<bool> {
        let mutation = self.ctx.dir.mutation_lock()?;
        if !names(&self.ctx, &self.name, self.dev, self.ino)? {
            // Retired by a reclaimer: help it empty our old directory.
            let _ = unlinkat(&self.dir, OWNER, UnlinkatFlags::NoRemoveDir);
            return Ok(false);
        }
        retire(&self.ctx, &self.name, &self.dir, mutation)
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        if std::mem::take(&mut self.armed) {
            super::log_drop_failure(&self.name, self.remove());
        }
    }
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
        if let Ok(()) | Err(Errno::ENOENT) = unlinkat(self.ctx.dir.fd(), self.name, UnlinkatFlags::RemoveDir)
        {
            return;
        }
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        match openat(self.ctx.dir.fd(), self.name, flags, Mode::empty()) {
            Ok(fd) => remove_dir(self.ctx, self.name, &File::from(fd)),
            Err(error) => {
                tracing::warn!(dir = self.name, %error, "could not remove a pending lock directory")
            }
        }
    }
}
