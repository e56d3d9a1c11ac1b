//! Inspection: every live holder the owner tables name, by name.

use std::time::SystemTime;

use super::connection::Session;
use super::tables::{granted, held, kind_of, live, wait_out};
use crate::backend::Mode;
use crate::error::Result;
use crate::field::parse_object;
use crate::owner::Owner;

/// Every live holder, exclusive ones from `leasehold_locks`, shared and
/// permit holders from `leasehold_holders`: by name, oldest first.
const INSPECT: &str = concat!(
    "SELECT name, mode, permits, holder_id, hostname, pid, acquired_at, holder_token, fields FROM (
        SELECT l.name, 'exclusive'::text AS mode, NULL::bigint AS permits, l.holder_id, l.hostname,
            l.pid, l.acquired_at, l.holder_token, l.fields, 0 AS rank
        FROM leasehold_locks l WHERE ($1::text IS NULL OR l.name = $1) AND ",
    held!(),
    " UNION ALL
        SELECT h.name, h.mode, h.permits, h.holder_id, h.hostname, h.pid, h.acquired_at, h.holder_token,
            h.fields, 1
        FROM leasehold_holders h WHERE ($1::text IS NULL OR h.name = $1) AND ",
    live!(),
    ") x ORDER BY name, rank, acquired_at, holder_token"
);

/// The rows of holders whose session holds nothing any more and who can
/// no longer count themselves holders ([`wait_out!`] no longer holds:
/// they let go, or were found dead more than their lease ago, or their
/// row records no lease), for `clean()`: shared and permit holders' rows,
/// which are deleted, and exclusive holders' owner records, which are
/// cleared (the row stays: it keeps the name's fencing counter). With
/// `$1`, they are only looked at. The row of a holder that ended without
/// letting go and has not been found dead yet is not cleaned: that holder
/// may still count itself one until a lease after it is found so (the
/// next taker, or the next session to connect, does that).
const CLEAN: &str = concat!(
    "WITH dead_h AS (SELECT h.id FROM leasehold_holders h WHERE NOT (",
    wait_out!("h"),
    ") AND NOT ",
    live!(),
    "),
    gone AS (DELETE FROM leasehold_holders h USING dead_h x WHERE h.id = x.id AND NOT $1::bool),
    dead_l AS (SELECT l.name FROM leasehold_locks l WHERE l.holder_id IS NOT NULL AND NOT (",
    wait_out!("l"),
    ") AND NOT ",
    held!(),
    "),
    cleared AS (UPDATE leasehold_locks l SET holder_id = NULL, hostname = NULL, pid = NULL, acquired_at = NULL,
            backend_pid = NULL, fields = NULL, lease_ms = NULL, free_at = NULL
        FROM dead_l x WHERE l.name = x.name AND NOT $1::bool AND l.holder_id IS NOT NULL AND NOT (",
    wait_out!("l"),
    "))
    SELECT o.name, 'exclusive'::text, NULL::bigint, o.holder_id, o.hostname, o.pid, o.acquired_at, o.holder_token,
        o.fields
    FROM leasehold_locks o JOIN dead_l x ON x.name = o.name
    UNION ALL
    SELECT o.name, o.mode, o.permits, o.holder_id, o.hostname, o.pid, o.acquired_at, o.holder_token, o.fields
    FROM leasehold_holders o JOIN dead_h x ON x.id = o.id
    ORDER BY 1"
);

/// One name as the owner tables have it: its kind and every live holder.
pub(in crate::postgres) type Found = (String, Mode, Vec<Owner>);

impl Session {
    /// Every live holder of `name` (of every name with `None`); `None`
    /// when the owner tables stayed locked for the session's `stall` (the
    /// caller tries again later, so that heartbeats get through meanwhile).
    pub(super) fn inspect(&mut self, name: Option<&str>) -> Result<Option<Vec<Found>>> {
        self.tables()?;
        let stall = self.stall;
        let rows = self.transaction(None, stall, "read lock owners", |client| {
            client.query(INSPECT, &[&name])
        })?;
        let Some(rows) = rows else { return Ok(None) };
        let mut found: Vec<Found> = Vec::new();
        for row in &rows {
            let (name, mode, owner) = holder_of(row);
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
        Ok(Some(found))
    }

    /// Removes (with `dry_run`, only finds) the rows of holders that are
    /// gone for good (see [`CLEAN`]): each as a name, its kind and the
    /// holder the row named, one entry a row. `None` when the owner
    /// tables stayed locked for the session's `stall`.
    pub(super) fn clean(&mut self, dry_run: bool) -> Result<Option<Vec<Found>>> {
        self.tables()?;
        let stall = self.stall;
        let rows = self.transaction(None, stall, "clean the owner tables", |client| {
            client.query(CLEAN, &[&dry_run])
        })?;
        let Some(rows) = rows else { return Ok(None) };
        Ok(Some(
            rows.iter()
                .map(|row| {
                    let (name, mode, owner) = holder_of(row);
                    (name, mode, vec![owner])
                })
                .collect(),
        ))
    }
}

/// A row of [`INSPECT`] (or [`CLEAN`]): the name, its kind, the holder.
fn holder_of(row: &postgres::Row) -> (String, Mode, Owner) {
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
        row.get::<_, Option<&str>>(8)
            .map(parse_object)
            .unwrap_or_default(),
    );
    (name, mode, owner)
}
