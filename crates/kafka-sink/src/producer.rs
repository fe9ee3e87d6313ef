//! The producer and its delivery reports.
//!
//! # Invariants
//! - One [`Delivery`] per successfully enqueued record, sent from librdkafka's delivery callback
//!   with the token the caller gave.
//! - [`KafkaSink::send`] never drops a record: when librdkafka's queue is full it waits and
//!   retries.
//! - At most one retired producer (replaced by [`KafkaSink::rebuild`]) waits for its last
//!   reports: a rebuild is refused with [`SinkError::RetiredStillReporting`] until the previous
//!   retired producer has reported every record it was given.
//! - A producer's unreported count is raised before a record is handed to librdkafka and
//!   lowered after that record's [`Delivery`] is on the channel: at zero, every report of the
//!   producer is in the channel.
//! - Reports reach the channel only while the caller serves them
//!   ([`KafkaSink::reports_ready`], then [`KafkaSink::serve_reports`]): there is no polling
//!   thread. [`KafkaSink::send`] serves them itself while librdkafka's queue is full.
//! - The observer's counter of the topic reported last is kept by the address of librdkafka's
//!   topic object: a producer keeps a handle of every topic it was given until it is dropped
//!   (`TopicHandles`), so an address names one topic for the life of the producer.

use crate::error::{is_connection_failure, is_refused_login, SinkOperation};
use crate::login::LoginRefusals;
use crate::produce::{Outgoing, TopicHandles};
use crate::topics::{connection_properties, TopicCreator};
use crate::wakeup::ReportWakeup;
use crate::{DeliveryError, SinkConfig, SinkError};
use bytes::Bytes;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext, PurgeConfig};
use rdkafka::ClientContext;
use rustc_hash::{FxHashMap, FxHashSet};
use siphon_record::{Header, RoutedRecord};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::{debug, warn};

pub use siphon_record::Delivered;

/// The outcome of one record; its token is the one given to [`KafkaSink::send`], its
/// generation the producer's (see [`KafkaSink::generation`]).
pub type Delivery = siphon_record::Delivery<DeliveryError>;

/// A record that was not delivered, with a copy of it (taken only on failure) so that it can
/// be dead-lettered.
pub type DeliveryFailure = siphon_record::DeliveryFailure<DeliveryError>;

/// Routes librdkafka callbacks: deliveries to the channel, client errors to the log.
pub struct DeliveryContext {
    deliveries: mpsc::UnboundedSender<Delivery>,
    observer: Option<Arc<dyn DeliveryObserver>>,
    /// The observer's counter of the topic reported last, with the address of librdkafka's
    /// topic object: reports come in runs of one topic, and reading the topic's name back from
    /// librdkafka and looking it up cost more than the rest of a report's handling.
    last_acked: Mutex<Option<(usize, AckCounter)>>,
    generation: u64,
    unreported: Arc<Unreported>,
    /// Whether librdkafka's partition-queue latency means anything (see [`crate::statistics`]).
    partition_queue_measured: bool,
    /// This producer's refused logins since its last acknowledged record.
    logins: LoginRefusals,
    /// Topics a record failed for as missing (deleted, or brokers that lost them), not yet
    /// taken by [`KafkaSink::rebuild`].
    missing_topics: Mutex<Vec<String>>,
}

impl DeliveryContext {
    /// Keeps `topic` as missing when `error` says it is.
    fn note_missing_topic(&self, topic: &str, error: &DeliveryError) {
        if !error.says_topic_missing() {
            return;
        }
        let mut topics = self
            .missing_topics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !topics.iter().any(|t| t == topic) {
            topics.push(topic.to_owned());
        }
    }

    /// The topics kept as missing, forgotten.
    fn take_missing_topics(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .missing_topics
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Counts one acknowledged record of `message`'s topic with the observer.
    fn count_acked(&self, message: &BorrowedMessage<'_>) {
        let Some(observer) = &self.observer else {
            return;
        };
        // Only compared, never dereferenced.
        let topic = message.topic_ptr() as usize;
        let mut last = self
            .last_acked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &*last {
            Some((address, counter)) if *address == topic => counter(),
            _ => {
                let counter = observer.acked_counter(message.topic());
                counter();
                *last = Some((topic, counter));
            }
        }
    }
}

/// Records handed to one producer whose [`Delivery`] is not on the channel yet.
#[derive(Default)]
struct Unreported {
    count: AtomicUsize,
    /// The timestamps of those records that named one, by token: librdkafka reports a failed
    /// message without its timestamp (`rd_kafka_message_timestamp` answers "not available" for
    /// a message with an error), and a record sent again must keep the one it had.
    timestamps: Mutex<FxHashMap<usize, i64>>,
    /// Whether `timestamps` ever held anything: records without a timestamp of their own (the
    /// default routing) never take the lock.
    stamped: AtomicBool,
    /// The tokens of those records that name their partition (a partition column): a failed
    /// one is sent again to the same partition, and its partition missing is the record's
    /// fault; any other is placed again by the partitioner.
    named_partitions: Mutex<FxHashSet<usize>>,
    /// Whether `named_partitions` ever held anything (as `stamped`).
    partitioned: AtomicBool,
}

impl Unreported {
    /// Keeps `timestamp` of the record `token` until its report.
    fn stamp(&self, token: usize, timestamp: i64) {
        self.stamped.store(true, Ordering::Relaxed);
        self.timestamps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(token, timestamp);
    }

