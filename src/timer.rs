//! leasehold's own timer, so that waiting needs nothing from the runtime.
//!
//! Tokio's timers panic on a runtime built without its time driver (no
//! `enable_time`), and there is no way to ask a runtime whether it has one.
//! Waiting for a lock must not depend on how the caller built its runtime,
//! so every wait in leasehold (between attempts, the courtesy pause, the
//! deadline of a queued `acquire_timeout`) sleeps on this timer instead:
//! one thread per process, started on first use, that wakes each waiting
//! task's waker at its deadline. A waiting task costs one heap entry; the
//! thread sleeps until the earliest deadline, and not at all while nothing
//! waits.
//!
//! One exception: where a test made Tokio's clock virtual (`start_paused`,
//! `tokio::time::pause`) and the runtime has a time driver, waits are
//! Tokio sleeps on that clock, so that they take part in its auto-advance
//! exactly as the test's own timers do, and [`now`] is that clock.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// A future that completes at `deadline`.
#[derive(Debug)]
pub(crate) struct Sleep {
    /// On [`now`]'s clock.
    deadline: Instant,
    /// The registration with the timer thread, once polled.
    id: Option<u64>,
    /// On a virtual Tokio clock: a sleep on it instead.
    tokio: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// Whether Tokio's clock is virtual: paused now (it stands still between
/// two reads, and still once the monotonic clock has ticked), or paused
/// before and resumed (it runs apart from the monotonic clock).
fn virtual_clock() -> bool {
    let first = tokio::time::Instant::now();
    let second = tokio::time::Instant::now();
    if first == second {
        return stands_still(second);
    }
    together(second).is_none()
}

/// The monotonic clock, read now, unless Tokio's clock, read as `at`,
/// runs apart from it by more than a millisecond (it was paused, and
/// resumed): `None` then. A thread preempted between the two reads sees
/// such a gap once: it must see it again, twice, before the clock counts
/// as virtual (asking a runtime without a time driver prints a caught
/// panic).
fn together(at: tokio::time::Instant) -> Option<Instant> {
    let gap = |tokio: Instant, real: Instant| tokio > real || real - tokio > Duration::from_millis(1);
    let real = Instant::now();
    if !gap(at.into_std(), real) {
        return Some(real);
    }
    let apart = (0..2).all(|_| gap(tokio::time::Instant::now().into_std(), Instant::now()));
    (!apart).then(Instant::now)
}

/// Whether Tokio's clock, read as `at` twice in a row, stands still (is
/// paused): it has not moved once the monotonic clock has. A real clock
/// too coarse to tick between two reads (Windows' ticks are 100 ns, and
/// Wine's reads often meet within one) is no paused clock, and must not
/// lead to asking the runtime for a time driver, which prints a caught
/// panic where it has none. The wait for a tick is bounded (a monotonic
/// clock ticks within a microsecond, at most a millisecond or so).
fn stands_still(at: tokio::time::Instant) -> bool {
    let real = Instant::now();
    for _ in 0..1_000_000 {
        if Instant::now() != real {
            break;
        }
        std::hint::spin_loop();
    }
    tokio::time::Instant::now() == at
}

/// Whether the current runtime has a time driver, asked only of runtimes
/// whose clock is virtual (tests), once per runtime. Tokio cannot be asked:
/// making a sleep without one panics, before anything is registered, and
/// that is caught.
fn time_driver() -> bool {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return false;
    };
    static LAST: Mutex<Option<(tokio::runtime::Id, bool)>> = Mutex::new(None);
    let id = handle.id();
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((seen, has)) = *last
        && seen == id
    {
        return has;
    }
    let has = std::panic::catch_unwind(|| drop(tokio::time::sleep(Duration::ZERO))).is_ok();
    *last = Some((id, has));
    has
}

/// Whether waits use Tokio's timers and clock: only on a virtual clock
/// (a test's paused clock must see every wait, to auto-advance past
/// them as past its own timers), and only with a time driver.
fn on_tokio_clock() -> bool {
    virtual_clock() && time_driver()
}

/// Now, on the clock leasehold's waits use: the monotonic clock, or
/// Tokio's where a test made it virtual.
pub(crate) fn now() -> Instant {
    stamp().at
}

/// A moment on [`now`]'s clock that remembers which clock that was, so
/// that measuring from it ([`Stamp::elapsed`]) reads that clock once
/// instead of asking again which clock to read (three reads, then one
/// more).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stamp {
    at: Instant,
    tokio: bool,
}

/// Now, as a [`Stamp`]: [`virtual_clock`]'s reads, reused for the
/// answer (three reads of the clocks, against four for `on_tokio_clock`
/// and another read).
pub(crate) fn stamp() -> Stamp {
    let first = tokio::time::Instant::now();
    let second = tokio::time::Instant::now();
    if first == second && stands_still(second) {
        if time_driver() {
            return Stamp {
                at: second.into_std(),
                tokio: true,
            };
        }
        return Stamp {
            at: Instant::now(),
            tokio: false,
        };
    }
    match together(second) {
        Some(real) => Stamp {
            at: real,
            tokio: false,
        },
        None if time_driver() => Stamp {
            at: tokio::time::Instant::now().into_std(),
            tokio: true,
        },
        None => Stamp {
            at: Instant::now(),
            tokio: false,
        },
    }
}

