//! The connection the session thread owns ([`Session`]): connecting and
//! reconnecting, checking that it still holds a lock, and what it holds
//! of each name ([`Local`], [`Held`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use postgres::error::SqlState;
use postgres::types::Type;
use postgres::{Client, SimpleQueryMessage, SimpleQueryRow};

use super::stable;
use super::tables::{SCHEMA, TIDY, TOO_LONG, UNSTORABLE};
use crate::backend::{Mode, Tokens};
use crate::error::{Error, Result};
use crate::postgres::Target;

pub(super) fn pg_error(op: &'static str) -> impl FnOnce(postgres::Error) -> Error {
    move |source| Error::Backend {
        op,
        source: Box::new(source),
    }
}

/// Why the server refused to store a name (too long for an index entry,
/// or a character its encoding lacks), if that is what `error` says.
pub(super) fn name_refused(error: &Error) -> Option<&'static str> {
    let Error::Backend { source, .. } = error else {
        return None;
    };
    let code = source.downcast_ref::<postgres::Error>()?.code()?;
    if *code == SqlState::PROGRAM_LIMIT_EXCEEDED {
        Some(TOO_LONG)
    } else if *code == SqlState::UNTRANSLATABLE_CHARACTER || *code == SqlState::CHARACTER_NOT_IN_REPERTOIRE {
        Some(UNSTORABLE)
    } else {
        None
    }
}

/// The owner table a server error says does not exist (`42P01`), and the
/// operation that found it gone. The relation's name is quoted in the
/// message whatever the server's language.
fn missing_table(error: &Error) -> Option<(&'static str, &'static str)> {
    let Error::Backend { op, source } = error else {
        return None;
    };
    let db = source.downcast_ref::<postgres::Error>()?.as_db_error()?;
    if *db.code() != SqlState::UNDEFINED_TABLE {
        return None;
    }
    ["leasehold_locks", "leasehold_holders"]
        .into_iter()
        .find(|table| db.message().contains(&format!("\"{table}\"")))
        .map(|table| (table, *op))
}

fn closed_during(op: &'static str) -> Error {
    Error::Backend {
        op,
        source: "the connection closed during the attempt".into(),
    }
}

/// `sql` with its parameters `$1`, `$2`, ... replaced by `params` (SQL
/// literals: see [`Lit`]), for a statement sent as a simple query.
pub(super) fn inline(sql: &str, params: &[Lit]) -> String {
    let mut out = String::with_capacity(sql.len() + 64 * params.len());
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..].bytes().take_while(u8::is_ascii_digit).count();
        let index = rest[at + 1..at + 1 + digits].parse::<usize>().ok();
        match index.and_then(|i| params.get(i.wrapping_sub(1))) {
            Some(param) => out.push_str(&param.0),
            None => out.push_str(&rest[at..at + 1 + digits]),
        }
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    out
}

/// A value as an SQL literal.
#[derive(Debug, Clone)]
pub(super) struct Lit(String);

impl Lit {
    pub(super) fn text(text: &str) -> Lit {
        Lit(super::release::literal(text))
    }

    pub(super) fn opt_text(text: Option<&str>) -> Lit {
        text.map_or(Lit("NULL".into()), Lit::text)
    }

    /// SQL text put in as it is: a literal or an expression made here.
    pub(super) fn raw(sql: &str) -> Lit {
        Lit(sql.to_owned())
    }

    pub(super) fn int(n: impl Into<i64>) -> Lit {
        Lit(n.into().to_string())
    }

    pub(super) fn opt_int(n: Option<i64>) -> Lit {
        n.map_or(Lit("NULL".into()), Lit::int)
    }
}

/// Column `i` of a row of a simple query, read as its text says.
pub(super) fn column<T: std::str::FromStr>(row: &SimpleQueryRow, i: usize) -> Option<T> {
    row.get(i).and_then(|text| text.parse().ok())
}

/// A `boolean` column of a simple query's row.
pub(super) fn flag(row: &SimpleQueryRow, i: usize) -> bool {
    row.get(i) == Some("t")
}

