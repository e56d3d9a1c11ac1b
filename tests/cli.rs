//! The command-line tool, driven as a user would: the real binary, each
//! test in its own temporary directory, every process it starts bounded in
//! time and killed by pid when the test is done with it.
// The tool on Unix: process groups, signals, `flock(1)`; `leasehold run` on every platform is tests/cli_run.rs's.
#![cfg(unix)]

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

/// How long any one process may take before the test fails: generous, so a
/// loaded machine is never mistaken for a bug.
const BOUND: Duration = Duration::from_secs(30);

/// The tool, with a clean environment as far as it cares.
fn leasehold(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    cmd.args(args).env_remove("LEASEHOLD_DIR").stdin(Stdio::null());
    cmd
}

#[path = "support/stderr_tap.rs"]
mod stderr_tap;
use stderr_tap::StderrTap;

/// A running process, SIGKILLed (by pid) and reaped when dropped, with its
/// stdout readable line by line as it comes. Its stderr (the tool's
/// warnings when a test makes it lose a lock, the command's shell saying
/// `Terminated`) is kept, and shown only if the test fails.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: StderrTap,
}

impl Proc {
    fn spawn(mut cmd: Command) -> Self {
        let mut child = stderr_tap::stderr_for(cmd.stdout(Stdio::piped()))
            .spawn()
            .expect("spawn");
        let stderr = StderrTap::new(&mut child);
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self { child, lines, stderr }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for a stdout line equal to `line`; panics after [`BOUND`].
    fn expect_line(&self, line: &str) {
        let deadline = Instant::now() + BOUND;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(got) if got == line => return,
                Ok(_) => continue,
                Err(e) => panic!("process {} did not print {line:?}: {e}", self.pid()),
            }
        }
    }

    fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.pid() as i32), signal).expect("signal");
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// Waits for the exit; panics after [`BOUND`].
    fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + BOUND;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "process {} still running", self.pid());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        }
        let _ = self.child.wait();
        self.stderr.show_if_failing();
    }
}

/// What a finished run of the tool left.
struct Done {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Done {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }
}

/// Runs the tool to completion within [`BOUND`]. Only for commands that
/// leave no background process holding its pipes.
fn finish(args: &[&str]) -> Done {
    finish_cmd(leasehold(args))
}

/// [`finish`], for any command.
fn finish_cmd(mut cmd: Command) -> Done {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = pipe(Box::new(child.stdout.take().expect("stdout")));
    let err = pipe(Box::new(child.stderr.take().expect("stderr")));
    let stderr = StderrTap::new(&mut child);
    let mut proc = Proc {
        child,
        lines: mpsc::channel().1,
        stderr,
    };
    let status = proc.wait();
    Done {
        code: status.code(),
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

/// A `run` of `name` whose command prints `started` and then holds the
/// lock until the file `go` appears in `dir` (or a minute passes).
fn holding(dir: &str, name: &str) -> Proc {
    holding_as(dir, name, &[])
}

/// [`holding`], with more options for `run` (`--shared`, `--permits N`).
fn holding_as(dir: &str, name: &str, options: &[&str]) -> Proc {
    let script =
        "echo started; i=0; while [ ! -e \"$1/go\" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done";
    let mut args = vec!["run", name, "--dir", dir];
    args.extend_from_slice(options);
    args.extend_from_slice(&["--", "sh", "-c", script, "sh", dir]);
    let p = Proc::spawn(leasehold(&args));
    p.expect_line("started");
    p
}

fn lock_path(dir: &Path, name: &str) -> std::path::PathBuf {
    leasehold::Locker::new(dir).unwrap().lock_path(name).unwrap()
}

#[test]
fn run_excludes_a_concurrent_run() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let mut first = holding(d, "job");

    let busy = finish(&["run", "job", "--dir", d, "--no-wait", "--verbose", "--", "true"]);
    assert_eq!(busy.code, Some(1), "stderr: {}", busy.stderr);
    assert_eq!(busy.stderr.lines().count(), 1, "one line: {}", busy.stderr);
    assert!(busy.stderr.starts_with("leasehold: "), "{}", busy.stderr);
    assert!(
        busy.stderr.contains(&format!("pid {}", first.pid())),
        "names the holder: {}",
        busy.stderr
    );

    let busy = finish(&[
        "run",
        "job",
        "--dir",
        d,
        "--no-wait",
        "--conflict-exit-code",
        "7",
        "--",
        "true",
    ]);
    assert_eq!(busy.code, Some(7), "stderr: {}", busy.stderr);

    let timed_out = finish(&["run", "job", "--dir", d, "--wait", "0.2", "--", "true"]);
    assert_eq!(timed_out.code, Some(1), "stderr: {}", timed_out.stderr);

    // Another name is not affected.
    let other = finish(&["run", "other", "--dir", d, "--no-wait", "--", "true"]);
    assert_eq!(other.code, Some(0), "stderr: {}", other.stderr);

    // A waiter gets the lock once the first run finishes.
    let mut waiter = Proc::spawn(leasehold(&[
        "run", "job", "--dir", d, "--wait", "20", "--", "echo", "second",
    ]));
    std::thread::sleep(Duration::from_millis(300));
    assert!(waiter.running(), "the waiter must not run while the lock is held");
    std::fs::write(tmp.path().join("go"), "").unwrap();
    assert_eq!(first.wait().code(), Some(0));
    waiter.expect_line("second");
    assert_eq!(waiter.wait().code(), Some(0));
}

#[test]
fn exit_status_and_environment_pass_through() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let script = "echo \"name=$LEASEHOLD_NAME token=$LEASEHOLD_FENCING_TOKEN\"; exit 3";
    let done = finish(&["run", "job", "--dir", d, "--", "sh", "-c", script]);
    assert_eq!(done.code, Some(3), "stderr: {}", done.stderr);
    let line = done.stdout.trim();
    let token = line
        .strip_prefix("name=job token=")
        .unwrap_or_else(|| panic!("unexpected output {line:?}"));
    assert!(token.parse::<u64>().is_ok(), "token {token:?}");

    // The lock is released afterwards, and a missing command is 127.
    assert_eq!(finish(&["holder", "job", "--dir", d]).code, Some(1));
    let missing = finish(&["run", "job", "--dir", d, "--", "/nonexistent/command"]);
    assert_eq!(missing.code, Some(127), "stderr: {}", missing.stderr);
    assert_eq!(finish(&["holder", "job", "--dir", d]).code, Some(1));

    // Bad input is an error (2), never a panic.
    for args in [
        &["run", "", "--dir", d, "--", "true"][..],
        &["run", "job", "--dir", d, "--wait", "-1", "--", "true"],
        &["run", "job", "--dir", d],
    ] {
        let done = finish(args);
        assert_eq!(done.code, Some(2), "{args:?}: {}", done.stderr);
        assert!(!done.stderr.contains("panicked"), "{args:?}: {}", done.stderr);
    }
}

