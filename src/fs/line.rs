//! Taking turns with other processes for an exclusive lock file.
//!
//! Without a line, whoever creates the lock file first after a release
//! gets the lock. A process that releases and asks again at once is
//! already running while the waiters in other processes are still being
//! woken, so it nearly always wins: with four processes contending, the
//! owner changed on about one acquisition in ten, and the least served
//! process got half of what the most served one got.
//!
//! The line fixes the order without writing anything to the directory:
//!
//! - **Waiters stand in line on the lock directory.** A process that finds
//!   the lock held takes an OFD read lock (`fcntl(F_OFD_SETLK)`, which is
//!   independent of `flock` and of every lock other programs take) on one
//!   byte of the lock directory: in the name's region of the byte range
//!   (`REGION` bytes, picked by a hash of the lock's file name), at the
//!   offset of its *ticket*, the boot-clock time at which it began to wait.
//!   The kernel drops the byte when the waiter stops waiting or dies.
//! - **The oldest waiter goes first.** Woken by a release, a waiter asks
//!   the kernel (`F_OFD_GETLK`) whether anyone holds a byte of the region
//!   below its own ticket. If so, it stands back and lets the older waiter
//!   take the lock first. It looks at the lock every [`STAND_BACK`]: while
//!   the lock is taken the line is moving; found free twice in a row, the
//!   older waiters are not taking it (frozen, say), and it tries all the
//!   same. Only the waiters that were in line when it joined count, and
//!   only for [`CHANCES`] looks at a lock that moved without any of them
//!   leaving ([`LOOKS`] in all per wait): then they had their chance and
//!   are passed over (and remembered). So a frozen waiter, or a byte
//!   anyone who can read the directory holds, costs the others a few
//!   looks once, and never blocks them.
//! - **A holder lets waiters in.** Releasing, the holder asks the kernel
//!   whether anyone stands in the name's region. If someone does and its
//!   turn has lasted [`TURN`] or [`TURN_ACQUISITIONS`], its next attempt stands in line
//!   behind them, with a ticket from the moment it comes back (so a
//!   `Locker` that does not ask again leaves nothing in line, and one
//!   that comes back late is behind those who came meanwhile). Within a
//!   turn it may take the lock again at once, which keeps most of the
//!   throughput of back-to-back acquisitions.
//!
//! The line decides only *when* a process tries to take the lock, never
//! whether a creation or reclaim is safe: every rule of exclusion stands as
//! it was, and a line in disarray (a frozen waiter, two names whose regions
//! collide, tickets from another time namespace, a platform without OFD
//! locks) costs fairness, never exclusion. Shared locks and semaphores have
//! no line; `try_acquire` never stands back.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::sync::Mutex;
use std::time::Duration;

use crate::sys;

/// How long a waiter lets an older one go first, and a holder whose turn
/// is over keeps off the lock it released: several times what a woken
/// waiter takes to create the lock, so that it is rarely cut short.
pub(crate) const STAND_BACK: Duration = Duration::from_millis(10);

/// How long a holder may keep taking the lock again while others wait...
pub(crate) const TURN: Duration = Duration::from_millis(10);

/// ...and how many times: turns of equal length in acquisitions keep the
/// counts even when some processes get less of the CPU than others.
pub(crate) const TURN_ACQUISITIONS: u32 = 32;

/// Looks at a lock that moved (changed hands, or was free) while none of
/// the waiters ahead left the line, after which they have had their
/// chance: the waiter stops standing back for those still there (frozen,
/// or bytes that are no waiter's), and remembers them as passed over.
pub(crate) const CHANCES: u32 = 3;

/// Looks at a lock that moved for which one wait stands back at most,
/// however the line ahead comes and goes: past them, it tries at every
/// chance like a waiter at the head of the line.
pub(crate) const LOOKS: u32 = 10;

/// How long one acquisition leaves the lock to holders' turn marks at
/// most, whatever marks turn up: about one holder's whole turn.
pub(crate) const MARKS: Duration = TURN;

/// Tickets a waiter counts ahead of it when it joins the line (found with
/// at most twice as many looks, plus one); the rest do not hold it up.
const AHEAD: usize = 32;

/// Byte ranges passed over that a `Locker` remembers, so that a waiter
/// frozen for good costs each `Locker` its chances once, not at every
/// acquisition.
const PASSED: usize = 256;

/// A byte-range lock that another open file description holds on the
/// directory: `[start, end)`, as the kernel reports it.
type Span = (u64, u64);

