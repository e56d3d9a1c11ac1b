//! What `run` does around CMD besides the lock: its watchdog (a child
//! that kills CMD's process group if `run` dies), the signals it forwards,
//! starting CMD guarded and with its environment, the subreaper and the
//! reaping of orphans, signalling and watching CMD's process group, and
//! handing the terminal to CMD and back.
//!
//! On Windows (at the end of this file) the same names stand for CMD's Job
//! object (job.rs): the watchdog is the job, which the kernel terminates
//! with the tool; CMD's group is the job's processes; the console, not
//! the tool, hands Ctrl-C and Ctrl-Break to CMD; there is no terminal to
//! hand over and no orphan to reap.

use std::ffi::OsString;
#[cfg(unix)]
use std::io::Write;
#[cfg(unix)]
use std::process::ExitCode;
use std::time::Duration;

#[cfg(unix)]
use nix::sys::signal::Signal;
#[cfg(unix)]
use nix::unistd::Pid;
#[cfg(unix)]
use tokio::signal::unix::{SignalKind, signal};

#[cfg(unix)]
use super::exit::EXIT_ERROR;
use super::exit::Failure;
#[cfg(windows)]
use super::job::Job;
#[cfg(unix)]
use super::output::warn;

/// How often `run` checks whether CMD's process group is empty, once CMD
/// itself has exited.
pub(super) const GROUP_POLL: Duration = Duration::from_millis(50);

#[cfg(unix)]
/// The only argument `run` starts its watchdog with.
pub(super) const WATCHDOG: &str = "__watchdog";

#[cfg(unix)]
/// The byte `run` sends its watchdog once CMD's process group is empty.
pub(super) const DISARM: u8 = b'd';

#[cfg(unix)]
/// The byte a beat starts with (see [`Watchdog::beats`]): 8 bytes follow
/// in the same write, the moment on [`start_clock_ns`]'s clock until
/// which the tool vouches that the lease holds.
pub(super) const BEAT: u8 = b'b';

#[cfg(unix)]
/// The byte CMD's process sends before its pid: beats may come before it
/// (from before the spawn), and the pid's bytes follow it in the same
/// write, which a pipe never splits.
pub(super) const PID: u8 = b'p';

#[cfg(unix)]
/// The watchdog of one `run`: a child process (this same binary, in a
/// process group of its own) reading a pipe whose write end only `run`
/// holds. CMD writes its pid, which is its process group id, to the pipe
/// before it execs (after [`PID`]); `run` writes [`DISARM`] once the group is empty. At EOF
/// without it, `run` is gone (SIGKILL, the OOM killer, a crash) and the
/// watchdog SIGKILLs CMD's group. See [`watchdog`].
///
/// A tool that is stopped (SIGSTOP, a debugger) is not gone, but renews
/// nothing: past its lease another process may take the lock, while CMD,
/// in a group of its own, runs on. So `run` beats ([`BEAT`]) every
/// [`Self::beat_every`], each beat vouching for the lease until a moment
/// ([`HeldUntil`]: what the lease provably has left at the tool's look at
/// it), and a watchdog that holds CMD's pid SIGKILLs CMD's group once the
/// latest moment vouched for has passed: by the lease's end at the latest,
/// whether the tool was stopped or its renewals failed.
pub(super) struct Watchdog {
    pipe: std::sync::Arc<std::io::PipeWriter>,
    // Never waited for: it exits only after we do, at EOF.
    _process: std::process::Child,
    beat_every: Duration,
}

#[cfg(unix)]
/// The clock CMD's latest start is set on, in nanoseconds: the boot clock
/// where there is one (it counts a suspended machine, as the lease does),
/// else the monotonic clock (macOS's counts sleep too). Read in the child
/// between fork and exec too: `clock_gettime` is async-signal-safe, and
/// nothing here allocates.
fn start_clock_ns() -> Option<u64> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let id = nix::time::ClockId::CLOCK_BOOTTIME;
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let id = nix::time::ClockId::CLOCK_MONOTONIC;
    let now = nix::time::clock_gettime(id).ok()?;
    u64::try_from(now.tv_sec())
        .ok()?
        .checked_mul(1_000_000_000)?
        .checked_add(u64::try_from(now.tv_nsec()).ok()?)
}

