//! Attacks on the cheaper in-process handoff (merge `b938204`): a lost
//! lock and a local waiter, `lost()` subscribed late, cancellation after
//! a handoff, the per-`Locker` name cache, the clock a wait is measured
//! on, and fencing tokens across many handoffs.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use leasehold::{Locker, PathStyle, Strategy};

fn locker(dir: &std::path::Path) -> Locker {
    Locker::builder().directory(dir).durable(false).build().unwrap()
}

/// A locker with fencing on.
fn fenced(dir: &std::path::Path) -> Locker {
    Locker::builder()
        .directory(dir)
        .durable(false)
        .fencing(true)
        .build()
        .unwrap()
}

fn short_lease(dir: &std::path::Path, strategy: Strategy) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .lease(Duration::from_millis(400))
        .renew_interval(Duration::from_millis(40))
        .durable(false)
        .build()
        .unwrap()
}

/// The layouts this platform has: Windows refuses the directory layout
/// (a directory cannot carry the liveness mark there).
#[cfg(unix)]
const LAYOUTS: &[Strategy] = &[Strategy::ExclusiveFile, Strategy::Directory];
#[cfg(windows)]
const LAYOUTS: &[Strategy] = &[Strategy::ExclusiveFile];

/// Polls `fut` once, with this task's waker.
async fn poll_once<F: Future + ?Sized>(fut: &mut Pin<Box<F>>) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await
}

/// Removes whatever is at `path` (a file or a directory).
fn remove(path: &std::path::Path) {
    if path.is_dir() {
        std::fs::remove_dir_all(path).unwrap();
    } else {
        remove_lock_file(path);
    }
}

/// Removes the lock file at `path` so that its name is free at once, as
/// `unlink` does on Unix. Windows keeps a deleted file's name while its
/// holder has it open ("delete pending": Wine does, and Windows without
/// POSIX delete), so there the file is renamed aside first, as the
/// library's own removal does, and deleted under that name.
fn remove_lock_file(path: &std::path::Path) {
    #[cfg(windows)]
    let path = &{
        let mut aside = path.as_os_str().to_owned();
        aside.push(".removed");
        std::fs::rename(path, &aside).unwrap();
        std::path::PathBuf::from(aside)
    };
    std::fs::remove_file(path).unwrap();
}

async fn wait_lost(guard: &leasehold::LockGuard) {
    let start = Instant::now();
    while !guard.is_lost() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the loss was never noticed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A loss reported before `lost()` is first awaited resolves it at once,
/// on a first guard and on a guard made by re-entry in a scope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_resolves_for_a_loss_reported_before_it_is_awaited() {
    for &strategy in LAYOUTS {
        let dir = tempfile::tempdir().unwrap();
        let locker = short_lease(dir.path(), strategy);
        locker
            .scope(async {
                let first = locker.acquire("gone").await.unwrap();
                let again = locker.acquire("gone").await.unwrap();
                remove(&locker.lock_path("gone").unwrap());
                wait_lost(&first).await;
                // Let the renewal report it, whichever way it noticed.
                tokio::time::sleep(Duration::from_millis(300)).await;
                for guard in [&first, &again] {
                    tokio::time::timeout(Duration::from_secs(2), guard.lost())
                        .await
                        .unwrap_or_else(|_| panic!("{strategy:?}: lost() did not resolve"));
                    assert!(guard.ensure_held().await.is_err());
                }
                // A re-entry after the loss is refused.
                assert!(locker.acquire("gone").await.is_err());
            })
            .await;
    }
}

