//! The blocking forms of every kind of lock and of the inspecting methods:
//! from plain threads and `spawn_blocking` they work and return what their
//! async twins return; in async code they refuse at once with
//! `Error::Unsupported`, taking and removing nothing; and across processes
//! the shared, exclusive and permit holders they make keep the rules.

#[path = "support/common.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use leasehold::{Error, LockKind, Locker};

#[test]
fn child_process_entry() {
    common::child_entry_with(|role, args| async move {
        match role.as_str() {
            // Rounds of a blocking acquisition, in `spawn_blocking` of the
            // child's multi-thread runtime.
            "blocking_rounds" => tokio::task::spawn_blocking(move || rounds(&args))
                .await
                .expect("the rounds' thread"),
            _ => common::run_role(&role, &args).await,
        }
    });
}

/// A child's rounds: `args` are the lock directory, the log, the kind
/// (`shared`, `exclusive` or `permits=N`) and the number of rounds. Each
/// round takes the lock through one of the kind's three blocking forms in
/// turn, logs `+kind pid` and `-kind pid` around a short critical section,
/// and lets the lock go.
fn rounds(args: &[String]) -> i32 {
    let [dir, log, kind, count] = args else {
        eprintln!("blocking_rounds: DIR LOG KIND ROUNDS");
        return 2;
    };
    let locker = Locker::new(dir).expect("locker");
    let count: u32 = count.parse().expect("rounds");
    let pid = std::process::id();
    let long = Duration::from_secs(60);
    let take = |round: u32| -> leasehold::Result<leasehold::LockGuard> {
        let semaphore = kind
            .strip_prefix("permits=")
            .map(|n| locker.semaphore("mix", n.parse().expect("permits")))
            .transpose()?;
        let forms = |acquire: &dyn Fn() -> leasehold::Result<_>,
                     try_acquire: &dyn Fn() -> leasehold::Result<Option<_>>,
                     timeout: &dyn Fn() -> leasehold::Result<_>| {
            match round % 3 {
                0 => acquire(),
                1 => loop {
                    if let Some(guard) = try_acquire()? {
                        break Ok(guard);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                },
                _ => timeout(),
            }
        };
        match (kind.as_str(), &semaphore) {
            ("shared", _) => forms(
                &|| locker.blocking_acquire_shared("mix"),
                &|| locker.blocking_try_acquire_shared("mix"),
                &|| locker.blocking_acquire_shared_timeout("mix", long),
            ),
            ("exclusive", _) => forms(
                &|| locker.blocking_acquire("mix"),
                &|| locker.blocking_try_acquire("mix"),
                &|| locker.blocking_acquire_timeout("mix", long),
            ),
            (_, Some(semaphore)) => forms(
                &|| semaphore.blocking_acquire(),
                &|| semaphore.blocking_try_acquire(),
                &|| semaphore.blocking_acquire_timeout(long),
            ),
            _ => panic!("unknown kind {kind}"),
        }
    };
    common::say("started");
    for round in 0..count {
        let guard = match take(round) {
            Ok(guard) => guard,
            Err(e) => {
                common::say(&format!("failed: take: {e}"));
                return 1;
            }
        };
        common::append(log, &format!("+{kind} {pid}"));
        std::thread::sleep(Duration::from_millis(3));
        common::append(log, &format!("-{kind} {pid}"));
        if let Err(e) = guard.blocking_release() {
            common::say(&format!("failed: release: {e}"));
            return 1;
        }
    }
    common::say("done");
    0
}

fn locker(dir: &Path) -> Locker {
    Locker::new(dir).unwrap()
}

/// A runtime to ask the async twins with, from a plain thread.
fn twin() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A lock file whose owner process is gone, as a crash leaves it.
fn plant_stale(locker: &Locker, name: &str) -> PathBuf {
    let path = locker.lock_path(name).unwrap();
    let record = format!(r#"{{"uuid":"x","pid":{}}}"#, common::dead_pid());
    std::fs::write(&path, record).unwrap();
    path
}

/// Removes the lock file at `path` behind its holder's back (renamed aside
/// first: Wine keeps a deleted file's name while a handle is open).
fn remove_behind(path: &Path) {
    let aside = path.with_extension("removed");
    std::fs::rename(path, &aside).unwrap();
    std::fs::remove_file(&aside).unwrap();
}

fn is_unsupported<T>(result: &leasehold::Result<T>) -> bool {
    matches!(result, Err(Error::Unsupported { .. }))
}

#[test]
fn shared_forms_work_without_a_runtime() {
    assert!(tokio::runtime::Handle::try_current().is_err());
    let dir = tempfile::tempdir().unwrap();
    let (readers, writer) = (locker(dir.path()), locker(dir.path()));
    let a = readers.blocking_acquire_shared("catalog").unwrap();
    let b = writer
        .blocking_try_acquire_shared("catalog")
        .unwrap()
        .expect("readers overlap");
    let c = readers
        .blocking_acquire_shared_timeout("catalog", Duration::from_secs(30))
        .unwrap();
    assert!(a.is_shared() && b.is_shared() && c.is_shared());
    assert_eq!(a.name(), "catalog");
    assert!(writer.blocking_try_acquire("catalog").unwrap().is_none());
    drop((a, b, c));

    // A writer in: readers wait, or time out naming it.
    let held = writer.blocking_acquire("catalog").unwrap();
    assert!(readers.blocking_try_acquire_shared("catalog").unwrap().is_none());
    let started = Instant::now();
    let err = readers
        .blocking_acquire_shared_timeout("catalog", Duration::from_millis(150))
        .unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert_eq!(err.holder().and_then(|h| h.pid()), Some(std::process::id()));
    let released = Arc::new(AtomicBool::new(false));
    let waiter = {
        let (readers, released) = (readers.clone(), Arc::clone(&released));
        std::thread::spawn(move || {
            let guard = readers.blocking_acquire_shared("catalog").unwrap();
            (released.load(Ordering::SeqCst), guard.is_shared())
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(!waiter.is_finished(), "the reader waits for the writer");
    released.store(true, Ordering::SeqCst);
    drop(held);
    assert_eq!(waiter.join().unwrap(), (true, true));
}

#[test]
fn semaphore_forms_work_without_a_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let (mine, other) = (locker(dir.path()), locker(dir.path()));
    let gpu = mine.semaphore("gpu", 2).unwrap();
    let theirs = other.semaphore("gpu", 2).unwrap();
    let first = gpu.blocking_acquire().unwrap();
    let second = theirs.blocking_try_acquire().unwrap().expect("a free permit");
    assert!(!first.is_shared() && !second.is_shared());
    assert!(gpu.blocking_try_acquire().unwrap().is_none());
    assert!(theirs.blocking_try_acquire().unwrap().is_none());
    let err = gpu
        .blocking_acquire_timeout(Duration::from_millis(100))
        .unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    // Another count is refused, as by the async twin.
    let wrong = other.semaphore("gpu", 3).unwrap().blocking_try_acquire();
    assert!(matches!(wrong, Err(Error::KindMismatch { .. })), "{wrong:?}");
    assert!(mine.blocking_try_acquire_shared("gpu").is_err());
    assert!(mine.blocking_try_acquire("gpu").unwrap().is_none());

    let waiter = {
        let theirs = theirs.clone();
        std::thread::spawn(move || theirs.blocking_acquire_timeout(Duration::from_secs(30)).map(drop))
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(!waiter.is_finished(), "no permit is free");
    drop(first);
    waiter.join().unwrap().unwrap();
    drop(second);
    // A drop that finds the name's mutation lock taken (under Wine, by a
    // neighbour's marker poll) leaves its release to the release thread,
    // which finishes it within milliseconds (tests/shared.rs `left_in`).
    let returned = (0..200).any(|_| {
        let free = mine.blocking_try_acquire("gpu").unwrap().is_some();
        if !free {
            std::thread::sleep(Duration::from_millis(10));
        }
        free
    });
    assert!(returned, "every permit returned");
}

/// Asserts that a blocking form returned (for `name`) what its async
/// `twin` returns on `runtime`.
fn agree<T: PartialEq + std::fmt::Debug>(
    runtime: &tokio::runtime::Runtime,
    name: &str,
    blocking: leasehold::Result<T>,
    twin: impl std::future::Future<Output = leasehold::Result<T>>,
) {
    assert_eq!(blocking.unwrap(), runtime.block_on(twin).unwrap(), "{name}");
}

#[test]
fn inspecting_forms_return_what_their_async_twins_return() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (locker(dir.path()), locker(dir.path()));
    let runtime = twin();
    assert_eq!(one.blocking_holder("ex").unwrap(), None);
    assert!(one.blocking_holders("ex").unwrap().is_empty());
    assert_eq!(one.blocking_inspect("ex").unwrap(), None);
    assert!(!one.blocking_is_held("ex").unwrap());
    assert!(one.blocking_list().unwrap().is_empty());

    let _ex = one.blocking_acquire("ex").unwrap();
    let _r1 = one.blocking_acquire_shared("readers").unwrap();
    let _r2 = two.blocking_acquire_shared("readers").unwrap();
    let _permit = two.semaphore("permits", 3).unwrap().blocking_acquire().unwrap();
    let stale = plant_stale(&one, "crashed");

    for name in ["ex", "readers", "permits", "crashed", "none"] {
        agree(&runtime, name, one.blocking_holder(name), one.holder(name));
        agree(&runtime, name, two.blocking_holders(name), two.holders(name));
        agree(&runtime, name, one.blocking_inspect(name), one.inspect(name));
        agree(&runtime, name, one.blocking_is_held(name), one.is_held(name));
    }
    assert_eq!(
        one.blocking_holder("ex").unwrap().and_then(|o| o.pid()),
        Some(std::process::id())
    );
    assert_eq!(one.blocking_holders("readers").unwrap().len(), 2);
    assert_eq!(
        one.blocking_inspect("permits").unwrap().map(|i| i.kind()),
        Some(LockKind::Semaphore { permits: 3 })
    );
    assert!(one.blocking_inspect("crashed").unwrap().unwrap().is_stale());
    assert!(!one.blocking_is_held("crashed").unwrap());
    let sorted = |mut infos: Vec<leasehold::LockInfo>| {
        infos.sort_by(|a, b| a.name().cmp(b.name()));
        infos
    };
    let listed = sorted(one.blocking_list().unwrap());
    assert_eq!(listed, sorted(runtime.block_on(one.list()).unwrap()));
    let names: Vec<&str> = listed.iter().map(|l| l.name()).collect();
    // The planted record names no lock: it is listed by its file's name.
    assert!(names[0].starts_with("crashed"), "{names:?}");
    assert_eq!(names[1..], ["ex", "permits", "readers"]);

    // `clean`: a dry run only says; a real one removes the stale lock
    // alone.
    let would = one.blocking_clean(true).unwrap();
    assert_eq!(would, runtime.block_on(one.clean(true)).unwrap());
    assert_eq!(would.len(), 1);
    assert!(stale.exists());
    let removed = two.blocking_clean(false).unwrap();
    assert_eq!(removed.len(), 1);
    assert!(removed[0].name().starts_with("crashed"));
    assert!(!stale.exists());
    assert!(one.blocking_clean(false).unwrap().is_empty());
    for name in ["ex", "readers", "permits"] {
        assert!(one.blocking_is_held(name).unwrap(), "{name} is live");
    }
}

#[test]
fn closure_and_guard_forms_work_without_a_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let (mine, other) = (locker(dir.path()), locker(dir.path()));
    let out = mine
        .blocking_with_lock("ledger", || {
            // Held while `f` runs; a nested acquisition re-enters it.
            assert!(other.blocking_try_acquire("ledger").unwrap().is_none());
            let again = mine.blocking_try_acquire("ledger").unwrap();
            assert!(again.is_some(), "re-entered");
            42
        })
        .unwrap();
    assert_eq!(out, 42);
    assert!(!mine.blocking_is_held("ledger").unwrap(), "released after `f`");

    // Timed out: `f` is not called.
    let held = other.blocking_acquire("ledger").unwrap();
    let called = AtomicBool::new(false);
    let err = mine
        .blocking_with_lock_timeout("ledger", Duration::from_millis(100), || {
            called.store(true, Ordering::SeqCst)
        })
        .unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    assert!(!called.load(Ordering::SeqCst));
    drop(held);
    let out = mine
        .blocking_with_lock_timeout("ledger", Duration::from_secs(30), || "in time")
        .unwrap();
    assert_eq!(out, "in time");

    // A panic in `f` lets the lock go.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        mine.blocking_with_lock("ledger", || panic!("in the critical section"))
    }));
    assert!(panicked.is_err());
    assert!(other.blocking_try_acquire("ledger").unwrap().is_some());

    // Lost while `f` runs: `f` ends, its output is dropped, `Error::Lost`.
    let short = Locker::builder()
        .directory(dir.path())
        .lease(Duration::from_secs(1))
        .renew_interval(Duration::from_millis(100))
        .build()
        .unwrap();
    let path = short.lock_path("ledger").unwrap();
    let lost = short.blocking_with_lock("ledger", || {
        remove_behind(&path);
        std::thread::sleep(Duration::from_millis(500));
        "computed partly without the lock"
    });
    assert!(matches!(&lost, Err(e) if e.is_lost()), "{lost:?}");

    // A guard's `ensure_held` and `release`.
    let guard = mine.blocking_acquire("ledger").unwrap();
    guard.blocking_ensure_held().unwrap();
    guard.blocking_release().unwrap();
    assert!(!mine.blocking_is_held("ledger").unwrap());
    let guard = mine.blocking_acquire_shared("ledger").unwrap();
    guard.blocking_ensure_held().unwrap();
    guard.blocking_release().unwrap();
    let guard = mine.blocking_acquire("ledger").unwrap();
    remove_behind(&mine.lock_path("ledger").unwrap());
    assert!(guard.blocking_ensure_held().unwrap_err().is_lost());
    assert!(guard.is_lost());
    assert!(guard.blocking_release().unwrap_err().is_lost());
}

