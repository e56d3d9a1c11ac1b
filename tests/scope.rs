//! Task-local re-entrancy.

use std::time::Duration;

use leasehold::{Error, Locker};

async fn lockers() -> (tempfile::TempDir, Locker, Locker) {
    let dir = tempfile::tempdir().unwrap();
    let a = Locker::new(dir.path()).unwrap();
    let b = Locker::new(dir.path()).unwrap();
    (dir, a, b)
}

#[tokio::test]
async fn three_levels_deep_released_in_any_order() {
    let (_dir, locker, rival) = lockers().await;
    // Every order of dropping three guards.
    let orders = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]];
    for order in orders {
        locker
            .scope(async {
                let outer = locker.acquire("ledger").await.unwrap();
                let middle = locker
                    .scope(async { locker.acquire("ledger").await.unwrap() })
                    .await;
                let inner = locker.try_acquire("ledger").await.unwrap().expect("re-entrant");
                let mut guards = [Some(outer), Some(middle), Some(inner)];
                for (n, i) in order.iter().enumerate() {
                    assert!(
                        rival.try_acquire("ledger").await.unwrap().is_none(),
                        "{order:?}: free too early"
                    );
                    guards[*i].take();
                    if n < 2 {
                        assert!(locker.is_held("ledger").await.unwrap());
                    }
                }
                assert!(
                    !locker.is_held("ledger").await.unwrap(),
                    "{order:?}: not freed by the last guard"
                );
            })
            .await;
    }
    let stats = locker.stats();
    assert_eq!(stats.acquisitions, 6);
    assert_eq!(stats.reentrant, 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_spawned_in_a_scope_is_not_in_it() {
    let (_dir, locker, _) = lockers().await;
    locker
        .scope(async {
            let _held = locker.acquire("ledger").await.unwrap();
            let l = locker.clone();
            let spawned = tokio::spawn(async move {
                let waited = l.acquire_timeout("ledger", Duration::from_millis(100)).await;
                let tried = l.try_acquire("ledger").await.unwrap();
                (waited.map(drop), tried.is_none())
            });
            let (waited, tried_none) = spawned.await.unwrap();
            assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
            assert!(tried_none);
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_in_another_task_updates_its_scope() {
    let (_dir, locker, rival) = lockers().await;
    locker
        .scope(async {
            let a = locker.acquire("ledger").await.unwrap();
            let b = locker.acquire("ledger").await.unwrap();
            drop(a);
            tokio::spawn(async move { drop(b) }).await.unwrap();
            assert!(!locker.is_held("ledger").await.unwrap());
            // The scope no longer holds it: this is a fresh acquisition.
            let before = locker.stats().acquisitions;
            let c = locker.acquire("ledger").await.unwrap();
            assert_eq!(locker.stats().acquisitions, before + 1);
            assert!(rival.try_acquire("ledger").await.unwrap().is_none());
            let moved = tokio::spawn(async move { c.release().await });
            moved.await.unwrap().unwrap();
            assert!(rival.try_acquire("ledger").await.unwrap().is_some());
        })
        .await;
}

#[tokio::test]
async fn outside_a_scope_a_second_acquire_waits() {
    let (_dir, locker, _) = lockers().await;
    let _held = locker.acquire("ledger").await.unwrap();
    let err = locker
        .acquire_timeout("ledger", Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    // Another Locker's scope does not make this one re-entrant either.
    let other = Locker::new(locker.directory()).unwrap();
    other
        .scope(async {
            assert!(other.try_acquire("ledger").await.unwrap().is_none());
        })
        .await;
}

#[tokio::test]
async fn release_of_a_reentrant_guard_keeps_the_lock() {
    let (_dir, locker, rival) = lockers().await;
    locker
        .scope(async {
            let outer = locker.acquire("ledger").await.unwrap();
            let inner = locker.acquire("ledger").await.unwrap();
            inner.release().await.unwrap();
            assert!(rival.try_acquire("ledger").await.unwrap().is_none());
            outer.release().await.unwrap();
            assert!(rival.try_acquire("ledger").await.unwrap().is_some());
        })
        .await;
}
