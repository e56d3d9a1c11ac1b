//! The default lock directory: one fixed place per platform, or a refusal.
//!
//! Two processes of one user on one host that both use the default must
//! meet in one directory, whatever changed between their starts. A rule
//! with a fallback cannot promise that: with "`/run/lock` if it is a shared
//! sticky directory, else `/tmp`", a process started while `/run/lock` was
//! 0755 held its locks in `/tmp`, and one started after `chmod 1777
//! /run/lock` held the same names in `/run/lock`. So the place depends on
//! nothing a process finds at its start: it is `/run/lock/leasehold-<uid>`
//! on Linux, `/private/tmp/leasehold-<uid>` on macOS (whose `/tmp` is a
//! symlink to it) and `/tmp/leasehold-<uid>` elsewhere, fixed when
//! leasehold is compiled. What a process finds only decides whether it may use that
//! place; when it may not, `build()` fails with
//! [`Error::NoDefaultDirectory`], which names the setting to give instead.
//!
//! It may not when:
//!
//! - the root (`/run/lock`, `/tmp`) is missing, is not a directory, is not
//!   root's, or is writable by others without the sticky bit (they could
//!   move the per-user directory away);
//! - the per-user directory is missing and this user may not create it
//!   (`/run/lock` is root's alone on Fedora and Arch: root can create it
//!   for the user, or the user gives a directory);
//! - on Linux, this process may see another directory at that path than
//!   the rest of the host: the mount holding the root is not the one the
//!   host's init (pid 1) sees there (same device, same directory of that
//!   device, same mount point). A mount namespace of its own with a
//!   `/run/lock` of its own (a fresh `/run`, `TemporaryFileSystem=`,
//!   `BindPaths=`, a sandbox) is thus refused, while a systemd unit's
//!   ordinary namespace (`PrivateTmp=`, `ProtectHome=`), which shares the
//!   host's `/run/lock`, passes. Where pid 1's mount table cannot be read
//!   (`hidepid`), a bind mount of a subdirectory at the root (what
//!   `PrivateTmp=` makes of `/tmp`) is still refused.
//!
//! Linux never uses `/tmp` by default: a unit with `PrivateTmp=` sees a
//! `/tmp` of its own that looks like the real one.
//!
//! An existing per-user directory must then pass [`check_private`].

use crate::sys::syscall;
use std::io;
use std::path::{Path, PathBuf};

use super::dir::LockDir;
use crate::error::{Error, IoResultExt, Result};

/// Where the per-user default directories live, and how to judge that
/// place: the host's in production, a temporary one in tests.
#[derive(Debug)]
pub(crate) struct Place {
    /// `/run/lock` on Linux, `/private/tmp` on macOS, `/tmp` elsewhere.
    root: PathBuf,
    /// Who must own the root: root.
    owner: u32,
    /// This process's mount table and the host init's, to compare the
    /// mount holding the root (Linux only).
    mounts: Option<(PathBuf, PathBuf)>,
}

impl Place {
    /// The host's: fixed per platform, never from the environment.
    pub(crate) fn host() -> Self {
        let (root, mounts) = crate::sys::lock_root();
        Self {
            root,
            owner: syscall::ROOT_OWNER,
            mounts,
        }
    }

    /// `<root>/<prefix>-<euid>` (on Windows, whose root is the user's
    /// own, `<root>\\<prefix>`).
    pub(crate) fn path(&self, prefix: &str) -> PathBuf {
        self.root.join(syscall::per_user_name(prefix))
    }

