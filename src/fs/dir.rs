//! The lock directory: opened once, used only through its descriptor.

use std::collections::{HashMap, VecDeque};
use std::fs::{DirBuilder, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::error::{Error, IoResultExt, Result};

/// How long a release or reclaim waits for the directory's mutation lock
/// before giving up. The lock is held for a few syscalls at a time, so only
/// a holder frozen inside that window (SIGSTOP) can make anyone wait.
const MUTATION_PATIENCE: Duration = Duration::from_millis(500);

/// An open lock directory.
///
/// Every lock file is reached relative to this descriptor (`openat`,
/// `fstatat`, `unlinkat`), so replacing the directory's path after `build()`
/// cannot redirect leasehold anywhere else.
#[derive(Debug)]
pub(crate) struct LockDir {
    path: PathBuf,
    /// The path as configured, made absolute but not resolved: what other
    /// processes configured alike will open, symlinks and all. Only ever
    /// looked at, to notice when it names another directory.
    configured: PathBuf,
    fd: File,
    /// The directory's identity when it was opened, to notice when its
    /// path comes to name another directory (or none).
    dev: u64,
    ino: u64,
    /// Whether an inconclusive look at `configured` was reported already.
    moved_warned: std::sync::atomic::AtomicBool,
    /// This process's threads that want the directory lock, whatever
    /// `Locker` they belong to, in arrival order.
    turnstile: Arc<Turnstile>,
    /// On tmpfs, where `fdatasync` returns at once (and nothing outlives a
    /// reboot anyway).
    in_memory: bool,
}

impl LockDir {
    /// Fails unless this process may list and search the directory and,
    /// unless `read_only`, create entries in it: at build rather than at
    /// the first acquisition.
    pub(crate) fn check_usable(&self, read_only: bool) -> Result<()> {
        super::syscall::usable_dir(&self.fd, !read_only).context("use lock directory", || &self.path)
    }

    /// Creates the directory (mode 0700) if needed, opens it and checks
    /// that it is safe to keep locks in.
    #[cfg(test)]
    pub(crate) fn open(path: &Path, allow_insecure: bool) -> Result<Self> {
        Self::open_with(path, allow_insecure, true)
    }

    /// [`open`](Self::open), creating a missing directory only if `create`;
    /// otherwise a missing one is an [`Error::Io`] of kind `NotFound`.
    pub(crate) fn open_with(path: &Path, allow_insecure: bool, create: bool) -> Result<Self> {
        let path = if path.is_absolute() {
            path.to_owned()
        } else {
            std::env::current_dir()
                .context("resolve the current directory for", || path)?
                .join(path)
        };
        if create {
            match DirBuilder::new().recursive(true).mode(0o700).create(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e).context("create lock directory", || &path),
            }
        }
        let configured = path.clone();
        let path = path.canonicalize().context("resolve lock directory", || &path)?;
        let fd = File::open(&path).context("open lock directory", || &path)?;
        let meta = fd.metadata().context("inspect lock directory", || &path)?;
        if !meta.is_dir() {
            return Err(Error::InvalidConfig {
                reason: format!("{} is not a directory", path.display()),
            });
        }
        let mode = meta.mode();
        if mode & 0o002 != 0 && mode & 0o1000 == 0 && !allow_insecure {
            return Err(Error::InsecureDirectory {
                path,
                reason: "it is world-writable without the sticky bit, so any user could remove or replace locks",
            });
        }
        let in_memory = in_memory(&fd);
        Ok(Self {
            configured,
            moved_warned: std::sync::atomic::AtomicBool::new(false),
            dev: meta.dev(),
            ino: meta.ino(),
            path,
            fd,
            turnstile: Turnstile::of(meta.dev(), meta.ino()),
            in_memory,
        })
    }

    /// Whether the directory lives in memory (tmpfs), where syncing
    /// a record costs nothing and so never blocks.
    pub(crate) fn in_memory(&self) -> bool {
        self.in_memory
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the configured path no longer names the directory opened at
    /// `build()` (moved, removed, replaced by another, or a symlink on the
    /// way now pointing elsewhere). Locks taken or kept in such a directory
    /// exclude nobody who opens the path now. The path is only looked at,
    /// never used to reach a lock.
    ///
    /// Only a definite answer counts: another directory there, or nothing
    /// (`ENOENT`, `ENOTDIR`). A look that fails otherwise (a parent closed
    /// to this user after `build()`, a stale network mount) proves nothing,
    /// and the directory, reached through its descriptor, still works: it
    /// is logged once and taken as not moved.
    pub(crate) fn moved(&self) -> bool {
        match std::fs::metadata(&self.configured) {
            Ok(meta) => meta.dev() != self.dev || meta.ino() != self.ino,
            Err(e) if e.kind() == io::ErrorKind::NotFound || e.kind() == io::ErrorKind::NotADirectory => true,
            Err(error) => {
                if !self.moved_warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(
                        dir = %self.configured.display(),
                        %error,
                        "cannot tell whether the lock directory was moved; assuming it was not"
                    );
                }
                false
            }
        }
    }

    /// The path as configured (absolute, symlinks not resolved).
    pub(crate) fn configured(&self) -> &Path {
        &self.configured
    }

    pub(crate) fn fd(&self) -> &File {
        &self.fd
    }

    pub(crate) fn path_of(&self, file_name: &str) -> PathBuf {
        self.path.join(file_name)
    }

    /// Takes the directory's mutation lock: `flock(LOCK_EX)` on the
    /// directory, which excludes other processes, under a mutex, which
    /// excludes the other threads of this one.
    ///
    /// Every removal of a lock path by leasehold (release, reclaim) happens
    /// under it, after checking that the path still names the inode that was
    /// judged. Creation needs no lock: `O_EXCL` only succeeds on an absent
    /// path, so under this lock a present path cannot change.
    pub(crate) fn mutation_lock(&self) -> Result<MutationLock<'_>> {
        self.mutation_lock_within(MUTATION_PATIENCE)
    }

    /// As [`mutation_lock`](Self::mutation_lock), but `None` when another
    /// process kept the lock past the patience (say it is frozen while
    /// holding it): for callers that can simply come back later.
    pub(crate) fn try_mutation_lock(&self) -> Result<Option<MutationLock<'_>>> {
        self.lock_within(MUTATION_PATIENCE)
    }

    /// As [`mutation_lock`](Self::mutation_lock), but `None` at once
    /// when another thread or process holds it: for callers on the
    /// runtime's thread, which must not wait.
    pub(crate) fn mutation_lock_now(&self) -> Result<Option<MutationLock<'_>>> {
        self.lock_within(Duration::ZERO)
    }

    /// As [`mutation_lock`](Self::mutation_lock), waiting at most
    /// `patience` (for callers with a deadline of their own).
    pub(crate) fn mutation_lock_within(&self, patience: Duration) -> Result<MutationLock<'_>> {
        self.lock_within(patience)?.ok_or_else(|| {
            Error::io(
                "lock (another process kept it too long)",
                &self.path,
                io::Error::from(io::ErrorKind::TimedOut),
            )
        })
    }

    /// The mutation lock, or `None` when the patience ran out first.
    fn lock_within(&self, patience: Duration) -> Result<Option<MutationLock<'_>>> {
        // The flock excludes other processes (a lock on an open file
        // description does not exclude our own threads); the turnstile, one
        // per directory for the whole process, excludes our threads and
        // serves them in arrival order, so only one of them polls the flock
        // and a thread that takes the lock every few milliseconds cannot
        // starve one that backs off between polls. Nobody sleeps holding
        // the flock, and both waits are bounded by the patience.
        let deadline = Instant::now() + patience.min(MUTATION_PATIENCE);
        let Some(turn) = self.turnstile.enter(deadline) else {
            return Ok(None);
        };
        let mut pause = Duration::from_micros(20);
        loop {
            let locked = failpoint!("dirlock.before_flock").map_err(std::fs::TryLockError::Error);
            match locked.and_then(|()| self.fd.try_lock()) {
                Ok(()) => {
                    return Ok(Some(MutationLock {
                        fd: &self.fd,
                        _turn: turn,
                    }));
                }
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(Error::io("lock the lock directory", &self.path, e));
                }
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }
}

