//! Second attack on `leasehold run` (feature `cli`), Linux only: the
//! watchdog's beats, a tool stopped around CMD's start, the signal mask CMD
//! inherits.
//!
//! Every process started here is bounded (`BOUND`) and killed by pid when
//! its test ends.
#![cfg(all(target_os = "linux", feature = "cli"))]

#[path = "support/cli_attack.rs"]
mod cli_attack;

use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use cli_attack::{BOUND, GroupKill, Proc, await_file, children_named, leasehold};
use nix::sys::signal::{Signal, kill};

/// Waits for a lock file (`<name>-<hash>.lock`) in `dir`.
fn await_lock(dir: &Path) {
    let deadline = Instant::now() + BOUND;
    let has_lock = || {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".lock"))
    };
    while !has_lock() {
        assert!(Instant::now() < deadline, "no lock appeared in {}", dir.display());
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn await_text(path: &Path, text: &str) {
    let deadline = Instant::now() + BOUND;
    while !std::fs::read_to_string(path).is_ok_and(|t| t.contains(text)) {
        assert!(
            Instant::now() < deadline,
            "{text:?} never appeared in {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A pipe whose buffer is full: a blocking write to its write end blocks
/// until the read end is drained.
fn full_pipe() -> (std::io::PipeReader, OwnedFd) {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    use std::io::Write;
    let (read, write) = std::io::pipe().unwrap();
    let write = OwnedFd::from(write);
    fcntl(&write, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
    let mut file = std::fs::File::from(write);
    let chunk = [b'#'; 4096];
    loop {
        match file.write(&chunk) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("fill: {e}"),
        }
    }
    let write = OwnedFd::from(file);
    fcntl(&write, FcntlArg::F_SETFL(OFlag::empty())).unwrap();
    (read, write)
}

/// The tool takes the lock and is stopped (SIGSTOP, a debugger) before it
/// starts CMD: no CMD yet, so no pid for the watchdog, which guards
/// nothing. The lease runs out and another run takes the lock. The tool is
/// continued: its guard knows the lock is lost (`LockGuard::is_lost` is
/// true once the lease is past, renewal thread or not), yet `Held::run`
/// spawns CMD without asking, and only `watch` sees the loss, after CMD
/// was exec'd: CMD starts while the next run holds the lock, and the tool
/// reports the loss as one "while the command ran". SIGTERM follows within
/// microseconds, so CMD rarely gets to act (a command that acts in its
/// first instant, or a loaded machine, would); the exec itself is seen
/// here through inotify (`IN_OPEN` on CMD's script, opened by `execve`).
///
/// The stop is made to land in that window every time: with `--json` the
/// tool writes an `acquired` event to stderr after taking the lock and
/// before spawning CMD, and its stderr is a full pipe, so it waits in that
/// write (renewing the lease meanwhile on its renewal thread) until it is
/// stopped, continued and drained. A SIGSTOP that lands anywhere in the
/// (short) window between acquisition and fork has the same effect.
#[test]
fn a_tool_continued_after_its_lease_ran_out_never_starts_cmd_beside_the_next_holder() {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let log = tmp.path().join("log");
    let cmd = tmp.path().join("cmd.sh");
    std::fs::write(&cmd, format!("#!/bin/sh\necho A >> {}\n", log.display())).unwrap();
    std::fs::set_permissions(&cmd, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (mut stderr_read, stderr_write) = full_pipe();
    let mut tool = leasehold(&[
        "run",
        "job",
        "--dir",
        d,
        "--lease",
        "1s",
        "--json",
        "--",
        cmd.to_str().unwrap(),
    ]);
    tool.stderr(Stdio::from(stderr_write));
    let mut tool = Proc::spawn(tool);
    await_lock(tmp.path());
    // Blocked in its write of `acquired`, with the lock held and renewed.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        children_named(tool.pid(), "cmd.sh").is_empty(),
        "CMD started already: the stderr pipe did not hold the tool"
    );
    kill(tool.pid(), Signal::SIGSTOP).expect("stop the tool");

    let second = format!(
        "echo B-START >> {l}; sleep 2; echo B-END >> {l}",
        l = log.display()
    );
    let mut next = Proc::spawn(leasehold(&[
        "run", "job", "--dir", d, "-w", "25", "--", "sh", "-c", &second,
    ]));
    await_text(&log, "B-START");
    let exec_seen = Inotify::init(InitFlags::IN_NONBLOCK).unwrap();
    exec_seen.add_watch(&cmd, AddWatchFlags::IN_OPEN).unwrap();
    kill(tool.pid(), Signal::SIGCONT).expect("continue the tool");
    // Its renewal thread runs again and finds the lease gone before the
    // tool's main thread is let go.
    std::thread::sleep(Duration::from_millis(300));
    let drain = std::thread::spawn(move || {
        use std::io::Read;
        let mut text = Vec::new();
        let _ = stderr_read.read_to_end(&mut text);
        String::from_utf8_lossy(&text).trim_start_matches('#').to_owned()
    });
    let status = tool.wait();
    let said = drain.join().unwrap();
    let execs = exec_seen.read_events().map_or(0, |events| events.len());
    let text = std::fs::read_to_string(&log).unwrap();
    let during: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "B-START")
        .take_while(|l| *l != "B-END")
        .collect();
    let overlap = during.iter().filter(|l| **l == "A").count();
    let next_status = next.wait();
    assert!(
        next_status.success(),
        "the second run: {next_status:?} {}",
        next.stderr()
    );
    assert_eq!(
        (execs, overlap),
        (0, 0),
        "the continued tool started CMD (execs seen, CMD's writes) after its lease ran out, while \
         the next run held the lock; the tool: {status:?}, it said {said:?}"
    );
}

/// CMD must start with no signal blocked (`main`'s comment: "CMD and the
/// watchdog start with no signal blocked (std clears the mask)"). It
/// starts with SIGTSTP, SIGTTIN and SIGTTOU blocked (`SigBlk:
/// 0000000000380000`), every time, in every mode, with and without `-c`:
/// the tool blocks them in every thread (src/bin/leasehold.rs, `main`) and
/// the child inherits the mask; only SIGPIPE is unblocked by the pre-exec
/// hook (src/bin/leasehold/process.rs, `guard_command`). So Ctrl-Z does
/// not stop CMD (nor any of its descendants), a background CMD that reads
/// the terminal gets EIO instead of stopping, and `stty tostop` no longer
/// holds back a background CMD's output.
#[test]
fn cmd_starts_with_an_empty_signal_mask_and_default_sigpipe() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    for (i, extra) in [&[][..], &["--shared"][..], &["--permits", "2"][..]]
        .iter()
        .enumerate()
    {
        let out = tmp.path().join(format!("status{i}"));
        // `exec`: CMD's own mask, not that of a shell forking a child.
        let script = format!("exec cat /proc/self/status > {}", out.display());
        let mut args = vec!["run", "job", "--dir", d];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["-c", &script]);
        let name = format!("job{i}");
        args[1] = &name;
        let mut tool = Proc::spawn(leasehold(&args));
        let status = tool.wait();
        assert!(status.success(), "{extra:?}: {status:?} {}", tool.stderr());
        let text = std::fs::read_to_string(&out).unwrap();
        let field = |f: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(f))
                .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
                .unwrap()
        };
        assert_eq!(
            field("SigBlk:"),
            0,
            "{extra:?}: CMD starts with signals blocked:\n{text}"
        );
        // SIGPIPE is signal 13: bit 12. The tool ignores it (Rust's
        // runtime); CMD must not.
        assert_eq!(
            field("SigIgn:") & (1 << 12),
            0,
            "{extra:?}: CMD ignores SIGPIPE:\n{text}"
        );
    }
}

