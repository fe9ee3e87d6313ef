//! The session engine as Siphon runs it: [`siphon_core::engine::session`] over Siphon's own
//! vocabulary ([`Siphon`]): the Kafka sink's errors, the source's, and [`PipelineError`] as
//! the session's end.
//!
//! # Invariants
//! - Every error the engine raises becomes the [`PipelineError`] it names (a protocol fault
//!   of the stream is the source's [`ProtocolFault`]), so its message and its consequence are
//!   decided in one place, [`PipelineError::consequence`].
//! - A failure is read as the sink classifies it: the record's fault only when
//!   [`RecordFault`] says so, a refusal `on_error` applies to only when
//!   [`siphon_kafka_sink::Refusal::on_error_applies`].

use crate::error::{AbortCause, PipelineError, RecordFault, RowFault};
use siphon_core::engine::session;
use siphon_core::engine::vocabulary::{self, DeliveryReading, EngineError, Vocabulary};
use siphon_kafka_sink::{DeliveryError, SinkError};
use siphon_source::error::ProtocolFault;
use siphon_source::stall::Seen;
use siphon_source::SourceError;

pub use siphon_core::engine::session::{Lookup, Now};

/// The session engine over Siphon's vocabulary.
pub type SessionCore<'a> = session::SessionCore<'a, Siphon>;
/// What happened, for the engine.
pub type Input = session::Input<Siphon>;
/// What the driver must do, in order.
pub type Action = session::Action<Siphon>;
/// The engine's fixed settings.
pub type CoreSettings<'a> = session::CoreSettings<'a, Siphon>;
/// The answer to a [`Lookup`].
pub type Answer = session::Answer<Siphon>;
/// A transfer's engine over Siphon's vocabulary.
pub type TransferSession<'a> = siphon_core::engine::transfer::TransferSession<'a, Siphon>;
/// What happened, for a transfer's engine.
pub type TransferInput = siphon_core::engine::transfer::TransferInput<Siphon>;
/// Why a transfer stops.
pub type TransferStop = siphon_core::engine::transfer::TransferStop<Siphon>;

/// Siphon's errors, as the session engine reads them.
#[derive(Debug)]
pub struct Siphon;

impl Vocabulary for Siphon {
    type Error = PipelineError;
    type SendError = SinkError;
    type DeliveryError = DeliveryError;
    type Fault = RecordFault;
    type CatalogError = SourceError;
    type RegistryError = siphon_schema_registry::RegistryError;
    type Stall = Seen;

    fn enqueue_fault(error: SinkError) -> Result<RecordFault, SinkError> {
        RecordFault::of_enqueue(error)
    }

    fn is_transient(error: &SinkError) -> bool {
        error.is_transient()
    }

    fn read_delivery(error: DeliveryError) -> DeliveryReading<Siphon> {
        match error {
            DeliveryError::Definite(refusal) => DeliveryReading::Refused {
                on_error_applies: refusal.on_error_applies(),
                fault: RecordFault::Broker(refusal),
            },
            DeliveryError::Transient(failure) => DeliveryReading::Transient {
                replace: failure.needs_rebuild(),
                error: DeliveryError::Transient(failure),
            },
        }
    }

    fn not_taken(fault: RecordFault) -> Result<SinkError, RecordFault> {
        match fault {
            RecordFault::Enqueue(error) => Ok(error),
            fault => Err(fault),
        }
    }

    fn schema_refused(error: &siphon_schema_registry::RegistryError) -> bool {
        error.is_schema_refusal()
    }
}

