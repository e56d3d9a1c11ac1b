//! A crash at every step: every failpoint of the filesystem protocol
//! (`leasehold::FAILPOINTS`, feature `failpoints`), in both layouts.
//!
//! First, for each layout and operation, a child runs the operation with
//! every point traced, to learn which points it passes and how often.
//! Then, for each point a layout passes (the first and second time it is
//! passed), a child runs the operation and kills itself with SIGKILL
//! there, while this process contends for the lock; afterwards:
//!
//! - another `Locker` acquires the name within the bound (immediate for a
//!   dead leasehold holder, the grace period for an unreadable record);
//! - no two live processes were ever inside at once (a shared `O_APPEND`
//!   log that everyone inside checks and appends to);
//! - fencing tokens only grew;
//! - after a release and `clean()`, the directory holds nothing but the
//!   fencing counter.
//!
//! Then each point's error variant, in this process: the step after the
//! point fails with EIO. The operation returns a typed error (or handles
//! it), and nothing is held (another `Locker` acquires at once) or left.
//!
//! Run with `cargo test --features failpoints --test crash_points`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use leasehold::{FAILPOINTS, Locker, Strategy};

#[path = "support/reexec.rs"]
mod reexec;

const NAME: &str = "job";
/// The unreadable grace period of every `Locker` here.
const GRACE: Duration = Duration::from_secs(2);
/// How long a child holds the lock: long enough for renewals.
const HOLD: Duration = Duration::from_millis(450);
/// Liveness: the grace period, plus time for the waiter to notice.
const BOUND: Duration = Duration::from_millis(3500);
/// The points whose error leaves an unreadable record behind, taken over
/// after the grace period rather than at once:
/// - `file.create.after_flock`: the new lock file's `fstat` failed, so its
///   identity is unknown, and the path may no longer name it (a reclaimer
///   may have removed it before our flock and another process made a new
///   one): it is left, empty and unlocked, as when the flock is refused.
const GRACE_ON_ERROR: &[&str] = &["file.create.after_flock"];
/// The crashes (`point@n`) that leave an empty record, taken over after
/// the grace period: the lock file made (and maybe flocked) but its
/// record not yet written. Every other crash leaves a dead leasehold
/// holder (taken over at once) or no lock.
const GRACE_ON_CRASH: &[&str] = &[
    "file.create.after_open@1",
    "file.create.after_flock@1",
    "file.write.before_pwrite@1",
];
/// "At once": one filesystem event, or at worst the waiter's 1 s safety-net
/// poll, which a fresh `Locker` can depend on: a release between its
/// first look and the moment its directory watch is set up is no event
/// to it (seen here once: 801 ms, the 800 ms lease's end).
const AT_ONCE: Duration = Duration::from_millis(1500);
/// No child outlives this.
const CHILD_TTL: Duration = Duration::from_secs(20);

const ROLE_ENV: &str = "LEASEHOLD_CRASH_ROLE";
const DIR_ENV: &str = "LEASEHOLD_CRASH_DIR";
const OP_ENV: &str = "LEASEHOLD_CRASH_OP";
const STRATEGY_ENV: &str = "LEASEHOLD_CRASH_STRATEGY";
/// `point@n`: kill at the n-th time the point is passed.
const POINT_ENV: &str = "LEASEHOLD_CRASH_POINT";

/// What a child does around the failpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// Acquire, hold (renewing), release.
    Plain,
    /// The same with fencing tokens.
    Fenced,
    /// The same, fenced, the lock first held by a process that died.
    Reclaim,
    /// The same, with leftovers of crashed processes to collect.
    Sweep,
}

const OPS: [Op; 4] = [Op::Plain, Op::Fenced, Op::Reclaim, Op::Sweep];
const STRATEGIES: [Strategy; 2] = [Strategy::ExclusiveFile, Strategy::Directory];

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Plain => "plain",
            Op::Fenced => "fenced",
            Op::Reclaim => "reclaim",
            Op::Sweep => "sweep",
        }
    }

    fn parse(s: &str) -> Op {
        OPS.into_iter().find(|op| op.as_str() == s).expect("an op")
    }

    fn fencing(self) -> bool {
        matches!(self, Op::Fenced | Op::Reclaim)
    }
}

