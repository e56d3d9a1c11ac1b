//! The test attributes `#[leasehold::serial(name)]` and
//! `#[leasehold::parallel(name)]` (feature `macros`), used as a test suite
//! uses them; and, through a scratch crate built with Cargo, that bad
//! arguments are compile errors that say what to write.
//!
//! Children (this test binary, tests/support/reexec.rs) try to take a name
//! while an attributed test holds it: they meet this process in the lock
//! directory of the tests, found from the executable's place.

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use leasehold::testing::{blocking_is_held, is_held};

#[path = "support/reexec.rs"]
mod reexec;

const ROLE: &str = "LEASEHOLD_TESTING_ATTR_ROLE";

/// In a child: take NAME as KIND once, waiting at most the 1 s the parent
/// set in `LEASEHOLD_SERIAL_TIMEOUT` (a panic, and so a failure, past it).
#[test]
fn child_process_entry() {
    let Ok(kind) = std::env::var(ROLE) else { return };
    let name = std::env::var("NAME").unwrap();
    match kind.as_str() {
        "serial" => drop(leasehold::testing::blocking_serial(&name)),
        _ => drop(leasehold::testing::blocking_parallel(&name)),
    }
    std::process::exit(0);
}

/// Whether another process can take `name` as `kind` ("serial" or
/// "parallel") now, trying for 1 s; the child is bounded and killed.
fn another_process_takes(kind: &str, name: &str) -> bool {
    let mut child = reexec::child_process()
        .env(ROLE, kind)
        .env("NAME", name)
        .env("LEASEHOLD_SERIAL_TIMEOUT", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child {} did not finish within 60 s", child.id());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if !status.success() {
        let mut stderr = String::new();
        child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        let expected = format!("{kind}({name:?})");
        assert!(
            stderr.contains(&expected) && stderr.contains(&format!("held by pid {}", std::process::id())),
            "the child failed for another reason than this process's hold:\n{stderr}"
        );
    }
    status.success()
}

#[leasehold::serial(testing_attr_sync_above)]
#[test]
fn serial_above_test() {
    assert!(blocking_is_held("testing_attr_sync_above"));
    assert!(!another_process_takes("parallel", "testing_attr_sync_above"));
}

#[test]
#[leasehold::serial("testing-attr-sync-below")]
fn serial_below_test_returning_result() -> std::io::Result<()> {
    assert!(blocking_is_held("testing-attr-sync-below"));
    assert!(!another_process_takes("serial", "testing-attr-sync-below"));
    std::fs::metadata(env!("CARGO_MANIFEST_DIR"))?;
    Ok(())
}

#[leasehold::parallel(testing_attr_async_above)]
#[tokio::test]
async fn parallel_above_tokio_test() {
    assert!(is_held("testing_attr_async_above").await);
    assert!(another_process_takes("parallel", "testing_attr_async_above"));
    assert!(!another_process_takes("serial", "testing_attr_async_above"));
}

#[tokio::test]
#[leasehold::parallel(testing_attr_async_below)]
async fn parallel_below_tokio_test_returning_result() -> Result<(), Box<dyn std::error::Error>> {
    assert!(is_held("testing_attr_async_below").await);
    assert!(!another_process_takes("serial", "testing_attr_async_below"));
    tokio::task::yield_now().await;
    "1".parse::<u8>()?;
    Ok(())
}

#[test]
#[leasehold::parallel(testing_attr_sync_parallel)]
fn parallel_below_test() {
    assert!(another_process_takes("parallel", "testing_attr_sync_parallel"));
    assert!(!another_process_takes("serial", "testing_attr_sync_parallel"));
}

#[leasehold::serial(testing_attr_let_go)]
fn fails_through_question_mark() -> Result<(), std::num::ParseIntError> {
    assert!(blocking_is_held("testing_attr_let_go"));
    "x".parse::<u8>()?;
    unreachable!()
}

#[leasehold::serial(testing_attr_let_go)]
fn panics() {
    assert!(blocking_is_held("testing_attr_let_go"));
    panic!("on purpose");
}

#[leasehold::parallel(testing_attr_let_go)]
async fn fails_async() -> Result<(), std::num::ParseIntError> {
    assert!(is_held("testing_attr_let_go").await);
    "x".parse::<u8>()?;
    unreachable!()
}

#[tokio::test]
async fn the_lock_is_let_go_however_the_function_ends() {
    tokio::task::spawn_blocking(|| {
        assert!(fails_through_question_mark().is_err());
        assert!(!blocking_is_held("testing_attr_let_go"));
        assert!(std::panic::catch_unwind(panics).is_err());
        assert!(!blocking_is_held("testing_attr_let_go"));
    })
    .await
    .unwrap();
    assert!(fails_async().await.is_err());
    assert!(!is_held("testing_attr_let_go").await);
}

/// The scratch crate's test files: uses that must compile (with warnings
/// denied), and bad ones with the error each must give, by line. (Unix
/// only: see the test.)
#[cfg(unix)]
const GOOD: &str = r#"#![deny(warnings)]

#[leasehold::serial(database)]
#[test]
fn sync_above() {}

#[test]
#[leasehold::parallel(database)]
fn sync_below() -> Result<(), std::io::Error> {
    std::fs::metadata(".")?;
    Ok(())
}

