//! Platform probes behind one internal contract.
//!
//! Everything the staleness rules need to know about processes and clocks on
//! this host comes through here, so `nix` and errno types stay inside `sys/`.
//! Linux answers every question from `/proc`; other Unix systems answer the
//! portable ones (`kill(pid, 0)`, the monotonic clock) and return `None` for
//! the rest, which the staleness rules treat as "cannot decide", never as
//! "dead".

#[cfg(any(target_os = "macos", target_os = "freebsd"))]
mod bsd;
#[cfg(any(target_os = "macos", target_os = "freebsd", windows, test))]
#[cfg_attr(windows, allow(dead_code))]
pub(crate) mod kinfo;
#[cfg(target_os = "linux")]
mod linux;
#[cfg(not(any(target_os = "linux", target_os = "macos", target_os = "freebsd", windows)))]
mod other;
#[cfg(any(target_os = "macos", target_os = "freebsd", test))]
pub(crate) mod vnode;
#[cfg(windows)]
mod windows;

#[cfg(unix)]
pub(crate) mod syscall;
#[cfg(windows)]
pub(crate) use windows::syscall;

#[cfg(any(target_os = "macos", target_os = "freebsd"))]
use bsd as imp;
#[cfg(target_os = "linux")]
use linux as imp;
#[cfg(not(any(target_os = "linux", target_os = "macos", target_os = "freebsd", windows)))]
use other as imp;
#[cfg(windows)]
use windows as imp;

// The portable answers (`other.rs`) on Linux too, for tests: with the
// feature `portable-test` and `LEASEHOLD_TEST_PORTABLE=1` in the
// environment, every probe below answers as a platform without `/proc`,
// inotify or OFD locks would (see `portable`).
// Its watcher is never called: under the switch `watch_dir` answers
// `None` itself, as `other.rs` would.
#[cfg(all(target_os = "linux", feature = "portable-test"))]
#[path = "sys/other.rs"]
#[allow(dead_code)]
mod fallback;

use std::sync::OnceLock;

/// The environment variable that, in a build with the test-only feature
/// `portable-test`, selects the portable answers on Linux.
#[cfg(all(target_os = "linux", feature = "portable-test"))]
const PORTABLE_ENV: &str = "LEASEHOLD_TEST_PORTABLE";

/// Whether this process answers as a platform without `/proc`, inotify or
/// OFD locks (`other.rs`) although it runs on Linux: only in a build with
/// the test-only feature `portable-test`, and only when
/// `LEASEHOLD_TEST_PORTABLE=1`. Read once, at the first probe, and never
/// again: the clocks, the identity and the line must not change source in
/// the middle of a run, or a lease measured on one clock would be checked
/// on another. Child processes inherit the variable, so every process of a
/// test answers alike. Without the feature this is a constant `false`,
/// and the hot paths pay nothing.
#[cfg(all(target_os = "linux", feature = "portable-test"))]
pub(crate) fn portable() -> bool {
    switch() == Some(Switch::Portable)
}

/// What `LEASEHOLD_TEST_PORTABLE` asks for.
#[cfg(all(target_os = "linux", feature = "portable-test"))]
#[derive(Clone, Copy, PartialEq, Eq)]
enum Switch {
    /// `1`: every portable answer.
    Portable,
    /// `noline`: only the waiting line off, as on a platform that can
    /// watch directories but has no OFD locks (macOS and FreeBSD with
    /// kqueue), for measuring what the line is worth.
    NoLine,
    /// `nowatch`: only the directory watcher off, as on Linux when
    /// inotify's limits are reached (or on a platform that has byte-range
    /// locks but no watching).
    NoWatch,
}

/// The switch's setting, read once.
#[cfg(all(target_os = "linux", feature = "portable-test"))]
fn switch() -> Option<Switch> {
    static ON: OnceLock<Option<Switch>> = OnceLock::new();
    *ON.get_or_init(|| match std::env::var_os(PORTABLE_ENV)?.to_str()? {
        "1" => Some(Switch::Portable),
        "noline" => Some(Switch::NoLine),
        "nowatch" => Some(Switch::NoWatch),
        _ => None,
    })
}

