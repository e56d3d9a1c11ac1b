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
//! `CLOCK_MONOTONIC` (shared by all processes):
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
//! entry, works a few ms, then commits under the file's own `flock`:
//! re-read, check `is_lost()`, and write `value + 1` with its fencing token
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
//! [`PG_SESSIONS_END_WITHIN`] after the last child ended, or names a fresh
//! `Locker` finds held.
//!
//! The child-role code lives here (`child_process_entry`), started by
//! re-running this test binary, as `tests/support/common.rs` does, with its own
//! environment variables.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, FileExt};
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
const ROLE_ENV: &str = "LEASEHOLD_TORTURE_CHILD_STRATEGY";
/// The server's URL, for a child on PostgreSQL.
#[cfg(feature = "postgres")]
const PG_URL_ENV: &str = "LEASEHOLD_TORTURE_CHILD_PG_URL";
const WORK_ENV: &str = "LEASEHOLD_TORTURE_CHILD_WORKDIR";
const CHILD_TASKS_ENV: &str = "LEASEHOLD_TORTURE_CHILD_TASKS";
const CHILD_TTL_ENV: &str = "LEASEHOLD_TORTURE_CHILD_TTL_SECS";

const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];
const LEASE: Duration = Duration::from_millis(600);
const RENEW: Duration = Duration::from_millis(150);

/// How long after the last child ended the server may still show its
/// sessions or their locks: a killed child's session ends when the server
/// reads the end of its socket, at once on a local one.
#[cfg(feature = "postgres")]
const PG_SESSIONS_END_WITHIN: Duration = Duration::from_secs(5);

#[cfg(feature = "postgres")]
#[path = "support/pg_server.rs"]
mod pg_server;

#[path = "support/torture_backend.rs"]
mod torture_backend;
use torture_backend::Backend;

#[test]
fn child_process_entry() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    let backend = *Backend::ALL
        .iter()
        .find(|b| b.label() == role)
        .unwrap_or_else(|| panic!("unknown backend {role:?}"));
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
    let code = rt.block_on(child_main(backend, work, tasks));
    std::process::exit(code);
}

fn mono_ns() -> u64 {
    let ts = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("clock_gettime");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// xorshift64*, enough for picking names, durations and victims.
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

fn counter_path(work: &Path, name: &str) -> PathBuf {
    work.join(format!("counter-{name}"))
}

fn read_counter(file: &File) -> (u64, u64) {
    let mut buf = [0u8; 64];
    let n = file.read_at(&mut buf, 0).expect("read counter");
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
    file.write_all_at(format!("{value:020} {token:020}\n").as_bytes(), 0)
        .expect("write counter");
}

enum Outcome {
    Committed(u64),
    Lost(u64),
    Fenced(u64, u64),
}

async fn child_main(backend: Backend, work: PathBuf, tasks: usize) -> i32 {
    let pid = std::process::id();
    let builder = Locker::builder().fencing(true).lease(LEASE).renew_interval(RENEW);
    let builder = match backend.strategy() {
        Some(strategy) => builder.directory(work.join("locks")).strategy(strategy),
        #[cfg(feature = "postgres")]
        None => builder.postgres(std::env::var(PG_URL_ENV).expect("server url")),
        #[cfg(not(feature = "postgres"))]
        None => unreachable!("every backend but PostgreSQL has a strategy"),
    };
    let locker = builder.build().expect("locker");
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
                locker.clone(),
                Arc::clone(&log),
                work.clone(),
                i as u64,
                stop_rx.clone(),
                Arc::clone(&max_wait),
            ))
        })
        .collect();
    let mut ok = true;
    for handle in handles {
        if let Err(e) = handle.await {
            eprintln!("torture child {pid}: a task failed: {e}");
            ok = false;
        }
    }
    let st = locker.stats();
    log.line(format!(
        "Z {pid} {} {} {} {} {} {}",
        st.acquisitions,
        st.handoffs,
        st.reclaimed_dead_owner,
        st.reclaimed_expired_lease,
        st.lost,
        max_wait.load(Ordering::Relaxed)
    ));
    if ok { 0 } else { 1 }
}