    /// The timestamp kept for `token`, forgotten.
    fn take_timestamp(&self, token: usize) -> Option<i64> {
        if !self.stamped.load(Ordering::Relaxed) {
            return None;
        }
        self.timestamps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&token)
    }

    /// Keeps that the record `token` names its partition, until its report.
    fn name_partition(&self, token: usize) {
        self.partitioned.store(true, Ordering::Relaxed);
        self.named_partitions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(token);
    }

    /// Whether the record `token` named its partition, forgotten.
    fn take_named_partition(&self, token: usize) -> bool {
        self.partitioned.load(Ordering::Relaxed)
            && self
                .named_partitions
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&token)
    }

    fn add(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn remove(&self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }

    fn get(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

/// Counts one acknowledged record of a topic.
pub type AckCounter = Box<dyn Fn() + Send + Sync>;

/// Told about every delivered record, while reports are served.
pub trait DeliveryObserver: Send + Sync + 'static {
    /// The counter that each record of `topic` acknowledged by the broker is counted with.
    /// Asked when a report's topic differs from the previous report's; keep the counter cheap.
    fn acked_counter(&self, topic: &str) -> AckCounter;

    /// librdkafka's latencies per broker over its last statistics interval
    /// (`statistics.interval.ms`), while reports are served.
    fn broker_latencies(&self, _brokers: &[crate::BrokerLatencies]) {}
}

impl ClientContext for DeliveryContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if is_refused_login(&error) {
            self.logins.refused(Instant::now(), reason);
        } else if is_connection_failure(&error) {
            self.logins.connection_failed();
        }
        // Connection failures are retried by librdkafka and reported once per change of state
        // by the pipeline's broker watch; anything else (authentication, TLS ...) is shown.
        match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::AllBrokersDown) => {
                debug!(%error, reason, "Kafka connection error")
            }
            _ => warn!(%error, reason, "Kafka client error"),
        }
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        match level {
            L::Emerg | L::Alert | L::Critical => warn!(fac, "librdkafka: {log_message}"),
            // Errors (failed connects among them) also reach `error` above.
            _ => debug!(fac, "librdkafka: {log_message}"),
        }
    }

    fn stats_raw(&self, statistics: &[u8]) {
        let Some(observer) = &self.observer else {
            return;
        };
        match crate::statistics::broker_latencies(statistics, self.partition_queue_measured) {
            Ok(brokers) => observer.broker_latencies(&brokers),
            Err(error) => debug!(%error, "librdkafka's statistics could not be read"),
        }
    }
}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, token: usize) {
        if let Ok(message) = result {
            self.count_acked(message);
            self.logins.acknowledged();
        }
        let given_timestamp = self.unreported.take_timestamp(token);
        let named_partition = self.unreported.take_named_partition(token);
        let delivery = match result {
            Ok(message) => Delivery {
                token,
                generation: self.generation,
                result: Ok(Delivered {
                    partition: message.partition(),
                    offset: message.offset(),
                }),
            },
            Err((error, message)) => {
                let mut record = copy_record(message, named_partition);
                if let Some(timestamp) = given_timestamp {
                    record.timestamp_ms = Some(timestamp);
                }
                Delivery {
                    token,
                    generation: self.generation,
                    result: Err(Box::new({
                        let error =
                            DeliveryError::from_report(message.topic(), error, named_partition);
                        self.note_missing_topic(message.topic(), &error);
                        DeliveryFailure { error, record }
                    })),
                }
            }
        };
        // The receiver is gone only when the pipeline is shutting down.
        let _ = self.deliveries.send(delivery);
        self.unreported.remove();
    }
}

/// One librdkafka producer, its report wake-up, its topic handles and its unreported count.
struct Client {
    // Declared first, dropped first: wake-ups are disabled before the producer may go.
    wakeup: ReportWakeup<DeliveryContext>,
    // Holds a reference to the producer of its own: the handles go before the producer can.
    handles: TopicHandles<DeliveryContext>,
    producer: Arc<BaseProducer<DeliveryContext>>,
    unreported: Arc<Unreported>,
}

