//! The guard's life: renewal, loss, release, drop.

use std::time::{Duration, Instant};

use leasehold::{Error, LockGuard, Locker};

/// The waiting line's file, which leasehold keeps in a lock directory on
/// Windows once a waiter has stood in line there (docs/guarantees.md,
/// *Windows*): no leftover.
const LINE_FILE: &str = "leasehold..line";

fn quick(dir: &std::path::Path) -> Locker {
    Locker::builder()
        .directory(dir)
        .lease(Duration::from_millis(400))
        .renew_interval(Duration::from_millis(100))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_keeps_its_lock_for_five_leases() {
    let dir = tempfile::tempdir().unwrap();
    let holder = quick(dir.path());
    let rival = quick(dir.path());
    let guard = holder.acquire("long").await.unwrap();
    let first_expiry = rival
        .holder("long")
        .await
        .unwrap()
        .unwrap()
        .lease_expires_at()
        .unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(2000) {
        assert!(
            rival.try_acquire("long").await.unwrap().is_none(),
            "robbed after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert!(!guard.is_lost());
    let later_expiry = rival
        .holder("long")
        .await
        .unwrap()
        .unwrap()
        .lease_expires_at()
        .unwrap();
    assert!(later_expiry > first_expiry, "the lease was renewed on disk");
    guard.release().await.unwrap();
    assert!(rival.try_acquire("long").await.unwrap().is_some());
}

#[tokio::test]
async fn a_replaced_lock_is_lost_and_its_successor_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let locker = quick(dir.path());
    let guard = locker.acquire("job").await.unwrap();
    let path = locker.lock_path("job").unwrap();
    remove_behind_its_back(&path);
    let successor = r#"{"uuid":"successor","pid":1}"#;
    std::fs::write(&path, successor).unwrap();

    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost() resolves");
    assert!(guard.is_lost());
    let err = guard.release().await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), successor);

    let guard = locker.acquire_timeout("other", Duration::ZERO).await.unwrap();
    remove_behind_its_back(&locker.lock_path("other").unwrap());
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost() resolves");
    drop(guard);
}

/// Removes the lock file at `path` behind its holder's back, at once. On
/// Windows it is renamed aside first: Wine (like Windows without POSIX
/// delete semantics) keeps a deleted file's name until its last handle
/// closes, and the holder's is open.
fn remove_behind_its_back(path: &std::path::Path) {
    if cfg!(windows) {
        let aside = path.with_extension("removed");
        std::fs::rename(path, &aside).unwrap();
        std::fs::remove_file(&aside).unwrap();
    } else {
        std::fs::remove_file(path).unwrap();
    }
}

#[tokio::test]
async fn drop_frees_the_lock_before_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let a = Locker::new(dir.path()).unwrap();
    let b = Locker::new(dir.path()).unwrap();
    for _ in 0..50 {
        let g = a.acquire("job").await.unwrap();
        assert!(b.try_acquire("job").await.unwrap().is_none());
        drop(g);
        let g = b
            .try_acquire("job")
            .await
            .unwrap()
            .expect("free right after drop");
        drop(g);
    }
    assert_eq!(left_in(dir.path()), 0);
}

#[test]
fn drop_releases_after_the_runtime_has_shut_down() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (locker, guard) = rt.block_on(async {
        let locker = Locker::new(dir.path()).unwrap();
        let guard = locker.acquire("job").await.unwrap();
        (locker, guard)
    });
    drop(rt);
    let path = locker.lock_path("job").unwrap();
    assert!(path.exists());
    drop(guard);
    assert!(!path.exists());
}

#[tokio::test]
async fn invalid_names_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::new(dir.path()).unwrap();
    for name in ["", "nul\0inside"] {
        let invalid = |r: Result<(), Error>| matches!(r, Err(Error::InvalidName { .. }));
        assert!(invalid(locker.acquire(name).await.map(drop)));
        assert!(invalid(locker.try_acquire(name).await.map(drop)));
        assert!(invalid(
            locker.acquire_timeout(name, Duration::ZERO).await.map(drop)
        ));
        assert!(invalid(locker.holder(name).await.map(drop)));
        assert!(invalid(locker.is_held(name).await.map(drop)));
        assert!(invalid(locker.lock_path(name).map(drop)));
    }
    // Names that look like paths stay inside the directory.
    for name in [
        "../escape",
        "/etc/passwd",
        ".",
        "..",
        "a/../../b",
        &"x".repeat(leasehold::MAX_NAME_LEN),
    ] {
        let g = locker.try_acquire(name).await.unwrap().expect("free");
        assert_eq!(g.name(), name);
        let path = locker.lock_path(name).unwrap();
        assert_eq!(path.parent().unwrap(), locker.directory());
        assert!(path.exists());
    }
}

