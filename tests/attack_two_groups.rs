//! Second attack on shared locks and permits after the change that skips
//! listing (and unsealing) a members directory made just now, and removes a
//! group's seal once at its end: what is on disk at each step of a group's
//! life, and a group's end with an exclusive waiter's announcement left in
//! its members directory (the directory then stays, and must not stay
//! sealed).
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use leasehold::{Locker, Strategy};

const LAYOUTS: &[Strategy] = &[Strategy::ExclusiveFile, Strategy::Directory];

fn locker(dir: &Path, strategy: Strategy) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .build()
        .unwrap()
}

fn members_of(locker: &Locker, name: &str) -> PathBuf {
    let mut path = locker.lock_path(name).unwrap().into_os_string();
    path.push(".members");
    PathBuf::from(path)
}

/// The entries of `dir`, sorted; empty if it does not exist.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(read) => read
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A new group's members directory holds its first member's record and
/// nothing else (no seal); a group's end that leaves an exclusive waiter's
/// announcement behind leaves no seal beside it, and the waiter gets the
/// lock; when all is let go, nothing of the group is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_members_directory_is_never_left_sealed() {
    for &strategy in LAYOUTS {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (locker(dir.path(), strategy), locker(dir.path(), strategy));
        let members = members_of(&a, "cat");
        for round in 0..3 {
            let what = format!("{strategy:?} round {round}");
            let reader = a.acquire_shared("cat").await.unwrap();
            let names = entries(&members);
            assert!(
                names.len() == 1 && names[0].starts_with("m-") && names[0].ends_with(".json"),
                "{what}: a new group's members directory holds {names:?}"
            );
            let writer = tokio::spawn({
                let b = b.clone();
                async move { b.acquire("cat").await }
            });
            until(&format!("{what}: the writer never announced itself"), || {
                entries(&members).iter().any(|n| n.starts_with("w-"))
            })
            .await;
            // Held back: no new reader joins while a writer waits.
            assert!(
                b.try_acquire_shared("cat").await.unwrap().is_none(),
                "{what}: a reader joined beside a waiting writer"
            );
            reader.release().await.unwrap();
            let held = tokio::time::timeout(Duration::from_secs(20), writer)
                .await
                .expect("the writer never got the lock")
                .unwrap()
                .unwrap();
            let names = entries(&members);
            assert!(
                !names.iter().any(|n| n == "sealed"),
                "{what}: the members directory is left sealed beside an exclusive holder: {names:?}"
            );
            // Nobody shares an exclusively held name.
            assert!(a.try_acquire_shared("cat").await.unwrap().is_none(), "{what}");
            held.release().await.unwrap();
            until(
                &format!("{what}: the members directory stays: {:?}", entries(&members)),
                || !members.exists(),
            )
            .await;
        }
        // Permits: a fresh group of one permit is full at once.
        let sem = a.semaphore("pool", 1).unwrap();
        let other = b.semaphore("pool", 1).unwrap();
        for _ in 0..3 {
            let permit = sem.acquire().await.unwrap();
            assert!(
                other.try_acquire().await.unwrap().is_none(),
                "{strategy:?}: two permits of one"
            );
            permit.release().await.unwrap();
        }
        let left: Vec<String> = entries(dir.path())
            .into_iter()
            .filter(|n| n.contains(".members") || n.contains("sealed"))
            .collect();
        assert!(left.is_empty(), "{strategy:?}: left behind {left:?}");
    }
}
