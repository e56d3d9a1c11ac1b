//! Named locks that hold across processes, for Tokio services.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
//! use leasehold::Locker;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let locker = Locker::new(dir.path())?;
//!
//! let guard = locker.acquire("reindex").await?;   // waits for other processes
//! // ... the critical section: no other process holds "reindex" now ...
//! drop(guard);                                    // released: others may go
//! # Ok(()) }
//! ```
//!
//! Most code needs only `use leasehold::{Locker, LockGuard, Error};`.
//!
//! # Design
//!
//! A [`Locker`] owns a lock directory. [`Locker::acquire`] turns a name into
//! a file in that directory, created with `O_CREAT | O_EXCL`, and returns a
//! [`LockGuard`]. The guard carries a *lease*: its record says until when
//! the lock is valid, and a renewal thread (one per `Locker`, independent of
//! the Tokio runtime) renews it every `renew_interval`. Dropping the guard
//! removes the lock file synchronously (on PostgreSQL it queues the unlock;
//! see [`LockGuard`]). With [`LockerBuilder::fencing`], every
//! acquisition also gets a fencing token that grows with each acquisition
//! of the name, for resources that must refuse a holder that was overtaken.
//!
//! Inside one process, a `Locker` keeps a FIFO queue per name: only the
//! head of the queue touches the disk, and a finished holder hands the lock
//! straight to the next waiting task (see *Waiting* and *Fairness* on
//! [`Locker`]). [`Locker::scope`] makes acquisition re-entrant for code
//! nested in the scope, such as a function called by the holder; concurrent
//! branches of one task, each in a scope of its own, still exclude each
//! other. Waiters in other processes are woken by filesystem
//! events (inotify), with polling as a safety net, and use no CPU while they
//! wait. [`Locker::stats`] counts what happened.
//!
//! leasehold descends from two lock systems and reads and honours their lock
//! files: the `AdvisoryLockFileBackend` of [velocious] (a Node.js web and
//! database framework), a JavaScript backend that publishes each lock as a
//! directory holding an `owner.json` lease record (leasehold's directory
//! strategy), and the `FileLockService` of [pi-research] (a TypeScript set of
//! web-research tools and a research agent), a service that creates each lock
//! file with `O_EXCL` and judges its owner by pid and process start time
//! (leasehold's default, exclusive-file strategy).
//!
//! [velocious]: https://github.com/kaspernj/velocious#readme
//! [pi-research]: https://github.com/Lincoln504/pi-research#readme
//!
//! The owner record is a JSON object that both of them understand:
//!
//! | field | type | meaning |
//! |---|---|---|
//! | `uuid` | string | id of this acquisition |
//! | `pid` | number | holder process id |
//! | `startTime` | number | holder process start in pi-research's unit: clock ticks since boot (`/proc/<pid>/stat` field 22) on Linux, whole seconds since the epoch elsewhere |
//! | `holderId` | string | id of the holding `Locker` |
//! | `hostname` | string | holder host |
//! | `acquiredAt`, `leaseExpiresAt` | string | RFC 3339, UTC, milliseconds |
//! | `leaseMs` | number | the lease length |
//! | `leasehold` | number | format version; the holder keeps `flock` on the file |
//! | `bootId`, `machineId`, `pidNs`, `timeNs`, `procStart`, `renewedAtBoot` | | exact liveness and lease data for readers on the same host |
//! | `name`, `fencingToken` | string, number | the lock name; the acquisition's token (with fencing) |
//!
//! The full specification of both layouts, field by field, and of the
//! staleness rules is in [`format`](mod@format) (`docs/format.md` in the repository).
//!
//! # Guarantees and non-guarantees
//!
//! - **Exclusion.** Among leasehold processes sharing a local directory, at
//!   most one exclusive guard per name is valid at a time, and never
//!   together with a shared guard or a semaphore permit of that name; at
//!   most `permits` permits of a semaphore are valid at a time. A guard is
//!   valid until it is dropped or [`LockGuard::lost`] fires.
//! - **Staleness.** A lock is reclaimed only when its holder is provably
//!   gone (a free `flock` on a leasehold record; ESRCH or a reused pid for
//!   other writers; a record from an earlier boot), when its lease ran out,
//!   or when its record stayed unreadable past a grace period. A live holder
//!   is never judged dead because of a clock step, a unit mismatch or a torn
//!   read; leases on one host are measured on `CLOCK_BOOTTIME`. A file at a
//!   lock path that no lock writer could have written (a `Cargo.lock`, a
//!   pid file) is no lock, and never reclaimed.
//! - **Race-safe reclaim and release.** Every removal of a lock path
//!   happens under a directory-wide `flock`, after checking that the path
//!   still names the inode that was judged, so two reclaimers never delete
//!   each other's fresh lock and a holder never removes a successor's.
//!   Renewal writes only through the descriptor of the file this guard
//!   created.
//! - Each promise, with the test that checks it, is listed in
//!   `docs/guarantees.md` in the repository.
//! - **Not guaranteed: leases are time.** A holder paused longer than its
//!   lease (SIGSTOP, a VM freeze) loses the lock to another process, and
//!   learns so only when it runs again ([`LockGuard::lost`] fires at its
//!   next renewal). Stop work when `lost` fires, choose a lease far longer
//!   than any pause you expect, and where a late write would do harm, have
//!   the resource check [fencing tokens](LockGuard::fencing_token).
//! - **Not guaranteed: network filesystems.** NFS and SMB weaken `O_EXCL`,
//!   `flock` and rename; use one host's local directory. Owners on another
//!   host (as the record's `hostname` says) are judged by lease alone.
//! - **Not guaranteed: forked children.** A process that `fork`s without
//!   `exec` shares the lock's `flock` with the child, which then keeps the
//!   lock looking alive until the lease runs out.
//!
//! # Security
//!
//! - Lock names are hashed into file names of safe characters, so no name
//!   reaches outside the directory.
//! - Lock files are created `O_EXCL | O_NOFOLLOW`, mode 0600; existing ones
//!   are inspected with `fstatat(AT_SYMLINK_NOFOLLOW)` and never opened
//!   unless they are regular files, so a planted symlink, FIFO or device is
//!   reported as [`Error::UnexpectedFile`] and its target never touched.
//!   So is a file whose content no lock writer produces (a `Cargo.lock`,
//!   a pid file): it is never removed, listed or cleaned as a lock.
//! - All lock files are reached through the directory descriptor opened at
//!   `build()`, never by re-resolving its path.
//! - A world-writable directory without the sticky bit is refused
//!   ([`Error::InsecureDirectory`]) unless you opt out. The lock directory
//!   is created 0700.
//! - The default directory (no [`LockerBuilder::directory`]) is per user
//!   and per host and ignores the environment: `/run/lock/leasehold-<uid>`
//!   on Linux, `leasehold` in the user's local application data on
//!   Windows, `/tmp/leasehold-<uid>` elsewhere (the literal `/tmp`, never
//!   `$TMPDIR` or `$XDG_RUNTIME_DIR`), for the effective uid. So a cron
//!   job, a systemd unit, an ssh session and a login shell of one user all
//!   take their locks in one place. That place is fixed, with no fallback:
//!   where it cannot be used (no `/run/lock`, one this user may not write
//!   in, or a `/run/lock` of the process's own mount namespace that the
//!   host's init does not see) `build()` fails with
//!   [`Error::NoDefaultDirectory`] instead of choosing a place another
//!   process might not choose. It is refused unless owned by the user and
//!   closed to others (0700), and fails on a read-only mount
//!   (`ProtectSystem=strict`); give such processes an explicit directory.
//!

