//! Owner fields (velocious's `extraOwnerFields`): published in every record
//! a `Locker` writes, in both layouts and for every kind of lock, kept
//! across renewals, read back by every reader.

#[path = "support/common.rs"]
mod common;

use std::time::Duration;

use leasehold::{Error, FieldValue, LockKind, Locker, Strategy};

#[test]
fn child_process_entry() {
    common::child_entry();
}

fn server(dir: &std::path::Path, strategy: Strategy) -> Locker {
    Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .lease(Duration::from_secs(1))
        .renew_interval(Duration::from_millis(100))
        .owner_field("host", "127.0.0.1")
        .owner_field("port", 8080u16)
        .owner_field("primary", true)
        .owner_field("weight", 0.75)
        .owner_field("epoch", u64::MAX)
        .owner_field("note", String::from("say \"hi\"\n"))
        .build()
        .unwrap()
}

fn assert_fields(owner: &leasehold::Owner, context: &str) {
    assert_eq!(
        owner.field("host").and_then(FieldValue::as_str),
        Some("127.0.0.1"),
        "{context}"
    );
    assert_eq!(
        owner.field("port").and_then(FieldValue::as_i64),
        Some(8080),
        "{context}"
    );
    assert_eq!(
        owner.field("primary").and_then(FieldValue::as_bool),
        Some(true),
        "{context}"
    );
    assert_eq!(
        owner.field("weight").and_then(FieldValue::as_f64),
        Some(0.75),
        "{context}"
    );
    assert_eq!(
        owner.field("epoch").and_then(FieldValue::as_u64),
        Some(u64::MAX),
        "{context}"
    );
    assert_eq!(
        owner.field("note").and_then(FieldValue::as_str),
        Some("say \"hi\"\n"),
        "{context}"
    );
    let keys: Vec<&str> = owner.fields().map(|(k, _)| k).collect();
    assert_eq!(
        keys,
        ["epoch", "host", "note", "port", "primary", "weight"],
        "{context}"
    );
    // The record's own fields are still there, and none became a field.
    assert_eq!(owner.pid(), Some(std::process::id()), "{context}");
    assert_eq!(owner.field("pid"), None, "{context}");
}

#[tokio::test]
async fn every_reader_sees_the_fields_in_both_layouts_across_renewals() {
    for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
        let dir = tempfile::tempdir().unwrap();
        let locker = server(dir.path(), strategy);
        let reader = Locker::builder()
            .directory(dir.path())
            .strategy(strategy)
            .build()
            .unwrap();
        let guard = locker.acquire("dev-server").await.unwrap();
        assert_fields(guard.owner(), &format!("{strategy:?} guard"));
        // Over two leases: renewals rewrite the record and keep them.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert!(!guard.is_lost());
        let seen = reader.holder("dev-server").await.unwrap().expect("held");
        assert_fields(&seen, &format!("{strategy:?} holder after renewals"));
        let renewed = seen.lease_expires_at().unwrap();
        assert!(
            renewed > guard.owner().lease_expires_at().unwrap(),
            "renewed since"
        );
        assert_fields(
            reader.inspect("dev-server").await.unwrap().unwrap().owner(),
            "inspect",
        );
        assert_fields(reader.list().await.unwrap()[0].owner(), "list");
        // And in the raw record, as JSON values of their own types, after
        // the record's own fields.
        let mut path = locker.lock_path("dev-server").unwrap();
        if strategy == Strategy::Directory {
            path = path.join("owner.json");
        }
        let bytes = std::fs::read(&path).unwrap();
        let raw: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(raw["port"], 8080);
        assert_eq!(raw["primary"], true);
        assert_eq!(raw["epoch"], u64::MAX);
        let text = String::from_utf8(bytes).unwrap();
        let at = |key: &str| text.find(&format!("\"{key}\":")).unwrap();
        assert!(
            at("host") > at("pid") && at("note") > at("host"),
            "fields come last, in order: {text}"
        );
    }
}

