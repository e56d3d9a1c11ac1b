//! What only Windows does: run under Wine in CI (`.ci/run`).
#![cfg(windows)]

use leasehold::Locker;

/// The default directory is `leasehold` in the user's local application
/// data, made on first use, and two lockers meet there.
#[tokio::test]
async fn the_default_directory_is_in_local_app_data() {
    let a = Locker::builder().build().unwrap();
    let b = Locker::builder().build().unwrap();
    let dir = a.directory().to_owned();
    eprintln!("default directory: {}", dir.display());
    assert!(dir.ends_with("leasehold"), "{}", dir.display());
    assert!(
        dir.to_string_lossy()
            .to_ascii_lowercase()
            .contains("appdata\\local"),
        "{}",
        dir.display()
    );
    let name = format!("default-{}", std::process::id());
    let held = a.acquire(&name).await.unwrap();
    assert!(b.try_acquire(&name).await.unwrap().is_none());
    drop(held);
    assert!(b.try_acquire(&name).await.unwrap().is_some());
}

fn locker(dir: &std::path::Path) -> Locker {
    Locker::builder()
        .directory(dir)
        .poll_interval(std::time::Duration::from_millis(5))
        .build()
        .unwrap()
}

/// A released lock's name is free at once although a reader still has its
/// file open: Windows keeps a deleted file's name while a handle of it is
/// open, so the release renames the file aside before it deletes it.
#[tokio::test]
async fn a_release_frees_the_name_while_a_reader_has_the_file_open() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (locker(dir.path()), locker(dir.path()));
    for round in 0..5 {
        let name = format!("read-{round}");
        let held = a.acquire(&name).await.unwrap();
        // std opens with every share mode, as velocious's and
        // pi-research's Node.js does.
        let reader = std::fs::File::open(a.lock_path(&name).unwrap()).unwrap();
        held.release().await.unwrap();
        let next = b.try_acquire(&name).await.unwrap();
        assert!(next.is_some(), "round {round}: the name stayed taken");
        drop(reader);
    }
    drop((a, b));
}

/// A reader that opens a lock file without sharing deletion (no leasehold,
/// velocious or pi-research process does) delays the file's removal until
/// it closes it, and never lets two holders in meanwhile; once it closed
/// it, the holder that could not remove its file is gone from it (its mark
/// is free), and the name is taken at once. (Wine's registry has no
/// `BootId`, which the mark's evidence needs; `.ci/wine/setup` gives its
/// prefix one, as every Windows has.)
#[tokio::test]
async fn a_reader_that_does_not_share_deletion_never_makes_two_holders() {
    use std::os::windows::fs::OpenOptionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (locker(dir.path()), locker(dir.path()));
    let held = a.acquire("stubborn").await.unwrap();
    let path = a.lock_path("stubborn").unwrap();
    // FILE_SHARE_READ | FILE_SHARE_WRITE, no FILE_SHARE_DELETE.
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .share_mode(0x1 | 0x2)
        .open(&path)
        .unwrap();
    assert!(b.try_acquire("stubborn").await.unwrap().is_none(), "held");
    let released = held.release().await;
    // Whatever the release could do, nobody else holds the name while the
    // reader keeps the file.
    let during = b.try_acquire("stubborn").await;
    assert!(
        !matches!(during, Ok(Some(_))) || released.is_ok(),
        "a second holder while the first's release failed: {released:?}"
    );
    drop(during);
    drop(reader);
    let after = tokio::time::timeout(std::time::Duration::from_secs(10), b.acquire("stubborn"))
        .await
        .expect("the name is free once the reader closed the file")
        .unwrap();
    drop(after);
    drop((a, b));
}

/// The `startTime` this process writes: pi-research's unit on Windows,
/// whole seconds since the epoch (what PowerShell's `Get-Process`
/// `StartTime` gives, where pi-research reads it there).
async fn own_start_time(dir: &std::path::Path) -> u64 {
    let probe = locker(dir);
    let held = probe.acquire("probe-start").await.unwrap();
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(probe.lock_path("probe-start").unwrap()).unwrap()).unwrap();
    drop(held);
    record["startTime"].as_u64().expect("startTime written")
}

