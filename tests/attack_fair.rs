//! A cold attack on `LockerBuilder::fair` and on the waiting line's turn
//! marks (a helper session's, kept as tests). Three of these failed on
//! the first version: a frozen waiter in line, or a read lock anyone can
//! take over the directory, held up every acquisition of a fair `Locker`
//! (13 and 24 ms each); a field of marks that each asked for little kept
//! a waiter off about four times the 10 ms the line allows them. The
//! others held from the start: no two holders, every wait ended, nothing
//! left behind.
//!
//! Lockers share one process but each opens the lock directory itself
//! (its own open file description): to the line they are as separate
//! processes. A "frozen" waiter is an acquire future that was polled
//! until it stood in line, then never polled again (kept alive).
#![cfg(target_os = "linux")]

#[path = "support/common.rs"]
mod common;

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{anyone_in_line, entries};
use leasehold::{Locker, PathStyle};

/// Every wait of these tests ends within this.
const BOUND: Duration = Duration::from_secs(10);

fn fair(dir: &Path) -> Locker {
    Locker::builder().directory(dir).fair(true).build().unwrap()
}

fn plain_fair(dir: &Path, fair_: bool) -> Locker {
    Locker::builder()
        .directory(dir)
        .path_style(PathStyle::Plain)
        .fair(fair_)
        .build()
        .unwrap()
}

type Frozen = Pin<Box<dyn Future<Output = leasehold::Result<leasehold::LockGuard>> + Send>>;

/// An acquisition of `name` by `locker` (another Locker than the holder's,
/// while the name is held) polled until it stands in line, then left alone.
async fn frozen_waiter(locker: &Locker, dir: &Path, name: &str) -> Frozen {
    let locker = locker.clone();
    let name = name.to_owned();
    let mut fut: Frozen =
        Box::pin(async move { locker.acquire_timeout(&name, Duration::from_secs(120)).await });
    let started = Instant::now();
    while !anyone_in_line(dir) {
        assert!(started.elapsed() < BOUND, "the frozen waiter never stood in line");
        let _ = tokio::time::timeout(Duration::from_millis(20), fut.as_mut()).await;
    }
    fut
}

/// Holds an OFD read lock over `[start, start + len)` of the directory
/// (len 0: to the end): what anyone who can open the directory for reading
/// can do.
fn foreign_range(dir: &Path, start: i64, len: i64) -> std::fs::File {
    use nix::fcntl::{FcntlArg, fcntl};
    let file = std::fs::File::open(dir).unwrap();
    let lock = nix::libc::flock {
        l_type: nix::libc::F_RDLCK as i16,
        l_whence: nix::libc::SEEK_SET as i16,
        l_start: start,
        l_len: len,
        l_pid: 0,
    };
    fcntl(&file, FcntlArg::F_OFD_SETLK(&lock)).unwrap();
    file
}

/// `n` back-to-back acquisitions of `name` by `locker`; returns the time.
async fn loop_of(locker: &Locker, name: &str, n: u32) -> Duration {
    let started = Instant::now();
    for _ in 0..n {
        let guard = locker.acquire_timeout(name, BOUND).await.unwrap();
        drop(guard);
    }
    started.elapsed()
}

/// `n` back-to-back acquisitions of `name` by `locker`; returns each
/// acquisition's time, sorted.
async fn times_of(locker: &Locker, name: &str, n: u32) -> Vec<Duration> {
    let mut times = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let guard = locker.acquire_timeout(name, BOUND).await.unwrap();
        times.push(t.elapsed());
        drop(guard);
    }
    times.sort();
    times
}

fn median(sorted: &[Duration]) -> Duration {
    sorted[sorted.len() / 2]
}

