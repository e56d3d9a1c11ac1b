//! The inspecting commands (`holder`, `list`, `clean`) and what the tool
//! prints: the words of a conflict and of a holder, the tables of `list`,
//! the JSON documents of `--json` (every key always present), and warnings
//! and errors on standard error.

use std::error::Error as StdError;
use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use leasehold::{LockInfo, LockKind, Owner};
use serde::Serialize;
use serde_json::{Map, Value};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::acquire::Want;
use super::args::{Inspect, StrategyArg};
use super::locker::inspecting;
use super::target::{self, Target};
use super::{EXIT_ERROR, Failure};

/// Who a conflict was with, in words: the point of the message is to tell
/// the user which processes to look at.
pub(super) fn conflict(found: Option<&LockInfo>, want: &Want) -> String {
    let Some(info) = found.filter(|l| !l.is_stale()) else {
        return "held by another process".to_owned();
    };
    let how = match info.kind() {
        LockKind::Exclusive => String::new(),
        LockKind::Shared => " shared".to_owned(),
        LockKind::Semaphore { .. } => format!(" as a {}", kind_text(info.kind())),
        _ => " as an unknown kind of lock".to_owned(),
    };
    let mut text = format!("held{how} by {}", holders_of(info));
    // Held the way we asked and still refused: a waiting exclusive run
    // holds new shared runs and permits back, or every permit is taken.
    let waiting_writer =
        "; an exclusive run is waiting for it, and new shared runs and permits queue behind it";
    match (want, info.kind()) {
        (Want::Shared, LockKind::Shared) => text.push_str(waiting_writer),
        (Want::Permit(semaphore), LockKind::Semaphore { permits }) if permits == semaphore.permits() => {
            let taken = info.holders().len();
            if taken < usize::try_from(permits).unwrap_or(usize::MAX) {
                text.push_str(waiting_writer);
            } else {
                text.push_str(&if permits == 1 {
                    "; its only permit is taken".to_owned()
                } else {
                    format!("; all {permits} permits are taken")
                });
            }
        }
        _ => {}
    }
    text
}

/// Who holds a lock: `pid 1 on host h since 2025-01-02T03:04:05Z`, or for
/// a shared lock or a semaphore one such entry per holder.
pub(super) fn holders_of(info: &LockInfo) -> String {
    /// Enough to find the processes; the rest is in `leasehold holder`.
    const SHOWN: usize = 8;
    let holders = info.holders();
    let mut who: Vec<String> = holders
        .iter()
        .take(SHOWN)
        .map(|owner| {
            let mut who = match (owner.pid(), owner.hostname()) {
                (Some(pid), Some(host)) => format!("pid {pid} on host {}", host.escape_debug()),
                (Some(pid), None) => format!("pid {pid}"),
                _ => "another process".to_owned(),
            };
            if let Some(since) = owner.acquired_at().and_then(|t| rfc3339(t, false)) {
                who.push_str(&format!(" since {since}"));
            }
            who
        })
        .collect();
    if holders.len() > SHOWN {
        who.push(format!("and {} more", holders.len() - SHOWN));
    }
    if who.is_empty() {
        who.push("another process".to_owned());
    }
    who.join(", ")
}

pub(super) async fn holder(lock: &str, opts: &Inspect) -> Result<u8, Failure> {
    let target = match Target::parse(lock, false) {
        Ok(Target::Path { .. }) if opts.common.dir.is_some() => {
            warn(&format!(
                "--dir cannot be used with a lock given by its path ({lock:?}): the path says where the lock is"
            ));
            return Ok(EXIT_ERROR);
        }
        Ok(target) => target,
        Err(e) => {
            warn(&e);
            return Ok(EXIT_ERROR);
        }
    };
    let locker = match inspecting(&opts.common, Some(&target), true)? {
        Ok(locker) => locker,
        Err(code) => return Ok(code),
    };
    if let Target::Path { dir, file, .. } = &target {
        // As `run` refuses it: not a stale lock that `clean` would remove.
        let directories = matches!(opts.common.strategy, StrategyArg::Dir);
        if let Err(refused) = target::check_lock_path(dir, file, directories) {
            warn(&refused);
            return Ok(EXIT_ERROR);
        }
    }
    let (name, shown) = (target.name(), target.shown());
    let path = locker.lock_path(name)?;
    let found = locker.inspect(name).await?;
    let live = found.as_ref().filter(|l| !l.is_stale());
    let stale = found.as_ref().filter(|l| l.is_stale());
    let (doc, code) = match (live, stale) {
        (Some(info), _) => {
            let mut doc = info_entry(info);
            // As asked, as when this showed the owner alone.
            doc.name = shown.to_owned();
            doc.path = path.to_string_lossy().into_owned();
            (doc, 0)
        }
        (None, Some(info)) => (info_entry(info), 1),
        (None, None) => (free_entry(shown, &path), 1),
    };
    if opts.json {
        emit(&to_json(&doc));
        return Ok(code);
    }
    let mut text = headline(&target, live, stale);
    details(&mut text, found.as_ref(), live, &doc);
    emit(&text);
    Ok(code)
}

