//! Why an initial snapshot or a re-send stopped.
//!
//! # Invariants
//! - Below the transfers and the pipeline's errors (which carry it): it imports neither.

use crate::record_fault::RecordFault;
use crate::row_fault::RowFault;
use siphon_kafka_sink::{DeliveryError, SinkError, StateTopicError};
use siphon_router::RouteError;
use siphon_source::{SourceError, TableName};

/// The format of a transfer's progress record; a record of another version is refused.
pub const PROGRESS_VERSION: u32 = 1;

/// Why a snapshot or a re-send stopped.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// Reading the rows.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Creating the producer or a topic, or enqueueing a record.
    #[error(transparent)]
    Sink(#[from] SinkError),
    /// Kafka did not take a record (it is sent again when the transfer resumes).
    #[error("a record for topic {topic} was not delivered: {error}")]
    Delivery {
        topic: String,
        error: Box<DeliveryError>,
    },
    /// A record Kafka refuses for its own sake, with `pipeline.on_error = "fail"`.
    #[error("Kafka refused a record for topic {topic}: {fault} (fix it, or set pipeline.on_error = \"dead-letter\")")]
    Refused {
        topic: String,
        fault: Box<RecordFault>,
    },
    /// Exactly-once, with `pipeline.on_error = "dead-letter"`: the broker refused a record for
    /// its own sake, which aborted the Kafka transaction it was sent in. The record is a
    /// suspect: the transfer runs again from its last committed progress, the suspect alone in
    /// a transaction of its own, dead-lettered if refused alone.
    #[error("Kafka refused a record for topic {topic} in a Kafka transaction, which is aborted: {fault}; sending again from the last committed progress, the record alone (dead-lettered if refused again)")]
    Aborted {
        topic: String,
        fault: Box<RecordFault>,
    },
    /// Even the dead-letter topic refused a record.
    #[error("the dead-letter topic refused a record: {0}")]
    DeadLetterRefused(Box<RecordFault>),
    /// A row not sent as its record (`pipeline.on_error = "fail"`, or a registry that refuses
    /// Siphon).
    #[error("{fault}; a row of {table} with key {key:?} was not sent")]
    Row {
        table: TableName,
        key: Vec<String>,
        fault: RowFault,
    },
    /// The table's columns do not fit the router's options.
    #[error("{0}")]
    Unbindable(Box<RouteError>),
    /// Reading or writing the progress in the state topic (or, exactly-once, the progress
    /// topic).
    #[error("a transfer's progress: {0}")]
    State(#[from] StateTopicError),
    /// The progress record in the state topic (or the progress topic) cannot be read.
    #[error("the progress record {key} in topic {topic} cannot be read ({source}); delete it (a tombstone) to start over")]
    Unreadable {
        topic: String,
        key: String,
        #[source]
        source: serde_json::Error,
    },
    /// The progress record in the state topic (or the progress topic) is of another format
    /// version.
    #[error("the progress record {key} in topic {topic} has format version {version}, this Siphon reads {PROGRESS_VERSION}: use the Siphon version that wrote it")]
    Version {
        topic: String,
        key: String,
        version: u32,
    },
    /// The producer's delivery reports stopped coming (it was dropped), or a progress write
    /// task was lost: a bug.
    #[error("internal error: the transfer's producer or progress writer stopped")]
    ReportsLost,
    /// Progress is kept in the state topic, and there is none.
    #[error("kafka.state_topic = \"\": {what} keeps its progress in the state topic; set kafka.state_topic")]
    NoStateTopic { what: &'static str },
}
