//! Attacks on the hand-over of a PostgreSQL session's answer to a caller
//! that gives up waiting for it (`Reply`/`Asked` in
//! `src/postgres/session/lock.rs`): an answer is either taken by its
//! caller or given back to the session thread, which undoes it, never
//! both and never neither.
//!
//! The failpoints of `tests/pg_late_answer.rs` hold both sides:
//! `postgres.announce.before_reply` delays the session's answer to an
//! exclusive waiter's announcement, `postgres.call.gave_up` holds a
//! caller whose wait for an answer just ran out. Two crossings: the
//! answer lands while the caller is held (the caller takes it), or after
//! it gave up (the session withdraws it). Here the waiter is dropped
//! mid-wait (its future cancelled while the announcement is in flight),
//! or it is an upgrade, whose announcement is made on its upgradable
//! holding's own session: cancelled, or let through once the reader
//! leaves. Whichever way: afterwards no session holds the intent key or
//! the upgradable slot for nobody, readers and the next upgradable
//! holder get in at once, and a writer gets in without waiting out a
//! lease (what was let go was let go cleanly, not abandoned). An upgrade
//! that took the late answer stands announced (readers out) until it gets
//! through, then holds the name alone, with no announcement left.
//!
//! Checked against three breakages of the session or the caller (each
//! fails here): a caller that gives up without looking once more (the
//! answer lost: the intent key held for nobody), a session that does not
//! withdraw an announcement given back (the same), and a session that
//! withdraws an upgrade's announcement its caller took (a new reader gets
//! in while the upgrade waits). Not reachable with these failpoints: a
//! lock, upgrade or downgrade answered late, since each attempt is over
//! by its deadline and its caller waits 250 ms past it.
//!
//! Every wait is bounded (about 16 s in all).
#![cfg(all(unix, feature = "postgres", feature = "failpoints"))]

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[path = "support/pg_server.rs"]
mod pg_server;

#[path = "support/pg_session.rs"]
mod pg_session;

#[path = "support/pg_answer.rs"]
mod pg_answer;
use pg_answer::{hold_both_sides, let_both_sides_go};

use pg_server::Server;
use pg_session::{digest_key, holding, intent_key, name_key, quick_builder, unique};

/// The lease of the waiter (its patience for an answer: 1 s).
const LEASE: Duration = Duration::from_secs(4);

/// The two crossings: (the session answers after, the caller is held
/// after its wait ran out, in ms; whether the caller takes the answer).
/// The first lands in the hold (the caller takes it), the second after
/// it (given back).
const CROSSINGS: [(u64, u64, bool); 2] = [(1250, 600, true), (1600, 200, false)];

/// The key of the name's upgradable slot (as `src/postgres.rs` derives it).
fn upgradable_key(name: &str) -> i64 {
    digest_key(b"leasehold-upgradable\0", name)
}

/// Waits (at most 5 s) until `key` is held by `sessions` sessions, and
/// says so.
async fn settles(server: &Server, key: i64, sessions: i64, what: &str) {
    let until = Instant::now() + Duration::from_secs(5);
    while holding(server, key) != sessions && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(holding(server, key), sessions, "{what}");
}

/// After the waiter is gone, with `read` still in: nothing of the waiter
/// is held, readers and the next upgradable holder get in at once, and
/// once they are gone a writer does too.
async fn nothing_left(server: &Server, name: &str, read: leasehold::LockGuard, what: &str) {
    settles(
        server,
        intent_key(name),
        0,
        &format!("{what}: the intent key is held for nobody"),
    )
    .await;
    settles(
        server,
        upgradable_key(name),
        0,
        &format!("{what}: the upgradable slot is held for nobody"),
    )
    .await;
    settles(
        server,
        name_key(name),
        1,
        &format!("{what}: the name is held by the reader alone"),
    )
    .await;
    let other = quick_builder(server).build().unwrap();
    let joined = tokio::time::timeout(Duration::from_secs(1), other.acquire_shared(name))
        .await
        .unwrap_or_else(|_| panic!("{what}: a new reader waited"))
        .unwrap();
    let up = tokio::time::timeout(Duration::from_secs(1), other.acquire_upgradable(name))
        .await
        .unwrap_or_else(|_| panic!("{what}: a new upgradable holder waited"))
        .unwrap();
    drop((joined, up, read));
    // Less than the lease: nobody's row is waited out.
    let writer = tokio::time::timeout(Duration::from_secs(2), other.acquire(name))
        .await
        .unwrap_or_else(|_| panic!("{what}: a writer waited out a lease"))
        .unwrap();
    drop(writer);
}