/// Everything the blocking forms do, from a thread that may block; what
/// went wrong, if anything.
fn exercise(dir: &Path) -> Vec<String> {
    let (mine, other) = (locker(dir), locker(dir));
    let mut wrong = Vec::new();
    let mut check = |what: &str, ok: bool| {
        if !ok {
            wrong.push(what.to_owned());
        }
    };
    let long = Duration::from_secs(30);
    let a = mine.blocking_acquire_shared("s").unwrap();
    let b = other.blocking_try_acquire_shared("s").unwrap();
    let c = mine.blocking_acquire_shared_timeout("s", long).unwrap();
    check("shared", a.is_shared() && b.is_some() && c.is_shared());
    check("holders", other.blocking_holders("s").unwrap().len() == 2);
    check("holder", mine.blocking_holder("s").unwrap().is_some());
    check("is_held", mine.blocking_is_held("s").unwrap());
    check(
        "inspect",
        mine.blocking_inspect("s").unwrap().map(|i| i.kind()) == Some(LockKind::Shared),
    );
    check("list", mine.blocking_list().unwrap().len() == 1);
    drop((a, b, c));
    let semaphore = mine.semaphore("p", 2).unwrap();
    let p1 = semaphore.blocking_acquire().unwrap();
    let p2 = semaphore.blocking_try_acquire().unwrap();
    check("permits", p2.is_some());
    check(
        "permit timeout",
        semaphore
            .blocking_acquire_timeout(Duration::from_millis(50))
            .is_err_and(|e| e.is_timeout()),
    );
    drop((p1, p2));
    check(
        "with_lock",
        mine.blocking_with_lock("w", || mine.blocking_is_held("w").unwrap())
            .unwrap(),
    );
    check(
        "with_lock_timeout",
        mine.blocking_with_lock_timeout("w", long, || 7).unwrap() == 7,
    );
    plant_stale(&mine, "crashed");
    check("clean", mine.blocking_clean(false).unwrap().len() == 1);
    let guard = mine.blocking_acquire("g").unwrap();
    check("ensure_held", guard.blocking_ensure_held().is_ok());
    check("release", guard.blocking_release().is_ok());
    check("all free", mine.blocking_list().unwrap().is_empty());
    wrong
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_spawn_blocking_they_work_and_wait_for_async_holders() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    let wrong = tokio::task::spawn_blocking(move || exercise(&path))
        .await
        .unwrap();
    assert!(wrong.is_empty(), "wrong: {wrong:?}");

    // They wait for holders of the runtime's own tasks.
    let locker = locker(dir.path());
    let writer = locker.acquire("s").await.unwrap();
    let permit = locker.semaphore("p", 1).unwrap().acquire().await.unwrap();
    let reader = {
        let other = Locker::new(dir.path()).unwrap();
        tokio::task::spawn_blocking(move || other.blocking_acquire_shared("s").map(drop))
    };
    let permitted = {
        let other = Locker::new(dir.path()).unwrap();
        tokio::task::spawn_blocking(move || other.semaphore("p", 1)?.blocking_acquire().map(drop))
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!reader.is_finished() && !permitted.is_finished(), "they wait");
    drop((writer, permit));
    let bound = Duration::from_secs(30);
    tokio::time::timeout(bound, reader)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    tokio::time::timeout(bound, permitted)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[test]
fn on_plain_threads_everything_works() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    let wrong = std::thread::spawn(move || exercise(&path)).join().unwrap();
    assert!(wrong.is_empty(), "wrong: {wrong:?}");
}