fn strategy_str(strategy: Strategy) -> &'static str {
    match strategy {
        Strategy::Directory => "dir",
        _ => "file",
    }
}

fn locker(dir: &Path, strategy: Strategy, fencing: bool) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .lease(Duration::from_millis(800))
        .renew_interval(Duration::from_millis(100))
        .unreadable_grace(GRACE)
        .durable(true)
        .fencing(fencing)
        .build()
        .expect("locker")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

// ---- The shared log ------------------------------------------------------

fn log_path(dir: &Path) -> PathBuf {
    dir.parent().expect("a parent").join("inside.log")
}

/// Whether `pid` is gone or a zombie: a dead holder, which excludes nobody.
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
        Err(_) => true,
    }
}

/// Called by whoever just acquired: fails if a live process is inside
/// (entered and not left), or if `token` does not exceed every token
/// logged; then logs the entry.
fn enter(dir: &Path, token: Option<u64>) -> Result<(), String> {
    let path = log_path(dir);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let mut inside: Option<u32> = None;
    let mut last_token = 0;
    for line in text.lines() {
        let mut words = line.split(' ');
        match (words.next(), words.next().and_then(|p| p.parse().ok())) {
            (Some("enter"), Some(pid)) => {
                inside = Some(pid);
                if let Some(t) = words.next().and_then(|t| t.parse::<u64>().ok()) {
                    last_token = last_token.max(t);
                }
            }
            (Some("leave"), Some(_)) => inside = None,
            _ => {}
        }
    }
    let me = std::process::id();
    if let Some(pid) = inside.filter(|&pid| pid != me && !dead(pid)) {
        return Err(format!("{me} entered while {pid} was inside:\n{text}"));
    }
    if let Some(token) = token
        && token <= last_token
    {
        return Err(format!("token {token} after token {last_token}:\n{text}"));
    }
    let token = token.map(|t| format!(" {t}")).unwrap_or_default();
    append(&path, &format!("enter {me}{token}"));
    Ok(())
}

fn leave(dir: &Path) {
    append(&log_path(dir), &format!("leave {}", std::process::id()));
}

fn append(path: &Path, line: &str) {
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open log");
    log.write_all(format!("{line}\n").as_bytes()).expect("append");
}

// ---- The operations ------------------------------------------------------

/// Plants what processes killed mid-publish, mid-release and mid-fencing
/// leave, aged past the settle time.
fn plant_leftovers(dir: &Path, strategy: Strategy, lock_file: &str) {
    let aged = |path: &Path| {
        std::fs::File::open(path)
            .unwrap()
            .set_modified(SystemTime::now() - Duration::from_secs(10))
            .unwrap();
    };
    if strategy == Strategy::Directory {
        for d in [
            format!("{lock_file}.pending-00000000a001"),
            format!("{lock_file}.trash-00000000b001"),
        ] {
            std::fs::create_dir(dir.join(&d)).unwrap();
            std::fs::write(dir.join(&d).join("owner.json"), b"{}").unwrap();
            aged(&dir.join(&d));
        }
    }
    let fence = dir.join(format!("{lock_file}.fence.tmp-{:032x}", 0xc001));
    std::fs::write(&fence, b"1024\n").unwrap();
    aged(&fence);
}

/// One run of `op` after its setup: acquire, check in, hold, check out,
/// release.
async fn cycle(dir: &Path, strategy: Strategy, op: Op) -> leasehold::Result<()> {
    let locker = locker(dir, strategy, op.fencing());
    let guard = locker.acquire_timeout(NAME, Duration::from_secs(5)).await?;
    if let Err(overlap) = enter(dir, guard.fencing_token()) {
        eprintln!("{overlap}");
        std::process::exit(7);
    }
    tokio::time::sleep(HOLD).await;
    leave(dir);
    guard.release().await
}

// ---- Children --------------------------------------------------------------

