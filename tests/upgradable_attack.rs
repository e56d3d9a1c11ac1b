//! Attacks on the upgradable shared lock (`acquire_upgradable`,
//! `upgrade`, `downgrade`) in the lock directory: each test is a way
//! another process (frozen, slow, or merely a neighbour) could take the
//! lock from a live upgrader, or a cost the upgradable holder imposes.
//!
//! Some need the failpoints (`--features failpoints`): a child process
//! stops itself (SIGSTOP) at a named step.

#![cfg(unix)] // SIGSTOP, /proc, the directory layout.

use std::path::{Path, PathBuf};
use std::time::Duration;

use leasehold::{LockGuard, Locker, PathStyle, Strategy};
use nix::sys::signal::Signal;

#[path = "support/common.rs"]
mod common;

use common::{ChildProc, say};

const NAME: &str = "n";
/// How long a child role that holds on waits before it ends.
#[cfg(feature = "failpoints")]
const CHILD_TTL: Duration = Duration::from_secs(40);
/// How long a child may take to say something, or to stop.
const CHILD_WITHIN: Duration = Duration::from_secs(20);

fn locker(dir: &Path, strategy: Strategy, lease: Duration, renew: Duration) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .path_style(PathStyle::Plain)
        .lease(lease)
        .renew_interval(renew)
        .build()
        .unwrap()
}

fn lock_path(dir: &Path) -> PathBuf {
    dir.join(format!("{NAME}.lock"))
}

/// The `uuid` of the record at the lock path (exclusive-file layout).
fn record_uuid(dir: &Path) -> String {
    let text = std::fs::read_to_string(lock_path(dir)).unwrap();
    let start = text.find("\"uuid\":\"").expect("a uuid") + 8;
    text[start..start + 36].to_owned()
}

// ---- The marker and the upgradable holder's member name ---------------------

/// A marker that names the upgradable holder (`m-up-<uuid>.json`) is not
/// a marker that names the dead: nobody re-signs it while that holder
/// lives. `Sign::marker_names_the_dead` looked for `m-<uuid>.json` only,
/// so every members-directory event in every holder's process re-signed
/// the marker (the mutation lock taken, the lock path rewritten) while
/// the upgradable holder was its representative.
#[tokio::test]
async fn a_marker_naming_the_live_upgradable_holder_is_not_resigned() {
    let dir = tempfile::tempdir().unwrap();
    let long = Duration::from_secs(30);
    let (a, b, c) = (
        locker(dir.path(), Strategy::ExclusiveFile, long, long / 3),
        locker(dir.path(), Strategy::ExclusiveFile, long, long / 3),
        locker(dir.path(), Strategy::ExclusiveFile, long, long / 3),
    );
    let up = a.acquire_upgradable(NAME).await.unwrap();
    let up_uuid = up.guard().owner().uuid().unwrap().to_owned();
    assert_eq!(
        record_uuid(dir.path()),
        up_uuid,
        "the first holder is the marker's"
    );
    // Two readers join (their joins, and each one's watcher, are events in
    // the members directory); nobody dies, no renewal is due.
    let r1 = b.acquire_shared(NAME).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r2 = c.acquire_shared(NAME).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        record_uuid(dir.path()),
        up_uuid,
        "the marker was re-signed although the holder it names is alive"
    );
    drop((r1, r2, up));
}

// ---- A frozen reader's unlocked marker signing ------------------------------

/// A reader frozen inside its unlocked marker signing
/// (`Member::sign_before_it_lapses`, taken when the mutation lock is busy
/// at its renewal), after its check that the lock path is its group's
/// marker and before its write, is judged dead once its lease runs out;
/// the upgrade then turns the marker *in place* into the exclusive lock.
/// When the reader runs again it writes its marker into that same inode:
/// the exclusive record becomes a shared marker whose members are all
/// gone, which any leasehold process reclaims at once, and a second
/// writer gets in beside the upgrader.
///
/// Before this feature a marker's inode never became an exclusive lock
/// (a new lock is a new inode, which the signer's identity check tells
/// apart), so the late write was harmless.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_readers_late_marker_write_does_not_unlock_the_upgraded_lock() {
    frozen_readers_late_marker_write(Strategy::ExclusiveFile).await;
}

