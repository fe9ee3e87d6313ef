//! Sending outbox rows read outside the stream (initial snapshots and re-sends): the rows are
//! read chunk by chunk and given to the transfer's engine
//! ([`siphon_core::engine::transfer`]), which routes each into the record streaming makes of its
//! INSERT and decides, by the stream's rules, what becomes of a row or record that cannot be
//! delivered; this module carries out what it asks (a producer of its own, the registry) and,
//! after each chunk Kafka acknowledged, writes the progress (the last key acknowledged) to the
//! state topic. Under exactly-once delivery an initial snapshot's chunks go in Kafka
//! transactions instead, each committed with the progress in the progress topic
//! ([`crate::transfer_transaction`]).
//!
//! # Invariants
//! - Memory is bounded by one chunk of rows (read with one keyset query: at most `chunk_rows`
//!   rows, and as many as fit in the window's bytes at the size of the chunk before) and the
//!   engine's window: `pipeline.max_in_flight_records` and `max_in_flight_bytes`, or the
//!   transfers' share of them beside the stream ([`PipelineSettings::transfer_window`]).
//! - Progress names only keys whose rows (and every row before them in key order) Kafka
//!   acknowledged: a chunk counts once the engine is settled. A transfer resumed from it loses
//!   no row; rows after it may be sent twice, except in Kafka transactions: there the progress
//!   is committed with the chunks' records (and their dead letters), so a read_committed
//!   consumer sees a row resumed after a crash only once.
//! - Nothing here decides what a row or a refusal becomes: a stop of the engine ends the
//!   transfer with the error naming the row's table and key, and a record not delivered for a
//!   transient reason ends it too (it resumes from the last progress written). In Kafka
//!   transactions the engine also names the commits between two rows that send a suspect
//!   record alone ([`TransferAction::Commit`]); they are carried out here once every record
//!   handed over was acknowledged, with the progress through the row it names.

use crate::pipeline::{PipelineSettings, Routers};
use crate::row_fault::RowFault;
use crate::session::core::{TransferInput, TransferSession, TransferStop};
use crate::session::recorder::Recorder;
use crate::session::transactional::{ABORT_TIMEOUT, PROGRESS_TOKEN};
use crate::telemetry::{Event, Metrics, TransferKind};
use crate::transfer_transaction::Transactional;
use pgoutput::Lsn;
use serde::{Deserialize, Serialize};
use siphon_core::engine::registry_write::{Answered, Ask, SchemaCache};
pub use siphon_core::engine::transfer::{Stamp, RESEND_HEADER};
use siphon_core::engine::transfer::{TransferAction, TransferSettings};
use siphon_kafka_sink::{Delivery, DeliveryError, KafkaSink, SinkConfig, SinkError, StateTopic};
use siphon_router::record_bytes;
use siphon_source::row_condition::RowCondition;
use siphon_source::snapshot::{OutboxTable, RowReader};
use siphon_source::TableName;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::mpsc;
use tracing::debug;

pub use crate::transfer_error::TransferError;
/// The format of [`TransferProgress`]; a record of another version is refused, not guessed at.
use crate::transfer_error::PROGRESS_VERSION as VERSION;

