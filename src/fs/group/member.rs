//! One holder of a shared lock or a semaphore permit, as this process
//! holds it: its record, its share of the marker's flock, renewal and
//! leaving.

use crate::sys::syscall::{Flock, WriteAt};
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::sign::{Sign, Signers};
use super::{
    Found, JSON, TMP, create_record, marker, members, members_dir, remove_dead, remove_marker,
    remove_members_dir, scan, waiter, write_marker,
};
use crate::backend::{Mode, Renewal, Tokens};
use crate::error::{IoResultExt, LossReason, Result};
use crate::fs::context::Ctx;
use crate::fs::layout::Strategy;
use crate::fs::mutex::MutationLock;
use crate::fs::release::{self, Release};
use crate::fs::{fence, file};
use crate::name::LockName;
use crate::record::{OwnRecord, Parsed};
use crate::sys;
use crate::sys::syscall::{self, Errno};

/// One holder of a shared lock or a semaphore permit: its record in the
/// members directory, created, flocked and renewed by this process.
/// Dropping it leaves the group (synchronously, as `FsLock` does), and
/// the last holder to leave removes the marker.
#[derive(Debug)]
pub(crate) struct Member {
    ctx: Arc<Ctx>,
    name: LockName,
    mode: Mode,
    /// The members directory and its identity.
    dir: File,
    dir_id: (u64, u64),
    /// Our record, open and flocked; closed once we left and unlinked it:
    /// on Windows an unlinked file keeps a (pending) name in the members
    /// directory until its last handle closes, and the last holder to
    /// leave must find that directory empty to remove it.
    file: Option<File>,
    file_name: String,
    id: (u64, u64),
    pub(in crate::fs) record: OwnRecord,
    record_len: usize,
    /// The marker's node, under our shared flock while we hold.
    pub(in crate::fs) marker: Option<File>,
    /// For re-signing the marker when its holder dies.
    sign: Arc<Sign>,
    armed: bool,
    /// Set once we removed our record while leaving without the name's
    /// mutation lock: whether it was still ours then.
    left: Option<bool>,
}

impl Member {
    /// Creates our record in `dir`, flocked before it is written.
    pub(in crate::fs) fn create(
        ctx: &Arc<Ctx>,
        name: &LockName,
        mode: Mode,
        group: String,
        dir: File,
        upgradable: bool,
    ) -> Result<Self> {
        let mut record = ctx.own_record(name);
        record.mode = Some(mode.as_str());
        record.permits = match mode {
            Mode::Permit(n) => Some(n),
            _ => None,
        };
        record.group = Some(group);
        let file_name = crate::fs::members::member_file(&record.uuid, upgradable);
        let path = ctx.path_of(&members_dir(name.file_name())).join(&file_name);
        let (file, record_len, id) =
            create_record(&dir, &file_name, &record, ctx.settings.durable, &|| path.clone())?;
        let identities = failpoint!("group.record.after_rename")
            .context("inspect member record", || path.clone())
            .and_then(|()| syscall::meta(&dir).context("inspect members directory", || path.clone()));
        let dir_meta = match identities {
            Ok(identities) => identities,
            Err(error) => {
                // No holder after all: its record goes now (the caller
                // holds the mutation lock), not once judged by its free
                // flock, the pid in it alive.
                let _ = syscall::unlink_at(&dir, file_name.as_str());
                return Err(error);
            }
        };
        let sign = Arc::new(Sign {
            ctx: Arc::clone(ctx),
            name: name.clone(),
            group: record.group.clone(),
            file_name: file_name.clone(),
            bytes: Mutex::new(record.to_bytes(0)),
        });
        let member = Member {
            ctx: Arc::clone(ctx),
            name: name.clone(),
            mode,
            dir,
            dir_id: (dir_meta.dev(), dir_meta.ino()),
            file: Some(file),
            file_name,
            id,
            record,
            record_len,
            marker: None,
            sign,
            armed: true,
            left: None,
        };
        Ok(member)
    }

    pub(crate) fn record(&self) -> &OwnRecord {
        &self.record
    }

    /// Has `signers` re-sign the marker for us when its holder dies.
    pub(in crate::fs) fn sign_with(&self, signers: &Signers) {
        signers.add(&self.sign);
    }

    fn path(&self) -> PathBuf {
        self.ctx
            .path_of(&members_dir(self.name.file_name()))
            .join(&self.file_name)
    }