/// A record as pi-research writes it, last changed an hour ago.
fn plant_pi_research(path: &std::path::Path, pid: u32, start_time: u64) {
    let record = format!(r#"{{"uuid":"seed","pid":{pid},"startTime":{start_time}}}"#);
    std::fs::write(path, &record).unwrap();
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
}

/// pi-research's records on Windows are judged as pi-research judges them:
/// a live pid with its start (to the second) holds; a live pid with
/// another start is a reused pid; a dead pid holds nothing.
#[tokio::test]
async fn pi_research_records_are_judged_by_pid_and_start_second() {
    let dir = tempfile::tempdir().unwrap();
    let start = own_start_time(dir.path()).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(start <= now && now - start < 3600, "start {start}, now {now}");
    let locker = Locker::builder()
        .directory(dir.path())
        .path_style(leasehold::PathStyle::Plain)
        .foreign_lease(None)
        .build()
        .unwrap();
    let path = locker.lock_path("job").unwrap();
    let me = std::process::id();

    plant_pi_research(&path, me, start);
    assert!(
        locker.try_acquire("job").await.unwrap().is_none(),
        "a live holder"
    );

    plant_pi_research(&path, me, start - 7200);
    let guard = locker
        .try_acquire("job")
        .await
        .unwrap()
        .expect("a reused pid holds nothing");
    drop(guard);

    let mut child = std::process::Command::new("cmd")
        .args(["/C", "exit"])
        .spawn()
        .unwrap();
    let dead = child.id();
    child.wait().unwrap();
    drop(child);
    plant_pi_research(&path, dead, start);
    let guard = locker
        .try_acquire("job")
        .await
        .unwrap()
        .expect("a dead pid holds nothing");
    drop(guard);
    drop(locker);
}

/// The role a child of the tests below plays (see `PermitHolder`): take
/// `gpu` in the lock directory `LEASEHOLD_TEST_PERMIT_DIR` as
/// `LEASEHOLD_TEST_KIND` says (a permit by default), say so, and hold it
/// until killed.
#[tokio::test]
async fn permit_holder() {
    let Some(dir) = std::env::var_os("LEASEHOLD_TEST_PERMIT_DIR") else {
        return;
    };
    // A lease far longer than any test here waits, so that only the
    // holder's death can free what it holds.
    let locker = Locker::builder()
        .directory(std::path::Path::new(&dir))
        .poll_interval(std::time::Duration::from_millis(5))
        .lease(std::time::Duration::from_secs(600))
        .build()
        .unwrap();
    let kind = std::env::var("LEASEHOLD_TEST_KIND").unwrap_or_default();
    if kind == "readloop" {
        println!("HELD {}", std::process::id());
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < until {
            if let Ok(guard) = locker.acquire_shared("gpu").await {
                tokio::time::sleep(std::time::Duration::from_millis(3)).await;
                drop(guard);
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        return;
    }
    if kind == "exclusive" || kind == "shared" {
        let guard = if kind == "shared" {
            locker.acquire_shared("gpu").await.unwrap()
        } else {
            locker.acquire("gpu").await.unwrap()
        };
        println!("HELD {}", std::process::id());
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        drop(guard);
        return;
    }
    let permit = locker.semaphore("gpu", 3).unwrap().acquire().await.unwrap();
    println!("HELD {}", std::process::id());
    tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    drop(permit);
}

/// A child holding a permit, started by re-running this test binary.
struct PermitHolder(std::process::Child);

impl PermitHolder {
    fn start(dir: &std::path::Path) -> Self {
        Self::start_holding(dir, false)
    }

    /// A child holding a permit of `gpu`, or `gpu` itself if `exclusive`.
    fn start_holding(dir: &std::path::Path, exclusive: bool) -> Self {
        Self::start_as(dir, if exclusive { "exclusive" } else { "permit" })
    }

    /// A child holding `gpu` as `kind`: `exclusive`, `shared` or `permit`;
    /// or, as `readloop`, taking it shared and letting it go in a loop.
    fn start_as(dir: &std::path::Path, kind: &str) -> Self {
        use std::io::BufRead;
        let mut command = std::process::Command::new(std::env::current_exe().unwrap());
        command.env("LEASEHOLD_TEST_KIND", kind);
        let mut child = command
            .args(["--exact", "permit_holder", "--nocapture", "--test-threads", "1"])
            .env("LEASEHOLD_TEST_PERMIT_DIR", dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut line = String::new();
        while !line.contains("HELD") {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "the child ended before it held a permit"
            );
            assert!(std::time::Instant::now() < deadline, "no permit within 30 s");
        }
        PermitHolder(child)
    }
}

impl Drop for PermitHolder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A semaphore of 3 permits is held by 3 processes at once and refuses a
/// fourth; a killed holder's permit is taken at once, without waiting out
/// its lease.
#[tokio::test]
async fn semaphores_between_processes() {
    let dir = tempfile::tempdir().unwrap();
    let mut holders: Vec<PermitHolder> = (0..3).map(|_| PermitHolder::start(dir.path())).collect();
    let here = locker(dir.path());
    let gpu = here.semaphore("gpu", 3).unwrap();
    assert!(gpu.try_acquire().await.unwrap().is_none(), "a fourth permit");
    assert_eq!(here.holders("gpu").await.unwrap().len(), 3);
    let killed = holders.remove(0);
    drop(killed);
    let started = std::time::Instant::now();
    let permit = tokio::time::timeout(std::time::Duration::from_secs(10), gpu.acquire())
        .await
        .expect("the killed holder's permit came back")
        .unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "waited {:?} (the lease is 30 s)",
        started.elapsed()
    );
    drop(permit);
    drop(holders);
    drop((gpu, here));
}

/// A holder's death is an event on Windows too: closing a handle changes
/// no directory entry, so the watcher waits on the holders' processes,
/// and a waiter whose poll interval is a minute takes a killed holder's
/// lock (or permit) within seconds. The holders' leases are ten minutes.
/// Before, the waiter found the death at its next poll, a minute later.
#[tokio::test]
async fn a_killed_holders_death_wakes_a_waiter_that_polls_once_a_minute() {
    for exclusive in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let holders = if exclusive { 1 } else { 3 };
        let mut holders: Vec<PermitHolder> = (0..holders)
            .map(|_| PermitHolder::start_holding(dir.path(), exclusive))
            .collect();
        let here = Locker::builder()
            .directory(dir.path())
            .poll_interval(std::time::Duration::from_secs(60))
            // The notice of a long wait would wake the waiter after 5 s.
            .wait_notice(None)
            .build()
            .unwrap();
        let gpu = here.semaphore("gpu", 3).unwrap();
        let waiter = {
            let (here, gpu) = (here.clone(), gpu.clone());
            tokio::spawn(async move {
                if exclusive {
                    drop(here.acquire("gpu").await.unwrap());
                } else {
                    drop(gpu.acquire().await.unwrap());
                }
                std::time::Instant::now()
            })
        };
        // The waiter tried, found the lock held and waits.
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        assert!(!waiter.is_finished(), "exclusive: {exclusive}");
        drop(holders.remove(0));
        let killed = std::time::Instant::now();
        let took = tokio::time::timeout(std::time::Duration::from_secs(40), waiter)
            .await
            .expect("the waiter never took the killed holder's lock")
            .unwrap();
        let waited = took.duration_since(killed);
        eprintln!("exclusive: {exclusive}: took the lock {waited:?} after the kill");
        assert!(
            waited < std::time::Duration::from_secs(15),
            "exclusive: {exclusive}: waited {waited:?} after the kill (the poll interval is 60 s)"
        );
        drop(holders);
        drop((gpu, here));
    }
}

/// Upgradable locks on Windows: an upgrade waits for a reader in another
/// process and lets no writer in meanwhile; it waits, too, while anyone
/// has the marker open (Windows cannot replace a file that is open: the
/// upgrade closes its own handle of it and waits for the others); a
/// downgrade lets readers in and keeps writers out.
#[tokio::test]
async fn an_upgrade_waits_for_readers_in_other_processes_and_for_open_markers() {
    let dir = tempfile::tempdir().unwrap();
    let mut reader = vec![PermitHolder::start_as(dir.path(), "shared")];
    let here = locker(dir.path());
    let other = locker(dir.path());
    let up = here.acquire_upgradable("gpu").await.unwrap();
    assert_eq!(here.holders("gpu").await.unwrap().len(), 2);
    // Someone (a reader of the file, not a lock) has the marker open.
    let open = std::fs::File::open(here.lock_path("gpu").unwrap()).unwrap();
    let upgrading = tokio::spawn(up.upgrade());
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(!upgrading.is_finished(), "upgraded beside a reader");
    assert!(
        other.try_acquire("gpu").await.unwrap().is_none(),
        "a writer got in"
    );
    drop(reader.remove(0));
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        !upgrading.is_finished(),
        "replaced the marker while someone had it open"
    );
    assert!(
        other.try_acquire("gpu").await.unwrap().is_none(),
        "a writer got in"
    );
    drop(open);
    let writer = tokio::time::timeout(std::time::Duration::from_secs(10), upgrading)
        .await
        .expect("the upgrade never finished")
        .unwrap()
        .unwrap();
    assert!(
        other.try_acquire_shared("gpu").await.unwrap().is_none(),
        "a reader got in"
    );
    assert!(
        other.try_acquire("gpu").await.unwrap().is_none(),
        "a writer got in"
    );
    let up = writer.downgrade().await.unwrap();
    let read = other
        .try_acquire_shared("gpu")
        .await
        .unwrap()
        .expect("a reader after the downgrade");
    assert!(
        other.try_acquire("gpu").await.unwrap().is_none(),
        "a writer got in"
    );
    drop(read);
    let writer = up.upgrade().await.unwrap();
    drop(writer);
    assert!(other.try_acquire("gpu").await.unwrap().is_some());
}

/// Upgrades and downgrades beside readers that join and leave all the
/// time in two other processes: each upgrade waits for a moment without
/// readers and for nobody to have the marker open, and neither it nor
/// the downgrade ever fails.
#[tokio::test]
async fn upgrades_and_downgrades_beside_readers_looping_in_other_processes() {
    let dir = tempfile::tempdir().unwrap();
    let _readers: Vec<PermitHolder> = (0..2)
        .map(|_| PermitHolder::start_as(dir.path(), "readloop"))
        .collect();
    let here = locker(dir.path());
    let mut fails = Vec::new();
    for i in 0..15 {
        let up = here.acquire_upgradable("gpu").await.unwrap();
        match tokio::time::timeout(std::time::Duration::from_secs(10), up.upgrade()).await {
            Ok(Ok(w)) => match w.downgrade().await {
                Ok(up) => drop(up),
                Err(e) => fails.push(format!("{i}: downgrade {e}")),
            },
            Ok(Err(e)) => fails.push(format!("{i}: upgrade {e}")),
            Err(_) => fails.push(format!("{i}: upgrade timed out")),
        }
    }
    assert!(fails.is_empty(), "{fails:#?}");
}
