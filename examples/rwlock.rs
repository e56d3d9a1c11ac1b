//! A reader/writer lock across processes: readers of a catalog overlap, the
//! nightly rebuild runs alone, and a waiting rebuild is not starved by a
//! steady stream of readers.
//!
//! ```text
//! cargo run --example rwlock
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold::{Locker, Result};

#[tokio::main]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir().expect("temporary directory");
    // Two Lockers on one directory behave as two processes would.
    let readers = Locker::new(dir.path())?;
    let writer = Locker::new(dir.path())?;
    let reading = Arc::new(AtomicUsize::new(0));

    let mut tasks = Vec::new();
    for n in 0..4 {
        let (readers, reading) = (readers.clone(), Arc::clone(&reading));
        tasks.push(tokio::spawn(async move {
            let guard = readers.acquire_shared("catalog").await?;
            let now = reading.fetch_add(1, Ordering::SeqCst) + 1;
            println!("reader {n} in ({now} reading; shared: {})", guard.is_shared());
            tokio::time::sleep(Duration::from_millis(100)).await;
            reading.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, leasehold::Error>(())
        }));
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    println!("holders now: {}", writer.holders("catalog").await?.len());

    // The rebuild waits for the readers it found; readers that come after
    // it wait for it.
    let rebuild = writer.acquire("catalog").await?;
    println!("rebuild in, {} reading", reading.load(Ordering::SeqCst));
    assert_eq!(reading.load(Ordering::SeqCst), 0);
    drop(rebuild);

    for task in tasks {
        task.await.expect("reader task")?;
    }
    println!("done");
    Ok(())
}
