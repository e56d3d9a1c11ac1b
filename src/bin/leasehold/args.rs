//! The command line as clap parses it: the subcommands, their options and
//! their help. `man` and `completions` render these same definitions.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use super::duration::parse_duration;
use super::target::Target;

/// The end of `leasehold --help`: flock(1)'s own form, and its rule.
const FLOCK_FORM: &str = "\
As flock(1): leasehold [-n | -w DURATION] [RUN OPTIONS] PATH CMD [ARGS]... is
leasehold run with the same arguments, so a crontab line changes by one word
(flock -n /var/lock/x cmd becomes leasehold -n /var/lock/x cmd). Taken when the first
argument is not a subcommand and is an option (but -h, -V), or has a `/`; a bare
word first is always a subcommand. flock(1)'s descriptor form (flock -n 9) is not
supported: put the command under the lock (leasehold run -n /var/lock/x -- cmd).";

/// The end of `leasehold run -h`.
pub(super) const RUN_SHORT_HELP: &str = "\
Like flock(1): leasehold run [-n | -w DURATION] [-E N] [-s | -x] NAME|PATH (CMD ARGS... | -c STRING)
See --help for the exit statuses, the kinds of lock, signals and the differences from flock(1).";

/// The end of `leasehold run --help`: what differs between Unix and
/// Windows (the exit statuses; the process group or the Job object) around
/// what does not.
macro_rules! run_help {
    ($status:expr, $process:expr) => {
        concat!(
            $status,
            "\
Output: none of leasehold's own on success, nor on -n or -w giving up (as flock(1),
so cron mails nothing). --verbose says who holds the lock (pid, host, since) when
it must wait, again every 5 s, and how long the wait took. On a terminal, a wait
longer than 2 s shows one live line instead of the repeated ones (waiting Ts for
lock NAME, held by pid P on H for Ts), erased when the wait ends.

The lock: NAME is a lock in the lock directory (--dir, $LEASEHOLD_DIR, or the
per-user default). An argument with a `/`, or --file PATH, is a lock file given by
its path, as flock(1) takes it: exactly that file, in its directory, which must
exist; --dir does not apply. leasehold creates the file when it takes the lock and
removes it when it releases it; while the lock is held, its fencing counter
(PATH.fence) and, held shared or as a semaphore, the directory PATH.members
listing its holders are beside it, removed by the run that lets the lock go free:
after a run, nothing of leasehold's is left beside PATH. A run killed while
holding the lock leaves its lock and counter; the next run of it removes them,
and so does `leasehold clean --dir DIR` for a PATH ending in .lock (and for every
NAME). LEASEHOLD_FENCING_TOKEN is above the token of every earlier run of the lock
as long as the wall clock has not been stepped back between them (tokens count
microseconds; a removed counter resumes past the clock). An empty file that flock(1) left
behind is taken over once it is a second old and nobody holds it; one that
flock(1) holds is waited for. A PATH
that holds anything else (a file of data, held by flock(1) or not; a directory that
is no lock) is refused (status 2) and left as it is. Not taken from flock(1): its descriptor
form (exec 9>/var/lock/x; flock -n 9: an all-digits lock is refused; write
leasehold run -n /var/lock/x -- cmd, and ./9 for a file named 9), -u (unlock a
descriptor) and -F (no fork: leasehold must stay to renew the lease and guard
CMD); they are usage errors. flock(1)'s own order is taken without the word run
(leasehold -n /var/lock/x cmd) when the first argument is an option or a path;
a bare word first is always a subcommand. Do not
take one path with flock(1) and leasehold at once, though: flock(1) never removes
its file, and a waiter of one kind can miss a file the other removed.

Kinds: without --shared or --permits the lock is exclusive (one run at a time).
--shared runs overlap each other but never an exclusive run; a waiting exclusive
run holds back new shared runs. --permits N runs hold one of N permits of the
semaphore NAME (at most N at once); every run of NAME must give the same N.

",
            $process,
            "\
--json: one JSON object per line on stderr for each event: {\"event\": \"waiting\" |
\"acquired\" | \"busy\" | \"timeout\" | \"lost\", \"lock\": ..., ...}, with the holders (as
`leasehold holder --json` shows them), waitedMs, fencingToken, exitCode or
killAfterMs.

Durations: seconds (fractions allowed: 0.5) or units ms, s, m, h, d (90s, 5m,
1h30m, 1.5h)."
        )
    };
}

