//! Which lock a command names: a NAME in the lock directory, or, as
//! flock(1) takes it, the PATH of a lock file.

use std::path::{Path, PathBuf};

/// The lock a `run` or `holder` is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// A name, mapped to a file of the lock directory.
    Name(String),
    /// A lock file given by its path: `file`, exactly, in `dir`.
    Path {
        /// The path as given (for messages and `LEASEHOLD_NAME`).
        given: String,
        dir: PathBuf,
        file: String,
    },
}

impl Target {
    /// A path if `by_path` (`--file`) or the argument has a `/`, else a
    /// name. A path must end in a file name: `/var/lock/` or `x/.` name
    /// directories, which flock(1) would lock but leasehold cannot.
    pub(crate) fn parse(lock: &str, by_path: bool) -> Result<Self, String> {
        if !by_path && !lock.contains('/') {
            return Ok(Self::Name(lock.to_owned()));
        }
        let path = Path::new(lock);
        let file = match path.file_name().and_then(|f| f.to_str()) {
            Some(file) if !lock.ends_with('/') && !lock.ends_with("/.") && lock != "." => file,
            _ => {
                return Err(format!(
                    "{lock:?} names a directory, not a lock file; give the path of a file in it (e.g. {:?})",
                    path.join("job.lock")
                ));
            }
        };
        let dir = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
            _ => PathBuf::from("."),
        };
        Ok(Self::Path {
            given: lock.to_owned(),
            dir,
            file: file.to_owned(),
        })
    }

    /// The name the library knows the lock by.
    pub(crate) fn name(&self) -> &str {
        match self {
            Self::Name(name) => name,
            Self::Path { file, .. } => file,
        }
    }

    /// The lock as the user gave it.
    pub(crate) fn shown(&self) -> &str {
        match self {
            Self::Name(name) => name,
            Self::Path { given, .. } => given,
        }
    }
}

/// Refuses a lock PATH that names a file or directory holding something
/// other than a lock: `leasehold run ~/notes.txt` must never delete the
/// notes. The library refuses content that no lock writer produces on its
/// own (`Error::UnexpectedFile`); this check, for a path a user typed, is
/// stricter: JSON that names a holder without the shape of any of the three
/// kinds of record (a file of data with `uuid` and `pid` keys) the library
/// would judge a lock, and remove once stale. A lock is: nothing yet; an empty file (flock(1)'s, or
/// one a leasehold process is creating); a file holding a lock record (a
/// JSON object naming a holder); for the directory strategy, a directory
/// holding a lock record in `owner.json` and nothing else (but, while it
/// is renewed, `owner.json.next`). A file of data is refused even while someone
/// holds its `flock`: flock(1)'s man page locks the script itself
/// (`flock -en "$0"`), and once that `flock` is let go the library would
/// remove the script as a stale lock. Anything else that is not a regular
/// file or directory the library refuses itself, without touching it.
pub(crate) fn check_lock_path(dir: &Path, file: &str, directories: bool) -> Result<(), String> {
    let path = dir.join(file);
    let Ok(meta) = std::fs::symlink_metadata(&path) else {
        return Ok(());
    };
    let not_a_lock = |what: &str| {
        Err(format!(
            "{} {what}, not a lock; leasehold would remove it as a stale lock, so it refuses \
             (give the path of a lock file, or remove this one if it is a lock nobody uses)",
            path.display()
        ))
    };
    if meta.is_dir() {
        if !directories {
            // The file strategy refuses a directory without touching it.
            return Ok(());
        }
        // A lock directory holds its record, `owner.json`, and, while it
        // is renewed, `owner.json.next`: nothing else, which a reclaim
        // would remove with it.
        let Ok(entries) = std::fs::read_dir(&path) else {
            // Unreadable to us: the library's own checks decide.
            return Ok(());
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name != "owner.json" && name != "owner.json.next" {
                return not_a_lock(&format!(
                    "is a directory holding {:?}, not only owner.json",
                    name.to_string_lossy()
                ));
            }
        }
        let record = path.join("owner.json");
        return match std::fs::symlink_metadata(&record) {
            Ok(meta) if meta.is_file() => match holds_data(&record, meta.len()) {
                Some(len) => not_a_lock(&format!(
                    "is a directory whose owner.json holds {len} bytes that are not a lock record"
                )),
                None => Ok(()),
            },
            _ => not_a_lock("is a directory without owner.json"),
        };
    }
    if !meta.is_file() {
        return Ok(());
    }
    match holds_data(&path, meta.len()) {
        Some(len) => not_a_lock(&format!("holds {len} bytes that are not a lock record")),
        None => Ok(()),
    }
}

