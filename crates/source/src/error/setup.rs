//! Why the server, the slot, the publication or the outbox tables are not what Siphon needs,
//! kept as the names and values the fix needs; the message (naming the fix) is rendered in
//! `Display`.
//!
//! # Invariants
//! - Every variant is a [`siphon_core::Consequence::Fix`]: reconnecting finds the same state.

use std::fmt;

use crate::names::{quote_ident, MembershipChange, TableName};

/// A check of the server, slot, publication or tables that failed.
#[derive(Debug)]
pub enum SetupProblem {
    /// `wal_level` is not `logical`.
    WalLevel { level: String },
    /// An outbox table of `source.tables` does not exist.
    MissingTable { table: TableName },
    /// `source.failover = true` on a server older than 17 (`version` is `server_version_num`).
    FailoverUnsupported { version: i32 },
    /// The publication was dropped while streaming.
    PublicationDropped { publication: String },
    /// The publication exists but does not publish what Siphon needs.
    Publication(PublicationProblem),
    /// The publication changed under the stream, so events were not published.
    PublicationChanged {
        publication: String,
        change: MembershipChange,
    },
    /// The publication names an outbox table's changes by its partition `leaf`.
    LeafPublished {
        publication: String,
        leaf: TableName,
        root: TableName,
    },
    /// The slot Siphon streamed from is gone.
    SlotGone { slot: String },
    /// The slot is not a logical pgoutput slot.
    SlotKind {
        slot: String,
        slot_type: String,
        plugin: Option<String>,
    },
    /// The slot belongs to another database than `source.url`'s.
    SlotDatabase {
        slot: String,
        database: Option<String>,
        current: String,
    },
    /// The slot was invalidated (its WAL removed).
    SlotInvalidated { slot: String },
    /// The server skipped changes of slot `slot` because the publication was missing when
    /// they were written; `notice` is what it said.
    PublicationSkipped {
        slot: String,
        notice: Box<crate::wire::ServerError>,
    },
    /// The slot decodes two-phase transactions; `version` is the server's when known.
    TwoPhaseSlot { slot: String, version: Option<i32> },
    /// The rows of an outbox table cannot be read in a stable order (initial snapshot, re-send).
    SnapshotOrder {
        table: TableName,
        problem: crate::names::OrderProblem,
    },
    /// Siphon's role may not read, or may not remove, the rows of the signal table.
    SignalTablePrivileges {
        table: TableName,
        user: String,
        missing: Vec<&'static str>,
    },
}

/// What is wrong with an existing publication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicationProblem {
    pub publication: String,
    /// It does not publish INSERTs.
    pub no_inserts: bool,
    /// Partitioned outbox tables published under their partitions' names.
    pub by_partition: Vec<TableName>,
    /// Outbox tables it does not include.
    pub missing: Vec<TableName>,
}

impl std::error::Error for SetupProblem {}

