//! On-disk strategies behind one internal contract.
//!
//! Each strategy knows how to *create* a lock (or find the path taken), how
//! to *read* the record of an existing one, and how to *remove* one it has
//! judged, and its held lock (`FileLock`, `DirLock`) can `renew` and
//! `release` exactly the lock it created. What is common — the
//! create-or-reclaim loop, judging staleness, the race checks before a
//! reclaim — lives here once. Dispatch is a closed enum, not a trait object.

mod directory;
mod file;

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use crate::dir::LockDir;
use crate::error::{Error, LossReason, Result};
use crate::guard::{Hold, Keeper};
use crate::name::LockName;
use crate::owner::Owner;
use crate::record::{self, FORMAT_VERSION, MAX_RECORD_LEN, OwnRecord, Parsed};
use crate::stale::{self, Evidence, StaleReason, Verdict};
use crate::stats::Counters;
use crate::sys;

pub(crate) use directory::DirLock;
pub(crate) use file::FileLock;

/// How locks are laid out on disk.
///
/// Processes that share a lock must use the same strategy (and
/// [`PathStyle`](crate::PathStyle)): a directory-strategy `Locker` that finds a plain file at
/// a lock's path reports [`Error::UnexpectedFile`], and the reverse.
///
/// # Examples
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// use leasehold::{Locker, Strategy};
///
/// let dir = tempfile::tempdir().unwrap();
/// let locker = Locker::builder()
///     .directory(dir.path())
///     .strategy(Strategy::Directory)
///     .build()?;
/// # drop(locker); Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Strategy {
    /// One file per lock, created with `O_CREAT | O_EXCL | O_NOFOLLOW`,
    /// mode 0600, holding the owner record. The holder keeps `flock` on it,
    /// which lets other leasehold processes tell a dead holder at once.
    /// Compatible with the second seed's lock files.
    #[default]
    ExclusiveFile,
    /// One directory per lock holding `owner.json`, published by renaming a
    /// fully written private directory onto the lock path, so nobody ever
    /// sees a half-written record; renewal replaces `owner.json` atomically.
    /// Compatible with the first seed's lock directories. On Linux it needs
    /// a filesystem with `renameat2(RENAME_NOREPLACE)` (ext4, xfs, btrfs,
    /// tmpfs, ...); elsewhere [`Error::Unsupported`] is returned.
    Directory,
}

impl Strategy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Strategy::ExclusiveFile => "exclusive-file",
            Strategy::Directory => "directory",
        }
    }

    fn expected_kind(self) -> SFlag {
        match self {
            Strategy::ExclusiveFile => SFlag::S_IFREG,
            Strategy::Directory => SFlag::S_IFDIR,
        }
    }
}

/// What every strategy needs from its `Locker`.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) dir: LockDir,
    pub(crate) strategy: Strategy,
    pub(crate) lease: Duration,
    pub(crate) grace: Duration,
    pub(crate) foreign_lease: Option<Duration>,
    pub(crate) durable: bool,
    pub(crate) fencing: bool,
    pub(crate) holder_id: String,
    pub(crate) counters: Arc<Counters>,
    /// When each lock file was first seen, for [`Ctx::known_for`].
    pub(crate) first_seen: std::sync::Mutex<std::collections::HashMap<(u64, u64), u64>>,
    /// The boot-clock millisecond of the last [`Ctx::sweep`]; 0: never.
    pub(crate) last_sweep_ms: std::sync::atomic::AtomicU64,
}

/// The result of one attempt to take a lock.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// Ours, its renewal armed, with the fencing tokens reserved for it
    /// when fencing is on.
    Acquired(Hold),
    /// Someone else holds it.
    Busy {
        /// The holder, if the lock file could be read.
        owner: Option<Owner>,
        /// When the lock could next become stale without any event on disk
        /// (its lease runs out, or an unreadable record's grace ends).
        recheck_at: Option<SystemTime>,
    },
}

/// A lock this process created and still holds. Dropping it releases it
/// (synchronously, reporting failures through `tracing`), so a lock created
/// by an attempt whose caller went away is never orphaned.
#[derive(Debug)]
pub(crate) enum Held {
    File(FileLock),
    Dir(DirLock),
    #[cfg(feature = "postgres")]
    Pg(crate::postgres::PgLock),
}

/// What a renewal found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Renewal {
    Renewed,
    /// The lock is no longer ours, for this reason (the boot clock passed
    /// the cutoff before the renewal could be made: `LeaseExpired`).
    Lost(LossReason),
}

/// A block of fencing tokens reserved on disk, `next..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tokens {
    pub(crate) next: u64,
    pub(crate) last: u64,
}

impl Tokens {
    /// The next unused token, if any is left.
    pub(crate) fn take(&mut self) -> Option<u64> {
        if self.next > self.last {
            return None;
        }
        let token = self.next;
        // At `u64::MAX` the block is simply used up (`next > last` cannot
        // hold then, so `last` is lowered instead of wrapping `next`).
        match self.next.checked_add(1) {
            Some(next) => self.next = next,
            None => self.last = self.next - 1,
        }
        Some(token)
    }
}

