//! The directory watcher of macOS and FreeBSD: kqueue `EVFILT_VNODE`
//! (`kqueue(2)` of both) on the lock directory, on the directories
//! `watch_child` names, and on the regular files in both, read by one
//! thread per `Locker`, as inotify's is on Linux. What each event means is
//! `sys/vnode.rs`'s; here it is registered, read and told.
//!
//! - The lock directory's `NOTE_WRITE` says its entries changed, not
//!   which: every waiter looks again (`DirEvent::Overflow`), and the
//!   directory is listed anew to watch the files that came.
//! - A lock file's holder dying changes no entry: macOS posts
//!   `NOTE_FUNLOCK` on the file when its `flock` goes, FreeBSD
//!   `NOTE_CLOSE_WRITE` when a descriptor that could write it closes.
//!   Both are watched on each regular file (`Changed(name)`).
//! - A watched child (a directory-layout lock, a members directory):
//!   its `NOTE_WRITE`, and the letting go of its files (`owner.json`, the
//!   members' records) and, on macOS, of itself (its holder's `flock`),
//!   are `Changed(child)`.
//!
//! Each watched vnode costs a descriptor, opened with `O_EVTONLY` on macOS
//! (`open(2)`: "descriptor requested for event notifications only"). So
//! that a watcher never starves its process of descriptors, it watches at
//! most [`budget`] files; a directory holding more is not watched (the
//! callers poll), and one that grows past it ends the watch (`Gone`).

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::event::{EvFlags, EventFilter, FilterFlag, KEvent, Kqueue};
use nix::sys::stat::{Mode, fstat, fstatat};
use nix::sys::time::TimeSpec;

use super::super::DirEvent;
use super::super::vnode::{self, Kernel, Role, Seen};

#[cfg(target_os = "macos")]
const KERNEL: Kernel = Kernel::Darwin;
#[cfg(target_os = "freebsd")]
const KERNEL: Kernel = Kernel::FreeBsd;

// The pure file's constants are this kernel's (checked where it builds).
const _: () = {
    use nix::libc;
    assert!(vnode::NOTE_DELETE == libc::NOTE_DELETE);
    assert!(vnode::NOTE_WRITE == libc::NOTE_WRITE);
    assert!(vnode::NOTE_EXTEND == libc::NOTE_EXTEND);
    assert!(vnode::NOTE_LINK == libc::NOTE_LINK);
    assert!(vnode::NOTE_RENAME == libc::NOTE_RENAME);
    assert!(vnode::NOTE_REVOKE == libc::NOTE_REVOKE);
    #[cfg(target_os = "macos")]
    assert!(vnode::NOTE_FUNLOCK == libc::NOTE_FUNLOCK);
    #[cfg(target_os = "freebsd")]
    assert!(vnode::NOTE_CLOSE_WRITE == libc::NOTE_CLOSE_WRITE);
};

/// How long the thread waits for an event before it reports `Idle`.
const IDLE: Duration = Duration::from_millis(500);

/// The most files one watcher watches, whatever the descriptor limit.
const MAX_FILES: usize = 128;

/// How many files one watcher may watch: an eighth of the soft descriptor
/// limit (`getrlimit(2)` `RLIMIT_NOFILE`; 256 by default on macOS), at
/// most [`MAX_FILES`].
fn budget() -> usize {
    use nix::sys::resource::{Resource, getrlimit};
    getrlimit(Resource::RLIMIT_NOFILE)
        .ok()
        .and_then(|(soft, _)| usize::try_from(soft / 8).ok())
        .unwrap_or(0)
        .min(MAX_FILES)
}

/// A watched vnode other than the lock directory.
#[derive(Debug)]
struct Node {
    /// Closing it removes its kevent (`kqueue(2)`: "Calling close() on a
    /// file descriptor will remove any kevents that reference the
    /// descriptor").
    _fd: OwnedFd,
    role: Role,
    /// Its name in its directory.
    name: OsString,
    /// The watched child it is in; `None`: it is in the lock directory.
    within: Option<OsString>,
    /// Its inode number, to tell a file or directory replaced under the
    /// same name.
    ino: u64,
}

