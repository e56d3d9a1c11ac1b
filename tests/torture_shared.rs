//! Torture for shared locks and semaphores: child processes × tasks
//! contend on two names while a chaos loop SIGKILLs children (and starts
//! replacements) and SIGSTOPs them for longer than the lease, as
//! `tests/torture.rs` does for exclusive locks. One test per kind ×
//! backend: both file strategies, and (feature `postgres`) PostgreSQL, on
//! a throwaway server the test starts (`tests/support/pg_server.rs`),
//! where the chaos also ends random client sessions (see *PostgreSQL*
//! below). Every invariant is checked afterwards from one shared log:
//!
//! - shared locks (a mix of readers and writers): a writer's section
//!   overlaps no other section; readers overlap only readers;
//! - semaphores of [`PERMITS`] permits: at no moment are more than
//!   [`PERMITS`] sections of a name in progress.
//!
//! As in `tests/torture.rs`, the only excuse for an overlap is a lost
//! lock: two sections may overlap only when the one acquired first
//! (judged by fencing tokens, see [`acquired_before`]) was lost. A holder
//! that learns of its loss (`lost()`, or `is_lost()` at the end) stops at
//! once and logs `L`, never `E`. A SIGSTOPped holder whose lease ran out
//! while it was stopped finds its lock lost when continued, so the stop is
//! no violation; a SIGKILLed holder's section ends when it was silenced
//! (killed, or stopped in the stop it was killed in), or at the first stop
//! after it began: every stop outlasts the lease, so a holder continued
//! and killed before it could log its `L` had acted as holder only until
//! that stop. (`tests/torture.rs` lacks this last rule; it matters more
//! here, where four holders of a name can be in progress at once.)
//!
//! Scale: `LEASEHOLD_TORTURE_PROCS` (default 3), `LEASEHOLD_TORTURE_TASKS`
//! (tasks per process, default 4), `LEASEHOLD_TORTURE_SECS` (default 20):
//! each test (kind × backend) runs chaos for a third of it, so CI's 45 s
//! makes the four file tests take well under a minute. The PostgreSQL
//! pair, as CI runs it:
//!
//! ```sh
//! LEASEHOLD_TORTURE_SECS=30 cargo test --features postgres --test torture_shared postgres -- --nocapture
//! ```
//!
//! # PostgreSQL
//!
//! As in `tests/torture.rs`: the server keeps a session's advisory locks
//! for as long as the session lives, and a SIGSTOPped process's
//! connection stays open, so a paused holder keeps its lock through the
//! pause (its waiters wait), finds on waking that its lease ran out
//! (`LeaseExpired`), and lets go; a killed one's session ends with it.
//! The chaos also ends random client sessions on the server
//! (`pg_terminate_backend`, as a DBA, a crashed backend or a restart
//! would): a holder whose session ended may still run until its lease's
//! cutoff, and its successor (reader, writer or permit) must wait that
//! out. So the checker's rules are the same, with no new excuse: an
//! overlap is excused only when the one acquired first stopped on
//! `lost()` without committing; and the rule above that ends a killed
//! section at its first stop does not apply (a stop does not end a hold
//! on a server). Leftovers are advisory locks or client sessions still
//! there `PG_SESSIONS_END_WITHIN` after the last child ended, names a
//! fresh `Locker` lists as held, or a name (all [`PERMITS`] of its
//! permits, for semaphores) a fresh `Locker` cannot take within
//! [`PG_WAIT_OUT`] (a killed holder's row is waited out, a lease after
//! it is found).
//!
//! # The log
//!
//! One `write(2)` per line on an `O_APPEND` descriptor, times from
//! `CLOCK_MONOTONIC` (shared by all processes; the system time on
//! Windows):
//!
//! - `S name id role token pid ns`: entered, right after the acquisition
//!   returned. `id` is unique per section (`pid.task.seq`); `role` is `R`
//!   (shared), `W` (exclusive) or `P` (a permit).
//! - `E name id pid ns`: left; `ns` is the last moment the holder knew it
//!   held: taken *before* the final `is_lost()` check that precedes the
//!   write, so a SIGSTOP between the check and the write cannot make a
//!   correct library look wrong.
//! - `L name id pid ns reason`: `lost()` fired (or `is_lost()` at the
//!   end). `reason` is the `LossReason` variant (`LeaseExpired`,
//!   `SessionLost`, ...).
//! - `B name id pid what`: the guard was not what was asked for.
//! - `X pid error`: an acquisition failed; the task retries.
//! - `Z pid acquisitions handoffs reclaimed_dead reclaimed_expired lost max_wait_us`:
//!   a child's summary on a clean exit (both its lockers summed).

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold::{Error, LockGuard, Locker};

