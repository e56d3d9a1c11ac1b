//! Fencing counters: `<lock>.fence`, the last token handed out for a lock.

use std::os::unix::fs::FileExt;

use super::context::Ctx;
use super::syscall::{self, Errno, Open, read_record};
use crate::backend::Tokens;
use crate::error::{Error, IoResultExt, Result};
use crate::name::LockName;

/// How many tokens one trip to the disk reserves, so that in-process
/// handoffs do not write the counter each time.
const TOKEN_BLOCK: u64 = 1024;

/// Rounds of reading and installing the counter before giving up; a round
/// only repeats when the counter changed under us.
const ROUNDS: usize = 4;

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
    let fence = format!("{}.fence", name.file_name());
    // Every renewal in the directory waits for the directory lock, so it
    // is held here only to compare and rename: the counter's next value
    // is written (and synced) to a temporary file before, and the
    // directory synced after. Only the name's holder advances its
    // counter, so the value read before the lock is almost always still
    // the current one; if not, start over.
    for _ in 0..ROUNDS {
        let last = read_fence(ctx, name, &fence)?;
        let end = last.checked_add(TOKEN_BLOCK).ok_or_else(|| {
            Error::io(
                "advance fencing counter (it is within one block of u64::MAX)",
                ctx.path_of(&fence),
                std::io::Error::from(std::io::ErrorKind::InvalidData),
            )
        })?;
        let next = FenceTmp::write(ctx, &fence, end)?;
        failpoint!("fence.reserve.after_tmp").context("write fencing counter", || ctx.path_of(&fence))?;
        // Busy (a frozen process holds the directory lock): give the
        // lock up and let the caller try again later.
        let Some(mutation) = ctx.dir.try_mutation_lock(name.file_name())? else {
            return Ok(None);
        };
        if !still_ours()? {
            return Ok(None);
        }
        if read_fence(ctx, name, &fence)? != last || !next.install(&fence)? {
            continue;
        }
        failpoint!("fence.reserve.after_rename").context("record fencing token", || ctx.path_of(&fence))?;
        record_first(last + 1)?;
        drop(mutation);
        // No token of the block is handed out before the rename is on
        // disk; a later block's sync covers this rename too. Synced
        // whether or not records are durable: tokens must grow across a
        // crash, and this is paid once per 1,024 tokens.
        failpoint!("fence.reserve.before_dirsync")
            .and_then(|()| ctx.dir.fd().sync_all())
            .context("sync lock directory", || ctx.dir.path())?;
        return Ok(Some(Tokens {
            next: last + 1,
            last: end,
        }));
    }
    Ok(None)
}

/// The fencing counter of `name` as it stands: no less than any token
/// handed out so far, less than any handed out from now on (0 if there is
/// none yet). The caller holds the mutation lock.
pub(super) fn current(ctx: &Ctx, name: &LockName) -> Result<u64> {
    read_fence(ctx, name, &format!("{}.fence", name.file_name()))
}

/// The last token handed out for a lock, from its `.fence` counter (0 if
/// there is none yet).
fn read_fence(ctx: &Ctx, name: &LockName, fence: &str) -> Result<u64> {
    let path = || ctx.path_of(fence);
    let file = match syscall::open_at(ctx.dir.fd(), fence, Open::Read) {
        Ok(file) => file,
        Err(Errno::ENOENT) => return Ok(0),
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
        match renamed.and_then(|()| syscall::rename_at(self.ctx.dir.fd(), &self.tmp, fence)) {
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
