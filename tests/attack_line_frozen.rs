//! Attack on the Linux waiting line (src/fs/line.rs) with REAL frozen
//! processes: children SIGSTOPped while holding a ticket, at the line's
//! failpoints, right after a mid-turn release (turn mark posted), several
//! at once ahead of a live waiter, resumed (SIGCONT) or killed later, and
//! a frozen process holding read locks over the directory's byte range.
//!
//! For each: exclusion never breaks (a shared O_APPEND log every holder
//! writes on entry and exit), a live waiter gets the lock within a bound
//! after the release that frees it, and afterwards nobody is in line and
//! `Locker::clean` leaves nothing.
#![cfg(target_os = "linux")]

#[path = "support/common.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{ChildProc, FAIR_ENV, anyone_in_line};
use leasehold::{Locker, Strategy};
use nix::sys::signal::Signal;

const FREEZE_ENV: &str = "LEASEHOLD_ATTACK_FREEZE";
/// A live waiter gets the lock within this after the release that frees it.
const BOUND_MS: u64 = 2000;
const MSG: Duration = Duration::from_secs(10);

#[test]
fn child_process_entry() {
    common::child_entry_with(|role, args| async move { roles(&role, &args).await });
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as u64
}

fn now_ms() -> u64 {
    now_us() / 1000
}

fn child_locker(dir: &str) -> Locker {
    Locker::builder()
        .directory(dir)
        .fair(std::env::var_os(FAIR_ENV).is_some())
        .lease(Duration::from_secs(60))
        .poll_interval(Duration::from_millis(10))
        .build()
        .expect("locker")
}

fn log(path: &str, what: &str, who: &str, i: u64) {
    common::append(path, &format!("{what} {who} {i} {}", now_us()));
}

