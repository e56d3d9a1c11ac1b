//! `leasehold`: named cross-process locks from the shell, and a drop-in
//! for flock(1) in scripts and crontabs.
//!
//! ```text
//! leasehold run [-n | -w DURATION] [-E N] [-s | -x | --permits N] [-o] [--verbose]
//!               [--dir DIR] [--strategy file|dir] [--lease DURATION] [--kill-after DURATION]
//!               NAME|PATH [--] CMD ARGS...
//! leasehold run [options] NAME|PATH -c STRING
//! leasehold holder NAME|PATH [--dir DIR] [--strategy file|dir] [--json]
//! leasehold list [--dir DIR] [--strategy file|dir] [--json]
//! leasehold clean [--dir DIR] [--strategy file|dir] [--dry-run] [--json]
//! leasehold man [SUBCOMMAND]
//! leasehold completions bash|zsh|fish|elvish|powershell
//! leasehold --version
//! ```
//!
//! # As flock(1)
//!
//! flock(1)'s options mean the same: `-n`/`--nonblock` (also `--no-wait`),
//! `-w`/`--timeout` (also `--wait`; seconds with fractions, or `90s`,
//! `5m`, `1h30m`), `-E`/`--conflict-exit-code` (default 1), `-s`/`--shared`,
//! `-x`/`--exclusive` (the last of the two wins), `-c`/`--command` (run
//! through `sh -c`), `-o`/`--close` (accepted: CMD never holds a descriptor
//! of the lock, the tool does, so there is nothing to close) and
//! `--verbose`. Not taken: flock(1)'s descriptor form (`flock 9` in a
//! script that opened the file itself), `-u` and `-F` (the tool must stay
//! to renew the lease and guard CMD); they are usage errors. An argument
//! with a `/` (or `--file PATH`) is a lock file
//! given by its path, as flock(1) takes it, so a crontab line changes by one
//! word:
//!
//! ```text
//! */5 * * * *  flock     -n /var/lock/backup.lock /usr/local/bin/backup
//! */5 * * * *  leasehold run -n /var/lock/backup.lock /usr/local/bin/backup
//! ```
//!
//! That locks exactly `/var/lock/backup.lock`, in `/var/lock` (which must
//! exist: it is never created; a world-writable directory must be sticky,
//! as `/var/lock` and `/tmp` are). The file exists while the lock is
//! held (flock(1)'s stays), and the fencing counter `backup.lock.fence`
//! stays beside it; held shared or as a semaphore, its holders are listed
//! in the directory `backup.lock.members` beside it, removed with the last
//! of them. The empty file flock(1) leaves behind is taken over
//! once it is a second old and nobody holds its `flock`; one that flock(1)
//! holds is waited for. A PATH that holds anything else (a file of data
//! held by flock(1) or not, such as a script that locks itself with
//! `flock -en "$0"`; a directory holding anything but a lock record in
//! `owner.json`) is refused with status 2 and left as it is. (The library
//! itself refuses content that no lock writer produces; the tool also
//! refuses JSON that is not shaped as one of the three kinds of record,
//! such as `{"uuid":"…","pid":7}` in a file of data, which the library
//! would judge a lock, and remove once stale.) A name without `/` is a lock in the lock directory.
//! Do not take one path with flock(1) and leasehold at the same time:
//! flock(1) never removes its file, and a waiter of one kind can miss a
//! file the other removed.
//!
//! Like flock(1), the tool prints nothing of its own on success, nor when
//! `-n` finds the lock held or `-w` runs out (only the exit status tells,
//! so cron mails nothing). `--verbose` says who holds the lock (pid, host,
//! since) when it must wait, again every 5 seconds, and how long the wait
//! took. On a terminal, a wait longer than 2 seconds shows one live line
//! (instead of the repeated `--verbose` lines)
//! (`waiting 12s for lock "backup", held by pid 4242 on db1 for 1m3s`),
//! erased when the wait ends.
//!
//! What flock(1) cannot do: a lease (`--lease`, default 30 s) so that a
//! holder on a frozen or vanished host loses the lock, a lost lock that
//! stops CMD (`--kill-after`), owner records that `holder`, `list` and
//! `clean` read, semaphores (`--permits`), `--json`, and locks shared
//! with services that use the library.
//!
//! # Commands
//!
//! - `run` takes the lock NAME (waiting as long as it takes, at most SECS
//!   with `-w`, not at all with `-n`), runs CMD (or `sh -c STRING` with
//!   `-c`) while holding it
//!   (the lease is renewed in the background) and releases it once CMD and
//!   every process left in CMD's process group have exited. CMD inherits
//!   stdio and gets `LEASEHOLD_NAME` (the NAME or PATH as given) and
//!   `LEASEHOLD_FENCING_TOKEN` in its environment.
//!
//!   By default the lock is exclusive: one `run` of NAME at a time. With
//!   `--shared` (`-s`) it is held shared: any number of `--shared` runs of
//!   NAME at once, never together with an exclusive one. Shared runs
//!   prefer writers: once an exclusive `run` waits for NAME, new shared
//!   runs queue behind it (and `--no-wait` ones give up). With
//!   `--permits N`, NAME is a counting semaphore and the run holds one of
//!   its N permits: at most N such runs at once, never together with an
//!   exclusive one. Every `--permits` run of NAME must give the same N,
//!   and NAME cannot be held shared and as a semaphore at once: such a
//!   mismatch fails at once with status 78, without waiting. Everything
//!   else (waiting, `--wait`, `--no-wait`, signals, the watchdog, the
//!   lease and its loss, exit statuses) is the same for the three kinds.
//!
//!   CMD runs in a process group of its own, which its children join
//!   unless they leave it. That group is what the tool signals, waits for
//!   and kills. Like flock(1), where every process that inherited the lock
//!   keeps it, the lock stays held (and renewed) after CMD exits while
//!   anything it started is still running in its group (`sh -c 'job &'`);
//!   the tool then exits with CMD's own status. SIGINT, SIGTERM and SIGHUP
//!   sent to the tool are forwarded to the group. If the lock is lost, a
//!   warning is printed, the group is sent SIGTERM, then SIGKILL if it is
//!   not empty `--kill-after` later (default 5 s, or a sixth of a
//!   `--lease` shorter than 30 s, which keeps it inside the margin at which
//!   a failing renewal reports the loss), and the tool exits
//!   with status 75 whatever CMD's own status was.
//!
//!   The group dies with the tool: if the tool dies without releasing the
//!   lock (SIGKILL, the OOM killer, a crash), a watchdog process it started
//!   before taking the lock (this same binary, in a group of its own,
//!   immune to SIGINT, SIGTERM and SIGHUP) sees its pipe from the tool
//!   close and SIGKILLs CMD's group; on Linux the kernel also SIGKILLs CMD
//!   itself (`PR_SET_PDEATHSIG`). So CMD and its group never run on
//!   without the lock. If the watchdog cannot be started, CMD is not run
//!   (status 2). Not covered: a process that leaves the group (`setsid`,
//!   `setpgid`, a daemon), which is on its own; a set-user-ID,
//!   set-group-ID or file-capability process (`sudo`), which the tool may
//!   not signal (the lock then stays held until it exits, and a killed
//!   tool cannot stop it); a killed watchdog. The kill is asynchronous:
//!   CMD's group dies moments after the tool, not at the same instant.
//!
//!   In a terminal: when the tool has a controlling terminal whose
//!   foreground process group is the tool's (whatever stdin is), the tool
//!   hands the terminal to CMD's group and takes it back before exiting,
//!   so CMD can use it (prompts through `/dev/tty` included) and Ctrl-C
//!   signals CMD's group directly (the tool does not see it; it waits for
//!   the group as usual; a producer piped into the tool is not signalled,
//!   and ends at its next write once CMD is gone). Run in the background
//!   (`&`, cron), CMD's group is in the background too. Job control is not
//!   supported: Ctrl-Z stops CMD's group but
//!   not the tool, and the shell waits for the tool (still holding the
//!   lock) until CMD is continued (`kill -CONT`) or killed from elsewhere.
//! - `holder` tells who holds NAME and how (exclusive, shared, or a
//!   semaphore of N permits), listing every holder of a shared lock or a
//!   semaphore; `list` shows every lock in the directory, with its kind
//!   and holders; `clean` removes stale locks and crash leftovers (never a
//!   live lock, never a file of data whose name ends in `.lock`, such as
//!   `Cargo.lock` or a pid file: `list` leaves those out too), or with
//!   `--dry-run` says what it would remove. None of
//!   them creates a directory: on one that does not exist they say so and
//!   exit 66.
//! - `man [SUBCOMMAND]` writes the man page (roff) of the tool, or of
//!   `run`, `holder`, ... as `leasehold-run(1)` and so on, to stdout;
//!   `completions SHELL` writes a completion script. Both come from the
//!   definitions the parser uses, so they never disagree with it.
//!
//! The directory is `--dir`, else `$LEASEHOLD_DIR` (an explicit choice,
//! like `--dir`), else the library's per-user default,
//! `/run/lock/leasehold-<uid>` on Linux, `/tmp/leasehold-<uid>` elsewhere.
//! The default depends on the user and the host only, never on other
//! environment variables (`TMPDIR`, `XDG_RUNTIME_DIR`, `HOME`), so cron,
//! systemd units, `sudo -u`, ssh and login shells of one user agree on it.
//! It has no fallback: where it cannot be used (no `/run/lock`, one this
//! user may not write in, a mount namespace with a `/run/lock` of its own)
//! the tool fails, saying to give `--dir`, rather than take a place another
//! process might not.
//!
//! # Exit codes
//!
//! | code | meaning | flock(1) |
//! |---|---|---|
//! | CMD's status | `run`: CMD ran, and its process group is empty; 128+N if CMD was killed by signal N | the same |
//! | 0 | `holder`: the lock is held; `list`, `clean`, `man`, `completions`: success | |
//! | 1 | `run`: the lock was held (`-n`) or `-w` ran out (see `-E`); `holder`: the lock is free | the same |
//! | 2 | bad usage (`--permits 0`, `-w 5x`, `--shared` with `--permits`, ...), or an error from the lock library (printed as `leasehold: ...`); `run`: the watchdog could not be started (CMD never ran, the lock was not taken) | 64 for bad usage |
//! | 66 | the lock directory does not exist (`holder`, `list`, `clean` never create it), or a PATH's directory does not exist or is a file (`run`, `holder`); sysexits' `EX_NOINPUT` | the same, when it cannot open the lock file |
//! | 75 | `run`: the lock was lost while CMD or its process group ran; the group was stopped (or had already exited) | no leases: never |
//! | 78 | `run --shared` or `run --permits N`: NAME is held as another kind (a semaphore of another count, a semaphore when asked shared, or shared when asked for a permit); CMD never ran. sysexits' `EX_CONFIG`: the processes using NAME disagree on what it is | no semaphores: never |
//! | 126, 127 | `run`: CMD could not be executed, or was not found (as a shell says) | 69 for both |
//! | 128+N | `run`: signal N arrived while waiting for the lock (CMD never ran) | dies of the signal |
//!
//! # JSON output
//!
//! With `--json`, stdout is one JSON document: for `holder` an object, for
//! `list` and `clean` an array of objects (for `clean`, the locks removed,
//! or that would be with `--dry-run`). Every object has these keys (the
//! owner keys are those of the holder whose record the lock path shows,
//! for a shared lock or a semaphore one of its holders):
//!
//! | key | type | meaning |
//! |---|---|---|
//! | `name` | string | lock name (from the record, else from the file name) |
//! | `path` | string | path of the lock file or directory |
//! | `pid` | number or null | holder process id |
//! | `hostname` | string or null | holder host |
//! | `holderId` | string or null | id of the holding `Locker` |
//! | `acquiredAt` | string or null | RFC 3339, UTC |
//! | `leaseExpiresAt` | string or null | RFC 3339, UTC, as last renewed |
//! | `fencingToken` | number or null | the holder's fencing token |
//! | `state` | string | `"held"` or `"stale"`; for `holder` also `"free"` (then the owner keys are null) |
//! | `staleReason` | string or null | why a stale lock is stale, e.g. `"owner process is dead"` |
//! | `kind` | string or null | `"exclusive"`, `"shared"` or `"semaphore"`; null for a free lock |
//! | `permits` | number or null | a semaphore's permit count; null for other kinds |
//! | `holders` | array | every holder, oldest first: one for an exclusive lock, each shared holder or permit holder otherwise, none for a free lock. Each is an object with the keys `pid`, `hostname`, `holderId`, `acquiredAt`, `leaseExpiresAt` and `fencingToken`, as above |
//! | `fields` | object | the owner fields the holder published ([`LockerBuilder::owner_field`](leasehold::LockerBuilder::owner_field), velocious's `host` and `port`); `{}` when none |
//!
//! `run --json` writes one JSON object per line to stderr (stdout is
//! CMD's) for what happens to the lock, each with `event` and `lock` (the
//! NAME or PATH as given), and:
//!
//! | `event` | when | more keys |
//! |---|---|---|
//! | `"waiting"` | the lock is held: the run waits | `holders` (as above), `waitLimitMs` (number, or null without `-w`) |
//! | `"acquired"` | the lock is taken; CMD starts | `waitedMs`, `fencingToken` |
//! | `"busy"` | `-n` found the lock held | `waitedMs`, `holders`, `exitCode` |
//! | `"timeout"` | `-w` ran out | `waitedMs`, `holders`, `exitCode` |
//! | `"lost"` | the lock was lost while CMD ran (the warning follows) | `killAfterMs` (null if CMD had already exited) |

