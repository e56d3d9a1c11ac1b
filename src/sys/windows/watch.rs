//! The directory watcher of Windows: `ReadDirectoryChangesW` on the lock
//! directory and everything below it (a members directory too), read by
//! one thread per `Locker`, as inotify's is on Linux. A name added,
//! removed or renamed, or a file written, is `Changed(<the entry of the
//! lock directory it is in>)`; a lost batch (the buffer overflowed) is
//! `Overflow`; a directory that can no longer be read is `Gone`.
//!
//! A holder's death changes no entry on Windows (closing a handle is no
//! directory change), so the same thread also waits on the processes of
//! the holders that waiters name (`DirWatch::watch_deaths`): a process
//! handle is signalled when the process ends, however it ends, and its
//! end is `Changed(<the lock's entry>)`. Up to `MAX_PROCESSES` processes
//! at once (a wait takes at most 64 handles); past that the oldest is let
//! go and its waiters woken: named again while the table is full, it is
//! not watched, and they poll at their interval.
//!
//! Dropping the watch stops the thread and waits for it: its handle of
//! the directory is closed before the drop returns (Windows does not
//! remove a directory while a handle of it is open).

#![allow(unsafe_code)]

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::os::windows::ffi::OsStringExt;
use std::os::windows::fs::OpenOptionsExt;
use std::os::windows::io::AsRawHandle;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use windows_sys::Win32::Foundation as win;
use windows_sys::Win32::Storage::FileSystem as fs;
use windows_sys::Win32::System::IO::{CancelIoEx, GetOverlappedResult, OVERLAPPED};
use windows_sys::Win32::System::Threading as threading;

use super::super::DirEvent;
use super::{Process, syscall};

/// How long the thread waits for an event before it reports `Idle`.
const IDLE: Duration = Duration::from_millis(500);

/// The bytes of one batch of directory changes.
const BUF_LEN: usize = 64 * 1024;

/// The handles a wait takes besides the processes: the stop, the
/// directory's changes and the table's change.
const OWN_HANDLES: usize = 3;

/// How many processes one watch waits on at once: what one
/// `WaitForMultipleObjects` takes (`MAXIMUM_WAIT_OBJECTS`, 64) less its
/// own handles.
const MAX_PROCESSES: usize = 64 - OWN_HANDLES;

/// A holder's process the watch waits on, and the entries of the lock
/// directory whose waiters its end wakes.
struct Watched {
    pid: u64,
    process: Process,
    entries: Vec<String>,
    /// Named for more than `MAX_ENTRIES` entries: its end wakes every
    /// waiter (`Overflow`) rather than those of `entries` alone.
    every: bool,
}

/// How many entries are kept for one process: past that its end is
/// reported as `Overflow`, so that a long-lived holder named for ever more
/// lock names (a sibling service's per-job locks) does not grow the table
/// without end.
const MAX_ENTRIES: usize = 64;

/// The processes the watch waits on. Waiters add to it; only the watch's
/// thread removes from it (and so closes a handle), never while it waits
/// on them.
#[derive(Default)]
struct Deaths {
    watched: Vec<Watched>,
    /// Entries whose named holder had no process any more when named (it
    /// died after its waiter found it holding): reported changed at once.
    ended: Vec<String>,
    /// The pids and entries so reported lately (at most `TOLD`): a pid
    /// named again for the same entry is not reported again, so that a
    /// record naming a pid that is no process while something else keeps
    /// its lock cannot make its waiters spin; they poll instead.
    told: std::collections::VecDeque<(u64, String)>,
    /// Pids let go lately because the table was full (at most `TOLD`):
    /// named again while it is still full, they are not watched (their
    /// waiters poll) rather than let another go in their place, which
    /// would wake that one's waiters to do the same, round and round.
    let_go: std::collections::VecDeque<u64>,
}

/// How many reports of holders found dead when named are remembered.
const TOLD: usize = 64;

/// An event object, closed when dropped.
#[derive(Debug)]
struct Event(win::HANDLE);

