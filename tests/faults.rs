//! Fault injection. Every fault must give a distinct typed error or a
//! reported loss: never a hang (every call is bounded by a generous
//! timeout) and never a panic (a panic hook counts them, including panics
//! on Tokio's blocking pool, which would otherwise come back as an I/O
//! error).
//!
//! Permission faults mean nothing to root, for whom chmod restricts
//! nothing. As root they are skipped in-process, with the reason printed,
//! and run instead in a child process (this binary, re-run with
//! `LEASEHOLD_FAULTS_ROLE`) that drops to uid/gid 65534; if it cannot, the
//! skip is printed.
// Other users, permission modes and signals (`setuid`, `chmod`, SIGSTOP) have no Windows twins.
#![cfg(unix)]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[path = "support/reexec.rs"]
mod reexec;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use leasehold::{Error, Locker, Strategy};
use nix::sys::stat::Mode;
use nix::unistd::{Gid, Uid};

const ROLE_ENV: &str = "LEASEHOLD_FAULTS_ROLE";
const DIR_ENV: &str = "LEASEHOLD_FAULTS_DIR";
/// Far beyond anything these calls should take: reaching it is a hang.
const BOUND: Duration = Duration::from_secs(10);
const STRATEGIES: [Strategy; 2] = [Strategy::ExclusiveFile, Strategy::Directory];
const NOBODY: u32 = 65534;
/// Exit code of a child that could not drop its privileges.
const CANNOT_DROP: i32 = 77;

static PANICS: AtomicU64 = AtomicU64::new(0);

/// Counts panics off the tests' own threads (Tokio's workers and blocking
/// pool, leasehold's renewal thread), then reports them as usual. A test
/// body's own panic fails that test anyway; these would otherwise be
/// swallowed, or come back as an I/O error.
fn count_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            let name = thread.name().unwrap_or("");
            if name.is_empty() || name.starts_with("tokio") || name.starts_with("leasehold") {
                PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
}

async fn bounded<F: Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(BOUND, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: no answer within {BOUND:?} (hang)"),
    }
}

fn label(strategy: Strategy) -> &'static str {
    if strategy == Strategy::Directory {
        "directory"
    } else {
        "exclusive-file"
    }
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", path.display()));
}

fn mode_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().expect("spawn true");
    let pid = child.id();
    child.wait().expect("reap");
    pid
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A file outside the lock directory that leasehold must never change.
struct Sentinel {
    path: PathBuf,
    content: Vec<u8>,
    mode: u32,
    mtime: SystemTime,
}

impl Sentinel {
    fn new(path: PathBuf, content: &[u8], age: Duration) -> Self {
        std::fs::write(&path, content).unwrap();
        set_mode(&path, 0o644);
        let mtime = SystemTime::now() - age;
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        Sentinel {
            path,
            content: content.to_vec(),
            mode: 0o644,
            mtime,
        }
    }

    fn check(&self, when: &str) {
        let meta = std::fs::symlink_metadata(&self.path)
            .unwrap_or_else(|e| panic!("{when}: sentinel {} is gone: {e}", self.path.display()));
        assert!(meta.is_file(), "{when}: sentinel is no longer a regular file");
        assert_eq!(
            std::fs::read(&self.path).unwrap(),
            self.content,
            "{when}: sentinel content changed"
        );
        assert_eq!(meta.mode() & 0o7777, self.mode, "{when}: sentinel mode changed");
        assert_eq!(
            meta.modified().unwrap(),
            self.mtime,
            "{when}: sentinel was written"
        );
    }
}

fn expect_unexpected<T: Debug>(what: &str, result: leasehold::Result<T>, kind: &str) {
    match result {
        Err(Error::UnexpectedFile { found, .. }) => {
            assert_eq!(found, kind, "{what}: UnexpectedFile names the wrong kind")
        }
        other => panic!("{what}: expected UnexpectedFile({kind}), got {other:?}"),
    }
}

fn expect_permission<T: Debug>(what: &str, result: leasehold::Result<T>) {
    match result {
        Err(Error::PermissionDenied { .. }) => {}
        other => panic!("{what}: expected PermissionDenied, got {other:?}"),
    }
}

// ------------------------------------------------------- deleted directory

