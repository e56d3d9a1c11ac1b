//! The filesystem backend's calls, relative to a directory handle, for
//! Windows: the same contract as the Unix family's `sys/syscall.rs`.
//!
//! Windows has no `openat`: a name is reached as the directory handle's
//! current path (`GetFinalPathNameByHandleW`, asked at every call, in the
//! `\\?\` form that has no `MAX_PATH` limit) joined with the name. Every
//! open passes `FILE_FLAG_OPEN_REPARSE_POINT`, so a symbolic link or
//! junction planted at a lock's name is opened itself, never followed, and
//! is refused as `ELOOP`, as `O_NOFOLLOW` refuses it on Unix. Every open
//! shares reading, writing and deleting with other handles, so a reader
//! of a record never stops its holder from replacing or removing it.
//!
//! Failures come back as [`Errno`], the POSIX numbers the backend matches
//! on (`ENOENT`: gone, `EEXIST`: taken, ...), translated from Windows'
//! error codes; an error with no POSIX twin keeps its Windows code and
//! turns back into it when made an [`std::io::Error`].
//!
//! The liveness mark ([`Flock`]) is `LockFileEx` on one byte far past the
//! end of any record: Windows' byte-range locks are mandatory, so a lock
//! over the record itself would stop every reader from reading it.

#![allow(unsafe_code)]

use std::ffi::{OsStr, OsString};
use std::fs::{DirBuilder, File, OpenOptions, TryLockError};
use std::os::windows::ffi::{OsStrExt, OsStringExt};
use std::os::windows::fs::{FileExt, OpenOptionsExt};
use std::os::windows::io::AsRawHandle;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use windows_sys::Win32::Foundation as win;
use windows_sys::Win32::Storage::FileSystem as fs;
use windows_sys::Win32::System::IO::OVERLAPPED;

/// A POSIX error number, as the backend matches on it (see the module
/// docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Errno(i32);

/// Where Windows codes without a POSIX twin start in [`Errno`]'s numbers.
const UNMAPPED: i32 = 1 << 20;

// The table of every number the backend matches on, some of which only
// Unix produces.
#[allow(dead_code)]
impl Errno {
    pub(crate) const EPERM: Errno = Errno(1);
    pub(crate) const ENOENT: Errno = Errno(2);
    pub(crate) const ESRCH: Errno = Errno(3);
    pub(crate) const EINTR: Errno = Errno(4);
    pub(crate) const EIO: Errno = Errno(5);
    pub(crate) const ENXIO: Errno = Errno(6);
    pub(crate) const EBADF: Errno = Errno(9);
    pub(crate) const EAGAIN: Errno = Errno(11);
    pub(crate) const EACCES: Errno = Errno(13);
    pub(crate) const EBUSY: Errno = Errno(16);
    pub(crate) const EEXIST: Errno = Errno(17);
    pub(crate) const EXDEV: Errno = Errno(18);
    pub(crate) const ENOTDIR: Errno = Errno(20);
    pub(crate) const EISDIR: Errno = Errno(21);
    pub(crate) const EINVAL: Errno = Errno(22);
    pub(crate) const EMFILE: Errno = Errno(24);
    pub(crate) const EROFS: Errno = Errno(30);
    pub(crate) const EPIPE: Errno = Errno(32);
    pub(crate) const ENAMETOOLONG: Errno = Errno(36);
    pub(crate) const ENOLCK: Errno = Errno(37);
    pub(crate) const ENOSYS: Errno = Errno(38);
    pub(crate) const ENOTEMPTY: Errno = Errno(39);
    pub(crate) const ELOOP: Errno = Errno(40);
    pub(crate) const ENOTSUP: Errno = Errno(95);
    pub(crate) const EOPNOTSUPP: Errno = Errno(95);

    /// The POSIX twin of a Windows error code.
    fn from_windows(code: u32) -> Errno {
        match code {
            win::ERROR_FILE_NOT_FOUND | win::ERROR_PATH_NOT_FOUND | win::ERROR_BAD_NETPATH => Errno::ENOENT,
            win::ERROR_ACCESS_DENIED => Errno::EACCES,
            win::ERROR_SHARING_VIOLATION => Errno::EBUSY,
            win::ERROR_LOCK_VIOLATION => Errno::EAGAIN,
            win::ERROR_FILE_EXISTS | win::ERROR_ALREADY_EXISTS => Errno::EEXIST,
            win::ERROR_DIR_NOT_EMPTY => Errno::ENOTEMPTY,
            win::ERROR_DIRECTORY => Errno::ENOTDIR,
            win::ERROR_NOT_SAME_DEVICE => Errno::EXDEV,
            win::ERROR_WRITE_PROTECT => Errno::EROFS,
            win::ERROR_TOO_MANY_OPEN_FILES => Errno::EMFILE,
            win::ERROR_NOT_SUPPORTED | win::ERROR_INVALID_FUNCTION => Errno::ENOTSUP,
            win::ERROR_CANT_ACCESS_FILE | win::ERROR_CANT_RESOLVE_FILENAME => Errno::ELOOP,
            win::ERROR_FILENAME_EXCED_RANGE => Errno::ENAMETOOLONG,
            win::ERROR_INVALID_PARAMETER | win::ERROR_INVALID_NAME => Errno::EINVAL,
            win::ERROR_INVALID_HANDLE => Errno::EBADF,
            win::ERROR_BROKEN_PIPE => Errno::EPIPE,
            other => Errno(UNMAPPED.saturating_add(i32::try_from(other).unwrap_or(0))),
        }
    }

    /// The Windows code an error of this number stands for.
    fn to_windows(self) -> u32 {
        match self {
            Errno::ENOENT => win::ERROR_FILE_NOT_FOUND,
            Errno::EACCES | Errno::EPERM => win::ERROR_ACCESS_DENIED,
            Errno::EBUSY => win::ERROR_SHARING_VIOLATION,
            Errno::EAGAIN => win::ERROR_LOCK_VIOLATION,
            Errno::EEXIST => win::ERROR_FILE_EXISTS,
            Errno::ENOTEMPTY => win::ERROR_DIR_NOT_EMPTY,
            Errno::ENOTDIR => win::ERROR_DIRECTORY,
            Errno::EXDEV => win::ERROR_NOT_SAME_DEVICE,
            Errno::EROFS => win::ERROR_WRITE_PROTECT,
            Errno::EMFILE => win::ERROR_TOO_MANY_OPEN_FILES,
            Errno::ENOTSUP | Errno::ENOSYS => win::ERROR_NOT_SUPPORTED,
            Errno::ELOOP => win::ERROR_CANT_RESOLVE_FILENAME,
            Errno::ENAMETOOLONG => win::ERROR_FILENAME_EXCED_RANGE,
            Errno::EINVAL => win::ERROR_INVALID_PARAMETER,
            Errno::EBADF => win::ERROR_INVALID_HANDLE,
            Errno::EPIPE => win::ERROR_BROKEN_PIPE,
            Errno(n) if n >= UNMAPPED => u32::try_from(n - UNMAPPED).unwrap_or(win::ERROR_GEN_FAILURE),
            _ => win::ERROR_GEN_FAILURE,
        }
    }

    /// The number of an I/O error.
    pub(crate) fn of(e: &std::io::Error) -> Errno {
        match e.raw_os_error().and_then(|code| u32::try_from(code).ok()) {
            Some(code) => Errno::from_windows(code),
            None => match e.kind() {
                std::io::ErrorKind::NotFound => Errno::ENOENT,
                std::io::ErrorKind::AlreadyExists => Errno::EEXIST,
                std::io::ErrorKind::PermissionDenied => Errno::EACCES,
                std::io::ErrorKind::InvalidInput => Errno::EINVAL,
                std::io::ErrorKind::Unsupported => Errno::ENOTSUP,
                _ => Errno::EIO,
            },
        }
    }