/// [`stamp`], inside the runtime `runtime`: on a multi-thread runtime,
/// whose clock Tokio never lets a test pause (only a current-thread
/// runtime's), one read of the monotonic clock.
pub(crate) fn stamp_in(runtime: &tokio::runtime::Handle) -> Stamp {
    if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
        return Stamp {
            at: Instant::now(),
            tokio: false,
        };
    }
    stamp()
}

impl Stamp {
    /// The moment itself, on [`now`]'s clock.
    pub(crate) fn instant(self) -> Instant {
        self.at
    }

    /// How long since this moment, on the clock it was read from.
    pub(crate) fn elapsed(self) -> Duration {
        let now = if self.tokio {
            tokio::time::Instant::now().into_std()
        } else {
            Instant::now()
        };
        now.saturating_duration_since(self.at)
    }

    /// How long from this moment to `end`, a moment read on the monotonic
    /// clock: no clock read, unless this moment is on Tokio's virtual
    /// clock (then, as [`elapsed`](Self::elapsed), now).
    pub(crate) fn until(self, end: Instant) -> Duration {
        if self.tokio {
            return self.elapsed();
        }
        end.saturating_duration_since(self.at)
    }
}

/// Completes at `deadline` (on [`now`]'s clock).
pub(crate) fn sleep_until(deadline: Instant) -> Sleep {
    let tokio = on_tokio_clock()
        .then(|| Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(deadline))));
    Sleep {
        deadline,
        id: None,
        tokio,
    }
}

/// Completes after `duration`.
pub(crate) fn sleep(duration: Duration) -> Sleep {
    let now = now();
    sleep_until(
        now.checked_add(duration)
            .unwrap_or(now + Duration::from_secs(86_400 * 365)),
    )
}

impl Sleep {
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(tokio) = &mut self.tokio {
            return tokio.as_mut().poll(cx);
        }
        if Instant::now() >= self.deadline {
            if let Some(id) = self.id.take() {
                timer().cancel(id);
            }
            return Poll::Ready(());
        }
        match timer().register(self.id, self.deadline, cx.waker()) {
            Some(id) => {
                self.id = Some(id);
                Poll::Pending
            }
            // No timer thread could be started (the process is out of
            // threads): wake again at once rather than never. Busy, but
            // the deadline is kept.
            None => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            timer().cancel(id);
        }
    }
}

/// Entries removed from a deadline queue's map stay in its heap until due
/// (finding them there would cost a search); the heap is rebuilt from the
/// live entries once they pile up (many waits ended early, many short
/// holds). Shared by the timer and the renewal thread.
pub(crate) fn compact<T>(due: &mut BinaryHeap<Reverse<(Instant, u64)>>, live: &HashMap<u64, (Instant, T)>) {
    if due.len() > 2 * live.len() + 64 {
        *due = live.iter().map(|(id, (at, _))| Reverse((*at, *id))).collect();
    }
}

#[derive(Debug, Default)]
struct Timer {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct State {
    due: BinaryHeap<Reverse<(Instant, u64)>>,
    waiting: HashMap<u64, (Instant, Waker)>,
    next_id: u64,
    /// The process whose thread serves the timer: a forked child inherits
    /// `running` but not the thread, and must start its own.
    running: Option<u32>,
    /// When the thread will wake by itself; `None` while it idles.
    sleeping_until: Option<Instant>,
}

fn timer() -> &'static Arc<Timer> {
    static TIMER: OnceLock<Arc<Timer>> = OnceLock::new();
    TIMER.get_or_init(Arc::default)
}

impl Timer {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers (or updates the waker of) a sleep; `None` when the timer
    /// thread cannot run.
    fn register(self: &Arc<Self>, id: Option<u64>, deadline: Instant, waker: &Waker) -> Option<u64> {
        let mut state = self.state();
        if let Some(id) = id
            && let Some((_, old)) = state.waiting.get_mut(&id)
        {
            if !old.will_wake(waker) {
                let old = std::mem::replace(old, waker.clone());
                // Dropping a waker can run arbitrary code: not under the lock.
                drop(state);
                drop(old);
            }
            return Some(id);
        }
        let me = std::process::id();
        if state.running != Some(me) {
            if state.running.is_some() {
                // Forked: the entries are the parent's tasks'. Their wakers
                // are not ours to run or drop.
                std::mem::forget(std::mem::take(&mut state.waiting));
                state.due.clear();
                state.sleeping_until = None;
            }
            let timer = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name("leasehold-timer".into())
                .spawn(move || timer.run());
            if let Err(error) = spawned {
                tracing::error!(%error, "cannot start leasehold's timer thread");
                return None;
            }
            state.running = Some(me);
        }
        let id = state.next_id;
        state.next_id += 1;
        state.waiting.insert(id, (deadline, waker.clone()));
        state.due.push(Reverse((deadline, id)));
        if state.sleeping_until.is_none_or(|until| deadline < until) {
            self.wake.notify_one();
        }
        Some(id)
    }

