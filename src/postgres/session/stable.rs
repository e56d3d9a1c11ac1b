//! A session that is one server session, and that ends in bounded time
//! when its client or server goes away.
//!
//! **Poolers.** Session advisory locks live in the server session (the
//! backend process) that took them. Behind a pooler in transaction or
//! statement mode (PgBouncer `pool_mode = transaction`), each transaction
//! (each statement, outside `BEGIN`) runs on whichever server session is
//! free: a lock taken by one statement stays on a server session that
//! other clients' statements then use, and excludes nothing. So every
//! connection a `Locker` holds locks on is probed once, before anything is
//! locked ([`probe`]): a second connection is opened beside it, and a
//! session-level setting and `pg_backend_pid()` are compared across four
//! statements. On a direct connection (or a pooler in session mode) the
//! two connections are two server sessions, each stable: the first sees
//! its own setting twice, the second does not see it, and the pids are
//! two and unchanging. A transaction pooler fails this whether or not it
//! happens to hand the same server session back: if it does (a client
//! alone, or a pool of one), the second connection lands on the first
//! one's session and sees its setting; if it does not, the first
//! connection's later statements land elsewhere and miss it. The heartbeat
//! checks `pg_backend_pid()` every time as well (`connection.rs`): a
//! change is the loss of every lock.
//!
//! **Failover.** A session whose peer went away must end, on both sides,
//! in a time derived from the lease ([`keepalive`]): the server's TCP
//! keepalives are set per session (`tcp_keepalives_*`, `tcp_user_timeout`,
//! [`tune`]), so the server ends the session of a client cut off from it,
//! freeing its locks, and so do the client's ([`tuned`]), so a session
//! thread blocked on a server cut off from it gets its connection closed
//! and connects anew; a connection attempt gives up as soon. (Unix
//! sockets have no keepalives, and a stopped peer's kernel still answers
//! TCP: a client or server that stops is stopped, not cut off, and what
//! it holds stays held until it runs again.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use postgres::{Client, Config, SimpleQueryMessage};

use crate::error::{Error, Result};

/// Keepalive probes sent, one every [`keepalive`], before a silent peer is
/// given up.
const PROBES: u32 = 3;

/// The client library's default idle time before the first keepalive
/// probe (two hours, as libpq's): a setting left at it was not chosen.
const LIBRARY_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// The idle time before the first TCP keepalive probe, and between
/// probes: a third of the lease, in whole seconds (TCP counts in seconds),
/// at least one. A peer silent for `4 × keepalive(lease)` (the idle time
/// and [`PROBES`] probes) is given up: 40 s for the default 30 s lease.
pub(in crate::postgres) fn keepalive(lease: Duration) -> Duration {
    Duration::from_secs(lease.as_millis().div_ceil(3000).max(1) as u64)
}

/// How long data sent may stay unacknowledged before the connection is
/// closed (`TCP_USER_TIMEOUT`): the same bound as the keepalives'.
fn user_timeout(lease: Duration) -> Duration {
    keepalive(lease) * (PROBES + 1)
}

/// `config` with the client's TCP keepalives and user timeout derived
/// from the lease, wherever the application left the library's defaults
/// (a setting it made is kept).
pub(in crate::postgres) fn tuned(mut config: Config, lease: Duration) -> Config {
    let every = keepalive(lease);
    if config.get_keepalives() && config.get_keepalives_idle() == LIBRARY_IDLE {
        config.keepalives_idle(every);
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(every);
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(PROBES);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(user_timeout(lease));
    }
    // A reconnection to a host that does not answer (a failover under
    // way, a cut network) gives up in the same time, rather than after
    // the system's SYN retries (two minutes on Linux), and tries again at
    // the next attempt.
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(user_timeout(lease));
    }
    config
}

/// Sets the server's side of the session's TCP keepalives from the lease,
/// so that the server ends the session of a client cut off from it (and
/// frees its locks) in bounded time. Settings this server does not have
/// (`tcp_user_timeout` before PostgreSQL 12) are skipped; on a Unix socket
/// they change nothing.
pub(super) fn tune(client: &mut Client, lease: Duration) -> Result<()> {
    let every = keepalive(lease).as_secs();
    let sql = format!(
        "SELECT set_config(s.name, v.value, false)
           FROM (VALUES ('tcp_keepalives_idle', '{every}'), ('tcp_keepalives_interval', '{every}'),
                        ('tcp_keepalives_count', '{PROBES}'), ('tcp_user_timeout', '{timeout}')) v(name, value)
           JOIN pg_settings s ON s.name = v.name",
        timeout = user_timeout(lease).as_millis()
    );
    client
        .batch_execute(&sql)
        .map_err(pg_error("set the PostgreSQL session's keepalives"))
}