/// A lock lost (its file removed, the loss found by `ensure_held`) and
/// then dropped within the handoff window with a local waiter queued: the
/// waiter must not get the lost lock, but a lock of its own from the
/// store.
#[tokio::test(flavor = "current_thread")]
async fn a_lost_lock_dropped_with_a_waiter_is_not_handed_on() {
    let mut offered = 0;
    for &strategy in LAYOUTS {
        for _ in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let locker = short_lease(dir.path(), strategy);
            let first = locker.acquire("q").await.unwrap();
            let taken = Instant::now();
            let first_uuid = first.owner().uuid().unwrap().to_owned();
            let mut next = Box::pin(locker.acquire("q"));
            assert!(poll_once(&mut next).await.is_pending());
            remove(&locker.lock_path("q").unwrap());
            assert!(first.ensure_held().await.is_err());
            assert!(first.is_lost());
            drop(first);
            // Within the handoff window, the lost lock went to the waiter,
            // which must look before it takes it.
            offered += usize::from(taken.elapsed() < Duration::from_millis(9));
            let next = tokio::time::timeout(Duration::from_secs(5), next)
                .await
                .expect("the waiter got a lock")
                .unwrap();
            assert_ne!(
                next.owner().uuid(),
                Some(first_uuid.as_str()),
                "{strategy:?}: the waiter was handed the lost lock"
            );
            assert!(!next.is_lost());
            next.ensure_held().await.unwrap();
            assert!(locker.lock_path("q").unwrap().exists());
        }
    }
    eprintln!("{offered} of 40 lost locks were offered to the waiter");
}

/// The same with the waiter on another worker thread, polled as soon as
/// the turn is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_dropped_with_a_waiter_on_another_thread_is_not_handed_on() {
    for _ in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let locker = Arc::new(short_lease(dir.path(), Strategy::ExclusiveFile));
        let first = locker.acquire("q").await.unwrap();
        let first_uuid = first.owner().uuid().unwrap().to_owned();
        let waiter = {
            let locker = Arc::clone(&locker);
            tokio::spawn(async move {
                let guard = locker.acquire("q").await.unwrap();
                (guard.owner().uuid().map(str::to_owned), guard.is_lost())
            })
        };
        tokio::time::sleep(Duration::from_millis(2)).await;
        remove(&locker.lock_path("q").unwrap());
        assert!(first.ensure_held().await.is_err());
        drop(first);
        let (uuid, lost) = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_ne!(uuid.as_deref(), Some(first_uuid.as_str()));
        assert!(!lost);
    }
}

/// A waiter handed the lock and dropped before it picks it up passes it on:
/// the next waiter is served, and nothing is left held.
#[tokio::test(flavor = "current_thread")]
async fn waiters_cancelled_after_the_handoff_pass_it_on() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    for cancelled in 1..4 {
        let first = locker.acquire("c").await.unwrap();
        let mut dropped: Vec<_> = (0..cancelled).map(|_| Box::pin(locker.acquire("c"))).collect();
        for fut in &mut dropped {
            assert!(poll_once(fut).await.is_pending());
        }
        let mut last = Box::pin(locker.acquire_timeout("c", Duration::from_secs(5)));
        assert!(poll_once(&mut last).await.is_pending());
        drop(first);
        // The first one was granted the lock; each passes it on.
        drop(dropped);
        let last = last.await.unwrap();
        assert!(!last.is_lost());
        drop(last);
        assert!(locker.try_acquire("c").await.unwrap().is_some());
    }
}

