//! Sending outbox rows read outside the stream (initial snapshots and re-sends): each row is
//! routed by the table's router into the record streaming makes of its INSERT, sent through a
//! producer of its own within the in-flight window, and acknowledged chunk by chunk; after each
//! chunk the progress (the last key acknowledged) is written to the state topic.
//!
//! # Invariants
//! - Memory is bounded by one chunk of rows (read with one keyset query: at most `chunk_rows`
//!   rows, and as many as fit in `max_in_flight_bytes` at the size of the chunk before) and
//!   the in-flight window (`pipeline.max_in_flight_records` and `max_in_flight_bytes`).
//! - Progress names only keys whose rows (and every row before them in key order) Kafka
//!   acknowledged: a transfer resumed from it loses no row; rows after it may be sent twice.
//! - A record Kafka did not take ends the transfer with an error (transient: it resumes from the
//!   last progress written); nothing is skipped silently. A row the router cannot route, and a
//!   record Kafka refuses for its own sake ([`RecordFault`]), follow `pipeline.on_error` as in
//!   the stream: dead-lettered, or the transfer stops naming it.
//! - A record in a registry format goes through the core's [`RegistryWrite`], as the stream's
//!   do: the same questions to the registry, and the same rule for which refusals are
//!   dead-lettered.
//! - The records are the router's, byte for byte: the same topic, key, value and headers as
//!   the stream makes of the row's INSERT, with only the headers of [`Stamp`] appended.

use crate::dead_letter::Stage;
use crate::pipeline::{ErrorPolicy, Routers};
use crate::position::PositionHeaders;
use crate::record_fault::RecordFault;
use crate::telemetry::{Event, Metrics, TransferKind};
use bytes::Bytes;
use pgoutput::Lsn;
use serde::{Deserialize, Serialize};
use siphon_core::engine::registry_write::{
    Answered, Ask, Refusal, RegistryWrite, SchemaCache, Step,
};
use siphon_kafka_sink::{Delivery, DeliveryError, KafkaSink, SinkConfig, SinkError, StateTopic};
use siphon_record::registered::SchemaAsk;
use siphon_router::{Header, RegistryRecord, RouteError, Routed, RoutedRecord, TableBinding};
use siphon_source::row_condition::RowCondition;
use siphon_source::snapshot::{OutboxTable, RowReader};
use siphon_source::TableName;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// The header a re-sent record carries, its value the re-send's id.
pub const RESEND_HEADER: &str = "siphon.resend";

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
            TransferError::Registry { error, .. } => error.consequence(),
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

    /// Whether `table` was read to its end.
    pub fn finished(&self, table: &TableName) -> bool {
        self.tables_done.contains(&table.to_string())
    }
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
        let progress: TransferProgress =
            serde_json::from_slice(&bytes).map_err(|source| TransferError::Unreadable {
                key: self.key.clone(),
                source,
            })?;
        if progress.version != VERSION {
            return Err(TransferError::Version {
                key: self.key.clone(),
                version: progress.version,
            });
        }
        Ok(Some(progress))
    }

    /// Writes `progress` and waits for the broker's acknowledgement.
    pub async fn write(&self, progress: &TransferProgress) -> Result<(), TransferError> {
        let value = serde_json::to_vec(progress).map_err(|source| TransferError::Unreadable {
            key: self.key.clone(),
            source,
        })?;
        self.state.write(self.key.as_bytes(), &value).await?;
        Ok(())
    }
}

/// The headers appended to each record of a transfer.
pub enum Stamp {
    /// Initial snapshot: with `format.position_headers`, the position `0:<index>` (before every
    /// streamed record), counted on from the rows sent before (the index of the next row).
    Snapshot(Option<(PositionHeaders, u32)>),
    /// Re-send: [`RESEND_HEADER`] with the re-send's id.
    Resend(Bytes),
}

impl Stamp {
    fn apply(&mut self, record: &mut RoutedRecord) {
        match self {
            Stamp::Snapshot(Some((position, next))) => {
                position.stamp(Lsn::ZERO, *next, record);
                *next = next.saturating_add(1);
            }
            Stamp::Snapshot(None) => {}
            Stamp::Resend(id) => record.headers.push(Header {
                name: Arc::from(RESEND_HEADER),
                value: Some(id.clone()),
            }),
        }
    }
}

/// A producer of the transfer's own, with the in-flight window. A record Kafka refuses for its
/// own sake ([`RecordFault`]) follows `pipeline.on_error` as in the stream: with dead letters
/// its letter is sent in its place (acknowledged before the chunk counts as done); otherwise
/// the transfer stops naming it.
pub struct Sender {
    sink: KafkaSink,
    deliveries: mpsc::UnboundedReceiver<Delivery>,
    next_token: usize,
    /// Size of each record in flight, by token.
    in_flight: std::collections::HashMap<usize, usize>,
    in_flight_bytes: usize,
    max_records: usize,
    max_bytes: usize,
    on_error: ErrorPolicy,
    metrics: Arc<Metrics>,
    /// Dead letters of refused records, still to be sent.
    letters: Vec<RoutedRecord>,
}

