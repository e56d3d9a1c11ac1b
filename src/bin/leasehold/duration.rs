//! Durations as flock(1) takes them (seconds, fractions allowed) and as
//! people write them (`90s`, `5m`, `1h30m`, `250ms`).

use std::time::Duration;

/// Parses `SECS` (`10`, `0.5`, `1e1`) or a sum of `<number><unit>` terms
/// with units `ms`, `s`, `m`, `h`, `d` (`1h30m`, `1.5h`, `2m 30s`). Never
/// panics: `inf`, `nan`, negative and unrepresentable values are errors.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    if text.is_empty() {
        return Err("a duration cannot be empty (seconds, or e.g. 90s, 5m, 1h30m)".to_owned());
    }
    if let Ok(secs) = text.parse::<f64>() {
        // "inf" and "nan" parse as f64; they are no timeout.
        return seconds(secs).ok_or_else(|| format!("{s:?} is not a usable number of seconds"));
    }
    let bad = || format!("{s:?} is not a duration (seconds, or e.g. 90s, 5m, 1h30m, 250ms)");
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (number, after) = rest.split_at(number_end);
        let unit_end = after
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let scale = match unit {
            "ms" => 0.001,
            "s" | "sec" | "secs" => 1.0,
            "m" | "min" | "mins" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            _ => return Err(bad()),
        };
        let value: f64 = number.parse().map_err(|_| bad())?;
        let term = seconds(value * scale).ok_or_else(bad)?;
        total = total.checked_add(term).ok_or_else(bad)?;
        rest = after.trim_start();
    }
    Ok(total)
}

fn seconds(secs: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(secs).ok()
}

/// `1.5s`, `2m5s`, `1h0m3s`: short, for status lines.
pub(crate) fn short(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0..60 => format!("{}s", secs),
        60..3600 => format!("{}m{}s", secs / 60, secs % 60),
        _ => format!("{}h{}m{}s", secs / 3600, secs / 60 % 60, secs % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_as_flock_takes_them_and_human_durations() {
        let ok = [
            ("10", 10_000),
            ("0.5", 500),
            ("0", 0),
            ("1e1", 10_000),
            ("90s", 90_000),
            ("5m", 300_000),
            ("1h30m", 5_400_000),
            ("1.5h", 5_400_000),
            ("2m 30s", 150_000),
            ("250ms", 250),
            ("1d", 86_400_000),
            (" 3s ", 3_000),
        ];
        for (text, ms) in ok {
            assert_eq!(parse_duration(text), Ok(Duration::from_millis(ms)), "{text:?}");
        }
        for bad in [
            "", "-1", "inf", "nan", "1e99", "5x", "m", "h5", "1..5s", "5m-", "1e400s", "s5", ".s", "１s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_duration(&"9".repeat(400)).is_err());
        assert!(parse_duration(&format!("{}d", "9".repeat(30))).is_err());
    }

    #[test]
    fn short_durations() {
        assert_eq!(short(Duration::from_millis(1500)), "1s");
        assert_eq!(short(Duration::from_secs(125)), "2m5s");
        assert_eq!(short(Duration::from_secs(3603)), "1h0m3s");
    }
}
