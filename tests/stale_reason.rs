//! `LockInfo::stale_reason` says why, as a typed value, for each kind of
//! stale record leasehold meets.

#[path = "support/common.rs"]
mod common;

use std::time::{Duration, SystemTime};

use leasehold::{Locker, StaleReason, Strategy};

#[tokio::test]
async fn each_kind_of_stale_record_has_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let locker = Locker::builder()
        .directory(dir.path())
        .unreadable_grace(Duration::from_millis(50))
        .build()
        .unwrap();
    let file = |name: &str| locker.lock_path(name).unwrap();

    // pi-research's record of a process that has exited.
    let dead = common::dead_pid();
    std::fs::write(file("dead"), format!(r#"{{"uuid":"u1","pid":{dead}}}"#)).unwrap();

    // velocious's record from another host whose lease ran out an hour ago.
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    let expired = format!(
        r#"{{"acquiredAt":"{}","holderId":"h","hostname":"elsewhere.invalid","leaseExpiresAt":"{}","pid":4242}}"#,
        common::iso(hour_ago),
        common::iso(hour_ago + Duration::from_secs(30))
    );
    common::plant(
        Strategy::ExclusiveFile,
        &file("expired"),
        &expired,
        Duration::from_secs(3600),
    );

    // A record cut short, older than the grace period.
    common::plant(
        Strategy::ExclusiveFile,
        &file("torn"),
        "{\"uu",
        Duration::from_secs(1),
    );

    // And one live lock, which is not stale at all.
    let _held = locker.acquire("held").await.unwrap();

    let reason = |name: &'static str| {
        let locker = locker.clone();
        async move { locker.inspect(name).await.unwrap().expect(name).stale_reason() }
    };
    assert_eq!(reason("dead").await, Some(StaleReason::DeadOwner));
    assert_eq!(reason("expired").await, Some(StaleReason::LeaseExpired));
    assert_eq!(reason("torn").await, Some(StaleReason::Unreadable));
    assert_eq!(reason("held").await, None);

    // `list` agrees, and `clean` reports what it removed and why.
    let listed = locker.list().await.unwrap();
    assert_eq!(listed.iter().filter(|l| l.is_stale()).count(), 3);
    let mut removed: Vec<_> = locker
        .clean(false)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.stale_reason().expect("removed locks are stale"))
        .collect();
    removed.sort_by_key(|r| r.to_string());
    assert_eq!(
        removed,
        [
            StaleReason::LeaseExpired,
            StaleReason::DeadOwner,
            StaleReason::Unreadable
        ]
    );
}

#[test]
fn reasons_read_as_lowercase_phrases() {
    let all = [
        StaleReason::DeadOwner,
        StaleReason::ReusedPid,
        StaleReason::PreviousBoot,
        StaleReason::LeaseExpired,
        StaleReason::Unreadable,
        StaleReason::Leftover,
    ];
    let texts: std::collections::HashSet<String> = all.iter().map(|r| r.to_string()).collect();
    assert_eq!(texts.len(), all.len(), "each reason reads differently: {texts:?}");
    for text in &texts {
        assert!(!text.is_empty() && !text.ends_with('.'), "{text:?}");
        assert_eq!(text.to_lowercase(), *text);
    }
}
