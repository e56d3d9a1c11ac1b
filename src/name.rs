//! Lock names and the file names they map to.
//!
//! With [`PathStyle::Plain`] the file name is `<name>.lock`, and with
//! [`PathStyle::Exact`] the name itself, for sharing locks with programs
//! that use such names; such names are validated.
//!
//! Any string of at most [`MAX_NAME_LEN`] bytes except the empty one and
//! those containing NUL is a lock name.
//! On disk it becomes `<safeName>-<hash16>.lock`, exactly as velocious
//! derives it: every character outside `[A-Za-z0-9._-]` is replaced by `_`
//! (once per UTF-16 code unit, as JavaScript's `String.replace` does), the
//! result is cut to 64 characters, and the first 16 hex digits of the
//! SHA-256 of the UTF-8 name follow. The file name therefore never contains a
//! separator, is never `.` or `..`, is at most 86 bytes, and two names that
//! differ only in unsafe characters do not collide.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use crate::sys;

/// A name refused by the rules of its path style; it becomes
/// [`Error::InvalidName`](crate::Error::InvalidName) (see `error.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InvalidName {
    pub(crate) name: String,
    pub(crate) reason: &'static str,
}

type Result<T> = std::result::Result<T, InvalidName>;

/// The longest lock name, in bytes of UTF-8, that any call accepts.
///
/// The whole name is written into every record of its lock (so that a
/// listing can show it for hashed paths), and into PostgreSQL's index of
/// locks, whose entries must fit in a third of a page; this bound keeps
/// every record leasehold writes (with the longest host name, the largest
/// owner fields and a marker's extra fields) well within the 64 KiB that
/// its readers accept, and every name within PostgreSQL's limit. A longer
/// name is refused with [`Error::InvalidName`](crate::Error::InvalidName)
/// when the call is made, before anything is written. [`PathStyle::Plain`]
/// and [`PathStyle::Exact`] names have a shorter limit, 200 bytes.
///
/// # Examples
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// use leasehold::{Error, Locker, MAX_NAME_LEN};
///
/// let dir = tempfile::tempdir().unwrap();
/// let locker = Locker::new(dir.path())?;
/// assert!(locker.lock_path(&"n".repeat(MAX_NAME_LEN)).is_ok());
/// let too_long = locker.lock_path(&"n".repeat(MAX_NAME_LEN + 1));
/// assert!(matches!(too_long, Err(Error::InvalidName { .. })));
/// # Ok(()) }
/// ```
pub const MAX_NAME_LEN: usize = 2048;

const SAFE_NAME_MAX: usize = 64;
/// Leaves room for `.lock` and the directory strategy's
/// `.pending-XXXXXXXXXXXX` / `.trash-XXXXXXXXXXXX` within `NAME_MAX` (255).
const PLAIN_NAME_MAX: usize = 200;

