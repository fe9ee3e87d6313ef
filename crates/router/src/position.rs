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
