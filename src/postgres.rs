//! The PostgreSQL backend (feature `postgres`).
//!
//! A lock is a session-level advisory lock, `pg_try_advisory_lock(key)`,
//! held on one connection that the `Locker` owns. The key is the first 8
//! bytes of SHA-256 of `"leasehold\0" + name`, read as a big-endian `i64`:
//! stable across processes and versions, and in effect a namespace of its
//! own, since an application's own advisory keys would have to hit one of
//! 2^64 values by accident. (It uses the one-`bigint` form, which
//! PostgreSQL keeps apart from the two-`integer` form.)
//!
//! The owner (`holder_id`, host, pid, acquisition time) and the per-name
//! fencing counter live in `leasehold_locks`, created on first use with
//! `CREATE TABLE IF NOT EXISTS` and written only while the advisory lock is
//! held, so tokens strictly increase per name, forever.
//!
//! The connection is driven by a thread of its own, so a lock is kept, and
//! released, whatever the caller's runtime does. The session *is* the
//! lease: if it dies (server restart, `pg_terminate_backend`, network
//! loss), the server drops its locks, and every guard on it reports
//! `lost()` at its next heartbeat (one `renew_interval`). The backend then
//! reconnects for new acquisitions. A release sends `pg_notify` on channel
//! `leasehold`, which every backend `LISTEN`s to, to wake waiters on other
//! hosts; a poll remains as the safety net (and is what notices a holder's
//! session dying, which sends no notification).
//!
//! **Connection poolers.** Session locks need a session: behind a pooler in
//! transaction mode (PgBouncer `pool_mode = transaction`) each statement may
//! run on another server connection, so a lock taken by one statement is
//! not held by the next, and an unlock may hit the wrong session. Connect
//! directly, or through a pooler in session mode. The backend checks at
//! every heartbeat that its server process id has not changed, and treats
//! a change as the loss of every lock, with a warning.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant, SystemTime};

use postgres::error::SqlState;
use postgres::fallible_iterator::FallibleIterator;
use postgres::{Client, NoTls};
use sha2::{Digest, Sha256};

use crate::error::{Error, LossReason, Result};
use crate::name::LockName;
use crate::owner::Owner;
use crate::record::OwnRecord;
use crate::strategy::{Inspection, Renewal, Tokens};
use crate::sys;

/// How many fencing tokens one reservation takes (as for the file
/// strategies, so handoffs do not write the counter each time).
const TOKEN_BLOCK: i64 = 1024;

/// How long a caller waits for the session thread's answer to anything
/// but an attempt.
const ANSWER_PATIENCE: Duration = Duration::from_secs(30);

/// The least time an attempt is given, however close its deadline: a few
/// round trips, so that `acquire_timeout(Duration::ZERO)` still makes one.
const ATTEMPT_FLOOR: Duration = Duration::from_millis(100);

/// How long past an attempt's end its caller waits for the answer: the
/// server's report of the cancelled statement, and the unlock after it.
const ANSWER_GRACE: Duration = Duration::from_millis(250);

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

/// The advisory-lock key of a lock name.
pub(crate) fn key(name: &str) -> i64 {
    let mut hasher = Sha256::new();
    hasher.update(b"leasehold\0");
    hasher.update(name.as_bytes());
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

fn pg_error(op: &'static str) -> impl FnOnce(postgres::Error) -> Error {
    move |source| Error::Backend {
        op,
        source: Box::new(source),
    }
}

/// What the session thread is asked to do.
enum Command {
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
pub(crate) struct Line(Sender<Command>);

impl Line {
    fn send(&self, command: Command) -> Result<()> {
        self.0.send(command).map_err(|_| Error::Unsupported {
            what: "the PostgreSQL session thread has stopped",
        })
    }

    fn call<T>(&self, make: impl FnOnce(Sender<Result<T>>) -> Command) -> Result<T> {
        let (reply, answer) = mpsc::channel();
        self.send(make(reply))?;
        answer.recv_timeout(ANSWER_PATIENCE).map_err(|_| {
            Error::io(
                "wait for the PostgreSQL session",
                "",
                std::io::Error::from(std::io::ErrorKind::TimedOut),
            )
        })?
    }
}

/// A `Locker`'s connection to the server.
#[derive(Debug)]
pub(crate) struct PgStore {
    line: Line,
    listening: Arc<AtomicBool>,
    /// Tells the listener thread to stop.
    closed: Arc<AtomicBool>,
    holder_id: String,
    lease: Duration,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Release);
    }
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Command")
    }
}

