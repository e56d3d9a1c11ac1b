//! Attacks on the PostgreSQL backend's handling of a holder whose session
//! ended (issue 29): successors that wait out the old holder's lease, clean
//! handoffs that must not wait, and the rows and announcements behind them.
//!
//! Against a real, throwaway server (see `support/pg_server.rs`).
// Each test starts a PostgreSQL server of its own from Debian's binaries.
#![cfg(unix)]

use std::time::{Duration, Instant};

use leasehold::{Error, LockGuard, Locker};

#[path = "support/pg_server.rs"]
mod pg_server;
#[path = "support/pg_session.rs"]
mod pg_session;

use pg_server::Server;
use pg_session::{
    Holder, LEASE, Stopped, backend_of, builder, intent_key, name_key, successor_enters_only_after,
    terminate, unique,
};

/// Names that the SQL literal built by `release.rs` `literal()` must
/// carry through unchanged: the release's `free_at` and the writer's
/// `intent_until` are written with it. A literal that mangled the name
/// would update nothing, and cost the next holder a lease's wait.
const NASTY: &[&str] = &[
    "it's",
    "back\\slash",
    "ends with a backslash\\",
    "\\'",
    "'\\",
    "''",
    "\\\\''\\",
    "'; DROP TABLE leasehold_locks; --",
    "$leasehold$ $$ dollar",
    "E'x'",
    "ünïcødé 🦀 名前",
    "tab\tnewline\nquote\"",
    "\\x41\\101\\u0041",
    "%s %I {} {0}",
];

/// Attack: `literal()` with quotes, backslashes, unicode. A clean release
/// must mark the row let go (`free_at`), so that the next holder takes it
/// at once; a waiting writer must set the name's `intent_until`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nasty_names_hand_off_without_waiting_and_announce_their_writers() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    for base in NASTY {
        let name = format!("{base}-{}", uuid::Uuid::new_v4().simple());
        a.acquire(&name).await.unwrap().release().await.unwrap();
        let n = name.clone();
        let freed: bool = server.sql(move |c| {
            c.query_one(
                "SELECT free_at IS NOT NULL AND free_at <= clock_timestamp() FROM leasehold_locks WHERE name = $1",
                &[&n],
            )
            .unwrap()
            .get(0)
        });
        assert!(freed, "{name:?}: the clean release did not mark the row let go");
        let start = Instant::now();
        let taken = b.acquire_timeout(&name, Duration::from_secs(5)).await.unwrap();
        assert!(
            start.elapsed() < LEASE / 2,
            "{name:?}: a clean release made the next holder wait {:?}",
            start.elapsed()
        );
        drop(taken);
        let start = Instant::now();
        let again = a.acquire_timeout(&name, Duration::from_secs(5)).await.unwrap();
        assert!(
            start.elapsed() < LEASE / 2,
            "{name:?}: a dropped guard made the next holder wait {:?}",
            start.elapsed()
        );
        again.release().await.unwrap();

        // A writer waiting for a reader announces itself with this name.
        let read = b.acquire_shared(&name).await.unwrap();
        let writer = a.clone();
        let wname = name.clone();
        let waiting =
            tokio::spawn(async move { writer.acquire_timeout(&wname, Duration::from_secs(10)).await });
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let n = name.clone();
            let set: bool = server.sql(move |c| {
                c.query_one(
                    "SELECT EXISTS (SELECT 1 FROM leasehold_locks WHERE name = $1 AND intent_until > clock_timestamp())",
                    &[&n],
                )
                .unwrap()
                .get(0)
            });
            if set {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name:?}: the waiting writer never set the name's intent_until"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        read.release().await.unwrap();
        let written = waiting.await.unwrap().unwrap();
        written.release().await.unwrap();
    }
}