#[test]
fn sigterm_is_forwarded_and_the_lock_released() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    // The background sleep's pid is printed so it can be killed at the end;
    // its output goes elsewhere so it does not hold our pipe.
    let script =
        "trap 'echo got-term; exit 0' TERM; sleep 30 >/dev/null 2>&1 & echo \"bg $!\"; echo started; wait";
    let mut tool = Proc::spawn(leasehold(&["run", "job", "--dir", d, "--", "sh", "-c", script]));
    let bg: i32 = tool
        .lines
        .recv_timeout(BOUND)
        .expect("bg pid")
        .strip_prefix("bg ")
        .expect("bg line")
        .parse()
        .expect("bg pid");
    let _bg = KillOnDrop(bg);
    tool.expect_line("started");
    assert_eq!(finish(&["holder", "job", "--dir", d]).code, Some(0));

    tool.signal(Signal::SIGTERM);
    tool.expect_line("got-term");
    assert_eq!(tool.wait().code(), Some(0), "the command's status");
    assert_eq!(finish(&["holder", "job", "--dir", d]).code, Some(1), "free");
}

/// Kills a process that is not our child (an orphaned grandchild) by pid.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0), Signal::SIGKILL);
    }
}

/// `leasehold run job --dir d -- sh -c script sh arg`: `script` sees
/// `arg` as `$1`.
fn run_job_sh(d: &str, script: &str, arg: &str) -> Proc {
    Proc::spawn(leasehold(&[
        "run", "job", "--dir", d, "--", "sh", "-c", script, "sh", arg,
    ]))
}

#[test]
fn releases_when_the_command_is_killed() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let pid_file = tmp.path().join("pid");
    let script = "echo $$ > \"$1.tmp\" && mv \"$1.tmp\" \"$1\"; exec sleep 30 >/dev/null";
    let mut tool = run_job_sh(d, script, pid_file.to_str().unwrap());
    let deadline = Instant::now() + BOUND;
    let pid: i32 = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            break pid;
        }
        assert!(Instant::now() < deadline, "the command never wrote its pid");
        std::thread::sleep(Duration::from_millis(20));
    };
    let cmd = KillOnDrop(pid);
    assert_eq!(finish(&["holder", "job", "--dir", d]).code, Some(0));

    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    // Dead and reaped by the tool now: its pid may be reused, so no second kill.
    std::mem::forget(cmd);
    assert_eq!(tool.wait().code(), Some(128 + 9));
    assert_eq!(finish(&["holder", "job", "--dir", d]).code, Some(1), "free");
}

#[test]
fn holder_list_and_clean_show_what_the_library_sees() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let mut tool = holding(d, "job");
    let live = lock_path(tmp.path(), "job");

    let held = finish(&["holder", "job", "--dir", d, "--json"]);
    assert_eq!(held.code, Some(0), "stderr: {}", held.stderr);
    let doc = held.json();
    assert_eq!(doc["name"], "job");
    assert_eq!(doc["state"], "held");
    assert_eq!(
        doc["pid"],
        u64::from(tool.pid()),
        "the tool holds the lock: {doc}"
    );
    assert_eq!(doc["path"], live.to_str().unwrap());
    assert!(doc["fencingToken"].is_u64(), "{doc}");
    assert!(doc["staleReason"].is_null(), "{doc}");
    for key in ["acquiredAt", "leaseExpiresAt"] {
        let t = doc[key].as_str().unwrap_or_else(|| panic!("{key}: {doc}"));
        time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
            .unwrap_or_else(|e| panic!("{key} {t:?}: {e}"));
    }
    let text = finish(&["holder", "job", "--dir", d]);
    assert_eq!(text.code, Some(0));
    assert!(text.stdout.contains(&tool.pid().to_string()), "{}", text.stdout);

    let free = finish(&["holder", "nobody", "--dir", d, "--json"]);
    assert_eq!(free.code, Some(1));
    assert_eq!(free.json()["state"], "free");

    // A lock whose owner process is gone.
    let stale = lock_path(tmp.path(), "crashed");
    std::fs::write(&stale, r#"{"uuid":"x","pid":999999999}"#).unwrap();
    let stale_str = stale.to_str().unwrap();

    // `list`, here through LEASEHOLD_DIR rather than --dir.
    let mut cmd = leasehold(&["list", "--json"]);
    let listed = cmd.env("LEASEHOLD_DIR", d).output().expect("list");
    assert_eq!(listed.status.code(), Some(0));
    let doc: Value = serde_json::from_slice(&listed.stdout).expect("list JSON");
    let locks = doc.as_array().expect("array");
    assert_eq!(locks.len(), 2, "{doc}");
    let find = |path: &str| locks.iter().find(|l| l["path"] == path).cloned();
    let job = find(live.to_str().unwrap()).expect("job listed");
    assert_eq!(job["state"], "held");
    assert_eq!(job["pid"], u64::from(tool.pid()));
    let crashed = find(stale_str).expect("stale lock listed");
    assert_eq!(crashed["state"], "stale");
    assert_eq!(crashed["pid"], 999_999_999u64);

    let dry = finish(&["clean", "--dir", d, "--dry-run", "--json"]);
    assert_eq!(dry.code, Some(0), "stderr: {}", dry.stderr);
    let doc = dry.json();
    assert_eq!(doc.as_array().map(Vec::len), Some(1), "{doc}");
    assert_eq!(doc[0]["path"], stale_str);
    assert!(stale.exists(), "a dry run removes nothing");
    let text = finish(&["clean", "--dir", d, "--dry-run"]);
    assert!(text.stdout.contains("would remove"), "{}", text.stdout);

    let cleaned = finish(&["clean", "--dir", d, "--json"]);
    assert_eq!(cleaned.code, Some(0), "stderr: {}", cleaned.stderr);
    let doc = cleaned.json();
    assert_eq!(doc.as_array().map(Vec::len), Some(1), "{doc}");
    assert_eq!(doc[0]["path"], stale_str);
    assert_eq!(doc[0]["state"], "stale");
    let reason = doc[0]["staleReason"].as_str().unwrap_or_default();
    assert!(reason.contains("dead"), "{doc}");
    assert!(!stale.exists(), "removed");
    assert!(live.exists(), "the live lock is untouched");
    assert_eq!(finish(&["holder", "job", "--dir", d]).code, Some(0));
    assert_eq!(finish(&["clean", "--dir", d]).stdout, "nothing to clean\n");

    std::fs::write(tmp.path().join("go"), "").unwrap();
    assert_eq!(tool.wait().code(), Some(0));
    assert_eq!(
        finish(&["list", "--dir", d, "--json"]).json(),
        Value::Array(vec![])
    );
}

#[test]
fn help_for_each_subcommand() {
    let cases: [(&str, &[&str]); 4] = [
        (
            "run",
            &[
                "--dir",
                "--wait",
                "--no-wait",
                "--strategy",
                "--conflict-exit-code",
                "--kill-after",
                "--shared",
                "-s",
                "--permits",
            ],
        ),
        ("holder", &["--dir", "--strategy", "--json"]),
        ("list", &["--dir", "--strategy", "--json"]),
        ("clean", &["--dir", "--strategy", "--dry-run", "--json"]),
    ];
    for (sub, options) in cases {
        let done = finish(&[sub, "--help"]);
        assert_eq!(done.code, Some(0), "{sub} --help: {}", done.stderr);
        for option in options {
            assert!(
                done.stdout.contains(option),
                "{sub} --help lacks {option}: {}",
                done.stdout
            );
        }
    }
    let run = finish(&["run", "--help"]).stdout;
    for documented in [
        "Exit status",
        "75",
        "lock was lost",
        "SIGKILL",
        "process group",
        "watchdog",
        "setsid",
        "78",
        "--permits 0",
    ] {
        assert!(run.contains(documented), "run --help lacks {documented:?}: {run}");
    }
    let top = finish(&["--help"]);
    assert_eq!(top.code, Some(0));
    for sub in ["run", "holder", "list", "clean"] {
        assert!(top.stdout.contains(sub), "{}", top.stdout);
    }
}

