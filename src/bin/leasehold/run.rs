//! `leasehold run`: take the lock, run CMD under it until CMD's process
//! group is empty, and exit with CMD's status.
//!
//! In order: check the arguments; install the signals to forward and start
//! the watchdog, both before the lock is taken (no signal is lost between
//! taking the lock and spawning CMD, and a tool that cannot guard CMD never
//! takes the lock); build the `Locker` (locker.rs) and take the lock
//! (acquire.rs); start CMD guarded (process.rs); wait until CMD's group is
//! empty, forwarding signals to it and stopping it if the lock is lost;
//! release the lock; exit with CMD's status, or [`EXIT_LOST`].
//!
//! On Windows, CMD's group is its Job object and the watchdog is that job
//! (process.rs, job.rs): a lost lock terminates the job at once, as there
//! is no SIGTERM to send first, and CMD's exit code is passed on whole.

use std::ffi::OsString;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use leasehold::LockGuard;
#[cfg(unix)]
use nix::sys::signal::Signal;
use serde_json::json;

use super::acquire::take;
use super::args::RunArgs;
use super::exit::{EXIT_ERROR, EXIT_LOST, Failure};
use super::locker::running;
use super::output::{chain, warn};
use super::process::{
    Forwarded, GROUP_POLL, Group, HeldUntil, Terminal, Watchdog, become_subreaper, command, group_is_empty,
    group_of, reap_orphans, signal_group, spawn,
};
use super::status;
use super::target::Target;
use super::tidy;

/// The library's default lease, which `run` keeps unless `--lease` says.
const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The status to exit with: a byte, but for CMD's own exit code on
/// Windows, which is passed on whole (`0xC000013A` after Ctrl-C).
pub(super) async fn run(mut args: RunArgs) -> Result<u32, Failure> {
    let started = Instant::now();
    let (target, argv) = match args.resolve() {
        Ok(resolved) => resolved,
        Err(e) => {
            warn(&e);
            return Ok(EXIT_ERROR.into());
        }
    };
    // Windows has no SIGTERM: a lost lock terminates CMD's job at once.
    #[cfg(unix)]
    let kill_after = args.kill_after();
    #[cfg(unix)]
    check_kill_after(args.lease, kill_after);
    let mut signals = Forwarded::install()?;
    // Before the lock is taken, so that a tool that cannot guard CMD never
    // takes it: CMD must not run without the watchdog.
    let watchdog = match Watchdog::start(args.lease.unwrap_or(DEFAULT_LEASE)) {
        Ok(watchdog) => watchdog,
        Err(e) => {
            warn(&format!(
                "cannot start the watchdog that stops the command if leasehold dies: {}; not running the command",
                chain(&*e)
            ));
            return Ok(EXIT_ERROR.into());
        }
    };
    become_subreaper()?;
    let locker = match running(&args, &target)? {
        Ok(locker) => locker,
        Err(exit) => return Ok(exit.into()),
    };
    let guard = match take(&args, &locker, &target, &mut signals, started).await? {
        Ok(guard) => guard,
        Err(exit) => return Ok(exit.into()),
    };
    let held = Held {
        args: &args,
        target: &target,
        watchdog: &watchdog,
        #[cfg(unix)]
        kill_after,
    };
    let status = held.run(guard, &argv, &mut signals).await;
    // However CMD ended, once the lock is let go (tidy.rs).
    tidy::after_run(&locker, target.name()).await;
    status
}

/// What `run` holds the lock with, once it has it.
struct Held<'a> {
    args: &'a RunArgs,
    target: &'a Target,
    watchdog: &'a Watchdog,
    #[cfg(unix)]
    kill_after: Duration,
}

