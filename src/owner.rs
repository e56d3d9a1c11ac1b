//! The public view of a lock record.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::field::FieldValue;
use crate::mode::Mode;
use crate::record::{OwnRecord, Parsed, Record};
use crate::stale::StaleReason;

/// Who holds a lock, as its record says.
///
/// Every field is optional because leasehold also reads records written by
/// other programs (velocious's and pi-research's layouts) that omit some of them, and a record
/// that is still being written has none yet.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// let dir = tempfile::tempdir().unwrap();
/// let locker = leasehold::Locker::new(dir.path())?;
/// let guard = locker.acquire("nightly-report").await?;
///
/// let owner = locker.holder("nightly-report").await?.expect("held");
/// assert_eq!(owner.pid(), Some(std::process::id()));
/// assert!(owner.lease_expires_at() > owner.acquired_at());
/// assert_eq!(owner.uuid(), guard.owner().uuid());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Owner {
    pid: Option<u32>,
    hostname: Option<String>,
    holder_id: Option<String>,
    uuid: Option<String>,
    acquired_at: Option<SystemTime>,
    lease_expires_at: Option<SystemTime>,
    readable: bool,
    leasehold: bool,
    fencing_token: Option<u64>,
    name: Option<String>,
    fields: Vec<(String, FieldValue)>,
}

impl Owner {
    pub(crate) fn from_parsed(parsed: &Parsed) -> Self {
        match parsed {
            Parsed::Record(r) => Self::from_record(r),
            Parsed::Legacy { uuid } => Owner {
                uuid: Some(uuid.clone()),
                readable: true,
                ..Self::unreadable()
            },
            Parsed::Unreadable | Parsed::UuidPrefix | Parsed::Foreign => Self::unreadable(),
        }
    }

    pub(crate) fn from_record(r: &Record) -> Self {
        Owner {
            pid: r.pid.and_then(|p| u32::try_from(p).ok()),
            hostname: r.hostname.clone(),
            holder_id: r.holder_id.clone(),
            uuid: r.uuid.clone(),
            acquired_at: r.acquired_at,
            lease_expires_at: r.lease_expires_at,
            readable: true,
            leasehold: r.is_leasehold(),
            fencing_token: r.fencing_token,
            name: r.name.clone(),
            fields: r.fields.clone(),
        }
    }

    /// The owner a reader of `r` would find, without writing and parsing
    /// it: what a guard reports about its own lock.
    pub(crate) fn from_own(r: &OwnRecord) -> Self {
        Owner {
            pid: Some(r.pid),
            hostname: Some(r.hostname.clone()),
            holder_id: Some(r.holder_id.clone()),
            uuid: Some(r.uuid.clone()),
            acquired_at: Some(to_millis(r.times.0)),
            lease_expires_at: Some(to_millis(r.times.1)),
            readable: true,
            leasehold: true,
            fencing_token: r.fencing_token,
            name: Some(r.name.clone()),
            fields: r
                .fields
                .as_ref()
                .map(|f| f.read_back().to_vec())
                .unwrap_or_default(),
        }
    }

    /// An owner as a lock server's table records it.
    #[cfg(feature = "postgres")]
    pub(crate) fn from_server(
        name: &str,
        holder_id: Option<String>,
        hostname: Option<String>,
        pid: Option<u32>,
        acquired_at: Option<SystemTime>,
        fencing_token: Option<u64>,
        fields: Vec<(String, FieldValue)>,
    ) -> Self {
        Owner {
            pid,
            hostname,
            holder_id,
            acquired_at,
            readable: true,
            leasehold: true,
            fencing_token,
            name: Some(name.to_owned()),
            fields,
            ..Self::unreadable()
        }
    }

    fn unreadable() -> Self {
        Owner {
            pid: None,
            hostname: None,
            holder_id: None,
            uuid: None,
            acquired_at: None,
            lease_expires_at: None,
            readable: false,
            leasehold: false,
            fencing_token: None,
            name: None,
            fields: Vec::new(),
        }
    }

    /// The holder's process id.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _guard = locker.acquire("report").await?;
    /// let owner = locker.holder("report").await?.expect("held");
    /// assert_eq!(owner.pid(), Some(std::process::id()));
    /// # Ok(()) }
    /// ```
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The holder's host name.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _guard = locker.acquire("report").await?;
    /// let owner = locker.holder("report").await?.expect("held");
    /// assert!(owner.hostname().is_some_and(|host| !host.is_empty()));
    /// # Ok(()) }
    /// ```
    pub fn hostname(&self) -> Option<&str> {
        self.hostname.as_deref()
    }

