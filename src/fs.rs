//! The filesystem backend: locks as files (or directories) in one lock
//! directory.
//!
//! Each layout ([`Strategy`]) knows how to *create* a lock or find the
//! path taken ([`file`](mod@file), [`directory`]); what an existing lock is and how
//! to reclaim it ([`found`]), fencing counters ([`fence`]) and leftovers
//! of crashed processes ([`leftover`]) are shared; a created lock of
//! either layout is one type, [`FsLock`]. Every syscall goes through
//! [`syscall`](crate::sys::syscall), relative to the directory's descriptor ([`dir`]). This file
//! is the backend's side of the contract: the create-or-reclaim loop, and
//! reading and cleaning the directory.

mod context;
mod default_dir;
mod dir;
mod directory;
mod fence;
mod file;
mod found;
mod group;
mod later;
mod layout;
mod leftover;
pub(crate) mod line;
mod lock;
mod members;
mod mutex;
mod release;
mod upgrade;
mod wake;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{
    Arm, Attempt, Backend, Inline, Inspection, Kept, Line, Mode, OnDisk, Renewable, Waiters, Wake,
};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::record::Parsed;
use crate::stale::{self, Verdict};
use crate::stats::Counters;
use crate::sys::syscall;

use context::Ctx;
pub(crate) use context::{Place, Settings};
pub(crate) use default_dir::{open_per_user, per_user_directory};
pub(crate) use dir::LockDir;
use found::Found;
use group::Joined;
pub use layout::Strategy;
pub(crate) use lock::FsLock;
use lock::Whole;
use wake::Watcher;

/// Create-or-reclaim rounds in one attempt before reporting contention; a
/// round only repeats when the lock changed hands under us.
const ROUNDS: usize = 4;

/// Locks in a lock directory.
#[derive(Debug)]
pub(crate) struct Fs {
    ctx: Arc<Ctx>,
    watcher: Watcher,
    /// Whom the watcher tells: the waiters, and the groups we hold a place
    /// in.
    events: Arc<Events>,
}

/// What the directory watcher reports to: a change at a lock path wakes
/// its waiters; a change in a members directory may also mean that the
/// holder its marker names died, which one of our holders then fixes.
#[derive(Debug)]
struct Events {
    waiters: Waiters,
    signers: Arc<group::Signers>,
    /// For the line: a waiter standing back for an older one is not woken.
    ctx: Arc<Ctx>,
}

impl Wake for Events {
    fn changed(&self, key: &str) {
        let lock = match key.strip_suffix(".members") {
            Some(lock) => {
                self.signers.changed(lock);
                lock
            }
            None => key,
        };
        // Standing back for an older waiter: its own timer brings it back,
        // and the older one takes this release (a herd of woken runtimes
        // would only slow the holders down).
        if self.ctx.lines.behind(self.ctx.dir.fd(), lock) {
            return;
        }
        if let Some(waiters) = self.waiters.upgrade() {
            waiters.changed(lock);
        }
    }

    fn all_changed(&self) {
        self.signers.all_changed();
        if let Some(waiters) = self.waiters.upgrade() {
            waiters.all_changed();
        }
    }
}

impl Fs {
    /// Opens (creating it if needed) and checks the lock directory, and
    /// collects what crashed processes left there while nobody looked (a
    /// bounded collection, sparing what is in use).
    pub(crate) fn open(
        place: Place,
        settings: Settings,
        holder_id: String,
        counters: Arc<Counters>,
        waiters: Waiters,
    ) -> Result<Self> {
        let (allow_insecure, create) = (place.allow_insecure, place.create);
        if settings.strategy == Strategy::Directory && !crate::sys::DIRECTORY_MARKS {
            return Err(Error::Unsupported {
                what: "the directory layout (Strategy::Directory) on this platform, which cannot \
                       lock a directory (Windows): use Strategy::ExclusiveFile",
            });
        }
        let dir = match &place.directory {
            Some(path) => LockDir::open_with(path, allow_insecure, create)?,
            None => open_per_user("leasehold", allow_insecure, create)?,
        };
        dir.check_usable(place.read_only)?;
        let lines = line::Lines::of(dir.fd(), settings.fair);
        let ctx = Ctx {
            dir,
            settings,
            holder_id,
            counters,
            first_seen: Default::default(),
            last_sweep_ms: Default::default(),
            no_link: Default::default(),
            lines,
        };
        leftover::sweep(&ctx);
        let ctx = Arc::new(ctx);
        Ok(Fs {
            ctx: Arc::clone(&ctx),
            watcher: Watcher::default(),
            events: Arc::new(Events {
                waiters,
                signers: Arc::default(),
                ctx,
            }),
        })
    }

