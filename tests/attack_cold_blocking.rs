//! The blocking API at its edges: a closure that panics under
//! `blocking_with_lock`, and blocking calls for the same name made from
//! inside such a closure.

use std::time::{Duration, Instant};

use leasehold::Locker;

#[path = "support/reexec.rs"]
mod reexec;

/// The other process: takes `LH_NAME` in `LH_DIR` at once, or exits 3.
#[test]
fn child_process_entry() {
    let Ok(dir) = std::env::var("LH_DIR") else {
        return;
    };
    let locker = Locker::new(&dir).unwrap();
    let name = std::env::var("LH_NAME").unwrap();
    let code = match locker.blocking_try_acquire(&name) {
        Ok(Some(_)) => 0,
        other => {
            eprintln!("{other:?}");
            3
        }
    };
    std::process::exit(code);
}

fn taken_at_once_by_another_process(dir: &std::path::Path, name: &str) -> bool {
    let out = reexec::child_process()
        .env("LH_DIR", dir)
        .env("LH_NAME", name)
        .output()
        .expect("child");
    out.status.success()
}

#[test]
fn a_panicking_closure_lets_the_lock_go_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::new(dir.path()).unwrap();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        locker.blocking_with_lock("p", || panic!("boom")).unwrap();
    }));
    assert!(caught.is_err());
    assert!(
        taken_at_once_by_another_process(dir.path(), "p"),
        "the lock outlived the panic"
    );
    // And this Locker is not wedged either.
    assert!(locker.blocking_try_acquire("p").unwrap().is_some());
}

#[test]
fn the_same_name_inside_blocking_with_lock_never_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::new(dir.path()).unwrap();
    let started = Instant::now();
    let inner = locker
        .blocking_with_lock("r", || {
            let tried = locker.blocking_try_acquire("r").map(|g| g.is_some());
            let waited = locker
                .blocking_acquire_timeout("r", Duration::from_millis(200))
                .map(|_| ());
            (tried, waited)
        })
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    let (tried, waited) = inner;
    // Whatever the answer (refused, timed out, or re-entered), it came,
    // and as a value.
    eprintln!("inside: try {tried:?}, timeout {waited:?}");
    assert!(
        !matches!(tried, Ok(true)) || waited.is_ok(),
        "{tried:?} {waited:?}"
    );
    assert!(taken_at_once_by_another_process(dir.path(), "r"));
}
