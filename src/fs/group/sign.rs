//! Keeping a group's marker honest: when the holder it names dies, one of
//! this process's holders puts its own record there at once.

use std::sync::{Arc, Mutex, Weak};

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

/// The groups this `Locker` holds a place in, by lock file name.
#[derive(Debug, Default)]
pub(crate) struct Signers {
    map: Mutex<std::collections::HashMap<String, Vec<Weak<Sign>>>>,
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