#[path = "support/torture.rs"]
mod torture;
use torture::{Arena, Backend, End, LEASE, Section, Tally, Turn, Worker, count, env_or, mono_ns};

/// `shared` or `semaphore`.
const KIND_ENV: &str = "LEASEHOLD_TORTURE_SHARED_CHILD_KIND";

const NAMES: [&str; 2] = ["alpha", "beta"];
const PERMITS: u32 = 3;

/// How much longer holds are than on Unix. Under Wine every file
/// operation of every process is a round trip to one server process, so a
/// permit costs 50 to 100 ms of it while the others wait: with holds of a
/// few milliseconds, holders never overlapped and the run proved nothing.
/// Ten times longer holds overlap there.
const HOLD_SCALE: u64 = if cfg!(windows) { 10 } else { 1 };

/// How long a fresh `Locker` may wait for a name after the children
/// ended: a killed holder's row is waited out, a lease after a taker
/// first finds its session gone (plus a poll; docs/guarantees.md, *No
/// successor while a holder whose session ended may still run*).
const PG_WAIT_OUT: Duration = Duration::from_millis(LEASE.as_millis() as u64 + 2_000);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Shared,
    Semaphore,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Shared => "shared",
            Kind::Semaphore => "semaphore",
        }
    }
}

#[test]
fn child_process_entry() {
    torture::child_entry(|child| {
        let kind = match std::env::var(KIND_ENV).expect("kind").as_str() {
            "shared" => Kind::Shared,
            _ => Kind::Semaphore,
        };
        // Two lockers per process: the shared guards of one Locker share
        // one hold, those of two do not, and both ways must exclude writers.
        torture::run_tasks("torture_shared", child, 2, move |worker| task(worker, kind))
    });
}

async fn task(mut worker: Worker, kind: Kind) {
    let (mut rng, locker) = (worker.rng(), worker.locker.clone());
    let mut seq = 0u64;
    while !worker.told_to_stop() {
        let name = NAMES[rng.below(NAMES.len() as u64) as usize];
        let role = match kind {
            Kind::Semaphore => 'P',
            // One writer for every two readers.
            Kind::Shared if rng.below(3) == 0 => 'W',
            Kind::Shared => 'R',
        };
        seq += 1;
        let id = worker.section_id(seq);
        let guard = match worker.take_turn(acquire(&locker, name, role)).await {
            Turn::Held(guard) => guard,
            Turn::Failed => continue,
            Turn::Stop => return,
        };
        worker.log.entered(name, &id, role, &guard);
        // Readers hold longer than writers, so that they overlap.
        let work_ms = match role {
            'R' => 2 + rng.below(25),
            'W' => 1 + rng.below(8),
            _ => 2 + rng.below(18),
        } * HOLD_SCALE;
        let outcome = tokio::select! {
            () = guard.lost() => Err(mono_ns()),
            o = section(&guard, work_ms) => o,
        };
        worker.log.left(name, &id, outcome, &guard).await;
        drop(guard);
        tokio::time::sleep(Duration::from_millis(rng.below(4))).await;
    }
}

async fn acquire(locker: &Locker, name: &str, role: char) -> leasehold::Result<LockGuard> {
    match role {
        'R' => locker.acquire_shared(name).await,
        'W' => locker.acquire(name).await,
        _ => locker.semaphore(name, PERMITS)?.acquire().await,
    }
}

/// The section: some work, then the last moment known held, then the
/// final check. `Ok(ns)` if it held to the end, `Err(ns)` if it was lost.
async fn section(guard: &LockGuard, work_ms: u64) -> Result<u64, u64> {
    tokio::time::sleep(Duration::from_millis(work_ms)).await;
    let ns = mono_ns();
    if guard.is_lost() { Err(ns) } else { Ok(ns) }
}

// ---------------------------------------------------------------- parent

/// Whether `x` was acquired before `y`, by their fencing tokens: every
/// exclusive acquisition (and every permit) takes a new, greater token; a
/// shared holder takes the counter as it stands, so it is no less than
/// the token of every writer before it and less than that of every writer
/// after it. Two readers are not ordered (never asked).
fn acquired_before(x: &Section, y: &Section) -> bool {
    match (x.role, y.role) {
        ('W', 'R') => x.token <= y.token,
        _ => x.token < y.token,
    }
}

