//! Torture: child processes × tasks contend on three names while a chaos
//! loop SIGKILLs children (and starts replacements) and SIGSTOPs them for
//! longer than the lease. Every invariant is checked afterwards from one
//! shared log. One test per backend: both file strategies, and (feature
//! `postgres`) PostgreSQL, on a throwaway server the test starts
//! (`tests/support/pg_server.rs`).
//!
//! Scale: `LEASEHOLD_TORTURE_PROCS` (default 4), `LEASEHOLD_TORTURE_TASKS`
//! (tasks per process, default 4), `LEASEHOLD_TORTURE_SECS` (chaos time,
//! default 20; a soak sets it high). The soak, every backend at once (see
//! `docs/guarantees.md`, *Soak*):
//!
//! ```sh
//! LEASEHOLD_TORTURE_SECS=600 cargo test --features postgres --test torture -- --nocapture --test-threads 3
//! ```
//!
//! # The log
//!
//! One `write(2)` per line on an `O_APPEND` descriptor, times from
//! `CLOCK_MONOTONIC` (shared by all processes; the system time on
//! Windows):
//!
//! - `S name token pid ns`: entered, right after `acquire` returned.
//! - `E name token pid ns`: left after committing. `ns` is the last moment
//!   the holder knew it held the lock: taken *before* the final
//!   `is_lost()` check that precedes the write, so a SIGSTOP between the
//!   check and the write cannot make a correct library look wrong.
//! - `L name token pid ns reason`: `lost()` fired (or `is_lost()` at
//!   commit); the section stopped at once and wrote nothing. `reason` is
//!   the `LossReason` variant (`LeaseExpired`, `SessionLost`, ...).
//! - `F name token pid ns found`: fenced out: the protected resource
//!   refused the write (see below). Wrote nothing.
//! - `X pid error`: an `acquire` failed; the task retries.
//! - `Z pid acquisitions handoffs reclaimed_dead reclaimed_expired lost max_wait_us`:
//!   a child's summary on a clean exit.
//!
//! # The protected resource
//!
//! Each name guards a counter file `value token`. A section reads it on
//! entry, works a few ms, then commits under the `flock` of the counter's
//! own commit lock file (beside it: on Windows a lock on the counter
//! itself would stop its readers): re-read, check `is_lost()`, and write `value + 1` with its fencing token
//! only if nothing changed since entry and its token is above the stored
//! one. That is the fenced resource the fencing docs ask for: a holder
//! frozen between its last check and its write (the one window no lock
//! can close) cannot lose anybody's increment, and the later holder it
//! disturbed reports `F` instead — which the checker accepts only when the
//! stale writer's process was indeed SIGSTOPped after its last check.
//!
//! # PostgreSQL
//!
//! The server keeps a session's advisory locks for as long as the session
//! lives, and a SIGSTOPped process's connection stays open: a paused
//! holder keeps its lock through the pause (its waiters wait), finds on
//! waking that its lease ran out (`LeaseExpired`, reported as lost), and
//! unlocks; a killed one's session ends with it, and the server drops its
//! locks. The chaos also ends random client sessions on the server
//! (`pg_terminate_backend`): a holder whose session ended may still be
//! running until its lease's cutoff, and its successor must wait that out.
//! So the checker excuses an overlap only with a section that stopped on
//! `lost()` without committing (it may log its end late); a committed
//! section that overlaps a successor is a violation. The rest is checked as for
//! files; leftovers are advisory locks or client sessions still there
//! `PG_SESSIONS_END_WITHIN` after the last child ended, or names a fresh
//! `Locker` finds held.
//!
//! The workload (the children's tasks) and the checker live here; the
//! chaos, the children's start and stop, what is left behind and the log
//! lines both tortures share live in `tests/support/torture.rs`.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::Duration;

use leasehold::LockGuard;

#[path = "support/torture.rs"]
mod torture;
use torture::{Arena, Backend, LEASE, Line, Tally, Turn, Worker, count, env_or, mono_ns};

const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];