async fn roles(role: &str, args: &[String]) -> i32 {
    let pid = std::process::id().to_string();
    match role {
        // dir name hold_ms log rounds [after]: `rounds` acquisitions, each
        // held `hold_ms`, logged; says when it waits, got it, let go. With
        // `after` (a path), only the acquisitions made once that file
        // exists count, however many come before it.
        "take" => {
            common::arm_freeze(FREEZE_ENV);
            let l = child_locker(&args[0]);
            let hold: u64 = args[2].parse().unwrap();
            let rounds: u64 = args[4].parse().unwrap();
            let after = args.get(5).map(Path::new);
            let mut counted = 0;
            let mut i = 0;
            while counted < rounds {
                if after.is_none_or(Path::exists) {
                    counted += 1;
                }
                i += 1;
                common::say(&format!("waiting {}", now_ms()));
                let t0 = Instant::now();
                let g = l
                    .acquire_timeout(&args[1], Duration::from_secs(40))
                    .await
                    .expect("acquire");
                log(&args[3], "S", &pid, i);
                common::say(&format!("acquired {} {}", now_ms(), t0.elapsed().as_millis()));
                std::thread::sleep(Duration::from_millis(hold));
                log(&args[3], "E", &pid, i);
                drop(g);
                common::say(&format!("released {}", now_ms()));
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            common::say("done");
            0
        }
        // dir name log stopfile quitfile: take and drop the lock at once,
        // back to back (a holder mid-turn, posting turn marks), held
        // 300 µs; once `stopfile` exists, stops itself (SIGSTOP) right
        // after a release, once; exits when `quitfile` exists.
        "looper" => {
            let l = child_locker(&args[0]);
            let (stop, quit) = (Path::new(&args[3]), Path::new(&args[4]));
            let mut stopped = false;
            let mut i = 0u64;
            let mut max_wait = Duration::ZERO;
            let mut tries = 0u32;
            let lock_name = l
                .lock_path(&args[1])
                .unwrap()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            common::say("looping");
            while !quit.exists() {
                let t0 = Instant::now();
                let g = l
                    .acquire_timeout(&args[1], Duration::from_secs(40))
                    .await
                    .expect("acquire");
                max_wait = max_wait.max(t0.elapsed());
                log(&args[2], "S", &pid, i);
                std::thread::sleep(Duration::from_micros(300));
                log(&args[2], "E", &pid, i);
                drop(g);
                i += 1;
                if !stopped && stop.exists() {
                    // Stop right after a release that posted a turn mark
                    // (seen through another open file description), or
                    // after 300 releases without one.
                    tries += 1;
                    let mark = marks_held(Path::new(&args[0]), &lock_name);
                    if !mark && tries < 300 {
                        continue;
                    }
                    stopped = true;
                    common::say(&format!("stopping {} mark {mark} after {tries}", now_ms()));
                    let _ = nix::sys::signal::raise(Signal::SIGSTOP);
                    common::say(&format!("resumed {}", now_ms()));
                }
            }
            common::say(&format!("quit {i} max_wait_ms {}", max_wait.as_millis()));
            0
        }
        other => common::run_role(other, args).await,
    }
}

// ---------------------------------------------------------------- parent

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

struct Scene {
    dir: tempfile::TempDir,
    log: PathBuf,
}

impl Scene {
    fn new() -> Scene {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().with_extension("log");
        let _ = std::fs::remove_file(&log);
        Scene { dir, log }
    }
    fn d(&self) -> &str {
        self.dir.path().to_str().unwrap()
    }
    fn l(&self) -> &str {
        self.log.to_str().unwrap()
    }
    fn path(&self, name: &str) -> String {
        self.dir.path().with_extension(name).to_str().unwrap().to_owned()
    }
    fn env(fair: bool) -> Vec<(&'static str, &'static str)> {
        if fair { vec![(FAIR_ENV, "1")] } else { vec![] }
    }
    fn take(&self, fair: bool, hold_ms: u64, rounds: u64, freeze: Option<&str>) -> ChildProc {
        self.take_after(fair, hold_ms, rounds, freeze, None)
    }
    /// [`Scene::take`] counting only the rounds made once the file
    /// `after` (a [`Scene::path`] name) exists.
    fn take_after(
        &self,
        fair: bool,
        hold_ms: u64,
        rounds: u64,
        freeze: Option<&str>,
        after: Option<&str>,
    ) -> ChildProc {
        let mut env = Scene::env(fair);
        if let Some(f) = freeze {
            env.push((FREEZE_ENV, f));
        }
        let (hold, rounds) = (hold_ms.to_string(), rounds.to_string());
        let after = after.map(|name| self.path(name));
        let mut args = vec![self.d(), "job", &hold, self.l(), &rounds];
        args.extend(after.as_deref());
        ChildProc::spawn_env(Strategy::ExclusiveFile, "take", &args, &env)
    }
    fn looper(&self, fair: bool, tag: &str) -> ChildProc {
        ChildProc::spawn_env(
            Strategy::ExclusiveFile,
            "looper",
            &[
                self.d(),
                "job",
                self.l(),
                &self.path(&format!("stop{tag}")),
                &self.path("quit"),
            ],
            &Scene::env(fair),
        )
    }
    fn parent_locker(&self, fair: bool) -> Locker {
        Locker::builder()
            .directory(self.dir.path())
            .fair(fair)
            .lease(Duration::from_secs(60))
            .build()
            .unwrap()
    }

    /// Exclusion: no S while someone is inside; every E closes the
    /// section of whoever entered. Returns the number of sections.
    fn check_exclusion(&self) -> usize {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut inside: Option<String> = None;
        let mut n = 0;
        let mut bad = Vec::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            match f[0] {
                "S" => {
                    if let Some(who) = &inside {
                        bad.push(format!("{line} while {who} inside"));
                    }
                    inside = Some(f[1].to_owned());
                    n += 1;
                }
                "E" => {
                    if inside.as_deref() != Some(f[1]) {
                        bad.push(format!("{line} but inside {inside:?}"));
                    }
                    inside = None;
                }
                _ => panic!("bad line {line}"),
            }
        }
        assert!(bad.is_empty(), "EXCLUSION BROKEN: {bad:#?}");
        n
    }

    /// After everything: nobody in line, and `clean` leaves nothing.
    fn check_after(&self, rt: &tokio::runtime::Runtime) {
        let started = Instant::now();
        while anyone_in_line(self.dir.path()) && started.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            !anyone_in_line(self.dir.path()),
            "someone still in line after all ended"
        );
        let l = Locker::new(self.dir.path()).unwrap();
        rt.block_on(l.clean(false)).unwrap();
        let left = common::left_after(self.dir.path(), Duration::from_secs(1));
        assert!(left.is_empty(), "left after clean: {left:?}");
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.log);
        for f in ["quit", "stop", "stop1", "stop2", "stopped"] {
            let _ = std::fs::remove_file(self.path(f));
        }
    }
}

