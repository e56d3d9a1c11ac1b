//! A name's mutation-lock file (`<lock>.mutex`) kept by a release that
//! finds other `Locker`s in line for the name, for their own releases
//! (issue 34: one file made and removed less per handoff, and one event
//! less for every waiter's watcher), and gone once nobody uses the name:
//! removed by the last release with nobody in line, by a waiter that stops
//! waiting without the lock, never reported by `clean` while waiters are
//! in line, and never in the way of exclusion.
//!
//! Linux only: the line is OFD byte-range locks on the lock directory,
//! which these tests look at to know that a waiter stands in line.
#![cfg(target_os = "linux")]

#[path = "support/common.rs"]
mod common;

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::time::{Duration, Instant};

use common::{anyone_in_line, entries, mutex_of};
use leasehold::{Locker, Strategy};

/// Every wait of these tests ends within this.
const BOUND: Duration = Duration::from_secs(20);

fn locker(dir: &Path, strategy: Strategy) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .durable(false)
        .build()
        .unwrap()
}

type Waiting = Pin<Box<dyn Future<Output = leasehold::Result<leasehold::LockGuard>> + Send>>;

/// Starts `locker`'s acquisition of `name` and polls it until it stands
/// in line, then leaves it unpolled (a waiter that is not scheduled): its
/// place in line stays until it is dropped.
async fn stand_in_line(locker: &Locker, name: &str, dir: &Path) -> Waiting {
    let (locker, name) = (locker.clone(), name.to_owned());
    let mut waiting: Waiting = Box::pin(async move { locker.acquire(&name).await });
    let started = Instant::now();
    while !anyone_in_line(dir) {
        assert!(started.elapsed() < BOUND, "the waiter never stood in line");
        if let Ok(result) = tokio::time::timeout(Duration::from_millis(20), &mut waiting).await {
            panic!("the lock was not held: {:?}", result.map(|_| ()));
        }
    }
    waiting
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_with_a_waiter_in_line_keeps_the_file_until_the_waiter_stops() {
    for &strategy in &[Strategy::ExclusiveFile, Strategy::Directory] {
        let dir = tempfile::tempdir().unwrap();
        let (holder, waiter) = (locker(dir.path(), strategy), locker(dir.path(), strategy));
        let lock_path = holder.lock_path("job").unwrap();
        let mutex = mutex_of(&lock_path);
        let held = holder.acquire("job").await.unwrap();
        let waiting = stand_in_line(&waiter, "job", dir.path()).await;

        held.release().await.unwrap();
        assert!(!lock_path.exists(), "{strategy:?}: released");
        assert!(mutex.exists(), "{strategy:?}: kept for the waiter in line");
        // Another acquisition takes the name as ever: the kept file is only
        // the mutation lock's, free, and never a lock.
        let third = locker(dir.path(), strategy);
        let taken = third.try_acquire("job").await.unwrap().expect("free");
        drop(taken);

        // The waiter stops waiting without the lock: with the name unused
        // it removes the file, and nothing of the name is left.
        drop(waiting);
        assert!(!anyone_in_line(dir.path()));
        assert_eq!(entries(dir.path()), Vec::<String>::new(), "{strategy:?}");
    }
}

/// In a directory other users can make entries in (a sticky shared one
/// here), the file is never kept: it is mode 0600, and a waiter of another
/// user could neither open it for its own release nor remove it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_shared_with_other_users_never_keeps_the_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let (holder, waiter) = (
        locker(dir.path(), Strategy::ExclusiveFile),
        locker(dir.path(), Strategy::ExclusiveFile),
    );
    let mutex = mutex_of(&holder.lock_path("job").unwrap());
    let held = holder.acquire("job").await.unwrap();
    let waiting = stand_in_line(&waiter, "job", dir.path()).await;
    held.release().await.unwrap();
    assert!(!mutex.exists(), "removed by the release, as ever");
    drop(waiting);
    assert_eq!(entries(dir.path()), Vec::<String>::new());
}