/// Reads the `pid N` line a command prints first.
fn command_pid(tool: &Proc) -> i32 {
    tool.lines
        .recv_timeout(BOUND)
        .expect("pid line")
        .strip_prefix("pid ")
        .expect("pid line")
        .parse()
        .expect("pid")
}

/// Whether `pid` has exited: gone, or a zombie nobody has reaped yet (it
/// is no longer our child, and a container's init may be slow to reap).
fn exited(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

#[test]
fn the_command_dies_with_a_killed_tool_and_never_overlaps_the_next_run() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let log = tmp.path().join("log");
    let log = log.to_str().unwrap();
    // Not `exec`: the shell itself must write, so that the log shows any
    // overlap. Its short sleeps die on their own.
    let first = "echo \"pid $$\"; while :; do echo first >> \"$1\"; sleep 0.05 >/dev/null; done";
    let mut tool = Proc::spawn(leasehold(&[
        "run", "job", "--dir", d, "--", "sh", "-c", first, "sh", log,
    ]));
    let pid = command_pid(&tool);
    let cmd = KillOnDrop(pid);
    let deadline = Instant::now() + BOUND;
    while std::fs::metadata(log).map_or(true, |m| m.len() == 0) {
        assert!(Instant::now() < deadline, "the command never wrote");
        std::thread::sleep(Duration::from_millis(20));
    }

    tool.signal(Signal::SIGKILL);
    assert_eq!(tool.wait().signal(), Some(9));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !exited(pid) {
        assert!(Instant::now() < deadline, "the command outlived the tool by 5 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Exited: its pid may be reused, so no kill at the end.
    std::mem::forget(cmd);

    let second = "echo second-start >> \"$1\"; sleep 0.5; echo second-end >> \"$1\"";
    let done = finish(&[
        "run", "job", "--dir", d, "--wait", "20", "--", "sh", "-c", second, "sh", log,
    ]);
    assert_eq!(done.code, Some(0), "stderr: {}", done.stderr);
    let text = std::fs::read_to_string(log).unwrap();
    let during: Vec<&str> = text.lines().skip_while(|l| *l != "second-start").collect();
    assert_eq!(during, ["second-start", "second-end"], "overlap: {text}");
}

#[test]
fn a_lost_lock_kills_a_command_that_ignores_sigterm_and_exits_75() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    // SIGTERM stays ignored across the exec, so only SIGKILL stops it.
    let script = "trap '' TERM; echo \"pid $$\"; echo started; exec sleep 60 >/dev/null";
    let mut tool = Proc::spawn(leasehold(&[
        "run",
        "job",
        "--dir",
        d,
        "--kill-after",
        "0.5",
        "--",
        "sh",
        "-c",
        script,
    ]));
    let cmd = KillOnDrop(command_pid(&tool));
    tool.expect_line("started");

    // Noticed at the next renewal: within a third of the 30 s lease.
    std::fs::remove_file(lock_path(tmp.path(), "job")).unwrap();
    let status = tool.wait();
    // The tool reaped the command before exiting: its pid may be reused.
    std::mem::forget(cmd);
    assert_eq!(status.code(), Some(75), "{status:?}");
}

#[test]
fn a_lost_lock_fails_the_run_even_if_the_command_exits_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let script = "trap 'echo got-term; exit 0' TERM; echo \"pid $$\"; echo started; \
                  while :; do sleep 0.1 >/dev/null; done";
    let mut tool = Proc::spawn(leasehold(&["run", "job", "--dir", d, "--", "sh", "-c", script]));
    let cmd = KillOnDrop(command_pid(&tool));
    tool.expect_line("started");

    std::fs::remove_file(lock_path(tmp.path(), "job")).unwrap();
    tool.expect_line("got-term");
    let status = tool.wait();
    std::mem::forget(cmd);
    assert_eq!(status.code(), Some(75), "not the command's 0: {status:?}");
}

/// Reads lines until one starting with `prefix`, and parses the pid after it.
fn pid_after(tool: &Proc, prefix: &str) -> i32 {
    let deadline = Instant::now() + BOUND;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = tool
            .lines
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("no {prefix:?} line: {e}"));
        if let Some(pid) = line.strip_prefix(prefix) {
            return pid.parse().expect("pid");
        }
    }
}

