//! The waiting line across processes (src/fs/line.rs) decides only when a
//! waiter tries, never whether it may: whatever the line looks like, a
//! waiter still takes over a dead holder's lock.

use std::time::Duration;

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
