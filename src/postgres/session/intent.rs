//! Writer preference: an exclusive waiter's announcement, the name's
//! intent key held exclusively on the session while it waits, which keeps
//! new shared holders and permit holders out.

use std::time::Duration;

use super::connection::{Session, pg_error};
use super::lock::{Command, Line};
use super::release::Lock;
use crate::error::Result;
use crate::name::LockName;
use crate::postgres::Keys;
use crate::renew::{Renewable, Step};

impl Line {
    /// Announces an exclusive waiter for `name`; `None` when the intent
    /// key is taken (another waiter announced itself, or a reader probes
    /// it at this instant): the next attempt tries again.
    pub(in crate::postgres) fn announce(
        &self,
        name: &LockName,
        keys: Keys,
        every: Duration,
    ) -> Result<Option<Announcement>> {
        let (key, intent) = (keys.name, keys.intent);
        let announced = self.call(|reply| Command::Announce { key, intent, reply })?;
        Ok(announced.then(|| Announcement {
            line: self.clone(),
            name: name.as_str().to_owned(),
            key,
            intent,
            every,
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
}

impl Renewable for Announcement {
    fn renew_once(&self) -> Step {
        let (key, intent) = (self.key, self.intent);
        if let Err(error) = self.line.call(|reply| Command::Announce { key, intent, reply }) {
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
    /// this session, unless it already holds it; whether it does now.
    pub(super) fn announce(&mut self, key: i64, intent: i64) -> Result<bool> {
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
                Err(pg_error("announce an exclusive waiter")(e))
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
