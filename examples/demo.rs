//! Three processes take turns with one lock; the holder is killed mid-hold
//! and the others carry on at once, although the lease is a minute long.
//!
//! ```text
//! cargo run --example demo
//! ```
//!
//! Every line is printed while what it says is true: a worker prints only
//! while it holds the lock ("releasing it" comes before the release), and
//! the holder is frozen before it is named and killed, so it cannot let go
//! in between (with SIGSTOP on Unix; on Windows by attaching to it as a
//! debugger, which suspends all its threads). Each holder shows its fencing token, larger than every one
//! before it (a process reserves tokens in blocks, so they jump). So the
//! output never shows two holders at once.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use leasehold::{Locker, Result};

const LOCK: &str = "nightly-report";
const LEASE: Duration = Duration::from_secs(60);
/// How long a worker keeps the lock each turn.
const TURN: Duration = Duration::from_millis(300);

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some("worker") {
        let (dir, id, stop) = (args.next(), args.next(), args.next());
        return worker(
            &dir.unwrap_or_default(),
            &id.unwrap_or_default(),
            &stop.unwrap_or_default(),
        )
        .await;
    }

    let scratch = tempfile::tempdir().map_err(|e| leasehold::Error::Io {
        op: "create a temporary directory",
        path: std::env::temp_dir(),
        source: e,
    })?;
    let (dir, stop) = (scratch.path().join("locks"), scratch.path().join("stop"));
    let locker = locker(&dir)?;
    println!("lock directory: {}", locker.directory().display());
    println!(
        "starting 3 worker processes; each takes {LOCK:?} in turn and holds it {TURN:?} (lease {LEASE:?})\n"
    );

    let exe = std::env::current_exe().expect("own executable");
    let mut workers: Vec<Child> = (1..=3)
        .map(|id| {
            Command::new(&exe)
                .arg("worker")
                .arg(locker.directory())
                .arg(id.to_string())
                .arg(&stop)
                .spawn()
                .expect("spawn worker")
        })
        .collect();
    let pids: Vec<u32> = workers.iter().map(Child::id).collect();
    let id_of = |pid: u32| pids.iter().position(|&p| p == pid).map_or(0, |i| i + 1);

    // Let them take turns, then kill whoever holds the lock.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (victim, frozen) = freeze::holder(&locker, LOCK).await?;
    let pid = victim.pid().unwrap_or(0);
    let held_for = victim
        .acquired_at()
        .and_then(|t| t.elapsed().ok())
        .unwrap_or_default();
    println!(
        "\n>>> worker {} (pid {pid}) holds {LOCK:?} [token {}] (for {held_for:.1?} now); \
         frozen {} now, killing it\n",
        id_of(pid),
        victim.fencing_token().unwrap_or(0),
        freeze::HOW,
    );
    let killed_at = Instant::now();
    if let Some(i) = workers.iter().position(|w| w.id() == pid) {
        let _ = workers[i].kill();
    }
    drop(frozen);
    loop {
        match locker.holder(LOCK).await? {
            Some(next) if next.pid() != Some(pid) => {
                let next_pid = next.pid().unwrap_or(0);
                println!(
                    "\n>>> worker {} (pid {next_pid}) took {LOCK:?} {:.1?} after the kill, \
                     without waiting out the {LEASE:?} lease\n",
                    id_of(next_pid),
                    killed_at.elapsed()
                );
                break;
            }
            _ if killed_at.elapsed() > Duration::from_secs(5) => {
                println!("\n>>> nobody took {LOCK:?} within 5 s of the kill\n");
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(1)).await,
        }
    }

    // A few more turns, then the workers stop after their current one.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let _ = std::fs::File::create(&stop);
    for w in &mut workers {
        let _ = w.wait();
    }
    println!(
        "\nall workers done; lock left on disk: {}",
        locker.is_held(LOCK).await?
    );
    Ok(())
}

fn locker(dir: &Path) -> Result<Locker> {
    Locker::builder()
        .directory(dir)
        .lease(LEASE)
        .fencing(true)
        .poll_interval(Duration::from_millis(10))
        .build()
}

/// Freezing the holder, so that it cannot let go between the look that
/// names it and the kill.
#[cfg(unix)]
mod freeze {
    use std::time::Duration;

    use leasehold::{Locker, Owner, Result};
    use nix::sys::signal::{Signal, kill};
    use nix::sys::wait::{WaitPidFlag, waitpid};
    use nix::unistd::Pid;

