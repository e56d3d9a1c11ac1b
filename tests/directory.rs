//! What only the directory strategy has to get right.
// The directory layout, which Windows refuses (it cannot lock a directory).
#![cfg(unix)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leasehold::{Locker, Strategy};

fn locker(dir: &std::path::Path) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(Strategy::Directory)
        .build()
        .unwrap()
}

#[tokio::test]
async fn an_empty_directory_at_the_lock_path_is_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    let path = locker.lock_path("job").unwrap();
    // Someone's mkdir-style lock: a plain rename(2) would replace it.
    std::fs::create_dir(&path).unwrap();
    let ino = std::fs::metadata(&path).unwrap().ino();
    assert!(locker.try_acquire("job").await.unwrap().is_none());
    assert_eq!(
        std::fs::metadata(&path).unwrap().ino(),
        ino,
        "the directory was replaced"
    );
    assert_eq!(std::fs::read_dir(&path).unwrap().count(), 0);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "no pending directory left behind: {names:?}");
}

#[tokio::test]
async fn the_layout_is_the_first_seeds() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    let _guard = locker.acquire("reindex").await.unwrap();
    let path = dir.path().join("reindex-2ad945a5430f00fa.lock");
    let meta = std::fs::metadata(&path).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    let owner = path.join("owner.json");
    assert_eq!(
        std::fs::metadata(&owner).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(owner).unwrap()).unwrap();
    for key in ["pid", "hostname", "holderId", "acquiredAt", "leaseExpiresAt"] {
        assert!(!v[key].is_null(), "{key} missing");
    }
}

/// Renewal replaces owner.json by rename: a reader never sees it missing,
/// empty or torn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_never_see_a_half_written_record() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::builder()
        .directory(dir.path())
        .strategy(Strategy::Directory)
        .lease(Duration::from_millis(200))
        .renew_interval(Duration::from_millis(2))
        .build()
        .unwrap();
    let guard = locker.acquire("busy").await.unwrap();
    let owner = locker.lock_path("busy").unwrap().join("owner.json");
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut reads = 0u64;
            let mut distinct = std::collections::HashSet::new();
            while !stop.load(Ordering::Relaxed) {
                let text = std::fs::read_to_string(&owner).expect("owner.json always present");
                let v: serde_json::Value = serde_json::from_str(&text).expect("owner.json always whole");
                distinct.insert(v["leaseExpiresAt"].as_str().unwrap().to_owned());
                reads += 1;
            }
            (reads, distinct.len())
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let (reads, versions) = reader.join().unwrap();
    assert!(
        reads > 100 && versions > 10,
        "{reads} reads saw {versions} renewals"
    );
    assert!(!guard.is_lost());
    assert!(locker.stats().renewals > 10);
}

#[tokio::test]
async fn an_empty_lock_directory_past_the_grace_period_is_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::builder()
        .directory(dir.path())
        .strategy(Strategy::Directory)
        .unreadable_grace(Duration::from_millis(300))
        .build()
        .unwrap();
    std::fs::create_dir(locker.lock_path("job").unwrap()).unwrap();
    assert!(locker.try_acquire("job").await.unwrap().is_none());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let guard = locker.try_acquire("job").await.unwrap().expect("reclaimed");
    assert_eq!(locker.stats().reclaimed_unreadable, 1);
    drop(guard);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no trash left behind"
    );
}

/// Release normally removes just `owner.json` and the directory; files
/// someone else left inside (a renewal's `owner.json.next` after a crash,
/// say) must not make the directory outlive the lock.
#[tokio::test]
async fn release_removes_a_lock_directory_with_strays_inside() {
    for durable in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let locker = Locker::builder()
            .directory(dir.path())
            .strategy(Strategy::Directory)
            .durable(durable)
            .build()
            .unwrap();
        let guard = locker.acquire("job").await.unwrap();
        let path = locker.lock_path("job").unwrap();
        std::fs::write(path.join("owner.json.next"), b"{").unwrap();
        std::fs::write(path.join("notes"), b"left by hand").unwrap();
        drop(guard);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "durable({durable}): left behind {left:?}");
        // And the next acquisition, inline or not, works as before.
        drop(locker.acquire("job").await.unwrap());
        assert!(!path.exists());
    }
}

/// A sweep of abandoned pending directories (`clean`, or another
/// process's acquisition) that looks at a publisher's pending directory
/// in the instant between its `mkdir` and its `flock` does not make the
/// publisher's acquisition fail: it is no lock, only a look.
///
/// The sweep used to take the pending directory's flock before it judged
/// the directory too young to collect, and the publisher's `try_lock` in
/// that instant failed `acquire` with
/// `Io { op: "lock pending lock directory", .. "operation would block" }`
/// (seen once in a 10-minute soak of `tests/torture.rs`).
#[test]
fn a_sweep_in_the_instant_before_the_publishers_flock_fails_no_acquisition() {
    let dir = tempfile::tempdir().unwrap();
    let publisher = locker(dir.path());
    let sweeper = locker(dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    let sweeping = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            while !stop.load(Ordering::Relaxed) {
                rt.block_on(sweeper.clean(true)).unwrap();
            }
        })
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut failed = Vec::new();
    let began = std::time::Instant::now();
    let mut rounds = 0;
    while began.elapsed() < Duration::from_secs(30) && failed.is_empty() {
        rounds += 1;
        match rt.block_on(publisher.acquire("job")) {
            Ok(guard) => drop(guard),
            Err(e) => failed.push(format!("{e:?}")),
        }
    }
    stop.store(true, Ordering::Relaxed);
    sweeping.join().unwrap();
    assert!(failed.is_empty(), "after {rounds} acquisitions: {failed:?}");
}