impl PgStore {
    /// Connects (reporting a bad URL or an unreachable server at once) and
    /// starts the session thread. `on_notify` receives the names of locks
    /// released by other sessions.
    pub(crate) fn connect(
        url: &str,
        holder_id: String,
        lease: Duration,
        on_notify: Box<dyn Fn(&str) + Send>,
    ) -> Result<Arc<Self>> {
        let listening = Arc::new(AtomicBool::new(false));
        let closed = Arc::new(AtomicBool::new(false));
        let mut session = Session {
            url: url.to_owned(),
            client: None,
            backend_pid: 0,
            generation: 0,
        };
        let (commands, rx) = mpsc::channel();
        let (ready, connected) = mpsc::channel();
        // The client blocks on a runtime of its own, which cannot be done
        // from a thread that drives a Tokio runtime: connect there too.
        std::thread::Builder::new()
            .name("leasehold-postgres".into())
            .spawn(move || {
                let first = session.client().map(|_| ());
                let up = first.is_ok();
                let _ = ready.send(first);
                if up {
                    session.run(&rx);
                }
            })
            .map_err(|e| Error::io("start the PostgreSQL session thread", "", e))?;
        connected.recv_timeout(ANSWER_PATIENCE).map_err(|_| {
            Error::io(
                "connect to PostgreSQL",
                "",
                std::io::Error::from(std::io::ErrorKind::TimedOut),
            )
        })??;
        // Notifications get a connection and a thread of their own, so that
        // waiting for them never delays a command.
        let (url, flag, stop) = (url.to_owned(), Arc::clone(&listening), Arc::clone(&closed));
        std::thread::Builder::new()
            .name("leasehold-listen".into())
            .spawn(move || listen(&url, &*on_notify, &flag, &stop))
            .map_err(|e| Error::io("start the PostgreSQL listener thread", "", e))?;
        Ok(Arc::new(Self {
            line: Line(commands),
            listening,
            closed,
            holder_id,
            lease,
        }))
    }

    /// Whether releases elsewhere will wake our waiters (the session is up
    /// and listening).
    pub(crate) fn listening(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }

    /// One attempt; `None` when another session holds the lock, or when
    /// the server did not answer in time.
    ///
    /// The attempt is given until `deadline` (at least [`ATTEMPT_FLOOR`]),
    /// and at most a quarter of the lease, so that one stuck statement does
    /// not hold up the heartbeats queued behind it on the session; a waiter
    /// without a deadline simply tries again. Whatever the server answers
    /// after this call has returned is the session thread's to undo.
    pub(crate) fn try_lock(
        &self,
        name: &LockName,
        deadline: Option<Instant>,
    ) -> Result<Option<(PgLock, Tokens)>> {
        let now = Instant::now();
        let slice = self.lease / 4;
        let budget = match deadline {
            Some(deadline) => deadline
                .saturating_duration_since(now)
                .max(ATTEMPT_FLOOR)
                .min(slice),
            None => slice,
        };
        let (reply, answer) = mpsc::channel();
        self.line.send(Command::TryLock {
            name: name.clone(),
            key: key(name.as_str()),
            owner: Box::new(crate::strategy::own_record(&self.holder_id, self.lease, name)),
            until: now + budget,
            line: self.line.clone(),
            reply,
        })?;
        match answer.recv_timeout(budget + ANSWER_GRACE) {
            Ok(taken) => taken,
            // A lock granted from now on is dropped with `answer`, or by
            // the session thread when it finds `answer` gone: unlocked.
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err(Error::Unsupported {
                what: "the PostgreSQL session thread has stopped",
            }),
        }
    }

