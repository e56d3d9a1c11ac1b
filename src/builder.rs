//! [`LockerBuilder`]: the settings, their validation, and the backend
//! they build. (`build` itself is in `locker.rs`, which wraps the engine
//! built here in a [`Locker`](crate::Locker).)

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::backend::Waiters;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::field::{FieldValue, OwnerFields};
use crate::fs::{self, Fs, Strategy};
use crate::name::PathStyle;
use crate::record::MAX_LEASE;
use crate::store::Store;

const DEFAULT_LEASE: Duration = Duration::from_secs(30);
const DEFAULT_POLL: Duration = Duration::from_millis(50);
const DEFAULT_WAIT_NOTICE: Duration = Duration::from_secs(5);
/// pi-research's `lockStaleThreshold`.
const DEFAULT_GRACE: Duration = Duration::from_secs(15);
/// pi-research's `liveOwnerStaleThreshold`.
const DEFAULT_FOREIGN_LEASE: Duration = Duration::from_secs(120);
/// A renewal is a few syscalls on the renewal thread; below this lease,
/// the time they take is a real part of the lease, and one slow `write`
/// would cost the lock.
const MIN_LEASE: Duration = Duration::from_millis(200);
/// Records count time in milliseconds.
const MIN_RENEW_INTERVAL: Duration = Duration::from_millis(1);

/// Configures and builds a [`Locker`](crate::Locker).
///
/// Setters never fail; [`build`](Self::build) checks the settings together
/// and opens the directory.
///
/// | setting | default |
/// |---|---|
/// | [`directory`](Self::directory) | `/run/lock/leasehold-<uid>` on Linux, `leasehold` in the user's local application data on Windows, `/tmp/leasehold-<uid>` elsewhere, or [`Error::NoDefaultDirectory`] (never from the environment) |
/// | [`lease`](Self::lease) | 30 s |
/// | [`renew_interval`](Self::renew_interval) | a third of the lease |
/// | [`poll_interval`](Self::poll_interval) | 50 ms |
/// | [`wait_notice`](Self::wait_notice) | 5 s |
/// | [`unreadable_grace`](Self::unreadable_grace) | 15 s |
/// | [`foreign_lease`](Self::foreign_lease) | 120 s |
/// | [`durable`](Self::durable) | `false` |
/// | [`fencing`](Self::fencing) | `false` |
/// | [`fair`](Self::fair) | `false` |
/// | [`strategy`](Self::strategy) | [`Strategy::ExclusiveFile`] |
/// | [`path_style`](Self::path_style) | [`PathStyle::Hashed`] |
/// | [`create_directory`](Self::create_directory) | `true` |
/// | [`read_only`](Self::read_only) | `false` |
/// | [`owner_field`](Self::owner_field) | none |
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
    wait_notice: Option<Duration>,
    grace: Duration,
    foreign_lease: Option<Duration>,
    durable: bool,
    fencing: bool,
    fair: bool,
    strategy: Strategy,
    path_style: PathStyle,
    allow_insecure_directory: bool,
    create_directory: bool,
    read_only: bool,
    owner_fields: Vec<(String, FieldValue)>,
    #[cfg(feature = "postgres")]
    postgres: Option<crate::postgres::Source>,
    #[cfg(feature = "postgres")]
    postgres_tls: crate::postgres::TlsSettings,
}

