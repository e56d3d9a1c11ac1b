//! Upgradable shared locks on PostgreSQL, against a throwaway server of
//! each test's own (see `support/pg_server.rs`): one upgradable holder at
//! a time, readers of every `Locker` (its own included) coexisting with
//! it, writers kept out, an upgrade that waits for every reader and lets
//! no writer in, a downgrade, fencing, the loss of the holding's session,
//! and `release_all`. Every wait is bounded.
#![cfg(all(unix, feature = "postgres"))]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use leasehold::{Error, Locker, LossReason};

#[path = "support/pg_server.rs"]
mod pg_server;

#[path = "support/pg_session.rs"]
mod pg_session;

use pg_server::Server;
use pg_session::{Holder, backend_of, quick_builder as builder, terminate, unique};

/// Every wait of these tests ends within this.
const BOUND: Duration = Duration::from_secs(10);

async fn bounded<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {BOUND:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_upgradable_at_a_time_with_readers_and_without_writers() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let name = unique("catalog");

    let up = a.acquire_upgradable(&name).await.unwrap();
    assert!(up.guard().is_shared());
    // One upgradable holder, whichever Locker asks.
    assert!(a.try_acquire_upgradable(&name).await.unwrap().is_none());
    assert!(b.try_acquire_upgradable(&name).await.unwrap().is_none());
    let err = b
        .acquire_upgradable_timeout(&name, Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    // Readers of both Lockers coexist with it.
    let ra = a
        .try_acquire_shared(&name)
        .await
        .unwrap()
        .expect("a reader of the same Locker");
    let rb = b
        .try_acquire_shared(&name)
        .await
        .unwrap()
        .expect("a reader of another Locker");
    // Writers do not.
    assert!(a.try_acquire(&name).await.unwrap().is_none());
    assert!(b.try_acquire(&name).await.unwrap().is_none());
    let holders = b.holders(&name).await.unwrap();
    assert_eq!(
        holders.len(),
        3,
        "the upgradable holder is a shared holder: {holders:?}"
    );
    drop((ra, rb));
    assert!(
        b.try_acquire(&name).await.unwrap().is_none(),
        "still held by the upgradable"
    );

    // Released: the next upgradable holder gets in (the session closes).
    drop(up);
    let next = bounded("the next upgradable holder", b.acquire_upgradable(&name))
        .await
        .unwrap();
    assert!(a.try_acquire_upgradable(&name).await.unwrap().is_none());
    drop(next);
    let writer = bounded("a writer after the upgradable holder", a.acquire(&name))
        .await
        .unwrap();
    // Writers exclude the upgradable holder too.
    assert!(b.try_acquire_upgradable(&name).await.unwrap().is_none());
    drop(writer);
    drop((a, b));
    assert_eq!(
        server.advisory_locks_and_sessions_left(Duration::from_secs(5)),
        Vec::<String>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upgrade_waits_for_every_reader_and_keeps_new_ones_out() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let name = unique("catalog");

    let up = a.acquire_upgradable(&name).await.unwrap();
    let first = up.guard().fencing_token().expect("tokens are always on");
    let ra = a.acquire_shared(&name).await.unwrap();
    let rb = b.acquire_shared(&name).await.unwrap();
    let upgrading = tokio::spawn(async move { up.upgrade().await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!upgrading.is_finished(), "the upgrade waits for both readers");
    // Announced: no new reader joins, of either Locker (writers' preference).
    assert!(a.try_acquire_shared(&name).await.unwrap().is_none());
    assert!(b.try_acquire_shared(&name).await.unwrap().is_none());
    drop(rb);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !upgrading.is_finished(),
        "the reader of its own Locker is still there"
    );
    drop(ra);
    let writer = bounded("the upgrade", upgrading).await.unwrap().unwrap();
    assert!(!writer.is_shared());
    let token = writer.fencing_token().unwrap();
    assert!(token > first, "an upgrade gets a new token: {first} then {token}");
    for locker in [&a, &b] {
        assert!(locker.try_acquire_shared(&name).await.unwrap().is_none());
        assert!(locker.try_acquire(&name).await.unwrap().is_none());
        assert!(locker.try_acquire_upgradable(&name).await.unwrap().is_none());
    }
    let owner = b.holder(&name).await.unwrap().expect("held");
    assert_eq!(owner.fencing_token(), Some(token));
    writer.ensure_held().await.unwrap();
    drop(writer);
    let next = bounded("a writer after the upgraded lock", b.acquire(&name))
        .await
        .unwrap();
    assert!(next.fencing_token().unwrap() > token);
}

/// Writers waiting in every Locker while the upgradable holder upgrades:
/// none of them gets the name between the upgrade and its release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_writer_gets_in_between() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let c = builder(&server).build().unwrap();
    let name = unique("catalog");

    let up = a.acquire_upgradable(&name).await.unwrap();
    let reader = b.acquire_shared(&name).await.unwrap();
    // Set from before the upgrade is asked for until the upgraded lock goes.
    let exclusive_phase = Arc::new(AtomicBool::new(true));
    let mut writers = Vec::new();
    for locker in [&a, &b, &c] {
        let (locker, name, phase) = (locker.clone(), name.clone(), Arc::clone(&exclusive_phase));
        writers.push(tokio::spawn(async move {
            let guard = locker.acquire(&name).await.unwrap();
            assert!(
                !phase.load(Ordering::SeqCst),
                "a writer got in between the upgrade and its release"
            );
            let token = guard.fencing_token().unwrap();
            drop(guard);
            token
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let upgrading = tokio::spawn(async move { up.upgrade().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(reader);
    let writer = bounded("the upgrade", upgrading).await.unwrap().unwrap();
    let token = writer.fencing_token().unwrap();
    // Hold it a while: the writers keep trying meanwhile.
    tokio::time::sleep(Duration::from_millis(600)).await;
    for w in &writers {
        assert!(!w.is_finished(), "no writer while the upgraded lock is held");
    }
    exclusive_phase.store(false, Ordering::SeqCst);
    drop(writer);
    for w in writers {
        let later = bounded("a writer after the release", w).await.unwrap();
        assert!(later > token, "writers come after, with greater tokens");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_lets_readers_in_and_can_be_upgraded_again() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let name = unique("catalog");

    let t0 = a.acquire_upgradable(&name).await.unwrap();
    let first = t0.guard().fencing_token().unwrap();
    let writer = bounded("an upgrade with no readers", t0.upgrade()).await.unwrap();
    let t1 = writer.fencing_token().unwrap();
    assert!(b.try_acquire_shared(&name).await.unwrap().is_none());
    let up = bounded("the downgrade", writer.downgrade()).await.unwrap();
    let t2 = up.guard().fencing_token().unwrap();
    assert!(first < t1 && t1 <= t2, "tokens: {first}, {t1}, {t2}");
    // Readers in again, of both Lockers; still no writer, no other upgradable.
    let ra = a
        .try_acquire_shared(&name)
        .await
        .unwrap()
        .expect("a reader after the downgrade");
    let rb = b
        .try_acquire_shared(&name)
        .await
        .unwrap()
        .expect("a reader after the downgrade");
    assert!(b.try_acquire(&name).await.unwrap().is_none());
    assert!(b.try_acquire_upgradable(&name).await.unwrap().is_none());
    assert!(a.try_acquire_upgradable(&name).await.unwrap().is_none());
    let holders = b.holders(&name).await.unwrap();
    assert_eq!(holders.len(), 3, "{holders:?}");
    up.guard().ensure_held().await.unwrap();
    // And upgraded again, once the readers go.
    let upgrading = tokio::spawn(async move { up.upgrade().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!upgrading.is_finished());
    drop((ra, rb));
    let again = bounded("the second upgrade", upgrading).await.unwrap().unwrap();
    let t3 = again.fencing_token().unwrap();
    assert!(t3 > t2, "tokens: {t2} then {t3}");
    assert!(b.try_acquire_shared(&name).await.unwrap().is_none());
    drop(again);
    assert!(
        bounded("a writer after it", b.acquire(&name))
            .await
            .unwrap()
            .fencing_token()
            .unwrap()
            > t3
    );
}

/// A guard from `acquire` cannot be downgraded on a server either, and a
/// name held as a semaphore is refused as a kind mismatch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_guard_is_not_downgraded_and_semaphores_are_another_kind() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let name = unique("catalog");
    let plain = a.acquire(&name).await.unwrap();
    let err = plain.downgrade().await.unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    drop(
        bounded("the name, free again", a.acquire_upgradable(&name))
            .await
            .unwrap(),
    );

    let gpu = unique("gpu");
    let permit = b.semaphore(&gpu, 2).unwrap().acquire().await.unwrap();
    let err = a.try_acquire_upgradable(&gpu).await.unwrap_err();
    assert!(matches!(err, Error::KindMismatch { .. }), "{err}");
    drop(permit);
    drop(
        bounded("the name, free again", a.acquire_upgradable(&gpu))
            .await
            .unwrap(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_session_loses_the_holding_and_frees_the_name() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();

    // The upgradable holding.
    let name = unique("shared-phase");
    let up = a.acquire_upgradable(&name).await.unwrap();
    // Its row's session (the only holder yet).
    let id = up.guard().owner().uuid().unwrap().to_owned();
    let pid = backend_of(&server, &name, Holder::Acquisition(id));
    // A session of its own: the Locker's readers are on another.
    let reader = a.acquire_shared(&name).await.unwrap();
    let n = name.clone();
    let sessions: i64 = server.sql(move |c| {
        c.query_one(
            "SELECT count(DISTINCT backend_pid) FROM leasehold_holders WHERE name = $1",
            &[&n],
        )
        .unwrap()
        .get(0)
    });
    assert_eq!(sessions, 2);
    terminate(&server, pid);
    bounded("lost() after the session ended", up.guard().lost()).await;
    assert!(!reader.is_lost(), "the Locker's own session is untouched");
    drop(reader);
    bounded("lost() after the session ended", up.guard().lost()).await;
    let err = up.guard().ensure_held().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Lost {
                reason: LossReason::SessionLost,
                ..
            }
        ),
        "{err}"
    );
    let err = up.upgrade().await.unwrap_err();
    assert!(matches!(err, Error::Lost { .. }), "{err}");
    // Free: the Locker's own session was not touched, and the name's
    // slot went with the dead session.
    let next = bounded("the next upgradable holder", b.acquire_upgradable(&name))
        .await
        .unwrap();
    drop(next);
    drop(bounded("a writer", b.acquire(&name)).await.unwrap());

    // The upgraded lock.
    let name = unique("exclusive-phase");
    let writer = a
        .acquire_upgradable(&name)
        .await
        .unwrap()
        .upgrade()
        .await
        .unwrap();
    let pid = backend_of(&server, &name, Holder::Exclusive);
    terminate(&server, pid);
    let killed = Instant::now();
    bounded("lost() after the session ended", writer.lost()).await;
    assert!(killed.elapsed() < Duration::from_secs(2));
    let err = writer.downgrade().await.unwrap_err();
    assert!(matches!(err, Error::Lost { .. }), "{err}");
    drop(bounded("a writer", b.acquire(&name)).await.unwrap());
    // The Locker goes on.
    drop(
        bounded("a new upgradable holding", a.acquire_upgradable(&name))
            .await
            .unwrap(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_all_releases_upgradable_and_upgraded_holdings() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let (shared, upgraded) = (unique("shared-phase"), unique("exclusive-phase"));

    let up = a.acquire_upgradable(&shared).await.unwrap();
    let writer = a
        .acquire_upgradable(&upgraded)
        .await
        .unwrap()
        .upgrade()
        .await
        .unwrap();
    let released = bounded("release_all", a.release_all()).await;
    assert_eq!(released.len(), 2, "{released:?}");
    bounded("lost()", up.guard().lost()).await;
    bounded("lost()", writer.lost()).await;
    for name in [&shared, &upgraded] {
        let taken = bounded("another Locker takes the name", b.acquire(name)).await;
        drop(taken.unwrap());
    }
    let err = a.acquire_upgradable(&shared).await.unwrap_err();
    assert!(matches!(err, Error::ShutDown { .. }), "{err}");
    let err = up.upgrade().await.unwrap_err();
    assert!(
        matches!(err, Error::Lost { .. } | Error::ShutDown { .. }),
        "{err}"
    );
}

/// A `Locker` on `server` with `lease`, renewed every `renew`, polling
/// every 20 ms.
fn locker_renewed(server: &Server, lease: Duration, renew: Duration) -> Locker {
    Locker::builder()
        .postgres(server.url())
        .lease(lease)
        .renew_interval(renew)
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap()
}

/// Holds `LOCK TABLE table IN ACCESS EXCLUSIVE MODE` on a connection of
/// its own until the returned sender is dropped (or sent to).
fn lock_table(server: &Server, table: &'static str) -> std::sync::mpsc::Sender<()> {
    let (done, until) = std::sync::mpsc::channel::<()>();
    let (locked, ready) = std::sync::mpsc::channel();
    let url = server.url();
    std::thread::spawn(move || {
        let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        client
            .batch_execute(&format!("BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
            .unwrap();
        locked.send(()).unwrap();
        let _ = until.recv_timeout(BOUND);
        client.batch_execute("COMMIT").unwrap();
    });
    ready.recv_timeout(BOUND).expect("the table locked");
    done
}

/// Waits until server process `backend` waits for a lock.
fn until_waiting(server: &Server, backend: i32) {
    let since = Instant::now();
    loop {
        let waiting: bool = server.sql(move |c| {
            c.query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock')",
                &[&backend],
            )
            .unwrap()
            .get(0)
        });
        if waiting {
            return;
        }
        assert!(
            since.elapsed() < BOUND,
            "session {backend} never waited for the table"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// An upgrade, or a downgrade, whose session the server ends in the
/// middle of it (here while it waits for the owner table) ends
/// `Lost(SessionLost)`, as the holding did, never with the server's
/// error about the session's end; and the name is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversion_whose_session_ends_under_it_ends_lost() {
    let server = Server::start();
    // A conversion's statements get a quarter of it: time enough to end
    // the session while one waits.
    let lease = Duration::from_secs(6);
    let locker = || locker_renewed(&server, lease, Duration::from_millis(500));
    let (a, b) = (locker(), locker());
    let lost = |err: &Error| {
        matches!(
            err,
            Error::Lost {
                reason: LossReason::SessionLost,
                ..
            }
        )
    };

    // The upgrade.
    let name = unique("upgrade");
    let up = a.acquire_upgradable(&name).await.unwrap();
    let id = up.guard().owner().uuid().unwrap().to_owned();
    let pid = backend_of(&server, &name, Holder::Acquisition(id));
    let table = lock_table(&server, "leasehold_locks");
    let upgrading = tokio::spawn(up.upgrade());
    until_waiting(&server, pid);
    terminate(&server, pid);
    drop(table);
    let err = bounded("the upgrade", upgrading).await.unwrap().unwrap_err();
    assert!(lost(&err), "{err:?}");
    // Once the dead holder's lease is over (it may count itself a holder
    // until its heartbeat finds the session gone).
    let writer = tokio::time::timeout(lease + BOUND, b.acquire(&name));
    drop(writer.await.expect("a writer, within the lease").unwrap());

    // The downgrade.
    let name = unique("downgrade");
    let writer = a
        .acquire_upgradable(&name)
        .await
        .unwrap()
        .upgrade()
        .await
        .unwrap();
    let pid = backend_of(&server, &name, Holder::Exclusive);
    let table = lock_table(&server, "leasehold_locks");
    let downgrading = tokio::spawn(writer.downgrade());
    until_waiting(&server, pid);
    terminate(&server, pid);
    drop(table);
    let err = match bounded("the downgrade", downgrading).await.unwrap() {
        Err(err) => err,
        Ok(_) => panic!("a downgrade on an ended session held"),
    };
    assert!(lost(&err), "{err:?}");
    // Once the dead holder's lease is over (it may count itself a holder
    // until its heartbeat finds the session gone).
    let writer = tokio::time::timeout(lease + BOUND, b.acquire(&name));
    drop(writer.await.expect("a writer, within the lease").unwrap());
    drop(
        bounded("a new upgradable holding", a.acquire_upgradable(&name))
            .await
            .unwrap(),
    );
}

/// The next upgradable holder never gets in while the last one may still
/// count itself one: when the server ends an upgradable holding's session
/// (its slot key goes with it), the next `acquire_upgradable` waits out
/// that holding's lease from its row, as a writer does, by which time its
/// heartbeat has reported it lost; for a holding made by a downgrade too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_upgradable_holder_waits_out_one_whose_session_ended() {
    let server = Server::start();
    let lease = Duration::from_secs(4);
    // Its heartbeat finds the session gone a while after.
    let locker = || locker_renewed(&server, lease, Duration::from_millis(1500));
    let (a, b) = (locker(), locker());
    for downgraded in [false, true] {
        let name = unique(if downgraded { "downgraded" } else { "upgradable" });
        let mut up = a.acquire_upgradable(&name).await.unwrap();
        if downgraded {
            up = up.upgrade().await.unwrap().downgrade().await.unwrap();
        }
        let id = up.guard().owner().uuid().unwrap().to_owned();
        let pid = backend_of(&server, &name, Holder::Acquisition(id));
        terminate(&server, pid);
        let ended = Instant::now();
        let next = tokio::time::timeout(lease + BOUND, b.acquire_upgradable(&name))
            .await
            .expect("the next upgradable holder, within the lease")
            .unwrap();
        assert!(
            up.guard().is_lost(),
            "downgraded {downgraded}: the next upgradable holder got in {:?} after the session \
             ended, while the last one still counted itself one",
            ended.elapsed()
        );
        drop((next, up));
    }
}

/// An upgrade that waits for a reader announces itself on the holding's
/// own session; when the server ends that session while the announcement
/// is being written (here it waits for the owner table), the upgrade ends
/// `Lost(SessionLost)`, not with "cannot reach the PostgreSQL session of
/// an upgradable lock" (seen in the upgradable torture, found by a cold
/// attack).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_whose_session_ends_while_it_announces_ends_lost() {
    let server = Server::start();
    let locker = || locker_renewed(&server, Duration::from_secs(6), Duration::from_millis(500));
    let (a, b) = (locker(), locker());
    let name = unique("announce");
    let up = a.acquire_upgradable(&name).await.unwrap();
    let id = up.guard().owner().uuid().unwrap().to_owned();
    let pid = backend_of(&server, &name, Holder::Acquisition(id));
    // A reader of another Locker: the upgrade is busy, and announces.
    let reader = b.acquire_shared(&name).await.unwrap();
    let table = lock_table(&server, "leasehold_locks");
    let upgrading = tokio::spawn(up.upgrade());
    until_waiting(&server, pid);
    terminate(&server, pid);
    drop(table);
    let err = bounded("the upgrade", upgrading).await.unwrap().unwrap_err();
    drop(reader);
    assert!(
        matches!(
            err,
            Error::Lost {
                reason: LossReason::SessionLost,
                ..
            }
        ),
        "{err:?}"
    );
}

/// Sessions established to the test's database so far (each closed one
/// counted once it ended).
fn sessions(server: &Server) -> i64 {
    server.sql(|c| {
        c.query_one(
            "SELECT sessions FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .unwrap()
        .get(0)
    })
}

/// Every attempt of an upgradable acquisition opens a session (the
/// holding's own). A waiter for a holder whose session ended waits out
/// its lease without trying four times a second: before, it opened about
/// four sessions a second for as long as it waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_for_a_dead_upgradable_holder_opens_few_sessions() {
    let server = Server::start();
    let lease = Duration::from_secs(6);
    let locker = || locker_renewed(&server, lease, Duration::from_millis(1500));
    let (a, b) = (locker(), locker());
    // The waiter's own session and listener are up before the count.
    drop(b.acquire_shared(&unique("warm")).await.unwrap());
    let name = unique("dead");
    let up = a.acquire_upgradable(&name).await.unwrap();
    let id = up.guard().owner().uuid().unwrap().to_owned();
    terminate(&server, backend_of(&server, &name, Holder::Acquisition(id)));
    let before = sessions(&server);
    let waited = Instant::now();
    let next = tokio::time::timeout(lease + BOUND, b.acquire_upgradable(&name))
        .await
        .expect("the next upgradable holder, within the lease")
        .unwrap();
    let waited = waited.elapsed();
    drop(next);
    // Each attempt's session was closed by now, and counted.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let opened = sessions(&server) - before;
    println!("waited {waited:?}, {opened} sessions opened meanwhile");
    assert!(
        waited > lease / 2,
        "the holder's lease was waited out (took {waited:?})"
    );
    // The waiter's attempts (one, then one once the lease is over, and
    // one more for an early wake-up), the count's own queries, and the
    // dead holder's Locker reconnecting.
    assert!(
        opened <= 8,
        "{opened} sessions opened while waiting {waited:?} for a dead holder's lease"
    );
    drop(up);
}
