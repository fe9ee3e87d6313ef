//! One pipeline session: replication stream -> router -> Kafka, acknowledgements -> watermark.
//!
//! # Invariants
//! - The only position ever confirmed to PostgreSQL is the [`AckTracker`] watermark.
//! - The stream is only read while the [`InFlightWindow`] has room, so memory is bounded by the
//!   window, not the backlog; the replication connection keeps answering keepalives meanwhile.
//! - A row is routed, skipped by a documented rule (DELETE, UPDATE, another table),
//!   dead-lettered (with `on_error = "dead-letter"`), or stops the session with an error naming
//!   the fix: never dropped silently.
//! - A dead-letter record belongs to the transaction of the row it replaces, so the watermark
//!   passes that transaction only once the dead-letter record is acknowledged.

use crate::ack::{AckTracker, TxnId};
use crate::dead_letter::{DeadLetters, Stage};
use crate::error::PipelineError;
use crate::telemetry::{
    DeliveryClock, Health, Metrics, ProducerErrorKind, ReconnectCause, SkipKind,
};
use crate::window::InFlightWindow;
use pgoutput::{Lsn, Oid, Relation, TupleData};
use siphon_kafka_sink::producer::record_bytes;
use siphon_kafka_sink::{
    BrokerProbe, Delivery, DeliveryError, DeliveryObserver, KafkaSink, SinkConfig, SinkError,
};
use siphon_router::{
    Change, EventRouter, LogLevel, Routed, RoutedRecord, SkipReason, TableBinding,
};
use siphon_source::{ReplicationStream, RowChange, SourceConfig, SourceEvent, TableName};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tracing::{debug, error, info, warn};

/// How often, and for how long at most, the brokers are asked whether they answer.
const PROBE_INTERVAL: Duration = Duration::from_secs(2);
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Keeps the readiness flag in step with whether the brokers answer (until aborted).
async fn watch_brokers(probe: BrokerProbe, health: Arc<Health>) {
    let mut interval = tokio::time::interval(PROBE_INTERVAL);
    let mut reachable: Option<bool> = None;
    loop {
        interval.tick().await;
        let now = probe.probe(PROBE_TIMEOUT).await;
        health.set_broker_reachable(now);
        // One line per change of state.
        match (reachable, now) {
            (Some(true) | None, false) => warn!("Kafka brokers unreachable; records wait in flight and reading pauses when the window is full"),
            (Some(false), true) => info!("Kafka brokers reachable again"),
            _ => {}
        }
        reachable = Some(now);
    }
}

/// How often the session logs its progress (at debug level) and checks for a stalled stream.
const TICK_INTERVAL: Duration = Duration::from_secs(5);

/// What to do with a row or record that can never be delivered as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorPolicy {
    /// Stop with an error naming the fix.
    Fail,
    /// Write it to the dead-letter topic, with the error in its headers, and go on.
    DeadLetter(DeadLetters),
}

/// Everything a session needs, built once from the configuration.
pub struct PipelineSettings {
    pub source: SourceConfig,
    pub sink: SinkConfig,
    pub router: EventRouter,
    pub on_error: ErrorPolicy,
    pub max_in_flight_records: usize,
    pub max_in_flight_bytes: usize,
    pub shutdown_timeout: Duration,
    /// A stream silent this long while the server has newer WAL is reconnected.
    pub stall_timeout: Duration,
}

/// State carried from one session to the next.
#[derive(Debug, Default)]
pub struct Carry {
    /// Everything before this position was acknowledged by Kafka (possibly not yet confirmed to
    /// the slot): the next session resumes here if it is past the slot's position.
    pub acked_through: Lsn,
}