/// Attack: a semaphore with one holder whose session ended. Every new
/// permit attempt takes the first free slot, which is the dead holder's,
/// finds its row pending and waits a lease, though other slots are free
/// and only one earlier holder may still count itself one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn free_permit_slots_stay_usable_beside_a_dead_permit_holder() {
    let server = Server::start();
    let lockers: Vec<Locker> = (0..4).map(|_| builder(&server).build().unwrap()).collect();
    let gpu = unique("gpu");
    let mut held = Vec::new();
    for locker in &lockers[..3] {
        held.push(locker.semaphore(&gpu, 3).unwrap().acquire().await.unwrap());
    }
    // The first took slot 0.
    let id = held[0].owner().holder_id().unwrap().to_owned();
    terminate(&server, backend_of(&server, &gpu, Holder::Locker(id)));
    let dead = held.remove(0);
    for guard in held.drain(..) {
        guard.release().await.unwrap();
    }
    let g = gpu.clone();
    let rows: Vec<String> = server.sql(move |c| {
        c.query(
            "SELECT format('%s slot=%s lease=%s free_at=%s', holder_id, slot, lease_ms, free_at) FROM leasehold_holders WHERE name = $1",
            &[&g],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    });
    eprintln!("rows: {rows:?}");
    // Two slots free, at most one (dead) holder that may count itself one.
    let start = Instant::now();
    let permit = lockers[3]
        .semaphore(&gpu, 3)
        .unwrap()
        .acquire_timeout(Duration::from_secs(10))
        .await
        .unwrap();
    let waited = start.elapsed();
    let dead_still_valid = !dead.is_lost();
    eprintln!("permit beside a dead holder: waited {waited:?} (dead holder still valid: {dead_still_valid})");
    assert!(
        waited < LEASE / 2,
        "a permit waited {waited:?} with 2 of 3 slots free and one dead holder (3 permits)"
    );
    drop((permit, dead));
}

/// Attack: the renewal thread is shared by a `Locker`'s leases and its
/// waiting writers' announcements. A holder whose server process stops
/// answering must be told at its cutoff, even while the same `Locker` has
/// an exclusive waiter announced for another name (whose renewal asks the
/// same, stuck, session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_waiter_does_not_delay_the_loss_report_of_a_stopped_session() {
    let server = Server::start();
    if server.external.is_some() {
        eprintln!("skipped: cannot stop a process of an external server");
        return;
    }
    let a = builder(&server).build().unwrap();
    let r = builder(&server).build().unwrap();
    let job = unique("job");
    let doc = unique("doc");
    let held = a.acquire(&job).await.unwrap();
    let read = r.acquire_shared(&doc).await.unwrap();
    let writer = a.clone();
    let wdoc = doc.clone();
    let waiting = tokio::spawn(async move { writer.acquire_timeout(&wdoc, Duration::from_secs(60)).await });
    // Wait until the writer holds the intent key (announced).
    let intent = intent_key(&doc);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let announced: bool = server.sql(move |c| {
            c.query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
                   AND mode = 'ExclusiveLock' AND objsubid = 1
                   AND classid::bigint = (($1::bigint >> 32) & 4294967295)
                   AND objid::bigint = ($1::bigint & 4294967295))",
                &[&intent],
            )
            .unwrap()
            .get(0)
        });
        if announced {
            break;
        }
        assert!(Instant::now() < deadline, "the writer never announced itself");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let backend = backend_of(&server, &job, Holder::Exclusive);
    // Stop right after a renewal of the holder, so the next thing the
    // renewal thread runs is likely the announcement's renewal.
    let renewals = a.stats().renewals;
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.stats().renewals == renewals {
        assert!(Instant::now() < deadline, "no renewal");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let stopped = Stopped::stop(backend);
    let since = Instant::now();
    let told = tokio::time::timeout(Duration::from_secs(40), held.lost()).await;
    let after = since.elapsed();
    let lost_by_clock = held.is_lost();
    drop(stopped);
    eprintln!(
        "told {after:?} after its server process stopped (is_lost: {lost_by_clock}, told: {})",
        told.is_ok()
    );
    assert!(
        after < LEASE + Duration::from_secs(1),
        "lost() came {after:?} after the server process stopped (lease {LEASE:?})"
    );
    drop(held);
    read.release().await.unwrap();
    let _ = waiting.await;
}