// Denied, not forbidden: guarding CMD between fork and exec needs one
// `pre_exec` hook, fenced in `guard_command`. The library forbids it.
#![deny(unsafe_code)]

use std::error::Error as StdError;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand, ValueEnum};
use leasehold::{LockGuard, LockInfo, LockKind, Locker, Owner, PathStyle, Semaphore, Strategy};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::signal::unix::{SignalKind, signal};

// Beside this file, not in src/bin/, where Cargo would take each for a
// binary of its own.
#[path = "leasehold/duration.rs"]
mod duration;
#[path = "leasehold/output.rs"]
mod output;
#[path = "leasehold/process.rs"]
mod process;
#[path = "leasehold/status.rs"]
mod status;
#[path = "leasehold/target.rs"]
mod target;

use duration::parse_duration;
use output::{chain, clean, conflict, emit, holder, holder_entry, holders_of, list, warn};
use process::{
    GROUP_POLL, Terminal, WATCHDOG, Watchdog, become_subreaper, group_is_empty, guard_command, reap_orphans,
    signal_group, watchdog,
};
use status::Waiting;
use target::Target;

/// Exit status for library and setup errors; clap uses it for bad usage too.
const EXIT_ERROR: u8 = 2;

/// Exit status when the lock directory (or, for a lock given by its path,
/// its directory) does not exist: sysexits' `EX_NOINPUT`, as flock(1)
/// exits when it cannot open the lock file.
const EXIT_NO_DIRECTORY: u8 = 66;

