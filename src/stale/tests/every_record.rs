//! Every record falls under a rule (property tests).

use super::*;
use crate::timestamp::format_time;
use proptest::prelude::*;
use serde_json::Value;

/// The keys of a leasehold record that judging reads: the format's one
/// list ([`RESERVED_KEYS`](crate::field::RESERVED_KEYS)) but the kinds of
/// a shared lock's marker.
fn fields() -> Vec<&'static str> {
    crate::field::RESERVED_KEYS
        .iter()
        .copied()
        .filter(|k| !matches!(*k, "mode" | "permits" | "group"))
        .collect()
}

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
    let object = prop::collection::btree_map(prop::sample::select(fields()), value(), 0..10).prop_map(|m| {
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
        if now == Verdict::NotALock {
            prop_assert!(matches!(parsed, Parsed::Foreign | Parsed::UuidPrefix), "{:?}", parsed);
        }
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
        // What no writer produces is no lock, whatever its age: never
        // taken. A UUID's prefix is one once past the grace period.
        let not_a_lock = matches!(parsed, Parsed::Foreign | Parsed::UuidPrefix);
        if not_a_lock {
            prop_assert_eq!(verdict, Verdict::NotALock);
        } else if !(flock_proves || pid_proves) {
            prop_assert!(
                matches!(verdict, Verdict::Stale(_)),
                "{:?} kept: {verdict:?}",
                String::from_utf8_lossy(&bytes)
            );
        }
        prop_assert_ne!(verdict, Verdict::NeedsFlockTest);
    }
}
