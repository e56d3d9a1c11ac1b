//! Fencing counters: `<lock>.fence`, the last token handed out for a lock.
//!
//! Tokens are counted in microseconds of the wall clock since the Unix
//! epoch, so that they keep increasing when the counter is lost (deleted
//! by hand or by a tmpfiles age rule, its directory re-created, a tmpfs
//! rebooted). A block of tokens is `max(last + 1, now)` onwards, and no
//! token is ever more than [`LEAD`] ahead of the wall clock read before its
//! block was installed: blocks shrink (and, at worst, a reservation waits
//! for the clock) when tokens are taken faster than a million a second.
//! Where the counter is missing, the next token is `now + LEAD + 1`, above
//! every token handed out before, provided the wall clock has not gone
//! back since. A clock that went back by more than [`MAX_WAIT`] while the
//! counter is there only means the tokens continue from the counter.
//!
//! Tokens stay below 2^53 (exact as JSON numbers in JavaScript) until the
//! year 2255.

use crate::sys::syscall::WriteAt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::context::Ctx;
use super::context::read_record;
use crate::backend::Tokens;
use crate::error::{Error, IoResultExt, Result};
use crate::name::LockName;
use crate::sys::syscall::{self, Errno, Open};

/// How many tokens one trip to the disk reserves, so that in-process
/// handoffs do not write the counter each time.
const TOKEN_BLOCK: u64 = 1024;

/// How far (in microseconds) a token may run ahead of the wall clock:
/// eight blocks. Small, because a missing counter (a new name, or one
/// whose counter was lost) resumes this far past the clock, and until the
/// clock has caught up blocks are cut to what it has run since: a longer
/// lead would make every handoff of a new name go to the disk for that
/// long.
const LEAD: u64 = 8 * TOKEN_BLOCK;

/// How long a reservation waits for the wall clock to catch up with the
/// counter; a counter further ahead means the clock went back.
const MAX_WAIT: u64 = 2_000;

/// Rounds of reading and installing the counter before giving up; a round
/// only repeats when the counter changed under us.
const ROUNDS: usize = 4;