    pub const HOW: &str = "with SIGSTOP";

    /// A frozen process, let go (SIGCONT) when dropped: after the kill,
    /// that changes nothing.
    pub struct Frozen(Pid);

    impl Drop for Frozen {
        fn drop(&mut self) {
            let _ = kill(self.0, Signal::SIGCONT);
        }
    }

    /// The holder of `name`, stopped with SIGSTOP while it holds it. A
    /// worker that turns out to have let go before it stopped is let go on,
    /// and the next holder tried.
    pub async fn holder(locker: &Locker, name: &str) -> Result<(Owner, Frozen)> {
        loop {
            let Some(holder) = locker.holder(name).await? else {
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            };
            let pid = Pid::from_raw(holder.pid().unwrap_or(0) as i32);
            if kill(pid, Signal::SIGSTOP).is_ok() {
                let frozen = Frozen(pid);
                // Returns once the worker is stopped (or gone).
                let _ = tokio::task::spawn_blocking(move || waitpid(pid, Some(WaitPidFlag::WUNTRACED))).await;
                let still = locker.holder(name).await?;
                if still.is_some_and(|now| {
                    now.pid() == holder.pid() && now.fencing_token() == holder.fencing_token()
                }) {
                    return Ok((holder, frozen));
                }
            }
        }
    }
}

/// Freezing the holder, so that it cannot let go between the look that
/// names it and the kill: Windows has no SIGSTOP, but a process a debugger
/// attaches to has all its threads suspended until the debugger goes on.
#[cfg(windows)]
mod freeze {
    use std::sync::mpsc;
    use std::time::Duration;

    use leasehold::{Locker, Owner, Result};
    use windows_sys::Win32::System::Diagnostics::Debug::{
        DebugActiveProcess, DebugActiveProcessStop, DebugSetProcessKillOnExit,
    };

    pub const HOW: &str = "by a debugger";

    /// A frozen process: a thread of ours is its debugger (a debugger is a
    /// thread). Dropping this lets it go (after the kill, that changes
    /// nothing).
    pub struct Frozen(mpsc::Sender<()>);

    /// Attaches to `pid` on a thread of its own, which stays its debugger
    /// (without answering its debug events, so it stays suspended) until
    /// told to let go; `None` if it cannot be attached to.
    fn attach(pid: u32) -> Option<Frozen> {
        let (attached_tx, attached) = mpsc::channel();
        let (go_on, wait) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            // SAFETY: plain calls with a process id; the debugger is this
            // thread, which detaches before it ends.
            let ok = unsafe { DebugActiveProcess(pid) } != 0;
            if ok {
                // SAFETY: as above; the debuggee is not killed if we exit.
                unsafe { DebugSetProcessKillOnExit(0) };
            }
            let _ = attached_tx.send(ok);
            if ok {
                let _ = wait.recv();
                // SAFETY: detaches the process this thread attached to.
                unsafe { DebugActiveProcessStop(pid) };
            }
        });
        attached.recv().ok()?.then_some(Frozen(go_on))
    }

    /// The holder of `name`, suspended while it holds it. A worker that
    /// turns out to have let go before it was suspended is let go on, and
    /// the next holder tried.
    pub async fn holder(locker: &Locker, name: &str) -> Result<(Owner, Frozen)> {
        loop {
            let Some(holder) = locker.holder(name).await? else {
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            };
            if let Some(frozen) = attach(holder.pid().unwrap_or(0)) {
                let still = locker.holder(name).await?;
                if still.is_some_and(|now| {
                    now.pid() == holder.pid() && now.fencing_token() == holder.fencing_token()
                }) {
                    return Ok((holder, frozen));
                }
                drop(frozen.0);
            }
        }
    }
}

async fn worker(dir: &str, id: &str, stop: &str) -> Result<()> {
    let locker = locker(Path::new(dir))?;
    let pid = std::process::id();
    while !Path::new(stop).exists() {
        let asked = Instant::now();
        let guard = locker.acquire(LOCK).await?;
        println!(
            "worker {id} (pid {pid}) holds {LOCK:?} [token {}] after waiting {:.1?}",
            guard.fencing_token().unwrap_or(0),
            asked.elapsed()
        );
        tokio::time::sleep(TURN).await;
        // Said while still true: the next holder's line can only follow.
        println!("worker {id} (pid {pid}) releasing it");
        guard.release().await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}
