//! Owner records: what a holder writes into its lock, and what leasehold can
//! read from its own records and from those of the two systems it descends from.
//!
//! leasehold writes one JSON object that is a superset of both original systems'
//! layouts (see the crate docs for the field list). It reads:
//! - any JSON object with `uuid` or `holderId` (every writer writes one;
//!   unknown fields are ignored, and never rewritten: leasehold only ever
//!   rewrites records it created);
//! - pi-research's legacy layout, a bare UUID string;
//! - what a writer may leave mid-write or a crash may leave (empty, blank,
//!   NUL bytes, a JSON object that begins as a writer's records begin,
//!   cut short or half rewritten) as unreadable, which the staleness
//!   rules leave alone for a grace period;
//! - a proper prefix of a UUID as a legacy record cut short, for the grace
//!   period only;
//! - anything else as *foreign*: content that no supported writer (leasehold,
//!   velocious, pi-research) produces, even torn, such as a `Cargo.lock` or a
//!   pid file that happens to sit at a lock path. It is not a lock, and is
//!   never removed.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde_json::{Map, Value};

use crate::field::{FieldValue, OwnerFields, extra_fields};
use crate::timestamp::{format_time, parse_time};

/// The value of the `leasehold` field in records this version writes. It
/// promises that the holder keeps `flock(LOCK_EX)` on the record's inode for
/// as long as it holds the lock, and that `renewedAtBoot` is on the boot
/// clock of the host named by `bootId`.
pub(crate) const FORMAT_VERSION: u64 = 1;

/// Records longer than this are not lock records.
pub(crate) const MAX_RECORD_LEN: usize = 64 * 1024;

/// Leases beyond this are almost certainly a unit mistake, and would
/// overflow time arithmetic long before they meant anything: `build()`
/// refuses them, and a record stating one is capped to it.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// A parsed lock record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Parsed {
    /// A JSON object with owner fields.
    Record(Box<Record>),
    /// pi-research's legacy format: the content is a bare UUID.
    Legacy { uuid: String },
    /// What a writer can leave mid-write, or a crash can leave: empty,
    /// blank or NUL bytes, or a writer's JSON object cut short (or half
    /// rewritten in place).
    Unreadable,
    /// A proper prefix of a UUID's form (hex digits, dashes where a UUID
    /// has them): a legacy record cut short, or a pid file. Judged as
    /// unreadable within the grace period, and as foreign after it.
    UuidPrefix,
    /// Content that no supported writer produces, even torn: not a lock.
    Foreign,
}

/// The fields leasehold understands, each optional because foreign writers
/// may omit any of them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Record {
    pub(crate) uuid: Option<String>,
    pub(crate) pid: Option<u64>,
    /// pi-research's `startTime`: on Linux its writers put the start ticks
    /// (`/proc/<pid>/stat` field 22) there, on other systems whole seconds
    /// since the epoch; other writers, and earlier leasehold builds, epoch
    /// milliseconds. The staleness rules tell them apart by plausibility.
    pub(crate) start_time: Option<f64>,
    pub(crate) holder_id: Option<String>,
    pub(crate) hostname: Option<String>,
    pub(crate) acquired_at: Option<SystemTime>,
    pub(crate) lease_expires_at: Option<SystemTime>,
    pub(crate) lease_ms: Option<u64>,
    /// `Some` only in records written by leasehold.
    pub(crate) version: Option<u64>,
    pub(crate) boot_id: Option<String>,
    pub(crate) pid_ns: Option<String>,
    /// The writer's time namespace: `renewedAtBoot` is on its boot clock.
    pub(crate) time_ns: Option<String>,
    pub(crate) proc_start: Option<u64>,
    pub(crate) renewed_at_boot: Option<u64>,
    pub(crate) machine_id: Option<String>,
    pub(crate) fencing_token: Option<u64>,
    pub(crate) name: Option<String>,
    /// `"shared"` or `"semaphore"` in the records of shared holders and
    /// permit holders (and in the lock path's marker); absent for an
    /// exclusive lock.
    pub(crate) mode: Option<String>,
    /// A semaphore's permit count.
    pub(crate) permits: Option<u64>,
    /// The run of shared holders (or permit holders) the record belongs to.
    pub(crate) group: Option<String>,
    /// Every other top-level key with a string, number or boolean value:
    /// the owner fields of a leasehold or velocious holder.
    pub(crate) fields: Vec<(String, FieldValue)>,
}