#[cfg(unix)]
/// A moment on [`start_clock_ns`]'s clock until which the lease provably
/// holds: taken before a look at the lease that found it held, plus what
/// the lease had left then (`run`'s `vouch`). CMD's own process
/// checks it just before exec (a tool stopped between its look and the
/// fork, continued after the lease ran out, must not start CMD beside the
/// next holder), and each beat carries one to the watchdog.
#[derive(Clone, Copy)]
pub(super) struct HeldUntil(u64);

#[cfg(unix)]
impl HeldUntil {
    /// Now; `None` if the clock cannot be read.
    pub(super) fn now() -> Option<Self> {
        start_clock_ns().map(Self)
    }

    /// `later` after this moment.
    pub(super) fn after(self, later: Duration) -> Self {
        let later = u64::try_from(later.as_nanos()).unwrap_or(u64::MAX);
        Self(self.0.saturating_add(later))
    }

    /// Whether it is past (or the clock cannot be read).
    pub(super) fn passed(&self) -> bool {
        start_clock_ns().is_none_or(|now| now > self.0)
    }
}

#[cfg(unix)]
/// The error CMD's process fails with when it is past its [`HeldUntil`].
pub(super) const LATE: nix::errno::Errno = nix::errno::Errno::ETIMEDOUT;

#[cfg(unix)]
impl Watchdog {
    /// Starts the watchdog of a lock whose lease is `lease`.
    pub(super) fn start(lease: Duration) -> Result<Self, Failure> {
        // 32 beats a lease: each vouches for what the lease has left, at
        // least about 3/16 of it (`run`'s `vouch`), so about five beats in
        // a row may be late before the watchdog takes the tool for
        // stopped, and many more while renewals are on time.
        let beat_every = (lease / 32).max(Duration::from_millis(1));
        use std::os::unix::process::CommandExt;
        let (read, write) = std::io::pipe().map_err(|e| format!("cannot create a pipe: {e}"))?;
        // This very binary even if it was replaced or deleted since.
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let exe = std::path::PathBuf::from("/proc/self/exe");
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let exe = std::env::current_exe()?;
        let process = std::process::Command::new(exe)
            .arg0("leasehold")
            .arg(WATCHDOG)
            .stdin(read)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .current_dir("/")
            // Out of our group, so that a signal to our whole job (Ctrl-C,
            // `timeout`, a shell's SIGHUP) never reaches it.
            .process_group(0)
            .spawn()?;
        Ok(Self {
            pipe: std::sync::Arc::new(write),
            _process: process,
            beat_every,
        })
    }

    /// One beat, from the caller's thread: the first, before the spawn.
    pub(super) fn vouch(&self, until: HeldUntil) {
        vouch(&self.pipe, until);
    }

    /// How often `run` looks at the lease while CMD runs (and beats).
    pub(super) fn beat_every(&self) -> Duration {
        self.beat_every
    }

    /// Beats from a thread of the tool's own, from before CMD is spawned
    /// (std's spawn waits for the exec, which may be slow) until the
    /// returned [`Beats`] is dropped, each vouching for what `held()` says
    /// (`None`: the lease is lost, by the clock even with the renewal
    /// thread hung, and nothing is vouched for). A stopped tool stops every
    /// thread: its last vouch runs out.
    pub(super) fn beats(&self, held: impl Fn() -> Option<HeldUntil> + Send + 'static) -> Beats {
        let pipe = std::sync::Arc::clone(&self.pipe);
        let every = self.beat_every;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = std::sync::Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("leasehold-beat".into())
            .spawn(move || {
                while !stopped.load(std::sync::atomic::Ordering::Acquire) {
                    if let Some(until) = held() {
                        vouch(&pipe, until);
                    }
                    std::thread::park_timeout(every);
                }
            });
        Beats {
            stop,
            thread: thread.ok(),
        }
    }

