//! Attack: real leasehold processes and real velocious / pi-research Node
//! processes (their own code, tests/fixtures/frozen-driver.mjs) contend for
//! one name in one directory, in the layouts where they meet, while the
//! test freezes (SIGSTOP) holders and waiters of either system for less and
//! longer than the relevant lease, then resumes (SIGCONT) or kills them.
//! Every process logs entry (`S`), exit (`E`) and loss (`L`) of the critical
//! section to one O_APPEND log; overlaps are judged in log order. The
//! foreign code also logs its own judgments (`X`: a lock judged stale;
//! `T`: a lock moved to a trash name) and every holder whether its lock was
//! still its own at exit (`R`: robbed), so that an overlap, a loss or a
//! robbery is told apart as the foreign systems' own reclaim race
//! (docs/guarantees.md, *Not guaranteed*) or leasehold's fault
//! ([`check_overlaps`]). Found with it: a holder told of a loss before its
//! lock, still its own, was removed (tests/lost.rs).
#![cfg(target_os = "linux")]

#[path = "support/common.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::ChildProc;
use leasehold::{Locker, PathStyle, Strategy};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const NAME: &str = "frozen job";
const PNAME: &str = "frozen-state";

#[test]
fn child_process_entry() {
    common::child_entry_with(|role, args| async move {
        match role.as_str() {
            "lh" => lh(&args).await,
            _ => common::run_role(&role, &args).await,
        }
    });
}

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

/// dir name log rounds hold_ms lease_ms poll_ms: `rounds` times acquire,
/// log `S l pid ns`, say "acquired", hold `hold_ms` (or until lost: log
/// `L`, say "lost", exit 4), log `E`, release, say "released".
async fn lh(args: &[String]) -> i32 {
    let pid = std::process::id();
    let log = &args[2];
    let rounds: u32 = args[3].parse().unwrap();
    let hold = Duration::from_millis(args[4].parse().unwrap());
    let locker = Locker::builder()
        .directory(&args[0])
        .strategy(common::strategy_from_env())
        .path_style(common::path_style_from_env())
        .lease(Duration::from_millis(args[5].parse().unwrap()))
        .poll_interval(Duration::from_millis(args[6].parse().unwrap()))
        .build()
        .expect("locker");
    let path = locker.lock_path(&args[1]).unwrap();
    let record = if common::strategy_from_env() == Strategy::Directory {
        path.join("owner.json")
    } else {
        path
    };
    let on_disk = || -> Option<String> {
        let text = std::fs::read_to_string(&record).ok()?;
        let v: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
        v.get("holderId").and_then(|x| x.as_str()).map(str::to_owned)
    };
    for _ in 0..rounds {
        let g = locker.acquire(&args[1]).await.expect("acquire");
        let id = g.owner().holder_id().map(str::to_owned);
        common::append(log, &format!("S l {pid} {}", now_ns()));
        common::say("acquired");
        tokio::select! {
            _ = g.lost() => {
                common::append(log, &format!("L l {pid} {}", now_ns()));
                eprintln!("leasehold {pid} lost its lock: {:?}; {:?}", g.ensure_held().await, locker.stats());
                common::say("lost");
                return 4;
            }
            _ = tokio::time::sleep(hold) => {}
        }
        if g.is_lost() {
            common::append(log, &format!("L l {pid} {}", now_ns()));
            common::say("lost");
            return 4;
        }
        if on_disk() != id {
            common::append(log, &format!("R l {pid} {}", now_ns()));
        }
        common::append(log, &format!("E l {pid} {}", now_ns()));
        drop(g);
        common::say("released");
    }
    common::say("done");
    0
}

// ---------------------------------------------------------------- helpers

/// A Node process running the frozen driver, killed by pid when dropped.
struct Node {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// The lock directory and the log, shown if it never ends.
    dir: PathBuf,
    log: PathBuf,
}

impl Node {
    /// velocious: `v`, rounds, hold, lease, renew; pi-research: `p`, rounds, hold.
    fn spawn(which: &str, dir: &Path, name: &str, log: &Path, rest: &[&str]) -> Node {
        let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/frozen-driver.mjs");
        let mut child = Command::new("node")
            .arg(driver)
            .arg(which)
            .arg(dir)
            .arg(name)
            .arg(log)
            .args(rest)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run node");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Node {
            child,
            lines,
            dir: dir.to_owned(),
            log: log.to_owned(),
        }
    }
    fn pid(&self) -> u32 {
        self.child.id()
    }
    fn expect(&self, what: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l == what => return,
                Ok(_) => continue,
                Err(_) => panic!("node {} did not say {what:?} within {within:?}", self.pid()),
            }
        }
    }
    fn signal(&self, s: Signal) {
        let _ = kill(Pid::from_raw(self.pid() as i32), s);
    }
    fn wait(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "node {} still running after {within:?}; in the lock directory: {:?}\nLOG:\n{}",
                self.pid(),
                dir_contents(&self.dir),
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = kill(Pid::from_raw(self.pid() as i32), Signal::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// Every entry of `dir` (one level down for directories) with its
/// content, for a failure's message.
fn dir_contents(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            out.push((format!("{name}/"), String::new()));
            for f in std::fs::read_dir(&p).into_iter().flatten().flatten() {
                let text = std::fs::read_to_string(f.path()).unwrap_or_default();
                out.push((format!("{name}/{}", f.file_name().to_string_lossy()), text));
            }
        } else {
            out.push((name, std::fs::read_to_string(&p).unwrap_or_default()));
        }
    }
    out
}

fn node_ok() -> bool {
    common::node()
}

fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
        .unwrap_or(false)
}

