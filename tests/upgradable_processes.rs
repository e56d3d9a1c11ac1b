//! Upgradable shared locks across real processes, on both layouts: an
//! upgradable holder in one process, readers and writers in others.
//!
//! - the upgrade waits for another process's reader, and no writer of
//!   another process gets in at any moment from the upgradable
//!   acquisition to its release (through the upgrade, the exclusive
//!   section and the downgrade): every section is logged by every process
//!   to one `O_APPEND` log, checked afterwards;
//! - a SIGKILLed upgradable holder frees the upgradable place at once
//!   (another process's `acquire_upgradable` gets it);
//! - a holder SIGKILLed mid-upgrade (waiting for a reader, announced as a
//!   waiting writer), or holding the exclusive lock an upgrade made, or
//!   downgraded again, leaves nothing that blocks anyone longer than a
//!   dead holder does: another process takes the name at once;
//! - with feature `failpoints`, a holder that dies at each step of the
//!   upgrade and the downgrade (`upgrade.*`, `downgrade.*`) leaves the name
//!   takeable at once, and nothing behind;
//! - velocious's and pi-research's own code (under Node.js, where it is
//!   installed) never gets the lock path at any moment of an upgrade.
//!
//! The child roles live here (`run_role`), started by re-running this test
//! binary with a role (`tests/support/common.rs`); each child is bounded in
//! time and killed by pid when its `ChildProc` is dropped.

// Not on Windows: upgradable locks are refused there (`tests/windows.rs`
// `upgradable_locks_are_refused_on_windows`).
#![cfg(unix)]

use std::path::Path;
use std::time::{Duration, Instant};

#[path = "support/common.rs"]
mod common;

use common::clock::mono_ns;

use common::{ChildProc, Sec, append, entries, layout_label, say, sections, strategy_from_env};
#[cfg(unix)]
use common::{node, seed as seed_run};
use leasehold::{Locker, Strategy};

// ---------------------------------------------------------------- children

#[test]
fn child_process_entry() {
    common::child_entry_with(|role, args| async move { run_role(&role, &args).await });
}

fn child_locker(dir: &str) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(strategy_from_env())
        .path_style(common::path_style_from_env())
        .fencing(true)
        .lease(Duration::from_secs(10))
        .poll_interval(Duration::from_millis(10))
        .build()
        .expect("locker")
}