/// Exit status of `run` when the lock was lost while CMD ran: sysexits'
/// `EX_TEMPFAIL`, distinct from the tool's other statuses.
const EXIT_LOST: u8 = 75;

/// Exit status of `run --shared` or `run --permits` when NAME is held as
/// another kind: sysexits' `EX_CONFIG`, for processes that disagree on
/// what NAME is.
const EXIT_KIND_MISMATCH: u8 = 78;

/// The library's default lease, which `run` keeps unless `--lease` says.
const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The end of `leasehold run -h`.
const RUN_SHORT_HELP: &str = "\
Like flock(1): leasehold run [-n | -w DURATION] [-E N] [-s | -x] NAME|PATH (CMD ARGS... | -c STRING)
See --help for the exit statuses, the kinds of lock, signals and the differences from flock(1).";

/// The end of `leasehold run --help`.
const RUN_HELP: &str = "\
Exit status:
  CMD's status  CMD ran and exited, and its process group is empty
  128+N         CMD was killed by signal N; or signal N arrived while waiting for
                the lock (CMD never ran)
  1             the lock was held (-n) or -w ran out; see -E (--conflict-exit-code)
  2             bad usage (e.g. --permits 0, -w 5x, --shared with --permits), an
                error from the lock library, or the watchdog could not be started
                (then CMD never ran)
  66            the lock's directory does not exist, or a PATH's is a file (a PATH's
                directory is never created; as flock(1), which says it cannot
                open the lock file)
  75            the lock was lost while CMD or its group ran: the group was sent
                SIGTERM, then SIGKILL after --kill-after (or it had already exited
                when the loss was found)
  78            --shared or --permits N: NAME is held as another kind (a semaphore of
                another count, or shared vs semaphore); CMD never ran
  126, 127      CMD could not be executed, or was not found (flock(1) says 69)

