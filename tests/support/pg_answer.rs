//! The failpoints that hold both sides of an announcement's answer
//! (PostgreSQL, feature `failpoints`): the session's answer delayed, and
//! the caller whose wait just ran out held before it lets go. Shared by
//! `tests/pg_late_answer.rs` and `tests/pg_answer_attack.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Delays the session's first answer to an announcement by `answer_after`
/// (the session is quick again after), and holds every caller whose wait
/// ran out `caller_held`; the number of announcements answered.
pub fn hold_both_sides(answer_after: Duration, caller_held: Duration) -> Arc<AtomicUsize> {
    let answers = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&answers);
    fail::cfg_callback("postgres.announce.before_reply", move || {
        if counted.fetch_add(1, Ordering::SeqCst) == 0 {
            std::thread::sleep(answer_after);
        }
    })
    .unwrap();
    fail::cfg_callback("postgres.call.gave_up", move || std::thread::sleep(caller_held)).unwrap();
    answers
}

/// Takes both holds away.
pub fn let_both_sides_go() {
    fail::remove("postgres.announce.before_reply");
    fail::remove("postgres.call.gave_up");
}
