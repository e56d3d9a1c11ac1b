//! Leases, boot clocks, grace periods and clock steps.

use super::*;

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

/// Records are not synced by default, so a power loss leaves empty or
/// torn ones behind; written before this boot, nobody is writing them.
#[test]
fn unreadable_records_from_before_the_boot_get_no_grace_period() {
    // The fake booted 50 s ago; a record changed 53 s ago predates it by
    // more than the clock skew margin.
    let mut host = fake();
    host.host_wide_boot = true;
    for torn in ["", "{\"uuid\":\"a1\",\"pi", "   "] {
        let parsed = parse(torn.as_bytes());
        let judged = |mtime_ms_ago, flock_free, host: &Fake| {
            let ev = Evidence {
                parsed: &parsed,
                mtime: at(mtime_ms_ago),
                flock_free,
                known_for: Duration::ZERO,
            };
            judge(
                &ev,
                Rules {
                    grace: Duration::from_secs(3600),
                    ..RULES
                },
                host,
            )
        };
        assert_eq!(judged(53_000, None, &host), Verdict::NeedsFlockTest, "{torn:?}");
        assert_eq!(
            judged(53_000, Some(true), &host),
            Verdict::Stale(StaleReason::PreviousBoot),
            "{torn:?}"
        );
        // A held flock still proves a writer, whatever the clocks say.
        assert_eq!(judged(53_000, Some(false), &host), Verdict::Live, "{torn:?}");
        // Within the skew margin of the boot, or after it: the grace
        // period applies.
        assert_eq!(judged(51_000, None, &host), Verdict::Live, "{torn:?}");
        assert_eq!(judged(1_000, None, &host), Verdict::Live, "{torn:?}");
        // Where the boot clock is shifted (a time namespace), when the
        // machine booted is unknown: the grace period applies.
        let shifted = Fake {
            host_wide_boot: false,
            ..fake()
        };
        assert_eq!(judged(53_000, None, &shifted), Verdict::Live, "{torn:?}");
    }
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
    let soon = crate::timestamp::format_time(at(0) + Duration::from_millis(500));
    let gone = crate::timestamp::format_time(at(2_500));
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
    let past = crate::timestamp::format_time(at(2_001));
    let future = crate::timestamp::format_time(at(0) + Duration::from_secs(5));
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
    let just = crate::timestamp::format_time(at(1_500));
    let long = crate::timestamp::format_time(at(2_500));
    let rec = |t: &str| format!(r#"{{"holderId":"h","pid":9,"hostname":"there","leaseExpiresAt":"{t}"}}"#);
    assert_eq!(verdict(&rec(&just), 0, None), Verdict::Live);
    assert_eq!(
        verdict(&rec(&long), 0, None),
        Verdict::Stale(StaleReason::LeaseExpired)
    );
}

#[test]
fn a_far_future_lease_does_not_keep_a_lock_forever() {
    let rec = r#"{"holderId":"h","pid":9,"hostname":"there","leaseExpiresAt":"2999-01-01T00:00:00.000Z"}"#;
    assert_eq!(verdict(rec, 3_600_000, None), Verdict::Live);
    assert_eq!(
        verdict(rec, 90_000_000, None),
        Verdict::Stale(StaleReason::LeaseExpired)
    );
    // With leaseMs, the claim is held to the lease it states.
    let rec = r#"{"holderId":"h","pid":9,"hostname":"there","leaseMs":30000,"leaseExpiresAt":"2999-01-01T00:00:00.000Z"}"#;
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
    let rec = r#"{"uuid":"u","pid":555,"hostname":"here","bootId":"boot-b","leasehold":1,"leaseMs":30000}"#;
    assert_eq!(verdict(rec, 0, None), Verdict::Live);
    // An empty host name says nothing about the host.
    let rec = r#"{"uuid":"u","pid":555,"hostname":""}"#;
    assert_eq!(verdict(rec, 0, None), Verdict::Live);
}
