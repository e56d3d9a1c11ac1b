//! What the tool prints that more than one command says: the words of a
//! conflict and of its holders, the JSON documents of `--json` (every key
//! always present), and warnings and errors on standard error.

use std::error::Error as StdError;
use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use leasehold::{LockInfo, LockKind, Owner};
use serde::Serialize;
use serde_json::{Map, Value};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::want::Want;

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
    pub(super) stale_reason: Option<String>,
    pub(super) state: &'static str,
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
