//! Waiting is visible: a waiter says at INFO, after a threshold and then
//! at a slow cadence, whom it waits for; a timeout names the holder last
//! seen.

#[path = "support/common.rs"]
mod common;

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::Locker;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

#[test]
fn child_process_entry() {
    common::child_entry();
}

/// The INFO events seen, with their fields (the message as `message`).
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<HashMap<String, String>>>>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        if *event.metadata().level() != Level::INFO {
            return;
        }
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().push(fields);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

impl Recorder {
    fn notices(&self) -> Vec<HashMap<String, String>> {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|e| e.get("message").is_some_and(|m| m.starts_with("still waiting")))
            .cloned()
            .collect()
    }
}

fn waiter(dir: &std::path::Path, notice: Option<Duration>) -> Locker {
    Locker::builder()
        .directory(dir)
        .wait_notice(notice)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn a_long_wait_names_the_holder_and_repeats() {
    let recorder = Recorder::default();
    let _default = tracing::subscriber::set_default(recorder.clone());
    let dir = tempfile::tempdir().unwrap();
    let holder = Locker::new(dir.path()).unwrap();
    let _held = holder.acquire("jobs").await.unwrap();

    // Notices at 100 ms, then every 600 ms: four in 2.5 s, at least two
    // however late a loaded machine wakes the waiter, never more.
    let err = waiter(dir.path(), Some(Duration::from_millis(100)))
        .acquire_timeout("jobs", Duration::from_millis(2500))
        .await
        .unwrap_err();
    let notices = recorder.notices();
    assert!(
        (2..=4).contains(&notices.len()),
        "expected the first notice and repeats every 600 ms: {notices:#?}"
    );
    let me = std::process::id().to_string();
    for notice in &notices {
        assert_eq!(notice.get("lock").map(String::as_str), Some("jobs"), "{notice:?}");
        assert_eq!(notice.get("holder_pid"), Some(&me), "{notice:?}");
        assert!(
            notice.contains_key("holder_host") && notice.contains_key("holder_since"),
            "{notice:?}"
        );
        let waited: f64 = notice["waited_secs"].parse().unwrap();
        assert!(waited >= 0.1, "{notice:?}");
        assert!(
            notice["message"].contains(&format!("held by pid {me}")),
            "{notice:?}"
        );
    }

    // The timeout names the same holder.
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(err.holder().and_then(|h| h.pid()), Some(std::process::id()));
    let text = err.to_string();
    assert!(
        text.contains(&format!("held by pid {me}")) && text.contains(" since "),
        "{text}"
    );
}

/// A notice due at the very moment the wait times out is not given: the
/// wait is over, and the timeout's error names the holder instead. With
/// Tokio's clock paused the two fall due at the same instant (100 ms,
/// then 600 ms later: 700 ms, the timeout), which on a real clock happens
/// only now and then.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn no_notice_is_given_as_the_wait_times_out() {
    let recorder = Recorder::default();
    let _default = tracing::subscriber::set_default(recorder.clone());
    let dir = tempfile::tempdir().unwrap();
    let holder = Locker::new(dir.path()).unwrap();
    let _held = holder.acquire("jobs").await.unwrap();

    let err = waiter(dir.path(), Some(Duration::from_millis(100)))
        .acquire_timeout("jobs", Duration::from_millis(700))
        .await
        .unwrap_err();
    assert!(matches!(err, leasehold::Error::Timeout { .. }), "{err:?}");
    let notices = recorder.notices();
    let waited: Vec<&str> = notices.iter().map(|n| n["waited_secs"].as_str()).collect();
    assert_eq!(
        notices.len(),
        1,
        "one notice at 100 ms, none at the timeout: {waited:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_short_wait_and_a_disabled_notice_stay_silent() {
    let recorder = Recorder::default();
    let _default = tracing::subscriber::set_default(recorder.clone());
    let dir = tempfile::tempdir().unwrap();
    let holder = Locker::new(dir.path()).unwrap();
    let held = holder.acquire("jobs").await.unwrap();

    // Below the default threshold (5 s): nothing.
    let err = waiter(dir.path(), Some(Duration::from_secs(5)))
        .acquire_timeout("jobs", Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    // Notices off: nothing, however long the wait.
    let quiet = waiter(dir.path(), None);
    assert!(
        quiet
            .acquire_timeout("jobs", Duration::from_millis(300))
            .await
            .is_err()
    );
    // A wait that ends before the threshold: nothing.
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(held);
    });
    let _got = waiter(dir.path(), Some(Duration::from_secs(5)))
        .acquire("jobs")
        .await
        .unwrap();
    release.await.unwrap();
    assert!(recorder.notices().is_empty(), "{:#?}", recorder.notices());
}

