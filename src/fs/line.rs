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
//! - **Waiters stand in line on the lock file.** A process that finds the
//!   lock held takes an OFD read lock (`fcntl(F_OFD_SETLK)`, which is
//!   independent of `flock` and of every lock other programs take) on one
//!   byte of the holder's lock file, at an offset equal to its *ticket*:
//!   the boot-clock microsecond at which it began to wait. The kernel drops
//!   it when the waiter closes the file, stops waiting or dies.
//! - **The oldest waiter goes first.** Woken by a release, a waiter asks
//!   the kernel (`F_OFD_GETLK`) whether anyone holds a byte below its own
//!   ticket on the file it stands on. If so, it stands back for
//!   [`STAND_BACK`] and lets the older waiter create the lock first; then it
//!   tries all the same, so a waiter that is slow or frozen delays the
//!   others by that much at most, and never blocks them.
//! - **A holder lets waiters in.** Releasing, the holder asks the kernel
//!   whether anyone stands in line on its file. If someone does and its
//!   turn has lasted [`TURN`] or longer, it stands back for [`STAND_BACK`]
//!   before taking the lock again, and then joins the line at its end.
//!   Within a turn it may take the lock again at once, which keeps the
//!   throughput of back-to-back acquisitions.
//!
//! The line decides only *when* a process tries to create the lock file,
//! never whether a creation or reclaim is safe: every rule of exclusion
//! stands as it was, and a line in disarray (a waiter frozen, a ticket from
//! another time namespace, a platform without OFD locks) costs fairness,
//! never exclusion. Only the exclusive lock of the exclusive-file layout
//! has a line; `try_acquire` never stands back.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;
use std::time::Duration;

use crate::sys;

/// How long a waiter lets an older one go first, and a holder whose turn
/// is over keeps off the lock it released: several times what a woken
/// waiter takes to create the lock, so that it is rarely cut short.
pub(crate) const STAND_BACK: Duration = Duration::from_millis(2);

/// How long a holder may keep taking the lock again while others wait.
pub(crate) const TURN: Duration = Duration::from_millis(2);

/// The line's state of each name this `Locker` waits for or holds in turn.
#[derive(Debug, Default)]
pub(crate) struct Lines {
    places: Mutex<HashMap<Box<str>, Place>>,
}

#[derive(Debug, Default)]
struct Place {
    /// The ticket this `Locker` waits with, and the lock file it stands
    /// on (holding the byte at the ticket).
    waiting: Option<(u64, File)>,
    /// Standing back for an older waiter until then (boot-clock µs).
    standing_back_until: Option<u64>,
    /// Keeping off after a turn that ended with waiters in line, until
    /// then (boot-clock µs).
    yielding_until: Option<u64>,
    /// When the current turn began (boot-clock µs).
    turn_since: Option<u64>,
}

impl Lines {
    /// Stands in line on `file`, the lock file of `name` found held.
    pub(crate) fn wait_on(&self, name: &str, file: &File) {
        let mut places = self.places();
        let place = places.entry(name.into()).or_default();
        let now = now_us();
        let ticket = place.waiting.as_ref().map_or(now, |(ticket, _)| *ticket);
        if let Some((_, standing_on)) = &place.waiting
            && same_file(standing_on, file)
        {
            return;
        }
        // A new lock file: stand on it with the same ticket (the old one's
        // byte goes when its descriptor closes).
        place.waiting = file
            .try_clone()
            .ok()
            .filter(|copy| take_byte(copy, ticket))
            .map(|copy| (ticket, copy));
    }

    /// How long to keep off the free lock `name` before trying it: `None`
    /// to try now.
    pub(crate) fn stand_back(&self, name: &str) -> Option<Duration> {
        let mut places = self.places();
        let place = places.get_mut(name)?;
        let now = now_us();
        if let Some(until) = place.yielding_until {
            if now < until {
                return Some(Duration::from_micros(until - now));
            }
            place.yielding_until = None;
        }
        let Some((ticket, standing_on)) = &place.waiting else {
            return None;
        };
        if !older_waiter(standing_on, *ticket) {
            place.standing_back_until = None;
            return None;
        }
        let until = *place
            .standing_back_until
            .get_or_insert(now.saturating_add(duration_us(STAND_BACK)));
        (now < until).then(|| Duration::from_micros(until - now))
    }

