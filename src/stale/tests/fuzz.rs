//! Fuzzing record parsing and the staleness judgement: arbitrary bytes,
//! and JSON objects over the record's own keys with hostile values (huge,
//! negative, fractional, `NaN`-like strings, nested, long, duplicated,
//! non-UTF-8, cut short), judged on a fake host whose clocks, identity
//! and processes are random too (times far in the future, and before
//! 1970). Beyond "never panics", each property states what must hold.
//!
//! Every property runs [`CASES`] cases by default, a few seconds in all;
//! `PROPTEST_CASES=100000 cargo test --lib stale::tests::fuzz` runs longer.

use super::*;
use crate::record::OwnRecord;
use crate::timestamp::format_time;
use proptest::prelude::*;
use proptest::test_runner::Config;

/// Cases per property, unless `PROPTEST_CASES` says otherwise.
const CASES: u32 = 1024;

fn config() -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES);
    Config {
        cases,
        // A failure is reported with its input; nothing is written to the tree.
        failure_persistence: None,
        ..Config::default()
    }
}

/// Every key of the record (the format's one list,
/// [`RESERVED_KEYS`](crate::field::RESERVED_KEYS)), and a few that are not.
fn keys() -> Vec<&'static str> {
    let mut keys = crate::field::RESERVED_KEYS.to_vec();
    keys.extend(["port", ""]);
    keys
}

const YEAR_S: u64 = 365 * 86_400;

/// A time anywhere from 300 years before 1970 to 300 years after now,
/// and the extremes `SystemTime` can hold.
fn any_time() -> impl Strategy<Value = SystemTime> {
    prop_oneof![
        (-(300 * YEAR_S as i64)..(360 * YEAR_S as i64)).prop_map(|s| shifted(UNIX_EPOCH, s)),
        (-(4 * 3_600i64)..4 * 3_600).prop_map(|s| shifted(at(0), s)),
        Just(UNIX_EPOCH),
        Just(shifted(UNIX_EPOCH, i64::MAX / 2)),
        Just(shifted(UNIX_EPOCH, i64::MIN / 2)),
    ]
}

/// `t` moved by `secs`, as far as `SystemTime` allows.
fn shifted(t: SystemTime, secs: i64) -> SystemTime {
    let d = Duration::from_secs(secs.unsigned_abs());
    let moved = if secs >= 0 {
        t.checked_add(d)
    } else {
        t.checked_sub(d)
    };
    moved.unwrap_or(t)
}

fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        (0u64..600_000).prop_map(Duration::from_millis),
        (0u64..1000 * YEAR_S).prop_map(Duration::from_secs),
        Just(Duration::MAX),
    ]
}

/// A JSON value as text: every type, the values that mean something to
/// the fake host, and nonsense.
fn leaf() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "0",
            "1",
            "100",
            "200",
            "300",
            "400",
            "555",
            "-1",
            "-0",
            "0.5",
            "1.0",
            "30000",
            "45000",
            "50000",
            "2147483647",
            "2147483648",
            "4294967296",
            "9007199254740993",
            "18446744073709551615",
            "18446744073709551616",
            "1e308",
            "-1e308",
            "1e400",
            "5e-324",
            "true",
            "false",
            "null",
            "[]",
            "{}",
            r#""""#,
            r#""here""#,
            r#""there""#,
            r#""boot-a""#,
            r#""boot-b""#,
            r#""machine-a""#,
            r#""pid:[1]""#,
            r#""pid:[2]""#,
            r#""time:[1]""#,
            r#""time:[2]""#,
            r#""NaN""#,
            r#""Infinity""#,
            r#""-Infinity""#,
            r#""1e400""#,
            r#""shared""#,
            r#""semaphore""#,
            r#""2999-01-01T00:00:00.000Z""#,
            r#""0001-01-01T00:00:00Z""#,
            r#""9999-12-31T23:59:59.999999999Z""#,
            r#""1969-12-31T23:59:59.999Z""#,
            r#""2026-13-45T99:99:99Z""#,
            r#""\u0000\u001b[2J""#,
            r#""\ud800""#,
        ])
        .prop_map(str::to_owned),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| if f.is_finite() {
            format!("{f:e}")
        } else {
            "1e999".into()
        }),
        any_time().prop_map(|t| format!("{:?}", format_time(t))),
        "\\PC{0,24}".prop_map(|s| serde_json::Value::from(s).to_string()),
        (1usize..20_000).prop_map(|n| format!("{:?}", "x".repeat(n))),
    ]
}