/// The line's state of each name this `Locker` waits for or holds in turn.
#[derive(Debug, Default)]
pub(crate) struct Lines {
    places: Mutex<HashMap<Box<str>, Place>>,
    /// Tickets (any byte ranges in the line's half of a region) that had
    /// their chance and did not take it: no reason to stand back any more.
    /// Forgotten when found gone.
    passed: Mutex<VecDeque<Span>>,
    /// Off where a byte-range lock can be a network round trip (NFS and
    /// the like): the line would cost every release one.
    off: bool,
}

/// What a waiter standing back saw at the lock path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Free,
    Held((u64, u64)),
}

#[derive(Debug, Default)]
struct Place {
    /// The offset of the byte this `Locker` holds while it waits: its
    /// ticket, in the name's region.
    waiting: Option<u64>,
    /// The tickets that were ahead when it joined (not those passed over
    /// before), and are still there: only those can hold it up. A legit
    /// ticket below its own was taken before its own, so bytes that turn
    /// up later are none.
    ahead: Vec<Span>,
    /// Looks at a lock that moved with none of `ahead` leaving, since one
    /// last left; and looks at a lock that moved, this wait.
    unmoved: u32,
    looks: u32,
    /// What was at the lock path at the last of those looks.
    last_look: Option<Seen>,
    /// How long this acquisition has left the lock to turn marks (µs).
    marks_us: u64,
    /// A holder whose turn ended keeps off the lock until then (boot-clock
    /// µs) when it cannot see who waits (see [`Lines::join`]).
    courtesy_until: Option<u64>,
    /// Standing back for an older waiter until then (boot-clock µs).
    standing_back_until: Option<u64>,
    /// What was at the lock path when standing back last ended.
    seen: Option<Seen>,
    /// Whether the next attempt stands in line first, set when a turn
    /// ended with others in line: behind them, and behind whoever comes
    /// before it is back (its ticket is taken then).
    rejoin: bool,
    /// When the current turn began (boot-clock µs), and how many
    /// acquisitions it has had.
    turn_since: Option<u64>,
    turn_count: u32,
    /// The turn mark this `Locker` holds, released mid-turn: the byte
    /// whose offset says until when the line should leave the lock to it.
    turn_mark: Option<u64>,
    /// When this `Locker` last released the lock with others in line.
    released_at: Option<u64>,
    /// Whether it came back for the lock within [`HOLD_ON`] last time:
    /// only then is a turn mark worth the line's wait.
    comes_back: bool,
    /// The last turn mark this `Locker` stood back for: each is honoured
    /// once, so that a byte someone keeps in the marks' range (or one
    /// that turns up again when the clock's units wrap) cannot keep the
    /// line off the lock.
    honoured_mark: Option<u64>,
}

/// Bytes per name. Its lower half holds the waiters' tickets, its upper
/// half the holders' turn marks; both are boot-clock times in units of
/// 16 µs, modulo `HALF` (which wraps after about 100 days of uptime, and
/// then costs one moment of disorder).
const REGION: u64 = 1 << 40;
const HALF: u64 = REGION / 2;

/// How long a holder in the middle of its turn asks the line to leave the
/// lock it released to it: long enough for a loop to come back for it,
/// short enough that a holder that does not come back costs little.
pub(crate) const HOLD_ON: Duration = Duration::from_micros(300);

/// Places a `Locker` keeps before it forgets those of names it has not
/// waited for, held or released for [`IDLE`]: a `Locker` touching a
/// million names must not keep a million places.
const MAX_PLACES: usize = 1024;
const IDLE: Duration = Duration::from_secs(1);

/// Regions: the top of the byte range a lock can name (`off_t` is signed).
const REGIONS: u64 = 1 << 22;

impl Lines {
    /// The lines of the lock directory `dir`.
    pub(crate) fn of(dir: &File) -> Self {
        Lines {
            places: Mutex::default(),
            passed: Mutex::default(),
            off: sys::fs_is_remote(dir),
        }
    }

    /// Stands in line for `name` in `dir`, unless already in line.
    pub(crate) fn wait_on(&self, dir: &File, name: &str) {
        if self.off {
            return;
        }
        let mut places = self.places();
        let place = places.entry(name.into()).or_default();
        if place.waiting.is_some() {
            return;
        }
        let start = region(name);
        let ticket = start + ticket_now();
        // A byte refused is a place in line lost: fairness, not exclusion.
        if failpoint!("line.wait.before_ticket").is_ok() && sys::ofd_take_byte(dir, ticket) {
            self.join(dir, place, start, ticket);
        }
    }

