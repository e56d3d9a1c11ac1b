//! The PostgreSQL backend, against a real server: a throwaway one started
//! by each test (initdb in a temporary directory, a Unix socket only, run
//! as the unprivileged `postgres` user when the tests run as root), unless
//! `LEASEHOLD_PG_URL` names one. Without a server the tests fail loudly:
//! they never pretend to pass.
// Each test starts a PostgreSQL server of its own from Debian's binaries.
#![cfg(unix)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::{Error, LockKind, Locker, LockerBuilder, LossReason};

#[path = "support/pg_server.rs"]
mod pg_server;
#[path = "support/pgbouncer.rs"]
mod pgbouncer;

#[path = "support/pg_session.rs"]
mod pg_session;

use pg_server::{Server, SqlWorker};
use pg_session::{quick_builder as builder, quick_builder_at as builder_at, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_api_on_a_server() {
    let server = Server::start();
    the_same_api(&server.url()).await;
}

/// Exclusive locks through the server (or a pooler in front of it) at `url`.
async fn the_same_api(url: &str) {
    let a = builder_at(url).build().unwrap();
    let b = builder_at(url).build().unwrap();
    let job = unique("job");

    let guard = a.acquire(&job).await.unwrap();
    let first = guard.fencing_token().expect("tokens are always on");
    let owner = b.holder(&job).await.unwrap().expect("held");
    assert_eq!(owner.pid(), Some(std::process::id()));
    assert_eq!(owner.fencing_token(), Some(first));
    assert!(b.list().await.unwrap().iter().any(|l| l.name() == job));
    assert!(b.try_acquire(&job).await.unwrap().is_none());
    assert!(
        b.acquire_timeout(&job, Duration::from_millis(100))
            .await
            .unwrap_err()
            .is_timeout()
    );
    guard.ensure_held().await.unwrap();

    // A waiter on another connection is woken by the release.
    let waiter = {
        let (b, job) = (b.clone(), job.clone());
        tokio::spawn(async move {
            let g = b.acquire(&job).await.unwrap();
            (Instant::now(), g.fencing_token().unwrap())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    guard.release().await.unwrap();
    let (woken, second) = waiter.await.unwrap();
    assert!(
        // Generous for a slow machine: a waiter nobody woke waits for good.
        woken.duration_since(released) < Duration::from_secs(5),
        "woke late: {:?}",
        woken.duration_since(released)
    );
    assert!(
        second > first,
        "tokens grow across Lockers: {first} then {second}"
    );
    assert!(b.holder(&job).await.unwrap().is_none(), "dropped guard released");

    // Re-entrancy, handoff and the FIFO queue work as with files.
    a.scope(async {
        let outer = a.acquire(&job).await.unwrap();
        let inner = a.acquire(&job).await.unwrap();
        assert_eq!(inner.fencing_token(), outer.fencing_token());
    })
    .await;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let first_guard = a.acquire(&job).await.unwrap();
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let (a, job, order) = (a.clone(), job.clone(), Arc::clone(&order));
            let t = tokio::spawn(async move {
                let g = a.acquire(&job).await.unwrap();
                order.lock().unwrap().push(i);
                g.fencing_token().unwrap()
            });
            std::thread::sleep(Duration::from_millis(5));
            t
        })
        .collect();
    drop(first_guard);
    let mut last = 0;
    for t in tasks {
        let token = t.await.unwrap();
        assert!(token > last);
        last = token;
    }
    assert_eq!(*order.lock().unwrap(), (0..20).collect::<Vec<_>>());
    assert!(a.stats().handoffs >= 19);
}

/// Two Lockers with their own connections (two "hosts"), four tasks each,
/// read-modify-write a counter row without row locks: only the lock keeps
/// increments from being lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_count_without_losing_an_update() {
    let server = Server::start();
    let table = unique("counter").replace('-', "_");
    let create = format!("CREATE TABLE {table} (n bigint); INSERT INTO {table} VALUES (0);");
    server.sql(move |c| c.batch_execute(&create).unwrap());
    let url = server.url();
    let hosts = [
        builder(&server).build().unwrap(),
        builder(&server).build().unwrap(),
    ];
    let mut tasks = Vec::new();
    for host in &hosts {
        for _ in 0..4 {
            let (host, sql) = (host.clone(), SqlWorker::start(url.clone(), table.clone()));
            tasks.push(tokio::spawn(async move {
                for _ in 0..100 {
                    let guard = host.acquire("counter").await.unwrap();
                    sql.increment().await;
                    drop(guard);
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let read = format!("SELECT n FROM {table}");
    let n: i64 = server.sql(move |c| c.query_one(&read, &[]).unwrap().get(0));
    assert_eq!(n, 800);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_session_loses_its_locks_and_reconnects() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let job = unique("job");
    let held = a.acquire(&job).await.unwrap();
    let token = held.fencing_token().unwrap();
    let name = job.clone();
    server.sql(move |c| {
        let backend: i32 = c
            .query_one(
                "SELECT backend_pid FROM leasehold_locks WHERE name = $1",
                &[&name],
            )
            .unwrap()
            .get(0);
        c.query_one("SELECT pg_terminate_backend($1)", &[&backend])
            .unwrap();
    });
    let killed = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), held.lost())
        .await
        .expect("lost() within the heartbeat");
    // Heartbeats every 150 ms; 5 s is generous for a slow machine.
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "noticed after {:?}",
        killed.elapsed()
    );
    let taken = b.acquire_timeout(&job, Duration::from_secs(5)).await.unwrap();
    assert!(taken.fencing_token().unwrap() > token);
    drop(taken);
    drop(held);
    // The backend reconnects for new acquisitions.
    let again = a.acquire_timeout(&job, Duration::from_secs(5)).await.unwrap();
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_is_a_loss_for_every_holder_and_tokens_keep_growing() {
    let mut server = Server::start();
    if server.external.is_some() {
        eprintln!("skipped: cannot restart an external server (LEASEHOLD_PG_URL)");
        return;
    }
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let guards = [a.acquire("x").await.unwrap(), b.acquire("y").await.unwrap()];
    let before = guards[0]
        .fencing_token()
        .unwrap()
        .max(guards[1].fencing_token().unwrap());
    tokio::task::block_in_place(|| server.restart());
    for g in &guards {
        tokio::time::timeout(Duration::from_secs(3), g.lost())
            .await
            .expect("every holder reports the loss");
        assert!(g.ensure_held().await.unwrap_err().is_lost());
    }
    drop(guards);
    let again = a.acquire_timeout("x", Duration::from_secs(10)).await.unwrap();
    assert!(
        again.fencing_token().unwrap() > before,
        "tokens survive the restart"
    );
    let _b = b.acquire_timeout("y", Duration::from_secs(10)).await.unwrap();
}

/// Waiting for one name never stalls another; dropped and timed-out
/// acquisitions leave nothing held on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waits_leave_nothing_held_and_names_are_independent() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let (x, y) = (unique("x"), unique("y"));
    let held_elsewhere = b.acquire(&x).await.unwrap();
    let waiting = {
        let (a, x) = (a.clone(), x.clone());
        tokio::spawn(async move { a.acquire(&x).await.map(drop) })
    };
    let other = tokio::time::timeout(Duration::from_secs(2), a.acquire(&y))
        .await
        .expect("y does not wait for x")
        .unwrap();
    drop(other);
    waiting.abort();
    // Futures dropped at every point: timeouts of 0 to a few ms, aborts.
    let mut tasks = Vec::new();
    for i in 0..200u64 {
        let (a, name) = (a.clone(), if i % 2 == 0 { x.clone() } else { y.clone() });
        tasks.push(tokio::spawn(async move {
            let _ = a
                .acquire_timeout(&name, Duration::from_micros(i * 37 % 4000))
                .await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    drop(held_elsewhere);
    // Unlocks of dropped grants are queued: give them a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let held: Vec<String> = a
            .list()
            .await
            .unwrap()
            .iter()
            .map(|l| l.name().to_owned())
            .collect();
        if !held.contains(&x) && !held.contains(&y) {
            break;
        }
        assert!(Instant::now() < deadline, "still held on the server: {held:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(b.try_acquire(&x).await.unwrap().is_some());
    assert!(b.try_acquire(&y).await.unwrap().is_some());
}

/// A connection of the test's own on a thread of its own (the synchronous
/// client cannot run on the test's runtime), kept across statements, so
/// that a transaction can stay open between them.
struct Conn(std::sync::mpsc::Sender<Statement>);

type Statement = Box<dyn FnOnce(&mut postgres::Client) + Send>;

impl Conn {
    fn open(url: String) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<Statement>();
        std::thread::spawn(move || {
            let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            for statement in rx {
                statement(&mut client);
            }
        });
        Conn(tx)
    }

    async fn run<T: Send + 'static>(&self, f: impl FnOnce(&mut postgres::Client) -> T + Send + 'static) -> T {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.0.send(Box::new(move |c| drop(tx.send(f(c))))).unwrap();
        rx.await.unwrap()
    }

    /// How many advisory locks are granted on the whole server.
    async fn advisory_locks(&self) -> i64 {
        self.run(|c| {
            c.query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted",
                &[],
            )
            .unwrap()
            .get(0)
        })
        .await
    }
}

/// An attempt stuck on the server (the owner record's `INSERT` waits for a
/// schema change's table lock, with the advisory lock already granted)
/// ends by the caller's deadline, lets the advisory lock go on the server,
/// and holds up neither the heartbeats of the session's other locks nor a
/// plain `acquire`, which waits the stall out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_attempt_ends_by_its_deadline_and_leaves_nothing_held() {
    let server = Server::start();
    // Attempts get at most a quarter of the lease each.
    let slow = |server: &Server| {
        builder(server)
            .lease(Duration::from_secs(2))
            .renew_interval(Duration::from_millis(200))
    };
    let a = slow(&server).build().unwrap();
    let b = slow(&server).build().unwrap();
    let (job, other, kept) = (unique("job"), unique("other"), unique("kept"));
    let held = a.acquire(&kept).await.unwrap();

    let blocker = Conn::open(server.url());
    blocker
        .run(|c| {
            c.batch_execute("BEGIN; LOCK TABLE leasehold_locks IN ACCESS EXCLUSIVE MODE")
                .unwrap()
        })
        .await;
    let waiting = {
        let (a, other) = (a.clone(), other.clone());
        tokio::spawn(async move { a.acquire(&other).await })
    };
    let started = Instant::now();
    let err = a.acquire_timeout(&job, Duration::from_secs(1)).await.unwrap_err();
    let took = started.elapsed();
    assert!(err.is_timeout(), "{err}");
    assert!(took < Duration::from_secs(2), "timed out after {took:?}");

    // Still stalled: the timed-out attempt holds nothing on the server
    // (only `kept` is held, and at times `other`'s current attempt).
    tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(500)))
        .await
        .unwrap();
    assert!(!waiting.is_finished(), "a plain acquire waits the stall out");
    waiting.abort();
    let _ = waiting.await;
    let deadline = Instant::now() + Duration::from_secs(2);
    while blocker.advisory_locks().await != 1 {
        assert!(
            Instant::now() < deadline,
            "an attempt's lock is left on the server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!held.is_lost(), "heartbeats got through between attempts");

    let waiting = {
        let (a, other) = (a.clone(), other.clone());
        tokio::spawn(async move { a.acquire(&other).await })
    };
    tokio::time::sleep(Duration::from_millis(600)).await;
    blocker.run(|c| c.batch_execute("COMMIT").unwrap()).await;
    let taken = b
        .acquire_timeout(&job, Duration::from_secs(3))
        .await
        .expect("the name is free once the stall ends");
    let other = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the plain acquire gets the lock after the stall")
        .unwrap()
        .unwrap();
    held.ensure_held().await.unwrap();
    drop((taken, other, held));
}

/// An unlock that the server refuses (an error, or "not held") is retried,
/// then the session is reset: the server drops the lock, so others can
/// take it, and the session's other holders report the loss.
///
/// The failure is injected with a `public.pg_advisory_unlock(bigint)` that
/// a database-wide `search_path = public, pg_catalog` puts before the
/// built-in one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_unlock_resets_the_session_and_frees_the_lock() {
    let server = Server::start();
    if server.external.is_some() {
        eprintln!("skipped: would change an external server's database settings (LEASEHOLD_PG_URL)");
        return;
    }
    server.sql(|c| {
        c.batch_execute(
            "CREATE TABLE unlock_fault (mode text);
             INSERT INTO unlock_fault VALUES ('none');
             CREATE FUNCTION public.pg_advisory_unlock(k bigint) RETURNS boolean
             LANGUAGE plpgsql AS $$
             BEGIN
                 CASE (SELECT mode FROM unlock_fault)
                     WHEN 'error' THEN RAISE EXCEPTION 'injected unlock failure';
                     WHEN 'false' THEN RETURN false;
                     ELSE RETURN pg_catalog.pg_advisory_unlock(k);
                 END CASE;
             END $$;
             ALTER DATABASE postgres SET search_path = public, pg_catalog;",
        )
        .unwrap()
    });
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let fault = Conn::open(server.url());
    for mode in ["error", "false"] {
        let (x, y) = (unique("x"), unique("y"));
        let gx = a.acquire(&x).await.unwrap();
        let gy = a.acquire(&y).await.unwrap();
        fault
            .run(move |c| c.execute("UPDATE unlock_fault SET mode = $1", &[&mode]).unwrap())
            .await;
        drop(gx);
        let freed = b
            .acquire_timeout(&x, Duration::from_secs(3))
            .await
            .unwrap_or_else(|e| panic!("{mode}: the lock stayed taken: {e}"));
        tokio::time::timeout(Duration::from_secs(2), gy.lost())
            .await
            .unwrap_or_else(|_| panic!("{mode}: the reset is reported to the session's other holders"));
        match gy.ensure_held().await {
            Err(Error::Lost {
                reason: LossReason::SessionLost,
                ..
            }) => {}
            other => panic!("{mode}: expected a lost session, got {other:?}"),
        }
        // Back to the built-in unlock before anything else unlocks.
        fault
            .run(|c| c.execute("UPDATE unlock_fault SET mode = 'none'", &[]).unwrap())
            .await;
        // y is free too, once gy's lease is surely over: its session was
        // reset under it (it could have been running until then).
        let y_again = b
            .acquire_timeout(&y, Duration::from_secs(3))
            .await
            .unwrap_or_else(|e| panic!("{mode}: y stayed taken: {e}"));
        assert!(gy.is_lost());
        drop((freed, gy, y_again));
        // The backend reconnects for new acquisitions.
        let again = a.acquire_timeout(&x, Duration::from_secs(5)).await.unwrap();
        again.release().await.unwrap();
    }
}

/// Waits until `check` holds, for at most `within`.
async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How many Lockers (holder ids) `holders` come from.
fn lockers_of(holders: &[leasehold::Owner]) -> usize {
    let mut ids: Vec<_> = holders.iter().map(|h| h.holder_id().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.len()
}

/// Readers on two connections overlap, and keep a writer out until the
/// last one leaves; a shared holder's token is the counter as it stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_readers_overlap_and_exclude_a_writer() {
    let server = Server::start();
    shared_readers_overlap(&server.url()).await;
}

/// Shared locks through the server (or a pooler in front of it) at `url`.
async fn shared_readers_overlap(url: &str) {
    let a = builder_at(url).build().unwrap();
    let b = builder_at(url).build().unwrap();
    let cat = unique("cat");

    let first = a.acquire(&cat).await.unwrap();
    let written = first.fencing_token().unwrap();
    assert!(
        b.try_acquire_shared(&cat).await.unwrap().is_none(),
        "a reader beside a writer"
    );
    drop(first);

    let r1 = tokio::time::timeout(Duration::from_secs(3), a.acquire_shared(&cat))
        .await
        .expect("free once the writer left")
        .unwrap();
    let r2 = b.acquire_shared(&cat).await.unwrap();
    let r3 = a.acquire_shared(&cat).await.unwrap();
    assert!(r1.is_shared() && r2.is_shared() && r3.is_shared());
    for r in [&r1, &r2, &r3] {
        let token = r.fencing_token().unwrap();
        assert!(
            token >= written,
            "a reader's token {token} is below the writer's {written}"
        );
    }
    assert!(b.try_acquire(&cat).await.unwrap().is_none());
    assert!(a.try_acquire(&cat).await.unwrap().is_none(), "nor its own Locker");
    assert!(
        b.acquire_timeout(&cat, Duration::from_millis(200))
            .await
            .unwrap_err()
            .is_timeout()
    );
    let info = b.inspect(&cat).await.unwrap().expect("held");
    assert_eq!(info.kind(), LockKind::Shared);
    assert!(!info.is_stale());
    // Two Lockers (a Locker's shared guards may share one hold, or not).
    assert_eq!(lockers_of(info.holders()), 2, "{:?}", info.holders());

    drop(r1);
    assert!(b.try_acquire(&cat).await.unwrap().is_none(), "r3 still reads");
    drop(r3);
    assert!(b.try_acquire(&cat).await.unwrap().is_none(), "r2 still reads");
    let writer = {
        let (b, cat) = (b.clone(), cat.clone());
        tokio::spawn(async move { b.acquire(&cat).await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(r2);
    let w = tokio::time::timeout(Duration::from_secs(3), writer)
        .await
        .expect("the writer gets in once every reader left")
        .unwrap();
    assert!(!w.is_shared());
    let token = w.fencing_token().unwrap();
    assert!(
        token > written,
        "tokens grow past the readers': {token} after {written}"
    );
    assert!(a.try_acquire_shared(&cat).await.unwrap().is_none());
    drop(w);
    let again = tokio::time::timeout(Duration::from_secs(3), a.acquire_shared(&cat))
        .await
        .unwrap()
        .unwrap();
    again.release().await.unwrap();
    assert!(a.holders(&cat).await.unwrap().is_empty());
    assert!(!b.list().await.unwrap().iter().any(|l| l.name() == cat));
}

/// Behind a pooler in transaction (or statement) mode, session advisory
/// locks exclude nothing: the Locker refuses to build, with an error that
/// names transaction pooling and says what to do, whether the pooler
/// hands its one server session to every client (a pool of one, or a
/// client alone) or has several; and it leaves no lock on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_pooler_is_refused_by_name() {
    let Some(binary) = pgbouncer::binary_or_skip() else {
        return;
    };
    let server = Server::start();
    // Server sessions handed out most recently used first (PgBouncer's
    // default), or in turn.
    for order in ["server_round_robin = 0", "server_round_robin = 1"] {
        for mode in ["transaction", "statement"] {
            for pool in [1, 4] {
                let bouncer = pgbouncer::Bouncer::start_with(&binary, &server, mode, pool, order);
                match builder_at(&bouncer.url()).build() {
                    Err(err @ Error::UnstableSession { .. }) => {
                        let text = err.to_string();
                        assert!(
                            text.contains("transaction pooling")
                                && text.contains("pool_mode = session")
                                && text.contains("directly"),
                            "{text}"
                        );
                        eprintln!("{mode} mode, a pool of {pool}, {order}: {text}");
                    }
                    other => panic!(
                        "{mode} mode, a pool of {pool}, {order}: {:?}\n{}",
                        other.map(|_| ()),
                        bouncer.log()
                    ),
                }
            }
        }
    }
    let locks: i64 = server.sql(|c| {
        c.query_one("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'", &[])
            .unwrap()
            .get(0)
    });
    assert_eq!(locks, 0, "the refusal took no advisory lock");
}

/// Through a pooler in session mode each client connection keeps one
/// server session: exclusive and shared locks work as on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_pooler_serves_exclusive_and_shared_locks() {
    let Some(binary) = pgbouncer::binary_or_skip() else {
        return;
    };
    let server = Server::start();
    let bouncer = pgbouncer::Bouncer::start(&binary, &server, "session", 20);
    the_same_api(&bouncer.url()).await;
    shared_readers_overlap(&bouncer.url()).await;
}

/// A writer waiting for readers keeps new readers out (of every Locker);
/// the readers it found finish, then it gets in, then the held-back
/// readers do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_holds_back_new_readers_on_a_server() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let c = builder(&server).build().unwrap();
    let late = builder(&server).build().unwrap();
    let cat = unique("cat");
    let r1 = a.acquire_shared(&cat).await.unwrap();
    let r2 = c.acquire_shared(&cat).await.unwrap();
    let writer = {
        let (b, cat) = (b.clone(), cat.clone());
        tokio::spawn(async move {
            let w = b.acquire(&cat).await.unwrap();
            (Instant::now(), w)
        })
    };
    // Give the writer time to find the readers and announce itself.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        late.try_acquire_shared(&cat).await.unwrap().is_none(),
        "a reader overtook a waiting writer"
    );
    assert!(b.try_acquire_shared(&cat).await.unwrap().is_none());
    let sem = late.semaphore(&unique("other"), 2).unwrap();
    assert!(
        sem.try_acquire().await.unwrap().is_some(),
        "other names are not held back"
    );
    let held_back = {
        let (late, cat) = (late.clone(), cat.clone());
        tokio::spawn(async move {
            let r = late.acquire_shared(&cat).await.unwrap();
            (Instant::now(), r)
        })
    };
    // The readers the writer found keep reading, and it keeps waiting.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!r1.is_lost() && !r2.is_lost());
        assert!(!writer.is_finished() && !held_back.is_finished());
        assert!(late.try_acquire_shared(&cat).await.unwrap().is_none());
    }
    drop(r1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!writer.is_finished(), "r2 still reads");
    assert!(!held_back.is_finished(), "a reader overtook the writer");
    drop(r2);
    let (wrote, w) = tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .expect("the writer gets in")
        .unwrap();
    assert!(!w.is_shared());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!held_back.is_finished(), "a reader beside the writer");
    drop(w);
    let (read, r) = tokio::time::timeout(Duration::from_secs(5), held_back)
        .await
        .expect("the held-back reader gets in after the writer")
        .unwrap();
    assert!(read > wrote);
    assert!(r.is_shared());
}

/// Tasks on two Lockers share a semaphore of three permits: never more
/// than three inside at once, every permit with a token of its own, and
/// each holder holds the name's key shared and one slot on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_never_exceeds_its_permits_on_a_server() {
    let server = Server::start();
    let lockers = [
        builder(&server).build().unwrap(),
        builder(&server).build().unwrap(),
    ];
    let gpu = unique("gpu");
    let inside = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let most = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for locker in &lockers {
        let sem = locker.semaphore(&gpu, 3).unwrap();
        for _ in 0..4 {
            let (sem, inside, most, tokens) = (
                sem.clone(),
                Arc::clone(&inside),
                Arc::clone(&most),
                Arc::clone(&tokens),
            );
            tasks.push(tokio::spawn(async move {
                for _ in 0..15 {
                    let permit = sem.acquire().await.unwrap();
                    let now = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                    assert!(now <= 3, "{now} holders of 3 permits");
                    tokens.lock().unwrap().push(permit.fencing_token().unwrap());
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    drop(permit);
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        most.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "the permits were shared"
    );
    let mut tokens = tokens.lock().unwrap().clone();
    let all = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), all, "a token of its own per permit");

    // Three permits held: three slots and three shared holds of the name,
    // nothing more (one slot per attempt).
    let sems: Vec<_> = lockers.iter().map(|l| l.semaphore(&gpu, 3).unwrap()).collect();
    let p1 = sems[0].acquire().await.unwrap();
    let p2 = sems[0].acquire().await.unwrap();
    let p3 = sems[1].acquire().await.unwrap();
    assert!(sems[0].try_acquire().await.unwrap().is_none());
    assert!(sems[1].try_acquire().await.unwrap().is_none());
    let info = lockers[1].inspect(&gpu).await.unwrap().expect("held");
    assert_eq!(info.kind(), LockKind::Semaphore { permits: 3 });
    assert_eq!(info.holders().len(), 3);
    let conn = Conn::open(server.url());
    let (exclusive, shared): (i64, i64) = conn
        .run(|c| {
            let row = c
                .query_one(
                    "SELECT count(*) FILTER (WHERE mode = 'ExclusiveLock'),
                            count(*) FILTER (WHERE mode = 'ShareLock')
                     FROM pg_locks WHERE locktype = 'advisory' AND granted",
                    &[],
                )
                .unwrap();
            (row.get(0), row.get(1))
        })
        .await;
    // A session holding the key shared twice shows one row.
    assert_eq!((exclusive, shared), (3, 2));
    // An exclusive acquisition waits for every permit holder.
    assert!(lockers[1].try_acquire(&gpu).await.unwrap().is_none());
    drop((p1, p2, p3));
    let w = tokio::time::timeout(Duration::from_secs(3), lockers[1].acquire(&gpu))
        .await
        .unwrap()
        .unwrap();
    assert!(
        sems[0].try_acquire().await.unwrap().is_none(),
        "a permit beside a writer"
    );
    drop(w);
    eventually(Duration::from_secs(3), "locks left on the server", || async {
        conn.advisory_locks().await == 0
    })
    .await;
}

/// A name is held one way at a time: a semaphore of another count, or
/// shared and semaphore holders, are refused with `KindMismatch`, whether
/// a slot is free or not, and on the same Locker too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinds_and_permit_counts_must_agree_on_a_server() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let gpu = unique("gpu");
    let two_a = a.semaphore(&gpu, 2).unwrap();
    let two_b = b.semaphore(&gpu, 2).unwrap();
    let p1 = two_a.acquire().await.unwrap();
    let p2 = two_b.acquire().await.unwrap();
    assert!(two_a.try_acquire().await.unwrap().is_none());
    // A slot free for three permits: taken, then refused.
    let three = b.semaphore(&gpu, 3).unwrap();
    match three.try_acquire().await {
        Err(Error::KindMismatch { name, held, asked }) => {
            assert_eq!(name, gpu);
            assert!(held.contains('2') && asked.contains('3'), "{held} / {asked}");
        }
        other => panic!("expected a kind mismatch, got {other:?}"),
    }
    assert!(matches!(
        three.acquire_timeout(Duration::from_secs(1)).await,
        Err(Error::KindMismatch { .. })
    ));
    // No slot free for one permit: refused all the same.
    let one = a.semaphore(&gpu, 1).unwrap();
    assert!(matches!(one.try_acquire().await, Err(Error::KindMismatch { .. })));
    for locker in [&a, &b] {
        assert!(matches!(
            locker.try_acquire_shared(&gpu).await,
            Err(Error::KindMismatch { .. })
        ));
    }
    assert_eq!(
        a.holders(&gpu).await.unwrap().len(),
        2,
        "the refused left no holder"
    );
    drop((p1, p2));
    eventually(Duration::from_secs(3), "the permits are released", || async {
        a.holders(&gpu).await.unwrap().is_empty()
    })
    .await;

    // Shared holders refuse semaphores.
    let r = a.acquire_shared(&gpu).await.unwrap();
    assert!(matches!(
        two_b.try_acquire().await,
        Err(Error::KindMismatch { .. })
    ));
    assert!(matches!(
        two_a.try_acquire().await,
        Err(Error::KindMismatch { .. })
    ));
    // On a server, dropping a guard queues its unlock: wait until the name
    // is free before a semaphore of another count may take it (until then
    // the refusal is right: it is still held shared).
    drop(r);
    eventually(Duration::from_secs(3), "the shared hold is released", || async {
        a.holders(&gpu).await.unwrap().is_empty()
    })
    .await;
    // Free again: any kind may take it.
    let p = tokio::time::timeout(Duration::from_secs(3), three.acquire())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        b.inspect(&gpu).await.unwrap().unwrap().kind(),
        LockKind::Semaphore { permits: 3 }
    );
    drop(p);
    let conn = Conn::open(server.url());
    eventually(Duration::from_secs(3), "locks left on the server", || async {
        conn.advisory_locks().await == 0
    })
    .await;
}

/// `holders()` and `list()` show every shared holder (one per Locker) and
/// every permit holder, with its pid and token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_lists_every_shared_holder_on_a_server() {
    let server = Server::start();
    let lockers: Vec<Locker> = (0..3).map(|_| builder(&server).build().unwrap()).collect();
    let (cat, gpu) = (unique("cat"), unique("gpu"));
    let mut guards = Vec::new();
    for locker in &lockers {
        guards.push(locker.acquire_shared(&cat).await.unwrap());
        guards.push(locker.acquire_shared(&cat).await.unwrap());
        guards.push(locker.semaphore(&gpu, 5).unwrap().acquire().await.unwrap());
    }
    let holders = lockers[0].holders(&cat).await.unwrap();
    // Every Locker's hold: one per Locker, or one per guard if a Locker
    // does not join its own hold.
    assert_eq!(lockers_of(&holders), 3, "{holders:?}");
    assert!(holders.len() == 3 || holders.len() == 6, "{holders:?}");
    assert!(holders.iter().all(|h| h.pid() == Some(std::process::id())));
    assert!(
        holders
            .windows(2)
            .all(|w| w[0].acquired_at() <= w[1].acquired_at()),
        "oldest first"
    );
    let owner = lockers[1].holder(&cat).await.unwrap().expect("held");
    assert_eq!(owner, holders[0]);
    let list = lockers[2].list().await.unwrap();
    let shown = list.iter().find(|l| l.name() == cat).expect("listed");
    assert_eq!(shown.kind(), LockKind::Shared);
    assert_eq!(shown.holders().len(), holders.len());
    let sem = list.iter().find(|l| l.name() == gpu).expect("listed");
    assert_eq!(sem.kind(), LockKind::Semaphore { permits: 5 });
    assert_eq!(sem.holders().len(), 3);
    let mut tokens: Vec<_> = sem.holders().iter().map(|h| h.fencing_token().unwrap()).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "a token per permit");

    // Leaving shows at once.
    guards.truncate(3);
    let conn = Conn::open(server.url());
    eventually(Duration::from_secs(3), "left holders still shown", || async {
        lockers_of(&lockers[0].holders(&cat).await.unwrap()) == 1
            && lockers[0].holders(&gpu).await.unwrap().len() == 1
    })
    .await;
    drop(guards);
    eventually(Duration::from_secs(3), "rows left behind", || async {
        conn.run(|c| {
            c.query_one("SELECT count(*) FROM leasehold_holders", &[])
                .unwrap()
                .get::<_, i64>(0)
        })
        .await
            == 0
    })
    .await;
    assert!(lockers[0].list().await.unwrap().is_empty());
}

