//! The filesystem backend's syscalls, relative to a directory descriptor,
//! for the Unix family (Linux, macOS, the BSDs).
//!
//! Every lock file is reached with `*at` calls on the lock directory's
//! descriptor, never by path. The open flags are named here once, one set
//! per purpose; `nix`, `libc` and `std::os::unix` are used nowhere in the
//! backend itself: what it reads of metadata ([`FileMeta`]), its writes
//! at an offset ([`WriteAt`]) and its private directories
//! ([`private_dir`]) come from here too. Failures
//! come back as [`Errno`], which callers match on (`ENOENT`: gone,
//! `EEXIST`: taken, ...) before turning the rest into [`Error`](crate::Error)s with
//! [`IoResultExt`](crate::error::IoResultExt).

use std::ffi::OsString;
use std::fs::{DirBuilder, File, Metadata};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::NixPath;
use nix::fcntl::{AtFlags, OFlag, openat, renameat};
use nix::sys::stat::{Mode, SFlag, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

pub(crate) use nix::errno::Errno;

/// What a file is opened for; each names one set of flags. All of them
/// refuse to follow a symlink at the last component and close on exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Open {
    /// A new regular file, mode 0600, that must not exist yet (a lock
    /// file, a temporary fencing counter). Never a controlling terminal.
    CreateNew,
    /// A regular file to replace inside a directory of our own
    /// (`owner.json`, `owner.json.next`), mode 0600, truncated.
    Replace,
    /// An existing regular file to rewrite in place (a shared lock's
    /// marker). Non-blocking and never a controlling terminal, as `Read`.
    Write,
    /// An existing file to read. Non-blocking, so a FIFO planted at its
    /// name cannot hang the open; never a controlling terminal.
    Read,
    /// An existing directory, to hold (and `flock`) or to work inside.
    Dir,
    /// A name's mutation-lock file, made (mode 0600) if missing; only ever
    /// `flock`ed. Non-blocking and never a controlling terminal, as `Read`.
    Mutex,
    /// A directory to list (a fresh descriptor: a duplicate would share
    /// the other's offset). The one open that may follow a symlink: it
    /// only ever opens `.`.
    List,
}

impl Open {
    fn flags(self) -> OFlag {
        let base = OFlag::O_CLOEXEC;
        base | match self {
            Open::CreateNew => {
                OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_NOCTTY
            }
            Open::Replace => OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_WRONLY | OFlag::O_NOFOLLOW,
            Open::Read => OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY,
            Open::Write => OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY,
            Open::Dir => OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW,
            Open::Mutex => {
                OFlag::O_CREAT | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY
            }
            Open::List => OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        }
    }

    fn mode(self) -> Mode {
        match self {
            Open::CreateNew | Open::Replace | Open::Mutex => Mode::from_bits_truncate(0o600),
            Open::Read | Open::Write | Open::Dir | Open::List => Mode::empty(),
        }
    }
}

/// Opens `name` in `dir` for `how`.
pub(crate) fn open_at<P: ?Sized + NixPath>(dir: &File, name: &P, how: Open) -> Result<File, Errno> {
    openat(dir, name, how.flags(), how.mode()).map(File::from)
}

/// What kind of file a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    Device,
    Other,
}

impl Kind {
    /// The kind, as an error message says it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::File => "regular file",
            Kind::Dir => "directory",
            Kind::Symlink => "symlink",
            Kind::Fifo => "FIFO",
            Kind::Socket => "socket",
            Kind::Device => "device node",
            Kind::Other => "special file",
        }
    }
}

/// What `fstatat` says of a path, without following a symlink.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stat {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    pub(crate) kind: Kind,
    /// The modification time, to the second.
    pub(crate) mtime: SystemTime,
}

/// Looks at `name` in `dir` without opening it or following a symlink.
pub(crate) fn stat_at(dir: &File, name: &str) -> Result<Stat, Errno> {
    let st = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    let kind = match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        k if k == SFlag::S_IFREG => Kind::File,
        k if k == SFlag::S_IFDIR => Kind::Dir,
        k if k == SFlag::S_IFLNK => Kind::Symlink,
        k if k == SFlag::S_IFIFO => Kind::Fifo,
        k if k == SFlag::S_IFSOCK => Kind::Socket,
        k if k == SFlag::S_IFCHR || k == SFlag::S_IFBLK => Kind::Device,
        _ => Kind::Other,
    };
    let mtime = UNIX_EPOCH + Duration::from_secs(u64::try_from(st.st_mtime).unwrap_or(0));
    // `dev_t` and `ino_t` differ by platform (`dev_t` is `i32` on macOS):
    // a device number is only compared for identity, so its bits serve.
    #[allow(clippy::useless_conversion, clippy::unnecessary_cast, clippy::cast_sign_loss)]
    Ok(Stat {
        dev: st.st_dev as u64,
        ino: u64::from(st.st_ino),
        kind,
        mtime,
    })
}