impl Record {
    pub(crate) fn is_leasehold(&self) -> bool {
        self.version.is_some()
    }
}

/// Parses record bytes. Never fails: what cannot be read is `Unreadable`,
/// and what no supported writer produces, even torn, is `Foreign`.
///
/// leasehold, velocious and pi-research write a JSON object (starting with
/// `{`, which a torn read keeps), and pi-research's legacy layout is a bare
/// UUID; leasehold pads its records with spaces and a newline. A crash of
/// a writer that did not sync can leave the file's length with zeros in
/// it, so leading and trailing blanks and NUL bytes are ignored. A
/// complete JSON object that names no holder, JSON that is neither whole
/// nor begins as a writer's (`bun.lock`'s trailing commas, a
/// `package-lock.json` cut short), or a record longer than any writer
/// makes, is no lock record either.
pub(crate) fn parse(bytes: &[u8]) -> Parsed {
    if bytes.len() > MAX_RECORD_LEN {
        return Parsed::Foreign;
    }
    let filler = |b: &u8| b.is_ascii_whitespace() || *b == 0;
    let (Some(start), Some(end)) = (
        bytes.iter().position(|b| !filler(b)),
        bytes.iter().rposition(|b| !filler(b)),
    ) else {
        return Parsed::Unreadable;
    };
    let body = &bytes[start..=end];
    if body.first() == Some(&b'{') {
        return match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(map)) => from_map(&map),
            // Cut short (or cut inside a character), or caught half
            // rewritten in place: it still starts as its writer starts.
            _ if starts_as_a_writer_starts(body) => Parsed::Unreadable,
            // JSON with blanks between its tokens, trailing commas
            // (Bun's `bun.lock`), other keys first: no writer's record.
            _ => Parsed::Foreign,
        };
    }
    match uuid_form(body) {
        Some(true) => Parsed::Legacy {
            // ASCII, as `uuid_form` checked.
            uuid: String::from_utf8_lossy(body).into_owned(),
        },
        Some(false) => Parsed::UuidPrefix,
        None => Parsed::Foreign,
    }
}