// SAFETY: an event handle may be used and closed from any thread.
unsafe impl Send for Event {}
// SAFETY: as above; `SetEvent` and waits are thread-safe.
unsafe impl Sync for Event {}

impl Event {
    fn new(manual_reset: bool) -> Option<Event> {
        // SAFETY: no security attributes, no name: a fresh unnamed event.
        let handle = unsafe {
            threading::CreateEventW(std::ptr::null(), i32::from(manual_reset), 0, std::ptr::null())
        };
        (!handle.is_null()).then_some(Event(handle))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: created by `Event::new`, closed once.
            unsafe { win::CloseHandle(self.0) };
        }
    }
}

/// An overlapped operation in flight on `file`: its OVERLAPPED (boxed, so
/// that it does not move while the kernel holds it) and its event.
struct Pending {
    file: File,
    overlapped: Box<OVERLAPPED>,
    event: Event,
}

// SAFETY: the OVERLAPPED's raw event handle is owned by `event`, which
// moves with it; handles and events may be used from any thread, and the
// watch's thread is the only one that touches a `Pending` once made.
unsafe impl Send for Pending {}

impl Pending {
    fn new(file: File) -> Option<Pending> {
        let event = Event::new(true)?;
        // SAFETY: an all-zero OVERLAPPED is valid.
        let mut overlapped: Box<OVERLAPPED> = Box::new(unsafe { std::mem::zeroed() });
        overlapped.hEvent = event.0;
        Some(Pending {
            file,
            overlapped,
            event,
        })
    }

    /// Cancels the operation and waits, up to a second, until the kernel
    /// is done with the OVERLAPPED (and the buffer), so that both can be
    /// freed; `false` if it was not done by then (Wine does not always
    /// cancel a directory read): then they must be leaked, as closing the
    /// handle still completes the operation later.
    fn cancel(&mut self) -> bool {
        let handle = self.file.as_raw_handle();
        // SAFETY: `handle` is open while `self.file` lives; the OVERLAPPED
        // is the one the operation was started with; its event lives while
        // `self.event` does.
        unsafe {
            CancelIoEx(handle, &*self.overlapped);
            threading::WaitForSingleObject(self.event.0, 1000) == win::WAIT_OBJECT_0
        }
    }
}

/// The directory's changes, read into a buffer the kernel fills.
struct Changes {
    op: Pending,
    /// Whether a read is in flight (the kernel may write into the buffer).
    reading: bool,
    /// DWORD-aligned, as `ReadDirectoryChangesW` requires.
    buf: Box<[u32]>,
}

impl Changes {
    fn open(dir: &std::path::Path) -> Option<Changes> {
        let file = OpenOptions::new()
            .access_mode(fs::FILE_LIST_DIRECTORY)
            .share_mode(fs::FILE_SHARE_READ | fs::FILE_SHARE_WRITE | fs::FILE_SHARE_DELETE)
            .custom_flags(fs::FILE_FLAG_BACKUP_SEMANTICS | fs::FILE_FLAG_OVERLAPPED)
            .open(dir)
            .ok()?;
        let mut changes = Changes {
            op: Pending::new(file)?,
            reading: false,
            buf: vec![0u32; BUF_LEN / 4].into_boxed_slice(),
        };
        changes.read().then_some(changes)
    }

    /// Starts the next read; whether it started.
    fn read(&mut self) -> bool {
        let filter = fs::FILE_NOTIFY_CHANGE_FILE_NAME
            | fs::FILE_NOTIFY_CHANGE_DIR_NAME
            | fs::FILE_NOTIFY_CHANGE_LAST_WRITE;
        // SAFETY: the handle is open for overlapped I/O while `op.file`
        // lives; the buffer and the OVERLAPPED are boxed, outlive the read
        // (it is cancelled and waited for before they are freed), and the
        // buffer's length is passed.
        self.reading = unsafe {
            threading::ResetEvent(self.op.event.0);
            fs::ReadDirectoryChangesW(
                self.op.file.as_raw_handle(),
                self.buf.as_mut_ptr().cast(),
                u32::try_from(BUF_LEN).unwrap_or(0),
                1,
                filter,
                std::ptr::null_mut(),
                &mut *self.op.overlapped,
                None,
            ) != 0
        };
        self.reading
    }

