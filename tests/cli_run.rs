//! `leasehold run` on every platform, Windows included (run under Wine in
//! CI): exit statuses, `-c`, a second run of a held name, and CMD dying
//! with a killed tool (on Unix through its watchdog, on Windows through the
//! Job object). Portable on purpose: no nix, no shell, nothing of
//! tests/support/. CMD is this very test binary, started as the `helper`
//! test with `LH_MODE` saying what to do; it bounds its own life.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long any one process may take before the test fails: generous, so a
/// loaded machine (or Wine starting up) is never mistaken for a bug.
const BOUND: Duration = Duration::from_secs(30);

/// The longest a helper lives, should its test fail to stop it.
const HELPER_LIFE: Duration = Duration::from_secs(60);

/// The tool, with a clean environment as far as it cares.
fn leasehold(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    cmd.args(args)
        .env_remove("LEASEHOLD_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    cmd
}

/// `leasehold run NAME --dir DIR [options] -- HELPER` with `mode` and
/// `path` for the helper (see [`helper`]).
fn run_helper(dir: &Path, options: &[&str], mode: &str, path: &Path) -> Command {
    let dir = dir.to_str().expect("utf-8 temp dir");
    let mut args = vec!["run", "job", "--dir", dir];
    args.extend_from_slice(options);
    let exe = std::env::current_exe().expect("test binary");
    let exe = exe.to_str().expect("utf-8 test binary path");
    args.extend_from_slice(&["--", exe, "--exact", "helper", "--nocapture", "--test-threads=1"]);
    let mut cmd = leasehold(&args);
    cmd.env("LH_MODE", mode).env("LH_PATH", path);
    cmd
}

/// A process killed (SIGKILL on Unix, `TerminateProcess` on Windows) and
/// reaped when dropped.
struct Proc(Child);

impl Proc {
    fn spawn(mut cmd: Command) -> Self {
        Self(cmd.spawn().expect("spawn"))
    }

    /// Waits for the exit; panics after [`BOUND`].
    fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + BOUND;
        loop {
            if let Some(status) = self.0.try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "process {} still running", self.0.id());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn running(&mut self) -> bool {
        self.0.try_wait().expect("try_wait").is_none()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `cmd` to its end within [`BOUND`]: its exit code.
fn finish(cmd: Command) -> Option<i32> {
    Proc::spawn(cmd).wait().code()
}

/// Waits until `path` exists; panics after [`BOUND`].
fn await_file(path: &Path) {
    let deadline = Instant::now() + BOUND;
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Not a test of its own: the command the tests run under the lock, as
/// `LH_MODE` says (nothing without it):
/// - `exit:N`: exits with N, after checking `LEASEHOLD_NAME`;
/// - `hold`: creates `LH_PATH.started`, then exits 0 once `LH_PATH.go`
///   exists;
/// - `tree`: starts a copy of itself in mode `beat` on `LH_PATH.grandchild`,
///   then beats on `LH_PATH.child` itself;
/// - `beat`: appends a byte to `LH_PATH` every 20 ms.
#[test]
fn helper() {
    let Ok(mode) = std::env::var("LH_MODE") else {
        return;
    };
    let path = PathBuf::from(std::env::var_os("LH_PATH").expect("LH_PATH"));
    let with = |suffix: &str| {
        let mut p = path.clone().into_os_string();
        p.push(suffix);
        PathBuf::from(p)
    };
    let born = Instant::now();
    match mode.split_once(':') {
        Some(("exit", code)) => {
            assert_eq!(std::env::var("LEASEHOLD_NAME").as_deref(), Ok("job"));
            std::process::exit(code.parse().expect("exit code"));
        }
        None if mode == "hold" => {
            std::fs::write(with(".started"), b"").expect("started");
            while !with(".go").exists() && born.elapsed() < HELPER_LIFE {
                std::thread::sleep(Duration::from_millis(20));
            }
            std::process::exit(0);
        }
        None if mode == "tree" => {
            // Not waited for: it must die with the tool, not with us.
            #[allow(clippy::zombie_processes)]
            let _grandchild = Command::new(std::env::current_exe().expect("exe"))
                .args(["--exact", "helper", "--nocapture", "--test-threads=1"])
                .env("LH_MODE", "beat")
                .env("LH_PATH", with(".grandchild"))
                .stdin(Stdio::null())
                .spawn()
                .expect("grandchild");
            beat(&with(".child"), born);
        }
        None if mode == "beat" => beat(&path, born),
        _ => panic!("unknown LH_MODE {mode:?}"),
    }
}

/// Appends a byte to `path` every 20 ms until [`HELPER_LIFE`] is over.
fn beat(path: &Path, born: Instant) -> ! {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("beat file");
    while born.elapsed() < HELPER_LIFE {
        let _ = file.write_all(b".");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::process::exit(0);
}

fn len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Waits until the file `path` has been written and then stops growing for
/// a second: whoever beats on it is dead. Panics if it still grows after
/// `within`.
fn await_silence(path: &Path, within: Duration) {
    let deadline = Instant::now() + within;
    let (mut last, mut since) = (len(path), Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now = len(path);
        if now != last {
            (last, since) = (now, Instant::now());
        } else if now > 0 && since.elapsed() >= Duration::from_secs(1) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} still grows {within:?} later: its writer outlived the tool",
            path.display()
        );
    }
}

#[test]
fn the_commands_exit_status_is_passed_through() {
    let tmp = tempfile::tempdir().unwrap();
    let at = tmp.path().join("unused");
    for code in [0, 7, 200] {
        let done = finish(run_helper(tmp.path(), &[], &format!("exit:{code}"), &at));
        assert_eq!(done, Some(code));
    }
    // Windows passes CMD's exit code on whole; a Unix status is one byte.
    #[cfg(windows)]
    assert_eq!(finish(run_helper(tmp.path(), &[], "exit:300", &at)), Some(300));
}

#[test]
fn dash_c_runs_the_string_through_the_shell() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let out = tmp.path().join("out");
    let out_s = out.to_str().unwrap();
    // `exit N` and `echo ... > FILE` mean the same to sh and to cmd.
    assert_eq!(
        finish(leasehold(&["run", "job", "--dir", dir, "-c", "exit 5"])),
        Some(5)
    );
    // Quotes inside the string reach the shell as they are: cmd prints
    // them, sh takes them off; the environment reaches the shell too.
    #[cfg(unix)]
    let (script, expected) = (format!("echo \"a  b\" $LEASEHOLD_NAME > '{out_s}'"), "a  b job");
    #[cfg(windows)]
    let (script, expected) = (
        format!("echo \"a  b\" %LEASEHOLD_NAME%> \"{out_s}\""),
        "\"a  b\" job",
    );
    assert_eq!(
        finish(leasehold(&["run", "job", "--dir", dir, "-c", &script])),
        Some(0)
    );
    let got = std::fs::read_to_string(&out).unwrap();
    assert_eq!(got.trim_end(), expected);
}

#[test]
fn a_second_run_of_a_held_name_waits_or_gives_up() {
    let tmp = tempfile::tempdir().unwrap();
    let gate = tmp.path().join("gate");
    let mut first = Proc::spawn(run_helper(tmp.path(), &[], "hold", &gate));
    let mut started = gate.clone().into_os_string();
    started.push(".started");
    await_file(Path::new(&started));
    let unused = tmp.path().join("unused");

    assert_eq!(
        finish(run_helper(tmp.path(), &["-n"], "exit:0", &unused)),
        Some(1)
    );
    assert_eq!(
        finish(run_helper(
            tmp.path(),
            &["--no-wait", "-E", "9"],
            "exit:0",
            &unused
        )),
        Some(9)
    );
    let asked = Instant::now();
    assert_eq!(
        finish(run_helper(tmp.path(), &["--timeout", "0.5"], "exit:0", &unused)),
        Some(1)
    );
    assert!(asked.elapsed() >= Duration::from_millis(500), "gave up early");

    // A waiting run gets the lock once the first one ends.
    let mut second = Proc::spawn(run_helper(tmp.path(), &["--wait", "25"], "exit:4", &unused));
    std::thread::sleep(Duration::from_millis(300));
    assert!(second.running(), "the second run did not wait");
    let mut go = gate.into_os_string();
    go.push(".go");
    std::fs::write(&go, b"").unwrap();
    assert_eq!(first.wait().code(), Some(0));
    assert_eq!(second.wait().code(), Some(4));
}

/// Kills the tool (SIGKILL on Unix, `TerminateProcess` on Windows) while
/// CMD and a child of CMD run: both stop within seconds, and the next run
/// takes the lock. Under Wine as on Windows, the kernel (wineserver) ends a
/// Job object's processes when its last handle closes with its process.
#[test]
fn a_killed_tool_takes_the_command_and_its_children_with_it() {
    let tmp = tempfile::tempdir().unwrap();
    let beat = tmp.path().join("beat");
    let mut tool = Proc::spawn(run_helper(tmp.path(), &[], "tree", &beat));
    let (child, grandchild) = (tmp.path().join("beat.child"), tmp.path().join("beat.grandchild"));
    let deadline = Instant::now() + BOUND;
    while len(&child) == 0 || len(&grandchild) == 0 {
        assert!(Instant::now() < deadline, "the command never beat");
        std::thread::sleep(Duration::from_millis(20));
    }
    tool.0.kill().unwrap();
    tool.wait();
    await_silence(&child, Duration::from_secs(10));
    await_silence(&grandchild, Duration::from_secs(10));
    let unused = tmp.path().join("unused");
    assert_eq!(
        finish(run_helper(tmp.path(), &["--wait", "20"], "exit:3", &unused)),
        Some(3)
    );
}

/// The lock taken away while CMD runs (its file renamed): the tool stops
/// CMD and its children (Unix: SIGTERM, then SIGKILL after --kill-after;
/// Windows: `TerminateJobObject` at once) and exits 75.
#[test]
fn a_lost_lock_stops_the_command_and_exits_75() {
    let tmp = tempfile::tempdir().unwrap();
    let beat = tmp.path().join("beat");
    let dir = tmp.path().to_str().unwrap();
    let mut tool = Proc::spawn(run_helper(
        tmp.path(),
        &["--lease", "3", "--kill-after", "0.3"],
        "tree",
        &beat,
    ));
    let (child, grandchild) = (tmp.path().join("beat.child"), tmp.path().join("beat.grandchild"));
    let deadline = Instant::now() + BOUND;
    while len(&child) == 0 || len(&grandchild) == 0 {
        assert!(Instant::now() < deadline, "the command never beat");
        std::thread::sleep(Duration::from_millis(20));
    }
    let path = leasehold::Locker::new(dir).unwrap().lock_path("job").unwrap();
    // Renamed away, not removed: Windows (and Wine) keep a removed file's
    // name while the tool holds it open, delete pending, and the holder
    // would see nothing amiss.
    let mut aside = path.clone().into_os_string();
    aside.push(".aside");
    std::fs::rename(&path, &aside).unwrap();
    assert_eq!(tool.wait().code(), Some(75));
    await_silence(&child, Duration::from_secs(10));
    await_silence(&grandchild, Duration::from_secs(10));
}
