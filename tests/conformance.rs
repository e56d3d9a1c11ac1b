//! One behavioural suite, run for every strategy.

#[path = "support/common.rs"]
mod common;

#[test]
fn child_process_entry() {
    common::child_entry();
}

macro_rules! conformance {
    ($module:ident, $strategy:expr) => {
        mod $module {
            use std::sync::Arc;
            use std::time::{Duration, Instant, SystemTime};

            use leasehold::{Error, Locker, Strategy};

            use crate::common::{ChildProc, dead_pid, entries, iso, plant};

            const STRATEGY: Strategy = $strategy;

            fn locker(dir: &std::path::Path) -> Locker {
                Locker::builder().directory(dir).strategy(STRATEGY).build().unwrap()
            }

            fn quick(dir: &std::path::Path) -> Locker {
                Locker::builder()
                    .directory(dir)
                    .strategy(STRATEGY)
                    .lease(Duration::from_millis(400))
                    .renew_interval(Duration::from_millis(100))
                    .build()
                    .unwrap()
            }

            #[tokio::test]
            async fn acquire_show_release_and_leave_nothing() {
                let dir = tempfile::tempdir().unwrap();
                let (a, b) = (locker(dir.path()), locker(dir.path()));
                let guard = a.acquire("job").await.unwrap();
                let owner = b.holder("job").await.unwrap().expect("held");
                assert_eq!(owner.pid(), Some(std::process::id()));
                assert!(owner.is_leasehold());
                assert_eq!(owner.uuid(), guard.owner().uuid());
                assert!(b.try_acquire("job").await.unwrap().is_none());
                drop(guard);
                let again = b.try_acquire("job").await.unwrap().expect("free right after drop");
                again.release().await.unwrap();
                assert!(!a.is_held("job").await.unwrap());
                assert!(entries(dir.path()).is_empty(), "left behind: {:?}", entries(dir.path()));
            }

            #[tokio::test]
            async fn a_replaced_lock_is_lost_and_its_successor_left_alone() {
                let dir = tempfile::tempdir().unwrap();
                let locker = quick(dir.path());
                let guard = locker.acquire("job").await.unwrap();
                let path = locker.lock_path("job").unwrap();
                if path.is_dir() {
                    std::fs::remove_dir_all(&path).unwrap();
                } else {
                    crate::remove_behind_its_back(&path);
                }
                let successor = format!(r#"{{"uuid":"successor","pid":{}}}"#, std::process::id());
                plant(STRATEGY, &path, &successor, Duration::ZERO);
                tokio::time::timeout(Duration::from_secs(2), guard.lost()).await.expect("lost() resolves");
                assert!(guard.release().await.unwrap_err().is_lost());
                let record = if path.is_dir() { path.join("owner.json") } else { path.clone() };
                assert_eq!(std::fs::read_to_string(record).unwrap(), successor);
            }

            #[test]
            fn a_killed_holder_is_replaced_at_once_despite_a_long_lease() {
                let dir = tempfile::tempdir().unwrap();
                let d = dir.path().to_str().unwrap();
                let mut holder = ChildProc::spawn_with(STRATEGY, "hold", &[d, "job", "60000"]);
                holder.expect("acquired", Duration::from_secs(20));
                // A 10 s poll: only the watcher's news of the death explains
                // a prompt take-over. A death is no directory change on
                // Windows, where waiters poll (here every 20 ms).
                let poll = if cfg!(windows) { "20" } else { "10000" };
                let waiter = ChildProc::spawn_with(STRATEGY, "acquire", &[d, "job", "60000", poll]);
                waiter.expect("waiting", Duration::from_secs(20));
                std::thread::sleep(Duration::from_millis(200));
                // SIGKILL on Unix, TerminateProcess on Windows (and reaped).
                holder.kill_and_reap();
                let killed = Instant::now();
                waiter.expect("acquired", Duration::from_secs(20));
                // Unix: a waiter that missed the death would sleep out its
                // 10 s poll; 5 s leaves a slow machine room to start and
                // reap processes.
                assert!(killed.elapsed() < Duration::from_secs(5), "took {:?}", killed.elapsed());
            }

            #[test]
            fn four_processes_count_to_exactly_four_hundred() {
                let dir = tempfile::tempdir().unwrap();
                let counter = dir.path().join("counter");
                let locks = dir.path().join("locks");
                let (d, c) = (locks.to_str().unwrap(), counter.to_str().unwrap());
                let mut kids: Vec<ChildProc> = (0..4)
                    .map(|_| ChildProc::spawn_with(STRATEGY, "count", &[d, "counter", "100", c]))
                    .collect();
                for kid in &mut kids {
                    assert!(kid.wait(Duration::from_secs(90)).success());
                }
                assert_eq!(std::fs::read_to_string(&counter).unwrap(), "400");
                assert!(entries(&locks).is_empty(), "left behind: {:?}", entries(&locks));
            }

            #[tokio::test]
            async fn dead_and_expired_owners_are_reclaimed_live_ones_are_not() {
                let dir = tempfile::tempdir().unwrap();
                let locker = locker(dir.path());
                let me = std::process::id();
                let soon = iso(SystemTime::now() + Duration::from_secs(60));
                let past = iso(SystemTime::now() - Duration::from_secs(5));
                let cases = [
                    (format!(r#"{{"uuid":"x","pid":{me}}}"#), false),
                    (format!(r#"{{"uuid":"x","pid":{}}}"#, dead_pid()), true),
                    (format!(r#"{{"pid":{me},"hostname":"elsewhere","holderId":"h","leaseExpiresAt":"{soon}"}}"#), false),
                    (format!(r#"{{"pid":{me},"hostname":"elsewhere","holderId":"h","leaseExpiresAt":"{past}"}}"#), true),
                ];
                for (i, (record, stale)) in cases.iter().enumerate() {
                    let name = format!("case{i}");
                    plant(STRATEGY, &locker.lock_path(&name).unwrap(), record, Duration::ZERO);
                    let got = locker.try_acquire(&name).await.unwrap();
                    assert_eq!(got.is_some(), *stale, "{record}");
                }
            }

            #[tokio::test]
            async fn unreadable_records_get_a_grace_period() {
                // Empty, cut short, or zeros (a crash without a sync): what a
                // writer may leave. (What none leaves is no lock: tests/not_a_lock.rs.)
                for content in ["", "{\"uuid\":\"6f1c3a0e", "\0\0\0\0"] {
                    let dir = tempfile::tempdir().unwrap();
                    let locker = locker(dir.path());
                    let path = locker.lock_path("job").unwrap();
                    plant(STRATEGY, &path, content, Duration::from_secs(5));
                    assert!(locker.try_acquire("job").await.unwrap().is_none(), "{content:?} taken in grace");
                    plant(STRATEGY, &path, content, Duration::from_secs(20));
                    assert!(locker.try_acquire("job").await.unwrap().is_some(), "{content:?} kept past grace");
                }
            }

            /// Records are not synced by default: a power loss leaves
            /// them empty or torn. Written before this boot, nobody can
            /// be writing them, so the grace period does not apply.
            // Needs the uptime: `/proc/uptime`, or Windows' boot clock.
            #[cfg(any(target_os = "linux", windows))]
            #[tokio::test]
            async fn unreadable_records_from_before_the_boot_are_taken_over_at_once() {
                let before_boot = crate::uptime() + Duration::from_secs(60);
                for content in ["", "{\"acquiredAt\":\"2026-12-0", "{\"uuid\":\"6a1f"] {
                    // A fresh directory with `content` planted `age` ago.
                    let planted = |age| {
                        let dir = tempfile::tempdir().unwrap();
                        let locker = Locker::builder()
                            .directory(dir.path())
                            .strategy(STRATEGY)
                            .unreadable_grace(Duration::from_secs(3600))
                            .build()
                            .unwrap();
                        plant(STRATEGY, &locker.lock_path("job").unwrap(), content, age);
                        (dir, locker)
                    };
                    let (_dir, locker) = planted(before_boot);
                    let info = locker.inspect("job").await.unwrap().expect("planted");
                    assert_eq!(info.stale_reason(), Some(leasehold::StaleReason::PreviousBoot), "{content:?}");
                    assert!(locker.try_acquire("job").await.unwrap().is_some(), "{content:?} kept after a reboot");
                    // Written during this boot: the grace period applies.
                    let (_dir, locker) = planted(Duration::from_secs(20));
                    assert!(locker.try_acquire("job").await.unwrap().is_none(), "{content:?} taken in grace");
                }
            }

            #[test]
            fn eight_reclaimers_of_one_stale_lock_have_exactly_one_winner() {
                let dir = tempfile::tempdir().unwrap();
                let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
                rt.block_on(async {
                    let lockers: Vec<Locker> = (0..8).map(|_| locker(dir.path())).collect();
                    let path = lockers[0].lock_path("job").unwrap();
                    let stale = format!(r#"{{"uuid":"x","pid":{}}}"#, dead_pid());
                    for round in 0..100 {
                        plant(STRATEGY, &path, &stale, Duration::ZERO);
                        let barrier = Arc::new(tokio::sync::Barrier::new(8));
                        let tasks: Vec<_> = lockers
                            .iter()
                            .cloned()
                            .map(|l| {
                                let barrier = Arc::clone(&barrier);
                                tokio::spawn(async move {
                                    barrier.wait().await;
                                    l.try_acquire("job").await.unwrap()
                                })
                            })
                            .collect();
                        let mut winners = Vec::new();
                        for t in tasks {
                            winners.extend(t.await.unwrap());
                        }
                        assert_eq!(winners.len(), 1, "round {round}");
                        let owner = lockers[0].holder("job").await.unwrap().expect("held");
                        assert_eq!(owner.uuid(), winners[0].owner().uuid(), "round {round}: winner replaced");
                        winners.pop().unwrap().release().await.unwrap();
                    }
                });
                assert!(entries(dir.path()).is_empty(), "left behind: {:?}", entries(dir.path()));
            }

            // Symbolic links: making one on Windows needs a privilege (and
            // Wine 8.0 makes none); the sys unit tests cover reparse points.
            #[cfg(unix)]
            #[tokio::test]
            async fn hostile_paths_are_reported_not_followed() {
                let dir = tempfile::tempdir().unwrap();
                let outside = tempfile::tempdir().unwrap();
                let victim = outside.path().join("victim");
                std::fs::write(&victim, "precious").unwrap();
                let locker = locker(dir.path());
                std::os::unix::fs::symlink(&victim, locker.lock_path("link").unwrap()).unwrap();
                std::os::unix::fs::symlink(outside.path(), locker.lock_path("dirlink").unwrap()).unwrap();
                for name in ["link", "dirlink"] {
                    let err = locker.try_acquire(name).await.unwrap_err();
                    assert!(matches!(err, Error::UnexpectedFile { found: "symlink", .. }), "{err:?}");
                }
                assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
                assert_eq!(entries(outside.path()), vec!["victim".to_owned()]);
            }

            #[tokio::test]
            async fn the_other_layouts_kind_of_lock_is_not_ours_to_judge() {
                let dir = tempfile::tempdir().unwrap();
                let locker = locker(dir.path());
                let wrong = locker.lock_path("wrong").unwrap();
                if STRATEGY == Strategy::Directory {
                    std::fs::write(&wrong, "x").unwrap();
                } else {
                    std::fs::create_dir(&wrong).unwrap();
                }
                assert!(matches!(locker.try_acquire("wrong").await, Err(Error::UnexpectedFile { .. })));
            }

            #[tokio::test]
            async fn clean_never_touches_a_live_lock_whatever_its_name() {
                let dir = tempfile::tempdir().unwrap();
                let locker = locker(dir.path());
                let names = ["jobs.lock.trash-1", "x.lock.pending-0123456789ab", "y.lock.fence.tmp-1", "plain"];
                let mut guards = Vec::new();
                for name in names {
                    guards.push(locker.acquire(name).await.unwrap());
                }
                let plain = Locker::builder()
                    .directory(dir.path())
                    .strategy(STRATEGY)
                    .path_style(leasehold::PathStyle::Plain)
                    .build()
                    .unwrap();
                let _p = plain.acquire("z.lock.trash-0123456789ab").await.unwrap();
                assert!(locker.clean(false).await.unwrap().is_empty());
                assert!(plain.clean(false).await.unwrap().is_empty());
                for (guard, name) in guards.iter().zip(names) {
                    assert!(!guard.is_lost(), "{name}");
                    guard.ensure_held().await.unwrap();
                    assert!(locker.is_held(name).await.unwrap(), "{name}");
                }
            }

            #[tokio::test]
            async fn plain_names_share_locks_by_file_name() {
                let dir = tempfile::tempdir().unwrap();
                let plain = Locker::builder()
                    .directory(dir.path())
                    .strategy(STRATEGY)
                    .path_style(leasehold::PathStyle::Plain)
                    .build()
                    .unwrap();
                let guard = plain.acquire("state").await.unwrap();
                assert!(dir.path().join("state.lock").exists());
                for bad in ["../state", "a/b", "..", ""] {
                    assert!(matches!(plain.try_acquire(bad).await, Err(Error::InvalidName { .. })), "{bad}");
                }
                drop(guard);
                assert!(entries(dir.path()).is_empty());
            }
        }
    };
}

conformance!(exclusive_file, Strategy::ExclusiveFile);
// Windows cannot lock a directory: `build()` refuses the layout there.
#[cfg(unix)]
conformance!(directory, Strategy::Directory);

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

/// How long ago this machine booted: `/proc/uptime` on Linux,
/// `GetTickCount64` (the boot clock leasehold reads) on Windows.
#[cfg(target_os = "linux")]
fn uptime() -> std::time::Duration {
    let text = std::fs::read_to_string("/proc/uptime").unwrap();
    std::time::Duration::from_secs_f64(text.split_whitespace().next().unwrap().parse().unwrap())
}

#[cfg(windows)]
fn uptime() -> std::time::Duration {
    // SAFETY: a plain call without arguments (std has no uptime).
    let ms = unsafe { windows_sys::Win32::System::SystemInformation::GetTickCount64() };
    std::time::Duration::from_millis(ms)
}

#[path = "support/api_conformance.rs"]
#[macro_use]
mod api_conformance;

fn files(strategy: leasehold::Strategy) -> (tempfile::TempDir, leasehold::LockerBuilder) {
    let dir = tempfile::tempdir().unwrap();
    let builder = leasehold::Locker::builder()
        .directory(dir.path())
        .strategy(strategy);
    (dir, builder)
}

/// What this platform's refusal of upgradable locks in `strategy` names
/// (docs/upgradable.md), or `None` where it keeps them: the directory
/// layout needs an atomic exchange of
/// two directories (Linux with glibc, macOS), which FreeBSD, musl and the
/// portable test mode (`LEASEHOLD_TEST_PORTABLE=1`) do not have.
fn upgradable_refused(strategy: leasehold::Strategy) -> Option<&'static str> {
    let portable = cfg!(all(target_os = "linux", feature = "portable-test"))
        && std::env::var("LEASEHOLD_TEST_PORTABLE").as_deref() == Ok("1");
    let exchange = cfg!(any(
        all(target_os = "linux", target_env = "gnu"),
        target_os = "macos"
    )) && !portable;
    if strategy == leasehold::Strategy::Directory && !exchange {
        Some("atomic exchange")
    } else {
        None
    }
}

api_conformance!(
    api_exclusive_file,
    files(leasehold::Strategy::ExclusiveFile),
    upgradable_refused = upgradable_refused(leasehold::Strategy::ExclusiveFile)
);
// Windows cannot lock a directory: `build()` refuses the layout there.
#[cfg(unix)]
api_conformance!(
    api_directory,
    files(leasehold::Strategy::Directory),
    upgradable_refused = upgradable_refused(leasehold::Strategy::Directory)
);