/// Calls every blocking form where it must refuse; the ones that did not
/// return `Error::Unsupported` at once, or that took, removed or ran
/// anything.
fn refusals(locker: &Locker, guards: [leasehold::LockGuard; 2]) -> Vec<String> {
    let long = Duration::from_secs(60);
    let started = Instant::now();
    let mut wrong = Vec::new();
    let mut check = |what: &str, refused: bool| {
        if !refused {
            wrong.push(what.to_owned());
        }
    };
    let semaphore = locker.semaphore("permit", 1).unwrap();
    let called = AtomicBool::new(false);
    let stale = plant_stale(locker, "crashed");
    check(
        "blocking_acquire_shared",
        is_unsupported(&locker.blocking_acquire_shared("held")),
    );
    check(
        "blocking_try_acquire_shared",
        is_unsupported(&locker.blocking_try_acquire_shared("free")),
    );
    check(
        "blocking_acquire_shared_timeout",
        is_unsupported(&locker.blocking_acquire_shared_timeout("held", long)),
    );
    check(
        "Semaphore::blocking_acquire",
        is_unsupported(&semaphore.blocking_acquire()),
    );
    check(
        "Semaphore::blocking_try_acquire",
        is_unsupported(&semaphore.blocking_try_acquire()),
    );
    check(
        "Semaphore::blocking_acquire_timeout",
        is_unsupported(&semaphore.blocking_acquire_timeout(long)),
    );
    check(
        "blocking_with_lock",
        is_unsupported(&locker.blocking_with_lock("held", || called.store(true, Ordering::SeqCst))),
    );
    check(
        "blocking_with_lock_timeout",
        is_unsupported(
            &locker.blocking_with_lock_timeout("held", long, || called.store(true, Ordering::SeqCst)),
        ),
    );
    check("blocking_holder", is_unsupported(&locker.blocking_holder("held")));
    check(
        "blocking_holders",
        is_unsupported(&locker.blocking_holders("held")),
    );
    check(
        "blocking_inspect",
        is_unsupported(&locker.blocking_inspect("held")),
    );
    check("blocking_list", is_unsupported(&locker.blocking_list()));
    check("blocking_clean", is_unsupported(&locker.blocking_clean(false)));
    check(
        "blocking_is_held",
        is_unsupported(&locker.blocking_is_held("held")),
    );
    let [ensure, release] = guards;
    check(
        "blocking_ensure_held",
        is_unsupported(&ensure.blocking_ensure_held()),
    );
    check("blocking_release", is_unsupported(&release.blocking_release()));
    check("at once", started.elapsed() < Duration::from_secs(5));
    check("f not called", !called.load(Ordering::SeqCst));
    check("nothing cleaned", stale.exists());
    check(
        "nothing taken",
        ["free", "permit"]
            .iter()
            .all(|name| !locker.lock_path(name).unwrap().exists()),
    );
    std::fs::remove_file(stale).unwrap();
    wrong
}

