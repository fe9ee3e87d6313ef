//! The replication slot and publication as PostgreSQL sees them (what `siphon status` reports),
//! over an ordinary SQL connection, plus the sampling query behind the retained-WAL gauge.
//!
//! # Invariants
//! - Read-only: nothing here creates, alters, drops or advances anything, so it is safe to run
//!   against a slot another Siphon is streaming from.
//! - Positions are read with the typed `pg_lsn` conversion; byte counts are computed by the server
//!   (`pg_wal_lsn_diff`) against its current WAL position (the replay position on a standby)
//!   and floored at 0.
//! - [`SlotStatus::healthy`] gives one reason per problem, each naming the fix.

use crate::error::Query;
use crate::SourceError;
use pgoutput::Lsn;
use serde::{Serialize, Serializer};
use tokio_postgres::types::PgLsn;
use tokio_postgres::Client;

/// The server's current WAL position: the insert position on a primary, the replay position on a
/// standby (where `pg_current_wal_lsn()` is an error).
const CURRENT_LSN: &str =
    "CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END";

/// Why the status could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The connection could not be opened; the message says why.
    #[error("{0}")]
    Connect(#[from] SourceError),
    /// A query failed (classified by its SQLSTATE like every source error).
    #[error("{0}")]
    Query(SourceError),
}

impl StatusError {
    fn query(what: Query, err: tokio_postgres::Error) -> Self {
        StatusError::Query(SourceError::from_sql(what, err))
    }
}

/// The replication slot, as `pg_replication_slots` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlotInfo {
    /// Output plugin (`pgoutput` for Siphon's slot; none for a physical slot).
    pub plugin: Option<String>,
    /// `logical` or `physical`.
    pub slot_type: String,
    /// The database a logical slot belongs to.
    pub database: Option<String>,
    /// Whether a client is streaming from the slot.
    pub active: bool,
    /// The server process of that client.
    pub active_pid: Option<i32>,
    /// Everything before this position is delivered (what Siphon resumes from).
    #[serde(serialize_with = "lsn_text")]
    pub confirmed_flush_lsn: Option<Lsn>,
    /// The oldest WAL the slot still needs; the server keeps WAL from here on.
    #[serde(serialize_with = "lsn_text")]
    pub restart_lsn: Option<Lsn>,
    /// `reserved`, `extended`, `unreserved` (WAL about to be removed) or `lost` (invalidated).
    pub wal_status: Option<String>,
    /// WAL the server keeps for this slot: current position minus `restart_lsn`.
    pub retained_wal_bytes: Option<u64>,
    /// WAL not yet confirmed as delivered: current position minus `confirmed_flush_lsn`.
    pub lag_bytes: Option<u64>,
    /// WAL that can still be written before the slot is in danger of losing WAL (none when
    /// `max_slot_wal_keep_size` is unlimited).
    pub safe_wal_size_bytes: Option<i64>,
    /// Whether the slot is a failover slot, copied to standbys (none before PostgreSQL 17).
    pub failover: Option<bool>,
    /// Whether this copy of the slot was synchronized from a primary (true on a standby, and on a
    /// promoted standby; none before PostgreSQL 17).
    pub synced: Option<bool>,
}

/// The publication, as `pg_publication` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PublicationInfo {
    /// `FOR ALL TABLES`.
    pub all_tables: bool,
    /// The published tables, `schema.table`, sorted.
    pub tables: Vec<String>,
}

/// Everything `siphon status` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlotStatus {
    /// `server_version` of the PostgreSQL server.
    pub server_version: String,
    /// The database the URL connects to.
    pub database: String,
    /// The host of the URL that answered (the first that fits `target_session_attrs`).
    pub host: String,
    /// The primary's `synchronized_standby_slots` (none before PostgreSQL 17).
    pub synchronized_standby_slots: Option<String>,
    /// What is wrong with that setting for a failover slot, naming the fix.
    pub standby_slots_problem: Option<String>,
    /// The server's current WAL position (replay position on a standby).
    #[serde(serialize_with = "lsn_text_one")]
    pub current_wal_lsn: Lsn,
    /// The slot's name.
    pub slot_name: String,
    /// The slot, if it exists.
    pub slot: Option<SlotInfo>,
    /// While the slot is being created: what its creation waits for (see
    /// [`crate::slot_wait`]).
    pub being_created: Option<String>,
    /// The publication's name.
    pub publication_name: String,
    /// The publication, if it exists.
    pub publication: Option<PublicationInfo>,
}

