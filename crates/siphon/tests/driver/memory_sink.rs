//! An in-memory [`Destination`] for the driver's own tests: it keeps every record it is given,
//! reports each at once or when the test says, fails records as a broker would, holds topic
//! creations, and keeps Kafka transactions (a record is committed only with its transaction).
//!
//! # Invariants
//! - Each record taken is reported once: delivered ([`MemoryDestination::deliver`]), failed
//!   ([`MemoryDestination::fail_oldest`]), or purged (by [`Sink::purge`] or [`Sink::rebuild`]),
//!   in the order taken.
//! - [`MemoryDestination::committed`] is what a `read_committed` consumer reads: the records
//!   delivered outside any transaction, and those of committed transactions; an aborted
//!   transaction's never appear there. [`MemoryDestination::written`] is every record
//!   delivered, in delivery order.

use siphon::session::sink::{Destination, Probe, Sink};
use siphon::session::ExactlyOnce;
use siphon_kafka_sink::{
    Delivered, Delivery, DeliveryError, DeliveryObserver, RDKafkaErrorCode, SinkConfig, SinkError,
    StateTopicError,
};
use siphon_record::DeliveryFailure;
use siphon_router::RoutedRecord;
use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// What the destination was asked to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkEvent {
    /// A sink was opened (transactional or not).
    Opened {
        transactional: bool,
    },
    /// A topic's creation started.
    CreationStarted(String),
    Purged,
    Rebuilt,
    InitTransactions,
    Begin,
    /// A transaction committed with this many records.
    Commit(usize),
    Abort,
}

/// The in-memory destination; clones share one log, so the test keeps one to look and steer.
#[derive(Clone)]
pub struct MemoryDestination {
    log: Arc<Mutex<MemoryLog>>,
    /// `true` while topic creations are held.
    creations_held: watch::Sender<bool>,
}

/// A record taken and not reported yet.
struct Taken {
    generation: u64,
    token: usize,
    record: RoutedRecord,
    /// Sent inside a transaction: committed only with it.
    in_transaction: bool,
}

#[derive(Default)]
struct MemoryLog {
    /// Reports wait for the test (`false`: each is given when the record is taken).
    hold_reports: bool,
    /// Topics that exist.
    topics: HashSet<String>,
    unreported: VecDeque<Taken>,
    deliveries: Option<mpsc::UnboundedSender<Delivery>>,
    generation: u64,
    transactional: bool,
    in_transaction: bool,
    /// Delivered records of the open transaction.
    open: Vec<RoutedRecord>,
    committed: Vec<RoutedRecord>,
    written: Vec<RoutedRecord>,
    events: Vec<SinkEvent>,
}

impl MemoryLog {
    /// Reports the oldest record taken with `result`; `false` when none waits.
    fn report_oldest(&mut self, result: Result<(), DeliveryError>) -> bool {
        let Some(taken) = self.unreported.pop_front() else {
            return false;
        };
        let result = match result {
            Ok(()) => {
                let partition = taken.record.partition;
                let offset = i64::try_from(self.written.len()).unwrap_or(i64::MAX);
                self.written.push(taken.record.clone());
                if taken.in_transaction {
                    self.open.push(taken.record);
                } else {
                    self.committed.push(taken.record);
                }
                Ok(Delivered {
                    partition: partition.unwrap_or(0),
                    offset,
                })
            }
            Err(error) => Err(Box::new(DeliveryFailure {
                error,
                record: taken.record,
            })),
        };
        if let Some(deliveries) = &self.deliveries {
            // The receiver is gone only when the session ended.
            let _ = deliveries.send(Delivery {
                token: taken.token,
                generation: taken.generation,
                result,
            });
        }
        true
    }

    /// Reports every record taken as purged.
    fn purge(&mut self) {
        while let Some(topic) = self.unreported.front().map(|t| t.record.topic.to_string()) {
            self.report_oldest(Err(DeliveryError::from_code(
                &topic,
                RDKafkaErrorCode::PurgeQueue,
            )));
        }
    }
}

