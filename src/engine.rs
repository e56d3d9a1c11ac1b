//! The acquisition engine: the turn taking, the waiting, the attempts.
//!
//! The head of a name's queue ([`queue`](crate::queue)) takes its turn
//! here: it takes a lock handed over by the previous local holder, or goes
//! to the store for it, attempt after attempt, sleeping between them until
//! an event, the lock's lease end, a safety-net poll or the deadline. What
//! it gets becomes a [`LockGuard`] in [`Engine::finish`].

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::backend::{Attempt, Mode, Waiters, Wake};
use crate::error::{Error, Result};
use crate::guard::{COURTESY, Grant, LockGuard, TokenStep};
use crate::lease::{Hold, Keeper};
use crate::name::{LockName, Names, PathStyle};
use crate::owner::Owner;
use crate::pool::blocking;
use crate::queue::{Head, Queue, Queues, Turn};
use crate::renew::Renewer;
use crate::scope;
use crate::stats::{Came, Counters, bump};
use crate::store::Store;
use crate::timer::{self, Stamp};

/// How often a waiter that is woken by events checks anyway.
pub(crate) const SAFETY_NET_POLL: Duration = Duration::from_secs(1);
/// A dying holder's close event can arrive a moment before the kernel
/// drops its flock: look once more this long after an event.
const RECHECK_AFTER_EVENT: Duration = Duration::from_millis(10);

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The rest of a handoff whose fencing token comes from disk.
pub(crate) type Fetch<'a> = Pin<Box<dyn Future<Output = Result<LockGuard>> + Send + Sync + 'a>>;

/// Everything a `Locker` shares between its clones.
#[derive(Debug)]
pub(crate) struct Engine {
    /// Tells this `Locker`'s holds apart from other `Locker`s' in a scope.
    id: u64,
    pub(crate) store: Store,
    pub(crate) counters: Arc<Counters>,
    /// Arms the renewal of every lock taken; shares `counters`. Its roll
    /// lists the leases, and refuses attempts after `release_all`.
    pub(crate) keeper: Keeper,
    poll_interval: Duration,
    /// After how long a waiter says, at INFO, who it waits for.
    wait_notice: Option<Duration>,
    pub(crate) queues: Arc<Queues<Hold>>,
    pub(crate) path_style: PathStyle,
    /// The names acquired lately, checked and hashed once, each with its
    /// queue (kept alive while the name is kept).
    pub(crate) names: Names<Arc<Queue<Hold>>>,
    /// The shared hold of each name this `Locker` holds shared: new shared
    /// acquisitions join it rather than go to the store.
    shared: Mutex<HashMap<String, Weak<Grant>>>,
}

impl Wake for Queues<Hold> {
    fn changed(&self, key: &str) {
        Queues::changed(self, key);
    }

    fn all_changed(&self) {
        Queues::all_changed(self);
    }
}

impl Engine {
    /// An engine on the store that `store` opens, given the counters to
    /// keep and the queues to wake.
    pub(crate) fn new(
        lease: Duration,
        renew_interval: Duration,
        poll_interval: Duration,
        wait_notice: Option<Duration>,
        path_style: PathStyle,
        fair: bool,
        store: impl FnOnce(Arc<Counters>, Waiters) -> Result<Store>,
    ) -> Result<Self> {
        let counters: Arc<Counters> = Arc::default();
        let queues: Arc<Queues<Hold>> = Arc::new(Queues::new(crate::guard::pass_on));
        let waiters: Waiters = Arc::downgrade(&queues) as Waiters;
        let store = store(Arc::clone(&counters), waiters)?;
        let keeper = Keeper {
            lease,
            renew_interval,
            counters: Arc::clone(&counters),
            renewer: Renewer::default(),
            roll: Arc::default(),
            fair,
        };
        Ok(Engine {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            store,
            counters,
            keeper,
            poll_interval,
            wait_notice,
            queues,
            path_style,
            names: Names::new(path_style),
            shared: Mutex::default(),
        })
    }

    /// How often a waiter looks when no event wakes it.
    pub(crate) fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    /// What arms the renewal of every lock taken (for `upgradable.rs`).
    pub(crate) fn keeper(&self) -> &Keeper {
        &self.keeper
    }

