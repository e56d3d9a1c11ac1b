//! When a lock may be taken from its holder.
//!
//! Every record falls under one of the rules below, and each rule has a
//! bound past which the lock is stale unless its holder is *provably
//! alive* (its `flock` is held, or its pid on this host lives). Bounds
//! count from the record's *last change*: its modification time, unless
//! that lies in the future (the clock went back since, or a hostile
//! `touch`), in which case the file's age is unknowable and it counts from
//! when this process first saw the file (`changed_at`).
//!
//! The rules, in the order they are applied:
//!
//! 0. **Not a lock** (content no supported writer produces, even torn:
//!    neither a JSON object, whole or cut short as a writer's begins
//!    (`{"uuid":"`, `{"acquiredAt":"`), nor blanks or NUL bytes, nor a
//!    UUID or its prefix; a whole JSON object with neither `uuid` nor
//!    `holderId`; over 64 KiB): never stale, never removed.
//!    A proper prefix of a UUID is rule 1 within the grace period, and
//!    not a lock after it.
//! 1. **Unreadable record** (empty, blank, NUL bytes, a JSON object cut
//!    short, an object with neither `pid` nor `leasehold`, or
//!    pi-research's bare-UUID legacy form, which names no process): never
//!    stale within the grace period of its last change, since its writer
//!    may be mid-write. After it, it is stale unless a leasehold process
//!    holds `flock` on it.
//! 2. **leasehold record, same kernel** (same `bootId`): the holder keeps
//!    `flock(LOCK_EX)` on the record for as long as it holds the lock, and
//!    the kernel drops that lock when the process dies. A free `flock` proves
//!    the holder is gone (stale at once); a held one proves it alive. Pids
//!    are not consulted, so pid reuse and pid namespaces cannot fool it, and
//!    neither can time namespaces. The lease (rule 5) still applies.
//! 3. **Same machine, another boot** (same `machineId`, another `bootId`):
//!    every process of that boot is dead.
//! 4. **Foreign record on this host** (no `leasehold` field, or a platform
//!    without boot ids): `kill(pid, 0)` = ESRCH means dead. A live pid whose
//!    start time provably differs from the record's `startTime` is a reused
//!    pid. pi-research writes `startTime` as its process-lifecycle service
//!    reads starts: on Linux the start ticks, field 22 of
//!    `/proc/<pid>/stat`; elsewhere whole seconds since the epoch. Other
//!    writers (and earlier leasehold builds) wrote epoch milliseconds. The
//!    value is read in each unit it is plausible in: ticks if a whole
//!    number no later than our boot clock now, epoch seconds or
//!    milliseconds if no more than a day before this boot or after now.
//!    As ticks it is exact: within one tick of the live process's start
//!    (pi-research's own tolerance) is the owner, any other value a reused
//!    pid, however fresh the record; but only when the live process is in
//!    our time namespace (the kernel shows start ticks shifted by the
//!    reader's), else undecided. As epoch time, a mismatch counts only when
//!    the value is more than two seconds off *and* the live process started
//!    after the record was last written (by more than 30 s of wall-clock
//!    step slack) — a process cannot have written a record before it
//!    started. A value plausible in several units (seconds and ticks
//!    overlap after about 205 days of uptime) names the owner if any
//!    reading matches, and a reused pid only if every reading proves it.
//!    Any other live pid proves its owner alive. A holder on another host,
//!    kernel or pid namespace, or without a pid that can be probed, cannot
//!    be checked: only its lease decides.
//! 5. **Lease**: a record whose lease ran out is stale whoever wrote it
//!    (a holder that was paused past its lease has lost it). For a
//!    leasehold record on this boot, written in our time namespace (equal
//!    `timeNs`, or neither side has one), the lease is measured on the boot
//!    clock (`CLOCK_BOOTTIME`), which wall-clock steps cannot move:
//!    `renewedAtBoot + leaseMs`. That clock is offset per time namespace
//!    (CRIU, `unshare --time`) while the boot id is kernel-wide, so any
//!    other record, and one that claims a renewal later than our boot clock
//!    reads, is measured on the wall clock: `leaseExpiresAt` plus the 2 s
//!    skew margin, never earlier than the last change plus `leaseMs` and
//!    never later than that plus the margin; a `leaseExpiresAt` without
//!    `leaseMs` is cut to 24 h (or the foreign lease, if longer) after the
//!    last change. A `leaseMs` over a year (`MAX_LEASE`, the longest
//!    lease leasehold accepts) counts as a year.
//! 6. **Records without a lease** (neither `leaseMs` nor a readable
//!    `leaseExpiresAt`, whoever wrote them: pi-research's, or a
//!    hand-written or older leasehold record): their writer has an implied
//!    lease, the *foreign lease* (120 s by default, pi-research's own
//!    `liveOwnerStaleThreshold`; at most a year), counted from the last
//!    change, after which pi-research itself would reclaim it. Without
//!    a foreign lease (`foreign_lease(None)`), such a record is kept while
//!    its holder is provably alive, and one whose holder cannot be checked
//!    is stale 24 h after its last change.
//!
//! So no record unchanged for a year and 2 s is kept unless its holder is
//! provably alive and either holds the `flock` or (only without a foreign
//! lease, on a record without a lease) is a live pid of this host; what
//! is not a lock (rule 0) is not a record, and is never taken.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::record::{MAX_LEASE, Parsed, Record};
use crate::sys::{self, Identity, Probe, ProcStart};
use crate::timestamp::epoch_ms;

