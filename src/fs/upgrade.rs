//! Upgradable shared locks in the lock directory.
//!
//! The upgradable holder of a name is one of its shared holders whose
//! record in the members directory is named `m-up-<uuid>.json` (still an
//! `m-` record: every leasehold process counts it as a holder). A join as
//! the upgradable holder is refused, under the name's mutation lock, while
//! a live one exists (`group::join`): so at most one at a time, and a
//! dead or frozen one frees the slot exactly when its share is freed.
//!
//! Both conversions happen under the name's mutation lock and never leave
//! the lock path free, nor its flock free, for an instant:
//!
//! - **Upgrade**, once ours is the only live member: the marker is turned
//!   into our exclusive lock. A lock file is replaced by a new file, made
//!   under a private name with our exclusive flock and the record in it,
//!   renamed over the marker (never the marker's inode, which a member
//!   frozen in its unlocked signing may still write a marker into); a
//!   lock directory likewise by a new one, made under a private name with
//!   our exclusive flock and the record as its `owner.json`, exchanged
//!   with the marker's in one step (`renameat2(RENAME_EXCHANGE)`,
//!   `renameatx_np(RENAME_SWAP)`; refused with `Unsupported` where there
//!   is none), the marker's then removed: a frozen member renames its
//!   marker through the marker directory's descriptor, so never into ours.
//!   Our member record is removed last. velocious and pi-research, which
//!   know only the lock path, see it held throughout.
//! - **Downgrade**: a new upgradable member record is made, then the
//!   record at the lock path becomes its marker: a lock file is replaced
//!   by a new file, made under a private name with our shared flock and
//!   the marker in it, renamed over the lock path (the path always names
//!   a flocked file with a record); a lock directory keeps its node and
//!   gets the marker as its `owner.json` (by rename), and then our flock on
//!   it turns from exclusive to shared. That turn is not atomic (flock(2)),
//!   but the record is a marker by then, which leasehold judges by its
//!   members, never by its flock, and velocious does not flock.
//!
//! A crash in the middle leaves, at worst, an exclusive record (or a
//! marker) whose flock is free and a member record whose flock is free:
//! both judged dead at once and reclaimed as usual.

use super::context::Ctx;
use super::found::Found;
use super::group::Member;
use super::layout::Strategy;
use super::lock::Whole;
use super::members::{self, Scan, marker, members_dir, remove_dead, remove_members_dir, scan};
use super::mutex::MutationLock;
use super::{Fs, FsLock, directory, file, group};
use crate::backend::{Arm, Attempt, Kept, Mode, Upgrade};
use crate::error::{Error, IoResultExt, LossReason, Result};
use crate::name::LockName;
use crate::owner::Owner;
use crate::record;
use crate::stale::{self, Verdict};
use crate::sys::syscall::{self, Flock, Open, WriteAt};

fn lost(name: &LockName) -> Error {
    Error::Lost {
        name: name.as_str().to_owned(),
        reason: LossReason::Replaced,
    }
}

fn busy<K>(owner: Option<Owner>) -> Attempt<K> {
    Attempt::Busy {
        owner,
        recheck_at: None,
        sharers: true,
    }
}

/// The step before an upgrade publishes what it made, in every layout and
/// platform (one failpoint, named once).
fn before_upgrade_publish() -> std::io::Result<()> {
    failpoint!("upgrade.before_publish")
}

/// The step before a downgrade publishes its marker, likewise.
fn before_downgrade_publish() -> std::io::Result<()> {
    failpoint!("downgrade.before_publish")
}

