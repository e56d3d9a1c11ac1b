//! Uncontended acquire + release against the raw syscall floors, in one run.
//!
//! ```text
//! cargo bench --bench acquire
//! ```
//!
//! One criterion group, `uncontended_acquire_release`, measures side by side:
//!
//! | function | what one iteration does |
//! |---|---|
//! | `raw_file_floor` | `open(O_CREAT\|O_EXCL)` + write a record of leasehold's size + close + unlink |
//! | `raw_file_floor_fdatasync` | the same, with `fdatasync` before close (compare with `durable(true)`) |
//! | `raw_directory_floor` | mkdir a temp dir + write `owner.json` in it + rename it onto the lock path + unlink `owner.json` + rmdir |
//! | `std_flock_open_file` | `File::lock()` + `File::unlock()` on a file that is already open |
//! | `leasehold_file_not_durable` | `Strategy::ExclusiveFile`, `durable(false)` |
//! | `leasehold_file_durable` | `Strategy::ExclusiveFile`, `durable(true)` (the default) |
//! | `leasehold_directory_not_durable` | `Strategy::Directory`, `durable(false)` |
//!
//! The raw floors write records of the same size as the ones leasehold
//! writes for the same strategy (measured at start-up). Before each
//! function the bench waits until creating a file costs what it did at its
//! best (see `Settler`): on ext4 without a journal, the churn of one
//! function otherwise slows the next one's creates by up to ~1 ms each.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use leasehold::{Locker, Strategy};

#[path = "support/settle.rs"]
mod settle;
use settle::Settler;

/// The lock names of the two strategies, which share one directory.
const FILE_NAME: &str = "bench-file";
const DIR_NAME: &str = "bench-directory";

/// The size of the record leasehold writes for `name` with `strategy`.
fn record_len(rt: &tokio::runtime::Runtime, dir: &Path, strategy: Strategy, name: &str) -> usize {
    let locker = Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .durable(false)
        .build()
        .unwrap();
    let guard = rt.block_on(locker.acquire(name)).unwrap();
    let path = locker.lock_path(name).unwrap();
    let record = match strategy {
        Strategy::Directory => path.join("owner.json"),
        _ => path,
    };
    let len = std::fs::metadata(record).unwrap().len();
    drop(guard);
    usize::try_from(len).unwrap()
}

fn uncontended(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Everything happens in one directory, so that the raw floors and
    // leasehold meet the same filesystem state (inode allocation on ext4
    // depends on the directory's block group).
    let work = dir.path();
    let file_len = record_len(&rt, work, Strategy::ExclusiveFile, FILE_NAME);
    let dir_len = record_len(&rt, work, Strategy::Directory, DIR_NAME);
    println!("record sizes: exclusive file {file_len} B, directory owner.json {dir_len} B");

    // Every function starts from the same filesystem state (see `Settler`).
    let mut settler = Settler::new(work);

    let mut group = c.benchmark_group("uncontended_acquire_release");
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_millis(2500));

    // The floor of the file strategy: create-exclusive + write a record of
    // the same size + close + unlink, no fsync.
    let file_record = vec![b' '; file_len];
    let raw = work.join("raw.lock");
    let create = |path: &Path| {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .unwrap()
    };
    settler.settle();
    group.bench_function("raw_file_floor", |b| {
        b.iter(|| {
            let mut f = create(&raw);
            f.write_all(&file_record).unwrap();
            drop(f);
            std::fs::remove_file(&raw).unwrap();
        })
    });

    // The same with the record synced, as `durable(true)` does.
    settler.settle();
    group.bench_function("raw_file_floor_fdatasync", |b| {
        b.iter(|| {
            let mut f = create(&raw);
            f.write_all(&file_record).unwrap();
            f.sync_data().unwrap();
            drop(f);
            std::fs::remove_file(&raw).unwrap();
        })
    });

    // The floor of the directory strategy: fill a private directory, rename
    // it onto the lock path, then empty and remove it.
    let dir_record = vec![b' '; dir_len];
    let pending = work.join("raw-dir.pending");
    let target = work.join("raw-dir.lock");
    let mut mkdir = std::fs::DirBuilder::new();
    mkdir.mode(0o700);
    settler.settle();
    group.bench_function("raw_directory_floor", |b| {
        b.iter(|| {
            mkdir.create(&pending).unwrap();
            let mut f = create(&pending.join("owner.json"));
            f.write_all(&dir_record).unwrap();
            drop(f);
            std::fs::rename(&pending, &target).unwrap();
            std::fs::remove_file(target.join("owner.json")).unwrap();
            std::fs::remove_dir(&target).unwrap();
        })
    });

    // What a lock on an open file costs: flock(LOCK_EX) + flock(LOCK_UN).
    let open = File::create(work.join("flock")).unwrap();
    settler.settle();
    group.bench_function("std_flock_open_file", |b| {
        b.iter(|| {
            open.lock().unwrap();
            open.unlock().unwrap();
        })
    });

    let file_fast = Locker::builder().directory(work).durable(false).build().unwrap();
    settler.settle();
    group.bench_function("leasehold_file_not_durable", |b| {
        b.to_async(&rt)
            .iter(|| async { drop(file_fast.acquire(FILE_NAME).await.unwrap()) })
    });

    let file_durable = Locker::builder().directory(work).durable(true).build().unwrap();
    settler.settle();
    group.bench_function("leasehold_file_durable", |b| {
        b.to_async(&rt)
            .iter(|| async { drop(file_durable.acquire(FILE_NAME).await.unwrap()) })
    });

    let dir_fast = Locker::builder()
        .directory(work)
        .strategy(Strategy::Directory)
        .durable(false)
        .build()
        .unwrap();
    settler.settle();
    group.bench_function("leasehold_directory_not_durable", |b| {
        b.to_async(&rt)
            .iter(|| async { drop(dir_fast.acquire(DIR_NAME).await.unwrap()) })
    });
    group.finish();
}

criterion_group!(benches, uncontended);
criterion_main!(benches);
