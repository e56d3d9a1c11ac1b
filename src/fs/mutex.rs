//! A name's mutation lock: `flock(LOCK_EX)` on `<lock>.mutex`, a file of
//! its own beside the lock path.
//!
//! Every change to a name that must be one step for every leasehold
//! process happens under it: removing the lock path (release, reclaim),
//! joining, leaving and re-signing a shared lock or semaphore, advancing
//! the fencing counter, sweeping what a crash of that name left. It is
//! **per name**, so a process frozen while it holds one (Ctrl-Z, a
//! debugger, SIGSTOP between two syscalls) holds up changes to that one
//! name, never to another; and nothing that keeps a lock waits for it:
//! renewals take no lock at all (see `Whole::renew`), and a release that
//! finds it taken finishes on leasehold's own thread (`fs::later`).
//!
//! The file is made mode 0600, so only its owner can open it: read access
//! to the directory gives no power over it. Whoever holds it removes it
//! before letting go, so it exists only while someone changes the name
//! (or a process died doing so: `clean` and the leftover sweep remove it
//! then), and nothing is left beside a lock, or beside a file of data that
//! is not one; a taker re-checks, once it has the flock, that the path
//! still names the inode it locked (it may have locked one its previous
//! holder removed), and starts over if not. One exception: waiters in
//! line for the name register on the file (a read lock on its byte 0,
//! [`register`]), and a release of an exclusive lock leaves the file
//! in place while any is registered, for their own releases
//! ([`MutationLock::keep_for_waiters`]); the last one out removes it (a
//! release that finds none registered, or a waiter that stops waiting
//! without the lock, [`remove_kept`]). Under contention that spares every
//! handoff a file made and removed, and every waiting process's watcher
//! the removal's event.
//!
//! Threads of one process exclude each other too: each take opens its own
//! descriptor, and a `flock` belongs to the open file description.

use crate::sys::syscall::Flock;
use std::fs::{File, TryLockError};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::dir::LockDir;
use crate::error::{Error, IoResultExt, Result};
use crate::sys::syscall::{self, Errno, Open};

/// How long a caller that may wait (on the blocking pool, never on the
/// runtime's thread) waits for a name's mutation lock. It is held for a
/// few syscalls at a time, so only a process frozen inside that window
/// makes anyone wait this long, and only for that name.
const PATIENCE: Duration = Duration::from_millis(500);

/// The suffix of a name's mutation-lock file.
pub(crate) const SUFFIX: &str = ".mutex";

/// The mutation-lock file of the lock file (or directory) `lock`.
pub(crate) fn file_name(lock: &str) -> String {
    format!("{lock}{SUFFIX}")
}