/// The same on the directory layout: the reader, frozen in its unlocked
/// signing before it renames its record (written under a `.tmp-` name in
/// the members directory) over `owner.json` in the lock directory it
/// found (through that directory's descriptor), renames it there when it
/// runs again. Were the upgrade to rewrite `owner.json` of that same
/// directory in place, the exclusive record would become a marker whose
/// members are all gone, and a second writer would get in.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_readers_late_marker_write_does_not_unlock_the_upgraded_lock_directory() {
    frozen_readers_late_marker_write(Strategy::Directory).await;
}

/// The record at the lock path: the lock file, or the lock directory's
/// `owner.json`.
#[cfg(feature = "failpoints")]
fn read_record(dir: &Path, strategy: Strategy) -> String {
    let path = match strategy {
        Strategy::Directory => lock_path(dir).join("owner.json"),
        _ => lock_path(dir),
    };
    std::fs::read_to_string(path).unwrap_or_default()
}

#[cfg(feature = "failpoints")]
async fn frozen_readers_late_marker_write(strategy: Strategy) {
    let dir = tempfile::tempdir().unwrap();
    let lease = Duration::from_secs(2);
    let renew = Duration::from_millis(500);
    // Renewing less often than the reader, which so signs the marker first.
    let a = locker(dir.path(), strategy, lease, lease / 2);
    let up = a.acquire_upgradable(NAME).await.unwrap();

    let role = match strategy {
        Strategy::Directory => "frozen-reader-dir",
        _ => "frozen-reader",
    };
    let reader = spawn(role, dir.path());
    reader.expect("joined", CHILD_WITHIN);
    // Hold the name's mutation lock, so the reader's renewals sign the
    // marker without it; then let it arm its stop.
    let mutex = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.path().join(format!("{NAME}.lock.mutex")))
        .unwrap();
    mutex.lock().unwrap();
    std::fs::write(dir.path().join("go"), b"").unwrap();
    reader.wait_stopped("reader (in its unlocked signing)", Duration::from_secs(15));
    mutex.unlock().unwrap();
    drop(mutex);
    // A writer waits meanwhile (its announcement keeps the members
    // directory, where the reader makes its temporary record, in place).
    let waiting = locker(dir.path(), strategy, lease, renew);
    let waiter = tokio::spawn(async move { waiting.acquire_timeout(NAME, Duration::from_secs(12)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;

    // The frozen reader's lease runs out; the upgrade goes through.
    let writer = tokio::time::timeout(Duration::from_secs(10), up.upgrade())
        .await
        .expect("the upgrade waited past the frozen reader's lease")
        .unwrap();
    let text = read_record(dir.path(), strategy);
    assert!(
        text.contains("\"uuid\"") && !text.contains("\"mode\""),
        "the upgrade made an exclusive record: {text}"
    );

    // The reader runs again, and finishes its write.
    reader.signal(Signal::SIGCONT);
    tokio::time::sleep(Duration::from_millis(300)).await;

    assert!(
        !waiter.is_finished(),
        "the waiting writer got the lock beside the live upgrader (lock path now: {})",
        read_record(dir.path(), strategy)
    );
    waiter.abort();
    let other = locker(dir.path(), strategy, lease, renew);
    let second = other.try_acquire(NAME).await.unwrap();
    let text = read_record(dir.path(), strategy);
    assert!(
        second.is_none(),
        "a second writer got the lock beside the live upgrader (lock path now: {text})"
    );
    assert!(!writer.is_lost());
    drop(writer);
}

// ---- The downgrade of a lock file --------------------------------------------

/// While a downgrade of a lock file runs (between `Whole::dissolve` and
/// the rename of the new marker over the lock path), the upgrader is
/// alive, but the lock path holds its exclusive record with no flock on
/// it: the adopted lock's flock is on the marker's node, which `dissolve`
/// does not keep (it duplicates the write descriptor, which has none).
/// Every judge then finds it stale ("leasehold, this boot, flock free":
/// stale at once). The mutation lock, held meanwhile, keeps leasehold's
/// reclaimers out, but readers of the format (which promise a flock on
/// every leasehold record), `is_held`/`inspect` and a reclaimer that
/// does not wait for the name's mutation lock all see a dead holder.
#[cfg(feature = "failpoints")]
#[test]
fn a_lock_file_keeps_its_flock_through_a_downgrade() {
    let dir = tempfile::tempdir().unwrap();
    let child = spawn("downgrader", dir.path());
    child.expect("upgraded", CHILD_WITHIN);
    child.wait_stopped("downgrader", Duration::from_secs(15));
    // Frozen at `downgrade.before_marker`: the lock path's record is the
    // exclusive one still; its holder is alive.
    let file = std::fs::File::open(lock_path(dir.path())).unwrap();
    let text = std::fs::read_to_string(lock_path(dir.path())).unwrap();
    assert!(!text.contains("\"mode\""), "still the exclusive record: {text}");
    let free = file.try_lock().is_ok();
    child.signal(Signal::SIGCONT);
    assert!(
        !free,
        "the lock file's flock was free while its holder (alive, downgrading) held it"
    );
}

// ---- A holder frozen at the end of an upgrade or a downgrade ----------------

/// Lease of the frozen holders below.
const SHORT_LEASE: Duration = Duration::from_millis(800);

/// A writer of another process (this one) takes the name within ten
/// seconds while the child holder (the `frozen` of the panic) is frozen;
/// with the runtime its guard lives on.
fn writer_gets_in(dir: &Path, frozen: &str) -> (tokio::runtime::Runtime, LockGuard) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let other = locker(dir, Strategy::ExclusiveFile, SHORT_LEASE, SHORT_LEASE / 4);
    let writer = rt
        .block_on(other.acquire_timeout(NAME, Duration::from_secs(10)))
        .unwrap_or_else(|e| panic!("no writer got in while the {frozen} was frozen: {e}"));
    (rt, writer)
}

/// What the child said of its conversion, once it ran again.
#[allow(dead_code)]
fn conversion_after_a_freeze(role: &str, way: &str) {
    let dir = tempfile::tempdir().unwrap();
    let child = spawn(role, dir.path());
    child.expect("armed", CHILD_WITHIN);
    child.wait_stopped(way, Duration::from_secs(15));
    // The frozen holder's new lease runs out; a writer of another process
    // gets the name (the holder is frozen after its conversion, with
    // nothing locked but its new holding).
    let (_rt, writer) = writer_gets_in(dir.path(), way);
    assert!(!writer.is_lost());
    child.signal(Signal::SIGCONT);
    let said = child.next_line(CHILD_WITHIN);
    drop(writer);
    assert_eq!(
        said, "lost",
        "the {way} returned a guard although a writer of another process got in \
         between (the holder was frozen past its lease before it returned): the \
         {way} must end in Error::Lost"
    );
}

/// An upgrade whose process is frozen (SIGSTOP) after the store turned
/// the share into the exclusive lock, before `upgrade()` returned, for
/// longer than the lease: a writer of another process gets the name
/// meanwhile (the exclusive lease ran out). `upgrade()` then returned
/// `Ok` with a guard already lost: the caller took "nobody got in
/// between" from it, and `tests/torture_upgradable.rs` counted the
/// upgradable section as held up to that return (22 overlaps). It must
/// return `Error::Lost`.
#[cfg(feature = "failpoints")]
#[test]
fn an_upgrade_frozen_before_it_returns_past_its_lease_is_lost() {
    conversion_after_a_freeze("upgrader-frozen-at-return", "upgrade");
}

/// The same for a downgrade frozen after the store made the new
/// upgradable holding, before `downgrade()` returned.
#[cfg(feature = "failpoints")]
#[test]
fn a_downgrade_frozen_before_it_returns_past_its_lease_is_lost() {
    conversion_after_a_freeze("downgrader-frozen-at-return", "downgrade");
}

/// An upgrade whose process is frozen past its lease after its last look
/// at the lease, before the conversion: on waking, the renewal thread
/// takes the lost lock out of the lease first, and the conversion found
/// nothing to convert: `Error::Unsupported` ("converting a lock that is
/// no longer held"), which the torture took for a failure that excuses
/// nothing (9 and 27 overlaps). It must be `Error::Lost`.
#[cfg(feature = "failpoints")]
#[test]
fn an_upgrade_frozen_before_its_conversion_past_its_lease_is_lost() {
    conversion_after_a_freeze("upgrader-frozen-before-convert", "upgrade");
}

/// The same for a downgrade.
#[cfg(feature = "failpoints")]
#[test]
fn a_downgrade_frozen_before_its_conversion_past_its_lease_is_lost() {
    conversion_after_a_freeze("downgrader-frozen-before-convert", "downgrade");
}

/// The upgradable guard a downgrade made counts itself lost once its lease
/// ran out while its process was frozen (SIGSTOP by the parent), as soon
/// as it runs again, before any renewal.
#[test]
fn a_downgraded_holding_frozen_past_its_lease_counts_itself_lost() {
    let dir = tempfile::tempdir().unwrap();
    let child = spawn("downgraded-then-frozen", dir.path());
    child.expect("downgraded", CHILD_WITHIN);
    child.signal(Signal::SIGSTOP);
    child.wait_stopped("downgraded holder", Duration::from_secs(15));
    let (_rt, writer) = writer_gets_in(dir.path(), "downgraded holder");
    std::fs::write(dir.path().join("go"), b"").unwrap();
    child.signal(Signal::SIGCONT);
    let said = child.next_line(CHILD_WITHIN);
    drop(writer);
    assert_eq!(said, "lost=true", "the downgraded holder did not see its loss");
}

/// A reader of another process joins as soon as a downgrade has
/// published its marker, before `downgrade()` returned, and a writer does
/// not; a kill of the downgrader then frees the name. What a CI run of
/// `tests/torture_upgradable.rs` met (2026-12-06): the downgrader was
/// killed at that point, and the torture, which logged the end of the
/// exclusive section only once the downgrade returned, counted it held
/// until the kill, and the reader as a violation (now it logs the call
/// first).
#[cfg(feature = "failpoints")]
#[test]
fn a_reader_joins_a_downgrade_that_has_not_returned() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = spawn("downgrader-frozen-after-publish", dir.path());
    child.expect("armed", CHILD_WITHIN);
    child.wait_stopped("downgrader", Duration::from_secs(15));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let other = locker(dir.path(), Strategy::ExclusiveFile, SHORT_LEASE, SHORT_LEASE / 4);
    let reader = rt.block_on(other.try_acquire_shared(NAME)).unwrap();
    assert!(
        reader.is_some(),
        "no reader got in after the downgrade published its marker"
    );
    assert!(
        rt.block_on(other.try_acquire(NAME)).unwrap().is_none(),
        "a writer got in while the downgrader held the name"
    );
    drop(reader);
    child.kill();
    let writer = rt.block_on(other.acquire_timeout(NAME, Duration::from_secs(10)));
    assert!(
        writer.is_ok(),
        "the killed downgrader's holding stayed: {writer:?}"
    );
}