    /// The last Windows error of this thread.
    fn last() -> Errno {
        Errno::of(&std::io::Error::last_os_error())
    }
}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> Self {
        std::io::Error::from_raw_os_error(i32::try_from(e.to_windows()).unwrap_or(i32::MAX))
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::io::Error::from(*self).fmt(f)
    }
}

impl std::error::Error for Errno {}

/// What a file is opened for; each names one set of flags (see the Unix
/// twin for what each is for). None follows a reparse point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Open {
    CreateNew,
    Replace,
    Write,
    Read,
    Dir,
    Mutex,
    List,
}

/// Every handle shares everything: see the module docs.
const SHARE_ALL: u32 = fs::FILE_SHARE_READ | fs::FILE_SHARE_WRITE | fs::FILE_SHARE_DELETE;

/// The current path of the directory behind `dir`, as `\\?\C:\...`.
pub(crate) fn path_of(dir: &File) -> Result<PathBuf, Errno> {
    let handle = dir.as_raw_handle();
    let mut buf = vec![0u16; 512];
    loop {
        let capacity = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        // SAFETY: `handle` is an open handle owned by `dir`, which outlives
        // the call; `buf` is writable for `capacity` UTF-16 units.
        let len = unsafe {
            fs::GetFinalPathNameByHandleW(handle, buf.as_mut_ptr(), capacity, fs::FILE_NAME_NORMALIZED)
        };
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len == 0 {
            return Err(Errno::last());
        }
        if len < buf.len() {
            buf.truncate(len);
            return Ok(PathBuf::from(OsString::from_wide(&buf)));
        }
        // Too small: `len` is the size needed, with the final NUL.
        buf.resize(len.saturating_add(1), 0);
    }
}

/// The path of `name` in `dir`; `name` must be one plain component.
fn child(dir: &File, name: &OsStr) -> Result<PathBuf, Errno> {
    let wide: Vec<u16> = name.encode_wide().collect();
    let separator = |c: &u16| *c == u16::from(b'\\') || *c == u16::from(b'/');
    if wide.is_empty() || wide.iter().any(separator) || name == "." || name == ".." {
        return Err(Errno::EINVAL);
    }
    Ok(path_of(dir)?.join(name))
}

/// Opens `name` in `dir` for `how`.
pub(crate) fn open_at<P: ?Sized + AsRef<OsStr>>(dir: &File, name: &P, how: Open) -> Result<File, Errno> {
    if how == Open::List && name.as_ref() == "." {
        return open_path(&path_of(dir)?, how);
    }
    open_path(&child(dir, name.as_ref())?, how)
}

/// Opens `path` for `how`: see [`open_at`].
fn open_path(path: &Path, how: Open) -> Result<File, Errno> {
    let mut options = OpenOptions::new();
    options.share_mode(SHARE_ALL);
    let mut flags = fs::FILE_FLAG_OPEN_REPARSE_POINT;
    match how {
        Open::CreateNew => {
            options.write(true).create_new(true);
        }
        Open::Replace => {
            options.write(true).create(true).truncate(true);
        }
        Open::Write => {
            options.write(true);
        }
        Open::Read => {
            options.read(true);
        }
        Open::Mutex => {
            options.read(true).write(true).create(true);
        }
        Open::Dir | Open::List => {
            options.read(true);
            flags |= fs::FILE_FLAG_BACKUP_SEMANTICS;
        }
    }
    options.custom_flags(flags);
    let made = match how {
        // Made with an access list of the user, the system and the
        // administrators alone (see `security::private`), as Unix makes them
        // mode 0600.
        Open::CreateNew => create_private(path, fs::FILE_GENERIC_WRITE, fs::CREATE_NEW, flags),
        Open::Replace => create_private(path, fs::FILE_GENERIC_WRITE, fs::CREATE_ALWAYS, flags),
        Open::Mutex => create_private(
            path,
            fs::FILE_GENERIC_READ | fs::FILE_GENERIC_WRITE,
            fs::OPEN_ALWAYS,
            flags,
        ),
        Open::Write | Open::Read | Open::Dir | Open::List => options.open(path),
    };
    let file = match made {
        Ok(file) => file,
        // Windows opens a directory (or a directory junction) only with
        // backup semantics: without them the open fails with
        // ERROR_ACCESS_DENIED, which must read as "not a file here", as
        // Unix's EISDIR and ELOOP do, and not as a lack of permission.
        Err(e) if Errno::of(&e) == Errno::EACCES && !matches!(how, Open::Dir | Open::List) => {
            return Err(not_a_file(path).unwrap_or(Errno::EACCES));
        }
        Err(e) => return Err(Errno::of(&e)),
    };
    let info = information(&file)?;
    let is_dir = info.dwFileAttributes & fs::FILE_ATTRIBUTE_DIRECTORY != 0;
    if info.dwFileAttributes & fs::FILE_ATTRIBUTE_REPARSE_POINT != 0 {
        return Err(Errno::ELOOP);
    }
    match how {
        Open::Dir | Open::List if !is_dir => Err(Errno::ENOTDIR),
        Open::Dir | Open::List => Ok(file),
        _ if is_dir => Err(Errno::EISDIR),
        _ => Ok(file),
    }
}

/// `ELOOP` if `path` is a reparse point, `EISDIR` if a directory, looked
/// at through a handle with no access (which no share mode refuses).
fn not_a_file(path: &Path) -> Option<Errno> {
    let file = OpenOptions::new()
        .access_mode(0)
        .share_mode(SHARE_ALL)
        .custom_flags(fs::FILE_FLAG_OPEN_REPARSE_POINT | fs::FILE_FLAG_BACKUP_SEMANTICS)
        .open(path)
        .ok()?;
    let attributes = information(&file).ok()?.dwFileAttributes;
    if attributes & fs::FILE_ATTRIBUTE_REPARSE_POINT != 0 {
        Some(Errno::ELOOP)
    } else if attributes & fs::FILE_ATTRIBUTE_DIRECTORY != 0 {
        Some(Errno::EISDIR)
    } else {
        None
    }
}

/// `CreateFileW` of `path` for `access`, shared as every open is, with
/// `disposition` and `flags`, giving a file it makes the private access
/// list (where one could be made; else the one its directory passes on).
fn create_private(path: &Path, access: u32, disposition: u32, flags: u32) -> std::io::Result<File> {
    use std::os::windows::io::FromRawHandle;
    let name = wide(path);
    let private = super::security::private();
    let attributes = private.map(|descriptor| windows_sys::Win32::Security::SECURITY_ATTRIBUTES {
        nLength: u32::try_from(std::mem::size_of::<
            windows_sys::Win32::Security::SECURITY_ATTRIBUTES,
        >())
        .unwrap_or(0),
        lpSecurityDescriptor: descriptor,
        bInheritHandle: 0,
    });
    let attributes_ptr = attributes.as_ref().map_or(std::ptr::null(), std::ptr::from_ref);
    // SAFETY: `name` is a NUL-terminated UTF-16 path living across the
    // call; `attributes_ptr` is null or points at a SECURITY_ATTRIBUTES on
    // this stack frame whose descriptor lives for the process.
    let handle = unsafe {
        fs::CreateFileW(
            name.as_ptr(),
            access,
            SHARE_ALL,
            attributes_ptr,
            disposition,
            fs::FILE_ATTRIBUTE_NORMAL | flags,
            std::ptr::null_mut(),
        )
    };
    if handle == win::INVALID_HANDLE_VALUE {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a handle just opened, owned by nothing else.
    let file = unsafe { File::from_raw_handle(handle) };
    if disposition == fs::CREATE_ALWAYS {
        // CREATE_ALWAYS keeps an existing file's attributes but not its
        // length: as `O_TRUNC`.
        file.set_len(0)?;
    }
    Ok(file)
}

/// `GetFileInformationByHandle` of an open file.
/// Whether the file or directory behind `file` was deleted and waits for
/// its last handle to close (`FILE_STANDARD_INFO::DeletePending`).
fn delete_pending(file: &File) -> bool {
    // SAFETY: an all-zero FILE_STANDARD_INFO is valid.
    let mut info: fs::FILE_STANDARD_INFO = unsafe { std::mem::zeroed() };
    // SAFETY: the handle is open while `file` lives; the buffer is a
    // writable FILE_STANDARD_INFO of the size passed.
    let ok = unsafe {
        fs::GetFileInformationByHandleEx(
            file.as_raw_handle(),
            fs::FileStandardInfo,
            std::ptr::from_mut(&mut info).cast(),
            u32::try_from(std::mem::size_of::<fs::FILE_STANDARD_INFO>()).unwrap_or(0),
        ) != 0
    };
    ok && info.DeletePending
}

fn information(file: &File) -> Result<fs::BY_HANDLE_FILE_INFORMATION, Errno> {
    // SAFETY: an all-zero BY_HANDLE_FILE_INFORMATION is a valid value (it
    // holds only integers).
    let mut info: fs::BY_HANDLE_FILE_INFORMATION = unsafe { std::mem::zeroed() };
    // SAFETY: the handle is open for as long as `file` lives, and `info`
    // is a writable structure of the type the call fills.
    if unsafe { fs::GetFileInformationByHandle(file.as_raw_handle(), &mut info) } == 0 {
        return Err(Errno::last());
    }
    Ok(info)
}

/// What kind of file a path names. (The kinds Unix has and Windows not
/// are kept, for the messages the backend shares.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)]
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
            Kind::Symlink => "symbolic link or junction",
            Kind::Fifo => "FIFO",
            Kind::Socket => "socket",
            Kind::Device => "device",
            Kind::Other => "special file",
        }
    }
}

