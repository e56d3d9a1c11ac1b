//! The inspecting commands, `holder`, `list` and `clean`: they read the
//! lock directory (`clean` also removes what is stale) and never create
//! it. Their text is here; their JSON documents are in `output.rs`.

use leasehold::{LockInfo, LockKind, Owner};
use serde_json::Value;

use super::args::{Inspect, StrategyArg};
use super::exit::{EXIT_ERROR, Failure};
use super::locker::inspecting;
use super::output::{LockEntry, count, emit, free_entry, info_entry, kind_text, rfc3339, to_json, warn};
use super::target::{self, Target};
use super::tidy;

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
    // The fencing counters of locks that are gone, which `run` would have
    // removed had it not been killed (tidy.rs); the library keeps them.
    let paths: Vec<&std::path::Path> = removed.iter().map(LockInfo::path).collect();
    let counters = tidy::orphans(locker.directory(), &paths);
    let counters = if dry_run {
        counters
    } else {
        tidy::remove_orphans(counters)
    };
    let verb = if dry_run { "would remove" } else { "removed" };
    if opts.json {
        let mut entries: Vec<_> = removed.iter().map(info_entry).collect();
        entries.extend(counters.iter().map(|counter| counter_entry(counter)));
        emit(&to_json(&entries));
    } else if removed.is_empty() && counters.is_empty() {
        emit("nothing to clean\n");
    } else {
        let mut text = table(&removed, |_| verb);
        for counter in &counters {
            let file = counter.file_name().unwrap_or_default().to_string_lossy();
            text.push_str(&format!(
                "{verb:<12} {}  ({COUNTER_REASON})\n",
                file.escape_debug()
            ));
        }
        emit(&text);
    }
    Ok(0)
}

/// Why `clean` removes a fencing counter.
const COUNTER_REASON: &str = "fencing counter of a lock that is gone";

/// A fencing counter `clean` removes, in its JSON array: named by its file,
/// stale, of no kind and with no holder.
fn counter_entry(counter: &std::path::Path) -> LockEntry {
    let file = counter.file_name().unwrap_or_default().to_string_lossy();
    let mut entry = free_entry(&file, counter);
    entry.state = "stale";
    entry.stale_reason = Some(COUNTER_REASON.to_owned());
    entry
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