    /// The entries of the lock directory that the finished read names
    /// (the first component of each path); `None` if events were lost.
    fn take(&mut self) -> Option<Vec<OsString>> {
        self.reading = false;
        let mut len = 0u32;
        // SAFETY: the read finished (its event is set); this only collects
        // its result.
        let ok =
            unsafe { GetOverlappedResult(self.op.file.as_raw_handle(), &*self.op.overlapped, &mut len, 0) }
                != 0;
        let len = usize::try_from(len).unwrap_or(0).min(BUF_LEN);
        if !ok || len == 0 {
            return None;
        }
        // SAFETY: the kernel wrote `len` bytes into `buf`, which is at
        // least that long; they are read as bytes.
        let bytes = unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast::<u8>(), len) };
        Some(notified_names(bytes))
    }
}

impl Drop for Changes {
    fn drop(&mut self) {
        if self.reading && !self.op.cancel() {
            // The kernel may still write into these when the handle, closed
            // right after this, completes the read: they are never freed.
            let overlapped = std::mem::replace(&mut self.op.overlapped, Box::new(OVERLAPPED::default()));
            let event = std::mem::replace(&mut self.op.event, Event(std::ptr::null_mut()));
            Box::leak(overlapped);
            Box::leak(std::mem::take(&mut self.buf));
            std::mem::forget(event);
        }
    }
}

/// The names in a batch of `FILE_NOTIFY_INFORMATION` records: each
/// record's path up to its first separator. Read field by field, little
/// end first, from any alignment (Wine does not align them).
fn notified_names(bytes: &[u8]) -> Vec<OsString> {
    let u32_at =
        |at: usize| -> Option<u32> { Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?)) };
    let mut names = Vec::new();
    let mut at = 0usize;
    while let (Some(next), Some(name_len)) = (u32_at(at), u32_at(at + 8)) {
        let start = at + 12;
        let end = start.saturating_add(usize::try_from(name_len).unwrap_or(usize::MAX));
        let Some(name) = bytes.get(start..end) else {
            break;
        };
        let units: Vec<u16> = name
            .chunks_exact(2)
            .map(|pair| u16::from_le_bytes([pair[0], pair[1]]))
            .take_while(|&unit| unit != u16::from(b'\\') && unit != u16::from(b'/'))
            .collect();
        if !units.is_empty() {
            names.push(OsString::from_wide(&units));
        }
        if next == 0 {
            break;
        }
        at = at.saturating_add(usize::try_from(next).unwrap_or(usize::MAX));
    }
    names
}

/// A running watch; dropping it stops its thread and waits for it.
pub(crate) struct DirWatch {
    stop: Arc<Event>,
    stopping: Arc<AtomicBool>,
    /// Set when a waiter adds to `deaths`, so that the thread waits anew.
    added: Arc<Event>,
    deaths: Arc<Mutex<Deaths>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for DirWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirWatch").finish_non_exhaustive()
    }
}

impl DirWatch {
    /// Everything below the lock directory is watched already.
    pub(crate) fn watch_child(&self, _name: &str) -> bool {
        true
    }

