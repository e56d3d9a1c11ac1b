//! Fencing tokens on the server: the name's counter in `leasehold_locks`,
//! reserved a block at a time, counting the *server's* wall clock in
//! microseconds since the Unix epoch (the file strategies count their
//! host's, with the same rules: docs/format.md, *Fencing counters*).
//!
//! A block runs from `GREATEST(counter + 1, now)`, up to [`TOKEN_BLOCK`]
//! tokens, and never past `now + LEAD` (but for its first token, which
//! is never cut): `now` is `clock_timestamp()`, read once by the statement
//! that advances the counter. Where the row is missing (a new name,
//! `TRUNCATE`, the table dropped and made again), the block is the one
//! token `now + LEAD + 1`. So every token is at most `LEAD + 1` above the
//! clock its statement read, as long as two statements that advance one
//! name's counter read the clock at least a microsecond apart (they lock
//! and write the same row, one after the other: each takes longer than
//! that), and a lost counter resumes above every token handed out before
//! it was lost, as long as the server's clock has not gone back since. A
//! clock gone back while the row is there only means the tokens continue
//! from the counter.
//!
//! Every reservation is one statement of the form [`advance!`] makes, so
//! the three that advance a counter (an exclusive holder's record, a
//! permit holder's, a new block for a handoff) cannot drift apart.

use postgres::types::ToSql;

use super::connection::{Held, Session};
use crate::backend::Tokens;
use crate::error::{Error, Result};

/// How many fencing tokens one reservation takes at most (as for the file
/// strategies, so handoffs do not write the counter each time).
pub(in crate::postgres) const TOKEN_BLOCK: i64 = 1024;

/// How far (in microseconds) a token may run ahead of the server's clock:
/// eight blocks, as for the file strategies.
pub(in crate::postgres) const LEAD: i64 = 8 * TOKEN_BLOCK;

// The statements below spell them out.
const _: () = assert!(TOKEN_BLOCK == 1024 && LEAD == 8192);

/// The server's clock in microseconds since the Unix epoch, read once: a
/// CTE with a volatile function is evaluated once per statement.
macro_rules! clock {
    () => {
        "clock AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS n)"
    };
}

pub(super) use clock;

/// Advances the counter of the row `l` of `leasehold_locks` that an
/// `INSERT ... SELECT ... FROM clock` found there: `holder_token` gets the
/// block's first token, `fencing_token` its last. The `INSERT` itself (the
/// row is missing) must write `n + 8193` to both.
///
/// A counter of 0 is no counter (a row that a waiting writer's
/// announcement made, see `intent`): the block is then the one token a
/// missing row gets, `n + 8193`, above any token a shared holder was given
/// while the row was missing or 0.
macro_rules! advance {
    () => {
        "fencing_token = GREATEST(
             CASE WHEN l.fencing_token <= 0 THEN (SELECT n FROM clock) + 8193
                  ELSE GREATEST(l.fencing_token + 1, (SELECT n FROM clock)) END,
             LEAST(GREATEST(l.fencing_token + 1, (SELECT n FROM clock)) + 1023, (SELECT n FROM clock) + 8192)),
         holder_token = CASE WHEN l.fencing_token <= 0 THEN (SELECT n FROM clock) + 8193
                  ELSE GREATEST(l.fencing_token + 1, (SELECT n FROM clock)) END"
    };
}

pub(super) use advance;

/// A shared holder's token: the counter of the name `$1` as it stands, or,
/// where it is missing (or 0: no counter yet), the highest token anyone could have been handed
/// (`now + LEAD`: the next one is above it).
macro_rules! standing {
    () => {
        "COALESCE((SELECT NULLIF(l.fencing_token, 0) FROM leasehold_locks l WHERE l.name = $1),
             (SELECT n FROM clock) + 8192)"
    };
}

pub(super) use standing;

/// A new block for the holder of the name `$1` (key `$2`), whether or not
/// its row is there: its first and last tokens.
const RESERVE: &str = concat!(
    "WITH ",
    clock!(),
    " INSERT INTO leasehold_locks AS l (name, key, fencing_token, holder_token)
      SELECT $1::text, $2::bigint, n + 8193, n + 8193 FROM clock
      ON CONFLICT (name) DO UPDATE SET ",
    advance!(),
    " RETURNING l.holder_token, l.fencing_token"
);

/// A shared holder's token, as [`standing!`] says.
const STANDING: &str = concat!("WITH ", clock!(), " SELECT ", standing!());

impl Session {
    pub(super) fn reserve(
        &mut self,
        name: &str,
        key: i64,
        held: Held,
        generation: u64,
    ) -> Result<Option<Tokens>> {
        let own = match held {
            Held::Permit { slot, .. } => slot,
            _ => key,
        };
        if !self.heartbeat(own, generation)? {
            return Ok(None);
        }
        self.tables()?;
        // Waits for the table at most the session's `stall`: the holder's
        // own heartbeats, and every other lock's, queue behind it.
        let stall = self.stall;
        let shared = held == Held::Shared;
        let reserved = self.transaction(None, stall, "reserve fencing tokens", |client| {
            if shared {
                // A shared holder's tokens never advance the counter.
                let now: i64 = client.query_one(STANDING, &[&name])?.get(0);
                return Ok(block(now, now));
            }
            let params: [&(dyn ToSql + Sync); 2] = [&name, &key];
            let row = client.query_one(RESERVE, &params)?;
            Ok(block(row.get(0), row.get(1)))
        });
        let reserved = match reserved {
            // The server ended the session meanwhile: the lock went with it.
            Err(_) if self.connection_gone() => return Ok(None),
            reserved => reserved?,
        };
        match reserved {
            Some(tokens) => Ok(Some(tokens)),
            None => Err(Error::Backend {
                op: "reserve fencing tokens",
                source: format!(
                    "the owner table stayed locked for {stall:?} (a LOCK TABLE, a schema change?)"
                )
                .into(),
            }),
        }
    }
}

/// The block `first ..= last` a statement reserved.
pub(in crate::postgres) fn block(first: i64, last: i64) -> Tokens {
    let first = u64::try_from(first).unwrap_or(0);
    Tokens {
        next: first,
        last: u64::try_from(last).unwrap_or(0).max(first),
    }
}