impl TransferError {
    /// What the error means for the process.
    pub fn consequence(&self) -> siphon_core::Consequence {
        use siphon_core::Consequence;
        match self {
            TransferError::Source(e) => e.consequence(),
            TransferError::Sink(e) if e.is_transient() => Consequence::Retry,
            TransferError::Delivery { error, .. } => match **error {
                DeliveryError::Transient(_) => Consequence::Retry,
                DeliveryError::Definite(_) => Consequence::Fix,
            },
            TransferError::State(e) => e.consequence(),
            TransferError::ReportsLost => Consequence::Bug,
            TransferError::Row { fault, .. } => fault.consequence(),
            TransferError::Aborted { .. } => Consequence::Retry,
            _ => Consequence::Fix,
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Where a transfer is, as kept in the state topic (JSON, the last record of its key wins).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferProgress {
    pub version: u32,
    /// `snapshot` or `resend`.
    pub kind: String,
    /// The re-send's id (its start time); the snapshot's consistent point.
    pub id: String,
    pub system_id: Option<String>,
    pub slot: String,
    /// Whether every row was acknowledged.
    pub done: bool,
    /// The tables finished.
    pub tables_done: Vec<String>,
    /// The table being read and the last key acknowledged in it (`None`: none yet).
    pub table: Option<String>,
    pub after: Option<Vec<String>>,
    /// The condition of a re-send (`--where`), as written.
    pub condition: Option<String>,
    /// The id of the signal row that asked for the re-send.
    #[serde(default)]
    pub signal: Option<String>,
    /// The last key a re-send reads (the last row matching when it started).
    #[serde(default)]
    pub until: Option<Vec<String>>,
    /// Rows acknowledged so far, over every run.
    pub rows_sent: u64,
    /// Rows to send, counted when it started (an estimate).
    pub rows_total: u64,
    pub started_ms: u64,
    pub updated_ms: u64,
}

impl TransferProgress {
    /// A transfer that starts now.
    pub fn start(kind: TransferKind, id: String, system_id: Option<&str>, slot: &str) -> Self {
        let now = now_ms();
        TransferProgress {
            version: VERSION,
            kind: kind.label().to_owned(),
            id,
            system_id: system_id.map(str::to_owned),
            slot: slot.to_owned(),
            done: false,
            tables_done: Vec::new(),
            table: None,
            after: None,
            condition: None,
            signal: None,
            until: None,
            rows_sent: 0,
            rows_total: 0,
            started_ms: now,
            updated_ms: now,
        }
    }

    /// Rows a second, from its start to its last update.
    pub fn rate(&self) -> f64 {
        let seconds = self.updated_ms.saturating_sub(self.started_ms) as f64 / 1000.0;
        if seconds > 0.0 {
            self.rows_sent as f64 / seconds
        } else {
            0.0
        }
    }

    /// Where reading `table` resumes: after the last key acknowledged, or from its first row.
    pub fn resume_after(&self, table: &TableName) -> Option<Vec<String>> {
        if self.table.as_deref() == Some(table.to_string().as_str()) {
            self.after.clone()
        } else {
            None
        }
    }

    /// Whether `self`, a progress committed in Kafka transactions, is of the transfer whose
    /// record in the state topic is `recorded`: a record an earlier transfer under the same key
    /// left (a snapshot of an earlier slot of the same name) started at another time.
    pub fn continues(&self, recorded: &TransferProgress) -> bool {
        self.started_ms == recorded.started_ms
    }

    /// Whether `table` was read to its end.
    pub fn finished(&self, table: &TableName) -> bool {
        self.tables_done.contains(&table.to_string())
    }
}

/// `bytes`, the progress record under `key` in `topic`, read as a [`TransferProgress`] of this
/// version.
pub fn parse_progress(
    topic: &str,
    key: &str,
    bytes: &[u8],
) -> Result<TransferProgress, TransferError> {
    let progress: TransferProgress =
        serde_json::from_slice(bytes).map_err(|source| TransferError::Unreadable {
            topic: topic.to_owned(),
            key: key.to_owned(),
            source,
        })?;
    if progress.version != VERSION {
        return Err(TransferError::Version {
            topic: topic.to_owned(),
            key: key.to_owned(),
            version: progress.version,
        });
    }
    Ok(progress)
}

/// Reads and writes [`TransferProgress`] records under one key of the state topic.
#[derive(Clone)]
pub struct ProgressLog {
    state: StateTopic,
    key: String,
}

impl ProgressLog {
    pub fn new(state: StateTopic, key: String) -> Self {
        ProgressLog { state, key }
    }

    /// The record, if there is one.
    pub async fn read(&self) -> Result<Option<TransferProgress>, TransferError> {
        let Some(bytes) = self.state.read(self.key.as_bytes()).await? else {
            return Ok(None);
        };
        parse_progress(self.state.topic(), &self.key, &bytes).map(Some)
    }

    /// Writes `progress` and waits for the broker's acknowledgement.
    pub async fn write(&self, progress: &TransferProgress) -> Result<(), TransferError> {
        let value = serde_json::to_vec(progress).map_err(|source| TransferError::Unreadable {
            topic: self.state.topic().to_owned(),
            key: self.key.clone(),
            source,
        })?;
        self.state.write(self.key.as_bytes(), &value).await?;
        Ok(())
    }
}

/// A transfer's own producer, and its delivery reports.
pub struct Sender {
    pub(crate) sink: KafkaSink,
    pub(crate) deliveries: mpsc::UnboundedReceiver<Delivery>,
}

impl Sender {
    /// A producer for `config`. Its records are counted by the `siphon_transfer_*` series
    /// only, not by the stream's per-topic counters.
    pub fn new(config: &SinkConfig) -> Result<Self, SinkError> {
        let (sink, deliveries) = KafkaSink::new(config, None)?;
        Ok(Sender { sink, deliveries })
    }

    /// The next delivery report.
    async fn next_report(&mut self) -> Result<Delivery, TransferError> {
        loop {
            tokio::select! {
                () = self.sink.reports_ready() => self.sink.serve_reports(),
                delivery = self.deliveries.recv() => {
                    return delivery.ok_or(TransferError::ReportsLost);
                }
            }
        }
    }
}

/// One table's rows after another, read chunk by chunk and sent through the transfer's
/// engine ([`TransferSession`]), which decides what becomes of each.
pub struct TableCopy<'a> {
    pub kind: TransferKind,
    routers: &'a Routers,
    session: TransferSession<'a>,
    sender: Sender,
    recorder: Recorder,
    chunk_rows: usize,
    /// The bytes of row values a chunk should hold at most.
    chunk_bytes: usize,
    metrics: Arc<Metrics>,
    /// Where progress is written after each chunk (at-least-once), and where the end of an
    /// initial snapshot is recorded.
    log: &'a ProgressLog,
    /// Exactly-once: the Kafka transaction the records go in, committed with the progress.
    transaction: Option<Transactional>,
    /// Exactly-once: the progress committed last in this run (`None`: none yet).
    committed: Option<TransferProgress>,
    /// How long a commit may take (`transaction.timeout.ms`).
    transaction_timeout: Duration,
    /// When this run started, for the rate.
    started: Instant,
    /// Rows acknowledged before this run started.
    sent_before: u64,
    /// When progress was last written (and logged), and the rows sent then.
    last_report: (Instant, u64),
    /// At most so many rows a second, row by row.
    pace: Pace,
    /// The progress write running beside the reading (`None` at first): each waits for the one
    /// before it, so they reach the state topic in order.
    writing: Option<tokio::task::JoinHandle<Result<(), TransferError>>>,
    /// The schema registry of the registry formats.
    registry: Option<crate::registry::SchemaIds>,
}

/// How a transfer runs: what it stamps, where its dead letters point, how fast it goes.
pub struct CopyPlan {
    pub kind: TransferKind,
    pub stamp: Stamp,
    /// The position dead-lettered rows name (the consistent point for a snapshot).
    pub lsn: Lsn,
    /// Rows acknowledged before this run started.
    pub sent_before: u64,
    /// At most so many rows a second (0: as fast as Kafka acknowledges).
    pub max_rows_per_second: u64,
    /// Whether it runs beside the stream (a signal row's re-send): it then takes the
    /// transfers' share of the window ([`PipelineSettings::transfer_window`]).
    pub beside_stream: bool,
}

impl<'a> TableCopy<'a> {
    /// A transfer with the pipeline's routers, `on_error`, registry and window, and a
    /// producer of its own, writing its progress to `log`.
    pub fn new(
        settings: &'a PipelineSettings,
        plan: CopyPlan,
        log: &'a ProgressLog,
        metrics: &Arc<Metrics>,
    ) -> Result<Self, TransferError> {
        let sender = Sender::new(&settings.sink)?;
        Ok(Self::with_sender(
            settings, plan, log, metrics, sender, None,
        ))
    }

    /// A transfer as [`TableCopy::new`]'s, whose records go in Kafka transactions of
    /// `sender` (registered by [`Transactional::register`]), each committed with the progress;
    /// `log` learns only that it is done.
    pub fn in_transactions(
        settings: &'a PipelineSettings,
        plan: CopyPlan,
        log: &'a ProgressLog,
        metrics: &Arc<Metrics>,
        (sender, transaction): (Sender, Transactional),
    ) -> Self {
        Self::with_sender(settings, plan, log, metrics, sender, Some(transaction))
    }

    fn with_sender(
        settings: &'a PipelineSettings,
        plan: CopyPlan,
        log: &'a ProgressLog,
        metrics: &Arc<Metrics>,
        sender: Sender,
        transaction: Option<Transactional>,
    ) -> Self {
        let started = Instant::now();
        let window = settings.transfer_window(plan.beside_stream);
        let session = TransferSession::new(TransferSettings {
            on_error: &settings.on_error,
            max_records: window.records,
            max_bytes: window.bytes,
            lsn: plan.lsn,
            stamp: plan.stamp,
            schemas: SchemaCache::new(
                settings
                    .registry
                    .as_ref()
                    .map_or(Duration::ZERO, crate::registry::SchemaIds::latest_ttl),
                settings.subject_strategy,
            ),
            in_transaction: transaction.is_some(),
            first_row: plan.sent_before,
        });
        TableCopy {
            kind: plan.kind,
            routers: &settings.router,
            session,
            sender,
            recorder: Recorder::new(Arc::clone(metrics)),
            chunk_rows: settings.snapshot.chunk_rows,
            chunk_bytes: window.bytes,
            metrics: Arc::clone(metrics),
            log,
            transaction,
            committed: None,
            transaction_timeout: settings
                .sink
                .transaction_timeout()
                .unwrap_or(siphon_kafka_sink::config::DEFAULT_TRANSACTION_TIMEOUT),
            started,
            sent_before: plan.sent_before,
            last_report: (started, plan.sent_before),
            pace: Pace::new(plan.max_rows_per_second),
            writing: None,
            registry: settings.registry.clone(),
        }
    }

    /// When this run started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Exactly-once: the transfer runs again from its last committed progress, with the
    /// records the broker refused in an earlier run of it ([`TableCopy::take_suspects`]).
    #[must_use]
    pub fn with_suspects(mut self, suspects: Suspects) -> Self {
        self.session = self.session.with_suspects(suspects);
        self
    }

    /// Exactly-once: the records the broker refused so far, by their row's index, for the
    /// next run.
    pub fn take_suspects(&mut self) -> Suspects {
        self.session.take_suspects()
    }

    /// Exactly-once: the progress committed last in this run (`None`: none yet).
    pub fn committed(&self) -> Option<&TransferProgress> {
        self.committed.as_ref()
    }
}

/// Exactly-once: the records the broker refused in a transfer's Kafka transactions, by their
/// row's index among the transfer's rows.
pub type Suspects = siphon_core::engine::suspects::Suspects<crate::record_fault::RecordFault, u64>;

/// A rate of rows handed to the producer, kept row by row (the generic cell rate algorithm):
/// each row is due one interval (`1 / rate`) after the row before was due, or after it was
/// handed if that was later. A run that fell behind (a chunk read, a wait for Kafka) never
/// catches up in a burst, and a timer that wakes late costs no rate: any second holds at most
/// `rate` rows, [`PACE_TOLERANCE`]'s worth more, and one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// Rows a second; 0: no limit.
    rate: u64,
    /// When the next row is due, in theory (`None`: no row handed yet).
    due: Option<Instant>,
}

/// How early a row may be handed: what absorbs a timer waking late.
pub const PACE_TOLERANCE: Duration = Duration::from_millis(20);

impl Pace {
    /// At most `rate` rows a second (0: as fast as Kafka acknowledges).
    pub fn new(rate: u64) -> Self {
        Pace { rate, due: None }
    }

