//! Letting a lock in the directory go: one algorithm for an exclusive lock
//! of either layout (`Whole`) and a place among a shared lock's or
//! semaphore's holders (`Member`), run by `release()`, by `Drop` and by
//! the release thread alike.
//!
//! The change is made under the name's mutation lock. A caller that may
//! wait (`release().await`, on the blocking pool) waits for it up to
//! [`CONFIRM_PATIENCE`]; a `Drop` up to [`later::DROP_PATIENCE`]. A mutation
//! lock that stays taken (another process is changing the name, or is
//! frozen while it does) never fails or blocks the caller: if the lock is
//! still ours, a copy holding duplicates of its descriptors (so its
//! `flock` stays) goes to the release thread, which finishes the change as
//! soon as it can.

use std::time::Duration;

use super::context::Ctx;
use super::later;
use crate::error::{LossReason, Result};

/// How long `release().await` waits for the name's mutation lock before
/// handing the change to the release thread.
const CONFIRM_PATIENCE: Duration = Duration::from_millis(500);

/// A lock this process holds in the directory, as releasing it sees it.
pub(super) trait Release: Send + Sized + 'static {
    /// The lock's name, for logs.
    fn lock_name(&self) -> &str;

    /// The directory it is in.
    fn ctx(&self) -> &Ctx;

    /// Whether it still has to be released: cleared by [`let_go`], set on
    /// the copy handed to the release thread.
    fn armed(&mut self) -> &mut bool;

    /// Under the name's mutation lock, waited for at most `patience`:
    /// removes what is ours. `None` if the mutation lock stayed taken;
    /// `Some(false)` if the lock was no longer ours. (`&mut`: what it
    /// removed, it may also close.)
    fn remove(&mut self, patience: Duration) -> Result<Option<bool>>;

    /// Whether it is still ours, as can be seen without the mutation lock.
    fn still_ours(&self) -> Result<bool>;

    /// An armed copy, holding duplicates of the descriptors.
    fn copy(&self) -> std::io::Result<Self>;
}

/// Releases `lock`; `None` when it was ours to the end, otherwise why
/// not. Only `confirm` looks whether the directory was moved (a lock in a
/// moved directory is removed there all the same, but was not a lock): a
/// `Drop`, which reports nothing, is spared the path lookup.
pub(super) fn let_go<L: Release>(lock: &mut L, confirm: bool) -> Result<Option<LossReason>> {
    *lock.armed() = false;
    let moved = if confirm { lock.ctx().dir_moved() } else { None };
    let patience = if confirm {
        CONFIRM_PATIENCE
    } else {
        later::DROP_PATIENCE
    };
    let released = match lock.remove(patience)? {
        Some(released) => released,
        None => {
            // The release thread finishes the change whatever this look
            // says: under the mutation lock it removes only what is still
            // ours, and helps clean what a reclaimer left of ours (a
            // retired directory's record, a members directory's dead).
            defer(lock);
            lock.still_ours()?
        }
    };
    Ok(outcome(moved, released))
}

/// What a release reports: the directory moved, or the lock replaced
/// (`released` false), or `None`, ours to the end.
pub(super) fn outcome(moved: Option<LossReason>, released: bool) -> Option<LossReason> {
    moved.or((!released).then_some(LossReason::Replaced))
}

/// What `Drop` does: [`let_go`] if nothing released the lock yet, with
/// failures reported through `tracing`.
pub(super) fn on_drop<L: Release>(lock: &mut L) {
    if !*lock.armed() {
        return;
    }
    if let Err(error) = let_go(lock, false) {
        tracing::warn!(
            lock = lock.lock_name(),
            %error,
            "releasing a dropped lock failed; if it is still ours, it goes when the release thread finishes it or is judged stale once our descriptors close"
        );
    }
}

/// Hands the release to the release thread, with a copy of the lock's
/// descriptors. Out of descriptors, the lock is left to be judged stale,
/// at once, when ours close.
fn defer<L: Release>(lock: &L) {
    match lock.copy() {
        Ok(copy) => later::defer(Box::new(Deferred(copy))),
        Err(error) => tracing::warn!(
            lock = lock.lock_name(),
            %error,
            "could not hand a release to the release thread; the lock is judged stale once our descriptors close"
        ),
    }
}

/// A release the release thread finishes.
struct Deferred<L>(L);

impl<L: Release> later::Retry for Deferred<L> {
    fn retry(&mut self) -> bool {
        let done = later::done(self.0.remove(later::PATIENCE), self.0.lock_name());
        *self.0.armed() &= !done;
        done
    }
}
