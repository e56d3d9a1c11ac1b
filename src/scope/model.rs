//! Model checks of the scope sets under `loom`: every interleaving (up to a
//! bound on preemptions for three threads) of scopes remembering and
//! finding holds while other threads take, re-enter and drop them.
//!
//! The code under test is the sets' own (`ScopeSet::enter`, `find`,
//! `remember`, the clock); only the task-local that carries a set through
//! a task is left out, since loom cannot run Tokio. Each flow of the model
//! (a task, or a branch of a `join!` in a scope of its own) is a loom
//! thread holding its set explicitly; a set entered before a thread is
//! spawned is a scope entered before its branch started. The holds are a
//! stand-in for `Grant`: a lock taken in an in-memory store, released when
//! the last guard (`Arc`) on it goes. A flow acquires as the engine does:
//! a re-entrant guard on the hold its set finds, else the lock from the
//! store (waiting for it), remembered in its set. Run with
//!
//! ```text
//! RUSTFLAGS="--cfg leasehold_loom" cargo test --release --lib scope::model -- --nocapture
//! ```

use std::sync::{Arc, Weak};

use loom::sync::{Condvar, Mutex};
use loom::thread;

use super::ScopeSet;
use crate::sync::check;

/// The locker id of every hold in the model: one `Locker`.
const ID: u64 = 1;

/// A lock in the in-memory store: free, or held by one hold.
#[derive(Debug)]
struct Lock {
    file_name: &'static str,
    held: Mutex<bool>,
    freed: Condvar,
}

impl Lock {
    fn new(file_name: &'static str) -> Arc<Self> {
        Arc::new(Lock {
            file_name,
            held: Mutex::new(false),
            freed: Condvar::new(),
        })
    }

    /// Takes the lock in the store for a hold remembered in `home`,
    /// waiting while it is held if `wait`, else `None`.
    fn take(self: &Arc<Self>, home: &Set, who: usize, late: bool, wait: bool) -> Option<Guard> {
        let mut held = self.held.lock().unwrap();
        while *held {
            if !wait {
                return None;
            }
            held = self.freed.wait(held).unwrap();
        }
        *held = true;
        let hold = Hold {
            lock: Arc::clone(self),
            home: Arc::downgrade(home),
            who,
            late,
        };
        Some(Guard(Some(Arc::new(hold))))
    }

    fn is_held(&self) -> bool {
        *self.held.lock().unwrap()
    }
}

/// The stand-in for `Grant`: the lock held in the store until the last
/// guard on it is dropped.
#[derive(Debug)]
struct Hold {
    lock: Arc<Lock>,
    /// The set it is remembered in.
    home: Weak<ScopeSet<Hold>>,
    /// The flow that took it from the store.
    who: usize,
    /// Whether it was taken after the scopes nested in its home were
    /// entered, which must never see it.
    late: bool,
}

impl Drop for Hold {
    fn drop(&mut self) {
        *self.lock.held.lock().unwrap() = false;
        self.lock.freed.notify_all();
    }
}

/// A guard on a hold.
///
/// loom sees only its own types, not the counts of std's `Arc`, which the
/// sets read (`Weak::upgrade`, `strong_count`) only under the lock of the
/// set that remembers the hold. So a guard is dropped under that lock:
/// loom then runs the last drop before and after each read of the count,
/// as the real drop (one atomic decrement) can fall on either side of
/// each. Without it, loom would take a drop on one thread and a read on
/// another for independent steps, and run them in one order only.
#[derive(Debug)]
struct Guard(Option<Arc<Hold>>);

impl Guard {
    fn hold(&self) -> &Hold {
        self.0.as_deref().expect("a guard has its hold until dropped")
    }

    fn same(&self, other: &Guard) -> bool {
        std::ptr::eq(self.hold(), other.hold())
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let hold = self.0.take();
        let home = hold.as_ref().and_then(|hold| hold.home.upgrade());
        let _reads = home.as_ref().map(|set| set.map.lock().unwrap());
        drop(hold);
    }
}

