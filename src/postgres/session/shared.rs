//! Shared locks and semaphore permits: the name's key taken shared (unless
//! an exclusive waiter announced itself), a permit slot, and the holder's
//! row in `leasehold_holders`, unless the name is held as another kind.

use std::time::{Duration, Instant};

use postgres::types::{ToSql, Type};

use super::connection::{BUSY, Held, Lit, Session, Try, column, flag, inline, pg_error, wait_of};
use super::fence::{advance, block, clock, standing};
use super::release::Lock;
use super::tables::{STAMP, granted, kind_columns, kind_of, live, wait_out};
use crate::backend::{Mode, Tokens};
use crate::error::{Error, Result};
use crate::postgres::{Keys, slot_key};
use crate::record::OwnRecord;

/// How many permit slots one statement tries.
const SLOT_BATCH: u32 = 64;

/// A shared or permit acquisition: first probes the intent key `$2`
/// (taken exclusively by a waiting exclusive acquisition) with a shared
/// lock let go at once, then takes the name's key `$1` shared. `NULL`: an
/// exclusive acquisition waits; `false`: held exclusively; `true`: taken.
const JOIN_KEY: &str = "SELECT CASE
    WHEN NOT pg_try_advisory_lock_shared($2) THEN NULL
    WHEN NOT pg_advisory_unlock_shared($2) THEN NULL
    ELSE pg_try_advisory_lock_shared($1) END";

/// Whether the waiter that holds the name `$1`'s intent key has not
/// renewed its announcement (`intent_until` has passed, or was never
/// set): it stopped running with its session still up, and keeps nobody
/// out (see `intent`).
const INTENT_LAPSED: &str = "SELECT NOT EXISTS (
    SELECT 1 FROM leasehold_locks l WHERE l.name = $1 AND l.intent_until > clock_timestamp())";

/// Takes the first free slot among the keys `$1`, passing over (with `$3`)
/// those whose last holder of the name `$2` may still count itself one
/// ([`wait_out!`]): a free slot that needs no wait goes first. `Limit`
/// pulls one row at a time from the scan and stops at the first that
/// passes the filter, so exactly one lock is taken when any is free; the
/// `CASE` tries the lock only after the row check.
const TAKE_SLOT: &str = concat!(
    "SELECT s.k FROM unnest($1::bigint[]) AS s(k) WHERE CASE
        WHEN $3::bool AND EXISTS (SELECT 1 FROM leasehold_holders h WHERE h.name = $2 AND h.slot = s.k AND ",
    wait_out!("h"),
    ") THEN false
        ELSE pg_try_advisory_lock(s.k) END
     LIMIT 1"
);

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

/// An earlier holder that may still count itself one, in the way of a
/// shared or permit holder of the name `$1` (mode `$2`, permits `$3`; see
/// [`wait_out!`]): the name's exclusive holder, a holder of another kind
/// whose session ended, and for a permit holder the last holder of its
/// slot `$6` (`NULL` for a shared holder).
macro_rules! pending {
    () => {
        concat!(
            "pending AS (SELECT 1 FROM leasehold_locks l WHERE l.name = $1 AND ",
            wait_out!("l"),
            " UNION ALL SELECT 1 FROM leasehold_holders h WHERE h.name = $1 AND ",
            wait_out!("h"),
            " AND (h.slot = $6::bigint OR NOT (h.mode = $2 AND h.permits IS NOT DISTINCT FROM $3::bigint)))"
        )
    };
}

/// Records a shared holder (parameters: name, mode, permits, id, key,
/// slot, holder_id, hostname, pid, the owner fields `$10` and the lease
/// `$11` in milliseconds) unless the name is held as another kind, or an
/// earlier holder is still to be waited out; its token is the name's
/// fencing counter as it stands (see `fence`). Answers the other kind, the
/// token, nothing, and whether to wait.
pub(super) const JOIN_SHARED: &str = concat!(
    "WITH ",
    clock!(),
    ", other AS (",
    other_kind!(),
    "), ",
    pending!(),
    ", mine AS (
        INSERT INTO leasehold_holders
            (id, name, key, mode, permits, slot, holder_id, hostname, pid, acquired_at, backend_pid, holder_token,
             fields, lease_ms)
        SELECT $4::text, $1::text, $5::bigint, $2::text, $3::bigint, $6::bigint, $7::text, $8::text,
            $9::integer, now(), pg_backend_pid(), ",
    standing!(),
    ", $10::text, $11::bigint
        WHERE NOT EXISTS (SELECT 1 FROM other) AND NOT EXISTS (SELECT 1 FROM pending)
        RETURNING holder_token)
    SELECT (SELECT mode FROM other), (SELECT permits FROM other), (SELECT holder_token FROM mine), NULL::bigint,
        EXISTS (SELECT 1 FROM pending)"
);

