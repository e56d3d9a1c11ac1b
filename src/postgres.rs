//! The PostgreSQL backend (feature `postgres`).
//!
//! A lock is a session-level advisory lock, `pg_try_advisory_lock(key)`,
//! held on one connection that the `Locker` owns. The key is the first 8
//! bytes of SHA-256 of `"leasehold\0" + name`, read as a big-endian `i64`:
//! stable across processes and versions, and in effect a namespace of its
//! own, since an application's own advisory keys would have to hit one of
//! 2^64 values by accident. (It uses the one-`bigint` form, which
//! PostgreSQL keeps apart from the two-`integer` form.)
//!
//! The owner (`holder_id`, host, pid, acquisition time) and the per-name
//! fencing counter live in `leasehold_locks`, created on first use with
//! `CREATE TABLE IF NOT EXISTS` and written only while the advisory lock is
//! held. Tokens count the server's clock in microseconds (see
//! `session/fence.rs`), so they strictly increase per name even when the
//! table is emptied or dropped, as long as the server's clock does not go
//! back meanwhile. A table dropped under a running `Locker` fails the
//! attempt that finds it gone ([`Error::MissingTable`]); the next attempt
//! creates it again.
//!
//! Names are stored as text, and indexed: a name must fit a btree entry
//! (2,692 bytes of text). In UTF-8 every name of up to
//! [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) does; in a database whose
//! encoding takes more bytes for some characters (EUC_JP: 3 for "é"), a
//! name that might not is refused with [`Error::InvalidName`] before the
//! server is asked to lock it.
//!
//! The connection is driven by a thread of its own, so a lock is kept, and
//! released, whatever the caller's runtime does. The session holds the
//! locks: if it dies (server restart, `pg_terminate_backend`, network
//! loss), the server drops them, and every guard on it reports `lost()` at
//! its next heartbeat (one `renew_interval`), or at its lease's cutoff if
//! the server does not answer. The backend then reconnects for new
//! acquisitions.
//!
//! **Waiting out a holder whose session ended.** The server frees a dead
//! session's locks at once, but its holder may still be running until its
//! lease's cutoff, and must not meet a successor. Each holder's row
//! (`leasehold_locks`, `leasehold_holders`) records its lease (`lease_ms`);
//! letting go cleanly marks the row (`free_at` = now, or deletes a shared
//! or permit holder's row) before unlocking. A taker that holds the key but
//! finds a row in its way neither let go nor found dead (the name's
//! exclusive row; for a writer every holder row of the name; for a permit
//! the last holder of its slot) records nothing: it sets the row's
//! `free_at` to its `clock_timestamp()` plus that lease, lets the key go,
//! and tries again then (see `session/tables.rs`, `STAMP`). A holder
//! renews its lease from when its heartbeat was *sent*, so it counts
//! itself a holder for less than a lease after the server last knew its
//! session, which was before the session ended, which was before the
//! taker found it gone. A release sends `pg_notify` on channel
//! `leasehold`, which every backend `LISTEN`s to, to wake waiters on other
//! hosts; a poll remains as the safety net (and is what notices a holder's
//! session dying, which sends no notification).
//!
//! **Shared locks and semaphores.** A shared holder takes the same key with
//! `pg_try_advisory_lock_shared`, so the server keeps exclusive and shared
//! holders apart by itself. A permit holder of a semaphore of `n` permits
//! holds the name's key shared too (so an exclusive acquisition of the
//! name waits for every permit holder, and excludes new ones), and one
//! *slot* exclusively: the key of `(name, i)` for the first free `i < n`
//! (see [`slot_key`]), so at most `n` sessions hold a slot at once. Each
//! shared holder and permit holder has a row in `leasehold_holders`
//! (its owner, kind, permit count, fencing token and server process id),
//! shown by `holders()` and `list()` while its session holds the name's
//! key shared (`pg_locks`), deleted when it lets go. Rows left by a
//! session that died are never shown, and are removed by the next session
//! to connect.
//!
//! *Kinds.* The row is written in a transaction that first takes the
//! name's *join* key as a transaction-level advisory lock, and is written
//! only if no live row of another kind is found: so a name is never held
//! shared and by permits at once, nor by semaphores of two different
//! counts (processes that disagree on `n` never exceed the smaller one:
//! they never hold at once at all). The later acquisition gets
//! [`Error::KindMismatch`]. A permit acquisition that finds every slot
//! taken also looks for holders of another kind, so a mismatch is reported
//! rather than waited on.
//!
//! *Writer preference.* PostgreSQL orders only *queued* lock requests, and
//! every attempt here is a `try` (the session must stay free for
//! heartbeats): a waiting exclusive acquisition would be overtaken by new
//! shared holders forever. So an exclusive attempt that finds the key held
//! shared (a shared `try` on it would succeed) *announces* itself: it takes
//! the name's *intent* key exclusively for as long as it waits (and takes
//! it again after a reconnection). A shared or permit acquisition first
//! probes the intent key with a shared `try`, let go in the same statement,
//! and stays out while it is taken; the holders the waiter found finish,
//! and it gets in. The announcement counts only while the waiter renews
//! it: each announcement and renewal sets the name's `intent_until` a
//! lease ahead, and a reader that finds the intent key taken past that
//! time joins anyway (the waiter stopped running with its session up).
//! Two waiting writers do not both need the intent key: one
//! announced writer keeps new readers out, and the next one announces
//! itself when it finds readers in turn. The server cannot tell a session
//! from itself (its locks are re-entrant per session), so the session
//! thread counts what it holds of each name and keeps its own holders
//! apart: an exclusive attempt while its own `Locker` holds the name
//! shared is busy, a permit never reuses its own session's slot.
//!
//! *Fencing.* A permit holder reserves a block of tokens from the name's
//! counter as an exclusive holder does (a fresh token per acquisition). A
//! shared holder's token is the counter as it stands, without advancing
//! it: no less than any earlier exclusive holder's token, less than any
//! later one's.
//!
//! **Upgradable shared locks.** An upgradable holding has a session of
//! its own (a connection and thread, started by the acquisition and
//! closed when the holding ends): the `Locker`'s session would not make
//! its upgrade wait for the `Locker`'s own shared holders, since the
//! server never makes a session wait for itself. On it the holding takes
//! the name's *upgradable slot* key exclusively (one upgradable holder a
//! name, across sessions; kept until the session closes), then joins the
//! name's holders as any shared holder does (the intent probe, the key
//! shared, its row). Its upgrade takes the name's key exclusively on that
//! same session, granted once no other session holds it, records the
//! owner and a new block of tokens (waiting out holders whose session
//! ended, as an exclusive holder does), deletes its shared row and only
//! then lets its shared hold go: the key is never free, so no writer and
//! no other upgradable holder gets in. While it waits, it announces itself
//! on its own session, so the intent key keeps out new readers of every
//! session, its `Locker`'s included. A downgrade is the same backwards.
//! The session is never made again: when it ends (released, or
//! `pg_terminate_backend`), the holding is over, its heartbeat reports it
//! lost, and the server has let go of its keys. See
//! `session/upgrade.rs`.
//!
//! **Connections.** Every connection is made by `target.rs` from one set
//! of settings (a URL or the application's `postgres::Config`, with
//! libpq's `sslmode` and `sslrootcert`, and `application_name` defaulting
//! to `leasehold/<version>`), over TLS (`tls.rs`, feature `postgres-tls`)
//! where asked. A `Locker` has its session; the listener (`listen.rs`)
//! is shared by the `Locker`s of the process with the same settings,
//! since a notification concerns every listener of the database alike;
//! an upgradable holding has a session of its own. Sessions are never
//! shared: they hold the locks.
//!
//! **Connection poolers.** Session locks need a session: behind a pooler in
//! transaction mode (PgBouncer `pool_mode = transaction`) each statement may
//! run on another server connection, so a lock taken by one statement is
//! not held by the next, and an unlock may hit the wrong session. Each
//! connection is probed before it locks anything, and refused with
//! [`Error::UnstableSession`] (see `session/stable.rs`); the backend also
//! checks at every heartbeat that its server process id has not changed,
//! and treats a change as the loss of every lock, with a warning. The
//! same file sets the TCP keepalives of both sides from the lease, so
//! that a session cut off from its peer ends in bounded time.

