//! What Siphon was doing when PostgreSQL (or the connection) failed: the command, or the
//! catalog query named by what it reads.
//!
//! # Invariants
//! - Every server error is classified together with its [`SourceOperation`]: the same SQLSTATE may
//!   mean another thing for another command (42704 before streaming is the slot, while
//!   streaming the publication).

use std::fmt;

/// The command that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceOperation {
    /// Opening the SQL connection (tokio-postgres): TCP, TLS, authentication.
    Connect,
    /// Opening the replication connection: TCP, TLS, startup message, authentication.
    ReplicationLogin,
    /// `IDENTIFY_SYSTEM` on the replication connection.
    IdentifySystem,
    /// `ALTER_REPLICATION_SLOT ... ( FAILOVER true )` on the replication connection.
    AlterReplicationSlot,
    /// `TIMELINE_HISTORY` on a replication connection.
    TimelineHistory,
    /// Creating the replication slot (`pg_create_logical_replication_slot`).
    CreateReplicationSlot,
    /// Creating the publication; `command` is the statement, shown as the fix.
    CreatePublication { command: String },
    /// `START_REPLICATION`, until the server starts streaming (the slot is acquired and its
    /// decoding set up here).
    StartReplication,
    /// The replication stream: an error the server sent while decoding (publications are
    /// looked up here).
    Stream,
    /// A catalog query.
    Query(Query),
}

/// A catalog query, by what it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Query {
    WalLevel,
    ServerVersion,
    OutboxTables,
    Publication,
    PublicationTables,
    PublicationOptions,
    PublicationMembership,
    ReplicationSlot,
    SlotPosition,
    BackendPid,
    CurrentDatabase,
    OutboxColumns,
    GeneratedColumns,
    PartitionAncestors,
    SynchronizedStandbySlots,
    StandbySlots,
    SlotCreationBlockers,
    WalsenderActivity,
    TargetSessionAttrs,
    /// `pg_is_in_recovery()` on the replication connection.
    InRecovery,
    /// The status report's queries.
    ServerPosition,
    SlotStatus,
    PublicationStatus,
    PublicationTablesStatus,
    RetainedWal,
    /// The transaction an initial snapshot reads in (`BEGIN`, `COMMIT`).
    SnapshotTransaction,
    /// Outbox rows read by an initial snapshot or a re-send.
    OutboxRows,
    /// The signal table (`source.signal_table`): reading or removing a request.
    Signals,
}

impl fmt::Display for SourceOperation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceOperation::Connect => f.write_str("connecting to PostgreSQL"),
            SourceOperation::ReplicationLogin => f.write_str("opening the replication connection"),
            SourceOperation::IdentifySystem => f.write_str("IDENTIFY_SYSTEM"),
            SourceOperation::AlterReplicationSlot => f.write_str("ALTER_REPLICATION_SLOT"),
            SourceOperation::TimelineHistory => f.write_str("TIMELINE_HISTORY"),
            SourceOperation::CreateReplicationSlot => f.write_str("creating the replication slot"),
            SourceOperation::CreatePublication { .. } => f.write_str("creating the publication"),
            SourceOperation::StartReplication => f.write_str("START_REPLICATION"),
            SourceOperation::Stream => f.write_str("streaming"),
            SourceOperation::Query(query) => query.fmt(f),
        }
    }
}

impl fmt::Display for Query {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Query::WalLevel => "reading wal_level",
            Query::ServerVersion => "reading the server version",
            Query::OutboxTables => "looking up the outbox tables",
            Query::Publication => "looking up the publication",
            Query::PublicationTables => "reading the publication's tables",
            Query::PublicationOptions => "reading the publication's options",
            Query::PublicationMembership => "reading the publication's membership",
            Query::ReplicationSlot => "looking up the replication slot",
            Query::SlotPosition => "reading the replication slot",
            Query::BackendPid => "reading the backend's pid",
            Query::CurrentDatabase => "reading the current database",
            Query::OutboxColumns => "reading the outbox table's columns",
            Query::GeneratedColumns => "reading the outbox table's generated columns",
            Query::PartitionAncestors => "looking up the partition ancestors of a table",
            Query::SynchronizedStandbySlots => "reading synchronized_standby_slots",
            Query::StandbySlots => "looking up the standby slots",
            Query::SlotCreationBlockers => "reading the transactions slot creation waits for",
            Query::WalsenderActivity => "reading the slot's walsender activity",
            Query::TargetSessionAttrs => "checking target_session_attrs",
            Query::InRecovery => "checking whether the server is in recovery",
            Query::ServerPosition => "reading the server version and WAL position",
            Query::SlotStatus => "reading pg_replication_slots",
            Query::PublicationStatus => "reading pg_publication",
            Query::PublicationTablesStatus => "reading pg_publication_tables",
            Query::RetainedWal => "reading the slot's retained WAL",
            Query::SnapshotTransaction => "opening or ending the snapshot's transaction",
            Query::OutboxRows => "reading outbox rows (initial snapshot or re-send; check source.snapshot_filter or --where)",
            Query::Signals => "reading or removing a row of the signal table (source.signal_table; Siphon's role needs SELECT and DELETE on it)",
        })
    }
}
