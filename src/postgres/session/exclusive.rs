//! Exclusive locks: the name's key taken exclusively, and the owner
//! recorded in `leasehold_locks` with the first block of fencing tokens.

use std::time::Instant;

use postgres::types::{ToSql, Type};

use super::connection::{BUSY, Held, Session, Try, column, flag, pg_error, wait_of};
use super::fence::{advance, block, clock};
use super::release::{Lock, literal};
use super::tables::{STAMP, wait_out};
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
        concat!("WITH ", clock!(), " ", record_insert!("", "", $others))
    };
}

/// The `INSERT` of [`record!`], reading the CTE `clock` (and the
/// relations `$from` adds to it), and writing only where `$gate` (a
/// condition ending in `AND`, or nothing) holds.
macro_rules! record_insert {
    ($from:literal, $gate:literal, $others:literal) => {
        concat!(
            "INSERT INTO leasehold_locks AS l
         (name, key, fencing_token, holder_id, hostname, pid, acquired_at, backend_pid, holder_token, fields,
          lease_ms, free_at)
     SELECT $1::text, $2::bigint, n + 8193, $3::text, $4::text, $5::integer, now(), pg_backend_pid(), n + 8193,
         $6::text, $7::bigint, NULL
     FROM clock",
            $from,
            " WHERE ",
            $gate,
            "NOT EXISTS (SELECT 1 FROM leasehold_holders h WHERE h.name = $1 AND ",
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

pub(super) use {record, record_insert};

/// An exclusive acquisition in one statement, prepared once per
/// connection (as [`ACQUIRE_NAME`]): takes the name's key `$2` with
/// `pg_try_advisory_lock` and, only if that took it, records the owner as
/// [`record!`] does (every holder row counts). One row: whether the key was taken, and the first
/// and last tokens of the block (`NULL` when the key was not taken, or
/// when an earlier holder is to be waited out: nothing is written then,
/// and the key is held). The CTE `t` is evaluated once (it calls a
/// volatile function), before the `INSERT` reads it, so nothing is written
/// unless the key is held.
const ACQUIRE: &str = concat!(
    "WITH t AS (SELECT pg_try_advisory_lock($2::bigint) AS ok), ",
    clock!(),
    ", ins AS (",
    record_insert!(", t", "t.ok AND ", ""),
    ") SELECT t.ok, ins.holder_token, ins.fencing_token FROM t LEFT JOIN ins ON true"
);

/// The name [`ACQUIRE`] is prepared under (`PREPARE`, so that a simple
/// query can `EXECUTE` it inside its transaction with the attempt's
/// `statement_timeout`: one round trip, and the text parsed and planned
/// once per connection).
const ACQUIRE_NAME: &str = "leasehold_acquire";

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

impl Session {
    /// An exclusive attempt: one prepared statement ([`ACQUIRE`]) takes
    /// the key and records the owner, in one round trip, in a transaction
    /// under a `statement_timeout` that ends at `until`.
    ///
    /// `pg_try_advisory_lock` takes no table lock and answers at once
    /// unless the server itself stalls; the owner record's `INSERT` can
    /// wait (behind `LOCK TABLE`, a schema change, a row lock), hence the
    /// timeout. Whatever the statement did not finish, the key may still
    /// have been granted before it failed (a session-level advisory lock
    /// survives its transaction's rollback): it is let go.
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
        // The live connection, or a new one: nothing is held yet.
        self.client()?;
        self.named(ACQUIRE_NAME, ACQUIRE)?;
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(BUSY);
        }
        let columns = OwnerColumns::of(owner);
        let statement = format!(
            "EXECUTE {ACQUIRE_NAME}({}, {key}, {}, {}, {}, {}, {})",
            literal(name),
            literal(&owner.holder_id),
            literal(&owner.hostname),
            columns.pid,
            columns.fields.as_deref().map_or("NULL".into(), literal),
            columns.lease
        );
        let started = Instant::now();
        let acquired = self.transaction_in_one(None, left, "take an advisory lock", &statement);
        let row = match acquired {
            Ok(Some(mut rows)) => rows.pop().unwrap_or_default().into_iter().next(),
            Ok(None) => None,
            Err(e) => {
                // Granted, perhaps, before the error: no session keeps a
                // lock it does not know it has.
                self.let_go(key, Lock::Exclusive, false);
                return Err(e);
            }
        };
        let Some(row) = row else {
            // Timed out: granted, perhaps, all the same.
            self.let_go(key, Lock::Exclusive, false);
            return Ok(BUSY);
        };
        let (taken, first, last): (bool, Option<i64>, Option<i64>) =
            (flag(&row, 0), column(&row, 1), column(&row, 2));
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
        if let Some(first) = first {
            return Ok(Try::Taken(Held::Exclusive, block(first, last.unwrap_or(first))));
        }
        // An earlier holder to wait out: nothing was written, and the key
        // is held all along, so the rows in the way are those it found.
        let left = left.saturating_sub(started.elapsed());
        let wait = if left.is_zero() {
            Ok(None)
        } else {
            self.transaction(None, left, "record the lock owner", |client| {
                client
                    .query_one(STAMP, &[&name, &None::<i64>, &true, &"exclusive", &None::<i64>])
                    .map(|row| wait_of(&row))
            })
        };
        // Not recorded, so not ours: let it go again.
        self.release_hold(key, Held::Exclusive);
        match wait? {
            Some(wait) => Ok(Try::Wait(wait)),
            None => Ok(BUSY),
        }
    }
}
