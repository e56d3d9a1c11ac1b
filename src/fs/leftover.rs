//! What crashed processes leave in the lock directory besides locks, and
//! its collection: on demand (`clean`) and, bounded, on the way.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::context::Ctx;
use super::directory;
use super::layout::Strategy;
use crate::backend::{Inspection, Mode};
use crate::error::Result;
use crate::name::LockName;
use crate::owner::Owner;
use crate::record::{Parsed, parse};
use crate::stale::StaleReason;
use crate::sys;
use crate::sys::syscall::{self, Errno, Flock, Open};

/// How often one `Locker` collects leftovers on its own.
const SWEEP_EVERY: Duration = Duration::from_secs(2);

/// How many leftovers one collection removes at most.
const SWEEP_LIMIT: usize = 256;

/// How long a leftover-shaped entry is spared after its last change: the
/// process making it may be between two steps.
pub(super) const LEFTOVER_SETTLE: Duration = Duration::from_secs(2);

/// What a crashed process can leave in the lock directory besides locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Leftover {
    /// `<lock>.pending-<12 hex>`: a directory being published, or a lock
    /// file being made.
    Pending,
    /// `<lock>.trash-<12 hex>`: a directory being released or reclaimed.
    Trash,
    /// `<lock>.fence.tmp-<32 hex>`: a fencing counter being replaced.
    FenceTmp,
    /// `<lock>.mutex`: a name's mutation lock, left by a process that died
    /// holding it (a holder removes its own before letting go), or kept by
    /// a release for waiters in line that were killed before they could
    /// remove it.
    Mutex,
}

/// Recognizes leftovers by their exact shape. Every lock's own file name
/// ends in `.lock`, whatever its lock name, so none can match.
pub(super) fn leftover_kind(file_name: &str) -> Option<Leftover> {
    let (base, suffix) = file_name.rsplit_once('.')?;
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    if base.ends_with(".lock") {
        if suffix.strip_prefix("pending-").is_some_and(|id| hex(id, 12)) {
            return Some(Leftover::Pending);
        }
        if suffix.strip_prefix("trash-").is_some_and(|id| hex(id, 12)) {
            return Some(Leftover::Trash);
        }
    }
    if base.ends_with(".lock.fence") && suffix.strip_prefix("tmp-").is_some_and(|id| hex(id, 32)) {
        return Some(Leftover::FenceTmp);
    }
    if base.ends_with(".lock") && suffix == "mutex" {
        return Some(Leftover::Mutex);
    }
    None
}

/// How a removed leftover is reported.
pub(super) fn inspection(ctx: &Ctx, file_name: &str) -> Inspection {
    Inspection {
        owner: Owner::from_parsed(&Parsed::Unreadable),
        holders: Vec::new(),
        mode: Mode::Exclusive,
        stale: Some(StaleReason::Leftover),
        path: Some(ctx.path_of(file_name)),
    }
}

