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
    /// Reconnecting from the confirmed position can cure it.
    #[error("{0}")]
    Transient(String),
    /// The operator must change something; the message says what.
    #[error("{0}")]
    Definite(String),
}

impl PipelineError {
    /// Whether the supervisor should reconnect.
    pub fn is_transient(&self) -> bool {
        matches!(self, PipelineError::Transient(_))
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
            PipelineError::Transient(e.to_string())
        } else {
            PipelineError::Definite(e.to_string())
        }
    }
}

impl From<DeliveryError> for PipelineError {
    fn from(e: DeliveryError) -> Self {
        match e {
            DeliveryError::Transient(m) => PipelineError::Transient(m),
            DeliveryError::Definite(m) => PipelineError::Definite(m),
        }
    }
}

impl From<crate::ack::AckError> for PipelineError {
    fn from(e: crate::ack::AckError) -> Self {
        PipelineError::Definite(format!("internal error in acknowledgement tracking: {e}"))
    }
}
