//! Linux: process start times from `/proc/<pid>/stat`, boot identity from
//! `/proc/sys/kernel/random/boot_id`, and `CLOCK_BOOTTIME`.

use std::fs::File;
use std::path::PathBuf;
use std::sync::OnceLock;

use nix::time::{ClockId, clock_gettime};
use nix::unistd::{SysconfVar, sysconf};

use super::ProcStart;

pub(super) fn process_start(pid: u64) -> Option<ProcStart> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ticks = start_ticks(&stat)?;
    let started_ms = ticks.checked_mul(1000)? / clock_ticks()?;
    // The start is kept on the boot clock; its age on that clock is exact,
    // and the epoch estimate uses today's wall clock, never a cached boot
    // time that a clock step would have made stale. The kernel shows the
    // start shifted by the *reader's* time-namespace offset, the same
    // offset as our own `CLOCK_BOOTTIME`, so the age is right whichever
    // namespace the process lives in; `ticks` is therefore only
    // comparable between readers in one time namespace.
    let age_ms = boot_clock_ms().saturating_sub(started_ms);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_millis();
    let epoch_ms = u64::try_from(now_ms).ok()?.checked_sub(age_ms)?;
    Some(ProcStart {
        ticks,
        epoch_ms,
        age_ms,
    })
}

/// Field 22 of `/proc/<pid>/stat`. The command name (field 2) may contain
/// spaces and parentheses, so fields are counted from the last `)`.
fn start_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After ")": field 3 (state) is the first; field 22 is the 20th.
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// Clock ticks per second.
pub(super) fn clock_ticks() -> Option<u64> {
    static HZ: OnceLock<Option<u64>> = OnceLock::new();
    *HZ.get_or_init(|| {
        let hz = sysconf(SysconfVar::CLK_TCK).ok()??;
        u64::try_from(hz).ok().filter(|&hz| hz > 0)
    })
}

/// pi-research's `startTime` on Linux: the start ticks themselves.
pub(super) fn own_start_time(start: Option<ProcStart>) -> Option<u64> {
    start.map(|s| s.ticks)
}

pub(super) fn time_namespace_of(pid: u64) -> Option<String> {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/time")).ok()?;
    link.into_os_string().into_string().ok()
}

pub(super) fn boot_clock_ms() -> u64 {
    boot_clock_us() / 1000
}

pub(super) fn boot_clock_us() -> u64 {
    clock_gettime(ClockId::CLOCK_BOOTTIME)
        .or_else(|_| clock_gettime(ClockId::CLOCK_MONOTONIC))
        .map(|t| {
            let secs = u64::try_from(t.tv_sec()).unwrap_or(0);
            let nanos = u64::try_from(t.tv_nsec()).unwrap_or(0);
            secs.saturating_mul(1_000_000).saturating_add(nanos / 1000)
        })
        .unwrap_or(0)
}

pub(super) fn boot_clock_is_host_wide() -> bool {
    match std::fs::read_to_string("/proc/self/timens_offsets") {
        Ok(offsets) => boottime_offset_is_zero(&offsets),
        // A kernel without time namespaces has one boot clock.
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// Reads `/proc/self/timens_offsets` (`boottime <secs> <nanos>` among
/// its lines); anything unexpected counts as shifted.
fn boottime_offset_is_zero(offsets: &str) -> bool {
    offsets
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|fields| fields.first() == Some(&"boottime"))
        .is_some_and(|fields| fields.len() == 3 && fields[1] == "0" && fields[2] == "0")
}

pub(super) fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_owned()).filter(|id| !id.is_empty())
}

pub(super) fn pid_namespace() -> Option<String> {
    namespace("pid")
}

/// The link text of `/proc/self/ns/time`, such as `time:[4026531834]`;
/// `None` on kernels without time namespaces (before 5.6, or built
/// without them).
pub(super) fn time_namespace() -> Option<String> {
    namespace("time")
}

fn namespace(kind: &str) -> Option<String> {
    let link = std::fs::read_link(format!("/proc/self/ns/{kind}")).ok()?;
    link.into_os_string().into_string().ok()
}

/// The inotify instance behind a directory watch, shared with its thread.
#[derive(Debug)]
pub(crate) struct DirWatch {
    inotify: std::sync::Arc<nix::sys::inotify::Inotify>,
    top: std::os::fd::RawFd,
    children: std::sync::Arc<
        std::sync::Mutex<std::collections::HashMap<nix::sys::inotify::WatchDescriptor, std::ffi::OsString>>,
    >,
}