/// Waits until `pid` has exited; panics after `within`.
fn await_exit(pid: i32, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    while !exited(pid) {
        assert!(
            Instant::now() < deadline,
            "{what} (pid {pid}) still runs after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_killed_tool_takes_the_commands_whole_process_group_with_it() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let log = tmp.path().join("log");
    let log = log.to_str().unwrap();
    // The work runs in a child of CMD, as in nearly every script; CMD
    // itself never writes the log.
    let worker = "echo \"worker $$\"; while :; do echo first >> \"$1\"; sleep 0.05 >/dev/null; done";
    let script = format!("echo \"cmd $$\"; sh -c '{worker}' sh \"$1\"; true");
    let mut tool = Proc::spawn(leasehold(&[
        "run", "job", "--dir", d, "--", "sh", "-c", &script, "sh", log,
    ]));
    let cmd = KillOnDrop(pid_after(&tool, "cmd "));
    let worker = KillOnDrop(pid_after(&tool, "worker "));
    let deadline = Instant::now() + BOUND;
    while std::fs::metadata(log).map_or(true, |m| m.len() == 0) {
        assert!(Instant::now() < deadline, "the worker never wrote");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The next run is already waiting when the tool dies.
    let second = "echo second-start >> \"$1\"; sleep 0.5; echo second-end >> \"$1\"";
    let mut next = Proc::spawn(leasehold(&[
        "run", "job", "--dir", d, "--wait", "20", "--", "sh", "-c", second, "sh", log,
    ]));

    tool.signal(Signal::SIGKILL);
    assert_eq!(tool.wait().signal(), Some(9));
    await_exit(worker.0, Duration::from_secs(5), "the command's child");
    await_exit(cmd.0, Duration::from_secs(5), "the command");
    // Exited: their pids may be reused, so no kill at the end.
    std::mem::forget(worker);
    std::mem::forget(cmd);

    assert_eq!(next.wait().code(), Some(0));
    let text = std::fs::read_to_string(log).unwrap();
    let during: Vec<&str> = text.lines().skip_while(|l| *l != "second-start").collect();
    assert_eq!(during, ["second-start", "second-end"], "overlap: {text}");
}

#[test]
fn a_lost_lock_stops_the_commands_whole_process_group_and_exits_75() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    // CMD dies of the SIGTERM; its child ignores it (as do the child's
    // sleeps, which inherit that), so only the SIGKILL to the group, sent
    // after CMD itself has exited, stops it.
    let worker = "trap \"\" TERM; echo \"worker $$\"; while :; do sleep 0.05 >/dev/null; done";
    let script = format!("echo \"cmd $$\"; sh -c '{worker}'; true");
    let mut tool = Proc::spawn(leasehold(&[
        "run",
        "job",
        "--dir",
        d,
        "--kill-after",
        "0.5",
        "--",
        "sh",
        "-c",
        &script,
    ]));
    let cmd = KillOnDrop(pid_after(&tool, "cmd "));
    let worker = KillOnDrop(pid_after(&tool, "worker "));

    // Noticed at the next renewal: within a third of the 30 s lease.
    std::fs::remove_file(lock_path(tmp.path(), "job")).unwrap();
    let status = tool.wait();
    assert_eq!(status.code(), Some(75), "{status:?}");
    // Not a moment later: the tool exits only once the group is empty.
    assert!(exited(cmd.0), "the command outlived the tool");
    assert!(exited(worker.0), "the command's child outlived the tool");
    std::mem::forget(worker);
    std::mem::forget(cmd);
}

#[test]
fn a_background_child_keeps_the_lock_held_until_it_exits() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    // CMD exits at once, leaving a background child running, as flock(1)
    // keeps the lock for every process that inherited it. The child runs
    // until the file `go` appears (60 s at most), however slow the
    // machine is to make the check below.
    let go = tmp.path().join("go");
    let script = "(i=0; while [ ! -e \"$1\" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done) \
                  >/dev/null 2>&1 & echo \"bg $!\"; echo started; exit 3";
    let mut tool = run_job_sh(d, script, go.to_str().unwrap());
    let bg = KillOnDrop(pid_after(&tool, "bg "));
    tool.expect_line("started");

    let busy = finish(&["run", "job", "--dir", d, "--no-wait", "--", "true"]);
    assert_eq!(busy.code, Some(1), "held: {}", busy.stderr);
    assert!(!exited(bg.0), "the background child lives until `go`");
    assert!(tool.running(), "the tool waits for the background child");

    std::fs::write(&go, "").unwrap();
    assert_eq!(tool.wait().code(), Some(3), "the command's own status");
    assert!(exited(bg.0), "the tool exited before the background child");
    std::mem::forget(bg);
    assert_eq!(finish(&["holder", "job", "--dir", d]).code, Some(1), "free");
    let done = finish(&["run", "job", "--dir", d, "--no-wait", "--", "true"]);
    assert_eq!(done.code, Some(0), "stderr: {}", done.stderr);
}

/// Two `run --shared` of `name`, each of whose command creates its marker
/// (`a` or `b`) in `dir` and succeeds only once it sees the other's, within
/// `BOUND`: both exit 0 only if they held the lock at the same time.
#[test]
fn shared_runs_overlap() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let script = "touch \"$1/$2\"; i=0; while [ ! -e \"$1/$3\" ]; do \
                  [ $i -ge 300 ] && exit 9; sleep 0.1; i=$((i+1)); done; echo saw-$3";
    let run = |short: bool, me: &str, other: &str| {
        let flag = if short { "-s" } else { "--shared" };
        Proc::spawn(leasehold(&[
            "run", "catalog", flag, "--dir", d, "--", "sh", "-c", script, "sh", d, me, other,
        ]))
    };
    let mut a = run(true, "a", "b");
    let mut b = run(false, "b", "a");
    a.expect_line("saw-b");
    b.expect_line("saw-a");
    assert_eq!(a.wait().code(), Some(0));
    assert_eq!(b.wait().code(), Some(0));
    assert_eq!(finish(&["holder", "catalog", "--dir", d]).code, Some(1), "free");
}

#[test]
fn shared_and_exclusive_runs_exclude_each_other() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();

    // An exclusive holder keeps shared runs out.
    let mut writer = holding(d, "catalog");
    let busy = finish(&[
        "run",
        "catalog",
        "--shared",
        "--dir",
        d,
        "--no-wait",
        "--verbose",
        "--",
        "true",
    ]);
    assert_eq!(busy.code, Some(1), "stderr: {}", busy.stderr);
    assert!(
        busy.stderr.contains(&format!("held by pid {}", writer.pid())),
        "names the holder: {}",
        busy.stderr
    );
    let timed_out = finish(&["run", "catalog", "-s", "--dir", d, "--wait", "0.2", "--", "true"]);
    assert_eq!(timed_out.code, Some(1), "stderr: {}", timed_out.stderr);
    std::fs::write(tmp.path().join("go"), "").unwrap();
    assert_eq!(writer.wait().code(), Some(0));
    std::fs::remove_file(tmp.path().join("go")).unwrap();

    // Shared holders keep an exclusive run out, and it says how.
    let mut reader = holding_as(d, "catalog", &["--shared"]);
    let busy = finish(&[
        "run",
        "catalog",
        "--dir",
        d,
        "--no-wait",
        "--verbose",
        "--",
        "true",
    ]);
    assert_eq!(busy.code, Some(1), "stderr: {}", busy.stderr);
    assert!(
        busy.stderr
            .contains(&format!("held shared by pid {}", reader.pid())),
        "{}",
        busy.stderr
    );
    // More readers may join while no writer waits.
    let joined = finish(&[
        "run",
        "catalog",
        "--shared",
        "--dir",
        d,
        "--no-wait",
        "--",
        "true",
    ]);
    assert_eq!(joined.code, Some(0), "stderr: {}", joined.stderr);

    // A waiting writer runs only after the reader, and holds back new readers.
    let log = tmp.path().join("log");
    let log = log.to_str().unwrap();
    let mut writer = Proc::spawn(leasehold(&[
        "run",
        "catalog",
        "--dir",
        d,
        "--wait",
        "20",
        "--",
        "sh",
        "-c",
        "echo writer >> \"$1\"; echo writer-ran",
        "sh",
        log,
    ]));
    let deadline = Instant::now() + BOUND;
    let held_back = loop {
        let done = finish(&[
            "run",
            "catalog",
            "-s",
            "--dir",
            d,
            "--no-wait",
            "--verbose",
            "--",
            "true",
        ]);
        if done.code == Some(1) {
            break done;
        }
        assert_eq!(done.code, Some(0), "stderr: {}", done.stderr);
        assert!(
            Instant::now() < deadline,
            "the waiting writer never held readers back"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        held_back.stderr.contains("an exclusive run is waiting"),
        "{}",
        held_back.stderr
    );
    assert!(writer.running(), "the writer must not run while a reader holds");
    assert!(!Path::new(log).exists(), "the writer ran alongside a reader");
    std::fs::write(tmp.path().join("go"), "").unwrap();
    assert_eq!(reader.wait().code(), Some(0));
    writer.expect_line("writer-ran");
    assert_eq!(writer.wait().code(), Some(0));
}