/// A fair Locker's acquisitions (`fair`, sorted) cost no more than a
/// default Locker's in the same place and run (`control`, sorted), give
/// or take 5 ms on the median: a machine slow at creating files or
/// stalled now and then slows both alike (a stall touches a few
/// acquisitions, not the median), while a stand-back at every
/// acquisition (a 10 ms sleep, which never ends early: the bug cost 12 to
/// 24 ms each) moves the whole of `fair`'s median by 10 ms or more.
fn no_pause_per_acquisition(fair: &[Duration], control: &[Duration], what: &str) {
    let (f, c) = (median(fair), median(control));
    let sum = |v: &[Duration]| v.iter().sum::<Duration>();
    eprintln!(
        "{what}: fair median {f:?} (all {:?}), default median {c:?} (all {:?})",
        sum(fair),
        sum(control)
    );
    assert!(
        f < c + Duration::from_millis(5),
        "{what}: a fair Locker's acquisitions took {f:?} (median) where a default Locker's took {c:?}: a stand-back at every acquisition; fair {fair:?}"
    );
}

/// The line's docs: "a frozen waiter ... costs the others a few looks
/// once, and never blocks them". A fair Locker looping on a name that
/// nobody else holds, with one frozen waiter of another Locker in line,
/// sees a ticket in line at every release, ends its turn and rejoins
/// behind the frozen ticket. It used to stand back for it at every
/// acquisition (the lock found free twice was tried, but the frozen
/// waiter never passed over, since the lock never changed hands), 12 ms
/// each; now free twice with nobody leaving passes it over, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_loop_with_a_frozen_waiter_in_line_pays_once_not_every_time() {
    let dir = tempfile::tempdir().unwrap();
    let (looping, frozen_by) = (fair(dir.path()), Locker::new(dir.path()).unwrap());
    let held = looping.acquire("job").await.unwrap();
    let frozen = frozen_waiter(&frozen_by, dir.path(), "job").await;
    drop(held);
    // Warm-up: the frozen waiter's chances, paid once.
    let warm = loop_of(&looping, "job", 5).await;
    eprintln!("fair, frozen waiter in line: warm-up 5 in {warm:?}");
    let took = times_of(&looping, "job", 50).await;
    // Control: the same with a default Locker, same run.
    let default = Locker::new(dir.path()).unwrap();
    let _ = loop_of(&default, "job", 5).await;
    let control = times_of(&default, "job", 50).await;
    drop(frozen);
    no_pause_per_acquisition(&took, &control, "frozen waiter in line, 50 acquisitions");
}

/// Same, with no leasehold waiter at all: one OFD read lock over the
/// whole byte range (anyone who can read the directory can take it). It
/// used to end a fair Locker's turn at every release, and the range's
/// hidden waiters made every attempt keep off the lock for its courtesy
/// (10 ms); a range over more than one byte is no ticket, and no longer
/// ends a fair turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_loop_with_a_foreign_range_over_the_line_is_not_throttled_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let looping = fair(dir.path());
    // The whole byte range: every name's line and marks.
    let foreign = foreign_range(dir.path(), 0, 0);
    let warm = loop_of(&looping, "job", 5).await;
    eprintln!("fair, foreign range: warm-up 5 in {warm:?}");
    let took = times_of(&looping, "job", 50).await;
    let default = Locker::new(dir.path()).unwrap();
    let _ = loop_of(&default, "job", 5).await;
    let control = times_of(&default, "job", 50).await;
    drop(foreign);
    no_pause_per_acquisition(&took, &control, "foreign range over the line, 50 acquisitions");
}

/// The fair Locker's own tasks contend with each other while another
/// Locker's waiter is frozen in line: no handoff in memory (someone is
/// "waiting"), each task goes to the disk and stands back. Every task must
/// still be served, within generous bounds, and never two at once; and
/// all 40 acquisitions take at most 200 ms more than the same 40 among a
/// default Locker's tasks beside the same frozen waiter, same run (a
/// stand-back at every acquisition costs at least 10 ms each, 400 ms; a
/// slow machine slows both alike).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_tasks_with_a_frozen_waiter_all_get_served_without_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let (ours, frozen_by) = (fair(dir.path()), Locker::new(dir.path()).unwrap());
    let held = ours.acquire("job").await.unwrap();
    let frozen = frozen_waiter(&frozen_by, dir.path(), "job").await;
    drop(held);
    let (total, worst) = four_tasks_of_ten(&ours).await;
    eprintln!("4 fair tasks x 10 with a frozen waiter: {total:?}, worst wait {worst:?}");
    let default = Locker::new(dir.path()).unwrap();
    let (control, control_worst) = four_tasks_of_ten(&default).await;
    eprintln!("4 default tasks x 10 with a frozen waiter: {control:?}, worst wait {control_worst:?}");
    drop(frozen);
    assert!(worst < Duration::from_secs(3), "a task waited {worst:?}");
    assert!(
        total < control + Duration::from_millis(200),
        "40 acquisitions among a fair Locker's tasks took {total:?} with a frozen waiter in line (a default Locker's: {control:?})"
    );
}