    /// CMD's group is empty: the watchdog exits without killing anything.
    pub(super) fn disarm(&self) {
        let _ = (&*self.pipe).write_all(&[DISARM]);
    }
}

#[cfg(unix)]
/// One beat: the lease holds until `until` (one write of 9 bytes, which a
/// pipe never splits). A failed write (the watchdog gone, and CMD's group
/// with it) is for the loss check to find.
fn vouch(pipe: &std::io::PipeWriter, until: HeldUntil) {
    let mut beat = [BEAT; 9];
    beat[1..].copy_from_slice(&until.0.to_ne_bytes());
    let _ = (&*pipe).write_all(&beat);
}

#[cfg(unix)]
/// The thread that beats to the watchdog ([`Watchdog::beats`]); stopped
/// and joined when dropped.
pub(super) struct Beats {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[cfg(unix)]
impl Beats {
    /// Whether the thread runs: without it, nothing vouches for the tool.
    pub(super) fn started(&self) -> bool {
        self.thread.is_some()
    }
}

#[cfg(unix)]
impl Drop for Beats {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

#[cfg(unix)]
/// `leasehold __watchdog`, started by `run` (see [`Watchdog`]): reads
/// frames from stdin (beats, CMD's process group id, the disarm), and
/// once it has the group, SIGKILLs it at EOF or when the latest moment a
/// beat vouched for has passed, unless `run` disarmed it first. Runs
/// without the async runtime.
pub(super) fn watchdog() -> ExitCode {
    use nix::sys::signal::SigSet;
    use std::io::IsTerminal;
    use std::os::fd::AsFd;
    // Blocked, not ignored: blocking needs no unsafe code, and the
    // watchdog starts nothing that would inherit the mask. Only an
    // explicit SIGKILL or SIGSTOP stops the watchdog.
    let mut blocked = SigSet::empty();
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGTSTP,
        Signal::SIGTTIN,
        Signal::SIGTTOU,
    ] {
        blocked.add(sig);
    }
    let _ = blocked.thread_block();
    // Started as /proc/self/exe, it would show as `exe` in ps and top.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let _ = nix::sys::prctl::set_name(c"leasehold-wd");
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        warn("the watchdog is internal to `leasehold run`");
        return ExitCode::from(EXIT_ERROR);
    }
    // Unbuffered: a byte must never wait in a buffer that `poll` below
    // does not see.
    let mut stdin = std::fs::File::from(match stdin.as_fd().try_clone_to_owned() {
        Ok(fd) => fd,
        Err(_) => return ExitCode::from(EXIT_ERROR),
    });
    // Beats until CMD's pid: nothing to guard yet; the latest moment
    // vouched for is kept.
    let mut vouched = 0;
    let group = loop {
        match read_frame(&mut stdin) {
            Frame::Beat(until) => vouched = vouched.max(until),
            Frame::Pid(pid) => break Pid::from_raw(pid),
            // `run` ended, or is done, before CMD started.
            Frame::Disarm | Frame::End => return ExitCode::SUCCESS,
        }
    };
    // kill(-1) would signal every process we may signal.
    if group.as_raw() <= 1 || group == nix::unistd::getpgrp() {
        return ExitCode::from(EXIT_ERROR);
    }
    if guard_group(&mut stdin, vouched) {
        let _ = nix::sys::signal::killpg(group, Signal::SIGKILL);
    }
    ExitCode::SUCCESS
}

