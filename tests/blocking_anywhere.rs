//! Nothing panics: the blocking methods of the crate (every exclusive
//! form, and one of each other kind: shared, permit, closure, inspecting;
//! `tests/blocking_kinds.rs` has the rest), and a guard's
//! `Drop`, called in every place a Tokio program can call them (plain
//! threads, runtimes' `block_on` and tasks of both flavors, `unconstrained`,
//! `spawn_blocking`, `block_in_place`, `LocalSet`s, entered handles, a
//! runtime's shutdown, a thread's exit), either works, with the right
//! result, or returns `Error::Unsupported` at once. Each call runs on a
//! fresh thread under `catch_unwind`, and the expected outcome of each place
//! is written down: a change of behaviour is a failure too.

use std::cell::RefCell;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use leasehold::{Error, LockGuard, Locker};
use tokio::runtime::{Builder, Runtime};
use tokio::task::{JoinHandle, LocalSet, unconstrained};

/// Where a call is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// A plain thread, no runtime anywhere.
    Thread,
    /// The future of a multi-thread runtime's `block_on` (`#[tokio::main]`).
    MultiBlockOn,
    /// The same, inside `tokio::task::unconstrained`.
    MultiBlockOnUnconstrained,
    /// The future of a current-thread runtime's `block_on`.
    CurrentBlockOn,
    /// The same, inside `unconstrained`.
    CurrentBlockOnUnconstrained,
    /// A current-thread runtime with a paused clock (`start_paused`).
    PausedBlockOn,
    /// A task on a multi-thread runtime's worker.
    MultiTask,
    /// The same, inside `unconstrained`.
    MultiTaskUnconstrained,
    /// A task on a current-thread runtime.
    CurrentTask,
    /// The same, inside `unconstrained`.
    CurrentTaskUnconstrained,
    /// `spawn_blocking` of a multi-thread runtime.
    MultiSpawnBlocking,
    /// `spawn_blocking` of a current-thread runtime.
    CurrentSpawnBlocking,
    /// `block_in_place` in a multi-thread runtime's task.
    BlockInPlaceInTask,
    /// `block_in_place` in a multi-thread runtime's `block_on`.
    BlockInPlaceInBlockOn,
    /// The future given to `LocalSet::run_until` in a current-thread runtime.
    CurrentLocalSet,
    /// A `spawn_local` task of a `LocalSet` in a current-thread runtime.
    CurrentLocalTask,
    /// The same, inside `unconstrained`.
    CurrentLocalTaskUnconstrained,
    /// The future given to `LocalSet::run_until` in a multi-thread runtime's
    /// `block_on`.
    MultiLocalSet,
    /// A `spawn_local` task there.
    MultiLocalTask,
    /// The same, inside `unconstrained`.
    MultiLocalTaskUnconstrained,
    /// A plain thread under a multi-thread runtime's `Handle::enter` guard.
    MultiEntered,
    /// A plain thread under a current-thread runtime's `Handle::enter` guard.
    CurrentEntered,
    /// The `Drop` of a task's future, run while a current-thread runtime
    /// shuts down.
    CurrentShutdown,
    /// The `Drop` of a task's future, run while a multi-thread runtime
    /// shuts down.
    MultiShutdown,
    /// The `Drop` of a thread-local value, run as its thread exits, after
    /// Tokio's own thread-local context is gone.
    ThreadExit,
}

const PLACES: [Place; 25] = [
    Place::Thread,
    Place::MultiBlockOn,
    Place::MultiBlockOnUnconstrained,
    Place::CurrentBlockOn,
    Place::CurrentBlockOnUnconstrained,
    Place::PausedBlockOn,
    Place::MultiTask,
    Place::MultiTaskUnconstrained,
    Place::CurrentTask,
    Place::CurrentTaskUnconstrained,
    Place::MultiSpawnBlocking,
    Place::CurrentSpawnBlocking,
    Place::BlockInPlaceInTask,
    Place::BlockInPlaceInBlockOn,
    Place::CurrentLocalSet,
    Place::CurrentLocalTask,
    Place::CurrentLocalTaskUnconstrained,
    Place::MultiLocalSet,
    Place::MultiLocalTask,
    Place::MultiLocalTaskUnconstrained,
    Place::MultiEntered,
    Place::CurrentEntered,
    Place::CurrentShutdown,
    Place::MultiShutdown,
    Place::ThreadExit,
];