/// Four tasks of `locker`, ten acquisitions of "job" each, checked never
/// to overlap; returns the time all took and the longest wait.
async fn four_tasks_of_ten(locker: &Locker) -> (Duration, Duration) {
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU32::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (ours, inside, overlaps) = (locker.clone(), Arc::clone(&inside), Arc::clone(&overlaps));
            tokio::spawn(async move {
                let mut worst = Duration::ZERO;
                for _ in 0..10 {
                    let t = Instant::now();
                    let g = ours.acquire_timeout("job", BOUND).await.unwrap();
                    worst = worst.max(t.elapsed());
                    if inside.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::task::yield_now().await;
                    inside.store(false, Ordering::SeqCst);
                    drop(g);
                }
                worst
            })
        })
        .collect();
    let mut worst = Duration::ZERO;
    for t in tasks {
        worst = worst.max(t.await.unwrap());
    }
    let total = started.elapsed();
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    (total, worst)
}

/// Exclusion under churn: fair and default Lockers, several tasks each,
/// with cancellations at random points (short timeouts, dropped futures),
/// one frozen waiter in line for part of the time. Never two holders;
/// every Locker served; nothing left in the directory or the line after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_and_default_lockers_never_overlap_and_leave_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let before = entries(dir.path());
    let lockers: Vec<Locker> = (0..4)
        .map(|i| {
            Locker::builder()
                .directory(dir.path())
                .fair(i % 2 == 0)
                .build()
                .unwrap()
        })
        .collect();
    let frozen_by = Locker::new(dir.path()).unwrap();
    let held = lockers[0].acquire("job").await.unwrap();
    let frozen = frozen_waiter(&frozen_by, dir.path(), "job").await;
    drop(held);
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU32::new(0));
    let served: Arc<Vec<AtomicU64>> = Arc::new((0..4).map(|_| AtomicU64::new(0)).collect());
    let stop = Instant::now() + Duration::from_millis(1500);
    let mut tasks = Vec::new();
    for (i, locker) in lockers.iter().enumerate() {
        for t in 0..3u64 {
            let (locker, inside, overlaps, served) = (
                locker.clone(),
                Arc::clone(&inside),
                Arc::clone(&overlaps),
                Arc::clone(&served),
            );
            tasks.push(tokio::spawn(async move {
                let mut k = t;
                while Instant::now() < stop {
                    k = k
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    // One attempt in four is cancelled after up to 3 ms.
                    let guard = if k >> 62 == 0 {
                        let cut = Duration::from_micros((k >> 20) % 3000);
                        match tokio::time::timeout(cut, locker.acquire("job")).await {
                            Ok(g) => g.unwrap(),
                            Err(_) => continue,
                        }
                    } else if k >> 62 == 1 {
                        match locker.try_acquire("job").await.unwrap() {
                            Some(g) => g,
                            None => {
                                tokio::task::yield_now().await;
                                continue;
                            }
                        }
                    } else {
                        locker.acquire_timeout("job", BOUND).await.unwrap()
                    };
                    if inside.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    served[i].fetch_add(1, Ordering::Relaxed);
                    if k & 4 == 0 {
                        tokio::task::yield_now().await;
                    }
                    inside.store(false, Ordering::SeqCst);
                    drop(guard);
                }
            }));
        }
    }
    // The frozen waiter goes half way through.
    tokio::time::sleep(Duration::from_millis(700)).await;
    drop(frozen);
    for t in tasks {
        tokio::time::timeout(BOUND, t)
            .await
            .expect("a task hung")
            .unwrap();
    }
    let served: Vec<u64> = served.iter().map(|s| s.load(Ordering::Relaxed)).collect();
    eprintln!("served per Locker (fair, default, fair, default): {served:?}");
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    assert!(served.iter().all(|&s| s > 0), "a Locker never served: {served:?}");
    drop(lockers);
    drop(frozen_by);
    let left = common::left_after(dir.path(), Duration::from_secs(3));
    assert_eq!(left, before, "left behind in the lock directory");
    assert!(!anyone_in_line(dir.path()), "a byte left in the line");
}