fn in_memory(fd: &File) -> bool {
    super::syscall::in_memory(fd)
}

/// The threads of this process waiting for one directory's lock, served in
/// arrival order, each for at most its own patience.
#[derive(Debug, Default)]
struct Turnstile {
    line: Mutex<Line>,
    moved: Condvar,
}

#[derive(Debug, Default)]
struct Line {
    next_ticket: u64,
    waiting: VecDeque<u64>,
    taken: bool,
}

/// A thread's turn at the directory lock; dropping it lets the next in.
#[derive(Debug)]
struct Turn<'a>(&'a Turnstile);

impl Turnstile {
    /// The turnstile of the directory `(dev, ino)`, shared by every
    /// `Locker` of this process on it.
    fn of(dev: u64, ino: u64) -> Arc<Self> {
        type ByDirectory = HashMap<(u64, u64), Weak<Turnstile>>;
        static ALL: OnceLock<Mutex<ByDirectory>> = OnceLock::new();
        let mut all = lock(ALL.get_or_init(Mutex::default));
        if let Some(turnstile) = all.get(&(dev, ino)).and_then(Weak::upgrade) {
            return turnstile;
        }
        all.retain(|_, t| t.strong_count() > 0);
        let turnstile = Arc::new(Turnstile::default());
        all.insert((dev, ino), Arc::downgrade(&turnstile));
        turnstile
    }

