//! The members directory of a shared lock or semaphore,
//! `<lock path>.members/`: its names, its records (members `m-<uuid>.json`,
//! waiting exclusive acquisitions `w-<uuid>.json`), reading and judging
//! them, and removing the dead (docs/format.md, *Shared locks and
//! semaphores*). Joining, leaving and the marker are `group.rs`'s; judging
//! a marker by its members is here, below both `group.rs` and `found.rs`.

use super::context::Ctx;
use super::context::read_record;
use super::file;
use super::mutex::{MutationLock, seal, unseal};
use crate::backend::{Inspection, Mode};
use crate::error::{Error, IoResultExt, Result};
use crate::name::LockName;
use crate::owner::Owner;
use crate::record::{self, OwnRecord, Parsed, Record};
use crate::stale::{self, Evidence, StaleReason, Verdict};
use crate::sys::syscall::Flock;
use crate::sys::syscall::{self, Errno, Open};
use std::fs::File;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

pub(super) const MEMBER: &str = "m-";
/// What an upgradable holder's record file name starts with, after `m-`
/// (see `fs/upgrade.rs`).
const UPGRADABLE: &str = "up-";

/// The file name of a member record.
pub(super) fn member_file(uuid: &str, upgradable: bool) -> String {
    let up = if upgradable { UPGRADABLE } else { "" };
    format!("{MEMBER}{up}{uuid}{JSON}")
}

/// Whether a member record's file name is an upgradable holder's.
pub(super) fn is_upgradable(file_name: &str) -> bool {
    file_name
        .strip_prefix(MEMBER)
        .is_some_and(|rest| rest.starts_with(UPGRADABLE))
}
/// The seal of a members directory: an empty file that a process
/// holding the name's mutation lock makes before it counts the members to
/// end the group (remove the marker) or to turn it into an exclusive lock
/// (an upgrade), and removes before it lets that lock go. A joiner that
/// joins without the mutation lock (`group::join`) looks for it after its
/// record is in place and withdraws if it is there: so a holder that
/// joined without the lock either is counted by the sealer or sees the
/// seal (docs/format.md, *Joining without the mutation lock*).
pub(super) use super::mutex::SEAL;

/// A members directory's seal, removed when dropped. The caller drops it
/// before the name's mutation lock goes (a seal that outlived it would be
/// taken for a dead sealer's and sealed over by the lock's next holder,
/// whose seal it would then remove); `tidy` leaves it to the mutation lock
/// itself (`MutationLock::seal`).
pub(super) struct Seal {
    /// The members directory, open.
    dir: File,
    /// The seal, open, under our flock.
    held: Option<File>,
}

impl Seal {
    /// Seals `dir`. The caller holds the name's mutation lock, so a seal
    /// already there is a dead sealer's, and now ours.
    pub(super) fn new(dir: &File, path: &dyn Fn() -> PathBuf) -> Result<Self> {
        let dir = dir.try_clone().context("seal members directory", path)?;
        let held = Some(seal(&dir, path)?);
        Ok(Seal { dir, held })
    }
}

impl Drop for Seal {
    fn drop(&mut self) {
        // Closed first: on Windows an unlinked file that is still open
        // keeps a (pending) name in the directory, which then cannot be
        // removed. Our change is done or given up by now, so the seal's
        // free flock for an instant keeps out nobody who should be.
        drop(self.held.take());
        unseal(&self.dir);
    }
}

/// Whether `dir` is sealed by a live sealer: the seal is there and its
/// flock is held (an error counts as sealed: the joiner backs off and
/// joins under the mutation lock).
pub(super) fn sealed(dir: &File) -> bool {
    match syscall::open_at(dir, SEAL, Open::Read) {
        Err(Errno::ENOENT) => false,
        Err(_) => true,
        // Our test holds the flock for an instant only (the file closes).
        Ok(file) => file.try_flock().is_err(),
    }
}

/// Removes a dead sealer's seal; the caller holds the name's mutation
/// lock (a live sealer removes its own before letting it go).
pub(super) fn unseal_dead(dir: &File) {
    match syscall::unlink_at(dir, SEAL) {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(error) => tracing::debug!(%error, "could not remove a dead process's seal"),
    }
}

pub(super) const WAITER: &str = "w-";
pub(super) const JSON: &str = ".json";
/// A record being written, before it is renamed to its name.
pub(super) const TMP: &str = ".tmp-";

/// The members directory of `name`.
pub(super) fn members_dir(file_name: &str) -> String {
    format!("{file_name}.members")
}

