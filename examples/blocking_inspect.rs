//! Asking about locks from synchronous code, as an operator's script
//! would: who holds a name, every lock in the directory, and cleaning up
//! what a crashed process left, with no async runtime anywhere.
//!
//! ```text
//! cargo run --example blocking_inspect
//! ```

use leasehold::{Locker, Result};

fn main() -> Result<()> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let locker = Locker::new(dir.path())?;
    let _backup = locker.blocking_acquire("backup")?;
    let _readers = [
        locker.blocking_acquire_shared("catalog")?,
        Locker::new(dir.path())?.blocking_acquire_shared("catalog")?,
    ];
    // What a process that crashed while it held "reindex" leaves behind
    // (a pid that no process has).
    let crashed = locker.lock_path("reindex")?;
    std::fs::write(&crashed, r#"{"uuid":"x","pid":999999999}"#).expect("plant a lock");

    let script = Locker::new(dir.path())?; // the operator's own
    if let Some(owner) = script.blocking_holder("backup")? {
        println!("backup is held by pid {:?}", owner.pid());
    }
    println!(
        "catalog has {} readers",
        script.blocking_holders("catalog")?.len()
    );
    println!("reindex held: {}", script.blocking_is_held("reindex")?);
    for lock in script.blocking_list()? {
        println!(
            "{:<10} {:?}, {} holder(s), stale: {:?}",
            lock.name(),
            lock.kind(),
            lock.holders().len(),
            lock.stale_reason()
        );
    }
    let found = script.blocking_inspect("reindex")?.expect("the crashed lock");
    println!("reindex: {:?}", found.stale_reason());
    for removed in script.blocking_clean(false)? {
        println!("cleaned {}", removed.path().display());
    }
    assert!(!crashed.exists());
    assert!(script.blocking_is_held("backup")?);
    Ok(())
}
