//! Shared locks and counting semaphores in the lock directory.
//!
//! A name held shared (or as a semaphore) has two parts on disk:
//!
//! - its lock path, `<name>.lock`, laid out exactly as an exclusive lock
//!   of the strategy (a file, or a directory holding `owner.json`). Its
//!   record is the *marker*: a copy of one holder's record (the
//!   representative), whose `mode`, `permits` and `group` fields say what
//!   it is. The lock path exists while anyone holds the name this way, so
//!   every exclusive locker (leasehold's, velocious's, pi-research's) finds
//!   it taken; the representative's pid and renewed lease keep it looking
//!   held to those that judge by them.
//! - its members directory, `<name>.lock.members/`, which the other
//!   systems never look at: one record per holder, `m-<uuid>.json`, each
//!   created, `flock`ed and renewed by its holder like a lock file, and one
//!   per waiting exclusive acquisition, `w-<uuid>.json` (an
//!   [`Announcement`]), which keeps new shared holders out until it has
//!   had its turn.
//!
//! Every change to a group (joining, leaving, reclaiming, re-signing the
//! marker) happens under the directory's mutation lock, so counting the
//! members and adding one is one step for every leasehold process. The
//! members are judged by the same rules as lock files ([`stale`]): a dead
//! holder's flock is free at once, a frozen one's lease runs out.

use crate::sys::syscall::{Flock, WriteAt};
use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::context::Ctx;
use super::found::Found;
use super::layout::Strategy;
use super::members::{
    Entry, JSON, TMP, WAITER, create_record, ensure_members, judge_entry, marker, members_dir, mode_of,
    open_members, remove_dead, remove_members_dir, same_kind, scan,
};
use super::mutex::MutationLock;
use super::{directory, file};
use crate::backend::Mode;
use crate::error::{Error, IoResultExt, Result};
use crate::name::LockName;
use crate::owner::Owner;
use crate::record::{self};
use crate::sys::syscall::{self, Errno, Open};

/// What a join found.
pub(super) enum Joined {
    /// We are a holder.
    Member(Box<Member>),
    /// Full, or an exclusive acquisition waits for its turn.
    Busy {
        owner: Option<Owner>,
        recheck_at: Option<SystemTime>,
    },
    /// The lock path holds an exclusive lock (or something else that is
    /// not a marker): the caller judges it as such.
    NotShared,
    /// A marker nobody holds was removed: try again.
    Again,
}

/// Joins the holders of `name` as `mode` (shared or a permit), under the
/// mutation lock: starts the group (marker and members directory) if
/// nobody holds the name, joins it if it is held the same way, there is
/// room and no exclusive acquisition is waiting.
pub(super) fn join(ctx: &Arc<Ctx>, name: &LockName, mode: Mode, upgradable: bool) -> Result<Joined> {
    let Some(mutation) = ctx.dir.try_mutation_lock(name.file_name())? else {
        return Ok(Joined::Busy {
            owner: None,
            recheck_at: None,
        });
    };
    failpoint!("group.join.after_dirlock").context("join shared lock", || ctx.path_of(name.file_name()))?;
    let found = Found::open(ctx, name)?;
    let mut group = None;
    // The marker's kind: whether it is ours, and what it is.
    let mut kind = None;
    if let Some(found) = &found {
        let Some(record) = marker(&found.parsed) else {
            return Ok(Joined::NotShared);
        };
        group = record.group.clone();
        kind = Some((same_kind(record, mode), mode_of(record)));
    }
    let dir_name = members_dir(name.file_name());
    // A join that fails leaves no members directory it made (or found
    // empty): nobody else's, under the mutation lock, and what would be
    // left is nobody's either.
    let left_empty = |_: &Error| remove_members_dir(ctx, &dir_name);
    let dir = ensure_members(ctx, name).inspect_err(left_empty)?;
    let path = || ctx.path_of(&dir_name);
    let mut scan = scan(ctx, &dir, &path)?;
    remove_dead(ctx, &dir, &mut scan);
    let live: Vec<&Entry> = scan.live_members().collect();
    if let (Some(found), Some((same, held))) = (&found, kind) {
        if live.is_empty() {
            // Nobody holds it any more: remove the marker and start anew.
            remove_marker(ctx, name, found, mutation)?;
            return Ok(Joined::Again);
        }
        if !same {
            return Err(Error::kind_mismatch(name.as_str(), mode, held));
        }
    }
    // Holders of another kind whose marker was removed under them still
    // count: they hold until they notice.
    if let Some(other) = live
        .iter()
        .filter_map(|e| e.record())
        .find(|r| !same_kind(r, mode))
    {
        return Err(Error::kind_mismatch(name.as_str(), mode, mode_of(other)));
    }
    let busy = || Joined::Busy {
        owner: live.first().map(|e| Owner::from_parsed(&e.parsed)),
        recheck_at: None,
    };
    // At most one upgradable holder (see `fs/upgrade.rs`).
    if scan.live_waiters() > 0
        || (upgradable && live.iter().any(|e| super::members::is_upgradable(&e.file_name)))
    {
        return Ok(busy());
    }
    if let Mode::Permit(permits) = mode
        && live.len() >= permits as usize
    {
        return Ok(busy());
    }
    let group = group
        .or_else(|| live.iter().find_map(|e| e.record().and_then(|r| r.group.clone())))
        .unwrap_or_else(record::acquisition_id);
    if let Some(found) = found {
        // Our share of the marker's flock first: from then on no reader
        // testing its flock takes it for abandoned.
        let node = found.into_node();
        if !lock_shared(&node) {
            return Ok(Joined::Busy {
                owner: None,
                recheck_at: None,
            });
        }
        failpoint!("group.join.after_share").context("join shared lock", || ctx.path_of(name.file_name()))?;
        let mut member = Member::create(ctx, name, mode, group, dir, upgradable).inspect_err(left_empty)?;
        member.marker = Some(node);
        return Ok(Joined::Member(Box::new(member)));
    }
    let mut member = Member::create(ctx, name, mode, group, dir, upgradable).inspect_err(left_empty)?;
    // First holder (or the first since the marker was removed under the
    // holders): mark the lock path.
    let published = failpoint!("group.join.before_marker")
        .context("create lock", || ctx.path_of(name.file_name()))
        .and_then(|()| publish_marker(ctx, name, &member.record.to_bytes(0)));
    // Leaving takes the mutation lock: release ours first.
    drop(mutation);
    match published {
        Ok(Some(node)) => {
            member.marker = Some(node);
            Ok(Joined::Member(Box::new(member)))
        }
        // Taken exclusively between our look and now (creating needs no
        // mutation lock): not ours to join.
        Ok(None) => Ok(Joined::NotShared),
        Err(error) => Err(error),
    }
}

