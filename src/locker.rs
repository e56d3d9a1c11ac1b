//! `Locker` and its builder.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use std::time::Instant;
use tokio::sync::oneshot;
use tracing::Instrument;

use crate::dir::LockDir;
use crate::error::{Error, Result};
use crate::guard::{Hold, Keeper, LockGuard, Share, TokenStep};
use crate::name::{LockName, PathStyle};
use crate::owner::{LockInfo, Owner};
use crate::queue::{COURTESY, Head, Slot, Slots, Turn};
use crate::renew::Renewer;
use crate::scope;
use crate::stale::StaleReason;
use crate::stats::Counters;
use crate::stats::{Stats, bump};
#[cfg(feature = "postgres")]
use crate::strategy::Held;
use crate::strategy::{Attempt, Ctx, Inspection, Strategy};
use crate::timer;
use crate::wake::Watcher;

mod acquire;
use acquire::Acquire;

const DEFAULT_LEASE: Duration = Duration::from_secs(30);
const DEFAULT_POLL: Duration = Duration::from_millis(50);
/// The second seed's `lockStaleThreshold`.
const DEFAULT_GRACE: Duration = Duration::from_secs(15);
/// The second seed's `liveOwnerStaleThreshold`.
const DEFAULT_FOREIGN_LEASE: Duration = Duration::from_secs(120);
/// How often a waiter that is woken by filesystem events checks anyway.
const SAFETY_NET_POLL: Duration = Duration::from_secs(1);
/// How soon a waiter woken by an event, that still found the lock held,
/// looks again.
const RECHECK_AFTER_EVENT: Duration = Duration::from_millis(10);
/// Leases beyond this are almost certainly a unit mistake, and would
/// overflow time arithmetic long before they meant anything.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);
/// A renewal is a few syscalls on the renewal thread; below this lease,
/// the time they take is a real part of the lease, and one slow `write`
/// would cost the lock.
const MIN_LEASE: Duration = Duration::from_millis(200);
/// Records count time in milliseconds.
const MIN_RENEW_INTERVAL: Duration = Duration::from_millis(1);

/// A handle to a lock directory, from which named locks are acquired.
///
/// `Locker` is cheap to clone: clones share one instance. All its methods
/// take `&self`, and it is `Send + Sync`, so one `Locker` can serve a whole
/// service.
///
/// # Waiting
///
/// Within one `Locker`, tasks waiting for the same name form a FIFO queue:
/// they get the lock in the order they asked, and only the task at the head
/// touches the disk, so a thousand waiting tasks cost one filesystem waiter.
/// Waiters for different names never wait for each other.
///
/// The head waits for the filesystem to say the lock may be free: on Linux
/// an inotify watch on the lock directory (one per `Locker`, shared by all
/// names) wakes it when a lock file is removed or its holder's descriptor
/// is closed, which includes the holder dying. It also wakes when the
/// holder's lease runs out, and checks at least every
/// `max(poll_interval, 1 s)` as a safety net. Where the directory cannot be
/// watched, it polls every `poll_interval` with ±25 % jitter.
///
/// # Fairness
///
/// When a guard is dropped while another task of the same `Locker` waits
/// for the name, the lock passes straight to that task, without touching
/// the disk (the owner record still names this `Locker`). Such handoffs
/// continue for at most 10 ms in a row; then the lock is released on disk
/// and the next local waiter holds back for 1 ms, so that waiters in other
/// processes get their turn. Across processes there is no queue: whoever
/// creates the lock file first after a release gets it.
///
/// # Not blocking the runtime
///
/// An attempt to take a lock is a short batch of syscalls on the lock
/// directory (create, flock, write; or open, read, judge, maybe reclaim).
/// With durable records (the default) it ends in `fdatasync`, which can
/// take milliseconds, so the whole attempt runs as **one** call on Tokio's
/// blocking pool, as does any attempt that finds the lock taken (judging,
/// reclaiming) or reserves fencing tokens. Only the uncontended case
/// without fencing runs inline, and only when it cannot block: with
/// [`durable(false)`](LockerBuilder::durable), or with a lock directory in
/// memory (tmpfs, such as the default `/run/lock/leasehold-<uid>` on
/// Debian and Ubuntu), where `fdatasync` returns at once. That is a create, a flock, a
/// stat and a write, a few microseconds each, which saves the round trip
/// to the pool and roughly halves the cost of an uncontended acquisition.
/// Keep durable records on a slow or network filesystem.
///
/// The runtime needs no driver: waits sleep on leasehold's own timer
/// thread, not on Tokio's timers, so a runtime built without
/// `enable_time` works. Under Tokio's paused test clock (`start_paused`),
/// waits are Tokio sleeps on that clock instead, so they take part in its
/// auto-advance like your test's own timers. Renewals run on a thread of
/// their own, never on the runtime. Release in [`LockGuard`]'s
/// `Drop` is a few syscalls done inline, which is what makes the lock free
/// the moment `drop` returns.
///
/// # Re-entrancy and self-deadlock
///
/// A lock is held by a guard, not by a task or a process. Outside a
/// [`scope`](Self::scope), acquiring a name that a guard of this same
/// `Locker` already holds waits for that guard like any other waiter, so
/// acquiring twice in one task without releasing waits forever. Inside a
/// scope, acquiring a name that the scope holds, or that an enclosing
/// scope held when it started, is re-entrant and returns at once; the
/// lock is released when the last of its guards goes.
///
/// Re-entrancy is meant for nested code (a function called by the holder)
/// and stays out of concurrent code: a task spawned in a scope is not in
/// it, and branches of one task (`join!`, `select!`, `FuturesUnordered`)
/// that each run in a scope of their own exclude each other. Branches
/// *without* scopes of their own share the scope around them, and re-enter
/// each other's locks: two of them can run one critical section together.
/// What a nested scope acquires stays its own: a guard returned out of it
/// is not re-entered by the scope around it, where acquiring that name
/// again waits for the guard, so in one flow it deadlocks. See
/// [`scope`](Self::scope) for the details and an example.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// use leasehold::Locker;
///
/// let dir = tempfile::tempdir().unwrap();
/// let locker = Locker::new(dir.path())?;
/// {
///     let _guard = locker.acquire("reindex").await?;
///     // ... only one process at a time runs this ...
/// } // released here
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Locker {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Tells this `Locker`'s holds apart from other `Locker`s' in a scope.
    id: u64,
    store: Store,
    counters: Arc<Counters>,
    /// Arms the renewal of every lock taken; shares `counters`.
    keeper: Keeper,
    poll_interval: Duration,
    slots: Arc<Slots>,
    watcher: Watcher,
    path_style: PathStyle,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Where the locks live.
#[derive(Debug)]
enum Store {
    /// Files in a lock directory, in one of the on-disk strategies.
    Files(Arc<Ctx>),
    /// Advisory locks on a PostgreSQL server.
    #[cfg(feature = "postgres")]
    Postgres(Arc<crate::postgres::PgStore>),
}

impl Store {
    fn name(&self) -> &'static str {
        match self {
            Store::Files(ctx) => ctx.strategy.as_str(),
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => "postgres",
        }
    }
}

