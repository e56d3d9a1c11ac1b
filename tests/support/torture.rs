//! What the tortures (`tests/torture.rs`, `tests/torture_shared.rs`,
//! `tests/torture_upgradable.rs`) share: the backends they run on, the children's side (the shared log,
//! the stop signal, the lockers), and the parent's (the chaos loop that
//! SIGKILLs, SIGSTOPs and, on PostgreSQL, ends sessions; the stop; what is
//! left behind; the parts of the log both read alike). Each torture keeps
//! its own workload and its own checker.
//!
//! On Windows the chaos only kills (`TerminateProcess`): freezing a
//! process, SIGSTOP's part, has no Windows twin, so no holder there is
//! ever paused past its lease.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::Write;
#[cfg(unix)]
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leasehold::{Error, LockGuard, Locker, Stats, Strategy};
#[cfg(unix)]
use nix::sys::signal::{Signal, kill};
#[cfg(unix)]
use nix::unistd::Pid;

#[path = "clock.rs"]
mod clock;
#[path = "reexec.rs"]
mod reexec;

pub use clock::mono_ns;

#[cfg(all(feature = "postgres", unix))]
#[path = "pg_server.rs"]
pub mod pg_server;

/// Every torture lock's lease, and how often it is renewed. Short, so
/// that a SIGSTOP outlasts it. Windows has no SIGSTOP here (the chaos only
/// kills), and under Wine every file operation of every process is a
/// round trip to one server process, which delayed renewals past 600 ms:
/// holders lost their locks to their own lapsed leases, and too few
/// upgrades were left for a run to prove anything. There the lease is
/// five times longer.
pub const LEASE: Duration = Duration::from_millis(if cfg!(windows) { 3000 } else { 600 });
pub const RENEW: Duration = Duration::from_millis(if cfg!(windows) { 750 } else { 150 });

/// How long after the last child ended the server may still show its
/// sessions or their locks: a killed child's session ends when the server
/// reads the end of its socket, at once on a local one.
#[cfg(all(feature = "postgres", unix))]
pub const PG_SESSIONS_END_WITHIN: Duration = Duration::from_secs(5);

/// Set (to a [`Backend::label`]) in a child's environment: the child's backend.
const BACKEND_ENV: &str = "LEASEHOLD_TORTURE_CHILD_STRATEGY";
/// The server's URL, for a child on PostgreSQL.
#[cfg(all(feature = "postgres", unix))]
const PG_URL_ENV: &str = "LEASEHOLD_TORTURE_CHILD_PG_URL";
const WORK_ENV: &str = "LEASEHOLD_TORTURE_CHILD_WORKDIR";
const TASKS_ENV: &str = "LEASEHOLD_TORTURE_CHILD_TASKS";
const TTL_ENV: &str = "LEASEHOLD_TORTURE_CHILD_TTL_SECS";

/// The backend under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    ExclusiveFile,
    Directory,
    #[cfg(all(feature = "postgres", unix))]
    Postgres,
}

impl Backend {
    pub const ALL: &[Backend] = &[
        Backend::ExclusiveFile,
        Backend::Directory,
        #[cfg(all(feature = "postgres", unix))]
        Backend::Postgres,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Backend::ExclusiveFile => "file",
            Backend::Directory => "dir",
            #[cfg(all(feature = "postgres", unix))]
            Backend::Postgres => "postgres",
        }
    }

    pub fn strategy(self) -> Option<Strategy> {
        match self {
            Backend::ExclusiveFile => Some(Strategy::ExclusiveFile),
            Backend::Directory => Some(Strategy::Directory),
            #[cfg(all(feature = "postgres", unix))]
            Backend::Postgres => None,
        }
    }

    /// Whether a holder paused past its lease may be overtaken while it is
    /// paused: on files, yes (its lease is time); on a server, no (a paused holder's session keeps its lock
    /// on a server).
    pub fn leases_run_out_under_paused_holders(self) -> bool {
        self.strategy().is_some()
    }

    /// A child's locker: fencing on, [`LEASE`], [`RENEW`], on the work
    /// directory's `locks` or the server the parent named.
    pub fn locker(self, work: &Path) -> Locker {
        let builder = Locker::builder().fencing(true).lease(LEASE).renew_interval(RENEW);
        let builder = match self.strategy() {
            Some(strategy) => builder.directory(work.join("locks")).strategy(strategy),
            #[cfg(all(feature = "postgres", unix))]
            None => builder.postgres(std::env::var(PG_URL_ENV).expect("server url")),
            #[cfg(not(all(feature = "postgres", unix)))]
            None => unreachable!("every backend but PostgreSQL has a strategy"),
        };
        builder.build().expect("locker")
    }
}