mod listen;
mod session;
mod target;
#[cfg(feature = "postgres-tls")]
mod tls;

use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest, Sha256};

use crate::backend::Renewable;
use crate::backend::{Arm, Attempt, Backend, Inspection, Kept, Mode, Upgrade, Waiters};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::record::OwnRecord;
use listen::Subscription;
pub(crate) use session::PgLock;
use session::{
    ANSWER_PATIENCE, Answer, Command, Line, Session, Unanswered, no_answer, patience, question,
    session_stopped,
};
pub use target::PgSslMode;
pub(crate) use target::{Source, Target, TlsSettings};

/// The least time an attempt is given, however close its deadline: a few
/// round trips, so that `acquire_timeout(Duration::ZERO)` still makes one.
const ATTEMPT_FLOOR: Duration = Duration::from_millis(100);

/// How long past an attempt's end its caller waits for the answer: the
/// server's report of the cancelled statement, and the unlock after it.
const ANSWER_GRACE: Duration = Duration::from_millis(250);

/// The advisory-lock key of a lock name.
pub(crate) fn key(name: &str) -> i64 {
    let mut hasher = Sha256::new();
    hasher.update(b"leasehold\0");
    hasher.update(name.as_bytes());
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// A key of one role in the locking of `name` (the intent key, the join
/// key, a permit slot): the first 8 bytes of SHA-256 of `"leasehold-" +
/// role + "\0" + name`, with `"\0"` and the big-endian index after it for
/// a slot. The prefix differs from the name key's in its tenth byte, and
/// names hold no NUL, so no two roles (or names) share an input.
fn derived(role: &str, name: &str, index: Option<u32>) -> i64 {
    let mut hasher = Sha256::new();
    hasher.update(b"leasehold-");
    hasher.update(role.as_bytes());
    hasher.update(b"\0");
    hasher.update(name.as_bytes());
    if let Some(index) = index {
        hasher.update(b"\0");
        hasher.update(index.to_be_bytes());
    }
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// The key of permit slot `index` of the semaphore `name`.
pub(crate) fn slot_key(name: &str, index: u32) -> i64 {
    derived("slot", name, Some(index))
}

/// The key of the name's upgradable slot, held exclusively by the
/// session of its one upgradable holding (see `session/upgrade.rs`).
pub(crate) fn upgradable_key(name: &str) -> i64 {
    derived("upgradable", name, None)
}

/// The keys of one name.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keys {
    /// The lock itself: exclusive, or shared by shared and permit holders.
    pub(crate) name: i64,
    /// Held exclusively by an exclusive acquisition waiting for shared
    /// holders (its announcement).
    pub(crate) intent: i64,
    /// Serializes the recording of shared and permit holders (a
    /// transaction-level lock).
    pub(crate) join: i64,
}

impl Keys {
    pub(crate) fn of(name: &str) -> Keys {
        Keys {
            name: key(name),
            intent: derived("intent", name, None),
            join: derived("join", name, None),
        }
    }
}

/// A `Locker`'s connection to the server.
#[derive(Debug)]
pub(crate) struct Pg {
    line: Line,
    /// This `Locker`'s place at the listener of its server settings.
    listener: Subscription,
    holder_id: String,
    /// The `Locker`'s owner fields, kept in the owner table.
    fields: Option<Arc<crate::field::OwnerFields>>,
    lease: Duration,
    /// For the sessions of upgradable holdings.
    target: Arc<Target>,
}

impl Pg {
    /// Connects (reporting a bad URL or an unreachable server at once) and
    /// starts the session thread, and subscribes `waiters` to the listener
    /// that tells of locks released by other sessions.
    pub(crate) fn connect(
        target: Target,
        holder_id: String,
        fields: Option<Arc<crate::field::OwnerFields>>,
        lease: Duration,
        waiters: Waiters,
    ) -> Result<Self> {
        let target = Arc::new(target);
        let line = start_session(Session::new(Arc::clone(&target), lease), ANSWER_PATIENCE)?
            .ok_or_else(|| no_answer("connect to PostgreSQL", ANSWER_PATIENCE))?;
        // Notifications come on a connection and a thread of their own, so
        // that waiting for them never delays a command; shared by the
        // `Locker`s of the process with the same settings.
        let listener = Subscription::to(&target, waiters)?;
        Ok(Self {
            line,
            listener,
            holder_id,
            fields,
            lease,
            target,
        })
    }
}

/// Starts the thread of `session`, connected (a bad URL or an unreachable
/// server is reported at once): the way to it; `None` if it did not
/// connect within `patience` (the thread then ends by itself, closing the
/// connection if it is made after all).
fn start_session(mut session: Session, patience: Duration) -> Result<Option<Line>> {
    let lease = session.lease();
    let (commands, rx) = mpsc::channel();
    let (ready, connected) = mpsc::channel();
    // The client blocks on a runtime of its own, which cannot be done
    // from a thread that drives a Tokio runtime: connect there too.
    std::thread::Builder::new()
        .name("leasehold-postgres".into())
        .spawn(move || {
            let first = session.client().map(|_| ());
            let up = first.is_ok();
            let _ = ready.send(first);
            if up {
                session.run(&rx);
            }
        })
        .map_err(|e| Error::Backend {
            op: "start the PostgreSQL session thread",
            source: Box::new(e),
        })?;
    match connected.recv_timeout(patience) {
        Ok(first) => first.map(|()| Some(Line::new(commands, lease))),
        // Dropping `commands` ends the thread once it has connected.
        Err(RecvTimeoutError::Timeout) => Ok(None),
        Err(RecvTimeoutError::Disconnected) => Err(session_stopped()),
    }
}

impl Backend for Pg {
    type Lock = PgLock;

    fn kind(&self) -> &'static str {
        "postgres"
    }

    /// One attempt; `Busy` when another session holds the lock, or when
    /// the server did not answer in time.
    ///
    /// The attempt is given until `deadline` (at least [`ATTEMPT_FLOOR`]),
    /// and at most a quarter of the lease, so that one stuck statement does
    /// not hold up the heartbeats queued behind it on the session; a waiter
    /// without a deadline simply tries again. Whatever the server answers
    /// after this call has returned is the session thread's to undo. The
    /// first block of fencing tokens comes with the lock.
    fn attempt<K: Kept>(
        &self,
        name: &LockName,
        mode: Mode,
        deadline: Option<Instant>,
        arm: Arm<'_, PgLock, K>,
    ) -> Result<Attempt<K>> {
        self.attempt_on(&self.line, name, mode, deadline, arm)
    }

    /// Takes the name's intent key for an exclusive acquisition waiting
    /// for shared holders, so that new ones stay out (see the module
    /// documentation); `None` while another waiter holds it.
    fn announce(&self, name: &LockName) -> Result<Option<Arc<dyn Renewable>>> {
        let every = (self.lease / 3).max(Duration::from_millis(1));
        let announced = self
            .line
            .announce(name, Keys::of(name.as_str()), every, self.lease)?;
        Ok(announced.map(|a| Arc::new(a) as Arc<dyn Renewable>))
    }

    fn inspect(&self, name: &LockName) -> Result<Option<Inspection>> {
        Ok(self
            .rows(Some(name.as_str()))?
            .pop()
            .map(|(_, inspection)| inspection))
    }

    fn list(&self) -> Result<Vec<(LockName, Inspection)>> {
        self.rows(None)
    }

    /// Whether releases elsewhere will wake our waiters (the session is up
    /// and listening).
    fn watch(&self, _name: &LockName) -> bool {
        self.listener.listening()
    }
}

