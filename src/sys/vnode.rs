//! What a kqueue `EVFILT_VNODE` event means to waiters, as pure functions
//! of its flags, so that they are tested on any host. The watcher that
//! registers and reads them is `sys/bsd/watch.rs` (macOS, FreeBSD).
//!
//! kqueue says *that* a vnode changed, never *which* entry of a directory:
//! a directory's `NOTE_WRITE` is "its entries changed", so the watcher
//! lists it anew and everyone waiting on it looks again. A holder's death
//! changes no entry: it releases the holder's `flock` (macOS posts
//! `NOTE_FUNLOCK` on the file) and closes its writable descriptors
//! (FreeBSD posts `NOTE_CLOSE_WRITE`), which only a watch on that file
//! itself sees.

/// `EVFILT_VNODE` filter flags, as `<sys/event.h>` defines them, the same
/// on macOS and FreeBSD (`kqueue(2)` of both; libc's `NOTE_*`).
/// "The unlink() system call was called on the file referenced by the
/// descriptor."
pub(crate) const NOTE_DELETE: u32 = 0x0000_0001;
/// "A write occurred on the file referenced by the descriptor": for a
/// directory, an entry was added, removed or renamed.
pub(crate) const NOTE_WRITE: u32 = 0x0000_0002;
/// "The file referenced by the descriptor was extended."
pub(crate) const NOTE_EXTEND: u32 = 0x0000_0004;
/// "The link count on the file changed" (a subdirectory made or removed).
pub(crate) const NOTE_LINK: u32 = 0x0000_0010;
/// "The file referenced by the descriptor was renamed."
pub(crate) const NOTE_RENAME: u32 = 0x0000_0020;
/// "Access to the file was revoked via revoke(2) or the underlying file
/// system was unmounted."
pub(crate) const NOTE_REVOKE: u32 = 0x0000_0040;
/// macOS only: "The file was unlocked by calling flock(2) or close(2)"
/// (FreeBSD gives this bit to `NOTE_CLOSE`, any descriptor's close).
pub(crate) const NOTE_FUNLOCK: u32 = 0x0000_0100;
/// FreeBSD only (11 and later): "A file descriptor referencing the
/// monitored file, was closed. The closed file descriptor had write
/// access."
pub(crate) const NOTE_CLOSE_WRITE: u32 = 0x0000_0200;

/// Which kernel reads the flags (the bit `0x100` means another thing on
/// each). A build for one kernel reads its own only; the tests, both.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    Darwin,
    FreeBsd,
}

/// What a watched vnode is to the watcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The lock directory itself.
    Top,
    /// A directory in it that `watch_child` named: a directory-layout lock
    /// (its holder `flock`s it and keeps `owner.json` open for writing),
    /// or a shared lock's members directory (each member `flock`s its
    /// record and keeps it open for writing).
    Child,
    /// A regular file in the lock directory or in a watched child: a lock
    /// file, a marker, `owner.json`, a member's record.
    File,
}

/// What one event says about its vnode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Nothing a waiter cares for.
    Nothing,
    /// A directory's entries changed (kqueue does not say which): list it
    /// anew, and let its waiters look again.
    Entries,
    /// A holder let go of the file or directory: its `flock` was released
    /// (macOS), or a descriptor that could write it was closed (FreeBSD);
    /// both are also what a dying holder's descriptors do.
    LetGo,
    /// It was removed, renamed or revoked: this watch of it is over.
    Ended,
}

/// The end of a vnode's watch, on either kernel.
const ENDED: u32 = NOTE_DELETE | NOTE_RENAME | NOTE_REVOKE;

/// A directory's entries changing.
const ENTRIES: u32 = NOTE_WRITE | NOTE_EXTEND | NOTE_LINK;

/// What a holder letting go of a vnode of `role` posts on `kernel`, if
/// the watcher can use it. On FreeBSD a directory-layout holder's
/// directory is opened read-only, so its death is only `NOTE_CLOSE`,
/// which every reader's close posts as well (a waiter looking would
/// wake itself): its `owner.json`'s `NOTE_CLOSE_WRITE` tells instead.
fn let_go(kernel: Kernel, role: Role) -> u32 {
    match (kernel, role) {
        (_, Role::Top) => 0,
        (Kernel::Darwin, Role::Child | Role::File) => NOTE_FUNLOCK,
        (Kernel::FreeBsd, Role::Child) => 0,
        (Kernel::FreeBsd, Role::File) => NOTE_CLOSE_WRITE,
    }
}

