//! When a lock found on disk may be taken, and when it may not.

#[path = "support/common.rs"]
mod common;

use std::time::{Duration, SystemTime};

use common::iso;
use leasehold::{Error, Locker, Strategy};

#[test]
fn child_process_entry() {
    common::child_entry();
}

fn plant(path: &std::path::Path, content: &str, age: Duration) {
    common::plant(Strategy::ExclusiveFile, path, content, age);
}

/// This process's `startTime` as the writers of this platform put it, and
/// two hours in that unit: milliseconds since the epoch on Linux; whole
/// seconds on Windows (pi-research's unit there), read from a record
/// leasehold writes.
#[cfg(unix)]
async fn own_start_time(_dir: &std::path::Path) -> (u64, u64) {
    (common::own_start_ms(), 7_200_000)
}

#[cfg(windows)]
async fn own_start_time(dir: &std::path::Path) -> (u64, u64) {
    let probe = Locker::new(dir).unwrap();
    let held = probe.acquire("probe-start").await.unwrap();
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(probe.lock_path("probe-start").unwrap()).unwrap()).unwrap();
    drop(held);
    (record["startTime"].as_u64().expect("startTime written"), 7_200)
}

#[tokio::test]
async fn a_live_pid_with_the_right_start_time_is_honoured() {
    let dir = tempfile::tempdir().unwrap();
    // No foreign lease: only liveness can decide.
    let locker = Locker::builder()
        .directory(dir.path())
        .foreign_lease(None)
        .build()
        .unwrap();
    let path = locker.lock_path("job").unwrap();
    let me = std::process::id();
    let (start, _) = own_start_time(dir.path()).await;
    let record = format!(r#"{{"uuid":"seed","pid":{me},"startTime":{start}}}"#);
    plant(&path, &record, Duration::from_secs(3600));
    assert!(locker.try_acquire("job").await.unwrap().is_none());
    assert_eq!(std::fs::read_to_string(&path).unwrap(), record);
    let owner = locker.holder("job").await.unwrap().expect("held");
    assert_eq!(owner.pid(), Some(me));
    assert_eq!(owner.uuid(), Some("seed"));
}

#[tokio::test]
async fn a_live_pid_with_another_start_time_is_a_reused_pid() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::builder()
        .directory(dir.path())
        .foreign_lease(None)
        .build()
        .unwrap();
    let path = locker.lock_path("job").unwrap();
    // Written an hour ago by a process that started two hours ago; the pid
    // now belongs to this test process, which started after that.
    let (start, two_hours) = own_start_time(dir.path()).await;
    let record = format!(
        r#"{{"uuid":"seed","pid":{},"startTime":{}}}"#,
        std::process::id(),
        start - two_hours
    );
    plant(&path, &record, Duration::from_secs(3600));
    let guard = locker.try_acquire("job").await.unwrap().expect("reclaimed");
    assert_eq!(locker.stats().reclaimed_dead_owner, 1, "{:?}", locker.stats());
    assert_eq!(guard.owner().pid(), Some(std::process::id()));
}

/// A record whose modification time is in the future (its writer's clock
/// runs ahead, or the clock stepped back since) is dated by when this
/// `Locker` first saw its file. A new holder's file is a new file even
/// when the filesystem gives it the number of the one before (ext4 does,
/// to a file made just after another was removed): judged by inode
/// number, the live holder's file below inherited 1.6 s of age from the
/// files before it, over its foreign lease of 1 s, and was taken from it.
#[tokio::test]
async fn a_new_holders_file_with_an_old_inode_number_is_not_dated_by_the_old_file() {
    use std::fs::{File, FileTimes};
    let dir = tempfile::tempdir().unwrap();
    let mk = || {
        Locker::builder()
            .directory(dir.path())
            .foreign_lease(Some(Duration::from_secs(1)))
            .build()
            .unwrap()
    };
    let (looker, path) = (mk(), mk().lock_path("job").unwrap());
    let (start, _) = own_start_time(dir.path()).await;
    // pi-research's record of a live holder (this process), written by a
    // clock 10 s ahead.
    let record = format!(
        r#"{{"uuid":"seed","pid":{},"startTime":{start}}}"#,
        std::process::id()
    );
    let plant_ahead = || {
        std::fs::write(&path, &record).unwrap();
        let mtime = SystemTime::now() + Duration::from_secs(10);
        let times = FileTimes::new().set_modified(mtime).set_accessed(mtime);
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_times(times)
            .unwrap();
    };
    // The lock changes hands every 20 ms for 1.6 s, and `looker` looks.
    plant_ahead();
    let began = std::time::Instant::now();
    while began.elapsed() < Duration::from_millis(1600) {
        assert!(looker.try_acquire("job").await.unwrap().is_none(), "held");
        std::fs::remove_file(&path).unwrap();
        plant_ahead();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        mk().try_acquire("job").await.unwrap().is_none(),
        "a new Locker leaves it"
    );
    assert!(
        looker.try_acquire("job").await.unwrap().is_none(),
        "taken from its live holder: {:?}",
        looker.stats()
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), record);
}