/// A shared holder whose session is terminated reports the loss at its
/// next heartbeat; the server drops its hold, so a writer gets in, and it
/// is no longer listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_sessions_shared_hold_is_freed() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let c = builder(&server).build().unwrap();
    let cat = unique("cat");
    let doomed = a.acquire_shared(&cat).await.unwrap();
    let alive = c.acquire_shared(&cat).await.unwrap();
    let permit = a.semaphore(&unique("gpu"), 1).unwrap().acquire().await.unwrap();
    let id = doomed.owner().holder_id().unwrap().to_owned();
    let writer = {
        let (b, cat) = (b.clone(), cat.clone());
        tokio::spawn(async move { b.acquire(&cat).await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let name = cat.clone();
    server.sql(move |c| {
        let backend: i32 = c
            .query_one(
                "SELECT backend_pid FROM leasehold_holders WHERE name = $1 AND holder_id = $2",
                &[&name, &id],
            )
            .unwrap()
            .get(0);
        c.query_one("SELECT pg_terminate_backend($1)", &[&backend])
            .unwrap();
    });
    for guard in [&doomed, &permit] {
        tokio::time::timeout(Duration::from_secs(2), guard.lost())
            .await
            .expect("lost() within the heartbeat");
    }
    assert!(!alive.is_lost());
    let holders = b.holders(&cat).await.unwrap();
    assert_eq!(holders.len(), 1, "the dead holder is not listed: {holders:?}");
    assert_eq!(holders[0].holder_id(), alive.owner().holder_id());
    assert!(!writer.is_finished(), "the live reader still reads");
    drop(alive);
    let w = tokio::time::timeout(Duration::from_secs(3), writer)
        .await
        .expect("the dead reader's hold is gone")
        .unwrap();
    drop(w);
    drop((doomed, permit));
    // The Locker reconnects for new acquisitions.
    let again = tokio::time::timeout(Duration::from_secs(5), a.acquire_shared(&cat))
        .await
        .unwrap()
        .unwrap();
    again.release().await.unwrap();
}

/// Shared, permit and announced exclusive acquisitions dropped at every
/// point leave nothing held on the server: no advisory lock, no holder row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_shared_and_permit_waits_leave_nothing() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let (x, y) = (unique("x"), unique("y"));
    let conn = Conn::open(server.url());
    // x is held exclusively: shared and permit attempts wait.
    let writer = b.acquire(&x).await.unwrap();
    // y is read: an exclusive waiter announces itself, then goes away.
    let reader = b.acquire_shared(&y).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..150u64 {
        let a = a.clone();
        let (x, y) = (x.clone(), y.clone());
        let wait = Duration::from_micros(i * 53 % 5000);
        tasks.push(tokio::spawn(async move {
            let _ = match i % 3 {
                0 => a.acquire_shared_timeout(&x, wait).await,
                1 => a.semaphore(&x, 2).unwrap().acquire_timeout(wait).await,
                _ => a.acquire_timeout(&y, wait).await,
            };
        }));
    }
    let aborted: Vec<_> = (0..3)
        .map(|i| {
            let (a, x, y) = (a.clone(), x.clone(), y.clone());
            tokio::spawn(async move {
                let _ = match i {
                    0 => a.acquire_shared(&x).await,
                    1 => a.semaphore(&x, 2).unwrap().acquire().await,
                    _ => a.acquire(&y).await,
                };
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for t in aborted {
        t.abort();
        let _ = t.await;
    }
    drop((writer, reader));
    eventually(
        Duration::from_secs(5),
        "locks or rows left on the server",
        || async {
            let locks = conn.advisory_locks().await;
            let rows: i64 = conn
                .run(|c| {
                    c.query_one("SELECT count(*) FROM leasehold_holders", &[])
                        .unwrap()
                        .get(0)
                })
                .await;
            locks == 0 && rows == 0
        },
    )
    .await;
    // Nothing keeps anyone out. (An attempt of an aborted task that was
    // already on its way to the server may still take a permit and give it
    // back at once: for that moment x is a semaphore, which a shared
    // acquisition is told.)
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match b.try_acquire_shared(&x).await {
            Ok(Some(r)) => {
                drop(r);
                break;
            }
            Ok(None) | Err(leasehold::Error::KindMismatch { .. }) => {
                assert!(std::time::Instant::now() < deadline, "x stays taken");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    let w = tokio::time::timeout(Duration::from_secs(3), b.acquire(&x))
        .await
        .unwrap()
        .unwrap();
    drop(w);
    assert!(
        b.try_acquire_shared(&y).await.unwrap().is_some(),
        "no announcement is left"
    );
}

#[path = "support/api_conformance.rs"]
#[macro_use]
mod api_conformance;

fn server() -> (Server, LockerBuilder) {
    let server = Server::start();
    let builder = Locker::builder().postgres(server.url());
    (server, builder)
}

// The behaviour every backend shares, as the file strategies run it.
// Upgradable locks are kept on every platform the server tests run on.
api_conformance!(conformance, server(), upgradable_refused = None);

/// Settings that only mean something for lock files are refused with a
/// PostgreSQL server, not silently ignored: a user who set a directory
/// expects the locks there. Checked before connecting (no server needed).
#[test]
fn file_settings_with_a_server_are_refused() {
    use leasehold::{PathStyle, Strategy};
    let dir = tempfile::tempdir().unwrap();
    let server = "host=/nonexistent-leasehold-test user=nobody";
    let cases: [(&str, LockerBuilder); 7] = [
        (
            "directory",
            Locker::builder().postgres(server).directory(dir.path()),
        ),
        (
            "strategy",
            Locker::builder().postgres(server).strategy(Strategy::Directory),
        ),
        (
            "path_style",
            Locker::builder().postgres(server).path_style(PathStyle::Plain),
        ),
        (
            "allow_insecure_directory",
            Locker::builder().postgres(server).allow_insecure_directory(true),
        ),
        ("durable", Locker::builder().postgres(server).durable(true)),
        (
            "unreadable_grace",
            Locker::builder()
                .postgres(server)
                .unreadable_grace(Duration::from_secs(3)),
        ),
        (
            "foreign_lease",
            Locker::builder().postgres(server).foreign_lease(None),
        ),
    ];
    for (setting, builder) in cases {
        match builder.build() {
            Err(Error::InvalidConfig { reason }) => assert!(reason.contains(setting), "{reason}"),
            other => panic!("{setting}: expected InvalidConfig, got {other:?}"),
        }
    }
    // Without them, the same builder gets as far as connecting.
    match Locker::builder().postgres(server).build() {
        Err(Error::Backend { .. }) => {}
        other => panic!("expected a connection failure, got {other:?}"),
    }
}

/// Owner fields go into the owner tables with every kind of lock, and
/// another connection's readers see them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_fields_are_kept_on_a_server() {
    use leasehold::FieldValue;
    let server = Server::start();
    let holder = builder(&server)
        .owner_field("host", "127.0.0.1")
        .owner_field("port", 8080u16)
        .owner_field("primary", true)
        .build()
        .unwrap();
    let reader = builder(&server).build().unwrap();
    let (exclusive, shared, permits) = (unique("dev-server"), unique("catalog"), unique("gpu"));

    let _guard = holder.acquire(&exclusive).await.unwrap();
    let seen = reader.holder(&exclusive).await.unwrap().expect("held");
    assert_eq!(seen.field("host").and_then(FieldValue::as_str), Some("127.0.0.1"));
    assert_eq!(seen.field("port").and_then(FieldValue::as_i64), Some(8080));
    assert_eq!(seen.field("primary").and_then(FieldValue::as_bool), Some(true));

    let _reading = holder.acquire_shared(&shared).await.unwrap();
    let _also = reader.acquire_shared(&shared).await.unwrap();
    let holders = reader.holders(&shared).await.unwrap();
    assert_eq!(holders.len(), 2);
    assert_eq!(
        holders.iter().filter(|h| h.field("port").is_some()).count(),
        1,
        "{holders:?}"
    );

    let _permit = holder.semaphore(&permits, 2).unwrap().acquire().await.unwrap();
    let info = reader.inspect(&permits).await.unwrap().expect("held");
    assert_eq!(
        info.holders()[0].field("port").and_then(FieldValue::as_i64),
        Some(8080)
    );

    // A Locker without fields taking the name after it leaves none behind.
    drop(_guard);
    let _plain = reader.acquire(&exclusive).await.unwrap();
    let seen = reader.holder(&exclusive).await.unwrap().expect("held");
    assert_eq!(seen.fields().count(), 0, "{seen:?}");
}

/// A new `Locker` (or a reconnection) on tables that already have every
/// column takes no ACCESS EXCLUSIVE lock on them: a reader left idle in a
/// transaction on `leasehold_holders` (a monitoring query, say) must not
/// stall every new connection, and with it, behind the lock it waits for,
/// every acquisition of every other session.
#[test]
fn a_reader_idle_in_a_transaction_does_not_block_new_lockers() {
    use std::sync::mpsc;
    let server = Server::start();
    // The tables exist, with every column.
    let first = builder(&server).build().unwrap();
    drop(first.blocking_try_acquire(&unique("setup")).unwrap());
    let url = server.url();
    let (ready_tx, ready) = mpsc::channel();
    let (stop, stop_rx) = mpsc::channel::<()>();
    let reader = std::thread::spawn(move || {
        let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        client
            .batch_execute(
                "BEGIN; SELECT count(*) FROM leasehold_holders; SELECT count(*) FROM leasehold_locks",
            )
            .unwrap();
        ready_tx.send(()).unwrap();
        let _ = stop_rx.recv_timeout(Duration::from_secs(60));
        client.batch_execute("COMMIT").unwrap();
    });
    ready.recv().unwrap();
    let (done_tx, done) = mpsc::channel();
    let url_builder = builder(&server);
    std::thread::spawn(move || {
        let result = url_builder
            .build()
            .and_then(|locker| locker.blocking_try_acquire(&unique("job")).map(|g| g.is_some()));
        let _ = done_tx.send(result.map_err(|e| e.to_string()));
    });
    let outcome = done.recv_timeout(Duration::from_secs(10));
    stop.send(()).unwrap();
    reader.join().unwrap();
    assert_eq!(
        outcome.map_err(|_| "blocked behind the idle reader"),
        Ok(Ok(true)),
        "a new Locker must not wait for an ACCESS EXCLUSIVE lock on the tables"
    );
}

/// Tables an earlier version made (without `holder_token` and `fields`)
/// gain the columns when a new `Locker` connects, with rows in them, and
/// owner fields then work for every kind of lock.
#[test]
fn tables_of_an_earlier_version_gain_the_new_columns() {
    let server = Server::start();
    server.sql(|client| {
        client
            .batch_execute(
                "DROP TABLE IF EXISTS leasehold_locks, leasehold_holders;
                 CREATE TABLE leasehold_locks (
                     name text PRIMARY KEY, key bigint NOT NULL,
                     fencing_token bigint NOT NULL DEFAULT 0, holder_id text, hostname text,
                     pid integer, acquired_at timestamptz, backend_pid integer);
                 INSERT INTO leasehold_locks (name, key, fencing_token) VALUES ('old', 1, 7);
                 CREATE TABLE leasehold_holders (
                     id text PRIMARY KEY, name text NOT NULL, key bigint NOT NULL, mode text NOT NULL,
                     permits bigint, slot bigint, holder_id text, hostname text, pid integer,
                     acquired_at timestamptz, backend_pid integer NOT NULL, holder_token bigint);",
            )
            .unwrap()
    });
    let locker = builder(&server).owner_field("port", 8080u16).build().unwrap();
    let (exclusive, shared) = (unique("job"), unique("catalog"));
    let guard = locker.blocking_acquire(&exclusive).unwrap();
    let seen = locker.blocking_try_acquire("old").unwrap().expect("free");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let owner = locker.holder(&exclusive).await.unwrap().expect("held");
        assert_eq!(owner.field("port").and_then(|v| v.as_i64()), Some(8080));
        let _reading = locker.acquire_shared(&shared).await.unwrap();
        let holders = locker.holders(&shared).await.unwrap();
        assert_eq!(holders[0].field("port").and_then(|v| v.as_i64()), Some(8080));
    });
    drop((guard, seen));
    let columns: Vec<String> = server.sql(|client| {
        client
            .query(
                "SELECT table_name || '.' || column_name FROM information_schema.columns
                 WHERE column_name IN ('fields', 'holder_token') ORDER BY 1",
                &[],
            )
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    });
    assert_eq!(
        columns,
        [
            "leasehold_holders.fields",
            "leasehold_holders.holder_token",
            "leasehold_locks.fields",
            "leasehold_locks.holder_token"
        ]
    );
}

/// Services started together against a fresh database all connect: the
/// first use of the tables creates them once, whoever comes first.
///
/// `CREATE TABLE IF NOT EXISTS` is not safe against itself in PostgreSQL
/// (two sessions can both find the table missing, and the second's insert
/// into the catalog then violates `pg_type`'s unique index): before the
/// setup took an advisory lock, some of these `build()`s failed with
/// "create the leasehold tables": duplicate key value violates unique
/// constraint "pg_type_typname_nsp_index". Found by `tests/torture.rs`
/// `torture_postgres`, whose children all connect at once.
#[test]
fn lockers_connecting_at_once_to_a_fresh_database_all_build() {
    let server = Server::start();
    for round in 0..5 {
        // A fresh database each round: no tables yet.
        server.sql(|c| {
            c.batch_execute("DROP TABLE IF EXISTS leasehold_locks, leasehold_holders")
                .unwrap()
        });
        let start = Arc::new(std::sync::Barrier::new(8));
        let builds: Vec<_> = (0..8)
            .map(|_| {
                let (start, builder) = (Arc::clone(&start), builder(&server));
                std::thread::spawn(move || {
                    start.wait();
                    builder.build().map(drop).map_err(|e| {
                        let source = std::error::Error::source(&e).map(ToString::to_string);
                        format!("{e}: {}", source.unwrap_or_default())
                    })
                })
            })
            .collect();
        let failed: Vec<String> = builds
            .into_iter()
            .filter_map(|b| b.join().unwrap().err())
            .collect();
        assert!(
            failed.is_empty(),
            "round {round}: {} of 8 failed: {failed:?}",
            failed.len()
        );
    }
}

/// A name of `MAX_NAME_LEN` bytes that does not compress (PostgreSQL
/// compresses a long key before indexing it, and a btree entry must fit
/// in about 2700 bytes) is a lock on a server like any other, shared and
/// as a semaphore too; one byte more is refused before the server is
/// asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_name_works_on_a_server() {
    let (_server, builder) = server();
    let a = builder.clone().build().unwrap();
    let b = builder.build().unwrap();
    // Printable ASCII from a xorshift generator: nothing a compressor
    // finds repeats in.
    let mut x = uuid::Uuid::new_v4().as_u64_pair().0 | 1;
    let longest: String = (0..leasehold::MAX_NAME_LEN)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'!' + (x % 94) as u8)
        })
        .collect();
    let guard = a.acquire(&longest).await.unwrap();
    assert!(b.try_acquire(&longest).await.unwrap().is_none());
    let owner = b.holder(&longest).await.unwrap().expect("held");
    assert_eq!(owner.pid(), Some(std::process::id()));
    guard.release().await.unwrap();
    let shared = a.acquire_shared(&longest).await.unwrap();
    assert_eq!(b.holders(&longest).await.unwrap().len(), 1);
    shared.release().await.unwrap();
    let sem = b.semaphore(&longest, 2).unwrap();
    let permit = sem.acquire().await.unwrap();
    permit.release().await.unwrap();
    assert!(a.try_acquire(&longest).await.unwrap().is_some());

    let over = format!("{longest}x");
    assert!(matches!(
        a.try_acquire(&over).await,
        Err(Error::InvalidName { .. })
    ));
    assert!(matches!(a.holder(&over).await, Err(Error::InvalidName { .. })));
}

