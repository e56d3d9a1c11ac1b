//! `LockerBuilder::fair`: a release that finds another `Locker` waiting
//! for the name lets it in, the releasing `Locker`'s next attempt waits
//! behind it, and the `Locker`'s own tasks do not pass the lock among
//! themselves past it.
//!
//! The `Locker`s here share one process but not their open file
//! descriptions, which is what the waiting line tells apart (each
//! `Locker` opens the lock directory itself): to the line they are as
//! separate processes. Linux only: these tests look at the line's OFD
//! byte-range locks to know that a waiter stands in line.
#![cfg(target_os = "linux")]

#[path = "support/common.rs"]
mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{ChildProc, FAIR_ENV, anyone_in_line};
use leasehold::{Error, Locker, Strategy};

#[test]
fn child_process_entry() {
    common::child_entry();
}

/// Every wait of these tests ends within this.
const BOUND: Duration = Duration::from_secs(20);

/// Time for a waiter that began to wait to stand in line: its first
/// attempt runs at once, so this is generous.
const SETTLE: Duration = Duration::from_millis(300);

fn fair(dir: &Path) -> Locker {
    Locker::builder().directory(dir).fair(true).build().unwrap()
}

/// Waits until someone holds a byte of `dir`'s line.
async fn until_in_line(dir: &Path) {
    let started = Instant::now();
    while !anyone_in_line(dir) {
        assert!(started.elapsed() < BOUND, "nobody ever stood in line");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

type Order = Arc<Mutex<Vec<&'static str>>>;

fn push(order: &Order, who: &'static str) {
    order.lock().unwrap().push(who);
}

/// A fair `Locker` that releases and asks again at once, while another
/// waits, gets the lock back only after the other had it (by default it
/// could take it again at once, up to 32 times in a row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_locker_lets_a_waiter_in_at_every_release() {
    let dir = tempfile::tempdir().unwrap();
    let (looping, other) = (fair(dir.path()), Locker::new(dir.path()).unwrap());
    let order: Order = Arc::default();
    let guard = looping.acquire("job").await.unwrap();
    let waiter = tokio::spawn({
        let order = Arc::clone(&order);
        async move {
            let guard = other.acquire_timeout("job", BOUND).await?;
            push(&order, "other");
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(guard);
            Ok::<_, Error>(())
        }
    });
    until_in_line(dir.path()).await;
    push(&order, "looping");
    drop(guard);
    for _ in 0..3 {
        let guard = looping.acquire_timeout("job", BOUND).await.unwrap();
        push(&order, "looping");
        drop(guard);
    }
    waiter.await.unwrap().unwrap();
    assert_eq!(
        *order.lock().unwrap(),
        ["looping", "other", "looping", "looping", "looping"],
        "the waiter had the lock right after the first release"
    );
}

/// A fair `Locker` whose task releases the lock while another of its
/// tasks waits and another `Locker` stands in line gives the lock back
/// to the disk: the other `Locker`, in line before the second task came
/// to the disk, goes first (by default the second task would have it
/// handed over in memory, within the first 10 ms of the hold).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_lockers_tasks_do_not_pass_the_lock_past_a_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let (holder, ours, late) = (
        Locker::new(dir.path()).unwrap(),
        fair(dir.path()),
        Locker::new(dir.path()).unwrap(),
    );
    let order: Order = Arc::default();
    let held = holder.acquire("job").await.unwrap();
    // The fair Locker's first task stands in line, first...
    let first = tokio::spawn({
        let (ours, order) = (ours.clone(), Arc::clone(&order));
        async move {
            let guard = ours.acquire_timeout("job", BOUND).await?;
            push(&order, "first task");
            // Released at once: within the hold's first moments, when a
            // default `Locker` hands it to its next task in memory.
            drop(guard);
            Ok::<_, Error>(())
        }
    });
    until_in_line(dir.path()).await;
    // ...its second waits behind the first, in the `Locker`'s own queue...
    let second = tokio::spawn({
        let (ours, order) = (ours.clone(), Arc::clone(&order));
        async move {
            let guard = ours.acquire_timeout("job", BOUND).await?;
            push(&order, "second task");
            drop(guard);
            Ok::<_, Error>(())
        }
    });
    tokio::time::sleep(SETTLE).await;
    // ...and another `Locker` stands in line behind the first task.
    let other = tokio::spawn({
        let order = Arc::clone(&order);
        async move {
            let guard = late.acquire_timeout("job", BOUND).await?;
            push(&order, "late");
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(guard);
            Ok::<_, Error>(())
        }
    });
    tokio::time::sleep(SETTLE).await;
    drop(held);
    for task in [first, second, other] {
        task.await.unwrap().unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        ["first task", "late", "second task"],
        "the second task had the lock passed past a waiter in line"
    );
}

