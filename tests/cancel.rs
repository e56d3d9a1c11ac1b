//! Dropping acquire futures at any point leaves nothing behind.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use leasehold::Locker;

/// The waiting line's file, which leasehold keeps in a lock directory on
/// Windows once a waiter has stood in line there (docs/guarantees.md,
/// *Windows*): no leftover.
const LINE_FILE: &str = "leasehold..line";

/// A small deterministic generator, so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

async fn matrix(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::builder()
        .directory(dir.path())
        .poll_interval(Duration::from_millis(2))
        .build()
        .unwrap();
    // A second Locker stands for another process, so disk waits happen too.
    let other = Locker::builder()
        .directory(dir.path())
        .poll_interval(Duration::from_millis(2))
        .build()
        .unwrap();
    let names = ["a", "b", "c"];
    let completed = Arc::new(AtomicU64::new(0));
    let mut rng = Rng(seed);
    let mut tasks = Vec::new();

    // Steady workers that acquire and release throughout.
    for (i, l) in [locker.clone(), other.clone(), locker.clone()]
        .into_iter()
        .enumerate()
    {
        let completed = Arc::clone(&completed);
        tasks.push(tokio::spawn(async move {
            for round in 0..60 {
                let g = l.acquire(names[(i + round) % 3]).await.unwrap();
                tokio::time::sleep(Duration::from_micros(300)).await;
                drop(g);
                completed.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }

    // 2,000 futures dropped at random points, three ways.
    for _ in 0..2000 {
        let l = if rng.below(4) == 0 {
            other.clone()
        } else {
            locker.clone()
        };
        let name = names[rng.below(3) as usize];
        let micros = rng.below(3000);
        match rng.below(3) {
            0 => tasks.push(tokio::spawn(async move {
                let _ = l.acquire_timeout(name, Duration::from_micros(micros)).await;
            })),
            1 => tasks.push(tokio::spawn(async move {
                tokio::select! {
                    g = l.acquire(name) => drop(g),
                    _ = tokio::time::sleep(Duration::from_micros(micros)) => {}
                }
            })),
            _ => {
                let t = tokio::spawn(async move {
                    let g = l.acquire(name).await;
                    tokio::time::sleep(Duration::from_micros(100)).await;
                    drop(g);
                });
                let abort = t.abort_handle();
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_micros(micros)).await;
                    abort.abort();
                    let _ = t.await;
                }));
            }
        }
        if rng.below(8) == 0 {
            tokio::task::yield_now().await;
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        completed.load(Ordering::Relaxed),
        180,
        "the steady workers were not starved"
    );

    // Blocking-pool attempts still in flight finish and clean up promptly.
    for _ in 0..200 {
        if std::fs::read_dir(dir.path())
            .unwrap()
            .all(|e| e.unwrap().file_name() == LINE_FILE)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != LINE_FILE)
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    for name in names {
        for l in [&locker, &other] {
            let g = l.try_acquire(name).await.unwrap();
            assert!(g.is_some(), "{name} not free afterwards");
        }
    }
    assert_eq!(locker.stats().fs_waiters, 0);
    assert_eq!(other.stats().fs_waiters, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquires_leave_nothing_behind_multi_thread() {
    matrix(0x5eed).await;
}

#[tokio::test(flavor = "current_thread")]
async fn dropped_acquires_leave_nothing_behind_current_thread() {
    matrix(0xfeed).await;
}

#[tokio::test]
async fn a_cancelled_waiter_does_not_delay_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::new(dir.path()).unwrap();
    let held = locker.acquire("x").await.unwrap();
    let cancelled = {
        let l = locker.clone();
        tokio::spawn(async move { l.acquire("x").await.map(drop) })
    };
    let next = {
        let l = locker.clone();
        tokio::spawn(async move { l.acquire("x").await.map(drop) })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    cancelled.abort();
    drop(held);
    tokio::time::timeout(Duration::from_secs(1), next)
        .await
        .expect("the waiter behind a cancelled one got the lock")
        .unwrap()
        .unwrap();
}
