//! A process frozen while it changes a shared name (it holds that name's
//! mutation lock: SIGSTOP, Ctrl-Z, a debugger, in the few syscalls it is
//! held) delays no join and no leave of a group that stands (issue 28,
//! item 2): joiners join without the lock, leavers leave without it, and
//! a semaphore never has more holders than permits meanwhile.
//!
//! The frozen process is played by a `flock` this test keeps on the
//! name's mutation-lock file, as in tests/frozen_neighbor.rs; the races
//! with a group's end (the seal) by child processes stopped at
//! failpoints, with the feature `failpoints`.
// SIGSTOP and /proc: Linux only.
#![cfg(target_os = "linux")]

#[path = "support/common.rs"]
mod common;

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{frozen_flock, mutex_of};
use leasehold::{LockGuard, Locker, Strategy};

#[test]
fn child_process_entry() {
    common::child_entry_with(|role, args| async move { roles::run(&role, &args).await });
}

const LEASE: Duration = Duration::from_millis(600);
/// What a join or a leave may take beside a frozen change: it waits for
/// nothing of the frozen process, so this bound is only the machine's.
const QUICK: Duration = Duration::from_millis(1500);

fn locker(dir: &Path, strategy: Strategy) -> Locker {
    fenced(dir, strategy, false)
}

fn fenced(dir: &Path, strategy: Strategy, fencing: bool) -> Locker {
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
    Shared,
    Permit(u32),
}

async fn try_take(locker: &Locker, kind: Kind, name: &str) -> Option<LockGuard> {
    match kind {
        Kind::Shared => locker.try_acquire_shared(name).await.unwrap(),
        Kind::Permit(n) => locker.semaphore(name, n).unwrap().try_acquire().await.unwrap(),
    }
}

/// Takes `name` as `kind` within [`QUICK`], however long it has to try.
async fn take_quickly(locker: &Locker, kind: Kind, name: &str, what: &str) -> LockGuard {
    let started = Instant::now();
    let taking = async {
        match kind {
            Kind::Shared => locker.acquire_shared(name).await,
            Kind::Permit(n) => locker.semaphore(name, n).unwrap().acquire().await,
        }
    };
    let guard = tokio::time::timeout(Duration::from_secs(10), taking)
        .await
        .unwrap_or_else(|_| panic!("{what}: not joined within 10 s beside a frozen change of the name"))
        .unwrap();
    assert!(
        started.elapsed() < QUICK,
        "{what}: joining took {:?} beside a frozen change of the name",
        started.elapsed()
    );
    guard
}

/// Member records (`m-*.json`) in the members directory of `lock_path`.
fn member_records(lock_path: &Path) -> usize {
    let mut name = lock_path.file_name().unwrap().to_owned();
    name.push(".members");
    std::fs::read_dir(lock_path.with_file_name(name))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| {
                    let n = e.file_name();
                    let n = n.to_string_lossy();
                    n.starts_with("m-") && n.ends_with(".json")
                })
                .count()
        })
        .unwrap_or(0)
}