fn torture(kind: Kind, backend: Backend) {
    let procs = env_or("LEASEHOLD_TORTURE_PROCS", 3).max(1);
    let tasks = env_or("LEASEHOLD_TORTURE_TASKS", 4).max(1);
    // A third per kind × backend: these run two at a time.
    let secs = (env_or("LEASEHOLD_TORTURE_SECS", 20) / 3).max(2);
    let label = format!("{}/{}", kind.label(), backend.label());
    let arena = Arena::new("torture_shared", backend, label);
    let label = &arena.label;
    let chaos = arena.chaos(procs, tasks, secs, &[(KIND_ENV, kind.label())]);
    let pauses = &chaos.pauses;
    let (cleaned, left) = arena.leftovers(|locker| pg_leftovers(locker, kind));

    // The log.
    let text = arena.log();
    let mut tally = Tally::default();
    let mut by_name: BTreeMap<String, Vec<Section>> = BTreeMap::new();
    for section in torture::sections(&arena, &chaos, &mut tally, &text, &[]) {
        by_name.entry(section.name.clone()).or_default().push(section);
    }
    let problems = &mut tally.problems;

    let mut overlaps_excused = 0u64;
    let mut overlaps_found = 0u64;
    let mut out_of_order = 0u64;
    let mut reader_overlaps = 0u64;
    let mut max_readers = 0usize;
    let mut max_permits = 0usize;
    let mut killed_in_section = 0u64;
    let stops_of = |pid: u32| chaos.stops_of(pid);
    for name in NAMES {
        let mut sections = by_name.remove(name).unwrap_or_default();
        sections.sort_by_key(|s| (s.start, s.token));
        killed_in_section += sections.iter().filter(|s| s.how == End::Killed).count() as u64;
        let mut active: Vec<&Section> = Vec::new();
        // Entry order: an entry logged after that of a holder acquired
        // later than it can only be a holder that then found it lost.
        let mut max_writer = None::<&Section>;
        let mut max_other = None::<&Section>;
        for s in &sections {
            active.retain(|a| a.end > s.start);
            // (Permits are not ordered so: a permit's token is taken after
            // it joined, and two permits may log their entries in either
            // order.)
            let ordered_kind = kind == Kind::Shared;
            for later in [max_writer, max_other].into_iter().flatten() {
                let ordered = ordered_kind && !(s.role == 'R' && later.role == 'R');
                if ordered && s.how != End::Lost && acquired_before(s, later) {
                    out_of_order += 1;
                    problems.push(format!(
                        "{name}: {s} entered after {later}, which was acquired after it"
                    ));
                }
            }
            match kind {
                Kind::Shared => {
                    for a in &active {
                        if a.role == 'R' && s.role == 'R' {
                            reader_overlaps += 1;
                            continue;
                        }
                        let older = if acquired_before(a, s) { *a } else { s };
                        if older.how == End::Lost {
                            overlaps_excused += 1;
                        } else {
                            overlaps_found += 1;
                            problems.push(format!(
                                "{name}: sections overlap: {a} and {s} (stops of pid {}: {:?})",
                                older.pid,
                                stops_of(older.pid)
                            ));
                        }
                    }
                    if s.role == 'R' {
                        let readers = 1 + active.iter().filter(|a| a.role == 'R').count();
                        max_readers = max_readers.max(readers);
                    }
                }
                Kind::Semaphore => {
                    // Of those in progress, a lost one acquired before the
                    // newest no longer counts: the newest may have taken
                    // its permit.
                    let mut set: Vec<&Section> = active.clone();
                    set.push(s);
                    let newest = set.iter().map(|x| x.token).max().unwrap();
                    let counted: Vec<&&Section> = set
                        .iter()
                        .filter(|x| !(x.how == End::Lost && x.token < newest))
                        .collect();
                    if set.len() > PERMITS as usize && counted.len() <= PERMITS as usize {
                        overlaps_excused += 1;
                    }
                    max_permits = max_permits.max(counted.len());
                    if counted.len() > PERMITS as usize {
                        overlaps_found += 1;
                        let list: Vec<String> = set
                            .iter()
                            .map(|x| format!("{x} (stops: {:?})", stops_of(x.pid)))
                            .collect();
                        problems.push(format!(
                            "{name}: {} holders of {PERMITS} permits at once:\n    {}",
                            counted.len(),
                            list.join("\n    ")
                        ));
                    }
                }
            }
            active.push(s);
            let slot = if s.role == 'W' {
                &mut max_writer
            } else {
                &mut max_other
            };
            if slot.is_none_or(|m| m.token < s.token) {
                *slot = Some(s);
            }
        }
    }

    let count = |c: &str| count(&text, c);
    let roles = |r: &str| {
        text.lines()
            .filter(|l| l.starts_with("S ") && l.split(' ').nth(3) == Some(r))
            .count()
    };
    tally.check_the_end(&text, &left);
    // A running holder loses its lock only through its own state (frozen
    // past its lease, its record removed): renewal takes no lock another
    // process could hold, and a member's marker read torn is still its
    // own (issue 28), so no frozen or busy neighbour makes it fail.
    if let Some(n) = tally.lost_reasons.get("RenewalFailed")
        && backend.strategy().is_some()
    {
        let n = *n;
        tally
            .problems
            .push(format!("{n} holders lost their lock to a failed renewal"));
    }
    match kind {
        Kind::Shared if reader_overlaps == 0 => tally
            .problems
            .push("readers never overlapped: the test proved nothing".into()),
        Kind::Semaphore if max_permits < 2 => tally
            .problems
            .push("permit holders never overlapped: the test proved nothing".into()),
        _ => {}
    }
    let (lost_reasons, errors, terminations) = (&tally.lost_reasons, &tally.errors, chaos.terminations);
    eprintln!(
        "torture_shared [{label}]: {procs} procs x {tasks} tasks, {secs} s of chaos, {:.1} s in all\n  \
         holds {} (readers {}, writers {}, permits {}; completed {}, lost {} {lost_reasons:?}, cut by kill {killed_in_section})\n  \
         kills {} pauses {} sessions ended {terminations} acquire errors {errors:?}\n  \
         reader/reader overlaps {reader_overlaps} (most readers at once {max_readers}), \
         most permits at once {max_permits}, overlaps excused by a loss {overlaps_excused}\n  \
         {}\n  \
         overlaps found: {overlaps_found}, entries out of order: {out_of_order}, violations: {}",
        arena.began.elapsed().as_secs_f64(),
        count("S "),
        roles("R"),
        roles("W"),
        roles("P"),
        count("E "),
        count("L "),
        chaos.kills.len(),
        pauses.len(),
        tally.survivors(&chaos, cleaned, &left),
        tally.problems.len(),
    );
    arena.fail_on(&tally.problems);
}

