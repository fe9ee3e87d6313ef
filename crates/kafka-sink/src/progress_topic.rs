//! The progress topic of exactly-once delivery: a compacted topic where each Kafka transaction
//! of a source ends with a progress record (its key names the source), written by the
//! transactional producer in the same transaction.
//!
//! # Invariants
//! - [`ProgressTopic::read_committed`] returns the value of the last *committed* record with
//!   the key among every record written before the call began: it reads `read_committed` up
//!   to the high watermark it found first (waiting, within [`STATE_TIMEOUT`], for open
//!   transactions of other sources below it to end), so a committed progress is never missed
//!   behind another source's open transaction, and an aborted one is never seen.
//! - Reading takes time in proportion to the records written since the key's last record, not
//!   to the topic's size: it reads backwards from the end in growing windows.
//! - The topic is created compacted, with one partition, when topic creation is on ("already
//!   exists" is success); otherwise a missing topic is an error naming the fix.
//! - Every call is bounded by [`STATE_TIMEOUT`] and runs off the async runtime's threads.

use crate::state_topic::{StateOperation, StateTopicError, STATE_TIMEOUT};
use crate::topics::is_producer_only;
use crate::TopicCreation;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The first window read back from the end of a partition; each next one is eight times
/// larger.
const FIRST_WINDOW: i64 = 256;

/// The progress topic of one Siphon configuration.
#[derive(Debug, Clone)]
pub struct ProgressTopic {
    topic: String,
    /// Connection properties (bootstrap servers, security), without producer-only ones.
    connection: BTreeMap<String, String>,
    creation: TopicCreation,
}

