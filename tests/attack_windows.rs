//! A cold attack on the Windows layer, run under Wine in CI: the death
//! watch (the watcher's thread waits on the holders' process handles that
//! waiters name) and the rest of `src/sys/windows`. Each test bounds its
//! time and kills the children it starts.
#![cfg(windows)]

use std::path::Path;
use std::time::{Duration, Instant};

use leasehold::Locker;

/// A waiter that polls once a minute: only an event can wake it within a
/// test's time. No wait notice (it would wake the waiter after 5 s).
fn slow_waiter(dir: &Path) -> Locker {
    Locker::builder()
        .directory(dir)
        .poll_interval(Duration::from_secs(60))
        .wait_notice(None)
        .build()
        .unwrap()
}

/// The role a child plays: hold `LEASEHOLD_ATTACK_NAME` in the lock
/// directory `LEASEHOLD_ATTACK_DIR` (a lease of ten minutes, so that only
/// its death frees it), say so with its pid and the `startTime` it wrote,
/// and hold it until killed.
#[tokio::test]
async fn attack_holder() {
    let (Some(dir), Some(name)) = (
        std::env::var_os("LEASEHOLD_ATTACK_DIR"),
        std::env::var("LEASEHOLD_ATTACK_NAME").ok(),
    ) else {
        return;
    };
    let locker = Locker::builder()
        .directory(Path::new(&dir))
        .poll_interval(Duration::from_millis(5))
        .lease(Duration::from_secs(600))
        .build()
        .unwrap();
    let guard = locker.acquire(&name).await.unwrap();
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(locker.lock_path(&name).unwrap()).unwrap()).unwrap();
    let start = record["startTime"].as_u64().unwrap_or(0);
    println!("HELD {} {start}", std::process::id());
    tokio::time::sleep(Duration::from_secs(60)).await;
    drop(guard);
}

/// A child process holding `name` in `dir`; killed when dropped.
struct Holder {
    child: std::process::Child,
    pid: u32,
    start: u64,
}

