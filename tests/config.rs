//! Every configuration `build()` accepts keeps a live holder's lock.

#[path = "support/common.rs"]
mod common;

use std::time::{Duration, Instant};

use leasehold::{Error, Locker, Strategy};

/// Builds with `lease` and `renew`, or says why not.
fn build(
    dir: &std::path::Path,
    strategy: Strategy,
    lease: Duration,
    renew: Duration,
) -> leasehold::Result<Locker> {
    Locker::builder()
        .directory(dir)
        .strategy(strategy)
        .lease(lease)
        .renew_interval(renew)
        .build()
}

/// A grid of (lease, renew interval): each pair is either refused by
/// `build()` with a message that states the bound, or its holder keeps the
/// lock for three leases, never lost, while a rival `Locker` keeps trying.
/// All pairs run at once, so the grid takes three of its longest lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_accepted_configuration_keeps_a_live_holders_lock() {
    let ms = Duration::from_millis;
    let leases = [ms(100), ms(200), ms(500), ms(1000)];
    let fractions = [
        0.01, 0.1, 0.25, 0.33, 0.5, 0.51, 0.6, 0.74, 0.75, 0.76, 0.8, 0.9, 0.99, 1.0, 1.5,
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut accepted = Vec::new();
    let mut refused = 0;
    for &strategy in common::strategies() {
        for lease in leases {
            for fraction in fractions {
                let renew = lease.mul_f64(fraction);
                match build(dir.path(), strategy, lease, renew) {
                    Ok(holder) => {
                        let rival = build(dir.path(), strategy, lease, renew).unwrap();
                        accepted.push((strategy, lease, renew, holder, rival));
                    }
                    Err(Error::InvalidConfig { reason }) => {
                        // Refused only for a stated bound, which the message names.
                        if lease < ms(200) {
                            assert!(reason.contains("below 200ms"), "{reason}");
                        } else {
                            assert!(renew > lease / 2, "{lease:?}/{renew:?} refused: {reason}");
                            assert!(reason.contains("half the lease"), "{reason}");
                        }
                        refused += 1;
                    }
                    Err(other) => panic!("{lease:?}/{renew:?}: {other:?}"),
                }
            }
        }
    }
    assert!(refused > 0 && !accepted.is_empty());
    let mut runs = Vec::new();
    for (n, (strategy, lease, renew, holder, rival)) in accepted.into_iter().enumerate() {
        runs.push(tokio::spawn(async move {
            let name = format!("grid-{n}");
            let guard = holder.acquire(&name).await.unwrap();
            let started = Instant::now();
            while started.elapsed() < lease * 3 {
                let what = format!("{strategy:?} lease {lease:?} renew {renew:?}");
                assert!(!guard.is_lost(), "{what}: lost after {:?}", started.elapsed());
                assert!(
                    rival.try_acquire(&name).await.unwrap().is_none(),
                    "{what}: a rival got in after {:?}",
                    started.elapsed()
                );
                tokio::time::sleep(lease / 8).await;
            }
            guard.ensure_held().await.unwrap();
            guard.release().await.unwrap();
        }));
    }
    for run in runs {
        run.await.unwrap();
    }
}

/// The case that robbed every holder: a 30 s lease renewed every 25 s.
#[test]
fn a_renewal_after_the_safety_margin_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let strategy = Strategy::ExclusiveFile;
    let err = build(
        dir.path(),
        strategy,
        Duration::from_secs(30),
        Duration::from_secs(25),
    )
    .unwrap_err();
    let Error::InvalidConfig { reason } = err else {
        panic!("expected InvalidConfig, got {err:?}");
    };
    assert!(reason.contains("25s") && reason.contains("30s"), "{reason}");
    assert!(
        build(
            dir.path(),
            strategy,
            Duration::from_secs(30),
            Duration::from_secs(15)
        )
        .is_ok()
    );
    // Too short a lease to renew reliably, and no interval at all.
    assert!(
        build(
            dir.path(),
            strategy,
            Duration::from_millis(50),
            Duration::from_millis(10)
        )
        .is_err()
    );
    assert!(build(dir.path(), strategy, Duration::from_secs(1), Duration::ZERO).is_err());
}

/// A foreign lease shorter than the shortest lease leasehold accepts would
/// reclaim the lock of a live pi-research holder (whose records carry no
/// lease) about as soon as it was written: `build()` refuses it, as it
/// refuses such a lease of its own.
#[test]
fn a_foreign_lease_too_short_to_keep_a_live_holder_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let with = |lease: Option<Duration>| {
        Locker::builder()
            .directory(dir.path())
            .foreign_lease(lease)
            .build()
    };
    for too_short in [
        Duration::ZERO,
        Duration::from_millis(1),
        Duration::from_millis(199),
    ] {
        match with(Some(too_short)) {
            Err(Error::InvalidConfig { reason }) => {
                assert!(reason.contains("foreign lease"), "{reason}");
            }
            other => panic!("foreign_lease({too_short:?}) was not refused: {other:?}"),
        }
    }
    assert!(with(Some(Duration::from_millis(200))).is_ok());
    assert!(with(None).is_ok());
}
