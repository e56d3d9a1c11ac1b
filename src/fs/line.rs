//! Taking turns with other processes for an exclusive lock file, or for a
//! semaphore's permits.
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
//!   same (and if none of them left since the look before, they had their
//!   chance: passed over, and remembered). Only the waiters that were in
//!   line when it joined count, and only for [`CHANCES`] looks at a lock
//!   that moved without any of them leaving (then passed over, and
//!   remembered), or [`LOOKS`] in all per wait (then not stood back for,
//!   this wait). So a frozen waiter, or a byte
//!   anyone who can read the directory holds, costs the others a few
//!   looks once, and never blocks them.
//! - **A holder lets waiters in.** Releasing, the holder asks the kernel
//!   whether anyone stands in the name's region. If someone does and its
//!   turn has lasted [`TURN`] or [`TURN_ACQUISITIONS`] ([`PERMIT_TURN_ACQUISITIONS`]
//!   for a semaphore's permits), its next attempt stands in line
//!   behind them, with a ticket from the moment it comes back (so a
//!   `Locker` that does not ask again leaves nothing in line, and one
//!   that comes back late is behind those who came meanwhile). Within a
//!   turn it may take the lock again at once, which keeps most of the
//!   throughput of back-to-back acquisitions. A fair `Locker`
//!   (`LockerBuilder::fair`) has turns of one acquisition.
//!
//! On Windows, which cannot lock a directory, the tickets and turn marks
//! are byte-range locks on a file in the lock directory instead
//! (`leasehold..line`, made by the first waiter and left in place), and
//! the kernel's report is a search (see `sys/windows.rs`); the rules here
//! are the same.
//!
//! The line decides only *when* a process tries to take the lock, never
//! whether a creation or reclaim is safe: every rule of exclusion stands as
//! it was, and a line in disarray (a frozen waiter, two names whose regions
//! collide, tickets from another time namespace, a platform without OFD
//! locks) costs fairness, never exclusion. `try_acquire` never stands back.
//!
//! **Semaphores** have the same line, for their permits: a waiter for a
//! permit stands in line whether the name is held by a full group or by an
//! exclusive lock; taking a permit leaves the line and starts a turn, and
//! giving one back is a release. What differs is what "the lock moved"
//! means: a group's marker keeps its inode for as long as anyone holds a
//! permit, so a waiter judges instead the set of member records
//! (`members::seen_by_permit_waiter`), whose names are new at each
//! acquisition: another set is another lock (a permit changed hands), and
//! fewer records than permits is a free lock. So a frozen waiter ahead
//! costs permit waiters [`CHANCES`] looks at a group whose members come
//! and go, as it costs exclusive waiters, and a group that does not move
//! is tried like a lock held long. The rules hold as they are for any
//! number of permits: the oldest waiters try first, and a younger one
//! tries after a look, whoever is ahead. Shared (reader) acquisitions
//! have no line: readers do not take turns, and an exclusive waiter for a
//! group announces itself instead (`group.rs`).

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::sync::Mutex;
use std::time::Duration;

use crate::sys;

mod bytes;
mod place;
#[cfg(test)]
mod tests;

use bytes::{
    HALF, REGION, Span, conflict, duration_us, first_held, now_us, region, ticket_held, ticket_now, tickets,
    units_now,
};
use place::{Place, Seen, end_turn, forget_idle, leave, leave_standing_back};

/// How long a waiter lets an older one go first, and a holder whose turn
/// is over keeps off the lock it released: several times what a woken
/// waiter takes to create the lock, so that it is rarely cut short.
pub(crate) const STAND_BACK: Duration = Duration::from_millis(10);

/// How long a holder may keep taking the lock again while others wait...
pub(crate) const TURN: Duration = Duration::from_millis(10);

/// ...and how many times: turns of equal length in acquisitions keep the
/// counts even when some processes get less of the CPU than others.
pub(crate) const TURN_ACQUISITIONS: u32 = 32;

