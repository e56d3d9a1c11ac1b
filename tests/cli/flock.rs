//! `leasehold run` as a drop-in for util-linux flock(1): each scenario runs
//! with `flock` and with `leasehold run` given the same arguments, and
//! asserts the same observable behaviour; then the flags one by one.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use super::{BOUND, Done, KillOnDrop, Proc, await_exit, command_pid, exited, finish, finish_cmd, leasehold};

const FLOCK: &str = "/usr/bin/flock";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tool {
    Flock,
    Leasehold,
}

impl Tool {
    /// `flock ARGS...` or `leasehold run ARGS...`: the same arguments.
    fn cmd(self, args: &[&str]) -> Command {
        match self {
            Tool::Flock => {
                let mut cmd = Command::new(FLOCK);
                cmd.args(args).stdin(Stdio::null());
                cmd
            }
            Tool::Leasehold => {
                let mut all = vec!["run"];
                all.extend_from_slice(args);
                leasehold(&all)
            }
        }
    }

    fn finish(self, args: &[&str]) -> Done {
        finish_cmd(self.cmd(args))
    }

    /// A run of `path` (with `options`) whose command prints `started`
    /// and holds the lock until `dir/go` appears (or a minute passes).
    fn holding(self, options: &[&str], path: &str, dir: &str) -> Proc {
        let script =
            "echo started; i=0; while [ ! -e \"$1/go\" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done";
        let mut args = options.to_vec();
        args.extend_from_slice(&[path, "sh", "-c", script, "sh", dir]);
        let p = Proc::spawn(self.cmd(&args));
        p.expect_line("started");
        p
    }
}

/// `leasehold ARGS` with its stderr merged into the stdout that [`Proc`]
/// reads line by line, so a test can act on what it says as it says it.
fn merged(args: &[&str]) -> Proc {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "exec \"$0\" \"$@\" 2>&1", env!("CARGO_BIN_EXE_leasehold")])
        .args(args)
        .env_remove("LEASEHOLD_DIR")
        .stdin(Stdio::null());
    Proc::spawn(cmd)
}

/// The lines `p` prints up to the first that contains `needle`, included;
/// panics after [`BOUND`].
fn lines_until(p: &Proc, needle: &str) -> Vec<String> {
    let deadline = Instant::now() + BOUND;
    let mut lines = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match p.lines.recv_timeout(left) {
            Ok(line) => {
                let found = line.contains(needle);
                lines.push(line);
                if found {
                    return lines;
                }
            }
            Err(e) => panic!("no line with {needle:?} ({e}): {lines:?}"),
        }
    }
}

/// Waits for `p` to exit, and returns its status and the lines it printed
/// that were not read yet.
fn rest(p: &mut Proc) -> (std::process::ExitStatus, Vec<String>) {
    let status = p.wait();
    let mut lines = Vec::new();
    while let Ok(line) = p.lines.recv_timeout(BOUND) {
        lines.push(line);
    }
    (status, lines)
}

/// Both tools, or leasehold alone where flock(1) is not installed.
fn tools() -> Vec<Tool> {
    if Path::new(FLOCK).exists() {
        vec![Tool::Flock, Tool::Leasehold]
    } else {
        eprintln!("{FLOCK} not found: checking leasehold alone");
        vec![Tool::Leasehold]
    }
}

/// A fresh directory, and the path of `backup.lock` in it.
fn scratch() -> (tempfile::TempDir, String, String) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap().to_owned();
    let path = format!("{dir}/backup.lock");
    (tmp, dir, path)
}

fn release(dir: &str, holder: &mut Proc) {
    std::fs::write(Path::new(dir).join("go"), "").unwrap();
    assert_eq!(holder.wait().code(), Some(0));
    std::fs::remove_file(Path::new(dir).join("go")).unwrap();
}

fn assert_silent(done: &Done, what: &str) {
    assert_eq!(done.stdout, "", "{what}: stdout");
    assert_eq!(done.stderr, "", "{what}: stderr");
}

#[test]
fn a_held_lock_with_n_is_silent_and_exits_with_the_conflict_status_as_flock() {
    for tool in tools() {
        let (_tmp, dir, path) = scratch();
        let mut holder = tool.holding(&[], &path, &dir);
        let busy = tool.finish(&["-n", &path, "true"]);
        assert_eq!(busy.code, Some(1), "{tool:?}: {}", busy.stderr);
        assert_silent(&busy, &format!("{tool:?} -n"));
        let busy = tool.finish(&["-n", "-E", "7", &path, "true"]);
        assert_eq!(busy.code, Some(7), "{tool:?}: {}", busy.stderr);
        assert_silent(&busy, &format!("{tool:?} -n -E 7"));
        let long = tool.finish(&["--nonblock", "--conflict-exit-code", "0", &path, "true"]);
        assert_eq!(long.code, Some(0), "{tool:?}: {}", long.stderr);
        // -n with -w (a crontab's `flock -n -w 10`): -n wins, at once.
        for both in [&["-n", "-w", "10"][..], &["-w", "10", "-n"]] {
            let mut args = both.to_vec();
            args.extend_from_slice(&[&path, "true"]);
            let started = Instant::now();
            let busy = tool.finish(&args);
            assert_eq!(busy.code, Some(1), "{tool:?} {both:?}: {}", busy.stderr);
            assert_silent(&busy, &format!("{tool:?} {both:?}"));
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{tool:?} {both:?} waited"
            );
        }
        release(&dir, &mut holder);
        // Free again, and quiet on success too.
        let free = tool.finish(&["-n", &path, "true"]);
        assert_eq!(free.code, Some(0), "{tool:?}: {}", free.stderr);
        assert_silent(&free, &format!("{tool:?} free"));
    }
}

