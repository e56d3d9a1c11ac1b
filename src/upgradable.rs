//! Upgradable shared locks: a shared holding that can turn into the
//! exclusive lock, and back, with nobody getting in between.
//!
//! The `Locker` side. The upgradable holder of a name is one of its
//! shared holders, with a hold of its own in the store (never joined with
//! the `Locker`'s other shared guards, so that an upgrade can wait for
//! them like any reader), marked in the store as the upgradable one: a
//! second upgradable acquisition waits while one holds the name. An
//! upgrade announces itself as a waiting writer (so no new reader joins:
//! writers' preference), waits for the other holders to leave, and has
//! the store turn its share into the exclusive lock in one step (files:
//! `fs/upgrade.rs`; PostgreSQL: `postgres/session/upgrade.rs`, where the
//! holding has a session of its own). A downgrade is the same step backwards. The old
//! holding's lease ends there (its guard is consumed); the new one has a
//! lease, renewal and fencing token of its own.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::backend::{Arm, Attempt, Mode};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::guard::{Grant, LockGuard, TokenStep};
use crate::lease::{Hold, Lease};
use crate::locker::Locker;
use crate::name::LockName;
use crate::owner::Owner;
use crate::pool::blocking;
use crate::queue::Queue;
use crate::store::{Store, StoreLock};
use crate::timer;

/// How often a waiter that is woken by events checks anyway.
const SAFETY_NET_POLL: Duration = Duration::from_millis(250);

/// A busy attempt of [`Locker::try_upgradable`]: who holds the name (if
/// known), and when it can next change but by an event (if the store
/// knows).
struct Busy {
    owner: Option<Owner>,
    recheck_at: Option<std::time::SystemTime>,
}

/// A shared lock that can be [upgraded](Self::upgrade) to the exclusive
/// lock without letting another writer in between, from
/// [`Locker::acquire_upgradable`].
///
/// It is a shared holding like [`Locker::acquire_shared`]'s: readers
/// (shared guards) coexist with it, writers are excluded. At most one
/// upgradable guard holds a name at a time, across threads and
/// processes. Dropping it releases the shared holding.
#[must_use = "the lock is released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct UpgradableGuard {
    share: LockGuard,
    engine: Arc<Engine>,
}

impl UpgradableGuard {
    /// The shared guard of this holding: its name, owner record, fencing
    /// token and [`lost`](LockGuard::lost) report.
    pub fn guard(&self) -> &LockGuard {
        &self.share
    }

    /// Turns this shared holding into the exclusive lock of the name,
    /// waiting as long as it takes for the other shared holders to leave.
    ///
    /// **Nobody gets in between**: no writer, in any process (leasehold's,
    /// or velocious's and pi-research's on the lock path), and no other
    /// upgradable holder, can take the name from the moment this guard
    /// was acquired until the exclusive guard is released. While it
    /// waits, new shared acquisitions wait behind it (writers'
    /// preference), so readers cannot starve it.
    ///
    /// The exclusive guard has a lease of its own (renewed, reported
    /// through [`LockGuard::lost`]) and, with fencing on, a new fencing
    /// token, greater than every token before it.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] if the shared holding was lost meanwhile, or the
    /// exclusive lock before this returned (say the process was frozen
    /// past its lease: another holder may have got in); then nothing is
    /// held. [`Error::Unsupported`] on a backend without
    /// upgradable locks; otherwise as [`Locker::acquire`].
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropping the future releases the shared holding
    /// (or, if the upgrade was made, the exclusive lock).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let other = leasehold::Locker::new(dir.path())?; // another process, say
    ///
    /// let up = locker.acquire_upgradable("catalog").await?;
    /// let reader = other.acquire_shared("catalog").await?; // readers coexist
    /// assert!(other.try_acquire("catalog").await?.is_none()); // writers do not
    /// drop(reader);
    /// let writer = up.upgrade().await?; // exclusive now, nobody got in between
    /// assert!(other.try_acquire_shared("catalog").await?.is_none());
    /// let up = writer.downgrade().await?; // readers may come back
    /// assert!(other.try_acquire_shared("catalog").await?.is_some());
    /// drop(up);
    /// # Ok(()) }
    /// ```
    pub async fn upgrade(self) -> Result<LockGuard> {
        let UpgradableGuard { share, engine } = self;
        let name = engine.names.get(share.name())?;
        let lease = Arc::clone(share.lease_of());
        // Renewed while we wait, withdrawn when this returns.
        let mut announced = None;
        let queue = engine.queues.get(&name);
        let hold = loop {
            if lease.is_lost() {
                return Err(lease.lost_error());
            }
            let changed = queue.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let attempt = convert(
                &engine,
                &name,
                &lease,
                Mode::Exclusive,
                || failpoint!("upgrade.before_convert"),
                |store, n, share, arm| store.upgrade(n, share, arm),
            )
            .await?;
            match attempt {
                Attempt::Acquired(hold) => break hold,
                Attempt::Busy { .. } if announced.is_none() => {
                    announced = engine.announce_upgrade(&name, &lease).await?
                }
                Attempt::Busy { .. } => {}
            }
            let poll = if engine.store.watch(&name) {
                SAFETY_NET_POLL
            } else {
                Duration::from_millis(20)
            };
            tokio::select! {
                _ = changed => {}
                _ = timer::sleep(poll) => {}
            }
        };
        drop(announced);
        // The exclusive lock's grant has a queue of its own: it holds no
        // turn of this `Locker`'s queue for the name, so it must never be
        // handed to a waiter there; local waiters find it free on the
        // store when it goes.
        let queue = Arc::new(Queue::new(name.clone(), crate::guard::pass_on));
        let guard = finish(hold, queue).await;
        drop(share);
        let guard = guard?;
        remember(guard.lease_of(), &engine);
        let _ = failpoint!("upgrade.before_return");
        returned(guard)
    }
}

