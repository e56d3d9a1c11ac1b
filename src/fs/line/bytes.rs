//! The line's byte range on the lock directory: each name's region, the
//! tickets and turn marks in it (boot-clock times), and what the kernel
//! reports of the bytes other open file descriptions hold there.

use std::collections::VecDeque;
use std::fs::File;
use std::time::Duration;

use super::AHEAD;
use crate::sys;

/// A byte-range lock that another open file description holds on the
/// directory: `[start, end)`, as the kernel reports it.
pub(super) type Span = (u64, u64);

/// Bytes per name. Its lower half holds the waiters' tickets, its upper
/// half the holders' turn marks; both are boot-clock times in units of
/// 16 µs, modulo `HALF` (which wraps after about 100 days of uptime, and
/// then costs one moment of disorder).
pub(super) const REGION: u64 = 1 << 40;
pub(super) const HALF: u64 = REGION / 2;

/// Regions: the top of the byte range a lock can name (`off_t` is signed).
pub(super) const REGIONS: u64 = 1 << 22;

/// The first byte of the region of the lock file `name`: FNV-1a, the same
/// in every process and build.
pub(super) fn region(name: &str) -> u64 {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % REGIONS) * REGION
}

/// A ticket taken now: never 0, so that "below my ticket" is a range.
pub(super) fn ticket_now() -> u64 {
    units_now().max(1)
}

/// The boot clock now, in the units of tickets and turn marks.
pub(super) fn units_now() -> u64 {
    (now_us() >> 4) % HALF
}

pub(super) fn now_us() -> u64 {
    sys::boot_clock_us()
}

pub(super) fn duration_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Whether another open file description holds a byte of `dir` in
/// `[start, start + len)`.
pub(super) fn conflict(dir: &File, start: u64, len: u64) -> bool {
    sys::ofd_held(dir, start, start.saturating_add(len))
}

/// A byte of `dir` in `[start, end)` that another open file description
/// holds (the kernel reports one), if any.
pub(super) fn first_held(dir: &File, start: u64, end: u64) -> Option<u64> {
    sys::ofd_held_span(dir, start, end).map(|(s, _)| s)
}

/// Whether another open file description holds a one-byte range (a
/// ticket) of `dir` in `[start, end)` that is not in `passed`: the kernel
/// reporting one range per look, split around each, for at most `looks`
/// looks (then: none found).
pub(super) fn ticket_held(dir: &File, start: u64, end: u64, passed: &VecDeque<Span>, looks: usize) -> bool {
    let mut todo = vec![(start, end)];
    for _ in 0..looks {
        let Some((lo, hi)) = todo.pop() else {
            return false;
        };
        let Some(span) = sys::ofd_held_span(dir, lo, hi) else {
            continue;
        };
        if span.1.saturating_sub(span.0) == 1 && !passed.contains(&span) {
            return true;
        }
        if span.0 > lo {
            todo.push((lo, span.0));
        }
        if span.1 < hi {
            todo.push((span.1, hi));
        }
    }
    false
}

/// What a waiter joining the line finds ahead of it.
#[derive(Debug, Default)]
pub(super) struct Ahead {
    /// Byte ranges others hold, not passed over: at most [`AHEAD`].
    pub(super) found: Vec<Span>,
    /// Byte ranges passed over before that are still there.
    pub(super) seen: Vec<Span>,
}

/// The byte ranges others hold in `[start, end)`, the kernel reporting one
/// per look, split around each: at most [`AHEAD`] not in `passed`, with at
/// most `2 * AHEAD + 1` looks. And whether that was all of them (a range
/// held over others hides them: a place in line lost, at worst).
pub(super) fn tickets(dir: &File, start: u64, end: u64, passed: &VecDeque<Span>) -> (Ahead, bool) {
    let mut ahead = Ahead::default();
    let mut todo = vec![(start, end)];
    let mut looks = 0;
    while let Some((lo, hi)) = todo.pop() {
        if looks > 2 * AHEAD || ahead.found.len() >= AHEAD {
            return (ahead, false);
        }
        looks += 1;
        let Some(span) = sys::ofd_held_span(dir, lo, hi) else {
            continue;
        };
        if passed.contains(&span) {
            ahead.seen.push(span);
        } else if !ahead.found.contains(&span) {
            ahead.found.push(span);
        }
        if span.0 > lo {
            todo.push((lo, span.0));
        }
        if span.1 < hi {
            todo.push((span.1, hi));
        }
    }
    (ahead, true)
}
