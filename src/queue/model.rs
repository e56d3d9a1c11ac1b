//! Model checks of the queue under `loom`: every interleaving (up to a
//! bound on preemptions) of two and three tasks taking one name's turn,
//! handing the lock on, releasing it, and being cancelled.
//!
//! The store is an in-memory model: a count of holders, which taking the
//! lock asserts was zero. The tasks drive the queue as the engine does for
//! an exclusive lock (`Acquire::poll`, `Engine::take_turn`,
//! `Engine::finish`, `Engine::try_acquire` and the guard's `pass_on`
//! policy): a copy of its steps, not the engine itself, with each wait on
//! the disk replaced by one await that wakes itself, the points where an
//! acquisition can be cancelled. Run with
//!
//! ```text
//! RUSTFLAGS="--cfg leasehold_loom" cargo test --release --lib queue::model -- --nocapture
//! ```
//!
//! (`LOOM_MAX_PREEMPTIONS` sets the bound for three tasks; see
//! docs/guarantees.md, *Model checks*.)

use std::future::{Future, poll_fn};
use std::sync::{Arc, Mutex as StdMutex};
use std::task::{Context, Poll, Waker};

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

use super::*;
use crate::sync::check;

/// The in-memory store, and what the tasks saw of it.
#[derive(Debug, Default)]
struct World {
    /// Holders of the lock in the store: a handoff keeps it at one.
    holders: AtomicUsize,
    /// Guards alive: the tasks inside the critical section.
    inside: AtomicUsize,
    /// Who held the lock, in order, and with which ticket it had queued
    /// (`None`: it found the turn free).
    held: StdMutex<Vec<(usize, Option<u64>)>>,
}

impl World {
    fn held(&self) -> Vec<(usize, Option<u64>)> {
        self.held.lock().unwrap().clone()
    }
}

/// The lock as the store gave it; dropping it releases it there.
#[derive(Debug)]
struct Hold {
    world: Arc<World>,
    /// Whether the release policy hands it to the next local waiter (a
    /// lock taken within `HANDOFF_WINDOW`) or releases it and passes a
    /// fresh turn (one held longer).
    handoff: bool,
}

