//! Keeping a group's marker honest: when the holder it names dies, one of
//! this process's holders puts its own record there at once.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::{Found, judge_entry, marker, open_members, write_marker};
use crate::error::Result;
use crate::fs::context::Ctx;
use crate::name::LockName;

/// What a holder's process needs to re-sign its group's marker when the
/// holder the marker names dies: shared between the [`Member`] (which
/// keeps `bytes`, its latest record, current) and the process's
/// [`Signers`], which the directory watcher calls on a change in the
/// members directory.
#[derive(Debug)]
pub(crate) struct Sign {
    pub(super) ctx: Arc<Ctx>,
    pub(super) name: LockName,
    pub(super) group: Option<String>,
    pub(super) file_name: String,
    pub(super) bytes: Mutex<Vec<u8>>,
}

/// How often the marker poll ([`Signers::poll`]) looks, at the most: a
/// marker naming a dead holder is re-signed within about that. With many
/// groups to look at, it pauses four times as long as a look took, so that
/// it takes at most a fifth of a core.
pub(crate) const SIGN_POLL: Duration = Duration::from_millis(20);

/// The groups this `Locker` holds a place in, by lock file name.
#[derive(Debug, Default)]
pub(crate) struct Signers {
    map: Mutex<HashMap<String, Vec<Weak<Sign>>>>,
    /// The groups no watcher looks after, which the marker poll does.
    polled: Mutex<HashSet<String>>,
    /// Whether the marker poll's thread runs.
    polling: AtomicBool,
}

/// Runs the marker poll of `signers` until nothing is left to poll: the
/// thread holds the signers (not the `Locker`, whose guards may outlive
/// it), and so keeps the markers of every group still held honest.
fn run_poll(signers: &Arc<Signers>) {
    let mut pause = SIGN_POLL;
    loop {
        std::thread::sleep(pause);
        let started = std::time::Instant::now();
        let any = signers.look_at_polled();
        pause = SIGN_POLL.max(started.elapsed() * 4);
        if !any {
            signers.polling.store(false, Ordering::Release);
            // A group added meanwhile found this thread running: keep
            // going for it, unless another thread took over.
            if !signers.has_polled() || signers.polling.swap(true, Ordering::AcqRel) {
                return;
            }
        }
    }
}

impl Signers {
    pub(super) fn add(&self, sign: &Arc<Sign>) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() > 1024 {
            map.retain(|_, signs| signs.iter().any(|s| s.strong_count() > 0));
        }
        let signs = map.entry(sign.name.file_name().to_owned()).or_default();
        signs.retain(|s| s.strong_count() > 0);
        signs.push(Arc::downgrade(sign));
    }

    /// Something changed in the members directory of the lock
    /// `file_name`: if a holder died, and the marker names it, put one of
    /// ours there, so the marker never names a dead process for long
    /// (programs that judge a lock by its pid would take it).
    pub(crate) fn changed(&self, file_name: &str) {
        let sign = {
            let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            let Some(signs) = map.get_mut(file_name) else {
                return;
            };
            signs.retain(|s| s.strong_count() > 0);
            let sign = signs.iter().find_map(Weak::upgrade);
            if signs.is_empty() {
                map.remove(file_name);
            }
            sign
        };
        if let Some(sign) = sign
            && let Err(error) = sign.resign()
        {
            tracing::debug!(lock = sign.name.as_str(), %error, "re-signing a shared lock's marker failed");
        }
    }

    /// Has the marker poll look after the group `file_name`, which no
    /// watcher does: where no watcher reports the death of its holders,
    /// its marker is looked at every [`SIGN_POLL`] on a thread of the
    /// poll's own (started unless it runs), as long as this `Locker`
    /// holds a place in it.
    pub(crate) fn poll(self: &Arc<Self>, file_name: &str) {
        self.polled_names().insert(file_name.to_owned());
        self.start_polling();
    }

    /// Has the marker poll look after every group held: the `Locker` is
    /// gone, and its watcher with it, but guards may outlive it.
    pub(crate) fn poll_all(self: &Arc<Self>) {
        let names: Vec<String> = self.live_names();
        if names.is_empty() {
            return;
        }
        self.polled_names().extend(names);
        self.start_polling();
    }

    fn start_polling(self: &Arc<Self>) {
        if self.polling.swap(true, Ordering::AcqRel) {
            return;
        }
        let signers = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("leasehold-markers".into())
            .spawn(move || run_poll(&signers));
        if let Err(error) = spawned {
            self.polling.store(false, Ordering::Release);
            tracing::warn!(%error, "cannot start the thread that looks after shared locks' markers; they are re-signed at renewals only");
        }
    }

    /// Looks at every polled group's marker (see [`changed`](Self::changed));
    /// forgets the groups this `Locker` holds no place in any more.
    /// Whether any is left.
    fn look_at_polled(&self) -> bool {
        let live: HashSet<String> = self.live_names().into_iter().collect();
        let names: Vec<String> = {
            let mut polled = self.polled_names();
            polled.retain(|name| live.contains(name));
            polled.iter().cloned().collect()
        };
        for name in &names {
            self.changed(name);
        }
        !names.is_empty()
    }

    fn has_polled(&self) -> bool {
        let live: HashSet<String> = self.live_names().into_iter().collect();
        self.polled_names().iter().any(|name| live.contains(name))
    }

    /// The groups a live holder of this `Locker` signs for.
    fn live_names(&self) -> Vec<String> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.iter()
            .filter(|(_, signs)| signs.iter().any(|sign| sign.strong_count() > 0))
            .map(|(name, _)| name.clone())
            .collect()
    }

    fn polled_names(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.polled.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Events were lost: look at every group.
    pub(crate) fn all_changed(&self) {
        let names: Vec<String> = self
            .map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        for name in names {
            self.changed(&name);
        }
    }
}