impl Holder {
    fn start(dir: &Path, name: &str) -> Holder {
        use std::io::BufRead;
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "attack_holder", "--nocapture", "--test-threads", "1"])
            .env("LEASEHOLD_ATTACK_DIR", dir)
            .env("LEASEHOLD_ATTACK_NAME", name)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut line = String::new();
        // libtest prints "test attack_holder ... " before the line.
        while !line.contains("HELD") {
            line.clear();
            if out.read_line(&mut line).unwrap() == 0 || Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the child never held {name}");
            }
        }
        let at = line.find("HELD").unwrap();
        let mut words = line[at..].split_whitespace().skip(1);
        let pid = words.next().unwrap().parse().unwrap();
        let start = words.next().unwrap().parse().unwrap();
        Holder { child, pid, start }
    }

    /// `TerminateProcess`, and waits until it is gone.
    fn kill(mut self) -> Instant {
        let _ = self.child.kill();
        let _ = self.child.wait();
        Instant::now()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (bounded) until `task` is done; how long after `since`.
async fn took<T>(task: tokio::task::JoinHandle<T>, since: Instant, what: &str) -> Duration {
    tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .unwrap_or_else(|_| panic!("{what}: the waiter never took the dead holder's lock"))
        .unwrap();
    since.elapsed()
}

/// A directory that never stops changing (a neighbour's lock taken and
/// let go in a loop, by another `Locker` of this process) must not hide a
/// holder's death from a waiter of another name: the watcher's wait
/// answers the first of its handles that is signalled, and the
/// directory's changes came before every process.
#[tokio::test]
async fn a_busy_directory_does_not_hide_a_holders_death() {
    let dir = tempfile::tempdir().unwrap();
    let holder = Holder::start(dir.path(), "gpu");
    let here = slow_waiter(dir.path());
    let waiter = {
        let here = here.clone();
        tokio::spawn(async move { drop(here.acquire("gpu").await.unwrap()) })
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The neighbour's lock, and a file beside it rewritten as fast as it
    // can be (anyone who may write in the directory can).
    let churn = {
        let (path, stop) = (dir.path().to_owned(), stop.clone());
        std::thread::spawn(move || {
            let busy = Locker::builder().directory(&path).build().unwrap();
            let mut rounds = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                drop(busy.blocking_acquire("busy").unwrap());
                rounds += 1;
            }
            rounds
        })
    };
    let scribblers: Vec<_> = (0..4)
        .map(|n| {
            let (path, stop) = (dir.path().join(format!("notes-{n}.txt")), stop.clone());
            std::thread::spawn(move || {
                let mut rounds = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::fs::write(&path, rounds.to_string()).unwrap();
                    rounds += 1;
                }
                rounds
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!waiter.is_finished());
    let killed = holder.kill();
    let waited = tokio::time::timeout(Duration::from_secs(20), waiter).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = (
        churn.join().unwrap(),
        scribblers.into_iter().map(|s| s.join().unwrap()).sum::<u64>(),
    );
    let waited = waited.expect("the waiter never took the dead holder's lock");
    waited.unwrap();
    let waited = killed.elapsed();
    eprintln!("took the lock {waited:?} after the kill; (lock, file) rewritten {rounds:?} times");
    assert!(
        waited < Duration::from_secs(5),
        "waited {waited:?} after the kill (the poll interval is 60 s)"
    );
    drop(here);
}

/// A pi-research record naming a live process (here a child that holds
/// another name) holds; when that process dies, a waiter that polls once a
/// minute takes the lock at once: the foreign record's pid is watched too.
#[tokio::test]
async fn a_foreign_records_dead_pid_wakes_its_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let holder = Holder::start(dir.path(), "other");
    let here = slow_waiter(dir.path());
    let path = here.lock_path("job").unwrap();
    let record = format!(
        r#"{{"uuid":"seed","pid":{},"startTime":{}}}"#,
        holder.pid, holder.start
    );
    std::fs::write(&path, record).unwrap();
    assert!(
        here.try_acquire("job").await.unwrap().is_none(),
        "a live pi-research holder"
    );
    let waiter = {
        let here = here.clone();
        tokio::spawn(async move { drop(here.acquire("job").await.unwrap()) })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!waiter.is_finished());
    let killed = holder.kill();
    let waited = took(waiter, killed, "pi-research").await;
    eprintln!("took the lock {waited:?} after the kill");
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
    drop(here);
}

/// Many waiters of one dead holder, in three `Locker`s (three watchers,
/// each with the holder's process named by several waiters), and a
/// waiter of a second holder: every one of them wakes on its holder's
/// death, and they take the lock one at a time.
#[tokio::test]
async fn every_waiter_of_every_watcher_wakes_and_they_take_turns() {
    let dir = tempfile::tempdir().unwrap();
    let first = Holder::start(dir.path(), "gpu");
    let second = Holder::start(dir.path(), "tpu");
    let lockers: Vec<Locker> = (0..3).map(|_| slow_waiter(dir.path())).collect();
    let inside = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut waiters = Vec::new();
    for locker in &lockers {
        for _ in 0..3 {
            let (locker, inside) = (locker.clone(), inside.clone());
            waiters.push(tokio::spawn(async move {
                let guard = locker.acquire("gpu").await.unwrap();
                let now = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                assert_eq!(now, 0, "two holders of gpu at once");
                tokio::time::sleep(Duration::from_millis(20)).await;
                inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                drop(guard);
            }));
        }
    }
    let other = {
        let locker = lockers[0].clone();
        tokio::spawn(async move { drop(locker.acquire("tpu").await.unwrap()) })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(waiters.iter().all(|w| !w.is_finished()) && !other.is_finished());
    let killed = first.kill();
    for waiter in waiters {
        let waited = took(waiter, killed, "gpu").await;
        assert!(
            waited < Duration::from_secs(8),
            "a waiter of gpu waited {waited:?}"
        );
    }
    assert!(!other.is_finished(), "tpu's holder lives");
    let killed = second.kill();
    let waited = took(other, killed, "tpu").await;
    assert!(
        waited < Duration::from_secs(5),
        "the waiter of tpu waited {waited:?}"
    );
    drop(lockers);
}

/// A waiter whose `Locker` goes away while its watcher waits on a holder's
/// process: the drop returns (the thread stops), and the holder's death
/// afterwards harms nobody; a new `Locker` of the directory takes the
/// lock once the holder is dead.
#[tokio::test]
async fn a_locker_dropped_while_its_watch_waits_on_a_process() {
    let dir = tempfile::tempdir().unwrap();
    let holder = Holder::start(dir.path(), "gpu");
    let here = slow_waiter(dir.path());
    let waiter = {
        let here = here.clone();
        tokio::spawn(async move { here.acquire("gpu").await.map(drop) })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    waiter.abort();
    let _ = waiter.await;
    let dropped = Instant::now();
    drop(here);
    assert!(
        dropped.elapsed() < Duration::from_secs(3),
        "the drop took {:?}",
        dropped.elapsed()
    );
    holder.kill();
    let again = slow_waiter(dir.path());
    let guard = tokio::time::timeout(Duration::from_secs(10), again.acquire("gpu"))
        .await
        .expect("the dead holder's lock")
        .unwrap();
    drop(guard);
    drop(again);
}

/// A holder in this very process (another `Locker`): its pid is this
/// process's own, which never ends while the waiter runs; its release
/// still wakes the waiter at once.
#[tokio::test]
async fn an_in_process_holders_release_wakes_its_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let holder = Locker::builder().directory(dir.path()).build().unwrap();
    let here = slow_waiter(dir.path());
    for round in 0..3 {
        let guard = holder.acquire("gpu").await.unwrap();
        let waiter = {
            let here = here.clone();
            tokio::spawn(async move { drop(here.acquire("gpu").await.unwrap()) })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!waiter.is_finished());
        drop(guard);
        let released = Instant::now();
        let waited = took(waiter, released, "in-process").await;
        assert!(
            waited < Duration::from_secs(3),
            "round {round}: waited {waited:?}"
        );
    }
    drop((holder, here));
}

/// A pid no process has: a child's, once it ended and its handle closed
/// (Wine hands out new pids in order; Windows reuses them, but not within
/// a test's instant).
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "no-such-test"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// A record as pi-research writes it, of `pid`, last changed an hour ago.
fn plant_dead(path: &Path) {
    let record = format!(r#"{{"uuid":"seed","pid":{},"startTime":1}}"#, dead_pid());
    std::fs::write(path, record).unwrap();
    let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
}

fn quick(dir: &Path) -> Locker {
    Locker::builder()
        .directory(dir)
        .poll_interval(Duration::from_millis(5))
        .build()
        .unwrap()
}

/// A directory at a lock path is no lock: a typed error at once, for a
/// try and for a wait, and the directory is left as it is.
#[tokio::test]
async fn a_directory_at_the_lock_path_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let locker = quick(dir.path());
    let path = locker.lock_path("job").unwrap();
    std::fs::create_dir(&path).unwrap();
    std::fs::write(path.join("inside"), b"data").unwrap();
    let tried = locker.try_acquire("job").await;
    assert!(
        matches!(tried, Err(leasehold::Error::UnexpectedFile { .. })),
        "{tried:?}"
    );
    let waited = tokio::time::timeout(
        Duration::from_secs(5),
        locker.acquire_timeout("job", Duration::from_secs(1)),
    )
    .await
    .expect("bounded");
    assert!(waited.is_err(), "{waited:?}");
    assert_eq!(std::fs::read(path.join("inside")).unwrap(), b"data");
    drop(locker);
}

/// A dead holder's record made read-only (`DeleteFile` refuses a
/// read-only file): it is reclaimed all the same, as on Unix (where a
/// file's mode does not guard its name) and as velocious and pi-research
/// (Node.js, whose unlink clears the attribute) do on Windows; and nothing
/// of it is left behind in the directory.
#[tokio::test]
async fn a_read_only_dead_record_is_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let locker = quick(dir.path());
    let path = locker.lock_path("job").unwrap();
    plant_dead(&path);
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(&path, perms).unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(5), locker.try_acquire("job"))
        .await
        .expect("bounded")
        .expect("a read-only dead record is reclaimed")
        .expect("free");
    let record = std::fs::read_to_string(&path).unwrap();
    assert!(record.contains(&std::process::id().to_string()), "{record}");
    assert!(quick(dir.path()).try_acquire("job").await.unwrap().is_none());
    drop(guard);
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains(".lock"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    drop(locker);
}

/// A dead holder's record that another process keeps open without
/// sharing deletion (so it can be neither renamed nor deleted): no two
/// holders, every answer typed and bounded; once the reader closed it the
/// name is taken.
#[tokio::test]
async fn a_dead_record_held_open_without_share_delete() {
    use std::os::windows::fs::OpenOptionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (quick(dir.path()), quick(dir.path()));
    let path = a.lock_path("job").unwrap();
    plant_dead(&path);
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .share_mode(0x1 | 0x2)
        .open(&path)
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), a.try_acquire("job"))
        .await
        .expect("bounded");
    let second = tokio::time::timeout(Duration::from_secs(5), b.try_acquire("job"))
        .await
        .expect("bounded");
    eprintln!("while held open: {first:?} / {second:?}");
    assert!(
        !matches!((&first, &second), (Ok(Some(_)), Ok(Some(_)))),
        "two holders"
    );
    let held = matches!(first, Ok(Some(_))) || matches!(second, Ok(Some(_)));
    drop((first, second));
    drop(reader);
    if !held {
        let guard = tokio::time::timeout(Duration::from_secs(10), a.acquire("job"))
            .await
            .expect("the name is free once the reader closed the file")
            .unwrap();
        assert!(b.try_acquire("job").await.unwrap().is_none());
        drop(guard);
    }
    drop((a, b));
}