impl Client {
    /// A producer whose delivery reports go to `deliveries`, tagged with `generation`.
    fn create(
        properties: &std::collections::BTreeMap<String, String>,
        deliveries: &mpsc::UnboundedSender<Delivery>,
        observer: &Option<Arc<dyn DeliveryObserver>>,
        generation: u64,
    ) -> Result<Self, SinkError> {
        let mut client_config = ClientConfig::new();
        for (key, value) in properties {
            client_config.set(key, value);
        }
        let unreported = Arc::new(Unreported::default());
        let producer: BaseProducer<DeliveryContext> = client_config
            .create_with_context(DeliveryContext {
                deliveries: deliveries.clone(),
                observer: observer.clone(),
                last_acked: Mutex::new(None),
                generation,
                unreported: Arc::clone(&unreported),
                partition_queue_measured: properties
                    .get("message.timeout.ms")
                    .is_some_and(|timeout| timeout != "0"),
                logins: LoginRefusals::new(connection_properties(properties)),
                missing_topics: Mutex::default(),
            })
            .map_err(|e| SinkError::client(SinkOperation::CreateProducer, &e))?;
        let producer = Arc::new(producer);
        let wakeup = ReportWakeup::new(Arc::clone(&producer))?;
        Ok(Client {
            wakeup,
            handles: TopicHandles::new(Arc::clone(&producer)),
            producer,
            unreported,
        })
    }
}

/// Copies a failed message back into a record, which keeps its partition if it named one
/// (`named_partition`).
fn copy_record<M: Message>(message: &M, named_partition: bool) -> RoutedRecord {
    let headers = message
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| Header {
                    name: Arc::from(h.key),
                    value: h.value.map(Bytes::copy_from_slice),
                })
                .collect()
        })
        .unwrap_or_default();
    RoutedRecord {
        topic: Arc::from(message.topic()),
        key: message.key().map(Bytes::copy_from_slice),
        value: message.payload().map(Bytes::copy_from_slice),
        headers,
        timestamp_ms: message.timestamp().to_millis(),
        // A partition the record named is kept; one the partitioner chose is chosen again, on
        // the topic as it is then (the same for a key while the partition count stays).
        partition: (named_partition && message.partition() >= 0).then(|| message.partition()),
    }
}

/// The size a record holds in the in-flight window (key, value and headers).
pub use siphon_record::record_bytes;

/// An idempotent Kafka producer with topic creation, or (for measurements) a sink that
/// acknowledges every record at once without sending it.
pub struct KafkaSink {
    backend: Backend,
    /// The producer replaced by the last [`KafkaSink::rebuild`], kept until its last delivery
    /// report.
    retired: Option<Retired>,
    generation: u64,
    config: SinkConfig,
    deliveries: mpsc::UnboundedSender<Delivery>,
    observer: Option<Arc<dyn DeliveryObserver>>,
}

/// A producer replaced by [`KafkaSink::rebuild`], purged, with reports still to come.
struct Retired {
    // Dropped (which waits for librdkafka's threads) only once everything is reported.
    client: Client,
    generation: u64,
}

/// A retired producer's progress (see [`KafkaSink::retired`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetiredStatus {
    /// The retired producer's generation (its [`Delivery::generation`]).
    pub generation: u64,
    /// Its records whose [`Delivery`] is not on the channel yet.
    pub unreported: usize,
}

/// What [`KafkaSink::rebuild`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rebuilt {
    /// The new producer's generation.
    pub generation: u64,
    /// The replaced producer's records whose [`Delivery`] is not on the channel yet (each
    /// comes back as a failure to send again).
    pub retired_unreported: usize,
}

enum Backend {
    Kafka {
        // Boxed: the discarding backend is small.
        client: Box<Client>,
        topics: TopicCreator,
    },
    Discard {
        deliveries: mpsc::UnboundedSender<Delivery>,
    },
}

