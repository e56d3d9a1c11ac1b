//! Three processes share one lock; one holder is killed mid-hold and the
//! others carry on at once, although the lease is a minute long.
//!
//! ```text
//! cargo run --example demo
//! ```

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use leasehold::{Locker, Result};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const LOCK: &str = "nightly-report";
const LEASE: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some("worker") {
        let dir = args.next().unwrap_or_default();
        let id = args.next().unwrap_or_default();
        return worker(&dir, &id).await;
    }

    let dir = tempfile::tempdir().map_err(|e| leasehold::Error::Io {
        op: "create a temporary directory",
        path: std::env::temp_dir(),
        source: e,
    })?;
    let locker = locker(dir.path().to_str().unwrap_or("."))?;
    println!("lock directory: {}", locker.directory().display());
    println!("starting 3 worker processes; each wants {LOCK:?} three times (lease {LEASE:?})\n");

    let exe = std::env::current_exe().expect("own executable");
    let mut workers: Vec<Child> = (1..=3)
        .map(|id| {
            Command::new(&exe)
                .args([
                    "worker",
                    locker.directory().to_str().unwrap_or("."),
                    &id.to_string(),
                ])
                .spawn()
                .expect("spawn worker")
        })
        .collect();

    // Let them take turns, then kill whoever holds the lock.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let owner = loop {
        if let Some(owner) = locker.holder(LOCK).await? {
            break owner;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let victim = owner.pid().unwrap_or(0);
    let held_for = owner
        .acquired_at()
        .and_then(|t| t.elapsed().ok())
        .unwrap_or_default();
    println!("\n>>> pid {victim} has held {LOCK:?} for {held_for:.1?}; sending it SIGKILL\n");
    let killed_at = Instant::now();
    let _ = kill(Pid::from_raw(victim as i32), Signal::SIGKILL);
    loop {
        match locker.holder(LOCK).await? {
            Some(next) if next.pid() != Some(victim) => {
                println!(
                    "\n>>> pid {} took over {:.1?} after the kill; no waiting for the {LEASE:?} lease\n",
                    next.pid().unwrap_or(0),
                    killed_at.elapsed()
                );
                break;
            }
            _ if killed_at.elapsed() > Duration::from_secs(5) => {
                println!(">>> nobody took over within 5 s");
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(1)).await,
        }
    }
    for w in &mut workers {
        let _ = w.wait();
    }
    println!(
        "\nall workers done; lock left on disk: {}",
        locker.is_held(LOCK).await?
    );
    Ok(())
}

fn locker(dir: &str) -> Result<Locker> {
    Locker::builder()
        .directory(dir)
        .lease(LEASE)
        .poll_interval(Duration::from_millis(10))
        .build()
}

async fn worker(dir: &str, id: &str) -> Result<()> {
    let locker = locker(dir)?;
    let pid = std::process::id();
    for round in 1..=3 {
        let asked = Instant::now();
        let guard = locker.acquire(LOCK).await?;
        println!(
            "worker {id} (pid {pid}) holds {LOCK:?} [round {round}] after waiting {:.1?}",
            asked.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        guard.release().await?;
        println!("worker {id} (pid {pid}) released it");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}
