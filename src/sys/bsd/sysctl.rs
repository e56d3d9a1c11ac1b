//! `sysctl(3)`, which `nix` does not wrap: the one place of the crate with
//! `unsafe` code (tests/architecture.rs keeps it so). Each call passes a
//! buffer it owns with its length and no new value, so the kernel only
//! writes into that buffer, at most that many bytes.
#![allow(unsafe_code)]

use std::ffi::CStr;

use nix::libc;

/// Reads the value named by the numbers `mib` into `buf` (`sysctl(3)`);
/// the bytes the kernel wrote, or `None` when it refused.
pub(super) fn by_mib<'a>(mib: &mut [libc::c_int], buf: &'a mut [u8]) -> Option<&'a [u8]> {
    let count = libc::c_uint::try_from(mib.len()).ok()?;
    let mut len: libc::size_t = buf.len();
    // SAFETY: `mib` holds `count` ints; `buf` is writable for `len` bytes,
    // and the kernel writes no more than `len` and stores the count in
    // `len`; no new value is set (null, 0).
    let rc = unsafe {
        libc::sysctl(
            mib.as_mut_ptr(),
            count,
            buf.as_mut_ptr().cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    (rc == 0).then(|| &buf[..len.min(buf.len())])
}

/// Reads the value named `name` into `buf` (`sysctlbyname(3)`); the bytes
/// the kernel wrote, or `None` when it refused.
pub(super) fn by_name<'a>(name: &CStr, buf: &'a mut [u8]) -> Option<&'a [u8]> {
    let mut len: libc::size_t = buf.len();
    // SAFETY: `name` is NUL-terminated; `buf` is writable for `len` bytes
    // (see `by_mib`); no new value is set.
    let rc = unsafe {
        libc::sysctlbyname(
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    (rc == 0).then(|| &buf[..len.min(buf.len())])
}
