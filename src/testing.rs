//! Serializing tests that run in separate processes.
//!
//! `cargo nextest` runs every test in its own process, and `cargo test`
//! runs test binaries one after another but tests within one in parallel,
//! so an in-process mutex cannot keep two tests off a shared database, port
//! or directory. A leasehold lock can:
//!
//! ```no_run
//! #[tokio::test]
//! async fn migrates_the_database() {
//!     let _serial = leasehold::testing::serial("database").await;
//!     // ... no other test holding "database", in any process, runs now ...
//! }
//!
//! #[test]
//! fn resets_the_database() {
//!     let _serial = leasehold::testing::blocking_serial("database");
//!     // ...
//! }
//! ```
//!
//! # Where the locks live
//!
//! Every test process of one build must meet in one directory, whatever its
//! working directory and however the target directory was named (a relative
//! `CARGO_TARGET_DIR` means a different directory to each workspace member).
//! So the directory comes from where the running test executable is, never
//! from the working directory or `CARGO_TARGET_DIR`:
//!
//! 1. `$LEASEHOLD_SERIAL_DIR`, if set. It must be an absolute path: a
//!    relative one is refused with a panic, since each process would
//!    resolve it against its own working directory.
//! 2. Else `<target>/leasehold-serial`, where `<target>` is the Cargo target
//!    directory the executable (canonicalized) was built into: Cargo puts
//!    test and bench executables in `<target>/<profile>/deps/` (examples in
//!    `<profile>/examples/`) for any profile, and in
//!    `<target>/<triple>/<profile>/deps/` with `--target`, where `<target>`
//!    is recognized by Cargo's `.rustc_info.json` (without it, as in a
//!    nextest archive, a cross build's tests meet in `<target>/<triple>`).
//!    `cargo nextest` runs the same executables, also from an extracted
//!    archive (`<dir>/target/...`).
//! 3. Else, for an executable outside a target directory, such as a
//!    doctest that rustdoc built in a temporary directory, the per-user
//!    `leasehold-serial-<uid>` in the place of the
//!    [default lock directory](crate::LockerBuilder::directory)
//!    (`/run/lock` on Linux, `/private/tmp` on macOS, `/tmp` elsewhere), under its rules: it must
//!    belong to the user and be closed to others, and where that place
//!    cannot be used the test panics, naming `LEASEHOLD_SERIAL_DIR`. Such processes meet
//!    each other there, not the tests in the target directory: to put them
//!    all in one place, set `LEASEHOLD_SERIAL_DIR`.
//!
//! A test waits at most `$LEASEHOLD_SERIAL_TIMEOUT` seconds (default 300),
//! then panics naming the holder.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use crate::{Error, LockGuard, Locker};

/// Held while a test runs alone; dropping it lets the next test in.
///
/// # Examples
///
/// ```
/// let serial: leasehold::testing::SerialGuard = leasehold::testing::blocking_serial("database");
/// // ... no other test holding "database", in any process, runs now ...
/// drop(serial); // the next test may go
/// let again = leasehold::testing::blocking_serial("database");
/// # drop(again);
/// ```
#[derive(Debug)]
#[must_use = "the test is serialized only while the guard lives"]
#[clippy::has_significant_drop]
pub struct SerialGuard {
    _guard: LockGuard,
}

/// Waits until no other test holds `name`, in any process, and holds it
/// until the returned guard is dropped.
///
/// # Panics
///
/// This is for tests, where a panic is the failure report: it panics if the
/// lock directory cannot be used, or if `name` is still held after the
/// timeout, naming the holder's pid and host.
///
/// # Cancel safety
///
/// Cancel safe, as [`Locker::acquire`].
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let guard = leasehold::testing::serial("shared-port-8080").await;
/// // ... the test body ...
/// drop(guard);
/// # }
/// ```
pub async fn serial(name: &str) -> SerialGuard {
    serialized(name, locker().acquire_timeout(name, timeout()).await)
}

/// The guard of a serial lock taken, or the panic of one not taken.
fn serialized(name: &str, taken: crate::Result<LockGuard>) -> SerialGuard {
    match taken {
        Ok(guard) => SerialGuard { _guard: guard },
        Err(timeout @ Error::Timeout { .. }) => panic!(
            "leasehold::testing::serial({name:?}): {timeout} (lock directory {})",
            locker().directory().display()
        ),
        Err(error) => panic!("leasehold::testing::serial({name:?}): {error}"),
    }
}

