//! Attacks on joins and leaves without the name's mutation lock and the
//! members directory's seal (issue 28 item 2, docs/format.md *Joining and
//! leaving without the mutation lock*): orderings of a seal against a
//! joiner's checks, a seal that outlives its sealer's mutation lock,
//! upgrades and reclaims racing joiners that do not take that lock.
//!
//! Child processes stopped at failpoints (SIGSTOP, feature `failpoints`)
//! play the slow or frozen processes; a `flock` the test keeps on the
//! name's mutation-lock file plays a process frozen while holding it.
// SIGSTOP and /proc: Linux only.
#![cfg(target_os = "linux")]
// Without failpoints only the tests that need none are built: the helpers
// of the others go unused.
#![cfg_attr(not(feature = "failpoints"), allow(unused_imports, dead_code))]

#[path = "support/common.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{frozen_flock, hold_mutation_lock, members_of, mutex_of};
use leasehold::{Locker, Strategy};

#[test]
fn child_process_entry() {
    common::child_entry_with(|role, args| async move { roles::run(&role, &args).await });
}

const LEASE: Duration = Duration::from_millis(600);

fn locker(dir: &Path, strategy: Strategy) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .lease(LEASE)
        .renew_interval(LEASE / 4)
        .build()
        .unwrap()
}

fn strategy_arg(strategy: Strategy) -> &'static str {
    match strategy {
        Strategy::Directory => "directory",
        _ => "file",
    }
}