impl DirWatch {
    /// Also watches the child directory `name` (a directory-strategy lock),
    /// whose events are then reported as `Changed(name)`. Symlinks are not
    /// followed. Returns whether the watch is in place.
    pub(crate) fn watch_child(&self, name: &str) -> bool {
        use nix::sys::inotify::AddWatchFlags;
        let path = format!("/proc/self/fd/{}/{name}", self.top);
        let mask = AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_ONLYDIR
            | AddWatchFlags::IN_DONT_FOLLOW;
        match self.inotify.add_watch(path.as_str(), mask) {
            Ok(wd) => {
                let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
                children.insert(wd, name.into());
                true
            }
            Err(_) => false,
        }
    }
}

pub(super) fn watch_dir(
    dir: &std::fs::File,
    mut on_event: Box<dyn FnMut(super::DirEvent<'_>) -> bool + Send>,
) -> Option<DirWatch> {
    use std::os::fd::{AsFd, AsRawFd};
    use std::sync::{Arc, Mutex};

    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

    use super::DirEvent;

    let inotify = Arc::new(Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).ok()?);
    // Watch the inode we opened, not whatever the path names now. The
    // descriptor outlives the watch: the Locker owns both.
    let top = dir.as_raw_fd();
    let mask = AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR;
    let top_wd = inotify
        .add_watch(format!("/proc/self/fd/{top}").as_str(), mask)
        .ok()?;
    let children = Arc::new(Mutex::new(std::collections::HashMap::new()));
    let watch = DirWatch {
        inotify: Arc::clone(&inotify),
        top,
        children: Arc::clone(&children),
    };
    let spawned = std::thread::Builder::new()
        .name("leasehold-watch".into())
        .spawn(move || {
            loop {
                let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
                match poll(&mut fds, PollTimeout::from(500u16)) {
                    Ok(0) => {
                        if !on_event(DirEvent::Idle) {
                            return;
                        }
                        continue;
                    }
                    Ok(_) => {}
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(_) => {
                        on_event(DirEvent::Gone);
                        return;
                    }
                }
                let events = match inotify.read_events() {
                    Ok(events) => events,
                    Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => continue,
                    Err(_) => {
                        on_event(DirEvent::Gone);
                        return;
                    }
                };
                // A release or a creation is several events on one name
                // (the lock's removal, its mutation lock's, a close): one
                // report per name per batch is enough, since whoever is
                // woken looks after every event read here had happened,
                // and a second report only wakes it again for nothing.
                let mut reported: Vec<std::ffi::OsString> = Vec::new();
                let mut first_time = |name: &std::ffi::OsStr| {
                    if reported.iter().any(|seen| seen == name) {
                        return false;
                    }
                    reported.push(name.to_owned());
                    true
                };
                for event in &events {
                    let keep_going = if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                        on_event(DirEvent::Overflow)
                    } else if event.wd == top_wd {
                        let gone = event.mask.intersects(
                            AddWatchFlags::IN_DELETE_SELF
                                | AddWatchFlags::IN_MOVE_SELF
                                | AddWatchFlags::IN_IGNORED,
                        );
                        if gone {
                            // A watch on a removed directory is dead: let callers poll.
                            on_event(DirEvent::Gone);
                            return;
                        }
                        match &event.name {
                            Some(name) if first_time(name) => on_event(DirEvent::Changed(name)),
                            _ => true,
                        }
                    } else {
                        let mut children = children.lock().unwrap_or_else(|e| e.into_inner());
                        let name = if event.mask.contains(AddWatchFlags::IN_IGNORED) {
                            children.remove(&event.wd)
                        } else {
                            children.get(&event.wd).cloned()
                        };
                        drop(children);
                        match name {
                            Some(name) if first_time(std::ffi::OsStr::new(&name)) => {
                                on_event(DirEvent::Changed(&name))
                            }
                            _ => true,
                        }
                    };
                    if !keep_going {
                        return;
                    }
                }
            }
        });
    spawned.ok().map(|_| watch)
}