    /// The earliest the next row may be handed.
    fn next_at(&self, now: Instant) -> Instant {
        match self.due {
            Some(due) if self.rate > 0 => due.checked_sub(PACE_TOLERANCE).unwrap_or(due),
            _ => now,
        }
    }

    /// Counts a row handed at `at`.
    fn handed(&mut self, at: Instant) {
        if self.rate == 0 {
            return;
        }
        let interval = Duration::from_secs_f64(1.0 / self.rate as f64);
        let due = self.due.map_or(at, |due| due.max(at));
        self.due = Some(due + interval);
    }

    /// Waits until the next row may be handed, and counts it. Without a rate it does nothing:
    /// no clock read or timer on a row's path.
    async fn wait(&mut self) {
        if self.rate == 0 {
            return;
        }
        let at = self.next_at(Instant::now());
        tokio::time::sleep_until(at.into()).await;
        self.handed(Instant::now());
    }
}

/// How often, at most, progress is written to the state topic and logged (each write waits for
/// the broker): a crash repeats at most this long of work.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(2);

impl TableCopy<'_> {
    /// Reads the rows of `table` matching `filter` from where `progress` says (its first row
    /// when it names another table) to key `until` (its end when `None`), sends them and
    /// records the progress after chunks (every [`PROGRESS_INTERVAL`] at most); `progress` then
    /// names the table as finished.
    pub async fn table(
        &mut self,
        reader: &mut RowReader,
        table: &OutboxTable,
        filter: Option<&RowCondition>,
        until: Option<&[String]>,
        progress: &mut TransferProgress,
    ) -> Result<(), TransferError> {
        let name = table.table.to_string();
        let mut after = progress.resume_after(&table.table);
        progress.table = Some(name.clone());
        progress.after = after.clone();
        let router = self.routers.for_table(&table.table);
        let begun = self
            .session
            .begin_table(router, Arc::clone(&table.relation), &table.not_null);
        self.recorder.notes_of_transfer(&mut self.session);
        begun.map_err(|stop| self.stopped(stop, &table.table, Vec::new()))?;
        // A chunk holds at most `chunk_bytes` of values (the rows past them are read again by the
        // next chunk). Its row count starts small and follows the size of the rows read, so
        // that few rows are read past the bytes.
        let mut limit = FIRST_CHUNK_ROWS.min(self.chunk_rows).max(1);
        loop {
            let rows = reader
                .read_chunk(
                    table,
                    filter,
                    after.as_deref(),
                    until,
                    limit,
                    self.chunk_bytes,
                )
                .await?;
            let Some(last) = rows.last().map(|r| r.key.clone()) else {
                break;
            };
            let count = rows.len() as u64;
            limit = next_limit(&rows, self.chunk_rows, self.chunk_bytes);
            debug!(table = %name, rows = count, "chunk read");
            for row in rows {
                while !self.session.can_take_row() {
                    self.settle_one(&table.table, progress).await?;
                }
                self.pace.wait().await;
                let handled = self
                    .session
                    .handle(Instant::now(), TransferInput::Row(row.tuple));
                self.carry_out(handled, &table.table, &row.key, progress)
                    .await?;
                // Counted once handed over: progress is recorded only once the engine is
                // settled (or at the commits it asks for, through a row it names).
                progress.rows_sent += 1;
                progress.after = Some(row.key);
            }
            while !self.session.is_settled() {
                self.settle_one(&table.table, progress).await?;
            }
            debug!(table = %name, rows = count, "chunk acknowledged");
            let since = self.last_report.0.elapsed();
            let due = match &self.transaction {
                Some(transaction) => transaction.due(since),
                None => since >= PROGRESS_INTERVAL,
            };
            if due {
                self.report(&name, progress).await?;
            }
            after = Some(last);
        }
        progress.tables_done.push(name);
        progress.table = None;
        progress.after = None;
        Ok(())
    }