    /// Waits on the processes `pids` too (holders of the lock whose entry
    /// in the lock directory is `entry`): when one ends, `entry` is
    /// reported changed. Whether every one of them is watched: a pid that
    /// cannot be opened (gone already, another user's, no process id of
    /// Windows) is not, and its waiter must poll.
    pub(crate) fn watch_deaths(&self, entry: &str, pids: &[u64]) -> bool {
        let mut deaths = self.deaths.lock().unwrap_or_else(|e| e.into_inner());
        let mut all = true;
        let mut added = false;
        for &pid in pids {
            if let Some(watched) = deaths.watched.iter_mut().find(|w| w.pid == pid) {
                if !watched.every && !watched.entries.iter().any(|e| e == entry) {
                    if watched.entries.len() == MAX_ENTRIES {
                        watched.entries = Vec::new();
                        watched.every = true;
                    } else {
                        watched.entries.push(entry.to_owned());
                    }
                }
                continue;
            }
            if deaths.watched.len() >= MAX_PROCESSES && deaths.let_go.contains(&pid) {
                all = false;
                continue;
            }
            // Windows ignores a process id's two low bits: such an id names
            // no process of its own (see `probe`).
            match pid.is_multiple_of(4).then(|| Process::open(pid)) {
                Some(Ok(process)) => {
                    deaths.watched.push(Watched {
                        pid,
                        process,
                        entries: vec![entry.to_owned()],
                        every: false,
                    });
                    added = true;
                }
                // No process has the id: the holder died between its
                // waiter's look and this (once its last handle closed).
                // Nothing will signal its end, and the waiter, told that
                // it is not watched, would sleep a whole poll interval
                // though its holder is dead: its end is reported at once,
                // as if waited on (once for the pid and the entry).
                Some(Err(win::ERROR_INVALID_PARAMETER))
                    if pid != 0
                        && u32::try_from(pid).is_ok()
                        && !deaths.told.iter().any(|(p, e)| *p == pid && e == entry) =>
                {
                    if deaths.told.len() == TOLD {
                        deaths.told.pop_front();
                    }
                    deaths.told.push_back((pid, entry.to_owned()));
                    deaths.ended.push(entry.to_owned());
                    added = true;
                }
                _ => all = false,
            }
        }
        drop(deaths);
        if added {
            // SAFETY: the event lives while `self.added` does.
            unsafe { threading::SetEvent(self.added.0) };
        }
        all
    }
}

impl Drop for DirWatch {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        // SAFETY: the event lives while `self.stop` does.
        unsafe { threading::SetEvent(self.stop.0) };
        if let Some(thread) = self.thread.take()
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }
}