#[leasehold::serial("db-1")]
#[tokio::test]
async fn async_above() -> Result<(), Box<dyn std::error::Error>> {
    tokio::task::yield_now().await;
    Ok(())
}

#[tokio::test]
#[leasehold::parallel(r#type)]
async fn async_below() {}

#[leasehold::serial(first)]
#[leasehold::parallel(second)]
#[test]
fn two_names() {}

#[leasehold::serial(database)]
fn helper(x: u32) -> u32 {
    #![allow(unused_mut)]
    let mut y = x;
    y + 1
}

#[test]
fn calls_the_helper() {
    assert_eq!(helper(1), 2);
}
"#;

#[cfg(unix)]
const BAD: &str = r#"#[leasehold::serial]
#[test]
fn no_name() {}

#[leasehold::serial(42)]
#[test]
fn a_number() {}

#[leasehold::parallel(a, b)]
#[test]
fn two_names() {}

#[leasehold::parallel("")]
#[test]
fn empty() {}

#[leasehold::serial(database)]
struct NotAFunction;

#[leasehold::serial(database)]
const fn constant() {}

#[test]
fn uses_them() {
    no_name();
    a_number();
    two_names();
    empty();
    let _ = NotAFunction;
    constant();
}
"#;

/// (line in BAD, what its error says).
#[cfg(unix)]
const BAD_ERRORS: &[(usize, &str)] = &[
    (1, "`#[leasehold::serial]` needs the name of the lock to hold"),
    (
        5,
        "`#[leasehold::serial]` takes a lock name, an identifier or a string literal",
    ),
    (
        9,
        "`#[leasehold::parallel]` takes one lock name, and nothing after it",
    ),
    (13, "the lock name of `#[leasehold::parallel]` is empty"),
    (18, "`#[leasehold::serial]` goes on a function"),
    (21, "`#[leasehold::serial]` cannot go on a `const fn`"),
];

/// `cargo check --offline --test <test>` in `krate`, bounded in time; its
/// success and its stderr.
#[cfg(unix)]
fn cargo_check(krate: &std::path::Path, test: &str) -> (bool, String) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // Kept between runs: only the first one checks every dependency.
    let target = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("testing-attr-scratch");
    let stderr_path = krate.join(format!("{test}.stderr"));
    let mut child = std::process::Command::new(cargo)
        .args([
            "check",
            "--offline",
            "--color",
            "never",
            "--test",
            test,
            "--target-dir",
        ])
        .arg(&target)
        .current_dir(krate)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let within = Duration::from_secs(600);
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "cargo check (pid {}) did not finish within {within:?}",
                child.id()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status.success(), std::fs::read_to_string(stderr_path).unwrap())
}

// Cargo and rustc run here, on the machine that runs the tests: under Wine,
// where CI runs the Windows tests, there is no toolchain.
#[cfg(unix)]
#[test]
fn through_a_scratch_crate_good_uses_compile_and_bad_arguments_are_clear_errors() {
    let manifest_dir = env!("CARGO_MANIFEST_DIR");
    let dir = tempfile::tempdir().unwrap();
    let krate = dir.path();
    std::fs::write(
        krate.join("Cargo.toml"),
        format!(
            r#"[package]
name = "leasehold-attr-scratch"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
leasehold = {{ path = {manifest_dir:?}, features = ["macros"] }}
tokio = {{ version = "1", features = ["rt", "macros"] }}

[workspace]
"#
        ),
    )
    .unwrap();
    // The workspace's own versions, so that nothing need be downloaded.
    std::fs::copy(
        std::path::Path::new(manifest_dir).join("Cargo.lock"),
        krate.join("Cargo.lock"),
    )
    .unwrap();
    std::fs::create_dir_all(krate.join("src")).unwrap();
    std::fs::create_dir_all(krate.join("tests")).unwrap();
    std::fs::write(krate.join("src/lib.rs"), "").unwrap();
    std::fs::write(krate.join("tests/good.rs"), GOOD).unwrap();
    std::fs::write(krate.join("tests/bad.rs"), BAD).unwrap();

    let (ok, stderr) = cargo_check(krate, "good");
    assert!(ok, "the good uses did not compile:\n{stderr}");

    let (ok, stderr) = cargo_check(krate, "bad");
    assert!(!ok, "the bad uses compiled:\n{stderr}");
    println!("{stderr}"); // shown with --nocapture
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Each error, at its line, and no other.
    let text = format!("\n{stderr}");
    let errors: Vec<&str> = text
        .split("\nerror: ")
        .skip(1)
        .filter(|e| !e.starts_with("could not compile"))
        .collect();
    for (line, message) in BAD_ERRORS {
        let at = format!("tests/bad.rs:{line}:");
        assert!(
            errors.iter().any(|e| e.starts_with(message) && e.contains(&at)),
            "no error {message:?} at {at}:\n{stderr}"
        );
    }
    assert_eq!(errors.len(), BAD_ERRORS.len(), "{stderr}");
    // Each names the form to write.
    assert!(
        stderr.contains("write `#[leasehold::serial(database)]` or `#[leasehold::serial(\"db-1\")]`"),
        "{stderr}"
    );
}