    /// Carries out what the engine asks after `handled` (the handling of an input while the
    /// row of `table` with `key` was the last one read, `progress` the progress before it):
    /// records handed to the producer, questions put to the registry, and (exactly-once)
    /// commits between two rows.
    async fn carry_out(
        &mut self,
        mut handled: Result<(), TransferStop>,
        table: &TableName,
        key: &[String],
        progress: &TransferProgress,
    ) -> Result<(), TransferError> {
        // A commit asked for: through the row handled last, or the one before it.
        let mut commit: Option<bool> = None;
        loop {
            self.recorder.notes_of_transfer(&mut self.session);
            handled.map_err(|stop| self.stopped(stop, table, key.to_vec()))?;
            if let Some(with_last_row) = commit {
                if self.session.in_flight().0 > 0 {
                    let delivery = self.sender.next_report().await?;
                    handled = self
                        .session
                        .handle(Instant::now(), TransferInput::Delivery(delivery));
                    continue;
                }
                commit = None;
                let mut through = progress.clone();
                if with_last_row {
                    through.rows_sent += 1;
                    through.after = Some(key.to_vec());
                }
                through.updated_ms = now_ms();
                self.commit(&table.to_string(), &through).await?;
                handled = self
                    .session
                    .handle(Instant::now(), TransferInput::Committed);
                continue;
            }
            let input = match self.session.poll_action() {
                None => return Ok(()),
                Some(TransferAction::Commit { with_last_row }) => {
                    commit = Some(with_last_row);
                    handled = Ok(());
                    continue;
                }
                Some(TransferAction::Send { token, record }) => {
                    if let Some(transaction) = &mut self.transaction {
                        transaction.before_send(&self.sender.sink, record_bytes(&record))?;
                    }
                    match self.sender.sink.send(token, &record).await {
                        Ok(()) => {
                            handled = Ok(());
                            continue;
                        }
                        Err(error) => TransferInput::SendRefused {
                            token,
                            record,
                            error,
                        },
                    }
                }
                Some(TransferAction::Ask(ask)) => TransferInput::Answer(self.ask(ask).await),
            };
            handled = self.session.handle(Instant::now(), input);
        }
    }