#[cfg(unix)]
pub(super) const RUN_HELP: &str = run_help!(
    "\
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
                when the loss was found); or before CMD could start (leasehold
                was stopped past the lease): CMD never ran
  78            --shared or --permits N: NAME is held as another kind (a semaphore of
                another count, or shared vs semaphore); CMD never ran
  126, 127      CMD could not be executed, or was not found (flock(1) says 69)

",
    "\
CMD runs in a process group of its own. The lock is held until CMD and every
process left in its group have exited (like flock(1), a background job of CMD
keeps the lock); the status is then CMD's own. -o is accepted for flock(1)'s
sake: CMD never holds a descriptor of the lock, leasehold does, so there is
nothing to close. SIGINT, SIGTERM and SIGHUP are forwarded to the group; a lost
lock stops the whole group. If leasehold dies without releasing the lock
(SIGKILL, the OOM killer), or is stopped (SIGSTOP, a debugger) until its lease
nearly ends, for stopped it renews nothing, a watchdog process SIGKILLs CMD's group, so
nothing of CMD runs on without the lock (flock(1)'s lock dies with the last
process that holds its descriptor); if the watchdog cannot be started, or is
gone before CMD starts, CMD is not run (exit 2). leasehold blocks SIGTTIN,
SIGTTOU and SIGTSTP: a pager after it in a pipeline that reads the terminal
is stopped alone (fg resumes it), never leasehold. A
process that leaves the group (setsid, a daemon) is not covered, nor a
set-user-ID or file-capability one (sudo). In a terminal, CMD's group gets the
terminal while it runs (Ctrl-C goes to it); Ctrl-Z (job control) is not
supported.

"
);

#[cfg(windows)]
pub(super) const RUN_HELP: &str = run_help!(
    "\
Exit status:
  CMD's status  CMD ran and exited, and its Job object is empty: its exit code,
                all 32 bits of it (0xC000013A if Ctrl-C ended it)
  130, 149      Ctrl-C or Ctrl-Break arrived while waiting for the lock (CMD never
                ran)
  1             the lock was held (-n) or -w ran out; see -E (--conflict-exit-code)
  2             bad usage (e.g. --permits 0, -w 5x, --shared with --permits), an
                error from the lock library, or the Job object could not be
                created (then CMD never ran)
  66            the lock's directory does not exist, or a PATH's is a file (a PATH's
                directory is never created; as flock(1), which says it cannot
                open the lock file)
  75            the lock was lost while CMD or its job ran: the job was terminated
                at once (its processes exit with 75 too), or had already exited
                when the loss was found
  78            --shared or --permits N: NAME is held as another kind (a semaphore of
                another count, or shared vs semaphore); CMD never ran
  126, 127      CMD could not be executed, or was not found (flock(1) says 69)

",
    "\
On Windows, CMD runs in a Job object that terminates with leasehold: CMD starts
suspended and joins it before it runs, and every process it starts is in it too
(none may break away). The lock is held until every process of the job has exited;
the status is then CMD's own. If leasehold dies without releasing the lock
(taskkill /F, a crash), the kernel terminates the job, so nothing of CMD runs on
without the lock; if the job cannot be created, CMD is not run. -c STRING runs
cmd /S /C \"STRING\" (STRING as it is, quotes included). Ctrl-C and Ctrl-Break reach
CMD from the console, not through leasehold, which waits for the job as usual. A
lost lock terminates the job at once: there is no SIGTERM, and --kill-after has no
effect. -o is accepted for flock(1)'s sake.

"
);

