//! The lock directory: opened once, used only through its descriptor.

use crate::sys::syscall;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::{Error, IoResultExt, Result};

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
    /// On tmpfs, where `fdatasync` returns at once (and nothing outlives a
    /// reboot anyway).
    in_memory: bool,
}

impl LockDir {
    /// Fails unless this process may list and search the directory and,
    /// unless `read_only`, create entries in it: at build rather than at
    /// the first acquisition.
    pub(crate) fn check_usable(&self, read_only: bool) -> Result<()> {
        crate::sys::syscall::usable_dir(&self.fd, !read_only).context("use lock directory", || &self.path)
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
            match syscall::private_dir().recursive(true).create(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e).context("create lock directory", || &path),
            }
        }
        let configured = path.clone();
        let path = path.canonicalize().context("resolve lock directory", || &path)?;
        let fd = syscall::open_dir(&path).context("open lock directory", || &path)?;
        let meta = syscall::meta(&fd).context("inspect lock directory", || &path)?;
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
            in_memory,
        })
    }

    /// Whether the directory lives in memory (tmpfs), where syncing
    /// a record costs nothing and so never blocks.
    pub(crate) fn in_memory(&self) -> bool {
        self.in_memory
    }

    /// Whether, as the directory stands now, nobody but this process's
    /// user (and root) can make entries in it: it is this user's, and
    /// writable by neither its group nor others. Then a file mode 0600 that
    /// one of our processes made there, any other process using the
    /// directory can open. Never on Windows, whose access lists this does
    /// not read.
    #[cfg(unix)]
    pub(crate) fn private_to_us(&self) -> bool {
        syscall::meta(&self.fd).is_ok_and(|meta| meta.mode() & 0o022 == 0 && meta.uid() == syscall::euid())
    }

    /// See the Unix version: never on Windows.
    #[cfg(not(unix))]
    pub(crate) fn private_to_us(&self) -> bool {
        false
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
        match syscall::meta_of(&self.configured) {
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
}

fn in_memory(fd: &File) -> bool {
    crate::sys::fs_in_memory(fd)
}
