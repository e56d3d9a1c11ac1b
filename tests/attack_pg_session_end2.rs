//! Second cold attack on waiting out ended PostgreSQL sessions: what
//! `attack_pg_session_end.rs` does not cover (the session-ended retry,
//! kinds of different permit counts beside a dead holder, listings during
//! a wait-out, TIDY while waiting, table locks on one table only, fencing
//! across a truncated counter with a dead holder).
//!
//! Against a real, throwaway server (see `support/pg_server.rs`).
// Each test starts a PostgreSQL server of its own from Debian's binaries.
#![cfg(unix)]

use std::sync::mpsc;
use std::time::{Duration, Instant};

use leasehold::{Error, LockGuard, Locker};

#[path = "support/pg_server.rs"]
mod pg_server;
#[path = "support/pg_session.rs"]
mod pg_session;

use pg_server::Server;
use pg_session::{Holder, LEASE, backend_of, builder, name_key, terminate, unique};

fn id_of(guard: &LockGuard) -> String {
    guard.owner().uuid().unwrap().to_owned()
}

async fn session_of(server: &Server, locker: &Locker) -> i32 {
    let probe = unique("probe");
    let g = locker.acquire(&probe).await.unwrap();
    let pid = backend_of(server, &probe, Holder::Exclusive);
    g.release().await.unwrap();
    pid
}

