//! The Prometheus registry and the handle the pipeline moves it through.
//!
//! # Invariants
//! - Every series is registered once, in [`Metrics::new`]; series with a fixed label set
//!   (`reason`, `kind`, `cause`) exist from the start at 0, so rates and alerts never see a
//!   missing series.
//! - A `topic` label value is created at most once; after [`MAX_TOPIC_LABELS`] distinct topics,
//!   further ones are counted under [`OVERFLOW_TOPIC`], which is not a legal Kafka topic name
//!   and so cannot be mistaken for one.
//! - `siphon_replication_lag_bytes` is always `server WAL end - confirmed`, floored at 0, from
//!   the last values given to [`Metrics::set_server_wal_end`] and [`Metrics::set_confirmed_lsn`].

use super::latency_histogram::LatencyHistogram;
use super::Health;
use pgoutput::Lsn;
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rustc_hash::FxHashMap;
use siphon_kafka_sink::ProducerStage;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

/// Labels of the per-topic series.
type TopicLabels = [(&'static str, String); 1];
/// Labels of the series with one fixed-vocabulary label.
type FixedLabels = [(&'static str, &'static str); 1];
/// Labels of `siphon_kafka_latency_seconds`: the broker's node id, the stage, the quantile.
type KafkaLatencyLabels = [(&'static str, String); 3];

/// The `quantile` label values of `siphon_kafka_latency_seconds`.
const KAFKA_LATENCY_QUANTILES: [&str; 3] = ["0.5", "0.99", "1"];

/// At most this many distinct `topic` label values are created.
pub const MAX_TOPIC_LABELS: usize = 1000;

/// The `topic` label value that counts records of topics past [`MAX_TOPIC_LABELS`].
pub const OVERFLOW_TOPIC: &str = "<other>";

/// Upper bounds (seconds) of the `siphon_commit_to_ack_seconds`,
/// `siphon_commit_to_read_seconds` and `siphon_send_to_ack_seconds` buckets: 1 ms to 60 s.
pub const COMMIT_TO_ACK_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Why a row change produced no record (`siphon_rows_skipped_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipKind {
    /// A DELETE of an outbox row.
    Delete,
    /// An UPDATE of an outbox row.
    Update,
    /// A change to a published table that is not an outbox table.
    OtherTable,
    /// A non-transactional logical message of an outbox prefix, skipped by
    /// `source.non_transactional_messages = "skip"`.
    NonTransactionalMessage,
}

impl SkipKind {
    const ALL: [SkipKind; 4] = [
        SkipKind::Delete,
        SkipKind::Update,
        SkipKind::OtherTable,
        SkipKind::NonTransactionalMessage,
    ];

    fn label(self) -> &'static str {
        match self {
            SkipKind::Delete => "delete",
            SkipKind::Update => "update",
            SkipKind::OtherTable => "other_table",
            SkipKind::NonTransactionalMessage => "non_transactional_message",
        }
    }
}

impl From<siphon_router::SkipReason> for SkipKind {
    fn from(reason: siphon_router::SkipReason) -> Self {
        match reason {
            siphon_router::SkipReason::Delete => SkipKind::Delete,
            siphon_router::SkipReason::Update => SkipKind::Update,
        }
    }
}

/// How a produce or delivery failed (`siphon_producer_errors_total{kind}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProducerErrorKind {
    /// Retrying (reconnecting) can cure it.
    Transient,
    /// The record can never be delivered as it is.
    Definite,
}

impl ProducerErrorKind {
    const ALL: [ProducerErrorKind; 2] = [ProducerErrorKind::Transient, ProducerErrorKind::Definite];

    fn label(self) -> &'static str {
        match self {
            ProducerErrorKind::Transient => "transient",
            ProducerErrorKind::Definite => "definite",
        }
    }
}

/// Which side broke a session that is then reconnected (`siphon_reconnects_total{cause}`).
/// Rows read from the outbox tables outside the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferKind {
    /// The initial snapshot of a slot Siphon created (`source.snapshot = "initial"`).
    Snapshot,
    /// `siphon resend`.
    Resend,
}

impl TransferKind {
    /// The `kind` label.
    pub fn label(self) -> &'static str {
        match self {
            TransferKind::Snapshot => "snapshot",
            TransferKind::Resend => "resend",
        }
    }
}

/// The series of [`TransferKind`]s, labelled by kind.
#[derive(Debug)]
struct TransferMetrics {
    rows_sent: Family<FixedLabels, Counter>,
    remaining: Family<FixedLabels, Gauge>,
    rate: Family<FixedLabels, Gauge<f64, AtomicU64>>,
    eta: Family<FixedLabels, Gauge<f64, AtomicU64>>,
    active: Family<FixedLabels, Gauge>,
}

impl TransferMetrics {
    fn register(registry: &mut Registry) -> Self {
        let metrics = TransferMetrics {
            rows_sent: Family::default(),
            remaining: Family::default(),
            rate: Family::default(),
            eta: Family::default(),
            active: Family::default(),
        };
        registry.register(
            "siphon_transfer_rows_sent",
            "Outbox rows read outside the stream (initial snapshot, re-send) and acknowledged by Kafka, by kind",
            metrics.rows_sent.clone(),
        );
        registry.register(
            "siphon_transfer_rows_remaining",
            "Rows the running snapshot or re-send still has to send (an estimate counted when it started), by kind",
            metrics.remaining.clone(),
        );
        registry.register(
            "siphon_transfer_rows_per_second",
            "Rows acknowledged per second by the running snapshot or re-send, by kind",
            metrics.rate.clone(),
        );
        registry.register(
            "siphon_transfer_eta_seconds",
            "Seconds the running snapshot or re-send needs at its current rate (-1: unknown, 0: none running), by kind",
            metrics.eta.clone(),
        );
        registry.register(
            "siphon_transfer_active",
            "1 while an initial snapshot or a re-send runs, by kind",
            metrics.active.clone(),
        );
        metrics
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconnectCause {
    /// PostgreSQL: the replication connection or the SQL connection.
    Source,
    /// Kafka.
    Sink,
}

impl ReconnectCause {
    const ALL: [ReconnectCause; 2] = [ReconnectCause::Source, ReconnectCause::Sink];

    fn label(self) -> &'static str {
        match self {
            ReconnectCause::Source => "source",
            ReconnectCause::Sink => "sink",
        }
    }
}

/// The per-topic counters of one topic: a cheap clone (shared atomics) that a caller may keep
/// to skip the topic lookup entirely.
#[derive(Debug, Clone)]
pub struct TopicMetrics {
    routed: Counter,
    produced: Counter,
    acked: Counter,
    dead_lettered: Counter,
}

// The per-record methods are `#[inline]`: they are called from the session's crate on every
// record, and a call across the crate boundary costs more than their one atomic add.
impl TopicMetrics {
    /// A record was routed to this topic.
    #[inline]
    pub fn routed(&self) {
        self.routed.inc();
    }

    /// A record for this topic was handed to the producer.
    #[inline]
    pub fn produced(&self) {
        self.produced.inc();
    }

    /// Kafka acknowledged a record of this topic.
    #[inline]
    pub fn acked(&self) {
        self.acked.inc();
    }

    /// A record meant for this topic went to the dead-letter topic instead.
    pub fn dead_lettered(&self) {
        self.dead_lettered.inc();
    }
}

/// Every series Siphon exports. `Send + Sync`; share it as `Arc<Metrics>`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    health: Arc<Health>,
    /// Base of `oldest_unacked_since`.
    epoch: Instant,
    /// Nanoseconds from `epoch` to the hand-over of the oldest unacknowledged record, plus one;
    /// 0 when nothing is unacknowledged.
    oldest_unacked_since: AtomicU64,
    confirmed: AtomicU64,
    wal_end: AtomicU64,

    events_read: Counter,
    transactions: Counter,
    routed: Family<TopicLabels, Counter>,
    produced: Family<TopicLabels, Counter>,
    acked: Family<TopicLabels, Counter>,
    dead_lettered: Family<TopicLabels, Counter>,
    topics: RwLock<FxHashMap<String, TopicMetrics>>,
    skipped: [Counter; 4],
    producer_errors: [Counter; 2],
    reconnects: [Counter; 2],
    producer_rebuilds: Counter,
    malformed_trace_contexts: Counter,
    registry_requests: Counter,
    schema_ids_known: Counter,
    schema_ids_looked_up: Counter,
    schema_misfits: Counter,
    retired_producer_unreported: Gauge,

    in_flight_records: Gauge,
    in_flight_bytes: Gauge,
    confirmed_lsn: Gauge,
    server_wal_end_lsn: Gauge,
    replication_lag_bytes: Gauge,
    oldest_unacked_age: Gauge<f64, AtomicU64>,
    slot_retained_wal_bytes: Gauge,
    streaming: Gauge,
    broker_reachable: Gauge,

    commit_to_ack: LatencyHistogram,
    commit_to_read: LatencyHistogram,
    send_to_ack: LatencyHistogram,
    kafka_latency: Family<KafkaLatencyLabels, Gauge<f64, AtomicU64>>,
    /// The brokers `kafka_latency` has series for (the last statistics' brokers).
    kafka_latency_brokers: Mutex<BTreeSet<i32>>,
    /// Initial snapshots and re-sends (see [`TransferKind`]).
    transfer: TransferMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Saturating conversion for gauges, which hold an `i64`.
fn gauge_value(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Metrics {
    /// Registers every series, with a fresh [`Health`] (see [`Metrics::health`]).
    pub fn new() -> Self {
        Metrics::with_health(Arc::new(Health::new()))
    }

    /// Registers every series; `siphon_streaming` and `siphon_broker_reachable` report `health`.
    pub fn with_health(health: Arc<Health>) -> Self {
        let mut registry = Registry::default();

        let events_read = Counter::default();
        registry.register(
            "siphon_events_read",
            "Row changes read from the replication stream",
            events_read.clone(),
        );
        let transactions = Counter::default();
        registry.register(
            "siphon_transactions",
            "Transactions read from the replication stream (committed, with or without outbox rows)",
            transactions.clone(),
        );
        let routed = Family::<TopicLabels, Counter>::default();
        registry.register(
            "siphon_records_routed",
            "Outbox rows turned into a Kafka record, by destination topic",
            routed.clone(),
        );
        let produced = Family::<TopicLabels, Counter>::default();
        registry.register(
            "siphon_records_produced",
            "Records handed to the Kafka producer, by topic",
            produced.clone(),
        );
        let acked = Family::<TopicLabels, Counter>::default();
        registry.register(
            "siphon_records_acked",
            "Records Kafka acknowledged (written to all in-sync replicas), by topic",
            acked.clone(),
        );
        let dead_lettered = Family::<TopicLabels, Counter>::default();
        registry.register(
            "siphon_records_dead_lettered",
            "Records written to the dead-letter topic instead of their destination, by destination topic",
            dead_lettered.clone(),
        );
        let skipped_family = Family::<FixedLabels, Counter>::default();
        registry.register(
            "siphon_rows_skipped",
            "Row changes that produced no record: outbox DELETEs and UPDATEs, rows of published tables that are not outbox tables",
            skipped_family.clone(),
        );
        let skipped = SkipKind::ALL.map(|k| fixed(&skipped_family, "reason", k.label()));
        let errors_family = Family::<FixedLabels, Counter>::default();
        registry.register(
            "siphon_producer_errors",
            "Records Kafka did not accept: transient (retried by reconnecting) or definite (the record can never be delivered as it is)",
            errors_family.clone(),
        );
        let producer_errors =
            ProducerErrorKind::ALL.map(|k| fixed(&errors_family, "kind", k.label()));
        let reconnects_family = Family::<FixedLabels, Counter>::default();
        registry.register(
            "siphon_reconnects",
            "Sessions ended by a transient error and reconnected, by the side that failed",
            reconnects_family.clone(),
        );
        let reconnects = ReconnectCause::ALL.map(|c| fixed(&reconnects_family, "cause", c.label()));
        let malformed_trace_contexts = Counter::default();
        registry.register(
            "siphon_trace_context_malformed",
            "Records whose trace context column held a value that is not a W3C traceparent (left out of the record)",
            malformed_trace_contexts.clone(),
        );
        let registry_requests = Counter::default();
        registry.register(
            "siphon_schema_registry_requests",
            "HTTP requests sent to the schema registry, retries included",
            registry_requests.clone(),
        );
        let schema_ids_known = Counter::default();
        registry.register(
            "siphon_schema_ids_known",
            "Registry-format records, streamed or transferred, whose schema id was known already (no request)",
            schema_ids_known.clone(),
        );
        let schema_ids_looked_up = Counter::default();
        registry.register(
            "siphon_schema_ids_looked_up",
            "Registry-format records, streamed or transferred, whose schema id had to be looked up (reading waited)",
            schema_ids_looked_up.clone(),
        );
        let schema_misfits = Counter::default();
        registry.register(
            "siphon_schema_misfits",
            "Payloads that did not fit the schema registered for them (dead-lettered, or Siphon stopped)",
            schema_misfits.clone(),
        );
        let producer_rebuilds = Counter::default();
        registry.register(
            "siphon_producer_rebuilds",
            "Kafka producers replaced by a new one after a producer failure (the replication stream stays up)",
            producer_rebuilds.clone(),
        );
        let retired_producer_unreported = Gauge::default();
        registry.register(
            "siphon_retired_producer_unreported_records",
            "Records of the replaced (retired) Kafka producer whose delivery report has not arrived yet; 0 when none waits",
            retired_producer_unreported.clone(),
        );

        let in_flight_records = Gauge::default();
        registry.register(
            "siphon_in_flight_records",
            "Records handed to Kafka and not yet acknowledged",
            in_flight_records.clone(),
        );
        let in_flight_bytes = Gauge::default();
        registry.register(
            "siphon_in_flight_bytes",
            "Key, value and header bytes of the records in flight",
            in_flight_bytes.clone(),
        );
        let confirmed_lsn = Gauge::default();
        registry.register(
            "siphon_confirmed_lsn",
            "Last WAL position confirmed to PostgreSQL as delivered, as a byte offset",
            confirmed_lsn.clone(),
        );
        let server_wal_end_lsn = Gauge::default();
        registry.register(
            "siphon_server_wal_end_lsn",
            "Server WAL end last reported on the replication connection, as a byte offset",
            server_wal_end_lsn.clone(),
        );
        let replication_lag_bytes = Gauge::default();
        registry.register(
            "siphon_replication_lag_bytes",
            "Server WAL end minus the position confirmed to the slot: WAL the slot keeps for Siphon. A transaction's records may still wait for Kafka when its commit is inside the confirmed part; siphon_oldest_unacked_event_age_seconds tells records waiting",
            replication_lag_bytes.clone(),
        );
        let oldest_unacked_age = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "siphon_oldest_unacked_event_age_seconds",
            "Seconds since the oldest record still waiting for a Kafka acknowledgement was handed to the producer, 0 when none",
            oldest_unacked_age.clone(),
        );
        let slot_retained_wal_bytes = Gauge::default();
        registry.register(
            "siphon_slot_retained_wal_bytes",
            "WAL the replication slot keeps on the server (current WAL position minus restart_lsn), sampled",
            slot_retained_wal_bytes.clone(),
        );
        let streaming = Gauge::default();
        registry.register(
            "siphon_streaming",
            "1 while the replication stream is open and being read, else 0",
            streaming.clone(),
        );
        let broker_reachable = Gauge::default();
        registry.register(
            "siphon_broker_reachable",
            "1 while the Kafka cluster is reachable, else 0",
            broker_reachable.clone(),
        );
        let up = Gauge::<i64>::default();
        up.set(1);
        registry.register("siphon_up", "Always 1 while the process runs", up);

        let commit_to_ack = LatencyHistogram::new(&COMMIT_TO_ACK_BUCKETS);
        registry.register(
            "siphon_commit_to_ack_seconds",
            "Seconds from a transaction's commit in PostgreSQL to Kafka's acknowledgement of each of its records",
            commit_to_ack.clone(),
        );
        let commit_to_read = LatencyHistogram::new(&COMMIT_TO_ACK_BUCKETS);
        registry.register(
            "siphon_commit_to_read_seconds",
            "Seconds from a transaction's commit in PostgreSQL until Siphon reads its BEGIN from the replication stream (the commit's WAL flush, the server's decoding and sending, and Siphon's read-ahead), once per transaction",
            commit_to_read.clone(),
        );
        let send_to_ack = LatencyHistogram::new(&COMMIT_TO_ACK_BUCKETS);
        registry.register(
            "siphon_send_to_ack_seconds",
            "Seconds from a record first handed to the Kafka producer to Siphon taking its acknowledgement (the producer's batching and queues, the broker's round trip)",
            send_to_ack.clone(),
        );
        let kafka_latency = Family::<KafkaLatencyLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "siphon_kafka_latency_seconds",
            "The Kafka producer's own latencies per broker over its last statistics interval with requests (kafka.properties.\"statistics.interval.ms\", 10 s): stage partition_queue (a record waiting in its partition's queue for a produce request), request_queue (the request waiting for the socket), round_trip (the request to the broker and its answer); quantile 0.5, 0.99 and 1 (the largest)",
            kafka_latency.clone(),
        );

        let transfer = TransferMetrics::register(&mut registry);

        Metrics {
            registry,
            health,
            epoch: Instant::now(),
            oldest_unacked_since: AtomicU64::new(0),
            confirmed: AtomicU64::new(0),
            wal_end: AtomicU64::new(0),
            events_read,
            transactions,
            routed,
            produced,
            acked,
            dead_lettered,
            topics: RwLock::new(FxHashMap::default()),
            skipped,
            producer_errors,
            reconnects,
            producer_rebuilds,
            malformed_trace_contexts,
            registry_requests,
            schema_ids_known,
            schema_ids_looked_up,
            schema_misfits,
            retired_producer_unreported,
            in_flight_records,
            in_flight_bytes,
            confirmed_lsn,
            server_wal_end_lsn,
            replication_lag_bytes,
            oldest_unacked_age,
            slot_retained_wal_bytes,
            streaming,
            broker_reachable,
            commit_to_ack,
            commit_to_read,
            send_to_ack,
            kafka_latency,
            kafka_latency_brokers: Mutex::new(BTreeSet::new()),
            transfer,
        }
    }

    /// The readiness flags reported by `siphon_streaming` and `siphon_broker_reachable`; pass
    /// this same `Health` to [`serve`](super::serve).
    pub fn health(&self) -> Arc<Health> {
        Arc::clone(&self.health)
    }

    /// The counters of `topic`, created on first use. Keep the handle to skip the lookup.
    pub fn topic(&self, topic: &str) -> TopicMetrics {
        self.with_topic(topic, TopicMetrics::clone)
    }

    fn with_topic<R>(&self, topic: &str, f: impl FnOnce(&TopicMetrics) -> R) -> R {
        {
            let topics = self.topics.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(t) = topics.get(topic) {
                return f(t);
            }
        }
        let mut topics = self.topics.write().unwrap_or_else(PoisonError::into_inner);
        if !topics.contains_key(topic) && topics.len() >= MAX_TOPIC_LABELS {
            if let Some(t) = topics.get(OVERFLOW_TOPIC) {
                return f(t);
            }
            let t = self.new_topic(OVERFLOW_TOPIC);
            return f(topics.entry(OVERFLOW_TOPIC.to_owned()).or_insert(t));
        }
        let t = match topics.get(topic) {
            Some(t) => t,
            None => {
                let t = self.new_topic(topic);
                topics.entry(topic.to_owned()).or_insert(t)
            }
        };
        f(t)
    }

    fn new_topic(&self, topic: &str) -> TopicMetrics {
        let labels = [("topic", topic.to_owned())];
        TopicMetrics {
            routed: self.routed.get_or_create_owned(&labels),
            produced: self.produced.get_or_create_owned(&labels),
            acked: self.acked.get_or_create_owned(&labels),
            dead_lettered: self.dead_lettered.get_or_create_owned(&labels),
        }
    }

    /// A row change was read from the replication stream (before any routing or skipping).
    #[inline]
    pub fn event_read(&self) {
        self.events_read.inc();
    }

    /// A transaction's Commit was read.
    #[inline]
    pub fn transaction(&self) {
        self.transactions.inc();
    }

    /// A record was routed to `topic`.
    pub fn record_routed(&self, topic: &str) {
        self.with_topic(topic, TopicMetrics::routed);
    }

    /// A record for `topic` was handed to the producer.
    pub fn record_produced(&self, topic: &str) {
        self.with_topic(topic, TopicMetrics::produced);
    }

    /// Kafka acknowledged a record of `topic`.
    pub fn record_acked(&self, topic: &str) {
        self.with_topic(topic, TopicMetrics::acked);
    }

    /// A record meant for `topic` was sent to the dead-letter topic instead.
    pub fn record_dead_lettered(&self, topic: &str) {
        self.with_topic(topic, TopicMetrics::dead_lettered);
    }

    /// A row change produced no record.
    pub fn row_skipped(&self, reason: SkipKind) {
        let i = match reason {
            SkipKind::Delete => 0,
            SkipKind::Update => 1,
            SkipKind::OtherTable => 2,
            SkipKind::NonTransactionalMessage => 3,
        };
        self.skipped[i].inc();
    }

    /// The producer refused a record or reported a failed delivery.
    pub fn producer_error(&self, kind: ProducerErrorKind) {
        let i = match kind {
            ProducerErrorKind::Transient => 0,
            ProducerErrorKind::Definite => 1,
        };
        self.producer_errors[i].inc();
    }

    /// A session ended by a transient error is being reconnected.
    pub fn reconnect(&self, cause: ReconnectCause) {
        let i = match cause {
            ReconnectCause::Source => 0,
            ReconnectCause::Sink => 1,
        };
        self.reconnects[i].inc();
    }

    /// A snapshot or re-send made progress: `rows` more rows acknowledged, `remaining` rows
    /// left (an estimate), at `rate` rows a second, done in `eta` (unknown: `None`).
    pub fn transfer_progress(
        &self,
        kind: TransferKind,
        rows: u64,
        remaining: u64,
        rate: f64,
        eta: Option<Duration>,
    ) {
        let labels = [("kind", kind.label())];
        self.transfer.rows_sent.get_or_create(&labels).inc_by(rows);
        self.transfer
            .remaining
            .get_or_create(&labels)
            .set(i64::try_from(remaining).unwrap_or(i64::MAX));
        self.transfer.rate.get_or_create(&labels).set(rate);
        self.transfer
            .eta
            .get_or_create(&labels)
            .set(eta.map_or(-1.0, |d| d.as_secs_f64()));
        self.transfer.active.get_or_create(&labels).set(1);
    }

    /// A snapshot or re-send finished (or stopped): `siphon_transfer_active` is 0 again.
    pub fn transfer_ended(&self, kind: TransferKind) {
        let labels = [("kind", kind.label())];
        self.transfer.active.get_or_create(&labels).set(0);
        self.transfer.eta.get_or_create(&labels).set(0.0);
        self.transfer.rate.get_or_create(&labels).set(0.0);
    }

    /// The Kafka producer was replaced by a new one (its unreported records are sent again).
    pub fn producer_rebuilt(&self) {
        self.producer_rebuilds.inc();
    }

    /// The router has left out `total` malformed trace contexts so far (a running total; the
    /// counter moves by the difference).
    pub fn set_malformed_trace_contexts(&self, total: u64) {
        let seen = self.malformed_trace_contexts.get();
        if total > seen {
            self.malformed_trace_contexts.inc_by(total - seen);
        }
    }

    /// The schema registry client has sent `total` requests since the process started.
    pub fn set_registry_requests(&self, total: u64) {
        let seen = self.registry_requests.get();
        if total > seen {
            self.registry_requests.inc_by(total - seen);
        }
    }

    /// A payload that did not fit the schema registered for it.
    pub fn schema_misfit(&self) {
        self.schema_misfits.inc();
    }

    /// A registry-format record's schema id: known already (`true`) or looked up.
    #[inline]
    pub fn schema_id(&self, known: bool) {
        if known {
            self.schema_ids_known.inc();
        } else {
            self.schema_ids_looked_up.inc();
        }
    }

    /// The retired producer has `records` records whose delivery report has not arrived (0
    /// when no retired producer waits).
    pub fn set_retired_producer_unreported(&self, records: usize) {
        self.retired_producer_unreported
            .set(i64::try_from(records).unwrap_or(i64::MAX));
    }

    /// The in-flight window now holds `records` records of `bytes` bytes.
    #[inline]
    pub fn set_in_flight(&self, records: usize, bytes: usize) {
        self.in_flight_records
            .set(i64::try_from(records).unwrap_or(i64::MAX));
        self.in_flight_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// `lsn` was reported to PostgreSQL as flushed.
    pub fn set_confirmed_lsn(&self, lsn: Lsn) {
        self.confirmed.store(lsn.0, Ordering::Relaxed);
        self.confirmed_lsn.set(gauge_value(lsn.0));
        self.update_lag();
    }

    /// The server reported its WAL end (keepalive or data message).
    pub fn set_server_wal_end(&self, lsn: Lsn) {
        self.wal_end.store(lsn.0, Ordering::Relaxed);
        self.server_wal_end_lsn.set(gauge_value(lsn.0));
        self.update_lag();
    }

    fn update_lag(&self) {
        let wal_end = self.wal_end.load(Ordering::Relaxed);
        let confirmed = self.confirmed.load(Ordering::Relaxed);
        self.replication_lag_bytes
            .set(gauge_value(wal_end.saturating_sub(confirmed)));
    }

    /// The slot retains `bytes` bytes of WAL (see `status::retained_wal_bytes`).
    pub fn set_slot_retained_wal_bytes(&self, bytes: u64) {
        self.slot_retained_wal_bytes.set(gauge_value(bytes));
    }

    /// One record's latency from its transaction's commit to Kafka's acknowledgement.
    #[inline]
    pub fn observe_commit_to_ack(&self, latency: Duration) {
        self.commit_to_ack.observe(latency);
    }

    /// One transaction's latency from its commit to Siphon reading its BEGIN: the part of
    /// [`Metrics::observe_commit_to_ack`]'s latency spent before Siphon has the transaction.
    #[inline]
    pub fn observe_commit_to_read(&self, latency: Duration) {
        self.commit_to_read.observe(latency);
    }

    /// One record's latency from its first hand-over to the producer to its acknowledgement:
    /// the part of [`Metrics::observe_commit_to_ack`]'s latency spent in the producer and the
    /// broker.
    #[inline]
    pub fn observe_send_to_ack(&self, latency: Duration) {
        self.send_to_ack.observe(latency);
    }

    /// When the oldest record still waiting for an acknowledgement was handed to the producer;
    /// `None` when every record is acknowledged. The session keeps this up to date.
    pub fn set_oldest_unacked_since(&self, since: Option<Instant>) {
        let value = match since {
            None => 0,
            Some(at) => {
                let nanos = at.saturating_duration_since(self.epoch).as_nanos();
                u64::try_from(nanos)
                    .unwrap_or(u64::MAX - 1)
                    .saturating_add(1)
            }
        };
        self.oldest_unacked_since.store(value, Ordering::Relaxed);
    }

    /// Age of the oldest unacknowledged record at `now` (zero when none).
    pub(super) fn oldest_unacked_age(&self, now: Instant) -> Duration {
        match self.oldest_unacked_since.load(Ordering::Relaxed) {
            0 => Duration::ZERO,
            v => {
                let since = self.epoch + Duration::from_nanos(v - 1);
                now.saturating_duration_since(since)
            }
        }
    }

    /// The producer's latencies per broker (see [`siphon_kafka_sink::statistics`]). A stage
    /// without samples keeps its last figures; a broker missing from the statistics (it left
    /// the cluster) loses its series.
    pub fn set_kafka_latencies(&self, brokers: &[siphon_kafka_sink::BrokerLatencies]) {
        let labels = |node_id: i32, stage: ProducerStage, quantile: &str| {
            [
                ("broker", node_id.to_string()),
                ("stage", stage.label().to_owned()),
                ("quantile", quantile.to_owned()),
            ]
        };
        for broker in brokers {
            for stage in &broker.stages {
                let values = [stage.p50, stage.p99, stage.max];
                for (quantile, value) in KAFKA_LATENCY_QUANTILES.into_iter().zip(values) {
                    self.kafka_latency
                        .get_or_create(&labels(broker.node_id, stage.stage, quantile))
                        .set(value.as_secs_f64());
                }
            }
        }
        let current: BTreeSet<i32> = brokers.iter().map(|b| b.node_id).collect();
        // A poisoned lock only means a panic elsewhere; the set is replaced whole below.
        let mut known = self
            .kafka_latency_brokers
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for &departed in known.difference(&current) {
            for stage in ProducerStage::ALL {
                for quantile in KAFKA_LATENCY_QUANTILES {
                    self.kafka_latency
                        .remove(&labels(departed, stage, quantile));
                }
            }
        }
        *known = current;
    }

    /// Every series in the Prometheus text exposition format (version 0.0.4), with `# HELP`
    /// and `# TYPE` lines.
    pub fn encode(&self) -> String {
        self.streaming.set(i64::from(self.health.is_streaming()));
        self.broker_reachable
            .set(i64::from(self.health.is_broker_reachable()));
        self.oldest_unacked_age
            .set(self.oldest_unacked_age(Instant::now()).as_secs_f64());
        let mut out = String::with_capacity(8 * 1024);
        // Writing to a String cannot fail; an error could only come from a metric's own
        // encoding, and then the text written so far is still the best answer.
        if prometheus_text::encode(&mut out, &self.registry).is_err() {
            tracing::warn!("encoding the metrics failed; the exposition is incomplete");
        }
        out
    }
}

/// The Kafka sink counts acknowledgements and reports broker latencies into these metrics.
impl siphon_kafka_sink::DeliveryObserver for Metrics {
    fn acked_counter(&self, topic: &str) -> siphon_kafka_sink::AckCounter {
        let topic = self.topic(topic);
        Box::new(move || topic.acked())
    }

    fn broker_latencies(&self, brokers: &[siphon_kafka_sink::BrokerLatencies]) {
        super::Event::KafkaLatencies { brokers }.emit(self);
    }
}

/// The series of `family` with `key="value"`, created now so it is exported from the start.
fn fixed(family: &Family<FixedLabels, Counter>, key: &'static str, value: &'static str) -> Counter {
    family.get_or_create_owned(&[(key, value)])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the series named exactly `series` (name plus labels) in `text`.
    fn value(text: &str, series: &str) -> f64 {
        let line = text
            .lines()
            .find(|l| {
                l.strip_prefix(series)
                    .is_some_and(|rest| rest.starts_with(' '))
            })
            .unwrap_or_else(|| panic!("no series {series} in\n{text}"));
        line[series.len() + 1..].parse().unwrap()
    }

    #[test]
    fn kafka_latencies_have_a_series_per_broker_stage_and_quantile() {
        use siphon_kafka_sink::{BrokerLatencies, ProducerStage, StageLatency};
        let m = Metrics::new();
        let ms = Duration::from_millis;
        let stage = |stage, p50, p99, max| StageLatency {
            stage,
            samples: 7,
            p50: ms(p50),
            p99: ms(p99),
            max: ms(max),
        };
        m.set_kafka_latencies(&[BrokerLatencies {
            node_id: 2,
            stages: vec![
                stage(ProducerStage::PartitionQueue, 1, 3, 4),
                stage(ProducerStage::RoundTrip, 2, 18, 40),
            ],
        }]);
        let t = m.encode();
        let series = |stage: &str, quantile: &str| {
            value(
                &t,
                &format!("siphon_kafka_latency_seconds{{broker=\"2\",stage=\"{stage}\",quantile=\"{quantile}\"}}"),
            )
        };
        assert_eq!(series("partition_queue", "0.5"), 0.001);
        assert_eq!(series("partition_queue", "1"), 0.004);
        assert_eq!(series("round_trip", "0.99"), 0.018);
        assert!(
            !t.contains("stage=\"request_queue\""),
            "a stage without samples has no series"
        );
        // A later interval moves the same series.
        m.set_kafka_latencies(&[BrokerLatencies {
            node_id: 2,
            stages: vec![stage(ProducerStage::RoundTrip, 1, 5, 9)],
        }]);
        let t = m.encode();
        assert_eq!(
            value(
                &t,
                "siphon_kafka_latency_seconds{broker=\"2\",stage=\"round_trip\",quantile=\"0.99\"}"
            ),
            0.005
        );
        // Broker 2 left the cluster: its series go, broker 3's come.
        m.set_kafka_latencies(&[BrokerLatencies {
            node_id: 3,
            stages: vec![stage(ProducerStage::RoundTrip, 1, 2, 3)],
        }]);
        let t = m.encode();
        assert!(!t.contains("broker=\"2\""), "{t}");
        assert_eq!(
            value(
                &t,
                "siphon_kafka_latency_seconds{broker=\"3\",stage=\"round_trip\",quantile=\"1\"}"
            ),
            0.003
        );
    }

    #[test]
    fn counters_move_their_series() {
        let m = Metrics::new();
        m.event_read();
        m.event_read();
        m.transaction();
        m.record_routed("orders");
        m.record_routed("orders");
        m.record_produced("orders");
        m.record_acked("orders");
        m.record_dead_lettered("payments");
        let cached = m.topic("orders");
        cached.acked();
        m.row_skipped(SkipKind::Delete);
        m.row_skipped(SkipKind::OtherTable);
        m.row_skipped(siphon_router::SkipReason::Update.into());
        m.producer_error(ProducerErrorKind::Transient);
        m.producer_error(ProducerErrorKind::Definite);
        m.producer_error(ProducerErrorKind::Definite);
        m.reconnect(ReconnectCause::Sink);
        let t = m.encode();
        assert_eq!(value(&t, "siphon_events_read_total"), 2.0);
        assert_eq!(value(&t, "siphon_transactions_total"), 1.0);
        assert_eq!(
            value(&t, "siphon_records_routed_total{topic=\"orders\"}"),
            2.0
        );
        assert_eq!(
            value(&t, "siphon_records_produced_total{topic=\"orders\"}"),
            1.0
        );
        assert_eq!(
            value(&t, "siphon_records_acked_total{topic=\"orders\"}"),
            2.0
        );
        assert_eq!(
            value(&t, "siphon_records_dead_lettered_total{topic=\"payments\"}"),
            1.0
        );
        assert_eq!(
            value(&t, "siphon_records_dead_lettered_total{topic=\"orders\"}"),
            0.0
        );
        assert_eq!(
            value(&t, "siphon_rows_skipped_total{reason=\"delete\"}"),
            1.0
        );
        assert_eq!(
            value(&t, "siphon_rows_skipped_total{reason=\"update\"}"),
            1.0
        );
        assert_eq!(
            value(&t, "siphon_rows_skipped_total{reason=\"other_table\"}"),
            1.0
        );
        assert_eq!(
            value(&t, "siphon_producer_errors_total{kind=\"transient\"}"),
            1.0
        );
        assert_eq!(
            value(&t, "siphon_producer_errors_total{kind=\"definite\"}"),
            2.0
        );
        assert_eq!(value(&t, "siphon_reconnects_total{cause=\"sink\"}"), 1.0);
        assert_eq!(value(&t, "siphon_reconnects_total{cause=\"source\"}"), 0.0);
    }

    #[test]
    fn gauges_move_their_series() {
        let m = Metrics::new();
        let t = m.encode();
        assert_eq!(value(&t, "siphon_up"), 1.0);
        assert_eq!(value(&t, "siphon_streaming"), 0.0);
        assert_eq!(value(&t, "siphon_oldest_unacked_event_age_seconds"), 0.0);

        m.set_in_flight(3, 300);
        m.set_server_wal_end(Lsn(0x1_0000_0500));
        m.set_confirmed_lsn(Lsn(0x1_0000_0100));
        m.set_slot_retained_wal_bytes(4096);
        m.health().set_streaming(true);
        m.health().set_broker_reachable(true);
        let t = m.encode();
        assert_eq!(value(&t, "siphon_in_flight_records"), 3.0);
        assert_eq!(value(&t, "siphon_in_flight_bytes"), 300.0);
        assert_eq!(value(&t, "siphon_confirmed_lsn"), 4_294_967_552.0);
        assert_eq!(value(&t, "siphon_server_wal_end_lsn"), 4_294_968_576.0);
        assert_eq!(value(&t, "siphon_replication_lag_bytes"), 1024.0);
        assert_eq!(value(&t, "siphon_slot_retained_wal_bytes"), 4096.0);
        assert_eq!(value(&t, "siphon_streaming"), 1.0);
        assert_eq!(value(&t, "siphon_broker_reachable"), 1.0);

        // Confirmed past the last known WAL end: the lag floors at 0.
        m.set_confirmed_lsn(Lsn(0x1_0000_0600));
        assert_eq!(value(&m.encode(), "siphon_replication_lag_bytes"), 0.0);
    }

    #[test]
    fn producer_rebuilds_and_retired_records_have_series() {
        let m = Metrics::new();
        let t = m.encode();
        assert_eq!(value(&t, "siphon_producer_rebuilds_total"), 0.0);
        assert_eq!(value(&t, "siphon_retired_producer_unreported_records"), 0.0);
        m.producer_rebuilt();
        m.producer_rebuilt();
        m.set_retired_producer_unreported(7);
        let t = m.encode();
        assert_eq!(value(&t, "siphon_producer_rebuilds_total"), 2.0);
        assert_eq!(value(&t, "siphon_retired_producer_unreported_records"), 7.0);
    }

    #[test]
    fn oldest_unacked_age_grows_until_cleared() {
        let m = Metrics::new();
        let since = Instant::now();
        m.set_oldest_unacked_since(Some(since));
        let later = since + Duration::from_millis(1500);
        assert_eq!(m.oldest_unacked_age(later), Duration::from_millis(1500));
        assert!(value(&m.encode(), "siphon_oldest_unacked_event_age_seconds") >= 0.0);
        m.set_oldest_unacked_since(None);
        assert_eq!(m.oldest_unacked_age(later), Duration::ZERO);
        // An instant before the registry existed counts from the registry's creation.
        m.set_oldest_unacked_since(Some(
            m.epoch
                .checked_sub(Duration::from_secs(1))
                .unwrap_or(m.epoch),
        ));
        assert_eq!(
            m.oldest_unacked_age(m.epoch + Duration::from_secs(2)),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn histogram_counts_into_buckets() {
        let m = Metrics::new();
        m.observe_commit_to_ack(Duration::from_micros(500));
        m.observe_commit_to_ack(Duration::from_millis(20));
        m.observe_commit_to_ack(Duration::from_secs(120));
        let t = m.encode();
        assert_eq!(
            value(&t, "siphon_commit_to_ack_seconds_bucket{le=\"0.001\"}"),
            1.0
        );
        assert_eq!(
            value(&t, "siphon_commit_to_ack_seconds_bucket{le=\"0.025\"}"),
            2.0
        );
        assert_eq!(
            value(&t, "siphon_commit_to_ack_seconds_bucket{le=\"60\"}"),
            2.0
        );
        assert_eq!(
            value(&t, "siphon_commit_to_ack_seconds_bucket{le=\"+Inf\"}"),
            3.0
        );
        assert_eq!(value(&t, "siphon_commit_to_ack_seconds_count"), 3.0);
        assert!((value(&t, "siphon_commit_to_ack_seconds_sum") - 120.0205).abs() < 1e-9);
    }

    #[test]
    fn topic_labels_are_capped() {
        let m = Metrics::new();
        for i in 0..MAX_TOPIC_LABELS + 5 {
            m.record_routed(&format!("t{i}"));
        }
        m.record_routed("t0");
        let t = m.encode();
        assert_eq!(value(&t, "siphon_records_routed_total{topic=\"t0\"}"), 2.0);
        assert_eq!(
            value(&t, "siphon_records_routed_total{topic=\"<other>\"}"),
            5.0
        );
        let series = t
            .lines()
            .filter(|l| l.starts_with("siphon_records_routed_total{"))
            .count();
        assert_eq!(series, MAX_TOPIC_LABELS + 1);
    }

    #[test]
    fn text_format_has_help_type_and_samples() {
        let m = Metrics::new();
        m.record_acked("orders");
        let t = m.encode();
        let lines: Vec<&str> = t.lines().collect();
        for expected in [
            "# HELP siphon_events_read_total Row changes read from the replication stream.",
            "# TYPE siphon_events_read_total counter",
            "siphon_events_read_total 0",
            "# TYPE siphon_records_acked_total counter",
            "siphon_records_acked_total{topic=\"orders\"} 1",
            "# TYPE siphon_in_flight_records gauge",
            "siphon_in_flight_records 0",
            "# TYPE siphon_commit_to_ack_seconds histogram",
            "siphon_commit_to_ack_seconds_bucket{le=\"0.001\"} 0",
            "# TYPE siphon_commit_to_read_seconds histogram",
            "siphon_commit_to_read_seconds_count 0",
            "# TYPE siphon_send_to_ack_seconds histogram",
            "siphon_send_to_ack_seconds_count 0",
            "# HELP siphon_up Always 1 while the process runs.",
            "siphon_up 1",
        ] {
            assert!(lines.contains(&expected), "missing {expected:?} in\n{t}");
        }
        // Every line is a comment or `name[{labels}] value`, and every family has HELP and TYPE.
        let mut helps = 0;
        let mut types = 0;
        for line in &lines {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                helps += 1;
                assert!(rest.starts_with("siphon_"), "{line}");
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                types += 1;
                let kind = rest.rsplit(' ').next().unwrap();
                assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            } else {
                let (series, v) = line.rsplit_once(' ').unwrap();
                assert!(series.starts_with("siphon_"), "{line}");
                assert!(v.parse::<f64>().is_ok() || v == "+Inf", "{line}");
            }
        }
        // siphon_kafka_latency_seconds is written once the producer reported its statistics.
        assert_eq!(helps, 29, "one HELP per metric family");
        assert_eq!(types, helps);
        assert!(!t.contains("# EOF"), "classic text format, not OpenMetrics");
    }

    #[test]
    fn metrics_are_shareable() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Metrics>();
        assert_send_sync::<TopicMetrics>();
    }
}
