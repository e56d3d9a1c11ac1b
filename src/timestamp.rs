//! Times as records spell them: RFC 3339, in the fixed-width form of
//! JavaScript's `toISOString()` (`YYYY-MM-DDTHH:MM:SS.mmmZ`), which
//! velocious and pi-research write too; and milliseconds since the Unix
//! epoch. The one home of time formatting: records, messages and listings
//! all format here.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Parses an RFC 3339 / ISO-8601 timestamp such as JavaScript's
/// `toISOString()` writes.
pub(crate) fn parse_time(s: &str) -> Option<SystemTime> {
    let t = OffsetDateTime::parse(s, &Rfc3339).ok()?;
    let secs = t.unix_timestamp();
    let since_epoch = Duration::new(secs.unsigned_abs(), t.nanosecond());
    if secs >= 0 {
        UNIX_EPOCH.checked_add(since_epoch)
    } else {
        // Before 1970: the nanoseconds count forwards from `secs`.
        UNIX_EPOCH
            .checked_sub(Duration::from_secs(secs.unsigned_abs()))?
            .checked_add(Duration::from_nanos(u64::from(t.nanosecond())))
    }
}

/// Formats as `YYYY-MM-DDTHH:MM:SS.mmmZ`, the fixed-width form of
/// JavaScript's `toISOString()`, so every record a holder rewrites keeps its
/// length.
pub(crate) fn format_time(t: SystemTime) -> String {
    // Signed: a record another program wrote may say any time, before 1970
    // too, and a message quoting it must not print another.
    let nanos = match t.duration_since(UNIX_EPOCH) {
        Ok(after) => i128::try_from(after.as_nanos()).unwrap_or(i128::MAX),
        Err(before) => -i128::try_from(before.duration().as_nanos()).unwrap_or(i128::MAX),
    };
    let dt = OffsetDateTime::from_unix_timestamp_nanos(nanos).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        dt.year(),
        u8::from(dt.month()),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second(),
        dt.millisecond()
    )
}

pub(crate) fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn time_round_trips(ms in 0u64..253_402_300_799_000) {
            let t = UNIX_EPOCH + Duration::from_millis(ms);
            prop_assert_eq!(parse_time(&format_time(t)), Some(t));
        }
    }
}
