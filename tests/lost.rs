//! Knowing when a lock is lost, fencing tokens, and the counters.

#[path = "support/common.rs"]
mod common;

#[cfg(unix)]
use std::time::Instant;
use std::time::{Duration, SystemTime};

use common::{ChildProc, FENCING_ENV, dead_pid, iso, plant};
use leasehold::{Error, Locker, LossReason, Strategy};
#[cfg(unix)]
use nix::sys::signal::Signal;

#[test]
fn child_process_entry() {
    #[cfg(unix)]
    if std::env::var_os(PRIVDROP_CHILD).is_some() {
        privdrop_child();
    }
    common::child_entry_with(|role, args| async move {
        match role.as_str() {
            #[cfg(unix)]
            "lost_look" => lost_look(&args).await,
            _ => common::run_role(&role, &args).await,
        }
    });
}

/// dir name lease_ms: holds `name`; once told it lost it, looks at once
/// whether the lock path is still there ("lost present", "lost gone"),
/// and exits on the news without dropping the guard, as a service might.
#[cfg(unix)]
async fn lost_look(args: &[String]) -> i32 {
    let l = Locker::builder()
        .directory(&args[0])
        .strategy(common::strategy_from_env())
        .lease(Duration::from_millis(args[2].parse().unwrap()))
        .build()
        .expect("locker");
    let path = l.lock_path(&args[1]).unwrap();
    let g = l.acquire(&args[1]).await.expect("acquire");
    common::say("acquired");
    g.lost().await;
    let there = std::fs::symlink_metadata(&path).is_ok();
    common::say(if there { "lost present" } else { "lost gone" });
    std::mem::forget(g);
    std::process::exit(4)
}

#[cfg(unix)]
fn record_bytes(path: &std::path::Path) -> Vec<u8> {
    if path.is_dir() {
        std::fs::read(path.join("owner.json")).unwrap()
    } else {
        std::fs::read(path).unwrap()
    }
}

#[cfg(unix)]
fn paused_holder(strategy: Strategy) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let fencing = [(FENCING_ENV, "1")];
    // A holds with a 1 s lease, then is frozen.
    let a = ChildProc::spawn_env(strategy, "hold", &[d, "job", "1000"], &fencing);
    let a_token: u64 = a.expect("acquired", Duration::from_secs(20))[9..]
        .parse()
        .unwrap();
    a.signal(Signal::SIGSTOP);
    // B takes over once A's lease has run out. B's lease is long, so its
    // record does not change while we watch it.
    let b = ChildProc::spawn_env(strategy, "hold", &[d, "job", "60000"], &fencing);
    let b_token: u64 = b.expect("acquired", Duration::from_secs(20))[9..]
        .parse()
        .unwrap();
    assert!(b_token > a_token, "fencing tokens grow: {a_token} then {b_token}");
    let locker = Locker::builder().directory(d).strategy(strategy).build().unwrap();
    let path = locker.lock_path("job").unwrap();
    let before = record_bytes(&path);
    // A wakes up: it must learn it lost the lock, and touch nothing.
    a.signal(Signal::SIGCONT);
    let resumed = Instant::now();
    a.expect("lost", Duration::from_secs(5));
    assert!(
        resumed.elapsed() < Duration::from_secs(2),
        "lost() took {:?}",
        resumed.elapsed()
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(record_bytes(&path), before, "the new holder's record was touched");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let owner = rt
        .block_on(locker.holder("job"))
        .unwrap()
        .expect("B still holds it");
    assert_eq!(owner.pid(), Some(b.pid()));
    assert_eq!(owner.fencing_token(), Some(b_token));
}

// A frozen process (SIGSTOP): Windows has no such signal.
#[cfg(unix)]
#[test]
fn a_holder_paused_past_its_lease_loses_it_and_disturbs_nobody_file() {
    paused_holder(Strategy::ExclusiveFile);
}

// SIGSTOP, and the directory layout (which Windows cannot lock).
#[cfg(unix)]
#[test]
fn a_holder_paused_past_its_lease_loses_it_and_disturbs_nobody_directory() {
    paused_holder(Strategy::Directory);
}