/// Records a permit holder (parameters as [`JOIN_SHARED`]; none without
/// a slot) unless the name is held as another kind (a semaphore of another count included),
/// or an earlier holder is still to be waited out, reserving a block of
/// fencing tokens (see `fence`). Answers the other kind, the block's first
/// and last tokens, and whether to wait.
const JOIN_PERMIT: &str = concat!(
    "WITH ",
    clock!(),
    ", other AS (",
    other_kind!(),
    "), ",
    pending!(),
    ", counter AS (
        INSERT INTO leasehold_locks AS l (name, key, fencing_token, holder_token)
        SELECT $1::text, $5::bigint, n + 8193, n + 8193 FROM clock
        WHERE $6::bigint IS NOT NULL AND NOT EXISTS (SELECT 1 FROM other) AND NOT EXISTS (SELECT 1 FROM pending)
        ON CONFLICT (name) DO UPDATE SET ",
    advance!(),
    " RETURNING l.holder_token AS first, l.fencing_token AS last
    ), mine AS (
        INSERT INTO leasehold_holders
            (id, name, key, mode, permits, slot, holder_id, hostname, pid, acquired_at, backend_pid, holder_token,
             fields, lease_ms)
        SELECT $4::text, $1::text, $5::bigint, $2::text, $3::bigint, $6::bigint, $7::text, $8::text,
            $9::integer, now(), pg_backend_pid(),
            c.first, $10::text, $11::bigint
        FROM counter c
        RETURNING holder_token)
    SELECT (SELECT mode FROM other), (SELECT permits FROM other), (SELECT holder_token FROM mine),
        (SELECT last FROM counter), EXISTS (SELECT 1 FROM pending)"
);

/// What recording a shared or permit holder came to.
enum Joined {
    Tokens(Tokens),
    /// The name is held as another kind.
    Other(Mode),
    /// An earlier holder may still count itself one for this long.
    Wait(Duration),
    /// An earlier holder may still count itself one: how long is to be
    /// asked.
    Pending,
}

