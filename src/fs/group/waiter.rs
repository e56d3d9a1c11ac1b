//! Exclusive waiters' announcements: how a waiting writer keeps new
//! shared holders (and permit holders) out until it has had its turn.

use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::{JSON, WAITER, create_record, ensure_members, members_dir, open_members, remove_members_dir};
use crate::backend::{Renewable, Step};
use crate::error::{Error, Result};
use crate::fs::context::Ctx;
use crate::fs::{file, later};
use crate::name::LockName;
use crate::record::OwnRecord;
use crate::sys;
use crate::sys::syscall::{self, Flock};

/// An exclusive acquisition waiting for shared holders (or permit
/// holders) to leave, said on disk (`w-<uuid>.json`, flocked, renewed
/// while it waits) so that no new ones join meanwhile. Removed when
/// dropped; a waiter that died or froze past its lease is ignored.
#[derive(Debug)]
pub(crate) struct Announcement {
    ctx: Arc<Ctx>,
    name: LockName,
    dir: File,
    /// Our announcement, open; closed once unlinked: on Windows an
    /// unlinked file keeps a (pending) name in the members directory until
    /// its last handle closes, and the directory must be found empty to be
    /// removed.
    file: Option<File>,
    file_name: String,
    state: Mutex<(OwnRecord, usize)>,
}

/// Whether an exclusive waiter has announced itself for `name` (its
/// record is there, whatever its state); `true` when that cannot be told.
pub(in crate::fs) fn announced(ctx: &Ctx, name: &LockName) -> bool {
    let Ok(Some(dir)) = open_members(ctx, name) else {
        return true;
    };
    match syscall::list_at(&dir) {
        // A waiter's flock is held while it lives: one that is free is a
        // dead waiter's record, which the store's join removes.
        Ok(names) => names
            .iter()
            .filter_map(|n| n.to_str())
            .filter(|n| n.starts_with(WAITER) && n.ends_with(JSON))
            .any(|n| match syscall::open_at(&dir, n, syscall::Open::Read) {
                Ok(file) => file.try_flock().is_err(),
                Err(_) => false,
            }),
        Err(_) => true,
    }
}

/// Announces an exclusive waiter for `name`; `None` if the directory is
/// busy (the next attempt tries again).
pub(in crate::fs) fn announce(ctx: &Arc<Ctx>, name: &LockName) -> Result<Option<Announcement>> {
    let Some(_mutation) = ctx.dir.try_mutation_lock(name.file_name())? else {
        return Ok(None);
    };
    // One that fails leaves no members directory it made (see `join`).
    let dir_name = members_dir(name.file_name());
    let left_empty = |_: &Error| remove_members_dir(ctx, &dir_name);
    let (dir, _) = ensure_members(ctx, name).inspect_err(left_empty)?;
    let record = ctx.own_record(name);
    let file_name = format!("{WAITER}{}{JSON}", record.uuid);
    let path = ctx.path_of(&dir_name).join(&file_name);
    let (file, len, _) =
        create_record(&dir, &file_name, &record, false, &|| path.clone()).inspect_err(left_empty)?;
    Ok(Some(Announcement {
        ctx: Arc::clone(ctx),
        name: name.clone(),
        dir,
        file: Some(file),
        file_name,
        state: Mutex::new((record, len)),
    }))
}

impl Renewable for Announcement {
    fn renew_once(&self) -> Step {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (record, len) = &mut *state;
        record.renew(SystemTime::now(), sys::boot_clock_ms());
        let path = || PathBuf::from(&self.file_name);
        // (Closed only in `drop`.)
        if let Some(own) = &self.file {
            match file::write(own, *len, record, false, path) {
                Ok(written) => *len = written,
                Err(error) => tracing::debug!(%error, "renewing an exclusive waiter's announcement failed"),
            }
        }
        Step::Again((self.ctx.settings.lease / 3).max(Duration::from_millis(1)))
    }
}

impl Drop for Announcement {
    /// Removes the announcement, and the members directory if that leaves
    /// it empty (under the mutation lock: a joiner may be about to use it).
    fn drop(&mut self) {
        let _ = failpoint!("group.withdraw.before_unlink")
            .and_then(|()| Ok(syscall::unlink_at(&self.dir, self.file_name.as_str())?));
        // Unlinked, it is gone only once closed, on Windows (see `file`).
        self.file = None;
        // Waits at most a few milliseconds: this runs on a runtime thread
        // (or the renewal thread).
        tidy_members(&self.ctx, &self.name, Duration::from_millis(5));
    }
}

/// Removes `name`'s members directory if it is empty, under the name's
/// mutation lock (a joiner may be about to use it), waiting `patience`
/// for that lock at most: if another process holds it (slow, or frozen
/// while it changes the name), the release thread finishes this, as it
/// finishes a release. For a process that took a file of its own out of
/// the directory without the lock, while a group's end may have found
/// that file there and so left the directory.
pub(in crate::fs) fn tidy_members(ctx: &Arc<Ctx>, name: &LockName, patience: Duration) {
    let mut tidy = TidyMembers {
        ctx: Arc::clone(ctx),
        name: name.clone(),
    };
    if !tidy.within(patience) {
        later::defer(Box::new(tidy));
    }
}

/// Removes a members directory that a withdrawn announcement (or a
/// marker's signer, see `tidy_members`) left empty, under the name's
/// mutation lock (a joiner may be about to use it).
///
/// It keeps no handle of the directory: whichever directory bears the name
/// when the lock is ours is removed if it is empty, as nobody can use an
/// empty one. (On Windows a handle kept open would keep the name of a
/// directory others removed meanwhile, and the name's next group could
/// not make its own.)
struct TidyMembers {
    ctx: Arc<Ctx>,
    name: LockName,
}

impl TidyMembers {
    /// Whether it is done: the mutation lock taken within `patience` (or
    /// an error, which leaves the directory to the name's next group, or
    /// `clean`).
    fn within(&mut self, patience: Duration) -> bool {
        match self.ctx.dir.lock_within(self.name.file_name(), patience) {
            Ok(Some(_mutation)) => {
                let empty = match open_members(&self.ctx, &self.name) {
                    Ok(Some(dir)) => syscall::list_at(&dir).is_ok_and(|names| names.is_empty()),
                    _ => false,
                };
                if empty {
                    remove_members_dir(&self.ctx, &members_dir(self.name.file_name()));
                }
                true
            }
            Ok(None) => false,
            Err(error) => {
                tracing::debug!(lock = self.name.as_str(), %error, "could not tidy a members directory");
                true
            }
        }
    }
}

impl later::Retry for TidyMembers {
    fn retry(&mut self) -> bool {
        self.within(later::PATIENCE)
    }
}
