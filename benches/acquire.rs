//! Uncontended acquire + release against the raw syscall floor, in one run.
//!
//! ```text
//! cargo bench --bench acquire
//! ```

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use leasehold::Locker;

fn uncontended(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("uncontended_acquire_release");
    group.measurement_time(Duration::from_secs(3));

    // The floor: create-exclusive + write a record of the same size + close
    // + unlink, no fsync.
    let record = vec![b' '; 420];
    let raw = dir.path().join("raw.lock");
    group.bench_function("raw_syscall_floor", |b| {
        b.iter(|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&raw)
                .unwrap();
            f.write_all(&record).unwrap();
            drop(f);
            std::fs::remove_file(&raw).unwrap();
        })
    });

    let fast = Locker::builder()
        .directory(dir.path())
        .durable(false)
        .build()
        .unwrap();
    group.bench_function("leasehold_not_durable", |b| {
        b.to_async(&rt)
            .iter(|| async { drop(fast.acquire("bench").await.unwrap()) })
    });

    let durable = Locker::new(dir.path()).unwrap();
    group.bench_function("leasehold_durable", |b| {
        b.to_async(&rt)
            .iter(|| async { drop(durable.acquire("bench").await.unwrap()) })
    });
    group.finish();
}

criterion_group!(benches, uncontended);
criterion_main!(benches);
