//! `siphon resend`: rows still in an outbox table, sent again on demand ("replay from
//! Tuesday"), while the running Siphon keeps streaming.
//!
//! The command reads the rows of one table matching a condition (`--where`), in key order
//! (`source.snapshot_tables."<table>".order_by`, then the primary key), a chunk at a time with
//! a keyset query over a replication connection (so values print as pgoutput prints them), routes
//! each into the record streaming made of its INSERT, appends the [`RESEND_HEADER`] header (the
//! re-send's id), sends the records through a producer of its own and, once Kafka acknowledged a
//! chunk, records the last key in the state topic. Killed (even with `kill -9`), it is run again
//! with the same arguments and resumes after the last key recorded.
//!
//! This is a chunked read beside the stream rather than a watermark-interleaved read inside it
//! (DBLog, Debezium's incremental snapshots): a re-send is a repeat the consumers asked for, not
//! state the stream must reconcile, so it needs no window of the WAL to drop rows changed
//! meanwhile; and the live stream keeps its own producer, its share of the window and its slot: no live
//! event waits behind a chunk, and a failed re-send cannot hold back the slot.
//!
//! # Invariants
//! - The rows read are those matching the condition with a key up to the last such key when
//!   the re-send started (recorded with its progress): rows inserted later are the stream's,
//!   so the re-send ends.
//! - Progress names only keys whose rows Kafka acknowledged (see [`crate::transfer`]): a
//!   resumed re-send sends every row of the range at least once.
//! - A re-send of the same table with another condition does not silently replace an unfinished
//!   one: it is refused, naming both, unless `--restart` says so.
//! - Ordering: a re-sent record is appended to its partition when it is sent, after the live
//!   records already there; for one aggregate it comes after newer events (it is the older
//!   event again) and may interleave with live events written meanwhile. Consumers tell it by
//!   the header, and drop or apply it by its `id`.

use crate::pipeline::PipelineSettings;
use crate::telemetry::{Metrics, TransferKind};
use crate::transfer::{
    self, CopyPlan, ProgressLog, Stamp, TableCopy, TransferError, TransferProgress, RESEND_HEADER,
};
use bytes::Bytes;
use siphon_core::Backoff;
use siphon_source::row_condition::RowCondition;
use siphon_source::snapshot::RowReader;
use siphon_source::TableName;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// What to re-send.
#[derive(Debug, Clone)]
pub struct Request {
    pub table: TableName,
    /// The condition (`--where`); `None`: every row of the table.
    pub condition: Option<RowCondition>,
    /// The id of the signal row that asks for it (`None`: the command line): a re-send of a
    /// signal recorded as done is not run again.
    pub signal: Option<String>,
    /// Start a new re-send even if another condition's is unfinished.
    pub restart: bool,
    /// At most this many rows a second (0: as fast as Kafka acknowledges).
    pub max_rows_per_second: u64,
}

/// Why the request cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("{0} is not in source.tables: only outbox tables can be re-sent")]
    NotAnOutboxTable(TableName),
    #[error("a re-send of {table} with condition {unfinished:?} (id {id}) is unfinished: run it again with that condition to finish it, or pass --restart to start this one instead")]
    Unfinished {
        table: TableName,
        unfinished: Option<String>,
        id: String,
    },
}

/// Why `siphon resend` stopped.
#[derive(Debug, thiserror::Error)]
pub enum ResendError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Transfer(#[from] TransferError),
}

impl ResendError {
    /// What the error means for the command (retried while transient).
    pub fn consequence(&self) -> siphon_core::Consequence {
        match self {
            ResendError::Request(_) => siphon_core::Consequence::Fix,
            ResendError::Transfer(e) => e.consequence(),
        }
    }
}

impl From<siphon_source::SourceError> for ResendError {
    fn from(e: siphon_source::SourceError) -> Self {
        ResendError::Transfer(e.into())
    }
}

pub use crate::transfer::resend_key as key;

