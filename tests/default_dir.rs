//! The default lock directory (`Locker::builder().build()` without
//! `.directory()`) depends on the user and the host only: processes of one
//! user started with different environments and working directories meet
//! in it, and exclude each other there.
//!
//! The tests use the real default directory (`/run/lock/leasehold-<uid>` on
//! Linux, `/tmp/leasehold-<uid>` elsewhere), with lock names unique to the
//! run; they take turns through `leasehold::testing`, and remove the
//! directory afterwards only if it did not exist before and is empty. Other
//! views of the mounts are made in the children's own mount namespaces:
//! the host's `/run/lock` and `/tmp` are never changed.
// The Unix default directory's rules (`/run/lock`, uids, modes, mount views); Windows' default directory is tests/windows.rs's.
#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

#[path = "support/reexec.rs"]
mod reexec;

const ROLE: &str = "LEASEHOLD_DEFAULT_DIR_ROLE";
const NAME: &str = "LEASEHOLD_DEFAULT_DIR_NAME";
/// No child outlives this, whatever the parent does.
const CHILD_TTL: Duration = Duration::from_secs(60);
/// How long any child may take to answer.
const BOUND: Duration = Duration::from_secs(30);

/// In a child: report the default directory, hold a lock in it until
/// killed, or try a lock once.
#[test]
fn child_process_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    std::thread::spawn(|| {
        std::thread::sleep(CHILD_TTL);
        std::process::exit(3);
    });
    let name = std::env::var(NAME).unwrap_or_default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let code = rt.block_on(async {
        let locker = match leasehold::Locker::builder().build() {
            Ok(locker) => locker,
            Err(e) => {
                let cause = std::error::Error::source(&e)
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                println!("@@error {e}: {cause}");
                return 1;
            }
        };
        match role.as_str() {
            "report" => println!("@@dir {}", locker.directory().display()),
            "hold" => {
                let _guard = locker.acquire(&name).await.unwrap();
                println!("@@held {}", locker.directory().display());
                tokio::time::sleep(CHILD_TTL).await;
            }
            "try" => match locker.try_acquire(&name).await.unwrap() {
                Some(guard) => {
                    guard.release().await.unwrap();
                    println!("@@free");
                }
                None => println!("@@busy"),
            },
            other => panic!("unknown role {other}"),
        }
        0
    });
    std::process::exit(code);
}

/// A child, killed by pid and reaped when dropped.
struct Kid {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Kid {
    fn spawn(mut command: Command) -> Self {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // libtest may have printed its "test ... " prefix first.
                if let Some((_, msg)) = line.split_once("@@")
                    && tx.send(msg.to_owned()).is_err()
                {
                    return;
                }
            }
        });
        Self { child, lines }
    }

    /// The child's next message.
    fn say(&self) -> String {
        self.lines
            .recv_timeout(BOUND)
            .unwrap_or_else(|_| panic!("child {} said nothing within {BOUND:?}", self.child.id()))
    }

    fn finish(mut self) {
        let deadline = Instant::now() + BOUND;
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                Instant::now() < deadline,
                "child {} still running",
                self.child.id()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// The environments a process of this user may find itself in.
struct Envs {
    tmp: tempfile::TempDir,
}

impl Envs {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        for sub in ["xdg-a", "xdg-b", "tmpdir", "home", "cwd"] {
            std::fs::create_dir(tmp.path().join(sub)).unwrap();
        }
        Self { tmp }
    }

    fn path(&self, sub: &str) -> PathBuf {
        self.tmp.path().join(sub)
    }

    /// This test binary as a child in the `index`th environment.
    fn command(&self, index: usize, role: &str, name: &str) -> (&'static str, Command) {
        let mut command = reexec::child_process();
        let what = match index {
            0 => "inherited environment",
            1 => {
                command.env("XDG_RUNTIME_DIR", self.path("xdg-a"));
                "XDG_RUNTIME_DIR=a"
            }
            2 => {
                command.env("XDG_RUNTIME_DIR", self.path("xdg-b"));
                "XDG_RUNTIME_DIR=b"
            }
            3 => {
                // As under cron: no XDG_RUNTIME_DIR, another TMPDIR.
                command
                    .env_remove("XDG_RUNTIME_DIR")
                    .env("TMPDIR", self.path("tmpdir"));
                "no XDG_RUNTIME_DIR, TMPDIR elsewhere"
            }
            4 => {
                command.env("HOME", self.path("home"));
                "HOME elsewhere"
            }
            5 => {
                command.env_clear().env("PATH", "/usr/bin:/bin");
                "PATH only"
            }
            6 => {
                command
                    .current_dir(self.path("cwd"))
                    .env("XDG_RUNTIME_DIR", "relative/run")
                    .env("TMPDIR", "relative-tmp");
                "another working directory, relative XDG_RUNTIME_DIR and TMPDIR"
            }
            _ => unreachable!(),
        };
        command.env(ROLE, role).env(NAME, name);
        (what, command)
    }
}