/// A transaction of its own, on a thread of its own, committed on request.
struct OpenTransaction {
    commit: std::sync::mpsc::Sender<()>,
    done: std::thread::JoinHandle<()>,
}

/// Runs what `announce_until` runs (`src/postgres/session/intent.rs`) for
/// a name without a row, but leaves the transaction open: its COMMIT is
/// slow (a WAL flush, a busy server), and readers that probed the intent
/// key before it is taken join meanwhile.
fn announce_until_uncommitted(url: String, name: String) -> OpenTransaction {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (commit, commit_rx) = std::sync::mpsc::channel::<()>();
    let done = std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let key = name_key(&name);
        c.batch_execute("BEGIN").unwrap();
        c.execute(
            "INSERT INTO leasehold_locks AS l (name, key, fencing_token, intent_until)
             VALUES ($1, $2, 0, clock_timestamp() + 1500 * interval '1 millisecond')
             ON CONFLICT (name) DO UPDATE SET intent_until = EXCLUDED.intent_until",
            &[&name, &key],
        )
        .unwrap();
        ready_tx.send(()).unwrap();
        let _ = commit_rx.recv();
        c.batch_execute("COMMIT").unwrap();
    });
    ready_rx.recv().unwrap();
    OpenTransaction { commit, done }
}

/// Attack: the row `announce` creates for a name that has none carried
/// the counter `n + 8192` from the announcer's clock (it now carries 0,
/// which counts as no counter). A reader whose join
/// does not see that row yet (it is not committed) gets the token a
/// missing row stands for, `n' + 8192` from its own, later clock. The next
/// writer's token then comes from the announced row and may be below the
/// reader's: a shared token must be less than any later exclusive one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_joining_during_an_announcement_never_outranks_the_next_writer() {
    let server = Server::start();
    let reader = builder(&server).build().unwrap();
    let writer = builder(&server).build().unwrap();
    // The tables.
    reader
        .acquire(&unique("setup"))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let mut backwards = Vec::new();
    for _ in 0..10 {
        let doc = unique("doc");
        let open = announce_until_uncommitted(server.url(), doc.clone());
        // The announcer's clock is read; the reader's comes later.
        std::thread::sleep(Duration::from_millis(20));
        let read = reader.acquire_shared(&doc).await.unwrap();
        let shared_token = read.fencing_token().unwrap();
        open.commit.send(()).unwrap();
        open.done.join().unwrap();
        read.release().await.unwrap();
        let written = writer.acquire(&doc).await.unwrap();
        let exclusive_token = written.fencing_token().unwrap();
        written.release().await.unwrap();
        eprintln!("reader {shared_token}, next writer {exclusive_token}");
        if exclusive_token <= shared_token {
            backwards.push((shared_token, exclusive_token));
        }
    }
    assert!(
        backwards.is_empty(),
        "the next writer's token was not above the reader's (reader, writer): {backwards:?}"
    );
}

/// Attack: kinds. A name is never held shared and by permits at once
/// (src/postgres.rs, *Kinds*): a later acquisition of the other kind gets
/// `KindMismatch`, or waits. After a permit holder's session ended, that
/// holder still counts itself one until its lease ends; a shared holder
/// must not enter beside it, and the other way round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_other_kind_enters_beside_a_dead_holder_that_still_counts_itself_one() {
    let server = Server::start();
    let p = builder(&server).build().unwrap();
    let s = builder(&server).build().unwrap();

    // Shared beside a dead permit holder.
    let name = unique("mixed");
    let permit = p.semaphore(&name, 2).unwrap().acquire().await.unwrap();
    let id = permit.owner().holder_id().unwrap().to_owned();
    terminate(&server, backend_of(&server, &name, Holder::Locker(id)));
    let ended = Instant::now();
    let (read, after) = successor_enters_only_after(
        "shared after permit",
        &[&|| permit.is_lost()],
        ended,
        Duration::from_secs(5),
        || async {
            match s.try_acquire_shared(&name).await {
                Ok(taken) => taken,
                Err(Error::KindMismatch { .. }) => None,
                Err(e) => panic!("{e}"),
            }
        },
    )
    .await;
    eprintln!("shared after a dead permit holder: entered {after:?}");
    drop((read, permit));
}