// ---------------------------------------------------------------- both

/// xorshift64*, enough for picking names, roles, durations and victims.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

// ---------------------------------------------------------------- child

/// What a child is told by its parent.
pub struct ChildSetup {
    pub backend: Backend,
    pub work: PathBuf,
    pub tasks: usize,
}

/// The body of a torture's `#[test] fn child_process_entry()`: a no-op in
/// a normal run; in a child, runs `main` on a two-thread runtime and
/// exits with its code (or with 3 once the time to live the parent gave
/// is up, whatever the parent does).
pub fn child_entry<F: Future<Output = i32>>(main: impl FnOnce(ChildSetup) -> F) {
    let Ok(role) = std::env::var(BACKEND_ENV) else {
        return;
    };
    let backend = *Backend::ALL
        .iter()
        .find(|b| b.label() == role)
        .unwrap_or_else(|| panic!("unknown backend {role:?}"));
    let work = PathBuf::from(std::env::var_os(WORK_ENV).expect("work dir"));
    let tasks: usize = std::env::var(TASKS_ENV).expect("tasks").parse().expect("tasks");
    let ttl: u64 = std::env::var(TTL_ENV).expect("ttl").parse().expect("ttl");
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
    let code = rt.block_on(main(ChildSetup { backend, work, tasks }));
    std::process::exit(code);
}

/// What a child's task is given: a `Locker` of the child's, the shared
/// log, the task's index, the stop signal, and the child's longest wait
/// for an acquisition (µs).
pub struct Worker {
    pub locker: Locker,
    pub log: Arc<Log>,
    pub index: u64,
    pub stop: tokio::sync::watch::Receiver<bool>,
    pub max_wait: Arc<AtomicU64>,
}

impl Worker {
    /// The task's random numbers, seeded by its pid and index.
    pub fn rng(&self) -> Rng {
        Rng::new((u64::from(std::process::id()) << 8) | self.index)
    }

    /// The id of this task's `seq`th section: `pid.tag.index.seq`, where
    /// the tag is this process's own (eight hex digits of a UUID), since a
    /// pid can come back within a run (under Wine a killed child's pid
    /// did, and two processes logged the same section ids).
    pub fn section_id(&self, seq: u64) -> String {
        static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let tag = TAG.get_or_init(|| uuid::Uuid::new_v4().simple().to_string()[..8].to_owned());
        format!("{}.{tag}.{}.{seq}", std::process::id(), self.index)
    }

    /// Whether the parent said stop.
    pub fn told_to_stop(&self) -> bool {
        *self.stop.borrow()
    }

    /// [`take_turn`] with the task's stop signal, log and longest wait.
    pub async fn take_turn(&mut self, acquire: impl Future<Output = leasehold::Result<LockGuard>>) -> Turn {
        take_turn(acquire, &mut self.stop, &self.log, &self.max_wait).await
    }
}

