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

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::context::Ctx;
use super::found::Found;
use super::layout::Strategy;
use super::mutex::MutationLock;
use super::syscall::{self, Errno, Open, read_record};
use super::{directory, file};
use crate::backend::{Inspection, Mode};
use crate::error::{Error, IoResultExt, Result};
use crate::name::LockName;
use crate::owner::Owner;
use crate::record::{self, OwnRecord, Parsed, Record};
use crate::stale::{self, Evidence, StaleReason, Verdict};

const MEMBER: &str = "m-";
const WAITER: &str = "w-";
const JSON: &str = ".json";
/// A record being written, before it is renamed to its name.
const TMP: &str = ".tmp-";

/// The members directory of `name`.
pub(super) fn members_dir(file_name: &str) -> String {
    format!("{file_name}.members")
}

/// Whether a record's kind is `mode`.
fn same_kind(record: &Record, mode: Mode) -> bool {
    match mode {
        Mode::Exclusive => record.mode.is_none(),
        Mode::Shared => record.mode.as_deref() == Some("shared"),
        Mode::Permit(n) => {
            record.mode.as_deref() == Some("semaphore") && record.permits == Some(u64::from(n))
        }
    }
}

/// The kind a marker or member record says.
pub(super) fn mode_of(record: &Record) -> Mode {
    match (record.mode.as_deref(), record.permits) {
        (Some("semaphore"), Some(n)) => Mode::Permit(u32::try_from(n).unwrap_or(u32::MAX)),
        (Some(_), _) => Mode::Shared,
        (None, _) => Mode::Exclusive,
    }
}

/// The marker's record, if `parsed` is a shared lock's or a semaphore's
/// marker (written by leasehold, with a `mode`).
pub(super) fn marker(parsed: &Parsed) -> Option<&Record> {
    match parsed {
        Parsed::Record(r) if r.is_leasehold() && r.mode.is_some() => Some(r),
        _ => None,
    }
}

/// One record in a members directory, judged.
struct Entry {
    file_name: String,
    bytes: Vec<u8>,
    parsed: Parsed,
    live: bool,
    reason: Option<StaleReason>,
    mtime: SystemTime,
}

impl Entry {
    fn record(&self) -> Option<&Record> {
        match &self.parsed {
            Parsed::Record(r) => Some(r),
            _ => None,
        }
    }

    /// When its lease ends, as far as its record says.
    fn lease_end(&self) -> SystemTime {
        self.record()
            .and_then(|r| r.lease_expires_at)
            .unwrap_or(self.mtime)
    }

    /// When it was acquired, as far as its record says.
    fn acquired(&self) -> SystemTime {
        self.record().and_then(|r| r.acquired_at).unwrap_or(self.mtime)
    }

    fn is_member(&self) -> bool {
        self.file_name.starts_with(MEMBER)
    }
}

/// The records of a members directory: holders and waiters, judged.
struct Scan {
    members: Vec<Entry>,
    waiters: Vec<Entry>,
    /// Private names of records being made (see `create_record`).
    unfinished: Vec<String>,
}

impl Scan {
    fn live_members(&self) -> impl Iterator<Item = &Entry> {
        self.members.iter().filter(|e| e.live)
    }

    fn live_waiters(&self) -> usize {
        self.waiters.iter().filter(|e| e.live).count()
    }
}

/// Opens the members directory of `name`; `None` if there is none.
fn open_members(ctx: &Ctx, name: &LockName) -> Result<Option<File>> {
    let dir_name = members_dir(name.file_name());
    match syscall::open_at(ctx.dir.fd(), dir_name.as_str(), Open::Dir) {
        Ok(dir) => Ok(Some(dir)),
        // Absent, or something that is not a directory (never followed).
        Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => Ok(None),
        Err(e) => Err(e).context("open members directory", || ctx.path_of(&dir_name)),
    }
}

