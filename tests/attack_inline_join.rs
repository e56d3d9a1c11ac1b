//! Joins made on the runtime's own thread (a group of at most 8 entries,
//! its mutation lock free) and joins made on the blocking pool (a larger
//! group, or the mutation lock taken this instant) in one lock directory,
//! by many `Locker`s at once, some acquisitions cancelled part way: a
//! semaphore of 8 or 9 permits never has more holders than permits, a
//! writer never holds beside a reader or a permit, and nothing is left in
//! the directory once everyone let go.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[path = "support/common.rs"]
mod common;

use leasehold::{Locker, Strategy};

#[cfg(unix)]
const LAYOUTS: &[Strategy] = &[Strategy::ExclusiveFile, Strategy::Directory];
#[cfg(windows)]
const LAYOUTS: &[Strategy] = &[Strategy::ExclusiveFile];

/// How many `Locker`s share the directory: more than 8, so a group of
/// all of them is joined on the blocking pool.
const LOCKERS: usize = 11;

/// What is held at once: permits (or readers) count one each, a writer
/// counts `WRITER`.
const WRITER: usize = 1000;

/// A cheap pseudo-random number from a seed (xorshift).
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// Takes `held` up by `by`, checks what is held at once against `most`
/// (and that a writer is alone), and returns what was held with us.
fn enter(held: &AtomicUsize, by: usize, most: usize, what: &str) -> usize {
    let now = held.fetch_add(by, Ordering::SeqCst) + by;
    let (writers, others) = (now / WRITER, now % WRITER);
    assert!(
        writers <= 1 && (writers == 0 || others == 0),
        "{what}: a writer held beside others ({now})"
    );
    assert!(others <= most, "{what}: {others} holders of {most} permits");
    now
}

/// `LOCKERS` `Locker`s, two tasks each, take permits of an 8- or
/// 9-permit semaphore (or, `permits` 0, readers of one shared lock) for a
/// few milliseconds each, a third of the acquisitions given up after a
/// moment; one writer takes the name exclusively now and then, for
/// `run_for` at least, and then until `want` holders were seen at once or
/// 15 s have passed (a slow machine may take longer to fill the group).
/// Returns the most holders seen at once.
async fn churn(strategy: Strategy, permits: u32, run_for: Duration, want: usize) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let lockers: Vec<Locker> = (0..LOCKERS)
        .map(|_| {
            Locker::builder()
                .directory(dir.path())
                .strategy(strategy)
                .durable(false)
                .build()
                .unwrap()
        })
        .collect();
    let held = Arc::new(AtomicUsize::new(0));
    let most_seen = Arc::new(AtomicUsize::new(0));
    let most = if permits == 0 {
        usize::MAX
    } else {
        permits as usize
    };
    let what = format!("{strategy:?}, {permits} permits");
    let (start, most_seen_) = (Instant::now(), most_seen.clone());
    let go_on = Arc::new(move || {
        let elapsed = start.elapsed();
        elapsed < run_for || (most_seen_.load(Ordering::SeqCst) < want && elapsed < Duration::from_secs(15))
    });
    let mut tasks = Vec::new();
    for (i, locker) in lockers.iter().enumerate() {
        for t in 0..2u64 {
            let (locker, held, most_seen, what, go_on) = (
                locker.clone(),
                held.clone(),
                most_seen.clone(),
                what.clone(),
                go_on.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut seed = 0x9e37_79b9_7f4a_7c15 ^ ((i as u64) << 8 | t) ^ 1;
                let semaphore = (permits > 0).then(|| locker.semaphore("pool", permits).unwrap());
                while go_on() {
                    let roll = next(&mut seed);
                    let acquire = async {
                        match &semaphore {
                            Some(semaphore) => semaphore.acquire().await,
                            None => locker.acquire_shared("pool").await,
                        }
                    };
                    let guard = if roll.is_multiple_of(3) {
                        // Given up after a moment: cancelled wherever it is.
                        let patience = Duration::from_micros(roll % 3000);
                        match tokio::time::timeout(patience, acquire).await {
                            Ok(guard) => guard.unwrap(),
                            Err(_) => continue,
                        }
                    } else {
                        acquire.await.unwrap()
                    };
                    let now = enter(&held, 1, most, &what);
                    most_seen.fetch_max(now % WRITER, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_micros(500 + roll % 4000)).await;
                    held.fetch_sub(1, Ordering::SeqCst);
                    drop(guard);
                }
            }));
        }
    }
    let writer = {
        let (locker, held, what, go_on) = (lockers[0].clone(), held.clone(), what.clone(), go_on.clone());
        tokio::spawn(async move {
            while go_on() {
                tokio::time::sleep(Duration::from_millis(150)).await;
                let Ok(guard) = locker.acquire_timeout("pool", Duration::from_secs(5)).await else {
                    panic!("{what}: the writer waited 5 s");
                };
                enter(&held, WRITER, most, &what);
                tokio::time::sleep(Duration::from_millis(2)).await;
                held.fetch_sub(WRITER, Ordering::SeqCst);
                drop(guard);
            }
        })
    };
    for task in tasks {
        task.await.unwrap();
    }
    writer.await.unwrap();
    drop(lockers);
    let left = common::left_after(dir.path(), Duration::from_secs(5));
    assert!(left.is_empty(), "{what}: left {left:?}");
    most_seen.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_and_readers_across_the_inline_size_keep_the_count() {
    for &strategy in LAYOUTS {
        for permits in [8, 9] {
            let want = permits as usize;
            let seen = churn(strategy, permits, Duration::from_millis(1500), want).await;
            // Full, and so (at 9) past the size joined inline.
            assert_eq!(
                seen, permits as usize,
                "{strategy:?}: at most {seen} of {permits} held"
            );
        }
        let readers = churn(strategy, 0, Duration::from_millis(1500), 9).await;
        assert!(readers > 8, "{strategy:?}: at most {readers} readers at once");
    }
}