impl Sender {
    /// A producer for `config`, with at most `max_records` records of `max_bytes` bytes in
    /// flight. Its records are counted by the `siphon_transfer_*` series only, not by the
    /// stream's per-topic counters.
    pub fn new(
        config: &SinkConfig,
        max_records: usize,
        max_bytes: usize,
        on_error: &ErrorPolicy,
        metrics: Arc<Metrics>,
    ) -> Result<Self, SinkError> {
        let (sink, deliveries) = KafkaSink::new(config, None)?;
        Ok(Sender {
            sink,
            deliveries,
            next_token: 0,
            in_flight: std::collections::HashMap::new(),
            in_flight_bytes: 0,
            max_records: max_records.max(1),
            max_bytes: max_bytes.max(1),
            on_error: on_error.clone(),
            metrics,
            letters: Vec::new(),
        })
    }

    /// Hands `record` to the producer once the window has room for it (and the dead letters
    /// of records refused meanwhile).
    pub async fn send(&mut self, record: RoutedRecord) -> Result<(), TransferError> {
        self.hand(record).await?;
        self.send_letters().await
    }

    /// Waits until every record sent (and every dead letter) was acknowledged.
    pub async fn flush(&mut self) -> Result<(), TransferError> {
        loop {
            while !self.in_flight.is_empty() {
                self.settle_one().await?;
            }
            if self.letters.is_empty() {
                return Ok(());
            }
            self.send_letters().await?;
        }
    }

    async fn send_letters(&mut self) -> Result<(), TransferError> {
        while let Some(letter) = self.letters.pop() {
            self.hand(letter).await?;
        }
        Ok(())
    }

    /// Hands one record to the producer once the window has room for it.
    async fn hand(&mut self, record: RoutedRecord) -> Result<(), TransferError> {
        let size = siphon_kafka_sink::producer::record_bytes(&record);
        while !self.in_flight.is_empty()
            && (self.in_flight.len() >= self.max_records
                || self.in_flight_bytes + size > self.max_bytes)
        {
            self.settle_one().await?;
        }
        let token = self.next_token;
        self.next_token = self.next_token.wrapping_add(1);
        match self.sink.send(token, &record).await {
            Ok(()) => {
                self.in_flight.insert(token, size);
                self.in_flight_bytes += size;
                Ok(())
            }
            Err(error) => match RecordFault::of_enqueue(error) {
                Ok(fault) => self.refused(record, fault),
                Err(error) => Err(error.into()),
            },
        }
    }

    /// Waits for one delivery report.
    async fn settle_one(&mut self) -> Result<(), TransferError> {
        let delivery = loop {
            tokio::select! {
                () = self.sink.reports_ready() => self.sink.serve_reports(),
                delivery = self.deliveries.recv() => match delivery {
                    Some(delivery) => break delivery,
                    None => return Err(TransferError::ReportsLost),
                },
            }
        };
        if let Some(size) = self.in_flight.remove(&delivery.token) {
            self.in_flight_bytes -= size;
        }
        let Err(failure) = delivery.result else {
            return Ok(());
        };
        let failure = *failure;
        match RecordFault::of_delivery(failure.error) {
            Ok(fault) => self.refused(failure.record, fault),
            Err(error) => {
                // The others in flight may still arrive; the transfer resumes from its last
                // progress, which names none of them.
                self.sink.purge();
                Err(TransferError::Delivery {
                    topic: failure.record.topic.to_string(),
                    error: Box::new(error),
                })
            }
        }
    }

    /// `record` is refused for `fault`: its dead letter is queued, or the transfer stops.
    fn refused(&mut self, record: RoutedRecord, fault: RecordFault) -> Result<(), TransferError> {
        match &self.on_error {
            ErrorPolicy::DeadLetter(dead_letters) if &*record.topic != dead_letters.topic() => {
                Event::RecordDeadLettered {
                    topic: &record.topic,
                    error: &fault,
                }
                .emit(&self.metrics);
                self.letters
                    .push(dead_letters.for_record(record, &fault, Stage::Produce, None));
                Ok(())
            }
            ErrorPolicy::DeadLetter(_) => Err(TransferError::DeadLetterRefused(Box::new(fault))),
            ErrorPolicy::Fail => Err(TransferError::Refused {
                topic: record.topic.to_string(),
                fault: Box::new(fault),
            }),
        }
    }
}