/// Invalid names are refused every time, before and after the cache fills
/// up and starts over, and in every path style.
#[tokio::test(flavor = "current_thread")]
async fn invalid_names_are_refused_every_time() {
    let dir = tempfile::tempdir().unwrap();
    let plain = Locker::builder()
        .directory(dir.path())
        .path_style(PathStyle::Plain)
        .durable(false)
        .build()
        .unwrap();
    let exact = Locker::builder()
        .directory(dir.path())
        .path_style(PathStyle::Exact)
        .durable(false)
        .build()
        .unwrap();
    let hashed = locker(dir.path());
    for round in 0..3 {
        // The hashed locker accepts (and caches) what the others refuse.
        for name in ["a/b", "..", "x.fence", "y.members"] {
            drop(hashed.acquire(name).await.unwrap());
        }
        for name in ["a/b", "..", ".", "", "a\0b", "c\nd"] {
            assert!(plain.acquire(name).await.is_err(), "plain {name:?} round {round}");
            assert!(
                plain.try_acquire(name).await.is_err(),
                "plain {name:?} round {round}"
            );
        }
        for name in ["x.fence", "y.members", "a.pending-1", "a/b"] {
            assert!(exact.acquire(name).await.is_err(), "exact {name:?} round {round}");
            assert!(
                exact
                    .acquire_timeout(name, Duration::from_millis(10))
                    .await
                    .is_err(),
                "exact {name:?} round {round}"
            );
        }
        // Fill the caches past their bound.
        for i in 0..300 {
            let name = format!("n{round}-{i}");
            drop(plain.try_acquire(&name).await.unwrap().unwrap());
            drop(exact.try_acquire(&name).await.unwrap().unwrap());
        }
    }
    // Each locker's file names are its own style's, cache or not.
    let g = plain.acquire("shared-name").await.unwrap();
    assert!(dir.path().join("shared-name.lock").exists());
    drop(g);
    let g = exact.acquire("shared-name").await.unwrap();
    assert!(dir.path().join("shared-name").exists());
    drop(g);
    let g = hashed.acquire("shared-name").await.unwrap();
    // The lock directory's canonical path (`\\?\C:\...` on Windows, the
    // real path where the temporary folder's path holds a symlink).
    let canonical = dir.path().canonicalize().unwrap();
    assert_eq!(
        hashed.lock_path("shared-name").unwrap().parent(),
        Some(canonical.as_path())
    );
    assert!(hashed.lock_path("shared-name").unwrap().exists());
    drop(g);
}

/// A name acquired (so cached), then replaced on disk by a file that is
/// not a lock: the next acquisition must not succeed over it.
#[tokio::test(flavor = "current_thread")]
async fn a_cached_name_that_became_a_foreign_file_is_not_taken() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    drop(locker.acquire("foreign").await.unwrap());
    let path = locker.lock_path("foreign").unwrap();
    std::fs::write(&path, b"this is not a lock, keep it\n").unwrap();
    for _ in 0..3 {
        let timed = locker
            .acquire_timeout("foreign", Duration::from_millis(200))
            .await;
        assert!(timed.is_err(), "acquired over a foreign file");
        let tried = locker.try_acquire("foreign").await;
        assert!(!matches!(tried, Ok(Some(_))), "acquired over a foreign file");
        assert_eq!(std::fs::read(&path).unwrap(), b"this is not a lock, keep it\n");
    }
}