/// Why a lock was judged stale: what [`LockInfo::stale_reason`] returns,
/// and what the next acquisition of the name reclaims it for.
///
/// Its [`Display`](std::fmt::Display) form is a short lowercase phrase
/// (`"owner process is dead"`), the same one the `leasehold` tool prints.
/// New reasons may be added; match with a wildcard arm.
///
/// [`LockInfo::stale_reason`]: crate::LockInfo::stale_reason
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// use leasehold::StaleReason;
///
/// let dir = tempfile::tempdir().unwrap();
/// let locker = leasehold::Locker::new(dir.path())?;
///
/// // A lock file left by a pi-research process that has since exited.
/// let mut child = std::process::Command::new("true").spawn().unwrap();
/// let dead_pid = child.id();
/// child.wait().unwrap();
/// let record = format!(r#"{{"uuid":"a1","pid":{dead_pid}}}"#);
/// std::fs::write(locker.lock_path("report")?, record).unwrap();
///
/// let info = locker.inspect("report").await?.expect("present");
/// assert_eq!(info.stale_reason(), Some(StaleReason::DeadOwner));
/// assert_eq!(StaleReason::DeadOwner.to_string(), "owner process is dead");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StaleReason {
    /// The holder process is gone: no process of this host has its pid, or
    /// (for a leasehold holder) nobody holds the `flock` on its record.
    DeadOwner,
    /// A process has the holder's pid, but it started after the lock was
    /// taken (its start time differs from the one the record gives): the
    /// pid was recycled.
    ReusedPid,
    /// The record was written on this host before its last reboot.
    PreviousBoot,
    /// The lease ran out without renewal. Also for a record without a lease
    /// (pi-research's) past the implied
    /// [`foreign_lease`](crate::LockerBuilder::foreign_lease), and for one
    /// whose owner cannot be checked (another host, another pid namespace)
    /// 24 hours after its last change.
    LeaseExpired,
    /// The record cannot be read as a lock record (empty, or cut short as
    /// by a writer that crashed, or a bare legacy UUID that names no
    /// process) and is older than the
    /// [`unreadable_grace`](crate::LockerBuilder::unreadable_grace) period.
    /// (Content that no lock writer produces at all is no lock, and never
    /// stale: see [`Error::UnexpectedFile`](crate::Error::UnexpectedFile).)
    Unreadable,
    /// Not a lock: a temporary or retired file or directory that a process
    /// which crashed while publishing or releasing a lock left behind.
    Leftover,
}

impl std::fmt::Display for StaleReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl StaleReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StaleReason::DeadOwner => "owner process is dead",
            StaleReason::ReusedPid => "owner pid was reused by a newer process",
            StaleReason::PreviousBoot => "owner ran before the last reboot",
            StaleReason::LeaseExpired => "lease expired",
            StaleReason::Unreadable => "record unreadable past the grace period",
            StaleReason::Leftover => "left behind by a process that crashed while publishing or releasing",
        }
    }
}