/// A `Locker` whose directory is gone (or replaced) says so, naming it.
fn expect_replaced<T: Debug>(what: &str, result: leasehold::Result<T>) {
    match result {
        Err(Error::DirectoryReplaced { ref path }) => assert!(path.ends_with("locks"), "{what}: {path:?}"),
        other => panic!("{what}: expected Error::DirectoryReplaced, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lock_directory_is_a_loss_then_a_typed_error() {
    count_panics();
    for strategy in STRATEGIES {
        let what = label(strategy);
        let tmp = tempfile::tempdir().unwrap();
        let locks = tmp.path().join("locks");
        let locker = Locker::builder()
            .directory(&locks)
            .strategy(strategy)
            .fencing(true)
            .lease(Duration::from_millis(1000))
            .renew_interval(Duration::from_millis(100))
            .build()
            .unwrap();
        let guard = bounded(what, locker.acquire("job")).await.unwrap();
        std::fs::remove_dir_all(&locks).unwrap();
        let deleted = Instant::now();
        bounded(what, guard.lost()).await;
        assert!(
            deleted.elapsed() < Duration::from_secs(2),
            "{what}: loss reported after {:?}",
            deleted.elapsed()
        );
        assert!(guard.is_lost());
        assert!(bounded(what, guard.ensure_held()).await.unwrap_err().is_lost());

        // While the lost guard lives, its name stays taken in this process
        // (its holder may still be in its critical section): busy, or an
        // error, but never a wait.
        match bounded(what, locker.try_acquire("job")).await {
            Ok(None) | Err(Error::DirectoryReplaced { .. }) => {}
            other => panic!("{what}: try_acquire of the lost name: {other:?}"),
        }
        expect_replaced(
            &format!("{what}: try_acquire"),
            bounded(what, locker.try_acquire("another")).await,
        );
        expect_replaced(
            &format!("{what}: acquire"),
            bounded(what, locker.acquire("other")).await,
        );
        expect_replaced(
            &format!("{what}: acquire_timeout"),
            bounded(what, locker.acquire_timeout("third", Duration::from_millis(100))).await,
        );
        // Looking may find nothing or fail; it must answer.
        match bounded(what, locker.holder("job")).await {
            Ok(None) | Err(Error::Io { .. }) => {}
            other => panic!("{what}: holder() in a deleted directory: {other:?}"),
        }
        match bounded(what, locker.list()).await {
            Ok(locks) => assert!(locks.is_empty(), "{what}: {locks:?}"),
            Err(Error::Io { .. }) => {}
            Err(other) => panic!("{what}: list(): {other:?}"),
        }
        match bounded(what, locker.clean(false)).await {
            Ok(cleaned) => assert!(cleaned.is_empty(), "{what}: {cleaned:?}"),
            Err(Error::Io { .. }) => {}
            Err(other) => panic!("{what}: clean(): {other:?}"),
        }
        assert!(bounded(what, guard.release()).await.unwrap_err().is_lost());
        expect_replaced(
            &format!("{what}: acquire of the lost name"),
            bounded(what, locker.acquire("job")).await,
        );
        // The Locker keeps its (deleted) directory, even if the path comes
        // back (it names another directory now); a new Locker on the new
        // directory works.
        std::fs::create_dir(&locks).unwrap();
        expect_replaced(
            &format!("{what}: try_acquire after re-creation"),
            bounded(what, locker.try_acquire("job")).await,
        );
        let fresh = Locker::builder()
            .directory(&locks)
            .strategy(strategy)
            .build()
            .unwrap();
        drop(bounded(what, fresh.acquire("job")).await.unwrap());
    }
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "something panicked");
}

// ------------------------------------------------------ permission faults

#[test]
fn child_process_entry() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    let base = PathBuf::from(std::env::var_os(DIR_ENV).expect("base dir"));
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(60));
        std::process::exit(3);
    });
    count_panics();
    // nix has no setgroups for macOS.
    #[cfg(not(target_os = "macos"))]
    let groups = nix::unistd::setgroups(&[]);
    #[cfg(target_os = "macos")]
    let groups = Ok(());
    let dropped = groups
        .and_then(|()| nix::unistd::setgid(Gid::from_raw(NOBODY)))
        .and_then(|()| nix::unistd::setuid(Uid::from_raw(NOBODY)));
    if let Err(e) = dropped {
        eprintln!("faults child: cannot drop to uid {NOBODY}: {e}");
        std::process::exit(CANNOT_DROP);
    }
    if nix::unistd::geteuid().is_root() {
        std::process::exit(CANNOT_DROP);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        match role.as_str() {
            "read_only" => read_only_directory(&base).await,
            "eacces" => unreadable_owner_record(&base).await,
            "others_lock" => another_users_stale_lock(&base).await,
            other => panic!("unknown role {other}"),
        }
    });
    std::process::exit(0);
}