#[test]
fn child_process_entry() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    std::thread::spawn(|| {
        std::thread::sleep(CHILD_TTL);
        std::process::exit(3);
    });
    let dir = PathBuf::from(std::env::var(DIR_ENV).unwrap());
    let strategy = match std::env::var(STRATEGY_ENV).unwrap().as_str() {
        "dir" => Strategy::Directory,
        _ => Strategy::ExclusiveFile,
    };
    let op = Op::parse(&std::env::var(OP_ENV).unwrap());
    let hits: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
    match role.as_str() {
        // Takes the lock, checks in and dies holding it.
        "die" => {
            let rt = runtime();
            rt.block_on(async {
                let locker = locker(&dir, strategy, op.fencing());
                let guard = locker.acquire(NAME).await.unwrap();
                enter(&dir, guard.fencing_token()).unwrap();
                say("held");
                std::thread::sleep(CHILD_TTL);
            });
        }
        "trace" => {
            for &point in steps() {
                let hits = Arc::clone(&hits);
                fail::cfg_callback(point, move || {
                    *hits.lock().unwrap().entry(point.to_owned()).or_default() += 1;
                })
                .unwrap();
            }
        }
        "crash" => {
            let spec = std::env::var(POINT_ENV).unwrap();
            let (point, nth) = spec.split_once('@').unwrap();
            let nth: u32 = nth.parse().unwrap();
            let seen = std::sync::atomic::AtomicU32::new(0);
            fail::cfg_callback(point, move || {
                if seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == nth {
                    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
                }
            })
            .unwrap();
        }
        other => panic!("unknown role {other}"),
    }
    say("armed");
    let result = runtime().block_on(cycle(&dir, strategy, op));
    let hits: Vec<String> = hits
        .lock()
        .unwrap()
        .iter()
        .map(|(p, n)| format!("{p}@{n}"))
        .collect();
    say(&format!("hits {}", hits.join(",")));
    say(&format!("done {result:?}"));
    std::process::exit(0);
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "@@{line}");
    let _ = out.flush();
}

