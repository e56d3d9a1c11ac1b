//! Task-local re-entrancy.
//!
//! Inside [`Locker::scope`](crate::Locker::scope), the locks the scope's
//! task acquires are remembered in a task-local set, and acquiring one of
//! them again returns another guard on the same hold instead of waiting.
//! Tasks spawned from the scope do not inherit it: they run concurrently
//! with it, and re-entering there would let two tasks into one critical
//! section.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};

use crate::guard::Share;

tokio::task_local! {
    static HELD: Held;
}

/// The locks held in one scope: `(locker id, lock file name)` to the hold.
/// Entries are `Weak`, so the set never keeps a lock alive; a guard moved
/// to another task and dropped there lets its entry lapse on its own.
#[derive(Debug, Default)]
struct Held {
    map: Mutex<HashMap<(u64, String), Weak<Share>>>,
}

/// Runs `fut` in a scope; nested scopes share the outermost one's set.
pub(crate) async fn run<F: Future>(fut: F) -> F::Output {
    if HELD.try_with(|_| ()).is_ok() {
        fut.await
    } else {
        HELD.scope(Held::default(), fut).await
    }
}

/// The live hold of `file_name` by locker `id` in the current scope.
pub(crate) fn find(id: u64, file_name: &str) -> Option<Arc<Share>> {
    HELD.try_with(|held| {
        let map = held.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&(id, file_name.to_owned())).and_then(Weak::upgrade)
    })
    .ok()
    .flatten()
}

/// Remembers a new hold in the current scope, if there is one.
pub(crate) fn remember(id: u64, file_name: &str, share: &Arc<Share>) {
    let _ = HELD.try_with(|held| {
        let mut map = held.map.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, share| share.strong_count() > 0);
        map.insert((id, file_name.to_owned()), Arc::downgrade(share));
    });
}