const ENVIRONMENTS: usize = 7;

/// The directory the documented rule names for this user: one fixed place
/// per platform, whatever the host looks like.
fn expected_directory() -> PathBuf {
    let root = if cfg!(target_os = "linux") {
        "/run/lock"
    } else {
        "/tmp"
    };
    Path::new(root)
        .canonicalize()
        .unwrap()
        .join(format!("leasehold-{}", nix::unistd::geteuid()))
}

/// Runs `body` alone among this file's tests (in any process), and removes
/// `dir` afterwards if it was not there before and is left empty.
fn with_default_dir(dir: &Path, body: impl FnOnce()) {
    let _serial = leasehold::testing::blocking_serial("leasehold-tests-default-directory");
    let existed = dir.exists();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    if !existed {
        let _ = std::fs::remove_dir(dir);
    }
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

fn unique_name(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("leasehold-test-{what}-{}-{nanos}", std::process::id())
}

#[test]
fn every_environment_of_one_user_has_the_same_default_directory() {
    let expected = expected_directory();
    with_default_dir(&expected, || {
        let envs = Envs::new();
        let mut reports = Vec::new();
        for index in 0..ENVIRONMENTS {
            let (what, command) = envs.command(index, "report", "");
            let kid = Kid::spawn(command);
            reports.push((kid.say(), what));
            kid.finish();
        }
        let (first, _) = &reports[0];
        assert!(
            reports.iter().all(|(said, _)| said == first),
            "the environments disagree: {reports:#?}"
        );
        assert_eq!(
            *first,
            format!("dir {}", expected.display()),
            "not the documented rule"
        );
        // Nothing was created where the environment pointed.
        for sub in ["xdg-a", "xdg-b", "tmpdir", "home", "cwd"] {
            assert_eq!(std::fs::read_dir(envs.path(sub)).unwrap().count(), 0, "{sub}");
        }
    });
}

#[test]
fn processes_with_different_environments_exclude_each_other_by_default() {
    let expected = expected_directory();
    with_default_dir(&expected, || {
        let envs = Envs::new();
        let name = unique_name("exclude");
        for holder_env in [1, 3] {
            let (holder_what, command) = envs.command(holder_env, "hold", &name);
            let holder = Kid::spawn(command);
            let held = holder.say();
            assert!(held.starts_with("held "), "{holder_what}: {held}");
            for index in (0..ENVIRONMENTS).filter(|&i| i != holder_env) {
                let (what, command) = envs.command(index, "try", &name);
                let kid = Kid::spawn(command);
                assert_eq!(kid.say(), "busy", "held with {holder_what}, tried with {what}");
                kid.finish();
            }
            drop(holder);
            // The holder is gone (SIGKILL): its lock is free to everyone.
            let (what, command) = envs.command(5, "try", &name);
            let kid = Kid::spawn(command);
            assert_eq!(kid.say(), "free", "{what} after the holder died");
            kid.finish();
        }
        let locker = leasehold::Locker::builder().build().unwrap();
        assert!(!locker.lock_path(&name).unwrap().exists());
    });
}

/// As `sudo -u`: another user's processes, whatever environment they carry
/// over, agree on that user's directory (not the caller's).
#[test]
fn another_user_with_the_callers_environment_uses_its_own_directory() {
    use std::os::unix::process::CommandExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to start processes as another user");
        return;
    }
    const NOBODY: u32 = 65534;
    let expected = expected_directory()
        .parent()
        .unwrap()
        .join(format!("leasehold-{NOBODY}"));
    with_default_dir(&expected, || {
        let envs = Envs::new();
        // The caller's XDG_RUNTIME_DIR and TMPDIR carried over, or none.
        for (what, mut command) in [
            envs.command(1, "report", ""),
            envs.command(3, "report", ""),
            envs.command(5, "report", ""),
        ] {
            command.uid(NOBODY).gid(NOBODY).current_dir("/");
            let kid = Kid::spawn(command);
            assert_eq!(
                kid.say(),
                format!("dir {}", expected.display()),
                "as uid {NOBODY}, {what}"
            );
            kid.finish();
        }
    });
}

