//! The PostgreSQL backend at the edges of a session's life: when the
//! server ends a holder's session (`pg_terminate_backend`, a restart) it
//! frees the holder's advisory locks at once, but the holder may still be
//! running, counting itself a holder until its lease ends. No successor
//! may enter before that: at the instant a successor gets the lock, the
//! old guard must already report itself lost. A holder whose server stops
//! answering (its backend process stopped) is told at its lease's cutoff,
//! not later; and a waiting writer that stops renewing its announcement
//! keeps readers out for at most its lease.
//!
//! Against a real, throwaway server (see `support/pg_server.rs`).
// Each test starts a PostgreSQL server of its own from Debian's binaries.
#![cfg(unix)]

use std::time::{Duration, Instant};

use leasehold::Locker;

#[path = "support/pg_server.rs"]
mod pg_server;
#[path = "support/pg_session.rs"]
mod pg_session;

use pg_server::Server;
use pg_session::{
    Frozen, Holder, LEASE, Stopped, backend_of, builder, intent_key, successor_enters_only_after, terminate,
    unique,
};

/// The bound: a successor enters at most a lease (and a few polls and
/// round trips) after it first finds the old session gone.
const BOUND: Duration = Duration::from_millis(1500 + 2000);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_successor_waits_out_a_terminated_exclusive_holder() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let job = unique("job");
    let held = a.acquire(&job).await.unwrap();
    let token = held.fencing_token().unwrap();
    terminate(&server, backend_of(&server, &job, Holder::Exclusive));
    let ended = Instant::now();
    let (taken, after) = successor_enters_only_after("", &[&|| held.is_lost()], ended, BOUND, || async {
        b.try_acquire(&job).await.unwrap()
    })
    .await;
    assert!(taken.fencing_token().unwrap() > token);
    eprintln!("exclusive after exclusive: entered {after:?} after the session ended");
    drop(held);
    // A holder that lets go cleanly costs its successor no wait.
    taken.release().await.unwrap();
    let start = Instant::now();
    let again = a.acquire_timeout(&job, Duration::from_secs(5)).await.unwrap();
    assert!(
        start.elapsed() < LEASE / 2,
        "a clean release made the next holder wait {:?}",
        start.elapsed()
    );
    drop(again);
    let start = Instant::now();
    let third = b.acquire_timeout(&job, Duration::from_secs(5)).await.unwrap();
    assert!(
        start.elapsed() < LEASE / 2,
        "a dropped guard made the next holder wait {:?}",
        start.elapsed()
    );
    drop(third);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_and_writers_wait_out_each_others_terminated_sessions() {
    let server = Server::start();
    let reader = builder(&server).build().unwrap();
    let other_reader = builder(&server).build().unwrap();
    let writer = builder(&server).build().unwrap();
    let doc = unique("doc");

    // A writer after a reader whose session ended.
    let read = reader.acquire_shared(&doc).await.unwrap();
    let id = read.owner().holder_id().unwrap().to_owned();
    terminate(&server, backend_of(&server, &doc, Holder::Locker(id)));
    let ended = Instant::now();
    let (written, after) = successor_enters_only_after("", &[&|| read.is_lost()], ended, BOUND, || async {
        writer.try_acquire(&doc).await.unwrap()
    })
    .await;
    eprintln!("writer after reader: entered {after:?} after the session ended");
    drop(read);

    // Readers after a writer whose session ended.
    terminate(&server, backend_of(&server, &doc, Holder::Exclusive));
    let ended = Instant::now();
    let (again, after) = successor_enters_only_after("", &[&|| written.is_lost()], ended, BOUND, || async {
        other_reader.try_acquire_shared(&doc).await.unwrap()
    })
    .await;
    eprintln!("reader after writer: entered {after:?} after the session ended");
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_never_has_more_valid_holders_than_permits_after_a_session_ends() {
    let server = Server::start();
    let lockers: Vec<Locker> = (0..3).map(|_| builder(&server).build().unwrap()).collect();
    let gpu = unique("gpu");
    let first = lockers[0].semaphore(&gpu, 2).unwrap().acquire().await.unwrap();
    let second = lockers[1].semaphore(&gpu, 2).unwrap().acquire().await.unwrap();
    let third = lockers[2].semaphore(&gpu, 2).unwrap();
    assert!(
        third.try_acquire().await.unwrap().is_none(),
        "two permits, two holders"
    );
    let id = first.owner().holder_id().unwrap().to_owned();
    terminate(&server, backend_of(&server, &gpu, Holder::Locker(id)));
    let ended = Instant::now();
    let (permit, after) = successor_enters_only_after("", &[&|| first.is_lost()], ended, BOUND, || async {
        third.try_acquire().await.unwrap()
    })
    .await;
    assert!(!second.is_lost(), "the other permit holder keeps its permit");
    eprintln!("permit after permit: entered {after:?} after the session ended");
    drop((permit, first, second));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_server_process_stops_answering_is_told_at_its_cutoff() {
    let server = Server::start();
    if server.external.is_some() {
        eprintln!("skipped: cannot stop a process of an external server (LEASEHOLD_PG_URL)");
        return;
    }
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let job = unique("job");
    let held = a.acquire(&job).await.unwrap();
    let stopped = Stopped::stop(backend_of(&server, &job, Holder::Exclusive));
    let since = Instant::now();
    tokio::time::timeout(LEASE + Duration::from_secs(1), held.lost())
        .await
        .expect("lost() by the lease's cutoff, though the heartbeat gets no answer");
    assert!(held.is_lost());
    eprintln!("told {:?} after its server process stopped", since.elapsed());
    // The stopped session still holds the lock on the server.
    assert!(b.try_acquire(&job).await.unwrap().is_none());
    drop(stopped);
    drop(held);
    let taken = b.acquire_timeout(&job, Duration::from_secs(10)).await.unwrap();
    drop(taken);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_successor_runs_beside_a_holder_across_a_server_restart() {
    let mut server = Server::start();
    if server.external.is_some() {
        eprintln!("skipped: cannot restart an external server (LEASEHOLD_PG_URL)");
        return;
    }
    // Heartbeats far apart: the holder hears of the restart late.
    let slow = |server: &Server| {
        Locker::builder()
            .postgres(server.url())
            .lease(Duration::from_secs(4))
            .renew_interval(Duration::from_secs(1))
            .poll_interval(Duration::from_millis(20))
            .build()
            .unwrap()
    };
    let a = slow(&server);
    let job = unique("job");
    let held = a.acquire(&job).await.unwrap();
    tokio::task::block_in_place(|| server.restart());
    let restarted = Instant::now();
    let b = slow(&server);
    let (taken, after) = successor_enters_only_after(
        "",
        &[&|| held.is_lost()],
        restarted,
        Duration::from_secs(10),
        || async { b.try_acquire(&job).await.unwrap() },
    )
    .await;
    eprintln!("entered {after:?} after the restart");
    drop(taken);
}

/// A writer that announced itself and then stopped running with its
/// session up: it holds the intent key, and its announcement's time runs
/// out. Readers stay out until then, and only until then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_waiting_writer_keeps_readers_out_for_at_most_its_lease() {
    let server = Server::start();
    let reader = builder(&server).build().unwrap();
    let doc = unique("doc");
    // Make the tables, and the name's row.
    reader.acquire(&doc).await.unwrap().release().await.unwrap();
    let (url, name, intent) = (server.url(), doc.clone(), intent_key(&doc));
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let frozen = std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let taken: bool = c
            .query_one("SELECT pg_try_advisory_lock($1)", &[&intent])
            .unwrap()
            .get(0);
        c.execute(
            "UPDATE leasehold_locks SET intent_until = clock_timestamp() + interval '2 seconds' WHERE name = $1",
            &[&name],
        )
        .unwrap();
        held_tx.send(taken).unwrap();
        // Never renewed; the session stays up until the test is done.
        let _ = done_rx.recv_timeout(Duration::from_secs(30));
    });
    assert!(held_rx.recv().unwrap(), "the frozen writer took the intent key");
    let since = Instant::now();
    assert!(
        reader.try_acquire_shared(&doc).await.unwrap().is_none(),
        "a writer that renews its announcement keeps readers out"
    );
    let read = reader
        .acquire_shared_timeout(&doc, Duration::from_secs(8))
        .await
        .expect("a reader gets in once the frozen writer's announcement ran out");
    let after = since.elapsed();
    assert!(
        after >= Duration::from_millis(1500),
        "the announcement held only {after:?} of its 2 s"
    );
    eprintln!("a reader got in {after:?} after the writer froze");
    read.release().await.unwrap();
    done_tx.send(()).unwrap();
    frozen.join().unwrap();
}