/// Removes the file (not a directory) `name` in `dir`.
pub(crate) fn unlink_at<P: ?Sized + NixPath>(dir: &File, name: &P) -> Result<(), Errno> {
    unlinkat(dir, name, UnlinkatFlags::NoRemoveDir)
}

/// Makes `to` a second name of the file `from`, both in `dir`; fails with
/// `EEXIST` if `to` exists (an atomic create-with-content).
pub(crate) fn link_at(dir: &File, from: &str, to: &str) -> Result<(), Errno> {
    nix::unistd::linkat(dir, from, dir, to, AtFlags::empty())
}

/// Removes the empty directory `name` in `dir`.
pub(crate) fn rmdir_at(dir: &File, name: &str) -> Result<(), Errno> {
    unlinkat(dir, name, UnlinkatFlags::RemoveDir)
}

/// Renames `from` to `to`, both in `dir`, replacing what `to` names.
pub(crate) fn rename_at(dir: &File, from: &str, to: &str) -> Result<(), Errno> {
    renameat(dir, from, dir, to)
}

/// Renames `from` in `from_dir` to `to` in `to_dir` (one filesystem),
/// replacing it.
pub(crate) fn rename_between(from_dir: &File, from: &str, to_dir: &File, to: &str) -> Result<(), Errno> {
    renameat(from_dir, from, to_dir, to)
}

/// Creates the directory `name` in `dir`, mode 0700.
pub(crate) fn mkdir_at(dir: &File, name: &str) -> Result<(), Errno> {
    mkdirat(dir, name, Mode::from_bits_truncate(0o700))
}

/// The names in the directory `dir` (`.` and `..` left out), in no
/// particular order. Entries that cannot be read are skipped.
pub(crate) fn list_at(dir: &File) -> Result<Vec<OsString>, Errno> {
    let mut listing = nix::dir::Dir::openat(dir, ".", Open::List.flags(), Open::List.mode())?;
    Ok(listing
        .iter()
        .filter_map(|entry| entry.ok())
        .map(|entry| OsString::from_vec(entry.file_name().to_bytes().to_vec()))
        .filter(|name| name != "." && name != "..")
        .collect())
}

/// Reads a file through a descriptor, from its start, up to just past
/// `limit` bytes (a record's size limit: more is read only to tell that it
/// is too long).
pub(crate) fn read_up_to(file: &File, limit: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0; 4096];
    let mut len = 0;
    loop {
        if len == buf.len() {
            if buf.len() > limit {
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

/// Whether this process, with its effective ids, may list, search and
/// create entries in the directory `dir`: the error says why not
/// (`EACCES` for its mode or ACL, `EROFS` for a read-only mount, `EPERM`
/// for an immutable directory). Root passes the mode checks, as it passes
/// them when it writes.
///
/// Without `write`, only listing and searching are checked (a `Locker`
/// that only inspects).
pub(crate) fn usable_dir(dir: &File, write: bool) -> std::io::Result<()> {
    use nix::unistd::{AccessFlags, faccessat};
    let mut wanted = AccessFlags::R_OK | AccessFlags::X_OK;
    if write {
        wanted |= AccessFlags::W_OK;
    }
    faccessat(dir, ".", wanted, AtFlags::AT_EACCESS).map_err(std::io::Error::from)
}

/// Whether the filesystem of `file` is mounted read-only.
pub(crate) fn read_only(file: &File) -> bool {
    use nix::sys::statvfs::{FsFlags, fstatvfs};
    fstatvfs(file).is_ok_and(|fs| fs.flags().contains(FsFlags::ST_RDONLY))
}

/// The effective user id, which the default directory is named after.
pub(crate) fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// What the backend reads of a file's metadata, under the names Unix
/// gives it.
pub(crate) trait FileMeta {
    /// The device the file is on: with [`ino`](Self::ino), what the file
    /// is, whatever name it has.
    fn dev(&self) -> u64;
    /// The file's inode number.
    fn ino(&self) -> u64;
    /// The permission bits (and the sticky bit).
    fn mode(&self) -> u32;
    /// The owner's user id.
    fn uid(&self) -> u32;
    /// How many names the file has.
    fn nlink(&self) -> u64;
}

impl FileMeta for Metadata {
    fn dev(&self) -> u64 {
        MetadataExt::dev(self)
    }

    fn ino(&self) -> u64 {
        MetadataExt::ino(self)
    }

    fn mode(&self) -> u32 {
        MetadataExt::mode(self)
    }

    fn uid(&self) -> u32 {
        MetadataExt::uid(self)
    }

    fn nlink(&self) -> u64 {
        MetadataExt::nlink(self)
    }
}

/// Writes at an offset, without moving the file's position (`pwrite(2)`).
pub(crate) trait WriteAt {
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()>;
}

impl WriteAt for File {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }
}

/// A builder of directories only their owner may enter (mode 0700, the
/// umask untouched).
pub(crate) fn private_dir() -> DirBuilder {
    let mut builder = DirBuilder::new();
    builder.mode(0o700);
    builder
}