async fn wait_for(file: &str) {
    while !Path::new(file).exists() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn run_role(role: &str, args: &[String]) -> i32 {
    let pid = std::process::id();
    match role {
        // dir name log go: take the upgradable place (log `S U`), once
        // `go.1` exists upgrade (log `E U`, `S X`), hold 300 ms, downgrade
        // (log `E X`, `S U`), once `go.2` exists release (log `E U`).
        "upgrader" => {
            let (name, log, go) = (&args[1], &args[2], &args[3]);
            let locker = child_locker(&args[0]);
            let up = locker.acquire_upgradable(name).await.expect("acquire_upgradable");
            append(log, &format!("S U up.1 {}", mono_ns()));
            say(&format!("acquired {}", up.guard().fencing_token().unwrap()));
            wait_for(&format!("{go}.1")).await;
            say("upgrading");
            let writer = up.upgrade().await.expect("upgrade");
            let ns = mono_ns();
            append(log, &format!("E U up.1 {ns}"));
            append(log, &format!("S X up.2 {ns}"));
            say(&format!("upgraded {}", writer.fencing_token().unwrap()));
            tokio::time::sleep(Duration::from_millis(300)).await;
            let tag = if writer.is_lost() { "L" } else { "E" };
            // The exclusive section lasts until the downgrade returns: the
            // reader section starts there.
            let up = writer.downgrade().await.expect("downgrade");
            let ns = mono_ns();
            append(log, &format!("{tag} X up.2 {ns}"));
            append(log, &format!("S U up.3 {ns}"));
            say(&format!("downgraded {}", up.guard().fencing_token().unwrap()));
            wait_for(&format!("{go}.2")).await;
            let tag = if up.guard().is_lost() { "L" } else { "E" };
            append(log, &format!("{tag} U up.3 {}", mono_ns()));
            drop(up);
            say("released");
            0
        }
        // dir name log stop: hold the name shared (log `S R`) until `stop`
        // exists.
        "reader" => {
            let (name, log, stop) = (&args[1], &args[2], &args[3]);
            let locker = child_locker(&args[0]);
            let guard = locker.acquire_shared(name).await.expect("acquire_shared");
            append(log, &format!("S R r.{pid} {}", mono_ns()));
            say("acquired");
            wait_for(stop).await;
            let tag = if guard.is_lost() { "L" } else { "E" };
            append(log, &format!("{tag} R r.{pid} {}", mono_ns()));
            let _ = guard.release().await;
            say("released");
            0
        }
        // dir name log: take the lock exclusively again and again, 20 ms
        // each (log `S W`), until killed.
        "writers" => {
            let (name, log) = (&args[1], &args[2]);
            let locker = child_locker(&args[0]);
            say("waiting");
            let mut seq = 0;
            loop {
                let guard = locker.acquire(name).await.expect("acquire");
                seq += 1;
                append(log, &format!("S W w.{pid}.{seq} {}", mono_ns()));
                tokio::time::sleep(Duration::from_millis(20)).await;
                let tag = if guard.is_lost() { "L" } else { "E" };
                append(log, &format!("{tag} W w.{pid}.{seq} {}", mono_ns()));
                drop(guard);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        // dir name stage: take the upgradable place and go to `stage`
        // (`held`: stay; `upgrading`: start an upgrade, which waits for a
        // reader; `upgraded`: upgrade; `downgraded`: upgrade and
        // downgrade), say it, and stay until killed.
        "up_to" => {
            let (name, stage) = (&args[1], args[2].as_str());
            let locker = child_locker(&args[0]);
            let up = locker.acquire_upgradable(name).await.expect("acquire_upgradable");
            say("acquired");
            let _held: Box<dyn std::any::Any + Send> = match stage {
                "held" => Box::new(up),
                "upgrading" => {
                    let upgrading = tokio::spawn(up.upgrade());
                    // Long enough to have announced itself.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    assert!(
                        !upgrading.is_finished(),
                        "the upgrade did not wait for the reader"
                    );
                    Box::new(upgrading)
                }
                "upgraded" => Box::new(up.upgrade().await.expect("upgrade")),
                _ => Box::new(
                    up.upgrade()
                        .await
                        .expect("upgrade")
                        .downgrade()
                        .await
                        .expect("downgrade"),
                ),
            };
            say(stage);
            std::future::pending::<()>().await;
            0
        }
        // dir name point up|down: die (SIGKILL, by itself) at failpoint
        // `point` of an upgrade (`up`), or of the downgrade after one.
        #[cfg(all(unix, feature = "failpoints"))]
        "crash_at" => {
            let (name, point) = (&args[1], args[2].clone());
            fail::cfg_callback(point, || {
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            })
            .expect("configure the failpoint");
            let locker = child_locker(&args[0]);
            let up = locker.acquire_upgradable(name).await.expect("acquire_upgradable");
            say("acquired");
            let writer = up.upgrade().await.expect("upgrade");
            if args[3] == "down" {
                let _up = writer.downgrade().await.expect("downgrade");
            }
            say("survived");
            std::future::pending::<()>().await;
            0
        }
        other => common::run_role(other, args).await,
    }
}

// ---------------------------------------------------------------- parent

fn kid(strategy: Strategy, role: &str, args: &[&str]) -> ChildProc {
    ChildProc::spawn_with(strategy, role, args)
}

fn parent_locker(dir: &Path, strategy: Strategy) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .fencing(true)
        .poll_interval(Duration::from_millis(10))
        .build()
        .unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn touch(path: &Path) {
    std::fs::write(path, b"").unwrap();
}

/// Every pair of sections that may not overlap and does: a writer (`W`,
/// `X`) beside anyone, or two upgradable holders.
fn overlaps(secs: &[Sec]) -> Vec<String> {
    let mut found = Vec::new();
    for (i, a) in secs.iter().enumerate() {
        for b in &secs[i + 1..] {
            let exclusive = |s: &Sec| s.role == 'W' || s.role == 'X';
            let conflict = exclusive(a) || exclusive(b) || (a.role == 'U' && b.role == 'U');
            let end = |s: &Sec| s.end.unwrap_or(u64::MAX);
            if conflict && a.start < end(b) && b.start < end(a) {
                found.push(format!("{a:?} overlaps {b:?}"));
            }
        }
    }
    found
}

/// Polls `f` until it is true, for at most `within`.
fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    f()
}

/// Whether `dir` holds, within a second, nothing but fencing counters
/// (and `also`): a guard's drop that finds the name's mutation lock taken
/// leaves its release to leasehold's release thread, a moment later.
fn clean_soon(dir: &Path, also: &[&str]) -> bool {
    eventually(Duration::from_secs(1), || {
        entries(dir)
            .iter()
            .all(|n| n.ends_with(".fence") || also.contains(&n.as_str()))
    })
}

fn logged(log: &Path, what: &str) -> bool {
    std::fs::read_to_string(log).unwrap_or_default().contains(what)
}

/// An upgradable holder in one process, a reader in another, writers in
/// a third: the upgrade waits for the reader, new readers wait behind it,
/// no writer gets in from the upgradable acquisition to its release, and
/// readers come back after the downgrade.
#[test]
fn an_upgrade_waits_for_another_process_reader_and_lets_no_writer_of_another_process_in() {
    let rt = runtime();
    for &strategy in common::strategies() {
        let began = Instant::now();
        let dir = tempfile::tempdir().unwrap();
        let locks = dir.path().join("locks");
        std::fs::create_dir(&locks).unwrap();
        let (log, go, stop) = (
            dir.path().join("log"),
            dir.path().join("go"),
            dir.path().join("stop"),
        );
        let (d, l, g, s) = (
            locks.to_str().unwrap(),
            log.to_str().unwrap(),
            go.to_str().unwrap(),
            stop.to_str().unwrap(),
        );
        let upgrader = kid(strategy, "upgrader", &[d, "catalog", l, g]);
        let shared_token: u64 = upgrader.expect("acquired", Duration::from_secs(30))[9..]
            .parse()
            .unwrap();
        let reader = kid(strategy, "reader", &[d, "catalog", l, s]);
        reader.expect("acquired", Duration::from_secs(30));
        let writers = kid(strategy, "writers", &[d, "catalog", l]);
        writers.expect("waiting", Duration::from_secs(30));
        let locker = parent_locker(&locks, strategy);
        // The writer waits; a second upgradable holder is refused.
        std::thread::sleep(Duration::from_millis(200));
        rt.block_on(async {
            assert!(locker.try_acquire("catalog").await.unwrap().is_none());
            assert!(locker.try_acquire_upgradable("catalog").await.unwrap().is_none());
        });

        touch(&go.with_extension("1"));
        upgrader.expect("upgrading", Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !logged(&log, "S X"),
            "{strategy:?}: the upgrade did not wait for the other process's reader"
        );
        rt.block_on(async {
            assert!(
                locker.try_acquire_shared("catalog").await.unwrap().is_none(),
                "{strategy:?}: a new reader joined while an upgrade waited"
            );
        });
        let t0 = Instant::now();
        touch(&stop);
        reader.expect("released", Duration::from_secs(10));
        let token: u64 = upgrader.expect("upgraded", Duration::from_secs(10))[9..]
            .parse()
            .unwrap();
        let upgrade_took = t0.elapsed();
        assert!(token > shared_token, "{strategy:?}: {token} after {shared_token}");
        rt.block_on(async {
            assert!(locker.try_acquire_shared("catalog").await.unwrap().is_none());
            assert!(locker.try_acquire("catalog").await.unwrap().is_none());
        });
        upgrader.expect("downgraded", Duration::from_secs(10));
        // A reader, if it can: the waiting writer keeps new readers out
        // (writers' preference), so this only reports (the reader after a
        // downgrade is asserted in `a_holder_killed_mid_upgrade_blocks_nobody`).
        let back = rt.block_on(async {
            let until = Instant::now() + Duration::from_secs(1);
            loop {
                if let Some(r) = locker.try_acquire_shared("catalog").await.unwrap() {
                    append(l, &format!("S R parent {}", mono_ns()));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    append(l, &format!("E R parent {}", mono_ns()));
                    drop(r);
                    return true;
                }
                if Instant::now() > until {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        // Writers' preference: the waiting writer may keep new readers out
        // after a downgrade; it must not get in, though, until the release.
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !logged(&log, "S W"),
            "{strategy:?}: a writer got in before the upgradable holder released"
        );
        touch(&go.with_extension("2"));
        upgrader.expect("released", Duration::from_secs(10));
        assert!(
            eventually(Duration::from_secs(10), || logged(&log, "E W")),
            "{strategy:?}: the writer never got in after the release"
        );
        drop(writers);
        drop(upgrader);
        drop(reader);
        // The killed writer's lock, if it held one: reclaimed at once.
        rt.block_on(async {
            let guard = locker
                .acquire_timeout("catalog", Duration::from_secs(2))
                .await
                .expect("the name after the children");
            guard.release().await.unwrap();
            // And what its kill left (a fencing counter's temporary file,
            // say): `clean` sweeps it, as after any crash (at once with a
            // short grace: by default it lets young leftovers settle).
            let cleaner = Locker::builder()
                .directory(&locks)
                .strategy(strategy)
                .unreadable_grace(Duration::from_millis(1))
                .build()
                .unwrap();
            cleaner.clean(false).await.unwrap();
        });

        let secs = sections(&log).0;
        let bad = overlaps(&secs);
        let up_start = secs.iter().find(|s| s.id == "up.1").unwrap().start;
        let up_end = secs
            .iter()
            .find(|s| s.id == "up.3")
            .unwrap()
            .end
            .unwrap_or(u64::MAX);
        let early: Vec<&Sec> = secs
            .iter()
            .filter(|s| s.role == 'W' && s.start < up_end)
            .collect();
        let lost: Vec<&Sec> = secs.iter().filter(|s| s.lost).collect();
        eprintln!(
            "upgrade across processes [{}]: {} sections ({} writer sections after the release), \
             the upgrade ended {upgrade_took:?} after the reader was told to leave, a reader came back \
             after the downgrade: {back}, upgradable held {:.0} ms; {:.1} s in all",
            layout_label(strategy),
            secs.len(),
            secs.iter().filter(|s| s.role == 'W').count(),
            (up_end - up_start) as f64 / 1e6,
            began.elapsed().as_secs_f64()
        );
        assert!(bad.is_empty(), "{strategy:?}:\n{}", bad.join("\n"));
        assert!(
            early.is_empty(),
            "{strategy:?}: writers before the release: {early:?}"
        );
        assert!(lost.is_empty(), "{strategy:?}: lost sections: {lost:?}");
        assert!(
            clean_soon(&locks, &[]),
            "{strategy:?}: left behind: {:?}",
            entries(&locks)
        );
    }
}

/// A SIGKILLed upgradable holder frees the upgradable place at once:
/// another process's `acquire_upgradable` gets it, then its writer.
#[test]
fn a_killed_upgradable_holder_frees_its_place_at_once() {
    let rt = runtime();
    for &strategy in common::strategies() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();
        let mut holder = kid(strategy, "up_to", &[d, "catalog", "held"]);
        holder.expect("held", Duration::from_secs(30));
        let locker = parent_locker(dir.path(), strategy);
        rt.block_on(async {
            assert!(locker.try_acquire_upgradable("catalog").await.unwrap().is_none());
            assert!(locker.try_acquire("catalog").await.unwrap().is_none());
        });
        holder.kill();
        holder.kill_and_reap();
        let t0 = Instant::now();
        let up = rt
            .block_on(locker.acquire_upgradable_timeout("catalog", Duration::from_secs(2)))
            .unwrap_or_else(|e| panic!("{strategy:?}: no upgradable holder within 2 s of the kill: {e}"));
        let took = t0.elapsed();
        let writer = rt.block_on(up.upgrade()).unwrap();
        drop(writer);
        eprintln!(
            "a killed upgradable holder [{}]: its place taken {took:?} after the kill",
            layout_label(strategy)
        );
        assert!(
            clean_soon(dir.path(), &[]),
            "{strategy:?}: left behind: {:?}",
            entries(dir.path())
        );
    }
}

/// A holder SIGKILLed in the middle: waiting in an upgrade for another
/// process's reader (announced as a waiting writer), holding the
/// exclusive lock an upgrade made, or downgraded again. Another process
/// takes the name at once after the kill (and after the reader left).
#[test]
fn a_holder_killed_mid_upgrade_blocks_nobody() {
    let rt = runtime();
    for &strategy in common::strategies() {
        for stage in ["upgrading", "upgraded", "downgraded"] {
            let dir = tempfile::tempdir().unwrap();
            let d = dir.path().to_str().unwrap();
            let stop = dir.path().join("stop");
            let log = dir.path().join("log");
            // For `upgrading`, a reader the upgrade waits for.
            let reader = (stage == "upgrading").then(|| {
                let reader = kid(
                    strategy,
                    "reader",
                    &[d, "catalog", log.to_str().unwrap(), stop.to_str().unwrap()],
                );
                reader.expect("acquired", Duration::from_secs(30));
                reader
            });
            let mut holder = kid(strategy, "up_to", &[d, "catalog", stage]);
            holder.expect(stage, Duration::from_secs(30));
            let locker = parent_locker(dir.path(), strategy);
            rt.block_on(async {
                assert!(locker.try_acquire("catalog").await.unwrap().is_none());
                assert!(locker.try_acquire_upgradable("catalog").await.unwrap().is_none());
                match stage {
                    "upgrading" => assert!(
                        locker.try_acquire_shared("catalog").await.unwrap().is_none(),
                        "{strategy:?}: a reader joined while an upgrade waited"
                    ),
                    "upgraded" => assert!(locker.try_acquire_shared("catalog").await.unwrap().is_none()),
                    // Readers come back after a downgrade.
                    _ => assert!(
                        locker.try_acquire_shared("catalog").await.unwrap().is_some(),
                        "{strategy:?}: no reader after a downgrade"
                    ),
                }
            });
            holder.kill();
            holder.kill_and_reap();
            let t0 = Instant::now();
            if let Some(reader) = reader {
                // The dead upgrader's announcement no longer holds readers off.
                let joined = rt
                    .block_on(locker.acquire_shared_timeout("catalog", Duration::from_secs(2)))
                    .unwrap_or_else(|e| panic!("{strategy:?} {stage}: no reader within 2 s: {e}"));
                drop(joined);
                touch(&stop);
                reader.expect("released", Duration::from_secs(10));
                drop(reader);
            }
            let writer = rt
                .block_on(locker.acquire_timeout("catalog", Duration::from_secs(2)))
                .unwrap_or_else(|e| panic!("{strategy:?} {stage}: no writer within 2 s of the kill: {e}"));
            let took = t0.elapsed();
            drop(writer);
            let up = rt
                .block_on(locker.acquire_upgradable_timeout("catalog", Duration::from_secs(2)))
                .unwrap();
            drop(up);
            eprintln!(
                "killed {stage} [{}]: a writer got in {took:?} after the kill",
                layout_label(strategy)
            );
            assert!(
                clean_soon(dir.path(), &["log", "stop"]),
                "{strategy:?} {stage}: left behind: {:?}",
                entries(dir.path())
            );
        }
    }
}

/// With feature `failpoints`: a holder that dies (SIGKILL) at each step of
/// an upgrade or a downgrade leaves the name takeable at once, and after a
/// release and `clean()` nothing but the fencing counter (a private file
/// or directory the crash left, once it has settled). The upgrade's and
/// the downgrade's private files were named so that no sweep knew them
/// (`.pending-` and twelve characters of a UUID, a dash among them): a
/// crash before their publication (`upgrade.before_publish`) left one for
/// good.
#[cfg(all(unix, feature = "failpoints"))]
#[test]
fn a_crash_at_each_step_of_an_upgrade_or_a_downgrade_leaves_the_name_takeable() {
    let rt = runtime();
    let points: Vec<&str> = leasehold::FAILPOINTS
        .iter()
        .copied()
        .filter(|p| p.starts_with("upgrade.") || p.starts_with("downgrade."))
        .collect();
    assert!(points.len() >= 3, "{points:?}");
    for &strategy in common::strategies() {
        for point in &points {
            let dir = tempfile::tempdir().unwrap();
            let d = dir.path().to_str().unwrap();
            let way = if point.starts_with("upgrade.") {
                "up"
            } else {
                "down"
            };
            let mut child = kid(strategy, "crash_at", &[d, "catalog", point, way]);
            child.expect("acquired", Duration::from_secs(30));
            let status = child.wait(Duration::from_secs(10));
            assert!(
                !status.success(),
                "{strategy:?} {point}: the child did not die there"
            );
            let locker = parent_locker(dir.path(), strategy);
            let t0 = Instant::now();
            let writer = rt
                .block_on(locker.acquire_timeout("catalog", Duration::from_secs(2)))
                .unwrap_or_else(|e| panic!("{strategy:?} {point}: no writer within 2 s: {e}"));
            let took = t0.elapsed();
            drop(writer);
            let reader = rt
                .block_on(locker.acquire_shared_timeout("catalog", Duration::from_secs(2)))
                .unwrap();
            drop(reader);
            let up = rt
                .block_on(locker.acquire_upgradable_timeout("catalog", Duration::from_secs(2)))
                .unwrap();
            drop(rt.block_on(up.upgrade()).unwrap());
            eprintln!(
                "crash at {point} [{}]: a writer got in {took:?} after",
                layout_label(strategy)
            );
            // A new lock file or directory the crash left under its
            // private name goes once it has settled (2 s unchanged:
            // `clean` spares younger ones, their maker may be at work).
            let cleaned = eventually(Duration::from_secs(5), || {
                rt.block_on(locker.clean(false)).unwrap();
                entries(dir.path()).iter().all(|n| n.ends_with(".fence"))
            });
            assert!(
                cleaned,
                "{strategy:?} {point}: left behind: {:?}",
                entries(dir.path())
            );
        }
    }
}

// ------------------------------------------------ velocious, pi-research

/// How long one run of a seed's driver may take.
#[cfg(unix)]
const SEED_WITHIN: Duration = Duration::from_secs(30);

/// velocious (directory layout) and pi-research (`<name>.lock` files) run
/// their own code against the lock path, again and again, while a
/// leasehold process holds the upgradable place, upgrades past another
/// process's reader, holds the exclusive lock and downgrades: they never
/// get in. Once it is released, they do.
#[cfg(unix)]
#[test]
fn the_seeds_own_code_never_gets_in_during_an_upgrade() {
    if !node() {
        return;
    }
    for (seed, strategy, plain) in [
        ("seed1", Strategy::Directory, false),
        ("seed2", Strategy::ExclusiveFile, true),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();
        let (log, go, stop) = (
            dir.path().join("log"),
            dir.path().join("go"),
            dir.path().join("stop"),
        );
        let (l, g, s) = (
            log.to_str().unwrap(),
            go.to_str().unwrap(),
            stop.to_str().unwrap(),
        );
        let env: &[(&str, &str)] = if plain { &[(common::PLAIN_ENV, "1")] } else { &[] };
        let upgrader = ChildProc::spawn_env(strategy, "upgrader", &[d, "state", l, g], env);
        upgrader.expect("acquired", Duration::from_secs(30));
        let reader = ChildProc::spawn_env(strategy, "reader", &[d, "state", l, s], env);
        reader.expect("acquired", Duration::from_secs(30));
        // The seeds try throughout, in a thread, until told to stop.
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tries = std::thread::spawn({
            let (dir, done) = (dir.path().to_owned(), std::sync::Arc::clone(&done));
            move || {
                let mut outcomes = Vec::new();
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    let out = match seed {
                        "seed1" => seed_run(seed, &dir, "state", &["try"], SEED_WITHIN),
                        _ => seed_run(seed, &dir, "state", &["try_for", "300"], SEED_WITHIN),
                    };
                    outcomes.push(out.first().cloned().unwrap_or_default());
                }
                outcomes
            }
        });
        std::thread::sleep(Duration::from_millis(500));
        touch(&go.with_extension("1"));
        upgrader.expect("upgrading", Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(500));
        touch(&stop);
        upgrader.expect("upgraded", Duration::from_secs(10));
        upgrader.expect("downgraded", Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(500));
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        let outcomes = tries.join().unwrap();
        let got_in: Vec<&String> = outcomes
            .iter()
            .filter(|o| o.as_str() == "true" || o.starts_with("stole"))
            .collect();
        eprintln!(
            "{seed} during an upgrade: {} tries, outcomes {outcomes:?}",
            outcomes.len()
        );
        assert!(!outcomes.is_empty(), "{seed}: never tried");
        assert!(got_in.is_empty(), "{seed} got in during an upgrade: {outcomes:?}");
        touch(&go.with_extension("2"));
        let mut upgrader = upgrader;
        upgrader.expect("released", Duration::from_secs(10));
        upgrader.wait(Duration::from_secs(10));
        let after = match seed {
            "seed1" => seed_run(seed, dir.path(), "state", &["try"], SEED_WITHIN),
            _ => seed_run(seed, dir.path(), "state", &["try", "2000"], SEED_WITHIN),
        };
        assert_eq!(
            after.first().map(String::as_str),
            Some("true"),
            "{seed}: {after:?}"
        );
        let secs = sections(&log).0;
        let bad = overlaps(&secs);
        assert!(bad.is_empty(), "{seed}:\n{}", bad.join("\n"));
    }
}