impl Hold {
    /// Takes the lock from the store, which nobody may hold: only the
    /// turn's holder goes to the store, and no other process is modelled.
    fn take(world: &Arc<World>, handoff: bool) -> Self {
        let before = world.holders.fetch_add(1, Ordering::SeqCst);
        assert_eq!(before, 0, "the store was taken while held");
        Hold {
            world: Arc::clone(world),
            handoff,
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.world.holders.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `guard::pass_on`, with the handoff window decided by the hold.
fn pass_on(hold: Hold, queue: &Queue<Hold>) {
    let within_window = hold.handoff;
    let hold = if within_window {
        match queue.offer(hold) {
            None => return,
            Some(hold) => hold,
        }
    } else {
        hold
    };
    let courtesy = !within_window && queue.has_waiters();
    drop(hold);
    queue.pass_fresh(courtesy);
}

/// A guard: the critical section runs while it lives, and its drop is
/// `Grant`'s (an exclusive hold, released through `pass_on`).
#[derive(Debug)]
struct Guard {
    hold: Option<Hold>,
    queue: Arc<Queue<Hold>>,
}

impl Guard {
    fn new(hold: Hold, queue: Arc<Queue<Hold>>, who: usize, ticket: Option<u64>) -> Self {
        let world = &hold.world;
        let inside = world.inside.fetch_add(1, Ordering::SeqCst);
        assert_eq!(inside, 0, "two holders at once");
        world.held.lock().unwrap().push((who, ticket));
        Guard {
            hold: Some(hold),
            queue,
        }
    }

    /// The critical section: a point where any other task may run.
    fn work(&self) {
        thread::yield_now();
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let hold = self.hold.take().expect("held until dropped");
        hold.world.inside.fetch_sub(1, Ordering::SeqCst);
        pass_on(hold, &self.queue);
    }
}

fn queue() -> Arc<Queue<Hold>> {
    Arc::new(Queue::new(LockName::from_file_name("model"), pass_on))
}

/// Pending once (waking itself): a wait on the disk (or on the blocking
/// pool), where an acquisition can be cancelled.
async fn disk_wait() {
    let mut waited = false;
    poll_fn(|cx| {
        if waited {
            return Poll::Ready(());
        }
        waited = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await;
}

/// `Engine::take_turn` for an exclusive lock.
async fn take_turn(
    world: Arc<World>,
    queue: Arc<Queue<Hold>>,
    who: usize,
    ticket: Option<u64>,
    turn: Turn<Hold>,
    head: Option<Head<Hold>>,
    handoff: bool,
) -> Guard {
    match turn {
        Turn::Handoff(hold) => finish(hold, queue, who, ticket).await,
        Turn::Fresh { .. } => {
            let head = head.unwrap_or_else(|| Head::adopt(&queue));
            disk_wait().await;
            let hold = Hold::take(&world, handoff);
            head.disarm();
            finish(hold, queue, who, ticket).await
        }
    }
}

/// `Engine::finish`: the hold goes into its grant (here the guard), which
/// passes it on if the fencing token's fetch from disk is cancelled.
async fn finish(hold: Hold, queue: Arc<Queue<Hold>>, who: usize, ticket: Option<u64>) -> Guard {
    let guard = Guard::new(hold, queue, who, ticket);
    disk_wait().await;
    guard
}

/// `Engine::try_acquire` for an exclusive lock: the turn only if it is
/// free, then one attempt at the store.
async fn try_acquire(world: Arc<World>, queue: Arc<Queue<Hold>>, who: usize, handoff: bool) -> Option<Guard> {
    let head = queue.try_head()?;
    disk_wait().await;
    let hold = Hold::take(&world, handoff);
    // The turn goes into the grant before `finish` can be cancelled.
    head.disarm();
    Some(finish(hold, Arc::clone(&queue), who, None).await)
}

/// Waits for `ticket`'s turn, as `Acquire::poll`'s queued stage does.
async fn wait_turn(ticket: &mut Ticket<Hold>) -> Turn<Hold> {
    poll_fn(|cx| ticket.poll_turn(cx).map(|(turn, _)| turn)).await
}

/// `Acquire`: join the queue on the first poll, wait for the turn, take it.
async fn acquire(world: Arc<World>, queue: Arc<Queue<Hold>>, who: usize, handoff: bool) -> Guard {
    let join = poll_fn(|cx: &mut Context<'_>| Poll::Ready(queue.join(cx.waker(), true))).await;
    let (turn, head, ticket) = match join {
        Join::Head(head) => (Turn::Fresh { courtesy: false }, Some(head), None),
        Join::Queued(mut ticket) => {
            let number = ticket.ticket;
            (wait_turn(&mut ticket).await, None, Some(number))
        }
    };
    take_turn(world, queue, who, ticket, turn, head, handoff).await
}

/// Polls `fut` at most `polls` times, then drops it unfinished: a
/// cancellation (a timeout, a `select!`) between two of its polls.
async fn cancel_after<F: Future>(fut: F, polls: usize) -> Option<F::Output> {
    let mut fut = Box::pin(fut);
    let mut left = polls;
    poll_fn(move |cx| match fut.as_mut().poll(cx) {
        Poll::Ready(out) => Poll::Ready(Some(out)),
        Poll::Pending => {
            left -= 1;
            if left == 0 {
                Poll::Ready(None)
            } else {
                Poll::Pending
            }
        }
    })
    .await
}

/// How a task asks for the lock.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Call {
    Acquire,
    TryAcquire,
}

/// What a task does: acquire, work, release; cancelled after `cancel`
/// polls if set. Whether it came back with the lock.
fn task(
    world: &Arc<World>,
    queue: &Arc<Queue<Hold>>,
    who: usize,
    handoff: bool,
    call: Call,
    cancel: Option<usize>,
) -> bool {
    let (world, queue) = (Arc::clone(world), Arc::clone(queue));
    let call = async move {
        match call {
            Call::Acquire => Some(acquire(world, queue, who, handoff).await),
            Call::TryAcquire => try_acquire(world, queue, who, handoff).await,
        }
    };
    let guard = match cancel {
        None => loom::future::block_on(call),
        Some(polls) => loom::future::block_on(cancel_after(call, polls)).flatten(),
    };
    match guard {
        Some(guard) => {
            guard.work();
            true
        }
        None => false,
    }
}

/// After every task finished: nobody holds the lock or the turn, nobody
/// waits, and queued tasks held it in the order they queued.
fn settled(world: &World, queue: &Arc<Queue<Hold>>) {
    assert_eq!(world.holders.load(Ordering::SeqCst), 0, "the store is free");
    assert_eq!(world.inside.load(Ordering::SeqCst), 0);
    assert!(!queue.has_waiters(), "a waiter was left behind");
    assert!(queue.try_head().is_some(), "the turn was left taken");
    let tickets: Vec<u64> = world.held().iter().filter_map(|&(_, t)| t).collect();
    assert!(tickets.is_sorted(), "queued tasks held out of order: {tickets:?}");
}

/// `tasks` tasks (the model's main thread and `tasks - 1` others) ask for
/// the lock at once, task 0 through `call`, cancelled after `cancel` polls
/// if set; the others `acquire` it.
fn contend(tasks: usize, handoff: bool, call: Call, cancel: Option<usize>) {
    let mut what = format!("{tasks} tasks, handoff {handoff}");
    if call == Call::TryAcquire {
        what.push_str(", one by try_acquire");
    }
    if let Some(polls) = cancel {
        what.push_str(&format!(", one cancelled after {polls} polls"));
    }
    check(&what, tasks, move || {
        let world = Arc::new(World::default());
        let queue = queue();
        let others: Vec<_> = (1..tasks)
            .map(|who| {
                let (world, queue) = (Arc::clone(&world), Arc::clone(&queue));
                thread::spawn(move || task(&world, &queue, who, handoff, Call::Acquire, None))
            })
            .collect();
        let first = task(&world, &queue, 0, handoff, call, cancel);
        for other in others {
            assert!(
                other.join().unwrap(),
                "a task that was not cancelled held the lock"
            );
        }
        if cancel.is_none() && call == Call::Acquire {
            assert!(first, "task 0 held the lock");
        }
        let held: Vec<usize> = world.held().iter().map(|&(who, _)| who).collect();
        for who in 0..tasks {
            let times = held.iter().filter(|&&w| w == who).count();
            assert!(times <= 1, "task {who} held it {times} times");
            assert!(times == 1 || who == 0 && !first, "task {who} never held it");
        }
        settled(&world, &queue);
    });
}

#[test]
fn two_tasks_take_turns() {
    contend(2, true, Call::Acquire, None);
    contend(2, false, Call::Acquire, None);
}

#[test]
fn three_tasks_take_turns() {
    contend(3, true, Call::Acquire, None);
    contend(3, false, Call::Acquire, None);
}

#[test]
fn a_cancelled_task_leaves_no_waiter_behind_two_tasks() {
    for polls in 1..=3 {
        contend(2, true, Call::Acquire, Some(polls));
        contend(2, false, Call::Acquire, Some(polls));
    }
}

#[test]
fn a_cancelled_task_leaves_no_waiter_behind_three_tasks() {
    for polls in 1..=3 {
        contend(3, true, Call::Acquire, Some(polls));
        contend(3, false, Call::Acquire, Some(polls));
    }
}

#[test]
fn try_acquire_among_waiters_two_tasks() {
    for cancel in [None, Some(1), Some(2)] {
        contend(2, true, Call::TryAcquire, cancel);
        contend(2, false, Call::TryAcquire, cancel);
    }
}

#[test]
fn try_acquire_among_waiters_three_tasks() {
    for cancel in [None, Some(1), Some(2)] {
        contend(3, true, Call::TryAcquire, cancel);
        contend(3, false, Call::TryAcquire, cancel);
    }
}

/// Tasks that queued in the order 0, 1, … hold the lock in that order:
/// they join from the model's main thread, one after another, then wait
/// and work on threads of their own (task 0, the head, on the main one).
fn in_order(tasks: usize, handoff: bool) {
    let what = format!("{tasks} tasks queued in order, handoff {handoff}");
    check(&what, tasks, move || {
        let world = Arc::new(World::default());
        let queue = queue();
        let Join::Head(head) = queue.join(Waker::noop(), true) else {
            panic!("the queue was idle");
        };
        let others: Vec<_> = (1..tasks)
            .map(|who| {
                let Join::Queued(mut ticket) = queue.join(Waker::noop(), true) else {
                    panic!("the turn was taken");
                };
                let (world, queue) = (Arc::clone(&world), Arc::clone(&queue));
                thread::spawn(move || {
                    let number = ticket.ticket;
                    let guard = loom::future::block_on(async {
                        let turn = wait_turn(&mut ticket).await;
                        take_turn(world, queue, who, Some(number), turn, None, handoff).await
                    });
                    guard.work();
                })
            })
            .collect();
        let fresh = Turn::Fresh { courtesy: false };
        let first = take_turn(
            Arc::clone(&world),
            Arc::clone(&queue),
            0,
            None,
            fresh,
            Some(head),
            handoff,
        );
        loom::future::block_on(first).work();
        for other in others {
            other.join().unwrap();
        }
        let order: Vec<usize> = world.held().iter().map(|&(who, _)| who).collect();
        assert_eq!(order, (0..tasks).collect::<Vec<_>>(), "held in queue order");
        settled(&world, &queue);
    });
}

#[test]
fn two_tasks_hold_in_queue_order() {
    in_order(2, true);
    in_order(2, false);
}

#[test]
fn three_tasks_hold_in_queue_order() {
    in_order(3, true);
    in_order(3, false);
}
