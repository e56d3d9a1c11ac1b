//! Upgradable shared locks: a holding on a session of its own (see
//! `postgres.rs`), which holds the name's *upgradable slot* key
//! exclusively for as long as it lives, and the name's key shared (a
//! shared holder like any, with its row in `leasehold_holders`). Its
//! upgrade takes the name's key exclusively on that same session, which
//! the server grants once no other session holds it (a session never
//! conflicts with itself), records the owner as an exclusive holder does,
//! and only then lets its shared hold go: the key is never free. A
//! downgrade is the same backwards: the key shared again on the session,
//! the shared holder's row, then the exclusive hold let go.

use std::time::Instant;

use super::connection::{BUSY, Held, Session, Try, pg_error, wait_of};
use super::exclusive::{OwnerColumns, record, record_insert};
use super::fence::{advance, block, clock};
use super::release::{Lock, literal};
use super::shared::JOIN_SHARED;
use super::tables::{kind_columns, wait_out};
use crate::backend::Tokens;
use crate::error::Result;
use crate::postgres::Keys;
use crate::record::OwnRecord;

/// [`record!`] for the upgrade of the shared holder whose row is `$8`:
/// the upgrading holder's own row does not stand in its way.
const UPGRADE_RECORD: &str = record!("h.id <> $8 AND ");