    /// The registry's answer to `ask`.
    async fn ask(&self, ask: Ask) -> Answered<siphon_schema_registry::RegistryError> {
        let Some(ids) = &self.registry else {
            // Settings give every registry format a registry.
            return Answered::SchemaId(Err(siphon_schema_registry::RegistryError::InvalidUrl {
                url: String::new(),
                reason: "no schema registry is configured: set schema_registry.url",
            }));
        };
        match ask {
            Ask::SchemaId { subject, schema } => {
                Answered::SchemaId(ids.id(&subject, &schema).await)
            }
            Ask::LatestSchema { subject } => Answered::LatestSchema(ids.latest(&subject).await),
        }
    }

    /// Waits for one delivery report and gives it to the engine (`progress` as it is).
    async fn settle_one(
        &mut self,
        table: &TableName,
        progress: &TransferProgress,
    ) -> Result<(), TransferError> {
        let delivery = self.sender.next_report().await?;
        let handled = self
            .session
            .handle(Instant::now(), TransferInput::Delivery(delivery));
        self.carry_out(handled, table, &[], progress).await
    }

    /// The transfer's end for `stop`, while a row of `table` with `key` was the last read.
    fn stopped(
        &mut self,
        stop: TransferStop,
        table: &TableName,
        key: Vec<String>,
    ) -> TransferError {
        let table = table.clone();
        match stop {
            TransferStop::Row(error) => TransferError::Row {
                table,
                key,
                fault: RowFault::Route(Box::new(error)),
            },
            TransferStop::Unbindable(error) => TransferError::Unbindable(Box::new(error)),
            TransferStop::Registry(refusal) => TransferError::Row {
                table,
                key,
                fault: RowFault::from(refusal),
            },
            TransferStop::Refused { topic, fault } => TransferError::Refused {
                topic: topic.to_string(),
                fault: Box::new(fault),
            },
            TransferStop::DeadLetterRefused(fault) => {
                TransferError::DeadLetterRefused(Box::new(fault))
            }
            TransferStop::Aborted { topic, fault } => TransferError::Aborted {
                topic: topic.to_string(),
                fault: Box::new(fault),
            },
            TransferStop::Undelivered { topic, error } => {
                // The others in flight may still arrive; the transfer resumes from its last
                // progress, which names none of them.
                self.sender.sink.purge();
                TransferError::Delivery {
                    topic: topic.to_string(),
                    error: Box::new(error),
                }
            }
            TransferStop::NotTaken(error) => TransferError::Sink(error),
        }
    }
}

