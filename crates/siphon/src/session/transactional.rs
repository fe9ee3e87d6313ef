//! Exactly-once delivery's IO at the start of a session: the transactional producer, fenced
//! and registered, and the last committed progress read back.
//!
//! # Invariants
//! - The producer is registered with `init_transactions` only after the session holds the slot
//!   (its replication stream started): a second instance cannot take the slot while this one
//!   streams, and a zombie that lost it is fenced here, its open transaction aborted, before
//!   the progress is read.
//! - The progress is read `read_committed` after that registration, so it names the last
//!   record of the last committed Kafka transaction of this source: the session skips every
//!   record at or before it.
//! - A progress written on another timeline is used only as far as the current timeline's
//!   history says its positions name the same transactions
//!   ([`crate::progress_record::usable_on`]); the history is asked for only then.
//! - Nothing here is retried in place: a failure ends the session (with the supervisor's
//!   backoff), and the next one starts over with a new producer.

use super::sink::{Destination, Sink as _};
use super::{ExactlyOnce, PipelineSettings};
use crate::error::PipelineError;
use crate::progress_record::{self, OnTimeline, Recorded};
use bytes::Bytes;
use pgoutput::Lsn;
use siphon_core::exactly_once::{KafkaTransactions, Progress};
use siphon_kafka_sink::{Delivery, DeliveryObserver};
use siphon_router::RoutedRecord;
use siphon_source::ServerIdentity;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{info, warn};

/// The token of the progress record's delivery report: never a record's (the ledger numbers
/// records from 0 up).
pub const PROGRESS_TOKEN: usize = usize::MAX;

/// How long registering the producer may take (the coordinator may be loading its log).
const INIT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long aborting the open transaction at a session's failed end may take.
pub const ABORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The identity of a source in the progress topic.
#[derive(Debug, Clone)]
pub struct Source {
    /// `<system identifier>/<slot>`.
    pub name: String,
    pub database: String,
    pub timeline: u32,
    /// The progress record's key.
    pub key: String,
    /// The progress topic, which every progress record shares.
    pub progress_topic: Arc<str>,
    pub transactional_id: String,
}

impl Source {
    /// The source of `settings` on `server`.
    pub fn new(
        settings: &PipelineSettings,
        exactly_once: &ExactlyOnce,
        server: Option<&ServerIdentity>,
    ) -> Result<Self, PipelineError> {
        let database = siphon_source::ConnectionParams::from_url(&settings.source.url)?.database;
        let (system_id, timeline) = server
            .map(|s| (s.system_id.clone(), s.timeline))
            .unwrap_or_else(|| ("unknown".to_owned(), 0));
        let slot = &settings.source.slot;
        Ok(Source {
            name: format!("{system_id}/{slot}"),
            key: progress_record::key(&system_id, &database, slot),
            transactional_id: exactly_once
                .transactional_id
                .clone()
                .unwrap_or_else(|| progress_record::transactional_id(&system_id, &database, slot)),
            progress_topic: Arc::from(exactly_once.progress_topic.topic()),
            database,
            timeline,
        })
    }

    /// The record that commits `progress` in the open Kafka transaction.
    pub fn progress_record(&self, progress: &Progress) -> RoutedRecord {
        let recorded = Recorded::new(&self.name, &self.database, self.timeline, progress);
        RoutedRecord {
            topic: Arc::clone(&self.progress_topic),
            key: Some(Bytes::from(self.key.clone())),
            value: Some(Bytes::from(recorded.to_json())),
            headers: Vec::new(),
            timestamp_ms: None,
            // Never moved by partitions added to the topic (see siphon_kafka_sink::compacted).
            partition: Some(siphon_kafka_sink::OWN_PARTITION),
        }
    }
}

/// A transactional producer ready for the session, and where its source stands.
pub struct Opened<S> {
    pub sink: S,
    pub deliveries: mpsc::UnboundedReceiver<Delivery>,
    pub transactions: KafkaTransactions,
    pub source: Source,
}

/// The transactional producer of `source` on `destination`, registered with its coordinator
/// (fencing older producers with its id and aborting what they left open), the progress topic
/// made sure of (its records never wait for a creation); and its delivery channel. Both the
/// stream and the exactly-once snapshot register through here.
pub async fn register<D: Destination>(
    destination: &D,
    settings: &PipelineSettings,
    exactly_once: &ExactlyOnce,
    source: &Source,
    observer: Option<Arc<dyn DeliveryObserver>>,
) -> Result<(D::Sink, mpsc::UnboundedReceiver<Delivery>), PipelineError> {
    destination
        .ensure_progress_topic(exactly_once)
        .await
        .map_err(PipelineError::ProgressTopic)?;
    let mut config = settings.sink.clone();
    config.transactional_id = Some(source.transactional_id.clone());
    let (mut sink, deliveries) = destination.open(&config, observer)?;
    sink.topic_created(exactly_once.progress_topic.topic());
    sink.init_transactions(INIT_TIMEOUT).await?;
    Ok((sink, deliveries))
}

/// Creates the transactional producer of `source`, registers it (fencing older instances),
/// and reads the last committed progress; the session streams from `endpoint`, starting at
/// `start`.
pub async fn open<D: Destination>(
    destination: &D,
    settings: &PipelineSettings,
    exactly_once: &ExactlyOnce,
    source: Source,
    endpoint: &siphon_source::Endpoint,
    start: Lsn,
    observer: Arc<dyn DeliveryObserver>,
) -> Result<Opened<D::Sink>, PipelineError> {
    let (sink, deliveries) =
        register(destination, settings, exactly_once, &source, Some(observer)).await?;
    let value = destination
        .committed_progress(exactly_once, source.key.as_bytes())
        .await
        .map_err(PipelineError::ProgressTopic)?;
    let recorded = match value {
        Some(value) => Some(Recorded::parse(&source.key, &value)?),
        None => None,
    };
    let progress = match &recorded {
        None => {
            info!(transactional_id = %source.transactional_id, "exactly-once delivery: no progress committed yet for this source");
            None
        }
        Some(recorded) => {
            // Another timeline's progress: how far the current one continues it.
            let history = if recorded.timeline == source.timeline {
                None
            } else {
                siphon_source::timeline::timeline_history(
                    &settings.source,
                    endpoint,
                    source.timeline,
                )
                .await?
            };
            match recorded.progress_on(source.timeline, history.as_ref()) {
                OnTimeline::Same(progress) => {
                    info!(transactional_id = %source.transactional_id, progress = %recorded, "exactly-once delivery: resuming after the last committed progress");
                    Some(progress)
                }
                OnTimeline::Earlier {
                    progress,
                    switchpoint,
                    capped,
                } => {
                    info!(transactional_id = %source.transactional_id, progress = %recorded, recorded_on = recorded.timeline, timeline = source.timeline, %switchpoint, capped, "exactly-once delivery: resuming after the last committed progress, written on an earlier timeline of this one (a failover), as far as the two share their WAL");
                    Some(progress)
                }
                OnTimeline::Unrelated => {
                    warn!(progress = %recorded, recorded_on = recorded.timeline, timeline = source.timeline, history_known = history.is_some(), "the last committed progress was written on a timeline the server's timeline history does not continue: resuming from the slot's position; events after it may be sent again");
                    None
                }
            }
        }
    };
    let transactions = KafkaTransactions::new(exactly_once.bounds, start, progress);
    Ok(Opened {
        sink,
        deliveries,
        transactions,
        source,
    })
}
