//! A lock this process created, in either layout: its identity, its
//! record, renewal, release, and removal on drop.

use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::context::Ctx;
use super::group::Member;
use super::layout::Strategy;
use super::mutex::MutationLock;
use super::release::{self, Release};
use super::{directory, fence, file};
use crate::backend::{BackendLock, ReleaseNow, Renewal, Tokens};
use crate::error::{IoResultExt, LossReason, Result};
use crate::name::LockName;
use crate::record::OwnRecord;
use crate::sys;

/// A lock this process holds in the directory: the whole lock path
/// (exclusive), or a place among a shared lock's or semaphore's holders.
#[derive(Debug)]
pub(crate) enum FsLock {
    Whole(Whole),
    Member(Member),
}

/// A lock this process created and still holds. Dropping it removes it
/// (synchronously, reporting failures through `tracing`) if, and only if,
/// the lock path still names it, so a lock created by an attempt whose
/// caller went away is never orphaned.
#[derive(Debug)]
pub(crate) struct Whole {
    ctx: Arc<Ctx>,
    name: LockName,
    /// The identity of what this process created at the lock path.
    dev: u64,
    ino: u64,
    record: OwnRecord,
    node: Node,
    armed: bool,
}

/// What the layout keeps open while the lock is held; the `flock` on the
/// node is the liveness signal other leasehold processes read.
#[derive(Debug)]
enum Node {
    /// The lock file itself; renewals rewrite it in place, padded to
    /// `record_len`, the length on disk.
    /// `_named` is the file opened by the lock path's name, where it was
    /// linked there, kept only so that its close (when this process dies)
    /// wakes waiters (see `file::create`).
    File {
        file: File,
        _named: Option<File>,
        record_len: usize,
    },
    /// The lock directory, and its current `owner.json` kept open for
    /// writing only so that its close (at renewal, or when this process
    /// dies) is an inotify event that wakes waiters.
    Dir { dir: File, record_file: File },
}

impl Whole {
    /// Creates the lock `name` in the layout of `ctx`, its record written
    /// (and synced when durable); `None` if the path is taken. Callers on
    /// the runtime's thread pass `patient: false` and never sleep here.
    pub(super) fn create(ctx: &Arc<Ctx>, name: &LockName, patient: bool) -> Result<Option<Self>> {
        // A directory's record is made once its pending directory is
        // ours (an attempt that finds the lock taken makes none); a lock
        // file appears at the lock path with its record already in it.
        let (node, record, dev, ino) = match ctx.settings.strategy {
            Strategy::ExclusiveFile => {
                let record = ctx.own_record(name);
                match file::create(ctx, name, file::Hold::Exclusive, patient, &record.to_bytes(0))? {
                    Some(made) => (
                        Node::File {
                            file: made.file,
                            _named: made.named,
                            record_len: made.len,
                        },
                        record,
                        made.dev,
                        made.ino,
                    ),
                    None => return Ok(None),
                }
            }
            Strategy::Directory => match directory::create(ctx, name)? {
                Some(p) => (
                    Node::Dir {
                        dir: p.dir,
                        record_file: p.record_file,
                    },
                    p.record,
                    p.dev,
                    p.ino,
                ),
                None => return Ok(None),
            },
        };
        // Armed from here on: a failure below removes the lock.
        let lock = Whole {
            ctx: Arc::clone(ctx),
            name: name.clone(),
            dev,
            ino,
            record,
            node,
            armed: true,
        };
        failpoint!("lock.create.after_record").context("create lock", || ctx.path_of(name.file_name()))?;
        ctx.lines.acquired(ctx.dir.fd(), name.file_name());
        Ok(Some(lock))
    }

    /// An exclusive lock made of a shared lock's marker, in place (an
    /// upgrade, `fs/upgrade.rs`): `node` is the marker's node under our
    /// flock, `writer` (a lock file's) the descriptor its record is
    /// rewritten through, `record` the record now on disk.
    pub(in crate::fs) fn adopt(
        ctx: &Arc<Ctx>,
        name: &LockName,
        (dev, ino): (u64, u64),
        record: OwnRecord,
        node: File,
        writer: Option<(File, usize)>,
        record_file: Option<File>,
    ) -> Self {
        let node = match (writer, record_file) {
            (Some((file, record_len)), _) => Node::File {
                file,
                _named: Some(node),
                record_len,
            },
            (None, Some(record_file)) => Node::Dir {
                dir: node,
                record_file,
            },
            (None, None) => unreachable!("an adopted lock has a writer or a record file"),
        };
        Whole {
            ctx: Arc::clone(ctx),
            name: name.clone(),
            dev,
            ino,
            record,
            node,
            armed: true,
        }
    }