/// A byte-range lock over the whole of a dead holder's record (what std's
/// `File::lock` takes on Windows): the record cannot be read, and its
/// range covers the liveness mark, so the name is held while that lock
/// is; once it goes, the name is taken. Never a panic, never two holders.
#[tokio::test]
async fn a_whole_file_lock_over_a_dead_record() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (quick(dir.path()), quick(dir.path()));
    let path = a.lock_path("job").unwrap();
    plant_dead(&path);
    let hostile = std::fs::File::options()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    hostile.lock().unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), a.try_acquire("job"))
        .await
        .expect("bounded");
    let second = tokio::time::timeout(Duration::from_secs(5), b.try_acquire("job"))
        .await
        .expect("bounded");
    eprintln!(
        "while locked: {:?} / {:?}",
        first.as_ref().map(Option::is_some),
        second.as_ref().map(Option::is_some)
    );
    assert!(
        !matches!((&first, &second), (Ok(Some(_)), Ok(Some(_)))),
        "two holders"
    );
    let held = matches!(first, Ok(Some(_))) || matches!(second, Ok(Some(_)));
    drop((first, second));
    drop(hostile);
    if !held {
        let guard = tokio::time::timeout(Duration::from_secs(10), a.acquire("job"))
            .await
            .expect("the name is free once the hostile lock went")
            .unwrap();
        drop(guard);
    }
    drop((a, b));
}

