//! What every part of the filesystem backend works in: the lock directory
//! and the settings that decide how locks are made and judged.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::dir::LockDir;
use super::layout::Strategy;
use crate::error::{Error, IoResultExt, LossReason, Result};
use crate::name::LockName;
use crate::record::OwnRecord;
use crate::stale;
use crate::stats::Counters;
use crate::sys;
use crate::sys::syscall::{self, Errno};

/// Which lock directory a `Locker` opens, and how: used once, by
/// `Fs::open`.
#[derive(Debug)]
pub(crate) struct Place {
    /// `None`: the per-user default directory.
    pub(crate) directory: Option<PathBuf>,
    pub(crate) allow_insecure: bool,
    /// Whether a missing directory is created.
    pub(crate) create: bool,
    /// Only inspects: the directory need not be writable.
    pub(crate) read_only: bool,
}

/// How a `Locker` that keeps its locks in a directory takes, keeps and
/// judges them: the directory layer's one settings type, kept whole in
/// its context (`Ctx::settings`).
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) strategy: Strategy,
    pub(crate) lease: Duration,
    pub(crate) grace: Duration,
    pub(crate) foreign_lease: Option<Duration>,
    pub(crate) durable: bool,
    pub(crate) fencing: bool,
    /// Turns of one acquisition (`LockerBuilder::fair`).
    pub(crate) fair: bool,
    pub(crate) fields: Option<Arc<crate::field::OwnerFields>>,
}

/// The lock directory and the `Locker`'s settings for it.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) dir: LockDir,
    /// How locks are taken, kept and judged here.
    pub(crate) settings: Settings,
    pub(crate) holder_id: String,
    pub(crate) counters: Arc<Counters>,
    /// When each lock file was first seen, for [`Ctx::known_for`].
    pub(crate) first_seen: Mutex<HashMap<(u64, u64), FirstSeen>>,
    /// The boot-clock millisecond of the last leftover sweep; 0: never.
    pub(crate) last_sweep_ms: AtomicU64,
    /// Set once `link(2)` failed as unsupported in the lock directory
    /// (some FUSE and FAT filesystems): lock files are then created in
    /// place (see `file::create`).
    pub(crate) no_link: std::sync::atomic::AtomicBool,
    /// This `Locker`'s places in the lines of other processes' waiters.
    pub(crate) lines: super::line::Lines,
}

impl Ctx {
    /// The path of `file_name` in the lock directory, for messages.
    pub(crate) fn path_of(&self, file_name: &str) -> PathBuf {
        self.dir.path_of(file_name)
    }

    /// The names in the lock directory that `keep` accepts, sorted.
    pub(crate) fn entries(&self, keep: impl Fn(&str) -> bool) -> Result<Vec<String>> {
        let mut names: Vec<String> = syscall::list_at(self.dir.fd())
            .context("list lock directory", || self.dir.path())?
            .into_iter()
            .filter_map(|name| name.into_string().ok())
            .filter(|name| keep(name))
            .collect();
        names.sort();
        Ok(names)
    }

    /// How long this `Locker` has known the file `instance`, as it is, on
    /// the boot clock: the age of a record changed at `mtime`, when that
    /// is in the future (else zero: unused, and nothing is remembered, so
    /// that a busy lock changing hands does not fill the map and make it
    /// forget the age of a dead one). One entry per device and inode
    /// number, dated again when another file or another version of it is
    /// found there (see [`sys::Instance`]): ext4 gives a removed file's
    /// number to the next file made, whose age must not be the old one's;
    /// a holder's renewal is a new version too, which dates its record
    /// again (younger: the safe way).
    pub(crate) fn known_for(&self, mtime: std::time::SystemTime, instance: sys::Instance) -> Duration {
        if !crate::stale::dated_ahead(mtime, std::time::SystemTime::now()) {
            return Duration::ZERO;
        }
        let mut seen = self.first_seen.lock().unwrap_or_else(|e| e.into_inner());
        FirstSeen::age(&mut seen, instance, sys::boot_clock_ms())
    }

    pub(crate) fn rules(&self) -> stale::Rules {
        stale::Rules {
            grace: self.settings.grace,
            foreign_lease: self.settings.foreign_lease,
        }
    }

