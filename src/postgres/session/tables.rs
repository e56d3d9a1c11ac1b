//! The owner tables, `leasehold_locks` (exclusive holders and every name's
//! fencing counter) and `leasehold_holders` (shared holders and permit
//! holders): their schema (a holder's owner fields are a JSON object in
//! `fields`), when a row names a live holder, and how a kind
//! of holding is spelled in them.

use crate::backend::Mode;

/// Creates the tables, and adds the columns later versions added to
/// tables an earlier one made. Every session runs it when it connects, so
/// on tables that are complete it must lock nothing: `ALTER TABLE ... ADD
/// COLUMN IF NOT EXISTS` takes an ACCESS EXCLUSIVE lock even when the
/// column is there, which waits behind any open transaction that read the
/// table (and stalls every session's locking behind it), and taken on both
/// tables in turn could deadlock with a statement that reads them in the
/// other order. So each change is made only when the catalog says it is
/// missing.
///
/// `CREATE TABLE IF NOT EXISTS` is not safe against itself: two sessions
/// that both find no table both create it, and one fails on a unique index
/// of the catalog (`pg_type_typname_nsp_index`, or 42P07). So the setup is
/// one transaction that first takes a transaction-level advisory lock, and
/// a session waits there until the one creating the tables has committed
/// them. That lock excludes only other setups: on complete tables the
/// setup takes no table lock, and no session's locking waits for it. Its
/// key is in the two-`integer` form (`objsubid` 2 in `pg_locks`; the first
/// integer is "leas" in ASCII): every key of a lock name is taken in the
/// one-`bigint` form (`objsubid` 1), and keys of the two forms never
/// conflict, so no name can map to it.
pub(super) const SCHEMA: &str = "
    BEGIN;
    SELECT pg_advisory_xact_lock(1818583411, 1);
    CREATE TABLE IF NOT EXISTS leasehold_locks (
        name text PRIMARY KEY,
        key bigint NOT NULL,
        fencing_token bigint NOT NULL DEFAULT 0,
        holder_id text,
        hostname text,
        pid integer,
        acquired_at timestamptz,
        backend_pid integer,
        holder_token bigint,
        fields text,
        lease_ms bigint,
        free_at timestamptz,
        intent_until timestamptz
    );
    CREATE TABLE IF NOT EXISTS leasehold_holders (
        id text PRIMARY KEY,
        name text NOT NULL,
        key bigint NOT NULL,
        mode text NOT NULL,
        permits bigint,
        slot bigint,
        holder_id text,
        hostname text,
        pid integer,
        acquired_at timestamptz,
        backend_pid integer NOT NULL,
        holder_token bigint,
        fields text,
        lease_ms bigint,
        free_at timestamptz
    );
    DO $leasehold$
    DECLARE
        missing record;
    BEGIN
        FOR missing IN
            SELECT t.tab, t.col, t.ty FROM (VALUES
                ('leasehold_locks', 'holder_token', 'bigint'),
                ('leasehold_locks', 'fields', 'text'),
                ('leasehold_locks', 'lease_ms', 'bigint'),
                ('leasehold_locks', 'free_at', 'timestamptz'),
                ('leasehold_locks', 'intent_until', 'timestamptz'),
                ('leasehold_holders', 'fields', 'text'),
                ('leasehold_holders', 'lease_ms', 'bigint'),
                ('leasehold_holders', 'free_at', 'timestamptz')
            ) AS t(tab, col, ty)
            WHERE NOT EXISTS (
                SELECT 1 FROM pg_attribute a
                WHERE a.attrelid = to_regclass(t.tab) AND a.attname = t.col AND NOT a.attisdropped
            )
        LOOP
            EXECUTE format('ALTER TABLE %I ADD COLUMN IF NOT EXISTS %I %s', missing.tab, missing.col, missing.ty);
        END LOOP;
        IF to_regclass('leasehold_holders_name') IS NULL THEN
            CREATE INDEX IF NOT EXISTS leasehold_holders_name ON leasehold_holders (name);
        END IF;
    END
    $leasehold$;
    COMMIT;";

/// The most bytes of a name's text a btree index entry holds (the primary
/// key of `leasehold_locks`, `leasehold_holders_name`): PostgreSQL's limit
/// of 2,704 bytes an entry (with the default 8 kB pages), less its 8-byte
/// header and the text's 4-byte length. The entry is compressed first if
/// that makes it fit, which a name need not allow.
pub(super) const NAME_ROOM: usize = 2704 - 8 - 4;

