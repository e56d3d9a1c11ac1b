//! The three kinds of lock side by side, in one run: uncontended acquire +
//! release, and a handoff between two `Locker`s (two processes' worth of
//! state) taking turns on one name.
//!
//! ```text
//! cargo bench --bench kinds
//! ```
//!
//! | group / function | what one iteration does |
//! |---|---|
//! | `kinds_acquire_release/exclusive` | `acquire` + drop |
//! | `kinds_acquire_release/shared` | `acquire_shared` + drop (joins and leaves a group: members record, marker, under the directory lock) |
//! | `kinds_acquire_release/shared_joining_a_held_group` | `acquire_shared` + drop while another `Locker` holds the name shared |
//! | `kinds_acquire_release/semaphore_4` | a permit of a 4-permit semaphore + drop |
//! | `kinds_handoff/exclusive` | two `Locker`s alternate: each waits for the other's release |
//! | `kinds_handoff/semaphore_1` | the same with a 1-permit semaphore |
//!
//! `durable(false)`, so the numbers are the protocol's, not the disk's.

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use leasehold::Locker;

fn locker(dir: &std::path::Path) -> Locker {
    Locker::builder().directory(dir).durable(false).build().unwrap()
}

fn acquire_release(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (a, b) = (locker(dir.path()), locker(dir.path()));
    let mut group = c.benchmark_group("kinds_acquire_release");
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    group.bench_function("exclusive", |bench| {
        bench
            .to_async(&rt)
            .iter(|| async { drop(a.acquire("bench-exclusive").await.unwrap()) })
    });
    group.bench_function("shared", |bench| {
        bench
            .to_async(&rt)
            .iter(|| async { drop(a.acquire_shared("bench-shared").await.unwrap()) })
    });
    let held = rt.block_on(b.acquire_shared("bench-joined")).unwrap();
    group.bench_function("shared_joining_a_held_group", |bench| {
        bench
            .to_async(&rt)
            .iter(|| async { drop(a.acquire_shared("bench-joined").await.unwrap()) })
    });
    drop(held);
    let semaphore = a.semaphore("bench-semaphore", 4).unwrap();
    group.bench_function("semaphore_4", |bench| {
        bench
            .to_async(&rt)
            .iter(|| async { drop(semaphore.acquire().await.unwrap()) })
    });
    group.finish();
}

fn handoff(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (a, b) = (locker(dir.path()), locker(dir.path()));
    let mut group = c.benchmark_group("kinds_handoff");
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(4));
    group.sample_size(20);
    group.bench_function("exclusive", |bench| {
        bench.to_async(&rt).iter_custom(|iters| {
            let (a, b) = (a.clone(), b.clone());
            async move {
                let start = Instant::now();
                let other = tokio::spawn(async move {
                    for _ in 0..iters {
                        drop(b.acquire("bench-handoff").await.unwrap());
                    }
                });
                for _ in 0..iters {
                    drop(a.acquire("bench-handoff").await.unwrap());
                }
                other.await.unwrap();
                start.elapsed() / 2
            }
        })
    });
    let (sa, sb) = (
        a.semaphore("bench-handoff-1", 1).unwrap(),
        b.semaphore("bench-handoff-1", 1).unwrap(),
    );
    group.bench_function("semaphore_1", |bench| {
        bench.to_async(&rt).iter_custom(|iters| {
            let (sa, sb) = (sa.clone(), sb.clone());
            async move {
                let start = Instant::now();
                let other = tokio::spawn(async move {
                    for _ in 0..iters {
                        drop(sb.acquire().await.unwrap());
                    }
                });
                for _ in 0..iters {
                    drop(sa.acquire().await.unwrap());
                }
                other.await.unwrap();
                start.elapsed() / 2
            }
        })
    });
    group.finish();
}

criterion_group!(benches, acquire_release, handoff);
criterion_main!(benches);
