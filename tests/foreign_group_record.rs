//! A members directory can hold, for a moment, the record of a holder of
//! another group than the one its marker names: a joiner that found the
//! group before it ended places its record, sees the marker replaced, and
//! withdraws. A holder that leaves and signs the marker with a live
//! holder's record must pick one of its own group: signed with the
//! stranger's, the marker named another group, and every holder left
//! took its lock for lost (`ensure_held` and `release` failed with
//! `Lost`) although nobody had taken it. Found under Wine, where
//! `tests/blocking_kinds.rs` saw a semaphore's holder fail its release
//! about one run in thirty (and a CI run).
//!
//! The test plays the stranger with a holder whose record is edited to
//! name another group, the newest record in the directory, so the one a
//! leaver picks when it does not look at groups.

#[path = "support/common.rs"]
mod common;

use std::path::{Path, PathBuf};

use common::{MutationLock, members_of, mutex_of, patient_locker};
use leasehold::{LockGuard, Locker, Strategy};

/// The lock path of the only name in `dir`.
fn lock_path(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "lock"))
        .expect("the name's lock path")
}

/// The member records (`m-*.json`) in `members`.
fn records(members: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(members)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("m-") && name.ends_with(".json")
        })
        .collect();
    found.sort();
    found
}

/// The `group` of the record at `path`.
fn group_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let value: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
    value["group"].as_str().expect("a group").to_owned()
}

/// What the marker names: the lock file's record, or a lock directory's
/// `owner.json`.
fn marker_group(lock: &Path) -> String {
    if lock.is_dir() {
        group_of(&lock.join("owner.json"))
    } else {
        group_of(lock)
    }
}

/// Three holders of "job" (`a`, `b`, then `c`, whose record is then edited
/// to name another group), in `dir`.
async fn three_holders(dir: &Path, strategy: Strategy) -> (Vec<Locker>, [LockGuard; 3], String, PathBuf) {
    let lockers: Vec<Locker> = (0..3).map(|_| patient_locker(dir, strategy)).collect();
    let a = lockers[0].acquire_shared("job").await.unwrap();
    let b = lockers[1].acquire_shared("job").await.unwrap();
    let lock = lock_path(dir);
    let members = members_of(&lock);
    let before = records(&members);
    let group = group_of(&before[0]);
    // Later than a's and b's: its lease ends last.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let c = lockers[2].acquire_shared("job").await.unwrap();
    let after = records(&members);
    let stranger = after
        .into_iter()
        .find(|p| !before.contains(p))
        .expect("c's record");
    assert_eq!(group_of(&stranger), group);
    // Another group's id, of the same length: the record is rewritten in
    // place, as its holder renews it.
    let other = uuid::Uuid::new_v4().to_string();
    assert_eq!(other.len(), group.len());
    let text = std::fs::read_to_string(&stranger).unwrap();
    std::fs::write(&stranger, text.replace(&group, &other)).unwrap();
    (lockers, [a, b, c], group, lock)
}

async fn a_leaver_signs_with_its_own_group(strategy: Strategy, mutation_busy: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (lockers, [a, b, c], group, lock) = three_holders(dir.path(), strategy).await;
    // With the name's mutation lock taken (a process slow while it changes
    // the name), a leaves without it, and so does b below.
    let busy = mutation_busy.then(|| MutationLock::take(&mutex_of(&lock)).unwrap());
    a.release().await.unwrap();
    assert_eq!(
        marker_group(&lock),
        group,
        "{strategy:?}, mutation lock busy: {mutation_busy}: the marker names the holders' group"
    );
    b.ensure_held()
        .await
        .unwrap_or_else(|e| panic!("{strategy:?}, busy {mutation_busy}: b: {e}"));
    b.release()
        .await
        .unwrap_or_else(|e| panic!("{strategy:?}, busy {mutation_busy}: b's release: {e}"));
    drop(busy);
    c.release().await.unwrap();
    drop(lockers);
}

/// The layouts of this platform (Windows cannot lock a directory).
fn strategies() -> Vec<Strategy> {
    match cfg!(windows) {
        true => vec![Strategy::ExclusiveFile],
        false => vec![Strategy::ExclusiveFile, Strategy::Directory],
    }
}

#[tokio::test]
async fn a_leaver_with_the_mutation_lock_signs_the_marker_with_its_own_groups_record() {
    for strategy in strategies() {
        a_leaver_signs_with_its_own_group(strategy, false).await;
    }
}

#[tokio::test]
async fn a_leaver_without_the_mutation_lock_signs_the_marker_with_its_own_groups_record() {
    for strategy in strategies() {
        a_leaver_signs_with_its_own_group(strategy, true).await;
    }
}

/// The other side: a holder of the group before (`c`, whose marker was
/// replaced by the next group's: a withdrawing joiner's record is such a
/// holder's) is still in place when the next group's last holder (`a`)
/// leaves. `a` leaves the marker standing for it, and `c`'s leave, which
/// finds a marker not its own and nobody holding, ends that group: the
/// lock path is free once both are gone. (Replacing a marker by hand
/// needs Unix: on Windows its holders keep it open.)
#[cfg(unix)]
#[tokio::test]
async fn the_group_ends_once_a_holder_of_the_group_before_leaves_too() {
    let dir = tempfile::tempdir().unwrap();
    let la = patient_locker(dir.path(), Strategy::ExclusiveFile);
    let lc = patient_locker(dir.path(), Strategy::ExclusiveFile);
    let c = lc.acquire_shared("job").await.unwrap();
    let lock = lock_path(dir.path());
    let members = members_of(&lock);
    let before = group_of(&records(&members)[0]);
    // Group `before`'s marker goes, and a new group's stands in its place.
    let text = std::fs::read_to_string(&lock).unwrap();
    let next = uuid::Uuid::new_v4().to_string();
    std::fs::remove_file(&lock).unwrap();
    let fresh = dir.path().join("marker.new");
    std::fs::write(&fresh, text.replace(&before, &next)).unwrap();
    std::fs::rename(&fresh, &lock).unwrap();
    let a = la.acquire_shared("job").await.unwrap();
    assert!(
        records(&members).iter().any(|p| group_of(p) == next),
        "a joined the new group"
    );
    a.release().await.unwrap();
    // Its marker replaced: lost, as `c` says.
    assert!(c.release().await.is_err());
    let left = common::left_after(dir.path(), std::time::Duration::from_secs(5));
    assert!(
        !lock.exists(),
        "nobody holds \"job\", but its marker stands: {left:?}"
    );
}
