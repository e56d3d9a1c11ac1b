//! The session thread: the one connection a PostgreSQL `Locker` holds its
//! locks on, driven by a thread of its own, and [`PgLock`], a lock held on
//! it. (The listener that wakes waiters is in `postgres.rs`.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant, SystemTime};

use postgres::error::SqlState;
use postgres::{Client, NoTls};

use crate::backend::{BackendLock, Renewal, Tokens};
use crate::error::{Error, LossReason, Result};
use crate::name::LockName;
use crate::owner::Owner;
use crate::record::OwnRecord;
use crate::sys;

/// How many fencing tokens one reservation takes (as for the file
/// strategies, so handoffs do not write the counter each time).
pub(super) const TOKEN_BLOCK: i64 = 1024;

/// How long a caller waits for the session thread's answer to anything
/// but an attempt.
pub(super) const ANSWER_PATIENCE: Duration = Duration::from_secs(30);

/// How many times an unlock is tried before the session is reset instead.
const UNLOCK_TRIES: usize = 3;

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS leasehold_locks (
        name text PRIMARY KEY,
        key bigint NOT NULL,
        fencing_token bigint NOT NULL DEFAULT 0,
        holder_id text,
        hostname text,
        pid integer,
        acquired_at timestamptz,
        backend_pid integer,
        holder_token bigint
    );
    ALTER TABLE leasehold_locks ADD COLUMN IF NOT EXISTS holder_token bigint;";

const HELD: &str = "EXISTS (SELECT 1 FROM pg_locks k WHERE k.locktype = 'advisory' AND k.granted
        AND k.objsubid = 1 AND k.classid::bigint = ((l.key >> 32) & 4294967295)
        AND k.objid::bigint = (l.key & 4294967295))";

fn pg_error(op: &'static str) -> impl FnOnce(postgres::Error) -> Error {
    move |source| Error::Backend {
        op,
        source: Box::new(source),
    }
}

/// What the session thread is asked to do.
pub(super) enum Command {
    TryLock {
        name: LockName,
        key: i64,
        owner: Box<OwnRecord>,
        /// When the attempt must be over: the caller stops waiting for the
        /// answer shortly after.
        until: Instant,
        /// For the [`PgLock`] that the answer carries.
        line: Line,
        reply: Sender<Result<Option<(PgLock, Tokens)>>>,
    },
    Unlock {
        name: String,
        key: i64,
        generation: u64,
        reply: Option<Sender<Result<bool>>>,
    },
    Heartbeat {
        key: i64,
        generation: u64,
        reply: Sender<Result<bool>>,
    },
    Reserve {
        name: String,
        key: i64,
        generation: u64,
        reply: Sender<Result<Option<Tokens>>>,
    },
    Inspect {
        name: Option<String>,
        reply: Sender<Result<Vec<(String, Owner)>>>,
    },
}

/// The way to the session thread. The thread runs until every `Line` is
/// gone (the store's and every lock's); closing the connection then drops
/// whatever is left on the server.
#[derive(Debug, Clone)]
pub(crate) struct Line(pub(super) Sender<Command>);

/// The session thread is gone (it could not start a thread, or stopped).
pub(super) fn session_stopped() -> Error {
    Error::Backend {
        op: "reach the PostgreSQL session thread",
        source: "the session thread has stopped".into(),
    }
}

/// The session thread did not answer within [`ANSWER_PATIENCE`].
pub(super) fn no_answer(op: &'static str) -> Error {
    Error::Backend {
        op,
        source: Box::new(std::io::Error::from(std::io::ErrorKind::TimedOut)),
    }
}

impl Line {
    pub(super) fn send(&self, command: Command) -> Result<()> {
        self.0.send(command).map_err(|_| session_stopped())
    }

    fn call<T>(&self, make: impl FnOnce(Sender<Result<T>>) -> Command) -> Result<T> {
        let (reply, answer) = mpsc::channel();
        self.send(make(reply))?;
        answer
            .recv_timeout(ANSWER_PATIENCE)
            .map_err(|_| no_answer("wait for the PostgreSQL session"))?
    }