/// A JSON value, nested a few levels.
fn value() -> impl Strategy<Value = String> {
    leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec((prop::sample::select(keys()), inner), 0..4).prop_map(|kv| {
                let body: Vec<String> = kv.iter().map(|(k, v)| format!("{k:?}:{v}")).collect();
                format!("{{{}}}", body.join(","))
            }),
        ]
    })
}

/// A value of the type the record's `key` has, with the values that mean
/// something to the fake host, so that fuzzed records name holders, on
/// this boot or not, with leases that have run out or not.
fn typed(key: &'static str) -> BoxedStrategy<String> {
    let pick = |v: &[&str]| prop::sample::select(v.iter().map(|s| s.to_string()).collect::<Vec<_>>()).boxed();
    let count = || prop_oneof![0u64..100_000, 0u64..1 << 40, Just(u64::MAX)].prop_map(|n| n.to_string());
    match key {
        "pid" => pick(&["1", "100", "200", "300", "400", "555", "0", "2147483648"]),
        "leasehold" => pick(&["1", "2"]),
        "bootId" => pick(&[r#""boot-a""#, r#""boot-b""#]),
        "timeNs" => pick(&[r#""time:[1]""#, r#""time:[2]""#]),
        "pidNs" => pick(&[r#""pid:[1]""#, r#""pid:[2]""#]),
        "machineId" => pick(&[r#""machine-a""#, r#""machine-b""#]),
        "hostname" => pick(&[r#""here""#, r#""there""#, r#""""#]),
        "mode" => pick(&[r#""shared""#, r#""semaphore""#]),
        "acquiredAt" | "leaseExpiresAt" => any_time().prop_map(|t| format!("{:?}", format_time(t))).boxed(),
        "leaseMs" | "renewedAtBoot" | "startTime" | "procStart" | "permits" | "fencingToken" => {
            count().boxed()
        }
        _ => "[a-z0-9-]{0,36}".prop_map(|s| format!("{s:?}")).boxed(),
    }
}

/// A JSON object over the record's keys: some with values of their own
/// type, then hostile ones (duplicates allowed, the last wins as in
/// `JSON.parse`); then maybe damaged: cut short, padded with blanks or
/// zeros, a byte made invalid UTF-8, nested deep.
fn hostile_json() -> impl Strategy<Value = Vec<u8>> {
    let typed = prop::sample::subsequence(keys(), 0..keys().len())
        .prop_flat_map(|keys| keys.into_iter().map(|k| (Just(k), typed(k))).collect::<Vec<_>>());
    let hostile = prop::collection::vec((prop::sample::select(keys()), value()), 0..4);
    let object = (typed, hostile).prop_map(|(typed, hostile)| {
        let body: Vec<String> = typed
            .iter()
            .chain(&hostile)
            .map(|(k, v)| format!("{k:?}:{v}"))
            .collect();
        format!("{{{}}}", body.join(",")).into_bytes()
    });
    (object, 0u8..12, any::<prop::sample::Index>(), 1usize..600).prop_map(|(mut bytes, damage, at, n)| {
        let i = at.index(bytes.len().max(1));
        match damage {
            0 => bytes.truncate(i),
            1 => bytes.resize(bytes.len() + n, b' '),
            2 => bytes.resize(bytes.len() + n, 0),
            3 if !bytes.is_empty() => bytes[i] = 0xff,
            4 => {
                // Deep nesting inside the object.
                let deep = format!(r#","deep":{}1{}}}"#, "[".repeat(n), "]".repeat(n));
                bytes.pop();
                bytes.extend_from_slice(deep.as_bytes());
            }
            5 => {
                let mut padded = vec![b'\n'; n % 8];
                padded.append(&mut bytes);
                bytes = padded;
            }
            _ => {}
        }
        bytes
    })
}

/// pi-research's legacy layout: UUIDs in either case, their prefixes, and
/// near misses, with blanks or zeros around them.
fn legacy() -> impl Strategy<Value = Vec<u8>> {
    let uuid = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
    (
        uuid,
        0usize..40,
        prop::sample::select(vec!["", "\n", "  \n", "\0\0", "x", "-", "{", "0"]),
    )
        .prop_map(|(uuid, cut, tail)| {
            let mut bytes = uuid.as_bytes()[..cut.min(uuid.len())].to_vec();
            bytes.extend_from_slice(tail.as_bytes());
            bytes
        })
}

fn any_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => hostile_json(),
        1 => legacy(),
        1 => prop::collection::vec(any::<u8>(), 0..256),
    ]
}

/// A fake host with random clocks, identity and processes.
fn host() -> impl Strategy<Value = Fake> {
    let some = |v: &'static [&'static str]| {
        prop::option::of(prop::sample::select(v.to_vec()).prop_map(str::to_owned))
    };
    let proc_start = (0u64..1 << 40, 0u64..1 << 44, 0u64..1 << 40).prop_map(|(ticks, epoch_ms, age_ms)| {
        Some(ProcStart {
            ticks,
            epoch_ms,
            age_ms,
        })
    });
    (
        any_time(),
        prop_oneof![Just(0u64), 0u64..1 << 40, Just(u64::MAX)],
        prop::sample::select(vec!["here", "there", ""]),
        some(&["boot-a", "boot-b"]),
        some(&["pid:[1]", "pid:[2]"]),
        some(&["time:[1]", "time:[2]"]),
        some(&["machine-a", "machine-b"]),
        prop::collection::btree_map(
            prop::sample::select(vec![1u64, 100, 200, 300, 400, 555, 2_147_483_647]),
            prop_oneof![Just(None), proc_start],
            0..4,
        ),
    )
        .prop_map(
            |(now, boot_ms, hostname, boot_id, pid_ns, time_ns, machine_id, procs)| {
                let mut host = fake();
                host.now = now;
                host.boot_ms = boot_ms;
                host.me.hostname = hostname.to_owned();
                host.me.boot_id = boot_id;
                host.me.pid_ns = pid_ns;
                host.me.time_ns = time_ns;
                host.me.machine_id = machine_id;
                host.procs = procs.into_iter().collect();
                host
            },
        )
}

fn rules() -> impl Strategy<Value = Rules> {
    (
        prop_oneof![Just(Duration::from_millis(1)), any_duration()],
        prop::option::of(any_duration()),
    )
        .prop_map(|(grace, foreign_lease)| Rules { grace, foreign_lease })
}

/// One judgement: what a reader could see, on a random host.
#[derive(Debug)]
struct Case {
    bytes: Vec<u8>,
    mtime: SystemTime,
    flock_free: Option<bool>,
    known_for: Duration,
    rules: Rules,
    host: Fake,
}

impl std::fmt::Debug for Fake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fake")
            .field("now", &self.now)
            .field("boot_ms", &self.boot_ms)
            .field("me", &self.me)
            .field("procs", &self.procs)
            .finish()
    }
}

fn case() -> impl Strategy<Value = Case> {
    (
        any_bytes(),
        any_time(),
        prop::option::of(any::<bool>()),
        any_duration(),
        rules(),
        host(),
    )
        .prop_map(|(bytes, mtime, flock_free, known_for, rules, host)| Case {
            bytes,
            mtime,
            flock_free,
            known_for,
            rules,
            host,
        })
}

impl Case {
    fn judge(&self, parsed: &Parsed) -> Verdict {
        let ev = Evidence {
            parsed,
            mtime: self.mtime,
            flock_free: self.flock_free,
            known_for: self.known_for,
        };
        judge(&ev, self.rules, &self.host)
    }

    /// How long ago the record last changed, as the rules count it; `None`
    /// when its modification time lies in the future.
    fn age(&self) -> Option<Duration> {
        let now = self.host.now;
        if self.mtime > now.checked_add(CLOCK_SKEW)? {
            return None;
        }
        Some(now.duration_since(self.mtime).unwrap_or(Duration::ZERO))
    }
}

/// A leasehold record on the reader's own boot: its writer holds the
/// `flock` for as long as it holds the lock.
fn same_boot_leasehold<'a>(parsed: &'a Parsed, host: &Fake) -> Option<&'a Record> {
    match parsed {
        Parsed::Record(r) if r.is_leasehold() && r.boot_id.is_some() && r.boot_id == host.me.boot_id => {
            Some(r)
        }
        _ => None,
    }
}

proptest! {
    #![proptest_config(config())]

    /// Parsing never panics and is a function of the bytes alone; what is
    /// not a lock is exactly what no writer produces.
    #[test]
    fn parsing_is_total_and_deterministic(bytes in any_bytes()) {
        let parsed = parse(&bytes);
        prop_assert_eq!(&parsed, &parse(&bytes));
        let filler = |b: &u8| b.is_ascii_whitespace() || *b == 0;
        let body: Vec<u8> = bytes.iter().copied().skip_while(|b| filler(b)).collect();
        match body.first() {
            _ if bytes.len() > crate::record::MAX_RECORD_LEN => {
                prop_assert_eq!(&parsed, &Parsed::Foreign);
            }
            None => prop_assert_eq!(&parsed, &Parsed::Unreadable),
            // A JSON object, whole or cut short, is never a legacy record.
            Some(b'{') => prop_assert!(
                !matches!(parsed, Parsed::Legacy { .. } | Parsed::UuidPrefix),
                "{:?}", parsed
            ),
            // Anything else is no JSON record.
            Some(_) => prop_assert!(
                matches!(parsed, Parsed::Legacy { .. } | Parsed::UuidPrefix | Parsed::Foreign),
                "{:?}", parsed
            ),
        }
        if let Parsed::Legacy { uuid } = &parsed {
            prop_assert_eq!(uuid.len(), 36);
        }
    }

    /// Whatever the bytes, clocks, identity and flock, judging never
    /// panics, is deterministic, and asks for the flock test only when it
    /// was not made.
    #[test]
    fn judging_is_total_and_deterministic(case in case()) {
        let parsed = parse(&case.bytes);
        let verdict = case.judge(&parsed);
        prop_assert_eq!(verdict, case.judge(&parsed));
        if case.flock_free.is_some() {
            prop_assert_ne!(verdict, Verdict::NeedsFlockTest);
        }
        let recheck = recheck_on(&parsed, case.mtime, case.rules, &case.host);
        prop_assert_eq!(recheck, recheck_on(&parsed, case.mtime, case.rules, &case.host));
        // Not a lock: exactly what no writer produces, and a UUID's
        // prefix past the grace period; nothing else, whatever the host.
        match &parsed {
            Parsed::Foreign => prop_assert_eq!(verdict, Verdict::NotALock),
            Parsed::UuidPrefix => {}
            _ => prop_assert_ne!(verdict, Verdict::NotALock),
        }
    }

    /// A live leasehold holder on this boot (its `flock` held) is never
    /// robbed but for its lease; a dead one (the `flock` free) is stale.
    #[test]
    fn a_holder_proved_alive_by_its_flock_loses_only_to_its_lease(
        mut case in case(),
        json in hostile_json(),
        renewed_ago in prop::option::of(0u64..200_000),
        same_time_ns in any::<bool>(),
    ) {
        // Mostly a leasehold record of this boot: its own fields first,
        // so the fuzzed ones that follow can still override them.
        case.bytes = json;
        case.host.me.boot_id = Some("boot-a".into());
        if case.bytes.first() == Some(&b'{') {
            let own: &[u8] = match case.bytes.get(1) {
                Some(b'}') => br#"{"uuid":"u","leasehold":1,"bootId":"boot-a""#,
                _ => br#"{"uuid":"u","leasehold":1,"bootId":"boot-a","#,
            };
            case.bytes.splice(..1, own.iter().copied());
        }
        let parsed = parse(&case.bytes);
        let Some(r) = same_boot_leasehold(&parsed, &case.host) else {
            return Ok(());
        };
        // Often a renewal a moment ago on our boot clock.
        if let (Some(ago), Some(renewed)) = (renewed_ago, r.renewed_at_boot) {
            case.host.boot_ms = renewed.saturating_add(ago);
        }
        if same_time_ns {
            case.host.me.time_ns = r.time_ns.clone();
        }
        case.flock_free = Some(true);
        prop_assert_eq!(case.judge(&parsed), Verdict::Stale(StaleReason::DeadOwner));
        case.flock_free = Some(false);
        let verdict = case.judge(&parsed);
        prop_assert!(
            matches!(verdict, Verdict::Live | Verdict::Stale(StaleReason::LeaseExpired)),
            "{:?}: {verdict:?}", parsed
        );
        // A lease on our own boot clock that has not run out keeps it,
        // whatever the wall clock and the file's times say.
        let boot_now = case.host.boot_ms;
        if r.time_ns == case.host.me.time_ns
            && let (Some(renewed), Some(lease)) = (r.renewed_at_boot, r.lease_ms)
            && renewed <= boot_now
            && renewed.saturating_add(lease.min(MAX_LEASE_MS)) > boot_now
        {
            prop_assert_eq!(verdict, Verdict::Live, "{:?}", parsed);
        }
        // Without any lease and without a foreign lease, the flock alone
        // decides.
        if r.lease_ms.is_none() && r.lease_expires_at.is_none() && case.rules.foreign_lease.is_none() {
            prop_assert_eq!(verdict, Verdict::Live, "{:?}", parsed);
        }
    }

    /// A live pid is never declared dead, and a pid is declared reused
    /// only on a start time recorded and read: the fake host's processes
    /// are alive whatever the record, the clocks or the flock say.
    #[test]
    fn a_live_pid_is_never_declared_dead_nor_reused_without_a_start_time(case in case()) {
        let parsed = parse(&case.bytes);
        let Parsed::Record(r) = &parsed else {
            return Ok(());
        };
        let verdict = case.judge(&parsed);
        let by_flock = same_boot_leasehold(&parsed, &case.host).is_some();
        if let Some(pid) = r.pid
            && !by_flock
            && case.host.procs.contains_key(&pid)
        {
            prop_assert_ne!(verdict, Verdict::Stale(StaleReason::DeadOwner), "{:?}", parsed);
            let start_known = r.start_time.is_some() && case.host.procs[&pid].is_some();
            if !start_known {
                prop_assert_ne!(verdict, Verdict::Stale(StaleReason::ReusedPid), "{:?}", parsed);
            }
        }
    }

    /// A record that may be mid-write is never taken within the grace
    /// period, nor after it while a process holds its `flock`.
    #[test]
    fn a_record_being_written_is_left_alone(case in case()) {
        let parsed = parse(&case.bytes);
        let unreadable = match &parsed {
            Parsed::Unreadable | Parsed::Legacy { .. } | Parsed::UuidPrefix => true,
            Parsed::Record(r) => r.pid.is_none() && !r.is_leasehold(),
            Parsed::Foreign => false,
        };
        if !unreadable {
            return Ok(());
        }
        let verdict = case.judge(&parsed);
        if case.age().is_some_and(|age| age < case.rules.grace) {
            prop_assert_eq!(verdict, Verdict::Live);
        }
        if case.flock_free == Some(false) && parsed != Parsed::UuidPrefix {
            prop_assert_eq!(verdict, Verdict::Live);
        }
        if parsed == Parsed::UuidPrefix {
            prop_assert!(matches!(verdict, Verdict::Live | Verdict::NotALock), "{verdict:?}");
        }
    }

    /// Whatever a supported writer writes, cut short anywhere, padded with
    /// zeros by a crash, or rewritten in place over its previous version
    /// and read half-way: never "not a lock" (a UUID's prefix aside,
    /// after its grace period), so a torn record is never refused.
    #[test]
    fn torn_records_of_every_writer_are_still_locks(
        writer in 0u8..4,
        cut in any::<prop::sample::Index>(),
        zeros in 0usize..64,
        host_name in "\\PC{0,16}",
        port in any::<u16>(),
        renewed in any::<u64>(),
    ) {
        let name = crate::name::LockName::new("job", crate::name::PathStyle::Hashed).unwrap();
        let (old, new) = match writer {
            // leasehold, renewed in place with a record of the same length.
            0 => {
                let fields = crate::field::OwnerFields::new(&[("port".to_owned(), port.into())]).unwrap();
                let mut record = OwnRecord::new("h", fields.as_ref(), Duration::from_secs(30), &name);
                record.hostname = host_name.clone();
                let old = record.to_bytes(0);
                record.renew(SystemTime::now() + Duration::from_secs(9_999), renewed);
                let new = record.to_bytes(old.len());
                (old, new)
            }
            // velocious, with its owner fields, rewritten whole.
            1 => {
                let host_name = serde_json::Value::from(host_name.as_str()).to_string();
                let owner = |t: &str| format!(
                    r#"{{"acquiredAt":"{t}","holderId":"1-2-x","hostname":{host_name},"leaseExpiresAt":"{t}","pid":7,"port":{port}}}"#
                );
                (owner("2026-12-03T07:06:06.123Z").into_bytes(), owner("2026-12-03T07:06:36.123Z").into_bytes())
            }
            // pi-research, and its legacy layout.
            2 => {
                let bytes = format!(r#"{{"uuid":"6f1c3a0e-8d2b-4c55-9a7e-3b1d2f0c9e41","pid":{port},"startTime":{renewed}}}"#);
                (bytes.clone().into_bytes(), bytes.into_bytes())
            }
            _ => {
                let uuid = crate::record::acquisition_id();
                (uuid.clone().into_bytes(), uuid.into_bytes())
            }
        };
        let at = cut.index(new.len() + 1);
        // Cut short (a reader between truncate and write, or a crash),
        // maybe with the zeros a crash leaves.
        let mut torn = new[..at].to_vec();
        torn.resize(torn.len() + zeros, 0);
        let parsed = parse(&torn);
        prop_assert!(parsed != Parsed::Foreign, "{:?}", String::from_utf8_lossy(&torn));
        if writer == 3 && at < new.len() && at > 0 {
            prop_assert_eq!(&parsed, &Parsed::UuidPrefix);
        }
        // Half rewritten in place (leasehold's renewal keeps the length).
        if old.len() == new.len() {
            let mut mixed = new[..at].to_vec();
            mixed.extend_from_slice(&old[at..]);
            let parsed = parse(&mixed);
            prop_assert!(parsed != Parsed::Foreign, "{:?}", String::from_utf8_lossy(&mixed));
        }
        // Whole, it names its holder.
        prop_assert!(
            matches!(parse(&new), Parsed::Record(_) | Parsed::Legacy { .. }),
            "{:?}", String::from_utf8_lossy(&new)
        );
    }
}
