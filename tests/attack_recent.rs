//! A cold attack on two recent lock-directory changes (a helper's):
//!
//! - c893dd5: a withdrawn announcement's emptied members directory is
//!   removed by the release thread when the name's mutation lock is busy
//!   (`TidyMembers`). Tried: the tidy deferred while the group ends and a
//!   new group starts under the same directory name, at once, many times;
//!   churn of readers and writers that give up while a "slow process"
//!   holds the mutation lock now and then.
//! - 3931a12: `<record>.pending-<12 hex>` entries (Windows' unlink renames
//!   aside first) are collected as unfinished records. Tried: hostile
//!   entries of that shape (a directory, a FIFO, a symlink out of the
//!   directory, a file whose flock a live process holds, a hard link of a
//!   live holder's record), beside live holders.
//!
//! Every wait is bounded.
#![cfg(unix)]

#[path = "support/common.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use common::{MutationLock, frozen_flock, members_of, mutex_of};
use leasehold::{LockGuard, Locker, Strategy};

/// Every wait of these tests ends within this.
const BOUND: Duration = Duration::from_secs(20);

async fn bounded<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {BOUND:?}"))
}

fn locker(dir: &Path, strategy: Strategy) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .lease(Duration::from_secs(20))
        .renew_interval(Duration::from_secs(5))
        .poll_interval(Duration::from_millis(10))
        .build()
        .unwrap()
}

/// The lock path of the only name in `dir`.
fn lock_path(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "lock"))
        .expect("the name's lock path")
}

/// What is in `dir`, but the line file.
fn left_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != common::LINE_FILE)
        .collect()
}

/// Waits (bounded) until `dir` holds nothing but the line file.
async fn settles_empty(dir: &Path, what: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    while !left_in(dir).is_empty() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left = left_in(dir);
    assert!(left.is_empty(), "{what}: left behind {left:?}");
}

/// The descriptors of this process open on the file `path` names (a
/// removed file's read `<path> (deleted)`, and does not count).
#[cfg(target_os = "linux")]
fn opened(path: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|link| link == path)
        .count()
}

/// The interleaving of the CI run of 312f30a, step by step: the slow
/// process ([`MutationLock`]) opens the name's mutation-lock file while a holder has it;
/// that holder lets go as leasehold does (the file removed; the next
/// holder makes a new one at the path and locks it; the first unlocks).
/// The slow process must wait for the next holder, not take the removed
/// file for the lock, and letting go must leave the next holder's file.
#[cfg(target_os = "linux")]
#[test]
fn the_slow_process_waits_for_the_holder_after_a_removal() {
    use std::os::unix::fs::MetadataExt;
    use std::sync::mpsc;
    let root = tempfile::tempdir().unwrap();
    // As /proc/self/fd names it.
    let dir = root.path().canonicalize().unwrap();
    let mutex = mutex_of(&locker(&dir, Strategy::ExclusiveFile).lock_path("job").unwrap());
    let within = |what: &str, until: Instant| assert!(Instant::now() < until, "{what}: not within 5 s");

    let first = frozen_flock(&mutex);
    let (taken_tx, taken) = mpsc::channel();
    let (go_tx, go) = mpsc::channel::<()>();
    let slow = {
        let mutex = mutex.clone();
        std::thread::spawn(move || {
            let slow = MutationLock::take(&mutex).unwrap();
            taken_tx.send(()).unwrap();
            // Let go when told, or when the test is over.
            let _ = go.recv();
            drop(slow);
        })
    };
    let until = Instant::now() + Duration::from_secs(5);
    while opened(&mutex) < 2 {
        within("the slow process opening the first holder's file", until);
        std::thread::sleep(Duration::from_millis(1));
    }
    // The first holder lets go: removed, the next holder in, unlocked.
    std::fs::remove_file(&mutex).unwrap();
    let second = frozen_flock(&mutex);
    let seconds = second.metadata().unwrap();
    drop(first);
    // The slow process either takes the lock (the removed file: wrong)
    // or opens the second holder's file to wait on it.
    let early = loop {
        if taken.try_recv().is_ok() {
            break true;
        }
        if opened(&mutex) == 2 {
            std::thread::sleep(Duration::from_millis(50));
            break taken.try_recv().is_ok();
        }
        within("the slow process taking or waiting", until);
        std::thread::sleep(Duration::from_millis(1));
    };
    if early {
        go_tx.send(()).unwrap();
        slow.join().unwrap();
        let kept = std::fs::symlink_metadata(&mutex)
            .is_ok_and(|named| (named.dev(), named.ino()) == (seconds.dev(), seconds.ino()));
        panic!(
            "the slow process took the mutation lock while another held it; letting go, \
             it {} that holder's file",
            if kept { "left" } else { "removed" }
        );
    }
    // The second holder lets go; then the slow process holds.
    std::fs::remove_file(&mutex).unwrap();
    drop(second);
    taken
        .recv_timeout(Duration::from_secs(5))
        .expect("the slow process taking the lock once free");
    assert_eq!(opened(&mutex), 1, "the slow process holds the file at the path");
    go_tx.send(()).unwrap();
    slow.join().unwrap();
    assert!(!mutex.exists(), "the slow process let go as leasehold does");
}