/// A live holder whose record's bytes a hostile reader locks, shared (it
/// can read the record; nobody can write it): the holder keeps its
/// lock through renewals, nobody else takes it, and its release frees
/// the name once the reader let go.
#[tokio::test]
async fn a_live_holders_record_locked_whole_by_a_reader() {
    let dir = tempfile::tempdir().unwrap();
    let holder = Locker::builder()
        .directory(dir.path())
        .lease(Duration::from_secs(2))
        .build()
        .unwrap();
    let other = quick(dir.path());
    let guard = holder.acquire("job").await.unwrap();
    let path = holder.lock_path("job").unwrap();
    let hostile = std::fs::File::open(&path).unwrap();
    // The whole file cannot be locked: its range covers the holder's mark.
    assert!(hostile.try_lock_shared().is_err());
    // The record's bytes can (a reader's shared lock over its first MiB).
    lock_shared_range(&hostile, 0, 1 << 20);
    // Several renewals (a third of the lease each).
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            other
                .try_acquire("job")
                .await
                .map(|g| g.is_none())
                .unwrap_or(true)
        );
        assert!(!guard.is_lost(), "the live holder lost its lock");
    }
    drop(hostile);
    guard.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), other.acquire("job"))
        .await
        .expect("the released name")
        .unwrap();
    drop(next);
    drop((holder, other));
}

