//! Platform probes behind one internal contract.
//!
//! Everything the staleness rules need to know about processes and clocks on
//! this host comes through here, so `nix` and errno types stay inside `sys/`.
//! Linux answers every question from `/proc`; other Unix systems answer the
//! portable ones (`kill(pid, 0)`, the monotonic clock) and return `None` for
//! the rest, which the staleness rules treat as "cannot decide", never as
//! "dead".

#[cfg(target_os = "linux")]
mod linux;
#[cfg(not(target_os = "linux"))]
mod other;

#[cfg(target_os = "linux")]
use linux as imp;
#[cfg(not(target_os = "linux"))]
use other as imp;

use std::sync::OnceLock;

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;

/// What `kill(pid, 0)` says about a process id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// ESRCH: no process has this id.
    Dead,
    /// The process exists (EPERM counts: it exists but is not ours).
    Alive,
    /// The id cannot be probed (zero, negative, out of range) or the probe
    /// failed in an unexpected way.
    Unknown,
}

/// Probes a process id with signal 0.
///
/// Never signals a process group: ids that `kill(2)` would read as a group
/// (0, negative) or that do not fit `pid_t` are `Unknown`.
pub(crate) fn probe(pid: u64) -> Probe {
    let Ok(raw) = i32::try_from(pid) else {
        return Probe::Unknown;
    };
    if raw <= 0 {
        return Probe::Unknown;
    }
    match kill(Pid::from_raw(raw), None) {
        Ok(()) | Err(Errno::EPERM) => Probe::Alive,
        Err(Errno::ESRCH) => Probe::Dead,
        Err(_) => Probe::Unknown,
    }
}

/// When a process started, in two forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStart {
    /// Clock ticks since boot (`/proc/<pid>/stat` field 22): exact, and
    /// immune to wall-clock steps. Comparable only within one boot, and
    /// between readers in one time namespace (the kernel shifts it by the
    /// reader's boot-clock offset).
    pub(crate) ticks: u64,
    /// Milliseconds since the Unix epoch: now, on the wall clock, minus the
    /// process's age; as good as the wall clock is now.
    pub(crate) epoch_ms: u64,
    /// How long ago it started, on the boot clock: exact.
    pub(crate) age_ms: u64,
}

/// The start of process `pid`, or `None` when it cannot be read (gone, or a
/// platform without `/proc`).
pub(crate) fn process_start(pid: u64) -> Option<ProcStart> {
    imp::process_start(pid)
}

/// Milliseconds on a clock that never jumps and, on Linux, keeps counting
/// through suspend (`CLOCK_BOOTTIME`), so a lease measured on it expires for
/// holder and reclaimer alike after a laptop lid was closed.
pub(crate) fn boot_clock_ms() -> u64 {
    imp::boot_clock_ms()
}

/// Facts about the current process, read once.
#[derive(Debug)]
pub(crate) struct Identity {
    pub(crate) pid: u32,
    pub(crate) hostname: String,
    pub(crate) start: Option<ProcStart>,
    /// Changes at every boot; `None` where the platform has no such id.
    pub(crate) boot_id: Option<String>,
    /// The pid namespace, so two containers sharing a lock directory do not
    /// probe each other's pids.
    pub(crate) pid_ns: Option<String>,
    /// The time namespace (`/proc/self/ns/time`): `CLOCK_BOOTTIME` is
    /// offset per time namespace, so boot-clock readings of two processes
    /// of one boot compare only when this is equal. `None` where the
    /// kernel has no time namespaces (then no process of this boot has
    /// one) or the platform no boot clock to speak of.
    pub(crate) time_ns: Option<String>,
    /// Persistent across boots (`/etc/machine-id`): tells "this host after a
    /// reboot" from "another host with the same name".
    pub(crate) machine_id: Option<String>,
}

/// The current process's identity, computed on first use.
pub(crate) fn identity() -> &'static Identity {
    static IDENTITY: OnceLock<Identity> = OnceLock::new();
    IDENTITY.get_or_init(|| {
        let pid = std::process::id();
        Identity {
            pid,
            hostname: nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_default(),
            machine_id: std::fs::read_to_string("/etc/machine-id")
                .ok()
                .map(|id| id.trim().to_owned())
                .filter(|id| !id.is_empty()),
            start: process_start(u64::from(pid)),
            boot_id: imp::boot_id(),
            pid_ns: imp::pid_namespace(),
            time_ns: imp::time_namespace(),
        }
    })
}

/// What the directory watcher saw.
#[derive(Debug)]
pub(crate) enum DirEvent<'a> {
    /// An entry was removed, moved away, or closed after writing (which is
    /// also what a dying holder's descriptor does); for a watched child
    /// directory, something inside it was.
    Changed(&'a std::ffi::OsStr),
    /// Events may have been missed: recheck everything.
    Overflow,
    /// The watch ended (the directory was removed, or reading failed).
    Gone,
    /// Nothing happened for a while; a chance to stop.
    Idle,
}

/// A running watch on a lock directory.
pub(crate) use imp::DirWatch;

/// Watches `dir` on a background thread, calling `on_event` until it
/// returns `false`. `None` when the platform cannot watch (no inotify, or
/// its limits are reached); callers then poll.
pub(crate) fn watch_dir(
    dir: &std::fs::File,
    on_event: Box<dyn FnMut(DirEvent<'_>) -> bool + Send>,
) -> Option<DirWatch> {
    imp::watch_dir(dir, on_event)
}

/// Why `rename_noreplace` did not rename.
#[derive(Debug)]
pub(crate) enum RenameError {
    /// The target exists (for a directory: even an empty one).
    Exists,
    /// The filesystem cannot rename without replacing.
    Unsupported,
    Io(std::io::Error),
}

/// Renames `from` to `to` inside `dir`, failing if `to` exists in any form.
///
/// A plain `rename(2)` of a directory onto an *empty* directory replaces it,
/// which would let a publisher replace someone else's mkdir-style lock.
/// Linux (glibc) has `renameat2(RENAME_NOREPLACE)` for this; elsewhere the
/// target is checked first, which leaves a window of a few microseconds.
pub(crate) fn rename_noreplace(dir: &std::fs::File, from: &str, to: &str) -> Result<(), RenameError> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use nix::fcntl::{RenameFlags, renameat2};
        match renameat2(dir, from, dir, to, RenameFlags::RENAME_NOREPLACE) {
            Ok(()) => Ok(()),
            Err(Errno::EEXIST | Errno::ENOTEMPTY) => Err(RenameError::Exists),
            Err(Errno::EINVAL | Errno::ENOSYS) => Err(RenameError::Unsupported),
            Err(e) => Err(RenameError::Io(e.into())),
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        use nix::fcntl::{AtFlags, renameat};
        use nix::sys::stat::fstatat;
        match fstatat(dir, to, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(_) => return Err(RenameError::Exists),
            Err(Errno::ENOENT) => {}
            Err(e) => return Err(RenameError::Io(e.into())),
        }
        match renameat(dir, from, dir, to) {
            Ok(()) => Ok(()),
            Err(Errno::EEXIST | Errno::ENOTEMPTY) => Err(RenameError::Exists),
            Err(e) => Err(RenameError::Io(e.into())),
        }
    }
}
