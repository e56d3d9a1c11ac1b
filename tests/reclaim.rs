//! When a lock found on disk may be taken, and when it may not.

use std::fs::{File, FileTimes};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use leasehold::{Error, Locker};

fn plant(path: &Path, content: &str, age: Duration) {
    std::fs::write(path, content).unwrap();
    let mtime = SystemTime::now() - age;
    File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_times(FileTimes::new().set_modified(mtime).set_accessed(mtime))
        .unwrap();
}

fn iso(t: SystemTime) -> String {
    let ms = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis() as i128;
    let dt = time::OffsetDateTime::from_unix_timestamp_nanos(ms * 1_000_000).unwrap();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        dt.year(),
        u8::from(dt.month()),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second(),
        ms % 1000
    )
}

/// This process's start in ms since the epoch, computed as a second-seed
/// writer with a process-lifecycle service would.
fn own_start_ms() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let ticks: u64 = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    let btime: u64 = std::fs::read_to_string("/proc/stat")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap() as u64;
    btime * 1000 + ticks * 1000 / hz
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
    let record = format!(r#"{{"uuid":"seed","pid":{me},"startTime":{}}}"#, own_start_ms());
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
    let record = format!(
        r#"{{"uuid":"seed","pid":{},"startTime":{}}}"#,
        std::process::id(),
        own_start_ms() - 7_200_000
    );
    plant(&path, &record, Duration::from_secs(3600));
    let guard = locker.try_acquire("job").await.unwrap().expect("reclaimed");
    assert_eq!(locker.stats().reclaimed_dead_owner, 1, "{:?}", locker.stats());
    assert_eq!(guard.owner().pid(), Some(std::process::id()));
}

#[tokio::test]
async fn a_dead_pid_is_reclaimed_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::new(dir.path()).unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    plant(
        &locker.lock_path("job").unwrap(),
        &format!(r#"{{"uuid":"seed","pid":{dead}}}"#),
        Duration::ZERO,
    );
    assert!(locker.try_acquire("job").await.unwrap().is_some());
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

#[tokio::test]
async fn unreadable_records_get_a_grace_period() {
    for content in ["", "{\"uuid\":\"abc\",\"pi", "\u{0}\u{0}\u{0}"] {
        let dir = tempfile::tempdir().unwrap();
        let locker = Locker::builder()
            .directory(dir.path())
            .unreadable_grace(Duration::from_secs(10))
            .build()
            .unwrap();
        let path = locker.lock_path("job").unwrap();
        plant(&path, content, Duration::from_secs(5));
        assert!(
            locker.try_acquire("job").await.unwrap().is_none(),
            "{content:?} taken within grace"
        );
        let owner = locker.holder("job").await.unwrap().expect("held while young");
        assert!(!owner.is_readable());
        plant(&path, content, Duration::from_secs(11));
        assert!(
            locker.try_acquire("job").await.unwrap().is_some(),
            "{content:?} kept past grace"
        );
    }
}

#[test]
fn eight_reclaimers_of_one_stale_lock_have_exactly_one_winner() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // Separate Lockers, as separate processes would have.
        let lockers: Vec<Locker> = (0..8).map(|_| Locker::new(dir.path()).unwrap()).collect();
        let path = lockers[0].lock_path("job").unwrap();
        for round in 0..200 {
            let stale = if round % 2 == 0 {
                r#"{"uuid":"x","pid":1,"hostname":"elsewhere.example","leaseExpiresAt":"2001-01-01T00:00:00.000Z"}"#
                    .to_owned()
            } else {
                r#"{"uuid":"x","pid":999999999}"#.to_owned()
            };
            plant(&path, &stale, Duration::ZERO);
            let barrier = Arc::new(tokio::sync::Barrier::new(8));
            let tasks: Vec<_> = lockers
                .iter()
                .cloned()
                .map(|l| {
                    let barrier = Arc::clone(&barrier);
                    tokio::spawn(async move {
                        barrier.wait().await;
                        l.try_acquire("job").await.unwrap()
                    })
                })
                .collect();
            let mut guards = Vec::new();
            for t in tasks {
                if let Some(g) = t.await.unwrap() {
                    guards.push(g);
                }
            }
            assert_eq!(guards.len(), 1, "round {round}: {} winners", guards.len());
            let winner = guards.pop().unwrap();
            let on_disk = std::fs::read_to_string(&path).unwrap();
            assert!(on_disk.contains(winner.owner().uuid().unwrap()), "round {round}: winner's record replaced");
            winner.release().await.unwrap();
        }
    });
}

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
    nix::unistd::mkfifo(&locker.lock_path("f").unwrap(), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let err = locker.try_acquire("f").await.unwrap_err();
    assert!(
        matches!(err, Error::UnexpectedFile { found: "FIFO", .. }),
        "{err:?}"
    );
}
