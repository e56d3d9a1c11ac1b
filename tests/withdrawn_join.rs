//! A join refused once its record is in place withdraws that record. If
//! the group's last holder left meanwhile, having counted that record as
//! a holder (so leaving the group standing for it), the withdrawal must
//! end the group: otherwise the name's marker stays at the lock path with
//! nobody holding it, for good. Found under Wine by
//! tests/attack_shared2.rs, which saw a semaphore's marker left behind
//! about one run in six.
//!
//! The test plays a process that is slow while it changes the name: it
//! holds the name's mutation lock (so the holder leaves and the joiner
//! joins without it) and seals the members directory while the joiner's
//! record is in place (as the group's end does), which makes the joiner
//! withdraw. Its own test binary: failpoints are process-wide.
#![cfg(feature = "failpoints")]

#[path = "support/common.rs"]
mod common;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{MutationLock, Step, frozen_flock, members_of, mutex_of, patient_locker};
use leasehold::{LockGuard, Locker};

/// The tests share process-wide failpoints: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[derive(Clone, Copy, Debug)]
enum Kind {
    Shared,
    Permit,
}

impl Kind {
    async fn acquire(self, locker: &Locker) -> LockGuard {
        match self {
            Kind::Shared => locker.acquire_shared("job").await.unwrap(),
            Kind::Permit => locker.semaphore("job", 2).unwrap().acquire().await.unwrap(),
        }
    }

    async fn try_acquire(self, locker: &Locker) -> Option<LockGuard> {
        match self {
            Kind::Shared => locker.try_acquire_shared("job").await.unwrap(),
            Kind::Permit => locker.semaphore("job", 2).unwrap().try_acquire().await.unwrap(),
        }
    }
}

/// The lock path of the only name in `dir`.
fn lock_path(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "lock"))
        .expect("the name's lock path")
}