/// How many tokens one trip to the disk reserves, so that in-process
/// handoffs do not write the counter each time.
const TOKEN_BLOCK: u64 = 1024;

/// What a reader finds at a lock path.
#[derive(Debug)]
pub(crate) struct Inspection {
    pub(crate) owner: Owner,
    pub(crate) stale: Option<StaleReason>,
}

impl Inspection {
    fn leftover() -> Self {
        Inspection {
            owner: Owner::from_parsed(&Parsed::Unreadable),
            stale: Some(StaleReason::Leftover),
        }
    }
}

/// Create-or-reclaim rounds in one attempt before reporting contention; a
/// round only repeats when the lock changed hands under us.
const ROUNDS: usize = 4;

/// How often one `Locker` collects leftovers on its own.
const SWEEP_EVERY: Duration = Duration::from_secs(2);

/// How many leftovers one collection removes at most.
const SWEEP_LIMIT: usize = 256;

/// How long a leftover-shaped entry is spared after its last change: the
/// process making it may be between two steps.
pub(crate) const LEFTOVER_SETTLE: Duration = Duration::from_secs(2);

impl Ctx {
    /// One attempt to take `name`: create it, or judge and maybe reclaim
    /// what holds its path. A lock created here has its renewal armed by
    /// `keeper` at once, before fencing tokens are reserved or the caller
    /// sees it.
    ///
    /// Fails with [`Error::DirectoryReplaced`], whatever it found, when the
    /// directory's path no longer names this `Locker`'s directory: a lock
    /// taken there would exclude nobody, and waiting there would wait for
    /// nothing.
    pub(crate) fn try_acquire(self: &Arc<Self>, name: &LockName, keeper: &Keeper) -> Result<Attempt> {
        // Checked after the attempt, so a lock created in a directory
        // moved meanwhile is dropped (and so removed) here; and checked on
        // failure, which a removed directory causes.
        let attempt = self.create_or_reclaim(name, keeper);
        self.ensure_dir_in_place()?;
        attempt
    }

    fn create_or_reclaim(self: &Arc<Self>, name: &LockName, keeper: &Keeper) -> Result<Attempt> {
        for _ in 0..ROUNDS {
            let created = match self.strategy {
                Strategy::ExclusiveFile => file::create(self, name, true)?.map(Held::File),
                // Publishing makes (and, when the path is taken, removes) a
                // pending directory: not worth it when the path is plainly
                // taken, and what a waiter killed meanwhile would leave.
                Strategy::Directory if self.path_taken(name) => None,
                Strategy::Directory => directory::create(self, name)?.map(Held::Dir),
            };
            if let Some(held) = created {
                let hold = keeper.hold(name.as_str(), held, None);
                // A lock lost before it could take a token is no lock:
                // dropping the hold removes it.
                if self.fencing && !hold.reserve_tokens()? {
                    continue;
                }
                return Ok(Attempt::Acquired(hold));
            }
            let Some(mut found) = Found::open(self, name)? else {
                continue;
            };
            match found.judge(self) {
                Verdict::Stale(reason) => {
                    found.reclaim(self, name, reason)?;
                }
                _ => {
                    self.sweep();
                    return Ok(Attempt::Busy {
                        owner: Some(found.owner()),
                        recheck_at: stale::recheck_at(&found.parsed, found.mtime, self.rules()),
                    });
                }
            }
        }
        Ok(Attempt::Busy {
            owner: None,
            recheck_at: None,
        })
    }

    /// The uncontended case without leaving the runtime's thread: one
    /// attempt to create the lock, never sleeping, never taking the
    /// directory lock, and syncing only where that cannot block (a
    /// directory in memory). `None` when anything more is needed (the path
    /// is taken, a record to judge, fencing, a sync to a disk); then the
    /// caller makes a full attempt on the blocking pool.
    pub(crate) fn try_create_inline(
        self: &Arc<Self>,
        name: &LockName,
        keeper: &Keeper,
    ) -> Result<Option<Hold>> {
        if (self.durable && !self.dir.in_memory()) || self.fencing {
            return Ok(None);
        }
        let created = match self.strategy {
            Strategy::ExclusiveFile => file::create(self, name, false).map(|f| f.map(Held::File)),
            Strategy::Directory => {
                // Publishing a directory takes a dozen calls even when it
                // fails; one lookup spares them when the lock is plainly
                // held. (Freed a moment later, the full attempt takes it.)
                if self.path_taken(name) {
                    return Ok(None);
                }
                directory::create(self, name).map(|d| d.map(Held::Dir))
            }
        };
        let created = match created {
            Ok(created) => created,
            Err(error) => {
                self.ensure_dir_in_place()?;
                return Err(error);
            }
        };
        let Some(held) = created else {
            return Ok(None);
        };
        let hold = keeper.hold(name.as_str(), held, None);
        // As in `try_acquire`: dropping the hold removes the lock.
        self.ensure_dir_in_place()?;
        Ok(Some(hold))
    }

