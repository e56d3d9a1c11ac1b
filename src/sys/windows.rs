//! Windows: the kernel's own answers through the Win32 API.
//!
//! - whether a process lives: `OpenProcess` and a zero wait on its handle
//!   (a process that exited is signalled, whatever its exit code);
//! - the start of any process: `GetProcessTimes`' creation time;
//! - the boot: the `BootId` counter the memory manager keeps in the
//!   registry, one more at every boot; the host across boots: the
//!   `MachineGuid` made at installation;
//! - the lease clock: `GetTickCount64`, milliseconds since boot, counting
//!   time asleep;
//! - the default lock directory's root: the user's local application data
//!   folder (`FOLDERID_LocalAppData`), from the shell, never from the
//!   environment;
//! - a rename that never replaces: `MoveFileExW` without
//!   `MOVEFILE_REPLACE_EXISTING`.
//!
//! - waking waiters: `ReadDirectoryChangesW` on the lock directory
//!   (`windows/watch.rs`); a holder's death is no directory change: the
//!   same thread waits on the holders' process handles;
//! - files and directories made with an access list of the user's alone
//!   (`windows/security.rs`).
//!
//! No start ticks, pid or time namespaces or waiting line here: those
//! questions answer `None` or `false` (the poll and the lease decide).

#![allow(unsafe_code)]

use std::ffi::OsString;
use std::fs::File;
use std::os::windows::ffi::OsStringExt;
use std::path::PathBuf;

use windows_sys::Win32::Foundation as win;
use windows_sys::Win32::System::Registry as reg;
use windows_sys::Win32::System::SystemInformation as sysinfo;
use windows_sys::Win32::System::Threading as threading;

use super::kinfo;
use super::{Probe, ProcStart};

#[path = "windows/security.rs"]
mod security;
#[path = "windows/syscall.rs"]
pub(crate) mod syscall;
#[path = "windows/watch.rs"]
mod watch;

/// An open process handle, closed when dropped.
struct Process(win::HANDLE);

// SAFETY: a process handle may be waited on, queried and closed from any
// thread; `Process` closes it once, when dropped.
unsafe impl Send for Process {}

impl Process {
    /// Opens `pid` for asking its times and waiting on it; the Windows
    /// error when it cannot be.
    fn open(pid: u64) -> Result<Process, u32> {
        let pid = u32::try_from(pid).map_err(|_| win::ERROR_INVALID_PARAMETER)?;
        if pid == 0 {
            return Err(win::ERROR_INVALID_PARAMETER);
        }
        let access = threading::PROCESS_QUERY_LIMITED_INFORMATION | threading::PROCESS_SYNCHRONIZE;
        // SAFETY: a plain call; the handle it returns is owned by `Process`.
        let handle = unsafe { threading::OpenProcess(access, 0, pid) };
        if handle.is_null() {
            // SAFETY: reads this thread's last error, set by the call above.
            return Err(unsafe { win::GetLastError() });
        }
        Ok(Process(handle))
    }

    /// Whether it has exited (its handle is signalled).
    fn exited(&self) -> Option<bool> {
        // SAFETY: the handle is open while `self` lives.
        match unsafe { threading::WaitForSingleObject(self.0, 0) } {
            win::WAIT_OBJECT_0 => Some(true),
            win::WAIT_TIMEOUT => Some(false),
            _ => None,
        }
    }

    /// When it was created, in milliseconds since the epoch.
    fn created_ms(&self) -> Option<u64> {
        let zero = win::FILETIME {
            dwLowDateTime: 0,
            dwHighDateTime: 0,
        };
        let (mut created, mut exited, mut kernel, mut user) = (zero, zero, zero, zero);
        // SAFETY: the handle is open while `self` lives; the four
        // out-parameters are writable FILETIMEs.
        let ok =
            unsafe { threading::GetProcessTimes(self.0, &mut created, &mut exited, &mut kernel, &mut user) };
        if ok == 0 {
            return None;
        }
        let at = syscall::system_time(created.dwHighDateTime, created.dwLowDateTime)?;
        let ms = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis();
        u64::try_from(ms).ok()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // SAFETY: the handle was opened by `Process::open` and is closed
        // once, here.
        unsafe { win::CloseHandle(self.0) };
    }
}