/// As above, the other way round: a permit beside a dead shared holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_permit_enters_beside_a_dead_shared_holder_that_still_counts_itself_one() {
    let server = Server::start();
    let p = builder(&server).build().unwrap();
    let s = builder(&server).build().unwrap();
    let name = unique("mixed");
    let read = s.acquire_shared(&name).await.unwrap();
    let id = read.owner().holder_id().unwrap().to_owned();
    terminate(&server, backend_of(&server, &name, Holder::Locker(id)));
    let ended = Instant::now();
    let sem = p.semaphore(&name, 2).unwrap();
    let (permit, after) = successor_enters_only_after(
        "permit after shared",
        &[&|| read.is_lost()],
        ended,
        Duration::from_secs(5),
        || async {
            match sem.try_acquire().await {
                Ok(taken) => taken,
                Err(Error::KindMismatch { .. }) => None,
                Err(e) => panic!("{e}"),
            }
        },
    )
    .await;
    eprintln!("permit after a dead shared holder: entered {after:?}");
    drop((permit, read));
}

/// Attack: pid reuse and `holders()`. A dead shared holder's row is now
/// kept (stamped with `free_at`) instead of deleted when a new session
/// connects. If a later session gets the dead session's server process id
/// and holds the name shared, `live!` takes the dead row for a live one:
/// `holders()` and `list()` show a holder that is gone, even once its
/// `free_at` has passed. (Simulated: the dead row is given the pid of the
/// live holder's session, as a reused pid would, and the `free_at` that
/// session's TIDY gave it, now past.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holder_whose_pid_was_reused_is_not_listed() {
    let server = Server::start();
    let x = builder(&server).build().unwrap();
    let doc = unique("doc");
    let dead = x.acquire_shared(&doc).await.unwrap();
    let dead_id = dead.owner().holder_id().unwrap().to_owned();
    terminate(
        &server,
        backend_of(&server, &doc, Holder::Locker(dead_id.clone())),
    );
    drop(dead);
    let y = builder(&server).build().unwrap();
    let live = y.acquire_shared(&doc).await.unwrap();
    let live_id = live.owner().holder_id().unwrap().to_owned();
    let live_backend = backend_of(&server, &doc, Holder::Locker(live_id));
    let d = doc.clone();
    let stamped: u64 = server.sql(move |c| {
        c.execute(
            "UPDATE leasehold_holders SET backend_pid = $1, free_at = clock_timestamp() - interval '1 second'
             WHERE name = $2 AND holder_id = $3",
            &[&live_backend, &d, &dead_id],
        )
        .unwrap()
    });
    assert_eq!(stamped, 1, "the dead holder's row is kept");
    let holders = y.holders(&doc).await.unwrap();
    let listed = y
        .list()
        .await
        .unwrap()
        .into_iter()
        .find(|info| info.name() == doc)
        .map(|info| info.holders().len());
    eprintln!("holders(): {}, list(): {listed:?}", holders.len());
    assert_eq!(
        holders.len(),
        1,
        "holders() shows a holder whose row says it is over: {holders:?}"
    );
    drop(live);
}