impl TableCopy<'_> {
    /// Records `progress` and logs it (rows of `table` lately).
    ///
    /// At-least-once, it is written to the state topic. The write runs beside the reading of
    /// the next chunks (a write waits for the broker), after the one before it; a `done`
    /// progress is written before this returns.
    ///
    /// In Kafka transactions, it is committed in the progress topic with the open
    /// transaction, once every record of it was acknowledged; a `done` one is then written to
    /// the state topic too.
    pub async fn report(
        &mut self,
        table: &str,
        progress: &mut TransferProgress,
    ) -> Result<(), TransferError> {
        progress.updated_ms = now_ms();
        if self.transaction.is_some() {
            self.commit(table, progress).await?;
            if progress.done {
                self.log.write(progress).await?;
            }
        } else {
            if let Some(previous) = self.writing.take() {
                previous.await.map_err(|_| TransferError::ReportsLost)??;
            }
            if progress.done {
                self.log.write(progress).await?;
            } else {
                let (log, written) = (self.log.clone(), progress.clone());
                self.writing = Some(tokio::spawn(async move { log.write(&written).await }));
            }
        }
        let elapsed = self.started.elapsed().as_secs_f64();
        let rate = if elapsed > 0.0 {
            progress.rows_sent.saturating_sub(self.sent_before) as f64 / elapsed
        } else {
            0.0
        };
        Event::TransferProgress {
            kind: self.kind,
            table: &table,
            rows: progress.rows_sent.saturating_sub(self.last_report.1),
            sent: progress.rows_sent,
            total: progress.rows_total.max(progress.rows_sent),
            rate,
        }
        .emit(&self.metrics);
        self.last_report = (Instant::now(), progress.rows_sent);
        Ok(())
    }
}

impl TableCopy<'_> {
    /// Exactly-once: writes `progress` as the last record of the open Kafka transaction (one
    /// begins if none is open) and commits it. Called only while the engine is settled, so
    /// every other record of the transaction was acknowledged.
    async fn commit(
        &mut self,
        table: &str,
        progress: &TransferProgress,
    ) -> Result<(), TransferError> {
        let Some(transaction) = &mut self.transaction else {
            return Ok(());
        };
        let record = transaction.record(progress)?;
        transaction.before_send(&self.sender.sink, record_bytes(&record))?;
        self.sender.sink.send(PROGRESS_TOKEN, &record).await?;
        // The commit starts once the progress record reported: its flush then has nothing to
        // wait for (see the session's driver).
        // The engine is settled: the one report still to come is the progress record's.
        let delivery = self.sender.next_report().await?;
        if delivery.token != PROGRESS_TOKEN {
            return Err(TransferError::ReportsLost);
        }
        if let Err(failure) = delivery.result {
            return Err(TransferError::Delivery {
                topic: failure.record.topic.to_string(),
                error: Box::new(failure.error),
            });
        }
        let timeout = self.transaction_timeout;
        let committed = self.sender.sink.commit_transaction(timeout).await;
        if let Some(transaction) = &mut self.transaction {
            transaction.ended();
        }
        committed?;
        self.committed = Some(progress.clone());
        debug!(
            table,
            rows_sent = progress.rows_sent,
            "Kafka transaction committed"
        );
        Ok(())
    }

    /// Exactly-once: aborts the open Kafka transaction of a transfer that failed (its
    /// records are never shown to read_committed consumers; the next registration would abort
    /// it too, this only ends it sooner).
    pub async fn abort(&mut self) {
        let Some(transaction) = &mut self.transaction else {
            return;
        };
        if !transaction.is_open() {
            return;
        }
        transaction.ended();
        if let Err(e) = self.sender.sink.abort_transaction(ABORT_TIMEOUT).await {
            debug!(error = %e, "the open Kafka transaction was not aborted; the next registration aborts it");
        }
    }
}

/// Rows of a table's first chunk: its rows' size sets the next chunks' count.
const FIRST_CHUNK_ROWS: usize = 16;

/// The rows of the next chunk: as many as fit in `budget` bytes at the size of `rows` (at least
/// one, at most `max_rows`).
fn next_limit(rows: &[siphon_source::snapshot::Row], max_rows: usize, budget: usize) -> usize {
    let bytes: usize = rows
        .iter()
        .flat_map(|r| &r.tuple.columns)
        .map(|c| match c {
            pgoutput::Column::Text(b) | pgoutput::Column::Binary(b) => b.len(),
            _ => 0,
        })
        .sum();
    let per_row = (bytes / rows.len().max(1)).max(1);
    (budget / per_row).clamp(1, max_rows.max(1))
}