/// The first line of `holder`: how the lock is held, or that it is free
/// (and what a stale lock left).
fn headline(target: &Target, live: Option<&LockInfo>, stale: Option<&LockInfo>) -> String {
    let shown = target.shown();
    match (live, stale) {
        (Some(info), _) => match info.kind() {
            LockKind::Exclusive => format!("lock {shown:?} is held (holder alive)\n"),
            LockKind::Shared => format!(
                "lock {shown:?} is held shared ({} alive)\n",
                count(info.holders().len(), "holder")
            ),
            LockKind::Semaphore { .. } => format!(
                "lock {shown:?} is held as a {} ({} taken)\n",
                kind_text(info.kind()),
                info.holders().len()
            ),
            _ => format!("lock {shown:?} is held (holders alive)\n"),
        },
        (None, Some(info)) => format!(
            "lock {shown:?} is free; a stale lock remains ({}), which {}\n",
            info.stale_reason()
                .map_or_else(|| "stale".to_owned(), |r| r.to_string()),
            match target {
                Target::Name(_) => "`leasehold clean` removes",
                Target::Path { .. } => "the next `leasehold run` of it takes over",
            }
        ),
        (None, None) => format!("lock {shown:?} is free\n"),
    }
}

/// The lines under the headline of `holder`: the kind, and the keys of
/// the JSON document, one block per holder of a shared lock or a
/// semaphore.
fn details(text: &mut String, found: Option<&LockInfo>, live: Option<&LockInfo>, doc: &LockEntry) {
    let line = |text: &mut String, label: &str, value: &Value| match value {
        Value::Null => {}
        Value::String(s) => text.push_str(&format!("  {label:<15}{}\n", s.escape_debug())),
        other => text.push_str(&format!("  {label:<15}{other}\n")),
    };
    let nested = |text: &mut String, label: &str, value: &Value| match value {
        Value::Null => {}
        Value::String(s) => text.push_str(&format!("    {label:<15}{}\n", s.escape_debug())),
        other => text.push_str(&format!("    {label:<15}{other}\n")),
    };
    if let Some(kind) = found.map(|l| kind_text(l.kind())) {
        line(text, "kind:", &Value::String(kind));
    }
    // The same fields as the JSON, read from it, so the two outputs
    // cannot disagree.
    let doc = serde_json::to_value(doc).unwrap_or(Value::Null);
    let fields = [
        ("pid", "pid:"),
        ("hostname", "host:"),
        ("holderId", "holder id:"),
        ("acquiredAt", "since:"),
        ("leaseExpiresAt", "lease expires:"),
        ("fencingToken", "fencing token:"),
    ];
    if live.is_some_and(|l| l.kind() != LockKind::Exclusive) {
        // Every holder of a shared lock or a semaphore, one block each.
        line(text, "path:", &doc["path"]);
        for (n, holder) in doc["holders"].as_array().into_iter().flatten().enumerate() {
            text.push_str(&format!("  holder {}:\n", n + 1));
            for (key, label) in fields {
                nested(text, label, &holder[key]);
            }
            for (key, value) in holder["fields"].as_object().into_iter().flatten() {
                nested(text, &format!("{}:", key.escape_debug()), value);
            }
        }
    } else {
        for (key, label) in fields.into_iter().chain([("path", "path:")]) {
            line(text, label, &doc[key]);
        }
        // Owner fields: `port: 3006`, `host: 127.0.0.1`.
        for (key, value) in doc["fields"].as_object().into_iter().flatten() {
            line(text, &format!("{}:", key.escape_debug()), value);
        }
    }
}

/// `1 holder`, `2 holders`.
pub(super) fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// `exclusive`, `shared` or `semaphore of N permits`.
pub(super) fn kind_text(kind: LockKind) -> String {
    match kind {
        LockKind::Exclusive => "exclusive".to_owned(),
        LockKind::Shared => "shared".to_owned(),
        LockKind::Semaphore { permits } => format!(
            "semaphore of {}",
            count(usize::try_from(permits).unwrap_or(usize::MAX), "permit")
        ),
        _ => "unknown".to_owned(),
    }
}

