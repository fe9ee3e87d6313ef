//! Where a change was read in PostgreSQL's write-ahead log, for the formats that carry it
//! (the protobuf value's `source` and the event time of protobuf values and CloudEvents).
//!
//! # Invariants
//! - [`SourcePosition::default`] (all zero, no commit time) means "unknown": routing with it
//!   writes zeros and leaves the commit time out, never fails.

use pgoutput::Lsn;

/// The position of one row change, as the replication stream gave it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourcePosition {
    /// The commit LSN of the change's transaction (the `final_lsn` of its BEGIN message).
    pub commit_lsn: Lsn,
    /// The LSN of the change itself (the start of its XLogData message).
    pub lsn: Lsn,
    /// The transaction id (the `xid` of its BEGIN message).
    pub xid: u32,
    /// The commit time of the transaction, in microseconds since the Unix epoch (the
    /// `commit_time` of its BEGIN message, converted from PostgreSQL's epoch).
    pub commit_time_us: Option<i64>,
}

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01 00:00:00 UTC).
const POSTGRES_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;

impl SourcePosition {
    /// The position of a change as pgoutput gives it: `final_lsn`, `xid` and `commit_time`
    /// (microseconds since 2000-01-01, PostgreSQL's epoch) of its BEGIN message, and the LSN
    /// of the change.
    pub fn from_pgoutput(final_lsn: Lsn, lsn: Lsn, xid: u32, commit_time_pg_us: i64) -> Self {
        SourcePosition {
            commit_lsn: final_lsn,
            lsn,
            xid,
            commit_time_us: commit_time_pg_us.checked_add(POSTGRES_EPOCH_UNIX_MICROS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_times_move_to_the_unix_epoch() {
        let p = SourcePosition::from_pgoutput(Lsn(9), Lsn(5), 7, 0);
        assert_eq!(p.commit_time_us, Some(946_684_800_000_000));
        assert_eq!((p.commit_lsn, p.lsn, p.xid), (Lsn(9), Lsn(5), 7));
        assert_eq!(
            SourcePosition::from_pgoutput(Lsn(0), Lsn(0), 0, i64::MAX).commit_time_us,
            None
        );
    }
}