// ---- Children ---------------------------------------------------------------

#[test]
fn child_process_entry() {
    common::child_entry_with(|role, args| async move {
        run_role(&role, PathBuf::from(&args[0])).await;
        0
    });
}

/// A child's role, in the directory `dir`.
async fn run_role(role: &str, dir: PathBuf) {
    match role {
        #[cfg(feature = "failpoints")]
        "frozen-reader" | "frozen-reader-dir" => {
            let lease = Duration::from_secs(2);
            let (strategy, point) = match role {
                "frozen-reader-dir" => (Strategy::Directory, "group.sign.before_tmp"),
                _ => (Strategy::ExclusiveFile, "group.marker.before_rewrite"),
            };
            let locker = locker(&dir, strategy, lease, Duration::from_millis(500));
            let _guard = locker.acquire_shared(NAME).await.unwrap();
            say("joined");
            while !dir.join("go").exists() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // The parent holds the mutation lock from here on: the next
            // marker write is the unlocked one. Stop there, once.
            let seen = std::sync::atomic::AtomicBool::new(false);
            fail::cfg_callback(point, move || {
                if !seen.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
                }
            })
            .unwrap();
            tokio::time::sleep(CHILD_TTL).await;
        }
        // Upgraded, then frozen in its downgrade: before its marker goes
        // up, or (with a lease that outlasts the test: only the kill ends
        // it) just after.
        #[cfg(feature = "failpoints")]
        "downgrader" | "downgrader-frozen-after-publish" => {
            let (lease, renew, point, said) = match role {
                "downgrader" => (
                    Duration::from_secs(10),
                    Duration::from_secs(3),
                    "downgrade.before_marker",
                    "upgraded",
                ),
                _ => (
                    Duration::from_secs(60),
                    Duration::from_secs(15),
                    "downgrade.before_tokens",
                    "armed",
                ),
            };
            let locker = locker(&dir, Strategy::ExclusiveFile, lease, renew);
            let writer = locker
                .acquire_upgradable(NAME)
                .await
                .unwrap()
                .upgrade()
                .await
                .unwrap();
            fail::cfg_callback(point, || {
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
            })
            .unwrap();
            say(said);
            let _up = writer.downgrade().await.unwrap();
            tokio::time::sleep(CHILD_TTL).await;
        }
        #[cfg(feature = "failpoints")]
        "upgrader-frozen-at-return"
        | "downgrader-frozen-at-return"
        | "upgrader-frozen-before-convert"
        | "downgrader-frozen-before-convert" => {
            let locker = locker(&dir, Strategy::ExclusiveFile, SHORT_LEASE, SHORT_LEASE / 4);
            let up = locker.acquire_upgradable(NAME).await.unwrap();
            let point = match role {
                "upgrader-frozen-at-return" => "upgrade.before_return",
                "downgrader-frozen-at-return" => "downgrade.before_return",
                "upgrader-frozen-before-convert" => "upgrade.before_convert",
                _ => "downgrade.before_convert",
            };
            let stop = || {
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
                // Woken: the renewal thread runs first (as it may).
                std::thread::sleep(Duration::from_millis(200));
            };
            let converted = if point.starts_with("upgrade.") {
                fail::cfg_callback(point, stop).unwrap();
                say("armed");
                up.upgrade().await.map(drop)
            } else {
                let writer = up.upgrade().await.unwrap();
                fail::cfg_callback(point, stop).unwrap();
                say("armed");
                writer.downgrade().await.map(drop)
            };
            match converted {
                Ok(()) => say("returned a guard"),
                Err(e) if e.is_lost() => say("lost"),
                Err(e) => say(&format!("error {e}")),
            }
        }
        "downgraded-then-frozen" => {
            let locker = locker(&dir, Strategy::ExclusiveFile, SHORT_LEASE, SHORT_LEASE / 4);
            let up = locker.acquire_upgradable(NAME).await.unwrap();
            let up = up.upgrade().await.unwrap().downgrade().await.unwrap();
            say("downgraded");
            while !dir.join("go").exists() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            say(&format!("lost={}", up.guard().is_lost()));
        }
        other => panic!("unknown role {other}"),
    }
}

