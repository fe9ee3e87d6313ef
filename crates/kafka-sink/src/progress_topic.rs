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
//! - Progress records are written to [`crate::OWN_PARTITION`] (by the session, which builds them), so
//!   partitions added to the topic never move a key; the reader takes the key's last record in
//!   that partition, and looks at the others only when it has none (see `crate::compacted`).
//! - Reading takes time in proportion to the records written since the key's last record, not
//!   to the topic's size: it reads backwards from the end in growing windows.
//! - The topic is created compacted, with one partition, when topic creation is on ("already
//!   exists" is success); otherwise a missing topic is an error naming the fix.
//! - Every call is bounded by [`STATE_TIMEOUT`] and runs off the async runtime's threads.

use crate::compacted::{
    reading_order, CompactedTopic, Reader, StateOperation, StateTopicError, STATE_TIMEOUT,
};
use crate::TopicCreation;
use rdkafka::consumer::Consumer;
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
    compacted: CompactedTopic,
}

impl ProgressTopic {
    /// The progress topic `topic`, reached with the sink's client properties.
    pub fn new(
        topic: &str,
        client_properties: &BTreeMap<String, String>,
        creation: TopicCreation,
    ) -> Self {
        ProgressTopic {
            compacted: CompactedTopic::new(topic, client_properties, creation),
        }
    }

    /// The topic's name.
    pub fn topic(&self) -> &str {
        &self.compacted.topic
    }

    /// Creates the topic (compacted, one partition) unless it exists; with topic creation off,
    /// a missing topic is [`StateTopicError::Missing`].
    pub async fn ensure(&self) -> Result<(), StateTopicError> {
        let compacted = &self.compacted;
        let ensured = if compacted.creation.enabled {
            // Compaction keeps one record per source; short segments let it run soon.
            compacted
                .create(&[("segment.ms", "600000")], "progress")
                .await
        } else {
            compacted
                .exists()
                .await
                .and_then(|exists| exists.then_some(()).ok_or_else(|| compacted.missing()))
        };
        compacted.settled(ensured)
    }

    /// The value of the last committed record with `key` (see the module's invariants);
    /// `None` when there is none, or the topic does not exist.
    pub async fn read_committed(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateTopicError> {
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

    fn read_blocking(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateTopicError> {
        let compacted = &self.compacted;
        let deadline = Instant::now() + STATE_TIMEOUT;
        let consumer = compacted.consumer(&[
            ("enable.partition.eof", "true"),
            ("isolation.level", "read_committed"),
        ])?;
        let Some(partitions) = compacted.partitions(&consumer, STATE_TIMEOUT)? else {
            return Ok(None);
        };
        // The own partition first: its record of the key is the newest. The others hold only
        // records a partitioner placed.
        for partition in reading_order(partitions) {
            let (low, high) = consumer
                .fetch_watermarks(&compacted.topic, partition, left(deadline))
                .map_err(|e| compacted.kafka(StateOperation::Read, &e))?;
            let mut end = high;
            let mut window = FIRST_WINDOW;
            while end > low {
                let from = (end - window).max(low);
                let range = (from, end);
                if let Some(value) = self.read_range(&consumer, partition, range, key, deadline)? {
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
        consumer: &Reader,
        partition: i32,
        (from, end): (i64, i64),
        key: &[u8],
        deadline: Instant,
    ) -> Result<Option<Option<Vec<u8>>>, StateTopicError> {
        let compacted = &self.compacted;
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(&compacted.topic, partition, Offset::Offset(from))
            .map_err(|e| compacted.kafka(StateOperation::Read, &e))?;
        consumer
            .assign(&assignment)
            .map_err(|e| compacted.kafka(StateOperation::Read, &e))?;
        let mut found = None;
        loop {
            if left(deadline).is_zero() {
                return Err(compacted.timed_out(StateOperation::Read));
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
                Some(Err(e)) => return Err(compacted.kafka(StateOperation::Read, &e)),
            }
        }
    }

    fn position(&self, consumer: &Reader, partition: i32) -> Result<i64, StateTopicError> {
        let positions = consumer
            .position()
            .map_err(|e| self.compacted.kafka(StateOperation::Read, &e))?;
        Ok(positions
            .find_partition(&self.compacted.topic, partition)
            .and_then(|p| p.offset().to_raw())
            .unwrap_or(-1))
    }
}

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}
