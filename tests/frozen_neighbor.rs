//! Nobody else's pause can cost a holder its lock (issue 28, items 1–3):
//! a process frozen while it holds a lock of the directory, or of another
//! name's or this name's files, never makes a running holder lose its lock,
//! never blocks its renewal, and never blocks a guard's drop.
//!
//! A frozen process is played by a `flock` this test takes and keeps, as a
//! process stopped (SIGSTOP, Ctrl-Z, a debugger) at that instant would:
//! on the lock directory itself (what anyone who can read it can do, and
//! what leasehold's own processes did before locks were per name), and on
//! a name's mutation-lock file (a leasehold process frozen while it
//! reclaims, joins, leaves or fences that name).

mod common;

use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant};

use common::ChildProc;
use leasehold::{LockGuard, Locker, Strategy};

#[test]
fn child_process_entry() {
    common::child_entry();
}

const LEASE: Duration = Duration::from_millis(400);
/// Ten leases: long enough that every renewal of the holder runs while
/// its neighbour is frozen.
const HOLD: Duration = Duration::from_millis(4000);

fn locker(dir: &Path, strategy: Strategy, fencing: bool) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .lease(LEASE)
        .renew_interval(LEASE / 4)
        .fencing(fencing)
        .build()
        .unwrap()
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Exclusive,
    Shared,
    Permit,
}

async fn take(locker: &Locker, kind: Kind, name: &str) -> LockGuard {
    let taking = async {
        match kind {
            Kind::Exclusive => locker.acquire(name).await,
            Kind::Shared => locker.acquire_shared(name).await,
            Kind::Permit => locker.semaphore(name, 2).unwrap().acquire().await,
        }
    };
    tokio::time::timeout(Duration::from_secs(10), taking)
        .await
        .expect("acquired within 10 s")
        .unwrap()
}

/// Holds `name` for ten leases while `frozen` stays locked, then drops the
/// guard on this (current-thread) runtime's only thread: the lock must
/// have been kept throughout, and the drop must return at once.
async fn hold_beside(locker: &Locker, kind: Kind, name: &str, what: &str) {
    let guard = take(locker, kind, name).await;
    let deadline = Instant::now() + HOLD;
    while Instant::now() < deadline {
        tokio::time::sleep(LEASE / 8).await;
        assert!(
            !guard.is_lost(),
            "{kind:?} {name}: lost its lock beside {what} after {:?}",
            HOLD - deadline.saturating_duration_since(Instant::now())
        );
    }
    let dropped = Instant::now();
    drop(guard);
    assert!(
        dropped.elapsed() < Duration::from_millis(100),
        "{kind:?} {name}: dropping the guard beside {what} blocked the runtime for {:?}",
        dropped.elapsed()
    );
}

/// A `flock` kept on `path`, as by a process frozen while holding it.
fn frozen_flock(path: &Path) -> File {
    let file = File::options()
        .read(true)
        .write(!path.is_dir())
        .create(!path.is_dir())
        .truncate(false)
        .open(path)
        .unwrap();
    file.lock().unwrap();
    file
}

fn strategies() -> [(Strategy, bool); 3] {
    [
        (Strategy::ExclusiveFile, false),
        (Strategy::ExclusiveFile, true),
        (Strategy::Directory, false),
    ]
}

/// `flock DIR sleep 60` (read access to the directory is enough) used to
/// make every holder in it lose every lock at its next renewal.
#[tokio::test(flavor = "current_thread")]
async fn a_flock_held_on_the_directory_costs_no_holder_its_lock() {
    for (strategy, fencing) in strategies() {
        let dir = tempfile::tempdir().unwrap();
        let locker = locker(dir.path(), strategy, fencing);
        // Made before the freeze: a Locker of its own is built meanwhile.
        let frozen = frozen_flock(dir.path());
        for kind in [Kind::Exclusive, Kind::Shared, Kind::Permit] {
            hold_beside(&locker, kind, "job", "a flock on the directory").await;
        }
        // Nothing waits for the directory's flock any more: the locks went
        // with their guards.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| !n.to_string_lossy().ends_with(".fence"))
            .collect();
        assert!(left.is_empty(), "{strategy:?}: left behind {left:?}");
        drop(frozen);
    }
}

/// A process frozen while it changes one name (reclaiming, joining,
/// leaving or fencing it) holds that name's mutation lock: the holders of
/// every other name renew, release and acquire as if it were not there.
#[tokio::test(flavor = "current_thread")]
async fn a_process_frozen_on_one_name_holds_up_no_other_name() {
    for (strategy, fencing) in strategies() {
        let dir = tempfile::tempdir().unwrap();
        let locker = locker(dir.path(), strategy, fencing);
        let other = locker.lock_path("other").unwrap();
        let frozen = frozen_flock(&mutex_of(&other));
        for kind in [Kind::Exclusive, Kind::Shared, Kind::Permit] {
            hold_beside(&locker, kind, "job", "a frozen change of another name").await;
            // And a quick take and release of `job` is not slowed down.
            let started = Instant::now();
            for _ in 0..20 {
                drop(take(&locker, kind, "job").await);
            }
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{kind:?}: 20 acquisitions took {:?}",
                started.elapsed()
            );
        }
        drop(frozen);
    }
}