impl Pg {
    fn attempt_on<K: Kept>(
        &self,
        line: &Line,
        name: &LockName,
        mode: Mode,
        deadline: Option<Instant>,
        arm: Arm<'_, PgLock, K>,
    ) -> Result<Attempt<K>> {
        let mut owner = OwnRecord::new(&self.holder_id, self.fields.as_ref(), self.lease, name);
        if mode != Mode::Exclusive {
            owner.mode = Some(mode.as_str());
            owner.permits = match mode {
                Mode::Permit(n) => Some(n),
                _ => None,
            };
        }
        let now = Instant::now();
        let slice = self.lease / 4;
        let budget = match deadline {
            Some(deadline) => deadline
                .saturating_duration_since(now)
                .max(ATTEMPT_FLOOR)
                .min(slice),
            None => slice,
        };
        let (reply, asked) = question();
        line.send(Command::TryLock {
            name: name.clone(),
            keys: Keys::of(name.as_str()),
            mode,
            owner: Box::new(owner),
            until: now + budget,
            line: line.clone(),
            reply,
        })?;
        let answer = match asked.wait(budget + ANSWER_GRACE) {
            Ok(Some(answer)) => answer?,
            // A lock granted from now on is given back to the session
            // thread, which lets it go.
            Ok(None) => Answer::Busy { sharers: false },
            Err(Unanswered) => return Err(session_stopped()),
        };
        Ok(attempted(answer, arm))
    }