impl KafkaSink {
    /// Creates the producer; deliveries arrive on the returned channel.
    pub fn new(
        config: &SinkConfig,
        observer: Option<Arc<dyn DeliveryObserver>>,
    ) -> Result<(Self, mpsc::UnboundedReceiver<Delivery>), SinkError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let backend = if config.discard {
            Backend::Discard {
                deliveries: tx.clone(),
            }
        } else {
            let properties = config.client_properties()?;
            Backend::Kafka {
                client: Box::new(Client::create(&properties, &tx, &observer, 0)?),
                topics: TopicCreator::new(&properties, config.topic_creation.clone())?,
            }
        };
        let sink = KafkaSink {
            backend,
            retired: None,
            generation: 0,
            config: config.clone(),
            deliveries: tx,
            observer,
        };
        Ok((sink, rx))
    }

    /// The current producer's generation: 0 at first, one more after each rebuild.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Replaces a failed producer with a new one on the same delivery channel. The old one's
    /// queued and in-flight records are purged: each comes back as a failed [`Delivery`] (with
    /// its record and the old generation) to be sent again, in the order it was sent. Topics
    /// already created stay known, but for those a record failed for as missing: they are
    /// created again (if missing) before their next record.
    ///
    /// At most one retired producer waits for its reports: while the one retired by the
    /// previous rebuild has records to report this returns
    /// [`SinkError::RetiredStillReporting`] and changes nothing; await
    /// [`KafkaSink::retired_reported`] first. A retired producer that has reported everything
    /// is let go here.
    pub fn rebuild(&mut self) -> Result<Rebuilt, SinkError> {
        let Backend::Kafka { client, topics } = &mut self.backend else {
            return Ok(Rebuilt {
                generation: self.generation,
                retired_unreported: 0,
            });
        };
        if let Some(retired) = &self.retired {
            let left = retired.client.unreported.get();
            if left > 0 {
                return Err(SinkError::RetiredStillReporting {
                    generation: retired.generation,
                    unreported: left,
                });
            }
        }
        let properties = self.config.client_properties()?;
        let generation = self.generation + 1;
        let fresh = Client::create(&properties, &self.deliveries, &self.observer, generation)?;
        let old = std::mem::replace(&mut **client, fresh);
        // Topics records failed for as missing are created again before their next record
        // (an outbox topic deleted, or brokers back without their data, that do not create
        // topics themselves), including those the retired producer reported since the last
        // rebuild.
        let retired = self.retired.as_ref().map(|r| &r.client);
        for topic in std::iter::once(&old)
            .chain(retired)
            .flat_map(|c| c.producer.context().take_missing_topics())
        {
            warn!(topic = %topic, "records failed for their topic missing: it is looked up, and created again if missing, before the next record is sent to it");
            topics.forget(&topic);
        }
        old.producer
            .purge(PurgeConfig::default().queue().inflight());
        let retired_unreported = old.unreported.get();
        self.retired = Some(Retired {
            client: old,
            generation: self.generation,
        });
        self.generation = generation;
        Ok(Rebuilt {
            generation,
            retired_unreported,
        })
    }

    /// Purges the current producer: its queued and in-flight records come back as failed
    /// [`Delivery`]s (each with its record), so that they can be sent again on a replacement.
    pub fn purge(&self) {
        if let Backend::Kafka { client, .. } = &self.backend {
            client
                .producer
                .purge(PurgeConfig::default().queue().inflight());
        }
    }

    /// Returns once the current or the retired producer may have delivery reports to serve
    /// ([`KafkaSink::serve_reports`]); never for a discarding sink, whose reports are on the
    /// channel at once. Cancel-safe.
    pub async fn reports_ready(&self) {
        let Backend::Kafka { client, .. } = &self.backend else {
            return std::future::pending().await;
        };
        match &self.retired {
            Some(retired) => tokio::select! {
                () = client.wakeup.ready() => {}
                () = retired.client.wakeup.ready() => {}
            },
            None => client.wakeup.ready().await,
        }
    }

    /// Puts every delivery report the current and the retired producer have on the channel.
    pub fn serve_reports(&self) {
        if let Backend::Kafka { client, .. } = &self.backend {
            client.wakeup.serve();
        }
        if let Some(retired) = &self.retired {
            retired.client.wakeup.serve();
        }
    }

    /// The producer retired by the last rebuild, while it has records to report.
    pub fn retired(&self) -> Option<RetiredStatus> {
        self.retired
            .as_ref()
            .map(|r| RetiredStatus {
                generation: r.generation,
                unreported: r.client.unreported.get(),
            })
            .filter(|status| status.unreported > 0)
    }

    /// Serves reports until the retired producer (if any) has put every report on the
    /// channel. Cancel-safe.
    pub async fn retired_reported(&self) {
        loop {
            self.serve_reports();
            if self.retired().is_none() {
                return;
            }
            self.reports_ready().await;
        }
    }

    /// Lets go of the retired producer if its delivery reports have all arrived.
    pub fn release_retired(&mut self) {
        if self.retired().is_none() {
            self.retired = None;
        }
    }

    /// The creation of `topic` if it is new to this sink (see [`TopicCreator::creation`]): a
    /// future to run beside the caller's loop, after which [`KafkaSink::topic_created`] is
    /// called. `None`: [`KafkaSink::send`] can take records for `topic` without creating it.
    pub fn topic_creation(
        &self,
        topic: &str,
    ) -> Option<impl std::future::Future<Output = Result<(), SinkError>> + Send + 'static> {
        match &self.backend {
            Backend::Kafka { topics, .. } => topics.creation(topic),
            Backend::Discard { .. } => None,
        }
    }

    /// Remembers `topic` as present: its [`KafkaSink::topic_creation`] succeeded.
    pub fn topic_created(&mut self, topic: &str) {
        if let Backend::Kafka { topics, .. } = &mut self.backend {
            topics.remember(topic);
        }
    }

    /// Enqueues `record`; its [`Delivery`] carries `token`.
    ///
    /// Creates the topic first if it is new to this sink. Waits while librdkafka's queue is full.
    /// (While the brokers are unreachable creating it waits up to
    /// [`crate::topics::CREATE_TIMEOUT`]; a caller that must not wait that long runs
    /// [`KafkaSink::topic_creation`] first.)
    pub async fn send(&mut self, token: usize, record: &RoutedRecord) -> Result<(), SinkError> {
        let (client, topics) = match &mut self.backend {
            Backend::Kafka { client, topics } => (client, topics),
            Backend::Discard { deliveries } => {
                let delivery = Delivery {
                    token,
                    generation: 0,
                    result: Ok(Delivered {
                        partition: -1,
                        offset: -1,
                    }),
                };
                // The receiver is gone only when the pipeline is shutting down.
                let _ = deliveries.send(delivery);
                return Ok(());
            }
        };
        topics.ensure(&record.topic).await?;
        let topic: &str = record.topic.as_ref();
        let mut outgoing = Outgoing::new(record, token);
        loop {
            // Counted before librdkafka can report it; uncounted when it is not taken.
            client.unreported.add();
            if let Some(timestamp) = record.timestamp_ms {
                client.unreported.stamp(token, timestamp);
            }
            if record.partition.is_some() {
                client.unreported.name_partition(token);
            }
            let outcome = client.handles.produce(outgoing);
            if outcome.is_err() {
                client.unreported.take_timestamp(token);
                client.unreported.take_named_partition(token);
                client.unreported.remove();
            }
            match outcome {
                Ok(()) => return Ok(()),
                // The queue is full: the reports served free it (a record leaves it once its
                // report is served), and the record comes back, with its headers, to be offered
                // again shortly.
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                    outgoing = returned;
                    client.wakeup.serve();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, _)) => return Err(SinkError::enqueue(topic, &e)),
            }
        }
    }

    /// The transactional producer and its id (`None`: not transactional, or discarding).
    fn transactional(&self) -> Option<(Arc<BaseProducer<DeliveryContext>>, String)> {
        match (&self.backend, &self.config.transactional_id) {
            (Backend::Kafka { client, .. }, Some(id)) => {
                Some((Arc::clone(&client.producer), id.clone()))
            }
            _ => None,
        }
    }

    /// Registers the transactional producer with its transaction coordinator: older producers
    /// with the same transactional id are fenced, and a transaction they left open is completed
    /// or aborted. Runs on a blocking thread, bounded by `timeout`. Nothing to do for a producer
    /// that is not transactional.
    pub async fn init_transactions(&self, timeout: Duration) -> Result<(), SinkError> {
        self.run_transactional(SinkOperation::InitTransactions, move |producer| {
            producer.init_transactions(timeout)
        })
        .await
    }

    /// Begins a Kafka transaction (a local step of the producer: it does not block).
    pub fn begin_transaction(&self) -> Result<(), SinkError> {
        let Some((producer, id)) = self.transactional() else {
            return Ok(());
        };
        producer
            .begin_transaction()
            .map_err(|e| transaction_error(SinkOperation::BeginTransaction, id, &e))
    }

    /// Commits the open Kafka transaction once all its records are delivered: a future to run
    /// beside the caller's loop (the caller keeps serving delivery reports meanwhile), bounded
    /// by `timeout`.
    pub fn commit_transaction(
        &self,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<(), SinkError>> + Send + 'static {
        self.run_transactional(SinkOperation::CommitTransaction, move |producer| {
            producer.commit_transaction(timeout)
        })
    }

    /// Aborts the open Kafka transaction (its records are never shown to read_committed
    /// consumers), bounded by `timeout`.
    pub async fn abort_transaction(&self, timeout: Duration) -> Result<(), SinkError> {
        self.run_transactional(SinkOperation::AbortTransaction, move |producer| {
            producer.abort_transaction(timeout)
        })
        .await
    }

    fn run_transactional(
        &self,
        operation: SinkOperation,
        call: impl FnOnce(&BaseProducer<DeliveryContext>) -> rdkafka::error::KafkaResult<()>
            + Send
            + 'static,
    ) -> impl std::future::Future<Output = Result<(), SinkError>> + Send + 'static {
        let transactional = self.transactional();
        async move {
            let Some((producer, id)) = transactional else {
                return Ok(());
            };
            let called_id = id.clone();
            match tokio::task::spawn_blocking(move || call(&producer)).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(transaction_error(operation, called_id, &e)),
                Err(_) => Err(SinkError::Transaction {
                    operation,
                    transactional_id: id,
                    code: RDKafkaErrorCode::Fail,
                }),
            }
        }
    }

    /// Records enqueued but not yet reported.
    pub fn in_flight(&self) -> i32 {
        match &self.backend {
            Backend::Kafka { client, .. } => client.producer.in_flight_count(),
            Backend::Discard { .. } => 0,
        }
    }

    /// A handle that asks whether the brokers answer, usable from another task.
    pub fn prober(&self) -> BrokerProbe {
        BrokerProbe {
            producer: match &self.backend {
                Backend::Kafka { client, .. } => Some(Arc::clone(&client.producer)),
                Backend::Discard { .. } => None,
            },
        }
    }

    /// The brokers refuse the login of the current or the retired producer (wrong credentials,
    /// or credentials changed on the brokers while it ran): a definite error, told by librdkafka
    /// to the producer's context while reports are served (the records themselves only time
    /// out), once the broker probe ([`BrokerProbe`]) asked after the refusal went unanswered
    /// (see [`crate::login`]).
    pub fn refused_login(&self) -> Option<SinkError> {
        let Backend::Kafka { client, .. } = &self.backend else {
            return None;
        };
        std::iter::once(&**client)
            .chain(self.retired.as_ref().map(|retired| &retired.client))
            .find_map(|client| client.producer.context().logins.definite())
            .map(|reason| SinkError::CredentialsRefused { reason })
    }

    /// The current producer's context.
    #[cfg(test)]
    fn producer_context(&self) -> &DeliveryContext {
        match &self.backend {
            Backend::Kafka { client, .. } => client.producer.context(),
            Backend::Discard { .. } => panic!("a discarding sink has no producer"),
        }
    }

    /// The producer's fatal error, if it has one (it must then be rebuilt).
    pub fn fatal_error(&self) -> Option<String> {
        match &self.backend {
            Backend::Kafka { client, .. } => client
                .producer
                .client()
                .fatal_error()
                .map(|(code, reason)| format!("{code}: {reason}")),
            Backend::Discard { .. } => None,
        }
    }
}

