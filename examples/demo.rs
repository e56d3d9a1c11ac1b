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
//! in between. Each holder shows its fencing token, larger than every one
//! before it (a process reserves tokens in blocks, so they jump). So the
//! output never shows two holders at once.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use leasehold::{Locker, Owner, Result};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

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
    let id_of = |pid: u32| workers.iter().position(|w| w.id() == pid).map_or(0, |i| i + 1);

    // Let them take turns, then kill whoever holds the lock.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let victim = frozen_holder(&locker).await?;
    let pid = victim.pid().unwrap_or(0);
    let held_for = victim
        .acquired_at()
        .and_then(|t| t.elapsed().ok())
        .unwrap_or_default();
    println!(
        "\n>>> worker {} (pid {pid}) holds {LOCK:?} [token {}] (for {held_for:.1?} now); \
         frozen with SIGSTOP now, killing it with SIGKILL\n",
        id_of(pid),
        victim.fencing_token().unwrap_or(0),
    );
    let killed_at = Instant::now();
    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
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

/// The holder of the lock, stopped with SIGSTOP while it holds it: it
/// cannot let go between this look and the kill. A worker that turns out
/// to have let go before it stopped is let go on (SIGCONT), and the next
/// holder tried.
async fn frozen_holder(locker: &Locker) -> Result<Owner> {
    loop {
        let Some(holder) = locker.holder(LOCK).await? else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let pid = Pid::from_raw(holder.pid().unwrap_or(0) as i32);
        if kill(pid, Signal::SIGSTOP).is_ok() {
            // Returns once the worker is stopped (or gone).
            let _ = tokio::task::spawn_blocking(move || waitpid(pid, Some(WaitPidFlag::WUNTRACED))).await;
            let still = locker.holder(LOCK).await?;
            if still
                .is_some_and(|now| now.pid() == holder.pid() && now.fencing_token() == holder.fencing_token())
            {
                return Ok(holder);
            }
            let _ = kill(pid, Signal::SIGCONT);
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
