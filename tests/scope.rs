//! Task-local re-entrancy.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::SeqCst;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use leasehold::{Error, Locker};

async fn lockers() -> (tempfile::TempDir, Locker, Locker) {
    let dir = tempfile::tempdir().unwrap();
    let a = Locker::new(dir.path()).unwrap();
    let b = Locker::new(dir.path()).unwrap();
    (dir, a, b)
}

#[tokio::test]
async fn three_levels_deep_released_in_any_order() {
    let (_dir, locker, rival) = lockers().await;
    // Every order of dropping three guards.
    let orders = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]];
    for order in orders {
        locker
            .scope(async {
                let outer = locker.acquire("ledger").await.unwrap();
                // A re-entry of the outer scope's hold, so the outer scope
                // still sees it after the guard leaves the inner scope (a
                // name first taken in an inner scope would not be: see
                // `a_guard_returned_from_an_inner_scope_is_not_seen_by_the_outer_one`).
                let middle = locker
                    .scope(async { locker.acquire("ledger").await.unwrap() })
                    .await;
                let inner = locker.try_acquire("ledger").await.unwrap().expect("re-entrant");
                let mut guards = [Some(outer), Some(middle), Some(inner)];
                for (n, i) in order.iter().enumerate() {
                    assert!(
                        rival.try_acquire("ledger").await.unwrap().is_none(),
                        "{order:?}: free too early"
                    );
                    guards[*i].take();
                    if n < 2 {
                        assert!(locker.is_held("ledger").await.unwrap());
                    }
                }
                assert!(
                    !locker.is_held("ledger").await.unwrap(),
                    "{order:?}: not freed by the last guard"
                );
            })
            .await;
    }
    let stats = locker.stats();
    assert_eq!(stats.acquisitions, 6);
    assert_eq!(stats.reentrant, 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_spawned_in_a_scope_is_not_in_it() {
    let (_dir, locker, _) = lockers().await;
    locker
        .scope(async {
            let _held = locker.acquire("ledger").await.unwrap();
            let l = locker.clone();
            let spawned = tokio::spawn(async move {
                let waited = l.acquire_timeout("ledger", Duration::from_millis(100)).await;
                let tried = l.try_acquire("ledger").await.unwrap();
                (waited.map(drop), tried.is_none())
            });
            let (waited, tried_none) = spawned.await.unwrap();
            assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
            assert!(tried_none);
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_in_another_task_updates_its_scope() {
    let (_dir, locker, rival) = lockers().await;
    locker
        .scope(async {
            let a = locker.acquire("ledger").await.unwrap();
            let b = locker.acquire("ledger").await.unwrap();
            drop(a);
            tokio::spawn(async move { drop(b) }).await.unwrap();
            assert!(!locker.is_held("ledger").await.unwrap());
            // The scope no longer holds it: this is a fresh acquisition.
            let before = locker.stats().acquisitions;
            let c = locker.acquire("ledger").await.unwrap();
            assert_eq!(locker.stats().acquisitions, before + 1);
            assert!(rival.try_acquire("ledger").await.unwrap().is_none());
            let moved = tokio::spawn(async move { c.release().await });
            moved.await.unwrap().unwrap();
            assert!(rival.try_acquire("ledger").await.unwrap().is_some());
        })
        .await;
}

#[tokio::test]
async fn outside_a_scope_a_second_acquire_waits() {
    let (_dir, locker, _) = lockers().await;
    let _held = locker.acquire("ledger").await.unwrap();
    let err = locker
        .acquire_timeout("ledger", Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    // Another Locker's scope does not make this one re-entrant either.
    let other = Locker::new(locker.directory()).unwrap();
    other
        .scope(async {
            assert!(other.try_acquire("ledger").await.unwrap().is_none());
        })
        .await;
}

#[tokio::test]
async fn release_of_a_reentrant_guard_keeps_the_lock() {
    let (_dir, locker, rival) = lockers().await;
    locker
        .scope(async {
            let outer = locker.acquire("ledger").await.unwrap();
            let inner = locker.acquire("ledger").await.unwrap();
            inner.release().await.unwrap();
            assert!(rival.try_acquire("ledger").await.unwrap().is_none());
            outer.release().await.unwrap();
            assert!(rival.try_acquire("ledger").await.unwrap().is_some());
        })
        .await;
}

/// Counts the flows inside a critical section, and the most ever at once.
#[derive(Default)]
struct Section {
    inside: AtomicUsize,
    most: AtomicUsize,
}

impl Section {
    /// One pass through the critical section, yielding inside it so that
    /// any other flow that may enter does so meanwhile.
    async fn pass(&self) {
        let now = self.inside.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        self.inside.fetch_sub(1, SeqCst);
    }

    fn most(&self) -> usize {
        self.most.load(SeqCst)
    }
}

const ROUNDS: usize = 100;

/// A flow that takes "ledger" `ROUNDS` times and passes through `section`
/// each time, with some work outside between rounds (a flow that asked
/// again at once would only ever queue behind the other's handoff).
async fn worker(locker: &Locker, section: &Section) {
    for round in 0..ROUNDS {
        let guard = locker.acquire("ledger").await.unwrap();
        section.pass().await;
        drop(guard);
        for _ in 0..round % 3 {
            tokio::task::yield_now().await;
        }
    }
}

/// Polls `fut` once: `Some` if it finished without waiting.
fn at_once<F: Future>(fut: F) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => Some(out),
        Poll::Pending => None,
    }
}

/// Runs `flows` concurrently in the calling task, as `FuturesUnordered` or
/// `join_all` would.
async fn join_all(flows: Vec<Pin<Box<dyn Future<Output = ()> + '_>>>) {
    let mut flows: Vec<_> = flows.into_iter().map(Some).collect();
    std::future::poll_fn(|cx| {
        for slot in &mut flows {
            if let Some(flow) = slot
                && flow.as_mut().poll(cx).is_ready()
            {
                *slot = None;
            }
        }
        if flows.iter().all(Option::is_none) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}

/// Waits until `rival` gets "ledger": a cancelled attempt may still be
/// removing what it created.
async fn freed(rival: &Locker) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while rival.try_acquire("ledger").await.unwrap().is_none() {
        assert!(tokio::time::Instant::now() < deadline, "never freed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn joined_branches_in_their_own_scopes_never_overlap() {
    let (_dir, locker, rival) = lockers().await;
    let section = Section::default();
    locker
        .scope(async {
            tokio::join!(
                locker.scope(worker(&locker, &section)),
                locker.scope(worker(&locker, &section)),
            );
        })
        .await;
    assert_eq!(section.most(), 1, "two branches were inside at once");
    assert_eq!(locker.stats().reentrant, 0);
    freed(&rival).await;
}

#[tokio::test]
async fn eight_branches_in_their_own_scopes_never_overlap() {
    let (_dir, locker, rival) = lockers().await;
    let section = Section::default();
    locker
        .scope(async {
            let flows = (0..8)
                .map(|_| {
                    Box::pin(locker.scope(worker(&locker, &section))) as Pin<Box<dyn Future<Output = ()>>>
                })
                .collect();
            join_all(flows).await;
        })
        .await;
    assert_eq!(section.most(), 1, "two branches were inside at once");
    assert_eq!(locker.stats().acquisitions, 8 * ROUNDS as u64);
    freed(&rival).await;
}

#[tokio::test]
async fn select_arms_in_their_own_scopes_never_overlap() {
    let (_dir, locker, rival) = lockers().await;
    let section = Section::default();
    let forever = async {
        loop {
            worker(&locker, &section).await;
        }
    };
    locker
        .scope(async {
            tokio::select! {
                () = locker.scope(worker(&locker, &section)) => {}
                () = locker.scope(forever) => unreachable!(),
            }
        })
        .await;
    assert_eq!(section.most(), 1, "two arms were inside at once");
    // The losing arm was dropped holding the lock or waiting for it.
    freed(&rival).await;
}

#[tokio::test]
async fn a_scope_does_not_see_what_an_unscoped_sibling_takes_after_it_started() {
    let (_dir, locker, _) = lockers().await;
    let section = Section::default();
    locker
        .scope(async {
            tokio::join!(locker.scope(worker(&locker, &section)), async {
                // Not before the scoped branch has started.
                tokio::task::yield_now().await;
                worker(&locker, &section).await;
            });
        })
        .await;
    assert_eq!(section.most(), 1, "the branches were inside at once");
    assert_eq!(locker.stats().reentrant, 0);
}

#[tokio::test]
async fn unscoped_branches_outside_any_scope_exclude_each_other() {
    let (_dir, locker, _) = lockers().await;
    let section = Section::default();
    tokio::join!(worker(&locker, &section), worker(&locker, &section));
    assert_eq!(section.most(), 1);
    assert_eq!(locker.stats().reentrant, 0);
}

#[tokio::test]
async fn unscoped_branches_in_one_scope_share_its_locks() {
    // The documented hazard: the branches are one flow to the scope.
    let (_dir, locker, rival) = lockers().await;
    let (taken, take) = tokio::sync::oneshot::channel();
    let (done, finish) = tokio::sync::oneshot::channel::<()>();
    locker
        .scope(async {
            let first = async {
                let guard = locker.acquire("ledger").await.unwrap();
                taken.send(()).unwrap();
                finish.await.unwrap();
                drop(guard);
            };
            let second = async {
                take.await.unwrap();
                let guard = at_once(locker.acquire("ledger"))
                    .expect("re-entrant: no wait")
                    .unwrap();
                assert!(rival.try_acquire("ledger").await.unwrap().is_none());
                done.send(()).unwrap();
                tokio::task::yield_now().await;
                // `first` has let go; this branch still holds the lock.
                assert!(rival.try_acquire("ledger").await.unwrap().is_none());
                drop(guard);
            };
            tokio::join!(first, second);
        })
        .await;
    assert_eq!(locker.stats().acquisitions, 1);
    assert_eq!(locker.stats().reentrant, 1);
    assert!(!locker.is_held("ledger").await.unwrap());
}

#[tokio::test]
async fn branches_share_what_their_parent_held_when_they_started() {
    // The other documented hazard: a name the enclosing scope holds is
    // held by every branch below it.
    let (_dir, locker, rival) = lockers().await;
    let section = Section::default();
    locker
        .scope(async {
            let held = locker.acquire("ledger").await.unwrap();
            tokio::join!(
                locker.scope(worker(&locker, &section)),
                locker.scope(worker(&locker, &section)),
            );
            assert!(rival.try_acquire("ledger").await.unwrap().is_none());
            drop(held);
        })
        .await;
    assert_eq!(section.most(), 2);
    assert_eq!(locker.stats().acquisitions, 1);
    assert_eq!(locker.stats().reentrant, 2 * ROUNDS as u64);
    freed(&rival).await;
}

/// What a holder calls: takes "ledger" again, as it would not know its
/// caller holds it, through each of the three ways to acquire.
async fn audit(locker: &Locker, rival: &Locker) {
    let a = at_once(locker.acquire("ledger")).expect("no wait").unwrap();
    let b = at_once(locker.try_acquire("ledger"))
        .expect("no wait")
        .unwrap()
        .expect("re-entrant");
    let c = at_once(locker.acquire_timeout("ledger", Duration::ZERO))
        .expect("no wait")
        .unwrap();
    assert_eq!(a.fencing_token(), c.fencing_token());
    drop((a, b, c));
    assert!(rival.try_acquire("ledger").await.unwrap().is_none());
}

#[tokio::test]
async fn a_function_called_by_the_holder_reenters() {
    let (_dir, locker, rival) = lockers().await;
    locker
        .scope(async {
            let outer = locker.acquire("ledger").await.unwrap();
            // Called as it is, and in a scope of its own.
            audit(&locker, &rival).await;
            locker.scope(audit(&locker, &rival)).await;
            locker.scope(locker.scope(audit(&locker, &rival))).await;
            assert!(rival.try_acquire("ledger").await.unwrap().is_none());
            drop(outer);
            assert!(!locker.is_held("ledger").await.unwrap());
        })
        .await;
    assert_eq!(locker.stats().acquisitions, 1);
    assert_eq!(locker.stats().reentrant, 9);
}

#[tokio::test]
async fn a_guard_returned_from_an_inner_scope_is_not_seen_by_the_outer_one() {
    let (_dir, locker, rival) = lockers().await;
    locker
        .scope(async {
            let taken = locker
                .scope(async { locker.acquire("ledger").await.unwrap() })
                .await;
            assert!(locker.try_acquire("ledger").await.unwrap().is_none());
            let waited = locker.acquire_timeout("ledger", Duration::from_millis(50)).await;
            assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
            // Still held, by the returned guard alone.
            assert!(rival.try_acquire("ledger").await.unwrap().is_none());
            drop(taken);
            assert!(!locker.is_held("ledger").await.unwrap());
            // A fresh acquisition in the outer scope is the outer scope's.
            let fresh = locker.acquire("ledger").await.unwrap();
            let again = locker
                .scope(async { locker.try_acquire("ledger").await.unwrap() })
                .await;
            assert!(again.is_some(), "the inner scope sees the outer one's");
            drop((fresh, again));
        })
        .await;
    assert_eq!(locker.stats().acquisitions, 2);
    assert_eq!(locker.stats().reentrant, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_released_elsewhere_is_never_reentered() {
    let (_dir, locker, rival) = lockers().await;
    locker
        .scope(async {
            let outer = locker.acquire("ledger").await.unwrap();
            locker
                .scope(async {
                    let inner = locker.acquire("ledger").await.unwrap();
                    // Both guards go in another task, while both scopes live.
                    tokio::spawn(async move { drop((outer, inner)) }).await.unwrap();
                    assert!(!locker.is_held("ledger").await.unwrap());
                    let before = locker.stats().acquisitions;
                    let fresh = locker.try_acquire("ledger").await.unwrap().unwrap();
                    assert_eq!(locker.stats().acquisitions, before + 1, "not re-entered");
                    assert!(rival.try_acquire("ledger").await.unwrap().is_none());
                    drop(fresh);
                })
                .await;
            assert!(!locker.is_held("ledger").await.unwrap());
            let before = locker.stats().acquisitions;
            drop(locker.try_acquire("ledger").await.unwrap().unwrap());
            assert_eq!(locker.stats().acquisitions, before + 1, "not re-entered");
        })
        .await;
}