/// Whether `file_name` is a lock file being made under its private name
/// (`file::create`): `<lock file name>.pending-<12 hex>`. Unlike a pending
/// directory's, its base may be any lock file name (`PathStyle::Exact`
/// too, whose names cannot contain `.pending-`).
fn pending_file_shape(file_name: &str) -> bool {
    file_name.rsplit_once(".pending-").is_some_and(|(base, id)| {
        !base.is_empty() && id.len() == 12 && id.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// Removes at most `limit` of what crashed processes left behind, never
/// what a live process is using: `.pending-*` and `.trash-*` directories
/// (directory strategy), `.pending-*` lock files and temporary fencing
/// counters.
pub(super) fn clean(ctx: &Ctx, dry_run: bool, limit: usize) -> Result<Vec<(LockName, Inspection)>> {
    let mut cleaned = Vec::new();
    if ctx.settings.strategy == Strategy::Directory {
        cleaned.extend(clean_dir_leftovers(ctx, dry_run, limit)?);
    }
    let left = limit.saturating_sub(cleaned.len());
    cleaned.extend(clean_file_leftovers(ctx, dry_run, left)?);
    let left = limit.saturating_sub(cleaned.len());
    cleaned.extend(clean_fence_leftovers(ctx, dry_run, left)?);
    let left = limit.saturating_sub(cleaned.len());
    cleaned.extend(clean_mutex_leftovers(ctx, dry_run, left)?);
    Ok(cleaned)
}

/// Collects leftovers of crashed processes without being asked: when
/// a `Locker` is built, and when an attempt meets contention (where
/// waiters that were killed leave them), at most once per
/// [`SWEEP_EVERY`] per `Locker` and [`SWEEP_LIMIT`] entries at a time,
/// so a long-running service's directory does not grow without bound.
/// Failures only postpone the collection.
pub(super) fn sweep(ctx: &Ctx) {
    let now = sys::boot_clock_ms();
    let last = ctx.last_sweep_ms.load(Ordering::Relaxed);
    if !due(last, now) {
        return;
    }
    // One sweeper at a time per Locker: whoever swaps the stamp.
    let swapped = ctx
        .last_sweep_ms
        .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed);
    if swapped.is_err() {
        return;
    }
    match clean(ctx, false, SWEEP_LIMIT) {
        Ok(cleaned) if !cleaned.is_empty() => {
            tracing::debug!(
                removed = cleaned.len(),
                "collected leftovers of crashed processes"
            );
        }
        Ok(_) => {}
        Err(error) => tracing::debug!(%error, "collecting leftovers failed; trying later"),
    }
}

/// Whether [`sweep`] would look now: an attempt that finds the name busy
/// on a runtime's thread leaves the look to the blocking pool.
pub(super) fn sweep_due(ctx: &Ctx) -> bool {
    due(ctx.last_sweep_ms.load(Ordering::Relaxed), sys::boot_clock_ms())
}

/// Whether a sweep last begun at `last` (0: never) is due again at `now`.
fn due(last: u64, now: u64) -> bool {
    let every = u64::try_from(SWEEP_EVERY.as_millis()).unwrap_or(u64::MAX);
    last == 0 || now.saturating_sub(last) >= every
}

/// Removes `.pending-*` directories whose publisher is gone (unchanged
/// for [`LEFTOVER_SETTLE`] or the grace period, whichever is shorter, and
/// then no flock) and `.trash-*` directories nobody holds (a releaser that
/// died while emptying one); nobody else uses either. At most `limit` are
/// removed.
fn clean_dir_leftovers(ctx: &Ctx, dry_run: bool, limit: usize) -> Result<Vec<(LockName, Inspection)>> {
    let names =
        ctx.entries(|name| matches!(leftover_kind(name), Some(Leftover::Pending | Leftover::Trash)))?;
    let mut cleaned = Vec::new();
    for name in names {
        if cleaned.len() >= limit {
            break;
        }
        let Ok(node) = syscall::open_at(ctx.dir.fd(), name.as_str(), Open::Dir) else {
            continue;
        };
        // A pending directory is spared, untouched, while younger than
        // the settle time: its publisher takes the flock two syscalls after
        // `mkdir`, and a flock of ours in that instant would cost it the
        // attempt. Only a publisher that stood still this long in
        // between meets our flock or finds its directory gone, and then
        // makes no lock and looks again (see `directory::publish`).
        let young = leftover_kind(&name) == Some(Leftover::Pending)
            && syscall::meta(&node)
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_none_or(|age| age < ctx.settings.grace.min(LEFTOVER_SETTLE));
        if young {
            continue;
        }
        // A publisher holds the flock of its pending directory until it is
        // published, and a holder keeps its flock on a directory it is
        // retiring: busy means in use.
        if node.try_flock().is_err() {
            continue;
        }
        if failpoint!("leftover.dir.after_flock").is_err() {
            continue;
        }
        if !dry_run {
            directory::remove_dir(ctx, &name, &node);
        }
        cleaned.push((LockName::from_file_name(&name), inspection(ctx, &name)));
    }
    Ok(cleaned)
}

/// Removes `.pending-*` lock files whose creator is gone: unchanged for
/// [`LEFTOVER_SETTLE`] (or the grace period, if shorter) and then with
/// their flock free. Their creator holds the flock from just after making
/// one (a sweep spares it that long) until it has linked it to the lock
/// path and removed the private name; a crash in between leaves it, and
/// after the link it is only a second name of a lock whose holder died.
/// Only files that are empty or hold a leasehold record (all a creator
/// writes) are removed; anything else of that name is someone's data.
fn clean_file_leftovers(ctx: &Ctx, dry_run: bool, limit: usize) -> Result<Vec<(LockName, Inspection)>> {
    let names = ctx.entries(pending_file_shape)?;
    let mut cleaned = Vec::new();
    for name in names {
        if cleaned.len() >= limit {
            break;
        }
        let Ok(file) = syscall::open_at(ctx.dir.fd(), name.as_str(), Open::Read) else {
            continue;
        };
        let Ok(meta) = syscall::meta(&file) else {
            continue;
        };
        let young = meta
            .modified()
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_none_or(|age| age < ctx.settings.grace.min(LEFTOVER_SETTLE));
        if !meta.is_file() || young || file.try_flock().is_err() {
            continue;
        }
        if failpoint!("leftover.file.after_flock").is_err() {
            continue;
        }
        let ours = match super::context::read_record(&file).map(|bytes| parse(&bytes)) {
            Ok(Parsed::Unreadable) => true,
            Ok(Parsed::Record(record)) => record.is_leasehold(),
            _ => false,
        };
        if !ours {
            continue;
        }
        // Still the file we judged: nobody makes a file under another's
        // private name.
        if !dry_run
            && !matches!(
                syscall::unlink_at(ctx.dir.fd(), name.as_str()),
                Ok(()) | Err(Errno::ENOENT)
            )
        {
            continue;
        }
        cleaned.push((LockName::from_file_name(&name), inspection(ctx, &name)));
    }
    Ok(cleaned)
}

/// Fencing counters are only written under their name's mutation lock, so
/// a temporary counter file found while holding it belongs to a process
/// that died between writing and renaming it.
fn clean_fence_leftovers(ctx: &Ctx, dry_run: bool, limit: usize) -> Result<Vec<(LockName, Inspection)>> {
    let mut found = ctx.entries(|name| leftover_kind(name) == Some(Leftover::FenceTmp))?;
    // A counter being advanced lives a write and a sync before its
    // writer takes the directory lock: spare the young.
    found.retain(|name| {
        syscall::stat_at(ctx.dir.fd(), name).is_ok_and(|st| {
            st.mtime
                .elapsed()
                .is_ok_and(|age| age >= ctx.settings.grace.min(LEFTOVER_SETTLE))
        })
    });
    found.truncate(limit);
    if found.is_empty() {
        return Ok(Vec::new());
    }
    let mut cleaned = Vec::new();
    for name in found {
        // Listed before the lock, judged under it: one that a live writer
        // was about to rename is gone by the time we hold it.
        let lock = name
            .split_once(".fence.tmp-")
            .map_or(name.as_str(), |(lock, _)| lock);
        let Some(_mutation) = ctx.dir.mutation_lock_now(lock)? else {
            continue;
        };
        if syscall::stat_at(ctx.dir.fd(), &name).is_err() {
            continue;
        }
        let removed = dry_run
            || matches!(
                failpoint!("leftover.fence.before_unlink")
                    .map_err(|_| Errno::EIO)
                    .and_then(|()| syscall::unlink_at(ctx.dir.fd(), name.as_str())),
                Ok(()) | Err(Errno::ENOENT)
            );
        if removed {
            cleaned.push((LockName::from_file_name(&name), inspection(ctx, &name)));
        }
    }
    Ok(cleaned)
}

/// Mutation-lock files left by a process that died holding one (a holder
/// removes its own before letting go): taking the lock and letting it go
/// removes one; one that is held stays. So does one that is in use: beside
/// a lock path or a members directory (its holders' releases remove it),
/// or one on which waiters in line for the name are registered (a release
/// kept it for them, see `MutationLock::keep_for_waiters`, and the last
/// one out removes it). Neither is reported.
fn clean_mutex_leftovers(ctx: &Ctx, dry_run: bool, limit: usize) -> Result<Vec<(LockName, Inspection)>> {
    let found = ctx.entries(|name| leftover_kind(name) == Some(Leftover::Mutex))?;
    let mut cleaned = Vec::new();
    for name in found {
        if cleaned.len() >= limit {
            break;
        }
        let lock = &name[..name.len() - ".mutex".len()];
        let there = |entry: &str| syscall::stat_at(ctx.dir.fd(), entry).is_ok();
        if there(lock) || there(&super::members::members_dir(lock)) {
            continue;
        }
        let Ok(file) = syscall::open_at(ctx.dir.fd(), name.as_str(), Open::Read) else {
            continue;
        };
        if !syscall::meta(&file).is_ok_and(|m| m.is_file()) || super::mutex::registered_on(&file) {
            continue;
        }
        if dry_run {
            // Only looked at: free means nobody holds it.
            if file.try_flock().is_err() {
                continue;
            }
        } else if !matches!(ctx.dir.mutation_lock_now(lock), Ok(Some(_))) {
            continue;
        }
        cleaned.push((LockName::from_file_name(&name), inspection(ctx, &name)));
    }
    Ok(cleaned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftovers_are_recognized_by_their_exact_shape() {
        assert_eq!(
            leftover_kind("a-0123456789abcdef.lock.pending-0123456789ab"),
            Some(Leftover::Pending)
        );
        assert_eq!(
            leftover_kind("state.lock.trash-abcdefabcdef"),
            Some(Leftover::Trash)
        );
        assert_eq!(
            leftover_kind("x.lock.fence.tmp-0123456789abcdef0123456789abcdef"),
            Some(Leftover::FenceTmp)
        );
        // Lock names that merely contain the markers are locks.
        for lock in [
            "jobs.lock.trash-1-0123456789abcdef.lock",
            "x.lock.pending-0123456789ab.lock",
            "x.lock.trash-0123456789ab-0011223344556677.lock",
        ] {
            assert_eq!(leftover_kind(lock), None, "{lock}");
        }
        assert_eq!(leftover_kind("x.lock.trash-xyz"), None);
        assert!(pending_file_shape("x.lock.pending-0123456789ab"));
        assert!(pending_file_shape("backup.pending-0123456789ab"));
        assert!(!pending_file_shape("x.lock.pending-0123456789ab.lock"));
        assert!(!pending_file_shape(".pending-0123456789ab"));
        assert_eq!(leftover_kind("x.lock.fence"), None);
        assert_eq!(leftover_kind("x.lock.mutex"), Some(Leftover::Mutex));
        assert_eq!(leftover_kind("x.mutex"), None);
    }
}
