//! Bad input, case by case, each with the outcome it must have.

#[path = "support/common.rs"]
mod common;

use std::time::{Duration, SystemTime};

use common::{dead_pid, iso, plant};
use leasehold::{Error, Locker, PathStyle, Strategy};
use proptest::prelude::*;
use proptest::strategy::Strategy as _;

#[test]
fn child_process_entry() {
    common::child_entry();
}

/// Whether names Windows cannot hold are accepted as plain names.
const UNIX: bool = cfg!(unix);

/// Names: what each path style accepts, and where the lock then lives.
#[tokio::test]
async fn names_in_both_path_styles() {
    let dir = tempfile::tempdir().unwrap();
    let hashed = Locker::new(dir.path()).unwrap();
    let plain = Locker::builder()
        .directory(dir.path())
        .path_style(PathStyle::Plain)
        .build()
        .unwrap();
    let long = "n".repeat(leasehold::MAX_NAME_LEN);
    let too_long = "n".repeat(leasehold::MAX_NAME_LEN + 1);
    // (name, accepted by Hashed, accepted by Plain)
    let cases: &[(&str, bool, bool)] = &[
        ("", false, false),
        (".", true, false),
        ("..", true, false),
        ("/", true, false),
        ("a/../../b", true, false),
        ("nul\0inside", false, false),
        (&long, true, false),
        (&too_long, false, false),
        ("日本語🔒", true, true),
        ("line\nbreak", true, false),
        // Names Windows cannot hold are ordinary file names on Unix; on
        // Windows `Plain` refuses them (`Hashed` makes them safe).
        ("CON", true, UNIX),
        ("nul", true, UNIX),
        ("COM1.txt", true, UNIX),
        ("lpt²", true, UNIX),
        ("a:b", true, UNIX),
        ("a\\b", true, UNIX),
        ("why?", true, UNIX),
        ("<tag>", true, UNIX),
        ("pipe|d", true, UNIX),
        ("star*", true, UNIX),
        ("say \"hi\"", true, UNIX),
        ("dot.", true, UNIX),
        ("space ", true, UNIX),
        ("nul.txt", true, UNIX),
        ("CONSOLE", true, true),
        ("com10", true, true),
        ("-rf", true, true),
    ];
    let mut paths = std::collections::HashSet::new();
    for (name, hashed_ok, plain_ok) in cases {
        for (locker, ok) in [(&hashed, hashed_ok), (&plain, plain_ok)] {
            let got = locker.try_acquire(name).await;
            if !ok {
                assert!(matches!(got, Err(Error::InvalidName { .. })), "{name:?}: {got:?}");
                continue;
            }
            let guard = got.unwrap_or_else(|e| panic!("{name:?}: {e}")).expect("free");
            let path = locker.lock_path(name).unwrap();
            assert_eq!(
                path.parent().unwrap(),
                dir.path().canonicalize().unwrap(),
                "{name:?} escaped"
            );
            assert!(path.exists(), "{name:?}");
            assert!(paths.insert(path), "{name:?} shares a path with another name");
            drop(guard);
        }
    }
    assert!(common::entries(dir.path()).is_empty());
}

/// On Windows, `Plain` and `Exact` names Windows cannot hold are refused
/// with a reason that says so, before anything is made.
#[cfg(windows)]
#[tokio::test]
async fn names_windows_cannot_hold_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    for style in [PathStyle::Plain, PathStyle::Exact] {
        let locker = Locker::builder()
            .directory(dir.path())
            .path_style(style)
            .build()
            .unwrap();
        for (name, why) in [
            ("a:b", "cannot contain"),
            ("what?", "cannot contain"),
            ("job.", "cannot end in"),
            ("job ", "cannot end in"),
            ("AUX", "reserved device name"),
            ("nul.txt", "reserved device name"),
            ("Com7.tar.gz", "reserved device name"),
            ("LPT³", "reserved device name"),
        ] {
            match locker.try_acquire(name).await {
                Err(Error::InvalidName { reason, .. }) => {
                    assert!(
                        reason.contains("on Windows") && reason.contains(why),
                        "{name:?}: {reason}"
                    );
                }
                other => panic!("{style:?} {name:?}: {other:?}"),
            }
            assert!(matches!(locker.lock_path(name), Err(Error::InvalidName { .. })));
        }
    }
    assert!(common::entries(dir.path()).is_empty());
}

