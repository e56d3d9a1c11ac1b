//! Who owns a directory and who else may change it: Windows' access
//! control lists in the place of Unix's owner and mode bits.
//!
//! A directory is this user's when its owner is the user of this
//! process's token (or the token's default owner, which for an elevated
//! administrator is the Administrators group). It is open to others when
//! its discretionary access list lets anyone but that user, the local
//! system, the Administrators group or the owner of what an entry applies
//! to (CREATOR OWNER, OWNER RIGHTS) create, delete or rename entries in
//! it, or change its access list or owner; reading and listing it are
//! left to anyone the list lets read (they grant no power over a holder).
//! No list at all lets everyone do everything, so it is open. An entry that
//! applies only to what is made inside the directory (inherit-only) counts
//! too, and so does any kind of allowing entry this reading does not know
//! (an object or conditional one): the directory is then called open.
//!
//! Every file and directory leasehold makes gets an access list of its
//! own, not inherited ([`private`]): full control for this process's user,
//! the local system and the administrators, nothing for anyone else, as
//! Unix makes them mode 0600. So another user cannot open a lock file at
//! all, and cannot hold a byte-range lock over a record (Windows' locks
//! are mandatory: one over the record would stop its holder's renewals).

#![allow(unsafe_code)]

use std::fs::File;
use std::os::windows::io::AsRawHandle;

use windows_sys::Win32::Foundation as win;
use windows_sys::Win32::Security as sec;
use windows_sys::Win32::Security::Authorization as authz;
use windows_sys::Win32::System::Threading as threading;

/// The rights that change a directory's entries or its protection.
const CHANGING: u32 = 0x0002 // FILE_ADD_FILE
    | 0x0004 // FILE_ADD_SUBDIRECTORY
    | 0x0040 // FILE_DELETE_CHILD
    | 0x0001_0000 // DELETE
    | 0x0004_0000 // WRITE_DAC
    | 0x0008_0000 // WRITE_OWNER
    | 0x1000_0000 // GENERIC_ALL
    | 0x4000_0000; // GENERIC_WRITE

/// `ACCESS_ALLOWED_ACE_TYPE`.
const ALLOWED: u8 = 0;
/// The denying and auditing kinds of entry (`ACCESS_DENIED_ACE_TYPE`,
/// `SYSTEM_AUDIT_ACE_TYPE`, `SYSTEM_ALARM_ACE_TYPE`, their object and
/// callback forms, and the mandatory label, resource attribute, scoped
/// policy and trust kinds), which grant nothing.
const GRANTS_NOTHING: [u8; 13] = [1, 2, 3, 6, 7, 8, 10, 12, 13, 15, 17, 18, 19];

/// A security descriptor the system allocated, freed when dropped.
struct Descriptor(sec::PSECURITY_DESCRIPTOR);

impl Drop for Descriptor {
    fn drop(&mut self) {
        // SAFETY: the descriptor came from GetSecurityInfo, which asks for
        // it to be freed with LocalFree, once.
        unsafe { win::LocalFree(self.0) };
    }
}

/// The owner or the access list of `dir`, with the descriptor that holds
/// it (the pointer is valid while the descriptor lives).
fn security(dir: &File, what: u32) -> std::io::Result<(Descriptor, sec::PSID, *mut sec::ACL)> {
    let mut owner: sec::PSID = std::ptr::null_mut();
    let mut dacl: *mut sec::ACL = std::ptr::null_mut();
    let mut descriptor: sec::PSECURITY_DESCRIPTOR = std::ptr::null_mut();
    // SAFETY: the handle is open while `dir` lives; the out-pointers are
    // writable, and the ones not asked for are null, as the call allows.
    let status = unsafe {
        authz::GetSecurityInfo(
            dir.as_raw_handle(),
            authz::SE_FILE_OBJECT,
            what,
            &mut owner,
            std::ptr::null_mut(),
            &mut dacl,
            std::ptr::null_mut(),
            &mut descriptor,
        )
    };
    if status != win::ERROR_SUCCESS {
        return Err(std::io::Error::from_raw_os_error(
            i32::try_from(status).unwrap_or(i32::MAX),
        ));
    }
    Ok((Descriptor(descriptor), owner, dacl))
}

