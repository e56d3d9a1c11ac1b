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
            // Windows' waiting line keeps its file for good
            // (docs/guarantees.md, *Windows*).
            .filter(|n| !n.ends_with(".mutex") && !n.ends_with(".fence") && n != "leasehold..line")
            .collect();
        assert!(left.is_empty(), "{strategy:?}: left {left:?}");
    }
}

/// Removes the lock at `path` (a file, or a directory) behind its
/// holder's back, at once (renamed aside first on Windows, see
/// `tests/lost.rs`).
fn remove_behind_its_back(path: &std::path::Path) {
    if path.is_dir() {
        std::fs::remove_dir_all(path).unwrap();
    } else if cfg!(windows) {
        let mut aside = path.as_os_str().to_owned();
        aside.push(".removed");
        std::fs::rename(path, &aside).unwrap();
        std::fs::remove_file(&aside).unwrap();
    } else {
        std::fs::remove_file(path).unwrap();
    }
}

fn renewing_locker(dir: &std::path::Path, strategy: Strategy) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .fencing(true)
        .lease(Duration::from_secs(1))
        .renew_interval(Duration::from_millis(50))
        .build()
        .unwrap()
}

/// The exclusive guard an upgrade made has a lease of its own: when its
/// lock is taken away (removed by hand), `lost()` fires with the reason,
/// `is_lost()` says so, and a downgrade or a release reports the loss
/// instead of handing out a holding of a lock nobody holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_guard_whose_lock_is_taken_away_reports_the_loss() {
    for strategy in strategies() {
        for then in ["downgrade", "release"] {
            let dir = tempfile::tempdir().unwrap();
            let locker = renewing_locker(dir.path(), strategy);
            let writer = locker
                .acquire_upgradable("n")
                .await
                .unwrap()
                .upgrade()
                .await
                .unwrap();
            assert!(!writer.is_lost());
            remove_behind_its_back(&locker.lock_path("n").unwrap());
            tokio::time::timeout(Duration::from_secs(3), writer.lost())
                .await
                .unwrap_or_else(|_| panic!("{strategy:?}: lost() never fired"));
            assert!(writer.is_lost(), "{strategy:?}");
            let err = match then {
                "downgrade" => writer.downgrade().await.map(drop).unwrap_err(),
                _ => writer.release().await.unwrap_err(),
            };
            match &err {
                leasehold::Error::Lost { reason, .. } => {
                    assert_eq!(*reason, leasehold::LossReason::Replaced, "{strategy:?} {then}")
                }
                other => panic!("{strategy:?} {then}: expected a loss, got {other:?}"),
            }
            // Nobody holds it: another Locker takes it at once.
            let other = renewing_locker(dir.path(), strategy);
            assert!(
                other.try_acquire("n").await.unwrap().is_some(),
                "{strategy:?} {then}"
            );
        }
    }
}

/// The upgradable guard a downgrade made, and the one first acquired,
/// report a lock taken away too; an upgrade of a lost holding fails with
/// the loss and holds nothing.
// Removes the members directory while its holder keeps a record in it
// open: Wine's `remove_dir_all` may hang there.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgradable_guard_whose_lock_is_taken_away_reports_the_loss() {
    for strategy in strategies() {
        for downgraded in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let locker = renewing_locker(dir.path(), strategy);
            let mut up = locker.acquire_upgradable("n").await.unwrap();
            if downgraded {
                up = up.upgrade().await.unwrap().downgrade().await.unwrap();
            }
            let path = locker.lock_path("n").unwrap();
            remove_behind_its_back(&path);
            // The members directory too: every trace of the holding.
            let members: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.is_dir() && p != &path)
                .collect();
            for m in &members {
                std::fs::remove_dir_all(m).unwrap();
            }
            tokio::time::timeout(Duration::from_secs(3), up.guard().lost())
                .await
                .unwrap_or_else(|_| panic!("{strategy:?} downgraded={downgraded}: lost() never fired"));
            assert!(up.guard().is_lost());
            let err = up.upgrade().await.unwrap_err();
            assert!(
                matches!(err, leasehold::Error::Lost { .. }),
                "{strategy:?} downgraded={downgraded}: {err:?}"
            );
            let other = renewing_locker(dir.path(), strategy);
            assert!(
                other.try_acquire("n").await.unwrap().is_some(),
                "{strategy:?} downgraded={downgraded}"
            );
        }
    }
}

/// A guard from `acquire()` (or a shared one) is not downgraded: a clear
/// `Unsupported` error, and the guard, consumed, released its lock.
#[tokio::test]
async fn only_an_upgraded_guard_is_downgraded() {
    for strategy in strategies() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = lockers(dir.path(), strategy);
        let plain = a.acquire("n").await.unwrap();
        let err = plain.downgrade().await.map(drop).unwrap_err();
        assert!(
            matches!(err, leasehold::Error::Unsupported { .. }),
            "{strategy:?}: {err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("Locker::acquire") && text.contains("acquire_upgradable"),
            "{text}"
        );
        assert!(
            b.try_acquire("n").await.unwrap().is_some(),
            "{strategy:?}: released"
        );
        let shared = a.acquire_shared("n").await.unwrap();
        let err = shared.downgrade().await.map(drop).unwrap_err();
        assert!(matches!(err, leasehold::Error::Unsupported { .. }), "{err:?}");
    }
}

/// `acquire_upgradable_timeout` times out with the holder named; a wait
/// that ends gets the guard (never an error that is not a timeout).
#[tokio::test]
async fn a_timed_wait_for_the_upgradable_place() {
    for strategy in strategies() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = lockers(dir.path(), strategy);
        let up = a.acquire_upgradable("n").await.unwrap();
        let err = b
            .acquire_upgradable_timeout("n", Duration::from_millis(60))
            .await
            .unwrap_err();
        assert!(err.is_timeout(), "{strategy:?}: {err:?}");
        let waiter =
            tokio::spawn(async move { b.acquire_upgradable_timeout("n", Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(up);
        let got = waiter.await.unwrap().unwrap();
        drop(got);
    }
}