fn stop(pid: u32) {
    kill(Pid::from_raw(pid as i32), Signal::SIGSTOP).unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    while !stopped(pid) {
        assert!(Instant::now() < until, "{pid} never stopped");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn cont(pid: u32) {
    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
}

/// One section of the log: system (`l`, `v`, `p`), pid, entry and exit
/// (line index; `None`: never left), entry/exit ns, and whether it ended lost.
#[derive(Debug, Clone)]
struct Sec {
    sys: String,
    pid: u32,
    start: usize,
    end: Option<usize>,
    start_ns: u128,
    end_ns: Option<u128>,
    lost: bool,
}

fn sections(log: &Path) -> Vec<Sec> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut secs: Vec<Sec> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split(' ').collect();
        if matches!(f[0], "R" | "X" | "T") {
            continue;
        }
        assert_eq!(f.len(), 4, "malformed log line {line:?}");
        let pid: u32 = f[2].parse().unwrap();
        let ns: u128 = f[3].parse().unwrap();
        match f[0] {
            "S" => secs.push(Sec {
                sys: f[1].to_owned(),
                pid,
                start: i,
                end: None,
                start_ns: ns,
                end_ns: None,
                lost: false,
            }),
            "E" | "L" => {
                let s = secs
                    .iter_mut()
                    .rev()
                    .find(|s| s.pid == pid && s.end.is_none())
                    .unwrap_or_else(|| panic!("an end without a start: {line}"));
                s.end = Some(i);
                s.end_ns = Some(ns);
                s.lost = f[0] == "L";
            }
            _ => panic!("malformed log line {line:?}"),
        }
    }
    secs
}

/// An `R`, `X` or `T` line of the log.
struct Event {
    /// Its index in the log.
    i: usize,
    /// The last index its effect may land before: for a judgment (X), the
    /// line before its writer's next one (velocious logs X when `isStale`
    /// says yes, then removes the path and publishes, and may be frozen
    /// in between); for the others, its own.
    reach: usize,
    line: String,
}

/// The `R`/`X`/`T` lines of the log.
fn events(log: &Path) -> Vec<Event> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let pid = |l: &str| l.split(' ').nth(2).map(str::to_owned);
    lines
        .iter()
        .enumerate()
        .filter(|(_, l)| matches!(l.as_bytes().first(), Some(b'R' | b'X' | b'T')))
        .map(|(i, l)| {
            let reach = match l.starts_with('X') {
                true => (i + 1..lines.len())
                    .find(|&n| pid(lines[n]) == pid(l))
                    .map_or(usize::MAX, |n| n - 1),
                false => i,
            };
            Event {
                i,
                reach,
                line: (*l).to_owned(),
            }
        })
        .collect()
}

/// Whether the overlap of `a` and `b` is the foreign system's own reclaim
/// race (docs/guarantees.md, *Not guaranteed*: "velocious's or
/// pi-research's own reclaim bugs"): one of the two found its lock gone at
/// exit (R) or was told it lost it (L), and a foreign process judged a lock
/// stale (X) or trashed one (T) whose effect may land between just before
/// the overlap began (a holder logs its entry after its lock is in place,
/// so a judgment may come first; velocious removes the path it judged
/// after logging X, maybe frozen in between: [`Event::reach`]) and that
/// holder's exit.
fn foreign_race(ev: &[Event], foreign_pids: &[u32], a: &Sec, b: &Sec) -> bool {
    let from = a.start.min(b.start);
    [a, b]
        .into_iter()
        .any(|s| robbed(ev, s) && judged(ev, foreign_pids, from, s.end.unwrap_or(usize::MAX)))
}

/// Whether `s`'s holder found its lock gone at exit (R) or lost it (L).
fn robbed(ev: &[Event], s: &Sec) -> bool {
    let pid = s.pid.to_string();
    s.lost
        || ev.iter().any(|e| {
            e.line.starts_with('R')
                && e.i > s.start
                && e.i < s.end.unwrap_or(usize::MAX)
                && e.line.split(' ').nth(2) == Some(&pid)
        })
}

/// Whether one of `foreign_pids` judged a lock stale (X) or trashed one
/// (T) with an effect that may land from two log lines before `from` up to
/// `to`.
fn judged(ev: &[Event], foreign_pids: &[u32], from: usize, to: usize) -> bool {
    ev.iter().any(|e| {
        (e.line.starts_with('X') || e.line.starts_with('T'))
            && e.reach.saturating_add(2) >= from
            && e.i < to
            && e.line
                .split(' ')
                .nth(2)
                .and_then(|p| p.parse::<u32>().ok())
                .is_some_and(|p| foreign_pids.contains(&p))
    })
}

/// Who judged a lock stale (X) or trashed one (T): only foreign
/// processes log these.
fn judges(ev: &[Event]) -> Vec<u32> {
    ev.iter()
        .filter(|e| e.line.starts_with('X') || e.line.starts_with('T'))
        .filter_map(|e| e.line.split(' ').nth(2)?.parse().ok())
        .collect()
}