impl From<EngineError<Siphon>> for PipelineError {
    fn from(error: EngineError<Siphon>) -> Self {
        match error {
            EngineError::Catalog(e) => PipelineError::Source(e),
            EngineError::RegistryRefusal { refusal, lsn } => PipelineError::Row {
                fault: RowFault::from(refusal),
                lsn,
            },
            EngineError::Stalled(seen) => PipelineError::Stalled(seen),
            EngineError::Sink(e) => PipelineError::Sink(e),
            EngineError::UndescribedOutboxRow { relation, lsn } => {
                PipelineError::Source(ProtocolFault::UndescribedOutboxRow { relation, lsn }.into())
            }
            EngineError::DeleteWithoutRow { relation, lsn } => {
                PipelineError::Source(ProtocolFault::DeleteWithoutRow { relation, lsn }.into())
            }
            EngineError::Row { error, lsn } => PipelineError::Row {
                fault: RowFault::Route(error),
                lsn,
            },
            EngineError::Unbindable(e) => PipelineError::Unbindable(e),
            EngineError::Message(e) => PipelineError::Message(e),
            EngineError::NonTransactionalMessage { prefix, lsn } => {
                PipelineError::NonTransactionalMessage { prefix, lsn }
            }
            EngineError::Refused(fault) => PipelineError::Refused(fault),
            EngineError::DeadLetterRefused(fault) => PipelineError::DeadLetterRefused(fault),
            EngineError::RefusedInTransaction(fault) => PipelineError::RefusedInTransaction(fault),
            EngineError::TransactionAborted { topic, cause } => PipelineError::TransactionAborted {
                topic,
                cause: match cause {
                    vocabulary::AbortCause::Delivery(e) => AbortCause::Delivery(e),
                    vocabulary::AbortCause::NotTaken(e) => AbortCause::NotTaken(e),
                    vocabulary::AbortCause::Purged => AbortCause::Purged,
                    vocabulary::AbortCause::Refused(fault) => AbortCause::Refused(fault),
                },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgoutput::Lsn;
    use siphon_kafka_sink::{RDKafkaErrorCode, SinkOperation};

    #[test]
    fn failures_read_as_the_sink_classifies_them() {
        let policy = DeliveryError::from_code("t", RDKafkaErrorCode::PolicyViolation);
        assert!(matches!(
            Siphon::read_delivery(policy),
            DeliveryReading::Refused {
                on_error_applies: true,
                fault: RecordFault::Broker(_),
            }
        ));
        let timed_out = DeliveryError::from_code("t", RDKafkaErrorCode::MessageTimedOut);
        assert!(matches!(
            Siphon::read_delivery(timed_out),
            DeliveryReading::Transient { replace: true, .. }
        ));
        let too_large = SinkError::Kafka {
            operation: SinkOperation::Enqueue,
            topic: "t".into(),
            code: RDKafkaErrorCode::MessageSizeTooLarge,
        };
        let fault = Siphon::enqueue_fault(too_large).expect("the record's fault");
        assert!(matches!(
            Siphon::not_taken(fault),
            Ok(SinkError::Kafka { .. })
        ));
        let unreachable = SinkError::Kafka {
            operation: SinkOperation::Enqueue,
            topic: "t".into(),
            code: RDKafkaErrorCode::AllBrokersDown,
        };
        let error = Siphon::enqueue_fault(unreachable).expect_err("not the record's fault");
        assert!(Siphon::is_transient(&error));
    }

    #[test]
    fn engine_errors_become_the_pipeline_errors_they_name() {
        let delete = PipelineError::from(EngineError::<Siphon>::DeleteWithoutRow {
            relation: 1,
            lsn: Lsn(2),
        });
        assert!(matches!(delete, PipelineError::Source(_)), "{delete:?}");
        assert!(delete.is_transient());
        assert!(
            delete.to_string().contains("without its old row"),
            "{delete}"
        );
        let aborted = PipelineError::from(EngineError::<Siphon>::TransactionAborted {
            topic: "t".into(),
            cause: vocabulary::AbortCause::Purged,
        });
        assert!(
            matches!(
                &aborted,
                PipelineError::TransactionAborted {
                    cause: AbortCause::Purged,
                    ..
                }
            ) && aborted.is_transient(),
            "{aborted:?}"
        );
        let message = PipelineError::from(EngineError::<Siphon>::NonTransactionalMessage {
            prefix: "outbox".into(),
            lsn: Lsn(3),
        });
        assert!(!message.is_transient());
    }
}
