//! The closure form: `with_lock` runs a future under the lock, and never
//! lets it run on once the lock is lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use leasehold::{Error, Locker, LossReason};

fn quick(dir: &std::path::Path) -> Locker {
    Locker::builder()
        .directory(dir)
        .lease(Duration::from_millis(400))
        .renew_interval(Duration::from_millis(100))
        .build()
        .unwrap()
}

#[tokio::test]
async fn the_output_comes_back_nested_acquisitions_reenter_and_the_lock_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (quick(dir.path()), quick(dir.path()));
    let out = a
        .with_lock("ledger", async {
            assert!(
                b.try_acquire("ledger").await.unwrap().is_none(),
                "held while it runs"
            );
            let again = tokio::time::timeout(Duration::from_secs(2), a.acquire("ledger"))
                .await
                .expect("a nested acquisition re-enters instead of waiting")
                .unwrap();
            drop(again);
            // Nested with_lock re-enters too.
            a.with_lock("ledger", async { 7 }).await.unwrap() * 6
        })
        .await
        .unwrap();
    assert_eq!(out, 42);
    assert!(b.try_acquire("ledger").await.unwrap().is_some(), "released after");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_drops_the_future_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let locker = quick(dir.path());
    let path = locker.lock_path("ledger").unwrap();
    let dropped = Arc::new(AtomicBool::new(false));
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let started = Instant::now();
    let result = locker
        .with_lock("ledger", {
            let flag = Flag(Arc::clone(&dropped));
            let path = path.clone();
            async move {
                let _flag = flag;
                // Someone removes the lock under us.
                remove_lock_file(&path);
                tokio::time::sleep(Duration::from_secs(30)).await;
                "ran on without the lock"
            }
        })
        .await;
    match result {
        Err(Error::Lost { name, reason }) => {
            assert_eq!(name, "ledger");
            assert_eq!(reason, LossReason::Replaced);
        }
        other => panic!("{other:?}"),
    }
    assert!(dropped.load(Ordering::SeqCst), "the future was dropped");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn with_lock_timeout_times_out_without_running_the_future() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (quick(dir.path()), quick(dir.path()));
    let _held = a.acquire("deploy").await.unwrap();
    let ran = AtomicBool::new(false);
    let err = b
        .with_lock_timeout("deploy", Duration::from_millis(50), async {
            ran.store(true, Ordering::SeqCst);
        })
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    assert!(!ran.load(Ordering::SeqCst));
}

/// Removes the lock file at `path` so that its name is free at once, as
/// `unlink` does on Unix. Windows keeps a deleted file's name while its
/// holder has it open ("delete pending": Wine does, and Windows without
/// POSIX delete), so there the file is renamed aside first, as the
/// library's own removal does, and deleted under that name.
fn remove_lock_file(path: &std::path::Path) {
    #[cfg(windows)]
    let path = &{
        let mut aside = path.as_os_str().to_owned();
        aside.push(".removed");
        std::fs::rename(path, &aside).unwrap();
        std::path::PathBuf::from(aside)
    };
    std::fs::remove_file(path).unwrap();
}
