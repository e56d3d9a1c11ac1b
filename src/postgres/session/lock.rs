//! [`PgLock`], a lock held on the session, and the way to the session
//! thread ([`Line`]) and what it is asked to do ([`Command`]).

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::connection::Held;
use super::inspect::Found;
use crate::backend::{BackendLock, Mode, Renewal, Tokens};
use crate::error::{Error, LossReason, Result};
use crate::name::LockName;
use crate::postgres::Keys;
use crate::record::OwnRecord;
use crate::sys;

/// How long a new session may take to connect before the `Locker` (or
/// the upgradable acquisition) that starts it gives up; and how long an
/// inspection keeps asking while the owner tables are locked (each answer
/// waited for at most [`patience`]).
pub(in crate::postgres) const ANSWER_PATIENCE: Duration = Duration::from_secs(30);

/// The longest a caller waits for the session thread's answer to anything
/// but an attempt (which its deadline bounds) or a heartbeat (which its
/// cutoff bounds): an inspection (`holder()`, `holders()`, `list()`), a
/// refill of fencing tokens, a confirmed release, a check that the lock
/// is held, an exclusive waiter's announcement. A quarter of the lease,
/// at least a second: the thread gives any one attempt at most a quarter
/// of the lease, and any other statement that waits for a table an
/// eighth, so a caller queued behind one of them is answered in time, and
/// one queued behind a session the server stopped answering is told so
/// ([`no_answer`]) rather than kept waiting until the keepalives end it.
pub(in crate::postgres) fn patience(lease: Duration) -> Duration {
    (lease / 4).max(Duration::from_secs(1))
}

/// The way back to a caller that may stop waiting for the answer (its
/// other end is an [`Asked`]): the session thread sends the answer only
/// if the caller has not given up, and a caller giving up looks for the
/// answer once more, both under one lock. So every answer is either
/// taken by its caller or given back to the session thread, which then
/// undoes what it did for nobody (lets a lock go, withdraws an
/// announcement, closes an upgradable holding's session); none is left
/// where nobody reads it, as an answer sent in the instant between a
/// caller's wait running out and its letting go of the channel was.
#[derive(Debug)]
pub(crate) struct Reply<T> {
    sender: Sender<T>,
    gave_up: Arc<Mutex<bool>>,
}

impl<T> Reply<T> {
    /// Sends `answer` to the caller; gives it back if the caller gave up
    /// waiting (or is gone).
    pub(crate) fn send(self, answer: T) -> std::result::Result<(), T> {
        let gave_up = self.gave_up.lock().unwrap_or_else(|e| e.into_inner());
        if *gave_up {
            return Err(answer);
        }
        self.sender.send(answer).map_err(|mpsc::SendError(answer)| answer)
    }
}

/// The caller's end of a [`Reply`].
#[derive(Debug)]
pub(crate) struct Asked<T> {
    answer: Receiver<T>,
    gave_up: Arc<Mutex<bool>>,
}

/// The session thread stopped before it answered.
#[derive(Debug)]
pub(crate) struct Unanswered;

/// A question's two ends: the [`Reply`] goes into the command, the
/// caller waits on the [`Asked`].
pub(crate) fn question<T>() -> (Reply<T>, Asked<T>) {
    let (sender, answer) = mpsc::channel();
    let gave_up = Arc::new(Mutex::new(false));
    let reply = Reply {
        sender,
        gave_up: Arc::clone(&gave_up),
    };
    (reply, Asked { answer, gave_up })
}

impl<T> Asked<T> {
    /// The answer, if it comes within `patience`; `None` if it did not,
    /// and then it never comes (the session thread is given it back).
    pub(crate) fn wait(self, patience: Duration) -> std::result::Result<Option<T>, Unanswered> {
        match self.answer.recv_timeout(patience) {
            Ok(answer) => Ok(Some(answer)),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(Unanswered),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = failpoint!("postgres.call.gave_up");
                let mut gave_up = self.gave_up.lock().unwrap_or_else(|e| e.into_inner());
                *gave_up = true;
                // Sent before we gave up: ours after all.
                Ok(self.answer.try_recv().ok())
            }
        }
    }
}