/// Whether the switch turns only the directory watcher off (`nowatch`).
#[cfg(all(target_os = "linux", feature = "portable-test"))]
fn watching_off() -> bool {
    switch() == Some(Switch::NoWatch)
}

/// Never without the test-only feature `portable-test`.
#[cfg(not(all(target_os = "linux", feature = "portable-test")))]
const fn watching_off() -> bool {
    false
}

/// Whether this process answers as a platform without `/proc`, inotify or
/// OFD locks although it runs on Linux: never without the test-only
/// feature `portable-test`.
#[cfg(not(all(target_os = "linux", feature = "portable-test")))]
pub(crate) const fn portable() -> bool {
    false
}

/// Calls the platform's answer, or under the switch (`portable`) the
/// portable one; without the feature, the platform's only.
#[cfg(all(target_os = "linux", feature = "portable-test"))]
macro_rules! pick {
    ($f:ident($($arg:expr),*)) => {
        if portable() { fallback::$f($($arg),*) } else { imp::$f($($arg),*) }
    };
}
#[cfg(not(all(target_os = "linux", feature = "portable-test")))]
macro_rules! pick {
    ($f:ident($($arg:expr),*)) => {
        imp::$f($($arg),*)
    };
}

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

/// Whether a process with id `pid` runs (on Windows: `OpenProcess` and a
/// zero wait on it).
#[cfg(windows)]
pub(crate) fn probe(pid: u64) -> Probe {
    imp::probe(pid)
}

/// Probes a process id with signal 0.
///
/// Never signals a process group: ids that `kill(2)` would read as a group
/// (0, negative) or that do not fit `pid_t` are `Unknown`.
#[cfg(unix)]
pub(crate) fn probe(pid: u64) -> Probe {
    use nix::errno::Errno;
    use nix::sys::signal::kill;
    use nix::unistd::Pid;
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

/// Which file a descriptor or path shows, and which version of it: what
/// tells a file from a later one given the same number (ext4 gives a
/// removed file's inode number to the next file made at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Instance {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    /// Birth time (0 where none is kept): another file at that number.
    pub(crate) born: u64,
    /// The last change of the file's inode (Unix's ctime, which the
    /// kernel sets and no caller can; on Windows the last write): a write,
    /// or a new file on a filesystem without birth times, changes it.
    pub(crate) changed: u64,
}