/// `tables::STAMP` for an upgrade of the holder whose row is `$2`: every
/// other row of the name `$1` whose holder may still count itself one is
/// marked found now, and the answer is in how many milliseconds the last
/// of them is over. The upgrading holder's own row is left alone.
const UPGRADE_STAMP: &str = concat!(
    "WITH
    l AS (UPDATE leasehold_locks l SET free_at = clock_timestamp() + l.lease_ms * interval '1 millisecond'
          WHERE l.name = $1 AND l.lease_ms IS NOT NULL AND l.free_at IS NULL RETURNING l.free_at),
    h AS (UPDATE leasehold_holders h SET free_at = clock_timestamp() + h.lease_ms * interval '1 millisecond'
          WHERE h.name = $1 AND h.id <> $2 AND h.lease_ms IS NOT NULL AND h.free_at IS NULL RETURNING h.free_at),
    gone AS (DELETE FROM leasehold_holders h WHERE h.name = $1 AND h.id <> $2 AND h.free_at < clock_timestamp()),
    ends AS (
        SELECT free_at FROM l UNION ALL SELECT free_at FROM h
        UNION ALL SELECT l.free_at FROM leasehold_locks l WHERE l.name = $1 AND l.lease_ms IS NOT NULL
        UNION ALL SELECT h.free_at FROM leasehold_holders h
            WHERE h.name = $1 AND h.id <> $2 AND h.lease_ms IS NOT NULL AND ",
    wait_out!("h"),
    ")
    SELECT ceil(extract(epoch FROM max(free_at) - clock_timestamp()) * 1000)::bigint FROM ends"
);

/// What an upgrade's record came to.
enum Recorded {
    Tokens(Tokens),
    /// An earlier holder may still count itself one for this long.
    Wait(std::time::Duration),
}

impl Session {
    /// Takes the name's upgradable slot on a dedicated session, before it
    /// joins the name's holders: `false` while another session holds it.
    pub(super) fn take_slot_key(&mut self) -> Result<bool> {
        let Some(slot) = self.dedicated else {
            return Ok(true);
        };
        if self.slot_held {
            return Ok(true);
        }
        let taken = self
            .client()?
            .query_one("SELECT pg_try_advisory_lock($1)", &[&slot]);
        match taken {
            Ok(row) => {
                self.slot_held = row.get(0);
                Ok(self.slot_held)
            }
            Err(e) => {
                // It may have been granted: the session is this holding's
                // alone, so closing it lets go of whatever it took.
                self.drop_connection();
                Err(pg_error("take the upgradable slot")(e))
            }
        }
    }

    /// Whether this dedicated session holds the name `key` as `held` and
    /// nothing else of it, on the connection of `generation`.
    fn holds_only(&mut self, key: i64, generation: u64, held: Held) -> bool {
        if self.dedicated.is_none() || generation != self.generation || self.live().is_none() {
            return false;
        }
        self.locals.get(&key).is_some_and(|local| match held {
            Held::Shared => local.shared == 1 && !local.exclusive,
            Held::Exclusive => local.shared == 0 && local.exclusive,
            Held::Permit { .. } => false,
        })
    }

    /// One attempt to turn the upgradable holder's share (its row `id`)
    /// into the name's exclusive lock, recorded for `owner`: busy while
    /// another session holds the name's key.
    pub(super) fn upgrade(
        &mut self,
        name: &str,
        keys: Keys,
        id: &str,
        generation: u64,
        owner: &OwnRecord,
        until: Instant,
    ) -> Result<Try> {
        let key = keys.name;
        if !self.holds_only(key, generation, Held::Shared) {
            // Lost: its heartbeat says so.
            return Ok(BUSY);
        }
        let taken = self
            .same("upgrade an advisory lock")?
            .query_one("SELECT pg_try_advisory_lock($1)", &[&key]);
        match taken {
            Ok(row) if row.get::<_, bool>(0) => {}
            Ok(_) => return Ok(Try::Busy { sharers: true }),
            Err(e) => {
                self.let_go(key, Lock::Exclusive, false);
                return Err(pg_error("upgrade an advisory lock")(e));
            }
        }
        self.local(key).exclusive = true;
        let left = until.saturating_duration_since(Instant::now());
        let columns = OwnerColumns::of(owner);
        let recorded = if left.is_zero() {
            Ok(None)
        } else {
            self.transaction(None, left, "record an upgraded lock's owner", |client| {
                let mut params = columns.params(&name, &key, owner);
                params.push(&id);
                let row = client.query_opt(UPGRADE_RECORD, &params)?;
                match row {
                    Some(row) => {
                        // The share's row goes with the share.
                        client.execute("DELETE FROM leasehold_holders WHERE id = $1", &[&id])?;
                        Ok(Recorded::Tokens(block(row.get(0), row.get(1))))
                    }
                    None => {
                        let row = client.query_one(UPGRADE_STAMP, &[&name, &id])?;
                        Ok(Recorded::Wait(wait_of(&row)))
                    }
                }
            })
        };
        match recorded {
            Ok(Some(Recorded::Tokens(tokens))) => {
                // Exclusive and recorded: the share is let go under it.
                self.let_go(key, Lock::Shared, true);
                self.forget(key, |local| local.shared = local.shared.saturating_sub(1));
                Ok(Try::Taken(Held::Exclusive, tokens))
            }
            other => {
                // Back to the share alone.
                let ours = self.let_go(key, Lock::Exclusive, true);
                self.forget(key, |local| local.exclusive = false);
                if !ours {
                    self.drop_connection();
                }
                match other {
                    Ok(Some(Recorded::Wait(wait))) => Ok(Try::Wait(wait)),
                    Ok(_) => Ok(Try::Busy { sharers: true }),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Turns the exclusive lock of an upgrade back into the upgradable
    /// holder's share, recorded as the shared holder `owner`; busy when
    /// that could not be recorded in time (the lock is kept).
    pub(super) fn downgrade(
        &mut self,
        name: &str,
        keys: Keys,
        generation: u64,
        owner: &OwnRecord,
        until: Instant,
    ) -> Result<Try> {
        let key = keys.name;
        if self.dedicated.is_none() {
            return Err(crate::error::Error::Unsupported {
                what: "downgrading a PostgreSQL lock that did not come from an upgrade",
            });
        }
        if !self.holds_only(key, generation, Held::Exclusive) {
            return Ok(BUSY);
        }
        // Granted at once: the session holds the key exclusively itself.
        let taken = self
            .same("downgrade an advisory lock")?
            .query_one("SELECT pg_try_advisory_lock_shared($1)", &[&key]);
        match taken {
            Ok(row) if row.get::<_, bool>(0) => {}
            Ok(_) => return Ok(BUSY),
            Err(e) => {
                self.let_go(key, Lock::Shared, false);
                return Err(pg_error("downgrade an advisory lock")(e));
            }
        }
        self.local(key).shared += 1;
        let left = until.saturating_duration_since(Instant::now());
        let (mode, permits) = kind_columns(crate::backend::Mode::Shared);
        let OwnerColumns { pid, fields, lease } = OwnerColumns::of(owner);
        // The upgradable slot, as the holding's first row named it (see
        // `Session::join`).
        let slot = self.dedicated;
        let freed = format!(
            "SAVEPOINT downgrade; UPDATE leasehold_locks SET free_at = clock_timestamp() - interval '1 millisecond'
             WHERE name = {} AND backend_pid = pg_backend_pid() AND free_at IS NULL",
            literal(name)
        );
        let joined = if left.is_zero() {
            Ok(None)
        } else {
            self.transaction(
                Some(keys.join),
                left,
                "record a downgraded lock's holder",
                |client| {
                    // The exclusive row is let go (this holder goes on as a
                    // shared one), then the shared row made.
                    client.batch_execute(&freed)?;
                    let row = client.query_one(
                        JOIN_SHARED,
                        &[
                            &name,
                            &mode,
                            &permits,
                            &owner.uuid,
                            &key,
                            &slot,
                            &owner.holder_id,
                            &owner.hostname,
                            &pid,
                            &fields,
                            &lease,
                        ],
                    )?;
                    let token: Option<i64> = row.get(2);
                    if row.get::<_, Option<String>>(0).is_some() || row.get::<_, bool>(4) || token.is_none() {
                        client.batch_execute("ROLLBACK TO SAVEPOINT downgrade")?;
                        return Ok(None);
                    }
                    Ok(token)
                },
            )
        };
        match joined {
            Ok(Some(Some(token))) => {
                self.let_go(key, Lock::Exclusive, true);
                self.forget(key, |local| local.exclusive = false);
                if let Some(client) = self.live()
                    && let Err(error) = client.query_one("SELECT pg_notify('leasehold', $1)", &[&name])
                {
                    tracing::debug!(lock = name, %error, "cannot notify waiters");
                }
                Ok(Try::Taken(Held::Shared, block(token, token)))
            }
            other => {
                let ours = self.let_go(key, Lock::Shared, true);
                self.forget(key, |local| local.shared = local.shared.saturating_sub(1));
                if !ours {
                    self.drop_connection();
                }
                other.map(|_| BUSY)
            }
        }
    }
}