#[test]
fn public_futures_and_types_are_send() {
    fn send<T: Send>(_: &T) {}
    fn owned<T: Send + Sync + 'static>() {}
    owned::<Locker>();
    owned::<LockGuard>();
    owned::<Error>();
    owned::<leasehold::Owner>();
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::new(dir.path()).unwrap();
    send(&locker.acquire("x"));
    send(&locker.try_acquire("x"));
    send(&locker.acquire_timeout("x", Duration::ZERO));
    send(&locker.holder("x"));
    send(&locker.is_held("x"));
}

#[tokio::test]
async fn timeouts_report_the_name_and_the_wait() {
    let dir = tempfile::tempdir().unwrap();
    let a = Locker::new(dir.path()).unwrap();
    let b = Locker::new(dir.path()).unwrap();
    let _held = a
        .acquire_timeout("job", Duration::ZERO)
        .await
        .expect("free lock, zero timeout");
    let started = Instant::now();
    match b.acquire_timeout("job", Duration::from_millis(120)).await {
        Err(Error::Timeout { name, waited, .. }) => {
            assert_eq!(name, "job");
            assert!(waited >= Duration::from_millis(120));
        }
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn the_builder_rejects_settings_that_cannot_work() {
    let dir = tempfile::tempdir().unwrap();
    let bad = [
        Locker::builder().directory(dir.path()).lease(Duration::ZERO),
        Locker::builder()
            .directory(dir.path())
            .lease(Duration::from_secs(10))
            .renew_interval(Duration::from_secs(10)),
        Locker::builder()
            .directory(dir.path())
            .renew_interval(Duration::ZERO),
        Locker::builder()
            .directory(dir.path())
            .poll_interval(Duration::ZERO),
        Locker::builder().directory(dir.path()).lease(Duration::MAX),
    ];
    for b in bad {
        assert!(
            matches!(b.clone().build(), Err(Error::InvalidConfig { .. })),
            "{b:?}"
        );
    }
}

// Unix modes: Windows has access lists instead (the sys unit tests check
// its rule).
#[cfg(unix)]
#[tokio::test]
async fn directories_and_files_are_private_and_shared_ones_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("a/b");
    let locker = Locker::new(&nested).unwrap();
    let mode = std::fs::metadata(&nested).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    let _g = locker.acquire("job").await.unwrap();
    let mode = std::fs::metadata(locker.lock_path("job").unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(matches!(Locker::new(&open), Err(Error::InsecureDirectory { .. })));
    assert!(
        Locker::builder()
            .directory(&open)
            .allow_insecure_directory(true)
            .build()
            .is_ok()
    );
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    assert!(
        Locker::new(&open).is_ok(),
        "sticky world-writable directories such as /tmp are fine"
    );
}

#[test]
fn outside_a_tokio_runtime_acquire_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::new(dir.path()).unwrap();
    let err = futures_lite_block_on(locker.acquire("x")).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err:?}");
    // Also when another task of the same Locker holds the name, so the call
    // would queue with a deadline timer, and without durable records, so
    // taking the lock would need no blocking pool.
    let fast = Locker::builder()
        .directory(dir.path())
        .durable(false)
        .build()
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let held = rt.block_on(fast.acquire("y")).unwrap();
    for timeout in [None, Some(Duration::from_secs(1))] {
        let outcome = match timeout {
            None => futures_lite_block_on(fast.acquire("y")),
            Some(timeout) => futures_lite_block_on(fast.acquire_timeout("y", timeout)),
        };
        let err = outcome.unwrap_err();
        assert!(matches!(err, Error::Unsupported { .. }), "{err:?}");
    }
    assert!(matches!(
        futures_lite_block_on(fast.acquire("z")),
        Err(Error::Unsupported { .. })
    ));
    drop(held);
}