    /// The holders known to the table; only those whose advisory lock is
    /// held right now.
    pub(crate) fn inspect(&self, name: Option<&str>) -> Result<Vec<(LockName, Inspection)>> {
        let rows = self.line.call(|reply| Command::Inspect {
            name: name.map(str::to_owned),
            reply,
        })?;
        Ok(rows
            .into_iter()
            .map(|(name, owner)| (LockName::from_name(&name), Inspection { owner, stale: None }))
            .collect())
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
    pub(crate) fn record(&self) -> &OwnRecord {
        &self.record
    }

    fn heartbeat(&self) -> Result<bool> {
        let (key, generation) = (self.key, self.generation);
        self.line.call(|reply| Command::Heartbeat {
            key,
            generation,
            reply,
        })
    }

    /// The heartbeat: the session is alive and still holds the lock.
    pub(crate) fn renew(&mut self, cutoff: u64) -> Result<Renewal> {
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

    pub(crate) fn still_ours(&self) -> Result<bool> {
        self.heartbeat()
    }

    pub(crate) fn reserve_tokens(&mut self) -> Result<Option<Tokens>> {
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
    pub(crate) fn release(mut self, confirm: bool) -> Result<bool> {
        if !confirm {
            return Ok(true); // Drop queues it.
        }
        self.armed = false;
        let (key, generation, name) = (self.key, self.generation, self.name.as_str().to_owned());
        self.line.call(|reply| Command::Unlock {
            name,
            key,
            generation,
            reply: Some(reply),
        })
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

/// Receives the names of locks released anywhere (`pg_notify` on channel
/// `leasehold`) on a connection of its own, reconnecting as needed, until
/// the store is dropped.
fn listen(url: &str, on_notify: &dyn Fn(&str), listening: &AtomicBool, closed: &AtomicBool) {
    while !closed.load(Ordering::Acquire) {
        let mut client = match Client::connect(url, NoTls) {
            Ok(client) => client,
            Err(_) => {
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        if client.batch_execute("LISTEN leasehold").is_err() {
            continue;
        }
        listening.store(true, Ordering::Release);
        'connected: while !closed.load(Ordering::Acquire) {
            let mut notifications = client.notifications();
            let mut waiting = notifications.timeout_iter(Duration::from_millis(500));
            loop {
                match FallibleIterator::next(&mut waiting) {
                    Ok(Some(notification)) => on_notify(notification.payload()),
                    Ok(None) => break,
                    Err(_) => break 'connected,
                }
            }
        }
        listening.store(false, Ordering::Release);
    }
}

/// The connection, owned by the session thread.
struct Session {
    url: String,
    client: Option<Client>,
    backend_pid: i32,
    /// Counts connections: locks are tied to the one they were taken on.
    generation: u64,
}

static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

impl Session {
    fn run(mut self, commands: &Receiver<Command>) {
        // Until the Locker and every lock are gone; closing the connection
        // then releases anything left on the server.
        while let Ok(command) = commands.recv() {
            self.handle(command);
        }
    }

    /// The live connection, reconnecting if the last one died. A new
    /// connection is a new generation: no lock of the old one survives.
    fn client(&mut self) -> Result<&mut Client> {
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
            None => Err(Error::Unsupported {
                what: "no PostgreSQL connection",
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
            return Err(Error::Unsupported {
                what: "the PostgreSQL connection closed during an attempt",
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
fn tokens(last: i64) -> Tokens {
    let last = u64::try_from(last).unwrap_or(0);
    Tokens {
        next: last.saturating_sub(TOKEN_BLOCK as u64) + 1,
        last,
    }
}

#[cfg(test)]
#[path = "../tests/support/pg_server.rs"]
#[allow(unreachable_pub, missing_docs, missing_debug_implementations)]
mod pg_server;

#[cfg(test)]
mod tests {
    use super::*;

    /// The session thread owns the outcome of an attempt: a lock granted
    /// and recorded after its caller has gone is unlocked there.
    #[test]
    fn a_grant_whose_caller_is_gone_is_unlocked() {
        let server = pg_server::Server::start();
        let lease = Duration::from_secs(30);
        let store = PgStore::connect(&server.url(), "test".into(), lease, Box::new(|_| {})).unwrap();
        let name = LockName::from_name("gone");
        let (reply, answer) = mpsc::channel();
        drop(answer);
        store
            .line
            .send(Command::TryLock {
                owner: Box::new(crate::strategy::own_record("test", lease, &name)),
                name: name.clone(),
                key: key("gone"),
                until: Instant::now() + Duration::from_secs(10),
                line: store.line.clone(),
                reply,
            })
            .unwrap();
        // Commands run in order: once this answers, the attempt is over.
        assert!(store.inspect(None).unwrap().is_empty());
        let (recorded, locks): (i64, i64) = server.sql(|c| {
            let row = c
                .query_one(
                    "SELECT (SELECT fencing_token FROM leasehold_locks WHERE name = 'gone'),
                            (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory')",
                    &[],
                )
                .unwrap();
            (row.get(0), row.get(1))
        });
        assert_eq!(recorded, TOKEN_BLOCK, "the lock was granted and recorded");
        assert_eq!(locks, 0, "then let go");
    }

    #[test]
    fn keys_are_stable_and_distinct() {
        assert_eq!(key("reindex"), key("reindex"));
        assert_ne!(key("reindex"), key("reindex2"));
        // Pinned to literal values (the first 8 bytes, big-endian, of
        // SHA-256 of "leasehold\0" + name, computed independently):
        // changing the derivation would let two versions hold one name at
        // once.
        assert_eq!(key(""), 881_046_124_959_875_681);
        assert_eq!(key("reindex"), -4_731_462_604_616_021_856);
        assert_eq!(key("nightly-report"), 2_890_748_606_779_939_386);
        assert_eq!(key("ünïcode/name"), -1_729_549_082_967_962_973);
        let t = tokens(2048);
        assert_eq!((t.next, t.last), (1025, 2048));
    }
}
