//! Owners: pids, start times, namespaces, foreign leases.

use super::*;

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
    let kept =
        |rec: &str, flock: Option<bool>| verdict_later(rec, old, Duration::ZERO, flock, FOREVER, 400 * DAY);
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
    let judge_known_for =
        |rec: &str, known_for: Duration| verdict_later(rec, future, known_for, None, RULES, Duration::ZERO);
    let rec = r#"{"holderId":"h","pid":9,"hostname":"there","leaseMs":30000}"#;
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
    let rec = r#"{"holderId":"h","pid":9,"hostname":"there","leaseExpiresAt":"2999-01-01T00:00:00.000Z"}"#;
    assert_eq!(
        judge_known_for(rec, DAY),
        Verdict::Stale(StaleReason::LeaseExpired)
    );
}

#[test]
fn huge_leases_end_within_a_year() {
    let rec = r#"{"holderId":"h","pid":9,"hostname":"there","leaseMs":9000000000000000}"#;
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
    let rec =
        parse(br#"{"holderId":"h","pid":9,"hostname":"there","leaseExpiresAt":"2025-12-03T07:06:06.000Z"}"#);
    let claimed = crate::timestamp::parse_time("2025-12-03T07:06:06.000Z").unwrap();
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

#[test]
fn other_pid_namespaces_are_not_probed() {
    let rec = r#"{"uuid":"u","pid":555,"hostname":"here","pidNs":"pid:[2]"}"#;
    assert_eq!(verdict(rec, 0, None), Verdict::Live);
    let _ = Record::default();
}

/// A macOS or FreeBSD host: no start ticks, no boot id or namespaces,
/// starts read from `kinfo_proc` (a wall-clock `timeval`) and mapped onto
/// `ProcStart` by `sys::kinfo`; pi-research writes whole epoch seconds.
#[test]
fn kinfo_proc_starts_tell_a_reused_pid_on_the_bsds() {
    use crate::sys::kinfo::{start_from_wall, start_time_s, timeval_ms};
    let mut host = fake();
    host.hz = None;
    host.me.boot_id = None;
    host.me.machine_id = None;
    host.me.pid_ns = None;
    host.me.time_ns = None;
    // pid 600 started 1.25 s ago, pid 700 two hours ago (kernel timevals).
    let young = timeval_ms(((NOW_MS - 1_250) / 1000) as i64, 750_000).unwrap();
    let old = timeval_ms(((NOW_MS - 7_200_000) / 1000) as i64, 0).unwrap();
    host.procs
        .insert(600, Some(start_from_wall(young, NOW_MS, host.boot_ms)));
    host.procs
        .insert(700, Some(start_from_wall(old, NOW_MS, host.boot_ms)));
    let young = host.procs[&600].unwrap();
    let old = host.procs[&700].unwrap();
    // Each owner's own startTime names it, whenever it wrote the record.
    assert_eq!(
        judge_on(&host, &pi_research(600, start_time_s(&young)), 0),
        Verdict::Live
    );
    assert_eq!(
        judge_on(&host, &pi_research(700, start_time_s(&old)), 60_000),
        Verdict::Live
    );
    // A record written a minute ago by an earlier owner of pid 600: the
    // live process is younger than the record, so the pid was reused.
    assert_eq!(
        judge_on(&host, &pi_research(600, start_time_s(&old)), 60_000),
        Verdict::Stale(StaleReason::ReusedPid)
    );
    // A value only start ticks could be is not read as ticks here.
    assert_eq!(judge_on(&host, &pi_research(600, 4_000), 60_000), Verdict::Live);
    // The same record as ticks would convict on a Linux host.
    host.hz = Some(100);
    assert_eq!(
        judge_on(&host, &pi_research(600, 4_000), 60_000),
        Verdict::Stale(StaleReason::ReusedPid)
    );
}