/// Three processes, each built with `fair(true)`, take and give back one
/// lock in a loop: while all three loop, the lock changes hands at
/// nearly every acquisition (each release that finds the other two in
/// line lets the oldest in; only when both are off the line, not yet
/// back, which on two busy cores happens, may a process take it again),
/// and their shares are even. With the defaults the same loop changes
/// hands at the ends of turns (runs of up to 32), at a third of the
/// acquisitions here. Real processes, bounded:
/// each loops 1.5 s.
#[test]
fn fair_processes_looping_take_one_acquisition_each_in_turn() {
    let dir = tempfile::tempdir().unwrap();
    let (log, go, locks) = (
        dir.path().join("log"),
        dir.path().join("go"),
        dir.path().join("locks"),
    );
    let (d, l, g) = (
        locks.to_str().unwrap(),
        log.to_str().unwrap(),
        go.to_str().unwrap(),
    );
    let mut kids: Vec<ChildProc> = (0..3)
        .map(|_| {
            ChildProc::spawn_env(
                Strategy::ExclusiveFile,
                "loop",
                &[d, "busy", "1500", l, g],
                &[(FAIR_ENV, "1")],
            )
        })
        .collect();
    // Every child waits for `go` before any starts (a slow machine may
    // take longer to start one than any fixed pause).
    for kid in &kids {
        kid.expect("ready", BOUND);
    }
    std::fs::write(&go, "").unwrap();
    for kid in &mut kids {
        assert!(kid.wait(BOUND).success());
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let order: Vec<&str> = text.lines().collect();
    let pids: std::collections::BTreeSet<&str> = order.iter().copied().collect();
    assert_eq!(pids.len(), 3, "every process served");
    // From when all three have had the lock to when the first of them is
    // done: the stretch in which all three loop.
    let first_seen = |pid: &str| order.iter().position(|p| *p == pid).unwrap();
    let last_seen = |pid: &str| order.iter().rposition(|p| *p == pid).unwrap();
    let from = pids.iter().map(|p| first_seen(p)).max().unwrap();
    let to = pids.iter().map(|p| last_seen(p)).min().unwrap();
    assert!(
        to > from + 30,
        "too short a stretch with all three looping: {from}..{to} of {}",
        order.len()
    );
    let all = &order[from..=to];
    let longest = all.chunk_by(|a, b| a == b).map(<[&str]>::len).max().unwrap_or(0);
    let runs = all.chunk_by(|a, b| a == b).count();
    let mut counts = std::collections::HashMap::new();
    for pid in all {
        *counts.entry(*pid).or_insert(0u64) += 1;
    }
    let (least, most) = (counts.values().min().unwrap(), counts.values().max().unwrap());
    let summary = format!(
        "{} acquisitions with all three looping, counts {counts:?}, {runs} runs, longest {longest}",
        all.len()
    );
    eprintln!("{summary}");
    // Measured: a change of hands at 99 to 100 % of acquisitions; 31 %
    // in a run of the defaults (with the defaults, changes of hands come
    // at the ends of turns, and at turns cut short).
    assert!(
        runs * 10 >= all.len() * 6,
        "fair processes kept the lock while others waited: {summary}"
    );
    assert!(least * 10 >= most * 8, "uneven shares: {summary}");
}

/// `fair` is a setting of locks in a directory: on PostgreSQL, where the
/// server orders waiters, `build` refuses it with a typed error.
#[cfg(feature = "postgres")]
#[test]
fn fair_is_refused_on_postgres() {
    let err = Locker::builder()
        .postgres("postgres://leasehold@127.0.0.1:1/leasehold")
        .fair(true)
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
    assert!(err.to_string().contains("`fair`"), "{err}");
}