/// Whether a process with id `pid` runs: no process has the id when
/// opening it is refused as an invalid parameter; one that refuses us
/// (another user's, a protected one) exists.
pub(super) fn probe(pid: u64) -> Probe {
    // Windows ignores a process id's two low bits (every id is a multiple
    // of 4): 5 would open 4, the System process. Such an id names no process
    // of its own: "no process" when none has it with those bits cleared,
    // else nothing can be told.
    if !pid.is_multiple_of(4) {
        return match Process::open(pid) {
            Err(win::ERROR_INVALID_PARAMETER) if u32::try_from(pid).is_ok() => Probe::Dead,
            _ => Probe::Unknown,
        };
    }
    match Process::open(pid) {
        Ok(process) => match process.exited() {
            Some(true) => Probe::Dead,
            Some(false) => Probe::Alive,
            None => Probe::Unknown,
        },
        Err(win::ERROR_INVALID_PARAMETER) if pid != 0 && u32::try_from(pid).is_ok() => Probe::Dead,
        Err(win::ERROR_ACCESS_DENIED) => Probe::Alive,
        Err(_) => Probe::Unknown,
    }
}

pub(super) fn process_start(pid: u64) -> Option<ProcStart> {
    if !pid.is_multiple_of(4) {
        return None;
    }
    let process = Process::open(pid).ok()?;
    if process.exited() != Some(false) {
        return None;
    }
    let start = process.created_ms()?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_millis();
    Some(kinfo::start_from_wall(
        start,
        u64::try_from(now_ms).ok()?,
        boot_clock_ms(),
    ))
}

/// No start ticks here: `ProcStart::ticks` holds the start on the boot
/// clock in milliseconds, which no foreign writer puts in `startTime`.
pub(super) fn clock_ticks() -> Option<u64> {
    None
}

/// pi-research's `startTime` on Windows: whole seconds since the epoch,
/// cut, which is what its process-lifecycle service reads there
/// (PowerShell's `Get-Process` `StartTime`, the same creation time).
pub(super) fn own_start_time(start: Option<ProcStart>) -> Option<u64> {
    start.as_ref().map(kinfo::start_time_s)
}

pub(super) fn time_namespace_of(_pid: u64) -> Option<String> {
    None
}

/// The lease clock: `GetTickCount64`, milliseconds since the boot, which
/// counts time asleep and never jumps.
pub(super) fn boot_clock_ms() -> u64 {
    // SAFETY: a plain call without arguments.
    unsafe { sysinfo::GetTickCount64() }
}

pub(super) fn boot_clock_us() -> u64 {
    boot_clock_ms().saturating_mul(1000)
}

/// `GetTickCount64` counts from this boot, for every process on it.
pub(super) fn boot_clock_is_host_wide() -> bool {
    true
}