/// Runs one session until shutdown (`Ok`) or an error.
pub async fn run_session(
    settings: &PipelineSettings,
    metrics: &Arc<Metrics>,
    carry: &mut Carry,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let slot = siphon_source::prepare(&settings.source).await?;
    let start = slot.confirmed_flush_lsn.max(carry.acked_through);
    let observer: Arc<dyn DeliveryObserver> = Arc::clone(metrics) as Arc<dyn DeliveryObserver>;
    let (sink, deliveries) = KafkaSink::new(&settings.sink, Some(observer))?;
    let sql = siphon_source::setup::connect(&settings.source.url).await?;
    let stream = ReplicationStream::start(&settings.source, start).await?;
    let probe = tokio::spawn(watch_brokers(sink.prober(), metrics.health()));
    let mut session = Session {
        probe,
        settings,
        tables: settings.source.tables.iter().cloned().collect(),
        sink,
        deliveries,
        stream,
        sql,
        tracker: AckTracker::new(start),
        window: InFlightWindow::new(settings.max_in_flight_records, settings.max_in_flight_bytes),
        bindings: HashMap::new(),
        metrics: Arc::clone(metrics),
        clock: DeliveryClock::new(),
        commit_time_us: 0,
    };
    metrics.health().set_streaming(true);
    metrics.set_confirmed_lsn(start);
    let outcome = session.run(shutdown).await;
    metrics.health().set_streaming(false);
    // Whatever happened, wait for what is in flight so the next session repeats as little as
    // possible, and remember how far Kafka has acknowledged.
    session.drain(settings.shutdown_timeout).await;
    carry.acked_through = session.tracker.watermark();
    session.clock.clear(metrics);
    session.probe.abort();
    match outcome {
        Ok(()) => {
            let reported = session.stream.finish(settings.shutdown_timeout).await?;
            info!(confirmed = %reported, "stopped; confirmed position reported to PostgreSQL");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// A table's binding, or why it cannot be bound (its rows then fail or are dead-lettered).
enum Binding {
    Bound(Box<TableBinding>),
    Unbindable(String),
}

struct Session<'a> {
    settings: &'a PipelineSettings,
    tables: HashSet<TableName>,
    sink: KafkaSink,
    deliveries: mpsc::UnboundedReceiver<Delivery>,
    stream: ReplicationStream,
    sql: tokio_postgres::Client,
    tracker: AckTracker,
    window: InFlightWindow,
    bindings: HashMap<Oid, Binding>,
    metrics: Arc<Metrics>,
    clock: DeliveryClock,
    /// Keeps the readiness flag in step with the current producer's view of the brokers.
    probe: tokio::task::JoinHandle<()>,
    /// Commit time of the open transaction (microseconds since 2000-01-01).
    commit_time_us: i64,
}

impl Session<'_> {
    async fn run(&mut self, shutdown: &mut watch::Receiver<bool>) -> Result<(), PipelineError> {
        let mut tick = tokio::time::interval(TICK_INTERVAL);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.changed() => {
                    info!("shutting down: waiting for in-flight records");
                    return Ok(());
                }
                _ = tick.tick() => self.on_tick().await?,
                Some(delivery) = self.deliveries.recv() => self.on_delivery(delivery).await?,
                event = self.stream.next(), if self.window.has_room() => match event? {
                    Some(event) => self.on_event(event).await?,
                    None => return Err(PipelineError::Transient("replication stream ended".into())),
                },
            }
        }
    }

    async fn on_tick(&mut self) -> Result<(), PipelineError> {
        debug!(
            watermark = %self.tracker.watermark(),
            pending_transactions = self.tracker.pending_transactions(),
            in_flight_records = self.window.records(),
            in_flight_bytes = self.window.bytes(),
            server_wal_end = %self.stream.server_wal_end(),
            "progress"
        );
        self.sink.release_retired();
        self.metrics
            .set_server_wal_end(self.stream.server_wal_end());
        self.metrics.set_confirmed_lsn(self.stream.reported());
        // Bounded: on a broken connection the query never answers, and the stall check below
        // must still run.
        let retained = tokio::time::timeout(
            TICK_INTERVAL,
            crate::status::retained_wal_bytes(&self.sql, &self.settings.source.slot),
        );
        if let Ok(Ok(Some(bytes))) = retained.await {
            self.metrics.set_slot_retained_wal_bytes(bytes);
        }
        // A silent stream is normal on an idle server or while the server decodes WAL with no
        // output for the slot: the server is asked whether it is a stall (only while ready to read).
        if self.window.has_room() {
            self.stream
                .check_stall(&self.sql, self.settings.stall_timeout)
                .await?;
        }
        Ok(())
    }

    async fn on_event(&mut self, event: SourceEvent) -> Result<(), PipelineError> {
        match event {
            SourceEvent::Begin {
                final_lsn,
                commit_time_us,
                ..
            } => {
                self.tracker.begin(final_lsn)?;
                self.commit_time_us = commit_time_us;
            }
            SourceEvent::Relation(relation) => self.on_relation(&relation).await?,
            SourceEvent::Change {
                relation,
                change,
                lsn,
            } => self.on_change(&relation, change, lsn).await?,
            SourceEvent::Commit { end_lsn, .. } => {
                self.metrics.transaction();
                if let Some(watermark) = self.tracker.commit(end_lsn)? {
                    self.stream.confirm(watermark);
                }
            }
            SourceEvent::Idle { wal_end } => {
                if let Some(watermark) = self.tracker.idle(wal_end) {
                    self.stream.confirm(watermark);
                }
            }
        }
        Ok(())
    }

    async fn on_relation(&mut self, relation: &Relation) -> Result<(), PipelineError> {
        let name = TableName {
            schema: relation.namespace.to_string(),
            name: relation.name.to_string(),
        };
        // A partition of an outbox table is never "another table": it is routed as its outbox
        // table, or stops the session naming the fix.
        let renamed;
        let relation = if self.tables.contains(&name) {
            relation
        } else {
            let source = &self.settings.source;
            match siphon_source::catalog::outbox_relation_for(
                &self.sql,
                relation,
                &source.tables,
                &source.publication,
            )
            .await?
            {
                Some(outbox) => {
                    renamed = outbox;
                    &renamed
                }
                None => {
                    debug!(table = %name, "table is published but not an outbox table; its changes are ignored");
                    self.bindings.remove(&relation.id);
                    return Ok(());
                }
            }
        };
        let not_null = self.not_null_columns(relation.id).await?;
        let binding = match self
            .settings
            .router
            .bind_with_not_null(relation, &|column| not_null.contains(column))
        {
            Ok(binding) => Binding::Bound(Box::new(binding)),
            Err(e) if matches!(self.settings.on_error, ErrorPolicy::DeadLetter(_)) => {
                error!(table = %name, error = %e, "outbox table cannot be routed; its rows go to the dead-letter topic");
                Binding::Unbindable(e.to_string())
            }
            Err(e) => return Err(PipelineError::Definite(e.to_string())),
        };
        self.bindings.insert(relation.id, binding);
        Ok(())
    }

    /// The table's columns declared NOT NULL (schemas written with `json-schemas` mark the
    /// others optional, as Debezium reads them from the catalog).
    async fn not_null_columns(&self, relation_id: Oid) -> Result<HashSet<String>, PipelineError> {
        let rows = self
            .sql
            .query(
                "SELECT attname::text FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped AND attnotnull",
                &[&relation_id],
            )
            .await
            .map_err(|e| PipelineError::Transient(format!("reading the outbox table's columns: {e}")))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn on_change(
        &mut self,
        relation: &Arc<Relation>,
        change: RowChange,
        lsn: Lsn,
    ) -> Result<(), PipelineError> {
        let (change, row): (Change<'_>, &TupleData) = match &change {
            RowChange::Insert(new) => (Change::Insert(new), new),
            RowChange::Update { old, new } => (
                Change::Update {
                    old: old.as_ref().map(|o| o.tuple()),
                    new,
                },
                new,
            ),
            RowChange::Delete(old) => (Change::Delete(old.tuple()), old.tuple()),
        };
        self.metrics.event_read();
        let routed = match self.bindings.get(&relation.id) {
            None => {
                self.metrics.row_skipped(SkipKind::OtherTable);
                return Ok(());
            }
            Some(Binding::Bound(binding)) => self
                .settings
                .router
                .route(binding, change)
                .map_err(|e| e.to_string()),
            Some(Binding::Unbindable(reason)) => Err(reason.clone()),
        };
        match routed {
            Ok(Routed::Record(record)) => {
                self.metrics.record_routed(&record.topic);
                let txn = self.tracker.record()?;
                self.produce(txn, record).await
            }
            Ok(Routed::Skipped(reason)) => {
                self.metrics.row_skipped(reason.into());
                log_skipped(&self.settings.router, reason, relation);
                Ok(())
            }
            Err(reason) => match &self.settings.on_error {
                ErrorPolicy::Fail => Err(PipelineError::Definite(format!(
                    "{reason} (the row at {lsn} was not delivered; fix it, or set pipeline.on_error = \"dead-letter\" to send such rows to a dead-letter topic)"
                ))),
                ErrorPolicy::DeadLetter(dead_letters) => {
                    let txn = self.tracker.record()?;
                    self.metrics.record_dead_lettered(dead_letters.topic());
                    warn!(table = %format_args!("{}.{}", relation.namespace, relation.name), %lsn, error = %reason, topic = dead_letters.topic(), "row dead-lettered");
                    let record = dead_letters.for_row(relation, row, &reason, lsn, self.tracker.commit_lsn(txn));
                    self.send(txn, record).await
                }
            },
        }
    }

    /// Sends a routed record; one the producer refuses for good is dead-lettered or fails.
    async fn produce(&mut self, txn: TxnId, record: RoutedRecord) -> Result<(), PipelineError> {
        match self.sink.send(txn.token(), &record).await {
            Ok(()) => {
                self.handed_over(txn, &record);
                Ok(())
            }
            Err(SinkError::Definite(reason)) => match &self.settings.on_error {
                ErrorPolicy::Fail => Err(PipelineError::Definite(reason)),
                ErrorPolicy::DeadLetter(dead_letters) => {
                    warn!(topic = %record.topic, error = %reason, "record dead-lettered");
                    self.metrics.record_dead_lettered(&record.topic);
                    let record = dead_letters.for_record(
                        record,
                        &reason,
                        Stage::Produce,
                        self.tracker.commit_lsn(txn),
                    );
                    self.send(txn, record).await
                }
            },
            Err(e) => Err(e.into()),
        }
    }

    /// Sends a dead-letter record: if even that is refused, nothing more can be done but stop.
    async fn send(&mut self, txn: TxnId, record: RoutedRecord) -> Result<(), PipelineError> {
        self.sink
            .send(txn.token(), &record)
            .await
            .map_err(|e| match e {
                SinkError::Definite(m) => {
                    PipelineError::Definite(format!("the dead-letter topic refused a record: {m}"))
                }
                other => other.into(),
            })?;
        self.handed_over(txn, &record);
        Ok(())
    }

    /// A record is with the producer: it holds room in the window until its delivery report.
    fn handed_over(&mut self, txn: TxnId, record: &RoutedRecord) {
        self.window.add(record_bytes(record));
        self.metrics.record_produced(&record.topic);
        self.clock
            .sent(&self.metrics, txn.token(), self.commit_time_us);
        self.metrics
            .set_in_flight(self.window.records(), self.window.bytes());
    }

    async fn on_delivery(&mut self, delivery: Delivery) -> Result<(), PipelineError> {
        self.window.release(delivery.bytes);
        self.metrics
            .set_in_flight(self.window.records(), self.window.bytes());
        let txn = TxnId::from_token(delivery.token);
        let generation = delivery.generation;
        self.clock
            .settled(&self.metrics, delivery.token, delivery.result.is_ok());
        if let Err(failure) = delivery.result {
            self.metrics.producer_error(match failure.error {
                DeliveryError::Definite(_) => ProducerErrorKind::Definite,
                DeliveryError::Transient(_) => ProducerErrorKind::Transient,
            });
            match (failure.error, &self.settings.on_error) {
                (DeliveryError::Definite(reason), ErrorPolicy::DeadLetter(dead_letters))
                    if failure.record.topic != dead_letters.topic() =>
                {
                    warn!(topic = %failure.record.topic, error = %reason, "record dead-lettered");
                    self.metrics.record_dead_lettered(&failure.record.topic);
                    let record = dead_letters.for_record(
                        failure.record,
                        &reason,
                        Stage::Produce,
                        self.tracker.commit_lsn(txn),
                    );
                    // The replacement joins the transaction before the failed record is settled.
                    self.tracker.add_to(txn)?;
                    self.send(txn, record).await?;
                }
                (DeliveryError::Transient(reason), _) => {
                    // The replication stream stays up: only the producer is replaced, once per
                    // failed producer, and every record it did not deliver is sent again on the
                    // new one, in the order the reports come (the order the records were sent).
                    if generation == self.sink.generation() {
                        warn!(error = %reason, "Kafka producer failed; replacing it and sending its unacknowledged records again");
                        self.sink.rebuild()?;
                        self.metrics.reconnect(ReconnectCause::Sink);
                        self.probe.abort();
                        self.probe =
                            tokio::spawn(watch_brokers(self.sink.prober(), self.metrics.health()));
                    }
                    let record = failure.record;
                    self.sink.send(txn.token(), &record).await?;
                    self.handed_over(txn, &record);
                    return Ok(());
                }
                (error, _) => return Err(error.into()),
            }
        }
        if let Some(watermark) = self.tracker.ack(txn)? {
            self.stream.confirm(watermark);
        }
        Ok(())
    }

    /// Waits (bounded) for every record in flight, folding the acknowledgements.
    async fn drain(&mut self, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.tracker.unacked_records() > 0 {
            match tokio::time::timeout_at(deadline, self.deliveries.recv()).await {
                Ok(Some(delivery)) => {
                    if let Err(e) = self.on_delivery(delivery).await {
                        warn!(error = %e, "record not delivered while stopping; it will be sent again");
                        break;
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    warn!(
                        unacked = self.tracker.unacked_records(),
                        "gave up waiting for in-flight records; they will be sent again"
                    );
                    break;
                }
            }
        }
        // A transaction whose Commit never arrived is replayed by the next session.
        self.tracker.abandon_open();
    }
}

/// Logs a skipped row at the level the router's options ask for.
fn log_skipped(router: &EventRouter, reason: SkipReason, relation: &Relation) {
    let table = format_args!("{}.{}", relation.namespace, relation.name);
    match (reason, router.log_level(reason)) {
        (SkipReason::Delete, _) => {}
        (SkipReason::Update, LogLevel::Error) => error!(
            %table,
            "UPDATE of an outbox row skipped: outbox rows should only be inserted (table.op.invalid.behavior = error)"
        ),
        (SkipReason::Update, LogLevel::Warn) => warn!(
            %table,
            "UPDATE of an outbox row skipped: outbox rows should only be inserted (table.op.invalid.behavior = warn)"
        ),
        (SkipReason::Update, LogLevel::Info) => info!(%table, "UPDATE of an outbox row skipped"),
    }
}