/// What a fresh `Locker` on the server finds still held (besides what
/// `Arena::leftovers` finds): not all [`PERMITS`] permits (semaphores) or
/// not the exclusive lock (shared locks) to be had within [`PG_WAIT_OUT`].
async fn pg_leftovers(locker: Locker, kind: Kind) -> Vec<String> {
    let mut left = Vec::new();
    for name in NAMES {
        match kind {
            Kind::Shared => match locker.acquire_timeout(name, PG_WAIT_OUT).await {
                Ok(_guard) => {}
                Err(Error::Timeout { .. }) => left.push(format!(
                    "{name} still held {PG_WAIT_OUT:?} after it was first asked for"
                )),
                Err(e) => panic!("acquire {name}: {e}"),
            },
            Kind::Semaphore => {
                // All the permits at once: each may have to wait out a
                // holder that was killed (its session ended).
                let semaphore = locker.semaphore(name, PERMITS).expect("semaphore");
                let takers: Vec<_> = (0..PERMITS)
                    .map(|_| {
                        let semaphore = semaphore.clone();
                        tokio::spawn(async move { semaphore.acquire_timeout(PG_WAIT_OUT).await })
                    })
                    .collect();
                let mut guards = Vec::new();
                for taker in takers {
                    match taker.await.expect("taker") {
                        Ok(guard) => guards.push(guard),
                        Err(Error::Timeout { .. }) => {}
                        Err(e) => panic!("acquire a permit of {name}: {e}"),
                    }
                }
                if guards.len() < PERMITS as usize {
                    left.push(format!(
                        "{name}: only {} of {PERMITS} permits to be had within {PG_WAIT_OUT:?}",
                        guards.len()
                    ));
                }
            }
        }
    }
    left
}

#[test]
fn torture_shared_exclusive_file() {
    torture(Kind::Shared, Backend::ExclusiveFile);
}

// The directory layout: Windows cannot lock a directory.
#[cfg(unix)]
#[test]
fn torture_shared_directory() {
    torture(Kind::Shared, Backend::Directory);
}

#[test]
fn torture_semaphore_exclusive_file() {
    torture(Kind::Semaphore, Backend::ExclusiveFile);
}

// The directory layout: Windows cannot lock a directory.
#[cfg(unix)]
#[test]
fn torture_semaphore_directory() {
    torture(Kind::Semaphore, Backend::Directory);
}

#[cfg(all(feature = "postgres", unix))]
#[test]
fn torture_shared_postgres() {
    torture(Kind::Shared, Backend::Postgres);
}

#[cfg(all(feature = "postgres", unix))]
#[test]
fn torture_semaphore_postgres() {
    torture(Kind::Semaphore, Backend::Postgres);
}