#[test]
fn a_semaphore_admits_its_permits_and_no_more() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let mut one = holding_as(d, "gpu", &["--permits", "2"]);
    let mut two = holding_as(d, "gpu", &["--permits", "2"]);

    let third = finish(&[
        "run",
        "gpu",
        "--permits",
        "2",
        "--dir",
        d,
        "--no-wait",
        "--verbose",
        "--",
        "true",
    ]);
    assert_eq!(third.code, Some(1), "stderr: {}", third.stderr);
    assert_eq!(third.stderr.lines().count(), 1, "one line: {}", third.stderr);
    for pid in [one.pid(), two.pid()] {
        assert!(
            third.stderr.contains(&format!("pid {pid}")),
            "names every holder: {}",
            third.stderr
        );
    }
    assert!(
        third.stderr.contains("all 2 permits are taken"),
        "{}",
        third.stderr
    );
    let third = finish(&[
        "run",
        "gpu",
        "--permits",
        "2",
        "--dir",
        d,
        "--wait",
        "0.2",
        "--conflict-exit-code",
        "9",
        "--",
        "true",
    ]);
    assert_eq!(third.code, Some(9), "stderr: {}", third.stderr);
    // Nor does an exclusive run get in.
    let exclusive = finish(&["run", "gpu", "--dir", d, "--no-wait", "--", "true"]);
    assert_eq!(exclusive.code, Some(1), "stderr: {}", exclusive.stderr);

    // `holder` and `list` show the kind and both holders.
    let held = finish(&["holder", "gpu", "--dir", d, "--json"]);
    assert_eq!(held.code, Some(0), "stderr: {}", held.stderr);
    let doc = held.json();
    assert_eq!(doc["kind"], "semaphore", "{doc}");
    assert_eq!(doc["permits"], 2, "{doc}");
    assert_eq!(doc["state"], "held", "{doc}");
    let mut pids: Vec<u64> = doc["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .map(|h| h["pid"].as_u64().expect("pid"))
        .collect();
    pids.sort_unstable();
    let mut expected = vec![u64::from(one.pid()), u64::from(two.pid())];
    expected.sort_unstable();
    assert_eq!(pids, expected, "{doc}");
    for holder in doc["holders"].as_array().unwrap() {
        assert!(holder["acquiredAt"].is_string(), "{doc}");
        assert!(holder["hostname"].is_string(), "{doc}");
    }
    let text = finish(&["holder", "gpu", "--dir", d]).stdout;
    assert!(text.contains("semaphore of 2 permits"), "{text}");
    for pid in &expected {
        assert!(text.contains(&pid.to_string()), "{text}");
    }
    let listed = finish(&["list", "--dir", d, "--json"]).json();
    assert_eq!(listed[0]["kind"], "semaphore", "{listed}");
    assert_eq!(listed[0]["holders"].as_array().map(Vec::len), Some(2), "{listed}");
    let text = finish(&["list", "--dir", d]).stdout;
    assert!(text.contains("semaphore 2"), "{text}");
    assert!(text.contains("2 holders"), "{text}");
    for pid in &expected {
        assert!(text.contains(&format!("pid {pid}")), "{text}");
    }

    // A waiter gets the permit freed by the first holder to finish.
    let mut waiter = Proc::spawn(leasehold(&[
        "run",
        "gpu",
        "--permits",
        "2",
        "--dir",
        d,
        "--wait",
        "20",
        "--",
        "echo",
        "third",
    ]));
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        waiter.running(),
        "the third must wait while both permits are taken"
    );
    std::fs::write(tmp.path().join("go"), "").unwrap();
    assert_eq!(one.wait().code(), Some(0));
    assert_eq!(two.wait().code(), Some(0));
    waiter.expect_line("third");
    assert_eq!(waiter.wait().code(), Some(0));
}

#[test]
fn a_kind_mismatch_exits_78_without_waiting() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let ran = tmp.path().join("ran");
    let ran = ran.to_str().unwrap();
    let mut gpu = holding_as(d, "gpu", &["--permits", "2"]);
    let mut catalog = holding_as(d, "catalog", &["-s"]);

    for (args, held) in [
        (&["gpu", "--permits", "3"][..], "a semaphore of 2 permits"),
        (
            &["gpu", "--permits", "3", "--no-wait"],
            "a semaphore of 2 permits",
        ),
        (&["gpu", "--shared"], "a semaphore of 2 permits"),
        (&["gpu", "-s", "--wait", "20"], "a semaphore of 2 permits"),
        (&["catalog", "--permits", "2"], "shared"),
    ] {
        let mut all = vec!["run"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--dir", d, "--", "touch", ran]);
        let started = Instant::now();
        let done = finish(&all);
        assert_eq!(done.code, Some(78), "{args:?}: {}", done.stderr);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{args:?} waited {:?}",
            started.elapsed()
        );
        assert!(done.stderr.starts_with("leasehold: "), "{}", done.stderr);
        assert_eq!(done.stderr.lines().count(), 1, "one line: {}", done.stderr);
        assert!(
            done.stderr.contains(&format!("is held as {held}")),
            "{args:?}: {}",
            done.stderr
        );
        assert!(!Path::new(ran).exists(), "{args:?}: the command ran");
    }
    // The holders are untouched.
    assert_eq!(finish(&["holder", "gpu", "--dir", d]).code, Some(0));
    assert_eq!(finish(&["holder", "catalog", "--dir", d]).code, Some(0));
    // The same count is fine.
    let same = finish(&[
        "run",
        "gpu",
        "--permits",
        "2",
        "--dir",
        d,
        "--no-wait",
        "--",
        "true",
    ]);
    assert_eq!(same.code, Some(0), "stderr: {}", same.stderr);

    std::fs::write(tmp.path().join("go"), "").unwrap();
    assert_eq!(gpu.wait().code(), Some(0));
    assert_eq!(catalog.wait().code(), Some(0));
    // Once free, a name may become any kind.
    let now = finish(&[
        "run",
        "gpu",
        "--permits",
        "3",
        "--dir",
        d,
        "--no-wait",
        "--",
        "true",
    ]);
    assert_eq!(now.code, Some(0), "stderr: {}", now.stderr);
}

#[test]
fn bad_permits_are_usage_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let ran = tmp.path().join("ran");
    let ran = ran.to_str().unwrap();
    for (args, says) in [
        (&["--permits", "0"][..], "at least one permit"),
        (&["--permits=-1"], "not a number of permits"),
        (&["--permits", "two"], "not a number of permits"),
        (&["--permits", "4294967296"], "not a number of permits"),
        (&["--permits", "2", "--shared"], "cannot be used with"),
        (&["-s", "--permits", "2"], "cannot be used with"),
    ] {
        let mut all = vec!["run", "job", "--dir", d];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--", "touch", ran]);
        let done = finish(&all);
        assert_eq!(done.code, Some(2), "{args:?}: {}", done.stderr);
        assert!(done.stderr.contains(says), "{args:?}: {}", done.stderr);
        assert!(!done.stderr.contains("panicked"), "{args:?}: {}", done.stderr);
        assert!(!Path::new(ran).exists(), "{args:?}: the command ran");
    }
}

#[test]
fn a_lost_shared_lock_stops_the_command_and_exits_75() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let script = "trap 'echo got-term; exit 0' TERM; echo \"pid $$\"; echo started; \
                  while :; do sleep 0.1 >/dev/null; done";
    let mut tool = Proc::spawn(leasehold(&[
        "run", "catalog", "--shared", "--dir", d, "--", "sh", "-c", script,
    ]));
    let cmd = KillOnDrop(command_pid(&tool));
    tool.expect_line("started");

    // The marker at the lock path goes: every shared holder has lost it,
    // noticed at the next renewal.
    std::fs::remove_file(lock_path(tmp.path(), "catalog")).unwrap();
    tool.expect_line("got-term");
    let status = tool.wait();
    std::mem::forget(cmd);
    assert_eq!(status.code(), Some(75), "not the command's 0: {status:?}");
}