/// The server ended a `Locker`'s session while it held nothing (an idle
/// timeout, a DBA, a restart): its next acquisition of every kind
/// reconnects and succeeds, rather than failing on the dead connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_after_an_idle_session_ended_reconnects() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let job = unique("job");
    for kind in ["exclusive", "shared", "permit"] {
        // Connected, holding nothing.
        a.acquire(&job).await.unwrap().release().await.unwrap();
        let backend: i32 = server.sql(|c| {
            c.query_one(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'
                 AND pid <> pg_backend_pid() AND query NOT ILIKE '%LISTEN%' ORDER BY backend_start DESC LIMIT 1",
                &[],
            )
            .unwrap()
            .get(0)
        });
        terminate(&server, backend);
        let taken = match kind {
            "exclusive" => a.try_acquire(&job).await.map(|g| g.is_some()),
            "shared" => a.try_acquire_shared(&job).await.map(|g| g.is_some()),
            _ => a
                .semaphore(&job, 2)
                .unwrap()
                .try_acquire()
                .await
                .map(|g| g.is_some()),
        };
        assert!(
            matches!(taken, Ok(true)),
            "{kind}: the next attempt after the session ended: {taken:?}"
        );
    }
}

/// A DBA's `LOCK TABLE ... ACCESS EXCLUSIVE` on the owner tables for three
/// seconds: inspecting (`holder()`, `list()`), releasing and acquiring on
/// the same `Locker` wait for the tables, but never hold up the
/// heartbeats of its other locks, whose leases (1 s) keep being renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_lock_delays_inspection_and_release_but_no_heartbeat() {
    let server = Server::start();
    let a = Locker::builder()
        .postgres(server.url())
        .lease(Duration::from_secs(1))
        .renew_interval(Duration::from_millis(250))
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    let (job, doc, other) = (unique("job"), unique("doc"), unique("other"));
    let held = a.acquire(&job).await.unwrap();
    let read = a.acquire_shared(&doc).await.unwrap();
    let permit = a.semaphore(&other, 2).unwrap().acquire().await.unwrap();
    let (url, (locked_tx, locked_rx)) = (server.url(), std::sync::mpsc::channel());
    let dba = std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.batch_execute("BEGIN; LOCK TABLE leasehold_locks, leasehold_holders IN ACCESS EXCLUSIVE MODE")
            .unwrap();
        locked_tx.send(()).unwrap();
        std::thread::sleep(Duration::from_secs(3));
        c.batch_execute("COMMIT").unwrap();
    });
    locked_rx.recv().unwrap();
    let since = Instant::now();
    let inspect = {
        let (a, job) = (a.clone(), job.clone());
        tokio::spawn(async move { a.holder(&job).await })
    };
    let listing = {
        let a = a.clone();
        tokio::spawn(async move { a.list().await })
    };
    let released = tokio::spawn(async move { read.release().await });
    let dropped = tokio::task::spawn_blocking(move || drop(permit));
    // Acquisitions of other names wait for the tables too.
    let others: Vec<_> = (0..16)
        .map(|i| {
            let (a, name) = (a.clone(), format!("{other}-{i}"));
            tokio::spawn(async move { a.acquire_timeout(&name, Duration::from_secs(8)).await })
        })
        .collect();
    // The whole time the tables are locked, and a lease after.
    let kept = tokio::time::timeout(Duration::from_secs(4), held.lost()).await;
    assert!(
        kept.is_err(),
        "a holder lost its lock {:?} into a table lock that only inspection and release waited for",
        since.elapsed()
    );
    assert!(!held.is_lost());
    let holder = inspect
        .await
        .unwrap()
        .expect("holder() answers once the table is free");
    assert_eq!(
        holder.map(|h| h.holder_id().map(str::to_owned)),
        Some(held.owner().holder_id().map(str::to_owned))
    );
    assert!(listing.await.unwrap().is_ok());
    released.await.unwrap().unwrap();
    dropped.await.unwrap();
    for other in others {
        drop(
            other
                .await
                .unwrap()
                .expect("an acquisition that waited for the tables"),
        );
    }
    dba.join().unwrap();
    held.release().await.unwrap();
}