/// A child's body: `lockers` lockers on the child's backend, its tasks
/// running `task` over them in turn until told to stop, then its summary
/// (`Z`). The exit code: 1 if a task failed.
pub async fn run_tasks<F, Fut>(torture: &str, child: ChildSetup, lockers: usize, task: F) -> i32
where
    F: Fn(Worker) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let lockers: Vec<Locker> = (0..lockers).map(|_| child.backend.locker(&child.work)).collect();
    let log = Arc::new(Log::open(&child.work));
    let stop = stop_signal(&child.work);
    let max_wait = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..child.tasks)
        .map(|i| {
            tokio::spawn(task(Worker {
                locker: lockers[i % lockers.len()].clone(),
                log: Arc::clone(&log),
                index: i as u64,
                stop: stop.clone(),
                max_wait: Arc::clone(&max_wait),
            }))
        })
        .collect();
    let ok = join_all(torture, handles).await;
    let stats: Vec<_> = lockers.iter().map(Locker::stats).collect();
    // Written once the lockers are dropped: the parent reads it as "done".
    drop(lockers);
    log.summary(&stats, max_wait.load(Ordering::Relaxed));
    if ok { 0 } else { 1 }
}

/// Turns `true` once the parent creates the work directory's `stop` file.
pub fn stop_signal(work: &Path) -> tokio::sync::watch::Receiver<bool> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop_file = work.join("stop");
    tokio::spawn(async move {
        while !stop_file.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = stop_tx.send(true);
        std::future::pending::<()>().await;
    });
    stop_rx
}

/// Waits for a child's tasks: whether none of them failed.
pub async fn join_all(torture: &str, handles: Vec<tokio::task::JoinHandle<()>>) -> bool {
    let mut ok = true;
    for handle in handles {
        if let Err(e) = handle.await {
            eprintln!("{torture} child {}: a task failed: {e}", std::process::id());
            ok = false;
        }
    }
    ok
}

/// What one try at the lock came to.
pub enum Turn {
    Held(LockGuard),
    /// It failed (logged as `X`, and waited after a little): try again.
    Failed,
    /// The parent said stop.
    Stop,
}

/// Whether child `pid` wrote its summary (`Z <pid> ...`) to the log in
/// `work`, which it does once its tasks ended and its lockers are dropped.
fn summarised(work: &Path, pid: u32) -> bool {
    let prefix = format!("Z {pid} ");
    std::fs::read_to_string(work.join("log"))
        .is_ok_and(|log| log.lines().any(|line| line.starts_with(&prefix)))
}

/// Takes the lock through `acquire`, unless told to stop first, and notes
/// the wait in `max_wait_us`.
pub async fn take_turn(
    acquire: impl Future<Output = leasehold::Result<LockGuard>>,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    log: &Log,
    max_wait_us: &AtomicU64,
) -> Turn {
    let asked = Instant::now();
    let acquired = tokio::select! {
        r = acquire => r,
        _ = stop.wait_for(|s| *s) => return Turn::Stop,
    };
    match acquired {
        Ok(guard) => {
            max_wait_us.fetch_max(asked.elapsed().as_micros() as u64, Ordering::Relaxed);
            Turn::Held(guard)
        }
        Err(e) => {
            log.error(&e);
            tokio::time::sleep(Duration::from_millis(20)).await;
            Turn::Failed
        }
    }
}

/// Why a lost guard was lost: the `LossReason` variant's name. No I/O: a
/// lost guard's `ensure_held` reports the loss.
pub async fn loss_reason(guard: &LockGuard) -> String {
    let reason = match guard.ensure_held().await {
        Err(Error::Lost { reason, .. }) => format!("{reason:?}"),
        other => format!("Unknown({other:?})"),
    };
    reason.chars().take_while(char::is_ascii_alphanumeric).collect()
}

/// The shared log: one `write(2)` per line, `O_APPEND`; on Windows,
/// made in turns (see `turn`).
pub struct Log(File, PathBuf);

impl Log {
    pub fn open(work: &Path) -> Self {
        Log(
            OpenOptions::new()
                .append(true)
                .create(true)
                .open(work.join("log"))
                .expect("open log"),
            work.join("log.lock"),
        )
    }