/// The server's wall clock in microseconds since the Unix epoch: the unit
/// of fencing tokens.
fn server_clock_us(server: &Server) -> u64 {
    server.sql(|c| {
        let us: i64 = c
            .query_one(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
                &[],
            )
            .unwrap()
            .get(0);
        u64::try_from(us).unwrap()
    })
}

/// Tokens count the server's clock in microseconds, so they keep growing
/// when the counters are emptied (`TRUNCATE`) between holders: exclusive
/// holders, permit holders, and a shared holder, whose token is the
/// counter as it stands (no less than any token before it, less than any
/// after it), also where the counter is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_growing_when_the_table_is_emptied() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let job = unique("job");
    let before = server_clock_us(&server);
    let first = a.acquire(&job).await.unwrap();
    let t1 = first.fencing_token().unwrap();
    let after = server_clock_us(&server);
    assert!(
        (before..=after + 8_193).contains(&t1),
        "a token is the server's clock in microseconds: {t1} read between {before} and {after}"
    );
    first.release().await.unwrap();
    let empty = || {
        server.sql(|c| {
            c.batch_execute("TRUNCATE leasehold_locks, leasehold_holders")
                .unwrap()
        });
    };
    empty();
    let second = b.acquire(&job).await.unwrap();
    let t2 = second.fencing_token().unwrap();
    assert!(t2 > t1, "tokens went back after TRUNCATE: {t1} then {t2}");
    second.release().await.unwrap();

    // A shared holder with the counter there, and with it gone.
    let shared = a.acquire_shared(&job).await.unwrap();
    let s1 = shared.fencing_token().unwrap();
    assert!(
        s1 >= t2,
        "a shared holder's token is below an earlier one: {t2} then {s1}"
    );
    shared.release().await.unwrap();
    let third = b.acquire(&job).await.unwrap();
    let t3 = third.fencing_token().unwrap();
    assert!(t3 > s1, "{s1} then {t3}");
    third.release().await.unwrap();
    empty();
    let shared = a.acquire_shared(&job).await.unwrap();
    let s2 = shared.fencing_token().unwrap();
    assert!(
        s2 >= t3,
        "a shared holder's token went back after TRUNCATE: {t3} then {s2}"
    );
    shared.release().await.unwrap();
    let fourth = b.acquire(&job).await.unwrap();
    let t4 = fourth.fencing_token().unwrap();
    assert!(t4 > s2, "{s2} then {t4}");
    fourth.release().await.unwrap();

    // Permit holders, emptied between them and while one holds.
    let sem = a.semaphore(&job, 2).unwrap();
    empty();
    let p1 = sem.acquire().await.unwrap();
    let p1_token = p1.fencing_token().unwrap();
    assert!(p1_token > t4, "{t4} then {p1_token}");
    empty();
    let p2 = b.semaphore(&job, 2).unwrap().acquire().await.unwrap();
    let p2_token = p2.fencing_token().unwrap();
    assert!(p2_token > p1_token, "{p1_token} then {p2_token}");
    drop((p1, p2));
    let last = a.acquire_timeout(&job, Duration::from_secs(5)).await.unwrap();
    assert!(last.fencing_token().unwrap() > p2_token);
}