impl Default for LockerBuilder {
    fn default() -> Self {
        Self {
            directory: None,
            lease: DEFAULT_LEASE,
            renew_interval: None,
            poll_interval: DEFAULT_POLL,
            wait_notice: Some(DEFAULT_WAIT_NOTICE),
            grace: DEFAULT_GRACE,
            foreign_lease: Some(DEFAULT_FOREIGN_LEASE),
            durable: false,
            fencing: false,
            fair: false,
            strategy: Strategy::default(),
            path_style: PathStyle::default(),
            allow_insecure_directory: false,
            create_directory: true,
            read_only: false,
            owner_fields: Vec::new(),
            #[cfg(feature = "postgres")]
            postgres: None,
            #[cfg(feature = "postgres")]
            postgres_tls: crate::postgres::TlsSettings::default(),
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
    /// Without this setting the directory is one fixed place per user and
    /// platform, never taken from environment variables, so that every
    /// process of one user (a cron job, a systemd unit, `sudo -u`, ssh, a
    /// login shell with any `XDG_RUNTIME_DIR`, `TMPDIR` or `HOME`) meets in
    /// the same one:
    ///
    /// - on Linux, `/run/lock/leasehold-<uid>` (a tmpfs emptied at boot on
    ///   most distributions, and never private to a systemd unit as `/tmp`
    ///   is under `PrivateTmp=`);
    /// - on Windows, `leasehold` in the user's local application data
    ///   folder (`C:\Users\<user>\AppData\Local\leasehold`), asked of the
    ///   shell (`FOLDERID_LocalAppData`), never of `%LOCALAPPDATA%`; it
    ///   must belong to the user, and nobody but the user, the system and
    ///   the administrators may change it (its access list is read);
    /// - elsewhere (macOS, the BSDs), `/tmp/leasehold-<uid>`: the literal
    ///   `/tmp`, never `$TMPDIR`.
    ///
    /// There is no fallback to another place. A default chosen by what a
    /// process finds when it starts would send two processes to two
    /// directories when that changed between their starts (a `chmod` of
    /// `/run/lock`, a mount, a package creating it), and both would hold
    /// the same lock. So where that place cannot be used,
    /// [`build`](Self::build) fails with [`Error::NoDefaultDirectory`],
    /// whose message names this setting:
    ///
    /// - its parent is missing, not root's, or writable by others without
    ///   the sticky bit;
    /// - the user may not create it: on Fedora and Arch, `/run/lock` is
    ///   root's alone (mode 0755). Root may create it for the user (a
    ///   `tmpfiles.d` line `d /run/lock/leasehold-1000 0700 alice - -`),
    ///   or the service gives a directory;
    /// - on Linux, the process may see another directory at that path than
    ///   the rest of the host: the mount holding `/run/lock` is not the one
    ///   the host's init (pid 1) sees there, as in a mount namespace with a
    ///   `/run` or `/run/lock` of its own (`TemporaryFileSystem=`,
    ///   `BindPaths=`, a sandbox). A unit whose namespace shares the host's
    ///   `/run/lock` (`PrivateTmp=`, `ProtectHome=`) passes. Where pid 1's
    ///   mount table cannot be read (`hidepid`), a bind mount of another
    ///   directory there is refused.
    ///
    /// It is also refused ([`Error::InsecureDirectory`]) unless it belongs
    /// to the user and is closed to others (mode 0700), and fails if it is
    /// on a read-only mount (`ProtectSystem=strict`). Processes of
    /// different users never share the default; give them an explicit
    /// directory. Containers are hosts of their own here: processes in two
    /// containers, or in a container and on its host, do not meet in the
    /// default.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locks = dir.path().join("locks"); // created by `build`, mode 0700
    /// let locker = leasehold::Locker::builder().directory(&locks).build()?;
    /// assert!(locks.is_dir());
    /// assert_eq!(locker.directory().file_name(), locks.file_name());
    /// # Ok(()) }
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use std::time::Duration;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::builder()
    ///     .directory(dir.path())
    ///     .lease(Duration::from_secs(5))
    ///     .build()?;
    /// let guard = locker.acquire("report").await?;
    /// let owner = guard.owner();
    /// let lease = owner.lease_expires_at().unwrap().duration_since(owner.acquired_at().unwrap());
    /// assert_eq!(lease.unwrap(), Duration::from_secs(5));
    ///
    /// let too_short = leasehold::Locker::builder()
    ///     .directory(dir.path())
    ///     .lease(Duration::from_millis(10))
    ///     .build();
    /// assert!(matches!(too_short, Err(leasehold::Error::InvalidConfig { .. })));
    /// # Ok(()) }
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use std::time::Duration;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::builder()
    ///     .directory(dir.path())
    ///     .lease(Duration::from_millis(300))
    ///     .renew_interval(Duration::from_millis(50))
    ///     .build()?;
    /// let guard = locker.acquire("report").await?;
    /// tokio::time::sleep(Duration::from_millis(700)).await; // over two leases
    /// guard.ensure_held().await?; // renewed all along
    /// # Ok(()) }
    /// ```
    pub fn renew_interval(mut self, interval: Duration) -> Self {
        self.renew_interval = Some(interval);
        self
    }

    /// How long a waiter sleeps between attempts (with ±25 % jitter) when
    /// the lock directory cannot be watched. Where it can (inotify on
    /// Linux), waiters wake on the filesystem event that frees the lock,
    /// and check at least every `max(poll_interval, 1 s)` as a safety net
    /// against missed events.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// use std::time::Duration;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::builder()
    ///     .directory(dir.path())
    ///     .poll_interval(Duration::from_millis(10))
    ///     .build()?;
    ///
    /// let zero = leasehold::Locker::builder().directory(dir.path()).poll_interval(Duration::ZERO).build();
    /// assert!(zero.is_err());
    /// # drop(locker);
    /// # Ok(()) }
    /// ```
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// After how long a waiting acquisition says whom it waits for: one
    /// `tracing` event at INFO level (target `leasehold::engine`) naming
    /// the lock, the holder it found (pid, host, and since when, as the
    /// holder's record says) and how long it has waited, then the same
    /// again every six times this (every 30 s with the default 5 s) for
    /// as long as it waits. `None` turns the notices off; zero is refused
    /// by [`build`](Self::build).
    ///
    /// One task per name and `Locker` waits on the lock itself (the head
    /// of the `Locker`'s queue for the name); it gives the notices. Tasks
    /// queued behind it, or behind another task of the same `Locker` that
    /// holds the lock, give none. A timed-out acquisition names the holder
    /// last seen in its error: [`Error::holder`]. On PostgreSQL, whose
    /// failed attempts say nothing of the holder, the notice names none.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use std::time::Duration;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::builder()
    ///     .directory(dir.path())
    ///     .wait_notice(Some(Duration::from_secs(60)))
    ///     .build()?;
    /// # drop(locker);
    /// let quiet = leasehold::Locker::builder().directory(dir.path()).wait_notice(None).build()?;
    /// # drop(quiet);
    /// # Ok(()) }
    /// ```
    pub fn wait_notice(mut self, after: Option<Duration>) -> Self {
        self.wait_notice = after;
        self
    }

    /// How long an unreadable record (empty, torn, not a lock record) is
    /// left alone before it may be reclaimed: its writer may be in the
    /// middle of writing it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use std::time::Duration;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::builder()
    ///     .directory(dir.path())
    ///     .unreadable_grace(Duration::from_secs(60))
    ///     .build()?;
    ///
    /// // A lock file whose writer has not written it yet: not stale for 60 s.
    /// std::fs::write(locker.lock_path("report")?, b"").unwrap();
    /// assert!(locker.try_acquire("report").await?.is_none());
    /// let info = locker.inspect("report").await?.expect("present");
    /// assert!(!info.owner().is_readable() && !info.is_stale());
    /// # Ok(()) }
    /// ```
    pub fn unreadable_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Whether to `fdatasync` each new owner record before the lock counts
    /// as held (off by default).
    ///
    /// A lock record has one job across a machine crash: to be recognised
    /// as stale afterwards. Without a sync, a power loss can leave a record
    /// empty or torn; such a record whose last change predates the current
    /// boot is taken over at once (after the reboot nobody can be writing
    /// it), and one from a leasehold holder of an earlier boot is stale by
    /// its boot id. So the sync buys nothing for mutual exclusion, and costs
    /// a disk flush per acquisition: about 0.3 ms on a local ext4 disk,
    /// milliseconds on a network filesystem, against tens of microseconds
    /// for the whole acquisition without it.
    ///
    /// Turn it on where a record must survive a power loss intact, for
    /// someone reading it afterwards (who held the lock when the machine
    /// died). Where the boot time cannot be known (a time namespace that
    /// shifts the boot clock), an empty or torn record is taken over after
    /// the [grace period](Self::unreadable_grace) instead. Fencing counters
    /// are synced either way ([`fencing`](Self::fencing)): tokens must grow
    /// across crashes.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::builder().directory(dir.path()).durable(true).build()?;
    /// let guard = locker.acquire("nightly-report").await?; // record synced to disk
    /// assert!(locker.is_held("nightly-report").await?);
    /// # drop(guard);
    /// # Ok(()) }
    /// ```
    pub fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// The implied lease of a lock whose record carries none (records
    /// written by pi-research's code), counted from the record's last
    /// change: after it, the lock is reclaimed even if its owner process
    /// lives, as pi-research itself would do. Values over a year count
    /// as a year; values below 200 ms (the shortest lease leasehold
    /// accepts of its own) make [`build`](Self::build) return
    /// [`Error::InvalidConfig`].
    ///
    /// `None` never reclaims the record without a lease of an owner that
    /// is provably alive: a live process of this host, or a leasehold
    /// holder whose `flock` is held. One whose owner cannot be checked
    /// (another host or pid namespace, no pid) is still reclaimed 24 hours
    /// after its last change.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// use std::time::Duration;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// // Trust a pi-research holder that lives for at most ten minutes.
    /// let locker = leasehold::Locker::builder()
    ///     .directory(dir.path())
    ///     .foreign_lease(Some(Duration::from_secs(600)))
    ///     .build()?;
    /// # drop(locker);
    /// # Ok(()) }
    /// ```
    pub fn foreign_lease(mut self, lease: Option<Duration>) -> Self {
        self.foreign_lease = lease;
        self
    }

    /// Whether acquisitions get fencing tokens (off by default).
    ///
    /// With fencing, each acquisition of a name gets a number greater than
    /// every earlier acquisition's, in every process that shares the
    /// directory with fencing on, across crashes and restarts
    /// ([`LockGuard::fencing_token`](crate::LockGuard::fencing_token)). The counter is kept beside the lock
    /// in `<lock file>.fence`, advanced in blocks of up to 1,024 so in-process
    /// handoffs do not touch the disk; it costs one more write and two syncs
    /// (the counter and its directory, durable records or not: tokens must
    /// grow across crashes) per acquisition from the disk. Records from
    /// processes without fencing, velocious's and pi-research's included, carry no token.
    ///
    /// In a lock directory, tokens count microseconds of the wall clock
    /// since the Unix epoch (a token is at least the clock's reading, and at
    /// most a second ahead of it), so they keep growing when the counter is
    /// lost: deleted, its directory re-created, a tmpfs rebooted. That rests
    /// on one thing: that the wall clock, when the first token after the
    /// loss is handed out, is not behind where it stood when the last one
    /// before the loss was reserved. (While the counter is there, a clock
    /// that goes back changes nothing.) Tokens stay below 2^53, exact as
    /// JSON numbers in JavaScript, until the year 2255. On PostgreSQL they
    /// come from a sequence.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let fenced = leasehold::Locker::builder().directory(dir.path()).fencing(true).build()?;
    /// let token = fenced.acquire("ledger").await?.fencing_token();
    /// assert!(token.is_some());
    ///
    /// let plain = leasehold::Locker::new(dir.path())?;
    /// assert_eq!(plain.acquire("ledger").await?.fencing_token(), None);
    /// # Ok(()) }
    /// ```
    pub fn fencing(mut self, fencing: bool) -> Self {
        self.fencing = fencing;
        self
    }

    /// Whether a lock goes to the processes that want it strictly in the
    /// order they began to wait (off by default).
    ///
    /// By default a process that releases a lock while another process
    /// waits for it may take it again at once, up to 32 times in a row (4
    /// for a semaphore's permits) or for 10 ms, whichever ends first: a
    /// *turn*, which keeps most of the throughput of a loop that takes and
    /// gives back the same lock. Then the waiter whose wait began first
    /// gets it. Turns are fair on average but not at every moment: a turn
    /// that the scheduler cuts short (the holder not running when it
    /// would take the lock again) is shorter than another, so over a
    /// couple of seconds of 16 processes contending on two cores, the
    /// least served process got 0.52 to 0.7 of what the most served got
    /// (BENCHMARKS.md).
    ///
    /// With `fair(true)`, a turn is one acquisition: a release that finds
    /// another process waiting lets it in, and this `Locker`'s next
    /// attempt waits behind it; and the tasks of this `Locker` no longer
    /// pass the lock among themselves while another process is seen
    /// waiting for it (they take their turns in the line with everyone
    /// else). The same 16 processes then get 0.87 to 0.96 of each other's
    /// share (the worst of three 2 s runs; single runs up to 0.99), and a
    /// third to a half of the acquisitions per second, every
    /// one of them a handoff from process to process. Processes with and
    /// without it share locks as ever; each keeps its own turns. Only a
    /// waiter's ticket in line ends a fair turn, and not one this
    /// `Locker` has passed over (its waiter did not come when it had the
    /// chance): a waiter frozen in line costs a fair `Locker` what it
    /// costs any other (a few looks, once), and byte ranges that anyone
    /// who can read the directory holds cost it nothing more. Another `Locker` of the same process counts
    /// as another process here: each opens the lock directory itself, and
    /// takes its own place in line.
    ///
    /// The order comes from the waiting line (docs/format.md, *The
    /// waiting line*), which runs on Linux and Windows on local
    /// filesystems; where it is off (macOS, FreeBSD, network filesystems)
    /// nobody can be seen waiting, and `fair` changes nothing. A setting
    /// for locks in a directory: [`build`](Self::build) refuses it with
    /// [`postgres`](Self::postgres), where the server orders waiters.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::builder().directory(dir.path()).fair(true).build()?;
    /// for _ in 0..3 {
    ///     // With other processes waiting, each of these waits its turn.
    ///     let _guard = locker.acquire("nightly-report").await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// The on-disk layout of locks: see [`Strategy`] and, for choosing, the
    /// crate docs' *Which strategy should you use?*. Every process sharing
    /// a lock must use the same one.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use leasehold::{Locker, Strategy};
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = Locker::builder().directory(dir.path()).strategy(Strategy::Directory).build()?;
    /// let _guard = locker.acquire("assets").await?;
    /// assert!(locker.lock_path("assets")?.join("owner.json").is_file());
    /// # Ok(()) }
    /// ```
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// Keep the locks on a PostgreSQL server instead of in a directory
    /// (feature `postgres`), for processes on several hosts. `url` is a
    /// libpq-style connection string or URL (`postgres://user@host/db`,
    /// `host=/run/postgresql user=app`), with libpq's `sslmode` (all five
    /// modes; see [`PgSslMode`](crate::PgSslMode)) and `sslrootcert`; to
    /// pass the application's own client settings instead, see
    /// [`postgres_config`](Self::postgres_config). Unless the string sets
    /// `application_name`, the connections show as `leasehold/<version>`
    /// in `pg_stat_activity`. The settings for lock files
    /// (`directory`, `strategy`, `path_style`, `allow_insecure_directory`,
    /// `create_directory`, `read_only`, `durable`, `unreadable_grace`, `foreign_lease`) cannot be combined
    /// with it: [`build`](Self::build) refuses them rather than ignore them
    /// (set to their defaults, they count as unset). Fencing tokens are
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
        self.postgres = Some(crate::postgres::Source::Url(url.into()));
        self
    }

    /// Keep the locks on a PostgreSQL server (as
    /// [`postgres`](Self::postgres) does), reached with the application's
    /// own client settings: a password from a secret store, timeouts,
    /// keepalives, several hosts, its own `application_name`. Unless
    /// `config` sets `application_name`, the `Locker`'s connections show
    /// as `leasehold/<version>` in `pg_stat_activity`, so a DBA can tell
    /// them from the application's own.
    ///
    /// `config` is the `postgres` crate's (version 0.19, which this crate
    /// depends on), whose `ssl_mode` knows only `disable`, `prefer` and
    /// `require`: set `verify-ca` or `verify-full` with
    /// [`postgres_ssl_mode`](Self::postgres_ssl_mode), and the root
    /// certificate with [`postgres_root_cert`](Self::postgres_root_cert).
    /// Every connection of the `Locker` is made with `config` (see the
    /// crate docs, *PostgreSQL*, for which and when).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> leasehold::Result<()> {
    /// # fn secret(_: &str) -> String { String::new() }
    /// use std::time::Duration;
    ///
    /// let mut config = postgres::Config::new();
    /// config
    ///     .host("db.internal")
    ///     .user("app")
    ///     .password(secret("db-password"))
    ///     .dbname("app")
    ///     .connect_timeout(Duration::from_secs(5));
    /// let locker = leasehold::Locker::builder().postgres_config(config).build()?;
    /// let _guard = locker.acquire("nightly-report").await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres_config(mut self, config: postgres::Config) -> Self {
        self.postgres = Some(crate::postgres::Source::Config(Box::new(config)));
        self
    }

