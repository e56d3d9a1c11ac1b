//! The line's own tests, on a real directory. They need the kernel's OFD
//! byte-range locks (`sys::byte_range_locks`): where there are none the
//! line does nothing, and there is nothing to test here.

use super::*;

/// A lock directory, opened as another `Locker` would: OFD locks
/// belong to an open file description, which a `dup` shares.
struct Dir(tempfile::TempDir);

impl Dir {
    /// `None` where the platform has no byte-range locks to line up with.
    fn new() -> Option<Self> {
        sys::byte_range_locks().then(|| Dir(tempfile::tempdir().unwrap()))
    }

    #[cfg(not(windows))]
    fn open(&self) -> File {
        File::open(self.0.path()).unwrap()
    }

    /// On Windows the line's bytes are in the line file: a handle of it
    /// of its own, as another `Locker` opens it.
    #[cfg(windows)]
    fn open(&self) -> File {
        let dir = sys::syscall::open_dir(self.0.path()).unwrap();
        sys::line_file(&dir, true).unwrap()
    }
}

fn anyone_waiting(dir: &File, name: &str) -> bool {
    conflict(dir, region(name), HALF)
}

#[test]
fn the_oldest_waiter_goes_first_and_the_others_stand_back_for_a_while() {
    let Some(dir) = Dir::new() else { return };
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
    let Some(dir) = Dir::new() else { return };
    let (a, b) = (dir.open(), dir.open());
    let (frozen, other) = (Lines::default(), Lines::default());
    frozen.wait_on(&a, "x.lock");
    std::thread::sleep(Duration::from_millis(1));
    other.wait_on(&b, "x.lock");
    // Free once: maybe a handoff in flight; look again soon.
    assert!(other.stand_back(&b, "x.lock", || None).is_some());
    std::thread::sleep(STAND_BACK + Duration::from_millis(1));
    assert_eq!(other.stand_back(&b, "x.lock", || None), Some(STAND_BACK / 4));
    // Free twice in a row: the older waiter is not taking it. It had its
    // chance: passed over, this wait and the next.
    std::thread::sleep(STAND_BACK / 4 + Duration::from_millis(1));
    assert_eq!(
        other.stand_back(&b, "x.lock", || None),
        None,
        "a frozen older waiter cannot keep the others off"
    );
    let lock = |ino| move || Some((1, ino));
    assert_eq!(other.stand_back(&b, "x.lock", lock(1)), None, "woken again");
    other.stopped_waiting(&b, "x.lock");
    other.wait_on(&b, "x.lock");
    assert_eq!(other.stand_back(&b, "x.lock", lock(1)), None, "the next wait");
    assert!(!other.behind(&b, "x.lock"));
    other.stopped_waiting(&b, "x.lock");
    // Another Locker has not passed it over yet. It stands back; a new
    // lock at each look is a line that moves, but not through the frozen
    // waiter: after CHANCES looks at a lock that moved, it had its chance.
    let third = Lines::default();
    let c = dir.open();
    third.wait_on(&c, "x.lock");
    assert!(third.stand_back(&c, "x.lock", lock(1)).is_some());
    std::thread::sleep(STAND_BACK + Duration::from_millis(1));
    for ino in 2..4 {
        assert_eq!(
            third.stand_back(&c, "x.lock", lock(ino)),
            Some(STAND_BACK),
            "{ino}"
        );
        std::thread::sleep(STAND_BACK + Duration::from_millis(1));
    }
    assert_eq!(
        third.stand_back(&c, "x.lock", lock(4)),
        None,
        "a frozen waiter kept the line off for good (or a looper's new locks did)"
    );
    // Passed over for good: the next wait does not stand back for it.
    third.stopped_waiting(&c, "x.lock");
    third.wait_on(&c, "x.lock");
    assert_eq!(third.stand_back(&c, "x.lock", lock(5)), None);
    assert!(!third.behind(&c, "x.lock"));
    third.stopped_waiting(&c, "x.lock");
    // A fourth has not passed it over yet.
    let fourth = Lines::default();
    let d = dir.open();
    fourth.wait_on(&d, "x.lock");
    assert!(fourth.stand_back(&d, "x.lock", lock(5)).is_some());
}