    /// The id of the holding [`Locker`](crate::Locker) instance (velocious's
    /// `holderId`).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _guard = locker.acquire("report").await?;
    /// let owner = locker.holder("report").await?.expect("held");
    /// // One id per Locker: every lock this Locker takes carries it.
    /// let _other = locker.acquire("audit").await?;
    /// let other = locker.holder("audit").await?.expect("held");
    /// assert!(owner.holder_id().is_some());
    /// assert_eq!(owner.holder_id(), other.holder_id());
    /// # Ok(()) }
    /// ```
    pub fn holder_id(&self) -> Option<&str> {
        self.holder_id.as_deref()
    }

    /// The id of this one acquisition (pi-research's `uuid`).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _guard = locker.acquire("report").await?;
    /// let owner = locker.holder("report").await?.expect("held");
    /// assert_eq!(owner.uuid(), _guard.owner().uuid());
    /// assert!(owner.uuid().is_some());
    /// # Ok(()) }
    /// ```
    pub fn uuid(&self) -> Option<&str> {
        self.uuid.as_deref()
    }

    /// When the lock was acquired.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _guard = locker.acquire("report").await?;
    /// let owner = locker.holder("report").await?.expect("held");
    /// let since = owner.acquired_at().expect("leasehold records say");
    /// assert!(since <= std::time::SystemTime::now());
    /// # Ok(()) }
    /// ```
    pub fn acquired_at(&self) -> Option<SystemTime> {
        self.acquired_at
    }

    /// When the lease runs out unless renewed, as last written by the holder.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _guard = locker.acquire("report").await?;
    /// let owner = locker.holder("report").await?.expect("held");
    /// // 30 s by default, renewed every 10 s while the guard lives.
    /// assert!(owner.lease_expires_at() > Some(std::time::SystemTime::now()));
    /// # Ok(()) }
    /// ```
    pub fn lease_expires_at(&self) -> Option<SystemTime> {
        self.lease_expires_at
    }

    /// `false` when the record could not be parsed (empty, partly written,
    /// or not a lock record); the other fields are then `None`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _guard = locker.acquire("report").await?;
    /// let owner = locker.holder("report").await?.expect("held");
    /// assert!(owner.is_readable());
    ///
    /// // A lock file its writer has not written yet:
    /// std::fs::write(locker.lock_path("half")?, b"").unwrap();
    /// let half = locker.holder("half").await?.expect("present");
    /// assert!(!half.is_readable() && half.pid().is_none());
    /// # Ok(()) }
    /// ```
    pub fn is_readable(&self) -> bool {
        self.readable
    }