/// Runs a permission scenario where chmod means something: here when not
/// root, else in a child process dropped to uid 65534.
fn unprivileged(role: &str, what: &str) {
    count_panics();
    let tmp = tempfile::tempdir().unwrap();
    if !nix::unistd::geteuid().is_root() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            match role {
                "read_only" => read_only_directory(tmp.path()).await,
                _ => unreadable_owner_record(tmp.path()).await,
            }
        });
        return;
    }
    eprintln!(
        "{what}: skipped in this process: it runs as root, and chmod does not restrict root; \
         running it in a child process as uid {NOBODY} instead"
    );
    nix::unistd::chown(
        tmp.path(),
        Some(Uid::from_raw(NOBODY)),
        Some(Gid::from_raw(NOBODY)),
    )
    .unwrap();
    as_nobody(role, tmp.path(), what);
}

/// Runs `role` in a child process dropped to uid 65534, on `dir`; skips
/// (with a note) where the child cannot drop its privileges.
fn as_nobody(role: &str, dir: &Path, what: &str) {
    let mut child = reexec::child_process()
        .env(ROLE_ENV, role)
        .env(DIR_ENV, dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = child.wait();
            panic!("{what}: the unprivileged child hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if status.code() == Some(CANNOT_DROP) {
        eprintln!("{what}: skipped: running as root and could not drop to uid {NOBODY} in a child");
        return;
    }
    assert!(
        status.success(),
        "{what}: the unprivileged child failed: {status}"
    );
}

#[test]
fn a_read_only_lock_directory_gives_permission_errors() {
    unprivileged("read_only", "read-only lock directory");
}

#[test]
fn an_unreadable_owner_record_gives_permission_errors() {
    unprivileged("eacces", "EACCES on the owner record");
}

async fn read_only_directory(base: &Path) {
    for strategy in STRATEGIES {
        let what = label(strategy);
        let locks = base.join(format!("ro-{what}"));
        let renew = Duration::from_millis(100);
        let locker = Locker::builder()
            .directory(&locks)
            .strategy(strategy)
            .lease(Duration::from_millis(1000))
            .renew_interval(renew)
            .build()
            .unwrap();
        let held = bounded(what, locker.acquire("held")).await.unwrap();
        set_mode(&locks, 0o500);
        // New locks cannot be made: a typed error at once, never a wait.
        expect_permission(
            &format!("{what}: try_acquire"),
            bounded(what, locker.try_acquire("fresh")).await,
        );
        expect_permission(
            &format!("{what}: acquire"),
            bounded(what, locker.acquire("fresh")).await,
        );
        expect_permission(
            &format!("{what}: acquire_timeout"),
            bounded(what, locker.acquire_timeout("fresh", Duration::from_millis(100))).await,
        );
        assert!(bounded(what, locker.holder("fresh")).await.unwrap().is_none());
        // The held lock keeps its lease: renewal writes through descriptors
        // and inside the lock's own directory.
        tokio::time::sleep(renew * 4).await;
        assert!(!held.is_lost(), "{what}: a read-only directory cost the lease");
        assert!(bounded(what, locker.holder("held")).await.unwrap().is_some());
        // Releasing must remove a name from the directory: a typed error.
        expect_permission(&format!("{what}: release"), bounded(what, held.release()).await);
        set_mode(&locks, 0o700);
        // What the failed release left is reclaimed: its flock is gone.
        let again = bounded(what, locker.acquire("held")).await.unwrap();
        bounded(what, again.release()).await.unwrap();
        drop(bounded(what, locker.acquire("fresh")).await.unwrap());
    }
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "something panicked");
}