#[test]
fn child_process_entry() {
    torture::child_entry(|child| {
        let work = child.work.clone();
        torture::run_tasks("torture", child, 1, move |worker| task(worker, work.clone()))
    });
}

fn counter_path(work: &Path, name: &str) -> PathBuf {
    work.join(format!("counter-{name}"))
}

/// The lock file a commit to `name`'s counter holds.
fn commit_lock_path(work: &Path, name: &str) -> PathBuf {
    work.join(format!("counter-{name}.commit"))
}

/// Reads at `offset` (`pread`; on Windows, where it moves the file's
/// position, one handle is never read by two at once here).
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    #[cfg(unix)]
    return std::os::unix::fs::FileExt::read_at(file, buf, offset);
    #[cfg(windows)]
    return std::os::windows::fs::FileExt::seek_read(file, buf, offset);
}

/// Writes all of `bytes` at `offset` (`pwrite`).
fn write_all_at(file: &File, bytes: &[u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    return std::os::unix::fs::FileExt::write_all_at(file, bytes, offset);
    #[cfg(windows)]
    {
        let written = std::os::windows::fs::FileExt::seek_write(file, bytes, offset)?;
        assert_eq!(written, bytes.len(), "short write to a counter");
        Ok(())
    }
}

fn read_counter(file: &File) -> (u64, u64) {
    let mut buf = [0u8; 64];
    let n = read_at(file, &mut buf, 0).expect("read counter");
    let text = std::str::from_utf8(&buf[..n]).expect("counter is text");
    let mut fields = text
        .split_whitespace()
        .map(|f| f.parse::<u64>().expect("counter field"));
    let value = fields.next().expect("counter value");
    let token = fields.next().expect("counter token");
    (value, token)
}

fn write_counter(file: &File, value: u64, token: u64) {
    // Fixed width: one pwrite replaces the whole content.
    write_all_at(file, format!("{value:020} {token:020}\n").as_bytes(), 0).expect("write counter");
}

enum Outcome {
    Committed(u64),
    Lost(u64),
    Fenced(u64, u64),
}

async fn task(mut worker: Worker, work: PathBuf) {
    let (pid, mut rng, locker) = (std::process::id(), worker.rng(), worker.locker.clone());
    while !worker.told_to_stop() {
        let name = NAMES[rng.below(NAMES.len() as u64) as usize];
        let guard = match worker.take_turn(locker.acquire(name)).await {
            Turn::Held(guard) => guard,
            Turn::Failed => continue,
            Turn::Stop => return,
        };
        let token = guard.fencing_token().expect("fencing is on");
        worker.log.line(format!("S {name} {token} {pid} {}", mono_ns()));
        let work_ms = 1 + rng.below(12);
        let (counter, commit_lock) = (counter_path(&work, name), commit_lock_path(&work, name));
        let outcome = tokio::select! {
            () = guard.lost() => Outcome::Lost(mono_ns()),
            o = section(&guard, &counter, &commit_lock, token, work_ms) => o,
        };
        match outcome {
            Outcome::Committed(ns) => worker.log.line(format!("E {name} {token} {pid} {ns}")),
            Outcome::Lost(ns) => {
                let reason = torture::loss_reason(&guard).await;
                worker.log.line(format!("L {name} {token} {pid} {ns} {reason}"));
            }
            Outcome::Fenced(ns, found) => worker.log.line(format!("F {name} {token} {pid} {ns} {found}")),
        }
        drop(guard);
        tokio::time::sleep(Duration::from_millis(rng.below(4))).await;
    }
}

/// The critical section: a read-modify-write of the name's counter,
/// committed through the fenced protocol described at the top.
async fn section(guard: &LockGuard, counter: &Path, commit_lock: &Path, token: u64, work_ms: u64) -> Outcome {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(counter)
        .expect("open counter");
    let commit = File::open(commit_lock).expect("open the counter's commit lock");
    let seen = read_counter(&file);
    tokio::time::sleep(Duration::from_millis(work_ms)).await;
    loop {
        match commit.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) => tokio::time::sleep(Duration::from_millis(1)).await,
            Err(std::fs::TryLockError::Error(e)) => panic!("flock counter: {e}"),
        }
    }
    // From here to the unlock: no await, so `lost()` cannot cut it.
    let now = read_counter(&file);
    let ns = mono_ns();
    let outcome = if guard.is_lost() {
        Outcome::Lost(ns)
    } else if now != seen || token <= now.1 {
        Outcome::Fenced(ns, now.1)
    } else {
        write_counter(&file, seen.0 + 1, token);
        Outcome::Committed(ns)
    };
    // Closed rather than unlocked, which lets the lock go as well: under
    // Wine 8 `File::unlock` fails (ERROR_LOCK_VIOLATION) on the whole-file
    // lock `try_lock` took, while Windows lets it go.
    drop(commit);
    outcome
}

