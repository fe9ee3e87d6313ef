//! What the state topic and the progress topic share: a compacted topic of Siphon's own,
//! reached with the sink's connection properties, created compacted with one partition, and
//! its failures typed by operation and librdkafka code.
//!
//! # Invariants
//! - Clients built here carry the connection properties only (no producer settings): a
//!   transactional id never reaches a consumer or an admin client.
//! - Every failure carries the librdkafka code and the operation; a timeout code is
//!   [`StateTopicError::TimedOut`]; none is classified by its text.

use crate::state_topic::{StateOperation, StateTopicError, STATE_TIMEOUT};
use crate::topics::is_producer_only;
use crate::TopicCreation;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use std::collections::BTreeMap;
use std::time::Duration;

/// A compacted topic of Siphon's own.
#[derive(Debug, Clone)]
pub(crate) struct CompactedTopic {
    pub(crate) topic: String,
    /// Connection properties (bootstrap servers, security), without producer-only ones.
    pub(crate) connection: BTreeMap<String, String>,
    pub(crate) creation: TopicCreation,
}

impl CompactedTopic {
    /// `topic`, reached with the sink's client properties.
    pub(crate) fn new(
        topic: &str,
        client_properties: &BTreeMap<String, String>,
        creation: TopicCreation,
    ) -> Self {
        CompactedTopic {
            topic: topic.to_owned(),
            connection: client_properties
                .iter()
                .filter(|(k, _)| !is_producer_only(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            creation,
        }
    }

    /// Creates the topic, compacted with one partition and `configs`, unless it exists.
    pub(crate) async fn create(
        &self,
        configs: &[(&str, &str)],
        what: &str,
    ) -> Result<(), StateTopicError> {
        let admin: AdminClient<DefaultClientContext> =
            self.client(&self.connection, StateOperation::Create)?;
        let mut topic = NewTopic::new(
            &self.topic,
            1,
            TopicReplication::Fixed(self.creation.replication_factor),
        )
        .set("cleanup.policy", "compact");
        for (key, value) in configs {
            topic = topic.set(key, value);
        }
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
                    tracing::info!(topic = %self.topic, "created the {what} topic (compacted, one partition)")
                }
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) => return Err(self.failed(StateOperation::Create, code)),
            }
        }
        Ok(())
    }

    /// Whether the topic exists, asked on a blocking thread.
    pub(crate) async fn exists(&self) -> Result<bool, StateTopicError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let consumer = this.consumer(&[])?;
            Ok(this.partitions(&consumer, STATE_TIMEOUT)?.is_some())
        })
        .await
        .unwrap_or_else(|_| Err(self.failed(StateOperation::Read, RDKafkaErrorCode::Fail)))
    }

    /// A consumer of assigned partitions only (it never joins its group nor commits, and its
    /// metadata requests never create the topic), with `extra` properties.
    pub(crate) fn consumer(&self, extra: &[(&str, &str)]) -> Result<BaseConsumer, StateTopicError> {
        let mut properties = self.connection.clone();
        properties.insert("enable.auto.commit".into(), "false".into());
        properties.insert("enable.partition.eof".into(), "false".into());
        properties.insert("allow.auto.create.topics".into(), "false".into());
        properties.insert("group.id".into(), "siphon-state-reader".into());
        for (key, value) in extra {
            properties.insert((*key).into(), (*value).into());
        }
        self.client(&properties, StateOperation::Read)
    }

    /// The topic's partitions, `None` when it does not exist.
    pub(crate) fn partitions(
        &self,
        consumer: &BaseConsumer,
        timeout: Duration,
    ) -> Result<Option<Vec<i32>>, StateTopicError> {
        let metadata = consumer
            .fetch_metadata(Some(&self.topic), timeout)
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

    pub(crate) fn client<C: rdkafka::config::FromClientConfig>(
        &self,
        properties: &BTreeMap<String, String>,
        operation: StateOperation,
    ) -> Result<C, StateTopicError> {
        let mut config = ClientConfig::new();
        for (key, value) in properties {
            config.set(key, value);
        }
        // Only properties librdkafka refuses fail here.
        config
            .create()
            .map_err(|_| self.failed(operation, RDKafkaErrorCode::InvalidArgument))
    }

    pub(crate) fn kafka(&self, operation: StateOperation, error: &KafkaError) -> StateTopicError {
        self.failed(
            operation,
            error.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail),
        )
    }

    pub(crate) fn failed(
        &self,
        operation: StateOperation,
        code: RDKafkaErrorCode,
    ) -> StateTopicError {
        if code == RDKafkaErrorCode::OperationTimedOut || code == RDKafkaErrorCode::MessageTimedOut
        {
            return self.timed_out(operation);
        }
        StateTopicError::Kafka {
            topic: self.topic.clone(),
            operation,
            code,
        }
    }

    pub(crate) fn timed_out(&self, operation: StateOperation) -> StateTopicError {
        StateTopicError::TimedOut {
            topic: self.topic.clone(),
            operation,
        }
    }

    /// The topic is missing and may not be created.
    pub(crate) fn missing(&self) -> StateTopicError {
        StateTopicError::Missing {
            topic: self.topic.clone(),
        }
    }
}