impl Default for MemoryDestination {
    fn default() -> Self {
        MemoryDestination {
            log: Arc::default(),
            creations_held: watch::Sender::new(false),
        }
    }
}

impl MemoryDestination {
    /// A destination that reports each record as delivered once taken, with every topic known.
    pub fn new() -> Self {
        Self::default()
    }

    fn log(&self) -> MutexGuard<'_, MemoryLog> {
        lock(&self.log)
    }

    /// Reports wait for [`MemoryDestination::deliver`] or [`MemoryDestination::fail_oldest`].
    pub fn hold_reports(&self) {
        self.log().hold_reports = true;
    }

    /// Each record is reported as delivered once taken (the default).
    pub fn report_at_once(&self) {
        self.log().hold_reports = false;
    }

    /// Only `topics` exist: records for others wait for their creation.
    pub fn with_topics<'a>(&self, topics: impl IntoIterator<Item = &'a str>) {
        self.log().topics = topics.into_iter().map(str::to_owned).collect();
    }

    /// Topic creations wait until [`MemoryDestination::release_creations`].
    pub fn hold_creations(&self) {
        self.creations_held.send_replace(true);
    }

    pub fn release_creations(&self) {
        self.creations_held.send_replace(false);
    }

    /// Reports the `n` oldest records taken as delivered; how many there were.
    pub fn deliver(&self, n: usize) -> usize {
        let mut log = self.log();
        (0..n).take_while(|_| log.report_oldest(Ok(()))).count()
    }

    /// Reports the oldest record taken as failed with `code`; `false` when none waits.
    pub fn fail_oldest(&self, code: RDKafkaErrorCode) -> bool {
        let mut log = self.log();
        let Some(topic) = log.unreported.front().map(|t| t.record.topic.to_string()) else {
            return false;
        };
        log.report_oldest(Err(DeliveryError::from_code(&topic, code)))
    }

    /// Records taken and not reported.
    pub fn unreported(&self) -> usize {
        self.log().unreported.len()
    }

    /// Every record delivered, in delivery order.
    pub fn written(&self) -> Vec<RoutedRecord> {
        self.log().written.clone()
    }

    /// What a `read_committed` consumer reads.
    pub fn committed(&self) -> Vec<RoutedRecord> {
        self.log().committed.clone()
    }

    /// What the destination was asked to do.
    pub fn events(&self) -> Vec<SinkEvent> {
        self.log().events.clone()
    }
}

fn lock(log: &Mutex<MemoryLog>) -> MutexGuard<'_, MemoryLog> {
    // A test that panicked holding the lock left a complete log.
    log.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Destination for MemoryDestination {
    type Sink = MemorySink;

    fn open(
        &self,
        config: &SinkConfig,
        _observer: Option<Arc<dyn DeliveryObserver>>,
    ) -> Result<(MemorySink, mpsc::UnboundedReceiver<Delivery>), SinkError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut log = self.log();
        // A new session's sink: what the last one left unreported is gone with it.
        log.unreported.clear();
        log.deliveries = Some(tx);
        log.generation = 0;
        log.transactional = config.transactional_id.is_some();
        log.in_transaction = false;
        log.open.clear();
        let transactional = log.transactional;
        log.events.push(SinkEvent::Opened { transactional });
        drop(log);
        Ok((
            MemorySink {
                destination: self.clone(),
            },
            rx,
        ))
    }

    async fn ensure_progress_topic(
        &self,
        exactly_once: &ExactlyOnce,
    ) -> Result<(), StateTopicError> {
        self.log()
            .topics
            .insert(exactly_once.progress_topic.topic().to_owned());
        Ok(())
    }

    async fn committed_progress(
        &self,
        exactly_once: &ExactlyOnce,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, StateTopicError> {
        let topic = exactly_once.progress_topic.topic();
        Ok(self
            .log()
            .committed
            .iter()
            .rev()
            .find(|r| r.topic.as_ref() == topic && r.key.as_deref() == Some(key))
            .and_then(|r| r.value.as_ref().map(|v| v.to_vec())))
    }
}