// ---------------------------------------------------------------- parent

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Committed,
    Lost,
    Fenced(u64),
    /// No end line: its process was killed.
    Killed,
}

#[derive(Debug, Clone)]
struct Section {
    token: u64,
    pid: u32,
    start: u64,
    /// The last moment the holder may have acted as holder.
    end: u64,
    how: End,
    /// Why it was lost (the `LossReason` variant), if it was.
    reason: String,
}

fn torture(backend: Backend) {
    let procs = env_or("LEASEHOLD_TORTURE_PROCS", 4).max(1);
    let tasks = env_or("LEASEHOLD_TORTURE_TASKS", 4).max(1);
    let secs = env_or("LEASEHOLD_TORTURE_SECS", 20);
    let arena = Arena::new("torture", backend, backend.label().to_owned());
    let (label, work) = (&arena.label, &arena.work);
    for name in NAMES {
        let f = File::create(counter_path(work, name)).unwrap();
        write_counter(&f, 0, 0);
        File::create(commit_lock_path(work, name)).unwrap();
    }
    let chaos = arena.chaos(procs, tasks, secs, &[]);
    let pauses = &chaos.pauses;
    // A holder killed last may still be waited out: for a lease after
    // its session was found gone (docs/guarantees.md, *On PostgreSQL*).
    let (cleaned, left) = arena.leftovers(|locker| async move {
        let mut left = Vec::new();
        for name in NAMES {
            match locker.acquire_timeout(name, LEASE + Duration::from_secs(1)).await {
                Ok(guard) => drop(guard),
                Err(error) => left.push(format!("{name} still held: {error}")),
            }
        }
        left
    });

    // The log.
    let text = arena.log();
    let mut starts: BTreeMap<(String, u64), (u32, u64)> = BTreeMap::new();
    let mut ends: HashMap<(String, u64), (End, u64, u32, String)> = HashMap::new();
    let mut tally = Tally::default();
    for line in text.lines() {
        let line = Line::new(line);
        let (f, num) = (&line.f, |i| line.num(i));
        match f[0] {
            "S" => {
                let key = (f[1].to_owned(), num(2));
                if starts.insert(key.clone(), (num(3) as u32, num(4))).is_some() {
                    tally
                        .problems
                        .push(format!("token {} of {} handed out twice", key.1, key.0));
                }
            }
            "E" | "L" | "F" => {
                let (how, reason) = match f[0] {
                    "E" => (End::Committed, ""),
                    "L" => (End::Lost, f.get(5).copied().unwrap_or("")),
                    _ => (End::Fenced(num(5)), ""),
                };
                if how == End::Lost {
                    tally.lost(reason);
                }
                ends.insert(
                    (f[1].to_owned(), num(2)),
                    (how, num(4), num(3) as u32, reason.to_owned()),
                );
            }
            _ => tally.other(&arena, &line),
        }
    }
    let problems = &mut tally.problems;
    let mut by_name: BTreeMap<String, Vec<Section>> = BTreeMap::new();
    for ((name, token), (pid, start)) in &starts {
        let (how, end, reason) = match ends.get(&(name.clone(), *token)) {
            Some((how, ns, _, reason)) => (*how, *ns, reason.clone()),
            None => match chaos.silenced(*pid) {
                Some(at) => (End::Killed, at, String::new()),
                None => {
                    problems.push(format!(
                        "{name} token {token}: pid {pid} entered, was never killed, and never left"
                    ));
                    continue;
                }
            },
        };
        by_name.entry(name.clone()).or_default().push(Section {
            token: *token,
            pid: *pid,
            start: *start,
            end,
            how,
            reason,
        });
    }
    for key in ends.keys() {
        if !starts.contains_key(key) {
            problems.push(format!("{} token {}: an end without a start", key.0, key.1));
        }
    }

    let mut overlaps_excused = 0;
    let mut overlaps_found = 0;
    let mut lost_updates = 0;
    let mut out_of_order = 0;
    let mut fenced_excused = 0;
    let mut killed_in_section = 0;
    let mut after_kill = 0;
    let mut after_loss = 0;
    for name in NAMES {
        let mut sections = by_name.remove(name).unwrap_or_default();
        sections.sort_by_key(|s| (s.start, s.token));
        // Exclusion: overlapping sections are allowed only when the one
        // with the smaller token (the earlier acquisition) was lost. A
        // holder killed without an end line was lost too if it had been
        // stopped, inside its section, for longer than the lease allows
        // (it was continued, then killed before it could log the loss):
        // only for sections that began after that stop began. On a server,
        // only a holder whose session ended (see *PostgreSQL* above).
        let stopped_past_lease = |older: &Section, newer: &Section| {
            older.how == End::Killed
                && pauses.iter().any(|p| {
                    p.pid == older.pid
                        && p.stopped_after(older.start)
                        && p.before <= newer.start
                        && p.until.saturating_sub(p.after) >= LEASE.as_nanos() as u64
                })
        };
        let excused = |older: &Section, newer: &Section| {
            if backend.leases_run_out_under_paused_holders() {
                older.how == End::Lost || stopped_past_lease(older, newer)
            } else {
                older.how == End::Lost
            }
        };
        let mut active: Vec<&Section> = Vec::new();
        let mut max_token = 0;
        for s in &sections {
            active.retain(|a| a.end > s.start);
            for a in &active {
                let (older, newer) = if a.token < s.token { (*a, s) } else { (s, *a) };
                if excused(older, newer) {
                    overlaps_excused += 1;
                } else {
                    overlaps_found += 1;
                    // With the older holder's stops, to tell a robbed live
                    // holder from a frozen one.
                    let stops = chaos.stops_of(older.pid);
                    problems.push(format!(
                        "{name}: sections overlap: token {} pid {} [{}, {}] {:?} and token {} pid {} [{}, {}] {:?} \
                         (stops of pid {}: {stops:?}; loss reasons: {:?} {:?})",
                        a.token, a.pid, a.start, a.end, a.how, s.token, s.pid, s.start, s.end, s.how, older.pid,
                        a.reason, s.reason
                    ));
                }
            }
            active.push(s);
            // Fencing: tokens grow in entry order; an entry logged after a
            // newer holder's can only be a holder that then found it lost.
            if s.token < max_token && s.how != End::Lost {
                out_of_order += 1;
                problems.push(format!(
                    "{name}: token {} (pid {}, {:?}) entered after token {max_token}",
                    s.token, s.pid, s.how
                ));
            }
            max_token = max_token.max(s.token);
        }
        let mut by_token: Vec<&Section> = sections.iter().collect();
        by_token.sort_by_key(|s| s.token);
        for pair in by_token.windows(2) {
            match pair[0].how {
                End::Killed => after_kill += 1,
                End::Lost => after_loss += 1,
                _ => {}
            }
        }
        // A refused write must come from a stale holder frozen after its
        // last check, with a smaller token.
        for s in &sections {
            let End::Fenced(found) = s.how else { continue };
            let excused = found < s.token
                && sections.iter().find(|c| c.token == found).is_some_and(|c| {
                    c.how == End::Committed
                        && pauses
                            .iter()
                            .any(|p| p.pid == c.pid && p.stopped_after(c.end) && p.before <= s.end)
                });
            if excused {
                fenced_excused += 1;
            } else {
                problems.push(format!(
                    "{name}: token {} (pid {}) was fenced out by token {found}, unexplained",
                    s.token, s.pid
                ));
            }
        }
        // The counter: every commit counted once; a killed holder may have
        // written without logging its E.
        let completed = sections.iter().filter(|s| s.how == End::Committed).count() as u64;
        let killed = sections.iter().filter(|s| s.how == End::Killed).count() as u64;
        killed_in_section += killed;
        let file = File::open(counter_path(work, name)).unwrap();
        let (value, last) = read_counter(&file);
        if value < completed || value > completed + killed {
            lost_updates += 1;
            problems.push(format!(
                "{name}: counter {value}, but {completed} commits and {killed} sections cut by a kill"
            ));
        }
        let max_committed = sections
            .iter()
            .filter(|s| s.how == End::Committed)
            .map(|s| s.token)
            .max()
            .unwrap_or(0);
        if last < max_committed {
            lost_updates += 1;
            problems.push(format!(
                "{name}: counter last written by token {last}, below committed token {max_committed}"
            ));
        }
    }

    let count = |c: &str| count(&text, c);
    tally.check_the_end(&text, &left);
    // A running holder loses its lock only through its own state: frozen
    // past its lease (LeaseExpired), its lock removed or replaced. Renewal
    // takes no lock another process could hold, so no frozen neighbour
    // can make it fail (issue 28).
    if let Some(n) = tally.lost_reasons.get("RenewalFailed")
        && backend.strategy().is_some()
    {
        let n = *n;
        tally
            .problems
            .push(format!("{n} holders lost their lock to a failed renewal"));
    }
    let (lost_reasons, errors, terminations) = (&tally.lost_reasons, &tally.errors, chaos.terminations);
    eprintln!(
        "torture [{label}]: {procs} procs x {tasks} tasks, {secs} s of chaos, {:.1} s in all\n  \
         holds {} (committed {}, lost {} {lost_reasons:?}, fenced out {} [excused {fenced_excused}], cut by kill {killed_in_section})\n  \
         kills {} pauses {} sessions ended {terminations} acquire errors {errors:?}\n  \
         successors of killed holders {after_kill}, of lost holders {after_loss}, overlaps with a lost holder {overlaps_excused}\n  \
         {}\n  \
         overlaps found: {overlaps_found}, lost updates: {lost_updates}, tokens out of order: {out_of_order}, violations: {}",
        arena.began.elapsed().as_secs_f64(),
        count("S "),
        count("E "),
        count("L "),
        count("F "),
        chaos.kills.len(),
        pauses.len(),
        tally.survivors(&chaos, cleaned, &left),
        tally.problems.len(),
    );
    arena.fail_on(&tally.problems);
}

