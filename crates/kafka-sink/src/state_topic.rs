//! A compacted topic where Siphon keeps what it must know across restarts: one record per key,
//! the last one wins (Kafka's log compaction keeps it).
//!
//! # Invariants
//! - [`StateTopic::read`] returns the value of the last record with the key among every record
//!   written before the call began (it reads each partition up to the high watermark it found
//!   first); a record without a value (a tombstone) reads as `None`.
//! - Records are written to [`OWN_PARTITION`], so partitions added to the topic never move a
//!   key; the reader takes the key's last record in that partition, and a record in another
//!   only when it has none (see `crate::compacted`).
//! - [`StateTopic::write`] returns only after the broker acknowledged the record (idempotent,
//!   `acks=all`), so a later [`StateTopic::read`] sees it.
//! - The topic is created compacted, with one partition, the first time a record is written to
//!   it (when topic creation is on); "already exists" is success.
//! - Every call is bounded by [`STATE_TIMEOUT`] and runs off the async runtime's threads.
//! - Errors carry the librdkafka code and the operation; none is classified by its text.

use crate::compacted::{reading_order, CompactedTopic, TopicClientContext, OWN_PARTITION};
pub use crate::compacted::{StateOperation, StateTopicError, STATE_TIMEOUT};
use crate::TopicCreation;
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The state topic of one Siphon configuration.
#[derive(Debug, Clone)]
pub struct StateTopic {
    compacted: CompactedTopic,
    /// The producer's properties (idempotent, `acks=all`).
    producer: BTreeMap<String, String>,
}

impl StateTopic {
    /// The state topic `topic`, reached with the sink's client properties
    /// ([`crate::SinkConfig::client_properties`]).
    pub fn new(
        topic: &str,
        client_properties: &BTreeMap<String, String>,
        creation: TopicCreation,
    ) -> Self {
        let mut producer = client_properties.clone();
        // A state record is written alone and waited for: a bounded wait, no batching.
        producer.insert(
            "message.timeout.ms".into(),
            STATE_TIMEOUT.as_millis().to_string(),
        );
        producer.insert("linger.ms".into(), "0".into());
        producer.remove("transactional.id");
        // The topic is created compacted (or found) before each write: a broker's
        // auto-creation would make it as an ordinary topic.
        producer.insert("allow.auto.create.topics".into(), "false".into());
        StateTopic {
            compacted: CompactedTopic::new(topic, client_properties, creation),
            producer,
        }
    }

    /// The topic's name.
    pub fn topic(&self) -> &str {
        &self.compacted.topic
    }

    /// The value of the last record with `key` (see the module's invariants); `None` when there
    /// is none, or the topic does not exist yet.
    pub async fn read(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateTopicError> {
        let this = self.clone();
        let key = key.to_vec();
        let read = tokio::task::spawn_blocking(move || this.read_blocking(&key))
            .await
            .unwrap_or_else(|_| {
                Err(self
                    .compacted
                    .failed(StateOperation::Read, RDKafkaErrorCode::Fail))
            });
        self.compacted.settled(read)
    }

    /// Writes `value` under `key` and waits for the broker's acknowledgement, creating the topic
    /// first when it is missing.
    pub async fn write(&self, key: &[u8], value: &[u8]) -> Result<(), StateTopicError> {
        let written = self.write_once(key, value).await;
        self.compacted.settled(written)
    }

    async fn write_once(&self, key: &[u8], value: &[u8]) -> Result<(), StateTopicError> {
        let compacted = &self.compacted;
        if compacted.creation.enabled {
            compacted.create(&[], "state").await?;
        } else if !compacted.exists().await? {
            // A broker's auto-creation would make a topic that is not compacted.
            return Err(compacted.missing());
        }
        let producer: FutureProducer<TopicClientContext> =
            compacted.client(&self.producer, StateOperation::Write)?;
        let record = FutureRecord::to(&compacted.topic)
            .partition(OWN_PARTITION)
            .key(key)
            .payload(value);
        let sent = tokio::time::timeout(STATE_TIMEOUT, producer.send(record, STATE_TIMEOUT))
            .await
            .map_err(|_| compacted.timed_out(StateOperation::Write))?;
        match sent {
            Ok(_) => Ok(()),
            Err((error, _)) => Err(compacted.kafka(StateOperation::Write, &error)),
        }
    }

    fn read_blocking(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateTopicError> {
        let compacted = &self.compacted;
        let topic = compacted.topic.as_str();
        let deadline = Instant::now() + STATE_TIMEOUT;
        let left = || deadline.saturating_duration_since(Instant::now());
        let consumer = compacted.consumer(&[])?;
        let Some(partitions) = compacted.partitions(&consumer, left())? else {
            return Ok(None);
        };
        // Each partition up to its high watermark as it is now.
        let mut ends = BTreeMap::new();
        let mut assignment = TopicPartitionList::new();
        for partition in partitions {
            let (low, high) = consumer
                .fetch_watermarks(topic, partition, left())
                .map_err(|e| compacted.kafka(StateOperation::Read, &e))?;
            if high > low {
                ends.insert(partition, high);
                assignment
                    .add_partition_offset(topic, partition, Offset::Offset(low))
                    .map_err(|e| compacted.kafka(StateOperation::Read, &e))?;
            }
        }
        if ends.is_empty() {
            return Ok(None);
        }
        consumer
            .assign(&assignment)
            .map_err(|e| compacted.kafka(StateOperation::Read, &e))?;
        // Within a partition the last record wins; the own partition's wins over the others'.
        let mut values: BTreeMap<i32, Option<Vec<u8>>> = BTreeMap::new();
        while !ends.is_empty() {
            if left().is_zero() {
                return Err(compacted.timed_out(StateOperation::Read));
            }
            let Some(polled) = consumer.poll(left().min(Duration::from_millis(500))) else {
                continue;
            };
            let message = polled.map_err(|e| compacted.kafka(StateOperation::Read, &e))?;
            if message.key() == Some(key) {
                values.insert(message.partition(), message.payload().map(<[u8]>::to_vec));
            }
            if ends
                .get(&message.partition())
                .is_some_and(|end| message.offset() + 1 >= *end)
            {
                ends.remove(&message.partition());
            }
        }
        let partitions = reading_order(values.keys().copied().collect());
        Ok(partitions
            .first()
            .and_then(|partition| values.remove(partition))
            .flatten())
    }
}