/// The holders' records in a members directory.
fn records(members: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(members) else {
        return Vec::new();
    };
    entries
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("m-") && n.ends_with(".json"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_join_withdrawn_after_the_last_holder_counted_it_ends_the_group() {
    let _serial = SERIAL.lock().await;
    for &strategy in common::strategies() {
        for kind in [Kind::Shared, Kind::Permit] {
            let root = tempfile::tempdir().unwrap();
            let dir = root.path().to_owned();
            let holder = patient_locker(&dir, strategy);
            let joiner = patient_locker(&dir, strategy);
            let held = kind.acquire(&holder).await;
            let path = lock_path(&dir);
            let members = members_of(&path);

            // A process slow while it changes the name holds its mutation
            // lock: the holder leaves, and the joiner joins, without it.
            let mutation = frozen_flock(&mutex_of(&path));

            // The joiner stops once its record is in place, until the
            // holder has left (counting it) and the group is sealed.
            let in_place = Arc::new(Step::default());
            let go_on = Arc::new(Step::default());
            let stopped = Arc::new(AtomicBool::new(false));
            {
                let (in_place, go_on, stopped) = (in_place.clone(), go_on.clone(), stopped.clone());
                fail::cfg_callback("unlocked.join.after_record", move || {
                    if !stopped.swap(true, SeqCst) {
                        in_place.reach();
                        go_on.wait();
                    }
                })
                .unwrap();
            }
            let joining = tokio::spawn(async move {
                let got = kind.try_acquire(&joiner).await;
                (joiner, got)
            });
            let reached = tokio::task::spawn_blocking({
                let in_place = in_place.clone();
                move || in_place.wait()
            })
            .await
            .unwrap();
            assert!(
                reached,
                "{strategy:?} {kind:?}: the joiner never put its record in place"
            );
            let joiner_record = records(&members);
            assert_eq!(joiner_record.len(), 2, "{strategy:?} {kind:?}: holder and joiner");

            // The holder leaves without the mutation lock: it counts the
            // joiner's record as a holder, so the group is not its to end.
            assert!(!held.is_lost());
            held.release().await.unwrap();
            assert_eq!(
                records(&members).len(),
                1,
                "{strategy:?} {kind:?}: the holder left"
            );

            // The slow process seals the members directory (as ending the
            // group does): the joiner, looking again, withdraws.
            let seal_path = members.join("sealed");
            let seal = File::create(&seal_path).unwrap();
            seal.lock().unwrap();
            go_on.reach();
            let (joiner, got) = tokio::time::timeout(Duration::from_secs(20), joining)
                .await
                .expect("the joiner's attempt ends")
                .unwrap();
            fail::remove("unlocked.join.after_record");
            assert!(
                got.is_none(),
                "{strategy:?} {kind:?}: a sealed group is not joined"
            );
            assert!(
                records(&members).is_empty(),
                "{strategy:?} {kind:?}: the joiner withdrew"
            );

            // The slow process is done: its seal goes, then its mutation
            // lock (as leasehold lets them go).
            drop(seal);
            std::fs::remove_file(&seal_path).unwrap();
            drop(mutation);

            // Nobody holds the name: its marker must go.
            let until = Instant::now() + Duration::from_secs(10);
            while path.exists() && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(
                !path.exists(),
                "{strategy:?} {kind:?}: the marker was left behind with nobody holding the name"
            );
            // And the name is free.
            let taken = joiner.try_acquire("job").await.unwrap();
            assert!(taken.is_some(), "{strategy:?} {kind:?}: the name is free");
        }
    }
}

/// The same under the mutation lock: a join that finds room puts its
/// record in place, the last holder leaves without the lock (counting
/// that record), and an exclusive acquisition announces itself before the
/// joiner counts again, which refuses it.
// The test's announcement is flocked as a whole file; Windows' byte-range
// locks are mandatory, so that would stop the joiner reading it
// (leasehold locks a byte past any record there).
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_join_refused_under_the_mutation_lock_after_the_last_holder_counted_it_ends_the_group() {
    let _serial = SERIAL.lock().await;
    for &strategy in common::strategies() {
        for kind in [Kind::Shared, Kind::Permit] {
            let root = tempfile::tempdir().unwrap();
            let dir = root.path().to_owned();
            let holder = patient_locker(&dir, strategy);
            let joiner = patient_locker(&dir, strategy);
            let held = kind.acquire(&holder).await;
            let path = lock_path(&dir);
            let members = members_of(&path);
            let holder_record = records(&members);
            assert_eq!(holder_record.len(), 1);
            let holder_bytes = std::fs::read(members.join(&holder_record[0])).unwrap();

            // The joiner stops once its record is in place (holding the
            // mutation lock), until the holder has left and a waiter came.
            let in_place = Arc::new(Step::default());
            let go_on = Arc::new(Step::default());
            let armed = Arc::new(AtomicBool::new(true));
            {
                let (in_place, go_on, armed) = (in_place.clone(), go_on.clone(), armed.clone());
                fail::cfg_callback("group.record.after_rename", move || {
                    if armed.swap(false, SeqCst) {
                        in_place.reach();
                        go_on.wait();
                    }
                })
                .unwrap();
            }
            let joining = tokio::spawn(async move {
                let got = kind.try_acquire(&joiner).await;
                (joiner, got)
            });
            let reached = tokio::task::spawn_blocking({
                let in_place = in_place.clone();
                move || in_place.wait()
            })
            .await
            .unwrap();
            assert!(
                reached,
                "{strategy:?} {kind:?}: the joiner never put its record in place"
            );
            assert_eq!(
                records(&members).len(),
                2,
                "{strategy:?} {kind:?}: holder and joiner"
            );

            // The holder leaves without the mutation lock (the joiner has
            // it): it counts the joiner's record as a holder.
            held.release().await.unwrap();
            assert_eq!(
                records(&members).len(),
                1,
                "{strategy:?} {kind:?}: the holder left"
            );

            // An exclusive acquisition announces itself (its record, live:
            // flocked, of this live process).
            let waiter_path = members.join("w-0a0a0a0a-0a0a-4a0a-8a0a-0a0a0a0a0a0a.json");
            std::fs::write(&waiter_path, &holder_bytes).unwrap();
            let waiter = File::open(&waiter_path).unwrap();
            waiter.lock().unwrap();
            go_on.reach();
            let (joiner, got) = tokio::time::timeout(Duration::from_secs(20), joining)
                .await
                .expect("the joiner's attempt ends")
                .unwrap();
            fail::remove("group.record.after_rename");
            assert!(
                got.is_none(),
                "{strategy:?} {kind:?}: a waiting exclusive acquisition comes first"
            );
            assert!(
                records(&members).is_empty(),
                "{strategy:?} {kind:?}: the joiner withdrew"
            );

            // The exclusive acquisition gives up (cancelled): its record goes.
            drop(waiter);
            std::fs::remove_file(&waiter_path).unwrap();

            let until = Instant::now() + Duration::from_secs(10);
            while path.exists() && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(
                !path.exists(),
                "{strategy:?} {kind:?}: the marker was left behind with nobody holding the name"
            );
            let taken = joiner.try_acquire("job").await.unwrap();
            assert!(taken.is_some(), "{strategy:?} {kind:?}: the name is free");
        }
    }
}

/// An exclusive acquisition that waited for shared holders announced
/// itself in the members directory; when it is done (here: it got the
/// lock) its announcement goes, and with it the members directory if
/// that leaves it empty, under the name's mutation lock. When another
/// process holds that lock at that moment (slow, or frozen while it
/// changes the name), the directory is removed once it can be, on the
/// release thread: before, it was left behind for good (until `clean`, or
/// the name's next group).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_announcement_withdrawn_while_the_name_is_busy_leaves_no_members_directory() {
    let _serial = SERIAL.lock().await;
    for &strategy in common::strategies() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().to_owned();
        let reader = patient_locker(&dir, strategy);
        let writer = patient_locker(&dir, strategy);
        let read = reader.acquire_shared("job").await.unwrap();
        let path = lock_path(&dir);
        let members = members_of(&path);
        let mutex = mutex_of(&path);

        // When the writer withdraws its announcement, a slow process takes
        // the name's mutation lock, and keeps it until told.
        let slow: Arc<Mutex<Option<MutationLock>>> = Arc::default();
        let taken = Arc::new(Step::default());
        {
            let (slow, taken, mutex) = (slow.clone(), taken.clone(), mutex.clone());
            fail::cfg_callback("group.withdraw.before_unlink", move || {
                let mut slow = slow.lock().unwrap();
                if slow.is_none() {
                    *slow = MutationLock::take(&mutex);
                    taken.reach();
                }
            })
            .unwrap();
        }
        let writing = tokio::spawn(async move {
            let guard = writer.acquire("job").await;
            (writer, guard)
        });
        // The writer announced itself; the reader leaves, the writer gets in.
        let until = Instant::now() + Duration::from_secs(20);
        while !records_of(&members).iter().any(|n| n.starts_with("w-")) {
            assert!(
                Instant::now() < until,
                "{strategy:?}: the writer never announced itself"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        read.release().await.unwrap();
        let (writer, write) = tokio::time::timeout(Duration::from_secs(20), writing)
            .await
            .expect("the writer gets in")
            .unwrap();
        let write = write.unwrap();
        fail::remove("group.withdraw.before_unlink");
        assert!(taken.wait(), "{strategy:?}: the writer withdrew its announcement");
        // Withdrawn, while the slow process holds the lock.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            records_of(&members).is_empty(),
            "{strategy:?}: the announcement is gone"
        );
        // The slow process is done (its mutation-lock file removed, then
        // unlocked, as leasehold lets it go).
        drop(slow.lock().unwrap().take().expect("the slow process held"));
        let until = Instant::now() + Duration::from_secs(10);
        while members.exists() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            !members.exists(),
            "{strategy:?}: the emptied members directory was left behind"
        );
        drop(write);
        drop(writer);
        let left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != common::LINE_FILE)
            .collect();
        assert!(left.is_empty(), "{strategy:?}: left behind {left:?}");
    }
}

/// Every entry of a members directory but the seal.
fn records_of(members: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(members) else {
        return Vec::new();
    };
    entries
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "sealed")
        .collect()
}
