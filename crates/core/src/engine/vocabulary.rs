//! What the session engine knows of the errors around it: the producer's, the catalog's and
//! the session's own, as associated types of a [`Vocabulary`] the driver's side names. The
//! engine reads them only through the methods here, and raises its own as [`EngineError`]s,
//! which the session's error type takes in.
//!
//! # Invariants
//! - The engine decides from a failure only what these methods say: whether it is the record's
//!   fault ([`Vocabulary::enqueue_fault`], [`Vocabulary::read_delivery`]), whether `on_error`
//!   applies to a refusal, and whether sending again (on a new producer) can cure it.
//! - Every error the engine raises keeps the typed value it came from.

use super::message::MessageError;
use crate::ledger::LedgerError;
use pgoutput::{Lsn, Oid};
use siphon_record::Classified;
use siphon_router::RouteError;
use std::fmt::{Debug, Display};

/// The types of the world around the engine, and how the engine reads them.
pub trait Vocabulary: Sized + 'static {
    /// How a session ends.
    type Error: Debug + Display + From<EngineError<Self>> + From<LedgerError>;
    /// Why the producer did not take a record, or a Kafka transaction step failed.
    type SendError: Display + Debug;
    /// Why a delivery failed.
    type DeliveryError: Classified + Clone + Display + Debug + Send + Sync;
    /// A record Kafka will not take as it is (the record's own fault).
    type Fault: Clone + Display + Debug + Send + Sync;
    /// Why the catalog could not be read.
    type CatalogError: Debug;
    /// Why a schema registry refused to give a schema an id.
    type RegistryError: Debug + Display;
    /// What a stalled replication connection showed.
    type Stall: Debug;

    /// The record's fault in an enqueue error, or the error when it is not the record's.
    fn enqueue_fault(error: Self::SendError) -> Result<Self::Fault, Self::SendError>;

    /// Whether an enqueue error that is not the record's fault can be cured by sending again
    /// on a new producer.
    fn is_transient(error: &Self::SendError) -> bool;

    /// What a failed delivery means: refused for good (with the fault, and whether `on_error`
    /// applies to it), or transient (the error, and whether the producer must be replaced).
    fn read_delivery(error: Self::DeliveryError) -> DeliveryReading<Self>;

    /// The enqueue error inside a fault refused at enqueue (`Err`: another fault).
    fn not_taken(fault: Self::Fault) -> Result<Self::SendError, Self::Fault>;

    /// Whether the registry refused the schema itself (incompatible or invalid), so that
    /// `on_error` applies to the record; otherwise (credentials, a wrong URL) no record can be
    /// sent and the session stops.
    fn schema_refused(error: &Self::RegistryError) -> bool;
}

/// What a failed delivery means, as [`Vocabulary::read_delivery`] reads it.
pub enum DeliveryReading<V: Vocabulary> {
    /// Refused for good: for the record's own sake (`on_error` applies), or until the operator
    /// acts.
    Refused {
        fault: V::Fault,
        on_error_applies: bool,
    },
    /// Sending again can succeed (`replace`: only on a new producer).
    Transient {
        error: V::DeliveryError,
        replace: bool,
    },
}

/// Why a record failed in a Kafka transaction.
#[derive(Debug)]
pub enum AbortCause<V: Vocabulary> {
    /// The producer reported it undelivered.
    Delivery(V::DeliveryError),
    /// The producer did not take it.
    NotTaken(V::SendError),
    /// It was handed back by a purge.
    Purged,
    /// The broker refused it; with dead letters it is sent alone next, and dead-lettered if
    /// refused alone.
    Refused(V::Fault),
}

/// An error the engine raises.
#[derive(Debug)]
pub enum EngineError<V: Vocabulary> {
    /// A catalog lookup failed.
    Catalog(V::CatalogError),
    /// The schema registry refused the record of the row at `lsn`, or its payload does not fit
    /// the schema registered for it (with `on_error = "fail"`, or a refusal dead letters do
    /// not take).
    RegistryRefusal {
        refusal: super::registry_write::Refusal<V::RegistryError>,
        lsn: Lsn,
    },
    /// The replication connection makes no progress (what was seen).
    Stalled(V::Stall),
    /// The producer failed for good, or a Kafka transaction step failed.
    Sink(V::SendError),
    /// A row of a bound outbox table the source no longer describes.
    UndescribedOutboxRow { relation: Oid, lsn: Lsn },
    /// A DELETE read without its row for a relation whose binding does not skip it.
    DeleteWithoutRow { relation: Oid, lsn: Lsn },
    /// A row that cannot be routed, with `on_error = "fail"`.
    Row { error: Box<RouteError>, lsn: Lsn },
    /// An outbox table whose columns do not fit the router's options.
    Unbindable(Box<RouteError>),
    /// A logical message of an outbox prefix that cannot be read, with `on_error = "fail"`.
    Message(MessageError),
    /// A non-transactional logical message of an outbox prefix.
    NonTransactionalMessage { prefix: String, lsn: Lsn },
    /// A record Kafka refuses for good, with `on_error = "fail"` (or only the operator can
    /// cure it).
    Refused(V::Fault),
    /// Even the dead-letter topic refused a record.
    DeadLetterRefused(V::Fault),
    /// Exactly-once: the broker refused a record in a Kafka transaction, with
    /// `on_error = "fail"` or a refusal only the operator can lift.
    RefusedInTransaction(V::Fault),
    /// Exactly-once: a record of the open Kafka transaction failed, so it cannot commit.
    TransactionAborted { topic: String, cause: AbortCause<V> },
}