    /// The holders known to the table; only those whose advisory lock is
    /// held right now.
    pub(super) fn inspect(&self, name: Option<&str>) -> Result<Vec<(String, Owner)>> {
        self.call(|reply| Command::Inspect {
            name: name.map(str::to_owned),
            reply,
        })
    }
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Command")
    }
}

/// A lock held on the server by this `Locker`'s session.
#[derive(Debug)]
pub(crate) struct PgLock {
    line: Line,
    name: LockName,
    key: i64,
    /// The session the lock was taken on; any later one does not hold it.
    generation: u64,
    record: OwnRecord,
    armed: bool,
}

impl PgLock {
    fn heartbeat(&self) -> Result<bool> {
        let (key, generation) = (self.key, self.generation);
        self.line.call(|reply| Command::Heartbeat {
            key,
            generation,
            reply,
        })
    }
}

impl BackendLock for PgLock {
    fn record(&self) -> &OwnRecord {
        &self.record
    }

    /// The heartbeat: the session is alive and still holds the lock.
    fn renew(&mut self, cutoff: u64) -> Result<Renewal> {
        if !self.heartbeat()? {
            return Ok(Renewal::Lost(LossReason::SessionLost));
        }
        let boot = sys::boot_clock_ms();
        if boot >= cutoff {
            return Ok(Renewal::Lost(LossReason::LeaseExpired));
        }
        self.record.renew(SystemTime::now(), boot);
        Ok(Renewal::Renewed)
    }

    fn check(&self) -> Result<Option<LossReason>> {
        Ok((!self.heartbeat()?).then_some(LossReason::SessionLost))
    }

    fn reserve_tokens(&mut self) -> Result<Option<Tokens>> {
        let (key, generation, name) = (self.key, self.generation, self.name.as_str().to_owned());
        self.line.call(|reply| Command::Reserve {
            name,
            key,
            generation,
            reply,
        })
    }

    /// Unlocks: with `confirm`, waits for the server's answer; without,
    /// queues the unlock (the session thread sends it at once), as `Drop`
    /// does.
    fn release(mut self, confirm: bool) -> Result<Option<LossReason>> {
        if !confirm {
            return Ok(None); // Drop queues it.
        }
        self.armed = false;
        let (key, generation, name) = (self.key, self.generation, self.name.as_str().to_owned());
        let released = self.line.call(|reply| Command::Unlock {
            name,
            key,
            generation,
            reply: Some(reply),
        })?;
        Ok((!released).then_some(LossReason::SessionLost))
    }
}

impl Drop for PgLock {
    /// Queues the unlock on the session without waiting for it: the
    /// session thread sends it at once.
    fn drop(&mut self) {
        if std::mem::take(&mut self.armed) {
            let command = Command::Unlock {
                name: self.name.as_str().to_owned(),
                key: self.key,
                generation: self.generation,
                reply: None,
            };
            if let Err(error) = self.line.send(command) {
                tracing::warn!(lock = self.name.as_str(), %error, "cannot queue an unlock");
            }
        }
    }
}

/// The connection, owned by the session thread.
pub(super) struct Session {
    url: String,
    client: Option<Client>,
    backend_pid: i32,
    /// Counts connections: locks are tied to the one they were taken on.
    generation: u64,
}

static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

impl Session {
    /// A session on `url`, not connected yet.
    pub(super) fn new(url: &str) -> Self {
        Session {
            url: url.to_owned(),
            client: None,
            backend_pid: 0,
            generation: 0,
        }
    }

    pub(super) fn run(mut self, commands: &Receiver<Command>) {
        // Until the Locker and every lock are gone; closing the connection
        // then releases anything left on the server.
        while let Ok(command) = commands.recv() {
            self.handle(command);
        }
    }

