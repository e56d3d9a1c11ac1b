//! `Locker::release_all`: every lock a `Locker` and its clones hold is
//! released on the store at once (another process takes each name
//! straight away), each guard's `lost()` fires with
//! `LossReason::ReleasedAtShutdown`, acquisitions later or waiting fail
//! with `Error::ShutDown`, and a guard dropped afterwards leaves the new
//! holder alone. On both file layouts, and on PostgreSQL (`--features
//! postgres`, a throwaway server of its own).

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use leasehold::{Error, LockGuard, LockKind, Locker, LossReason};
use tokio::sync::{mpsc, watch};

#[path = "support/common.rs"]
mod common;

use common::ChildProc;

#[cfg(all(unix, feature = "postgres"))]
#[path = "support/pg_server.rs"]
mod pg_server;

/// Bounds every wait of these tests.
const BOUND: Duration = Duration::from_secs(20);

#[test]
fn child_process_entry() {
    common::child_entry_with(|role, args| async move {
        match role.as_str() {
            // dir|url name...: take every name exclusively without waiting,
            // say "took all" (or "busy NAME"), and hold them until killed.
            "take" | "pg_take" => {
                let locker = if role == "take" {
                    Locker::builder()
                        .directory(&args[0])
                        .strategy(common::strategy_from_env())
                        .build()
                } else {
                    pg_builder(&args[0])
                };
                let locker = locker.expect("locker");
                let mut held = Vec::new();
                for name in &args[1..] {
                    match locker.try_acquire(name).await.expect("try_acquire") {
                        Some(guard) => held.push(guard),
                        None => {
                            common::say(&format!("busy {name}"));
                            return 1;
                        }
                    }
                }
                common::say("took all");
                tokio::time::sleep(BOUND * 3).await;
                drop(held);
                0
            }
            _ => common::run_role(&role, &args).await,
        }
    });
}

#[cfg(feature = "postgres")]
fn pg_builder(url: &str) -> leasehold::Result<Locker> {
    Locker::builder()
        .postgres(url)
        .lease(Duration::from_secs(3))
        .renew_interval(Duration::from_millis(100))
        .poll_interval(Duration::from_millis(50))
        .build()
}

#[cfg(not(feature = "postgres"))]
fn pg_builder(_url: &str) -> leasehold::Result<Locker> {
    unreachable!("a PostgreSQL child without the feature")
}

type Take = Pin<Box<dyn Future<Output = leasehold::Result<LockGuard>> + Send>>;

/// What a holding task saw once `release_all` ran.
#[derive(Debug)]
struct Seen {
    name: String,
    lost_within: Duration,
    is_lost: bool,
    ensure_held: Option<LossReason>,
}

/// A task that takes a lock (`take`), says so, waits for `lost()`,
/// reports what it saw, and keeps its guard until `drop_now`. With
/// `release`, it ends with `release().await`, whose loss it reports.
fn holder(
    take: Take,
    ready: mpsc::UnboundedSender<()>,
    seen: mpsc::UnboundedSender<Seen>,
    mut drop_now: watch::Receiver<bool>,
    release: bool,
) -> tokio::task::JoinHandle<Option<LossReason>> {
    tokio::spawn(async move {
        let guard = take.await.expect("take the lock");
        ready.send(()).unwrap();
        let t0 = Instant::now();
        tokio::time::timeout(BOUND, guard.lost())
            .await
            .expect("lost() fired");
        let ensure_held = match guard.ensure_held().await {
            Err(Error::Lost { reason, .. }) => Some(reason),
            _ => None,
        };
        seen.send(Seen {
            name: guard.name().to_owned(),
            lost_within: t0.elapsed(),
            is_lost: guard.is_lost(),
            ensure_held,
        })
        .unwrap();
        drop_now.wait_for(|now| *now).await.unwrap();
        if release {
            match guard.release().await {
                Err(Error::Lost { reason, .. }) => Some(reason),
                other => panic!("release after release_all: {other:?}"),
            }
        } else {
            drop(guard);
            None
        }
    })
}