/// The tidy of a withdrawn announcement is deferred (the mutation lock is
/// held by a slow process); meanwhile the group's last reader leaves (its
/// group's end deferred too) and, once the slow process lets go, a new
/// reader starts the name's next group, racing the release thread for
/// the mutation lock. Whoever wins, the new reader holds: its record and
/// members directory stay while it holds, a writer stays out, and once it
/// leaves nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deferred_tidy_never_removes_the_next_groups_members_directory() {
    for &strategy in common::strategies() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().to_owned();
        let (reader, writer, next) = (
            locker(&dir, strategy),
            locker(&dir, strategy),
            Arc::new(locker(&dir, strategy)),
        );
        for round in 0..25u64 {
            let read = reader.acquire_shared("job").await.unwrap();
            let path = lock_path(&dir);
            let (members, mutex) = (members_of(&path), mutex_of(&path));
            // The writer announces itself, then gives up.
            let writing = writer.acquire_timeout("job", Duration::from_millis(150 + 10 * (round % 5)));
            let slow = {
                let mutex = mutex.clone();
                let take = async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    MutationLock::take(&mutex).unwrap()
                };
                let (written, slow) = tokio::join!(writing, take);
                assert!(written.is_err(), "{strategy:?} round {round}: a reader holds");
                slow
            };
            // Withdrawn while the slow process holds the mutation lock (the
            // announcement may have gone before it took it: then tidied at
            // once, as it found the lock free). The reader leaves, without
            // the lock too.
            drop(read);
            // Once the slow process lets go, a new reader starts the next
            // group while the release thread finishes the others.
            let started = {
                let next = Arc::clone(&next);
                tokio::spawn(async move { next.acquire_shared("job").await })
            };
            tokio::time::sleep(Duration::from_millis(round % 7)).await;
            drop(slow);
            let held = bounded("the next reader", started).await.unwrap().unwrap();
            // It holds, and keeps holding through the release thread's work.
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                assert!(
                    !held.is_lost(),
                    "{strategy:?} round {round}: the next reader lost its lock"
                );
                assert!(
                    members.is_dir(),
                    "{strategy:?} round {round}: the members directory of a held group went"
                );
                let records: Vec<String> = std::fs::read_dir(&members)
                    .unwrap()
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("m-"))
                    .collect();
                assert_eq!(
                    records.len(),
                    1,
                    "{strategy:?} round {round}: the holder's record: {records:?}"
                );
            }
            held.ensure_held()
                .await
                .unwrap_or_else(|e| panic!("{strategy:?} round {round}: {e}"));
            assert!(
                writer.try_acquire("job").await.unwrap().is_none(),
                "{strategy:?} round {round}: a writer got in beside a reader"
            );
            let holders = writer.holders("job").await.unwrap();
            assert_eq!(holders.len(), 1, "{strategy:?} round {round}: {holders:?}");
            held.release().await.unwrap();
            settles_empty(&dir, &format!("{strategy:?} round {round}")).await;
        }
    }
}