impl ProgressTopic {
    /// The progress topic `topic`, reached with the sink's client properties.
    pub fn new(
        topic: &str,
        client_properties: &BTreeMap<String, String>,
        creation: TopicCreation,
    ) -> Self {
        let connection = client_properties
            .iter()
            .filter(|(k, _)| !is_producer_only(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        ProgressTopic {
            topic: topic.to_owned(),
            connection,
            creation,
        }
    }

    /// The topic's name.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Creates the topic (compacted, one partition) unless it exists; with topic creation off,
    /// a missing topic is [`StateTopicError::Missing`].
    pub async fn ensure(&self) -> Result<(), StateTopicError> {
        let this = self.clone();
        if !self.creation.enabled {
            let exists = tokio::task::spawn_blocking(move || this.exists_blocking())
                .await
                .unwrap_or_else(|_| {
                    Err(self.failed(StateOperation::Read, RDKafkaErrorCode::Fail))
                })?;
            return if exists {
                Ok(())
            } else {
                Err(StateTopicError::Missing {
                    topic: self.topic.clone(),
                })
            };
        }
        let admin: AdminClient<DefaultClientContext> =
            self.client(&self.connection, StateOperation::Create)?;
        // Compaction keeps one record per source; short segments let it run soon.
        let topic = NewTopic::new(
            &self.topic,
            1,
            TopicReplication::Fixed(self.creation.replication_factor),
        )
        .set("cleanup.policy", "compact")
        .set("segment.ms", "600000");
        let options = AdminOptions::new()
            .request_timeout(Some(STATE_TIMEOUT))
            .operation_timeout(Some(STATE_TIMEOUT));
        let results = admin
            .create_topics([&topic], &options)
            .await
            .map_err(|e| self.kafka(StateOperation::Create, &e))?;
        for result in results {
            match result {
                Ok(_) => {
                    tracing::info!(topic = %self.topic, "created the progress topic (compacted, one partition)")
                }
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) => return Err(self.failed(StateOperation::Create, code)),
            }
        }
        Ok(())
    }

    /// The value of the last committed record with `key` (see the module's invariants);
    /// `None` when there is none, or the topic does not exist.
    pub async fn read_committed(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateTopicError> {
        let this = self.clone();
        let key = key.to_vec();
        tokio::task::spawn_blocking(move || this.read_blocking(&key))
            .await
            .unwrap_or_else(|_| Err(self.failed(StateOperation::Read, RDKafkaErrorCode::Fail)))
    }

    fn consumer(&self) -> Result<BaseConsumer, StateTopicError> {
        let mut properties = self.connection.clone();
        properties.insert("enable.auto.commit".into(), "false".into());
        properties.insert("enable.partition.eof".into(), "true".into());
        properties.insert("allow.auto.create.topics".into(), "false".into());
        properties.insert("isolation.level".into(), "read_committed".into());
        properties.insert("group.id".into(), "siphon-progress-reader".into());
        self.client(&properties, StateOperation::Read)
    }

    fn partitions(&self, consumer: &BaseConsumer) -> Result<Option<Vec<i32>>, StateTopicError> {
        let metadata = consumer
            .fetch_metadata(Some(&self.topic), STATE_TIMEOUT)
            .map_err(|e| self.kafka(StateOperation::Read, &e))?;
        let Some(topic) = metadata.topics().iter().find(|t| t.name() == self.topic) else {
            return Ok(None);
        };
        match topic.error().map(RDKafkaErrorCode::from) {
            None => Ok(Some(topic.partitions().iter().map(|p| p.id()).collect())),
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) => Ok(None),
            Some(code) => Err(self.failed(StateOperation::Read, code)),
        }
    }

    fn exists_blocking(&self) -> Result<bool, StateTopicError> {
        let consumer = self.consumer()?;
        Ok(self.partitions(&consumer)?.is_some())
    }

    fn read_blocking(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateTopicError> {
        let deadline = Instant::now() + STATE_TIMEOUT;
        let consumer = self.consumer()?;
        let Some(partitions) = self.partitions(&consumer)? else {
            return Ok(None);
        };
        // The key lands in one partition; which one depends on the writer's partitioner, so a
        // topic created with more than one is searched whole (the first with the key wins).
        for partition in partitions {
            let (low, high) = consumer
                .fetch_watermarks(&self.topic, partition, left(deadline))
                .map_err(|e| self.kafka(StateOperation::Read, &e))?;
            let mut end = high;
            let mut window = FIRST_WINDOW;
            while end > low {
                let from = (end - window).max(low);
                if let Some(value) =
                    self.read_range(&consumer, partition, from, end, key, deadline)?
                {
                    return Ok(value);
                }
                end = from;
                window = window.saturating_mul(8);
            }
        }
        Ok(None)
    }

    /// The last committed record with `key` among the offsets `from..end` of `partition`:
    /// `Some(value)` (a tombstone's value is `None`), or `None` when the range has none.
    fn read_range(
        &self,
        consumer: &BaseConsumer,
        partition: i32,
        from: i64,
        end: i64,
        key: &[u8],
        deadline: Instant,
    ) -> Result<Option<Option<Vec<u8>>>, StateTopicError> {
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(&self.topic, partition, Offset::Offset(from))
            .map_err(|e| self.kafka(StateOperation::Read, &e))?;
        consumer
            .assign(&assignment)
            .map_err(|e| self.kafka(StateOperation::Read, &e))?;
        let mut found = None;
        loop {
            if left(deadline).is_zero() {
                return Err(StateTopicError::TimedOut {
                    topic: self.topic.clone(),
                    operation: StateOperation::Read,
                });
            }
            match consumer.poll(left(deadline).min(Duration::from_millis(200))) {
                None => {}
                Some(Ok(message)) => {
                    if message.offset() < end && message.key() == Some(key) {
                        found = Some(message.payload().map(<[u8]>::to_vec));
                    }
                    if message.offset() + 1 >= end {
                        return Ok(found);
                    }
                }
                // The end of what read_committed may see now: done once it is past `end`
                // (transaction markers and aborted records take offsets too); otherwise
                // another source's transaction is still open below it.
                Some(Err(KafkaError::PartitionEOF(_)))
                    if self.position(consumer, partition)? >= end =>
                {
                    return Ok(found);
                }
                Some(Err(KafkaError::PartitionEOF(_))) => {}
                Some(Err(e)) => return Err(self.kafka(StateOperation::Read, &e)),
            }
        }
    }

    fn position(&self, consumer: &BaseConsumer, partition: i32) -> Result<i64, StateTopicError> {
        let positions = consumer
            .position()
            .map_err(|e| self.kafka(StateOperation::Read, &e))?;
        Ok(positions
            .find_partition(&self.topic, partition)
            .and_then(|p| p.offset().to_raw())
            .unwrap_or(-1))
    }

    fn client<C: rdkafka::config::FromClientConfig>(
        &self,
        properties: &BTreeMap<String, String>,
        operation: StateOperation,
    ) -> Result<C, StateTopicError> {
        let mut config = ClientConfig::new();
        for (key, value) in properties {
            config.set(key, value);
        }
        config
            .create()
            .map_err(|_| self.failed(operation, RDKafkaErrorCode::InvalidArgument))
    }

    fn kafka(&self, operation: StateOperation, error: &KafkaError) -> StateTopicError {
        self.failed(
            operation,
            error.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail),
        )
    }

    fn failed(&self, operation: StateOperation, code: RDKafkaErrorCode) -> StateTopicError {
        if code == RDKafkaErrorCode::OperationTimedOut || code == RDKafkaErrorCode::MessageTimedOut
        {
            return StateTopicError::TimedOut {
                topic: self.topic.clone(),
                operation,
            };
        }
        StateTopicError::Kafka {
            topic: self.topic.clone(),
            operation,
            code,
        }
    }
}

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}
