//! The session thread: the one connection a PostgreSQL `Locker` holds its
//! locks on, driven by a thread of its own, and [`PgLock`], a lock held on
//! it. (The listener that wakes waiters is in `postgres.rs`; the design of
//! shared locks and semaphores is described there.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant, SystemTime};

use postgres::error::SqlState;
use postgres::{Client, NoTls};

use super::{Keys, slot_key};
use crate::backend::{BackendLock, Mode, Renewal, Tokens};
use crate::error::{Error, LossReason, Result};
use crate::name::LockName;
use crate::owner::Owner;
use crate::record::OwnRecord;
use crate::renew::{Renewable, Step};
use crate::sys;

/// How many fencing tokens one reservation takes (as for the file
/// strategies, so handoffs do not write the counter each time).
pub(super) const TOKEN_BLOCK: i64 = 1024;

/// How long a caller waits for the session thread's answer to anything
/// but an attempt.
pub(super) const ANSWER_PATIENCE: Duration = Duration::from_secs(30);

/// How many times an unlock is tried before the session is reset instead.
const UNLOCK_TRIES: usize = 3;

/// How many permit slots one statement tries.
const SLOT_BATCH: u32 = 64;

/// How long a release waits to delete its holder row (behind a table
/// lock) before it leaves the row to be ignored and cleaned up later.
const ROW_PATIENCE_MS: u32 = 2_000;

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
    ALTER TABLE leasehold_locks ADD COLUMN IF NOT EXISTS holder_token bigint;
    CREATE TABLE IF NOT EXISTS leasehold_holders (
        id text PRIMARY KEY,
        name text NOT NULL,
        key bigint NOT NULL,
        mode text NOT NULL,
        permits bigint,
        slot bigint,
        holder_id text,
        hostname text,
        pid integer,
        acquired_at timestamptz,
        backend_pid integer NOT NULL,
        holder_token bigint
    );
    CREATE INDEX IF NOT EXISTS leasehold_holders_name ON leasehold_holders (name);";