/// How lock names become file names.
///
/// # Examples
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// use leasehold::{Locker, PathStyle};
///
/// let dir = tempfile::tempdir().unwrap();
/// let hashed = Locker::new(dir.path())?;
/// assert_eq!(hashed.lock_path("jobs/nightly")?.file_name().unwrap(), "jobs_nightly-933f0a5ebdb23af5.lock");
///
/// let plain = Locker::builder().directory(dir.path()).path_style(PathStyle::Plain).build()?;
/// assert_eq!(plain.lock_path("state")?.file_name().unwrap(), "state.lock");
/// assert!(plain.lock_path("../state").is_err());
///
/// // A flock(1) user's lock file, named in full.
/// let exact = Locker::builder().directory(dir.path()).path_style(PathStyle::Exact).build()?;
/// assert_eq!(exact.lock_path("backup")?.file_name().unwrap(), "backup");
/// assert!(exact.lock_path("backup.fence").is_err()); // a fencing counter's name
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PathStyle {
    /// `<safeName>-<hash16>.lock`: any name (of at most
    /// [`MAX_NAME_LEN`] bytes), no collisions, as velocious's
    /// `AdvisoryLockFileBackend` derives it. The default.
    #[default]
    Hashed,
    /// `<name>.lock`, for existing lock files (pi-research's, say).
    /// Names must be usable as one file name: not empty, at most 200 bytes,
    /// no `/`, no `..`, no NUL or other control characters, not `.`. On
    /// Windows they must also be names Windows can hold: none of
    /// `<>:"\|?*`, no trailing `.` or space, and not a reserved device
    /// name (`CON`, `PRN`, `AUX`, `NUL`, `COM0`–`COM9`, `LPT0`–`LPT9`, and
    /// `COM¹`–`COM³`, `LPT¹`–`LPT³`, in any case, alone or followed by a
    /// `.` and anything: `nul.txt` is `NUL` too).
    ///
    /// The name is the file name, so the file system decides which names
    /// are one lock: on a case-insensitive one (Windows', and macOS's by
    /// default) two names that differ only in case, such as `Job` and
    /// `job`, are **one** lock. They exclude each other, and the record
    /// names whichever took it. [`Hashed`](Self::Hashed) names never
    /// collide so: case differences give different hashes.
    Plain,
    /// `<name>`, as is: for lock files whose whole name is given, such as
    /// those of flock(1) users (`/var/lock/backup`, in a locker on
    /// `/var/lock`). Names follow the rules of `Plain` and, so that no
    /// lock can be mistaken for the files leasehold keeps beside locks,
    /// cannot end in `.fence`, `.members` or `.mutex` nor contain `.pending-`,
    /// `.trash-` or `.fence.tmp-`. [`Locker::list`](crate::Locker::list)
    /// shows only the locks whose names end in `.lock`. As with `Plain`,
    /// names that differ only in case are one lock on a case-insensitive
    /// file system.
    Exact,
}

/// A validated lock name and its file name inside the lock directory.
///
/// Both live in one shared allocation (the name, then the file name), so a
/// clone is a reference count and the tasks queued on one name share it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct LockName {
    text: Arc<str>,
    /// Where the name ends and the file name starts in `text`.
    split: usize,
}

impl std::fmt::Debug for LockName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockName")
            .field("name", &self.as_str())
            .field("file_name", &self.file_name())
            .finish()
    }
}

impl LockName {
    /// Validates `name` and derives its file name.
    pub(crate) fn new(name: &str, style: PathStyle) -> Result<Self> {
        if name.is_empty() {
            return Err(invalid(name, "name is empty"));
        }
        if name.len() > MAX_NAME_LEN {
            const _: () = assert!(MAX_NAME_LEN == 2048, "the message below says 2048");
            return Err(invalid(name, "names are at most 2048 bytes"));
        }
        if name.contains('\0') {
            return Err(invalid(name, "name contains a NUL byte"));
        }
        let file_name = match style {
            PathStyle::Hashed => hashed_file_name(name),
            PathStyle::Plain => {
                check_plain(name)?;
                format!("{name}.lock")
            }
            PathStyle::Exact => {
                check_plain(name)?;
                let reserved = [".fence", ".members", ".mutex"].iter().any(|s| name.ends_with(s))
                    || [".pending-", ".trash-", ".fence.tmp-"]
                        .iter()
                        .any(|s| name.contains(s));
                if reserved {
                    return Err(invalid(
                        name,
                        "exact names cannot end in '.fence', '.members' or '.mutex' or contain \
                         '.pending-', '.trash-' or '.fence.tmp-': leasehold names its own files so",
                    ));
                }
                name.to_owned()
            }
        };
        Ok(Self::join(name, &file_name))
    }

    fn join(name: &str, file_name: &str) -> Self {
        let mut text = String::with_capacity(name.len() + file_name.len());
        text.push_str(name);
        text.push_str(file_name);
        Self {
            text: text.into(),
            split: name.len(),
        }
    }

    /// The lock at an existing entry of the lock directory, named by its
    /// file name until its record says better.
    pub(crate) fn from_file_name(file_name: &str) -> Self {
        Self::join(file_name.strip_suffix(".lock").unwrap_or(file_name), file_name)
    }

    /// A name already validated once (read back from a lock server), with
    /// its hashed file name as its key.
    #[cfg(feature = "postgres")]
    pub(crate) fn from_name(name: &str) -> Self {
        Self::join(name, &hashed_file_name(name))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.text[..self.split]
    }

