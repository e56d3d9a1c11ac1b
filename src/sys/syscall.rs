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
use std::fs::{DirBuilder, File, Metadata, TryLockError};
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

/// What tells the file (or directory) at `name` in `dir` from another
/// made there later: its inode number and its birth time, in nanoseconds
/// since the epoch (0 where the platform or the filesystem keeps none).
/// The inode number alone does not: ext4 gives a file made just after
/// another was removed the same number, so a lock that changed hands
/// between two looks would look untouched. Birth times are as coarse as
/// the kernel's clock for files (a few ms on Linux): two files made
/// within one tick apart are told apart by their number alone.
pub(crate) fn instance_at(dir: &File, name: &str) -> Result<(u64, u64), Errno> {
    let (ino, born) = born_at(dir, name)?;
    Ok((ino, born.map_or(0, nanos_since_epoch)))
}

/// Linux keeps birth times only in `statx`, which `std` asks through a
/// descriptor: one that opens nothing (`O_PATH`) and follows no symlink.
#[cfg(target_os = "linux")]
fn born_at(dir: &File, name: &str) -> Result<(u64, Option<SystemTime>), Errno> {
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let file = File::from(openat(dir, name, flags, Mode::empty())?);
    let meta = file
        .metadata()
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(0)))?;
    Ok((meta.ino(), meta.created().ok()))
}

/// macOS and FreeBSD answer with `fstatat`.
#[cfg(any(target_os = "macos", target_os = "freebsd"))]
fn born_at(dir: &File, name: &str) -> Result<(u64, Option<SystemTime>), Errno> {
    let st = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    let secs = u64::try_from(st.st_birthtime).ok();
    let nanos = u32::try_from(st.st_birthtime_nsec).unwrap_or(0);
    #[allow(clippy::useless_conversion)]
    Ok((
        u64::from(st.st_ino),
        secs.map(|s| UNIX_EPOCH + Duration::new(s, nanos)),
    ))
}

/// Elsewhere, the inode number alone.
#[cfg(not(any(target_os = "linux", target_os = "macos", target_os = "freebsd")))]
fn born_at(dir: &File, name: &str) -> Result<(u64, Option<SystemTime>), Errno> {
    Ok((stat_at(dir, name)?.ino, None))
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
    Ok(list_up_to(dir, usize::MAX)?.unwrap_or_default())
}

/// [`list_at`], if `dir` holds at most `most` names; `None`, once
/// `most + 1` were read, if it holds more (the rest are never read: a
/// caller on a runtime's thread reads a large directory no further).
pub(crate) fn list_at_most(dir: &File, most: usize) -> Result<Option<Vec<OsString>>, Errno> {
    list_up_to(dir, most)
}

fn list_up_to(dir: &File, most: usize) -> Result<Option<Vec<OsString>>, Errno> {
    let listing = nix::dir::Dir::openat(dir, ".", Open::List.flags(), Open::List.mode())?;
    let mut names = Vec::new();
    // Owned, so the listing is closed when done, never rewound first (a
    // borrowed iterator rewinds its directory when dropped: an `lseek`
    // per listing for nothing).
    let entries = listing
        .into_iter()
        .filter_map(|entry| entry.ok())
        .map(|entry| OsString::from_vec(entry.file_name().to_bytes().to_vec()))
        .filter(|name| name != "." && name != "..");
    for name in entries {
        if names.len() == most {
            return Ok(None);
        }
        names.push(name);
    }
    Ok(Some(names))
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
/// gives it, read through an open file ([`meta`]) or a path
/// ([`meta_of`], [`symlink_meta_of`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meta {
    dev: u64,
    ino: u64,
    mode: u32,
    uid: u32,
    nlink: u64,
    len: u64,
    kind: Kind,
    modified: Option<SystemTime>,
    /// Birth time, ns since the epoch; 0 where none is kept.
    born: u64,
    /// Inode change time, ns since the epoch.
    changed: u64,
}

impl Meta {
    /// Which file this is, and which version of it (see [`instance_at`]).
    pub(crate) fn instance(&self) -> crate::sys::Instance {
        crate::sys::Instance {
            dev: self.dev,
            ino: self.ino,
            born: self.born,
            changed: self.changed,
        }
    }

    /// The device the file is on: with [`ino`](Self::ino), what the file
    /// is, whatever name it has.
    pub(crate) fn dev(&self) -> u64 {
        self.dev
    }

    /// The file's inode number.
    pub(crate) fn ino(&self) -> u64 {
        self.ino
    }