/// What a look at a path says, without following a reparse point.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stat {
    /// Always 0 (see [`Meta`]).
    pub(crate) dev: u64,
    /// The file's index on its volume.
    pub(crate) ino: u64,
    pub(crate) kind: Kind,
    /// The modification time, to the second.
    pub(crate) mtime: SystemTime,
}

/// Looks at `name` in `dir` without following a reparse point. (Windows
/// has no `fstatat`: the name is opened for no access at all, which no
/// share mode refuses, and asked.)
pub(crate) fn stat_at(dir: &File, name: &str) -> Result<Stat, Errno> {
    let meta = meta_at(dir, name)?;
    let mtime = meta.modified.unwrap_or(UNIX_EPOCH);
    let seconds = mtime.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    Ok(Stat {
        dev: meta.dev,
        ino: meta.ino,
        kind: meta.kind,
        mtime: UNIX_EPOCH + Duration::from_secs(seconds),
    })
}

/// What tells the file (or directory) at `name` in `dir` from another
/// made there later: its file index and its creation time, in 100 ns
/// units since 1601 (see `sys/syscall.rs` on Unix). NTFS's index already
/// changes when a record is used again (its sequence number), but Wine's
/// is the inode number of the filesystem below, which ext4 gives again.
pub(crate) fn instance_at(dir: &File, name: &str) -> Result<(u64, u64), Errno> {
    let meta = meta_at(dir, name)?;
    Ok((meta.ino, meta.born))
}

/// The metadata of `name` in `dir`, a reparse point not followed: opened
/// for no access at all, which no share mode refuses.
fn meta_at(dir: &File, name: &str) -> Result<Meta, Errno> {
    let path = child(dir, OsStr::new(name))?;
    let file = OpenOptions::new()
        .access_mode(0)
        .share_mode(SHARE_ALL)
        .custom_flags(fs::FILE_FLAG_OPEN_REPARSE_POINT | fs::FILE_FLAG_BACKUP_SEMANTICS)
        .open(path)
        .map_err(|e| Errno::of(&e))?;
    meta(&file).map_err(|e| Errno::of(&e))
}

/// Removes the file (not a directory) `name` in `dir`.
///
/// Windows keeps the name of a deleted file until every handle of it is
/// closed (unless the filesystem deletes with POSIX semantics), and
/// refuses to make a new file of that name meanwhile: a reader that has
/// the record open at the moment of a release would keep the lock's name
/// taken. So the file is first renamed aside, to `<name>.pending-<12 hex>`
/// (the shape of a half-made lock file, which the sweep removes once its
/// mark is free), and deleted there; the lock's name is free at once.
pub(crate) fn unlink_at<P: ?Sized + AsRef<OsStr>>(dir: &File, name: &P) -> Result<(), Errno> {
    let path = child(dir, name.as_ref())?;
    // Opened for deletion, the name itself (a reparse point is not
    // followed): the rename and the deletion below act on this very file,
    // whatever comes to bear its name meanwhile.
    let file = OpenOptions::new()
        .access_mode(fs::DELETE | fs::FILE_READ_ATTRIBUTES)
        .share_mode(SHARE_ALL)
        .custom_flags(fs::FILE_FLAG_OPEN_REPARSE_POINT | fs::FILE_FLAG_BACKUP_SEMANTICS)
        .open(&path)
        .map_err(|e| Errno::of(&e))?;
    let info = information(&file)?;
    if info.dwFileAttributes & fs::FILE_ATTRIBUTE_DIRECTORY != 0 {
        return Err(Errno::EISDIR);
    }
    let mut aside = name.as_ref().to_owned();
    let id = uuid::Uuid::new_v4().simple().to_string();
    aside.push(format!(".pending-{}", &id[..12]));
    // Renaming fails only when someone holds the file open without sharing
    // deletion (no leasehold process does); then it is deleted in place,
    // when they close it.
    let renamed = rename_handle(&file, &child(dir, &aside)?).is_ok();
    if dispose(&file) {
        return Ok(());
    }
    let error = Errno::last();
    // Windows refuses to delete a read-only file (`ERROR_ACCESS_DENIED`),
    // where Unix lets a file's mode guard nothing of its name: the
    // attribute is cleared and the deletion tried again, as Node.js's
    // unlink (velocious's, pi-research's) does. Without this a dead
    // holder's read-only record could never be reclaimed, and, renamed
    // aside already, would stay there for good.
    if info.dwFileAttributes & fs::FILE_ATTRIBUTE_READONLY != 0
        && clear_read_only(
            &child(dir, if renamed { aside.as_os_str() } else { name.as_ref() })?,
            &info,
        )
        && dispose(&file)
    {
        return Ok(());
    }
    Err(error)
}

/// Marks the file behind `file` (open with DELETE access) for deletion
/// when its last handle closes; whether it is.
fn dispose(file: &File) -> bool {
    let disposition = fs::FILE_DISPOSITION_INFO { DeleteFile: true };
    // SAFETY: the handle is open with DELETE access while `file` lives;
    // the buffer is a FILE_DISPOSITION_INFO of the size passed.
    unsafe {
        fs::SetFileInformationByHandle(
            file.as_raw_handle(),
            fs::FileDispositionInfo,
            std::ptr::from_ref(&disposition).cast(),
            u32::try_from(std::mem::size_of::<fs::FILE_DISPOSITION_INFO>()).unwrap_or(0),
        ) != 0
    }
}

