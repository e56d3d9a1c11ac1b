//! What `run` says while it waits for the lock. Nothing by default (cron
//! mails whatever a job prints); with `--verbose`, who holds the lock, a
//! line every few seconds, and how long the wait took; on a terminal, once
//! the wait exceeds a few seconds, one live line, erased when the wait
//! ends.

use std::convert::Infallible;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use leasehold::{LockInfo, Locker};
use serde_json::{Value, json};

use super::duration::short;
use super::output::{conflict, holder_entry, warn};
use super::want::Want;

/// How long a wait goes on before a terminal shows the live line.
const LIVE_AFTER: Duration = Duration::from_secs(2);

/// How often `--verbose` says that it is still waiting (off a terminal).
const VERBOSE_EVERY: Duration = Duration::from_secs(5);

/// How often the live line is redrawn.
const TICK: Duration = Duration::from_secs(1);

/// A live line longer than a terminal row would wrap, and erasing only the
/// last row would leave the rest; 79 columns fit any terminal.
const LIVE_WIDTH: usize = 79;

/// The reporter of one wait; erases its live line when dropped.
pub(crate) struct Waiting {
    /// The lock as the user gave it, quoted.
    shown: String,
    /// The lock as the user gave it, unquoted, for `--json`.
    lock: String,
    verbose: bool,
    json: bool,
    live: bool,
    started: Instant,
    line_shown: AtomicBool,
}

impl Waiting {
    pub(crate) fn new(shown: &str, verbose: bool, json: bool, started: Instant) -> Self {
        Self {
            shown: format!("{shown:?}"),
            lock: shown.to_owned(),
            verbose,
            json,
            // Not between JSON lines, which a program reads.
            live: std::io::stderr().is_terminal() && !json,
            started,
            line_shown: AtomicBool::new(false),
        }
    }

    /// Reports while the lock is awaited: run it beside the wait, and drop
    /// it when the wait ends. It never ends by itself.
    pub(crate) async fn report(
        &self,
        locker: &Locker,
        name: &str,
        want: &Want,
        wait: Option<Duration>,
    ) -> Infallible {
        if self.json {
            let info = locker.inspect(name).await.ok().flatten();
            let limit = wait.map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX));
            event(
                "waiting",
                &self.lock,
                json!({ "holders": holders(info.as_ref()), "waitLimitMs": limit }),
            );
        }
        if self.verbose {
            let info = locker.inspect(name).await.ok().flatten();
            let limit = wait.map(|w| format!(" (at most {w:?})")).unwrap_or_default();
            warn(&format!(
                "lock {} is {}; waiting{limit}",
                self.shown,
                conflict(info.as_ref(), want)
            ));
        }
        let mut last_line = Instant::now();
        loop {
            tokio::time::sleep(TICK).await;
            let waited = self.started.elapsed();
            if self.live && waited >= LIVE_AFTER {
                let info = locker.inspect(name).await.ok().flatten();
                let holder = info.as_ref().and_then(|i| Holder::of(i, SystemTime::now()));
                let line = live_line(&self.shown, waited, holder.as_ref());
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[K{line}").and_then(|()| err.flush());
                self.line_shown.store(true, Ordering::Relaxed);
            } else if self.verbose && !self.live && last_line.elapsed() >= VERBOSE_EVERY {
                let info = locker.inspect(name).await.ok().flatten();
                warn(&format!(
                    "still waiting for lock {} after {}; it is {}",
                    self.shown,
                    short(waited),
                    conflict(info.as_ref(), want)
                ));
                last_line = Instant::now();
            }
        }
    }

    /// The lock was taken: with `--verbose`, says after how long.
    pub(crate) fn took(&self, fencing_token: Option<u64>) {
        self.erase();
        if self.json {
            event(
                "acquired",
                &self.lock,
                json!({ "waitedMs": self.waited_ms(), "fencingToken": fencing_token }),
            );
        }
        if self.verbose {
            warn(&format!(
                "took lock {} after {:.3}s",
                self.shown,
                self.started.elapsed().as_secs_f64()
            ));
        }
    }

    /// The lock could not be taken: `-n` found it held (`busy`), or `-w`
    /// ran out (`timeout`).
    pub(crate) fn gave_up(&self, kind: &str, info: Option<&LockInfo>, exit_code: u8) {
        self.erase();
        if self.json {
            event(
                kind,
                &self.lock,
                json!({ "waitedMs": self.waited_ms(), "holders": holders(info), "exitCode": exit_code }),
            );
        }
    }

    fn waited_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn erase(&self) {
        if self.line_shown.swap(false, Ordering::Relaxed) {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K").and_then(|()| err.flush());
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.erase();
    }
}