/// How the records of the supported writers begin: each writes compact
/// JSON (`JSON.stringify`, `serde_json::to_vec`) in a fixed key order,
/// leasehold and pi-research with `uuid` first, velocious with
/// `acquiredAt` first.
const OPENINGS: [&[u8]; 2] = [br#"{"uuid":""#, br#"{"acquiredAt":""#];

/// Whether `body`, which is no whole JSON object, can be one of the
/// supported writers' records cut short (a reader between a create and
/// its write, or a crash) or half rewritten in place (leasehold renews
/// its record, and re-signs a marker, by one `pwrite` over the old one,
/// so a read may see the new record's start and the old one's end): it
/// begins as that writer's records begin, or is a beginning of that.
fn starts_as_a_writer_starts(body: &[u8]) -> bool {
    OPENINGS
        .iter()
        .any(|opening| body.starts_with(opening) || opening.starts_with(body))
}

/// Whether `body` has a UUID's form, `8-4-4-4-12` hex digits (`Some(true)`),
/// or is a proper prefix of that form (`Some(false)`); `None` if neither.
/// pi-research's legacy records are one UUID, which a torn write can only
/// cut short.
fn uuid_form(body: &[u8]) -> Option<bool> {
    const LEN: usize = 36;
    const DASHES: [usize; 4] = [8, 13, 18, 23];
    if body.is_empty() || body.len() > LEN {
        return None;
    }
    let fits = body.iter().enumerate().all(|(i, b)| match DASHES.contains(&i) {
        true => *b == b'-',
        false => b.is_ascii_hexdigit(),
    });
    fits.then_some(body.len() == LEN)
}

fn from_map(map: &Map<String, Value>) -> Parsed {
    let string = |key: &str| map.get(key).and_then(Value::as_str).map(str::to_owned);
    let record = Record {
        uuid: string("uuid"),
        pid: map.get("pid").and_then(as_count),
        start_time: map.get("startTime").and_then(Value::as_f64),
        holder_id: string("holderId"),
        hostname: string("hostname"),
        acquired_at: map.get("acquiredAt").and_then(as_time),
        lease_expires_at: map.get("leaseExpiresAt").and_then(as_time),
        lease_ms: map.get("leaseMs").and_then(as_count),
        version: map.get("leasehold").and_then(as_count),
        boot_id: string("bootId"),
        pid_ns: string("pidNs"),
        time_ns: string("timeNs"),
        proc_start: map.get("procStart").and_then(as_count),
        renewed_at_boot: map.get("renewedAtBoot").and_then(as_count),
        machine_id: string("machineId"),
        fencing_token: map.get("fencingToken").and_then(as_count),
        name: string("name"),
        mode: string("mode"),
        permits: map.get("permits").and_then(as_count),
        group: string("group"),
        fields: extra_fields(map),
    };
    // A whole object (no torn read of a record makes one) without the
    // id every supported writer writes: leasehold both, pi-research
    // `uuid`, velocious `holderId`. (`{"pid":4242,"port":8080}` is some
    // program's state, not a lock to reclaim when that pid is gone.)
    if record.uuid.is_none() && record.holder_id.is_none() {
        return Parsed::Foreign;
    }
    Parsed::Record(Box::new(record))
}

/// A non-negative integer, also when a JavaScript writer stored it as a
/// float with no fraction.
fn as_count(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        let f = v.as_f64()?;
        (f >= 0.0 && f.fract() == 0.0 && f < 9.0e15).then_some(f as u64)
    })
}

fn as_time(v: &Value) -> Option<SystemTime> {
    parse_time(v.as_str()?)
}

/// The record a leasehold holder writes. Field order and names are part of
/// the on-disk format.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OwnRecord {
    pub(crate) uuid: String,
    pub(crate) pid: u32,
    /// In pi-research's unit for this platform (`Identity::start_time`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) start_time: Option<u64>,
    pub(crate) holder_id: String,
    pub(crate) hostname: String,
    pub(crate) acquired_at: String,
    pub(crate) lease_expires_at: String,
    pub(crate) lease_ms: u64,
    pub(crate) leasehold: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) boot_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pid_ns: Option<String>,
    /// The time namespace whose `CLOCK_BOOTTIME` `renewed_at_boot` is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) time_ns: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) proc_start: Option<u64>,
    pub(crate) renewed_at_boot: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) machine_id: Option<String>,
    /// The lock name, so that listings can show it for hashed paths.
    pub(crate) name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fencing_token: Option<u64>,
    /// `"shared"` or `"semaphore"`; absent for an exclusive lock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) mode: Option<&'static str>,
    /// A semaphore's permit count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) permits: Option<u32>,
    /// The run of shared holders (or permit holders) this one joined.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) group: Option<String>,
    /// The `Locker`'s owner fields, written after the fields above.
    #[serde(skip)]
    pub(crate) fields: Option<Arc<OwnerFields>>,
    /// The times `acquired_at` and `lease_expires_at` were formatted from.
    #[serde(skip)]
    pub(crate) times: (SystemTime, SystemTime),
}

/// Room left at the end of a record so a renewal that grows a number by a
/// digit or two still fits in the original length.
const SLACK: usize = 16;