async fn task(
    locker: Locker,
    log: Arc<Log>,
    work: PathBuf,
    index: u64,
    mut stop: tokio::sync::watch::Receiver<bool>,
    max_wait: Arc<AtomicU64>,
) {
    let pid = std::process::id();
    let mut rng = Rng::new((u64::from(pid) << 8) | index);
    loop {
        if *stop.borrow() {
            return;
        }
        let name = NAMES[rng.below(NAMES.len() as u64) as usize];
        let asked = Instant::now();
        let acquired = tokio::select! {
            r = locker.acquire(name) => r,
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
        log.line(format!("S {name} {token} {pid} {}", mono_ns()));
        let work_ms = 1 + rng.below(12);
        let counter = counter_path(&work, name);
        let outcome = tokio::select! {
            () = guard.lost() => Outcome::Lost(mono_ns()),
            o = section(&guard, &counter, token, work_ms) => o,
        };
        match outcome {
            Outcome::Committed(ns) => log.line(format!("E {name} {token} {pid} {ns}")),
            Outcome::Lost(ns) => {
                // No I/O: a lost guard's `ensure_held` reports the loss.
                let reason = match guard.ensure_held().await {
                    Err(Error::Lost { reason, .. }) => format!("{reason:?}"),
                    other => format!("Unknown({other:?})"),
                };
                let reason: String = reason.chars().take_while(char::is_ascii_alphanumeric).collect();
                log.line(format!("L {name} {token} {pid} {ns} {reason}"));
            }
            Outcome::Fenced(ns, found) => log.line(format!("F {name} {token} {pid} {ns} {found}")),
        }
        drop(guard);
        tokio::time::sleep(Duration::from_millis(rng.below(4))).await;
    }
}

/// The critical section: a read-modify-write of the name's counter,
/// committed through the fenced protocol described at the top.
async fn section(guard: &LockGuard, counter: &Path, token: u64, work_ms: u64) -> Outcome {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(counter)
        .expect("open counter");
    let seen = read_counter(&file);
    tokio::time::sleep(Duration::from_millis(work_ms)).await;
    loop {
        match file.try_lock() {
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
    file.unlock().expect("unlock counter");
    outcome
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
    let label = backend.label();
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
    for name in NAMES {
        let f = File::create(counter_path(&work, name)).unwrap();
        write_counter(&f, 0, 0);
    }
    let mut fleet = Fleet {
        backend,
        #[cfg(feature = "postgres")]
        pg_url,
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
        "children {hung:?} did not stop within 15 s of being told"
    );
    for (pid, status) in &finished {
        assert!(status.success(), "child {pid} exited with {status}");
    }
    assert!(
        early_exits.is_empty(),
        "children exited before being told to: {early_exits:?}"
    );

    let (cleaned, left) = match backend.strategy() {
        Some(strategy) => file_leftovers(&locks, strategy),
        #[cfg(feature = "postgres")]
        None => (0, pg_leftovers(server.as_ref().expect("the server"))),
        #[cfg(not(feature = "postgres"))]
        None => unreachable!("every backend but PostgreSQL has a strategy"),
    };

    // The log.
    let text = std::fs::read_to_string(work.join("log")).unwrap();
    let mut starts: BTreeMap<(String, u64), (u32, u64)> = BTreeMap::new();
    let mut ends: HashMap<(String, u64), (End, u64, u32, String)> = HashMap::new();
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
                let key = (f[1].to_owned(), num(2));
                if starts.insert(key.clone(), (num(3) as u32, num(4))).is_some() {
                    problems.push(format!("token {} of {} handed out twice", key.1, key.0));
                }
            }
            "E" | "L" | "F" => {
                let (how, reason) = match f[0] {
                    "E" => (End::Committed, ""),
                    "L" => (End::Lost, f.get(5).copied().unwrap_or("")),
                    _ => (End::Fenced(num(5)), ""),
                };
                if how == End::Lost {
                    *lost_reasons.entry(reason.to_owned()).or_default() += 1;
                }
                ends.insert(
                    (f[1].to_owned(), num(2)),
                    (how, num(4), num(3) as u32, reason.to_owned()),
                );
            }
            "X" => {
                let kind: String = f[2].chars().take_while(|c| c.is_alphanumeric()).collect();
                let seen = errors.entry(kind).or_default();
                if *seen == 0 {
                    eprintln!("torture [{label}]: first acquire error of its kind: {line}");
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
    let mut by_name: BTreeMap<String, Vec<Section>> = BTreeMap::new();
    for ((name, token), (pid, start)) in &starts {
        let (how, end, reason) = match ends.get(&(name.clone(), *token)) {
            Some((how, ns, _, reason)) => (*how, *ns, reason.clone()),
            None => match silenced(*pid) {
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
                        && p.after >= older.start
                        && p.after <= newer.start
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
                    let stops: Vec<(u64, u64)> = pauses
                        .iter()
                        .filter(|p| p.pid == older.pid)
                        .map(|p| (p.after, p.until))
                        .collect();
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
                            .any(|p| p.pid == c.pid && p.after >= c.end && p.before <= s.end)
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
        let file = File::open(counter_path(&work, name)).unwrap();
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

    let count = |c: &str| text.lines().filter(|l| l.starts_with(c)).count();
    let sum = |i: usize| summaries.iter().map(|z| z[i]).sum::<u64>();
    let max_wait_ms = summaries.iter().map(|z| z[5]).max().unwrap_or(0) as f64 / 1000.0;
    if !left.is_empty() {
        problems.push(format!("left behind: {left:?}"));
    }
    if count("E ") == 0 {
        problems.push("no section ever completed".into());
    }
    // A running holder loses its lock only through its own state: frozen
    // past its lease (LeaseExpired), its lock removed or replaced. Renewal
    // takes no lock another process could hold, so no frozen neighbour
    // can make it fail (issue 28).
    if let Some(n) = lost_reasons.get("RenewalFailed")
        && backend.strategy().is_some()
    {
        problems.push(format!("{n} holders lost their lock to a failed renewal"));
    }
    eprintln!(
        "torture [{label}]: {procs} procs x {tasks} tasks, {secs} s of chaos, {:.1} s in all\n  \
         holds {} (committed {}, lost {} {lost_reasons:?}, fenced out {} [excused {fenced_excused}], cut by kill {killed_in_section})\n  \
         kills {} pauses {} sessions ended {terminations} acquire errors {errors:?}\n  \
         successors of killed holders {after_kill}, of lost holders {after_loss}, overlaps with a lost holder {overlaps_excused}\n  \
         survivors' stats: acquisitions {} handoffs {} reclaimed dead {} reclaimed expired {} lost {}; max wait {max_wait_ms:.1} ms\n  \
         stopped in {:.2} s; reclaimed at the end {cleaned}, left behind {}\n  \
         overlaps found: {overlaps_found}, lost updates: {lost_updates}, tokens out of order: {out_of_order}, violations: {}",
        began.elapsed().as_secs_f64(),
        count("S "),
        count("E "),
        count("L "),
        count("F "),
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
        let kept = std::env::temp_dir().join(format!("leasehold-torture-{label}-{}.log", std::process::id()));
        let kept = match std::fs::copy(work.join("log"), &kept) {
            Ok(_) => format!("the log is kept in {}", kept.display()),
            Err(e) => format!("the log could not be kept in {}: {e}", kept.display()),
        };
        panic!("{} violations ({kept}):\n{}", problems.len(), problems.join("\n"));
    }
}

/// Reclaims what killed children left, then nothing but the fencing
/// counters may remain: the number reclaimed, and what is left.
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
        .map(|n| format!("{n} in the lock directory"))
        .collect();
    left.sort();
    (cleaned.len(), left)
}

/// What the children left on the server: advisory locks or sessions still
/// there [`PG_SESSIONS_END_WITHIN`] after the last one ended (on the
/// test's own server: a server named by `LEASEHOLD_PG_URL` may have other
/// clients), and names a fresh `Locker` finds held (or cannot take within
/// a lease and a second: a holder killed last is waited out). (The owner table
/// keeps a row per name, the fencing counter, as the directory keeps
/// `.fence` files.)
#[cfg(feature = "postgres")]
fn pg_leftovers(server: &pg_server::Server) -> Vec<String> {
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
        // A holder killed last may still be waited out: for a lease after
        // its session was found gone (docs/guarantees.md, *On PostgreSQL*).
        for name in NAMES {
            match locker.acquire_timeout(name, LEASE + Duration::from_secs(1)).await {
                Ok(guard) => drop(guard),
                Err(error) => left.push(format!("{name} still held: {error}")),
            }
        }
    });
    left
}

#[test]
fn torture_exclusive_file() {
    torture(Backend::ExclusiveFile);
}

#[test]
fn torture_directory() {
    torture(Backend::Directory);
}

#[cfg(feature = "postgres")]
#[test]
fn torture_postgres() {
    torture(Backend::Postgres);
}