    /// The fencing token the holder took the lock from the disk with, if it
    /// uses fencing (see [`LockerBuilder::fencing`](crate::LockerBuilder::fencing)).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _guard = locker.acquire("report").await?;
    /// let owner = locker.holder("report").await?.expect("held");
    /// assert_eq!(owner.fencing_token(), None); // fencing is off by default
    ///
    /// let fenced = leasehold::Locker::builder().directory(dir.path()).fencing(true).build()?;
    /// let guard = fenced.acquire("ledger").await?;
    /// let holder = fenced.holder("ledger").await?.expect("held");
    /// assert_eq!(holder.fencing_token(), guard.fencing_token());
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// The lock name, as the holder gave it (leasehold records only).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _guard = locker.acquire("report").await?;
    /// let owner = locker.holder("report").await?.expect("held");
    /// assert_eq!(owner.name(), Some("report"));
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Whether the record was written by leasehold (rather than by another
    /// program sharing the directory).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _guard = locker.acquire("ours").await?;
    /// assert!(locker.holder("ours").await?.expect("held").is_leasehold());
    ///
    /// // A lock file pi-research's FileLockService wrote:
    /// let record = format!(r#"{{"uuid":"a1","pid":{}}}"#, std::process::id());
    /// std::fs::write(locker.lock_path("theirs")?, record).unwrap();
    /// assert!(!locker.holder("theirs").await?.expect("held").is_leasehold());
    /// # Ok(()) }
    /// ```
    pub fn is_leasehold(&self) -> bool {
        self.leasehold
    }

    /// The owner field `key` the holder published (see
    /// [`LockerBuilder::owner_field`](crate::LockerBuilder::owner_field)),
    /// or one that velocious's `extraOwnerFields` put in its record: any
    /// top-level string, number or boolean that is not one of the record's
    /// own fields. `None` if the record has no such field.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use leasehold::FieldValue;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let server = leasehold::Locker::builder()
    ///     .directory(dir.path())
    ///     .owner_field("host", "127.0.0.1")
    ///     .owner_field("port", 8080u16)
    ///     .build()?;
    /// let _serving = server.acquire("dev-server").await?;
    ///
    /// let other = leasehold::Locker::new(dir.path())?;
    /// let owner = other.holder("dev-server").await?.expect("held");
    /// assert_eq!(owner.field("host").and_then(FieldValue::as_str), Some("127.0.0.1"));
    /// assert_eq!(owner.field("port").and_then(FieldValue::as_i64), Some(8080));
    /// assert_eq!(owner.field("pid"), None); // the record's own, not a field
    /// # Ok(()) }
    /// ```
    pub fn field(&self, key: &str) -> Option<&FieldValue> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Every owner field of the record, in the order of their keys: see
    /// [`field`](Self::field).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::builder()
    ///     .directory(dir.path())
    ///     .owner_field("role", "indexer")
    ///     .owner_field("shard", 3u32)
    ///     .build()?;
    /// let guard = locker.acquire("index").await?;
    /// let keys: Vec<&str> = guard.owner().fields().map(|(key, _)| key).collect();
    /// assert_eq!(keys, ["role", "shard"]);
    /// # drop(guard);
    /// # Ok(()) }
    /// ```
    pub fn fields(&self) -> impl Iterator<Item = (&str, &FieldValue)> {
        self.fields.iter().map(|(k, v)| (k.as_str(), v))
    }
}

/// One lock found in the directory by [`Locker::list`](crate::Locker::list).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// let dir = tempfile::tempdir().unwrap();
/// let locker = leasehold::Locker::new(dir.path())?;
/// let _guard = locker.acquire("nightly report").await?;
/// let locks = locker.list().await?;
/// assert_eq!(locks.len(), 1);
/// assert_eq!(locks[0].name(), "nightly report");
/// assert!(!locks[0].is_stale());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LockInfo {
    path: Option<std::path::PathBuf>,
    name: String,
    owner: Owner,
    stale: Option<StaleReason>,
    kind: LockKind,
    holders: Vec<Owner>,
}

/// How a name is held.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// use leasehold::LockKind;
///
/// let dir = tempfile::tempdir().unwrap();
/// let locker = leasehold::Locker::new(dir.path())?;
/// let _permit = locker.semaphore("gpu", 2)?.acquire().await?;
/// let info = locker.inspect("gpu").await?.unwrap();
/// assert_eq!(info.kind(), LockKind::Semaphore { permits: 2 });
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockKind {
    /// One holder ([`Locker::acquire`](crate::Locker::acquire)).
    Exclusive,
    /// Shared holders ([`Locker::acquire_shared`](crate::Locker::acquire_shared)).
    Shared,
    /// Permit holders of a [`Semaphore`](crate::Semaphore) of this many
    /// permits.
    Semaphore {
        /// The semaphore's permit count.
        permits: u32,
    },
}

impl LockKind {
    pub(crate) fn from_mode(mode: Mode) -> Self {
        match mode {
            Mode::Exclusive => LockKind::Exclusive,
            Mode::Shared => LockKind::Shared,
            Mode::Permit(permits) => LockKind::Semaphore { permits },
        }
    }
}

impl LockInfo {
    pub(crate) fn new(
        path: Option<std::path::PathBuf>,
        name: String,
        owner: Owner,
        stale: Option<StaleReason>,
    ) -> Self {
        Self {
            path,
            name,
            holders: vec![owner.clone()],
            owner,
            stale,
            kind: LockKind::Exclusive,
        }
    }

    /// The same, held as `kind` by `holders`.
    pub(crate) fn with_holders(mut self, kind: LockKind, holders: Vec<Owner>) -> Self {
        self.kind = kind;
        self.holders = holders;
        self
    }