/// A holder paused past its lease, whose lock nobody took meanwhile: by
/// the time `lost()` tells it, the lock, still its own on disk, is
/// already removed, so a holder that exits on the news leaves nothing
/// behind. (Before, the holder heard first and the renewal thread removed
/// the lock after: a process exiting at once left its lock file, which a
/// pi-research waiter that had seen the holder alive kept waiting on for
/// its 120 s; found by tests/attack_interop_frozen.rs.)
#[cfg(unix)]
fn paused_alone(strategy: Strategy) {
    for _ in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();
        let mut a = ChildProc::spawn_env(strategy, "lost_look", &[d, "job", "400"], &[]);
        a.expect("acquired", Duration::from_secs(20));
        a.signal(Signal::SIGSTOP);
        std::thread::sleep(Duration::from_millis(1200));
        a.signal(Signal::SIGCONT);
        let said = a.expect("lost", Duration::from_secs(10));
        assert_eq!(said, "lost gone", "told of the loss before its lock was removed");
        a.wait(Duration::from_secs(10));
        let left = common::left_after(dir.path(), Duration::from_secs(1));
        assert!(
            left.iter().all(|n| n.ends_with(".mutex")),
            "left behind: {left:?}"
        );
    }
}

#[cfg(unix)]
#[test]
fn a_holder_told_of_a_loss_finds_a_lock_still_its_own_already_removed_file() {
    paused_alone(Strategy::ExclusiveFile);
}

#[cfg(unix)]
#[test]
fn a_holder_told_of_a_loss_finds_a_lock_still_its_own_already_removed_directory() {
    paused_alone(Strategy::Directory);
}

#[test]
fn fencing_tokens_strictly_increase_across_processes_kills_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let locks = dir.path().join("locks");
    let (d, l) = (locks.to_str().unwrap(), log.to_str().unwrap());
    let fencing = [(FENCING_ENV, "1")];
    let spawn = || {
        ChildProc::spawn_env(
            Strategy::ExclusiveFile,
            "tokens",
            &[d, "ledger", "100", l],
            &fencing,
        )
    };
    let mut kids: Vec<ChildProc> = (0..4).map(|_| spawn()).collect();
    // Kill two midway, wherever they are (holding the lock or not), and
    // start two fresh processes in their place.
    std::thread::sleep(Duration::from_millis(150));
    for kid in kids.iter_mut().take(2) {
        kid.kill();
    }
    kids.push(spawn());
    kids.push(spawn());
    for kid in kids.iter_mut().skip(2) {
        kid.expect("done", Duration::from_secs(60));
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let tokens: Vec<u64> = text
        .lines()
        .map(|l| l.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(tokens.len() >= 400, "{} acquisitions logged", tokens.len());
    for pair in tokens.windows(2) {
        assert!(pair[1] > pair[0], "tokens out of order: {pair:?}");
    }
}

#[tokio::test]
async fn fencing_tokens_grow_through_handoffs_and_survive_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let build = || {
        Locker::builder()
            .directory(dir.path())
            .fencing(true)
            .build()
            .unwrap()
    };
    let locker = build();
    let mut last = 0;
    for _ in 0..3000 {
        let guard = locker.acquire("ledger").await.unwrap();
        let token = guard.fencing_token().unwrap();
        assert!(token > last);
        last = token;
    }
    // A new Locker (as after a restart) continues above.
    let restarted = build();
    let guard = restarted.acquire("ledger").await.unwrap();
    assert!(guard.fencing_token().unwrap() > last);
    let owner = restarted.holder("ledger").await.unwrap().unwrap();
    assert_eq!(owner.fencing_token(), guard.fencing_token());
    // Without fencing there is no token to show.
    let plain_dir = tempfile::tempdir().unwrap();
    let plain = Locker::new(plain_dir.path()).unwrap();
    assert_eq!(plain.acquire("x").await.unwrap().fencing_token(), None);
}

/// Microseconds since the Unix epoch, as the fencing counter counts.
fn wall_us() -> u64 {
    let since = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap();
    u64::try_from(since.as_micros()).unwrap()
}