    /// `name` is ours: leave the line, and start a turn if none is on.
    pub(crate) fn acquired(&self, name: &str) {
        let mut places = self.places();
        if places.is_empty() {
            return;
        }
        if let Some(place) = places.get_mut(name) {
            place.waiting = None;
            place.standing_back_until = None;
            place.yielding_until = None;
            place.turn_since.get_or_insert_with(now_us);
        }
    }

    /// The acquisition of `name` stopped waiting without the lock (timed
    /// out, cancelled, failed): leave the line.
    pub(crate) fn stopped_waiting(&self, name: &str) {
        let mut places = self.places();
        if let Some(place) = places.get_mut(name) {
            place.waiting = None;
            place.standing_back_until = None;
            if place.turn_since.is_none() && place.yielding_until.is_none() {
                places.remove(name);
            }
        }
    }

    /// `name` is being released through `file`, its lock file: if others
    /// stand in line and this turn has lasted long enough, keep off the
    /// lock for a while. Costs one `fcntl` when nobody waits.
    pub(crate) fn releasing(&self, name: &str, file: &File) {
        let waiters = anyone_waiting(file);
        let mut places = self.places();
        if !waiters {
            // The turn ends with nobody in line.
            if !places.is_empty() {
                places.remove(name);
            }
            return;
        }
        let now = now_us();
        let place = places.entry(name.into()).or_default();
        let since = *place.turn_since.get_or_insert(now);
        if now.saturating_sub(since) >= duration_us(TURN) {
            place.turn_since = None;
            place.yielding_until = Some(now.saturating_add(duration_us(STAND_BACK)));
        }
    }

    fn places(&self) -> std::sync::MutexGuard<'_, HashMap<Box<str>, Place>> {
        // Nothing here is left torn by a panic.
        self.places.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn now_us() -> u64 {
    sys::boot_clock_us()
}

fn duration_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn same_file(a: &File, b: &File) -> bool {
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(target_os = "linux")]
fn range(kind: i32, start: u64, len: u64) -> Option<nix::libc::flock> {
    Some(nix::libc::flock {
        l_type: i16::try_from(kind).ok()?,
        l_whence: i16::try_from(nix::libc::SEEK_SET).ok()?,
        l_start: i64::try_from(start).ok()?,
        l_len: i64::try_from(len).ok()?,
        // Must be 0 for OFD locks.
        l_pid: 0,
    })
}

/// Holds the byte at `ticket` of `file` (a read lock, so any number of
/// waiters can share a ticket).
#[cfg(target_os = "linux")]
fn take_byte(file: &File, ticket: u64) -> bool {
    use nix::fcntl::{FcntlArg, fcntl};
    range(nix::libc::F_RDLCK, ticket, 1).is_some_and(|lock| fcntl(file, FcntlArg::F_OFD_SETLK(&lock)).is_ok())
}

/// Whether another open file description holds a byte of `file` below
/// `ticket`: a waiter older than us.
#[cfg(target_os = "linux")]
fn older_waiter(file: &File, ticket: u64) -> bool {
    ticket > 0 && conflict(file, 0, ticket)
}

/// Whether anyone else stands in line on `file`.
#[cfg(target_os = "linux")]
fn anyone_waiting(file: &File) -> bool {
    // Length 0: to the end of any file.
    conflict(file, 0, 0)
}

#[cfg(target_os = "linux")]
fn conflict(file: &File, start: u64, len: u64) -> bool {
    use nix::fcntl::{FcntlArg, fcntl};
    let Some(mut lock) = range(nix::libc::F_WRLCK, start, len) else {
        return false;
    };
    fcntl(file, FcntlArg::F_OFD_GETLK(&mut lock)).is_ok() && i32::from(lock.l_type) != nix::libc::F_UNLCK
}

#[cfg(not(target_os = "linux"))]
fn take_byte(_file: &File, _ticket: u64) -> bool {
    false
}

#[cfg(not(target_os = "linux"))]
fn older_waiter(_file: &File, _ticket: u64) -> bool {
    false
}

#[cfg(not(target_os = "linux"))]
fn anyone_waiting(_file: &File) -> bool {
    false
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// A lock file, and a way to open it as another process would: OFD
    /// locks belong to an open file description, which a `dup` shares.
    struct LockFile(tempfile::TempDir);

    impl LockFile {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("x.lock"), b"{}").unwrap();
            LockFile(dir)
        }

