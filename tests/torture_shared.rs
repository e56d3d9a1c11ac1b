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
//! there [`PG_SESSIONS_END_WITHIN`] after the last child ended, names a
//! fresh `Locker` lists as held, or a name (all [`PERMITS`] of its
//! permits, for semaphores) a fresh `Locker` cannot take within
//! [`PG_WAIT_OUT`] (a killed holder's row is waited out, a lease after
//! it is found).
//!
//! # The log
//!
//! One `write(2)` per line on an `O_APPEND` descriptor, times from
//! `CLOCK_MONOTONIC` (shared by all processes):
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

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};

#[path = "support/reexec.rs"]
mod reexec;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leasehold::{Error, LockGuard, Locker, Strategy};
use nix::sys::signal::{Signal, kill};
use nix::time::{ClockId, clock_gettime};
use nix::unistd::Pid;

/// Set (to a [`Backend::label`]) in a child's environment: the child's backend.
const ROLE_ENV: &str = "LEASEHOLD_TORTURE_SHARED_CHILD_STRATEGY";
/// The server's URL, for a child on PostgreSQL.
#[cfg(feature = "postgres")]
const PG_URL_ENV: &str = "LEASEHOLD_TORTURE_SHARED_CHILD_PG_URL";
/// `shared` or `semaphore`.
const KIND_ENV: &str = "LEASEHOLD_TORTURE_SHARED_CHILD_KIND";
const WORK_ENV: &str = "LEASEHOLD_TORTURE_SHARED_CHILD_WORKDIR";
const CHILD_TASKS_ENV: &str = "LEASEHOLD_TORTURE_SHARED_CHILD_TASKS";
const CHILD_TTL_ENV: &str = "LEASEHOLD_TORTURE_SHARED_CHILD_TTL_SECS";

const NAMES: [&str; 2] = ["alpha", "beta"];
const PERMITS: u32 = 3;
const LEASE: Duration = Duration::from_millis(600);
const RENEW: Duration = Duration::from_millis(150);

/// How long after the last child ended the server may still show its
/// sessions or their locks: a killed child's session ends when the server
/// reads the end of its socket, at once on a local one.
#[cfg(feature = "postgres")]
const PG_SESSIONS_END_WITHIN: Duration = Duration::from_secs(5);

/// How long a fresh `Locker` may wait for a name after the children
/// ended: a killed holder's row is waited out, a lease after a taker
/// first finds its session gone (plus a poll; docs/guarantees.md, *No
/// successor while a holder whose session ended may still run*).
#[cfg(feature = "postgres")]
const PG_WAIT_OUT: Duration = Duration::from_millis(LEASE.as_millis() as u64 + 2_000);

#[cfg(feature = "postgres")]
#[path = "support/pg_server.rs"]
mod pg_server;

#[path = "support/torture_backend.rs"]
mod torture_backend;
use torture_backend::Backend;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Shared,
    Semaphore,
}

#[test]
fn child_process_entry() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    let backend = *Backend::ALL
        .iter()
        .find(|b| b.label() == role)
        .unwrap_or_else(|| panic!("unknown backend {role:?}"));
    let kind = match std::env::var(KIND_ENV).expect("kind").as_str() {
        "shared" => Kind::Shared,
        _ => Kind::Semaphore,
    };
    let work = PathBuf::from(std::env::var_os(WORK_ENV).expect("work dir"));
    let tasks: usize = std::env::var(CHILD_TASKS_ENV)
        .expect("tasks")
        .parse()
        .expect("tasks");
    let ttl: u64 = std::env::var(CHILD_TTL_ENV).expect("ttl").parse().expect("ttl");
    // No child outlives this, whatever the parent does.
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(ttl));
        std::process::exit(3);
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let code = rt.block_on(child_main(backend, kind, work, tasks));
    std::process::exit(code);
}