#[test]
fn a_waiter_stands_back_for_those_ahead_when_it_joined_and_afresh_when_one_leaves() {
    let Some(dir) = Dir::new() else { return };
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
    let Some(dir) = Dir::new() else { return };
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
fn a_holder_back_mid_turn_to_a_taken_lock_gives_its_mark_up() {
    let Some(dir) = Dir::new() else { return };
    let (h, w) = (dir.open(), dir.open());
    let (holder, waiter) = (Lines::default(), Lines::default());
    waiter.wait_on(&w, "x.lock");
    holder.acquired(&h, "x.lock");
    // Mid-turn releases, each a straight return, until one posts a mark
    // (a slow machine can take longer than a straight return).
    let marked = (0..10).any(|_| {
        holder.releasing(&h, "x.lock");
        let marked = holder.places()["x.lock"].turn_mark.is_some();
        if !marked {
            straight_back(&holder, "x.lock");
            assert_eq!(holder.stand_back(&h, "x.lock", || None), None, "within its turn");
            holder.acquired(&h, "x.lock");
        }
        marked
    });
    assert!(marked, "a holder that comes straight back posts a mark");
    // Back, it finds the lock taken (by the waiter, say) and waits: its
    // turn is over, and the line must not keep off the lock for it.
    straight_back(&holder, "x.lock");
    assert_eq!(holder.stand_back(&h, "x.lock", || None), None, "within its turn");
    holder.wait_on(&h, "x.lock");
    assert!(holder.places()["x.lock"].turn_mark.is_none());
    let marks = region("x.lock") + HALF;
    assert_eq!(
        first_held(&w, marks, region("x.lock") + REGION),
        None,
        "the mark's byte is gone"
    );
    holder.stopped_waiting(&h, "x.lock");
    waiter.stopped_waiting(&w, "x.lock");
}

#[test]
fn a_lock_that_stays_taken_behind_a_frozen_waiter_is_tried_all_the_same() {
    let Some(dir) = Dir::new() else { return };
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

/// Dates `lines`' last release of `name` now, in a turn just begun: a
/// holder that looks again within `HOLD_ON / 2` of its release came
/// straight back, and a slow machine (Wine) can take longer than that
/// between the end of `releasing` and the next call; the tests of what
/// follows a straight return say that it was one.
fn straight_back(lines: &Lines, name: &str) {
    let now = now_us();
    if let Some(place) = lines.places().get_mut(name) {
        place.released_at = place.released_at.map(|_| now);
        place.turn_since = place.turn_since.map(|_| now);
    }
}

#[test]
fn a_holder_keeps_its_turn_then_lets_the_line_in() {
    let Some(dir) = Dir::new() else { return };
    let (h, w) = (dir.open(), dir.open());
    let (holder, waiter) = (Lines::default(), Lines::default());
    // Nobody in line: releasing leaves nothing.
    holder.releasing(&h, "x.lock");
    assert_eq!(holder.stand_back(&h, "x.lock", || None), None);
    assert!(holder.places().is_empty());
    waiter.wait_on(&w, "x.lock");
    holder.acquired(&h, "x.lock");
    holder.releasing(&h, "x.lock");
    straight_back(&holder, "x.lock");
    assert_eq!(holder.stand_back(&h, "x.lock", || None), None, "within its turn");
    assert_eq!(
        waiter.stand_back(&w, "x.lock", || None),
        None,
        "no mark before it came back"
    );
    holder.acquired(&h, "x.lock");
    // It came straight back: now, mid-turn, the waiter leaves the lock
    // to the holder for a moment. (The mark says "back within 300 µs": a
    // slow machine, Wine's emulated byte-range locks, can take longer
    // than that from the release to the waiter's look, which then finds
    // the mark past. CI once did. A few rounds, each a straight return.)
    let back = (0..10)
        .find_map(|_| {
            holder.releasing(&h, "x.lock");
            let back = waiter.stand_back(&w, "x.lock", || None);
            if back.is_none() {
                straight_back(&holder, "x.lock");
                assert_eq!(holder.stand_back(&h, "x.lock", || None), None, "within its turn");
                holder.acquired(&h, "x.lock");
            }
            back
        })
        .expect("the holder comes back");
    assert!(back <= HOLD_ON, "{back:?}");
    holder.acquired(&h, "x.lock");
    assert_eq!(
        waiter.stand_back(&w, "x.lock", || None),
        None,
        "back: the mark is gone"
    );
    // A mark is honoured once, until the time it gave when first seen
    // (a wake-up meanwhile, by an event, does not end it): a byte kept
    // there for good (by a program that is not leasehold, say) cannot
    // keep the line off.
    let stuck = dir.open();
    let mark = region("x.lock") + REGION - 1;
    assert!(sys::ofd_take_byte(&stuck, mark));
    let seen = std::time::Instant::now();
    let first = waiter
        .stand_back(&w, "x.lock", || None)
        .expect("a mark for a time to come");
    assert!(first <= HOLD_ON, "{first:?}");
    // Woken early: still honoured (unless the look itself took longer
    // than the mark gave, as Wine's emulated locks can).
    match waiter.stand_back(&w, "x.lock", || None) {
        Some(again) => assert!(again <= first, "{again:?} after {first:?}"),
        None => assert!(seen.elapsed() >= first, "woken early, the mark not honoured"),
    }
    std::thread::sleep(first + Duration::from_millis(1));
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
    let Some(dir) = Dir::new() else { return };
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
    let Some(dir) = Dir::new() else { return };
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
    let Some(dir) = Dir::new() else { return };
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
    let Some(dir) = Dir::new() else { return };
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

/// A byte range another program holds over the line is one range, as the
/// kernel reports it: a waiter joining counts it once, with a few looks,
/// and still finds the ticket above it. (On Windows, where held bytes are
/// searched for, each byte of the range found after the one before looked
/// like a ticket of its own: 32 of them, a search of ~40 looks each, about
/// 60 ms a join under Wine.)
#[test]
fn a_byte_range_held_over_the_line_counts_once() {
    let Some(dir) = Dir::new() else { return };
    let (w, late) = (dir.open(), dir.open());
    let start = region("x.lock");
    let ticket = start + 5_000;
    // From below the region to past it; and inside it, below a ticket
    // (Windows' ranges are exclusive: none can be taken inside one).
    for (from, len) in [(0, 1 << 62), (start + 100, 1_000)] {
        let other = dir.open();
        assert!(sys::ofd_read_lock(&other, from, len));
        let ticket_taken = from > 0 && sys::ofd_take_byte(&late, ticket);
        let started = std::time::Instant::now();
        let (ahead, _) = tickets(&w, start, start + 10_000, &VecDeque::new());
        let took = started.elapsed();
        let spans = &ahead.found;
        assert!(
            spans.len() <= 1 + usize::from(ticket_taken),
            "{} spans in {took:?}: {spans:?}",
            spans.len()
        );
        if from > 0 {
            assert!(ticket_taken);
            assert!(spans.iter().any(|&(s, e)| s <= ticket && ticket < e), "{spans:?}");
            sys::ofd_drop_byte(&late, ticket);
        }
    }
}

#[test]
fn a_permit_given_back_keeps_the_ticket_of_a_waiter_of_the_same_locker() {
    let Some(dir) = Dir::new() else { return };
    let (ours, other) = (dir.open(), dir.open());
    let lines = Lines::default();
    // One task of the `Locker` holds a permit, another waits in line for
    // one; nobody else waits. The kernel does not show us our own ticket.
    lines.acquired(&ours, "s.lock");
    lines.wait_on(&ours, "s.lock");
    assert!(anyone_waiting(&other, "s.lock"));
    lines.releasing_permit(&ours, "s.lock");
    // The waiter takes the permit given back: its ticket goes.
    lines.acquired(&ours, "s.lock");
    assert!(
        !anyone_waiting(&other, "s.lock"),
        "a ticket left held for the Locker's life"
    );
}

#[test]
fn a_fair_holder_lets_the_line_in_at_every_release() {
    let Some(dir) = Dir::new() else { return };
    let (f, u, w) = (dir.open(), dir.open(), dir.open());
    let fair = Lines {
        fair: true,
        ..Lines::default()
    };
    let (unfair, waiter) = (Lines::default(), Lines::default());
    waiter.wait_on(&w, "x.lock");
    assert!(fair.someone_in_line(&f, "x.lock"));
    // Nobody in line: either one keeps the lock, fair or not.
    assert!(!fair.someone_in_line(&f, "y.lock"));
    fair.acquired(&f, "y.lock");
    fair.releasing(&f, "y.lock");
    assert_eq!(fair.stand_back(&f, "y.lock", || None), None);
    // Someone in line: the unfair holder goes on with its turn...
    unfair.acquired(&u, "x.lock");
    unfair.releasing(&u, "x.lock");
    assert_eq!(unfair.stand_back(&u, "x.lock", || None), None, "within its turn");
    unfair.stopped_waiting(&u, "x.lock");
    // ...and the fair one, after one acquisition, waits behind the line.
    fair.acquired(&f, "x.lock");
    fair.releasing(&f, "x.lock");
    let back = fair
        .stand_back(&f, "x.lock", || None)
        .expect("behind the waiter already in line");
    assert!(back <= STAND_BACK, "{back:?}");
    assert!(
        waiter.someone_in_line(&w, "x.lock"),
        "the fair holder is in line too"
    );
    fair.stopped_waiting(&f, "x.lock");
    waiter.stopped_waiting(&w, "x.lock");
    assert!(!fair.someone_in_line(&f, "x.lock"), "nobody left in line");
}

#[test]
fn a_fair_holder_gives_way_to_tickets_not_to_ranges_anyone_can_hold() {
    let Some(dir) = Dir::new() else { return };
    let (f, other, w) = (dir.open(), dir.open(), dir.open());
    let fair = Lines {
        fair: true,
        ..Lines::default()
    };
    // A read lock over the whole byte range: no ticket, and what it may
    // hide cannot be seen. The fair holder keeps its turn, as any would.
    assert!(sys::ofd_read_lock(&other, 0, 1 << 62));
    assert!(!fair.someone_in_line(&f, "x.lock"));
    fair.acquired(&f, "x.lock");
    fair.releasing(&f, "x.lock");
    assert_eq!(fair.stand_back(&f, "x.lock", || None), None, "within its turn");
    fair.stopped_waiting(&f, "x.lock");
    drop(other);
    // A waiter's ticket ends the turn at once.
    let waiter = Lines::default();
    waiter.wait_on(&w, "x.lock");
    assert!(fair.someone_in_line(&f, "x.lock"));
    fair.acquired(&f, "x.lock");
    fair.releasing(&f, "x.lock");
    assert!(fair.places()["x.lock"].rejoin, "the turn is over");
    fair.stopped_waiting(&f, "x.lock");
    // Not one this `Locker` passed over: it had its chances, and ending
    // every turn for it would cost each acquisition a rejoin for as long
    // as its bytes stay (a frozen process, anyone who can read the
    // directory: tests/attack_line_frozen.rs).
    let ticket = sys::ofd_held_span(&f, region("x.lock"), region("x.lock") + HALF).unwrap();
    fair.pass_over(&[ticket]);
    assert!(!fair.someone_in_line(&f, "x.lock"), "passed over");
    fair.acquired(&f, "x.lock");
    fair.releasing(&f, "x.lock");
    assert!(!fair.places()["x.lock"].rejoin, "within its turn");
    fair.stopped_waiting(&f, "x.lock");
    // A ticket and a range over everything, taken after it (the kernel
    // names the ticket first): the turn ends for the ticket, and the
    // next attempt stands back for it as any waiter would, without the
    // pause a holder takes for waiters a range may hide. (Not on
    // Windows, where the line's bytes are exclusive locks: no range can
    // be taken over a ticket there.)
    #[cfg(not(windows))]
    fair_beside_a_ticket_and_a_range(&dir);
    waiter.stopped_waiting(&w, "x.lock");
}

#[cfg(not(windows))]
fn fair_beside_a_ticket_and_a_range(dir: &Dir) {
    let fresh = Lines {
        fair: true,
        ..Lines::default()
    };
    let g = dir.open();
    let over = dir.open();
    assert!(sys::ofd_read_lock(&over, 0, 1 << 62));
    fresh.acquired(&g, "x.lock");
    fresh.releasing(&g, "x.lock");
    if fresh.places()["x.lock"].rejoin {
        let back = fresh
            .stand_back(&g, "x.lock", || None)
            .expect("behind the ticket");
        assert!(back <= STAND_BACK, "{back:?}");
        assert_eq!(
            fresh.places()["x.lock"].courtesy_until,
            None,
            "no pause for hidden waiters"
        );
    }
    fresh.stopped_waiting(&g, "x.lock");
    drop(over);
}

#[test]
fn waits_for_marks_are_charged_the_time_they_really_take() {
    let Some(dir) = Dir::new() else { return };
    let (w, squat) = (dir.open(), dir.open());
    let waiter = Lines::default();
    waiter.wait_on(&w, "x.lock");
    let marks = region("x.lock") + HALF;
    // Marks that ask for little, each looked at again long after: the
    // time off the lock, not what each mark asked for, uses up the
    // acquisition's `MARKS`.
    let mut honoured = 0;
    for i in 0..1_000 {
        let mark = marks + units_now() + 2 + i;
        assert!(sys::ofd_take_byte(&squat, mark));
        let back = waiter.stand_back(&w, "x.lock", || None);
        sys::ofd_drop_byte(&squat, mark);
        match back {
            Some(back) => {
                assert!(back <= HOLD_ON, "{back:?}");
                honoured += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            None => break,
        }
    }
    let most = (MARKS.as_millis() / 2 + 1) as usize;
    assert!(
        honoured <= most,
        "{honoured} marks honoured, each 2 ms off the lock"
    );
    waiter.stopped_waiting(&w, "x.lock");
}
