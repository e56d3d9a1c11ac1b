//! The exclusive-file strategy.
//!
//! A lock is one regular file, `<dir>/<safeName>-<hash16>.lock`, created with
//! `O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC`, mode 0600. The creator takes
//! `flock(LOCK_EX)` on it *before* writing the record, writes the record in
//! one `pwrite` and (by default) `fdatasync`s it, and keeps the descriptor,
//! and so the `flock`, for as long as it holds the lock.
//!
//! Renewal rewrites the record in place through that descriptor with a
//! record of the same length, then checks that the path still names the
//! same `(dev, ino)`: it can never write into a file someone else created.
//! A reader may see a torn renewal, so a reclaim that relies on the record's
//! content (lease expiry, a foreign owner's pid) re-reads it under the
//! directory's mutation lock and backs off if it changed.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use super::{Attempt, Ctx, Held, Inspection, Renewal};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::owner::Owner;
use crate::record::{self, FORMAT_VERSION, MAX_RECORD_LEN, OwnRecord, Parsed};
use crate::stale::{self, Evidence, StaleReason, Verdict};
use crate::sys;

/// Create-or-reclaim rounds in one attempt before reporting contention; a
/// round only repeats when the lock changed hands under us.
const ROUNDS: usize = 4;

/// A lock file this process created. Dropping it removes the file if, and
/// only if, the path still names it.
#[derive(Debug)]
pub(crate) struct FileLock {
    ctx: Arc<Ctx>,
    name: LockName,
    file: File,
    dev: u64,
    ino: u64,
    record: OwnRecord,
    record_len: usize,
    armed: bool,
}

pub(super) fn try_acquire(ctx: &Arc<Ctx>, name: &LockName) -> Result<Attempt> {
    for _ in 0..ROUNDS {
        let flags = OFlag::O_CREAT
            | OFlag::O_EXCL
            | OFlag::O_WRONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_CLOEXEC
            | OFlag::O_NOCTTY;
        match openat(
            ctx.dir.fd(),
            name.file_name(),
            flags,
            Mode::from_bits_truncate(0o600),
        ) {
            Ok(fd) => return publish(ctx, name, File::from(fd)),
            Err(Errno::EEXIST) => {}
            Err(e) => {
                return Err(Error::errno(
                    "create lock file",
                    ctx.dir.path_of(name.file_name()),
                    e,
                ));
            }
        }
        let Some(mut found) = Found::open(ctx, name)? else {
            continue;
        };
        match found.judge(ctx) {
            Verdict::Stale(reason) => {
                found.reclaim(ctx, name, reason)?;
            }
            _ => {
                return Ok(Attempt::Busy {
                    owner: Some(found.owner()),
                    recheck_at: stale::recheck_at(&found.parsed, found.mtime, ctx.grace),
                });
            }
        }
    }
    Ok(Attempt::Busy {
        owner: None,
        recheck_at: None,
    })
}

pub(super) fn inspect(ctx: &Ctx, name: &LockName) -> Result<Option<Inspection>> {
    let Some(mut found) = Found::open(ctx, name)? else {
        return Ok(None);
    };
    let stale = match found.judge(ctx) {
        Verdict::Stale(reason) => Some(reason),
        _ => None,
    };
    Ok(Some(Inspection {
        owner: found.owner(),
        stale,
    }))
}

