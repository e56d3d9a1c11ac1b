//! What crashed processes leave in the lock directory is collected by
//! ordinary use, without `Locker::clean`, and nothing a live process uses
//! is touched.

#[path = "support/common.rs"]
mod common;

use std::fs::File;
use std::path::Path;
use std::time::{Duration, SystemTime};

use common::ChildProc;
use leasehold::{Locker, Strategy};

#[test]
fn child_process_entry() {
    #[cfg(unix)]
    if std::env::var_os(EMFILE_CHILD).is_some() {
        emfile_child();
    }
    common::child_entry();
}

fn locker(dir: &Path, strategy: Strategy) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .lease(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Ages a file or directory, as if a crashed process had left it a while
/// ago. (Windows changes a file's times only through a handle open for
/// writing; Unix, through any descriptor of the owner's.)
fn age(path: &Path, by: Duration) {
    let node = if path.is_dir() {
        File::open(path)
    } else {
        File::options().write(true).open(path)
    };
    node.unwrap().set_modified(SystemTime::now() - by).unwrap();
}

/// Plants what a process killed while publishing (`.pending-*`), while
/// releasing or reclaiming (`.trash-*`), or while advancing a fencing
/// counter (`.fence.tmp-*`) leaves behind.
/// (Pending and trash directories exist only in the directory strategy.)
fn plant_crash_leftovers(dir: &Path, strategy: Strategy, lock_file: &str, n: usize) {
    for i in 0..n {
        if strategy == Strategy::Directory {
            let pending = format!("{lock_file}.pending-{:012x}", 0xa000 + i);
            let trash = format!("{lock_file}.trash-{:012x}", 0xb000 + i);
            for d in [&pending, &trash] {
                std::fs::create_dir(dir.join(d)).unwrap();
                std::fs::write(dir.join(d).join("owner.json"), br#"{"uuid":"x","pid":1}"#).unwrap();
                age(&dir.join(d), Duration::from_secs(5));
            }
        }
        let fence = format!("{lock_file}.fence.tmp-{:032x}", 0xc000 + i);
        std::fs::write(dir.join(&fence), b"1024\n").unwrap();
        age(&dir.join(&fence), Duration::from_secs(5));
    }
}

async fn wait_until_only(dir: &Path, expected: &[String], within: Duration, what: &str) {
    let started = std::time::Instant::now();
    loop {
        // A held name keeps its mutation-lock file while it is in use.
        let now: Vec<String> = common::entries(dir)
            .into_iter()
            .filter(|e| !(e.ends_with(".mutex") && expected.iter().any(|x| e.starts_with(x.as_str()))))
            .collect();
        if now == expected {
            return;
        }
        assert!(
            started.elapsed() < within,
            "{what}: still {} entries, expected {expected:?}: {now:?}",
            now.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waiters killed by SIGKILL, plus the exact leftovers of processes killed
/// mid-publish, mid-release and mid-fencing: a waiter of this process
/// meeting contention, and a `Locker` being built, bring the directory
/// back to the lock entries alone; a leftover still in use (its flock
/// held) is spared.
async fn collected_by_ordinary_use(strategy: Strategy) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let holder = locker(dir.path(), strategy);
    let waiter = locker(dir.path(), strategy);
    let guard = holder.acquire("job").await.unwrap();
    let lock_file = holder
        .lock_path("job")
        .unwrap()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let mut expected = vec![lock_file.clone()];
    // Real waiters in other processes, polling hard, killed while waiting.
    let waiters: Vec<_> = (0..6)
        .map(|_| ChildProc::spawn_with(strategy, "acquire", &[d, "job", "30000", "1"]))
        .collect();
    for w in &waiters {
        w.expect("waiting", Duration::from_secs(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    drop(waiters); // SIGKILL, by pid
    plant_crash_leftovers(dir.path(), strategy, &lock_file, 20);
    // In use: a publisher's pending directory and a releaser's trash,
    // each flocked by its (live) owner, are never collected.
    let mut in_use = Vec::new();
    let live = if strategy == Strategy::Directory { 2 } else { 0 };
    for live in [
        format!("{lock_file}.pending-{:012x}", 0xdead),
        format!("{lock_file}.trash-{:012x}", 0xbeef),
    ]
    .into_iter()
    .take(live)
    {
        std::fs::create_dir(dir.path().join(&live)).unwrap();
        age(&dir.path().join(&live), Duration::from_secs(60));
        let node = File::open(dir.path().join(&live)).unwrap();
        node.lock().unwrap();
        in_use.push(node);
        expected.push(live);
    }
    expected.sort();
    // Ordinary use: waiting for the held lock.
    let waited = waiter.acquire_timeout("job", Duration::from_secs(3)).await;
    assert!(waited.unwrap_err().is_timeout());
    wait_until_only(dir.path(), &expected, Duration::from_secs(10), "after contention").await;
    // A crash while nobody waits: the next `Locker` built collects it.
    plant_crash_leftovers(dir.path(), strategy, &lock_file, 5);
    let _fresh = locker(dir.path(), strategy);
    assert_eq!(common::entries(dir.path()), expected, "after build");
    drop(in_use);
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftovers_are_collected_by_ordinary_use_file() {
    collected_by_ordinary_use(Strategy::ExclusiveFile).await;
}

// Windows cannot lock a directory: `build()` refuses the layout there.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftovers_are_collected_by_ordinary_use_directory() {
    collected_by_ordinary_use(Strategy::Directory).await;
}

#[cfg(unix)]
const EMFILE_CHILD: &str = "LEASEHOLD_TEST_EMFILE_DIR";

/// In a child process: with no descriptor to spare, a directory-strategy
/// attempt fails, and leaves no pending directory behind.
#[cfg(unix)]
fn emfile_child() {
    let dir = std::env::var(EMFILE_CHILD).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let locker = locker(Path::new(&dir), Strategy::Directory);
    // Use up every descriptor but the few the attempt's mkdir needs none of.
    let mut hog = Vec::new();
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 64, 64).unwrap();
    while let Ok(f) = File::open("/dev/null") {
        hog.push(f);
    }
    let result = runtime.block_on(locker.try_acquire("job"));
    drop(hog);
    let code = match result {
        Err(_) => 0,
        Ok(_) => 2,
    };
    std::process::exit(code);
}

// A descriptor limit (RLIMIT_NOFILE) and the directory layout: Unix's.
#[cfg(unix)]
#[test]
fn a_publish_that_fails_for_want_of_descriptors_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let status = common::reexec::child_process()
        .env(EMFILE_CHILD, dir.path())
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0), "the attempt did not fail with EMFILE");
    assert_eq!(common::entries(dir.path()), Vec::<String>::new());
}

/// A sweep never takes the flock of a pending directory younger than the
/// settle time, not even for a look: its publisher may be between `mkdir`
/// and `flock`, and would find its own directory taken. (Here nobody
/// publishes it; the test's `try_lock`s stand for the publisher's.)
// Windows cannot lock a directory: `build()` refuses the layout there.
#[cfg(unix)]
#[test]
fn a_sweep_never_takes_the_flock_of_a_young_pending_directory() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let sweeper = locker(dir.path(), Strategy::Directory);
    let pending = dir.path().join("job-0123456789abcdef.lock.pending-0123456789ab");
    std::fs::create_dir(&pending).unwrap();
    let made = std::time::Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let sweeping = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let mut sweeps = 0;
            while !stop.load(Ordering::Relaxed) {
                let cleaned = rt.block_on(sweeper.clean(true)).unwrap();
                assert!(
                    cleaned.is_empty(),
                    "a young pending directory reported: {cleaned:?}"
                );
                sweeps += 1;
            }
            sweeps
        })
    };
    let (mut looks, mut taken) = (0, 0);
    // Well within the settle time (2 s), so the directory stays young.
    while made.elapsed() < Duration::from_secs(1) {
        looks += 1;
        let look = File::open(&pending).unwrap();
        match look.try_lock() {
            // Let go explicitly: a child that another test forks meanwhile
            // shares the descriptor (until its exec), and closing ours
            // would leave the flock held for the next look.
            Ok(()) => look.unlock().unwrap(),
            Err(std::fs::TryLockError::WouldBlock) => taken += 1,
            Err(std::fs::TryLockError::Error(e)) => panic!("flock: {e}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let sweeps = sweeping.join().unwrap();
    assert!(sweeps > 0, "no sweep ran");
    assert_eq!(
        taken, 0,
        "a sweep held the flock at {taken} of {looks} looks ({sweeps} sweeps)"
    );
    assert!(pending.exists());
}

/// On Windows a record is deleted by renaming it aside
/// (`<name>.pending-<12 hex>`) and then marking it for deletion; a process
/// killed between the two leaves the renamed record behind, which no scan
/// of the members directory read (only `m-…json`, `w-…json` and unfinished
/// `.tmp-` records), so the group's members directory could never be
/// removed (seen in CI: the upgradable torture under Wine left
/// `m-up-….json.pending-…`). Such a file, its flock free, is removed like
/// an unfinished record, under the name's mutation lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_renamed_aside_by_a_killed_remover_is_collected() {
    for &strategy in common::strategies() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path();
        let a = locker(dir, strategy);
        let b = locker(dir, strategy);
        let first = a.acquire_shared("job").await.unwrap();
        let members = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.to_string_lossy().ends_with(".members"))
            .expect("the group's members directory");
        let record = std::fs::read_dir(&members)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "json"))
            .expect("the holder's record");
        let aside = members.join("m-0a0a0a0a-0a0a-4a0a-8a0a-0a0a0a0a0a0a.json.pending-0123456789ab");
        std::fs::copy(&record, &aside).unwrap();
        // A join under the mutation lock removes what is dead.
        let second = b.acquire_shared("job").await.unwrap();
        drop(first);
        drop(second);
        let left = |dir: &Path| -> Vec<String> {
            std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n != common::LINE_FILE && !n.ends_with(".fence"))
                .collect()
        };
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while !left(dir).is_empty() && std::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(left(dir).is_empty(), "{strategy:?}: left behind {:?}", left(dir));
    }
}