impl LockGuard {
    /// Turns this exclusive lock, from [`UpgradableGuard::upgrade`], into an [`UpgradableGuard`]: a shared
    /// holding that lets readers in again, and that can be upgraded back.
    /// Nobody gets in between: no writer and no other upgradable holder
    /// can take the name at any moment of it.
    ///
    /// Any other guard of the same acquisition (re-entered in a
    /// [`scope`](Locker::scope)) is left without the lock: its
    /// [`lost`](Self::lost) reports it replaced.
    ///
    /// Only a guard from [`UpgradableGuard::upgrade`] can be downgraded. A
    /// guard from [`Locker::acquire`] cannot: its hold belongs to its
    /// `Locker`'s local queue for the name (when it goes it may be handed
    /// straight on to a task of that `Locker` waiting for the name, which
    /// a downgrade would then have to take back), and a guard does not
    /// know its `Locker`. An upgrade makes its guard outside that queue,
    /// and remembers its `Locker`, for this. Take the name with
    /// [`Locker::acquire_upgradable`] and [`upgrade`](UpgradableGuard::upgrade)
    /// it when a downgrade may be wanted.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for a guard that did not come from an
    /// upgrade (a shared guard, a permit, a guard from `acquire`); the
    /// guard is consumed, so its lock is released. [`Error::Lost`] if the
    /// lock was lost meanwhile, or the new holding before this returned
    /// (say the process was frozen past its lease).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropping the future releases the lock.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let writer = locker.acquire_upgradable("catalog").await?.upgrade().await?;
    /// let up = writer.downgrade().await?;
    /// assert!(locker.try_acquire_shared("catalog").await?.is_some());
    /// # drop(up);
    /// # Ok(()) }
    /// ```
    pub async fn downgrade(self) -> Result<UpgradableGuard> {
        if self.is_shared() || self.lease_of().mode() != Mode::Exclusive {
            return Err(Error::Unsupported {
                what: "downgrading a shared guard or a permit: only an exclusive guard can be downgraded",
            });
        }
        let Some(engine) = upgraded_by(self.lease_of()) else {
            return Err(Error::Unsupported {
                what: "downgrading a guard from Locker::acquire (only a guard from UpgradableGuard::upgrade can be downgraded: take the name with acquire_upgradable and upgrade it)",
            });
        };
        let name = engine.names.get(self.name())?;
        let lease = Arc::clone(self.lease_of());
        let hold = loop {
            if lease.is_lost() {
                return Err(lease.lost_error());
            }
            let done = convert(
                &engine,
                &name,
                &lease,
                Mode::Shared,
                || failpoint!("downgrade.before_convert"),
                |store, n, lock, arm| store.downgrade(n, lock, arm),
            )
            .await?;
            match done {
                Some(hold) => break hold,
                None => timer::sleep(Duration::from_millis(2)).await,
            }
        };
        drop(self);
        let share = finish(hold, engine.queues.get(&name)).await?;
        let _ = failpoint!("downgrade.before_return");
        let share = returned(share)?;
        Ok(UpgradableGuard { share, engine })
    }
}

