//! One `Locker`, many tasks: FIFO order, one disk waiter per name,
//! independence of names, both runtime flavours.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::Locker;

/// The waiting line's file, which leasehold keeps in a lock directory on
/// Windows once a waiter has stood in line there (docs/guarantees.md,
/// *Windows*): no leftover.
const LINE_FILE: &str = "leasehold..line";

fn locker(dir: &std::path::Path) -> Locker {
    Locker::builder()
        .directory(dir)
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn a_hundred_queued_tasks_acquire_in_arrival_order() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    let first = locker.acquire("fifo").await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..100 {
        let (locker, order, mark) = (locker.clone(), Arc::clone(&order), Arc::clone(&started));
        tasks.push(tokio::spawn(async move {
            mark.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let guard = locker.acquire("fifo").await.unwrap();
            order.lock().unwrap().push(i);
            tokio::task::yield_now().await;
            drop(guard);
        }));
        // Joining the queue happens in the task's first poll.
        while started.load(std::sync::atomic::Ordering::SeqCst) <= i {
            tokio::task::yield_now().await;
        }
    }
    drop(first);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..100).collect::<Vec<_>>());
}

async fn thousand_waiters_one_disk_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    // Another Locker plays the other process holding the lock at first.
    let other = self::locker(dir.path());
    let outside = other.acquire("hot").await.unwrap();
    let counts = Arc::new(Mutex::new(vec![0u32; 1000]));
    let tasks: Vec<_> = (0..1000)
        .map(|i| {
            let (locker, counts) = (locker.clone(), Arc::clone(&counts));
            tokio::spawn(async move {
                let guard = locker.acquire("hot").await.unwrap();
                counts.lock().unwrap()[i] += 1;
                tokio::task::yield_now().await;
                drop(guard);
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let waiting = locker.stats();
    assert_eq!(waiting.fs_waiters, 1, "only the head waits on the disk");
    assert!(
        waiting.fs_attempts < 50,
        "{} disk attempts while 1000 tasks waited",
        waiting.fs_attempts
    );
    drop(outside);
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        counts.lock().unwrap().iter().all(|&c| c == 1),
        "every task got the lock exactly once"
    );
    let stats = locker.stats();
    assert_eq!(stats.acquisitions, 1000);
    assert_eq!(stats.fs_waiters_max, 1, "never more than one disk waiter");
    assert_eq!(stats.fs_waiters, 0);
    assert!(stats.handoffs >= 900, "{stats:?}");
    assert!(stats.fs_attempts < 150, "{stats:?}");
    assert!(
        std::fs::read_dir(dir.path())
            .unwrap()
            .all(|e| e.unwrap().file_name() == LINE_FILE),
        "nothing left on disk"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_thousand_waiters_cost_one_disk_waiter_current_thread() {
    thousand_waiters_one_disk_waiter().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_waiters_cost_one_disk_waiter_multi_thread() {
    thousand_waiters_one_disk_waiter().await;
}

async fn names_are_independent() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    let other = self::locker(dir.path());
    let _a_elsewhere = other.acquire("a").await.unwrap();
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.acquire("a").await.map(drop) })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let b = tokio::time::timeout(Duration::from_secs(2), locker.acquire("b"))
        .await
        .expect("b does not wait for a")
        .unwrap();
    drop(b);
    assert!(!waiter.is_finished());
    waiter.abort();
}

#[tokio::test(flavor = "current_thread")]
async fn waiters_on_different_names_do_not_wait_for_each_other_current_thread() {
    names_are_independent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_different_names_do_not_wait_for_each_other_multi_thread() {
    names_are_independent().await;
}

async fn handoff_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    let counter = Arc::new(Mutex::new(0u64));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (locker, counter) = (locker.clone(), Arc::clone(&counter));
            tokio::spawn(async move {
                for _ in 0..200 {
                    let guard = locker.acquire("rmw").await.unwrap();
                    let v = *counter.lock().unwrap();
                    tokio::task::yield_now().await;
                    *counter.lock().unwrap() = v + 1;
                    drop(guard);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*counter.lock().unwrap(), 1600);
    assert!(!locker.is_held("rmw").await.unwrap());
    assert!(locker.try_acquire("rmw").await.unwrap().is_some());
}

#[tokio::test(flavor = "current_thread")]
async fn tasks_exclude_each_other_current_thread() {
    handoff_round_trip().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_exclude_each_other_multi_thread() {
    handoff_round_trip().await;
}

#[tokio::test]
async fn try_acquire_never_waits_behind_local_holders() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    let held = locker.acquire("x").await.unwrap();
    let attempts = locker.stats().fs_attempts;
    assert!(locker.try_acquire("x").await.unwrap().is_none());
    assert_eq!(locker.stats().fs_attempts, attempts, "answered without the disk");
    drop(held);
    assert!(locker.try_acquire("x").await.unwrap().is_some());
}

/// Spawns a task that acquires `name`, records `id` in `order` and
/// releases, and waits until it has joined the queue.
async fn queued(
    locker: &Locker,
    name: &'static str,
    id: u32,
    order: &Arc<Mutex<Vec<u32>>>,
) -> tokio::task::JoinHandle<()> {
    let (locker, order) = (locker.clone(), Arc::clone(order));
    let task = tokio::spawn(async move {
        let guard = locker.acquire(name).await.unwrap();
        order.lock().unwrap().push(id);
        drop(guard);
    });
    // On a current-thread runtime one yield runs the new task to its wait.
    tokio::task::yield_now().await;
    task
}

#[tokio::test(flavor = "current_thread")]
async fn a_waiter_that_leaves_the_middle_of_the_queue_keeps_the_order() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    let held = locker.acquire("q").await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for id in 0..6 {
        tasks.push(queued(&locker, "q", id, &order).await);
    }
    // Leave from the middle, the back and the front.
    for id in [2, 5, 0] {
        tasks[id].abort();
    }
    tokio::task::yield_now().await;
    drop(held);
    for task in tasks {
        let _ = task.await;
    }
    assert_eq!(*order.lock().unwrap(), vec![1, 3, 4]);
    assert!(!locker.is_held("q").await.unwrap());
}

#[tokio::test(flavor = "current_thread")]
async fn a_waiter_dropped_after_its_turn_came_passes_the_lock_on() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    // Retried on a fresh name when the machine was too slow to drop the
    // guard within the handoff window of taking it (seen under Wine with
    // other tests running): the lock then goes back to the store, and the
    // handoff under test does not happen. Until a round drops it within
    // the window, or 10 s pass.
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    for round in 0.. {
        let name: &'static str = Box::leak(format!("q{round}").into_boxed_str());
        let before = locker.stats().handoffs;
        let held = locker.acquire(name).await.unwrap();
        let taken = std::time::Instant::now();
        let order = Arc::new(Mutex::new(Vec::new()));
        let first = queued(&locker, name, 1, &order).await;
        let second = queued(&locker, name, 2, &order).await;
        // The release hands the lock to the first waiter at once; it is
        // aborted before it runs to take it.
        drop(held);
        let within_window = taken.elapsed() < Duration::from_millis(8);
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        tokio::time::timeout(Duration::from_secs(10), second)
            .await
            .expect("the second waiter got the lock")
            .unwrap();
        assert_eq!(*order.lock().unwrap(), vec![2]);
        if within_window {
            assert_eq!(
                locker.stats().handoffs - before,
                1,
                "handed over, not released to disk"
            );
            return;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "never dropped the guard within the handoff window ({} rounds in 10 s)",
            round + 1
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_queued_waiter_times_out_without_disturbing_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    let held = locker.acquire("q").await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let before = queued(&locker, "q", 1, &order).await;
    let err = locker
        .acquire_timeout("q", Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    let after = queued(&locker, "q", 2, &order).await;
    drop(held);
    before.await.unwrap();
    after.await.unwrap();
    assert_eq!(*order.lock().unwrap(), vec![1, 2]);
    assert_eq!(locker.stats().timeouts, 1);
}

/// What a queued task carries is what ten thousand of them cost; the
/// benchmark `waiters` measures the whole task (BENCHMARKS.md).
#[tokio::test]
async fn an_acquire_future_is_small_and_does_not_borrow_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    let acquire = {
        let name = String::from("short-lived");
        locker.acquire(&name)
    };
    assert!(
        std::mem::size_of_val(&acquire) <= 128,
        "acquire future is {} bytes",
        std::mem::size_of_val(&acquire)
    );
    let timed = locker.acquire_timeout("other", Duration::from_secs(1));
    assert!(std::mem::size_of_val(&timed) <= 128);
    // Both can be spawned, and shared by reference across threads.
    fn send_and_sync<T: Send + Sync>(_: &T) {}
    send_and_sync(&acquire);
    send_and_sync(&timed);
    drop(timed);
    let guard = acquire.await.unwrap();
    assert_eq!(guard.name(), "short-lived");
}