    /// Removes the rows of holders gone for good (finds them, with
    /// `dry_run`): what `clean()` reports, one entry a row, each stale
    /// ([`StaleReason::DeadOwner`](crate::StaleReason::DeadOwner): the
    /// session that held it holds it no more, and its holder can no longer
    /// count itself one). An exclusive holder's row stays, without its
    /// owner: it keeps the name's fencing counter.
    pub(crate) fn clean(&self, dry_run: bool) -> Result<Vec<(LockName, Inspection)>> {
        Ok(self
            .line
            .clean(dry_run)?
            .into_iter()
            .filter_map(|(name, mode, mut holders)| {
                let owner = holders.pop()?;
                let inspection = Inspection {
                    holders: vec![owner.clone()],
                    owner,
                    mode,
                    stale: Some(crate::StaleReason::DeadOwner),
                    path: None,
                };
                Some((LockName::from_name(&name), inspection))
            })
            .collect())
    }

    /// The holders known to the table; only those whose advisory lock is
    /// held right now, so none is stale.
    fn rows(&self, name: Option<&str>) -> Result<Vec<(LockName, Inspection)>> {
        Ok(self
            .line
            .inspect(name)?
            .into_iter()
            .filter_map(|(name, mode, holders)| {
                let inspection = Inspection {
                    owner: holders.first()?.clone(),
                    holders,
                    mode,
                    stale: None,
                    path: None,
                };
                Some((LockName::from_name(&name), inspection))
            })
            .collect())
    }
}