/// What a semaphore's waiter standing in line sees at `name` (see
/// `fs/line.rs`): `None` while a permit is free (nothing at the lock path,
/// or fewer member records than `permits`), else the lock path's inode
/// and a digest of the member records' names. A member's record name is
/// new at each acquisition, so the digest changes whenever a permit
/// changes hands, even while the group (and its marker) stands. A look
/// that fails sees the lock path alone.
pub(super) fn seen_by_permit_waiter(ctx: &Ctx, name: &LockName, permits: u32) -> Option<(u64, u64)> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    // Which file is there (not its inode number alone: see
    // `syscall::instance_at`), for a lock path without members.
    let instance = syscall::instance_at(ctx.dir.fd(), name.file_name()).ok()?;
    let Ok(Some(dir)) = open_members(ctx, name) else {
        return Some(instance);
    };
    let Ok(names) = syscall::list_at(&dir) else {
        return Some(instance);
    };
    let mut count = 0u64;
    let mut digest = 0u64;
    for entry in &names {
        let Some(entry) = entry.to_str() else { continue };
        if entry.starts_with(MEMBER) && entry.ends_with(JSON) {
            count += 1;
            let mut hasher = DefaultHasher::new();
            entry.hash(&mut hasher);
            // Each name is unique: the sum does not depend on the order.
            digest = digest.wrapping_add(hasher.finish());
        }
    }
    (count >= u64::from(permits)).then_some((instance.0, digest))
}