    /// Whether `other` is this very allocation (a clone of this name).
    pub(crate) fn is_same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.text, &other.text)
    }

    /// `<safeName>-<hash16>.lock`.
    pub(crate) fn file_name(&self) -> &str {
        &self.text[self.split..]
    }
}

/// How many names [`Names`] keeps before it starts over.
const NAMES_KEPT: usize = 256;

/// The names one `Locker` acquired lately, validated and with their file
/// names, so that acquiring a name again costs a lookup rather than a
/// SHA-256 and three allocations; and with each, a value kept for it
/// (the `Locker`'s queue of that name), so that an acquisition finds both
/// in one lookup. Bounded: it starts over when full.
#[derive(Debug)]
pub(crate) struct Names<T = ()> {
    style: PathStyle,
    known: Mutex<HashSet<Known<T>>>,
}

/// A [`LockName`] looked up by its name alone (one `Names` has one path
/// style, so the name decides the file name), and its value once made.
#[derive(Debug)]
struct Known<T>(LockName, Option<T>);

impl<T> PartialEq for Known<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl<T> Eq for Known<T> {}

impl<T> Hash for Known<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.as_str().hash(state);
    }
}

impl<T> Borrow<str> for Known<T> {
    fn borrow(&self) -> &str {
        self.0.as_str()
    }
}