/// A child, killed by pid and reaped when dropped.
struct Proc {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Proc {
    fn spawn(role: &str, dir: &Path, strategy: Strategy, op: Op, point: &str) -> Proc {
        let mut child = reexec::child_process()
            .env(ROLE_ENV, role)
            .env(DIR_ENV, dir)
            .env(STRATEGY_ENV, strategy_str(strategy))
            .env(OP_ENV, op.as_str())
            .env(POINT_ENV, point)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some((_, msg)) = line.split_once("@@")
                    && tx.send(msg.to_owned()).is_err()
                {
                    return;
                }
            }
        });
        Proc { child, lines }
    }

    fn expect(&self, prefix: &str) -> String {
        loop {
            match self.lines.recv_timeout(CHILD_TTL) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => continue,
                Err(_) => panic!("child {} did not say {prefix:?}", self.child.id()),
            }
        }
    }

    /// Waits for the exit (bounded): `None` if the child was killed.
    fn wait(&mut self) -> Option<i32> {
        let deadline = Instant::now() + CHILD_TTL;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "child {} still running",
                self.child.id()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether the child has exited (a zombie counts).
    fn exited(&self) -> bool {
        dead(self.child.id())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

// ---- The test ----------------------------------------------------------------

/// A lock directory of its own, in a directory of its own (for the log).
fn fresh(strategy: Strategy, op: Op) -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("locks");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let lock_file = locker(&dir, strategy, false)
        .lock_path(NAME)
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    match op {
        Op::Reclaim => {
            let mut holder = Proc::spawn("die", &dir, strategy, op, "");
            holder.expect("held");
            let _ = holder.child.kill();
            holder.wait();
        }
        Op::Sweep => plant_leftovers(&dir, strategy, &lock_file),
        Op::Plain | Op::Fenced => {}
    }
    (root, dir)
}

/// After the child crashed (or failed): the name is acquired within the
/// bound, tokens grew, and once released and cleaned the directory holds
/// only the fencing counter. Returns how long the acquisition took.
async fn recovered(dir: &Path, strategy: Strategy, op: Op, what: &str) -> Duration {
    let locker = locker(dir, strategy, op.fencing());
    let started = Instant::now();
    let guard = match locker.acquire_timeout(NAME, BOUND).await {
        Ok(guard) => guard,
        Err(error) => panic!(
            "{what}: not acquired within {BOUND:?}: {error}: {:?}",
            entries(dir)
        ),
    };
    let took = started.elapsed();
    if let Err(overlap) = enter(dir, guard.fencing_token()) {
        panic!("{what}: {overlap}");
    }
    leave(dir);
    guard
        .release()
        .await
        .unwrap_or_else(|e| panic!("{what}: release: {e}"));
    let deadline = Instant::now() + Duration::from_secs(6);
    loop {
        locker
            .clean(false)
            .await
            .unwrap_or_else(|e| panic!("{what}: clean: {e}"));
        let left: Vec<String> = entries(dir)
            .into_iter()
            .filter(|e| !e.ends_with(".lock.fence"))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "{what}: left behind: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    took
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Contends for the lock from this process until `stop`, checking in
/// like everyone else.
async fn contend(dir: PathBuf, strategy: Strategy, op: Op, stop: Arc<tokio::sync::Notify>) {
    let locker = locker(&dir, strategy, op.fencing());
    let stopped = stop.notified();
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            () = &mut stopped => return,
            got = locker.acquire_timeout(NAME, Duration::from_millis(100)) => {
                if let Ok(guard) = got {
                    enter(&dir, guard.fencing_token()).unwrap_or_else(|e| panic!("contender: {e}"));
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    leave(&dir);
                    drop(guard);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The points (`point@n`) each layout and operation passes.
fn trace() -> Vec<(Strategy, Op, Vec<String>)> {
    let mut traced = Vec::new();
    for strategy in STRATEGIES {
        for op in OPS {
            let (_root, dir) = fresh(strategy, op);
            let mut child = Proc::spawn("trace", &dir, strategy, op, "");
            let hits = child.expect("hits ");
            let done = child.expect("done ");
            assert_eq!(done, "done Ok(())", "{op:?} {strategy:?}");
            assert_eq!(child.wait(), Some(0));
            let hits = hits["hits ".len()..]
                .split(',')
                .filter(|h| !h.is_empty())
                .map(str::to_owned)
                .collect();
            traced.push((strategy, op, hits));
        }
    }
    traced
}

/// One crash case: the child killed at `point`'s `nth` pass.
fn crash_case(strategy: Strategy, op: Op, point: &str, nth: u32) -> Option<Duration> {
    let (_root, dir) = fresh(strategy, op);
    let what = format!("{} {} {point}@{nth}", strategy_str(strategy), op.as_str());
    let rt = runtime();
    let stop = Arc::new(tokio::sync::Notify::new());
    let mut child = Proc::spawn("crash", &dir, strategy, op, &format!("{point}@{nth}"));
    // Contending from the start could leave the child nothing to reclaim.
    child.expect("armed");
    std::thread::sleep(Duration::from_millis(50));
    let contender = rt.spawn(contend(dir.clone(), strategy, op, Arc::clone(&stop)));
    let code = child.wait();
    assert!(child.exited());
    stop.notify_one();
    rt.block_on(contender)
        .unwrap_or_else(|e| panic!("{what}: contender: {e}"));
    match code {
        None => {}
        Some(0) => return None, // not passed this time (timing)
        Some(code) => panic!("{what}: child exited with {code}"),
    }
    let took = rt.block_on(recovered(&dir, strategy, op, &what));
    if !GRACE_ON_CRASH.contains(&format!("{point}@{nth}").as_str()) {
        assert!(
            took < AT_ONCE,
            "{what}: a dead holder's lock taken only after {took:?}"
        );
    }
    Some(took)
}

/// One error case, in this process: the step after `point` fails.
fn error_case(strategy: Strategy, op: Op, point: &str) -> Option<String> {
    let (_root, dir) = fresh(strategy, op);
    let what = format!("error {} {} {point}", strategy_str(strategy), op.as_str());
    let rt = runtime();
    fail::cfg(point, "return").unwrap();
    let result = rt.block_on(cycle(&dir, strategy, op));
    fail::remove(point);
    // Nothing leaked: no pending, trash or temporary counter file (but
    // the leftovers planted for a sweep, which one that failed leaves).
    if op != Op::Sweep {
        let leaked: Vec<String> = entries(&dir)
            .into_iter()
            .filter(|e| !e.ends_with(".lock") && !e.ends_with(".lock.fence"))
            .collect();
        assert!(leaked.is_empty(), "{what}: leaked {leaked:?}");
    }
    // Nothing held: at once (the error left no lock behind), but where
    // the failed step leaves an unreadable record it cannot remove.
    let took = rt.block_on(recovered(&dir, strategy, op, &what));
    let bound = match GRACE_ON_ERROR.contains(&point) {
        true => BOUND,
        false => AT_ONCE,
    };
    assert!(took < bound, "{what}: acquired only after {took:?}");
    // The error says what failed: the injected EIO, never a loss or a
    // replacement that did not happen.
    if let Err(error) = &result {
        let injected =
            matches!(error, leasehold::Error::Io { source, .. } if source.raw_os_error() == Some(5));
        assert!(injected, "{what}: reported {error:?} for an EIO");
    }
    result.err().map(|e| format!("{e:?}"))
}

/// The failpoints between filesystem steps: all but the `engine.` ones,
/// which other tests use to act at a moment of the wait.
fn steps() -> impl Iterator<Item = &'static &'static str> {
    FAILPOINTS.iter().filter(|p| !p.starts_with("engine."))
}

#[test]
fn a_crash_or_an_error_at_every_step_leaves_the_lock_takeable() {
    if std::env::var_os(ROLE_ENV).is_some() {
        return;
    }
    let started = Instant::now();
    let traced = trace();
    let mut cases: Vec<(Strategy, Op, String, u32)> = Vec::new();
    for (strategy, op, hits) in &traced {
        for hit in hits {
            let (point, n) = hit.split_once('@').unwrap();
            let n: u32 = n.parse().unwrap();
            for nth in [1, 2].into_iter().filter(|&k| k <= n) {
                let seen = cases
                    .iter()
                    .any(|(s, _, p, k)| s == strategy && p == point && *k == nth);
                if !seen {
                    cases.push((*strategy, *op, point.to_owned(), nth));
                }
            }
        }
    }
    let passed: std::collections::BTreeSet<&str> = cases.iter().map(|(_, _, p, _)| p.as_str()).collect();
    let never: Vec<&&str> = steps().filter(|p| !passed.contains(**p)).collect();
    assert!(never.is_empty(), "points no operation passes: {never:?}");

    // The error variants first, in this process, one at a time.
    let mut errors = 0;
    for (strategy, op, point, nth) in &cases {
        if *nth == 1 {
            let error = error_case(*strategy, *op, point);
            println!(
                "error {} {} {point}: {error:?}",
                strategy_str(*strategy),
                op.as_str()
            );
            errors += 1;
        }
    }

    // The crashes, a few at a time.
    let results: Mutex<Vec<(String, Option<Duration>)>> = Mutex::default();
    let queue = Mutex::new(cases.clone());
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                loop {
                    let Some((strategy, op, point, nth)) = queue.lock().unwrap().pop() else {
                        return;
                    };
                    let took = crash_case(strategy, op, &point, nth);
                    let what = format!("{} {} {point}@{nth}", strategy_str(strategy), op.as_str());
                    results.lock().unwrap().push((what, took));
                }
            });
        }
    });
    let results = results.into_inner().unwrap();
    let mut covered = 0;
    let (mut slowest, mut slowest_at_once) = (Duration::ZERO, Duration::ZERO);
    for (what, took) in &results {
        match took {
            Some(took) => {
                covered += 1;
                slowest = slowest.max(*took);
                if !GRACE_ON_CRASH.iter().any(|p| what.ends_with(p)) {
                    slowest_at_once = slowest_at_once.max(*took);
                }
                println!("crash {what}: acquired after {took:?}");
            }
            None => println!("crash {what}: not reached this time"),
        }
    }
    println!(
        "crash points covered: {covered} ({} points, {} cases, {errors} error variants, slowest recovery {slowest:?}, \
         slowest of a dead holder's {slowest_at_once:?}, {:?} in all)",
        steps().count(),
        results.len(),
        started.elapsed()
    );
    assert!(covered * 10 >= results.len() * 9, "too many cases not reached");
}
