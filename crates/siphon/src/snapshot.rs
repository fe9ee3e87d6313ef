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
//!   after the consistent point and still in the table may then arrive twice (once read, once
//!   streamed); none is lost: rows before that key were acknowledged, rows after it still in
//!   the table are read, and every change committed after the consistent point is streamed.
//! - At-least-once, the last key acknowledged is written to the state topic after chunks, so
//!   rows sent after the last write are sent again after a crash. With exactly-once delivery
//!   the chunks go in Kafka transactions of the stream's transactional producer, each committed
//!   with the progress in the progress topic ([`crate::transfer_transaction`]); an interrupted
//!   snapshot registers the producer (aborting the dead one's open transaction) before it
//!   reads that progress, so a read_committed consumer sees each row of the snapshot once. The
//!   state topic then records only that the snapshot runs (before the slot is created) and
//!   that it is done (after its last transaction committed): a start that finds it done
//!   registers no producer, and so never fences a running instance's.
//! - Exactly-once with dead letters, a run the broker's refusal of a record aborted runs again
//!   from the last committed progress, in the same `REPEATABLE READ` snapshot, with the refused
//!   records as suspects (named by their row's index, the same rows in the same order): each
//!   is sent alone once, and dead-lettered if refused alone, so the snapshot finishes.
//! - A slot that exists without a record of an unfinished snapshot (created before, or by a
//!   Siphon without `source.snapshot`) is streamed from as it is: the snapshot is taken only
//!   when Siphon creates the slot.

use crate::error::PipelineError;
use crate::pipeline::PipelineSettings;
use crate::position::PositionHeaders;
use crate::telemetry::{Metrics, TransferKind};
use crate::transfer::{
    self, CopyPlan, ProgressLog, Sender, Stamp, Suspects, TableCopy, TransferError,
    TransferProgress,
};
use crate::transfer_transaction::{resume_from, Transactional};
use siphon_source::row_condition::RowCondition;
use siphon_source::snapshot::{OutboxTable, RowReader};
use siphon_source::SlotState;
use std::sync::Arc;
use tracing::{info, warn};

pub use crate::snapshot_plan::{Plan, TablePlan, DEFAULT_CHUNK_ROWS};
pub use crate::transfer::snapshot_key as key;

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
    let snapshot_key = key(system_id.as_deref(), &settings.source.slot);
    let log = ProgressLog::new(state, snapshot_key.clone());
    if !slot.exists {
        // Written before the slot exists: a crash between the two leaves a record whose slot
        // does not exist, and the next start takes the snapshot anew.
        let mut progress = TransferProgress::start(
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
        // Exactly-once: a new consistent point, so no progress of it was committed yet.
        let transactional = match &settings.exactly_once {
            Some(exactly_once) => Some(
                Transactional::register(
                    settings,
                    exactly_once,
                    slot.identity.as_ref(),
                    snapshot_key,
                )
                .await?,
            ),
            None => None,
        };
        send_all(
            settings,
            metrics,
            &log,
            reader,
            progress,
            slot,
            transactional,
        )
        .await?;
        return Ok(());
    }
    match log.read().await? {
        Some(recorded) if !recorded.done => {
            // Exactly-once: the progress committed with the rows, read once older producers
            // are fenced and their open transaction aborted.
            let (progress, transactional) = match &settings.exactly_once {
                None => (recorded, None),
                Some(exactly_once) => {
                    let (sender, transactional) = Transactional::register(
                        settings,
                        exactly_once,
                        slot.identity.as_ref(),
                        snapshot_key,
                    )
                    .await?;
                    let committed = transactional.read().await?;
                    let progress = resume_from(recorded, committed, slot.confirmed_flush_lsn);
                    if progress.done {
                        // Committed to the end; the state topic had not learnt it yet.
                        log.write(&progress).await?;
                        return Ok(());
                    }
                    (progress, Some((sender, transactional)))
                }
            };
            info!(
                slot = %settings.source.slot,
                consistent_point = %progress.id,
                rows_sent = progress.rows_sent,
                "the initial snapshot was interrupted: reading the outbox tables again as they are now, from the last row acknowledged, before streaming from the slot's consistent point (rows committed since may arrive twice)"
            );
            let reader = RowReader::connect(&settings.source, &slot.endpoint).await?;
            send_all(
                settings,
                metrics,
                &log,
                reader,
                progress,
                slot,
                transactional,
            )
            .await
        }
        _ => Ok(()),
    }
}