async fn unreadable_owner_record(base: &Path) {
    for strategy in STRATEGIES {
        let what = label(strategy);
        let locks = base.join(format!("eacces-{what}"));
        // Long renewals: the directory strategy replaces owner.json (and so
        // its mode) at each one.
        let holder = Locker::builder()
            .directory(&locks)
            .strategy(strategy)
            .lease(Duration::from_secs(60))
            .renew_interval(Duration::from_secs(20))
            .build()
            .unwrap();
        let other = Locker::builder()
            .directory(&locks)
            .strategy(strategy)
            .build()
            .unwrap();
        let guard = bounded(what, holder.acquire("job")).await.unwrap();
        let path = holder.lock_path("job").unwrap();
        let record = if strategy == Strategy::Directory {
            path.join("owner.json")
        } else {
            path.clone()
        };
        set_mode(&record, 0o000);
        expect_permission(
            &format!("{what}: try_acquire"),
            bounded(what, other.try_acquire("job")).await,
        );
        expect_permission(
            &format!("{what}: acquire_timeout"),
            bounded(what, other.acquire_timeout("job", Duration::from_millis(200))).await,
        );
        expect_permission(
            &format!("{what}: acquire"),
            bounded(what, other.acquire("job")).await,
        );
        expect_permission(
            &format!("{what}: holder"),
            bounded(what, other.holder("job")).await,
        );
        assert!(record.exists(), "{what}: the unreadable record was removed");
        set_mode(&record, 0o600);
        assert!(bounded(what, other.try_acquire("job")).await.unwrap().is_none());
        assert!(!guard.is_lost());
        bounded(what, guard.release()).await.unwrap();
        drop(
            bounded(what, other.try_acquire("job"))
                .await
                .unwrap()
                .expect("free now"),
        );
    }
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "something panicked");
}

/// In a shared sticky directory (`/tmp`, `/run/lock`), a stale lock file
/// of another user can be judged but not removed (the sticky bit): an
/// acquisition fails with `Error::PermissionDenied` instead of waiting or
/// pretending, and the file stays. Root sets it up; the scenario runs as
/// uid 65534.
#[test]
fn another_users_stale_lock_in_a_sticky_directory_is_a_permission_error() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to make a file of another user");
        return;
    }
    count_panics();
    let tmp = tempfile::tempdir().unwrap();
    set_mode(tmp.path(), 0o755);
    let shared = tmp.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    set_mode(&shared, 0o1777);
    let locker = Locker::new(&shared).unwrap();
    let path = locker.lock_path("job").unwrap();
    std::fs::write(&path, format!(r#"{{"uuid":"root's","pid":{}}}"#, dead_pid())).unwrap();
    set_mode(&path, 0o644);
    as_nobody("others_lock", &shared, "another user's stale lock");
    assert!(path.exists(), "another user's lock file was removed");
}

async fn another_users_stale_lock(shared: &Path) {
    let locker = Locker::new(shared).unwrap();
    let info = locker.inspect("job").await.unwrap().expect("a lock is there");
    assert_eq!(info.stale_reason(), Some(leasehold::StaleReason::DeadOwner));
    expect_permission(
        "try_acquire",
        bounded("try_acquire", locker.try_acquire("job")).await,
    );
    expect_permission(
        "acquire_timeout",
        bounded(
            "acquire_timeout",
            locker.acquire_timeout("job", Duration::from_secs(2)),
        )
        .await,
    );
    assert!(locker.lock_path("job").unwrap().exists());
    // Another name in the same directory is this user's to take.
    drop(locker.try_acquire("mine").await.unwrap().expect("free"));
}

// -------------------------------------------- things planted at lock path

/// What a planted object should make leasehold do.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// `UnexpectedFile` of this kind, from every call; the object stays.
    Unexpected(&'static str),
    /// Judged as a lock held by someone (an unreadable record within its
    /// grace period): busy, and left alone.
    Busy,
    /// Judged abandoned and reclaimed: the lock is ours.
    Reclaimed,
}

struct Planted<'a> {
    what: &'a str,
    expect: Expect,
    plant: &'a dyn Fn(&Path, &Path),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_objects_at_the_lock_path_are_refused_and_never_followed() {
    count_panics();
    for strategy in STRATEGIES {
        let dir_strategy = strategy == Strategy::Directory;
        let link_expect = |regular: Expect| {
            if dir_strategy {
                Expect::Unexpected("regular file")
            } else {
                regular
            }
        };
        let cases: Vec<Planted<'_>> = vec![
            Planted {
                what: "a directory",
                // An empty directory is a lock with no record yet, for the
                // directory strategy.
                expect: if dir_strategy {
                    Expect::Busy
                } else {
                    Expect::Unexpected("directory")
                },
                plant: &|p, _| std::fs::create_dir(p).unwrap(),
            },
            Planted {
                what: "a FIFO",
                expect: Expect::Unexpected("FIFO"),
                plant: &|p, _| nix::unistd::mkfifo(p, Mode::from_bits_truncate(0o644)).unwrap(),
            },
            Planted {
                what: "a symlink to a sentinel file outside",
                expect: Expect::Unexpected("symlink"),
                plant: &|p, out| std::os::unix::fs::symlink(out.join("sentinel"), p).unwrap(),
            },
            Planted {
                what: "a symlink to a directory outside",
                expect: Expect::Unexpected("symlink"),
                plant: &|p, out| std::os::unix::fs::symlink(out.join("sentinel-dir"), p).unwrap(),
            },
            Planted {
                what: "a dangling symlink to a path outside",
                expect: Expect::Unexpected("symlink"),
                plant: &|p, out| std::os::unix::fs::symlink(out.join("must-not-appear"), p).unwrap(),
            },
            Planted {
                what: "a hard link to a fresh sentinel",
                expect: link_expect(Expect::Busy),
                plant: &|p, out| std::fs::hard_link(out.join("sentinel"), p).unwrap(),
            },
            Planted {
                what: "a hard link to an old sentinel",
                expect: link_expect(Expect::Reclaimed),
                plant: &|p, out| std::fs::hard_link(out.join("old-sentinel"), p).unwrap(),
            },
            Planted {
                what: "a hard link to an old sentinel of data",
                expect: link_expect(Expect::Unexpected("file that holds no lock record")),
                plant: &|p, out| std::fs::hard_link(out.join("data-sentinel"), p).unwrap(),
            },
            Planted {
                what: "a hard link to a sentinel holding a dead owner's record",
                expect: link_expect(Expect::Reclaimed),
                plant: &|p, out| std::fs::hard_link(out.join("dead-sentinel"), p).unwrap(),
            },
        ];
        for case in cases {
            planted(strategy, &case).await;
        }
    }
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "something panicked");
}

