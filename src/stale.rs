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
//! 1. **Unreadable record** (empty, torn, not a JSON object, an object with
//!    none of `uuid`/`pid`/`holderId` or with neither `pid` nor `leasehold`,
//!    or pi-research's bare-UUID legacy form, which names no process): never stale within the grace period
//!    of its last change, since its writer may be mid-write. After it, it
//!    is stale unless a leasehold process holds `flock` on it.
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
//!    `leaseExpiresAt`, whoever wrote them: the second seed's, or a
//!    hand-written or older leasehold record): their writer has an implied
//!    lease, the *foreign lease* (120 s by default, the second seed's own
//!    `liveOwnerStaleThreshold`; at most a year), counted from the last
//!    change, after which the second seed itself would reclaim it. Without
//!    a foreign lease (`foreign_lease(None)`), such a record is kept while
//!    its holder is provably alive, and one whose holder cannot be checked
//!    is stale 24 h after its last change.
//!
//! So no record unchanged for a year and 2 s is kept unless its holder is
//! provably alive and either holds the `flock` or (only without a foreign
//! lease, on a record without a lease) is a live pid of this host.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::record::{Parsed, Record, epoch_ms};
use crate::sys::{self, Identity, Probe, ProcStart};

/// Leases beyond this are almost certainly a unit mistake, and would
/// overflow time arithmetic long before they meant anything: `build()`
/// refuses them, and a record stating one is capped to it.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// Why a lock was found stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StaleReason {
    /// The holder process is gone.
    DeadOwner,
    /// The pid is alive but belongs to a newer process.
    ReusedPid,
    /// The record is from an earlier boot of this host.
    PreviousBoot,
    /// The lease ran out without renewal.
    LeaseExpired,
    /// The record is unreadable and older than the grace period.
    Unreadable,
    /// Not a lock: a temporary or retired directory a crashed process left.
    Leftover,
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
    let age = host
        .now()
        .duration_since(changed_at(ev, host))
        .unwrap_or(Duration::ZERO);
    if age < grace {
        return Verdict::Live;
    }
    match ev.flock_free {
        None => Verdict::NeedsFlockTest,
        Some(true) => Verdict::Stale(StaleReason::Unreadable),
        Some(false) => Verdict::Live,
    }
}