/// Granted advisory locks on the server, by anyone but the asking session.
fn advisory_locks(server: &Server) -> Vec<String> {
    server.sql(|c| {
        c.query(
            "SELECT format('pid=%s %s/%s/%s %s', pid, classid, objid, objsubid, mode) FROM pg_locks
             WHERE locktype = 'advisory' AND pid <> pg_backend_pid()",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    })
}

/// Waits (up to 5 s) for every advisory lock on the server to be gone.
fn assert_no_advisory_locks_left(server: &Server, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = advisory_locks(server);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: advisory locks left on the server: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sessions holding the name's key, and how.
fn key_holders(server: &Server, name: &str) -> Vec<String> {
    let key = name_key(name);
    server.sql(move |c| {
        c.query(
            "SELECT format('pid=%s %s', pid, mode) FROM pg_locks WHERE locktype = 'advisory' AND granted
             AND objsubid = 1 AND classid::bigint = (($1::bigint >> 32) & 4294967295)
             AND objid::bigint = ($1::bigint & 4294967295)",
            &[&key],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    })
}

async fn until_taken<T, F, Fut>(
    what: &str,
    old: &[&LockGuard],
    within: Duration,
    mut take: F,
) -> (T, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let since = Instant::now();
    loop {
        if let Some(taken) = take().await {
            let after = since.elapsed();
            for (i, g) in old.iter().enumerate() {
                assert!(
                    g.is_lost(),
                    "{what}: a successor entered after {after:?} while old holder {i} still counted itself one"
                );
            }
            return (taken, after);
        }
        assert!(since.elapsed() < within, "{what}: no successor within {within:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Attack: the session-ended retry (`session.rs` `try_lock`). A `Locker`
/// whose idle session the server ended takes each kind once, on the new
/// session only: another `Locker` is kept out, the server shows one
/// holder of the key, a release hands off at once, and nothing is left
/// held on the server once the `Locker`s are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_ended_retry_takes_each_lock_once_and_leaves_nothing() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    for kind in 0..3 {
        let name = unique("retry");
        let pid = session_of(&server, &a).await;
        terminate(&server, pid);
        let g = match kind {
            0 => a.try_acquire(&name).await,
            1 => a.try_acquire_shared(&name).await,
            _ => a.semaphore(&name, 1).unwrap().try_acquire().await,
        }
        .unwrap()
        .unwrap_or_else(|| panic!("kind {kind}: busy on a free name after the session ended"));
        let holders = key_holders(&server, &name);
        assert_eq!(holders.len(), 1, "kind {kind}: the key is held {holders:?}");
        let other = match kind {
            0 | 1 => b.try_acquire(&name).await.unwrap(),
            _ => b.semaphore(&name, 1).unwrap().try_acquire().await.unwrap(),
        };
        assert!(
            other.is_none(),
            "kind {kind}: another Locker entered beside the holder"
        );
        let token = g.fencing_token().unwrap();
        g.release().await.unwrap();
        let start = Instant::now();
        let next = match kind {
            0 | 1 => b.acquire_timeout(&name, Duration::from_secs(5)).await,
            _ => {
                b.semaphore(&name, 1)
                    .unwrap()
                    .acquire_timeout(Duration::from_secs(5))
                    .await
            }
        }
        .unwrap();
        let waited = start.elapsed();
        assert!(
            waited < LEASE / 2,
            "kind {kind}: the successor waited {waited:?} after a clean release"
        );
        assert!(
            next.fencing_token().unwrap() > token,
            "kind {kind}: tokens went back"
        );
        next.release().await.unwrap();
    }
    drop((a, b));
    assert_no_advisory_locks_left(&server, "after the retries");
}

/// Attack: semaphores of different counts (`KindMismatch`) beside a dead
/// holder, and listings during the wait-out. A 3-permit holder's session
/// ends while another 3-permit holder lives: a 2-permit semaphore gets
/// `KindMismatch` (not a wait, not a permit), `holders()` and `list()`
/// show the live holder only; once the live one lets go, the 2-permit
/// holder never enters before the dead one counts itself lost, and its
/// token is above both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_of_another_count_beside_a_dead_and_a_live_holder() {
    let server = Server::start();
    let p = builder(&server).build().unwrap();
    let q = builder(&server).build().unwrap();
    let r = builder(&server).build().unwrap();
    let name = unique("gpu");
    let dead = p.semaphore(&name, 3).unwrap().acquire().await.unwrap();
    let live = q.semaphore(&name, 3).unwrap().acquire().await.unwrap();
    terminate(
        &server,
        backend_of(&server, &name, Holder::Acquisition(id_of(&dead))),
    );
    let two = r.semaphore(&name, 2).unwrap();
    match two.try_acquire().await {
        Err(Error::KindMismatch { .. }) => {}
        other => panic!("a 2-permit semaphore beside a live 3-permit holder: {other:?}"),
    }
    let holders = r.holders(&name).await.unwrap();
    let listed = r
        .list()
        .await
        .unwrap()
        .into_iter()
        .find(|info| info.name() == name)
        .map(|info| info.holders().len());
    assert_eq!(holders.len(), 1, "holders() beside a dead holder: {holders:?}");
    assert_eq!(listed, Some(1), "list() beside a dead holder");
    assert_eq!(
        holders[0].fencing_token(),
        live.fencing_token(),
        "holders() lists the live one"
    );
    let tokens = [dead.fencing_token().unwrap(), live.fencing_token().unwrap()];
    live.release().await.unwrap();
    let (permit, after) = until_taken("2 permits after 3", &[&dead], Duration::from_secs(5), || async {
        let listed = r.holders(&name).await.unwrap();
        assert!(listed.is_empty(), "holders() during the wait-out: {listed:?}");
        match two.try_acquire().await {
            Ok(taken) => taken,
            Err(Error::KindMismatch { .. }) => None,
            Err(e) => panic!("{e}"),
        }
    })
    .await;
    eprintln!("2-permit holder entered {after:?} after the live one let go");
    let token = permit.fencing_token().unwrap();
    assert!(
        token > tokens[0] && token > tokens[1],
        "token {token} not above {tokens:?}"
    );
    drop((permit, dead));
    drop((p, q, r));
    assert_no_advisory_locks_left(&server, "after the semaphores");
}

/// Attack: TIDY (run by every new session) while a taker waits out a dead
/// shared holder: new `Locker`s connect all through the wait; the writer
/// never enters before the dead reader counts itself lost, and a live
/// reader beside it is listed all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_sessions_tidying_during_a_wait_out_let_nobody_in_early() {
    let server = Server::start();
    let x = builder(&server).build().unwrap();
    let y = builder(&server).build().unwrap();
    let w = builder(&server).build().unwrap();
    let doc = unique("doc");
    let dead = x.acquire_shared(&doc).await.unwrap();
    let live = y.acquire_shared(&doc).await.unwrap();
    terminate(
        &server,
        backend_of(&server, &doc, Holder::Acquisition(id_of(&dead))),
    );
    // Churn: fresh Lockers connect (TIDY) and inspect.
    let url = server.url();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let stop = stop.clone();
        let doc = doc.clone();
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let fresh = Locker::builder()
                    .postgres(url.clone())
                    .lease(LEASE)
                    .build()
                    .unwrap();
                seen.push(fresh.holders(&doc).await.unwrap().len());
                drop(fresh);
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            seen
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    live.release().await.unwrap();
    let (g, after) = until_taken(
        "writer after readers",
        &[&dead],
        Duration::from_secs(6),
        || async { w.try_acquire(&doc).await.unwrap() },
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = churn.await.unwrap();
    eprintln!("writer entered {after:?}; holders seen by fresh sessions: {seen:?}");
    assert!(seen.iter().all(|n| *n <= 1), "a dead reader was listed: {seen:?}");
    drop((g, dead));
}

/// Holds `LOCK TABLE <table> IN ACCESS EXCLUSIVE MODE` on a connection of
/// its own until told to let go.
struct TableLock {
    release: mpsc::Sender<()>,
    done: std::thread::JoinHandle<()>,
}

fn lock_table(url: String, table: &'static str) -> TableLock {
    let (ready_tx, ready_rx) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let done = std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        c.batch_execute(&format!("BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
            .unwrap();
        ready_tx.send(()).unwrap();
        let _ = release_rx.recv();
        c.batch_execute("COMMIT").unwrap();
    });
    ready_rx.recv().unwrap();
    TableLock { release, done }
}

/// Attack: a table lock on one owner table only, while takers meet a dead
/// holder (an exclusive taker's RECORD reads `leasehold_holders`; a
/// shared taker's JOIN and STAMP write both). Nobody enters beside the
/// dead holder, and once everyone is gone no advisory lock is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_lock_on_one_table_during_a_wait_out_never_lets_anyone_in_early() {
    let server = Server::start();
    for table in ["leasehold_holders", "leasehold_locks"] {
        let x = builder(&server).build().unwrap();
        let w = builder(&server).build().unwrap();
        let s = builder(&server).build().unwrap();
        // One dead reader, one dead writer (different names).
        let rname = unique("r");
        let wname = unique("w");
        let dead_r = x.acquire_shared(&rname).await.unwrap();
        let dead_w = x.acquire(&wname).await.unwrap();
        let xpid = backend_of(&server, &wname, Holder::Exclusive);
        // Sessions connected before the table lock.
        w.try_acquire(&unique("warm")).await.unwrap();
        s.try_acquire(&unique("warm")).await.unwrap();
        let locked = lock_table(server.url(), table);
        terminate(&server, xpid);
        let ended = Instant::now();
        let mut early = Vec::new();
        while ended.elapsed() < Duration::from_millis(1200) {
            if let Some(g) = w.try_acquire(&rname).await.unwrap() {
                if !dead_r.is_lost() {
                    early.push(format!(
                        "{table}: writer beside dead reader at {:?}",
                        ended.elapsed()
                    ));
                }
                drop(g);
            }
            match s.try_acquire_shared(&wname).await {
                Ok(Some(g)) => {
                    if !dead_w.is_lost() {
                        early.push(format!(
                            "{table}: reader beside dead writer at {:?}",
                            ended.elapsed()
                        ));
                    }
                    drop(g);
                }
                Ok(None) | Err(Error::KindMismatch { .. }) => {}
                Err(e) => eprintln!("{table}: shared attempt: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        locked.release.send(()).unwrap();
        locked.done.join().unwrap();
        let (g, after) = until_taken("writer", &[&dead_r], Duration::from_secs(6), || async {
            w.try_acquire(&rname).await.unwrap()
        })
        .await;
        let (g2, after2) = until_taken("reader", &[&dead_w], Duration::from_secs(6), || async {
            s.try_acquire_shared(&wname).await.unwrap()
        })
        .await;
        eprintln!("{table}: entered {after:?} / {after2:?} after the table lock");
        assert!(early.is_empty(), "{early:?}");
        drop((g, g2, dead_r, dead_w));
        drop((x, w, s));
        assert_no_advisory_locks_left(&server, table);
    }
}

/// Attack: `TRUNCATE leasehold_locks` (the counter's loss, which the
/// docs say tokens survive) while an exclusive holder whose session ended
/// may still run. Its row was the only record that it is to be waited
/// out, so the successor enters at once: that is documented as not
/// guaranteed (docs/guarantees.md, *Not guaranteed*: emptying the owner
/// tables while locks are in use is like deleting lock files under their
/// holders). What must still hold: the successor's token is above the
/// dead holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_counter_beside_a_dead_exclusive_holder_keeps_tokens_growing() {
    let server = Server::start();
    let x = builder(&server).build().unwrap();
    let y = builder(&server).build().unwrap();
    let name = unique("t");
    let dead = x.acquire(&name).await.unwrap();
    let token = dead.fencing_token().unwrap();
    terminate(&server, backend_of(&server, &name, Holder::Exclusive));
    server.sql(|c| c.batch_execute("TRUNCATE leasehold_locks").unwrap());
    let g = y
        .acquire_timeout(&name, Duration::from_secs(6))
        .await
        .expect("the name is free once its rows are gone");
    assert!(
        g.fencing_token().unwrap() > token,
        "a token after TRUNCATE is above every earlier one"
    );
    drop((g, dead));
}

/// Attack: a clean release or drop while the releasing `Locker`'s session
/// is busy with other commands (attempts of other names queued behind
/// it, callers giving up): the successor on another `Locker` never waits
/// a lease, in any kind order, and nothing is left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_release_behind_queued_commands_costs_the_successor_no_wait() {
    let server = Server::start();
    let a = builder(&server).build().unwrap();
    let b = builder(&server).build().unwrap();
    let blocker = builder(&server).build().unwrap();
    let busy = unique("busy");
    let held_elsewhere = blocker.acquire(&busy).await.unwrap();
    let mut worst = (Duration::ZERO, String::new());
    for round in 0..6 {
        let name = unique("q");
        let g = match round % 3 {
            0 => a.acquire(&name).await.unwrap(),
            1 => a.acquire_shared(&name).await.unwrap(),
            _ => a.semaphore(&name, 1).unwrap().acquire().await.unwrap(),
        };
        // Commands queued on a's session: attempts that give up, and
        // attempts of free names.
        let mut queued = Vec::new();
        for i in 0..6 {
            let a = a.clone();
            let (busy, free) = (busy.clone(), unique("free"));
            queued.push(tokio::spawn(async move {
                if i % 2 == 0 {
                    let _ = a.acquire_timeout(&busy, Duration::from_millis(1)).await;
                } else {
                    drop(a.try_acquire(&free).await);
                }
            }));
        }
        let released = Instant::now();
        if round % 2 == 0 {
            g.release().await.unwrap();
        } else {
            drop(g);
        }
        // A dropped guard's unlock is queued on a's session, behind the
        // commands above: until it is sent, a successor of another kind
        // finds the old holder there and is told so (`KindMismatch`), and
        // asks again.
        let deadline = Instant::now() + Duration::from_secs(5);
        let next = loop {
            let next = match round % 3 {
                0 => b.acquire_shared_timeout(&name, Duration::from_secs(5)).await,
                1 => {
                    b.semaphore(&name, 1)
                        .unwrap()
                        .acquire_timeout(Duration::from_secs(5))
                        .await
                }
                _ => b.acquire_timeout(&name, Duration::from_secs(5)).await,
            };
            match next {
                Err(Error::KindMismatch { .. }) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                next => break next.unwrap(),
            }
        };
        let waited = released.elapsed();
        if waited > worst.0 {
            worst = (waited, format!("round {round}"));
        }
        for q in queued {
            q.await.unwrap();
        }
        drop(next);
    }
    eprintln!("worst: {worst:?}");
    assert!(
        worst.0 < LEASE / 2,
        "a successor waited {worst:?} after a clean release"
    );
    drop(held_elsewhere);
    drop((a, b, blocker));
    assert_no_advisory_locks_left(&server, "after the handoffs");
}
