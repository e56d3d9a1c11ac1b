//! Writer preference: an exclusive waiter's announcement, the name's
//! intent key held exclusively on the session while it waits, which keeps
//! new shared holders and permit holders out, for as long as the waiter
//! renews it: each announcement and renewal sets the name's
//! `intent_until` (in `leasehold_locks`) to a lease from then, and a
//! reader that finds the intent key taken stays out only while that time
//! is ahead. So a waiter that stops running (frozen, stopped in a
//! debugger) with its session still up keeps readers out for at most a
//! lease, as a frozen holder keeps its lock.

use std::time::Duration;

use super::connection::{Session, pg_error};
use super::lock::{Command, Line};
use super::release::Lock;
use super::release::literal;
use crate::backend::{Renewable, Step};
use crate::error::Result;
use crate::name::LockName;
use crate::postgres::Keys;

impl Line {
    /// Announces an exclusive waiter for `name`; `None` when the intent
    /// key is taken (another waiter announced itself, or a reader probes
    /// it at this instant): the next attempt tries again.
    pub(in crate::postgres) fn announce(
        &self,
        name: &LockName,
        keys: Keys,
        every: Duration,
        lease: Duration,
    ) -> Result<Option<Announcement>> {
        let (key, intent) = (keys.name, keys.intent);
        let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
        let name = name.as_str().to_owned();
        let announced = match self.call(|reply| Command::Announce {
            name: name.clone(),
            key,
            intent,
            lease_ms,
            renewal: false,
            reply,
        }) {
            Ok(announced) => announced,
            // Not answered in time (the session is busy with a slower
            // statement, or the server does not answer): not announced,
            // and the next attempt tries again, as an attempt that is not
            // answered in time is busy. The session thread withdraws an
            // announcement it makes after its caller gave up (`session.rs`).
            Err(error) if super::lock::timed_out(&error) => return Ok(None),
            Err(error) => return Err(error),
        };
        Ok(announced.then(|| Announcement {
            line: self.clone(),
            name,
            key,
            intent,
            every,
            lease_ms,
        }))
    }
}

/// An exclusive waiter's announcement: the intent key of its name, held
/// exclusively on the session while it waits, so that new shared holders
/// and permit holders stay out. Renewing it takes the key again if the
/// session was reconnected meanwhile; dropping it lets the key go.
#[derive(Debug)]
pub(crate) struct Announcement {
    line: Line,
    name: String,
    key: i64,
    intent: i64,
    every: Duration,
    lease_ms: i64,
}

impl Renewable for Announcement {
    fn renew_once(&self) -> Step {
        let (key, intent, lease_ms) = (self.key, self.intent, self.lease_ms);
        let name = self.name.clone();
        // On the renewal thread every lease shares: never longer than until
        // the next renewal is due (a stopped server must not hold up the
        // loss reports of the Locker's holders).
        // Answered too late (the session is slow), it still takes the key
        // again if the session was reconnected meanwhile: this
        // announcement lives on, and is withdrawn when dropped.
        if let Err(error) = self.line.call_within(self.every, |reply| Command::Announce {
            name,
            key,
            intent,
            lease_ms,
            renewal: true,
            reply,
        }) {
            tracing::debug!(lock = self.name, %error, "renewing an exclusive waiter's announcement failed");
        }
        Step::Again(self.every)
    }
}

impl Drop for Announcement {
    fn drop(&mut self) {
        let _ = self.line.send(Command::Withdraw {
            name: std::mem::take(&mut self.name),
            key: self.key,
            intent: self.intent,
        });
    }
}

impl Session {
    /// Takes the intent key of the name `key` for an exclusive waiter of
    /// this session, unless it already holds it, having first set the
    /// name's `intent_until` to `lease_ms` from now; whether it holds it
    /// now.
    pub(super) fn announce(&mut self, name: &str, key: i64, intent: i64, lease_ms: i64) -> Result<bool> {
        self.announce_until(name, key, lease_ms);
        // An upgradable holding's own session, which the server ended
        // (found before, or by `announce_until`, which drops a connection
        // that broke under it): never made again, and the holding went
        // with it (its heartbeat says so, and its upgrade ends lost).
        if self.ended_for_good() {
            return Ok(false);
        }
        if self.locals.get(&key).is_some_and(|local| local.announced) {
            return Ok(true);
        }
        let taken = self
            .client()?
            .query_one("SELECT pg_try_advisory_lock($1)", &[&intent]);
        match taken {
            Ok(row) => {
                let taken: bool = row.get(0);
                if taken {
                    self.local(key).announced = true;
                }
                Ok(taken)
            }
            Err(e) => {
                self.let_go(intent, Lock::Exclusive, false);
                let error = pg_error("announce an exclusive waiter")(e);
                // The server ended the session (a restart,
                // `pg_terminate_backend`): it dropped whatever the session
                // held, and the waiter's next attempt connects anew, as an
                // attempt does. Not announced meanwhile: writer preference
                // lost for a while, never a lock, and no error to the caller.
                if self.connection_gone() || super::session_ended(&error) {
                    self.drop_connection();
                    return Ok(false);
                }
                Err(error)
            }
        }
    }

    /// Sets the name's `intent_until` to `lease_ms` from now (making its
    /// row if it has none, with the counter 0, which counts as missing:
    /// see `fence`),
    /// waiting at most the session's `stall` for the table. Not set, the
    /// intent key keeps no reader out: writer preference is lost for a
    /// while, never a lock.
    fn announce_until(&mut self, name: &str, key: i64, lease_ms: i64) {
        let ms = self.stall.as_millis();
        let Some(client) = self.live() else { return };
        let set = client.batch_execute(&format!(
            "BEGIN; SET LOCAL statement_timeout = {ms};
             INSERT INTO leasehold_locks AS l (name, key, fencing_token, intent_until)
             VALUES ({name}, {key}, 0, clock_timestamp() + {lease_ms} * interval '1 millisecond')
             ON CONFLICT (name) DO UPDATE SET intent_until = EXCLUDED.intent_until; COMMIT",
            name = literal(name),
        ));
        if let Err(error) = set {
            tracing::debug!(lock = name, %error, "cannot say until when a writer waits");
            if client.batch_execute("ROLLBACK").is_err() {
                self.drop_connection();
            }
        }
    }

    /// Lets the intent key go, and tells the readers held back by it.
    pub(super) fn withdraw(&mut self, name: &str, key: i64, intent: i64) {
        if !self.locals.get(&key).is_some_and(|local| local.announced) {
            return;
        }
        self.let_go(intent, Lock::Exclusive, true);
        self.forget(key, |local| local.announced = false);
        if let Some(client) = self.live()
            && let Err(error) = client.query_one("SELECT pg_notify('leasehold', $1)", &[&name])
        {
            tracing::debug!(lock = name, %error, "cannot notify waiters");
        }
    }
}
