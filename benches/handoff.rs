//! In-process handoff between tasks of one `Locker` on one name, against
//! `tokio::sync::Mutex` handoff in the same run.
//!
//! The tasks take the iterations from one counter until they are all
//! done, rather than a quarter each: with a quarter each, a task that fell
//! behind (its worker preempted on a loaded machine) finished alone, and
//! a lone task has nobody to hand to, so every one of its acquisitions
//! went to the disk (5 to 8 % of all of them in a run at load average 3,
//! which more than doubled the time per handoff).
//!
//! ```text
//! cargo bench --bench handoff
//! ```

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use leasehold::Locker;

const TASKS: u64 = 4;

fn handoff(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("in_process_handoff");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(4));

    let mutex = Arc::new(tokio::sync::Mutex::new(0u64));
    group.bench_function("tokio_mutex", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let mutex = Arc::clone(&mutex);
            async move {
                let start = Instant::now();
                let turns = Arc::new(AtomicU64::new(0));
                let tasks: Vec<_> = (0..TASKS)
                    .map(|_| {
                        let (mutex, turns) = (Arc::clone(&mutex), Arc::clone(&turns));
                        tokio::spawn(async move {
                            while turns.fetch_add(1, Relaxed) < iters {
                                *mutex.lock().await += 1;
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
                start.elapsed()
            }
        })
    });

    let locker = Locker::builder()
        .directory(dir.path())
        .durable(false)
        .build()
        .unwrap();
    group.bench_function("leasehold", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let locker = locker.clone();
            async move {
                let start = Instant::now();
                let turns = Arc::new(AtomicU64::new(0));
                let tasks: Vec<_> = (0..TASKS)
                    .map(|_| {
                        let (locker, turns) = (locker.clone(), Arc::clone(&turns));
                        tokio::spawn(async move {
                            while turns.fetch_add(1, Relaxed) < iters {
                                drop(locker.acquire("hot").await.unwrap());
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
                start.elapsed()
            }
        })
    });
    group.finish();
    let stats = locker.stats();
    println!(
        "leasehold: {} acquisitions, {} in-process handoffs, {} disk attempts",
        stats.acquisitions, stats.handoffs, stats.fs_attempts
    );
}

criterion_group!(benches, handoff);
criterion_main!(benches);
