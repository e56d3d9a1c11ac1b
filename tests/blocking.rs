//! The blocking API from synchronous code: plain `#[test]` functions run on
//! threads without any Tokio runtime, as a plain `fn main` does.

#[path = "support/common.rs"]
mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use leasehold::{Error, Locker};

#[test]
fn child_process_entry() {
    common::child_entry();
}

fn locker(dir: &std::path::Path) -> Locker {
    Locker::new(dir).unwrap()
}

#[test]
fn acquire_hold_and_release_without_a_runtime() {
    assert!(
        tokio::runtime::Handle::try_current().is_err(),
        "this test must run outside a runtime"
    );
    let dir = tempfile::tempdir().unwrap();
    let (mine, other) = (locker(dir.path()), locker(dir.path()));
    let guard = mine.blocking_acquire("job").unwrap();
    assert!(other.blocking_try_acquire("job").unwrap().is_none());
    assert!(locker(dir.path()).lock_path("job").unwrap().exists());
    drop(guard);
    assert!(
        !mine.lock_path("job").unwrap().exists(),
        "dropping the guard released the lock"
    );
    assert!(other.blocking_try_acquire("job").unwrap().is_some());
}

#[test]
fn a_blocked_thread_gets_the_lock_when_the_holder_drops_it() {
    let dir = tempfile::tempdir().unwrap();
    let first = locker(dir.path());
    let second = locker(dir.path());
    let guard = first.blocking_acquire("job").unwrap();
    let released = Arc::new(AtomicBool::new(false));
    let waiter = {
        let released = Arc::clone(&released);
        std::thread::spawn(move || {
            let guard = second.blocking_acquire("job").unwrap();
            let after_release = released.load(Ordering::SeqCst);
            drop(guard);
            after_release
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !waiter.is_finished(),
        "the waiter must block while the lock is held"
    );
    released.store(true, Ordering::SeqCst);
    drop(guard);
    assert!(
        waiter.join().unwrap(),
        "the waiter got the lock only after its release"
    );
}

#[test]
fn a_timeout_returns_and_names_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let _held = locker(dir.path()).blocking_acquire("job").unwrap();
    let started = Instant::now();
    let err = locker(dir.path())
        .blocking_acquire_timeout("job", Duration::from_millis(200))
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(err.holder().and_then(|h| h.pid()), Some(std::process::id()));
}

#[test]
fn the_guard_keeps_its_lease_alive_without_a_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let short = Locker::builder()
        .directory(dir.path())
        .lease(Duration::from_secs(1))
        .renew_interval(Duration::from_millis(100))
        .build()
        .unwrap();
    let guard = short.blocking_acquire("job").unwrap();
    // Over two leases long, with no runtime anywhere to renew it (a
    // renewal may run 900 ms late before the guard counts it lost: a
    // loaded machine does not fail this).
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!guard.is_lost());
    assert!(locker(dir.path()).blocking_try_acquire("job").unwrap().is_none());
    // Removed behind its back: the guard notices within its lease. (On
    // Windows renamed aside first: Wine keeps a deleted file's name until
    // its holder's handle closes.)
    let path = short.lock_path("job").unwrap();
    if cfg!(windows) {
        let aside = path.with_extension("removed");
        std::fs::rename(&path, &aside).unwrap();
        std::fs::remove_file(&aside).unwrap();
    } else {
        std::fs::remove_file(&path).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !guard.is_lost() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(guard.is_lost(), "the renewal thread noticed the loss");
}