static PROBES_MADE: AtomicU64 = AtomicU64::new(0);

/// Checks that `client` is one server session of its own, as session
/// advisory locks need (see the module documentation), with a second
/// connection made by `other` beside it; [`Error::UnstableSession`] if
/// not. Every statement is a simple query (no prepared statement, one
/// round trip), so that a transaction pooler runs each whole on one
/// server session and the probe itself fails for no other reason.
pub(super) fn probe(
    client: &mut Client,
    other: impl FnOnce() -> std::result::Result<Client, postgres::Error>,
) -> Result<()> {
    let mark = format!(
        "{}-{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
        PROBES_MADE.fetch_add(1, Ordering::Relaxed)
    );
    let (first, set) = read(
        client,
        &format!("SELECT pg_backend_pid()::text, set_config('leasehold.probe', '{mark}', false)"),
    )?;
    if set.as_deref() != Some(mark.as_str()) {
        return Err(unstable("a session setting did not take"));
    }
    let (second, seen) = {
        let mut other = other().map_err(pg_error("connect to PostgreSQL (a second connection)"))?;
        read(&mut other, SEE)?
    };
    if second == first || seen.as_deref() == Some(mark.as_str()) {
        return Err(unstable(
            "a second connection ran on the first one's server session",
        ));
    }
    // Twice: a pooler handing server sessions round in turn would put
    // the first connection back on its own after the second's, but not
    // twice in a row.
    for _ in 0..2 {
        let (again, kept) = read(client, SEE)?;
        if again != first {
            return Err(unstable("the server session changed between two statements"));
        }
        if kept.as_deref() != Some(mark.as_str()) {
            return Err(unstable("a session setting was gone at the next statement"));
        }
    }
    Ok(())
}

/// The server process and the probe's setting, as this statement sees them.
const SEE: &str = "SELECT pg_backend_pid()::text, current_setting('leasehold.probe', true)";

/// The two text columns of the one row `sql` returns.
fn read(client: &mut Client, sql: &str) -> Result<(Option<String>, Option<String>)> {
    let messages = client
        .simple_query(sql)
        .map_err(pg_error("check that the PostgreSQL session is stable"))?;
    let row = messages.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    });
    let Some(row) = row else {
        return Err(unstable("a statement returned no row"));
    };
    let column = |i| row.get(i).map(str::to_owned);
    Ok((column(0), column(1)))
}

fn pg_error(op: &'static str) -> impl FnOnce(postgres::Error) -> Error {
    move |source| Error::Backend {
        op,
        source: Box::new(source),
    }
}

fn unstable(found: &'static str) -> Error {
    Error::UnstableSession { found }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalives_follow_the_lease() {
        assert_eq!(keepalive(Duration::from_secs(30)), Duration::from_secs(10));
        assert_eq!(user_timeout(Duration::from_secs(30)), Duration::from_secs(40));
        assert_eq!(keepalive(Duration::from_millis(1500)), Duration::from_secs(1));
        assert_eq!(keepalive(Duration::from_millis(3001)), Duration::from_secs(2));
        let config = tuned("host=/tmp user=x".parse().unwrap(), Duration::from_secs(30));
        assert_eq!(config.get_keepalives_idle(), Duration::from_secs(10));
        assert_eq!(config.get_keepalives_interval(), Some(Duration::from_secs(10)));
        assert_eq!(config.get_keepalives_retries(), Some(PROBES));
        assert_eq!(config.get_tcp_user_timeout(), Some(&Duration::from_secs(40)));
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(40)));
        // What the application chose is kept.
        let config = tuned(
            "host=/tmp user=x keepalives_idle=600 tcp_user_timeout=5"
                .parse()
                .unwrap(),
            Duration::from_secs(30),
        );
        assert_eq!(config.get_keepalives_idle(), Duration::from_secs(600));
        assert_eq!(config.get_tcp_user_timeout(), Some(&Duration::from_secs(5)));
    }
}