/// What an attempt's answer means to its caller: the lock, armed where it
/// was taken (as with files), or busy.
fn attempted<K>(answer: Answer, arm: Arm<'_, PgLock, K>) -> Attempt<K> {
    match answer {
        Answer::Taken(lock, tokens) => Attempt::Acquired(arm(*lock, Some(tokens))),
        Answer::Busy { sharers } => Attempt::Busy {
            owner: None,
            recheck_at: None,
            sharers,
        },
        // Looked at again when that holder's lease is surely over.
        Answer::Wait(wait) => Attempt::Busy {
            owner: None,
            recheck_at: Some(SystemTime::now() + wait),
            sharers: false,
        },
    }
}

/// Upgradable shared locks (see `session/upgrade.rs`): each upgradable
/// holding has a session of its own, so that its upgrade waits for every
/// other holder of the name, this `Locker`'s shared guards included (they
/// share the `Locker`'s session, which the server never makes wait for
/// itself).
impl Upgrade for Pg {
    /// Starts the holding's own session and joins the name's holders on
    /// it, having taken the name's upgradable slot; the session closes
    /// (letting the slot go) when the attempt comes to nothing. Busy when
    /// the session does not connect within a quarter of the lease (at
    /// least a second, as for every call to a session thread), as an
    /// attempt the server does not answer is.
    fn join_upgradable<K: Kept>(&self, name: &LockName, arm: Arm<'_, PgLock, K>) -> Result<Attempt<K>> {
        let slot = upgradable_key(name.as_str());
        let session = Session::dedicated_to(Arc::clone(&self.target), self.lease, slot);
        let Some(line) = start_session(session, patience(self.lease))? else {
            return Ok(Attempt::Busy {
                owner: None,
                recheck_at: None,
                sharers: false,
            });
        };
        self.attempt_on(&line, name, Mode::Shared, None, arm)
    }