async fn planted(strategy: Strategy, case: &Planted<'_>) {
    let what = format!("{} / {}", label(strategy), case.what);
    let what = what.as_str();
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let sentinels = [
        // Records cut short (a JSON object's start): locks being written.
        Sentinel::new(
            outside.join("sentinel"),
            br#"{"uuid":"sentinel: never touch""#,
            Duration::ZERO,
        ),
        Sentinel::new(
            outside.join("old-sentinel"),
            br#"{"uuid":"old sentinel: never touch""#,
            Duration::from_secs(3600),
        ),
        // No writer's record, even cut short: not a lock.
        Sentinel::new(
            outside.join("data-sentinel"),
            b"data sentinel: never touch\n",
            Duration::from_secs(3600),
        ),
        Sentinel::new(
            outside.join("dead-sentinel"),
            format!(r#"{{"uuid":"sentinel","pid":{}}}"#, dead_pid()).as_bytes(),
            Duration::from_secs(3600),
        ),
    ];
    std::fs::create_dir(outside.join("sentinel-dir")).unwrap();
    let inner = Sentinel::new(
        outside.join("sentinel-dir").join("inside"),
        b"inside\n",
        Duration::ZERO,
    );
    let outside_before = listing(&outside);
    let locks = tmp.path().join("locks");
    let locker = Locker::builder()
        .directory(&locks)
        .strategy(strategy)
        .build()
        .unwrap();
    let path = locker.lock_path("job").unwrap();
    (case.plant)(&path, &outside);
    let kind_before = std::fs::symlink_metadata(&path).unwrap().file_type();

    match case.expect {
        Expect::Unexpected(kind) => {
            expect_unexpected(
                &format!("{what}: try_acquire"),
                bounded(what, locker.try_acquire("job")).await,
                kind,
            );
            expect_unexpected(
                &format!("{what}: acquire_timeout"),
                bounded(what, locker.acquire_timeout("job", Duration::from_millis(100))).await,
                kind,
            );
            expect_unexpected(
                &format!("{what}: acquire"),
                bounded(what, locker.acquire("job")).await,
                kind,
            );
            expect_unexpected(
                &format!("{what}: holder"),
                bounded(what, locker.holder("job")).await,
                kind,
            );
            // list() skips what is not a lock; clean() leaves it alone.
            bounded(what, locker.list()).await.unwrap();
            bounded(what, locker.clean(false)).await.unwrap();
            let meta = std::fs::symlink_metadata(&path)
                .unwrap_or_else(|_| panic!("{what}: the planted object was removed"));
            assert_eq!(
                meta.file_type(),
                kind_before,
                "{what}: the planted object changed"
            );
        }
        Expect::Busy => {
            let got = bounded(what, locker.try_acquire("job")).await;
            assert!(matches!(got, Ok(None)), "{what}: try_acquire: {got:?}");
            let got = bounded(what, locker.acquire_timeout("job", Duration::from_millis(100))).await;
            assert!(
                matches!(got, Err(Error::Timeout { .. })),
                "{what}: acquire_timeout: {got:?}"
            );
            let owner = bounded(what, locker.holder("job")).await.unwrap();
            assert!(owner.is_some_and(|o| !o.is_readable()), "{what}: holder");
            assert!(path.exists(), "{what}: removed within its grace period");
        }
        Expect::Reclaimed => {
            let guard = bounded(what, locker.try_acquire("job"))
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("{what}: not reclaimed"));
            for s in &sentinels {
                s.check(&format!("{what}, while the lock is held"));
            }
            bounded(what, guard.release()).await.unwrap();
        }
    }
    let at_path = std::fs::symlink_metadata(&path).ok();
    for s in &sentinels {
        s.check(what);
        let meta = std::fs::metadata(&s.path).unwrap();
        let linked = at_path.as_ref().is_some_and(|m| m.ino() == meta.ino());
        assert_eq!(
            meta.nlink(),
            1 + u64::from(linked),
            "{what}: links to {}",
            s.path.display()
        );
    }
    inner.check(what);
    assert_eq!(
        listing(&outside),
        outside_before,
        "{what}: something was created outside"
    );
    assert_eq!(listing(&outside.join("sentinel-dir")), ["inside"], "{what}");
}