    /// On Windows, a turn to append, held until the returned handle
    /// closes: a whole-file lock on `log.lock`. Windows appends through a
    /// `FILE_APPEND_DATA` handle atomically, but Wine 8 writes at the end
    /// of file as it last saw it, so two processes appending at once may
    /// overwrite each other's line. (Closed, not unlocked: Wine's
    /// `File::unlock` of such a lock fails.) Nothing on Unix, where
    /// `O_APPEND` writes are atomic.
    fn turn(&self) -> Option<File> {
        if cfg!(unix) {
            return None;
        }
        let turn = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.1)
            .expect("open the log's lock");
        turn.lock().expect("lock the log");
        Some(turn)
    }

    pub fn line(&self, line: String) {
        let _turn = self.turn();
        let bytes = format!("{line}\n");
        let written = (&self.0).write(bytes.as_bytes()).expect("append to log");
        assert_eq!(written, bytes.len(), "short append to the log");
    }

    /// `S name id role token pid ns`: `guard`'s section `id` of `name`
    /// begins, as `role`; and `B ...` if the guard is not of that role.
    pub fn entered(&self, name: &str, id: &str, role: char, guard: &LockGuard) {
        let pid = std::process::id();
        let token = guard.fencing_token().expect("fencing is on");
        self.line(format!("S {name} {id} {role} {token} {pid} {}", mono_ns()));
        if guard.is_shared() != (role == 'R') {
            self.line(format!(
                "B {name} {id} {pid} is_shared()={} for role {role}",
                guard.is_shared()
            ));
        }
    }

    /// `guard`'s section `id` of `name` ends at `held`'s moment: `E name
    /// id pid ns` if it held (`Ok`), else `L name id pid ns reason`.
    pub async fn left(&self, name: &str, id: &str, held: Result<u64, u64>, guard: &LockGuard) {
        let pid = std::process::id();
        match held {
            Ok(ns) => self.line(format!("E {name} {id} {pid} {ns}")),
            Err(ns) => {
                let reason = loss_reason(guard).await;
                self.line(format!("L {name} {id} {pid} {ns} {reason}"));
            }
        }
    }

    /// `X pid error`: an acquisition failed.
    pub fn error(&self, error: &Error) {
        let pid = std::process::id();
        self.line(format!("X {pid} {}", format!("{error:?}").replace('\n', " ")));
    }

    /// `Z pid acquisitions handoffs reclaimed_dead reclaimed_expired lost
    /// max_wait_us`: the child's summary, its lockers' stats summed.
    pub fn summary(&self, stats: &[Stats], max_wait_us: u64) {
        let sum = |f: fn(&Stats) -> u64| stats.iter().map(f).sum::<u64>();
        self.line(format!(
            "Z {} {} {} {} {} {} {max_wait_us}",
            std::process::id(),
            sum(|s| s.acquisitions),
            sum(|s| s.handoffs),
            sum(|s| s.reclaimed_dead_owner),
            sum(|s| s.reclaimed_expired_lease),
            sum(|s| s.lost),
        ));
    }
}

// ---------------------------------------------------------------- parent

