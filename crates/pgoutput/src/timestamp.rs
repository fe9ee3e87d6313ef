//! PostgreSQL timestamps (microseconds since 2000-01-01 UTC, as pgoutput's Begin and Commit
//! carry them) as wall-clock times, for the commit-to-read and commit-to-acknowledgement
//! latencies.
//!
//! # Invariants
//! - Out-of-range timestamps map to the PostgreSQL epoch instead of panicking.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds from the Unix epoch to PostgreSQL's (2000-01-01 00:00:00 UTC).
const PG_EPOCH_UNIX_SECS: u64 = 946_684_800;

/// The wall-clock time of a PostgreSQL timestamp in microseconds since 2000-01-01 UTC.
pub fn pg_timestamp(micros: i64) -> SystemTime {
    let base = UNIX_EPOCH + Duration::from_secs(PG_EPOCH_UNIX_SECS);
    let offset = Duration::from_micros(micros.unsigned_abs());
    let time = if micros >= 0 {
        base.checked_add(offset)
    } else {
        base.checked_sub(offset)
    };
    time.unwrap_or(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pg_epoch_conversion() {
        assert_eq!(
            pg_timestamp(0),
            UNIX_EPOCH + Duration::from_secs(946_684_800)
        );
        assert_eq!(
            pg_timestamp(1_500_000),
            UNIX_EPOCH + Duration::from_millis(946_684_801_500)
        );
        assert_eq!(
            pg_timestamp(-1_000_000),
            UNIX_EPOCH + Duration::from_secs(946_684_799)
        );
    }
}