/// The shortest lease the library takes (200 ms: a beat every 6.25 ms,
/// each vouching for what the lease has left) and the longest (a year:
/// vouches beyond `poll`'s largest timeout) with a CMD that outlives many
/// leases: the watchdog must not kill a live tool's CMD, nor the tool
/// fail on its beats.
#[test]
fn extreme_leases_never_kill_a_live_tools_command() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    for lease in ["200ms", "365d"] {
        let mut tool = Proc::spawn(leasehold(&[
            "run",
            "job",
            "--dir",
            d,
            "--lease",
            lease,
            "--",
            "sh",
            "-c",
            "sleep 2; exit 7",
        ]));
        let status = tool.wait();
        assert_eq!(
            status.code(),
            Some(7),
            "--lease {lease}: {status:?} {}",
            tool.stderr()
        );
    }
}

/// The tool is stopped while CMD runs, for longer than the lease, then
/// continued: the watchdog has killed CMD's group before the lease ran
/// out (as designed: the last beat vouched for no longer), the lock is
/// lost by then, and the run exits 75, promptly. (Written first against
/// a watchdog that killed after half the lease without a beat, when the
/// run exited 137 with the lease intact; the watchdog now waits for what
/// the tool's last beat vouched for, the lease's end less a margin.)
#[test]
fn a_tool_stopped_past_its_lease_has_cmd_killed_and_exits_75() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let started = tmp.path().join("started");
    // CMD would run on well past the stop: only the watchdog ends it.
    let script = format!("touch {}; sleep 60", started.display());
    let mut tool = Proc::spawn(leasehold(&[
        "run", "job", "--dir", d, "--lease", "4s", "--", "sh", "-c", &script,
    ]));
    await_file(&started);
    let _groups = GroupKill(children_named(tool.pid(), "sh"));
    kill(tool.pid(), Signal::SIGSTOP).expect("stop the tool");
    std::thread::sleep(Duration::from_millis(5000));
    let continued = Instant::now();
    kill(tool.pid(), Signal::SIGCONT).expect("continue the tool");
    let status = tool.wait();
    let stderr = tool.stderr();
    assert_eq!(status.code(), Some(75), "{status:?} {stderr:?}");
    assert!(
        continued.elapsed() < Duration::from_secs(5),
        "the tool lingered after CMD's kill"
    );
}