impl Session {
    /// A shared or permit attempt: the name's key shared (unless an
    /// exclusive waiter announced itself), a permit slot, then the holder
    /// row, unless the name is held as another kind.
    pub(super) fn try_join(
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
        let joined = self
            .client()?
            .query_typed_one(JOIN_KEY, &[(&key, Type::INT8), (&keys.intent, Type::INT8)]);
        let joined: Option<bool> = match joined {
            Ok(row) => row.get(0),
            Err(e) => {
                // This session never holds the intent key shared otherwise.
                self.let_go(keys.intent, Lock::Shared, false);
                self.unsure(key);
                return Err(pg_error("take a shared advisory lock")(e));
            }
        };
        let joined = match joined {
            None => self.past_a_lapsed_intent(name, key, until)?,
            joined => joined,
        };
        if joined != Some(true) {
            return Ok(BUSY);
        }
        self.local(key).shared += 1;
        let mut held = Held::Shared;
        if let Mode::Permit(permits) = mode
            && permits <= SLOT_BATCH
            && let Some(tried) = self.take_and_join(name, keys, permits, owner, until)?
        {
            return Ok(tried);
        }
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
                        Some(other) => Err(Error::kind_mismatch(name, mode, other)),
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
            Ok(Some(Joined::Tokens(tokens))) => Ok(Try::Taken(held, tokens)),
            Ok(Some(Joined::Other(other))) => {
                self.release_hold(key, held);
                Err(Error::kind_mismatch(name, mode, other))
            }
            Ok(Some(Joined::Wait(wait))) => {
                self.release_hold(key, held);
                Ok(Try::Wait(wait))
            }
            Ok(None | Some(Joined::Pending)) => {
                self.release_hold(key, held);
                Ok(BUSY)
            }
            Err(e) => {
                self.release_hold(key, held);
                Err(e)
            }
        }
    }

    /// A permit of a semaphore of at most [`SLOT_BATCH`] permits, the name's
    /// key held: a free slot taken and the holder recorded in one round
    /// trip (one simple query, under the name's join lock: the slot taken
    /// as [`take_slot`](Self::take_slot) takes it, in one statement that
    /// passes over slots with a holder to wait out, then tries them too,
    /// and kept in a setting of the transaction for [`JOIN_PERMIT`]).
    /// `None` when it could not say (the caller then goes step by step, the
    /// name's key still held); otherwise the attempt's outcome, the name's
    /// key let go unless taken.
    fn take_and_join(
        &mut self,
        name: &str,
        keys: Keys,
        permits: u32,
        owner: &OwnRecord,
        until: Instant,
    ) -> Result<Option<Try>> {
        let key = keys.name;
        let mine = self
            .locals
            .get(&key)
            .map(|local| local.slots.clone())
            .unwrap_or_default();
        let batch: Vec<i64> = (0..permits)
            .map(|i| slot_key(name, i))
            .filter(|slot| !mine.contains(slot))
            .collect();
        let left = until.saturating_duration_since(Instant::now());
        if batch.is_empty() || left.is_zero() {
            return Ok(None);
        }
        let array = format!(
            "ARRAY[{}]::bigint[]",
            batch.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
        );
        let (mode, count) = kind_columns(Mode::Permit(permits));
        let pass = |over_pending: bool| {
            inline(
                TAKE_SLOT,
                &[
                    Lit::raw(&array),
                    Lit::text(name),
                    Lit::raw(if over_pending { "true" } else { "false" }),
                ],
            )
        };
        // `UNION ALL` under `LIMIT`: the second pass runs only if the
        // first took nothing (as in `TAKE_SLOT`, rows are pulled one at a
        // time, and the lock is tried only on a row that passed).
        let take = format!(
            "SELECT set_config('leasehold.slot', COALESCE((SELECT k FROM (({}) UNION ALL ({}) LIMIT 1) t(k))::text, ''), \
             true)",
            pass(true),
            pass(false)
        );
        let pid = i32::try_from(owner.pid).unwrap_or(i32::MAX);
        let fields = owner.fields.as_ref().map(|f| f.object());
        let lease = i64::try_from(owner.lease_ms).unwrap_or(i64::MAX);
        let join = inline(
            JOIN_PERMIT,
            &[
                Lit::text(name),
                Lit::text(mode),
                Lit::opt_int(count),
                Lit::text(&owner.uuid),
                Lit::int(key),
                Lit::raw("NULLIF(current_setting('leasehold.slot'), '')"),
                Lit::text(&owner.holder_id),
                Lit::text(&owner.hostname),
                Lit::int(pid),
                Lit::opt_text(fields.as_deref()),
                Lit::int(lease),
            ],
        );
        let tried =
            self.transaction_in_one(Some(keys.join), left, "take a permit", &format!("{take}; {join}"));
        let rows = match tried {
            Ok(Some(rows)) if rows.len() == 2 => rows,
            // Timed out, failed, or a row of this acquisition is there
            // already (see `join`): a slot may have been taken, and the
            // statement that says which is lost; none was ours.
            failed => {
                for slot in batch {
                    self.let_go(slot, Lock::Exclusive, false);
                }
                return match failed {
                    Err(error) if !own_row_exists(&error) => {
                        self.release_hold(key, Held::Shared);
                        Err(error)
                    }
                    Ok(None) => {
                        self.release_hold(key, Held::Shared);
                        Ok(Some(BUSY))
                    }
                    _ => Ok(None),
                };
            }
        };
        let slot = rows[0].first().and_then(|row| column::<i64>(row, 0));
        let Some(row) = rows[1].first() else {
            return Err(Error::Backend {
                op: "take a permit",
                source: "the server answered no row".into(),
            });
        };
        let other = row.get(0).map(|other| kind_of(other, column(row, 1)));
        let Some(slot) = slot else {
            // Full, or held as another kind: say which.
            self.release_hold(key, Held::Shared);
            return match other {
                Some(other) => Err(Error::kind_mismatch(name, Mode::Permit(permits), other)),
                None => Ok(Some(BUSY)),
            };
        };
        self.local(key).slots.push(slot);
        let held = Held::Permit { permits, slot };
        if let Some(other) = other {
            self.release_hold(key, held);
            return Err(Error::kind_mismatch(name, Mode::Permit(permits), other));
        }
        if flag(row, 4) {
            // An earlier holder to wait out: nothing was written; how
            // long, is asked under the join lock again (the name's key
            // and the slot are held all along).
            let left = until.saturating_duration_since(Instant::now());
            let wait = self.transaction(Some(keys.join), left, "take a permit", |client| {
                let row = client.query_one(STAMP, &[&name, &Some(slot), &false, &mode, &count])?;
                Ok(wait_of(&row))
            });
            self.release_hold(key, held);
            return Ok(Some(match wait? {
                Some(wait) => Try::Wait(wait),
                None => BUSY,
            }));
        }
        let token: i64 = column(row, 2).unwrap_or(0);
        Ok(Some(Try::Taken(
            held,
            block(token, column(row, 3).unwrap_or(token)),
        )))
    }

    /// Takes the name's key shared in spite of a waiting writer's intent
    /// key, if that waiter has stopped renewing its announcement; as
    /// [`JOIN_KEY`] answers.
    fn past_a_lapsed_intent(&mut self, name: &str, key: i64, until: Instant) -> Result<Option<bool>> {
        let left = until.saturating_duration_since(Instant::now()).min(self.stall);
        if left.is_zero() {
            return Ok(None);
        }
        let lapsed = self.transaction(None, left, "read a waiting writer's announcement", |client| {
            client
                .query_one(INTENT_LAPSED, &[&name])
                .map(|row| row.get::<_, bool>(0))
        })?;
        if lapsed != Some(true) {
            return Ok(None);
        }
        match self
            .client()?
            .query_one("SELECT pg_try_advisory_lock_shared($1)", &[&key])
        {
            Ok(row) => Ok(Some(row.get(0))),
            Err(e) => {
                self.unsure(key);
                Err(pg_error("take a shared advisory lock")(e))
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
        // First the slots nobody is to be waited out on, then any.
        for pass_over_pending in [true, false] {
            if let Some(slot) = self.take_slot_among(name, key, permits, &mine, pass_over_pending, until)? {
                return Ok(Some(slot));
            }
        }
        Ok(None)
    }

    /// One pass of [`take_slot`](Self::take_slot) over every slot.
    fn take_slot_among(
        &mut self,
        name: &str,
        key: i64,
        permits: u32,
        mine: &[i64],
        pass_over_pending: bool,
        until: Instant,
    ) -> Result<Option<i64>> {
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
            // Passing over slots reads the holder table, which someone's
            // `LOCK TABLE` may hold: within the session's `stall`, or not at
            // all (the plain pass after it reads no table).
            let taken = if pass_over_pending {
                let left = until.saturating_duration_since(Instant::now()).min(self.stall);
                match self.transaction(None, left, "take a permit slot", |client| {
                    client.query_typed_opt(TAKE_SLOT, &slot_params(&batch, &name, &pass_over_pending))
                }) {
                    Ok(Some(row)) => Ok(row),
                    Ok(None) => {
                        // Cancelled: none was granted that we know of.
                        for slot in batch {
                            self.let_go(slot, Lock::Exclusive, false);
                        }
                        return Ok(None);
                    }
                    Err(error) => {
                        for slot in batch {
                            self.let_go(slot, Lock::Exclusive, false);
                        }
                        return Err(error);
                    }
                }
            } else {
                self.same("take a permit slot")?
                    .query_typed_opt(TAKE_SLOT, &slot_params(&batch, &name, &pass_over_pending))
            };
            match taken {
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
    /// another kind or an earlier holder is still to be waited out: its
    /// first block of tokens, the other kind, or how long to wait. `None`
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
    ) -> Result<Option<Joined>> {
        let (mode, permits) = kind_columns(held.mode());
        // An upgradable holding's row names the name's upgradable slot
        // (its session's `dedicated` key), as a permit's names its slot:
        // the next upgradable holder waits out one whose session ended
        // (the slot key went with it) while it may still count itself one.
        let slot = match held {
            Held::Permit { slot, .. } => Some(slot),
            _ => self.dedicated,
        };
        let pid = i32::try_from(owner.pid).unwrap_or(i32::MAX);
        let fields = owner.fields.as_ref().map(|f| f.object());
        let lease = i64::try_from(owner.lease_ms).unwrap_or(i64::MAX);
        let key = keys.name;
        // The parameters as literals: the join is one simple query, one
        // round trip (the holder id is this acquisition's UUID).
        let statement = inline(
            match held {
                Held::Permit { .. } => JOIN_PERMIT,
                _ => JOIN_SHARED,
            },
            &[
                Lit::text(name),
                Lit::text(mode),
                Lit::opt_int(permits),
                Lit::text(&owner.uuid),
                Lit::int(key),
                Lit::opt_int(slot),
                Lit::text(&owner.holder_id),
                Lit::text(&owner.hostname),
                Lit::int(pid),
                Lit::opt_text(fields.as_deref()),
                Lit::int(lease),
            ],
        );
        let id = &owner.uuid;
        let started = std::time::Instant::now();
        let mut cleared = false;
        loop {
            let left_now = left.saturating_sub(started.elapsed());
            let joined = self
                .transaction_in_one(Some(keys.join), left_now, "record a shared holder", &statement)
                .and_then(|rows| {
                    let Some(mut rows) = rows else { return Ok(None) };
                    let rows = rows.pop().unwrap_or_default();
                    let Some(row) = rows.first() else {
                        return Err(Error::Backend {
                            op: "record a shared holder",
                            source: "the server answered no row".into(),
                        });
                    };
                    if let Some(other) = row.get(0) {
                        return Ok(Some(Joined::Other(kind_of(other, column(row, 1)))));
                    }
                    if flag(row, 4) {
                        return Ok(Some(Joined::Pending));
                    }
                    let token: i64 = column(row, 2).unwrap_or(0);
                    Ok(Some(Joined::Tokens(match held {
                        Held::Permit { .. } => block(token, column(row, 3).unwrap_or(token)),
                        // The counter as it stands: no less than any
                        // exclusive holder's token before us, less than any
                        // after us.
                        _ => block(token, token),
                    })))
                });
            // An earlier holder is to be waited out: nothing was written;
            // how long, is asked under the join lock again (the name's key
            // and the slot are held all along, so the rows in the way are
            // those the join found).
            let joined = match joined {
                Ok(Some(Joined::Pending)) => self.transaction(
                    Some(keys.join),
                    left.saturating_sub(started.elapsed()),
                    "record a shared holder",
                    |client| {
                        let row = client.query_one(STAMP, &[&name, &slot, &false, &mode, &permits])?;
                        Ok(Joined::Wait(wait_of(&row)))
                    },
                ),
                joined => joined,
            };
            // A row of this very acquisition is there already: an earlier
            // try whose COMMIT the server carried out but whose answer was
            // lost with its session (`Session::transaction`), so the try
            // was made again. That row's holder never ran and holds
            // nothing: it goes, and the join is made once more.
            match joined {
                Err(error) if !cleared && own_row_exists(&error) => {
                    cleared = true;
                    self.transaction(
                        Some(keys.join),
                        left.saturating_sub(started.elapsed()),
                        "remove an earlier try's holder row",
                        |client| client.execute("DELETE FROM leasehold_holders WHERE id = $1", &[id]),
                    )?;
                }
                joined => return joined,
            }
        }
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
}

/// The parameters of [`TAKE_SLOT`], typed (one round trip: nothing to
/// prepare).
fn slot_params<'a>(
    batch: &'a Vec<i64>,
    name: &'a &str,
    pass_over_pending: &'a bool,
) -> [(&'a (dyn ToSql + Sync), Type); 3] {
    [
        (batch, Type::INT8_ARRAY),
        (name, Type::TEXT),
        (pass_over_pending, Type::BOOL),
    ]
}

/// Whether `error` says that the holder row being recorded is there
/// already (its id, the acquisition's own, is taken).
fn own_row_exists(error: &crate::error::Error) -> bool {
    let crate::error::Error::Backend { source, .. } = error else {
        return false;
    };
    source
        .downcast_ref::<postgres::Error>()
        .and_then(postgres::Error::as_db_error)
        .is_some_and(|db| {
            *db.code() == postgres::error::SqlState::UNIQUE_VIOLATION
                && db.constraint() == Some("leasehold_holders_pkey")
        })
}
