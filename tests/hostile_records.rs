//! Records written by anyone who can write the lock directory: whatever
//! they hold, reading them, waiting on them and printing the timeout never
//! panics, and the timeout's message carries no raw control characters.

use std::time::Duration;

use leasehold::{Locker, PathStyle};

fn locker(dir: &std::path::Path) -> Locker {
    Locker::builder()
        .directory(dir)
        .path_style(PathStyle::Plain)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn hostile_records_never_panic_and_print_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let locker = locker(dir.path());
    let me = std::process::id();
    let nested = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
    let many: String = (0..3000).map(|i| format!(r#","f{i}":{i}"#)).collect();
    let records: Vec<(&str, Vec<u8>)> = vec![
        (
            "control",
            format!(r#"{{"uuid":"u","pid":{me},"hostname":"evil\u001b[2J\r\nhost","port":"\u001b]0;x\u0007"}}"#).into_bytes(),
        ),
        (
            "huge-host",
            format!(r#"{{"uuid":"u","pid":{me},"hostname":"{}"}}"#, "h".repeat(60_000)).into_bytes(),
        ),
        (
            "odd-times",
            format!(
                r#"{{"uuid":"u","pid":{me},"acquiredAt":"0001-01-01T00:00:00Z","leaseExpiresAt":"9999-12-31T23:59:59.999999999Z","startTime":1e308}}"#
            )
            .into_bytes(),
        ),
        (
            "duplicates",
            format!(r#"{{"uuid":"u","pid":1,"pid":{me},"port":1,"port":"two","big":18446744073709551616}}"#).into_bytes(),
        ),
        ("nested", format!(r#"{{"uuid":"u","pid":{me},"deep":{nested}}}"#).into_bytes()),
        ("many", format!(r#"{{"uuid":"u","pid":{me}{many}}}"#).into_bytes()),
        ("binary", b"{\"uuid\":\"u\xff\xfe\",\"pid\":1}".to_vec()),
        ("empty-key", format!(r#"{{"uuid":"u","pid":{me},"":1}}"#).into_bytes()),
    ];
    for (name, bytes) in &records {
        std::fs::write(locker.lock_path(name).unwrap(), bytes).unwrap();
    }
    let _ = locker.list().await.unwrap();
    for (name, _) in &records {
        let _ = locker.holder(name).await.unwrap();
        let _ = locker.inspect(name).await.unwrap();
        let err = locker
            .acquire_timeout(name, Duration::from_millis(100))
            .await
            .expect_err(name);
        assert!(err.is_timeout(), "{name}: {err:?}");
        let text = err.to_string();
        assert!(!text.chars().any(char::is_control), "{name}: {text:?}");
        assert!(text.len() < 70_000, "{name}: {} bytes", text.len());
        if let Some(owner) = err.holder() {
            for (key, value) in owner.fields() {
                let _ = (key, value.to_string());
            }
        }
    }
    // A time before 1970 is quoted as the record says, not as the epoch.
    let err = locker
        .acquire_timeout("odd-times", Duration::from_millis(50))
        .await
        .unwrap_err();
    // Windows' `SystemTime` starts in 1601: a time before it is left out
    // of the message there, never quoted as another.
    #[cfg(unix)]
    assert!(
        err.to_string().ends_with(" since 0001-01-01T00:00:00.000Z"),
        "{err}"
    );
    #[cfg(windows)]
    assert!(!err.to_string().contains(" since "), "{err}");
    std::fs::write(
        locker.lock_path("old-times").unwrap(),
        format!(r#"{{"uuid":"u","pid":{me},"acquiredAt":"1900-01-01T00:00:00Z"}}"#),
    )
    .unwrap();
    let err = locker
        .acquire_timeout("old-times", Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(
        err.to_string().ends_with(" since 1900-01-01T00:00:00.000Z"),
        "{err}"
    );
    let many = locker.holder("many").await.unwrap().expect("held");
    assert_eq!(many.fields().count(), 3000);
    let dup = locker.holder("duplicates").await.unwrap().expect("held");
    assert_eq!(
        dup.pid(),
        Some(me),
        "the last of duplicate keys wins, as in JSON.parse"
    );
    assert_eq!(dup.field("port").and_then(|v| v.as_str()), Some("two"));
    assert_eq!(dup.field("big").and_then(|v| v.as_u64()), None);
}