/// What one attempt found.
#[derive(Debug)]
pub(in crate::postgres) enum Answer {
    /// Taken, with the first block of fencing tokens.
    Taken(Box<PgLock>, Tokens),
    /// Held elsewhere; `sharers` when held shared (or by permit holders).
    Busy { sharers: bool },
    /// Free on the server, but an earlier holder whose session ended may
    /// still count itself a holder for this long.
    Wait(Duration),
}

/// What the session thread is asked to do.
pub(in crate::postgres) enum Command {
    TryLock {
        name: LockName,
        keys: Keys,
        mode: Mode,
        owner: Box<OwnRecord>,
        /// When the attempt must be over: the caller stops waiting for the
        /// answer shortly after.
        until: Instant,
        /// For the [`PgLock`] that the answer carries.
        line: Line,
        reply: Reply<Result<Answer>>,
    },
    Unlock {
        name: String,
        key: i64,
        held: Held,
        /// The holder row's id (shared holders and permit holders).
        id: String,
        generation: u64,
        reply: Option<Reply<Result<bool>>>,
    },
    Heartbeat {
        key: i64,
        generation: u64,
        reply: Reply<Result<bool>>,
    },
    Reserve {
        name: String,
        key: i64,
        held: Held,
        generation: u64,
        reply: Reply<Result<Option<Tokens>>>,
    },
    /// `None` in the answer: the owner tables were locked; ask again.
    Inspect {
        name: Option<String>,
        reply: Reply<Result<Option<Vec<Found>>>>,
    },
    /// Removes the rows of holders gone for good (only finds them with
    /// `dry_run`). `None` in the answer: the owner tables were locked.
    Clean {
        dry_run: bool,
        reply: Reply<Result<Option<Vec<Found>>>>,
    },
    /// An exclusive waiter announces itself (takes the intent key, and
    /// says until when it waits), or renews that (and takes the key again
    /// after a reconnection).
    Announce {
        name: String,
        key: i64,
        intent: i64,
        /// How long the announcement holds without a renewal.
        lease_ms: i64,
        /// A renewal, of an `Announcement` that lives until its own
        /// `Withdraw`: never withdrawn for coming too late.
        renewal: bool,
        reply: Reply<Result<bool>>,
    },
    /// The waiter is done waiting: lets the intent key go.
    Withdraw { name: String, key: i64, intent: i64 },
    /// One attempt to upgrade the share of an upgradable holding (its row
    /// `id`), on its dedicated session, to the exclusive lock recorded for
    /// `owner`.
    Upgrade {
        name: LockName,
        keys: Keys,
        id: String,
        generation: u64,
        owner: Box<OwnRecord>,
        until: Instant,
        line: Line,
        reply: Reply<Result<Answer>>,
    },
    /// Turns an upgraded lock back into its holding's share, recorded for
    /// `owner`.
    Downgrade {
        name: LockName,
        keys: Keys,
        generation: u64,
        owner: Box<OwnRecord>,
        until: Instant,
        line: Line,
        reply: Reply<Result<Answer>>,
    },
}

/// The way to the session thread. The thread runs until every `Line` is
/// gone (the store's and every lock's); closing the connection then drops
/// whatever is left on the server.
#[derive(Debug, Clone)]
pub(crate) struct Line {
    sender: Sender<Command>,
    /// How long a caller waits for an answer ([`patience`]).
    patience: Duration,
}

/// The session thread is gone (it could not start a thread, or stopped).
pub(in crate::postgres) fn session_stopped() -> Error {
    Error::Backend {
        op: "reach the PostgreSQL session thread",
        source: "the session thread has stopped".into(),
    }
}

/// The session thread did not answer within `waited` (busy with a slower
/// statement, or waiting for a server that does not answer): an
/// [`Error::Backend`] whose source is an [`std::io::Error`] of kind
/// [`TimedOut`](std::io::ErrorKind::TimedOut).
pub(in crate::postgres) fn no_answer(op: &'static str, waited: Duration) -> Error {
    Error::Backend {
        op,
        source: Box::new(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the PostgreSQL session did not answer within {waited:?}"),
        )),
    }
}

/// Whether `error` is [`no_answer`]'s: the session thread did not answer
/// in time.
pub(in crate::postgres) fn timed_out(error: &Error) -> bool {
    matches!(error, Error::Backend { source, .. }
        if source.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::TimedOut))
}