impl LockDir {
    /// Takes the mutation lock of the lock `lock` (a lock file name),
    /// waiting up to half a second for it; `None` when another process
    /// kept it longer (say it is frozen while holding it): for callers
    /// that can simply come back later.
    ///
    /// Every removal of a lock path by leasehold (release, reclaim) happens
    /// under it, after checking that the path still names the inode that
    /// was judged. Creation needs no lock: `O_EXCL` (and a rename that
    /// replaces nothing) only succeeds on an absent path, so under this
    /// lock a present path cannot change.
    pub(crate) fn try_mutation_lock(&self, lock: &str) -> Result<Option<MutationLock<'_>>> {
        self.lock_within(lock, PATIENCE)
    }

    /// As [`try_mutation_lock`](Self::try_mutation_lock), but `None` at
    /// once when another thread or process holds it: for callers that must not wait
    /// (the runtime's thread, a guard's `Drop`).
    pub(crate) fn mutation_lock_now(&self, lock: &str) -> Result<Option<MutationLock<'_>>> {
        self.lock_within(lock, Duration::ZERO)
    }

    /// The mutation lock of `lock`, or `None` when the patience (at most
    /// half a second) ran out first.
    pub(crate) fn lock_within(&self, lock: &str, patience: Duration) -> Result<Option<MutationLock<'_>>> {
        let deadline = Instant::now() + patience.min(PATIENCE);
        let name = file_name(lock);
        let path = || self.path_of(&name);
        let mut pause = Duration::from_micros(20);
        // A lock file removed under us by its last holder is no lock: a
        // few rounds of open, lock, look suffice (each one that fails saw
        // somebody finish).
        let mut rounds = 0;
        loop {
            let file = match syscall::open_at(self.fd(), name.as_str(), Open::Mutex) {
                Ok(file) => file,
                // Something that is not a regular file sits at the name (a
                // FIFO is opened without blocking; a symlink never
                // followed): nobody's lock file, and none can be made.
                Err(Errno::ELOOP | Errno::EISDIR | Errno::ENXIO) => {
                    return Err(Error::UnexpectedFile {
                        name: lock.to_owned(),
                        path: path(),
                        found: "something other than a regular file",
                    });
                }
                Err(e) => return Err(Error::io("open mutation lock", path(), e.into())),
            };
            let meta = syscall::meta(&file).map_err(|e| Error::io("inspect mutation lock", path(), e))?;
            if !meta.is_file() {
                return Err(Error::UnexpectedFile {
                    name: lock.to_owned(),
                    path: path(),
                    found: "something other than a regular file",
                });
            }
            loop {
                let locked = failpoint!("dirlock.before_flock").map_err(TryLockError::Error);
                match locked.and_then(|()| file.try_flock()) {
                    Ok(()) => break,
                    Err(TryLockError::WouldBlock) => {}
                    Err(TryLockError::Error(e)) => {
                        return Err(Error::io("lock mutation lock", path(), e));
                    }
                }
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(2));
            }
            // Ours only if the name still names what we locked: the last
            // holder may have removed it between our open and our lock.
            let here = syscall::stat_at(self.fd(), &name);
            if matches!(here, Ok(st) if (st.dev, st.ino) == (meta.dev(), meta.ino())) {
                return Ok(Some(MutationLock {
                    dir: self,
                    lock: lock.to_owned(),
                    file,
                    sealed: None,
                    keep: false,
                }));
            }
            rounds += 1;
            if rounds >= 16 && Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }
}

/// Registers a waiter in line for the lock file `lock` of `dir` (the
/// line's `wait_on`) on the name's mutation-lock file (made if missing, as
/// any taker of the mutation lock makes it): a read lock on its byte 0
/// (`F_OFD_SETLK`, independent of the `flock` that is the mutation lock),
/// held until the returned file closes. A release that sees it keeps the
/// file for the waiters' own releases ([`registered_on`]): unlike the
/// line's ticket it names the name, and only a process that may open the
/// file (its user's, mode 0600) can take it. Unix only, where the line has
/// OFD locks: Windows' byte-range locks are mandatory, and there a
/// reader's lock would stop the mutation lock's taker.
pub(super) fn register(dir: &File, lock: &str) -> Option<File> {
    if !cfg!(unix) || !crate::sys::byte_range_locks() {
        return None;
    }
    let file = syscall::open_at(dir, file_name(lock).as_str(), Open::Mutex).ok()?;
    let regular = syscall::meta(&file).is_ok_and(|meta| meta.is_file());
    (regular && crate::sys::ofd_take_byte(&file, 0)).then_some(file)
}

/// Whether a waiter of another open file description (another `Locker`,
/// or another process) is registered on the mutation-lock file `file`
/// ([`register`]): whom a release keeps that file for. One look
/// (`F_OFD_GETLK`), where waiters register.
pub(super) fn registered_on(file: &File) -> bool {
    cfg!(unix) && crate::sys::byte_range_locks() && crate::sys::ofd_held(file, 0, 1)
}

