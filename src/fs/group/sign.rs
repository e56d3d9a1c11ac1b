//! Keeping a group's marker honest: when the holder it names dies, one of
//! this process's holders puts its own record there at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::{Found, JSON, MEMBER, judge_entry, marker, open_members, write_marker};
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

/// How often a `Locker` that cannot watch a group's members directory
/// looks whether the holder its marker names died ([`poll_markers`]).
pub(crate) const SIGN_POLL: Duration = Duration::from_millis(20);

/// The groups this `Locker` holds a place in, by lock file name.
#[derive(Debug, Default)]
pub(crate) struct Signers {
    map: Mutex<std::collections::HashMap<String, Vec<Weak<Sign>>>>,
    /// Whether a thread of [`poll_markers`] runs for these.
    polling: AtomicBool,
}

/// Where no watcher reports the death of a group's holder, looks at every
/// marker `signers` signs each [`SIGN_POLL`], on a thread of its own,
/// until it signs none (or the `Locker` is gone); unless such a thread
/// runs already. A marker naming a dead holder is then re-signed within
/// about that, as the watcher would have done at once.
pub(crate) fn poll_markers(signers: &Arc<Signers>) {
    if signers.polling.swap(true, Ordering::AcqRel) {
        return;
    }
    let weak = Arc::downgrade(signers);
    let spawned = std::thread::Builder::new()
        .name("leasehold-markers".into())
        .spawn(move || {
            loop {
                std::thread::sleep(SIGN_POLL);
                let Some(signers) = weak.upgrade() else {
                    return;
                };
                signers.all_changed();
                if signers.is_empty() {
                    signers.polling.store(false, Ordering::Release);
                    // A group joined meanwhile found this thread running:
                    // keep going for it, unless another thread took over.
                    if signers.is_empty() || signers.polling.swap(true, Ordering::AcqRel) {
                        return;
                    }
                }
            }
        });
    if let Err(error) = spawned {
        signers.polling.store(false, Ordering::Release);
        tracing::warn!(%error, "cannot start the thread that looks after shared locks' markers; they are re-signed at renewals only");
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

    /// Whether no live holder of this `Locker` signs a marker.
    fn is_empty(&self) -> bool {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        !map.values().flatten().any(|sign| sign.strong_count() > 0)
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
        let Some(named) = marked.uuid.as_ref().map(|uuid| format!("{MEMBER}{uuid}{JSON}")) else {
            return Ok(true);
        };
        if named == self.file_name {
            return Ok(false);
        }
        let Some(dir) = open_members(ctx, &self.name)? else {
            return Ok(false);
        };
        Ok(!judge_entry(ctx, &dir, &named)?.is_some_and(|e| e.live))
    }
}
