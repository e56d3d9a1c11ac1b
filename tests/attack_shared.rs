//! Adversarial tests of shared locks and semaphores (commit bccbfcd).
//!
//! Each test here failed when it was written; see the comment on each for
//! the interleaving it forces.

#[cfg(unix)]
#[path = "support/reexec.rs"]
mod reexec;

#[cfg(unix)]
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
#[cfg(unix)]
use std::process::{Child, Stdio};
#[cfg(unix)]
use std::sync::mpsc;
use std::time::Duration;
#[cfg(unix)]
use std::time::Instant;

use leasehold::{Locker, PathStyle, Strategy};
#[cfg(unix)]
use nix::sys::signal::{Signal, kill};
#[cfg(unix)]
use nix::unistd::Pid;

const ROLE_ENV: &str = "LEASEHOLD_ATTACK_ROLE";
const DIR_ENV: &str = "LEASEHOLD_ATTACK_DIR";
const FLAG_ENV: &str = "LEASEHOLD_ATTACK_FLAG";

fn plain_locker(dir: &Path, strategy: Strategy) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .path_style(PathStyle::Plain)
        .build()
        .unwrap()
}

// ---------------------------------------------------------------------------
// Children
// ---------------------------------------------------------------------------

/// The child's main when run with a role; a no-op otherwise.
#[test]
fn child_process_entry() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    // No child outlives this.
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(90));
        std::process::exit(3);
    });
    let dir = PathBuf::from(std::env::var(DIR_ENV).unwrap());
    let flag = PathBuf::from(std::env::var(FLAG_ENV).unwrap_or_default());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let code = rt.block_on(async move {
        match role.as_str() {
            // Takes "cat" shared and lets it go, over and over, until the
            // flag file exists when it has just taken it: then keeps it.
            "churn" => {
                let locker = plain_locker(&dir, Strategy::ExclusiveFile);
                loop {
                    let guard = match locker.acquire_shared("cat").await {
                        Ok(guard) => guard,
                        Err(error) => {
                            println!("@@error {error}");
                            return 1;
                        }
                    };
                    if flag.exists() {
                        println!("@@holding");
                        tokio::time::sleep(Duration::from_secs(20)).await;
                        println!("@@done lost={}", guard.is_lost());
                        return 0;
                    }
                    guard.release().await.unwrap();
                }
            }
            _ => 2,
        }
    });
    std::process::exit(code);
}

// Only the SIGSTOP test below starts children.
#[cfg(unix)]
struct ChildProc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

#[cfg(unix)]
impl ChildProc {
    fn spawn(role: &str, dir: &Path, flag: &Path) -> Self {
        let mut child = reexec::child_process()
            .env(ROLE_ENV, role)
            .env(DIR_ENV, dir)
            .env(FLAG_ENV, flag)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                // libtest may print "test child_process_entry ... " first.
                if let Some(at) = line.find("@@") {
                    let _ = tx.send(line[at + 2..].to_owned());
                }
            }
        });
        ChildProc { child, lines }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    fn expect(&self, prefix: &str, within: Duration) -> Option<String> {
        let until = Instant::now() + within;
        loop {
            let left = until.checked_duration_since(Instant::now())?;
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Some(line),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }

    /// SIGSTOP, then wait until every thread of the child is stopped.
    fn stop(&self) -> bool {
        kill(self.pid(), Signal::SIGSTOP).unwrap();
        let until = Instant::now() + Duration::from_millis(500);
        while Instant::now() < until {
            if all_threads_stopped(self.child.id()) {
                return true;
            }
            std::thread::yield_now();
        }
        false
    }

    fn cont(&self) {
        kill(self.pid(), Signal::SIGCONT).unwrap();
    }
}

#[cfg(unix)]
impl Drop for ChildProc {
    fn drop(&mut self) {
        let _ = kill(self.pid(), Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

#[cfg(unix)]
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            return false;
        };
        // "pid (comm) S ...": the state follows the last ')'.
        let Some(state) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
        else {
            return false;
        };
        if state != 'T' && state != 't' {
            return false;
        }
    }
    true
}

// ---------------------------------------------------------------------------
// 1. The marker claims format 1 ("holder keeps flock(LOCK_EX) on the
//    record's inode") but nobody holds a flock on it.
// ---------------------------------------------------------------------------