/// A fair Locker's semaphore: permits never exceed n, both Lockers are
/// served, a frozen permit waiter does not stop anyone for long, and
/// nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_semaphore_keeps_its_count_and_serves_everyone() {
    let dir = tempfile::tempdir().unwrap();
    let before = entries(dir.path());
    let (a, b, c) = (
        fair(dir.path()),
        fair(dir.path()),
        Locker::new(dir.path()).unwrap(),
    );
    let (sa, sb, sc) = (
        a.semaphore("pool", 2).unwrap(),
        b.semaphore("pool", 2).unwrap(),
        c.semaphore("pool", 2).unwrap(),
    );
    // Two permits held by A; C's acquisition stands in line, frozen.
    let (p1, p2) = (sa.acquire().await.unwrap(), sa.acquire().await.unwrap());
    let sc2 = sc.clone();
    let mut frozen: Frozen = Box::pin(async move { sc2.acquire_timeout(Duration::from_secs(120)).await });
    let t = Instant::now();
    while !anyone_in_line(dir.path()) {
        assert!(t.elapsed() < BOUND, "never in line");
        let _ = tokio::time::timeout(Duration::from_millis(20), frozen.as_mut()).await;
    }
    drop((p1, p2));
    let holders = Arc::new(AtomicU32::new(0));
    let over = Arc::new(AtomicU32::new(0));
    let stop = Instant::now() + Duration::from_millis(1200);
    let mut tasks = Vec::new();
    for (who, sem) in [
        (0usize, sa.clone()),
        (0, sa.clone()),
        (1, sb.clone()),
        (1, sb.clone()),
    ] {
        let (holders, over) = (Arc::clone(&holders), Arc::clone(&over));
        tasks.push(tokio::spawn(async move {
            let (mut n, mut worst) = (0u32, Duration::ZERO);
            while Instant::now() < stop {
                let t = Instant::now();
                let g = sem.acquire_timeout(BOUND).await.unwrap();
                worst = worst.max(t.elapsed());
                if holders.fetch_add(1, Ordering::SeqCst) >= 2 {
                    over.fetch_add(1, Ordering::SeqCst);
                }
                tokio::task::yield_now().await;
                holders.fetch_sub(1, Ordering::SeqCst);
                drop(g);
                n += 1;
            }
            (who, n, worst)
        }));
    }
    let mut per = [0u32; 2];
    let mut worst = Duration::ZERO;
    for t in tasks {
        let (who, n, w) = tokio::time::timeout(BOUND, t).await.expect("hung").unwrap();
        per[who] += n;
        worst = worst.max(w);
    }
    eprintln!("fair semaphore: per Locker {per:?}, worst wait {worst:?}");
    drop(frozen);
    assert_eq!(over.load(Ordering::SeqCst), 0, "more than 2 permits held");
    assert!(per.iter().all(|&n| n > 0), "a Locker never served: {per:?}");
    assert!(worst < Duration::from_secs(3), "a permit wait took {worst:?}");
    drop((sa, sb, sc, a, b, c));
    let left = common::left_after(dir.path(), Duration::from_secs(3));
    assert_eq!(left, before, "left behind");
    assert!(!anyone_in_line(dir.path()), "a byte left in the line");
}