/// The sink of one session on a [`MemoryDestination`].
pub struct MemorySink {
    destination: MemoryDestination,
}

/// Always reachable.
pub struct MemoryProbe;

impl Probe for MemoryProbe {
    async fn probe(&self, _timeout: Duration) -> bool {
        true
    }
}

impl Sink for MemorySink {
    type Probe = MemoryProbe;

    async fn send(&mut self, token: usize, record: &RoutedRecord) -> Result<(), SinkError> {
        let mut log = self.destination.log();
        log.topics.insert(record.topic.to_string());
        let (generation, in_transaction) = (log.generation, log.in_transaction);
        log.unreported.push_back(Taken {
            generation,
            token,
            record: record.clone(),
            in_transaction,
        });
        if !log.hold_reports {
            log.report_oldest(Ok(()));
        }
        Ok(())
    }

    fn reports_ready(&self) -> impl Future<Output = ()> + Send {
        // Reports are put on the channel as they are given.
        std::future::pending()
    }

    fn serve_reports(&self) {}

    fn refused_login(&self) -> Option<SinkError> {
        None
    }

    fn purge(&self) {
        let mut log = self.destination.log();
        log.events.push(SinkEvent::Purged);
        log.purge();
    }

    fn rebuild(&mut self) -> Result<(), SinkError> {
        let mut log = self.destination.log();
        log.purge();
        log.generation += 1;
        log.events.push(SinkEvent::Rebuilt);
        Ok(())
    }

    fn prober(&self) -> MemoryProbe {
        MemoryProbe
    }

    fn topic_creation(
        &self,
        topic: &str,
    ) -> Option<impl Future<Output = Result<(), SinkError>> + Send + 'static> {
        let mut log = self.destination.log();
        if log.topics.contains(topic) {
            return None;
        }
        log.events
            .push(SinkEvent::CreationStarted(topic.to_owned()));
        let mut held = self.destination.creations_held.subscribe();
        Some(async move {
            // The sender lives in the destination, which outlives the session.
            let _ = held.wait_for(|held| !held).await;
            Ok(())
        })
    }

    fn topic_created(&mut self, topic: &str) {
        self.destination.log().topics.insert(topic.to_owned());
    }

    fn in_flight(&self) -> usize {
        self.destination.unreported()
    }

    fn release_retired(&mut self) {}

    fn retired_unreported(&self) -> usize {
        0
    }

    async fn init_transactions(&self, _timeout: Duration) -> Result<(), SinkError> {
        let mut log = self.destination.log();
        // Fencing aborts what an older producer left open.
        log.open.clear();
        log.in_transaction = false;
        log.events.push(SinkEvent::InitTransactions);
        Ok(())
    }

    fn begin_transaction(&self) -> Result<(), SinkError> {
        let mut log = self.destination.log();
        if log.transactional {
            log.in_transaction = true;
            log.events.push(SinkEvent::Begin);
        }
        Ok(())
    }

    fn commit_transaction(
        &self,
        _timeout: Duration,
    ) -> impl Future<Output = Result<(), SinkError>> + Send + 'static {
        let destination = self.destination.clone();
        async move {
            let mut log = destination.log();
            if log.transactional {
                let open = std::mem::take(&mut log.open);
                log.events.push(SinkEvent::Commit(open.len()));
                log.committed.extend(open);
                log.in_transaction = false;
            }
            Ok(())
        }
    }

    async fn abort_transaction(&self, _timeout: Duration) -> Result<(), SinkError> {
        let mut log = self.destination.log();
        if log.transactional {
            log.open.clear();
            log.in_transaction = false;
            log.events.push(SinkEvent::Abort);
        }
        Ok(())
    }
}