/// Configures and builds a [`Locker`].
///
/// Setters never fail; [`build`](Self::build) checks the settings together
/// and opens the directory.
///
/// | setting | default |
/// |---|---|
/// | [`directory`](Self::directory) | `/run/lock/leasehold-<uid>`, else `/tmp/leasehold-<uid>` (never from the environment) |
/// | [`lease`](Self::lease) | 30 s |
/// | [`renew_interval`](Self::renew_interval) | a third of the lease |
/// | [`poll_interval`](Self::poll_interval) | 50 ms |
/// | [`unreadable_grace`](Self::unreadable_grace) | 15 s |
/// | [`foreign_lease`](Self::foreign_lease) | 120 s |
/// | [`durable`](Self::durable) | `true` |
/// | [`fencing`](Self::fencing) | `false` |
/// | [`strategy`](Self::strategy) | [`Strategy::ExclusiveFile`] |
/// | [`path_style`](Self::path_style) | [`PathStyle::Hashed`] |
///
/// # Examples
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// use std::time::Duration;
/// use leasehold::Locker;
///
/// let dir = tempfile::tempdir().unwrap();
/// let locker = Locker::builder()
///     .directory(dir.path())
///     .lease(Duration::from_secs(10))
///     .renew_interval(Duration::from_secs(2))
///     .build()?;
///
/// // Renewing every 800 ms leaves no time to spare in a 1 s lease.
/// let bad = Locker::builder()
///     .directory(dir.path())
///     .lease(Duration::from_secs(1))
///     .renew_interval(Duration::from_millis(800))
///     .build();
/// assert!(matches!(bad, Err(leasehold::Error::InvalidConfig { .. })));
/// # drop(locker); Ok(()) }
/// ```
#[must_use = "a builder does nothing until `build` is called"]
#[derive(Debug, Clone)]
pub struct LockerBuilder {
    directory: Option<PathBuf>,
    lease: Duration,
    renew_interval: Option<Duration>,
    poll_interval: Duration,
    grace: Duration,
    foreign_lease: Option<Duration>,
    durable: bool,
    fencing: bool,
    strategy: Strategy,
    path_style: PathStyle,
    allow_insecure_directory: bool,
    #[cfg(feature = "postgres")]
    postgres: Option<String>,
}

impl Default for LockerBuilder {
    fn default() -> Self {
        Self {
            directory: None,
            lease: DEFAULT_LEASE,
            renew_interval: None,
            poll_interval: DEFAULT_POLL,
            grace: DEFAULT_GRACE,
            foreign_lease: Some(DEFAULT_FOREIGN_LEASE),
            durable: true,
            fencing: false,
            strategy: Strategy::default(),
            path_style: PathStyle::default(),
            allow_insecure_directory: false,
            #[cfg(feature = "postgres")]
            postgres: None,
        }
    }
}

impl LockerBuilder {
    /// The directory that holds the lock files. Created (mode 0700, the
    /// umask untouched) if missing, and resolved to an absolute path once,
    /// at [`build`](Self::build).
    ///
    /// # The default
    ///
    /// Without this setting the directory depends only on the effective
    /// uid and the host, never on environment variables, so that every
    /// process of one user (a cron job, a systemd unit, `sudo -u`, ssh, a
    /// login shell with any `XDG_RUNTIME_DIR`, `TMPDIR` or `HOME`) meets in
    /// the same one:
    ///
    /// - `/run/lock/leasehold-<uid>` when `/run/lock` is a directory owned
    ///   by root, world-writable and sticky (Debian, Ubuntu: a tmpfs emptied
    ///   at boot). `/var/lock` is not consulted; where it exists it is
    ///   usually a link to `/run/lock`.
    /// - otherwise `/tmp/leasehold-<uid>`: the literal `/tmp`, never
    ///   `$TMPDIR`.
    ///
    /// [`build`](Self::build) refuses the default directory
    /// ([`Error::InsecureDirectory`]) unless it belongs to the user and is
    /// closed to others (mode 0700), and fails if it is on a read-only
    /// mount. Known limits: a systemd unit with `PrivateTmp=` has a `/tmp`
    /// of its own, so on a host without a shared `/run/lock` it does not
    /// meet other processes; under `ProtectSystem=strict`, `/run/lock` is
    /// read-only and `build` fails rather than locking nothing (give such a
    /// unit an explicit, writable directory). Processes of different users
    /// never share the default; give them an explicit directory.
    pub fn directory(mut self, path: impl AsRef<Path>) -> Self {
        self.directory = Some(path.as_ref().to_owned());
        self
    }

    /// How long a lock stays valid without renewal. A holder that cannot
    /// renew (its process is paused, its disk is gone) loses the lock after
    /// this long, and other processes may then take it. This is also the
    /// only way a lock held from another host is ever reclaimed.
    ///
    /// At least 200 ms and at most a year; [`build`](Self::build) rejects
    /// others.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often a guard renews its lease: by default a third of the
    /// lease.
    ///
    /// It must be at most **half the lease** (and at least 1 ms), or
    /// [`build`](Self::build) returns [`Error::InvalidConfig`]. A guard
    /// counts its lock as lost once the lease comes within its safety
    /// margin, `min(renew_interval, lease / 4)`, of running out, so that
    /// it learns of the loss before anyone else may take the lock; the
    /// first renewal, one interval after the record was written, must land
    /// before that point with time to spare. With at most half the lease,
    /// a renewal has at least a quarter of the lease to run late.
    ///
    /// One thread per `Locker` renews all its leases, one after another,
    /// each a few syscalls (tens of microseconds; more on a busy disk).
    /// Keep the number of locks one `Locker` holds at once times that
    /// cost well below the interval: a few thousand locks at a 50 ms
    /// interval, far more at the default.
    pub fn renew_interval(mut self, interval: Duration) -> Self {
        self.renew_interval = Some(interval);
        self
    }