/// Opens the members directory of `name`, creating it if needed (under the
/// mutation lock).
fn ensure_members(ctx: &Ctx, name: &LockName) -> Result<File> {
    let dir_name = members_dir(name.file_name());
    match syscall::mkdir_at(ctx.dir.fd(), &dir_name) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(e).context("create members directory", || ctx.path_of(&dir_name)),
    }
    failpoint!("group.members.after_mkdir").context("open members directory", || ctx.path_of(&dir_name))?;
    match syscall::open_at(ctx.dir.fd(), dir_name.as_str(), Open::Dir) {
        Ok(dir) => Ok(dir),
        Err(Errno::ENOTDIR | Errno::ELOOP) => Err(Error::UnexpectedFile {
            name: name.as_str().to_owned(),
            path: ctx.path_of(&dir_name),
            found: "something other than a directory",
        }),
        Err(e) => Err(e).context("open members directory", || ctx.path_of(&dir_name)),
    }
}

/// Creates the record `file_name` in the members directory `dir`, whole:
/// written (and synced when `durable`) under a private name with our
/// flock on it, then renamed, so nobody ever finds an empty or half-made
/// record of a live holder. The caller holds the mutation lock (under
/// which any private name still there belongs to a process that died
/// making it: see `remove_dead`). Returns the record open, flocked.
fn create_record(
    dir: &File,
    file_name: &str,
    record: &OwnRecord,
    durable: bool,
    path: &dyn Fn() -> PathBuf,
) -> Result<(File, usize)> {
    let tmp = format!("{TMP}{file_name}");
    let file = syscall::open_at(dir, tmp.as_str(), Open::CreateNew).context("create member record", path)?;
    // Brand new, and a private name nobody tests: the flock is free.
    let made = failpoint!("group.record.after_open")
        .and_then(|()| file.try_lock().map_err(std::io::Error::from))
        .context("lock member record", path)
        .and_then(|()| file::write(&file, 0, record, durable, path))
        .and_then(|len| {
            failpoint!("group.record.before_rename")
                .and_then(|()| Ok(syscall::rename_at(dir, &tmp, file_name)?))
                .context("create member record", path)
                .map(|()| len)
        });
    match made {
        Ok(len) => Ok((file, len)),
        Err(error) => {
            let _ = syscall::unlink_at(dir, tmp.as_str());
            Err(error)
        }
    }
}

/// Reads and judges every record of the members directory `dir`. Entries
/// of other shapes are ignored, never touched.
fn scan(ctx: &Ctx, dir: &File, path: &dyn Fn() -> PathBuf) -> Result<Scan> {
    let mut found = Scan {
        members: Vec::new(),
        waiters: Vec::new(),
        unfinished: Vec::new(),
    };
    let names = syscall::list_at(dir).context("list members directory", path)?;
    for name in names {
        let Some(name) = name.to_str() else { continue };
        if name.starts_with(TMP) && name.ends_with(JSON) {
            found.unfinished.push(name.to_owned());
            continue;
        }
        let waiter = name.starts_with(WAITER);
        if !(name.starts_with(MEMBER) || waiter) || !name.ends_with(JSON) {
            continue;
        }
        let Some(entry) = judge_entry(ctx, dir, name)? else {
            continue;
        };
        if waiter {
            found.waiters.push(entry);
        } else {
            found.members.push(entry);
        }
    }
    // Longest held first.
    found.members.sort_by_key(Entry::acquired);
    Ok(found)
}