/// A failed call of the transactional producer `id`, by its code.
fn transaction_error(operation: SinkOperation, id: String, error: &KafkaError) -> SinkError {
    let code = match error {
        KafkaError::Transaction(e) => e.code(),
        other => other.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail),
    };
    SinkError::Transaction {
        operation,
        transactional_id: id,
        code,
    }
}

/// Asks the brokers for metadata, to tell whether they answer.
#[derive(Clone)]
pub struct BrokerProbe {
    producer: Option<Arc<BaseProducer<DeliveryContext>>>,
}

impl BrokerProbe {
    /// Whether a broker answers a metadata request within `timeout` (asked on a blocking
    /// thread, so the caller's task is not held up). A discarding sink always answers.
    pub async fn probe(&self, timeout: Duration) -> bool {
        let Some(producer) = &self.producer else {
            return true;
        };
        let asking = Arc::clone(producer);
        tokio::task::spawn_blocking(move || {
            let asked = Instant::now();
            let answered = asking.client().fetch_metadata(None, timeout).is_ok();
            let logins = &asking.context().logins;
            logins.asked(asked, answered);
            if !answered {
                logins.confirm(timeout);
            }
            answered
        })
        .await
        .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::login::FreshLogin;
    use crate::{DeliveryConsequence, TopicCreation};

    /// A sink whose brokers never answer (nothing listens on the port), so records stay queued.
    fn unreachable_sink() -> (KafkaSink, mpsc::UnboundedReceiver<Delivery>) {
        let port = siphon_tests::free_port();
        let config = SinkConfig {
            bootstrap_servers: format!("127.0.0.1:{port}"),
            properties: Default::default(),
            topic_creation: TopicCreation {
                enabled: false,
                ..TopicCreation::default()
            },
            discard: false,
            transactional_id: None,
        };
        KafkaSink::new(&config, None).expect("a producer")
    }

    fn record(n: usize) -> RoutedRecord {
        RoutedRecord {
            topic: "t".into(),
            key: Some(Bytes::from(format!("k{n}"))),
            value: Some(Bytes::from_static(b"v")),
            headers: vec![],
            timestamp_ms: None,
            partition: None,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_known_topic_needs_no_creation_and_a_new_one_does() {
        let (mut sink, _deliveries) = unreachable_sink();
        // Creation is disabled in `unreachable_sink`: nothing to create, ever.
        assert!(sink.topic_creation("t").is_none());
        let config = SinkConfig {
            bootstrap_servers: "127.0.0.1:1".into(),
            properties: Default::default(),
            topic_creation: TopicCreation::default(),
            discard: false,
            transactional_id: None,
        };
        let (mut creating, _deliveries) = KafkaSink::new(&config, None).expect("a producer");
        assert!(creating.topic_creation("t").is_some());
        creating.topic_created("t");
        assert!(creating.topic_creation("t").is_none());
        assert!(creating.topic_creation("u").is_some());
        sink.topic_created("t");
    }

    /// Serves reports until `count` are on the channel; each wait is for a wake-up.
    async fn serve_until(
        sink: &KafkaSink,
        deliveries: &mut mpsc::UnboundedReceiver<Delivery>,
        count: usize,
    ) -> Vec<Delivery> {
        let mut got = Vec::new();
        loop {
            sink.serve_reports();
            while let Ok(delivery) = deliveries.try_recv() {
                got.push(delivery);
            }
            if got.len() >= count {
                return got;
            }
            tokio::time::timeout(Duration::from_secs(10), sink.reports_ready())
                .await
                .expect("the producer's queue wakes the task");
        }
    }

    /// Without a polling thread, reports reach the channel only when served, and the queue
    /// wakes the waiting task again after each time it was served empty.
    #[tokio::test(flavor = "current_thread")]
    async fn reports_wake_the_task_every_time_and_arrive_when_served() {
        let (mut sink, mut deliveries) = unreachable_sink();
        for round in 0..3 {
            for n in 0..100 {
                sink.send(round * 100 + n, &record(n)).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(deliveries.try_recv().is_err(), "nothing reported unserved");
            sink.purge();
            let got = serve_until(&sink, &mut deliveries, 100).await;
            let tokens: Vec<usize> = got.iter().map(|d| d.token).collect();
            let expected: Vec<usize> = (round * 100..round * 100 + 100).collect();
            assert_eq!(tokens, expected, "one report per record, in order");
            assert!(got.iter().all(|d| d.result.is_err()), "purged");
        }
    }

    /// What a real broker holds of each record sent is exactly the record: key, value and
    /// headers byte for byte (a null header value, a repeated name and the order kept), its
    /// timestamp and the partition it named; a record without any of them is a tombstone with
    /// a null key, no headers and the time of sending, on a second topic with its own handle.
    /// (Both topics are in this test's namespace on the test run's shared Kafka.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_broker_holds_exactly_the_records_sent() {
        use siphon_tests::{create_topic, read_topic_async, Broker};
        let broker = tokio::task::spawn_blocking(Broker::start)
            .await
            .unwrap()
            .expect("a broker");
        let bootstrap = broker.bootstrap();
        let (exact_topic, plain_topic) = (broker.topic("exact"), broker.topic("plain"));
        create_topic(&bootstrap, &exact_topic, 3)
            .await
            .expect("topic");
        let config = SinkConfig {
            bootstrap_servers: bootstrap.clone(),
            properties: Default::default(),
            topic_creation: TopicCreation {
                enabled: false,
                ..TopicCreation::default()
            },
            discard: false,
            transactional_id: None,
        };
        let (mut sink, mut deliveries) = KafkaSink::new(&config, None).expect("a producer");
        let header = |name: &str, value: Option<&'static [u8]>| Header {
            name: Arc::from(name),
            value: value.map(Bytes::from_static),
        };
        let exact = RoutedRecord {
            topic: Arc::from(exact_topic.as_str()),
            key: Some(Bytes::from_static(b"key\0\xff")),
            value: Some(Bytes::from_static(b"{\"v\":\"\0\xfe\"}")),
            headers: vec![
                header("id", Some(b"\x01\x02")),
                header("none", None),
                header("id", Some(b"")),
            ],
            timestamp_ms: Some(1_600_000_000_123),
            partition: Some(2),
        };
        let plain = RoutedRecord {
            topic: Arc::from(plain_topic.as_str()),
            key: None,
            value: None,
            headers: vec![],
            timestamp_ms: None,
            partition: None,
        };
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        for (token, record) in [(10, &exact), (11, &plain), (12, &exact)] {
            sink.send(token, record).await.expect("enqueued");
        }
        let Backend::Kafka { client, .. } = &sink.backend else {
            unreachable!("a producer")
        };
        assert_eq!(client.handles.len(), 2, "one handle per topic");
        let mut got = serve_until(&sink, &mut deliveries, 3).await;
        got.sort_by_key(|d| d.token);
        let landed: Vec<(usize, i32)> = got
            .iter()
            .map(|d| (d.token, d.result.as_ref().expect("delivered").partition))
            .collect();
        assert_eq!(landed[0], (10, 2));
        assert_eq!(landed[2], (12, 2));
        assert_eq!(landed[1].0, 11);

        let read = read_topic_async(&bootstrap, &exact_topic, Duration::from_secs(30))
            .await
            .expect("read back");
        assert_eq!(read.len(), 2);
        for consumed in &read {
            assert_eq!(consumed.partition, 2);
            assert_eq!(consumed.key.as_deref(), Some(&b"key\0\xff"[..]));
            assert_eq!(consumed.value.as_deref(), Some(&b"{\"v\":\"\0\xfe\"}"[..]));
            let headers: Vec<(&str, Option<&[u8]>)> = consumed
                .headers
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_deref()))
                .collect();
            assert_eq!(
                headers,
                vec![
                    ("id", Some(&b"\x01\x02"[..])),
                    ("none", None),
                    ("id", Some(&b""[..]))
                ]
            );
            assert_eq!(consumed.timestamp, Some(1_600_000_000_123));
        }
        let read = read_topic_async(&bootstrap, &plain_topic, Duration::from_secs(30))
            .await
            .expect("read back");
        assert_eq!(read.len(), 1);
        assert_eq!((read[0].key.as_ref(), read[0].value.as_ref()), (None, None));
        assert!(read[0].headers.is_empty());
        let stamped = read[0].timestamp.expect("a timestamp");
        assert!(
            stamped >= before && stamped < before + 60_000,
            "the time of sending"
        );
    }

