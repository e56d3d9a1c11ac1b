//! Upgradable shared locks: one upgradable holder at a time, readers
//! coexist, writers are excluded, an upgrade waits for readers and lets
//! no writer in between, a downgrade lets readers in, fencing grows.

use std::time::Duration;

use leasehold::{Locker, Strategy};

fn lockers(dir: &std::path::Path, strategy: Strategy) -> (Locker, Locker) {
    let make = || {
        Locker::builder()
            .directory(dir)
            .strategy(strategy)
            .fencing(true)
            .build()
            .unwrap()
    };
    (make(), make())
}

fn strategies() -> Vec<Strategy> {
    if cfg!(windows) {
        vec![Strategy::ExclusiveFile]
    } else {
        vec![Strategy::ExclusiveFile, Strategy::Directory]
    }
}

#[tokio::test]
async fn one_upgradable_at_a_time_readers_coexist_writers_excluded() {
    for strategy in strategies() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = lockers(dir.path(), strategy);
        let up = a.acquire_upgradable("n").await.unwrap();
        assert!(
            b.try_acquire_upgradable("n").await.unwrap().is_none(),
            "{strategy:?}"
        );
        assert!(
            a.try_acquire_upgradable("n").await.unwrap().is_none(),
            "{strategy:?}"
        );
        let r1 = b.try_acquire_shared("n").await.unwrap().expect("a reader joins");
        let r2 = a
            .try_acquire_shared("n")
            .await
            .unwrap()
            .expect("a local reader joins");
        assert!(b.try_acquire("n").await.unwrap().is_none(), "{strategy:?}");
        assert!(a.try_acquire("n").await.unwrap().is_none(), "{strategy:?}");
        drop((r1, r2));
        assert!(
            b.try_acquire("n").await.unwrap().is_none(),
            "a writer waits for the upgradable"
        );
        drop(up);
        let w = b.try_acquire("n").await.unwrap().expect("free again");
        assert!(a.try_acquire_upgradable("n").await.unwrap().is_none());
        drop(w);
        assert!(a.try_acquire_upgradable("n").await.unwrap().is_some());
    }
}

#[tokio::test]
async fn upgrade_waits_for_readers_and_lets_no_writer_in() {
    for strategy in strategies() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = lockers(dir.path(), strategy);
        let up = a.acquire_upgradable("n").await.unwrap();
        let shared_token = up.guard().fencing_token().unwrap();
        let reader = b.acquire_shared("n").await.unwrap();
        // A writer of another Locker waits meanwhile.
        let b2 = b.clone();
        let writer = tokio::spawn(async move { b2.acquire("n").await.unwrap() });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let upgrading = tokio::spawn(up.upgrade());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !upgrading.is_finished(),
            "{strategy:?}: the upgrade waits for the reader"
        );
        // New readers do not starve it.
        assert!(b.try_acquire_shared("n").await.unwrap().is_none(), "{strategy:?}");
        drop(reader);
        let exclusive = tokio::time::timeout(Duration::from_secs(5), upgrading)
            .await
            .expect("the upgrade ends once the reader left")
            .unwrap()
            .unwrap();
        assert!(!exclusive.is_shared());
        assert!(exclusive.fencing_token().unwrap() > shared_token, "{strategy:?}");
        assert!(!writer.is_finished(), "{strategy:?}: no writer got in");
        assert!(b.try_acquire_shared("n").await.unwrap().is_none());
        assert!(b.try_acquire("n").await.unwrap().is_none());
        // Downgrade: readers again, the writer still out.
        let up = exclusive.downgrade().await.unwrap();
        let reader = b.try_acquire_shared("n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!writer.is_finished(), "{strategy:?}: no writer after a downgrade");
        drop(reader);
        // And up again.
        let exclusive = up.upgrade().await.unwrap();
        assert!(!writer.is_finished());
        drop(exclusive);
        let w = tokio::time::timeout(Duration::from_secs(5), writer)
            .await
            .unwrap()
            .unwrap();
        assert!(!w.is_shared());
        drop(w);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.ends_with(".mutex") && !n.ends_with(".fence"))
            .collect();
        assert!(left.is_empty(), "{strategy:?}: left {left:?}");
    }
}
