//! Releases that could not finish at once, finished on a thread of
//! leasehold's own.
//!
//! A guard's `Drop` never waits for anything another process holds: when
//! the name's mutation lock is taken (another process is changing that
//! name, or is frozen while it does), the release is handed here, with
//! the lock's descriptors (and so its `flock`) still open, and this thread
//! tries again every few milliseconds until it is done. The lock thus goes
//! as soon as it can, and the caller's thread, a Tokio worker or the
//! runtime's only thread, is never held up.

use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

/// A release to finish: `true` once done (or given up for good).
pub(crate) trait Retry: Send {
    fn retry(&mut self) -> bool;
}

/// How long one try may wait for a name's mutation lock: this thread is
/// leasehold's own, so it may wait, and a try that only looks would lose
/// to every taker of a busy name.
pub(crate) const PATIENCE: Duration = Duration::from_millis(20);

/// How long a release outside the release thread (a guard's `Drop`) waits
/// for a name's mutation lock before handing the release over: long
/// enough for a running process to finish its change (a few syscalls),
/// so that a process that drops its guard and exits at once does not
/// leave its lock behind for others to judge; short enough that a frozen
/// holder of it costs the caller's thread no more.
pub(crate) const DROP_PATIENCE: Duration = Duration::from_millis(1);

/// The longest pause between two tries.
const MOST: Duration = Duration::from_millis(50);

#[derive(Default)]
struct Later {
    jobs: Mutex<Vec<Box<dyn Retry>>>,
    added: Condvar,
}

fn later() -> &'static Later {
    static LATER: OnceLock<Later> = OnceLock::new();
    LATER.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("leasehold-release".into())
            .spawn(run);
        if let Err(error) = spawned {
            tracing::warn!(%error, "could not start the release thread; deferred releases wait for the next one");
        }
        Later::default()
    })
}

/// Whether a try of a release is over: `Ok(None)` (the mutation lock was
/// taken) means try again; an error is logged, and the lock left to be
/// judged stale once its descriptors close.
pub(crate) fn done<T>(tried: crate::error::Result<Option<T>>, lock: &str) -> bool {
    match tried {
        Ok(None) => false,
        Ok(Some(_)) => true,
        Err(error) => {
            tracing::warn!(lock, %error, "releasing a lock failed; it stays until it is judged stale");
            true
        }
    }
}

/// Finishes `job` on the release thread.
pub(crate) fn defer(job: Box<dyn Retry>) {
    let later = later();
    later.jobs.lock().unwrap_or_else(|e| e.into_inner()).push(job);
    later.added.notify_one();
}

/// How many releases wait to be finished (for tests).
#[cfg(test)]
pub(crate) fn pending() -> usize {
    later().jobs.lock().unwrap_or_else(|e| e.into_inner()).len()
}

fn run() {
    let later = later();
    let mut pause = Duration::from_millis(1);
    loop {
        let mut jobs = {
            let mut jobs = later.jobs.lock().unwrap_or_else(|e| e.into_inner());
            while jobs.is_empty() {
                pause = Duration::from_millis(1);
                jobs = later.added.wait(jobs).unwrap_or_else(|e| e.into_inner());
            }
            std::mem::take(&mut *jobs)
        };
        // Tried without the list's lock: a job may take a few syscalls,
        // and `defer` must never wait on them.
        // A job that panics is dropped (its descriptors closed: the lock
        // is then judged stale at once), never the thread.
        jobs.retain_mut(|job| {
            let retried = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.retry()));
            !retried.unwrap_or(true)
        });
        let mut list = later.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let added = !list.is_empty();
        list.append(&mut jobs);
        if list.is_empty() {
            continue;
        }
        if added {
            pause = Duration::from_millis(1);
        }
        drop(
            later
                .added
                .wait_timeout(list, pause)
                .unwrap_or_else(|e| e.into_inner()),
        );
        pause = (pause * 2).min(MOST);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    struct Tries(Arc<AtomicUsize>, usize);

    impl Retry for Tries {
        fn retry(&mut self) -> bool {
            let tried = self.0.fetch_add(1, Ordering::SeqCst) + 1;
            if tried == 1 && self.1 == usize::MAX {
                panic!("a job that panics");
            }
            tried >= self.1
        }
    }

    fn settled(what: &AtomicUsize, until: usize) -> bool {
        let started = Instant::now();
        while what.load(Ordering::SeqCst) < until && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        what.load(Ordering::SeqCst) >= until
    }

    #[test]
    fn a_job_is_tried_until_done_and_a_panicking_one_costs_no_other() {
        let (panicky, patient) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        defer(Box::new(Tries(Arc::clone(&panicky), usize::MAX)));
        defer(Box::new(Tries(Arc::clone(&patient), 3)));
        assert!(
            settled(&patient, 3),
            "tried {} times",
            patient.load(Ordering::SeqCst)
        );
        // Dropped after its panic, never tried again.
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(panicky.load(Ordering::SeqCst), 1);
        assert_eq!(patient.load(Ordering::SeqCst), 3, "not tried once done");
        let started = Instant::now();
        while pending() > 0 && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(pending(), 0);
    }
}
