//! What became of a record handed to a producer: the delivery report ([`Delivery`]) the Kafka
//! sink sends and the session engine reads, and the [`Verdict`] the engine reads from a failure
//! without knowing the producer's error codes.
//!
//! The report is generic over the producer's error (`E`): the Kafka sink fills it with its own
//! classified error, and a model of a producer with any error that says its [`Verdict`].
//!
//! # Invariants
//! - A report names its record by the token it was sent with, and the producer generation that
//!   reported it; a failure carries a copy of the record (to send again or dead-letter), boxed
//!   so that a report of a delivered record stays small.
//! - [`Classified::verdict`] is the one reading of a failure the engine acts on: whose fault it
//!   is, and whether the producer must be replaced before the record is sent again.

use crate::RoutedRecord;

/// Where a delivered record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub partition: i32,
    pub offset: i64,
}

/// The outcome of one record.
#[derive(Debug, Clone)]
pub struct Delivery<E> {
    /// The token the record was handed to the producer with.
    pub token: usize,
    /// Which producer reported it.
    pub generation: u64,
    /// A failure is boxed: it carries a copy of the record, and a report that moves through
    /// a channel per record stays small.
    pub result: Result<Delivered, Box<DeliveryFailure<E>>>,
}

/// A record that was not delivered, with a copy of it (taken only on failure) so that it can
/// be sent again or dead-lettered.
#[derive(Debug, Clone)]
pub struct DeliveryFailure<E> {
    pub error: E,
    pub record: RoutedRecord,
}

/// What a failed delivery means for the record and for the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Refused for good, for the record's own sake: `on_error` decides (dead letter or stop).
    RecordRefused,
    /// Refused until the configuration, the broker or an authorization changes: only the
    /// operator can cure it, whatever `on_error` says.
    OperatorFix,
    /// Sending it again can succeed: refused only with its batch, or the producer failed
    /// (`replace`: only on a new producer).
    Transient { replace: bool },
}

/// A producer's error that says its [`Verdict`].
pub trait Classified {
    fn verdict(&self) -> Verdict;
}
