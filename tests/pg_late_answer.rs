//! An exclusive waiter's announcement that its session answers just as
//! the waiter stops waiting for the answer (PostgreSQL).
//!
//! A waiting writer announces itself: its session takes the name's
//! intent key, which keeps new readers out, and every session's writers
//! from announcing the name, while it waits. A caller waits for the
//! session's answer at most its patience (a quarter lease, 1 s at least).
//! An announcement the session made after its caller gave up is nobody's
//! and must be withdrawn, whichever way the two cross:
//!
//! - the answer comes after the caller stopped waiting and let go of the
//!   answer (the session sees nobody takes it);
//! - the answer comes in the instant between the caller's wait running
//!   out and its letting go: failpoints hold both sides there
//!   (`postgres.announce.before_reply` delays the session's answer,
//!   `postgres.call.gave_up` holds the caller whose wait just ran out).
//!   Before the fix, the answer was put where nobody would read it, and
//!   nothing withdrew the announcement: its session kept the intent key
//!   until it ended, and readers stayed out for the announcement's lease.
//!
//! Every wait is bounded.
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
use pg_session::{holding, intent_key, quick_builder, unique};

/// One writer that gives up while its first announcement is answered
/// `answer_after` late, its caller held `caller_held` after its wait for
/// the answer ran out (1 s, the patience of a 4 s lease): then nobody
/// holds the name's intent key, and a new reader gets in at once.
async fn a_late_answer_leaves_nothing_held(answer_after: Duration, caller_held: Duration) {
    let server = Server::start();
    let lease = Duration::from_secs(4);
    let writer = quick_builder(&server)
        .lease(lease)
        .renew_interval(Duration::from_millis(1000))
        .build()
        .unwrap();
    let reader = quick_builder(&server).build().unwrap();
    let other = quick_builder(&server).build().unwrap();
    let name = unique("late-answer");
    // Warm: tables made, sessions up, the name's row made.
    drop(writer.acquire(&name).await.unwrap());
    let read = reader.acquire_shared(&name).await.unwrap();

    let answers = hold_both_sides(answer_after, caller_held);
    let started = Instant::now();
    let given_up = tokio::time::timeout(
        Duration::from_secs(20),
        writer.acquire_timeout(&name, Duration::from_millis(1200)),
    )
    .await
    .expect("the writer's wait is bounded");
    let took = started.elapsed();
    let_both_sides_go();
    let error = given_up.expect_err("a reader holds the name");
    assert!(error.is_timeout(), "the writer timed out, not {error}");
    assert!(answers.load(Ordering::SeqCst) >= 1, "the writer announced itself");

    // Let the session catch up with what was queued behind the answer.
    let key = intent_key(&name);
    let until = Instant::now() + Duration::from_secs(3);
    while holding(&server, key) != 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        holding(&server, key),
        0,
        "the intent key is still held after the writer gave up \
         (answered after {answer_after:?}, its caller held {caller_held:?}; it gave up after {took:?})"
    );
    // And a new reader gets in at once: nothing keeps readers out.
    let joined = tokio::time::timeout(Duration::from_secs(1), other.acquire_shared(&name))
        .await
        .expect("a new reader waited: an announcement nobody holds keeps readers out")
        .unwrap();
    drop(joined);
    drop(read);
}

/// Both crossings, one after the other (failpoints are the process's):
/// the answer lands while the caller, its wait just run out, has not let
/// go yet (before the fix: left held), and after it let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_announcement_answered_as_or_after_its_caller_gives_up_is_withdrawn() {
    a_late_answer_leaves_nothing_held(Duration::from_millis(1300), Duration::from_millis(700)).await;
    a_late_answer_leaves_nothing_held(Duration::from_millis(1900), Duration::from_millis(300)).await;
}