/// The size of the regular file at `path` (`len` bytes when looked at) if
/// it holds something other than a lock record; `None` if it is empty,
/// holds a record, or cannot be read by us (then the library's own checks
/// decide).
fn holds_data(path: &Path, len: u64) -> Option<u64> {
    use std::io::{Read, Seek};
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    #[cfg(windows)]
    use std::os::windows::fs::OpenOptionsExt;

    if len == 0 {
        return None;
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    options.custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits() | nix::fcntl::OFlag::O_NONBLOCK.bits());
    // The reparse point itself, never what it points to, as O_NOFOLLOW.
    #[cfg(windows)]
    options.custom_flags(windows_sys::Win32::Storage::FileSystem::FILE_FLAG_OPEN_REPARSE_POINT);
    let file = options.open(path).ok()?;
    // Whether or not someone holds its `flock`: a `flock` says nothing of
    // what the file is, and the library removes a file that holds no
    // record once its `flock` is let go. A leasehold holder rewrites its
    // record in place: a read may catch it half-written, so look twice
    // more before judging.
    for attempt in 0..3 {
        let mut bytes = Vec::new();
        if (&file).take(64 * 1024).read_to_end(&mut bytes).is_err() {
            return None;
        }
        if bytes.is_empty() || is_lock_record(&bytes) {
            return None;
        }
        if attempt < 2 {
            std::thread::sleep(std::time::Duration::from_millis(50));
            if (&file).seek(std::io::SeekFrom::Start(0)).is_err() {
                return None;
            }
        }
    }
    Some(len)
}

/// A JSON object shaped as one of the three kinds of lock record:
/// leasehold's (its `leasehold` version and an id), pi-research's (`uuid`,
/// `pid`, `startTime`) or velocious's (`holderId`, `pid` and its lease
/// times). A `uuid` or `pid` key alone is not enough: JSON files of data
/// have them, and the library would reclaim such a file, that is remove it.
fn is_lock_record(bytes: &[u8]) -> bool {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_slice::<serde_json::Value>(bytes) else {
        return false;
    };
    let string = |key: &str| map.get(key).is_some_and(serde_json::Value::is_string);
    let number = |key: &str| map.get(key).is_some_and(serde_json::Value::is_number);
    let leasehold = number("leasehold") && (string("uuid") || string("holderId"));
    let pi_research = string("uuid") && number("pid") && number("startTime");
    let velocious = string("holderId") && number("pid") && (string("acquiredAt") || string("leaseExpiresAt"));
    leasehold || pi_research || velocious
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(given: &str, dir: &str, file: &str) -> Target {
        Target::Path {
            given: given.to_owned(),
            dir: PathBuf::from(dir),
            file: file.to_owned(),
        }
    }

    #[test]
    fn a_slash_makes_a_path_and_a_bare_word_a_name() {
        assert_eq!(
            Target::parse("backup", false),
            Ok(Target::Name("backup".to_owned()))
        );
        assert_eq!(
            Target::parse("/var/lock/backup.lock", false),
            Ok(path("/var/lock/backup.lock", "/var/lock", "backup.lock"))
        );
        assert_eq!(Target::parse("./x", false), Ok(path("./x", ".", "x")));
        assert_eq!(Target::parse("a/b/c", false), Ok(path("a/b/c", "a/b", "c")));
        assert_eq!(Target::parse("x.lock", true), Ok(path("x.lock", ".", "x.lock")));
        assert_eq!(Target::parse("/x", false), Ok(path("/x", "/", "x")));
        for dir in ["/", "/var/lock/", "a/.", "a/..", "..", ".", "/tmp/../"] {
            assert!(Target::parse(dir, true).is_err(), "{dir:?} accepted");
        }
        assert!(Target::parse("/var/lock/..", false).is_err());
    }

    #[test]
    fn files_that_are_no_lock_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
        write("empty", "");
        write("record", r#"{"uuid":"x","pid":1,"startTime":1}"#);
        write(
            "velocious",
            r#"{"holderId":"h","pid":1,"hostname":"h","acquiredAt":"2026-01-01T00:00:00.000Z"}"#,
        );
        write("data.json", r#"{"uuid":"3f2a","name":"my vm","pid":7}"#);
        write("notes", "precious data\n");
        write("config.json", r#"{"theme":"dark"}"#);
        write("word", "hello");
        std::fs::create_dir(dir.join("docs")).unwrap();
        std::fs::create_dir(dir.join("lockdir")).unwrap();
        write("lockdir/owner.json", r#"{"uuid":"x","pid":1,"startTime":1}"#);
        std::fs::create_dir(dir.join("project")).unwrap();
        write("project/owner.json", r#"{"name":"app"}"#);
        std::fs::create_dir(dir.join("fuller")).unwrap();
        write("fuller/owner.json", r#"{"uuid":"x","pid":1,"startTime":1}"#);
        write("fuller/main.c", "int main;");
        for (file, directories) in [
            ("missing", false),
            ("empty", false),
            ("record", false),
            ("velocious", false),
            ("docs", false),
            ("lockdir", true),
        ] {
            assert_eq!(check_lock_path(dir, file, directories), Ok(()), "{file}");
        }
        for (file, directories) in [
            ("notes", false),
            ("config.json", false),
            ("word", false),
            ("notes", true),
            ("docs", true),
            ("project", true),
            ("data.json", false),
            ("fuller", true),
        ] {
            let refused = check_lock_path(dir, file, directories).unwrap_err();
            assert!(refused.contains("not a lock"), "{file}: {refused}");
        }
        // A file of data someone holds (flock -en "$0") is no lock either.
        // (Not on Windows, whose whole-file lock makes the file unreadable
        // to the tool, which then leaves the judgement to the library.)
        #[cfg(unix)]
        {
            let held = std::fs::File::open(dir.join("notes")).unwrap();
            held.lock().unwrap();
            assert!(check_lock_path(dir, "notes", false).is_err());
        }
    }
}