/// A dead holder's record dated in the future is judged by how long this
/// `Locker` has known its file, from a map of first sightings that is
/// emptied past 4096 files. Every file judged was entered, dated or not:
/// a busy lock changing hands entered a new file at each handoff (on
/// tmpfs always; on ext4 once files were told apart by birth time), and
/// the map, emptied every 4096 handoffs seen, forgot the dead lock's age
/// before its lease was out: it was never taken in 8 s. (Found by a
/// helper's attack.)
#[tokio::test]
async fn a_busy_lock_changing_hands_does_not_keep_a_dead_future_dated_lock_forever() {
    let dir = tempfile::tempdir().unwrap();
    let looker = Locker::builder()
        .directory(dir.path())
        .foreign_lease(Some(Duration::from_secs(2)))
        .build()
        .unwrap();
    let (busy, dead) = (
        looker.lock_path("busy").unwrap(),
        looker.lock_path("dead").unwrap(),
    );
    // Another host's holder, gone, its record dated an hour ahead.
    let record = r#"{"uuid":"d","pid":999999,"hostname":"elsewhere.example"}"#;
    plant(&dead, record, Duration::ZERO);
    let ahead = SystemTime::now() + Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&dead)
        .unwrap()
        .set_times(std::fs::FileTimes::new().set_modified(ahead))
        .unwrap();
    assert!(
        looker.try_acquire("dead").await.unwrap().is_none(),
        "within its lease"
    );
    // A live holder (this process) of `busy`, whose lock changes hands
    // as fast as it can.
    let (start, _) = own_start_time(dir.path()).await;
    let live = format!(
        r#"{{"uuid":"b","pid":{},"startTime":{start}}}"#,
        std::process::id()
    );
    let began = std::time::Instant::now();
    let (mut handoffs, mut taken) = (0u64, None);
    while began.elapsed() < Duration::from_secs(8) && taken.is_none() {
        for _ in 0..200 {
            let _ = std::fs::remove_file(&busy);
            std::fs::write(&busy, &live).unwrap();
            assert!(looker.try_acquire("busy").await.unwrap().is_none(), "busy held");
            handoffs += 1;
        }
        if looker.try_acquire("dead").await.unwrap().is_some() {
            taken = Some(began.elapsed());
        }
    }
    eprintln!("{handoffs} handoffs seen, dead lock taken after {taken:?}");
    assert!(
        taken.is_some(),
        "the dead lock was never taken ({handoffs} handoffs seen in 8 s)"
    );
}

#[tokio::test]
async fn another_hosts_lock_waits_for_its_lease() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::new(dir.path()).unwrap();
    let path = locker.lock_path("job").unwrap();
    let expires = SystemTime::now() + Duration::from_millis(500);
    // pid 1 is alive here, and a dead pid would not matter either: the
    // owner is on another host.
    let record = format!(
        r#"{{"uuid":"x","pid":999999,"hostname":"elsewhere.example","leaseExpiresAt":"{}","extra":[1,2]}}"#,
        iso(expires)
    );
    plant(&path, &record, Duration::ZERO);
    assert!(locker.try_acquire("job").await.unwrap().is_none());
    let owner = locker.holder("job").await.unwrap().expect("held");
    assert_eq!(owner.hostname(), Some("elsewhere.example"));
    tokio::time::sleep(Duration::from_millis(2700)).await;
    assert!(locker.try_acquire("job").await.unwrap().is_some());
}

// Wine 8.0 makes no symbolic link (and Windows makes one only with a privilege).
#[cfg(unix)]
#[tokio::test]
async fn a_symlink_at_the_lock_path_is_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let locker = Locker::new(dir.path()).unwrap();
    let path = locker.lock_path("job").unwrap();
    std::os::unix::fs::symlink(&victim, &path).unwrap();

    let err = locker.try_acquire("job").await.unwrap_err();
    assert!(
        matches!(err, Error::UnexpectedFile { found: "symlink", .. }),
        "{err:?}"
    );
    let err = locker
        .acquire_timeout("job", Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::UnexpectedFile { .. }), "{err:?}");
    assert!(matches!(
        locker.holder("job").await,
        Err(Error::UnexpectedFile { .. })
    ));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_symlink());
    // Even a dangling symlink is not created through.
    std::fs::remove_file(&victim).unwrap();
    assert!(locker.try_acquire("job").await.is_err());
    assert!(!victim.exists());
}

#[tokio::test]
async fn directories_and_fifos_at_the_lock_path_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::new(dir.path()).unwrap();
    std::fs::create_dir(locker.lock_path("d").unwrap()).unwrap();
    let err = locker.try_acquire("d").await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnexpectedFile {
                found: "directory",
                ..
            }
        ),
        "{err:?}"
    );
    // Windows has no FIFO in a directory.
    #[cfg(unix)]
    {
        nix::unistd::mkfifo(&locker.lock_path("f").unwrap(), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let err = locker.try_acquire("f").await.unwrap_err();
        assert!(
            matches!(err, Error::UnexpectedFile { found: "FIFO", .. }),
            "{err:?}"
        );
    }
}
