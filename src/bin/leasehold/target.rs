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
}
