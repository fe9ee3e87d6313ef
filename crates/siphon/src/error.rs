//! Pipeline errors, sorted by consequence (transient: reconnect from the confirmed position;
//! definite: stop and say what to fix).
//!
//! # Invariants
//! - Every error converted here keeps the classification its source crate gave it.

use siphon_kafka_sink::{DeliveryError, SinkError};
use siphon_source::SourceError;

/// Why a pipeline session ended.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// Reconnecting to PostgreSQL from the confirmed position can cure it.
    #[error("{0}")]
    Transient(String),
    /// The Kafka side failed (brokers unreachable, producer failed); rebuilding the producer and
    /// resending from the confirmed position can cure it.
    #[error("{0}")]
    SinkUnavailable(String),
    /// The operator must change something; the message says what.
    #[error("{0}")]
    Definite(String),
}

impl PipelineError {
    /// Whether the supervisor should reconnect.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            PipelineError::Transient(_) | PipelineError::SinkUnavailable(_)
        )
    }

    /// Which side failed, for a transient error.
    pub fn cause(&self) -> Option<crate::telemetry::ReconnectCause> {
        use crate::telemetry::ReconnectCause;
        match self {
            PipelineError::Transient(_) => Some(ReconnectCause::Source),
            PipelineError::SinkUnavailable(_) => Some(ReconnectCause::Sink),
            PipelineError::Definite(_) => None,
        }
    }
}

impl From<SourceError> for PipelineError {
    fn from(e: SourceError) -> Self {
        if e.is_transient() {
            PipelineError::Transient(e.to_string())
        } else {
            PipelineError::Definite(e.to_string())
        }
    }
}

impl From<SinkError> for PipelineError {
    fn from(e: SinkError) -> Self {
        if e.is_transient() {
            PipelineError::SinkUnavailable(e.to_string())
        } else {
            PipelineError::Definite(e.to_string())
        }
    }
}

impl From<DeliveryError> for PipelineError {
    fn from(e: DeliveryError) -> Self {
        match e {
            DeliveryError::Transient(failure) => {
                PipelineError::SinkUnavailable(failure.to_string())
            }
            DeliveryError::Definite(refusal) => PipelineError::Definite(refusal.to_string()),
        }
    }
}
