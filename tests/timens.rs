//! Holders and readers in different time namespaces: `CLOCK_BOOTTIME` is
//! offset per time namespace while the boot id is kernel-wide, so boot-clock
//! leases must not be compared across them.
//!
//! Each test runs one side under `unshare --time --fork --boottime N`, and
//! returns early, saying why, where that is unavailable (not Linux 5.6+,
//! not root, no `unshare`).
// Linux time namespaces (`unshare --time`).
#![cfg(target_os = "linux")]

#[path = "support/common.rs"]
mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::ChildProc;
use leasehold::{Locker, Strategy};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

#[test]
fn child_process_entry() {
    common::child_entry();
}

const LEASE_MS: u64 = 1_000;
/// The wall-clock margin a lease judged across clocks is given.
const SKEW: Duration = Duration::from_secs(2);

/// `unshare` arguments for a child whose boot clock is `ahead_s` seconds
/// ahead of ours; killed with its wrapper.
fn ahead(ahead_s: &str) -> [&str; 6] {
    ["unshare", "--time", "--kill-child", "--boottime", ahead_s, "--"]
}

/// A child playing `role` (on exclusive files) in a time namespace whose
/// boot clock is `ahead_s` seconds ahead of ours.
fn spawn_ahead(ahead_s: &str, role: &str, args: &[&str]) -> ChildProc {
    ChildProc::spawn_via(&ahead(ahead_s), Strategy::ExclusiveFile, role, args, &[])
}

/// Whether time namespaces can be made here; if not, why.
fn unavailable() -> Option<String> {
    if !std::path::Path::new("/proc/self/ns/time").exists() {
        return Some("no /proc/self/ns/time: the kernel has no time namespaces".into());
    }
    let out = Command::new("unshare")
        .args(["--time", "--fork", "--boottime", "100000", "cat", "/proc/uptime"])
        .stdin(Stdio::null())
        .output();
    let out = match out {
        Ok(out) => out,
        Err(e) => return Some(format!("cannot run unshare: {e}")),
    };
    if !out.status.success() {
        return Some(format!(
            "unshare --time failed (needs root or CAP_SYS_ADMIN): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let uptime: f64 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0);
    (uptime < 100_000.0)
        .then(|| format!("the boot clock in a new time namespace reads {uptime} s, not ahead"))
}

macro_rules! skip_unless_available {
    () => {
        if let Some(why) = unavailable() {
            eprintln!("skipped: {why}");
            return;
        }
    };
}

fn locker(dir: &std::path::Path) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(Strategy::ExclusiveFile)
        .lease(Duration::from_millis(LEASE_MS))
        .renew_interval(Duration::from_millis(250))
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
}

/// The next thing `child` says, whatever it is.
fn next(child: &ChildProc, within: Duration) -> String {
    child.expect("", within)
}

/// Stops the holder `pid` (not the `unshare` wrapper) and kills it, by pid,
/// when dropped.
struct Frozen(i32);

impl Frozen {
    fn new(pid: u32) -> Self {
        let pid = i32::try_from(pid).unwrap();
        kill(Pid::from_raw(pid), Signal::SIGSTOP).expect("stop the holder");
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0), Signal::SIGKILL);
    }
}