/// One piece of this process's token: its user, or its default owner.
fn token_sid(class: sec::TOKEN_INFORMATION_CLASS) -> std::io::Result<Vec<u8>> {
    let mut token: win::HANDLE = std::ptr::null_mut();
    // SAFETY: the pseudo-handle of this process needs no closing; `token`
    // is writable and, on success, a handle closed below.
    if unsafe { threading::OpenProcessToken(threading::GetCurrentProcess(), sec::TOKEN_QUERY, &mut token) }
        == 0
    {
        return Err(std::io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 256];
    let mut len = 0u32;
    let asked = loop {
        // SAFETY: `token` is open; `buf` is writable for its length, and
        // the call says in `len` how much it needs when that is too short.
        let ok = unsafe {
            sec::GetTokenInformation(
                token,
                class,
                buf.as_mut_ptr().cast(),
                u32::try_from(buf.len()).unwrap_or(u32::MAX),
                &mut len,
            )
        };
        if ok != 0 {
            break Ok(());
        }
        let e = std::io::Error::last_os_error();
        let needed = usize::try_from(len).unwrap_or(0);
        if e.raw_os_error() == i32::try_from(win::ERROR_INSUFFICIENT_BUFFER).ok() && needed > buf.len() {
            buf.resize(needed, 0);
            continue;
        }
        break Err(e);
    };
    // SAFETY: opened above, closed once.
    unsafe { win::CloseHandle(token) };
    asked.map(|()| buf)
}

/// The SID a `TOKEN_USER` or `TOKEN_OWNER` in `buf` points at (both begin
/// with it).
fn sid_in(buf: &[u8]) -> sec::PSID {
    // SAFETY: `buf` holds a TOKEN_USER or TOKEN_OWNER as the system wrote
    // it, whose first field is a pointer to a SID inside `buf`; the read is
    // unaligned-safe.
    unsafe { std::ptr::read_unaligned(buf.as_ptr().cast::<sec::PSID>()) }
}

/// Whether two SIDs are the same.
fn same(a: sec::PSID, b: sec::PSID) -> bool {
    // SAFETY: both point at valid SIDs (from the system, kept alive by the
    // caller).
    !a.is_null() && !b.is_null() && unsafe { sec::EqualSid(a, b) } != 0
}

/// A well-known SID, as bytes.
fn well_known(kind: sec::WELL_KNOWN_SID_TYPE) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 68]; // SECURITY_MAX_SID_SIZE
    let mut len = u32::try_from(buf.len()).ok()?;
    // SAFETY: `buf` is writable for `len` bytes; no domain is needed for
    // the kinds asked here.
    let ok =
        unsafe { sec::CreateWellKnownSid(kind, std::ptr::null_mut(), buf.as_mut_ptr().cast(), &mut len) };
    (ok != 0).then_some(buf)
}

/// Whether `dir` belongs to this process's user (see the module docs).
pub(crate) fn owned_by_me(dir: &File) -> std::io::Result<bool> {
    let (_held, owner, _) = security(dir, sec::OWNER_SECURITY_INFORMATION)?;
    let user = token_sid(sec::TokenUser)?;
    let default_owner = token_sid(sec::TokenOwner)?;
    Ok(same(owner, sid_in(&user)) || same(owner, sid_in(&default_owner)))
}

