//! The blocking API from a plain `fn main`, with no async runtime anywhere:
//! two threads (standing for two processes) take turns on one lock.
//!
//! ```text
//! cargo run --example blocking
//! ```

use std::time::Duration;

use leasehold::{Locker, Result};

fn main() -> Result<()> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let builds: Vec<_> = ["build-a", "build-b"]
        .into_iter()
        .map(|who| {
            // One Locker each, as two processes would have.
            let locker = Locker::new(dir.path())?;
            Ok(std::thread::spawn(move || -> Result<()> {
                for round in 0..2 {
                    let guard = locker.blocking_acquire("codegen")?;
                    println!("{who}: regenerating (round {round})");
                    std::thread::sleep(Duration::from_millis(50));
                    println!("{who}: done");
                    drop(guard);
                }
                Ok(())
            }))
        })
        .collect::<Result<_>>()?;
    for build in builds {
        build.join().expect("thread")?;
    }

    // A build that will not wait long.
    let locker = Locker::new(dir.path())?;
    let held = locker.blocking_acquire("codegen")?;
    let impatient = Locker::new(dir.path())?;
    match impatient.blocking_acquire_timeout("codegen", Duration::from_millis(100)) {
        Err(e) if e.is_timeout() => println!("gave up: {e}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    drop(held);
    Ok(())
}