/// A table dropped under a running `Locker` is reported as what it is,
/// naming the table; the holders keep their locks (they hold them on the
/// server, not in the table), the same `Locker` creates the table again at
/// its next attempt, and tokens, from it or from a new `Locker`, keep
/// growing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_table_is_reported_and_tokens_keep_growing() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let (x, y) = (unique("x"), unique("y"));
    let held = a.acquire(&x).await.unwrap();
    let t1 = held.fencing_token().unwrap();
    server.sql(|c| c.batch_execute("DROP TABLE leasehold_locks").unwrap());
    match a.try_acquire(&y).await {
        Err(Error::MissingTable { table, .. }) => assert_eq!(table, "leasehold_locks"),
        other => panic!("expected MissingTable, got {other:?}"),
    }
    let err = a.try_acquire(&y).await;
    let message = match &err {
        Err(e) => e.to_string(),
        Ok(_) => String::new(),
    };
    // The table is back for the attempt after the one that found it gone.
    let other = err.unwrap_or_else(|e| panic!("the table is not back: {message}: {e:?}"));
    let other = other.expect("y is free");
    assert!(other.fencing_token().unwrap() > t1);
    held.ensure_held().await.unwrap();
    assert!(!held.is_lost());
    held.release().await.unwrap();
    drop(other);

    // Dropped again, and a new Locker makes it: tokens still grow.
    server.sql(|c| c.batch_execute("DROP TABLE leasehold_locks").unwrap());
    let c = builder(&server).build().unwrap();
    let again = c.acquire_timeout(&x, Duration::from_secs(5)).await.unwrap();
    assert!(again.fencing_token().unwrap() > t1);
    again.release().await.unwrap();

    // The holders' table too: a shared acquisition names it.
    server.sql(|c| c.batch_execute("DROP TABLE leasehold_holders").unwrap());
    match a.try_acquire_shared(&x).await {
        Err(Error::MissingTable { table, .. }) => assert_eq!(table, "leasehold_holders"),
        other => panic!("expected MissingTable, got {other:?}"),
    }
    let shared = a.try_acquire_shared(&x).await.unwrap().expect("x is free");
    assert!(shared.fencing_token().unwrap() > t1);
    assert_eq!(c.holders(&x).await.unwrap().len(), 1);
}