#[test]
fn w_gives_up_after_its_timeout_silently_as_flock() {
    for tool in tools() {
        let (_tmp, dir, path) = scratch();
        let mut holder = tool.holding(&[], &path, &dir);
        for (args, code) in [
            (&["-w", "0.3"][..], 1),
            (&["--timeout", "0.3", "-E", "9"], 9),
            (&["-w", "0"], 1),
        ] {
            let mut all = args.to_vec();
            all.extend_from_slice(&[&path, "touch", "ran"]);
            let started = Instant::now();
            let done = tool.finish(&all);
            let took = started.elapsed();
            assert_eq!(done.code, Some(code), "{tool:?} {args:?}: {}", done.stderr);
            assert_silent(&done, &format!("{tool:?} {args:?}"));
            if args[1] != "0" {
                assert!(
                    took >= Duration::from_millis(300),
                    "{tool:?} {args:?} gave up after {took:?}"
                );
            }
            assert!(took < BOUND, "{tool:?} {args:?} took {took:?}");
            assert!(!Path::new("ran").exists(), "the command ran");
        }
        // A waiter within its timeout gets the lock once it is released.
        let mut waiter = Proc::spawn(tool.cmd(&["-w", "20", &path, "echo", "second"]));
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            waiter.running(),
            "{tool:?}: the waiter ran while the lock was held"
        );
        std::fs::write(Path::new(&dir).join("go"), "").unwrap();
        assert_eq!(holder.wait().code(), Some(0));
        waiter.expect_line("second");
        assert_eq!(waiter.wait().code(), Some(0));
    }
}