#[cfg(unix)]
/// What `run` (or CMD's process) says on the watchdog's pipe, one write
/// each, which a pipe never splits.
enum Frame {
    /// [`BEAT`]: the lease holds until then ([`HeldUntil`]).
    Beat(u64),
    /// [`PID`]: CMD's pid, its process group's id.
    Pid(i32),
    /// [`DISARM`].
    Disarm,
    /// EOF, an error, or bytes of no frame: `run` is gone (or is not
    /// `run`).
    End,
}

#[cfg(unix)]
fn read_frame(pipe: &mut std::fs::File) -> Frame {
    use std::io::Read;
    let mut tag = [0; 1];
    if pipe.read_exact(&mut tag).is_err() {
        return Frame::End;
    }
    match tag[0] {
        BEAT => {
            let mut until = [0; 8];
            match pipe.read_exact(&mut until) {
                Ok(()) => Frame::Beat(u64::from_ne_bytes(until)),
                Err(_) => Frame::End,
            }
        }
        PID => {
            let mut pid = [0; 4];
            match pipe.read_exact(&mut pid) {
                Ok(()) => Frame::Pid(i32::from_ne_bytes(pid)),
                Err(_) => Frame::End,
            }
        }
        DISARM => Frame::Disarm,
        _ => Frame::End,
    }
}

#[cfg(unix)]
/// Reads `run`'s frames until it disarms the watchdog (`false`), or is
/// gone or has vouched for nothing that lasts (`true`: CMD's group must
/// die): EOF, an error, or the latest moment vouched for (`vouched`, then
/// each beat's) passed, on the boot clock on Linux (a machine suspended
/// while the tool is stopped counts). Each wait is at most 100 ms, so a
/// resume is noticed.
fn guard_group(pipe: &mut std::fs::File, mut vouched: u64) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    const STEP: Duration = Duration::from_millis(100);
    enum Look {
        Frame,
        Empty,
        Interrupted,
        Broken,
    }
    let look = |pipe: &std::fs::File, wait: Duration| {
        let millis = u16::try_from(wait.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(pipe.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(millis)) {
            // Data, or EOF (which `read_frame` reads as the end).
            Ok(n) if n > 0 => Look::Frame,
            Ok(_) => Look::Empty,
            Err(nix::errno::Errno::EINTR) => Look::Interrupted,
            Err(_) => Look::Broken,
        }
    };
    'judge: loop {
        // The clock first, then every frame already there: a beat written
        // before `now` is read before `now` is judged, so a watchdog that
        // was itself slow to run (or stopped) never judges by an old beat
        // while newer ones wait in the pipe.
        let Some(now) = start_clock_ns() else {
            return true;
        };
        loop {
            match look(pipe, Duration::ZERO) {
                Look::Frame => match read_frame(pipe) {
                    Frame::Beat(until) => vouched = vouched.max(until),
                    Frame::Disarm => return false,
                    // A second pid (none is ever sent), EOF, garbage.
                    Frame::Pid(_) | Frame::End => return true,
                },
                Look::Empty => break,
                // A stop and a continue, say: the clock again, first.
                Look::Interrupted => continue 'judge,
                Look::Broken => return true,
            }
        }
        if now >= vouched {
            return true;
        }
        // Rounded down (a last wait under a millisecond spins): never
        // past the moment by the rounding. However the wait ends, the
        // loop looks again from the top.
        if let Look::Broken = look(pipe, Duration::from_nanos(vouched - now).min(STEP)) {
            return true;
        }
    }
}

#[cfg(unix)]
/// Signals the tool forwards to CMD's process group. Installed before the wait for the lock,
/// so a signal is never lost between taking the lock and spawning CMD.
pub(super) struct Forwarded([tokio::signal::unix::Signal; 3]);

#[cfg(unix)]
impl Forwarded {
    pub(super) fn install() -> Result<Self, Failure> {
        let one = |kind| signal(kind).map_err(|e| format!("cannot install a signal handler: {e}"));
        Ok(Self([
            one(SignalKind::interrupt())?,
            one(SignalKind::terminate())?,
            one(SignalKind::hangup())?,
        ]))
    }