    /// One attempt to take `name` as `mode` without waiting for other
    /// tasks or processes: `None` when anyone holds it in a way that
    /// excludes `mode` (or waits for it here).
    pub(crate) async fn try_acquire(&self, name: &str, mode: Mode) -> Result<Option<LockGuard>> {
        let name = self.names.get(name)?;
        self.keeper.roll.check(name.as_str())?;
        if let Some(guard) = self.reenter(&name, mode) {
            return guard.map(Some);
        }
        let started = timer::stamp();
        let queue = self.queues.get(&name);
        // Another task of this Locker holds it, or is waiting on the disk
        // because another process does: either way, not free.
        let Some(head) = queue.try_head() else {
            return Ok(None);
        };
        if let Some(guard) = self.join_shared(&name, mode) {
            return Ok(Some(guard));
        }
        match self.attempt(&name, mode, None).await? {
            Attempt::Acquired(hold) => {
                // An exclusive hold takes the turn into its grant before
                // `finish` can be cancelled (fetching a fencing token): the
                // grant passes it on then, and the head must not pass it
                // a second time. A shared hold passes it after `finish`,
                // once later shared acquisitions can join it.
                let head = match mode {
                    Mode::Exclusive => {
                        head.disarm();
                        None
                    }
                    _ => Some(head),
                };
                let guard = self.finish(&name, hold, Arc::clone(&queue), started, false).await;
                drop(head);
                guard.map(Some)
            }
            Attempt::Busy { .. } => Ok(None),
        }
    }

    /// After an acquisition as `mode`: an exclusive hold keeps the queue's
    /// turn until it is released; a shared hold or a permit passes it on at
    /// once, so the next local waiter can join (or take another permit).
    fn settle(&self, head: Head<Hold>, mode: Mode) {
        if mode == Mode::Exclusive {
            head.disarm();
        } else {
            drop(head);
        }
    }

    /// A guard on the shared hold this `Locker` already has of `name`, if
    /// `mode` is shared and there is one, still held.
    fn join_shared(&self, name: &LockName, mode: Mode) -> Option<LockGuard> {
        if mode != Mode::Shared {
            return None;
        }
        let grant = {
            let shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            shared.get(name.file_name())?.upgrade()?
        };
        // Not past an exclusive waiter of another process: to the store,
        // which keeps this acquisition out until the waiter had its turn.
        if grant.is_lost() || !self.store.may_join_locally(name) {
            return None;
        }
        let guard = grant.guard()?.ok()?;
        bump(&self.counters.joined_locally);
        bump(&self.counters.shared_acquisitions);
        scope::remember(self.id, name.file_name(), &grant);
        Some(guard)
    }

