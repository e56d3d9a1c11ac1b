//! Named failpoints between the steps of the filesystem protocol, for
//! `tests/crash_points.rs` (feature `failpoints`, test-only).
//!
//! `failpoint!("name")` is an expression of type `io::Result<()>`, chained
//! into the step that follows the point (`failpoint!(..).and_then(|()| next
//! step)`), so an injected error takes the path a real failure of that step
//! takes. Configured (through the `fail` crate) with a callback, the point
//! runs it (the test's is a `SIGKILL`); configured `return` (or
//! `return(errno)`), the step fails with `EIO` (or that errno). Without the
//! feature it is `Ok(())`, which the compiler removes, and the `fail` crate
//! is not a dependency.

/// Every failpoint in the crate, in protocol order. A unit test checks that
/// the sources use exactly these; docs/guarantees.md (*Crash points*) says
/// what the crash test checks at each.
#[cfg_attr(not(any(test, feature = "failpoints")), allow(dead_code))]
pub(crate) const FAILPOINTS: &[&str] = &[
    // Exclusive file (and a shared lock's marker file): made under a
    // private name, flocked, written, synced, renamed (or linked) onto the
    // lock path.
    "file.create.after_open",
    "file.create.after_flock",
    "file.write.before_pwrite",
    "file.write.before_sync",
    "file.create.before_publish",
    "file.create.after_publish",
    // Directory layout: publishing.
    "dir.publish.after_mkdir",
    "dir.publish.after_flock",
    "dir.owner.before_write",
    "dir.owner.before_sync",
    "dir.publish.before_rename",
    // Either layout: the lock is made, its record written.
    "lock.create.after_record",
    // Fencing tokens: the next counter written, installed, recorded, synced.
    "fence.tmp.before_write",
    "fence.reserve.after_tmp",
    "fence.reserve.before_rename",
    "fence.reserve.after_rename",
    "fence.reserve.before_dirsync",
    // Renewal.
    "lock.renew.after_dirlock",
    "dir.rewrite.before_rename",
    // Release (and, from `reclaim.before_remove` on, reclaim).
    "lock.release.after_dirlock",
    "reclaim.after_dirlock",
    "reclaim.before_remove",
    "file.unlink.before_unlink",
    "dir.retire.before_rename",
    "dir.retire.after_rename",
    "dir.remove.after_unlink_owner",
    // Leftover collection.
    "leftover.dir.after_flock",
    "leftover.file.after_flock",
    "leftover.fence.before_unlink",
    // Shared locks and semaphores: joining (the group's members
    // directory, a member record made under a private name and renamed,
    // the marker at the lock path: created, flocked shared, written,
    // synced), renewing, leaving, reclaiming a dead member, an exclusive
    // waiter withdrawing its announcement.
    "group.join.after_dirlock",
    "group.members.after_mkdir",
    "group.record.after_open",
    "group.record.before_rename",
    "group.record.after_rename",
    "group.join.after_share",
    "group.join.before_marker",
    "group.renew.after_dirlock",
    "group.marker.before_rewrite",
    "group.sign.before_tmp",
    "group.sign.before_rename",
    "group.leave.after_dirlock",
    "group.leave.after_unlink",
    "group.reclaim.before_unlink",
    "group.members.before_rmdir",
    "group.withdraw.before_unlink",
    "group.seal.before_create",
    "group.seal.before_remove",
    // Joining and leaving without the name's mutation lock (another
    // process holds it): tests/frozen_member.rs.
    "unlocked.join.before_record",
    "unlocked.join.after_record",
    "unlocked.leave.after_unlink",
    // The directory's mutation lock: its flock.
    "dirlock.before_flock",
    // The waiting line (OFD byte-range locks, dropped by the kernel when
    // their holder dies): taking a ticket, looking ahead, a release
    // looking for waiters.
    "line.wait.before_ticket",
    "line.stand_back.before_look",
    "line.release.before_look",
    // Upgradable shared locks (`fs/upgrade.rs`): an upgrade before and
    // after the marker is rewritten as the exclusive record, a downgrade
    // before the marker is put back (tests/upgradable_processes.rs); each
    // one after its last look at its lease, before the conversion, and
    // with its guard made, before it is returned (tests/upgradable_attack.rs
    // freezes there).
    "upgrade.before_convert",
    "downgrade.before_convert",
    "upgrade.before_rewrite",
    "upgrade.after_rewrite",
    "upgrade.before_return",
    "upgrade.before_tokens",
    "upgrade.before_publish",
    "downgrade.before_marker",
    "downgrade.before_return",
    "downgrade.before_tokens",
    "downgrade.before_publish",
    // A waiter between its look at the lock and the start of its watch
    // (no filesystem step: a test releases the lock there).
    "engine.wait.before_watch",
    // PostgreSQL (no filesystem step): the session thread about to answer
    // an exclusive waiter's announcement, and a caller whose wait for the
    // session's answer just ran out (tests/pg_late_answer.rs sleeps
    // there, so that the answer lands as its caller gives up).
    "postgres.announce.before_reply",
    "postgres.call.gave_up",
];

/// The OS error code of an I/O error, a failpoint's error unless the test
/// names another: `EIO` on Unix; on Windows `ERROR_GEN_FAILURE`, the code
/// the backend's own `EIO` stands for there (5 there is
/// `ERROR_ACCESS_DENIED`, which the backend reads as "not a file here" or
/// a refused lock, not as a failed step: tests/crash_points.rs failed
/// under Wine).
#[cfg(all(feature = "failpoints", unix))]
pub(crate) const EIO: i32 = 5;
/// See the Unix twin.
#[cfg(all(feature = "failpoints", windows))]
pub(crate) const EIO: i32 = 31;

/// The failpoint `name`: `Ok(())` unless the test configured it.
#[cfg(feature = "failpoints")]
macro_rules! failpoint {
    ($name:literal) => {
        $crate::failpoint::eval($name)
    };
}

/// The failpoint `name`: `Ok(())` unless the test configured it.
#[cfg(not(feature = "failpoints"))]
macro_rules! failpoint {
    ($name:literal) => {
        ::std::io::Result::<()>::Ok(())
    };
}

/// Runs the point `name`: its callback if it has one; an error if it is
/// configured `return`, with the OS error code given (`return(28)`), else
/// [`EIO`].
#[cfg(feature = "failpoints")]
pub(crate) fn eval(name: &str) -> std::io::Result<()> {
    debug_assert!(FAILPOINTS.contains(&name), "failpoint {name} is not listed");
    match fail::eval(name, |errno| errno.and_then(|e| e.parse().ok()).unwrap_or(EIO)) {
        Some(errno) => Err(std::io::Error::from_raw_os_error(errno)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::FAILPOINTS;

    /// The list is the sources' points exactly, each used once: the crash
    /// test enumerates the list, so a point missing from it goes untested.
    #[test]
    fn the_list_names_every_failpoint_in_the_sources_once() {
        fn walk(dir: &std::path::Path, found: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, found);
                } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("failpoint.rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for (_, rest) in text
                        .match_indices("failpoint!(\"")
                        .map(|(i, _)| text.split_at(i + 12))
                    {
                        found.push(rest.split('"').next().unwrap().to_owned());
                    }
                }
            }
        }
        let mut found = Vec::new();
        walk(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut found,
        );
        found.sort();
        let mut listed: Vec<String> = FAILPOINTS.iter().map(|s| (*s).to_owned()).collect();
        listed.sort();
        assert_eq!(found, listed);
    }
}