impl Line {
    /// The way to a session thread that takes commands from `sender`, whose
    /// callers wait [`patience`]`(lease)` for an answer.
    pub(in crate::postgres) fn new(sender: Sender<Command>, lease: Duration) -> Line {
        Line {
            sender,
            patience: patience(lease),
        }
    }

    pub(in crate::postgres) fn send(&self, command: Command) -> Result<()> {
        self.sender.send(command).map_err(|_| session_stopped())
    }

    /// Asks the session thread, waiting for its answer at most the
    /// line's [`patience`].
    pub(super) fn call<T>(&self, make: impl FnOnce(Reply<Result<T>>) -> Command) -> Result<T> {
        self.call_within(self.patience, make)
    }

    /// As [`call`](Self::call), waiting at most `patience` for the answer.
    pub(super) fn call_within<T>(
        &self,
        patience: Duration,
        make: impl FnOnce(Reply<Result<T>>) -> Command,
    ) -> Result<T> {
        let (reply, asked) = question();
        self.send(make(reply))?;
        match asked.wait(patience) {
            Ok(Some(answer)) => answer,
            Ok(None) => Err(no_answer("wait for the PostgreSQL session", patience)),
            Err(Unanswered) => Err(session_stopped()),
        }
    }

    /// Every live holder known to the tables, by name. Each answer of the
    /// session thread is waited for at most the line's [`patience`]. While
    /// the tables are locked (a DBA's `LOCK TABLE`, a schema change), the
    /// thread answers that after the session's `stall`, and this waits a
    /// little before asking again, so the heartbeats queued meanwhile get
    /// through; for at most [`ANSWER_PATIENCE`] in all.
    pub(in crate::postgres) fn inspect(&self, name: Option<&str>) -> Result<Vec<Found>> {
        self.while_locked("read lock owners", |reply| Command::Inspect {
            name: name.map(str::to_owned),
            reply,
        })
    }

    /// The rows of holders gone for good, removed unless `dry_run` (see
    /// `inspect.rs`, `CLEAN`): one entry a row. Waits as
    /// [`inspect`](Self::inspect) does.
    pub(in crate::postgres) fn clean(&self, dry_run: bool) -> Result<Vec<Found>> {
        self.while_locked("clean the owner tables", |reply| Command::Clean {
            dry_run,
            reply,
        })
    }

    /// Asks the session thread `make`'s command until it answers other
    /// than `None` (the owner tables were locked), as
    /// [`inspect`](Self::inspect) says.
    fn while_locked(
        &self,
        op: &'static str,
        make: impl Fn(Reply<Result<Option<Vec<Found>>>>) -> Command,
    ) -> Result<Vec<Found>> {
        let until = Instant::now() + ANSWER_PATIENCE;
        let mut pause = Duration::from_millis(5);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let found = self
                .call_within(left.min(self.patience), &make)
                .map_err(|error| match error {
                    Error::Backend { source, .. } => Error::Backend { op, source },
                    other => other,
                })?;
            if let Some(found) = found {
                return Ok(found);
            }
            if Instant::now() + pause >= until {
                return Err(no_answer(op, ANSWER_PATIENCE));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Command")
    }
}

/// A lock held on the server by this `Locker`'s session.
#[derive(Debug)]
pub(crate) struct PgLock {
    pub(super) line: Line,
    pub(super) name: LockName,
    pub(super) key: i64,
    pub(super) held: Held,
    /// The session the lock was taken on; any later one does not hold it.
    pub(super) generation: u64,
    pub(super) record: OwnRecord,
    pub(super) armed: bool,
}

impl PgLock {
    /// The key whose lock is this holder's own: the permit slot's for a
    /// permit, the name's otherwise.
    fn own_key(&self) -> i64 {
        match self.held {
            Held::Permit { slot, .. } => slot,
            _ => self.key,
        }
    }

    /// Asks the session whether it still holds the lock, waiting at most
    /// `patience` for the answer.
    fn heartbeat(&self, patience: Duration) -> Result<bool> {
        let (key, generation) = (self.own_key(), self.generation);
        self.line.call_within(patience, |reply| Command::Heartbeat {
            key,
            generation,
            reply,
        })
    }