/// Takes the fencing tokens of a lock just converted (the name's mutation
/// lock let go), tried again for up to a quarter lease while that lock is
/// busy: taking them needs it and gives up at once when another process
/// has it (to join, judge or leave), which must not cost the conversion
/// its lock, nor let it go (a writer would get in). `false` if they were
/// not taken by then: the lock is not ours any more, or the name's
/// mutation lock stayed taken (a process frozen with it).
fn reserve_patiently<K: Kept>(ctx: &Ctx, kept: &K) -> Result<bool> {
    let started = std::time::Instant::now();
    loop {
        if kept.reserve_tokens()? {
            return Ok(true);
        }
        if started.elapsed() >= ctx.settings.lease / 4 {
            return Ok(false);
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// How long an upgrade waits for others to close the marker, where a file
/// that is open cannot be replaced (Windows), at most (and an eighth of
/// the lease at most): a reader judging it has it open for an instant, a
/// member signing it without the mutation lock for a moment. One frozen
/// there holds the upgrade up until it runs again.
const REPLACE_PATIENCE: std::time::Duration = std::time::Duration::from_millis(200);

/// Renames our new lock file `private` over the marker at the lock path,
/// whose identity is `identity`: `Ok(false)` if it could not be yet.
///
/// Where a file that is open cannot be replaced (Windows answers "access
/// denied"), our own handle of the marker, `joined` (a member's, with its
/// shared mark), is closed first; the marker is judged by its members,
/// never by its mark, and ours is still among them. The replace is then
/// tried again for up to [`REPLACE_PATIENCE`] (an eighth of the lease at
/// most) while someone else has the marker open. Nobody can have it open once it is replaced, so a member
/// frozen in its unlocked signing, past its check that the path is its
/// group's marker, cannot write into what replaced it (see `upgrade`).
/// If the replace fails, the marker is opened again as ours (the name's
/// mutation lock and the seal keep it in place); if it was still open,
/// the upgrade waits.
fn replace_marker(
    ctx: &Ctx,
    name: &LockName,
    private: &str,
    joined: &mut Option<std::fs::File>,
    identity: (u64, u64),
) -> std::io::Result<bool> {
    use crate::sys::syscall::Errno;
    let rename = || syscall::rename_at(ctx.dir.fd(), private, name.file_name());
    if !crate::sys::REPLACE_WAITS_FOR_READERS {
        return rename().map(|()| true).map_err(std::io::Error::from);
    }
    drop(joined.take());
    // Our record's lease runs meanwhile (its renewals wait for us): a
    // short lease waits less.
    let patience = REPLACE_PATIENCE.min(ctx.settings.lease / 8);
    let started = std::time::Instant::now();
    let mut renamed = rename();
    while matches!(renamed, Err(Errno::EACCES | Errno::EBUSY)) && started.elapsed() < patience {
        std::thread::sleep(std::time::Duration::from_millis(1));
        renamed = rename();
    }
    if renamed.is_err() {
        // Ours again, whatever went wrong: `alone` knows the marker by
        // the node we keep open.
        if let Ok(node) = syscall::open_at(ctx.dir.fd(), name.file_name(), Open::Read)
            && syscall::meta(&node).is_ok_and(|m| (m.dev(), m.ino()) == identity)
        {
            let _ = node.try_flock_shared();
            *joined = Some(node);
        }
    }
    match renamed {
        Ok(()) => Ok(true),
        Err(Errno::EACCES | Errno::EBUSY) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Ours is the only live member of its group, checked under the name's
/// mutation lock, which this keeps: the upgrade may replace the marker.
struct Alone<'a> {
    mutation: MutationLock<'a>,
    /// Keeps joiners that do not take the mutation lock out until the
    /// marker is ours (`members::Seal`).
    seal: members::Seal,
    found: Found,
    scan: Scan,
    dir_name: String,
}

/// Whether `member`, whose group's marker is at the lock path, is the only
/// live member: `Ok(Err(owner))` while the mutation lock or another live
/// member is in the way; `Err` with `Error::Lost` when the marker or our
/// record is not ours any more.
fn alone<'a>(
    ctx: &'a Ctx,
    name: &LockName,
    member: &Member,
) -> Result<std::result::Result<Alone<'a>, Option<Owner>>> {
    let Some(mutation) = ctx.dir.try_mutation_lock(name.file_name())? else {
        return Ok(Err(None));
    };
    if !member.still_here()? {
        return Err(lost(name));
    }
    let Some(found) = Found::open(ctx, name)? else {
        return Err(lost(name));
    };
    let ours = marker(&found.parsed).is_some_and(|r| r.group == member.record.group);
    let node_id = member
        .marker
        .as_ref()
        .map(|node| syscall::meta(node).map(|m| (m.dev(), m.ino())))
        .transpose()
        .context("inspect lock", || ctx.path_of(name.file_name()))?;
    if !ours || node_id != Some(found.identity()) {
        return Err(lost(name));
    }
    let dir_name = members_dir(name.file_name());
    // Another live member now: not alone, and no seal made. (A seal made
    // and removed at every try is two events in the members directory,
    // which woke the waiting upgrade at once: it tried again hundreds of
    // times a second while readers held, and under Wine starved its own
    // share's renewals.)
    let look = scan(ctx, member.members(), &|| ctx.path_of(&dir_name))?;
    if let Some(other) = look.live_members().find(|e| e.file_name != member.file_name()) {
        return Ok(Err(Some(Owner::from_parsed(&other.parsed))));
    }
    // Counted under the seal: a joiner without the mutation lock is
    // counted here or sees the seal.
    let seal = members::Seal::new(member.members(), &|| ctx.path_of(&dir_name))?;
    let mut scan = scan(ctx, member.members(), &|| ctx.path_of(&dir_name))?;
    remove_dead(ctx, member.members(), &mut scan);
    if let Some(other) = scan.live_members().find(|e| e.file_name != member.file_name()) {
        return Ok(Err(Some(Owner::from_parsed(&other.parsed))));
    }
    failpoint!("upgrade.before_rewrite").context("upgrade lock", || ctx.path_of(name.file_name()))?;
    Ok(Ok(Alone {
        mutation,
        seal,
        found,
        scan,
        dir_name,
    }))
}

impl Upgrade for Fs {
    fn join_upgradable<K: Kept>(&self, name: &LockName, arm: Arm<'_, FsLock, K>) -> Result<Attempt<K>> {
        let attempt = self.join_upgradable_once(name, arm);
        if let Ok(Attempt::Busy { .. }) = &attempt {
            self.name_holders(name);
        }
        attempt
    }

    fn upgrade<K: Kept>(
        &self,
        name: &LockName,
        share: &mut Option<FsLock>,
        arm: Arm<'_, FsLock, K>,
    ) -> Result<Attempt<K>> {
        // Its readers are not named to the death watch here (the upgrade
        // holds its share's lease while it tries: each try is kept short);
        // where deaths are no events (Windows), the waiting upgrade polls
        // every 20 ms instead.
        self.upgrade_once(name, share, arm)
    }

    fn downgrade<K: Kept>(
        &self,
        name: &LockName,
        lock: &mut Option<FsLock>,
        arm: Arm<'_, FsLock, K>,
    ) -> Result<Option<K>> {
        self.downgrade_once(name, lock, arm)
    }
}

/// The conversions, one attempt each; a busy join names the holders it
/// waits for to the watcher (`Fs::name_holders`), above.
impl Fs {
    fn join_upgradable_once<K: Kept>(&self, name: &LockName, arm: Arm<'_, FsLock, K>) -> Result<Attempt<K>> {
        let ctx = &self.ctx;
        // The upgrade exchanges lock directories (`directory::replace`).
        if ctx.settings.strategy == Strategy::Directory && !crate::sys::can_exchange() {
            return Err(Error::Unsupported {
                what: directory::NO_EXCHANGE,
            });
        }
        for _ in 0..4 {
            match group::join(ctx, name, Mode::Shared, true)? {
                group::Joined::Member(member) => {
                    member.sign_with(&self.events.signers);
                    self.watch_group(name);
                    let kept = arm(FsLock::Member(*member), None);
                    if ctx.settings.fencing && !kept.reserve_tokens()? {
                        continue;
                    }
                    return Ok(Attempt::Acquired(kept));
                }
                group::Joined::Busy { owner, .. } => return Ok(busy(owner)),
                group::Joined::Again => continue,
                // Held exclusively (or by something that is not a lock):
                // the shared attempt judges and reclaims it.
                group::Joined::NotShared => {
                    let Some(mut found) = Found::open(ctx, name)? else {
                        continue;
                    };
                    match found.judge(ctx, name) {
                        Verdict::Stale(reason) => {
                            found.reclaim(ctx, name, reason)?;
                        }
                        Verdict::NotALock => return Err(found.not_a_lock(ctx, name)),
                        _ => {
                            return Ok(Attempt::Busy {
                                owner: Some(found.owner()),
                                recheck_at: stale::recheck_at(&found.parsed, found.mtime, ctx.rules()),
                                sharers: false,
                            });
                        }
                    }
                }
            }
        }
        Ok(busy(None))
    }

    fn upgrade_once<K: Kept>(
        &self,
        name: &LockName,
        share: &mut Option<FsLock>,
        arm: Arm<'_, FsLock, K>,
    ) -> Result<Attempt<K>> {
        let ctx = &self.ctx;
        let mut member = match share.take() {
            Some(FsLock::Member(member)) => member,
            other => {
                *share = other;
                return Err(lost(name));
            }
        };
        let Alone {
            mutation,
            seal,
            found,
            scan,
            dir_name,
        } = match alone(ctx, name, &member) {
            Ok(Ok(alone)) => alone,
            Ok(Err(owner)) => {
                *share = Some(FsLock::Member(member));
                return Ok(busy(owner));
            }
            Err(error) => {
                *share = Some(FsLock::Member(member));
                return Err(error);
            }
        };
        // Ours alone: a new exclusive lock takes the marker's place. Our
        // handle of it from the look goes first (Windows cannot replace a
        // file that is open).
        let marker_id = found.identity();
        drop(found);
        let record = ctx.own_record(name);
        let path = || ctx.path_of(name.file_name());
        let mut old_dir = None;
        let (identity, writer, record_file, made) = match ctx.settings.strategy {
            // A new file, made under a private name with our exclusive
            // flock and the record in it, renamed over the marker: the
            // path always names a flocked file with a record. Never the
            // marker's own inode: a member frozen in its unlocked signing
            // (`Member::sign_before_it_lapses`), past its check that the
            // path is its group's marker, writes its marker into that
            // inode when it runs again, which would turn our exclusive
            // record into a marker whose holders are gone (reclaimed by
            // the next comer).
            Strategy::ExclusiveFile => {
                let private = file::pending_name(name);
                let made = syscall::open_at(ctx.dir.fd(), private.as_str(), Open::CreateNew)
                    .map_err(std::io::Error::from)
                    .context("upgrade lock", path)?;
                let published = made
                    .try_flock()
                    .map_err(|e| match e {
                        std::fs::TryLockError::Error(e) => e,
                        std::fs::TryLockError::WouldBlock => std::io::ErrorKind::WouldBlock.into(),
                    })
                    .context("upgrade lock", path)
                    .and_then(|()| file::write(&made, 0, &record, ctx.settings.durable, path))
                    .and_then(|len| {
                        let meta = syscall::meta(&made).context("upgrade lock", path)?;
                        before_upgrade_publish().context("upgrade lock", path)?;
                        replace_marker(ctx, name, &private, &mut member.marker, marker_id)
                            .context("upgrade lock", path)
                            .map(|replaced| replaced.then_some((len, (meta.dev(), meta.ino()))))
                    });
                let (len, identity) = match published {
                    Ok(Some(done)) => done,
                    // Someone has the marker open (Windows): not now.
                    Ok(None) => {
                        let _ = syscall::unlink_at(ctx.dir.fd(), private.as_str());
                        *share = Some(FsLock::Member(member));
                        return Ok(busy(None));
                    }
                    Err(error) => {
                        let _ = syscall::unlink_at(ctx.dir.fd(), private.as_str());
                        *share = Some(FsLock::Member(member));
                        return Err(error);
                    }
                };
                let node = made.try_clone().context("upgrade lock", path)?;
                (identity, Some((made, len)), None, node)
            }
            // Likewise a new lock directory, exchanged with the marker's
            // in one step (`directory::replace`): a member frozen in its
            // unlocked signing renames its marker over `owner.json`
            // through the descriptor of the marker's directory.
            Strategy::Directory => match before_upgrade_publish()
                .context("upgrade lock", path)
                .and_then(|()| directory::replace(ctx, name, marker_id, record.clone()))
            {
                Ok(Some(replaced)) => {
                    let published = replaced.published;
                    old_dir = Some(replaced.old_name);
                    (
                        (published.dev, published.ino),
                        None,
                        Some(published.record_file),
                        published.dir,
                    )
                }
                Ok(None) => {
                    *share = Some(FsLock::Member(member));
                    return Ok(busy(None));
                }
                Err(error) => {
                    *share = Some(FsLock::Member(member));
                    return Err(error);
                }
            },
        };
        failpoint!("upgrade.after_rewrite").context("upgrade lock", path)?;
        // (Where a replace waits for readers, our handle of a marker file
        // was closed before it: `replace_marker`.)
        let marker_node = member.dissolve()?;
        if let Some(old_dir) = old_dir {
            // The marker's directory, now under a private name: emptied
            // and removed (what a frozen member renames into it later
            // fails, or is swept with it).
            let marker_node = marker_node.as_ref().ok_or_else(|| lost(name))?;
            directory::remove_dir(ctx, &old_dir, marker_node);
        }
        // The marker's node (and our shared flock on it) goes before the
        // mutation lock.
        drop(marker_node);
        drop(seal);
        if scan.waiters.is_empty() {
            remove_members_dir(ctx, &dir_name);
        }
        let mut whole = Whole::adopt(ctx, name, identity, record, made, writer, record_file);
        // The fencing tokens while the name's mutation lock is still ours:
        // taken after it, a neighbour that took it next (to join, judge
        // or leave) would make them give up, and the upgrade report its
        // lock lost although nothing had happened to it.
        let tokens = match failpoint!("upgrade.before_tokens")
            .context("upgrade lock", path)
            .and_then(|()| match ctx.settings.fencing {
                true => whole
                    .reserve_tokens_locked()
                    .map(|tokens| tokens.map(Some).ok_or_else(|| lost(name))),
                false => Ok(Ok(None)),
            }) {
            Ok(Ok(tokens)) => tokens,
            Ok(Err(error)) | Err(error) => {
                // Let the name's mutation lock go before the lock's
                // release, which takes it.
                drop(mutation);
                drop(whole);
                return Err(error);
            }
        };
        drop(mutation);
        Ok(Attempt::Acquired(arm(FsLock::Whole(whole), tokens)))
    }

    fn downgrade_once<K: Kept>(
        &self,
        name: &LockName,
        lock: &mut Option<FsLock>,
        arm: Arm<'_, FsLock, K>,
    ) -> Result<Option<K>> {
        let ctx = &self.ctx;
        let whole = match lock.take() {
            Some(FsLock::Whole(whole)) => whole,
            other => {
                *lock = other;
                return Err(Error::Unsupported {
                    what: "downgrading a lock that is not held exclusively",
                });
            }
        };
        let mutation = match ctx.dir.try_mutation_lock(name.file_name()) {
            Ok(Some(mutation)) => mutation,
            Ok(None) => {
                *lock = Some(FsLock::Whole(whole));
                return Ok(None);
            }
            Err(error) => {
                *lock = Some(FsLock::Whole(whole));
                return Err(error);
            }
        };
        let (identity, node) = whole
            .dissolve()
            .context("downgrade lock", || ctx.path_of(name.file_name()))?;
        if !ctx.names(name, identity.0, identity.1)? {
            // Not ours any more: let it go as a loss.
            return Err(lost(name));
        }
        let dir_name = members_dir(name.file_name());
        let left_empty = |_: &Error| remove_members_dir(ctx, &dir_name);
        let (dir, _) = members::ensure_members(ctx, name).inspect_err(left_empty)?;
        let mut member = Member::create(ctx, name, Mode::Shared, record::acquisition_id(), dir, true)
            .inspect_err(left_empty)?;
        let bytes = member.record.to_bytes(0);
        let path = || ctx.path_of(name.file_name());
        failpoint!("downgrade.before_marker").context("downgrade lock", path)?;
        let marker_node = match ctx.settings.strategy {
            // Where a file that is open cannot be replaced (Windows), ours
            // is: our exclusive mark is on it. The record turns into the
            // marker in place, padded to the file's length, as a renewal
            // rewrites it; a leasehold reader that reads it torn judges it
            // by our mark, which is still exclusive, and then by its
            // members (our new record among them). The mark turns shared
            // below.
            Strategy::ExclusiveFile if crate::sys::REPLACE_WAITS_FOR_READERS => {
                let len = syscall::meta(&node).context("downgrade lock", path)?.len();
                let bytes = member.record.to_bytes(usize::try_from(len).unwrap_or(0));
                before_downgrade_publish().context("downgrade lock", path)?;
                node.write_all_at(&bytes, 0).context("downgrade lock", path)?;
                node
            }
            Strategy::ExclusiveFile => {
                let private = file::pending_name(name);
                let made = syscall::open_at(ctx.dir.fd(), private.as_str(), Open::CreateNew)
                    .map_err(std::io::Error::from)
                    .context("downgrade lock", path)?;
                let published = made
                    .try_flock_shared()
                    .map_err(|e| match e {
                        std::fs::TryLockError::Error(e) => e,
                        std::fs::TryLockError::WouldBlock => std::io::ErrorKind::WouldBlock.into(),
                    })
                    .and_then(|()| made.write_all_at(&bytes, 0))
                    .and_then(|()| before_downgrade_publish())
                    .and_then(|()| {
                        syscall::rename_at(ctx.dir.fd(), &private, name.file_name())
                            .map_err(std::io::Error::from)
                    })
                    .context("downgrade lock", path);
                if let Err(error) = published {
                    let _ = syscall::unlink_at(ctx.dir.fd(), private.as_str());
                    return Err(error);
                }
                drop(node);
                made
            }
            Strategy::Directory => {
                before_downgrade_publish().context("downgrade lock", path)?;
                directory::rewrite_bytes(&node, &bytes, path)?;
                node
            }
        };
        drop(mutation);
        if ctx.settings.strategy == Strategy::Directory || crate::sys::REPLACE_WAITS_FOR_READERS {
            // Exclusive to shared: see the top of this file.
            let mut shared = false;
            for _ in 0..200 {
                if marker_node.share_mark().is_ok() {
                    shared = true;
                    break;
                }
                std::thread::sleep(std::time::Duration::from_micros(500));
            }
            if !shared {
                tracing::debug!(lock = name.as_str(), "a downgraded lock directory is not flocked");
            }
        }
        member.marker = Some(marker_node);
        member.sign_with(&self.events.signers);
        self.watch_group(name);
        let kept = arm(FsLock::Member(member), None);
        failpoint!("downgrade.before_tokens").context("downgrade lock", || ctx.path_of(name.file_name()))?;
        if ctx.settings.fencing && !reserve_patiently(ctx, &kept)? {
            return Err(lost(name));
        }
        Ok(Some(kept))
    }
}