/// The counter deleted (`rm locks/*`, a tmpfiles age rule), the whole
/// directory re-created, a reboot (a fresh `Locker` on a new directory at
/// the same path), an old counter with a small value: every next token is
/// above every earlier one, exclusive and shared, in both layouts.
#[tokio::test]
async fn fencing_tokens_keep_growing_when_the_counter_is_lost() {
    for &strategy in common::strategies() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("locks");
        std::fs::create_dir(&dir).unwrap();
        let build = || {
            Locker::builder()
                .directory(&dir)
                .strategy(strategy)
                .fencing(true)
                .build()
                .unwrap()
        };
        let locker = build();
        let fence = format!("{}.fence", locker.lock_path("ledger").unwrap().display());
        let last = std::cell::Cell::new(0);
        let next = |token: u64, what: &str| {
            assert!(
                token > last.get(),
                "{strategy:?} {what}: {token} after {}",
                last.get()
            );
            last.set(token);
        };
        for _ in 0..3 {
            next(
                locker.acquire("ledger").await.unwrap().fencing_token().unwrap(),
                "first",
            );
        }
        // An operator's `rm locks/*.fence`, between two holders.
        std::fs::remove_file(&fence).unwrap();
        next(
            locker.acquire("ledger").await.unwrap().fencing_token().unwrap(),
            "counter deleted",
        );
        // Deleted while held: the block in hand, then the next holder.
        let held = locker.acquire("ledger").await.unwrap();
        next(held.fencing_token().unwrap(), "held");
        std::fs::remove_file(&fence).unwrap();
        drop(held);
        next(
            locker.acquire("ledger").await.unwrap().fencing_token().unwrap(),
            "deleted while held",
        );
        // A shared holder's token is the counter as it stands: never
        // below the last exclusive holder's, even with the counter gone.
        std::fs::remove_file(&fence).unwrap();
        let shared = locker
            .acquire_shared("ledger")
            .await
            .unwrap()
            .fencing_token()
            .unwrap();
        assert!(
            shared >= last.get(),
            "{strategy:?}: shared {shared} after {}",
            last.get()
        );
        next(
            locker.acquire("ledger").await.unwrap().fencing_token().unwrap(),
            "after shared",
        );
        // The directory re-created, and a fresh Locker (a reboot of a tmpfs).
        drop(locker);
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::create_dir(&dir).unwrap();
        let rebooted = build();
        next(
            rebooted.acquire("ledger").await.unwrap().fencing_token().unwrap(),
            "re-created",
        );
        // A counter written by an earlier version (measured: 2049, then 1
        // once it was deleted): the clock takes over at once.
        let legacy = format!("{}.fence", rebooted.lock_path("legacy").unwrap().display());
        std::fs::write(&legacy, "2049\n").unwrap();
        let before = wall_us();
        let token = rebooted.acquire("legacy").await.unwrap().fencing_token().unwrap();
        assert!(
            token >= before,
            "{strategy:?}: an old small counter jumps to the clock: {token}"
        );
        std::fs::remove_file(&legacy).unwrap();
        let after = rebooted.acquire("legacy").await.unwrap().fencing_token().unwrap();
        assert!(after > token, "{strategy:?}: {after} after {token}");
        // Tokens stay exact as JSON numbers in JavaScript (below 2^53).
        assert!(last.get() < 1 << 53, "{}", last.get());
    }
}

#[tokio::test]
async fn a_corrupt_fencing_counter_is_an_error_not_a_reset() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::builder()
        .directory(dir.path())
        .fencing(true)
        .build()
        .unwrap();
    let fence = format!("{}.fence", locker.lock_path("ledger").unwrap().display());
    std::fs::write(&fence, "not a number").unwrap();
    let err = locker.try_acquire("ledger").await.unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(
        !locker.lock_path("ledger").unwrap().exists(),
        "the half-taken lock was released"
    );
}

/// Unmounts on drop, so a failing test leaves no mount behind.
#[cfg(unix)]
struct Mount(std::path::PathBuf);