type Set = Arc<ScopeSet<Hold>>;

/// A re-entrant guard on the hold of `lock` that `set` finds.
fn find(set: &Set, lock: &Lock) -> Option<Guard> {
    set.find(ID, lock.file_name).map(|hold| Guard(Some(hold)))
}

/// `acquire` of `lock` by flow `who` in `set`, as the engine does it: a
/// guard on the hold the set finds, else a new hold from the store,
/// remembered in the set. `try_acquire` if not `wait`.
fn acquire_or_try(set: &Set, lock: &Arc<Lock>, who: usize, late: bool, wait: bool) -> Option<Guard> {
    if let Some(guard) = find(set, lock) {
        return Some(guard);
    }
    let guard = lock.take(set, who, late, wait)?;
    if let Some(hold) = &guard.0 {
        set.remember(ID, lock.file_name, hold);
    }
    Some(guard)
}

fn acquire(set: &Set, lock: &Arc<Lock>, who: usize, late: bool) -> Guard {
    acquire_or_try(set, lock, who, late, true).expect("acquire waits for the lock")
}

/// What `set` finds of `lock`, by who took it (and whether late).
fn seen(set: &Set, lock: &Lock) -> Option<(usize, bool)> {
    find(set, lock).map(|guard| (guard.hold().who, guard.hold().late))
}

/// The number of entries in `set`, lapsed ones included.
fn entries(set: &Set) -> usize {
    set.map.lock().unwrap().len()
}

const PARENT: usize = 0;

/// A parent scope and a child scope entered in it, on a thread of its own
/// (a branch of a `join!` in a scope of its own). The child re-enters what
/// the parent held before it started, if it is still held, and takes for
/// itself what the parent took after; the parent never sees the child's
/// holds, not even one the child hands back to it.
#[test]
fn a_child_sees_only_what_its_parent_held_before_it_started() {
    check("2 threads: a parent scope and a child scope", 2, || {
        const CHILD: usize = 1;
        let (a, b, c) = (Lock::new("a"), Lock::new("b"), Lock::new("c"));
        let parent = ScopeSet::enter(None);
        let early = acquire(&parent, &a, PARENT, false);
        let child = ScopeSet::enter(Some(Arc::clone(&parent)));
        let branch = {
            let (a, b, c) = (Arc::clone(&a), Arc::clone(&b), Arc::clone(&c));
            thread::spawn(move || {
                let shared = acquire(&child, &a, CHILD, false);
                let (who, late) = (shared.hold().who, shared.hold().late);
                assert!(
                    who == CHILD || !late,
                    "the child re-entered what its parent took after it started"
                );
                let own = acquire(&child, &b, CHILD, false);
                assert_eq!(
                    own.hold().who,
                    CHILD,
                    "the child re-entered its parent's later hold"
                );
                let again = acquire(&child, &b, CHILD, false);
                assert!(own.same(&again), "the child did not re-enter its own hold");
                // A scope nested in the child sees both: they were held
                // when it started.
                let grandchild = ScopeSet::enter(Some(Arc::clone(&child)));
                assert_eq!(seen(&grandchild, &a), Some((who, late)));
                assert_eq!(seen(&grandchild, &b), Some((CHILD, false)));
                drop((shared, own, again));
                assert_eq!(seen(&child, &b), None, "a released hold was re-entered");
                // A hold the child returns out of its scope.
                acquire(&child, &c, CHILD, false)
            })
        };
        // The parent, concurrently: drops what it held before the child
        // started, and takes all three names.
        drop(early);
        for lock in [&a, &b] {
            let guard = acquire(&parent, lock, PARENT, true);
            assert_eq!(guard.hold().who, PARENT, "the parent re-entered its child's hold");
        }
        let kept = branch.join().unwrap();
        assert!(c.is_held());
        assert_eq!(seen(&parent, &c), None, "the parent saw its child's hold");
        assert!(
            acquire_or_try(&parent, &c, PARENT, true, false).is_none(),
            "the parent took a lock its child's hold has"
        );
        drop(kept);
        for lock in [&a, &b, &c] {
            assert!(!lock.is_held(), "{} left held", lock.file_name);
            assert_eq!(seen(&parent, lock), None);
        }
    });
}