    /// How long a waiter sleeps between attempts (with ±25 % jitter) when
    /// the lock directory cannot be watched. Where it can (inotify on
    /// Linux), waiters wake on the filesystem event that frees the lock,
    /// and check at least every `max(poll_interval, 1 s)` as a safety net
    /// against missed events.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How long an unreadable record (empty, torn, not a lock record) is
    /// left alone before it may be reclaimed: its writer may be in the
    /// middle of writing it.
    pub fn unreadable_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Whether to `fdatasync` each new owner record before the lock counts
    /// as held (the default). Turning it off makes acquisition much cheaper
    /// on real disks; what it costs is only after a power loss, where a
    /// record that never reached the disk reads as unreadable and is
    /// reclaimed after the grace period instead of at once.
    pub fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// The implied lease of a lock whose record carries none (records
    /// written by the second seed's code), counted from the record's last
    /// change: after it, the lock is reclaimed even if its owner process
    /// lives, as the second seed itself would do. Values over a year count
    /// as a year.
    ///
    /// `None` never reclaims the record without a lease of an owner that
    /// is provably alive: a live process of this host, or a leasehold
    /// holder whose `flock` is held. One whose owner cannot be checked
    /// (another host or pid namespace, no pid) is still reclaimed 24 hours
    /// after its last change.
    pub fn foreign_lease(mut self, lease: Option<Duration>) -> Self {
        self.foreign_lease = lease;
        self
    }

    /// Whether acquisitions get fencing tokens (off by default).
    ///
    /// With fencing, each acquisition of a name gets a number greater than
    /// every earlier acquisition's, in every process that shares the
    /// directory with fencing on, across crashes and restarts
    /// ([`LockGuard::fencing_token`]). The counter is kept beside the lock
    /// in `<lock file>.fence`, advanced in blocks of 1,024 so in-process
    /// handoffs do not touch the disk; it costs one more write (and, when
    /// durable, two more syncs) per acquisition from the disk. Records from
    /// processes without fencing, the seeds' included, carry no token.
    pub fn fencing(mut self, fencing: bool) -> Self {
        self.fencing = fencing;
        self
    }

    /// The on-disk layout of locks.
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// Keep the locks on a PostgreSQL server instead of in a directory
    /// (feature `postgres`), for processes on several hosts. `url` is a
    /// libpq-style connection string or URL (`postgres://user@host/db`,
    /// `host=/run/postgresql user=app`). The directory, strategy, path
    /// style and durability settings are then unused; fencing tokens are
    /// always on. See the crate docs, *PostgreSQL*.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> leasehold::Result<()> {
    /// let locker = leasehold::Locker::builder()
    ///     .postgres("host=/run/postgresql user=app dbname=app")
    ///     .build()?; // connects, and fails here if it cannot
    /// let guard = locker.acquire("nightly-report").await?;
    /// assert!(guard.fencing_token().is_some());
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres(mut self, url: impl Into<String>) -> Self {
        self.postgres = Some(url.into());
        self
    }

    /// How lock names become file names.
    pub fn path_style(mut self, style: PathStyle) -> Self {
        self.path_style = style;
        self
    }

    /// Accept a world-writable lock directory without the sticky bit, where
    /// any local user can remove or replace lock files. Only for
    /// directories whose access you control by other means.
    pub fn allow_insecure_directory(mut self, allow: bool) -> Self {
        self.allow_insecure_directory = allow;
        self
    }

    /// Checks the settings, creates and opens the directory.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when the lease is below 200 ms or above a
    /// year, the renew interval is above half the lease (see
    /// [`renew_interval`](Self::renew_interval)), or another duration is
    /// zero;
    /// [`Error::InsecureDirectory`] for a world-writable directory without
    /// the sticky bit, or a default directory owned by another user or open
    /// to others; an I/O error for a default directory on a read-only
    /// mount; I/O errors from creating or opening the directory;
    /// [`Error::Backend`] when the PostgreSQL server cannot be reached.
    pub fn build(self) -> Result<Locker> {
        let renew_interval = self.renew_interval.unwrap_or(self.lease / 3);
        let invalid = |reason: String| Err(Error::InvalidConfig { reason });
        if self.lease < MIN_LEASE {
            return invalid(format!(
                "the lease {:?} is below {MIN_LEASE:?}: shorter leases cannot be renewed reliably",
                self.lease
            ));
        }
        if self.lease > MAX_LEASE {
            return invalid(format!("the lease {:?} exceeds one year", self.lease));
        }
        if renew_interval < MIN_RENEW_INTERVAL || renew_interval > self.lease / 2 {
            return invalid(format!(
                "the renew interval {renew_interval:?} must be at least {MIN_RENEW_INTERVAL:?} and at most \
                 half the lease {:?}: a guard counts its lock lost once the lease is within \
                 min(renew interval, lease / 4) of running out, and each renewal needs time to spare \
                 before that",
                self.lease
            ));
        }
        if self.poll_interval.is_zero() {
            return invalid("the poll interval must be above zero".into());
        }
        if self.grace.is_zero() {
            return invalid("the unreadable grace period must be above zero".into());
        }
        let holder_id = format!("{}-{}", std::process::id(), uuid::Uuid::new_v4().simple());
        let counters: Arc<Counters> = Arc::default();
        let slots: Arc<Slots> = Arc::default();
        #[cfg(feature = "postgres")]
        let server = self.postgres.clone();
        #[cfg(not(feature = "postgres"))]
        let server: Option<String> = None;
        // On a server, lock names are keys, not file names.
        let path_style = if server.is_some() {
            PathStyle::Hashed
        } else {
            self.path_style
        };
        let store = match server {
            #[cfg(feature = "postgres")]
            Some(url) => {
                let weak = Arc::downgrade(&slots);
                let wake = move |name: &str| {
                    if let Some(slots) = weak.upgrade() {
                        slots.changed(LockName::from_name(name).file_name());
                    }
                };
                Store::Postgres(crate::postgres::PgStore::connect(
                    &url,
                    holder_id,
                    self.lease,
                    Box::new(wake),
                )?)
            }
            _ => {
                let ctx = Arc::new(self.files(holder_id.clone(), &counters)?);
                // Leftovers of processes that crashed while nobody was
                // looking: a bounded collection, spared while in use.
                ctx.sweep();
                Store::Files(ctx)
            }
        };
        let keeper = Keeper {
            lease: self.lease,
            renew_interval,
            counters: Arc::clone(&counters),
            renewer: Renewer::default(),
        };
        Ok(Locker {
            inner: Arc::new(Inner {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                store,
                counters,
                keeper,
                poll_interval: self.poll_interval,
                slots,
                watcher: Watcher::default(),
                path_style,
            }),
        })
    }