/// How a lock is held on the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::postgres) enum Held {
    /// The name's key, exclusively.
    Exclusive,
    /// The name's key, shared.
    Shared,
    /// The name's key shared, and the key of one permit slot exclusively.
    Permit { permits: u32, slot: i64 },
}

impl Held {
    pub(super) fn mode(self) -> Mode {
        match self {
            Held::Exclusive => Mode::Exclusive,
            Held::Shared => Mode::Shared,
            Held::Permit { permits, .. } => Mode::Permit(permits),
        }
    }
}

/// What the session holds of one name's keys. The server's advisory locks
/// are re-entrant per session (a session never conflicts with itself), so
/// the session thread keeps count to keep its own holders apart: an
/// exclusive attempt while this session holds the name shared, a second
/// holder of one permit slot, a reader behind this session's own waiting
/// writer.
#[derive(Debug, Default)]
pub(super) struct Local {
    pub(super) exclusive: bool,
    /// Shared holds of the name's key: shared holders and permit holders.
    pub(super) shared: u32,
    /// The permit slots held.
    pub(super) slots: Vec<i64>,
    /// An exclusive waiter of this session holds the intent key.
    pub(super) announced: bool,
}

impl Local {
    fn is_empty(&self) -> bool {
        !self.exclusive && self.shared == 0 && self.slots.is_empty() && !self.announced
    }
}

/// What the session thread found, before it becomes an
/// [`Answer`](super::lock::Answer).
pub(super) enum Try {
    Taken(Held, Tokens),
    Busy {
        sharers: bool,
    },
    /// Free on the server, but an earlier holder whose session ended may
    /// still count itself a holder for this long (see `tables::STAMP`).
    Wait(Duration),
}

/// How long [`STAMP`](super::tables::STAMP)'s row says to wait: at least a
/// millisecond, so that a waiter comes back after it rather than at once.
pub(super) fn wait_of(row: &postgres::Row) -> Duration {
    let ms = row.get::<_, Option<i64>>(0).unwrap_or(0);
    Duration::from_millis(u64::try_from(ms).unwrap_or(0).max(1))
}

pub(super) const BUSY: Try = Try::Busy { sharers: false };

/// The connection, owned by the session thread.
pub(in crate::postgres) struct Session {
    /// How to connect (TLS included).
    pub(super) target: Arc<Target>,
    /// The lease of the locks held on it (the keepalives follow it).
    pub(super) lease: Duration,
    pub(super) client: Option<Client>,
    pub(super) backend_pid: i32,
    /// Counts connections: locks are tied to the one they were taken on.
    pub(super) generation: u64,
    /// What this connection holds, by the name's key.
    pub(super) locals: HashMap<i64, Local>,
    /// A statement found an owner table missing (dropped under us): the
    /// next attempt creates the tables again.
    pub(super) tables_gone: bool,
    /// The most bytes a character outside ASCII may take in the database's
    /// encoding; `None` where names are stored as they are (UTF-8,
    /// `SQL_ASCII`).
    pub(super) widest: Option<usize>,
    /// The longest any statement but an attempt's may keep the session
    /// (and the heartbeats queued behind it) waiting for a table: an
    /// eighth of the lease (see [`Session::new`]).
    pub(super) stall: Duration,
    /// A session of its own for one upgradable holding (see `upgrade`):
    /// the key of the name's upgradable slot, which it takes before it
    /// joins the name's holders and keeps until it closes. Such a session
    /// is one connection, never made again: once it ends (released, or
    /// lost), its holding is over, and so is it.
    pub(super) dedicated: Option<i64>,
    /// The dedicated session holds its slot key.
    pub(super) slot_held: bool,
    /// The SQL-level prepared statements (`PREPARE`) made on this
    /// connection, by name (see [`Session::named`]).
    pub(super) named: Vec<&'static str>,
}

static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