/// `pg_locks` has a row for a granted advisory lock on `$key` (the
/// one-`bigint` form, `objsubid` 1) in this database.
macro_rules! granted {
    ($key:literal) => {
        concat!(
            "k.locktype = 'advisory' AND k.granted AND k.objsubid = 1
             AND k.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
             AND k.classid::bigint = ((",
            $key,
            " >> 32) & 4294967295) AND k.objid::bigint = (",
            $key,
            " & 4294967295)"
        )
    };
}

/// An exclusive holder's row (`l`) in `leasehold_locks` names a holder
/// that holds the lock: its session holds the name's key exclusively.
macro_rules! held {
    () => {
        concat!(
            "EXISTS (SELECT 1 FROM pg_locks k WHERE ",
            granted!("l.key"),
            " AND k.mode = 'ExclusiveLock' AND k.pid = l.backend_pid)"
        )
    };
}

/// A shared holder's or permit holder's row (`h`) in `leasehold_holders`
/// names a holder that holds the lock: its session holds the name's key
/// shared.
macro_rules! live {
    () => {
        concat!(
            "EXISTS (SELECT 1 FROM pg_locks k WHERE ",
            granted!("h.key"),
            " AND k.mode = 'ShareLock' AND k.pid = h.backend_pid)"
        )
    };
}

/// Rows of `leasehold_holders` whose holder holds nothing any more (it
/// died without deleting its row), and rows a dead session with our
/// process id left (the pid was reused: they would look live to us).
const TIDY: &str = concat!(
    "DELETE FROM leasehold_holders h WHERE h.backend_pid = pg_backend_pid() OR NOT ",
    live!()
);

/// Whether a session holds the name's key `$1` shared (shared holders or
/// permit holders), as a shared request would be granted: asked of an
/// exclusive acquisition that found the key taken. The lock taken by the
/// probe is let go in the same statement (`CASE` evaluates in order).
const PROBE_SHARERS: &str = "SELECT CASE WHEN pg_try_advisory_lock_shared($1)
    THEN pg_advisory_unlock_shared($1) ELSE false END";

/// A shared or permit acquisition: first probes the intent key `$2`
/// (taken exclusively by a waiting exclusive acquisition) with a shared
/// lock let go at once, then takes the name's key `$1` shared. `NULL`: an
/// exclusive acquisition waits; `false`: held exclusively; `true`: taken.
const JOIN_KEY: &str = "SELECT CASE
    WHEN NOT pg_try_advisory_lock_shared($2) THEN NULL
    WHEN NOT pg_advisory_unlock_shared($2) THEN NULL
    ELSE pg_try_advisory_lock_shared($1) END";

/// Takes the first free slot among the keys `$1`. `Limit` pulls one row at
/// a time from the scan and stops at the first that passes the filter, so
/// exactly one lock is taken when any is free.
const TAKE_SLOT: &str =
    "SELECT s.k FROM unnest($1::bigint[]) AS s(k) WHERE pg_try_advisory_lock(s.k) LIMIT 1";

/// A live holder of the name `$1` of another kind than `$2` (`'shared'`
/// or `'semaphore'`) with `$3` permits. `pg_locks` is read only for rows
/// of another kind (the cheap conditions go first).
macro_rules! other_kind {
    () => {
        concat!(
            "SELECT h.mode, h.permits FROM leasehold_holders h
             WHERE h.name = $1 AND NOT (h.mode = $2 AND h.permits IS NOT DISTINCT FROM $3::bigint) AND ",
            live!(),
            " LIMIT 1"
        )
    };
}

const OTHER_KIND: &str = other_kind!();

/// Records a shared holder (parameters: name, mode, permits, id, key,
/// slot, holder_id, hostname, pid) unless the name is held as another
/// kind; its token is the name's fencing counter as it stands. Answers
/// the other kind, or the token.
const JOIN_SHARED: &str = concat!(
    "WITH other AS (",
    other_kind!(),
    "), mine AS (
        INSERT INTO leasehold_holders
            (id, name, key, mode, permits, slot, holder_id, hostname, pid, acquired_at, backend_pid, holder_token)
        SELECT $4::text, $1::text, $5::bigint, $2::text, $3::bigint, $6::bigint, $7::text, $8::text,
            $9::integer, now(), pg_backend_pid(),
            COALESCE((SELECT l.fencing_token FROM leasehold_locks l WHERE l.name = $1), 0)
        WHERE NOT EXISTS (SELECT 1 FROM other)
        RETURNING holder_token)
    SELECT (SELECT mode FROM other), (SELECT permits FROM other), (SELECT holder_token FROM mine)"
);

/// Records a permit holder (parameters as [`JOIN_SHARED`], and the token
/// block `$10`) unless the name is held as another kind (a semaphore of
/// another count included), reserving a block of fencing tokens. Answers
/// the other kind, or the block's last token.
const JOIN_PERMIT: &str = concat!(
    "WITH other AS (",
    other_kind!(),
    "), counter AS (
        INSERT INTO leasehold_locks AS l (name, key, fencing_token)
        SELECT $1::text, $5::bigint, $10::bigint WHERE NOT EXISTS (SELECT 1 FROM other)
        ON CONFLICT (name) DO UPDATE SET fencing_token = l.fencing_token + $10
        RETURNING l.fencing_token
    ), mine AS (
        INSERT INTO leasehold_holders
            (id, name, key, mode, permits, slot, holder_id, hostname, pid, acquired_at, backend_pid, holder_token)
        SELECT $4::text, $1::text, $5::bigint, $2::text, $3::bigint, $6::bigint, $7::text, $8::text,
            $9::integer, now(), pg_backend_pid(),
            c.fencing_token - $10 + 1
        FROM counter c
        RETURNING holder_token)
    SELECT (SELECT mode FROM other), (SELECT permits FROM other), (SELECT holder_token + $10 - 1 FROM mine)"
);

/// Every live holder, exclusive ones from `leasehold_locks`, shared and
/// permit holders from `leasehold_holders`: by name, oldest first.
const INSPECT: &str = concat!(
    "SELECT name, mode, permits, holder_id, hostname, pid, acquired_at, holder_token FROM (
        SELECT l.name, 'exclusive'::text AS mode, NULL::bigint AS permits, l.holder_id, l.hostname,
            l.pid, l.acquired_at, l.holder_token, 0 AS rank
        FROM leasehold_locks l WHERE ($1::text IS NULL OR l.name = $1) AND ",
    held!(),
    " UNION ALL
        SELECT h.name, h.mode, h.permits, h.holder_id, h.hostname, h.pid, h.acquired_at, h.holder_token, 1
        FROM leasehold_holders h WHERE ($1::text IS NULL OR h.name = $1) AND ",
    live!(),
    ") x ORDER BY name, rank, acquired_at, holder_token"
);

fn pg_error(op: &'static str) -> impl FnOnce(postgres::Error) -> Error {
    move |source| Error::Backend {
        op,
        source: Box::new(source),
    }
}

fn closed_during(op: &'static str) -> Error {
    Error::Backend {
        op,
        source: "the connection closed during the attempt".into(),
    }
}

/// How a lock is held on the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    /// The name's key, exclusively.
    Exclusive,
    /// The name's key, shared.
    Shared,
    /// The name's key shared, and the key of one permit slot exclusively.
    Permit { permits: u32, slot: i64 },
}

impl Held {
    fn mode(self) -> Mode {
        match self {
            Held::Exclusive => Mode::Exclusive,
            Held::Shared => Mode::Shared,
            Held::Permit { permits, .. } => Mode::Permit(permits),
        }
    }
}

/// A kind of holding as `leasehold_holders` spells it.
fn kind_columns(mode: Mode) -> (&'static str, Option<i64>) {
    match mode {
        Mode::Permit(n) => ("semaphore", Some(i64::from(n))),
        other => (other.as_str(), None),
    }
}