/// Whether a record's kind is `mode`.
pub(super) fn same_kind(record: &Record, mode: Mode) -> bool {
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
pub(super) struct Entry {
    pub(super) file_name: String,
    pub(super) bytes: Vec<u8>,
    pub(super) parsed: Parsed,
    pub(super) live: bool,
    pub(super) reason: Option<StaleReason>,
    pub(super) mtime: SystemTime,
}

impl Entry {
    pub(super) fn record(&self) -> Option<&Record> {
        match &self.parsed {
            Parsed::Record(r) => Some(r),
            _ => None,
        }
    }

    /// When its lease ends, as far as its record says.
    pub(super) fn lease_end(&self) -> SystemTime {
        self.record()
            .and_then(|r| r.lease_expires_at)
            .unwrap_or(self.mtime)
    }

    /// When it was acquired, as far as its record says.
    pub(super) fn acquired(&self) -> SystemTime {
        self.record().and_then(|r| r.acquired_at).unwrap_or(self.mtime)
    }

    pub(super) fn is_member(&self) -> bool {
        self.file_name.starts_with(MEMBER)
    }
}

/// The records of a members directory: holders and waiters, judged.
#[derive(Default)]
pub(super) struct Scan {
    pub(super) members: Vec<Entry>,
    pub(super) waiters: Vec<Entry>,
    /// Private names of records being made (see `create_record`).
    pub(super) unfinished: Vec<String>,
}

impl Scan {
    pub(super) fn live_members(&self) -> impl Iterator<Item = &Entry> {
        self.members.iter().filter(|e| e.live)
    }

    pub(super) fn live_waiters(&self) -> usize {
        self.waiters.iter().filter(|e| e.live).count()
    }
}

/// Opens the members directory of `name`; `None` if there is none.
pub(super) fn open_members(ctx: &Ctx, name: &LockName) -> Result<Option<File>> {
    let dir_name = members_dir(name.file_name());
    match syscall::open_at(ctx.dir.fd(), dir_name.as_str(), Open::Dir) {
        Ok(dir) => Ok(Some(dir)),
        // Absent, or something that is not a directory (never followed).
        Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => Ok(None),
        Err(e) => Err(e).context("open members directory", || ctx.path_of(&dir_name)),
    }
}

/// Opens the members directory of `name`, creating it if needed (under the
/// mutation lock); `true` with it if we made it, just now.
///
/// A directory we made is empty, and stays so while we hold the name's
/// mutation lock: records and announcements go in under that lock, and a
/// joiner without it joins only a group whose marker stands, which a
/// caller that found no marker has not made yet (a stale joiner's record
/// is withdrawn by the joiner, as in a directory we did not make). So
/// nothing in it needs reading or removing: a new group costs no listing.
pub(super) fn ensure_members(ctx: &Ctx, name: &LockName) -> Result<(File, bool)> {
    let dir_name = members_dir(name.file_name());
    let mut tries = 0;
    loop {
        tries += 1;
        let made = match syscall::mkdir_at(ctx.dir.fd(), &dir_name) {
            Ok(()) => true,
            Err(Errno::EEXIST) => false,
            Err(e) => return Err(e).context("create members directory", || ctx.path_of(&dir_name)),
        };
        failpoint!("group.members.after_mkdir")
            .context("open members directory", || ctx.path_of(&dir_name))?;
        match syscall::open_at(ctx.dir.fd(), dir_name.as_str(), Open::Dir) {
            Ok(dir) => {
                // The caller holds the name's mutation lock, so a seal in a
                // directory that was there is a dead sealer's.
                if !made {
                    unseal_dead(&dir);
                }
                return Ok((dir, made));
            }
            // Gone since our `mkdir` found it: a directory removed (at a
            // group's end, under the mutation lock) while another handle
            // had it open stays, on Windows and under Wine, until that
            // handle closes, whenever that is. Made again (a few times:
            // each such handle closes once).
            Err(Errno::ENOENT) if tries < ENSURE_TRIES => {}
            Err(Errno::ENOTDIR | Errno::ELOOP) => {
                return Err(Error::UnexpectedFile {
                    name: name.as_str().to_owned(),
                    path: ctx.path_of(&dir_name),
                    found: "something other than a directory",
                });
            }
            Err(e) => return Err(e).context("open members directory", || ctx.path_of(&dir_name)),
        }
    }
}

/// How many times [`ensure_members`] makes a members directory that went
/// between its `mkdir` and its open.
const ENSURE_TRIES: u32 = 8;

/// Creates the record `file_name` in the members directory `dir`, whole:
/// written (and synced when `durable`) under a private name with our
/// flock on it, then renamed, so nobody ever finds an empty or half-made
/// record of a live holder. The caller holds the mutation lock (under
/// which any private name still there belongs to a process that died
/// making it: see `remove_dead`). Returns the record open, flocked, its
/// length and its identity (dev, ino), taken before the rename: Wine
/// cannot tell the volume of a handle whose file was renamed by path since
/// it was opened (its serial reads 0), Windows and Unix can, and a rename
/// changes no file's identity.
pub(super) fn create_record(
    dir: &File,
    file_name: &str,
    record: &OwnRecord,
    durable: bool,
    path: &dyn Fn() -> PathBuf,
) -> Result<(File, usize, (u64, u64))> {
    let tmp = format!("{TMP}{file_name}");
    let file = syscall::open_at(dir, tmp.as_str(), Open::CreateNew).context("create member record", path)?;
    // Brand new, and a private name nobody tests: the flock is free.
    let made = failpoint!("group.record.after_open")
        .and_then(|()| file.try_flock().map_err(std::io::Error::from))
        .context("lock member record", path)
        .and_then(|()| file::write(&file, 0, record, durable, path))
        .and_then(|len| {
            let meta = syscall::meta(&file).context("inspect member record", path)?;
            failpoint!("group.record.before_rename")
                .and_then(|()| Ok(syscall::rename_at(dir, &tmp, file_name)?))
                .context("create member record", path)
                .map(|()| (len, (meta.dev(), meta.ino())))
        });
    match made {
        Ok((len, id)) => Ok((file, len, id)),
        Err(error) => {
            let _ = syscall::unlink_at(dir, tmp.as_str());
            Err(error)
        }
    }
}

/// Whether `name` is an entry renamed aside to be deleted,
/// `<name>.pending-<12 hex digits>`: on Windows a file is deleted by
/// renaming it aside and then marking it for deletion
/// (`sys/windows/syscall.rs` `unlink_at`), so a process killed between the
/// two leaves it, no longer anyone's record. It is collected as an
/// unfinished record is (its flock free).
fn is_unlink_aside(name: &str) -> bool {
    name.rsplit_once(".pending-").is_some_and(|(_, suffix)| {
        suffix.len() == 12
            && suffix
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Reads and judges every record of the members directory `dir`. Entries
/// of other shapes are ignored, never touched.
pub(super) fn scan(ctx: &Ctx, dir: &File, path: &dyn Fn() -> PathBuf) -> Result<Scan> {
    let names = syscall::list_at(dir).context("list members directory", path)?;
    judge_all(ctx, dir, names)
}

/// [`scan`] of everyone but `own`, a joiner's own record, in place and
/// live (its flock is ours, and nobody else writes under its name): a
/// join's count once its record is in needs only the others (`refusal`
/// in `fs/group.rs` counts `own` as nobody else), so it is not read back.
pub(super) fn scan_others(ctx: &Ctx, dir: &File, path: &dyn Fn() -> PathBuf, own: &str) -> Result<Scan> {
    let mut names = syscall::list_at(dir).context("list members directory", path)?;
    names.retain(|name| name.as_os_str() != own);
    judge_all(ctx, dir, names)
}

/// [`scan`], if the members directory holds at most `most` entries;
/// `None` if it holds more, once `most + 1` names were read (nothing more
/// is: a group of any size costs a runtime's thread this much).
pub(super) fn scan_within(
    ctx: &Ctx,
    dir: &File,
    path: &dyn Fn() -> PathBuf,
    most: usize,
) -> Result<Option<Scan>> {
    let names = syscall::list_at_most(dir, most).context("list members directory", path)?;
    let Some(names) = names else {
        return Ok(None);
    };
    judge_all(ctx, dir, names).map(Some)
}

fn judge_all(ctx: &Ctx, dir: &File, names: Vec<std::ffi::OsString>) -> Result<Scan> {
    let mut found = Scan {
        members: Vec::new(),
        waiters: Vec::new(),
        unfinished: Vec::new(),
    };
    for name in names {
        let Some(name) = name.to_str() else { continue };
        if (name.starts_with(TMP) && name.ends_with(JSON)) || is_unlink_aside(name) {
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
pub(super) fn judge_entry(ctx: &Ctx, dir: &File, name: &str) -> Result<Option<Entry>> {
    let file = match syscall::open_at(dir, name, Open::Read) {
        Ok(file) => file,
        Err(Errno::ENOENT | Errno::ELOOP | Errno::ENXIO | Errno::EISDIR) => return Ok(None),
        Err(e) => return Err(e).context("open member record", || PathBuf::from(name)),
    };
    let meta = syscall::meta(&file).context("inspect member record", || PathBuf::from(name))?;
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
        known_for: ctx.known_for(mtime, meta.instance()),
    };
    let host = stale::System;
    let mut verdict = stale::judge(&evidence, ctx.rules(), &host);
    if verdict == Verdict::NeedsFlockTest {
        // A free flock means its holder is gone; ours is dropped with
        // `file` right after.
        evidence.flock_free = Some(file.try_flock().is_ok());
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
pub(super) fn remove_dead(ctx: &Ctx, dir: &File, scan: &mut Scan) {
    // An unfinished record whose flock is held is being made by a joiner
    // that does not take the mutation lock (`group::join`): it stays. (So
    // does a record renamed aside by a remover still at work: its holder's
    // flock is let go only once it is marked for deletion.)
    for name in scan.unfinished.drain(..) {
        let held =
            syscall::open_at(dir, name.as_str(), Open::Read).is_ok_and(|file| file.try_flock().is_err());
        if !held {
            let _ = syscall::unlink_at(dir, name.as_str());
        }
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

/// Removes a stale marker (under the mutation lock) with `remove`, if no
/// live member remains: the members directory is sealed, its dead members
/// removed, and `remove` runs while it is still sealed, so no joiner that
/// does not take the mutation lock can join a marker about to go. `remove`
/// is given the mutation lock, and calls the function it is given once the
/// marker is gone and before it lets the mutation lock go: that removes
/// the seal, and the members directory too if nothing is left in it.
/// However `remove` ends (the marker found gone or replaced, an error),
/// the seal goes no later than the mutation lock (`MutationLock::seal`).
/// `None` if a live member remains, and so the marker must stay.
pub(super) fn tidy<'m, T>(
    ctx: &Ctx,
    name: &LockName,
    mut mutation: MutationLock<'m>,
    remove: impl FnOnce(MutationLock<'m>, &dyn Fn()) -> Result<T>,
) -> Result<Option<T>> {
    let Some(dir) = open_members(ctx, name)? else {
        return remove(mutation, &|| {}).map(Some);
    };
    let dir_name = members_dir(name.file_name());
    let path = || ctx.path_of(&dir_name);
    // Closed (its flock let go) before it is removed, as `Seal` does; the
    // mutation lock removes it if `remove` does not get to run `then`.
    let held = std::cell::Cell::new(Some(mutation.seal(&dir, &path)?));
    let mut scan = scan(ctx, &dir, &path)?;
    remove_dead(ctx, &dir, &mut scan);
    if scan.live_members().next().is_some() {
        return Ok(None);
    }
    let waiters = !scan.waiters.is_empty();
    let then = || {
        drop(held.take());
        unseal(&dir);
        if !waiters {
            remove_unsealed_members_dir(ctx, &dir_name);
        }
    };
    remove(mutation, &then).map(Some)
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
pub(super) fn remove_members_dir(ctx: &Ctx, dir_name: &str) {
    // A seal left in it is ours, the marker gone already, or a dead
    // sealer's (the caller holds the name's mutation lock).
    if let Ok(dir) = syscall::open_at(ctx.dir.fd(), dir_name, Open::Dir) {
        unseal_dead(&dir);
    }
    remove_unsealed_members_dir(ctx, dir_name);
}

/// [`remove_members_dir`] for a caller that removed the seal itself.
fn remove_unsealed_members_dir(ctx: &Ctx, dir_name: &str) {
    let removable = failpoint!("group.members.before_rmdir").map_err(|_| Errno::EIO);
    match removable.and_then(|()| syscall::rmdir_at(ctx.dir.fd(), dir_name)) {
        Ok(()) | Err(Errno::ENOENT | Errno::ENOTEMPTY | Errno::EEXIST) => {}
        Err(error) => tracing::debug!(dir = dir_name, %error, "could not remove a members directory"),
    }
}