/// A try whose `COMMIT` the server carried out but whose answer was lost
/// with its session is made again, with the same acquisition: the holder
/// row of the earlier try is there already. The acquisition must succeed
/// (that row's holder never ran), not fail on the row's id. Here another
/// session (dblink) commits a copy of the first row recorded, just before
/// the acquisition's own insert, as the lost try would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_row_left_by_an_earlier_try_of_the_same_acquisition_does_not_fail_it() {
    let server = Server::start();
    let locker = builder(&server).build().unwrap();
    // The owner tables exist from here on. The first holder row recorded
    // under each id gets its copy (committed by the copier's session), once.
    let warm = unique("warm");
    drop(locker.acquire_shared(&warm).await.unwrap());
    let url = server.url();
    server.sql(move |c| {
        c.batch_execute(&format!(
            "CREATE EXTENSION IF NOT EXISTS dblink;
             CREATE TABLE leasehold_test_copied (id text PRIMARY KEY);
             CREATE FUNCTION leasehold_test_copy() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF current_setting('application_name') <> 'copier'
                     AND NOT EXISTS (SELECT 1 FROM leasehold_test_copied WHERE id = NEW.id) THEN
                     PERFORM dblink_exec({url}, format(
                         'INSERT INTO leasehold_holders SELECT * FROM json_populate_record(NULL::leasehold_holders, %L);
                          INSERT INTO leasehold_test_copied VALUES (%L)',
                         row_to_json(NEW), NEW.id));
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER leasehold_test_copy BEFORE INSERT ON leasehold_holders
                 FOR EACH ROW EXECUTE FUNCTION leasehold_test_copy();",
            url = quote_literal(&format!("{url} application_name=copier"))
        ))
        .unwrap();
    });
    let reader = unique("reader");
    let shared = tokio::time::timeout(Duration::from_secs(20), locker.acquire_shared(&reader))
        .await
        .expect("the shared acquisition ends")
        .expect("a shared acquisition whose earlier try left its row");
    let gpu = unique("gpu");
    let permit = tokio::time::timeout(
        Duration::from_secs(20),
        locker.semaphore(&gpu, 2).unwrap().acquire(),
    )
    .await
    .expect("the permit acquisition ends")
    .expect("a permit acquisition whose earlier try left its row");
    let rows: i64 = server.sql(move |c| {
        c.query_one(
            "SELECT count(*) FROM leasehold_holders WHERE name = $1 OR name = $2",
            &[&reader, &gpu],
        )
        .unwrap()
        .get(0)
    });
    assert_eq!(
        rows, 2,
        "one row for each holder, none left from the earlier tries"
    );
    drop((shared, permit));
}

