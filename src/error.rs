//! The one error type.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::field::InvalidFields;
use crate::mode::Mode;
use crate::name::InvalidName;
use crate::owner::Owner;

/// A specialized [`Result`](std::result::Result) for leasehold operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while taking, holding or inspecting a lock.
///
/// Variants carry the lock name, the path and the operation involved, so a
/// log line is enough to find the cause. `Display` never repeats the
/// [`source`](std::error::Error::source), so walk the chain when you print.
///
/// `Debug` is written for people, not for code: it is what a `main` that
/// returns `Result<(), leasehold::Error>` prints on failure, so it says the
/// variant's name, the `Display` text and every cause in the chain, on one
/// line (`Timeout: timed out after 2s waiting for lock "jobs" held by pid
/// 4242 on build-7 since 2026-12-04T11:20:05.120Z`). Code that needs the
/// fields matches on the variant, or asks [`Error::holder`].
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// use std::time::Duration;
/// use leasehold::{Error, Locker};
///
/// let dir = tempfile::tempdir().unwrap();
/// let locker = Locker::new(dir.path())?;
/// let _held = locker.acquire("reindex").await?;
///
/// let other = Locker::new(dir.path())?;
/// match other.acquire_timeout("reindex", Duration::from_millis(20)).await {
///     Err(Error::Timeout { name, .. }) => assert_eq!(name, "reindex"),
///     other => panic!("expected a timeout, got {other:?}"),
/// }
/// # Ok(()) }
/// ```
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `acquire_timeout` ran out of time while another holder kept the lock.
    ///
    /// Its message names the holder last seen, when there was one: `timed
    /// out after 2s waiting for lock "jobs" held by pid 4242 on build-7
    /// since 2026-12-04T11:20:05.120Z`. [`Error::holder`] returns it.
    #[error("timed out after {waited:?} waiting for lock {name:?}{}", held_by(.holder.as_deref()))]
    #[non_exhaustive]
    Timeout {
        /// The lock name.
        name: String,
        /// How long the caller waited.
        waited: Duration,
        /// The holder last seen, when the waiter read one: the record it
        /// found at the lock on its last attempt. `None` when it never
        /// read one: it waited only behind other tasks of its own
        /// `Locker`, or the record was unreadable. Always `None` on
        /// PostgreSQL, whose failed attempts say nothing of the holder (a
        /// read of the owner table could stall on the server past the
        /// deadline, and on the session every lock's heartbeat shares):
        /// ask [`Locker::holder`](crate::Locker::holder) instead.
        holder: Option<Box<Owner>>,
    },

    /// The lock name cannot be used (empty, contains NUL, longer than
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN), or is not a valid plain file
    /// name where one is required). Its message quotes at most the first
    /// 64 characters of the name.
    #[error("invalid lock name {}: {reason}", quoted_start(.name))]
    InvalidName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// The builder was given settings that cannot work together.
    #[error("invalid configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },

    /// The lock directory is unsafe to use, for example world-writable
    /// without the sticky bit, so anyone could replace or remove locks.
    #[error("refusing lock directory {path}: {reason}")]
    InsecureDirectory {
        /// The directory.
        path: PathBuf,
        /// What makes it unsafe.
        reason: &'static str,
    },

    /// No directory was given, and the per-user default
    /// (`/run/lock/leasehold-<uid>` on Linux, `leasehold` in the user's
    /// local application data on Windows, `/tmp/leasehold-<uid>`
    /// elsewhere) cannot be used here: its parent is missing or unsafe,
    /// this user may not create it, or this process may see another
    /// directory at its path than other processes of the user do (a mount
    /// namespace with a mount of its own there). The default is never
    /// replaced by another place, which some other process might not
    /// choose: give a directory with
    /// [`LockerBuilder::directory`](crate::LockerBuilder::directory)
    /// (`--dir` or `LEASEHOLD_DIR` for the `leasehold` command).
    #[error(
        "no default lock directory {path}: {reason}; choose one with `.directory(...)` \
         (`--dir` or `LEASEHOLD_DIR` for the leasehold command)"
    )]
    #[non_exhaustive]
    NoDefaultDirectory {
        /// The default directory that was refused.
        path: PathBuf,
        /// Why it cannot be used.
        reason: &'static str,
        /// The failure behind it, if one.
        #[source]
        source: Option<io::Error>,
    },

    /// Something that is not a lock file occupies a lock's path (a
    /// directory, a symlink, a FIFO, a socket), or a file (for the
    /// directory strategy, a directory) whose content no lock writer
    /// produces, even cut short by a crash: a `Cargo.lock`, a pid file, a
    /// JSON object that names no holder. leasehold never follows or
    /// removes it, and does not wait for it; remove it yourself if it is
    /// not in use, or use another lock name or directory.
    #[error("lock {name:?}: {path} is a {found}, not a lock file")]
    UnexpectedFile {
        /// The lock name.
        name: String,
        /// The occupied path.
        path: PathBuf,
        /// What was found there.
        found: &'static str,
    },

    /// The operating system denied access.
    #[error("permission denied: cannot {op} {path}")]
    PermissionDenied {
        /// The operation, e.g. `"create lock file"`.
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// Any other I/O failure.
    #[error("cannot {op} {path}")]
    Io {
        /// The operation, e.g. `"read lock record"`.
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// A lock this guard held is no longer ours: its lease ran out, the
    /// lock was removed or replaced, or the lock directory was moved.
    #[error("lock {name:?} was lost: {reason}")]
    Lost {
        /// The lock name.
        name: String,
        /// What happened; match on it to tell the causes apart.
        reason: LossReason,
    },

    /// The lock directory's path no longer names the directory the
    /// `Locker` opened at `build()`: it was moved, removed or replaced
    /// (`mv locks locks.old && mkdir locks`, a cleanup job). Locks taken
    /// there would be invisible to every process that opens the path now,
    /// so this `Locker` takes none; build a new one.
    #[error("the lock directory {path} was moved, removed or replaced after the Locker opened it")]
    DirectoryReplaced {
        /// The directory's path, as resolved at `build()`.
        path: PathBuf,
    },

    /// The name is held as another kind of lock than the one asked for:
    /// shared holders found a semaphore, or a semaphore of another permit
    /// count (processes must agree on a semaphore's count: see
    /// [`Locker::semaphore`](crate::Locker::semaphore)). Exclusive
    /// acquisitions never get this: they wait for every kind.
    #[error("lock {name:?} is held as {held}, not as {asked}")]
    KindMismatch {
        /// The lock name.
        name: String,
        /// How it is held, e.g. `"a semaphore of 3 permits"`.
        held: String,
        /// How it was asked for, e.g. `"shared"`.
        asked: String,
    },

    /// The acquisition would wait for a lock its own scope holds: an
    /// exclusive acquisition of a name that the current
    /// [`scope`](crate::Locker::scope) holds shared. Upgrades are not
    /// offered (two scopes upgrading at once would wait for each other
    /// forever); release the shared guard first.
    #[error("acquiring {name:?} exclusively would wait forever: this scope holds it shared")]
    WouldDeadlock {
        /// The lock name.
        name: String,
    },

    /// The `Locker` (or a clone of it) was shut down with
    /// [`Locker::release_all`](crate::Locker::release_all): it takes no
    /// lock any more. Every acquisition after that call fails with this,
    /// at once, and so does every acquisition that was waiting when it
    /// was made. Build a new `Locker` to take locks again.
    #[error("cannot acquire lock {name:?}: its Locker was shut down by release_all")]
    ShutDown {
        /// The lock name.
        name: String,
    },

    /// The lock server (PostgreSQL) failed or could not be reached.
    #[error("cannot {op}")]
    Backend {
        /// The operation, e.g. `"take an advisory lock"`.
        op: &'static str,
        /// The server's or client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A table the PostgreSQL backend keeps its holders and fencing
    /// counters in (`leasehold_locks`, `leasehold_holders`) was dropped,
    /// or is missing, on the server. The attempt that found it gone fails;
    /// the `Locker` creates the table again before its next one. Locks
    /// held meanwhile are kept (they are held on the server, not in the
    /// table), and fencing tokens keep growing: they count the server's
    /// clock.
    #[error(
        "cannot {op}: the PostgreSQL table {table} was dropped or is missing (it is created again at the next attempt)"
    )]
    #[non_exhaustive]
    MissingTable {
        /// The table, e.g. `"leasehold_locks"`.
        table: &'static str,
        /// The operation, e.g. `"record the lock owner"`.
        op: &'static str,
    },

    /// The PostgreSQL connection does not keep one server session of its
    /// own, as session advisory locks need: a pooler in transaction (or
    /// statement) mode, such as PgBouncer with `pool_mode = transaction`,
    /// runs each statement on whichever server session is free, so a lock
    /// taken by one statement would exclude nothing in the next. Found
    /// when a `Locker` connects (or reconnects), before any lock is taken.
    /// Connect directly to the server, or through the pooler in session
    /// mode (PgBouncer `pool_mode = session`).
    ///
    /// ```
    /// use leasehold::Error;
    ///
    /// /// What went wrong with a `Locker` that would not build.
    /// fn explain(err: &Error) -> String {
    ///     match err {
    ///         Error::UnstableSession { found, .. } => format!("behind a transaction pooler: {found}"),
    ///         other => other.to_string(),
    ///     }
    /// }
    /// # let _ = explain;
    /// ```
    #[error(
        "the PostgreSQL session is not stable ({found}): session advisory locks would exclude nothing; \
         a pooler in transaction pooling mode (PgBouncer pool_mode = transaction or statement) does this: \
         connect directly to the server, or through the pooler in session mode (pool_mode = session)"
    )]
    #[non_exhaustive]
    UnstableSession {
        /// What the connection showed, e.g. `"the server session changed
        /// between two statements"`.
        found: &'static str,
    },

    /// The Tokio runtime shut down before a blocking operation could run.
    #[error("cannot {op}: the Tokio runtime is shutting down")]
    Runtime {
        /// The operation, e.g. `"run a lock operation on the blocking pool"`.
        op: &'static str,
    },

    /// The platform (or the backend) lacks what was asked: a filesystem
    /// without `flock` or `renameat2`, a lock path on a server, a Tokio
    /// runtime for `acquire`; or a `blocking_*` method called inside a
    /// Tokio runtime, where it would block a worker.
    #[error("unsupported: {what}")]
    Unsupported {
        /// What is not supported.
        what: &'static str,
    },
}