/// The filter flags to register for a vnode of `role` (`EV_SET`'s
/// `fflags`, `kqueue(2)`).
pub(crate) fn interest(kernel: Kernel, role: Role) -> u32 {
    let entries = match role {
        Role::Top | Role::Child => ENTRIES,
        // A record rewritten in place is no news to a waiter.
        Role::File => 0,
    };
    ENDED | entries | let_go(kernel, role)
}

/// What the returned `fflags` of an event on a vnode of `role` say; flags
/// not registered for it are ignored. An end outweighs a change of
/// entries, which outweighs a letting go (both look again).
pub(crate) fn seen(kernel: Kernel, role: Role, fflags: u32) -> Seen {
    let fflags = fflags & interest(kernel, role);
    if fflags & ENDED != 0 {
        Seen::Ended
    } else if fflags & ENTRIES != 0 {
        Seen::Entries
    } else if fflags & let_go(kernel, role) != 0 {
        Seen::LetGo
    } else {
        Seen::Nothing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOTH: [Kernel; 2] = [Kernel::Darwin, Kernel::FreeBsd];

    #[test]
    fn the_lock_directory_removed_renamed_or_revoked_ends_the_watch() {
        for kernel in BOTH {
            for flag in [NOTE_DELETE, NOTE_RENAME, NOTE_REVOKE] {
                assert_eq!(seen(kernel, Role::Top, flag | NOTE_WRITE), Seen::Ended);
                assert_eq!(seen(kernel, Role::Child, flag), Seen::Ended);
                assert_eq!(seen(kernel, Role::File, flag), Seen::Ended);
            }
        }
    }

    #[test]
    fn a_directory_write_is_a_change_of_entries_a_file_write_is_nothing() {
        for kernel in BOTH {
            for flag in [NOTE_WRITE, NOTE_EXTEND, NOTE_LINK] {
                assert_eq!(seen(kernel, Role::Top, flag), Seen::Entries);
                assert_eq!(seen(kernel, Role::Child, flag), Seen::Entries);
                assert_eq!(seen(kernel, Role::File, flag), Seen::Nothing);
            }
            assert_eq!(seen(kernel, Role::Top, 0), Seen::Nothing);
        }
    }

    #[test]
    fn a_holder_letting_go_is_its_flock_on_macos_and_its_writable_close_on_freebsd() {
        assert_eq!(seen(Kernel::Darwin, Role::File, NOTE_FUNLOCK), Seen::LetGo);
        assert_eq!(seen(Kernel::Darwin, Role::Child, NOTE_FUNLOCK), Seen::LetGo);
        assert_eq!(seen(Kernel::FreeBsd, Role::File, NOTE_CLOSE_WRITE), Seen::LetGo);
        // 0x100 is FreeBSD's NOTE_CLOSE (anyone's read-only close): never
        // registered there, and ignored if it came.
        assert_eq!(seen(Kernel::FreeBsd, Role::File, NOTE_FUNLOCK), Seen::Nothing);
        assert_eq!(interest(Kernel::FreeBsd, Role::File) & NOTE_FUNLOCK, 0);
        assert_eq!(interest(Kernel::FreeBsd, Role::Child) & NOTE_FUNLOCK, 0);
        // Nobody flocks the lock directory itself.
        for kernel in BOTH {
            assert_eq!(
                seen(kernel, Role::Top, NOTE_FUNLOCK | NOTE_CLOSE_WRITE),
                Seen::Nothing
            );
        }
        assert_eq!(seen(Kernel::Darwin, Role::File, NOTE_CLOSE_WRITE), Seen::Nothing);
    }

    #[test]
    fn what_is_registered_is_what_is_read() {
        for kernel in BOTH {
            for role in [Role::Top, Role::Child, Role::File] {
                let wanted = interest(kernel, role);
                assert_ne!(wanted & ENDED, 0, "{kernel:?} {role:?}");
                for bit in 0..32 {
                    let flag = 1u32 << bit;
                    let registered = wanted & flag != 0;
                    assert_eq!(
                        seen(kernel, role, flag) != Seen::Nothing,
                        registered,
                        "{kernel:?} {role:?} {flag:#x}"
                    );
                }
            }
        }
    }
}