impl OwnRecord {
    /// The record a new holder of `name` writes (or, on a server, keeps),
    /// with a lease of `lease` from now.
    pub(crate) fn new(
        holder_id: &str,
        fields: Option<&Arc<OwnerFields>>,
        lease: Duration,
        name: &crate::name::LockName,
    ) -> Self {
        let me = crate::sys::identity();
        let now = SystemTime::now();
        let expires = now + lease;
        OwnRecord {
            uuid: acquisition_id(),
            pid: me.pid,
            start_time: me.start_time,
            holder_id: holder_id.to_owned(),
            hostname: me.hostname.clone(),
            acquired_at: format_time(now),
            lease_expires_at: format_time(expires),
            lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            leasehold: FORMAT_VERSION,
            boot_id: me.boot_id.clone(),
            pid_ns: me.pid_ns.clone(),
            time_ns: me.time_ns.clone(),
            proc_start: me.start.map(|s| s.ticks),
            renewed_at_boot: crate::sys::boot_clock_ms(),
            machine_id: me.machine_id.clone(),
            name: name.as_str().to_owned(),
            fencing_token: None,
            mode: None,
            permits: None,
            group: None,
            fields: fields.cloned(),
            times: (now, expires),
        }
    }

    /// Serializes, padded with trailing spaces (which every JSON reader,
    /// and pi-research's `trim()`, ignores) to at least `len` bytes.
    pub(crate) fn to_bytes(&self, len: usize) -> Vec<u8> {
        let mut out = serde_json::to_vec(self).unwrap_or_default();
        if let Some(fields) = &self.fields
            && out.last() == Some(&b'}')
        {
            out.pop();
            out.extend_from_slice(fields.json().as_bytes());
            out.push(b'}');
        }
        let want = if len == 0 {
            out.len() + SLACK
        } else {
            len.max(out.len() + 1)
        };
        out.resize(want - 1, b' ');
        out.push(b'\n');
        out
    }

    /// Updates the lease fields for a renewal at `now` / `boot_ms`.
    pub(crate) fn renew(&mut self, now: SystemTime, boot_ms: u64) {
        let expires = now + Duration::from_millis(self.lease_ms);
        self.lease_expires_at = format_time(expires);
        self.times.1 = expires;
        self.renewed_at_boot = boot_ms;
    }

    /// The record as a reader would parse it.
    #[cfg(test)]
    pub(crate) fn parsed(&self) -> Record {
        match parse(&self.to_bytes(0)) {
            Parsed::Record(r) => *r,
            _ => Record::default(),
        }
    }
}

/// A fresh version-4 UUID (for an acquisition, a group of shared holders), without a `getrandom` call
/// per lock: see [`unique_bits`].
pub(crate) fn acquisition_id() -> String {
    let (hi, lo) = unique_bits();
    uuid::Builder::from_random_bytes(uuid::Uuid::from_u64_pair(hi, lo).into_bytes())
        .into_uuid()
        .to_string()
}