/// One table's rows, routed and sent chunk by chunk.
pub struct TableCopy<'a> {
    pub kind: TransferKind,
    pub routers: &'a Routers,
    pub on_error: &'a ErrorPolicy,
    pub chunk_rows: usize,
    pub stamp: Stamp,
    /// The position dead-lettered rows name (the consistent point for a snapshot).
    pub lsn: Lsn,
    pub metrics: Arc<Metrics>,
    /// Where progress is written after each chunk.
    pub log: &'a ProgressLog,
    /// When this run started, for the rate.
    pub started: Instant,
    /// Rows acknowledged before this run started.
    pub sent_before: u64,
    /// When progress was last written (and logged), and the rows sent then.
    pub last_report: (Instant, u64),
    /// At most so many rows a second, row by row.
    pub pace: Pace,
    /// The bytes of row values a chunk should hold at most (`pipeline.max_in_flight_bytes`).
    pub chunk_bytes: usize,
    /// The progress write running beside the reading (`None` at first): each waits for the one
    /// before it, so they reach the state topic in order.
    pub writing: Option<tokio::task::JoinHandle<Result<(), TransferError>>>,
    /// The schema registry of the registry formats, and what it answered.
    pub registry: Option<TransferRegistry>,
}

/// The registry the records of a transfer are written through: asked as the stream asks it,
/// its answers kept for the transfer.
pub struct TransferRegistry {
    ids: crate::registry::SchemaIds,
    cache: SchemaCache,
}

impl TransferRegistry {
    /// A transfer's registry, through `ids`, with nothing answered yet, for value subjects
    /// named by `strategy`.
    pub fn new(
        ids: crate::registry::SchemaIds,
        strategy: siphon_record::registered::SubjectStrategy,
    ) -> Self {
        let cache = SchemaCache::new(ids.latest_ttl(), strategy);
        TransferRegistry { ids, cache }
    }
}

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
        sender: &mut Sender,
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
        let binding = match router
            .bind_with_not_null(&table.relation, &|column| table.not_null.contains(column))
        {
            Ok(binding) => Ok(binding),
            Err(e) => match self.on_error {
                ErrorPolicy::Fail => return Err(TransferError::Unbindable(Box::new(e))),
                ErrorPolicy::DeadLetter(_) => Err(e),
            },
        };
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
                let routed = match &binding {
                    Ok(binding) => route(router, binding, &row.tuple),
                    Err(e) => Err(e.clone()),
                };
                let routed = match routed {
                    Ok(Some(Routed::Record(record))) => Ok(Some(record)),
                    Ok(Some(Routed::Registry(routed))) => match self.written(routed).await {
                        Ok(record) => Ok(Some(record)),
                        Err(refusal) => {
                            if refusal.is_misfit() {
                                self.metrics.schema_misfit();
                            }
                            if !refusal.dead_lettered(self.on_error) {
                                return Err(refusal.into_error(table.table.clone(), row.key));
                            }
                            Err(refusal)
                        }
                    },
                    Ok(Some(Routed::Skipped(_)) | None) => Ok(None),
                    Err(error) => Err(RowRefusal::Route(error)),
                };
                match routed {
                    Ok(Some(mut record)) => {
                        self.stamp.apply(&mut record);
                        self.pace.wait().await;
                        sender.send(record).await?;
                    }
                    Ok(None) => {}
                    Err(error) => match self.on_error {
                        ErrorPolicy::Fail => {
                            return Err(error.into_error(table.table.clone(), row.key));
                        }
                        ErrorPolicy::DeadLetter(dead_letters) => {
                            Event::RowDeadLettered {
                                table: &name,
                                lsn: self.lsn,
                                error: &error,
                                dead_letter_topic: dead_letters.topic(),
                            }
                            .emit(&self.metrics);
                            let record = dead_letters.for_row(
                                &table.relation,
                                &row.tuple,
                                &error,
                                self.lsn,
                                None,
                            );
                            self.pace.wait().await;
                            sender.send(record).await?;
                        }
                    },
                }
            }
            sender.flush().await?;
            debug!(table = %name, rows = count, "chunk acknowledged");
            progress.rows_sent += count;
            progress.after = Some(last.clone());
            if self.last_report.0.elapsed() >= PROGRESS_INTERVAL {
                self.report(&name, progress).await?;
            }
            after = Some(last);
        }
        progress.tables_done.push(name);
        progress.table = None;
        progress.after = None;
        Ok(())
    }
}