/// Sibling scopes entered in one parent (the branches of a `join!`, each
/// in a scope of its own) on threads of their own, both taking one name:
/// neither re-enters the other's hold, nor the one the parent takes after
/// they started (with `parent_takes` set: a third thread); both share what
/// the parent held before, as documented.
fn siblings(parent_takes: bool) {
    let threads = if parent_takes { 3 } else { 2 };
    let mut what = format!("{threads} threads: two sibling scopes");
    if parent_takes {
        what.push_str(", the parent taking after they started");
    }
    check(&what, threads, move || {
        let (a, b) = (Lock::new("a"), Lock::new("b"));
        let parent = ScopeSet::enter(None);
        let early = acquire(&parent, &a, PARENT, false);
        let sibling = |who: usize| {
            let set = ScopeSet::enter(Some(Arc::clone(&parent)));
            let (a, b) = (Arc::clone(&a), Arc::clone(&b));
            move || {
                let shared = acquire(&set, &a, who, false);
                assert_eq!((shared.hold().who, shared.hold().late), (PARENT, false));
                let own = acquire(&set, &b, who, false);
                assert_eq!(
                    own.hold().who,
                    who,
                    "sibling {who} re-entered another flow's hold"
                );
                drop(own);
                assert_eq!(seen(&set, &b), None, "a released hold was re-entered");
            }
        };
        let (first, second) = (sibling(1), sibling(2));
        let second = thread::spawn(second);
        if parent_takes {
            let first = thread::spawn(first);
            let late = acquire(&parent, &b, PARENT, true);
            assert_eq!(late.hold().who, PARENT, "the parent re-entered its child's hold");
            drop(late);
            first.join().unwrap();
        } else {
            first();
        }
        second.join().unwrap();
        assert_eq!(seen(&parent, &b), None);
        drop(early);
        assert!(!a.is_held() && !b.is_held());
    });
}

#[test]
fn sibling_scopes_never_share_a_hold_two_threads() {
    siblings(false);
}

#[test]
fn sibling_scopes_never_share_a_hold_three_threads() {
    siblings(true);
}

/// Guards on one hold moved out of its scope and dropped on other threads
/// (`guards` of them, each on a thread of its own), while the scope
/// acquires the name again: it re-enters the hold while it lives, else
/// takes a new one; once the hold is gone, it is never found again, and
/// its entry lapses (`remember` drops it).
fn dropped_elsewhere(guards: usize) {
    let threads = guards + 1;
    let what = match guards {
        1 => "2 threads: a guard dropped on another thread".to_owned(),
        _ => format!("{threads} threads: {guards} guards on one hold dropped on {guards} others"),
    };
    check(&what, threads, move || {
        let (a, b) = (Lock::new("a"), Lock::new("b"));
        let set = ScopeSet::enter(Some(ScopeSet::enter(None)));
        let moved: Vec<Guard> = (0..guards).map(|_| acquire(&set, &a, PARENT, false)).collect();
        assert!(moved.iter().all(|guard| guard.same(&moved[0])));
        let elsewhere: Vec<_> = moved
            .into_iter()
            .map(|guard| thread::spawn(move || drop(guard)))
            .collect();
        let again = acquire(&set, &a, PARENT, true);
        assert_eq!(again.hold().who, PARENT);
        drop(again);
        for thread in elsewhere {
            thread.join().unwrap();
        }
        assert!(!a.is_held());
        assert_eq!(seen(&set, &a), None, "a dropped hold was re-entered");
        let fresh = acquire(&set, &b, PARENT, false);
        assert_eq!(entries(&set), 1, "a lapsed entry was kept");
        drop(fresh);
    });
}