    /// The next signal; never resolves if the signal driver has gone away,
    /// rather than spinning.
    pub(super) async fn recv(&mut self) -> Signal {
        let [int, term, hup] = &mut self.0;
        tokio::select! {
            Some(()) = int.recv() => Signal::SIGINT,
            Some(()) = term.recv() => Signal::SIGTERM,
            Some(()) = hup.recv() => Signal::SIGHUP,
            else => std::future::pending().await,
        }
    }
}

/// CMD with its arguments and its environment: `LEASEHOLD_NAME` (the lock
/// as given) and `LEASEHOLD_FENCING_TOKEN` (when the lock has one).
/// `shell` (`-c`) matters on Windows only.
pub(super) fn command(
    program: &OsString,
    args: &[OsString],
    shown: &str,
    token: Option<u64>,
    #[cfg_attr(unix, allow(unused_variables))] shell: bool,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(program);
    #[cfg(unix)]
    command.args(args);
    #[cfg(windows)]
    match args.split_last() {
        // `cmd /S /C "STRING"`: with /S, cmd takes off the first and the
        // last quote and runs what is between as it is. Through `arg`,
        // std would escape STRING's own quotes as `\"`, which cmd does not
        // read as C programs do.
        Some((script, switches)) if shell => {
            let mut quoted = OsString::from("\"");
            quoted.push(script);
            quoted.push("\"");
            command.args(switches).raw_arg(quoted);
        }
        _ => {
            command.args(args);
        }
    }
    command.env("LEASEHOLD_NAME", shown);
    if let Some(token) = token {
        command.env("LEASEHOLD_FENCING_TOKEN", token.to_string());
    }
    // CMD leads a process group of its own: the unit that is signalled,
    // waited for and, by the watchdog, killed. On Windows the Job object
    // (job.rs) is that unit.
    #[cfg(unix)]
    command.process_group(0);
    command
}

#[cfg(unix)]
/// Starts CMD guarded (see [`guard_command`]) and hands it the terminal if
/// `terminal`. Not async, so no `.await` comes between the check in
/// `guard_command` and the fork: it forks on the thread checked. The outer
/// error is the tool's; the inner one says CMD could not be started.
pub(super) fn spawn(
    command: &mut tokio::process::Command,
    watchdog: &Watchdog,
    terminal: Option<&Terminal>,
    start_by: HeldUntil,
) -> Result<std::io::Result<tokio::process::Child>, Failure> {
    guard_command(command, watchdog, terminal, start_by)?;
    let spawned = command.spawn();
    if let (Some(terminal), Ok(child)) = (terminal, &spawned) {
        // CMD's hook did this already; shells do it on both sides too.
        terminal.give_to(child.id().and_then(|p| i32::try_from(p).ok()));
    }
    Ok(spawned)
}

/// Orphaned descendants of CMD are reparented to us, not to init, so that
/// we can reap them: a zombie still counts as a member of its group.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(super) fn become_subreaper() -> Result<(), Failure> {
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|e| format!("cannot become a child subreaper: {e}").into())
}

/// Elsewhere init reaps orphans, a little later; on Windows an exited
/// process leaves nothing to reap.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(super) fn become_subreaper() -> Result<(), Failure> {
    Ok(())
}

/// CMD's process group, named by its id, CMD's pid.
#[cfg(unix)]
pub(super) type Group = Pid;

/// CMD's group once it runs (`None` cannot happen before it is waited for).
#[cfg(unix)]
pub(super) fn group_of(child: &tokio::process::Child, _watchdog: &Watchdog) -> Option<Group> {
    child.id().and_then(|p| i32::try_from(p).ok()).map(Pid::from_raw)
}

#[cfg(unix)]
/// Reaps every exited child: orphans of CMD's group, reparented to us. Call
/// only after Tokio has collected CMD's own status.
pub(super) fn reap_orphans() {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}