#[tokio::test(flavor = "current_thread")]
async fn in_a_current_thread_runtime_every_form_refuses_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let holder = locker(dir.path());
    let _held = holder.acquire("held").await.unwrap();
    let locker = locker(dir.path());
    let guards = [
        locker.acquire("g1").await.unwrap(),
        locker.acquire("g2").await.unwrap(),
    ];
    let wrong = refusals(&locker, guards);
    assert!(wrong.is_empty(), "did not refuse: {wrong:?}");
    // Also in a task that opted out of the cooperative budget.
    let guards = [
        locker.acquire("g1").await.unwrap(),
        locker.acquire("g2").await.unwrap(),
    ];
    let wrong = tokio::task::unconstrained(async { refusals(&locker, guards) }).await;
    assert!(wrong.is_empty(), "did not refuse when unconstrained: {wrong:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_multi_thread_runtime_every_form_refuses_on_workers() {
    let dir = tempfile::tempdir().unwrap();
    let holder = locker(dir.path());
    let _held = holder.acquire("held").await.unwrap();
    let locker = locker(dir.path());
    let guards = [
        locker.acquire("g1").await.unwrap(),
        locker.acquire("g2").await.unwrap(),
    ];
    let wrong = refusals(&locker, guards);
    assert!(wrong.is_empty(), "did not refuse in the body: {wrong:?}");
    let on_worker = {
        let locker = locker.clone();
        tokio::spawn(async move {
            let guards = [
                locker.acquire("g1").await.unwrap(),
                locker.acquire("g2").await.unwrap(),
            ];
            refusals(&locker, guards)
        })
    };
    let wrong = on_worker.await.unwrap();
    assert!(wrong.is_empty(), "did not refuse in a task: {wrong:?}");
}