    /// librdkafka reports a failed message without its timestamp: the record handed back must
    /// still carry the one it was given, or it is sent again with the time of the resend.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_record_handed_back_keeps_its_timestamp() {
        let (mut sink, mut deliveries) = unreachable_sink();
        let stamped = |n: usize| RoutedRecord {
            timestamp_ms: n.is_multiple_of(2).then_some(978_307_200_000 + n as i64),
            ..record(n)
        };
        for n in 0..10 {
            sink.send(n, &stamped(n)).await.unwrap();
        }
        sink.rebuild().unwrap();
        tokio::time::timeout(Duration::from_secs(30), sink.retired_reported())
            .await
            .expect("the retired producer reports everything");
        for _ in 0..10 {
            let delivery = deliveries.try_recv().expect("a report per record");
            let failure = delivery.result.expect_err("purged");
            assert_eq!(
                failure.record.timestamp_ms,
                stamped(delivery.token).timestamp_ms,
                "record {}",
                delivery.token
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_retired_producer_at_a_time_and_its_last_report_is_known() {
        let (mut sink, mut deliveries) = unreachable_sink();
        let records = 20_000;
        for n in 0..records {
            sink.send(n, &record(n)).await.unwrap();
        }
        let rebuilt = sink.rebuild().unwrap();
        assert_eq!(rebuilt.generation, 1);
        assert_eq!(sink.generation(), 1);
        // Purged records are reported only while reports are served: nothing served them yet.
        match sink.rebuild() {
            Err(SinkError::RetiredStillReporting {
                generation: 0,
                unreported,
            }) => assert!(unreported > 0 && unreported <= records),
            other => panic!("a second rebuild while the first retired one reports: {other:?}"),
        }
        assert_eq!(sink.generation(), 1, "a refused rebuild changes nothing");

        tokio::time::timeout(Duration::from_secs(30), sink.retired_reported())
            .await
            .expect("the retired producer reports everything");
        assert_eq!(sink.retired(), None);
        // Every report is on the channel by then: one per record, each a purge of generation 0.
        for _ in 0..records {
            let delivery = deliveries.try_recv().expect("a report per record");
            assert_eq!(delivery.generation, 0);
            let failure = delivery.result.expect_err("purged");
            assert_eq!(
                failure.error.consequence(),
                DeliveryConsequence::ProducerFailed
            );
        }
        assert!(deliveries.try_recv().is_err());
        let rebuilt = sink.rebuild().unwrap();
        assert_eq!(rebuilt.generation, 2);
        assert_eq!(
            rebuilt.retired_unreported, 0,
            "nothing was sent on generation 1"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_login_is_a_definite_error_naming_the_credentials() {
        let (mut sink, _deliveries) = unreachable_sink();
        // A connection failure is not a refusal.
        sink.producer_context().error(
            KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
            "Connection refused",
        );
        assert!(sink.refused_login().is_none());
        let reason = "SASL authentication error: Authentication failed during re-authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256";
        let refuse = || {
            sink.producer_context()
                .error(KafkaError::Global(RDKafkaErrorCode::Authentication), reason)
        };
        refuse();
        assert!(
            sink.refused_login().is_none(),
            "one refusal may be a cut handshake"
        );
        // The brokers, asked after the refusal, do not answer (nothing listens), nor do they
        // answer a fresh login: they may hang.
        assert!(!sink.prober().probe(Duration::from_millis(200)).await);
        assert!(
            sink.refused_login().is_none(),
            "brokers that do not answer refuse nothing"
        );
        // A fresh login is refused too.
        sink.producer_context()
            .logins
            .tried(FreshLogin::Refused("refused afresh".into()));
        let refusal = sink.refused_login().expect("a refusal");
        assert_eq!(refusal.consequence(), siphon_core::Consequence::Fix);
        let message = refusal.to_string();
        for needle in [
            reason,
            "\"sasl.password\"",
            "SIPHON_KAFKA_PROPERTIES_SASL_PASSWORD",
        ] {
            assert!(message.contains(needle), "{message}");
        }
        // The refused producer retires; the refusal stays known while it reports.
        sink.send(0, &record(0)).await.unwrap();
        sink.rebuild().unwrap();
        assert!(sink.refused_login().is_some());
        // A producer of its own: the refusal goes with the retired one.
        tokio::time::timeout(Duration::from_secs(30), sink.retired_reported())
            .await
            .expect("the retired producer reports everything");
        sink.release_retired();
        assert!(sink.refused_login().is_none());
    }
}