/// In a database whose encoding stores some characters in more bytes than
/// UTF-8 does (EUC_JP: "é" is 2 bytes in UTF-8, 3 in JIS X 0212), a name
/// of `MAX_NAME_LEN` bytes may not fit a btree index entry: it is refused
/// as too long for the server, before any lock is taken or row written,
/// and a name that fits there works. A character the encoding cannot
/// store is refused as a bad name too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_too_long_for_the_databases_encoding_is_refused() {
    let server = Server::start();
    if server.external.is_some() {
        eprintln!("skipped: needs a database of its own (LEASEHOLD_PG_URL)");
        return;
    }
    server.sql(|c| {
        c.batch_execute(
            "CREATE DATABASE leasehold_euc ENCODING 'EUC_JP' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0",
        )
        .unwrap()
    });
    let url = server.url().replace("dbname=postgres", "dbname=leasehold_euc");
    let a = Locker::builder().postgres(url.clone()).build().unwrap();
    // A letter of Latin-1 (2 bytes here, 3 there) and a printable ASCII
    // character, from a xorshift generator (nothing a compressor finds
    // repeats in, or the server would compress the entry until it fits):
    // 2,046 bytes here, 2,728 there. The server said "index row size 2744
    // exceeds btree version 4 maximum 2704".
    let letters: Vec<char> = "ÀÁÂÃÄÅÆÇÈÉÊËÌÍÎÏÑÒÓÔÕÖØÙÚÛÜÝÞßàáâãäåæçèéêëìíîïðñòóôõöøùúûüýþÿ"
        .chars()
        .collect();
    let mut x = uuid::Uuid::new_v4().as_u64_pair().0 | 1;
    let long: String = (0..leasehold::MAX_NAME_LEN / 3)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            [
                letters[(x % letters.len() as u64) as usize],
                char::from(b'!' + ((x >> 8) % 94) as u8),
            ]
        })
        .collect();
    assert_eq!(long.len(), 2046);
    for attempt in [a.try_acquire(&long).await, a.try_acquire_shared(&long).await] {
        match attempt {
            Err(Error::InvalidName { reason, .. }) => {
                assert!(reason.contains("too long for this PostgreSQL"), "{reason}");
                assert!(reason.contains("2,692 bytes"), "{reason}");
            }
            other => panic!("expected InvalidName, got {other:?}"),
        }
    }
    let (rows, locks): (i64, i64) = off_runtime_sql(url.clone(), |c| {
        let row = c
            .query_one(
                "SELECT (SELECT count(*) FROM leasehold_locks) + (SELECT count(*) FROM leasehold_holders),
                        (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted)",
                &[],
            )
            .unwrap();
        (row.get(0), row.get(1))
    });
    assert_eq!(
        (rows, locks),
        (0, 0),
        "the server was not asked to lock or record it"
    );
    // 1,600 bytes here, 2,400 there: it fits.
    let fits = "é".repeat(800);
    let guard = a.try_acquire(&fits).await.unwrap().expect("free");
    assert_eq!(
        a.holder(&fits).await.unwrap().unwrap().pid(),
        Some(std::process::id())
    );
    guard.release().await.unwrap();
    match a.try_acquire("emoji-😀").await {
        Err(Error::InvalidName { reason, .. }) => assert!(reason.contains("encoding"), "{reason}"),
        other => panic!("expected InvalidName, got {other:?}"),
    }
    assert!(a.try_acquire("plain").await.unwrap().is_some());
}