/// Whether the filesystem of `file` keeps everything in memory (tmpfs),
/// where a sync returns at once and nothing outlives a reboot anyway
/// (`fstatfs(2)`).
pub(crate) fn fs_in_memory(file: &File) -> bool {
    use nix::sys::statfs::{TMPFS_MAGIC, fstatfs};
    fstatfs(file).is_ok_and(|fs| fs.filesystem_type() == TMPFS_MAGIC)
}

/// Whether `file` is on a filesystem served over the network (or by a
/// user-space server), where a byte-range lock can be a round trip
/// (`fstatfs(2)`; an unknown answer counts as remote).
pub(crate) fn fs_is_remote(file: &File) -> bool {
    use nix::sys::statfs::fstatfs;
    // NFS, SMB, CIFS, SMB2, FUSE, Ceph, 9P, AFS, Coda, GFS2, OCFS2, Lustre.
    const REMOTE: [i128; 12] = [
        0x6969,
        0x517B,
        0xFF53_4D42,
        0xFE53_4D42,
        0x6573_5546,
        0x00C3_6400,
        0x0102_1997,
        0x5346_414F,
        0x7377_3773,
        0x0116_1970,
        0x7461_636f,
        0x0BD0_0BD0,
    ];
    fstatfs(file).map_or(true, |fs| REMOTE.contains(&i128::from(fs.filesystem_type().0)))
}

/// Whether OFD byte-range locks are there to line waiters up with.
pub(crate) const BYTE_RANGE_LOCKS: bool = true;

/// An OFD byte-range lock request (`fcntl(2)`, "Open file description
/// locks") of `kind` over `[start, start + len)`.
fn ofd_range(kind: i32, start: u64, len: u64) -> Option<nix::libc::flock> {
    Some(nix::libc::flock {
        l_type: i16::try_from(kind).ok()?,
        l_whence: i16::try_from(nix::libc::SEEK_SET).ok()?,
        l_start: i64::try_from(start).ok()?,
        l_len: i64::try_from(len).ok()?,
        // Must be 0 for OFD locks.
        l_pid: 0,
    })
}

/// Takes an OFD read lock on `[start, start + len)` of `file`, without
/// waiting; whether it was taken.
pub(crate) fn ofd_read_lock(file: &File, start: u64, len: u64) -> bool {
    use nix::fcntl::{FcntlArg, fcntl};
    ofd_range(nix::libc::F_RDLCK, start, len)
        .is_some_and(|lock| fcntl(file, FcntlArg::F_OFD_SETLK(&lock)).is_ok())
}

/// Holds the byte at `at` of `dir` (a read lock, so that holders of one
/// byte do not exclude each other); whether it is held.
pub(crate) fn ofd_take_byte(dir: &File, at: u64) -> bool {
    ofd_read_lock(dir, at, 1)
}

/// Lets go of the byte at `at` of `dir`.
pub(crate) fn ofd_drop_byte(dir: &File, at: u64) {
    use nix::fcntl::{FcntlArg, fcntl};
    if let Some(lock) = ofd_range(nix::libc::F_UNLCK, at, 1) {
        let _ = fcntl(dir, FcntlArg::F_OFD_SETLK(&lock));
    }
}

/// A byte-range lock that another open file description holds on `dir`
/// overlapping `[start, end)` (the kernel reports one, `F_OFD_GETLK`), if
/// any: its span.
pub(crate) fn ofd_held_span(dir: &File, start: u64, end: u64) -> Option<(u64, u64)> {
    use nix::fcntl::{FcntlArg, fcntl};
    // The top of the byte range a lock can name (`off_t` is signed).
    const TOP: u64 = i64::MAX as u64;
    let end = end.min(TOP);
    if end <= start {
        return None;
    }
    let mut lock = ofd_range(nix::libc::F_WRLCK, start, end - start)?;
    fcntl(dir, FcntlArg::F_OFD_GETLK(&mut lock)).ok()?;
    if i32::from(lock.l_type) == nix::libc::F_UNLCK {
        return None;
    }
    let s = u64::try_from(lock.l_start).ok()?;
    // A length of 0 runs to the end of any file.
    let e = match u64::try_from(lock.l_len).ok()? {
        0 => TOP,
        len => s.saturating_add(len).min(TOP),
    };
    Some((s, e))
}

/// `/run/lock`, and the mount tables of `/proc` (see `sys::lock_root`).
pub(crate) fn lock_root() -> (PathBuf, Option<(PathBuf, PathBuf)>) {
    (
        PathBuf::from("/run/lock"),
        Some(("/proc/self/mountinfo".into(), "/proc/1/mountinfo".into())),
    )
}

