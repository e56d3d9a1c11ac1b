//! Attacks on `Locker::release_all` and on the guard's drop and release
//! paths it changed (the lease's lock is now kept while a lock is let go).
// A name frozen mid-change is played by a `flock` on its mutation lock, as
// in tests/frozen_neighbor.rs; the failpoint test needs `--features
// failpoints`.
#![cfg(unix)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use leasehold::{Locker, Strategy};

/// A `flock` kept on `path`, as by a process frozen while holding it.
fn frozen_flock(path: &Path) -> File {
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap();
    file.lock().unwrap();
    file
}

fn mutex_of(lock_path: &Path) -> PathBuf {
    let mut name = lock_path.file_name().unwrap().to_owned();
    name.push(".mutex");
    lock_path.with_file_name(name)
}

/// The documented way to stop work on shutdown is to watch `lost()`; a
/// task that then simply drops its guard (returns) must not have that
/// drop wait for anything another process holds: `release_all` tells the
/// guards before it lets the lock go, and lets it go (waiting for the
/// name's mutation lock, here frozen) while it keeps the lease's lock, on
/// which the guard's drop then blocked the runtime's only thread.
#[tokio::test(flavor = "current_thread")]
async fn a_guard_dropped_when_release_all_tells_it_does_not_block_the_runtime() {
    for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
        let dir = tempfile::tempdir().unwrap();
        let locker = Locker::builder()
            .directory(dir.path())
            .strategy(strategy)
            .build()
            .unwrap();
        let guard = locker.acquire("job").await.unwrap();
        let frozen = frozen_flock(&mutex_of(&locker.lock_path("job").unwrap()));
        let worker = tokio::spawn(async move {
            guard.lost().await;
            let t0 = Instant::now();
            drop(guard);
            t0.elapsed()
        });
        // Something else the runtime should keep doing meanwhile.
        let ticks = tokio::spawn(async {
            let mut worst = Duration::ZERO;
            for _ in 0..60 {
                let t0 = Instant::now();
                tokio::time::sleep(Duration::from_millis(10)).await;
                worst = worst.max(t0.elapsed());
            }
            worst
        });
        tokio::task::yield_now().await;
        let released = tokio::time::timeout(Duration::from_secs(10), locker.release_all())
            .await
            .expect("release_all returns");
        assert_eq!(released.len(), 1, "{released:?}");
        let dropped_in = worker.await.unwrap();
        let worst_tick = ticks.await.unwrap();
        drop(frozen);
        // A drop that waited for the frozen mutation lock blocked the
        // runtime's only thread for good; 1 s is a slow machine's stall,
        // many times.
        assert!(
            dropped_in < Duration::from_secs(1),
            "{strategy:?}: a guard's drop blocked the runtime for {dropped_in:?} (worst tick {worst_tick:?})"
        );
        assert!(
            worst_tick < Duration::from_secs(1),
            "{strategy:?}: the runtime stalled for {worst_tick:?}"
        );
    }
}

/// `release_all` waits, on a thread of Tokio's blocking pool, for the
/// attempts under way; an attempt counts as under way from before its
/// inline try, and only then queues its blocking part on that same pool.
/// With a small pool (here one thread, and the inline try slowed down by a
/// failpoint so that `release_all` comes in between), the waiting thread
/// occupies the pool that the attempt it waits for needs: `release_all`
/// and the acquisition hang for ever.
#[cfg(feature = "failpoints")]
#[test]
fn release_all_does_not_wait_on_the_pool_for_an_attempt_queued_behind_it() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(1)
        .thread_name("relattack-pool")
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let outcome = runtime.block_on(async {
        let other = Locker::new(dir.path()).unwrap(); // as another process
        let locker = Locker::builder()
            .directory(dir.path())
            .durable(false)
            .build()
            .unwrap();
        // The next file made by this runtime's threads (the waiter's
        // inline try) takes 500 ms, during which another process takes
        // the name: the try then fails, and the rest of the attempt goes
        // to the blocking pool.
        let once = Arc::new(AtomicBool::new(true));
        fail::cfg_callback("file.create.after_open", move || {
            let ours = std::thread::current()
                .name()
                .is_some_and(|n| n == "relattack-pool");
            if ours && once.swap(false, Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(500));
            }
        })
        .unwrap();
        let l = locker.clone();
        let waiter = tokio::spawn(async move { l.acquire("job").await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let held = other.acquire("job").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let released = tokio::time::timeout(Duration::from_secs(5), locker.release_all()).await;
        let waited = tokio::time::timeout(Duration::from_secs(1), waiter).await;
        fail::remove("file.create.after_open");
        drop(held);
        (released.is_ok(), waited.map(|w| format!("{:?}", w.unwrap())))
    });
    // Queued blocking work that never ran is dropped here.
    runtime.shutdown_timeout(Duration::from_secs(2));
    let (released, waited) = outcome;
    assert!(
        released,
        "release_all hung: the pool's only thread waits for an attempt queued behind it"
    );
    assert!(
        waited.as_deref().is_ok_and(|w| w.contains("ShutDown")),
        "the waiting acquisition: {waited:?}"
    );
}

/// Two `release_all`s at once, through clones: each returns only once
/// every lock is released (the names are free to another process the
/// moment either returns), and between them every lock is listed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_release_alls_at_once_each_return_with_everything_released() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::new(dir.path()).unwrap();
    let names: Vec<String> = (0..40).map(|i| format!("n{i}")).collect();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(locker.acquire(name).await.unwrap());
    }
    let (a, b) = (locker.clone(), locker.clone());
    let other = Locker::new(dir.path()).unwrap(); // as another process
    let check = |other: Locker, names: Vec<String>| async move {
        for name in &names {
            assert!(
                !other.is_held(name).await.unwrap(),
                "{name} still held when a release_all returned"
            );
        }
    };
    let (o1, n1) = (other.clone(), names.clone());
    let first = tokio::spawn(async move {
        let got = a.release_all().await.len();
        check(o1, n1).await;
        got
    });
    let (o2, n2) = (other.clone(), names.clone());
    let second = tokio::spawn(async move {
        let got = b.release_all().await.len();
        check(o2, n2).await;
        got
    });
    let total = first.await.unwrap() + second.await.unwrap();
    assert_eq!(total, names.len());
    assert!(guards.iter().all(|g| g.is_lost()));
}

/// A `release_all` future dropped after its first poll still shuts the
/// `Locker` down and releases everything.
#[tokio::test(flavor = "current_thread")]
async fn a_dropped_release_all_still_releases_everything() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::new(dir.path()).unwrap();
    let guard = locker.acquire("job").await.unwrap();
    let shared = locker.acquire_shared("read").await.unwrap();
    {
        let release = locker.release_all();
        tokio::pin!(release);
        assert!(futures_poll_once(release.as_mut()).await.is_none());
    }
    let other = Locker::new(dir.path()).unwrap(); // as another process
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), shared.lost())
        .await
        .unwrap();
    let t0 = Instant::now();
    loop {
        let ex = other.try_acquire("job").await.unwrap();
        let sh = other.try_acquire("read").await.unwrap();
        if ex.is_some() && sh.is_some() {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "still held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(matches!(
        locker.acquire("job").await,
        Err(leasehold::Error::ShutDown { .. })
    ));
}

/// Polls `fut` once: its output if it was ready.
async fn futures_poll_once<F: std::future::Future + Unpin>(mut fut: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut fut).poll(cx) {
            std::task::Poll::Ready(out) => Some(out),
            std::task::Poll::Pending => None,
        })
    })
    .await
}