/// What a blocking method must do in a place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Block if need be, and give the right result.
    Works,
    /// Return `Error::Unsupported` at once: this thread drives async code
    /// that a wait here could stall (or deadlock), or cannot reach a
    /// runtime.
    Refuses,
    /// Either, as Tokio decides which thread runs the code.
    Either,
}

impl Place {
    fn expect(self) -> Expect {
        use Place::*;
        match self {
            // Threads no scheduler counts on: Tokio's own blocking calls
            // work there too. The future of a multi-thread `block_on` that
            // opted out of the cooperative budget is no worker either (it
            // blocks only itself, as `block_in_place` lets it), and a
            // current-thread runtime being dropped runs nothing any more.
            Thread
            | MultiBlockOnUnconstrained
            | MultiSpawnBlocking
            | CurrentSpawnBlocking
            | BlockInPlaceInTask
            | BlockInPlaceInBlockOn
            | MultiLocalTaskUnconstrained
            | MultiEntered
            | CurrentEntered
            | CurrentShutdown => Expect::Works,
            // A task's future is dropped by a worker, or by the thread that
            // dropped the runtime.
            MultiShutdown => Expect::Either,
            // Async code a scheduler drives; and a thread whose Tokio
            // context is gone, where no runtime can be reached.
            MultiBlockOn
            | CurrentBlockOn
            | CurrentBlockOnUnconstrained
            | PausedBlockOn
            | MultiTask
            | MultiTaskUnconstrained
            | CurrentTask
            | CurrentTaskUnconstrained
            | CurrentLocalSet
            | CurrentLocalTask
            | CurrentLocalTaskUnconstrained
            | MultiLocalSet
            | MultiLocalTask
            | ThreadExit => Expect::Refuses,
        }
    }
}

