//! Attacks on withdrawn joins (tests/withdrawn_join.rs): a join refused once its record is in place
//! withdraws through `Member::withdraw`, which ends the group if nobody
//! else holds (under the mutation lock `admit` holds, or by dropping the
//! member armed so that it leaves as a holder does).
//!
//! - churn of semaphores and shared locks beside a slow process holding
//!   the name's mutation lock part of the time, and an exclusive
//!   acquisition that announces itself and gives up (so joins are
//!   refused both ways): never more holders than permits, never a permit
//!   beside the exclusive holder, no holder loses its lock, nothing left
//!   once all are gone, and no release of a never-held join logged as
//!   failed;
//! - a withdrawal whose leave is handed to the release thread while an
//!   upgrade turns the group into an exclusive lock: the upgraded lock
//!   stays;
//! - a withdrawal's group end that counts a joiner come meanwhile, and a
//!   cancelled acquisition whose join withdraws: the group still ends;
//! - files put into a members directory without the mutation lock while
//!   the group ends (a leaver's re-signed marker under a `.tmp-` name, a
//!   join whose record fails): no empty members directory and no
//!   `.trash-` directory left, and the tidy that removes them costs a
//!   joiner of a newer group nothing.
//!
//! Its own test binary: failpoints are process-wide.
#![cfg(all(feature = "failpoints", target_os = "linux"))]

#[path = "support/common.rs"]
mod common;

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{MutationLock, Step, hold_mutation_lock, members_of, mutex_of, patient_locker};
use leasehold::{LockGuard, Locker, Strategy};

/// The tests share process-wide failpoints: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// WARN events seen by any thread (the release thread included).
static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Warnings;

struct Message<'a>(&'a mut String);