impl Node {
    /// The name its events are told under: a child's own name for the
    /// child and whatever is in it, a file's in the lock directory.
    fn key(&self) -> &OsStr {
        self.within.as_deref().unwrap_or(&self.name)
    }
}

/// Everything watched besides the lock directory, by descriptor (the
/// kevent's `ident`).
#[derive(Debug, Default)]
struct Nodes {
    by_fd: HashMap<RawFd, Node>,
    /// How many of them are files, and how many may be.
    files: usize,
    budget: usize,
}

impl Nodes {
    /// Stops watching whatever `gone` picks.
    fn drop_where(&mut self, gone: impl Fn(&Node) -> bool) {
        self.by_fd.retain(|_, node| !gone(node));
        self.files = self.by_fd.values().filter(|n| n.role == Role::File).count();
    }

    /// Stops watching the child `name` and the files in it.
    fn drop_child(&mut self, name: &OsStr) {
        self.drop_where(|n| n.key() == name && (n.role == Role::Child || n.within.is_some()));
    }
}

#[derive(Debug)]
struct Shared {
    kq: Kqueue,
    /// The lock directory, on a descriptor of our own.
    top: File,
    nodes: Mutex<Nodes>,
}

impl Shared {
    fn nodes(&self) -> MutexGuard<'_, Nodes> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running kqueue watch; dropping it closes every descriptor it
/// watches, and its thread ends at its next wake-up.
#[derive(Debug)]
pub(crate) struct DirWatch {
    shared: Arc<Shared>,
}

/// Registers `fd` for the events a vnode of `role` posts (`kqueue(2)`
/// `EV_SET`: `EVFILT_VNODE`, `EV_ADD | EV_CLEAR`). With no room for events,
/// `kevent(2)` returns at once, with an error if the registration failed.
fn register(kq: &Kqueue, fd: RawFd, role: Role) -> Result<(), Errno> {
    let ident = usize::try_from(fd).map_err(|_| Errno::EBADF)?;
    let change = KEvent::new(
        ident,
        EventFilter::EVFILT_VNODE,
        EvFlags::EV_ADD | EvFlags::EV_CLEAR,
        FilterFlag::from_bits_retain(vnode::interest(KERNEL, role)),
        0,
        0,
    );
    kq.kevent(&[change], &mut [], Some(*TimeSpec::from(Duration::ZERO).as_ref()))
        .map(drop)
}

/// Opens `name` in `dir` to watch it, never following a symlink (`open(2)`
/// `O_NOFOLLOW`), never blocking on a FIFO (`O_NONBLOCK`); a child must be
/// a directory (`O_DIRECTORY`).
fn open_node(dir: BorrowedFd<'_>, name: &OsStr, role: Role) -> Result<OwnedFd, Errno> {
    let mut flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
    if role == Role::Child {
        flags |= OFlag::O_DIRECTORY;
    }
    // macOS `open(2)`: "O_EVTONLY descriptor requested for event
    // notifications only" (it does not keep a volume from unmounting).
    #[cfg(target_os = "macos")]
    {
        flags |= OFlag::from_bits_retain(nix::libc::O_EVTONLY);
    }
    openat(dir, name, flags, Mode::empty())
}

/// Lists `dir` (the lock directory when `within` is `None`, else the
/// watched child `within`), watches each regular file in it that is not
/// watched yet, and stops watching those gone from it or replaced. An
/// error when it cannot list, or finds more files than the budget allows:
/// then some holder's death would go unseen.
fn scan(kq: &Kqueue, nodes: &mut Nodes, dir: BorrowedFd<'_>, within: Option<&OsStr>) -> Result<(), Errno> {
    let listing = Dir::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut present: HashMap<OsString, (u64, bool)> = HashMap::new();
    for entry in listing {
        let entry = entry?;
        let known_file = match entry.file_type() {
            Some(Type::File) => true,
            // No type in the entry (some filesystems): asked below.
            None => false,
            Some(_) => continue,
        };
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name != "." && name != ".." {
            present.insert(name.to_owned(), (entry.ino(), known_file));
        }
    }
    nodes.drop_where(|n| {
        n.role == Role::File
            && n.within.as_deref() == within
            && present.get(&n.name).is_none_or(|&(ino, _)| ino != n.ino)
    });
    let watched: HashSet<OsString> = nodes
        .by_fd
        .values()
        .filter(|n| n.role == Role::File && n.within.as_deref() == within)
        .map(|n| n.name.clone())
        .collect();
    for (name, (ino, known_file)) in present {
        if watched.contains(&name) {
            continue;
        }
        let fd = match open_node(dir, &name, Role::File) {
            Ok(fd) => fd,
            // Gone since it was listed, or a symlink: nothing to watch.
            Err(Errno::ENOENT | Errno::ELOOP) => continue,
            Err(e) => return Err(e),
        };
        if !known_file && !fstat(&fd).is_ok_and(|st| st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFREG) {
            continue;
        }
        if nodes.files >= nodes.budget {
            return Err(Errno::EMFILE);
        }
        register(kq, fd.as_raw_fd(), Role::File)?;
        nodes.by_fd.insert(
            fd.as_raw_fd(),
            Node {
                _fd: fd,
                role: Role::File,
                name,
                within: within.map(OsStr::to_owned),
                ino,
            },
        );
        nodes.files += 1;
    }
    Ok(())
}

impl DirWatch {
    /// Also watches the child directory `name` (a directory-layout lock,
    /// a members directory) and the files in it, whose events are then
    /// reported as `Changed(name)`. Symlinks are not followed. Returns
    /// whether the watch is in place: `false` when the deaths of its
    /// holders could go unseen (it cannot be opened, or holds more files
    /// than the budget allows), so that the caller polls.
    pub(crate) fn watch_child(&self, name: &str) -> bool {
        let shared = &*self.shared;
        let key = OsStr::new(name);
        let mut nodes = shared.nodes();
        // Called at every wait: a watch of the directory now at `name`
        // stands.
        let now = fstatat(&shared.top, name, AtFlags::AT_SYMLINK_NOFOLLOW).ok();
        let current = nodes
            .by_fd
            .values()
            .find(|n| n.role == Role::Child && n.name == key)
            .map(|n| n.ino);
        if let (Some(ino), Some(st)) = (current, now)
            && st.st_ino == ino
        {
            return true;
        }
        nodes.drop_child(key);
        let watched = (|| -> Result<(), Errno> {
            let fd = open_node(shared.top.as_fd(), key, Role::Child)?;
            let ino = fstat(&fd)?.st_ino;
            register(&shared.kq, fd.as_raw_fd(), Role::Child)?;
            let raw = fd.as_raw_fd();
            nodes.by_fd.insert(
                raw,
                Node {
                    _fd: fd,
                    role: Role::Child,
                    name: key.to_owned(),
                    within: None,
                    ino,
                },
            );
            let dir = nodes.by_fd[&raw]._fd.try_clone().map_err(|_| Errno::EMFILE)?;
            scan(&shared.kq, &mut nodes, dir.as_fd(), Some(key))
        })();
        if watched.is_err() {
            nodes.drop_child(key);
        }
        watched.is_ok()
    }
}

/// What the thread tells, once the nodes are unlocked.
enum Tell {
    Changed(OsString),
    Overflow,
    Gone,
}

/// Reads one event's meaning into `tell`, keeping the watched set current.
fn handle(shared: &Shared, nodes: &mut Nodes, event: &KEvent, tell: &mut Vec<Tell>) {
    let Ok(fd) = RawFd::try_from(event.ident()) else {
        return;
    };
    let fflags = event.fflags().bits();
    if fd == shared.top.as_raw_fd() {
        match vnode::seen(KERNEL, Role::Top, fflags) {
            Seen::Ended => tell.push(Tell::Gone),
            Seen::Entries => match scan(&shared.kq, nodes, shared.top.as_fd(), None) {
                Ok(()) => tell.push(Tell::Overflow),
                Err(_) => tell.push(Tell::Gone),
            },
            Seen::LetGo | Seen::Nothing => {}
        }
        return;
    }
    // An event of a descriptor closed since (its watch dropped) is stale.
    let Some(node) = nodes.by_fd.get(&fd) else {
        return;
    };
    let (role, key, name) = (node.role, node.key().to_owned(), node.name.clone());
    match vnode::seen(KERNEL, role, fflags) {
        Seen::Nothing => return,
        Seen::LetGo => {}
        Seen::Entries => {
            let listed = nodes.by_fd[&fd]
                ._fd
                .try_clone()
                .map_err(|_| Errno::EMFILE)
                .and_then(|dir| scan(&shared.kq, nodes, dir.as_fd(), Some(&key)));
            match listed {
                Ok(()) => {}
                // Removed meanwhile: its NOTE_DELETE or NOTE_RENAME ends it.
                Err(Errno::ENOENT) => nodes.drop_child(&key),
                Err(_) => tell.push(Tell::Gone),
            }
        }
        Seen::Ended => match role {
            Role::Child => nodes.drop_child(&key),
            _ => nodes.drop_where(|n| n.role == Role::File && n.name == name && n.key() == key),
        },
    }
    tell.push(Tell::Changed(key));
}

pub(crate) fn watch_dir(
    dir: &File,
    mut on_event: Box<dyn FnMut(DirEvent<'_>) -> bool + Send>,
) -> Option<DirWatch> {
    // kqueue(2): "creates a new kernel event queue"; not inherited by a
    // child of fork(2), closed with the watch.
    let kq = Kqueue::new().ok()?;
    // Our own descriptor of the inode the Locker opened, not of whatever
    // its path names now.
    let top = dir.try_clone().ok()?;
    register(&kq, top.as_raw_fd(), Role::Top).ok()?;
    let mut nodes = Nodes {
        budget: budget(),
        ..Nodes::default()
    };
    // A directory with more files than the budget is not watched: the
    // death of a holder of the ones left out would go unseen.
    scan(&kq, &mut nodes, top.as_fd(), None).ok()?;
    let shared = Arc::new(Shared {
        kq,
        top,
        nodes: Mutex::new(nodes),
    });
    let weak = Arc::downgrade(&shared);
    let idle = *TimeSpec::from(IDLE).as_ref();
    let spawned = std::thread::Builder::new()
        .name("leasehold-watch".into())
        .spawn(move || {
            let mut events = vec![
                KEvent::new(
                    0,
                    EventFilter::EVFILT_VNODE,
                    EvFlags::empty(),
                    FilterFlag::empty(),
                    0,
                    0
                );
                32
            ];
            let mut tell = Vec::new();
            loop {
                // The watch dropped: everything it watched is closed.
                let Some(shared) = weak.upgrade() else {
                    return;
                };
                // kevent(2) with an empty changelist waits up to `IDLE` for
                // events and returns how many it placed in `events`.
                let n = match shared.kq.kevent(&[], &mut events, Some(idle)) {
                    Ok(0) => {
                        drop(shared);
                        if !on_event(DirEvent::Idle) {
                            return;
                        }
                        continue;
                    }
                    Ok(n) => n,
                    Err(Errno::EINTR) => continue,
                    Err(_) => {
                        on_event(DirEvent::Gone);
                        return;
                    }
                };
                {
                    let mut nodes = shared.nodes();
                    for event in &events[..n.min(events.len())] {
                        handle(&shared, &mut nodes, event, &mut tell);
                    }
                }
                drop(shared);
                let mut overflowed = false;
                for told in tell.drain(..) {
                    let keep_going = match told {
                        Tell::Changed(name) => on_event(DirEvent::Changed(&name)),
                        Tell::Overflow if overflowed => true,
                        Tell::Overflow => {
                            overflowed = true;
                            on_event(DirEvent::Overflow)
                        }
                        Tell::Gone => {
                            // A watch on a removed directory, or one that
                            // can no longer see every holder: let callers
                            // poll.
                            on_event(DirEvent::Gone);
                            return;
                        }
                    };
                    if !keep_going {
                        return;
                    }
                }
            }
        });
    spawned.ok().map(|_| DirWatch { shared })
}