    /// Opens the per-user directory `prefix`, creating it (mode 0700)
    /// if `create`, or refuses: see the module docs.
    pub(crate) fn open(&self, prefix: &str, allow_insecure: bool, create: bool) -> Result<LockDir> {
        let path = self.path(prefix);
        let refuse = |reason, source| Error::NoDefaultDirectory {
            path: path.clone(),
            reason,
            source,
        };
        match syscall::root_problem(&self.root, self.owner) {
            Ok(None) => {}
            Ok(Some(reason)) => return Err(refuse(reason, None)),
            Err(e) => return Err(refuse("its parent cannot be used on this host", Some(e))),
        }
        if let Some((own, init)) = &self.mounts
            && let Err(reason) = same_mount(&self.root, own, init)
        {
            return Err(refuse(reason, None));
        }
        if create {
            match syscall::private_dir().create(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                    return Err(refuse(
                        "this user may not create it (root may, for the user)",
                        Some(e),
                    ));
                }
                Err(e) => return Err(e).context("create lock directory", || &path),
            }
        }
        let dir = LockDir::open_with(&path, allow_insecure, false)?;
        check_private(&dir)?;
        Ok(dir)
    }
}

/// The per-user directory `<prefix>-<euid>` at the host's fixed place (it
/// need not exist or be usable).
pub(crate) fn per_user_directory(prefix: &str) -> PathBuf {
    Place::host().path(prefix)
}

/// Opens the host's per-user directory `prefix`, or refuses.
pub(crate) fn open_per_user(prefix: &str, allow_insecure: bool, create: bool) -> Result<LockDir> {
    Place::host().open(prefix, allow_insecure, create)
}

/// Why a root that another mount shows than the host's init sees is
/// refused.
const ANOTHER_VIEW: &str = "this process may see another directory there than the rest of the \
     host (its mount namespace has a mount of its own there)";

/// Why a root on a bind mount of another directory is refused, where the
/// init's view cannot be read.
const BIND_MOUNT: &str = "its parent is a bind mount of another directory, which other processes \
     may not see there";

/// Whether `root` in this process's mount table (`own`) is the directory
/// the host's init sees there (`init`).
fn same_mount(root: &Path, own: &Path, init: &Path) -> std::result::Result<(), &'static str> {
    // Without a mount table there is nothing to compare: leasehold needs
    // `/proc` for much else, and a process without it is told nothing here.
    let (Ok(canonical), Ok(own)) = (root.canonicalize(), std::fs::read_to_string(own)) else {
        return Ok(());
    };
    compare(&own, std::fs::read_to_string(init).ok().as_deref(), &canonical)
}

/// [`same_mount`], given the tables' text (`init`: `None` where it cannot
/// be read, as under `hidepid`).
fn compare(own: &str, init: Option<&str>, path: &Path) -> std::result::Result<(), &'static str> {
    let Some(mine) = seen(own, path) else {
        return Ok(());
    };
    match init {
        Some(table) if seen(table, path).is_some_and(|theirs| theirs.same(&mine)) => Ok(()),
        Some(_) => Err(ANOTHER_VIEW),
        // A bind mount of another directory is what a private view
        // (systemd's `PrivateTmp=`) looks like.
        None if !mine.whole && mine.dir != path => Err(BIND_MOUNT),
        None => Ok(()),
    }
}

/// What a path shows, as far as telling two views of it apart needs.
#[derive(Debug)]
struct Seen {
    /// The device mounted there (`major:minor`).
    device: String,
    /// The directory of that device the path shows.
    dir: PathBuf,
    /// Whether its mount is of the device's root (no bind mount).
    whole: bool,
}

impl Seen {
    /// The same directory of the same device, whichever mount shows it
    /// (a bind mount of a directory onto itself, read-only say, changes
    /// nothing another process sees).
    fn same(&self, other: &Seen) -> bool {
        self.device == other.device && self.dir == other.dir
    }
}