/// Runs the re-send to its end, retrying transient failures with backoff (each attempt
/// resumes from the progress recorded); returns the rows sent by this run.
pub async fn run(
    settings: &PipelineSettings,
    metrics: &Arc<Metrics>,
    request: &Request,
    max_backoff: Duration,
) -> Result<u64, ResendError> {
    if !settings.source.tables.contains(&request.table) {
        return Err(RequestError::NotAnOutboxTable(request.table.clone()).into());
    }
    let state = settings
        .state_topic
        .clone()
        .ok_or(TransferError::NoStateTopic {
            what: "siphon resend",
        })?;
    let mut backoff = Backoff::new(settings.intervals.reconnect_backoff, max_backoff);
    let mut restart = request.restart;
    loop {
        match attempt(settings, metrics, request, &state, restart).await {
            Ok(sent) => return Ok(sent),
            Err(e) if e.consequence().is_retry() => {
                let delay = backoff.next_delay(rand::random::<f64>());
                warn!(error = %e, delay_ms = delay.as_millis() as u64, "re-send interrupted; resuming from the last chunk acknowledged");
                // The new re-send was recorded (or nothing was): resume it, whatever runs.
                restart = false;
                tokio::time::sleep(delay).await;
            }
            Err(e) => {
                metrics.transfer_ended(TransferKind::Resend);
                return Err(e);
            }
        }
    }
}

/// One attempt: connects, finds where the re-send is, sends the rest.
async fn attempt(
    settings: &PipelineSettings,
    metrics: &Arc<Metrics>,
    request: &Request,
    state: &siphon_kafka_sink::StateTopic,
    restart: bool,
) -> Result<u64, ResendError> {
    let located = siphon_source::locate::locate(&settings.source.url).await?;
    let system_id = siphon_source::locate::identity(&located.client)
        .await
        .map(|s| s.system_id);
    let log = ProgressLog::new(
        state.clone(),
        key(system_id.as_deref(), &settings.source.slot, &request.table),
    );
    let mut reader = RowReader::connect(&settings.source, &located.endpoint).await?;
    let plan = settings
        .snapshot
        .tables
        .iter()
        .find(|t| t.table == request.table);
    let order_by = plan.map(|p| p.order_by.clone()).unwrap_or_default();
    let table = reader
        .describe(&request.table, &settings.source.publication, &order_by)
        .await?;
    let condition = request.condition.as_ref();
    let written = condition.map(RowCondition::text);
    let mut progress = match log.read().await? {
        Some(progress)
            if progress.done && request.signal.is_some() && progress.signal == request.signal =>
        {
            info!(id = %progress.id, table = %request.table, signal = ?request.signal, "the signal's re-send was carried out already");
            return Ok(0);
        }
        Some(progress)
            if !progress.done && !restart && progress.condition.as_deref() == written =>
        {
            info!(id = %progress.id, table = %request.table, rows_sent = progress.rows_sent, "resuming the unfinished re-send after its last acknowledged key");
            progress
        }
        Some(progress) if !progress.done && !restart => {
            return Err(RequestError::Unfinished {
                table: request.table.clone(),
                unfinished: progress.condition,
                id: progress.id,
            }
            .into())
        }
        _ => {
            let mut progress = TransferProgress::start(
                TransferKind::Resend,
                transfer::now_ms().to_string(),
                system_id.as_deref(),
                &settings.source.slot,
            );
            progress.condition = written.map(str::to_owned);
            progress.signal = request.signal.clone();
            progress.until = reader.last_key(&table, condition).await?;
            progress.rows_total = match &progress.until {
                Some(until) => reader.count(&table, condition, None, Some(until)).await?,
                None => 0,
            };
            log.write(&progress).await?;
            info!(id = %progress.id, table = %request.table, rows = progress.rows_total, "re-send started");
            progress
        }
    };
    let sent_before = progress.rows_sent;
    let until = progress.until.clone();
    let plan = CopyPlan {
        kind: TransferKind::Resend,
        stamp: Stamp::Resend(Bytes::from(progress.id.clone())),
        lsn: pgoutput::Lsn::ZERO,
        sent_before,
        max_rows_per_second: request.max_rows_per_second,
        beside_stream: request.signal.is_some(),
    };
    let mut copy = TableCopy::new(settings, plan, &log, metrics)?;
    if let Some(until) = &until {
        if !progress.finished(&request.table) {
            copy.table(&mut reader, &table, condition, Some(until), &mut progress)
                .await?;
        }
    }
    progress.done = true;
    copy.report(&request.table.to_string(), &mut progress)
        .await?;
    reader.finish().await?;
    let sent = progress.rows_sent.saturating_sub(sent_before);
    transfer::finished(
        TransferKind::Resend,
        progress.rows_sent,
        copy.started(),
        metrics,
    );
    info!(
        id = %progress.id,
        table = %request.table,
        header = RESEND_HEADER,
        rows = progress.rows_sent,
        "re-send finished"
    );
    Ok(sent)
}