/// Clears the read-only attribute of the file at `path`, if it is still
/// the file `was` describes (the same file index); whether it did.
fn clear_read_only(path: &Path, was: &fs::BY_HANDLE_FILE_INFORMATION) -> bool {
    let Ok(file) = OpenOptions::new()
        .access_mode(fs::FILE_READ_ATTRIBUTES | fs::FILE_WRITE_ATTRIBUTES)
        .share_mode(SHARE_ALL)
        .custom_flags(fs::FILE_FLAG_OPEN_REPARSE_POINT | fs::FILE_FLAG_BACKUP_SEMANTICS)
        .open(path)
    else {
        return false;
    };
    // Only the file index: Wine reports volume serial 0 through a handle
    // of a file renamed since (.ci/wine/FINDINGS.md).
    match information(&file) {
        Ok(now) if (now.nFileIndexHigh, now.nFileIndexLow) == (was.nFileIndexHigh, was.nFileIndexLow) => {}
        _ => return false,
    }
    let attributes = was.dwFileAttributes & !fs::FILE_ATTRIBUTE_READONLY;
    // Zero times leave the file's times as they are.
    let basic = fs::FILE_BASIC_INFO {
        CreationTime: 0,
        LastAccessTime: 0,
        LastWriteTime: 0,
        ChangeTime: 0,
        FileAttributes: if attributes == 0 {
            fs::FILE_ATTRIBUTE_NORMAL
        } else {
            attributes
        },
    };
    // SAFETY: the handle is open with FILE_WRITE_ATTRIBUTES while `file`
    // lives; the buffer is a FILE_BASIC_INFO of the size passed.
    unsafe {
        fs::SetFileInformationByHandle(
            file.as_raw_handle(),
            fs::FileBasicInfo,
            std::ptr::from_ref(&basic).cast(),
            u32::try_from(std::mem::size_of::<fs::FILE_BASIC_INFO>()).unwrap_or(0),
        ) != 0
    }
}

/// Renames the file behind `file` to `to` (a full path), never replacing
/// what is there (`SetFileInformationByHandle(FileRenameInfo)`).
fn rename_handle(file: &File, to: &Path) -> Result<(), Errno> {
    let name: Vec<u16> = to.as_os_str().encode_wide().collect();
    let header = std::mem::offset_of!(fs::FILE_RENAME_INFO, FileName);
    let name_bytes = name.len() * 2;
    // The structure, then the name in place of its one-unit `FileName`
    // (and a NUL), in u64s so that the buffer is aligned for it.
    let mut buf = vec![0u64; (header + name_bytes + 2).div_ceil(8) + 1];
    let info = buf.as_mut_ptr().cast::<fs::FILE_RENAME_INFO>();
    // SAFETY: `buf` is zeroed, aligned to 8 and large enough for the
    // header and the name; the fields are written through the raw pointer,
    // and the name copied to where `FileName` begins.
    unsafe {
        (*info).Anonymous.ReplaceIfExists = false;
        (*info).RootDirectory = std::ptr::null_mut();
        (*info).FileNameLength = u32::try_from(name_bytes).map_err(|_| Errno::ENAMETOOLONG)?;
        std::ptr::copy_nonoverlapping(
            name.as_ptr(),
            std::ptr::addr_of_mut!((*info).FileName).cast::<u16>(),
            name.len(),
        );
    }
    let size = u32::try_from(buf.len() * 8).map_err(|_| Errno::ENAMETOOLONG)?;
    // SAFETY: the handle is open with DELETE access while `file` lives;
    // `info` points at a FILE_RENAME_INFO of `size` bytes.
    if unsafe { fs::SetFileInformationByHandle(file.as_raw_handle(), fs::FileRenameInfo, info.cast(), size) }
        == 0
    {
        return Err(Errno::last());
    }
    Ok(())
}

/// Makes `to` a second name of the file `from`, both in `dir`; fails with
/// `EEXIST` if `to` exists (`CreateHardLinkW`).
pub(crate) fn link_at(dir: &File, from: &str, to: &str) -> Result<(), Errno> {
    let base = path_of(dir)?;
    std::fs::hard_link(base.join(checked(from)?), base.join(checked(to)?)).map_err(|e| Errno::of(&e))
}

/// `name`, if it is one plain component.
fn checked(name: &str) -> Result<&str, Errno> {
    if name.is_empty() || name.contains(['\\', '/']) || name == "." || name == ".." {
        return Err(Errno::EINVAL);
    }
    Ok(name)
}

/// Removes the empty directory `name` in `dir`.
pub(crate) fn rmdir_at(dir: &File, name: &str) -> Result<(), Errno> {
    std::fs::remove_dir(child(dir, OsStr::new(name))?).map_err(|e| Errno::of(&e))
}

/// Renames `from` to `to`, both in `dir`, replacing what `to` names.
pub(crate) fn rename_at(dir: &File, from: &str, to: &str) -> Result<(), Errno> {
    rename_between(dir, from, dir, to)
}

/// Renames `from` in `from_dir` to `to` in `to_dir` (one volume),
/// replacing it (`MoveFileExW` with `MOVEFILE_REPLACE_EXISTING`).
pub(crate) fn rename_between(from_dir: &File, from: &str, to_dir: &File, to: &str) -> Result<(), Errno> {
    let from = child(from_dir, OsStr::new(from))?;
    let to = child(to_dir, OsStr::new(to))?;
    move_file(&from, &to, fs::MOVEFILE_REPLACE_EXISTING)
}

/// `MoveFileExW(from, to, flags)`.
pub(crate) fn move_file(from: &Path, to: &Path, flags: u32) -> Result<(), Errno> {
    let from = wide(from);
    let to = wide(to);
    // SAFETY: both are NUL-terminated UTF-16 strings that live across the
    // call.
    if unsafe { fs::MoveFileExW(from.as_ptr(), to.as_ptr(), flags) } == 0 {
        return Err(Errno::last());
    }
    Ok(())
}

/// `path` as a NUL-terminated UTF-16 string.
pub(crate) fn wide(path: &Path) -> Vec<u16> {
    path.as_os_str().encode_wide().chain(std::iter::once(0)).collect()
}

/// Creates the directory `name` in `dir`, with the private access list of
/// the files leasehold makes (see `security::private`).
pub(crate) fn mkdir_at(dir: &File, name: &str) -> Result<(), Errno> {
    let path = wide(&child(dir, OsStr::new(name))?);
    let attributes =
        super::security::private().map(|descriptor| windows_sys::Win32::Security::SECURITY_ATTRIBUTES {
            nLength: u32::try_from(std::mem::size_of::<
                windows_sys::Win32::Security::SECURITY_ATTRIBUTES,
            >())
            .unwrap_or(0),
            lpSecurityDescriptor: descriptor,
            bInheritHandle: 0,
        });
    let attributes_ptr = attributes.as_ref().map_or(std::ptr::null(), std::ptr::from_ref);
    // SAFETY: `path` is a NUL-terminated UTF-16 path living across the
    // call; `attributes_ptr` is null or a SECURITY_ATTRIBUTES on this frame.
    if unsafe { fs::CreateDirectoryW(path.as_ptr(), attributes_ptr) } == 0 {
        return Err(Errno::last());
    }
    Ok(())
}

/// The names in the directory `dir`, in no particular order, read through
/// a handle of the very directory `dir` is (see `list_handle`), as Unix
/// reads an open directory: never by its path. A listing by path
/// (`FindFirstFileExW`) opens the directory anew, and that open can be
/// refused while the directory is whole and readable: Wine's does not
/// share deletion, so it fails with `ERROR_SHARING_VIOLATION` (32) for as
/// long as any process has the directory open with `DELETE` access (as
/// `RemoveDirectoryW` does while a group's end or a `clean` removes it
/// beside us): "cannot list members directory", which the crash-point
/// suite under Wine answered in about two runs of five. Windows also
/// refuses to open a directory that is delete pending
/// (`ERROR_ACCESS_DENIED`). Our handle reads what is in the directory
/// even while another process removes it: nothing (Windows removes only
/// an empty directory; Wine does not report the pending state, and reads
/// it empty as well). Only a directory that is provably delete pending is
/// taken for empty when even that read fails; any other failure is the
/// caller's, never an empty listing.
pub(crate) fn list_at(dir: &File) -> Result<Vec<OsString>, Errno> {
    Ok(list_at_most(dir, usize::MAX)?.unwrap_or_default())
}