/// Two lockers on one directory and many tasks over more names than the
/// cache keeps: never two holders of one name at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_names_many_tasks_exclude_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let lockers = [Arc::new(locker(dir.path())), Arc::new(locker(dir.path()))];
    const NAMES: usize = 300;
    let inside: Arc<Vec<AtomicUsize>> = Arc::new((0..NAMES).map(|_| AtomicUsize::new(0)).collect());
    let mut tasks = Vec::new();
    for t in 0..8 {
        let locker = Arc::clone(&lockers[t % 2]);
        let inside = Arc::clone(&inside);
        tasks.push(tokio::spawn(async move {
            for i in 0..400 {
                let n = (i * 7 + t * 13) % NAMES;
                let guard = locker
                    .acquire_timeout(&format!("name-{n}"), Duration::from_secs(20))
                    .await
                    .unwrap();
                assert_eq!(
                    inside[n].fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders of name-{n}"
                );
                if i % 5 == 0 {
                    tokio::task::yield_now().await;
                }
                inside[n].fetch_sub(1, Ordering::SeqCst);
                drop(guard);
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .unwrap()
            .unwrap();
    }
}

/// On a paused clock, a queued `acquire_timeout` and one waiting on the
/// disk time out when the virtual deadline passes, and report the wait on
/// that clock.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn timeouts_on_a_paused_clock() {
    let dir = tempfile::tempdir().unwrap();
    let other = locker(dir.path());
    let here = locker(dir.path());
    let _held = other.acquire("t").await.unwrap();
    let real = Instant::now();
    let virt = tokio::time::Instant::now();
    // Waiting on the disk (the head of this locker's queue).
    let head = here.acquire_timeout("t", Duration::from_secs(3));
    // Queued behind it.
    let queued = here.acquire_timeout("t", Duration::from_secs(2));
    let (head, queued) = tokio::join!(head, queued);
    let (head, queued) = (head.unwrap_err(), queued.unwrap_err());
    assert!(head.is_timeout() && queued.is_timeout(), "{head:?} {queued:?}");
    let waited = |e: &leasehold::Error| match e {
        leasehold::Error::Timeout { waited, .. } => *waited,
        other => panic!("{other:?}"),
    };
    assert!(waited(&queued) >= Duration::from_secs(2), "{queued:?}");
    assert!(waited(&queued) < Duration::from_secs(3), "{queued:?}");
    assert!(waited(&head) >= Duration::from_secs(3), "{head:?}");
    assert!(waited(&head) < Duration::from_secs(5), "{head:?}");
    assert!(virt.elapsed() >= Duration::from_secs(3));
    assert!(
        real.elapsed() < Duration::from_secs(3),
        "waited in real time: {:?}",
        real.elapsed()
    );
}

/// The same on a multi-thread runtime, in real time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_on_a_multi_thread_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let other = locker(dir.path());
    let here = locker(dir.path());
    let _held = other.acquire("t").await.unwrap();
    let real = Instant::now();
    let head = here.acquire_timeout("t", Duration::from_millis(600));
    let queued = here.acquire_timeout("t", Duration::from_millis(300));
    let (head, queued) = tokio::join!(head, queued);
    let (head, queued) = (head.unwrap_err(), queued.unwrap_err());
    let waited = |e: &leasehold::Error| match e {
        leasehold::Error::Timeout { waited, .. } => *waited,
        other => panic!("{other:?}"),
    };
    assert!(waited(&queued) >= Duration::from_millis(300), "{queued:?}");
    assert!(waited(&head) >= Duration::from_millis(600), "{head:?}");
    assert!(waited(&head) < Duration::from_secs(5), "{head:?}");
    assert!(real.elapsed() >= Duration::from_millis(600));
    assert!(real.elapsed() < Duration::from_secs(5));
}

/// Fencing tokens grow strictly over many handoffs (past a block of
/// 1,024 where the handoffs come fast enough) and across lockers.
#[tokio::test(flavor = "current_thread")]
async fn fencing_tokens_grow_over_many_handoffs() {
    let dir = tempfile::tempdir().unwrap();
    let a = Arc::new(fenced(dir.path()));
    let b = Arc::new(fenced(dir.path()));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async {
            let mut tasks = Vec::new();
            for i in 0..3000 {
                let locker = Arc::clone(if i % 500 < 490 { &a } else { &b });
                let seen = Arc::clone(&seen);
                tasks.push(tokio::task::spawn_local(async move {
                    let guard = locker
                        .acquire_timeout("fenced", Duration::from_secs(60))
                        .await
                        .unwrap();
                    seen.lock().unwrap().push(guard.fencing_token().unwrap());
                }));
            }
            for task in tasks {
                task.await.unwrap();
            }
        })
        .await;
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3000);
    for pair in seen.windows(2) {
        assert!(pair[0] < pair[1], "token went from {} to {}", pair[0], pair[1]);
    }
    eprintln!(
        "handoffs a={} b={} last token {}",
        a.stats().handoffs,
        b.stats().handoffs,
        seen.last().unwrap()
    );
}

