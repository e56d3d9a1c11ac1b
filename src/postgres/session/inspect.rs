//! Inspection: every live holder the owner tables name, by name.

use std::time::SystemTime;

use super::connection::Session;
use super::tables::{granted, held, kind_of, live};
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
}