Output: none of leasehold's own on success, nor on -n or -w giving up (as flock(1),
so cron mails nothing). --verbose says who holds the lock (pid, host, since) when
it must wait, again every 5 s, and how long the wait took. On a terminal, a wait
longer than 2 s shows one live line instead of the repeated ones (waiting Ts for
lock NAME, held by pid P on H for Ts), erased when the wait ends.

The lock: NAME is a lock in the lock directory (--dir, $LEASEHOLD_DIR, or the
per-user default). An argument with a `/`, or --file PATH, is a lock file given by
its path, as flock(1) takes it: exactly that file, in its directory, which must
exist; --dir does not apply. leasehold creates the file when it takes the lock and
removes it when it releases it, and keeps its fencing counter beside it
(PATH.fence); held shared or as a semaphore, it lists its holders in the directory
PATH.members, removed with the last of them. An empty file that flock(1) left
behind is taken over once it is a second old and nobody holds it; one that
flock(1) holds is waited for. A PATH
that holds anything else (a file of data, held by flock(1) or not; a directory that
is no lock) is refused (status 2) and left as it is. Not taken from flock(1): its descriptor form (flock 9, in
a script that opened the file itself), -u (unlock a descriptor) and -F (no fork:
leasehold must stay to renew the lease and guard CMD); they are usage errors. Do not
take one path with flock(1) and leasehold at once, though: flock(1) never removes
its file, and a waiter of one kind can miss a file the other removed.

Kinds: without --shared or --permits the lock is exclusive (one run at a time).
--shared runs overlap each other but never an exclusive run; a waiting exclusive
run holds back new shared runs. --permits N runs hold one of N permits of the
semaphore NAME (at most N at once); every run of NAME must give the same N.

CMD runs in a process group of its own. The lock is held until CMD and every
process left in its group have exited (like flock(1), a background job of CMD
keeps the lock); the status is then CMD's own. -o is accepted for flock(1)'s
sake: CMD never holds a descriptor of the lock, leasehold does, so there is
nothing to close. SIGINT, SIGTERM and SIGHUP are forwarded to the group; a lost
lock stops the whole group. If leasehold dies without releasing the lock
(SIGKILL, the OOM killer), a watchdog process SIGKILLs CMD's group, so nothing of
CMD runs on without the lock (flock(1)'s lock dies with the last process that
holds its descriptor); if the watchdog cannot be started, CMD is not run. A
process that leaves the group (setsid, a daemon) is not covered, nor a
set-user-ID or file-capability one (sudo). In a terminal, CMD's group gets the
terminal while it runs (Ctrl-C goes to it); Ctrl-Z (job control) is not
supported.

--json: one JSON object per line on stderr for each event: {\"event\": \"waiting\" |
\"acquired\" | \"busy\" | \"timeout\" | \"lost\", \"lock\": ..., ...}, with the holders (as
`leasehold holder --json` shows them), waitedMs, fencingToken, exitCode or
killAfterMs.

Durations: seconds (fractions allowed: 0.5) or units ms, s, m, h, d (90s, 5m,
1h30m, 1.5h).";

type Failure = Box<dyn StdError + Send + Sync>;