    /// This lock's identity and node (the lock directory, or the file that
    /// holds its flock), given up without removing anything: for a
    /// downgrade (`fs/upgrade.rs`), which turns it into a marker.
    pub(in crate::fs) fn dissolve(mut self) -> std::io::Result<((u64, u64), File)> {
        // A duplicate shares the open file description, so the flock
        // stays with it when this lock's own descriptors close.
        let node = match &self.node {
            Node::File { file, .. } => file.try_clone()?,
            Node::Dir { dir, .. } => dir.try_clone()?,
        };
        self.armed = false;
        Ok(((self.dev, self.ino), node))
    }

    /// Replaces the record on disk with `record`, through this lock's own
    /// descriptors.
    fn write_record(&mut self, record: OwnRecord) -> Result<()> {
        let path = || self.ctx.path_of(self.name.file_name());
        match &mut self.node {
            Node::File { file, record_len, .. } => {
                *record_len = file::write(file, *record_len, &record, false, path)?
            }
            Node::Dir { dir, record_file } => *record_file = directory::rewrite(dir, &record, path)?,
        }
        self.record = record;
        Ok(())
    }

    /// Removes the lock if the path still names it, under the name's
    /// mutation lock taken within `patience`: `Some(false)` if the path
    /// no longer named it, `None` if the mutation lock stayed taken.
    fn remove(&self, patience: Duration) -> Result<Option<bool>> {
        let lock = self.name.file_name();
        match self.ctx.dir.lock_within(lock, patience)? {
            Some(mutation) => self.remove_under(mutation).map(Some),
            None => Ok(None),
        }
    }

    /// [`remove`](Self::remove), under the name's mutation lock. Others
    /// in line: the mutation lock's file stays for the next holder's
    /// release if waiters of this name are registered on it
    /// (`MutationLock::keep_for_waiters`).
    fn remove_under(&self, mut mutation: MutationLock<'_>) -> Result<bool> {
        failpoint!("lock.release.after_dirlock")
            .context("release lock", || self.ctx.path_of(self.name.file_name()))?;
        let ours = self.ctx.names(&self.name, self.dev, self.ino)?;
        match &self.node {
            Node::File { .. } if ours => {
                if self.ctx.lines.releasing(self.ctx.dir.fd(), self.name.file_name()) {
                    mutation.keep_for_waiters();
                }
                file::unlink(&self.ctx, &self.name)
            }
            Node::File { .. } => Ok(false),
            Node::Dir { dir, .. } if ours => {
                if self.ctx.lines.releasing(self.ctx.dir.fd(), self.name.file_name()) {
                    mutation.keep_for_waiters();
                }
                directory::retire(&self.ctx, &self.name, dir, mutation, &|| {})
            }
            Node::Dir { dir, .. } => {
                // Retired by a reclaimer: help it empty our old directory.
                directory::forget_record(dir);
                Ok(false)
            }
        }
    }
}

impl Release for Whole {
    fn lock_name(&self) -> &str {
        self.name.as_str()
    }

    fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    fn armed(&mut self) -> &mut bool {
        &mut self.armed
    }

    fn remove(&mut self, patience: Duration) -> Result<Option<bool>> {
        Whole::remove(self, patience)
    }

    fn still_ours(&self) -> Result<bool> {
        self.ctx.names(&self.name, self.dev, self.ino)
    }

    fn copy(&self) -> std::io::Result<Self> {
        let node = match &self.node {
            Node::File {
                file,
                _named,
                record_len,
            } => Node::File {
                file: file.try_clone()?,
                _named: _named.as_ref().map(File::try_clone).transpose()?,
                record_len: *record_len,
            },
            Node::Dir { dir, record_file } => Node::Dir {
                dir: dir.try_clone()?,
                record_file: record_file.try_clone()?,
            },
        };
        Ok(Whole {
            ctx: Arc::clone(&self.ctx),
            name: self.name.clone(),
            dev: self.dev,
            ino: self.ino,
            record: self.record.clone(),
            node,
            armed: true,
        })
    }
}

impl BackendLock for FsLock {
    fn record(&self) -> &OwnRecord {
        match self {
            FsLock::Whole(lock) => &lock.record,
            FsLock::Member(member) => member.record(),
        }
    }

    fn renew(&mut self, cutoff: u64) -> Result<Renewal> {
        match self {
            FsLock::Whole(lock) => lock.renew(cutoff),
            FsLock::Member(member) => member.renew(cutoff),
        }
    }

    fn check(&self) -> Result<Option<LossReason>> {
        match self {
            FsLock::Whole(lock) => lock.check(),
            FsLock::Member(member) => member.check(),
        }
    }

    fn reserve_tokens(&mut self) -> Result<Option<Tokens>> {
        match self {
            FsLock::Whole(lock) => lock.reserve_tokens(),
            FsLock::Member(member) => member.reserve_tokens(),
        }
    }

    fn release(self, confirm: bool) -> Result<Option<LossReason>> {
        match self {
            FsLock::Whole(lock) => lock.release(confirm),
            FsLock::Member(member) => member.release(confirm),
        }
    }