//! # Which lock do you need?
//!
//! | you need | use | holders at once |
//! |---|---|---|
//! | one process at a time (a migration, a cron job, a writer) | [`Locker::acquire`] | one |
//! | many readers, or one writer (a cache rebuild vs its readers) | [`Locker::acquire_shared`] for readers, [`Locker::acquire`] for the writer | any number of shared, or one exclusive |
//! | at most N at once (GPUs, build slots, API quota) | [`Locker::semaphore`] | at most N |
//!
//! All three have the same guarantees: leases renewed in the background,
//! a dead holder's lock freed at once, [`LockGuard::lost`], fencing
//! tokens, [`Locker::holders`] and [`Locker::list`] showing every holder,
//! and the same waiting, timeouts and cancellation. Shared locks prefer
//! writers: once an exclusive acquisition waits (in any process), new
//! shared ones queue behind it. An exclusive acquisition of a semaphore's
//! name waits for every permit to be returned.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let locker = leasehold::Locker::new(dir.path())?;
//!
//! let reader = locker.acquire_shared("catalog").await?; // many at once
//! drop(reader);
//! let writer = locker.acquire("catalog").await?; // alone
//! drop(writer);
//!
//! let gpus = locker.semaphore("gpu", 2)?; // two at once
//! let _permit = gpus.acquire().await?;
//! # Ok(()) }
//! ```
//!
//! # Common patterns
//!
//! **A service that stops work when it loses the lock.** A lease can run
//! out under a holder (its process was paused, its disk stalled): the guard
//! then reports the loss through [`LockGuard::lost`], and the work must
//! stop, because someone else may now hold the lock. [`Locker::with_lock`]
//! does this for you: it drops the work's future the moment the lock is
//! lost and returns [`Error::Lost`].
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # async fn bill_customers() {}
//! let locker = leasehold::Locker::new(dir.path())?;
//!
//! let guard = locker.acquire("billing-run").await?;
//! tokio::select! {
//!     () = guard.lost() => eprintln!("lost the lock; stopping"),
//!     () = bill_customers() => {}
//! }
//! guard.release().await?;
//!
//! // The same, in one call:
//! locker.with_lock("billing-run", bill_customers()).await?;
//! # Ok(()) }
//! ```
//!
//! **Re-entrant helpers.** A helper that takes the lock itself can be
//! called both on its own and by code that already holds the name, if the
//! holder runs inside [`Locker::scope`]: acquisitions of a name the scope
//! holds re-enter instead of waiting for themselves.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! use leasehold::Locker;
//!
//! async fn append_entry(locker: &Locker) -> leasehold::Result<()> {
//!     let _guard = locker.acquire("ledger").await?; // re-enters inside a scope
//!     Ok(())
//! }
//!
//! let locker = Locker::new(dir.path())?;
//! append_entry(&locker).await?; // on its own: takes and releases "ledger"
//! locker
//!     .scope(async {
//!         let _guard = locker.acquire("ledger").await?;
//!         append_entry(&locker).await?; // nested: does not wait for itself
//!         append_entry(&locker).await
//!     })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! **Tests that must not overlap, across processes.** `cargo nextest`
//! runs each test in a process of its own, so a `static Mutex` cannot keep
//! two tests off one database; [`testing::serial`] can (see [`testing`]):
//!
//! ```no_run
//! #[tokio::test]
//! async fn migrates_the_database() {
//!     let _serial = leasehold::testing::serial("database").await;
//!     // ... no other test holding "database", in any process, runs now ...
//! }
//! ```
//!
//! **Publishing where the holder is.** Owner fields go into the lock's
//! record, so a second instance that finds the lock held can read, for
//! instance, the address the first one serves on, and use it instead of
//! starting (`examples/server_lock.rs` does this with a real server):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! use leasehold::{FieldValue, Locker};
//!
//! let server = Locker::builder()
//!     .directory(dir.path())
//!     .owner_field("host", "127.0.0.1")
//!     .owner_field("port", 8080)
//!     .build()?;
//! let _serving = server.acquire("dev-server").await?;
//!
//! // Another process, finding the lock held:
//! let other = Locker::new(dir.path())?;
//! if other.try_acquire("dev-server").await?.is_none() {
//!     let owner = other.holder("dev-server").await?.expect("held");
//!     let host = owner.field("host").and_then(FieldValue::as_str);
//!     let port = owner.field("port").and_then(FieldValue::as_i64);
//!     assert_eq!((host, port), (Some("127.0.0.1"), Some(8080)));
//! }
//! # Ok(()) }
//! ```
//!
//! **Synchronous code.** Build scripts, plain `#[test]`s and services
//! without a runtime use the `blocking_` methods, which need no Tokio
//! runtime (and refuse to run on one, where they would block a worker):
//!
//! ```
//! # fn main() -> leasehold::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! let locker = leasehold::Locker::new(dir.path())?;
//! let guard = locker.blocking_acquire("codegen")?;
//! // ... regenerate the files no other build may touch meanwhile ...
//! drop(guard);
//! # Ok(()) }
//! ```
//!
//! # Which strategy should you use?
//!
//! [`Strategy::ExclusiveFile`] (the default) is the one to use: one file
//! per lock, the fewest syscalls, and instant detection of dead holders
//! through `flock`. It shares lock files with programs that use `O_EXCL`
//! lock files holding a `{"uuid", "pid"}` JSON record (pi-research's `FileLockService`;
//! pair it with [`PathStyle::Plain`] for names like `state.lock`).
//!
//! [`Strategy::Directory`] is for sharing locks with programs that publish
//! a lock as a directory holding `owner.json` (velocious's `AdvisoryLockFileBackend`). It costs a
//! few more syscalls per acquisition and needs `renameat2(RENAME_NOREPLACE)`
//! on Linux.
//!
//! Both give the same guarantees and pass the same test suite.
//!
//! # Feature flags
//!
//! - `cli`: the `leasehold` command-line tool (`run`, a drop-in for
//!   flock(1) in scripts and crontabs, `holder`, `list`, `clean`, `man`,
//!   `completions`); it adds `clap`, `clap_complete` and `clap_mangen`.
//!   Its exit statuses and JSON output are tabled in the README's *From
//!   the shell* and in `leasehold run --help`. The library itself needs no
//!   feature.
//! - `postgres`: [`LockerBuilder::postgres`], locks held as session-level
//!   advisory locks on a PostgreSQL server, for processes on several hosts;
//!   it adds the `postgres` client. See *PostgreSQL* below.
//! - `postgres-tls`: TLS to the PostgreSQL server, with libpq's `sslmode`
//!   (`require`, `verify-ca`, `verify-full`) and `sslrootcert`; implies
//!   `postgres` and adds rustls (on `ring`). Without it, a `Locker` asked
//!   for TLS is refused by `build()`, never connected in clear text.
//! - `failpoints`: test-only. Named failpoints between the steps of the
//!   filesystem protocol, for the crash-point test (docs/guarantees.md,
//!   *Crash points*); it adds `fail`. Never enable it in a build you ship.
//! - `portable-test`: test-only. With `LEASEHOLD_TEST_PORTABLE=1` in the
//!   environment, a Linux build answers as a platform without `/proc`,
//!   inotify or OFD locks (no process start times, polling, no waiting
//!   line), so CI exercises macOS's and FreeBSD's fallback paths on Linux
//!   (docs/guarantees.md, *Platforms*). It adds nothing; never enable it in
//!   a build you ship.
//!
//! - `macros`: the test attributes `#[leasehold::serial(name)]` and
//!   `#[leasehold::parallel(name)]` (see [`testing`]); it adds
//!   `leasehold-macros`, a crate of this workspace, and through it the
//!   `syn`, `quote` and `proc-macro2` that tokio's macros already build.
//!
//! [`testing`] (serializing tests across processes: [`testing::serial`],
//! [`testing::parallel`]) is part of the default build: it adds no
//! dependency.
//!
//! # PostgreSQL
//!
//! With the `postgres` feature, `Locker::builder().postgres(url)` keeps the
//! locks on a server instead of in a directory; everything else (waiting,
//! the FIFO queue, scopes, `lost()`, `ensure_held()`, fencing tokens,
//! `holder()`, `list()`, `stats()`) works as with files.
//!
//! - **Connecting**: [`LockerBuilder::postgres`] takes a connection
//!   string or URL as libpq reads it; [`LockerBuilder::postgres_config`]
//!   takes the application's own `postgres::Config` (a password from a
//!   secret store, timeouts, keepalives, several hosts). Unless either sets
//!   `application_name`, the connections show as `leasehold/<version>` in
//!   `pg_stat_activity`.
//! - **TLS** (feature `postgres-tls`, on rustls): `sslmode` as libpq reads
//!   it ([`PgSslMode`], from the string or
//!   [`LockerBuilder::postgres_ssl_mode`]). `disable`: clear text.
//!   `prefer` (the default): TLS if the server offers it. `require`: TLS
//!   or no connection, the certificate unchecked (so a man in the middle
//!   could answer) unless a root certificate is given, which then checks
//!   its chain. `verify-ca`: the chain must lead to the root certificate.
//!   `verify-full`: that, and a certificate for the host name connected
//!   to; what a managed database should be reached with. The root
//!   certificate is `sslrootcert` (a PEM file, or `system` for the
//!   platform's store) or [`LockerBuilder::postgres_root_cert`], else
//!   libpq's `~/.postgresql/root.crt` if it exists; `verify-ca` and
//!   `verify-full` without one are refused by `build()`. `require` and the
//!   verify modes never fall back to clear text: a server without TLS,
//!   a bad certificate or a Unix-socket host (where the server offers no
//!   TLS; libpq ignores `sslmode` there) fails the connection. Every
//!   connection of the `Locker` uses the same settings. Without the
//!   feature, `require` and the verify modes are [`Error::Unsupported`]
//!   at `build()`, and `prefer` connects in clear text. Client
//!   certificates (`sslcert`, `sslkey`) and libpq's `PGSSLMODE`-style
//!   environment variables are not read.
//! - **Connections**: a `Locker` opens its *session* at `build()` (its
//!   locks are held there), and opens it again when it dies, at the next
//!   command that needs it. A *listener* connection (`LISTEN leasehold`)
//!   is opened at `build()` too, and again a second after it breaks; it
//!   is shared by every `Locker` of the process built with the same
//!   settings (server, database, user, password, TLS,
//!   `application_name`), and closed with the last of them. Each
//!   upgradable holding opens a session of its own for as long as it
//!   lasts (see [`UpgradableGuard`]). So `n`
//!   `Locker`s with the same settings use `n + 1` connections, plus one
//!   per upgradable holding. Clones of a `Locker` are the same `Locker`:
//!   they share everything. Two `Locker`s never share a session: the
//!   server cannot tell two holders on one session apart (its advisory
//!   locks are re-entrant per session), the end of a session (a
//!   `pg_terminate_backend`, a failed unlock that resets it) takes every
//!   lock on it, and each session's statements are budgeted against its
//!   own `Locker`'s lease so that no heartbeat waits for long: one
//!   `Locker`'s slow attempts or shorter lease must not cost another its
//!   locks. To use fewer sessions, share (clone) one `Locker`.
//! - A lock is `pg_try_advisory_lock(key)` on one connection the `Locker`
//!   owns, driven by a thread of its own. `key` is the first 8 bytes of
//!   SHA-256 of `"leasehold\0" + name`, a big-endian `i64`: an
//!   application's own advisory keys meet it only by a 1-in-2^64 accident.
//! - Owners and fencing counters live in the table `leasehold_locks`,
//!   created on first use and written only while the lock is held; tokens
//!   count the server's clock in microseconds, so they strictly increase
//!   per name across restarts of anything, and across the table being
//!   emptied or dropped (as long as the server's clock does not go back
//!   meanwhile).
//! - The session holds the locks: when it dies (server restart,
//!   `pg_terminate_backend`, network loss) the server drops its locks, and
//!   every guard reports `lost()` at its next heartbeat, one
//!   `renew_interval` later, or at its lease's cutoff if the server does
//!   not answer; new acquisitions reconnect. The holder may still be
//!   running until then, so the next holder waits it out: each holder's
//!   row records its lease, and a taker that finds the row of a holder
//!   whose session ended without letting go waits a lease from then
//!   (docs/guarantees.md, *On PostgreSQL*). A clean release or drop costs
//!   the next holder no wait.
//! - Every statement that waits for an owner table (behind a DBA's
//!   `LOCK TABLE`, a schema change) gives up after an eighth of the lease,
//!   so it never holds up the connection's heartbeats for long;
//!   `holder()` and `list()` then try again.
//! - Releases `NOTIFY` channel `leasehold`; every `Locker` listens (on
//!   the listener connection), so waiters on other hosts wake at once,
//!   with a poll as the safety net (a dead session sends no notification).
//! - Dropping a guard queues `pg_advisory_unlock` on the connection without
//!   waiting; the session thread sends it at once. `release().await` waits
//!   for the server's answer.
//! - **Slow servers**: an attempt ends by the caller's deadline (given at
//!   least 100 ms, so `acquire_timeout(Duration::ZERO)` still makes one),
//!   and by a quarter of the lease in any case, so that it never holds up
//!   the heartbeats of the connection's other locks for long. The statement
//!   that can wait on the server (recording the owner, behind a table lock
//!   such as a schema change's) runs under a `statement_timeout` that ends
//!   then. An attempt the server does not answer in time counts as
//!   contention: `acquire_timeout` returns [`Error::Timeout`] within about
//!   250 ms of its deadline, `try_acquire` returns `Ok(None)`, and `acquire`
//!   tries again, waiting out a stalled server instead of failing. A lock
//!   that the server grants after its caller has gone is unlocked at once.
//! - **Bounded waits**: no call waits for the session thread past its own
//!   bound. An attempt: its deadline, as above. A heartbeat: its lease's
//!   cutoff. Everything else that asks the session (`holder()`,
//!   `holders()`, `inspect()`, `list()`, `clean()`, a refill of fencing
//!   tokens, `release().await`, `ensure_held()`, an exclusive waiter's
//!   announcement) waits for each answer at most a quarter of the lease,
//!   and at least a second (7.5 s with the default 30 s lease), then
//!   fails with [`Error::Backend`] whose source is a
//!   [`std::io::Error`] of kind `TimedOut` (a release's unlock stays
//!   queued and is carried out; the server drops the lock with the
//!   session in any case). An upgradable acquisition, which connects a
//!   session of its own, gives up connecting after the same bound and
//!   counts as busy. While the owner tables are locked, an inspection or
//!   a `clean()` asks again for up to 30 s in all, each answer within that
//!   bound. So a session stalled on a server that
//!   stopped answering (a stopped server process, a cut network the
//!   keepalives have not noticed yet) costs each caller its own bound,
//!   never the keepalives' 40 s.
//! - **Round trips**: an uncontended acquisition takes two (the key, then
//!   the owner's record in one transaction sent as one query; a permit of
//!   a semaphore of up to 64 permits takes its slot in that same query), a
//!   release one (the row, the `NOTIFY` and the unlock in one query), a
//!   heartbeat one.
//! - **`clean()`** removes the rows of holders gone for good and returns
//!   them, each [`StaleReason::DeadOwner`]: the row of a shared or permit
//!   holder that let go, or whose session ended and was found dead (by
//!   the next taker, or the next session to connect) at least a lease
//!   ago, and likewise the owner record of an exclusive holder (its row
//!   stays, without the owner: it keeps the name's fencing counter). A
//!   holder that may still count itself one is never cleaned; `dry_run`
//!   only finds them. Correctness never needs it (the server drops a dead
//!   session's locks, and rows are tidied as they are met): it is for
//!   seeing, and removing, what crashed holders left.
//! - **Failed unlocks** (other than by a lost connection, which drops the
//!   lock anyway) are retried; if they still fail, the connection is closed
//!   and reopened, so that the server drops every lock of the session. No
//!   lock is left that nobody owns; the price is that every other guard
//!   on that connection reports `lost()` ([`LossReason::SessionLost`]), as
//!   when the session dies.
//! - **Poolers**: session locks need a session. Behind a pooler in
//!   transaction (or statement) pooling mode, such as PgBouncer with
//!   `pool_mode = transaction`, each transaction runs on whichever server
//!   session is free, so a lock would exclude nothing. Connect directly,
//!   or through the pooler in session mode (`pool_mode = session`). A
//!   `Locker` checks this when it connects and at every reconnection,
//!   before it takes any lock: beside its connection it opens a second
//!   one, and compares a session setting and `pg_backend_pid()` across
//!   their statements (two stable server sessions, or not). A transaction
//!   pooler fails this whether or not it hands the same server session
//!   back, and `build()` (or the attempt after a reconnection) returns
//!   [`Error::UnstableSession`], naming transaction pooling. Every
//!   heartbeat also checks that the server process has not changed, and
//!   treats a change as the loss of every lock on the connection.
//! - **Failover, restarts, cut networks**: every guard is told `lost()`
//!   within a bound, and the `Locker` connects anew by itself at its next
//!   attempt once the server answers (an attempt made while it cannot be
//!   reached fails with [`Error::Backend`]; a waiting `acquire` does too).
//!   A session the server ended (a restart or failover,
//!   `pg_terminate_backend`, a crash) is found at the next heartbeat:
//!   `lost()` within one `renew_interval` (and a round trip) of the end.
//!   A server that stops answering (stopped, or a network cut) costs each
//!   holder its lock at its lease's cutoff: `lost()` within one `lease` of
//!   the server's last answer. Over TCP both sides give up a peer silent
//!   for `4 × ⌈lease / 3⌉` seconds (40 s with the default 30 s lease):
//!   the `Locker` sets the server session's `tcp_keepalives_idle` and
//!   `_interval` to `⌈lease / 3⌉` s, `tcp_keepalives_count` to 3 and
//!   `tcp_user_timeout` to that bound, so the server ends the session of
//!   a client cut off from it and frees its locks; and the client's own
//!   keepalives, `tcp_user_timeout` and `connect_timeout` likewise,
//!   wherever the connection string left the client's defaults, so a
//!   connection to a server cut off is closed and made anew. A server that
//!   is stopped rather than cut off (its kernel still answers TCP, or a
//!   Unix socket) keeps the locks of its sessions until it runs again; the
//!   guards, told at their cutoffs, are let go then. Tested against a real
//!   server: a restart, `pg_terminate_backend`, and the whole server
//!   stopped with `SIGSTOP` past a lease.
//!
//! # Supported platforms
//!
//! Linux is the primary platform: it has `/proc` start times, boot ids and
//! `CLOCK_BOOTTIME`. macOS and FreeBSD read start times and boot ids from
//! `sysctl` and measure leases on `CLOCK_MONOTONIC` (which counts sleep
//! there), but have no directory watching (waiters poll) and no waiting
//! line; they are compiled, not run, by this project's CI. Other Unix
//! systems build and work, judging foreign records by `kill(pid, 0)` alone
//! and leases by the wall clock. Windows is not supported.

