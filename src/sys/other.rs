//! Unix systems without `/proc`: liveness falls back to `kill(pid, 0)` and
//! leases to the wall clock, because start times and boot ids are unknown.
//! Only this process's own start is learnt (from `ps`), to be written as
//! the `startTime` that pi-research compares.

use std::fs::File;
use std::path::PathBuf;

use nix::time::{ClockId, clock_gettime};

use super::ProcStart;

pub(super) fn process_start(_pid: u64) -> Option<ProcStart> {
    None
}

pub(super) fn clock_ticks() -> Option<u64> {
    None
}

/// pi-research's `startTime` here: whole seconds since the epoch, from
/// `ps`, since the start of a process cannot be read without `/proc`.
pub(super) fn own_start_time(_start: Option<ProcStart>) -> Option<u64> {
    super::ps_start_epoch_s(std::process::id())
}

pub(super) fn time_namespace_of(_pid: u64) -> Option<String> {
    None
}

pub(super) fn boot_clock_ms() -> u64 {
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| {
            let secs = u64::try_from(t.tv_sec()).unwrap_or(0);
            let nanos = u64::try_from(t.tv_nsec()).unwrap_or(0);
            secs.saturating_mul(1000).saturating_add(nanos / 1_000_000)
        })
        .unwrap_or(0)
}

pub(super) fn boot_clock_us() -> u64 {
    boot_clock_ms().saturating_mul(1000)
}

pub(super) fn boot_clock_is_host_wide() -> bool {
    false
}

pub(super) fn boot_id() -> Option<String> {
    None
}

pub(super) fn pid_namespace() -> Option<String> {
    None
}

pub(super) fn time_namespace() -> Option<String> {
    None
}

/// No directory watching here.
#[derive(Debug)]
pub(crate) struct DirWatch;

impl DirWatch {
    pub(crate) fn watch_child(&self, _name: &str) -> bool {
        false
    }
}

pub(super) fn watch_dir(
    _dir: &std::fs::File,
    _on_event: Box<dyn FnMut(super::DirEvent<'_>) -> bool + Send>,
) -> Option<DirWatch> {
    None
}

/// Whether the filesystem of `file` keeps everything in memory: not known
/// here, so no.
pub(crate) fn fs_in_memory(_: &File) -> bool {
    false
}

/// Whether `file` is on a network filesystem: not known here, so it counts
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

/// `/tmp`, with no mount tables to compare (see `sys::lock_root`).
pub(crate) fn lock_root() -> (PathBuf, Option<(PathBuf, PathBuf)>) {
    (PathBuf::from("/tmp"), None)
}

/// No no-replace rename for files here: the caller links instead.
pub(crate) fn rename_exclusive(_dir: &File, _from: &str, _to: &str) -> Result<(), super::RenameError> {
    Err(super::RenameError::Unsupported)
}

/// No atomic exchange here (see `sys::exchange_at`).
pub(crate) fn exchange_at(_dir: &File, _a: &str, _b: &str) -> Result<(), super::RenameError> {
    Err(super::RenameError::Unsupported)
}

/// The look-first rename (see `sys::rename_noreplace`).
pub(crate) fn rename_noreplace(dir: &File, from: &str, to: &str) -> Result<(), super::RenameError> {
    super::rename_after_looking(dir, from, to)
}