#[test]
fn a_signal_while_waiting_for_a_permit_ends_the_wait() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let mut holder = holding_as(d, "gpu", &["--permits", "1"]);
    let mut waiter = Proc::spawn(leasehold(&[
        "run",
        "gpu",
        "--permits",
        "1",
        "--dir",
        d,
        "--",
        "echo",
        "never",
    ]));
    std::thread::sleep(Duration::from_millis(300));
    assert!(waiter.running(), "the waiter must wait");
    waiter.signal(Signal::SIGTERM);
    assert_eq!(waiter.wait().code(), Some(128 + 15));
    std::fs::write(tmp.path().join("go"), "").unwrap();
    assert_eq!(holder.wait().code(), Some(0));
    assert_eq!(finish(&["holder", "gpu", "--dir", d]).code, Some(1), "free");
}

/// `holder` shows the owner fields a holder published (here velocious's
/// server lock's `host` and `port`), as text and as a JSON object.
#[test]
fn holder_shows_owner_fields() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let record = format!(
        r#"{{"uuid":"u1","pid":{},"host":"127.0.0.1","port":3006,"nested":{{"ignored":true}}}}"#,
        std::process::id()
    );
    std::fs::write(lock_path(tmp.path(), "dev-server"), record).unwrap();
    let held = finish(&["holder", "dev-server", "--dir", d, "--json"]);
    assert_eq!(held.code, Some(0), "stderr: {}", held.stderr);
    let doc = held.json();
    assert_eq!(
        doc["fields"],
        serde_json::json!({"host": "127.0.0.1", "port": 3006}),
        "{doc}"
    );
    let text = finish(&["holder", "dev-server", "--dir", d]);
    assert!(
        text.stdout.contains("  host:          127.0.0.1\n"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains("  port:          3006\n"), "{}", text.stdout);
    // Each holder of a shared lock, with its own fields.
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let reader = leasehold::Locker::builder()
        .directory(tmp.path())
        .owner_field("role", "reader")
        .build()
        .unwrap();
    let _reading = runtime.block_on(reader.acquire_shared("catalog")).unwrap();
    let shared = finish(&["holder", "catalog", "--dir", d, "--json"]).json();
    assert_eq!(shared["holders"][0]["fields"]["role"], "reader", "{shared}");
    let text = finish(&["holder", "catalog", "--dir", d]);
    assert!(text.stdout.contains("role:"), "{}", text.stdout);
    let list = finish(&["list", "--dir", d]);
    assert!(
        list.stdout.contains(r#"host="127.0.0.1" port=3006"#),
        "{}",
        list.stdout
    );
}

/// flock(1)'s flags, locks given by their path, quiet and verbose output,
/// read-only commands, the man page and completions (issue 18).
#[path = "cli/flock.rs"]
mod flock;
/// `list` and `holder` only read: a user who may read the lock directory
/// but not write it (an operator looking at a service's locks, here
/// `nobody` on a directory of root's, mode 0755) sees who holds what, as
/// before `build()` learned to refuse unwritable directories.
#[test]
fn list_and_holder_work_on_a_directory_the_user_may_only_read() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let tmp = tempfile::tempdir().unwrap();
    let locks = tmp.path().join("locks");
    std::fs::create_dir(&locks).unwrap();
    let record = format!(r#"{{"uuid":"u1","pid":{}}}"#, std::process::id());
    std::fs::write(lock_path(&locks, "nightly"), record).unwrap();
    let root = nix::unistd::geteuid().is_root();
    let exe = tmp.path().join("leasehold");
    std::fs::copy(env!("CARGO_BIN_EXE_leasehold"), &exe).unwrap();
    for path in [tmp.path(), &locks] {
        let mode = if root { 0o755 } else { 0o555 };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let d = locks.to_str().unwrap();
    for args in [vec!["list", "--dir", d], vec!["holder", "nightly", "--dir", d]] {
        let mut cmd = Command::new(&exe);
        cmd.args(&args).env_remove("LEASEHOLD_DIR").stdin(Stdio::null());
        if root {
            cmd.uid(65534).gid(65534);
        }
        // Just copied: `exec` may fail with ETXTBSY while a child another
        // test thread forked still holds the copy open; it passes in moments.
        let out = (0..200)
            .find_map(|_| match cmd.output() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                    std::thread::sleep(Duration::from_millis(10));
                    None
                }
                other => Some(other.unwrap()),
            })
            .expect("exec the copy");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: stdout {stdout} stderr {stderr}"
        );
        assert!(
            stdout.contains(&std::process::id().to_string()),
            "{args:?}: {stdout}"
        );
    }
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o700)).unwrap();
}

/// Writes `content` at `path`, last modified at `mtime`.
fn write_modified(path: &Path, content: impl AsRef<[u8]>, mtime: std::time::SystemTime) {
    std::fs::write(path, content).unwrap();
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
}

/// `leasehold clean --dir .` in a project, or `--dir /var/lock`, is one
/// typo away: files of data whose names end in `.lock` (Cargo.lock, a pid
/// file) are not locks, so `clean` keeps them and `list` does not show
/// them, in either strategy, however old they are.
#[test]
fn clean_and_list_leave_files_of_data_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    let files = [
        ("Cargo.lock", "version = 4\n\n[[package]]\nname = \"x\"\n"),
        ("daemon.lock", "1234\n"),
        ("flake.lock", "{\n  \"nodes\": {},\n  \"version\": 7\n}\n"),
    ];
    for (file, text) in files {
        let path = tmp.path().join(file);
        write_modified(&path, text, old);
    }
    let d = tmp.path().to_str().unwrap();
    for strategy in ["file", "dir"] {
        for args in [
            &["clean", "--dir", d, "--strategy", strategy][..],
            &["clean", "--dir", d, "--strategy", strategy, "--json"],
        ] {
            let done = finish(args);
            assert_eq!(done.code, Some(0), "{args:?}: {}", done.stderr);
            for (file, text) in files {
                let kept = std::fs::read_to_string(tmp.path().join(file));
                assert_eq!(kept.ok().as_deref(), Some(text), "{args:?}: {}", done.stdout);
            }
        }
        let listed = finish(&["list", "--dir", d, "--strategy", strategy, "--json"]);
        assert_eq!(listed.code, Some(0), "{}", listed.stderr);
        assert_eq!(listed.json(), Value::Array(vec![]), "{strategy}");
    }
}

/// A lock name that is not UTF-8 (the library's names are strings) is a
/// usage error: status 2, a message, nothing created, no panic.
#[test]
fn a_lock_name_that_is_not_utf8_is_a_usage_error() {
    use std::os::unix::ffi::OsStrExt;
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let odd = std::ffi::OsStr::from_bytes(b"job\xff");
    for sub in ["run", "holder"] {
        let mut cmd = leasehold(&[sub, "--dir", d]);
        cmd.arg(odd);
        if sub == "run" {
            cmd.arg("true");
        }
        let done = finish_cmd(cmd);
        assert_eq!(done.code, Some(2), "{sub}: {}", done.stderr);
        assert!(!done.stderr.contains("panicked"), "{sub}: {}", done.stderr);
        assert!(!done.stderr.is_empty(), "{sub}: says nothing");
    }
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}

