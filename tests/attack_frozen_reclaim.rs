//! A leasehold process frozen (SIGSTOP) in the middle of reclaiming a dead
//! holder's lock file, while a program that does not take leasehold's
//! mutation lock (pi-research's code, played here by the test) reclaims
//! the same file its own way and takes the lock: when the frozen process
//! runs again, it must leave that live lock alone, and wait for it.
//!
//! Before, the reclaimer checked that the path still named the file it
//! judged, then (after the `reclaim.before_remove` and
//! `file.unlink.before_unlink` steps) unlinked whatever the path named by
//! then: the live foreign lock. Now it looks again right before the
//! unlink, with no step between the look and the unlink.
#![cfg(all(target_os = "linux", feature = "failpoints"))]

#[path = "support/common.rs"]
mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::ChildProc;
use leasehold::{Locker, Strategy};
use nix::sys::signal::Signal;

const FREEZE_ENV: &str = "LEASEHOLD_ATTACK_FREEZE";
const MSG: Duration = Duration::from_secs(20);

#[test]
fn child_process_entry() {
    common::child_entry_with(|role, args| async move {
        match role.as_str() {
            "take" => take(&args).await,
            _ => common::run_role(&role, &args).await,
        }
    });
}

/// dir name: with a freeze armed at `point@n` (`FREEZE_ENV`), takes
/// `name` once, says "acquired", holds it until killed.
async fn take(args: &[String]) -> i32 {
    assert!(std::env::var_os(FREEZE_ENV).is_some(), "a freeze to arm");
    common::arm_freeze(FREEZE_ENV);
    let locker = Locker::builder()
        .directory(&args[0])
        .strategy(Strategy::ExclusiveFile)
        .poll_interval(Duration::from_millis(20))
        .build()
        .expect("locker");
    let _guard = locker.acquire(&args[1]).await.expect("acquire");
    common::say("acquired");
    tokio::time::sleep(Duration::from_secs(120)).await;
    0
}

/// A pi-research record of this (live) process, as its service writes it
/// on Linux (`startTime`: the start in clock ticks).
fn live_foreign_record() -> String {
    let me = std::process::id();
    format!(
        r#"{{"uuid":"foreign-live","pid":{me},"startTime":{}}}"#,
        common::start_ticks(me)
    )
}

/// The device and inode the path names, if any.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The reclaimer frozen at `point`; meanwhile the "foreign" program moves
/// the dead holder's file aside and creates its own live lock with
/// `O_EXCL`, as pi-research does.
fn frozen_reclaimer_meets_a_foreign_reclaim(point: &str) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let path = Locker::builder()
        .directory(d)
        .strategy(Strategy::ExclusiveFile)
        .build()
        .unwrap()
        .lock_path("job")
        .unwrap();
    let dead = format!(
        r#"{{"uuid":"foreign-dead","pid":{},"startTime":1}}"#,
        common::dead_pid()
    );
    std::fs::write(&path, dead).unwrap();
    let freeze = format!("{point}@1");
    let mut child = ChildProc::spawn_env(
        Strategy::ExclusiveFile,
        "take",
        &[d, "job"],
        &[(FREEZE_ENV, freeze.as_str())],
    );
    child.expect("freezing", MSG);
    child.wait_stopped("reclaimer", MSG);
    // The foreign program's reclaim: rename to a trash name, unlink, then
    // its own lock with O_EXCL.
    let trash = dir.path().join("job.trash.foreign");
    std::fs::rename(&path, &trash).unwrap();
    std::fs::remove_file(&trash).unwrap();
    {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        file.write_all(live_foreign_record().as_bytes()).unwrap();
    }
    let ours = identity(&path);
    child.signal(Signal::SIGCONT);
    // A while for the reclaimer to finish what it was doing and look
    // again: the foreign lock must stay, and the reclaimer wait.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(800) {
        assert_eq!(
            identity(&path),
            ours,
            "{point}: the resumed reclaimer removed a live foreign lock"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The foreign holder lets go: the reclaimer, still waiting, gets it.
    std::fs::remove_file(&path).unwrap();
    let got = child.expect("acquired", MSG);
    assert_eq!(got, "acquired");
    child.kill();
    child.wait(MSG);
}

#[test]
fn a_reclaimer_frozen_before_removing_leaves_a_foreign_lock_taken_meanwhile() {
    frozen_reclaimer_meets_a_foreign_reclaim("reclaim.before_remove");
}

#[test]
fn a_reclaimer_frozen_before_unlinking_leaves_a_foreign_lock_taken_meanwhile() {
    frozen_reclaimer_meets_a_foreign_reclaim("file.unlink.before_unlink");
}
