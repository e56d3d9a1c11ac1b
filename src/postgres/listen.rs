//! The listener: one connection (and thread) that `LISTEN`s on channel
//! `leasehold` and tells waiters of locks released anywhere, shared by
//! every `Locker` of the process with the same server settings.
//!
//! A notification names a lock released on the server's database, for
//! whoever listens there: it says nothing of the `Locker` that listens,
//! so one connection serves them all. Sessions are not shared (see the
//! crate docs, *PostgreSQL*): the listener holds no lock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator;

use super::Target;
use crate::backend::Waiters;
use crate::error::{Error, Result};
use crate::name::LockName;

/// What the listener thread and its subscribers share.
#[derive(Debug, Default)]
struct Hub {
    /// The connection is up and listening.
    listening: AtomicBool,
    /// The last subscriber has gone: the thread stops.
    closed: AtomicBool,
    /// The waiters of each subscribed `Locker`, by subscription.
    wakers: Mutex<Vec<(u64, Waiters)>>,
}

impl Hub {
    fn changed(&self, name: &str) {
        let wakers: Vec<Waiters> = self
            .wakers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(_, w)| Weak::clone(w))
            .collect();
        let file = LockName::from_name(name);
        for waiters in wakers.iter().filter_map(Weak::upgrade) {
            waiters.changed(file.file_name());
        }
    }
}

/// One listener thread, alive while a subscription holds it.
#[derive(Debug)]
struct Listener {
    target: Arc<Target>,
    hub: Arc<Hub>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.hub.closed.store(true, Ordering::Release);
    }
}

/// The listeners running, by their server settings.
static RUNNING: Mutex<Vec<Weak<Listener>>> = Mutex::new(Vec::new());

static NEXT_SUBSCRIPTION: AtomicU64 = AtomicU64::new(1);

/// A `Locker`'s place at a listener: its waiters are told of releases
/// until it is dropped.
#[derive(Debug)]
pub(super) struct Subscription {
    listener: Arc<Listener>,
    id: u64,
}

impl Subscription {
    /// Subscribes `waiters` to the listener of `target`'s server settings,
    /// starting one if none runs.
    pub(super) fn to(target: &Arc<Target>, waiters: Waiters) -> Result<Subscription> {
        let mut running = RUNNING.lock().unwrap_or_else(PoisonError::into_inner);
        running.retain(|listener| listener.strong_count() > 0);
        let found = running
            .iter()
            .filter_map(Weak::upgrade)
            .find(|listener| listener.target.same_settings(target));
        let listener = match found {
            Some(listener) => listener,
            None => {
                let listener = Arc::new(Listener {
                    target: Arc::clone(target),
                    hub: Arc::default(),
                });
                let (to, hub) = (Arc::clone(target), Arc::clone(&listener.hub));
                std::thread::Builder::new()
                    .name("leasehold-listen".into())
                    .spawn(move || listen(&to, &hub))
                    .map_err(|e| Error::Backend {
                        op: "start the PostgreSQL listener thread",
                        source: Box::new(e),
                    })?;
                running.push(Arc::downgrade(&listener));
                listener
            }
        };
        let id = NEXT_SUBSCRIPTION.fetch_add(1, Ordering::Relaxed);
        listener
            .hub
            .wakers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((id, waiters));
        Ok(Subscription { listener, id })
    }

    /// Whether releases elsewhere will wake the waiters now.
    pub(super) fn listening(&self) -> bool {
        self.listener.hub.listening.load(Ordering::Acquire)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.listener
            .hub
            .wakers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(id, _)| *id != self.id);
    }
}

/// Receives the names of locks released anywhere (`pg_notify` on channel
/// `leasehold`) on a connection of its own, reconnecting as needed, until
/// the last subscriber has gone.
fn listen(target: &Target, hub: &Hub) {
    while !hub.closed.load(Ordering::Acquire) {
        let mut client = match target.connect() {
            Ok(client) => client,
            Err(_) => {
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        if client.batch_execute("LISTEN leasehold").is_err() {
            continue;
        }
        hub.listening.store(true, Ordering::Release);
        'connected: while !hub.closed.load(Ordering::Acquire) {
            let mut notifications = client.notifications();
            let mut waiting = notifications.timeout_iter(Duration::from_millis(500));
            loop {
                match FallibleIterator::next(&mut waiting) {
                    Ok(Some(notification)) => hub.changed(notification.payload()),
                    Ok(None) => break,
                    Err(_) => break 'connected,
                }
            }
        }
        hub.listening.store(false, Ordering::Release);
    }
}
