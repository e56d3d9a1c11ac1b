//! `leasehold::testing` puts its locks in one directory for every test
//! process of a build, derived from the test executable's place in the
//! target directory: not from the working directory, and not from a
//! (possibly relative) `CARGO_TARGET_DIR`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "support/reexec.rs"]
mod reexec;

const ROLE: &str = "LEASEHOLD_SERIAL_DIR_TEST_ROLE";
const NAME: &str = "LEASEHOLD_SERIAL_DIR_TEST_NAME";
const ROUNDS: usize = 10;
/// No child outlives this, whatever the parent does.
const CHILD_TTL: Duration = Duration::from_secs(90);

/// In a child: take turns on a name through `blocking_serial`, logging
/// entry and exit; or take it once.
#[test]
fn child_process_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    std::thread::spawn(|| {
        std::thread::sleep(CHILD_TTL);
        std::process::exit(3);
    });
    let name = std::env::var(NAME).unwrap();
    match role.as_str() {
        "turns" => {
            let log = std::env::var("LOG").unwrap();
            for _ in 0..ROUNDS {
                let _serial = leasehold::testing::blocking_serial(&name);
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(&log)
                    .unwrap();
                writeln!(f, "S {}", std::process::id()).unwrap();
                std::thread::sleep(Duration::from_millis(5));
                writeln!(f, "E {}", std::process::id()).unwrap();
            }
        }
        "once" => drop(leasehold::testing::blocking_serial(&name)),
        other => panic!("unknown role {other}"),
    }
    std::process::exit(0);
}

/// A child, killed by pid and reaped when dropped.
struct Kid(Child);

impl Kid {
    fn with(mut command: Command) -> Self {
        Self(
            command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    }

    /// Waits for the child; returns whether it succeeded and its stderr.
    fn wait(&mut self, within: Duration) -> (bool, String) {
        let deadline = Instant::now() + within;
        let status = loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "child {} still running after {within:?}",
                self.0.id()
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut stderr = String::new();
        self.0.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        (status.success(), stderr)
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            // SIGKILL by pid on Unix, TerminateProcess on Windows.
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// This test binary as a child in `cwd`, with `CARGO_TARGET_DIR` set to
/// `target` (or unset), and a description of that for messages.
fn child(role: &str, name: &str, cwd: &Path, target: Option<&str>) -> (Command, String) {
    let mut command = reexec::child_process();
    command
        .current_dir(cwd)
        .env(ROLE, role)
        .env(NAME, name)
        .env_remove("LEASEHOLD_SERIAL_DIR")
        .env_remove("CARGO_TARGET_DIR");
    if let Some(target) = target {
        command.env("CARGO_TARGET_DIR", target);
    }
    (
        command,
        format!("cwd {}, CARGO_TARGET_DIR {target:?}", cwd.display()),
    )
}

fn unique_name(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("leasehold-test-{what}-{}-{nanos}", std::process::id())
}

/// Where the documented rule puts this build's serial locks: this
/// executable is `<target>/<profile>/deps/<name>`, or
/// `<target>/<triple>/<profile>/deps/<name>` with `--target` (the target
/// directory is the one holding Cargo's `.rustc_info.json`).
fn expected_directory() -> PathBuf {
    let exe = std::env::current_exe().unwrap().canonicalize().unwrap();
    let above_profile = exe.ancestors().nth(3).unwrap();
    let marker = ".rustc_info.json";
    let target = match above_profile.parent() {
        Some(up) if !above_profile.join(marker).exists() && up.join(marker).exists() => up,
        _ => above_profile,
    };
    target.join("leasehold-serial")
}

/// Working directories at different depths, as the packages of a
/// workspace are, each with its own idea of the target directory.
fn scattered(tmp: &Path) -> Vec<(PathBuf, Option<String>)> {
    let member = tmp.join("ws/crates/member");
    let nested = tmp.join("ws/crates/group/nested");
    let elsewhere = tmp.join("elsewhere");
    for dir in [&member, &nested, &elsewhere] {
        std::fs::create_dir_all(dir).unwrap();
    }
    vec![
        (member.clone(), Some("target".into())),
        (nested.clone(), Some("../target".into())),
        (member, Some(tmp.join("absolute-target").display().to_string())),
        (nested, None),
        (elsewhere, Some("../target".into())),
    ]
}

#[test]
fn test_processes_in_different_directories_with_different_target_dirs_take_turns() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("log");
    let name = unique_name("turns");
    let mut kids: Vec<_> = scattered(tmp.path())
        .into_iter()
        .map(|(cwd, target)| {
            let (mut command, what) = child("turns", &name, &cwd, target.as_deref());
            command.env("LOG", &log);
            (Kid::with(command), what)
        })
        .collect();
    for (kid, what) in &mut kids {
        let (ok, stderr) = kid.wait(Duration::from_secs(60));
        assert!(ok, "child with {what} failed: {stderr}");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2 * ROUNDS * kids.len());
    for pair in lines.chunks(2) {
        assert!(
            pair[0].starts_with('S') && pair[1].starts_with('E'),
            "overlap: {pair:?}"
        );
        assert_eq!(pair[0][2..], pair[1][2..], "overlap: {pair:?}");
    }
    // Nothing was put where the working directory or CARGO_TARGET_DIR
    // pointed.
    for entry in walk(tmp.path()) {
        assert!(!entry.ends_with("leasehold-serial"), "{}", entry.display());
    }
}

#[test]
fn serial_locks_live_in_the_target_directory_the_test_was_built_into() {
    let tmp = tempfile::tempdir().unwrap();
    let expected = expected_directory();
    let name = unique_name("where");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let locker = leasehold::Locker::new(&expected).unwrap();
    let held = rt.block_on(locker.acquire(&name)).unwrap();
    let mut kids: Vec<_> = scattered(tmp.path())
        .into_iter()
        .map(|(cwd, target)| {
            let (mut command, what) = child("once", &name, &cwd, target.as_deref());
            command.env("LEASEHOLD_SERIAL_TIMEOUT", "1");
            (Kid::with(command), what)
        })
        .collect();
    for (kid, what) in &mut kids {
        let (ok, stderr) = kid.wait(Duration::from_secs(30));
        assert!(!ok, "child with {what} got the lock the parent holds");
        let holder = format!("held by pid {}", std::process::id());
        let dir = format!("lock directory {}", expected.display());
        assert!(
            stderr.contains(&holder) && stderr.contains(&dir),
            "{what}: {stderr}"
        );
    }
    rt.block_on(held.release()).unwrap();
}

#[test]
fn a_relative_serial_dir_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut command, _) = child("once", &unique_name("relative"), tmp.path(), None);
    command.env("LEASEHOLD_SERIAL_DIR", "locks");
    let (ok, stderr) = Kid::with(command).wait(Duration::from_secs(30));
    assert!(!ok, "a relative LEASEHOLD_SERIAL_DIR was accepted");
    assert!(
        stderr.contains("LEASEHOLD_SERIAL_DIR must be an absolute path"),
        "{stderr}"
    );
    assert!(!tmp.path().join("locks").exists());
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(walk(&path));
        }
        found.push(path);
    }
    found
}