#[test]
fn many_threads_take_turns_and_never_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let total = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|i| {
            // Half share one Locker (turns within it), half have their own
            // (turns between "processes").
            let locker = locker(dir.path());
            let (inside, total, start) = (Arc::clone(&inside), Arc::clone(&total), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..20 {
                    let guard = locker.blocking_acquire("counter").unwrap();
                    assert_eq!(
                        inside.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders at once (thread {i})"
                    );
                    std::thread::yield_now();
                    inside.fetch_sub(1, Ordering::SeqCst);
                    total.fetch_add(1, Ordering::SeqCst);
                    drop(guard);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(total.load(Ordering::SeqCst), 160);
}

#[test]
fn a_lock_held_by_a_killed_process_is_taken_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let mut child = common::ChildProc::spawn("hold", &[path, "job", "30000"]);
    child.expect("acquired", Duration::from_secs(30));
    let waiter = {
        let locker = locker(dir.path());
        std::thread::spawn(move || {
            let got = locker.blocking_acquire_timeout("job", Duration::from_secs(60));
            (got.map(drop), Instant::now())
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(!waiter.is_finished(), "the child holds the lock");
    let killed = Instant::now();
    // SIGKILL on Unix, TerminateProcess on Windows (and reaped).
    child.kill_and_reap();
    let (got, at) = waiter.join().unwrap();
    got.unwrap();
    // Well within the 30 s lease: the dead holder's flock told.
    assert!(
        at.duration_since(killed) < Duration::from_secs(10),
        "{:?}",
        at.duration_since(killed)
    );
}

#[tokio::test(flavor = "current_thread")]
async fn inside_a_current_thread_runtime_they_refuse_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    let _held = locker.acquire("job").await.unwrap();
    let other = Locker::new(dir.path()).unwrap();
    let started = Instant::now();
    // A blocking wait here would deadlock: the holder could never run.
    assert!(matches!(
        other.blocking_acquire("job"),
        Err(Error::Unsupported { .. })
    ));
    assert!(matches!(
        other.blocking_try_acquire("free"),
        Err(Error::Unsupported { .. })
    ));
    let refused = other.blocking_acquire_timeout("job", Duration::from_secs(60));
    assert!(matches!(refused, Err(Error::Unsupported { .. })));
    // Also from a task that opted out of the cooperative budget.
    let unconstrained =
        tokio::task::unconstrained(async { other.blocking_try_acquire("free").map(|g| g.is_some()) }).await;
    assert!(matches!(unconstrained, Err(Error::Unsupported { .. })));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        locker.lock_path("free").map(|p| !p.exists()).unwrap(),
        "nothing was taken"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inside_a_multi_thread_runtime_they_refuse_on_workers_and_work_off_them() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    // The test's body and a spawned task: async code on the runtime.
    let err = locker.blocking_acquire("job").unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err:?}");
    assert!(err.to_string().contains("acquire(name).await"), "{err}");
    let on_worker = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.blocking_try_acquire("job").map(|g| g.is_some()) })
    };
    assert!(matches!(on_worker.await.unwrap(), Err(Error::Unsupported { .. })));
    let unconstrained = {
        let locker = locker.clone();
        tokio::spawn(tokio::task::unconstrained(async move {
            locker.blocking_acquire("job").map(drop)
        }))
    };
    assert!(matches!(
        unconstrained.await.unwrap(),
        Err(Error::Unsupported { .. })
    ));

    // Off the workers they block, as Tokio's own blocking calls do.
    let in_pool = {
        let locker = locker.clone();
        tokio::task::spawn_blocking(move || locker.blocking_acquire("job").map(drop))
    };
    in_pool.await.unwrap().unwrap();
    let in_place = {
        let locker = locker.clone();
        tokio::spawn(async move { tokio::task::block_in_place(|| locker.blocking_acquire("job").map(drop)) })
    };
    in_place.await.unwrap().unwrap();
    let handle = tokio::runtime::Handle::current();
    let entered = std::thread::spawn(move || {
        let _entered = handle.enter();
        locker.blocking_acquire("job").map(drop)
    });
    entered.join().unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_acquisition_in_spawn_blocking_waits_for_an_async_holder() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    let held = locker.acquire("job").await.unwrap();
    let other = Locker::new(dir.path()).unwrap();
    let waiter = tokio::task::spawn_blocking(move || other.blocking_acquire("job").map(drop));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "it waits for the holder");
    drop(held);
    tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// The same `Locker` used at once from async tasks of a runtime and from
/// plain threads through the blocking API: one queue per name for both, the
/// lock handed between them, and never two holders at once.
#[test]
fn async_tasks_and_blocking_threads_share_one_locker_and_never_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    let inside = Arc::new(AtomicUsize::new(0));
    let overlap = Arc::new(AtomicBool::new(false));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let critical = {
        let (inside, overlap) = (Arc::clone(&inside), Arc::clone(&overlap));
        move || {
            if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                overlap.store(true, Ordering::SeqCst);
            }
            std::thread::sleep(Duration::from_millis(2));
            inside.fetch_sub(1, Ordering::SeqCst);
        }
    };
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (locker, critical) = (locker.clone(), critical.clone());
            runtime.spawn(async move {
                for _ in 0..10 {
                    let guard = locker.acquire("job").await.unwrap();
                    critical();
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (locker, critical) = (locker.clone(), critical.clone());
            std::thread::spawn(move || {
                for _ in 0..10 {
                    let guard = locker.blocking_acquire("job").unwrap();
                    critical();
                    drop(guard);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    runtime.block_on(async {
        for task in tasks {
            task.await.unwrap();
        }
    });
    assert!(!overlap.load(Ordering::SeqCst), "two holders at once");
    assert!(!locker.lock_path("job").unwrap().exists());
}

/// A guard taken by a blocking call is released by a drop on another
/// thread, and by `release().await` inside a runtime; a `Locker` first used
/// in a runtime that is gone since still works from plain threads.
#[test]
fn guards_move_between_threads_and_runtimes() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let guard = runtime.block_on(locker.acquire("job")).unwrap();
        drop(guard);
    } // that runtime is gone
    let guard = locker.blocking_acquire("job").unwrap();
    std::thread::spawn(move || drop(guard)).join().unwrap();
    let guard = locker.blocking_acquire("job").unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    runtime.block_on(guard.release()).unwrap();
    assert!(locker.blocking_try_acquire("job").unwrap().is_some());
}

/// In `block_in_place` (even inside a runtime's `block_on`) or on a plain
/// thread under a `Handle::enter` guard they block, as Tokio's own
/// blocking calls may there: no worker is held up.
#[test]
fn block_in_place_and_an_entered_handle_may_block() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let in_place = runtime.block_on({
        let locker = locker.clone();
        async move { tokio::task::block_in_place(|| locker.blocking_acquire("job").map(drop)) }
    });
    in_place.unwrap();
    let handle = runtime.handle().clone();
    let entered = std::thread::spawn(move || {
        let _entered = handle.enter();
        locker.blocking_try_acquire("job").map(|guard| guard.is_some())
    });
    assert!(entered.join().unwrap().unwrap());
}