pub fn env_or(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

#[cfg(unix)]
fn signal(pid: u32, sig: Signal) {
    kill(Pid::from_raw(pid as i32), sig).unwrap_or_else(|e| panic!("{sig} to {pid}: {e}"));
}

/// Whether the chaos can freeze a process: SIGSTOP has no Windows twin.
const CAN_FREEZE: bool = cfg!(unix);

/// Freezes `pid` (SIGSTOP); only where [`CAN_FREEZE`].
fn freeze(pid: u32) {
    #[cfg(unix)]
    signal(pid, Signal::SIGSTOP);
    #[cfg(windows)]
    unreachable!("pid {pid}: the chaos freezes nobody on Windows");
}

/// Continues a process [`freeze`] froze (SIGCONT).
fn resume(pid: u32) {
    #[cfg(unix)]
    signal(pid, Signal::SIGCONT);
    #[cfg(windows)]
    unreachable!("pid {pid}: the chaos freezes nobody on Windows");
}

/// Kills a child at once, as a crash would: SIGKILL on Unix,
/// `TerminateProcess` on Windows (which returns before the process is
/// gone: the caller's `wait` sees it gone).
fn kill_now(kid: &mut Child) {
    kid.kill().unwrap_or_else(|e| panic!("kill {}: {e}", kid.id()));
}

pub struct Pause {
    pub pid: u32,
    /// Just before `kill(SIGSTOP)`.
    pub before: u64,
    /// Just after it returned: the process is stopped by then.
    pub after: u64,
    /// When it was continued (or killed).
    pub until: u64,
}

impl Pause {
    /// Whether the process was stopped at some moment at or after `seen`,
    /// a reading of its own clock taken while it ran. `after` is not that
    /// moment: a SIGSTOP to a process running on another core lands a few
    /// µs after `kill` returns, time enough for the process to read its
    /// clock once more. But a stopped process reads no clock: if it read
    /// `seen` no later than `until`, the stop landed after `seen` (or the
    /// whole pause came later).
    pub fn stopped_after(&self, seen: u64) -> bool {
        self.until >= seen
    }
}

/// The children; any still running are killed (by pid) and reaped on drop.
struct Fleet {
    backend: Backend,
    /// The server's URL, on PostgreSQL.
    pg_url: Option<String>,
    /// The torture's own environment for its children.
    env: Vec<(String, String)>,
    work: PathBuf,
    tasks: u64,
    ttl: u64,
    kids: Vec<Child>,
}

impl Fleet {
    fn spawn(&mut self) {
        let mut child = reexec::child_process();
        #[cfg(all(feature = "postgres", unix))]
        if let Some(url) = &self.pg_url {
            child.env(PG_URL_ENV, url);
        }
        let child = child
            .env(BACKEND_ENV, self.backend.label())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env(WORK_ENV, &self.work)
            .env(TASKS_ENV, self.tasks.to_string())
            .env(TTL_ENV, self.ttl.to_string())
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
                let _ = kid.kill();
            }
            let _ = kid.wait();
        }
    }
}

/// One torture run's world: its work directory (with `locks` and the
/// children's `log`), and on PostgreSQL its own server.
pub struct Arena {
    pub backend: Backend,
    /// `torture` or `torture_shared`, for the report and the kept log.
    pub torture: &'static str,
    pub label: String,
    pub began: Instant,
    #[cfg(all(feature = "postgres", unix))]
    pub server: Option<pg_server::Server>,
    pg_url: Option<String>,
    _tmp: tempfile::TempDir,
    pub work: PathBuf,
    pub locks: PathBuf,
}

/// What the chaos did, and how the children stopped.
pub struct Chaos {
    pub pauses: Vec<Pause>,
    /// When each killed pid was killed.
    pub kills: HashMap<u32, u64>,
    /// Client sessions ended on the server.
    pub terminations: usize,
    /// How long the children took to stop once told.
    pub stop_time: Duration,
}

impl Chaos {
    /// When a killed process stopped acting: at the kill, or at the start
    /// of the stop it was killed in.
    pub fn silenced(&self, pid: u32) -> Option<u64> {
        let killed = *self.kills.get(&pid)?;
        let frozen = self
            .pauses
            .iter()
            .filter(|p| p.pid == pid && p.after <= killed && p.until >= killed)
            .map(|p| p.after)
            .min();
        Some(frozen.unwrap_or(killed))
    }

    /// A holder's stops, to tell a robbed live holder from a frozen one.
    pub fn stops_of(&self, pid: u32) -> Vec<(u64, u64)> {
        self.pauses
            .iter()
            .filter(|p| p.pid == pid)
            .map(|p| (p.after, p.until))
            .collect()
    }
}

impl Arena {
    pub fn new(torture: &'static str, backend: Backend, label: String) -> Self {
        let began = Instant::now();
        #[cfg(all(feature = "postgres", unix))]
        let server = (backend == Backend::Postgres).then(pg_server::Server::start);
        #[cfg(all(feature = "postgres", unix))]
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
        #[cfg(not(all(feature = "postgres", unix)))]
        let pg_url = None;
        let tmp = tempfile::tempdir().unwrap();
        let work = tmp.path().to_owned();
        let locks = work.join("locks");
        #[cfg(unix)]
        std::fs::DirBuilder::new().mode(0o700).create(&locks).unwrap();
        #[cfg(windows)]
        std::fs::create_dir(&locks).unwrap();
        Arena {
            backend,
            torture,
            label,
            began,
            #[cfg(all(feature = "postgres", unix))]
            server,
            pg_url,
            _tmp: tmp,
            work,
            locks,
        }
    }