/// When a process started, in two forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStart {
    /// Clock ticks since boot (`/proc/<pid>/stat` field 22): exact, and
    /// immune to wall-clock steps. Comparable only within one boot, and
    /// between readers in one time namespace (the kernel shifts it by the
    /// reader's boot-clock offset). On macOS and FreeBSD, which have no
    /// ticks (`clock_ticks()` is `None`), the start on the boot clock in
    /// milliseconds.
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
    pick!(process_start(pid))
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`), the unit of
/// [`ProcStart::ticks`]; `None` on platforms without `/proc`.
pub(crate) fn clock_ticks() -> Option<u64> {
    pick!(clock_ticks())
}

/// The time namespace of process `pid` (the link text of
/// `/proc/<pid>/ns/time`), which tells whether its view of the boot
/// clock, and so of start ticks, is ours. `None` when it cannot be read:
/// gone, another user's process, a kernel without time namespaces, or a
/// platform without `/proc`.
pub(crate) fn time_namespace_of(pid: u64) -> Option<String> {
    pick!(time_namespace_of(pid))
}

/// Milliseconds on a clock that never jumps and, on Linux, keeps counting
/// through suspend (`CLOCK_BOOTTIME`), so a lease measured on it expires for
/// holder and reclaimer alike after a laptop lid was closed.
pub(crate) fn boot_clock_ms() -> u64 {
    pick!(boot_clock_ms())
}

/// [`boot_clock_ms`] in microseconds.
pub(crate) fn boot_clock_us() -> u64 {
    pick!(boot_clock_us())
}

/// Whether [`boot_clock_ms`] counts from this kernel's boot: `false` in a
/// time namespace that shifts the boot clock (CRIU, `unshare --time`),
/// where "now minus the boot clock" is not when the machine booted, and
/// wherever that cannot be told. Read once.
pub(crate) fn boot_clock_is_host_wide() -> bool {
    static HOST_WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HOST_WIDE.get_or_init(|| pick!(boot_clock_is_host_wide()))
}

/// Facts about the current process, read once.
#[derive(Debug)]
pub(crate) struct Identity {
    pub(crate) pid: u32,
    pub(crate) hostname: String,
    pub(crate) start: Option<ProcStart>,
    /// The `startTime` this process writes into its records, in the unit
    /// pi-research's process-lifecycle service reads on this platform: on
    /// Linux the start ticks (`/proc/self/stat` field 22, as this time
    /// namespace shows them), elsewhere whole seconds since the epoch.
    pub(crate) start_time: Option<u64>,
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

/// The longest host name a record carries (POSIX allows no longer one
/// anywhere; Linux's is 64 bytes): a bound of the record's length.
pub(crate) const MAX_HOSTNAME_LEN: usize = 255;

/// `/etc/machine-id` holds 32 hex digits; anything much longer is no
/// machine id, and is not written into records.
pub(crate) const MAX_MACHINE_ID_LEN: usize = 128;

/// `text` cut to at most `max` bytes, at a character boundary.
fn cut(mut text: String, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}

/// The current process's identity, computed on first use.
pub(crate) fn identity() -> &'static Identity {
    static IDENTITY: OnceLock<Identity> = OnceLock::new();
    IDENTITY.get_or_init(|| {
        let pid = std::process::id();
        let start = process_start(u64::from(pid));
        Identity {
            pid,
            hostname: hostname().map(|h| cut(h, MAX_HOSTNAME_LEN)).unwrap_or_default(),
            machine_id: machine_id(),
            start,
            start_time: pick!(own_start_time(start)),
            boot_id: pick!(boot_id()),
            pid_ns: pick!(pid_namespace()),
            time_ns: pick!(time_namespace()),
        }
    })
}

/// This host's name (`gethostname(2)`).
#[cfg(unix)]
fn hostname() -> Option<String> {
    nix::unistd::gethostname().ok()?.into_string().ok()
}

/// This host's name (`GetComputerNameExW`).
#[cfg(windows)]
fn hostname() -> Option<String> {
    imp::hostname()
}

/// This host's identity across boots: `/etc/machine-id` (not on macOS or
/// FreeBSD, which the switch stands for).
#[cfg(unix)]
fn machine_id() -> Option<String> {
    std::fs::read_to_string("/etc/machine-id")
        .ok()
        .filter(|_| !portable())
        .map(|id| id.trim().to_owned())
        .filter(|id| !id.is_empty() && id.len() <= MAX_MACHINE_ID_LEN)
}

/// This host's identity across boots: the `MachineGuid` Windows made when
/// it was installed.
#[cfg(windows)]
fn machine_id() -> Option<String> {
    imp::machine_id()
}

/// The start of process `pid` in whole seconds since the epoch, as
/// `ps -o lstart=` shows it in UTC: how a platform without `/proc` learns
/// its own start (once, at the first lock), in the unit pi-research's
/// process-lifecycle service compares there.
#[cfg(any(
    not(any(target_os = "linux", target_os = "macos", target_os = "freebsd", windows)),
    all(target_os = "linux", feature = "portable-test"),
    all(test, unix)
))]
fn ps_start_epoch_s(pid: u32) -> Option<u64> {
    let out = std::process::Command::new("ps")
        .args(["-o", "lstart=", "-p", &pid.to_string()])
        .env("TZ", "UTC0")
        .env("LC_ALL", "C")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    parse_lstart(std::str::from_utf8(&out.stdout).ok()?)
}

/// Parses `ps`'s `lstart` column in the C locale and UTC, such as
/// `Thu Dec  3 17:32:48 2026`, into seconds since the epoch.
#[cfg(any(
    not(any(target_os = "linux", target_os = "macos", target_os = "freebsd", windows)),
    all(target_os = "linux", feature = "portable-test"),
    test
))]
fn parse_lstart(text: &str) -> Option<u64> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let mut fields = text.split_ascii_whitespace();
    let _weekday = fields.next()?;
    let month = fields.next()?;
    let month = MONTHS.iter().position(|m| *m == month)?;
    let day: u8 = fields.next()?.parse().ok()?;
    let mut hms = fields.next()?.split(':').map(str::parse::<u8>);
    let (h, m, s) = (hms.next()?.ok()?, hms.next()?.ok()?, hms.next()?.ok()?);
    let year: i32 = fields.next()?.parse().ok()?;
    if fields.next().is_some() || hms.next().is_some() {
        return None;
    }
    let month = time::Month::try_from(u8::try_from(month + 1).ok()?).ok()?;
    let date = time::Date::from_calendar_date(year, month, day).ok()?;
    let at = date.with_hms(h, m, s).ok()?.assume_utc();
    u64::try_from(at.unix_timestamp()).ok()
}

/// What the directory watcher saw. (Only a platform with a watcher makes
/// one; elsewhere the poll is all there is.)
#[derive(Debug)]
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
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

/// Where the per-user default lock directories live on this host, fixed
/// per platform and never taken from the environment (`/run/lock` on
/// Linux, `/tmp` elsewhere), and the mount tables to compare the mount
/// holding it in (this process's, the host init's), where the platform
/// has them.
pub(crate) fn lock_root() -> (
    std::path::PathBuf,
    Option<(std::path::PathBuf, std::path::PathBuf)>,
) {
    pick!(lock_root())
}

/// A running watch on a lock directory.
pub(crate) use imp::DirWatch;

/// Whether the directory watcher sees a holder's death (its descriptor's
/// close: inotify's `IN_CLOSE_WRITE`, kqueue's `NOTE_FUNLOCK` or
/// `NOTE_CLOSE_WRITE`), so that waiters may poll only as a safety net.
/// Not on Windows, where closing a handle is no directory change: waiters
/// there name the holders' processes to the watcher ([`watch_deaths`]),
/// and poll at their interval where it cannot wait on them all.
pub(crate) const WATCH_SEES_DEATHS: bool = cfg!(unix);

/// Asks the running `watch` to report `entry` changed when one of the
/// processes `pids` (holders of the lock at `entry`) ends; whether every
/// one of them is watched so. On Windows the watcher waits on their
/// process handles. Elsewhere a holder's death is a close in the
/// directory already ([`WATCH_SEES_DEATHS`]): nothing to ask, `true`.
pub(crate) fn watch_deaths(watch: &DirWatch, entry: &str, pids: &[u64]) -> bool {
    #[cfg(windows)]
    return watch.watch_deaths(entry, pids);
    #[cfg(not(windows))]
    {
        let _ = (watch, entry, pids);
        true
    }
}

/// Whether an exclusive lock file's release (a removal, a rename) and its
/// holder's death (a close after writing) are events in the lock
/// directory itself, which the running watcher watches: inotify's, on
/// Linux (kqueue watches each file, and the portable answers poll).
pub(crate) fn watch_sees_lock_files() -> bool {
    cfg!(target_os = "linux") && !portable()
}

/// Whether replacing a file by rename can fail for a moment because
/// another process has it open (reading it): on Windows (and under Wine),
/// `MoveFileExW` over an open file answers access denied, so a replace of
/// a file others read is tried again for a few milliseconds.
pub(crate) const REPLACE_WAITS_FOR_READERS: bool = cfg!(windows);

/// Whether a directory can carry the liveness mark (`flock(2)` on a
/// directory's descriptor), as the directory layout needs: everywhere but
/// Windows, whose byte-range locks are for files only.
pub(crate) const DIRECTORY_MARKS: bool = cfg!(unix);

/// Whether a plain or exact lock name, which becomes a file name as it is,
/// must also be a name Windows can hold (no `<>:"\|?*`, no trailing dot
/// or space, no reserved device name such as `NUL` or `com1.txt`): on
/// Windows only, where such a name fails or, worse, opens a device.
pub(crate) const WINDOWS_FILE_NAMES: bool = cfg!(windows);