/// The outcome of judging one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Live,
    Stale(StaleReason),
    /// Not a lock: content no supported writer produces, even torn (a
    /// `Cargo.lock`, a pid file). Never reclaimed, whatever its age.
    NotALock,
    /// Only `flock` on the record can decide; test it and judge again.
    NeedsFlockTest,
}

/// Everything about the machine the rules consult, so tests can fake it.
pub(crate) trait Host {
    fn now(&self) -> SystemTime;
    fn boot_clock_ms(&self) -> u64;
    fn me(&self) -> &Identity;
    fn probe(&self, pid: u64) -> Probe;
    fn process_start(&self, pid: u64) -> Option<ProcStart>;
    fn clock_ticks(&self) -> Option<u64>;
    fn time_namespace_of(&self, pid: u64) -> Option<String>;
    /// Whether `now - boot_clock` is when this kernel booted (no time
    /// namespace shifts the boot clock). Fakes default to not knowing.
    fn boot_clock_is_host_wide(&self) -> bool {
        false
    }
}

/// The real machine.
pub(crate) struct System;

impl Host for System {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
    fn boot_clock_ms(&self) -> u64 {
        sys::boot_clock_ms()
    }
    fn me(&self) -> &Identity {
        sys::identity()
    }
    fn probe(&self, pid: u64) -> Probe {
        sys::probe(pid)
    }
    fn process_start(&self, pid: u64) -> Option<ProcStart> {
        sys::process_start(pid)
    }
    fn clock_ticks(&self) -> Option<u64> {
        sys::clock_ticks()
    }
    fn time_namespace_of(&self, pid: u64) -> Option<String> {
        sys::time_namespace_of(pid)
    }
    fn boot_clock_is_host_wide(&self) -> bool {
        sys::boot_clock_is_host_wide()
    }
}

/// What a reader saw at a lock path.
#[derive(Debug)]
pub(crate) struct Evidence<'a> {
    pub(crate) parsed: &'a Parsed,
    pub(crate) mtime: SystemTime,
    /// `Some(true)` when a test `flock` on the record succeeded.
    pub(crate) flock_free: Option<bool>,
    /// How long this process has known this very file (on the boot
    /// clock), for records whose modification time cannot be trusted.
    pub(crate) known_for: Duration,
}

/// The tunable parts of the rules.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    /// How long an unreadable record is left alone.
    pub(crate) grace: Duration,
    /// The implied lease of records that carry none; `None`: forever.
    pub(crate) foreign_lease: Option<Duration>,
}

/// How far apart the clocks of two hosts sharing a directory may be: a
/// lease judged on the wall clock only ends this long after it says.
pub(crate) const CLOCK_SKEW: Duration = Duration::from_secs(2);

/// A lease end claimed further than this past the record's last change
/// (by a writer that gives no `leaseMs`) is cut to it: a bogus or
/// far-future claim must not keep a dead holder's lock forever. Also the
/// implied lease, without a foreign lease, of a record whose holder cannot
/// be checked.
const LONGEST_FOREIGN_LEASE: Duration = Duration::from_secs(24 * 3600);

/// Slack for comparing start times derived from the wall clock.
const START_TOLERANCE_MS: u64 = 2_000;

pub(crate) fn judge(ev: &Evidence<'_>, rules: Rules, host: &dyn Host) -> Verdict {
    let record = match ev.parsed {
        Parsed::Record(r) if r.pid.is_some() || r.is_leasehold() => r,
        Parsed::Foreign => return Verdict::NotALock,
        Parsed::UuidPrefix => return judge_uuid_prefix(ev, rules.grace, host),
        _ => return judge_unreadable(ev, rules.grace, host),
    };
    let alive = match liveness(record, ev, host) {
        Liveness::Gone(reason) => return Verdict::Stale(reason),
        Liveness::NeedsFlockTest => return Verdict::NeedsFlockTest,
        Liveness::Alive => true,
        Liveness::Unknown => false,
    };
    if lease_expired(record, ev, rules, alive, host) {
        return Verdict::Stale(StaleReason::LeaseExpired);
    }
    Verdict::Live
}