    /// Whether something is at the lock path (a lookup, nothing opened).
    pub(crate) fn path_taken(&self, name: &LockName) -> bool {
        syscall::stat_at(self.dir.fd(), name.file_name()).is_ok()
    }

    /// Whether the lock path still names the inode `(dev, ino)`.
    pub(crate) fn names(&self, name: &LockName, dev: u64, ino: u64) -> Result<bool> {
        match syscall::stat_at(self.dir.fd(), name.file_name()) {
            Ok(st) => Ok(st.dev == dev && st.ino == ino),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(e).context("inspect lock", || self.path_of(name.file_name())),
        }
    }

    /// `Some` when the directory's path no longer names the directory
    /// this `Locker` opened (see [`LockDir::moved`]).
    pub(crate) fn dir_moved(&self) -> Option<LossReason> {
        self.dir.moved().then(|| LossReason::DirectoryReplaced {
            path: self.dir.configured().to_owned(),
        })
    }

    /// [`Error::DirectoryReplaced`] when the directory was moved.
    pub(crate) fn ensure_dir_in_place(&self) -> Result<()> {
        match self.dir.moved() {
            false => Ok(()),
            true => Err(Error::DirectoryReplaced {
                path: self.dir.configured().to_owned(),
            }),
        }
    }

    /// The record a new holder of `name` writes.
    pub(crate) fn own_record(&self, name: &LockName) -> OwnRecord {
        OwnRecord::new(
            &self.holder_id,
            self.settings.fields.as_ref(),
            self.settings.lease,
            name,
        )
    }
}

/// Reads a record (a lock's, a member's, a fencing counter) through its
/// descriptor, up to just past the size limit.
pub(crate) fn read_record(file: &std::fs::File) -> std::io::Result<Vec<u8>> {
    syscall::read_up_to(file, crate::record::MAX_RECORD_LEN)
}

/// When a `Locker` first saw the file at a device and inode number, as
/// it was then (birth and change times).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FirstSeen {
    version: (u64, u64),
    at: u64,
}

impl FirstSeen {
    /// How long `seen` has known `instance` at `now` (boot clock, ms),
    /// entering it if new, or dating it again if another file or version.
    fn age(seen: &mut HashMap<(u64, u64), FirstSeen>, instance: sys::Instance, now: u64) -> Duration {
        if seen.len() > 4096 {
            seen.clear();
        }
        let version = (instance.born, instance.changed);
        let entry = seen
            .entry((instance.dev, instance.ino))
            .or_insert(FirstSeen { version, at: now });
        if entry.version != version {
            *entry = FirstSeen { version, at: now };
        }
        Duration::from_millis(now.saturating_sub(entry.at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file's age counts from its first sighting while it stays the
    /// same file, as it was; another file at its number (another birth
    /// time, or on a filesystem without birth times another change time,
    /// as a new file has) or a write to it counts afresh.
    #[test]
    fn a_file_is_known_for_as_long_as_it_stays_the_same_file() {
        let mut seen = HashMap::new();
        let file = |born, changed| sys::Instance {
            dev: 1,
            ino: 7,
            born,
            changed,
        };
        let ms = Duration::from_millis;
        assert_eq!(FirstSeen::age(&mut seen, file(10, 10), 1000), ms(0));
        assert_eq!(FirstSeen::age(&mut seen, file(10, 10), 4000), ms(3000));
        // The next file at that number: another birth time.
        assert_eq!(FirstSeen::age(&mut seen, file(20, 20), 5000), ms(0));
        assert_eq!(FirstSeen::age(&mut seen, file(20, 20), 6000), ms(1000));
        // Without birth times (0): told apart by their change times.
        assert_eq!(FirstSeen::age(&mut seen, file(0, 30), 7000), ms(0));
        assert_eq!(FirstSeen::age(&mut seen, file(0, 40), 9000), ms(0));
        assert_eq!(FirstSeen::age(&mut seen, file(0, 40), 9500), ms(500));
        // Another inode number is another entry; the first keeps its age.
        let other = sys::Instance {
            ino: 8,
            ..file(0, 40)
        };
        assert_eq!(FirstSeen::age(&mut seen, other, 9600), ms(0));
        assert_eq!(FirstSeen::age(&mut seen, file(0, 40), 9900), ms(900));
        assert_eq!(seen.len(), 2, "one entry per inode number");
    }
}