/// Whether the kernel has OFD byte-range locks to line waiters up with
/// (the waiting line is off where it has none).
pub(crate) fn byte_range_locks() -> bool {
    #[cfg(all(target_os = "linux", feature = "portable-test"))]
    if switch().is_some() {
        return false;
    }
    imp::BYTE_RANGE_LOCKS
}

/// Whether the filesystem of `file` keeps everything in memory (tmpfs),
/// where a sync returns at once; `false` where that cannot be told.
pub(crate) fn fs_in_memory(file: &std::fs::File) -> bool {
    pick!(fs_in_memory(file))
}

/// Whether `file` is on a filesystem served over the network (or by a
/// user-space server); `true` where that cannot be told.
pub(crate) fn fs_is_remote(file: &std::fs::File) -> bool {
    pick!(fs_is_remote(file))
}

/// Takes an OFD read lock on `[start, start + len)` of `file`, without
/// waiting; whether it was taken (never, without OFD locks).
#[cfg(test)]
pub(crate) fn ofd_read_lock(file: &std::fs::File, start: u64, len: u64) -> bool {
    pick!(ofd_read_lock(file, start, len))
}

/// Holds the byte at `at` of `dir` (an OFD read lock); whether it is held
/// (never, without OFD locks).
pub(crate) fn ofd_take_byte(dir: &std::fs::File, at: u64) -> bool {
    pick!(ofd_take_byte(dir, at))
}

