//! Acquisitions run in a `leasehold` span that carries the lock's name and,
//! once acquired, how long it waited; events logged meanwhile are inside it.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::Locker;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use tracing_core::span::Current;

/// Every span's fields, and every event with the span it was logged in.
#[derive(Default)]
struct Seen {
    spans: HashMap<u64, (String, HashMap<String, String>)>,
    metadata: HashMap<u64, &'static Metadata<'static>>,
    events: Vec<(String, Option<u64>)>,
    stack: Vec<u64>,
    next: u64,
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Seen>>);

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

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut seen = self.0.lock().unwrap();
        seen.next += 1;
        let id = seen.next;
        let mut fields = HashMap::new();
        span.record(&mut Fields(&mut fields));
        seen.spans.insert(id, (span.metadata().name().to_owned(), fields));
        seen.metadata.insert(id, span.metadata());
        Id::from_u64(id)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut seen = self.0.lock().unwrap();
        if let Some((_, fields)) = seen.spans.get_mut(&span.into_u64()) {
            values.record(&mut Fields(fields));
        }
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        let mut seen = self.0.lock().unwrap();
        let current = seen.stack.last().copied();
        let message = fields.remove("message").unwrap_or_default();
        seen.events.push((message, current));
    }

    fn current_span(&self) -> Current {
        let seen = self.0.lock().unwrap();
        match seen.stack.last() {
            Some(id) => Current::new(Id::from_u64(*id), seen.metadata[id]),
            None => Current::none(),
        }
    }

    fn enter(&self, span: &Id) {
        self.0.lock().unwrap().stack.push(span.into_u64());
    }

    fn exit(&self, span: &Id) {
        let mut seen = self.0.lock().unwrap();
        if let Some(at) = seen.stack.iter().rposition(|s| *s == span.into_u64()) {
            seen.stack.remove(at);
        }
    }
}

#[test]
fn acquisitions_are_spans_with_their_outcome() {
    let recorder = Recorder::default();
    let seen = Arc::clone(&recorder.0);
    tracing::subscriber::with_default(recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let locker = Locker::builder()
                .directory(dir.path())
                .durable(false)
                .build()
                .unwrap();
            let first = locker.acquire("traced").await.unwrap();
            let waiter = {
                let locker = locker.clone();
                tokio::spawn(async move {
                    drop(
                        locker
                            .acquire_timeout("traced", Duration::from_secs(10))
                            .await
                            .unwrap(),
                    );
                })
            };
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(first);
            waiter.await.unwrap();
        });
    });
    let seen = seen.lock().unwrap();
    let spans: Vec<_> = seen
        .spans
        .iter()
        .filter(|(_, (name, fields))| {
            name == "leasehold" && fields.get("lock").is_some_and(|l| l == "traced")
        })
        .collect();
    let op = |op: &str| {
        spans
            .iter()
            .find(|(_, (_, f))| f.get("op").is_some_and(|o| o == op))
            .unwrap_or_else(|| panic!("no {op} span in {spans:?}"))
    };
    let (acquire_id, (_, acquire)) = op("acquire");
    assert_eq!(
        acquire.get("contended").map(String::as_str),
        Some("false"),
        "{acquire:?}"
    );
    assert!(acquire.contains_key("waited_ms"), "{acquire:?}");
    let (timeout_id, (_, timed)) = op("acquire_timeout");
    assert_eq!(
        timed.get("contended").map(String::as_str),
        Some("true"),
        "{timed:?}"
    );
    let waited: f64 = timed["waited_ms"].parse().unwrap();
    assert!(waited >= 10.0, "waited {waited} ms behind the first holder");
    // "lock acquired" is logged inside each acquisition's own span.
    let acquired: Vec<_> = seen
        .events
        .iter()
        .filter(|(message, _)| message == "lock acquired")
        .map(|(_, span)| *span)
        .collect();
    assert_eq!(
        acquired,
        vec![Some(**acquire_id), Some(**timeout_id)],
        "{:?}",
        seen.events
    );
}