/// A minimal executor that is not Tokio.
fn futures_lite_block_on<F: std::future::Future>(fut: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(out) => return out,
            Poll::Pending => std::thread::park_timeout(Duration::from_millis(10)),
        }
    }
}

#[tokio::test]
async fn huge_durations_do_not_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::builder()
        .directory(dir.path())
        .poll_interval(Duration::MAX)
        .unreadable_grace(Duration::MAX)
        .build()
        .unwrap();
    let other = Locker::new(dir.path()).unwrap();
    let _held = other.acquire("x").await.unwrap();
    let err = locker
        .acquire_timeout("x", Duration::from_millis(30))
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    // A foreign record whose lease ends in the year 9999.
    std::fs::write(
        locker.lock_path("far").unwrap(),
        r#"{"uuid":"x","pid":1,"hostname":"elsewhere","leaseExpiresAt":"9999-12-31T23:59:59.999Z"}"#,
    )
    .unwrap();
    let err = locker
        .acquire_timeout("far", Duration::from_millis(30))
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    let waiting = tokio::time::timeout(
        Duration::from_millis(50),
        locker.acquire_timeout("far", Duration::MAX),
    );
    assert!(waiting.await.is_err(), "still waiting, without an overflow");
}

/// A creator's record is empty for a moment; a reclaimer that judges it
/// abandoned (here with a 1 ms grace period) must never leave two holders.
#[test]
fn creators_are_never_robbed_of_a_file_judged_abandoned() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU32::new(0));
    rt.block_on(async {
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let locker = Locker::builder()
                    .directory(dir.path())
                    .unreadable_grace(Duration::from_millis(1))
                    .durable(false)
                    .poll_interval(Duration::from_millis(1))
                    .build()
                    .unwrap();
                let (inside, overlaps) = (Arc::clone(&inside), Arc::clone(&overlaps));
                tokio::spawn(async move {
                    for _ in 0..150 {
                        let guard = locker.acquire("hot").await.unwrap();
                        if inside.swap(true, Ordering::SeqCst) {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        tokio::task::yield_now().await;
                        inside.store(false, Ordering::SeqCst);
                        drop(guard);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
}

/// Renewal does not depend on the runtime: a guard that outlives its
/// runtime keeps its lease.
#[test]
fn a_guard_keeps_its_lease_after_the_runtime_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let guard = rt
        .block_on(async {
            Locker::builder()
                .directory(dir.path())
                .lease(Duration::from_millis(300))
                .renew_interval(Duration::from_millis(50))
                .build()
                .unwrap()
                .acquire("kept")
                .await
        })
        .unwrap();
    drop(rt);
    std::thread::sleep(Duration::from_millis(1000));
    assert!(!guard.is_lost());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let rival = Locker::new(dir.path()).unwrap();
        assert!(
            rival.try_acquire("kept").await.unwrap().is_none(),
            "taken after 3 leases"
        );
    });
    drop(guard);
    rt.block_on(async {
        let rival = Locker::new(dir.path()).unwrap();
        assert!(rival.try_acquire("kept").await.unwrap().is_some());
    });
}

/// Releases that meet the directory lock held elsewhere wait side by side,
/// not one behind another, and all succeed once it is free.
// Locks the lock directory itself: Windows cannot (`LockFileEx` on a
// directory handle fails).
#[cfg(unix)]
#[test]
fn concurrent_drops_wait_for_the_directory_lock_together() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let locker = Locker::new(dir.path()).unwrap();
    let guards: Vec<LockGuard> = rt.block_on(async {
        let mut guards = Vec::new();
        for i in 0..4 {
            guards.push(locker.acquire(&format!("n{i}")).await.unwrap());
        }
        guards
    });
    let squatter = std::fs::File::open(dir.path()).unwrap();
    squatter.lock().unwrap();
    let started = Instant::now();
    let drops: Vec<_> = guards
        .into_iter()
        .map(|g| std::thread::spawn(move || drop(g)))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    squatter.unlock().unwrap();
    // From the unlock: however late a slow machine ran the sleep, the
    // drops, waiting side by side, all finish within moments of it.
    let unlocked = Instant::now();
    for d in drops {
        d.join().unwrap();
    }
    eprintln!(
        "drops done {:?} after the unlock ({:?} in all)",
        unlocked.elapsed(),
        started.elapsed()
    );
    assert!(
        unlocked.elapsed() < Duration::from_millis(250),
        "drops queued: done {:?} after the unlock",
        unlocked.elapsed()
    );
    assert_eq!(left_in(dir.path()), 0, "every lock was removed");
}

/// Where syncing cannot block (a tmpfs lock directory), even a durable
/// uncontended acquisition is made on the runtime's own thread: it still
/// succeeds while the blocking pool is busy. On a disk it goes to the
/// pool, so the same setup would wait for the pool thread.
#[cfg(target_os = "linux")]
#[test]
fn a_durable_lock_on_tmpfs_needs_no_blocking_thread() {
    let shm = std::path::Path::new("/dev/shm");
    let on_tmpfs =
        nix::sys::statfs::statfs(shm).is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
    assert!(on_tmpfs, "this test needs /dev/shm on tmpfs (Linux)");
    let dir = tempfile::tempdir_in(shm).unwrap();
    with_pool_taken(async || {
        let locker = Locker::builder()
            .directory(dir.path())
            .durable(true)
            .build()
            .unwrap();
        let guard = tokio::time::timeout(Duration::from_secs(10), locker.acquire("shm"))
            .await
            .expect("acquired without the blocking pool")
            .unwrap();
        // (Asking the Locker would take the pool: look at the disk.)
        assert!(locker.lock_path("shm").unwrap().exists());
        drop(guard);
        assert!(!locker.lock_path("shm").unwrap().exists());
    });
}

/// A shared lock, a join of the group another `Locker` holds, a permit,
/// and (where the watcher sees holders' deaths) a full semaphore's "busy"
/// are each one attempt under the name's mutation lock when that is free,
/// made on the runtime's own thread: each comes while the blocking pool's
/// only thread is taken (they used to wait for it).
#[test]
fn shared_locks_and_permits_need_no_blocking_thread() {
    let dir = tempfile::tempdir().unwrap();
    with_pool_taken(async || {
        let build = || {
            Locker::builder()
                .directory(dir.path())
                .durable(false)
                .build()
                .unwrap()
        };
        let (a, b) = (build(), build());
        let within = Duration::from_secs(10);
        let pool = "the blocking pool was needed";
        let first = tokio::time::timeout(within, a.acquire_shared("s"))
            .await
            .expect(pool)
            .unwrap();
        let joined = tokio::time::timeout(within, b.acquire_shared("s"))
            .await
            .expect(pool)
            .unwrap();
        assert!(a.lock_path("s").unwrap().exists());
        drop(first);
        assert!(
            a.lock_path("s").unwrap().exists(),
            "the group stands while one holds"
        );
        drop(joined);
        assert!(!a.lock_path("s").unwrap().exists());
        let (one, two) = (a.semaphore("p", 1).unwrap(), b.semaphore("p", 1).unwrap());
        let permit = tokio::time::timeout(within, one.acquire())
            .await
            .expect(pool)
            .unwrap();
        #[cfg(unix)]
        {
            let busy = tokio::time::timeout(within, two.try_acquire()).await.expect(pool);
            assert!(busy.unwrap().is_none(), "the only permit is taken");
        }
        drop(permit);
        let again = tokio::time::timeout(within, two.try_acquire()).await.expect(pool);
        let again = again.unwrap().expect("the permit was given back");
        drop(again);
        assert_eq!(left_in(dir.path()), 0, "every lock was removed");
    });
}

/// Runs `body` on a current-thread runtime whose only blocking thread is
/// taken all along: what `body` awaits must come without the blocking
/// pool (or time out).
fn with_pool_taken(body: impl AsyncFnOnce()) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(1)
        .build()
        .unwrap();
    let (release_pool, pool_released) = std::sync::mpsc::channel::<()>();
    rt.block_on(async {
        // Occupy the only blocking thread.
        let occupied = tokio::task::spawn_blocking(move || pool_released.recv());
        body().await;
        release_pool.send(()).unwrap();
        occupied.await.unwrap().unwrap();
    });
}

/// The entries left in `dir`, but the waiting line's file, which leasehold
/// keeps in a lock directory on Windows (docs/guarantees.md, *Windows*).
fn left_in(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name() != LINE_FILE)
        .count()
}