impl Session {
    /// A session on `url`, not connected yet, for locks of `lease`.
    ///
    /// Every statement that waits for an owner table (inspection, a
    /// release's bookkeeping, an announcement, a new block of tokens) runs
    /// under a `statement_timeout` of an eighth of the lease, at least 10
    /// ms, so that a table locked by someone else (`LOCK TABLE`, a schema
    /// change) delays the heartbeats queued behind it by no more than
    /// that: a lease's renewal has a quarter lease at least to spare. What
    /// cannot wait is given up (a row left is cleaned up later; see each
    /// statement), or tried again later off the session thread
    /// (inspection).
    pub(in crate::postgres) fn new(target: Arc<Target>, lease: Duration) -> Self {
        Session {
            stall: (lease / 8).max(Duration::from_millis(10)),
            target,
            lease,
            client: None,
            backend_pid: 0,
            generation: 0,
            locals: HashMap::new(),
            tables_gone: false,
            widest: None,
            dedicated: None,
            slot_held: false,
            named: Vec::new(),
        }
    }

    /// A session of its own for one upgradable holding of the name whose
    /// upgradable slot is `slot` (see `upgrade`).
    pub(in crate::postgres) fn dedicated_to(target: Arc<Target>, lease: Duration, slot: i64) -> Self {
        Session {
            dedicated: Some(slot),
            ..Session::new(target, lease)
        }
    }

    /// The lease of the locks held on it.
    pub(in crate::postgres) fn lease(&self) -> Duration {
        self.lease
    }

    /// The live connection, reconnecting if the last one died. A new
    /// connection is a new generation: no lock of the old one survives.
    pub(in crate::postgres) fn client(&mut self) -> Result<&mut Client> {
        if self.client.as_ref().is_some_and(Client::is_closed) {
            self.drop_connection();
        }
        if self.ended_for_good() {
            return Err(Error::Backend {
                op: "reach the PostgreSQL session of an upgradable lock",
                source: "the session ended (an upgradable holding's session is never made again)".into(),
            });
        }
        if self.client.is_none() {
            let mut tries = 0;
            let (client, backend_pid, widest) = loop {
                match self.open() {
                    Ok(opened) => break opened,
                    // The server ended the new session while it was set
                    // up (`pg_terminate_backend`, a restart under way):
                    // nothing was held on it yet. Another, twice at most.
                    Err(error) if super::session_ended(&error) && tries < 2 => tries += 1,
                    Err(error) => return Err(error),
                }
            };
            self.backend_pid = backend_pid;
            self.widest = widest;
            self.generation = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
            self.named.clear();
            self.client = Some(client);
            self.tables_gone = false;
        }
        match self.client.as_mut() {
            Some(client) => Ok(client),
            None => Err(Error::Backend {
                op: "connect to PostgreSQL",
                source: "no connection".into(),
            }),
        }
    }

    /// An upgradable holding's own session, once the server ended it (or
    /// it was closed after a failure): it is never made again, and the
    /// holding went with it.
    pub(super) fn ended_for_good(&self) -> bool {
        self.dedicated.is_some() && self.generation != 0 && self.connection_gone()
    }

    /// A new connection, set up: its client, its backend's pid and the
    /// widest character of the server's encoding, unless that is UTF-8 or
    /// SQL_ASCII.
    fn open(&mut self) -> Result<(Client, i32, Option<usize>)> {
        let lease = self.lease;
        let connect = || self.target.connect_with(|config| stable::tuned(config, lease));
        let mut client = connect().map_err(pg_error("connect to PostgreSQL"))?;
        // Before anything else: behind a transaction pooler, even
        // the statements below could fail in confusing ways. (An
        // upgradable holding's session is on its Locker's settings,
        // whose session was probed.)
        if self.dedicated.is_none() {
            stable::probe(&mut client, connect)?;
        }
        stable::tune(&mut client, lease)?;
        client
            .batch_execute(SCHEMA)
            .map_err(pg_error("create the leasehold tables"))?;
        client
            .batch_execute(TIDY)
            .map_err(pg_error("remove the rows of dead shared holders"))?;
        let row = client
            .query_one(
                "SELECT pg_backend_pid(), current_setting('server_encoding') IN ('UTF8', 'SQL_ASCII'),
                     pg_encoding_max_length(pg_char_to_encoding(current_setting('server_encoding')))",
                &[],
            )
            .map_err(pg_error("start a PostgreSQL session"))?;
        let (as_is, widest): (bool, i32) = (row.get(1), row.get(2));
        Ok((
            client,
            row.get(0),
            (!as_is).then(|| usize::try_from(widest).unwrap_or(4)),
        ))
    }