#[cfg(unix)]
/// Whether no process is left in the group; EPERM (a member we may not
/// signal, e.g. set-user-ID) counts as alive.
pub(super) fn group_is_empty(group: &Group) -> bool {
    nix::sys::signal::killpg(*group, None) == Err(nix::errno::Errno::ESRCH)
}

#[cfg(unix)]
/// A failed kill only means the group is already gone, which the loop in
/// `run` notices.
pub(super) fn signal_group(group: &Group, sig: Signal) {
    let _ = nix::sys::signal::killpg(*group, sig);
}

#[cfg(unix)]
/// The controlling terminal (`/dev/tty`, whatever stdin is), when our
/// process group is its foreground group: CMD's group takes it over (or
/// CMD would be stopped by SIGTTIN/SIGTTOU on using it, a password prompt
/// through `/dev/tty` included), and it is handed back to our group when
/// dropped. SIGTTOU, which a background group changing the terminal's
/// foreground group would get, is blocked in every thread of `run` (see
/// `main`).
pub(super) struct Terminal {
    tty: std::fs::File,
}

#[cfg(unix)]
impl Terminal {
    pub(super) fn if_foreground() -> Option<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let tty = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(nix::fcntl::OFlag::O_NOCTTY.bits() | nix::fcntl::OFlag::O_CLOEXEC.bits())
            .open("/dev/tty")
            .ok()?;
        let foreground = nix::unistd::tcgetpgrp(&tty).ok()?;
        (foreground == nix::unistd::getpgrp()).then_some(Self { tty })
    }

    pub(super) fn give_to(&self, group: Option<i32>) {
        if let Some(group) = group {
            let _ = nix::unistd::tcsetpgrp(&self.tty, Pid::from_raw(group));
        }
    }
}

#[cfg(unix)]
impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = nix::unistd::tcsetpgrp(&self.tty, nix::unistd::getpgrp());
    }
}

#[cfg(unix)]
/// Guards CMD between fork and exec, so that it never runs on without the
/// lock: it tells the watchdog its pid (its process group id) before it
/// can start anything, takes the terminal if `terminal`, and on Linux dies
/// with this process (`PR_SET_PDEATHSIG`, SIGKILL).
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked exits, not the
/// process: CMD must be forked from the main thread, whose exit is the
/// process's. `run` is polled by `block_on` on the main thread, and Tokio's
/// `Command::spawn` forks on the calling thread; the check below keeps that
/// true (a runtime worker or a blocking-pool thread may exit while we live).
#[allow(unsafe_code)]
fn guard_command(
    command: &mut tokio::process::Command,
    watchdog: &Watchdog,
    terminal: Option<&Terminal>,
    start_by: HeldUntil,
) -> Result<(), Failure> {
    use nix::errno::Errno;
    use nix::sys::signal::SigSet;
    use nix::unistd::{getpid, tcsetpgrp, write};

    // Only where a parent-death signal exists (below) is it compared.
    #[cfg_attr(not(any(target_os = "linux", target_os = "android")), allow(unused_variables))]
    let parent = getpid();
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if nix::unistd::gettid() != parent {
        return Err("internal error: the command must be started from the main thread".into());
    }
    let pipe = std::sync::Arc::clone(&watchdog.pipe);
    // The terminal's descriptor, duplicated before the fork (CLOEXEC, so CMD
    // does not keep it past exec).
    let tty = match terminal {
        Some(terminal) => Some(
            terminal
                .tty
                .try_clone()
                .map_err(|e| format!("cannot use the terminal: {e}"))?,
        ),
        None => None,
    };
    // SAFETY: the hook runs in the child between fork and exec, where only
    // async-signal-safe calls are sound. The child is already the leader of
    // its own process group (std's `process_group` runs before the hook);
    // its signal mask is the forking thread's (the hook empties it last).
    // The hook makes syscalls only, through nix's thin wrappers (prctl,
    // getppid, getpid, write, pthread_sigmask, tcsetpgrp, clock_gettime,
    // all async-signal-safe), on values built before the fork or on the stack;
    // nothing allocates or takes a lock, and its errors are errno values,
    // built without allocating.
    unsafe {
        command.pre_exec(move || {
            #[cfg(any(target_os = "linux", target_os = "android"))]
            {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                // We may have died between fork and prctl, and then no
                // death signal will ever come: the child has been reparented.
                if nix::unistd::getppid() != parent {
                    return Err(Errno::ESRCH.into());
                }
            }
            // From here on, the watchdog kills our group if the tool dies.
            // If it is gone already, the write fails: CMD never runs, and
            // `run` says why (std set SIGPIPE back to its default before
            // this hook, which would kill us silently instead: blocked for
            // the write, and a failed write's signal stays pending until we
            // exit, never delivered).
            let mut pipe_signal = SigSet::empty();
            pipe_signal.add(Signal::SIGPIPE);
            pipe_signal.thread_block()?;
            let pid = getpid().as_raw().to_ne_bytes();
            let said = [PID, pid[0], pid[1], pid[2], pid[3]];
            if write(&*pipe, &said)? != said.len() {
                return Err(Errno::EPIPE.into());
            }
            pipe_signal.thread_unblock()?;
            if let Some(tty) = &tty {
                let mut ttou = SigSet::empty();
                ttou.add(Signal::SIGTTOU);
                ttou.thread_block()?;
                // Failing leaves CMD in the background: not a reason to refuse.
                let _ = tcsetpgrp(tty, getpid());
            }
            // CMD starts with no signal blocked: the tool blocks some in
            // every thread (see `main`), and a child inherits its
            // parent's mask across fork and exec.
            SigSet::empty().thread_set_mask()?;
            // Last, just before exec: still within the lease.
            match start_clock_ns() {
                Some(now) if now <= start_by.0 => Ok(()),
                _ => Err(LATE.into()),
            }
        });
    }
    Ok(())
}