/// [`serial`] for synchronous tests.
///
/// # Panics
///
/// As [`serial`].
///
/// # Examples
///
/// ```
/// let guard = leasehold::testing::blocking_serial("fixtures");
/// drop(guard);
/// ```
pub fn blocking_serial(name: &str) -> SerialGuard {
    let take = || locker().blocking_acquire_timeout(name, timeout());
    match take() {
        // Where the blocking API refuses to wait on this thread (in async
        // code, or on a thread that is exiting): wait on another.
        Err(Error::Unsupported { .. }) => {
            let taken = std::thread::scope(|s| s.spawn(take).join())
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            serialized(name, taken)
        }
        taken => serialized(name, taken),
    }
}

fn locker() -> &'static Locker {
    static LOCKER: OnceLock<Locker> = OnceLock::new();
    LOCKER.get_or_init(|| {
        let (dir, per_user) = directory();
        let cannot = |e: Error| -> ! {
            panic!(
                "leasehold::testing: cannot use {}: {e} (or set LEASEHOLD_SERIAL_DIR)",
                dir.display()
            )
        };
        if per_user {
            crate::fs::open_per_user("leasehold-serial", false, true).unwrap_or_else(|e| cannot(e));
        }
        Locker::new(&dir).unwrap_or_else(|e| cannot(e))
    })
}

fn timeout() -> Duration {
    let secs = std::env::var("LEASEHOLD_SERIAL_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    Duration::from_secs(secs)
}

/// The lock directory, and whether it is the per-user fallback (which
/// must then be private). See the module docs for the rule.
fn directory() -> (PathBuf, bool) {
    if let Some(dir) = std::env::var_os("LEASEHOLD_SERIAL_DIR").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        assert!(
            dir.is_absolute(),
            "leasehold::testing: LEASEHOLD_SERIAL_DIR must be an absolute path, not {:?}: \
             each test process would resolve it against its own working directory",
            dir
        );
        return (dir, false);
    }
    let exe = std::env::current_exe().and_then(|exe| exe.canonicalize()).ok();
    match exe.as_deref().and_then(target_directory) {
        Some(target) => (target.join("leasehold-serial"), false),
        None => (crate::fs::per_user_directory("leasehold-serial"), true),
    }
}

/// The Cargo target directory that `exe` was built into, from where Cargo
/// puts it: `<target>[/<triple>]/<profile>/{deps,examples}/<exe>`.
fn target_directory(exe: &Path) -> Option<PathBuf> {
    let parent = exe.parent()?;
    if !matches!(parent.file_name()?.to_str()?, "deps" | "examples") {
        return None;
    }
    let above_profile = parent.parent()?.parent()?;
    // Cargo keeps `.rustc_info.json` in the target directory itself, not
    // in the `<triple>` directory of a cross build.
    let marker = ".rustc_info.json";
    match above_profile.parent() {
        Some(target) if !above_profile.join(marker).exists() && target.join(marker).exists() => {
            Some(target.to_owned())
        }
        _ => Some(above_profile.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::target_directory;
    use std::path::Path;

    #[test]
    fn the_target_directory_is_found_from_the_executable() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        std::fs::create_dir_all(target.join("x86_64-unknown-linux-gnu/release-lto/deps")).unwrap();
        std::fs::write(target.join(".rustc_info.json"), "{}").unwrap();
        for exe in [
            "debug/deps/serial-0123abcd",
            "release/deps/serial-0123abcd",
            "release-lto/deps/serial-0123abcd",
            "debug/examples/demo-0123abcd",
            "x86_64-unknown-linux-gnu/release-lto/deps/serial-0123abcd",
        ] {
            assert_eq!(
                target_directory(&target.join(exe)).as_deref(),
                Some(&*target),
                "{exe}"
            );
        }
        // Without the marker (a nextest archive, say), a cross build's
        // executables still agree among themselves.
        assert_eq!(
            target_directory(Path::new("/a/target/wasm32-wasip1/debug/deps/t-1")).as_deref(),
            Some(Path::new("/a/target/wasm32-wasip1"))
        );
        for outside in ["/tmp/rustdoctestXYZ/rust_out", "/usr/bin/t", "/t"] {
            assert_eq!(target_directory(Path::new(outside)), None, "{outside}");
        }
    }
}