/// Why a name is refused as too long for the server.
pub(super) const TOO_LONG: &str = "too long for this PostgreSQL server: in the database's encoding it may \
    take more than the 2,692 bytes an index entry holds (every character outside ASCII counted at the \
    encoding's widest; a UTF-8 database takes every name of up to 2,048 bytes)";

/// Why a name is refused when the database cannot store one of its
/// characters.
pub(super) const UNSTORABLE: &str = "has a character the PostgreSQL database's encoding cannot store";

/// Whether `name` surely fits an index entry in a database whose encoding
/// takes up to `widest` bytes a character (`None`: the name is stored as
/// it is, in UTF-8 or `SQL_ASCII`). Every server encoding stores ASCII as
/// it is. A name of up to `MAX_NAME_LEN` (2,048) bytes always fits in
/// UTF-8.
pub(super) fn name_fits(name: &str, widest: Option<usize>) -> bool {
    let size = match widest {
        None => name.len(),
        Some(widest) => name.chars().map(|c| if c.is_ascii() { 1 } else { widest }).sum(),
    };
    size <= NAME_ROOM
}

/// `pg_locks` has a row for a granted advisory lock on `$key` (the
/// one-`bigint` form, `objsubid` 1) in this database.
macro_rules! granted {
    ($key:literal) => {
        concat!(
            "k.locktype = 'advisory' AND k.granted AND k.objsubid = 1
             AND k.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
             AND k.classid::bigint = ((",
            $key,
            " >> 32) & 4294967295) AND k.objid::bigint = (",
            $key,
            " & 4294967295)"
        )
    };
}

pub(super) use granted;

/// An exclusive holder's row (`l`) in `leasehold_locks` names a holder
/// that holds the lock: its session holds the name's key exclusively.
///
/// A row with `free_at` set names nobody: its holder let go, or was found
/// dead (its server process id may since have been reused by a session
/// that holds the key, which would make it look held).
macro_rules! held {
    () => {
        concat!(
            "(l.free_at IS NULL AND EXISTS (SELECT 1 FROM pg_locks k WHERE ",
            granted!("l.key"),
            " AND k.mode = 'ExclusiveLock' AND k.pid = l.backend_pid))"
        )
    };
}

pub(super) use held;

/// A shared holder's or permit holder's row (`h`) in `leasehold_holders`
/// names a holder that holds the lock: its session holds the name's key
/// shared.
///
/// As for [`held!`], a row with `free_at` set names nobody.
macro_rules! live {
    () => {
        concat!(
            "(h.free_at IS NULL AND EXISTS (SELECT 1 FROM pg_locks k WHERE ",
            granted!("h.key"),
            " AND k.mode = 'ShareLock' AND k.pid = h.backend_pid))"
        )
    };
}

pub(super) use live;

/// The rows of `leasehold_holders` whose holder holds nothing any more
/// (it died, or its session ended, without deleting its row), and rows a
/// dead session with our process id left (the pid was reused: they would
/// look live to us). Such a holder may still be running, and count itself
/// a holder, until its lease ends (see [`wait_out!`]): a row that records
/// its lease is kept, with `free_at` set to when no such holder can still
/// count itself one, until then. Rows of earlier versions (no lease) and
/// rows past their `free_at` are deleted.
pub(super) const TIDY: &str = concat!(
    "UPDATE leasehold_holders h SET free_at = clock_timestamp() + h.lease_ms * interval '1 millisecond'
     WHERE h.lease_ms IS NOT NULL AND h.free_at IS NULL AND (h.backend_pid = pg_backend_pid() OR NOT ",
    live!(),
    "); DELETE FROM leasehold_holders h WHERE h.free_at < clock_timestamp()
         OR (h.lease_ms IS NULL AND (h.backend_pid = pg_backend_pid() OR NOT ",
    live!(),
    "))"
);

/// The holders recorded in rows `$r` that may still count themselves
/// holders though their session no longer holds the lock: the row says
/// how long their lease is (`lease_ms`), and was neither let go cleanly
/// (which sets `free_at` to that instant, or deletes a shared holder's
/// row) nor found dead longer ago than that lease. `free_at IS NULL` is a
/// row whose holder was not seen to let go: the taker that finds it sets
/// `free_at` to its own `clock_timestamp()` plus the lease (see
/// [`STAMP`]): the holder heard from its session last before that session
/// ended, which was before this taker got the lock, and it counts itself a
/// holder for less than a lease after it last heard.
///
/// Rows of earlier versions, which record no lease, never hold anyone
/// back.
macro_rules! wait_out {
    ($r:literal) => {
        concat!(
            $r,
            ".lease_ms IS NOT NULL AND (",
            $r,
            ".free_at IS NULL OR ",
            $r,
            ".free_at > clock_timestamp())"
        )
    };
}

pub(super) use wait_out;

/// A holder row `h` of the name that stands in the way of a taker (see
/// [`STAMP`] for the parameters): any, for an exclusive taker; for a
/// shared or permit taker, one of its slot, or a dead one of another kind.
macro_rules! in_the_way {
    () => {
        concat!(
            "$3::bool OR h.slot = $2::bigint
             OR (NOT (h.mode = $4::text AND h.permits IS NOT DISTINCT FROM $5::bigint) AND NOT ",
            live!(),
            ")"
        )
    };
}

/// For a taker that holds the name `$1`'s key but found an earlier holder
/// that may still count itself one ([`wait_out!`]): marks every such row
/// not yet found dead as found now (`free_at` = now + its lease), and
/// answers in how many milliseconds the last of them is over (`NULL` or
/// less than 1: try again now). The rows are the name's exclusive row and,
/// for an exclusive taker (`$3`), every shared and permit holder's row of
/// the name; for a shared or permit taker, those of its slot `$2` and the
/// dead ones of another kind than its own (mode `$4`, permits `$5`). Every
/// row found is the row of a holder whose session holds no lock of the
/// name that conflicts with the taker's, which the taker holds. Rows of
/// the name's holders whose `free_at` has passed are deleted on the way.
pub(super) const STAMP: &str = concat!(
    "WITH
    l AS (UPDATE leasehold_locks l SET free_at = clock_timestamp() + l.lease_ms * interval '1 millisecond'
          WHERE l.name = $1 AND l.lease_ms IS NOT NULL AND l.free_at IS NULL RETURNING l.free_at),
    h AS (UPDATE leasehold_holders h SET free_at = clock_timestamp() + h.lease_ms * interval '1 millisecond'
          WHERE h.name = $1 AND h.lease_ms IS NOT NULL AND h.free_at IS NULL AND (",
    in_the_way!(),
    ") RETURNING h.free_at),
    gone AS (DELETE FROM leasehold_holders h WHERE h.name = $1 AND h.free_at < clock_timestamp()),
    ends AS (
        SELECT free_at FROM l UNION ALL SELECT free_at FROM h
        UNION ALL SELECT l.free_at FROM leasehold_locks l WHERE l.name = $1 AND l.lease_ms IS NOT NULL
        UNION ALL SELECT h.free_at FROM leasehold_holders h
            WHERE h.name = $1 AND h.lease_ms IS NOT NULL AND (",
    in_the_way!(),
    "))
    SELECT ceil(extract(epoch FROM max(free_at) - clock_timestamp()) * 1000)::bigint FROM ends"
);

/// A kind of holding as `leasehold_holders` spells it.
pub(super) fn kind_columns(mode: Mode) -> (&'static str, Option<i64>) {
    match mode {
        Mode::Permit(n) => ("semaphore", Some(i64::from(n))),
        other => (other.as_str(), None),
    }
}

/// The kind of holding a row says.
pub(super) fn kind_of(mode: &str, permits: Option<i64>) -> Mode {
    match (mode, permits) {
        ("exclusive", _) => Mode::Exclusive,
        ("semaphore", Some(n)) => Mode::Permit(u32::try_from(n).unwrap_or(0)),
        _ => Mode::Shared,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_fits_in_utf8_and_wide_encodings_are_counted_at_their_widest() {
        // The longest name, in the characters UTF-8 takes most bytes for.
        let longest = "\u{10FFFF}".repeat(crate::MAX_NAME_LEN / 4);
        assert_eq!(longest.len(), crate::MAX_NAME_LEN);
        assert!(name_fits(&longest, None));
        assert!(name_fits(&"x".repeat(NAME_ROOM), Some(4)));
        assert!(!name_fits(&"x".repeat(NAME_ROOM + 1), None));
        // EUC_JP: "é" takes 3 bytes (JIS X 0212).
        assert!(name_fits(&"é".repeat(NAME_ROOM / 3), Some(3)));
        assert!(!name_fits(&"é".repeat(NAME_ROOM / 3 + 1), Some(3)));
        // Single-byte encodings (LATIN1...) never take more than UTF-8.
        assert!(name_fits(&"é".repeat(crate::MAX_NAME_LEN / 2), Some(1)));
    }
}