/// The command-line tool uses the library's default: a lock held by a
/// library process is seen by `leasehold holder` run from cron's
/// environment.
#[cfg(feature = "cli")]
#[test]
fn the_cli_default_directory_ignores_the_environment() {
    let expected = expected_directory();
    with_default_dir(&expected, || {
        let envs = Envs::new();
        let name = unique_name("cli");
        let (_, command) = envs.command(2, "hold", &name);
        let holder = Kid::spawn(command);
        let held = holder.say();
        assert!(held.starts_with("held "), "{held}");
        for (index, xdg) in [(0, None), (1, Some("xdg-a")), (2, Some("tmpdir"))] {
            let mut cli = Command::new(env!("CARGO_BIN_EXE_leasehold"));
            cli.args(["holder", &name])
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                .env("TMPDIR", envs.path("tmpdir"))
                .current_dir(envs.path("cwd"))
                .stdin(Stdio::null());
            if let Some(xdg) = xdg {
                cli.env("XDG_RUNTIME_DIR", envs.path(xdg));
            }
            let out = cli.output().unwrap();
            assert_eq!(
                out.status.code(),
                Some(0),
                "case {index}: the lock must be seen as held: {out:?}"
            );
        }
        drop(holder);
        // Reclaim the killed holder's lock, leaving nothing behind.
        let (_, command) = envs.command(0, "try", &name);
        let kid = Kid::spawn(command);
        assert_eq!(kid.say(), "free");
        kid.finish();
    });
}

/// Under systemd's `ProtectSystem=strict` the default directory's root is
/// mounted read-only: `build()` fails at once instead of leaving every
/// acquisition to fail later.
#[test]
fn a_read_only_default_directory_fails_at_build() {
    let expected = expected_directory();
    let root = expected.parent().unwrap().to_owned();
    let probe = Command::new("unshare")
        .args(["-m", "mount", "-o", "bind,ro"])
        .arg(&root)
        .arg(&root)
        .stderr(Stdio::null())
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        eprintln!("skipped: cannot make a read-only mount namespace here");
        return;
    }
    with_default_dir(&expected, || {
        // The directory exists already, as it would after any earlier run.
        leasehold::Locker::builder().build().unwrap();
        let envs = Envs::new();
        let (_, child) = envs.command(0, "report", "");
        let mut command = Command::new("unshare");
        command
            .args(["-m", "sh", "-c", "mount -o bind,ro \"$0\" \"$0\" && exec \"$@\""])
            .arg(&root)
            .arg(child.get_program())
            .args(child.get_args())
            .envs(child.get_envs().filter_map(|(k, v)| Some((k, v?))));
        let kid = Kid::spawn(command);
        let said = kid.say();
        assert!(
            said.starts_with("error ") && said.contains("Read-only file system"),
            "{said}"
        );
        kid.finish();
    });
}

