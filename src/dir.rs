//! The lock directory: opened once, used only through its descriptor.

use std::fs::{DirBuilder, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;

use crate::error::{Error, Result};

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
    fd: File,
}

impl LockDir {
    /// Creates the directory (mode 0700) if needed, opens it and checks
    /// that it is safe to keep locks in.
    pub(crate) fn open(path: &Path, allow_insecure: bool) -> Result<Self> {
        let path = if path.is_absolute() {
            path.to_owned()
        } else {
            std::env::current_dir()
                .map_err(|e| Error::io("resolve the current directory for", path, e))?
                .join(path)
        };
        match DirBuilder::new().recursive(true).mode(0o700).create(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io("create lock directory", &path, e)),
        }
        let path = path
            .canonicalize()
            .map_err(|e| Error::io("resolve lock directory", &path, e))?;
        let fd = File::open(&path).map_err(|e| Error::io("open lock directory", &path, e))?;
        let meta = fd
            .metadata()
            .map_err(|e| Error::io("inspect lock directory", &path, e))?;
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
        Ok(Self { path, fd })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn fd(&self) -> &File {
        &self.fd
    }

    pub(crate) fn path_of(&self, file_name: &str) -> PathBuf {
        self.path.join(file_name)
    }

    /// Takes the directory's mutation lock: `flock(LOCK_EX)` on a fresh open
    /// of the directory, so it excludes other threads and processes alike.
    ///
    /// Every removal of a lock path by leasehold (release, reclaim) happens
    /// under it, after checking that the path still names the inode that was
    /// judged. Creation needs no lock: `O_EXCL` only succeeds on an absent
    /// path, so under this lock a present path cannot change.
    pub(crate) fn mutation_lock(&self) -> Result<MutationLock> {
        self.mutation_lock_within(MUTATION_PATIENCE)
    }

    /// As [`mutation_lock`](Self::mutation_lock), waiting at most
    /// `patience` (for callers with a deadline of their own).
    pub(crate) fn mutation_lock_within(&self, patience: Duration) -> Result<MutationLock> {
        let fd = openat(
            &self.fd,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::errno("open lock directory", &self.path, e))?;
        let file = File::from(fd);
        let deadline = Instant::now() + patience.min(MUTATION_PATIENCE);
        let mut pause = Duration::from_micros(20);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(MutationLock { _file: file }),
                Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(5));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(Error::io(
                        "lock (another process kept it too long)",
                        &self.path,
                        io::Error::from(io::ErrorKind::TimedOut),
                    ));
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(Error::io("lock", &self.path, e));
                }
            }
        }
    }
}

/// Held while removing a lock path; closing the descriptor unlocks.
#[derive(Debug)]
pub(crate) struct MutationLock {
    _file: File,
}