pub(super) async fn list(opts: &Inspect) -> Result<u8, Failure> {
    let locker = match inspecting(&opts.common, None, true)? {
        Ok(locker) => locker,
        Err(code) => return Ok(code),
    };
    let locks = locker.list().await?;
    if opts.json {
        emit(&to_json(&locks.iter().map(info_entry).collect::<Vec<_>>()));
    } else if locks.is_empty() {
        emit(&format!("no locks in {}\n", locker.directory().display()));
    } else {
        emit(&table(&locks, |l| if l.is_stale() { "stale" } else { "held" }));
    }
    Ok(0)
}

pub(super) async fn clean(opts: &Inspect, dry_run: bool) -> Result<u8, Failure> {
    let locker = match inspecting(&opts.common, None, dry_run)? {
        Ok(locker) => locker,
        Err(code) => return Ok(code),
    };
    let removed = locker.clean(dry_run).await?;
    if opts.json {
        emit(&to_json(&removed.iter().map(info_entry).collect::<Vec<_>>()));
    } else if removed.is_empty() {
        emit("nothing to clean\n");
    } else {
        let verb = if dry_run { "would remove" } else { "removed" };
        emit(&table(&removed, |_| verb));
    }
    Ok(0)
}

/// One line per lock, with its kind (`exclusive`, `shared`, `semaphore N`)
/// and holder; a shared lock or a semaphore has one more line per holder.
/// Names and hosts come from files anyone sharing the directory may
/// write, so they are escaped before reaching a terminal.
pub(super) fn table(locks: &[LockInfo], label: impl Fn(&LockInfo) -> &'static str) -> String {
    let names: Vec<String> = locks
        .iter()
        .map(|l| l.name().escape_debug().to_string())
        .collect();
    let kinds: Vec<String> = locks
        .iter()
        .map(|l| match l.kind() {
            LockKind::Semaphore { permits } => format!("semaphore {permits}"),
            other => kind_text(other),
        })
        .collect();
    let width = names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
    let kind_width = kinds.iter().map(String::len).max().unwrap_or(0);
    let mut text = String::new();
    for ((lock, name), kind) in locks.iter().zip(&names).zip(&kinds) {
        let mut line = format!("{:<12} {name:<width$}  {kind:<kind_width$}", label(lock));
        let several = lock.kind() != LockKind::Exclusive && !lock.holders().is_empty();
        if several {
            line.push_str(&format!("  {}", count(lock.holders().len(), "holder")));
        } else {
            line.push_str(&holder_text(lock.owner()));
        }
        if let Some(reason) = lock.stale_reason() {
            line.push_str(&format!("  ({reason})"));
        }
        text.push_str(line.trim_end());
        text.push('\n');
        if several {
            for holder in lock.holders() {
                text.push_str(&format!("{:12}{}\n", "", holder_text(holder).trim_end()));
            }
        }
    }
    text
}

/// `  pid 1 on host since 2025-01-02T03:04:05Z`, as much of it as the
/// record says.
pub(super) fn holder_text(owner: &Owner) -> String {
    let mut text = String::new();
    match owner.pid() {
        Some(pid) => text.push_str(&format!("  pid {pid}")),
        None if !owner.is_readable() => text.push_str("  (record unreadable)"),
        None => {}
    }
    if let Some(host) = owner.hostname() {
        text.push_str(&format!(" on {}", host.escape_debug()));
    }
    if let Some(since) = owner.acquired_at().and_then(|t| rfc3339(t, false)) {
        text.push_str(&format!(" since {since}"));
    }
    for (key, value) in owner.fields() {
        text.push_str(&format!(" {}={value}", key.escape_debug()));
    }
    text
}

/// One lock as `holder --json`, `list --json` and `clean --json` show it
/// (documented in the module docs of the binary). Every key is always
/// present, `null` when it has no value, so consumers need no existence
/// checks: the type says so. Keys are in alphabetical order, as the
/// output has always had them.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct LockEntry {
    acquired_at: Option<String>,
    pub(super) fencing_token: Option<u64>,
    fields: Map<String, Value>,
    holder_id: Option<String>,
    holders: Vec<HolderEntry>,
    hostname: Option<String>,
    kind: Option<&'static str>,
    lease_expires_at: Option<String>,
    pub(super) name: String,
    pub(super) path: String,
    permits: Option<u32>,
    pid: Option<u32>,
    stale_reason: Option<String>,
    state: &'static str,
}

/// One holder, in the `holders` array: the owner keys of [`LockEntry`].
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct HolderEntry {
    acquired_at: Option<String>,
    fencing_token: Option<u64>,
    fields: Map<String, Value>,
    holder_id: Option<String>,
    hostname: Option<String>,
    lease_expires_at: Option<String>,
    pid: Option<u32>,
}