impl TableCopy<'_> {
    /// Writes `progress` to the state topic and logs it (rows of `table` lately). The write runs
    /// beside the reading of the next chunks (a write waits for the broker), after the one
    /// before it; a `done` progress is written before this returns.
    pub async fn report(
        &mut self,
        table: &str,
        progress: &mut TransferProgress,
    ) -> Result<(), TransferError> {
        progress.updated_ms = now_ms();
        if let Some(previous) = self.writing.take() {
            previous.await.map_err(|_| TransferError::ReportsLost)??;
        }
        if progress.done {
            self.log.write(progress).await?;
        } else {
            let (log, written) = (self.log.clone(), progress.clone());
            self.writing = Some(tokio::spawn(async move { log.write(&written).await }));
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

/// Why a row of a transfer is not sent as its record.
#[derive(Debug)]
enum RowRefusal {
    /// The router cannot route it.
    Route(RouteError),
    /// The registry refused it, or its payload does not fit the schema registered for it.
    Registry(Refusal<siphon_schema_registry::RegistryError>),
}

impl RowRefusal {
    /// Whether `on_error` sends the row to the dead-letter topic: a row the router cannot
    /// route, and a registry refusal as [`Refusal::dead_letterable`] says, as in the stream.
    fn dead_lettered(&self, on_error: &ErrorPolicy) -> bool {
        matches!(on_error, ErrorPolicy::DeadLetter(_))
            && match self {
                RowRefusal::Route(_) => true,
                RowRefusal::Registry(refusal) => refusal
                    .dead_letterable(siphon_schema_registry::RegistryError::is_schema_refusal),
            }
    }

    /// Whether the row's payload did not fit the schema registered for it.
    fn is_misfit(&self) -> bool {
        matches!(self, RowRefusal::Registry(refusal) if refusal.is_misfit())
    }

    /// The transfer's end for a row of `table` with `key` that is not dead-lettered.
    fn into_error(self, table: siphon_source::TableName, key: Vec<String>) -> TransferError {
        match self {
            RowRefusal::Route(error) => TransferError::Row {
                table,
                key,
                error: Box::new(error),
            },
            RowRefusal::Registry(Refusal::Registry { subject, error, .. }) => {
                TransferError::Registry {
                    table,
                    key,
                    subject,
                    error: Box::new(error),
                }
            }
            RowRefusal::Registry(
                Refusal::Misfit { subject, error } | Refusal::Unreadable { subject, error },
            ) => TransferError::Misfit {
                table,
                key,
                subject,
                error: Box::new(error),
            },
        }
    }
}

impl std::fmt::Display for RowRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RowRefusal::Route(error) => error.fmt(f),
            RowRefusal::Registry(refusal) => refusal.fmt(f),
        }
    }
}

impl TableCopy<'_> {
    /// The record of `routed`, written as the stream writes it: through the registry's
    /// answers ([`RegistryWrite`]).
    async fn written(&mut self, routed: RegistryRecord) -> Result<RoutedRecord, RowRefusal> {
        let Some(registry) = &mut self.registry else {
            // Settings give every registry format a registry.
            return Err(RowRefusal::Registry(Refusal::Registry {
                ask: SchemaAsk::Register,
                subject: String::new(),
                error: siphon_schema_registry::RegistryError::InvalidUrl {
                    url: String::new(),
                    reason: "no schema registry is configured: set schema_registry.url",
                },
            }));
        };
        let mut write = RegistryWrite::new(routed);
        loop {
            let (waiting, ask) = match write.advance(&registry.cache, Instant::now()) {
                Step::Ready(record) => return Ok(record),
                Step::Refused(refusal) => return Err(RowRefusal::Registry(refusal)),
                Step::Waiting(waiting, ask) => (waiting, ask),
            };
            let answer = match ask {
                Ask::SchemaId { subject, schema } => {
                    Answered::SchemaId(registry.ids.id(&subject, &schema).await)
                }
                Ask::LatestSchema { subject } => {
                    Answered::LatestSchema(registry.ids.latest(&subject).await)
                }
            };
            write = waiting
                .answered(&mut registry.cache, Instant::now(), answer)
                .map_err(RowRefusal::Registry)?;
        }
    }
}

/// What routing an inserted row gave, as the stream's INSERT of it would be routed: a record,
/// one that still needs the registry, or `None` for a row the router skips.
fn route(
    router: &siphon_router::EventRouter,
    binding: &TableBinding,
    tuple: &pgoutput::TupleData,
) -> Result<Option<Routed>, RouteError> {
    match router.route(binding, siphon_router::Change::Insert(tuple))? {
        Routed::Skipped(reason) => {
            warn!(?reason, "row skipped by the router");
            Ok(None)
        }
        routed => Ok(Some(routed)),
    }
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
    let mut keys = vec![snapshot_key(system_id.as_deref(), slot)];
    keys.extend(
        settings
            .source
            .tables
            .iter()
            .map(|t| resend_key(system_id.as_deref(), slot, t)),
    );
    let mut found = Vec::new();
    for key in keys {
        if let Some(progress) = ProgressLog::new(state.clone(), key).read().await? {
            found.push(progress);
        }
    }
    Ok(found)
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
                    pgoutput::Column::Text(Bytes::from(vec![b'x'; bytes])),
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