#[cfg(unix)]
impl Mount {
    fn tmpfs(size: &str) -> Result<Self, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("not running as root".into());
        }
        let dir = std::env::temp_dir().join(format!("leasehold-tmpfs-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir(&dir).map_err(|e| e.to_string())?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(&dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            let _ = std::fs::remove_dir(&dir);
            return Err(format!(
                "mount failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Self(dir))
    }

    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.0.join("filler")).unwrap();
        let chunk = vec![0u8; 4096];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
    }
}

#[cfg(unix)]
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[cfg(unix)]
async fn renewal_failure_is_reported_before_the_lease_ends(
    strategy: Strategy,
    dir: &std::path::Path,
    break_it: impl FnOnce(),
) {
    let lease = Duration::from_millis(2000);
    let locker = Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .lease(lease)
        .renew_interval(Duration::from_millis(200))
        .build()
        .unwrap();
    let guard = locker.acquire("job").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let broken = Instant::now();
    break_it();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("loss reported");
    // The last renewal was at most one interval before the break; loss
    // must come before that renewal's lease ends.
    assert!(
        broken.elapsed() < lease,
        "loss reported after {:?}",
        broken.elapsed()
    );
    assert!(guard.is_lost());
    assert!(locker.stats().renewal_failures >= 1);
    assert_eq!(locker.stats().lost, 1);
    // The true cause, not "the lease ran out".
    match guard.ensure_held().await {
        Err(Error::Lost {
            reason: LossReason::RenewalFailed { error },
            ..
        }) => assert!(!error.is_empty()),
        other => panic!("expected a loss by failing renewals, got {other:?}"),
    }
}

// (Renewal took the directory's lock once, and a process frozen while
// holding it made every renewal fail; renewal takes no lock now:
// tests/frozen_neighbor.rs.)

// A tmpfs mounted by root, in the directory layout: Unix's.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_failing_on_a_full_filesystem_is_reported_in_time() {
    let mount = match Mount::tmpfs("256k") {
        Ok(mount) => mount,
        Err(reason) => {
            eprintln!("skipped: needs a tmpfs mount ({reason})");
            return;
        }
    };
    renewal_failure_is_reported_before_the_lease_ends(Strategy::Directory, &mount.0, || mount.fill()).await;
}

// Windows removes no directory while a file inside is open (a held lock
// file's name stays until its holder closes it), and Wine's
// `remove_dir_all` may hang there.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lock_directory_is_a_loss() {
    let dir = tempfile::tempdir().unwrap();
    let locks = dir.path().join("locks");
    let locker = Locker::builder()
        .directory(&locks)
        .lease(Duration::from_millis(1000))
        .renew_interval(Duration::from_millis(100))
        .build()
        .unwrap();
    let guard = locker.acquire("job").await.unwrap();
    std::fs::remove_dir_all(&locks).unwrap();
    tokio::time::timeout(Duration::from_secs(1), guard.lost())
        .await
        .expect("lost within ~one interval");
    assert!(guard.ensure_held().await.unwrap_err().is_lost());
    // Acquisitions say what happened instead of failing on a missing path.
    match locker.try_acquire("other").await {
        Err(Error::DirectoryReplaced { path }) => assert_eq!(path, locker.directory()),
        other => panic!("expected DirectoryReplaced, got {other:?}"),
    }
}