/// An acquisition's first poll, where a join is tried on the runtime's
/// own thread, reads no more of a members directory than the 8 entries
/// it may join inline: a group of 100 000 entries (here strangers' files,
/// which leasehold never touches) is left to the blocking pool after a
/// look at 9 names, not after listing them all on the runtime's thread
/// (140 ms in a debug build, on ext4, where it was listed whole): the
/// fastest of three first polls takes less than half of a plain listing
/// of the same directory, same run (a listing of 100 000 names costs the
/// same slow machine as much more).
#[tokio::test(flavor = "current_thread")]
async fn a_large_group_is_not_listed_on_the_runtimes_thread() {
    let dir = tempfile::tempdir().unwrap();
    let build = || {
        Locker::builder()
            .directory(dir.path())
            .durable(false)
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    let held = a.acquire_shared("wide").await.unwrap();
    let members = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".members"))
        .expect("a members directory");
    for i in 0..100_000 {
        std::fs::File::create(members.join(format!("stranger-{i}"))).unwrap();
    }
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    // The control: a plain listing of the whole directory, the fastest of
    // two.
    let listing = (0..2)
        .map(|_| {
            let t = Instant::now();
            let n = std::fs::read_dir(&members).unwrap().count();
            assert!(n >= 100_000);
            t.elapsed()
        })
        .min()
        .unwrap();
    let mut fastest = Duration::MAX;
    for _ in 0..3 {
        let mut join = std::pin::pin!(b.try_acquire_shared("wide"));
        let polled = Instant::now();
        let first = join.as_mut().poll(&mut cx);
        fastest = fastest.min(polled.elapsed());
        assert!(first.is_pending(), "a group this large is joined on the pool");
        // Made whole on the pool.
        let joined = join.await.unwrap().expect("a reader joins");
        drop(joined);
    }
    eprintln!("fastest first poll {fastest:?}, a whole listing {listing:?}");
    assert!(
        fastest < listing / 2,
        "the runtime's thread was held {fastest:?} by every first poll (a whole listing: {listing:?})"
    );
    drop(held);
    for i in 0..100_000 {
        std::fs::remove_file(members.join(format!("stranger-{i}"))).unwrap();
    }
}
