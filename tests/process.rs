//! Exclusion between real processes.

mod common;

use std::time::Duration;

use common::{ChildProc, entries};
use nix::sys::signal::Signal;

#[test]
fn child_process_entry() {
    common::child_entry();
}

#[test]
fn two_processes_never_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let locks = dir.path().join("locks");
    let (d, l) = (locks.to_str().unwrap(), log.to_str().unwrap());
    let mut a = ChildProc::spawn("contend", &[d, "shared", "200", l]);
    let mut b = ChildProc::spawn("contend", &[d, "shared", "200", l]);
    assert!(a.wait(Duration::from_secs(60)).success());
    assert!(b.wait(Duration::from_secs(60)).success());

    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 800, "every round logs a start and an end");
    let mut handoffs = 0;
    let mut last_pid = "";
    for pair in lines.chunks(2) {
        let start: Vec<&str> = pair[0].split(' ').collect();
        let end: Vec<&str> = pair[1].split(' ').collect();
        assert_eq!(
            start[0], "S",
            "a critical section started inside another: {pair:?}"
        );
        assert_eq!(end[0], "E", "{pair:?}");
        assert_eq!(start[1..], end[1..], "sections interleaved: {pair:?}");
        if start[1] != last_pid {
            handoffs += 1;
            last_pid = start[1];
        }
    }
    assert!(handoffs >= 2, "both processes held the lock");
    assert!(entries(&locks).is_empty(), "left behind: {:?}", entries(&locks));
}

/// Processes that take and drop one lock as fast as they can take turns:
/// a releaser that asks again at once no longer keeps the lock while
/// others wait (before the line, whoever created the file first after a
/// release won, and that was nearly always the releaser). Generous
/// bounds: the measured figures are in BENCHMARKS.md.
#[test]
fn processes_contending_in_a_loop_take_turns() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let go = dir.path().join("go");
    let locks = dir.path().join("locks");
    let (d, l, g) = (
        locks.to_str().unwrap(),
        log.to_str().unwrap(),
        go.to_str().unwrap(),
    );
    let mut kids: Vec<ChildProc> = (0..3)
        .map(|_| ChildProc::spawn("loop", &[d, "busy", "1500", l, g]))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&go, "").unwrap();
    for kid in &mut kids {
        assert!(kid.wait(Duration::from_secs(60)).success());
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let order: Vec<&str> = text.lines().collect();
    let mut counts = std::collections::HashMap::new();
    for pid in &order {
        *counts.entry(*pid).or_insert(0u64) += 1;
    }
    let (least, most) = (
        counts.values().min().copied().unwrap_or(0),
        counts.values().max().copied().unwrap_or(0),
    );
    // The longest run of one process's acquisitions in a row.
    let longest = order
        .chunk_by(|a, b| a == b)
        .map(<[&str]>::len)
        .max()
        .unwrap_or(0);
    let turns = order.chunk_by(|a, b| a == b).count();
    let summary = format!(
        "{} acquisitions, counts {counts:?}, {turns} turns, longest run {longest}",
        order.len()
    );
    assert_eq!(counts.len(), 3, "{summary}");
    assert!(
        least * 4 >= most,
        "the least served got under a quarter of the most: {summary}"
    );
    assert!(
        longest <= 400,
        "one process kept the lock too long while others waited: {summary}"
    );
    assert!(turns >= 30, "the lock changed hands too rarely: {summary}");
}

/// A waiter frozen in line (SIGSTOP) holds nobody up: the waiter behind
/// it stands back only while the lock changes hands, and takes over a
/// dead holder's lock that nobody reclaims, in both layouts.
#[test]
fn a_frozen_waiter_in_line_holds_nobody_up() {
    for strategy in [leasehold::Strategy::ExclusiveFile, leasehold::Strategy::Directory] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();
        let holder = ChildProc::spawn_with(strategy, "hold", &[d, "job", "60000"]);
        holder.expect("acquired", Duration::from_secs(20));
        let frozen = ChildProc::spawn_with(strategy, "acquire", &[d, "job", "60000", "20"]);
        frozen.expect("waiting", Duration::from_secs(20));
        // In line once its first attempt found the lock held.
        std::thread::sleep(Duration::from_millis(500));
        frozen.signal(Signal::SIGSTOP);
        let behind = ChildProc::spawn_with(strategy, "acquire", &[d, "job", "60000", "20"]);
        behind.expect("waiting", Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(500));
        holder.signal(Signal::SIGKILL);
        let killed_at = std::time::Instant::now();
        let line = behind.expect("acquired", Duration::from_secs(20));
        let took = killed_at.elapsed();
        assert!(
            took < Duration::from_secs(2),
            "{strategy:?}: took {took:?} ({line}) behind a frozen waiter"
        );
        frozen.signal(Signal::SIGCONT);
        frozen.expect("acquired", Duration::from_secs(20));
    }
}

#[test]
fn four_processes_count_to_exactly_four_hundred() {
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("counter");
    let locks = dir.path().join("locks");
    let (d, c) = (locks.to_str().unwrap(), counter.to_str().unwrap());
    let mut kids: Vec<ChildProc> = (0..4)
        .map(|_| ChildProc::spawn("count", &[d, "counter", "100", c]))
        .collect();
    for kid in &mut kids {
        assert!(kid.wait(Duration::from_secs(90)).success());
    }
    assert_eq!(std::fs::read_to_string(&counter).unwrap(), "400");
}

#[test]
fn a_killed_holder_is_replaced_at_once_despite_a_long_lease() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let holder = ChildProc::spawn("hold", &[d, "job", "60000"]);
    holder.expect("acquired", Duration::from_secs(20));

    let waiter = ChildProc::spawn("acquire", &[d, "job", "60000", "20"]);
    waiter.expect("waiting", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(200));
    holder.signal(Signal::SIGKILL);
    let killed_at = std::time::Instant::now();
    let line = waiter.expect("acquired", Duration::from_secs(20));
    let after_kill = killed_at.elapsed();
    assert!(
        after_kill < Duration::from_secs(1),
        "took {after_kill:?} ({line}); the lease is 60 s"
    );
    drop(holder);
}

/// With a 10 s poll interval, only a filesystem event explains a prompt
/// wake-up.
#[test]
fn a_waiter_in_another_process_wakes_when_the_lock_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let holder = ChildProc::spawn("hold_for", &[d, "job", "1500"]);
    holder.expect("acquired", Duration::from_secs(20));
    let waiter = ChildProc::spawn("acquire", &[d, "job", "60000", "10000"]);
    waiter.expect("waiting", Duration::from_secs(20));
    holder.expect("released", Duration::from_secs(20));
    let released_at = std::time::Instant::now();
    waiter.expect("acquired", Duration::from_secs(5));
    let latency = released_at.elapsed();
    assert!(
        latency < Duration::from_secs(1),
        "woke {latency:?} after the release"
    );
}

#[test]
fn a_waiter_in_another_process_wakes_when_the_holder_dies() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let holder = ChildProc::spawn("hold", &[d, "job", "60000"]);
    holder.expect("acquired", Duration::from_secs(20));
    let waiter = ChildProc::spawn("acquire", &[d, "job", "60000", "10000"]);
    waiter.expect("waiting", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(300));
    holder.signal(Signal::SIGKILL);
    let killed_at = std::time::Instant::now();
    waiter.expect("acquired", Duration::from_secs(5));
    let latency = killed_at.elapsed();
    assert!(
        latency < Duration::from_secs(1),
        "woke {latency:?} after the holder died"
    );
}