/// Removes the mutation-lock file of `lock` if one is there and no other
/// waiter is registered on it: called by a waiter that stopped waiting
/// without the lock, once it has let go of its own registration. Taken
/// and let go (the lock's `Drop` decides, as for a release that keeps the
/// file for waiters). Never waits: one `fstatat` when there is no file, as
/// there mostly is not. Taken by someone else this instant, the file is
/// theirs to remove: every holder removes it as it lets go, unless a
/// waiter is registered, and one that keeps it looks again after letting
/// go (see `Drop`). So the last one out removes it, and no job is left
/// behind for a process that exits.
pub(super) fn remove_kept(dir: &LockDir, lock: &str) {
    if syscall::stat_at(dir.fd(), &file_name(lock)).is_ok()
        && let Ok(Some(mut taken)) = dir.mutation_lock_now(lock)
    {
        taken.keep_for_waiters();
    }
}

/// Held while changing a name; dropping it removes the file (unless kept
/// for waiters in line) and unlocks.
#[derive(Debug)]
pub(crate) struct MutationLock<'a> {
    dir: &'a LockDir,
    /// The lock file name whose changes this orders.
    lock: String,
    /// Open for as long as we hold the flock on it: closing it unlocks.
    file: File,
    /// A members directory we sealed (`members::SEAL`): unsealed before
    /// the flock goes.
    sealed: Option<File>,
    /// Let go without removing the file if a waiter is registered on it
    /// (see [`keep_for_waiters`](Self::keep_for_waiters)).
    keep: bool,
}

impl MutationLock<'_> {
    /// Lets the file stay when this lock goes if a waiter of this name is
    /// registered on it then ([`registered_on`]): the lock path was
    /// just removed for waiters in line, whose next release takes this
    /// lock again (opening the file costs less than making it, and its
    /// removal would wake every waiter's watcher once more). The last one
    /// out removes it: a release that finds none registered, or a waiter
    /// that stops waiting without the lock ([`remove_kept`]).
    ///
    /// Only in a directory where nobody but this user can make entries
    /// ([`LockDir::private_to_us`]): the file is mode 0600, so in a
    /// directory shared by several users (sticky, or group-writable) a
    /// waiter of another user could not open it for its own release, nor
    /// remove it. There the file goes at every release, as ever.
    pub(super) fn keep_for_waiters(&mut self) {
        self.keep = true;
    }

    /// Whether the file stays: waiters registered on it, in a directory
    /// only this user can make entries in, and still registered after
    /// this lock is let go. Lets the lock go to look again, since a
    /// waiter that stops waiting lets go of its registration first, then
    /// tries to remove the file, which fails while we hold it; if none is
    /// left by then and the lock, taken again at once, still names this
    /// file, `false`: the caller removes it. Any other outcome (the lock
    /// taken by another meanwhile, who then decides; the file replaced)
    /// keeps it.
    fn kept(&self) -> bool {
        if !(self.keep && self.dir.private_to_us() && registered_on(&self.file)) {
            return false;
        }
        if self.file.unlock().is_err() || registered_on(&self.file) {
            return true;
        }
        if self.file.try_flock().is_err() {
            return true;
        }
        let here = syscall::stat_at(self.dir.fd(), &file_name(&self.lock));
        let same = matches!((here, syscall::meta(&self.file)), (Ok(st), Ok(meta)) if (st.dev, st.ino) == (meta.dev(), meta.ino()));
        !same || registered_on(&self.file)
    }

    /// Seals the members directory `members` of this name
    /// (`members::seal`) until this lock goes at the latest, however the
    /// change it seals for ends: a seal that outlived its sealer's
    /// mutation lock would be taken for a dead sealer's by the lock's next
    /// holder, which seals over it, and then removed under that holder's
    /// count, letting in a joiner that does not take the mutation lock and
    /// that its count did not see.
    ///
    /// Returns the seal, open, under our flock (`members::seal`): the
    /// caller keeps it until the seal is removed.
    pub(super) fn seal(&mut self, members: &File, path: &dyn Fn() -> std::path::PathBuf) -> Result<File> {
        let kept = members
            .try_clone()
            .map_err(|e| Error::io("seal members directory", path(), e))?;
        let seal = seal(members, path)?;
        self.sealed = Some(kept);
        Ok(seal)
    }
}

