//! Sink errors.
//!
//! # Invariants
//! - A [`DeliveryError::Definite`] names what to change; retrying the same record cannot succeed.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Errors creating the producer, creating topics or enqueueing records.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The configuration is rejected; the message names the property.
    #[error("{0}")]
    Config(String),
    /// The broker is unreachable or refused a request that may succeed later.
    #[error("Kafka unavailable: {0}")]
    Transient(String),
    /// The broker refused a request for good; the message names the fix.
    #[error("{0}")]
    Definite(String),
}

impl SinkError {
    /// Whether retrying (after reconnecting) may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, SinkError::Transient(_))
    }
}

/// Why a record was not delivered.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DeliveryError {
    /// The record can never be written as it is (too large, topic refused ...).
    #[error("{0}")]
    Definite(String),
    /// The producer failed (fatal idempotence error, timeout); rebuilding it and resending can
    /// succeed.
    #[error("{0}")]
    Transient(String),
}

impl DeliveryError {
    /// Classifies a failed delivery by its librdkafka error code.
    pub fn from_kafka(topic: &str, err: &KafkaError) -> Self {
        let code = err.rdkafka_error_code();
        match code {
            Some(RDKafkaErrorCode::MessageSizeTooLarge) | Some(RDKafkaErrorCode::InvalidMessageSize) => {
                DeliveryError::Definite(format!(
                    "record for topic {topic} is larger than the broker accepts ({err}): raise the topic's max.message.bytes (and kafka.properties.\"message.max.bytes\"), or make the payload smaller"
                ))
            }
            Some(RDKafkaErrorCode::TopicAuthorizationFailed) => DeliveryError::Definite(format!(
                "the broker refused writes to topic {topic} ({err}): grant WRITE on the topic to Siphon's principal"
            )),
            Some(RDKafkaErrorCode::InvalidTopic) | Some(RDKafkaErrorCode::UnknownTopic) => DeliveryError::Definite(
                format!("the broker refused topic {topic} ({err}): check route.topic.replacement and the topic name rules"),
            ),
            Some(RDKafkaErrorCode::InvalidRecord) | Some(RDKafkaErrorCode::InvalidMessage) => {
                DeliveryError::Definite(format!("the broker rejected a record for topic {topic}: {err}"))
            }
            _ => DeliveryError::Transient(format!("delivery to topic {topic} failed: {err}")),
        }
    }
}