        fn open(&self) -> File {
            File::open(self.0.path().join("x.lock")).unwrap()
        }
    }

    #[test]
    fn the_oldest_waiter_goes_first_and_the_others_stand_back_for_a_while() {
        let file = LockFile::new();
        let holder = file.open();
        let (older, younger) = (Lines::default(), Lines::default());
        older.wait_on("x", &file.open());
        std::thread::sleep(Duration::from_millis(1));
        younger.wait_on("x", &file.open());
        assert!(anyone_waiting(&holder));
        assert_eq!(older.stand_back("x"), None, "the oldest tries at once");
        let back = younger.stand_back("x").expect("an older waiter is in line");
        assert!(back <= STAND_BACK, "{back:?}");
        // The older one leaves the line (it took the lock, or gave up):
        // the younger may go.
        older.acquired("x");
        assert_eq!(younger.stand_back("x"), None);
    }

    #[test]
    fn a_waiter_stands_back_at_most_for_the_stand_back_time() {
        let file = LockFile::new();
        let (frozen, other) = (Lines::default(), Lines::default());
        frozen.wait_on("x", &file.open());
        std::thread::sleep(Duration::from_millis(1));
        other.wait_on("x", &file.open());
        assert!(other.stand_back("x").is_some());
        std::thread::sleep(STAND_BACK + Duration::from_millis(1));
        assert_eq!(
            other.stand_back("x"),
            None,
            "a frozen older waiter cannot keep the others off"
        );
    }

    #[test]
    fn a_holder_keeps_its_turn_then_lets_the_line_in() {
        let file = LockFile::new();
        let holder_file = file.open();
        let (holder, waiter) = (Lines::default(), Lines::default());
        // Nobody in line: releasing costs nothing and leaves nothing.
        holder.releasing("x", &holder_file);
        assert_eq!(holder.stand_back("x"), None);
        assert!(holder.places().is_empty());
        waiter.wait_on("x", &file.open());
        holder.acquired("x");
        holder.releasing("x", &holder_file);
        assert_eq!(holder.stand_back("x"), None, "within its turn");
        std::thread::sleep(TURN);
        holder.releasing("x", &holder_file);
        let back = holder
            .stand_back("x")
            .expect("its turn is over and someone waits");
        assert!(back <= STAND_BACK);
        // Leaving the line drops the waiter's byte.
        waiter.stopped_waiting("x");
        assert!(!anyone_waiting(&holder_file));
        assert!(waiter.places().is_empty());
    }

    #[test]
    fn a_new_lock_file_carries_the_ticket_over() {
        let (first, second) = (LockFile::new(), LockFile::new());
        let (older, younger) = (Lines::default(), Lines::default());
        older.wait_on("x", &first.open());
        std::thread::sleep(Duration::from_millis(1));
        younger.wait_on("x", &second.open());
        // The lock changed hands: the older waiter now stands on the new
        // file, still older.
        older.wait_on("x", &second.open());
        assert!(
            !anyone_waiting(&first.open()),
            "the old file's byte went with its descriptor"
        );
        assert!(younger.stand_back("x").is_some());
        assert_eq!(older.stand_back("x"), None);
    }
}