fn lsn_text<S: Serializer>(lsn: &Option<Lsn>, s: S) -> Result<S::Ok, S::Error> {
    match lsn {
        Some(lsn) => s.collect_str(lsn),
        None => s.serialize_none(),
    }
}

fn lsn_text_one<S: Serializer>(lsn: &Lsn, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(lsn)
}

fn lsn(value: Option<PgLsn>) -> Option<Lsn> {
    value.map(|v| Lsn(u64::from(v)))
}

fn bytes(v: Option<i64>) -> Option<u64> {
    v.map(|b| u64::try_from(b).unwrap_or(0))
}

/// Reads the slot `slot` and the publication `publication` on the server at `url`.
pub async fn slot_status(
    url: &str,
    slot: &str,
    publication: &str,
) -> Result<SlotStatus, StatusError> {
    let located = crate::locate::locate(url).await?;
    let mut status = status_with(&located.client, slot, publication).await?;
    status.host = located.endpoint.to_string();
    Ok(status)
}

/// [`slot_status`] over an open connection.
pub async fn status_with(
    client: &Client,
    slot: &str,
    publication: &str,
) -> Result<SlotStatus, StatusError> {
    let server = client
        .query_one(
            &format!("SELECT current_setting('server_version'), current_database(), {CURRENT_LSN}"),
            &[],
        )
        .await
        .map_err(|e| StatusError::query(Query::ServerPosition, e))?;
    let current: Option<PgLsn> = server.get(2);
    let version: i32 = client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .map_err(|e| StatusError::query(Query::ServerVersion, e))?
        .get(0);
    let failover_slots = version >= crate::failover::FAILOVER_SLOTS_VERSION;
    let failover_columns = if failover_slots {
        "failover, synced"
    } else {
        "NULL::bool, NULL::bool"
    };
    let slot_row = client
        .query_opt(
            &format!(
                "WITH cur AS (SELECT {CURRENT_LSN} AS lsn) \
                 SELECT plugin, slot_type, database, active, active_pid, \
                        confirmed_flush_lsn, restart_lsn, wal_status, \
                        pg_wal_lsn_diff(cur.lsn, restart_lsn)::int8, \
                        pg_wal_lsn_diff(cur.lsn, confirmed_flush_lsn)::int8, \
                        safe_wal_size, {failover_columns} \
                   FROM pg_replication_slots, cur WHERE slot_name = $1"
            ),
            &[&slot],
        )
        .await
        .map_err(|e| StatusError::query(Query::SlotStatus, e))?;
    let slot_info = slot_row.map(|row| SlotInfo {
        plugin: row.get(0),
        slot_type: row.get(1),
        database: row.get(2),
        active: row.get(3),
        active_pid: row.get(4),
        confirmed_flush_lsn: lsn(row.get(5)),
        restart_lsn: lsn(row.get(6)),
        wal_status: row.get(7),
        retained_wal_bytes: bytes(row.get(8)),
        lag_bytes: bytes(row.get(9)),
        safe_wal_size_bytes: row.get(10),
        failover: row.get(11),
        synced: row.get(12),
    });
    // A logical slot without a confirmed position that a backend holds is still being created:
    // say which transactions that backend waits for.
    let being_created = match &slot_info {
        Some(s) if s.slot_type == "logical" && s.confirmed_flush_lsn.is_none() => {
            match s.active_pid {
                Some(creator) => {
                    let blockers = crate::slot_wait::blockers(client, creator)
                        .await
                        .map_err(StatusError::Query)?;
                    Some(crate::slot_wait::summary(slot, None, &blockers))
                }
                None => None,
            }
        }
        _ => None,
    };
    let (synchronized_standby_slots, standby_slots_problem) = if failover_slots {
        let standby = crate::failover::standby_slots(client)
            .await
            .map_err(StatusError::Query)?;
        let problem = standby.problem();
        (Some(standby.setting), problem)
    } else {
        (None, None)
    };
    let publication_row = client
        .query_opt(
            "SELECT puballtables FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .map_err(|e| StatusError::query(Query::PublicationStatus, e))?;
    let publication_info = match publication_row {
        None => None,
        Some(row) => {
            let tables = client
                .query(
                    "SELECT schemaname::text, tablename::text FROM pg_publication_tables \
                      WHERE pubname = $1 ORDER BY 1, 2",
                    &[&publication],
                )
                .await
                .map_err(|e| StatusError::query(Query::PublicationTablesStatus, e))?
                .iter()
                .map(|r| format!("{}.{}", r.get::<_, String>(0), r.get::<_, String>(1)))
                .collect();
            Some(PublicationInfo {
                all_tables: row.get(0),
                tables,
            })
        }
    };
    Ok(SlotStatus {
        server_version: server.get(0),
        database: server.get(1),
        host: String::new(),
        synchronized_standby_slots,
        standby_slots_problem,
        current_wal_lsn: lsn(current).unwrap_or(Lsn::ZERO),
        slot_name: slot.to_owned(),
        slot: slot_info,
        being_created,
        publication_name: publication.to_owned(),
        publication: publication_info,
    })
}

/// WAL retained on the server by `slot` (current position minus `restart_lsn`), for the
/// `siphon_slot_retained_wal_bytes` gauge; `None` if the slot does not exist or retains nothing
/// yet (no `restart_lsn`).
pub async fn retained_wal_bytes(client: &Client, slot: &str) -> Result<Option<u64>, StatusError> {
    let row = client
        .query_opt(
            &format!(
                "SELECT pg_wal_lsn_diff({CURRENT_LSN}, restart_lsn)::int8 \
                   FROM pg_replication_slots WHERE slot_name = $1"
            ),
            &[&slot],
        )
        .await
        .map_err(|e| StatusError::query(Query::RetainedWal, e))?;
    Ok(row.and_then(|r| bytes(r.get(0))))
}

impl SlotStatus {
    /// Whether Siphon's slot and publication are in working order, with one reason (naming the
    /// fix) per problem.
    pub fn healthy(&self) -> (bool, Vec<String>) {
        let mut reasons = Vec::new();
        let slot = &self.slot_name;
        match &self.slot {
            None => reasons.push(format!(
                "replication slot \"{slot}\" does not exist: `siphon run` creates it (events written before that are not captured)"
            )),
            // Still being created: what it waits for is the one problem to fix.
            Some(_) if self.being_created.is_some() => reasons.extend(self.being_created.clone()),
            Some(s) => {
                if s.slot_type != "logical" || s.plugin.as_deref() != Some("pgoutput") {
                    reasons.push(format!(
                        "replication slot \"{slot}\" is a {} slot with plugin {}, not a logical pgoutput slot: choose another source.slot",
                        s.slot_type,
                        s.plugin.as_deref().unwrap_or("none")
                    ));
                } else if s.database.as_deref() != Some(self.database.as_str()) {
                    reasons.push(format!(
                        "replication slot \"{slot}\" belongs to database {}, not {}: fix source.url or source.slot",
                        s.database.as_deref().unwrap_or("?"),
                        self.database
                    ));
                }
                match s.wal_status.as_deref() {
                    Some("lost") => reasons.push(format!(
                        "replication slot \"{slot}\" was invalidated (wal_status = lost): drop it with SELECT pg_drop_replication_slot('{slot}') and restart Siphon; events in the removed WAL are lost"
                    )),
                    Some("unreserved") => reasons.push(format!(
                        "replication slot \"{slot}\" is about to lose WAL (wal_status = unreserved, past max_slot_wal_keep_size): get Siphon streaming and caught up now"
                    )),
                    _ => {}
                }
                if s.failover == Some(true) {
                    if let Some(problem) = &self.standby_slots_problem {
                        reasons.push(format!(
                            "replication slot \"{slot}\" is a failover slot but {problem}"
                        ));
                    }
                }
                if !s.active && s.wal_status.as_deref() != Some("lost") {
                    reasons.push(format!(
                        "replication slot \"{slot}\" is not active: no client is streaming from it (is Siphon running?)"
                    ));
                }
            }
        }
        if self.publication.is_none() {
            reasons.push(format!(
                "publication \"{}\" does not exist: `siphon run` creates it, or run CREATE PUBLICATION ... FOR TABLE <outbox tables>",
                self.publication_name
            ));
        }
        (reasons.is_empty(), reasons)
    }
}