    /// The permission bits (and the sticky bit).
    pub(crate) fn mode(&self) -> u32 {
        self.mode
    }

    /// The owner's user id.
    pub(crate) fn uid(&self) -> u32 {
        self.uid
    }

    /// How many names the file has.
    pub(crate) fn nlink(&self) -> u64 {
        self.nlink
    }

    /// The file's length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    pub(crate) fn is_file(&self) -> bool {
        self.kind == Kind::File
    }

    pub(crate) fn is_dir(&self) -> bool {
        self.kind == Kind::Dir
    }

    /// The last modification, where the filesystem keeps it.
    pub(crate) fn modified(&self) -> std::io::Result<SystemTime> {
        self.modified
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::Unsupported))
    }
}

impl From<Metadata> for Meta {
    fn from(meta: Metadata) -> Self {
        let kind = if meta.is_file() {
            Kind::File
        } else if meta.is_dir() {
            Kind::Dir
        } else if meta.is_symlink() {
            Kind::Symlink
        } else {
            Kind::Other
        };
        Self {
            dev: MetadataExt::dev(&meta),
            ino: MetadataExt::ino(&meta),
            mode: MetadataExt::mode(&meta),
            uid: MetadataExt::uid(&meta),
            nlink: MetadataExt::nlink(&meta),
            len: meta.len(),
            kind,
            modified: meta.modified().ok(),
            born: meta.created().ok().map_or(0, nanos_since_epoch),
            changed: u64::try_from(MetadataExt::ctime(&meta))
                .unwrap_or(0)
                .saturating_mul(1_000_000_000)
                .saturating_add(u64::try_from(MetadataExt::ctime_nsec(&meta)).unwrap_or(0)),
        }
    }
}

