//! The session thread: the one connection a PostgreSQL `Locker` holds its
//! locks on, driven by a thread of its own, and [`PgLock`], a lock held on
//! it. (The listener that wakes waiters is in `postgres.rs`; the design of
//! shared locks and semaphores is described there.)
//!
//! This file is the thread's command loop. The rest, one concern a file:
//! `connection` (the connection and what it holds of each name),
//! `exclusive`, `shared` (shared locks and permits), `intent` (exclusive
//! waiters' announcements), `release`, `fence` (fencing tokens), `tables`
//! (the owner tables), `inspect`, `upgrade` (upgradable holdings, each on
//! a session of its own), `stable` (refusing a session a pooler shares,
//! keepalives), and `lock` ([`PgLock`], and the [`Line`] to the thread).
//! Imports go one way: `tables`, `stable` ← `connection` ← the rest ←
//! this file.

mod connection;
mod exclusive;
mod fence;
mod inspect;
mod intent;
mod lock;
mod release;
mod shared;
mod stable;
mod tables;
mod upgrade;

use std::sync::mpsc::Receiver;
use std::time::Instant;

use crate::backend::Mode;
use crate::error::{Error, Result};
use crate::postgres::Keys;
use crate::record::OwnRecord;
pub(super) use connection::Session;
use connection::{BUSY, Try, name_refused};
#[cfg(all(test, unix))]
pub(super) use fence::{LEAD, TOKEN_BLOCK, block};
pub(crate) use lock::PgLock;
pub(super) use lock::{
    ANSWER_PATIENCE, Answer, Command, Line, Reply, Unanswered, no_answer, patience, question, session_stopped,
};
use tables::{TOO_LONG, name_fits};

impl Session {
    pub(in crate::postgres) fn run(mut self, commands: &Receiver<Command>) {
        // Until the Locker and every lock are gone; closing the connection
        // then releases anything left on the server.
        while let Ok(command) = commands.recv() {
            self.handle(command);
        }
    }

    fn handle(&mut self, command: Command) {
        self.handle_one(command);
        // A dedicated session (an upgradable holding's) that holds nothing
        // of its name any more is over: closing it lets go of its slot.
        if self.dedicated.is_some()
            && self.client.is_some()
            && self.locals.values().all(|l| !l.exclusive && l.shared == 0)
        {
            self.drop_connection();
        }
    }

    /// Answers an attempt (a lock, an upgrade, a downgrade) with what
    /// `result` found; a lock its caller no longer waits for is let go.
    fn answer(
        &mut self,
        result: Result<Try>,
        name: crate::name::LockName,
        keys: Keys,
        owner: Box<OwnRecord>,
        line: Line,
        reply: Reply<Result<Answer>>,
    ) {
        let generation = self.generation;
        let answer = self.settle(result).map(|found| match found {
            Try::Taken(held, tokens) => {
                let mut record = *owner;
                // The first token of the block is this acquisition's.
                record.fencing_token = Some(tokens.next);
                let lock = PgLock {
                    line,
                    name,
                    key: keys.name,
                    held,
                    generation,
                    record,
                    armed: true,
                };
                Answer::Taken(Box::new(lock), tokens)
            }
            Try::Busy { sharers } => Answer::Busy { sharers },
            Try::Wait(wait) => Answer::Wait(wait),
        });
        if let Err(Ok(Answer::Taken(mut lock, _))) = reply.send(answer) {
            // The caller gave up: the lock is nobody's. Let it go
            // now rather than behind the commands queued meanwhile.
            lock.armed = false;
            tracing::debug!(
                lock = lock.name.as_str(),
                "the attempt's caller gave up; unlocking"
            );
            if self.dedicated.is_some() {
                // An upgrade or downgrade whose caller went: the holding
                // it came from is gone with it. Closing the session lets
                // go of everything.
                self.drop_connection();
                return;
            }
            let result = self.unlock(
                lock.name.as_str(),
                lock.key,
                lock.held,
                &lock.record.uuid,
                lock.generation,
            );
            if let Err(error) = self.settle(result) {
                tracing::warn!(lock = lock.name.as_str(), %error, "unlock failed");
            }
        }
    }

    fn handle_one(&mut self, command: Command) {
        match command {
            Command::TryLock {
                name,
                keys,
                mode,
                owner,
                until,
                line,
                reply,
            } => {
                let result = self.try_lock(name.as_str(), keys, mode, &owner, until);
                self.answer(result, name, keys, owner, line, reply);
            }
            Command::Upgrade {
                name,
                keys,
                id,
                generation,
                owner,
                until,
                line,
                reply,
            } => {
                let result = self.upgrade(name.as_str(), keys, &id, generation, &owner, until);
                let result = self.converted(result);
                self.answer(result, name, keys, owner, line, reply);
            }
            Command::Downgrade {
                name,
                keys,
                generation,
                owner,
                until,
                line,
                reply,
            } => {
                let result = self.downgrade(name.as_str(), keys, generation, &owner, until);
                let result = self.converted(result);
                self.answer(result, name, keys, owner, line, reply);
            }
            Command::Unlock {
                name,
                key,
                held,
                id,
                generation,
                reply,
            } => {
                let result = self.unlock(&name, key, held, &id, generation);
                let result = self.settle(result);
                match reply {
                    Some(reply) => drop(reply.send(result)),
                    None => {
                        if let Err(error) = result {
                            tracing::warn!(lock = name, %error, "unlock failed");
                        }
                    }
                }
            }
            Command::Heartbeat {
                key,
                generation,
                reply,
            } => {
                let result = self.heartbeat(key, generation);
                let _ = reply.send(self.settle(result));
            }
            Command::Reserve {
                name,
                key,
                held,
                generation,
                reply,
            } => {
                let result = self.reserve(&name, key, held, generation);
                let _ = reply.send(self.settle(result));
            }
            Command::Inspect { name, reply } => {
                let result = self.inspect(name.as_deref());
                let _ = reply.send(self.settle(result));
            }
            Command::Clean { dry_run, reply } => {
                let result = self.clean(dry_run);
                let _ = reply.send(self.settle(result));
            }
            Command::Announce {
                name,
                key,
                intent,
                lease_ms,
                renewal,
                reply,
            } => {
                let before = self.locals.get(&key).is_some_and(|local| local.announced);
                let result = self.announce(&name, key, intent, lease_ms);
                let answer = self.settle(result);
                let made = !renewal && !before && matches!(answer, Ok(true));
                let _ = failpoint!("postgres.announce.before_reply");
                // Its caller gave up waiting (the answer came too late):
                // an announcement nobody holds would keep readers out
                // until its `intent_until`. One this call made is
                // withdrawn; one made before belongs to an `Announcement`,
                // and so does one a renewal made again (after a
                // reconnection): that renewal's `Announcement` lives on,
                // until its own `Withdraw`.
                if reply.send(answer).is_err() && made {
                    self.withdraw(&name, key, intent);
                }
            }
            Command::Withdraw { name, key, intent } => self.withdraw(&name, key, intent),
        }
    }