/// [`list_at`], if `dir` holds at most `most` names; `None`, once
/// `most + 1` were read, if it holds more (the rest are never asked for:
/// a caller on a runtime's thread reads a large directory no further).
pub(crate) fn list_at_most(dir: &File, most: usize) -> Result<Option<Vec<OsString>>, Errno> {
    match list_handle(dir, most) {
        Ok(names) => Ok(names),
        Err(_) if delete_pending(dir) => Ok(Some(Vec::new())),
        Err(e) => Err(e),
    }
}

/// The names in the directory behind the handle `dir`, without "." and
/// "..": read through a handle of its own (`ReOpenFile` of `dir`, which
/// names the very directory `dir` is, as Unix's `openat(dir, ".")`), with
/// `GetFileInformationByHandleEx`, `FileIdBothDirectoryRestartInfo` then
/// `FileIdBothDirectoryInfo` until `ERROR_NO_MORE_FILES`. A handle of its
/// own because the enumeration is the file object's: every duplicate of
/// `dir` (`try_clone`) shares it, and Wine reads a directory once per
/// file object (a restarted enumeration replays that first read). A reply
/// that does not parse is an error (`EIO`), never a shorter listing.
fn list_handle(dir: &File, most: usize) -> Result<Option<Vec<OsString>>, Errno> {
    use std::os::windows::io::FromRawHandle;
    // SAFETY: the handle is open while `dir` lives.
    let handle = unsafe {
        fs::ReOpenFile(
            dir.as_raw_handle(),
            fs::FILE_LIST_DIRECTORY | fs::SYNCHRONIZE,
            SHARE_ALL,
            fs::FILE_FLAG_BACKUP_SEMANTICS,
        )
    };
    if handle == win::INVALID_HANDLE_VALUE {
        return Err(Errno::last());
    }
    // SAFETY: a handle just opened, owned by nothing else.
    let listing = unsafe { File::from_raw_handle(handle) };
    // 8-aligned, as the entries are: 64 KiB a call.
    let mut buf = vec![0u64; 8 * 1024];
    let size = u32::try_from(buf.len() * 8).unwrap_or(u32::MAX);
    let mut class = fs::FileIdBothDirectoryRestartInfo;
    let mut names = Vec::new();
    loop {
        // SAFETY: the handle is open while `listing` lives; `buf` is
        // writable for `size` bytes.
        let ok = unsafe {
            fs::GetFileInformationByHandleEx(listing.as_raw_handle(), class, buf.as_mut_ptr().cast(), size)
        };
        if ok == 0 {
            let error = std::io::Error::last_os_error();
            let code = error.raw_os_error().and_then(|c| u32::try_from(c).ok());
            // No more entries; or, on the first call, none at all
            // (`STATUS_NO_SUCH_FILE`: nothing matched, and we ask for
            // every name).
            let first = class == fs::FileIdBothDirectoryRestartInfo;
            if code == Some(win::ERROR_NO_MORE_FILES) || (first && code == Some(win::ERROR_FILE_NOT_FOUND)) {
                return Ok(Some(names));
            }
            return Err(Errno::of(&error));
        }
        class = fs::FileIdBothDirectoryInfo;
        let bytes: Vec<u8> = buf.iter().flat_map(|word| word.to_ne_bytes()).collect();
        let mut at = 0usize;
        loop {
            let u32_at = |offset: usize| -> Option<usize> {
                let b = bytes.get(at.checked_add(offset)?..at.checked_add(offset)?.checked_add(4)?)?;
                usize::try_from(u32::from_ne_bytes([b[0], b[1], b[2], b[3]])).ok()
            };
            let next = u32_at(std::mem::offset_of!(fs::FILE_ID_BOTH_DIR_INFO, NextEntryOffset));
            let len = u32_at(std::mem::offset_of!(fs::FILE_ID_BOTH_DIR_INFO, FileNameLength));
            let start = at.checked_add(std::mem::offset_of!(fs::FILE_ID_BOTH_DIR_INFO, FileName));
            let name = match (next, len, start) {
                (Some(next), Some(len), Some(start)) if len % 2 == 0 => start
                    .checked_add(len)
                    .and_then(|end| bytes.get(start..end))
                    .map(|name| (next, name)),
                _ => None,
            };
            let Some((next, name)) = name else {
                return Err(Errno::EIO);
            };
            let wide: Vec<u16> = name
                .chunks_exact(2)
                .map(|c| u16::from_ne_bytes([c[0], c[1]]))
                .collect();
            let name = OsString::from_wide(&wide);
            if name != "." && name != ".." {
                if names.len() == most {
                    return Ok(None);
                }
                names.push(name);
            }
            if next == 0 {
                break;
            }
            at = at.checked_add(next).ok_or(Errno::EIO)?;
        }
    }
}

/// Reads a file through a handle, from its start, up to just past `limit`
/// bytes.
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
        match file.seek_read(&mut buf[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => len += n,
            // Reading at or past the end of a file is "end of file" here.
            Err(e) if e.raw_os_error() == i32::try_from(win::ERROR_HANDLE_EOF).ok() => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    Ok(buf)
}

/// Whether this process may use the directory `dir`: on Windows, whose
/// access control lists are judged at each access, only whether it is on
/// a read-only volume when `write` is asked; a refused access shows at
/// the first create, with Windows' own reason.
pub(crate) fn usable_dir(dir: &File, write: bool) -> std::io::Result<()> {
    if write && read_only(dir) {
        return Err(Errno::EROFS.into());
    }
    Ok(())
}

/// Whether the volume of `file` is read-only.
pub(crate) fn read_only(file: &File) -> bool {
    let mut flags = 0u32;
    // SAFETY: the handle is open for as long as `file` lives; the name and
    // file-system-name buffers are absent (null, length 0), which the call
    // allows; the other out-parameters are null or a writable u32.
    let ok = unsafe {
        fs::GetVolumeInformationByHandleW(
            file.as_raw_handle(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut flags,
            std::ptr::null_mut(),
            0,
        )
    };
    /// `FILE_READ_ONLY_VOLUME` (winnt.h).
    const READ_ONLY_VOLUME: u32 = 0x0008_0000;
    ok != 0 && flags & READ_ONLY_VOLUME != 0
}

/// What the backend reads of a file's metadata (see the Unix twin). On
/// Windows the device is always 0 and the inode the file's index on its
/// volume (files are compared within one lock directory); the mode is made up from the attributes (0o700 for
/// a directory, 0o600 for a file, the write bits off when read-only) and
/// the owner is not read here ([`super::owner_is_me`] is).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meta {
    dev: u64,
    ino: u64,
    mode: u32,
    nlink: u64,
    len: u64,
    kind: Kind,
    modified: Option<SystemTime>,
    /// Creation time, in 100 ns units since 1601.
    born: u64,
    /// Last write time, in the same units.
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

    pub(crate) fn dev(&self) -> u64 {
        self.dev
    }

    pub(crate) fn ino(&self) -> u64 {
        self.ino
    }

    pub(crate) fn mode(&self) -> u32 {
        self.mode
    }

    pub(crate) fn nlink(&self) -> u64 {
        self.nlink
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    pub(crate) fn is_file(&self) -> bool {
        self.kind == Kind::File
    }

    pub(crate) fn is_dir(&self) -> bool {
        self.kind == Kind::Dir
    }

    pub(crate) fn modified(&self) -> std::io::Result<SystemTime> {
        self.modified
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::Unsupported))
    }
}

/// A FILETIME (100 ns since 1601) as a `SystemTime`.
pub(crate) fn system_time(high: u32, low: u32) -> Option<SystemTime> {
    /// 1601-01-01 to 1970-01-01, in 100 ns.
    const EPOCH_GAP: u64 = 116_444_736_000_000_000;
    let ticks = (u64::from(high) << 32) | u64::from(low);
    let since_epoch = ticks.checked_sub(EPOCH_GAP)?;
    Some(UNIX_EPOCH + Duration::from_nanos(since_epoch.saturating_mul(100)))
}