impl fmt::Display for SetupProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupProblem::WalLevel { level } => write!(
                f,
                "PostgreSQL has wal_level = {level}; logical replication needs wal_level = logical: set it in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL"
            ),
            SetupProblem::MissingTable { table } => write!(
                f,
                "outbox table {table} does not exist (source.tables): create it, or fix the name in source.tables"
            ),
            SetupProblem::FailoverUnsupported { version } => write!(
                f,
                "source.failover = true needs failover slots, which PostgreSQL has from version 17 on; this server is {}.{}: upgrade it, or set source.failover = false (the slot is then lost when the primary fails over)",
                version / 10_000,
                version % 10_000 / 100
            ),
            SetupProblem::PublicationDropped { publication } => write!(
                f,
                "publication \"{publication}\" was dropped while streaming: PostgreSQL publishes nothing for it while it is missing, so events committed until it exists again are not captured; create it again (restart Siphon, which creates it, or CREATE PUBLICATION {} FOR TABLE <outbox tables> WITH (publish = 'insert, update'))",
                quote_ident(publication)
            ),
            SetupProblem::Publication(problem) => problem.fmt(f),
            SetupProblem::PublicationChanged {
                publication,
                change,
            } => super::fixes::publication_change(change, publication, f),
            SetupProblem::LeafPublished {
                publication,
                leaf,
                root,
            } => write!(
                f,
                "publication \"{publication}\" names the changes of outbox table {root} by its partition {leaf} (publish_via_partition_root is off), so they cannot be routed: run {} and restart Siphon; nothing was skipped, streaming resumes at the first unacknowledged transaction",
                super::fixes::publish_via_root_fix(publication)
            ),
            SetupProblem::SlotGone { slot } => write!(
                f,
                "replication slot \"{slot}\" no longer exists on this server although Siphon streamed from it: it was dropped, or the server is a promoted standby that had no synchronized copy of it (source.failover = true with sync_replication_slots = on on the standby keeps one); events committed since then were not captured and cannot be read from this server; restart Siphon to create the slot anew from the current position"
            ),
            SetupProblem::SlotKind {
                slot,
                slot_type,
                plugin,
            } => write!(
                f,
                "replication slot \"{slot}\" is a {slot_type} slot with plugin {}; Siphon needs a logical slot using pgoutput: choose another source.slot, or drop it with SELECT pg_drop_replication_slot('{slot}') if nothing else uses it",
                plugin.as_deref().unwrap_or("none")
            ),
            SetupProblem::SlotDatabase {
                slot,
                database,
                current,
            } => write!(
                f,
                "replication slot \"{slot}\" belongs to database {} but source.url connects to {current}: point source.url at that database or choose another source.slot",
                database.as_deref().unwrap_or("?")
            ),
            SetupProblem::SlotInvalidated { slot } => write!(
                f,
                "replication slot \"{slot}\" was invalidated (its WAL was removed, see max_slot_wal_keep_size): drop it with SELECT pg_drop_replication_slot('{slot}') and restart Siphon; events in the lost WAL cannot be recovered"
            ),
            SetupProblem::PublicationSkipped { slot, notice } => write!(
                f,
                "PostgreSQL skipped changes the slot decoded because the publication did not exist when they were written (it was dropped, and maybe created again, while Siphon was not streaming): {notice}. The events committed while it was missing were not published, cannot be read from this slot and were not sent to Kafka. If the publication is still missing, restart Siphon, which creates it (or create it with CREATE PUBLICATION ... FOR TABLE <outbox tables>); then re-send the events committed while it was missing from the application and move the slot past them with {} (this skips every event not yet sent: re-send those too) and restart Siphon",
                super::server::advance_slot_hint(slot)
            ),
            SetupProblem::TwoPhaseSlot { slot, version } => {
                super::fixes::two_phase_slot(slot, *version, f)
            }
            SetupProblem::SnapshotOrder { table, problem } => write!(
                f,
                "outbox table {table} {problem} (source.snapshot_tables.\"{table}\".order_by)"
            ),
            SetupProblem::SignalTablePrivileges {
                table,
                user,
                missing,
            } => write!(
                f,
                "signal table {table} (source.signal_table): Siphon's role {user:?} lacks the {} privilege on it; Siphon reads each request and removes its row once carried out, so that it is carried out once: run GRANT SELECT, DELETE ON {} TO {} and start Siphon again",
                missing.join(" and "),
                table.quoted(),
                quote_ident(user)
            ),
        }
    }
}

impl fmt::Display for PublicationProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let publication = &self.publication;
        let mut fixes = Vec::new();
        let mut problems = Vec::new();
        if self.no_inserts {
            problems
                .push("does not publish INSERTs, so no outbox event would ever be seen".to_owned());
            fixes.push(format!(
                "ALTER PUBLICATION {} SET (publish = 'insert, update')",
                quote_ident(publication)
            ));
        }
        if !self.by_partition.is_empty() {
            let names: Vec<String> = self.by_partition.iter().map(TableName::quoted).collect();
            problems.push(format!(
                "publishes the partitioned outbox table {} under its partitions' names (publish_via_partition_root is off), so its events could not be routed",
                names.join(", ")
            ));
            fixes.push(super::fixes::publish_via_root_fix(publication));
        }
        if !self.missing.is_empty() {
            let missing: Vec<String> = self.missing.iter().map(TableName::quoted).collect();
            problems.push(format!("does not include {}", missing.join(", ")));
            fixes.push(format!(
                "ALTER PUBLICATION {} ADD TABLE {}",
                quote_ident(publication),
                missing.join(", ")
            ));
        }
        write!(
            f,
            "publication \"{publication}\" {}: run {}",
            problems.join(" and "),
            fixes.join("; ")
        )
    }
}
