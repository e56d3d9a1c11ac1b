//! The behaviour every backend shares, written once against the public
//! API and instantiated per backend (both file strategies in
//! `conformance.rs`, PostgreSQL in `postgres.rs`).
//!
//! `$setup` is an expression giving `(keep_alive, LockerBuilder)`: the
//! first keeps the backend (a directory, a server) alive for the test.
//! `upgradable_refused` is an expression giving `Option<&str>`: `None`
//! where the backend keeps upgradable locks, or a word of the
//! `Error::Unsupported` it refuses them with (docs/upgradable.md); each
//! upgradable test asserts that refusal there instead.

#[macro_export]
macro_rules! api_conformance {
    ($module:ident, $setup:expr, upgradable_refused = $refused:expr) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            use std::sync::Arc;
            use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
            use std::time::{Duration, Instant};

            use leasehold::{Error, Locker};

            fn quick(builder: &leasehold::LockerBuilder) -> Locker {
                builder
                    .clone()
                    .lease(Duration::from_millis(400))
                    .renew_interval(Duration::from_millis(100))
                    .poll_interval(Duration::from_millis(20))
                    .fencing(true)
                    .build()
                    .unwrap()
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn api_acquire_show_and_release() {
                let (_keep, builder) = $setup;
                let (a, b) = (quick(&builder), quick(&builder));
                let guard = a.acquire("job").await.unwrap();
                let owner = b.holder("job").await.unwrap().expect("held");
                assert_eq!(owner.pid(), Some(std::process::id()));
                assert_eq!(owner.fencing_token(), guard.fencing_token());
                assert!(b.is_held("job").await.unwrap());
                assert!(b.list().await.unwrap().iter().any(|l| l.name() == "job"));
                assert!(b.try_acquire("job").await.unwrap().is_none());
                guard.ensure_held().await.unwrap();
                drop(guard);
                let deadline = Instant::now() + Duration::from_secs(2);
                let again = loop {
                    if let Some(g) = b.try_acquire("job").await.unwrap() {
                        break g;
                    }
                    assert!(Instant::now() < deadline, "not free after drop");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                };
                again.release().await.unwrap();
                assert!(!a.is_held("job").await.unwrap());
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn api_a_holder_keeps_its_lock_for_five_leases() {
                let (_keep, builder) = $setup;
                let (holder, rival) = (quick(&builder), quick(&builder));
                let guard = holder.acquire("long").await.unwrap();
                let started = Instant::now();
                while started.elapsed() < Duration::from_millis(2000) {
                    assert!(rival.try_acquire("long").await.unwrap().is_none(), "robbed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                assert!(!guard.is_lost());
                guard.ensure_held().await.unwrap();
                assert!(holder.stats().renewals >= 10);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn api_two_lockers_exclude_each_other_and_tokens_grow() {
                let (_keep, builder) = $setup;
                let lockers = [quick(&builder), quick(&builder)];
                let inside = Arc::new(AtomicBool::new(false));
                let count = Arc::new(AtomicU32::new(0));
                let last_token = Arc::new(std::sync::Mutex::new(0u64));
                let mut tasks = Vec::new();
                for locker in &lockers {
                    for _ in 0..4 {
                        let (locker, inside, count, last) = (
                            locker.clone(),
                            Arc::clone(&inside),
                            Arc::clone(&count),
                            Arc::clone(&last_token),
                        );
                        tasks.push(tokio::spawn(async move {
                            for _ in 0..25 {
                                let guard = locker.acquire("shared").await.unwrap();
                                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                                let token = guard.fencing_token().unwrap();
                                {
                                    let mut previous = last.lock().unwrap();
                                    assert!(token > *previous, "token {token} after {}", *previous);
                                    *previous = token;
                                }
                                count.fetch_add(1, Ordering::SeqCst);
                                tokio::task::yield_now().await;
                                inside.store(false, Ordering::SeqCst);
                                drop(guard);
                            }
                        }));
                    }
                }
                for t in tasks {
                    t.await.unwrap();
                }
                assert_eq!(count.load(Ordering::SeqCst), 200);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn api_timeouts_scopes_and_bad_names() {
                let (_keep, builder) = $setup;
                let (a, b) = (quick(&builder), quick(&builder));
                let _held = a.acquire("busy").await.unwrap();
                match b.acquire_timeout("busy", Duration::from_millis(100)).await {
                    Err(Error::Timeout { name, .. }) => assert_eq!(name, "busy"),
                    other => panic!("{other:?}"),
                }
                for bad in ["", "nul\0inside"] {
                    assert!(matches!(
                        a.acquire(bad).await,
                        Err(Error::InvalidName { .. })
                    ));
                }
                a.scope(async {
                    let outer = a.acquire("nested").await.unwrap();
                    let inner = a.try_acquire("nested").await.unwrap().expect("re-entrant");
                    drop(outer);
                    assert!(b.try_acquire("nested").await.unwrap().is_none());
                    drop(inner);
                })
                .await;
                let deadline = Instant::now() + Duration::from_secs(2);
                while b.try_acquire("nested").await.unwrap().is_none() {
                    assert!(
                        Instant::now() < deadline,
                        "not released by the last re-entrant guard"
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                assert_eq!(b.stats().timeouts, 1);
            }

            /// `ready` returns `Some` within two seconds (a release on a
            /// server is seen a round trip later).
            async fn eventually<T, F, Fut>(mut ready: F, what: &str) -> T
            where
                F: FnMut() -> Fut,
                Fut: std::future::Future<Output = Option<T>>,
            {
                let deadline = Instant::now() + Duration::from_secs(2);
                loop {
                    if let Some(value) = ready().await {
                        return value;
                    }
                    assert!(Instant::now() < deadline, "{what}");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn api_readers_overlap_and_exclude_a_writer() {
                let (_keep, builder) = $setup;
                let (a, b) = (quick(&builder), quick(&builder));
                let r1 = a.acquire_shared("catalog").await.unwrap();
                let r2 = b.acquire_shared("catalog").await.unwrap();
                assert!(r1.is_shared() && r2.is_shared());
                assert!(a.try_acquire("catalog").await.unwrap().is_none());
                assert!(b.try_acquire("catalog").await.unwrap().is_none());
                let holders = b.holders("catalog").await.unwrap();
                assert_eq!(holders.len(), 2, "{holders:?}");
                let info = b
                    .list()
                    .await
                    .unwrap()
                    .into_iter()
                    .find(|l| l.name() == "catalog");
                assert_eq!(info.expect("listed").kind(), leasehold::LockKind::Shared);
                drop(r1);
                assert!(
                    b.try_acquire("catalog").await.unwrap().is_none(),
                    "one reader is left"
                );
                drop(r2);
                let w = eventually(
                    || async { b.try_acquire("catalog").await.unwrap() },
                    "free after the readers",
                )
                .await;
                assert!(!w.is_shared());
                assert!(a.try_acquire_shared("catalog").await.unwrap().is_none());
                match a
                    .acquire_shared_timeout("catalog", Duration::from_millis(100))
                    .await
                {
                    Err(Error::Timeout { .. }) => {}
                    other => panic!("{other:?}"),
                }
                drop(w);
                let again = eventually(
                    || async { a.try_acquire_shared("catalog").await.unwrap() },
                    "free after the writer",
                )
                .await;
                assert!(again.is_shared());
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn api_a_waiting_writer_holds_back_new_readers() {
                let (_keep, builder) = $setup;
                let (a, b, c) = (quick(&builder), quick(&builder), quick(&builder));
                let reader = a.acquire_shared("catalog").await.unwrap();
                let writer = tokio::spawn({
                    let b = b.clone();
                    async move { b.acquire("catalog").await.unwrap() }
                });
                tokio::time::sleep(Duration::from_millis(300)).await;
                assert!(
                    c.try_acquire_shared("catalog").await.unwrap().is_none(),
                    "a reader overtook the writer"
                );
                let late = tokio::spawn({
                    let c = c.clone();
                    async move { c.acquire_shared("catalog").await.unwrap() }
                });
                tokio::time::sleep(Duration::from_millis(100)).await;
                assert!(!late.is_finished(), "a reader overtook the writer");
                drop(reader);
                let w = tokio::time::timeout(Duration::from_secs(5), writer)
                    .await
                    .expect("writer starved")
                    .unwrap();
                assert!(!late.is_finished(), "a reader ran with the writer");
                drop(w);
                let r = tokio::time::timeout(Duration::from_secs(5), late)
                    .await
                    .expect("reader stuck")
                    .unwrap();
                assert!(r.is_shared());
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn api_a_semaphore_never_exceeds_its_permits() {
                let (_keep, builder) = $setup;
                let lockers = [quick(&builder), quick(&builder)];
                let inside = Arc::new(AtomicU32::new(0));
                let most = Arc::new(AtomicU32::new(0));
                let mut tasks = Vec::new();
                for locker in &lockers {
                    let gpu = locker.semaphore("gpu", 2).unwrap();
                    for _ in 0..3 {
                        let (gpu, inside, most) = (gpu.clone(), inside.clone(), most.clone());
                        tasks.push(tokio::spawn(async move {
                            for _ in 0..5 {
                                let permit = gpu.acquire().await.unwrap();
                                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                                most.fetch_max(now, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(5)).await;
                                inside.fetch_sub(1, Ordering::SeqCst);
                                drop(permit);
                            }
                        }));
                    }
                }
                for t in tasks {
                    t.await.unwrap();
                }
                let most = most.load(Ordering::SeqCst);
                assert!(most <= 2, "{most} holders of a 2-permit semaphore");
                assert_eq!(
                    lockers[0].stats().permit_acquisitions + lockers[1].stats().permit_acquisitions,
                    30
                );
                // The count is the name's while anyone holds a permit.
                let one = lockers[0].semaphore("slots", 1).unwrap();
                let held = one.acquire().await.unwrap();
                assert!(one.try_acquire().await.unwrap().is_none());
                match one.acquire_timeout(Duration::from_millis(50)).await {
                    Err(Error::Timeout { .. }) => {}
                    other => panic!("{other:?}"),
                }
                let three = lockers[1].semaphore("slots", 3).unwrap();
                assert!(matches!(
                    three.try_acquire().await,
                    Err(Error::KindMismatch { .. })
                ));
                assert!(lockers[1].try_acquire("slots").await.unwrap().is_none());
                assert!(lockers[0].semaphore("slots", 0).is_err());
                drop(held);
            }

            /// Whether this backend keeps upgradable locks. Where it
            /// refuses them, asserts the refusal instead: every form of
            /// the acquisition fails with `Error::Unsupported` naming why,
            /// and leaves `name` free for every other kind of lock.
            async fn upgradable_kept(locker: &Locker, name: &str) -> bool {
                let refused: Option<&str> = $refused;
                let Some(why) = refused else {
                    return true;
                };
                let attempts = [
                    locker.acquire_upgradable(name).await.map(drop),
                    locker.try_acquire_upgradable(name).await.map(drop),
                    locker
                        .acquire_upgradable_timeout(name, Duration::from_millis(100))
                        .await
                        .map(drop),
                ];
                for attempt in attempts {
                    match attempt {
                        Err(Error::Unsupported { what }) => {
                            assert!(what.contains(why), "refused for another reason: {what}")
                        }
                        other => panic!("not refused ({why}): {other:?}"),
                    }
                }
                let shared = locker.try_acquire_shared(name).await.unwrap();
                assert!(shared.is_some(), "a refusal left {name} held");
                drop(shared);
                let writer = eventually(
                    || async { locker.try_acquire(name).await.unwrap() },
                    "a refusal left the name held",
                )
                .await;
                writer.release().await.unwrap();
                false
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn api_one_upgradable_holder_beside_readers_without_writers() {
                let (_keep, builder) = $setup;
                let (a, b, c) = (quick(&builder), quick(&builder), quick(&builder));
                if !upgradable_kept(&a, "doc").await {
                    return;
                }
                let up = a.acquire_upgradable("doc").await.unwrap();
                assert!(up.guard().is_shared());
                assert_eq!(up.guard().name(), "doc");
                assert!(up.guard().fencing_token().is_some(), "fencing is on");
                // At most one upgradable holder, whichever Locker asks.
                assert!(a.try_acquire_upgradable("doc").await.unwrap().is_none());
                assert!(b.try_acquire_upgradable("doc").await.unwrap().is_none());
                match b
                    .acquire_upgradable_timeout("doc", Duration::from_millis(100))
                    .await
                {
                    Err(Error::Timeout { name, .. }) => assert_eq!(name, "doc"),
                    other => panic!("{other:?}"),
                }
                // Readers of every Locker, its own included, join beside it.
                let ra = a
                    .try_acquire_shared("doc")
                    .await
                    .unwrap()
                    .expect("a reader of the same Locker");
                let rb = b
                    .try_acquire_shared("doc")
                    .await
                    .unwrap()
                    .expect("a reader of another Locker");
                let rc = c.acquire_shared("doc").await.unwrap();
                let holders = b.holders("doc").await.unwrap();
                assert_eq!(holders.len(), 4, "{holders:?}");
                // Writers do not.
                assert!(a.try_acquire("doc").await.unwrap().is_none());
                assert!(b.try_acquire("doc").await.unwrap().is_none());
                match b.acquire_timeout("doc", Duration::from_millis(100)).await {
                    Err(Error::Timeout { name, .. }) => assert_eq!(name, "doc"),
                    other => panic!("{other:?}"),
                }
                let writer = tokio::spawn({
                    let b = b.clone();
                    async move { b.acquire("doc").await.unwrap() }
                });
                tokio::time::sleep(Duration::from_millis(200)).await;
                assert!(!writer.is_finished(), "a writer got in beside the readers");
                drop((ra, rb, rc));
                tokio::time::sleep(Duration::from_millis(200)).await;
                assert!(
                    !writer.is_finished(),
                    "a writer got in beside the upgradable holder"
                );
                drop(up);
                let w = tokio::time::timeout(Duration::from_secs(5), writer)
                    .await
                    .expect("the writer never got in after the upgradable holder left")
                    .unwrap();
                // An upgradable holder is a reader: none while a writer holds.
                assert!(a.try_acquire_upgradable("doc").await.unwrap().is_none());
                drop(w);
                let again = eventually(
                    || async { c.try_acquire_upgradable("doc").await.unwrap() },
                    "the upgradable place is free after the writer",
                )
                .await;
                assert!(again.guard().is_shared());
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn api_an_upgrade_waits_for_readers_then_excludes_everyone() {
                let (_keep, builder) = $setup;
                let (a, b, c) = (quick(&builder), quick(&builder), quick(&builder));
                if !upgradable_kept(&a, "doc").await {
                    return;
                }
                let up = a.acquire_upgradable("doc").await.unwrap();
                let shared_token = up.guard().fencing_token().unwrap();
                let reader = b.acquire_shared("doc").await.unwrap();
                let upgrading = tokio::spawn(up.upgrade());
                tokio::time::sleep(Duration::from_millis(300)).await;
                assert!(
                    !upgrading.is_finished(),
                    "the upgrade did not wait for the reader"
                );
                // A waiting upgrade holds new readers back, as a writer does.
                assert!(
                    c.try_acquire_shared("doc").await.unwrap().is_none(),
                    "a reader overtook the upgrade"
                );
                assert!(c.try_acquire("doc").await.unwrap().is_none());
                drop(reader);
                let exclusive = tokio::time::timeout(Duration::from_secs(5), upgrading)
                    .await
                    .expect("the upgrade never ended after the reader left")
                    .unwrap()
                    .unwrap();
                assert!(!exclusive.is_shared());
                assert!(!exclusive.is_lost());
                exclusive.ensure_held().await.unwrap();
                let token = exclusive.fencing_token().unwrap();
                assert!(token > shared_token, "token {token} after {shared_token}");
                let owner = c.holder("doc").await.unwrap().expect("held");
                assert_eq!(owner.fencing_token(), Some(token));
                // Exclusive: no reader, writer or upgradable holder of any
                // Locker, its own included.
                for other in [&a, &b, &c] {
                    assert!(other.try_acquire_shared("doc").await.unwrap().is_none());
                    assert!(other.try_acquire("doc").await.unwrap().is_none());
                    assert!(other.try_acquire_upgradable("doc").await.unwrap().is_none());
                }
                match b
                    .acquire_shared_timeout("doc", Duration::from_millis(100))
                    .await
                {
                    Err(Error::Timeout { .. }) => {}
                    other => panic!("{other:?}"),
                }
                let writer = tokio::spawn({
                    let c = c.clone();
                    async move { c.acquire("doc").await.unwrap() }
                });
                tokio::time::sleep(Duration::from_millis(200)).await;
                assert!(
                    !writer.is_finished(),
                    "a writer got in beside the upgraded holder"
                );
                exclusive.release().await.unwrap();
                let w = tokio::time::timeout(Duration::from_secs(5), writer)
                    .await
                    .expect("the writer never got in after the release")
                    .unwrap();
                assert!(w.fencing_token().unwrap() > token);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn api_a_downgrade_lets_readers_in_and_keeps_the_upgradable_place() {
                let (_keep, builder) = $setup;
                let (a, b, c) = (quick(&builder), quick(&builder), quick(&builder));
                if !upgradable_kept(&a, "doc").await {
                    return;
                }
                let exclusive = a
                    .acquire_upgradable("doc")
                    .await
                    .unwrap()
                    .upgrade()
                    .await
                    .unwrap();
                let token = exclusive.fencing_token().unwrap();
                assert!(b.try_acquire_shared("doc").await.unwrap().is_none());
                let up = exclusive.downgrade().await.unwrap();
                assert!(up.guard().is_shared());
                // A reader's token is the counter as it stands: no less
                // than the writer's before it (docs/format.md, *Fencing*).
                assert!(up.guard().fencing_token().unwrap() >= token);
                let reader = eventually(
                    || async { b.try_acquire_shared("doc").await.unwrap() },
                    "no reader got in after the downgrade",
                )
                .await;
                // Still the one upgradable holder, still no writer.
                assert!(b.try_acquire_upgradable("doc").await.unwrap().is_none());
                assert!(a.try_acquire_upgradable("doc").await.unwrap().is_none());
                assert!(b.try_acquire("doc").await.unwrap().is_none());
                let writer = tokio::spawn({
                    let c = c.clone();
                    async move { c.acquire("doc").await.unwrap() }
                });
                tokio::time::sleep(Duration::from_millis(200)).await;
                assert!(!writer.is_finished(), "a writer got in after the downgrade");
                drop(reader);
                // Up again, before the waiting writer.
                let exclusive = tokio::time::timeout(Duration::from_secs(5), up.upgrade())
                    .await
                    .expect("the second upgrade never ended")
                    .unwrap();
                assert!(!writer.is_finished(), "a writer got in between");
                assert!(b.try_acquire_shared("doc").await.unwrap().is_none());
                drop(exclusive);
                let w = tokio::time::timeout(Duration::from_secs(5), writer)
                    .await
                    .expect("the writer never got in")
                    .unwrap();
                // Only a guard from an upgrade is downgraded; the one
                // refused is consumed, its lock released.
                match w.downgrade().await {
                    Err(Error::Unsupported { .. }) => {}
                    other => panic!("{other:?}"),
                }
                let again = eventually(
                    || async { b.try_acquire("doc").await.unwrap() },
                    "a refused downgrade left the lock held",
                )
                .await;
                drop(again);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn api_dropping_an_upgradable_or_upgraded_guard_frees_the_name() {
                let (_keep, builder) = $setup;
                let (a, b) = (quick(&builder), quick(&builder));
                if !upgradable_kept(&a, "doc").await {
                    return;
                }
                // An upgradable guard, an upgraded one, a downgraded one:
                // each drop frees the name for a writer of another Locker
                // and for the next upgradable holder.
                for stage in ["upgradable", "upgraded", "downgraded"] {
                    let up = a.acquire_upgradable("doc").await.unwrap();
                    match stage {
                        "upgradable" => drop(up),
                        "upgraded" => drop(up.upgrade().await.unwrap()),
                        _ => drop(up.upgrade().await.unwrap().downgrade().await.unwrap()),
                    }
                    let w = eventually(
                        || async { b.try_acquire("doc").await.unwrap() },
                        "not free after the drop",
                    )
                    .await;
                    drop(w);
                    let next = eventually(
                        || async { b.try_acquire_upgradable("doc").await.unwrap() },
                        "the upgradable place is not free after the drop",
                    )
                    .await;
                    drop(next);
                    eventually(
                        || async { (!a.is_held("doc").await.unwrap()).then_some(()) },
                        "still held",
                    )
                    .await;
                    assert!(b.holder("doc").await.unwrap().is_none(), "{stage}");
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn api_a_cancelled_upgrade_releases_the_upgradable_holding() {
                let (_keep, builder) = $setup;
                let (a, b, c) = (quick(&builder), quick(&builder), quick(&builder));
                if !upgradable_kept(&a, "doc").await {
                    return;
                }
                let up = a.acquire_upgradable("doc").await.unwrap();
                let reader = b.acquire_shared("doc").await.unwrap();
                // `upgrade` is not cancel safe: dropping its future, here
                // while it waits for the reader, releases the holding.
                let cancelled = tokio::time::timeout(Duration::from_millis(300), up.upgrade()).await;
                assert!(
                    cancelled.is_err(),
                    "the upgrade did not wait for the reader"
                );
                // Its announcement goes with it: readers join again.
                let second = eventually(
                    || async { c.try_acquire_shared("doc").await.unwrap() },
                    "a cancelled upgrade still holds readers back",
                )
                .await;
                // The upgradable place is free: another Locker takes it.
                let next = eventually(
                    || async { c.try_acquire_upgradable("doc").await.unwrap() },
                    "a cancelled upgrade kept the upgradable place",
                )
                .await;
                drop((reader, second, next));
                // And nothing of it is left: a writer gets in.
                let w = eventually(
                    || async { b.try_acquire("doc").await.unwrap() },
                    "a cancelled upgrade left the name held",
                )
                .await;
                drop(w);
                // A cancelled wait for the upgradable place takes nothing
                // (cancel safe): the next holder gets it once the first goes.
                let first = a.acquire_upgradable("doc").await.unwrap();
                let waited =
                    tokio::time::timeout(Duration::from_millis(200), b.acquire_upgradable("doc")).await;
                assert!(waited.is_err(), "a second upgradable holder got in");
                drop(first);
                let next = eventually(
                    || async { c.try_acquire_upgradable("doc").await.unwrap() },
                    "a cancelled wait took the upgradable place",
                )
                .await;
                drop(next);
            }
        }
    };
}