/// A waiter that stops waiting while another process holds the name's
/// mutation lock (changing the name, or frozen while it does) is not held
/// up, and leaves the file to that process, which removes it as it lets
/// go (nobody is registered on it any more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_stops_while_the_mutation_lock_is_taken_is_not_held_up() {
    let dir = tempfile::tempdir().unwrap();
    let (holder, waiter) = (
        locker(dir.path(), Strategy::ExclusiveFile),
        locker(dir.path(), Strategy::ExclusiveFile),
    );
    let mutex = mutex_of(&holder.lock_path("job").unwrap());
    let held = holder.acquire("job").await.unwrap();
    let waiting = stand_in_line(&waiter, "job", dir.path()).await;
    held.release().await.unwrap();
    assert!(mutex.exists());

    // Another process changing the name: its flock on the file.
    let busy = std::fs::File::open(&mutex).unwrap();
    busy.lock().unwrap();
    let started = Instant::now();
    drop(waiting);
    assert!(started.elapsed() < Duration::from_secs(1), "never waits");
    assert!(mutex.exists(), "not ours to remove while it is taken");
    // It lets go as leasehold does when nobody is registered: removed,
    // then unlocked.
    std::fs::remove_file(&mutex).unwrap();
    drop(busy);
    assert_eq!(entries(dir.path()), Vec::<String>::new());
    // And the name works as ever.
    drop(waiter.try_acquire("job").await.unwrap().expect("free"));
    assert_eq!(entries(dir.path()), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiter_that_takes_the_lock_removes_the_file_with_its_release() {
    for &strategy in &[Strategy::ExclusiveFile, Strategy::Directory] {
        let dir = tempfile::tempdir().unwrap();
        let (holder, waiter) = (locker(dir.path(), strategy), locker(dir.path(), strategy));
        let lock_path = holder.lock_path("job").unwrap();
        let mutex = mutex_of(&lock_path);
        let held = holder.acquire("job").await.unwrap();
        let waiting = stand_in_line(&waiter, "job", dir.path()).await;
        let taker = tokio::spawn(async move { tokio::time::timeout(BOUND, waiting).await });

        held.release().await.unwrap();
        let guard = taker.await.unwrap().expect("bounded").unwrap();
        assert!(mutex.exists(), "{strategy:?}: kept by the release before");
        assert!(!guard.is_lost());
        // Its own release finds nobody in line: the file goes with it.
        guard.release().await.unwrap();
        assert_eq!(entries(dir.path()), Vec::<String>::new(), "{strategy:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_leaves_a_file_kept_for_waiters_in_line() {
    let dir = tempfile::tempdir().unwrap();
    let (holder, waiter) = (
        locker(dir.path(), Strategy::ExclusiveFile),
        locker(dir.path(), Strategy::ExclusiveFile),
    );
    let mutex = mutex_of(&holder.lock_path("job").unwrap());
    let held = holder.acquire("job").await.unwrap();
    let waiting = stand_in_line(&waiter, "job", dir.path()).await;
    held.release().await.unwrap();
    assert!(mutex.exists());

    // Not a crashed process's leftover: neither reported nor removed.
    let cleaned = holder.clean(false).await.unwrap();
    assert!(cleaned.is_empty(), "{cleaned:?}");
    let dry = holder.clean(true).await.unwrap();
    assert!(dry.is_empty(), "{dry:?}");
    // Nor by the waiter's own `Locker`, whose place the kernel hides from it.
    let own = waiter.clean(false).await.unwrap();
    assert!(own.is_empty(), "{own:?}");
    assert!(mutex.exists());

    drop(waiting);
    assert_eq!(entries(dir.path()), Vec::<String>::new());
}

/// The kept file changes nothing about exclusion: several `Locker`s take
/// turns on one name, each in its own thread's runtime, and no two ever
/// hold it at once; when all are done, nothing is left.
#[test]
fn lockers_taking_turns_never_overlap_and_leave_nothing() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let dir = tempfile::tempdir().unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (path, inside) = (dir.path().to_owned(), Arc::clone(&inside));
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let locker = locker(&path, Strategy::ExclusiveFile);
                    let deadline = Instant::now() + BOUND;
                    for _ in 0..200 {
                        let left = deadline.saturating_duration_since(Instant::now());
                        let guard = locker.acquire_timeout("job", left).await.unwrap();
                        assert_eq!(inside.fetch_add(1, SeqCst), 0, "two holders at once");
                        tokio::task::yield_now().await;
                        inside.fetch_sub(1, SeqCst);
                        guard.release().await.unwrap();
                    }
                });
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(entries(dir.path()), Vec::<String>::new());
}
