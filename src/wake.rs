//! Waking waiters when a lock file may have become free.
//!
//! One watcher per `Locker` (started on first contention) reports removals
//! and close-after-write in the lock directory; the head of the matching
//! name's queue wakes and tries again. A holder that dies closes its lock
//! file, which is a close-after-write, so a dead holder wakes its waiters
//! too. Polling at `poll_interval` remains as a safety net against missed
//! events, and is the only mechanism where the watcher cannot run.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Weak};

use crate::dir::LockDir;
use crate::queue::Slots;
use crate::sys::{self, DirEvent};

const NOT_STARTED: u8 = 0;
const RUNNING: u8 = 1;
const UNAVAILABLE: u8 = 2;

#[derive(Debug, Default)]
pub(crate) struct Watcher {
    state: Arc<AtomicU8>,
}

impl Watcher {
    /// Starts the watcher if it is not running; returns whether events will
    /// arrive (otherwise the caller must poll).
    pub(crate) fn ensure(&self, dir: &LockDir, slots: &Arc<Slots>) -> bool {
        match self.state.load(Ordering::Acquire) {
            RUNNING => return true,
            UNAVAILABLE => return false,
            _ => {}
        }
        if self
            .state
            .compare_exchange(NOT_STARTED, RUNNING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return self.state.load(Ordering::Acquire) == RUNNING;
        }
        let weak: Weak<Slots> = Arc::downgrade(slots);
        let state = Arc::clone(&self.state);
        let started = sys::watch_dir(
            dir.fd(),
            Box::new(move |event| {
                let Some(slots) = weak.upgrade() else {
                    return false;
                };
                match event {
                    DirEvent::Changed(name) => {
                        if let Some(name) = name.to_str() {
                            slots.changed(name);
                        }
                    }
                    DirEvent::Overflow => slots.all_changed(),
                    DirEvent::Gone => {
                        state.store(UNAVAILABLE, Ordering::Release);
                        slots.all_changed();
                    }
                    DirEvent::Idle => {}
                }
                true
            }),
        );
        if !started {
            tracing::debug!(dir = %dir.path().display(), "cannot watch the lock directory; polling");
            self.state.store(UNAVAILABLE, Ordering::Release);
        }
        started
    }
}
