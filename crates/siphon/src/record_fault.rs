//! A record Kafka will not take as it is: the one judgement of whether a failure is the
//! record's own fault, which `pipeline.on_error` then decides, shared by the stream and the
//! transfers (snapshots and re-sends).
//!
//! # Invariants
//! - A failure is the record's fault only when the sink says so: an enqueue error that
//!   [`SinkError::refuses_record`], or a definite delivery refusal that
//!   [`Refusal::on_error_applies`]. Anything else is the operator's to fix, or transient.

use siphon_kafka_sink::{DeliveryError, Refusal, SinkError};
use std::fmt;

/// A record Kafka will not take as it is.
#[derive(Debug, Clone)]
pub enum RecordFault {
    /// The broker refused it (delivery report).
    Broker(Refusal),
    /// The producer refused to enqueue it (too large for `message.max.bytes` ...), or the broker
    /// refused to create its topic ([`SinkError::refuses_record`]): the producer's error.
    Enqueue(SinkError),
}

impl RecordFault {
    /// The record's fault in an enqueue error, or the error when it is not the record's.
    pub fn of_enqueue(error: SinkError) -> Result<Self, SinkError> {
        if error.refuses_record() {
            Ok(RecordFault::Enqueue(error))
        } else {
            Err(error)
        }
    }

    /// The record's fault in a delivery failure, or the error when it is not the record's.
    pub fn of_delivery(error: DeliveryError) -> Result<Self, DeliveryError> {
        match error {
            DeliveryError::Definite(refusal) if refusal.on_error_applies() => {
                Ok(RecordFault::Broker(refusal))
            }
            error => Err(error),
        }
    }
}

impl fmt::Display for RecordFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordFault::Broker(refusal) => refusal.fmt(f),
            RecordFault::Enqueue(error) => error.fmt(f),
        }
    }
}