fn publish(ctx: &Arc<Ctx>, name: &LockName, file: File) -> Result<Attempt> {
    let path = || ctx.dir.path_of(name.file_name());
    let meta = file
        .metadata()
        .map_err(|e| Error::io("inspect new lock file", path(), e))?;
    let record = own_record(ctx);
    let bytes = record.to_bytes(0);
    // Armed from here on: any failure below removes the half-made lock.
    let lock = FileLock {
        ctx: Arc::clone(ctx),
        name: name.clone(),
        file,
        dev: meta.dev(),
        ino: meta.ino(),
        record,
        record_len: bytes.len(),
        armed: true,
    };
    // The flock must be ours before the record is readable, so that a
    // reader who sees a complete record may take a free flock as proof that
    // the holder is gone. Only a reader testing a record older than the
    // grace period can hold it briefly, so a few tries suffice.
    let mut tries = 0;
    while lock.file.try_lock().is_err() {
        tries += 1;
        if tries == 50 {
            return Ok(Attempt::Busy {
                owner: None,
                recheck_at: None,
            });
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    lock.file
        .write_all_at(&bytes, 0)
        .map_err(|e| Error::io("write lock record", path(), e))?;
    if ctx.durable {
        lock.file
            .sync_data()
            .map_err(|e| Error::io("sync lock record", path(), e))?;
    }
    Ok(Attempt::Acquired(Held::File(lock)))
}

fn own_record(ctx: &Ctx) -> OwnRecord {
    let me = sys::identity();
    let now = SystemTime::now();
    let lease_ms = u64::try_from(ctx.lease.as_millis()).unwrap_or(u64::MAX);
    OwnRecord {
        uuid: uuid::Uuid::new_v4().to_string(),
        pid: me.pid,
        start_time: me.start.map(|s| s.epoch_ms),
        holder_id: ctx.holder_id.clone(),
        hostname: me.hostname.clone(),
        acquired_at: record::format_time(now),
        lease_expires_at: record::format_time(now + ctx.lease),
        lease_ms,
        leasehold: FORMAT_VERSION,
        boot_id: me.boot_id.clone(),
        pid_ns: me.pid_ns.clone(),
        proc_start: me.start.map(|s| s.ticks),
        renewed_at_boot: sys::boot_clock_ms(),
    }
}

impl FileLock {
    pub(crate) fn owner(&self) -> Owner {
        Owner::from_record(&self.record.parsed())
    }

    pub(crate) fn lease_deadline_boot_ms(&self) -> u64 {
        self.record.renewed_at_boot.saturating_add(self.record.lease_ms)
    }

    pub(crate) fn renew(&mut self) -> Result<Renewal> {
        let mut record = self.record.clone();
        record.renew(SystemTime::now(), sys::boot_clock_ms());
        let bytes = record.to_bytes(self.record_len);
        self.file
            .write_all_at(&bytes, 0)
            .map_err(|e| Error::io("renew lease in", self.path(), e))?;
        self.record_len = bytes.len();
        self.record = record;
        if self.still_ours()? {
            Ok(Renewal::Renewed)
        } else {
            Ok(Renewal::NotOurs("the lock file was removed or replaced"))
        }
    }

    pub(crate) fn release(mut self) -> Result<bool> {
        self.armed = false;
        self.remove()
    }

    fn path(&self) -> std::path::PathBuf {
        self.ctx.dir.path_of(self.name.file_name())
    }

    fn still_ours(&self) -> Result<bool> {
        match fstatat(
            self.ctx.dir.fd(),
            self.name.file_name(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => Ok(st.st_dev == self.dev && st.st_ino == self.ino),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(Error::errno("inspect lock file", self.path(), e)),
        }
    }

    fn remove(&self) -> Result<bool> {
        let _mutation = self.ctx.dir.mutation_lock()?;
        if !self.still_ours()? {
            return Ok(false);
        }
        match unlinkat(
            self.ctx.dir.fd(),
            self.name.file_name(),
            UnlinkatFlags::NoRemoveDir,
        ) {
            Ok(()) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(Error::errno("remove lock file", self.path(), e)),
        }
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.armed = false;
        match self.remove() {
            Ok(_) => {}
            Err(error) => tracing::warn!(
                lock = self.name.as_str(),
                %error,
                "releasing a dropped lock failed; it stays until it is judged stale"
            ),
        }
    }
}

/// An existing lock file, opened for judging.
struct Found {
    file: File,
    dev: u64,
    ino: u64,
    bytes: Vec<u8>,
    parsed: Parsed,
    mtime: SystemTime,
    flocked: bool,
}

impl Found {
    /// Opens what is at the lock path, refusing anything but a regular file
    /// without opening it (a FIFO or device node could block or have side
    /// effects). `None` when the path is empty or changed while we looked.
    fn open(ctx: &Ctx, name: &LockName) -> Result<Option<Self>> {
        let path = || ctx.dir.path_of(name.file_name());
        let st = match fstatat(ctx.dir.fd(), name.file_name(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(Error::errno("inspect lock file", path(), e)),
        };
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        if kind != SFlag::S_IFREG {
            return Err(Error::UnexpectedFile {
                name: name.as_str().to_owned(),
                path: path(),
                found: kind_name(kind),
            });
        }
        let flags =
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
        let file = match openat(ctx.dir.fd(), name.file_name(), flags, Mode::empty()) {
            Ok(fd) => File::from(fd),
            // Replaced between the stat and the open: look again.
            Err(Errno::ENOENT | Errno::ELOOP | Errno::ENXIO) => return Ok(None),
            Err(e) => return Err(Error::errno("open lock file", path(), e)),
        };
        let meta = file
            .metadata()
            .map_err(|e| Error::io("inspect lock file", path(), e))?;
        if !meta.is_file() || meta.dev() != st.st_dev || meta.ino() != st.st_ino {
            return Ok(None);
        }
        let bytes = read_record(&file).map_err(|e| Error::io("read lock record", path(), e))?;
        let mtime = meta.modified().unwrap_or(UNIX_EPOCH);
        Ok(Some(Found {
            parsed: record::parse(&bytes),
            file,
            dev: meta.dev(),
            ino: meta.ino(),
            bytes,
            mtime,
            flocked: false,
        }))
    }

    fn judge(&mut self, ctx: &Ctx) -> Verdict {
        let host = stale::System;
        let mut evidence = Evidence {
            parsed: &self.parsed,
            mtime: self.mtime,
            flock_free: None,
        };
        let verdict = stale::judge(&evidence, ctx.grace, &host);
        if verdict != Verdict::NeedsFlockTest {
            return verdict;
        }
        // Keep the flock if we get it: while we hold it nobody else can
        // judge this inode abandoned, and the holder cannot be alive.
        self.flocked = self.file.try_lock().is_ok();
        evidence.flock_free = Some(self.flocked);
        stale::judge(&evidence, ctx.grace, &host)
    }

    fn owner(&self) -> Owner {
        Owner::from_parsed(&self.parsed)
    }

    /// Removes the stale lock if the path still names the inode we judged
    /// and, unless our flock proves the holder gone, its record has not
    /// changed since we read it (a renewal may have raced our read).
    fn reclaim(&self, ctx: &Ctx, name: &LockName, reason: StaleReason) -> Result<bool> {
        let path = || ctx.dir.path_of(name.file_name());
        let _mutation = ctx.dir.mutation_lock()?;
        match fstatat(ctx.dir.fd(), name.file_name(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_dev == self.dev && st.st_ino == self.ino => {}
            Ok(_) | Err(Errno::ENOENT) => return Ok(false),
            Err(e) => return Err(Error::errno("inspect lock file", path(), e)),
        }
        if !self.flocked {
            let now = read_record(&self.file).map_err(|e| Error::io("read lock record", path(), e))?;
            if now != self.bytes {
                return Ok(false);
            }
        }
        match unlinkat(ctx.dir.fd(), name.file_name(), UnlinkatFlags::NoRemoveDir) {
            Ok(()) => {}
            Err(Errno::ENOENT) => return Ok(false),
            Err(e) => return Err(Error::errno("remove stale lock file", path(), e)),
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

fn read_record(file: &File) -> std::io::Result<Vec<u8>> {
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
    if kind == SFlag::S_IFDIR {
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
