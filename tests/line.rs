//! The waiting line across processes (src/fs/line.rs) decides only when a
//! waiter tries, never whether it may: whatever the line looks like, a
//! waiter still takes over a dead holder's lock.

// The waiting line stands on Linux's OFD byte-range locks.
#![cfg(target_os = "linux")]

#[path = "support/common.rs"]
mod common;

use std::time::Duration;

use common::anyone_in_line;
use leasehold::Locker;

/// A pid that no process has: a child that has exited and been reaped.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().expect("spawn true");
    let pid = child.id();
    child.wait().expect("reap");
    pid
}

/// An older waiter that stops running (a SIGSTOPped process, a task whose
/// acquisition is no longer polled) keeps its place in line. The younger
/// waiter stands back for it; when the holder dies meanwhile, the lock
/// path stays taken (by the dead holder's file), so "the lock is taken,
/// the line is moving" must not keep the younger waiter from ever
/// trying: its attempt would judge the holder dead and take over at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_older_waiter_does_not_keep_a_dead_holders_lock_from_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let locker = || Locker::builder().directory(dir.path()).build().unwrap();
    let (holder, frozen, younger) = (locker(), locker(), locker());
    let guard = holder.acquire("job").await.unwrap();
    // The older waiter stands in line, then is never polled again.
    let mut older = Box::pin(frozen.acquire("job"));
    assert!(
        tokio::time::timeout(Duration::from_millis(200), &mut older)
            .await
            .is_err()
    );
    let waiter = tokio::spawn(async move { younger.acquire_timeout("job", Duration::from_secs(5)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The holder dies: its lock path now holds a record naming a process
    // that is gone (reclaimed at once by any attempt).
    let path = holder.lock_path("job").unwrap();
    let planted = dir.path().join("planted");
    std::fs::write(&planted, format!(r#"{{"uuid":"x","pid":{}}}"#, dead_pid())).unwrap();
    std::fs::rename(&planted, &path).unwrap();
    let started = std::time::Instant::now();
    let taken = waiter.await.unwrap();
    assert!(
        taken.is_ok(),
        "the younger waiter never tried a dead holder's lock while an older waiter was frozen: {taken:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    drop(guard);
    drop(older);
}

/// `try_acquire` never waits, so it never stands in line: a ticket it
/// left behind would be an "oldest waiter" that never comes, and every
/// waiter of other processes would stand back for it at every handoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_on_a_held_lock_leaves_nothing_in_line() {
    let dir = tempfile::tempdir().unwrap();
    let locker = || Locker::builder().directory(dir.path()).build().unwrap();
    let (holder, other) = (locker(), locker());
    let _guard = holder.acquire("job").await.unwrap();
    assert!(other.try_acquire("job").await.unwrap().is_none());
    assert!(
        !anyone_in_line(dir.path()),
        "try_acquire left a ticket in the waiting line"
    );
}

/// An acquisition dropped while its attempt runs on the blocking pool
/// leaves nothing in line: the attempt finishes after the waiter's
/// clean-up has run, so it must not be what stands in line.
#[test]
fn an_acquisition_dropped_during_its_attempt_leaves_nothing_in_line() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let locker = || Locker::builder().directory(dir.path()).build().unwrap();
        let (holder, other) = (locker(), locker());
        let _guard = holder.acquire("job").await.unwrap();
        // The one blocking thread is busy: the waiter's attempt queues.
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let busy = tokio::task::spawn_blocking(move || wait.recv());
        let mut acquiring = Box::pin(other.acquire("job"));
        assert!(
            tokio::time::timeout(Duration::from_millis(100), &mut acquiring)
                .await
                .is_err()
        );
        drop(acquiring);
        go.send(()).unwrap();
        busy.await.unwrap().unwrap();
        // Let the queued attempt run to its end.
        tokio::task::spawn_blocking(|| ()).await.unwrap();
        assert!(
            !anyone_in_line(dir.path()),
            "a dropped acquisition's attempt left a ticket in the waiting line"
        );
    });
}
