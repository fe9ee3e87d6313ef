//! The simulation's Kafka and session errors: the producer's error codes the model raises, and
//! how the Kafka sink classifies each of them (its table in `crates/kafka-sink/src/error.rs`),
//! as a [`Vocabulary`] for the engine.
//!
//! # Invariants
//! - Each code reads as the Kafka sink reads it: a delivery failure's verdict, an enqueue
//!   error's refusal of the record and transience, a transaction call's transience; and a
//!   session's end is transient exactly when the binary's `PipelineError` says so.

use crate::engine::vocabulary::{DeliveryReading, EngineError, Vocabulary};
use crate::ledger::LedgerError;
use siphon_record::{Classified, Verdict};
use std::fmt;

/// The librdkafka error codes the model raises (named as librdkafka names them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RDKafkaErrorCode {
    AllBrokersDown,
    CoordinatorLoadInProgress,
    CoordinatorNotAvailable,
    Fatal,
    GaplessGuarantee,
    InvalidTopic,
    InvalidTransactionalState,
    MessageSizeTooLarge,
    MessageTimedOut,
    OperationTimedOut,
    PolicyViolation,
    ProducerFenced,
    PurgeInflight,
    State,
}

/// What a failed delivery or enqueue with a code means, as the Kafka sink's table says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Consequence {
    RecordRefused,
    ProducerFailed,
    OperatorFix,
}

fn consequence(code: RDKafkaErrorCode) -> Consequence {
    use RDKafkaErrorCode as C;
    match code {
        C::MessageSizeTooLarge | C::PolicyViolation | C::InvalidTopic => Consequence::RecordRefused,
        C::MessageTimedOut
        | C::PurgeInflight
        | C::Fatal
        | C::GaplessGuarantee
        | C::AllBrokersDown
        | C::OperationTimedOut
        | C::ProducerFenced => Consequence::ProducerFailed,
        C::State
        | C::CoordinatorLoadInProgress
        | C::CoordinatorNotAvailable
        | C::InvalidTransactionalState => Consequence::OperatorFix,
    }
}

/// The Kafka operation that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Enqueue,
    CreateTopic,
    BeginTransaction,
    CommitTransaction,
}

/// The Kafka sink's error, for the operations the model fails.
#[derive(Debug, Clone)]
pub enum SinkError {
    Kafka {
        operation: Operation,
        topic: String,
        code: RDKafkaErrorCode,
    },
    Transaction {
        operation: Operation,
        transactional_id: String,
        code: RDKafkaErrorCode,
    },
}

impl SinkError {
    /// Whether the record is what Kafka refuses: its enqueueing refused for good, or its
    /// topic's name.
    pub fn refuses_record(&self) -> bool {
        match self {
            SinkError::Kafka {
                operation: Operation::Enqueue,
                code,
                ..
            } => consequence(*code) == Consequence::RecordRefused,
            SinkError::Kafka {
                operation: Operation::CreateTopic,
                code,
                ..
            } => *code == RDKafkaErrorCode::InvalidTopic,
            _ => false,
        }
    }

    /// Whether reconnecting may cure it: an enqueue error of a failed producer, a topic
    /// creation not refused for good, and every transaction call failure the model raises (none
    /// is one of the operator's).
    pub fn is_transient(&self) -> bool {
        match self {
            SinkError::Kafka {
                operation: Operation::CreateTopic,
                code,
                ..
            } => *code != RDKafkaErrorCode::InvalidTopic,
            SinkError::Kafka { code, .. } => consequence(*code) == Consequence::ProducerFailed,
            SinkError::Transaction { .. } => true,
        }
    }
}

impl fmt::Display for SinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SinkError::Kafka {
                operation,
                topic,
                code,
            } => write!(f, "{operation:?} for topic {topic} failed with {code:?}"),
            SinkError::Transaction {
                operation,
                transactional_id,
                code,
            } => write!(
                f,
                "{operation:?} of {transactional_id} failed with {code:?}"
            ),
        }
    }
}

/// Why a delivery failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryError {
    pub topic: String,
    pub code: RDKafkaErrorCode,
}

impl DeliveryError {
    /// A failed delivery of a record for `topic` with `code`.
    pub fn from_code(topic: &str, code: RDKafkaErrorCode) -> Self {
        DeliveryError {
            topic: topic.to_owned(),
            code,
        }
    }
}