/// Named cross-process locks: run a command under a lock, inspect and clean
/// a lock directory.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run CMD while holding a lock (exclusive, shared, or one permit of a semaphore), as flock(1) does; exit with CMD's status.
    #[command(
        after_help = RUN_SHORT_HELP,
        after_long_help = RUN_HELP,
        override_usage = "leasehold run [OPTIONS] NAME|PATH [--] CMD [ARGS]...\n       \
                          leasehold run [OPTIONS] NAME|PATH -c STRING\n       \
                          leasehold run [OPTIONS] --file PATH (-- CMD [ARGS]... | -c STRING)"
    )]
    Run(RunArgs),
    /// Show who holds the lock NAME (or the lock file PATH); exit 0 if held, 1 if free, 66 if its directory does not exist.
    Holder {
        /// The lock: a NAME in the lock directory, or the PATH of a lock file (an argument with a `/`).
        #[arg(value_name = "NAME|PATH")]
        name: String,
        #[command(flatten)]
        opts: Inspect,
    },
    /// List every lock in the directory, held or stale (files of data named *.lock are no locks, and left out); exit 66 if the directory does not exist.
    List(Inspect),
    /// Remove stale locks and crash leftovers; live locks, and files of data named *.lock (Cargo.lock, a pid file), are never touched. Exit 66 if the directory does not exist.
    Clean {
        #[command(flatten)]
        opts: Inspect,
        /// Only report what would be removed.
        #[arg(long)]
        dry_run: bool,
    },
    /// Print the man page (roff) of leasehold, or of one subcommand, to stdout.
    Man {
        /// The subcommand whose page to print, e.g. `leasehold man run > leasehold-run.1`.
        #[arg(value_parser = PAGES.map(|(sub, _)| sub))]
        subcommand: Option<String>,
    },
    /// Print the completion script for SHELL to stdout.
    Completions {
        /// e.g. `leasehold completions bash > /etc/bash_completion.d/leasehold`.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Args)]
struct Inspect {
    #[command(flatten)]
    common: Common,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct Common {
    /// Lock directory [default: $LEASEHOLD_DIR, else /run/lock/leasehold-<uid> on Linux (/tmp/leasehold-<uid> elsewhere), with no fallback; never from TMPDIR or XDG_RUNTIME_DIR]
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// On-disk layout of the locks.
    #[arg(long, value_enum, default_value_t = StrategyArg::File)]
    strategy: StrategyArg,
}

#[derive(Debug, Args)]
// As getopt in flock(1): a repeated option is no error, the last one wins.
#[command(args_override_self = true)]
struct RunArgs {
    /// The lock: a NAME in the lock directory, or, as flock(1) takes it, the PATH of a lock file (any argument with a `/`, e.g. /var/lock/backup.lock or ./job.lock).
    #[arg(value_name = "NAME|PATH", required_unless_present = "file")]
    lock: Option<String>,
    /// Lock the file PATH (in its directory, which must exist), even without a `/` in it. Put `--` before a CMD with options of its own.
    #[arg(long, value_name = "PATH")]
    file: Option<String>,
    /// Hold the lock shared: shared runs overlap, but never an exclusive one (as flock -s).
    #[arg(short = 's', long, overrides_with = "exclusive", conflicts_with = "permits")]
    shared: bool,
    /// Hold the lock exclusively: one run at a time (the default; as flock -x).
    #[arg(short = 'x', long, overrides_with = "shared", conflicts_with = "permits")]
    exclusive: bool,
    /// Hold one permit of the semaphore NAME of N permits: at most N such runs at once. Every run of NAME must give the same N.
    #[arg(long, value_name = "N", value_parser = parse_permits)]
    permits: Option<u32>,
    #[command(flatten)]
    common: Common,
    /// Wait at most DURATION for the lock: seconds (fractions allowed) or e.g. 90s, 5m, 1h30m (as flock -w, --timeout) [default: forever]
    #[arg(short = 'w', long, visible_alias = "timeout", value_name = "DURATION", value_parser = parse_duration)]
    wait: Option<Duration>,
    /// Give up at once if the lock is held (as flock -n, --nonblock); with -w too, -n wins, as in flock(1).
    #[arg(short = 'n', long, visible_alias = "nonblock")]
    no_wait: bool,
    /// Exit status when the lock could not be taken (held with -n, or -w ran out).
    #[arg(short = 'E', long, value_name = "N", default_value_t = 1)]
    conflict_exit_code: u8,
    /// The lease: how long the lock outlives a holder that stops renewing it (frozen, or on a host that went away) [default: 30s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    lease: Option<Duration>,
    /// If the lock is lost, CMD's process group gets SIGTERM, then SIGKILL this long after [default: 5s, or a sixth of a shorter --lease]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    kill_after: Option<Duration>,
    /// Accepted for flock(1) compatibility: CMD never holds a descriptor of the lock (leasehold holds it), so there is none to close. The lock is still held until CMD's process group is empty.
    #[arg(short = 'o', long)]
    close: bool,
    /// Say who holds the lock when it must wait, every few seconds while it waits, and how long it waited.
    #[arg(long)]
    verbose: bool,
    /// Write one JSON object per line to stderr for what happens to the lock: waiting, acquired, busy, timeout, lost (see --help).
    #[arg(long)]
    json: bool,
    /// Run STRING through `sh -c` instead of CMD (as flock -c).
    #[arg(
        short = 'c',
        long = "command",
        value_name = "STRING",
        conflicts_with = "command"
    )]
    shell_command: Option<OsString>,
    /// The command to run, and its arguments; `--` before it is needed only when CMD starts with `-`.
    // Not required with --file either: clap then takes CMD's first word
    // for NAME|PATH (`--file x -- true`), and `resolve` moves it back, or
    // says that no command was given.
    #[arg(
        trailing_var_arg = true,
        value_name = "CMD",
        required_unless_present_any = ["shell_command", "file"]
    )]
    command: Vec<OsString>,
}

impl RunArgs {
    /// The lock, and CMD with its arguments, in the order flock(1) allows.
    fn resolve(&mut self) -> Result<(Target, Vec<OsString>), String> {
        let target = match (&self.file, &self.lock) {
            (Some(_), Some(first)) if self.shell_command.is_some() => {
                return Err(format!(
                    "with --file, put -- before the command: its -c was taken for leasehold's (CMD {first:?})"
                ));
            }
            (Some(file), lock) => {
                // With --file, clap took CMD's first word for the lock.
                if let Some(first) = lock {
                    self.command.insert(0, first.into());
                }
                Target::parse(file, true)?
            }
            (None, Some(lock)) => Target::parse(lock, false)?,
            (None, None) => return Err("no lock given".to_owned()),
        };
        if matches!(target, Target::Path { .. }) && self.common.dir.is_some() {
            return Err(format!(
                "--dir cannot be used with a lock given by its path ({:?}): the path says where the lock is",
                target.shown()
            ));
        }
        let command = match &self.shell_command {
            Some(_) if !self.command.is_empty() => {
                return Err(
                    "-c takes one command string; give CMD and its arguments without -c, or quote them"
                        .to_owned(),
                );
            }
            Some(script) => vec!["sh".into(), "-c".into(), script.clone()],
            None if self.command.is_empty() => return Err("no command given".to_owned()),
            None => std::mem::take(&mut self.command),
        };
        Ok((target, command))
    }