impl Drop for MutationLock<'_> {
    fn drop(&mut self) {
        // Our seal, if it is still there, goes while we hold the lock.
        if let Some(members) = self.sealed.take() {
            unseal(&members);
        }
        // Removed while we hold it, so nobody else can be relying on this
        // inode: a waiter that locks it next finds it gone and starts over.
        // Kept if it is not empty: leasehold makes it empty, so one with
        // content is a stranger's file at that name (another tool's lock
        // file, say), which is never deleted.
        if self.kept() || !syscall::meta(&self.file).is_ok_and(|meta| meta.len() == 0) {
            return;
        }
        let _ = syscall::unlink_at(self.dir.fd(), file_name(&self.lock).as_str());
        // Closing the file releases the flock.
    }
}

/// The file name of a members directory's seal (see `members.rs`, where
/// it is explained; here because the mutation lock removes its holder's
/// seal before it goes).
pub(super) const SEAL: &str = "sealed";

/// Seals the members directory `dir` (see `members::SEAL`) and returns the seal open, under our flock,
/// which we keep until the seal is removed: a seal whose flock is free is
/// a dead sealer's, and keeps nobody out (a joiner that does not take the
/// mutation lock may find it while another process holds that lock,
/// frozen, for as long as it stays so). The flock is taken before we
/// count: a joiner that found the seal free (or missing) before had its
/// record in place, and is counted. The caller holds the name's mutation
/// lock, so a seal already there is a dead sealer's, and now ours; it
/// removes it ([`unseal`]) before that lock goes.
pub(super) fn seal(dir: &File, path: &dyn Fn() -> PathBuf) -> Result<File> {
    failpoint!("group.seal.before_create").context("seal members directory", path)?;
    let file = match syscall::open_at(dir, SEAL, Open::CreateNew) {
        Err(Errno::EEXIST) => syscall::open_at(dir, SEAL, Open::Read),
        made => made,
    }
    .context("seal members directory", path)?;
    // A joiner's test of the flock holds it for an instant.
    for _ in 0..50 {
        match file.try_flock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) => {
                std::thread::sleep(std::time::Duration::from_micros(200))
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e).context("seal members directory", path),
        }
    }
    Err(std::io::Error::from(std::io::ErrorKind::WouldBlock)).context("seal members directory", path)
}

