//! How `run` takes its lock: at once, within `-w` or whenever it comes,
//! and what it says when it gives up or finds NAME held as another kind.

use std::time::{Duration, Instant};

use leasehold::{LockGuard, Locker};

use super::args::RunArgs;
use super::exit::{EXIT_KIND_MISMATCH, Failure};
use super::output::{chain, conflict, holders_of, warn};
use super::process::Forwarded;
use super::status::Waiting;
use super::target::Target;
use super::want::Want;

/// Takes the lock `run` asks for: at once, within `-w`, or whenever it
/// comes, saying what it waits for (see `status.rs`). Else the status to
/// exit with: `-E` when `-n` or `-w` gave up, [`EXIT_KIND_MISMATCH`], or
/// 128+N when signal N arrived while waiting.
pub(super) async fn take(
    args: &RunArgs,
    locker: &Locker,
    target: &Target,
    signals: &mut Forwarded,
    started: Instant,
) -> Result<Result<LockGuard, u8>, Failure> {
    let (name, shown) = (target.name(), target.shown());
    let want = Want::new(args, locker, name)?;
    let waiting = Waiting::new(shown, args.verbose, args.json, started);
    // Dropping the attempt on a signal is safe: acquisition is cancel safe.
    let got = tokio::select! {
        got = attempt(args, locker, name, &want, &waiting, started) => got,
        sig = signals.recv() => return Ok(Err(128 + sig as u8)),
    };
    match got {
        Ok(Some(guard)) => {
            waiting.took(guard.fencing_token());
            Ok(Ok(guard))
        }
        Ok(None) => Ok(Err(gave_up(args, locker, target, &want, waiting).await)),
        Err(e @ leasehold::Error::KindMismatch { .. }) => Ok(Err(kind_mismatch(locker, name, &e).await)),
        Err(e) => Err(e.into()),
    }
}

/// One try, then the wait that `-n` and `-w` allow; `None` if it gave up.
async fn attempt(
    args: &RunArgs,
    locker: &Locker,
    name: &str,
    want: &Want,
    waiting: &Waiting,
    started: Instant,
) -> leasehold::Result<Option<LockGuard>> {
    if let Some(guard) = want.try_acquire(locker, name).await? {
        return Ok(Some(guard));
    }
    if args.no_wait || args.wait == Some(Duration::ZERO) {
        return Ok(None);
    }
    let wait = async {
        match args.wait {
            None => want.acquire(locker, name).await.map(Some),
            Some(wait) => {
                let left = wait.saturating_sub(started.elapsed());
                match want.acquire_timeout(locker, name, left).await {
                    Err(e) if e.is_timeout() => Ok(None),
                    other => other.map(Some),
                }
            }
        }
    };
    tokio::select! {
        got = wait => got,
        never = waiting.report(locker, name, want, args.wait) => match never {},
    }
}

/// `-n` found the lock held, or `-w` ran out: the status of `-E`.
async fn gave_up(args: &RunArgs, locker: &Locker, target: &Target, want: &Want, waiting: Waiting) -> u8 {
    let (name, shown) = (target.name(), target.shown());
    // Quiet, as flock(1): a cron job that finds its lock held every
    // minute must not mail every minute.
    let timed_out = args.wait.is_some() && !args.no_wait;
    if args.json {
        let found = locker.inspect(name).await.ok().flatten();
        let kind = if timed_out { "timeout" } else { "busy" };
        waiting.gave_up(kind, found.as_ref(), args.conflict_exit_code);
    }
    drop(waiting);
    if args.verbose {
        let found = locker.inspect(name).await.ok().flatten();
        let held = conflict(found.as_ref(), want);
        match args.wait {
            Some(wait) if !args.no_wait => warn(&format!(
                "gave up after {wait:?} waiting for lock {shown:?}: {held}"
            )),
            _ => warn(&format!("lock {shown:?} is {held}")),
        }
    }
    args.conflict_exit_code
}

/// NAME is held as another kind than asked for (no waiting makes that
/// change): says by whom, and what the runs of a name must agree on.
async fn kind_mismatch(locker: &Locker, name: &str, error: &leasehold::Error) -> u8 {
    let found = locker.inspect(name).await.ok().flatten();
    let holders = match found.filter(|l| !l.is_stale()) {
        Some(info) => format!(" (by {})", holders_of(&info)),
        None => String::new(),
    };
    warn(&format!(
        "{}{holders}; the runs of a name must agree: every --permits run of it gives the same N, and it is never held with --shared and --permits at once",
        chain(error)
    ));
    EXIT_KIND_MISMATCH
}
