//! Letting go: unlocking a key (or resetting the session when that fails),
//! releasing a lock and deleting its holder row.

use super::connection::{Held, Session};
use crate::error::Result;

/// How many times an unlock is tried before the session is reset instead.
const UNLOCK_TRIES: usize = 3;

/// The name of the SQL-level prepared statement [`FREE_SQL`] (one
/// simple query carries its `EXECUTE` with the rest of a release).
const FREE: &str = "leasehold_free";

/// Marks the exclusive row of the name `$1` let go, if this session's.
const FREE_SQL: &str = "UPDATE leasehold_locks SET free_at = clock_timestamp()
     WHERE name = $1::text AND backend_pid = pg_backend_pid() AND free_at IS NULL";

/// A server lock mode, for letting go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lock {
    Exclusive,
    Shared,
}

impl Session {
    /// After an error that may have come after the server granted a shared
    /// lock on `key`: lets it go, unless this session holds `key` shared
    /// for holders of its own too. The server keeps one count per session,
    /// so theirs could be let go instead: the session is reset.
    pub(super) fn unsure(&mut self, key: i64) {
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
    pub(super) fn release_hold(&mut self, key: i64, held: Held) -> bool {
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
    /// The session thread's count ([`Local`](super::connection::Local))
    /// keeps its own holders apart on the server: at most one attempt or
    /// lock per exclusive key (the name's key, a permit slot, the intent
    /// key) is ever on the session, so an unlock never takes away a lock
    /// that someone else is counting on; shared holds of the name's key
    /// are counted by the server.
    pub(super) fn let_go(&mut self, key: i64, lock: Lock, held: bool) -> bool {
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

    pub(super) fn unlock(
        &mut self,
        name: &str,
        key: i64,
        held: Held,
        id: &str,
        generation: u64,
    ) -> Result<bool> {
        if generation != self.generation || self.client.is_none() {
            return Ok(false);
        }
        if let Some(released) = self.release_in_one(name, key, held, id) {
            return Ok(released);
        }
        // Something in it failed before it unlocked (a table locked past
        // the session's `stall`, say: the row stays, as `free_row` and
        // `delete_row` say): the unlock, and the notification, alone.
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

    /// A release in one round trip: the row marked let go (or deleted),
    /// under a `statement_timeout` of the session's `stall`, then waiters
    /// notified and the keys unlocked, as one simple query. `None` when
    /// it failed before the unlock (the server skips what follows a failed
    /// statement): the caller then unlocks by itself. Whether the lock was
    /// this session's to the end.
    ///
    /// The row waits for its table at most the session's `stall`. An
    /// exclusive holder's row left unmarked costs the next holder a
    /// lease's wait (see `tables::STAMP`), never an overlap; a shared or
    /// permit holder's row left behind shows nobody once the session stops
    /// holding the name, and is cleaned up by the next session that starts
    /// (or by `clean()`), except that one naming a slot (a permit's, an
    /// upgradable holding's) costs the next holder of that slot a lease's
    /// wait, as an exclusive row does.
    fn release_in_one(&mut self, name: &str, key: i64, held: Held, id: &str) -> Option<bool> {
        let ms = self.stall.as_millis().max(1);
        let row = if held == Held::Exclusive {
            // Prepared once per connection: planned once.
            if let Err(error) = self.named(FREE, FREE_SQL) {
                tracing::debug!(lock = name, %error, "cannot prepare the release");
                return None;
            }
            format!("EXECUTE {FREE}({})", literal(name))
        } else {
            // Our own acquisition id: a UUID, safe to put in the statement.
            if !id.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
                return None;
            }
            format!("DELETE FROM leasehold_holders WHERE id = '{id}'")
        };
        let unlock = match held {
            Held::Exclusive => format!("pg_advisory_unlock({key})"),
            Held::Shared => format!("pg_advisory_unlock_shared({key})"),
            // The slot first, then the name's key, as `release_hold`.
            Held::Permit { slot, .. } => {
                format!("pg_advisory_unlock({slot}), pg_advisory_unlock_shared({key})")
            }
        };
        // The notification is sent when the unlock's (implicit)
        // transaction commits: after the unlock.
        let batch = format!(
            "BEGIN; SET LOCAL statement_timeout = {ms}; {row}; COMMIT;
             SELECT pg_notify('leasehold', {}), {unlock}",
            literal(name)
        );
        let client = self.live()?;
        let messages = match client.simple_query(&batch) {
            Ok(messages) => messages,
            Err(error) => {
                tracing::debug!(lock = name, %error, "cannot release in one statement");
                if client.is_closed() || client.batch_execute("ROLLBACK").is_err() {
                    self.drop_connection();
                }
                // The unlock is the last statement, never run after a
                // failure; `let_go` settles a failure of its own.
                return None;
            }
        };
        // Every unlock said the session held its key.
        let ours = messages.iter().any(|message| match message {
            postgres::SimpleQueryMessage::Row(row) => (1..row.len()).all(|i| row.get(i) == Some("t")),
            _ => false,
        });
        match held {
            Held::Exclusive => self.forget(key, |local| local.exclusive = false),
            Held::Shared => self.forget(key, |local| local.shared = local.shared.saturating_sub(1)),
            Held::Permit { slot, .. } => self.forget(key, |local| {
                local.slots.retain(|s| *s != slot);
                local.shared = local.shared.saturating_sub(1);
            }),
        }
        if !ours {
            // The server says the session did not hold it: the session's
            // count and the server's disagree, and only a new session
            // settles that (as `let_go` does).
            if self.live().is_some() {
                tracing::warn!(
                    key,
                    "the server says the session does not hold a lock it released; resetting the \
                     PostgreSQL session, which releases every lock on it"
                );
            }
            self.drop_connection();
        }
        Some(ours)
    }
}

/// `text` as an SQL string literal, whatever it holds: an escape string
/// (`E'...'`, read the same way whatever `standard_conforming_strings`
/// says) with its backslashes and quotes doubled. (A name never holds a
/// NUL, which no PostgreSQL text can.)
pub(super) fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 3);
    out.push_str("E'");
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("''"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}