// ------------------------------------------------------ hostile swapping

/// Removes whatever is at `path`, without following it.
fn remove_any(path: &Path) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            let _ = std::fs::remove_dir_all(path);
        }
        Ok(_) => {
            let _ = std::fs::remove_file(path);
        }
        Err(_) => {}
    }
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Replaces the lock path, as fast as it can, with a regular file of junk,
/// a symlink to the sentinel (or its directory), a FIFO, a hard link to the
/// sentinel, or a directory (empty, or holding a hostile `owner.json`).
fn swapper(path: PathBuf, outside: PathBuf, stop: Arc<AtomicBool>) -> u64 {
    let mut rng = Rng(0x5eed_1234_abcd_ef01 ^ u64::from(std::process::id()));
    let mut swaps = 0;
    let sentinel = outside.join("sentinel");
    while !stop.load(Ordering::Relaxed) {
        remove_any(&path);
        let _ = match rng.below(9) {
            0 => std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .and_then(|mut f| std::io::Write::write_all(&mut f, b"{not a record")),
            1 => std::os::unix::fs::symlink(&sentinel, &path),
            2 => std::os::unix::fs::symlink(outside.join("sentinel-dir"), &path),
            3 => nix::unistd::mkfifo(&path, Mode::from_bits_truncate(0o644)).map_err(std::io::Error::from),
            4 => std::fs::hard_link(&sentinel, &path),
            5 => std::fs::create_dir(&path),
            6 => std::fs::create_dir(&path)
                .and_then(|()| std::os::unix::fs::symlink(&sentinel, path.join("owner.json"))),
            7 => std::fs::create_dir(&path).and_then(|()| {
                nix::unistd::mkfifo(&path.join("owner.json"), Mode::from_bits_truncate(0o644))
                    .map_err(std::io::Error::from)
            }),
            _ => std::fs::create_dir(&path)
                .and_then(|()| std::fs::hard_link(&sentinel, path.join("owner.json"))),
        };
        swaps += 1;
        // Now and then leave it long enough to be judged, and reclaimed.
        if rng.below(16) == 0 {
            std::thread::sleep(Duration::from_millis(rng.below(40)));
        }
    }
    remove_any(&path);
    swaps
}

fn outcome<T>(result: &leasehold::Result<T>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(Error::UnexpectedFile { found, .. }) => format!("UnexpectedFile({found})"),
        Err(Error::Io { op, source, .. }) => format!("Io({op}: {:?})", source.kind()),
        Err(e) => format!("{e:?}")
            .chars()
            .take_while(|c| c.is_alphanumeric())
            .collect(),
    }
}

