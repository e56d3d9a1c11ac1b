//! What one `Locker` remembers of its place in the line of one name.

use std::collections::HashMap;
use std::fs::File;

use super::IDLE;
use super::bytes::{Span, duration_us};
use crate::sys;

/// What a waiter standing back saw at the lock path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    Free,
    Held((u64, u64)),
}

#[derive(Debug, Default)]
pub(super) struct Place {
    /// The offset of the byte this `Locker` holds while it waits: its
    /// ticket, in the name's region.
    pub(super) waiting: Option<u64>,
    /// The name's mutation-lock file, open with its byte 0 read-locked,
    /// while this `Locker` waits (`mutex::register`).
    pub(super) registered: Option<File>,
    /// The tickets that were ahead when it joined (not those passed over
    /// before), and are still there: only those can hold it up. A legit
    /// ticket below its own was taken before its own, so bytes that turn
    /// up later are none.
    pub(super) ahead: Vec<Span>,
    /// Looks at a lock that moved with none of `ahead` leaving, since one
    /// last left; and looks at a lock that moved, this wait.
    pub(super) unmoved: u32,
    pub(super) looks: u32,
    /// What was at the lock path at the last of those looks.
    pub(super) last_look: Option<Seen>,
    /// How long this acquisition has left the lock to turn marks (µs).
    pub(super) marks_us: u64,
    /// When the last wait for a mark began (boot-clock µs), and what was
    /// charged to `marks_us` for it then: the next look charges the rest
    /// of the time it really took.
    pub(super) marks_since: Option<(u64, u64)>,
    /// A holder whose turn ended keeps off the lock until then (boot-clock
    /// µs) when it cannot see who waits (see [`Lines::join`]).
    pub(super) courtesy_until: Option<u64>,
    /// Standing back for an older waiter until then (boot-clock µs).
    pub(super) standing_back_until: Option<u64>,
    /// What was at the lock path when standing back last ended.
    pub(super) seen: Option<Seen>,
    /// Whether the next attempt stands in line first, set when a turn
    /// ended with others in line: behind them, and behind whoever comes
    /// before it is back (its ticket is taken then).
    pub(super) rejoin: bool,
    /// When the current turn began (boot-clock µs), and how many
    /// acquisitions it has had.
    pub(super) turn_since: Option<u64>,
    pub(super) turn_count: u32,
    /// The turn mark this `Locker` holds, released mid-turn: the byte
    /// whose offset says until when the line should leave the lock to it.
    pub(super) turn_mark: Option<u64>,
    /// When this `Locker` last released the lock with others in line.
    pub(super) released_at: Option<u64>,
    /// Whether it came back for the lock within [`HOLD_ON`] last time:
    /// only then is a turn mark worth the line's wait.
    pub(super) comes_back: bool,
    /// The last turn mark this `Locker` stood back for, and until when
    /// (boot-clock µs): each is honoured once, until the time it gave when
    /// first seen, so that a byte someone keeps in the marks' range (or
    /// one that turns up again when the clock's units wrap) cannot keep
    /// the line off the lock.
    pub(super) honoured_mark: Option<(u64, u64)>,
}

/// Forgets the places that wait for nothing and have seen nothing for
/// [`IDLE`]: what they remember (a turn, that it should rejoin the line,
/// a turn mark long past) is over or stale, and the mark's byte is given
/// up. Forgetting one costs fairness at most.
pub(super) fn forget_idle(dir: &File, places: &mut HashMap<Box<str>, Place>, now: u64) {
    let idle = duration_us(IDLE);
    places.retain(|_, p| {
        let keep = p.waiting.is_some()
            || [p.released_at, p.turn_since]
                .into_iter()
                .flatten()
                .any(|at| now.saturating_sub(at) < idle);
        if !keep && let Some(mark) = p.turn_mark.take() {
            sys::ofd_drop_byte(dir, mark);
        }
        keep
    });
}

/// Gives up the byte a place holds in line, if any.
pub(super) fn leave(dir: &File, place: &mut Place) {
    if let Some(ticket) = place.waiting.take() {
        sys::ofd_drop_byte(dir, ticket);
    }
    // Closed: the registration goes with its descriptor.
    place.registered = None;
    place.ahead = Vec::new();
    place.last_look = None;
    place.courtesy_until = None;
    leave_standing_back(place);
}

/// Ends a place's standing back: the next one starts afresh.
pub(super) fn leave_standing_back(place: &mut Place) {
    place.standing_back_until = None;
    place.seen = None;
}

/// Forgets a place's turn (ended with nobody in line), keeping its wait.
pub(super) fn end_turn(place: &mut Place) {
    place.turn_since = None;
    place.turn_count = 0;
    place.rejoin = false;
    place.released_at = None;
    place.comes_back = false;
}