#[test]
fn torture_exclusive_file() {
    torture(Backend::ExclusiveFile);
}

// The directory layout: Windows cannot lock a directory.
#[cfg(unix)]
#[test]
fn torture_directory() {
    torture(Backend::Directory);
}

#[cfg(all(feature = "postgres", unix))]
#[test]
fn torture_postgres() {
    torture(Backend::Postgres);
}

/// The checker's excuse for a fenced-out write (and for a killed holder's
/// overlap) asks whether the stale holder was stopped after its own last
/// clock reading. A SIGSTOP sent to a process running on the other core
/// lands a few µs after `kill` returns, so the process can read its clock
/// after the chaos noted `after`: seen in CI, where a holder frozen right
/// after its last check was reported as "unexplained" because its check
/// was logged 5 µs after `after`.
#[test]
fn a_stop_that_lands_after_the_holders_last_reading_excuses_it() {
    let pause = torture::Pause {
        pid: 1,
        before: 1_000_000,
        after: 1_010_000,
        until: 700_000_000,
    };
    // Read its clock 5 µs after `kill` returned, then stopped.
    assert!(pause.stopped_after(1_015_000));
    // Running again after the pause: not stopped after that reading.
    assert!(!pause.stopped_after(700_000_001));
    // A reading long before the pause: stopped after it too.
    assert!(pause.stopped_after(10));
}