    /// Starts `procs` children of `tasks` tasks each (with `env` added to
    /// theirs) and, for `secs`, SIGKILLs them (starting replacements),
    /// SIGSTOPs them for longer than the lease (not on Windows) and, on PostgreSQL, ends
    /// random client sessions; then tells them to stop and asserts that
    /// every child stopped when told, cleanly, and none before.
    pub fn chaos(&self, procs: u64, tasks: u64, secs: u64, env: &[(&str, &str)]) -> Chaos {
        let label = &self.label;
        let backend = self.backend;
        let mut fleet = Fleet {
            backend,
            pg_url: self.pg_url.clone(),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            work: self.work.clone(),
            tasks,
            ttl: secs + 60,
            kids: Vec::new(),
        };
        for _ in 0..procs {
            fleet.spawn();
        }

        let mut rng = Rng::new(u64::from(std::process::id()) ^ mono_ns());
        let mut pauses: Vec<Pause> = Vec::new();
        // index into `pauses` of each currently stopped pid, and when to resume it
        let mut stopped: HashMap<u32, (usize, Instant)> = HashMap::new();
        let mut kills: HashMap<u32, u64> = HashMap::new();
        #[cfg_attr(not(all(feature = "postgres", unix)), allow(unused_mut))]
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
                resume(pid);
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
                    kill_now(&mut kid);
                    kid.wait().unwrap();
                    if let Some((p, _)) = stopped.remove(&pid) {
                        pauses[p].until = mono_ns();
                    }
                    fleet.spawn();
                } else if roll >= 8 && backend.strategy().is_none() {
                    // End a random client session on the server (a holder's,
                    // a waiter's or a listener's), as a DBA's
                    // `pg_terminate_backend` or a crashed backend would.
                    #[cfg(all(feature = "postgres", unix))]
                    if let Some(url) = fleet.pg_url.as_deref() {
                        terminations += pg_server::terminate_a_session(url, &mut |n| rng.below(n));
                    }
                } else if roll < 8 && CAN_FREEZE {
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
                        freeze(pid);
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
            resume(pid);
            pauses[i].until = mono_ns();
        }
        File::create(self.work.join("stop")).unwrap();
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
                // Under Wine a child that has done everything (its tasks
                // ended, its lockers dropped, then its summary written) now
                // and then does not end its process within the deadline
                // (seen about once in five runs, between its last line and
                // `exit`). Its summary says leasehold stopped.
                if cfg!(windows) && Instant::now() >= deadline && summarised(&self.work, kid.id()) {
                    let _ = kid.kill();
                    let _ = kid.wait();
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
        Chaos {
            pauses,
            kills,
            terminations,
            stop_time,
        }
    }

