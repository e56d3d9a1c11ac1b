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
//!   (`windows/watch.rs`); a holder's death is no directory change, and is
//!   seen by polling;
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

/// Whether `file` is on a network filesystem: not asked here, so it counts
/// as one (the waiting line is an optimisation, left off).
pub(crate) fn fs_is_remote(_: &File) -> bool {
    true
}

/// The waiting line is off here: its tickets are byte-range locks on the
/// lock directory, which Windows does not lock.
pub(crate) const BYTE_RANGE_LOCKS: bool = false;

/// No byte-range locks on directories here.
#[cfg(test)]
pub(crate) fn ofd_read_lock(_: &File, _start: u64, _len: u64) -> bool {
    false
}

/// No byte-range locks on directories here.
pub(crate) fn ofd_take_byte(_: &File, _at: u64) -> bool {
    false
}

/// No byte-range locks on directories here.
pub(crate) fn ofd_drop_byte(_: &File, _at: u64) {}

/// No byte-range locks on directories here: nobody is seen ahead.
pub(crate) fn ofd_held_span(_: &File, _start: u64, _end: u64) -> Option<(u64, u64)> {
    None
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