/// Shared and upgradable with a fair Locker: readers of a fair Locker and
/// an exclusive waiter of another; the writer is served within bounds and
/// never while a reader holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_shared_and_upgradable_serve_a_writer_in_bounded_time() {
    let dir = tempfile::tempdir().unwrap();
    let before = entries(dir.path());
    let (readers, writer) = (fair(dir.path()), fair(dir.path()));
    let readers_in = Arc::new(AtomicU32::new(0));
    let writer_in = Arc::new(AtomicBool::new(false));
    let bad = Arc::new(AtomicU32::new(0));
    let stop = Instant::now() + Duration::from_millis(1200);
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (readers, readers_in, writer_in, bad) = (
            readers.clone(),
            Arc::clone(&readers_in),
            Arc::clone(&writer_in),
            Arc::clone(&bad),
        );
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while Instant::now() < stop {
                let g = readers.acquire_shared_timeout("doc", BOUND).await.unwrap();
                readers_in.fetch_add(1, Ordering::SeqCst);
                if writer_in.load(Ordering::SeqCst) {
                    bad.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                readers_in.fetch_sub(1, Ordering::SeqCst);
                drop(g);
                n += 1;
            }
            (n, Duration::ZERO)
        }));
    }
    for upgrade in [false, true] {
        let (writer, readers_in, writer_in, bad) = (
            writer.clone(),
            Arc::clone(&readers_in),
            Arc::clone(&writer_in),
            Arc::clone(&bad),
        );
        tasks.push(tokio::spawn(async move {
            let (mut n, mut worst) = (0, Duration::ZERO);
            while Instant::now() < stop {
                let t = Instant::now();
                let g = if upgrade {
                    let u = writer.acquire_upgradable_timeout("doc", BOUND).await.unwrap();
                    tokio::time::timeout(BOUND, u.upgrade())
                        .await
                        .expect("upgrade hung")
                        .unwrap()
                } else {
                    writer.acquire_timeout("doc", BOUND).await.unwrap()
                };
                worst = worst.max(t.elapsed());
                if writer_in.swap(true, Ordering::SeqCst) || readers_in.load(Ordering::SeqCst) > 0 {
                    bad.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                writer_in.store(false, Ordering::SeqCst);
                drop(g);
                n += 1;
            }
            (n, worst)
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(tokio::time::timeout(BOUND, t).await.expect("hung").unwrap());
    }
    eprintln!("shared/upgradable with fair: {results:?}");
    assert_eq!(
        bad.load(Ordering::SeqCst),
        0,
        "a writer overlapped another holder"
    );
    assert!(
        results.iter().all(|&(n, _)| n > 0),
        "someone never served: {results:?}"
    );
    assert!(
        results.iter().all(|&(_, w)| w < Duration::from_secs(3)),
        "a writer waited too long: {results:?}"
    );
    drop((readers, writer));
    let left = common::left_after(dir.path(), Duration::from_secs(3));
    assert_eq!(left, before, "left behind");
    assert!(!anyone_in_line(dir.path()), "a byte left in the line");
}

/// release_all on a fair Locker whose tasks wait while another Locker's
/// waiter stands in line: every waiter ends promptly, and the other
/// Locker gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_release_all_ends_every_wait_and_lets_the_other_in() {
    let dir = tempfile::tempdir().unwrap();
    let before = entries(dir.path());
    let (ours, other) = (fair(dir.path()), Locker::new(dir.path()).unwrap());
    let held = ours.acquire("job").await.unwrap();
    let other_task = tokio::spawn({
        let other = other.clone();
        async move { other.acquire_timeout("job", BOUND).await.map(drop) }
    });
    let t = Instant::now();
    while !anyone_in_line(dir.path()) {
        assert!(t.elapsed() < BOUND);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let ours = ours.clone();
            tokio::spawn(async move { ours.acquire_timeout("job", BOUND).await.map(drop) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    let released = tokio::time::timeout(BOUND, ours.release_all())
        .await
        .expect("release_all hung");
    assert_eq!(released.len(), 1, "{released:?}");
    for w in waiters {
        let r = tokio::time::timeout(BOUND, w)
            .await
            .expect("a waiter hung")
            .unwrap();
        assert!(r.is_err(), "a waiter of a shut Locker got the lock");
    }
    tokio::time::timeout(BOUND, other_task)
        .await
        .expect("the other Locker never got the lock")
        .unwrap()
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(3), "took {:?}", t.elapsed());
    drop(held);
    drop((ours, other));
    let left = common::left_after(dir.path(), Duration::from_secs(3));
    assert_eq!(left, before, "left behind");
    assert!(!anyone_in_line(dir.path()), "a byte left in the line");
}

/// Many names at once on a fair Locker with another Locker waiting on each
/// (every release ends the turn and leaves a place with `rejoin`): all
/// served within bounds, and the places do not stop later acquisitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_many_names_each_with_a_waiter_all_served() {
    let dir = tempfile::tempdir().unwrap();
    let before = entries(dir.path());
    let (ours, other) = (fair(dir.path()), Locker::new(dir.path()).unwrap());
    let names: Vec<String> = (0..200).map(|i| format!("n{i}")).collect();
    let mut guards = Vec::new();
    for n in &names {
        guards.push(ours.acquire(n).await.unwrap());
    }
    let waits: Vec<_> = names
        .iter()
        .map(|n| {
            let (other, n) = (other.clone(), n.clone());
            tokio::spawn(async move {
                let g = other.acquire_timeout(&n, BOUND).await?;
                tokio::time::sleep(Duration::from_millis(2)).await;
                drop(g);
                Ok::<_, leasehold::Error>(())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(guards);
    let t = Instant::now();
    // Our next round comes after the other's on each name.
    for n in &names {
        drop(ours.acquire_timeout(n, BOUND).await.unwrap());
    }
    for w in waits {
        tokio::time::timeout(BOUND, w)
            .await
            .expect("hung")
            .unwrap()
            .unwrap();
    }
    eprintln!("200 names, second round: {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
    drop((ours, other));
    let left = common::left_after(dir.path(), Duration::from_secs(3));
    assert_eq!(left, before, "left behind");
    assert!(!anyone_in_line(dir.path()), "a byte left in the line");
}

// ---------------------------------------------------------------------
// Turn marks: "honoured until its time" must keep a waiter's cost within
// 10 ms of marks per acquisition plus one mark's 300 µs.
// ---------------------------------------------------------------------

const REGION: u64 = 1 << 40;
const HALF: u64 = REGION / 2;
const REGIONS: u64 = 1 << 22;

fn region(file_name: &str) -> u64 {
    let hash = file_name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % REGIONS) * REGION
}

fn boot_us() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).unwrap();
    (t.tv_sec() as u64) * 1_000_000 + (t.tv_nsec() as u64) / 1000
}

/// One timed handoff: `holder` takes "job", a task of `waiter` waits for
/// it; once the waiter's ticket shows in the name's region (which starts
/// at `start`), `before_release` runs and the holder lets go. Returns how
/// long the waiter took to get the lock after the release.
async fn timed_handoff(
    holder: &Locker,
    waiter: &Locker,
    dir: &Path,
    start: u64,
    before_release: impl FnOnce(),
) -> Duration {
    use nix::fcntl::{FcntlArg, fcntl};
    let held = holder.acquire_timeout("job", BOUND).await.unwrap();
    let w = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            let g = waiter.acquire_timeout("job", BOUND).await.unwrap();
            let at = Instant::now();
            drop(g);
            at
        })
    };
    let t = Instant::now();
    // Wait until the waiter is in line (a ticket below the marks).
    loop {
        assert!(t.elapsed() < BOUND);
        let f = std::fs::File::open(dir).unwrap();
        let mut lock = nix::libc::flock {
            l_type: nix::libc::F_WRLCK as i16,
            l_whence: nix::libc::SEEK_SET as i16,
            l_start: start as i64,
            l_len: HALF as i64,
            l_pid: 0,
        };
        fcntl(&f, FcntlArg::F_OFD_GETLK(&mut lock)).unwrap();
        if i32::from(lock.l_type) != nix::libc::F_UNLCK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    before_release();
    let released = Instant::now();
    drop(held);
    let got = tokio::time::timeout(BOUND, w)
        .await
        .expect("waiter hung")
        .unwrap();
    got.saturating_duration_since(released)
}

/// A waiter in line while a holder of another Locker keeps the lock
/// briefly, again and again; someone (not leasehold) holds a dense field of
/// bytes in the name's marks half, each a "mark" for a time to come, kept
/// for good and renewed forward (a thread lays marks 32..288 µs ahead and
/// drops those behind the clock every ~100 µs). Each handoff to the waiter
/// must cost at most the documented 10 ms of marks (+300 µs), with slack
/// for the machine: the median handoff at most 25 ms more than the same
/// handoffs without marks, same run. (Measured: under 2 ms: the lowest byte is usually one already
/// honoured and past its time, which ends the marks for that look.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_marks_cost_a_waiter_at_most_the_marks_budget_per_acquisition() {
    let dir = tempfile::tempdir().unwrap();
    let (holder, waiter) = (plain_fair(dir.path(), false), plain_fair(dir.path(), false));
    let start = region("job.lock");
    let keep = Arc::new(AtomicBool::new(true));
    // A thread that keeps bytes as marks 32 µs .. 300 µs ahead, moving
    // with the clock, every 100 µs: a mark always "for a time to come".
    let marker = {
        let (dir, keep) = (dir.path().to_owned(), Arc::clone(&keep));
        std::thread::spawn(move || {
            use nix::fcntl::{FcntlArg, fcntl};
            let file = std::fs::File::open(&dir).unwrap();
            while keep.load(Ordering::Relaxed) {
                let units = (boot_us() >> 4) % HALF;
                for ahead in (2..19).step_by(2) {
                    let lock = nix::libc::flock {
                        l_type: nix::libc::F_RDLCK as i16,
                        l_whence: nix::libc::SEEK_SET as i16,
                        l_start: (start + HALF + units + ahead) as i64,
                        l_len: 1,
                        l_pid: 0,
                    };
                    let _ = fcntl(&file, FcntlArg::F_OFD_SETLK(&lock));
                }
                // Drop the ones behind the clock.
                let unlock = nix::libc::flock {
                    l_type: nix::libc::F_UNLCK as i16,
                    l_whence: nix::libc::SEEK_SET as i16,
                    l_start: (start + HALF) as i64,
                    l_len: units as i64,
                    l_pid: 0,
                };
                let _ = fcntl(&file, FcntlArg::F_OFD_SETLK(&unlock));
                std::thread::sleep(Duration::from_micros(100));
            }
        })
    };
    let mut marked = Vec::new();
    for _ in 0..20 {
        marked.push(timed_handoff(&holder, &waiter, dir.path(), start, || ()).await);
    }
    keep.store(false, Ordering::Relaxed);
    marker.join().unwrap();
    let control = control_handoffs(&holder, &waiter, dir.path(), start, 20).await;
    marked.sort();
    eprintln!("kept marks: handoffs {marked:?}");
    within_the_marks_budget(&marked, &control);
}

/// The fair change must not make a fair waiter in line wait longer than a
/// default one behind a default looping holder: a default Locker loops
/// on the lock (turns of 32); a fair Locker's task waits in line: served
/// within a bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiter_behind_an_unfair_looper_is_served_in_bounded_time() {
    let dir = tempfile::tempdir().unwrap();
    let (looper, ours) = (Locker::new(dir.path()).unwrap(), fair(dir.path()));
    let stop = Arc::new(AtomicBool::new(false));
    let l = {
        let (looper, stop) = (looper.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                drop(looper.acquire_timeout("job", BOUND).await.unwrap());
                n += 1;
            }
            n
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut worst = Duration::ZERO;
    for _ in 0..20 {
        let t = Instant::now();
        let g = ours.acquire_timeout("job", BOUND).await.unwrap();
        worst = worst.max(t.elapsed());
        drop(g);
    }
    stop.store(true, Ordering::Relaxed);
    let n = tokio::time::timeout(BOUND, l)
        .await
        .expect("looper hung")
        .unwrap();
    eprintln!("fair waiter behind a looper: worst {worst:?}, looper did {n}");
    assert!(worst < Duration::from_secs(1), "a fair waiter waited {worst:?}");
}

/// A static field of kept bytes in the marks half, one every 2 units
/// (32 µs) for the next ~300 ms, re-laid before each round: every byte a
/// distinct mark "for a time to come", each honoured once for 16..32 µs
/// of budget. The budget counted what each mark asked for, not the time
/// the waiter really stayed off (a timer's wake-up and a look cost more
/// than 16 µs): 37 to 49 ms per handoff. Now it counts the time off the
/// lock: the real cost per acquisition must stay near the documented
/// 10 ms + 300 µs. We allow the median handoff 25 ms more than the same
/// handoffs without marks, same run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_of_short_marks_costs_no_more_than_the_documented_budget() {
    field_of_marks(1, 2).await;
}

/// The same with two open file descriptions taking turns (each byte of
/// one description 32 µs from the next; bytes of one description that
/// touch merge into a range that begins below the marks, ignored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dense_field_of_marks_from_two_descriptions_costs_no_more_than_the_budget() {
    field_of_marks(2, 2).await;
}

