//! A waiter's first look at a lock comes before its watch of the lock
//! directory starts: a release in that instant must not be missed (found
//! by `tests/crash_points.rs`, where a fresh `Locker` slept until its
//! safety-net poll). Its own test binary: failpoints are process-wide.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::{LockGuard, Locker, Strategy};

/// The tests share the process-wide failpoint: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn a_release_before_the_watch_starts_is_not_missed() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
        let dir = tempfile::tempdir().unwrap();
        let holder = Locker::builder()
            .directory(dir.path())
            .strategy(strategy)
            .build()
            .unwrap();
        // Polling would find the release only after 10 s.
        let waiter = Locker::builder()
            .directory(dir.path())
            .strategy(strategy)
            .poll_interval(Duration::from_secs(10))
            .build()
            .unwrap();
        let guard: Arc<Mutex<Option<LockGuard>>> =
            Arc::new(Mutex::new(Some(rt.block_on(holder.acquire("x")).unwrap())));
        let held = Arc::clone(&guard);
        // The holder lets go right after the waiter's first look, before
        // its watch starts.
        fail::cfg_callback("engine.wait.before_watch", move || {
            drop(held.lock().unwrap().take())
        })
        .unwrap();
        let started = Instant::now();
        let taken = rt.block_on(waiter.acquire_timeout("x", Duration::from_secs(5)));
        fail::remove("engine.wait.before_watch");
        let took = started.elapsed();
        assert!(
            guard.lock().unwrap().is_none(),
            "{strategy:?}: the holder let go at the failpoint"
        );
        let taken = taken.unwrap_or_else(|e| panic!("{strategy:?}: the release was missed: {e}"));
        assert!(took < Duration::from_secs(1), "{strategy:?}: took {took:?}");
        drop(taken);
    }
}

/// The same instant for a `Locker` whose watch already runs (it waited
/// before): its waiter no longer looks again when it starts to watch, so
/// the release must reach it as an event (the wake armed before its
/// attempt). Both layouts; the directory layout still looks again.
#[test]
fn a_release_before_a_running_watch_is_seen_is_not_missed() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
        let dir = tempfile::tempdir().unwrap();
        let holder = Locker::builder()
            .directory(dir.path())
            .strategy(strategy)
            .build()
            .unwrap();
        // Polling would find the release only after 10 s.
        let waiter = Locker::builder()
            .directory(dir.path())
            .strategy(strategy)
            .poll_interval(Duration::from_secs(10))
            .build()
            .unwrap();
        // A first wait starts the waiter's watch.
        let first = rt.block_on(holder.acquire("warm")).unwrap();
        let waiting = rt.spawn({
            let waiter = waiter.clone();
            async move { waiter.acquire("warm").await.map(drop) }
        });
        std::thread::sleep(Duration::from_millis(100));
        drop(first);
        rt.block_on(waiting).unwrap().unwrap();

        let guard: Arc<Mutex<Option<LockGuard>>> =
            Arc::new(Mutex::new(Some(rt.block_on(holder.acquire("x")).unwrap())));
        let held = Arc::clone(&guard);
        // ...and its removal's event is read (and reported) while the
        // waiter is still on its way to wait for it.
        fail::cfg_callback("engine.wait.before_watch", move || {
            if held.lock().unwrap().take().is_some() {
                std::thread::sleep(Duration::from_millis(50));
            }
        })
        .unwrap();
        let started = Instant::now();
        let taken = rt.block_on(waiter.acquire_timeout("x", Duration::from_secs(5)));
        fail::remove("engine.wait.before_watch");
        let took = started.elapsed();
        assert!(
            guard.lock().unwrap().is_none(),
            "{strategy:?}: the holder let go at the failpoint"
        );
        let taken = taken.unwrap_or_else(|e| panic!("{strategy:?}: the release was missed: {e}"));
        assert!(took < Duration::from_secs(1), "{strategy:?}: took {took:?}");
        drop(taken);
    }
}
