//! What leasehold needs from the caller's runtime: a stalled runtime costs
//! no lease, and a runtime without a time driver still waits.

use std::path::Path;
use std::time::{Duration, Instant};

use leasehold::{Error, Locker, Strategy};

fn locker(dir: &Path, strategy: Strategy, fencing: bool) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .lease(Duration::from_secs(1))
        .renew_interval(Duration::from_millis(300))
        .fencing(fencing)
        .durable(true)
        .build()
        .unwrap()
}

/// A directory on a real disk, so that durable records are synced on the
/// blocking pool (on tmpfs they may be written inline).
fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// The lease starts when the record is written. If the runtime's only
/// worker is blocked right after the attempt (a blocking call on the
/// worker, a saturated runtime), renewal must already be running: the
/// holder keeps its lock, and no other `Locker` gets in.
fn stalled_right_after_the_attempt(strategy: Strategy, fencing: bool) {
    let dir = disk_dir();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let holder = locker(dir.path(), strategy, fencing);
        let rival = locker(dir.path(), strategy, fencing);
        let path = holder.lock_path("stall").unwrap();
        // Blocks the only worker for 600 ms (of a 1 s lease) the moment
        // the lock appears on disk, while the attempt finishes on the
        // blocking pool.
        let stall = tokio::spawn(async move {
            let started = Instant::now();
            while !path.exists() && started.elapsed() < Duration::from_secs(10) {
                tokio::task::yield_now().await;
            }
            std::thread::sleep(Duration::from_millis(600));
        });
        let guard = holder.acquire("stall").await.unwrap();
        stall.await.unwrap();
        let what = format!("{strategy:?}, fencing {fencing}");
        let held = Instant::now();
        while held.elapsed() < Duration::from_secs(3) {
            assert!(
                !guard.is_lost(),
                "{what}: lost {:?} after the stall",
                held.elapsed()
            );
            assert!(
                rival.try_acquire("stall").await.unwrap().is_none(),
                "{what}: a rival took the lock {:?} after the stall",
                held.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        guard.release().await.unwrap();
    });
}

#[test]
fn a_runtime_stalled_right_after_the_attempt_costs_no_lease_file() {
    stalled_right_after_the_attempt(Strategy::ExclusiveFile, false);
    stalled_right_after_the_attempt(Strategy::ExclusiveFile, true);
}

// The directory layout, which Windows refuses.
#[cfg(unix)]
#[test]
fn a_runtime_stalled_right_after_the_attempt_costs_no_lease_directory() {
    stalled_right_after_the_attempt(Strategy::Directory, false);
    stalled_right_after_the_attempt(Strategy::Directory, true);
}

/// An acquisition whose future is dropped while its attempt runs leaves no
/// lock behind, now that the attempt arms renewal itself.
#[test]
fn a_dropped_acquisition_leaves_no_lock_even_with_renewal_armed() {
    let dir = disk_dir();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let holder = locker(dir.path(), Strategy::ExclusiveFile, true);
        let path = holder.lock_path("dropped").unwrap();
        for _ in 0..20 {
            let attempt = holder.acquire("dropped");
            // Dropped as soon as it has started (it is on the blocking pool).
            let _ = tokio::time::timeout(Duration::from_micros(50), attempt).await;
        }
        // An orphaned lock would be renewed forever and never come free.
        let guard = holder
            .acquire_timeout("dropped", Duration::from_secs(5))
            .await
            .expect("no orphaned lock");
        guard.release().await.unwrap();
        assert!(!path.exists());
        assert!(rival_free(&holder).await);
    });
}

async fn rival_free(locker: &Locker) -> bool {
    let rival = Locker::new(locker.directory()).unwrap();
    rival.try_acquire("dropped").await.unwrap().is_some()
}

