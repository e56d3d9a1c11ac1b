//! Any name that is accepted works: a name longer than
//! `leasehold::MAX_NAME_LEN` bytes is refused with `Error::InvalidName` by
//! every call that takes a name, before anything is written, and a name
//! at the limit, in the characters that take the most room in a record,
//! with the largest owner fields, fencing and a semaphore's marker, makes
//! records that every reader reads.

#[path = "support/common.rs"]
mod common;

use std::time::Duration;

use leasehold::{Error, Locker, MAX_NAME_LEN, PathStyle};

fn is_invalid_name<T: std::fmt::Debug>(got: &leasehold::Result<T>) -> bool {
    matches!(got, Err(Error::InvalidName { .. }))
}

/// The longest name, in characters a JSON writer escapes to six bytes
/// each (`\u0001`), and the first name too long.
fn at_and_over_the_limit() -> (String, String) {
    let at = "\u{1}".repeat(MAX_NAME_LEN);
    let over = "n".repeat(MAX_NAME_LEN + 1);
    (at, over)
}

/// Owner fields as large as `build()` accepts (4 KiB as JSON): one long
/// value, with quotes that JSON escapes.
fn largest_fields(builder: leasehold::LockerBuilder) -> leasehold::LockerBuilder {
    let mut value = "\"".repeat(1000);
    let mut b = builder.clone().owner_field("k", value.clone());
    // Grow the value until `build()` refuses it; keep the last accepted.
    loop {
        value.push('v');
        let next = builder.clone().owner_field("k", value.clone());
        if next.clone().build().is_err() {
            return b;
        }
        b = next;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_over_the_limit_are_refused_by_every_call() {
    let (_, over) = at_and_over_the_limit();
    // The measured failure: a 70,000-byte name made a record over the
    // readers' limit.
    let huge = "x".repeat(70_000);
    for &strategy in common::strategies() {
        let tmp = tempfile::tempdir().unwrap();
        let locker = Locker::builder()
            .directory(tmp.path())
            .strategy(strategy)
            .build()
            .unwrap();
        for name in [over.as_str(), huge.as_str()] {
            let t = Duration::from_millis(100);
            assert!(is_invalid_name(&locker.lock_path(name)), "{strategy:?} lock_path");
            assert!(
                is_invalid_name(&locker.acquire(name).await),
                "{strategy:?} acquire"
            );
            assert!(
                is_invalid_name(&locker.try_acquire(name).await),
                "{strategy:?} try_acquire"
            );
            assert!(
                is_invalid_name(&locker.acquire_timeout(name, t).await),
                "{strategy:?}"
            );
            assert!(
                is_invalid_name(&locker.acquire_shared(name).await),
                "{strategy:?}"
            );
            assert!(
                is_invalid_name(&locker.try_acquire_shared(name).await),
                "{strategy:?}"
            );
            assert!(
                is_invalid_name(&locker.acquire_shared_timeout(name, t).await),
                "{strategy:?}"
            );
            assert!(
                is_invalid_name(&locker.semaphore(name, 2)),
                "{strategy:?} semaphore"
            );
            assert!(is_invalid_name(&locker.holder(name).await), "{strategy:?} holder");
            assert!(
                is_invalid_name(&locker.holders(name).await),
                "{strategy:?} holders"
            );
            assert!(
                is_invalid_name(&locker.inspect(name).await),
                "{strategy:?} inspect"
            );
            assert!(
                is_invalid_name(&locker.is_held(name).await),
                "{strategy:?} is_held"
            );
            assert!(
                is_invalid_name(&locker.with_lock(name, async {}).await),
                "{strategy:?}"
            );
            assert!(
                is_invalid_name(&locker.with_lock_timeout(name, t, async {}).await),
                "{strategy:?}"
            );
            let (l, n) = (locker.clone(), name.to_owned());
            let blocking = tokio::task::spawn_blocking(move || {
                [
                    is_invalid_name(&l.blocking_acquire(&n)),
                    is_invalid_name(&l.blocking_try_acquire(&n)),
                    is_invalid_name(&l.blocking_acquire_timeout(&n, Duration::from_millis(100))),
                ]
            })
            .await
            .unwrap();
            assert_eq!(blocking, [true; 3], "{strategy:?} blocking_*");
        }
        // Nothing was written.
        assert!(common::entries(tmp.path()).is_empty(), "{strategy:?}");
        // The message does not repeat a name of any length in full.
        let message = locker.lock_path(&huge).unwrap_err().to_string();
        assert!(message.len() < 400, "{} bytes: {message:.200}", message.len());
        assert!(message.contains(&MAX_NAME_LEN.to_string()), "{message}");
    }
}

/// The longest name, the largest owner fields, fencing, and both kinds of
/// marker: a rival reads every record as held (never as a file that is
/// no lock), and the name is free again after release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_name_with_the_largest_fields_is_a_lock_every_reader_reads() {
    let (at, _) = at_and_over_the_limit();
    for &strategy in common::strategies() {
        let tmp = tempfile::tempdir().unwrap();
        let base = Locker::builder()
            .directory(tmp.path())
            .strategy(strategy)
            .fencing(true)
            .lease(Duration::from_secs(5));
        let holder = largest_fields(base.clone()).build().unwrap();
        let rival = base.build().unwrap();

        let guard = holder.acquire(&at).await.unwrap();
        assert!(rival.try_acquire(&at).await.unwrap().is_none(), "{strategy:?}");
        let owner = rival.holder(&at).await.unwrap().expect("held");
        assert!(owner.field("k").is_some(), "{strategy:?}");
        let info = rival.inspect(&at).await.unwrap().expect("held");
        assert_eq!(info.name(), at, "{strategy:?}");
        let listed = rival.list().await.unwrap();
        assert_eq!(listed.len(), 1, "{strategy:?}");
        assert!(std::fs::metadata(holder.lock_path(&at).unwrap()).is_ok());
        guard.release().await.unwrap();

        // Shared holders and a semaphore's permits: the marker carries
        // `mode`, `permits` and `group` too.
        let shared = holder.acquire_shared(&at).await.unwrap();
        let also = rival.acquire_shared(&at).await.unwrap();
        assert!(rival.try_acquire(&at).await.unwrap().is_none(), "{strategy:?}");
        drop((shared, also));
        let sem = holder.semaphore(&at, u32::MAX).unwrap();
        let permit = sem.acquire().await.unwrap();
        assert!(rival.try_acquire(&at).await.unwrap().is_none(), "{strategy:?}");
        assert!(
            rival
                .semaphore(&at, u32::MAX)
                .unwrap()
                .try_acquire()
                .await
                .unwrap()
                .is_some()
        );
        drop(permit);

        let again = rival.try_acquire(&at).await.unwrap();
        assert!(again.is_some(), "{strategy:?}: the name cannot be used again");
    }
}

/// `Plain` and `Exact` names keep their own, shorter limit.
#[tokio::test]
async fn plain_names_keep_their_shorter_limit() {
    let tmp = tempfile::tempdir().unwrap();
    for style in [PathStyle::Plain, PathStyle::Exact] {
        let locker = Locker::builder()
            .directory(tmp.path())
            .path_style(style)
            .build()
            .unwrap();
        assert!(locker.lock_path(&"p".repeat(200)).is_ok());
        assert!(is_invalid_name(&locker.try_acquire(&"p".repeat(201)).await));
    }
}

/// The longest `Plain` and `Exact` names in a lock directory with a long
/// path: every file leasehold keeps for them (the lock, its mutation lock,
/// its fencing counter, a renamed-aside file on release, a shared lock's
/// members directory and records) is reached by a path of over 380
/// characters, past Windows' `MAX_PATH` (260), which works because
/// leasehold's Windows paths are `\\?\` paths made from the directory
/// handle.
///
/// Under Wine, no directory leasehold opens may have a path over
/// `MAX_PATH`: Wine 8.0's `GetFinalPathNameByHandleW` (how std's
/// `canonicalize` and leasehold resolve a directory handle) answers
/// `ERROR_MORE_DATA` for a longer one, from a buffer of `MAX_PATH`
/// characters; Windows has no such limit. So there the lock directory is
/// shorter, and the shared lock (whose members directory is named after
/// the lock) is taken in a shorter one still.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_plain_names_work_in_a_directory_with_a_long_path() {
    let tmp = tempfile::tempdir().unwrap();
    let mut deep = tmp.path().to_path_buf();
    for i in 0..if under_wine() { 3 } else { 6 } {
        deep.push(format!("{i}-{}", "d".repeat(48)));
    }
    assert!(deep.as_os_str().len() > 160, "{}", deep.display());
    let shared_in = if under_wine() { tmp.path() } else { deep.as_path() };
    let name = "p".repeat(200);
    for style in [PathStyle::Plain, PathStyle::Exact] {
        let build = |dir: &std::path::Path| {
            Locker::builder()
                .directory(dir)
                .path_style(style)
                .fencing(true)
                .lease(Duration::from_secs(5))
                .build()
                .unwrap()
        };
        let (holder, rival) = (build(&deep), build(&deep));
        let guard = holder.acquire(&name).await.unwrap();
        let path = holder.lock_path(&name).unwrap();
        assert!(path.as_os_str().len() > 380, "{style:?}: {}", path.display());
        assert!(std::fs::metadata(&path).unwrap().is_file(), "{style:?}");
        assert!(rival.try_acquire(&name).await.unwrap().is_none(), "{style:?}");
        let owner = rival.holder(&name).await.unwrap().expect("held");
        assert_eq!(owner.pid(), Some(std::process::id()), "{style:?}");
        assert_eq!(owner.fencing_token(), guard.fencing_token(), "{style:?}");
        // `list` shows locks whose file names end in `.lock`: not Exact's.
        let listed = usize::from(style == PathStyle::Plain);
        assert_eq!(rival.list().await.unwrap().len(), listed, "{style:?}");
        guard.release().await.unwrap();
        let again = rival
            .try_acquire(&name)
            .await
            .unwrap()
            .expect("free after release");
        assert!(again.fencing_token() > owner.fencing_token(), "{style:?}");
        drop(again);
        // A shared lock's members directory sits beside it.
        let (holder, rival) = (build(shared_in), build(shared_in));
        let shared = holder.acquire_shared(&name).await.unwrap();
        let also = rival.acquire_shared(&name).await.unwrap();
        assert_eq!(rival.holders(&name).await.unwrap().len(), 2, "{style:?}");
        assert!(rival.try_acquire(&name).await.unwrap().is_none(), "{style:?}");
        drop((shared, also));
        assert!(!rival.is_held(&name).await.unwrap(), "{style:?}");
    }
    // Nothing is left but each name's fencing counter. A dropped guard's
    // release runs on the release thread: a group's last leaver ends it
    // (its marker, members directory and mutation lock's file) there, once
    // the other leaver lets the name's mutation lock go, while the lock is
    // already free (under Wine that took long enough to be seen, in about
    // one run in three).
    for dir in [deep.as_path(), shared_in] {
        let left = || {
            let mut left = common::entries(dir);
            left.retain(|e| !e.ends_with(".fence") && !e.starts_with("0-"));
            left
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !left().is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(left().is_empty(), "left behind: {:?}", left());
    }
}

/// Whether this Windows is Wine (whose system folder has its device
/// host, `winedevice.exe`): for what Wine does differently from Windows.
fn under_wine() -> bool {
    cfg!(windows)
        && std::env::var_os("SystemRoot").is_some_and(|root| {
            std::path::Path::new(&root)
                .join(r"system32\winedevice.exe")
                .exists()
        })
}