    /// `place` now holds `ticket`: counts who is ahead (as far as the
    /// kernel shows them, and not passed over before). Returns whether the
    /// line may hide waiters: a range over more than one byte (no ticket
    /// is) or more byte ranges than a waiter counts.
    fn join(&self, dir: &File, place: &mut Place, start: u64, ticket: u64) -> bool {
        place.waiting = Some(ticket);
        let mut passed = self.passed();
        let (ahead, all) = tickets(dir, start, ticket, &passed);
        if all {
            // Passed-over bytes of this range that are gone are forgotten.
            passed.retain(|&(s, e)| e <= start || s >= ticket || ahead.seen.contains(&(s, e)));
        }
        let hidden = !all
            || ahead
                .found
                .iter()
                .chain(&ahead.seen)
                .any(|&(s, e)| e.saturating_sub(s) > 1);
        place.ahead = ahead.found;
        place.unmoved = 0;
        place.looks = 0;
        place.last_look = None;
        hidden
    }

    /// How long to keep off the lock `name` before trying it: `None` to
    /// try now. `at_path` says what is at the lock path right now (device
    /// and inode), if anything.
    ///
    /// While an older waiter that was in line when this one joined is
    /// still there, this stands back; every [`STAND_BACK`] it looks at the
    /// lock path. Another lock than last time: the line is moving, keep
    /// standing back. The same lock as last time (held long, or stale with
    /// nobody reclaiming it), or free twice a quarter of that apart (the
    /// older waiters are not taking it: frozen, or gone without leaving):
    /// try. And [`CHANCES`] looks at a lock that moved while none of those
    /// ahead left, or [`LOOKS`] in all: they had their chance, and this
    /// one stops standing back for them.
    pub(crate) fn stand_back(
        &self,
        dir: &File,
        name: &str,
        at_path: impl Fn() -> Option<(u64, u64)>,
    ) -> Option<Duration> {
        if self.off {
            return None;
        }
        let mut places = self.places();
        let place = places.get_mut(name)?;
        let now = now_us();
        if let Some(released) = place.released_at.take() {
            place.comes_back = now.saturating_sub(released) < duration_us(HOLD_ON) / 2;
        }
        let start = region(name);
        if std::mem::take(&mut place.rejoin) && place.waiting.is_none() {
            let ticket = start + ticket_now();
            // A byte range held over the line can hide the waiters this
            // holder would let in: it keeps off the lock for a moment, so
            // that they are not left to race a holder already running.
            if sys::ofd_take_byte(dir, ticket) && self.join(dir, place, start, ticket) {
                place.courtesy_until = Some(now.saturating_add(duration_us(STAND_BACK)));
            }
        }
        if let Some(until) = place.courtesy_until {
            if now < until {
                return Some(Duration::from_micros(until - now));
            }
            place.courtesy_until = None;
        }
        // A holder in the middle of its turn comes back for the lock.
        let marks = start + HALF + units_now();
        // A lock that begins below the marks is none of ours (another
        // program's range): the kernel names its start, not a mark.
        // Marks cost each acquisition [`MARKS`] at most, whoever posts them.
        if place.marks_us < duration_us(MARKS)
            && let Some(mark) = first_held(dir, marks, start + REGION).filter(|&mark| mark >= marks)
            && place.honoured_mark.replace(mark) != Some(mark)
        {
            let until_us = (mark - start - HALF).saturating_mul(16);
            let left = until_us.saturating_sub(now_us() % (HALF * 16));
            let wait = left.clamp(16, duration_us(HOLD_ON));
            place.marks_us = place.marks_us.saturating_add(wait);
            return Some(Duration::from_micros(wait));
        }
        place.waiting?;
        // A look that fails sees nobody ahead: try, which is harmless.
        if failpoint!("line.stand_back.before_look").is_err() {
            leave_standing_back(place);
            return None;
        }
        let before = place.ahead.len();
        place
            .ahead
            .retain(|&(s, e)| sys::ofd_held_span(dir, s, e).is_some());
        // Someone ahead left (took the lock, or gave up): the line moves,
        // and those still ahead get their chances afresh.
        let moved = place.ahead.len() < before;
        if moved {
            place.unmoved = 0;
        }
        if place.ahead.is_empty() {
            leave_standing_back(place);
            return None;
        }
        let until = *place
            .standing_back_until
            .get_or_insert(now.saturating_add(duration_us(STAND_BACK)));
        if now < until {
            return Some(Duration::from_micros(until - now));
        }
        let seen = match at_path() {
            Some(id) => Seen::Held(id),
            None => Seen::Free,
        };
        // The lock moved since the last such look (another lock, or free):
        // a chance those ahead had, unless one of them just left.
        if place.last_look.replace(seen) != Some(seen) {
            place.looks = place.looks.saturating_add(1);
            if !moved {
                place.unmoved = place.unmoved.saturating_add(1);
            }
            if place.unmoved >= CHANCES || place.looks >= LOOKS {
                if place.unmoved >= CHANCES {
                    self.pass_over(&place.ahead);
                }
                place.ahead.clear();
                leave_standing_back(place);
                return None;
            }
        }
        let again = match (place.seen.replace(seen), seen) {
            // The line moves: the lock changed hands since the last look.
            (last, Seen::Held(_)) if last != Some(seen) => STAND_BACK,
            // Free: maybe a handoff in flight; look again soon.
            (last, Seen::Free) if last != Some(Seen::Free) => STAND_BACK / 4,
            // The same lock for a whole period (held long, or a dead
            // holder's, which only an attempt judges), or free twice (the
            // older waiters are not taking it): try, which is harmless.
            _ => {
                leave_standing_back(place);
                return None;
            }
        };
        place.standing_back_until = Some(now.saturating_add(duration_us(again)));
        Some(again)
    }