    fn cancel(&self, id: u64) {
        let mut state = self.state();
        let removed = state.waiting.remove(&id);
        let State { due, waiting, .. } = &mut *state;
        compact(due, waiting);
        drop(state);
        drop(removed);
    }

    fn run(&self) {
        let mut state = self.state();
        loop {
            let now = Instant::now();
            let mut woken = Vec::new();
            while let Some(&Reverse((at, id))) = state.due.peek() {
                if at > now {
                    break;
                }
                state.due.pop();
                if let Some((_, waker)) = state.waiting.remove(&id) {
                    woken.push(waker);
                }
            }
            if !woken.is_empty() {
                drop(state);
                woken.into_iter().for_each(Waker::wake);
                state = self.state();
                continue;
            }
            let next = state.due.peek().map(|Reverse((at, _))| *at);
            state.sleeping_until = next;
            state = match next {
                Some(at) => {
                    self.wake
                        .wait_timeout(state, at.saturating_duration_since(now))
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.wake.wait(state).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a real clock too coarse to tick between two reads (Windows'
    /// 100 ns, under Wine often), the clock was taken for a paused one,
    /// and asking a runtime without a time driver whether it had one
    /// printed a caught panic ("panicked at src/timer.rs") into the
    /// program's stderr, once per runtime: every blocking call's.
    /// A thread preempted between its read of Tokio's clock and its read
    /// of the monotonic clock saw them a millisecond and more apart, took
    /// the real clock for a resumed virtual one, and asked the runtime for
    /// a time driver (a caught panic printed where it had none: the test
    /// below failed under load).
    #[test]
    fn a_read_preempted_between_the_two_clocks_is_no_virtual_clock() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            // As if this thread had slept 2 ms between its two reads.
            let stale = tokio::time::Instant::now() - Duration::from_millis(2);
            assert!(together(stale).is_some(), "a real clock taken for a resumed one");
            let ahead = tokio::time::Instant::now() + Duration::from_millis(2);
            assert!(together(ahead).is_some(), "a real clock taken for a resumed one");
        });
    }

    #[test]
    fn a_coarse_real_clock_never_asks_a_runtime_without_timers() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static ASKED: AtomicUsize = AtomicUsize::new(0);
        let previous = std::sync::Arc::new(std::panic::take_hook());
        let chained = std::sync::Arc::clone(&previous);
        std::panic::set_hook(Box::new(move |info| {
            if info.location().is_some_and(|l| l.file().ends_with("timer.rs")) {
                ASKED.fetch_add(1, Ordering::Relaxed);
            } else {
                chained(info);
            }
        }));
        for _ in 0..200 {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            runtime.block_on(async {
                for _ in 0..50 {
                    let at = stamp();
                    assert!(!at.tokio, "a real clock taken for Tokio's");
                    assert!(!on_tokio_clock());
                }
            });
        }
        drop(std::panic::take_hook());
        std::panic::set_hook(Box::new(move |info| previous(info)));
        assert_eq!(ASKED.load(Ordering::Relaxed), 0, "runtimes without timers asked");
    }

    #[test]
    fn sleeps_end_at_their_deadline_without_a_runtime_timer() {
        // A runtime without the time driver: Tokio's own sleep would panic.
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let started = Instant::now();
        runtime.block_on(async {
            let short = sleep(Duration::from_millis(20));
            let long = sleep(Duration::from_millis(60));
            tokio::join!(long, short);
        });
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(60), "{took:?}");
        assert!(took < Duration::from_secs(10), "{took:?}");
    }

    #[test]
    fn a_stamp_is_on_the_clock_waits_use() {
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        let stamp = multi.block_on(async { stamp_in(&tokio::runtime::Handle::current()) });
        assert!(!stamp.tokio);
        assert!(stamp.elapsed() < Duration::from_secs(5));
        let paused = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        paused.block_on(async {
            let stamp = stamp_in(&tokio::runtime::Handle::current());
            assert!(stamp.tokio, "a paused clock is Tokio's");
            tokio::time::advance(Duration::from_secs(60)).await;
            assert!(stamp.elapsed() >= Duration::from_secs(60));
            assert_eq!(stamp.instant(), now() - stamp.elapsed());
        });
    }

    #[test]
    fn a_dropped_sleep_leaves_nothing_behind() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            for _ in 0..1000 {
                let mut sleep = std::pin::pin!(sleep(Duration::from_secs(3600)));
                let polled = std::future::poll_fn(|cx| Poll::Ready(sleep.as_mut().poll(cx))).await;
                assert!(polled.is_pending());
            }
        });
        let state = timer().state();
        assert!(state.waiting.len() < 10, "{}", state.waiting.len());
        assert!(state.due.len() <= 2 * state.waiting.len() + 64);
    }
}