/// The variant's name, the message and the causes after it, on one line:
/// what a user reads when `main` returns the error, instead of a derived
/// dump of nested structs and `SystemTime` internals.
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {self}", self.variant())?;
        let mut cause = std::error::Error::source(self);
        while let Some(error) = cause {
            write!(f, ": {error}")?;
            cause = error.source();
        }
        Ok(())
    }
}

impl From<InvalidName> for Error {
    fn from(InvalidName { name, reason }: InvalidName) -> Self {
        Error::InvalidName { name, reason }
    }
}

impl From<InvalidFields> for Error {
    fn from(InvalidFields { reason }: InvalidFields) -> Self {
        Error::InvalidConfig { reason }
    }
}

impl Error {
    /// The variant's name, as `Debug` starts with it.
    fn variant(&self) -> &'static str {
        match self {
            Error::Timeout { .. } => "Timeout",
            Error::InvalidName { .. } => "InvalidName",
            Error::InvalidConfig { .. } => "InvalidConfig",
            Error::InsecureDirectory { .. } => "InsecureDirectory",
            Error::NoDefaultDirectory { .. } => "NoDefaultDirectory",
            Error::UnexpectedFile { .. } => "UnexpectedFile",
            Error::PermissionDenied { .. } => "PermissionDenied",
            Error::Io { .. } => "Io",
            Error::Lost { .. } => "Lost",
            Error::DirectoryReplaced { .. } => "DirectoryReplaced",
            Error::KindMismatch { .. } => "KindMismatch",
            Error::WouldDeadlock { .. } => "WouldDeadlock",
            Error::ShutDown { .. } => "ShutDown",
            Error::Backend { .. } => "Backend",
            Error::MissingTable { .. } => "MissingTable",
            Error::UnstableSession { .. } => "UnstableSession",
            Error::Runtime { .. } => "Runtime",
            Error::Unsupported { .. } => "Unsupported",
        }
    }

    /// The error for an acquisition of `name` as `asked` while the name is
    /// held as `held`.
    pub(crate) fn kind_mismatch(name: &str, asked: Mode, held: Mode) -> Self {
        Error::KindMismatch {
            name: name.to_owned(),
            held: held.describe(),
            asked: asked.describe(),
        }
    }

    /// Whether this is an I/O error whose cause is a missing file, or a
    /// file lock taken at that instant: what a step that races others
    /// tries again.
    pub(crate) fn is_not_found(&self) -> bool {
        matches!(self, Error::Io { source, .. }
            if matches!(source.kind(), io::ErrorKind::NotFound | io::ErrorKind::WouldBlock))
    }

    /// Whether this is an I/O error whose cause is a lock (a `flock`) that
    /// another process holds.
    pub(crate) fn is_would_block(&self) -> bool {
        matches!(self, Error::Io { source, .. } if source.kind() == io::ErrorKind::WouldBlock)
    }

    /// Wraps an I/O error, sorting permission failures into their own kind.
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        let path = path.into();
        if source.kind() == io::ErrorKind::PermissionDenied {
            Error::PermissionDenied { op, path, source }
        } else {
            Error::Io { op, path, source }
        }
    }

    /// Whether this error says the lock was lost.
    ///
    /// ```
    /// use leasehold::{Error, LossReason};
    /// let err = Error::Lost { name: "jobs".into(), reason: LossReason::LeaseExpired };
    /// assert!(err.is_lost());
    /// ```
    pub fn is_lost(&self) -> bool {
        matches!(self, Error::Lost { .. })
    }

    /// Whether this error is a timeout.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use std::time::Duration;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _held = locker.acquire("jobs").await?;
    /// let other = leasehold::Locker::new(dir.path())?;
    /// let err = other.acquire_timeout("jobs", Duration::from_millis(10)).await.unwrap_err();
    /// assert!(err.is_timeout() && !err.is_lost());
    /// # Ok(()) }
    /// ```
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// The holder a timed-out acquisition last saw ([`Error::Timeout`]'s
    /// `holder`): who kept the lock, as its record said. `None` for other
    /// errors, and for a timeout that never read a holder's record.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use std::time::Duration;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _held = locker.acquire("jobs").await?;
    ///
    /// let other = leasehold::Locker::new(dir.path())?;
    /// let err = other.acquire_timeout("jobs", Duration::from_millis(50)).await.unwrap_err();
    /// let holder = err.holder().expect("the waiter read the holder's record");
    /// assert_eq!(holder.pid(), Some(std::process::id()));
    /// assert!(err.to_string().contains(&format!("held by pid {}", std::process::id())));
    /// # Ok(()) }
    /// ```
    pub fn holder(&self) -> Option<&Owner> {
        match self {
            Error::Timeout { holder, .. } => holder.as_deref(),
            _ => None,
        }
    }
}