    /// Creates the owner tables again if a statement found one missing
    /// (see [`Error::MissingTable`]). Their fencing counters then start
    /// from the server's clock (see `fence`), above every token handed out
    /// before. Never on the heartbeat's path: only before a statement that
    /// needs the tables.
    pub(super) fn tables(&mut self) -> Result<()> {
        if !self.tables_gone {
            return Ok(());
        }
        let client = self.client()?;
        client
            .batch_execute(SCHEMA)
            .map_err(pg_error("create the leasehold tables"))?;
        tracing::warn!("a leasehold table was dropped on the server; created it again");
        self.tables_gone = false;
        Ok(())
    }

    /// The connection an attempt started on, never a new one: the locks
    /// it took are on this one.
    pub(super) fn same(&mut self, op: &'static str) -> Result<&mut Client> {
        self.live().ok_or_else(|| closed_during(op))
    }

    /// Forgets the connection, and with it every lock it held.
    pub(super) fn drop_connection(&mut self) {
        self.named.clear();
        self.client = None;
        self.locals.clear();
        self.slot_held = false;
    }

    /// After an error, a connection that is closed is forgotten, so the
    /// next command reconnects (and the old locks count as lost).
    /// An error that says an owner table does not exist becomes
    /// [`Error::MissingTable`], and the next attempt creates the tables.
    pub(super) fn settle<T>(&mut self, result: Result<T>) -> Result<T> {
        if result.is_err() && self.client.as_ref().is_some_and(Client::is_closed) {
            self.drop_connection();
        }
        result.map_err(|error| match missing_table(&error) {
            Some((table, op)) => {
                self.tables_gone = true;
                Error::MissingTable { table, op }
            }
            None => error,
        })
    }

    pub(super) fn local(&mut self, key: i64) -> &mut Local {
        self.locals.entry(key).or_default()
    }

    /// Updates what the session holds of `key`, if it knows of it.
    pub(super) fn forget(&mut self, key: i64, update: impl FnOnce(&mut Local)) {
        if let Some(local) = self.locals.get_mut(&key) {
            update(local);
            if local.is_empty() {
                self.locals.remove(&key);
            }
        }
    }

    /// Makes the SQL-level prepared statement `name` of `sql` on this
    /// connection, once per connection, so that a simple query can
    /// `EXECUTE` it (with literal parameters) among other statements in
    /// one round trip, without its text being parsed and planned each
    /// time. Never on a new connection.
    pub(super) fn named(&mut self, name: &'static str, sql: &'static str) -> Result<()> {
        if self.named.contains(&name) {
            return Ok(());
        }
        self.same("prepare a statement")?
            .batch_execute(&format!("PREPARE {name} AS {sql}"))
            .map_err(pg_error("prepare a statement"))?;
        self.named.push(name);
        Ok(())
    }

    /// The connection, if it is up.
    pub(super) fn live(&mut self) -> Option<&mut Client> {
        self.client.as_mut().filter(|client| !client.is_closed())
    }