/// A value of the local machine's registry, as a `u32` or a string.
fn registry(key: &str, value: &str, flags: u32) -> Option<Vec<u8>> {
    let key: Vec<u16> = key.encode_utf16().chain(std::iter::once(0)).collect();
    let value: Vec<u16> = value.encode_utf16().chain(std::iter::once(0)).collect();
    let mut buf = vec![0u8; 256];
    let mut len = u32::try_from(buf.len()).ok()?;
    // SAFETY: the key and value names are NUL-terminated UTF-16 strings
    // that live across the call; `buf` is writable for `len` bytes, and
    // the call writes at most that many and sets `len` to what it wrote.
    let status = unsafe {
        reg::RegGetValueW(
            reg::HKEY_LOCAL_MACHINE,
            key.as_ptr(),
            value.as_ptr(),
            flags,
            std::ptr::null_mut(),
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if status != win::ERROR_SUCCESS {
        return None;
    }
    buf.truncate(usize::try_from(len).ok()?);
    Some(buf)
}

/// `BootId` of the memory manager's prefetch parameters: a counter that
/// grows by one at every boot of this installation.
pub(super) fn boot_id() -> Option<String> {
    let bytes = registry(
        r"SYSTEM\CurrentControlSet\Control\Session Manager\Memory Management\PrefetchParameters",
        "BootId",
        reg::RRF_RT_REG_DWORD,
    )?;
    let id = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?);
    Some(format!("windows-boot-{id}"))
}

/// `MachineGuid`, made when Windows was installed.
pub(super) fn machine_id() -> Option<String> {
    let bytes = registry(
        r"SOFTWARE\Microsoft\Cryptography",
        "MachineGuid",
        reg::RRF_RT_REG_SZ,
    )?;
    let units: Vec<u16> = bytes
        .chunks_exact(2)
        .map(|pair| u16::from_le_bytes([pair[0], pair[1]]))
        .take_while(|&unit| unit != 0)
        .collect();
    let text = String::from_utf16(&units).ok()?;
    let text = text.trim();
    (!text.is_empty() && text.len() <= super::MAX_MACHINE_ID_LEN).then(|| text.to_ascii_lowercase())
}

/// This computer's DNS host name (`GetComputerNameExW`).
pub(super) fn hostname() -> Option<String> {
    let mut buf = vec![0u16; 256];
    let mut len = u32::try_from(buf.len()).ok()?;
    // SAFETY: `buf` is writable for `len` UTF-16 units; the call sets `len`
    // to the units written, without the final NUL.
    let ok =
        unsafe { sysinfo::GetComputerNameExW(sysinfo::ComputerNameDnsHostname, buf.as_mut_ptr(), &mut len) };
    if ok == 0 {
        return None;
    }
    buf.truncate(usize::try_from(len).ok()?);
    String::from_utf16(&buf).ok()
}

pub(super) fn pid_namespace() -> Option<String> {
    None
}

pub(super) fn time_namespace() -> Option<String> {
    None
}

pub(crate) use watch::{DirWatch, watch_dir};

/// Whether the filesystem of `file` keeps everything in memory: no
/// Windows filesystem leasehold meets does.
pub(crate) fn fs_in_memory(_: &File) -> bool {
    false
}

/// Whether `file` is on a network share, where a byte-range lock is a
/// round trip to the server (the waiting line is left off there).
pub(crate) fn fs_is_remote(file: &File) -> bool {
    syscall::on_remote_drive(file)
}

/// The waiting line is on here: Windows cannot lock a directory, so its
/// tickets are byte-range locks on a file in the lock directory,
/// [`LINE_FILE`] (see [`line_file`]).
pub(crate) const BYTE_RANGE_LOCKS: bool = true;

/// The file in a lock directory whose bytes the waiting line locks: `..`
/// is in no lock's file name, and leasehold lists only names that end in
/// `.lock`, so no lock ever meets it. It is made once, empty and private,
/// and left in place: waiters of other processes may hold bytes of it.
pub(crate) const LINE_FILE: &str = "leasehold..line";

/// The line's file in the lock directory `dir`, made when `create`, else
/// opened only if it is there (no waiter has stood in line in `dir`
/// until one has made it).
pub(crate) fn line_file(dir: &File, create: bool) -> Option<File> {
    let how = if create {
        syscall::Open::Mutex
    } else {
        syscall::Open::Read
    };
    let file = syscall::open_at(dir, LINE_FILE, how).ok()?;
    // Windows' byte-range locks are mandatory: a file that is also named
    // elsewhere (a hard link planted here) is someone's data, whose reads
    // and writes a ticket would stop. No line then.
    let meta = syscall::meta(&file).ok()?;
    (meta.is_file() && meta.nlink() == 1).then_some(file)
}

// The line's bytes. Windows' byte-range locks differ from the OFD locks
// the line was made for in two ways, and the line's offsets are doubled
// here to meet both:
//
// - A lock is asked for, not read: there is no `F_OFD_GETLK`. Whether
//   another handle holds a byte of a range is seen by taking a *shared*
//   lock over the range on the same handle as one's own bytes and letting
//   it go at once. A handle's shared lock may overlap its own exclusive
//   ones, so only others' bytes refuse it, as `F_OFD_GETLK` sees only
//   other open file descriptions'.
// - So the bytes one holds are *exclusive* (a shared byte would not
//   refuse a shared look), and an unlock names its range exactly: had a
//   look the same range as one of one's own bytes, Windows would let go
//   of the exclusive lock first. The byte of offset `at` is locked at
//   `2 * at` and every look covers at least two bytes, so no look ever
//   has the bounds of a held byte.

/// Where the line's offset `at` is locked: see above. The line's offsets
/// are below 2^62.
fn doubled(at: u64) -> u64 {
    at.min(1 << 62).saturating_mul(2)
}

/// Holds the line's byte `at` of the line file `file` (exclusively: see
/// above); whether it is held. A look by another process over the byte
/// refuses it for the moment the look lasts, so it is asked again a few
/// times.
pub(crate) fn ofd_take_byte(file: &File, at: u64) -> bool {
    (0..8).any(|attempt| {
        if attempt > 0 {
            std::thread::yield_now();
        }
        syscall::lock_range(file, doubled(at), 1, true).is_ok()
    })
}

/// Lets go of the line's byte `at` of `file`.
pub(crate) fn ofd_drop_byte(file: &File, at: u64) {
    syscall::unlock_range(file, doubled(at), 1);
}

/// Holds the line's bytes `[start, start + len)` of `file`, as another
/// program might (exclusively, so that looks see it); whether it did.
#[cfg(test)]
pub(crate) fn ofd_read_lock(file: &File, start: u64, len: u64) -> bool {
    syscall::lock_range(file, doubled(start), len.saturating_mul(2), true).is_ok()
}

/// Whether another handle holds one of the line's bytes `[start, end)` of
/// `file` (a shared look over them, let go at once). A look that fails
/// for any other reason sees nobody: the line decides fairness, never
/// exclusion.
pub(crate) fn ofd_held(file: &File, start: u64, end: u64) -> bool {
    let (from, to) = (doubled(start), doubled(end));
    if to <= from {
        return false;
    }
    match syscall::lock_range(file, from, to - from, false) {
        Ok(()) => {
            syscall::unlock_range(file, from, to - from);
            false
        }
        Err(std::fs::TryLockError::WouldBlock) => true,
        Err(std::fs::TryLockError::Error(_)) => false,
    }
}

/// The first of the line's bytes in `[start, end)` of `file` that another
/// handle holds, if any, found by halving the range (at most 63 looks),
/// as the span of the held bytes that run on from it (Windows does not say
/// how far a lock reaches: one look more for a ticket, and a search for a
/// range), beginning one byte below `start` when a lock reaches below it.
pub(crate) fn ofd_held_span(file: &File, start: u64, end: u64) -> Option<(u64, u64)> {
    let end = end.min(1 << 62);
    if !ofd_held(file, start, end) {
        return None;
    }
    let (mut lo, mut hi) = (start, end);
    // A byte in [lo, hi) is held.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if ofd_held(file, lo, mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    // Bytes come and go while the range is halved: the one found must
    // still be held.
    if !ofd_held(file, lo, hi) {
        return None;
    }
    // A lock that goes on below the range is reported as beginning below
    // it, as `F_OFD_GETLK` reports a lock's whole span: the line takes
    // such a lock for another program's range, not for a ticket or mark.
    let from = if lo == start && lo > 0 && held_at(file, lo - 1) {
        lo - 1
    } else {
        lo
    };
    // And it goes on up to the first byte not held: a range held over the
    // line is reported whole, as `F_OFD_GETLK` would, not as one ticket
    // per byte (which a waiter joining would count one by one).
    Some((from, run_end(file, lo)))
}

/// Whether another handle holds the line's byte `at`.
fn held_at(file: &File, at: u64) -> bool {
    at < 1 << 62 && ofd_held(file, at, at + 1)
}

/// The first byte not held above `at`, a byte another handle holds: one
/// look for a ticket, and for a range a search doubling the step and then
/// halving it (at most 124 looks).
fn run_end(file: &File, at: u64) -> u64 {
    // `held` is held, and `free` is not (or is the line's end).
    let (mut held, mut step) = (at, 1);
    let mut free = loop {
        let next = at.saturating_add(step).min(1 << 62);
        if !held_at(file, next) {
            break next;
        }
        held = next;
        step = step.saturating_mul(2);
    };
    while free - held > 1 {
        let mid = held + (free - held) / 2;
        if held_at(file, mid) {
            held = mid;
        } else {
            free = mid;
        }
    }
    free
}

/// The user's local application data folder (`FOLDERID_LocalAppData`,
/// `C:\Users\<user>\AppData\Local`), asked of the shell; no mount tables.
/// `None` as the root's path where the shell cannot say, which the default
/// directory refuses.
pub(crate) fn lock_root() -> (PathBuf, Option<(PathBuf, PathBuf)>) {
    (local_app_data().unwrap_or_default(), None)
}

fn local_app_data() -> Option<PathBuf> {
    use windows_sys::Win32::System::Com::CoTaskMemFree;
    use windows_sys::Win32::UI::Shell::{FOLDERID_LocalAppData, KF_FLAG_DEFAULT, SHGetKnownFolderPath};
    let mut path: windows_sys::core::PWSTR = std::ptr::null_mut();
    // SAFETY: the folder id is a static GUID; `path` receives a string the
    // shell allocates, freed below with CoTaskMemFree whatever happened.
    let status = unsafe {
        SHGetKnownFolderPath(
            &FOLDERID_LocalAppData,
            u32::try_from(KF_FLAG_DEFAULT).unwrap_or(0),
            std::ptr::null_mut(),
            &mut path,
        )
    };
    let found = if status == 0 && !path.is_null() {
        // SAFETY: on success `path` is a NUL-terminated UTF-16 string.
        let len = (0..).take_while(|&i| unsafe { *path.add(i) } != 0).count();
        // SAFETY: `len` units from `path` were just read one by one.
        let units = unsafe { std::slice::from_raw_parts(path, len) };
        Some(PathBuf::from(OsString::from_wide(units)))
    } else {
        None
    };
    // SAFETY: `path` is null or the shell's allocation, freed once.
    unsafe { CoTaskMemFree(path.cast()) };
    found
}

/// `MoveFileExW` without `MOVEFILE_REPLACE_EXISTING`: never replaces a
/// file, nor a directory, empty or not.
pub(crate) fn rename_exclusive(dir: &File, from: &str, to: &str) -> Result<(), super::RenameError> {
    rename_noreplace(dir, from, to)
}

/// No atomic exchange of two entries here (see `sys::exchange_at`).
pub(crate) fn exchange_at(_dir: &File, _a: &str, _b: &str) -> Result<(), super::RenameError> {
    Err(super::RenameError::Unsupported)
}

/// [`rename_exclusive`], for directories too.
pub(crate) fn rename_noreplace(dir: &File, from: &str, to: &str) -> Result<(), super::RenameError> {
    use super::RenameError;
    use syscall::Errno;
    let base = syscall::path_of(dir).map_err(|e| RenameError::Io(e.into()))?;
    match syscall::move_file(&base.join(from), &base.join(to), 0) {
        Ok(()) => Ok(()),
        Err(Errno::EEXIST | Errno::ENOTEMPTY) => Err(RenameError::Exists),
        // A directory moved onto an existing one is refused as "access
        // denied": look whether that is why.
        Err(Errno::EACCES) if syscall::stat_at(dir, to).is_ok() => Err(RenameError::Exists),
        Err(e) => Err(RenameError::Io(e.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_of(dir: &tempfile::TempDir) -> File {
        line_file(&syscall::open_dir(dir.path()).unwrap(), true).unwrap()
    }

    #[test]
    fn a_handle_sees_others_bytes_and_never_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let (mine, theirs) = (line_of(&dir), line_of(&dir));
        assert!(ofd_take_byte(&mine, 100));
        assert!(!ofd_held(&mine, 0, 1 << 40), "its own byte");
        assert!(ofd_held(&theirs, 100, 101));
        assert!(!ofd_held(&theirs, 0, 100) && !ofd_held(&theirs, 101, 200));
        assert_eq!(ofd_held_span(&theirs, 0, 1 << 40), Some((100, 101)));
        // A look of exactly the bounds of a held byte would have let go of
        // it (see above): looks never have them, and the byte stays held.
        for _ in 0..3 {
            assert!(!ofd_held(&mine, 100, 101));
        }
        assert!(ofd_held(&theirs, 100, 101), "a look let go of the byte");
        assert!(!ofd_take_byte(&theirs, 100), "bytes are exclusive");
        ofd_drop_byte(&mine, 100);
        assert!(!ofd_held(&theirs, 0, 1 << 40));
        assert!(ofd_take_byte(&theirs, 100));
    }

    #[test]
    fn the_first_held_byte_is_found_and_a_range_from_below_reported_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (line_of(&dir), line_of(&dir), line_of(&dir));
        assert!(ofd_take_byte(&a, (1 << 40) + 7) && ofd_take_byte(&b, (1 << 40) + 3));
        assert_eq!(
            ofd_held_span(&c, 1 << 40, 1 << 41),
            Some(((1 << 40) + 3, (1 << 40) + 4))
        );
        let d = line_of(&dir);
        assert!(ofd_read_lock(&d, 0, (1 << 40) + 1));
        assert_eq!(
            ofd_held_span(&c, 1 << 40, 1 << 41),
            Some(((1 << 40) - 1, (1 << 40) + 1))
        );
    }

    #[test]
    fn a_line_file_named_elsewhere_too_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let data = elsewhere.path().join("data");
        std::fs::write(&data, b"someone's data").unwrap();
        std::fs::hard_link(&data, dir.path().join(LINE_FILE)).unwrap();
        let handle = syscall::open_dir(dir.path()).unwrap();
        assert!(line_file(&handle, true).is_none());
        assert!(line_file(&handle, false).is_none());
        assert_eq!(std::fs::read(&data).unwrap(), b"someone's data");
    }
}