/// 128 bits that no other call in this process returns and that other
/// processes are unlikely to: one random seed per process, plus a counter,
/// so that taking a lock costs no `getrandom` call.
pub(crate) fn unique_bits() -> (u64, u64) {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEED: OnceLock<(u64, u64)> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let (hi, lo) = *SEED.get_or_init(|| uuid::Uuid::new_v4().as_u64_pair());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // Mix the counter into the random half with an odd multiplier: a
    // bijection of the counter (of its low bits, too), so values stay unique
    // and do not look sequential.
    (hi, lo ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_pi_researchs_layouts() {
        let p = parse(br#"{"uuid":"6a1f","pid":4242,"startTime":1764745566123}"#);
        let Parsed::Record(r) = p else { panic!("{p:?}") };
        assert_eq!(r.uuid.as_deref(), Some("6a1f"));
        assert_eq!(r.pid, Some(4242));
        assert_eq!(r.start_time, Some(1_764_745_566_123.0));
        assert!(!r.is_leasehold());
        assert_eq!(
            parse(b"0b5e2f2c-7d1e-4a51-9a47-0f7f2d0f8c11\n"),
            Parsed::Legacy {
                uuid: "0b5e2f2c-7d1e-4a51-9a47-0f7f2d0f8c11".into()
            }
        );
    }

    #[test]
    fn reads_velociouss_layout() {
        let p = parse(
            br#"{"acquiredAt":"2026-12-03T07:06:06.123Z","holderId":"1-2-x","hostname":"h","leaseExpiresAt":"2026-12-03T07:06:36.123Z","pid":7,"host":"0.0.0.0","port":80}"#,
        );
        let Parsed::Record(r) = p else { panic!("{p:?}") };
        assert_eq!(r.holder_id.as_deref(), Some("1-2-x"));
        // Its `extraOwnerFields`, the server lock's address.
        assert_eq!(
            r.fields,
            [
                ("host".to_owned(), FieldValue::from("0.0.0.0")),
                ("port".to_owned(), FieldValue::from(80u16))
            ]
        );
        let acquired = r.acquired_at.unwrap();
        let expires = r.lease_expires_at.unwrap();
        assert_eq!(expires.duration_since(acquired).unwrap(), Duration::from_secs(30));
        assert_eq!(format_time(acquired), "2026-12-03T07:06:06.123Z");
    }

    #[test]
    fn torn_and_empty_records_are_unreadable() {
        assert_eq!(parse(b""), Parsed::Unreadable);
        assert_eq!(parse(b"   \n"), Parsed::Unreadable);
        // A crash without a sync can leave the length, filled with zeros.
        assert_eq!(parse(&[0; 300]), Parsed::Unreadable);
        assert_eq!(parse(b"{\"uuid\":\"ab\"\0\0\0"), Parsed::Unreadable);
        assert_eq!(parse(br#"{"uuid":"ab","pid":1"#), Parsed::Unreadable);
        // Cut inside a character.
        assert_eq!(parse(b"{\"uuid\":\"\xc3"), Parsed::Unreadable);
        assert_eq!(parse(b"{"), Parsed::Unreadable);
        assert_eq!(parse(b"{\"acq"), Parsed::Unreadable);
        // velocious's, cut short.
        assert_eq!(
            parse(br#"{"acquiredAt":"2026-12-03T07:06:06.123Z","holderId":"1-"#),
            Parsed::Unreadable
        );
    }

    #[test]
    fn what_no_writer_produces_is_foreign() {
        for bytes in [
            &b"version = 4\n"[..],
            b"hello",
            b"{}",
            br#"{"theme":"dark"}"#,
            br#"{"uuid":5,"pid":"123"}"#,
            // A pid alone names no holder of any writer: some program's state.
            br#"{"pid":4242,"port":8080}"#,
            // JSON with trailing commas (Bun's `bun.lock`), whitespace
            // between tokens, or other keys first, cut short or not: no
            // writer's record begins so.
            b"{\n  \"lockfileVersion\": 1,\n  \"workspaces\": {},\n}\n",
            b"{\n  \"name\": \"app\",\n  \"lockfileVersion\": 3,\n  \"pack",
            b"{\"hostname\":\"\xc3",
            br#"{"pid":12"#,
            br#"{ "uuid": "6f1c3a0e""#,
            b"[1,2]",
            br#""6f1c3a0e-8d2b-4c55-9a7e-3b1d2f0c9e41""#,
            b"12345678901",
            b"6f1c3a0e-8d2b-4c55-9a7e-3b1d2f0c9e41x",
            b"6f1c3a0e-8d2b-4c55-9a7e-3b1d2f0c9e41-0",
            b"6f1c3a0e 8d2b",
            b"g",
            &[0xff, 0xfe],
            &[0x7f, b'E', b'L', b'F'],
        ] {
            assert_eq!(
                parse(bytes),
                Parsed::Foreign,
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
        let mut huge = br#"{"uuid":"u","pid":1,"x":""#.to_vec();
        huge.resize(MAX_RECORD_LEN, b'x');
        huge.extend_from_slice(b"\"}");
        assert_eq!(parse(&huge), Parsed::Foreign);
    }

    #[test]
    fn a_uuids_prefix_may_be_a_legacy_record_cut_short() {
        let uuid = "6F1C3A0E-8d2b-4c55-9a7e-3b1d2f0c9e41";
        for len in 1..uuid.len() {
            assert_eq!(parse(&uuid.as_bytes()[..len]), Parsed::UuidPrefix, "{len}");
        }
        assert_eq!(parse(b"1234\n"), Parsed::UuidPrefix);
        assert_eq!(
            parse(format!("{uuid}\n").as_bytes()),
            Parsed::Legacy { uuid: uuid.into() }
        );
    }

    /// A guard's own `Owner` is made from its record without writing and
    /// parsing it; it must be what any reader of the record gets.
    #[test]
    fn an_own_owner_is_what_a_reader_of_the_record_gets() {
        use crate::Owner;
        use crate::field::OwnerFields;
        let name = crate::name::LockName::new("jobs/nightly", crate::PathStyle::Hashed).unwrap();
        let lease = Duration::from_millis(30_123);
        let fields = OwnerFields::new(&[
            ("port".to_owned(), 8080u16.into()),
            ("host".to_owned(), "db-1".into()),
            ("ratio".to_owned(), 0.5f64.into()),
            ("neg".to_owned(), (-3i64).into()),
            ("big".to_owned(), u64::MAX.into()),
            ("ok".to_owned(), true.into()),
            ("a\"quote".to_owned(), "x\ny".into()),
        ])
        .unwrap();
        for fields in [None, fields.as_ref()] {
            let mut rec = OwnRecord::new("holder-7", fields, lease, &name);
            assert_eq!(Owner::from_own(&rec), Owner::from_record(&rec.parsed()));
            rec.fencing_token = Some(42);
            rec.mode = Some("shared");
            rec.renew(SystemTime::now() + Duration::from_secs(7), 123);
            assert_eq!(Owner::from_own(&rec), Owner::from_record(&rec.parsed()));
        }
    }

    #[test]
    fn own_record_keeps_its_length_across_renewals() {
        let now = SystemTime::now();
        let mut rec = OwnRecord {
            uuid: "u".into(),
            pid: 1,
            start_time: Some(1),
            holder_id: "h".into(),
            hostname: "host".into(),
            acquired_at: format_time(now),
            lease_expires_at: format_time(now),
            lease_ms: 30_000,
            leasehold: FORMAT_VERSION,
            boot_id: None,
            pid_ns: None,
            time_ns: Some("time:[4026531834]".into()),
            proc_start: None,
            renewed_at_boot: 9,
            machine_id: None,
            name: "n".into(),
            fencing_token: None,
            mode: Some("semaphore"),
            permits: Some(3),
            group: Some("g".into()),
            fields: crate::field::OwnerFields::new(&[("port".to_owned(), 8080u16.into())]).unwrap(),
            times: (now, now),
        };
        let first = rec.to_bytes(0);
        rec.renew(now + Duration::from_secs(3600), 99_999);
        let second = rec.to_bytes(first.len());
        assert_eq!(first.len(), second.len());
        let Parsed::Record(r) = parse(&second) else {
            panic!()
        };
        assert_eq!(r.renewed_at_boot, Some(99_999));
        assert_eq!(r.time_ns.as_deref(), Some("time:[4026531834]"));
        assert_eq!(r.version, Some(FORMAT_VERSION));
        assert_eq!(r.fields, [("port".to_owned(), FieldValue::from(8080u16))]);
    }

    /// No record leasehold writes exceeds what its readers accept: the
    /// longest name and host name, in characters JSON escapes to six
    /// bytes, the largest owner fields `build()` accepts, a marker's
    /// fields, a fencing token and every count at its largest.
    #[test]
    fn the_largest_record_leasehold_writes_is_read_back() {
        use crate::field::{MAX_FIELDS_LEN, OwnerFields};
        use crate::sys::{MAX_HOSTNAME_LEN, MAX_MACHINE_ID_LEN};
        let worst = "\u{1}";
        let name =
            crate::name::LockName::new(&worst.repeat(crate::MAX_NAME_LEN), crate::PathStyle::Hashed).unwrap();
        // The largest owner fields: grow one value until `new` refuses it.
        let mut fields = None;
        for len in (0..MAX_FIELDS_LEN).step_by(7) {
            match OwnerFields::new(&[("k".repeat(64), worst.repeat(len / 6).into())]) {
                Ok(made) => fields = made,
                Err(_) => break,
            }
        }
        let fields = fields.unwrap();
        assert!(
            fields.json().len() > MAX_FIELDS_LEN - 16,
            "{}",
            fields.json().len()
        );
        let mut rec = OwnRecord::new(
            &format!("{}-{}", u32::MAX, uuid::Uuid::max().simple()),
            Some(&fields),
            MAX_LEASE,
            &name,
        );
        rec.hostname = worst.repeat(MAX_HOSTNAME_LEN);
        rec.pid = u32::MAX;
        rec.start_time = Some(u64::MAX);
        rec.boot_id = Some(uuid::Uuid::max().to_string());
        rec.pid_ns = Some(format!("pid:[{}]", u64::MAX));
        rec.time_ns = Some(format!("time:[{}]", u64::MAX));
        rec.proc_start = Some(u64::MAX);
        rec.renewed_at_boot = u64::MAX;
        rec.machine_id = Some("f".repeat(MAX_MACHINE_ID_LEN));
        rec.fencing_token = Some(u64::MAX);
        rec.mode = Some("semaphore");
        rec.permits = Some(u32::MAX);
        rec.group = Some(uuid::Uuid::max().to_string());
        rec.renew(
            std::time::UNIX_EPOCH + Duration::from_secs(253_402_300_799),
            u64::MAX,
        );
        let bytes = rec.to_bytes(0);
        // With room to spare: half the readers' limit.
        assert!(bytes.len() <= MAX_RECORD_LEN / 2, "{} bytes", bytes.len());
        let Parsed::Record(read) = parse(&bytes) else {
            panic!("not read back")
        };
        assert_eq!(read.name.as_deref(), Some(name.as_str()));
        assert_eq!(read.fencing_token, Some(u64::MAX));
        assert_eq!(read.fields.len(), 1);
    }

    #[test]
    fn every_key_of_a_record_is_reserved_and_read() {
        let name = crate::name::LockName::new("n", crate::name::PathStyle::Hashed).unwrap();
        let mut rec = OwnRecord::new("h", None, Duration::from_secs(30), &name);
        // Every optional field set, so that every key is written.
        rec.start_time = Some(1);
        rec.boot_id = Some("b".into());
        rec.pid_ns = Some("pid:[1]".into());
        rec.time_ns = Some("time:[1]".into());
        rec.proc_start = Some(1);
        rec.machine_id = Some("m".into());
        rec.fencing_token = Some(1);
        rec.mode = Some("shared");
        rec.permits = Some(2);
        rec.group = Some("g".into());
        let json: Value = serde_json::from_slice(&rec.to_bytes(0)).unwrap();
        let Value::Object(map) = json else {
            panic!("{json}")
        };
        for key in map.keys() {
            assert!(
                crate::field::RESERVED_KEYS.contains(&key.as_str()),
                "{key:?} is written but not reserved"
            );
        }
        // And nothing leasehold writes comes back as an owner field.
        assert_eq!(rec.parsed().fields, []);
        // velocious's and pi-research's keys too.
        for key in [
            "uuid",
            "pid",
            "startTime",
            "holderId",
            "hostname",
            "acquiredAt",
            "leaseExpiresAt",
        ] {
            assert!(crate::field::RESERVED_KEYS.contains(&key), "{key}");
        }
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn parse_never_panics_on_json_objects(s in r#"\{("[a-zA-Z]{1,12}":(-?[0-9]{1,20}(\.[0-9]{1,5})?|"[^"\\]{0,30}"|null|true|\[\]),?){0,8}\}"#) {
            let _ = parse(s.as_bytes());
        }
    }
}