/// The wall clock in microseconds since the Unix epoch (0 before it).
fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The next block of tokens after the counter `last` (`None`: there is
/// none), at the wall-clock time `now`: the block, and the wall-clock time
/// before which it may not be installed (so that its last token is at
/// most [`LEAD`] ahead of the clock). `None` on overflow.
fn next_block(last: Option<u64>, now: u64) -> Option<(Tokens, u64)> {
    let Some(last) = last else {
        // Every token handed out before the loss is at most LEAD ahead
        // of a clock reading that lies before this one.
        let first = now.checked_add(LEAD + 1)?;
        return Some((
            Tokens {
                next: first,
                last: first,
            },
            now + 1,
        ));
    };
    let first = last.checked_add(1)?.max(now);
    let full = first.checked_add(TOKEN_BLOCK - 1)?;
    let bound = now.saturating_add(LEAD);
    if first > bound.saturating_add(MAX_WAIT) {
        // The clock went back: continue from the counter.
        return Some((
            Tokens {
                next: first,
                last: full,
            },
            now,
        ));
    }
    let end = full.min(bound).max(first);
    Some((
        Tokens {
            next: first,
            last: end,
        },
        end - LEAD.min(end),
    ))
}

/// How long a reservation waits for the name's mutation lock: its caller
/// holds the lease meanwhile, which the renewal thread then waits for, so
/// never more than a small part of the shortest lease's safety margin.
const PATIENCE: Duration = Duration::from_millis(20);

/// Reserves the next block of fencing tokens for the lock `name`, which
/// this process holds while `still_ours` says so, and has `record_first`
/// record the first token in the owner record while the counter is still
/// under the directory lock. `None` if the lock is no longer ours (or the
/// directory is busy).
///
/// The counter is only ever advanced under the directory's mutation lock
/// by a process that has just checked that it holds the lock, so blocks
/// are handed out in the order the lock was held. It is replaced by rename
/// (and synced, durable records or not), so a crash never leaves it behind a token
/// already handed out.
pub(super) fn reserve(
    ctx: &Ctx,
    name: &LockName,
    still_ours: &dyn Fn() -> Result<bool>,
    record_first: &mut dyn FnMut(u64) -> Result<()>,
) -> Result<Option<Tokens>> {
    reserve_with(ctx, name, false, still_ours, record_first)
}

/// [`reserve`] by a caller that holds the name's mutation lock already
/// (an upgrade, right after its conversion): it is not taken again, so a
/// neighbour that takes it next cannot make this give up.
pub(super) fn reserve_locked(
    ctx: &Ctx,
    name: &LockName,
    still_ours: &dyn Fn() -> Result<bool>,
    record_first: &mut dyn FnMut(u64) -> Result<()>,
) -> Result<Option<Tokens>> {
    reserve_with(ctx, name, true, still_ours, record_first)
}

fn reserve_with(
    ctx: &Ctx,
    name: &LockName,
    locked: bool,
    still_ours: &dyn Fn() -> Result<bool>,
    record_first: &mut dyn FnMut(u64) -> Result<()>,
) -> Result<Option<Tokens>> {
    let fence = format!("{}.fence", name.file_name());
    // Every renewal in the directory waits for the directory lock, so it
    // is held here only to compare and rename: the counter's next value
    // is written (and synced) to a temporary file before, and the
    // directory synced after. Only the name's holder advances its
    // counter, so the value read before the lock is almost always still
    // the current one; if not, start over.
    for _ in 0..ROUNDS {
        let last = read_fence(ctx, name, &fence)?;
        let (block, not_before) = next_block(last, wall_us()).ok_or_else(|| {
            Error::io(
                "advance fencing counter (it is within one block of u64::MAX)",
                ctx.path_of(&fence),
                std::io::Error::from(std::io::ErrorKind::InvalidData),
            )
        })?;
        // Tokens taken faster than the clock runs: let it catch up (a
        // few microseconds, outside the directory lock).
        loop {
            let now = wall_us();
            if now >= not_before || not_before - now > MAX_WAIT {
                break;
            }
            std::thread::sleep(Duration::from_micros(not_before - now));
        }
        let next = FenceTmp::write(ctx, &fence, block.last)?;
        failpoint!("fence.reserve.after_tmp").context("write fencing counter", || ctx.path_of(&fence))?;
        // Busy (another process changes this name, or is frozen while it
        // does): give up and let the caller try again later. Never wait
        // long: the caller holds its lease while we do, and the renewal
        // thread waits for that.
        let mutation = match locked {
            true => None,
            false => match ctx.dir.lock_within(name.file_name(), PATIENCE)? {
                Some(mutation) => Some(mutation),
                None => return Ok(None),
            },
        };
        if !still_ours()? {
            return Ok(None);
        }
        if read_fence(ctx, name, &fence)? != last || !next.install(&fence)? {
            continue;
        }
        failpoint!("fence.reserve.after_rename").context("record fencing token", || ctx.path_of(&fence))?;
        record_first(block.next)?;
        drop(mutation);
        // No token of the block is handed out before the rename is on
        // disk; a later block's sync covers this rename too. Synced
        // whether or not records are durable: tokens must grow across a
        // crash, and this is paid once per block.
        failpoint!("fence.reserve.before_dirsync")
            .and_then(|()| syscall::sync_dir(ctx.dir.fd()))
            .context("sync lock directory", || ctx.dir.path())?;
        return Ok(Some(block));
    }
    Ok(None)
}

/// The fencing counter of `name` as it stands: no less than any token
/// handed out so far, less than any handed out from now on. Where the
/// counter is missing, the highest token anyone could have been handed
/// (the next one is above it). The caller holds the mutation lock, or
/// holds the name shared (then nobody advances the counter meanwhile).
pub(super) fn current(ctx: &Ctx, name: &LockName) -> Result<u64> {
    let last = read_fence(ctx, name, &format!("{}.fence", name.file_name()))?;
    Ok(last.unwrap_or_else(|| wall_us().saturating_add(LEAD)))
}

/// The last token handed out for a lock, from its `.fence` counter
/// (`None` if there is none: never made, or lost).
fn read_fence(ctx: &Ctx, name: &LockName, fence: &str) -> Result<Option<u64>> {
    let path = || ctx.path_of(fence);
    let file = match syscall::open_at(ctx.dir.fd(), fence, Open::Read) {
        Ok(file) => file,
        Err(Errno::ENOENT) => return Ok(None),
        Err(Errno::ELOOP) => {
            return Err(Error::UnexpectedFile {
                name: name.as_str().to_owned(),
                path: path(),
                found: "symlink",
            });
        }
        Err(e) => return Err(e).context("open fencing counter", path),
    };
    let bytes = read_record(&file).context("read fencing counter", path)?;
    std::str::from_utf8(&bytes)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .map(Some)
        .ok_or_else(|| {
            // Guessing could hand out a token twice: refuse instead.
            Error::io(
                "read fencing counter (not a number; fix or remove it)",
                path(),
                std::io::Error::from(std::io::ErrorKind::InvalidData),
            )
        })
}

/// The next value of a fencing counter, written to a temporary file of
/// its own (and synced) until it is renamed over the counter;
/// removed if dropped before.
struct FenceTmp<'a> {
    ctx: &'a Ctx,
    tmp: String,
    armed: bool,
}