/// On Windows' case-insensitive file system two plain names that differ
/// only in case are one lock file, so one lock: they exclude each other,
/// and the record names whichever took it.
#[cfg(windows)]
#[tokio::test]
async fn plain_names_differing_in_case_are_one_lock_on_windows() {
    let dir = tempfile::tempdir().unwrap();
    for style in [PathStyle::Plain, PathStyle::Exact] {
        let plain = || {
            Locker::builder()
                .directory(dir.path())
                .path_style(style)
                .build()
                .unwrap()
        };
        let (a, b) = (plain(), plain());
        let guard = a.acquire("Job").await.unwrap();
        assert!(b.try_acquire("job").await.unwrap().is_none(), "{style:?}");
        assert!(b.is_held("JOB").await.unwrap(), "{style:?}");
        let owner = b.holder("job").await.unwrap().expect("held");
        assert_eq!(owner.name(), Some("Job"), "{style:?}");
        assert_eq!(owner.uuid(), guard.owner().uuid(), "{style:?}");
        drop(guard);
        let other = b.try_acquire("job").await.unwrap().expect("free after release");
        assert!(a.try_acquire("Job").await.unwrap().is_none(), "{style:?}");
        drop(other);
    }
    assert!(common::entries(dir.path()).is_empty());
}

/// Hashed names that differ only in case are two locks everywhere: the
/// hash tells them apart, whatever the file system's case rules.
#[tokio::test]
async fn hashed_names_differing_in_case_are_two_locks() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (Locker::new(dir.path()).unwrap(), Locker::new(dir.path()).unwrap());
    let upper = a.acquire("Job").await.unwrap();
    let lower = b.try_acquire("job").await.unwrap().expect("another lock");
    assert_eq!(
        b.holder("Job").await.unwrap().expect("held").uuid(),
        upper.owner().uuid()
    );
    assert_eq!(
        a.holder("job").await.unwrap().expect("held").uuid(),
        lower.owner().uuid()
    );
    let (p, q) = (a.lock_path("Job").unwrap(), a.lock_path("job").unwrap());
    assert_ne!(
        p.file_name().unwrap().to_ascii_lowercase(),
        q.file_name().unwrap().to_ascii_lowercase()
    );
}

enum Expect {
    /// Left alone: the lock stays held.
    Held,
    /// Reclaimed: the next acquisition gets it.
    Reclaimed,
    /// Not a lock (no supported writer produces it, even torn): refused
    /// with `Error::UnexpectedFile`, and kept.
    NotALock,
}