/// Runs `f` on a connection to `url`, off the test's runtime.
fn off_runtime_sql<T: Send + 'static>(
    url: String,
    f: impl FnOnce(&mut postgres::Client) -> T + Send + 'static,
) -> T {
    std::thread::spawn(move || f(&mut postgres::Client::connect(&url, postgres::NoTls).unwrap()))
        .join()
        .unwrap()
}

/// The application names of the client sessions on `server` named `app`
/// (or all of them but this one's), with what they last ran, once there
/// are `n` of them (or 10 s went by).
fn sessions_named(server: &Server, app: Option<&str>, n: usize) -> Vec<(String, String)> {
    sessions_until(server, app, |found| found.len() == n)
}

/// As [`sessions_named`], once `done` holds of what was found (or 10 s
/// went by): a session is listed from its connection on, before it has
/// run its first statement.
fn sessions_until(
    server: &Server,
    app: Option<&str>,
    done: impl Fn(&[(String, String)]) -> bool,
) -> Vec<(String, String)> {
    let since = Instant::now();
    loop {
        let app = app.map(str::to_owned);
        let found: Vec<(String, String)> = server.sql(move |c| {
            c.query(
                "SELECT application_name, query FROM pg_stat_activity
                  WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
                    AND ($1::text IS NULL OR application_name = $1)",
                &[&app],
            )
            .unwrap()
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect()
        });
        if done(&found) || since.elapsed() > Duration::from_secs(10) {
            return found;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A DBA finds a Locker's connections in `pg_stat_activity` by name: the
/// application's own (from its `postgres::Config`, or its URL), else
/// `leasehold/<version>`; two of them (the session and the listener),
/// and one more for each upgradable holding while it lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_name_themselves_unless_the_application_does() {
    let server = Server::start();
    let mut config: postgres::Config = server.url().parse().unwrap();
    let own = format!("billing-{}", uuid::Uuid::new_v4().simple());
    config.application_name(&own);
    let named = Locker::builder()
        .postgres_config(config.clone())
        .lease(Duration::from_secs(2))
        .build()
        .unwrap();
    let guard = named.acquire(&unique("named")).await.unwrap();
    // The listener's connection is listed before it has run LISTEN.
    let found = sessions_until(&server, Some(&own), |found| {
        found.len() == 2 && found.iter().any(|(_, query)| query == "LISTEN leasehold")
    });
    assert_eq!(found.len(), 2, "the session and the listener: {found:?}");
    assert!(
        found.iter().any(|(_, query)| query == "LISTEN leasehold"),
        "{found:?}"
    );
    let up = named.acquire_upgradable(&unique("up")).await.unwrap();
    assert_eq!(
        sessions_named(&server, Some(&own), 3).len(),
        3,
        "and the upgradable holding's"
    );
    drop(up);
    assert_eq!(sessions_named(&server, Some(&own), 2).len(), 2, "until it ends");
    guard.release().await.unwrap();
    drop(named);
    assert!(
        sessions_named(&server, Some(&own), 0).is_empty(),
        "closed with the Locker"
    );

    // Unnamed, from a Config or a URL: leasehold's name.
    let version = concat!("leasehold/", env!("CARGO_PKG_VERSION"));
    let external = server.external.is_some();
    for builder in [
        Locker::builder().postgres_config(server.url().parse().unwrap()),
        Locker::builder().postgres(server.url()),
    ] {
        let locker = builder.build().unwrap();
        drop(locker.acquire(&unique("unnamed")).await.unwrap());
        let found = sessions_named(&server, None, 2);
        if !external {
            assert_eq!(found.len(), 2, "{found:?}");
        }
        assert!(
            found.iter().filter(|(name, _)| name == version).count() >= 2,
            "{found:?}"
        );
        drop(locker);
        sessions_named(&server, None, 0);
    }
}

/// Without the feature `postgres-tls`, a Locker asked for TLS is refused
/// by `build()`, with a typed error, and opens no connection: it never
/// goes in clear text instead.
#[cfg(not(feature = "postgres-tls"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_without_the_feature_is_refused_not_ignored() {
    let server = Server::start();
    let app = format!("tls-{}", uuid::Uuid::new_v4().simple());
    for more in [
        "sslmode=require",
        "sslmode=verify-ca sslrootcert=system",
        "sslmode=verify-full sslrootcert=/etc/ssl/ca.pem",
    ] {
        let url = format!("{} application_name={app} {more}", server.url());
        match Locker::builder().postgres(url).build() {
            Err(Error::Unsupported { what }) => assert!(what.contains("postgres-tls"), "{what}"),
            other => panic!("{more}: expected Unsupported, got {other:?}"),
        }
    }
    let mut config: postgres::Config = server.url().parse().unwrap();
    config
        .application_name(&app)
        .ssl_mode(postgres::config::SslMode::Require);
    assert!(matches!(
        Locker::builder().postgres_config(config.clone()).build(),
        Err(Error::Unsupported { .. })
    ));
    config.ssl_mode(postgres::config::SslMode::Prefer);
    assert!(matches!(
        Locker::builder()
            .postgres_config(config)
            .postgres_ssl_mode(leasehold::PgSslMode::VerifyFull)
            .build(),
        Err(Error::Unsupported { .. })
    ));
    assert!(sessions_named(&server, Some(&app), 0).is_empty());
}

/// `Locker`s of one process with the same settings share one listener
/// connection (each keeps its own session): notifications wake waiters of
/// each of them, and the listener outlives any one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockers_with_the_same_settings_share_one_listener() {
    let server = Server::start();
    let own = format!("shared-{}", uuid::Uuid::new_v4().simple());
    let with = |app: &str| {
        Locker::builder()
            .postgres(format!("{} application_name={app}", server.url()))
            .lease(Duration::from_secs(2))
            // Only a notification wakes a waiter in time.
            .poll_interval(Duration::from_secs(30))
    };
    let a = with(&own).build().unwrap();
    let b = with(&own).build().unwrap();
    let found = sessions_until(&server, Some(&own), |found| {
        found.len() == 3 && found.iter().any(|(_, query)| query == "LISTEN leasehold")
    });
    assert_eq!(found.len(), 3, "two sessions and one listener: {found:?}");
    assert_eq!(
        found
            .iter()
            .filter(|(_, query)| query == "LISTEN leasehold")
            .count(),
        1,
        "{found:?}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;

    let name = unique("woken");
    let woken = |holder: Locker, waiter: Locker, name: String| async move {
        let guard = holder.acquire(&name).await.unwrap();
        let waiting = tokio::spawn(async move { waiter.acquire(&name).await.map(drop) });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        guard.release().await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken by the notification, not the 30 s poll")
            .unwrap()
            .unwrap();
        released.elapsed()
    };
    woken(a.clone(), b.clone(), name.clone()).await;
    woken(b.clone(), a.clone(), name.clone()).await;
    // The listener stays for `b` when `a` is gone.
    drop(a);
    assert_eq!(sessions_named(&server, Some(&own), 2).len(), 2);
    let other = format!("other-{}", uuid::Uuid::new_v4().simple());
    let c = with(&other).build().unwrap();
    woken(c.clone(), b.clone(), name).await;
    drop((b, c));
    assert!(sessions_named(&server, Some(&own), 0).is_empty());
}

/// Runs `call`, asserting that it returns within `bound` (and never
/// waiting for it much longer than that).
async fn within<T>(what: &str, bound: Duration, call: impl std::future::Future<Output = T>) -> T {
    let start = Instant::now();
    let result = tokio::time::timeout(bound * 4, call)
        .await
        .unwrap_or_else(|_| panic!("{what} still waits after {:?}", bound * 4));
    let took = start.elapsed();
    assert!(took < bound, "{what} took {took:?}, past its bound of {bound:?}");
    result
}

/// No call waits on the session thread past its own bound: with the
/// session's server process stopped (`SIGSTOP`: the session thread then
/// waits for an answer that does not come, and every command queues
/// behind it), an inspection fails with a timeout within its bound (a
/// quarter of the lease, at least a second), a confirmed release and a
/// check likewise, an attempt is busy within its deadline (a quarter of
/// the lease at most), and `acquire_timeout` times out. Before, all but
/// the attempts waited 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_call_waits_on_a_stalled_session_past_its_bound() {
    let server = Server::start();
    let locker = builder(&server).build().unwrap();
    let (held, other, shared) = (unique("held"), unique("other"), unique("shared"));
    let guard = locker.acquire(&held).await.unwrap();
    let reader = locker.acquire_shared(&shared).await.unwrap();
    let backend = pg_session::backend_of(&server, &held, pg_session::Holder::Exclusive);
    let stopped = pg_session::Stopped::stop(backend);
    // The next heartbeat (every 150 ms) stalls the session thread.
    tokio::time::sleep(Duration::from_millis(400)).await;

    // The lease is 900 ms: inspections wait a second, attempts 225 ms
    // (and 250 ms for the answer); the bounds below leave room for a
    // loaded machine, and are far below the 30 s of before.
    let bound = Duration::from_secs(3);
    let timed_out = |error: &Error| {
        std::error::Error::source(error)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some_and(|e| e.kind() == std::io::ErrorKind::TimedOut)
    };
    let error = within("holder()", bound, locker.holder(&held)).await.unwrap_err();
    assert!(timed_out(&error), "holder(): {error:?}");
    let error = within("list()", bound, locker.list()).await.unwrap_err();
    assert!(timed_out(&error), "list(): {error:?}");
    let error = within("holders()", bound, locker.holders(&shared))
        .await
        .unwrap_err();
    assert!(timed_out(&error), "holders(): {error:?}");
    assert!(
        within("try_acquire()", bound, locker.try_acquire(&other))
            .await
            .unwrap()
            .is_none(),
        "busy: the server did not answer"
    );
    assert!(
        within("try_acquire_shared()", bound, locker.try_acquire_shared(&other))
            .await
            .unwrap()
            .is_none()
    );
    let error = within(
        "acquire_timeout()",
        bound,
        locker.acquire_timeout(&other, Duration::from_millis(300)),
    )
    .await
    .unwrap_err();
    assert!(error.is_timeout(), "acquire_timeout(): {error:?}");
    // A confirmed release is answered within the bound too (an error: the
    // unlock stays queued, and the server drops the lock with the session
    // in any case).
    let _ = within("release()", bound, reader.release()).await;
    // The holder was told: its heartbeat got no answer before its cutoff.
    within("lost()", bound, guard.lost()).await;

    // Once the server answers again, so does the Locker.
    drop(stopped);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Some(g)) = locker.try_acquire(&other).await {
            drop(g);
            break;
        }
        assert!(Instant::now() < deadline, "the Locker never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(locker.list().await.is_ok());
}