/// The initial snapshot's and the re-sends' progress recorded in the state topic for the slot
/// of `settings` (for `siphon status`), with the server's system identifier.
pub async fn recorded(
    settings: &crate::pipeline::PipelineSettings,
) -> Result<Vec<TransferProgress>, TransferError> {
    let Some(state) = &settings.state_topic else {
        return Ok(Vec::new());
    };
    let located = siphon_source::locate::locate(&settings.source.url).await?;
    let system_id = siphon_source::locate::identity(&located.client)
        .await
        .map(|s| s.system_id);
    let slot = &settings.source.slot;
    let snapshot = snapshot_key(system_id.as_deref(), slot);
    let mut keys = vec![snapshot.clone()];
    keys.extend(
        settings
            .source
            .tables
            .iter()
            .map(|t| resend_key(system_id.as_deref(), slot, t)),
    );
    let mut found = Vec::new();
    for key in keys {
        if let Some(mut progress) = ProgressLog::new(state.clone(), key.clone()).read().await? {
            if key == snapshot && !progress.done {
                if let Some(committed) = committed_snapshot(settings, &key, &progress).await {
                    progress = committed;
                }
            }
            found.push(progress);
        }
    }
    Ok(found)
}

/// Exactly-once: the progress committed by the unfinished snapshot `recorded` (its record in
/// the state topic, under `key`), which the state topic does not follow; `None` when there is
/// none, or it cannot be read now (another source's transaction open in the progress topic).
async fn committed_snapshot(
    settings: &crate::pipeline::PipelineSettings,
    key: &str,
    recorded: &TransferProgress,
) -> Option<TransferProgress> {
    let exactly_once = settings.exactly_once.as_ref()?;
    let bytes = match exactly_once
        .progress_topic
        .read_committed(key.as_bytes())
        .await
    {
        Ok(bytes) => bytes?,
        Err(e) => {
            debug!(error = %e, "the snapshot's committed progress was not read");
            return None;
        }
    };
    parse_progress(exactly_once.progress_topic.topic(), key, &bytes)
        .ok()
        .filter(|committed| committed.continues(recorded))
}

/// One line on `progress` for `siphon status`: what, where, how far, how fast, how long still.
pub fn describe(progress: &TransferProgress) -> String {
    let what = match (
        &progress.kind[..],
        &progress.table,
        progress.tables_done.last(),
    ) {
        ("resend", Some(table), _) | ("resend", None, Some(table)) => {
            format!("resend {table} (id {})", progress.id)
        }
        (kind, _, _) => format!("{kind} (consistent point {})", progress.id),
    };
    let state = if progress.done { "done" } else { "unfinished" };
    let rate = progress.rate();
    let remaining = progress.rows_total.saturating_sub(progress.rows_sent);
    let eta = if progress.done {
        String::new()
    } else if rate > 0.0 {
        format!(", ETA {:.0} s at that rate", remaining as f64 / rate)
    } else {
        ", ETA unknown".to_owned()
    };
    let condition = progress
        .condition
        .as_deref()
        .map_or_else(String::new, |c| format!(", where {c}"));
    format!(
        "{what}: {state}, {} of {} rows sent, {rate:.0} rows/s{eta}{condition}",
        progress.rows_sent, progress.rows_total
    )
}

/// How long a transfer ran, for its last log line.
pub fn finished(kind: TransferKind, sent: u64, started: Instant, metrics: &Metrics) {
    Event::TransferFinished {
        kind,
        sent,
        elapsed: started.elapsed(),
    }
    .emit(metrics);
}

/// How long to wait before retrying a transfer that failed for now.
pub const RETRY_PAUSE: Duration = Duration::from_secs(2);

/// The state topic key of the initial snapshot of `slot` on the server with `system_id`.
pub fn snapshot_key(system_id: Option<&str>, slot: &str) -> String {
    format!("siphon/snapshot/{}/{slot}", system_id.unwrap_or("unknown"))
}