/// While another process is frozen in the middle of changing the name
/// (its mutation lock held throughout), a group that stands goes on: new
/// holders join at once, holders leave at once (`release()` and a drop
/// both), a freed permit is taken again at once, a full semaphore stays
/// full, and the holder that stays never loses its lock. Once the frozen
/// process lets go, the last leaver ends the group and the name is free.
/// Shared holders with fencing too: their token is the counter as it
/// stands, read without the lock. (A semaphore permit's token advances
/// the counter, which needs the lock: fenced permits wait for it, as
/// docs/guarantees.md says.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_change_of_a_held_name_delays_no_join_and_no_leave() {
    for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
        for (kind, fencing) in [
            (Kind::Shared, false),
            (Kind::Permit(3), false),
            (Kind::Shared, true),
        ] {
            let what = format!("{strategy:?} {kind:?} fencing {fencing}");
            let dir = tempfile::tempdir().unwrap();
            let lockers: Vec<Locker> = (0..4).map(|_| fenced(dir.path(), strategy, fencing)).collect();
            let path = lockers[0].lock_path("job").unwrap();
            let first = take_quickly(&lockers[0], kind, "job", &what).await;
            let frozen = frozen_flock(&mutex_of(&path));

            let second = take_quickly(&lockers[1], kind, "job", &what).await;
            let third = take_quickly(&lockers[2], kind, "job", &what).await;
            if fencing {
                // The counter as it stands (missing here: the highest token
                // anyone could have been handed, which grows with the clock).
                assert!(second.fencing_token().is_some(), "{what}");
                assert!(second.fencing_token() >= first.fencing_token(), "{what}");
                assert!(third.fencing_token() >= second.fencing_token(), "{what}");
            }
            assert_eq!(member_records(&path), 3, "{what}");
            if let Kind::Permit(_) = kind {
                assert!(
                    try_take(&lockers[3], kind, "job").await.is_none(),
                    "{what}: a fourth permit of three"
                );
            }

            // A leave by release(): at once, its record gone.
            let leaving = Instant::now();
            tokio::time::timeout(Duration::from_secs(5), second.release())
                .await
                .expect("release() returns")
                .unwrap_or_else(|e| panic!("{what}: release() beside a frozen change: {e}"));
            assert!(
                leaving.elapsed() < QUICK,
                "{what}: release() took {:?}",
                leaving.elapsed()
            );
            assert_eq!(member_records(&path), 2, "{what}: the released record stays");

            // The freed permit (or another share) is taken at once.
            let fourth = take_quickly(&lockers[3], kind, "job", &what).await;

            // A leave by drop: its record gone at once too.
            drop(third);
            let dropped = Instant::now();
            while member_records(&path) > 2 && dropped.elapsed() < QUICK {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(
                member_records(&path),
                2,
                "{what}: the dropped guard's record stays"
            );

            // Ten leases beside the frozen change: nobody lost anything.
            tokio::time::sleep(LEASE * 3).await;
            assert!(!first.is_lost(), "{what}: the first holder lost its lock");
            assert!(!fourth.is_lost(), "{what}: the last joiner lost its lock");
            assert!(
                lockers[1].try_acquire("job").await.unwrap().is_none(),
                "{what}: the name taken exclusively while shared holders hold it"
            );

            // The frozen process lets go: the last leaver ends the group.
            drop(frozen);
            drop(first);
            drop(fourth);
            let gone = Instant::now();
            while path.exists() && gone.elapsed() < Duration::from_secs(5) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(!path.exists(), "{what}: the group never ended");
            let exclusive = lockers[1].try_acquire("job").await.unwrap();
            assert!(
                exclusive.is_some(),
                "{what}: the name is not free after the group ended"
            );
        }
    }
}