/// Removes our seal from `dir`, under the name's mutation lock.
pub(super) fn unseal(dir: &File) {
    let _ = failpoint!("group.seal.before_remove");
    match syscall::unlink_at(dir, SEAL) {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(error) => tracing::debug!(%error, "could not remove a members directory's seal"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_exclude_each_other_only_by_name() {
        let root = tempfile::tempdir().unwrap();
        let a = LockDir::open(root.path(), false).unwrap();
        let b = LockDir::open(root.path(), false).unwrap();
        let held = a.mutation_lock_now("job.lock").unwrap().unwrap();
        // Another name is free at once, the same name is not.
        assert!(b.mutation_lock_now("other.lock").unwrap().is_some());
        let started = Instant::now();
        assert!(
            b.lock_within("job.lock", Duration::from_millis(30))
                .unwrap()
                .is_none()
        );
        assert!(started.elapsed() >= Duration::from_millis(30));
        drop(held);
        assert!(b.mutation_lock_now("job.lock").unwrap().is_some());
    }

    #[test]
    fn the_file_exists_only_while_the_lock_is_held() {
        let root = tempfile::tempdir().unwrap();
        let dir = LockDir::open(root.path(), false).unwrap();
        std::fs::write(root.path().join("job.lock"), b"").unwrap();
        let held = dir.mutation_lock_now("job.lock").unwrap().unwrap();
        assert!(root.path().join("job.lock.mutex").exists());
        drop(held);
        assert!(!root.path().join("job.lock.mutex").exists());
    }

    /// Linux: where waiters register (OFD locks).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_file_is_kept_while_waiters_are_registered_on_it() {
        let root = tempfile::tempdir().unwrap();
        let dir = LockDir::open(root.path(), false).unwrap();
        let mutex = root.path().join("job.lock.mutex");
        let take = || dir.mutation_lock_now("job.lock").unwrap().unwrap();
        // Nobody registered: removed, kept for waiters or not.
        take().keep_for_waiters();
        assert!(!mutex.exists());
        // A waiter registered (a read lock on byte 0, from a descriptor of
        // its own): kept, and again by the next release.
        let register = || {
            let file = syscall::open_at(dir.fd(), "job.lock.mutex", Open::Mutex).unwrap();
            assert!(crate::sys::ofd_take_byte(&file, 0));
            file
        };
        let waiter = register();
        take().keep_for_waiters();
        assert!(mutex.exists(), "kept for the registered waiter");
        take().keep_for_waiters();
        assert!(mutex.exists());
        // The waiter leaves while a release holds the lock: the release
        // looks again once it lets go, and removes the file.
        let mut held = take();
        held.keep_for_waiters();
        drop(waiter);
        drop(held);
        assert!(!mutex.exists(), "the last one out removes it");
        // A taker that does not keep (not a release) removes it anyway.
        let waiter = register();
        drop(take());
        assert!(!mutex.exists());
        drop(waiter);
        // A directory other users can make entries in: never kept (a
        // waiter of another user could neither open nor remove it).
        use std::os::unix::fs::PermissionsExt;
        for mode in [0o1777, 0o730, 0o703] {
            std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(mode)).unwrap();
            let waiter = register();
            take().keep_for_waiters();
            assert!(!mutex.exists(), "mode {mode:o}");
            drop(waiter);
        }
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        // Another program's file at the name (with content): never removed.
        std::fs::write(&mutex, b"theirs").unwrap();
        take().keep_for_waiters();
        drop(take());
        assert_eq!(std::fs::read(&mutex).unwrap(), b"theirs");
    }

    #[test]
    fn a_lock_file_removed_by_its_last_holder_is_not_held() {
        let root = tempfile::tempdir().unwrap();
        let dir = LockDir::open(root.path(), false).unwrap();
        std::fs::write(root.path().join("job.lock"), b"").unwrap();
        // A stale descriptor of an inode that is no longer at the name,
        // flocked: the next taker must not mistake the name for held.
        let old = root.path().join("job.lock.mutex");
        std::fs::write(&old, b"").unwrap();
        let stale = File::open(&old).unwrap();
        stale.lock().unwrap();
        // Windows keeps a deleted file's name while a handle is open
        // (delete pending, as Wine does), so the inode leaves the name by
        // a rename there.
        #[cfg(unix)]
        std::fs::remove_file(&old).unwrap();
        #[cfg(windows)]
        std::fs::rename(&old, root.path().join("elsewhere")).unwrap();
        let held = dir
            .mutation_lock_now("job.lock")
            .unwrap()
            .expect("the name's lock is free");
        // And while it is held, a second taker waits.
        let other = LockDir::open(root.path(), false).unwrap();
        assert!(other.mutation_lock_now("job.lock").unwrap().is_none());
        drop(held);
    }

    #[test]
    fn something_else_at_the_name_is_an_error_not_a_hang() {
        let root = tempfile::tempdir().unwrap();
        let dir = LockDir::open(root.path(), false).unwrap();
        std::fs::create_dir(root.path().join("job.lock.mutex")).unwrap();
        assert!(matches!(
            dir.mutation_lock_now("job.lock"),
            Err(Error::UnexpectedFile { .. })
        ));
        // FIFOs and (unprivileged) symlinks are Unix's.
        #[cfg(unix)]
        {
            nix::unistd::mkfifo(&root.path().join("f.lock.mutex"), nix::sys::stat::Mode::S_IRWXU).unwrap();
            assert!(matches!(
                dir.mutation_lock_now("f.lock"),
                Err(Error::UnexpectedFile { .. })
            ));
            std::os::unix::fs::symlink("/etc/passwd", root.path().join("x.lock.mutex")).unwrap();
            assert!(matches!(
                dir.mutation_lock_now("x.lock"),
                Err(Error::UnexpectedFile { .. })
            ));
        }
    }
}