/// A child playing `role` in the directory `dir`.
fn spawn(role: &str, dir: &Path) -> ChildProc {
    ChildProc::spawn(role, &[dir.to_str().unwrap()])
}

// ---- Fencing tokens after a conversion -------------------------------------

/// An upgrade (or a downgrade) whose name's mutation lock another process
/// takes right after the conversion (to join, to judge, to leave) keeps
/// the lock it converted to. Taking the fencing tokens needs that lock
/// and gives up at once when it is busy; the conversion reported its lock
/// lost then (under Wine, where a mutation lock is held for milliseconds,
/// most upgrades of the upgradable torture did), although nothing had
/// happened to it. An upgrade now takes its tokens before it lets the
/// lock go; a downgrade's shared tokens need no lock.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_mutation_lock_after_a_conversion_costs_it_nothing() {
    for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
        let dir = tempfile::tempdir().unwrap();
        let locker = Locker::builder()
            .directory(dir.path())
            .strategy(strategy)
            .path_style(PathStyle::Plain)
            .fencing(true)
            .build()
            .unwrap();
        for point in ["upgrade.before_tokens", "downgrade.before_tokens"] {
            let up = locker.acquire_upgradable(NAME).await.unwrap();
            // Someone takes the name's mutation lock for 100 ms just then
            // (as soon as it is free: the upgrade takes its tokens before
            // it lets the lock go, now).
            let mutex = common::mutex_of(&lock_path(dir.path()));
            let busy = move || {
                let mutex = mutex.clone();
                fail::cfg_callback(point, move || {
                    let mutex = mutex.clone();
                    let (took, taken) = std::sync::mpsc::channel();
                    std::thread::spawn(move || {
                        let held = common::frozen_flock(&mutex);
                        let _ = took.send(());
                        std::thread::sleep(Duration::from_millis(100));
                        drop(held);
                    });
                    // Where the conversion does not hold the lock here (the
                    // downgrade), it is taken before the conversion goes on.
                    let _ = taken.recv_timeout(Duration::from_millis(50));
                })
                .unwrap();
            };
            let (token, held) = if point.starts_with("downgrade") {
                let writer = up.upgrade().await.unwrap();
                busy();
                let up = writer.downgrade().await;
                fail::remove(point);
                let up = up.unwrap_or_else(|e| panic!("{strategy:?} {point}: {e}"));
                (up.guard().fencing_token(), locker.is_held(NAME).await.unwrap())
            } else {
                busy();
                let writer = up.upgrade().await;
                fail::remove(point);
                let writer = writer.unwrap_or_else(|e| panic!("{strategy:?} {point}: {e}"));
                (writer.fencing_token(), locker.is_held(NAME).await.unwrap())
            };
            assert!(token.is_some(), "{strategy:?} {point}: no fencing token");
            assert!(held, "{strategy:?} {point}");
        }
    }
}
