//! One pipeline session: replication stream -> router -> Kafka, acknowledgements -> watermark.
//!
//! # Invariants
//! - The only position ever confirmed to PostgreSQL is the [`AckTracker`] watermark.
//! - The stream is only read while the [`InFlightWindow`] has room, so memory is bounded by the
//!   window, not the backlog; the replication connection keeps answering keepalives meanwhile.
//! - A row is routed, skipped by a documented rule (DELETE, UPDATE, another table), or stops the
//!   session with an error: never dropped silently.

use crate::ack::{AckTracker, TxnId};
use crate::error::PipelineError;
use crate::window::InFlightWindow;
use pgoutput::{Lsn, Oid};
use siphon_kafka_sink::producer::record_bytes;
use siphon_kafka_sink::{Delivery, KafkaSink, SinkConfig};
use siphon_router::{Change, EventRouter, LogLevel, Routed, SkipReason, TableBinding};
use siphon_source::{ReplicationStream, RowChange, SourceConfig, SourceEvent, TableName};
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tracing::{debug, error, info, warn};

/// How often the session logs its progress (at debug level).
const PROGRESS_INTERVAL: Duration = Duration::from_secs(10);

/// Everything a session needs, built once from the configuration.
pub struct PipelineSettings {
    pub source: SourceConfig,
    pub sink: SinkConfig,
    pub router: EventRouter,
    pub max_in_flight_records: usize,
    pub max_in_flight_bytes: usize,
    pub shutdown_timeout: Duration,
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
    carry: &mut Carry,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let slot = siphon_source::prepare(&settings.source).await?;
    let start = slot.confirmed_flush_lsn.max(carry.acked_through);
    let (sink, deliveries) = KafkaSink::new(&settings.sink)?;
    let stream = ReplicationStream::start(&settings.source, start).await?;
    let mut session = Session {
        settings,
        tables: settings.source.tables.iter().cloned().collect(),
        sink,
        deliveries,
        stream,
        tracker: AckTracker::new(start),
        window: InFlightWindow::new(settings.max_in_flight_records, settings.max_in_flight_bytes),
        bindings: HashMap::new(),
    };
    let outcome = session.run(shutdown).await;
    // Whatever happened, wait for what is in flight so the next session repeats as little as
    // possible, and remember how far Kafka has acknowledged.
    session.drain(settings.shutdown_timeout).await;
    carry.acked_through = session.tracker.watermark();
    match outcome {
        Ok(()) => {
            let reported = session.stream.finish(settings.shutdown_timeout).await?;
            info!(confirmed = %reported, "stopped; confirmed position reported to PostgreSQL");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

struct Session<'a> {
    settings: &'a PipelineSettings,
    tables: HashSet<TableName>,
    sink: KafkaSink,
    deliveries: mpsc::UnboundedReceiver<Delivery>,
    stream: ReplicationStream,
    tracker: AckTracker,
    window: InFlightWindow,
    bindings: HashMap<Oid, TableBinding>,
}

impl Session<'_> {
    async fn run(&mut self, shutdown: &mut watch::Receiver<bool>) -> Result<(), PipelineError> {
        let mut progress = tokio::time::interval(PROGRESS_INTERVAL);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.changed() => {
                    info!("shutting down: waiting for in-flight records");
                    return Ok(());
                }
                _ = progress.tick() => debug!(
                    watermark = %self.tracker.watermark(),
                    pending_transactions = self.tracker.pending_transactions(),
                    in_flight_records = self.window.records(),
                    in_flight_bytes = self.window.bytes(),
                    server_wal_end = %self.stream.server_wal_end(),
                    "progress"
                ),
                Some(delivery) = self.deliveries.recv() => self.on_delivery(delivery)?,
                event = self.stream.next(), if self.window.has_room() => match event? {
                    Some(event) => self.on_event(event).await?,
                    None => return Err(PipelineError::Transient("replication stream ended".into())),
                },
            }
        }
    }

    async fn on_event(&mut self, event: SourceEvent) -> Result<(), PipelineError> {
        match event {
            SourceEvent::Begin { .. } => {
                self.tracker.begin()?;
            }
            SourceEvent::Relation(relation) => {
                let name = TableName {
                    schema: relation.namespace.to_string(),
                    name: relation.name.to_string(),
                };
                if self.tables.contains(&name) {
                    let binding = self
                        .settings
                        .router
                        .bind(&relation)
                        .map_err(|e| PipelineError::Definite(e.to_string()))?;
                    self.bindings.insert(relation.id, binding);
                } else {
                    debug!(table = %name, "table is published but not an outbox table; its changes are ignored");
                    self.bindings.remove(&relation.id);
                }
            }
            SourceEvent::Change { relation, change } => {
                let Some(binding) = self.bindings.get(&relation.id) else {
                    return Ok(());
                };
                let change = match &change {
                    RowChange::Insert(new) => Change::Insert(new),
                    RowChange::Update { old, new } => Change::Update {
                        old: old.as_ref().map(|o| o.tuple()),
                        new,
                    },
                    RowChange::Delete(old) => Change::Delete(old.tuple()),
                };
                match self.settings.router.route(binding, change) {
                    Ok(Routed::Record(record)) => {
                        let txn = self.tracker.record()?;
                        let bytes = record_bytes(&record);
                        self.sink.send(txn.token(), &record).await?;
                        self.window.add(bytes);
                    }
                    Ok(Routed::Skipped(reason)) => {
                        log_skipped(&self.settings.router, reason, &relation)
                    }
                    Err(e) => return Err(PipelineError::Definite(e.to_string())),
                }
            }
            SourceEvent::Commit { end_lsn, .. } => {
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

    fn on_delivery(&mut self, delivery: Delivery) -> Result<(), PipelineError> {
        self.window.release(delivery.bytes);
        delivery.result?;
        if let Some(watermark) = self.tracker.ack(TxnId::from_token(delivery.token))? {
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
                    if let Err(e) = self.on_delivery(delivery) {
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
fn log_skipped(router: &EventRouter, reason: SkipReason, relation: &pgoutput::Relation) {
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