    /// A member of the group `name` just joined, as a lock: a permit
    /// taken is a turn in the line, and the group is watched, to re-sign
    /// its marker when the holder it names dies.
    fn joined(&self, name: &LockName, mode: Mode, member: group::Member) -> FsLock {
        if let Mode::Permit(_) = mode {
            self.ctx.lines.acquired(self.ctx.dir.fd(), name.file_name());
        }
        member.sign_with(&self.events.signers);
        self.watch_group(name);
        FsLock::Member(member)
    }

    /// [`Inline::attempt_inline`] for a shared lock or a permit: the join
    /// under the name's mutation lock if that is free this instant
    /// (`group::join_at_once`). Its answer stands if it joined, or if it
    /// found the name busy where nothing more is owed for a busy name on
    /// the blocking pool: the watcher sees holders' deaths, and the
    /// leftover sweep is not due. Anything else (the mutation lock taken,
    /// an exclusive lock or a stale marker at the path) goes to the pool.
    fn join_inline<K: Kept>(
        &self,
        name: &LockName,
        mode: Mode,
        arm: Arm<'_, FsLock, K>,
    ) -> Result<Option<Attempt<K>>> {
        let ctx = &self.ctx;
        let joined = match group::join_at_once(ctx, name, mode) {
            Ok(joined) => joined,
            Err(error) => {
                ctx.ensure_dir_in_place()?;
                return Err(error);
            }
        };
        let attempt = match joined {
            Some(Joined::Member(member)) => Attempt::Acquired(arm(self.joined(name, mode, *member), None)),
            Some(Joined::Busy { owner, recheck_at })
                if crate::sys::WATCH_SEES_DEATHS && !leftover::sweep_due(ctx) =>
            {
                Attempt::Busy {
                    owner,
                    recheck_at,
                    sharers: true,
                }
            }
            _ => return Ok(None),
        };
        // As in `attempt`: a lock taken in a directory moved meanwhile is
        // dropped (and so removed) here.
        ctx.ensure_dir_in_place()?;
        Ok(Some(attempt))
    }

    /// Makes sure the death of a holder of the group `name` is seen at
    /// once, so that its marker is re-signed before programs that judge
    /// the lock path by its pid (velocious, pi-research) see a dead one:
    /// by the watcher, or where it cannot watch that members directory
    /// (no inotify, its limits reached, a platform without watching), by
    /// looking at its marker every `SIGN_POLL` (`Signers::poll`).
    fn watch_group(&self, name: &LockName) {
        let watched = self.watcher.ensure(&self.ctx.dir, &self.waiters())
            && self.watcher.ensure_child(&members::members_dir(name.file_name()));
        if !watched {
            self.events.signers.poll(name.file_name());
        }
    }

    /// [`Store::watching`](crate::store::Store::watching): on Linux, an
    /// exclusive lock file's release (a removal, a rename) and its holder's
    /// death (a close after writing) are events in the lock directory
    /// itself, which the running watcher watches. (The directory layout
    /// needs a watch inside each lock directory, a group one inside its
    /// members directory, and kqueue a watch per file: those look again.)
    pub(crate) fn watching(&self) -> bool {
        crate::sys::watch_sees_lock_files()
            && self.ctx.settings.strategy == Strategy::ExclusiveFile
            && self.watcher.running()
    }