fn judge_unreadable(ev: &Evidence<'_>, grace: Duration, host: &dyn Host) -> Verdict {
    let changed = changed_at(ev, host);
    let before_boot = changed_before_boot(changed, host);
    let age = host.now().duration_since(changed).unwrap_or(Duration::ZERO);
    if age < grace && !before_boot {
        return Verdict::Live;
    }
    let reason = match before_boot {
        true => StaleReason::PreviousBoot,
        false => StaleReason::Unreadable,
    };
    match ev.flock_free {
        None => Verdict::NeedsFlockTest,
        Some(true) => Verdict::Stale(reason),
        Some(false) => Verdict::Live,
    }
}

/// Whether a record last changed before this machine booted (by more than
/// the clock skew margin): then nobody can be writing it now, and the
/// grace period is moot. That is what makes records without a sync safe:
/// a record cut short by a power loss is empty or torn, and is taken over
/// right after the reboot instead of after the grace period. Unknown (so
/// `false`) where the boot clock is shifted by a time namespace.
fn changed_before_boot(changed: SystemTime, host: &dyn Host) -> bool {
    if !host.boot_clock_is_host_wide() {
        return false;
    }
    let since_boot = Duration::from_millis(host.boot_clock_ms()).saturating_add(CLOCK_SKEW);
    host.now()
        .checked_sub(since_boot)
        .is_some_and(|boot| changed < boot)
}

/// A proper prefix of a UUID: within the grace period a legacy record
/// being written, after it no lock (a pid file, say). pi-research writes
/// its 36 bytes in one `write`, so a legacy record cut short and left so
/// needs a crash at that very instant; a pid file is common. Deleting the
/// one costs data, keeping the other costs a lock name until someone
/// removes it (acquisitions fail with `Error::UnexpectedFile`, they do not
/// wait).
fn judge_uuid_prefix(ev: &Evidence<'_>, grace: Duration, host: &dyn Host) -> Verdict {
    let age = host
        .now()
        .duration_since(changed_at(ev, host))
        .unwrap_or(Duration::ZERO);
    if age < grace {
        Verdict::Live
    } else {
        Verdict::NotALock
    }
}

/// When the record last changed, as far as that can be trusted: its
/// modification time, unless that is in the future (the clock went back
/// since, or a hostile `touch`); then the file's age is unknowable, and it
/// counts from when this process first saw the file instead, or the lock
/// would be kept until the clock caught up.
fn changed_at(ev: &Evidence<'_>, host: &dyn Host) -> SystemTime {
    let now = host.now();
    match dated_ahead(ev.mtime, now) {
        true => now.checked_sub(ev.known_for).unwrap_or(UNIX_EPOCH),
        false => ev.mtime,
    }
}

/// Whether a record changed at `mtime` is dated ahead of `now` by more
/// than [`CLOCK_SKEW`]: then its [`Evidence::known_for`] dates it.
pub(crate) fn dated_ahead(mtime: SystemTime, now: SystemTime) -> bool {
    now.checked_add(CLOCK_SKEW).is_some_and(|limit| mtime > limit)
}

/// What can be known about the writer of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Liveness {
    /// Provably gone.
    Gone(StaleReason),
    /// Provably alive: a leasehold holder's `flock` is held, or its pid on
    /// this host, in our pid namespace, is alive with no start-time
    /// mismatch.
    Alive,
    /// Cannot be checked from here: another host, kernel or pid namespace,
    /// no pid, or one that cannot be probed. Only its lease can tell.
    Unknown,
    /// Only `flock` on the record can decide.
    NeedsFlockTest,
}

/// Whether a record's writer says it is of this host: the same boot, the
/// same machine, or the same host name (pi-research writes none: it is a
/// local writer).
fn same_host(r: &Record, me: &Identity) -> bool {
    let same_boot = matches!((&r.boot_id, &me.boot_id), (Some(a), Some(b)) if a == b);
    let same_machine = matches!((&r.machine_id, &me.machine_id), (Some(a), Some(b)) if a == b);
    same_boot
        || same_machine
        || match &r.hostname {
            // An empty name (gethostname failed) says nothing.
            Some(h) => !h.is_empty() && *h == me.hostname,
            None => true,
        }
}