fn mono_ns() -> u64 {
    let ts = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("clock_gettime");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// xorshift64*, enough for picking names, roles, durations and victims.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// The shared log: one `write(2)` per line, `O_APPEND`.
struct Log(File);

impl Log {
    fn open(path: &Path) -> Self {
        Log(OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .expect("open log"))
    }

    fn line(&self, line: String) {
        let bytes = format!("{line}\n");
        let written = (&self.0).write(bytes.as_bytes()).expect("append to log");
        assert_eq!(written, bytes.len(), "short append to the log");
    }
}

async fn child_main(backend: Backend, kind: Kind, work: PathBuf, tasks: usize) -> i32 {
    let pid = std::process::id();
    // Two lockers per process: the shared guards of one Locker share one
    // hold, those of two do not, and both ways must exclude writers.
    let lockers: Vec<Locker> = (0..2)
        .map(|_| {
            let builder = Locker::builder().fencing(true).lease(LEASE).renew_interval(RENEW);
            let builder = match backend.strategy() {
                Some(strategy) => builder.directory(work.join("locks")).strategy(strategy),
                #[cfg(feature = "postgres")]
                None => builder.postgres(std::env::var(PG_URL_ENV).expect("server url")),
                #[cfg(not(feature = "postgres"))]
                None => unreachable!("every backend but PostgreSQL has a strategy"),
            };
            builder.build().expect("locker")
        })
        .collect();
    let log = Arc::new(Log::open(&work.join("log")));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop_file = work.join("stop");
    tokio::spawn(async move {
        while !stop_file.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = stop_tx.send(true);
        std::future::pending::<()>().await;
    });
    let max_wait = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            tokio::spawn(task(
                lockers[i % lockers.len()].clone(),
                kind,
                Arc::clone(&log),
                i as u64,
                stop_rx.clone(),
                Arc::clone(&max_wait),
            ))
        })
        .collect();
    let mut ok = true;
    for handle in handles {
        if let Err(e) = handle.await {
            eprintln!("torture_shared child {pid}: a task failed: {e}");
            ok = false;
        }
    }
    let mut sums = [0u64; 5];
    for locker in &lockers {
        let st = locker.stats();
        for (sum, v) in sums.iter_mut().zip([
            st.acquisitions,
            st.handoffs,
            st.reclaimed_dead_owner,
            st.reclaimed_expired_lease,
            st.lost,
        ]) {
            *sum += v;
        }
    }
    log.line(format!(
        "Z {pid} {} {} {} {} {} {}",
        sums[0],
        sums[1],
        sums[2],
        sums[3],
        sums[4],
        max_wait.load(Ordering::Relaxed)
    ));
    if ok { 0 } else { 1 }
}