/// `mv locks locks.old && mkdir locks` while locks are held: every holder
/// learns within about one renewal interval, with the true reason; the
/// old `Locker` takes no lock in the directory nobody else sees, whether
/// the name is free there or held; a new `Locker` on the path works.
// Windows refuses to rename a directory while a file inside is open (the
// held lock files); Wine allows it, so a run under Wine would prove
// nothing about Windows.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_directory_moved_away_while_held_is_a_loss_and_refuses_new_locks() {
    for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
        for replace in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let locks = dir.path().join("locks");
            let old = dir.path().join("locks.old");
            let build = || {
                Locker::builder()
                    .directory(&locks)
                    .strategy(strategy)
                    .lease(Duration::from_secs(10))
                    .renew_interval(Duration::from_millis(100))
                    .build()
                    .unwrap()
            };
            let locker = build();
            let path = locker.directory().to_owned();
            let guard = locker.acquire("job").await.unwrap();
            let other = locker.acquire("other").await.unwrap();
            let rival = build();
            let busy = rival.acquire("busy").await.unwrap();
            std::fs::rename(&locks, &old).unwrap();
            if replace {
                std::fs::create_dir(&locks).unwrap();
            }
            let moved = Instant::now();
            tokio::time::timeout(Duration::from_secs(3), guard.lost())
                .await
                .unwrap_or_else(|_| panic!("{strategy:?}: no loss after the directory moved"));
            assert!(moved.elapsed() < Duration::from_secs(2), "{:?}", moved.elapsed());
            let expected = LossReason::DirectoryReplaced { path: path.clone() };
            match guard.ensure_held().await {
                Err(Error::Lost { reason, .. }) => assert_eq!(reason, expected),
                other => panic!("{strategy:?}: expected a loss, got {other:?}"),
            }
            match other.release().await {
                Err(Error::Lost { reason, .. }) => assert_eq!(reason, expected),
                other => panic!("{strategy:?}: expected a loss, got {other:?}"),
            }
            // Free in the old directory, lost there, and held there by
            // another Locker: all refused, none waited for.
            drop(guard);
            for name in ["fresh", "job", "busy"] {
                match locker.acquire_timeout(name, Duration::from_secs(2)).await {
                    Err(Error::DirectoryReplaced { path: p }) => assert_eq!(p, path),
                    other => panic!("{strategy:?} {name}: expected DirectoryReplaced, got {other:?}"),
                }
                assert!(matches!(
                    locker.try_acquire(name).await,
                    Err(Error::DirectoryReplaced { .. })
                ));
            }
            drop(busy);
            // Nothing is left (or was made) in the directory nobody sees.
            // The rival's renewal notices the move too and lets `busy` go
            // on its own thread, maybe in the instant of the drop, which
            // then leaves it to that release (or to the release thread,
            // the name's mutation lock being taken): allow it a moment.
            let until = Instant::now() + Duration::from_secs(5);
            while !common::entries(&old).is_empty() && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(common::entries(&old), Vec::<String>::new(), "{strategy:?}");
            if replace {
                let fresh = build();
                let job = fresh.try_acquire("job").await.unwrap();
                assert!(job.is_some(), "{strategy:?}: the new directory is free");
            }
        }
    }
}

/// `release().await` on a lock someone removed says so, not "the lease
/// ran out".
#[tokio::test]
async fn a_removed_lock_is_lost_with_its_true_reason() {
    for &strategy in common::strategies() {
        let dir = tempfile::tempdir().unwrap();
        let locker = Locker::builder()
            .directory(dir.path())
            .strategy(strategy)
            .build()
            .unwrap();
        let guard = locker.acquire("job").await.unwrap();
        let path = locker.lock_path("job").unwrap();
        if path.is_dir() {
            std::fs::remove_dir_all(&path).unwrap();
        } else {
            remove_behind_its_back(&path);
        }
        let err = guard.release().await.unwrap_err();
        match &err {
            Error::Lost { reason, .. } => assert_eq!(*reason, LossReason::Replaced, "{strategy:?}"),
            other => panic!("{strategy:?}: expected a loss, got {other:?}"),
        }
        assert!(err.to_string().contains("removed or replaced"), "{err}");
    }
}

