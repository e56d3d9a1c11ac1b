//! A semaphore from plain threads, with no async runtime anywhere: five
//! encoders (standing for five processes) share two GPU slots, and never
//! more than two run at once.
//!
//! ```text
//! cargo run --example blocking_semaphore
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold::{Locker, Result};

fn main() -> Result<()> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let running = Arc::new(AtomicUsize::new(0));
    let encoders: Vec<_> = (1..=5)
        .map(|n| {
            // One Locker each, as separate processes would have; all agree
            // on the count.
            let gpu = Locker::new(dir.path())?.semaphore("gpu", 2)?;
            let running = Arc::clone(&running);
            Ok(std::thread::spawn(move || -> Result<()> {
                let permit = gpu.blocking_acquire()?;
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                println!("encoder-{n}: encoding ({now} of {} slots in use)", gpu.permits());
                assert!(now <= 2, "more encoders than slots");
                std::thread::sleep(Duration::from_millis(40));
                running.fetch_sub(1, Ordering::SeqCst);
                drop(permit);
                Ok(())
            }))
        })
        .collect::<Result<_>>()?;
    for encoder in encoders {
        encoder.join().expect("encoder thread")?;
    }

    // Without waiting, and with a bound.
    let gpu = Locker::new(dir.path())?.semaphore("gpu", 2)?;
    let (a, b) = (gpu.blocking_acquire()?, gpu.blocking_try_acquire()?);
    println!("both slots taken: {}", b.is_some());
    match gpu.blocking_acquire_timeout(Duration::from_millis(50)) {
        Err(e) if e.is_timeout() => println!("a third encoder gave up: {e}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    drop((a, b));
    Ok(())
}