impl<'a> FenceTmp<'a> {
    fn write(ctx: &'a Ctx, fence: &str, value: u64) -> Result<Self> {
        let tmp = format!("{fence}.tmp-{}", uuid::Uuid::new_v4().simple());
        let path = || ctx.path_of(fence);
        let file = syscall::open_at(ctx.dir.fd(), tmp.as_str(), Open::CreateNew)
            .context("write fencing counter", path)?;
        let next = FenceTmp {
            ctx,
            tmp,
            armed: true,
        };
        failpoint!("fence.tmp.before_write")
            .and_then(|()| file.write_all_at(format!("{value}\n").as_bytes(), 0))
            .and_then(|()| file.sync_data())
            .context("write fencing counter", path)?;
        Ok(next)
    }

    /// Renames the new value over the counter. `false` if the temporary
    /// file is gone (collected as a leftover while this process stood
    /// still): write it again.
    fn install(mut self, fence: &str) -> Result<bool> {
        let renamed = failpoint!("fence.reserve.before_rename").map_err(|_| Errno::EIO);
        let mut renamed = renamed.and_then(|()| syscall::rename_at(self.ctx.dir.fd(), &self.tmp, fence));
        // Another process reading the counter (it reads before it takes
        // the mutation lock) keeps it open for an instant, over which
        // Windows refuses the replace: wait for it, briefly.
        for _ in 0..50 {
            if !(crate::sys::REPLACE_WAITS_FOR_READERS
                && matches!(renamed, Err(Errno::EACCES | Errno::EBUSY)))
            {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
            renamed = syscall::rename_at(self.ctx.dir.fd(), &self.tmp, fence);
        }
        match renamed {
            Ok(()) => {
                self.armed = false;
                Ok(true)
            }
            Err(Errno::ENOENT) => {
                self.armed = false;
                Ok(false)
            }
            Err(e) => Err(e).context("write fencing counter", || self.ctx.path_of(fence)),
        }
    }
}

impl Drop for FenceTmp<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = syscall::unlink_at(self.ctx.dir.fd(), self.tmp.as_str());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_765_000_000_000_000;

    fn block(last: Option<u64>, now: u64) -> (u64, u64, u64) {
        let (t, not_before) = next_block(last, now).unwrap();
        (t.next, t.last, not_before)
    }

    #[test]
    fn an_old_small_counter_jumps_to_the_clock() {
        let (first, last, not_before) = block(Some(2049), NOW);
        assert_eq!((first, last), (NOW, NOW + TOKEN_BLOCK - 1));
        assert!(not_before <= NOW);
    }

    #[test]
    fn a_lost_counter_starts_above_every_token_the_clock_allowed() {
        // Whatever was handed out before was at most LEAD ahead of an
        // earlier clock reading.
        let (first, last, not_before) = block(None, NOW);
        assert_eq!((first, last), (NOW + LEAD + 1, NOW + LEAD + 1));
        assert_eq!(not_before, NOW + 1);
        assert!(first > NOW - 1 + LEAD);
    }

    #[test]
    fn tokens_never_run_more_than_the_lead_ahead_of_the_clock() {
        // Taken as fast as can be, the clock standing still but for the
        // waits: the counter reaches the lead, then blocks shrink to one
        // token, each waiting a microsecond for the clock.
        let (mut last, mut now) = (Some(NOW), NOW);
        for _ in 0..2000 {
            let (first, end, not_before) = block(last, now);
            assert!(first > last.unwrap() && end >= first);
            now = now.max(not_before);
            assert!(end <= now + LEAD, "{end} at {now}");
            last = Some(end);
        }
        // The first 8 blocks run ahead; the other 1,992 take a microsecond
        // of the clock each.
        assert_eq!(last, Some(NOW + LEAD + 1992));
        assert_eq!(now, NOW + 1992);
    }

    #[test]
    fn a_clock_gone_back_continues_from_the_counter() {
        let last = NOW + LEAD + MAX_WAIT + 10;
        assert_eq!(block(Some(last), NOW), (last + 1, last + TOKEN_BLOCK, NOW));
    }

    #[test]
    fn the_top_of_the_range_is_an_error_not_a_wrap() {
        assert!(next_block(Some(u64::MAX), NOW).is_none());
        assert!(next_block(Some(u64::MAX - 10), NOW).is_none());
        assert!(next_block(None, u64::MAX - 10).is_none());
    }
}