/// The metadata of an open file.
pub(crate) fn meta(file: &File) -> std::io::Result<Meta> {
    let info = information(file)?;
    let attributes = info.dwFileAttributes;
    let kind = if attributes & fs::FILE_ATTRIBUTE_REPARSE_POINT != 0 {
        Kind::Symlink
    } else if attributes & fs::FILE_ATTRIBUTE_DIRECTORY != 0 {
        Kind::Dir
    } else {
        Kind::File
    };
    let mut mode = if kind == Kind::Dir { 0o700 } else { 0o600 };
    if attributes & fs::FILE_ATTRIBUTE_READONLY != 0 {
        mode &= !0o200;
    }
    Ok(Meta {
        // Files are only ever compared within one lock directory, on one
        // volume: the index alone names a file there. (The volume's serial
        // would be redundant, and Wine reads it as 0 through a handle whose
        // file was renamed by path since, which would make such a file
        // look replaced.)
        dev: 0,
        ino: file_id(file).unwrap_or((u64::from(info.nFileIndexHigh) << 32) | u64::from(info.nFileIndexLow)),
        mode,
        nlink: u64::from(info.nNumberOfLinks),
        len: (u64::from(info.nFileSizeHigh) << 32) | u64::from(info.nFileSizeLow),
        kind,
        modified: system_time(
            info.ftLastWriteTime.dwHighDateTime,
            info.ftLastWriteTime.dwLowDateTime,
        ),
        born: (u64::from(info.ftCreationTime.dwHighDateTime) << 32)
            | u64::from(info.ftCreationTime.dwLowDateTime),
        changed: (u64::from(info.ftLastWriteTime.dwHighDateTime) << 32)
            | u64::from(info.ftLastWriteTime.dwLowDateTime),
    })
}

/// The file's 128-bit id (`FileIdInfo`), folded into 64 bits: on NTFS its
/// upper half is zero and the rest is the 64-bit index; on ReFS (a Dev
/// Drive) the 64-bit index is not unique, and the whole id is. `None`
/// where the call is not known (before Windows 8, some filesystems).
fn file_id(file: &File) -> Option<u64> {
    // SAFETY: an all-zero FILE_ID_INFO is valid (integers and bytes).
    let mut info: fs::FILE_ID_INFO = unsafe { std::mem::zeroed() };
    // SAFETY: the handle is open while `file` lives; `info` is a writable
    // FILE_ID_INFO of the size passed.
    let ok = unsafe {
        fs::GetFileInformationByHandleEx(
            file.as_raw_handle(),
            fs::FileIdInfo,
            std::ptr::from_mut(&mut info).cast(),
            u32::try_from(std::mem::size_of::<fs::FILE_ID_INFO>()).ok()?,
        )
    };
    if ok == 0 {
        return None;
    }
    let id = info.FileId.Identifier;
    let low = u64::from_le_bytes(id[..8].try_into().ok()?);
    let high = u64::from_le_bytes(id[8..].try_into().ok()?);
    Some(low ^ high.rotate_left(32))
}

/// The metadata of what `path` names, following reparse points.
pub(crate) fn meta_of(path: &Path) -> std::io::Result<Meta> {
    let file = OpenOptions::new()
        .access_mode(0)
        .share_mode(SHARE_ALL)
        .custom_flags(fs::FILE_FLAG_BACKUP_SEMANTICS)
        .open(path)?;
    meta(&file)
}

/// The metadata of `path` itself, a reparse point not followed.
pub(crate) fn symlink_meta_of(path: &Path) -> std::io::Result<Meta> {
    let file = OpenOptions::new()
        .access_mode(0)
        .share_mode(SHARE_ALL)
        .custom_flags(fs::FILE_FLAG_BACKUP_SEMANTICS | fs::FILE_FLAG_OPEN_REPARSE_POINT)
        .open(path)?;
    meta(&file)
}

/// Where the liveness mark lies: one byte at 2^62, far past any record
/// (see the module docs).
const MARK_AT: u64 = 1 << 62;

/// The liveness mark of a lock file: `LockFileEx` on the byte at
/// [`MARK_AT`], which Windows lets go when the holder's handle closes,
/// even at a crash (as `flock(2)` on Unix).
pub(crate) trait Flock {
    /// Takes the mark exclusively, without waiting.
    fn try_flock(&self) -> Result<(), TryLockError>;
    /// Takes the mark shared, without waiting.
    fn try_flock_shared(&self) -> Result<(), TryLockError>;
    /// Turns this handle's exclusive mark into a shared one, without
    /// waiting: lets go of it, then takes it shared (a handle's exclusive
    /// lock keeps its own shared lock of the same byte out).
    fn share_mark(&self) -> Result<(), TryLockError>;
}

impl Flock for File {
    fn try_flock(&self) -> Result<(), TryLockError> {
        lock_byte(self, MARK_AT, true)
    }

    fn try_flock_shared(&self) -> Result<(), TryLockError> {
        lock_byte(self, MARK_AT, false)
    }

    fn share_mark(&self) -> Result<(), TryLockError> {
        unlock_range(self, MARK_AT, 1);
        lock_byte(self, MARK_AT, false)
    }
}

/// `LockFileEx` on the byte at `at`, without waiting.
pub(crate) fn lock_byte(file: &File, at: u64, exclusive: bool) -> Result<(), TryLockError> {
    lock_range(file, at, 1, exclusive)
}

/// `LockFileEx` on `[at, at + len)`, without waiting.
pub(crate) fn lock_range(file: &File, at: u64, len: u64, exclusive: bool) -> Result<(), TryLockError> {
    let mut flags = fs::LOCKFILE_FAIL_IMMEDIATELY;
    if exclusive {
        flags |= fs::LOCKFILE_EXCLUSIVE_LOCK;
    }
    let mut overlapped = at_offset(at);
    let (low, high) = split(len);
    // SAFETY: the handle is open for as long as `file` lives (it was not
    // opened for overlapped I/O, so the call completes before returning and
    // `overlapped` only carries the offset).
    let ok = unsafe { fs::LockFileEx(file.as_raw_handle(), flags, 0, low, high, &mut overlapped) };
    if ok != 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error().and_then(|code| u32::try_from(code).ok()) {
        Some(win::ERROR_LOCK_VIOLATION | win::ERROR_IO_PENDING) => Err(TryLockError::WouldBlock),
        _ => Err(TryLockError::Error(e)),
    }
}

/// `UnlockFileEx` of `[at, at + len)`, a range this handle locked with
/// exactly these bounds; whether it was locked.
pub(crate) fn unlock_range(file: &File, at: u64, len: u64) -> bool {
    let mut overlapped = at_offset(at);
    let (low, high) = split(len);
    // SAFETY: as in `lock_range`.
    unsafe { fs::UnlockFileEx(file.as_raw_handle(), 0, low, high, &mut overlapped) != 0 }
}

/// `n` as the low and high halves Windows takes lengths in.
fn split(n: u64) -> (u32, u32) {
    ((n & 0xffff_ffff) as u32, (n >> 32) as u32)
}

/// Whether the directory behind `dir` is on a network share (a UNC path,
/// or a drive letter Windows reports as `DRIVE_REMOTE`); `true` where that
/// cannot be told.
pub(crate) fn on_remote_drive(dir: &File) -> bool {
    let Ok(path) = path_of(dir) else {
        return true;
    };
    let text = path.to_string_lossy();
    let Some(local) = text.strip_prefix(r"\\?\") else {
        return true;
    };
    let drive = local.as_bytes();
    if local.starts_with(r"UNC\") || drive.len() < 2 || !drive[0].is_ascii_alphabetic() || drive[1] != b':' {
        return true;
    }
    let root: Vec<u16> = format!("{}:\\", char::from(drive[0]))
        .encode_utf16()
        .chain([0])
        .collect();
    // SAFETY: `root` is a NUL-terminated UTF-16 string that outlives the call.
    let kind = unsafe { fs::GetDriveTypeW(root.as_ptr()) };
    // `GetDriveTypeW`'s answers for local drives (windows-sys has them
    // under `Win32_System_WindowsProgramming`, not worth the feature).
    const DRIVE_REMOVABLE: u32 = 2;
    const DRIVE_FIXED: u32 = 3;
    const DRIVE_RAMDISK: u32 = 6;
    !matches!(kind, DRIVE_REMOVABLE | DRIVE_FIXED | DRIVE_RAMDISK)
}