/// Readers and writers that give up (withdrawing their announcements)
/// while a slow process holds the mutation lock now and then: readers and
/// writers never hold at once, and once all are done nothing is left
/// (the deferred tidies finish, none runs for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn churn_with_a_slow_mutation_lock_never_overlaps_and_leaves_nothing() {
    for &strategy in common::strategies() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().to_owned();
        // The name's files exist once held.
        drop(locker(&dir, strategy).acquire_shared("job").await.unwrap());
        let readers = Arc::new(AtomicUsize::new(0));
        let writers = Arc::new(AtomicUsize::new(0));
        let overlap = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let held = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..3u64 {
            let locker = locker(&dir, strategy);
            let (readers, writers, overlap, stop, held) = (
                Arc::clone(&readers),
                Arc::clone(&writers),
                Arc::clone(&overlap),
                Arc::clone(&stop),
                Arc::clone(&held),
            );
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(SeqCst) {
                    let patience = Duration::from_millis(5 + 37 * ((n + i) % 5));
                    if let Ok(guard) = locker.acquire_shared_timeout("job", patience).await {
                        readers.fetch_add(1, SeqCst);
                        if writers.load(SeqCst) > 0 {
                            overlap.store(true, SeqCst);
                        }
                        held.fetch_add(1, SeqCst);
                        tokio::time::sleep(Duration::from_millis(1 + (n * 7 + i) % 15)).await;
                        readers.fetch_sub(1, SeqCst);
                        drop(guard);
                    }
                    n += 1;
                }
            }));
        }
        for i in 0..2u64 {
            let locker = locker(&dir, strategy);
            let (readers, writers, overlap, stop, held) = (
                Arc::clone(&readers),
                Arc::clone(&writers),
                Arc::clone(&overlap),
                Arc::clone(&stop),
                Arc::clone(&held),
            );
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(SeqCst) {
                    let patience = Duration::from_millis(3 + 23 * ((n + i) % 6));
                    if let Ok(guard) = locker.acquire_timeout("job", patience).await {
                        if writers.fetch_add(1, SeqCst) > 0 || readers.load(SeqCst) > 0 {
                            overlap.store(true, SeqCst);
                        }
                        held.fetch_add(1, SeqCst);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        writers.fetch_sub(1, SeqCst);
                        drop(guard);
                    }
                    n += 1;
                }
            }));
        }
        // The slow process.
        let slowing = {
            let (stop, dir) = (Arc::clone(&stop), dir.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(SeqCst) {
                    if let Some(path) = std::fs::read_dir(&dir)
                        .unwrap()
                        .map(|e| e.unwrap().path())
                        .find(|p| p.extension().is_some_and(|e| e == "lock"))
                    {
                        let slow = MutationLock::take(&mutex_of(&path)).unwrap();
                        std::thread::sleep(Duration::from_millis(1 + n % 25));
                        drop(slow);
                    }
                    std::thread::sleep(Duration::from_millis(3 + n % 11));
                    n += 1;
                }
            })
        };
        tokio::time::sleep(Duration::from_secs(6)).await;
        stop.store(true, SeqCst);
        for t in tasks {
            bounded("a task", t).await.unwrap();
        }
        slowing.join().unwrap();
        assert!(
            !overlap.load(SeqCst),
            "{strategy:?}: a reader and a writer held at once"
        );
        assert!(held.load(SeqCst) > 10, "{strategy:?}: too little churn");
        settles_empty(&dir, &format!("{strategy:?} after the churn")).await;
    }
}

