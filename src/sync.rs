//! The locks and atomics of the in-process machinery (the per-name queue,
//! the scope sets): std's, except in the model checks (`--cfg
//! leasehold_loom`, unit tests only), where they are `loom`'s, so that
//! `loom` can run every interleaving of the tasks that take them. Normal
//! builds get std's types themselves, at no cost.

#[cfg(all(test, leasehold_loom))]
pub(crate) use loom::sync::atomic::AtomicU64;
#[cfg(all(test, leasehold_loom))]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(all(test, leasehold_loom)))]
pub(crate) use std::sync::atomic::AtomicU64;
#[cfg(not(all(test, leasehold_loom)))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// Runs a model (`f`) of `threads` threads under every interleaving `loom`
/// explores, and prints (`--nocapture` shows it) their number under `what`.
/// Two threads are checked without a bound on preemptions, so in every
/// interleaving; more with at most `LOOM_MAX_PREEMPTIONS`, or
/// [`PREEMPTIONS`] when it is unset.
#[cfg(all(test, leasehold_loom))]
pub(crate) fn check(what: &str, threads: usize, f: impl Fn() + Sync + Send + 'static) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let mut builder = loom::model::Builder::new();
    if threads <= 2 {
        builder.preemption_bound = None;
    } else if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(PREEMPTIONS);
    }
    let bound = match builder.preemption_bound {
        Some(bound) => format!("at most {bound} preemptions"),
        None => "no bound on preemptions".to_owned(),
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let started = std::time::Instant::now();
    builder.check(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        f();
    });
    let runs = runs.load(Ordering::Relaxed);
    let took = started.elapsed();
    println!("{what}: {runs} interleavings ({bound}) in {took:.1?}");
}

/// The bound on preemptions for three threads when `LOOM_MAX_PREEMPTIONS`
/// is unset: loom's own advice (2 or 3), and what keeps CI's run short.
#[cfg(all(test, leasehold_loom))]
const PREEMPTIONS: usize = 2;