/// One `--json` line on stderr: `{"event": kind, "lock": lock, ...fields}`,
/// written whole.
pub(crate) fn event(kind: &str, lock: &str, fields: Value) {
    let mut line = json!({ "event": kind, "lock": lock });
    if let (Value::Object(line), Value::Object(fields)) = (&mut line, fields) {
        line.extend(fields);
    }
    let mut text = line.to_string();
    text.push('\n');
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// The live holders, as `holder --json` lists them; none for a stale lock.
fn holders(info: Option<&LockInfo>) -> Value {
    let holders: Vec<_> = info
        .filter(|i| !i.is_stale())
        .map(|i| i.holders().iter().map(holder_entry).collect())
        .unwrap_or_default();
    serde_json::to_value(holders).unwrap_or(Value::Null)
}

/// Who holds the lock, as the live line shows it.
#[derive(Debug, Default)]
pub(crate) struct Holder {
    pid: Option<u32>,
    host: Option<String>,
    /// How long it has held the lock, if its record says since when.
    held_for: Option<Duration>,
    /// How many more hold it (shared, or a semaphore).
    others: usize,
}

impl Holder {
    fn of(info: &LockInfo, now: SystemTime) -> Option<Self> {
        if info.is_stale() {
            return None;
        }
        let holders = info.holders();
        let first = holders.first().unwrap_or(info.owner());
        Some(Self {
            pid: first.pid(),
            host: first.hostname().map(str::to_owned),
            held_for: first.acquired_at().and_then(|t| now.duration_since(t).ok()),
            others: holders.len().saturating_sub(1),
        })
    }
}

/// `leasehold: waiting 12s for lock "x", held by pid 5 on h for 1m3s`, cut
/// to [`LIVE_WIDTH`] characters.
pub(crate) fn live_line(shown: &str, waited: Duration, holder: Option<&Holder>) -> String {
    let mut line = format!("leasehold: waiting {} for lock {shown}", short(waited));
    if let Some(holder) = holder {
        match holder.pid {
            Some(pid) => line.push_str(&format!(", held by pid {pid}")),
            None => line.push_str(", held by another process"),
        }
        if let Some(host) = &holder.host {
            line.push_str(&format!(" on {}", host.escape_debug()));
        }
        if let Some(held_for) = holder.held_for {
            line.push_str(&format!(" for {}", short(held_for)));
        }
        if holder.others > 0 {
            line.push_str(&format!(" and {} more", holder.others));
        }
    }
    if line.chars().count() > LIVE_WIDTH {
        line = line.chars().take(LIVE_WIDTH - 3).collect::<String>() + "...";
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_live_line_names_the_lock_the_holder_and_both_durations() {
        let holder = Holder {
            pid: Some(4242),
            host: Some("db1".to_owned()),
            held_for: Some(Duration::from_secs(63)),
            others: 0,
        };
        assert_eq!(
            live_line("\"backup\"", Duration::from_secs(12), Some(&holder)),
            "leasehold: waiting 12s for lock \"backup\", held by pid 4242 on db1 for 1m3s"
        );
        assert_eq!(
            live_line("\"backup\"", Duration::from_secs(3), None),
            "leasehold: waiting 3s for lock \"backup\""
        );
        let shared = Holder {
            pid: Some(1),
            others: 2,
            ..Holder::default()
        };
        assert_eq!(
            live_line("\"c\"", Duration::from_secs(5), Some(&shared)),
            "leasehold: waiting 5s for lock \"c\", held by pid 1 and 2 more"
        );
    }

    #[test]
    fn the_live_line_fits_a_terminal_row_and_escapes_the_host() {
        let holder = Holder {
            pid: Some(1),
            host: Some("evil\u{1b}[2J\nhost".repeat(10)),
            held_for: None,
            others: 0,
        };
        let line = live_line(
            &format!("{:?}", "n".repeat(200)),
            Duration::from_secs(1),
            Some(&holder),
        );
        assert!(line.chars().count() <= LIVE_WIDTH, "{line}");
        assert!(line.ends_with("..."));
        assert!(!line.chars().any(char::is_control), "{line:?}");
        let line = live_line("\"x\"", Duration::ZERO, Some(&holder));
        assert!(!line.chars().any(char::is_control), "{line:?}");
    }
}
