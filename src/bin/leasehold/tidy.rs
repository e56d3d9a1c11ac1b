//! Nothing of leasehold's is left beside a lock once `run` is done with it.
//!
//! `run` turns the library's fencing on for `LEASEHOLD_FENCING_TOKEN`, so
//! holding a lock makes its fencing counter, `<lock path>.fence`. The run
//! that lets the lock go removes the counter once nobody holds the lock;
//! while somebody does (a shared run, a run that took the lock just after
//! ours), that holder's run removes it when it lets go. A run killed while
//! it held the lock (SIGKILL, a crash) leaves its lock and counter, which
//! the next run of the lock removes, and so does `clean` ([`orphans`]).
//!
//! Why tokens still never go back: the library counts tokens in wall-clock
//! microseconds, and where a counter is missing it resumes at the clock plus
//! 8,193 µs, above every token handed out before, as for a counter deleted
//! by a tmpfiles rule (docs/format.md, *Fencing counters*). So a run's token
//! is above every earlier one of that lock, whoever ran it (another user's
//! run, a library service, a run killed before), as long as the wall clock
//! has not been stepped back between the two. While the counter is there
//! (a run holds the lock), tokens come from it as for any library user. A
//! service that uses the library with fencing on keeps its counter only
//! while a run of the tool does not remove it: such a service's tokens
//! then rest on the same wall-clock rule.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use leasehold::Locker;

/// What `run` does after letting go of the lock `name`: removes the
/// lock's fencing counter if nobody holds the lock (see the module docs).
/// Quiet, as flock(1): a counter that cannot be removed only stays.
pub(super) async fn after_run(locker: &Locker, name: &str) {
    let Ok(lock) = locker.lock_path(name) else {
        return;
    };
    // A live holder (shared, or the next one) removes it when it lets go.
    match locker.inspect(name).await {
        Ok(Some(info)) if !info.is_stale() => return,
        Ok(_) => {}
        Err(_) => return,
    }
    let _ = remove(&counter_of(&lock));
}

/// `<lock path>.fence`.
fn counter_of(lock: &Path) -> PathBuf {
    let mut counter = OsString::from(lock.as_os_str());
    counter.push(".fence");
    PathBuf::from(counter)
}

/// Removes the fencing counter at `path`; `false` if there was none.
/// Anything that is not one (a symlink, a file of data) is left alone.
fn remove(path: &Path) -> std::io::Result<bool> {
    if !is_counter(path) {
        return Ok(false);
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// A regular file (not a symlink) holding a decimal number, as the
/// library writes its fencing counters.
fn is_counter(path: &Path) -> bool {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_file() && meta.len() <= 32 => {}
        _ => return false,
    }
    std::fs::read(path).is_ok_and(|bytes| {
        let text = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
        !text.is_empty() && text.iter().all(u8::is_ascii_digit)
    })
}

/// The fencing counters in `dir` that `clean` removes: `<x>.lock.fence`,
/// the name the library gives the counter of a lock named `*.lock`, whose
/// lock `<x>.lock` is gone and has no holders listed in `<x>.lock.members`
/// (nor will have, after this `clean`: `removed` are the lock paths it
/// removes, or would with `--dry-run`). A counter of a lock named otherwise
/// (`leasehold run /tmp/job -- ...`) is removed by that lock's next run.
pub(super) fn orphans(dir: &Path, removed: &[&Path]) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let gone = |path: &Path| {
        removed.contains(&path)
            || matches!(std::fs::symlink_metadata(path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .filter_map(|entry| {
            let file = entry.file_name();
            let lock = file.to_str()?.strip_suffix(".fence")?;
            if !lock.ends_with(".lock") {
                return None;
            }
            let counter = dir.join(&file);
            let members = dir.join(format!("{lock}.members"));
            (gone(&dir.join(lock)) && gone(&members) && is_counter(&counter)).then_some(counter)
        })
        .collect();
    found.sort();
    found
}

/// Removes the counters [`orphans`] found: those it removed.
pub(super) fn remove_orphans(counters: Vec<PathBuf>) -> Vec<PathBuf> {
    counters
        .into_iter()
        .filter(|counter| remove(counter).unwrap_or(false))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_counters_of_free_lock_files_are_orphans() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
        write("free.lock.fence", "1765000000000000\n");
        write("held.lock", "");
        write("held.lock.fence", "1765000000000000\n");
        std::fs::create_dir(dir.join("shared.lock.members")).unwrap();
        write("shared.lock.fence", "17\n");
        write("notes.lock.fence", "not a number\n");
        write("job.fence", "17\n");
        write("stale.lock", "");
        write("stale.lock.fence", "17");
        assert_eq!(orphans(dir, &[]), vec![dir.join("free.lock.fence")]);
        let stale = dir.join("stale.lock");
        assert_eq!(
            orphans(dir, &[stale.as_path()]),
            vec![dir.join("free.lock.fence"), dir.join("stale.lock.fence")]
        );
        let removed = remove_orphans(orphans(dir, &[]));
        assert_eq!(removed, vec![dir.join("free.lock.fence")]);
        assert!(!dir.join("free.lock.fence").exists());
        assert!(dir.join("notes.lock.fence").exists(), "a file of data");
        assert!(dir.join("job.fence").exists(), "not a *.lock name");
    }

    #[test]
    fn a_counter_is_a_number() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("x.fence");
        for (text, counter) in [
            ("12\n", true),
            ("12", true),
            ("", false),
            ("\n", false),
            ("1 2\n", false),
        ] {
            std::fs::write(&path, text).unwrap();
            assert_eq!(is_counter(&path), counter, "{text:?}");
        }
        std::fs::write(&path, "9".repeat(40)).unwrap();
        assert!(!is_counter(&path), "too long");
    }
}