fn mutex_of(lock_path: &Path) -> std::path::PathBuf {
    let mut name = lock_path.file_name().unwrap().to_owned();
    name.push(".mutex");
    lock_path.with_file_name(name)
}

/// A process frozen while changing the very name we hold (a reclaimer
/// judging it, a joiner, a leaver) costs us neither the lock nor a
/// blocked drop: the release finishes on leasehold's own thread as soon
/// as that process lets go, and `release().await` neither fails nor
/// blocks. (Taking the name again must wait for it: that process is in
/// the middle of changing it.)
#[tokio::test(flavor = "current_thread")]
async fn a_process_frozen_on_our_own_name_neither_robs_nor_blocks_us() {
    for (strategy, fencing) in strategies() {
        for kind in [Kind::Exclusive, Kind::Shared, Kind::Permit] {
            for explicit in [false, true] {
                let dir = tempfile::tempdir().unwrap();
                let locker = locker(dir.path(), strategy, fencing);
                let path = locker.lock_path("job").unwrap();
                let what = format!("{strategy:?} fencing {fencing} {kind:?} release() {explicit}");
                let guard = take(&locker, kind, "job").await;
                let frozen = frozen_flock(&mutex_of(&path));
                // Ten leases once per kind and layout; the explicit release
                // after two.
                let deadline = Instant::now() + if explicit { HOLD / 5 } else { HOLD };
                while Instant::now() < deadline {
                    tokio::time::sleep(LEASE / 8).await;
                    assert!(
                        !guard.is_lost(),
                        "{what}: lost its lock beside a frozen change of it"
                    );
                }
                let released = Instant::now();
                if explicit {
                    let result = tokio::time::timeout(Duration::from_secs(5), guard.release())
                        .await
                        .expect("release() returns");
                    assert!(result.is_ok(), "{what}: {result:?}");
                    assert!(released.elapsed() < Duration::from_secs(2), "{what}");
                } else {
                    drop(guard);
                    assert!(
                        released.elapsed() < Duration::from_millis(100),
                        "{what}: the drop blocked the runtime for {:?}",
                        released.elapsed()
                    );
                }
                // Still on disk: the frozen process keeps it from being
                // removed, no more.
                assert!(path.exists(), "{what}");
                drop(frozen);
                // The frozen process goes: the deferred release finishes.
                let gone = Instant::now();
                while path.exists() && gone.elapsed() < Duration::from_secs(5) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                assert!(!path.exists(), "{what}: never removed");
                let taken = tokio::time::timeout(Duration::from_secs(5), locker.try_acquire("job"))
                    .await
                    .unwrap()
                    .unwrap();
                assert!(taken.is_some(), "{what}: free again");
            }
        }
    }
}

/// A user who can only read (list and search) the lock directory, and
/// grabs every lock that access allows (the directory's `flock`, a `flock`
/// and read locks on every entry it can open, every byte of the waiting
/// line), makes nobody lose a lock or wait: holders of every kind keep
/// theirs for ten leases and another `Locker`'s acquisitions and releases
/// stay quick. As root, the child drops to `nobody`; otherwise it runs as
/// this user (who could do more, and must still not matter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_access_to_the_directory_grants_no_power_over_holders() {
    use std::os::unix::fs::PermissionsExt;
    let root = nix::unistd::geteuid().is_root();
    for (strategy, fencing) in strategies() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("locks");
        std::fs::create_dir(&dir).unwrap();
        // Readable and searchable by everyone, writable by its owner only.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (locker, other) = (locker(&dir, strategy, fencing), locker(&dir, strategy, fencing));
        let d = dir.to_str().unwrap();
        let reader = ChildProc::spawn("reader", &[d, if root { "65534" } else { "" }]);
        reader.expect("reading as uid", Duration::from_secs(20));
        for kind in [Kind::Exclusive, Kind::Shared, Kind::Permit] {
            let name = format!("job-{kind:?}");
            let guard = take(&locker, kind, &name).await;
            let deadline = Instant::now() + HOLD;
            let mut turns = 0;
            while Instant::now() < deadline {
                // Another Locker takes and lets go of another name meanwhile.
                let started = Instant::now();
                drop(take(&other, kind, &format!("other-{kind:?}")).await);
                assert!(
                    started.elapsed() < Duration::from_secs(2),
                    "{strategy:?} {kind:?}: an acquisition beside the reader took {:?}",
                    started.elapsed()
                );
                turns += 1;
                assert!(!guard.is_lost(), "{strategy:?} {kind:?}: lost beside a reader");
                tokio::time::sleep(LEASE / 8).await;
            }
            assert!(turns > 10, "{strategy:?} {kind:?}");
            let dropped = Instant::now();
            drop(guard);
            assert!(dropped.elapsed() < Duration::from_millis(100));
            // And the name is free again at once.
            let started = Instant::now();
            drop(take(&other, kind, &name).await);
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{strategy:?} {kind:?}"
            );
        }
        drop(reader);
    }
}
