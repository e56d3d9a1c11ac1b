//! Exclusive locks: the name's key taken exclusively, and the owner
//! recorded in `leasehold_locks` with the first block of fencing tokens.

use std::time::{Duration, Instant};

use postgres::types::{ToSql, Type};

use super::connection::{BUSY, Held, Lit, Session, Try, column, inline, pg_error, wait_of};
use super::fence::{advance, block, clock};
use super::release::Lock;
use super::tables::{STAMP, wait_out};
use crate::backend::Tokens;
use crate::error::Result;
use crate::record::OwnRecord;

/// Whether a session holds the name's key `$1` shared (shared holders or
/// permit holders), as a shared request would be granted: asked of an
/// exclusive acquisition that found the key taken. The lock taken by the
/// probe is let go in the same statement (`CASE` evaluates in order).
const PROBE_SHARERS: &str = "SELECT CASE WHEN pg_try_advisory_lock_shared($1)
    THEN pg_advisory_unlock_shared($1) ELSE false END";

/// Records the owner of the name `$1` (key `$2`; `holder_id`, hostname,
/// pid, the owner fields `$6` and the lease `$7` in milliseconds: see
/// [`OwnerColumns::params`]) and reserves its first block of fencing
/// tokens (see `fence`): the block's first and last tokens. No row when
/// an earlier holder of the name (the row's exclusive holder, or a shared
/// or permit holder's row `h` for which `$others` holds, a condition
/// ending in `AND`) may still count itself a holder ([`wait_out!`]):
/// nothing is written then.
macro_rules! record {
    ($others:literal) => {
        concat!(
            "WITH ",
            clock!(),
            " INSERT INTO leasehold_locks AS l
         (name, key, fencing_token, holder_id, hostname, pid, acquired_at, backend_pid, holder_token, fields,
          lease_ms, free_at)
     SELECT $1::text, $2::bigint, n + 8193, $3::text, $4::text, $5::integer, now(), pg_backend_pid(), n + 8193,
         $6::text, $7::bigint, NULL
     FROM clock WHERE NOT EXISTS (SELECT 1 FROM leasehold_holders h WHERE h.name = $1 AND ",
            $others,
            wait_out!("h"),
            ")
     ON CONFLICT (name) DO UPDATE SET ",
            advance!(),
            ", holder_id = $3, hostname = $4, pid = $5, acquired_at = now(), backend_pid = pg_backend_pid(), fields = $6,
         lease_ms = $7, free_at = NULL
     WHERE NOT (",
            wait_out!("l"),
            ")
     RETURNING l.holder_token, l.fencing_token"
        )
    };
}

pub(super) use record;

/// [`record!`] for an exclusive acquisition: every holder row counts.
const RECORD: &str = record!("");

/// An owner's columns as the statements that record it take them,
/// saturated to their SQL types.
pub(super) struct OwnerColumns {
    pub(super) pid: i32,
    pub(super) fields: Option<String>,
    pub(super) lease: i64,
}

impl OwnerColumns {
    pub(super) fn of(owner: &OwnRecord) -> Self {
        OwnerColumns {
            pid: i32::try_from(owner.pid).unwrap_or(i32::MAX),
            fields: owner.fields.as_ref().map(|f| f.object()),
            lease: i64::try_from(owner.lease_ms).unwrap_or(i64::MAX),
        }
    }

    /// The parameters `$1` to `$7` of [`record!`] for the name `name`
    /// (key `key`) recorded as held by `owner`.
    pub(super) fn params<'a>(
        &'a self,
        name: &'a &str,
        key: &'a i64,
        owner: &'a OwnRecord,
    ) -> Vec<&'a (dyn ToSql + Sync)> {
        vec![
            name,
            key,
            &owner.holder_id,
            &owner.hostname,
            &self.pid,
            &self.fields,
            &self.lease,
        ]
    }
}

/// What recording an exclusive holder came to.
enum Recorded {
    Tokens(Tokens),
    /// The statement timeout ran out.
    TimedOut,
    /// An earlier holder may still count itself one for this long.
    Wait(Duration),
}

impl Session {
    /// An exclusive attempt.
    ///
    /// `pg_try_advisory_lock` takes no table lock and answers at once
    /// unless the server itself stalls; the owner record's `INSERT` can
    /// wait (behind `LOCK TABLE`, a schema change, a row lock), so it runs
    /// under a `statement_timeout` that ends at `until`.
    pub(super) fn try_exclusive(
        &mut self,
        name: &str,
        key: i64,
        owner: &OwnRecord,
        until: Instant,
    ) -> Result<Try> {
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
            .query_typed_one("SELECT pg_try_advisory_lock($1)", &[(&key, Type::INT8)]);
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
                .query_typed_one(PROBE_SHARERS, &[(&key, Type::INT8)]);
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
            Ok(Recorded::TimedOut)
        } else {
            self.record(name, key, owner, left)
        };
        match recorded {
            Ok(Recorded::Tokens(tokens)) => Ok(Try::Taken(Held::Exclusive, tokens)),
            // Not recorded, so not ours: let it go again.
            Ok(Recorded::TimedOut) => {
                self.release_hold(key, Held::Exclusive);
                Ok(BUSY)
            }
            Ok(Recorded::Wait(wait)) => {
                self.release_hold(key, Held::Exclusive);
                Ok(Try::Wait(wait))
            }
            Err(e) => {
                self.release_hold(key, Held::Exclusive);
                Err(e)
            }
        }
    }

    /// Records the owner and reserves the first block of tokens, under a
    /// `statement_timeout` of `left`; or, when an earlier holder may still
    /// count itself one, finds how long that may last.
    fn record(&mut self, name: &str, key: i64, owner: &OwnRecord, left: Duration) -> Result<Recorded> {
        let columns = OwnerColumns::of(owner);
        // One round trip: the parameters as literals, in one simple query
        // with its transaction (never a new connection: the advisory lock
        // is on this one).
        let statement = inline(
            RECORD,
            &[
                Lit::text(name),
                Lit::int(key),
                Lit::text(&owner.holder_id),
                Lit::text(&owner.hostname),
                Lit::int(columns.pid),
                Lit::opt_text(columns.fields.as_deref()),
                Lit::int(columns.lease),
            ],
        );
        let started = Instant::now();
        let recorded = self.transaction_in_one(None, left, "record the lock owner", &statement)?;
        let Some(mut rows) = recorded else {
            return Ok(Recorded::TimedOut);
        };
        if let Some(row) = rows.pop().unwrap_or_default().first() {
            let first: i64 = column(row, 0).unwrap_or(0);
            return Ok(Recorded::Tokens(block(first, column(row, 1).unwrap_or(first))));
        }
        // An earlier holder to wait out: nothing was written, and the key
        // is held all along, so the rows in the way are those it found.
        let wait = self.transaction(
            None,
            left.saturating_sub(started.elapsed()),
            "record the lock owner",
            |client| {
                client
                    .query_one(STAMP, &[&name, &None::<i64>, &true, &"exclusive", &None::<i64>])
                    .map(|row| wait_of(&row))
            },
        )?;
        Ok(wait.map_or(Recorded::TimedOut, Recorded::Wait))
    }
}