/// A runtime built without `enable_time`: contended acquisitions wait and
/// time out on leasehold's own timer instead of panicking in Tokio's.
#[test]
fn a_runtime_without_a_time_driver_waits_and_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let holder = locker(dir.path(), Strategy::ExclusiveFile, false);
    let waiter = locker(dir.path(), Strategy::ExclusiveFile, false);
    let guard = runtime.block_on(holder.acquire("job")).unwrap();
    runtime.block_on(async {
        // Contended on disk.
        let started = Instant::now();
        match waiter.acquire_timeout("job", Duration::from_millis(200)).await {
            Err(Error::Timeout { .. }) => {}
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert!(started.elapsed() >= Duration::from_millis(200));
        // Queued behind a task of the same Locker that is waiting on disk.
        let head = waiter.acquire_timeout("job", Duration::from_millis(400));
        let queued = waiter.acquire_timeout("job", Duration::from_millis(100));
        let (head, queued) = tokio::join!(head, queued);
        assert!(head.unwrap_err().is_timeout());
        assert!(queued.unwrap_err().is_timeout());
    });
    // A plain `acquire` waits until the holder lets go from another thread.
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(guard);
    });
    let got = runtime.block_on(async { waiter.acquire("job").await });
    drop(got.unwrap());
    releaser.join().unwrap();
}

/// Under Tokio's paused test clock, leasehold's waits take part in its
/// auto-advance like the test's own timers: a generous `tokio::time::timeout`
/// around a waiting `acquire` does not fire before the holder, released by
/// a task sleeping on the same clock, lets go.
#[tokio::test(start_paused = true)]
async fn waits_follow_tokios_paused_clock() {
    let dir = tempfile::tempdir().unwrap();
    let holder = Locker::new(dir.path()).unwrap();
    // Wine keeps the descriptor of every handle this process closes on a
    // file it still holds a lock on (a Unix lock belongs to the process,
    // and closing any descriptor would drop it), so the 12,000 looks of a
    // 50 ms poll over the 600 s below exhaust them there; Windows has no
    // such limit. A 1 s poll looks 600 times.
    let waiter = Locker::builder()
        .directory(dir.path())
        .poll_interval(if cfg!(windows) {
            Duration::from_secs(1)
        } else {
            Duration::from_millis(50)
        })
        .build()
        .unwrap();
    let guard = holder.acquire("job").await.unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(guard);
    });
    let got = tokio::time::timeout(Duration::from_secs(3600), waiter.acquire("job")).await;
    assert!(got.is_ok(), "the one-hour timeout fired first");
    release.await.unwrap();
    // And a bounded wait times out on the paused clock, without waiting
    // for it in real time.
    let _held = holder.acquire("other").await.unwrap();
    let real = Instant::now();
    let timed_out = waiter.acquire_timeout("other", Duration::from_secs(600)).await;
    assert!(timed_out.as_ref().is_err_and(Error::is_timeout), "{timed_out:?}");
    assert!(real.elapsed() < Duration::from_secs(60), "{:?}", real.elapsed());
}

#[test]
fn child_process_entry() {
    #[cfg(unix)]
    if std::env::var_os(FORK_CHILD).is_some() {
        fork_child();
    }
}

#[cfg(unix)]
const FORK_CHILD: &str = "LEASEHOLD_TEST_FORK_CHILD";

/// A contended 100 ms `acquire_timeout` in a fresh runtime and `Locker`.
#[cfg(unix)]
fn contended_timeout(dir: &Path) -> Duration {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let holder = Locker::new(dir).unwrap();
    let waiter = Locker::builder()
        .directory(dir)
        .poll_interval(Duration::from_secs(30))
        .build()
        .unwrap();
    runtime.block_on(async {
        let _held = holder.acquire("x").await.unwrap();
        let started = Instant::now();
        let waited = waiter.acquire_timeout("x", Duration::from_millis(100)).await;
        assert!(waited.unwrap_err().is_timeout());
        started.elapsed()
    })
}

