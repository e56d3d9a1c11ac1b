//! What `run` does around CMD besides the lock: its watchdog (a child
//! that kills CMD's process group if `run` dies), the signals it forwards,
//! starting CMD guarded and with its environment, the subreaper and the
//! reaping of orphans, signalling and watching CMD's process group, and
//! handing the terminal to CMD and back.

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};

use super::exit::{EXIT_ERROR, Failure};
use super::output::warn;

/// How often `run` checks whether CMD's process group is empty, once CMD
/// itself has exited.
pub(super) const GROUP_POLL: Duration = Duration::from_millis(50);

/// The only argument `run` starts its watchdog with.
pub(super) const WATCHDOG: &str = "__watchdog";

/// The byte `run` sends its watchdog once CMD's process group is empty.
pub(super) const DISARM: u8 = b'd';

/// The watchdog of one `run`: a child process (this same binary, in a
/// process group of its own) reading a pipe whose write end only `run`
/// holds. CMD writes its pid, which is its process group id, to the pipe
/// before it execs; `run` writes [`DISARM`] once the group is empty. At EOF
/// without it, `run` is gone (SIGKILL, the OOM killer, a crash) and the
/// watchdog SIGKILLs CMD's group. See [`watchdog`].
pub(super) struct Watchdog {
    pipe: std::sync::Arc<std::io::PipeWriter>,
    // Never waited for: it exits only after we do, at EOF.
    _process: std::process::Child,
}

impl Watchdog {
    pub(super) fn start() -> Result<Self, Failure> {
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
        })
    }

    /// CMD's group is empty: the watchdog exits without killing anything.
    pub(super) fn disarm(&self) {
        let _ = (&*self.pipe).write_all(&[DISARM]);
    }
}

/// `leasehold __watchdog`, started by `run` (see [`Watchdog`]): reads CMD's
/// process group id from stdin, then waits for EOF, and SIGKILLs the group
/// unless `run` disarmed it first. Runs without the async runtime.
pub(super) fn watchdog() -> ExitCode {
    use nix::sys::signal::SigSet;
    use std::io::{IsTerminal, Read};
    // Blocked, not ignored: the mask is ours alone (std clears it in the
    // processes it spawns), and blocking needs no unsafe code. Only an
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
    let mut stdin = stdin.lock();
    let mut pid = [0; 4];
    if stdin.read_exact(&mut pid).is_err() {
        // `run` ended before CMD started.
        return ExitCode::SUCCESS;
    }
    let group = Pid::from_raw(i32::from_ne_bytes(pid));
    // kill(-1) would signal every process we may signal.
    if group.as_raw() <= 1 || group == nix::unistd::getpgrp() {
        return ExitCode::from(EXIT_ERROR);
    }
    let mut byte = [0; 1];
    loop {
        match stdin.read(&mut byte) {
            Ok(0) => break,
            Ok(_) if byte[0] == DISARM => return ExitCode::SUCCESS,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = nix::sys::signal::killpg(group, Signal::SIGKILL);
    ExitCode::SUCCESS
}

/// Signals the tool forwards to CMD's process group. Installed before the wait for the lock,
/// so a signal is never lost between taking the lock and spawning CMD.
pub(super) struct Forwarded([tokio::signal::unix::Signal; 3]);

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
pub(super) fn command(
    program: &OsString,
    args: &[OsString],
    shown: &str,
    token: Option<u64>,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(program);
    command.args(args).env("LEASEHOLD_NAME", shown);
    if let Some(token) = token {
        command.env("LEASEHOLD_FENCING_TOKEN", token.to_string());
    }
    // CMD leads a process group of its own: the unit that is signalled,
    // waited for and, by the watchdog, killed.
    command.process_group(0);
    command
}

/// Starts CMD guarded (see [`guard_command`]) and hands it the terminal if
/// `terminal`. Not async, so no `.await` comes between the check in
/// `guard_command` and the fork: it forks on the thread checked. The outer
/// error is the tool's; the inner one says CMD could not be started.
pub(super) fn spawn(
    command: &mut tokio::process::Command,
    watchdog: &Watchdog,
    terminal: Option<&Terminal>,
) -> Result<std::io::Result<tokio::process::Child>, Failure> {
    guard_command(command, watchdog, terminal)?;
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

/// Elsewhere init reaps orphans, a little later.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(super) fn become_subreaper() -> Result<(), Failure> {
    Ok(())
}

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

/// Whether no process is left in the group; EPERM (a member we may not
/// signal, e.g. set-user-ID) counts as alive.
pub(super) fn group_is_empty(group: Pid) -> bool {
    nix::sys::signal::killpg(group, None) == Err(nix::errno::Errno::ESRCH)
}

/// A failed kill only means the group is already gone, which the loop in
/// `run` notices.
pub(super) fn signal_group(group: Pid, sig: Signal) {
    let _ = nix::sys::signal::killpg(group, sig);
}

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

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = nix::unistd::tcsetpgrp(&self.tty, nix::unistd::getpgrp());
    }
}

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
    // its own process group (std's `process_group` runs before the hook)
    // and its signal mask is empty (std clears it before the hook). The
    // hook makes syscalls only, through nix's thin wrappers (prctl,
    // getppid, getpid, write, pthread_sigmask, tcsetpgrp, all
    // async-signal-safe), on values built before the fork or on the stack;
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
            // If it is gone already, the write fails: CMD never runs.
            let pid = getpid().as_raw().to_ne_bytes();
            if write(&*pipe, &pid)? != pid.len() {
                return Err(Errno::EPIPE.into());
            }
            if let Some(tty) = &tty {
                let mut ttou = SigSet::empty();
                ttou.add(Signal::SIGTTOU);
                ttou.thread_block()?;
                // Failing leaves CMD in the background: not a reason to refuse.
                let _ = tcsetpgrp(tty, getpid());
                ttou.thread_unblock()?;
            }
            Ok(())
        });
    }
    Ok(())
}