/// Named cross-process locks: run a command under a lock, inspect and clean
/// a lock directory.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, after_help = FLOCK_FORM)]
pub(super) struct Cli {
    #[command(subcommand)]
    pub(super) command: Command,
}

#[derive(Debug, Subcommand)]
pub(super) enum Command {
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
    /// Remove stale locks and crash leftovers (among them the fencing counters, *.lock.fence, of locks that are gone); live locks, and files of data named *.lock (Cargo.lock, a pid file), are never touched. Exit 66 if the directory does not exist.
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
pub(super) struct Inspect {
    #[command(flatten)]
    pub(super) common: Common,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Debug, Args)]
pub(super) struct Common {
    /// Lock directory [default: $LEASEHOLD_DIR, else /run/lock/leasehold-<uid> on Linux (leasehold in the user's local application data on Windows, /tmp/leasehold-<uid> elsewhere), with no fallback; never from TMPDIR or XDG_RUNTIME_DIR]
    #[arg(long, value_name = "DIR")]
    pub(super) dir: Option<PathBuf>,
    /// On-disk layout of the locks.
    #[arg(long, value_enum, default_value_t = StrategyArg::File)]
    pub(super) strategy: StrategyArg,
}

#[derive(Debug, Args)]
// As getopt in flock(1): a repeated option is no error, the last one wins.
#[command(args_override_self = true)]
pub(super) struct RunArgs {
    /// The lock: a NAME in the lock directory, or, as flock(1) takes it, the PATH of a lock file (any argument with a `/`, e.g. /var/lock/backup.lock or ./job.lock).
    #[arg(value_name = "NAME|PATH", required_unless_present = "file")]
    pub(super) lock: Option<String>,
    /// Lock the file PATH (in its directory, which must exist), even without a `/` in it. Put `--` before a CMD with options of its own.
    #[arg(long, value_name = "PATH")]
    pub(super) file: Option<String>,
    /// Hold the lock shared: shared runs overlap, but never an exclusive one (as flock -s).
    #[arg(short = 's', long, overrides_with = "exclusive", conflicts_with = "permits")]
    pub(super) shared: bool,
    /// Hold the lock exclusively: one run at a time (the default; as flock -x).
    #[arg(short = 'x', long, overrides_with = "shared", conflicts_with = "permits")]
    pub(super) exclusive: bool,
    /// Hold one permit of the semaphore NAME of N permits: at most N such runs at once. Every run of NAME must give the same N.
    #[arg(long, value_name = "N", value_parser = parse_permits)]
    pub(super) permits: Option<u32>,
    #[command(flatten)]
    pub(super) common: Common,
    /// Wait at most DURATION for the lock: seconds (fractions allowed) or e.g. 90s, 5m, 1h30m (as flock -w, --timeout) [default: forever]
    #[arg(short = 'w', long, visible_alias = "timeout", value_name = "DURATION", value_parser = parse_duration)]
    pub(super) wait: Option<Duration>,
    /// Give up at once if the lock is held (as flock -n, --nonblock); with -w too, -n wins, as in flock(1).
    #[arg(short = 'n', long, visible_alias = "nonblock")]
    pub(super) no_wait: bool,
    /// Exit status when the lock could not be taken (held with -n, or -w ran out).
    #[arg(short = 'E', long, value_name = "N", default_value_t = 1)]
    pub(super) conflict_exit_code: u8,
    /// The lease: how long the lock outlives a holder that stops renewing it (frozen, or on a host that went away) [default: 30s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(super) lease: Option<Duration>,
    /// If the lock is lost, CMD's process group gets SIGTERM, then SIGKILL this long after [default: 5s, or a sixth of a shorter --lease]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(super) kill_after: Option<Duration>,
    /// Accepted for flock(1) compatibility: CMD never holds a descriptor of the lock (leasehold holds it), so there is none to close. The lock is still held until CMD's process group is empty.
    #[arg(short = 'o', long)]
    pub(super) close: bool,
    /// Say who holds the lock when it must wait, every few seconds while it waits, and how long it waited.
    #[arg(long)]
    pub(super) verbose: bool,
    /// Write one JSON object per line to stderr for what happens to the lock: waiting, acquired, busy, timeout, lost (see --help).
    #[arg(long)]
    pub(super) json: bool,
    #[cfg_attr(unix, doc = "Run STRING through `sh -c` instead of CMD (as flock -c).")]
    #[cfg_attr(
        windows,
        doc = "Run STRING through `cmd /S /C \"STRING\"` instead of CMD (as flock -c runs `sh -c`)."
    )]
    #[arg(
        short = 'c',
        long = "command",
        value_name = "STRING",
        conflicts_with = "command"
    )]
    pub(super) shell_command: Option<OsString>,
    /// The command to run, and its arguments; `--` before it is needed only when CMD starts with `-`.
    // Required, but `resolve` says so, not clap: `leasehold run 9` (flock's
    // descriptor form) must hear that descriptors are not taken, not that
    // CMD is missing. With --file, clap takes CMD's first word for
    // NAME|PATH (`--file x -- true`), and `resolve` moves it back.
    #[arg(trailing_var_arg = true, value_name = "CMD")]
    pub(super) command: Vec<OsString>,
}