impl Sign {
    /// Re-signs the marker with our record if the holder it names is gone
    /// and we still hold.
    fn resign(&self) -> Result<()> {
        // Most events are joins, leaves and renewals, not deaths: look
        // first without the directory lock (and without holding up the
        // processes that work under it), then again under it.
        if !self.marker_names_the_dead()? {
            return Ok(());
        }
        let ctx = &self.ctx;
        // On the watcher thread: never hold up its wake-ups for long. A
        // busy directory means another process is at work; this holder's
        // next renewal re-signs anyway.
        let Ok(Some(_mutation)) = ctx
            .dir
            .lock_within(self.name.file_name(), std::time::Duration::from_millis(20))
        else {
            return Ok(());
        };
        let Some(dir) = open_members(ctx, &self.name)? else {
            return Ok(());
        };
        if !matches!(judge_entry(ctx, &dir, &self.file_name)?, Some(e) if e.live) {
            return Ok(());
        }
        if !self.marker_names_the_dead()? {
            return Ok(());
        }
        let Some(found) = Found::open(ctx, &self.name)? else {
            return Ok(());
        };
        if marker(&found.parsed).is_some_and(|r| r.group == self.group) {
            let bytes = self.bytes.lock().unwrap_or_else(|e| e.into_inner()).clone();
            write_marker(ctx, &self.name, &found, &bytes)?;
        }
        Ok(())
    }

    /// Whether our group's marker names a holder that is not alive (and
    /// not us).
    fn marker_names_the_dead(&self) -> Result<bool> {
        let ctx = &self.ctx;
        let Some(found) = Found::open(ctx, &self.name)? else {
            return Ok(false);
        };
        let Some(marked) = marker(&found.parsed).filter(|r| r.group == self.group) else {
            return Ok(false);
        };
        // The holder it names has either name: `m-<uuid>.json`, or the
        // upgradable holder's `m-up-<uuid>.json` (see `fs/upgrade.rs`).
        let Some(names) = marked
            .uuid
            .as_ref()
            .map(|uuid| [false, true].map(|upgradable| crate::fs::members::member_file(uuid, upgradable)))
        else {
            return Ok(true);
        };
        if names.contains(&self.file_name) {
            return Ok(false);
        }
        let Some(dir) = open_members(ctx, &self.name)? else {
            return Ok(false);
        };
        for named in &names {
            if judge_entry(ctx, &dir, named)?.is_some_and(|e| e.live) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}