fn multi() -> Runtime {
    Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn current() -> Runtime {
    Builder::new_current_thread().enable_all().build().unwrap()
}

/// Runs `f` in `place`, on a thread of its own, and returns what it
/// returned, or its panic.
fn run_in<R: Send + 'static>(place: Place, f: impl FnOnce() -> R + Send + 'static) -> std::thread::Result<R> {
    let f = move || std::panic::catch_unwind(AssertUnwindSafe(f));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // A panic of the place itself (a runtime's) counts as the call's.
        let sender = tx.clone();
        match std::panic::catch_unwind(AssertUnwindSafe(|| run_on_this_thread(place, f, sender))) {
            Ok(Some(ran)) => drop(tx.send(ran)),
            Ok(None) => {}
            Err(panic) => drop(tx.send(Err(panic))),
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{place:?}: no answer: {e}"))
}

/// Runs `f` in `place`; `None` when the result is sent on `tx` instead (by
/// a `Drop`).
fn run_on_this_thread<R: Send + 'static>(
    place: Place,
    f: impl FnOnce() -> std::thread::Result<R> + Send + 'static,
    tx: mpsc::Sender<std::thread::Result<R>>,
) -> Option<std::thread::Result<R>> {
    use Place::*;
    let ran = match place {
        Thread => f(),
        MultiBlockOn => multi().block_on(async { f() }),
        MultiBlockOnUnconstrained => multi().block_on(unconstrained(async { f() })),
        CurrentBlockOn => current().block_on(async { f() }),
        CurrentBlockOnUnconstrained => current().block_on(unconstrained(async { f() })),
        PausedBlockOn => Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(async { f() }),
        MultiTask => multi().block_on(joined(|| tokio::spawn(async { f() }))),
        MultiTaskUnconstrained => multi().block_on(joined(|| tokio::spawn(unconstrained(async { f() })))),
        CurrentTask => current().block_on(joined(|| tokio::spawn(async { f() }))),
        CurrentTaskUnconstrained => current().block_on(joined(|| tokio::spawn(unconstrained(async { f() })))),
        MultiSpawnBlocking => multi().block_on(joined(|| tokio::task::spawn_blocking(f))),
        CurrentSpawnBlocking => current().block_on(joined(|| tokio::task::spawn_blocking(f))),
        BlockInPlaceInTask => {
            multi().block_on(joined(|| tokio::spawn(async { tokio::task::block_in_place(f) })))
        }
        BlockInPlaceInBlockOn => multi().block_on(async { tokio::task::block_in_place(f) }),
        CurrentLocalSet => current().block_on(LocalSet::new().run_until(async { f() })),
        CurrentLocalTask => {
            current().block_on(LocalSet::new().run_until(joined(|| tokio::task::spawn_local(async { f() }))))
        }
        CurrentLocalTaskUnconstrained => current().block_on(
            LocalSet::new().run_until(joined(|| tokio::task::spawn_local(unconstrained(async { f() })))),
        ),
        MultiLocalSet => multi().block_on(LocalSet::new().run_until(async { f() })),
        MultiLocalTask => {
            multi().block_on(LocalSet::new().run_until(joined(|| tokio::task::spawn_local(async { f() }))))
        }
        MultiLocalTaskUnconstrained => multi().block_on(
            LocalSet::new().run_until(joined(|| tokio::task::spawn_local(unconstrained(async { f() })))),
        ),
        MultiEntered => {
            let runtime = multi();
            let _entered = runtime.enter();
            f()
        }
        CurrentEntered => {
            let runtime = current();
            let _entered = runtime.enter();
            f()
        }
        CurrentShutdown | MultiShutdown => {
            let runtime = if place == CurrentShutdown {
                current()
            } else {
                multi()
            };
            let on_drop = OnDrop(Some(Box::new(move || {
                let _ = tx.send(f());
            })));
            let (started, running) = mpsc::channel();
            runtime.spawn(async move {
                let _on_drop = on_drop;
                let _ = started.send(());
                std::future::pending::<()>().await;
            });
            if place == MultiShutdown {
                // Polled once on a worker: its future is dropped there.
                running.recv().unwrap();
            }
            drop(runtime);
            return None;
        }
        ThreadExit => {
            thread_local! {
                static AT_EXIT: RefCell<Option<OnDrop>> = const { RefCell::new(None) };
            }
            // Registered first, so destroyed after Tokio's context (the
            // thread-local destructors run in reverse order).
            AT_EXIT.with(|at_exit| {
                *at_exit.borrow_mut() = Some(OnDrop(Some(Box::new(move || {
                    let gone = tokio::runtime::Handle::try_current()
                        .err()
                        .is_some_and(|e| e.is_thread_local_destroyed());
                    assert!(
                        gone,
                        "the test needs Tokio's thread-local context destroyed first"
                    );
                    let _ = tx.send(f());
                }))));
            });
            let runtime = current();
            runtime.block_on(async {});
            drop(runtime);
            return None;
        }
    };
    Some(ran)
}

/// A task's result, its panic passed on.
async fn joined<R>(spawn: impl FnOnce() -> JoinHandle<std::thread::Result<R>>) -> std::thread::Result<R> {
    spawn().await.unwrap_or_else(|e| Err(e.into_panic()))
}

