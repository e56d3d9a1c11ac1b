//! A counting semaphore across processes: at most two jobs on the GPU at
//! once, however many workers want it.
//!
//! ```text
//! cargo run --example semaphore
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold::{Locker, Result};

#[tokio::main]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let on_gpu = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));

    let mut workers = Vec::new();
    for n in 0..6 {
        // A Locker each: as six processes would.
        let gpu = Locker::new(dir.path())?.semaphore("gpu", 2)?;
        let (on_gpu, most) = (Arc::clone(&on_gpu), Arc::clone(&most));
        workers.push(tokio::spawn(async move {
            let permit = gpu.acquire().await?;
            let now = on_gpu.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            println!("job {n} on the GPU ({now} running)");
            tokio::time::sleep(Duration::from_millis(50)).await;
            on_gpu.fetch_sub(1, Ordering::SeqCst);
            drop(permit);
            Ok::<_, leasehold::Error>(())
        }));
    }
    for worker in workers {
        worker.await.expect("worker task")?;
    }
    println!("at most {} at once", most.load(Ordering::SeqCst));
    assert!(most.load(Ordering::SeqCst) <= 2);
    Ok(())
}