/// `time` in ns since the epoch (0 before it, saturated far after it).
fn nanos_since_epoch(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The metadata of an open file.
pub(crate) fn meta(file: &File) -> std::io::Result<Meta> {
    file.metadata().map(Meta::from)
}

/// The metadata of what `path` names, following symlinks.
pub(crate) fn meta_of(path: &std::path::Path) -> std::io::Result<Meta> {
    std::fs::metadata(path).map(Meta::from)
}

/// The metadata of `path` itself, a symlink not followed.
pub(crate) fn symlink_meta_of(path: &std::path::Path) -> std::io::Result<Meta> {
    std::fs::symlink_metadata(path).map(Meta::from)
}

/// The liveness mark of a lock file: `flock(2)`, which the kernel drops
/// when the holder's last descriptor closes, even at a crash.
pub(crate) trait Flock {
    /// Takes the mark exclusively, without waiting.
    fn try_flock(&self) -> Result<(), TryLockError>;
    /// Takes the mark shared, without waiting.
    fn try_flock_shared(&self) -> Result<(), TryLockError>;
    /// Turns this handle's exclusive mark into a shared one, without
    /// waiting (not atomically: `flock(2)` converts by letting go first).
    fn share_mark(&self) -> Result<(), TryLockError>;
}

impl Flock for File {
    fn try_flock(&self) -> Result<(), TryLockError> {
        self.try_lock()
    }

    fn try_flock_shared(&self) -> Result<(), TryLockError> {
        self.try_lock_shared()
    }

    fn share_mark(&self) -> Result<(), TryLockError> {
        self.try_lock_shared()
    }
}

/// Whether a failed [`Flock`] says the filesystem has no such locks
/// (rather than that something went wrong).
pub(crate) fn flock_unsupported(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::Unsupported || e.raw_os_error() == Some(Errno::ENOLCK as i32)
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

/// The name of a user's default lock directory: `<prefix>-<euid>`, as its
/// root is shared by every user of the host.
pub(crate) fn per_user_name(prefix: &str) -> String {
    format!("{prefix}-{}", euid())
}

/// Why the shared root of the per-user default directories cannot be
/// trusted, if it cannot: it must be a directory of `owner` (root) that,
/// if others may write in it, has the sticky bit (else they could move a
/// user's directory away).
pub(crate) fn root_problem(root: &std::path::Path, owner: u32) -> std::io::Result<Option<&'static str>> {
    let root = meta_of(root)?;
    Ok(if !root.is_dir() {
        Some("its parent is not a directory")
    } else if root.uid() != owner {
        Some("its parent does not belong to root")
    } else if root.mode() & 0o022 != 0 && root.mode() & 0o1000 == 0 {
        Some("its parent is writable by others without the sticky bit")
    } else {
        None
    })
}

/// Who may be the owner of a shared root: root.
pub(crate) const ROOT_OWNER: u32 = 0;

/// Whether the open directory `dir` belongs to this process's effective
/// user.
pub(crate) fn owned_by_me(_dir: &File, meta: &Meta) -> std::io::Result<bool> {
    Ok(meta.uid() == euid())
}

/// Whether other users may enter the directory (any group or other bit
/// of its mode).
pub(crate) fn open_to_others(_dir: &File, meta: &Meta) -> std::io::Result<bool> {
    Ok(meta.mode() & 0o077 != 0)
}

/// Opens the directory at `path`, to hold it and work inside it.
pub(crate) fn open_dir(path: &std::path::Path) -> std::io::Result<File> {
    File::open(path)
}

/// Makes the entries of the directory `dir` durable (`fsync(2)` on it), so
/// that a rename inside it outlives a crash.
pub(crate) fn sync_dir(dir: &File) -> std::io::Result<()> {
    dir.sync_all()
}

/// What `instance_at` makes of whatever may be at a lock path: it never
/// blocks, never follows a symlink at the last component, and reads
/// nothing (a helper's attack on it).
#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn instance_at_looks_at_anything_without_blocking_or_following_it() {
        let root = tempfile::tempdir().unwrap();
        let dir = File::open(root.path()).unwrap();
        let p = |n: &str| root.path().join(n);
        let ino = |n: &str| std::fs::symlink_metadata(p(n)).unwrap().ino();
        let look = |n: &str| {
            let began = std::time::Instant::now();
            let r = instance_at(&dir, n);
            assert!(began.elapsed() < Duration::from_millis(500), "{n}: blocked");
            r
        };
        // A symlink, to a file and dangling: the link itself.
        std::fs::write(p("target"), "{}").unwrap();
        std::os::unix::fs::symlink(p("target"), p("link")).unwrap();
        std::os::unix::fs::symlink(p("nowhere"), p("dangling")).unwrap();
        assert_eq!(look("link").unwrap().0, ino("link"));
        assert_ne!(look("link").unwrap().0, ino("target"));
        assert_eq!(look("dangling").unwrap().0, ino("dangling"));
        // A FIFO nobody writes to: opening it for reading would block.
        nix::unistd::mkfifo(&p("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert_eq!(look("fifo").unwrap().0, ino("fifo"));
        let _sock = std::os::unix::net::UnixListener::bind(p("sock")).unwrap();
        assert_eq!(look("sock").unwrap().0, ino("sock"));
        std::fs::create_dir(p("d")).unwrap();
        assert_eq!(look("d").unwrap().0, ino("d"));
        // Unreadable, and another user's.
        std::fs::write(p("none"), "{}").unwrap();
        std::fs::set_permissions(p("none"), std::fs::Permissions::from_mode(0o0)).unwrap();
        assert_eq!(look("none").unwrap().0, ino("none"));
        std::fs::write(p("nobody"), "{}").unwrap();
        let _ = std::os::unix::fs::chown(p("nobody"), Some(65534), Some(65534));
        std::fs::set_permissions(p("nobody"), std::fs::Permissions::from_mode(0o0)).unwrap();
        assert_eq!(look("nobody").unwrap().0, ino("nobody"));
        // Errors, not panics or hangs.
        assert_eq!(look(&"x".repeat(300)), Err(Errno::ENAMETOOLONG));
        assert_eq!(look("target/x"), Err(Errno::ENOTDIR));
        assert_eq!(look("absent"), Err(Errno::ENOENT));
        // A symlink to a directory as a path component: followed by the
        // kernel only as a component (not the last), like `fstatat`.
        std::os::unix::fs::symlink(p("d"), p("dlink")).unwrap();
        std::fs::write(p("d/inner"), "").unwrap();
        let via = look("dlink/inner");
        let st = stat_at(&dir, "dlink/inner").map(|s| s.ino);
        assert_eq!(via.map(|v| v.0), st);
        // The same file looks the same twice; born is set on ext4/tmpfs.
        let a = look("target").unwrap();
        assert_eq!(look("target").unwrap(), a);
        eprintln!("birth time of target: {}", a.1);
        // No descriptor left open.
        let fds = || std::fs::read_dir("/proc/self/fd").unwrap().count();
        let before = fds();
        for _ in 0..100 {
            let _ = look("fifo");
            let _ = look("absent");
        }
        // (Other tests' descriptors come and go meanwhile: a leak here
        // would be 200.)
        assert!(fds() < before + 100, "descriptors leaked");
    }
}