/// The owner keys of an entry, from `owner` (all `null` without one).
fn owner_keys(owner: Option<&Owner>) -> HolderEntry {
    let time = |f: fn(&Owner) -> Option<SystemTime>| owner.and_then(f).and_then(|t| rfc3339(t, true));
    HolderEntry {
        acquired_at: time(Owner::acquired_at),
        fencing_token: owner.and_then(Owner::fencing_token),
        fields: fields_json(owner),
        holder_id: owner.and_then(Owner::holder_id).map(str::to_owned),
        hostname: owner.and_then(Owner::hostname).map(str::to_owned),
        lease_expires_at: time(Owner::lease_expires_at),
        pid: owner.and_then(Owner::pid),
    }
}

/// A lock someone holds (or held: a stale one).
pub(super) fn info_entry(info: &LockInfo) -> LockEntry {
    let (kind, permits) = match info.kind() {
        LockKind::Exclusive => ("exclusive", None),
        LockKind::Shared => ("shared", None),
        LockKind::Semaphore { permits } => ("semaphore", Some(permits)),
        _ => ("unknown", None),
    };
    let owner = owner_keys(Some(info.owner()));
    LockEntry {
        acquired_at: owner.acquired_at,
        fencing_token: owner.fencing_token,
        fields: owner.fields,
        holder_id: owner.holder_id,
        holders: info.holders().iter().map(holder_entry).collect(),
        hostname: owner.hostname,
        kind: Some(kind),
        lease_expires_at: owner.lease_expires_at,
        name: info.name().to_owned(),
        path: info.path().to_string_lossy().into_owned(),
        permits,
        pid: owner.pid,
        stale_reason: info.stale_reason().map(|r| r.to_string()),
        state: if info.is_stale() { "stale" } else { "held" },
    }
}

/// A lock nobody holds: the owner keys are null, and there are no holders.
pub(super) fn free_entry(name: &str, path: &Path) -> LockEntry {
    let owner = owner_keys(None);
    LockEntry {
        acquired_at: owner.acquired_at,
        fencing_token: owner.fencing_token,
        fields: owner.fields,
        holder_id: owner.holder_id,
        holders: Vec::new(),
        hostname: owner.hostname,
        kind: None,
        lease_expires_at: owner.lease_expires_at,
        name: name.to_owned(),
        path: path.to_string_lossy().into_owned(),
        permits: None,
        pid: owner.pid,
        stale_reason: None,
        state: "free",
    }
}

/// One holder, in the `holders` array.
pub(super) fn holder_entry(owner: &Owner) -> HolderEntry {
    owner_keys(Some(owner))
}

/// The owner fields as a JSON object (empty without any).
pub(super) fn fields_json(owner: Option<&Owner>) -> Map<String, Value> {
    let fields = owner.into_iter().flat_map(Owner::fields);
    fields
        .map(|(key, value)| {
            let value = serde_json::from_str(&value.to_string()).unwrap_or(Value::Null);
            (key.to_owned(), value)
        })
        .collect()
}

/// RFC 3339 in UTC (to the second unless `fraction`), or `None` for a
/// time `time` cannot represent: records written by other programs may
/// hold any value, and this must not panic.
pub(super) fn rfc3339(t: SystemTime, fraction: bool) -> Option<String> {
    let nanos = match t.duration_since(UNIX_EPOCH) {
        Ok(after) => i128::try_from(after.as_nanos()).ok()?,
        Err(before) => -i128::try_from(before.duration().as_nanos()).ok()?,
    };
    let t = OffsetDateTime::from_unix_timestamp_nanos(nanos).ok()?;
    let t = if fraction {
        t
    } else {
        t.replace_nanosecond(0).ok()?
    };
    t.format(&Rfc3339).ok()
}

/// Pretty-printed, one document, ending in a newline.
pub(super) fn to_json(doc: &impl Serialize) -> String {
    serde_json::to_string_pretty(doc).unwrap_or_else(|_| "null".to_owned()) + "\n"
}

/// Writes to stdout ignoring errors: `println!` panics on a closed pipe
/// (`leasehold list | head -1`).
pub(super) fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// One `leasehold: ...` line on stderr, never panicking as `eprintln!` can.
pub(super) fn warn(message: &str) {
    let _ = writeln!(std::io::stderr().lock(), "leasehold: {message}");
}

/// The library's `Display` never repeats the source, so the chain is what
/// says *why* (the errno behind "cannot create lock file").
pub(super) fn chain(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}