    /// `--kill-after`, else 5 s, which is inside the 7.5 s safety margin
    /// of the default 30 s lease: when failing renewals report the loss at
    /// that margin (a quarter of the lease), a CMD that ignores SIGTERM is
    /// killed before anyone else may take the lock. A shorter lease gets a
    /// sixth of itself, which keeps that proportion.
    fn kill_after(&self) -> Duration {
        let default = Duration::from_secs(5);
        self.kill_after
            .unwrap_or_else(|| self.lease.map_or(default, |lease| (lease / 6).min(default)))
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StrategyArg {
    /// One lock file per name.
    File,
    /// One lock directory holding owner.json per name.
    Dir,
}

fn main() -> ExitCode {
    // Internal to `run`, so not a subcommand: the man page and the
    // completions would show it.
    let mut argv = std::env::args_os().skip(1);
    if let (Some(first), None) = (argv.next(), argv.next())
        && first == WATCHDOG
    {
        return watchdog();
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Man { subcommand } => return man(subcommand.as_deref()),
        Command::Completions { shell } => return completions(shell),
        // In every thread, so before the runtime starts any: handing the
        // terminal back from the background needs it, and the tool must not
        // be stopped by writing a warning while CMD's group has the
        // terminal (`stty tostop`): stopped, it would not renew the lease.
        Command::Run(_) => {
            let _ = nix::sys::signal::SigSet::from(Signal::SIGTTOU).thread_block();
        }
        _ => {}
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            warn(&format!("cannot start the async runtime: {e}"));
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run(args).await,
            Command::Holder { name, opts } => holder(&name, &opts).await,
            Command::List(opts) => list(&opts).await,
            Command::Clean { opts, dry_run } => clean(&opts, dry_run).await,
            Command::Man { .. } | Command::Completions { .. } => Ok(EXIT_ERROR),
        }
    });
    // Nothing of ours should linger, but never hang on exit if it does.
    runtime.shutdown_timeout(Duration::from_secs(1));
    ExitCode::from(result.unwrap_or_else(|e| {
        warn(&chain(&*e));
        EXIT_ERROR
    }))
}

/// The subcommands with a page of their own, `leasehold-run(1)` and so
/// on, as git names its pages.
const PAGES: [(&str, &str); 6] = [
    ("run", "leasehold-run"),
    ("holder", "leasehold-holder"),
    ("list", "leasehold-list"),
    ("clean", "leasehold-clean"),
    ("man", "leasehold-man"),
    ("completions", "leasehold-completions"),
];

/// `leasehold man [SUBCOMMAND]`: the page, from the parser's own definitions.
fn man(subcommand: Option<&str>) -> ExitCode {
    use clap::CommandFactory;
    let top = Cli::command();
    let page = match subcommand {
        None => top,
        Some(name) => match (
            top.find_subcommand(name),
            PAGES.iter().find(|(sub, _)| *sub == name),
        ) {
            (Some(sub), Some((_, page))) => sub.clone().name(*page),
            _ => return ExitCode::from(EXIT_ERROR),
        },
    };
    let mut roff = Vec::new();
    if let Err(e) = clap_mangen::Man::new(page).render(&mut roff) {
        warn(&format!("cannot render the man page: {e}"));
        return ExitCode::from(EXIT_ERROR);
    }
    emit(&String::from_utf8_lossy(&roff));
    ExitCode::SUCCESS
}

/// `leasehold completions SHELL`.
fn completions(shell: clap_complete::Shell) -> ExitCode {
    use clap::CommandFactory;
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "leasehold", &mut script);
    emit(&String::from_utf8_lossy(&script));
    ExitCode::SUCCESS
}

/// `--permits`: a semaphore needs at least one permit, and no more than
/// the library counts.
fn parse_permits(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(0) => Err("a semaphore needs at least one permit".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a number of permits (1 to {})", u32::MAX)),
    }
}

/// How `run` holds NAME.
enum Want {
    Exclusive,
    Shared,
    Permit(Semaphore),
}

impl Want {
    fn new(args: &RunArgs, locker: &Locker, name: &str) -> Result<Self, leasehold::Error> {
        Ok(match (args.shared, args.permits) {
            (_, Some(permits)) => Want::Permit(locker.semaphore(name, permits)?),
            (true, None) => Want::Shared,
            (false, None) => Want::Exclusive,
        })
    }

    /// Every acquisition below is cancel safe, as the library's are.
    async fn try_acquire(&self, locker: &Locker, name: &str) -> leasehold::Result<Option<LockGuard>> {
        match self {
            Want::Exclusive => locker.try_acquire(name).await,
            Want::Shared => locker.try_acquire_shared(name).await,
            Want::Permit(semaphore) => semaphore.try_acquire().await,
        }
    }

    async fn acquire(&self, locker: &Locker, name: &str) -> leasehold::Result<LockGuard> {
        match self {
            Want::Exclusive => locker.acquire(name).await,
            Want::Shared => locker.acquire_shared(name).await,
            Want::Permit(semaphore) => semaphore.acquire().await,
        }
    }