    /// Runs `op` in a transaction under a `statement_timeout` of `left`,
    /// first taking the transaction-level advisory lock `join` if given;
    /// `None` when the timeout ran out. Nothing of a failed `op` stays.
    pub(super) fn transaction<T>(
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
            // that holds nothing: it is never shown, is waited out by the
            // next taker if it records a lease, and is cleaned up.
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

    /// [`transaction`](Self::transaction) in one round trip: `sql` (an
    /// SQL statement whose parameters are SQL literals already, see
    /// [`inline`]; one or several, separated by `;`) sent with the
    /// `BEGIN`, the timeout, the `join` lock and the `COMMIT` as one simple
    /// query; the rows of each statement of `sql`, as text, or `None` when
    /// the timeout ran out. Nothing of a failed `sql` stays. (The
    /// extended protocol takes a round trip for each statement of a
    /// transaction, and the synchronous client cannot pipeline them.)
    pub(super) fn transaction_in_one(
        &mut self,
        join: Option<i64>,
        left: Duration,
        op: &'static str,
        sql: &str,
    ) -> Result<Option<Vec<Vec<SimpleQueryRow>>>> {
        let ms = left.as_millis().clamp(1, i32::MAX as u128);
        let mut batch = format!("BEGIN; SET LOCAL statement_timeout = {ms}; ");
        // Statements before `sql` (each ends with a CommandComplete).
        let mut before = 2;
        if let Some(join) = join {
            batch.push_str(&format!("SELECT pg_advisory_xact_lock({join}); "));
            before += 1;
        }
        batch.push_str(sql);
        batch.push_str("; COMMIT");
        let client = self.same(op)?;
        match client.simple_query(&batch) {
            Ok(messages) => {
                let mut done = 0;
                let mut rows: Vec<Vec<SimpleQueryRow>> = Vec::new();
                for message in messages {
                    match message {
                        SimpleQueryMessage::CommandComplete(_) => done += 1,
                        SimpleQueryMessage::Row(row) if done >= before => {
                            if rows.len() <= done - before {
                                rows.resize_with(done - before + 1, Vec::new);
                            }
                            rows[done - before].push(row);
                        }
                        _ => {}
                    }
                }
                // One entry a statement of `sql` (all but the `COMMIT`).
                rows.resize_with(done.saturating_sub(before + 1), Vec::new);
                Ok(Some(rows))
            }
            Err(error) => {
                // The server skipped what followed the failed statement,
                // the `COMMIT` included: nothing was committed, unless the
                // `COMMIT` itself failed (the connection broke), which
                // only a new session settles.
                if client.is_closed() || client.batch_execute("ROLLBACK").is_err() {
                    if !client.is_closed() {
                        tracing::warn!(%error, "cannot end a transaction; resetting the PostgreSQL session");
                    }
                    self.drop_connection();
                    return Err(pg_error(op)(error));
                }
                if error.code() == Some(&SqlState::QUERY_CANCELED) {
                    Ok(None)
                } else {
                    Err(pg_error(op)(error))
                }
            }
        }
    }

    pub(super) fn heartbeat(&mut self, key: i64, generation: u64) -> Result<bool> {
        if generation != self.generation || self.client.is_none() {
            return Ok(false);
        }
        let expected = self.backend_pid;
        // Never a new connection: the lock is on this one.
        let Some(client) = self.live() else {
            self.drop_connection();
            return Ok(false);
        };
        let row = client.query_typed_one(
            "SELECT pg_backend_pid(), EXISTS (SELECT 1 FROM pg_locks k WHERE k.locktype = 'advisory'
                     AND k.granted AND k.pid = pg_backend_pid() AND k.objsubid = 1
                     AND k.classid::bigint = (($1::bigint >> 32) & 4294967295)
                     AND k.objid::bigint = ($1::bigint & 4294967295))",
            &[(&key, Type::INT8)],
        );
        let row = match row {
            Ok(row) => row,
            // The server ended the session (or the connection broke): its
            // locks are gone with it.
            Err(_) if client.is_closed() => {
                self.drop_connection();
                return Ok(false);
            }
            Err(error) => return Err(pg_error("check the PostgreSQL session")(error)),
        };
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_inlined_as_literals() {
        let params: Vec<Lit> = (1..=11).map(|i| Lit::int(i * 100)).collect();
        assert_eq!(
            inline("SELECT $1::bigint, $10, $11, $2 = $1, '$x', $12", &params),
            "SELECT 100::bigint, 1000, 1100, 200 = 100, '$x', $12"
        );
        // A parameter's text is never read for parameters in turn.
        let tricky = [Lit::text("a$2'b\\c"), Lit::opt_text(None), Lit::opt_int(Some(-7))];
        assert_eq!(
            inline("SELECT $1, $2, $3", &tricky),
            "SELECT E'a$2''b\\\\c', NULL, -7"
        );
    }
}