/// Joiners that find the mutation lock taken count themselves after
/// their records are in place: however many race for a semaphore's
/// permits, never more hold than it has, and they do get them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_without_the_mutation_lock_never_exceed_a_semaphores_permits() {
    for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
        let dir = tempfile::tempdir().unwrap();
        let anchor_locker = locker(dir.path(), strategy);
        let path = anchor_locker.lock_path("pool").unwrap();
        // One permit is held throughout, so the group stands.
        let anchor = take_quickly(&anchor_locker, Kind::Permit(3), "pool", "anchor").await;
        let frozen = frozen_flock(&mutex_of(&path));
        let holding = Arc::new(AtomicUsize::new(1));
        let most = Arc::new(AtomicUsize::new(1));
        let taken = Arc::new(AtomicUsize::new(0));
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut tasks = Vec::new();
        for _ in 0..6 {
            let locker = locker(dir.path(), strategy);
            let (holding, most, taken) = (Arc::clone(&holding), Arc::clone(&most), Arc::clone(&taken));
            tasks.push(tokio::spawn(async move {
                while Instant::now() < deadline {
                    let Some(guard) = try_take(&locker, Kind::Permit(3), "pool").await else {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    };
                    let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    taken.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    holding.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let most = most.load(Ordering::SeqCst);
        let taken = taken.load(Ordering::SeqCst);
        assert!(
            most <= 3,
            "{strategy:?}: {most} holders of a three-permit semaphore"
        );
        assert!(
            taken >= 20,
            "{strategy:?}: only {taken} permits taken in 3 s beside a frozen change"
        );
        assert!(!anchor.is_lost(), "{strategy:?}");
        drop(frozen);
        drop(anchor);
    }
}

/// A marker file can read torn while another member rewrites it in place
/// without the mutation lock (a leaver signing it for the holder renewed
/// last). A member's renewal that reads it so must not take it for
/// another group's and report its lock lost: it knows the marker by the
/// node it joined, and signs it whole again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_read_torn_costs_no_member_its_lock() {
    use std::os::unix::fs::FileExt;
    for kind in [Kind::Shared, Kind::Permit(2)] {
        let dir = tempfile::tempdir().unwrap();
        let locker = locker(dir.path(), Strategy::ExclusiveFile);
        let path = locker.lock_path("job").unwrap();
        let guard = take_quickly(&locker, kind, "job", "torn").await;
        // Torn as a reader can see a rewrite in place half done: what
        // reads as no record at all.
        let file = File::options().write(true).open(&path).unwrap();
        file.write_all_at(b"@@ torn @@", 0).unwrap();
        drop(file);
        tokio::time::sleep(LEASE * 3).await;
        assert!(
            !guard.is_lost(),
            "{kind:?}: a torn read of our marker cost us the lock"
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            serde_json::from_str::<serde_json::Value>(text.trim()).is_ok(),
            "{kind:?}: the marker was never signed whole again: {text:?}"
        );
        guard.release().await.unwrap();
        assert!(!path.exists(), "{kind:?}");
    }
}

#[cfg(feature = "failpoints")]
mod seal {
    //! The group's end against a joiner that does not take the mutation
    //! lock: either the last leaver counts the joiner (its record in place
    //! before the joiner's look for the seal), or the joiner sees the seal
    //! and withdraws. Never a joiner holding a name whose marker is gone.

    use super::*;
    use common::ChildProc;
    use nix::sys::signal::Signal;

    fn stopped(child: &ChildProc) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", child.pid()))
            .ok()
            .and_then(|s| {
                s.rsplit(')')
                    .next()
                    .map(|rest| rest.trim_start().starts_with('T'))
            })
            .unwrap_or(false)
    }

    fn until_stopped(child: &ChildProc, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !stopped(child) {
            assert!(
                Instant::now() < deadline,
                "{what}: the child never stopped at its failpoint"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn strategy_arg(strategy: Strategy) -> &'static str {
        match strategy {
            Strategy::Directory => "directory",
            _ => "file",
        }
    }

    /// How a joiner that does not take the mutation lock meets the last
    /// leaver's end of the group. The joiner first stops after its look at
    /// the group (a live holder), before its record is made; the holder
    /// then leaves, last as far as it can count, and stops holding the
    /// mutation lock:
    ///
    /// - before its seal: the joiner goes on and joins (no seal yet); the
    ///   leaver's sealed count finds it, and the marker stays;
    /// - before its seal, and the joiner stops again with its record in
    ///   place, before its checks: the sealed count finds it all the same;
    /// - after its seal and count, before it removes the marker: the
    ///   joiner's check finds the seal, it withdraws, and it joins the
    ///   next group once the leaver is done.
    ///
    /// Whichever it is, an exclusive acquisition fails while the joiner
    /// holds, and the name is free once it leaves.
    #[test]
    fn a_joiner_is_counted_by_the_last_leaver_or_sees_its_seal() {
        if std::env::var_os("LEASEHOLD_TEST_ROLE").is_some() {
            return;
        }
        for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
            let removal = match strategy {
                Strategy::Directory => "dir.retire.before_rename",
                _ => "file.unlink.before_unlink",
            };
            for (joiner_points, leaver_point) in [
                ("unlocked.join.before_record", "group.seal.before_create"),
                (
                    "unlocked.join.before_record,unlocked.join.after_record",
                    "group.seal.before_create",
                ),
                ("unlocked.join.before_record", removal),
            ] {
                let what = format!("{strategy:?} joiner at {joiner_points}, leaver at {leaver_point}");
                let dir = tempfile::tempdir().unwrap();
                let d = dir.path().to_str().unwrap();
                let s = strategy_arg(strategy);
                let path = locker(dir.path(), strategy).lock_path("job").unwrap();
                let leaver = ChildProc::spawn("leaver", &[d, s, leaver_point]);
                leaver.expect("holding", Duration::from_secs(10));
                // The joiner finds the mutation lock taken: it joins without.
                let frozen = frozen_flock(&mutex_of(&path));
                let joiner = ChildProc::spawn("joiner", &[d, s, joiner_points]);
                until_stopped(&joiner, &what);
                drop(frozen);
                std::fs::write(dir.path().join("leave"), b"").unwrap();
                until_stopped(&leaver, &what);
                joiner.signal(Signal::SIGCONT);
                let twice = joiner_points.contains(',');
                let sealed = leaver_point == removal;
                if twice {
                    // Its record in place, stopped before its checks.
                    std::thread::sleep(Duration::from_millis(50));
                    until_stopped(&joiner, &what);
                } else if !sealed {
                    joiner.expect("joined", Duration::from_secs(10));
                } else {
                    // It finds the seal, withdraws and tries again (had it
                    // joined, the leaver would now remove the marker under
                    // it, and the rival below would take the name).
                    std::thread::sleep(Duration::from_millis(300));
                }
                leaver.signal(Signal::SIGCONT);
                leaver.expect("left", Duration::from_secs(10));
                if twice {
                    joiner.signal(Signal::SIGCONT);
                }
                if twice || sealed {
                    joiner.expect("joined", Duration::from_secs(10));
                }
                let rival = locker(dir.path(), strategy);
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    for _ in 0..8 {
                        let taken = rival.try_acquire("job").await.unwrap();
                        assert!(
                            taken.is_none(),
                            "{what}: taken exclusively while a shared holder holds"
                        );
                        tokio::time::sleep(LEASE / 4).await;
                    }
                    std::fs::write(dir.path().join("done"), b"").unwrap();
                    let started = Instant::now();
                    let taken = tokio::time::timeout(Duration::from_secs(10), rival.acquire("job"))
                        .await
                        .expect("free once the joiner left")
                        .unwrap();
                    assert!(started.elapsed() < Duration::from_secs(5), "{what}");
                    drop(taken);
                });
                drop(joiner);
                drop(leaver);
            }
        }
    }

    /// The last holder leaves and stops holding the mutation lock, its
    /// record gone, before it seals: the group is deserted but still
    /// stands (its marker's lease runs). A joiner joins it at once, and
    /// signs the marker with its own record; the leaver, run again, counts
    /// it and leaves the marker. No writer takes the name meanwhile, and
    /// it is free once the joiner leaves.
    #[test]
    fn a_joiner_joins_a_group_whose_last_leaver_is_frozen() {
        if std::env::var_os("LEASEHOLD_TEST_ROLE").is_some() {
            return;
        }
        for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
            let what = format!("{strategy:?}");
            let dir = tempfile::tempdir().unwrap();
            let d = dir.path().to_str().unwrap();
            let s = strategy_arg(strategy);
            let leaver = ChildProc::spawn("leaver", &[d, s, "group.seal.before_create"]);
            leaver.expect("holding", Duration::from_secs(10));
            std::fs::write(dir.path().join("leave"), b"").unwrap();
            until_stopped(&leaver, &what);
            let started = Instant::now();
            let joiner = ChildProc::spawn("joiner", &[d, s, "none"]);
            joiner.expect("joined", Duration::from_secs(10));
            // A process start is part of this: still far below the leaver's
            // 600 ms lease, whose end would be the alternative.
            assert!(
                started.elapsed() < QUICK,
                "{what}: joined after {:?}",
                started.elapsed()
            );
            let rival = locker(dir.path(), strategy);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                // Past the leaver's lease: the marker is the joiner's now.
                for _ in 0..6 {
                    let taken = rival.try_acquire("job").await.unwrap();
                    assert!(
                        taken.is_none(),
                        "{what}: taken exclusively beside a frozen leaver"
                    );
                    tokio::time::sleep(LEASE / 3).await;
                }
            });
            leaver.signal(Signal::SIGCONT);
            leaver.expect("left", Duration::from_secs(10));
            rt.block_on(async {
                for _ in 0..4 {
                    let taken = rival.try_acquire("job").await.unwrap();
                    assert!(taken.is_none(), "{what}: the leaver ended the joiner's group");
                    tokio::time::sleep(LEASE / 4).await;
                }
                std::fs::write(dir.path().join("done"), b"").unwrap();
                let taken = tokio::time::timeout(Duration::from_secs(10), rival.acquire("job"))
                    .await
                    .expect("free once the joiner left")
                    .unwrap();
                drop(taken);
            });
            drop(joiner);
            drop(leaver);
        }
    }

    /// A joiner killed with its record made and unchecked costs nothing:
    /// its record's flock is free at once, so the group ends and the name
    /// is free at once.
    #[test]
    fn a_joiner_killed_without_the_mutation_lock_leaves_the_name_free() {
        if std::env::var_os("LEASEHOLD_TEST_ROLE").is_some() {
            return;
        }
        for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
            for point in [
                "unlocked.join.before_record",
                "unlocked.join.after_record",
                "unlocked.leave.after_unlink",
            ] {
                let what = format!("{strategy:?} killed at {point}");
                let dir = tempfile::tempdir().unwrap();
                let d = dir.path().to_str().unwrap();
                let s = strategy_arg(strategy);
                let rival = locker(dir.path(), strategy);
                let path = rival.lock_path("job").unwrap();
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let held = rt.block_on(rival.acquire_shared("job")).unwrap();
                let frozen = frozen_flock(&mutex_of(&path));
                let mut child = ChildProc::spawn("joiner", &[d, s, point]);
                if point == "unlocked.leave.after_unlink" {
                    child.expect("joined", Duration::from_secs(10));
                    std::fs::write(dir.path().join("done"), b"").unwrap();
                }
                until_stopped(&child, &what);
                child.kill();
                child.wait(Duration::from_secs(10));
                assert!(!held.is_lost(), "{what}");
                drop(frozen);
                rt.block_on(async {
                    held.release().await.unwrap();
                    let taken = tokio::time::timeout(Duration::from_secs(3), rival.acquire("job"))
                        .await
                        .unwrap_or_else(|_| panic!("{what}: the name not free within 3 s"))
                        .unwrap();
                    drop(taken);
                });
            }
        }
    }
}