/// Semaphore permits and exclusive holds taken and given back at a high
/// rate while a slow process holds the name's mutation lock for 0 to 6 ms
/// at a time: joins and leaves mix the path under the lock and the path
/// without it (and, without an anchor holder, groups end and start again
/// under the seal). Never more holders than permits, never a permit and
/// an exclusive holder at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mixed_joins_with_and_without_the_mutation_lock_never_oversubscribe() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const PERMITS: u32 = 2;
    let mut failures = Vec::new();
    for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
        for anchored in [true, false] {
            let what = format!("{strategy:?} anchored {anchored}");
            let dir = tempfile::tempdir().unwrap();
            let main = locker(dir.path(), strategy);
            let path = main.lock_path("pool").unwrap();
            let anchor = if anchored {
                Some(main.semaphore("pool", PERMITS).unwrap().acquire().await.unwrap())
            } else {
                None
            };
            let permits = Arc::new(AtomicUsize::new(usize::from(anchored)));
            let exclusive = Arc::new(AtomicUsize::new(0));
            let most = Arc::new(AtomicUsize::new(0));
            let both = Arc::new(AtomicBool::new(false));
            let taken = Arc::new(AtomicUsize::new(0));
            let lost = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
            let stop = Arc::new(AtomicBool::new(false));
            let chaos = {
                let stop = Arc::clone(&stop);
                let mutex = mutex_of(&path);
                std::thread::spawn(move || {
                    let mut n: u64 = 7;
                    while !stop.load(Ordering::SeqCst) {
                        n = n
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        hold_mutation_lock(&mutex, Duration::from_micros((n >> 33) % 6000));
                        std::thread::sleep(Duration::from_micros((n >> 40) % 3000));
                    }
                })
            };
            let deadline = Instant::now() + Duration::from_secs(3);
            let mut tasks = Vec::new();
            for i in 0..6 {
                let locker = locker(dir.path(), strategy);
                let lost = Arc::clone(&lost);
                let (permits, exclusive, most, both, taken) = (
                    Arc::clone(&permits),
                    Arc::clone(&exclusive),
                    Arc::clone(&most),
                    Arc::clone(&both),
                    Arc::clone(&taken),
                );
                tasks.push(tokio::spawn(async move {
                    while Instant::now() < deadline {
                        if i == 0 && !anchored {
                            let Some(guard) = locker.try_acquire("pool").await.unwrap() else {
                                tokio::time::sleep(Duration::from_millis(2)).await;
                                continue;
                            };
                            exclusive.fetch_add(1, Ordering::SeqCst);
                            if permits.load(Ordering::SeqCst) > 0 {
                                both.store(true, Ordering::SeqCst);
                            }
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            if permits.load(Ordering::SeqCst) > 0 {
                                both.store(true, Ordering::SeqCst);
                            }
                            exclusive.fetch_sub(1, Ordering::SeqCst);
                            drop(guard);
                            continue;
                        }
                        let sem = locker.semaphore("pool", PERMITS).unwrap();
                        let Some(guard) = sem.try_acquire().await.unwrap() else {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            continue;
                        };
                        let now = permits.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        if exclusive.load(Ordering::SeqCst) > 0 {
                            both.store(true, Ordering::SeqCst);
                        }
                        taken.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        if exclusive.load(Ordering::SeqCst) > 0 {
                            both.store(true, Ordering::SeqCst);
                        }
                        permits.fetch_sub(1, Ordering::SeqCst);
                        if i % 2 == 0 {
                            if let Err(e) = guard.release().await {
                                lost.lock().unwrap().push(format!("{e}"));
                            }
                        } else {
                            if guard.is_lost() {
                                lost.lock().unwrap().push("lost before its drop".to_owned());
                            }
                            drop(guard);
                        }
                    }
                }));
            }
            for task in tasks {
                task.await.unwrap();
            }
            stop.store(true, Ordering::SeqCst);
            chaos.join().unwrap();
            let lost = lost.lock().unwrap().clone();
            if !lost.is_empty() {
                failures.push(format!(
                    "{what}: {} holders lost their permits: {:?}",
                    lost.len(),
                    lost.first()
                ));
            }
            let most = most.load(Ordering::SeqCst);
            if most > PERMITS as usize {
                failures.push(format!("{what}: {most} holders of {PERMITS} permits"));
            }
            if both.load(Ordering::SeqCst) {
                failures.push(format!("{what}: a permit and an exclusive holder at once"));
            }
            if taken.load(Ordering::SeqCst) < 10 {
                failures.push(format!("{what}: only {taken:?} permits taken"));
            }
            if let Some(anchor) = anchor
                && anchor.is_lost()
            {
                failures.push(format!("{what}: the anchor lost its permit"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Holders that keep a name shared while others join and leave it beside
/// a slow process holding its mutation lock part of the time: leaves
/// without the mutation lock sign the marker without it (a lock file's
/// marker is rewritten in place, which a reader can read torn), while a
/// holder's renewal under the lock reads the marker to sign it. Nobody
/// that holds loses its lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn holders_keep_their_lock_beside_leaves_without_the_mutation_lock() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let mut failures = Vec::new();
    for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
        let what = format!("{strategy:?}");
        let dir = tempfile::tempdir().unwrap();
        let quick = |dir: &Path| {
            Locker::builder()
                .directory(dir)
                .strategy(strategy)
                .lease(Duration::from_millis(400))
                .renew_interval(Duration::from_millis(5))
                .build()
                .unwrap()
        };
        let keepers: Vec<Locker> = (0..4).map(|_| quick(dir.path())).collect();
        let path = keepers[0].lock_path("job").unwrap();
        let mut kept = Vec::new();
        for keeper in &keepers {
            kept.push(keeper.acquire_shared("job").await.unwrap());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let chaos = {
            let stop = Arc::clone(&stop);
            let mutex = mutex_of(&path);
            std::thread::spawn(move || {
                let mut n: u64 = 11;
                while !stop.load(Ordering::SeqCst) {
                    n = n
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    hold_mutation_lock(&mutex, Duration::from_micros((n >> 33) % 3000));
                    std::thread::sleep(Duration::from_micros((n >> 40) % 2000));
                }
            })
        };
        let churned = Arc::new(AtomicUsize::new(0));
        let deadline = Instant::now() + Duration::from_secs(4);
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let locker = locker(dir.path(), strategy);
            let churned = Arc::clone(&churned);
            tasks.push(tokio::spawn(async move {
                while Instant::now() < deadline {
                    if let Some(guard) = locker.try_acquire_shared("job").await.unwrap() {
                        churned.fetch_add(1, Ordering::SeqCst);
                        let _ = guard.release().await;
                    }
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        stop.store(true, Ordering::SeqCst);
        chaos.join().unwrap();
        let lost = kept.iter().filter(|g| g.is_lost()).count();
        if lost > 0 {
            failures.push(format!(
                "{what}: {lost} of {} holders lost their lock ({} joins beside them)",
                kept.len(),
                churned.load(Ordering::SeqCst)
            ));
        }
        for guard in kept {
            let _ = guard.release().await;
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[cfg(feature = "failpoints")]
mod seal {
    use super::*;
    use common::ChildProc;
    use nix::sys::signal::Signal;
    use std::fs::File;

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

    /// Whether `child` stops within `within`.
    fn stops_within(child: &ChildProc, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if stopped(child) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        stopped(child)
    }

    fn until_stopped(child: &ChildProc, what: &str) {
        assert!(
            stops_within(child, Duration::from_secs(10)),
            "{what}: the child never stopped at its failpoint"
        );
    }

    fn wait_for(path: &Path, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if path.exists() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        path.exists()
    }

    fn remove_lock_path(strategy: Strategy, path: &Path) {
        match strategy {
            Strategy::Directory => std::fs::remove_dir_all(path).unwrap(),
            _ => std::fs::remove_file(path).unwrap(),
        }
    }

    /// A seal must never outlive its sealer's mutation lock: the next
    /// holder of that lock takes a seal it finds for a dead sealer's, and
    /// seals over it; the late sealer then removes the new sealer's seal,
    /// and a joiner that does not take the mutation lock joins a group
    /// whose sealed count did not count it.
    ///
    /// The late removal comes from `members::tidy` when its removal of the
    /// marker does not happen (here: the marker was removed behind the
    /// mutation lock, as velocious or pi-research remove a marker whose
    /// lease lapsed; the same with an I/O error on the removal): the
    /// mutation lock goes with the closure, the seal only after, when
    /// `tidy` returns.
    ///
    /// 1. A holder dies; joiner A (shared) finds its marker with no live
    ///    member and ends that group under the mutation lock: stopped
    ///    before its seal.
    /// 2. The marker is removed behind the mutation lock; A goes on: its
    ///    removal finds the marker gone, its mutation lock goes, and it
    ///    stops before it removes its seal.
    /// 3. U joins as upgradable (first holder of a new group in the same
    ///    members directory), and upgrades: seals, counts itself alone,
    ///    and is stopped before it turns the marker into its exclusive
    ///    lock.
    /// 4. A goes on: removes the seal (U's), and joins the new group
    ///    without the mutation lock (U holds it): no seal, the marker
    ///    still there.
    /// 5. U goes on and takes the name exclusively.
    ///
    /// The children report any instant at which both held.
    #[test]
    fn a_seal_never_outlives_its_sealers_mutation_lock() {
        if std::env::var_os("LEASEHOLD_TEST_ROLE").is_some() {
            return;
        }
        for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
            let what = format!("{strategy:?}");
            let dir = tempfile::tempdir().unwrap();
            let d = dir.path().to_str().unwrap();
            let s = strategy_arg(strategy);
            let path = locker(dir.path(), strategy).lock_path("job").unwrap();

            let mut holder = ChildProc::spawn("holder", &[d, s]);
            holder.expect("holding", Duration::from_secs(10));
            holder.kill();
            holder.wait(Duration::from_secs(10));

            let a = ChildProc::spawn(
                "shared",
                &[d, s, "group.seal.before_create,group.seal.before_remove", "a"],
            );
            until_stopped(&a, &what);
            remove_lock_path(strategy, &path);
            a.signal(Signal::SIGCONT);
            let a_stopped = stops_within(&a, Duration::from_secs(2));

            let u = ChildProc::spawn("upgrader", &[d, s, "upgrade.before_rewrite", "u"]);
            if !stops_within(&u, Duration::from_secs(3)) && a_stopped {
                a.signal(Signal::SIGCONT);
            }
            until_stopped(&u, &what);
            if a_stopped && stopped(&a) {
                a.signal(Signal::SIGCONT);
            }
            // A joins now, if it can.
            let _ = wait_for(&dir.path().join("a.holding"), Duration::from_millis(500));
            u.signal(Signal::SIGCONT);
            let a_said = a.expect("finished", Duration::from_secs(20));
            let u_said = u.expect("finished", Duration::from_secs(20));
            assert!(
                !a_said.contains("overlap") && !u_said.contains("overlap"),
                "{what}: a shared holder and the upgraded exclusive holder held at once: A {a_said:?}, U {u_said:?}"
            );
        }
    }

    /// Unfinished records (`.tmp-m-*.json`) in the members directory.
    fn unfinished(lock_path: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(members_of(lock_path))
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| {
                        let n = p.file_name().unwrap().to_string_lossy().into_owned();
                        n.starts_with(".tmp-m-") && n.ends_with(".json")
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A joiner without the mutation lock makes its record under a private
    /// name (`.tmp-m-<uuid>.json`) and flocks it after creating it; between
    /// the two, a process under the mutation lock that removes what dead
    /// joiners left (`remove_dead`) tests that flock (and takes it, for an
    /// instant) and removes the file:
    ///
    /// - removed before the joiner's flock: the joiner's rename fails
    ///   (`NotFound`), and it tries again;
    /// - the tester frozen with the flock taken (between its test and its
    ///   removal, played here by the test's own flock on the file): the
    ///   joiner's flock fails. A join beside a frozen process must not
    ///   fail: it tries again under another name.
    ///
    /// Either way the joiner joins, within a second of going on, and the
    /// holder keeps its lock.
    #[test]
    fn a_joiners_unfinished_record_tested_or_removed_by_a_sweep_costs_no_error() {
        if std::env::var_os("LEASEHOLD_TEST_ROLE").is_some() {
            return;
        }
        for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
            for frozen_tester in [false, true] {
                let what = format!("{strategy:?} frozen tester {frozen_tester}");
                let dir = tempfile::tempdir().unwrap();
                let d = dir.path().to_str().unwrap();
                let s = strategy_arg(strategy);
                let main = locker(dir.path(), strategy);
                let path = main.lock_path("job").unwrap();
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let held = rt.block_on(main.acquire_shared("job")).unwrap();
                let frozen = frozen_flock(&mutex_of(&path));
                let j = ChildProc::spawn("shared", &[d, s, "group.record.after_open", "j"]);
                until_stopped(&j, &what);
                let tmp = unfinished(&path);
                assert_eq!(tmp.len(), 1, "{what}: the joiner's unfinished record");
                let tester = if frozen_tester {
                    // Frozen between its flock test and its removal.
                    let file = File::open(&tmp[0]).unwrap();
                    file.try_lock().unwrap();
                    Some(file)
                } else {
                    // A join under the mutation lock sweeps it.
                    drop(frozen);
                    let other = locker(dir.path(), strategy);
                    let second = rt.block_on(other.acquire_shared("job")).unwrap();
                    assert!(
                        unfinished(&path).is_empty(),
                        "{what}: the sweep kept a record nobody flocks"
                    );
                    drop(second);
                    None
                };
                j.signal(Signal::SIGCONT);
                let said = j.expect("holding", Duration::from_secs(5));
                assert!(!said.contains("error"), "{what}: {said}");
                drop(tester);
                let said = j.expect("finished", Duration::from_secs(10));
                assert!(!said.contains("error"), "{what}: {said}");
                assert!(!held.is_lost(), "{what}");
                rt.block_on(held.release()).unwrap();
            }
        }
    }

    /// A process killed with its seal made (planted here) leaves the seal: the
    /// next process under the mutation lock removes it, but while another
    /// process holds that lock (frozen), joiners that do not take it find
    /// the group sealed and wait, for as long as that process stays
    /// frozen. A crash should cost milliseconds, and a frozen process
    /// delays no join of a group that stands (here: a live holder, the
    /// marker in place).
    #[test]
    fn a_dead_sealers_seal_delays_no_join_beside_a_frozen_change() {
        if std::env::var_os("LEASEHOLD_TEST_ROLE").is_some() {
            return;
        }
        for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
            let what = format!("{strategy:?}");
            let dir = tempfile::tempdir().unwrap();
            let main = locker(dir.path(), strategy);
            let path = main.lock_path("job").unwrap();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let held = rt.block_on(main.acquire_shared("job")).unwrap();
            // A dead sealer's seal: the file, its flock free. (An upgrade
            // that finds other holders no longer seals, so none is killed
            // with its seal made beside a live holder here; a sealer that
            // found itself alone just before a joiner came can be.)
            std::fs::write(members_of(&path).join("sealed"), b"").unwrap();
            let frozen = frozen_flock(&mutex_of(&path));
            let joiner = locker(dir.path(), strategy);
            rt.block_on(async {
                let started = Instant::now();
                let joined = tokio::time::timeout(Duration::from_secs(3), joiner.acquire_shared("job")).await;
                assert!(
                    joined.is_ok(),
                    "{what}: a join waited {:?} for a dead sealer's seal beside a frozen change of the name",
                    started.elapsed()
                );
                drop(joined);
            });
            assert!(!held.is_lost(), "{what}");
            drop(frozen);
            rt.block_on(held.release()).unwrap();
        }
    }
}

mod roles {
    use super::*;
    use std::sync::atomic::Ordering;

    fn strategy(arg: &str) -> Strategy {
        match arg {
            "directory" => Strategy::Directory,
            _ => Strategy::ExclusiveFile,
        }
    }

    /// Stops this process once at each of the comma-separated points.
    #[cfg(feature = "failpoints")]
    fn stop_once_at(points: &str) {
        for point in points.split(',').filter(|p| !p.is_empty()) {
            let seen = std::sync::atomic::AtomicBool::new(false);
            fail::cfg_callback(point, move || {
                if !seen.swap(true, Ordering::SeqCst) {
                    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
                }
            })
            .unwrap();
        }
    }

    /// Holds for `hold`, marked by the file `<me>.holding` in `dir`,
    /// watching for `<other>.holding`: "overlap" if it was there.
    async fn hold_watching(dir: &Path, me: &str, others: &[&str], hold: Duration) -> bool {
        let mine = dir.join(format!("{me}.holding"));
        std::fs::write(&mine, b"").unwrap();
        let until = Instant::now() + hold;
        let mut overlap = false;
        while Instant::now() < until {
            overlap |= others.iter().any(|o| dir.join(format!("{o}.holding")).exists());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        std::fs::remove_file(&mine).unwrap();
        overlap
    }

    pub async fn run(role: &str, args: &[String]) -> i32 {
        let dir = Path::new(&args[0]);
        let locker = locker(dir, strategy(&args[1]));
        match role {
            "holder" => {
                let _guard = locker.acquire_shared("job").await.unwrap();
                common::say("holding");
                tokio::time::sleep(Duration::from_secs(60)).await;
                0
            }
            // A shared holder, stopping once at each point given; holds
            // 1.5 s and reports whether an exclusive holder held meanwhile.
            #[cfg(feature = "failpoints")]
            "shared" => {
                stop_once_at(&args[2]);
                let me = args[3].as_str();
                let guard = match locker.acquire_shared("job").await {
                    Ok(guard) => guard,
                    Err(e) => {
                        common::say(&format!("holding error {e}"));
                        common::say(&format!("finished error {e}"));
                        tokio::time::sleep(Duration::from_secs(60)).await;
                        return 1;
                    }
                };
                common::say("holding");
                let overlap = hold_watching(dir, me, &["u-excl"], Duration::from_millis(1500)).await;
                let _ = guard.release().await;
                common::say(&format!("finished{}", if overlap { " overlap" } else { "" }));
                tokio::time::sleep(Duration::from_secs(60)).await;
                0
            }
            // An upgradable holder that upgrades at once, stopping once at
            // each point given; holds the upgrade 1 s and reports whether a
            // shared holder held meanwhile.
            #[cfg(feature = "failpoints")]
            "upgrader" => {
                let me = args[3].as_str();
                let up = locker.acquire_upgradable("job").await.unwrap();
                std::fs::write(dir.join(format!("{me}.joined")), b"").unwrap();
                stop_once_at(&args[2]);
                let guard = up.upgrade().await.unwrap();
                let overlap =
                    hold_watching(dir, "u-excl", &["a", "b", "c"], Duration::from_millis(1000)).await;
                let _ = guard.release().await;
                common::say(&format!("finished{}", if overlap { " overlap" } else { "" }));
                tokio::time::sleep(Duration::from_secs(60)).await;
                0
            }
            _ => common::run_role(role, args).await,
        }
    }
}