/// Whether anyone but this user, the system and the administrators may
/// change `dir` (see the module docs).
pub(crate) fn open_to_others(dir: &File) -> std::io::Result<bool> {
    let (_held, _, dacl) = security(dir, sec::DACL_SECURITY_INFORMATION)?;
    if dacl.is_null() {
        return Ok(true);
    }
    let user = token_sid(sec::TokenUser)?;
    // CREATOR OWNER and OWNER RIGHTS stand for whoever owns what they
    // apply to: a file this user makes is this user's.
    let trusted: Vec<Vec<u8>> = [
        sec::WinLocalSystemSid,
        sec::WinBuiltinAdministratorsSid,
        sec::WinCreatorOwnerSid,
        sec::WinCreatorOwnerRightsSid,
    ]
    .into_iter()
    .filter_map(well_known)
    .collect();
    // SAFETY: `dacl` points into the descriptor `_held` keeps alive.
    let count = unsafe { (*dacl).AceCount };
    for index in 0..u32::from(count) {
        let mut ace: *mut core::ffi::c_void = std::ptr::null_mut();
        // SAFETY: `index` is below the list's count; `ace` is writable.
        if unsafe { sec::GetAce(dacl, index, &mut ace) } == 0 || ace.is_null() {
            continue;
        }
        let ace = ace.cast::<sec::ACCESS_ALLOWED_ACE>();
        // SAFETY: every entry starts with an ACE_HEADER; only entries whose
        // type says ACCESS_ALLOWED_ACE are read further as one.
        let header = unsafe { (*ace).Header };
        if GRANTS_NOTHING.contains(&header.AceType) {
            continue;
        }
        if header.AceType != ALLOWED {
            // An allowing entry of a kind not read here: open, to be safe.
            return Ok(true);
        }
        // SAFETY: as above; the SID begins at `SidStart` and lies within
        // the entry.
        let (mask, sid) = unsafe { ((*ace).Mask, std::ptr::addr_of_mut!((*ace).SidStart).cast()) };
        if mask & CHANGING == 0 {
            continue;
        }
        let ours =
            same(sid, sid_in(&user)) || trusted.iter().any(|t| same(sid, t.as_ptr().cast_mut().cast()));
        if !ours {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The security descriptor every file and directory leasehold makes gets
/// (see the module docs), made once; `None` where it cannot be made (the
/// new file then gets what its directory passes on).
pub(crate) fn private() -> Option<sec::PSECURITY_DESCRIPTOR> {
    /// The descriptor's address, as an integer so that it may be shared
    /// between threads (it is only ever read after it is made).
    static PRIVATE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    PRIVATE
        .get_or_init(|| {
            let user = token_sid(sec::TokenUser).ok()?;
            let mut text: windows_sys::core::PWSTR = std::ptr::null_mut();
            // SAFETY: `user` holds a TOKEN_USER whose SID lives in `user`;
            // `text` receives a string the system allocates, freed below.
            if unsafe { authz::ConvertSidToStringSidW(sid_in(&user), &mut text) } == 0 {
                return None;
            }
            // SAFETY: on success `text` is a NUL-terminated UTF-16 string.
            let len = (0..).take_while(|&i| unsafe { *text.add(i) } != 0).count();
            // SAFETY: `len` units were just read one by one.
            let sid = String::from_utf16_lossy(unsafe { std::slice::from_raw_parts(text, len) });
            // SAFETY: allocated by ConvertSidToStringSidW, freed once.
            unsafe { win::LocalFree(text.cast()) };
            // A protected list (P: nothing inherited): full access (FA) for
            // the user, the local system (SY) and the administrators (BA).
            let sddl: Vec<u16> = format!("D:P(A;;FA;;;{sid})(A;;FA;;;SY)(A;;FA;;;BA)")
                .encode_utf16()
                .chain(std::iter::once(0))
                .collect();
            let mut descriptor: sec::PSECURITY_DESCRIPTOR = std::ptr::null_mut();
            // SAFETY: `sddl` is a NUL-terminated UTF-16 string; the
            // descriptor the system allocates is kept for the process.
            let ok = unsafe {
                authz::ConvertStringSecurityDescriptorToSecurityDescriptorW(
                    sddl.as_ptr(),
                    authz::SDDL_REVISION_1,
                    &mut descriptor,
                    std::ptr::null_mut(),
                )
            };
            (ok != 0 && !descriptor.is_null()).then_some(descriptor as usize)
        })
        .map(|address| address as sec::PSECURITY_DESCRIPTOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What leasehold makes is the user's alone. (Under Wine every file
    /// reads back so, whatever it was made with: there this shows only that
    /// the private descriptor is made and taken without error.)
    #[test]
    fn what_leasehold_makes_is_the_users_alone() {
        let dir = tempfile::tempdir().unwrap();
        let dir_handle = super::super::syscall::open_dir(dir.path()).unwrap();
        assert!(private().is_some(), "the private descriptor is made");
        let file =
            super::super::syscall::open_at(&dir_handle, "x.lock", super::super::syscall::Open::CreateNew)
                .unwrap();
        let read = std::fs::File::open(dir.path().join("x.lock")).unwrap();
        assert!(owned_by_me(&read).unwrap(), "owned by this user");
        assert!(!open_to_others(&read).unwrap(), "nobody else may change it");
        super::super::syscall::mkdir_at(&dir_handle, "d.members").unwrap();
        let sub = super::super::syscall::open_dir(&dir.path().join("d.members")).unwrap();
        assert!(owned_by_me(&sub).unwrap());
        assert!(!open_to_others(&sub).unwrap());
        drop((file, read, sub, dir_handle));
    }
}