    /// `name` is ours: leave the line, and start a turn if none is on.
    pub(crate) fn acquired(&self, dir: &File, name: &str) {
        let mut places = self.places();
        if places.is_empty() {
            return;
        }
        if let Some(place) = places.get_mut(name) {
            // Taken after waiting in line: a new turn.
            if place.waiting.is_some() || place.rejoin {
                place.turn_since = None;
                place.turn_count = 0;
            }
            leave(dir, place);
            place.marks_us = 0;
            if let Some(mark) = place.turn_mark.take() {
                sys::ofd_drop_byte(dir, mark);
            }
            place.rejoin = false;
            place.turn_since.get_or_insert_with(now_us);
            place.turn_count = place.turn_count.saturating_add(1);
        }
    }

    /// The acquisition of `name` stopped waiting without the lock (timed
    /// out, cancelled, failed), or with it: leave the line.
    pub(crate) fn stopped_waiting(&self, dir: &File, name: &str) {
        let mut places = self.places();
        if let Some(place) = places.get_mut(name) {
            leave(dir, place);
            place.marks_us = 0;
            place.rejoin = false;
            if place.turn_since.is_none() {
                places.remove(name);
            }
        }
    }

    /// `name` is being released: if others stand in line and this turn
    /// has lasted long enough, the next attempt of this `Locker` stands in
    /// line behind them. Costs one `fcntl` when nobody waits.
    pub(crate) fn releasing(&self, dir: &File, name: &str) {
        if self.off {
            return;
        }
        let start = region(name);
        // A look that fails sees nobody in line: the turn goes on.
        let waiters = failpoint!("line.release.before_look").is_ok() && conflict(dir, start, HALF);
        let mut places = self.places();
        if !waiters {
            // The turn ends with nobody in line.
            if !places.is_empty()
                && let Some(mut place) = places.remove(name)
                && let Some(mark) = place.turn_mark.take()
            {
                sys::ofd_drop_byte(dir, mark);
            }
            return;
        }
        let now = now_us();
        if places.len() >= MAX_PLACES {
            forget_idle(dir, &mut places, now);
        }
        let place = places.entry(name.into()).or_default();
        place.released_at = Some(now);
        if let Some(mark) = place.turn_mark.take() {
            sys::ofd_drop_byte(dir, mark);
        }
        let since = *place.turn_since.get_or_insert(now);
        if now.saturating_sub(since) >= duration_us(TURN) || place.turn_count >= TURN_ACQUISITIONS {
            place.turn_since = None;
            place.turn_count = 0;
            place.rejoin = true;
        } else if place.comes_back {
            // Mid-turn, and we came back at once last time: ask the line
            // to leave the lock to us for a moment.
            let until = (now.saturating_add(duration_us(HOLD_ON)) >> 4) % HALF;
            let mark = start + HALF + until;
            if sys::ofd_take_byte(dir, mark) {
                place.turn_mark = Some(mark);
            }
        }
    }