/// Windows: the watchdog is CMD's Job object, which the kernel terminates
/// with every process in it when the tool's handle to it closes, however
/// the tool ends. Created before the lock is taken, as the Unix watchdog is
/// started: a tool that cannot guard CMD never takes the lock.
#[cfg(windows)]
pub(super) struct Watchdog {
    job: std::sync::Arc<Job>,
}

#[cfg(windows)]
impl Watchdog {
    pub(super) fn start(_lease: Duration) -> Result<Self, Failure> {
        let job = Job::new().map_err(|e| format!("cannot create a job object: {e}"))?;
        Ok(Self {
            job: std::sync::Arc::new(job),
        })
    }

    /// Nothing to do: the job is empty, and closing it kills nothing.
    pub(super) fn disarm(&self) {}

    /// How often `run` beats: never needed on Windows, where nothing
    /// listens (a suspended tool's job is not watched: docs/guarantees.md,
    /// item 15).
    pub(super) fn beat_every(&self) -> Duration {
        Duration::from_secs(3600)
    }

    /// Nothing listens for beats on Windows.
    pub(super) fn beats(&self, _held: impl Fn() -> Option<HeldUntil> + Send + 'static) -> Beats {
        Beats
    }

    /// Nothing listens for beats on Windows.
    pub(super) fn vouch(&self, _until: HeldUntil) {}
}

/// Windows: no beats.
#[cfg(windows)]
pub(super) struct Beats;

#[cfg(windows)]
impl Beats {
    pub(super) fn started(&self) -> bool {
        true
    }
}

/// Windows: nothing to stop; `run` drops its beats as on Unix.
#[cfg(windows)]
impl Drop for Beats {
    fn drop(&mut self) {}
}