/// What `path` shows according to a `/proc/<pid>/mountinfo` table.
///
/// The table lists hidden mounts too (a fresh `/run` mounted over the
/// host's `/run` leaves its `/run/lock` listed), so the mount holding `path`
/// is found by walking down from the root mount, each step to the last
/// listed child at a prefix of `path`: the table lists a namespace's mounts
/// in the order they were made, and of two children of one mount that both
/// lie on the way, the later was mounted over the earlier (a mount at a
/// point inside another has that one as its parent, not a sibling).
fn seen(table: &str, path: &Path) -> Option<Seen> {
    struct Entry<'a> {
        id: &'a str,
        parent: &'a str,
        device: &'a str,
        within: String,
        at: PathBuf,
    }
    let entries: Vec<Entry<'_>> = table
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let (id, parent, device) = (fields.next()?, fields.next()?, fields.next()?);
            let (within, at) = (fields.next()?, fields.next()?);
            Some(Entry {
                id,
                parent,
                device,
                within: unescape(within),
                at: PathBuf::from(unescape(at)),
            })
        })
        .collect();
    let mut current = entries
        .iter()
        .find(|e| e.at == Path::new("/") && !entries.iter().any(|p| p.id == e.parent))?;
    // A well-formed table is a tree; the bound keeps a malformed one with a
    // cycle from looping forever.
    for _ in 0..entries.len() {
        let below = entries
            .iter()
            .rev()
            .find(|e| e.parent == current.id && path.starts_with(&e.at));
        match below {
            Some(next) => current = next,
            None => break,
        }
    }
    let rest = path.strip_prefix(&current.at).ok()?;
    Some(Seen {
        device: current.device.to_owned(),
        whole: current.within == "/",
        dir: Path::new(&current.within).join(rest),
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A per-user directory in a shared root must be ours and closed to
/// others, or someone could have planted it there; and writable, or a
/// read-only mount (systemd's `ProtectSystem=strict`) would only show at the
/// first acquisition.
pub(crate) fn check_private(dir: &LockDir) -> Result<()> {
    let meta = syscall::meta(dir.fd()).context("inspect lock directory", || dir.path())?;
    let inspect = |e| Error::io("inspect lock directory", dir.path(), e);
    if !syscall::owned_by_me(dir.fd(), &meta).map_err(inspect)? {
        return Err(Error::InsecureDirectory {
            path: dir.path().to_owned(),
            reason: "the default lock directory belongs to another user; remove it, or choose another with `.directory(...)`",
        });
    }
    // In a shared root, anyone may plant a symlink at our name, pointing at
    // a private directory of ours (it would pass the checks above) and
    // later somewhere else: the name itself must be the directory opened.
    let itself = syscall::symlink_meta_of(dir.configured())
        .is_ok_and(|at| at.is_dir() && at.dev() == meta.dev() && at.ino() == meta.ino());
    if !itself {
        return Err(Error::InsecureDirectory {
            path: dir.configured().to_owned(),
            reason: "the default lock directory is a symlink, or was replaced while it was opened; remove it, or choose another with `.directory(...)`",
        });
    }
    if syscall::open_to_others(dir.fd(), &meta).map_err(inspect)? {
        return Err(Error::InsecureDirectory {
            path: dir.path().to_owned(),
            reason: "the default lock directory is open to other users (expected mode 0700); remove it, or choose another with `.directory(...)`",
        });
    }
    if crate::sys::syscall::read_only(dir.fd()) {
        return Err(Error::io(
            "write to lock directory",
            dir.path(),
            io::Error::from(crate::sys::syscall::Errno::EROFS),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(unix)]
    use std::os::unix::fs::PermissionsExt;

    /// The states a root may be in when a process starts. (Unix: modes,
    /// sticky bits and symlinks; Windows' root is judged by its ACL.)
    #[cfg(unix)]
    const STATES: [&str; 7] = [
        "shared",  // 1777, as Debian's /run/lock
        "root's",  // 0755, as Fedora's /run/lock
        "open",    // 0777 without the sticky bit
        "missing", // macOS, a container, a fresh /run
        "a file",
        "elsewhere", // a symlink to another shared directory
        "replaced",  // removed and made again, shared
    ];

    /// Puts `root` in `state`, changing it in place where it can (a
    /// directory stays the same directory, its per-user directory in it).
    #[cfg(unix)]
    fn set(root: &Path, other: &Path, state: &str) {
        let is_dir = syscall::symlink_meta_of(root).is_ok_and(|m| m.is_dir());
        let mode = match state {
            "shared" | "replaced" => 0o1777,
            "root's" => 0o755,
            "open" => 0o777,
            _ => 0,
        };
        if !is_dir || matches!(state, "replaced" | "missing" | "a file" | "elsewhere") {
            let _ = std::fs::remove_file(root);
            let _ = std::fs::remove_dir_all(root);
        }
        match state {
            "missing" => {}
            "a file" => std::fs::write(root, b"").unwrap(),
            "elsewhere" => std::os::unix::fs::symlink(other, root).unwrap(),
            _ => {
                let _ = std::fs::create_dir(root);
                std::fs::set_permissions(root, std::fs::Permissions::from_mode(mode)).unwrap();
            }
        }
    }

    /// A place in a temporary directory, owned by whoever runs the test.
    fn place(root: &Path) -> Place {
        Place {
            root: root.to_owned(),
            #[cfg(unix)]
            owner: crate::sys::syscall::euid(),
            #[cfg(windows)]
            owner: syscall::ROOT_OWNER,
            mounts: None,
        }
    }

    /// The split of issue 28: a process that started while the root was in
    /// one state and one that started after it changed must open one
    /// directory, or one of them must refuse. With the old rule ("the root
    /// if shared, else a fallback") the pair (shared, then root's) split.
    // The states are Unix modes and symlinks (see `STATES`).
    #[cfg(unix)]
    #[test]
    fn two_processes_never_open_two_default_directories_whatever_changed_between_their_starts() {
        for first in STATES {
            for second in STATES {
                let base = tempfile::tempdir().unwrap();
                let (root, other) = (base.path().join("lock"), base.path().join("other"));
                std::fs::create_dir(&other).unwrap();
                std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o1777)).unwrap();
                let place = place(&root);
                set(&root, &other, first);
                let a = place.open("leasehold", false, true);
                set(&root, &other, second);
                let b = place.open("leasehold", false, true);
                // Two directories only where the first one's path no
                // longer names it, which its holders notice and lose their
                // locks by (`LockDir::moved`).
                if let (Ok(a), Ok(b)) = (&a, &b) {
                    let (am, bm) = (syscall::meta(a.fd()).unwrap(), syscall::meta(b.fd()).unwrap());
                    assert!(
                        (am.dev(), am.ino()) == (bm.dev(), bm.ino()) || a.moved(),
                        "{first} then {second}: two directories"
                    );
                }
                for (opened, state) in [(&a, first), (&b, second)] {
                    let usable = matches!(state, "shared" | "root's" | "replaced" | "elsewhere");
                    match opened {
                        Ok(_) => assert!(usable, "{state}: opened"),
                        Err(Error::NoDefaultDirectory { .. }) => assert!(!usable, "{state}: refused"),
                        Err(e) => panic!("{state}: {e}"),
                    }
                }
            }
        }
    }

    #[test]
    fn the_refusal_names_the_setting_to_give() {
        let base = tempfile::tempdir().unwrap();
        let err = place(&base.path().join("none"))
            .open("leasehold", false, true)
            .unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains(".directory(") && message.contains("--dir"),
            "{message}"
        );
        // The per-user name: `leasehold-<uid>` on Unix, `leasehold` in the
        // user's own folder on Windows.
        assert!(
            message.contains(&syscall::per_user_name("leasehold")),
            "{message}"
        );
        assert!(std::error::Error::source(&err).is_some());
    }

    /// Mount tables as `/proc/<pid>/mountinfo` writes them.
    const HOST: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
29 27 0:26 / /run rw,nosuid - tmpfs tmpfs rw
30 29 0:27 / /run/lock rw,nosuid - tmpfs tmpfs rw
31 27 0:28 / /tmp rw - tmpfs tmpfs rw
";

    fn judge(own: &str, init: Option<&str>, root: &str) -> std::result::Result<(), &'static str> {
        compare(own, init, Path::new(root))
    }

    #[test]
    fn a_mount_of_its_own_at_the_root_is_told_from_the_hosts() {
        // The host's own view, and a unit's namespace that copies it.
        assert_eq!(judge(HOST, Some(HOST), "/run/lock"), Ok(()));
        // A unit with PrivateTmp=: /tmp differs, /run/lock is the host's.
        let private_tmp = HOST.replace(
            "31 27 0:28 / /tmp",
            "31 27 0:28 /systemd-private-1f-cron.service-x/tmp /tmp",
        );
        assert_eq!(judge(&private_tmp, Some(HOST), "/run/lock"), Ok(()));
        assert_eq!(judge(&private_tmp, Some(HOST), "/tmp"), Err(ANOTHER_VIEW));
        assert_eq!(judge(&private_tmp, None, "/tmp"), Err(BIND_MOUNT));
        // A fresh tmpfs on /run/lock, or on /run (no /run/lock below it).
        let fresh = format!("{HOST}90 30 0:91 / /run/lock rw - tmpfs tmpfs rw\n");
        assert_eq!(judge(&fresh, Some(HOST), "/run/lock"), Err(ANOTHER_VIEW));
        let fresh_run = format!("{HOST}90 29 0:91 / /run rw - tmpfs tmpfs rw\n");
        assert_eq!(judge(&fresh_run, Some(HOST), "/run/lock"), Err(ANOTHER_VIEW));
        // A directory bound over it.
        let bound = format!("{HOST}90 30 254:0 /srv/locks /run/lock rw - ext4 /dev/vda rw\n");
        assert_eq!(judge(&bound, Some(HOST), "/run/lock"), Err(ANOTHER_VIEW));
        assert_eq!(judge(&bound, None, "/run/lock"), Err(BIND_MOUNT));
        // The same directory bound onto itself (read-only, say): the same.
        let host_plain = HOST.replace("30 29 0:27 / /run/lock rw,nosuid - tmpfs tmpfs rw\n", "");
        let itself = format!("{host_plain}90 29 0:26 /lock /run/lock ro - tmpfs tmpfs rw\n");
        assert_eq!(judge(&itself, Some(&host_plain), "/run/lock"), Ok(()));
        // Without the init's table that looks like any bind mount of a
        // subdirectory: refused, the safe side.
        assert_eq!(judge(&itself, None, "/run/lock"), Err(BIND_MOUNT));
        // An overmount hides what was under it.
        let over = format!(
            "{HOST}90 30 0:91 / /run/lock rw - tmpfs tmpfs rw\n91 90 0:27 / /run/lock rw - tmpfs tmpfs rw\n"
        );
        assert_eq!(judge(&over, Some(HOST), "/run/lock"), Ok(()));
    }

    #[test]
    fn mount_points_with_escaped_characters_are_read() {
        assert_eq!(unescape("/mnt/a\\040b\\011c"), "/mnt/a b\tc");
        assert_eq!(unescape("/plain\\"), "/plain\\");
        let table = format!("{HOST}40 27 0:50 / /mnt/my\\040locks rw - tmpfs tmpfs rw\n");
        let seen = seen(&table, Path::new("/mnt/my locks/x")).unwrap();
        assert_eq!(seen.dir, Path::new("/x"));
    }

    // Modes and a symlink: Unix (Windows' rule is the ACL's, and a
    // symlink there needs a privilege).
    #[cfg(unix)]
    #[test]
    fn a_symlink_planted_at_the_default_name_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let real = root.path().join("mine");
        std::fs::create_dir(&real).unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
        let planted = root.path().join("leasehold-me");
        std::os::unix::fs::symlink(&real, &planted).unwrap();
        let dir = LockDir::open(&planted, false).unwrap();
        match check_private(&dir) {
            Err(Error::InsecureDirectory { path, .. }) => assert_eq!(path, planted),
            other => panic!("expected InsecureDirectory, got {other:?}"),
        }
        // The directory itself, private and ours, passes.
        check_private(&LockDir::open(&real, false).unwrap()).unwrap();
    }
}