    /// One attempt, over by `until`: `Busy` when the lock is taken
    /// elsewhere, or could not be recorded in time (and is let go again).
    fn try_lock(
        &mut self,
        name: &str,
        keys: Keys,
        mode: Mode,
        owner: &OwnRecord,
        until: Instant,
    ) -> Result<Try> {
        // Queued behind slower commands until its caller gave up; or an
        // upgradable holding's own session, which the server ended since
        // it was made (it is never made again: its caller starts another).
        if Instant::now() >= until || self.ended_for_good() {
            return Ok(BUSY);
        }
        self.tables()?;
        // Connected, so the database's encoding is known.
        self.client()?;
        if !name_fits(name, self.widest) {
            return Err(refused(name, TOO_LONG));
        }
        let mut tried = self.try_mode(name, keys, mode, owner, until);
        // The server ended the session since its last statement (a
        // restart, `pg_terminate_backend`, an idle timeout): the attempt
        // found out by failing, and took nothing, since the server drops
        // whatever a session held when it ends. Once more on a new one.
        let ended = match &tried {
            Err(error) => self.connection_gone() || session_ended(error),
            Ok(_) => false,
        };
        if ended {
            tracing::debug!(
                lock = name,
                "the PostgreSQL session ended; trying again on a new one"
            );
            // Whatever the client makes of it yet: this one is done.
            self.drop_connection();
            // Out of time: an attempt that took nothing, as if busy; the
            // caller's next one connects anew.
            // (An upgradable holding's own session is never made again:
            // its caller starts another.)
            tried = if Instant::now() < until && self.dedicated.is_none() {
                self.try_mode(name, keys, mode, owner, until)
            } else {
                Ok(BUSY)
            };
        }
        // Whatever the rule above missed: the attempt took nothing.
        tried.map_err(|error| match name_refused(&error) {
            Some(reason) => refused(name, reason),
            None => error,
        })
    }
}

impl Session {
    fn try_mode(
        &mut self,
        name: &str,
        keys: Keys,
        mode: Mode,
        owner: &OwnRecord,
        until: Instant,
    ) -> Result<Try> {
        // An upgradable holding's own session takes the name's upgradable
        // slot first: one such holder at a time.
        if self.dedicated.is_some() && (mode != Mode::Shared || !self.take_slot_key()?) {
            return Ok(BUSY);
        }
        match mode {
            Mode::Exclusive => self.try_exclusive(name, keys.name, owner, until),
            Mode::Shared | Mode::Permit(_) => self.try_join(name, keys, mode, owner, until),
        }
    }

    /// What an upgrade or a downgrade that failed because the server
    /// ended the holding's session comes to: nothing, as if busy, with
    /// the session closed. The holding went with its session (the server
    /// let go of everything it held), which its heartbeat reports, and so
    /// the conversion, trying again, ends [`Lost`](crate::Error::Lost).
    fn converted(&mut self, result: Result<Try>) -> Result<Try> {
        match result {
            Err(error) if self.connection_gone() || session_ended(&error) => {
                tracing::debug!(%error, "the session of an upgradable holding ended during a conversion");
                self.drop_connection();
                Ok(BUSY)
            }
            other => other,
        }
    }

    /// The connection is closed (or was dropped after a failure).
    pub(super) fn connection_gone(&self) -> bool {
        self.client.as_ref().is_none_or(postgres::Client::is_closed)
    }
}

/// The server ended the session (SQLSTATE `57P..`: `pg_terminate_backend`,
/// a shutdown, a crash of another backend, an idle-session timeout; not
/// `57014`, a cancelled statement), or the connection closed or broke (reset,
/// a broken pipe): `error` tells of the end of the session, not of the
/// statement.
fn session_ended(error: &Error) -> bool {
    let Error::Backend { source, .. } = error else {
        return false;
    };
    source.downcast_ref::<postgres::Error>().is_some_and(|e| {
        let broke = std::error::Error::source(e)
            .and_then(|cause| cause.downcast_ref::<std::io::Error>())
            .is_some_and(|io| {
                use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
                matches!(
                    io.kind(),
                    BrokenPipe | ConnectionAborted | ConnectionReset | UnexpectedEof
                )
            });
        broke || e.is_closed() || e.code().is_some_and(|code| code.code().starts_with("57P"))
    })
}

fn refused(name: &str, reason: &'static str) -> Error {
    Error::InvalidName {
        name: name.to_owned(),
        reason,
    }
}
