//! Waking waiters when a lock may have become free.
//!
//! One watcher per `Locker` (started on first contention) reports removals
//! and close-after-write in the lock directory; the head of the matching
//! name's queue wakes and tries again. A holder that dies closes its lock
//! file, which is a close-after-write, so a dead holder wakes its waiters
//! too. A directory-strategy lock is watched as well while someone waits
//! for it: its holder keeps `owner.json` open for writing, so its death is
//! a close-after-write inside that directory. On Windows a handle's close
//! is no directory change: there the watcher waits on the holders'
//! processes that waiters name to it (`watch_deaths`). Polling at
//! `poll_interval` remains as a safety net against missed events, and is
//! the only mechanism where the watcher cannot run.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};

use super::dir::LockDir;
use crate::backend::Waiters;
use crate::sys::{self, DirEvent, DirWatch};

#[derive(Debug, Default)]
pub(crate) struct Watcher {
    /// `Some(None)`: tried, and the platform cannot watch.
    watch: OnceLock<Option<DirWatch>>,
    /// Set when the watch ended (the directory went away).
    gone: Arc<Mutex<bool>>,
    /// Where the watch does not see holders' deaths (Windows): the lock
    /// entries whose holders, as the last attempt found them, it waits
    /// on, every one (`Fs::name_holders`).
    named: Mutex<HashSet<String>>,
}

/// How many lock entries [`Watcher::named`] keeps at most: past that it is
/// emptied (their waiters poll until their next attempt names them again).
const NAMED: usize = 4096;

impl Watcher {
    /// Starts the watcher if it is not running; returns whether events will
    /// arrive, holders' deaths among them (otherwise the caller must poll;
    /// events that arrive still wake it early).
    pub(crate) fn ensure(&self, dir: &LockDir, waiters: &Waiters) -> bool {
        self.start(dir, waiters) && sys::WATCH_SEES_DEATHS
    }

    /// Has the running watcher report `entry` changed when one of the
    /// processes `pids` ends, where it does not see holders' deaths in the
    /// directory itself (`sys::watch_deaths`). Whether each one's end will
    /// be reported.
    pub(crate) fn watch_deaths(&self, entry: &str, pids: &[u64]) -> bool {
        match self.watch.get() {
            Some(Some(watch)) if !*self.gone.lock().unwrap_or_else(|e| e.into_inner()) => {
                sys::watch_deaths(watch, entry, pids)
            }
            _ => false,
        }
    }

    /// Records whether every holder of the lock at `entry`, as an attempt
    /// just found them, was named to the watch (`watch_deaths`).
    pub(crate) fn set_named(&self, entry: &str, named: bool) {
        let mut set = self.named.lock().unwrap_or_else(|e| e.into_inner());
        if !named {
            set.remove(entry);
            return;
        }
        if set.len() >= NAMED && !set.contains(entry) {
            set.clear();
        }
        set.insert(entry.to_owned());
    }

    /// Whether the last attempt on the lock at `entry` named every holder
    /// it found to the watch. Only a look in memory: the engine asks on
    /// the runtime's thread.
    pub(crate) fn named(&self, entry: &str) -> bool {
        self.named
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(entry)
    }

    /// Starts the watcher if it is not running; returns whether it runs,
    /// so that changes in the directory will arrive (holders' deaths among
    /// them only where `sys::WATCH_SEES_DEATHS`).
    pub(crate) fn start(&self, dir: &LockDir, waiters: &Waiters) -> bool {
        let watch = self.watch.get_or_init(|| {
            let weak = waiters.clone();
            let gone = Arc::clone(&self.gone);
            let watch = sys::watch_dir(
                dir.fd(),
                Box::new(move |event| {
                    let Some(waiters) = weak.upgrade() else {
                        return false;
                    };
                    match event {
                        DirEvent::Changed(name) => {
                            if let Some(name) = name.to_str() {
                                waiters.changed(name);
                            }
                        }
                        DirEvent::Overflow => waiters.all_changed(),
                        DirEvent::Gone => {
                            *gone.lock().unwrap_or_else(|e| e.into_inner()) = true;
                            waiters.all_changed();
                        }
                        DirEvent::Idle => {}
                    }
                    true
                }),
            );
            if watch.is_none() {
                tracing::debug!(dir = %dir.path().display(), "cannot watch the lock directory; polling");
            }
            watch
        });
        watch.is_some() && !*self.gone.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the watcher runs and reports holders' deaths, without
    /// starting it.
    pub(crate) fn running(&self) -> bool {
        matches!(self.watch.get(), Some(Some(_)))
            && sys::WATCH_SEES_DEATHS
            && !*self.gone.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Also watches inside the lock directory `file_name` (directory
    /// strategy). Returns whether events from it will arrive.
    pub(crate) fn ensure_child(&self, file_name: &str) -> bool {
        match self.watch.get() {
            Some(Some(watch)) => watch.watch_child(file_name),
            _ => false,
        }
    }
}