/// Runs children doing `kinds` (one child each) rounds on one name through
/// the blocking forms, and returns their log once all have finished.
fn run_children(kinds: &[&str], rounds: u32) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let locks = dir.path().join("locks");
    std::fs::create_dir(&locks).unwrap();
    let (locks, log_str) = (locks.to_str().unwrap(), log.to_str().unwrap());
    let rounds = rounds.to_string();
    let mut children: Vec<_> = kinds
        .iter()
        .map(|kind| common::ChildProc::spawn("blocking_rounds", &[locks, log_str, kind, &rounds]))
        .collect();
    for child in &children {
        child.expect("done", Duration::from_secs(60));
    }
    for child in &mut children {
        assert!(child.wait(Duration::from_secs(30)).success());
    }
    drop(children);
    let text = std::fs::read_to_string(&log).unwrap();
    text.lines().map(str::to_owned).collect()
}

/// Replays a log of `+kind pid` / `-kind pid` lines; the most holders seen
/// at once of each kind, or what broke the rules.
fn replay(log: &[String]) -> Result<(usize, usize, usize), String> {
    let mut inside: Vec<(String, String)> = Vec::new();
    let (mut most_shared, mut most_exclusive, mut most_permits) = (0, 0, 0);
    for (i, line) in log.iter().enumerate() {
        let (sign, rest) = line.split_at(1);
        let (kind, pid) = rest.split_once(' ').ok_or(format!("line {i}: {line:?}"))?;
        let entry = (kind.to_owned(), pid.to_owned());
        if sign == "+" {
            inside.push(entry);
        } else {
            let at = inside
                .iter()
                .position(|e| *e == entry)
                .ok_or(format!("line {i}: left without entering: {line}"))?;
            inside.remove(at);
            continue;
        }
        let count = |k: &str| inside.iter().filter(|(kind, _)| kind.starts_with(k)).count();
        let (shared, exclusive, permits) = (count("shared"), count("exclusive"), count("permits="));
        if exclusive > 0 && inside.len() > 1 {
            return Err(format!("line {i}: a writer with others: {inside:?}"));
        }
        if permits > 0 && permits != inside.len() {
            return Err(format!("line {i}: permits with other kinds: {inside:?}"));
        }
        if let Some(limit) = kind.strip_prefix("permits=") {
            let limit: usize = limit.parse().unwrap();
            if permits > limit {
                return Err(format!(
                    "line {i}: {permits} permit holders of {limit}: {inside:?}"
                ));
            }
        }
        most_shared = most_shared.max(shared);
        most_exclusive = most_exclusive.max(exclusive);
        most_permits = most_permits.max(permits);
    }
    if !inside.is_empty() {
        return Err(format!("still inside at the end: {inside:?}"));
    }
    Ok((most_shared, most_exclusive, most_permits))
}