// Denied, not forbidden: sys/bsd/sysctl.rs and sys/bsd/rename.rs call
// sysctl(3) and renameatx_np(2), which nix does not wrap
// (tests/architecture.rs keeps every other file free of unsafe code).
#![deny(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![doc(test(attr(deny(warnings))))]

// First: its macro is for every module below.
#[macro_use]
mod failpoint;

mod acquire;
mod backend;
mod blocking;
mod builder;
mod closure;
mod engine;
mod error;
mod field;
mod fs;
mod guard;
mod inspect;
mod lease;
mod locker;
mod mode;
mod name;
mod owner;
mod pool;
#[cfg(feature = "postgres")]
mod postgres;
mod queue;
mod record;
mod renew;
mod scope;
mod semaphore;
mod shared;
mod stale;
mod stats;
mod store;
mod sync;
mod sys;
pub mod testing;
mod timer;
mod timestamp;
mod upgradable;

pub use builder::LockerBuilder;
pub use error::{Error, LossReason, Result};
pub use field::FieldValue;
pub use fs::Strategy;
pub use guard::LockGuard;
#[cfg(feature = "macros")]
pub use leasehold_macros::{parallel, serial};
pub use locker::{Locker, ReleasedLock};
pub use name::{MAX_NAME_LEN, PathStyle};
pub use owner::{LockInfo, LockKind, Owner};
#[cfg(feature = "postgres")]
pub use postgres::PgSslMode;
pub use semaphore::Semaphore;
pub use stale::StaleReason;
pub use stats::Stats;
pub use upgradable::UpgradableGuard;

/// Every failpoint, for `tests/crash_points.rs` (feature `failpoints`,
/// test-only; not part of the API).
#[cfg(feature = "failpoints")]
#[doc(hidden)]
pub const FAILPOINTS: &[&str] = failpoint::FAILPOINTS;

/// The OS error code a failpoint configured `return` fails with: `EIO`,
/// or `ERROR_GEN_FAILURE` on Windows (feature `failpoints`, test-only; not
/// part of the API).
#[cfg(feature = "failpoints")]
#[doc(hidden)]
pub const FAILPOINT_ERROR: i32 = failpoint::EIO;

#[doc = include_str!("../docs/format.md")]
pub mod format {
    pub use crate::field::RESERVED_KEYS as RECORD_KEYS;
}