fn until_in_line(dir: &Path) {
    let started = Instant::now();
    while !anyone_in_line(dir) {
        assert!(started.elapsed() < MSG, "nobody ever stood in line");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn field(line: &str, i: usize) -> u64 {
    line.split(' ').nth(i).unwrap().parse().unwrap()
}

/// The parent holds; a waiter process stands in line and is SIGSTOPped
/// (its ticket held); a live waiter joins behind it; the parent lets go:
/// the live waiter gets the lock within the bound; then the frozen one
/// is resumed (SIGCONT) while the live one holds, or killed (SIGKILL).
fn frozen_ticket_case(fair: bool, resume: bool) -> u64 {
    let rt = rt();
    let s = Scene::new();
    let holder = s.parent_locker(fair);
    let g = rt.block_on(holder.acquire("job")).unwrap();
    log(s.l(), "S", "parent", 0);
    let frozen = s.take(fair, 50, 1, None);
    frozen.expect("waiting", MSG);
    until_in_line(s.dir.path());
    std::thread::sleep(Duration::from_millis(50));
    frozen.signal(Signal::SIGSTOP);
    frozen.wait_stopped("older waiter", MSG);
    let live = s.take(fair, 300, 1, None);
    live.expect("waiting", MSG);
    std::thread::sleep(Duration::from_millis(150));
    log(s.l(), "E", "parent", 0);
    drop(g);
    let released = now_ms();
    let got = live.expect("acquired", Duration::from_secs(10));
    let wait = field(&got, 1).saturating_sub(released);
    eprintln!(
        "frozen ticket (fair {fair}, resume {resume}): live waiter got the lock {wait} ms after release"
    );
    let mut frozen = frozen;
    if resume {
        frozen.signal(Signal::SIGCONT);
        let fgot = frozen.expect("acquired", Duration::from_secs(10));
        let lrel = live.expect("released", Duration::from_secs(10));
        eprintln!(
            "  resumed waiter got it at {}, live released at {}",
            field(&fgot, 1),
            field(&lrel, 1)
        );
        frozen.expect("done", MSG);
    } else {
        frozen.kill();
        frozen.wait(MSG);
    }
    let mut live = live;
    live.expect("done", MSG);
    live.wait(MSG);
    frozen.wait(MSG);
    drop(holder);
    let n = s.check_exclusion();
    assert!(n >= 2);
    s.check_after(&rt);
    assert!(
        wait < BOUND_MS,
        "live waiter waited {wait} ms behind a frozen ticket"
    );
    wait
}

#[test]
fn frozen_ticket_default_resumed() {
    frozen_ticket_case(false, true);
}

#[test]
fn frozen_ticket_fair_resumed() {
    frozen_ticket_case(true, true);
}

#[test]
fn frozen_ticket_default_killed() {
    frozen_ticket_case(false, false);
}

#[test]
fn frozen_ticket_fair_killed() {
    frozen_ticket_case(true, false);
}

/// Three waiters frozen in line ahead; then a looping holder and a live
/// waiter (5 rounds) contend behind them while the lock keeps moving:
/// every wait of the live waiter stays bounded. Then the frozen ones are
/// resumed and take their turns; exclusion holds throughout.
fn several_frozen_case(fair: bool) {
    let rt = rt();
    let s = Scene::new();
    let holder = s.parent_locker(fair);
    let g = rt.block_on(holder.acquire("job")).unwrap();
    log(s.l(), "S", "parent", 0);
    let mut frozen = Vec::new();
    for _ in 0..3 {
        let f = s.take(fair, 20, 1, None);
        f.expect("waiting", MSG);
        std::thread::sleep(Duration::from_millis(60));
        f.signal(Signal::SIGSTOP);
        f.wait_stopped("older waiter", MSG);
        frozen.push(f);
    }
    let looper = s.looper(fair, "none");
    looper.expect("looping", MSG);
    let live = s.take(fair, 2, 20, None);
    live.expect("waiting", MSG);
    std::thread::sleep(Duration::from_millis(100));
    log(s.l(), "E", "parent", 0);
    drop(g);
    let t0 = Instant::now();
    let mut waits = Vec::new();
    for _ in 0..20 {
        let got = live.expect("acquired", Duration::from_secs(10));
        waits.push(field(&got, 2));
    }
    live.expect("done", MSG);
    let all = t0.elapsed();
    for f in &frozen {
        f.signal(Signal::SIGCONT);
    }
    for f in &frozen {
        f.expect("done", Duration::from_secs(10));
    }
    std::fs::write(s.path("quit"), "").unwrap();
    let q = looper.expect("quit", Duration::from_secs(10));
    for mut c in frozen.into_iter().chain([looper, live]) {
        c.wait(MSG);
    }
    drop(holder);
    let n = s.check_exclusion();
    eprintln!(
        "several frozen (fair {fair}): live waiter's 20 waits (ms) {waits:?} in {all:?}; looper {q}; {n} sections"
    );
    s.check_after(&rt);
    let max = *waits.iter().max().unwrap();
    assert!(max < BOUND_MS, "a wait of {max} ms behind frozen waiters");
}

#[test]
fn several_frozen_waiters_default() {
    several_frozen_case(false);
}

#[test]
fn several_frozen_waiters_fair() {
    several_frozen_case(true);
}

/// A holder looping back to back (mid-turn: it posts turn marks) stops
/// itself right after a release while a live waiter is in line: the live
/// waiter gets the lock soon (marks budget 10 ms). Then the holder is
/// resumed (it must not enter while the waiter holds) or killed.
fn holder_stopped_mid_turn_case(fair: bool, resume: bool) -> u64 {
    let rt = rt();
    let s = Scene::new();
    let looper = s.looper(fair, "1");
    looper.expect("looping", MSG);
    std::thread::sleep(Duration::from_millis(50));
    // A live waiter coming back again and again (rounds of 2 ms), for as
    // long as the looper takes to stop and 50 rounds after (a fair looper
    // posts no marks: it stops after 300 releases, which a slow machine
    // can take longer for than any fixed number of the waiter's rounds).
    let live = s.take_after(fair, 2, 50, None, Some("stopped"));
    live.expect("acquired", MSG);
    std::fs::write(s.path("stop1"), "").unwrap();
    let stop = looper.expect("stopping", MSG);
    let stopped_at = field(&stop, 1);
    looper.wait_stopped("looper", MSG);
    std::fs::write(s.path("stopped"), "").unwrap();
    let marks = marks_held(s.dir.path(), &holder_lock_name(&s));
    // The live waiter's first acquisition after the stop, and all its
    // waits from then on (the looper frozen, its mark byte held).
    let mut first = None;
    let mut after = Vec::new();
    loop {
        let line = live.next_line(Duration::from_secs(10));
        if line.starts_with("acquired") {
            let at = field(&line, 1);
            if at >= stopped_at {
                first.get_or_insert(at - stopped_at);
                after.push(field(&line, 2));
            }
        } else if line == "done" {
            break;
        }
    }
    let wait = first.expect("the live waiter never got the lock after the stop");
    eprintln!(
        "holder stopped after a mid-turn release (fair {fair}, resume {resume}): {stop:?}; mark held while stopped: {marks}; live waiter in {wait} ms after the stop; its waits after: max {:?} ms over {}",
        after.iter().max(),
        after.len()
    );
    let mut looper = looper;
    if resume {
        looper.signal(Signal::SIGCONT);
        looper.expect("resumed", MSG);
        std::thread::sleep(Duration::from_millis(50));
    } else {
        looper.kill();
        looper.wait(MSG);
    }
    let mut live = live;
    live.wait(MSG);
    std::fs::write(s.path("quit"), "").unwrap();
    if resume {
        eprintln!("  looper {}", looper.expect("quit", MSG));
    }
    looper.wait(MSG);
    let n = s.check_exclusion();
    eprintln!("  {n} sections");
    s.check_after(&rt);
    assert!(
        wait < BOUND_MS,
        "live waiter waited {wait} ms after the holder stopped mid-turn"
    );
    assert!(*after.iter().max().unwrap() < BOUND_MS);
    wait
}

fn holder_lock_name(s: &Scene) -> String {
    let l = Locker::new(s.dir.path()).unwrap();
    l.lock_path("job")
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

fn region(name: &str) -> u64 {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % (1 << 22)) * (1 << 40)
}

/// Whether a byte of the turn-mark half of `name`'s region is held.
fn marks_held(dir: &Path, name: &str) -> bool {
    range_held(dir, region(name) + (1 << 39), 1 << 39)
}

fn range_held(dir: &Path, start: u64, len: u64) -> bool {
    use nix::fcntl::{FcntlArg, fcntl};
    let file = std::fs::File::open(dir).unwrap();
    let mut lock = nix::libc::flock {
        l_type: nix::libc::F_WRLCK as i16,
        l_whence: nix::libc::SEEK_SET as i16,
        l_start: start as i64,
        l_len: len as i64,
        l_pid: 0,
    };
    fcntl(&file, FcntlArg::F_OFD_GETLK(&mut lock)).unwrap();
    i32::from(lock.l_type) != nix::libc::F_UNLCK
}

#[test]
fn default_holder_stopped_mid_turn_resumed() {
    holder_stopped_mid_turn_case(false, true);
}

#[test]
fn fair_holder_stopped_mid_turn_resumed() {
    holder_stopped_mid_turn_case(true, true);
}

#[test]
fn default_holder_stopped_mid_turn_killed() {
    holder_stopped_mid_turn_case(false, false);
}

/// Two loopers hold the lock back to back while a waiter is in line; one
/// of them stops after a release (its mark posted) and the other keeps
/// looping: the live waiter and the live looper keep getting the lock.
fn one_of_two_loopers_stopped(fair: bool) {
    let rt = rt();
    let s = Scene::new();
    let a = s.looper(fair, "1");
    let b = s.looper(fair, "2");
    a.expect("looping", MSG);
    b.expect("looping", MSG);
    std::thread::sleep(Duration::from_millis(100));
    std::fs::write(s.path("stop1"), "").unwrap();
    a.expect("stopping", MSG);
    a.wait_stopped("looper", MSG);
    let live = s.take(fair, 2, 20, None);
    let mut waits = Vec::new();
    for _ in 0..20 {
        waits.push(field(&live.expect("acquired", Duration::from_secs(10)), 2));
    }
    a.signal(Signal::SIGCONT);
    a.expect("resumed", MSG);
    std::thread::sleep(Duration::from_millis(100));
    std::fs::write(s.path("quit"), "").unwrap();
    let qa = a.expect("quit", MSG);
    let qb = b.expect("quit", MSG);
    for mut c in [a, b, live] {
        c.wait(MSG);
    }
    let n = s.check_exclusion();
    eprintln!("one of two loopers stopped (fair {fair}): waits {waits:?}; a: {qa}; b: {qb}; {n} sections");
    s.check_after(&rt);
    let max = *waits.iter().max().unwrap();
    assert!(max < BOUND_MS, "a wait of {max} ms");
}

#[test]
fn one_of_two_loopers_stopped_default() {
    one_of_two_loopers_stopped(false);
}

#[test]
fn one_of_two_loopers_stopped_fair() {
    one_of_two_loopers_stopped(true);
}

/// A process holding an OFD read lock over `ranges` of the directory,
/// frozen, while two loopers and a live waiter contend: every wait is
/// bounded and exclusion holds.
fn squatter_case(fair: bool, ranges: &[String]) {
    let rt = rt();
    let s = Scene::new();
    let mut args = vec![s.d().to_owned(), String::new()];
    args.extend(ranges.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let squat = ChildProc::spawn_env(Strategy::ExclusiveFile, "squat", &args, &[]);
    squat.expect("squatting", MSG);
    squat.signal(Signal::SIGSTOP);
    squat.wait_stopped("squatter", MSG);
    let a = s.looper(fair, "x");
    let b = s.looper(fair, "y");
    a.expect("looping", MSG);
    b.expect("looping", MSG);
    let live = s.take(fair, 2, 20, None);
    let t0 = Instant::now();
    let mut waits = Vec::new();
    for _ in 0..20 {
        waits.push(field(&live.expect("acquired", Duration::from_secs(10)), 2));
    }
    let took = t0.elapsed();
    std::fs::write(s.path("quit"), "").unwrap();
    let qa = a.expect("quit", MSG);
    let qb = b.expect("quit", MSG);
    for mut c in [a, b, live] {
        c.wait(MSG);
    }
    let mut squat = squat;
    squat.kill();
    squat.wait(MSG);
    let n = s.check_exclusion();
    eprintln!(
        "squatter {ranges:?} (fair {fair}): waiter's 20 waits (ms) {waits:?} in {took:?}; a: {qa}; b: {qb}; {n} sections"
    );
    s.check_after(&rt);
    let max = *waits.iter().max().unwrap();
    assert!(max < BOUND_MS, "a wait of {max} ms beside a frozen squatter");
}

#[test]
fn squatter_whole_range_default() {
    squatter_case(false, &["0,0".to_owned()]);
}

#[test]
fn squatter_whole_range_fair() {
    squatter_case(true, &["0,0".to_owned()]);
}

/// One-byte ranges at the bottom of the name's region (they read as the
/// oldest tickets) and one over the marks half.
fn region_ranges() -> Vec<String> {
    let d = tempfile::tempdir().unwrap();
    let name = Locker::new(d.path())
        .unwrap()
        .lock_path("job")
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let r = region(&name);
    let mut v: Vec<String> = (1..=6).map(|i| format!("{},1", r + i * 3)).collect();
    v.push(format!("{},{}", r + (1 << 39), 1u64 << 39));
    v
}

#[test]
fn squatter_fake_tickets_and_marks_default() {
    squatter_case(false, &region_ranges());
}

#[test]
fn squatter_fake_tickets_and_marks_fair() {
    squatter_case(true, &region_ranges());
}

/// A waiter frozen at a line failpoint (its own SIGSTOP there), while the
/// parent holds and a live waiter waits: the live waiter gets the lock
/// within the bound after the release; then the frozen one is resumed
/// (or killed).
#[cfg(feature = "failpoints")]
fn waiter_frozen_at(point: &str, fair: bool, resume: bool) -> u64 {
    let rt = rt();
    let s = Scene::new();
    let holder = s.parent_locker(fair);
    let g = rt.block_on(holder.acquire("job")).unwrap();
    log(s.l(), "S", "parent", 0);
    let frozen = s.take(fair, 50, 1, Some(point));
    frozen.expect("freezing", MSG);
    frozen.wait_stopped("waiter at the failpoint", MSG);
    let live = s.take(fair, 300, 1, None);
    live.expect("waiting", MSG);
    std::thread::sleep(Duration::from_millis(150));
    log(s.l(), "E", "parent", 0);
    drop(g);
    let released = now_ms();
    let got = live.expect("acquired", Duration::from_secs(10));
    let wait = field(&got, 1).saturating_sub(released);
    eprintln!(
        "waiter frozen at {point} (fair {fair}, resume {resume}): live waiter in {wait} ms after release"
    );
    let mut frozen = frozen;
    if resume {
        frozen.signal(Signal::SIGCONT);
        frozen.expect("done", Duration::from_secs(10));
    } else {
        frozen.kill();
    }
    frozen.wait(MSG);
    let mut live = live;
    live.expect("done", MSG);
    live.wait(MSG);
    drop(holder);
    s.check_exclusion();
    s.check_after(&rt);
    assert!(wait < BOUND_MS, "live waiter waited {wait} ms");
    wait
}

#[cfg(feature = "failpoints")]
#[test]
fn waiter_frozen_before_ticket() {
    for (fair, resume) in [(false, true), (true, false)] {
        waiter_frozen_at("line.wait.before_ticket@1", fair, resume);
    }
}

#[cfg(feature = "failpoints")]
#[test]
fn waiter_frozen_at_stand_back_look() {
    for (fair, resume) in [(false, true), (true, false), (false, false)] {
        waiter_frozen_at("line.stand_back.before_look@1", fair, resume);
    }
}

/// A holder frozen at `line.release.before_look` (under the name's
/// mutation lock, its lock file still in place): a live waiter cannot get
/// the lock meanwhile (by design, the frozen holder still holds), and
/// gets it within the bound once the holder is killed, or resumed.
#[cfg(feature = "failpoints")]
fn holder_frozen_at_release(fair: bool, resume: bool) {
    let rt = rt();
    let s = Scene::new();
    let frozen = s.take(fair, 100, 1, Some("line.release.before_look@1"));
    frozen.expect("acquired", MSG);
    let live = s.take(fair, 50, 1, None);
    live.expect("waiting", MSG);
    frozen.expect("freezing", MSG);
    frozen.wait_stopped("holder at release", MSG);
    // A third, fair or not, in line too, and a try_acquire loop beside.
    let other = s.take(!fair, 50, 1, None);
    other.expect("waiting", MSG);
    std::thread::sleep(Duration::from_millis(500));
    let in_line = anyone_in_line(s.dir.path());
    let mut frozen = frozen;
    let freed = now_ms();
    if resume {
        frozen.signal(Signal::SIGCONT);
    } else {
        frozen.kill();
    }
    let got = live.expect("acquired", Duration::from_secs(10));
    let wait = field(&got, 1).saturating_sub(freed);
    let got2 = other.expect("acquired", Duration::from_secs(10));
    let wait2 = field(&got2, 1).saturating_sub(freed);
    eprintln!(
        "holder frozen at release (fair {fair}, resume {resume}): waiters in line while frozen: {in_line}; live waiters in {wait} / {wait2} ms after the holder was {}",
        if resume { "resumed" } else { "killed" }
    );
    frozen.wait(MSG);
    let (mut live, mut other) = (live, other);
    live.expect("done", MSG);
    other.expect("done", MSG);
    live.wait(MSG);
    other.wait(MSG);
    s.check_exclusion();
    s.check_after(&rt);
    assert!(wait.min(wait2) < BOUND_MS, "waited {wait}/{wait2} ms");
    assert!(wait.max(wait2) < BOUND_MS + 400, "waited {wait}/{wait2} ms");
}

#[cfg(feature = "failpoints")]
#[test]
fn holder_frozen_at_release_killed() {
    holder_frozen_at_release(false, false);
    holder_frozen_at_release(true, false);
}

#[cfg(feature = "failpoints")]
#[test]
fn holder_frozen_at_release_resumed() {
    holder_frozen_at_release(true, true);
}

/// A waiter registered on the name's mutation-lock file (kept for it by
/// the release) is frozen and then killed: `clean` must leave nothing.
#[test]
fn waiter_killed_after_release_kept_the_mutex_for_it() {
    let rt = rt();
    let s = Scene::new();
    let holder = s.parent_locker(false);
    let g = rt.block_on(holder.acquire("job")).unwrap();
    log(s.l(), "S", "parent", 0);
    let mut frozen = s.take(false, 10, 1, None);
    frozen.expect("waiting", MSG);
    until_in_line(s.dir.path());
    std::thread::sleep(Duration::from_millis(50));
    frozen.signal(Signal::SIGSTOP);
    frozen.wait_stopped("waiter", MSG);
    log(s.l(), "E", "parent", 0);
    drop(g);
    std::thread::sleep(Duration::from_millis(50));
    let before = common::entries(s.dir.path());
    frozen.kill();
    frozen.wait(MSG);
    drop(holder);
    eprintln!("entries after the release, waiter frozen: {before:?}");
    s.check_exclusion();
    s.check_after(&rt);
}

/// A frozen process (read access only) holds `n` one-byte ranges at the
/// bottom of the name's region: to the line, `n` tickets older than any
/// waiter's. docs/format.md: such bytes "cost each process about 30 ms
/// once while they stay" (passed over, remembered: up to 256). A lone
/// `Locker` (fair or not) then takes and drops the lock 300 times: how
/// many of its acquisitions were kept off the free lock (slow: over
/// [`PAUSE`]), and how long all take.
fn fake_tickets_case(fair: bool, n: u64) -> Costs {
    fake_ranges_case(fair, n, None)
}

/// An acquisition at least this slow was (or may have been) kept off the
/// free lock by a 10 ms stand-back (`STAND_BACK` in src/fs/line.rs);
/// a sleep never ends early, so every stand-back is counted.
const PAUSE: Duration = Duration::from_millis(9);

/// What a lone `Locker`'s 300 acquisitions cost beside frozen bytes.
struct Costs {
    /// Acquisitions slower than [`PAUSE`].
    slow: usize,
    /// All 300 acquisitions and releases.
    all: Duration,
    /// `all` less the slow acquisitions: the time turns can last.
    busy: Duration,
}

impl Costs {
    /// A line that may hide waiters keeps a lone `Locker` off the free
    /// lock once per turn (docs/format.md), and a turn lasts 10 ms or 32
    /// acquisitions (`TURN`, `TURN_ACQUISITIONS` in src/fs/line.rs),
    /// whichever comes first: so at most `300 / 32 + busy / 10 ms` pauses,
    /// however slow the machine. Doubled, plus 5, for acquisitions a busy
    /// machine made slow without a pause. The bug this file found made
    /// every acquisition pause (299 of 300, busy ~0.1 s: bound ~45).
    fn at_most_one_pause_per_turn(&self, what: &str) {
        let turns = 300 / 32 + self.busy.as_millis() as usize / 10;
        assert!(
            self.slow <= 2 * turns + 5,
            "{what}: {} of 300 acquisitions of a lone Locker were kept off the free lock ({:?}, {:?} of it outside pauses): more than one pause per turn ({turns} turns)",
            self.slow,
            self.all,
            self.busy
        );
    }
}

fn fake_ranges_case(fair: bool, n: u64, ranges: Option<&str>) -> Costs {
    let rt = rt();
    let s = Scene::new();
    let r = region(&holder_lock_name(&s));
    let mut args = vec![s.d().to_owned(), String::new()];
    match ranges {
        // "offset,len;offset,len": ranges relative to the region instead.
        Some(spec) if n == 0 => args.extend(spec.split(';').map(|x| {
            let (o, len) = x.split_once(',').unwrap();
            format!("{},{len}", r + o.parse::<u64>().unwrap())
        })),
        _ => args.extend((0..n).map(|k| format!("{},1", r + 1 + 2 * k))),
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let squat = ChildProc::spawn_env(Strategy::ExclusiveFile, "squat", &args, &[]);
    squat.expect("squatting", Duration::from_secs(30));
    squat.signal(Signal::SIGSTOP);
    squat.wait_stopped("squatter", MSG);
    let l = s.parent_locker(fair);
    let t0 = Instant::now();
    let mut slow = 0;
    let mut max = Duration::ZERO;
    let mut paused = Duration::ZERO;
    let mut slow_at = Vec::new();
    rt.block_on(async {
        for i in 0..300 {
            let a = Instant::now();
            let g = l.acquire_timeout("job", Duration::from_secs(10)).await.unwrap();
            let took = a.elapsed();
            log(s.l(), "S", "parent", i);
            log(s.l(), "E", "parent", i);
            drop(g);
            if took >= PAUSE {
                slow += 1;
                paused += took;
                if slow_at.len() < 12 {
                    slow_at.push(i);
                }
            }
            max = max.max(took);
        }
    });
    let all = t0.elapsed();
    drop(l);
    let mut squat = squat;
    squat.kill();
    squat.wait(MSG);
    s.check_exclusion();
    s.check_after(&rt);
    eprintln!(
        "{n} frozen fake tickets {ranges:?} (fair {fair}): lone Locker, 300 acquisitions in {all:?}; {slow} over {PAUSE:?} (first at {slow_at:?}), max {max:?}"
    );
    Costs {
        slow,
        all,
        busy: all.saturating_sub(paused),
    }
}

#[test]
fn fake_tickets_few_cost_once() {
    for fair in [false, true] {
        // The same squatter, frozen, holding nothing: what a busy
        // machine alone makes slow, in the same run.
        let alone = fake_tickets_case(fair, 0).slow;
        let slow = fake_tickets_case(fair, 20).slow;
        assert!(
            slow <= 2 * alone + 12,
            "{slow} slow acquisitions with 20 fake tickets (fair {fair}; {alone} beside a frozen process holding nothing)"
        );
    }
}

/// 40 one-byte ranges (more than the 32 a joining waiter counts) held
/// by a frozen reader. Before the fix, every one of them ended every turn
/// of a lone fair `Locker`, even once passed over, and each rejoin paid
/// the 10 ms pause for a line that may hide waiters: 299 of 300
/// acquisitions slow. Passed-over tickets no longer end fair turns.
#[test]
fn fake_tickets_over_ahead_cost_every_acquisition_fair() {
    fake_tickets_case(true, 40).at_most_one_pause_per_turn("40 frozen fake tickets, fair");
}

/// The same for a default `Locker`: one 10 ms pause per turn (32
/// acquisitions or 10 ms), as docs/format.md says for a line that may
/// hide waiters.
#[test]
fn fake_tickets_many_default() {
    fake_tickets_case(false, 400).at_most_one_pause_per_turn("400 frozen fake tickets, default");
}

/// Just two ranges, a one-byte "ticket" at the region's byte 1 and a
/// two-byte range at byte 5, held by a frozen process with read access to
/// the directory. Before the fix, the ticket ended the fair `Locker`'s
/// turn at every release even once passed over, and the two-byte range,
/// passed over but still "seen", made every rejoin "hidden": every
/// acquisition of a lone fair `Locker` kept off the free lock 10 ms, for
/// as long as the bytes stayed (299 of 300 slow).
#[test]
fn two_frozen_ranges_cost_every_acquisition_fair() {
    fake_ranges_case(true, 0, Some("1,1;5,2")).at_most_one_pause_per_turn("2 frozen ranges, fair");
}
