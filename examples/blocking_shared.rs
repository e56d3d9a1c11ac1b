//! Readers and a writer from plain threads, with no async runtime anywhere:
//! the readers of a catalog overlap, the writer that rebuilds it runs
//! alone, and readers that come while it waits queue behind it.
//!
//! ```text
//! cargo run --example blocking_shared
//! ```

use std::time::Duration;

use leasehold::{Locker, Result};

fn main() -> Result<()> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (reading, started) = std::sync::mpsc::channel();
    // One Locker each, as separate processes would have.
    let reader = |who: &'static str| -> Result<_> {
        let locker = Locker::new(dir.path())?;
        let reading = reading.clone();
        Ok(std::thread::spawn(move || -> Result<()> {
            let guard = locker.blocking_acquire_shared("catalog")?;
            println!("{who}: reading (shared: {})", guard.is_shared());
            reading.send(()).expect("main thread");
            std::thread::sleep(Duration::from_millis(100));
            println!("{who}: done reading");
            Ok(())
        }))
    };
    let first = [reader("reader-1")?, reader("reader-2")?];
    for _ in &first {
        started.recv().expect("a reader started");
    }

    let locker = Locker::new(dir.path())?;
    println!("holders now: {}", locker.blocking_holders("catalog")?.len());
    // A writer that will not wait for the readers.
    assert!(locker.blocking_try_acquire("catalog")?.is_none());
    println!("writer: the readers are in, not waiting");
    // One that waits: it gets in once both readers are done.
    let writer = locker.blocking_acquire("catalog")?;
    println!("writer: rebuilding, alone");
    // A reader that waits at most 50 ms gives up while the writer is in.
    let late = Locker::new(dir.path())?;
    match late.blocking_acquire_shared_timeout("catalog", Duration::from_millis(50)) {
        Err(e) if e.is_timeout() => println!("late reader: gave up ({e})"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    drop(writer);
    println!("writer: done");
    assert!(late.blocking_try_acquire_shared("catalog")?.is_some());
    println!("late reader: reading");
    for thread in first {
        thread.join().expect("reader thread")?;
    }
    Ok(())
}