/// When the record last changed, as far as that can be trusted: its
/// modification time, unless that is in the future (the clock went back
/// since, or a hostile `touch`); then the file's age is unknowable, and it
/// counts from when this process first saw the file instead, or the lock
/// would be kept until the clock caught up.
fn changed_at(ev: &Evidence<'_>, host: &dyn Host) -> SystemTime {
    let now = host.now();
    match now.checked_add(CLOCK_SKEW) {
        Some(limit) if ev.mtime > limit => now.checked_sub(ev.known_for).unwrap_or(UNIX_EPOCH),
        _ => ev.mtime,
    }
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

fn liveness(r: &Record, ev: &Evidence<'_>, host: &dyn Host) -> Liveness {
    let me = host.me();
    let same_boot = matches!((&r.boot_id, &me.boot_id), (Some(a), Some(b)) if a == b);
    let same_machine = matches!((&r.machine_id, &me.machine_id), (Some(a), Some(b)) if a == b);
    let same_hostname = same_boot
        || same_machine
        || match &r.hostname {
            // An empty name (gethostname failed) says nothing.
            Some(h) => !h.is_empty() && *h == me.hostname,
            // The second seed writes no host name: it is a local writer.
            None => true,
        };
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
        _ => mtime.checked_add(rules.grace),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Record, parse};
    use std::collections::HashMap;
    use std::time::UNIX_EPOCH;

    struct Fake {
        now: SystemTime,
        boot_ms: u64,
        me: Identity,
        procs: HashMap<u64, Option<ProcStart>>,
        /// Time namespaces of pids, where not ours (`None`: unreadable).
        time_ns_of: HashMap<u64, Option<String>>,
    }

    impl Host for Fake {
        fn now(&self) -> SystemTime {
            self.now
        }
        fn boot_clock_ms(&self) -> u64 {
            self.boot_ms
        }
        fn me(&self) -> &Identity {
            &self.me
        }
        fn probe(&self, pid: u64) -> Probe {
            if pid == 0 || pid > i32::MAX as u64 {
                Probe::Unknown
            } else if self.procs.contains_key(&pid) {
                Probe::Alive
            } else {
                Probe::Dead
            }
        }
        fn process_start(&self, pid: u64) -> Option<ProcStart> {
            self.procs.get(&pid).copied().flatten()
        }
        fn clock_ticks(&self) -> Option<u64> {
            Some(100)
        }
        fn time_namespace_of(&self, pid: u64) -> Option<String> {
            match self.time_ns_of.get(&pid) {
                Some(ns) => ns.clone(),
                None => self.me.time_ns.clone(),
            }
        }
    }

    const NOW_MS: u64 = 1_764_745_566_000;
    const RULES: Rules = Rules {
        grace: Duration::from_secs(10),
        foreign_lease: Some(Duration::from_secs(120)),
    };

    fn fake() -> Fake {
        let mut procs = HashMap::new();
        // pid 100 started an hour ago; pid 200 started a second ago.
        procs.insert(
            100,
            Some(ProcStart {
                ticks: 1,
                epoch_ms: NOW_MS - 3_600_000,
                age_ms: 3_600_000,
            }),
        );
        procs.insert(
            200,
            Some(ProcStart {
                ticks: 2,
                epoch_ms: NOW_MS - 1_000,
                age_ms: 1_000,
            }),
        );
        procs.insert(300, None);
        // Started 5 s ago; its epoch start reads 20 s later than the wall
        // clock said when it started, because the clock stepped forward.
        procs.insert(
            400,
            Some(ProcStart {
                ticks: 4,
                epoch_ms: NOW_MS - 5_000,
                age_ms: 5_000,
            }),
        );
        Fake {
            now: UNIX_EPOCH + Duration::from_millis(NOW_MS),
            boot_ms: 50_000,
            me: Identity {
                pid: 1,
                hostname: "here".into(),
                start: None,
                start_time: None,
                boot_id: Some("boot-a".into()),
                pid_ns: Some("pid:[1]".into()),
                time_ns: Some("time:[1]".into()),
                machine_id: Some("machine-a".into()),
            },
            procs,
            time_ns_of: HashMap::new(),
        }
    }

    fn at(ms_ago: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(NOW_MS - ms_ago)
    }

    fn verdict(json: &str, mtime_ms_ago: u64, flock_free: Option<bool>) -> Verdict {
        let parsed = parse(json.as_bytes());
        let ev = Evidence {
            parsed: &parsed,
            mtime: at(mtime_ms_ago),
            flock_free,
            known_for: Duration::ZERO,
        };
        judge(&ev, RULES, &fake())
    }

    #[test]
    fn unreadable_records_get_a_grace_period() {
        assert_eq!(verdict("", 1_000, None), Verdict::Live);
        assert_eq!(verdict("{\"uui", 9_999, None), Verdict::Live);
        assert_eq!(verdict("", 10_000, None), Verdict::NeedsFlockTest);
        assert_eq!(
            verdict("", 10_000, Some(true)),
            Verdict::Stale(StaleReason::Unreadable)
        );
        assert_eq!(verdict("", 60_000, Some(false)), Verdict::Live);
        // Modified "in the future" (the clock went back since): the grace
        // period counts from when this process first saw the file.
        let parsed = parse(b"");
        let ev = Evidence {
            parsed: &parsed,
            mtime: at(0) + Duration::from_secs(99),
            flock_free: None,
            known_for: Duration::from_secs(1),
        };
        assert_eq!(judge(&ev, RULES, &fake()), Verdict::Live);
        let ev = Evidence {
            known_for: Duration::from_secs(10),
            ..ev
        };
        assert_eq!(judge(&ev, RULES, &fake()), Verdict::NeedsFlockTest);
        let ev = Evidence {
            flock_free: Some(false),
            ..ev
        };
        assert_eq!(judge(&ev, RULES, &fake()), Verdict::Live);
    }

    #[test]
    fn leasehold_records_on_this_boot_are_judged_by_flock() {
        let rec = r#"{"uuid":"u","pid":424242,"leasehold":1,"bootId":"boot-a","timeNs":"time:[1]","leaseMs":30000,"renewedAtBoot":45000}"#;
        assert_eq!(verdict(rec, 0, None), Verdict::NeedsFlockTest);
        assert_eq!(
            verdict(rec, 0, Some(true)),
            Verdict::Stale(StaleReason::DeadOwner)
        );
        // The pid is dead, but the flock says the holder lives (another pid namespace).
        assert_eq!(verdict(rec, 0, Some(false)), Verdict::Live);
    }

    #[test]
    fn leases_on_this_boot_use_the_boot_clock() {
        // Renewed at 45 s with a 30 s lease: expires at 75 s on the boot clock.
        let rec = r#"{"uuid":"u","pid":1,"leasehold":1,"bootId":"boot-a","timeNs":"time:[1]","leaseMs":30000,"renewedAtBoot":45000,"leaseExpiresAt":"2000-01-01T00:00:00.000Z"}"#;
        // The wall-clock field says long expired (a clock step): ignored.
        assert_eq!(verdict(rec, 0, Some(false)), Verdict::Live);
        let rec = r#"{"uuid":"u","pid":1,"leasehold":1,"bootId":"boot-a","timeNs":"time:[1]","leaseMs":30000,"renewedAtBoot":20000}"#;
        assert_eq!(
            verdict(rec, 0, Some(false)),
            Verdict::Stale(StaleReason::LeaseExpired)
        );
    }

    #[test]
    fn boot_clocks_compare_only_within_one_time_namespace() {
        let soon = crate::record::format_time(at(0) + Duration::from_millis(500));
        let gone = crate::record::format_time(at(2_500));
        let rec = |time_ns: &str, renewed: u64, expires: &str| {
            format!(
                r#"{{"uuid":"u","pid":1,"leasehold":1,"bootId":"boot-a"{time_ns},"leaseMs":30000,"renewedAtBoot":{renewed},"leaseExpiresAt":"{expires}"}}"#
            )
        };
        let other = r#","timeNs":"time:[2]""#;
        // The holder's boot clock is far behind ours (we are in a namespace
        // whose clock is ahead): on our clock its renewal looks 20 s old
        // past the lease, but it renewed a moment ago on the wall clock.
        assert_eq!(verdict(&rec(other, 20_000, &soon), 0, Some(false)), Verdict::Live);
        // The holder's clock is far ahead (restored by CRIU, say) and it is
        // frozen with the flock held: its wall-clock lease decides.
        let frozen = rec(other, 10_000_000_000, &gone);
        assert_eq!(
            verdict(&frozen, 30_000, Some(false)),
            Verdict::Stale(StaleReason::LeaseExpired)
        );
        assert_eq!(verdict(&frozen, 29_000, Some(false)), Verdict::Live);
        // An older leasehold, which wrote no timeNs, read by a process that
        // has one: the wall clock, too.
        assert_eq!(verdict(&rec("", 0, &soon), 0, Some(false)), Verdict::Live);
        assert_eq!(
            verdict(&rec("", 10_000_000_000, &gone), 30_000, Some(false)),
            Verdict::Stale(StaleReason::LeaseExpired)
        );
        // A kernel without time namespaces: neither side has one, and the
        // boot clock decides whatever the wall clock says.
        let mut host = fake();
        host.me.time_ns = None;
        for (renewed, expected) in [
            (20_000, Verdict::Stale(StaleReason::LeaseExpired)),
            (45_000, Verdict::Live),
        ] {
            let parsed = parse(rec("", renewed, if renewed == 20_000 { &soon } else { &gone }).as_bytes());
            let ev = Evidence {
                parsed: &parsed,
                mtime: at(0),
                flock_free: Some(false),
                known_for: Duration::ZERO,
            };
            assert_eq!(judge(&ev, RULES, &host), expected, "renewed at {renewed}");
        }
        // Liveness by flock does not depend on the clock: still decisive.
        assert_eq!(verdict(&frozen, 0, None), Verdict::NeedsFlockTest);
        assert_eq!(
            verdict(&frozen, 0, Some(true)),
            Verdict::Stale(StaleReason::DeadOwner)
        );
    }

    #[test]
    fn other_hosts_are_judged_by_lease_alone() {
        let past = crate::record::format_time(at(2_001));
        let future = crate::record::format_time(at(0) + Duration::from_secs(5));
        let live = format!(
            r#"{{"uuid":"u","pid":999999,"hostname":"there","bootId":"boot-z","leasehold":1,"leaseExpiresAt":"{future}"}}"#
        );
        assert_eq!(verdict(&live, 0, None), Verdict::Live);
        let dead = format!(r#"{{"uuid":"u","pid":999999,"hostname":"there","leaseExpiresAt":"{past}"}}"#);
        assert_eq!(verdict(&dead, 0, None), Verdict::Stale(StaleReason::LeaseExpired));
        // A torn or stale leaseExpiresAt never beats mtime + leaseMs.
        let torn =
            format!(r#"{{"uuid":"u","pid":9,"hostname":"there","leaseMs":30000,"leaseExpiresAt":"{past}"}}"#);
        assert_eq!(verdict(&torn, 29_000, None), Verdict::Live);
        assert_eq!(
            verdict(&torn, 30_000, None),
            Verdict::Stale(StaleReason::LeaseExpired)
        );
    }

    #[test]
    fn wall_clock_leases_allow_for_skew_between_hosts() {
        let just = crate::record::format_time(at(1_500));
        let long = crate::record::format_time(at(2_500));
        let rec = |t: &str| format!(r#"{{"pid":9,"hostname":"there","leaseExpiresAt":"{t}"}}"#);
        assert_eq!(verdict(&rec(&just), 0, None), Verdict::Live);
        assert_eq!(
            verdict(&rec(&long), 0, None),
            Verdict::Stale(StaleReason::LeaseExpired)
        );
    }

    #[test]
    fn a_far_future_lease_does_not_keep_a_lock_forever() {
        let rec = r#"{"pid":9,"hostname":"there","leaseExpiresAt":"2999-01-01T00:00:00.000Z"}"#;
        assert_eq!(verdict(rec, 3_600_000, None), Verdict::Live);
        assert_eq!(
            verdict(rec, 90_000_000, None),
            Verdict::Stale(StaleReason::LeaseExpired)
        );
        // With leaseMs, the claim is held to the lease it states.
        let rec =
            r#"{"pid":9,"hostname":"there","leaseMs":30000,"leaseExpiresAt":"2999-01-01T00:00:00.000Z"}"#;
        assert_eq!(
            verdict(rec, 33_000, None),
            Verdict::Stale(StaleReason::LeaseExpired)
        );
    }

    #[test]
    fn a_clock_jump_robs_no_live_holder_and_keeps_no_dead_one() {
        // Jump forward a year: a leasehold holder on this boot is judged on
        // the boot clock, so it keeps its lock.
        let rec = r#"{"uuid":"u","pid":1,"leasehold":1,"bootId":"boot-a","timeNs":"time:[1]","leaseMs":30000,"renewedAtBoot":45000}"#;
        let parsed = parse(rec.as_bytes());
        let mut host = fake();
        host.now += Duration::from_secs(365 * 86_400);
        let ev = Evidence {
            parsed: &parsed,
            mtime: at(0),
            flock_free: Some(false),
            known_for: Duration::ZERO,
        };
        assert_eq!(judge(&ev, RULES, &host), Verdict::Live);
        // Jump back a year: an abandoned empty record now looks written in
        // the future; once known for the grace period it is judged, not
        // kept until the clock catches up.
        let mut host = fake();
        host.now -= Duration::from_secs(365 * 86_400);
        let empty = parse(b"");
        let ev = Evidence {
            parsed: &empty,
            mtime: at(0),
            flock_free: None,
            known_for: Duration::from_secs(10),
        };
        assert_eq!(judge(&ev, RULES, &host), Verdict::NeedsFlockTest);
        let ev = Evidence {
            parsed: &empty,
            mtime: at(0),
            flock_free: Some(true),
            known_for: Duration::from_secs(10),
        };
        assert_eq!(judge(&ev, RULES, &host), Verdict::Stale(StaleReason::Unreadable));
        // ...and a dead pid is dead whatever the clock says.
        let ev = Evidence {
            parsed: &parse(br#"{"uuid":"u","pid":555}"#),
            mtime: at(0),
            flock_free: None,
            known_for: Duration::ZERO,
        };
        assert_eq!(judge(&ev, RULES, &host), Verdict::Stale(StaleReason::DeadOwner));
    }

    #[test]
    fn previous_boot_is_dead() {
        let rec = r#"{"uuid":"u","pid":100,"hostname":"here","machineId":"machine-a","bootId":"boot-old","leasehold":1}"#;
        assert_eq!(verdict(rec, 0, None), Verdict::Stale(StaleReason::PreviousBoot));
    }

    #[test]
    fn another_host_with_the_same_name_is_not_a_previous_boot() {
        let rec = r#"{"uuid":"u","pid":100,"hostname":"here","machineId":"machine-b","bootId":"boot-b","leasehold":1,"leaseMs":30000}"#;
        assert_eq!(verdict(rec, 0, None), Verdict::Live);
        // Without machine ids, a different boot id is another kernel: lease only.
        let rec =
            r#"{"uuid":"u","pid":555,"hostname":"here","bootId":"boot-b","leasehold":1,"leaseMs":30000}"#;
        assert_eq!(verdict(rec, 0, None), Verdict::Live);
        // An empty host name says nothing about the host.
        let rec = r#"{"uuid":"u","pid":555,"hostname":""}"#;
        assert_eq!(verdict(rec, 0, None), Verdict::Live);
    }

    #[test]
    fn foreign_records_use_pid_and_start_time() {
        assert_eq!(
            verdict(r#"{"uuid":"u","pid":555}"#, 0, None),
            Verdict::Stale(StaleReason::DeadOwner)
        );
        assert_eq!(verdict(r#"{"uuid":"u","pid":100}"#, 0, None), Verdict::Live);
        let right = format!(r#"{{"uuid":"u","pid":100,"startTime":{}}}"#, NOW_MS - 3_600_000);
        assert_eq!(verdict(&right, 60_000, None), Verdict::Live);
        // pid 200 started a second ago, the record was written a minute ago.
        let wrong = format!(r#"{{"uuid":"u","pid":200,"startTime":{}}}"#, NOW_MS - 7_200_000);
        assert_eq!(
            verdict(&wrong, 60_000, None),
            Verdict::Stale(StaleReason::ReusedPid)
        );
        // Same mismatch in seconds.
        let secs = format!(
            r#"{{"uuid":"u","pid":200,"startTime":{}}}"#,
            (NOW_MS - 7_200_000) / 1000
        );
        assert_eq!(
            verdict(&secs, 60_000, None),
            Verdict::Stale(StaleReason::ReusedPid)
        );
    }

    /// A host up for `uptime_s`, with pid 500 started `age_s` ago.
    fn host_up(uptime_s: u64, age_s: u64) -> (Fake, u64) {
        let mut host = fake();
        host.boot_ms = uptime_s * 1000;
        let ticks = (uptime_s - age_s) * 100;
        host.procs.insert(
            500,
            Some(ProcStart {
                ticks,
                epoch_ms: NOW_MS - age_s * 1000,
                age_ms: age_s * 1000,
            }),
        );
        (host, ticks)
    }

    fn judge_on(host: &Fake, json: &str, mtime_ms_ago: u64) -> Verdict {
        let parsed = parse(json.as_bytes());
        let ev = Evidence {
            parsed: &parsed,
            mtime: at(mtime_ms_ago),
            flock_free: None,
            known_for: Duration::ZERO,
        };
        judge(&ev, RULES, host)
    }

    fn pi_research(pid: u64, start: impl std::fmt::Display) -> String {
        format!(r#"{{"uuid":"u","pid":{pid},"startTime":{start}}}"#)
    }

    #[test]
    fn start_ticks_name_the_owner_exactly() {
        let (host, ticks) = host_up(2_000, 500);
        // pi-research's own tolerance: within one tick is the owner.
        for start in [ticks - 1, ticks, ticks + 1] {
            assert_eq!(
                judge_on(&host, &pi_research(500, start), 0),
                Verdict::Live,
                "{start}"
            );
        }
        // A process that started after the recorded owner is a newer
        // process with the pid: reclaimed at once, however fresh the record.
        for start in [ticks - 2, 0, 100] {
            assert_eq!(
                judge_on(&host, &pi_research(500, start), 0),
                Verdict::Stale(StaleReason::ReusedPid),
                "{start}"
            );
        }
        // One that started before it cannot have reused its pid: the record
        // comes from another pid namespace (a container), and is kept.
        for start in [ticks + 2, 200_000] {
            assert_eq!(
                judge_on(&host, &pi_research(500, start), 0),
                Verdict::Live,
                "{start}"
            );
        }
        // Not ticks: later than the boot clock now, or not a whole number.
        for start in ["200002", "150000.5", "-1"] {
            assert_eq!(
                judge_on(&host, &pi_research(500, start), 0),
                Verdict::Live,
                "{start}"
            );
        }
    }

    #[test]
    fn start_ticks_compare_only_within_one_time_namespace() {
        let (mut host, ticks) = host_up(2_000, 500);
        let wrong = pi_research(500, ticks - 50);
        // The live process is in another time namespace, or its namespace
        // cannot be read: its writer may have seen shifted ticks.
        host.time_ns_of.insert(500, Some("time:[2]".into()));
        assert_eq!(judge_on(&host, &wrong, 0), Verdict::Live);
        host.time_ns_of.insert(500, None);
        assert_eq!(judge_on(&host, &wrong, 0), Verdict::Live);
        // A kernel without time namespaces has one boot clock.
        host.me.time_ns = None;
        assert_eq!(judge_on(&host, &wrong, 0), Verdict::Stale(StaleReason::ReusedPid));
    }

    #[test]
    fn a_start_time_plausible_in_two_units_is_the_owners_if_either_matches() {
        // Up 250 days at 100 Hz: tick counts reach epoch seconds.
        let (host, ticks) = host_up(250 * 86_400, 47 * 86_400);
        let epoch_s = (NOW_MS - 47 * 86_400_000) / 1000;
        assert!(ticks > (NOW_MS / 1000 - 250 * 86_400) && ticks < NOW_MS / 1000);
        assert_eq!(judge_on(&host, &pi_research(500, ticks), 0), Verdict::Live);
        assert_eq!(judge_on(&host, &pi_research(500, epoch_s), 0), Verdict::Live);
        // Ticks that match nothing, as epoch seconds a start after the
        // process's own: a reused pid only once the process is provably
        // younger than the record in that unit too.
        let wrong = pi_research(500, ticks - 50);
        assert_eq!(judge_on(&host, &wrong, 0), Verdict::Live);
        assert_eq!(
            judge_on(&host, &wrong, 50 * 86_400_000),
            Verdict::Stale(StaleReason::ReusedPid)
        );
    }

    #[test]
    fn undecidable_start_times_mean_alive() {
        // Clock ticks since boot, or microseconds: no unit we can trust.
        for st in ["123456", "1764745566000000", "-5", "1e300"] {
            let rec = format!(r#"{{"uuid":"u","pid":200,"startTime":{st}}}"#);
            assert_eq!(verdict(&rec, 60_000, None), Verdict::Live, "startTime {st}");
        }
        // A mismatching start time of a process older than the record: the
        // writer used another clock or unit, not a reused pid.
        let rec = format!(r#"{{"uuid":"u","pid":100,"startTime":{}}}"#, NOW_MS - 60_000);
        assert_eq!(verdict(&rec, 10_000, None), Verdict::Live);
        // A forward clock step after the record was written: the start
        // times disagree and the record looks older than it is, but not by
        // more than the step slack.
        let rec = format!(r#"{{"uuid":"u","pid":400,"startTime":{}}}"#, NOW_MS - 25_000);
        assert_eq!(verdict(&rec, 25_000, None), Verdict::Live);
        // Start time unreadable (e.g. no /proc): alive.
        let rec = format!(r#"{{"uuid":"u","pid":300,"startTime":{}}}"#, NOW_MS - 7_200_000);
        assert_eq!(verdict(&rec, 60_000, None), Verdict::Live);
    }

    #[test]
    fn records_without_a_lease_get_the_foreign_lease() {
        let rec = r#"{"uuid":"u","pid":100}"#;
        assert_eq!(verdict(rec, 119_000, None), Verdict::Live);
        assert_eq!(
            verdict(rec, 120_000, None),
            Verdict::Stale(StaleReason::LeaseExpired)
        );
        let parsed = parse(rec.as_bytes());
        let ev = Evidence {
            parsed: &parsed,
            mtime: at(600_000),
            flock_free: None,
            known_for: Duration::ZERO,
        };
        let forever = Rules {
            foreign_lease: None,
            ..RULES
        };
        assert_eq!(judge(&ev, forever, &fake()), Verdict::Live);
        assert_eq!(
            recheck_at(&parsed, at(0), RULES),
            Some(at(0) + Duration::from_secs(120))
        );
    }

    /// Judges `json` with the fake clocks (wall and boot alike) moved
    /// `later` ahead.
    fn verdict_later(
        json: &str,
        mtime: SystemTime,
        known_for: Duration,
        flock_free: Option<bool>,
        rules: Rules,
        later: Duration,
    ) -> Verdict {
        let parsed = parse(json.as_bytes());
        let mut host = fake();
        host.now += later;
        host.boot_ms += u64::try_from(later.as_millis()).unwrap();
        let ev = Evidence {
            parsed: &parsed,
            mtime,
            flock_free,
            known_for,
        };
        judge(&ev, rules, &host)
    }

    const DAY: Duration = Duration::from_secs(86_400);
    const FOREVER: Rules = Rules {
        foreign_lease: None,
        ..RULES
    };

    #[test]
    fn leasehold_records_without_a_lease_get_the_foreign_lease_too() {
        for rec in [
            r#"{"uuid":"u","leasehold":1}"#,
            r#"{"uuid":"u","pid":9,"leasehold":1,"hostname":"there"}"#,
            r#"{"uuid":"u","pid":100,"leasehold":1}"#,
        ] {
            assert_eq!(verdict(rec, 119_000, None), Verdict::Live, "{rec}");
            assert_eq!(
                verdict(rec, 120_000, None),
                Verdict::Stale(StaleReason::LeaseExpired),
                "{rec}"
            );
        }
    }

    #[test]
    fn a_lease_length_without_a_claimed_end_still_ends() {
        let rec = r#"{"uuid":"u","pid":9,"hostname":"there","leaseMs":30000}"#;
        assert_eq!(verdict(rec, 29_000, None), Verdict::Live);
        assert_eq!(
            verdict(rec, 30_000, None),
            Verdict::Stale(StaleReason::LeaseExpired)
        );
    }

    #[test]
    fn without_a_foreign_lease_only_a_provably_alive_owner_keeps_a_leaseless_record() {
        let old = at(0);
        let kept = |rec: &str, flock: Option<bool>| {
            verdict_later(rec, old, Duration::ZERO, flock, FOREVER, 400 * DAY)
        };
        // A live pid of this host, or a held flock on this boot: kept.
        assert_eq!(kept(r#"{"uuid":"u","pid":100}"#, None), Verdict::Live);
        let own = r#"{"uuid":"u","pid":424242,"leasehold":1,"bootId":"boot-a"}"#;
        assert_eq!(kept(own, Some(false)), Verdict::Live);
        assert_eq!(kept(own, Some(true)), Verdict::Stale(StaleReason::DeadOwner));
        // Owners that cannot be checked from here: the longest foreign lease.
        for rec in [
            r#"{"uuid":"u","pid":9,"hostname":"there"}"#,
            r#"{"uuid":"u","pid":555,"pidNs":"pid:[2]"}"#,
            r#"{"uuid":"u","pid":0}"#,
            r#"{"uuid":"u","leasehold":1,"hostname":"here"}"#,
            r#"{"uuid":"u","pid":100,"bootId":"boot-b","leasehold":1}"#,
        ] {
            let at = |later| verdict_later(rec, old, Duration::ZERO, None, FOREVER, later);
            assert_eq!(at(DAY - Duration::from_secs(1)), Verdict::Live, "{rec}");
            assert_eq!(at(DAY), Verdict::Stale(StaleReason::LeaseExpired), "{rec}");
        }
    }

    #[test]
    fn a_modification_time_in_the_future_extends_no_bound() {
        let future = at(0) + 365 * DAY;
        let judge_known_for = |rec: &str, known_for: Duration| {
            verdict_later(rec, future, known_for, None, RULES, Duration::ZERO)
        };
        let rec = r#"{"pid":9,"hostname":"there","leaseMs":30000}"#;
        assert_eq!(judge_known_for(rec, Duration::from_secs(29)), Verdict::Live);
        assert_eq!(
            judge_known_for(rec, Duration::from_secs(30)),
            Verdict::Stale(StaleReason::LeaseExpired)
        );
        let rec = r#"{"uuid":"u","pid":100}"#;
        assert_eq!(judge_known_for(rec, Duration::from_secs(119)), Verdict::Live);
        assert_eq!(
            judge_known_for(rec, Duration::from_secs(120)),
            Verdict::Stale(StaleReason::LeaseExpired)
        );
        let rec = r#"{"pid":9,"hostname":"there","leaseExpiresAt":"2999-01-01T00:00:00.000Z"}"#;
        assert_eq!(
            judge_known_for(rec, DAY),
            Verdict::Stale(StaleReason::LeaseExpired)
        );
    }

    #[test]
    fn huge_leases_end_within_a_year() {
        let rec = r#"{"pid":9,"hostname":"there","leaseMs":9000000000000000}"#;
        let later = |d| verdict_later(rec, at(0), Duration::ZERO, None, RULES, d);
        assert_eq!(later(364 * DAY), Verdict::Live);
        assert_eq!(
            later(MAX_LEASE + CLOCK_SKEW),
            Verdict::Stale(StaleReason::LeaseExpired)
        );
        // On the boot clock, too.
        let rec = r#"{"uuid":"u","pid":1,"leasehold":1,"bootId":"boot-a","timeNs":"time:[1]","leaseMs":9000000000000000,"renewedAtBoot":45000}"#;
        let later = |d| verdict_later(rec, at(0), Duration::ZERO, Some(false), RULES, d);
        assert_eq!(later(364 * DAY), Verdict::Live);
        assert_eq!(later(MAX_LEASE), Verdict::Stale(StaleReason::LeaseExpired));
        // A renewal "later than now" on our own boot clock is no renewal
        // on it: the wall clock decides.
        let rec = r#"{"uuid":"u","pid":1,"leasehold":1,"bootId":"boot-a","timeNs":"time:[1]","leaseMs":30000,"renewedAtBoot":900000000}"#;
        assert_eq!(verdict(rec, 29_000, Some(false)), Verdict::Live);
        assert_eq!(
            verdict(rec, 30_000, Some(false)),
            Verdict::Stale(StaleReason::LeaseExpired)
        );
    }

    #[test]
    fn rechecks_come_when_the_lease_can_end() {
        let rec = parse(br#"{"pid":9,"hostname":"there","leaseExpiresAt":"2025-12-03T07:06:06.000Z"}"#);
        let claimed = crate::record::parse_time("2025-12-03T07:06:06.000Z").unwrap();
        assert_eq!(
            recheck_on(&rec, at(0), RULES, &fake()),
            Some(claimed + CLOCK_SKEW)
        );
        // On this boot clock: renewed at 45 s, 30 s lease, now 50 s.
        let rec = parse(
            br#"{"uuid":"u","pid":1,"leasehold":1,"bootId":"boot-a","timeNs":"time:[1]","leaseMs":30000,"renewedAtBoot":45000}"#,
        );
        assert_eq!(
            recheck_on(&rec, at(0), RULES, &fake()),
            Some(at(0) + Duration::from_secs(25))
        );
    }

    mod every_record {
        use super::*;
        use crate::record::format_time;
        use proptest::prelude::*;
        use serde_json::Value;

        const FIELDS: &[&str] = &[
            "uuid",
            "pid",
            "startTime",
            "holderId",
            "hostname",
            "acquiredAt",
            "leaseExpiresAt",
            "leaseMs",
            "leasehold",
            "bootId",
            "pidNs",
            "timeNs",
            "procStart",
            "renewedAtBoot",
            "machineId",
            "fencingToken",
            "name",
        ];

        /// The documented bound past which every record is stale unless
        /// its holder is provably alive: the longest lease plus the skew
        /// margin (it exceeds the grace period, the foreign lease, which is
        /// capped at the longest lease, and the longest foreign lease).
        const BOUND: Duration = Duration::from_secs(MAX_LEASE.as_secs() + CLOCK_SKEW.as_secs());
        const YEAR_S: i64 = 365 * 86_400;

        fn time_around_now() -> impl Strategy<Value = Value> {
            (-100 * YEAR_S..100 * YEAR_S).prop_map(|offset| {
                let t = if offset >= 0 {
                    at(0) + Duration::from_secs(offset.unsigned_abs())
                } else {
                    at(0) - Duration::from_secs(offset.unsigned_abs())
                };
                Value::from(format_time(t))
            })
        }

        fn value() -> impl Strategy<Value = Value> {
            prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                any::<f64>().prop_map(Value::from),
                (-1.0e7f64..1.0e7).prop_map(Value::from),
                prop::sample::select(vec![
                    0u64,
                    1,
                    100,
                    200,
                    300,
                    400,
                    555,
                    30_000,
                    45_000,
                    50_000,
                    9_000_000_000_000_000
                ])
                .prop_map(Value::from),
                prop::sample::select(vec![
                    "here",
                    "there",
                    "",
                    "boot-a",
                    "boot-b",
                    "machine-a",
                    "pid:[1]",
                    "pid:[2]",
                    "time:[1]",
                    "time:[2]",
                    "NaN",
                    "-1",
                    "1e400",
                    "2999-01-01T00:00:00.000Z",
                ])
                .prop_map(Value::from),
                time_around_now(),
                "\\PC{0,12}".prop_map(Value::from),
                Just(Value::Array(vec![Value::from(1)])),
                Just(serde_json::json!({"x": null})),
            ]
        }

        fn record_bytes() -> impl Strategy<Value = Vec<u8>> {
            let object =
                prop::collection::btree_map(prop::sample::select(FIELDS), value(), 0..10).prop_map(|m| {
                    let map = m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
                    serde_json::to_vec(&Value::Object(map)).unwrap()
                });
            prop_oneof![
                6 => object,
                1 => prop::collection::vec(any::<u8>(), 0..64),
                1 => prop::sample::select(vec![
                    b"".to_vec(),
                    br#"{"uuid":"u","pid":1e400}"#.to_vec(),
                    br#"{"uuid":"u","leasehold":1,"leaseMs":-1}"#.to_vec(),
                    b"0b5e2f2c-7d1e-4a51-9a47-0f7f2d0f8c11".to_vec(),
                    br#"{"uuid":"a","pid":12"#.to_vec(),
                    b"[1,2]".to_vec(),
                ]),
            ]
        }

        /// Modification times before now, or so far after it that they are
        /// still in the future once the clock has moved past the bound.
        fn mtime() -> impl Strategy<Value = SystemTime> {
            prop_oneof![
                (0..200 * YEAR_S as u64).prop_map(|s| at(0) - Duration::from_secs(s)),
                (2 * BOUND.as_secs()..100 * YEAR_S as u64).prop_map(|s| at(0) + Duration::from_secs(s)),
            ]
        }

        fn rules() -> impl Strategy<Value = Rules> {
            (1u64..3_600, prop::option::of(1u64..2 * YEAR_S as u64)).prop_map(|(grace, foreign)| Rules {
                grace: Duration::from_secs(grace),
                foreign_lease: foreign.map(Duration::from_secs),
            })
        }

        /// Judges as `Found::judge` does: the flock is tested only when asked.
        fn judge_with_flock(
            parsed: &Parsed,
            mtime: SystemTime,
            known_for: Duration,
            held: bool,
            rules: Rules,
            host: &Fake,
        ) -> Verdict {
            let mut ev = Evidence {
                parsed,
                mtime,
                flock_free: None,
                known_for,
            };
            let verdict = judge(&ev, rules, host);
            if verdict != Verdict::NeedsFlockTest {
                return verdict;
            }
            ev.flock_free = Some(!held);
            judge(&ev, rules, host)
        }

        proptest! {
            #[test]
            fn every_record_is_stale_past_the_bound_unless_its_holder_provably_lives(
                bytes in record_bytes(),
                mtime in mtime(),
                held in any::<bool>(),
                rules in rules(),
            ) {
                let parsed = parse(&bytes);
                // Now: anything but a panic.
                let host = fake();
                let now = judge_with_flock(&parsed, mtime, Duration::ZERO, held, rules, &host);
                prop_assert_ne!(now, Verdict::NeedsFlockTest);
                let _ = recheck_on(&parsed, mtime, rules, &host);

                // Past the bound, counted from when the file was first seen.
                let later = BOUND + Duration::from_secs(1);
                let mut host = fake();
                host.now += later;
                host.boot_ms += u64::try_from(later.as_millis()).unwrap();
                let verdict = judge_with_flock(&parsed, mtime, later, held, rules, &host);
                let record = match &parsed {
                    Parsed::Record(r) if r.pid.is_some() || r.is_leasehold() => Some(r),
                    _ => None,
                };
                let flock_proves = held
                    && record.is_none_or(|r| r.is_leasehold() && r.boot_id.as_deref() == Some("boot-a"));
                let pid_proves = rules.foreign_lease.is_none()
                    && record.is_some_and(|r| {
                        r.lease_ms.is_none()
                            && r.lease_expires_at.is_none()
                            && r.pid.is_some_and(|pid| host.procs.contains_key(&pid))
                    });
                if !(flock_proves || pid_proves) {
                    prop_assert!(
                        matches!(verdict, Verdict::Stale(_)),
                        "{:?} kept: {verdict:?}",
                        String::from_utf8_lossy(&bytes)
                    );
                }
                prop_assert_ne!(verdict, Verdict::NeedsFlockTest);
            }
        }
    }

    #[test]
    fn other_pid_namespaces_are_not_probed() {
        let rec = r#"{"uuid":"u","pid":555,"hostname":"here","pidNs":"pid:[2]"}"#;
        assert_eq!(verdict(rec, 0, None), Verdict::Live);
        let _ = Record::default();
    }
}
