//! The session's policies for what cannot go on as usual, and the router's records as the
//! flow sees them.
//!
//! # Invariants
//! - Plain values, fixed for a session: built once from the configuration.

use super::dead_letter::DeadLetters;
use siphon_record::RoutedRecord;

/// The router's records, as the flow sees them.
#[derive(Debug)]
pub struct RoutedKind;

impl crate::Records for RoutedKind {
    type Record = RoutedRecord;

    fn topic(record: &Self::Record) -> &str {
        &record.topic
    }

    fn size(record: &Self::Record) -> usize {
        siphon_record::record_bytes(record)
    }
}

/// What to do with a row or record that can never be delivered as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorPolicy {
    /// Stop with an error naming the fix.
    Fail,
    /// Write it to the dead-letter topic, with the error in its headers, and go on.
    DeadLetter(DeadLetters),
}

/// What to do with a non-transactional logical message of an outbox prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonTransactionalPolicy {
    /// Stop, naming the fix.
    Error,
    /// Skip it with a warning.
    Skip,
}