#[test]
fn the_commands_exit_status_passes_through_as_flock() {
    for tool in tools() {
        let (_tmp, dir, path) = scratch();
        let done = tool.finish(&[&path, "sh", "-c", "echo out; exit 5"]);
        assert_eq!(done.code, Some(5), "{tool:?}: {}", done.stderr);
        assert_eq!(done.stdout, "out\n", "{tool:?}");
        assert_eq!(done.stderr, "", "{tool:?}");
        let killed = tool.finish(&[&path, "sh", "-c", "kill -9 $$"]);
        assert_eq!(killed.code, Some(128 + 9), "{tool:?}: {}", killed.stderr);
        // flock(1) says 69 (EX_UNAVAILABLE) for both; leasehold says
        // what a shell says.
        let missing = tool.finish(&[&path, "/nonexistent/command"]);
        let script = format!("{dir}/not-executable");
        std::fs::write(&script, "#!/bin/sh\necho ran\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
        let not_executable = tool.finish(&[&path, &script]);
        let expected = match tool {
            Tool::Flock => (69, 69),
            Tool::Leasehold => (127, 126),
        };
        assert_eq!(
            (missing.code, not_executable.code),
            (Some(expected.0), Some(expected.1)),
            "{tool:?}: {} / {}",
            missing.stderr,
            not_executable.stderr
        );
    }
}

#[test]
fn c_runs_a_command_string_through_the_shell_as_flock() {
    for tool in tools() {
        let (_tmp, _dir, path) = scratch();
        let done = tool.finish(&[&path, "-c", "echo one; echo two; exit 4"]);
        assert_eq!(done.code, Some(4), "{tool:?}: {}", done.stderr);
        assert_eq!(done.stdout, "one\ntwo\n", "{tool:?}");
        let done = tool.finish(&[&path, "--command", "test -e \"$0\" || exit 3", "x"]);
        let usage = if tool == Tool::Flock { 64 } else { 2 };
        assert_eq!(
            done.code,
            Some(usage),
            "{tool:?}: -c takes one string: {}",
            done.stderr
        );
    }
    // leasehold also takes -c before the lock, and with a name.
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let done = finish(&["run", "-c", "echo \"$LEASEHOLD_NAME\"; exit 3", "--dir", d, "job"]);
    assert_eq!(done.code, Some(3), "{}", done.stderr);
    assert_eq!(done.stdout, "job\n");
}

#[test]
fn shared_runs_overlap_and_exclude_a_writer_as_flock() {
    for tool in tools() {
        let (_tmp, dir, path) = scratch();
        // Each reader succeeds only once it sees the other's marker: both
        // exit 0 only if they held the lock at the same time.
        let script = "touch \"$1/$2\"; i=0; while [ ! -e \"$1/$3\" ]; do \
                      [ $i -ge 300 ] && exit 9; sleep 0.1; i=$((i+1)); done; echo saw-$3";
        let reader = |flag: &str, me: &str, other: &str| {
            Proc::spawn(tool.cmd(&[flag, &path, "sh", "-c", script, "sh", &dir, me, other]))
        };
        let mut a = reader("-s", "a", "b");
        let mut b = reader("--shared", "b", "a");
        a.expect_line("saw-b");
        b.expect_line("saw-a");
        assert_eq!(a.wait().code(), Some(0), "{tool:?}");
        assert_eq!(b.wait().code(), Some(0), "{tool:?}");

        // A reader holds: a writer is kept out, another reader joins.
        let mut reader = tool.holding(&["-s"], &path, &dir);
        let writer = tool.finish(&["-n", &path, "true"]);
        assert_eq!(writer.code, Some(1), "{tool:?}: {}", writer.stderr);
        let writer = tool.finish(&["-n", "-x", &path, "true"]);
        assert_eq!(writer.code, Some(1), "{tool:?}: {}", writer.stderr);
        // The last of -s and -x wins.
        let writer = tool.finish(&["-n", "-s", "-x", &path, "true"]);
        assert_eq!(
            writer.code,
            Some(1),
            "{tool:?}: -s -x is exclusive: {}",
            writer.stderr
        );
        let joined = tool.finish(&["-n", "-x", "-s", &path, "true"]);
        assert_eq!(
            joined.code,
            Some(0),
            "{tool:?}: -x -s is shared: {}",
            joined.stderr
        );
        release(&dir, &mut reader);

        // A writer holds: readers are kept out.
        let mut writer = tool.holding(&["-x"], &path, &dir);
        let reader = tool.finish(&["-n", "-s", &path, "true"]);
        assert_eq!(reader.code, Some(1), "{tool:?}: {}", reader.stderr);
        release(&dir, &mut writer);
    }
}

#[test]
fn a_killed_wrapper_never_leaves_its_command_running_without_the_lock_as_flock() {
    for tool in tools() {
        let (_tmp, _dir, path) = scratch();
        let script = "echo \"pid $$\"; echo started; while :; do sleep 0.1 >/dev/null; done";
        let mut wrapper = Proc::spawn(tool.cmd(&[&path, "sh", "-c", script]));
        let pid = command_pid(&wrapper);
        let cmd = KillOnDrop(pid);
        wrapper.expect_line("started");
        wrapper.signal(Signal::SIGKILL);
        assert_eq!(wrapper.wait().signal_code(), Some(9), "{tool:?}");
        match tool {
            // The command inherited the lock's descriptor: it keeps the
            // lock, and keeps running, until it dies.
            Tool::Flock => {
                std::thread::sleep(Duration::from_millis(500));
                assert!(!exited(pid), "flock's command died with flock");
                let busy = tool.finish(&["-n", &path, "true"]);
                assert_eq!(busy.code, Some(1), "flock: the command holds the lock");
                kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
            }
            // The watchdog kills the command's group.
            Tool::Leasehold => await_exit(pid, Duration::from_secs(5), "the command"),
        }
        await_exit(pid, Duration::from_secs(5), "the command");
        std::mem::forget(cmd);
        // Whichever way, the lock is free once the command is gone (its
        // short sleeps may hold flock's descriptor a moment longer).
        let deadline = Instant::now() + BOUND;
        loop {
            let done = tool.finish(&["-n", &path, "true"]);
            if done.code == Some(0) {
                break;
            }
            assert_eq!(done.code, Some(1), "{tool:?}: {}", done.stderr);
            assert!(Instant::now() < deadline, "{tool:?}: the lock stayed held");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

trait SignalCode {
    fn signal_code(&self) -> Option<i32>;
}

impl SignalCode for std::process::ExitStatus {
    fn signal_code(&self) -> Option<i32> {
        std::os::unix::process::ExitStatusExt::signal(self)
    }
}

#[test]
fn a_path_locks_exactly_that_file_which_flock_sees_held() {
    let (_tmp, dir, path) = scratch();
    let mut holder = Tool::Leasehold.holding(&[], &path, &dir);
    assert!(Path::new(&path).is_file(), "the lock file is at the path given");
    if Path::new(FLOCK).exists() {
        let flock = Tool::Flock.finish(&["-n", &path, "true"]);
        assert_eq!(
            flock.code,
            Some(1),
            "flock(1) sees leasehold's lock: {}",
            flock.stderr
        );
    }
    let held = finish(&["holder", &path, "--json"]);
    assert_eq!(held.code, Some(0), "{}", held.stderr);
    let doc = held.json();
    assert_eq!(
        doc["path"],
        Path::new(&path).canonicalize().unwrap().to_str().unwrap(),
        "{doc}"
    );
    assert_eq!(doc["pid"], u64::from(holder.pid()), "{doc}");
    assert_eq!(doc["name"], path.as_str(), "{doc}");
    // A bare word is still a name in the lock directory, not this file.
    let other = finish(&["run", "-n", "--dir", &dir, "backup.lock", "true"]);
    assert_eq!(other.code, Some(0), "{}", other.stderr);
    release(&dir, &mut holder);
    assert!(!Path::new(&path).exists(), "removed with the lock");
    let free = finish(&["holder", &path]);
    assert_eq!(free.code, Some(1), "{}", free.stderr);

    // Any file name, not only *.lock; and --file for a path without '/',
    // relative to the working directory; LEASEHOLD_NAME is the path given.
    for (args, shown) in [
        (
            vec!["run", &format!("{dir}/cron-job")][..].to_vec(),
            format!("{dir}/cron-job"),
        ),
        (vec!["run", "--file", "here.lck", "--"], "here.lck".to_owned()),
    ] {
        let mut all = args.clone();
        all.extend_from_slice(&["sh", "-c", "ls; echo \"$LEASEHOLD_NAME\""]);
        let mut cmd = leasehold(&all);
        cmd.current_dir(&dir);
        let done = finish_cmd(cmd);
        assert_eq!(done.code, Some(0), "{args:?}: {}", done.stderr);
        let file = Path::new(&shown).file_name().unwrap().to_str().unwrap();
        assert!(
            done.stdout.lines().any(|l| l == file),
            "{args:?}: held while it ran: {}",
            done.stdout
        );
        assert!(done.stdout.ends_with(&format!("{shown}\n")), "{}", done.stdout);
        assert!(!Path::new(&dir).join(file).exists(), "{args:?}: removed after");
    }
}

#[test]
fn a_crontab_switched_from_flock_takes_over_its_lock_file() {
    if !Path::new(FLOCK).exists() {
        eprintln!("{FLOCK} not found");
        return;
    }
    let (_tmp, dir, path) = scratch();
    // flock(1) holds it: leasehold waits, as another flock(1) would.
    let mut holder = Tool::Flock.holding(&[], &path, &dir);
    let busy = Tool::Leasehold.finish(&["-n", &path, "true"]);
    assert_eq!(busy.code, Some(1), "{}", busy.stderr);
    let mut waiter = Proc::spawn(Tool::Leasehold.cmd(&["-w", "20", &path, "echo", "got-it"]));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(waiter.running(), "ran while flock(1) held the file");
    release(&dir, &mut holder);
    waiter.expect_line("got-it");
    assert_eq!(waiter.wait().code(), Some(0));

    // The empty file the last flock(1) run left behind is no lock.
    assert_eq!(Tool::Flock.finish(&[&path, "true"]).code, Some(0));
    assert!(Path::new(&path).is_file(), "flock(1) leaves its file");
    std::thread::sleep(Duration::from_millis(1200));
    let done = Tool::Leasehold.finish(&["-n", &path, "true"]);
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    assert_silent(&done, "taking over flock's file");
}

#[test]
fn file_takes_a_command_of_one_word() {
    // The usage says `--file PATH (-- CMD [ARGS]... | -c STRING)`: a CMD
    // of one word is the commonest case.
    let tmp = tempfile::tempdir().unwrap();
    for args in [
        &["run", "--file", "job.lck", "--", "pwd"][..],
        &["run", "-n", "--file", "job.lck", "--", "pwd"],
        &["run", "--file", "job.lck", "pwd"],
    ] {
        let mut cmd = leasehold(args);
        cmd.current_dir(tmp.path());
        let done = finish_cmd(cmd);
        assert_eq!(done.code, Some(0), "{args:?}: {}", done.stderr);
        assert!(!done.stdout.is_empty(), "{args:?}: pwd did not run");
    }
    // No command at all is still a usage error.
    let mut cmd = leasehold(&["run", "--file", "job.lck"]);
    cmd.current_dir(tmp.path());
    let done = finish_cmd(cmd);
    assert_eq!(done.code, Some(2), "{}", done.stderr);
    assert!(!done.stderr.is_empty());
    assert!(!done.stderr.contains("panicked"), "{}", done.stderr);
}

#[test]
fn a_path_in_a_missing_directory_is_an_error_and_creates_nothing() {
    let (tmp, dir, _) = scratch();
    let missing = format!("{dir}/nope/backup.lock");
    for args in [
        &["run", &missing, "touch", "ran"][..],
        &["run", "-n", &missing, "-c", "touch ran"],
        &["holder", &missing],
    ] {
        let mut cmd = leasehold(args);
        cmd.current_dir(&dir);
        let done = finish_cmd(cmd);
        assert_eq!(done.code, Some(66), "{args:?}: {}", done.stderr);
        assert!(done.stderr.contains("does not exist"), "{}", done.stderr);
        assert_eq!(done.stderr.lines().count(), 1, "{}", done.stderr);
    }
    assert!(!tmp.path().join("nope").exists(), "created the directory");
    assert!(!tmp.path().join("ran").exists(), "ran the command");
    if Path::new(FLOCK).exists() {
        assert_eq!(Tool::Flock.finish(&[&missing, "true"]).code, Some(66), "as flock");
    }
}

#[test]
fn a_path_under_a_file_exits_66_as_flock() {
    // flock(1): "cannot open lock file ...: Not a directory", status 66.
    let (tmp, dir, _) = scratch();
    std::fs::write(tmp.path().join("notes.txt"), "keep").unwrap();
    let under = format!("{dir}/notes.txt/backup.lock");
    for args in [
        &["run", &under, "touch", "ran"][..],
        &["run", "-n", &under, "-c", "touch ran"],
        &["holder", &under],
    ] {
        let mut cmd = leasehold(args);
        cmd.current_dir(&dir);
        let done = finish_cmd(cmd);
        assert_eq!(done.code, Some(66), "{args:?}: {}", done.stderr);
        assert!(done.stderr.contains("not a directory"), "{}", done.stderr);
        assert_eq!(done.stderr.lines().count(), 1, "{}", done.stderr);
    }
    assert!(!tmp.path().join("ran").exists(), "ran the command");
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("notes.txt")).unwrap(),
        "keep"
    );
    if Path::new(FLOCK).exists() {
        assert_eq!(Tool::Flock.finish(&[&under, "true"]).code, Some(66), "as flock");
    }
}

#[test]
fn a_symlink_at_the_path_is_never_followed() {
    let (tmp, dir, path) = scratch();
    let target = tmp.path().join("precious");
    std::fs::write(&target, "keep me").unwrap();
    std::os::unix::fs::symlink(&target, &path).unwrap();
    let ran = format!("{dir}/ran");
    for args in [
        &["run", &path, "touch", &ran][..],
        &["run", "-n", &path, "touch", &ran],
    ] {
        let done = finish(args);
        assert_eq!(done.code, Some(2), "{args:?}: {}", done.stderr);
        assert!(done.stderr.contains("symlink"), "{args:?}: {}", done.stderr);
        assert!(!Path::new(&ran).exists(), "{args:?}: the command ran");
    }
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    assert!(
        std::fs::symlink_metadata(&path).unwrap().is_symlink(),
        "left in place"
    );
}

#[test]
fn a_path_to_a_file_or_directory_that_is_no_lock_is_refused_and_kept() {
    let (tmp, dir, _) = scratch();
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    let notes = tmp.path().join("notes.txt");
    std::fs::write(&notes, "precious data\n").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&notes)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let docs = tmp.path().join("docs");
    std::fs::create_dir(&docs).unwrap();
    std::fs::write(docs.join("a.txt"), "a").unwrap();
    let ran = format!("{dir}/ran");
    let (n, d) = (notes.to_str().unwrap(), docs.to_str().unwrap());
    for args in [
        &["run", n, "touch", &ran][..],
        &["run", "-n", n, "touch", &ran],
        &["run", "-s", n, "touch", &ran],
        &["run", "--strategy", "dir", n, "touch", &ran],
        &["run", "--strategy", "dir", d, "touch", &ran],
        &["run", d, "touch", &ran],
    ] {
        let done = finish(args);
        assert_eq!(done.code, Some(2), "{args:?}: {}", done.stderr);
        assert!(!Path::new(&ran).exists(), "{args:?}: the command ran");
        assert_eq!(
            std::fs::read_to_string(&notes).unwrap(),
            "precious data\n",
            "{args:?}"
        );
        assert_eq!(
            std::fs::read_to_string(docs.join("a.txt")).unwrap(),
            "a",
            "{args:?}"
        );
    }
    let done = finish(&["run", n, "true"]);
    assert!(done.stderr.contains("not a lock"), "{}", done.stderr);
}

#[test]
fn a_file_of_data_that_flock_holds_is_refused_too_and_never_deleted() {
    if !Path::new(FLOCK).exists() {
        eprintln!("{FLOCK} not found");
        return;
    }
    // flock(1)'s own man page locks the script itself (`flock -en "$0"`):
    // a file of data that flock(1) holds. Once flock(1) lets it go,
    // leasehold must not take it for a stale lock and remove it.
    let (tmp, dir, _) = scratch();
    let script = tmp.path().join("backup.sh");
    std::fs::write(&script, "#!/bin/sh\necho backing up\n").unwrap();
    let s = script.to_str().unwrap();
    let ran = format!("{dir}/ran");
    let mut holder = Tool::Flock.holding(&[], s, &dir);
    for args in [
        &["run", "-w", "20", s, "touch", &ran][..],
        &["run", "-n", s, "touch", &ran],
    ] {
        let mut waiter = Proc::spawn(leasehold(args));
        std::thread::sleep(Duration::from_millis(300));
        if waiter.running() {
            std::fs::write(Path::new(&dir).join("go"), "").unwrap();
        }
        let status = waiter.wait();
        let _ = std::fs::remove_file(Path::new(&dir).join("go"));
        assert_eq!(status.code(), Some(2), "{args:?}");
        assert!(!Path::new(&ran).exists(), "{args:?}: the command ran");
        assert_eq!(
            std::fs::read_to_string(&script).unwrap_or_default(),
            "#!/bin/sh\necho backing up\n",
            "{args:?}: the script was removed or changed"
        );
        if holder.running() {
            continue;
        }
        holder = Tool::Flock.holding(&[], s, &dir);
    }
    release(&dir, &mut holder);
}

#[test]
fn a_directory_with_an_owner_json_of_its_own_is_no_lock_and_is_kept() {
    // --strategy dir: a project directory that happens to hold an
    // owner.json (and more) is no lock directory; reclaimed as a stale
    // lock it would be removed with everything in it.
    let tmp = tempfile::tempdir().unwrap();
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    let ran = tmp.path().join("ran");
    for (owner, other) in [
        (r#"{"name":"my app","version":"1.0"}"#, Some("main.c")),
        (r#"{"name":"my app","version":"1.0"}"#, None),
        (r#"{"pid":1,"uuid":"x"}"#, Some("main.c")),
    ] {
        let proj = tmp.path().join("proj");
        let _ = std::fs::remove_dir_all(&proj);
        std::fs::create_dir(&proj).unwrap();
        std::fs::write(proj.join("owner.json"), owner).unwrap();
        if let Some(other) = other {
            std::fs::write(proj.join(other), "int main;").unwrap();
        }
        for file in ["owner.json"].into_iter().chain(other) {
            std::fs::File::options()
                .write(true)
                .open(proj.join(file))
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        let p = proj.to_str().unwrap();
        for args in [
            &[
                "run",
                "--strategy",
                "dir",
                "-w",
                "3",
                p,
                "touch",
                ran.to_str().unwrap(),
            ][..],
            &["holder", "--strategy", "dir", p],
        ] {
            let done = finish(args);
            assert_eq!(done.code, Some(2), "{owner} {other:?} {args:?}: {}", done.stderr);
            assert!(done.stderr.contains("not a lock"), "{args:?}: {}", done.stderr);
            assert!(!ran.exists(), "{owner} {other:?}: the command ran");
            assert_eq!(std::fs::read_to_string(proj.join("owner.json")).unwrap(), owner);
            if let Some(other) = other {
                assert!(proj.join(other).is_file(), "{owner}: {other} removed");
            }
        }
    }
}

#[test]
fn a_json_file_of_data_with_a_pid_or_uuid_is_no_lock_and_is_kept() {
    // Locking the JSON file one updates is a flock(1) habit; a `uuid` or
    // `pid` key alone does not make it a lock record to reclaim.
    let tmp = tempfile::tempdir().unwrap();
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    let state = tmp.path().join("state.json");
    let ran = tmp.path().join("ran");
    for text in [
        r#"{"uuid":"3f2a","name":"my vm","disks":[1,2]}"#,
        r#"{"pid":4242,"port":8080}"#,
        r#"{"holderId":"alice","items":[]}"#,
    ] {
        std::fs::write(&state, text).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&state)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let s = state.to_str().unwrap();
        let done = finish(&["run", "-w", "3", s, "touch", ran.to_str().unwrap()]);
        assert_eq!(done.code, Some(2), "{text}: {}", done.stderr);
        assert!(done.stderr.contains("not a lock"), "{text}: {}", done.stderr);
        assert!(!ran.exists(), "{text}: the command ran");
        assert_eq!(std::fs::read_to_string(&state).unwrap_or_default(), text);
    }
}

#[test]
fn holder_of_a_path_to_a_file_of_data_says_it_is_no_lock() {
    // `run` refuses such a path; `holder` must not call it a stale lock
    // that `leasehold clean` removes (run in that directory, clean would).
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("Cargo.lock");
    std::fs::write(
        &data,
        "# This file is automatically @generated by Cargo.\nversion = 4\n",
    )
    .unwrap();
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&data)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let d = data.to_str().unwrap();
    for args in [&["holder", d][..], &["holder", d, "--json"]] {
        let done = finish(args);
        assert_eq!(done.code, Some(2), "{args:?}: {}{}", done.stdout, done.stderr);
        assert!(done.stderr.contains("not a lock"), "{args:?}: {}", done.stderr);
        assert!(!done.stdout.contains("clean"), "{args:?}: {}", done.stdout);
    }
    assert!(data.is_file());
}

#[test]
fn a_path_in_a_shared_directory_needs_the_sticky_bit() {
    let (tmp, dir, path) = scratch();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let refused = finish(&["run", &path, "touch", &format!("{dir}/ran")]);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(refused.stderr.contains("sticky"), "{}", refused.stderr);
    assert!(!Path::new(&dir).join("ran").exists(), "ran the command");
    // /tmp and /var/lock are world-writable and sticky.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let done = finish(&["run", &path, "true"]);
    assert_eq!(done.code, Some(0), "{}", done.stderr);
}

#[test]
fn bad_paths_and_flags_are_usage_errors_never_panics() {
    let (_tmp, dir, path) = scratch();
    let slash = format!("{dir}/");
    let ran = format!("{dir}/ran");
    for args in [
        &["run", &slash, "touch", &ran][..],
        &["run", "--dir", &dir, &path, "touch", &ran],
        &["run", "-w", "-1", &path, "touch", &ran],
        &["run", "-w", "5x", &path, "touch", &ran],
        &["run", "-w", "inf", &path, "touch", &ran],
        &["run", "-E", "256", &path, "touch", &ran],
        &["run", "-E", "-1", &path, "touch", &ran],
        &["run", "--lease", "soon", &path, "touch", &ran],
        &["run", "--lease", "10ms", &path, "touch", &ran],
        &["run", "--kill-after", "1y", &path, "touch", &ran],
        &["run", "-c", "true", &path, "touch", &ran],
        &["run", &path],
        &["run"],
        &["run", "-F", &path, "touch", &ran],
        &["run", "-u", &path, "touch", &ran],
        &["run", "9"],
        &["holder", &slash],
        &["holder", "--dir", &dir, &path],
        &["man", "bogus"],
        &["completions", "tcsh"],
    ] {
        let done = finish(args);
        assert_eq!(done.code, Some(2), "{args:?}: {}", done.stderr);
        assert!(!done.stderr.is_empty(), "{args:?}: says why");
        assert!(!done.stderr.contains("panicked"), "{args:?}: {}", done.stderr);
        assert!(!Path::new(&ran).exists(), "{args:?}: the command ran");
    }
}

#[test]
fn flocks_argument_order_needs_no_double_dash() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    // Options after CMD are CMD's.
    let done = finish(&["run", "-n", "--dir", d, "job", "printf", "%s,", "-n", "--verbose"]);
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    assert_eq!(done.stdout, "-n,--verbose,");
    // -o is accepted and changes nothing; a repeated option is no error.
    let done = finish(&["run", "-o", "--close", "-n", "-n", "--dir", d, "job", "true"]);
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    assert_silent(&done, "-o");
    // What -o is for in flock(1): the command holds no descriptor of the
    // lock (nor of its directory), whatever the kind and -o or not.
    let path = format!("{d}/held.lock");
    for options in [&[][..], &["-o"], &["-s"], &["--permits", "2"]] {
        let mut args = vec!["run"];
        args.extend_from_slice(options);
        args.extend_from_slice(&[&path, "sh", "-c", "ls -l /proc/$$/fd/"]);
        let done = finish(&args);
        assert_eq!(done.code, Some(0), "{options:?}: {}", done.stderr);
        assert!(done.stdout.contains(" 0 -> "), "{options:?}: {}", done.stdout);
        assert!(
            !done.stdout.contains(d),
            "{options:?}: CMD holds a lock descriptor: {}",
            done.stdout
        );
    }
}

#[test]
fn verbose_says_who_holds_the_lock_while_waiting_and_how_long_it_took() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let mut holder = super::holding(d, "job");
    let busy = finish(&["run", "-n", "--verbose", "--dir", d, "job", "true"]);
    assert_eq!(busy.code, Some(1));
    let who = format!("held by pid {} on host ", holder.pid());
    assert!(busy.stderr.contains(&who), "{}", busy.stderr);
    assert!(busy.stderr.contains(" since 2"), "since when: {}", busy.stderr);
    let timed_out = finish(&["run", "-w", "200ms", "--verbose", "--dir", d, "job", "true"]);
    assert_eq!(timed_out.code, Some(1));
    assert!(timed_out.stderr.contains("gave up after"), "{}", timed_out.stderr);

    // A wait of over 5 s: the holder, a line while waiting, the time taken.
    let mut waiter = merged(&["run", "-w", "1m", "--verbose", "--dir", d, "job", "true"]);
    let mut lines = lines_until(&waiter, "still waiting for lock \"job\" after");
    assert!(
        lines[0].contains(&who) && lines[0].contains("waiting"),
        "{lines:?}"
    );
    std::fs::write(tmp.path().join("go"), "").unwrap();
    assert_eq!(holder.wait().code(), Some(0));
    let (status, rest) = rest(&mut waiter);
    assert_eq!(status.code(), Some(0), "{lines:?} {rest:?}");
    lines.extend(rest);
    let last = lines.last().unwrap();
    assert!(
        last.starts_with("leasehold: took lock \"job\" after "),
        "{lines:?}"
    );
    let secs: f64 = last
        .rsplit(' ')
        .next()
        .and_then(|s| s.strip_suffix('s'))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{last}"));
    assert!(secs >= 5.0, "{last}");
    // Without --verbose, the same wait says nothing.
    let quiet = finish(&["run", "-w", "1m", "--dir", d, "job", "true"]);
    assert_silent(&quiet, "free, without --verbose");
}

#[test]
fn a_terminal_shows_a_live_line_while_waiting_and_erases_it() {
    if !Path::new("/usr/bin/script").exists() {
        eprintln!("script(1) not found: the live line is checked by the unit tests alone");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let mut holder = super::holding(d, "job");
    // script(1) gives the tool a terminal; its output is the terminal's.
    let line = format!(
        "{} run --dir {d} job echo got-it",
        env!("CARGO_BIN_EXE_leasehold")
    );
    let mut cmd = Command::new("/usr/bin/script");
    cmd.args(["-qfec", &line, "/dev/null"])
        .env_remove("LEASEHOLD_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut script = cmd.spawn().expect("script");
    // Killed by pid if the test fails before reaping it.
    let script_pid = KillOnDrop(script.id() as i32);
    // The terminal's bytes as they come: the live line ends in no newline.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let reader = std::thread::spawn({
        use std::io::Read;
        let (mut stdout, seen) = (script.stdout.take().expect("stdout"), seen.clone());
        move || {
            let mut chunk = [0; 4096];
            while let Ok(n @ 1..) = stdout.read(&mut chunk) {
                seen.lock().unwrap().extend_from_slice(&chunk[..n]);
            }
        }
    });
    let held_by = format!("for lock \"job\", held by pid {} on ", holder.pid());
    let deadline = Instant::now() + BOUND;
    while !String::from_utf8_lossy(&seen.lock().unwrap()).contains(&held_by) {
        let so_far = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
        assert!(Instant::now() < deadline, "no live line: {so_far:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(tmp.path().join("go"), "").unwrap();
    assert_eq!(holder.wait().code(), Some(0));
    let deadline = Instant::now() + BOUND;
    let status = loop {
        if let Some(status) = script.try_wait().expect("try_wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "the waiter never finished");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Reaped: its pid may be reused, so no kill at the end.
    std::mem::forget(script_pid);
    reader.join().unwrap();
    assert_eq!(status.code(), Some(0));
    let out = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    let out = &out;
    let shown = out
        .find("\r\x1b[Kleasehold: waiting ")
        .unwrap_or_else(|| panic!("no live line: {out:?}"));
    let got = out.find("got-it").unwrap_or_else(|| panic!("{out:?}"));
    let erased = out[..got].rfind("\r\x1b[K").unwrap();
    assert!(shown <= erased, "{out:?}");
    // Nothing but the erase between the live line and the command's output.
    let after = &out[erased + 4..got];
    assert!(!after.contains("leasehold"), "{out:?}");
}

#[test]
fn lease_and_kill_after_take_durations() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let script =
        "echo started; i=0; while [ ! -e \"$1/go\" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done";
    let mut holder = Proc::spawn(leasehold(&[
        "run",
        "--lease",
        "2s",
        "--kill-after",
        "1m30s",
        "--dir",
        d,
        "job",
        "sh",
        "-c",
        script,
        "sh",
        d,
    ]));
    holder.expect_line("started");
    let doc = finish(&["holder", "job", "--dir", d, "--json"]).json();
    let at = |key: &str| {
        let text = doc[key].as_str().unwrap_or_else(|| panic!("{key}: {doc}"));
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).unwrap()
    };
    let lease = at("leaseExpiresAt") - at("acquiredAt");
    assert!(
        lease <= time::Duration::seconds(2) && lease > time::Duration::ZERO,
        "a 2 s lease: {doc}"
    );
    // Renewed well within it: still held after several leases.
    std::thread::sleep(Duration::from_millis(4500));
    assert_eq!(finish(&["holder", "job", "--dir", d]).code, Some(0));
    std::fs::write(tmp.path().join("go"), "").unwrap();
    assert_eq!(holder.wait().code(), Some(0));

    // A grace past the lease's safety margin is allowed, with a warning.
    let done = finish(&[
        "run",
        "--lease",
        "4s",
        "--kill-after",
        "2s",
        "--dir",
        d,
        "job",
        "true",
    ]);
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    assert!(
        done.stderr
            .contains("warning: --kill-after 2s is longer than the 750ms"),
        "{}",
        done.stderr
    );
    let done = finish(&["run", "--lease", "4s", "--dir", d, "job", "true"]);
    assert_silent(&done, "the default grace fits a short lease");
}

#[test]
fn read_only_commands_never_create_the_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("typo");
    let m = missing.to_str().unwrap();
    for args in [
        &["holder", "job", "--dir", m][..],
        &["holder", "job", "--dir", m, "--json"],
        &["list", "--dir", m],
        &["list", "--dir", m, "--json"],
        &["clean", "--dir", m, "--dry-run"],
        &["clean", "--dir", m],
    ] {
        let done = finish(args);
        assert_eq!(done.code, Some(66), "{args:?}: {}", done.stderr);
        assert_eq!(done.stdout, "", "{args:?}");
        assert_eq!(
            done.stderr,
            format!("leasehold: lock directory {m} does not exist\n"),
            "{args:?}"
        );
        assert!(!missing.exists(), "{args:?} created the directory");
    }
    let mut cmd = leasehold(&["list"]);
    cmd.env("LEASEHOLD_DIR", m);
    assert_eq!(finish_cmd(cmd).code, Some(66));
    assert!(!missing.exists());
    // `run` makes its directory, as before.
    assert_eq!(finish(&["run", "--dir", m, "job", "true"]).code, Some(0));
    assert!(missing.is_dir());
    assert_eq!(
        finish(&["list", "--dir", m, "--json"]).json(),
        Value::Array(vec![])
    );
}

#[test]
fn man_pages_completions_and_version() {
    let top = finish(&["man"]);
    assert_eq!(top.code, Some(0), "{}", top.stderr);
    assert!(top.stdout.contains(".TH leasehold 1"), "{}", top.stdout);
    assert!(top.stdout.contains("leasehold\\-run(1)"), "{}", top.stdout);
    let run = finish(&["man", "run"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    for documented in [
        "\\-\\-nonblock",
        "\\-\\-timeout",
        "\\-\\-conflict\\-exit\\-code",
        "Exit status",
        "126",
    ] {
        assert!(run.stdout.contains(documented), "man run lacks {documented}");
    }
    if Path::new("/usr/bin/man").exists() {
        let page = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(page.path(), &run.stdout).unwrap();
        let mut cmd = Command::new("/usr/bin/man");
        cmd.arg("-l")
            .arg(page.path())
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "100");
        let shown = finish_cmd(cmd);
        if shown.code == Some(0) {
            assert!(shown.stdout.contains("nonblock"), "{}", shown.stdout);
        }
    }
    for shell in ["bash", "zsh", "fish"] {
        let done = finish(&["completions", shell]);
        assert_eq!(done.code, Some(0), "{shell}: {}", done.stderr);
        for word in ["run", "holder", "--nonblock", "--timeout"] {
            assert!(done.stdout.contains(word), "{shell} lacks {word}");
        }
        assert!(
            !done.stdout.contains("watchdog"),
            "{shell} offers the internal watchdog"
        );
    }
    let bash = finish(&["completions", "bash"]);
    let script = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(script.path(), &bash.stdout).unwrap();
    let mut check = Command::new("bash");
    check.arg("-n").arg(script.path());
    assert_eq!(finish_cmd(check).code, Some(0), "the bash script parses");
    for flag in ["--version", "-V"] {
        let done = finish(&[flag]);
        assert_eq!(done.code, Some(0));
        assert_eq!(done.stdout, format!("leasehold {}\n", env!("CARGO_PKG_VERSION")));
    }
}

#[test]
fn help_documents_the_flock_flags_and_the_exit_statuses() {
    let long = finish(&["run", "--help"]).stdout;
    for documented in [
        "-n, --no-wait",
        "nonblock",
        "-w, --wait",
        "timeout",
        "-E, --conflict-exit-code",
        "-s, --shared",
        "-x, --exclusive",
        "-c, --command",
        "-o, --close",
        "--verbose",
        "--lease",
        "--kill-after",
        "--file",
        "NAME|PATH",
        "66",
        "75",
        "78",
        "126, 127",
        "128+N",
        "1h30m",
        "flock(1)",
        "--json",
        "\"acquired\"",
    ] {
        assert!(
            long.contains(documented),
            "run --help lacks {documented:?}: {long}"
        );
    }
    let short = finish(&["run", "-h"]).stdout;
    assert!(short.contains("See --help"), "{short}");
    for sub in ["holder", "list", "clean"] {
        let help = finish(&[sub, "--help"]).stdout;
        assert!(help.contains("66"), "{sub} --help: {help}");
    }
}

/// The `--json` lines of a finished run, parsed.
fn events(done: &Done) -> Vec<Value> {
    done.stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect()
}

#[test]
fn json_lines_say_what_happened_to_the_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let done = finish(&["run", "--json", "--dir", d, "job", "echo", "ran"]);
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    assert_eq!(done.stdout, "ran\n", "stdout stays the command's");
    let ev = events(&done);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["event"], "acquired");
    assert_eq!(ev[0]["lock"], "job");
    assert!(
        ev[0]["waitedMs"].is_u64() && ev[0]["fencingToken"].is_u64(),
        "{ev:?}"
    );

    let mut holder = super::holding(d, "job");
    let pid = u64::from(holder.pid());
    let busy = finish(&["run", "--json", "-n", "-E", "3", "--dir", d, "job", "true"]);
    assert_eq!(busy.code, Some(3));
    let ev = events(&busy);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["event"], "busy");
    assert_eq!(ev[0]["exitCode"], 3);
    assert_eq!(ev[0]["holders"][0]["pid"], pid, "{ev:?}");

    let timed_out = finish(&["run", "--json", "-w", "200ms", "--dir", d, "job", "true"]);
    assert_eq!(timed_out.code, Some(1));
    let ev = events(&timed_out);
    let kinds: Vec<&str> = ev.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["waiting", "timeout"], "{ev:?}");
    assert_eq!(ev[0]["waitLimitMs"], 200);
    assert_eq!(ev[0]["holders"][0]["pid"], pid, "{ev:?}");
    assert!(ev[1]["waitedMs"].as_u64().unwrap() >= 200, "{ev:?}");

    let mut waiter = merged(&["run", "--json", "--dir", d, "job", "true"]);
    let mut lines = lines_until(&waiter, "\"event\":\"waiting\"");
    std::fs::write(tmp.path().join("go"), "").unwrap();
    assert_eq!(holder.wait().code(), Some(0));
    let (status, rest) = rest(&mut waiter);
    assert_eq!(status.code(), Some(0), "{lines:?} {rest:?}");
    lines.extend(rest);
    let kinds: Vec<String> = lines
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .map(|e| e["event"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kinds, ["waiting", "acquired"], "{lines:?}");

    // A lost lock: the line, then the warning, and status 75.
    let path = super::lock_path(tmp.path(), "lost");
    let remover = std::thread::spawn(move || {
        let deadline = Instant::now() + BOUND;
        while std::fs::remove_file(&path).is_err() {
            assert!(Instant::now() < deadline, "the lock never appeared");
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let script = "while :; do sleep 0.1 >/dev/null; done";
    let done = finish(&[
        "run", "--json", "--lease", "1s", "--dir", d, "lost", "sh", "-c", script,
    ]);
    remover.join().unwrap();
    assert_eq!(done.code, Some(75), "{}", done.stderr);
    let lines: Vec<&str> = done.stderr.lines().collect();
    let lost: Vec<Value> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "lost")
        .collect();
    assert_eq!(lost.len(), 1, "{}", done.stderr);
    assert_eq!(lost[0]["lock"], "lost");
    assert!(lost[0]["killAfterMs"].is_u64(), "{}", done.stderr);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("leasehold: warning: lock \"lost\" was lost")),
        "the warning stays: {}",
        done.stderr
    );
}
