//! A lock whose record cannot be written (EFBIG from a file-size limit) is
//! never left half-made, in either layout, synced or not: the attempt
//! fails and the directory is empty. Its own test binary, because the
//! limit is process-wide.
// A file-size limit (RLIMIT_FSIZE, SIGXFSZ) is Unix's: Windows has none to set.
#![cfg(unix)]

use std::time::Duration;

use leasehold::{Locker, Strategy};
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::signal::{SigHandler, Signal, signal};

fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// Writes past 16 bytes fail with EFBIG (SIGXFSZ ignored) while `f` runs.
fn with_tiny_files<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: ignoring a signal in a test process.
    unsafe { signal(Signal::SIGXFSZ, SigHandler::SigIgn) }.unwrap();
    let (soft, hard) = getrlimit(Resource::RLIMIT_FSIZE).unwrap();
    setrlimit(Resource::RLIMIT_FSIZE, 16, hard).unwrap();
    let out = f();
    setrlimit(Resource::RLIMIT_FSIZE, soft, hard).unwrap();
    out
}

#[test]
fn a_failed_record_write_leaves_nothing_in_either_layout() {
    for strategy in [Strategy::ExclusiveFile, Strategy::Directory] {
        for durable in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let locker = Locker::builder()
                .directory(dir.path())
                .strategy(strategy)
                .durable(durable)
                .build()
                .unwrap();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let result =
                with_tiny_files(|| rt.block_on(locker.acquire_timeout("x", Duration::from_millis(300))));
            assert!(result.is_err(), "{strategy:?} durable={durable}: {result:?}");
            assert_eq!(
                entries(dir.path()),
                Vec::<String>::new(),
                "{strategy:?} durable={durable}"
            );
            // And the name is free afterwards.
            let guard = rt
                .block_on(locker.acquire_timeout("x", Duration::from_secs(2)))
                .unwrap();
            drop(guard);
        }
    }
}