/// `renameat2(2)` with `RENAME_NOREPLACE` (glibc; see `sys::rename_exclusive`).
pub(crate) fn rename_exclusive(dir: &File, from: &str, to: &str) -> Result<(), super::RenameError> {
    #[cfg(target_env = "gnu")]
    {
        rename_noreplace(dir, from, to)
    }
    #[cfg(not(target_env = "gnu"))]
    {
        let _ = (dir, from, to);
        Err(super::RenameError::Unsupported)
    }
}

/// `renameat2(2)` with `RENAME_EXCHANGE` (glibc; see `sys::exchange_at`).
pub(crate) fn exchange_at(dir: &File, a: &str, b: &str) -> Result<(), super::RenameError> {
    #[cfg(target_env = "gnu")]
    {
        use super::RenameError;
        use nix::errno::Errno;
        use nix::fcntl::{RenameFlags, renameat2};
        match renameat2(dir, a, dir, b, RenameFlags::RENAME_EXCHANGE) {
            Ok(()) => Ok(()),
            Err(Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP) => Err(RenameError::Unsupported),
            Err(e) => Err(RenameError::Io(e.into())),
        }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        let _ = (dir, a, b);
        Err(super::RenameError::Unsupported)
    }
}

/// `renameat2(2)` with `RENAME_NOREPLACE` (glibc); the look-first rename
/// elsewhere (see `sys::rename_noreplace`).
pub(crate) fn rename_noreplace(dir: &File, from: &str, to: &str) -> Result<(), super::RenameError> {
    #[cfg(target_env = "gnu")]
    {
        use super::RenameError;
        use nix::errno::Errno;
        use nix::fcntl::{RenameFlags, renameat2};
        match renameat2(dir, from, dir, to, RenameFlags::RENAME_NOREPLACE) {
            Ok(()) => Ok(()),
            Err(Errno::EEXIST | Errno::ENOTEMPTY) => Err(RenameError::Exists),
            Err(Errno::EINVAL | Errno::ENOSYS) => Err(RenameError::Unsupported),
            Err(e) => Err(RenameError::Io(e.into())),
        }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        super::rename_after_looking(dir, from, to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_ticks_skips_hostile_command_names() {
        let stat = "42 (a) b) c (d) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 50";
        assert_eq!(start_ticks(stat), Some(123_456));
        assert_eq!(start_ticks("garbage"), None);
        assert_eq!(start_ticks("1 (x) S 1"), None);
    }

    #[test]
    fn only_an_unshifted_boot_clock_is_host_wide() {
        assert!(boottime_offset_is_zero("monotonic 0 0\nboottime 0 0\n"));
        assert!(boottime_offset_is_zero(
            "monotonic           0         0\nboottime            0         0\n"
        ));
        assert!(!boottime_offset_is_zero("monotonic 0 0\nboottime -100 0\n"));
        assert!(!boottime_offset_is_zero("monotonic 0 0\nboottime 0 5\n"));
        assert!(!boottime_offset_is_zero("monotonic 0 0\n"));
        assert!(!boottime_offset_is_zero("boottime 0"));
        assert!(!boottime_offset_is_zero(""));
    }

    #[test]
    fn own_start_is_readable_and_stable() {
        let me = u64::from(std::process::id());
        let started = std::time::Instant::now();
        let a = process_start(me).expect("own /proc entry");
        let b = process_start(me).expect("own /proc entry");
        // However long the two reads took (a stalled machine: 100 ms and
        // more), rounded up.
        let apart = started.elapsed().as_millis() as u64 + 1;
        // The start itself is exact; its epoch estimate and age come from
        // clocks read a moment apart, so they may cross a millisecond,
        // and the age grows by the time between the reads.
        assert_eq!(a.ticks, b.ticks);
        assert!(
            a.epoch_ms.abs_diff(b.epoch_ms) <= 5 + apart,
            "{a:?} {b:?} ({apart} ms apart)"
        );
        assert!(
            b.age_ms.abs_diff(a.age_ms) <= 5 + apart,
            "{a:?} {b:?} ({apart} ms apart)"
        );
        assert!(boot_id().is_some());
        // Not older than the boot clock: start and clock share an offset.
        assert!(a.age_ms <= boot_clock_ms());
    }
}
