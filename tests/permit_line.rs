//! A semaphore's waiters in other processes stand in the waiting line
//! (src/fs/line.rs) for its permits: they are served in the order they
//! began to wait, and a waiter frozen in line holds nobody up, though the
//! group's marker keeps its inode for as long as anyone holds a permit.

// The waiting line stands on Linux's OFD byte-range locks (on Windows,
// byte-range locks on its line file; SIGSTOP has no Windows twin).
#![cfg(target_os = "linux")]

#[path = "support/common.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{ChildProc, append, say};
use nix::sys::signal::Signal;

/// The roles of this file's children; the others are `common`'s.
#[test]
fn child_process_entry() {
    common::child_entry_with(|role, args| async move {
        match role.as_str() {
            "permit_hold" | "permit_acquire" | "permit_turns" | "permit_try_loop" | "permit_waits"
            | "permit_log" => permit_role(&role, &args).await,
            _ => common::run_role(&role, &args).await,
        }
    });
}

fn locker(dir: &str) -> leasehold::Locker {
    leasehold::Locker::builder()
        .directory(dir)
        .strategy(common::strategy_from_env())
        .lease(Duration::from_secs(60))
        .poll_interval(Duration::from_millis(10))
        .build()
        .expect("locker")
}

/// Every role's first arguments: dir name permits.
async fn permit_role(role: &str, args: &[String]) -> i32 {
    let locker = locker(&args[0]);
    let semaphore = locker
        .semaphore(&args[1], args[2].parse().unwrap())
        .expect("semaphore");
    match role {
        // Take a permit and keep it until killed.
        "permit_hold" => {
            let _guard = semaphore.acquire().await.expect("acquire");
            say("acquired");
            tokio::time::sleep(Duration::from_secs(90)).await;
        }
        // Wait for a permit, and say how long it took.
        "permit_acquire" => {
            say("waiting");
            let t0 = Instant::now();
            let guard = semaphore.acquire().await.expect("acquire");
            say(&format!("acquired {}", t0.elapsed().as_millis()));
            drop(guard);
        }
        // Take a permit, hold it 1 ms, give it back, again, until killed.
        "permit_turns" => {
            say("looping");
            loop {
                let guard = semaphore.acquire().await.expect("acquire");
                tokio::time::sleep(Duration::from_millis(1)).await;
                drop(guard);
            }
        }
        // Loop `try_acquire` (which never stands in line) until killed,
        // holding a permit 30 ms whenever it gets one, and trying again
        // 1 ms after giving it back.
        "permit_try_loop" => {
            say("looping");
            loop {
                if let Some(guard) = semaphore.try_acquire().await.expect("try_acquire") {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    drop(guard);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        // ... n timeout_ms: n acquisitions bounded by timeout_ms, each
        // held 2 ms; says "waits <ms...> timeouts <k>".
        "permit_waits" => {
            let n: u32 = args[3].parse().unwrap();
            let timeout = Duration::from_millis(args[4].parse().unwrap());
            let (mut waits, mut timeouts) = (Vec::new(), 0);
            for _ in 0..n {
                let t0 = Instant::now();
                match semaphore.acquire_timeout(timeout).await {
                    Ok(guard) => {
                        waits.push(t0.elapsed().as_millis().to_string());
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        drop(guard);
                    }
                    Err(leasehold::Error::Timeout { .. }) => timeouts += 1,
                    Err(e) => panic!("acquire: {e}"),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            say(&format!("waits {} timeouts {timeouts}", waits.join(" ")));
        }
        // ... log hold_ms: wait for a permit, log our pid while holding
        // it for hold_ms, give it back.
        "permit_log" => {
            say("waiting");
            let guard = semaphore.acquire().await.expect("acquire");
            append(&args[3], &std::process::id().to_string());
            tokio::time::sleep(Duration::from_millis(args[4].parse().unwrap())).await;
            drop(guard);
            say("released");
        }
        _ => panic!("unknown role {role}"),
    }
    0
}

/// Waiters for a 1-permit semaphore that began to wait one after another
/// get the permit in that order when it is given back, in both layouts.
/// Without a line every waiter is woken by the release and the quickest
/// takes the permit: the order is a race.
#[test]
fn permit_waiters_are_served_in_the_order_they_came() {
    for &strategy in common::strategies() {
        let dir = tempfile::tempdir().unwrap();
        let locks = dir.path().join("locks");
        let log = dir.path().join("log");
        let (d, l) = (locks.to_str().unwrap(), log.to_str().unwrap());
        let mut holder = ChildProc::spawn_with(strategy, "permit_hold", &[d, "pool", "1"]);
        holder.expect("acquired", Duration::from_secs(20));
        let mut waiters: Vec<ChildProc> = (0..4)
            .map(|_| {
                let waiter = ChildProc::spawn_with(strategy, "permit_log", &[d, "pool", "1", l, "30"]);
                waiter.expect("waiting", Duration::from_secs(20));
                // In line once its first attempt found the group full.
                std::thread::sleep(Duration::from_millis(300));
                waiter
            })
            .collect();
        let came: Vec<String> = waiters.iter().map(|w| w.pid().to_string()).collect();
        holder.kill();
        for waiter in &mut waiters {
            waiter.expect("released", Duration::from_secs(20));
            assert!(waiter.wait(Duration::from_secs(20)).success());
        }
        let served: Vec<String> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
        assert_eq!(
            served, came,
            "{strategy:?}: permits served out of the order the waiters came in"
        );
    }
}

/// A semaphore of `permits`, one of them held for good by a process (so
/// that its group, and the group's marker, stand throughout): `frozen`
/// waiters are frozen (SIGSTOP) in line with older tickets, processes
/// of the `contenders` roles take the other permits again and again, and
/// then a process takes a permit 8 times with `acquire_timeout(3 s)`.
/// Its "waits" line.
fn waits_behind_frozen_permit_waiters(
    strategy: leasehold::Strategy,
    permits: u32,
    frozen: usize,
    contenders: &[&str],
) -> String {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let p = permits.to_string();
    let args = [d, "pool", p.as_str()];
    // The group stands throughout: one permit is held until the end.
    let keeper = ChildProc::spawn_with(strategy, "permit_hold", &args);
    keeper.expect("acquired", Duration::from_secs(20));
    // The other permits are taken, so that the frozen ones wait in line.
    let mut holders: Vec<ChildProc> = (1..permits)
        .map(|_| {
            let holder = ChildProc::spawn_with(strategy, "permit_hold", &args);
            holder.expect("acquired", Duration::from_secs(20));
            holder
        })
        .collect();
    let frozen: Vec<ChildProc> = (0..frozen)
        .map(|_| {
            let child = ChildProc::spawn_with(strategy, "permit_acquire", &args);
            child.expect("waiting", Duration::from_secs(20));
            // In line once its first attempt found the group full.
            std::thread::sleep(Duration::from_millis(300));
            child.signal(Signal::SIGSTOP);
            child.wait_stopped("a frozen permit waiter", Duration::from_secs(5));
            child
        })
        .collect();
    let contenders: Vec<ChildProc> = contenders
        .iter()
        .map(|role| {
            let child = ChildProc::spawn_with(strategy, role, &args);
            child.expect("looping", Duration::from_secs(20));
            child
        })
        .collect();
    for holder in &mut holders {
        holder.kill();
    }
    std::thread::sleep(Duration::from_millis(200));
    let waiter = ChildProc::spawn_with(strategy, "permit_waits", &[d, "pool", p.as_str(), "8", "3000"]);
    let line = waiter.expect("waits", Duration::from_secs(60));
    drop((keeper, frozen, contenders));
    line
}

/// A permit waiter frozen in line (SIGSTOP: holding only its ticket)
/// has had its chance after a few looks at a group whose members come and
/// go without it: the waiters behind it stop standing back for it,
/// whatever else contends (processes taking permits in turns, or a
/// process looping `try_acquire`, which never stands in line). A group's
/// marker keeps its inode while anyone holds a permit: judged as an
/// exclusive lock's path is ("the lock moved": another inode), the group
/// never moves, the frozen waiter is never passed over, and the waiters
/// behind it try only once per look, 10 ms apart, deaf to releases. Then
/// against a `try_acquire` loop that gives its permit back for 1 ms in 31,
/// 8 of 8 one-second acquisitions timed out (here: a mean of 30 to 40 ms,
/// the first wait about 100 ms, none timed out). Each wait here may take
/// 3 s, none may time out, and the mean must stay under three times the
/// same waits' with nobody frozen (the first case), same run, plus 50 ms.
#[test]
fn a_frozen_permit_waiter_holds_nobody_up() {
    use leasehold::Strategy::{Directory, ExclusiveFile};
    let mut control = None;
    for (strategy, permits, frozen, contenders) in [
        // The control: nobody frozen.
        (ExclusiveFile, 2, 0, &["permit_turns", "permit_try_loop"][..]),
        (ExclusiveFile, 2, 1, &["permit_turns"][..]),
        (ExclusiveFile, 2, 1, &["permit_try_loop"][..]),
        (ExclusiveFile, 2, 3, &["permit_try_loop"][..]),
        (ExclusiveFile, 3, 1, &["permit_turns", "permit_try_loop"][..]),
        (Directory, 2, 1, &["permit_try_loop"][..]),
    ] {
        let line = waits_behind_frozen_permit_waiters(strategy, permits, frozen, contenders);
        let (mean, timeouts) = common::parse_waits(&line);
        eprintln!(
            "{strategy:?}, {permits} permits, {frozen} frozen, {contenders:?}: mean {mean:.1} ms ({line})"
        );
        assert_eq!(
            timeouts, 0,
            "{strategy:?}, {permits} permits, {frozen} frozen waiter(s), {contenders:?}: {line}"
        );
        // What the same waits cost with nobody frozen, this run.
        let control = *control.get_or_insert(mean);
        assert!(
            mean < 3.0 * control + 50.0,
            "{strategy:?}, {permits} permits, {frozen} frozen waiter(s), {contenders:?}: mean {mean:.1} ms against {control:.1} ms with nobody frozen: {line}"
        );
    }
}

/// The line's bytes (OFD locks) this process holds on the lock directory
/// `dir`, as /proc/locks lists them.
fn line_bytes_held(dir: &std::path::Path) -> usize {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(dir).unwrap().ino();
    let me = std::process::id().to_string();
    std::fs::read_to_string("/proc/locks")
        .unwrap()
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // "n: OFDLCK ADVISORY READ pid maj:min:ino start end"; an OFD
            // lock's pid is -1, or the taker's on older kernels.
            f.get(1) == Some(&"OFDLCK")
                && f.get(5)
                    .is_some_and(|id| id.rsplit(':').next() == Some(ino.to_string().as_str()))
                && f.get(4).is_some_and(|pid| *pid == "-1" || *pid == me)
        })
        .count()
}

/// Two tasks of one `Locker` sharing a 1-permit semaphore: while one holds
/// the permit, the other waits on the disk and so stands in line. Giving
/// the permit back with nobody else in line must not forget that waiter's
/// ticket: a ticket forgotten is a byte held on the directory for as long
/// as the `Locker` lives, one more at each such handoff, that every other
/// process's waiter takes for an older waiter (and every release for
/// someone in line).
#[test]
fn a_permit_given_back_to_a_waiter_of_the_same_locker_leaves_no_ticket() {
    for &strategy in common::strategies() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap().to_owned();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let held = runtime.block_on(async {
            let locker = leasehold::Locker::builder()
                .directory(&d)
                .strategy(strategy)
                .build()
                .expect("locker");
            let semaphore = locker.semaphore("pool", 1).expect("semaphore");
            for _ in 0..10 {
                let first = semaphore.acquire().await.expect("acquire");
                let second = {
                    let semaphore = semaphore.clone();
                    tokio::spawn(async move { semaphore.acquire().await.expect("acquire") })
                };
                // The second waits on the disk, in line, for the permit.
                tokio::time::sleep(Duration::from_millis(30)).await;
                drop(first);
                drop(second.await.unwrap());
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
            let held = line_bytes_held(dir.path());
            drop(locker);
            held
        });
        assert_eq!(
            held, 0,
            "{strategy:?}: line bytes left held on the lock directory"
        );
    }
}