/// The pid and record of the holder of `job`, which must be the process
/// `unshare` forked (not `wrapper_pid`) and record its own time namespace.
fn namespaced_holder(rt: &tokio::runtime::Runtime, locker: &Locker, wrapper_pid: u32) -> u32 {
    let owner = rt.block_on(locker.holder("job")).unwrap().expect("held");
    let pid = owner.pid().expect("holder pid");
    assert_ne!(pid, wrapper_pid, "the holder is the forked child");
    let record = std::fs::read_to_string(locker.lock_path("job").unwrap()).unwrap();
    let ours = std::fs::read_link("/proc/self/ns/time").unwrap();
    let ours = format!(r#""timeNs":"{}""#, ours.display());
    assert!(record.contains(r#""timeNs":"time:["#), "{record}");
    assert!(
        !record.contains(&ours),
        "holder shares our time namespace: {record}"
    );
    pid
}

/// A live holder in our namespace, a reader whose boot clock is 100000 s
/// ahead: on the reader's clock the holder's last renewal is a day old.
#[test]
fn a_reader_whose_boot_clock_is_ahead_never_takes_a_live_holders_lock() {
    skip_unless_available!();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let locker = locker(dir.path());
    let guard = rt.block_on(locker.acquire("job")).unwrap();
    let lease = LEASE_MS.to_string();
    let watch_ms = (4 * LEASE_MS).to_string();
    let reader = spawn_ahead("100000", "try_for", &[d, "job", &lease, &watch_ms]);
    assert_eq!(next(&reader, Duration::from_secs(20)), "trying");
    let said = next(&reader, Duration::from_secs(20));
    assert!(said.starts_with("kept"), "the reader said {said:?}");
    let tries: u32 = said["kept ".len()..].parse().unwrap();
    assert!(tries >= 10, "only {tries} attempts in four leases");
    assert!(!guard.is_lost(), "the holder lost its lock");
    rt.block_on(guard.release()).unwrap();
}

/// A holder whose boot clock is 100000 s ahead, frozen with its `flock`
/// held: on our clock it renewed a day from now.
#[test]
fn a_frozen_holder_whose_boot_clock_is_ahead_is_taken_over_after_its_lease() {
    skip_unless_available!();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let lease = LEASE_MS.to_string();
    let holder = spawn_ahead("100000", "hold", &[d, "job", &lease]);
    holder.expect("acquired", Duration::from_secs(20));
    let locker = locker(dir.path());
    let pid = namespaced_holder(&rt, &locker, holder.pid());
    let frozen = Frozen::new(pid);
    let stopped = Instant::now();
    let bound = Duration::from_millis(LEASE_MS) + SKEW + Duration::from_secs(3);
    let guard = rt
        .block_on(locker.acquire_timeout("job", bound))
        .expect("the frozen holder's lock is taken over");
    let took = stopped.elapsed();
    // The lease was renewed at most one renew interval (lease / 3) before
    // the stop, and a lease judged on the wall clock gets the skew margin.
    let earliest = Duration::from_millis(LEASE_MS * 2 / 3) + SKEW;
    assert!(
        took >= earliest,
        "taken after {took:?}, before its lease and margin"
    );
    drop(frozen);
    rt.block_on(guard.release()).unwrap();
}

/// Both sides in namespaces of their own: the holder 100000 s ahead and
/// live, the reader 200000 s ahead; then the holder 200000 s ahead and
/// frozen, the reader 100000 s ahead.
#[test]
fn two_namespaces_with_different_offsets_judge_each_other_by_the_wall_clock() {
    skip_unless_available!();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let locker = locker(dir.path());
    let lease = LEASE_MS.to_string();
    let watch_ms = (4 * LEASE_MS).to_string();

    let holder = spawn_ahead("100000", "hold", &[d, "job", &lease]);
    holder.expect("acquired", Duration::from_secs(20));
    let pid = namespaced_holder(&rt, &locker, holder.pid());
    let reader = spawn_ahead("200000", "try_for", &[d, "job", &lease, &watch_ms]);
    assert_eq!(next(&reader, Duration::from_secs(20)), "trying");
    let said = next(&reader, Duration::from_secs(20));
    assert!(said.starts_with("kept"), "the reader said {said:?}");
    assert_eq!(
        namespaced_holder(&rt, &locker, holder.pid()),
        pid,
        "still the same holder"
    );
    let _ = kill(Pid::from_raw(i32::try_from(pid).unwrap()), Signal::SIGKILL);
    drop(holder);
    drop(reader);

    let holder = spawn_ahead("200000", "hold", &[d, "job", &lease]);
    holder.expect("acquired", Duration::from_secs(20));
    let pid = namespaced_holder(&rt, &locker, holder.pid());
    let frozen = Frozen::new(pid);
    let stopped = Instant::now();
    let reader = spawn_ahead("100000", "acquire", &[d, "job", &lease, "20"]);
    assert_eq!(next(&reader, Duration::from_secs(20)), "waiting");
    let bound = Duration::from_millis(LEASE_MS) + SKEW + Duration::from_secs(3);
    let said = next(&reader, bound + Duration::from_secs(5));
    assert!(said.starts_with("acquired"), "the reader said {said:?}");
    let took = stopped.elapsed();
    assert!(took < bound + Duration::from_secs(2), "taken over after {took:?}");
    drop(frozen);
}