impl Classified for DeliveryError {
    fn verdict(&self) -> Verdict {
        match consequence(self.code) {
            Consequence::RecordRefused => Verdict::RecordRefused,
            Consequence::OperatorFix => Verdict::OperatorFix,
            Consequence::ProducerFailed => Verdict::Transient { replace: true },
        }
    }
}

impl fmt::Display for DeliveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "delivery to topic {} failed with {:?}",
            self.topic, self.code
        )
    }
}

/// A record Kafka will not take as it is.
#[derive(Debug, Clone)]
pub enum RecordFault {
    Broker(DeliveryError),
    Enqueue(SinkError),
}

impl fmt::Display for RecordFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordFault::Broker(e) => e.fmt(f),
            RecordFault::Enqueue(e) => e.fmt(f),
        }
    }
}

/// How a simulated session ends.
#[derive(Debug)]
pub enum PipelineError {
    Engine(EngineError<Model>),
    Ledger(LedgerError),
    /// The server ended the replication stream.
    StreamEnded,
}

impl PipelineError {
    /// Whether the supervisor reconnects, as the binary's `PipelineError::consequence` says.
    pub fn is_transient(&self) -> bool {
        match self {
            PipelineError::StreamEnded => true,
            PipelineError::Ledger(_) => false,
            PipelineError::Engine(e) => match e {
                EngineError::Sink(e) => e.is_transient(),
                // The catalog's failures the model raises are none; a stall, a protocol fault
                // of the stream and an aborted Kafka transaction reconnect.
                EngineError::Catalog(()) | EngineError::Stalled(()) => true,
                EngineError::UndescribedOutboxRow { .. }
                | EngineError::DeleteWithoutRow { .. }
                | EngineError::TransactionAborted { .. } => true,
                EngineError::Row { .. }
                | EngineError::Unbindable(_)
                | EngineError::Message(_)
                | EngineError::NonTransactionalMessage { .. }
                | EngineError::Refused(_)
                | EngineError::DeadLetterRefused(_)
                | EngineError::RefusedInTransaction(_)
                | EngineError::RegistryRefusal { .. } => false,
            },
        }
    }
}

impl fmt::Display for PipelineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PipelineError::Engine(EngineError::DeleteWithoutRow { relation, lsn }) => write!(
                f,
                "DELETE of relation {relation} at {lsn} read without its old row, which its table needs"
            ),
            PipelineError::Engine(e) => write!(f, "{e:?}"),
            PipelineError::Ledger(e) => write!(f, "ledger: {e}"),
            PipelineError::StreamEnded => f.write_str("replication stream ended"),
        }
    }
}

impl From<EngineError<Model>> for PipelineError {
    fn from(e: EngineError<Model>) -> Self {
        PipelineError::Engine(e)
    }
}

impl From<LedgerError> for PipelineError {
    fn from(e: LedgerError) -> Self {
        PipelineError::Ledger(e)
    }
}

/// The model's errors, as the engine reads them.
#[derive(Debug)]
pub struct Model;

impl Vocabulary for Model {
    type Error = PipelineError;
    type SendError = SinkError;
    type DeliveryError = DeliveryError;
    type Fault = RecordFault;
    type CatalogError = ();
    type RegistryError = String;
    type Stall = ();

    fn enqueue_fault(error: SinkError) -> Result<RecordFault, SinkError> {
        if error.refuses_record() {
            Ok(RecordFault::Enqueue(error))
        } else {
            Err(error)
        }
    }

    fn is_transient(error: &SinkError) -> bool {
        error.is_transient()
    }

    fn read_delivery(error: DeliveryError) -> DeliveryReading<Model> {
        match error.verdict() {
            Verdict::RecordRefused => DeliveryReading::Refused {
                fault: RecordFault::Broker(error),
                on_error_applies: true,
            },
            Verdict::OperatorFix => DeliveryReading::Refused {
                fault: RecordFault::Broker(error),
                on_error_applies: false,
            },
            Verdict::Transient { replace } => DeliveryReading::Transient { error, replace },
        }
    }

    fn not_taken(fault: RecordFault) -> Result<SinkError, RecordFault> {
        match fault {
            RecordFault::Enqueue(error) => Ok(error),
            fault => Err(fault),
        }
    }

    fn schema_refused(_: &String) -> bool {
        true
    }
}