async fn hostile_swapping(strategy: Strategy) {
    count_panics();
    let panics_before = PANICS.load(Ordering::SeqCst);
    let what = label(strategy);
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let sentinel = Sentinel::new(
        outside.join("sentinel"),
        b"sentinel: never touch\n",
        Duration::ZERO,
    );
    std::fs::create_dir(outside.join("sentinel-dir")).unwrap();
    let inner = Sentinel::new(
        outside.join("sentinel-dir").join("inside"),
        b"inside\n",
        Duration::ZERO,
    );
    let outside_before = listing(&outside);
    let locks = tmp.path().join("locks");
    let locker = Locker::builder()
        .directory(&locks)
        .strategy(strategy)
        .fencing(true)
        .lease(Duration::from_millis(500))
        .renew_interval(Duration::from_millis(100))
        .poll_interval(Duration::from_millis(5))
        .unreadable_grace(Duration::from_millis(20))
        .build()
        .unwrap();
    let path = locker.lock_path("contested").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let (path, outside, stop) = (path.clone(), outside.clone(), Arc::clone(&stop));
        std::thread::spawn(move || swapper(path, outside, stop))
    };
    let mut tally: BTreeMap<String, u64> = BTreeMap::new();
    let mut calls = 0u64;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        let key = match calls % 3 {
            0 => {
                let r = bounded(what, locker.try_acquire("contested")).await;
                let key = match &r {
                    Ok(Some(_)) => "try_acquire: acquired".to_owned(),
                    Ok(None) => "try_acquire: busy".to_owned(),
                    Err(_) => format!("try_acquire: {}", outcome(&r)),
                };
                drop(r);
                key
            }
            1 => {
                let r = bounded(
                    what,
                    locker.acquire_timeout("contested", Duration::from_millis(50)),
                )
                .await;
                format!("acquire_timeout: {}", outcome(&r))
            }
            _ => {
                let r = bounded(what, locker.holder("contested")).await;
                match &r {
                    Ok(Some(_)) => "holder: some".to_owned(),
                    Ok(None) => "holder: none".to_owned(),
                    Err(_) => format!("holder: {}", outcome(&r)),
                }
            }
        };
        *tally.entry(key).or_default() += 1;
        calls += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = thread.join().expect("swapper");
    eprintln!("hostile swapping [{what}]: {swaps} swaps, {calls} calls: {tally:#?}");

    // Afterwards: outside untouched, nothing made there, no panic, and the
    // name works again.
    sentinel.check(what);
    inner.check(what);
    assert_eq!(std::fs::metadata(&sentinel.path).unwrap().nlink(), 1, "{what}");
    assert_eq!(
        listing(&outside),
        outside_before,
        "{what}: something was created outside"
    );
    assert_eq!(listing(&outside.join("sentinel-dir")), ["inside"], "{what}");
    assert_eq!(
        PANICS.load(Ordering::SeqCst),
        panics_before,
        "{what}: something panicked"
    );
    let guard = bounded(what, locker.acquire("contested")).await.unwrap();
    assert!(bounded(what, guard.ensure_held()).await.is_ok());
    bounded(what, guard.release()).await.unwrap();
    let leftovers: Vec<String> = listing(&locks)
        .into_iter()
        .filter(|n| n.contains(".pending-") || n.contains(".trash-") || n.contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{what}: left behind: {leftovers:?}");
    assert!(
        tally.keys().any(|k| k.contains("UnexpectedFile")),
        "{what}: {tally:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_swapping_of_the_lock_path_exclusive_file() {
    hostile_swapping(Strategy::ExclusiveFile).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_swapping_of_the_lock_path_directory() {
    hostile_swapping(Strategy::Directory).await;
}

// ------------------------------------------------ insecure directory, umask

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_world_writable_directory_without_sticky_bit_is_refused() {
    count_panics();
    let tmp = tempfile::tempdir().unwrap();
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    set_mode(&open, 0o777);
    for strategy in STRATEGIES {
        let what = label(strategy);
        let builder = || Locker::builder().directory(&open).strategy(strategy);
        match builder().build() {
            Err(Error::InsecureDirectory { path, .. }) => {
                assert_eq!(path, open.canonicalize().unwrap(), "{what}")
            }
            other => panic!("{what}: expected InsecureDirectory, got {other:?}"),
        }
        let locker = builder().allow_insecure_directory(true).build().unwrap();
        let guard = bounded(what, locker.acquire("job")).await.unwrap();
        bounded(what, guard.release()).await.unwrap();
        assert_eq!(
            mode_of(&open),
            0o777,
            "{what}: the library changed the directory's mode"
        );
    }
    // The sticky bit makes it safe: nobody may remove others' files.
    set_mode(&open, 0o1777);
    for strategy in STRATEGIES {
        let locker = Locker::builder()
            .directory(&open)
            .strategy(strategy)
            .build()
            .unwrap();
        drop(bounded(label(strategy), locker.acquire("job")).await.unwrap());
    }
    assert_eq!(mode_of(&open), 0o1777);
}

/// Whatever the umask, the library leaves it alone and creates what it
/// creates with its own modes: 0700 directories, 0600 files.
#[test]
fn the_umask_is_left_alone_and_modes_do_not_depend_on_it() {
    count_panics();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let saved = nix::sys::stat::umask(Mode::from_bits_truncate(0o022));
    let mut failures = Vec::new();
    for mask in [0o026, 0o000, 0o077] {
        for strategy in STRATEGIES {
            let what = format!("{} with umask {mask:03o}", label(strategy));
            nix::sys::stat::umask(Mode::from_bits_truncate(mask));
            let locks = tmp
                .path()
                .join(format!("{mask:o}-{}", label(strategy)))
                .join("locks");
            let locker = Locker::builder()
                .directory(&locks)
                .strategy(strategy)
                .fencing(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let guard = bounded(&what, locker.acquire("job")).await.unwrap();
                let path = locker.lock_path("job").unwrap();
                let modes = [
                    ("lock directory", mode_of(&locks), 0o700),
                    ("its parent, created too", mode_of(locks.parent().unwrap()), 0o700),
                    (
                        "lock",
                        mode_of(&path),
                        if strategy == Strategy::Directory {
                            0o700
                        } else {
                            0o600
                        },
                    ),
                    (
                        "fencing counter",
                        mode_of(&PathBuf::from(format!("{}.fence", path.display()))),
                        0o600,
                    ),
                ];
                for (thing, got, want) in modes {
                    if got != want {
                        failures.push(format!("{what}: {thing} has mode {got:o}, not {want:o}"));
                    }
                }
                if strategy == Strategy::Directory {
                    let got = mode_of(&path.join("owner.json"));
                    if got != 0o600 {
                        failures.push(format!("{what}: owner.json has mode {got:o}, not 600"));
                    }
                }
                bounded(&what, guard.release()).await.unwrap();
            });
            let now = nix::sys::stat::umask(Mode::from_bits_truncate(mask));
            if now.bits() != mask {
                failures.push(format!("{what}: the umask became {:03o}", now.bits()));
            }
        }
    }
    nix::sys::stat::umask(saved);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "something panicked");
}