    /// Waits for this thread's turn, in arrival order, until `deadline`.
    fn enter(&self, deadline: Instant) -> Option<Turn<'_>> {
        let mut line = lock(&self.line);
        let me = line.next_ticket;
        line.next_ticket += 1;
        line.waiting.push_back(me);
        loop {
            if !line.taken && line.waiting.front() == Some(&me) {
                line.waiting.pop_front();
                line.taken = true;
                return Some(Turn(self));
            }
            let now = Instant::now();
            if now >= deadline {
                line.waiting.retain(|&ticket| ticket != me);
                drop(line);
                // Whoever was behind us may be first now.
                self.moved.notify_all();
                return None;
            }
            line = self
                .moved
                .wait_timeout(line, deadline - now)
                .map(|(line, _)| line)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut line = lock(&self.0.line);
        line.taken = false;
        // Waiters join the line under its mutex before they sleep, so an
        // empty line has nobody to wake (and the uncontended path saves
        // a futex call).
        let anyone = !line.waiting.is_empty();
        drop(line);
        if anyone {
            self.0.moved.notify_all();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing here can be left torn by a panic.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Held while removing a lock path; dropping it unlocks.
#[derive(Debug)]
pub(crate) struct MutationLock<'a> {
    fd: &'a File,
    _turn: Turn<'a>,
}

impl Drop for MutationLock<'_> {
    fn drop(&mut self) {
        // Failing to unlock a descriptor we locked cannot happen short of a
        // kernel bug; if it did, the lock would go with the Locker.
        let _ = self.fd.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_turnstile_serves_in_arrival_order_and_a_timed_out_waiter_leaves_the_line() {
        let turnstile = Arc::new(Turnstile::default());
        let far = || Instant::now() + Duration::from_secs(10);
        let first = turnstile.enter(far()).expect("free");
        // A waiter whose patience runs out leaves without blocking others.
        assert!(
            turnstile
                .enter(Instant::now() + Duration::from_millis(20))
                .is_none()
        );
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        for n in 0..4 {
            let (t, order) = (Arc::clone(&turnstile), Arc::clone(&order));
            threads.push(std::thread::spawn(move || {
                let _turn = t.enter(Instant::now() + Duration::from_secs(10)).expect("served");
                order.lock().unwrap().push(n);
            }));
            // Let each one queue before the next arrives.
            while lock(&turnstile.line).waiting.len() < n + 1 {
                std::thread::yield_now();
            }
        }
        drop(first);
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3]);
        assert!(turnstile.enter(far()).is_some(), "free again");
    }

    #[test]
    fn lockers_of_one_process_share_a_directorys_turnstile() {
        let dir = tempfile::tempdir().unwrap();
        let a = LockDir::open(dir.path(), false).unwrap();
        let b = LockDir::open(dir.path(), false).unwrap();
        assert!(Arc::ptr_eq(&a.turnstile, &b.turnstile));
        let held = a.mutation_lock().unwrap();
        let started = Instant::now();
        assert!(b.lock_within(Duration::from_millis(30)).unwrap().is_none());
        assert!(started.elapsed() >= Duration::from_millis(30));
        drop(held);
        assert!(b.try_mutation_lock().unwrap().is_some());
    }
}
