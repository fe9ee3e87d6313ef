//! Why a session ended, sorted by consequence (transient: reconnect from the acknowledged
//! position; definite: stop and say what to fix; a bug: stop and say so).
//!
//! # Invariants
//! - Every error keeps the typed error it came from (source, sink, router, ledger): nothing is
//!   flattened into a string, so its classification travels with it.
//! - [`PipelineError::consequence`] is the only place that decides whether to reconnect; it
//!   speaks [`siphon_core::Consequence`], the one vocabulary every error maps into.
//! - No variant carries a bare message: each keeps typed fields, rendered by `Display`.

use crate::telemetry::ReconnectCause;
use pgoutput::Lsn;
use siphon_core::ledger::LedgerError;
use siphon_core::Consequence;
use siphon_kafka_sink::SinkError;
use siphon_router::RouteError;
use siphon_source::stall::Seen;
use siphon_source::SourceError;

pub use crate::record_fault::RecordFault;
pub use crate::row_fault::RowFault;

/// Why a pipeline session ended.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// PostgreSQL: connection, protocol, slot, publication or catalog.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Kafka: producer creation, topic creation, configuration.
    #[error(transparent)]
    Sink(#[from] SinkError),
    /// A record Kafka refuses for good, with `on_error = "fail"` (or a refusal only the operator
    /// can cure).
    #[error("{0}")]
    Refused(RecordFault),
    /// Even the dead-letter topic refused a record: nothing more can be done but stop.
    #[error("the dead-letter topic refused a record: {0}")]
    DeadLetterRefused(RecordFault),
    /// A row not delivered as its record (`on_error = "fail"`, or a registry that refuses
    /// Siphon).
    #[error("{fault}; the row at {lsn} was not delivered")]
    Row { fault: RowFault, lsn: Lsn },
    /// An outbox table whose columns do not fit the router's options.
    #[error("{0}")]
    Unbindable(Box<RouteError>),
    /// A logical message of an outbox prefix that is not a JSON object, with
    /// `on_error = "fail"`.
    #[error("{0} (set pipeline.on_error = \"dead-letter\" to send such messages to a dead-letter topic)")]
    Message(#[from] crate::message::MessageError),
    /// A non-transactional logical message of an outbox prefix: not atomic with the business
    /// change, so never an event.
    #[error("logical message with prefix {prefix:?} at {lsn} was emitted outside a transaction (pg_logical_emit_message(false, ...)): it is not atomic with the change it announces, so it is not delivered; emit it with pg_logical_emit_message(true, ...), or set source.non_transactional_messages = \"skip\" to skip such messages with a warning")]
    NonTransactionalMessage { prefix: String, lsn: Lsn },
    /// The replication connection makes no progress (what was seen).
    #[error("replication connection stalled: {0}")]
    Stalled(Seen),
    /// The server ended the replication stream.
    #[error("replication stream ended")]
    StreamEnded,
    /// The publication's membership recorded in the state topic: unreadable, or showing a gap
    /// that opened and closed while Siphon was stopped.
    #[error(transparent)]
    Recorded(#[from] crate::publication_record::RecordError),
    /// Exactly-once: a record of the open Kafka transaction failed, so the transaction cannot
    /// commit; the next session aborts it and starts again from the last committed progress.
    #[error("the Kafka transaction is aborted: a record for topic {topic} failed ({cause}); starting again from the last committed progress")]
    TransactionAborted { topic: String, cause: AbortCause },
    /// Exactly-once: the broker refused a record (not at enqueue) with `on_error = "fail"`, or
    /// with a refusal only the operator can lift.
    #[error("the broker refused a record in a Kafka transaction: {0} (the record was not delivered; fix it, or set pipeline.on_error = \"dead-letter\" to send such records to a dead-letter topic)")]
    RefusedInTransaction(RecordFault),
    /// Exactly-once: the progress topic could not be created or read.
    #[error(transparent)]
    ProgressTopic(siphon_kafka_sink::StateTopicError),
    /// Exactly-once: the last committed progress cannot be used.
    #[error(transparent)]
    Progress(#[from] crate::progress_record::ProgressRecordError),
    /// The initial snapshot stopped (see [`crate::snapshot`]).
    #[error("initial snapshot: {0}")]
    Snapshot(#[from] crate::transfer_error::TransferError),
    /// The acknowledgement ledger was used against its rules: a bug.
    #[error("internal error in acknowledgement tracking: {0}")]
    Ledger(#[from] LedgerError),
}

/// Why a record failed in a Kafka transaction.
#[derive(Debug, thiserror::Error)]
pub enum AbortCause {
    /// The producer reported it undelivered.
    #[error("{0}")]
    Delivery(siphon_kafka_sink::DeliveryError),
    /// The producer did not take it.
    #[error("{0}")]
    NotTaken(SinkError),
    /// It was handed back by a purge.
    #[error("purged with the producer")]
    Purged,
    /// The broker refused it; with dead letters it is sent alone next, and dead-lettered if
    /// refused alone.
    #[error(
        "refused by the broker: {0}; it is sent alone next, and dead-lettered if refused alone"
    )]
    Refused(RecordFault),
}

impl PipelineError {
    /// What the error means for the process.
    pub fn consequence(&self) -> Consequence {
        match self {
            PipelineError::Source(e) if e.is_transient() => Consequence::Retry,
            PipelineError::Sink(e) if e.is_transient() => Consequence::Retry,
            PipelineError::Stalled(_)
            | PipelineError::StreamEnded
            | PipelineError::TransactionAborted { .. } => Consequence::Retry,
            PipelineError::Recorded(e) if e.consequence().is_retry() => Consequence::Retry,
            PipelineError::ProgressTopic(e) => e.consequence(),
            PipelineError::Ledger(_) => Consequence::Bug,
            PipelineError::Snapshot(e) => e.consequence(),
            PipelineError::Row { fault, .. } => fault.consequence(),
            _ => Consequence::Fix,
        }
    }

    /// Whether the supervisor should reconnect.
    pub fn is_transient(&self) -> bool {
        self.consequence().is_retry()
    }

    /// Which side failed, for an error that is retried (the reconnect's cause in telemetry).
    pub fn cause(&self) -> Option<ReconnectCause> {
        if !self.is_transient() {
            return None;
        }
        Some(match self {
            PipelineError::Sink(_)
            | PipelineError::Recorded(_)
            | PipelineError::ProgressTopic(_)
            | PipelineError::TransactionAborted { .. } => ReconnectCause::Sink,
            _ => ReconnectCause::Source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consequences_follow_the_source_classification() {
        let transient = PipelineError::from(SourceError::from(
            siphon_source::error::Interruption::StreamEnded,
        ));
        assert_eq!(transient.consequence(), Consequence::Retry);
        assert_eq!(transient.cause(), Some(ReconnectCause::Source));
        let definite = PipelineError::from(SourceError::from(
            siphon_source::error::SetupProblem::WalLevel {
                level: "replica".into(),
            },
        ));
        assert_eq!(definite.consequence(), Consequence::Fix);
        assert_eq!(definite.cause(), None);
        assert_eq!(
            PipelineError::from(SinkError::Kafka {
                operation: siphon_kafka_sink::SinkOperation::CreateTopic,
                topic: "t".into(),
                code: siphon_kafka_sink::RDKafkaErrorCode::AllBrokersDown,
            })
            .cause(),
            Some(ReconnectCause::Sink)
        );
        let seen = Seen {
            what: "walsender 7 waits".into(),
            silence: std::time::Duration::from_secs(60),
            server_flush_lsn: None,
        };
        assert!(PipelineError::Stalled(seen).is_transient());
        assert_eq!(
            PipelineError::from(LedgerError::NoOpenTransaction).consequence(),
            Consequence::Bug
        );
        assert!(
            !PipelineError::Refused(RecordFault::Enqueue(SinkError::Kafka {
                operation: siphon_kafka_sink::SinkOperation::Enqueue,
                topic: "t".into(),
                code: siphon_kafka_sink::RDKafkaErrorCode::MessageSizeTooLarge,
            }))
            .is_transient()
        );
    }
}