    /// The `sslmode` of the connections to PostgreSQL, over the one of the
    /// connection string or client settings (the default: `prefer`). See
    /// [`PgSslMode`](crate::PgSslMode): every mode that asks for TLS needs
    /// the feature `postgres-tls`, and [`build`](Self::build) refuses it
    /// without ([`Error::Unsupported`]); `verify-ca` and `verify-full`
    /// need a root certificate ([`postgres_root_cert`](Self::postgres_root_cert),
    /// `sslrootcert`, or libpq's `~/.postgresql/root.crt`), or `build`
    /// refuses them ([`Error::InvalidConfig`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> leasehold::Result<()> {
    /// use leasehold::{Locker, PgSslMode};
    ///
    /// let locker = Locker::builder()
    ///     .postgres("host=db.internal user=app dbname=app")
    ///     .postgres_ssl_mode(PgSslMode::VerifyFull)
    ///     .postgres_root_cert("/etc/ssl/db-ca.pem")
    ///     .build()?;
    /// # let _ = locker;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres_ssl_mode(mut self, mode: crate::postgres::PgSslMode) -> Self {
        self.postgres_tls.mode = Some(mode);
        self
    }

    /// The root certificates (a PEM file of one or more) that the
    /// server's certificate must lead to, over the connection string's
    /// `sslrootcert`; `"system"` means the platform's store, as in libpq.
    /// Read once, by [`build`](Self::build). With
    /// `sslmode=require` (or `prefer`) the chain is then checked too, as
    /// libpq does. Needs TLS (feature `postgres-tls`) to be of any use;
    /// see [`postgres_ssl_mode`](Self::postgres_ssl_mode).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> leasehold::Result<()> {
    /// let locker = leasehold::Locker::builder()
    ///     .postgres("postgres://app@db.internal/app?sslmode=verify-full")
    ///     .postgres_root_cert("/etc/ssl/db-ca.pem")
    ///     .build()?;
    /// # let _ = locker;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres_root_cert(mut self, pem: impl Into<PathBuf>) -> Self {
        self.postgres_tls.root_cert = Some(pem.into());
        self
    }

    /// How lock names become file names: see [`PathStyle`]. Every process
    /// sharing a lock must use the same one.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// use leasehold::{Locker, PathStyle};
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = Locker::builder().directory(dir.path()).path_style(PathStyle::Plain).build()?;
    /// assert_eq!(locker.lock_path("state")?, locker.directory().join("state.lock"));
    /// # Ok(()) }
    /// ```
    pub fn path_style(mut self, style: PathStyle) -> Self {
        self.path_style = style;
        self
    }

    /// Accept a world-writable lock directory without the sticky bit, where
    /// any local user can remove or replace lock files. Only for
    /// directories whose access you control by other means.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// use std::os::unix::fs::PermissionsExt;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    ///
    /// let refused = leasehold::Locker::new(dir.path());
    /// assert!(matches!(refused, Err(leasehold::Error::InsecureDirectory { .. })));
    ///
    /// let accepted = leasehold::Locker::builder()
    ///     .directory(dir.path())
    ///     .allow_insecure_directory(true)
    ///     .build()?;
    /// # drop(accepted);
    /// # Ok(()) }
    /// ```
    pub fn allow_insecure_directory(mut self, allow: bool) -> Self {
        self.allow_insecure_directory = allow;
        self
    }

    /// Whether [`build`](Self::build) creates a missing lock directory
    /// (the default). With `false`, a missing directory fails `build`
    /// with [`Error::Io`] whose source is [`NotFound`](std::io::ErrorKind::NotFound),
    /// and nothing is created: for tools that only look (a `holder` or
    /// `list` command must not make the directory it was asked about), and
    /// for a directory that must already exist.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let missing = dir.path().join("not-yet");
    ///
    /// let refused = leasehold::Locker::builder().directory(&missing).create_directory(false).build();
    /// assert!(matches!(refused, Err(leasehold::Error::Io { ref source, .. }) if source.kind() == std::io::ErrorKind::NotFound));
    /// assert!(!missing.exists());
    ///
    /// let made = leasehold::Locker::builder().directory(&missing).build()?;
    /// assert!(missing.is_dir());
    /// # drop(made);
    /// # Ok(()) }
    /// ```
    pub fn create_directory(mut self, create: bool) -> Self {
        self.create_directory = create;
        self
    }

    /// A `Locker` that only looks: [`build`](Self::build) then asks of
    /// the directory only that this process may list and search it, not
    /// write it, so that a user who may only read a service's lock
    /// directory (or a directory on a read-only mount) can still see who
    /// holds what with [`holder`](crate::Locker::holder),
    /// [`inspect`](crate::Locker::inspect) and
    /// [`list`](crate::Locker::list). Taking a lock, or `clean`, on a
    /// directory this process cannot write then fails at that call with
    /// [`Error::PermissionDenied`] (or an `EROFS` I/O error) instead. The
    /// `leasehold` tool's `holder`, `list` and `clean --dry-run` build
    /// this way. Default `false`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let viewer = leasehold::Locker::builder()
    ///     .directory(dir.path())
    ///     .read_only(true)
    ///     .build()?;
    /// assert!(viewer.list().await?.is_empty());
    /// # Ok(()) }
    /// ```
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// A field to publish in every lock record this `Locker` writes (and,
    /// on PostgreSQL, in its owner table), as velocious's
    /// `extraOwnerFields` does: its HTTP server lock publishes `host` and
    /// `port`, so that another process that finds the lock held knows
    /// where the server runs. Readers get it through
    /// [`Owner::field`](crate::Owner::field), from
    /// [`Locker::holder`](crate::Locker::holder) and the other inspection
    /// methods, in this process and in others; velocious's own reader
    /// sees it in `owner.json`.
    ///
    /// The value is written as a JSON string, number or boolean, after
    /// the record's own fields, in the order the fields were first set
    /// (setting a key again replaces its value), and kept across
    /// renewals. Limits, checked by [`build`](Self::build), which returns
    /// [`Error::InvalidConfig`] otherwise: a key is 1 to 64 bytes without
    /// control characters and is not one of the record's own keys (`pid`,
    /// `uuid`, `hostname`, `holderId`, `acquiredAt`, `leaseExpiresAt`,
    /// `startTime`, `name`, … : the full list is in the error message and
    /// in `docs/format.md`); a number is finite; all fields together take
    /// at most 4 KiB as JSON.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::builder()
    ///     .directory(dir.path())
    ///     .owner_field("host", "127.0.0.1")
    ///     .owner_field("port", 8080)
    ///     .build()?;
    /// let _guard = locker.acquire("dev-server").await?;
    ///
    /// let owner = locker.holder("dev-server").await?.expect("held");
    /// assert_eq!(owner.field("port").and_then(|v| v.as_i64()), Some(8080));
    ///
    /// let clash = leasehold::Locker::builder().directory(dir.path()).owner_field("pid", 1u32).build();
    /// assert!(matches!(clash, Err(leasehold::Error::InvalidConfig { .. })));
    /// # Ok(()) }
    /// ```
    pub fn owner_field(mut self, key: &str, value: impl Into<FieldValue>) -> Self {
        self.owner_fields.push((key.to_owned(), value.into()));
        self
    }

    /// The engine a `Locker` runs on: the settings checked, the backend
    /// built. [`build`](Self::build) wraps it.
    pub(crate) fn engine(self) -> Result<Engine> {
        let renew_interval = self.validate()?;
        let holder_id = format!("{}-{}", std::process::id(), uuid::Uuid::new_v4().simple());
        let (lease, poll_interval, wait_notice, path_style) = (
            self.lease,
            self.poll_interval,
            self.wait_notice,
            self.effective_path_style(),
        );
        let fair = self.fair;
        Engine::new(
            lease,
            renew_interval,
            poll_interval,
            wait_notice,
            path_style,
            fair,
            |counters, waiters| self.store(holder_id, counters, waiters),
        )
    }

    /// Checks the settings together; returns the renew interval.
    fn validate(&self) -> Result<Duration> {
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
        if self.wait_notice.is_some_and(|after| after.is_zero()) {
            return invalid("the wait notice threshold must be above zero (`None` turns notices off)".into());
        }
        if self.grace.is_zero() {
            return invalid("the unreadable grace period must be above zero".into());
        }
        if let Some(foreign) = self.foreign_lease.filter(|lease| *lease < MIN_LEASE) {
            return invalid(format!(
                "the foreign lease {foreign:?} is below {MIN_LEASE:?}: it would reclaim a live \
                 pi-research holder's lock about as soon as it was written (`None` never reclaims \
                 a provably alive owner's)"
            ));
        }
        #[cfg(feature = "postgres")]
        if self.postgres.is_none()
            && (self.postgres_tls.mode.is_some() || self.postgres_tls.root_cert.is_some())
        {
            return invalid(
                "`postgres_ssl_mode` and `postgres_root_cert` are settings for a Locker on PostgreSQL; \
                 set the server with `postgres` or `postgres_config`"
                    .into(),
            );
        }
        #[cfg(feature = "postgres")]
        if self.postgres.is_some() {
            let files_only = [
                (self.directory.is_some(), "directory"),
                (self.strategy != Strategy::default(), "strategy"),
                (self.path_style != PathStyle::default(), "path_style"),
                (self.allow_insecure_directory, "allow_insecure_directory"),
                (!self.create_directory, "create_directory"),
                (self.read_only, "read_only"),
                (self.durable, "durable"),
                (self.fair, "fair"),
                (self.grace != DEFAULT_GRACE, "unreadable_grace"),
                (self.foreign_lease != Some(DEFAULT_FOREIGN_LEASE), "foreign_lease"),
            ];
            if let Some((_, setting)) = files_only.iter().find(|(set, _)| *set) {
                return invalid(format!(
                    "`{setting}` is a setting for locks in a directory; a Locker on PostgreSQL has none"
                ));
            }
        }
        Ok(renew_interval)
    }

    /// Connects to the server, or opens the lock directory.
    fn store(
        self,
        holder_id: String,
        counters: Arc<crate::stats::Counters>,
        waiters: Waiters,
    ) -> Result<Store> {
        let fields = OwnerFields::new(&self.owner_fields)?;
        #[cfg(feature = "postgres")]
        if let Some(source) = &self.postgres {
            let target = crate::postgres::Target::new(source, &self.postgres_tls)?;
            let pg = crate::postgres::Pg::connect(target, holder_id, fields, self.lease, waiters)?;
            return Ok(Store::Postgres(Arc::new(pg)));
        }
        let place = fs::Place {
            directory: self.directory,
            allow_insecure: self.allow_insecure_directory,
            create: self.create_directory,
            read_only: self.read_only,
        };
        let settings = fs::Settings {
            strategy: self.strategy,
            lease: self.lease,
            grace: self.grace,
            foreign_lease: self.foreign_lease,
            durable: self.durable,
            fencing: self.fencing,
            fair: self.fair,
            fields,
        };
        Ok(Store::Fs(Arc::new(Fs::open(
            place, settings, holder_id, counters, waiters,
        )?)))
    }

    /// How lock names become file names (on a server, names are keys).
    pub(crate) fn effective_path_style(&self) -> PathStyle {
        #[cfg(feature = "postgres")]
        if self.postgres.is_some() {
            return PathStyle::Hashed;
        }
        self.path_style
    }
}
