//! What a user reads when `main` returns a `leasehold::Error`: its `Debug`
//! form, which must be as readable as its `Display` form (issue 35: a
//! derived `Debug` printed a 600-character dump of nested structs and
//! `SystemTime { tv_sec: .. }`).

use std::error::Error as _;
use std::time::Duration;

use leasehold::{Error, Locker, LossReason};

/// What no readable message shows: the derived form's internals.
fn assert_no_internals(text: &str) {
    for internal in ["tv_sec", "tv_nsec", "SystemTime", "Owner {", "Some("] {
        assert!(!text.contains(internal), "{internal:?} in {text}");
    }
}

#[tokio::test]
async fn a_timeout_with_a_holder_prints_one_short_line() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::new(dir.path()).unwrap();
    let _held = locker.acquire("jobs").await.unwrap();

    let other = Locker::new(dir.path()).unwrap();
    let err = other
        .acquire_timeout("jobs", Duration::from_millis(50))
        .await
        .unwrap_err();
    // The structured fields are still there for code.
    let holder = err.holder().expect("the waiter read the holder's record");
    assert_eq!(holder.pid(), Some(std::process::id()));
    assert!(holder.acquired_at().is_some());
    match &err {
        Error::Timeout { name, waited, .. } => {
            assert_eq!(name, "jobs");
            assert!(*waited >= Duration::from_millis(50));
        }
        other => panic!("expected a timeout, got {other}"),
    }

    let debug = format!("{err:?}");
    println!("{debug}");
    assert_eq!(debug, format!("Timeout: {err}"));
    assert!(debug.len() < 200, "{} characters: {debug}", debug.len());
    assert!(!debug.contains('\n'), "{debug}");
    assert!(
        debug.contains(&format!("held by pid {}", std::process::id())),
        "{debug}"
    );
    // The time the holder took it, as RFC 3339 in UTC.
    let since = debug.split(" since ").nth(1).expect("a time");
    assert!(
        since.len() == 24 && since.ends_with('Z') && since.as_bytes()[10] == b'T',
        "{since}"
    );
    assert_no_internals(&debug);
    // `{:#?}` too: a `main` may be printed either way.
    assert_no_internals(&format!("{err:#?}"));
}

/// What `fn main() -> Result<(), leasehold::Error>` prints: `Error: ` and
/// the `Debug` form.
#[test]
fn main_returning_the_error_prints_the_message() {
    fn main_like() -> Result<(), Error> {
        Err(Error::Lost {
            name: "jobs".into(),
            reason: LossReason::LeaseExpired,
        })
    }
    let printed = format!("Error: {:?}", main_like().unwrap_err());
    assert_eq!(
        printed,
        "Error: Lost: lock \"jobs\" was lost: the lease ran out before it could be renewed"
    );
}

/// `Display` leaves the cause to `source()`; `Debug`, the only thing
/// printed from `main`, says it too, so an I/O failure is not reduced to
/// "cannot open ...".
#[test]
fn debug_says_the_causes_that_display_leaves_out() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, b"").unwrap();
    let err = Locker::builder()
        .directory(file.join("locks"))
        .build()
        .unwrap_err();
    let cause = err.source().expect("an OS error behind it").to_string();
    assert!(!err.to_string().contains(&cause), "{err}");
    let debug = format!("{err:?}");
    println!("{debug}");
    assert!(debug.ends_with(&format!("{err}: {cause}")), "{debug}");
    // Starts with the variant's name, as code that tallies errors by their
    // `Debug` text expects (tests/faults.rs).
    let variant: String = debug.chars().take_while(|c| c.is_alphanumeric()).collect();
    assert!(
        ["Io", "PermissionDenied", "InvalidConfig"].contains(&variant.as_str()),
        "{debug}"
    );
    assert_no_internals(&debug);
}