/// A writer whose future is dropped while its announcement is answered
/// late.
async fn a_writer_dropped_mid_announcement(server: &Server, answer_after: Duration, caller_held: Duration) {
    let writer = quick_builder(server)
        .lease(LEASE)
        .renew_interval(Duration::from_millis(1000))
        .build()
        .unwrap();
    let reader = quick_builder(server).build().unwrap();
    let name = unique("dropped-writer");
    drop(writer.acquire(&name).await.unwrap());
    let read = reader.acquire_shared(&name).await.unwrap();
    let answers = hold_both_sides(answer_after, caller_held);
    // Dropped while the announcement's blocking call still waits.
    let cut = Duration::from_millis(600);
    assert!(
        tokio::time::timeout(cut, writer.acquire(&name)).await.is_err(),
        "a reader holds the name"
    );
    // The blocking call ends on its own; its result is dropped there.
    tokio::time::sleep(answer_after + caller_held + Duration::from_millis(200) - cut).await;
    let_both_sides_go();
    assert!(answers.load(Ordering::SeqCst) >= 1, "the writer announced itself");
    let what = format!("writer dropped (answered after {answer_after:?}, caller held {caller_held:?})");
    nothing_left(server, &name, read, &what).await;
}

/// An upgrade that waits for a reader, its announcement (on its holding's
/// own session) answered late; then cancelled, or let through.
async fn an_upgrade_answered_late(
    server: &Server,
    answer_after: Duration,
    caller_held: Duration,
    taken: bool,
    let_through: bool,
) {
    let locker = quick_builder(server)
        .lease(LEASE)
        .renew_interval(Duration::from_millis(1000))
        .build()
        .unwrap();
    let reader = quick_builder(server).build().unwrap();
    let name = unique("late-upgrade");
    drop(locker.acquire(&name).await.unwrap());
    let read = reader.acquire_shared(&name).await.unwrap();
    let up = locker.acquire_upgradable(&name).await.unwrap();
    let answers = hold_both_sides(answer_after, caller_held);
    let what = format!(
        "upgrade {} (answered after {answer_after:?}, caller held {caller_held:?})",
        if let_through { "let through" } else { "cancelled" }
    );
    if !let_through {
        let cut = tokio::time::timeout(
            answer_after + caller_held + Duration::from_millis(300),
            up.upgrade(),
        )
        .await;
        assert!(cut.is_err(), "{what}: a reader holds the name");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let_both_sides_go();
        assert!(
            answers.load(Ordering::SeqCst) >= 1,
            "{what}: the upgrade announced itself"
        );
        nothing_left(server, &name, read, &what).await;
        return;
    }
    let upgrading = tokio::spawn(up.upgrade());
    // The reader leaves once the late answer has landed either way.
    tokio::time::sleep(answer_after + caller_held + Duration::from_millis(200)).await;
    let_both_sides_go();
    assert!(
        answers.load(Ordering::SeqCst) >= 1,
        "{what}: the upgrade announced itself"
    );
    if taken {
        // The upgrade took the late answer: its announcement stands (the
        // session did not also withdraw it), and keeps new readers out.
        assert_eq!(
            holding(server, intent_key(&name)),
            1,
            "{what}: the announcement its caller took was withdrawn"
        );
        let late = quick_builder(server).build().unwrap();
        assert!(
            late.try_acquire_shared(&name).await.unwrap().is_none(),
            "{what}: a new reader got in while the upgrade waits announced"
        );
    }
    drop(read);
    let writer = tokio::time::timeout(Duration::from_secs(3), upgrading)
        .await
        .unwrap_or_else(|_| panic!("{what}: the upgrade did not get through"))
        .unwrap()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(!writer.is_lost(), "{what}: the upgraded lock is held");
    settles(
        server,
        intent_key(&name),
        0,
        &format!("{what}: no announcement is left"),
    )
    .await;
    settles(
        server,
        name_key(&name),
        1,
        &format!("{what}: the upgrader holds the name"),
    )
    .await;
    let other = quick_builder(server).build().unwrap();
    assert!(
        other.try_acquire_shared(&name).await.unwrap().is_none(),
        "{what}: a reader got in beside the upgraded lock"
    );
    assert!(
        other.try_acquire(&name).await.unwrap().is_none(),
        "{what}: a writer got in beside the upgraded lock"
    );
    // Still held a while later: the session did not undo what it answered.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!writer.is_lost(), "{what}: the upgraded lock was lost");
    assert_eq!(
        holding(server, name_key(&name)),
        1,
        "{what}: the upgrader still holds the name"
    );
    drop(writer);
    let read = tokio::time::timeout(Duration::from_secs(2), other.acquire_shared(&name))
        .await
        .unwrap_or_else(|_| panic!("{what}: a reader waited after the upgraded lock went"))
        .unwrap();
    nothing_left(server, &name, read, &what).await;
}

/// Failpoints are the process's: the cases run one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn late_answers_to_cancelled_and_upgrading_waiters_leave_nothing_held() {
    // One server: every case has a name of its own.
    let server = Server::start();
    for (answer_after, caller_held, taken) in CROSSINGS {
        let (answer_after, caller_held) = (
            Duration::from_millis(answer_after),
            Duration::from_millis(caller_held),
        );
        a_writer_dropped_mid_announcement(&server, answer_after, caller_held).await;
        an_upgrade_answered_late(&server, answer_after, caller_held, taken, false).await;
        an_upgrade_answered_late(&server, answer_after, caller_held, taken, true).await;
    }
}