/// Runs its closure when dropped.
struct OnDrop(Option<Box<dyn FnOnce() + Send>>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// A blocking call and the check of its result.
#[derive(Debug, Clone, Copy)]
enum Call {
    /// `blocking_acquire` of a free name.
    Acquire,
    /// `blocking_try_acquire` of a free name.
    TryAcquireFree,
    /// `blocking_try_acquire` of a name another `Locker` holds.
    TryAcquireHeld,
    /// `blocking_acquire_timeout` of a free name.
    AcquireTimeoutFree,
    /// `blocking_acquire_timeout` of a name another `Locker` holds.
    AcquireTimeoutHeld,
    /// Dropping a guard taken elsewhere.
    DropGuard,
    /// Dropping a shared lock's guard taken elsewhere.
    DropShared,
    /// Dropping a semaphore's permit taken elsewhere.
    DropPermit,
    /// `leasehold::testing::blocking_serial`.
    Serial,
    /// `blocking_acquire_shared` of a free name.
    AcquireShared,
    /// `Semaphore::blocking_acquire_timeout` of a free name.
    PermitTimeoutFree,
    /// `blocking_holder` of the name another `Locker` holds.
    HolderOfHeld,
    /// `blocking_list`.
    List,
    /// `blocking_with_lock` of a free name.
    WithLock,
}

const CALLS: [Call; 14] = [
    Call::Acquire,
    Call::TryAcquireFree,
    Call::TryAcquireHeld,
    Call::AcquireTimeoutFree,
    Call::AcquireTimeoutHeld,
    Call::DropGuard,
    Call::DropShared,
    Call::DropPermit,
    Call::Serial,
    Call::AcquireShared,
    Call::PermitTimeoutFree,
    Call::HolderOfHeld,
    Call::List,
    Call::WithLock,
];

/// What a call did.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// It gave the right result.
    Worked,
    /// It returned `Error::Unsupported`.
    Refused,
    /// Anything else.
    Wrong(String),
}

/// Makes `call` on `name` (the lock `held` is held by another `Locker`).
fn make(call: Call, locker: &Locker, name: &str, held: &str, guard: Option<LockGuard>) -> Outcome {
    let holder_pid = Some(std::process::id());
    let exists = |name: &str| locker.lock_path(name).unwrap().exists();
    let judge = |result: leasehold::Result<Outcome>| match result {
        Ok(outcome) => outcome,
        Err(Error::Unsupported { .. }) => Outcome::Refused,
        Err(error) => Outcome::Wrong(format!("{error:?}")),
    };
    let holds = |guard: LockGuard| {
        if guard.name() == name && !guard.is_lost() && exists(name) {
            Outcome::Worked
        } else {
            Outcome::Wrong("a guard that does not hold the lock".into())
        }
    };
    match call {
        Call::Acquire => judge(locker.blocking_acquire(name).map(holds)),
        Call::TryAcquireFree => judge(locker.blocking_try_acquire(name).map(|guard| match guard {
            Some(guard) => holds(guard),
            None => Outcome::Wrong("a free lock was not taken".into()),
        })),
        Call::TryAcquireHeld => judge(locker.blocking_try_acquire(held).map(|guard| match guard {
            None => Outcome::Worked,
            Some(_) => Outcome::Wrong("a held lock was taken".into()),
        })),
        Call::AcquireTimeoutFree => judge(
            locker
                .blocking_acquire_timeout(name, Duration::from_secs(30))
                .map(holds),
        ),
        Call::AcquireTimeoutHeld => match locker.blocking_acquire_timeout(held, Duration::from_millis(50)) {
            Err(error @ Error::Timeout { .. }) if error.holder().and_then(|h| h.pid()) == holder_pid => {
                Outcome::Worked
            }
            other => judge(other.map(|_| Outcome::Wrong("a held lock was taken".into()))),
        },
        Call::DropGuard | Call::DropShared | Call::DropPermit => {
            drop(guard.expect("a guard to drop"));
            Outcome::Worked
        }
        Call::Serial => {
            let serial = leasehold::testing::blocking_serial(name);
            drop(serial);
            Outcome::Worked
        }
        Call::AcquireShared => judge(locker.blocking_acquire_shared(name).map(|guard| {
            if guard.is_shared() {
                holds(guard)
            } else {
                Outcome::Wrong("not a shared guard".into())
            }
        })),
        Call::PermitTimeoutFree => judge(
            locker
                .semaphore(name, 2)
                .and_then(|semaphore| semaphore.blocking_acquire_timeout(Duration::from_secs(30)))
                .map(holds),
        ),
        Call::HolderOfHeld => {
            judge(
                locker
                    .blocking_holder(held)
                    .map(|owner| match owner.and_then(|owner| owner.pid()) {
                        pid if pid == holder_pid => Outcome::Worked,
                        other => Outcome::Wrong(format!("holder pid {other:?}")),
                    }),
            )
        }
        Call::List => judge(locker.blocking_list().map(|locks| {
            if locks.iter().any(|lock| lock.name() == held) {
                Outcome::Worked
            } else {
                Outcome::Wrong(format!("{held} not listed"))
            }
        })),
        Call::WithLock => judge(locker.blocking_with_lock(name, || exists(name)).map(
            |inside| match inside {
                true => Outcome::Worked,
                false => Outcome::Wrong("not held while `f` ran".into()),
            },
        )),
    }
}

