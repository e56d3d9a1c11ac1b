//! The PostgreSQL backend, against a real server: a throwaway one started
//! by each test (initdb in a temporary directory, a Unix socket only, run
//! as the unprivileged `postgres` user when the tests run as root), unless
//! `LEASEHOLD_PG_URL` names one. Without a server the tests fail loudly:
//! they never pretend to pass.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::{Locker, LockerBuilder};

#[path = "support/pg_server.rs"]
mod pg_server;

use pg_server::{Server, SqlWorker};

fn builder(server: &Server) -> LockerBuilder {
    Locker::builder()
        .postgres(server.url())
        .lease(Duration::from_millis(900))
        .renew_interval(Duration::from_millis(150))
        .poll_interval(Duration::from_millis(50))
}

/// A unique name per test, so tests sharing an external server do not meet.
fn unique(name: &str) -> String {
    format!("{name}-{}", uuid::Uuid::new_v4().simple())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_api_on_a_server() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
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
        woken.duration_since(released) < Duration::from_millis(800),
        "woke late"
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
    tokio::time::timeout(Duration::from_secs(2), held.lost())
        .await
        .expect("lost() within the heartbeat");
    assert!(
        killed.elapsed() < Duration::from_secs(1),
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

#[path = "support/api_conformance.rs"]
#[macro_use]
mod api_conformance;

fn server() -> (Server, LockerBuilder) {
    let server = Server::start();
    let builder = Locker::builder().postgres(server.url());
    (server, builder)
}

// The behaviour every backend shares, as the file strategies run it.
api_conformance!(conformance, server());
