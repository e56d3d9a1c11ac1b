//! `leasehold`: named cross-process locks from the shell, and a drop-in
//! for flock(1) in scripts and crontabs.
//!
//! ```text
//! leasehold run [-n | -w DURATION] [-E N] [-s | -x | --permits N] [-o] [--verbose]
//!               [--dir DIR] [--strategy file|dir] [--lease DURATION] [--kill-after DURATION]
//!               NAME|PATH [--] CMD ARGS...
//! leasehold run [options] NAME|PATH -c STRING
//! leasehold [run options] PATH CMD ARGS...      (flock(1)'s own form: `run` without the word)
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
//! through `sh -c`; `cmd /C` on Windows), `-o`/`--close` (accepted: CMD never holds a descriptor
//! of the lock, the tool does, so there is nothing to close) and
//! `--verbose`. Not taken: flock(1)'s descriptor form (`exec 9>/var/lock/x;
//! flock -n 9` in a script that opened the file itself: an all-digits lock
//! argument is refused with status 2, saying to put the command under the
//! lock instead, `leasehold run -n /var/lock/x -- cmd`; a lock file named
//! `9` is `./9` or `--file 9`), `-u` and `-F` (the tool must stay to renew
//! the lease and guard CMD); they are usage errors. An argument with a `/`
//! (or `--file PATH`) is a lock file given by its path, as flock(1) takes
//! it, and flock(1)'s own argument order is taken without the word `run`,
//! so a crontab line changes by one word:
//!
//! ```text
//! */5 * * * *  flock     -n /var/lock/backup.lock /usr/local/bin/backup
//! */5 * * * *  leasehold -n /var/lock/backup.lock /usr/local/bin/backup
//! ```
//!
//! The rule: when the first argument is not a subcommand (`run`, `holder`,
//! `list`, `clean`, `man`, `completions`, `help`) and is an option other
//! than `-h`, `--help`, `-V` and `--version`, or has a `/`, or is all
//! digits, the arguments are those of `run`. A bare word first is always a
//! subcommand, so a mistyped one (`leasehold holdr backup`) is a usage
//! error, never `backup` run under a lock named `holdr`: a NAME in that
//! form needs an option before it (`leasehold -n backup cmd`) or `run`.
//!
//! That locks exactly `/var/lock/backup.lock`, in `/var/lock` (which must
//! exist: it is never created; a world-writable directory must be sticky,
//! as `/var/lock` and `/tmp` are). The file exists while the lock is
//! held (flock(1)'s stays). While it is held, the fencing counter
//! `backup.lock.fence` is beside it, and, held shared or as a semaphore,
//! its holders are listed in the directory `backup.lock.members`; once
//! the lock is free, the run that let it go last has removed them both:
//! after `run`, nothing of leasehold's is left beside PATH (nor in the lock
//! directory for a NAME). A run killed while it held the lock (SIGKILL, the
//! OOM killer) leaves its lock and counter: the next run of that lock
//! removes both, and so does `clean` (the counter, for a lock whose file
//! name ends in `.lock`, as every NAME's does). The empty file flock(1) leaves behind is taken over
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
//!   Fencing tokens: every run of a lock gets a token above those of every
//!   earlier run of it (exclusive and shared, killed runs, other users'
//!   runs, library services with fencing on) as long as the wall clock has
//!   not been stepped back between them. The library counts tokens in
//!   wall-clock microseconds and keeps the last one in the counter
//!   `<lock>.fence` while the lock is held; the tool removes that counter
//!   once the lock is free (above), and where it is missing the library
//!   resumes at the clock plus 8,192 µs, above every token handed out
//!   before (docs/format.md, *Fencing counters*). A library service that
//!   shares a NAME with the tool and relies on its counter to outlast a
//!   clock stepped back should not share it with `run`: its counter is
//!   removed whenever a run lets the lock go free.
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
//!   and holders; `clean` removes stale locks and crash leftovers (the
//!   fencing counter of a lock that is gone among them; never a
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
//! `/run/lock/leasehold-<uid>` on Linux, `leasehold` in the user's local
//! application data folder on Windows, `/tmp/leasehold-<uid>` elsewhere.
//! The default depends on the user and the host only, never on other
//! environment variables (`TMPDIR`, `XDG_RUNTIME_DIR`, `HOME`), so cron,
//! systemd units, `sudo -u`, ssh and login shells of one user agree on it.
//! It has no fallback: where it cannot be used (no `/run/lock`, one this
//! user may not write in, a mount namespace with a `/run/lock` of its own)
//! the tool fails, saying to give `--dir`, rather than take a place another
//! process might not.
//!
//! # On Windows
//!
//! `run` works as above, with a Job object where Unix has CMD's process
//! group and the watchdog:
//!
//! - CMD is created suspended, put in a Job object made with
//!   `JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE`, then resumed: CMD and every
//!   process it starts are in the job (none may break away), and the lock
//!   is held until none of them runs. The tool holds the job's only handle:
//!   when the tool ends in any way (`taskkill /F`, Task Manager, a crash),
//!   the kernel closes it and terminates every process of the job. There
//!   is no watchdog process; if the job cannot be created, CMD is not run
//!   (status 2).
//! - `-c STRING` runs `cmd /S /C "STRING"`: STRING reaches cmd as it is,
//!   quotes included (`%VAR%` expands, `&`, `|` and `>` work).
//! - Ctrl-C and Ctrl-Break: the console delivers them to every process
//!   attached to it, CMD included (it shares the tool's console and
//!   process group), so the tool forwards nothing: it survives them and
//!   waits for CMD's job as usual; CMD decides (a program that does not
//!   handle Ctrl-C exits with `STATUS_CONTROL_C_EXIT`, 0xC000013A, which the
//!   tool then exits with). While the tool waits for the lock, Ctrl-C ends
//!   the wait with 130 and Ctrl-Break with 149 (128 plus the C runtime's
//!   `SIGINT`, 2, and `SIGBREAK`, 21). Closing the console, logging off and
//!   shutting down end the tool, and the job with it. There is no terminal
//!   to hand over, and no job control.
//! - A lost lock terminates the job at once (`TerminateJobObject`): there
//!   is no SIGTERM to give CMD a chance first, so `--kill-after` has no
//!   effect (`"killAfterMs": 0` in the `lost` event). CMD's processes
//!   exit with code 75, and so does the tool.
//! - CMD's exit code is passed on whole, all 32 bits of it (as `%ERRORLEVEL%`
//!   shows it), where Unix keeps a byte.
//!
//! # Exit codes
//!
//! | code | meaning | flock(1) | on Windows |
//! |---|---|---|---|
//! | CMD's status | `run`: CMD ran, and its process group is empty; 128+N if CMD was killed by signal N | the same | CMD's exit code, all 32 bits, once its Job object is empty (no signals: a process the tool terminated exits with the code it gave `TerminateJobObject`, 75) |
//! | 0 | `holder`: the lock is held; `list`, `clean`, `man`, `completions`: success | | the same |
//! | 1 | `run`: the lock was held (`-n`) or `-w` ran out (see `-E`); `holder`: the lock is free | the same | the same |
//! | 2 | bad usage (`--permits 0`, `-w 5x`, `--shared` with `--permits`, ...), or an error from the lock library (printed as `leasehold: ...`); `run`: the watchdog could not be started (CMD never ran, the lock was not taken) | 64 for bad usage | the same, with the Job object for the watchdog |
//! | 66 | the lock directory does not exist (`holder`, `list`, `clean` never create it), or a PATH's directory does not exist or is a file (`run`, `holder`); sysexits' `EX_NOINPUT` | the same, when it cannot open the lock file | the same |
//! | 75 | `run`: the lock was lost while CMD or its process group ran; the group was stopped (or had already exited) | no leases: never | the same: the job was terminated |
//! | 78 | `run --shared` or `run --permits N`: NAME is held as another kind (a semaphore of another count, a semaphore when asked shared, or shared when asked for a permit); CMD never ran. sysexits' `EX_CONFIG`: the processes using NAME disagree on what it is | no semaphores: never | the same |
//! | 126, 127 | `run`: CMD could not be executed, or was not found (as a shell says) | 69 for both | the same |
//! | 128+N | `run`: signal N arrived while waiting for the lock (CMD never ran) | dies of the signal | 130 for Ctrl-C, 149 for Ctrl-Break |
//!
//! # JSON output
//!
//! With `--json`, stdout is one JSON document: for `holder` an object, for
//! `list` and `clean` an array of objects (for `clean`, the locks removed,
//! or that would be with `--dry-run`, then the fencing counters: `name` is
//! the counter's file name, `state` `"stale"`, `staleReason` `"fencing
//! counter of a lock that is gone"`, `kind` null). Every object has these keys (the
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
// `pre_exec` hook, fenced in `guard_command`; on Windows, CMD's Job object
// needs the Win32 calls of job.rs. The library forbids it.
#![deny(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
#[cfg(unix)]
use nix::sys::signal::Signal;