impl<T: Clone> Names<T> {
    pub(crate) fn new(style: PathStyle) -> Self {
        Self {
            style,
            known: Mutex::default(),
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashSet<Known<T>>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `entry`, starting over first if full.
    fn keep(&self, entry: Known<T>) {
        let mut known = self.known();
        if known.len() >= NAMES_KEPT {
            known.clear();
        }
        known.replace(entry);
    }

    /// [`LockName::new`] in this `Locker`'s path style, from the names
    /// kept if it is there.
    pub(crate) fn get(&self, name: &str) -> Result<LockName> {
        if let Some(found) = self.known().get(name) {
            return Ok(found.0.clone());
        }
        let made = LockName::new(name, self.style)?;
        self.keep(Known(made.clone(), None));
        Ok(made)
    }

    /// [`get`](Self::get), with the value kept for the name: made by
    /// `make` (without this lock held) the first time, or after the
    /// names kept started over.
    pub(crate) fn get_with(&self, name: &str, make: impl FnOnce(&LockName) -> T) -> Result<(LockName, T)> {
        // Looked up, and the lock let go, before a name new here is made
        // (a SHA-256 and three allocations).
        let found = match self.known().get(name) {
            Some(Known(found, Some(value))) => return Ok((found.clone(), value.clone())),
            Some(Known(found, None)) => Some(found.clone()),
            None => None,
        };
        let made = match found {
            Some(found) => found,
            None => LockName::new(name, self.style)?,
        };
        let value = make(&made);
        self.keep(Known(made.clone(), Some(value.clone())));
        Ok((made, value))
    }
}

/// The rules of [`PathStyle::Plain`] (and [`PathStyle::Exact`]): one file
/// name, with room for the suffixes of the files kept beside it.
fn check_plain(name: &str) -> Result<()> {
    if name.len() > PLAIN_NAME_MAX {
        return Err(invalid(name, "plain names are at most 200 bytes"));
    }
    if name.contains('/') {
        return Err(invalid(name, "plain names cannot contain '/'"));
    }
    if name == "." || name.contains("..") {
        return Err(invalid(name, "plain names cannot be '.' or contain '..'"));
    }
    if name.chars().any(char::is_control) {
        return Err(invalid(name, "plain names cannot contain control characters"));
    }
    if sys::WINDOWS_FILE_NAMES
        && let Some(reason) = windows_refusal(name)
    {
        return Err(invalid(name, reason));
    }
    Ok(())
}

/// Why Windows cannot hold `name` as a file name (or the start of one:
/// `<name>.lock`), or `None`: the rule [`check_plain`] adds on Windows,
/// pure so that every platform tests it. Control characters, `/` and
/// the empty name are refused everywhere, before this.
fn windows_refusal(name: &str) -> Option<&'static str> {
    if name.contains(['<', '>', ':', '"', '\\', '|', '?', '*']) {
        return Some("plain names on Windows cannot contain '<', '>', ':', '\"', '\\', '|', '?' or '*'");
    }
    if name.ends_with(['.', ' ']) {
        return Some("plain names on Windows cannot end in '.' or ' ': Windows drops them");
    }
    // `NUL`, `nul.txt`, `Com1.tar.gz` and `CON .x` all name the device
    // (Windows trims the spaces before the extension).
    let stem = name.split('.').next().unwrap_or(name).trim_end_matches(' ');
    let device = match stem.len() {
        3 => ["CON", "PRN", "AUX", "NUL"]
            .iter()
            .any(|d| stem.eq_ignore_ascii_case(d)),
        _ => ["COM", "LPT"].iter().any(|d| {
            stem.get(..3).is_some_and(|p| p.eq_ignore_ascii_case(d))
                && matches!(
                    &stem[3..],
                    "0" | "1" | "2" | "3" | "4" | "5" | "6" | "7" | "8" | "9" | "¹" | "²" | "³"
                )
        }),
    };
    if device {
        return Some(
            "plain names on Windows cannot be a reserved device name (CON, PRN, AUX, NUL, \
             COM0-COM9, LPT0-LPT9, COM¹-COM³, LPT¹-LPT³), alone or followed by '.'",
        );
    }
    None
}

fn invalid(name: &str, reason: &'static str) -> InvalidName {
    InvalidName {
        name: name.to_owned(),
        reason,
    }
}

fn hashed_file_name(name: &str) -> String {
    let mut out = String::with_capacity(SAFE_NAME_MAX + 22);
    let mut safe_len = 0;
    for c in name.chars() {
        let units = if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
            out.push(c);
            1
        } else {
            for _ in 0..c.len_utf16() {
                out.push('_');
            }
            c.len_utf16()
        };
        safe_len += units;
        if safe_len >= SAFE_NAME_MAX {
            break;
        }
    }
    out.truncate(SAFE_NAME_MAX);
    let digest = Sha256::digest(name.as_bytes());
    out.push('-');
    for byte in &digest[..8] {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    out.push_str(".lock");
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hashed(name: &str) -> Result<LockName> {
        LockName::new(name, PathStyle::Hashed)
    }

    #[test]
    fn matches_velocious() {
        // sha256("reindex") starts 2ad945a5430f00fa, as node:crypto computes it.
        let n = hashed("reindex").unwrap();
        assert_eq!(n.file_name(), "reindex-2ad945a5430f00fa.lock");
        let n = hashed("a/b c").unwrap();
        assert!(n.file_name().starts_with("a_b_c-"));
        // An astral character is two UTF-16 code units, hence two underscores.
        let n = hashed("x😀y").unwrap();
        assert!(n.file_name().starts_with("x__y-"));
        // Cut to 64 characters after replacement, as `.slice(0, 64)` does.
        let n = hashed(&"é".repeat(40)).unwrap();
        assert!(n.file_name().starts_with(&format!("{}-", "_".repeat(40))));
        let n = hashed(&"a".repeat(100)).unwrap();
        assert!(n.file_name().starts_with(&format!("{}-", "a".repeat(64))));
    }

    #[test]
    fn names_kept_are_the_names_made() {
        for style in [PathStyle::Hashed, PathStyle::Plain, PathStyle::Exact] {
            let names = Names::<()>::new(style);
            for round in 0..2 {
                for i in 0..(NAMES_KEPT + 10) {
                    let name = format!("n{i}/{round}");
                    let made = LockName::new(&name, style);
                    let kept = names.get(&name);
                    assert_eq!(kept.as_ref().ok(), made.as_ref().ok(), "{name}");
                    assert_eq!(kept.is_err(), made.is_err(), "{name}");
                    let again = names.get(&name);
                    assert_eq!(again.as_ref().ok(), made.as_ref().ok(), "{name}");
                }
            }
            assert!(names.known.lock().unwrap().len() <= NAMES_KEPT);
            assert!(names.get("").is_err());
            assert!(names.get("a\0b").is_err());
        }
    }

    /// The value kept with a name is made once, then found with the name;
    /// a bad name makes none; a name first looked up without one gets one.
    #[test]
    fn a_value_kept_with_a_name_is_made_once() {
        let names: Names<Arc<str>> = Names::new(PathStyle::Hashed);
        let made = std::cell::Cell::new(0);
        let make = |name: &LockName| {
            made.set(made.get() + 1);
            Arc::<str>::from(name.file_name())
        };
        let (name, value) = names.get_with("jobs", make).unwrap();
        let (again, same) = names.get_with("jobs", make).unwrap();
        assert_eq!(made.get(), 1);
        assert_eq!(name, again);
        assert!(Arc::ptr_eq(&value, &same));
        assert_eq!(&*value, name.file_name());
        assert!(names.get_with("", make).is_err());
        assert_eq!(made.get(), 1);
        names.get("plain").unwrap();
        let (plain, value) = names.get_with("plain", make).unwrap();
        assert_eq!(made.get(), 2);
        assert_eq!(&*value, plain.file_name());
        for i in 0..NAMES_KEPT {
            names.get(&format!("other {i}")).unwrap();
        }
        names.get_with("jobs", make).unwrap();
        assert_eq!(made.get(), 3, "made again once the names kept started over");
    }

    #[test]
    fn rejects_empty_and_nul() {
        for style in [PathStyle::Hashed, PathStyle::Plain] {
            assert!(matches!(LockName::new("", style), Err(InvalidName { .. })));
            assert!(matches!(LockName::new("a\0b", style), Err(InvalidName { .. })));
        }
    }

    #[test]
    fn plain_names_are_validated() {
        assert_eq!(
            LockName::new("state", PathStyle::Plain).unwrap().file_name(),
            "state.lock"
        );
        assert_eq!(
            LockName::new("a.b-c d", PathStyle::Plain).unwrap().file_name(),
            "a.b-c d.lock"
        );
        let long = "x".repeat(201);
        for bad in [
            ".",
            "..",
            "../x",
            "a/b",
            "/etc/passwd",
            "a..b",
            "x\ny",
            "\u{7f}",
            long.as_str(),
        ] {
            assert!(
                matches!(LockName::new(bad, PathStyle::Plain), Err(InvalidName { .. })),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn exact_names_are_the_file_name_and_never_a_companion_file() {
        for good in ["backup", "backup.lock", "cron.job-1", "x.lck"] {
            assert_eq!(LockName::new(good, PathStyle::Exact).unwrap().file_name(), good);
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "x.lock.fence",
            "x.members",
            "x.mutex",
            "job.lock.mutex",
            "x.lock.mutex",
            "x.lock.pending-0123456789ab",
            "x.lock.trash-0123456789ab",
            "x.lock.fence.tmp-0123456789abcdef0123456789abcdef",
            "a\nb",
        ] {
            assert!(
                matches!(LockName::new(bad, PathStyle::Exact), Err(InvalidName { .. })),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn names_windows_cannot_hold_are_refused_there() {
        for good in [
            "state",
            "a.b-c d",
            "CONSOLE",
            "con-1",
            "nul_x",
            "COM10",
            "LPT",
            "COMx",
            "xCON",
            "job.nul",
            "com⁴",
            "日本語🔒",
            ".hidden",
        ] {
            assert_eq!(windows_refusal(good), None, "{good:?} refused");
        }
        for (bad, why) in [
            ("a<b", "cannot contain"),
            ("a>b", "cannot contain"),
            ("C:x", "cannot contain"),
            ("say\"hi\"", "cannot contain"),
            ("a\\b", "cannot contain"),
            ("a|b", "cannot contain"),
            ("what?", "cannot contain"),
            ("*", "cannot contain"),
            ("job.", "cannot end in"),
            ("job ", "cannot end in"),
            ("CON", "device"),
            ("con", "device"),
            ("Prn", "device"),
            ("aux", "device"),
            ("NUL", "device"),
            ("nul.txt", "device"),
            ("NUL.tar.gz", "device"),
            ("nul .txt", "device"),
            ("COM0", "device"),
            ("com1", "device"),
            ("Com9.log", "device"),
            ("LPT0", "device"),
            ("lpt5.x", "device"),
            ("COM¹", "device"),
            ("com²", "device"),
            ("LPT³.lock", "device"),
        ] {
            let reason = windows_refusal(bad).unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert!(reason.contains(why), "{bad:?}: {reason}");
            assert!(reason.starts_with("plain names on Windows"), "{reason}");
            // Through the path styles: refused on Windows only.
            for style in [PathStyle::Plain, PathStyle::Exact] {
                let got = LockName::new(bad, style);
                if sys::WINDOWS_FILE_NAMES {
                    assert_eq!(got.unwrap_err().reason, reason, "{bad:?}");
                } else {
                    assert!(got.is_ok(), "{bad:?} refused off Windows");
                }
            }
            // Hashed names are made of safe characters, and end in
            // `-<hash16>.lock`: any name works. (`nul.txt` becomes
            // `nul.txt-<hash16>.lock`, which Win32 path parsing would take
            // for `NUL`; leasehold's `\\?\` paths skip that parsing.)
            let hashed = hashed(bad).unwrap();
            if let Some(reason) = windows_refusal(hashed.file_name()) {
                assert!(
                    reason.contains("device") && bad.contains('.'),
                    "{bad:?}: {reason}"
                );
            }
        }
    }

    #[test]
    fn hashed_names_that_differ_in_case_never_share_a_file() {
        let (upper, lower) = (hashed("Job").unwrap(), hashed("job").unwrap());
        assert_ne!(
            upper.file_name().to_ascii_lowercase(),
            lower.file_name().to_ascii_lowercase()
        );
    }

    proptest! {
        #[test]
        fn hashed_file_names_break_no_windows_character_rule(name in "\\PC{1,100}") {
            prop_assume!(!name.contains('\0'));
            let hashed = hashed(&name).unwrap();
            if let Some(reason) = windows_refusal(hashed.file_name()) {
                prop_assert!(reason.contains("device"), "{}: {}", hashed.file_name(), reason);
            }
        }

        #[test]
        fn exact_names_stay_one_file_name(name in "\\PC{1,60}") {
            if let Ok(n) = LockName::new(&name, PathStyle::Exact) {
                let f = n.file_name();
                prop_assert_eq!(f, name.as_str());
                prop_assert!(!f.contains('/') && !f.contains('\0'));
                prop_assert!(f != "." && f != ".." && f.len() <= PLAIN_NAME_MAX);
            }
        }

        #[test]
        fn plain_names_stay_one_file_name(name in "\\PC{1,60}") {
            if let Ok(n) = LockName::new(&name, PathStyle::Plain) {
                let f = n.file_name();
                prop_assert!(!f.contains('/') && !f.contains('\0'));
                prop_assert!(f != "." && f != ".." && !f.starts_with("..") && f.len() <= 205);
            }
        }

        #[test]
        fn any_name_maps_inside_the_directory(name in "\\PC{1,200}") {
            prop_assume!(!name.contains('\0'));
            let n = hashed(&name).unwrap();
            let f = n.file_name();
            prop_assert!(!f.contains('/'));
            prop_assert!(f != "." && f != "..");
            prop_assert!(f.len() <= SAFE_NAME_MAX + 22);
            prop_assert!(f.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)));
            prop_assert!(f.ends_with(".lock"));
        }

        #[test]
        fn name_and_file_name_come_back_whole(name in "\\PC{1,80}") {
            prop_assume!(!name.contains('\0'));
            for style in [PathStyle::Hashed, PathStyle::Plain] {
                if let Ok(n) = LockName::new(&name, style) {
                    prop_assert_eq!(n.as_str(), name.as_str());
                    prop_assert!(n.file_name().ends_with(".lock"));
                    prop_assert_eq!(n.clone(), n);
                }
            }
        }

        #[test]
        fn distinct_names_get_distinct_files(a in "[a-z/ ]{1,10}", b in "[a-z/ ]{1,10}") {
            prop_assume!(a != b);
            prop_assert_ne!(hashed(&a).unwrap().file_name().to_owned(),
                            hashed(&b).unwrap().file_name().to_owned());
        }
    }
}
