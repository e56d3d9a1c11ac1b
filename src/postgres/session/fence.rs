//! Fencing tokens on the server: the name's counter in `leasehold_locks`,
//! reserved a block at a time.

use super::connection::{Held, Session, pg_error};
use crate::backend::Tokens;
use crate::error::Result;

/// How many fencing tokens one reservation takes (as for the file
/// strategies, so handoffs do not write the counter each time).
pub(in crate::postgres) const TOKEN_BLOCK: i64 = 1024;

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
}

/// The block `last - TOKEN_BLOCK + 1 ..= last` just reserved.
pub(in crate::postgres) fn tokens(last: i64) -> Tokens {
    let last = u64::try_from(last).unwrap_or(0);
    Tokens {
        next: last.saturating_sub(TOKEN_BLOCK as u64) + 1,
        last,
    }
}