// Beside this file, not in src/bin/, where Cargo would take each for a
// binary of its own. `run` (run.rs) takes its lock (acquire.rs, as want.rs
// says, telling what it waits for in status.rs) and guards CMD
// (process.rs), and leaves nothing beside the lock (tidy.rs); `holder`,
// `list` and `clean` are in inspect.rs. Every
// command builds its `Locker` in locker.rs from the options of args.rs,
// prints through output.rs and exits as exit.rs says. The files import
// each other without a circle, and none imports this one.
#[path = "leasehold/acquire.rs"]
mod acquire;
#[path = "leasehold/args.rs"]
mod args;
#[path = "leasehold/duration.rs"]
mod duration;
#[path = "leasehold/exit.rs"]
mod exit;
#[path = "leasehold/inspect.rs"]
mod inspect;
// Windows: CMD's Job object, for process.rs.
#[cfg(windows)]
#[path = "leasehold/job.rs"]
mod job;
#[path = "leasehold/locker.rs"]
mod locker;
#[path = "leasehold/output.rs"]
mod output;
#[path = "leasehold/process.rs"]
mod process;
#[path = "leasehold/run.rs"]
mod run;
#[path = "leasehold/status.rs"]
mod status;
#[path = "leasehold/target.rs"]
mod target;
#[path = "leasehold/tidy.rs"]
mod tidy;
#[path = "leasehold/want.rs"]
mod want;

