//! In-process handoff between tasks of one `Locker` on one name, against
//! `tokio::sync::Mutex` handoff in the same run.
//!
//! ```text
//! cargo bench --bench handoff
//! ```

use std::sync::Arc;
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
                let tasks: Vec<_> = (0..TASKS)
                    .map(|_| {
                        let mutex = Arc::clone(&mutex);
                        tokio::spawn(async move {
                            for _ in 0..iters.div_ceil(TASKS) {
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
                let tasks: Vec<_> = (0..TASKS)
                    .map(|_| {
                        let locker = locker.clone();
                        tokio::spawn(async move {
                            for _ in 0..iters.div_ceil(TASKS) {
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