/// Attack: rows of earlier versions (no `lease_ms`, no `free_at`), in
/// tables an earlier version made, hold nobody back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_and_tables_of_earlier_versions_hold_nobody_back() {
    let server = Server::start();
    let job = unique("job");
    let doc = unique("doc");
    let (j, d) = (job.clone(), doc.clone());
    let (jk, dk) = (name_key(&job), name_key(&doc));
    server.sql(move |c| {
        c.batch_execute(
            "CREATE TABLE leasehold_locks (
                name text PRIMARY KEY, key bigint NOT NULL, fencing_token bigint NOT NULL DEFAULT 0,
                holder_id text, hostname text, pid integer, acquired_at timestamptz, backend_pid integer,
                holder_token bigint, fields text);
             CREATE TABLE leasehold_holders (
                id text PRIMARY KEY, name text NOT NULL, key bigint NOT NULL, mode text NOT NULL,
                permits bigint, slot bigint, holder_id text, hostname text, pid integer,
                acquired_at timestamptz, backend_pid integer NOT NULL, holder_token bigint, fields text);
             CREATE INDEX leasehold_holders_name ON leasehold_holders (name);",
        )
        .unwrap();
        // A dead exclusive holder of an earlier version, and dead shared
        // holders of one.
        c.execute(
            "INSERT INTO leasehold_locks VALUES ($1, $2, 100, 'old', 'host', 1, now(), 999999, 100, NULL)",
            &[&j, &jk],
        )
        .unwrap();
        c.execute(
            "INSERT INTO leasehold_locks VALUES ($1, $2, 100, 'old', 'host', 1, now(), 999999, 100, NULL)",
            &[&d, &dk],
        )
        .unwrap();
        c.execute(
            "INSERT INTO leasehold_holders VALUES ('old-1', $1, $2, 'shared', NULL, NULL, 'old', 'host', 1, now(),
                 999998, 100, NULL)",
            &[&d, &dk],
        )
        .unwrap();
    });
    let a = builder(&server).build().unwrap();
    let start = Instant::now();
    let held = a.acquire_timeout(&job, Duration::from_secs(5)).await.unwrap();
    assert!(start.elapsed() < LEASE / 2, "waited {:?}", start.elapsed());
    assert!(held.fencing_token().unwrap() > 100);
    held.release().await.unwrap();
    let start = Instant::now();
    let written = a.acquire_timeout(&doc, Duration::from_secs(5)).await.unwrap();
    assert!(start.elapsed() < LEASE / 2, "waited {:?}", start.elapsed());
    written.release().await.unwrap();
    let start = Instant::now();
    let read = a
        .acquire_shared_timeout(&doc, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(start.elapsed() < LEASE / 2, "waited {:?}", start.elapsed());
    read.release().await.unwrap();
    assert!(a.holders(&doc).await.unwrap().is_empty());
}

/// How long `take` took.
async fn timed<T>(take: impl std::future::Future<Output = T>) -> (T, Duration) {
    let start = Instant::now();
    let taken = take.await;
    (taken, start.elapsed())
}