impl Held<'_> {
    /// Runs CMD under `guard`, waits until its group is empty and lets the
    /// lock go: the status to exit with.
    async fn run(
        &self,
        guard: LockGuard,
        argv: &[OsString],
        signals: &mut Forwarded,
    ) -> Result<u32, Failure> {
        let (args, target, watchdog) = (self.args, self.target, self.watchdog);
        let Some((program, rest)) = argv.split_first() else {
            return Err("no command given".into());
        };
        let shell = args.shell_command.is_some();
        let mut command = command(program, rest, target.shown(), guard.fencing_token(), shell);
        // Before the look at the lease below: nothing slow between it and
        // the fork.
        let terminal = Terminal::if_foreground();
        // The beats vouch for the tool while the lease holds, from before
        // the spawn (which waits for CMD's exec) on; the watchdog counts
        // them once CMD's process has told it its pid.
        let guard = std::sync::Arc::new(guard);
        let margin = margin(args.lease.unwrap_or(DEFAULT_LEASE));
        let beats = {
            let guard = std::sync::Arc::clone(&guard);
            watchdog.beats(move || vouch(&guard, margin))
        };
        if !beats.started() {
            drop(beats);
            warn("cannot start the thread that tells the watchdog leasehold runs; not running the command");
            watchdog.disarm();
            let _ = sole(guard)?.release().await;
            return Ok(EXIT_ERROR.into());
        }
        // The tool may have been stopped since it took the lock (before
        // CMD, no watchdog can stand in for it), and continued after the
        // lease ran out: CMD must not start then. The look at the lease is
        // a clock read; CMD's own process looks at the clock again just
        // before exec, which must come by `start_by`. The same moment is
        // the first beat, ahead of CMD's pid on the watchdog's pipe.
        let Some(start_by) = vouch(&guard, margin) else {
            drop(beats);
            return Ok(not_started_in_time(watchdog, sole(guard)?).await.into());
        };
        watchdog.vouch(start_by);
        let mut child = match spawn(&mut command, watchdog, terminal.as_ref(), start_by)? {
            Ok(child) => child,
            Err(e) => {
                // First: the watchdog holds a pid std has reaped by now.
                watchdog.disarm();
                drop(beats);
                let guard = sole(guard)?;
                return Ok(not_started(program, &e, terminal, watchdog, guard, start_by)
                    .await
                    .into());
            }
        };
        // Taken now: once reaped, the child no longer reports its pid. CMD's
        // pid is its process group id.
        let Some(group) = group_of(&child, watchdog) else {
            // Cannot happen before the child is waited for; never leave it unguarded.
            let _ = child.start_kill();
            return Err("internal error: the command has no process id".into());
        };
        let loss = Loss {
            target,
            json: args.json,
            #[cfg(unix)]
            kill_after: self.kill_after,
        };
        let (status, lost) = watch(&mut child, &group, &guard, signals, &loss, watchdog).await;
        // The group is empty: nothing is left for the watchdog to kill, and
        // CMD's pid may now be reused by an unrelated process group.
        watchdog.disarm();
        drop(beats);
        drop(terminal);
        let lost = release(sole(guard)?, lost, &loss).await;
        let status = status.map_err(|e| format!("cannot wait for the command: {e}"))?;
        if lost {
            return Ok(EXIT_LOST.into());
        }
        Ok(exit_status(status))
    }
}

#[cfg(unix)]
/// Warns that a `--kill-after` longer than the lease's safety margin may
/// let CMD run on after another process took the lock.
fn check_kill_after(lease: Option<Duration>, kill_after: Duration) {
    // A failing renewal reports the loss a quarter of the lease before it
    // runs out (the renew interval, a third, is longer), and the watchdog
    // kills CMD before the lease ends (`margin` after the loss): a longer
    // grace is cut short.
    let margin = margin(lease.unwrap_or(DEFAULT_LEASE));
    if kill_after > margin {
        warn(&format!(
            "warning: --kill-after {kill_after:?} is longer than the {margin:?} between a failing renewal and the end of the lease: if the lock is lost, the watchdog kills the command before the lease ends, cutting the grace short"
        ));
    }
}

/// CMD could not be started, so nothing ran under the lock: lets the
/// lock go, and exits as a shell does, 127 if CMD was not found, else 126;
/// or 2 if the watchdog was gone (its pipe broken), so CMD could not be
/// guarded.
async fn not_started(
    program: &OsString,
    error: &std::io::Error,
    terminal: Option<Terminal>,
    watchdog: &Watchdog,
    guard: LockGuard,
    start_by: HeldUntil,
) -> u8 {
    drop(terminal);
    // CMD's process found itself past its start (an exec that fails with
    // the same errno, a FUSE or soft NFS mount's, is told apart by our
    // own clock: still within the window, it was the exec's).
    #[cfg(unix)]
    if error.raw_os_error() == Some(super::process::LATE as i32) && start_by.passed() {
        if guard.is_lost() {
            return not_started_in_time(watchdog, guard).await;
        }
        watchdog.disarm();
        warn(
            "the command could not be started by the end the lease had at the last look at it (the machine is too slow for this --lease?); it did not run",
        );
        let _ = guard.release().await;
        return EXIT_ERROR;
    }
    #[cfg(windows)]
    let _ = start_by;
    watchdog.disarm();
    #[cfg(unix)]
    if error.raw_os_error() == Some(nix::errno::Errno::EPIPE as i32) {
        warn("the watchdog that stops the command if leasehold dies is gone; not running the command");
        let _ = guard.release().await;
        return EXIT_ERROR;
    }
    warn(&format!("cannot run {program:?}: {error}"));
    let _ = guard.release().await;
    let not_found = error.kind() == std::io::ErrorKind::NotFound;
    if not_found { 127 } else { 126 }
}

