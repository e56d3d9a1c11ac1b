//! Helpers of the tests of PostgreSQL sessions' ends
//! (`tests/postgres_session_end.rs`, `tests/attack_pg_session_end.rs`,
//! and of `tests/postgres.rs` and `tests/upgradable_postgres.rs`):
//! Lockers with a short lease, the keys the backend derives, ending and
//! stopping a session's server process, and the check that a successor
//! enters only once the old holder counts itself lost.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use leasehold::{Locker, LockerBuilder};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sha2::{Digest, Sha256};

use crate::pg_server::Server;

/// A lease long enough that an old holder is surely still valid when a
/// successor could first try (heartbeats every half second).
pub const LEASE: Duration = Duration::from_millis(1500);

pub fn builder(server: &Server) -> LockerBuilder {
    Locker::builder()
        .postgres(server.url())
        .lease(LEASE)
        .renew_interval(Duration::from_millis(500))
        .poll_interval(Duration::from_millis(20))
}

/// Lockers with a shorter lease (900 ms, renewed every 150 ms, polling
/// every 50 ms), for tests that wait for no session's end
/// (`tests/postgres.rs`, `tests/upgradable_postgres.rs`).
pub fn quick_builder(server: &Server) -> LockerBuilder {
    quick_builder_at(&server.url())
}

/// [`quick_builder`] on the connection string `url` (a pooler's, say).
pub fn quick_builder_at(url: &str) -> LockerBuilder {
    Locker::builder()
        .postgres(url)
        .lease(Duration::from_millis(900))
        .renew_interval(Duration::from_millis(150))
        .poll_interval(Duration::from_millis(50))
}

/// A unique name per test, so tests sharing an external server do not meet.
pub fn unique(name: &str) -> String {
    format!("{name}-{}", uuid::Uuid::new_v4().simple())
}

pub fn digest_key(prefix: &[u8], name: &str) -> i64 {
    let mut hasher = Sha256::new();
    hasher.update(prefix);
    hasher.update(name.as_bytes());
    let digest = hasher.finalize();
    i64::from_be_bytes(digest[..8].try_into().unwrap())
}

/// The name's key (as `src/postgres.rs` derives it).
pub fn name_key(name: &str) -> i64 {
    digest_key(b"leasehold\0", name)
}

/// The intent key of `name` (as `src/postgres.rs` derives it).
pub fn intent_key(name: &str) -> i64 {
    digest_key(b"leasehold-intent\0", name)
}

/// Which holder row of a name [`backend_of`] looks at.
pub enum Holder {
    /// The exclusive holder's (`leasehold_locks`).
    Exclusive,
    /// The shared or permit holder's of the Locker with this `holder_id`.
    Locker(String),
    /// The shared or permit holder's with this acquisition `id`.
    Acquisition(String),
}

/// The server process of the session that holds `name`, by `holder`'s row.
pub fn backend_of(server: &Server, name: &str, holder: Holder) -> i32 {
    let name = name.to_owned();
    server.sql(move |c| {
        let row = match holder {
            Holder::Exclusive => c.query_one(
                "SELECT backend_pid FROM leasehold_locks WHERE name = $1",
                &[&name],
            ),
            Holder::Locker(id) => c.query_one(
                "SELECT backend_pid FROM leasehold_holders WHERE name = $1 AND holder_id = $2",
                &[&name, &id],
            ),
            Holder::Acquisition(id) => c.query_one(
                "SELECT backend_pid FROM leasehold_holders WHERE name = $1 AND id = $2",
                &[&name, &id],
            ),
        };
        row.unwrap().get(0)
    })
}

/// Ends the session of server process `backend`, and waits until it and
/// its locks are gone.
pub fn terminate(server: &Server, backend: i32) {
    let ended: bool = server.sql(move |c| {
        c.query_one("SELECT pg_terminate_backend($1)", &[&backend])
            .unwrap()
            .get(0)
    });
    assert!(ended, "the server ended session {backend}");
    // pg_terminate_backend only signals: wait until the process is gone
    // (and its locks with it).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let gone: bool = server.sql(move |c| {
            c.query_one(
                "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)
                    AND NOT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1)",
                &[&backend],
            )
            .unwrap()
            .get(0)
        });
        if gone {
            return;
        }
        assert!(Instant::now() < deadline, "session {backend} never ended");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A server process stopped (`SIGSTOP`), resumed when dropped, whatever
/// happens.
pub struct Stopped(i32);

impl Stopped {
    pub fn stop(pid: i32) -> Stopped {
        kill(Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0), Signal::SIGCONT);
    }
}

/// A whole server stopped (`SIGSTOP` to the postmaster, then to every
/// process it started), as a network cut looks to its clients: nothing
/// answers, nothing closes. Resumed (`SIGCONT`) when dropped, whatever
/// happens.
pub struct Frozen(Vec<i32>);

impl Frozen {
    pub fn server(postmaster: i32) -> Frozen {
        // The postmaster first, so that it starts no process meanwhile.
        let mut frozen = Frozen(vec![postmaster]);
        kill(Pid::from_raw(postmaster), Signal::SIGSTOP).unwrap();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<i32>().ok());
            if ppid == Some(postmaster) && kill(Pid::from_raw(pid), Signal::SIGSTOP).is_ok() {
                frozen.0.push(pid);
            }
        }
        frozen
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGCONT);
        }
    }
}

/// Tries `take` until it succeeds (for at most `within`), then asserts
/// that every `old` holder already counts itself lost.
pub async fn successor_enters_only_after<T, F, Fut>(
    what: &str,
    old: &[&dyn Fn() -> bool],
    since: Instant,
    within: Duration,
    mut take: F,
) -> (T, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    loop {
        if let Some(taken) = take().await {
            let after = since.elapsed();
            for (i, lost) in old.iter().enumerate() {
                assert!(
                    lost(),
                    "{what}: a successor entered {after:?} after the session ended while old holder {i} \
                     still counted itself a holder"
                );
            }
            return (taken, after);
        }
        assert!(since.elapsed() < within, "{what}: no successor within {within:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sessions holding the advisory lock `key` (a bigint key: its high half
/// in `classid`, its low half in `objid`).
pub fn holding(server: &Server, key: i64) -> i64 {
    let (high, low) = ((key >> 32) & 0xffff_ffff, key & 0xffff_ffff);
    server.sql(move |c| {
        c.query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
               AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = 1",
            &[&high, &low],
        )
        .unwrap()
        .get(0)
    })
}