impl RunArgs {
    /// The lock, and CMD with its arguments, in the order flock(1) allows.
    pub(super) fn resolve(&mut self) -> Result<(Target, Vec<OsString>), String> {
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
            (None, Some(lock)) if is_descriptor(lock) => return Err(descriptor_refused(lock)),
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
            #[cfg(unix)]
            Some(script) => vec!["sh".into(), "-c".into(), script.clone()],
            // Passed to cmd verbatim, in quotes that /S takes off (process.rs).
            #[cfg(windows)]
            Some(script) => vec!["cmd".into(), "/S".into(), "/C".into(), script.clone()],
            None if self.command.is_empty() => return Err("no command given".to_owned()),
            None => std::mem::take(&mut self.command),
        };
        Ok((target, command))
    }

    /// `--kill-after`, else 5 s, which is inside the 7.5 s safety margin
    /// of the default 30 s lease: when failing renewals report the loss at
    /// that margin (a quarter of the lease), a CMD that ignores SIGTERM is
    /// killed before anyone else may take the lock. A shorter lease gets a
    /// sixth of itself, which keeps that proportion. Unix only: Windows
    /// has no SIGTERM, and a lost lock terminates CMD's job at once.
    #[cfg(unix)]
    pub(super) fn kill_after(&self) -> Duration {
        let default = Duration::from_secs(5);
        self.kill_after
            .unwrap_or_else(|| self.lease.map_or(default, |lease| (lease / 6).min(default)))
    }
}

/// An all-digits lock argument: flock(1)'s descriptor form (`flock -n 9`
/// in a script that ran `exec 9>/var/lock/x`), which leasehold cannot take:
/// it must hold the lock itself to renew its lease and guard CMD.
fn is_descriptor(lock: &str) -> bool {
    !lock.is_empty() && lock.bytes().all(|b| b.is_ascii_digit())
}

/// What to say of flock(1)'s descriptor form, and what to write instead.
fn descriptor_refused(lock: &str) -> String {
    format!(
        "{lock:?} looks like flock(1)'s descriptor form (exec {lock}>/var/lock/x; flock -n {lock}), \
         which leasehold does not support: it holds the lock itself. Put the command under \
         the lock instead, e.g. `leasehold run -n /var/lock/x -- cmd`, or `leasehold run -n \
         /var/lock/x -c 'commands'` for several; a lock file named {lock:?} is ./{lock} (or \
         --file {lock}); a name in the lock directory needs a character other than a digit"
    )
}