/// CMD exits at once, leaving a process of its group that runs on for
/// 1.5 s, past a 1 s lease renewed all along; meanwhile the watchdog is
/// stopped and continued every 20 ms (its `poll` interrupted, its clock
/// running while it is stopped). The tool still holds the lock and beats:
/// nothing may be killed, and the run exits 0 once the group is empty.
#[test]
fn beats_go_on_after_cmd_exits_and_through_a_watchdog_stopped_in_bursts() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let done = tmp.path().join("done");
    let script = format!("(sleep 1.5; touch {}) >/dev/null 2>&1 & exit 0", done.display());
    let mut tool = Proc::spawn(leasehold(&[
        "run", "job", "--dir", d, "--lease", "1s", "--", "sh", "-c", &script,
    ]));
    let deadline = Instant::now() + BOUND;
    let watchdog = loop {
        if let [wd] = children_named(tool.pid(), "leasehold-wd")[..] {
            break wd;
        }
        assert!(Instant::now() < deadline, "no watchdog");
        std::thread::sleep(Duration::from_millis(5));
    };
    let until = Instant::now() + Duration::from_millis(1200);
    while Instant::now() < until {
        let _ = kill(watchdog, Signal::SIGSTOP);
        std::thread::sleep(Duration::from_millis(20));
        let _ = kill(watchdog, Signal::SIGCONT);
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = tool.wait();
    assert!(done.exists(), "the group's last process was killed");
    assert!(status.success(), "{status:?} {}", tool.stderr());
}
