//! The Kafka sink: an idempotent (or transactional) producer, per-record delivery reports and topic creation.
//!
//! - [`config`] holds the user-facing `[kafka]` settings and the producer defaults Siphon needs.
//! - [`producer`] sends [`siphon_record::RoutedRecord`]s and reports each delivery on a channel
//!   (or, for measurements, acknowledges them without sending).
//! - [`topics`] creates output topics the broker does not have yet.
//! - [`state_topic`] and [`progress_topic`] keep what Siphon must know across restarts; the
//!   progress topic is written in the producer's Kafka transactions (exactly-once delivery).
//!
//! # Invariants
//! - Every record handed to [`KafkaSink::send`] produces exactly one [`Delivery`] on the
//!   delivery channel, carrying the caller's token, unless the sink is dropped first.
//! - Records sent to one partition are written in the order they were sent (idempotent producer).

mod compacted;
pub mod config;
pub mod error;
mod login;
mod produce;
pub mod producer;
pub mod progress_topic;
pub mod state_topic;
pub mod statistics;
pub mod topics;
mod wakeup;

pub use compacted::OWN_PARTITION;
pub use config::{ConfigReason, SinkConfig, SinkConfigError, TopicCreation};
pub use error::{
    DeliveryConsequence, DeliveryError, ProducerFailure, Refusal, SinkError, SinkOperation,
};
pub use producer::{
    AckCounter, BrokerProbe, Delivered, Delivery, DeliveryFailure, DeliveryObserver, KafkaSink,
    Rebuilt, RetiredStatus,
};
pub use progress_topic::ProgressTopic;
pub use rdkafka::error::RDKafkaErrorCode;
pub use state_topic::{StateOperation, StateTopic, StateTopicError};
pub use statistics::{BrokerLatencies, ProducerStage, StageLatency};
pub use wakeup::{OsError, WakeupError};
