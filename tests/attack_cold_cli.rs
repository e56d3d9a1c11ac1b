//! Attacks on `leasehold run` (feature `cli`), Linux only: what happens to
//! CMD when the tool's helpers or the tool itself are interfered with.
//!
//! Every process started here is bounded (`BOUND`) and killed by pid when
//! its test ends.
#![cfg(all(target_os = "linux", feature = "cli"))]

#[path = "support/cli_attack.rs"]
mod cli_attack;

use std::time::{Duration, Instant};

use cli_attack::{BOUND, GroupKill, Proc, await_file, children_named, leasehold};
use nix::sys::signal::{Signal, kill};

/// The watchdog of a `run` that waits for its lock is killed (the OOM
/// killer, an operator's `kill -9`). The documented promise is that CMD
/// never runs unguarded, and that a run that cannot guard CMD exits 2
/// with a message. Before the fix CMD did not run, but the tool reported
/// exit 141 (128 + SIGPIPE) and said nothing: std resets SIGPIPE to
/// SIG_DFL in the child before the `pre_exec` hook runs, so the hook's
/// `write` to the dead watchdog's pipe killed the forked child with
/// SIGPIPE instead of returning EPIPE, and `spawn` took that for a started
/// CMD (the hook now blocks SIGPIPE for its write).
#[test]
fn a_killed_watchdog_makes_the_run_exit_2_not_141() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let go = tmp.path().join("go");
    let started = tmp.path().join("started");
    let ran = tmp.path().join("ran");
    let hold = format!(
        "touch {s}; i=0; while [ ! -e {g} ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done",
        s = started.display(),
        g = go.display()
    );
    let mut holder = Proc::spawn(leasehold(&["run", "job", "--dir", d, "--", "sh", "-c", &hold]));
    await_file(&started);

    let touch = format!("touch {}", ran.display());
    let mut waiter = Proc::spawn(leasehold(&["run", "job", "--dir", d, "--", "sh", "-c", &touch]));
    // Its watchdog is started before the wait for the lock.
    let deadline = Instant::now() + BOUND;
    let watchdog = loop {
        if let [wd] = children_named(waiter.pid(), "leasehold-wd")[..] {
            break wd;
        }
        assert!(Instant::now() < deadline, "no watchdog under the waiting run");
        std::thread::sleep(Duration::from_millis(20));
    };
    kill(watchdog, Signal::SIGKILL).expect("kill the watchdog");
    std::thread::sleep(Duration::from_millis(200));
    std::fs::write(&go, b"").unwrap();
    assert!(holder.wait().success());

    let status = waiter.wait();
    let stderr = waiter.stderr();
    assert!(!ran.exists(), "CMD ran without its watchdog");
    assert_eq!(
        status.code(),
        Some(2),
        "a run that cannot guard CMD must exit 2 with a message; got {status:?}, stderr {stderr:?}"
    );
}

/// `run` is stopped (SIGSTOP: a debugger, `kill -STOP`, a job-control stop
/// of the tool's own group without a terminal): it no longer renews the
/// lease, and once the lease is out another `run` takes the lock. Before
/// the fix the first run's CMD, in a process group of its own, kept
/// running: two CMDs at once under one exclusive lock, until the tool was
/// continued. Now the watchdog, which hears no beat from the stopped tool
/// past what its last beat vouched for, kills CMD's group before the lease
/// runs out.
#[test]
fn a_stopped_tools_command_never_runs_alongside_the_next_holder() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let log = tmp.path().join("log");
    let started = tmp.path().join("started");
    // Beats "A" into the log every 50 ms, for at most 30 s.
    let first = format!(
        "echo \"pgid $$\" >&2; touch {s}; i=0; while [ $i -lt 600 ]; do echo A >> {l}; sleep 0.05; i=$((i+1)); done",
        s = started.display(),
        l = log.display()
    );
    let mut tool = Proc::spawn(leasehold(&[
        "run", "job", "--dir", d, "--lease", "2s", "--", "sh", "-c", &first,
    ]));
    await_file(&started);
    // CMD is the leader of its own group: its pid is the group's id.
    let cmd = children_named(tool.pid(), "sh");
    let _group = GroupKill(cmd.first().copied().into_iter().collect());
    kill(tool.pid(), Signal::SIGSTOP).expect("stop the tool");

    let second = format!(
        "echo B-START >> {l}; sleep 1; echo B-END >> {l}",
        l = log.display()
    );
    let mut next = Proc::spawn(leasehold(&[
        "run", "job", "--dir", d, "-w", "25", "--", "sh", "-c", &second,
    ]));
    let status = next.wait();
    kill(tool.pid(), Signal::SIGCONT).expect("continue the tool");
    let _ = tool.wait();
    assert!(status.success(), "the second run: {status:?} {}", next.stderr());

    let text = std::fs::read_to_string(&log).unwrap();
    let during: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "B-START")
        .take_while(|l| *l != "B-END")
        .collect();
    let overlap = during.iter().filter(|l| **l == "A").count();
    assert_eq!(
        overlap, 0,
        "the stopped tool's CMD wrote {overlap} times while the next run held the lock"
    );
}

