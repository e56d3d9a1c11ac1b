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
//! | `raw_file_protocol_floor` | Linux: the system calls of leasehold's own acquire + release, made directly, in its order (see below) |
//! | `leasehold_file` | the defaults (`Strategy::ExclusiveFile`, records not synced), guard dropped |
//! | `leasehold_file_release_await` | the same, released with `guard.release().await` |
//! | `leasehold_file_durable` | `durable(true)`: the record synced (compare with the `fdatasync` floor) |
//! | `leasehold_directory` | `Strategy::Directory`, guard dropped |
//! | `leasehold_directory_release_await` | the same, released with `guard.release().await` |
//!
//! After the group, py-filelock's `FileLock` (if `python3 -c "import
//! filelock"` works) runs the same uncontended loop in the same directory.
//!
//! The raw floors write records of the same size as the ones leasehold
//! writes for the same strategy (measured at start-up). Before each
//! function the bench waits until creating a file costs what it did at its
//! best (see `Settler`): on ext4 without a journal, the churn of one
//! function otherwise slows the next one's creates by up to ~1 ms each.

use std::fs::{File, OpenOptions};
use std::io::Write;
#[cfg(unix)]
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
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        options.mode(0o600);
        options.open(path).unwrap()
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
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut mkdir = std::fs::DirBuilder::new();
    #[cfg(unix)]
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

    #[cfg(target_os = "linux")]
    protocol_floor(&mut group, &mut settler, work, &file_record);

    // The defaults (records not synced), dropping the guard...
    let file_default = Locker::new(work).unwrap();
    settler.settle();
    group.bench_function("leasehold_file", |b| {
        b.to_async(&rt)
            .iter(|| async { drop(file_default.acquire(FILE_NAME).await.unwrap()) })
    });

    // ...and releasing it with `release().await`, which also reports
    // whether the lock was still ours.
    settler.settle();
    group.bench_function("leasehold_file_release_await", |b| {
        b.to_async(&rt).iter(|| async {
            file_default
                .acquire(FILE_NAME)
                .await
                .unwrap()
                .release()
                .await
                .unwrap()
        })
    });

    // Records synced before the lock counts as held (opt-in).
    let file_durable = Locker::builder().directory(work).durable(true).build().unwrap();
    settler.settle();
    group.bench_function("leasehold_file_durable", |b| {
        b.to_async(&rt)
            .iter(|| async { drop(file_durable.acquire(FILE_NAME).await.unwrap()) })
    });

    let dir_default = Locker::builder()
        .directory(work)
        .strategy(Strategy::Directory)
        .build()
        .unwrap();
    settler.settle();
    group.bench_function("leasehold_directory", |b| {
        b.to_async(&rt)
            .iter(|| async { drop(dir_default.acquire(DIR_NAME).await.unwrap()) })
    });
    settler.settle();
    group.bench_function("leasehold_directory_release_await", |b| {
        b.to_async(&rt).iter(|| async {
            dir_default
                .acquire(DIR_NAME)
                .await
                .unwrap()
                .release()
                .await
                .unwrap()
        })
    });
    group.finish();

    // The lock Python users pick, in the same directory and run.
    settler.settle();
    py_filelock(work);
}