#[test]
fn shared_and_exclusive_holders_in_processes_never_overlap() {
    let kinds = ["shared", "shared", "shared", "exclusive", "exclusive"];
    let log = run_children(&kinds, 24);
    assert_eq!(log.len(), kinds.len() * 24 * 2, "every round logged");
    let (_, most_exclusive, _) = replay(&log).unwrap();
    assert_eq!(most_exclusive, 1);
}

#[test]
fn semaphore_permits_in_processes_never_exceed_the_count() {
    let kinds = ["permits=2"; 4];
    let log = run_children(&kinds, 24);
    assert_eq!(log.len(), kinds.len() * 24 * 2, "every round logged");
    let (_, _, most_permits) = replay(&log).unwrap();
    assert!((1..=2).contains(&most_permits), "{most_permits}");
}

#[test]
fn the_replay_catches_an_overlap() {
    let log = |lines: &[&str]| lines.iter().map(|l| (*l).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        replay(&log(&["+shared 1", "+shared 2", "-shared 1", "-shared 2"])),
        Ok((2, 0, 0))
    );
    assert!(replay(&log(&["+shared 1", "+exclusive 2", "-shared 1", "-exclusive 2"])).is_err());
    assert!(replay(&log(&["+permits=2 1", "+permits=2 2", "+permits=2 3"])).is_err());
    assert!(replay(&log(&["+exclusive 1"])).is_err());
}