mod roles {
    use super::*;

    fn strategy(arg: &str) -> Strategy {
        match arg {
            "directory" => Strategy::Directory,
            _ => Strategy::ExclusiveFile,
        }
    }

    #[cfg(feature = "failpoints")]
    async fn until_exists(path: &Path) {
        while !path.exists() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops this process once at each of the comma-separated points.
    #[cfg(feature = "failpoints")]
    fn stop_once_at(points: &str) {
        for point in points.split(',').filter(|p| *p != "none") {
            let seen = std::sync::atomic::AtomicBool::new(false);
            fail::cfg_callback(point, move || {
                if !seen.swap(true, Ordering::SeqCst) {
                    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
                }
            })
            .unwrap();
        }
    }

    pub async fn run(role: &str, args: &[String]) -> i32 {
        let dir = Path::new(&args[0]);
        #[cfg_attr(not(feature = "failpoints"), allow(unused_variables))]
        let locker = locker(dir, strategy(&args[1]));
        match role {
            // Holds, then leaves when told, stopping once (with the
            // mutation lock) at the point given.
            #[cfg(feature = "failpoints")]
            "leaver" => {
                let guard = locker.acquire_shared("job").await.unwrap();
                common::say("holding");
                until_exists(&dir.join("leave")).await;
                stop_once_at(&args[2]);
                guard.release().await.unwrap();
                common::say("left");
                tokio::time::sleep(Duration::from_secs(60)).await;
                0
            }
            // Joins (stopping once at the point given), holds until told.
            #[cfg(feature = "failpoints")]
            "joiner" => {
                stop_once_at(&args[2]);
                let guard = locker.acquire_shared("job").await.unwrap();
                common::say("joined");
                until_exists(&dir.join("done")).await;
                guard.release().await.unwrap();
                tokio::time::sleep(Duration::from_secs(60)).await;
                0
            }
            _ => common::run_role(role, args).await,
        }
    }
}