    fn release_now(self, confirm: bool) -> ReleaseNow<Self> {
        match self {
            FsLock::Whole(lock) => lock.release_now(confirm).map_busy(FsLock::Whole),
            member @ FsLock::Member(_) => ReleaseNow::Busy(member),
        }
    }

    /// Nobody of another process stands in the name's line (a shared lock
    /// or a permit is never passed on, so never asked).
    fn unwaited(&self) -> bool {
        match self {
            FsLock::Whole(lock) => lock
                .ctx
                .lines
                .nobody_in_line(lock.ctx.dir.fd(), lock.name.file_name()),
            FsLock::Member(_) => false,
        }
    }

    /// Someone of another process stands in the name's line.
    fn waited(&self) -> bool {
        match self {
            FsLock::Whole(lock) => lock
                .ctx
                .lines
                .someone_in_line(lock.ctx.dir.fd(), lock.name.file_name()),
            FsLock::Member(_) => false,
        }
    }
}

impl Whole {
    /// Takes no lock, so no other process can hold it up. It is ordered
    /// with any reclaim by time instead: a reclaimer judges a lease expired
    /// only from a record it read after the lease's end, and then reads
    /// the record again, under the name's mutation lock, backing off if it
    /// changed. The cutoff lies before that end, so a renewal whose write
    /// completed before the cutoff is always seen, and one that completed
    /// after it is reported as a loss (the lock may be someone else's by
    /// now), however it went on disk.
    pub(super) fn renew(&mut self, cutoff: u64) -> Result<Renewal> {
        let ctx = Arc::clone(&self.ctx);
        // A lock in a directory that its path no longer names is invisible
        // to everyone who opens the path now: it excludes nobody.
        if let Some(moved) = ctx.dir_moved() {
            return Ok(Renewal::Lost(moved));
        }
        failpoint!("lock.renew.after_dirlock")
            .context("renew lock", || ctx.path_of(self.name.file_name()))?;
        if !ctx.names(&self.name, self.dev, self.ino)? {
            return Ok(Renewal::Lost(LossReason::Replaced));
        }
        let boot = sys::boot_clock_ms();
        if boot >= cutoff {
            return Ok(Renewal::Lost(LossReason::LeaseExpired));
        }
        let mut record = self.record.clone();
        record.renew(SystemTime::now(), boot);
        self.write_record(record)?;
        // Judged by when the write was done, not when it began.
        if sys::boot_clock_ms() >= cutoff {
            return Ok(Renewal::Lost(LossReason::LeaseExpired));
        }
        Ok(Renewal::Renewed)
    }

    fn check(&self) -> Result<Option<LossReason>> {
        if let Some(moved) = self.ctx.dir_moved() {
            return Ok(Some(moved));
        }
        let ours = self.ctx.names(&self.name, self.dev, self.ino)?;
        Ok((!ours).then_some(LossReason::Replaced))
    }

    fn reserve_tokens(&mut self) -> Result<Option<Tokens>> {
        self.reserve(false)
    }

    /// [`reserve_tokens`](Self::reserve_tokens) under the name's mutation
    /// lock, which the caller holds (an upgrade).
    pub(in crate::fs) fn reserve_tokens_locked(&mut self) -> Result<Option<Tokens>> {
        self.reserve(true)
    }

    fn reserve(&mut self, locked: bool) -> Result<Option<Tokens>> {
        let (ctx, name) = (Arc::clone(&self.ctx), self.name.clone());
        let (dev, ino) = (self.dev, self.ino);
        let still_ours = || ctx.names(&name, dev, ino);
        let mut record_first = |first| {
            let mut record = self.record.clone();
            record.fencing_token = Some(first);
            self.write_record(record)
        };
        match locked {
            true => fence::reserve_locked(&ctx, &name, &still_ours, &mut record_first),
            false => fence::reserve(&ctx, &name, &still_ours, &mut record_first),
        }
    }

    /// Releases the lock (see `fs/release.rs`); `None` when it was ours to
    /// the end, otherwise why not.
    fn release(mut self, confirm: bool) -> Result<Option<LossReason>> {
        release::let_go(&mut self, confirm)
    }

    /// [`release`](Self::release) if the name's mutation lock is free this
    /// instant; the lock back otherwise (and on failing to tell).
    fn release_now(mut self, confirm: bool) -> ReleaseNow<Self> {
        let ctx = Arc::clone(&self.ctx);
        // Looked at before the mutation lock, as `release` does: nobody
        // may walk a path (a hung mount on the way) holding it.
        let moved = if confirm { ctx.dir_moved() } else { None };
        let Ok(Some(mutation)) = ctx.dir.mutation_lock_now(self.name.file_name()) else {
            return ReleaseNow::Busy(self);
        };
        self.armed = false;
        ReleaseNow::Done(
            self.remove_under(mutation)
                .map(|released| release::outcome(moved, released)),
        )
    }
}

impl Drop for Whole {
    fn drop(&mut self) {
        release::on_drop(self);
    }
}