/// The floor of leasehold's own protocol for the file layout: the 20
/// system calls that `strace -f` shows for one uncontended acquire +
/// release with the defaults, made directly, in the same order, with no
/// runtime, no record to build and no bookkeeping. What separates it from
/// `raw_file_floor` is what the protocol needs for its guarantees; what
/// separates `leasehold_file` from it is the library's own cost.
///
/// Acquire: look at the lock path; create the record under a new private
/// name (`O_EXCL`), `flock` it, `fstat` it (its identity), write it, rename it
/// onto the lock path (`RENAME_NOREPLACE`); look that the directory's path
/// still names the directory. Release, under the name's mutation lock:
/// create and open the mutation lock file, `fstat` it, `flock` it, look
/// that its path still names it; look that the lock path still names our
/// record; ask the waiting line whether anyone waits (`F_OFD_GETLK`);
/// unlink the record; `fstat` the mutation lock file (leasehold removes
/// only an empty one), unlink it; close both.
#[cfg(target_os = "linux")]
fn protocol_floor(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    settler: &mut Settler,
    work: &Path,
    record: &[u8],
) {
    use nix::fcntl::{FcntlArg, OFlag, RenameFlags, fcntl, openat, renameat2};
    use nix::libc;
    use nix::sys::stat::{FileStat, Mode, fstat, fstatat};
    use nix::unistd::{UnlinkatFlags, unlinkat};
    use std::os::unix::fs::FileExt;

    let dir = File::open(work).unwrap();
    let (lock, mutex) = ("protocol.lock", "protocol.lock.mutex");
    // Each record is made under a new private name, as leasehold's are
    // (on ext4, a new name costs more than one used before).
    let mut made = 0u64;
    let no_follow = nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW;
    let mode = Mode::from_bits_truncate(0o600);
    let same = |a: &FileStat, b: &FileStat| (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino);
    settler.settle();
    group.bench_function("raw_file_protocol_floor", |b| {
        b.iter(|| {
            // Acquire.
            assert!(fstatat(&dir, lock, no_follow).is_err(), "free");
            let create =
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            made += 1;
            let pending = format!("protocol.lock.pending-{made:012x}");
            let file = File::from(openat(&dir, pending.as_str(), create, mode).unwrap());
            file.try_lock().unwrap();
            let ours = fstat(&file).unwrap();
            file.write_all_at(record, 0).unwrap();
            renameat2(&dir, pending.as_str(), &dir, lock, RenameFlags::RENAME_NOREPLACE).unwrap();
            assert!(std::fs::metadata(work).unwrap().is_dir());
            // Release.
            let open =
                OFlag::O_RDONLY | OFlag::O_CREAT | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            let mutation = File::from(openat(&dir, mutex, open, mode).unwrap());
            let locked = fstat(&mutation).unwrap();
            mutation.try_lock().unwrap();
            assert!(same(&fstatat(&dir, mutex, no_follow).unwrap(), &locked));
            assert!(same(&fstatat(&dir, lock, no_follow).unwrap(), &ours));
            let mut line = libc::flock {
                l_type: libc::F_WRLCK as i16,
                l_whence: libc::SEEK_SET as i16,
                l_start: 1 << 40,
                l_len: 1 << 20,
                l_pid: 0,
            };
            fcntl(&dir, FcntlArg::F_OFD_GETLK(&mut line)).unwrap();
            unlinkat(&dir, lock, UnlinkatFlags::NoRemoveDir).unwrap();
            assert_eq!(fstat(&mutation).unwrap().st_size, 0);
            unlinkat(&dir, mutex, UnlinkatFlags::NoRemoveDir).unwrap();
            drop(mutation);
            drop(file);
        })
    });
}

/// py-filelock's `FileLock` (flock on a lock file it keeps), uncontended
/// acquire + release, timed in Python; skipped when the module is missing
/// (`pip install filelock`).
fn py_filelock(dir: &Path) {
    const SCRIPT: &str = r#"
import os, sys, time, filelock
lock = filelock.FileLock(os.path.join(sys.argv[1], "py-filelock.lock"))
def run(n):
    start = time.perf_counter()
    for _ in range(n):
        lock.acquire()
        lock.release()
    return (time.perf_counter() - start) / n
run(2000)
best = sorted(run(5000) for _ in range(5))
print(f"{filelock.__version__} {best[2] * 1e6:.2f}")
"#;
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(dir)
        .output();
    match out {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            let mut words = text.split_whitespace();
            let (version, micros) = (words.next().unwrap_or("?"), words.next().unwrap_or("?"));
            println!("py-filelock {version} FileLock, acquire + release: median of 5 runs {micros} µs");
        }
        _ => println!("py-filelock: not measured (python3 with the filelock module is needed)"),
    }
}

criterion_group!(benches, uncontended);
criterion_main!(benches);