    /// The watcher's way to us (weak: a watcher outliving us stops).
    fn waiters(&self) -> Waiters {
        Arc::downgrade(&self.events) as Waiters
    }

    /// Where the watcher does not see a holder's death in the directory
    /// (Windows), names the holders of `name` to it after an attempt
    /// found the name busy, and remembers whether it named them all, for
    /// [`watch`](Backend::watch) to answer on the runtime's thread. Runs
    /// where the attempt runs, on the blocking pool: it reads records.
    /// Every busy attempt names them anew, so holders who came since the
    /// last one are named too (their arrival woke the waiter).
    pub(crate) fn name_holders(&self, name: &LockName) {
        if crate::sys::WATCH_SEES_DEATHS {
            return;
        }
        // The watcher starts at the first contention, here rather than
        // at the first wait: so the first wait's holders are named too.
        let named = self.watcher.start(&self.ctx.dir, &self.waiters()) && self.watch_holders(name);
        self.watcher.set_named(name.file_name(), named);
    }

    /// Names the holders of `name` to the watcher, to wait on their
    /// processes: the writer of the record at the lock path, or each live
    /// member of a group. Whether each one is watched so. A holder of
    /// another host, boot or pid namespace, one without a pid, one whose
    /// process cannot be opened (another user's) and a record that cannot
    /// be read leave the waiter polling.
    fn watch_holders(&self, name: &LockName) -> bool {
        let ctx = &self.ctx;
        let found = match Found::open(ctx, name) {
            Ok(Some(found)) => found,
            // Nobody at the path: a holder's arrival is an event.
            Ok(None) => return true,
            Err(_) => return false,
        };
        let me = crate::sys::identity();
        let pid = |parsed: &Parsed| match parsed {
            Parsed::Record(record) => stale::local_pid(record, me),
            _ => None,
        };
        let pids: Option<Vec<u64>> = if members::marker(&found.parsed).is_some() {
            let Ok(Some(dir)) = members::open_members(ctx, name) else {
                return false;
            };
            let path = || ctx.path_of(&members::members_dir(name.file_name()));
            let Ok(scan) = members::scan(ctx, &dir, &path) else {
                return false;
            };
            scan.live_members().map(|entry| pid(&entry.parsed)).collect()
        } else {
            pid(&found.parsed).map(|pid| vec![pid])
        };
        pids.is_some_and(|pids| self.watcher.watch_deaths(name.file_name(), &pids))
    }

    fn create_or_reclaim<K: Kept>(
        &self,
        name: &LockName,
        mode: Mode,
        arm: Arm<'_, FsLock, K>,
    ) -> Result<Attempt<K>> {
        let ctx = &self.ctx;
        for _ in 0..ROUNDS {
            let created = match (mode, ctx.settings.strategy) {
                (Mode::Shared | Mode::Permit(_), _) => match group::join(ctx, name, mode, false)? {
                    Joined::Member(member) => Some(self.joined(name, mode, *member)),
                    Joined::Busy { owner, recheck_at } => {
                        leftover::sweep(ctx);
                        return Ok(Attempt::Busy {
                            owner,
                            recheck_at,
                            sharers: true,
                        });
                    }
                    Joined::Again => continue,
                    // Held exclusively: judged below.
                    Joined::NotShared => None,
                },
                // Publishing makes (and, when the path is taken, removes) a
                // pending directory: not worth it when the path is plainly
                // taken, and what a waiter killed meanwhile would leave.
                (Mode::Exclusive, Strategy::Directory) if ctx.path_taken(name) => None,
                (Mode::Exclusive, _) => Whole::create(ctx, name, true)?.map(FsLock::Whole),
            };
            if let Some(lock) = created {
                let kept = arm(lock, None);
                // A lock lost before it could take a token is no lock:
                // dropping it removes it.
                if ctx.settings.fencing && !kept.reserve_tokens()? {
                    continue;
                }
                return Ok(Attempt::Acquired(kept));
            }
            let Some(mut found) = Found::open(ctx, name)? else {
                continue;
            };
            match found.judge(ctx, name) {
                Verdict::Stale(reason) => {
                    found.reclaim(ctx, name, reason)?;
                }
                Verdict::NotALock => return Err(found.not_a_lock(ctx, name)),
                _ => {
                    leftover::sweep(ctx);
                    let sharers = members::marker(&found.parsed).is_some();
                    // A marker's lease says nothing: its holders' deaths
                    // are events in the members directory.
                    let recheck_at = match sharers {
                        true => None,
                        false => stale::recheck_at(&found.parsed, found.mtime, ctx.rules()),
                    };
                    return Ok(Attempt::Busy {
                        owner: Some(found.owner()),
                        recheck_at,
                        sharers,
                    });
                }
            }
        }
        Ok(Attempt::Busy {
            owner: None,
            recheck_at: None,
            sharers: false,
        })
    }
}

