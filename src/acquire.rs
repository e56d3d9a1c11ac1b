//! The future behind [`Locker::acquire`](crate::Locker::acquire) and
//! [`Locker::acquire_timeout`](crate::Locker::acquire_timeout).
//!
//! Written by hand rather than as an `async fn` because of what a *queued*
//! call costs: with ten thousand tasks waiting on one name, each waits in
//! this future, and the Tokio task around it is sized for its largest
//! state. An `async fn` keeps room for every local of every state (and a
//! second copy of its arguments); here the waiting states hold only what
//! they need (80 bytes in all), and the work of the head of the queue (the
//! disk, a fencing token from disk) runs in one boxed `async fn` that only
//! the task holding the turn allocates. A lock handed over by the previous
//! local holder, the hot path, is turned into a guard right here in
//! `poll`, with no future to box.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use std::time::Instant;
use tracing::Span;

use crate::backend::Mode;
use crate::engine::{Engine, far_future};
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::lease::Hold;
use crate::name::LockName;
use crate::queue::{Head, Join, Queue, Ticket, Turn};
use crate::timer::{self, Sleep, Stamp};

/// An acquisition in progress.
pub(crate) struct Acquire<'a> {
    engine: &'a Engine,
    /// What kind of holding is asked for.
    mode: Mode,
    /// The acquisition's span; boxed, and only when it is enabled, so that
    /// with tracing off it costs a null pointer.
    span: Option<Box<Span>>,
    stage: Stage<'a>,
}

enum Stage<'a> {
    /// Not polled yet.
    Start {
        name: LockName,
        /// The name's queue in this `Locker`.
        queue: Arc<Queue<Hold>>,
        timeout: Option<Duration>,
    },
    /// The name was not valid.
    Invalid(Box<Error>),
    /// Queued behind another task of this `Locker`.
    Queued {
        ticket: Ticket<Hold>,
        name: LockName,
        started: Stamp,
        /// The deadline's timer, when there is a deadline.
        deadline: Option<Box<Sleep>>,
    },
    /// Holding the turn: taking the lock.
    Head(Pin<Box<dyn Future<Output = Result<LockGuard>> + Send + Sync + 'a>>),
    Done,
}

impl<'a> Acquire<'a> {
    pub(crate) fn new(
        engine: &'a Engine,
        op: &'static str,
        name: &str,
        timeout: Option<Duration>,
        mode: Mode,
    ) -> Self {
        let span = engine.span(op, name);
        let span = (!span.is_none()).then(|| Box::new(span));
        // The name and its queue in one lookup.
        let stage = match engine.names.get_with(name, |name| engine.queues.get(name)) {
            Ok((name, queue)) => Stage::Start { name, queue, timeout },
            Err(e) => Stage::Invalid(Box::new(e.into())),
        };
        Self {
            engine,
            mode,
            span,
            stage,
        }
    }

    /// The boxed work of the turn's holder.
    fn head(
        &self,
        name: LockName,
        queue: Arc<Queue<Hold>>,
        turn: Turn<Hold>,
        head: Option<Head<Hold>>,
        deadline: Option<Instant>,
        started: Stamp,
    ) -> Stage<'a> {
        let (engine, mode) = (self.engine, self.mode);
        Stage::Head(Box::pin(async move {
            engine
                .take_turn(&name, mode, queue, turn, head, deadline, started)
                .await
        }))
    }
}

