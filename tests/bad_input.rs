//! Bad input, case by case, each with the outcome it must have.

mod common;

use std::time::{Duration, SystemTime};

use common::{iso, plant};
use leasehold::{Error, Locker, PathStyle, Strategy};

#[test]
fn child_process_entry() {
    common::child_entry();
}

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
    let long = "n".repeat(10_000);
    // (name, accepted by Hashed, accepted by Plain)
    let cases: &[(&str, bool, bool)] = &[
        ("", false, false),
        (".", true, false),
        ("..", true, false),
        ("/", true, false),
        ("a/../../b", true, false),
        ("nul\0inside", false, false),
        (&long, true, false),
        ("日本語🔒", true, true),
        ("line\nbreak", true, false),
        // Windows-reserved names are ordinary file names on Unix.
        ("CON", true, true),
        ("nul", true, true),
        ("COM1.txt", true, true),
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
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

enum Expect {
    /// Left alone: the lock stays held.
    Held,
    /// Reclaimed: the next acquisition gets it.
    Reclaimed,
}

/// Records: every case planted fresh (modified just now) on this host.
#[tokio::test]
async fn records_of_every_shape() {
    use Expect::{Held, Reclaimed};
    let me = std::process::id();
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
        ("truncated", br#"{"uuid":"a","pid":12"#.to_vec(), Held),
        ("10 MB of garbage", garbage.into_bytes(), Held),
        ("invalid UTF-8", vec![0xff, 0xfe, b'{', 0x80], Held),
        ("wrong types", br#"{"uuid":5,"pid":"123"}"#.to_vec(), Held),
        ("negative pid", br#"{"uuid":"a","pid":-5}"#.to_vec(), Held),
        ("missing fields", br#"{"uuid":"a"}"#.to_vec(), Held),
        // A pid that cannot be probed (0 would mean our process group,
        // huge ones do not fit pid_t): undecidable, so alive.
        ("zero pid", br#"{"uuid":"a","pid":0}"#.to_vec(), Held),
        ("huge pid", br#"{"uuid":"a","pid":99999999999}"#.to_vec(), Held),
        (
            "our own pid",
            format!(r#"{{"uuid":"a","pid":{me}}}"#).into_bytes(),
            Held,
        ),
        ("pid 1", br#"{"uuid":"a","pid":1}"#.to_vec(), Held),
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
            format!(r#"{{"pid":{me},"hostname":"elsewhere","leaseExpiresAt":"{decades}"}}"#).into_bytes(),
            Held,
        ),
        (
            "lease decades ahead, dead owner on this host",
            format!(r#"{{"uuid":"a","pid":999999999,"leaseExpiresAt":"{decades}"}}"#).into_bytes(),
            Reclaimed,
        ),
        (
            "lease in the past",
            format!(r#"{{"pid":{me},"leaseExpiresAt":"{past}"}}"#).into_bytes(),
            Reclaimed,
        ),
        (
            "extra fields",
            format!(r#"{{"uuid":"a","pid":{me},"x":[1,{{"y":null}}],"port":3006}}"#).into_bytes(),
            Held,
        ),
        ("a JSON array", b"[1,2,3]".to_vec(), Held),
        ("a JSON string", br#""uuid""#.to_vec(), Held),
    ];
    for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
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
            let got = got.unwrap_or_else(|e| panic!("{strategy:?} {what}: {e}"));
            match expect {
                Held => assert!(got.is_none(), "{strategy:?} {what}: taken from its holder"),
                Reclaimed => assert!(got.is_some(), "{strategy:?} {what}: not reclaimed"),
            }
            // Whatever the record, inspecting it never fails or panics.
            let info = locker.inspect(&name).await.unwrap();
            assert!(info.is_some(), "{strategy:?} {what}");
        }
    }
}