impl Drop for Fs {
    /// The watcher stops with the `Locker`, but guards of shared locks may
    /// outlive it: the marker poll looks after their groups from now on.
    fn drop(&mut self) {
        self.events.signers.poll_all();
    }
}

impl Backend for Fs {
    type Lock = FsLock;

    fn kind(&self) -> &'static str {
        self.ctx.settings.strategy.as_str()
    }

    /// Creates the lock, or judges and maybe reclaims what holds its path.
    ///
    /// Fails with [`Error::DirectoryReplaced`], whatever it found, when the
    /// directory's path no longer names this `Locker`'s directory: a lock
    /// taken there would exclude nobody, and waiting there would wait for
    /// nothing.
    fn attempt<K: Kept>(
        &self,
        name: &LockName,
        mode: Mode,
        _deadline: Option<Instant>,
        arm: Arm<'_, FsLock, K>,
    ) -> Result<Attempt<K>> {
        // Checked after the attempt, so a lock created in a directory
        // moved meanwhile is dropped (and so removed) here; and checked on
        // failure, which a removed directory causes.
        let attempt = self.create_or_reclaim(name, mode, arm);
        self.ctx.ensure_dir_in_place()?;
        if let Ok(Attempt::Busy { .. }) = &attempt {
            self.name_holders(name);
        }
        attempt
    }

    fn inspect(&self, name: &LockName) -> Result<Option<Inspection>> {
        let ctx = &self.ctx;
        let Some(mut found) = Found::open(ctx, name)? else {
            return Ok(None);
        };
        let stale = match found.judge(ctx, name) {
            Verdict::Stale(reason) => Some(reason),
            Verdict::NotALock => return Err(found.not_a_lock(ctx, name)),
            _ => None,
        };
        let owner = found.owner();
        let (mode, holders) = match members::marker(&found.parsed) {
            Some(marked) => (members::mode_of(marked), members::holders(ctx, name)?),
            None => (Mode::Exclusive, vec![owner.clone()]),
        };
        Ok(Some(Inspection {
            owner,
            holders,
            mode,
            stale,
            path: Some(ctx.path_of(name.file_name())),
        }))
    }

    /// Every lock in the directory of this strategy's kind, judged. Entries
    /// that vanish while listed, those of another kind, and those that
    /// hold no lock (files of data whose names end in `.lock`) are
    /// skipped.
    fn list(&self) -> Result<Vec<(LockName, Inspection)>> {
        let names = self.ctx.entries(|name| name.ends_with(".lock"))?;
        let mut locks = Vec::new();
        for file_name in names {
            let name = LockName::from_file_name(&file_name);
            match self.inspect(&name) {
                Ok(Some(inspection)) => locks.push((name, inspection)),
                Err(Error::UnexpectedFile { path, found, .. }) => {
                    tracing::debug!(path = %path.display(), found, "not a lock: left as it is");
                }
                Ok(None) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(locks)
    }

    /// Starts the directory watcher (and, for the directory strategy, a
    /// watch inside the lock's directory, whose holder's death is a close
    /// there).
    /// A shared lock's (or semaphore's) members directory is watched too,
    /// when there is one: a holder's death is a close there.
    fn watch(&self, name: &LockName) -> bool {
        // In the directory layout a holder's death is an event inside its
        // lock directory; with no lock directory at the path there is no
        // holder to watch, and its arrival or removal is an event in the
        // lock directory's parent, which the watcher watches.
        let watched = self.watcher.start(&self.ctx.dir, &self.waiters())
            && (self.ctx.settings.strategy != Strategy::Directory
                || self.watcher.ensure_child(name.file_name())
                || !self.ctx.path_taken(name));
        if watched {
            self.watcher.ensure_child(&members::members_dir(name.file_name()));
        }
        watched && (crate::sys::WATCH_SEES_DEATHS || self.watcher.named(name.file_name()))
    }

    fn announce(&self, name: &LockName) -> Result<Option<Arc<dyn Renewable>>> {
        Ok(group::announce(&self.ctx, name)?.map(|a| Arc::new(a) as Arc<dyn Renewable>))
    }
}

impl Inline for Fs {
    /// One attempt, never waiting for another process, and syncing only
    /// where that cannot block (a directory in memory): an exclusive lock
    /// created without a mutation lock, or a shared lock's or permit's
    /// join under the name's mutation lock if that is free this instant
    /// (`join_inline`). `None` when anything more is needed (the path
    /// is taken, a record to judge, fencing, a sync to a disk, the
    /// mutation lock taken, a group past 8 entries, a group to end). The
    /// one pause left is a millisecond at most, in a rare race: a marker
    /// that could not be published (the path taken exclusively meanwhile)
    /// drops the record just made, which leaves as a holder does.
    fn attempt_inline<K: Kept>(
        &self,
        name: &LockName,
        mode: Mode,
        arm: Arm<'_, FsLock, K>,
    ) -> Result<Option<Attempt<K>>> {
        let ctx = &self.ctx;
        if (ctx.settings.durable && !ctx.dir.in_memory()) || ctx.settings.fencing {
            return Ok(None);
        }
        if mode != Mode::Exclusive {
            return self.join_inline(name, mode, arm);
        }
        // Publishing a directory takes a dozen calls even when it fails;
        // one lookup spares them when the lock is plainly held. (Freed a
        // moment later, the full attempt takes it.)
        if ctx.settings.strategy == Strategy::Directory && ctx.path_taken(name) {
            return Ok(None);
        }
        let created = match Whole::create(ctx, name, false) {
            Ok(created) => created,
            Err(error) => {
                ctx.ensure_dir_in_place()?;
                return Err(error);
            }
        };
        let Some(lock) = created else {
            return Ok(None);
        };
        let kept = arm(FsLock::Whole(lock), None);
        // As in `attempt`: dropping the kept lock removes it.
        ctx.ensure_dir_in_place()?;
        Ok(Some(Attempt::Acquired(kept)))
    }
}

/// What a waiter standing back for an exclusive lock sees at its path
/// `file_name` in `dir` (`None`: free): which file, or directory, is
/// there. Not the inode number alone: ext4 gives it again to a file made
/// just after another was removed, so a lock handed from holder to holder
/// would look held by one all along, and a frozen waiter ahead would never
/// be found to have missed its chances.
fn seen_by_exclusive_waiter(dir: &std::fs::File, file_name: &str) -> Option<(u64, u64)> {
    syscall::instance_at(dir, file_name).ok()
}

impl Line for Fs {
    fn stand_back(&self, name: &LockName, mode: Mode) -> Option<Duration> {
        let ctx = &self.ctx;
        match mode {
            Mode::Exclusive => {
                let at_path = || seen_by_exclusive_waiter(ctx.dir.fd(), name.file_name());
                ctx.lines.stand_back(ctx.dir.fd(), name.file_name(), at_path)
            }
            // A group's marker stays while anyone holds a permit: what
            // moves is the set of members.
            Mode::Permit(permits) => {
                let at_path = || members::seen_by_permit_waiter(ctx, name, permits);
                ctx.lines.stand_back(ctx.dir.fd(), name.file_name(), at_path)
            }
            Mode::Shared => None,
        }
    }

    fn wait_in_line(&self, name: &LockName, mode: Mode) {
        if matches!(mode, Mode::Exclusive | Mode::Permit(_)) {
            self.ctx.lines.wait_on(self.ctx.dir.fd(), name.file_name());
        }
    }

    /// Leaves the line; without the lock, also removes the name's
    /// mutation-lock file if a release kept it for waiters
    /// (`mutex::remove_kept`), after leaving: a release that saw us in
    /// line before then holds the mutation lock until it is done, and
    /// looks at the line again after.
    fn stopped_waiting(&self, name: &LockName, acquired: bool) {
        self.ctx
            .lines
            .stopped_waiting(self.ctx.dir.fd(), name.file_name());
        if !acquired {
            mutex::remove_kept(&self.ctx.dir, name.file_name());
        }
    }

    /// A look at the members directory (three short syscalls): no
    /// announcement of an exclusive waiter there, live or not (a dead one
    /// is judged, and removed, by the store's join).
    fn may_join_locally(&self, name: &LockName) -> bool {
        !group::announced(&self.ctx, name)
    }
}

impl OnDisk for Fs {
    fn directory(&self) -> &Path {
        self.ctx.dir.path()
    }

    fn lock_path(&self, name: &LockName) -> PathBuf {
        self.ctx.path_of(name.file_name())
    }

    /// Reclaims every stale lock (race-safely, as an attempt would) and
    /// removes what crashed processes left behind.
    fn clean(&self, dry_run: bool) -> Result<Vec<(LockName, Inspection)>> {
        let ctx = &self.ctx;
        let mut cleaned = Vec::new();
        for (name, inspection) in self.list()? {
            let Some(reason) = inspection.stale else { continue };
            if dry_run {
                cleaned.push((name, inspection));
                continue;
            }
            let Some(mut found) = Found::open(ctx, &name)? else {
                continue;
            };
            // Judge again: it may have changed hands since it was listed.
            if found.judge(ctx, &name) == Verdict::Stale(reason) && found.reclaim(ctx, &name, reason)? {
                cleaned.push((name, inspection));
            }
        }
        cleaned.extend(leftover::clean(ctx, dry_run, usize::MAX)?);
        cleaned.extend(members::clean_orphans(ctx, dry_run)?);
        Ok(cleaned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock removed and made again between two looks is another lock,
    /// even with the same inode number (ext4 hands the freed number to
    /// the next file at once), for both layouts' lock paths.
    #[test]
    fn a_lock_made_again_at_its_path_looks_moved_to_a_waiter() {
        let root = tempfile::tempdir().unwrap();
        let dir = LockDir::open(root.path(), false).unwrap();
        let path = root.path().join("job.lock");
        for layout in ["file", "directory"] {
            let make = || match layout {
                "file" => std::fs::write(&path, "{}").unwrap(),
                _ => std::fs::create_dir(&path).unwrap(),
            };
            let remove = || match layout {
                "file" => std::fs::remove_file(&path).unwrap(),
                _ => std::fs::remove_dir(&path).unwrap(),
            };
            assert_eq!(seen_by_exclusive_waiter(dir.fd(), "job.lock"), None, "{layout}");
            make();
            let mut last = seen_by_exclusive_waiter(dir.fd(), "job.lock").expect("held");
            assert_eq!(
                seen_by_exclusive_waiter(dir.fd(), "job.lock"),
                Some(last),
                "{layout}: a second look"
            );
            let mut same_number = 0;
            for _ in 0..5 {
                remove();
                // Past a tick of the kernel's clock for files.
                std::thread::sleep(Duration::from_millis(20));
                make();
                let again = seen_by_exclusive_waiter(dir.fd(), "job.lock").expect("held");
                let ino = syscall::stat_at(dir.fd(), "job.lock").unwrap().ino;
                same_number += usize::from(ino == last.0);
                assert_ne!(again, last, "{layout}: made again, it looks the same");
                last = again;
            }
            remove();
            eprintln!("{layout}: the same inode number {same_number} times in 5");
        }
    }
}