/// A shared byte-range lock (`LockFileEx`) over `[at, at + len)` of
/// `file`, held until the handle closes.
fn lock_shared_range(file: &std::fs::File, at: u64, len: u64) {
    use std::os::windows::io::AsRawHandle;
    use windows_sys::Win32::Storage::FileSystem::{LOCKFILE_FAIL_IMMEDIATELY, LockFileEx};
    use windows_sys::Win32::System::IO::OVERLAPPED;
    // SAFETY: an all-zero OVERLAPPED is valid; its offset is set below.
    let mut overlapped: OVERLAPPED = unsafe { std::mem::zeroed() };
    overlapped.Anonymous.Anonymous.Offset = (at & 0xffff_ffff) as u32;
    overlapped.Anonymous.Anonymous.OffsetHigh = (at >> 32) as u32;
    // SAFETY: the handle is open while `file` lives; the OVERLAPPED lives
    // across this synchronous call.
    let ok = unsafe {
        LockFileEx(
            file.as_raw_handle(),
            LOCKFILE_FAIL_IMMEDIATELY,
            0,
            (len & 0xffff_ffff) as u32,
            (len >> 32) as u32,
            &mut overlapped,
        )
    };
    assert_ne!(ok, 0, "LockFileEx: {}", std::io::Error::last_os_error());
}

/// A shared lock's members directory that another process has open for
/// deletion (`DELETE` access, as `RemoveDirectoryW` holds it while it
/// removes the directory: a group's end, a `clean`, beside us) costs no
/// acquisition anything: a second reader joins, a writer finds the name
/// busy, and nobody gets an error. The directory used to be listed by
/// path, which Wine refuses while such a handle is open
/// (`ERROR_SHARING_VIOLATION`): every join answered "cannot list members
/// directory" (the crash-point suite under Wine failed so, in about two
/// runs of five).
#[tokio::test]
async fn a_members_directory_open_for_deletion_is_still_read() {
    use std::os::windows::fs::OpenOptionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (quick(dir.path()), quick(dir.path()), quick(dir.path()));
    let first = a.acquire_shared("job").await.unwrap();
    let mut members = a.lock_path("job").unwrap().into_os_string();
    members.push(".members");
    /// `DELETE`, `FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE`,
    /// `FILE_FLAG_BACKUP_SEMANTICS` (a directory).
    const DELETE: u32 = 0x0001_0000;
    let deleter = std::fs::OpenOptions::new()
        .access_mode(DELETE)
        .share_mode(0x1 | 0x2 | 0x4)
        .custom_flags(0x0200_0000)
        .open(&members)
        .unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), b.acquire_shared("job"))
        .await
        .expect("bounded")
        .expect("a second reader joins");
    let writer = tokio::time::timeout(Duration::from_secs(5), c.try_acquire("job"))
        .await
        .expect("bounded")
        .expect("no error");
    assert!(writer.is_none(), "a writer beside two readers");
    drop(deleter);
    drop((first, second));
    let writer = tokio::time::timeout(Duration::from_secs(10), c.acquire("job"))
        .await
        .expect("the name is free once the readers left")
        .unwrap();
    drop(writer);
    drop((a, b, c));
}

/// Another program (an indexer, a backup, a `dir`) that has a shared
/// lock's members directory open while the group ends: Windows (and
/// Wine) keep a removed directory's name until its last handle closes,
/// and the name goes when that handle closes, whenever that is. The next
/// join found the name taken and then gone, or refused ("cannot open
/// members directory", a Wine CI run); it must wait that out, briefly.
#[tokio::test]
async fn a_members_directory_held_open_while_its_group_ends_does_not_fail_the_next_join() {
    use std::os::windows::fs::OpenOptionsExt;
    const FILE_FLAG_BACKUP_SEMANTICS: u32 = 0x0200_0000;
    const SHARE_ALL: u32 = 0x7;
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::new(dir.path()).unwrap();
    for round in 0..20u64 {
        let guard = locker.acquire_shared("job").await.unwrap();
        let members = dir
            .path()
            .join(format!("{}.members", guard_lock_file(dir.path())));
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .share_mode(SHARE_ALL)
            .custom_flags(FILE_FLAG_BACKUP_SEMANTICS)
            .open(&members)
            .unwrap();
        // The group ends, its members directory removed under our handle.
        guard.release().await.unwrap();
        // Closed a moment after the next join begins (a few rounds at
        // once).
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(round % 4));
            drop(reader);
        });
        let again = tokio::time::timeout(Duration::from_secs(30), locker.acquire_shared("job"))
            .await
            .expect("joined within 30 s");
        let again = again.unwrap_or_else(|e| panic!("round {round}: {e}"));
        closer.join().unwrap();
        again.release().await.unwrap();
    }
}

/// The file name of the only lock in `dir`.
fn guard_lock_file(dir: &Path) -> String {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .find(|n| n.ends_with(".lock"))
        .expect("the lock file")
}
