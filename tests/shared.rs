//! Shared locks and semaphores in one process: the basic promises.

use std::time::Duration;

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

const BOTH: [Strategy; 2] = [Strategy::ExclusiveFile, Strategy::Directory];

#[tokio::test]
async fn readers_overlap_and_exclude_a_writer() {
    for strategy in BOTH {
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
        let w = b
            .try_acquire("cat")
            .await
            .unwrap()
            .expect("free once every reader left");
        assert!(a.try_acquire_shared("cat").await.unwrap().is_none());
        drop(w);
        assert!(a.try_acquire_shared("cat").await.unwrap().is_some());
        // Nothing left behind.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "{strategy:?}: {left:?}");
    }
}

#[tokio::test]
async fn a_waiting_writer_holds_back_new_readers() {
    for strategy in BOTH {
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
    for strategy in BOTH {
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
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
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