/// A process whose view of the mounts differs from the host's (its own
/// mount namespace, as a systemd unit's `PrivateTmp=`,
/// `TemporaryFileSystem=` or `BindPaths=`, a sandbox's fresh `/run`, or
/// `/run/lock` changed between two starts) never holds a lock by default
/// while a process with the host's view holds it too: it meets the other
/// in the same directory, or `build()` refuses and names the setting to
/// give. The host's `/run/lock` and `/tmp` are never touched: each
/// variation is a mount in the child's private namespace.
#[test]
fn a_process_with_another_view_of_the_mounts_never_splits_the_default() {
    let probe = Command::new("unshare")
        .args(["-m", "mount", "-t", "tmpfs", "tmpfs", "/mnt"])
        .stderr(Stdio::null())
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        eprintln!("skipped: cannot make a mount namespace here");
        return;
    }
    let expected = expected_directory();
    with_default_dir(&expected, || {
        let envs = Envs::new();
        use std::os::unix::fs::PermissionsExt;
        let plain = envs.path("plain");
        std::fs::create_dir(&plain).unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o755)).unwrap();
        let sticky = envs.path("sticky");
        std::fs::create_dir(&sticky).unwrap();
        std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let setups = [
            // `/run/lock` was 0755 when this process started.
            ("/run/lock not shared", "mount --bind \"$PLAIN\" /run/lock"),
            // No `/run/lock` at all (a fresh `/run`).
            ("no /run/lock", "mount -t tmpfs -o mode=0755 tmpfs /run"),
            // A `/run/lock` of its own that looks shared.
            (
                "a private /run/lock",
                "mount -t tmpfs -o mode=1777 tmpfs /run/lock",
            ),
            // systemd's PrivateTmp=.
            ("a private /tmp", "mount --bind \"$STICKY\" /tmp"),
        ];
        for (what, setup) in setups {
            let name = unique_name("view");
            let in_namespace = |role: &str| {
                let (_, child) = envs.command(0, role, &name);
                let mut command = Command::new("unshare");
                command
                    .args(["-m", "sh", "-c"])
                    .arg(format!("set -e; {setup}; exec \"$@\""))
                    .arg("sh")
                    .arg(child.get_program())
                    .args(child.get_args())
                    .envs(child.get_envs().filter_map(|(k, v)| Some((k, v?))))
                    .env("PLAIN", &plain)
                    .env("STICKY", &sticky);
                Kid::spawn(command)
            };
            let refused = |said: &str| said.starts_with("error ") && said.contains(".directory(");
            // It holds first, then a process with the host's view tries.
            let holder = in_namespace("hold");
            let said = holder.say();
            eprintln!("{what}: {said}");
            if said.starts_with("held ") {
                let (_, command) = envs.command(0, "try", &name);
                let kid = Kid::spawn(command);
                assert_eq!(
                    kid.say(),
                    "busy",
                    "{what}: held there as {said:?}, free on the host"
                );
                kid.finish();
            } else {
                assert!(refused(&said), "{what}: {said}");
            }
            drop(holder);
            // The other way round.
            let (_, command) = envs.command(0, "hold", &name);
            let holder = Kid::spawn(command);
            let held = holder.say();
            assert!(held.starts_with("held "), "{what}: {held}");
            let kid = in_namespace("try");
            let said = kid.say();
            assert!(
                said == "busy" || refused(&said),
                "{what}: held on the host, then {said:?}"
            );
            kid.finish();
            drop(holder);
            let (_, command) = envs.command(0, "try", &name);
            let kid = Kid::spawn(command);
            assert_eq!(kid.say(), "free", "{what}: after the holder died");
            kid.finish();
        }
    });
}

/// The command-line tool keeps the library's rule: where the default
/// cannot be shared with the rest of the host (here, a fresh `/run` in a
/// mount namespace of its own, with no `/run/lock`), `run` refuses without
/// running the command, and says to give `--dir`; with `--dir` it runs.
#[cfg(feature = "cli")]
#[test]
fn the_cli_refuses_a_default_it_cannot_share_and_names_dir() {
    let probe = Command::new("unshare")
        .args(["-m", "mount", "-t", "tmpfs", "tmpfs", "/mnt"])
        .stderr(Stdio::null())
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        eprintln!("skipped: cannot make a mount namespace here");
        return;
    }
    let envs = Envs::new();
    let ran = envs.path("ran");
    let in_namespace = |args: &[&std::ffi::OsStr]| {
        Command::new("unshare")
            .args(["-m", "sh", "-c"])
            .arg("set -e; mount -t tmpfs -o mode=0755 tmpfs /run; exec \"$@\"")
            .arg("sh")
            .arg(env!("CARGO_BIN_EXE_leasehold"))
            .args(args)
            .env_remove("LEASEHOLD_DIR")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let name = unique_name("cli-refused");
    let (name, touch) = (std::ffi::OsStr::new(&name), std::ffi::OsStr::new("touch"));
    for args in [
        vec![std::ffi::OsStr::new("run"), name, touch, ran.as_os_str()],
        vec![std::ffi::OsStr::new("holder"), name],
    ] {
        let out = in_namespace(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(
            stderr.contains("no default lock directory") && stderr.contains("--dir"),
            "{args:?}: {stderr}"
        );
        assert!(!ran.exists(), "{args:?}: the command ran");
    }
    let dir = envs.path("cwd");
    let out = in_namespace(&[
        std::ffi::OsStr::new("run"),
        std::ffi::OsStr::new("--dir"),
        dir.as_os_str(),
        name,
        touch,
        ran.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(ran.exists());
}