/// One conversion of `lease`'s lock by the store (`call`: its upgrade or
/// its downgrade), off the runtime, in the flight roll: the new holding
/// is armed as `mode`. The failpoint `before` runs before the lease is
/// checked still held (a freeze there must find it lost).
async fn convert<T: Send + 'static>(
    engine: &Engine,
    name: &LockName,
    lease: &Arc<Lease>,
    mode: Mode,
    before: fn() -> std::io::Result<()>,
    call: impl FnOnce(&Store, &LockName, &mut Option<StoreLock>, Arm<'_, StoreLock, Hold>) -> Result<T>
    + Send
    + 'static,
) -> Result<T> {
    let (store, n, keeper, l) = (
        engine.store.clone(),
        name.clone(),
        engine.keeper().clone(),
        Arc::clone(lease),
    );
    let flight = engine.keeper().roll.enter(name.as_str())?;
    blocking(move || {
        let _flight = flight;
        let arm = |lock, tokens| keeper.hold(n.as_str(), mode, lock, tokens);
        let _ = before();
        l.convert(|lock| call(&store, &n, lock, &arm))
    })
    .await?
}

/// The engine of each exclusive lease made by an upgrade, for its
/// downgrade (a `LockGuard` knows no `Locker`).
static UPGRADED: Mutex<Vec<(Weak<Lease>, Weak<Engine>)>> = Mutex::new(Vec::new());

fn remember(lease: &Arc<Lease>, engine: &Arc<Engine>) {
    let mut upgraded = UPGRADED.lock().unwrap_or_else(|e| e.into_inner());
    upgraded.retain(|(lease, _)| lease.strong_count() > 0);
    upgraded.push((Arc::downgrade(lease), Arc::downgrade(engine)));
}

fn upgraded_by(lease: &Arc<Lease>) -> Option<Arc<Engine>> {
    let upgraded = UPGRADED.lock().unwrap_or_else(|e| e.into_inner());
    upgraded
        .iter()
        .find(|(l, _)| std::ptr::eq(l.as_ptr(), Arc::as_ptr(lease)))
        .and_then(|(_, engine)| engine.upgrade())
}

/// The guard an upgrade or a downgrade made, if it is not lost by now;
/// otherwise `Error::Lost` (the guard dropped). The store made the new
/// holding in one step with the old one, but the process may have been
/// frozen since, past the new lease, and another holder may have got in:
/// a guard returned must mean that nobody got in between from the old
/// holding's acquisition until the return (the caller, who read under the
/// old holding, goes on from there), as the lease checked here, last,
/// says.
fn returned(guard: LockGuard) -> Result<LockGuard> {
    if guard.is_lost() {
        return Err(guard.lease_of().lost_error());
    }
    Ok(guard)
}

/// The guard of a hold just taken, with its fencing token.
async fn finish(hold: Hold, queue: Arc<Queue<Hold>>) -> Result<LockGuard> {
    let grant = Grant::new(hold, queue);
    let token = match grant.take_token() {
        TokenStep::Ready(token) => token?,
        TokenStep::FromDisk(lease) => blocking(move || lease.next_token()).await??,
    };
    Ok(grant.first_guard(token))
}

impl Locker {
    /// Acquires `name` as its upgradable shared holder, waiting as long as
    /// it takes: a shared holding (readers coexist with it, writers are
    /// excluded) that can [upgrade](UpgradableGuard::upgrade) to the
    /// exclusive lock with no writer getting in between. At most one
    /// upgradable guard holds a name at a time, across threads and
    /// processes; a second one waits, as a writer does, while it holds.
    ///
    /// It has a hold of its own in the store, with its own lease and
    /// [`lost`](LockGuard::lost) report, never shared with this `Locker`'s
    /// [`acquire_shared`](Self::acquire_shared) guards. Writers' preference
    /// holds: it waits behind a waiting exclusive acquisition.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] where upgradable locks cannot be kept (see
    /// `docs/upgradable.md`: the directory layout without an atomic
    /// exchange); [`Error::KindMismatch`] if the name is held as a semaphore;
    /// otherwise as [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a holding taken by an attempt whose future was dropped
    /// is released.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let up = locker.acquire_upgradable("catalog").await?;
    /// assert!(locker.try_acquire_upgradable("catalog").await?.is_none()); // one at a time
    /// assert!(locker.try_acquire_shared("catalog").await?.is_some()); // readers coexist
    /// # drop(up);
    /// # Ok(()) }
    /// ```
    pub async fn acquire_upgradable(&self, name: &str) -> Result<UpgradableGuard> {
        self.wait_upgradable(name, None).await
    }

    /// Acquires `name` as its upgradable shared holder if that can be done
    /// without waiting: `Ok(None)` when it is held exclusively, another
    /// upgradable guard holds it, or a writer waits for it.
    ///
    /// # Errors
    ///
    /// As [`acquire_upgradable`](Self::acquire_upgradable).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire_upgradable`](Self::acquire_upgradable).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let writer = locker.acquire("catalog").await?;
    /// assert!(locker.try_acquire_upgradable("catalog").await?.is_none());
    /// drop(writer);
    /// assert!(locker.try_acquire_upgradable("catalog").await?.is_some());
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire_upgradable(&self, name: &str) -> Result<Option<UpgradableGuard>> {
        let name = self.engine.names.get(name)?;
        Ok(self.try_upgradable(&name).await?.ok())
    }

