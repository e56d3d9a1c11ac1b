//! The shortest accepted lease against busy neighbours on a real disk.
//!
//! A test binary of its own: its neighbours' fsyncs stall other writes on
//! the same disk, and the configuration grid in `tests/config.rs`, running
//! beside it, would measure the disk rather than the configurations.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::{Locker, Strategy};

/// The shortest accepted lease, renewed every half lease, on a real disk,
/// while three other `Locker`s take and release other names with durable
/// fencing as fast as they can: every renewal needs the directory lock
/// they keep taking, and still the holder keeps its lock.
#[test]
fn the_shortest_lease_survives_busy_fencing_neighbours() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let lease = Duration::from_millis(200);
    let holder = Locker::builder()
        .directory(dir.path())
        .strategy(Strategy::ExclusiveFile)
        .lease(lease)
        .renew_interval(lease / 2)
        .build()
        .unwrap();
    let guard = runtime.block_on(holder.acquire("victim")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let neighbours: Vec<_> = (0..3)
        .map(|n| {
            let locker = Locker::builder()
                .directory(dir.path())
                .fencing(true)
                .build()
                .unwrap();
            let stop = Arc::clone(&stop);
            runtime.spawn(async move {
                let name = format!("neighbour-{n}");
                let mut rounds = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    locker.acquire(&name).await.unwrap().release().await.unwrap();
                    rounds += 1;
                }
                rounds
            })
        })
        .collect();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) && !guard.is_lost() {
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    let rounds: u64 = neighbours.into_iter().map(|n| runtime.block_on(n).unwrap()).sum();
    assert!(rounds > 10, "the neighbours barely ran: {rounds}");
    assert!(
        !guard.is_lost(),
        "lost after {:?} ({rounds} neighbour rounds): {:?}",
        started.elapsed(),
        runtime.block_on(guard.ensure_held())
    );
}