    fn upgrade<K: Kept>(
        &self,
        name: &LockName,
        share: &mut Option<PgLock>,
        arm: Arm<'_, PgLock, K>,
    ) -> Result<Attempt<K>> {
        let owner = OwnRecord::new(&self.holder_id, self.fields.as_ref(), self.lease, name);
        let Some(answer) = self.convert(share, false, owner)? else {
            return Ok(Attempt::Busy {
                owner: None,
                recheck_at: None,
                sharers: true,
            });
        };
        Ok(match attempted(answer, arm) {
            // Waiting for holders to leave, whoever they are: announced.
            Attempt::Busy {
                owner, recheck_at, ..
            } => Attempt::Busy {
                owner,
                recheck_at,
                sharers: true,
            },
            acquired => acquired,
        })
    }

    fn downgrade<K: Kept>(
        &self,
        name: &LockName,
        lock: &mut Option<PgLock>,
        arm: Arm<'_, PgLock, K>,
    ) -> Result<Option<K>> {
        let mut owner = OwnRecord::new(&self.holder_id, self.fields.as_ref(), self.lease, name);
        owner.mode = Some(Mode::Shared.as_str());
        Ok(match self.convert(lock, true, owner)? {
            Some(answer) => match attempted(answer, arm) {
                Attempt::Acquired(kept) => Some(kept),
                Attempt::Busy { .. } => None,
            },
            None => None,
        })
    }
}

impl Pg {
    /// Sends one upgrade (or downgrade) of `lock` to its session; `None`
    /// when the session did not answer in time. A lock made of it takes
    /// `lock`'s place (which is then taken, without an unlock).
    fn convert(
        &self,
        lock: &mut Option<PgLock>,
        downgrade: bool,
        owner: OwnRecord,
    ) -> Result<Option<Answer>> {
        let Some(held) = lock.as_ref() else {
            return Ok(None);
        };
        let budget = self.lease / 4;
        let (reply, asked) = question();
        held.line()
            .send(held.conversion(downgrade, owner, Instant::now() + budget, reply))?;
        let answer = match asked.wait(budget + ANSWER_GRACE) {
            Ok(Some(answer)) => answer?,
            // The session closes if it makes the lock after all (it is
            // given the answer back): the holding is then lost, and its
            // heartbeat says so.
            Ok(None) => return Ok(None),
            Err(Unanswered) => return Err(session_stopped()),
        };
        if matches!(answer, Answer::Taken(..))
            && let Some(old) = lock.take()
        {
            old.disarm();
        }
        Ok(Some(answer))
    }

    /// [`Backend::announce`] on the session of `share`, an upgradable
    /// holding's: its upgrade waits for readers of every session, this
    /// `Locker`'s too, and so keeps them all out.
    pub(crate) fn announce_on(&self, share: &PgLock, name: &LockName) -> Result<Option<Arc<dyn Renewable>>> {
        let every = (self.lease / 3).max(Duration::from_millis(1));
        let announced = share
            .line()
            .announce(name, Keys::of(name.as_str()), every, self.lease)?;
        Ok(announced.map(|a| Arc::new(a) as Arc<dyn Renewable>))
    }
}

// The tests start a PostgreSQL server of their own from Debian's binaries.
#[cfg(all(test, unix))]
#[path = "../tests/support/pg_server.rs"]
#[allow(unreachable_pub, missing_docs, missing_debug_implementations)]
mod pg_server;

#[cfg(all(test, unix))]
mod tests {
    use super::session::{LEAD, TOKEN_BLOCK, block};
    use super::*;