/// An OVERLAPPED that carries only the offset `at`.
fn at_offset(at: u64) -> OVERLAPPED {
    // SAFETY: an all-zero OVERLAPPED is valid (integers, a null event).
    let mut overlapped: OVERLAPPED = unsafe { std::mem::zeroed() };
    overlapped.Anonymous.Anonymous.Offset = (at & 0xffff_ffff) as u32;
    overlapped.Anonymous.Anonymous.OffsetHigh = (at >> 32) as u32;
    overlapped
}

/// Whether a failed [`Flock`] says the filesystem has no such locks.
pub(crate) fn flock_unsupported(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::Unsupported
        || e.raw_os_error()
            .and_then(|code| u32::try_from(code).ok())
            .is_some_and(|code| code == win::ERROR_NOT_SUPPORTED || code == win::ERROR_INVALID_FUNCTION)
}

/// Writes at an offset (`WriteFile` with an offset).
pub(crate) trait WriteAt {
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()>;
}

impl WriteAt for File {
    fn write_all_at(&self, mut buf: &[u8], mut offset: u64) -> std::io::Result<()> {
        while !buf.is_empty() {
            match self.seek_write(buf, offset) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    buf = &buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// A builder of directories. (Windows gives a new directory the access
/// control list its parent passes on; the default directory's parent, the
/// user's local application data, passes on access for that user, the
/// system and administrators only.)
pub(crate) fn private_dir() -> DirBuilder {
    DirBuilder::new()
}

/// The name of a user's default lock directory: `<prefix>` alone, as its
/// root (the user's local application data) is the user's own.
pub(crate) fn per_user_name(prefix: &str) -> String {
    prefix.to_owned()
}

/// Who must own the root of the per-user directories: this user (the
/// value is not a user id on Windows; see [`root_problem`]).
pub(crate) const ROOT_OWNER: u32 = 0;

/// Why the root of the per-user default directory cannot be trusted, if
/// it cannot: it must be a directory of this user's that nobody else may
/// change (see `security.rs` for what is checked).
pub(crate) fn root_problem(root: &Path, _owner: u32) -> std::io::Result<Option<&'static str>> {
    if root.as_os_str().is_empty() {
        return Ok(Some("this user has no local application data folder"));
    }
    let dir = open_dir(root)?;
    Ok(if !meta(&dir)?.is_dir() {
        Some("its parent is not a directory")
    } else if !super::security::owned_by_me(&dir)? {
        Some("its parent does not belong to this user")
    } else if super::security::open_to_others(&dir)? {
        Some("its parent may be changed by other users")
    } else {
        None
    })
}

/// Whether the open directory `dir` belongs to this process's user.
pub(crate) fn owned_by_me(dir: &File, _meta: &Meta) -> std::io::Result<bool> {
    super::security::owned_by_me(dir)
}

/// Whether other users may change the directory (see `security.rs`).
pub(crate) fn open_to_others(dir: &File, _meta: &Meta) -> std::io::Result<bool> {
    super::security::open_to_others(dir)
}

/// Opens the directory at `path` (following reparse points on the way, as
/// a configured path may), to hold it and work inside it.
pub(crate) fn open_dir(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .share_mode(SHARE_ALL)
        .custom_flags(fs::FILE_FLAG_BACKUP_SEMANTICS)
        .open(path)
}

/// Makes the entries of the directory `dir` durable: `FlushFileBuffers`
/// on a second handle of it opened for writing (which a directory allows
/// with backup semantics, and the call needs), as the lock directory's own
/// handle is open for reading only.
pub(crate) fn sync_dir(dir: &File) -> std::io::Result<()> {
    let path = path_of(dir)?;
    OpenOptions::new()
        .read(true)
        .write(true)
        .share_mode(SHARE_ALL)
        .custom_flags(fs::FILE_FLAG_BACKUP_SEMANTICS)
        .open(path)?
        .sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{Probe, RenameError};

    /// A temporary directory and a handle of it, as the backend holds one.
    fn dir() -> (tempfile::TempDir, File) {
        let root = tempfile::tempdir().unwrap();
        let fd = open_dir(root.path()).unwrap();
        (root, fd)
    }

    /// A handle with `DELETE` access only, as `RemoveDirectoryW` holds one
    /// while it removes a directory.
    fn open_for_deletion(path: &Path) -> File {
        OpenOptions::new()
            .access_mode(fs::DELETE)
            .share_mode(SHARE_ALL)
            .custom_flags(fs::FILE_FLAG_BACKUP_SEMANTICS)
            .open(path)
            .unwrap()
    }

    fn sorted(names: Vec<OsString>) -> Vec<OsString> {
        let mut names = names;
        names.sort();
        names
    }

    /// A members directory that another process has open for deletion (a
    /// removal under way beside us) is listed, whole. Listed by path it was
    /// refused under Wine (its `FindFirstFileExW` does not share deletion):
    /// `ERROR_SHARING_VIOLATION`, for as long as that handle stayed open.
    #[test]
    fn list_at_lists_a_directory_another_handle_has_open_for_deletion() {
        let (root, _fd) = dir();
        let members = root.path().join("job.lock.members");
        std::fs::create_dir(&members).unwrap();
        std::fs::write(members.join("m-1.json"), b"{}").unwrap();
        std::fs::write(members.join("w-2.json"), b"{}").unwrap();
        let held = open_dir(&members).unwrap();
        let deleter = open_for_deletion(&members);
        assert_eq!(
            sorted(list_at(&held).unwrap()),
            [OsString::from("m-1.json"), OsString::from("w-2.json")]
        );
        drop((deleter, held));
    }

    /// The listing is the directory's as it is now, each time (the
    /// enumeration starts over), through every duplicate of a handle, from
    /// several threads at once; and a directory removed while we hold it
    /// lists as what it holds, nothing, never as the directory that next
    /// takes its name.
    #[test]
    fn list_at_reads_the_directory_behind_the_handle_each_time() {
        let (root, _fd) = dir();
        let members = root.path().join("job.lock.members");
        std::fs::create_dir(&members).unwrap();
        let held = open_dir(&members).unwrap();
        assert_eq!(list_at(&held).unwrap(), Vec::<OsString>::new());
        let mut expected = Vec::new();
        for i in 0..300 {
            let name = format!("m-{i:04}-{}.json", "x".repeat(100));
            std::fs::write(members.join(&name), b"{}").unwrap();
            expected.push(OsString::from(name));
        }
        // More names than one reply of 64 KiB holds.
        assert_eq!(sorted(list_at(&held).unwrap()), expected);
        let clones: Vec<File> = (0..4).map(|_| held.try_clone().unwrap()).collect();
        std::thread::scope(|s| {
            for clone in &clones {
                s.spawn(|| {
                    for _ in 0..20 {
                        assert_eq!(sorted(list_at(clone).unwrap()), expected);
                    }
                });
            }
        });
        drop(clones);
        for name in &expected {
            std::fs::remove_file(members.join(name)).unwrap();
        }
        std::fs::remove_dir(&members).unwrap();
        assert_eq!(list_at(&held).unwrap(), Vec::<OsString>::new());
        // Windows keeps the name while we hold the directory (Wine too);
        // should it be free and taken again, our handle still lists ours.
        if std::fs::create_dir(&members).is_ok() {
            std::fs::write(members.join("m-new.json"), b"{}").unwrap();
            assert_eq!(list_at(&held).unwrap(), Vec::<OsString>::new());
        }
        drop(held);
    }

    #[test]
    fn errno_mapping_round_trips() {
        let named = [
            Errno::ENOENT,
            Errno::EACCES,
            Errno::EBUSY,
            Errno::EAGAIN,
            Errno::EEXIST,
            Errno::ENOTEMPTY,
            Errno::ENOTDIR,
            Errno::EXDEV,
            Errno::EROFS,
            Errno::EMFILE,
            Errno::ENOTSUP,
            Errno::ELOOP,
            Errno::ENAMETOOLONG,
            Errno::EINVAL,
            Errno::EBADF,
            Errno::EPIPE,
        ];
        // Through an io::Error and back, every number the backend matches.
        for errno in named {
            assert_eq!(Errno::of(&std::io::Error::from(errno)), errno, "{errno:?}");
        }
        // Each Windows code the table knows reads as its twin, and the
        // twin turns back into a code that reads the same.
        for (code, twin) in [
            (win::ERROR_FILE_NOT_FOUND, Errno::ENOENT),
            (win::ERROR_PATH_NOT_FOUND, Errno::ENOENT),
            (win::ERROR_ACCESS_DENIED, Errno::EACCES),
            (win::ERROR_SHARING_VIOLATION, Errno::EBUSY),
            (win::ERROR_LOCK_VIOLATION, Errno::EAGAIN),
            (win::ERROR_FILE_EXISTS, Errno::EEXIST),
            (win::ERROR_ALREADY_EXISTS, Errno::EEXIST),
            (win::ERROR_DIR_NOT_EMPTY, Errno::ENOTEMPTY),
            (win::ERROR_INVALID_PARAMETER, Errno::EINVAL),
            (win::ERROR_INVALID_HANDLE, Errno::EBADF),
        ] {
            let io = std::io::Error::from_raw_os_error(i32::try_from(code).unwrap());
            assert_eq!(Errno::of(&io), twin, "{code}");
            assert_eq!(Errno::from_windows(twin.to_windows()), twin, "{code}");
        }
        // A code without a twin keeps its number both ways.
        for code in [win::ERROR_DISK_FULL, win::ERROR_NOT_READY, 1_000_000] {
            let errno = Errno::from_windows(code);
            assert!(!named.contains(&errno), "{code}");
            assert_eq!(errno.to_windows(), code);
            let io = std::io::Error::from(errno);
            assert_eq!(io.raw_os_error(), Some(i32::try_from(code).unwrap()));
            assert_eq!(Errno::of(&io), errno);
        }
    }

    #[test]
    fn unlink_at_frees_the_name_at_once_while_another_handle_has_it_open() {
        let (root, fd) = dir();
        let path = root.path().join("job.lock");
        std::fs::write(&path, b"record").unwrap();
        // A reader's handle, as std opens files (sharing deletion).
        let reader = File::open(&path).unwrap();
        unlink_at(&fd, "job.lock").unwrap();
        assert!(!path.exists(), "the name is gone at once");
        assert_eq!(stat_at(&fd, "job.lock").unwrap_err(), Errno::ENOENT);
        // A new file of that name can be made at once.
        let new = open_at(&fd, "job.lock", Open::CreateNew).unwrap();
        // The reader still reads what it opened.
        let mut seen = Vec::new();
        std::io::Read::read_to_end(&mut &reader, &mut seen).unwrap();
        assert_eq!(seen, b"record");
        // A directory is not unlinked.
        std::fs::create_dir(root.path().join("d")).unwrap();
        assert_eq!(unlink_at(&fd, "d").unwrap_err(), Errno::EISDIR);
        // Every handle closed before the directory goes (see FINDINGS.md).
        drop((reader, new, fd));
    }

    #[test]
    fn stat_at_never_follows_a_reparse_point() {
        let (root, fd) = dir();
        std::fs::create_dir(root.path().join("target")).unwrap();
        std::fs::write(root.path().join("file"), b"x").unwrap();
        let made = [
            std::os::windows::fs::symlink_dir(root.path().join("target"), root.path().join("to-dir")),
            std::os::windows::fs::symlink_file(root.path().join("file"), root.path().join("to-file")),
        ];
        // Windows makes symbolic links only for a privileged user or in
        // developer mode. Wine 8.0 reports success and makes nothing at
        // the name (it is not found, by std either): this test proves
        // nothing under Wine, only on Windows.
        let there = ["to-dir", "to-file"].map(|l| std::fs::symlink_metadata(root.path().join(l)).is_ok());
        if made.iter().any(Result::is_err) || there.contains(&false) {
            eprintln!("no symbolic links here: {made:?}, there: {there:?}");
            return;
        }
        for (link, target) in [("to-dir", "target"), ("to-file", "file")] {
            let seen = stat_at(&fd, link).unwrap();
            assert_eq!(seen.kind, Kind::Symlink, "{link}");
            let real = stat_at(&fd, target).unwrap();
            assert_ne!((seen.dev, seen.ino), (real.dev, real.ino), "{link} followed");
            assert_eq!(
                open_at(&fd, link, Open::Read).unwrap_err(),
                Errno::ELOOP,
                "{link}"
            );
        }
        drop(fd);
    }

    #[test]
    fn rename_noreplace_refuses_an_existing_file_and_an_existing_empty_directory() {
        let (root, fd) = dir();
        std::fs::write(root.path().join("a"), b"a").unwrap();
        std::fs::write(root.path().join("b"), b"b").unwrap();
        assert!(matches!(
            super::super::rename_noreplace(&fd, "a", "b"),
            Err(RenameError::Exists)
        ));
        assert_eq!(std::fs::read(root.path().join("b")).unwrap(), b"b");
        assert_eq!(std::fs::read(root.path().join("a")).unwrap(), b"a");
        std::fs::create_dir(root.path().join("d1")).unwrap();
        std::fs::write(root.path().join("d1/owner.json"), b"{}").unwrap();
        std::fs::create_dir(root.path().join("d2")).unwrap();
        assert!(matches!(
            super::super::rename_noreplace(&fd, "d1", "d2"),
            Err(RenameError::Exists)
        ));
        assert!(root.path().join("d1/owner.json").exists());
        assert_eq!(std::fs::read_dir(root.path().join("d2")).unwrap().count(), 0);
        // And to a free name it renames.
        super::super::rename_noreplace(&fd, "a", "c").unwrap();
        assert_eq!(std::fs::read(root.path().join("c")).unwrap(), b"a");
        drop(fd);
    }

    #[test]
    fn probe_tells_a_live_child_an_exited_one_and_a_never_used_pid() {
        // `cmd /C pause` waits on its stdin, which stays open.
        let mut child = std::process::Command::new("cmd")
            .args(["/C", "pause"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = u64::from(child.id());
        assert_eq!(crate::sys::probe(pid), Probe::Alive);
        child.kill().unwrap();
        child.wait().unwrap();
        // Exited, its handle still open (so the pid is not reused yet).
        assert_eq!(crate::sys::probe(pid), Probe::Dead);
        drop(child);
        // Never used: pids are multiples of 4, below 2^32.
        assert_eq!(crate::sys::probe(4_000_001), Probe::Dead);
        assert_eq!(crate::sys::probe(0), Probe::Unknown);
        assert_eq!(crate::sys::probe(1 << 40), Probe::Unknown);
        // A live process's id plus 1 to 3 opens that process on Windows: it
        // names none of its own, and is not taken for it.
        let me = u64::from(std::process::id());
        assert_eq!(crate::sys::probe(me), Probe::Alive);
        assert_eq!(crate::sys::probe(me + 1), Probe::Unknown);
    }
}
