//! An existing lock, opened for judging and, when stale, reclaiming.

use crate::sys::syscall::Flock;
use std::fs::File;
use std::time::{SystemTime, UNIX_EPOCH};

use super::context::Ctx;
use super::context::read_record;
use super::layout::Strategy;
use super::mutex::MutationLock;
use super::{directory, file, members};
use crate::error::{Error, IoResultExt, Result};
use crate::name::LockName;
use crate::owner::Owner;
use crate::record::{self, Parsed};
use crate::stale::{self, Evidence, StaleReason, Verdict};
use crate::sys::syscall::{self, Errno, Open};

/// What is at a lock path: the lock file, or the lock directory and its
/// `owner.json`, with the record as read.
pub(super) struct Found {
    /// The lock file or directory; a test `flock` goes on it.
    node: File,
    dev: u64,
    ino: u64,
    /// Which file, and which version of it, was read.
    instance: crate::sys::Instance,
    bytes: Vec<u8>,
    pub(super) parsed: Parsed,
    pub(super) mtime: SystemTime,
    flocked: bool,
}

impl Found {
    /// Opens what is at the lock path, refusing anything but what the
    /// strategy creates without opening it (a FIFO or device node could
    /// block or have side effects, a symlink could lead anywhere). `None`
    /// when the path is empty or changed while we looked.
    pub(super) fn open(ctx: &Ctx, name: &LockName) -> Result<Option<Self>> {
        let path = || ctx.path_of(name.file_name());
        let st = match syscall::stat_at(ctx.dir.fd(), name.file_name()) {
            Ok(st) => st,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(e).context("inspect lock", path),
        };
        if st.kind != ctx.settings.strategy.expected_kind() {
            return Err(Error::UnexpectedFile {
                name: name.as_str().to_owned(),
                path: path(),
                found: st.kind.as_str(),
            });
        }
        let how = match ctx.settings.strategy {
            Strategy::ExclusiveFile => Open::Read,
            Strategy::Directory => Open::Dir,
        };
        let node = match syscall::open_at(ctx.dir.fd(), name.file_name(), how) {
            Ok(node) => node,
            // Replaced between the stat and the open: look again.
            Err(Errno::ENOENT | Errno::ELOOP | Errno::ENXIO | Errno::ENOTDIR) => return Ok(None),
            Err(e) => return Err(e).context("open lock", path),
        };
        let meta = syscall::meta(&node).context("inspect lock", path)?;
        if meta.dev() != st.dev || meta.ino() != st.ino {
            return Ok(None);
        }
        let (bytes, mtime) = match ctx.settings.strategy {
            Strategy::ExclusiveFile => {
                let bytes = read_record(&node).context("read lock record", path)?;
                (bytes, meta.modified().unwrap_or(UNIX_EPOCH))
            }
            Strategy::Directory => match directory::read_owner(&node) {
                Ok(Some((bytes, mtime))) => (bytes, mtime),
                // No owner.json (yet): judged like an empty record, by the
                // directory's age.
                Ok(None) => (Vec::new(), meta.modified().unwrap_or(UNIX_EPOCH)),
                Err(e) => return Err(e).context("read lock record", || path().join("owner.json")),
            },
        };
        // A lock directory holds its record and nothing else (but, while
        // it is renewed, the next record): one that holds other files is
        // someone's data, which a reclaim would empty.
        let parsed = match ctx.settings.strategy == Strategy::Directory && directory::holds_other_files(&node)
        {
            true => Parsed::Foreign,
            false => record::parse(&bytes),
        };
        Ok(Some(Found {
            parsed,
            node,
            dev: meta.dev(),
            ino: meta.ino(),
            instance: meta.instance(),
            bytes,
            mtime,
            flocked: false,
        }))
    }

    fn reread(&self, ctx: &Ctx) -> std::io::Result<Vec<u8>> {
        match ctx.settings.strategy {
            Strategy::ExclusiveFile => read_record(&self.node),
            Strategy::Directory => Ok(directory::read_owner(&self.node)?
                .map(|(b, _)| b)
                .unwrap_or_default()),
        }
    }