/// The pid of a record's writer when it names a process here: of this
/// host, of this boot (where both know theirs) and of this pid namespace.
/// What a watcher can wait on for the writer's death (Windows); `None`
/// when the pid means nothing here.
pub(crate) fn local_pid(r: &Record, me: &Identity) -> Option<u64> {
    let other_boot = matches!((&r.boot_id, &me.boot_id), (Some(a), Some(b)) if a != b);
    let other_pid_ns = matches!((&r.pid_ns, &me.pid_ns), (Some(a), Some(b)) if a != b);
    (same_host(r, me) && !other_boot && !other_pid_ns)
        .then_some(r.pid)
        .flatten()
}

fn liveness(r: &Record, ev: &Evidence<'_>, host: &dyn Host) -> Liveness {
    let me = host.me();
    let same_boot = matches!((&r.boot_id, &me.boot_id), (Some(a), Some(b)) if a == b);
    let same_machine = matches!((&r.machine_id, &me.machine_id), (Some(a), Some(b)) if a == b);
    let same_hostname = same_host(r, me);
    if r.is_leasehold() && same_boot {
        return match ev.flock_free {
            None => Liveness::NeedsFlockTest,
            Some(true) => Liveness::Gone(StaleReason::DeadOwner),
            Some(false) => Liveness::Alive,
        };
    }
    if !same_hostname {
        return Liveness::Unknown;
    }
    // Another boot of this very machine (same machine id): its processes
    // are all gone. Two hosts that merely share a name are not this.
    if same_machine && r.boot_id.is_some() && me.boot_id.is_some() && !same_boot {
        return Liveness::Gone(StaleReason::PreviousBoot);
    }
    if r.boot_id.is_some() && me.boot_id.is_some() && !same_boot {
        return Liveness::Unknown;
    }
    if let (Some(theirs), Some(ours)) = (&r.pid_ns, &me.pid_ns)
        && theirs != ours
    {
        // Another container's pids mean nothing here: lease only.
        return Liveness::Unknown;
    }
    let Some(pid) = r.pid else {
        return Liveness::Unknown;
    };
    match host.probe(pid) {
        Probe::Dead => Liveness::Gone(StaleReason::DeadOwner),
        Probe::Unknown => Liveness::Unknown,
        Probe::Alive => match (r.start_time, host.process_start(pid)) {
            (Some(recorded), Some(actual)) if pid_reused(recorded, pid, actual, ev.mtime, host) => {
                Liveness::Gone(StaleReason::ReusedPid)
            }
            _ => Liveness::Alive,
        },
    }
}

/// How much younger than the record a process must be to count as a
/// newer process, for start times on the wall clock: forward wall-clock
/// steps up to this size cannot make a live owner look like a reused pid.
const CLOCK_STEP_SLACK_MS: u64 = 30_000;

/// How far an epoch start time may lie before this boot or after now and
/// still be read as one: the wall clock may have been stepped since a
/// process started (an RTC set wrong at boot, NTP catching up, a clock put
/// back).
const EPOCH_SLACK_MS: u64 = 86_400_000;

/// What one reading of a foreign `startTime` says about the live process
/// with the record's pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StartReading {
    /// It is the writer.
    Owner,
    /// It provably is not: its pid was reused.
    Other,
    /// This reading cannot tell.
    Undecided,
}

/// Whether a foreign `startTime` proves the live pid is a newer process.
///
/// The value is read in every unit it is plausible in: start ticks
/// (`/proc/<pid>/stat` field 22, pi-research's unit on Linux, and
/// leasehold's), epoch seconds (pi-research elsewhere) and epoch
/// milliseconds (other writers, earlier leasehold builds). A value
/// plausible in no unit proves nothing. One plausible in several (epoch
/// seconds and ticks overlap on a host up for more than about 205 days at
/// 100 Hz) names the owner if any reading matches, and a reused pid only if
/// every reading proves it: a live owner is never robbed on a guess.
fn pid_reused(recorded: f64, pid: u64, actual: ProcStart, mtime: SystemTime, host: &dyn Host) -> bool {
    let readings = [
        ticks_reading(recorded, pid, actual, host),
        epoch_reading(recorded, 1000.0, actual, mtime, host),
        epoch_reading(recorded, 1.0, actual, mtime, host),
    ];
    let mut plausible = readings.into_iter().flatten().peekable();
    plausible.peek().is_some() && plausible.all(|r| r == StartReading::Other)
}

