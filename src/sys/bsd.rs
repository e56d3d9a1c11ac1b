//! macOS and FreeBSD: the kernel's own answers through `sysctl(3)`.
//!
//! - the start of any process: `kinfo_proc` from
//!   `{CTL_KERN, KERN_PROC, KERN_PROC_PID, pid}` (macOS `sysctl(3)`,
//!   FreeBSD `sysctl(3)` "KERN_PROC"), never a spawned `ps`;
//! - the boot: macOS `kern.bootsessionuuid`, FreeBSD `kern.boot_id` (not
//!   `kern.boottime`, which moves whenever the wall clock is stepped);
//! - the lease clock: `CLOCK_MONOTONIC`, which on both counts time asleep;
//! - waking waiters: kqueue `EVFILT_VNODE` on the lock directory and the
//!   files in it (`bsd/watch.rs`; what each event means, `sys/vnode.rs`).
//!
//! No start ticks, time or pid namespaces or OFD byte-range locks here:
//! those questions answer `None` (the poll and the lease decide).

use std::fs::File;
use std::path::PathBuf;

use nix::libc;
use nix::time::{ClockId, clock_gettime};

use super::ProcStart;
use super::kinfo;

#[cfg(target_os = "macos")]
mod rename;
mod sysctl;
mod watch;

pub(crate) use watch::DirWatch;
pub(super) use watch::watch_dir;

/// The pure parts' view of this kernel's `struct kinfo_proc`.
#[cfg(target_os = "macos")]
const LAYOUT: kinfo::Layout = kinfo::DARWIN_64;

/// FreeBSD's `struct kinfo_proc` (`<sys/user.h>`): its size, `ki_structsize`
/// at its start, `ki_pid` and `ki_start` (the start: the uptime at `fork`
/// plus the boot time, `fill_kinfo_proc`), where the `libc` crate puts them.
#[cfg(target_os = "freebsd")]
const LAYOUT: kinfo::Layout = kinfo::Layout {
    size: std::mem::size_of::<libc::kinfo_proc>(),
    size_at: Some(std::mem::offset_of!(libc::kinfo_proc, ki_structsize)),
    pid_at: std::mem::offset_of!(libc::kinfo_proc, ki_pid),
    sec_at: std::mem::offset_of!(libc::kinfo_proc, ki_start) + std::mem::offset_of!(libc::timeval, tv_sec),
    sec_len: std::mem::size_of::<libc::time_t>(),
    usec_at: std::mem::offset_of!(libc::kinfo_proc, ki_start) + std::mem::offset_of!(libc::timeval, tv_usec),
    usec_len: std::mem::size_of::<libc::suseconds_t>(),
};

/// The start of `pid` as the kernel states it, on the wall clock.
fn start_ms(pid: u64) -> Option<u64> {
    let pid = libc::pid_t::try_from(pid).ok().filter(|&p| p > 0)?;
    let mut mib = [libc::CTL_KERN, libc::KERN_PROC, libc::KERN_PROC_PID, pid];
    let mut buf = [0u8; 2048];
    let reply = sysctl::by_mib(&mut mib, &mut buf)?;
    let (sec, usec) = kinfo::kinfo_start(reply, LAYOUT, pid)?;
    kinfo::timeval_ms(sec, usec)
}