/// ` held by pid P on HOST since T`, as much of it as the record says;
/// empty without a holder.
/// `name` quoted, cut to its first 64 characters (and their byte count
/// said) when longer: a name refused for its length can be of any length.
fn quoted_start(name: &str) -> String {
    const SHOWN: usize = 64;
    match name.char_indices().nth(SHOWN) {
        None => format!("{name:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &name[..cut], name.len()),
    }
}

pub(crate) fn held_by(holder: Option<&Owner>) -> String {
    let Some(owner) = holder else {
        return String::new();
    };
    let mut text = String::from(" held by");
    match owner.pid() {
        Some(pid) => text.push_str(&format!(" pid {pid}")),
        None if !owner.is_readable() => text.push_str(" an unreadable record"),
        None => text.push_str(" a process of unknown pid"),
    }
    if let Some(host) = owner.hostname() {
        text.push_str(&format!(" on {}", host.escape_debug()));
    }
    if let Some(since) = owner.acquired_at() {
        text.push_str(&format!(" since {}", crate::timestamp::format_time(since)));
    }
    text
}

/// Attaches the operation and the path to a failed system call: the one
/// way leasehold builds an [`Error::Io`] (or [`Error::PermissionDenied`])
/// from an OS error, after tempfile's `IoResultExt`.
pub(crate) trait IoResultExt<T> {
    /// `Err` becomes [`Error::io`] of `op` on the path that `path` returns
    /// (computed only on failure).
    fn context<P: Into<PathBuf>>(self, op: &'static str, path: impl FnOnce() -> P) -> Result<T>;
}

impl<T, E: Into<io::Error>> IoResultExt<T> for std::result::Result<T, E> {
    fn context<P: Into<PathBuf>>(self, op: &'static str, path: impl FnOnce() -> P) -> Result<T> {
        self.map_err(|e| Error::io(op, path(), e.into()))
    }
}

/// Why a held lock was lost, carried by [`Error::Lost`].
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// use leasehold::{Error, Locker, LossReason};
///
/// let dir = tempfile::tempdir().unwrap();
/// let locker = Locker::new(dir.path())?;
/// let guard = locker.acquire("jobs").await?;
/// std::fs::remove_file(locker.lock_path("jobs")?).unwrap(); // someone removes it
/// match guard.release().await {
///     Err(Error::Lost { reason: LossReason::Replaced, .. }) => {}
///     other => panic!("expected a loss by replacement, got {other:?}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LossReason {
    /// The lease ran out before it could be renewed (the process was
    /// paused, or the renewal thread could not run in time).
    #[error("the lease ran out before it could be renewed")]
    LeaseExpired,
    /// Someone else removed or replaced the lock (a reclaim after the lease
    /// ran out, an operator deleting the lock file).
    #[error("the lock was removed or replaced by someone else")]
    Replaced,
    /// The lock directory's path no longer names the directory the lock
    /// is in: it was moved, removed or replaced.
    #[error("the lock directory {path} was moved, removed or replaced")]
    DirectoryReplaced {
        /// The directory's path, as resolved at `build()`.
        path: PathBuf,
    },
    /// Renewals failed (for example the disk is full or read-only) until
    /// the lease came within its safety margin of running out.
    #[error("renewals kept failing until the lease ran out ({error})")]
    RenewalFailed {
        /// The last renewal error, as text.
        error: String,
    },
    /// The lock server's session that held the lock ended (PostgreSQL:
    /// the server restarted, the connection broke, the backend was
    /// terminated).
    #[error("the server session holding the lock ended")]
    SessionLost,
    /// This process let the lock go on purpose:
    /// [`Locker::release_all`](crate::Locker::release_all) released it
    /// (at shutdown), and another process may hold it now.
    #[error("the lock was released at shutdown by release_all")]
    ReleasedAtShutdown,
}