/// A process that waited through leasehold once, then forked (a pre-fork
/// server building its runtimes after the fork): in the child, waits still
/// end. The child inherits the timer's state but not its thread. (Windows
/// has no fork.)
#[cfg(unix)]
fn fork_child() {
    let dir = tempfile::tempdir().unwrap();
    assert!(contended_timeout(dir.path()) < Duration::from_secs(2));
    // SAFETY: this process is a child of the test binary running this one
    // function; after the fork the child starts threads of its own only.
    let forked = unsafe { nix::unistd::fork() }.unwrap();
    match forked {
        nix::unistd::ForkResult::Child => {
            let (tx, rx) = std::sync::mpsc::channel();
            let d = dir.path().to_owned();
            std::thread::spawn(move || {
                let _ = tx.send(contended_timeout(&d));
            });
            let code = match rx.recv_timeout(Duration::from_secs(5)) {
                Ok(took) if took < Duration::from_secs(2) => 0,
                Ok(_) => 2,
                Err(_) => 3,
            };
            std::process::exit(code);
        }
        nix::unistd::ForkResult::Parent { child } => {
            let status = nix::sys::wait::waitpid(child, None).unwrap();
            let code = match status {
                nix::sys::wait::WaitStatus::Exited(_, 0) => 0,
                _ => 1,
            };
            std::process::exit(code);
        }
    }
}

// Windows has no fork.
#[cfg(unix)]
#[test]
fn a_forked_child_still_times_out() {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_entry",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(FORK_CHILD, "1")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the forking child did not finish");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        status.success(),
        "in a forked child, a 100 ms wait did not end: {status}"
    );
}

/// Runs `f` on a thread of its own; `None` if it had not finished after
/// `limit` of real time (the thread is left behind).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

/// Tokio's clock paused, advanced an hour and resumed, so it runs an hour
/// ahead of the monotonic clock; or paused while real time passed and
/// resumed, so it lags: a short timeout still ends on time, and a waiter
/// does not spin on the disk.
#[test]
fn waits_keep_time_after_tokios_clock_is_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    let ahead = within(Duration::from_secs(20), move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let holder = locker(&path, Strategy::ExclusiveFile, false);
            let rival = locker(&path, Strategy::ExclusiveFile, false);
            let _held = holder.acquire("x").await.unwrap();
            tokio::time::pause();
            tokio::time::advance(Duration::from_secs(3600)).await;
            tokio::time::resume();
            let started = Instant::now();
            let waited = rival.acquire_timeout("x", Duration::from_millis(300)).await;
            (waited.unwrap_err().is_timeout(), started.elapsed())
        })
    });
    let (timed_out, took) = ahead.expect("a 300 ms timeout was still waiting after 20 s");
    assert!(timed_out && took < Duration::from_secs(5), "{took:?}");

    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let attempts = runtime.block_on(async {
        let holder = locker(dir.path(), Strategy::ExclusiveFile, false);
        let rival = locker(dir.path(), Strategy::ExclusiveFile, false);
        let _held = holder.acquire("x").await.unwrap();
        tokio::time::pause();
        std::thread::sleep(Duration::from_secs(2));
        tokio::time::resume();
        let before = rival.stats().fs_attempts;
        let waited = rival.acquire_timeout("x", Duration::from_secs(2)).await;
        assert!(waited.unwrap_err().is_timeout());
        rival.stats().fs_attempts - before
    });
    assert!(attempts < 50, "{attempts} disk attempts in a 2 s wait");
}

/// A paused clock on a runtime without a time driver (`start_paused`
/// without `enable_time`): waits neither panic nor hang.
#[test]
fn a_paused_clock_without_a_time_driver_still_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    let outcome = within(Duration::from_secs(20), move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async move {
            let holder = locker(&path, Strategy::ExclusiveFile, false);
            let rival = locker(&path, Strategy::ExclusiveFile, false);
            let _held = holder.acquire("x").await.unwrap();
            rival
                .acquire_timeout("x", Duration::from_millis(300))
                .await
                .map(drop)
        })
    });
    let result = outcome.expect("still waiting after 20 s (or the thread panicked)");
    assert!(matches!(result, Err(Error::Timeout { .. })), "{result:?}");
}
