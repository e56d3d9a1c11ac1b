//! `renameatx_np(2)` with `RENAME_EXCL` (macOS 10.12 and later), which
//! `nix` does not wrap: a rename that fails with `EEXIST` when the target
//! exists, in any form, in one step; and with `RENAME_SWAP`, an atomic
//! exchange of two entries. One of the crate's two homes of
//! `unsafe` code (tests/architecture.rs keeps it so).
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;

use nix::errno::Errno;
use nix::libc;

/// Renames `from` to `to`, both inside the directory `dir`, unless `to`
/// exists.
pub(super) fn rename_excl(dir: &File, from: &str, to: &str) -> Result<(), Errno> {
    renameatx(dir, from, to, libc::RENAME_EXCL)
}

/// Exchanges the entries `a` and `b` of the directory `dir` atomically.
pub(super) fn rename_swap(dir: &File, a: &str, b: &str) -> Result<(), Errno> {
    renameatx(dir, a, b, libc::RENAME_SWAP)
}

fn renameatx(dir: &File, from: &str, to: &str, flags: libc::c_uint) -> Result<(), Errno> {
    let from = CString::new(from).map_err(|_| Errno::EINVAL)?;
    let to = CString::new(to).map_err(|_| Errno::EINVAL)?;
    let fd = dir.as_raw_fd();
    // SAFETY: both names are NUL-terminated and live across the call; `fd`
    // is an open directory descriptor that `dir` keeps open across it.
    let rc = unsafe { libc::renameatx_np(fd, from.as_ptr(), fd, to.as_ptr(), flags) };
    if rc == 0 { Ok(()) } else { Err(Errno::last()) }
}