impl Future for Acquire<'_> {
    type Output = Result<LockGuard>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let _entered = this.span.as_deref().map(Span::enter);
        loop {
            match &mut this.stage {
                Stage::Start { .. } => {
                    let Stage::Start { name, queue, timeout } =
                        std::mem::replace(&mut this.stage, Stage::Done)
                    else {
                        unreachable!("matched above");
                    };
                    let engine = this.engine;
                    // Attempts run on Tokio's blocking pool: say so rather
                    // than fail later. (Waiting needs no time driver:
                    // leasehold sleeps on its own timer.)
                    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                        return Poll::Ready(Err(Error::Unsupported {
                            what: "leasehold's async methods must run inside a Tokio runtime",
                        }));
                    };
                    if let Err(error) = engine.keeper.roll.check(name.as_str()) {
                        return Poll::Ready(Err(error));
                    }
                    if let Some(guard) = engine.reenter(&name, this.mode) {
                        return Poll::Ready(guard);
                    }
                    let started = timer::stamp_in(&runtime);
                    drop(runtime);
                    let deadline = timeout
                        .map(|timeout| started.instant().checked_add(timeout).unwrap_or_else(far_future));
                    // The queue's copy of the name, so that queued tasks
                    // share one (most often it is that copy already).
                    let name = if !name.is_same(&queue.name) && queue.name == name {
                        queue.name.clone()
                    } else {
                        name
                    };
                    this.stage = match queue.join(cx.waker(), this.mode == Mode::Exclusive) {
                        Join::Head(head) => {
                            let fresh = Turn::Fresh { courtesy: false };
                            this.head(name, queue, fresh, Some(head), deadline, started)
                        }
                        Join::Queued(ticket) => Stage::Queued {
                            ticket,
                            name,
                            started,
                            deadline: deadline.map(|at| Box::new(timer::sleep_until(at))),
                        },
                    };
                }
                // `release_all` wakes every queued task: it leaves the
                // queue (passing on a turn granted meanwhile) and fails.
                Stage::Queued { name, .. } if this.engine.keeper.roll.is_closed() => {
                    let error = Error::ShutDown {
                        name: name.as_str().to_owned(),
                    };
                    this.stage = Stage::Done;
                    return Poll::Ready(Err(error));
                }
                Stage::Queued {
                    ticket,
                    name,
                    started,
                    deadline,
                } => match ticket.poll_turn(cx) {
                    Poll::Ready((turn, queue)) => {
                        // Out of the stage rather than cloned: the ticket
                        // is spent (dropping it does nothing).
                        let Stage::Queued {
                            name,
                            started,
                            deadline,
                            ..
                        } = std::mem::replace(&mut this.stage, Stage::Done)
                        else {
                            unreachable!("matched above");
                        };
                        let deadline = deadline.as_ref().map(|sleep| sleep.deadline());
                        this.stage = match turn {
                            // The lock itself, handed over: no future to
                            // box unless its token must come from disk.
                            Turn::Handoff(hold) if this.mode == Mode::Exclusive && !hold.is_lost() => {
                                match this.engine.take_handoff(name, hold, queue, deadline, started) {
                                    Ok(out) => {
                                        this.stage = Stage::Done;
                                        return Poll::Ready(out);
                                    }
                                    Err(fetch) => Stage::Head(fetch),
                                }
                            }
                            turn => this.head(name, queue, turn, None, deadline, started),
                        };
                    }
                    Poll::Pending => {
                        if let Some(sleep) = deadline
                            && Pin::new(&mut **sleep).poll(cx).is_ready()
                        {
                            let error = this.engine.timed_out(name, *started, ticket.last_seen());
                            // Leaves the queue, or passes on a turn granted
                            // meanwhile.
                            this.stage = Stage::Done;
                            return Poll::Ready(Err(error));
                        }
                        return Poll::Pending;
                    }
                },
                Stage::Head(work) => {
                    let Poll::Ready(out) = work.as_mut().poll(cx) else {
                        return Poll::Pending;
                    };
                    this.stage = Stage::Done;
                    return Poll::Ready(out);
                }
                Stage::Invalid(_) => {
                    let Stage::Invalid(error) = std::mem::replace(&mut this.stage, Stage::Done) else {
                        unreachable!("matched above");
                    };
                    return Poll::Ready(Err(*error));
                }
                Stage::Done => panic!("`acquire` future polled after it completed"),
            }
        }
    }
}

impl Drop for Acquire<'_> {
    fn drop(&mut self) {
        // Dropping a queued or working acquisition passes its turn on and
        // may release a lock: let that be logged in the acquisition's span.
        let _entered = self.span.as_deref().map(Span::enter);
        self.stage = Stage::Done;
    }
}