#[test]
fn a_hold_dropped_on_another_thread_lapses() {
    dropped_elsewhere(1);
}

#[test]
fn a_hold_dropped_on_two_other_threads_lapses() {
    dropped_elsewhere(2);
}

/// Three threads: one scope remembering and finding while two guards of
/// its holds are dropped on other threads, one of which also reads the set
/// from a scope nested in it. Nothing panics or deadlocks (loom fails a
/// run in which every thread waits), and nothing is found that was
/// released.
#[test]
fn remembering_and_finding_while_holds_are_dropped() {
    check("3 threads: remember and find while holds are dropped", 3, || {
        const NESTED: usize = 2;
        let (a, b, c) = (Lock::new("a"), Lock::new("b"), Lock::new("c"));
        let set = ScopeSet::enter(None);
        let held_a = acquire(&set, &a, PARENT, false);
        let held_b = acquire(&set, &b, PARENT, false);
        let nested = ScopeSet::enter(Some(Arc::clone(&set)));
        let dropper = thread::spawn(move || drop(held_a));
        let reader = {
            let (b, c) = (Arc::clone(&b), Arc::clone(&c));
            thread::spawn(move || {
                let shared = acquire(&nested, &b, NESTED, false);
                assert_eq!(shared.hold().who, PARENT);
                drop((held_b, shared));
                let own = acquire(&nested, &c, NESTED, false);
                assert_eq!(own.hold().who, NESTED, "a nested scope re-entered a later hold");
            })
        };
        let late = acquire(&set, &c, PARENT, true);
        assert_eq!(
            late.hold().who,
            PARENT,
            "a scope re-entered a nested scope's hold"
        );
        drop(late);
        drop(acquire(&set, &a, PARENT, true));
        dropper.join().unwrap();
        reader.join().unwrap();
        for lock in [&a, &b, &c] {
            assert!(!lock.is_held(), "{} left held", lock.file_name);
            assert_eq!(
                seen(&set, lock),
                None,
                "{} re-entered after release",
                lock.file_name
            );
        }
    });
}

/// The clock's ordering argument (`tick`): one task's scopes take their
/// ticks in its program order, even when the runtime moves the task
/// between worker threads, because the runtime hands a task over with a
/// happens-before (here a lock on the task's slot) and increments of one
/// atomic follow happens-before whatever their ordering. The task enters
/// a child scope on one thread and its unscoped branch takes a name on
/// another: the child never sees it; a scope entered after that does.
#[test]
fn ticks_follow_a_task_across_threads() {
    check("2 threads: a task moving between them", 2, || {
        let (a, b) = (Lock::new("a"), Lock::new("b"));
        let parent = ScopeSet::enter(None);
        let early = acquire(&parent, &a, PARENT, false);
        let child = ScopeSet::enter(Some(Arc::clone(&parent)));
        // The task's slot in the run queue: the step it is at.
        let slot = Arc::new(Mutex::new(0));
        let worker = {
            let (slot, parent, b) = (Arc::clone(&slot), Arc::clone(&parent), Arc::clone(&b));
            thread::spawn(move || {
                while *slot.lock().unwrap() != 1 {
                    thread::yield_now();
                }
                let late = acquire(&parent, &b, PARENT, true);
                let after = ScopeSet::enter(Some(Arc::clone(&parent)));
                assert_eq!(seen(&after, &b), Some((PARENT, true)));
                *slot.lock().unwrap() = 2;
                late
            })
        };
        *slot.lock().unwrap() = 1;
        while *slot.lock().unwrap() != 2 {
            thread::yield_now();
        }
        assert_eq!(seen(&child, &a), Some((PARENT, false)));
        assert_eq!(
            seen(&child, &b),
            None,
            "the child saw what its parent took after it started"
        );
        drop(worker.join().unwrap());
        drop(early);
    });
}