use args::{Cli, Command, PAGES, flock_form};
use exit::EXIT_ERROR;
use inspect::{clean, holder, list};
use output::{chain, emit, warn};
#[cfg(unix)]
use process::{WATCHDOG, watchdog};
use run::run;

fn main() -> ExitCode {
    // Internal to `run`, so not a subcommand: the man page and the
    // completions would show it. Windows needs none: its watchdog is the
    // kernel's, through CMD's Job object.
    #[cfg(unix)]
    let mut argv = std::env::args_os().skip(1);
    #[cfg(unix)]
    if let (Some(first), None) = (argv.next(), argv.next())
        && first == WATCHDOG
    {
        return watchdog();
    }
    let cli = Cli::parse_from(flock_form(std::env::args_os().collect(), &subcommands()));
    match cli.command {
        Command::Man { subcommand } => return man(subcommand.as_deref()),
        Command::Completions { shell } => return completions(shell),
        // In every thread, so before the runtime starts any: handing the
        // terminal back from the background needs it, and the tool must
        // not be stopped, for stopped it renews no lease (and its watchdog
        // kills CMD's group before the lease the tool last vouched for
        // ends): not by writing a warning while CMD's group has the
        // terminal (`stty tostop`, SIGTTOU), not by another process of its
        // own group reading the terminal (a pager after it in a pipeline:
        // the kernel stops the reader's whole group, SIGTTIN), not by
        // Ctrl-Z while it has the terminal (SIGTSTP). The tool never reads
        // the terminal itself. A child inherits the mask: CMD's spawn hook
        // empties it (`process::guard_command`); the watchdog blocks these
        // and more itself.
        #[cfg(unix)]
        Command::Run(_) => {
            let mut blocked = nix::sys::signal::SigSet::empty();
            for sig in [Signal::SIGTTOU, Signal::SIGTTIN, Signal::SIGTSTP] {
                blocked.add(sig);
            }
            let _ = blocked.thread_block();
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
            Command::Holder { name, opts } => holder(&name, &opts).await.map(u32::from),
            Command::List(opts) => list(&opts).await.map(u32::from),
            Command::Clean { opts, dry_run } => clean(&opts, dry_run).await.map(u32::from),
            Command::Man { .. } | Command::Completions { .. } => Ok(EXIT_ERROR.into()),
        }
    });
    // Nothing of ours should linger, but never hang on exit if it does.
    runtime.shutdown_timeout(Duration::from_secs(1));
    exit(result.unwrap_or_else(|e| {
        warn(&chain(&*e));
        EXIT_ERROR.into()
    }))
}

/// Exits with `status`, a byte on Unix, where a status has no more.
#[cfg(unix)]
fn exit(status: u32) -> ExitCode {
    ExitCode::from(u8::try_from(status).unwrap_or(EXIT_ERROR))
}

/// Windows: exits with `status`, all 32 bits of it, which `ExitCode` cannot
/// yet say in stable Rust (CMD's own exit code, passed on whole).
#[cfg(windows)]
fn exit(status: u32) -> ExitCode {
    match u8::try_from(status) {
        Ok(status) => ExitCode::from(status),
        // After the runtime's shutdown: `exit` flushes stdout, as a return
        // from main does.
        Err(_) => std::process::exit(i32::from_ne_bytes(status.to_ne_bytes())),
    }
}

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

/// The names of the subcommands, from the parser's own definitions.
fn subcommands() -> Vec<&'static str> {
    PAGES.iter().map(|(sub, _)| *sub).collect()
}

/// `leasehold completions SHELL`.
fn completions(shell: clap_complete::Shell) -> ExitCode {
    use clap::CommandFactory;
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "leasehold", &mut script);
    emit(&String::from_utf8_lossy(&script));
    ExitCode::SUCCESS
}