/// Takes a shared flock on a marker, waiting briefly for a reader that
/// tests it (such a test never holds it for long); `false` if it stays
/// taken exclusively.
fn lock_shared(node: &File) -> bool {
    for _ in 0..50 {
        match node.try_flock_shared() {
            Ok(()) => return true,
            Err(std::fs::TryLockError::WouldBlock) => std::thread::sleep(Duration::from_micros(200)),
            // No flock on this filesystem: nobody can test one either.
            Err(std::fs::TryLockError::Error(_)) => return true,
        }
    }
    false
}

/// Creates the marker at the lock path, holding `bytes`, with a shared
/// flock on it taken before anything is written (so that a reader of the
/// format, which promises a flock on every leasehold record, never finds
/// it free while the marker stands); returns the marker's node, or `None`
/// if the path is taken. The caller holds the mutation lock, so nobody
/// can remove the path meanwhile.
fn publish_marker(ctx: &Ctx, name: &LockName, bytes: &[u8]) -> Result<Option<File>> {
    match ctx.settings.strategy {
        Strategy::ExclusiveFile => {
            Ok(file::create(ctx, name, file::Hold::Shared, true, bytes)?.map(|made| made.file))
        }
        Strategy::Directory => directory::publish_bytes(ctx, name, bytes),
    }
}

/// Replaces the marker `found` (which the caller checked is its group's,
/// under the mutation lock) with `bytes`: the record of a live holder.
/// A marker file is rewritten in place, padded to its length on disk; a
/// directory's `owner.json` is replaced by rename. Either is an event
/// that wakes the waiters of other processes.
fn write_marker(ctx: &Ctx, name: &LockName, found: &Found, bytes: &[u8]) -> Result<()> {
    let path = || ctx.path_of(name.file_name());
    match ctx.settings.strategy {
        Strategy::ExclusiveFile => {
            let file = match syscall::open_at(ctx.dir.fd(), name.file_name(), Open::Write) {
                Ok(file) => file,
                Err(Errno::ENOENT) => return Ok(()),
                Err(e) => return Err(e).context("rewrite lock record", path),
            };
            let meta = syscall::meta(&file).context("rewrite lock record", path)?;
            if (meta.dev(), meta.ino()) != found.identity() || !meta.is_file() {
                return Ok(());
            }
            let len = usize::try_from(meta.len()).unwrap_or(usize::MAX);
            failpoint!("group.marker.before_rewrite")
                .and_then(|()| file.write_all_at(&padded(bytes, len), 0))
                .context("rewrite lock record", path)
        }
        Strategy::Directory => {
            directory::rewrite_bytes(found.node(), bytes, path)?;
            Ok(())
        }
    }
}

/// `bytes` (a record ending in a newline) padded with spaces before the
/// newline to at least `len` bytes, so no stale bytes remain after it.
fn padded(bytes: &[u8], len: usize) -> Vec<u8> {
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let mut out = body.to_vec();
    out.resize(len.max(body.len() + 1) - 1, b' ');
    out.push(b'\n');
    out
}

/// Removes the marker `found` from the lock path (the caller checked,
/// under `mutation`, that nobody holds it any more).
fn remove_marker(ctx: &Ctx, name: &LockName, found: &Found, mutation: MutationLock<'_>) -> Result<bool> {
    let (dev, ino) = found.identity();
    if !ctx.names(name, dev, ino)? {
        return Ok(false);
    }
    match ctx.settings.strategy {
        Strategy::ExclusiveFile => file::unlink(ctx, name),
        Strategy::Directory => directory::retire(ctx, name, found.node(), mutation),
    }
}
mod member;
mod sign;
mod waiter;

pub(crate) use member::Member;
pub(crate) use sign::Signers;
pub(super) use waiter::{announce, announced};