async fn field_of_marks(ofds: u64, step: u64) {
    use nix::fcntl::{FcntlArg, fcntl};
    let dir = tempfile::tempdir().unwrap();
    let (holder, waiter) = (plain_fair(dir.path(), false), plain_fair(dir.path(), false));
    let start = region("job.lock");
    let fields: Vec<std::fs::File> = (0..ofds)
        .map(|_| std::fs::File::open(dir.path()).unwrap())
        .collect();
    let lay = |_: &()| {
        for file in &fields {
            let unlock = nix::libc::flock {
                l_type: nix::libc::F_UNLCK as i16,
                l_whence: nix::libc::SEEK_SET as i16,
                l_start: (start + HALF) as i64,
                l_len: HALF as i64,
                l_pid: 0,
            };
            fcntl(file, FcntlArg::F_OFD_SETLK(&unlock)).unwrap();
        }
        let units = (boot_us() >> 4) % HALF;
        for k in 1..(4_000u64 / step) {
            let lock = nix::libc::flock {
                l_type: nix::libc::F_RDLCK as i16,
                l_whence: nix::libc::SEEK_SET as i16,
                l_start: (start + HALF + units + step * k) as i64,
                l_len: 1,
                l_pid: 0,
            };
            fcntl(&fields[(k % ofds) as usize], FcntlArg::F_OFD_SETLK(&lock)).unwrap();
        }
    };
    let mut marked = Vec::new();
    for _ in 0..10 {
        marked.push(timed_handoff(&holder, &waiter, dir.path(), start, || lay(&())).await);
    }
    drop(fields);
    // Control: the same handoffs with no marks, same run.
    let control = control_handoffs(&holder, &waiter, dir.path(), start, 10).await;
    marked.sort();
    eprintln!("field of marks ({ofds} OFDs, step {step}): handoffs {marked:?}");
    within_the_marks_budget(&marked, &control);
}

/// `rounds` timed handoffs between `holder` and `waiter` with nothing
/// else in the name's region: what a handoff costs this run; sorted.
async fn control_handoffs(
    holder: &Locker,
    waiter: &Locker,
    dir: &Path,
    start: u64,
    rounds: usize,
) -> Vec<Duration> {
    let mut control = Vec::new();
    for _ in 0..rounds {
        control.push(timed_handoff(holder, waiter, dir, start, || ()).await);
    }
    control.sort();
    eprintln!("no marks (control): handoffs {control:?}");
    control
}

/// Handoffs beside marks (`marked`, sorted) cost at most the documented
/// 10.3 ms of marks more than handoffs without (`control`, sorted, same
/// run), with 15 ms of slack: medians, so that a stall of the machine
/// in a few handoffs does not count. The budget that counted what each
/// mark asked for rather than the time off the lock cost 37 to 49 ms per
/// handoff.
fn within_the_marks_budget(marked: &[Duration], control: &[Duration]) {
    let (m, c) = (marked[marked.len() / 2], control[control.len() / 2]);
    assert!(
        m < c + Duration::from_millis(25),
        "handoffs beside marks took {m:?} (median) against {c:?} without (documented: 10.3 ms of marks more); all: {marked:?}"
    );
}
