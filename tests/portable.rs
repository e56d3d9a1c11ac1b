//! The test-only switch (feature `portable-test`, `LEASEHOLD_TEST_PORTABLE=1`)
//! really selects the portable answers: a process started with it writes
//! records without the Linux-only fields, waits without a directory
//! watcher and without standing in the waiting line; one started without
//! it (the same binary) does all three. CI runs the conformance and
//! multi-process suites with the switch on (`.ci/run`); this is what shows
//! they ran what macOS and FreeBSD run.

// The switch is Linux's: it makes Linux answer as the other platforms do.
#![cfg(target_os = "linux")]

#[path = "support/common.rs"]
mod common;

use std::time::Duration;

use common::{ChildProc, anyone_in_line, say};
use leasehold::{Locker, Strategy};

const SWITCH: &str = "LEASEHOLD_TEST_PORTABLE";

#[test]
fn child_process_entry() {
    common::child_entry_with(|role, args| async move {
        match role.as_str() {
            "hold-and-wait" => hold_and_wait(&args[0]).await,
            _ => common::run_role(&role, &args).await,
        }
    });
}

/// In a child: holds `own`, then waits for `job` (which the parent holds)
/// until killed.
async fn hold_and_wait(dir: &str) -> i32 {
    let locker = Locker::builder().directory(dir).build().expect("locker");
    let _own = locker.acquire("own").await.expect("own");
    let waiting = tokio::spawn(async move { locker.acquire_timeout("job", Duration::from_secs(60)).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    say("waiting");
    let _ = waiting.await;
    0
}

/// Whether process `pid` has a thread named as the directory watcher's.
fn has_watcher(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(Result::ok)
        .any(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|c| c.trim() == "leasehold-watch")
        })
}

/// What a child started with the switch set to `value` shows: its record
/// of `own`, whether it runs a watcher, whether it stands in line.
fn observe(value: &str) -> (serde_json::Value, bool, bool) {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::builder().directory(dir.path()).build().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _job = rt.block_on(locker.acquire("job")).unwrap();
    let mut child = ChildProc::spawn_env(
        Strategy::ExclusiveFile,
        "hold-and-wait",
        &[dir.path().to_str().unwrap()],
        &[(SWITCH, value)],
    );
    child.expect("waiting", Duration::from_secs(30));
    let record = std::fs::read_to_string(locker.lock_path("own").unwrap()).unwrap();
    let record: serde_json::Value = serde_json::from_str(record.trim_end_matches('\0')).unwrap();
    let seen = (record, has_watcher(child.pid()), anyone_in_line(dir.path()));
    child.kill_and_reap();
    seen
}

#[test]
fn the_switch_selects_the_portable_answers_and_only_it_does() {
    let (record, watcher, in_line) = observe("1");
    for field in ["bootId", "pidNs", "timeNs", "procStart", "machineId"] {
        assert!(
            record.get(field).is_none(),
            "{field} written under the switch: {record}"
        );
    }
    // pi-research's unit off Linux: whole seconds since the epoch, from `ps`.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let start = record["startTime"].as_u64().expect("startTime");
    assert!(
        start <= now && now - start < 120,
        "startTime {start} is not the child's start in epoch seconds (now {now})"
    );
    assert!(!watcher, "a waiter started a directory watcher under the switch");
    assert!(!in_line, "a waiter stood in the waiting line under the switch");

    let (record, watcher, in_line) = observe("0");
    assert!(
        record.get("bootId").is_some(),
        "no bootId without the switch: {record}"
    );
    assert!(
        record.get("procStart").is_some(),
        "no procStart without the switch: {record}"
    );
    assert!(watcher, "a waiter polled without the switch");
    assert!(in_line, "a waiter did not stand in line without the switch");
}