/// A TCP proxy in front of a server that counts round trips: each time
/// the server answers after the client has sent something since the last
/// answer, on any connection through it. Pipelined statements, sent
/// together and answered together, count once.
struct RoundTrips {
    port: u16,
    count: Arc<std::sync::atomic::AtomicU64>,
}

impl RoundTrips {
    fn to(server_port: u16) -> RoundTrips {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let count = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&count);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", server_port)) else {
                    return;
                };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let spoke = Arc::new(AtomicBool::new(false));
                let pump = |from: std::net::TcpStream, to: std::net::TcpStream, up: bool| {
                    let (spoke, counted) = (Arc::clone(&spoke), Arc::clone(&counted));
                    move || {
                        use std::io::{Read, Write};
                        let (mut from, mut to) = (from, to);
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            if up {
                                spoke.store(true, Ordering::SeqCst);
                            } else if spoke.swap(false, Ordering::SeqCst) {
                                counted.fetch_add(1, Ordering::SeqCst);
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    }
                };
                let up = pump(client.try_clone().unwrap(), server.try_clone().unwrap(), true);
                let down = pump(server, client, false);
                std::thread::spawn(up);
                std::thread::spawn(down);
            }
        });
        RoundTrips { port, count }
    }

    fn url(&self) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname=postgres", self.port)
    }

    fn now(&self) -> u64 {
        self.count.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The round trips `op` takes, counted once the traffic it caused has
    /// settled (an unlock queued by a drop is sent after it returns).
    async fn of<T>(&self, op: impl std::future::Future<Output = T>) -> (T, u64) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = self.now();
        let value = op.await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        (value, self.now() - before)
    }
}