/// Reads with `reader` and sends every table of the plan from where `progress` is, records the
/// snapshot as done and ends the reader; exactly-once, in the Kafka transactions of
/// `transactional`.
async fn send_all(
    settings: &PipelineSettings,
    metrics: &Arc<Metrics>,
    log: &ProgressLog,
    mut reader: RowReader,
    mut progress: TransferProgress,
    slot: &SlotState,
    transactional: Option<(Sender, Transactional)>,
) -> Result<(), PipelineError> {
    let described = describe_all(settings, &mut reader, &mut progress).await?;
    // Exactly-once: a run of the snapshot that the broker's refusal of a record aborted runs
    // again from its last committed progress, in the same snapshot of the rows, with the
    // refused records as suspects (see crate::transfer_transaction).
    let mut suspects = Suspects::new();
    let mut transactional = transactional;
    let mut first_started = None;
    loop {
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
        let plan = CopyPlan {
            kind: TransferKind::Snapshot,
            stamp: Stamp::Snapshot(position),
            lsn: slot.confirmed_flush_lsn,
            sent_before: progress.rows_sent,
            max_rows_per_second: 0,
            beside_stream: false,
        };
        let mut copy = match transactional.take() {
            None => TableCopy::new(settings, plan, log, metrics)?,
            Some(transactional) => {
                TableCopy::in_transactions(settings, plan, log, metrics, transactional)
                    .with_suspects(std::mem::take(&mut suspects))
            }
        };
        let started = *first_started.get_or_insert(copy.started());
        let run_from = progress.clone();
        let error = match copy_all(&mut copy, &mut reader, &described, &mut progress).await {
            Ok(()) => {
                transfer::finished(TransferKind::Snapshot, progress.rows_sent, started, metrics);
                reader.finish().await?;
                return Ok(());
            }
            Err(error) => error,
        };
        copy.abort().await;
        let (TransferError::Aborted { .. }, Some(exactly_once)) = (&error, &settings.exactly_once)
        else {
            return Err(error.into());
        };
        suspects = copy.take_suspects();
        progress = copy.committed().cloned().unwrap_or(run_from);
        drop(copy);
        warn!(
            error = %error,
            rows_sent = progress.rows_sent,
            "initial snapshot: sending again from the last committed progress"
        );
        // A producer of its own for the next run: the aborted one's reports are not its.
        let key = key(
            slot.identity.as_ref().map(|s| s.system_id.as_str()),
            &settings.source.slot,
        );
        transactional = Some(
            Transactional::register(settings, exactly_once, slot.identity.as_ref(), key).await?,
        );
    }
}

/// Describes the tables of the plan still to read from where `progress` is, and sets its
/// total of rows.
async fn describe_all(
    settings: &PipelineSettings,
    reader: &mut RowReader,
    progress: &mut TransferProgress,
) -> Result<Vec<Described>, TransferError> {
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
            match reader.last_key(&outbox, table.filter.as_ref()).await? {
                Some(last) => Some(last),
                None => continue,
            }
        };
        total += reader
            .count(
                &outbox,
                table.filter.as_ref(),
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
    Ok(described)
}

/// A table to read: described, with its filter and the last key to read (`None`: its end).
type Described = (OutboxTable, Option<RowCondition>, Option<Vec<String>>);

/// Sends the `described` tables from where `progress` is, and records the snapshot as done.
async fn copy_all(
    copy: &mut TableCopy<'_>,
    reader: &mut RowReader,
    described: &[Described],
    progress: &mut TransferProgress,
) -> Result<(), TransferError> {
    for (outbox, filter, until) in described {
        if progress.finished(&outbox.table) {
            continue;
        }
        copy.table(reader, outbox, filter.as_ref(), until.as_deref(), progress)
            .await?;
    }
    progress.done = true;
    copy.report("*", progress).await
}