    /// The session thread owns the outcome of an attempt: a lock granted
    /// and recorded after its caller has gone is unlocked there.
    #[test]
    fn a_grant_whose_caller_is_gone_is_unlocked() {
        let server = pg_server::Server::start();
        let lease = Duration::from_secs(30);
        struct Nobody;
        impl crate::backend::Wake for Nobody {
            fn changed(&self, _: &str) {}
            fn all_changed(&self) {}
        }
        let nobody: Waiters = std::sync::Weak::<Nobody>::new();
        let target = Target::new(&Source::Url(server.url()), &TlsSettings::default()).unwrap();
        let store = Pg::connect(target, "test".into(), None, lease, nobody).unwrap();
        let name = LockName::from_name("gone");
        let (reply, asked) = question();
        drop(asked);
        store
            .line
            .send(Command::TryLock {
                owner: Box::new(OwnRecord::new("test", None, lease, &name)),
                name: name.clone(),
                keys: Keys::of("gone"),
                mode: Mode::Exclusive,
                until: Instant::now() + Duration::from_secs(10),
                line: store.line.clone(),
                reply,
            })
            .unwrap();
        // Commands run in order: once this answers, the attempt is over.
        assert!(store.list().unwrap().is_empty());
        let (recorded, locks): (i64, i64) = server.sql(|c| {
            let row = c
                .query_one(
                    "SELECT (SELECT fencing_token FROM leasehold_locks WHERE name = 'gone'),
                            (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory')",
                    &[],
                )
                .unwrap();
            (row.get(0), row.get(1))
        });
        // The one token of a new counter: the server's clock (this
        // host's: the server is local) in microseconds, plus the lead.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_micros()).unwrap())
            .unwrap();
        assert!(
            (now - 60_000_000..now + 60_000_000).contains(&(recorded - LEAD - 1)),
            "the lock was granted and recorded: {recorded} at {now}"
        );
        assert_eq!(locks, 0, "then let go");
    }

    #[test]
    fn keys_are_stable_and_distinct() {
        assert_eq!(key("reindex"), key("reindex"));
        assert_ne!(key("reindex"), key("reindex2"));
        // Pinned to literal values (the first 8 bytes, big-endian, of
        // SHA-256 of "leasehold\0" + name, computed independently):
        // changing the derivation would let two versions hold one name at
        // once.
        assert_eq!(key(""), 881_046_124_959_875_681);
        assert_eq!(key("reindex"), -4_731_462_604_616_021_856);
        assert_eq!(key("nightly-report"), 2_890_748_606_779_939_386);
        assert_eq!(key("ünïcode/name"), -1_729_549_082_967_962_973);
        // The same, as the bytes of the digest (SHA-256 of "leasehold\0" +
        // name, first 8 bytes, as `sha256sum` prints them).
        assert_eq!(
            key("reindex").to_be_bytes(),
            [0xbe, 0x56, 0x77, 0xd4, 0x57, 0xd1, 0x48, 0xa0]
        );
        assert_eq!(
            key("nightly-report").to_be_bytes(),
            [0x28, 0x1e, 0x00, 0x8a, 0xc2, 0x12, 0xda, 0x3a]
        );
        // The keys of a name's other roles, pinned the same way (SHA-256
        // of "leasehold-" + role + "\0" + name, and "\0" + the big-endian
        // index for a slot): every version must agree on them too.
        let keys = Keys::of("reindex");
        assert_eq!(keys.name, key("reindex"));
        assert_eq!(keys.intent, -2_873_772_019_053_410_495);
        assert_eq!(keys.join, -8_327_747_811_861_364_901);
        assert_eq!(slot_key("reindex", 0), -4_442_260_240_349_315_333);
        assert_eq!(slot_key("reindex", 7), 1_983_168_917_083_701_099);
        assert_eq!(upgradable_key("reindex"), -3_256_819_521_775_627_800);
        assert_eq!(
            upgradable_key("reindex").to_be_bytes(),
            [0xd2, 0xcd, 0x73, 0xe6, 0x7b, 0x01, 0x91, 0xe8]
        );
        let t = block(1025, 2048);
        assert_eq!((t.next, t.last), (1025, 2048));
        assert_eq!(TOKEN_BLOCK * 8, LEAD);
    }
}