    fn unlock(&self, reply: Option<Reply<Result<bool>>>) -> Command {
        Command::Unlock {
            name: self.name.as_str().to_owned(),
            key: self.key,
            held: self.held,
            id: self.record.uuid.clone(),
            generation: self.generation,
            reply,
        }
    }
}

impl PgLock {
    /// The command for one attempt to upgrade this share of an upgradable
    /// holding (`downgrade`: to downgrade this upgraded lock), recorded
    /// for `owner`, over by `until`.
    pub(in crate::postgres) fn conversion(
        &self,
        downgrade: bool,
        owner: OwnRecord,
        until: Instant,
        reply: Reply<Result<Answer>>,
    ) -> Command {
        let (name, keys, generation) = (self.name.clone(), Keys::of(self.name.as_str()), self.generation);
        let (owner, line) = (Box::new(owner), self.line.clone());
        if downgrade {
            Command::Downgrade {
                name,
                keys,
                generation,
                owner,
                until,
                line,
                reply,
            }
        } else {
            Command::Upgrade {
                name,
                keys,
                id: self.record.uuid.clone(),
                generation,
                owner,
                until,
                line,
                reply,
            }
        }
    }

    /// The way to the session this lock is held on.
    pub(in crate::postgres) fn line(&self) -> &Line {
        &self.line
    }

    /// Forgets this lock without unlocking it: an upgrade or downgrade
    /// turned it into another lock on the same session.
    pub(in crate::postgres) fn disarm(mut self) {
        self.armed = false;
    }
}

impl BackendLock for PgLock {
    fn record(&self) -> &OwnRecord {
        &self.record
    }

    /// The heartbeat: the session is alive and still holds the lock.
    ///
    /// The lease is renewed from when the heartbeat was *sent*: the server
    /// found the lock held after that, so the holder's lease (and with it
    /// the time it counts itself a holder) never ends later than a lease
    /// after the last moment the server knew it held the lock, which is
    /// what a taker after a lost session waits out (`tables::STAMP`).
    /// The answer is waited for only until the cutoff: a server that does
    /// not answer (a stopped backend, a cut network) costs the lock at the
    /// cutoff, not later.
    fn renew(&mut self, cutoff: u64) -> Result<Renewal> {
        let (sent, sent_boot) = (SystemTime::now(), sys::boot_clock_ms());
        if sent_boot >= cutoff {
            return Ok(Renewal::Lost(LossReason::LeaseExpired));
        }
        let patience = Duration::from_millis(cutoff - sent_boot).min(ANSWER_PATIENCE);
        match self.heartbeat(patience) {
            Ok(true) => {}
            Ok(false) => return Ok(Renewal::Lost(LossReason::SessionLost)),
            Err(_) if sys::boot_clock_ms() >= cutoff => return Ok(Renewal::Lost(LossReason::LeaseExpired)),
            Err(error) => return Err(error),
        }
        if sys::boot_clock_ms() >= cutoff {
            return Ok(Renewal::Lost(LossReason::LeaseExpired));
        }
        self.record.renew(sent, sent_boot);
        Ok(Renewal::Renewed)
    }

    fn check(&self) -> Result<Option<LossReason>> {
        Ok((!self.heartbeat(self.line.patience)?).then_some(LossReason::SessionLost))
    }

    fn reserve_tokens(&mut self) -> Result<Option<Tokens>> {
        let (key, held, generation, name) = (
            self.key,
            self.held,
            self.generation,
            self.name.as_str().to_owned(),
        );
        self.line.call(|reply| Command::Reserve {
            name,
            key,
            held,
            generation,
            reply,
        })
    }

    /// Unlocks: with `confirm`, waits for the server's answer (at most the
    /// line's [`patience`]: the unlock stays queued, and is carried out,
    /// if it comes later); without,
    /// queues the unlock (the session thread sends it at once), as `Drop`
    /// does.
    fn release(mut self, confirm: bool) -> Result<Option<LossReason>> {
        if !confirm {
            return Ok(None); // Drop queues it.
        }
        self.armed = false;
        let released = self.line.call(|reply| self.unlock(Some(reply)))?;
        Ok((!released).then_some(LossReason::SessionLost))
    }
}

impl Drop for PgLock {
    /// Queues the unlock on the session without waiting for it: the
    /// session thread sends it at once.
    fn drop(&mut self) {
        if std::mem::take(&mut self.armed)
            && let Err(error) = self.line.send(self.unlock(None))
        {
            tracing::warn!(lock = self.name.as_str(), %error, "cannot queue an unlock");
        }
    }
}