async fn task(
    locker: Locker,
    kind: Kind,
    log: Arc<Log>,
    index: u64,
    mut stop: tokio::sync::watch::Receiver<bool>,
    max_wait: Arc<AtomicU64>,
) {
    let pid = std::process::id();
    let mut rng = Rng::new((u64::from(pid) << 8) | index);
    let mut seq = 0u64;
    loop {
        if *stop.borrow() {
            return;
        }
        let name = NAMES[rng.below(NAMES.len() as u64) as usize];
        let role = match kind {
            Kind::Semaphore => 'P',
            // One writer for every two readers.
            Kind::Shared if rng.below(3) == 0 => 'W',
            Kind::Shared => 'R',
        };
        seq += 1;
        let id = format!("{pid}.{index}.{seq}");
        let asked = Instant::now();
        let acquired = tokio::select! {
            r = acquire(&locker, name, role) => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        let guard = match acquired {
            Ok(guard) => guard,
            Err(e) => {
                log.line(format!("X {pid} {}", format!("{e:?}").replace('\n', " ")));
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        max_wait.fetch_max(asked.elapsed().as_micros() as u64, Ordering::Relaxed);
        let token = guard.fencing_token().expect("fencing is on");
        log.line(format!("S {name} {id} {role} {token} {pid} {}", mono_ns()));
        if guard.is_shared() != (role == 'R') {
            log.line(format!(
                "B {name} {id} {pid} is_shared()={} for role {role}",
                guard.is_shared()
            ));
        }
        // Readers hold longer than writers, so that they overlap.
        let work_ms = match role {
            'R' => 2 + rng.below(25),
            'W' => 1 + rng.below(8),
            _ => 2 + rng.below(18),
        };
        let outcome = tokio::select! {
            () = guard.lost() => Err(mono_ns()),
            o = section(&guard, work_ms) => o,
        };
        match outcome {
            Ok(ns) => log.line(format!("E {name} {id} {pid} {ns}")),
            Err(ns) => {
                // No I/O: a lost guard's `ensure_held` reports the loss.
                let reason = match guard.ensure_held().await {
                    Err(Error::Lost { reason, .. }) => format!("{reason:?}"),
                    other => format!("Unknown({other:?})"),
                };
                let reason: String = reason.chars().take_while(char::is_ascii_alphanumeric).collect();
                log.line(format!("L {name} {id} {pid} {ns} {reason}"));
            }
        }
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

fn env_or(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

struct Pause {
    pid: u32,
    /// Just before `kill(SIGSTOP)`.
    #[allow(dead_code)]
    before: u64,
    /// Just after it returned: the process is stopped by then.
    after: u64,
    /// When it was continued (or killed).
    until: u64,
}

/// The children; any still running are killed (by pid) and reaped on drop.
struct Fleet {
    backend: Backend,
    /// The server's URL, on PostgreSQL.
    #[cfg(feature = "postgres")]
    pg_url: Option<String>,
    kind: &'static str,
    work: PathBuf,
    tasks: u64,
    ttl: u64,
    kids: Vec<Child>,
}

impl Fleet {
    fn spawn(&mut self) {
        let mut child = reexec::child_process();
        #[cfg(feature = "postgres")]
        if let Some(url) = &self.pg_url {
            child.env(PG_URL_ENV, url);
        }
        let child = child
            .env(ROLE_ENV, self.backend.label())
            .env(KIND_ENV, self.kind)
            .env(WORK_ENV, &self.work)
            .env(CHILD_TASKS_ENV, self.tasks.to_string())
            .env(CHILD_TTL_ENV, self.ttl.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn child");
        self.kids.push(child);
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for kid in &mut self.kids {
            if let Ok(None) = kid.try_wait() {
                let _ = kill(Pid::from_raw(kid.id() as i32), Signal::SIGKILL);
            }
            let _ = kid.wait();
        }
    }
}

fn signal(pid: u32, sig: Signal) {
    kill(Pid::from_raw(pid as i32), sig).unwrap_or_else(|e| panic!("{sig} to {pid}: {e}"));
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Committed,
    Lost,
    /// No end line: its process was killed.
    Killed,
}

#[derive(Debug, Clone)]
struct Section {
    id: String,
    role: char,
    token: u64,
    pid: u32,
    start: u64,
    /// The last moment the holder may have acted as holder.
    end: u64,
    how: End,
}

impl std::fmt::Display for Section {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} token {} pid {} [{}, {}] {:?}",
            self.role, self.id, self.token, self.pid, self.start, self.end, self.how
        )
    }
}

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
    let label = format!(
        "{}/{}",
        if kind == Kind::Shared {
            "shared"
        } else {
            "semaphore"
        },
        backend.label()
    );
    let began = Instant::now();
    #[cfg(feature = "postgres")]
    let server = (backend == Backend::Postgres).then(pg_server::Server::start);
    #[cfg(feature = "postgres")]
    let pg_url = server.as_ref().map(|server| {
        // The first use creates the tables, and first uses at once race
        // (tests/postgres.rs `lockers_connecting_at_once_to_a_fresh_database_all_build`):
        // create them before the children all connect.
        drop(
            Locker::builder()
                .postgres(server.url())
                .build()
                .expect("create the tables"),
        );
        server.url()
    });
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().to_owned();
    let locks = work.join("locks");
    std::fs::DirBuilder::new().mode(0o700).create(&locks).unwrap();
    let mut fleet = Fleet {
        backend,
        #[cfg(feature = "postgres")]
        pg_url,
        kind: if kind == Kind::Shared {
            "shared"
        } else {
            "semaphore"
        },
        work: work.clone(),
        tasks,
        ttl: secs + 60,
        kids: Vec::new(),
    };
    for _ in 0..procs {
        fleet.spawn();
    }

    // Chaos.
    let mut rng = Rng::new(u64::from(std::process::id()) ^ mono_ns());
    let mut pauses: Vec<Pause> = Vec::new();
    // index into `pauses` of each currently stopped pid, and when to resume it
    let mut stopped: HashMap<u32, (usize, Instant)> = HashMap::new();
    let mut kills: HashMap<u32, u64> = HashMap::new();
    #[cfg_attr(not(feature = "postgres"), allow(unused_mut))]
    let mut terminations = 0;
    let mut early_exits: Vec<(u32, ExitStatus)> = Vec::new();
    let chaos_end = Instant::now() + Duration::from_secs(secs);
    let mut next_action = Instant::now() + Duration::from_millis(300 + rng.below(400));
    while Instant::now() < chaos_end {
        let now = Instant::now();
        let due: Vec<u32> = stopped
            .iter()
            .filter(|(_, (_, at))| *at <= now)
            .map(|(pid, _)| *pid)
            .collect();
        for pid in due {
            let (i, _) = stopped.remove(&pid).unwrap();
            signal(pid, Signal::SIGCONT);
            pauses[i].until = mono_ns();
        }
        if now >= next_action && !fleet.kids.is_empty() {
            let roll = rng.below(10);
            if roll < 4 {
                // SIGKILL anyone, stopped or not, and start a replacement.
                let i = rng.below(fleet.kids.len() as u64) as usize;
                let mut kid = fleet.kids.swap_remove(i);
                let pid = kid.id();
                kills.insert(pid, mono_ns());
                signal(pid, Signal::SIGKILL);
                kid.wait().unwrap();
                if let Some((p, _)) = stopped.remove(&pid) {
                    pauses[p].until = mono_ns();
                }
                fleet.spawn();
            } else if roll >= 8 && backend.strategy().is_none() {
                // End a random client session on the server (a holder's,
                // a waiter's or a listener's), as a DBA's
                // `pg_terminate_backend` or a crashed backend would.
                #[cfg(feature = "postgres")]
                if let Some(url) = fleet.pg_url.as_deref() {
                    terminations += pg_server::terminate_a_session(url, &mut |n| rng.below(n));
                }
            } else if roll < 8 {
                // SIGSTOP a running child for longer than the lease.
                let running: Vec<u32> = fleet
                    .kids
                    .iter()
                    .map(Child::id)
                    .filter(|pid| !stopped.contains_key(pid))
                    .collect();
                if !running.is_empty() {
                    let pid = running[rng.below(running.len() as u64) as usize];
                    let before = mono_ns();
                    signal(pid, Signal::SIGSTOP);
                    let after = mono_ns();
                    pauses.push(Pause {
                        pid,
                        before,
                        after,
                        until: u64::MAX,
                    });
                    let hold = LEASE + Duration::from_millis(100 + rng.below(500));
                    stopped.insert(pid, (pauses.len() - 1, Instant::now() + hold));
                }
            }
            next_action = Instant::now() + Duration::from_millis(300 + rng.below(500));
        }
        // Nobody may exit before being told to.
        let mut i = 0;
        while i < fleet.kids.len() {
            if let Some(status) = fleet.kids[i].try_wait().unwrap() {
                let mut kid = fleet.kids.swap_remove(i);
                let _ = kid.wait(); // already reaped by try_wait
                early_exits.push((kid.id(), status));
                fleet.spawn();
            } else {
                i += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }

    // Stop: continue the frozen, tell everyone, wait with a deadline.
    for (pid, (i, _)) in stopped.drain() {
        signal(pid, Signal::SIGCONT);
        pauses[i].until = mono_ns();
    }
    File::create(work.join("stop")).unwrap();
    let told = Instant::now();
    let deadline = told + Duration::from_secs(15);
    let mut finished: Vec<(u32, ExitStatus)> = Vec::new();
    let mut hung: Vec<u32> = Vec::new();
    for kid in &mut fleet.kids {
        loop {
            if let Some(status) = kid.try_wait().unwrap() {
                finished.push((kid.id(), status));
                break;
            }
            if Instant::now() >= deadline {
                hung.push(kid.id());
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let stop_time = told.elapsed();
    drop(fleet); // kills and reaps any that hung
    assert!(
        hung.is_empty(),
        "[{label}] children {hung:?} did not stop within 15 s of being told"
    );
    for (pid, status) in &finished {
        assert!(status.success(), "[{label}] child {pid} exited with {status}");
    }
    assert!(
        early_exits.is_empty(),
        "[{label}] children exited before being told to: {early_exits:?}"
    );

    let (cleaned, left) = match backend.strategy() {
        Some(strategy) => file_leftovers(&locks, strategy),
        #[cfg(feature = "postgres")]
        None => (0, pg_leftovers(server.as_ref().expect("the server"), kind)),
        #[cfg(not(feature = "postgres"))]
        None => unreachable!("every backend but PostgreSQL has a strategy"),
    };

    // The log.
    let text = std::fs::read_to_string(work.join("log")).unwrap();
    // id -> (name, role, token, pid, start)
    let mut starts: BTreeMap<String, (String, char, u64, u32, u64)> = BTreeMap::new();
    let mut ends: HashMap<String, (End, u64)> = HashMap::new();
    let mut lost_reasons: BTreeMap<String, u64> = BTreeMap::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut summaries = Vec::new();
    let mut problems: Vec<String> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| -> u64 {
            f.get(i)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("malformed log line {line:?}"))
        };
        match f[0] {
            "S" => {
                let role = f[3].chars().next().unwrap();
                let entry = (f[1].to_owned(), role, num(4), num(5) as u32, num(6));
                if starts.insert(f[2].to_owned(), entry).is_some() {
                    problems.push(format!("section id {} logged twice", f[2]));
                }
            }
            "E" | "L" => {
                let how = if f[0] == "E" { End::Committed } else { End::Lost };
                if how == End::Lost {
                    let reason = f.get(5).copied().unwrap_or("");
                    *lost_reasons.entry(reason.to_owned()).or_default() += 1;
                }
                if ends.insert(f[2].to_owned(), (how, num(4))).is_some() {
                    problems.push(format!("section id {} ended twice", f[2]));
                }
            }
            "B" => problems.push(format!("wrong kind of guard: {line}")),
            "X" => {
                let kind: String = f[2].chars().take_while(|c| c.is_alphanumeric()).collect();
                let seen = errors.entry(kind).or_default();
                if *seen == 0 {
                    eprintln!("torture_shared [{label}]: first acquire error of its kind: {line}");
                }
                *seen += 1;
                if !(f[2].starts_with("Io") || f[2].starts_with("Lost")) {
                    problems.push(format!("unexpected acquire error: {line}"));
                }
            }
            "Z" => summaries.push((2..=7).map(num).collect::<Vec<u64>>()),
            _ => panic!("malformed log line {line:?}"),
        }
    }
    // When a killed process stopped acting: at the kill, or at the start of
    // the stop it was killed in.
    let silenced = |pid: u32| -> Option<u64> {
        let killed = *kills.get(&pid)?;
        let frozen = pauses
            .iter()
            .filter(|p| p.pid == pid && p.after <= killed && p.until >= killed)
            .map(|p| p.after)
            .min();
        Some(frozen.unwrap_or(killed))
    };
    // A killed section that was stopped after it began, for longer than
    // the lease (every stop is), acted as holder only until that stop:
    // once continued, its lease had run out, so its next look
    // (`is_lost()`) would have said `L` had it not been killed first.
    // Not on a server: there a paused holder keeps its lock through the
    // stop (see *PostgreSQL* above), so nobody may enter before the kill
    // (or the stop it was killed in) ended its session.
    let first_stop_after = |pid: u32, start: u64| -> Option<u64> {
        if !backend.leases_run_out_under_paused_holders() {
            return None;
        }
        pauses
            .iter()
            .filter(|p| p.pid == pid && p.after >= start)
            .map(|p| p.after)
            .min()
    };
    let mut by_name: BTreeMap<String, Vec<Section>> = BTreeMap::new();
    for (id, (name, role, token, pid, start)) in &starts {
        let (how, end) = match ends.get(id) {
            Some((how, ns)) => (*how, *ns),
            None => match silenced(*pid) {
                Some(at) => (
                    End::Killed,
                    first_stop_after(*pid, *start).map_or(at, |stop| stop.min(at)),
                ),
                None => {
                    problems.push(format!(
                        "{name} {id}: pid {pid} entered, was never killed, and never left"
                    ));
                    continue;
                }
            },
        };
        by_name.entry(name.clone()).or_default().push(Section {
            id: id.clone(),
            role: *role,
            token: *token,
            pid: *pid,
            start: *start,
            end,
            how,
        });
    }
    for id in ends.keys() {
        if !starts.contains_key(id) {
            problems.push(format!("section {id}: an end without a start"));
        }
    }

    let mut overlaps_excused = 0u64;
    let mut overlaps_found = 0u64;
    let mut out_of_order = 0u64;
    let mut reader_overlaps = 0u64;
    let mut max_readers = 0usize;
    let mut max_permits = 0usize;
    let mut killed_in_section = 0u64;
    // A holder's stops, to tell a robbed live holder from a frozen one.
    let stops_of = |pid: u32| -> Vec<(u64, u64)> {
        pauses
            .iter()
            .filter(|p| p.pid == pid)
            .map(|p| (p.after, p.until))
            .collect()
    };
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

    let count = |c: &str| text.lines().filter(|l| l.starts_with(c)).count();
    let roles = |r: &str| {
        text.lines()
            .filter(|l| l.starts_with("S ") && l.split(' ').nth(3) == Some(r))
            .count()
    };
    let sum = |i: usize| summaries.iter().map(|z| z[i]).sum::<u64>();
    let max_wait_ms = summaries.iter().map(|z| z[5]).max().unwrap_or(0) as f64 / 1000.0;
    if !left.is_empty() {
        problems.push(format!("left behind: {left:?}"));
    }
    if count("E ") == 0 {
        problems.push("no section ever completed".into());
    }
    match kind {
        Kind::Shared if reader_overlaps == 0 => {
            problems.push("readers never overlapped: the test proved nothing".into())
        }
        Kind::Semaphore if max_permits < 2 => {
            problems.push("permit holders never overlapped: the test proved nothing".into())
        }
        _ => {}
    }
    eprintln!(
        "torture_shared [{label}]: {procs} procs x {tasks} tasks, {secs} s of chaos, {:.1} s in all\n  \
         holds {} (readers {}, writers {}, permits {}; completed {}, lost {} {lost_reasons:?}, cut by kill {killed_in_section})\n  \
         kills {} pauses {} sessions ended {terminations} acquire errors {errors:?}\n  \
         reader/reader overlaps {reader_overlaps} (most readers at once {max_readers}), \
         most permits at once {max_permits}, overlaps excused by a loss {overlaps_excused}\n  \
         survivors' stats: acquisitions {} handoffs {} reclaimed dead {} reclaimed expired {} lost {}; max wait {max_wait_ms:.1} ms\n  \
         stopped in {:.2} s; reclaimed at the end {cleaned}, left behind {}\n  \
         overlaps found: {overlaps_found}, entries out of order: {out_of_order}, violations: {}",
        began.elapsed().as_secs_f64(),
        count("S "),
        roles("R"),
        roles("W"),
        roles("P"),
        count("E "),
        count("L "),
        kills.len(),
        pauses.len(),
        sum(0),
        sum(1),
        sum(2),
        sum(3),
        sum(4),
        stop_time.as_secs_f64(),
        left.len(),
        problems.len(),
    );
    if !problems.is_empty() {
        // Keep the log for the analysis; the work directory goes with the test.
        let kept = std::env::temp_dir().join(format!(
            "leasehold-torture_shared-{}-{}.log",
            label.replace('/', "-"),
            std::process::id()
        ));
        let kept = match std::fs::copy(work.join("log"), &kept) {
            Ok(_) => format!("the log is kept in {}", kept.display()),
            Err(e) => format!("the log could not be kept in {}: {e}", kept.display()),
        };
        panic!(
            "[{label}] {} violations ({kept}):\n{}",
            problems.len(),
            problems.join("\n")
        );
    }
}

/// Reclaims what killed children left, then nothing but the fencing
/// counters may remain: the number reclaimed, and what is left (with what
/// is inside it, for the report).
fn file_leftovers(locks: &Path, strategy: Strategy) -> (usize, Vec<String>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cleaner = Locker::builder()
        .directory(locks)
        .strategy(strategy)
        .unreadable_grace(Duration::from_millis(1))
        .build()
        .unwrap();
    let cleaned = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(30), cleaner.clean(false)).await })
        .expect("clean() did not hang")
        .expect("clean()");
    let mut left: Vec<String> = std::fs::read_dir(locks)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".fence"))
        .collect();
    left.sort();
    // What is inside what was left, for the report.
    let left_detail: Vec<String> = left
        .iter()
        .map(|n| {
            let p = locks.join(n);
            match std::fs::read_dir(&p) {
                Ok(rd) => {
                    let mut inner: Vec<String> = rd
                        .map(|e| {
                            let e = e.unwrap();
                            let body = std::fs::read_to_string(e.path()).unwrap_or_default();
                            format!("{} {:?}", e.file_name().to_string_lossy(), body.trim_end())
                        })
                        .collect();
                    inner.sort();
                    format!("{n}/ {inner:?}")
                }
                Err(_) => format!("{n}: {:?}", std::fs::read_to_string(&p).unwrap_or_default()),
            }
        })
        .collect();
    (cleaned.len(), left_detail)
}

/// What the children left on the server: advisory locks or sessions still
/// there [`PG_SESSIONS_END_WITHIN`] after the last one ended (on the
/// test's own server: a server named by `LEASEHOLD_PG_URL` may have other
/// clients), and names a fresh `Locker` finds held: listed, or not all
/// [`PERMITS`] permits (semaphores) or not the exclusive lock (shared
/// locks) to be had. (The owner table keeps a row per name, the fencing
/// counter, as the directory keeps `.fence` files.)
#[cfg(feature = "postgres")]
fn pg_leftovers(server: &pg_server::Server, kind: Kind) -> Vec<String> {
    let mut left = server.advisory_locks_and_sessions_left(PG_SESSIONS_END_WITHIN);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let locker = Locker::builder().postgres(server.url()).build().unwrap();
    rt.block_on(async {
        for info in locker.list().await.expect("list()") {
            left.push(format!("{} listed as held", info.name()));
        }
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
    });
    left
}

#[test]
fn torture_shared_exclusive_file() {
    torture(Kind::Shared, Backend::ExclusiveFile);
}

#[test]
fn torture_shared_directory() {
    torture(Kind::Shared, Backend::Directory);
}

#[test]
fn torture_semaphore_exclusive_file() {
    torture(Kind::Semaphore, Backend::ExclusiveFile);
}

#[test]
fn torture_semaphore_directory() {
    torture(Kind::Semaphore, Backend::Directory);
}

#[cfg(feature = "postgres")]
#[test]
fn torture_shared_postgres() {
    torture(Kind::Shared, Backend::Postgres);
}

#[cfg(feature = "postgres")]
#[test]
fn torture_semaphore_postgres() {
    torture(Kind::Semaphore, Backend::Postgres);
}
