//! The initial snapshot (`source.snapshot = "initial"`): when Siphon creates its slot, the rows
//! already in the outbox tables (those matching `source.snapshot_filter`) are sent before
//! streaming starts, so that switching from a polling relay loses none of the rows the relay
//! has not published yet.
//!
//! The slot is created on a replication connection as the first command of a `REPEATABLE READ`
//! transaction that uses the slot's snapshot (see [`siphon_source::snapshot`]): the transaction
//! sees exactly the rows committed before the slot's consistent point, and the slot streams
//! exactly the transactions committed after it. Those rows are read in key order, chunk by
//! chunk, routed into the records streaming makes of an INSERT (see [`crate::transfer`]) and
//! acknowledged by Kafka before streaming starts at the consistent point: no row is lost and
//! none comes twice, whatever commits meanwhile.
//!
//! # Invariants
//! - Streaming starts only after every row of the snapshot was acknowledged, so the slot is
//!   never confirmed past its consistent point before the snapshot is.
//! - Progress is kept in the state topic under [`key`]: a record saying the snapshot runs is
//!   written *before* the slot is created, and one saying it is done after its last row was
//!   acknowledged. A slot found with an unfinished snapshot is one whose snapshot was
//!   interrupted (a crash, a lost connection): the exported snapshot died with its connection,
//!   so the rows are read again as they are now, from the last key acknowledged, before
//!   streaming starts from the slot's (still unconfirmed) consistent point. Rows committed
//!   after the consistent point may then arrive twice (at-least-once after a crash); none is
//!   lost: rows before that key were acknowledged, rows after it still in the table are read,
//!   and every change committed after the consistent point is streamed.
//! - A slot that exists without a record of an unfinished snapshot (created before, or by a
//!   Siphon without `source.snapshot`) is streamed from as it is: the snapshot is taken only
//!   when Siphon creates the slot.

use crate::config::{Config, SnapshotMode};
use crate::error::PipelineError;
use crate::session::position::PositionHeaders;
use crate::session::PipelineSettings;
use crate::telemetry::{Metrics, TransferKind};
use crate::transfer::{self, Copy, Progress, ProgressLog, Sender, Stamp, TransferError};
use anyhow::Context;
use siphon_source::snapshot::RowReader;
use siphon_source::{SlotState, TableName};
use std::sync::Arc;
use std::time::Instant;
use tracing::{info, warn};

/// Rows read per chunk by default (`source.snapshot_chunk_rows`).
pub const DEFAULT_CHUNK_ROWS: usize = 1000;

/// How each outbox table is read by a snapshot or a re-send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TablePlan {
    pub table: TableName,
    /// The SQL condition rows are read with (`None`: every row).
    pub filter: Option<String>,
    /// Columns read in order before the primary key's (`order_by`).
    pub order_by: Vec<String>,
}

/// `source.snapshot*`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// `source.snapshot = "initial"`.
    pub initial: bool,
    pub chunk_rows: usize,
    pub tables: Vec<TablePlan>,
    /// `source.signal_table`: where re-sends are asked for (see [`crate::signal`]).
    pub signal_table: Option<TableName>,
}

impl Plan {
    /// The plan of `config` for the outbox tables `tables`.
    pub fn from_config(config: &Config, tables: &[TableName]) -> anyhow::Result<Plan> {
        let source = &config.source;
        let mut overrides = std::collections::HashMap::new();
        for (name, section) in &source.snapshot_tables {
            let table = TableName::parse(name)
                .with_context(|| format!("[source.snapshot_tables.\"{name}\"]"))?;
            if !tables.contains(&table) {
                anyhow::bail!("[source.snapshot_tables.\"{name}\"] names a table that is not in source.tables; add it there or remove the section");
            }
            overrides.insert(table, section.clone());
        }
        let global = non_empty(&source.snapshot_filter);
        let plans = tables
            .iter()
            .map(|table| {
                let section = overrides.get(table);
                TablePlan {
                    table: table.clone(),
                    filter: match section.and_then(|s| s.filter.as_deref()) {
                        Some(filter) => non_empty(filter),
                        None => global.clone(),
                    },
                    order_by: section.map(|s| s.order_by.clone()).unwrap_or_default(),
                }
            })
            .collect();
        if source.snapshot_chunk_rows == 0 {
            anyhow::bail!("source.snapshot_chunk_rows must be at least 1");
        }
        let initial = source.snapshot == SnapshotMode::Initial;
        if initial
            && (config.kafka.state_topic.trim().is_empty()
                || config.kafka.sink == crate::config::SinkKind::Discard)
        {
            anyhow::bail!("source.snapshot = \"initial\" keeps the snapshot's progress in the state topic: set kafka.state_topic (and kafka.sink = \"kafka\")");
        }
        let signal_table = match non_empty(&source.signal_table) {
            Some(name) => Some(TableName::parse(&name).context("source.signal_table")?),
            None => None,
        };
        if signal_table.is_some()
            && (config.kafka.state_topic.trim().is_empty()
                || config.kafka.sink == crate::config::SinkKind::Discard)
        {
            anyhow::bail!("source.signal_table: re-sends keep their progress in the state topic: set kafka.state_topic (and kafka.sink = \"kafka\")");
        }
        Ok(Plan {
            initial,
            chunk_rows: source.snapshot_chunk_rows,
            tables: plans,
            signal_table,
        })
    }
}