/// Waits up to 10 s for what `call` took of `name` to be free again.
fn freed(locker: &Locker, call: Call, name: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    let other = Locker::new(locker.directory()).unwrap();
    let semaphore = other.semaphore(name, 1).unwrap();
    let runtime = current();
    loop {
        let free = match call {
            // An exclusive try fails while a shared holder is in.
            Call::DropShared => other.blocking_try_acquire(name).unwrap().is_some(),
            Call::DropPermit => runtime.block_on(semaphore.try_acquire()).unwrap().is_some(),
            _ => !locker.lock_path(name).unwrap().exists(),
        };
        if free {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A guard of the kind `call` drops, of `name`, taken here.
fn taken(locker: &Locker, call: Call, name: &str) -> Option<LockGuard> {
    let runtime = current();
    match call {
        Call::DropGuard => Some(locker.blocking_acquire(name).unwrap()),
        Call::DropShared => Some(runtime.block_on(locker.acquire_shared(name)).unwrap()),
        Call::DropPermit => Some(
            runtime
                .block_on(locker.semaphore(name, 1).unwrap().acquire())
                .unwrap(),
        ),
        _ => None,
    }
}

fn check(dir: &Path, place: Place, call: Call, held: &str) -> Result<(), String> {
    let locker = Locker::new(dir).unwrap();
    let name = format!("{place:?}-{call:?}");
    let guard = taken(&locker, call, &name);
    let started = Instant::now();
    let outcome = {
        let (locker, name, held) = (locker.clone(), name.clone(), held.to_owned());
        run_in(place, move || make(call, &locker, &name, &held, guard))
    };
    let took = started.elapsed();
    let outcome = outcome.map_err(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        format!("{place:?} {call:?}: panicked: {message}")
    })?;
    let expected = match (call, place.expect()) {
        // Not a blocking call: a drop works everywhere.
        (Call::DropGuard | Call::DropShared | Call::DropPermit, _) => Outcome::Worked,
        // A test helper: it waits on a thread of its own where this one
        // may not block.
        (Call::Serial, _) => Outcome::Worked,
        (_, Expect::Works) => Outcome::Worked,
        (_, Expect::Refuses) => Outcome::Refused,
        (_, Expect::Either) if outcome == Outcome::Refused => Outcome::Refused,
        (_, Expect::Either) => Outcome::Worked,
    };
    if outcome != expected {
        return Err(format!("{place:?} {call:?}: {outcome:?}, expected {expected:?}"));
    }
    if outcome == Outcome::Refused && took > Duration::from_secs(5) {
        return Err(format!("{place:?} {call:?}: refused only after {took:?}"));
    }
    if !freed(&locker, call, &name) {
        return Err(format!("{place:?} {call:?}: the lock is still held"));
    }
    Ok(())
}

#[test]
fn every_blocking_call_works_or_refuses_in_every_place_and_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let holder = Locker::new(dir.path()).unwrap();
    let _held = holder.blocking_acquire("held").unwrap();
    let mut failures = Vec::new();
    for place in PLACES {
        // The place is made by a thread-local destructor that must run
        // after Tokio's: the reverse order of registration, which Windows'
        // thread-local destructors do not keep (the set-up itself fails).
        if cfg!(windows) && place == Place::ThreadExit {
            continue;
        }
        for call in CALLS {
            if let Err(failure) = check(dir.path(), place, call, "held") {
                failures.push(failure);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
