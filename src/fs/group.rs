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
//! marker) happens under the name's mutation lock, but for joins and leaves
//! of a group that stands while another process holds that lock: those
//! count after their record is in place, and whoever ends a group seals
//! its members directory first ([`join_unlocked`], `members::Seal`). The
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
    self, Entry, JSON, TMP, WAITER, create_record, ensure_members, judge_entry, marker, members_dir, mode_of,
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
    // The mutation lock is held for a few syscalls at a time: one that
    // stays taken is another process's, slow or frozen while it changes
    // this name, and a group that stands is joined without it.
    let Some(mutation) = ctx.dir.lock_within(name.file_name(), JOIN_PATIENCE)? else {
        return join_unlocked(ctx, name, mode, upgradable);
    };
    join_locked(ctx, name, mode, upgradable, mutation, Wait::Briefly)
}

/// [`join`] without waiting for anything, for the caller's own thread
/// (a runtime's): `None` if the name's mutation lock is taken; `Again` if
/// a reader testing the marker's flock holds it this instant, the group
/// has more than [`AT_ONCE_ENTRIES`] entries, or its marker stands with
/// nobody holding (ending that group is left to the pool). Either way the caller
/// makes a whole attempt on the blocking pool instead. The join itself is
/// the same, under the mutation lock: a few short calls, and one look at
/// each member record.
pub(super) fn join_at_once(ctx: &Arc<Ctx>, name: &LockName, mode: Mode) -> Result<Option<Joined>> {
    let Some(mutation) = ctx.dir.lock_within(name.file_name(), Duration::ZERO)? else {
        return Ok(None);
    };
    join_locked(ctx, name, mode, false, mutation, Wait::Never).map(Some)
}

/// How many entries a members directory may hold for [`join_at_once`] to
/// read it on the caller's thread (each record is a few calls: opened,
/// read, judged); a larger group is joined on the blocking pool.
const AT_ONCE_ENTRIES: usize = 8;

/// Whether a join may wait (on the blocking pool) for a reader that tests
/// a marker's flock to let it go, and read a members directory of any
/// size.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    Briefly,
    Never,
}