/// `recorded` read as start ticks; `None` when it cannot be ticks: not a
/// whole number, or later than our boot clock now.
///
/// Ticks are exact and on the boot clock, so no wall-clock guard (such as
/// the "younger than the record" rule for epoch units) is needed: the
/// owner's value matches to within one tick (pi-research's own tolerance),
/// any other live process's does not. What *is* needed is one view of the
/// boot clock: the kernel shows field 22 shifted by the *reader's* time
/// namespace, so the value is compared only when the live process is in
/// our time namespace (then, were it the writer, it wrote what we read).
/// A process in another one, or whose namespace cannot be read (another
/// user's), is undecided: a pi-research writer in a restored container may
/// have written shifted ticks, and the record names no namespace.
fn ticks_reading(recorded: f64, pid: u64, actual: ProcStart, host: &dyn Host) -> Option<StartReading> {
    let hz = host.clock_ticks()?;
    let now_ticks = host.boot_clock_ms().saturating_mul(hz) / 1000;
    if !(recorded.is_finite()
        && recorded >= 0.0
        && recorded.fract() == 0.0
        && recorded <= (now_ticks + 1) as f64)
    {
        return None;
    }
    let ours = &host.me().time_ns;
    // A kernel without time namespaces (we have none) has one boot clock.
    let comparable = ours.is_none() || host.time_namespace_of(pid).as_ref() == ours.as_ref();
    let actual_ticks = actual.ticks as f64;
    Some(if !comparable {
        StartReading::Undecided
    } else if (recorded - actual_ticks).abs() <= 1.0 {
        StartReading::Owner
    } else if actual_ticks > recorded + 1.0 {
        // Started after the recorded owner: the pid was reused.
        StartReading::Other
    } else {
        // Started *before* the recorded owner: within one pid namespace no
        // two processes share a pid, so this is no reuse; the record comes
        // from another pid namespace (a container sharing the directory,
        // whose writer records no namespace). Nothing to conclude.
        StartReading::Undecided
    })
}

/// `recorded` read as epoch time in units of `ms_per_unit` milliseconds;
/// `None` when it cannot be such a start: more than a day before this
/// boot or after now. A mismatch proves a reused pid only when the start
/// times differ by more than two seconds *and* the live process is younger
/// than the record (a process cannot have written a record before it
/// started) by more than the clock-step slack.
fn epoch_reading(
    recorded: f64,
    ms_per_unit: f64,
    actual: ProcStart,
    mtime: SystemTime,
    host: &dyn Host,
) -> Option<StartReading> {
    let now_ms = epoch_ms(host.now());
    let boot_ms = now_ms.saturating_sub(host.boot_clock_ms());
    let earliest = boot_ms.saturating_sub(EPOCH_SLACK_MS) as f64;
    let latest = now_ms.saturating_add(EPOCH_SLACK_MS) as f64;
    let mut recorded_ms = recorded * ms_per_unit;
    if !(recorded_ms.is_finite() && (earliest..=latest).contains(&recorded_ms)) {
        return None;
    }
    if ms_per_unit > 1.0 {
        // Whole seconds may have been truncated, not rounded.
        recorded_ms += ms_per_unit / 2.0;
    }
    if (recorded_ms - actual.epoch_ms as f64).abs() <= START_TOLERANCE_MS as f64 {
        return Some(StartReading::Owner);
    }
    let record_age_ms = now_ms.saturating_sub(epoch_ms(mtime));
    let younger_than_record = actual.age_ms.saturating_add(CLOCK_STEP_SLACK_MS) < record_age_ms;
    Some(if younger_than_record {
        StartReading::Other
    } else {
        StartReading::Undecided
    })
}

/// Whether the record's `renewedAtBoot` is on our own boot clock: the same
/// kernel (boot id) *and* the same time namespace, since `CLOCK_BOOTTIME`
/// is offset per time namespace (CRIU, `podman container restore`,
/// `unshare --time`). Two processes without one share the clock only
/// when neither has one: then the kernel has no time namespaces. A record
/// without `timeNs` read by a process with one (an older leasehold) is on
/// an unknown clock.
fn same_boot_clock(r: &Record, me: &Identity) -> bool {
    let same_boot = matches!((&r.boot_id, &me.boot_id), (Some(a), Some(b)) if a == b);
    same_boot && r.time_ns == me.time_ns
}

