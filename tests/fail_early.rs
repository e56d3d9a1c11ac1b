//! `build()` refuses a directory it could not lock in, rather than the
//! first acquisition: not a directory, not writable (by mode, as another
//! user, or on a read-only mount), or open to everyone without the sticky
//! bit.
// Permission modes and other users (`chmod`, running as `nobody`) have no Windows twins.
#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use leasehold::{Error, Locker};

// Only `child_process_of` is used here.
#[allow(dead_code)]
#[path = "support/reexec.rs"]
mod reexec;

/// In a child (see `run_child`), builds a Locker on the directory given
/// and prints how that went.
const CHILD_ENV: &str = "LEASEHOLD_FAIL_EARLY_DIR";

#[test]
fn child_process_entry() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let outcome = match Locker::new(&dir) {
        Ok(_) => "built".to_owned(),
        Err(Error::PermissionDenied { .. }) => "permission denied".to_owned(),
        Err(e @ Error::Io { .. }) => format!(
            "io: {}",
            std::error::Error::source(&e)
                .map(|s| s.to_string())
                .unwrap_or_default()
        ),
        Err(other) => format!("other: {other}"),
    };
    println!("@@{outcome}");
    std::process::exit(0);
}

/// Runs this test binary as a child that builds a Locker on `dir`, through
/// `wrap` (a command and its arguments run before it); returns its report.
fn run_child(dir: &Path, wrap: &[&str], uid: Option<u32>) -> String {
    run_child_exe(&std::env::current_exe().unwrap(), dir, wrap, uid)
}

fn run_child_exe(me: &Path, dir: &Path, wrap: &[&str], uid: Option<u32>) -> String {
    let mut cmd = reexec::child_process_of(me, wrap);
    cmd.env(CHILD_ENV, dir);
    if let Some(uid) = uid {
        use std::os::unix::process::CommandExt;
        cmd.uid(uid).gid(uid);
    }
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = spawn_copied(&mut cmd);
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child {} ran over 60 s", child.id());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.split_once("@@").map(|(_, report)| report))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no report: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)))
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[test]
fn a_file_where_the_directory_should_be_is_refused() {
    let scratch = tempfile::tempdir().unwrap();
    let file = scratch.path().join("locks");
    std::fs::write(&file, "not a directory").unwrap();
    assert!(matches!(Locker::new(&file), Err(Error::InvalidConfig { .. })));
    // Below a file: nothing can be created.
    let below = file.join("inner");
    assert!(
        matches!(Locker::new(&below), Err(Error::Io { .. })),
        "{:?}",
        Locker::new(&below)
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "not a directory",
        "left untouched"
    );
}

#[test]
fn a_dangling_symlink_is_refused_and_left_alone() {
    let scratch = tempfile::tempdir().unwrap();
    let link = scratch.path().join("locks");
    std::os::unix::fs::symlink(scratch.path().join("nowhere"), &link).unwrap();
    assert!(Locker::new(&link).is_err());
    assert!(
        !scratch.path().join("nowhere").exists(),
        "nothing created through the link"
    );
}

#[test]
fn a_world_writable_directory_without_the_sticky_bit_is_refused() {
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(matches!(
        Locker::new(scratch.path()),
        Err(Error::InsecureDirectory { .. })
    ));
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    assert!(Locker::new(scratch.path()).is_ok(), "sticky, as /tmp: accepted");
}

#[test]
fn a_directory_this_user_cannot_write_is_refused_at_build() {
    let scratch = tempfile::tempdir().unwrap();
    let locks = scratch.path().join("locks");
    std::fs::create_dir(&locks).unwrap();
    std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o555)).unwrap();
    if is_root() {
        // Root writes whatever the mode says, so root may lock there.
        assert!(Locker::new(&locks).is_ok());
        // Another user may not: build as `nobody`, in a child.
        std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o755)).unwrap();
        // A copy of this test binary that `nobody` may run, wherever the
        // build directory is.
        let exe = scratch.path().join("fail_early");
        std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
        assert_eq!(run_child_exe(&exe, &locks, &[], Some(65534)), "permission denied");
    } else {
        assert!(matches!(Locker::new(&locks), Err(Error::PermissionDenied { .. })));
    }
    // And once it is writable, build works.
    std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert!(Locker::new(&locks).is_ok());
}

#[test]
fn a_read_only_mount_is_refused_at_build() {
    let scratch = tempfile::tempdir().unwrap();
    let mount = scratch.path().join("ro");
    std::fs::create_dir(&mount).unwrap();
    // A private mount namespace with a read-only tmpfs on `mount`, as root
    // or as a mapped root in a user namespace.
    let flag = if is_root() { "-m" } else { "-rm" };
    let probe = Command::new("unshare").args([flag, "true"]).status();
    if !probe.is_ok_and(|s| s.success()) {
        eprintln!("skipped: this machine cannot make a mount namespace (unshare {flag})");
        return;
    }
    let script = format!("mount -t tmpfs -o ro tmpfs '{}' && exec \"$@\"", mount.display());
    let report = run_child(&mount, &["unshare", flag, "sh", "-c", &script, "sh"], None);
    assert_eq!(report, "io: Read-only file system (os error 30)");
}

/// Spawns `cmd`, whose program was just copied: a child another test
/// thread forks while the copy is open for writing holds that descriptor
/// until it execs, and meanwhile `exec` of the copy fails with `ETXTBSY`.
/// It passes in moments, so retry.
fn spawn_copied(cmd: &mut Command) -> std::process::Child {
    let mut tries = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 200 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other.unwrap(),
        }
    }
}