/// The state topic key of the re-sends of `table` through `slot` on server `system_id`.
pub fn resend_key(system_id: Option<&str>, slot: &str, table: &TableName) -> String {
    format!(
        "siphon/resend/{}/{slot}/{table}",
        system_id.unwrap_or("unknown")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use siphon_source::SourceError;

    #[test]
    fn progress_resumes_after_the_last_key_of_its_table_only() {
        let table = TableName::parse("public.outbox").expect("valid name");
        let other = TableName::parse("public.other").expect("valid name");
        let mut progress =
            TransferProgress::start(TransferKind::Resend, "1".into(), Some("7"), "s");
        assert_eq!(progress.resume_after(&table), None);
        progress.table = Some("public.outbox".into());
        progress.after = Some(vec!["42".into()]);
        assert_eq!(progress.resume_after(&table), Some(vec!["42".to_owned()]));
        assert_eq!(progress.resume_after(&other), None);
        progress.tables_done.push("public.other".into());
        assert!(progress.finished(&other));
        assert!(!progress.finished(&table));
        let json = serde_json::to_vec(&progress).expect("json");
        let back: TransferProgress = serde_json::from_slice(&json).expect("read back");
        assert_eq!(back, progress);
    }

    #[test]
    fn status_says_how_far_and_how_long_still() {
        let mut progress = TransferProgress::start(TransferKind::Resend, "17".into(), None, "s");
        progress.table = Some("public.outbox".into());
        progress.condition = Some("created_at >= '2026-12-01'".into());
        progress.started_ms = 0;
        progress.updated_ms = 10_000;
        progress.rows_sent = 1_000;
        progress.rows_total = 3_000;
        assert_eq!(
            describe(&progress),
            "resend public.outbox (id 17): unfinished, 1000 of 3000 rows sent, 100 rows/s, ETA 20 s at that rate, where created_at >= '2026-12-01'"
        );
        progress.done = true;
        progress.table = None;
        progress.tables_done.push("public.outbox".into());
        progress.rows_sent = 3_000;
        assert!(describe(&progress).starts_with("resend public.outbox (id 17): done, 3000 of 3000"));
    }

    #[test]
    fn only_what_a_retry_can_cure_is_retried() {
        use siphon_core::Consequence;
        let lost = TransferError::from(SourceError::from(
            siphon_source::error::Interruption::StreamEnded,
        ));
        assert_eq!(lost.consequence(), Consequence::Retry);
        let no_key = TransferError::from(SourceError::from(
            siphon_source::error::SetupProblem::SnapshotOrder {
                table: TableName::parse("outbox").expect("valid name"),
                problem: siphon_source::snapshot::OrderProblem::NoPrimaryKey,
            },
        ));
        assert_eq!(no_key.consequence(), Consequence::Fix);
        assert!(no_key.to_string().contains("primary key"), "{no_key}");
        assert_eq!(
            TransferError::NoStateTopic { what: "x" }.consequence(),
            Consequence::Fix
        );
        assert_eq!(TransferError::ReportsLost.consequence(), Consequence::Bug);
    }

    #[test]
    fn chunks_hold_as_many_rows_as_fit_in_the_budget() {
        let row = |bytes: usize| siphon_source::snapshot::Row {
            tuple: pgoutput::TupleData {
                columns: vec![
                    pgoutput::Column::Text(bytes::Bytes::from(vec![b'x'; bytes])),
                    pgoutput::Column::Null,
                ],
            },
            key: vec!["1".into()],
        };
        assert_eq!(next_limit(&[row(100), row(300)], 1000, 10_000), 50);
        assert_eq!(next_limit(&[row(10)], 1000, 1_000_000), 1000);
        assert_eq!(next_limit(&[row(5_000_000)], 1000, 1_000_000), 1);
        assert_eq!(next_limit(&[row(0)], 1000, 10), 10);
    }

    #[test]
    fn a_pace_spreads_rows_over_each_second() {
        let start = Instant::now();
        let mut pace = Pace::new(100);
        let mut handed = Vec::new();
        let mut now = start;
        for row in 0..400u64 {
            // Late timers (up to 15 ms), and a stall of 700 ms every 100 rows.
            now = now.max(pace.next_at(now)) + Duration::from_millis(row * 7 % 16);
            if row % 100 == 99 {
                now += Duration::from_millis(700);
            }
            pace.handed(now);
            handed.push(now);
        }
        for (i, first) in handed.iter().enumerate() {
            let within = handed[i..]
                .iter()
                .take_while(|t| **t < *first + Duration::from_secs(1))
                .count();
            assert!(within <= 103, "{within} rows in the second after row {i}");
        }
        // Late timers cost no rate: 100 rows take about a second, not more.
        let mut pace = Pace::new(100);
        let mut now = start;
        for row in 0..101u64 {
            now = now.max(pace.next_at(now)) + Duration::from_millis(row % 10);
            pace.handed(now);
        }
        assert!(
            now - start < Duration::from_millis(1_050),
            "{:?}",
            now - start
        );
        assert_eq!(Pace::new(0).next_at(start), start);
    }

    #[test]
    fn the_rate_is_rows_over_the_time_taken() {
        let mut progress = TransferProgress::start(TransferKind::Snapshot, "0/0".into(), None, "s");
        progress.started_ms = 1_000;
        progress.updated_ms = 3_000;
        progress.rows_sent = 500;
        assert!((progress.rate() - 250.0).abs() < f64::EPSILON);
        progress.updated_ms = 1_000;
        assert_eq!(progress.rate(), 0.0);
    }
}