/// The marker is a copy of a member's record, so it says `"leasehold": 1`,
/// whose documented promise (record.rs FORMAT_VERSION) is that the holder
/// keeps `flock(LOCK_EX)` on the record's inode while it holds the lock.
/// Nobody does: `publish_marker` closes the file, `publish_bytes` drops the
/// pending directory's descriptor. Every leasehold build before bccbfcd
/// (same format, same directory, e.g. during a rolling upgrade) judges a
/// leasehold record of this boot by that flock alone (stale.rs `liveness`:
/// `is_leasehold() && same_boot` -> flock test -> `DeadOwner`), reclaims the
/// marker at once (found.rs: a flocked reclaim skips the re-read) and takes
/// the name exclusively while the readers hold it.
#[tokio::test]
async fn marker_of_a_live_shared_lock_is_flocked_as_format_1_promises() {
    // Windows cannot lock a directory: `build()` refuses that layout there.
    let strategies: &[Strategy] = if cfg!(windows) {
        &[Strategy::ExclusiveFile]
    } else {
        &[Strategy::ExclusiveFile, Strategy::Directory]
    };
    for &strategy in strategies {
        let dir = tempfile::tempdir().unwrap();
        let locker = plain_locker(dir.path(), strategy);
        let reader = locker.acquire_shared("cat").await.unwrap();
        let path = dir.path().join("cat.lock");
        let text = match strategy {
            Strategy::ExclusiveFile => std::fs::read_to_string(&path).unwrap(),
            _ => std::fs::read_to_string(path.join("owner.json")).unwrap(),
        };
        assert!(text.contains("\"leasehold\":1"), "{text}");
        // On Windows a whole-file lock, which overlaps the holder's mark
        // as flock conflicts with its flock.
        let node = std::fs::File::open(&path).unwrap();
        let free = node.try_lock().is_ok();
        assert!(
            !free,
            "{strategy:?}: the marker of a live shared lock carries \"leasehold\":1 but its flock is free: \
             a pre-bccbfcd leasehold judges it DeadOwner and reclaims it"
        );
        drop(reader);
    }
}

// ---------------------------------------------------------------------------
// 2. The marker file is created empty and unflocked (publish_marker:
//    O_EXCL create, then pwrite). An exclusive acquirer that reads it empty
//    and past the grace period takes its (free) flock, judges it abandoned,
//    and its reclaim skips the re-read because it holds the flock: it
//    unlinks the marker the reader has written meanwhile, and takes the
//    name exclusively while the reader holds it.
// ---------------------------------------------------------------------------

/// Default settings (lease 30 s, unreadable grace 15 s). A reader process
/// is frozen (SIGSTOP; the same as a cgroup freeze, a VM pause, heavy
/// swapping) for 16 s between `publish_marker`'s create and its write,
/// well inside its 30 s lease. An exclusive `try_acquire` then judges the
/// empty marker (Unreadable past grace, flock free), flocks it and waits
/// for the directory lock; the reader thaws, writes the marker, finishes
/// joining and holds. The reclaim then unlinks the (now complete) marker
/// without re-reading it (`Found::reclaim`: `if !self.flocked`), and the
/// next round creates the exclusive lock: two holders. A frozen
/// *exclusive* creator is safe in the same spot, because `file::create`
/// flocks the file before writing it.
// SIGSTOP, and /proc to see every thread stopped: Windows has neither.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_first_reader_keeps_its_empty_marker() {
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("..").join(format!(
        "attack-flag-{}",
        dir.path().file_name().unwrap().to_string_lossy()
    ));
    let _ = std::fs::remove_file(&flag);
    let child = ChildProc::spawn("churn", dir.path(), &flag);
    let lock = dir.path().join("cat.lock");
    // Let it start churning.
    let until = Instant::now() + Duration::from_secs(20);
    while !lock.exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Freeze it at random until it is frozen inside the window.
    let until = Instant::now() + Duration::from_secs(40);
    let mut hit = false;
    let mut samples = 0u64;
    while Instant::now() < until {
        samples += 1;
        assert!(child.stop(), "could not stop the child");
        if std::fs::metadata(&lock).is_ok_and(|m| m.len() == 0) {
            hit = true;
            break;
        }
        child.cont();
        std::thread::sleep(Duration::from_micros(50 + (samples * 37) % 400));
    }
    if !hit {
        eprintln!("never froze the child inside the window in {samples} samples; inconclusive");
        return;
    }
    eprintln!("froze the reader inside publish_marker after {samples} samples");
    std::fs::write(&flag, b"hold").unwrap();
    // Frozen past the default unreadable grace (15 s), inside the lease (30 s).
    tokio::time::sleep(Duration::from_secs(16)).await;
    let writer = plain_locker(dir.path(), Strategy::ExclusiveFile);
    let attempt = tokio::spawn(async move {
        let got = writer.try_acquire("cat").await;
        (writer, got)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    child.cont();
    let (_writer, got) = tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .expect("try_acquire hung")
        .unwrap();
    eprintln!("writer's try_acquire: {:?}", got.as_ref().map(|g| g.is_some()));
    let got = got.unwrap();
    let holding = child.expect("", Duration::from_secs(5));
    eprintln!("reader said: {holding:?}");
    let holding = holding.filter(|l| l.starts_with("holding"));
    let _ = std::fs::remove_file(&flag);
    // Frozen between the create and its shared flock, the reader may find
    // its empty file flocked by the judge and give the path up: then the
    // writer may hold, alone. Never both.
    assert!(
        holding.is_some() || got.is_some(),
        "neither the reader nor the writer holds"
    );
    assert!(
        holding.is_none() || got.is_none(),
        "an exclusive try_acquire succeeded while a live reader (frozen 16 s, lease 30 s) holds \"cat\" shared"
    );
}