/// Hostile entries shaped like records renamed aside for deletion
/// (`<name>.pending-<12 hex>`) in a members directory, beside live
/// holders: none breaks a scan, a join or a leave; none is taken for a
/// holder; a file whose flock a live process holds stays (a remover at
/// work); a free one goes (a remover killed before it was done); nothing
/// outside the members directory is touched; a live holder keeps its lock
/// though a hard link of its record bears such a name.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_pending_entries_break_nothing() {
    for &strategy in common::strategies() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("locks");
        std::fs::create_dir(&dir).unwrap();
        let outside = root.path().join("precious");
        std::fs::write(&outside, b"keep me").unwrap();
        let (a, b, w) = (
            locker(&dir, strategy),
            locker(&dir, strategy),
            locker(&dir, strategy),
        );
        let first: LockGuard = a.acquire_shared("job").await.unwrap();
        let path = lock_path(&dir);
        let members = members_of(&path);
        let own = std::fs::read_dir(&members)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with("m-"))
            .expect("the holder's record");
        // The hostile entries.
        let free = members.join("m-0.json.pending-0123456789ab");
        std::fs::write(&free, b"{}").unwrap();
        let locked = members.join("w-1.json.pending-abcdefabcdef");
        let live_remover = frozen_flock(&locked);
        std::fs::create_dir(members.join("d.pending-aaaaaaaaaaaa")).unwrap();
        nix::unistd::mkfifo(
            &members.join("f.pending-bbbbbbbbbbbb"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        std::os::unix::fs::symlink(&outside, members.join("s.pending-cccccccccccc")).unwrap();
        std::fs::hard_link(
            members.join(&own),
            members.join(format!("{own}.pending-dddddddddddd")),
        )
        .unwrap();
        // Names nearly of the shape: never touched.
        std::fs::write(members.join("x.pending-0123"), b"").unwrap();
        std::fs::write(members.join("x.pending-0123456789AB"), b"").unwrap();

        // Joins under the mutation lock (which collect) and leaves.
        for _ in 0..5 {
            let second = bounded("a second reader", b.acquire_shared("job")).await.unwrap();
            let holders = w.holders("job").await.unwrap();
            assert_eq!(holders.len(), 2, "{strategy:?}: {holders:?}");
            assert!(w.try_acquire("job").await.unwrap().is_none());
            second.release().await.unwrap();
        }
        assert!(!first.is_lost(), "{strategy:?}: the first reader lost its lock");
        first
            .ensure_held()
            .await
            .unwrap_or_else(|e| panic!("{strategy:?}: the first reader: {e}"));
        assert!(!free.exists(), "{strategy:?}: a free renamed-aside file stays");
        assert!(locked.exists(), "{strategy:?}: a live remover's file went");
        assert_eq!(std::fs::read(&outside).unwrap(), b"keep me");
        assert!(members.join("x.pending-0123").exists());
        assert!(members.join("x.pending-0123456789AB").exists());
        let holders = w.holders("job").await.unwrap();
        assert_eq!(holders.len(), 1, "{strategy:?}: {holders:?}");
        first.release().await.unwrap();
        // The name is not blocked: a writer gets in, then readers again.
        let write = bounded("a writer", w.acquire("job")).await.unwrap();
        assert!(a.try_acquire_shared("job").await.unwrap().is_none());
        write.release().await.unwrap();
        let again = bounded("a reader again", a.acquire_shared("job")).await.unwrap();
        assert_eq!(w.holders("job").await.unwrap().len(), 1);
        again.release().await.unwrap();
        drop(live_remover);
        let _ = w.clean(false).await;
        assert_eq!(std::fs::read(&outside).unwrap(), b"keep me");
        let left = left_in(&dir);
        println!("{strategy:?}: left {left:?}");
    }
}
