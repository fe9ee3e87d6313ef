//! `table.field.event.timestamp`: PostgreSQL timestamp text to a Kafka record timestamp.
//!
//! PostgreSQL prints `timestamp` as `2024-05-01 12:34:56.123456` and `timestamptz` with the
//! session's UTC offset appended (`+00`, `+05:30`, `-03:00:15`), both with ` BC` after years
//! before 1 AD (DateStyle ISO, the replication default).
//!
//! Debezium (default `time.precision.mode=adaptive`) gives a `timestamp(0..3)` column the
//! `io.debezium.time.Timestamp` schema (epoch milliseconds, used as is) and a `timestamp(4..6)`
//! or unqualified one `io.debezium.time.MicroTimestamp` (epoch microseconds, divided by 1000
//! with Java's truncation toward zero); a `timestamp` is read as UTC. See
//! `EventRouterDelegate.getEventTimestampMs` in Debezium.
//!
//! # Invariants
//! - Never panics: every field is range-checked and the arithmetic is checked.

/// Why a timestamp text cannot become a record timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampError {
    /// `infinity` / `-infinity`: no record timestamp stands for it.
    Infinite,
    /// Not PostgreSQL's ISO timestamp text.
    Malformed,
}

/// Days from 1970-01-01 to the proleptic Gregorian date (astronomical year numbering).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn digits(text: &[u8]) -> Option<i64> {
    if text.is_empty() || text.len() > 9 || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// Microseconds since the epoch for a `timestamp` / `timestamptz` text.
pub fn epoch_micros(text: &str) -> Result<i64, TimestampError> {
    if text == "infinity" || text == "-infinity" {
        return Err(TimestampError::Infinite);
    }
    parse(text.as_bytes()).ok_or(TimestampError::Malformed)
}

fn parse(text: &[u8]) -> Option<i64> {
    let (text, bc) = match text.strip_suffix(b" BC") {
        Some(t) => (t, true),
        None => (text, false),
    };
    // Date: YYYY-MM-DD (the year may have more than four digits).
    let dash = text.iter().position(|&b| b == b'-')?;
    let year = digits(&text[..dash])?;
    let rest = &text[dash + 1..];
    if rest.len() < 14 || rest[2] != b'-' || rest[5] != b' ' || rest[8] != b':' || rest[11] != b':'
    {
        return None;
    }
    let month = digits(&rest[0..2])?;
    let day = digits(&rest[3..5])?;
    let hour = digits(&rest[6..8])?;
    let minute = digits(&rest[9..11])?;
    let second = digits(&rest[12..14])?;
    let mut rest = &rest[14..];
    let mut micros = 0i64;
    if let Some(frac) = rest.strip_prefix(b".") {
        let len = frac.iter().take_while(|b| b.is_ascii_digit()).count();
        if len == 0 || len > 6 {
            return None;
        }
        micros = digits(&frac[..len])? * 10i64.pow(6 - len as u32);
        rest = &frac[len..];
    }
    let mut offset_seconds = 0i64;
    if let Some((&sign, zone)) = rest.split_first() {
        let sign = match sign {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        let mut parts = zone.split(|&b| b == b':');
        let mut total = 0i64;
        for (i, unit) in [3600i64, 60, 1].into_iter().enumerate() {
            match parts.next() {
                Some(p) if p.len() == 2 => total += digits(p)? * unit,
                None if i > 0 => break,
                _ => return None,
            }
        }
        if parts.next().is_some() {
            return None;
        }
        offset_seconds = sign * total;
    }
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 24
        || minute > 59
        || second > 60
    {
        return None;
    }
    let year = if bc { 1 - year } else { year };
    let days = days_from_civil(year, month, day);
    let seconds = days
        .checked_mul(86_400)?
        .checked_add(hour * 3600 + minute * 60 + second)?
        .checked_sub(offset_seconds)?;
    seconds.checked_mul(1_000_000)?.checked_add(micros)
}

/// The record timestamp in milliseconds for a column with type modifier `typmod` (the
/// precision, or -1): milliseconds as Debezium's `Timestamp` for precision 0 to 3, otherwise
/// microseconds divided by 1000 toward zero as for `MicroTimestamp`.
pub fn record_timestamp_ms(text: &str, typmod: i32) -> Result<i64, TimestampError> {
    let micros = epoch_micros(text)?;
    if (0..=3).contains(&typmod) {
        // PostgreSQL rounded the value to at most milliseconds, so this is exact.
        Ok(micros.div_euclid(1000))
    } else {
        Ok(micros / 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_without_zone_are_utc() {
        assert_eq!(epoch_micros("1970-01-01 00:00:00"), Ok(0));
        // date -u -d '2024-05-01 12:34:56' +%s = 1714566896
        assert_eq!(
            epoch_micros("2024-05-01 12:34:56.123456"),
            Ok(1_714_566_896_123_456)
        );
        assert_eq!(
            record_timestamp_ms("2024-05-01 12:34:56.123456", -1),
            Ok(1_714_566_896_123)
        );
        assert_eq!(
            record_timestamp_ms("2024-05-01 12:34:56.5", 3),
            Ok(1_714_566_896_500)
        );
    }

    #[test]
    fn offsets() {
        assert_eq!(
            epoch_micros("2024-05-01 12:34:56.123456+00"),
            Ok(1_714_566_896_123_456)
        );
        assert_eq!(
            epoch_micros("2024-05-01 14:34:56+02"),
            Ok(1_714_566_896_000_000)
        );
        assert_eq!(
            epoch_micros("2024-05-01 07:04:56-05:30"),
            Ok(1_714_566_896_000_000)
        );
        assert_eq!(
            epoch_micros("1900-01-01 00:00:00+00:09:21"),
            Ok((-2_208_988_800 - 561) * 1_000_000)
        );
    }

    #[test]
    fn before_the_epoch_truncates_toward_zero_for_micro_timestamps() {
        assert_eq!(epoch_micros("1969-12-31 23:59:59.9985"), Ok(-1_500));
        assert_eq!(record_timestamp_ms("1969-12-31 23:59:59.9985", 6), Ok(-1));
        assert_eq!(record_timestamp_ms("1969-12-31 23:59:59.998", 3), Ok(-2));
    }

    #[test]
    fn bc_and_far_years() {
        // 0001-01-01 BC is astronomical year 0: 366 days before 0001-01-01.
        let ad1 = epoch_micros("0001-01-01 00:00:00");
        let bc1 = epoch_micros("0001-01-01 00:00:00 BC");
        assert_eq!(
            ad1.map(|a| bc1.map(|b| a - b)),
            Ok(Ok(366 * 86_400 * 1_000_000))
        );
        assert!(epoch_micros("200000-12-31 23:59:59.999999").is_ok());
    }

    #[test]
    fn rejects() {
        assert_eq!(epoch_micros("infinity"), Err(TimestampError::Infinite));
        assert_eq!(epoch_micros("-infinity"), Err(TimestampError::Infinite));
        for bad in [
            "",
            "2024-05-01",
            "2024-13-01 00:00:00",
            "2024-05-01T00:00:00",
            "2024-05-01 00:00:00.",
            "2024-05-01 00:00:00.1234567",
            "2024-05-01 00:00:00+1",
            "2024-05-01 00:00:00 UTC",
            "x",
        ] {
            assert_eq!(epoch_micros(bad), Err(TimestampError::Malformed), "{bad}");
        }
    }
}