fn join_locked(
    ctx: &Arc<Ctx>,
    name: &LockName,
    mode: Mode,
    upgradable: bool,
    mutation: MutationLock<'_>,
    wait: Wait,
) -> Result<Joined> {
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
    let (dir, made) = ensure_members(ctx, name).inspect_err(left_empty)?;
    let path = || ctx.path_of(&dir_name);
    let scan = match wait {
        // Empty, and ours alone until the mutation lock goes (see
        // `ensure_members`): nothing to read.
        _ if made => Some(members::Scan::default()),
        Wait::Briefly => Some(scan(ctx, &dir, &path)?),
        Wait::Never => members::scan_within(ctx, &dir, &path, AT_ONCE_ENTRIES)?,
    };
    let Some(mut scan) = scan else {
        return Ok(Joined::Again);
    };
    remove_dead(ctx, &dir, &mut scan);
    let live: Vec<&Entry> = scan.live_members().collect();
    if let (Some(found), Some((same, held))) = (&found, kind) {
        if live.is_empty() {
            // Ending a group may wait a few milliseconds (for its seal, for
            // a lock directory to empty): not on a runtime's thread.
            if wait == Wait::Never {
                return Ok(Joined::Again);
            }
            // Nobody holds it any more: remove the marker (if nobody joined
            // meanwhile without the mutation lock) and start anew.
            drop(scan);
            members::tidy(ctx, name, mutation, |mutation, then| {
                remove_marker(ctx, name, found, mutation, then)
            })?;
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
        if !lock_shared(&node, wait) {
            return Ok(match wait {
                Wait::Briefly => Joined::Busy {
                    owner: None,
                    recheck_at: None,
                },
                Wait::Never => Joined::Again,
            });
        }
        after_share(ctx, name)?;
        let mut member = Member::create(ctx, name, mode, group, dir, upgradable).inspect_err(left_empty)?;
        member.marker = Some(node);
        // Counted again with our record in place: others join without
        // the mutation lock, counting after their records are in place.
        return admit(ctx, name, member, mode, upgradable, mutation);
    }
    let mut member = Member::create(ctx, name, mode, group, dir, upgradable).inspect_err(left_empty)?;
    // First holder (or the first since the marker was removed under the
    // holders): mark the lock path.
    let published = failpoint!("group.join.before_marker")
        .context("create lock", || ctx.path_of(name.file_name()))
        .and_then(|()| publish_marker(ctx, name, &member.record.to_bytes(0), wait == Wait::Briefly));
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

/// How long a join waits for the name's mutation lock before it joins
/// without it: the lock is held for a few syscalls at a time.
const JOIN_PATIENCE: Duration = Duration::from_millis(2);

/// Joins a group that stands, without the name's mutation lock (another
/// process holds it: slow, or frozen while it changes this name). Our
/// record goes in first; then we count, look for the seal, and look at
/// the marker and the members directory again, and withdraw (our record
/// removed) if any of them says no:
///
/// - the count, waiting exclusive acquisitions and the kinds, as under
///   the lock (others who join at the same instant count us, as we count
///   them: at worst both withdraw and try again);
/// - the seal (`members::Seal`): a process that ends the group or
///   upgrades seals the members directory before it counts, so either it
///   counts our record (in place before our look) or we see its seal;
/// - after the seal, the marker: still the one we found, of our group (a
///   sealer removes the marker before it removes its seal).
///
/// A group whose holders have all left while its end waits for the lock
/// (its last leaver is slow, or frozen before it seals) still stands, if
/// its marker's lease has a quarter lease to run: we join it, and sign
/// the marker with our record before we are done (so that programs that
/// judge the name by the marker's lease see ours), then look at it once
/// more. A group that does not stand (no marker, one being ended under
/// the seal, one whose marker's lease is nearly out) is started or
/// cleared only under the lock: `Busy` until then.
/// The step after a joiner took its share of a standing group's marker,
/// before anything of it is written, on both roads (with the mutation
/// lock and without it): under Wine a join finds the lock busy for 2 ms
/// often enough that a trace of one road alone missed the point.
fn after_share(ctx: &Ctx, name: &LockName) -> Result<()> {
    failpoint!("group.join.after_share").context("join shared lock", || ctx.path_of(name.file_name()))
}

fn join_unlocked(ctx: &Arc<Ctx>, name: &LockName, mode: Mode, upgradable: bool) -> Result<Joined> {
    let busy = |owner: Option<Owner>| {
        Ok(Joined::Busy {
            owner,
            recheck_at: Some(SystemTime::now() + Duration::from_millis(5)),
        })
    };
    let Some(found) = Found::open(ctx, name)? else {
        return busy(None);
    };
    let Some(record) = marker(&found.parsed) else {
        return Ok(Joined::NotShared);
    };
    let group = record.group.clone();
    let Some(group_id) = group.clone() else {
        return busy(Some(found.owner()));
    };
    let Some(dir) = open_members(ctx, name)? else {
        return busy(Some(found.owner()));
    };
    let dir_name = members_dir(name.file_name());
    let path = || ctx.path_of(&dir_name);
    let dir_id = syscall::meta(&dir).context("inspect members directory", path)?;
    let dir_id = (dir_id.dev(), dir_id.ino());
    let standing = scan(ctx, &dir, &path)?;
    let deserted = standing.live_members().next().is_none();
    let lasts = |record: &crate::record::Record| {
        let quarter = SystemTime::now() + ctx.settings.lease / 4;
        record.lease_expires_at.is_some_and(|end| end > quarter)
    };
    if members::sealed(&dir) || (deserted && !lasts(record)) {
        return busy(Some(found.owner()));
    }
    if !same_kind(record, mode) {
        return Err(Error::kind_mismatch(name.as_str(), mode, mode_of(record)));
    }
    if let Some(refused) = refusal(name, &standing, mode, upgradable, None)? {
        return Ok(refused);
    }
    let identity = found.identity();
    let node = found.into_node();
    if !lock_shared(&node, Wait::Briefly) {
        return busy(None);
    }
    after_share(ctx, name)?;
    failpoint!("unlocked.join.before_record").context("join shared lock", path)?;
    let mut member = match Member::create(ctx, name, mode, group_id, dir, upgradable) {
        Ok(member) => member,
        // Our unfinished record was taken for a dead process's (removed,
        // or its flock taken for an instant by the test of a process under
        // the mutation lock, which may be frozen in that instant:
        // `remove_dead`), or the directory went (its group ended): try
        // again, under another name.
        Err(error) if error.is_not_found() || error.is_would_block() => return busy(None),
        // Our private name was in the members directory meanwhile: a
        // group's end may have failed its `rmdir` on it, and left the
        // directory, empty now and nobody's (as a marker's signer's may).
        Err(error) => {
            waiter::tidy_members(ctx, name, Duration::ZERO);
            return Err(error);
        }
    };
    member.marker = Some(node);
    // Ours alone: removed at once, whatever the mutation lock (and the
    // group ended if nobody else holds: `Member::withdraw`).
    let withdraw = |member: Member| member.withdraw(None);
    if let Err(error) = failpoint!("unlocked.join.after_record").context("join shared lock", path) {
        withdraw(member);
        return Err(error);
    }
    let counted = match members::scan_others(ctx, member.members(), &path, member.file_name()) {
        Ok(counted) => counted,
        Err(error) => {
            withdraw(member);
            return Err(error);
        }
    };
    match refusal(name, &counted, mode, upgradable, Some(member.file_name())) {
        Ok(None) => {}
        refused => {
            withdraw(member);
            return refused.map(|refused| refused.unwrap_or(Joined::Again));
        }
    }
    // The seal, then the marker, then the directory's name: in this order
    // (see above).
    let standing = !members::sealed(member.members())
        // The node we found, which we keep open: so our group's, however
        // it reads (a marker file rewritten in place can read torn).
        && Found::open(ctx, name)?.is_some_and(|now| now.identity() == identity)
        && syscall::stat_at(ctx.dir.fd(), &dir_name).is_ok_and(|st| (st.dev, st.ino) == dir_id);
    // Alone in a deserted group: the marker takes our record now.
    let signed = || {
        // (`counted` holds the others only.)
        let alone = counted.live_members().next().is_none();
        !alone || member.sign_as_representative().unwrap_or(false)
    };
    if !standing || !signed() {
        withdraw(member);
        return busy(None);
    }
    Ok(Joined::Member(Box::new(member)))
}

/// Why `mode` may not hold beside the live members of `scan` (`None` if
/// it may): a waiting exclusive acquisition, another kind, no free
/// permit, another upgradable holder. `own`, our record once it is in
/// place, counts as one of the permits and is never another upgradable
/// holder.
fn refusal(
    name: &LockName,
    scan: &members::Scan,
    mode: Mode,
    upgradable: bool,
    own: Option<&str>,
) -> Result<Option<Joined>> {
    let live: Vec<&Entry> = scan.live_members().collect();
    if let Some(other) = live
        .iter()
        .filter_map(|e| e.record())
        .find(|r| !same_kind(r, mode))
    {
        return Err(Error::kind_mismatch(name.as_str(), mode, mode_of(other)));
    }
    let others = live.iter().filter(|e| Some(e.file_name.as_str()) != own);
    let full = match mode {
        Mode::Permit(permits) => others.clone().count() >= permits as usize,
        _ => false,
    };
    let up = upgradable
        && others
            .clone()
            .any(|e| super::members::is_upgradable(&e.file_name));
    if scan.live_waiters() > 0 || full || up {
        return Ok(Some(Joined::Busy {
            owner: others.map(|e| Owner::from_parsed(&e.parsed)).next(),
            recheck_at: None,
        }));
    }
    Ok(None)
}

/// Keeps `member` if it may hold beside the live members counted now
/// (under the mutation lock, with its record in place), withdraws it if
/// not (ending the group if the holders it counted have all left since,
/// having counted it: `Member::withdraw`).
fn admit(
    ctx: &Ctx,
    name: &LockName,
    member: Member,
    mode: Mode,
    upgradable: bool,
    mutation: MutationLock<'_>,
) -> Result<Joined> {
    let dir_name = members_dir(name.file_name());
    let path = || ctx.path_of(&dir_name);
    let scan = members::scan_others(ctx, member.members(), &path, member.file_name())?;
    match refusal(name, &scan, mode, upgradable, Some(member.file_name())) {
        Ok(None) => Ok(Joined::Member(Box::new(member))),
        other => {
            member.withdraw(Some(mutation));
            other.map(|refused| refused.unwrap_or(Joined::Again))
        }
    }
}

/// Takes a shared flock on a marker, waiting briefly for a reader that
/// tests it (such a test never holds it for long); `false` if it stays
/// taken exclusively (at once, if `wait` is `Never`).
fn lock_shared(node: &File, wait: Wait) -> bool {
    let tries = match wait {
        Wait::Briefly => 50,
        Wait::Never => 1,
    };
    for tried in 1..=tries {
        match node.try_flock_shared() {
            Ok(()) => return true,
            Err(std::fs::TryLockError::WouldBlock) if tried < tries => {
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(std::fs::TryLockError::WouldBlock) => {}
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
/// can remove the path meanwhile. `patient`: a marker file waits briefly
/// for a reader testing its flock (see `file::create`).
fn publish_marker(ctx: &Ctx, name: &LockName, bytes: &[u8], patient: bool) -> Result<Option<File>> {
    match ctx.settings.strategy {
        Strategy::ExclusiveFile => {
            Ok(file::create(ctx, name, file::Hold::Shared, patient, bytes)?.map(|made| made.file))
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
/// under `mutation`, that nobody holds it any more), and runs `then` once
/// it is gone, before the mutation lock goes (see `members::tidy`).
fn remove_marker(
    ctx: &Ctx,
    name: &LockName,
    found: &Found,
    mutation: MutationLock<'_>,
    then: &dyn Fn(),
) -> Result<bool> {
    let (dev, ino) = found.identity();
    if !ctx.names(name, dev, ino)? {
        return Ok(false);
    }
    match ctx.settings.strategy {
        Strategy::ExclusiveFile => {
            let removed = file::unlink_judged(ctx, name, (dev, ino))?;
            if removed {
                then();
            }
            drop(mutation);
            Ok(removed)
        }
        Strategy::Directory => directory::retire(ctx, name, found.node(), mutation, then),
    }
}
mod member;
mod sign;
mod waiter;

pub(crate) use member::Member;
pub(crate) use sign::Signers;
pub(super) use waiter::{announce, announced};
