//! How the replication stream or the catalog broke what Siphon relies on: a bug on one side,
//! kept as the positions and numbers involved; the message is rendered in `Display`.
//!
//! # Invariants
//! - Every variant is a [`siphon_core::Consequence::Retry`]: reconnecting replays from the
//!   confirmed position.

use pgoutput::{Lsn, Oid};
use siphon_core::assembly::AssemblyError;

/// A break of the protocol between Siphon and PostgreSQL.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolFault {
    /// The stream's framing broke the assembly's rules (a framing error, never
    /// [`AssemblyError::Unhandled`], which is a definite error).
    #[error("{0}")]
    Assembly(AssemblyError),
    /// The catalog returned a table name that is not UTF-8.
    #[error("table name is not UTF-8: {0}")]
    TableNameNotUtf8(#[source] std::str::Utf8Error),
    /// The publication's membership query named a table Siphon did not ask about.
    #[error("the publication's membership named table number {ordinal} of {tables}")]
    MembershipOrdinal { ordinal: i64, tables: usize },
    /// A row of an outbox relation came before the relation's description.
    #[error("row change of outbox relation {relation} at {lsn} without its description")]
    UndescribedOutboxRow { relation: Oid, lsn: Lsn },
    /// A DELETE of a relation came without its old row (the source skims the DELETEs of a
    /// bound outbox table) while the session has no binding that skips it: reconnecting reads
    /// it again, decoded.
    #[error(
        "DELETE of relation {relation} at {lsn} read without its old row, which its table needs"
    )]
    DeleteWithoutRow { relation: Oid, lsn: Lsn },
    /// `CREATE_REPLICATION_SLOT` answered without a consistent point.
    #[error("CREATE_REPLICATION_SLOT answered without a consistent point")]
    MissingConsistentPoint,
    /// `TIMELINE_HISTORY` answered with a history file PostgreSQL does not write.
    #[error("TIMELINE_HISTORY: {0}")]
    TimelineHistory(#[source] crate::names::HistoryError),
}