/// Every counter, against a scripted scenario.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_exactly_what_happened() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::builder()
        .directory(dir.path())
        .poll_interval(Duration::from_millis(5))
        .renew_interval(Duration::from_millis(100))
        .lease(Duration::from_millis(1000))
        .build()
        .unwrap();
    let other = Locker::new(dir.path()).unwrap();
    let path = |n: &str| locker.lock_path(n).unwrap();

    drop(locker.acquire("plain").await.unwrap()); // 1 acquisition
    let held = other.acquire("busy").await.unwrap();
    assert!(
        locker
            .acquire_timeout("busy", Duration::from_millis(30))
            .await
            .unwrap_err()
            .is_timeout()
    ); // 1 timeout
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move { drop(locker.acquire("busy").await.unwrap()) })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(held);
    waiter.await.unwrap(); // 1 contended acquisition
    plant(
        leasehold::Strategy::ExclusiveFile,
        &path("dead"),
        &format!(r#"{{"uuid":"x","pid":{}}}"#, dead_pid()),
        Duration::ZERO,
    );
    drop(locker.acquire("dead").await.unwrap());
    let past = iso(SystemTime::now() - Duration::from_secs(5));
    plant(
        leasehold::Strategy::ExclusiveFile,
        &path("expired"),
        &format!(r#"{{"holderId":"h","pid":1,"hostname":"elsewhere","leaseExpiresAt":"{past}"}}"#),
        Duration::ZERO,
    );
    drop(locker.acquire("expired").await.unwrap());
    plant(
        leasehold::Strategy::ExclusiveFile,
        &path("garbage"),
        "",
        Duration::from_secs(60),
    );
    drop(locker.acquire("garbage").await.unwrap());
    let kept = locker.acquire("kept").await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    drop(kept);
    let lost = locker.acquire("lost").await.unwrap();
    remove_behind_its_back(&path("lost"));
    tokio::time::timeout(Duration::from_secs(2), lost.lost())
        .await
        .unwrap();
    drop(lost);

    let stats = locker.stats();
    assert_eq!(stats.acquisitions, 7, "{stats:?}");
    assert_eq!(stats.contended, 1, "{stats:?}");
    assert_eq!(stats.timeouts, 1, "{stats:?}");
    assert_eq!(stats.reclaimed_dead_owner, 1, "{stats:?}");
    assert_eq!(stats.reclaimed_expired_lease, 1, "{stats:?}");
    assert_eq!(stats.reclaimed_unreadable, 1, "{stats:?}");
    assert_eq!(stats.lost, 1, "{stats:?}");
    assert_eq!(stats.handoffs, 0, "{stats:?}");
    assert_eq!(stats.reentrant, 0, "{stats:?}");
    assert_eq!(stats.wait_count, 7, "{stats:?}");
    assert!(stats.wait_max >= Duration::from_millis(40), "{stats:?}");
    assert!(stats.wait_total >= stats.wait_max);
    assert!(stats.renewals >= 2, "{stats:?}");
    assert_eq!(stats.fs_waiters, 0);
}

/// Removes the lock file at `path` behind its holder's back, at once. On
/// Windows it is renamed aside first: Wine (like Windows without POSIX
/// delete semantics) keeps a deleted file's name until its last handle
/// closes, and the holder's is open.
fn remove_behind_its_back(path: &std::path::Path) {
    if cfg!(windows) {
        let mut aside = path.as_os_str().to_owned();
        aside.push(".removed");
        std::fs::rename(path, &aside).unwrap();
        std::fs::remove_file(&aside).unwrap();
    } else {
        std::fs::remove_file(path).unwrap();
    }
}

#[cfg(unix)]
fn moving_locker(dir: &std::path::Path, strategy: Strategy) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .lease(Duration::from_secs(1))
        .renew_interval(Duration::from_millis(100))
        .build()
        .unwrap()
}

