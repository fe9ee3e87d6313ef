//! What the session driver needs of the place its records go: the [`Sink`] it sends through,
//! and the [`Destination`] that opens one for each session.
//!
//! Kafka is the destination Siphon runs with ([`KafkaDestination`], over
//! [`siphon_kafka_sink::KafkaSink`]); the in-memory one of `crates/siphon/tests/driver` lets the
//! driver's own tests hold, fail and read back every record without a broker.
//!
//! # Invariants
//! - Every record a sink takes ([`Sink::send`] returned `Ok`) is reported exactly once, on the
//!   delivery channel its destination opened it with, carrying its token and the generation of
//!   the producer that took it; a purge or a rebuild reports the records it drops as failures,
//!   each with its record.
//! - A transactional sink shows a record to `read_committed` readers only once the transaction
//!   it was sent in commits; [`Destination::committed_progress`] reads what such a reader sees.

use super::ExactlyOnce;
use siphon_kafka_sink::{
    BrokerProbe, Delivery, DeliveryObserver, KafkaSink, SinkConfig, SinkError, StateTopicError,
};
use siphon_router::RoutedRecord;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The producer side of a session: records in, delivery reports out on the channel its
/// [`Destination`] returned with it.
pub trait Sink: Send + 'static {
    /// Asks, from a task of its own, whether the sink's servers answer.
    type Probe: Probe;

    /// Takes `record`; its [`Delivery`] carries `token`. Waits while the sink's queue is full.
    fn send(
        &mut self,
        token: usize,
        record: &RoutedRecord,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Returns once reports may be waiting to be served ([`Sink::serve_reports`]). Cancel-safe.
    fn reports_ready(&self) -> impl Future<Output = ()> + Send;

    /// Puts every report waiting on the delivery channel.
    fn serve_reports(&self);

    /// The servers refuse the sink's login: a definite error.
    fn refused_login(&self) -> Option<SinkError>;

    /// Drops every record taken and not reported; each comes back as a failed [`Delivery`].
    fn purge(&self);

    /// Replaces a failed producer (purged first) with a new one of the next generation.
    fn rebuild(&mut self) -> Result<(), SinkError>;

    /// A handle on the servers' reachability.
    fn prober(&self) -> Self::Probe;

    /// The creation of `topic` if the sink does not know it yet, to run beside the caller's
    /// loop, after which [`Sink::topic_created`] is called. `None`: records for `topic` can be
    /// sent at once.
    fn topic_creation(
        &self,
        topic: &str,
    ) -> Option<impl Future<Output = Result<(), SinkError>> + Send + 'static>;

    /// Remembers `topic` as present: its creation succeeded.
    fn topic_created(&mut self, topic: &str);

    /// Records taken and not reported yet.
    fn in_flight(&self) -> usize;

    /// Lets go of a replaced producer once it reported everything.
    fn release_retired(&mut self);

    /// Records of a replaced producer whose reports have not arrived yet.
    fn retired_unreported(&self) -> usize;

    /// Registers a transactional sink with its coordinator, fencing older ones with its id.
    fn init_transactions(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Begins a transaction (transactional sinks only; others do nothing).
    fn begin_transaction(&self) -> Result<(), SinkError>;

    /// Commits the open transaction: a future to run beside the caller's loop, bounded by
    /// `timeout`.
    fn commit_transaction(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), SinkError>> + Send + 'static;

    /// Aborts the open transaction, bounded by `timeout`.
    fn abort_transaction(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;
}

/// Whether a sink's servers answer.
pub trait Probe: Send + Sync + 'static {
    /// `true` when a server answers within `timeout`.
    fn probe(&self, timeout: Duration) -> impl Future<Output = bool> + Send;
}

/// Opens the sink of each session, and reads what exactly-once delivery committed there.
pub trait Destination: Sync {
    type Sink: Sink;

    /// A sink configured by `config` (transactional when it names a transactional id), and the
    /// channel its delivery reports arrive on.
    fn open(
        &self,
        config: &SinkConfig,
        observer: Option<Arc<dyn DeliveryObserver>>,
    ) -> Result<(Self::Sink, mpsc::UnboundedReceiver<Delivery>), SinkError>;

    /// Exactly-once: makes sure the progress topic exists.
    fn ensure_progress_topic(
        &self,
        exactly_once: &ExactlyOnce,
    ) -> impl Future<Output = Result<(), StateTopicError>> + Send;

    /// Exactly-once: the value of the last committed progress record with `key`, as a
    /// `read_committed` reader sees it.
    fn committed_progress(
        &self,
        exactly_once: &ExactlyOnce,
        key: &[u8],
    ) -> impl Future<Output = Result<Option<Vec<u8>>, StateTopicError>> + Send;
}

/// Kafka, through librdkafka: the destination Siphon runs with.
#[derive(Debug, Clone, Copy, Default)]
pub struct KafkaDestination;

impl Destination for KafkaDestination {
    type Sink = KafkaSink;

    fn open(
        &self,
        config: &SinkConfig,
        observer: Option<Arc<dyn DeliveryObserver>>,
    ) -> Result<(KafkaSink, mpsc::UnboundedReceiver<Delivery>), SinkError> {
        KafkaSink::new(config, observer)
    }

    fn ensure_progress_topic(
        &self,
        exactly_once: &ExactlyOnce,
    ) -> impl Future<Output = Result<(), StateTopicError>> + Send {
        exactly_once.progress_topic.ensure()
    }

    fn committed_progress(
        &self,
        exactly_once: &ExactlyOnce,
        key: &[u8],
    ) -> impl Future<Output = Result<Option<Vec<u8>>, StateTopicError>> + Send {
        exactly_once.progress_topic.read_committed(key)
    }
}

impl Probe for BrokerProbe {
    fn probe(&self, timeout: Duration) -> impl Future<Output = bool> + Send {
        BrokerProbe::probe(self, timeout)
    }
}

impl Sink for KafkaSink {
    type Probe = BrokerProbe;

    fn send(
        &mut self,
        token: usize,
        record: &RoutedRecord,
    ) -> impl Future<Output = Result<(), SinkError>> + Send {
        KafkaSink::send(self, token, record)
    }

    fn reports_ready(&self) -> impl Future<Output = ()> + Send {
        KafkaSink::reports_ready(self)
    }

    fn serve_reports(&self) {
        KafkaSink::serve_reports(self);
    }

    fn refused_login(&self) -> Option<SinkError> {
        KafkaSink::refused_login(self)
    }

    fn purge(&self) {
        KafkaSink::purge(self);
    }

    fn rebuild(&mut self) -> Result<(), SinkError> {
        KafkaSink::rebuild(self).map(|_| ())
    }

    fn prober(&self) -> BrokerProbe {
        KafkaSink::prober(self)
    }

    fn topic_creation(
        &self,
        topic: &str,
    ) -> Option<impl Future<Output = Result<(), SinkError>> + Send + 'static> {
        KafkaSink::topic_creation(self, topic)
    }

    fn topic_created(&mut self, topic: &str) {
        KafkaSink::topic_created(self, topic);
    }

    fn in_flight(&self) -> usize {
        usize::try_from(KafkaSink::in_flight(self)).unwrap_or(0)
    }

    fn release_retired(&mut self) {
        KafkaSink::release_retired(self);
    }

    fn retired_unreported(&self) -> usize {
        KafkaSink::retired(self).map_or(0, |retired| retired.unreported)
    }

    fn init_transactions(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), SinkError>> + Send {
        KafkaSink::init_transactions(self, timeout)
    }

    fn begin_transaction(&self) -> Result<(), SinkError> {
        KafkaSink::begin_transaction(self)
    }

    fn commit_transaction(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), SinkError>> + Send + 'static {
        KafkaSink::commit_transaction(self, timeout)
    }

    fn abort_transaction(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), SinkError>> + Send {
        KafkaSink::abort_transaction(self, timeout)
    }
}