/// `text` as an SQL string literal.
fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// How a session ends under its holders, for
/// [`every_holder_is_told_and_the_locker_comes_back`].
#[derive(Debug, Clone, Copy)]
enum End {
    /// `pg_terminate_backend` of the Locker's session.
    Terminate,
    /// The server restarted (`pg_ctl restart -m fast`).
    Restart,
    /// The whole server stopped (`SIGSTOP`) for longer than a lease, then
    /// resumed: a network cut, as its clients see it.
    Freeze,
}

/// The heartbeat interval of [`pg_session::builder`]'s Lockers.
const RENEW: Duration = Duration::from_millis(500);

/// The documented bounds (crate docs, PostgreSQL): a holder whose session
/// ended is told at its next heartbeat, within a `renew_interval`; one
/// whose server stopped answering, at its lease's cutoff, within a
/// `lease` of the server's last answer. The slack is for scheduling.
const SLACK: Duration = Duration::from_millis(500);

/// An exclusive, a shared and a permit holder of one Locker all lose
/// their locks when its session ends, each told `lost()` within the
/// bound the docs state; the same Locker then acquires again by itself
/// (once the server is back), and no lock is left held on the server by
/// a session nobody owns.
async fn every_holder_is_told_and_the_locker_comes_back(end: End) {
    let mut server = Server::start();
    let Some(postmaster) = server.pid() else {
        eprintln!("skipped: cannot restart or stop an external server (LEASEHOLD_PG_URL)");
        return;
    };
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let (job, doc, gpu) = (unique("job"), unique("doc"), unique("gpu"));
    let permits = a.semaphore(&gpu, 2).unwrap();
    let exclusive = a.acquire(&job).await.unwrap();
    let shared = a.acquire_shared(&doc).await.unwrap();
    let permit = permits.acquire().await.unwrap();
    // An upgradable holding, on a session of its own (which a
    // pg_terminate_backend of the Locker's session leaves alone).
    let report = unique("report");
    let upgradable = a.acquire_upgradable(&report).await.unwrap();
    let before = exclusive.fencing_token().unwrap();
    // Heartbeats answered: the last one was sent less than a renewal ago.
    tokio::time::sleep(RENEW).await;
    let (since, bound, frozen) = match end {
        End::Terminate => {
            terminate(&server, backend_of(&server, &job, Holder::Exclusive));
            (Instant::now(), RENEW + SLACK, None)
        }
        End::Restart => {
            let since = Instant::now();
            tokio::task::block_in_place(|| server.restart());
            // The session ended during the restart, before it returned.
            (since, since.elapsed() + RENEW + SLACK, None)
        }
        End::Freeze => (Instant::now(), LEASE + SLACK, Some(Frozen::server(postmaster))),
    };
    let mut holders = vec![
        ("exclusive", &exclusive),
        ("shared", &shared),
        ("permit", &permit),
    ];
    if !matches!(end, End::Terminate) {
        holders.push(("upgradable", upgradable.guard()));
    }
    for (what, guard) in holders {
        tokio::time::timeout(bound.saturating_sub(since.elapsed()), guard.lost())
            .await
            .unwrap_or_else(|_| panic!("{end:?}: the {what} holder was not told within {bound:?}"));
        assert!(guard.ensure_held().await.unwrap_err().is_lost(), "{what}");
    }
    eprintln!("{end:?}: every holder told {:?} after the end", since.elapsed());
    if let Some(frozen) = frozen {
        // Nothing waits on a stopped server past its own deadline.
        let start = Instant::now();
        let tried = tokio::time::timeout(Duration::from_secs(3), b.try_acquire(&job))
            .await
            .expect("an attempt against a stopped server returns");
        assert!(matches!(tried, Ok(None)), "{tried:?}");
        eprintln!(
            "an attempt against the stopped server returned after {:?}",
            start.elapsed()
        );
        drop(frozen);
    }
    let upgradable_kept = !upgradable.guard().is_lost();
    drop((exclusive, shared, permit, upgradable));
    // The Locker comes back by itself.
    let again = a.acquire_timeout(&job, Duration::from_secs(10)).await.unwrap();
    assert!(again.fencing_token().unwrap() > before, "tokens keep growing");
    let read = a
        .acquire_shared_timeout(&doc, Duration::from_secs(10))
        .await
        .unwrap();
    let slot = permits.acquire_timeout(Duration::from_secs(10)).await.unwrap();
    assert!(
        upgradable_kept == matches!(end, End::Terminate),
        "{end:?}: the upgradable holding's own session"
    );
    let up = a
        .acquire_upgradable_timeout(&report, Duration::from_secs(10))
        .await
        .unwrap()
        .upgrade()
        .await
        .unwrap();
    assert!(b.try_acquire_shared(&report).await.unwrap().is_none());
    up.release().await.unwrap();
    // Another Locker sees them held, then free once released.
    assert!(b.try_acquire(&job).await.unwrap().is_none());
    again.release().await.unwrap();
    read.release().await.unwrap();
    slot.release().await.unwrap();
    let taken = b.acquire_timeout(&job, Duration::from_secs(5)).await.unwrap();
    let (read, slot) = (
        b.try_acquire(&doc)
            .await
            .unwrap()
            .expect("the shared lock was let go"),
        b.semaphore(&gpu, 2)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .expect("a permit"),
    );
    drop((taken, read, slot));
    // Nothing is held on the server once every guard is gone.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let locks: i64 = server.sql(|c| {
            c.query_one("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'", &[])
                .unwrap()
                .get(0)
        });
        if locks == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{end:?}: {locks} advisory locks left held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop((a, b, permits));
    let left = server.advisory_locks_and_sessions_left(Duration::from_secs(5));
    assert!(left.is_empty(), "{end:?}: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_holder_is_told_of_a_terminated_session_and_the_locker_comes_back() {
    tokio::time::timeout(
        Duration::from_secs(60),
        every_holder_is_told_and_the_locker_comes_back(End::Terminate),
    )
    .await
    .expect("the test ends within a minute");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_holder_is_told_of_a_server_restart_and_the_locker_comes_back() {
    tokio::time::timeout(
        Duration::from_secs(60),
        every_holder_is_told_and_the_locker_comes_back(End::Restart),
    )
    .await
    .expect("the test ends within a minute");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_holder_is_told_of_a_stopped_server_and_the_locker_comes_back() {
    tokio::time::timeout(
        Duration::from_secs(60),
        every_holder_is_told_and_the_locker_comes_back(End::Freeze),
    )
    .await
    .expect("the test ends within a minute");
}
