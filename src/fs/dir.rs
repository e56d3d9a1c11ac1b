//! The lock directory: opened once, used only through its descriptor.

use std::fs::{DirBuilder, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
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
        super::syscall::usable_dir(&self.fd, !read_only).context("use lock directory", || &self.path)
    }

    /// Creates the directory (mode 0700) if needed, opens it and checks
    /// that it is safe to keep locks in.
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
}

fn in_memory(fd: &File) -> bool {
    super::syscall::in_memory(fd)
}

/// `/run/lock/leasehold-<euid>`, or `/tmp/leasehold-<euid>` where
/// `/run/lock` is not a shared lock directory.
///
/// No environment variable takes part (`XDG_RUNTIME_DIR` is unset under
/// cron, `TMPDIR` differs between sessions): every process of one user on
/// one host must meet in the same directory.
pub(crate) fn default_directory() -> PathBuf {
    per_user_directory("leasehold")
}

/// `<root>/<prefix>-<euid>`, where the root is `/run/lock` if it is a
/// root-owned, world-writable directory with the sticky bit (as on Debian
/// and Ubuntu: tmpfs, emptied at boot, which suits locks), else the literal
/// `/tmp`. Whoever creates the directory first owns it, so it must then
/// pass [`check_private`].
pub(crate) fn per_user_directory(prefix: &str) -> PathBuf {
    let shared =
        |meta: &std::fs::Metadata| meta.is_dir() && meta.uid() == 0 && meta.mode() & 0o1002 == 0o1002;
    let root = match std::fs::metadata("/run/lock") {
        Ok(meta) if shared(&meta) => "/run/lock",
        _ => "/tmp",
    };
    Path::new(root).join(format!("{prefix}-{}", super::syscall::euid()))
}

/// A per-user directory in a shared root must be ours and closed to
/// others, or someone could have planted it there; and writable, or a
/// read-only mount (systemd's `ProtectSystem=strict`) would only show at the
/// first acquisition.
pub(crate) fn check_private(dir: &LockDir) -> Result<()> {
    let meta = dir
        .fd()
        .metadata()
        .context("inspect lock directory", || dir.path())?;
    if meta.uid() != super::syscall::euid() {
        return Err(Error::InsecureDirectory {
            path: dir.path().to_owned(),
            reason: "the default lock directory belongs to another user",
        });
    }
    // In a shared root, anyone may plant a symlink at our name, pointing at
    // a private directory of ours (it would pass the checks above) and
    // later somewhere else: the name itself must be the directory opened.
    let itself = std::fs::symlink_metadata(dir.configured())
        .is_ok_and(|at| at.is_dir() && at.dev() == meta.dev() && at.ino() == meta.ino());
    if !itself {
        return Err(Error::InsecureDirectory {
            path: dir.configured().to_owned(),
            reason: "the default lock directory is a symlink, or was replaced while it was opened",
        });
    }
    if meta.mode() & 0o077 != 0 {
        return Err(Error::InsecureDirectory {
            path: dir.path().to_owned(),
            reason: "the default lock directory is open to other users (expected mode 0700)",
        });
    }
    if super::syscall::read_only(dir.fd()) {
        return Err(Error::io(
            "write to lock directory",
            dir.path(),
            io::Error::from(super::syscall::Errno::EROFS),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symlink_planted_at_the_default_name_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let real = root.path().join("mine");
        std::fs::create_dir(&real).unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
        let planted = root.path().join("leasehold-me");
        std::os::unix::fs::symlink(&real, &planted).unwrap();
        let dir = LockDir::open(&planted, false).unwrap();
        match check_private(&dir) {
            Err(Error::InsecureDirectory { path, .. }) => assert_eq!(path, planted),
            other => panic!("expected InsecureDirectory, got {other:?}"),
        }
        // The directory itself, private and ours, passes.
        check_private(&LockDir::open(&real, false).unwrap()).unwrap();
    }
}