/// How soon a stopped tool's CMD dies: by what the tool's last beat
/// vouched for, the lease's end by the tool's last look at it, less a
/// margin (a sixteenth of the lease here), whether or not renewals were
/// failing when the tool stopped. A 4 s lease, renewed at most a third of
/// it before the stop: CMD's writes stop before the lease's end, within
/// 4 s of the stop; without the beats, CMD ran for all of the tool's stop
/// (5 s here).
#[test]
fn a_stopped_tools_command_dies_before_its_lease_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let log = tmp.path().join("log");
    let started = tmp.path().join("started");
    // Appends the time (ns since the epoch) every 20 ms, for at most 30 s.
    let first = format!(
        "touch {s}; i=0; while [ $i -lt 1500 ]; do date +%s%N >> {l}; sleep 0.02; i=$((i+1)); done",
        s = started.display(),
        l = log.display()
    );
    let mut tool = Proc::spawn(leasehold(&[
        "run", "job", "--dir", d, "--lease", "4s", "--", "sh", "-c", &first,
    ]));
    await_file(&started);
    let cmd = children_named(tool.pid(), "sh");
    let _group = GroupKill(cmd.first().copied().into_iter().collect());
    std::thread::sleep(Duration::from_millis(300));
    let stopped_at = std::time::SystemTime::now();
    kill(tool.pid(), Signal::SIGSTOP).expect("stop the tool");
    // Past the lease.
    std::thread::sleep(Duration::from_millis(5000));
    kill(tool.pid(), Signal::SIGCONT).expect("continue the tool");
    let _ = tool.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    let last: u128 = text
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .max()
        .expect("CMD wrote the time");
    let stop: u128 = stopped_at
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let after = Duration::from_nanos(u64::try_from(last.saturating_sub(stop)).unwrap());
    assert!(
        after < Duration::from_millis(4000),
        "CMD wrote {after:?} after its tool was stopped, on a 4 s lease"
    );
}

/// CMD exits at once leaving a grandchild in its group (reparented to the
/// tool, its subreaper); the tool is then SIGKILLed. The watchdog must
/// kill the grandchild, and the next run must get the lock at once.
#[test]
fn a_killed_tool_takes_an_orphaned_grandchild_with_it() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let beat = tmp.path().join("beat");
    let script = format!(
        "(i=0; while [ $i -lt 600 ]; do echo . >> {b}; sleep 0.05; i=$((i+1)); done) >/dev/null 2>&1 & exit 0",
        b = beat.display()
    );
    let mut tool = Proc::spawn(leasehold(&["run", "job", "--dir", d, "--", "sh", "-c", &script]));
    await_file(&beat);
    // The orphan is the tool's child now (subreaper).
    std::thread::sleep(Duration::from_millis(300));
    kill(tool.pid(), Signal::SIGKILL).unwrap();
    let _ = tool.wait();
    // Silence: the beat file stops growing within a few seconds.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = std::fs::metadata(&beat).unwrap().len();
    let mut quiet_since = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = std::fs::metadata(&beat).unwrap().len();
        if now != last {
            last = now;
            quiet_since = Instant::now();
        } else if quiet_since.elapsed() > Duration::from_secs(1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the grandchild outlived the killed tool"
        );
    }
    let mut next = Proc::spawn(leasehold(&["run", "job", "--dir", d, "-n", "--", "true"]));
    let status = next.wait();
    assert!(status.success(), "the next run: {status:?} {}", next.stderr());
}

/// `leasehold run NAME -- producer | pager`, typed at an interactive shell:
/// the tool and the pager are one job, the terminal's foreground process
/// group, and the tool hands the terminal to CMD's group. The pager's read
/// of a key from the terminal then gets SIGTTIN, which the kernel sends to
/// the pager's whole group, the tool included; Ctrl-Z sends SIGTSTP to the
/// group that has the terminal. A stopped tool renews no lease (and its
/// watchdog then kills CMD's group): the tool must not stop. Sent here to
/// the tool directly; it keeps running, CMD finishes, the run succeeds.
#[test]
fn terminal_stop_signals_do_not_stop_the_tool() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let started = tmp.path().join("started");
    let script = format!("touch {}; sleep 1", started.display());
    let mut tool = Proc::spawn(leasehold(&["run", "job", "--dir", d, "--", "sh", "-c", &script]));
    await_file(&started);
    for sig in [Signal::SIGTTIN, Signal::SIGTSTP] {
        kill(tool.pid(), sig).expect("signal the tool");
    }
    std::thread::sleep(Duration::from_millis(200));
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", tool.pid())).unwrap();
    let state = stat.rsplit_once(") ").map(|(_, rest)| &rest[..1]);
    assert_ne!(state, Some("T"), "the tool stopped: {stat}");
    let status = tool.wait();
    assert!(status.success(), "{status:?} {}", tool.stderr());
}