/// Round trips of an uncontended acquisition and release on the session,
/// counted through a proxy: exclusive, shared, a permit, and the
/// releases (confirmed, and by drop). Each acquisition takes at most two
/// (the key, then the record in one transaction), a release one; before,
/// 6 (exclusive), 6 (shared) and 10 (a permit), and 5 to 7 a release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_and_releases_take_few_round_trips() {
    let server = Server::start_with(true, "", |_| {});
    let proxy = RoundTrips::to(server.port());
    // Heartbeats far apart: nothing else on the wire while counting.
    let locker = Locker::builder()
        .postgres(proxy.url())
        .lease(Duration::from_secs(60))
        .renew_interval(Duration::from_secs(20))
        .build()
        .unwrap();
    let name = unique("trips");
    let sem = locker.semaphore(&unique("trips-sem"), 3).unwrap();
    // Warm: each kind once (the first use of a name makes its rows).
    drop(locker.acquire(&name).await.unwrap());
    drop(locker.acquire_shared(&name).await.unwrap());
    drop(sem.acquire().await.unwrap());

    let (guard, exclusive) = proxy.of(locker.acquire(&name)).await;
    let (released, exclusive_release) = proxy.of(guard.unwrap().release()).await;
    released.unwrap();
    let (guard, shared) = proxy.of(locker.acquire_shared(&name)).await;
    let (released, shared_release) = proxy.of(guard.unwrap().release()).await;
    released.unwrap();
    let (guard, permit) = proxy.of(sem.acquire()).await;
    let guard = guard.unwrap();
    let ((), permit_drop) = proxy.of(async move { drop(guard) }).await;
    let (guard, _) = proxy.of(sem.acquire()).await;
    let (released, permit_release) = proxy.of(guard.unwrap().release()).await;
    released.unwrap();
    eprintln!(
        "round trips: exclusive {exclusive} + release {exclusive_release}; shared {shared} + release \
         {shared_release}; permit {permit} + release {permit_release} (by drop {permit_drop})"
    );
    assert!(exclusive > 0 && shared > 0 && permit > 0, "the proxy counts");
    assert!(
        exclusive <= 2,
        "an exclusive acquisition took {exclusive} round trips"
    );
    assert!(shared <= 2, "a shared acquisition took {shared} round trips");
    assert!(permit <= 2, "a permit took {permit} round trips");
    for (what, n) in [
        ("exclusive", exclusive_release),
        ("shared", shared_release),
        ("permit", permit_release),
        ("permit by drop", permit_drop),
    ] {
        assert!(n <= 2, "a release ({what}) took {n} round trips");
    }
}

/// `clean()` on a server removes the rows of holders gone for good and
/// says which: a released exclusive holder's owner record (the row stays,
/// with its fencing counter), and the row of a shared holder whose
/// session ended once it is found dead and its lease has passed (not
/// before: that holder may still count itself one). Live holders are
/// never touched; `dry_run` only looks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_on_a_server_says_what_it_removed() {
    use pg_session::{Holder, LEASE, backend_of, builder as session_builder, terminate};
    let server = Server::start();
    let a = session_builder(&server).build().unwrap();
    let b = session_builder(&server).build().unwrap();
    let (live, read, gone, done) = (unique("live"), unique("read"), unique("gone"), unique("done"));
    let _live = a.acquire(&live).await.unwrap();
    let _read = a.acquire_shared(&read).await.unwrap();
    let ghost = b.acquire_shared(&gone).await.unwrap();
    let b_id = ghost.owner().holder_id().unwrap().to_owned();
    let released = b.acquire(&done).await.unwrap();
    let token = released.fencing_token().unwrap();
    released.release().await.unwrap();

    // The shared holder's session ends: its row stays, not found dead yet.
    terminate(&server, backend_of(&server, &gone, Holder::Locker(b_id.clone())));
    let names = |infos: &[leasehold::LockInfo]| {
        let mut names: Vec<String> = infos.iter().map(|i| i.name().to_owned()).collect();
        names.sort();
        names
    };
    let seen = a.clean(true).await.unwrap();
    assert_eq!(
        names(&seen),
        vec![done.clone()],
        "only the released record: {seen:?}"
    );
    let info = &seen[0];
    assert_eq!(info.kind(), LockKind::Exclusive);
    assert_eq!(info.stale_reason(), Some(leasehold::StaleReason::DeadOwner));
    assert_eq!(info.owner().holder_id(), Some(b_id.as_str()));

    // b's next session finds the row dead; a lease later it is gone for
    // good.
    let reconnect = unique("reconnect");
    b.try_acquire(&reconnect)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    ghost.lost().await;
    tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
    let mut want = vec![done.clone(), gone.clone(), reconnect];
    want.sort();
    let seen = a.clean(true).await.unwrap();
    assert_eq!(names(&seen), want, "dry run: {seen:?}");
    let removed = a.clean(false).await.unwrap();
    assert_eq!(names(&removed), want, "removed: {removed:?}");
    let shared = removed.iter().find(|i| i.name() == gone).unwrap();
    assert_eq!(shared.kind(), LockKind::Shared);
    assert_eq!(shared.owner().holder_id(), Some(b_id.as_str()));
    assert!(a.clean(false).await.unwrap().is_empty(), "nothing left to clean");

    // Live holders kept their locks and rows; the counter row stays.
    assert!(a.holder(&live).await.unwrap().is_some());
    assert_eq!(a.holders(&read).await.unwrap().len(), 1);
    let (rows, counter): (i64, i64) = {
        let (gone, done) = (gone.clone(), done.clone());
        server.sql(move |c| {
            let row = c
                .query_one(
                    "SELECT (SELECT count(*) FROM leasehold_holders WHERE name = $1),
                            (SELECT fencing_token FROM leasehold_locks WHERE name = $2 AND holder_id IS NULL)",
                    &[&gone, &done],
                )
                .unwrap();
            (row.get(0), row.get(1))
        })
    };
    assert_eq!(rows, 0);
    assert!(u64::try_from(counter).unwrap() >= token, "the counter stays");
    let next = b.acquire(&done).await.unwrap();
    assert!(next.fencing_token().unwrap() > token, "tokens keep growing");
}

/// An upgradable acquisition connects a session of its own: with the
/// whole server stopped (`SIGSTOP`; over a Unix socket the connection is
/// accepted and then never answered), it gives up connecting after a
/// quarter of the lease (at least a second) and is busy, rather than
/// waiting 30 s; once the server runs again it succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgradable_attempt_on_a_stopped_server_ends_within_its_bound() {
    let server = Server::start();
    let locker = Locker::builder()
        .postgres(server.url())
        .lease(Duration::from_secs(6))
        .renew_interval(Duration::from_secs(1))
        .poll_interval(Duration::from_millis(50))
        .build()
        .unwrap();
    let name = unique("upgradable");
    let frozen = pg_session::Frozen::server(server.pid().expect("a server of the test's own"));
    // 1.5 s to connect; the bound leaves room for a loaded machine.
    let got = within(
        "try_acquire_upgradable()",
        Duration::from_secs(4),
        locker.try_acquire_upgradable(&name),
    )
    .await;
    assert!(
        matches!(got, Ok(None)),
        "busy while the server is stopped: {got:?}"
    );
    drop(frozen);
    let guard = tokio::time::timeout(Duration::from_secs(20), locker.acquire_upgradable(&name))
        .await
        .expect("acquired once the server runs again")
        .unwrap();
    assert_eq!(locker.holders(&name).await.unwrap().len(), 1);
    drop(guard);
}