/// Lets go of the byte at `at` of `dir`.
pub(crate) fn ofd_drop_byte(dir: &std::fs::File, at: u64) {
    pick!(ofd_drop_byte(dir, at))
}

/// Whether another open file description holds a byte of `dir` in
/// `[start, end)`.
pub(crate) fn ofd_held(dir: &std::fs::File, start: u64, end: u64) -> bool {
    #[cfg(windows)]
    return imp::ofd_held(dir, start, end);
    #[cfg(not(windows))]
    ofd_held_span(dir, start, end).is_some()
}

/// The file whose bytes the waiting line of the lock directory `dir`
/// locks, where that is not `dir` itself: on Windows, which cannot lock
/// a directory, a file in it (`imp::LINE_FILE`), made if `create`. `None`
/// elsewhere, and where it cannot be opened.
pub(crate) fn line_file(dir: &std::fs::File, create: bool) -> Option<std::fs::File> {
    #[cfg(windows)]
    return imp::line_file(dir, create);
    #[cfg(not(windows))]
    {
        let _ = (dir, create);
        None
    }
}

/// A byte-range lock that another open file description holds on `dir`
/// overlapping `[start, end)`, if any: its span (none, without OFD locks).
pub(crate) fn ofd_held_span(dir: &std::fs::File, start: u64, end: u64) -> Option<(u64, u64)> {
    pick!(ofd_held_span(dir, start, end))
}

