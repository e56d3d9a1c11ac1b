//! Task-local re-entrancy.
//!
//! Each [`Locker::scope`](crate::Locker::scope) call runs its future with a
//! set of its own, linked to the set of the scope it was entered in. The
//! locks acquired inside a scope are remembered in its set only; acquiring
//! a name again returns another guard on the same hold when the current set
//! has it, or when an enclosing set had it already when the scope below it
//! started. So a function called by a holder re-enters its caller's locks,
//! while sibling scopes (the branches of a `join!`, each in a scope of its
//! own) never see each other's, and neither does their parent. Tasks
//! spawned from a scope do not inherit it at all (Tokio's task-locals are
//! not inherited): they run concurrently with it, and re-entering there
//! would let two tasks into one critical section.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use crate::guard::Grant;
use crate::sync::{AtomicU64, Mutex};

tokio::task_local! {
    static SCOPE: Arc<ScopeSet>;
}

/// Orders scope entries and remembered holds, across all scopes, so that
/// a scope can tell what its parent held before it started from what the
/// parent (a concurrent, unscoped branch of it) took afterwards.
#[cfg(not(all(test, leasehold_loom)))]
static CLOCK: AtomicU64 = AtomicU64::new(0);
// loom's atomics are not `const`-constructible, and a model's statics
// start afresh in each interleaving.
#[cfg(all(test, leasehold_loom))]
loom::lazy_static! {
    static ref CLOCK: AtomicU64 = AtomicU64::new(0);
}

/// The locks held in one scope: `(locker id, lock file name)` to the hold
/// and the tick it was remembered at. Entries are `Weak`, so a set never
/// keeps a lock alive; a guard moved to another task, or out of its scope,
/// and dropped there lets its entry lapse on its own, and a lapsed entry is
/// never re-entered.
///
/// The holds are `Grant`s; the model checks (`scope/model.rs`) put a
/// stand-in of their own in.
#[derive(Debug)]
struct ScopeSet<G = Grant> {
    map: Mutex<HashMap<(u64, String), Entry<G>>>,
    /// The set of the scope this one was entered in.
    parent: Option<Arc<ScopeSet<G>>>,
    /// The tick this scope started at: of the parent's entries, only those
    /// remembered before it are visible here.
    started: u64,
}

/// One remembered hold.
#[derive(Debug)]
struct Entry<G> {
    grant: Weak<G>,
    /// The tick it was remembered at.
    at: u64,
}

fn tick() -> u64 {
    // A scope and the scopes nested in it belong to one task, which takes
    // every tick they compare in program order: no ordering is needed
    // beyond the counter's own. That holds when the runtime moves the task
    // between threads too: it hands a task over with a happens-before,
    // which increments of one atomic follow whatever their ordering
    // (`scope/model.rs`, `ticks_follow_a_task_across_threads`).
    CLOCK.fetch_add(1, Ordering::Relaxed)
}

/// Runs `fut` in a new scope, nested in the current one if there is one.
pub(crate) async fn run<F: Future>(fut: F) -> F::Output {
    let held = ScopeSet::enter(SCOPE.try_with(Arc::clone).ok());
    SCOPE.scope(held, fut).await
}

/// The live hold of `file_name` by locker `id` visible in the current
/// scope: its own, or one an enclosing scope held when the scope below it
/// started.
pub(crate) fn find(id: u64, file_name: &str) -> Option<Arc<Grant>> {
    SCOPE.try_with(|held| held.find(id, file_name)).ok().flatten()
}

/// Remembers a new hold in the current scope (not in the ones enclosing
/// it), if there is one.
pub(crate) fn remember(id: u64, file_name: &str, grant: &Arc<Grant>) {
    let _ = SCOPE.try_with(|held| held.remember(id, file_name, grant));
}

impl<G> ScopeSet<G> {
    /// A new scope's set, nested in `parent`'s if there is one.
    fn enter(parent: Option<Arc<Self>>) -> Arc<Self> {
        Arc::new(ScopeSet {
            map: Mutex::default(),
            parent,
            started: tick(),
        })
    }

    /// The live hold of `file_name` by locker `id` visible in this set:
    /// its own, or one an enclosing set held when the set below it was
    /// entered.
    fn find(&self, id: u64, file_name: &str) -> Option<Arc<G>> {
        let key = (id, file_name.to_owned());
        let mut set = self;
        let mut before = u64::MAX;
        loop {
            let found = {
                let map = set.map.lock().unwrap_or_else(|e| e.into_inner());
                map.get(&key)
                    .filter(|entry| entry.at < before)
                    .and_then(|entry| entry.grant.upgrade())
            };
            if found.is_some() {
                return found;
            }
            before = set.started;
            set = set.parent.as_deref()?;
        }
    }

    /// Remembers a new hold in this set (not in the ones enclosing it).
    fn remember(&self, id: u64, file_name: &str, grant: &Arc<G>) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, entry| entry.grant.strong_count() > 0);
        let entry = Entry {
            grant: Arc::downgrade(grant),
            at: tick(),
        };
        map.insert((id, file_name.to_owned()), entry);
    }
}

#[cfg(all(test, leasehold_loom))]
mod model;