    /// Whether the holder is alive. A shared lock's (or semaphore's)
    /// marker is held while any of its holders is: its own record, a copy
    /// of one holder's, decides nothing. A members directory that cannot
    /// be read leaves the marker held.
    pub(super) fn judge(&mut self, ctx: &Ctx, name: &LockName) -> Verdict {
        if members::marker(&self.parsed).is_some() {
            return members::judge_marker(ctx, name).unwrap_or(Verdict::Live);
        }
        let host = stale::System;
        let mut evidence = Evidence {
            parsed: &self.parsed,
            mtime: self.mtime,
            flock_free: None,
            known_for: ctx.known_for(self.mtime, self.instance),
        };
        let verdict = stale::judge(&evidence, ctx.rules(), &host);
        if verdict != Verdict::NeedsFlockTest {
            return verdict;
        }
        // Keep the flock if we get it: while we hold it nobody else can
        // judge this inode abandoned, and the holder cannot be alive.
        self.flocked = self.node.try_flock().is_ok();
        evidence.flock_free = Some(self.flocked);
        stale::judge(&evidence, ctx.rules(), &host)
    }

    /// The error for a lock path that holds no lock (judged
    /// [`Verdict::NotALock`]): never removed, never waited for.
    pub(super) fn not_a_lock(&self, ctx: &Ctx, name: &LockName) -> Error {
        Error::UnexpectedFile {
            name: name.as_str().to_owned(),
            path: ctx.path_of(name.file_name()),
            found: match ctx.settings.strategy {
                Strategy::ExclusiveFile => "file that holds no lock record",
                Strategy::Directory => "directory that holds something other than a lock record",
            },
        }
    }

    /// The `(dev, ino)` of what was found.
    pub(super) fn identity(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }

    /// The lock file or directory, open.
    pub(super) fn node(&self) -> &File {
        &self.node
    }

    /// The lock file or directory, kept open.
    pub(super) fn into_node(self) -> File {
        self.node
    }

    pub(super) fn owner(&self) -> Owner {
        Owner::from_parsed(&self.parsed)
    }

    /// Removes the stale lock if the path still names the inode we judged
    /// and, unless our flock proves the holder gone, its record has not
    /// changed since we read it (a renewal may have raced our read).
    pub(super) fn reclaim(&self, ctx: &Ctx, name: &LockName, reason: StaleReason) -> Result<bool> {
        let path = || ctx.path_of(name.file_name());
        // Busy (another process is changing this name, or is frozen while
        // it does): not now.
        let Some(mutation) = ctx.dir.try_mutation_lock(name.file_name())? else {
            return Ok(false);
        };
        failpoint!("reclaim.after_dirlock").context("reclaim lock", path)?;
        if !ctx.names(name, self.dev, self.ino)? {
            return Ok(false);
        }
        // Read again even when our flock proves the record's writer
        // gone: a marker (whose holders flock it only shared, and whose
        // first holder may have written it since we read it empty) is
        // judged by its holders, now that none can join or leave.
        let now = self.reread(ctx).context("read lock record", path)?;
        if !self.flocked && now != self.bytes {
            return Ok(false);
        }
        let is_marker =
            members::marker(&self.parsed).is_some() || members::marker(&record::parse(&now)).is_some();
        let remove = |mutation: MutationLock<'_>, then: &dyn Fn()| {
            failpoint!("reclaim.before_remove").context("reclaim lock", path)?;
            match ctx.settings.strategy {
                Strategy::ExclusiveFile => {
                    let removed = file::unlink_judged(ctx, name, (self.dev, self.ino))?;
                    if removed {
                        then();
                    }
                    Ok(removed)
                }
                Strategy::Directory => directory::retire(ctx, name, &self.node, mutation, then),
            }
        };
        // A marker's members are counted under the members directory's
        // seal, which keeps joiners that do not take the mutation lock out
        // until the marker is gone.
        let removed = if is_marker {
            members::tidy(ctx, name, mutation, remove)?.unwrap_or(false)
        } else {
            remove(mutation, &|| {})?
        };
        if !removed {
            return Ok(false);
        }
        ctx.counters.reclaimed(reason);
        let owner = self.owner();
        tracing::info!(
            lock = name.as_str(),
            reason = reason.as_str(),
            owner_pid = owner.pid(),
            owner_host = owner.hostname(),
            "reclaimed stale lock"
        );
        Ok(true)
    }
}