    async fn acquire_timeout(
        &self,
        locker: &Locker,
        name: &str,
        wait: Duration,
    ) -> leasehold::Result<LockGuard> {
        match self {
            Want::Exclusive => locker.acquire_timeout(name, wait).await,
            Want::Shared => locker.acquire_shared_timeout(name, wait).await,
            Want::Permit(semaphore) => semaphore.acquire_timeout(wait).await,
        }
    }
}

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
fn inspecting(
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

/// Signals the tool forwards to CMD's process group. Installed before the wait for the lock,
/// so a signal is never lost between taking the lock and spawning CMD.
struct Forwarded([tokio::signal::unix::Signal; 3]);

impl Forwarded {
    fn install() -> Result<Self, Failure> {
        let one = |kind| signal(kind).map_err(|e| format!("cannot install a signal handler: {e}"));
        Ok(Self([
            one(SignalKind::interrupt())?,
            one(SignalKind::terminate())?,
            one(SignalKind::hangup())?,
        ]))
    }

    /// The next signal; never resolves if the signal driver has gone away,
    /// rather than spinning.
    async fn recv(&mut self) -> Signal {
        let [int, term, hup] = &mut self.0;
        tokio::select! {
            Some(()) = int.recv() => Signal::SIGINT,
            Some(()) = term.recv() => Signal::SIGTERM,
            Some(()) = hup.recv() => Signal::SIGHUP,
            else => std::future::pending().await,
        }
    }
}

async fn run(mut args: RunArgs) -> Result<u8, Failure> {
    let started = std::time::Instant::now();
    let (target, argv) = match args.resolve() {
        Ok(resolved) => resolved,
        Err(e) => {
            warn(&e);
            return Ok(EXIT_ERROR);
        }
    };
    let kill_after = args.kill_after();
    // A failing renewal reports the loss a quarter of the lease before it
    // runs out (the renew interval, a third, is longer): a longer grace
    // lets CMD run on after another process may have taken the lock.
    let margin = args.lease.unwrap_or(DEFAULT_LEASE) / 4;
    if kill_after > margin {
        warn(&format!(
            "warning: --kill-after {kill_after:?} is longer than the {margin:?} between a failing renewal and the end of the lease: if the lock is lost, the command may still run when another process takes it"
        ));
    }
    let mut signals = Forwarded::install()?;
    // Before the lock is taken, so that a tool that cannot guard CMD never
    // takes it: CMD must not run without the watchdog.
    let watchdog = match Watchdog::start() {
        Ok(watchdog) => watchdog,
        Err(e) => {
            warn(&format!(
                "cannot start the watchdog that stops the command if leasehold dies: {}; not running the command",
                chain(&*e)
            ));
            return Ok(EXIT_ERROR);
        }
    };
    become_subreaper()?;
    if let Some(refused) = path_under_a_file(&target) {
        warn(&refused);
        return Ok(EXIT_NO_DIRECTORY);
    }
    let how = Build {
        fencing: true,
        create: true,
        read_only: false,
        lease: args.lease,
    };
    let locker = match locker(&args.common, Some(&target), how) {
        Ok(locker) => locker,
        Err(e) => match (&target, missing_directory(&e)) {
            (Target::Path { given, .. }, Some(dir)) => {
                // flock(1) says "cannot open lock file", with EX_NOINPUT too.
                warn(&format!(
                    "cannot lock {given:?}: its directory {} does not exist (a lock given by its path never creates directories)",
                    dir.display()
                ));
                return Ok(EXIT_NO_DIRECTORY);
            }
            _ => return Err(e.into()),
        },
    };
    let (name, shown) = (target.name(), target.shown());
    if let Target::Path { dir, file, .. } = &target {
        let directories = matches!(args.common.strategy, StrategyArg::Dir);
        if let Err(refused) = target::check_lock_path(dir, file, directories) {
            warn(&refused);
            return Ok(EXIT_ERROR);
        }
    }
    let want = Want::new(&args, &locker, name)?;
    let waiting = Waiting::new(shown, args.verbose, args.json, started);
    let attempt = async {
        if let Some(guard) = want.try_acquire(&locker, name).await? {
            return Ok(Some(guard));
        }
        if args.no_wait || args.wait == Some(Duration::ZERO) {
            return Ok(None);
        }
        let wait = async {
            match args.wait {
                None => want.acquire(&locker, name).await.map(Some),
                Some(wait) => {
                    let left = wait.saturating_sub(started.elapsed());
                    match want.acquire_timeout(&locker, name, left).await {
                        Err(e) if e.is_timeout() => Ok(None),
                        other => other.map(Some),
                    }
                }
            }
        };
        tokio::select! {
            got = wait => got,
            never = waiting.report(&locker, name, &want, args.wait) => match never {},
        }
    };
    // Dropping the attempt on a signal is safe: acquisition is cancel safe.
    let guard = tokio::select! {
        guard = attempt => guard,
        sig = signals.recv() => return Ok(128 + sig as u8),
    };
    let guard = match guard {
        Ok(guard) => guard,
        Err(e @ leasehold::Error::KindMismatch { .. }) => {
            let found = locker.inspect(name).await.ok().flatten();
            let holders = match found.filter(|l| !l.is_stale()) {
                Some(info) => format!(" (by {})", holders_of(&info)),
                None => String::new(),
            };
            warn(&format!(
                "{}{holders}; the runs of a name must agree: every --permits run of it gives the same N, and it is never held with --shared and --permits at once",
                chain(&e)
            ));
            return Ok(EXIT_KIND_MISMATCH);
        }
        Err(e) => return Err(e.into()),
    };
    let Some(guard) = guard else {
        // Quiet, as flock(1): a cron job that finds its lock held every
        // minute must not mail every minute.
        let timed_out = args.wait.is_some() && !args.no_wait;
        if args.json {
            let found = locker.inspect(name).await.ok().flatten();
            let kind = if timed_out { "timeout" } else { "busy" };
            waiting.gave_up(kind, found.as_ref(), args.conflict_exit_code);
        }
        drop(waiting);
        if args.verbose {
            let found = locker.inspect(name).await.ok().flatten();
            let held = conflict(found.as_ref(), &want);
            match args.wait {
                Some(wait) if !args.no_wait => warn(&format!(
                    "gave up after {wait:?} waiting for lock {shown:?}: {held}"
                )),
                _ => warn(&format!("lock {shown:?} is {held}")),
            }
        }
        return Ok(args.conflict_exit_code);
    };
    waiting.took(guard.fencing_token());
    drop(waiting);

    let Some((program, rest)) = argv.split_first() else {
        return Err("no command given".into());
    };
    let mut command = tokio::process::Command::new(program);
    command.args(rest).env("LEASEHOLD_NAME", shown);
    if let Some(token) = guard.fencing_token() {
        command.env("LEASEHOLD_FENCING_TOKEN", token.to_string());
    }
    // CMD leads a process group of its own: the unit that is signalled,
    // waited for and, by the watchdog, killed.
    command.process_group(0);
    let terminal = Terminal::if_foreground();
    // No `.await` from here to the spawn: it forks on the thread checked.
    guard_command(&mut command, &watchdog, terminal.as_ref())?;
    let spawned = command.spawn();
    if let (Some(terminal), Ok(child)) = (&terminal, &spawned) {
        // CMD's hook did this already; shells do it on both sides too.
        terminal.give_to(child.id().and_then(|p| i32::try_from(p).ok()));
    }
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            drop(terminal);
            watchdog.disarm();
            warn(&format!("cannot run {program:?}: {e}"));
            let _ = guard.release().await;
            let not_found = e.kind() == std::io::ErrorKind::NotFound;
            return Ok(if not_found { 127 } else { 126 });
        }
    };
    // Taken now: once reaped, the child no longer reports its pid. CMD's
    // pid is its process group id.
    let Some(group) = child.id().and_then(|p| i32::try_from(p).ok()).map(Pid::from_raw) else {
        // Cannot happen before the child is waited for; never leave it unguarded.
        let _ = child.start_kill();
        return Err("internal error: the command has no process id".into());
    };
    let mut lost = false;
    // When the group gets SIGKILL, once the lock is lost; `None` before,
    // after, or for a grace too long to represent (then SIGTERM is all).
    let mut kill_at: Option<tokio::time::Instant> = None;
    // CMD's own status, once Tokio has collected it.
    let mut status: Option<std::io::Result<std::process::ExitStatus>> = None;
    loop {
        if status.is_some() {
            // Only now: before CMD's status is collected, this would take
            // it from Tokio.
            reap_orphans();
            if group_is_empty(group) {
                break;
            }
        }
        tokio::select! {
            biased;
            done = child.wait(), if status.is_none() => status = Some(done),
            sig = signals.recv() => signal_group(group, sig),
            () = guard.lost(), if !lost => {
                lost = true;
                if args.json {
                    let kill_after_ms = u64::try_from(kill_after.as_millis()).unwrap_or(u64::MAX);
                    status::event("lost", shown, json!({ "killAfterMs": kill_after_ms }));
                }
                warn(&format!(
                    "warning: lock {name:?} was lost while the command ran; sending its process group SIGTERM, and SIGKILL in {:?}",
                    kill_after
                ));
                signal_group(group, Signal::SIGTERM);
                kill_at = tokio::time::Instant::now().checked_add(kill_after);
            }
            () = tokio::time::sleep_until(kill_at.unwrap_or_else(tokio::time::Instant::now)), if kill_at.is_some() => {
                kill_at = None;
                warn(&format!(
                    "warning: the command's process group did not exit within {:?} of SIGTERM; sending it SIGKILL",
                    kill_after
                ));
                signal_group(group, Signal::SIGKILL);
            }
            () = tokio::time::sleep(GROUP_POLL), if status.is_some() => {}
        }
    }
    // The group is empty: nothing is left for the watchdog to kill, and
    // CMD's pid may now be reused by an unrelated process group.
    watchdog.disarm();
    drop(terminal);
    match guard.release().await {
        Ok(()) => {}
        Err(e) if e.is_lost() && lost => {}
        // CMD finished before the loss was noticed, but may have run
        // alongside another holder all the same: the caller must know.
        Err(e) if e.is_lost() => {
            lost = true;
            if args.json {
                status::event("lost", shown, json!({ "killAfterMs": null }));
            }
            warn(&format!(
                "warning: the lock was lost while the command ran: {}",
                chain(&e)
            ));
        }
        Err(e) => warn(&format!("warning: {}", chain(&e))),
    }
    let status = status
        .unwrap_or_else(|| Err(std::io::Error::other("no status")))
        .map_err(|e| format!("cannot wait for the command: {e}"))?;
    if lost {
        return Ok(EXIT_LOST);
    }
    use std::os::unix::process::ExitStatusExt;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + (sig & 0x7f)).unwrap_or(1),
        (None, None) => 1,
    })
}