/// Whether the lease ran out. `alive`: the writer is provably alive, which
/// only matters to a record without a lease under `foreign_lease: None`.
fn lease_expired(r: &Record, ev: &Evidence<'_>, rules: Rules, alive: bool, host: &dyn Host) -> bool {
    if let Some(left) = boot_clock_lease_left(r, host) {
        return left.is_zero();
    }
    wall_lease_end(r, changed_at(ev, host), rules, alive).is_some_and(|end| host.now() >= end)
}

/// How much of a lease on our own boot clock is left, for a leasehold
/// record written in our time namespace on this boot; `None` when the
/// lease must be judged on the wall clock.
fn boot_clock_lease_left(r: &Record, host: &dyn Host) -> Option<Duration> {
    if !r.is_leasehold() || !same_boot_clock(r, host.me()) {
        return None;
    }
    let (renewed, lease) = (r.renewed_at_boot?, r.lease_ms?);
    let now = host.boot_clock_ms();
    // A renewal later than now on our own clock is no renewal on it.
    if renewed > now {
        return None;
    }
    let end = renewed.saturating_add(lease.min(MAX_LEASE_MS));
    Some(Duration::from_millis(end.saturating_sub(now)))
}

const MAX_LEASE_MS: u64 = MAX_LEASE.as_millis() as u64;

/// The end of a lease judged on the wall clock, for a record last changed
/// at `changed`; `None`: never (only a provably alive writer's record
/// without a lease, under `foreign_lease: None`).
///
/// Every end is at most a year (the longest lease leasehold accepts) plus
/// the skew margin after `changed`: a bogus or far-future claim must not
/// keep a dead holder's lock forever.
fn wall_lease_end(r: &Record, changed: SystemTime, rules: Rules, alive: bool) -> Option<SystemTime> {
    let after = |d: Duration| changed.checked_add(d).unwrap_or(changed);
    let foreign = rules.foreign_lease.map(|f| f.min(MAX_LEASE));
    let lease = r.lease_ms.map(|ms| Duration::from_millis(ms).min(MAX_LEASE));
    // A claimed end is on the writer's clock, which may be another host's:
    // allow for skew. The rest is measured on our own.
    let claimed = r.lease_expires_at.map(|t| t.checked_add(CLOCK_SKEW).unwrap_or(t));
    let (end, longest) = match (claimed, lease) {
        // No lease at all: the foreign lease; without one, kept while the
        // writer provably lives, else for the longest foreign lease.
        (None, None) => {
            return match (foreign, alive) {
                (Some(foreign), _) => Some(after(foreign)),
                (None, true) => None,
                (None, false) => Some(after(LONGEST_FOREIGN_LEASE)),
            };
        }
        // Never earlier than the last change plus the lease (a torn read,
        // or a writer's clock behind ours), never later than that plus
        // the skew margin.
        (claimed, Some(lease)) => {
            let floor = after(lease);
            (claimed.map_or(floor, |c| c.max(floor)), lease + CLOCK_SKEW)
        }
        // A claim with no length: at most the longest lease the writer
        // could mean.
        (Some(claimed), None) => (claimed, LONGEST_FOREIGN_LEASE.max(foreign.unwrap_or_default())),
    };
    Some(end.min(after(longest)))
}

/// When a lock judged live could turn stale by time alone: its lease
/// expiry, or the end of an unreadable record's grace period.
pub(crate) fn recheck_at(parsed: &Parsed, mtime: SystemTime, rules: Rules) -> Option<SystemTime> {
    recheck_on(parsed, mtime, rules, &System)
}

fn recheck_on(parsed: &Parsed, mtime: SystemTime, rules: Rules, host: &dyn Host) -> Option<SystemTime> {
    match parsed {
        Parsed::Record(r) if r.pid.is_some() || r.is_leasehold() => match boot_clock_lease_left(r, host) {
            Some(left) => host.now().checked_add(left),
            None => wall_lease_end(r, mtime, rules, false),
        },
        Parsed::Foreign => None,
        _ => mtime.checked_add(rules.grace),
    }
}

#[cfg(test)]
mod tests;
