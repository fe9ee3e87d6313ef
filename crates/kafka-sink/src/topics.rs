//! Creation of output topics.
//!
//! # Invariants
//! - A topic is created at most once per sink; "already exists" counts as success.
//! - A topic is only remembered as present after the broker confirmed it.

use crate::{SinkError, TopicCreation};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::types::RDKafkaErrorCode;
use rustc_hash::FxHashSet;
use std::collections::BTreeMap;
use std::time::Duration;
use tracing::info;

/// Creates topics the first time a record is sent to them.
pub struct TopicCreator {
    admin: Option<AdminClient<DefaultClientContext>>,
    settings: TopicCreation,
    known: FxHashSet<String>,
}

/// Properties that only make sense for a producer; the admin client rejects or ignores them.
fn is_producer_only(key: &str) -> bool {
    matches!(
        key,
        "partitioner"
            | "message.timeout.ms"
            | "linger.ms"
            | "queue.buffering.max.ms"
            | "enable.idempotence"
            | "acks"
            | "request.required.acks"
            | "compression.type"
            | "compression.codec"
            | "batch.size"
            | "batch.num.messages"
            | "queue.buffering.max.messages"
            | "queue.buffering.max.kbytes"
            | "retries"
            | "retry.backoff.ms"
            | "max.in.flight.requests.per.connection"
            | "max.in.flight"
            | "delivery.timeout.ms"
            | "request.timeout.ms"
            | "transactional.id"
            | "enable.gapless.guarantee"
            | "sticky.partitioning.linger.ms"
    )
}

impl TopicCreator {
    /// Builds the admin client from the producer's connection properties.
    pub fn new(
        properties: &BTreeMap<String, String>,
        settings: TopicCreation,
    ) -> Result<Self, SinkError> {
        let admin = if settings.enabled {
            let mut config = ClientConfig::new();
            for (key, value) in properties.iter().filter(|(k, _)| !is_producer_only(k)) {
                config.set(key, value);
            }
            Some(config.create().map_err(|e| {
                SinkError::Config(format!("invalid Kafka admin configuration: {e}"))
            })?)
        } else {
            None
        };
        Ok(TopicCreator {
            admin,
            settings,
            known: FxHashSet::default(),
        })
    }

    /// Makes sure `topic` exists (creating it if needed).
    pub async fn ensure(&mut self, topic: &str) -> Result<(), SinkError> {
        if self.known.contains(topic) {
            return Ok(());
        }
        let Some(admin) = &self.admin else {
            self.known.insert(topic.to_owned());
            return Ok(());
        };
        let new_topic = NewTopic::new(
            topic,
            self.settings.partitions,
            TopicReplication::Fixed(self.settings.replication_factor),
        );
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let results = admin
            .create_topics([&new_topic], &options)
            .await
            .map_err(|e| SinkError::Transient(format!("creating topic {topic}: {e}")))?;
        for result in results {
            match result {
                Ok(name) => info!(topic = %name, partitions = self.settings.partitions, replication_factor = self.settings.replication_factor, "created topic"),
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code @ (RDKafkaErrorCode::TopicAuthorizationFailed | RDKafkaErrorCode::ClusterAuthorizationFailed))) => {
                    return Err(SinkError::Definite(format!(
                        "the broker refused to create topic {name} ({code}): create it yourself, grant CREATE to Siphon's principal, or set kafka.topic_creation.enabled = false"
                    )))
                }
                Err((name, code @ (RDKafkaErrorCode::InvalidTopic | RDKafkaErrorCode::InvalidPartitions | RDKafkaErrorCode::InvalidReplicationFactor | RDKafkaErrorCode::InvalidConfig))) => {
                    return Err(SinkError::Definite(format!(
                        "the broker refused to create topic {name} ({code}): check kafka.topic_creation (partitions, replication_factor) and the topic name"
                    )))
                }
                Err((name, code)) => {
                    return Err(SinkError::Transient(format!("creating topic {name}: {code}")))
                }
            }
        }
        self.known.insert(topic.to_owned());
        Ok(())
    }
}