fn non_empty(text: &str) -> Option<String> {
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// The state topic key of the initial snapshot of `slot` on the server with `system_id`.
pub fn key(system_id: Option<&str>, slot: &str) -> String {
    format!("siphon/snapshot/{}/{slot}", system_id.unwrap_or("unknown"))
}

/// Before streaming from `slot` (as `prepare` left it, with `MissingSlot::Leave` when a
/// snapshot is configured): creates the slot with its snapshot and sends the snapshot, or
/// finishes an interrupted one (see the module's invariants). Afterwards `slot` describes the
/// slot to stream from.
pub async fn before_streaming(
    settings: &PipelineSettings,
    metrics: &Arc<Metrics>,
    slot: &mut SlotState,
) -> Result<(), PipelineError> {
    let plan = &settings.snapshot;
    if !plan.initial {
        return Ok(());
    }
    let state = settings
        .state_topic
        .clone()
        .ok_or(TransferError::NoStateTopic {
            what: "source.snapshot = \"initial\"",
        })?;
    let system_id = slot.identity.as_ref().map(|s| s.system_id.clone());
    let log = ProgressLog::new(state, key(system_id.as_deref(), &settings.source.slot));
    if !slot.exists {
        // Written before the slot exists: a crash between the two leaves a record whose slot
        // does not exist, and the next start takes the snapshot anew.
        let mut progress = Progress::start(
            TransferKind::Snapshot,
            String::new(),
            system_id.as_deref(),
            &settings.source.slot,
        );
        log.write(&progress).await?;
        let mut reader = RowReader::connect(&settings.source, &slot.endpoint).await?;
        let consistent_point = reader.create_slot_in_snapshot(&settings.source).await?;
        slot.exists = true;
        slot.created = true;
        slot.confirmed_flush_lsn = consistent_point;
        progress.id = consistent_point.to_string();
        send_all(settings, metrics, &log, &mut reader, progress, slot).await?;
        reader.finish().await?;
        return Ok(());
    }
    match log.read().await? {
        Some(progress) if !progress.done => {
            info!(
                slot = %settings.source.slot,
                consistent_point = %progress.id,
                rows_sent = progress.rows_sent,
                "the initial snapshot was interrupted: reading the outbox tables again as they are now, from the last row acknowledged, before streaming from the slot's consistent point (rows committed since may arrive twice)"
            );
            let mut reader = RowReader::connect(&settings.source, &slot.endpoint).await?;
            send_all(settings, metrics, &log, &mut reader, progress, slot).await?;
            reader.finish().await?;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Reads and sends every table of the plan from where `progress` is, and records the snapshot
/// as done.
async fn send_all(
    settings: &PipelineSettings,
    metrics: &Arc<Metrics>,
    log: &ProgressLog,
    reader: &mut RowReader,
    mut progress: Progress,
    slot: &SlotState,
) -> Result<(), TransferError> {
    let plan = &settings.snapshot;
    let mut described = Vec::new();
    let mut total = progress.rows_sent;
    for table in &plan.tables {
        if progress.finished(&table.table) {
            continue;
        }
        let outbox = reader
            .describe(&table.table, &settings.source.publication, &table.order_by)
            .await?;
        if outbox.ordered_by_uuid() {
            warn!(
                table = %table.table,
                "the initial snapshot reads this table in the order of its uuid primary key, which is not the order its rows were written: the snapshot's events of one aggregate may reach Kafka out of that order; set order_by in [source.snapshot_tables.\"{}\"] to a column in write order (a timestamp or a sequence)",
                table.table
            );
        }
        let after = progress.resume_after(&table.table);
        // Outside the snapshot (finishing an interrupted one) the rows are read up to the last
        // one there now: rows inserted later are streamed, and are not chased.
        let until = if reader.in_snapshot() {
            None
        } else {
            match reader.last_key(&outbox, table.filter.as_deref()).await? {
                Some(last) => Some(last),
                None => continue,
            }
        };
        total += reader
            .count(
                &outbox,
                table.filter.as_deref(),
                after.as_deref(),
                until.as_deref(),
            )
            .await?;
        described.push((outbox, table.filter.clone(), until));
    }
    progress.rows_total = total;
    info!(
        slot = %settings.source.slot,
        rows = total.saturating_sub(progress.rows_sent),
        in_snapshot = reader.in_snapshot(),
        "initial snapshot: sending the outbox rows before streaming"
    );
    let started = Instant::now();
    let mut sender = Sender::new(
        &settings.sink,
        settings.max_in_flight_records,
        settings.max_in_flight_bytes,
    )?;
    let position = settings
        .position_headers
        .then(|| {
            PositionHeaders::new(
                slot.identity.as_ref().map(|s| s.system_id.as_str()),
                &settings.source.slot,
            )
        })
        .map(|position| {
            let next = u32::try_from(progress.rows_sent).unwrap_or(u32::MAX);
            (position, next)
        });
    let mut copy = Copy {
        kind: TransferKind::Snapshot,
        routers: &settings.router,
        on_error: &settings.on_error,
        chunk_rows: settings.snapshot.chunk_rows,
        stamp: Stamp::Snapshot(position),
        lsn: slot.confirmed_flush_lsn,
        metrics: Arc::clone(metrics),
        log,
        started,
        sent_before: progress.rows_sent,
        last_report: (started, progress.rows_sent),
        max_rows_per_second: 0,
        writing: None,
        chunk_bytes: settings.max_in_flight_bytes,
    };
    for (outbox, filter, until) in &described {
        copy.table(
            reader,
            &mut sender,
            outbox,
            filter.as_deref(),
            until.as_deref(),
            &mut progress,
        )
        .await?;
    }
    progress.done = true;
    copy.report("*", &mut progress).await?;
    transfer::finished(TransferKind::Snapshot, progress.rows_sent, started, metrics);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> anyhow::Result<Config> {
        let text = format!(
            "[source]\nurl = \"postgres://u@h/d\"\ntables = [\"public.outbox\", \"billing.outbox\"]\n{extra}\n[kafka]\nbootstrap_servers = \"k:9092\"\n"
        );
        Config::from_table(text.parse()?)
    }

    fn tables() -> Vec<TableName> {
        ["public.outbox", "billing.outbox"]
            .iter()
            .map(|t| TableName::parse(t).expect("valid name"))
            .collect()
    }

    #[test]
    fn the_default_is_no_snapshot_and_every_row() {
        let plan = Plan::from_config(&config("").expect("valid"), &tables()).expect("a plan");
        assert!(!plan.initial);
        assert_eq!(plan.chunk_rows, DEFAULT_CHUNK_ROWS);
        assert!(plan
            .tables
            .iter()
            .all(|t| t.filter.is_none() && t.order_by.is_empty()));
    }

    #[test]
    fn a_table_s_filter_overrides_the_global_one() {
        let config = config(
            "snapshot = \"initial\"\nsnapshot_filter = \"published_at IS NULL\"\nsnapshot_chunk_rows = 50\n\
             [source.snapshot_tables.\"billing.outbox\"]\nfilter = \"NOT processed\"\norder_by = [\"created_at\"]\n",
        )
        .expect("valid");
        let plan = Plan::from_config(&config, &tables()).expect("a plan");
        assert!(plan.initial);
        assert_eq!(plan.chunk_rows, 50);
        assert_eq!(
            plan.tables[0].filter.as_deref(),
            Some("published_at IS NULL")
        );
        assert_eq!(plan.tables[1].filter.as_deref(), Some("NOT processed"));
        assert_eq!(plan.tables[1].order_by, ["created_at"]);
        // An empty per-table filter reads every row of that table.
        let config = self::config(
            "snapshot_filter = \"published_at IS NULL\"\n[source.snapshot_tables.\"public.outbox\"]\nfilter = \"\"\n",
        )
        .expect("valid");
        let plan = Plan::from_config(&config, &tables()).expect("a plan");
        assert_eq!(plan.tables[0].filter, None);
    }

    #[test]
    fn mistakes_are_named() {
        let bad_mode = config("snapshot = \"always\"").expect_err("unknown mode");
        assert!(
            format!("{bad_mode:#}").contains("`initial`"),
            "{bad_mode:#}"
        );
        let unknown = config("[source.snapshot_tables.\"public.outbox\"]\nfiltre = \"x\"\n")
            .expect_err("unknown key");
        assert!(format!("{unknown:#}").contains("filtre"), "{unknown:#}");
        let other =
            config("[source.snapshot_tables.\"public.other\"]\nfilter = \"x\"\n").expect("parses");
        let error = Plan::from_config(&other, &tables()).expect_err("not an outbox table");
        assert!(
            error.to_string().contains("not in source.tables"),
            "{error}"
        );
        let mut no_state = config("snapshot = \"initial\"").expect("parses");
        no_state.kafka.state_topic = String::new();
        let error = Plan::from_config(&no_state, &tables()).expect_err("no state topic");
        assert!(error.to_string().contains("kafka.state_topic"), "{error}");
        let zero = config("snapshot_chunk_rows = 0").expect("parses");
        assert!(Plan::from_config(&zero, &tables()).is_err());
    }
}