/// The configured path is a symlink (`locks -> v1`, the usual
/// `current -> releases/N` layout). Retargeting it (`ln -sfn v2 locks`)
/// or moving the symlink away makes the path name another directory: the
/// old holder loses its lock and the old `Locker` takes none, while a new
/// `Locker` on the path works in the new directory.
// Symbolic links (Wine 8.0 makes none; Windows only with a privilege).
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlinked_lock_directory_retargeted_or_moved_is_a_loss() {
    for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
        for retarget in [true, false] {
            let root = tempfile::tempdir().unwrap();
            let (v1, v2) = (root.path().join("v1"), root.path().join("v2"));
            std::fs::create_dir(&v1).unwrap();
            std::fs::create_dir(&v2).unwrap();
            let locks = root.path().join("locks");
            std::os::unix::fs::symlink(&v1, &locks).unwrap();
            let old = moving_locker(&locks, strategy);
            let guard = old.acquire("job").await.unwrap();
            if retarget {
                let tmp = root.path().join("locks.tmp");
                std::os::unix::fs::symlink(&v2, &tmp).unwrap();
                std::fs::rename(&tmp, &locks).unwrap();
            } else {
                std::fs::rename(&locks, root.path().join("locks.old")).unwrap();
                std::fs::create_dir(&locks).unwrap();
            }
            let new = moving_locker(&locks, strategy);
            let rival = new
                .try_acquire("job")
                .await
                .unwrap()
                .expect("the new directory is free");
            let what = format!("{strategy:?}, retarget {retarget}");
            tokio::time::timeout(Duration::from_secs(3), guard.lost())
                .await
                .unwrap_or_else(|_| panic!("{what}: the old holder never learned"));
            match guard.ensure_held().await {
                Err(Error::Lost {
                    reason: LossReason::DirectoryReplaced { path },
                    ..
                }) => assert_eq!(path, locks, "{what}: the path as configured"),
                other => panic!("{what}: {other:?}"),
            }
            assert!(
                matches!(
                    old.try_acquire("fresh").await,
                    Err(Error::DirectoryReplaced { .. })
                ),
                "{what}: the old Locker took a lock nobody else sees"
            );
            assert!(!rival.is_lost(), "{what}");
        }
    }
}

#[cfg(unix)]
const PRIVDROP_CHILD: &str = "LEASEHOLD_TEST_PRIVDROP_CHILD";

/// A daemon opens its lock directory as root, then drops privileges; a
/// parent of the directory is closed to the service user, so the path can
/// no longer be looked at, but the directory works through its descriptor.
/// That proves nothing moved: the holder keeps its lock and new locks are
/// taken.
#[cfg(unix)]
fn privdrop_child() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let private = root.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let locks = private.join("locks");
    std::fs::create_dir(&locks).unwrap();
    std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o700)).unwrap();
    let (nobody, nogroup) = (
        nix::unistd::Uid::from_raw(65534),
        nix::unistd::Gid::from_raw(65534),
    );
    nix::unistd::chown(&locks, Some(nobody), Some(nogroup)).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let locker = moving_locker(&locks, Strategy::ExclusiveFile);
    let guard = runtime.block_on(locker.acquire("job")).unwrap();
    // nix has no setgroups for macOS.
    #[cfg(not(target_os = "macos"))]
    nix::unistd::setgroups(&[]).unwrap();
    nix::unistd::setgid(nogroup).unwrap();
    nix::unistd::setuid(nobody).unwrap();
    assert!(
        std::fs::metadata(&locks).is_err(),
        "the path should be closed to us now"
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !guard.is_lost(),
        "a live holder lost its lock though nothing moved"
    );
    runtime.block_on(guard.ensure_held()).unwrap();
    let fresh = runtime.block_on(locker.try_acquire("fresh")).unwrap();
    assert!(fresh.is_some(), "a fresh acquisition was refused");
    std::process::exit(0);
}

// Root dropping to another uid, and modes that close a path: Unix's.
#[cfg(unix)]
#[test]
fn a_lock_directory_whose_path_cannot_be_looked_at_is_not_a_loss() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root, to drop privileges in a child process");
        return;
    }
    let status = common::reexec::child_process()
        .env(PRIVDROP_CHILD, "1")
        .status()
        .unwrap();
    assert!(status.success(), "{status}");
}

/// A guard that finds itself lost also finds why: once `is_lost` says so,
/// the reason `release_all` gave is the one reported, never the lease's
/// end taken for it while the reason is being written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_seen_lost_is_seen_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..300 {
        let locker = Locker::new(dir.path()).unwrap();
        let guard = locker.acquire("reason").await.unwrap();
        let all = tokio::spawn({
            let locker = locker.clone();
            async move { locker.release_all().await }
        });
        let spin_until = std::time::Instant::now() + Duration::from_secs(20);
        while !guard.is_lost() {
            assert!(
                std::time::Instant::now() < spin_until,
                "round {round}: never lost"
            );
            std::hint::spin_loop();
        }
        match guard.ensure_held().await {
            Err(Error::Lost {
                reason: LossReason::ReleasedAtShutdown,
                ..
            }) => {}
            other => panic!("round {round}: {other:?}"),
        }
        all.await.unwrap();
    }
}