/// The same for a semaphore's permits, of which one acquisition and
/// release costs about ten times an exclusive lock's (BENCHMARKS.md, *The
/// kinds side by side*): so that a turn ends by its count before its
/// [`TURN`], as an exclusive one does.
pub(crate) const PERMIT_TURN_ACQUISITIONS: u32 = 4;

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

/// Looks a fair `Locker` takes at most for a ticket in line, at a release
/// or a handoff among its tasks (`Lines::ticket_in_line`): the kernel
/// names the first ticket at once unless ranges that are none (held by
/// anyone who can read the directory) or tickets passed over come first.
const TICKET_LOOKS: usize = 8;

/// Byte ranges passed over that a `Locker` remembers, so that a waiter
/// frozen for good costs each `Locker` its chances once, not at every
/// acquisition.
const PASSED: usize = 256;

/// The line's state of each name this `Locker` waits for or holds in turn.
#[derive(Debug, Default)]
pub(crate) struct Lines {
    places: Mutex<HashMap<Box<str>, Place>>,
    /// Tickets (any byte ranges in the line's half of a region) that had
    /// their chance and did not take it: no reason to stand back any more.
    /// Forgotten when found gone.
    passed: Mutex<VecDeque<Span>>,
    /// Off where the platform has no OFD byte-range locks, and where a
    /// byte-range lock can be a network round trip (NFS and the like):
    /// the line would cost every release one.
    off: bool,
    /// Turns of one acquisition (`LockerBuilder::fair`): a release that
    /// finds a waiter's ticket in line ends the turn.
    fair: bool,
    /// Where the line's bytes are not the lock directory's own (Windows,
    /// which cannot lock a directory): the file in it that holds them.
    /// `None`: the calls' directory handle holds them.
    file: Option<LineFile>,
}

/// The line's file in the lock directory, opened when first needed: made
/// by the first waiter, and looked for by holders at most every
/// [`STAND_BACK`] until then.
#[derive(Debug, Default)]
struct LineFile {
    file: std::sync::OnceLock<File>,
    /// When a holder last found no line file (boot-clock µs, 0: never).
    missed_at: std::sync::atomic::AtomicU64,
}

/// How long a holder in the middle of its turn asks the line to leave the
/// lock it released to it: long enough for a loop to come back for it,
/// short enough that a holder that does not come back costs little.
pub(crate) const HOLD_ON: Duration = Duration::from_micros(300);

/// Places a `Locker` keeps before it forgets those of names it has not
/// waited for, held or released for [`IDLE`]: a `Locker` touching a
/// million names must not keep a million places.
const MAX_PLACES: usize = 1024;
const IDLE: Duration = Duration::from_secs(1);

impl Lines {
    /// The lines of the lock directory `dir`; with turns of one
    /// acquisition if `fair`.
    pub(crate) fn of(dir: &File, fair: bool) -> Self {
        Lines {
            places: Mutex::default(),
            passed: Mutex::default(),
            fair,
            off: !sys::byte_range_locks() || sys::fs_is_remote(dir),
            file: (!sys::DIRECTORY_MARKS).then(LineFile::default),
        }
    }

    /// What holds the line's bytes for the lock directory `dir`: `dir`
    /// itself, or the line file in it, made if `create` (a waiter) and
    /// else only opened if there. `None` when there is no line file: then
    /// nobody stands in line.
    fn bytes_of<'a>(&'a self, dir: &'a File, create: bool) -> Option<&'a File> {
        use std::sync::atomic::Ordering::Relaxed;
        let Some(line) = &self.file else {
            return Some(dir);
        };
        if let Some(file) = line.file.get() {
            return Some(file);
        }
        let missed_at = line.missed_at.load(Relaxed);
        if !create && missed_at != 0 && now_us().saturating_sub(missed_at) < duration_us(STAND_BACK) {
            return None;
        }
        match sys::line_file(dir, create) {
            Some(file) => Some(line.file.get_or_init(|| file)),
            None => {
                line.missed_at.store(now_us().max(1), Relaxed);
                None
            }
        }
    }

