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
//! The locks live in one directory shared by every test process of the
//! workspace: `$LEASEHOLD_SERIAL_DIR` if set, else `leasehold-serial/` in
//! the Cargo target directory (`$CARGO_TARGET_DIR`, or the one the test
//! binary was built into), else a per-user directory under the system's
//! temporary directory. A test waits at most `$LEASEHOLD_SERIAL_TIMEOUT`
//! seconds (default 300), then panics naming the holder.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use crate::{Error, LockGuard, Locker};

/// Held while a test runs alone; dropping it lets the next test in.
#[derive(Debug)]
#[must_use = "the test is serialized only while the guard lives"]
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
    let locker = locker();
    match locker.acquire_timeout(name, timeout()).await {
        Ok(guard) => SerialGuard { _guard: guard },
        Err(Error::Timeout { waited, .. }) => {
            let holder = match locker.holder(name).await {
                Ok(Some(owner)) => format!(
                    "held by pid {} on {}",
                    owner.pid().map_or("?".into(), |p| p.to_string()),
                    owner.hostname().unwrap_or("?")
                ),
                _ => "holder unknown".into(),
            };
            panic!(
                "leasehold::testing::serial({name:?}): still {holder} after {waited:?} (lock directory {})",
                locker.directory().display()
            )
        }
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
    let run = |name: String| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("leasehold::testing::blocking_serial({name:?}): no runtime: {e}"));
        // The guard outlives this runtime: leases are renewed on a thread
        // of their own.
        runtime.block_on(serial(&name))
    };
    if tokio::runtime::Handle::try_current().is_err() {
        return run(name.to_owned());
    }
    // Inside a runtime a second one cannot block this thread: use another.
    let name = name.to_owned();
    std::thread::scope(|s| s.spawn(|| run(name)).join())
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

fn locker() -> &'static Locker {
    static LOCKER: OnceLock<Locker> = OnceLock::new();
    LOCKER.get_or_init(|| {
        let dir = directory();
        Locker::new(&dir).unwrap_or_else(|e| panic!("leasehold::testing: cannot use {}: {e}", dir.display()))
    })
}

fn timeout() -> Duration {
    let secs = std::env::var("LEASEHOLD_SERIAL_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    Duration::from_secs(secs)
}

fn directory() -> PathBuf {
    if let Some(dir) = std::env::var_os("LEASEHOLD_SERIAL_DIR") {
        return dir.into();
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(target).join("leasehold-serial");
    }
    // Test binaries live in `<target>/<profile>/deps/`.
    let exe = std::env::current_exe().ok();
    let target = exe
        .as_deref()
        .and_then(|exe| {
            exe.ancestors()
                .find(|p| p.file_name().is_some_and(|n| n == "deps"))
        })
        .and_then(|deps| deps.parent()?.parent());
    match target {
        Some(target) => target.join("leasehold-serial"),
        None => std::env::temp_dir().join(format!("leasehold-serial-{}", nix::unistd::geteuid())),
    }
}