/// Records: every case planted fresh (modified just now) on this host.
#[tokio::test]
async fn records_of_every_shape() {
    use Expect::{Held, NotALock, Reclaimed};
    let me = std::process::id();
    // A live process that is not ours: init on Unix; on Windows, which has
    // no pid that is always a live process (Wine has no System at 4), a
    // child of ours, holding a lock elsewhere until it is killed.
    #[cfg(unix)]
    let others = 1;
    #[cfg(windows)]
    let (_elsewhere, _child, others) = {
        let elsewhere = tempfile::tempdir().unwrap();
        let d = elsewhere.path().to_str().unwrap().to_owned();
        let child = common::ChildProc::spawn("hold", &[&d, "x", "60000"]);
        child.expect("acquired", Duration::from_secs(20));
        let pid = child.pid();
        (elsewhere, child, pid)
    };
    let future = iso(SystemTime::now() + Duration::from_secs(3600));
    let decades = iso(SystemTime::now() + Duration::from_secs(40 * 365 * 86_400));
    let past = iso(SystemTime::now() - Duration::from_secs(60));
    let garbage: String = (0..10 * 1024 * 1024)
        .map(|i| char::from(b'!' + (i % 90) as u8))
        .collect();
    let cases: Vec<(&str, Vec<u8>, Expect)> = vec![
        // Unreadable: a writer may be mid-write, so left alone within grace.
        ("empty", b"".to_vec(), Held),
        ("whitespace", b" \n\t ".to_vec(), Held),
        ("NUL bytes (a crash without a sync)", vec![0; 200], Held),
        ("truncated", br#"{"uuid":"a","pid":12"#.to_vec(), Held),
        ("truncated inside a character", b"{\"uuid\":\"\xc3".to_vec(), Held),
        // No writer's record begins so: JSON with blanks between its
        // tokens, trailing commas (Bun's `bun.lock`), or a pid alone.
        (
            "JSON with trailing commas",
            b"{\n  \"lockfileVersion\": 1,\n  \"workspaces\": {},\n}\n".to_vec(),
            NotALock,
        ),
        ("cut short, another key first", br#"{"pid":12"#.to_vec(), NotALock),
        ("a pid alone", br#"{"pid":4242,"port":8080}"#.to_vec(), NotALock),
        ("a prefix of a UUID", b"6f1c3a0e-8d2b".to_vec(), Held),
        ("negative pid", br#"{"uuid":"a","pid":-5}"#.to_vec(), Held),
        ("missing fields", br#"{"uuid":"a"}"#.to_vec(), Held),
        // What no supported writer produces, even torn: not a lock.
        ("10 MB of garbage", garbage.into_bytes(), NotALock),
        ("invalid UTF-8", vec![0xff, 0xfe, b'{', 0x80], NotALock),
        ("wrong types", br#"{"uuid":5,"pid":"123"}"#.to_vec(), NotALock),
        (
            "an object naming no holder",
            br#"{"theme":"dark"}"#.to_vec(),
            NotALock,
        ),
        ("a TOML file", b"version = 4\n".to_vec(), NotALock),
        ("a word", b"hello".to_vec(), NotALock),
        (
            "over 64 KiB",
            format!(r#"{{"uuid":"a","pid":{me},"x":"{}"}}"#, "x".repeat(70_000)).into_bytes(),
            NotALock,
        ),
        // A pid that cannot be probed (0 would mean our process group,
        // huge ones do not fit pid_t): undecidable, so alive.
        ("zero pid", br#"{"uuid":"a","pid":0}"#.to_vec(), Held),
        ("huge pid", br#"{"uuid":"a","pid":99999999999}"#.to_vec(), Held),
        (
            "our own pid",
            format!(r#"{{"uuid":"a","pid":{me}}}"#).into_bytes(),
            Held,
        ),
        (
            "a live pid not ours",
            format!(r#"{{"uuid":"a","pid":{others}}}"#).into_bytes(),
            Held,
        ),
        (
            "a dead pid",
            br#"{"uuid":"a","pid":999999999}"#.to_vec(),
            Reclaimed,
        ),
        (
            "future acquiredAt",
            format!(r#"{{"uuid":"a","pid":{me},"acquiredAt":"{future}"}}"#).into_bytes(),
            Held,
        ),
        (
            "lease decades ahead, live owner",
            format!(r#"{{"holderId":"h","pid":{me},"hostname":"elsewhere","leaseExpiresAt":"{decades}"}}"#)
                .into_bytes(),
            Held,
        ),
        (
            "lease decades ahead, dead owner on this host",
            format!(r#"{{"uuid":"a","pid":999999999,"leaseExpiresAt":"{decades}"}}"#).into_bytes(),
            Reclaimed,
        ),
        (
            "lease in the past",
            format!(r#"{{"holderId":"h","pid":{me},"leaseExpiresAt":"{past}"}}"#).into_bytes(),
            Reclaimed,
        ),
        (
            "extra fields",
            format!(r#"{{"uuid":"a","pid":{me},"x":[1,{{"y":null}}],"port":3006}}"#).into_bytes(),
            Held,
        ),
        ("a JSON array", b"[1,2,3]".to_vec(), NotALock),
        ("a JSON string", br#""uuid""#.to_vec(), NotALock),
    ];
    for &strategy in common::strategies() {
        let dir = tempfile::tempdir().unwrap();
        let locker = Locker::builder()
            .directory(dir.path())
            .strategy(strategy)
            .build()
            .unwrap();
        for (i, (what, bytes, expect)) in cases.iter().enumerate() {
            let name = format!("case-{i}");
            let path = locker.lock_path(&name).unwrap();
            plant(strategy, &path, "", Duration::ZERO);
            let record = if path.is_dir() {
                path.join("owner.json")
            } else {
                path.clone()
            };
            std::fs::write(&record, bytes).unwrap();
            let got = locker.try_acquire(&name).await;
            if let NotALock = expect {
                assert!(
                    matches!(got, Err(Error::UnexpectedFile { .. })),
                    "{strategy:?} {what}: {got:?}"
                );
                assert_eq!(&std::fs::read(&record).unwrap(), bytes, "{strategy:?} {what}");
                let info = locker.inspect(&name).await;
                assert!(
                    matches!(info, Err(Error::UnexpectedFile { .. })),
                    "{strategy:?} {what}"
                );
                continue;
            }
            let got = got.unwrap_or_else(|e| panic!("{strategy:?} {what}: {e}"));
            match expect {
                Held => assert!(got.is_none(), "{strategy:?} {what}: taken from its holder"),
                Reclaimed => assert!(got.is_some(), "{strategy:?} {what}: not reclaimed"),
                NotALock => unreachable!(),
            }
            // Whatever the record, inspecting it never fails or panics.
            let info = locker.inspect(&name).await.unwrap();
            assert!(info.is_some(), "{strategy:?} {what}");
        }
    }
}

/// A value for a record field: every JSON type, the values that mean
/// something here (our pid, a dead one, this boot), and nonsense.
fn any_value() -> impl proptest::strategy::Strategy<Value = String> {
    let me = std::process::id();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let time_ns = std::fs::read_link("/proc/self/ns/time")
        .map(|l| l.display().to_string())
        .unwrap_or_default();
    let meaningful = vec![
        me.to_string(),
        dead_pid().to_string(),
        "1".into(),
        "0".into(),
        "-5".into(),
        "1.5".into(),
        "1e300".into(),
        "9007199254740993".into(),
        "18446744073709551615".into(),
        "30000".into(),
        "true".into(),
        "null".into(),
        "[]".into(),
        r#"{"x":1}"#.into(),
        format!("{:?}", boot.trim()),
        format!("{time_ns:?}"),
        format!("{:?}", hostname()),
        r#""elsewhere""#.into(),
        r#""NaN""#.into(),
        r#""2999-01-01T00:00:00.000Z""#.into(),
        format!("{:?}", iso(SystemTime::now() + Duration::from_secs(3600))),
        format!("{:?}", iso(SystemTime::now() - Duration::from_secs(3600))),
    ];
    prop_oneof![
        4 => proptest::sample::select(meaningful),
        1 => any::<i64>().prop_map(|n| n.to_string()),
        1 => any::<f64>().prop_map(|f| if f.is_finite() { format!("{f:e}") } else { "null".into() }),
        1 => "[a-z0-9 :-]{0,12}".prop_map(|s| format!("{s:?}")),
    ]
}

/// This host's name, as leasehold writes it in records.
#[cfg(unix)]
fn hostname() -> String {
    nix::unistd::gethostname().unwrap().to_string_lossy().into_owned()
}

/// This host's name, as leasehold writes it in records (its DNS host
/// name, which no std call gives): read from a record of its own.
#[cfg(windows)]
fn hostname() -> String {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::new(dir.path()).unwrap();
    let guard = locker.blocking_acquire("me").unwrap();
    let name = guard.owner().hostname().expect("a hostname").to_owned();
    drop((guard, locker));
    name
}

/// Anything a lock path could hold: JSON objects over the record's field
/// names with values of any type, other JSON, and garbage.
fn any_record() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
    // The format's keys that judging reads (the kinds of a shared lock's
    // marker aside).
    let fields = proptest::sample::select(
        leasehold::format::RECORD_KEYS
            .iter()
            .copied()
            .filter(|k| !matches!(*k, "mode" | "permits" | "group"))
            .collect::<Vec<_>>(),
    );
    let object = proptest::collection::btree_map(fields, any_value(), 0..10).prop_map(|m| {
        let body: Vec<String> = m.iter().map(|(k, v)| format!("{k:?}:{v}")).collect();
        format!("{{{}}}", body.join(",")).into_bytes()
    });
    prop_oneof![
        6 => object,
        1 => proptest::collection::vec(any::<u8>(), 0..64),
        1 => any_value().prop_map(String::into_bytes),
    ]
}

/// Writes `bytes` as the record at `name`'s lock path, last modified at
/// `mtime`.
fn plant_bytes(locker: &Locker, strategy: Strategy, name: &str, bytes: &[u8], mtime: SystemTime) {
    let path = locker.lock_path(name).unwrap();
    let record = if strategy == Strategy::Directory {
        std::fs::create_dir_all(&path).unwrap();
        path.join("owner.json")
    } else {
        path.clone()
    };
    std::fs::write(&record, bytes).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&record)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    if record != path {
        std::fs::File::open(&path).unwrap().set_modified(mtime).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Whatever is at a lock path, once unchanged for longer than every
    /// bound the staleness rules state (a year plus the skew margin; its
    /// writer holds no flock), it is stale and taken, or, if no supported
    /// writer could have written it, refused as no lock and kept byte for
    /// byte; fresh, it is judged without a panic, and a stale verdict is
    /// one `try_acquire` acts on.
    #[test]
    fn any_bytes_at_a_lock_path_are_reclaimed_past_every_bound(
        bytes in any_record(),
        directory in any::<bool>(),
    ) {
        // The directory layout where this platform has it (not Windows).
        let directory = directory && common::strategies().contains(&Strategy::Directory);
        let strategy = if directory { Strategy::Directory } else { Strategy::ExclusiveFile };
        let dir = tempfile::tempdir().unwrap();
        let locker = Locker::builder().directory(dir.path()).strategy(strategy).build().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let shown = String::from_utf8_lossy(&bytes).into_owned();

        let long_ago = SystemTime::now() - Duration::from_secs(3 * 365 * 86_400);
        plant_bytes(&locker, strategy, "old", &bytes, long_ago);
        match rt.block_on(locker.inspect("old")) {
            Err(Error::UnexpectedFile { path, .. }) => {
                let taken = rt.block_on(locker.try_acquire("old"));
                prop_assert!(matches!(taken, Err(Error::UnexpectedFile { .. })), "{shown:?}: {taken:?}");
                let record = if directory { path.join("owner.json") } else { path };
                prop_assert_eq!(std::fs::read(record).unwrap(), bytes.clone(), "{:?} changed", shown);
            }
            info => {
                let info = info.unwrap().expect("a lock is there");
                prop_assert!(info.is_stale(), "{shown:?} is not stale after three years");
                let taken = rt.block_on(locker.try_acquire("old")).unwrap();
                prop_assert!(taken.is_some(), "{shown:?} was not taken");
            }
        }

        plant_bytes(&locker, strategy, "fresh", &bytes, SystemTime::now());
        let info = match rt.block_on(locker.inspect("fresh")) {
            // No lock: checked above (a UUID's prefix is none only once
            // past the grace period).
            Err(Error::UnexpectedFile { .. }) => return Ok(()),
            info => info.unwrap().expect("a lock is there"),
        };
        let taken = rt.block_on(locker.try_acquire("fresh")).unwrap();
        if info.is_stale() {
            prop_assert!(taken.is_some(), "{shown:?} is stale ({:?}) but was not taken", info.stale_reason());
        }
    }
}

/// Every entry of the lock directory `path` and its content (`None` for a
/// directory), sorted.
#[cfg(unix)]
fn contents(path: &std::path::Path) -> Vec<(String, Option<Vec<u8>>)> {
    let mut all: Vec<_> = std::fs::read_dir(path)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let content = match e.file_type().unwrap().is_dir() {
                true => None,
                false => Some(std::fs::read(e.path()).unwrap()),
            };
            (e.file_name().to_string_lossy().into_owned(), content)
        })
        .collect();
    all.sort();
    all
}

// The directory layout, which Windows cannot lock (`build()` refuses it).
#[cfg(unix)]
proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The directory layout, whatever a lock directory holds: any
    /// `owner.json` (or none), a renewal's `owner.json.next`, and files or
    /// directories of someone else's. Judging never panics; one that holds
    /// anything but a lock record is no lock, refused and kept as it was,
    /// however old; one that is a lock is judged as the file layout would.
    #[test]
    fn any_lock_directory_is_judged_and_data_in_it_kept(
        owner in proptest::option::of(any_record()),
        next in any::<bool>(),
        strays in proptest::sample::subsequence(vec!["notes.txt", ".hidden", "sub"], 0..=3),
        old in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let locker = Locker::builder().directory(dir.path()).strategy(Strategy::Directory).build().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let path = locker.lock_path("job").unwrap();
        std::fs::create_dir(&path).unwrap();
        if let Some(bytes) = &owner {
            std::fs::write(path.join("owner.json"), bytes).unwrap();
        }
        if next {
            std::fs::write(path.join("owner.json.next"), br#"{"uuid":"u","#).unwrap();
        }
        for stray in &strays {
            match *stray {
                "sub" => std::fs::create_dir(path.join(stray)).unwrap(),
                _ => std::fs::write(path.join(stray), b"someone's data").unwrap(),
            }
        }
        let age = if old { Duration::from_secs(3 * 365 * 86_400) } else { Duration::ZERO };
        for entry in std::fs::read_dir(&path).unwrap() {
            let entry = entry.unwrap().path();
            std::fs::File::open(&entry).unwrap().set_modified(SystemTime::now() - age).unwrap();
        }
        std::fs::File::open(&path).unwrap().set_modified(SystemTime::now() - age).unwrap();
        let before = contents(&path);

        let inspected = rt.block_on(locker.inspect("job"));
        let taken = rt.block_on(locker.try_acquire("job"));
        let cleaned = rt.block_on(locker.clean(false));
        if !strays.is_empty() {
            prop_assert!(matches!(inspected, Err(Error::UnexpectedFile { .. })), "{strays:?}: {inspected:?}");
            prop_assert!(matches!(taken, Err(Error::UnexpectedFile { .. })), "{strays:?}: {taken:?}");
        }
        match inspected {
            Err(Error::UnexpectedFile { .. }) => {
                prop_assert!(cleaned.unwrap().is_empty());
                prop_assert_eq!(contents(&path), before, "a directory that is no lock changed");
            }
            other => {
                let info = other.unwrap().expect("a lock is there");
                if old {
                    prop_assert!(info.is_stale(), "{owner:?} kept for three years");
                    prop_assert!(taken.unwrap().is_some(), "{owner:?} not taken");
                }
            }
        }
    }
}

/// Settings that cannot work are refused by `build()`, not discovered at
/// the first acquisition (the rest: `tests/guard.rs`
/// `the_builder_rejects_settings_that_cannot_work`, `tests/config.rs`).
#[test]
fn zero_and_too_short_settings_are_refused_at_build() {
    let dir = tempfile::tempdir().unwrap();
    let base = || Locker::builder().directory(dir.path());
    for (what, builder) in [
        ("zero grace", base().unreadable_grace(Duration::ZERO)),
        ("zero wait notice", base().wait_notice(Some(Duration::ZERO))),
        ("lease below 200 ms", base().lease(Duration::from_millis(199))),
        (
            "renewal above half the lease",
            base()
                .lease(Duration::from_secs(10))
                .renew_interval(Duration::from_millis(5_001)),
        ),
    ] {
        let got = builder.build();
        assert!(matches!(got, Err(Error::InvalidConfig { .. })), "{what}: {got:?}");
    }
    // The smallest accepted values work.
    base()
        .unreadable_grace(Duration::from_nanos(1))
        .wait_notice(None)
        .lease(Duration::from_millis(200))
        .build()
        .unwrap();
}