    /// How the name is held: exclusively, shared, or as a semaphore.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let guard = locker.acquire("nightly report").await?;
    /// let info = locker.inspect("nightly report").await?.expect("held");
    /// assert_eq!(info.kind(), leasehold::LockKind::Exclusive);
    /// # drop(guard);
    /// # Ok(()) }
    /// ```
    pub fn kind(&self) -> LockKind {
        self.kind
    }

    /// Every holder: the owner alone for an exclusive lock; for a shared
    /// lock or a semaphore, every live holder, oldest first (pid, host,
    /// and since when, in [`Owner::acquired_at`]). For a shared lock
    /// [`owner`](Self::owner) is the one whose record the lock path shows.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let guard = locker.acquire("nightly report").await?;
    /// let info = locker.inspect("nightly report").await?.expect("held");
    /// assert_eq!(info.holders().len(), 1);
    /// drop(guard);
    ///
    /// let _a = locker.acquire_shared("catalog").await?;
    /// let reader = leasehold::Locker::new(dir.path())?;
    /// let _b = reader.acquire_shared("catalog").await?;
    /// let shared = locker.inspect("catalog").await?.expect("held");
    /// assert_eq!(shared.holders().len(), 2);
    /// # Ok(()) }
    /// ```
    pub fn holders(&self) -> &[Owner] {
        &self.holders
    }

    /// The lock's path; empty for a lock on a PostgreSQL server, which has
    /// none.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let guard = locker.acquire("nightly report").await?;
    /// let info = locker.inspect("nightly report").await?.expect("held");
    /// assert_eq!(info.path(), locker.lock_path("nightly report")?);
    /// # drop(guard);
    /// # Ok(()) }
    /// ```
    pub fn path(&self) -> &std::path::Path {
        self.path.as_deref().unwrap_or(std::path::Path::new(""))
    }

    /// The lock name: from the record when it has one (leasehold records
    /// do), else the file name without `.lock`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let guard = locker.acquire("nightly report").await?;
    /// let info = locker.inspect("nightly report").await?.expect("held");
    /// assert_eq!(info.name(), "nightly report");
    /// # drop(guard);
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Who holds (or held) it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let guard = locker.acquire("nightly report").await?;
    /// let info = locker.inspect("nightly report").await?.expect("held");
    /// assert_eq!(info.owner().uuid(), guard.owner().uuid());
    /// # Ok(()) }
    /// ```
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// Whether the next `acquire` would reclaim it; see
    /// [`stale_reason`](Self::stale_reason) for why.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let guard = locker.acquire("report").await?;
    /// assert!(!locker.inspect("report").await?.expect("held").is_stale());
    /// # drop(guard);
    /// # Ok(()) }
    /// ```
    pub fn is_stale(&self) -> bool {
        self.stale.is_some()
    }

    /// Why it is stale, if it is: `None` exactly when
    /// [`is_stale`](Self::is_stale) is false. Locks on a PostgreSQL server
    /// are never stale (the server frees a dead session's locks itself).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use std::time::Duration;
    /// use leasehold::StaleReason;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::builder()
    ///     .directory(dir.path())
    ///     .unreadable_grace(Duration::from_millis(50))
    ///     .build()?;
    /// // A record cut short by a crash while it was written.
    /// std::fs::write(locker.lock_path("report")?, br#"{"uuid":"6f1c3a0e-8d"#).unwrap();
    /// tokio::time::sleep(Duration::from_millis(100)).await;
    ///
    /// let info = locker.inspect("report").await?.expect("present");
    /// assert_eq!(info.stale_reason(), Some(StaleReason::Unreadable));
    /// match info.stale_reason() {
    ///     Some(StaleReason::DeadOwner | StaleReason::ReusedPid) => println!("its process is gone"),
    ///     Some(other) => println!("stale: {other}"),
    ///     None => println!("held"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn stale_reason(&self) -> Option<StaleReason> {
        self.stale
    }
}

/// `t` as a record keeps it: whole milliseconds (after 1970; earlier
/// times, which `from_own` never sees, are kept as they are).
fn to_millis(t: SystemTime) -> SystemTime {
    match t.duration_since(UNIX_EPOCH) {
        Ok(since) => UNIX_EPOCH + Duration::from_millis(u64::try_from(since.as_millis()).unwrap_or(u64::MAX)),
        Err(_) => t,
    }
}