/// Windows: the console events the tool waits for. Ctrl-C and Ctrl-Break
/// reach every process attached to the console, CMD (which shares the
/// tool's console and process group) included, so there is nothing to
/// forward: the tool only stays alive to wait for CMD, and while it waits
/// for the lock, ends the wait. Closing the console window, logging off
/// and shutting down are not caught: the tool is ended with the console,
/// and its job with it.
#[cfg(windows)]
pub(super) struct Forwarded {
    interrupt: tokio::signal::windows::CtrlC,
    brk: tokio::signal::windows::CtrlBreak,
}

/// Windows: a console event, numbered as the C runtime's signals
/// (`SIGINT` 2, `SIGBREAK` 21), so that one arriving while the tool waits
/// for the lock ends it with 128+N as on Unix.
#[cfg(windows)]
#[derive(Debug, Clone, Copy)]
pub(super) enum Signal {
    Interrupt = 2,
    Break = 21,
}

#[cfg(windows)]
impl Forwarded {
    pub(super) fn install() -> Result<Self, Failure> {
        let failed = |e: std::io::Error| format!("cannot install a console control handler: {e}");
        Ok(Self {
            interrupt: tokio::signal::windows::ctrl_c().map_err(failed)?,
            brk: tokio::signal::windows::ctrl_break().map_err(failed)?,
        })
    }

    /// The next event; never resolves if the signal driver has gone away,
    /// rather than spinning.
    pub(super) async fn recv(&mut self) -> Signal {
        tokio::select! {
            Some(()) = self.interrupt.recv() => Signal::Interrupt,
            Some(()) = self.brk.recv() => Signal::Break,
            else => std::future::pending().await,
        }
    }
}

/// Windows: CMD's processes are those of the job.
#[cfg(windows)]
pub(super) struct Group(std::sync::Arc<Job>);

#[cfg(windows)]
impl Group {
    /// Terminates every process of the job, each exiting with `code`
    /// (Windows has no SIGTERM to give them a chance first).
    pub(super) fn terminate(&self, code: u32) {
        self.0.terminate(code);
    }
}

#[cfg(windows)]
pub(super) fn group_of(_child: &tokio::process::Child, watchdog: &Watchdog) -> Option<Group> {
    Some(Group(std::sync::Arc::clone(&watchdog.job)))
}

/// Windows: starts CMD in the job (job.rs). The outer error is the tool's:
/// the job could not take CMD, which was killed before it ran.
#[cfg(windows)]
pub(super) fn spawn(
    command: &mut tokio::process::Command,
    watchdog: &Watchdog,
    _terminal: Option<&Terminal>,
    _start_by: HeldUntil,
) -> Result<std::io::Result<tokio::process::Child>, Failure> {
    watchdog
        .job
        .spawn(command)
        .map_err(|e| format!("cannot put the command in a job object: {e}").into())
}

/// Windows: nothing to reap.
#[cfg(windows)]
pub(super) fn reap_orphans() {}

#[cfg(windows)]
pub(super) fn group_is_empty(group: &Group) -> bool {
    group.0.is_empty()
}

/// Windows: the console delivered the event to CMD itself.
#[cfg(windows)]
pub(super) fn signal_group(_group: &Group, _sig: Signal) {}

/// Windows: no latest start is checked in CMD's process (there is no hook
/// between creating it and running it); the tool's look at the lease just
/// before is all.
#[cfg(windows)]
#[derive(Clone, Copy)]
pub(super) struct HeldUntil;

#[cfg(windows)]
impl HeldUntil {
    pub(super) fn now() -> Option<Self> {
        Some(Self)
    }

    pub(super) fn after(self, _later: Duration) -> Self {
        self
    }
}

/// Windows: CMD shares the tool's console; there is no foreground process
/// group to hand it.
#[cfg(windows)]
pub(super) struct Terminal;

#[cfg(windows)]
impl Terminal {
    pub(super) fn if_foreground() -> Option<Self> {
        None
    }
}

/// Windows: nothing to hand back; `run` drops its terminal as on Unix.
#[cfg(windows)]
impl Drop for Terminal {
    fn drop(&mut self) {}
}