    /// Stands in line for `name` in `dir`, unless already in line.
    pub(crate) fn wait_on(&self, dir: &File, name: &str) {
        if self.off {
            return;
        }
        let lock_dir = dir;
        let Some(dir) = self.bytes_of(dir, true) else {
            return;
        };
        let mut places = self.places();
        let place = places.entry(name.into()).or_default();
        // Back mid-turn and the lock taken: the turn is over, and its mark
        // would only keep the line off the lock.
        if let Some(mark) = place.turn_mark.take() {
            sys::ofd_drop_byte(dir, mark);
        }
        if place.waiting.is_some() {
            return;
        }
        // Before the ticket: whoever sees the ticket sees this too.
        place.registered = super::mutex::register(lock_dir, name);
        let start = region(name);
        let ticket = start + ticket_now();
        // A byte refused is a place in line lost: fairness, not exclusion.
        if failpoint!("line.wait.before_ticket").is_ok() && sys::ofd_take_byte(dir, ticket) {
            self.join(dir, place, start, ticket);
        } else {
            place.registered = None;
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
    /// try now. `at_path` says what is at the lock path right now (which
    /// file: its inode number and birth time, since a filesystem may give
    /// the number again to the next holder's file; for a semaphore, what
    /// its members are), or `None` if the lock is free.
    ///
    /// While an older waiter that was in line when this one joined is
    /// still there, this stands back; every [`STAND_BACK`] it looks at the
    /// lock path. Another lock than last time: the line is moving, keep
    /// standing back. The same lock as last time (held long, or stale with
    /// nobody reclaiming it), or free twice a quarter of that apart (the
    /// older waiters are not taking it: frozen, or gone without leaving):
    /// try, and if none of them left since the look before, pass them
    /// over. And [`CHANCES`] looks at a lock that moved while none of
    /// those ahead left (passed over), or [`LOOKS`] in all: they had their
    /// chance, and this one stops standing back for them.
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
        let lock_dir = dir;
        let dir = self.bytes_of(dir, true)?;
        let now = now_us();
        // The time the last wait for a mark really kept us off the lock,
        // beyond what was charged for it when it began.
        if let Some((since, charged)) = place.marks_since.take() {
            let over = now.saturating_sub(since).saturating_sub(charged);
            place.marks_us = place.marks_us.saturating_add(over);
        }
        if let Some(released) = place.released_at.take() {
            place.comes_back = now.saturating_sub(released) < duration_us(HOLD_ON) / 2;
        }
        let start = region(name);
        if std::mem::take(&mut place.rejoin) && place.waiting.is_none() {
            place.registered = super::mutex::register(lock_dir, name);
            let ticket = start + ticket_now();
            // A byte range held over the line can hide the waiters this
            // holder would let in: it keeps off the lock for a moment, so
            // that they are not left to race a holder already running.
            // Not a fair holder that sees a waiter's ticket ahead (what
            // ended its turn): it stands back for that, as any waiter,
            // and a range anyone can hold costs it no more than that.
            if sys::ofd_take_byte(dir, ticket)
                && self.join(dir, place, start, ticket)
                && !(self.fair && place.ahead.iter().any(|&(s, e)| e.saturating_sub(s) == 1))
            {
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
        // Marks cost each acquisition [`MARKS`] at most, whoever posts
        // them, and each is honoured once: until the time it gave when
        // first seen (an event that wakes us meanwhile does not cut that
        // short), and never after. So a byte kept there (by a program that
        // is not leasehold, or one that turns up again when the clock's
        // units wrap) cannot keep the line off the lock.
        let honouring = place.honoured_mark.filter(|&(_, until)| now < until);
        if (honouring.is_some() || place.marks_us < duration_us(MARKS))
            && let Some(mark) = first_held(dir, marks, start + REGION).filter(|&mark| mark >= marks)
        {
            let honoured = place.honoured_mark.filter(|&(seen, _)| seen == mark);
            // Each wait is charged what it asks for when it begins, and
            // at the next look whatever it really took beyond that (a
            // timer's wake-up and a look cost more than the shortest
            // marks ask for): the budget counts time off the lock.
            if let Some((_, until)) = honoured {
                // Until its time (already charged), then never again.
                if now < until {
                    place.marks_since = Some((now, until - now));
                    return Some(Duration::from_micros(until - now));
                }
            } else if place.marks_us < duration_us(MARKS) {
                let until_us = (mark - start - HALF).saturating_mul(16);
                let left = until_us.saturating_sub(now_us() % (HALF * 16));
                let wait = left.clamp(16, duration_us(HOLD_ON));
                place.marks_us = place.marks_us.saturating_add(wait);
                place.honoured_mark = Some((mark, now.saturating_add(wait)));
                place.marks_since = Some((now, wait));
                return Some(Duration::from_micros(wait));
            }
        }
        place.waiting?;
        // A look that fails sees nobody ahead: try, which is harmless.
        if failpoint!("line.stand_back.before_look").is_err() {
            leave_standing_back(place);
            return None;
        }
        let before = place.ahead.len();
        place.ahead.retain(|&(s, e)| sys::ofd_held(dir, s, e));
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
            // Free twice: the older waiters are not taking it (frozen,
            // or bytes that are no waiter's): try. If none of them left
            // the line since the look before (the lock free at both, and
            // nobody ahead took it between), they had their chance: stop
            // standing back for them, this wait and the next.
            (_, Seen::Free) => {
                if place.unmoved > 0 {
                    self.pass_over(&place.ahead);
                    place.ahead.clear();
                }
                leave_standing_back(place);
                return None;
            }
            // The same lock for a whole period (held long, or a dead
            // holder's, which only an attempt judges): try, which is
            // harmless.
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
        // Bytes are held only where the line's file was opened.
        let Some(dir) = self.bytes_of(dir, false) else {
            places.remove(name);
            return;
        };
        if let Some(place) = places.get_mut(name) {
            // Taken after waiting in line: a new turn.
            if place.waiting.is_some() || place.rejoin {
                place.turn_since = None;
                place.turn_count = 0;
            }
            leave(dir, place);
            place.marks_us = 0;
            place.marks_since = None;
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
        if places.is_empty() {
            return;
        }
        let Some(dir) = self.bytes_of(dir, false) else {
            places.remove(name);
            return;
        };
        if let Some(place) = places.get_mut(name) {
            leave(dir, place);
            place.marks_us = 0;
            place.marks_since = None;
            place.rejoin = false;
            if place.turn_since.is_none() {
                places.remove(name);
            }
        }
    }

    /// `name` is being released: if others stand in line and this turn
    /// has lasted long enough, the next attempt of this `Locker` stands in
    /// line behind them. Costs one `fcntl` when nobody waits. Returns
    /// whether anyone of another `Locker` stands in line for `name`, as
    /// far as the kernel shows (`false` where the line is off).
    pub(crate) fn releasing(&self, dir: &File, name: &str) -> bool {
        self.releasing_after(dir, name, TURN_ACQUISITIONS)
    }

    /// [`Self::releasing`] for a permit of the semaphore `name`, whose
    /// turns last [`PERMIT_TURN_ACQUISITIONS`] at most.
    pub(crate) fn releasing_permit(&self, dir: &File, name: &str) -> bool {
        self.releasing_after(dir, name, PERMIT_TURN_ACQUISITIONS)
    }

    /// [`Self::releasing`], with turns of `acquisitions` at most.
    fn releasing_after(&self, dir: &File, name: &str, acquisitions: u32) -> bool {
        if self.off {
            return false;
        }
        let Some(dir) = self.bytes_of(dir, false) else {
            // No line file: nobody has stood in line here.
            return false;
        };
        let start = region(name);
        // A look that fails sees nobody in line: the turn goes on.
        let waiters = failpoint!("line.release.before_look").is_ok() && conflict(dir, start, HALF);
        let fair_turn_over = waiters && self.fair && self.ticket_in_line(dir, start);
        let mut places = self.places();
        if !waiters {
            // The turn ends with nobody in line. A semaphore's place may
            // hold the ticket of another task of this `Locker`, waiting
            // for a permit while this one gives one back (the kernel does
            // not show us our own bytes): that stays, or it is held for
            // as long as the `Locker` lives.
            if let Some(place) = places.get_mut(name) {
                if let Some(mark) = place.turn_mark.take() {
                    sys::ofd_drop_byte(dir, mark);
                }
                if place.waiting.is_some() {
                    end_turn(place);
                } else {
                    places.remove(name);
                }
            }
            return false;
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
        // Fair: a turn is one acquisition, whether or not this `Locker`
        // had counted it (one taken with nobody in line has no place, and
        // is not counted), when a waiter's ticket is in line. Not one
        // passed over: it had its chances, and ending every turn for it
        // would cost each acquisition a rejoin (and, behind a range that
        // may hide waiters, 10 ms off the lock) for as long as a frozen
        // process, or anyone who can read the directory, keeps it there.
        // Bytes that are no ticket end turns as for anyone.
        if now.saturating_sub(since) >= duration_us(TURN)
            || place.turn_count >= acquisitions
            || fair_turn_over
        {
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
        true
    }

    /// Whether nobody of another `Locker` stands in line for `name` right
    /// now, as far as the kernel shows: `false` where the line is off (a
    /// platform without OFD locks, a network filesystem), where nobody
    /// could be seen. A waiter stands in line from its first attempt that
    /// found the lock held, so one that has not tried yet is not seen; one
    /// that has, is, until it stops waiting. A look that fails (the
    /// kernel's lock query on a directory we hold open does not, short of
    /// a bug) and, on Windows, a line file made less than [`STAND_BACK`]
    /// after one was found missing read as nobody: that costs a waiter
    /// windows of the holder's stretch, never the lock. Must not block.
    pub(crate) fn nobody_in_line(&self, dir: &File, name: &str) -> bool {
        if self.off {
            return false;
        }
        match self.bytes_of(dir, false) {
            // No line file (Windows): nobody has stood in line here.
            None => true,
            Some(dir) => !conflict(dir, region(name), HALF),
        }
    }

    /// Whether a waiter of another `Locker` stands in line for `name`
    /// right now, as far as the kernel shows ([`Self::ticket_in_line`]):
    /// `false` where the line is off, or (on Windows) there is no line
    /// file yet, where nobody can be seen. Must not block.
    pub(crate) fn someone_in_line(&self, dir: &File, name: &str) -> bool {
        !self.off
            && self
                .bytes_of(dir, false)
                .is_some_and(|dir| self.ticket_in_line(dir, region(name)))
    }

    /// Whether a ticket of another `Locker` that this one has not passed
    /// over stands in the line of the name whose region begins at
    /// `start`: a one-byte range (a range over more is no ticket, and what
    /// it may hide cannot be seen). One look when the kernel names such a
    /// ticket first; [`TICKET_LOOKS`] at most, after which it reads as
    /// none. What a fair `Locker` gives way to: bytes anyone who can read
    /// the directory holds cost it no more than they cost any other.
    fn ticket_in_line(&self, dir: &File, start: u64) -> bool {
        ticket_held(dir, start, start + HALF, &self.passed(), TICKET_LOOKS)
    }

    /// Whether this `Locker` stands back for an older waiter for `name`
    /// right now: then a release of the lock is not its business.
    pub(crate) fn behind(&self, dir: &File, name: &str) -> bool {
        // Asked by the watcher thread. While this `Locker`'s waiter is at
        // the line itself (joining it, or deciding whether to stand back,
        // often just woken by this very batch of events), waiting for it
        // would cost the waiter a futex wake on its way to the lock; a
        // wake is never wrong (the waiter looks again), so do not wait.
        let places = match self.places.try_lock() {
            Ok(places) => places,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        let Some(place) = places.get(name) else {
            return false;
        };
        let Some(dir) = self.bytes_of(dir, false) else {
            return false;
        };
        match (place.waiting, place.standing_back_until) {
            (Some(_), Some(until)) => {
                now_us() < until && place.ahead.iter().any(|&(s, e)| sys::ofd_held(dir, s, e))
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