/// flock(1)'s own form, `leasehold -n /var/lock/x cmd`: the arguments of
/// `run` without the word `run`. Taken when the first argument is none of
/// the subcommands (nor `help`) and is an option other than leasehold's
/// own `-h`, `--help`, `-V` and `--version`, or has a `/` (a lock file by
/// its path), or is all digits (flock's descriptor form, which `run` then
/// refuses with its reason). A bare NAME is not taken: `leasehold holdr
/// backup`, a mistyped subcommand, must not run `backup` under the lock
/// "holdr". Returns the arguments with `run` put in front, or as they were.
pub(super) fn flock_form(args: Vec<OsString>, subcommands: &[&str]) -> Vec<OsString> {
    let Some(first) = args.get(1).map(|a| a.to_string_lossy().into_owned()) else {
        return args;
    };
    let own = ["-h", "--help", "-V", "--version"];
    let run = if subcommands.contains(&first.as_str()) || first == "help" || own.contains(&first.as_str()) {
        false
    } else {
        first.starts_with('-') || first.contains('/') || is_descriptor(&first)
    };
    if !run {
        return args;
    }
    let mut args = args;
    args.insert(1, "run".into());
    args
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(super) enum StrategyArg {
    /// One lock file per name.
    File,
    /// One lock directory holding owner.json per name.
    Dir,
}

/// The subcommands with a page of their own, `leasehold-run(1)` and so
/// on, as git names its pages.
pub(super) const PAGES: [(&str, &str); 6] = [
    ("run", "leasehold-run"),
    ("holder", "leasehold-holder"),
    ("list", "leasehold-list"),
    ("clean", "leasehold-clean"),
    ("man", "leasehold-man"),
    ("completions", "leasehold-completions"),
];

/// `--permits`: a semaphore needs at least one permit, and no more than
/// the library counts.
pub(super) fn parse_permits(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(0) => Err("a semaphore needs at least one permit".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a number of permits (1 to {})", u32::MAX)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn every_subcommand_has_a_page_and_is_never_taken_for_flocks_form() {
        let names: Vec<&str> = PAGES.iter().map(|(sub, _)| *sub).collect();
        let top = Cli::command();
        let parsed: Vec<&str> = top.get_subcommands().map(clap::Command::get_name).collect();
        assert_eq!(parsed, names);
        for sub in names.iter().chain(&["help"]) {
            let args: Vec<OsString> = ["leasehold", sub, "x"].map(OsString::from).into();
            assert_eq!(flock_form(args.clone(), &names), args, "{sub}");
        }
    }

    #[test]
    fn flocks_form_is_run_without_the_word() {
        let names: Vec<&str> = PAGES.iter().map(|(sub, _)| *sub).collect();
        let form = |args: &[&str]| {
            let args: Vec<OsString> = args.iter().map(OsString::from).collect();
            flock_form(args, &names)
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        };
        for args in [
            &["leasehold", "-n", "/var/lock/x", "cmd"][..],
            &["leasehold", "/var/lock/x", "cmd"],
            &["leasehold", "./x", "cmd"],
            &["leasehold", "-w", "5", "job", "cmd"],
            &["leasehold", "9"],
        ] {
            assert_eq!(form(args)[..2], ["leasehold", "run"], "{args:?}");
            assert_eq!(form(args)[2..], args[1..], "{args:?}");
        }
        for args in [
            &["leasehold"][..],
            &["leasehold", "--help"],
            &["leasehold", "-V"],
            &["leasehold", "holdr", "backup"],
            &["leasehold", "list"],
        ] {
            assert_eq!(form(args), args, "{args:?}");
        }
    }

    #[test]
    fn digits_alone_are_flocks_descriptor_form() {
        for lock in ["9", "0", "123"] {
            assert!(is_descriptor(lock), "{lock}");
        }
        for lock in ["", "./9", "9a", "job9", "-9"] {
            assert!(!is_descriptor(lock), "{lock}");
        }
    }
}