pub(super) fn process_start(pid: u64) -> Option<ProcStart> {
    let start = start_ms(pid)?;
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

/// pi-research's `startTime` here: whole seconds since the epoch, the
/// `kinfo_proc` start that its process-lifecycle service reads through
/// `ps -o lstart=`.
pub(super) fn own_start_time(start: Option<ProcStart>) -> Option<u64> {
    start.as_ref().map(kinfo::start_time_s)
}

pub(super) fn time_namespace_of(_pid: u64) -> Option<String> {
    None
}

/// The lease clock, `CLOCK_MONOTONIC` on both kernels.
///
/// macOS `clock_gettime(3)`: `CLOCK_MONOTONIC` "will continue to
/// increment while the system is asleep" (unlike `CLOCK_UPTIME_RAW`,
/// `mach_absolute_time`).
///
/// FreeBSD `clock_gettime(2)`: `CLOCK_MONOTONIC` "increments in SI
/// seconds"; `CLOCK_UPTIME` "increments ... while the machine is running"
/// and `CLOCK_BOOTTIME` is an alias of `CLOCK_UPTIME` (not Linux's
/// `CLOCK_BOOTTIME`), so `CLOCK_MONOTONIC` is the one documented not to
/// stop in suspend.
fn boot_clock() -> Option<(u64, u64)> {
    let t = clock_gettime(ClockId::CLOCK_MONOTONIC).ok()?;
    Some((u64::try_from(t.tv_sec()).ok()?, u64::try_from(t.tv_nsec()).ok()?))
}

pub(super) fn boot_clock_ms() -> u64 {
    boot_clock_us() / 1000
}

pub(super) fn boot_clock_us() -> u64 {
    boot_clock().map_or(0, |(secs, nanos)| {
        secs.saturating_mul(1_000_000).saturating_add(nanos / 1000)
    })
}

/// `CLOCK_MONOTONIC` counts from "an arbitrary point" (both man pages), so
/// "now minus it" is not known to be the boot.
pub(super) fn boot_clock_is_host_wide() -> bool {
    false
}

/// macOS: `kern.bootsessionuuid`, a UUID made at each boot
/// (`sysctlbyname(3)`; `sysctl kern.bootsessionuuid`).
#[cfg(target_os = "macos")]
pub(super) fn boot_id() -> Option<String> {
    let mut buf = [0u8; 128];
    kinfo::boot_session_uuid(sysctl::by_name(c"kern.bootsessionuuid", &mut buf)?)
}

/// FreeBSD: `kern.boot_id`, 16 random bytes drawn once per boot
/// (`sysctlbyname(3)`; `sysctl -b kern.boot_id`). A kernel without it, or
/// one asked before its random generator is seeded (ENXIO), gives none:
/// `kern.boottime` is no substitute, since stepping the wall clock (and
/// resuming from suspend) moves it within one boot.
#[cfg(target_os = "freebsd")]
pub(super) fn boot_id() -> Option<String> {
    let mut buf = [0u8; 16];
    kinfo::boot_id_bytes(sysctl::by_name(c"kern.boot_id", &mut buf)?)
}

pub(super) fn pid_namespace() -> Option<String> {
    None
}

pub(super) fn time_namespace() -> Option<String> {
    None
}

/// Whether the filesystem of `file` keeps everything in memory: not asked
/// here, so no.
pub(crate) fn fs_in_memory(_: &File) -> bool {
    false
}

/// Whether `file` is on a network filesystem: not asked here, so it counts
/// as one (the waiting line is an optimisation, left off).
pub(crate) fn fs_is_remote(_: &File) -> bool {
    true
}

/// No OFD byte-range locks here: the waiting line is off.
pub(crate) const BYTE_RANGE_LOCKS: bool = false;

/// No OFD byte-range locks here: the waiting line is off.
#[cfg(test)]
pub(crate) fn ofd_read_lock(_: &File, _start: u64, _len: u64) -> bool {
    false
}

/// No OFD byte-range locks here.
pub(crate) fn ofd_take_byte(_: &File, _at: u64) -> bool {
    false
}

/// No OFD byte-range locks here.
pub(crate) fn ofd_drop_byte(_: &File, _at: u64) {}

/// No OFD byte-range locks here: nobody is seen ahead.
pub(crate) fn ofd_held_span(_: &File, _start: u64, _end: u64) -> Option<(u64, u64)> {
    None
}

/// macOS: `/private/tmp`, the directory itself (`/tmp` is a symlink to it,
/// which the default refuses; `$TMPDIR` is per login session). No mount
/// tables to compare (see `sys::lock_root`).
#[cfg(target_os = "macos")]
pub(crate) fn lock_root() -> (PathBuf, Option<(PathBuf, PathBuf)>) {
    (PathBuf::from("/private/tmp"), None)
}

/// FreeBSD: `/tmp`, with no mount tables to compare (see `sys::lock_root`).
#[cfg(target_os = "freebsd")]
pub(crate) fn lock_root() -> (PathBuf, Option<(PathBuf, PathBuf)>) {
    (PathBuf::from("/tmp"), None)
}

/// macOS: `renameatx_np(2)` with `RENAME_EXCL` (see
/// `sys::rename_exclusive`); `Unsupported` on a filesystem without it.
#[cfg(target_os = "macos")]
pub(crate) fn rename_exclusive(dir: &File, from: &str, to: &str) -> Result<(), super::RenameError> {
    use super::RenameError;
    use nix::errno::Errno;
    match rename::rename_excl(dir, from, to) {
        Ok(()) => Ok(()),
        Err(Errno::EEXIST | Errno::ENOTEMPTY) => Err(RenameError::Exists),
        Err(Errno::ENOTSUP | Errno::EINVAL) => Err(RenameError::Unsupported),
        Err(e) => Err(RenameError::Io(e.into())),
    }
}

/// FreeBSD: no no-replace rename before FreeBSD 15 (`renameat2` there is
/// not linked against, to run on older kernels): the caller links instead.
#[cfg(target_os = "freebsd")]
pub(crate) fn rename_exclusive(_dir: &File, _from: &str, _to: &str) -> Result<(), super::RenameError> {
    Err(super::RenameError::Unsupported)
}

/// macOS: `renameatx_np(2)` with `RENAME_EXCL`; on a filesystem without it,
/// the look-first rename (see `sys::rename_noreplace`).
#[cfg(target_os = "macos")]
pub(crate) fn rename_noreplace(dir: &File, from: &str, to: &str) -> Result<(), super::RenameError> {
    match rename_exclusive(dir, from, to) {
        Err(super::RenameError::Unsupported) => super::rename_after_looking(dir, from, to),
        done => done,
    }
}

/// macOS: `renameatx_np(2)` with `RENAME_SWAP` (see `sys::exchange_at`).
#[cfg(target_os = "macos")]
pub(crate) fn exchange_at(dir: &File, a: &str, b: &str) -> Result<(), super::RenameError> {
    use super::RenameError;
    use nix::errno::Errno;
    match rename::rename_swap(dir, a, b) {
        Ok(()) => Ok(()),
        Err(Errno::ENOTSUP | Errno::EINVAL) => Err(RenameError::Unsupported),
        Err(e) => Err(RenameError::Io(e.into())),
    }
}

/// FreeBSD: no atomic exchange (see `sys::exchange_at`).
#[cfg(target_os = "freebsd")]
pub(crate) fn exchange_at(_dir: &File, _a: &str, _b: &str) -> Result<(), super::RenameError> {
    Err(super::RenameError::Unsupported)
}

/// FreeBSD: the look-first rename (see `sys::rename_noreplace`).
#[cfg(target_os = "freebsd")]
pub(crate) fn rename_noreplace(dir: &File, from: &str, to: &str) -> Result<(), super::RenameError> {
    super::rename_after_looking(dir, from, to)
}

/// Run only where these kernels run (compiled, not run, on Linux CI).
#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's start agrees, to the second, with what `ps -o lstart=`
    /// prints (so with pi-research's `startTime`), and is stable.
    #[test]
    fn kernel_start_agrees_with_ps() {
        let me = std::process::id();
        let a = process_start(u64::from(me)).expect("own kinfo_proc");
        let b = process_start(u64::from(me)).expect("own kinfo_proc");
        assert_eq!(a.epoch_ms, b.epoch_ms);
        assert!(b.age_ms.abs_diff(a.age_ms) <= 5, "{a:?} {b:?}");
        if let Some(from_ps) = super::super::ps_start_epoch_s(me) {
            assert_eq!(own_start_time(Some(a)), Some(from_ps));
        }
        assert!(process_start(0).is_none());
        assert!(boot_id().is_some());
        assert_eq!(boot_id(), boot_id());
    }

    #[test]
    fn a_reaped_child_has_no_start() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let pid = u64::from(child.id());
        child.wait().expect("wait");
        assert!(process_start(pid).is_none());
    }
}