    /// The live connection, reconnecting if the last one died. A new
    /// connection is a new generation: no lock of the old one survives.
    pub(super) fn client(&mut self) -> Result<&mut Client> {
        if self.client.as_ref().is_some_and(Client::is_closed) {
            self.drop_connection();
        }
        if self.client.is_none() {
            let mut client = Client::connect(&self.url, NoTls).map_err(pg_error("connect to PostgreSQL"))?;
            client
                .batch_execute(SCHEMA)
                .map_err(pg_error("create the leasehold_locks table"))?;
            let row = client
                .query_one("SELECT pg_backend_pid()", &[])
                .map_err(pg_error("start a PostgreSQL session"))?;
            self.backend_pid = row.get(0);
            self.generation = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
            self.client = Some(client);
        }
        match self.client.as_mut() {
            Some(client) => Ok(client),
            None => Err(Error::Backend {
                op: "connect to PostgreSQL",
                source: "no connection".into(),
            }),
        }
    }

    fn drop_connection(&mut self) {
        self.client = None;
    }

    /// After an error, a connection that is closed is forgotten, so the
    /// next command reconnects (and the old locks count as lost).
    fn settle<T>(&mut self, result: Result<T>) -> Result<T> {
        if result.is_err() && self.client.as_ref().is_some_and(Client::is_closed) {
            self.drop_connection();
        }
        result
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::TryLock {
                name,
                key,
                owner,
                until,
                line,
                reply,
            } => {
                let result = self.try_lock(name.as_str(), key, &owner, until);
                let answer = self.settle(result).map(|taken| {
                    taken.map(|(generation, tokens)| {
                        let mut record = *owner;
                        // The first token of the block is this acquisition's.
                        record.fencing_token = Some(tokens.next);
                        let lock = PgLock {
                            line,
                            name,
                            key,
                            generation,
                            record,
                            armed: true,
                        };
                        (lock, tokens)
                    })
                });
                if let Err(mpsc::SendError(Ok(Some((mut lock, _))))) = reply.send(answer) {
                    // The caller gave up: the lock is nobody's. Let it go
                    // now rather than behind the commands queued meanwhile.
                    lock.armed = false;
                    tracing::debug!(
                        lock = lock.name.as_str(),
                        "the attempt's caller gave up; unlocking"
                    );
                    self.let_go(key, true);
                }
            }
            Command::Unlock {
                name,
                key,
                generation,
                reply,
            } => {
                let result = self.unlock(&name, key, generation);
                let result = self.settle(result);
                match reply {
                    Some(reply) => drop(reply.send(result)),
                    None => {
                        if let Err(error) = result {
                            tracing::warn!(lock = name, %error, "unlock failed");
                        }
                    }
                }
            }
            Command::Heartbeat {
                key,
                generation,
                reply,
            } => {
                let result = self.heartbeat(key, generation);
                let _ = reply.send(self.settle(result));
            }
            Command::Reserve {
                name,
                key,
                generation,
                reply,
            } => {
                let result = self.reserve(&name, key, generation);
                let _ = reply.send(self.settle(result));
            }
            Command::Inspect { name, reply } => {
                let result = self.inspect(name.as_deref());
                let _ = reply.send(self.settle(result));
            }
        }
    }

    /// One attempt, over by `until`: `None` when the lock is taken
    /// elsewhere, or could not be recorded in time (and is let go again).
    ///
    /// `pg_try_advisory_lock` takes no table lock and answers at once
    /// unless the server itself stalls; the owner record's `INSERT` can
    /// wait (behind `LOCK TABLE`, a schema change, a row lock), so it runs
    /// under a `statement_timeout` that ends at `until`.
    fn try_lock(
        &mut self,
        name: &str,
        key: i64,
        owner: &OwnRecord,
        until: Instant,
    ) -> Result<Option<(u64, Tokens)>> {
        // Queued behind slower commands until its caller gave up.
        if Instant::now() >= until {
            return Ok(None);
        }
        let taken = self
            .client()?
            .query_one("SELECT pg_try_advisory_lock($1)", &[&key]);
        let taken: bool = match taken {
            Ok(row) => row.get(0),
            Err(e) => {
                // It may have been granted before the error: no session
                // keeps a lock it does not know it has.
                self.let_go(key, false);
                return Err(pg_error("take an advisory lock")(e));
            }
        };
        if !taken {
            return Ok(None);
        }
        let left = until.saturating_duration_since(Instant::now());
        let recorded = if left.is_zero() {
            Ok(None)
        } else {
            self.record(name, key, owner, left)
        };
        match recorded {
            Ok(Some(last)) => Ok(Some((self.generation, tokens(last)))),
            // Not recorded, so not ours: let it go again.
            Ok(None) => {
                self.let_go(key, true);
                Ok(None)
            }
            Err(e) => {
                self.let_go(key, true);
                Err(e)
            }
        }
    }

    /// Records the owner and reserves the first block of tokens, under a
    /// `statement_timeout` of `left`; `None` when that ran out.
    fn record(&mut self, name: &str, key: i64, owner: &OwnRecord, left: Duration) -> Result<Option<i64>> {
        let pid = i32::try_from(owner.pid).unwrap_or(i32::MAX);
        let ms = left.as_millis().clamp(1, i32::MAX as u128);
        // Never a new connection: the advisory lock is on this one.
        let Some(client) = self.live() else {
            return Err(Error::Backend {
                op: "record the owner of an advisory lock",
                source: "the connection closed during the attempt".into(),
            });
        };
        client
            .batch_execute(&format!("SET statement_timeout = {ms}"))
            .map_err(pg_error("set a statement timeout"))?;
        let row = client.query_one(
            "INSERT INTO leasehold_locks AS l
                 (name, key, fencing_token, holder_id, hostname, pid, acquired_at, backend_pid, holder_token)
             VALUES ($1, $2, $3, $4, $5, $6, now(), pg_backend_pid(), 1)
             ON CONFLICT (name) DO UPDATE SET fencing_token = l.fencing_token + $3,
                 holder_id = $4, hostname = $5, pid = $6, acquired_at = now(), backend_pid = pg_backend_pid(),
                 holder_token = l.fencing_token + 1
             RETURNING fencing_token",
            &[&name, &key, &TOKEN_BLOCK, &owner.holder_id, &owner.hostname, &pid],
        );
        if let Err(error) = client.batch_execute("RESET statement_timeout") {
            // Every later statement would run under this attempt's
            // timeout, heartbeats included: start a fresh session.
            if !client.is_closed() {
                tracing::warn!(%error, "cannot reset the statement timeout; resetting the PostgreSQL session");
            }
            self.drop_connection();
            return Err(pg_error("reset the statement timeout")(error));
        }
        match row {
            Ok(row) => Ok(Some(row.get(0))),
            Err(e) if e.code() == Some(&SqlState::QUERY_CANCELED) => Ok(None),
            Err(e) => Err(pg_error("record the lock owner")(e)),
        }
    }

    /// The connection, if it is up.
    fn live(&mut self) -> Option<&mut Client> {
        self.client.as_mut().filter(|client| !client.is_closed())
    }

    /// Unlocks `key`, which this session holds if `held`, trying again
    /// after a failure; if it cannot, resets the session, which makes the
    /// server drop the lock (and every other lock of the session: their
    /// heartbeats then report them lost). Whether the lock was this
    /// session's to the end.
    ///
    /// At most one attempt or lock per key is ever on the session (the
    /// name's queue sees to that), so an unlock never takes away a lock
    /// that someone else is counting on.
    fn let_go(&mut self, key: i64, held: bool) -> bool {
        let mut failure = String::new();
        let mut ours = held;
        for _ in 0..UNLOCK_TRIES {
            // A closed connection has already dropped the lock.
            let Some(client) = self.live() else {
                self.drop_connection();
                return false;
            };
            match client.query_one("SELECT pg_advisory_unlock($1)", &[&key]) {
                Ok(row) if row.get::<_, bool>(0) => return true,
                Ok(_) if !held => return false,
                Ok(_) => {
                    ours = false;
                    failure = "the server says the session does not hold it".to_owned();
                }
                Err(error) => failure = error.to_string(),
            }
        }
        if self.live().is_some() {
            tracing::warn!(
                key,
                error = failure,
                "cannot release an advisory lock; resetting the PostgreSQL session, \
                 which releases every lock on it"
            );
        }
        self.drop_connection();
        ours
    }

    fn unlock(&mut self, name: &str, key: i64, generation: u64) -> Result<bool> {
        if generation != self.generation || self.client.is_none() {
            return Ok(false);
        }
        let released = self.let_go(key, true);
        if let Some(client) = self.live() {
            // Waiters elsewhere also poll: a lost notification only
            // delays them.
            if let Err(error) = client.query_one("SELECT pg_notify('leasehold', $1)", &[&name]) {
                tracing::debug!(lock = name, %error, "cannot notify waiters");
            }
        }
        Ok(released)
    }

    fn heartbeat(&mut self, key: i64, generation: u64) -> Result<bool> {
        if generation != self.generation || self.client.is_none() {
            return Ok(false);
        }
        let expected = self.backend_pid;
        let client = self.client()?;
        let row = client
            .query_one(
                "SELECT pg_backend_pid(), EXISTS (SELECT 1 FROM pg_locks k WHERE k.locktype = 'advisory'
                     AND k.granted AND k.pid = pg_backend_pid() AND k.objsubid = 1
                     AND k.classid::bigint = (($1::bigint >> 32) & 4294967295)
                     AND k.objid::bigint = ($1::bigint & 4294967295))",
                &[&key],
            )
            .map_err(pg_error("check the PostgreSQL session"))?;
        let pid: i32 = row.get(0);
        if pid != expected {
            tracing::warn!(
                expected,
                pid,
                "the PostgreSQL session changed under the connection (a pooler in transaction mode?); \
                 every lock on it is lost"
            );
            self.drop_connection();
            return Ok(false);
        }
        Ok(row.get(1))
    }

    fn reserve(&mut self, name: &str, key: i64, generation: u64) -> Result<Option<Tokens>> {
        if !self.heartbeat(key, generation)? {
            return Ok(None);
        }
        let client = self.client()?;
        let last: i64 = client
            .query_one(
                "UPDATE leasehold_locks SET fencing_token = fencing_token + $2 WHERE name = $1 RETURNING fencing_token",
                &[&name, &TOKEN_BLOCK],
            )
            .map_err(pg_error("reserve fencing tokens"))?
            .get(0);
        Ok(Some(tokens(last)))
    }

    fn inspect(&mut self, name: Option<&str>) -> Result<Vec<(String, Owner)>> {
        let client = self.client()?;
        let query = format!(
            "SELECT l.name, l.holder_id, l.hostname, l.pid, l.acquired_at, l.holder_token
             FROM leasehold_locks l WHERE {HELD} AND ($1::text IS NULL OR l.name = $1) ORDER BY l.name"
        );
        let rows = client
            .query(query.as_str(), &[&name])
            .map_err(pg_error("read lock owners"))?;
        Ok(rows
            .iter()
            .map(|row| {
                let name: String = row.get(0);
                let pid: Option<i32> = row.get(3);
                let token: Option<i64> = row.get(5);
                let owner = Owner::from_server(
                    &name,
                    row.get(1),
                    row.get(2),
                    pid.and_then(|p| u32::try_from(p).ok()),
                    row.get::<_, Option<SystemTime>>(4),
                    token.and_then(|t| u64::try_from(t).ok()),
                );
                (name, owner)
            })
            .collect())
    }
}

/// The block `last - TOKEN_BLOCK + 1 ..= last` just reserved.
pub(super) fn tokens(last: i64) -> Tokens {
    let last = u64::try_from(last).unwrap_or(0);
    Tokens {
        next: last.saturating_sub(TOKEN_BLOCK as u64) + 1,
        last,
    }
}