/// Until when the lease surely holds, by a look at it: a moment taken
/// before the look, plus what the holder counts on
/// ([`LockGuard::lease_left`]), plus `margin`; `None` if it is lost (or
/// the clock cannot be read). CMD's process must exec by then (a tool
/// stopped between its look and the fork, continued after the lease ran
/// out, must not start CMD), and each beat vouches for it to the
/// watchdog.
fn vouch(guard: &LockGuard, margin: Duration) -> Option<HeldUntil> {
    let look = HeldUntil::now()?;
    let left = guard.lease_left();
    (!left.is_zero()).then(|| look.after(left + margin))
}

/// What the lease runs past the moment its holder counts it lost: the
/// library's `min(renew interval, lease / 4)`, a quarter of the lease with
/// the default renew interval (a third), which `run` keeps; less
/// a sixteenth of the lease (at least 25 ms, at most an eighth) for the
/// milliseconds the library rounds to and the watchdog's own latency in
/// killing CMD's group.
fn margin(lease: Duration) -> Duration {
    let latency = (lease / 16).max(Duration::from_millis(25)).min(lease / 8);
    (lease / 4).saturating_sub(latency)
}

/// The guard back from the beats' thread, which is joined by now.
fn sole(guard: std::sync::Arc<LockGuard>) -> Result<LockGuard, Failure> {
    std::sync::Arc::try_unwrap(guard).map_err(|_| "internal error: the lock is still shared".into())
}

/// The lease ran out before CMD could start (the tool was stopped, or
/// starved, between taking the lock and starting CMD): CMD never runs, and
/// the run exits [`EXIT_LOST`].
async fn not_started_in_time(watchdog: &Watchdog, guard: LockGuard) -> u8 {
    watchdog.disarm();
    warn(
        "the lock was lost before the command started (leasehold was stopped or starved past its lease); the command did not run",
    );
    let _ = guard.release().await;
    EXIT_LOST
}

/// Waits until CMD has exited and its process group is empty, forwarding
/// the tool's signals to the group, and stopping the group if the lock is
/// lost meanwhile. Returns CMD's own status, and whether the loss was seen.
async fn watch(
    child: &mut tokio::process::Child,
    group: &Group,
    guard: &LockGuard,
    signals: &mut Forwarded,
    loss: &Loss<'_>,
    watchdog: &Watchdog,
) -> (std::io::Result<ExitStatus>, bool) {
    let mut lost = false;
    // The lease looked at by the clock too, as often as the beats: a
    // renewal thread that hangs (a disk that stopped answering) reports
    // nothing, and its lease runs out all the same.
    let mut looks = tokio::time::interval(watchdog.beat_every());
    looks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When the group gets SIGKILL, once the lock is lost; `None` before,
    // after, or for a grace too long to represent (then SIGTERM is all).
    let mut kill_at: Option<tokio::time::Instant> = None;
    // CMD's own status, once Tokio has collected it.
    let mut status: Option<std::io::Result<ExitStatus>> = None;
    loop {
        if status.is_some() {
            // Only now: before CMD's status is collected, this would take
            // it from Tokio.
            reap_orphans();
            if group_is_empty(group) {
                break;
            }
        }
        tokio::select! {
            biased;
            done = child.wait(), if status.is_none() => status = Some(done),
            sig = signals.recv() => signal_group(group, sig),
            () = guard.lost(), if !lost => {
                lost = true;
                kill_at = loss.stop(group);
            }
            () = tokio::time::sleep_until(kill_at.unwrap_or_else(tokio::time::Instant::now)), if kill_at.is_some() => {
                kill_at = None;
                loss.kill(group);
            }
            () = tokio::time::sleep(GROUP_POLL), if status.is_some() => {}
            _ = looks.tick(), if !lost => {
                if guard.is_lost() {
                    lost = true;
                    kill_at = loss.stop(group);
                }
            }
        }
    }
    let status = status.unwrap_or_else(|| Err(std::io::Error::other("no status")));
    (status, lost)
}