/// A name over `MAX_NAME_LEN` is refused by every subcommand that takes
/// one, before the command runs or anything is written; one at the limit
/// works.
#[test]
fn names_over_the_limit_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_str().unwrap();
    let over = "n".repeat(leasehold::MAX_NAME_LEN + 1);
    let marker = tmp.path().join("ran");
    let touch = format!("touch {}", marker.display());
    for args in [
        vec!["run", over.as_str(), "--dir", d, "--", "sh", "-c", touch.as_str()],
        vec![
            "run",
            over.as_str(),
            "--dir",
            d,
            "--shared",
            "--",
            "sh",
            "-c",
            touch.as_str(),
        ],
        vec!["holder", over.as_str(), "--dir", d],
    ] {
        let done = finish(&args);
        assert_eq!(done.code, Some(2), "{}: {}", args[0], done.stderr);
        assert!(done.stderr.contains("invalid lock name"), "{}", done.stderr);
        assert!(done.stderr.len() < 1000, "{} bytes of stderr", done.stderr.len());
    }
    assert!(!marker.exists(), "the command ran");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    let at = "n".repeat(leasehold::MAX_NAME_LEN);
    let done = finish(&["run", &at, "--dir", d, "--", "sh", "-c", &touch]);
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    assert!(marker.exists());
}

#[path = "support/lock_files.rs"]
mod lock_files;

/// `leasehold clean --dir` pointed by mistake at a project directory (or
/// at `/var/lock`) leaves every other tool's lock file as it was, however
/// old: `bun.lock` (JSON with trailing commas) was deleted before.
#[test]
fn clean_leaves_the_lock_files_of_other_tools_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    let mut files = Vec::new();
    for (file, content) in lock_files::LOCK_FILES {
        // At its own name, and (for `package-lock.json` and the like)
        // where `clean` looks: at a name ending in `.lock`.
        files.push((file.to_string(), *content));
        if !file.ends_with(".lock") {
            files.push((format!("{file}.lock"), *content));
        }
    }
    for (file, content) in &files {
        let path = tmp.path().join(file);
        write_modified(&path, content, old);
    }
    let d = tmp.path().to_str().unwrap();
    for strategy in ["file", "dir"] {
        for args in [
            &["clean", "--dir", d, "--strategy", strategy, "--dry-run", "--json"][..],
            &["clean", "--dir", d, "--strategy", strategy, "--json"],
            &["clean", "--dir", d, "--strategy", strategy],
        ] {
            let done = finish(args);
            assert_eq!(done.code, Some(0), "{args:?}: {}", done.stderr);
            if args.contains(&"--json") {
                assert_eq!(done.json(), Value::Array(vec![]), "{args:?}");
            }
            for (file, content) in &files {
                let kept = std::fs::read(tmp.path().join(file)).ok();
                assert_eq!(
                    kept.as_deref(),
                    Some(*content),
                    "{args:?} {file}: {}",
                    done.stdout
                );
            }
        }
    }
    // The deliberate exception: an empty file, which a crash between a
    // lock file's create and its write leaves too, holds no data and is
    // cleaned once past the grace period.
    let (file, content) = lock_files::EMPTY_DOTLOCK;
    let empty = tmp.path().join(file);
    write_modified(&empty, content, old);
    let done = finish(&["clean", "--dir", d, "--strategy", "file"]);
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    assert!(!empty.exists(), "{}", done.stdout);
}

/// What is in `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The token a command printed as `token N`.
fn token_in(out: &str) -> u64 {
    out.lines()
        .find_map(|l| l.strip_prefix("token "))
        .unwrap_or_else(|| panic!("no token in {out:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("not a token ({e}): {out:?}"))
}

const PRINT_TOKEN: &str = "echo \"token $LEASEHOLD_FENCING_TOKEN\"";

/// A `run` with `args` (the lock and its options) whose command prints its
/// token and `started`, then holds the lock until `go` exists.
fn holding_until(args: &[&str], go: &Path) -> (Proc, u64) {
    let script = "echo \"token $LEASEHOLD_FENCING_TOKEN\"; echo started; i=0; \
                  while [ ! -e \"$1\" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done";
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--", "sh", "-c", script, "sh", go.to_str().unwrap()]);
    let p = Proc::spawn(leasehold(&all));
    let line = p.lines.recv_timeout(BOUND).expect("token line");
    let token = token_in(&line);
    p.expect_line("started");
    (p, token)
}

/// Issue 35: after `run`, nothing of leasehold's is left beside the lock
/// (no `.fence` counter), whatever the command did, for a path and for a
/// name, in both layouts and of every kind; and the tokens still grow.
#[test]
fn run_leaves_nothing_beside_its_lock_and_tokens_still_grow() {
    let tmp = tempfile::tempdir().unwrap();
    let locks = tmp.path().join("locks");
    std::fs::create_dir(&locks).unwrap();
    let d = locks.to_str().unwrap();
    let path = format!("{d}/backup.lock");
    let plain = format!("{d}/job");
    let fail = format!("{PRINT_TOKEN}; exit 3");
    let mut tokens = Vec::new();
    for strategy in ["file", "dir"] {
        for (lock, kind, script, code) in [
            (&path[..], &[][..], PRINT_TOKEN, 0),
            (&path, &[], &fail, 3),
            (&plain, &[], PRINT_TOKEN, 0),
            (&path, &["--shared"], PRINT_TOKEN, 0),
            (&path, &["--permits", "2"], &fail, 3),
            (&path, &[], PRINT_TOKEN, 0),
        ] {
            let mut args = vec!["run", "--strategy", strategy];
            args.extend_from_slice(kind);
            args.extend_from_slice(&[lock, "--", "sh", "-c", script]);
            let done = finish(&args);
            assert_eq!(done.code, Some(code), "{args:?}: {}", done.stderr);
            tokens.push(token_in(&done.stdout));
            assert_eq!(entries(&locks), Vec::<String>::new(), "{args:?} left files");
        }
        // A name in the lock directory, and a command that is not found.
        let done = finish(&[
            "run",
            "--strategy",
            strategy,
            "--dir",
            d,
            "job",
            "--",
            "sh",
            "-c",
            PRINT_TOKEN,
        ]);
        assert_eq!(done.code, Some(0), "{}", done.stderr);
        tokens.push(token_in(&done.stdout));
        assert_eq!(entries(&locks), Vec::<String>::new(), "a name left files");
        let done = finish(&["run", "--strategy", strategy, &path, "--", "/nonexistent/command"]);
        assert_eq!(done.code, Some(127), "{}", done.stderr);
        assert_eq!(
            entries(&locks),
            Vec::<String>::new(),
            "a missing command left files"
        );
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens of successive runs must strictly increase: {tokens:?}"
    );
}

/// Nothing left either when runs overlap: a run that waited for the lock,
/// shared runs that let go in turn; each later token above the earlier.
#[test]
fn overlapping_runs_leave_nothing_beside_their_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let locks = tmp.path().join("locks");
    std::fs::create_dir(&locks).unwrap();
    let path = format!("{}/backup.lock", locks.to_str().unwrap());
    let go = tmp.path().join("go");

    let (mut first, first_token) = holding_until(&[&path], &go);
    let waiter = Proc::spawn(leasehold(&[
        "run",
        "-w",
        "20",
        &path,
        "--",
        "sh",
        "-c",
        PRINT_TOKEN,
    ]));
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&go, "").unwrap();
    assert_eq!(first.wait().code(), Some(0));
    let line = waiter.lines.recv_timeout(BOUND).expect("the waiter's token");
    let mut waiter = waiter;
    assert_eq!(waiter.wait().code(), Some(0));
    assert!(token_in(&line) > first_token, "{line} after {first_token}");
    assert_eq!(entries(&locks), Vec::<String>::new(), "after a waiter");
    std::fs::remove_file(&go).unwrap();

    let go2 = tmp.path().join("go2");
    let (mut a, _) = holding_until(&["-s", &path], &go);
    let (mut b, _) = holding_until(&["-s", &path], &go2);
    std::fs::write(&go, "").unwrap();
    assert_eq!(a.wait().code(), Some(0));
    assert!(b.running());
    std::fs::write(&go2, "").unwrap();
    assert_eq!(b.wait().code(), Some(0));
    assert_eq!(entries(&locks), Vec::<String>::new(), "after shared runs");
}