    /// Opens the lock directory for the file strategies.
    fn files(&self, holder_id: String, counters: &Arc<Counters>) -> Result<Ctx> {
        let (path, is_default) = match &self.directory {
            Some(path) => (path.clone(), false),
            None => (default_directory(), true),
        };
        let dir = LockDir::open(&path, self.allow_insecure_directory)?;
        if is_default {
            check_private(&dir)?;
        }
        Ok(Ctx {
            dir,
            strategy: self.strategy,
            lease: self.lease,
            grace: self.grace,
            foreign_lease: self.foreign_lease,
            durable: self.durable,
            fencing: self.fencing,
            holder_id,
            counters: Arc::clone(counters),
            first_seen: Default::default(),
            last_sweep_ms: Default::default(),
        })
    }
}

/// `/run/lock/leasehold-<euid>`, or `/tmp/leasehold-<euid>` where
/// `/run/lock` is not a shared lock directory.
///
/// No environment variable takes part (`XDG_RUNTIME_DIR` is unset under
/// cron, `TMPDIR` differs between sessions): every process of one user on
/// one host must meet in the same directory.
fn default_directory() -> PathBuf {
    per_user_directory("leasehold")
}

/// `<root>/<prefix>-<euid>`, where the root is `/run/lock` if it is a
/// root-owned, world-writable directory with the sticky bit (as on Debian
/// and Ubuntu: tmpfs, emptied at boot, which suits locks), else the literal
/// `/tmp`. Whoever creates the directory first owns it, so it must then
/// pass [`check_private`].
pub(crate) fn per_user_directory(prefix: &str) -> PathBuf {
    let shared =
        |meta: &std::fs::Metadata| meta.is_dir() && meta.uid() == 0 && meta.mode() & 0o1002 == 0o1002;
    let root = match std::fs::metadata("/run/lock") {
        Ok(meta) if shared(&meta) => "/run/lock",
        _ => "/tmp",
    };
    Path::new(root).join(format!("{prefix}-{}", nix::unistd::geteuid()))
}

/// A per-user directory in a shared root must be ours and closed to
/// others, or someone could have planted it there; and writable, or a
/// read-only mount (systemd's `ProtectSystem=strict`) would only show at the
/// first acquisition.
pub(crate) fn check_private(dir: &LockDir) -> Result<()> {
    let meta = dir
        .fd()
        .metadata()
        .map_err(|e| Error::io("inspect lock directory", dir.path(), e))?;
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(Error::InsecureDirectory {
            path: dir.path().to_owned(),
            reason: "the default lock directory belongs to another user",
        });
    }
    // In a shared root, anyone may plant a symlink at our name, pointing at
    // a private directory of ours (it would pass the checks above) and
    // later somewhere else: the name itself must be the directory opened.
    let itself = std::fs::symlink_metadata(dir.configured())
        .is_ok_and(|at| at.is_dir() && at.dev() == meta.dev() && at.ino() == meta.ino());
    if !itself {
        return Err(Error::InsecureDirectory {
            path: dir.configured().to_owned(),
            reason: "the default lock directory is a symlink, or was replaced while it was opened",
        });
    }
    if meta.mode() & 0o077 != 0 {
        return Err(Error::InsecureDirectory {
            path: dir.path().to_owned(),
            reason: "the default lock directory is open to other users (expected mode 0700)",
        });
    }
    let read_only = nix::sys::statvfs::fstatvfs(dir.fd())
        .is_ok_and(|fs| fs.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY));
    if read_only {
        return Err(Error::io(
            "write to lock directory",
            dir.path(),
            nix::errno::Errno::EROFS.into(),
        ));
    }
    Ok(())
}