// --------------------------------------------------------- crash leftovers

/// A process killed while it advances a fencing counter — after creating
/// `<lock>.fence.tmp-<id>`, before renaming it over `<lock>.fence` — leaves
/// the temporary file behind (`tests/torture.rs` finds them after its
/// SIGKILLs). Every counter update runs under the directory's mutation
/// lock, so one that `clean()` sees is a crash's, and `clean()` must remove
/// it like the other crash leftovers; else they pile up forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_removes_a_fencing_counter_temp_file_left_by_a_crash() {
    count_panics();
    for strategy in STRATEGIES {
        let what = label(strategy);
        let tmp = tempfile::tempdir().unwrap();
        let locker = Locker::builder()
            .directory(tmp.path())
            .strategy(strategy)
            .fencing(true)
            .build()
            .unwrap();
        let first = bounded(what, locker.acquire("ledger")).await.unwrap();
        let token = first.fencing_token().unwrap();
        bounded(what, first.release()).await.unwrap();
        // What the crash leaves, an hour old.
        let fence = format!("{}.fence", locker.lock_path("ledger").unwrap().display());
        let leftover = PathBuf::from(format!("{fence}.tmp-0123456789abcdef0123456789abcdef"));
        std::fs::write(&leftover, "2048\n").unwrap();
        set_mode(&leftover, 0o600);
        std::fs::File::options()
            .write(true)
            .open(&leftover)
            .unwrap()
            .set_modified(SystemTime::now() - Duration::from_secs(3600))
            .unwrap();
        bounded(what, locker.clean(false)).await.unwrap();
        let next = bounded(what, locker.acquire("ledger")).await.unwrap();
        assert!(next.fencing_token().unwrap() > token, "{what}");
        drop(next);
        assert!(
            !leftover.exists(),
            "{what}: clean() left a crashed counter update's temporary file: {}",
            leftover.display()
        );
    }
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "something panicked");
}