    /// What the children left: on files, [`file_leftovers`]; on
    /// PostgreSQL, advisory locks or sessions still there
    /// [`PG_SESSIONS_END_WITHIN`] after the last one ended (on the test's
    /// own server: a server named by `LEASEHOLD_PG_URL` may have other
    /// clients), names a fresh `Locker` lists as held, and what `probe`
    /// (given a fresh `Locker`) finds still held. (The owner table keeps a
    /// row per name, the fencing counter, as the directory keeps `.fence`
    /// files.) The number reclaimed, and what is left.
    pub fn leftovers<F, Fut>(&self, probe: F) -> (usize, Vec<String>)
    where
        F: FnOnce(Locker) -> Fut,
        Fut: Future<Output = Vec<String>>,
    {
        match self.backend.strategy() {
            Some(strategy) => file_leftovers(&self.locks, strategy),
            #[cfg(all(feature = "postgres", unix))]
            None => {
                let server = self.server.as_ref().expect("the server");
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
                    left.extend(probe(locker.clone()).await);
                });
                (0, left)
            }
            #[cfg(not(all(feature = "postgres", unix)))]
            None => {
                drop(probe);
                unreachable!("every backend but PostgreSQL has a strategy")
            }
        }
    }

    /// The children's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.work.join("log")).unwrap()
    }

    /// Panics with the problems found, if any, keeping the log for the
    /// analysis (the work directory goes with the test).
    pub fn fail_on(&self, problems: &[String]) {
        if problems.is_empty() {
            return;
        }
        let label = &self.label;
        let kept = std::env::temp_dir().join(format!(
            "leasehold-{}-{}-{}.log",
            self.torture,
            label.replace('/', "-"),
            std::process::id()
        ));
        let kept = match std::fs::copy(self.work.join("log"), &kept) {
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
        // The waiting line's file stays, on Windows (docs/guarantees.md).
        .filter(|n| !n.ends_with(".fence") && n != "leasehold..line")
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

/// How a section of a torture with roles (`tests/torture_shared.rs`,
/// `tests/torture_upgradable.rs`) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Committed,
    Lost,
    /// No end line: its process was killed.
    Killed,
}

/// A section of a torture with roles: from its `S` line to its `E` or `L`
/// line, or to when its process was silenced.
#[derive(Debug, Clone)]
pub struct Section {
    pub name: String,
    pub id: String,
    pub role: char,
    pub token: u64,
    pub pid: u32,
    pub start: u64,
    /// The last moment the holder may have acted as holder.
    pub end: u64,
    pub how: End,
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

/// The sections of a torture with roles, read from its log `text` (lines
/// `S name id role token pid ns`, `E name id pid ns`, `L name id pid ns
/// reason`), in the order of their ids. A `B` line is a problem; a line
/// whose first field is in `passed` is passed over; any other goes to
/// [`Tally::other`].
///
/// A killed section that was stopped after it began, for longer than the
/// lease (every stop is), acted as holder only until that stop: once
/// continued, its lease had run out, so its next look (`is_lost()`) would
/// have said `L` had it not been killed first. Not on a server: there a
/// paused holder keeps its lock through the stop, so nobody may enter
/// before the kill (or the stop it was killed in) ended its session.
pub fn sections(
    arena: &Arena,
    chaos: &Chaos,
    tally: &mut Tally,
    text: &str,
    passed: &[&str],
) -> Vec<Section> {
    // id -> (name, role, token, pid, start)
    let mut starts: BTreeMap<String, (String, char, u64, u32, u64)> = BTreeMap::new();
    let mut ends: HashMap<String, (End, u64)> = HashMap::new();
    for line in text.lines() {
        let line = Line::new(line);
        let (f, num) = (&line.f, |i| line.num(i));
        match f[0] {
            "S" => {
                let role = f[3].chars().next().unwrap();
                let entry = (f[1].to_owned(), role, num(4), num(5) as u32, num(6));
                if starts.insert(f[2].to_owned(), entry).is_some() {
                    tally.problems.push(format!("section id {} logged twice", f[2]));
                }
            }
            "E" | "L" => {
                let how = if f[0] == "E" { End::Committed } else { End::Lost };
                if how == End::Lost {
                    tally.lost(f.get(5).copied().unwrap_or(""));
                }
                if ends.insert(f[2].to_owned(), (how, num(4))).is_some() {
                    tally.problems.push(format!("section id {} ended twice", f[2]));
                }
            }
            "B" => tally.problems.push(format!("wrong: {}", line.text)),
            first if passed.contains(&first) => {}
            _ => tally.other(arena, &line),
        }
    }
    let first_stop_after = |pid: u32, start: u64| -> Option<u64> {
        if !arena.backend.leases_run_out_under_paused_holders() {
            return None;
        }
        chaos
            .pauses
            .iter()
            .filter(|p| p.pid == pid && p.after >= start)
            .map(|p| p.after)
            .min()
    };
    let mut sections = Vec::new();
    for (id, (name, role, token, pid, start)) in &starts {
        let (how, end) = match ends.get(id) {
            Some((how, ns)) => (*how, *ns),
            None => match chaos.silenced(*pid) {
                Some(at) => (
                    End::Killed,
                    first_stop_after(*pid, *start).map_or(at, |stop| stop.min(at)),
                ),
                None => {
                    tally.problems.push(format!(
                        "{name} {id}: pid {pid} entered, was never killed, and never left"
                    ));
                    continue;
                }
            },
        };
        sections.push(Section {
            name: name.clone(),
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
            tally
                .problems
                .push(format!("section {id}: an end without a start"));
        }
    }
    sections
}

/// A log line split at its spaces.
pub struct Line<'a> {
    pub text: &'a str,
    pub f: Vec<&'a str>,
}

impl<'a> Line<'a> {
    pub fn new(text: &'a str) -> Self {
        Line {
            text,
            f: text.split(' ').collect(),
        }
    }

    /// Field `i` as a number; a panic if it is not one.
    pub fn num(&self, i: usize) -> u64 {
        self.f
            .get(i)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("malformed log line {:?}", self.text))
    }
}

/// What both tortures read from the log alike: the loss reasons, the
/// acquire errors, the children's summaries, and the problems found.
#[derive(Default)]
pub struct Tally {
    pub lost_reasons: BTreeMap<String, u64>,
    pub errors: BTreeMap<String, u64>,
    /// Each child's `Z` line, from `acquisitions` on.
    pub summaries: Vec<Vec<u64>>,
    pub problems: Vec<String>,
}

impl Tally {
    pub fn lost(&mut self, reason: &str) {
        *self.lost_reasons.entry(reason.to_owned()).or_default() += 1;
    }

    /// Reads an `X` or a `Z` line (an acquire error may only be I/O or a
    /// loss); panics on any other.
    pub fn other(&mut self, arena: &Arena, line: &Line) {
        let f = &line.f;
        match f[0] {
            "X" => {
                let kind: String = f[2].chars().take_while(|c| c.is_alphanumeric()).collect();
                let seen = self.errors.entry(kind).or_default();
                if *seen == 0 {
                    eprintln!(
                        "{} [{}]: first acquire error of its kind: {}",
                        arena.torture, arena.label, line.text
                    );
                }
                *seen += 1;
                if !(f[2].starts_with("Io") || f[2].starts_with("Lost")) {
                    self.problems
                        .push(format!("unexpected acquire error: {}", line.text));
                }
            }
            "Z" => self.summaries.push((2..=7).map(|i| line.num(i)).collect()),
            _ => panic!("malformed log line {:?}", line.text),
        }
    }

    /// The children's summaries, field `i` (0: acquisitions, ... 4: lost)
    /// summed.
    pub fn sum(&self, i: usize) -> u64 {
        self.summaries.iter().map(|z| z[i]).sum()
    }

    /// The longest a child waited for an acquisition.
    pub fn max_wait_ms(&self) -> f64 {
        self.summaries.iter().map(|z| z[5]).max().unwrap_or(0) as f64 / 1000.0
    }

    /// The report's last lines: the survivors' stats, the stop, and what
    /// was reclaimed at the end (`cleaned`) and `left` behind.
    pub fn survivors(&self, chaos: &Chaos, cleaned: usize, left: &[String]) -> String {
        format!(
            "survivors' stats: acquisitions {} handoffs {} reclaimed dead {} reclaimed expired {} lost {}; \
             max wait {:.1} ms\n  \
             stopped in {:.2} s; reclaimed at the end {cleaned}, left behind {}",
            self.sum(0),
            self.sum(1),
            self.sum(2),
            self.sum(3),
            self.sum(4),
            self.max_wait_ms(),
            chaos.stop_time.as_secs_f64(),
            left.len(),
        )
    }

    /// The checks both end with: nothing left behind, some section
    /// completed.
    pub fn check_the_end(&mut self, log: &str, left: &[String]) {
        if !left.is_empty() {
            self.problems.push(format!("left behind: {left:?}"));
        }
        if count(log, "E ") == 0 {
            self.problems.push("no section ever completed".into());
        }
    }
}

/// The log's lines that start with `prefix`.
pub fn count(log: &str, prefix: &str) -> usize {
    log.lines().filter(|l| l.starts_with(prefix)).count()
}
