//! The Windows death watch attacked between a waiter's look at a lock and
//! its naming of the holder to the watcher (the failpoint
//! `engine.wait.before_watch`), run under Wine in CI with the feature
//! `failpoints`. Its own test binary: failpoints are process-wide.
#![cfg(all(windows, feature = "failpoints"))]

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::Locker;

/// The role a child plays: hold `LEASEHOLD_ATTACK_NAME` in the lock
/// directory `LEASEHOLD_ATTACK_DIR` (exclusively, or a permit of a
/// semaphore of 2 when `LEASEHOLD_ATTACK_PERMIT` is set) for ten minutes
/// of lease, say so, and hold it until killed.
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
    if std::env::var_os("LEASEHOLD_ATTACK_PERMIT").is_some() {
        let permit = locker.semaphore(&name, 2).unwrap().acquire().await.unwrap();
        println!("HELD {}", std::process::id());
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(permit);
        return;
    }
    let guard = locker.acquire(&name).await.unwrap();
    println!("HELD {}", std::process::id());
    tokio::time::sleep(Duration::from_secs(60)).await;
    drop(guard);
}

/// A child holding `name` in `dir`, killed when dropped.
struct Holder(std::process::Child);

impl Holder {
    fn start(dir: &Path, name: &str, permit: bool) -> Holder {
        use std::io::BufRead;
        let mut command = std::process::Command::new(std::env::current_exe().unwrap());
        if permit {
            command.env("LEASEHOLD_ATTACK_PERMIT", "1");
        }
        let mut child = command
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
        Holder(child)
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Kills `holder` (`TerminateProcess`), closes this process's handle of
/// it, and waits (up to 5 s) until no process has its id any more
/// (`OpenProcess` fails): under Wine that takes about a second after the
/// last handle closed; on Windows it is at once.
fn kill_until_gone(holder: Holder) {
    use windows_sys::Win32::Foundation::CloseHandle;
    use windows_sys::Win32::System::Threading::{OpenProcess, PROCESS_SYNCHRONIZE};
    let pid = holder.0.id();
    drop(holder);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // SAFETY: a plain call; a handle it returns is closed at once.
        let handle = unsafe { OpenProcess(PROCESS_SYNCHRONIZE, 0, pid) };
        if handle.is_null() {
            return;
        }
        // SAFETY: opened just above, closed once.
        unsafe { CloseHandle(handle) };
        assert!(
            Instant::now() < deadline,
            "pid {pid} still opens 5 s after its kill"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A holder that dies after the waiter found it holding and before the
/// waiter names it to the watcher: its process can no longer be opened,
/// so the watcher cannot wait on it; the waiter, which polls once a
/// minute, must still take the lock at once (its holder is dead already).
/// Both an exclusive holder and a semaphore's (2 permits, both held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_dead_before_it_is_named_does_not_leave_its_waiter_asleep() {
    for permit in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut holders: Vec<Holder> = (0..if permit { 2 } else { 1 })
            .map(|_| Holder::start(dir.path(), "gpu", permit))
            .collect();
        let victim = Arc::new(Mutex::new(Some(holders.remove(0))));
        let waiter = Locker::builder()
            .directory(dir.path())
            .poll_interval(Duration::from_secs(60))
            .wait_notice(None)
            .build()
            .unwrap();
        let killed = Arc::new(Mutex::new(None::<Instant>));
        let (taken, at) = (Arc::clone(&victim), Arc::clone(&killed));
        fail::cfg_callback("engine.wait.before_watch", move || {
            if let Some(holder) = taken.lock().unwrap().take() {
                kill_until_gone(holder);
                *at.lock().unwrap() = Some(Instant::now());
            }
        })
        .unwrap();
        let sem = waiter.semaphore("gpu", 2).unwrap();
        let acquired = tokio::time::timeout(Duration::from_secs(15), async {
            match permit {
                true => sem.acquire().await.map(drop),
                false => waiter.acquire("gpu").await.map(drop),
            }
        })
        .await;
        fail::remove("engine.wait.before_watch");
        let killed = killed
            .lock()
            .unwrap()
            .expect("the holder was killed at the failpoint");
        let waited = killed.elapsed();
        acquired
            .unwrap_or_else(|_| panic!("permit: {permit}: the waiter slept past its dead holder"))
            .unwrap();
        eprintln!("permit: {permit}: took it {waited:?} after the holder was gone");
        assert!(
            waited < Duration::from_secs(5),
            "permit: {permit}: waited {waited:?}"
        );
        drop(holders);
        drop((sem, waiter));
    }
}

/// A members directory removed while another handle had it open (a
/// holder of this process or another whose `Member` was not dropped yet,
/// an indexer) goes when that handle closes, whenever that is: Wine
/// removes it then. Closed between the next join's `mkdir` (which found
/// the name taken) and its open (the failpoint
/// `group.members.after_mkdir`), it failed that join with "cannot open
/// members directory" (a CI run under Wine, 2026-12-07); the join makes
/// the directory again instead.
#[tokio::test]
async fn a_members_directory_that_goes_between_the_mkdir_and_the_open_is_made_again() {
    use std::os::windows::fs::OpenOptionsExt;
    const FILE_FLAG_BACKUP_SEMANTICS: u32 = 0x0200_0000;
    const SHARE_ALL: u32 = 0x7;
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::new(dir.path()).unwrap();
    let guard = locker.acquire_shared("job").await.unwrap();
    let lock = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "lock"))
        .expect("the lock file");
    let mut members = lock.clone().into_os_string();
    members.push(".members");
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .share_mode(SHARE_ALL)
        .custom_flags(FILE_FLAG_BACKUP_SEMANTICS)
        .open(&members)
        .unwrap();
    guard.release().await.unwrap();
    let reader = Arc::new(Mutex::new(Some(reader)));
    let closed = Arc::new(Mutex::new(false));
    let (held, done) = (Arc::clone(&reader), Arc::clone(&closed));
    fail::cfg_callback("group.members.after_mkdir", move || {
        if let Some(reader) = held.lock().unwrap().take() {
            drop(reader);
            *done.lock().unwrap() = true;
        }
    })
    .unwrap();
    let again = tokio::time::timeout(Duration::from_secs(30), locker.acquire_shared("job")).await;
    fail::remove("group.members.after_mkdir");
    assert!(*closed.lock().unwrap(), "the reader was closed at the failpoint");
    let again = again.expect("joined within 30 s").unwrap();
    again.release().await.unwrap();
}