/// Reads and judges one record; `None` if it vanished or is not a regular
/// file.
fn judge_entry(ctx: &Ctx, dir: &File, name: &str) -> Result<Option<Entry>> {
    let file = match syscall::open_at(dir, name, Open::Read) {
        Ok(file) => file,
        Err(Errno::ENOENT | Errno::ELOOP | Errno::ENXIO | Errno::EISDIR) => return Ok(None),
        Err(e) => return Err(e).context("open member record", || PathBuf::from(name)),
    };
    let meta = file
        .metadata()
        .context("inspect member record", || PathBuf::from(name))?;
    if !meta.is_file() {
        return Ok(None);
    }
    let bytes = read_record(&file).context("read member record", || PathBuf::from(name))?;
    let parsed = record::parse(&bytes);
    let mtime = meta.modified().unwrap_or(UNIX_EPOCH);
    let mut evidence = Evidence {
        parsed: &parsed,
        mtime,
        flock_free: None,
        known_for: ctx.known_for(meta.dev(), meta.ino()),
    };
    let host = stale::System;
    let mut verdict = stale::judge(&evidence, ctx.rules(), &host);
    if verdict == Verdict::NeedsFlockTest {
        // A free flock means its holder is gone; ours is dropped with
        // `file` right after.
        evidence.flock_free = Some(file.try_lock().is_ok());
        verdict = stale::judge(&evidence, ctx.rules(), &host);
    }
    let reason = match verdict {
        Verdict::Stale(reason) => Some(reason),
        // Only leasehold writes in a members directory, under names of its
        // own: what no writer produces there is no holder, and removed.
        Verdict::NotALock => Some(StaleReason::Unreadable),
        _ => None,
    };
    Ok(Some(Entry {
        file_name: name.to_owned(),
        live: reason.is_none(),
        bytes,
        parsed,
        reason,
        mtime,
    }))
}

/// Removes the records of `scan` that were judged stale, and records left
/// unfinished. Under the name's mutation lock, so nobody is making one.
///
/// Holders renew their records without that lock, so each record is read
/// again first and kept if it changed: a renewal that completed before
/// this second look is seen (and the holder lives on), and one that
/// completes after it came after the lease's end, which its holder
/// reports as a loss of its own.
fn remove_dead(ctx: &Ctx, dir: &File, scan: &mut Scan) {
    for name in scan.unfinished.drain(..) {
        let _ = syscall::unlink_at(dir, name.as_str());
    }
    let renewed = |entry: &Entry| match syscall::open_at(dir, entry.file_name.as_str(), Open::Read) {
        Ok(file) => read_record(&file).map_or(true, |now| now != entry.bytes),
        // Gone already: nothing to remove.
        Err(_) => false,
    };
    for entries in [&mut scan.members, &mut scan.waiters] {
        entries.retain_mut(|entry| {
            if entry.live {
                return true;
            }
            if renewed(entry) {
                entry.live = true;
                entry.reason = None;
                return true;
            }
            let unlinked = failpoint!("group.reclaim.before_unlink").map_err(|_| Errno::EIO);
            match unlinked.and_then(|()| syscall::unlink_at(dir, entry.file_name.as_str())) {
                Ok(()) | Err(Errno::ENOENT) => {
                    if let Some(reason) = entry.reason
                        && entry.is_member()
                    {
                        ctx.counters.reclaimed(reason);
                    }
                }
                Err(error) => {
                    tracing::debug!(entry = entry.file_name, %error, "could not remove a stale member")
                }
            }
            false
        });
    }
}

/// Whether a holder of the shared lock (or semaphore) marked at `name` is
/// alive, for judging the marker. Only reads.
pub(super) fn judge_marker(ctx: &Ctx, name: &LockName) -> Result<Verdict> {
    let Some(dir) = open_members(ctx, name)? else {
        return Ok(Verdict::Stale(StaleReason::DeadOwner));
    };
    let path = || ctx.path_of(&members_dir(name.file_name()));
    let scan = scan(ctx, &dir, &path)?;
    if scan.live_members().next().is_some() {
        return Ok(Verdict::Live);
    }
    let reason = scan.members.iter().find_map(|e| e.reason);
    Ok(Verdict::Stale(reason.unwrap_or(StaleReason::DeadOwner)))
}

/// The live holders of the shared lock (or semaphore) `name`, oldest
/// first. Only reads.
pub(super) fn holders(ctx: &Ctx, name: &LockName) -> Result<Vec<Owner>> {
    let Some(dir) = open_members(ctx, name)? else {
        return Ok(Vec::new());
    };
    let path = || ctx.path_of(&members_dir(name.file_name()));
    let scan = scan(ctx, &dir, &path)?;
    Ok(scan
        .live_members()
        .map(|e| Owner::from_parsed(&e.parsed))
        .collect())
}