/// The blocking API from many threads: one holder at a time, and a
/// bounded wait times out in about its time.
#[test]
fn blocking_callers_exclude_each_other_and_time_out() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Arc::new(locker(dir.path()));
    let inside = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let locker = Arc::clone(&locker);
            let inside = Arc::clone(&inside);
            std::thread::spawn(move || {
                for _ in 0..200 {
                    let guard = locker.blocking_acquire("b").unwrap();
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                    inside.fetch_sub(1, Ordering::SeqCst);
                    drop(guard);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let _held = locker.blocking_acquire("b").unwrap();
    let other = super_locker(dir.path());
    let start = Instant::now();
    let err = other
        .blocking_acquire_timeout("b", Duration::from_millis(300))
        .unwrap_err();
    assert!(err.is_timeout());
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert!(start.elapsed() < Duration::from_secs(5));
    // Queued behind a local holder.
    let start = Instant::now();
    let err = locker
        .blocking_acquire_timeout("b", Duration::from_millis(300))
        .unwrap_err();
    assert!(
        err.is_timeout() || matches!(err, leasehold::Error::WouldDeadlock { .. }),
        "{err:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
}

fn super_locker(dir: &std::path::Path) -> Locker {
    locker(dir)
}

/// Hands one lease on in a tight loop, past its block of 1,024 tokens if
/// the handoffs come fast enough (within the 10 ms handoff window): the
/// waiter that must fetch the next block from disk is then cancelled
/// half-way, and the next waiter must still be served, with a larger
/// token, and nothing left held.
#[tokio::test(flavor = "current_thread")]
async fn a_waiter_cancelled_while_its_token_comes_from_disk_passes_the_lock_on() {
    let dir = tempfile::tempdir().unwrap();
    let locker = fenced(dir.path());
    let mut exercised = 0;
    for _ in 0..20 {
        let mut guard = locker.acquire("f").await.unwrap();
        let first = guard.fencing_token().unwrap();
        let start = Instant::now();
        let mut last = first;
        // The token the next guard would take is `last + 1`; the block
        // ends at `first + 1023`.
        while last < first + 1023 {
            let mut next = Box::pin(locker.acquire("f"));
            assert!(poll_once(&mut next).await.is_pending());
            drop(guard);
            guard = match poll_once(&mut next).await {
                Poll::Ready(g) => g.unwrap(),
                Poll::Pending => next.await.unwrap(),
            };
            let token = guard.fencing_token().unwrap();
            assert!(token > last, "{last} then {token}");
            last = token;
        }
        let fast = start.elapsed() < Duration::from_millis(8);
        let mut cancelled = Box::pin(locker.acquire("f"));
        let mut after = Box::pin(locker.acquire_timeout("f", Duration::from_secs(5)));
        assert!(poll_once(&mut cancelled).await.is_pending());
        assert!(poll_once(&mut after).await.is_pending());
        drop(guard);
        // Handed over with the block used up: polled once, it starts
        // fetching the next block, and is dropped.
        let polled = poll_once(&mut cancelled).await;
        if fast && polled.is_pending() {
            exercised += 1;
        }
        drop(polled);
        drop(cancelled);
        let after = after.await.unwrap();
        assert!(after.fencing_token().unwrap() > last);
        assert!(after.ensure_held().await.is_ok());
        drop(after);
        assert!(locker.try_acquire("f").await.unwrap().is_some());
    }
    eprintln!("the fetch from disk was cancelled {exercised} times out of 20");
}

/// On a paused clock inside a `LocalSet`: a waiter with no real bound
/// (`Duration::MAX`) queued behind a local holder gets the lock when the
/// holder lets go, however far the clock jumped meanwhile; one with a zero
/// bound times out at once without disturbing the queue.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn unbounded_and_zero_timeouts_on_a_paused_clock_in_a_local_set() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Arc::new(locker(dir.path()));
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async {
            let held = locker.acquire("m").await.unwrap();
            let waiter = {
                let locker = Arc::clone(&locker);
                tokio::task::spawn_local(async move {
                    let guard = locker.acquire_timeout("m", Duration::MAX).await.unwrap();
                    guard.fencing_token();
                    drop(guard);
                })
            };
            tokio::task::yield_now().await;
            let zero = locker.acquire_timeout("m", Duration::ZERO).await.unwrap_err();
            assert!(zero.is_timeout(), "{zero:?}");
            tokio::time::sleep(Duration::from_secs(3600)).await;
            assert!(!waiter.is_finished());
            drop(held);
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .unwrap()
                .unwrap();
            let stats = locker.stats();
            assert_eq!(stats.handoffs, 1, "{stats:?}");
            assert!(stats.wait_max >= Duration::from_secs(3600), "{stats:?}");
            assert!(locker.try_acquire("m").await.unwrap().is_some());
        })
        .await;
}

/// Acquisitions cancelled at arbitrary points (a racing timer), bounded
/// ones timing out, across two lockers on one directory: never two
/// holders, tokens only grow in the order the lock was held, and at the
/// end the lock is free for anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_at_random_points_keeps_the_lock_sound() {
    let dir = tempfile::tempdir().unwrap();
    let fenced = |dir: &std::path::Path| {
        Arc::new(
            Locker::builder()
                .directory(dir)
                .durable(false)
                .fencing(true)
                .poll_interval(Duration::from_millis(5))
                .build()
                .unwrap(),
        )
    };
    let lockers = [fenced(dir.path()), fenced(dir.path())];
    let holding = Arc::new(Mutex::new((false, 0u64)));
    let mut tasks = Vec::new();
    for t in 0..12u64 {
        let locker = Arc::clone(&lockers[(t % 2) as usize]);
        let holding = Arc::clone(&holding);
        tasks.push(tokio::spawn(async move {
            let mut seed = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut rand = move |n: u64| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed % n
            };
            for _ in 0..150 {
                let cancel_after = Duration::from_micros(rand(3000));
                let acquired = match rand(3) {
                    0 => tokio::time::timeout(cancel_after, locker.acquire("r")).await.ok(),
                    1 => Some(locker.acquire_timeout("r", cancel_after).await),
                    _ => Some(locker.acquire("r").await),
                };
                let Some(Ok(guard)) = acquired else { continue };
                let token = guard.fencing_token().unwrap();
                {
                    let mut h = holding.lock().unwrap();
                    assert!(!h.0, "two holders at once");
                    assert!(token > h.1, "token {token} after {}", h.1);
                    *h = (true, token);
                }
                if rand(4) == 0 {
                    tokio::task::yield_now().await;
                }
                holding.lock().unwrap().0 = false;
                if rand(5) == 0 {
                    guard.release().await.unwrap();
                } else {
                    drop(guard);
                }
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .unwrap()
            .unwrap();
    }
    let [a, b] = lockers.map(|l| l.stats());
    eprintln!(
        "acquired {} + {}, handoffs {} + {}, timeouts {} + {}",
        a.acquisitions, b.acquisitions, a.handoffs, b.handoffs, a.timeouts, b.timeouts
    );
    assert!(a.acquisitions > 0 && b.acquisitions > 0);
    // A cancelled acquisition's disk attempt may still be finishing on
    // the blocking pool when its task has ended: it releases what it took
    // as soon as it is done (a few ms under load), and never keeps it.
    let third = locker(dir.path());
    let t0 = Instant::now();
    while third.try_acquire("r").await.unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(5), "the lock was left held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A lock handed over inside a scope is the scope's: acquiring it again
/// there re-enters it (rather than waiting for itself), whether the
/// handoff took its token at hand or from disk.
#[tokio::test(flavor = "current_thread")]
async fn a_lock_handed_over_in_a_scope_can_be_reentered() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Arc::new(fenced(dir.path()));
    for burn in [0, 1022] {
        let mut held = locker.acquire("s").await.unwrap();
        // Use up the block (the next handoff fetches from disk) or not.
        for _ in 0..burn {
            let mut next = Box::pin(locker.acquire("s"));
            assert!(poll_once(&mut next).await.is_pending());
            drop(held);
            held = next.await.unwrap();
        }
        let scoped = {
            let locker = Arc::clone(&locker);
            tokio::spawn(async move {
                locker
                    .scope(async {
                        let first = locker.acquire("s").await.unwrap();
                        let again = tokio::time::timeout(Duration::from_secs(5), locker.acquire("s"))
                            .await
                            .expect("re-entry waited for itself")
                            .unwrap();
                        assert_eq!(first.fencing_token(), again.fencing_token());
                        drop(first);
                        assert!(!again.is_lost());
                        again.ensure_held().await.unwrap();
                    })
                    .await;
            })
        };
        tokio::task::yield_now().await;
        drop(held);
        tokio::time::timeout(Duration::from_secs(10), scoped)
            .await
            .unwrap()
            .unwrap();
        assert!(locker.try_acquire("s").await.unwrap().is_some());
    }
}

/// A lock whose file was removed (not noticed yet: no renewal since)
/// handed to a local waiter just as its block of fencing tokens runs out:
/// the next block cannot be reserved, because the lock is not ours on
/// disk any more. The waiter asked to wait until it holds the lock; it must
/// not fail with `Lost` for a lock it never held, but take the lock from
/// the store (free now), with a token above every earlier one.
#[tokio::test(flavor = "current_thread")]
async fn a_handoff_whose_token_block_cannot_be_refilled_goes_to_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let locker = fenced(dir.path());
    let mut exercised = 0;
    // The end of the block of tokens reserved last: the counter on disk.
    let fence = {
        let mut name = locker.lock_path("f").unwrap().into_os_string();
        name.push(".fence");
        std::path::PathBuf::from(name)
    };
    let block_end = || -> u64 { std::fs::read_to_string(&fence).unwrap().trim().parse().unwrap() };
    for round in 0..10 {
        let mut guard = locker.acquire("f").await.unwrap();
        let first = guard.fencing_token().unwrap();
        let end = block_end();
        let start = Instant::now();
        let mut last = first;
        // Whether every step was a handoff (the next token of the block):
        // on a slow machine the lock may go back to disk in between (the
        // handoff window), and come back with a new block.
        let mut handed_on = true;
        while last < end {
            let mut next = Box::pin(locker.acquire("f"));
            assert!(poll_once(&mut next).await.is_pending());
            drop(guard);
            guard = next.await.unwrap();
            let token = guard.fencing_token().unwrap();
            handed_on &= token == last + 1;
            last = token;
        }
        let mut waiter = Box::pin(locker.acquire_timeout("f", Duration::from_secs(10)));
        let mut second = Box::pin(locker.acquire_timeout("f", Duration::from_secs(10)));
        assert!(poll_once(&mut waiter).await.is_pending());
        assert!(poll_once(&mut second).await.is_pending());
        remove(&locker.lock_path("f").unwrap());
        let in_window = handed_on && last == block_end() && start.elapsed() < Duration::from_millis(8);
        drop(guard);
        let got = waiter.await;
        if in_window {
            exercised += 1;
        }
        let got = got.unwrap_or_else(|e| panic!("round {round}: the waiter failed: {e:?}"));
        let token = got.fencing_token().unwrap();
        assert!(token > last);
        if !in_window {
            // The block did not run out at this handoff (the lock went to
            // disk in between, or the loop outlasted the window): it was
            // handed on with a token at hand, the hold whose file is gone,
            // as any in-process handoff is until a renewal or
            // `ensure_held` looks. Only a handoff at the block's end is
            // this test's case.
            let _ = got.ensure_held().await;
            drop(got);
            drop(second);
            continue;
        }
        got.ensure_held().await.unwrap();
        drop(got);
        // And the one queued behind it (which, before, was handed the
        // same hold and failed alike).
        let got = second
            .await
            .unwrap_or_else(|e| panic!("round {round}: the second waiter failed: {e:?}"));
        assert!(got.fencing_token().unwrap() > token);
        got.ensure_held().await.unwrap();
        drop(got);
    }
    eprintln!("exercised {exercised} of 10");
}