    pub(crate) fn inspect(&self, name: &LockName) -> Result<Option<Inspection>> {
        let Some(mut found) = Found::open(self, name)? else {
            return Ok(None);
        };
        let stale = match found.judge(self) {
            Verdict::Stale(reason) => Some(reason),
            _ => None,
        };
        Ok(Some(Inspection {
            owner: found.owner(),
            stale,
        }))
    }

    /// Every lock in the directory of this strategy's kind, judged. Entries
    /// that vanish while listed, and those of another kind, are skipped.
    pub(crate) fn list(&self) -> Result<Vec<(LockName, Inspection)>> {
        let names = self.entries(|name| name.ends_with(".lock"))?;
        let mut locks = Vec::new();
        for file_name in names {
            let name = LockName::from_file_name(&file_name);
            match self.inspect(&name) {
                Ok(Some(inspection)) => locks.push((name, inspection)),
                Ok(None) | Err(Error::UnexpectedFile { .. }) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(locks)
    }

    /// Reclaims every stale lock (race-safely, as `try_acquire` would) and
    /// removes what crashed processes left behind: `.pending-*` directories
    /// older than the grace period and `.trash-*` directories (directory
    /// strategy), and temporary fencing counters. With `dry_run`, only
    /// reports.
    pub(crate) fn clean(&self, dry_run: bool) -> Result<Vec<(LockName, Inspection)>> {
        let mut cleaned = Vec::new();
        for (name, inspection) in self.list()? {
            let Some(reason) = inspection.stale else { continue };
            if dry_run {
                cleaned.push((name, inspection));
                continue;
            }
            let Some(mut found) = Found::open(self, &name)? else {
                continue;
            };
            // Judge again: it may have changed hands since it was listed.
            if found.judge(self) == Verdict::Stale(reason) && found.reclaim(self, &name, reason)? {
                cleaned.push((name, inspection));
            }
        }
        cleaned.extend(self.clean_leftovers(dry_run, usize::MAX)?);
        Ok(cleaned)
    }

    /// Removes at most `limit` of what crashed processes left behind (see
    /// [`clean`](Self::clean)), never what a live process is using.
    fn clean_leftovers(&self, dry_run: bool, limit: usize) -> Result<Vec<(LockName, Inspection)>> {
        let mut cleaned = Vec::new();
        if self.strategy == Strategy::Directory {
            cleaned.extend(directory::clean_leftovers(self, dry_run, limit)?);
        }
        let left = limit.saturating_sub(cleaned.len());
        cleaned.extend(self.clean_fence_leftovers(dry_run, left)?);
        Ok(cleaned)
    }

    /// Collects leftovers of crashed processes without being asked: when
    /// a `Locker` is built, and when an attempt meets contention (where
    /// waiters that were killed leave them), at most once per
    /// [`SWEEP_EVERY`] per `Locker` and [`SWEEP_LIMIT`] entries at a time,
    /// so a long-running service's directory does not grow without bound.
    /// Failures only postpone the collection.
    pub(crate) fn sweep(&self) {
        let now = sys::boot_clock_ms();
        let last = self.last_sweep_ms.load(std::sync::atomic::Ordering::Relaxed);
        let every = u64::try_from(SWEEP_EVERY.as_millis()).unwrap_or(u64::MAX);
        if last != 0 && now.saturating_sub(last) < every {
            return;
        }
        // One sweeper at a time per Locker: whoever swaps the stamp.
        let swapped = self.last_sweep_ms.compare_exchange(
            last,
            now.max(1),
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
        );
        if swapped.is_err() {
            return;
        }
        match self.clean_leftovers(false, SWEEP_LIMIT) {
            Ok(cleaned) if !cleaned.is_empty() => {
                tracing::debug!(
                    removed = cleaned.len(),
                    "collected leftovers of crashed processes"
                );
            }
            Ok(_) => {}
            Err(error) => tracing::debug!(%error, "collecting leftovers failed; trying later"),
        }
    }

    /// Fencing counters are only written under the directory lock, so a
    /// temporary counter file found while holding it belongs to a process
    /// that died between writing and renaming it.
    fn clean_fence_leftovers(&self, dry_run: bool, limit: usize) -> Result<Vec<(LockName, Inspection)>> {
        let mut found = self.entries(|name| leftover_kind(name) == Some(Leftover::FenceTmp))?;
        // A counter being advanced lives a write and a sync before its
        // writer takes the directory lock: spare the young.
        found.retain(|name| {
            fstatat(self.dir.fd(), name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|st| {
                let changed = UNIX_EPOCH + Duration::from_secs(u64::try_from(st.st_mtime).unwrap_or(0));
                changed
                    .elapsed()
                    .is_ok_and(|age| age >= self.grace.min(LEFTOVER_SETTLE))
            })
        });
        found.truncate(limit);
        if found.is_empty() {
            return Ok(Vec::new());
        }
        // Listed before the lock, judged under it: one that a live writer
        // was about to rename is gone by the time we hold it.
        let Some(_mutation) = self.dir.try_mutation_lock()? else {
            return Ok(Vec::new());
        };
        let mut cleaned = Vec::new();
        for name in found {
            let removed = dry_run
                || matches!(
                    unlinkat(self.dir.fd(), name.as_str(), UnlinkatFlags::NoRemoveDir),
                    Ok(()) | Err(Errno::ENOENT)
                );
            if removed {
                cleaned.push((LockName::from_file_name(&name), Inspection::leftover()));
            }
        }
        Ok(cleaned)
    }

    /// The names in the lock directory that `keep` accepts, sorted. A
    /// fresh open: a duplicate descriptor would share (and leave at the
    /// end) the directory offset of the one everything else uses.
    pub(crate) fn entries(&self, keep: impl Fn(&str) -> bool) -> Result<Vec<String>> {
        let mut listing = nix::dir::Dir::openat(
            self.dir.fd(),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::errno("list lock directory", self.dir.path(), e))?;
        let mut names: Vec<String> = listing
            .iter()
            .filter_map(|entry| entry.ok())
            .filter_map(|entry| entry.file_name().to_str().ok().map(str::to_owned))
            .filter(|name| keep(name))
            .collect();
        names.sort();
        Ok(names)
    }

    /// How long this `Locker` has known the file `(dev, ino)`, on the boot
    /// clock: the age of a record whose modification time is in the future.
    fn known_for(&self, dev: u64, ino: u64) -> Duration {
        let now = sys::boot_clock_ms();
        let mut seen = self.first_seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() > 4096 {
            seen.clear();
        }
        let first = *seen.entry((dev, ino)).or_insert(now);
        Duration::from_millis(now.saturating_sub(first))
    }

    pub(crate) fn rules(&self) -> stale::Rules {
        stale::Rules {
            grace: self.grace,
            foreign_lease: self.foreign_lease,
        }
    }

    /// Whether something is at the lock path (a lookup, nothing opened).
    fn path_taken(&self, name: &LockName) -> bool {
        fstatat(self.dir.fd(), name.file_name(), AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
    }

    /// `Some` when the directory's path no longer names the directory
    /// this `Locker` opened (see [`LockDir::moved`]).
    pub(crate) fn dir_moved(&self) -> Option<LossReason> {
        self.dir.moved().then(|| LossReason::DirectoryReplaced {
            path: self.dir.configured().to_owned(),
        })
    }

    /// [`Error::DirectoryReplaced`] when the directory was moved.
    fn ensure_dir_in_place(&self) -> Result<()> {
        match self.dir.moved() {
            false => Ok(()),
            true => Err(Error::DirectoryReplaced {
                path: self.dir.configured().to_owned(),
            }),
        }
    }

    /// The record a new holder of `name` writes.
    pub(crate) fn own_record(&self, name: &LockName) -> OwnRecord {
        own_record(&self.holder_id, self.lease, name)
    }
}

/// The record a new holder of `name` writes (or, on a server, keeps).
pub(crate) fn own_record(holder_id: &str, lease: Duration, name: &LockName) -> OwnRecord {
    {
        let me = sys::identity();
        let now = SystemTime::now();
        OwnRecord {
            uuid: acquisition_id(),
            pid: me.pid,
            start_time: me.start_time,
            holder_id: holder_id.to_owned(),
            hostname: me.hostname.clone(),
            acquired_at: record::format_time(now),
            lease_expires_at: record::format_time(now + lease),
            lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            leasehold: FORMAT_VERSION,
            boot_id: me.boot_id.clone(),
            pid_ns: me.pid_ns.clone(),
            time_ns: me.time_ns.clone(),
            proc_start: me.start.map(|s| s.ticks),
            renewed_at_boot: sys::boot_clock_ms(),
            machine_id: me.machine_id.clone(),
            name: name.as_str().to_owned(),
            fencing_token: None,
        }
    }
}

impl Held {
    /// The lock's directory, name and inode: `None` for a lock held on a
    /// server.
    fn parts(&self) -> Option<(&Arc<Ctx>, &LockName, u64, u64)> {
        match self {
            Held::File(f) => Some(f.parts()),
            Held::Dir(d) => Some(d.parts()),
            #[cfg(feature = "postgres")]
            Held::Pg(_) => None,
        }
    }

    pub(crate) fn record(&self) -> &OwnRecord {
        match self {
            Held::File(f) => f.record(),
            Held::Dir(d) => d.record(),
            #[cfg(feature = "postgres")]
            Held::Pg(p) => p.record(),
        }
    }

    /// Replaces the record on disk with `record`, through this lock's own
    /// descriptors.
    fn write_record(&mut self, record: OwnRecord) -> Result<()> {
        match self {
            Held::File(f) => f.write_record(record),
            Held::Dir(d) => d.write_record(record),
            #[cfg(feature = "postgres")]
            Held::Pg(_) => Ok(()),
        }
    }

    pub(crate) fn owner(&self) -> Owner {
        Owner::from_record(&self.record().parsed())
    }

    /// The boot-clock millisecond at which the lease last written runs out.
    pub(crate) fn lease_deadline_boot_ms(&self) -> u64 {
        let record = self.record();
        record.renewed_at_boot.saturating_add(record.lease_ms)
    }

    /// `None` while the lock is still ours; otherwise why it is not.
    pub(crate) fn check(&self) -> Result<Option<LossReason>> {
        match (self, self.parts()) {
            (_, Some((ctx, name, dev, ino))) => {
                if let Some(moved) = ctx.dir_moved() {
                    return Ok(Some(moved));
                }
                Ok((!names(ctx, name, dev, ino)?).then_some(LossReason::Replaced))
            }
            #[cfg(feature = "postgres")]
            (Held::Pg(p), None) => Ok((!p.still_ours()?).then_some(LossReason::SessionLost)),
            _ => Ok(Some(LossReason::Replaced)),
        }
    }

    /// Why this lock is not ours when its path or session says so.
    fn taken_reason(&self) -> LossReason {
        match self {
            #[cfg(feature = "postgres")]
            Held::Pg(_) => LossReason::SessionLost,
            _ => LossReason::Replaced,
        }
    }

    /// Extends the lease, unless the boot clock has reached `cutoff`.
    ///
    /// Runs under the directory's mutation lock, so it is ordered with any
    /// reclaim: either the reclaimer's re-read sees the renewed record and
    /// backs off, or this finds the lock gone.
    pub(crate) fn renew(&mut self, cutoff: u64) -> Result<Renewal> {
        #[cfg(feature = "postgres")]
        if let Held::Pg(p) = self {
            return p.renew(cutoff);
        }
        let Some((ctx, name, dev, ino)) = self.parts() else {
            return Ok(Renewal::Lost(LossReason::Replaced));
        };
        let ctx = Arc::clone(ctx);
        // A lock in a directory that its path no longer names is invisible
        // to everyone who opens the path now: it excludes nobody. Looked at
        // before the directory lock, which must never wait on a path walk
        // (a hung mount on the way would hold up every process).
        if let Some(moved) = ctx.dir_moved() {
            return Ok(Renewal::Lost(moved));
        }
        // Never wait for the directory lock past the cutoff: a late renewal
        // must not delay the report of a loss.
        let left = Duration::from_millis(cutoff.saturating_sub(sys::boot_clock_ms()));
        let _mutation = ctx.dir.mutation_lock_within(left)?;
        if !names(&ctx, name, dev, ino)? {
            return Ok(Renewal::Lost(LossReason::Replaced));
        }
        let boot = sys::boot_clock_ms();
        if boot >= cutoff {
            return Ok(Renewal::Lost(LossReason::LeaseExpired));
        }
        let mut record = self.record().clone();
        record.renew(SystemTime::now(), boot);
        self.write_record(record)?;
        Ok(Renewal::Renewed)
    }

    /// Reserves the next block of fencing tokens for this lock and records
    /// the first one in the owner record. `None` if the lock is no longer
    /// ours.
    ///
    /// The counter, `<lock>.fence`, is only ever advanced under the
    /// directory's mutation lock by a process that has just checked that it
    /// holds the lock, so blocks are handed out in the order the lock was
    /// held. It is replaced by rename (and synced, when durable), so a crash
    /// never leaves it behind a token already handed out.
    pub(crate) fn reserve_tokens(&mut self) -> Result<Option<Tokens>> {
        #[cfg(feature = "postgres")]
        if let Held::Pg(p) = self {
            return p.reserve_tokens();
        }
        let Some((ctx, name, dev, ino)) = self.parts() else {
            return Ok(None);
        };
        let (ctx, name) = (Arc::clone(ctx), name.clone());
        let fence = format!("{}.fence", name.file_name());
        // Every renewal in the directory waits for the directory lock, so it
        // is held here only to compare and rename: the counter's next value
        // is written (and synced) to a temporary file before, and the
        // directory synced after. Only the name's holder advances its
        // counter, so the value read before the lock is almost always still
        // the current one; if not, start over.
        for _ in 0..ROUNDS {
            let last = read_fence(&ctx, &name, &fence)?;
            let end = last.checked_add(TOKEN_BLOCK).ok_or(Error::Unsupported {
                what: "fencing counter exhausted (it is within one block of u64::MAX)",
            })?;
            let next = FenceTmp::write(&ctx, &fence, end)?;
            // Busy (a frozen process holds the directory lock): give the
            // lock up and let the caller try again later.
            let Some(mutation) = ctx.dir.try_mutation_lock()? else {
                return Ok(None);
            };
            if !names(&ctx, &name, dev, ino)? {
                return Ok(None);
            }
            if read_fence(&ctx, &name, &fence)? != last || !next.install(&fence)? {
                continue;
            }
            let mut record = self.record().clone();
            record.fencing_token = Some(last + 1);
            self.write_record(record)?;
            drop(mutation);
            // No token of the block is handed out before the rename is on
            // disk; a later block's sync covers this rename too.
            if ctx.durable {
                ctx.dir
                    .fd()
                    .sync_all()
                    .map_err(|e| Error::io("sync lock directory", ctx.dir.path(), e))?;
            }
            return Ok(Some(Tokens {
                next: last + 1,
                last: end,
            }));
        }
        Ok(None)
    }

    /// Removes the lock if, and only if, the path still names it. `None`
    /// when it was ours to the end; otherwise why it was not (a lock in a
    /// moved directory is removed there all the same, but was not a lock).
    ///
    /// `confirm`: the caller waits for the whole truth (`release().await`).
    /// On a lock server, wait for its answer rather than queueing the
    /// unlock; in a directory, also look whether the directory was moved
    /// (a path lookup a guard's `Drop`, which reports nothing, is spared).
    pub(crate) fn release(self, confirm: bool) -> Result<Option<LossReason>> {
        let taken = self.taken_reason();
        let moved = match self.parts() {
            Some((ctx, ..)) if confirm => ctx.dir_moved(),
            _ => None,
        };
        let released = match self {
            Held::File(f) => f.release(),
            Held::Dir(d) => d.release(),
            #[cfg(feature = "postgres")]
            Held::Pg(p) => p.release(confirm),
        }?;
        Ok(moved.or((!released).then_some(taken)))
    }
}

/// The last token handed out for a lock, from its `.fence` counter (0 if
/// there is none yet).
fn read_fence(ctx: &Ctx, name: &LockName, fence: &str) -> Result<u64> {
    let path = || ctx.dir.path_of(fence);
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
    let file = match openat(ctx.dir.fd(), fence, flags, Mode::empty()) {
        Ok(fd) => File::from(fd),
        Err(Errno::ENOENT) => return Ok(0),
        Err(Errno::ELOOP) => {
            return Err(Error::UnexpectedFile {
                name: name.as_str().to_owned(),
                path: path(),
                found: "symlink",
            });
        }
        Err(e) => return Err(Error::errno("open fencing counter", path(), e)),
    };
    let bytes = read_record(&file).map_err(|e| Error::io("read fencing counter", path(), e))?;
    std::str::from_utf8(&bytes)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| {
            // Guessing could hand out a token twice: refuse instead.
            Error::io(
                "read fencing counter (not a number; fix or remove it)",
                path(),
                std::io::Error::from(std::io::ErrorKind::InvalidData),
            )
        })
}

/// The next value of a fencing counter, written to a temporary file of
/// its own (and synced, when durable) until it is renamed over the counter;
/// removed if dropped before.
struct FenceTmp<'a> {
    ctx: &'a Ctx,
    tmp: String,
    armed: bool,
}

impl<'a> FenceTmp<'a> {
    fn write(ctx: &'a Ctx, fence: &str, value: u64) -> Result<Self> {
        use std::os::unix::fs::FileExt;
        let tmp = format!("{fence}.tmp-{}", uuid::Uuid::new_v4().simple());
        let path = || ctx.dir.path_of(fence);
        let flags = OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let file = File::from(
            openat(ctx.dir.fd(), tmp.as_str(), flags, Mode::from_bits_truncate(0o600))
                .map_err(|e| Error::errno("write fencing counter", path(), e))?,
        );
        let next = FenceTmp {
            ctx,
            tmp,
            armed: true,
        };
        file.write_all_at(format!("{value}\n").as_bytes(), 0)
            .and_then(|()| if ctx.durable { file.sync_data() } else { Ok(()) })
            .map_err(Error::from_io("write fencing counter", path()))?;
        Ok(next)
    }