/// Starts watching `dir`; `None` if it cannot be.
pub(crate) fn watch_dir(
    dir: &File,
    mut on_event: Box<dyn FnMut(DirEvent<'_>) -> bool + Send>,
) -> Option<DirWatch> {
    let path = syscall::path_of(dir).ok()?;
    let changes = Changes::open(&path)?;
    let stop = Arc::new(Event::new(true)?);
    let added = Arc::new(Event::new(false)?);
    let stopping = Arc::new(AtomicBool::new(false));
    let deaths = Arc::new(Mutex::new(Deaths::default()));
    let watch = Watch {
        changes,
        stop: Arc::clone(&stop),
        stopping: Arc::clone(&stopping),
        added: Arc::clone(&added),
        deaths: Arc::clone(&deaths),
    };
    let thread = std::thread::Builder::new()
        .name("leasehold-watch".into())
        .spawn(move || watch.run(&mut *on_event))
        .ok()?;
    Some(DirWatch {
        stop,
        stopping,
        added,
        deaths,
        thread: Some(thread),
    })
}

/// What the watch's thread owns and shares.
struct Watch {
    changes: Changes,
    stop: Arc<Event>,
    stopping: Arc<AtomicBool>,
    added: Arc<Event>,
    deaths: Arc<Mutex<Deaths>>,
}

// SAFETY: `Changes` is moved to the thread whole and used only there; the
// processes' handles may be waited on and closed from any thread.
unsafe impl Send for Watch {}

impl Watch {
    fn run(mut self, on_event: &mut dyn FnMut(DirEvent<'_>) -> bool) {
        let wait_ms = u32::try_from(IDLE.as_millis()).unwrap_or(u32::MAX);
        while !self.stopping.load(Ordering::Relaxed) {
            let (handles, let_go) = self.handles();
            let woken = let_go.iter().all(|watched| match watched.every {
                true => on_event(DirEvent::Overflow),
                false => watched
                    .entries
                    .iter()
                    .all(|entry| on_event(DirEvent::Changed(entry.as_ref()))),
            });
            if !woken {
                return;
            }
            let count = u32::try_from(handles.len()).unwrap_or(0);
            // SAFETY: every handle lives across the wait: the events are
            // owned by `self`, and the processes by `self.deaths`, from
            // which only this thread removes (and so closes) any.
            let woke = unsafe { threading::WaitForMultipleObjects(count, handles.as_ptr(), 0, wait_ms) };
            let delivered = match woke {
                win::WAIT_TIMEOUT => on_event(DirEvent::Idle),
                win::WAIT_OBJECT_0 => return,
                _ if woke == win::WAIT_OBJECT_0 + 1 => {
                    let delivered = match self.changes.take() {
                        Some(names) => names.iter().all(|name| on_event(DirEvent::Changed(name))),
                        None => on_event(DirEvent::Overflow),
                    };
                    if delivered && !self.changes.read() {
                        let _ = on_event(DirEvent::Gone);
                        return;
                    }
                    delivered
                }
                // A waiter added a process: wait anew, on it too; and
                // report the holders found dead when named.
                _ if woke == win::WAIT_OBJECT_0 + 2 => {
                    let ended =
                        std::mem::take(&mut self.deaths.lock().unwrap_or_else(|e| e.into_inner()).ended);
                    ended
                        .iter()
                        .all(|entry| on_event(DirEvent::Changed(entry.as_ref())))
                }
                _ if woke >= win::WAIT_OBJECT_0 + 3 && woke < win::WAIT_OBJECT_0 + count => {
                    let at = usize::try_from(woke - win::WAIT_OBJECT_0).unwrap_or(0) - OWN_HANDLES;
                    match self.remove(at) {
                        Some(ended) => ended
                            .iter()
                            .all(|entry| on_event(DirEvent::Changed(entry.as_ref()))),
                        None => on_event(DirEvent::Overflow),
                    }
                }
                // The wait itself failed: the watch cannot go on.
                _ => {
                    let _ = on_event(DirEvent::Gone);
                    return;
                }
            };
            if !delivered {
                return;
            }
        }
    }

    /// The handles to wait on: the stop, the changes, the table's change,
    /// then each process in the table's order (the oldest let go first if
    /// there are too many); and the processes let go, whose waiters were
    /// told that their ends would be reported: they must be woken, to look
    /// again and poll.
    fn handles(&self) -> (Vec<win::HANDLE>, Vec<Watched>) {
        let mut deaths = self.deaths.lock().unwrap_or_else(|e| e.into_inner());
        let excess = deaths.watched.len().saturating_sub(MAX_PROCESSES);
        let let_go: Vec<Watched> = deaths.watched.drain(..excess).collect();
        for watched in &let_go {
            if deaths.let_go.len() == TOLD {
                deaths.let_go.pop_front();
            }
            deaths.let_go.push_back(watched.pid);
        }
        let mut handles = vec![self.stop.0, self.changes.op.event.0, self.added.0];
        handles.extend(deaths.watched.iter().map(|w| w.process.0));
        (handles, let_go)
    }

    /// Removes the process at `at` in the table (it ended) and returns the
    /// entries its end changes. Waiters only append to the table, so what
    /// was at `at` when the wait began is there still.
    /// `None` when it ends every waiter's wait (`Watched::every`).
    fn remove(&self, at: usize) -> Option<Vec<OsString>> {
        let mut deaths = self.deaths.lock().unwrap_or_else(|e| e.into_inner());
        if at >= deaths.watched.len() {
            return Some(Vec::new());
        }
        let ended = deaths.watched.remove(at);
        (!ended.every).then(|| ended.entries.into_iter().map(OsString::from).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One FILE_NOTIFY_INFORMATION record: next offset, action, name.
    fn record(next: u32, name: &str) -> Vec<u8> {
        let units: Vec<u8> = name.encode_utf16().flat_map(u16::to_le_bytes).collect();
        let mut bytes = Vec::new();
        bytes.extend(next.to_le_bytes());
        bytes.extend(1u32.to_le_bytes());
        bytes.extend(u32::try_from(units.len()).unwrap().to_le_bytes());
        bytes.extend(units);
        bytes
    }

    /// A long-lived holder (here this very process) named for ever more
    /// lock names: what the watch keeps for it stays bounded, and every
    /// name is still woken when it ends (white box: the table itself).
    #[test]
    fn a_long_lived_holder_named_for_many_locks_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let handle = syscall::open_dir(dir.path()).unwrap();
        let watch = watch_dir(&handle, Box::new(|_| true)).unwrap();
        let me = u64::from(std::process::id());
        for n in 0..10_000 {
            assert!(watch.watch_deaths(&format!("job-{n}.lock"), &[me]));
        }
        let deaths = watch.deaths.lock().unwrap();
        let kept: usize = deaths.watched.iter().map(|w| w.entries.len()).sum();
        assert!(kept <= MAX_ENTRIES, "{kept} names kept for one process");
        assert!(
            deaths.watched.iter().all(|w| w.every),
            "its end wakes every waiter"
        );
        drop(deaths);
        drop(watch);
    }

    /// This process's handle, duplicated: a process that does not end
    /// while the test runs, under any pid the table is told.
    fn own_process() -> Process {
        let mut handle = std::ptr::null_mut();
        // SAFETY: duplicates the pseudo-handle of this process into a real
        // one of this process, owned by the `Process` returned.
        let ok = unsafe {
            let me = threading::GetCurrentProcess();
            win::DuplicateHandle(me, me, me, &mut handle, 0, 0, win::DUPLICATE_SAME_ACCESS)
        };
        assert_ne!(ok, 0);
        Process(handle)
    }

    /// Past `MAX_PROCESSES` the oldest process is let go: its waiters,
    /// told that its end would be reported, are woken (to look again and
    /// poll), and naming it again while the table is full answers that it
    /// is not watched, rather than letting another go in its place.
    #[test]
    fn a_process_let_go_wakes_its_waiters_who_then_poll() {
        let dir = tempfile::tempdir().unwrap();
        let handle = syscall::open_dir(dir.path()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let watch = watch_dir(
            &handle,
            Box::new(move |event| {
                if let DirEvent::Changed(name) = event {
                    let _ = tx.send(name.to_string_lossy().into_owned());
                }
                true
            }),
        )
        .unwrap();
        let me = u64::from(std::process::id());
        assert!(watch.watch_deaths("first.lock", &[me]));
        {
            let mut deaths = watch.deaths.lock().unwrap();
            // Pids no process has (never opened): stand-ins.
            for n in 0..MAX_PROCESSES as u64 {
                deaths.watched.push(Watched {
                    pid: 4_000_000 + 4 * n,
                    process: own_process(),
                    entries: vec![format!("other-{n}.lock")],
                    every: false,
                });
            }
        }
        // SAFETY: the event lives while `watch` does.
        unsafe { threading::SetEvent(watch.added.0) };
        let woken = rx.recv_timeout(Duration::from_secs(5));
        assert_eq!(
            woken.as_deref(),
            Ok("first.lock"),
            "the waiter of the process let go"
        );
        assert!(
            !watch.watch_deaths("first.lock", &[me]),
            "named again while the table is full"
        );
        assert_eq!(watch.deaths.lock().unwrap().watched.len(), MAX_PROCESSES);
        drop(watch);
    }

    #[test]
    fn notified_names_are_the_entries_of_the_lock_directory() {
        let first = record(0, "a.lock");
        // The second record starts at an odd offset, as Wine writes them.
        let mut batch = record(u32::try_from(first.len() + 1).unwrap(), "a.lock");
        batch.push(0);
        batch.extend(record(0, "job.members\\m-1"));
        assert_eq!(notified_names(&batch), ["a.lock", "job.members"]);
        assert_eq!(notified_names(&first), ["a.lock"]);
        assert!(notified_names(&[1, 2, 3]).is_empty());
        // A record whose name runs past the batch ends it.
        let mut cut = record(0, "b.lock");
        cut.truncate(cut.len() - 1);
        assert!(notified_names(&cut).is_empty());
    }
}