/// The kind of holding a row says.
fn kind_of(mode: &str, permits: Option<i64>) -> Mode {
    match (mode, permits) {
        ("exclusive", _) => Mode::Exclusive,
        ("semaphore", Some(n)) => Mode::Permit(u32::try_from(n).unwrap_or(0)),
        _ => Mode::Shared,
    }
}

/// How a kind of holding reads in an [`Error::KindMismatch`].
fn describe(mode: Mode) -> String {
    match mode {
        Mode::Permit(n) => format!("a semaphore of {n} permits"),
        other => other.as_str().to_owned(),
    }
}

fn mismatch(name: &str, held: Mode, asked: Mode) -> Error {
    Error::KindMismatch {
        name: name.to_owned(),
        held: describe(held),
        asked: describe(asked),
    }
}

/// What the session holds of one name's keys. The server's advisory locks
/// are re-entrant per session (a session never conflicts with itself), so
/// the session thread keeps count to keep its own holders apart: an
/// exclusive attempt while this session holds the name shared, a second
/// holder of one permit slot, a reader behind this session's own waiting
/// writer.
#[derive(Debug, Default)]
struct Local {
    exclusive: bool,
    /// Shared holds of the name's key: shared holders and permit holders.
    shared: u32,
    /// The permit slots held.
    slots: Vec<i64>,
    /// An exclusive waiter of this session holds the intent key.
    announced: bool,
}

impl Local {
    fn is_empty(&self) -> bool {
        !self.exclusive && self.shared == 0 && self.slots.is_empty() && !self.announced
    }
}

/// A server lock mode, for letting go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lock {
    Exclusive,
    Shared,
}

/// What one attempt found.
#[derive(Debug)]
pub(super) enum Answer {
    /// Taken, with the first block of fencing tokens.
    Taken(Box<PgLock>, Tokens),
    /// Held elsewhere; `sharers` when held shared (or by permit holders).
    Busy { sharers: bool },
}

/// What the session thread found, before it becomes an [`Answer`].
enum Try {
    Taken(Held, Tokens),
    Busy { sharers: bool },
}

const BUSY: Try = Try::Busy { sharers: false };

/// One name as the owner tables have it: its kind and every live holder.
pub(super) type Found = (String, Mode, Vec<Owner>);

/// What the session thread is asked to do.
pub(super) enum Command {
    TryLock {
        name: LockName,
        keys: Keys,
        mode: Mode,
        owner: Box<OwnRecord>,
        /// When the attempt must be over: the caller stops waiting for the
        /// answer shortly after.
        until: Instant,
        /// For the [`PgLock`] that the answer carries.
        line: Line,
        reply: Sender<Result<Answer>>,
    },
    Unlock {
        name: String,
        key: i64,
        held: Held,
        /// The holder row's id (shared holders and permit holders).
        id: String,
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
        held: Held,
        generation: u64,
        reply: Sender<Result<Option<Tokens>>>,
    },
    Inspect {
        name: Option<String>,
        reply: Sender<Result<Vec<Found>>>,
    },
    /// An exclusive waiter announces itself (takes the intent key), or
    /// makes sure it still is announced after a reconnection.
    Announce {
        key: i64,
        intent: i64,
        reply: Sender<Result<bool>>,
    },
    /// The waiter is done waiting: lets the intent key go.
    Withdraw { name: String, key: i64, intent: i64 },
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

    /// Every live holder known to the tables, by name.
    pub(super) fn inspect(&self, name: Option<&str>) -> Result<Vec<Found>> {
        self.call(|reply| Command::Inspect {
            name: name.map(str::to_owned),
            reply,
        })
    }

    /// Announces an exclusive waiter for `name`; `None` when the intent
    /// key is taken (another waiter announced itself, or a reader probes
    /// it at this instant): the next attempt tries again.
    pub(super) fn announce(
        &self,
        name: &LockName,
        keys: Keys,
        every: Duration,
    ) -> Result<Option<Announcement>> {
        let (key, intent) = (keys.name, keys.intent);
        let announced = self.call(|reply| Command::Announce { key, intent, reply })?;
        Ok(announced.then(|| Announcement {
            line: self.clone(),
            name: name.as_str().to_owned(),
            key,
            intent,
            every,
        }))
    }
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Command")
    }
}

/// An exclusive waiter's announcement: the intent key of its name, held
/// exclusively on the session while it waits, so that new shared holders
/// and permit holders stay out. Renewing it takes the key again if the
/// session was reconnected meanwhile; dropping it lets the key go.
#[derive(Debug)]
pub(crate) struct Announcement {
    line: Line,
    name: String,
    key: i64,
    intent: i64,
    every: Duration,
}

impl Renewable for Announcement {
    fn renew_once(&self) -> Step {
        let (key, intent) = (self.key, self.intent);
        if let Err(error) = self.line.call(|reply| Command::Announce { key, intent, reply }) {
            tracing::debug!(lock = self.name, %error, "renewing an exclusive waiter's announcement failed");
        }
        Step::Again(self.every)
    }
}