/// Watches `dir` on a background thread, calling `on_event` until it
/// returns `false`. `None` when the platform cannot watch (no inotify, or
/// its limits are reached, or under the switch `portable`); callers then
/// poll.
pub(crate) fn watch_dir(
    dir: &std::fs::File,
    on_event: Box<dyn FnMut(DirEvent<'_>) -> bool + Send>,
) -> Option<DirWatch> {
    if portable() || watching_off() {
        return None;
    }
    imp::watch_dir(dir, on_event)
}

/// Why `rename_noreplace` did not rename.
#[derive(Debug)]
pub(crate) enum RenameError {
    /// The target exists (for a directory: even an empty one).
    Exists,
    /// The filesystem cannot rename without replacing.
    #[cfg_attr(windows, allow(dead_code))]
    Unsupported,
    Io(std::io::Error),
}

/// Renames the lock file `from` to `to` inside `dir` atomically, failing
/// if `to` exists: `renameat2(RENAME_NOREPLACE)` on Linux (glibc),
/// `renameatx_np(RENAME_EXCL)` on macOS; `Unsupported` where there is
/// none, or the filesystem cannot do it (the caller then links instead).
pub(crate) fn rename_exclusive(dir: &std::fs::File, from: &str, to: &str) -> Result<(), RenameError> {
    pick!(rename_exclusive(dir, from, to))
}

/// Exchanges the entries `a` and `b` inside `dir` atomically: each name
/// then names what the other named, and neither is free for an instant.
/// Linux (glibc): `renameat2(RENAME_EXCHANGE)`; macOS:
/// `renameatx_np(RENAME_SWAP)`. `Unsupported` elsewhere (FreeBSD, musl,
/// Windows) and where the filesystem cannot do it.
#[cfg_attr(windows, allow(dead_code))]
pub(crate) fn exchange_at(dir: &std::fs::File, a: &str, b: &str) -> Result<(), RenameError> {
    pick!(exchange_at(dir, a, b))
}

/// Whether [`exchange_at`] can work on this platform at all (a
/// filesystem may still refuse it).
pub(crate) fn can_exchange() -> bool {
    #[cfg(all(target_os = "linux", feature = "portable-test"))]
    if portable() {
        return false;
    }
    cfg!(any(
        all(target_os = "linux", target_env = "gnu"),
        target_os = "macos"
    ))
}

/// Renames the directory `from` to `to` inside `dir`, failing if `to`
/// exists in any form.
///
/// A plain `rename(2)` of a directory onto an *empty* directory replaces it,
/// which would let a publisher replace someone else's mkdir-style lock.
/// Linux (glibc) has `renameat2(RENAME_NOREPLACE)` for this, macOS
/// `renameatx_np(RENAME_EXCL)`; elsewhere (and on a macOS filesystem
/// without it) the target is looked at first ([`rename_after_looking`]).
pub(crate) fn rename_noreplace(dir: &std::fs::File, from: &str, to: &str) -> Result<(), RenameError> {
    pick!(rename_noreplace(dir, from, to))
}

/// A rename that fails if `to` exists when looked at just before: what a
/// kernel without a no-replace rename allows. For a directory `from`, a
/// non-empty directory or a file that turns up in the window between the
/// look and the rename still stops it (`ENOTEMPTY`, `ENOTDIR`); only an
/// empty directory made in those microseconds is replaced. For a file
/// `from`, a file that turns up then is replaced.
#[cfg(unix)]
#[cfg_attr(all(target_os = "linux", not(feature = "portable-test")), allow(dead_code))]
fn rename_after_looking(dir: &std::fs::File, from: &str, to: &str) -> Result<(), RenameError> {
    use nix::errno::Errno;
    use nix::fcntl::{AtFlags, renameat};
    use nix::sys::stat::fstatat;
    match fstatat(dir, to, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(_) => return Err(RenameError::Exists),
        Err(Errno::ENOENT) => {}
        Err(e) => return Err(RenameError::Io(e.into())),
    }
    match renameat(dir, from, dir, to) {
        Ok(()) => Ok(()),
        Err(Errno::EEXIST | Errno::ENOTEMPTY | Errno::ENOTDIR | Errno::EISDIR) => Err(RenameError::Exists),
        Err(e) => Err(RenameError::Io(e.into())),
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// Two full directories swap names in one step, each keeping its
    /// contents (and a descriptor opened on one still reaches it under
    /// its new name); where there is no exchange, it says so.
    #[test]
    fn exchange_swaps_two_directories_or_says_it_cannot() {
        let root = tempfile::tempdir().unwrap();
        let dir = std::fs::File::open(root.path()).unwrap();
        let at = |name: &str| root.path().join(name);
        for (name, text) in [("new", "ours"), ("lock", "marker")] {
            std::fs::create_dir(at(name)).unwrap();
            std::fs::write(at(name).join("owner.json"), text).unwrap();
        }
        let old = std::fs::File::open(at("lock")).unwrap();
        match exchange_at(&dir, "new", "lock") {
            Ok(()) => {
                assert!(can_exchange());
                assert_eq!(std::fs::read_to_string(at("lock/owner.json")).unwrap(), "ours");
                assert_eq!(std::fs::read_to_string(at("new/owner.json")).unwrap(), "marker");
                syscall::unlink_at(&old, "owner.json").unwrap();
                assert!(!at("new/owner.json").exists() && at("lock/owner.json").exists());
            }
            // A platform without it, or (macOS) a filesystem without it.
            Err(RenameError::Unsupported) => assert!(
                !can_exchange() || cfg!(target_os = "macos"),
                "no exchange where one is expected"
            ),
            Err(e) => panic!("{e:?}"),
        }
    }

    #[test]
    fn the_look_first_rename_never_replaces_what_it_finds() {
        let root = tempfile::tempdir().unwrap();
        let dir = std::fs::File::open(root.path()).unwrap();
        let at = |name: &str| root.path().join(name);
        std::fs::create_dir(at("pending")).unwrap();
        std::fs::write(at("pending/owner.json"), "{}").unwrap();
        std::fs::write(at("a file"), "theirs").unwrap();
        std::fs::create_dir(at("empty")).unwrap();
        std::fs::create_dir(at("full")).unwrap();
        std::fs::write(at("full/owner.json"), "theirs").unwrap();
        for taken in ["a file", "empty", "full"] {
            assert!(
                matches!(
                    rename_after_looking(&dir, "pending", taken),
                    Err(RenameError::Exists)
                ),
                "{taken}"
            );
        }
        assert_eq!(std::fs::read_to_string(at("a file")).unwrap(), "theirs");
        assert_eq!(std::fs::read_to_string(at("full/owner.json")).unwrap(), "theirs");
        assert!(std::fs::read_dir(at("empty")).unwrap().next().is_none());
        rename_after_looking(&dir, "pending", "free").unwrap();
        assert!(at("free/owner.json").exists() && !at("pending").exists());
        assert!(rename_noreplace(&dir, "free", "full").is_err());
        assert!(matches!(
            rename_noreplace(&dir, "free", "empty"),
            Err(RenameError::Exists)
        ));
    }

    #[test]
    fn lstart_is_read_in_utc() {
        assert_eq!(parse_lstart("Thu Dec  3 17:32:48 2026\n"), Some(1_796_319_168));
        assert_eq!(parse_lstart("Thu Jan  1 00:00:00 1970"), Some(0));
        for bad in [
            "",
            "Thu Dec 3 17:32 2026",
            "Thu Foo  3 17:32:48 2026",
            "Thu Dec 32 17:32:48 2026",
        ] {
            assert_eq!(parse_lstart(bad), None, "{bad:?}");
        }
    }

    /// The `ps` fallback that platforms without `/proc` use agrees, to the
    /// second, with the start Linux reads from `/proc`.
    #[cfg(target_os = "linux")]
    #[test]
    fn ps_agrees_with_proc() {
        let Some(from_ps) = ps_start_epoch_s(std::process::id()) else {
            eprintln!("skipped: no usable `ps` here");
            return;
        };
        let start = process_start(u64::from(std::process::id())).expect("own /proc entry");
        let from_proc = start.epoch_ms / 1000;
        assert!(
            from_ps.abs_diff(from_proc) <= 1,
            "ps {from_ps}, /proc {from_proc}"
        );
    }
}
