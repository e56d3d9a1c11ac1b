//! The `Locker` a command works on: the lock directory, or the directory
//! of a lock given by its path, and what each command may do to it (create
//! it, write in it, or only look).

use std::path::{Path, PathBuf};
use std::time::Duration;

use leasehold::{Locker, PathStyle, Strategy};

use super::args::{Common, RunArgs, StrategyArg};
use super::exit::{EXIT_ERROR, EXIT_NO_DIRECTORY, Failure};
use super::output::warn;
use super::target::{self, Target};

/// How a command's `Locker` is built, beyond `--dir` and `--strategy`.
#[derive(Debug, Default)]
struct Build {
    fencing: bool,
    /// Read-only commands never create the directory they look at.
    create: bool,
    /// Only looks: the directory need not be writable (`holder`, `list`,
    /// `clean --dry-run`).
    read_only: bool,
    lease: Option<Duration>,
}

/// How long an empty lock file nobody holds a `flock` on is left alone,
/// for a lock given by its path. flock(1) leaves such a file behind after
/// every run; a switched crontab must take it over at once, not after the
/// library's 15 s (meant for writers that write their record late). A
/// leasehold writer whose new file is taken meanwhile notices: the file it
/// then locks has no links left.
const FLOCK_FILE_GRACE: Duration = Duration::from_secs(1);

/// A `Locker` on the lock directory, or on the directory of a lock given
/// by its path. Not calling `.directory()` at all is what selects the
/// library's per-user default, with its ownership checks.
fn locker(common: &Common, target: Option<&Target>, how: Build) -> Result<Locker, leasehold::Error> {
    let strategy = match common.strategy {
        StrategyArg::File => Strategy::ExclusiveFile,
        StrategyArg::Dir => Strategy::Directory,
    };
    let mut builder = Locker::builder()
        .strategy(strategy)
        .fencing(how.fencing)
        .read_only(how.read_only);
    if let Some(lease) = how.lease {
        builder = builder.lease(lease);
    }
    let from_env = || {
        std::env::var_os("LEASEHOLD_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
    };
    if let Some(Target::Path { dir, .. }) = target {
        // As flock(1): the file may be created, its directory never is;
        // the directory's security checks (no world-writable directory
        // without the sticky bit) apply as to any lock directory.
        builder = builder
            .directory(dir)
            .path_style(PathStyle::Exact)
            .create_directory(false)
            .unreadable_grace(FLOCK_FILE_GRACE);
    } else {
        builder = builder.create_directory(how.create);
        if let Some(dir) = common.dir.clone().or_else(from_env) {
            builder = builder.directory(dir);
        }
    }
    builder.build()
}

/// The directory a failed `build()` found missing, if that was why.
fn missing_directory(error: &leasehold::Error) -> Option<&Path> {
    match error {
        leasehold::Error::Io { path, source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            Some(path)
        }
        _ => None,
    }
}

/// For a lock given by its path whose directory is a file (or lies under
/// one): what to say, with status [`EXIT_NO_DIRECTORY`], as flock(1)
/// cannot open such a lock file either. A missing directory is left to
/// [`missing_directory`].
fn path_under_a_file(target: &Target) -> Option<String> {
    let Target::Path { given, dir, .. } = target else {
        return None;
    };
    let not_a_dir = match std::fs::metadata(dir) {
        Ok(meta) => !meta.is_dir(),
        Err(e) => e.kind() == std::io::ErrorKind::NotADirectory,
    };
    not_a_dir.then(|| format!("cannot lock {given:?}: {} is not a directory", dir.display()))
}

/// Builds the `Locker` of a read-only command, or says that the directory
/// does not exist (status [`EXIT_NO_DIRECTORY`]) instead of creating it.
pub(super) fn inspecting(
    common: &Common,
    target: Option<&Target>,
    read_only: bool,
) -> Result<Result<Locker, u8>, Failure> {
    if let Some(refused) = target.and_then(path_under_a_file) {
        warn(&refused);
        return Ok(Err(EXIT_NO_DIRECTORY));
    }
    let how = Build {
        read_only,
        ..Build::default()
    };
    match locker(common, target, how) {
        Ok(locker) => Ok(Ok(locker)),
        Err(e) => match missing_directory(&e) {
            Some(dir) => {
                warn(&format!("lock directory {} does not exist", dir.display()));
                Ok(Err(EXIT_NO_DIRECTORY))
            }
            None => Err(e.into()),
        },
    }
}

/// Builds the `Locker` of `run`, which creates the lock directory (never
/// the directory of a lock given by its path), or says why it cannot lock
/// there, with the status to exit with.
pub(super) fn running(args: &RunArgs, target: &Target) -> Result<Result<Locker, u8>, Failure> {
    if let Some(refused) = path_under_a_file(target) {
        warn(&refused);
        return Ok(Err(EXIT_NO_DIRECTORY));
    }
    let how = Build {
        fencing: true,
        create: true,
        read_only: false,
        lease: args.lease,
    };
    let locker = match locker(&args.common, Some(target), how) {
        Ok(locker) => locker,
        Err(e) => match (target, missing_directory(&e)) {
            (Target::Path { given, .. }, Some(dir)) => {
                // flock(1) says "cannot open lock file", with EX_NOINPUT too.
                warn(&format!(
                    "cannot lock {given:?}: its directory {} does not exist (a lock given by its path never creates directories)",
                    dir.display()
                ));
                return Ok(Err(EXIT_NO_DIRECTORY));
            }
            _ => return Err(e.into()),
        },
    };
    if let Target::Path { dir, file, .. } = target {
        let directories = matches!(args.common.strategy, StrategyArg::Dir);
        if let Err(refused) = target::check_lock_path(dir, file, directories) {
            warn(&refused);
            return Ok(Err(EXIT_ERROR));
        }
    }
    Ok(Ok(locker))
}