/// Holds exclusive, shared (two guards of one hold), semaphore permits and
/// re-entrant guards in several tasks, with a local waiter queued behind
/// one and another waiting on the store for a name a child process holds;
/// then shuts down and checks everything the method promises. `other`
/// builds a `Locker` as another process would; `take` starts a child that
/// takes the given names.
async fn shutdown_while_holding(
    locker: Locker,
    other: Locker,
    busy_held_elsewhere: &str,
    take: impl Fn(&[&str]) -> ChildProc,
) {
    let (ready_tx, mut ready) = mpsc::unbounded_channel();
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let (drop_tx, drop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    let mut spawn = |take: Take, release: bool| {
        tasks.push(holder(
            take,
            ready_tx.clone(),
            seen_tx.clone(),
            drop_rx.clone(),
            release,
        ));
    };
    let l = locker.clone();
    spawn(Box::pin(async move { l.acquire("ex").await }), false);
    for _ in 0..2 {
        let l = locker.clone();
        spawn(Box::pin(async move { l.acquire_shared("sh").await }), false);
    }
    for release in [false, true] {
        let l = locker.clone();
        spawn(
            Box::pin(async move { l.semaphore("gpu", 3)?.acquire().await }),
            release,
        );
    }
    // Two guards of one acquisition, re-entered in a scope.
    let l = locker.clone();
    let (nested_tx, nested_rx) = tokio::sync::oneshot::channel();
    spawn(
        Box::pin(async move {
            let inner = l.clone();
            l.scope(async move {
                let outer = inner.acquire("nested").await?;
                let again = inner.acquire("nested").await?;
                nested_tx.send(again).unwrap();
                Ok(outer)
            })
            .await
        }),
        false,
    );
    for _ in 0..tasks.len() {
        tokio::time::timeout(BOUND, ready.recv()).await.unwrap().unwrap();
    }
    let nested_again = nested_rx.await.unwrap();

    // Waiters: one queued behind this Locker's own holder of "ex", one
    // waiting on the store for a name another process holds.
    let l = locker.clone();
    let queued = tokio::spawn(async move { l.acquire("ex").await });
    let l = locker.clone();
    let busy = busy_held_elsewhere.to_owned();
    let on_store = tokio::spawn(async move { l.acquire(&busy).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !queued.is_finished() && !on_store.is_finished(),
        "the waiters wait"
    );

    let t0 = Instant::now();
    let released = locker.release_all().await;
    let took = t0.elapsed();
    let mut got: Vec<(String, LockKind)> = released
        .iter()
        .map(|lock| {
            assert!(lock.error().is_none(), "{lock:?}");
            (lock.name().to_owned(), lock.kind())
        })
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    // The two shared guards share one hold where the store lets a
    // `Locker` join its own (lock files); on a server each may have its own.
    let shared = got.iter().filter(|(name, _)| name == "sh").count();
    assert!((1..=2).contains(&shared), "{got:?}");
    got.dedup();
    let gpu = LockKind::Semaphore { permits: 3 };
    assert_eq!(
        got,
        [
            ("ex".to_owned(), LockKind::Exclusive),
            ("gpu".to_owned(), gpu),
            ("nested".to_owned(), LockKind::Exclusive),
            ("sh".to_owned(), LockKind::Shared),
        ],
        "one entry per hold in the store"
    );
    assert_eq!(released.len(), 4 + shared, "two permits: {got:?}");
    eprintln!("release_all took {took:?}");

    // Another process takes every name at once.
    let mut child = take(&["ex", "sh", "gpu", "nested"]);
    child.expect("took all", BOUND);

    // Every guard heard why.
    let mut heard = Vec::new();
    for _ in 0..tasks.len() {
        let seen = tokio::time::timeout(BOUND, seen.recv()).await.unwrap().unwrap();
        assert!(seen.is_lost, "{seen:?}");
        assert_eq!(seen.ensure_held, Some(LossReason::ReleasedAtShutdown), "{seen:?}");
        assert!(seen.lost_within < BOUND, "{seen:?}");
        heard.push(seen.name);
    }
    heard.sort();
    assert_eq!(heard, ["ex", "gpu", "gpu", "nested", "sh", "sh"]);
    assert!(nested_again.is_lost());

    // The waiters ended with the error, and so does everything later,
    // through clones too.
    for waiter in [queued, on_store] {
        let out = tokio::time::timeout(BOUND, waiter)
            .await
            .expect("the waiter ended")
            .unwrap();
        assert!(matches!(out, Err(Error::ShutDown { .. })), "{out:?}");
    }
    let clone = locker.clone();
    assert!(matches!(clone.acquire("fresh").await, Err(Error::ShutDown { ref name }) if name == "fresh"));
    assert!(matches!(
        locker.try_acquire("ex").await,
        Err(Error::ShutDown { .. })
    ));
    assert!(matches!(
        locker
            .acquire_shared_timeout("sh", Duration::from_millis(10))
            .await,
        Err(Error::ShutDown { .. })
    ));
    assert!(matches!(
        locker.semaphore("gpu", 3).unwrap().try_acquire().await,
        Err(Error::ShutDown { .. })
    ));
    let refused = locker.acquire("x").await.unwrap_err();
    assert!(refused.to_string().contains("release_all"), "{refused}");
    assert!(format!("{refused:?}").starts_with("ShutDown: "), "{refused:?}");
    let blocking = locker.clone();
    let refused = tokio::task::spawn_blocking(move || blocking.blocking_acquire("y"))
        .await
        .unwrap();
    assert!(matches!(refused, Err(Error::ShutDown { .. })), "{refused:?}");
    assert!(locker.release_all().await.is_empty(), "nothing left to release");

    // Guards dropped (or released) now leave the new holder alone.
    drop(nested_again);
    drop_tx.send(true).unwrap();
    for task in tasks {
        if let Some(reason) = tokio::time::timeout(BOUND, task).await.unwrap().unwrap() {
            assert_eq!(reason, LossReason::ReleasedAtShutdown);
        }
    }
    for name in ["ex", "sh", "gpu", "nested"] {
        let holders = other.holders(name).await.unwrap();
        let pids: Vec<_> = holders.iter().map(|owner| owner.pid()).collect();
        assert_eq!(pids, [Some(child.pid())], "{name} is the child's alone");
    }
    assert!(
        other.try_acquire("ex").await.unwrap().is_none(),
        "the child keeps it"
    );
    child.kill_and_reap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_all_frees_every_name_in_a_directory() {
    for &strategy in common::strategies() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_str().unwrap().to_owned();
        let build = || {
            Locker::builder()
                .directory(dir.path())
                .strategy(strategy)
                .lease(Duration::from_secs(3))
                .renew_interval(Duration::from_millis(50))
                .poll_interval(Duration::from_millis(50))
                .build()
                .unwrap()
        };
        let mut elsewhere = ChildProc::spawn_with(strategy, "hold", &[&path, "busy", "60000"]);
        elsewhere.expect("acquired", BOUND);
        shutdown_while_holding(build(), build(), "busy", |names| {
            let mut args = vec![path.as_str()];
            args.extend_from_slice(names);
            ChildProc::spawn_with(strategy, "take", &args)
        })
        .await;
        elsewhere.kill_and_reap();
    }
}

/// An acquisition whose attempt is under way when `release_all` runs
/// ends refused, or released: never holding the lock after the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_racing_release_all_never_keep_a_lock() {
    for round in 0..40 {
        let dir = tempfile::tempdir().unwrap();
        let locker = Locker::builder()
            .directory(dir.path())
            .fencing(round % 2 == 0)
            .build()
            .unwrap();
        let names: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
        let racers: Vec<_> = names
            .iter()
            .map(|name| {
                let (l, name) = (locker.clone(), name.clone());
                tokio::spawn(async move {
                    match l.acquire(&name).await {
                        Ok(guard) => Some(guard),
                        Err(Error::ShutDown { .. }) => None,
                        Err(other) => panic!("{other:?}"),
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_micros(200 * (round % 5))).await;
        locker.release_all().await;
        let other = Locker::new(dir.path()).unwrap();
        for name in &names {
            assert!(
                other.try_acquire(name).await.unwrap().is_some(),
                "round {round}: {name} still held after release_all"
            );
        }
        for racer in racers {
            if let Some(guard) = racer.await.unwrap() {
                assert!(guard.is_lost(), "round {round}: a guard handed out alive");
                drop(guard);
            }
        }
    }
}

/// A guard being dropped while `release_all` runs: the name ends free,
/// whichever let it go, and a drop later never removes a new holder's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drops_racing_release_all() {
    for round in 0..40 {
        let dir = tempfile::tempdir().unwrap();
        let locker = Locker::new(dir.path()).unwrap();
        let mut guards = Vec::new();
        for i in 0..6 {
            guards.push(locker.acquire(&format!("d{i}")).await.unwrap());
        }
        let dropper = tokio::task::spawn_blocking(move || {
            for guard in guards.drain(..3) {
                drop(guard);
            }
            guards
        });
        if round % 2 == 0 {
            tokio::task::yield_now().await;
        }
        locker.release_all().await;
        let other = Locker::new(dir.path()).unwrap();
        let mut taken = Vec::new();
        for i in 0..6 {
            let name = format!("d{i}");
            let guard = other.try_acquire(&name).await.unwrap();
            taken.push(guard.unwrap_or_else(|| panic!("round {round}: {name} still held")));
        }
        drop(dropper.await.unwrap()); // the rest, dropped after the new holder took them
        for guard in &taken {
            guard.ensure_held().await.unwrap();
        }
    }
}

#[cfg(all(unix, feature = "postgres"))]
mod postgres {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn release_all_frees_every_name_on_a_server() {
        let server = pg_server::Server::start();
        let url = server.url();
        let locker = pg_builder(&url).unwrap();
        let other = pg_builder(&url).unwrap();
        // A name another process holds, for a waiter on the server.
        let mut elsewhere = ChildProc::spawn("pg_take", &[&url, "busy"]);
        elsewhere.expect("took all", BOUND);
        shutdown_while_holding(locker, other, "busy", |names| {
            let mut args = vec![url.as_str()];
            args.extend_from_slice(names);
            ChildProc::spawn("pg_take", &args)
        })
        .await;
        elsewhere.kill_and_reap();
    }
}

/// An upgradable holder and an upgraded one are released with the rest,
/// and `acquire_upgradable` is refused afterwards like every acquisition
/// (the upgradable lock's attempts pass the same gate). Not on Windows,
/// which refuses upgradable locks.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgradable_holds_are_released_and_refused_after_release_all() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::builder().directory(dir.path()).build().unwrap();
    let other = Locker::builder().directory(dir.path()).build().unwrap();
    let up = locker.acquire_upgradable("up").await.unwrap();
    let upgraded = locker
        .acquire_upgradable("upgraded")
        .await
        .unwrap()
        .upgrade()
        .await
        .unwrap();
    let released = tokio::time::timeout(BOUND, locker.release_all()).await.unwrap();
    let mut names: Vec<&str> = released.iter().map(|r| r.name()).collect();
    names.sort_unstable();
    assert_eq!(names, ["up", "upgraded"], "{released:?}");
    assert!(upgraded.is_lost());
    for name in ["up", "upgraded"] {
        let taken = other.try_acquire(name).await.unwrap();
        assert!(taken.is_some(), "{name} was not free");
    }
    assert!(matches!(
        locker.acquire_upgradable("later").await,
        Err(Error::ShutDown { .. })
    ));
    assert!(up.upgrade().await.is_err());
    drop(upgraded);
}