/// A run killed while it holds its lock (SIGKILL: it cannot tidy up)
/// leaves the lock and its fencing counter: the next run of the lock
/// removes both, and so does `clean`; the next token is above the killed
/// run's.
#[test]
fn a_killed_runs_leftovers_go_with_the_next_run_or_clean() {
    let tmp = tempfile::tempdir().unwrap();
    let locks = tmp.path().join("locks");
    std::fs::create_dir(&locks).unwrap();
    let d = locks.to_str().unwrap();
    let path = format!("{d}/backup.lock");
    let go = tmp.path().join("go");
    let kill_holding = |args: &[&str]| {
        let (mut tool, token) = holding_until(args, &go);
        tool.signal(Signal::SIGKILL);
        assert_eq!(tool.wait().signal(), Some(9));
        assert_ne!(
            entries(&locks),
            Vec::<String>::new(),
            "a killed run cannot tidy up"
        );
        token
    };

    // The next run takes over the stale lock and removes both.
    let killed = kill_holding(&[&path]);
    assert_eq!(entries(&locks), ["backup.lock", "backup.lock.fence"]);
    let done = finish(&["run", &path, "--", "sh", "-c", PRINT_TOKEN]);
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    assert!(token_in(&done.stdout) > killed, "{} after {killed}", done.stdout);
    assert_eq!(entries(&locks), Vec::<String>::new(), "the next run left files");

    // `clean` removes both, for a path and for a name; --dry-run says so.
    kill_holding(&[&path]);
    kill_holding(&["--dir", d, "job"]);
    let dry = finish(&["clean", "--dir", d, "--dry-run", "--json"]);
    assert_eq!(dry.code, Some(0), "{}", dry.stderr);
    let listed = dry.json();
    let counters: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| {
            e["staleReason"]
                .as_str()
                .filter(|r| r.contains("fencing counter"))
                .and(e["name"].as_str())
        })
        .collect();
    assert_eq!(counters.len(), 2, "{}", dry.stdout);
    assert!(counters.contains(&"backup.lock.fence"), "{counters:?}");
    assert_eq!(entries(&locks).len(), 4, "--dry-run removed something");
    let done = finish(&["clean", "--dir", d]);
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    assert!(done.stdout.contains("backup.lock.fence"), "{}", done.stdout);
    assert_eq!(entries(&locks), Vec::<String>::new(), "clean left files");
}

/// flock(1)'s descriptor form (`exec 9>/var/lock/x; flock -n 9`) is
/// refused, saying what to write instead; a file named 9 is `./9`.
#[test]
fn flocks_descriptor_form_is_refused_and_a_file_named_9_works() {
    let tmp = tempfile::tempdir().unwrap();
    let ran = tmp.path().join("ran");
    let ran = ran.to_str().unwrap();
    for args in [
        &["run", "-n", "9", "touch", ran][..],
        &["run", "9"],
        &["run", "9", "-c", "true"],
        &["-n", "9"],
        &["9", "touch", ran],
    ] {
        let mut cmd = leasehold(args);
        cmd.current_dir(tmp.path());
        let done = finish_cmd(cmd);
        assert_eq!(done.code, Some(2), "{args:?}: {}", done.stderr);
        assert!(
            done.stderr.contains("descriptor form"),
            "{args:?}: {}",
            done.stderr
        );
        assert!(
            done.stderr.contains("leasehold run -n /var/lock/x -- cmd"),
            "{args:?} says what to write: {}",
            done.stderr
        );
        assert!(!Path::new(ran).exists(), "{args:?} ran the command");
        assert_eq!(entries(tmp.path()), Vec::<String>::new(), "{args:?} left files");
    }
    for args in [
        &["run", "-n", "./9", "touch", ran][..],
        &["run", "--file", "9", "--", "touch", ran],
    ] {
        let mut cmd = leasehold(args);
        cmd.current_dir(tmp.path());
        let done = finish_cmd(cmd);
        assert_eq!(done.code, Some(0), "{args:?}: {}", done.stderr);
        assert_eq!(entries(tmp.path()), ["ran"], "{args:?}");
        std::fs::remove_file(ran).unwrap();
    }
}

/// flock(1)'s own form: `leasehold -n /var/lock/x cmd`, the crontab line
/// with one word changed; a bare first word is a subcommand, never a lock.
#[test]
fn flocks_own_form_is_run_without_the_word() {
    let tmp = tempfile::tempdir().unwrap();
    let locks = tmp.path().join("locks");
    std::fs::create_dir(&locks).unwrap();
    let d = locks.to_str().unwrap();
    let path = format!("{d}/backup.lock");
    let go = tmp.path().join("go");

    let done = finish(&["-n", &path, "sh", "-c", "echo \"$LEASEHOLD_NAME\"; exit 4"]);
    assert_eq!(done.code, Some(4), "{}", done.stderr);
    assert_eq!(done.stdout.trim(), path);
    let done = finish(&[&path, "printf", "%s,", "-n", "x"]);
    assert_eq!(
        (done.code, &done.stdout[..]),
        (Some(0), "-n,x,"),
        "{}",
        done.stderr
    );
    assert_eq!(entries(&locks), Vec::<String>::new());

    // It excludes `run`, and gives up as flock -n does.
    let (mut holder, _) = holding_until(&[&path], &go);
    let busy = finish(&["-n", &path, "true"]);
    assert_eq!(busy.code, Some(1), "{}", busy.stderr);
    assert_eq!((busy.stdout.as_str(), busy.stderr.as_str()), ("", ""), "quiet");
    let busy = finish(&["-w", "0.2", "-E", "7", &path, "true"]);
    assert_eq!(busy.code, Some(7), "{}", busy.stderr);
    std::fs::write(&go, "").unwrap();
    assert_eq!(holder.wait().code(), Some(0));

    // A name, after an option.
    let done = finish(&["--dir", d, "-n", "job", "true"]);
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    // A bare first word is a subcommand: a typo never runs the command.
    let ran = tmp.path().join("ran");
    let done = finish(&["holdr", "touch", ran.to_str().unwrap()]);
    assert_eq!(done.code, Some(2), "{}", done.stderr);
    assert!(
        done.stderr.contains("holder"),
        "suggests the subcommand: {}",
        done.stderr
    );
    assert!(!ran.exists(), "a mistyped subcommand ran the command");
    assert_eq!(finish(&["--version"]).code, Some(0));
    assert_eq!(finish(&["list", "--dir", d]).code, Some(0));
}