    /// Acquires `name` as its upgradable shared holder, waiting at most
    /// `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when it could not be taken by the deadline;
    /// otherwise as [`acquire_upgradable`](Self::acquire_upgradable).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire_upgradable`](Self::acquire_upgradable).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use std::time::Duration;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let locker = leasehold::Locker::new(dir.path())?;
    /// let _up = locker.acquire_upgradable("catalog").await?;
    /// let err = locker
    ///     .acquire_upgradable_timeout("catalog", Duration::from_millis(30))
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.is_timeout());
    /// # Ok(()) }
    /// ```
    pub async fn acquire_upgradable_timeout(&self, name: &str, timeout: Duration) -> Result<UpgradableGuard> {
        let deadline = timer::now().checked_add(timeout);
        self.wait_upgradable(name, deadline).await
    }

    /// One attempt to join `name` as its upgradable holder: the guard, or
    /// when it is busy who holds it (if known) and when to look again (if
    /// the store knows: see [`Store::upgradable_tries_connect`]).
    async fn try_upgradable(&self, name: &LockName) -> Result<std::result::Result<UpgradableGuard, Busy>> {
        let engine = &self.engine;
        // Counted until the attempt is over, and refused once
        // `release_all` began, as every attempt (`Engine::attempt`).
        let flight = engine.keeper().roll.enter(name.as_str())?;
        let (store, n, keeper) = (engine.store.clone(), name.clone(), engine.keeper().clone());
        let attempt = blocking(move || {
            let _flight = flight;
            let arm = |lock, tokens| keeper.hold(n.as_str(), Mode::Shared, lock, tokens);
            store.join_upgradable(&n, &arm)
        })
        .await??;
        if matches!(attempt, Attempt::Acquired(_)) && engine.keeper().roll.is_closed() {
            drop(attempt);
            return Err(Error::ShutDown {
                name: name.as_str().to_owned(),
            });
        }
        match attempt {
            Attempt::Acquired(hold) => {
                let share = finish(hold, engine.queues.get(name)).await?;
                Ok(Ok(UpgradableGuard {
                    share,
                    engine: Arc::clone(engine),
                }))
            }
            Attempt::Busy {
                owner, recheck_at, ..
            } => Ok(Err(Busy { owner, recheck_at })),
        }
    }

    /// Attempts until one succeeds, or `deadline` (none: for ever) passes.
    async fn wait_upgradable(&self, name: &str, deadline: Option<Instant>) -> Result<UpgradableGuard> {
        let engine = &self.engine;
        let name = engine.names.get(name)?;
        let started = timer::stamp();
        let queue = engine.queues.get(&name);
        let mut holder: Option<Owner> = None;
        loop {
            let changed = queue.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let recheck_at = match self.try_upgradable(&name).await? {
                Ok(guard) => return Ok(guard),
                Err(busy) => {
                    holder = busy.owner.or(holder);
                    busy.recheck_at
                }
            };
            let now = timer::now();
            let mut wake = now + upgradable_poll(engine, &name, recheck_at);
            if let Some(deadline) = deadline {
                if now >= deadline {
                    return Err(engine.timed_out(&name, started, holder));
                }
                wake = wake.min(deadline);
            }
            tokio::select! {
                _ = changed => {}
                _ = timer::sleep_until(wake) => {}
            }
        }
    }
}

/// How long a waiting upgradable acquisition sleeps after a busy attempt,
/// unless an event wakes it first.
///
/// In a lock directory an attempt costs a few syscalls: a short safety net
/// under events, 20 ms without them. On a server every attempt opens a
/// session (the upgradable holding's own), and every release notifies: the
/// safety net is the engine's (the `Locker`'s poll, at least a second),
/// and a holder whose session ended is waited out until its lease is over
/// (the attempt's `recheck_at`), as nothing else frees its slot sooner.
/// Before, such a waiter opened about four sessions a second for as long
/// as it waited.
fn upgradable_poll(engine: &Engine, name: &LockName, recheck_at: Option<std::time::SystemTime>) -> Duration {
    let watched = engine.store.watch(name);
    if !engine.store.upgradable_attempts_connect() {
        return if watched {
            SAFETY_NET_POLL
        } else {
            Duration::from_millis(20)
        };
    }
    let poll = match watched {
        true => engine.poll_interval().max(crate::engine::SAFETY_NET_POLL),
        false => engine.poll_interval(),
    };
    let until_recheck = recheck_at
        .and_then(|at| at.duration_since(std::time::SystemTime::now()).ok())
        .map_or(Duration::ZERO, |left| {
            left.saturating_add(Duration::from_millis(1))
        });
    poll.max(until_recheck)
}