impl Drop for Announcement {
    fn drop(&mut self) {
        let _ = self.line.send(Command::Withdraw {
            name: std::mem::take(&mut self.name),
            key: self.key,
            intent: self.intent,
        });
    }
}

/// A lock held on the server by this `Locker`'s session.
#[derive(Debug)]
pub(crate) struct PgLock {
    line: Line,
    name: LockName,
    key: i64,
    held: Held,
    /// The session the lock was taken on; any later one does not hold it.
    generation: u64,
    record: OwnRecord,
    armed: bool,
}

impl PgLock {
    /// The key whose lock is this holder's own: the permit slot's for a
    /// permit, the name's otherwise.
    fn own_key(&self) -> i64 {
        match self.held {
            Held::Permit { slot, .. } => slot,
            _ => self.key,
        }
    }

    fn heartbeat(&self) -> Result<bool> {
        let (key, generation) = (self.own_key(), self.generation);
        self.line.call(|reply| Command::Heartbeat {
            key,
            generation,
            reply,
        })
    }

    fn unlock(&self, reply: Option<Sender<Result<bool>>>) -> Command {
        Command::Unlock {
            name: self.name.as_str().to_owned(),
            key: self.key,
            held: self.held,
            id: self.record.uuid.clone(),
            generation: self.generation,
            reply,
        }
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
        let (key, held, generation, name) = (
            self.key,
            self.held,
            self.generation,
            self.name.as_str().to_owned(),
        );
        self.line.call(|reply| Command::Reserve {
            name,
            key,
            held,
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
        let released = self.line.call(|reply| self.unlock(Some(reply)))?;
        Ok((!released).then_some(LossReason::SessionLost))
    }
}

impl Drop for PgLock {
    /// Queues the unlock on the session without waiting for it: the
    /// session thread sends it at once.
    fn drop(&mut self) {
        if std::mem::take(&mut self.armed)
            && let Err(error) = self.line.send(self.unlock(None))
        {
            tracing::warn!(lock = self.name.as_str(), %error, "cannot queue an unlock");
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
    /// What this connection holds, by the name's key.
    locals: HashMap<i64, Local>,
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
            locals: HashMap::new(),
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
                .map_err(pg_error("create the leasehold tables"))?;
            client
                .batch_execute(TIDY)
                .map_err(pg_error("remove the rows of dead shared holders"))?;
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

    /// The connection an attempt started on, never a new one: the locks
    /// it took are on this one.
    fn same(&mut self, op: &'static str) -> Result<&mut Client> {
        self.live().ok_or_else(|| closed_during(op))
    }

    /// Forgets the connection, and with it every lock it held.
    fn drop_connection(&mut self) {
        self.client = None;
        self.locals.clear();
    }

    /// After an error, a connection that is closed is forgotten, so the
    /// next command reconnects (and the old locks count as lost).
    fn settle<T>(&mut self, result: Result<T>) -> Result<T> {
        if result.is_err() && self.client.as_ref().is_some_and(Client::is_closed) {
            self.drop_connection();
        }
        result
    }

    fn local(&mut self, key: i64) -> &mut Local {
        self.locals.entry(key).or_default()
    }

    /// Updates what the session holds of `key`, if it knows of it.
    fn forget(&mut self, key: i64, update: impl FnOnce(&mut Local)) {
        if let Some(local) = self.locals.get_mut(&key) {
            update(local);
            if local.is_empty() {
                self.locals.remove(&key);
            }
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::TryLock {
                name,
                keys,
                mode,
                owner,
                until,
                line,
                reply,
            } => {
                let result = self.try_lock(name.as_str(), keys, mode, &owner, until);
                let generation = self.generation;
                let answer = self.settle(result).map(|found| match found {
                    Try::Taken(held, tokens) => {
                        let mut record = *owner;
                        // The first token of the block is this acquisition's.
                        record.fencing_token = Some(tokens.next);
                        let lock = PgLock {
                            line,
                            name,
                            key: keys.name,
                            held,
                            generation,
                            record,
                            armed: true,
                        };
                        Answer::Taken(Box::new(lock), tokens)
                    }
                    Try::Busy { sharers } => Answer::Busy { sharers },
                });
                if let Err(mpsc::SendError(Ok(Answer::Taken(mut lock, _)))) = reply.send(answer) {
                    // The caller gave up: the lock is nobody's. Let it go
                    // now rather than behind the commands queued meanwhile.
                    lock.armed = false;
                    tracing::debug!(
                        lock = lock.name.as_str(),
                        "the attempt's caller gave up; unlocking"
                    );
                    let result = self.unlock(
                        lock.name.as_str(),
                        lock.key,
                        lock.held,
                        &lock.record.uuid,
                        lock.generation,
                    );
                    if let Err(error) = self.settle(result) {
                        tracing::warn!(lock = lock.name.as_str(), %error, "unlock failed");
                    }
                }
            }
            Command::Unlock {
                name,
                key,
                held,
                id,
                generation,
                reply,
            } => {
                let result = self.unlock(&name, key, held, &id, generation);
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
                held,
                generation,
                reply,
            } => {
                let result = self.reserve(&name, key, held, generation);
                let _ = reply.send(self.settle(result));
            }
            Command::Inspect { name, reply } => {
                let result = self.inspect(name.as_deref());
                let _ = reply.send(self.settle(result));
            }
            Command::Announce { key, intent, reply } => {
                let result = self.announce(key, intent);
                let _ = reply.send(self.settle(result));
            }
            Command::Withdraw { name, key, intent } => self.withdraw(&name, key, intent),
        }
    }

    /// One attempt, over by `until`: `Busy` when the lock is taken
    /// elsewhere, or could not be recorded in time (and is let go again).
    fn try_lock(
        &mut self,
        name: &str,
        keys: Keys,
        mode: Mode,
        owner: &OwnRecord,
        until: Instant,
    ) -> Result<Try> {
        // Queued behind slower commands until its caller gave up.
        if Instant::now() >= until {
            return Ok(BUSY);
        }
        match mode {
            Mode::Exclusive => self.try_exclusive(name, keys.name, owner, until),
            Mode::Shared | Mode::Permit(_) => self.try_join(name, keys, mode, owner, until),
        }
    }

    /// An exclusive attempt.
    ///
    /// `pg_try_advisory_lock` takes no table lock and answers at once
    /// unless the server itself stalls; the owner record's `INSERT` can
    /// wait (behind `LOCK TABLE`, a schema change, a row lock), so it runs
    /// under a `statement_timeout` that ends at `until`.
    fn try_exclusive(&mut self, name: &str, key: i64, owner: &OwnRecord, until: Instant) -> Result<Try> {
        if let Some(local) = self.locals.get(&key) {
            // Our own shared holders: the server would grant it to us.
            if local.exclusive || local.shared > 0 {
                return Ok(Try::Busy {
                    sharers: local.shared > 0,
                });
            }
        }
        let taken = self
            .client()?
            .query_one("SELECT pg_try_advisory_lock($1)", &[&key]);
        let taken: bool = match taken {
            Ok(row) => row.get(0),
            Err(e) => {
                // It may have been granted before the error: no session
                // keeps a lock it does not know it has.
                self.let_go(key, Lock::Exclusive, false);
                return Err(pg_error("take an advisory lock")(e));
            }
        };
        if !taken {
            // Held shared, if a shared request would be granted: then the
            // caller announces itself, so that no new sharers join.
            let probe = self
                .same("look for shared holders")?
                .query_one(PROBE_SHARERS, &[&key]);
            return match probe {
                Ok(row) => Ok(Try::Busy { sharers: row.get(0) }),
                Err(e) => {
                    self.unsure(key);
                    Err(pg_error("look for shared holders")(e))
                }
            };
        }
        self.local(key).exclusive = true;
        let left = until.saturating_duration_since(Instant::now());
        let recorded = if left.is_zero() {
            Ok(None)
        } else {
            self.record(name, key, owner, left)
        };
        match recorded {
            Ok(Some(last)) => Ok(Try::Taken(Held::Exclusive, tokens(last))),
            // Not recorded, so not ours: let it go again.
            Ok(None) => {
                self.release_hold(key, Held::Exclusive);
                Ok(BUSY)
            }
            Err(e) => {
                self.release_hold(key, Held::Exclusive);
                Err(e)
            }
        }
    }

    /// A shared or permit attempt: the name's key shared (unless an
    /// exclusive waiter announced itself), a permit slot, then the holder
    /// row, unless the name is held as another kind.
    fn try_join(
        &mut self,
        name: &str,
        keys: Keys,
        mode: Mode,
        owner: &OwnRecord,
        until: Instant,
    ) -> Result<Try> {
        let key = keys.name;
        if self
            .locals
            .get(&key)
            .is_some_and(|local| local.exclusive || local.announced)
        {
            return Ok(BUSY);
        }
        let joined = self.client()?.query_one(JOIN_KEY, &[&key, &keys.intent]);
        let joined: Option<bool> = match joined {
            Ok(row) => row.get(0),
            Err(e) => {
                // This session never holds the intent key shared otherwise.
                self.let_go(keys.intent, Lock::Shared, false);
                self.unsure(key);
                return Err(pg_error("take a shared advisory lock")(e));
            }
        };
        if joined != Some(true) {
            return Ok(BUSY);
        }
        self.local(key).shared += 1;
        let mut held = Held::Shared;
        if let Mode::Permit(permits) = mode {
            match self.take_slot(name, key, permits, until) {
                Ok(Some(slot)) => held = Held::Permit { permits, slot },
                Ok(None) => {
                    self.release_hold(key, Held::Shared);
                    // Full, or held as another kind: say which.
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(BUSY);
                    }
                    return match self.other_kind(name, mode, left)? {
                        Some(other) => Err(mismatch(name, other, mode)),
                        None => Ok(BUSY),
                    };
                }
                Err(e) => {
                    self.release_hold(key, Held::Shared);
                    return Err(e);
                }
            }
        }
        let left = until.saturating_duration_since(Instant::now());
        let joined = if left.is_zero() {
            Ok(None)
        } else {
            self.join(name, keys, held, owner, left)
        };
        match joined {
            Ok(Some(Ok(tokens))) => Ok(Try::Taken(held, tokens)),
            Ok(Some(Err(other))) => {
                self.release_hold(key, held);
                Err(mismatch(name, other, mode))
            }
            Ok(None) => {
                self.release_hold(key, held);
                Ok(BUSY)
            }
            Err(e) => {
                self.release_hold(key, held);
                Err(e)
            }
        }
    }

    /// Takes a free permit slot of `name` (the keys `slot_key(name, i)`,
    /// `i < permits`, a batch per statement), skipping this session's own;
    /// `None` if every one is taken.
    fn take_slot(&mut self, name: &str, key: i64, permits: u32, until: Instant) -> Result<Option<i64>> {
        let mine = self
            .locals
            .get(&key)
            .map(|local| local.slots.clone())
            .unwrap_or_default();
        let mut start = 0;
        while start < permits {
            if Instant::now() >= until {
                return Ok(None);
            }
            let end = start.saturating_add(SLOT_BATCH).min(permits);
            let batch: Vec<i64> = (start..end)
                .map(|i| slot_key(name, i))
                .filter(|slot| !mine.contains(slot))
                .collect();
            start = end;
            if batch.is_empty() {
                continue;
            }
            match self.same("take a permit slot")?.query_opt(TAKE_SLOT, &[&batch]) {
                Ok(Some(row)) => {
                    let slot: i64 = row.get(0);
                    self.local(key).slots.push(slot);
                    return Ok(Some(slot));
                }
                Ok(None) => {}
                Err(e) => {
                    // Any of them may have been granted; none was ours.
                    for slot in batch {
                        self.let_go(slot, Lock::Exclusive, false);
                    }
                    return Err(pg_error("take a permit slot")(e));
                }
            }
        }
        Ok(None)
    }

    /// Records a shared or permit holder, unless the name is held as
    /// another kind: its first block of tokens, or the other kind. `None`
    /// when `left` ran out.
    ///
    /// Recording runs under the name's join lock (a transaction-level
    /// advisory lock), so two holders of different kinds cannot both find
    /// the other absent: of two acquisitions of different kinds, the later
    /// one sees the earlier one's row.
    fn join(
        &mut self,
        name: &str,
        keys: Keys,
        held: Held,
        owner: &OwnRecord,
        left: Duration,
    ) -> Result<Option<std::result::Result<Tokens, Mode>>> {
        let (mode, permits) = kind_columns(held.mode());
        let slot = match held {
            Held::Permit { slot, .. } => Some(slot),
            _ => None,
        };
        let pid = i32::try_from(owner.pid).unwrap_or(i32::MAX);
        let (id, holder_id, hostname) = (&owner.uuid, &owner.holder_id, &owner.hostname);
        let key = keys.name;
        self.transaction(Some(keys.join), left, "record a shared holder", |client| {
            let row = match held {
                Held::Permit { .. } => client.query_one(
                    JOIN_PERMIT,
                    &[
                        &name,
                        &mode,
                        &permits,
                        id,
                        &key,
                        &slot,
                        holder_id,
                        hostname,
                        &pid,
                        &TOKEN_BLOCK,
                    ],
                )?,
                _ => client.query_one(
                    JOIN_SHARED,
                    &[&name, &mode, &permits, id, &key, &slot, holder_id, hostname, &pid],
                )?,
            };
            let other: Option<String> = row.get(0);
            if let Some(other) = other {
                return Ok(Err(kind_of(&other, row.get(1))));
            }
            let token: i64 = row.get::<_, Option<i64>>(2).unwrap_or(0);
            Ok(Ok(match held {
                Held::Permit { .. } => tokens(token),
                _ => {
                    // The counter as it stands: no less than any exclusive
                    // holder's token before us, less than any after us.
                    let now = u64::try_from(token).unwrap_or(0);
                    Tokens { next: now, last: now }
                }
            }))
        })
    }

    /// A live holder of `name` of another kind than `mode`, if any.
    fn other_kind(&mut self, name: &str, mode: Mode, left: Duration) -> Result<Option<Mode>> {
        let (mode, permits) = kind_columns(mode);
        let other = self.transaction(None, left, "look for holders of another kind", |client| {
            let row = client.query_opt(OTHER_KIND, &[&name, &mode, &permits])?;
            Ok(row.map(|row| kind_of(row.get(0), row.get(1))))
        })?;
        Ok(other.flatten())
    }

    /// Runs `op` in a transaction under a `statement_timeout` of `left`,
    /// first taking the transaction-level advisory lock `join` if given;
    /// `None` when the timeout ran out. Nothing of a failed `op` stays.
    fn transaction<T>(
        &mut self,
        join: Option<i64>,
        left: Duration,
        op: &'static str,
        body: impl FnOnce(&mut Client) -> std::result::Result<T, postgres::Error>,
    ) -> Result<Option<T>> {
        let ms = left.as_millis().clamp(1, i32::MAX as u128);
        let mut begin = format!("BEGIN; SET LOCAL statement_timeout = {ms}");
        if let Some(join) = join {
            begin.push_str(&format!("; SELECT pg_advisory_xact_lock({join})"));
        }
        let client = self.same(op)?;
        let result = client.batch_execute(&begin).and_then(|()| body(client));
        let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
        if let Err(error) = client.batch_execute(end) {
            // Whether it committed is unknown. A fresh session drops this
            // one's advisory locks, so a row that did commit names a holder
            // that holds nothing: it is never shown, and is cleaned up.
            if !client.is_closed() {
                tracing::warn!(%error, "cannot end a transaction; resetting the PostgreSQL session");
            }
            self.drop_connection();
            return Err(pg_error("end a transaction")(error));
        }
        match result {
            Ok(value) => Ok(Some(value)),
            Err(e) if e.code() == Some(&SqlState::QUERY_CANCELED) => Ok(None),
            Err(e) => Err(pg_error(op)(e)),
        }
    }

    /// Records the owner and reserves the first block of tokens, under a
    /// `statement_timeout` of `left`; `None` when that ran out.
    fn record(&mut self, name: &str, key: i64, owner: &OwnRecord, left: Duration) -> Result<Option<i64>> {
        let pid = i32::try_from(owner.pid).unwrap_or(i32::MAX);
        let ms = left.as_millis().clamp(1, i32::MAX as u128);
        // Never a new connection: the advisory lock is on this one.
        let client = self.same("record the owner of an advisory lock")?;
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

    /// After an error that may have come after the server granted a shared
    /// lock on `key`: lets it go, unless this session holds `key` shared
    /// for holders of its own too. The server keeps one count per session,
    /// so theirs could be let go instead: the session is reset.
    fn unsure(&mut self, key: i64) {
        if self.locals.get(&key).is_some_and(|local| local.shared > 0) {
            if self.live().is_some() {
                tracing::warn!(
                    key,
                    "a shared lock may have been granted on a failed statement; resetting the \
                     PostgreSQL session, which releases every lock on it"
                );
            }
            self.drop_connection();
        } else {
            self.let_go(key, Lock::Shared, false);
        }
    }

    /// Lets go of what `held` took on the name's `key` and forgets it;
    /// whether it was ours to the end.
    fn release_hold(&mut self, key: i64, held: Held) -> bool {
        match held {
            Held::Exclusive => {
                let ours = self.let_go(key, Lock::Exclusive, true);
                self.forget(key, |local| local.exclusive = false);
                ours
            }
            Held::Shared => {
                let ours = self.let_go(key, Lock::Shared, true);
                self.forget(key, |local| local.shared = local.shared.saturating_sub(1));
                ours
            }
            Held::Permit { slot, .. } => {
                let slot_ours = self.let_go(slot, Lock::Exclusive, true);
                self.forget(key, |local| local.slots.retain(|s| *s != slot));
                self.release_hold(key, Held::Shared) && slot_ours
            }
        }
    }

    /// Unlocks `key` (`lock` says how it is held), which this session holds
    /// if `held`, trying again after a failure; if it cannot, resets the
    /// session, which makes the server drop the lock (and every other lock
    /// of the session: their heartbeats then report them lost). Whether
    /// the lock was this session's to the end.
    ///
    /// The session thread's count ([`Local`]) keeps its own holders apart
    /// on the server: at most one attempt or lock per exclusive key (the
    /// name's key, a permit slot, the intent key) is ever on the session,
    /// so an unlock never takes away a lock that someone else is counting
    /// on; shared holds of the name's key are counted by the server.
    fn let_go(&mut self, key: i64, lock: Lock, held: bool) -> bool {
        let statement = match lock {
            Lock::Exclusive => "SELECT pg_advisory_unlock($1)",
            Lock::Shared => "SELECT pg_advisory_unlock_shared($1)",
        };
        let mut failure = String::new();
        let mut ours = held;
        for _ in 0..UNLOCK_TRIES {
            // A closed connection has already dropped the lock.
            let Some(client) = self.live() else {
                self.drop_connection();
                return false;
            };
            match client.query_one(statement, &[&key]) {
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

    fn unlock(&mut self, name: &str, key: i64, held: Held, id: &str, generation: u64) -> Result<bool> {
        if generation != self.generation || self.client.is_none() {
            return Ok(false);
        }
        if held != Held::Exclusive {
            self.delete_row(name, id);
        }
        let released = self.release_hold(key, held);
        if let Some(client) = self.live() {
            // Waiters elsewhere also poll: a lost notification only
            // delays them.
            if let Err(error) = client.query_one("SELECT pg_notify('leasehold', $1)", &[&name]) {
                tracing::debug!(lock = name, %error, "cannot notify waiters");
            }
        }
        Ok(released)
    }

    /// Deletes a shared or permit holder's row, waiting at most
    /// [`ROW_PATIENCE_MS`] for the table. A row left behind shows nobody
    /// once the session stops holding the name, and is cleaned up by the
    /// next session that starts.
    fn delete_row(&mut self, name: &str, id: &str) {
        // Our own acquisition id: a UUID, safe to put in the statement,
        // which then takes one round trip.
        if !id.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            tracing::warn!(lock = name, id, "not a holder id; its row stays");
            return;
        }
        let Some(client) = self.live() else { return };
        let deleted = client.batch_execute(&format!(
            "BEGIN; SET LOCAL statement_timeout = {ROW_PATIENCE_MS};
             DELETE FROM leasehold_holders WHERE id = '{id}'; COMMIT"
        ));
        if let Err(error) = deleted {
            tracing::debug!(lock = name, %error, "cannot delete a holder row");
            if client.batch_execute("ROLLBACK").is_err() {
                self.drop_connection();
            }
        }
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

    fn reserve(&mut self, name: &str, key: i64, held: Held, generation: u64) -> Result<Option<Tokens>> {
        let own = match held {
            Held::Permit { slot, .. } => slot,
            _ => key,
        };
        if !self.heartbeat(own, generation)? {
            return Ok(None);
        }
        let client = self.client()?;
        if held == Held::Shared {
            // A shared holder's tokens never advance the counter.
            let now: i64 = client
                .query_one(
                    "SELECT COALESCE((SELECT fencing_token FROM leasehold_locks WHERE name = $1), 0)",
                    &[&name],
                )
                .map_err(pg_error("read the fencing counter"))?
                .get(0);
            let now = u64::try_from(now).unwrap_or(0);
            return Ok(Some(Tokens { next: now, last: now }));
        }
        let last: i64 = client
            .query_one(
                "UPDATE leasehold_locks SET fencing_token = fencing_token + $2 WHERE name = $1 RETURNING fencing_token",
                &[&name, &TOKEN_BLOCK],
            )
            .map_err(pg_error("reserve fencing tokens"))?
            .get(0);
        Ok(Some(tokens(last)))
    }

    /// Takes the intent key of the name `key` for an exclusive waiter of
    /// this session, unless it already holds it; whether it does now.
    fn announce(&mut self, key: i64, intent: i64) -> Result<bool> {
        if self.locals.get(&key).is_some_and(|local| local.announced) {
            return Ok(true);
        }
        let taken = self
            .client()?
            .query_one("SELECT pg_try_advisory_lock($1)", &[&intent]);
        match taken {
            Ok(row) => {
                let taken: bool = row.get(0);
                if taken {
                    self.local(key).announced = true;
                }
                Ok(taken)
            }
            Err(e) => {
                self.let_go(intent, Lock::Exclusive, false);
                Err(pg_error("announce an exclusive waiter")(e))
            }
        }
    }

    /// Lets the intent key go, and tells the readers held back by it.
    fn withdraw(&mut self, name: &str, key: i64, intent: i64) {
        if !self.locals.get(&key).is_some_and(|local| local.announced) {
            return;
        }
        self.let_go(intent, Lock::Exclusive, true);
        self.forget(key, |local| local.announced = false);
        if let Some(client) = self.live()
            && let Err(error) = client.query_one("SELECT pg_notify('leasehold', $1)", &[&name])
        {
            tracing::debug!(lock = name, %error, "cannot notify waiters");
        }
    }

    fn inspect(&mut self, name: Option<&str>) -> Result<Vec<Found>> {
        let client = self.client()?;
        let rows = client
            .query(INSPECT, &[&name])
            .map_err(pg_error("read lock owners"))?;
        let mut found: Vec<Found> = Vec::new();
        for row in &rows {
            let name: String = row.get(0);
            let mode = kind_of(row.get(1), row.get(2));
            let pid: Option<i32> = row.get(5);
            let token: Option<i64> = row.get(7);
            let owner = Owner::from_server(
                &name,
                row.get(3),
                row.get(4),
                pid.and_then(|p| u32::try_from(p).ok()),
                row.get::<_, Option<SystemTime>>(6),
                token.and_then(|t| u64::try_from(t).ok()),
            );
            match found.last_mut() {
                Some((last, kind, holders)) if *last == name => {
                    // An exclusive holder is the only one that counts (a
                    // row of a holder that is just leaving may linger).
                    if *kind != Mode::Exclusive {
                        holders.push(owner);
                    }
                }
                _ => found.push((name, mode, vec![owner])),
            }
        }
        Ok(found)
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