#[tokio::test]
async fn shared_holders_and_permit_holders_publish_their_fields() {
    let dir = tempfile::tempdir().unwrap();
    let reader = server(dir.path(), Strategy::ExclusiveFile);
    let plain = Locker::new(dir.path()).unwrap();
    let _a = reader.acquire_shared("catalog").await.unwrap();
    let _b = plain.acquire_shared("catalog").await.unwrap();
    let info = plain.inspect("catalog").await.unwrap().unwrap();
    assert_eq!(info.kind(), LockKind::Shared);
    let with_fields = info
        .holders()
        .iter()
        .filter(|h| h.field("port").is_some())
        .count();
    assert_eq!(with_fields, 1, "{:?}", info.holders());

    let _permit = reader.semaphore("gpu", 2).unwrap().acquire().await.unwrap();
    let info = plain.inspect("gpu").await.unwrap().unwrap();
    assert_fields(&info.holders()[0], "permit holder");
    assert_fields(info.owner(), "semaphore marker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_a_holder_in_another_process_publishes_are_read_here() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let child = common::ChildProc::spawn("hold_fields", &[path, "dev-server", "4711"]);
    child.expect("acquired", Duration::from_secs(30));
    let locker = Locker::new(dir.path()).unwrap();
    assert!(locker.try_acquire("dev-server").await.unwrap().is_none());
    let seen = locker.holder("dev-server").await.unwrap().expect("held");
    assert_eq!(seen.pid(), Some(child.pid()));
    assert_eq!(seen.field("host").and_then(FieldValue::as_str), Some("127.0.0.1"));
    assert_eq!(seen.field("port").and_then(FieldValue::as_i64), Some(4711));
}

#[test]
fn bad_fields_are_refused_at_build() {
    let dir = tempfile::tempdir().unwrap();
    let build = |key: &str, value: FieldValue| {
        Locker::builder()
            .directory(dir.path())
            .owner_field(key, value)
            .build()
    };
    for reserved in [
        "pid",
        "uuid",
        "hostname",
        "holderId",
        "acquiredAt",
        "leaseExpiresAt",
        "startTime",
        "leaseMs",
        "name",
        "fencingToken",
        "mode",
        "permits",
        "group",
        "leasehold",
    ] {
        let err = build(reserved, FieldValue::from("x")).unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{reserved}: {err:?}");
        assert!(err.to_string().contains(reserved), "{err}");
    }
    for key in ["", "tab\there", &"k".repeat(65)] {
        assert!(build(key, FieldValue::from(1u32)).is_err(), "{key:?}");
    }
    assert!(build("x", FieldValue::from(f64::NAN)).is_err());
    // The size limit: 4 KiB of fields as JSON.
    assert!(build("big", FieldValue::from("v".repeat(4000))).is_ok());
    assert!(build("big", FieldValue::from("v".repeat(5000))).is_err());
    let many = (0..200).fold(Locker::builder().directory(dir.path()), |b, i| {
        b.owner_field(&format!("field{i}"), "some value")
    });
    assert!(matches!(many.build(), Err(Error::InvalidConfig { .. })));
    // A key set twice keeps its last value.
    let twice = Locker::builder()
        .directory(dir.path())
        .owner_field("port", 1u16)
        .owner_field("port", 2u16)
        .build();
    assert!(twice.is_ok());
    // `host` and `port`, velocious's, are free.
    assert!(build("host", FieldValue::from("::1")).is_ok());
}

/// When the shared holder whose record the lock path shows leaves, the
/// marker passes to one who stays: it then shows that holder, with that
/// holder's own fields (none of the one who left), in both layouts.
#[tokio::test]
async fn the_shared_marker_passes_on_with_the_stayers_fields() {
    for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
        let dir = tempfile::tempdir().unwrap();
        let make = |role: &str| {
            Locker::builder()
                .directory(dir.path())
                .strategy(strategy)
                .owner_field("role", role.to_owned())
                .build()
                .unwrap()
        };
        let (first, second) = (make("first"), make("second"));
        let a = first.acquire_shared("catalog").await.unwrap();
        let b = second.acquire_shared("catalog").await.unwrap();
        let info = first.inspect("catalog").await.unwrap().unwrap();
        let shown = info
            .owner()
            .field("role")
            .and_then(FieldValue::as_str)
            .map(str::to_owned);
        // Whoever the marker shows leaves; the other stays.
        let (leaving, staying, stayer) = match shown.as_deref() {
            Some("first") => (a, b, "second"),
            Some("second") => (b, a, "first"),
            other => panic!("{strategy:?}: the marker shows {other:?}"),
        };
        leaving.release().await.unwrap();
        let info = first.inspect("catalog").await.unwrap().expect("still held");
        assert_eq!(info.holders().len(), 1, "{strategy:?}: {:?}", info.holders());
        assert_eq!(
            info.owner().field("role").and_then(FieldValue::as_str),
            Some(stayer),
            "{strategy:?}: {:?}",
            info.owner()
        );
        assert_eq!(info.owner().uuid(), staying.owner().uuid(), "{strategy:?}");
        staying.release().await.unwrap();
    }
}