/// Releases the lock once CMD's group is empty. Returns whether the lock
/// was lost: `lost`, the loss seen while CMD ran, or one the release finds.
async fn release(guard: LockGuard, lost: bool, loss: &Loss<'_>) -> bool {
    match guard.release().await {
        Ok(()) => lost,
        Err(e) if e.is_lost() && lost => true,
        // CMD finished before the loss was noticed, but may have run
        // alongside another holder all the same: the caller must know.
        Err(e) if e.is_lost() => {
            loss.found_late(&e);
            true
        }
        Err(e) => {
            warn(&format!("warning: {}", chain(&e)));
            lost
        }
    }
}

/// CMD's status as a shell gives it: its exit code, or 128+N if signal N
/// killed it.
#[cfg(unix)]
fn exit_status(status: ExitStatus) -> u32 {
    use std::os::unix::process::ExitStatusExt;
    let status = match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + (sig & 0x7f)).unwrap_or(1),
        (None, None) => 1,
    };
    status.into()
}

/// Windows: CMD's exit code, all 32 bits of it (a process that ends by
/// Ctrl-C exits with `STATUS_CONTROL_C_EXIT`, 0xC000013A).
#[cfg(windows)]
fn exit_status(status: ExitStatus) -> u32 {
    status
        .code()
        .map_or(1, |code| u32::from_ne_bytes(code.to_ne_bytes()))
}

/// What `run` says and does when its lock is lost.
struct Loss<'a> {
    target: &'a Target,
    json: bool,
    #[cfg(unix)]
    kill_after: Duration,
}

impl Loss<'_> {
    /// Lost while CMD's group runs: says so, sends the group SIGTERM, and
    /// returns when to send it SIGKILL.
    #[cfg(unix)]
    fn stop(&self, group: &Group) -> Option<tokio::time::Instant> {
        if self.json {
            let kill_after_ms = u64::try_from(self.kill_after.as_millis()).unwrap_or(u64::MAX);
            status::event(
                "lost",
                self.target.shown(),
                json!({ "killAfterMs": kill_after_ms }),
            );
        }
        warn(&format!(
            "warning: lock {:?} was lost while the command ran; sending its process group SIGTERM, and SIGKILL in {:?}",
            self.target.name(),
            self.kill_after
        ));
        signal_group(group, Signal::SIGTERM);
        tokio::time::Instant::now().checked_add(self.kill_after)
    }

    /// Windows: lost while CMD's job runs: says so and terminates the job
    /// at once, every process of it exiting with [`EXIT_LOST`]. There is
    /// no SIGTERM to send first, so `--kill-after` has nothing to wait for.
    #[cfg(windows)]
    fn stop(&self, group: &Group) -> Option<tokio::time::Instant> {
        if self.json {
            status::event("lost", self.target.shown(), json!({ "killAfterMs": 0 }));
        }
        warn(&format!(
            "warning: lock {:?} was lost while the command ran; terminating its job object (the command and every process it started)",
            self.target.name(),
        ));
        group.terminate(EXIT_LOST.into());
        None
    }

    /// Windows: never reached, as `stop` asks for no later kill; the
    /// same termination if it were.
    #[cfg(windows)]
    fn kill(&self, group: &Group) {
        group.terminate(EXIT_LOST.into());
    }

    /// The group outlived `--kill-after` after SIGTERM.
    #[cfg(unix)]
    fn kill(&self, group: &Group) {
        warn(&format!(
            "warning: the command's process group did not exit within {:?} of SIGTERM; sending it SIGKILL",
            self.kill_after
        ));
        signal_group(group, Signal::SIGKILL);
    }

    /// Found only by the release, once the group had exited.
    fn found_late(&self, error: &leasehold::Error) {
        if self.json {
            status::event("lost", self.target.shown(), json!({ "killAfterMs": null }));
        }
        warn(&format!(
            "warning: the lock was lost while the command ran: {}",
            chain(error)
        ));
    }
}
