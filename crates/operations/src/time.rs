//! Spans and instants as operators write and read them: `30d`, `1h` back
//! from now, RFC 3339.

use std::time::Duration;

use manifold_store::now_ms;

use crate::{AdminError, Result};

/// `30d`, `12h`, `90m`, `45s`, or bare seconds. Zero is refused: every use
/// (expiry, rate window, "since") needs a positive span.
pub fn parse_duration(text: &str) -> Result<Duration> {
    let text = text.trim();
    let invalid = || {
        AdminError::Invalid(format!(
            "invalid duration '{text}' (expected e.g. 30d, 12h, 90m, 45s or seconds)"
        ))
    };
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let scale: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 60 * 60,
        "d" => 24 * 60 * 60,
        _ => return Err(invalid()),
    };
    let n: u64 = digits.parse().map_err(|_| invalid())?;
    let secs = n
        .checked_mul(scale)
        .ok_or_else(|| AdminError::Invalid(format!("duration '{text}' is too long")))?;
    if secs == 0 {
        return Err(AdminError::Invalid(format!(
            "duration '{text}' must be greater than zero"
        )));
    }
    Ok(Duration::from_secs(secs))
}

/// `since` as a span back from now (`1h`, `7d`) or unix milliseconds.
pub fn parse_since(since: Option<&str>) -> Result<i64> {
    match since.map(str::trim).filter(|s| !s.is_empty()) {
        None => Ok(0),
        Some(ms) if ms.bytes().all(|b| b.is_ascii_digit()) => ms
            .parse()
            .map_err(|_| AdminError::Invalid(format!("invalid since '{ms}'"))),
        Some(span) => {
            let span = parse_duration(span)?;
            Ok(now_ms().saturating_sub(i64::try_from(span.as_millis()).unwrap_or(i64::MAX)))
        }
    }
}

/// Unix milliseconds as RFC 3339 UTC, e.g. `2026-11-30T06:56:10Z`.
pub fn format_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (Howard Hinnant), valid for the proleptic Gregorian calendar.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("30d").unwrap(),
            Duration::from_secs(30 * 86_400)
        );
        assert_eq!(
            parse_duration("12h").unwrap(),
            Duration::from_secs(12 * 3600)
        );
        assert_eq!(parse_duration("90m").unwrap(), Duration::from_secs(90 * 60));
        assert_eq!(parse_duration("45s").unwrap(), Duration::from_secs(45));
        assert_eq!(parse_duration("60").unwrap(), Duration::from_secs(60));
        for bad in [
            "",
            "0",
            "0s",
            "h",
            "5w",
            "-5s",
            "1.5h",
            "5 m",
            "99999999999999999999d",
        ] {
            let err = parse_duration(bad).unwrap_err().to_string();
            assert!(err.contains("duration"), "{bad}: {err}");
        }
    }

    #[test]
    fn formats_utc() {
        assert_eq!(format_ms(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_ms(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(format_ms(1_795_935_370_999), "2026-11-29T06:56:10Z");
    }
}
