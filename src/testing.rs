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
//! #[tokio::test]
//! async fn reads_the_database() {
//!     let _parallel = leasehold::testing::parallel("database").await;
//!     // ... other `parallel("database")` tests may run now, never a
//!     // `serial("database")` one ...
//! }
//!
//! #[test]
//! fn resets_the_database() {
//!     let _serial = leasehold::testing::blocking_serial("database");
//!     // ...
//! }
//! ```
//!
//! [`serial`] takes a name exclusively (a writer's lock), [`parallel`]
//! shared (a reader's lock): tests holding `parallel` of one name run
//! together, and a `serial` one of that name runs alone. A `serial` test
//! that waits keeps new `parallel` ones back, so it is not starved.
//! [`is_held`] tells whether anyone holds a name now. A test takes each
//! name once: taking again a name it holds, in either mode, may wait for
//! itself until the timeout (a second `parallel` queues behind a `serial`
//! test that waits for the first).
//!
//! # Attributes
//!
//! With the `macros` feature, `#[leasehold::serial(name)]` and
//! `#[leasehold::parallel(name)]` do the same for a whole test, with no
//! change to its body, for `#[test]` and `#[tokio::test]` functions
//! alike, above or below that attribute:
//!
//! ```toml
//! [dev-dependencies]
//! leasehold = { version = "0.1", features = ["macros"] }
//! ```
//!
#![cfg_attr(feature = "macros", doc = "```no_run")]
#![cfg_attr(not(feature = "macros"), doc = "```ignore")]
//! #[leasehold::serial(database)]
//! #[tokio::test]
//! async fn migrates_the_database() -> Result<(), Box<dyn std::error::Error>> {
//!     // ... as if the body began with `let _g = serial("database").await;`
//!     Ok(())
//! }
//!
//! #[test]
//! #[leasehold::parallel(database)]
//! fn reads_the_database() {
//!     // ... as if it began with `let _g = blocking_parallel("database");`
//! }
//! ```
//!
//! The name is an identifier or a string literal
//! (`#[leasehold::serial("db-1")]`); anything else is a compile error.
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
//! [`serial`] and [`parallel`] of one name use one lock there, so they
//! exclude each other across processes as well as threads.
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
    let taken = locker().acquire_timeout(name, timeout()).await;
    SerialGuard {
        _guard: held("serial", name, taken),
    }
}

/// The guard of a lock taken, or the panic of one not taken.
fn held(what: &str, name: &str, taken: crate::Result<LockGuard>) -> LockGuard {
    match taken {
        Ok(guard) => guard,
        Err(timeout @ Error::Timeout { .. }) => panic!(
            "leasehold::testing::{what}({name:?}): {timeout} (lock directory {})",
            locker().directory().display()
        ),
        Err(error) => panic!("leasehold::testing::{what}({name:?}): {error}"),
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
    let taken = match take() {
        // Where the blocking API refuses to wait on this thread (in async
        // code, or on a thread that is exiting): wait on another.
        Err(Error::Unsupported { .. }) => std::thread::scope(|s| s.spawn(take).join())
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
        taken => taken,
    };
    SerialGuard {
        _guard: held("serial", name, taken),
    }
}

/// Held while a test runs beside others of its name; dropping it lets a
/// [`serial`] test of that name in once the last of them has gone.
///
/// # Examples
///
/// ```
/// use leasehold::testing::{ParallelGuard, blocking_parallel};
///
/// let guard: ParallelGuard = blocking_parallel("reference-data");
/// // ... other tests holding `parallel("reference-data")` run beside this one ...
/// drop(guard); // a serial test of "reference-data" may go
/// ```
#[derive(Debug)]
#[must_use = "the test keeps serial tests out only while the guard lives"]
#[clippy::has_significant_drop]
pub struct ParallelGuard {
    _guard: LockGuard,
}

/// Waits until no test holds `name` through [`serial`] (or waits to), in
/// any process, and holds it shared until the returned guard is dropped:
/// any number of tests holding `parallel(name)` run at once, and no
/// `serial(name)` test runs beside them.
///
/// A [`serial`] test that waits for `name` goes first: a `parallel` test
/// that comes after it waits until it is done, so a steady stream of
/// parallel tests cannot starve it.
///
/// # Panics
///
/// As [`serial`]: if the lock directory cannot be used, or if `name` is
/// still held by a `serial` test after the timeout, naming the holder.
///
/// # Cancel safety
///
/// Cancel safe, as [`Locker::acquire_shared`].
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let reader = leasehold::testing::parallel("shared-fixtures").await;
/// let another = leasehold::testing::parallel("shared-fixtures").await; // no wait
/// assert!(leasehold::testing::is_held("shared-fixtures").await);
/// drop((reader, another));
/// # }
/// ```
pub async fn parallel(name: &str) -> ParallelGuard {
    let taken = locker().acquire_shared_timeout(name, timeout()).await;
    ParallelGuard {
        _guard: held("parallel", name, taken),
    }
}

/// [`parallel`] for synchronous tests. It may also be called from async
/// code: it then blocks the calling thread while it waits.
///
/// # Panics
///
/// As [`parallel`].
///
/// # Examples
///
/// ```
/// let guard = leasehold::testing::blocking_parallel("fixtures");
/// drop(guard);
/// ```
pub fn blocking_parallel(name: &str) -> ParallelGuard {
    block_on(parallel(name))
}

/// Whether any test (or anything else using the lock directory of these
/// tests) holds `name` now, through [`serial`] or [`parallel`], in this
/// process or another. The answer may be out of date as soon as it is
/// returned: use it in assertions and diagnostics, not to decide whether to
/// take a lock.
///
/// # Panics
///
/// If the lock directory cannot be used or read, or `name` is not a valid
/// lock name.
///
/// # Cancel safety
///
/// Cancel safe: it only reads.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use leasehold::testing::{is_held, serial};
///
/// let guard = serial("is-held-example").await;
/// assert!(is_held("is-held-example").await);
/// drop(guard);
/// assert!(!is_held("is-held-example").await);
/// # }
/// ```
pub async fn is_held(name: &str) -> bool {
    match locker().is_held(name).await {
        Ok(held) => held,
        Err(error) => panic!("leasehold::testing::is_held({name:?}): {error}"),
    }
}

/// [`is_held`] for synchronous tests.
///
/// # Panics
///
/// As [`is_held`].
///
/// # Examples
///
/// ```
/// let guard = leasehold::testing::blocking_parallel("blocking-is-held-example");
/// assert!(leasehold::testing::blocking_is_held("blocking-is-held-example"));
/// drop(guard);
/// ```
pub fn blocking_is_held(name: &str) -> bool {
    block_on(is_held(name))
}

/// Runs `fut` to completion on a thread of its own, under a runtime of its
/// own, wherever it is called from (in async code, too, where the blocking
/// API refuses to wait). Guards outlive that runtime: their leases are
/// renewed on the `Locker`'s own thread.
fn block_on<F>(fut: F) -> F::Output
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap_or_else(|e| panic!("leasehold::testing: cannot start a runtime: {e}"))
                .block_on(fut)
        })
        .join()
    })
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
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