impl Locker {
    /// A `Locker` on `directory` with default settings.
    ///
    /// # Errors
    ///
    /// As [`LockerBuilder::build`].
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path().join("locks"))?;
    /// assert!(locker.directory().ends_with("locks"));
    /// # Ok(()) }
    /// ```
    pub fn new(directory: impl AsRef<Path>) -> Result<Self> {
        Self::builder().directory(directory).build()
    }

    /// A builder with default settings.
    pub fn builder() -> LockerBuilder {
        LockerBuilder::default()
    }

    /// The absolute path of the lock directory (empty for the PostgreSQL
    /// backend, which has none).
    pub fn directory(&self) -> &Path {
        match &self.inner.store {
            Store::Files(ctx) => ctx.dir.path(),
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => Path::new(""),
        }
    }

    /// The path of the lock `name` inside the directory, for diagnostics and
    /// for sharing a lock with other programs.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for an empty name or one containing NUL;
    /// [`Error::Unsupported`] on the PostgreSQL backend, whose locks have no
    /// path.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let path = locker.lock_path("reindex")?;
    /// assert_eq!(path.file_name().unwrap(), "reindex-2ad945a5430f00fa.lock");
    /// assert!(locker.lock_path("../../etc/passwd")?.starts_with(locker.directory()));
    /// # Ok(()) }
    /// ```
    pub fn lock_path(&self, name: &str) -> Result<PathBuf> {
        let name = LockName::new(name, self.inner.path_style)?;
        match &self.inner.store {
            Store::Files(ctx) => Ok(ctx.dir.path_of(name.file_name())),
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => Err(Error::Unsupported {
                what: "lock paths on the PostgreSQL backend",
            }),
        }
    }

    /// Acquires the lock `name`, waiting as long as it takes.
    ///
    /// Takes the lock if it is free, or reclaims it if its holder is provably
    /// gone or its lease ran out (see the crate docs, *Staleness*);
    /// otherwise waits until it may have become free (woken by filesystem
    /// events where the platform has them, by `poll_interval` with jitter
    /// where it has not) and tries again.
    ///
    /// Tasks of one `Locker` that want the same name queue in arrival order,
    /// and only the first of them waits on the disk. The name is checked
    /// (and the tracing span made) when `acquire` is called, so the future
    /// does not borrow it; the task joins the queue when the future is
    /// first polled. A task waiting in the queue costs about as much as
    /// one waiting on a `tokio::sync::Mutex` (about 0.5 kB, see
    /// `BENCHMARKS.md`).
    ///
    /// Inside a [`scope`](Self::scope), a name that the scope holds, or
    /// that an enclosing scope held when it started, is re-entered at once
    /// instead; concurrent branches of one task (`join!`, `select!`) share
    /// their scope's locks unless each runs in a scope of its own (see
    /// *Concurrent branches in one task* on `scope`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for an empty name or one containing NUL;
    /// [`Error::UnexpectedFile`] when something other than a lock file
    /// occupies the lock's path; I/O and permission errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. Dropping the future leaves nothing behind: a lock that
    /// an in-flight attempt creates after the drop is removed by that
    /// attempt.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let guard = locker.acquire("reindex").await?;
    /// assert!(locker.is_held("reindex").await?);
    /// drop(guard);
    /// assert!(!locker.is_held("reindex").await?);
    /// # Ok(()) }
    /// ```
    pub fn acquire(&self, name: &str) -> impl Future<Output = Result<LockGuard>> + Send + use<'_> {
        Acquire::new(self, "acquire", name, None)
    }

    /// Acquires the lock `name` if that can be done without waiting.
    ///
    /// Returns `Ok(None)` when a live holder has it. A stale lock is
    /// reclaimed on the way, as [`acquire`](Self::acquire) would.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let first = locker.try_acquire("cron").await?;
    /// assert!(first.is_some());
    /// assert!(locker.try_acquire("cron").await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(&self, name: &str) -> Result<Option<LockGuard>> {
        self.try_acquire_inner(name)
            .instrument(self.span("try_acquire", name))
            .await
    }

    async fn try_acquire_inner(&self, name: &str) -> Result<Option<LockGuard>> {
        let name = LockName::new(name, self.inner.path_style)?;
        if let Some(guard) = self.reenter(&name) {
            return guard.map(Some);
        }
        let started = timer::now();
        let slot = self.inner.slots.get(&name);
        // Another task of this Locker holds it, or is waiting on the disk
        // because another process does: either way, not free.
        let Some(head) = slot.try_head() else {
            return Ok(None);
        };
        match self.attempt(&name, None).await? {
            Attempt::Acquired(hold) => {
                head.disarm();
                self.finish(&name, hold, slot, started, false).await.map(Some)
            }
            Attempt::Busy { .. } => Ok(None),
        }
    }

    /// Acquires the lock `name`, waiting at most `timeout`.
    ///
    /// At least one attempt is made, even with a zero timeout; the deadline
    /// is checked between attempts. On a PostgreSQL server it also ends an
    /// attempt that the server is slow to answer (see *PostgreSQL* in the
    /// crate docs).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the lock was still held at the deadline;
    /// otherwise as [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use std::time::Duration;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _held = locker.acquire("deploy").await?;
    /// let err = locker.acquire_timeout("deploy", Duration::from_millis(30)).await.unwrap_err();
    /// assert!(err.is_timeout());
    /// # Ok(()) }
    /// ```
    pub fn acquire_timeout(
        &self,
        name: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<LockGuard>> + Send + use<'_> {
        Acquire::new(self, "acquire_timeout", name, Some(timeout))
    }

    /// Who holds `name` now, or `None` if nobody does (no lock, or a stale
    /// one that the next `acquire` would reclaim).
    ///
    /// A record that is still being written is held, with an [`Owner`] whose
    /// fields are all `None`.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// assert!(locker.holder("reindex").await?.is_none());
    /// let _guard = locker.acquire("reindex").await?;
    /// let owner = locker.holder("reindex").await?.unwrap();
    /// assert_eq!(owner.pid(), Some(std::process::id()));
    /// # Ok(()) }
    /// ```
    pub async fn holder(&self, name: &str) -> Result<Option<Owner>> {
        let name = LockName::new(name, self.inner.path_style)?;
        let inspection = self.lookup(Some(name)).await?.pop();
        Ok(inspection
            .filter(|(_, i)| i.stale.is_none())
            .map(|(_, i)| i.owner))
    }

    /// One lock (or, with `None`, every lock) as the store has it.
    async fn lookup(&self, name: Option<LockName>) -> Result<Vec<(LockName, Inspection)>> {
        match &self.inner.store {
            Store::Files(ctx) => {
                let ctx = Arc::clone(ctx);
                blocking(move || match name {
                    Some(name) => Ok(ctx.inspect(&name)?.map(|i| (name, i)).into_iter().collect()),
                    None => ctx.list(),
                })
                .await?
            }
            #[cfg(feature = "postgres")]
            Store::Postgres(pg) => {
                let pg = Arc::clone(pg);
                blocking(move || pg.inspect(name.as_ref().map(LockName::as_str))).await?
            }
        }
    }

    /// The lock `name` as found on disk, held or stale, or `None` if there
    /// is none. Unlike [`holder`](Self::holder), a stale lock is returned,
    /// with the reason the next `acquire` would reclaim it.
    ///
    /// # Errors
    ///
    /// As [`holder`](Self::holder).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// std::fs::write(locker.lock_path("job")?, r#"{"uuid":"x","pid":999999999}"#).unwrap();
    /// let info = locker.inspect("job").await?.expect("a lock file is there");
    /// assert_eq!(info.stale_reason(), Some("owner process is dead"));
    /// assert!(locker.holder("job").await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let name = LockName::new(name, self.inner.path_style)?;
        let found = self.lookup(Some(name)).await?;
        Ok(self.infos(found).pop())
    }

    /// Every lock in the directory (of this `Locker`'s strategy), with its
    /// owner and whether it is stale, for diagnostics. Temporary and trash
    /// entries, fencing counters, and locks of the other strategy are left
    /// out.
    ///
    /// # Errors
    ///
    /// I/O and permission errors from reading the directory or a record.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _a = locker.acquire("a").await?;
    /// let _b = locker.acquire("b").await?;
    /// let names: Vec<String> = locker.list().await?.iter().map(|l| l.name().to_owned()).collect();
    /// assert_eq!(names.len(), 2);
    /// assert!(names.contains(&"a".to_owned()) && names.contains(&"b".to_owned()));
    /// # Ok(()) }
    /// ```
    pub async fn list(&self) -> Result<Vec<LockInfo>> {
        let locks = self.lookup(None).await?;
        Ok(self.infos(locks))
    }

    /// Removes every stale lock in the directory, and what crashed
    /// processes left behind, returning what was removed (or, with
    /// `dry_run`, what would be). Live locks are never touched: each lock
    /// is judged, and reclaimed, exactly as an `acquire` would.
    ///
    /// # Errors
    ///
    /// I/O and permission errors from reading the directory or removing an
    /// entry.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future lets the cleaning finish on the blocking pool.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _live = locker.acquire("live").await?;
    /// // A lock whose owner process is gone.
    /// std::fs::write(locker.lock_path("crashed")?, r#"{"uuid":"x","pid":999999999}"#).unwrap();
    /// let removed = locker.clean(false).await?;
    /// assert_eq!(removed.len(), 1);
    /// assert_eq!(removed[0].stale_reason(), Some("owner process is dead"));
    /// assert!(locker.is_held("live").await?);
    /// # Ok(()) }
    /// ```
    pub async fn clean(&self, dry_run: bool) -> Result<Vec<LockInfo>> {
        match &self.inner.store {
            Store::Files(ctx) => {
                let ctx = Arc::clone(ctx);
                let cleaned = blocking(move || ctx.clean(dry_run)).await??;
                Ok(self.infos(cleaned))
            }
            // The server drops a dead session's locks itself.
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => Ok(Vec::new()),
        }
    }

    fn infos(&self, locks: Vec<(LockName, Inspection)>) -> Vec<LockInfo> {
        locks
            .into_iter()
            .map(|(name, inspection)| {
                let display = inspection.owner.name().unwrap_or(name.as_str()).to_owned();
                let path = match &self.inner.store {
                    Store::Files(ctx) => ctx.dir.path_of(name.file_name()),
                    #[cfg(feature = "postgres")]
                    Store::Postgres(_) => PathBuf::new(),
                };
                LockInfo::new(
                    path,
                    display,
                    inspection.owner,
                    inspection.stale.map(StaleReason::as_str),
                )
            })
            .collect()
    }

    /// Whether a live holder has `name` now. The answer may be out of date
    /// as soon as it is returned; use it for diagnostics, not to decide
    /// whether to acquire.
    ///
    /// # Errors
    ///
    /// As [`holder`](Self::holder).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// assert!(!locker.is_held("reindex").await?);
    /// # Ok(()) }
    /// ```
    pub async fn is_held(&self, name: &str) -> Result<bool> {
        Ok(self.holder(name).await?.is_some())
    }

    /// Runs `fut` in a re-entrancy scope.
    ///
    /// Inside the scope, acquiring a name that the scope holds through this
    /// `Locker` returns at once another guard on the same lock (no waiting,
    /// no disk access), through [`acquire`](Self::acquire),
    /// [`try_acquire`](Self::try_acquire) and
    /// [`acquire_timeout`](Self::acquire_timeout) alike. The lock is
    /// released when the last guard on it goes, in whatever order they
    /// drop, in whichever task.
    ///
    /// Re-entrancy is for *nested* code, such as a function called by the
    /// holder that takes the same lock without knowing its caller has it.
    /// Without a scope, acquiring a name that this `Locker` already holds
    /// waits for that guard, so a nested acquisition outside a scope
    /// deadlocks; wrap such code in `scope`.
    ///
    /// # Nested scopes
    ///
    /// Each call opens a scope of its own, nested in the scope it runs in.
    /// A scope re-enters what it acquired itself, and what its enclosing
    /// scopes held when it started: a function called by the holder
    /// re-enters its caller's lock whether it opens a scope of its own or
    /// not. What a scope acquires is its own: neither the scope around it
    /// nor a sibling scope sees it. That holds also for a guard returned
    /// out of the inner scope: in the scope around it, `try_acquire` of
    /// that name returns `Ok(None)` and `acquire` waits for the returned
    /// guard (in the same flow, forever). Take the lock in the outer scope
    /// first if the inner one should re-enter it.
    ///
    /// # Concurrent branches in one task
    ///
    /// `tokio::join!`, `tokio::select!` and `FuturesUnordered` run several
    /// branches of work concurrently in one task. A branch that is not in
    /// a scope of its own runs in the scope around it, with these
    /// consequences:
    ///
    /// - Outside any scope, such branches exclude each other, like any two
    ///   acquirers.
    /// - **Inside a scope, they share its locks.** A branch that acquires a
    ///   name another branch of the same scope holds gets a re-entrant
    ///   guard at once, and both run the critical section together. (Two
    ///   branches that ask while neither holds the lock yet queue as usual,
    ///   so whether they overlap depends on timing: never rely on either.)
    ///
    /// To run branches concurrently and keep them apart, wrap **each
    /// branch** in its own `locker.scope(..)`, as in the second example
    /// below. A branch's acquisitions are then its own, and the branches
    /// exclude each other; a branch's own callees still re-enter its
    /// locks. One thing stays shared: the names the enclosing scope
    /// already held when a branch started are held by every branch (they
    /// all run inside that critical section, which the holder chose to
    /// run concurrently); do not acquire such a name in branches that must
    /// not run together. A scope does not see what the scope around it
    /// acquires after it started, so a sibling branch left unscoped shares
    /// with the scoped ones only what it held before they started.
    ///
    /// A task spawned inside a scope is *not* in it (Tokio's task-locals
    /// are not inherited): it runs concurrently with the scope, so it waits
    /// for the lock like anyone else.
    ///
    /// A hold belongs to the scope that took it, wherever its guards go: a
    /// guard moved out of the scope (into a spawned task, over a channel)
    /// still lets the scope re-enter the lock while the other task works
    /// under it, and the two then run together. Move a guard out of its
    /// scope only when the scope is done with that name, or take the lock
    /// in the spawned task instead.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `fut`; guards it held are released as
    /// usual.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    ///
    /// locker
    ///     .scope(async {
    ///         let outer = locker.acquire("ledger").await?;
    ///         let inner = locker.acquire("ledger").await?; // re-entrant: no wait
    ///         drop(outer);
    ///         assert!(locker.is_held("ledger").await?); // `inner` still holds it
    ///         drop(inner);
    ///         assert!(!locker.is_held("ledger").await?);
    ///         Ok::<_, leasehold::Error>(())
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Concurrent branches, each in a scope of its own, never run the
    /// critical section together:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use std::sync::Mutex;
    /// use std::time::Duration;
    /// use leasehold::Locker;
    ///
    /// async fn post(locker: &Locker, log: &Mutex<Vec<&str>>, who: &'static str) -> leasehold::Result<()> {
    ///     let _guard = locker.acquire("ledger").await?;
    ///     log.lock().unwrap().push(who);
    ///     tokio::time::sleep(Duration::from_millis(5)).await;
    ///     log.lock().unwrap().push(who);
    ///     Ok(())
    /// }
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = Locker::new(dir.path())?;
    /// let log = Mutex::new(Vec::new());
    /// locker
    ///     .scope(async {
    ///         // Without the inner `scope`s, both branches would be this
    ///         // scope's flow, and could enter together.
    ///         let (a, b) = tokio::join!(
    ///             locker.scope(post(&locker, &log, "a")),
    ///             locker.scope(post(&locker, &log, "b")),
    ///         );
    ///         a.and(b)
    ///     })
    ///     .await?;
    /// let log = log.into_inner().unwrap();
    /// assert!(log == ["a", "a", "b", "b"] || log == ["b", "b", "a", "a"]);
    /// # Ok(()) }
    /// ```
    pub async fn scope<F: Future>(&self, fut: F) -> F::Output {
        scope::run(fut).await
    }

    /// A snapshot of this `Locker`'s counters.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// assert!(locker.try_acquire("a").await?.is_some());
    /// assert_eq!(locker.stats().fs_attempts, 1);
    /// # Ok(()) }
    /// ```
    pub fn stats(&self) -> Stats {
        self.inner.counters.snapshot()
    }

    /// The work of the task holding the name's turn: take the lock handed
    /// over to it, or go to the disk for it. Without `head`, the turn came
    /// from the queue.
    async fn take_turn(
        &self,
        name: &LockName,
        slot: Arc<Slot>,
        mut turn: Turn,
        mut head: Option<Head>,
        deadline: Option<Instant>,
        started: Instant,
    ) -> Result<LockGuard> {
        let queued = head.is_none();
        let counters = &self.inner.counters;
        let (hold, contended) = loop {
            match turn {
                Turn::Handoff(hold) if !hold.is_lost() => {
                    bump(&counters.handoffs);
                    break (hold, true);
                }
                Turn::Handoff(lost) => {
                    // Lost between its last holder and us: the turn is ours
                    // now, the lock is not.
                    lost.release_sync();
                    turn = Turn::Fresh { courtesy: false };
                }
                Turn::Fresh { courtesy } => {
                    // Our turn: passed on to the next waiter if we fail or
                    // are dropped before we hold the lock.
                    let head = head.take().unwrap_or_else(|| Head::adopt(&slot));
                    if courtesy {
                        timer::sleep(COURTESY).await;
                    }
                    let (hold, waited) = self.wait_on_disk(name, &slot, deadline, started).await?;
                    head.disarm();
                    break (hold, queued || waited);
                }
            }
        };
        self.finish(name, hold, slot, started, contended).await
    }

    /// The span every acquisition runs in; `waited_ms`, `contended` and
    /// `fencing_token` are recorded when it succeeds.
    fn span(&self, op: &'static str, name: &str) -> tracing::Span {
        tracing::debug_span!(
            "leasehold",
            op,
            lock = name,
            strategy = self.inner.store.name(),
            waited_ms = tracing::field::Empty,
            contended = tracing::field::Empty,
            fencing_token = tracing::field::Empty,
        )
    }

    /// A re-entrant guard, if the current scope holds `name`.
    fn reenter(&self, name: &LockName) -> Option<Result<LockGuard>> {
        let guard = scope::find(self.inner.id, name.file_name())?.guard()?;
        if guard.is_ok() {
            bump(&self.inner.counters.reentrant);
        }
        Some(guard)
    }

    /// Turns a hold into the caller's guard: takes the acquisition's
    /// fencing token, counts it, and remembers it in the current scope.
    async fn finish(
        &self,
        name: &LockName,
        hold: Hold,
        slot: Arc<Slot>,
        started: Instant,
        contended: bool,
    ) -> Result<LockGuard> {
        // From here the hold lives in a share, which passes it on if this
        // future is dropped while a token is fetched from disk.
        let share = Share::new(hold, slot);
        let token = match share.take_token() {
            TokenStep::Ready(token) => token?,
            TokenStep::FromDisk(lease) => blocking(move || lease.next_token()).await??,
        };
        let counters = &self.inner.counters;
        bump(&counters.acquisitions);
        if contended {
            bump(&counters.contended);
        }
        let waited = timer::since(started);
        counters.waited(waited);
        let guard = share.first_guard(token);
        scope::remember(self.inner.id, name.file_name(), &share);
        let span = tracing::Span::current();
        span.record("waited_ms", waited.as_secs_f64() * 1000.0);
        span.record("contended", contended);
        if let Some(token) = token {
            span.record("fencing_token", token);
        }
        tracing::debug!(
            lock = name.as_str(),
            strategy = self.inner.store.name(),
            ?waited,
            contended,
            fencing_token = token,
            "lock acquired"
        );
        Ok(guard)
    }

    /// Waits on the disk until the lock is ours. Only the head of the
    /// name's queue runs this, so one task per name touches the disk.
    async fn wait_on_disk(
        &self,
        name: &LockName,
        slot: &Slot,
        deadline: Option<Instant>,
        started: Instant,
    ) -> Result<(Hold, bool)> {
        let inner = &self.inner;
        let _waiter = inner.counters.fs_waiter();
        let mut jitter = None;
        let mut waited = false;
        let mut woken_by_event = false;
        loop {
            // Armed before the attempt, so an event during it is not lost.
            let changed = slot.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let recheck_at = match self.attempt(name, deadline).await? {
                Attempt::Acquired(hold) => return Ok((hold, waited)),
                Attempt::Busy { owner, recheck_at } => {
                    if !waited {
                        tracing::debug!(
                            lock = name.as_str(),
                            holder_pid = owner.as_ref().and_then(Owner::pid),
                            holder_host = owner.as_ref().and_then(Owner::hostname),
                            "lock is held elsewhere; waiting"
                        );
                    }
                    recheck_at
                }
            };
            waited = true;
            let now = timer::now();
            // With filesystem events, polling is only a safety net.
            let watched = match &inner.store {
                Store::Files(ctx) => {
                    inner.watcher.ensure(&ctx.dir, &inner.slots)
                        && (ctx.strategy != Strategy::Directory
                            || inner.watcher.ensure_child(name.file_name()))
                }
                #[cfg(feature = "postgres")]
                Store::Postgres(pg) => pg.listening(),
            };
            let mut wake = later(
                now,
                if watched {
                    inner.poll_interval.max(SAFETY_NET_POLL)
                } else {
                    jitter.get_or_insert_with(Jitter::new).around(inner.poll_interval)
                },
            );
            // Come back when the lock can turn stale by time alone.
            if let Some(at) = recheck_at {
                let left = at
                    .duration_since(std::time::SystemTime::now())
                    .unwrap_or_default();
                wake = wake.min(later(now, left.saturating_add(Duration::from_millis(1))));
            }
            // A dying holder's close event can arrive a moment before the
            // kernel drops its flock: look once more shortly after an event.
            if woken_by_event {
                wake = wake.min(later(now, RECHECK_AFTER_EVENT));
            }
            if let Some(deadline) = deadline {
                if now >= deadline {
                    return Err(self.timed_out(name, started));
                }
                wake = wake.min(deadline);
            }
            woken_by_event = tokio::select! {
                _ = changed => true,
                _ = timer::sleep_until(wake) => false,
            };
        }
    }

    fn timed_out(&self, name: &LockName, started: Instant) -> Error {
        bump(&self.inner.counters.timeouts);
        tracing::debug!(lock = name.as_str(), waited = ?timer::since(started), "timed out waiting for lock");
        Error::Timeout {
            name: name.as_str().to_owned(),
            waited: timer::since(started),
        }
    }

    /// One attempt. The uncontended case without syncing is a handful of
    /// short syscalls, tried inline; everything else (syncing, judging a
    /// record, reclaiming, fencing) runs as one call on the blocking pool.
    /// Its result travels back over a channel rather than the task's join
    /// handle so that if this future was dropped meanwhile, the attempt's
    /// lock is dropped (and so removed) right there in the blocking task.
    ///
    /// A lock server is told `deadline`, so that a statement stuck there
    /// cannot keep the caller past it.
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    async fn attempt(&self, name: &LockName, deadline: Option<Instant>) -> Result<Attempt> {
        bump(&self.inner.counters.fs_attempts);
        match &self.inner.store {
            Store::Files(ctx) => {
                if let Some(hold) = ctx.try_create_inline(name, &self.inner.keeper)? {
                    return Ok(Attempt::Acquired(hold));
                }
                let ctx = Arc::clone(ctx);
                let name = name.clone();
                let keeper = self.inner.keeper.clone();
                blocking(move || ctx.try_acquire(&name, &keeper)).await?
            }
            #[cfg(feature = "postgres")]
            Store::Postgres(pg) => {
                let pg = Arc::clone(pg);
                let name = name.clone();
                let keeper = self.inner.keeper.clone();
                // The hold is made (and its heartbeat armed) where the
                // lock was taken, as with files.
                blocking(move || {
                    Ok(match pg.try_lock(&name, deadline)? {
                        Some((lock, tokens)) => {
                            Attempt::Acquired(keeper.hold(name.as_str(), Held::Pg(lock), Some(tokens)))
                        }
                        None => Attempt::Busy {
                            owner: None,
                            recheck_at: None,
                        },
                    })
                })
                .await?
            }
        }
    }
}

