//! Shared locks and semaphores in one process: the basic promises.

use std::time::Duration;

#[path = "support/common.rs"]
mod common;

use leasehold::{Error, LockKind, Locker, Strategy};

fn lockers(dir: &std::path::Path, strategy: Strategy) -> (Locker, Locker) {
    let make = || {
        Locker::builder()
            .directory(dir)
            .strategy(strategy)
            .build()
            .unwrap()
    };
    (make(), make())
}

/// The layouts this platform has: Windows refuses the directory layout
/// (a directory cannot carry the liveness mark there).
#[cfg(unix)]
const LAYOUTS: &[Strategy] = &[Strategy::ExclusiveFile, Strategy::Directory];
#[cfg(windows)]
const LAYOUTS: &[Strategy] = &[Strategy::ExclusiveFile];

#[tokio::test]
async fn readers_overlap_and_exclude_a_writer() {
    for &strategy in LAYOUTS {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = lockers(dir.path(), strategy);
        let r1 = a.acquire_shared("cat").await.unwrap();
        let r2 = b.acquire_shared("cat").await.unwrap();
        let r3 = a.acquire_shared("cat").await.unwrap();
        assert!(r1.is_shared() && r2.is_shared() && r3.is_shared());
        assert!(b.try_acquire("cat").await.unwrap().is_none(), "{strategy:?}");
        assert!(a.try_acquire("cat").await.unwrap().is_none(), "{strategy:?}");
        let holders = a.holders("cat").await.unwrap();
        assert_eq!(holders.len(), 2, "one hold per Locker: {holders:?}");
        let info = a.inspect("cat").await.unwrap().unwrap();
        assert_eq!(info.kind(), LockKind::Shared);
        assert!(!info.is_stale());
        drop(r1);
        assert!(b.try_acquire("cat").await.unwrap().is_none());
        drop(r3);
        assert!(b.try_acquire("cat").await.unwrap().is_none());
        drop(r2);
        // Free once every reader left: at once, or (a drop that found the
        // name's mutation lock taken, see `left_in`) when the release
        // thread has finished the release.
        let mut w = None;
        for _ in 0..200 {
            w = b.try_acquire("cat").await.unwrap();
            if w.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let w = w.expect("free once every reader left");
        assert!(a.try_acquire_shared("cat").await.unwrap().is_none());
        drop(w);
        assert!(a.try_acquire_shared("cat").await.unwrap().is_some());
        // Nothing left behind.
        let left = common::left_after(dir.path(), Duration::from_secs(5));
        assert!(left.is_empty(), "{strategy:?}: {left:?}");
    }
}

#[tokio::test]
async fn a_waiting_writer_holds_back_new_readers() {
    for &strategy in LAYOUTS {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = lockers(dir.path(), strategy);
        let r1 = a.acquire_shared("cat").await.unwrap();
        let writer = tokio::spawn({
            let b = b.clone();
            async move { b.acquire("cat").await.unwrap() }
        });
        // Give the writer time to announce itself.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let late = Locker::builder()
            .directory(dir.path())
            .strategy(strategy)
            .build()
            .unwrap();
        assert!(
            late.try_acquire_shared("cat").await.unwrap().is_none(),
            "{strategy:?}: a reader overtook a waiting writer"
        );
        assert!(b.try_acquire_shared("cat").await.unwrap().is_none());
        drop(r1);
        let w = tokio::time::timeout(Duration::from_secs(10), writer)
            .await
            .unwrap()
            .unwrap();
        assert!(!w.is_shared());
        drop(w);
        assert!(late.try_acquire_shared("cat").await.unwrap().is_some());
    }
}

#[tokio::test]
async fn a_semaphore_admits_at_most_its_permits() {
    for &strategy in LAYOUTS {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = lockers(dir.path(), strategy);
        let sa = a.semaphore("gpu", 2).unwrap();
        let sb = b.semaphore("gpu", 2).unwrap();
        let p1 = sa.acquire().await.unwrap();
        let p2 = sb.acquire().await.unwrap();
        assert!(sa.try_acquire().await.unwrap().is_none());
        assert!(sb.try_acquire().await.unwrap().is_none());
        assert_eq!(a.holders("gpu").await.unwrap().len(), 2);
        // Another count is refused while the name is held.
        let three = b.semaphore("gpu", 3).unwrap();
        assert!(matches!(
            three.try_acquire().await,
            Err(Error::KindMismatch { .. })
        ));
        assert!(matches!(
            a.try_acquire_shared("gpu").await,
            Err(Error::KindMismatch { .. })
        ));
        let waiter = tokio::spawn({
            let sb = sb.clone();
            async move { sb.acquire().await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(p1);
        let p3 = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        drop((p2, p3));
        let left = common::left_after(dir.path(), Duration::from_secs(5));
        assert!(left.is_empty(), "{strategy:?}: {left:?}");
    }
}

/// A group past the size a join reads on the runtime's own thread (8
/// entries: larger ones are joined on the blocking pool) is counted the
/// same: of 12 `Locker`s after 10 permits, 10 get one and 2 are told it
/// is full, and 12 readers all hold one shared lock at once.
#[tokio::test]
async fn a_large_group_is_counted_as_a_small_one() {
    for &strategy in LAYOUTS {
        let dir = tempfile::tempdir().unwrap();
        let lockers: Vec<Locker> = (0..12)
            .map(|_| {
                Locker::builder()
                    .directory(dir.path())
                    .strategy(strategy)
                    .build()
                    .unwrap()
            })
            .collect();
        let mut permits = Vec::new();
        let mut full = 0;
        for locker in &lockers {
            match locker.semaphore("wide", 10).unwrap().try_acquire().await.unwrap() {
                Some(permit) => permits.push(permit),
                None => full += 1,
            }
        }
        assert_eq!((permits.len(), full), (10, 2), "{strategy:?}");
        assert_eq!(lockers[0].holders("wide").await.unwrap().len(), 10);
        drop(permits);
        let mut readers = Vec::new();
        for locker in &lockers {
            readers.push(
                locker
                    .try_acquire_shared("wide")
                    .await
                    .unwrap()
                    .expect("a reader"),
            );
        }
        assert_eq!(
            lockers[0].holders("wide").await.unwrap().len(),
            12,
            "{strategy:?}"
        );
        assert!(lockers[0].try_acquire("wide").await.unwrap().is_none());
        drop(readers);
        let left = common::left_after(dir.path(), Duration::from_secs(5));
        assert!(left.is_empty(), "{strategy:?}: {left:?}");
    }
}

#[tokio::test]
async fn an_exclusive_acquisition_inside_a_shared_scope_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::new(dir.path()).unwrap();
    locker
        .scope(async {
            let _r = locker.acquire_shared("cat").await.unwrap();
            let again = locker.acquire_shared("cat").await.unwrap();
            assert!(again.is_shared());
            assert!(matches!(
                locker.acquire("cat").await,
                Err(Error::WouldDeadlock { .. })
            ));
        })
        .await;
    locker
        .scope(async {
            let _w = locker.acquire("cat").await.unwrap();
            let r = locker.acquire_shared("cat").await.unwrap();
            assert!(!r.is_shared(), "re-entered the exclusive hold");
        })
        .await;
}

#[tokio::test]
async fn a_marker_whose_holders_are_dead_is_reclaimed_and_clean_removes_orphans() {
    for &strategy in LAYOUTS {
        let dir = tempfile::tempdir().unwrap();
        let locker = Locker::builder()
            .directory(dir.path())
            .strategy(strategy)
            .build()
            .unwrap();
        let path = locker.lock_path("cat").unwrap();
        let marker = r#"{"uuid":"x","pid":999999999,"leasehold":1,"mode":"shared","group":"g"}"#;
        match strategy {
            Strategy::Directory => {
                std::fs::create_dir(&path).unwrap();
                std::fs::write(path.join("owner.json"), marker).unwrap();
            }
            _ => std::fs::write(&path, marker).unwrap(),
        }
        let members = path.with_file_name(format!("{}.members", path.file_name().unwrap().to_str().unwrap()));
        std::fs::create_dir(&members).unwrap();
        std::fs::write(members.join("m-x.json"), r#"{"uuid":"x","pid":999999999}"#).unwrap();
        let info = locker.inspect("cat").await.unwrap().unwrap();
        assert_eq!(info.kind(), LockKind::Shared);
        assert!(info.is_stale(), "{strategy:?}: no live holder");
        assert!(locker.holders("cat").await.unwrap().is_empty());
        let guard = locker.try_acquire("cat").await.unwrap().expect("reclaimed");
        drop(guard);
        let left = common::left_after(dir.path(), Duration::from_secs(5));
        assert!(left.is_empty(), "{strategy:?}: {left:?}");

        // A members directory without its lock path, holding only the dead.
        std::fs::create_dir(&members).unwrap();
        std::fs::write(members.join("m-y.json"), r#"{"uuid":"y","pid":999999999}"#).unwrap();
        std::fs::write(members.join("w-z.json"), r#"{"uuid":"z","pid":999999999}"#).unwrap();
        let cleaned = locker.clean(false).await.unwrap();
        assert_eq!(cleaned.len(), 1, "{cleaned:?}");
        assert!(!members.exists(), "{strategy:?}");
    }
}

#[tokio::test]
async fn shared_guards_of_one_locker_share_one_hold_and_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::builder()
        .directory(dir.path())
        .fencing(true)
        .build()
        .unwrap();
    let w = locker.acquire("cat").await.unwrap().fencing_token().unwrap();
    let r1 = locker.acquire_shared("cat").await.unwrap();
    let r2 = locker.acquire_shared("cat").await.unwrap();
    let token = r1.fencing_token().unwrap();
    assert!(
        token >= w,
        "a reader's token is no less than the writer's before it"
    );
    assert_eq!(r2.fencing_token(), Some(token));
    assert_eq!(locker.holders("cat").await.unwrap().len(), 1);
    let stats = locker.stats();
    assert_eq!(stats.shared_acquisitions, 2);
    // The second reader joined the first's hold at once: an acquisition,
    // with no wait measured.
    assert_eq!(stats.acquisitions, 3, "{stats:?}");
    assert_eq!(stats.wait_count, 2, "{stats:?}");
    drop((r1, r2));
    let after = locker.acquire("cat").await.unwrap().fencing_token().unwrap();
    assert!(after > token, "a writer after the readers has a greater token");
    let s = locker.semaphore("gpu", 2).unwrap();
    let p1 = s.acquire().await.unwrap().fencing_token().unwrap();
    let p2 = s.acquire().await.unwrap().fencing_token().unwrap();
    assert!(p2 > p1, "each permit gets a token of its own");
    assert_eq!(locker.stats().permit_acquisitions, 2);
}

#[tokio::test]
async fn cancelled_shared_and_permit_waiters_leave_nothing() {
    for &strategy in LAYOUTS {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = lockers(dir.path(), strategy);
        let w = a.acquire("cat").await.unwrap();
        let s = b.semaphore("gpu", 1).unwrap();
        let p = a.semaphore("gpu", 1).unwrap().acquire().await.unwrap();
        for _ in 0..3 {
            let r = tokio::time::timeout(Duration::from_millis(50), b.acquire_shared("cat")).await;
            assert!(r.is_err());
            let r = tokio::time::timeout(Duration::from_millis(50), s.acquire()).await;
            assert!(r.is_err());
        }
        // A writer waiting on readers, cancelled, withdraws its announcement.
        drop(w);
        let r = b.acquire_shared("cat").await.unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(300), a.acquire("cat")).await;
        assert!(waited.is_err());
        assert!(
            b.try_acquire_shared("cat").await.unwrap().is_some(),
            "{strategy:?}: the cancelled writer still holds readers back"
        );
        drop((r, p));
        let left = common::left_after(dir.path(), Duration::from_secs(5));
        assert!(left.is_empty(), "{strategy:?}: {left:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_stream_of_local_readers_does_not_starve_a_writer_elsewhere() {
    for &strategy in LAYOUTS {
        let dir = tempfile::tempdir().unwrap();
        let (readers, writer) = lockers(dir.path(), strategy);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stream = tokio::spawn({
            let (readers, stop) = (readers.clone(), stop.clone());
            async move {
                let mut tasks = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let readers = readers.clone();
                    tasks.push(tokio::spawn(async move {
                        let guard = readers.acquire_shared("cat").await.unwrap();
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        drop(guard);
                    }));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                for task in tasks {
                    task.await.unwrap();
                }
            }
        });
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(
            writer.try_acquire("cat").await.unwrap().is_none(),
            "the readers overlap"
        );
        let started = std::time::Instant::now();
        let w = tokio::time::timeout(Duration::from_secs(10), writer.acquire("cat"))
            .await
            .expect("the writer starved")
            .unwrap();
        let waited = started.elapsed();
        drop(w);
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        stream.await.unwrap();
        // The readers it found (100 ms each) plus one reader's hold, with
        // room for a slow machine.
        assert!(waited < Duration::from_secs(3), "{strategy:?}: waited {waited:?}");
    }
}

#[test]
fn a_semaphore_is_a_shareable_handle() {
    fn assert_handle<T: Clone + Send + Sync + std::fmt::Debug + 'static>() {}
    assert_handle::<leasehold::Semaphore>();
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::new(dir.path()).unwrap();
    match locker.semaphore("gpu", 0) {
        Err(Error::InvalidConfig { reason }) => assert!(reason.contains("permit"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(locker.semaphore("", 2), Err(Error::InvalidName { .. })));
    let gpu = locker.semaphore("gpu", 3).unwrap();
    assert_eq!((gpu.name(), gpu.permits()), ("gpu", 3));
}