    /// The work of the task holding the name's turn: take the lock handed
    /// over to it, or go to the disk for it. Without `head`, the turn came
    /// from the queue.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn take_turn(
        &self,
        name: &LockName,
        mode: Mode,
        queue: Arc<Queue<Hold>>,
        mut turn: Turn<Hold>,
        mut head: Option<Head<Hold>>,
        deadline: Option<Instant>,
        started: Stamp,
    ) -> Result<LockGuard> {
        let queued = head.is_none();
        if mode != Mode::Exclusive && !matches!(turn, Turn::Handoff(_)) {
            // Our turn: join this Locker's shared hold if it has one, else
            // take a hold (or permit) from the store; either way the turn
            // goes on to the next local waiter right after.
            let head = head.take().unwrap_or_else(|| Head::adopt(&queue));
            if let Some(guard) = self.join_shared(name, mode) {
                return Ok(guard);
            }
            if let Turn::Fresh { courtesy: true } = turn {
                timer::sleep(COURTESY).await;
            }
            let (hold, waited) = self.wait_on_disk(name, mode, &queue, deadline, started).await?;
            let guard = self
                .finish(name, hold, Arc::clone(&queue), started, queued || waited)
                .await;
            self.settle(head, mode);
            return guard;
        }
        let (hold, contended) = loop {
            match turn {
                Turn::Handoff(hold) if !hold.is_lost() => {
                    // As `Acquire` takes it in `poll`.
                    return match self.take_handoff(name.clone(), hold, queue, deadline, started) {
                        Ok(out) => out,
                        Err(fetch) => fetch.await,
                    };
                }
                Turn::Handoff(lost) => {
                    // Lost between its last holder and us: the turn is ours
                    // now, the lock is not.
                    drop(lost);
                    turn = Turn::Fresh { courtesy: false };
                }
                Turn::Fresh { courtesy } => {
                    // Our turn: passed on to the next waiter if we fail or
                    // are dropped before we hold the lock.
                    let head = head.take().unwrap_or_else(|| Head::adopt(&queue));
                    if courtesy {
                        timer::sleep(COURTESY).await;
                    }
                    let (hold, waited) = self.wait_on_disk(name, mode, &queue, deadline, started).await?;
                    head.disarm();
                    break (hold, queued || waited);
                }
            }
        };
        self.finish(name, hold, queue, started, contended).await
    }

    /// The span every acquisition runs in; `waited_ms`, `contended` and
    /// `fencing_token` are recorded when it succeeds.
    pub(crate) fn span(&self, op: &'static str, name: &str) -> tracing::Span {
        tracing::debug_span!(
            "leasehold",
            op,
            lock = name,
            strategy = self.store.kind(),
            waited_ms = tracing::field::Empty,
            contended = tracing::field::Empty,
            fencing_token = tracing::field::Empty,
        )
    }

    /// A re-entrant guard, if the current scope holds `name` in a way that
    /// covers `mode`: an exclusive hold covers every kind, a shared hold
    /// covers shared, a permit covers a permit of the same semaphore. An
    /// exclusive acquisition of a name the scope holds otherwise would wait
    /// for itself: an error. Other mixes are the kind mismatch they would
    /// be in the store.
    pub(crate) fn reenter(&self, name: &LockName, mode: Mode) -> Option<Result<LockGuard>> {
        let grant = scope::find(self.id, name.file_name())?;
        let held = grant.mode();
        if held != Mode::Exclusive && held != mode {
            return Some(Err(match mode {
                Mode::Exclusive => Error::WouldDeadlock {
                    name: name.as_str().to_owned(),
                },
                _ => Error::kind_mismatch(name.as_str(), mode, held),
            }));
        }
        let guard = grant.guard()?;
        if guard.is_ok() {
            bump(&self.counters.reentrant);
        }
        Some(guard)
    }

    /// Turns a hold into the caller's guard: takes the acquisition's
    /// fencing token, counts it, and remembers it in the current scope.
    async fn finish(
        &self,
        name: &LockName,
        hold: Hold,
        queue: Arc<Queue<Hold>>,
        started: Stamp,
        contended: bool,
    ) -> Result<LockGuard> {
        // From here the hold lives in a grant, which passes it on if this
        // future is dropped while a token is fetched from disk.
        let grant = Grant::new(hold, queue);
        let token = match grant.take_token() {
            TokenStep::Ready(token) => token?,
            TokenStep::FromDisk(lease) => blocking(move || lease.next_token()).await??,
        };
        let came = if contended { Came::AfterWaiting } else { Came::Free };
        Ok(self.hand_out(name, grant, token, started, None, came))
    }

    /// A lock handed over by the previous local holder, not lost, as the
    /// caller's guard: at once, without a future, unless its fencing token
    /// must come from disk (then the future that fetches it). What
    /// [`take_turn`](Self::take_turn) does with such a turn, on the hot
    /// path of an in-process handoff: no future to box, no clock but the
    /// lease's check (the wait ended when the giver handed it on, a moment
    /// it read for its handoff window).
    pub(crate) fn take_handoff<'a>(
        &'a self,
        name: LockName,
        hold: Hold,
        queue: Arc<Queue<Hold>>,
        deadline: Option<Instant>,
        started: Stamp,
    ) -> Result<Result<LockGuard>, Fetch<'a>> {
        let handed_at = hold.handed_at();
        match hold.lease().token_at_hand() {
            Some(Ok(token)) => {
                let grant = Grant::with_token(hold, queue, token);
                return Ok(Ok(self.hand_out(
                    &name,
                    grant,
                    token,
                    started,
                    handed_at,
                    Came::Handoff,
                )));
            }
            // The grant, dropped, passes the hold on.
            Some(Err(error)) => {
                drop(Grant::new(hold, queue));
                return Ok(Err(error));
            }
            None => {}
        }
        // The reserved block is used up. As in `finish`: from here the
        // grant passes the hold on if the caller goes away.
        let lease = Arc::clone(hold.lease());
        let grant = Grant::new(hold, Arc::clone(&queue));
        Err(Box::pin(async move {
            let token = match blocking(move || lease.next_token()).await? {
                // The next block could not be reserved because the
                // lock is not ours on disk any more (removed, or
                // taken over, before a renewal noticed): as for a
                // handoff found lost, the turn is ours, the lock is
                // not. Release what is left of it and go to the
                // store; the caller asked to wait for the lock, not
                // to hear about someone else's loss.
                Err(Error::Lost { .. }) => {
                    let head = Head::adopt(&queue);
                    drop(grant.take_hold());
                    drop(grant);
                    let fresh = Turn::Fresh { courtesy: false };
                    return self
                        .take_turn(
                            &name,
                            Mode::Exclusive,
                            queue,
                            fresh,
                            Some(head),
                            deadline,
                            started,
                        )
                        .await;
                }
                token => token?,
            };
            Ok(self.hand_out(&name, grant, token, started, None, Came::Handoff))
        }))
    }

    /// The guard of a grant whose token was taken: counts the
    /// acquisition, remembers it in the current scope, and records it in
    /// the acquisition's span.
    fn hand_out(
        &self,
        name: &LockName,
        grant: Arc<Grant>,
        token: Option<u64>,
        started: Stamp,
        ended: Option<Instant>,
        came: Came,
    ) -> LockGuard {
        let counters = &self.counters;
        let contended = came != Came::Free;
        match grant.mode() {
            Mode::Exclusive => {}
            Mode::Shared => {
                bump(&counters.shared_acquisitions);
                let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
                if shared.len() > 1024 {
                    shared.retain(|_, grant| grant.strong_count() > 0);
                }
                shared.insert(name.file_name().to_owned(), Arc::downgrade(&grant));
            }
            Mode::Permit(_) => bump(&counters.permit_acquisitions),
        }
        // A handoff's wait ended when the giver handed it on, a moment its
        // handoff window read.
        let waited = ended.map_or_else(|| started.elapsed(), |end| started.until(end));
        counters.acquired(came, waited);
        scope::remember(self.id, name.file_name(), &grant);
        let guard = grant.first_guard(token);
        // With no dispatcher ever set in the process there is no span to
        // record into (the current one is none): skip asking for it, on
        // the hot path of every handoff. The event is always offered: with
        // no dispatcher, `tracing`'s `log` feature sends it to `log`.
        if tracing::dispatcher::has_been_set() {
            let span = tracing::Span::current();
            if !span.is_disabled() {
                span.record("waited_ms", waited.as_secs_f64() * 1000.0);
                span.record("contended", contended);
                if let Some(token) = token {
                    span.record("fencing_token", token);
                }
            }
        }
        tracing::debug!(
            lock = name.as_str(),
            strategy = self.store.kind(),
            ?waited,
            contended,
            fencing_token = token,
            "lock acquired"
        );
        guard
    }

    /// Waits on the disk until the lock is ours. Only the head of the
    /// name's queue runs this, so one task per name touches the disk.
    async fn wait_on_disk(
        &self,
        name: &LockName,
        mode: Mode,
        queue: &Queue<Hold>,
        deadline: Option<Instant>,
        started: Stamp,
    ) -> Result<(Hold, bool)> {
        let _waiter = self.counters.fs_waiter();
        let mut jitter = None;
        let mut waited = false;
        let mut woken_by_event = false;
        let mut was_watched = false;
        // An exclusive waiter's announcement to shared holders, renewed
        // while it waits and withdrawn when this returns (or is dropped).
        let mut announced = None;
        // The holder last found, and when to say that we still wait for it.
        let mut holder: Option<Owner> = None;
        let mut notice_at = self.wait_notice.map(|after| later(started.instant(), after));
        // What this head tells the queue it saw, withdrawn however the wait
        // ends (taken, timed out, failed, cancelled): a later head may take
        // the lock at once, and a timeout queued behind it must not name a
        // holder from this wait.
        let mut published = LastSeen { queue, set: false };
        // Out of the line of other processes' waiters however this ends.
        let mut in_line = InLine {
            store: &self.store,
            name,
            acquired: false,
        };
        loop {
            // Armed before the attempt, so an event during it is not lost.
            let changed = queue.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            // A process that has waited longer goes first (a bounded
            // pause: never a reason not to try at all).
            let stand_back = self.store.stand_back(name, mode);
            // Asked before the attempt: events from then on reach `changed`.
            let mut watching = mode == Mode::Exclusive && self.store.watching();
            let attempt = match stand_back {
                Some(_) => None,
                None => Some(self.attempt(name, mode, deadline).await?),
            };
            let attempt_made = attempt.is_some();
            let recheck_at = match attempt {
                None => None,
                Some(Attempt::Acquired(hold)) => {
                    in_line.acquired = true;
                    return Ok((hold, waited));
                }
                Some(Attempt::Busy {
                    owner,
                    recheck_at,
                    sharers,
                }) => {
                    // A group's holders die inside its members directory.
                    watching &= !sharers;
                    if sharers && mode == Mode::Exclusive && announced.is_none() {
                        announced = self.announce(name).await?;
                    }
                    // In line only from here, inside `in_line`'s life
                    // (a semaphore's waiters stand in line for a permit
                    // however the name is held; an exclusive one waiting
                    // for sharers has its announcement instead).
                    if !sharers || matches!(mode, Mode::Permit(_)) {
                        self.store.wait_in_line(name, mode);
                    }
                    if !waited {
                        tracing::debug!(
                            lock = name.as_str(),
                            holder_pid = owner.as_ref().and_then(Owner::pid),
                            holder_host = owner.as_ref().and_then(Owner::hostname),
                            "lock is held elsewhere; waiting"
                        );
                    }
                    if owner.is_some() {
                        holder = owner;
                        *lock_ignoring_poison(&queue.last_seen) = holder.clone().map(Box::new);
                        published.set = true;
                    }
                    recheck_at
                }
            };
            waited = true;
            let now = timer::now();
            // A wait that is over (timed out, below) gives no notice: its
            // error names the holder.
            if let (Some(at), Some(after)) = (notice_at, self.wait_notice)
                && now >= at
                && deadline.is_none_or(|deadline| now < deadline)
            {
                still_waiting(name, holder.as_ref(), started.elapsed());
                notice_at = Some(later(now, after.saturating_mul(NOTICE_CADENCE)));
            }
            // With events, polling is only a safety net.
            let _ = failpoint!("engine.wait.before_watch");
            let watched = self.store.watch(name);
            // A watch that starts only now missed whatever happened since
            // the attempt (a release, say): look once more at once, unless
            // the watch already ran when the attempt began (a Locker that
            // waited before): an event since then woke `changed`.
            let look_again = watched && !was_watched && !(watching && attempt_made);
            was_watched = watched;
            let mut wake = later(
                now,
                if watched {
                    self.poll_interval.max(SAFETY_NET_POLL)
                } else {
                    jitter.get_or_insert_with(Jitter::new).around(self.poll_interval)
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
            if let Some(at) = notice_at {
                wake = wake.min(at);
            }
            if let Some(back) = stand_back {
                wake = wake.min(later(now, back));
            }
            if look_again {
                wake = now;
            }
            if let Some(deadline) = deadline {
                if now >= deadline {
                    return Err(self.timed_out(name, started, holder));
                }
                wake = wake.min(deadline);
            }
            woken_by_event = tokio::select! {
                _ = changed => true,
                _ = timer::sleep_until(wake) => false,
            };
        }
    }

    /// The timeout of an acquisition of `name` that began at `started`
    /// and last found `holder` at the lock.
    pub(crate) fn timed_out(&self, name: &LockName, started: Stamp, holder: Option<Owner>) -> Error {
        bump(&self.counters.timeouts);
        let waited = started.elapsed();
        tracing::debug!(lock = name.as_str(), ?waited, "timed out waiting for lock");
        Error::Timeout {
            name: name.as_str().to_owned(),
            waited,
            holder: holder.map(Box::new),
        }
    }

    /// One attempt. The uncontended case without syncing is a handful of
    /// short syscalls, tried inline (for a shared lock or a permit, the
    /// join under a free mutation lock, and the busy answer it may give);
    /// everything else (syncing, judging a record, reclaiming, fencing,
    /// waiting for a mutation lock) runs as one call on the blocking pool.
    /// Its result travels back over a channel rather than the task's join
    /// handle so that if this future was dropped meanwhile, the attempt's
    /// lock is dropped (and so removed) right there in the blocking task.
    ///
    /// A lock server is told `deadline`, so that a statement stuck there
    /// cannot keep the caller past it.
    async fn attempt(&self, name: &LockName, mode: Mode, deadline: Option<Instant>) -> Result<Attempt<Hold>> {
        // Counted until the attempt is over, wherever it runs, so that
        // `release_all` finds on its roll a lock the attempt takes.
        let flight = self.keeper.roll.enter(name.as_str())?;
        bump(&self.counters.fs_attempts);
        let keeper = &self.keeper;
        let arm = |lock, tokens| keeper.hold(name.as_str(), mode, lock, tokens);
        if let Some(attempt) = self.store.attempt_inline(name, mode, &arm)? {
            return self.unless_shut(name, attempt);
        }
        let (store, owned, keeper) = (self.store.clone(), name.clone(), self.keeper.clone());
        let attempt = blocking(move || {
            let _flight = flight;
            let arm = |lock, tokens| keeper.hold(owned.as_str(), mode, lock, tokens);
            store.attempt(&owned, mode, deadline, &arm)
        })
        .await??;
        self.unless_shut(name, attempt)
    }

    /// A lock taken while `release_all` began is not handed out: it was
    /// (or is being) released with the rest, and the acquisition fails.
    fn unless_shut(&self, name: &LockName, attempt: Attempt<Hold>) -> Result<Attempt<Hold>> {
        match attempt {
            Attempt::Acquired(hold) if self.keeper.roll.is_closed() => {
                drop(hold);
                Err(Error::ShutDown {
                    name: name.as_str().to_owned(),
                })
            }
            attempt => Ok(attempt),
        }
    }

    /// Announces an exclusive waiter for `name` to its shared holders and
    /// has the renewal thread keep the announcement current. Dropping the
    /// result withdraws it.
    pub(crate) async fn announce(&self, name: &LockName) -> Result<Option<Announced>> {
        self.keeper.roll.check(name.as_str())?;
        let (store, name) = (self.store.clone(), name.clone());
        let Some(announcement) = blocking(move || store.announce(&name)).await?? else {
            return Ok(None);
        };
        Ok(Some(self.keep_announced(announcement)))
    }

    /// [`announce`](Self::announce) for the upgrade of the upgradable
    /// holding `share` (see `Store::announce_upgrade`).
    pub(crate) async fn announce_upgrade(
        &self,
        name: &LockName,
        share: &Arc<crate::lease::Lease>,
    ) -> Result<Option<Announced>> {
        self.keeper.roll.check(name.as_str())?;
        let (store, name, share) = (self.store.clone(), name.clone(), Arc::clone(share));
        let announced = blocking(move || share.convert(|lock| store.announce_upgrade(&name, lock.as_ref())));
        let Some(announcement) = announced.await?? else {
            return Ok(None);
        };
        Ok(Some(self.keep_announced(announcement)))
    }

    /// An announcement, kept current by the renewal thread.
    fn keep_announced(&self, announcement: Arc<dyn crate::renew::Renewable>) -> Announced {
        let registration = self
            .keeper
            .renewer
            .add_weak(Arc::downgrade(&announcement), self.keeper.renew_interval);
        Announced {
            _registration: registration,
            _announcement: announcement,
        }
    }
}

/// An exclusive waiter's announcement, kept current by the renewal
/// thread; withdrawn when dropped.
pub(crate) struct Announced {
    _registration: Option<crate::renew::Registration>,
    _announcement: Arc<dyn crate::renew::Renewable>,
}

/// A waiter's notices come at the threshold, then every this many
/// thresholds (every 30 s with the default 5 s).
const NOTICE_CADENCE: u32 = 6;

/// The INFO event of a waiter that has waited `waited` for `name`, held
/// by `holder` as far as it knows.
fn still_waiting(name: &LockName, holder: Option<&Owner>, waited: Duration) {
    let since = holder
        .and_then(Owner::acquired_at)
        .map(crate::timestamp::format_time);
    tracing::info!(
        lock = name.as_str(),
        holder_pid = holder.and_then(Owner::pid),
        holder_host = holder.and_then(Owner::hostname),
        holder_since = since.as_deref(),
        waited_secs = waited.as_secs_f64(),
        "still waiting for lock {:?}{} after {:.1?}",
        name.as_str(),
        crate::error::held_by(holder),
        waited,
    );
}

/// Clears the queue's `last_seen` when dropped, if this head set it: the
/// uncontended path never sets it, so it costs nothing there.
struct LastSeen<'a> {
    queue: &'a Queue<Hold>,
    set: bool,
}

impl Drop for LastSeen<'_> {
    fn drop(&mut self) {
        if self.set {
            *lock_ignoring_poison(&self.queue.last_seen) = None;
        }
    }
}

/// Leaves the line of other processes' waiters for a name (see
/// [`Backend::stand_back`]) when a wait on the disk ends, however it ends.
struct InLine<'a> {
    store: &'a Store,
    name: &'a LockName,
    /// Set when the wait ends with the lock.
    acquired: bool,
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        self.store.stopped_waiting(self.name, self.acquired);
    }
}

fn lock_ignoring_poison<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn far_future() -> Instant {
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
}