/// An unsuffixed integer literal (an `i32`) and a `usize` (a length) are
/// accepted as they are.
#[tokio::test]
async fn plain_integer_literals_and_lengths_are_fields() {
    let dir = tempfile::tempdir().unwrap();
    let workers = [(); 3];
    let locker = Locker::builder()
        .directory(dir.path())
        .owner_field("port", 8080)
        .owner_field("workers", workers.len())
        .owner_field("offset", -2i8)
        .build()
        .unwrap();
    let guard = locker.acquire("srv").await.unwrap();
    let owner = locker.holder("srv").await.unwrap().expect("held");
    assert_eq!(owner.field("port").and_then(FieldValue::as_i64), Some(8080));
    assert_eq!(owner.field("workers").and_then(FieldValue::as_u64), Some(3));
    assert_eq!(owner.field("offset").and_then(FieldValue::as_i64), Some(-2));
    guard.release().await.unwrap();
}

/// The marker passing between holders whose records differ much in length
/// (one with nearly 4 KiB of fields, one with none), either way, in both
/// layouts, and renewed after: it always parses, and shows the stayer.
#[tokio::test]
async fn the_shared_marker_passes_between_records_of_very_different_lengths() {
    for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
        for big_stays in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let build = |blob: Option<String>| {
                let mut b = Locker::builder()
                    .directory(dir.path())
                    .strategy(strategy)
                    .lease(Duration::from_millis(300))
                    .renew_interval(Duration::from_millis(30));
                if let Some(blob) = blob {
                    b = b.owner_field("blob", blob);
                }
                b.build().unwrap()
            };
            let big = build(Some("x".repeat(4000)));
            let small = build(None);
            // The first to join shows in the marker: let the leaver join first.
            let (leaver, stayer) = if big_stays { (&small, &big) } else { (&big, &small) };
            let leaving = leaver.acquire_shared("catalog").await.unwrap();
            let staying = stayer.acquire_shared("catalog").await.unwrap();
            leaving.release().await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await; // renewals
            let info = small.inspect("catalog").await.unwrap().expect("held");
            let context = format!("{strategy:?}, big stays: {big_stays}");
            assert!(info.owner().is_readable(), "{context}: {:?}", info.owner());
            assert!(!info.is_stale(), "{context}");
            assert_eq!(info.owner().uuid(), staying.owner().uuid(), "{context}");
            assert_eq!(info.owner().field("blob").is_some(), big_stays, "{context}");
            assert!(!staying.is_lost(), "{context}");
            staying.release().await.unwrap();
        }
    }
}