    /// Renames the new value over the counter. `false` if the temporary
    /// file is gone (collected as a leftover while this process stood
    /// still): write it again.
    fn install(mut self, fence: &str) -> Result<bool> {
        let dir = self.ctx.dir.fd();
        match nix::fcntl::renameat(dir, self.tmp.as_str(), dir, fence) {
            Ok(()) => {
                self.armed = false;
                Ok(true)
            }
            Err(Errno::ENOENT) => {
                self.armed = false;
                Ok(false)
            }
            Err(e) => Err(Error::errno(
                "write fencing counter",
                self.ctx.dir.path_of(fence),
                e,
            )),
        }
    }
}

impl Drop for FenceTmp<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = unlinkat(self.ctx.dir.fd(), self.tmp.as_str(), UnlinkatFlags::NoRemoveDir);
        }
    }
}

/// A fresh version-4 UUID for an acquisition, without a `getrandom` call
/// per lock: see [`unique_bits`].
fn acquisition_id() -> String {
    let (hi, lo) = unique_bits();
    uuid::Builder::from_random_bytes(uuid::Uuid::from_u64_pair(hi, lo).into_bytes())
        .into_uuid()
        .to_string()
}

/// 128 bits that no other call in this process returns and that other
/// processes are unlikely to: one random seed per process, plus a counter,
/// so that taking a lock costs no `getrandom` call.
pub(crate) fn unique_bits() -> (u64, u64) {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEED: OnceLock<(u64, u64)> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let (hi, lo) = *SEED.get_or_init(|| uuid::Uuid::new_v4().as_u64_pair());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // Mix the counter into the random half with an odd multiplier: a
    // bijection of the counter (of its low bits, too), so values stay unique
    // and do not look sequential.
    (hi, lo ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// What a crashed process can leave in the lock directory besides locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leftover {
    /// `<lock>.pending-<12 hex>`: a directory being published.
    Pending,
    /// `<lock>.trash-<12 hex>`: a directory being released or reclaimed.
    Trash,
    /// `<lock>.fence.tmp-<32 hex>`: a fencing counter being replaced.
    FenceTmp,
}

/// Recognizes leftovers by their exact shape. Every lock's own file name
/// ends in `.lock`, whatever its lock name, so none can match.
pub(crate) fn leftover_kind(file_name: &str) -> Option<Leftover> {
    let (base, suffix) = file_name.rsplit_once('.')?;
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    if base.ends_with(".lock") {
        if suffix.strip_prefix("pending-").is_some_and(|id| hex(id, 12)) {
            return Some(Leftover::Pending);
        }
        if suffix.strip_prefix("trash-").is_some_and(|id| hex(id, 12)) {
            return Some(Leftover::Trash);
        }
    }
    if base.ends_with(".lock.fence") && suffix.strip_prefix("tmp-").is_some_and(|id| hex(id, 32)) {
        return Some(Leftover::FenceTmp);
    }
    None
}

/// What a lock's `Drop` can do with a failed release: say so. The lock
/// stays until it is judged stale (at once, since our flock goes with it).
fn log_drop_failure(name: &LockName, released: Result<bool>) {
    if let Err(error) = released {
        tracing::warn!(
            lock = name.as_str(),
            %error,
            "releasing a dropped lock failed; it stays until it is judged stale"
        );
    }
}

/// Whether the lock path still names the inode `(dev, ino)`.
fn names(ctx: &Ctx, name: &LockName, dev: u64, ino: u64) -> Result<bool> {
    match fstatat(ctx.dir.fd(), name.file_name(), AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(st.st_dev == dev && st.st_ino == ino),
        Err(Errno::ENOENT) => Ok(false),
        Err(e) => Err(Error::errno("inspect lock", ctx.dir.path_of(name.file_name()), e)),
    }
}

/// An existing lock, opened for judging: the lock file, or the lock
/// directory and its `owner.json`.
struct Found {
    /// The lock file or directory; a test `flock` goes on it.
    node: File,
    dev: u64,
    ino: u64,
    bytes: Vec<u8>,
    parsed: Parsed,
    mtime: SystemTime,
    flocked: bool,
}

impl Found {
    /// Opens what is at the lock path, refusing anything but what the
    /// strategy creates without opening it (a FIFO or device node could
    /// block or have side effects, a symlink could lead anywhere). `None`
    /// when the path is empty or changed while we looked.
    fn open(ctx: &Ctx, name: &LockName) -> Result<Option<Self>> {
        let path = || ctx.dir.path_of(name.file_name());
        let st = match fstatat(ctx.dir.fd(), name.file_name(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(Error::errno("inspect lock", path(), e)),
        };
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        if kind != ctx.strategy.expected_kind() {
            return Err(Error::UnexpectedFile {
                name: name.as_str().to_owned(),
                path: path(),
                found: kind_name(kind),
            });
        }
        let mut flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        flags |= match ctx.strategy {
            Strategy::ExclusiveFile => OFlag::O_NONBLOCK | OFlag::O_NOCTTY,
            Strategy::Directory => OFlag::O_DIRECTORY,
        };
        let node = match openat(ctx.dir.fd(), name.file_name(), flags, Mode::empty()) {
            Ok(fd) => File::from(fd),
            // Replaced between the stat and the open: look again.
            Err(Errno::ENOENT | Errno::ELOOP | Errno::ENXIO | Errno::ENOTDIR) => return Ok(None),
            Err(e) => return Err(Error::errno("open lock", path(), e)),
        };
        let meta = node
            .metadata()
            .map_err(|e| Error::io("inspect lock", path(), e))?;
        if meta.dev() != st.st_dev || meta.ino() != st.st_ino {
            return Ok(None);
        }
        let (bytes, mtime) = match ctx.strategy {
            Strategy::ExclusiveFile => {
                let bytes = read_record(&node).map_err(|e| Error::io("read lock record", path(), e))?;
                (bytes, meta.modified().unwrap_or(UNIX_EPOCH))
            }
            Strategy::Directory => match directory::read_owner(&node) {
                Ok(Some((bytes, mtime))) => (bytes, mtime),
                // No owner.json (yet): judged like an empty record, by the
                // directory's age.
                Ok(None) => (Vec::new(), meta.modified().unwrap_or(UNIX_EPOCH)),
                Err(e) => return Err(Error::io("read lock record", path().join("owner.json"), e)),
            },
        };
        Ok(Some(Found {
            parsed: record::parse(&bytes),
            node,
            dev: meta.dev(),
            ino: meta.ino(),
            bytes,
            mtime,
            flocked: false,
        }))
    }

    fn reread(&self, ctx: &Ctx) -> std::io::Result<Vec<u8>> {
        match ctx.strategy {
            Strategy::ExclusiveFile => read_record(&self.node),
            Strategy::Directory => Ok(directory::read_owner(&self.node)?
                .map(|(b, _)| b)
                .unwrap_or_default()),
        }
    }

    fn judge(&mut self, ctx: &Ctx) -> Verdict {
        let host = stale::System;
        let mut evidence = Evidence {
            parsed: &self.parsed,
            mtime: self.mtime,
            flock_free: None,
            known_for: ctx.known_for(self.dev, self.ino),
        };
        let verdict = stale::judge(&evidence, ctx.rules(), &host);
        if verdict != Verdict::NeedsFlockTest {
            return verdict;
        }
        // Keep the flock if we get it: while we hold it nobody else can
        // judge this inode abandoned, and the holder cannot be alive.
        self.flocked = self.node.try_lock().is_ok();
        evidence.flock_free = Some(self.flocked);
        stale::judge(&evidence, ctx.rules(), &host)
    }

    fn owner(&self) -> Owner {
        Owner::from_parsed(&self.parsed)
    }

    /// Removes the stale lock if the path still names the inode we judged
    /// and, unless our flock proves the holder gone, its record has not
    /// changed since we read it (a renewal may have raced our read).
    fn reclaim(&self, ctx: &Ctx, name: &LockName, reason: StaleReason) -> Result<bool> {
        let path = || ctx.dir.path_of(name.file_name());
        // Busy (a frozen process holds the directory lock): not now.
        let Some(mutation) = ctx.dir.try_mutation_lock()? else {
            return Ok(false);
        };
        if !names(ctx, name, self.dev, self.ino)? {
            return Ok(false);
        }
        if !self.flocked {
            let now = self
                .reread(ctx)
                .map_err(|e| Error::io("read lock record", path(), e))?;
            if now != self.bytes {
                return Ok(false);
            }
        }
        let removed = match ctx.strategy {
            Strategy::ExclusiveFile => file::unlink(ctx, name)?,
            Strategy::Directory => directory::retire(ctx, name, &self.node, mutation)?,
        };
        if !removed {
            return Ok(false);
        }
        ctx.counters.reclaimed(reason);
        let owner = self.owner();
        tracing::info!(
            lock = name.as_str(),
            reason = reason.as_str(),
            owner_pid = owner.pid(),
            owner_host = owner.hostname(),
            "reclaimed stale lock"
        );
        Ok(true)
    }
}

/// Reads a record through a descriptor, up to just past the size limit.
fn read_record(file: &File) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0; 4096];
    let mut len = 0;
    loop {
        if len == buf.len() {
            if buf.len() > MAX_RECORD_LEN {
                break;
            }
            buf.resize(buf.len() * 2, 0);
        }
        match file.read_at(&mut buf[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    Ok(buf)
}

fn kind_name(kind: SFlag) -> &'static str {
    if kind == SFlag::S_IFREG {
        "regular file"
    } else if kind == SFlag::S_IFDIR {
        "directory"
    } else if kind == SFlag::S_IFLNK {
        "symlink"
    } else if kind == SFlag::S_IFIFO {
        "FIFO"
    } else if kind == SFlag::S_IFSOCK {
        "socket"
    } else if kind == SFlag::S_IFCHR || kind == SFlag::S_IFBLK {
        "device node"
    } else {
        "special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftovers_are_recognized_by_their_exact_shape() {
        assert_eq!(
            leftover_kind("a-0123456789abcdef.lock.pending-0123456789ab"),
            Some(Leftover::Pending)
        );
        assert_eq!(
            leftover_kind("state.lock.trash-abcdefabcdef"),
            Some(Leftover::Trash)
        );
        assert_eq!(
            leftover_kind("x.lock.fence.tmp-0123456789abcdef0123456789abcdef"),
            Some(Leftover::FenceTmp)
        );
        // Lock names that merely contain the markers are locks.
        for lock in [
            "jobs.lock.trash-1-0123456789abcdef.lock",
            "x.lock.pending-0123456789ab.lock",
            "x.lock.trash-0123456789ab-0011223344556677.lock",
        ] {
            assert_eq!(leftover_kind(lock), None, "{lock}");
        }
        assert_eq!(leftover_kind("x.lock.trash-xyz"), None);
        assert_eq!(leftover_kind("x.lock.fence"), None);
    }

    #[test]
    fn a_token_block_ending_at_the_top_is_used_up_not_wrapped() {
        let mut block = Tokens {
            next: u64::MAX - 1,
            last: u64::MAX,
        };
        assert_eq!(block.take(), Some(u64::MAX - 1));
        assert_eq!(block.take(), Some(u64::MAX));
        assert_eq!(block.take(), None);
        assert_eq!(block.take(), None);
    }
}