/// Before a stale marker is removed (under the mutation lock): removes
/// the dead members, and the members directory if nothing is left in it.
/// `true` if a live member remains, and so the marker must stay.
pub(super) fn tidy(ctx: &Ctx, name: &LockName) -> Result<bool> {
    let Some(dir) = open_members(ctx, name)? else {
        return Ok(false);
    };
    let dir_name = members_dir(name.file_name());
    let path = || ctx.path_of(&dir_name);
    let mut scan = scan(ctx, &dir, &path)?;
    remove_dead(ctx, &dir, &mut scan);
    if scan.live_members().next().is_some() {
        return Ok(true);
    }
    if scan.waiters.is_empty() {
        remove_members_dir(ctx, &dir_name);
    }
    Ok(false)
}

/// Members directories whose lock path is gone (a crash between two
/// steps, an announcement whose waiter died): their dead records are
/// removed, and the directory too once nothing live is left in it. Those
/// cleaned (or, with `dry_run`, that would be) are returned.
pub(super) fn clean_orphans(ctx: &Ctx, dry_run: bool) -> Result<Vec<(LockName, Inspection)>> {
    let suffix = members_dir("");
    let mut cleaned = Vec::new();
    for dir_name in ctx.entries(|name| name.ends_with(&suffix))? {
        let lock = &dir_name[..dir_name.len() - suffix.len()];
        if ctx.path_taken(&LockName::from_file_name(lock)) {
            continue;
        }
        let inspection = || Inspection {
            owner: Owner::from_parsed(&Parsed::Unreadable),
            holders: Vec::new(),
            mode: Mode::Shared,
            stale: Some(StaleReason::Leftover),
            path: Some(ctx.path_of(&dir_name)),
        };
        let Some(_mutation) = ctx.dir.try_mutation_lock(lock)? else {
            continue;
        };
        let name = LockName::from_file_name(lock);
        if ctx.path_taken(&name) {
            continue;
        }
        let Some(dir) = open_members(ctx, &name)? else {
            continue;
        };
        let path = || ctx.path_of(&dir_name);
        let mut scan = scan(ctx, &dir, &path)?;
        let live = scan.live_members().count() + scan.live_waiters();
        if dry_run {
            if live == 0 {
                cleaned.push((name, inspection()));
            }
            continue;
        }
        remove_dead(ctx, &dir, &mut scan);
        if live == 0 {
            remove_members_dir(ctx, &dir_name);
            cleaned.push((name, inspection()));
        }
    }
    Ok(cleaned)
}

/// Removes an empty members directory; one that is not empty (a waiter,
/// a stranger's file) stays.
fn remove_members_dir(ctx: &Ctx, dir_name: &str) {
    let removable = failpoint!("group.members.before_rmdir").map_err(|_| Errno::EIO);
    match removable.and_then(|()| syscall::rmdir_at(ctx.dir.fd(), dir_name)) {
        Ok(()) | Err(Errno::ENOENT | Errno::ENOTEMPTY | Errno::EEXIST) => {}
        Err(error) => tracing::debug!(dir = dir_name, %error, "could not remove a members directory"),
    }
}

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
pub(super) fn join(ctx: &Arc<Ctx>, name: &LockName, mode: Mode) -> Result<Joined> {
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
    if scan.live_waiters() > 0 {
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
        let mut member = Member::create(ctx, name, mode, group, dir).inspect_err(left_empty)?;
        member.marker = Some(node);
        return Ok(Joined::Member(Box::new(member)));
    }
    let mut member = Member::create(ctx, name, mode, group, dir).inspect_err(left_empty)?;
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
        match node.try_lock_shared() {
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
    match ctx.strategy {
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
    match ctx.strategy {
        Strategy::ExclusiveFile => {
            let file = match syscall::open_at(ctx.dir.fd(), name.file_name(), Open::Write) {
                Ok(file) => file,
                Err(Errno::ENOENT) => return Ok(()),
                Err(e) => return Err(e).context("rewrite lock record", path),
            };
            let meta = file.metadata().context("rewrite lock record", path)?;
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
    match ctx.strategy {
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
