//! The statuses the tool exits with, beside CMD's own (see the table in
//! the binary's docs), and the error that ends a command with
//! [`EXIT_ERROR`].

use std::error::Error as StdError;

/// Exit status for library and setup errors; clap uses it for bad usage too.
pub(super) const EXIT_ERROR: u8 = 2;

/// Exit status when the lock directory (or, for a lock given by its path,
/// its directory) does not exist: sysexits' `EX_NOINPUT`, as flock(1)
/// exits when it cannot open the lock file.
pub(super) const EXIT_NO_DIRECTORY: u8 = 66;

/// Exit status of `run` when the lock was lost while CMD ran: sysexits'
/// `EX_TEMPFAIL`, distinct from the tool's other statuses.
pub(super) const EXIT_LOST: u8 = 75;

/// Exit status of `run --shared` or `run --permits` when NAME is held as
/// another kind: sysexits' `EX_CONFIG`, for processes that disagree on
/// what NAME is.
pub(super) const EXIT_KIND_MISMATCH: u8 = 78;

/// An error no command handles: printed as `leasehold: ...`, with status
/// [`EXIT_ERROR`].
pub(super) type Failure = Box<dyn StdError + Send + Sync>;