    /// Our record, open, unless we left.
    fn record_file(&self) -> Result<&File> {
        self.file
            .as_ref()
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
            .context("write member record", || self.path())
    }

    /// Our record's file name in the members directory.
    pub(in crate::fs) fn file_name(&self) -> &str {
        &self.file_name
    }

    /// The members directory, open.
    pub(in crate::fs) fn members(&self) -> &File {
        &self.dir
    }

    /// Gives up this membership without leaving the group: for an upgrade
    /// (`fs/upgrade.rs`), under the name's mutation lock, which keeps the
    /// marker's node (returned, under our flock) as its exclusive lock.
    /// Our record is removed.
    pub(in crate::fs) fn dissolve(mut self) -> Result<Option<File>> {
        match syscall::unlink_at(&self.dir, self.file_name.as_str()) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(e).context("remove member record", || self.path()),
        }
        self.file = None;
        self.armed = false;
        Ok(self.marker.take())
    }

    /// Whether our record is still where we made it.
    pub(in crate::fs) fn still_here(&self) -> Result<bool> {
        let ctx = &self.ctx;
        let dir_name = members_dir(self.name.file_name());
        match syscall::stat_at(ctx.dir.fd(), &dir_name) {
            Ok(st) if (st.dev, st.ino) == self.dir_id => {}
            Ok(_) | Err(Errno::ENOENT) => return Ok(false),
            Err(e) => return Err(e).context("inspect members directory", || ctx.path_of(&dir_name)),
        }
        match syscall::stat_at(&self.dir, &self.file_name) {
            Ok(st) => Ok((st.dev, st.ino) == self.id),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(e).context("inspect member record", || self.path()),
        }
    }

    /// The marker at the lock path, if it is our group's: the very node
    /// we joined (which we keep open, so it is no other group's, whatever
    /// it reads: a marker file rewritten in place by another member
    /// without the mutation lock can read torn), or, failing that, a
    /// marker that names our group.
    fn our_marker(&self) -> Result<Option<Found>> {
        let Some(found) = Found::open(&self.ctx, &self.name)? else {
            return Ok(None);
        };
        let joined = self
            .marker
            .as_ref()
            .and_then(|node| syscall::meta(node).ok())
            .is_some_and(|meta| (meta.dev(), meta.ino()) == found.identity());
        let ours = joined || marker(&found.parsed).is_some_and(|r| r.group == self.record.group);
        Ok(ours.then_some(found))
    }

    /// `None` while we still hold; otherwise why not. Takes no lock. A
    /// marker file rewritten in place can be read torn: only a marker that
    /// reads whole, and is another group's or no marker, says "lost" (a
    /// lock directory's `owner.json` is replaced by rename, so it always
    /// reads whole); one that stays torn leaves it to the next check.
    fn lost(&self) -> Result<Option<LossReason>> {
        if let Some(moved) = self.ctx.dir_moved() {
            return Ok(Some(moved));
        }
        if !self.still_here()? {
            return Ok(Some(LossReason::Replaced));
        }
        for look in 0..3 {
            if look > 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            let Some(found) = Found::open(&self.ctx, &self.name)? else {
                return Ok(Some(LossReason::Replaced));
            };
            match &found.parsed {
                Parsed::Record(_) => {
                    let ours = marker(&found.parsed).is_some_and(|r| r.group == self.record.group);
                    return Ok((!ours).then_some(LossReason::Replaced));
                }
                // Torn, or being written: look again.
                _ => continue,
            }
        }
        Ok(None)
    }

    /// Extends our lease; keeps the marker naming a live holder (us, if
    /// its holder is gone) and its lease current.
    ///
    /// Our own record is renewed without any lock, as an exclusive lock
    /// is (see `Whole::renew`): only we write it, and a reclaimer of a
    /// dead member judges it under the name's mutation lock from a record
    /// read after its lease's end. Re-signing the marker, which every
    /// holder writes, needs that lock; it is only tried, never waited
    /// for: when another process holds it (say it is frozen while joining),
    /// this renewal skips the marker, and a later one signs it.
    pub(crate) fn renew(&mut self, cutoff: u64) -> Result<Renewal> {
        let ctx = Arc::clone(&self.ctx);
        if let Some(moved) = ctx.dir_moved() {
            return Ok(Renewal::Lost(moved));
        }
        failpoint!("group.renew.after_dirlock").context("renew shared lock", || self.path())?;
        if !self.still_here()? {
            return Ok(Renewal::Lost(LossReason::Replaced));
        }
        let boot = sys::boot_clock_ms();
        if boot >= cutoff {
            return Ok(Renewal::Lost(LossReason::LeaseExpired));
        }
        let mut record = self.record.clone();
        record.renew(SystemTime::now(), boot);
        let path = || self.path();
        self.record_len = file::write(self.record_file()?, self.record_len, &record, false, path)?;
        self.record = record;
        *self.sign.bytes.lock().unwrap_or_else(|e| e.into_inner()) = self.record.to_bytes(0);
        if sys::boot_clock_ms() >= cutoff {
            return Ok(Renewal::Lost(LossReason::LeaseExpired));
        }
        let Some(_mutation) = ctx.dir.mutation_lock_now(self.name.file_name())? else {
            // Another process changes the group (or is frozen while it
            // does). The marker is what velocious and pi-research judge
            // the name by: when it would lapse before a later renewal
            // could sign it, sign it now without the lock.
            self.sign_before_it_lapses()?;
            return Ok(Renewal::Renewed);
        };
        if !self.still_here()? {
            return Ok(Renewal::Lost(LossReason::Replaced));
        }
        let Some(found) = self.our_marker()? else {
            return Ok(Renewal::Lost(LossReason::Replaced));
        };
        // The marker takes the record just renewed, whoever it named: its
        // lease then always ends after every holder's last renewal, and a
        // holder frozen since never leaves it showing a lapsed lease to
        // programs that judge the lock path by its lease.
        write_marker(&ctx, &self.name, &found, &self.record.to_bytes(0))?;
        Ok(Renewal::Renewed)
    }

    pub(crate) fn check(&self) -> Result<Option<LossReason>> {
        self.lost()
    }

    /// Re-signs our group's marker, without the name's mutation lock, if
    /// its lease ends within three quarters of a lease (a renewal comes
    /// at least every half lease, and a lease's last quarter is its
    /// safety margin): so a process frozen while holding that lock never
    /// lets the marker show a lapsed lease while we hold.
    ///
    /// Done so that no concurrent writer can tear it: a lock directory's
    /// `owner.json` is replaced by a rename from a private name in the
    /// members directory (a `.tmp-` name, removed as unfinished by a
    /// group's next change if we die first); a marker file is rewritten in
    /// place as under the lock, which a writer frozen mid-write and woken
    /// at that instant could leave torn (then read as a record being
    /// written, never as a lapsed one).
    fn sign_before_it_lapses(&self) -> Result<()> {
        let Some(found) = self.our_marker()? else {
            return Ok(());
        };
        let Parsed::Record(record) = &found.parsed else {
            return Ok(());
        };
        let due = SystemTime::now() + self.ctx.settings.lease.mul_f64(0.75);
        if record.lease_expires_at.is_some_and(|end| end > due) {
            return Ok(());
        }
        self.sign_unlocked(&found, &self.record.to_bytes(0))
    }

    /// Signs our group's marker with our own record, without the name's
    /// mutation lock (a joiner that found the group deserted, see
    /// `group::join_unlocked`); whether the marker is still ours after.
    pub(in crate::fs) fn sign_as_representative(&self) -> Result<bool> {
        let Some(found) = self.our_marker()? else {
            return Ok(false);
        };
        self.sign_unlocked(&found, &self.record.to_bytes(0))?;
        Ok(self.our_marker()?.is_some())
    }

    /// Signs our group's marker `found` with `bytes` without the name's
    /// mutation lock (see [`Self::sign_before_it_lapses`]).
    fn sign_unlocked(&self, found: &Found, bytes: &[u8]) -> Result<()> {
        match self.ctx.settings.strategy {
            Strategy::ExclusiveFile => write_marker(&self.ctx, &self.name, found, bytes),
            Strategy::Directory => {
                let tmp = format!("{TMP}sign-{}{JSON}", self.record.uuid);
                let path = || self.path();
                failpoint!("group.sign.before_tmp").context("sign shared lock marker", path)?;
                let file = syscall::open_at(&self.dir, tmp.as_str(), syscall::Open::Replace)
                    .context("sign shared lock marker", path)?;
                // Flocked, so that a process under the mutation lock keeps
                // it (`remove_dead` removes only unfinished files whose
                // flock is free: their makers died).
                let written = file
                    .try_flock()
                    .map_err(std::io::Error::from)
                    .and_then(|()| file.write_all_at(bytes, 0))
                    .context("sign shared lock marker", path)
                    .and_then(|()| {
                        failpoint!("group.sign.before_rename").context("sign shared lock marker", path)
                    })
                    .and_then(|()| {
                        syscall::rename_between(&self.dir, &tmp, found.node(), "owner.json")
                            .context("sign shared lock marker", path)
                    });
                if written.is_err() {
                    let _ = syscall::unlink_at(&self.dir, tmp.as_str());
                }
                // Unlinked, it is gone only once closed, on Windows (see
                // `file`).
                drop(file);
                // The group may have ended while our private name was in
                // its members directory: its last holder's `rmdir` then
                // failed on that name, and what is left is empty and
                // nobody's. (Ended: our marker is gone, its rename failed,
                // or it moved our record into the marker's trash.)
                if !matches!(self.our_marker(), Ok(Some(_))) {
                    waiter::tidy_members(&self.ctx, &self.name, Duration::ZERO);
                }
                written
            }
        }
    }

    /// A shared holder's token: the fencing counter as it stands (every
    /// exclusive holder before us had one no greater, every one after us
    /// gets a greater one). A permit's: the next token of the name's
    /// counter, one per acquisition.
    pub(crate) fn reserve_tokens(&mut self) -> Result<Option<Tokens>> {
        let ctx = Arc::clone(&self.ctx);
        let name = self.name.clone();
        if self.mode == Mode::Shared {
            // Read without the mutation lock when another process holds it
            // (slow, or frozen while it changes the name): nobody advances
            // the counter while we hold the name shared (an exclusive
            // acquisition or an upgrade waits for us to leave, and a
            // counter removed meanwhile reads as the highest token anyone
            // could have been handed), and the counter is replaced by
            // rename, so it reads whole.
            let _mutation = ctx.dir.mutation_lock_now(name.file_name())?;
            if !self.still_here()? {
                return Ok(None);
            }
            let now = fence::current(&ctx, &name)?;
            return Ok(Some(Tokens { next: now, last: now }));
        }
        let mut first = None;
        let tokens = fence::reserve(&ctx, &name, &|| self.still_here(), &mut |token| {
            first = Some(token);
            Ok(())
        })?;
        if let Some(token) = first {
            let mut record = self.record.clone();
            record.fencing_token = Some(token);
            let path = || self.path();
            self.record_len = file::write(self.record_file()?, self.record_len, &record, false, path)?;
            self.record = record;
            *self.sign.bytes.lock().unwrap_or_else(|e| e.into_inner()) = self.record.to_bytes(0);
        }
        Ok(tokens)
    }

    /// Leaves the group (see `fs/release.rs`); `None` when we held to
    /// the end, otherwise why not.
    pub(crate) fn release(mut self, confirm: bool) -> Result<Option<LossReason>> {
        release::let_go(&mut self, confirm)
    }

    /// Removes our record and, if we were the last holder, the marker; if
    /// not, re-signs the marker with a live holder's record (which also
    /// wakes the waiters of other processes: a permit is free). `None` if
    /// we were the last and the name's mutation lock stayed taken for
    /// `patience`: ending the group needs it.
    ///
    /// When another process holds that lock (slow, or frozen while it
    /// changes this name), we leave without it: our record goes (ours
    /// alone), and the marker is signed without the lock, as
    /// [`Self::sign_unlocked`] does, with a live holder's record. Only the
    /// last holder's leaving waits for the lock, to end the group under the
    /// seal (`members::tidy`).
    fn leave(&mut self, patience: Duration) -> Result<Option<bool>> {
        let ctx = Arc::clone(&self.ctx);
        let name = self.name.clone();
        let lock = name.file_name();
        let mutation = match ctx.dir.mutation_lock_now(lock)? {
            Some(mutation) => mutation,
            None => {
                if let Some(held) = self.leave_unlocked()? {
                    return Ok(Some(held));
                }
                match ctx.dir.lock_within(lock, patience)? {
                    Some(mutation) => mutation,
                    None => return Ok(None),
                }
            }
        };
        failpoint!("group.leave.after_dirlock").context("remove member record", || self.path())?;
        self.leave_locked(mutation, true).map(Some)
    }

    /// The rest of [`Self::leave`], under the name's mutation lock: our
    /// record removed, then the marker removed if nobody else holds, or
    /// (with `sign`) re-signed with a live holder's record if somebody
    /// does. Whether our record was still ours.
    fn leave_locked(&mut self, mutation: MutationLock<'_>, sign: bool) -> Result<bool> {
        let ctx = Arc::clone(&self.ctx);
        // Whether we removed our record already, without the mutation
        // lock: what becomes of the group after that is no loss of ours.
        let left_before = self.left.is_some();
        let here = self.remove_own()?;
        failpoint!("group.leave.after_unlink").context("leave shared lock", || self.path())?;
        let dir_name = members_dir(self.name.file_name());
        let path = || ctx.path_of(&dir_name);
        let mut scan = scan(&ctx, &self.dir, &path)?;
        remove_dead(&ctx, &self.dir, &mut scan);
        let Some(found) = self.our_marker()? else {
            // Never marked (the path was taken first) or taken over: the
            // members directory goes if nothing is left in it. (Or, if we
            // left before without the mutation lock, the last of us, our
            // group ended since by another's hand: a process under the
            // mutation lock that found its marker with no live member.)
            if scan.live_members().next().is_none() {
                // A shared marker that stands with nobody left holding is
                // ended, as a join under the lock ends it: the group after
                // ours, whose last leaver left it standing while our record
                // was still here (see `next_signer`); else it would stand
                // until the next join. Best effort: our record is gone
                // already, and what becomes of another group is no loss of
                // ours.
                match Found::open(&ctx, &self.name) {
                    Ok(Some(standing)) if marker(&standing.parsed).is_some() => {
                        let ended = members::tidy(&ctx, &self.name, mutation, |mutation, then| {
                            remove_marker(&ctx, &self.name, &standing, mutation, then)
                        });
                        if let Err(error) = ended {
                            tracing::debug!(lock = self.name.as_str(), %error, "could not end a group nobody holds");
                        }
                    }
                    Ok(_) => {
                        if scan.waiters.is_empty() {
                            remove_members_dir(&ctx, &dir_name);
                        }
                    }
                    Err(error) => {
                        tracing::debug!(lock = self.name.as_str(), %error, "could not look at the lock path");
                    }
                }
            }
            return Ok(left_before && here);
        };
        // The marker takes the record of the holder of our group renewed
        // last, whose lease ends last. (A live record of another group is
        // a joiner's that found that group before it ended, about to
        // withdraw: never the marker's; while it is there, the group does
        // not end (`members::tidy`), and its withdrawal ends it, above.)
        match self.next_signer(&scan) {
            Some(next) if sign => write_marker(&ctx, &self.name, &found, &next.bytes)?,
            Some(_) => {}
            // The last (unless somebody joins without the mutation lock
            // before the seal: then the marker stays, theirs to sign).
            None => {
                members::tidy(&ctx, &self.name, mutation, |mutation, then| {
                    remove_marker(&ctx, &self.name, &found, mutation, then)
                })?;
            }
        }
        Ok(here)
    }

    /// The live holder of our group whose record the marker takes when we
    /// leave: the one renewed last, whose lease ends last. Only our
    /// group's: a members directory can also hold, for a moment, the
    /// record of a joiner of the group before ours (it found that group's
    /// marker before its end, placed its record, and withdraws once it
    /// sees the marker replaced). Signed with that record, the marker would
    /// name another group, and every holder left would take its lock for
    /// lost.
    fn next_signer<'s>(&self, scan: &'s members::Scan) -> Option<&'s members::Entry> {
        scan.live_members()
            .filter(|e| e.record().is_some_and(|r| r.group == self.record.group))
            .max_by_key(|e| e.lease_end())
    }

    /// Withdraws a record that was refused once it was in place (a join
    /// that counted too many holders, met a waiting exclusive acquisition,
    /// or found the group being ended): removes it at once, whatever the
    /// mutation lock, and then ends the group if nobody else holds.
    ///
    /// Removing the record alone is not enough. While it was in place, the
    /// group's last leaver may have counted it as a holder and left the
    /// group's end to it (a leaver that counts a live member leaves the
    /// marker standing); a withdrawal that did not end the group then
    /// would leave a marker nobody holds, for good. As with two leavers,
    /// whichever of a leaver and a withdrawer counts last sees both
    /// records gone, and ends the group.
    ///
    /// With `mutation` (the caller holds the name's mutation lock), the
    /// group ends under it; without, as a dropped holder's does (waiting
    /// briefly for the lock, then on the release thread).
    pub(in crate::fs) fn withdraw(mut self, mutation: Option<MutationLock<'_>>) {
        let ctx = Arc::clone(&self.ctx);
        let dir_name = members_dir(self.name.file_name());
        let path = || ctx.path_of(&dir_name);
        let others = self
            .remove_own()
            .and_then(|_| scan(&ctx, &self.dir, &path))
            .map(|scan| scan.live_members().next().is_some());
        match (others, mutation) {
            // Somebody else holds: their leaving ends the group.
            (Ok(true), _) => self.armed = false,
            (_, Some(mutation)) => {
                self.armed = false;
                // Failed (an I/O error): dropped armed, it leaves as a
                // holder does (the mutation lock is let go first), and the
                // release thread tries again if it must.
                if let Err(error) = self.leave_locked(mutation, false) {
                    tracing::debug!(lock = self.name.as_str(), %error, "a withdrawn join could not end its group yet");
                    self.armed = true;
                }
            }
            // Dropped armed: it leaves as a holder does, and ends the
            // group if it is the last.
            (_, None) => {}
        }
    }

    /// Removes our record, once; whether it was still ours.
    fn remove_own(&mut self) -> Result<bool> {
        if let Some(held) = self.left {
            return Ok(held);
        }
        let here = self.still_here()?;
        if here {
            // A permit given back: others may stand in line for it.
            if let Mode::Permit(_) = self.mode {
                self.ctx
                    .lines
                    .releasing_permit(self.ctx.dir.fd(), self.name.file_name());
            }
            match syscall::unlink_at(&self.dir, self.file_name.as_str()) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(e).context("remove member record", || self.path()),
            }
        }
        // Unlinked, it is gone only once closed, on Windows (see `file`).
        self.file = None;
        self.left = Some(here);
        Ok(here)
    }

    /// Leaves without the name's mutation lock: `None` if no live holder
    /// is left, so that the group must end under the lock.
    fn leave_unlocked(&mut self) -> Result<Option<bool>> {
        // Held to the end: our record, and our group's marker, looked at
        // before our record goes (as `lost` looks: a marker read torn
        // while another rewrites it is no loss). After, the group may
        // end without us.
        if self.left.is_none() && self.lost()?.is_some() {
            self.remove_own()?;
            self.left = Some(false);
        }
        let here = self.remove_own()?;
        failpoint!("unlocked.leave.after_unlink").context("leave shared lock", || self.path())?;
        let dir_name = members_dir(self.name.file_name());
        let path = || self.ctx.path_of(&dir_name);
        let scan = scan(&self.ctx, &self.dir, &path)?;
        // No holder of our group is left: its end (or, while a joiner of
        // another group withdraws, its marker left standing) is decided
        // under the lock.
        let Some(next) = self.next_signer(&scan) else {
            return Ok(None);
        };
        // Best effort: we are gone already, and the holders' renewals
        // sign the marker too.
        if let Some(found) = self.our_marker()?
            && let Err(error) = self.sign_unlocked(&found, &next.bytes)
        {
            tracing::debug!(lock = self.name.as_str(), %error, "could not sign the marker for the holders left");
        }
        Ok(Some(here))
    }
}

impl Release for Member {
    fn lock_name(&self) -> &str {
        self.name.as_str()
    }

    fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    fn armed(&mut self) -> &mut bool {
        &mut self.armed
    }

    fn remove(&mut self, patience: Duration) -> Result<Option<bool>> {
        self.leave(patience)
    }

    fn still_ours(&self) -> Result<bool> {
        match self.left {
            Some(held) => Ok(held),
            None => self.still_here(),
        }
    }

    fn copy(&self) -> std::io::Result<Self> {
        Ok(Member {
            ctx: Arc::clone(&self.ctx),
            name: self.name.clone(),
            mode: self.mode,
            dir: self.dir.try_clone()?,
            dir_id: self.dir_id,
            file: self.file.as_ref().map(File::try_clone).transpose()?,
            file_name: self.file_name.clone(),
            id: self.id,
            record: self.record.clone(),
            record_len: self.record_len,
            marker: self.marker.as_ref().map(File::try_clone).transpose()?,
            sign: Arc::clone(&self.sign),
            armed: true,
            left: self.left,
        })
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        release::on_drop(self);
    }
}