#[tokio::test(flavor = "current_thread")]
async fn tasks_queued_behind_the_waiting_one_time_out_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let holder = Locker::new(dir.path()).unwrap();
    let _held = holder.acquire("jobs").await.unwrap();
    let waiting = Locker::new(dir.path()).unwrap();
    // The first task waits on the lock; the second queues behind it.
    let head = {
        let waiting = waiting.clone();
        tokio::spawn(async move { waiting.acquire_timeout("jobs", Duration::from_secs(3)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let err = waiting
        .acquire_timeout("jobs", Duration::from_millis(300))
        .await
        .unwrap_err();
    assert_eq!(
        err.holder().and_then(|h| h.pid()),
        Some(std::process::id()),
        "{err}"
    );
    assert!(head.await.unwrap().unwrap_err().is_timeout());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_names_a_holder_in_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let child = common::ChildProc::spawn("hold", &[path, "jobs", "30000"]);
    child.expect("acquired", Duration::from_secs(30));
    let err = Locker::new(dir.path())
        .unwrap()
        .acquire_timeout("jobs", Duration::from_millis(300))
        .await
        .unwrap_err();
    let holder = err.holder().expect("the holder's record was read");
    assert_eq!(holder.pid(), Some(child.pid()));
    assert!(
        err.to_string().contains(&format!("held by pid {}", child.pid())),
        "{err}"
    );
}

/// A queued task's timeout must not name a holder from an earlier wait:
/// here a head waited for another `Locker` (as another process would be),
/// gave up, and the next task took the lock at once; a task queued behind
/// that one times out waiting only for its own `Locker`'s holder, so
/// `holder()` is `None` (as documented), not the long-gone other holder.
#[tokio::test(flavor = "current_thread")]
async fn a_queued_timeout_does_not_name_a_holder_from_an_earlier_wait() {
    let dir = tempfile::tempdir().unwrap();
    let other = Locker::new(dir.path()).unwrap();
    let other_held = other.acquire("jobs").await.unwrap();
    let other_id = other_held.owner().holder_id().unwrap().to_owned();

    let ours = Locker::new(dir.path()).unwrap();
    // Queued behind the head below, it takes the lock once the head gives up.
    let next = {
        let ours = ours.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            ours.acquire("jobs").await
        })
    };
    // The head waits for `other`, sees its record, and times out.
    let head = ours.acquire_timeout("jobs", Duration::from_millis(300));
    let err = head.await.unwrap_err();
    assert_eq!(err.holder().and_then(|h| h.holder_id()), Some(other_id.as_str()));
    // The other holder leaves before `next` makes its first attempt.
    drop(other_held);
    let ours_held = next.await.unwrap().unwrap();

    // Now only `ours_held`, of this same Locker, holds the name.
    let err = ours
        .acquire_timeout("jobs", Duration::from_millis(200))
        .await
        .unwrap_err();
    assert_ne!(
        err.holder().and_then(|h| h.holder_id()),
        Some(other_id.as_str()),
        "a timeout names a holder that left long ago: {err}"
    );
    drop(ours_held);
}