impl tracing::field::Visit for Message<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={value:?} ", field.name()));
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        // Warnings, and the debug line of a withdrawal that could not end
        // its group (src/fs/group/member.rs).
        *metadata.level() <= tracing::Level::WARN || metadata.target().ends_with("group::member")
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut line = String::new();
        event.record(&mut Message(&mut line));
        if *event.metadata().level() <= tracing::Level::WARN || line.contains("withdrawn join") {
            WARNINGS.lock().unwrap().push(line);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn record_warnings() {
    let _ = tracing::subscriber::set_global_default(Warnings);
}

async fn reached(step: &Arc<Step>) -> bool {
    let step = Arc::clone(step);
    tokio::task::spawn_blocking(move || step.wait()).await.unwrap()
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Shared,
    Permits(u32),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_joins_beside_a_slow_change_keep_the_promise_and_leave_nothing() {
    let _serial = SERIAL.lock().await;
    record_warnings();
    let mut failures = Vec::new();
    for &strategy in common::strategies() {
        for kind in [Kind::Permits(1), Kind::Permits(2), Kind::Shared] {
            let what = format!("{strategy:?} {kind:?}");
            let root = tempfile::tempdir().unwrap();
            let dir = root.path().to_owned();
            let quick = |dir: &Path| {
                Locker::builder()
                    .directory(dir)
                    .strategy(strategy)
                    .lease(Duration::from_secs(2))
                    .renew_interval(Duration::from_millis(200))
                    .build()
                    .unwrap()
            };
            let main = quick(&dir);
            let path = main.lock_path("pool").unwrap();
            let members = members_of(&path);
            let limit = match kind {
                Kind::Shared => usize::MAX,
                Kind::Permits(n) => n as usize,
            };
            let holders = Arc::new(AtomicUsize::new(0));
            let exclusive = Arc::new(AtomicUsize::new(0));
            let most = Arc::new(AtomicUsize::new(0));
            let both = Arc::new(AtomicBool::new(false));
            let taken = Arc::new(AtomicUsize::new(0));
            let lost = Arc::new(Mutex::new(Vec::<String>::new()));
            let stop = Arc::new(AtomicBool::new(false));
            WARNINGS.lock().unwrap().clear();
            // Member records made (every join that got as far as its
            // record) and joins without the mutation lock that did: those
            // made and not taken were withdrawn.
            let records = Arc::new(AtomicUsize::new(0));
            let unlocked = Arc::new(AtomicUsize::new(0));
            {
                let records = Arc::clone(&records);
                fail::cfg_callback("group.record.after_rename", move || {
                    records.fetch_add(1, SeqCst);
                })
                .unwrap();
                let unlocked = Arc::clone(&unlocked);
                fail::cfg_callback("unlocked.join.after_record", move || {
                    unlocked.fetch_add(1, SeqCst);
                })
                .unwrap();
            }
            let chaos = {
                let stop = Arc::clone(&stop);
                let mutex = mutex_of(&path);
                std::thread::spawn(move || {
                    let mut n: u64 = 3;
                    while !stop.load(SeqCst) {
                        n = n
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        hold_mutation_lock(&mutex, Duration::from_micros((n >> 33) % 4000));
                        std::thread::sleep(Duration::from_micros((n >> 40) % 2000));
                    }
                })
            };
            let deadline = Instant::now() + Duration::from_millis(2500);
            let mut tasks = Vec::new();
            for i in 0..6 {
                let locker = quick(&dir);
                let (holders, exclusive, most, both, taken, lost) = (
                    Arc::clone(&holders),
                    Arc::clone(&exclusive),
                    Arc::clone(&most),
                    Arc::clone(&both),
                    Arc::clone(&taken),
                    Arc::clone(&lost),
                );
                tasks.push(tokio::spawn(async move {
                    while Instant::now() < deadline {
                        if i == 0 {
                            // An exclusive acquisition that announces
                            // itself, and mostly gives up (cancelled).
                            let got =
                                tokio::time::timeout(Duration::from_millis(4), locker.acquire("pool")).await;
                            let Ok(got) = got else {
                                tokio::time::sleep(Duration::from_millis(3)).await;
                                continue;
                            };
                            let guard = got.unwrap();
                            exclusive.fetch_add(1, SeqCst);
                            if holders.load(SeqCst) > 0 {
                                both.store(true, SeqCst);
                            }
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            if holders.load(SeqCst) > 0 {
                                both.store(true, SeqCst);
                            }
                            exclusive.fetch_sub(1, SeqCst);
                            let _ = guard.release().await;
                            tokio::time::sleep(Duration::from_millis(3)).await;
                            continue;
                        }
                        let got = match kind {
                            Kind::Shared => locker.try_acquire_shared("pool").await,
                            Kind::Permits(n) => locker.semaphore("pool", n).unwrap().try_acquire().await,
                        };
                        let guard = match got {
                            Ok(Some(guard)) => guard,
                            Ok(None) => {
                                tokio::time::sleep(Duration::from_micros(500)).await;
                                continue;
                            }
                            Err(e) => {
                                lost.lock().unwrap().push(format!("acquire: {e}"));
                                continue;
                            }
                        };
                        let now = holders.fetch_add(1, SeqCst) + 1;
                        most.fetch_max(now, SeqCst);
                        if exclusive.load(SeqCst) > 0 {
                            both.store(true, SeqCst);
                        }
                        taken.fetch_add(1, SeqCst);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        if exclusive.load(SeqCst) > 0 {
                            both.store(true, SeqCst);
                        }
                        holders.fetch_sub(1, SeqCst);
                        if guard.is_lost() {
                            lost.lock().unwrap().push("lost while held".to_owned());
                        }
                        if i % 2 == 0 {
                            if let Err(e) = guard.release().await {
                                lost.lock().unwrap().push(format!("release: {e}"));
                            }
                        } else {
                            drop(guard);
                        }
                    }
                }));
            }
            for task in tasks {
                task.await.unwrap();
            }
            stop.store(true, SeqCst);
            chaos.join().unwrap();
            // Everybody gone: the name must be free, nothing left of it.
            let until = Instant::now() + Duration::from_secs(10);
            while (path.exists() || members.exists()) && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if path.exists() || members.exists() {
                let inside = if members.is_dir() {
                    common::entries(&members)
                } else {
                    Vec::new()
                };
                failures.push(format!(
                    "{what}: left behind with nobody holding in {dir:?}: {:?}, in the members directory {inside:?}",
                    common::entries(&dir)
                ));
            }
            let lost = lost.lock().unwrap().clone();
            if !lost.is_empty() {
                failures.push(format!(
                    "{what}: {} losses/errors: {:?}",
                    lost.len(),
                    &lost[..lost.len().min(3)]
                ));
            }
            let most = most.load(SeqCst);
            if most > limit {
                failures.push(format!("{what}: {most} holders at once"));
            }
            if both.load(SeqCst) {
                failures.push(format!("{what}: a sharer and the exclusive holder at once"));
            }
            if taken.load(SeqCst) < 10 {
                failures.push(format!("{what}: only {taken:?} taken"));
            }
            // Releases left to the release thread finish before the
            // directory goes (else they fail, and say so).
            tokio::time::sleep(Duration::from_millis(500)).await;
            let warnings = WARNINGS.lock().unwrap().clone();
            if !warnings.is_empty() {
                failures.push(format!(
                    "{what}: {} warnings: {:?}",
                    warnings.len(),
                    &warnings[..warnings.len().min(3)]
                ));
            }
            fail::remove("group.record.after_rename");
            fail::remove("unlocked.join.after_record");
            let (records, unlocked, taken) =
                (records.load(SeqCst), unlocked.load(SeqCst), taken.load(SeqCst));
            eprintln!(
                "{what}: {taken} taken, at most {most} at once; {records} records made ({unlocked} without the mutation lock): {} withdrawn",
                records.saturating_sub(taken)
            );
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A failpoint that stops its first caller until `go_on`: `at` is
/// reached when it got there.
fn pause_once(point: &'static str) -> (Arc<Step>, Arc<Step>) {
    let (at, go_on) = (Arc::new(Step::default()), Arc::new(Step::default()));
    let once = Arc::new(AtomicBool::new(true));
    let (at2, go_on2) = (Arc::clone(&at), Arc::clone(&go_on));
    fail::cfg_callback(point, move || {
        if once.swap(false, SeqCst) {
            at2.reach();
            go_on2.wait();
        }
    })
    .unwrap();
    (at, go_on)
}

/// An upgrade turns a group into its exclusive lock while a joiner that
/// passed its first look (without the mutation lock) puts its record in
/// place after the upgrade counted, and counts once the upgrader's record
/// is gone: it finds nobody live and the marker replaced, withdraws, and
/// its leave (dropped armed: without the lock first, the upgrade has it,
/// then on the release thread) ends "the group" once it has the mutation
/// lock. The upgraded lock must stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_withdrawal_beside_an_upgrade_leaves_the_upgraded_lock_alone() {
    let _serial = SERIAL.lock().await;
    let mut failures = Vec::new();
    for &strategy in common::strategies() {
        let what = format!("{strategy:?}");
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().to_owned();
        let fenced = |dir: &Path| {
            Locker::builder()
                .directory(dir)
                .strategy(strategy)
                .fencing(true)
                .lease(Duration::from_secs(20))
                .renew_interval(Duration::from_secs(5))
                .build()
                .unwrap()
        };
        let upgrader = fenced(&dir);
        let joiner = fenced(&dir);
        let path = upgrader.lock_path("job").unwrap();
        let members = members_of(&path);
        let mutex = mutex_of(&path);
        let up = upgrader.acquire_upgradable("job").await.unwrap();

        // The joiner joins without the mutation lock (a slow process has
        // it) and stops once its first look passed, before its record.
        let mutation = MutationLock::take(&mutex).unwrap();
        let (looked, record_on) = pause_once("unlocked.join.before_record");
        let (in_place, count_on) = pause_once("unlocked.join.after_record");
        let joining = tokio::spawn(async move {
            let got = joiner.try_acquire_shared("job").await;
            (joiner, got)
        });
        assert!(reached(&looked).await, "{what}: the joiner never looked");
        drop(mutation);

        // The upgrade seals and counts (alone), and stops.
        let (counted, replace_on) = pause_once("upgrade.before_rewrite");
        let (at_tokens, upgrade_on) = pause_once("upgrade.before_tokens");
        let upgrading = tokio::spawn(async move { up.upgrade().await });
        assert!(reached(&counted).await, "{what}: the upgrade never counted");

        // The joiner's record goes in after that count.
        record_on.reach();
        assert!(reached(&in_place).await, "{what}: no record");
        // The upgrade replaces the marker, removes its own record and its
        // seal (the members directory stays: the joiner's record is in
        // it), and stops before its tokens, under the mutation lock.
        replace_on.reach();
        assert!(
            reached(&at_tokens).await,
            "{what}: the upgrade never got to its tokens"
        );

        // The joiner counts nobody live, finds the marker replaced and
        // withdraws; its leave goes without the lock first.
        let unlocked_leaves = Arc::new(AtomicUsize::new(0));
        {
            let unlocked_leaves = Arc::clone(&unlocked_leaves);
            fail::cfg_callback("unlocked.leave.after_unlink", move || {
                unlocked_leaves.fetch_add(1, SeqCst);
            })
            .unwrap();
        }
        count_on.reach();
        let (joiner, got) = tokio::time::timeout(Duration::from_secs(20), joining)
            .await
            .expect("the join ends")
            .unwrap();
        let got = got.unwrap();
        if got.is_some() {
            failures.push(format!("{what}: joined a group being upgraded"));
        }
        fail::remove("unlocked.leave.after_unlink");
        if unlocked_leaves.load(SeqCst) == 0 {
            failures.push(format!(
                "{what}: (setup) the withdrawal did not leave as a holder does"
            ));
        }
        upgrade_on.reach();
        let exclusive = tokio::time::timeout(Duration::from_secs(20), upgrading)
            .await
            .expect("the upgrade ends")
            .unwrap()
            .unwrap();
        for point in [
            "unlocked.join.before_record",
            "unlocked.join.after_record",
            "upgrade.before_rewrite",
            "upgrade.before_tokens",
        ] {
            fail::remove(point);
        }
        // Whatever the withdrawal left to the release thread is done by
        // now.
        tokio::time::sleep(Duration::from_millis(500)).await;
        if exclusive.is_lost() || !path.exists() {
            failures.push(format!(
                "{what}: the upgraded lock is gone ({:?})",
                common::entries(&dir)
            ));
        }
        if joiner.try_acquire_shared("job").await.unwrap().is_some() {
            failures.push(format!("{what}: a sharer joined beside the upgraded holder"));
        }
        if members.exists() {
            failures.push(format!(
                "{what}: the members directory stayed beside the exclusive lock: {:?}",
                common::entries(&members)
            ));
        }
        exclusive.release().await.unwrap();
        drop(got);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A withdrawal whose leave ends the group (no live member at its count,
/// done on the release thread once the mutation lock is free) while
/// another joiner joins without that lock, between the withdrawer's
/// count and its seal: that joiner is counted under the seal, keeps its
/// lock, and the marker stays until it leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_withdrawals_group_end_counts_a_joiner_that_came_meanwhile() {
    let _serial = SERIAL.lock().await;
    let mut failures = Vec::new();
    for &strategy in common::strategies() {
        let what = format!("{strategy:?}");
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().to_owned();
        let locker = |dir: &Path| patient_locker(dir, strategy);
        let (holder, withdrawer, late) = (locker(&dir), locker(&dir), locker(&dir));
        let held = holder.acquire_shared("job").await.unwrap();
        let path = holder.lock_path("job").unwrap();
        let members = members_of(&path);
        let mutex = mutex_of(&path);

        // A slow process has the mutation lock: the withdrawer joins
        // without it and stops with its record in place.
        let mutation = MutationLock::take(&mutex).unwrap();
        let (in_place, go_on) = (Arc::new(Step::default()), Arc::new(Step::default()));
        let once = Arc::new(AtomicBool::new(true));
        {
            let (in_place, go_on, once) = (in_place.clone(), go_on.clone(), once.clone());
            fail::cfg_callback("unlocked.join.after_record", move || {
                if once.swap(false, SeqCst) {
                    in_place.reach();
                    go_on.wait();
                }
            })
            .unwrap();
        }
        let joining = tokio::spawn(async move {
            let got = withdrawer.try_acquire_shared("job").await;
            (withdrawer, got)
        });
        assert!(reached(&in_place).await, "{what}: no record");
        // The holder leaves without the mutation lock, counting it.
        held.release().await.unwrap();
        // A seal (the slow process ends the group, as it would): the
        // withdrawer withdraws, finds nobody, and its leave waits for the
        // mutation lock (the release thread).
        let seal_path = members.join("sealed");
        let seal = File::create(&seal_path).unwrap();
        seal.lock().unwrap();
        go_on.reach();
        let (_withdrawer, got) = tokio::time::timeout(Duration::from_secs(20), joining)
            .await
            .expect("the join ends")
            .unwrap();
        fail::remove("unlocked.join.after_record");
        if got.unwrap().is_some() {
            failures.push(format!("{what}: joined a sealed group"));
        }

        // The withdrawal's leave stops before it seals, holding the
        // mutation lock.
        let (at_seal, seal_on) = (Arc::new(Step::default()), Arc::new(Step::default()));
        let seal_once = Arc::new(AtomicBool::new(true));
        {
            let (at_seal, seal_on, seal_once) = (at_seal.clone(), seal_on.clone(), seal_once.clone());
            fail::cfg_callback("group.seal.before_create", move || {
                if seal_once.swap(false, SeqCst) {
                    at_seal.reach();
                    seal_on.wait();
                }
            })
            .unwrap();
        }
        drop(seal);
        std::fs::remove_file(&seal_path).unwrap();
        drop(mutation);
        if !reached(&at_seal).await {
            failures.push(format!("{what}: the withdrawal never ended the group"));
            fail::remove("group.seal.before_create");
            continue;
        }
        // Meanwhile another joins, without the mutation lock (the
        // withdrawal's leave has it): the group stands (its marker's
        // lease is fresh), deserted; it signs the marker.
        let joined = tokio::time::timeout(Duration::from_secs(20), late.try_acquire_shared("job"))
            .await
            .expect("the late join ends")
            .unwrap();
        seal_on.reach();
        tokio::time::sleep(Duration::from_millis(300)).await;
        fail::remove("group.seal.before_create");
        let Some(joined) = joined else {
            failures.push(format!("{what}: (setup) the late join was refused"));
            continue;
        };
        if joined.is_lost() || !path.exists() {
            failures.push(format!(
                "{what}: the late joiner's group was ended under it: {:?}",
                common::entries(&dir)
            ));
        }
        // Another leasehold look agrees the name is held.
        if holder.try_acquire("job").await.unwrap().is_some() {
            failures.push(format!("{what}: taken exclusively beside the late joiner"));
        }
        joined.release().await.unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        while (path.exists() || members.exists()) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if path.exists() || members.exists() {
            failures.push(format!("{what}: left behind: {:?}", common::entries(&dir)));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The same withdrawal as tests/withdrawn_join.rs's first, with the
/// acquisition cancelled while its join (on the blocking pool) stops with
/// its record in place: the join still withdraws, and the group still
/// ends once nobody holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_acquisition_whose_join_withdraws_still_ends_the_group() {
    let _serial = SERIAL.lock().await;
    let mut failures = Vec::new();
    for &strategy in common::strategies() {
        let what = format!("{strategy:?}");
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().to_owned();
        let locker = |dir: &Path| patient_locker(dir, strategy);
        let (holder, joiner) = (locker(&dir), locker(&dir));
        let held = holder.semaphore("job", 2).unwrap().acquire().await.unwrap();
        let path = holder.lock_path("job").unwrap();
        let members = members_of(&path);
        let mutex = mutex_of(&path);
        let mutation = MutationLock::take(&mutex).unwrap();
        let (in_place, go_on) = pause_once("unlocked.join.after_record");
        let joining = tokio::spawn(async move {
            let semaphore = joiner.semaphore("job", 2).unwrap();
            let got = tokio::time::timeout(Duration::from_millis(200), semaphore.acquire()).await;
            (joiner, got.is_err())
        });
        assert!(reached(&in_place).await, "{what}: no record");
        // Cancelled while its join is stopped.
        let (_joiner, cancelled) = joining.await.unwrap();
        if !cancelled {
            failures.push(format!("{what}: (setup) the acquisition was not cancelled"));
        }
        held.release().await.unwrap();
        let seal_path = members.join("sealed");
        let seal = File::create(&seal_path).unwrap();
        seal.lock().unwrap();
        go_on.reach();
        // The join, on the blocking pool, withdraws.
        let until = Instant::now() + Duration::from_secs(10);
        while members.exists()
            && std::fs::read_dir(&members)
                .map(|d| {
                    d.flatten()
                        .any(|e| e.file_name().to_string_lossy().starts_with("m-"))
                })
                .unwrap_or(false)
            && Instant::now() < until
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        fail::remove("unlocked.join.after_record");
        drop(seal);
        std::fs::remove_file(&seal_path).unwrap();
        drop(mutation);
        let until = Instant::now() + Duration::from_secs(10);
        while (path.exists() || members.exists()) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if path.exists() || members.exists() {
            failures.push(format!(
                "{what}: left behind with nobody holding: {:?}",
                common::entries(&dir)
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A holder that leaves while another process has the name's mutation
/// lock re-signs its group's marker for the holder left (the directory
/// layout: a record written under a private `.tmp-` name in the members
/// directory, then renamed over the marker's `owner.json`). If that
/// holder ends the group in between, its removal of the members directory
/// fails on the private name; once the signer's rename fails and the
/// private name goes, the members directory is empty, and must go too.
/// (Seen in the churn above with several copies of it at once: an empty
/// members directory left with nobody holding.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_signer_cut_off_by_the_groups_end_leaves_no_members_directory() {
    let _serial = SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().to_owned();
    let locker = |dir: &Path| patient_locker(dir, Strategy::Directory);
    let (one, two) = (locker(&dir), locker(&dir));
    let (second, leaving, go_on) = a_signer_stopped_before_its_rename(&one, &two).await;
    let path = one.lock_path("job").unwrap();
    let members = members_of(&path);
    // The last holder ends the group meanwhile.
    second.release().await.unwrap();
    assert!(!path.exists(), "the group did not end");
    go_on.reach();
    leaving.join().unwrap();
    fail::remove("group.sign.before_rename");
    let until = Instant::now() + Duration::from_secs(10);
    while members.exists() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !members.exists(),
        "left behind with nobody holding: {:?}, in the members directory {:?}",
        common::entries(&dir),
        common::entries(&members)
    );
}

/// `one` and `two` hold `job` shared (the directory layout), and `one`'s
/// guard is dropped on a thread of its own while the test holds the
/// name's mutation lock: it re-signs the marker for `two` without the
/// lock, under a `.tmp-` name in the members directory, and stops before
/// its rename (`group.sign.before_rename`, which the caller removes).
/// Returns `two`'s guard, that thread, and the step that lets it go on.
async fn a_signer_stopped_before_its_rename(
    one: &Locker,
    two: &Locker,
) -> (LockGuard, std::thread::JoinHandle<()>, Arc<Step>) {
    let first = one.acquire_shared("job").await.unwrap();
    let second = two.acquire_shared("job").await.unwrap();
    let path = one.lock_path("job").unwrap();
    let mutation = MutationLock::take(&mutex_of(&path)).unwrap();
    let (at_rename, rename) = pause_once("group.sign.before_rename");
    let leaving = std::thread::spawn(move || drop(first));
    assert!(reached(&at_rename).await, "the leaver did not sign the marker");
    drop(mutation);
    (second, leaving, rename)
}

/// A join without the mutation lock (another process has it) whose
/// record fails to be made once its private `.tmp-` name is in the
/// members directory (an I/O error: the record's rename, here) removes
/// that name and reports the error. If the group's last holder ended the
/// group in between, its removal of the members directory failed on that
/// name, and the members directory, empty once the joiner's name goes,
/// must go too (as a marker's signer's does, above).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_join_without_the_mutation_lock_that_fails_leaves_no_members_directory() {
    let _serial = SERIAL.lock().await;
    let mut failures = Vec::new();
    for &strategy in common::strategies() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().to_owned();
        let locker = |dir: &Path| patient_locker(dir, strategy);
        let (one, two) = (locker(&dir), locker(&dir));
        let first = one.acquire_shared("job").await.unwrap();
        let path = one.lock_path("job").unwrap();
        let members = members_of(&path);
        let mutation = MutationLock::take(&mutex_of(&path)).unwrap();
        let (at_rename, go_on) = pause_once("group.record.before_rename");
        // Joins without the mutation lock, and stops with its private
        // name in the members directory.
        let joining = tokio::spawn(async move {
            let joined = tokio::time::timeout(Duration::from_secs(30), two.acquire_shared("job")).await;
            (two, joined)
        });
        assert!(
            reached(&at_rename).await,
            "{strategy:?}: the joiner made no record"
        );
        // Its record's making fails from now on (after the rename).
        fail::cfg("group.record.after_rename", "return").unwrap();
        drop(mutation);
        // The last holder ends the group meanwhile.
        first.release().await.unwrap();
        assert!(!path.exists(), "{strategy:?}: the group did not end");
        go_on.reach();
        let (two, joined) = joining.await.unwrap();
        fail::remove("group.record.before_rename");
        fail::remove("group.record.after_rename");
        match joined {
            // The error injected, as the join reports it.
            Ok(Err(_)) => {}
            Ok(Ok(guard)) => {
                failures.push(format!("{strategy:?}: the join did not fail"));
                guard.release().await.unwrap();
            }
            Err(_) => failures.push(format!("{strategy:?}: the join never ended")),
        }
        drop(two);
        let until = Instant::now() + Duration::from_secs(10);
        while members.exists() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if members.exists() {
            failures.push(format!(
                "{strategy:?}: left behind with nobody holding: {:?}, in the members directory {:?}",
                common::entries(&dir),
                common::entries(&members)
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A signer stopped before its rename while the group's last holder ends
/// the group and retires its marker directory (moved to a `.trash-`
/// name, its `owner.json` unlinked, not yet removed): the signer's rename
/// lands in that directory, through the descriptor it found it by. The
/// retiring holder's removal fails on it once, empties the directory
/// again and removes it: nothing is left, neither the trash nor the
/// members directory (the signer tidies that one).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_signers_rename_into_a_retired_marker_leaves_no_trash() {
    let _serial = SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().to_owned();
    let locker = |dir: &Path| patient_locker(dir, Strategy::Directory);
    let (one, two) = (locker(&dir), locker(&dir));
    let (second, leaving, rename) = a_signer_stopped_before_its_rename(&one, &two).await;
    let path = one.lock_path("job").unwrap();
    let members = members_of(&path);
    // The last holder ends the group, and stops with its marker retired
    // and emptied, before its removal.
    let (at_remove, remove) = pause_once("dir.remove.after_unlink_owner");
    let ending = tokio::spawn(async move { second.release().await });
    assert!(
        reached(&at_remove).await,
        "the group's end did not retire its marker"
    );
    let trash = || -> Vec<String> {
        common::entries(&dir)
            .into_iter()
            .filter(|n| n.contains(".trash-"))
            .collect()
    };
    assert_eq!(trash().len(), 1, "{:?}", common::entries(&dir));
    rename.reach();
    leaving.join().unwrap();
    // The signer's record is in the retired directory now.
    let landed = trash().iter().any(|t| dir.join(t).join("owner.json").exists());
    remove.reach();
    let ended = tokio::time::timeout(Duration::from_secs(30), ending).await;
    fail::remove("group.sign.before_rename");
    fail::remove("dir.remove.after_unlink_owner");
    assert!(
        landed,
        "the signer's rename did not land in the retired marker: {:?}",
        trash()
    );
    assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
    let until = Instant::now() + Duration::from_secs(10);
    while (members.exists() || !trash().is_empty()) && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !members.exists() && trash().is_empty(),
        "left behind with nobody holding: {:?}",
        common::entries(&dir)
    );
}

/// A cut-off signer's tidy (deferred: the mutation lock was busy) runs
/// while a newer group of the name stands deserted: its last holder
/// stopped while leaving without the mutation lock (its record gone), and
/// a joiner without that lock stopped before its record, past its look
/// at the (empty) members directory. The tidy removes that directory,
/// which is empty. Then the joiner's record cannot be made there: no
/// error, it tries again and holds (ending the deserted group first); the
/// stopped leaver then ends nothing of the joiner's; nothing is left once
/// the joiner lets go.
/// Both orders of the two stopped processes going on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_signers_tidy_beside_a_deserted_group_and_its_joiner_costs_nobody_anything() {
    let _serial = SERIAL.lock().await;
    record_warnings();
    for leaver_first in [false, true] {
        signers_tidy_beside_a_deserted_group(leaver_first).await;
    }
}

async fn signers_tidy_beside_a_deserted_group(leaver_first: bool) {
    WARNINGS.lock().unwrap().clear();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().to_owned();
    let locker = |dir: &Path| patient_locker(dir, Strategy::Directory);
    let (one, two, three, four) = (locker(&dir), locker(&dir), locker(&dir), locker(&dir));
    let (second, signing, rename) = a_signer_stopped_before_its_rename(&one, &two).await;
    let path = one.lock_path("job").unwrap();
    let members = members_of(&path);
    // The first group ends; the members directory stays (the private
    // name); a second group starts in it.
    second.release().await.unwrap();
    assert!(!path.exists(), "the first group did not end");
    let third = three.acquire_shared("job").await.unwrap();
    assert!(path.exists(), "the second group did not start");
    let mutation = MutationLock::take(&mutex_of(&path)).unwrap();
    // Its last holder leaves without the mutation lock, and stops with its
    // record gone: the group stands, deserted.
    let (at_leave, leave) = pause_once("unlocked.leave.after_unlink");
    let leaving = std::thread::spawn(move || drop(third));
    assert!(
        reached(&at_leave).await,
        "the last holder did not leave without the lock"
    );
    // A joiner without the mutation lock stops before its record.
    let (at_record, record) = pause_once("unlocked.join.before_record");
    let joining = tokio::spawn(async move {
        let joined = tokio::time::timeout(Duration::from_secs(30), four.acquire_shared("job")).await;
        (four, joined)
    });
    assert!(
        reached(&at_record).await,
        "the joiner did not join without the lock"
    );
    // The signer goes on: its rename fails (its marker is gone), its
    // private name goes, and its tidy waits for the mutation lock on the
    // release thread.
    rename.reach();
    signing.join().unwrap();
    assert!(
        members.exists() && common::entries(&members).is_empty(),
        "{:?}",
        common::entries(&members)
    );
    drop(mutation);
    let until = Instant::now() + Duration::from_secs(10);
    while members.exists() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let removed = !members.exists();
    let standing = path.exists();
    let mut leaving = Some(leaving);
    let mut go_on_leaving = || {
        leave.reach();
        leaving.take().unwrap().join().unwrap();
    };
    if leaver_first {
        go_on_leaving();
    }
    record.reach();
    let (four, joined) = joining.await.unwrap();
    if !leaver_first {
        go_on_leaving();
    }
    fail::remove("group.sign.before_rename");
    fail::remove("unlocked.leave.after_unlink");
    fail::remove("unlocked.join.before_record");
    let order = if leaver_first {
        "leaver first"
    } else {
        "joiner first"
    };
    assert!(
        removed,
        "{order}: the tidy did not remove the empty members directory"
    );
    assert!(standing, "{order}: the deserted group did not stand");
    let fourth = match joined {
        Ok(Ok(guard)) => guard,
        other => panic!("{order}: the joiner did not hold: {other:?}"),
    };
    // The stopped leaver's end comes and goes; the joiner still holds.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        fourth.ensure_held().await.is_ok(),
        "{order}: the joiner lost its lock"
    );
    assert!(
        members.exists() && path.exists(),
        "{order}: {:?}",
        common::entries(&dir)
    );
    fourth.release().await.unwrap();
    drop(four);
    let until = Instant::now() + Duration::from_secs(10);
    while (members.exists() || path.exists()) && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !members.exists() && !path.exists(),
        "{order}: left behind with nobody holding: {:?}",
        common::entries(&dir)
    );
    let warnings = WARNINGS.lock().unwrap().clone();
    assert!(warnings.is_empty(), "{order}: {warnings:#?}");
}