/// A leasehold child's end: a success, or a lost lock (exit 4) that a
/// foreign judgment inside its section explains (the foreign systems' own
/// reclaim races, as in [`foreign_race`]).
fn lh_ended(status: std::process::ExitStatus, log: &Path, pid: u32) {
    if status.success() {
        return;
    }
    let ev = events(log);
    let foreign_pids = judges(&ev);
    let lost = sections(log)
        .into_iter()
        .find(|s| s.pid == pid && s.lost)
        .filter(|s| judged(&ev, &foreign_pids, s.start, s.end.unwrap_or(usize::MAX)));
    assert!(
        status.code() == Some(4) && lost.is_some(),
        "leasehold process {pid} ended {status:?} with no foreign judgment to explain it\nLOG:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// A foreign child's end: a success, or a failure of its own after its
/// own reclaim race (velocious's `fs.rm` of a lock it judged stale can
/// meet a publication and throw `ENOTEMPTY`, uncaught).
fn foreign_ended(status: std::process::ExitStatus, log: &Path, pid: u32) {
    let raced = events(log)
        .iter()
        .any(|e| e.line.starts_with('X') || e.line.starts_with('T'));
    assert!(
        status.success() || raced,
        "foreign process {pid} ended {status:?} with no race of its own\nLOG:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// Pairs of sections of different processes that overlap in log order.
fn overlaps(secs: &[Sec]) -> Vec<(Sec, Sec)> {
    let mut out = Vec::new();
    for (i, a) in secs.iter().enumerate() {
        for b in &secs[i + 1..] {
            if a.pid == b.pid {
                continue;
            }
            let a_end = a.end.unwrap_or(usize::MAX);
            let b_end = b.end.unwrap_or(usize::MAX);
            if a.start < b_end && b.start < a_end {
                out.push((a.clone(), b.clone()));
            }
        }
    }
    out
}

/// Asserts that every overlap in `log` is excused: neither section is
/// `never_excused` (a frozen holder within its lease: no foreign rule may
/// take it) and the foreign system's own reclaim race explains it
/// ([`foreign_race`]); and that no foreign holder was robbed (`R v|p`)
/// without a foreign judgment (`X`, `T`) while it was inside: that would be
/// leasehold's doing. Sections `left_out` are not judged: a holder frozen
/// past its lease loses the lock while frozen (docs/guarantees.md, item
/// 1), and a holder killed inside never ends its section. Returns how many
/// overlaps the foreign race explains.
fn check_overlaps(
    log: &Path,
    foreign_pids: &[u32],
    never_excused: impl Fn(&Sec) -> bool,
    left_out: impl Fn(&Sec) -> bool,
) -> usize {
    let secs = sections(log);
    let ev = events(log);
    let (foreign, ov): (Vec<_>, Vec<_>) = overlaps(&secs)
        .into_iter()
        .filter(|(a, b)| !left_out(a) && !left_out(b))
        .partition(|(a, b)| !never_excused(a) && !never_excused(b) && foreign_race(&ev, foreign_pids, a, b));
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let excerpt = |a: &Sec, b: &Sec| {
        let from = a.start.min(b.start).saturating_sub(8);
        let to = (a.end.unwrap_or(lines.len()).max(b.end.unwrap_or(lines.len())) + 3).min(lines.len());
        let body: Vec<String> = (from..to).map(|i| format!("  {i:4} {}", lines[i])).collect();
        format!("{}{} / {}{}:\n{}", a.sys, a.pid, b.sys, b.pid, body.join("\n"))
    };
    let shown: Vec<String> = ov.iter().map(|(a, b)| excerpt(a, b)).collect();
    let judgments: Vec<String> = ev
        .iter()
        .map(|e| format!("  {:4} (to {}) {}", e.i, e.reach, e.line))
        .collect();
    assert!(
        ov.is_empty(),
        "{} overlap(s) no foreign race explains: {}\n{}\nevents:\n{}",
        ov.len(),
        show(&secs),
        shown.join("\n"),
        judgments.join("\n")
    );
    // Any foreign judgment explains a foreign holder's loss.
    let judges = judges(&ev);
    let robbed_foreign: Vec<&Sec> = secs
        .iter()
        .filter(|s| s.sys != "l")
        .filter(|s| robbed(&ev, s) && !judged(&ev, &judges, s.start, s.end.unwrap_or(usize::MAX)))
        .collect();
    // A leasehold holder is lost (L) only to a foreign judgment.
    let lost: Vec<&Sec> = secs
        .iter()
        .filter(|s| s.sys == "l" && s.lost && !left_out(s))
        .filter(|s| !judged(&ev, &judges, s.start, s.end.unwrap_or(usize::MAX)))
        .collect();
    assert!(
        lost.is_empty(),
        "leasehold holders lost with no foreign judgment: {}\n{text}",
        show(&lost.into_iter().cloned().collect::<Vec<_>>())
    );
    assert!(
        robbed_foreign.is_empty(),
        "foreign holders robbed without a foreign judgment: {}\n{text}",
        show(&robbed_foreign.into_iter().cloned().collect::<Vec<_>>())
    );
    if !foreign.is_empty() {
        let shown: Vec<String> = foreign.iter().map(|(a, b)| excerpt(a, b)).collect();
        eprintln!(
            "  {} overlap(s) from the foreign reclaim race:\n{}",
            foreign.len(),
            shown.join("\n")
        );
    }
    foreign.len()
}

fn dir_env() -> Vec<(&'static str, &'static str)> {
    vec![]
}

fn plain_env() -> Vec<(&'static str, &'static str)> {
    vec![(common::PLAIN_ENV, "1")]
}

/// A leasehold child running role `lh`: `rounds` acquisitions, each held
/// `hold_ms`, with a lease of `lease_ms` and a poll interval of `poll_ms`.
fn lh_child(
    strategy: Strategy,
    dir: &Path,
    name: &str,
    log: &Path,
    [rounds, hold_ms, lease_ms, poll_ms]: [u64; 4],
) -> ChildProc {
    let env = if strategy == Strategy::Directory {
        dir_env()
    } else {
        plain_env()
    };
    ChildProc::spawn_env(
        strategy,
        "lh",
        &[
            dir.to_str().unwrap(),
            name,
            log.to_str().unwrap(),
            &rounds.to_string(),
            &hold_ms.to_string(),
            &lease_ms.to_string(),
            &poll_ms.to_string(),
        ],
        &env,
    )
}

fn locker_for(strategy: Strategy, dir: &Path) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .path_style(if strategy == Strategy::Directory {
            PathStyle::Hashed
        } else {
            PathStyle::Plain
        })
        .build()
        .unwrap()
}

/// (5): after everyone ended, `clean` leaves nothing of leasehold's; returns
/// what is left (foreign leftovers are the caller's to judge).
fn clean_and_list(strategy: Strategy, dir: &Path) -> Vec<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let locker = locker_for(strategy, dir);
    rt.block_on(locker.clean(false)).expect("clean");
    drop(locker);
    common::left_after(dir, Duration::from_secs(2))
}

fn lock_path(strategy: Strategy, dir: &Path, name: &str) -> PathBuf {
    locker_for(strategy, dir).lock_path(name).unwrap()
}

/// The `holderId`/`uuid` of whoever holds `name` now, read from disk.
fn holder_id(strategy: Strategy, dir: &Path, name: &str) -> Option<String> {
    let p = lock_path(strategy, dir, name);
    let rec = if strategy == Strategy::Directory {
        p.join("owner.json")
    } else {
        p
    };
    let text = std::fs::read_to_string(rec).ok()?;
    let v: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
    v.get("holderId")
        .or_else(|| v.get("uuid"))
        .and_then(|x| x.as_str())
        .map(str::to_owned)
}

fn show(secs: &[Sec]) -> String {
    let t0 = secs.iter().map(|s| s.start_ns).min().unwrap_or(0);
    secs.iter()
        .map(|s| {
            format!(
                "{}{} [{}..{:?}] {}ms..{}{}",
                s.sys,
                s.pid,
                s.start,
                s.end,
                (s.start_ns - t0) / 1_000_000,
                s.end_ns
                    .map(|e| format!("{}ms", (e - t0) / 1_000_000))
                    .unwrap_or("open".into()),
                if s.lost { " LOST" } else { "" }
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn dirs() -> (tempfile::TempDir, tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let logdir = tempfile::tempdir().unwrap();
    let log = logdir.path().join("log");
    (dir, logdir, log)
}

// ------------------------------------------------------------------ tests

/// velocious's layout. A leasehold holder frozen right after acquiring and
/// mid-hold, for 1.5 s of its 6 s lease, against a velocious and a leasehold
/// waiter: nobody enters until it leaves, and it is not lost.
#[test]
fn velocious_layout_leasehold_holder_frozen_within_its_lease_keeps_it() {
    if !node_ok() {
        return;
    }
    for (at_ms, freeze_ms) in [(0u64, 1500u64), (1000, 1500)] {
        let (dir, _logdir, log) = dirs();
        let holder = lh_child(Strategy::Directory, dir.path(), NAME, &log, [1, 3000, 6000, 20]);
        holder.expect("acquired", Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(at_ms));
        stop(holder.pid());
        let t_stop = Instant::now();
        let mut v = Node::spawn("v", dir.path(), NAME, &log, &["3", "50", "3000", "1000"]);
        let mut w = lh_child(Strategy::Directory, dir.path(), NAME, &log, [3, 50, 3000, 20]);
        std::thread::sleep(Duration::from_millis(freeze_ms).saturating_sub(t_stop.elapsed()));
        cont(holder.pid());
        let mut holder = holder;
        let out = holder.next_line(Duration::from_secs(10));
        assert_eq!(
            out, "released",
            "the frozen holder (at {at_ms} ms, {freeze_ms} ms): {out}"
        );
        lh_ended(w.wait(Duration::from_secs(30)), &log, w.pid());
        foreign_ended(v.wait(Duration::from_secs(30)), &log, v.pid());
        holder.wait(Duration::from_secs(5));
        let secs = sections(&log);
        eprintln!("at {at_ms} freeze {freeze_ms}: {}", show(&secs));
        // Once the frozen holder left, velocious may rob the next holder
        // by its own race (docs/guarantees.md, *Not guaranteed*): it
        // judges the free path stale, then removes whatever is there.
        check_overlaps(&log, &[v.pid()], |s| s.pid == holder.pid(), |_| false);
        assert_eq!(secs.len(), 7);
        assert_eq!(
            secs[0].pid,
            holder.pid(),
            "the frozen holder entered first and left before anyone"
        );
        let left = clean_and_list(Strategy::Directory, dir.path());
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}

/// velocious's layout. A leasehold holder frozen past its lease (1 s, frozen
/// 4 s): docs/guarantees.md item 1 ("as long as no holder is paused past
/// its lease") and docs/format.md rule 6 let it be taken, and velocious's
/// own `isStale` (leaseExpiresAt <= now) takes it too. What must hold: no
/// two unfrozen holders overlap; on SIGCONT the old holder reports the loss
/// and does not disturb its successor (guarantees item 3).
#[test]
fn velocious_layout_leasehold_holder_frozen_past_its_lease() {
    if !node_ok() {
        return;
    }
    let (dir, _logdir, log) = dirs();
    let holder = lh_child(Strategy::Directory, dir.path(), NAME, &log, [1, 2000, 1000, 20]);
    holder.expect("acquired", Duration::from_secs(20));
    stop(holder.pid());
    let t_stop = Instant::now();
    let mut v = Node::spawn("v", dir.path(), NAME, &log, &["1", "2500", "3000", "1000"]);
    let mut w = lh_child(Strategy::Directory, dir.path(), NAME, &log, [1, 2500, 3000, 20]);
    std::thread::sleep(Duration::from_millis(4000).saturating_sub(t_stop.elapsed()));
    let before = holder_id(Strategy::Directory, dir.path(), NAME);
    let secs = sections(&log);
    let taken_ms = secs.iter().find(|s| s.pid != holder.pid()).map(|s| s.start_ns);
    cont(holder.pid());
    let mut holder = holder;
    let out = holder.next_line(Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(300));
    let after = holder_id(Strategy::Directory, dir.path(), NAME);
    lh_ended(w.wait(Duration::from_secs(30)), &log, w.pid());
    foreign_ended(v.wait(Duration::from_secs(30)), &log, v.pid());
    holder.wait(Duration::from_secs(5));
    let secs = sections(&log);
    eprintln!("holder said {out:?}; {}", show(&secs));
    if let Some(t) = taken_ms {
        eprintln!(
            "taken over {} ms after the freeze began",
            (t - secs[0].start_ns) / 1_000_000
        );
    }
    assert!(
        taken_ms.is_some(),
        "nobody took a lock whose lease ran out 3 s ago"
    );
    assert_eq!(
        out, "lost",
        "the holder resumed past its lease must learn it lost the lock"
    );
    // The resumed holder must not disturb its successor's lock (unless
    // velocious's own race already moved the name on meanwhile).
    let raced = check_overlaps(&log, &[v.pid()], |_| false, |s| s.pid == holder.pid()) > 0
        || secs.iter().any(|s| s.pid == w.pid() && s.lost);
    assert!(
        before == after || raced,
        "the resumed holder disturbed its successor's lock"
    );
    let left = clean_and_list(Strategy::Directory, dir.path());
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// velocious's layout. A velocious holder (lease 2 s, renewed every 0.5 s)
/// frozen right after acquiring:
/// - for 1.2 s, then resumed: a leasehold waiter never enters before it leaves;
/// - for 6 s: its lease runs out (velocious's own `isStale` would take it:
///   `leaseExpiresAt <= Date.now()`), leasehold takes it after
///   `leaseExpiresAt + 2 s` (docs/format.md rule 6); once resumed,
///   velocious must not remove leasehold's lock (its release checks
///   `holderId`), and leasehold's holder is not lost;
/// - killed while frozen: taken over "at once" (rule 5: ESRCH), within the
///   waiter's poll interval plus a margin.
#[test]
fn velocious_layout_frozen_velocious_holder() {
    if !node_ok() {
        return;
    }
    // within its lease
    {
        let (dir, _logdir, log) = dirs();
        let mut v = Node::spawn("v", dir.path(), NAME, &log, &["1", "1500", "2000", "500"]);
        v.expect("acquired", Duration::from_secs(20));
        stop(v.pid());
        let t = Instant::now();
        let mut w = lh_child(Strategy::Directory, dir.path(), NAME, &log, [1, 50, 3000, 20]);
        std::thread::sleep(Duration::from_millis(1200).saturating_sub(t.elapsed()));
        cont(v.pid());
        foreign_ended(v.wait(Duration::from_secs(20)), &log, v.pid());
        lh_ended(w.wait(Duration::from_secs(20)), &log, w.pid());
        let secs = sections(&log);
        eprintln!("within: {}", show(&secs));
        check_overlaps(&log, &[v.pid()], |s| s.pid == v.pid(), |_| false);
        let left = clean_and_list(Strategy::Directory, dir.path());
        assert!(left.is_empty(), "left behind: {left:?}");
    }
    // past its lease
    {
        let (dir, _logdir, log) = dirs();
        let mut v = Node::spawn("v", dir.path(), NAME, &log, &["1", "1500", "2000", "500"]);
        v.expect("acquired", Duration::from_secs(20));
        stop(v.pid());
        let t = Instant::now();
        let mut w = lh_child(Strategy::Directory, dir.path(), NAME, &log, [1, 4000, 3000, 20]);
        w.expect("acquired", Duration::from_secs(10));
        let took = t.elapsed();
        let id = holder_id(Strategy::Directory, dir.path(), NAME);
        std::thread::sleep(Duration::from_millis(6000).saturating_sub(t.elapsed()));
        cont(v.pid());
        foreign_ended(v.wait(Duration::from_secs(20)), &log, v.pid());
        std::thread::sleep(Duration::from_millis(300));
        let id_after = holder_id(Strategy::Directory, dir.path(), NAME);
        let out = w.next_line(Duration::from_secs(10));
        w.wait(Duration::from_secs(10));
        let secs = sections(&log);
        eprintln!(
            "past: taken after {took:?}; leasehold then said {out:?}; {}",
            show(&secs)
        );
        assert!(
            took >= Duration::from_millis(2000) && took < Duration::from_millis(6000),
            "taken {took:?} after the freeze (lease 2 s, + 2 s by rule 6)"
        );
        assert_eq!(
            id, id_after,
            "the resumed velocious holder removed or rewrote leasehold's lock"
        );
        assert_eq!(
            out, "released",
            "leasehold's holder lost its lock to the resumed velocious holder"
        );
        let left = clean_and_list(Strategy::Directory, dir.path());
        assert!(left.is_empty(), "left behind: {left:?}");
    }
    // killed while frozen (lease 20 s)
    killed_frozen_foreign_holder_is_taken_at_once(
        Strategy::Directory,
        "v",
        &["1", "30000", "20000", "5000"],
        3000,
    );
}

/// A foreign holder (`which`, run with `args`) frozen, then killed: a
/// leasehold waiter (lease `lease_ms`, polling every 100 ms) that saw it
/// alive takes its lock at once (rule 5), not after its lease.
fn killed_frozen_foreign_holder_is_taken_at_once(
    strategy: Strategy,
    which: &str,
    args: &[&str],
    lease_ms: u64,
) {
    let (dir, _logdir, log) = dirs();
    let name = if strategy == Strategy::Directory {
        NAME
    } else {
        PNAME
    };
    let mut theirs = Node::spawn(which, dir.path(), name, &log, args);
    theirs.expect("acquired", Duration::from_secs(20));
    stop(theirs.pid());
    let mut w = lh_child(strategy, dir.path(), name, &log, [1, 50, lease_ms, 100]);
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(
        sections(&log).len(),
        1,
        "entered while the foreign holder held: {}",
        show(&sections(&log))
    );
    theirs.signal(Signal::SIGKILL);
    let t = Instant::now();
    theirs.wait(Duration::from_secs(5));
    w.expect("acquired", Duration::from_secs(10));
    let took = t.elapsed();
    lh_ended(w.wait(Duration::from_secs(10)), &log, w.pid());
    eprintln!("killed {which} holder taken over in {took:?} (poll 100 ms)");
    // At once (within the poll), not after its lease (velocious's 20 s,
    // pi-research's 120 s): 5 s leaves a loaded machine its slowness.
    assert!(
        took < Duration::from_secs(5),
        "dead {which} holder taken only after {took:?}"
    );
    let left = clean_and_list(strategy, dir.path());
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// pi-research's layout. A pi-research holder frozen right after acquiring
/// and mid-hold for 3 s: leasehold never enters (pid alive, start ticks
/// match, record younger than the 120 s foreign lease). Killed while
/// frozen: taken over within the poll interval plus a margin (rule 5).
#[test]
fn pi_research_layout_frozen_pi_research_holder() {
    if !node_ok() {
        return;
    }
    for at_ms in [0u64, 500] {
        let (dir, _logdir, log) = dirs();
        let mut p = Node::spawn("p", dir.path(), PNAME, &log, &["1", "1000"]);
        p.expect("acquired", Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(at_ms));
        stop(p.pid());
        let t = Instant::now();
        let mut w = lh_child(
            Strategy::ExclusiveFile,
            dir.path(),
            PNAME,
            &log,
            [2, 50, 1000, 20],
        );
        let mut w2 = Node::spawn("p", dir.path(), PNAME, &log, &["2", "50"]);
        std::thread::sleep(Duration::from_millis(3000).saturating_sub(t.elapsed()));
        let during = sections(&log);
        cont(p.pid());
        foreign_ended(p.wait(Duration::from_secs(20)), &log, p.pid());
        lh_ended(w.wait(Duration::from_secs(20)), &log, w.pid());
        foreign_ended(w2.wait(Duration::from_secs(20)), &log, w2.pid());
        let secs = sections(&log);
        eprintln!("at {at_ms}: {}", show(&secs));
        assert_eq!(
            during.len(),
            1,
            "someone entered while pi-research was frozen: {}",
            show(&during)
        );
        // The frozen holder is never excused; after it, pi-research's
        // own trash-rename race may rob the next holder.
        check_overlaps(&log, &[p.pid(), w2.pid()], |s| s.pid == p.pid(), |_| false);
        let left = clean_and_list(Strategy::ExclusiveFile, dir.path());
        assert!(left.is_empty(), "left behind: {left:?}");
    }
    killed_frozen_foreign_holder_is_taken_at_once(Strategy::ExclusiveFile, "p", &["1", "30000"], 1000);
}

/// pi-research's layout. A leasehold holder (lease 1 s) frozen right after
/// acquiring, against pi-research waiters (its own code) and a leasehold
/// waiter:
/// - for 0.5 s: nobody enters, the holder is not lost;
/// - for 4 s (past its lease): pi-research must never take it (a live pid
///   whose start ticks match, a file younger than its 120 s
///   liveOwnerStaleThreshold); leasehold's waiter may (guarantees item 1),
///   and then must never overlap pi-research.
///
/// Killed while frozen: taken over at once (both layouts).
#[test]
fn pi_research_layout_frozen_leasehold_holder() {
    if !node_ok() {
        return;
    }
    for (freeze_ms, with_lh_waiter) in [(500u64, true), (4000, false), (4000, true)] {
        let (dir, _logdir, log) = dirs();
        let holder = lh_child(
            Strategy::ExclusiveFile,
            dir.path(),
            PNAME,
            &log,
            [1, 1500, 1000, 20],
        );
        holder.expect("acquired", Duration::from_secs(20));
        let file = lock_path(Strategy::ExclusiveFile, dir.path(), PNAME);
        let ino = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(&file).unwrap().ino()
        };
        stop(holder.pid());
        let t = Instant::now();
        let mut p = Node::spawn("p", dir.path(), PNAME, &log, &["2", "50"]);
        let mut w = with_lh_waiter.then(|| {
            lh_child(
                Strategy::ExclusiveFile,
                dir.path(),
                PNAME,
                &log,
                [2, 50, 3000, 20],
            )
        });
        std::thread::sleep(Duration::from_millis(freeze_ms).saturating_sub(t.elapsed()));
        let during = sections(&log);
        let ino_now = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(&file).ok().map(|m| m.ino())
        };
        cont(holder.pid());
        let mut holder = holder;
        let out = holder.next_line(Duration::from_secs(10));
        holder.wait(Duration::from_secs(10));
        foreign_ended(p.wait(Duration::from_secs(30)), &log, p.pid());
        if let Some(w) = w.as_mut() {
            lh_ended(w.wait(Duration::from_secs(30)), &log, w.pid());
        }
        let secs = sections(&log);
        eprintln!(
            "freeze {freeze_ms} lh waiter {with_lh_waiter}: holder said {out:?}; {}",
            show(&secs)
        );
        // pi-research never takes the frozen holder's lock itself (a live
        // pid, a young file). Once its lease (1 s) ran out, a leasehold
        // waiter may reclaim it (documented), which frees the path for
        // whoever comes first, pi-research too: so pi-research may enter
        // during the freeze only with a leasehold waiter, and not before
        // the lease ended (less 100 ms for the two systems' clocks).
        let expiry = during[0].start_ns + 1_000_000_000 - 100_000_000;
        let p_early: Vec<_> = during
            .iter()
            .filter(|s| s.sys == "p" && (!with_lh_waiter || s.start_ns < expiry))
            .collect();
        assert!(
            p_early.is_empty(),
            "pi-research entered while a live (frozen) leasehold holder held: {}\nLOG:\n{}",
            show(&during),
            std::fs::read_to_string(&log).unwrap()
        );
        if !with_lh_waiter || freeze_ms < 1000 {
            assert_eq!(during.len(), 1, "{}", show(&during));
            assert_eq!(ino_now, Some(ino), "the frozen holder's lock file was replaced");
        }
        if freeze_ms < 1000 {
            assert_eq!(out, "released");
        }
        // Past its lease the frozen holder loses the lock (item 1); the
        // others may meet pi-research's own race (its trash-rename of
        // whatever is at the path when its look fails).
        check_overlaps(
            &log,
            &[p.pid()],
            |s| freeze_ms < 1000 && s.pid == holder.pid(),
            |s| freeze_ms >= 1000 && s.pid == holder.pid(),
        );
        let left = clean_and_list(Strategy::ExclusiveFile, dir.path());
        assert!(left.is_empty(), "left behind: {left:?}");
    }
    // Killed while frozen (lease 20 s), with a pi-research and a leasehold
    // waiter that both saw it alive: leasehold's waiter takes it at once
    // (guarantees item 4: the flock goes with the process); pi-research's
    // waiter memoizes the owner's liveness per acquire episode
    // (`_resolveOwnerAlive`, keyed by pid:startTime), so it never learns of
    // the death and comes in only once the name is free: its own design.
    for strategy in [
        Strategy::ExclusiveFile,
        Strategy::Directory,
        Strategy::ExclusiveFile,
        Strategy::Directory,
        Strategy::Directory,
        Strategy::Directory,
    ] {
        let (dir, _logdir, log) = dirs();
        let name = if strategy == Strategy::Directory {
            NAME
        } else {
            PNAME
        };
        let holder = lh_child(strategy, dir.path(), name, &log, [1, 30000, 20000, 20]);
        holder.expect("acquired", Duration::from_secs(20));
        stop(holder.pid());
        let mut theirs = if strategy == Strategy::Directory {
            Node::spawn("v", dir.path(), name, &log, &["1", "50", "3000", "1000"])
        } else {
            Node::spawn("p", dir.path(), name, &log, &["1", "50"])
        };
        let mut w = lh_child(strategy, dir.path(), name, &log, [1, 50, 3000, 10_000]);
        std::thread::sleep(Duration::from_millis(800));
        assert_eq!(sections(&log).len(), 1, "{}", show(&sections(&log)));
        let mut holder = holder;
        holder.kill();
        let t = Instant::now();
        holder.wait(Duration::from_secs(5));
        let first = loop {
            let secs = sections(&log);
            if let Some(s) = secs.iter().find(|s| s.pid != holder.pid()) {
                break s.clone();
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "nobody took a dead holder's lock in 10 s"
            );
            std::thread::sleep(Duration::from_millis(2));
        };
        let took = t.elapsed();
        lh_ended(w.wait(Duration::from_secs(10)), &log, w.pid());
        foreign_ended(theirs.wait(Duration::from_secs(20)), &log, theirs.pid());
        let secs = sections(&log);
        eprintln!(
            "{}: killed frozen leasehold holder taken over by {}{} in {took:?} (leasehold waiter's poll 10 s); {}",
            common::layout_label(strategy),
            first.sys,
            first.pid,
            show(&secs)
        );
        // At once (its flock went with it), not after its 20 s lease.
        assert!(took < Duration::from_secs(5), "taken only after {took:?}");
        check_overlaps(&log, &[theirs.pid()], |_| false, |s| s.pid == holder.pid());
        let left = clean_and_list(strategy, dir.path());
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}

/// Both layouts: leasehold and foreign processes loop on the name while the
/// test keeps freezing one of them at random moments (holding, waiting,
/// just after a release) for 0.2–1.0 s, well within every lease (3 s;
/// pi-research has none), then resumes it; at the end one is killed
/// mid-run. No two holders may ever overlap: nobody is frozen past a lease.
#[test]
fn random_freezes_of_holders_and_waiters_of_every_system_never_overlap() {
    if !node_ok() {
        return;
    }
    for strategy in [Strategy::Directory, Strategy::ExclusiveFile] {
        let (dir, _logdir, log) = dirs();
        let name = if strategy == Strategy::Directory {
            NAME
        } else {
            PNAME
        };
        let mut ours: Vec<ChildProc> = (0..2)
            .map(|_| lh_child(strategy, dir.path(), name, &log, [40, 15, 3000, 20]))
            .collect();
        let mut theirs: Vec<Node> = (0..2)
            .map(|_| {
                if strategy == Strategy::Directory {
                    Node::spawn("v", dir.path(), name, &log, &["40", "15", "3000", "1000"])
                } else {
                    Node::spawn("p", dir.path(), name, &log, &["40", "15"])
                }
            })
            .collect();
        let pids: Vec<u32> = ours
            .iter()
            .map(|c| c.pid())
            .chain(theirs.iter().map(|n| n.pid()))
            .collect();
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id());
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut freezes = 0;
        let until = Instant::now() + Duration::from_secs(12);
        while Instant::now() < until {
            let victim = pids[rnd(pids.len() as u64) as usize];
            std::thread::sleep(Duration::from_millis(rnd(150)));
            if kill(Pid::from_raw(victim as i32), None).is_err() {
                continue;
            }
            if kill(Pid::from_raw(victim as i32), Signal::SIGSTOP).is_err() {
                continue;
            }
            freezes += 1;
            std::thread::sleep(Duration::from_millis(200 + rnd(800)));
            cont(victim);
        }
        // One leasehold and one foreign process killed mid-run.
        ours[0].kill();
        theirs[0].signal(Signal::SIGKILL);
        lh_ended(ours[1].wait(Duration::from_secs(60)), &log, ours[1].pid());
        let foreign_exit = theirs[1].wait(Duration::from_secs(60));
        if !foreign_exit.success() {
            // velocious's `fs.rm(lockPath, {recursive: true})` of a lock it
            // judged stale can race a publication or a renewal and throw
            // ENOTEMPTY, uncaught: its own crash, reported, not judged here.
            eprintln!("the surviving foreign process exited {foreign_exit:?}");
        }
        let secs = sections(&log);
        let by = |sys: &str| secs.iter().filter(|s| s.sys == sys).count();
        eprintln!(
            "{}: {freezes} freezes, {} sections (l {}, v {}, p {})",
            common::layout_label(strategy),
            secs.len(),
            by("l"),
            by("v"),
            by("p")
        );
        // The killed ones' last section may stay open: only if they were
        // killed inside (their lock then taken over as a dead holder's).
        let killed = [ours[0].pid(), theirs[0].pid()];
        let foreign_pids: Vec<u32> = theirs.iter().map(|n| n.pid()).collect();
        let foreign = check_overlaps(
            &log,
            &foreign_pids,
            |_| false,
            |s| killed.contains(&s.pid) && s.end.is_none(),
        );
        eprintln!(
            "{}: {foreign} overlap(s) from the foreign system's own reclaim race",
            common::layout_label(strategy),
        );
        drop(ours);
        drop(theirs);
        let left = clean_and_list(strategy, dir.path());
        eprintln!("left after clean: {left:?}");
        let unexplained: Vec<_> = left
            .iter()
            .filter(|n| !n.contains(".pending-") && !n.contains(".trash."))
            .collect();
        assert!(unexplained.is_empty(), "left behind: {left:?}");
    }
}

/// Both layouts: a live leasehold holder (lease 1 s, held 5 s) and
/// waiters of both systems frozen mid-wait (while they poll and judge the
/// holder's record) for 3 s, past every lease, at several moments, then
/// resumed: none enters before the holder leaves, the holder is never lost,
/// and the foreign waiter never removes its lock.
#[test]
fn waiters_of_both_systems_frozen_past_every_lease_never_rob_a_live_holder() {
    if !node_ok() {
        return;
    }
    for strategy in [Strategy::Directory, Strategy::ExclusiveFile] {
        for delay_ms in [0u64, 37, 150] {
            let (dir, _logdir, log) = dirs();
            let name = if strategy == Strategy::Directory {
                NAME
            } else {
                PNAME
            };
            let mut holder = lh_child(strategy, dir.path(), name, &log, [1, 5000, 1000, 20]);
            holder.expect("acquired", Duration::from_secs(20));
            let id = holder_id(strategy, dir.path(), name);
            let mut theirs = if strategy == Strategy::Directory {
                Node::spawn("v", dir.path(), name, &log, &["1", "50", "1000", "300"])
            } else {
                Node::spawn("p", dir.path(), name, &log, &["1", "50"])
            };
            let mut w = lh_child(strategy, dir.path(), name, &log, [1, 50, 1000, 20]);
            // Let them start waiting (node takes ~100 ms to load), then freeze.
            std::thread::sleep(Duration::from_millis(400 + delay_ms));
            stop(theirs.pid());
            stop(w.pid());
            std::thread::sleep(Duration::from_millis(3000));
            let during = sections(&log);
            let id_during = holder_id(strategy, dir.path(), name);
            cont(theirs.pid());
            cont(w.pid());
            let out = holder.next_line(Duration::from_secs(10));
            lh_ended(w.wait(Duration::from_secs(20)), &log, w.pid());
            foreign_ended(theirs.wait(Duration::from_secs(20)), &log, theirs.pid());
            holder.wait(Duration::from_secs(5));
            let secs = sections(&log);
            eprintln!(
                "{} +{delay_ms}: holder said {out:?}; {}",
                common::layout_label(strategy),
                show(&secs)
            );
            assert_eq!(during.len(), 1, "{}", show(&during));
            assert_eq!(id, id_during, "the holder's lock changed hands while it held");
            // The live holder keeps its lock, unless the foreign waiter
            // judged it stale itself (velocious, frozen between reading the
            // record and comparing its lease with the clock, judges a
            // record read before the pause by a clock read after it, then
            // removes the lock: its own race, logged as X); then the
            // overlap that follows is velocious's doing, never leasehold's
            // waiter's alone.
            let ev = events(&log);
            assert!(
                out == "released" || judged(&ev, &[theirs.pid()], 0, usize::MAX),
                "the live holder lost its lock with no foreign judgment: {out}\nLOG:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            check_overlaps(&log, &[theirs.pid()], |_| false, |_| false);
            let left = clean_and_list(strategy, dir.path());
            assert!(left.is_empty(), "left behind: {left:?}");
        }
    }
}