    /// Whether this `Locker` stands back for an older waiter for `name`
    /// right now: then a release of the lock is not its business.
    pub(crate) fn behind(&self, dir: &File, name: &str) -> bool {
        let places = self.places();
        let Some(place) = places.get(name) else {
            return false;
        };
        match (place.waiting, place.standing_back_until) {
            (Some(_), Some(until)) => {
                now_us() < until
                    && place
                        .ahead
                        .iter()
                        .any(|&(s, e)| sys::ofd_held_span(dir, s, e).is_some())
            }
            _ => false,
        }
    }

    /// Remembers `spans` as passed over.
    fn pass_over(&self, spans: &[Span]) {
        let mut passed = self.passed();
        for span in spans {
            if !passed.contains(span) {
                if passed.len() >= PASSED {
                    passed.pop_front();
                }
                passed.push_back(*span);
            }
        }
    }

    fn places(&self) -> std::sync::MutexGuard<'_, HashMap<Box<str>, Place>> {
        // Nothing here is left torn by a panic.
        self.places.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn passed(&self) -> std::sync::MutexGuard<'_, VecDeque<Span>> {
        self.passed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Forgets the places that wait for nothing and have seen nothing for
/// [`IDLE`]: what they remember (a turn, that it should rejoin the line,
/// a turn mark long past) is over or stale, and the mark's byte is given
/// up. Forgetting one costs fairness at most.
fn forget_idle(dir: &File, places: &mut HashMap<Box<str>, Place>, now: u64) {
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
fn leave(dir: &File, place: &mut Place) {
    if let Some(ticket) = place.waiting.take() {
        sys::ofd_drop_byte(dir, ticket);
    }
    place.ahead = Vec::new();
    place.last_look = None;
    place.courtesy_until = None;
    leave_standing_back(place);
}

/// Ends a place's standing back: the next one starts afresh.
fn leave_standing_back(place: &mut Place) {
    place.standing_back_until = None;
    place.seen = None;
}

/// The first byte of the region of the lock file `name`: FNV-1a, the same
/// in every process and build.
fn region(name: &str) -> u64 {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % REGIONS) * REGION
}

/// A ticket taken now: never 0, so that "below my ticket" is a range.
fn ticket_now() -> u64 {
    units_now().max(1)
}

/// The boot clock now, in the units of tickets and turn marks.
fn units_now() -> u64 {
    (now_us() >> 4) % HALF
}

fn now_us() -> u64 {
    sys::boot_clock_us()
}

fn duration_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Whether another open file description holds a byte of `dir` in
/// `[start, start + len)`.
fn conflict(dir: &File, start: u64, len: u64) -> bool {
    first_held(dir, start, start.saturating_add(len)).is_some()
}

/// A byte of `dir` in `[start, end)` that another open file description
/// holds (the kernel reports one), if any.
fn first_held(dir: &File, start: u64, end: u64) -> Option<u64> {
    sys::ofd_held_span(dir, start, end).map(|(s, _)| s)
}

/// What a waiter joining the line finds ahead of it.
#[derive(Debug, Default)]
struct Ahead {
    /// Byte ranges others hold, not passed over: at most [`AHEAD`].
    found: Vec<Span>,
    /// Byte ranges passed over before that are still there.
    seen: Vec<Span>,
}

/// The byte ranges others hold in `[start, end)`, the kernel reporting one
/// per look, split around each: at most [`AHEAD`] not in `passed`, with at
/// most `2 * AHEAD + 1` looks. And whether that was all of them (a range
/// held over others hides them: a place in line lost, at worst).
fn tickets(dir: &File, start: u64, end: u64, passed: &VecDeque<Span>) -> (Ahead, bool) {
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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// A lock directory, opened as another `Locker` would: OFD locks
    /// belong to an open file description, which a `dup` shares.
    struct Dir(tempfile::TempDir);

    impl Dir {
        fn new() -> Self {
            Dir(tempfile::tempdir().unwrap())
        }

        fn open(&self) -> File {
            File::open(self.0.path()).unwrap()
        }
    }

    fn anyone_waiting(dir: &File, name: &str) -> bool {
        conflict(dir, region(name), HALF)
    }

    #[test]
    fn the_oldest_waiter_goes_first_and_the_others_stand_back_for_a_while() {
        let dir = Dir::new();
        let (holder, a, b) = (dir.open(), dir.open(), dir.open());
        let (older, younger) = (Lines::default(), Lines::default());
        older.wait_on(&a, "x.lock");
        std::thread::sleep(Duration::from_millis(1));
        younger.wait_on(&b, "x.lock");
        assert!(anyone_waiting(&holder, "x.lock"));
        assert!(
            !anyone_waiting(&holder, "y.lock"),
            "another name has its own line"
        );
        assert_eq!(
            older.stand_back(&a, "x.lock", || None),
            None,
            "the oldest tries at once"
        );
        let back = younger
            .stand_back(&b, "x.lock", || None)
            .expect("an older waiter is in line");
        assert!(back <= STAND_BACK, "{back:?}");
        // The older one leaves the line (it took the lock, or gave up):
        // the younger may go.
        older.acquired(&a, "x.lock");
        assert_eq!(younger.stand_back(&b, "x.lock", || None), None);
        younger.stopped_waiting(&b, "x.lock");
        assert!(!anyone_waiting(&holder, "x.lock"));
    }

    #[test]
    fn a_waiter_stands_back_while_the_line_moves_and_no_longer_once_it_stops() {
        let dir = Dir::new();
        let (a, b) = (dir.open(), dir.open());
        let (frozen, other) = (Lines::default(), Lines::default());
        frozen.wait_on(&a, "x.lock");
        std::thread::sleep(Duration::from_millis(1));
        other.wait_on(&b, "x.lock");
        // Free once: maybe a handoff in flight; look again soon.
        assert!(other.stand_back(&b, "x.lock", || None).is_some());
        std::thread::sleep(STAND_BACK + Duration::from_millis(1));
        assert_eq!(other.stand_back(&b, "x.lock", || None), Some(STAND_BACK / 4));
        // Free twice in a row: the older waiter is not taking it.
        std::thread::sleep(STAND_BACK / 4 + Duration::from_millis(1));
        assert_eq!(
            other.stand_back(&b, "x.lock", || None),
            None,
            "a frozen older waiter cannot keep the others off"
        );
        // Woken again, it stands back again; a new lock at each look is a
        // line that moves, but not through the frozen waiter: after
        // CHANCES looks at a lock that moved, it had its chance.
        let lock = |ino| move || Some((1, ino));
        assert!(other.stand_back(&b, "x.lock", lock(1)).is_some());
        std::thread::sleep(STAND_BACK + Duration::from_millis(1));
        assert_eq!(other.stand_back(&b, "x.lock", lock(2)), Some(STAND_BACK));
        std::thread::sleep(STAND_BACK + Duration::from_millis(1));
        assert_eq!(
            other.stand_back(&b, "x.lock", lock(3)),
            None,
            "a frozen waiter kept the line off for good (or a looper's new locks did)"
        );
        // Passed over for good: the next wait does not stand back for it.
        other.stopped_waiting(&b, "x.lock");
        other.wait_on(&b, "x.lock");
        assert_eq!(other.stand_back(&b, "x.lock", lock(4)), None);
        assert!(!other.behind(&b, "x.lock"));
        other.stopped_waiting(&b, "x.lock");
        // Another Locker has not passed it over yet.
        let third = Lines::default();
        let c = dir.open();
        third.wait_on(&c, "x.lock");
        assert!(third.stand_back(&c, "x.lock", lock(4)).is_some());
    }

    #[test]
    fn a_waiter_stands_back_for_those_ahead_when_it_joined_and_afresh_when_one_leaves() {
        let dir = Dir::new();
        let (a, b, w, late) = (dir.open(), dir.open(), dir.open(), dir.open());
        let (first, second, waiter) = (Lines::default(), Lines::default(), Lines::default());
        first.wait_on(&a, "x.lock");
        std::thread::sleep(Duration::from_millis(1));
        second.wait_on(&b, "x.lock");
        std::thread::sleep(Duration::from_millis(1));
        waiter.wait_on(&w, "x.lock");
        // A byte that turns up below its ticket after it joined (anyone who
        // can read the directory may take one) is no waiter ahead of it.
        let planted = region("x.lock") + 1;
        assert!(sys::ofd_take_byte(&late, planted));
        let lock = |ino| move || Some((1, ino));
        assert!(waiter.stand_back(&w, "x.lock", lock(1)).is_some());
        std::thread::sleep(STAND_BACK + Duration::from_millis(1));
        assert_eq!(waiter.stand_back(&w, "x.lock", lock(2)), Some(STAND_BACK));
        std::thread::sleep(STAND_BACK + Duration::from_millis(1));
        // The first one takes the lock: the line moves, the second one
        // gets its chances afresh.
        first.acquired(&a, "x.lock");
        for ino in 3..5 {
            assert_eq!(
                waiter.stand_back(&w, "x.lock", lock(ino)),
                Some(STAND_BACK),
                "{ino}"
            );
            std::thread::sleep(STAND_BACK + Duration::from_millis(1));
        }
        second.acquired(&b, "x.lock");
        assert_eq!(
            waiter.stand_back(&w, "x.lock", lock(5)),
            None,
            "the planted byte holds it up"
        );
        waiter.stopped_waiting(&w, "x.lock");
        sys::ofd_drop_byte(&late, planted);
    }

    #[test]
    fn turn_marks_cost_an_acquisition_a_turn_at_most() {
        let dir = Dir::new();
        let (w, squat) = (dir.open(), dir.open());
        let waiter = Lines::default();
        waiter.wait_on(&w, "x.lock");
        // Marks that keep changing, for times still to come.
        let marks = region("x.lock") + HALF;
        let mut waited = Duration::ZERO;
        for i in 0..1_000 {
            let mark = marks + units_now() + 1_000 + i;
            assert!(sys::ofd_take_byte(&squat, mark));
            match waiter.stand_back(&w, "x.lock", || None) {
                Some(back) => waited += back,
                None => break,
            }
            sys::ofd_drop_byte(&squat, mark);
        }
        assert!(waited <= MARKS + HOLD_ON, "{waited:?}");
        waiter.stopped_waiting(&w, "x.lock");
    }

    #[test]
    fn a_lock_that_stays_taken_behind_a_frozen_waiter_is_tried_all_the_same() {
        let dir = Dir::new();
        let (a, b) = (dir.open(), dir.open());
        let (frozen, other) = (Lines::default(), Lines::default());
        frozen.wait_on(&a, "x.lock");
        std::thread::sleep(Duration::from_millis(1));
        other.wait_on(&b, "x.lock");
        let mut looks = 0;
        // The same lock at every look (a dead holder's file, say): at the
        // second look, it tries; only an attempt judges the holder.
        while let Some(back) = other.stand_back(&b, "x.lock", || Some((1, 1))) {
            looks += 1;
            assert!(looks <= 3, "never tries");
            std::thread::sleep(back + Duration::from_millis(1));
        }
        assert!(!other.behind(&b, "x.lock"), "then woken by the next release");
        // And it stands back again when woken.
        assert!(other.stand_back(&b, "x.lock", || Some((1, 1))).is_some());
    }

    #[test]
    fn a_holder_keeps_its_turn_then_lets_the_line_in() {
        let dir = Dir::new();
        let (h, w) = (dir.open(), dir.open());
        let (holder, waiter) = (Lines::default(), Lines::default());
        // Nobody in line: releasing leaves nothing.
        holder.releasing(&h, "x.lock");
        assert_eq!(holder.stand_back(&h, "x.lock", || None), None);
        assert!(holder.places().is_empty());
        waiter.wait_on(&w, "x.lock");
        holder.acquired(&h, "x.lock");
        holder.releasing(&h, "x.lock");
        assert_eq!(holder.stand_back(&h, "x.lock", || None), None, "within its turn");
        assert_eq!(
            waiter.stand_back(&w, "x.lock", || None),
            None,
            "no mark before it came back"
        );
        holder.acquired(&h, "x.lock");
        // It came straight back: now, mid-turn, the waiter leaves the lock
        // to the holder for a moment.
        holder.releasing(&h, "x.lock");
        let back = waiter
            .stand_back(&w, "x.lock", || None)
            .expect("the holder comes back");
        assert!(back <= HOLD_ON, "{back:?}");
        holder.acquired(&h, "x.lock");
        assert_eq!(
            waiter.stand_back(&w, "x.lock", || None),
            None,
            "back: the mark is gone"
        );
        // A mark is honoured once: a byte kept there for good (by a
        // program that is not leasehold, say) cannot keep the line off.
        let stuck = dir.open();
        let mark = region("x.lock") + REGION - 1;
        assert!(sys::ofd_take_byte(&stuck, mark));
        assert!(waiter.stand_back(&w, "x.lock", || None).is_some());
        assert_eq!(waiter.stand_back(&w, "x.lock", || None), None, "honoured once");
        sys::ofd_drop_byte(&stuck, mark);
        holder.releasing(&h, "x.lock");
        std::thread::sleep(HOLD_ON + Duration::from_millis(1));
        assert_eq!(
            waiter.stand_back(&w, "x.lock", || None),
            None,
            "a holder that does not come back costs the line only a moment"
        );
        std::thread::sleep(TURN);
        holder.releasing(&h, "x.lock");
        let back = holder
            .stand_back(&h, "x.lock", || None)
            .expect("its turn is over and someone waits");
        assert!(back <= STAND_BACK);
        waiter.stopped_waiting(&w, "x.lock");
        assert!(!anyone_waiting(&h, "x.lock"));
        assert!(waiter.places().is_empty());
    }

    #[test]
    fn a_locker_touching_many_contended_names_keeps_few_places() {
        let dir = Dir::new();
        let (h, w) = (dir.open(), dir.open());
        let (holder, waiter) = (Lines::default(), Lines::default());
        let names: Vec<String> = (0..5_000).map(|i| format!("job-{i}.lock")).collect();
        // Each name taken and released once while someone waits for it,
        // and never again: nothing of it is needed any more.
        for name in &names {
            waiter.wait_on(&w, name);
            holder.acquired(&h, name);
            holder.releasing(&h, name);
            waiter.stopped_waiting(&w, name);
        }
        std::thread::sleep(Duration::from_millis(1100));
        waiter.wait_on(&w, "last.lock");
        holder.acquired(&h, "last.lock");
        holder.releasing(&h, "last.lock");
        let kept = holder.places().len();
        assert!(kept <= 1_024, "{kept} places kept for names long released");
        assert!(waiter.places().len() <= 1, "{}", waiter.places().len());
    }

    #[test]
    fn a_byte_range_lock_of_another_program_spanning_the_region_panics_nobody_and_stops_nobody() {
        let dir = Dir::new();
        let (w, other) = (dir.open(), dir.open());
        // Any program that can open the directory may hold a read lock
        // over any range: here, from offset 0 to far past every region.
        assert!(sys::ofd_read_lock(&other, 0, 1 << 62));
        let waiter = Lines::default();
        waiter.wait_on(&w, "x.lock");
        let mut looks = 0;
        while let Some(back) = waiter.stand_back(&w, "x.lock", || Some((1, 1))) {
            looks += 1;
            assert!(looks <= 10, "never tries");
            std::thread::sleep(back + Duration::from_millis(1));
        }
        waiter.stopped_waiting(&w, "x.lock");
    }

    #[test]
    fn a_holder_that_comes_back_late_stands_behind_those_who_waited_meanwhile() {
        let dir = Dir::new();
        let (h, a, b) = (dir.open(), dir.open(), dir.open());
        let (holder, first, later) = (Lines::default(), Lines::default(), Lines::default());
        first.wait_on(&a, "x.lock");
        // A turn begins at the first release someone waits for...
        holder.releasing(&h, "x.lock");
        holder.acquired(&h, "x.lock");
        std::thread::sleep(TURN);
        // ...and is over: its next attempt is in line.
        holder.releasing(&h, "x.lock");
        assert!(holder.places().get("x.lock").is_some_and(|p| p.rejoin));
        first.acquired(&a, "x.lock");
        first.stopped_waiting(&a, "x.lock");
        // Long after its release, someone else starts waiting; then the
        // old holder comes back. It was not waiting all that time: it
        // must not be ahead of the one who was.
        std::thread::sleep(Duration::from_millis(50));
        later.wait_on(&b, "x.lock");
        std::thread::sleep(Duration::from_millis(1));
        let _ = holder.stand_back(&h, "x.lock", || Some((1, 1)));
        assert_eq!(
            later.stand_back(&b, "x.lock", || Some((1, 1))),
            None,
            "the waiter stands back for a holder that came back after it"
        );
        holder.stopped_waiting(&h, "x.lock");
        later.stopped_waiting(&b, "x.lock");
    }

    #[test]
    fn a_dead_waiter_leaves_the_line() {
        let dir = Dir::new();
        let holder = dir.open();
        {
            let gone = dir.open();
            Lines::default().wait_on(&gone, "x.lock");
            assert!(anyone_waiting(&holder, "x.lock"));
        }
        // Its descriptor closed (as at exit): the kernel dropped the byte.
        assert!(!anyone_waiting(&holder, "x.lock"));
    }

    #[test]
    fn regions_and_tickets_stay_inside_the_byte_range_of_a_lock() {
        for name in [
            "",
            "x.lock",
            "a-very-long-name-0123456789abcdef.lock",
            "\u{1F512}",
        ] {
            let start = region(name);
            assert_eq!(start % REGION, 0);
            assert!(i64::try_from(start + REGION).is_ok(), "{name:?}");
        }
        assert!(ticket_now() >= 1 && ticket_now() < REGION);
    }
}