/// Attack: performance. Every clean handoff, between kinds, by release
/// or by drop, with and without a waiting writer's announcement, is taken
/// at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_handoffs_between_kinds_never_wait() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let name = unique("cycle");
    let t = Duration::from_secs(5);
    let mut worst = (Duration::ZERO, "");
    let mut tokens: Vec<u64> = Vec::new();
    let mut note = |label: &'static str, waited: Duration, guard: &LockGuard| {
        if waited > worst.0 {
            worst = (waited, label);
        }
        tokens.push(guard.fencing_token().unwrap());
    };
    for round in 0..5 {
        let (g, w) = timed(a.acquire_timeout(&name, t)).await;
        let g = g.unwrap();
        note("exclusive", w, &g);
        if round % 2 == 0 {
            g.release().await.unwrap()
        } else {
            drop(g)
        }
        let (g, w) = timed(b.acquire_timeout(&name, t)).await;
        let g = g.unwrap();
        note("exclusive after exclusive", w, &g);
        if round % 2 == 0 {
            g.release().await.unwrap()
        } else {
            drop(g)
        }
        let (g, w) = timed(a.acquire_shared_timeout(&name, t)).await;
        let g = g.unwrap();
        note("shared after exclusive", w, &g);
        let (g2, w) = timed(b.acquire_shared_timeout(&name, t)).await;
        let g2 = g2.unwrap();
        note("shared beside shared", w, &g2);
        drop(g);
        if round % 2 == 0 {
            g2.release().await.unwrap()
        } else {
            drop(g2)
        }
        let (g, w) = timed(a.acquire_timeout(&name, t)).await;
        let g = g.unwrap();
        note("exclusive after shared", w, &g);
        drop(g);
        // A writer that announced itself behind a reader.
        let r = b.acquire_shared(&name).await.unwrap();
        let writer = a.clone();
        let wname = name.clone();
        let waiting =
            tokio::spawn(async move { writer.acquire_timeout(&wname, Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let released = Instant::now();
        r.release().await.unwrap();
        let g = waiting.await.unwrap().unwrap();
        note("announced writer after shared", released.elapsed(), &g);
        drop(g);
        // Semaphore handoffs.
        let sem_a = a.semaphore(&name, 2).unwrap();
        let sem_b = b.semaphore(&name, 2).unwrap();
        let (p1, w) = timed(sem_a.acquire_timeout(t)).await;
        let p1 = p1.unwrap();
        note("permit after exclusive", w, &p1);
        let (p2, w) = timed(sem_b.acquire_timeout(t)).await;
        let p2 = p2.unwrap();
        note("second permit", w, &p2);
        drop(p1);
        let (p3, w) = timed(sem_b.acquire_timeout(t)).await;
        let p3 = p3.unwrap();
        note("permit after permit", w, &p3);
        p2.release().await.unwrap();
        drop(p3);
        let (g, w) = timed(b.acquire_timeout(&name, t)).await;
        let g = g.unwrap();
        note("exclusive after permits", w, &g);
        drop(g);
    }
    eprintln!("worst wait: {:?} ({})", worst.0, worst.1);
    assert!(
        worst.0 < LEASE / 2,
        "a clean handoff waited {:?} ({})",
        worst.0,
        worst.1
    );
    // Tokens never go backwards (shared ones may repeat).
    for pair in tokens.windows(2) {
        assert!(pair[1] >= pair[0], "tokens went backwards: {tokens:?}");
    }
}

/// Attack: a holder re-acquiring its own name after its session ended:
/// the old guard still counts itself a holder until its cutoff, and the
/// same `Locker`'s new acquisition (on a new session) must not enter
/// before that; nor may another `Locker`'s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_reacquiring_its_own_name_waits_out_its_old_guard() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    for kind in ["exclusive", "shared", "permit"] {
        let job = unique("job");
        let old = match kind {
            "exclusive" => a.acquire(&job).await.unwrap(),
            "shared" => a.acquire_shared(&job).await.unwrap(),
            _ => a.semaphore(&job, 1).unwrap().acquire().await.unwrap(),
        };
        let backend = match kind {
            "exclusive" => backend_of(&server, &job, Holder::Exclusive),
            _ => backend_of(
                &server,
                &job,
                Holder::Locker(old.owner().holder_id().unwrap().to_owned()),
            ),
        };
        terminate(&server, backend);
        let ended = Instant::now();
        // While the old guard lives, any grant must find it lost.
        let mut granted = None;
        while ended.elapsed() < LEASE * 2 {
            if let Some(again) = a.try_acquire(&job).await.unwrap() {
                assert!(
                    old.is_lost(),
                    "{kind}: the same Locker got it again {:?} after its session ended while the old guard \
                     still counted itself a holder",
                    ended.elapsed()
                );
                granted = Some((again, ended.elapsed()));
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        eprintln!(
            "{kind}: while the old guard lives, the same Locker got it again after {:?}",
            granted.as_ref().map(|g| g.1)
        );
        drop(granted);
        drop(old);
        // Once it is dropped, the name is taken again within a lease.
        let (again, waited) = timed(a.acquire_timeout(&job, Duration::from_secs(10))).await;
        eprintln!("{kind}: after dropping the old guard, taken again in {waited:?}");
        drop(again.unwrap());
    }
}