/// Runs `f` on the blocking pool; its result is dropped there if the caller
/// has gone away.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::Unsupported {
        what: "leasehold's async methods must run inside a Tokio runtime",
    })?;
    let (tx, rx) = oneshot::channel();
    runtime.spawn_blocking(move || {
        // If the receiver is gone, the value comes back and drops here.
        let _ = tx.send(f());
    });
    rx.await.map_err(|_| Error::Io {
        op: "run a lock operation on the blocking pool",
        path: PathBuf::new(),
        source: std::io::Error::other("the blocking task did not complete (runtime shutting down?)"),
    })
}

fn far_future() -> Instant {
    later(timer::now(), Duration::from_secs(86_400 * 365 * 30))
}

/// `now + d`, saturating instead of panicking on overflow.
fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(86_400 * 365)))
        .unwrap_or(now)
}

/// Cheap jitter for poll intervals, seeded per waiter.
#[derive(Debug)]
struct Jitter(u64);

impl Jitter {
    fn new() -> Self {
        Self(uuid::Uuid::new_v4().as_u64_pair().0 | 1)
    }

    /// `base` scaled by a factor in [0.75, 1.25).
    fn around(&mut self, base: Duration) -> Duration {
        // xorshift64
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let permille = 750 + (self.0 % 500);
        Duration::try_from_secs_f64(base.as_secs_f64() * permille as f64 / 1000.0).unwrap_or(base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_a_quarter() {
        let mut j = Jitter::new();
        for _ in 0..1000 {
            let d = j.around(Duration::from_millis(100));
            assert!(
                d >= Duration::from_millis(75) && d < Duration::from_millis(125),
                "{d:?}"
            );
        }
    }

    #[test]
    fn a_symlink_planted_at_the_default_name_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let real = root.path().join("mine");
        std::fs::create_dir(&real).unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
        let planted = root.path().join("leasehold-me");
        std::os::unix::fs::symlink(&real, &planted).unwrap();
        let dir = LockDir::open(&planted, false).unwrap();
        match check_private(&dir) {
            Err(Error::InsecureDirectory { path, .. }) => assert_eq!(path, planted),
            other => panic!("expected InsecureDirectory, got {other:?}"),
        }
        // The directory itself, private and ours, passes.
        check_private(&LockDir::open(&real, false).unwrap()).unwrap();
    }

    #[test]
    fn locker_is_shareable() {
        fn assert_shareable<T: Clone + Send + Sync + 'static>() {}
        assert_shareable::<Locker>();
    }
}
