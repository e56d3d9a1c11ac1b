//! Fencing tokens: a resource that refuses writes from a holder that has
//! been overtaken.
//!
//! A lease lock cannot stop a holder that was paused (GC, SIGSTOP, a VM
//! migration) from waking up after its lease ran out and writing anyway.
//! With fencing on, every acquisition carries a token larger than all
//! earlier ones; the resource remembers the largest token it has seen and
//! refuses anything older.
//!
//! ```text
//! cargo run --example fencing
//! ```

use std::sync::Mutex;

use leasehold::{Locker, Result};

/// Stands for a database row, a file in object storage, a config key...
#[derive(Default)]
struct Storage {
    highest_token: Mutex<u64>,
    value: Mutex<String>,
}

impl Storage {
    fn write(&self, token: u64, value: &str) -> std::result::Result<(), String> {
        let mut highest = self.highest_token.lock().unwrap();
        if token < *highest {
            return Err(format!("refused: token {token} is older than {highest}"));
        }
        *highest = token;
        *self.value.lock().unwrap() = value.to_owned();
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let storage = Storage::default();
    let worker = || Locker::builder().directory(dir.path()).fencing(true).build();
    let (a, b) = (worker()?, worker()?);

    // Worker A takes the lock and writes.
    let guard_a = a.acquire("report").await?;
    let token_a = guard_a.fencing_token().expect("fencing is on");
    println!(
        "A holds the lock with token {token_a}: {:?}",
        storage.write(token_a, "A's report")
    );

    // A stalls; its lease runs out and B takes over (here: A lets go).
    drop(guard_a);
    let guard_b = b.acquire("report").await?;
    let token_b = guard_b.fencing_token().expect("fencing is on");
    println!(
        "B holds the lock with token {token_b}: {:?}",
        storage.write(token_b, "B's report")
    );

    // A wakes up and finishes the write it had started, with its old token.
    println!(
        "A, late, with token {token_a}: {:?}",
        storage.write(token_a, "A's stale report")
    );
    println!("stored: {:?}", storage.value.lock().unwrap());
    assert_eq!(*storage.value.lock().unwrap(), "B's report");
    Ok(())
}
