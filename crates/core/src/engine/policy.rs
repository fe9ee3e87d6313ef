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

/// What `pipeline.on_error` makes of a row or a record that cannot be delivered as it is: the
/// one rule the stream and the transfers (snapshots, re-sends) both ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposal<'a> {
    /// Its dead letter goes in its place.
    DeadLetter(&'a DeadLetters),
    /// Stop, naming it: `on_error = "fail"`, or a refusal dead letters do not take.
    Stop,
    /// It is a dead letter the dead-letter topic refused: nothing is left but to stop.
    LetterRefused,
}

impl ErrorPolicy {
    /// A row that cannot be routed or written; `dead_letterable`: whether `on_error` applies
    /// to why (a registry that refuses Siphon itself stops any policy).
    pub fn for_row(&self, dead_letterable: bool) -> Disposal<'_> {
        match self {
            ErrorPolicy::DeadLetter(dead_letters) if dead_letterable => {
                Disposal::DeadLetter(dead_letters)
            }
            _ => Disposal::Stop,
        }
    }

    /// A record for `topic` that Kafka refused for its own sake.
    pub fn for_refused(&self, topic: &str) -> Disposal<'_> {
        match self {
            ErrorPolicy::DeadLetter(dead_letters) if dead_letters.topic() == topic => {
                Disposal::LetterRefused
            }
            ErrorPolicy::DeadLetter(dead_letters) => Disposal::DeadLetter(dead_letters),
            ErrorPolicy::Fail => Disposal::Stop,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_dead_lettered_only_with_dead_letters_and_only_once() {
        let dead_letters = DeadLetters::new("dlq".to_owned(), 1 << 20);
        let policy = ErrorPolicy::DeadLetter(dead_letters.clone());
        assert_eq!(policy.for_row(true), Disposal::DeadLetter(&dead_letters));
        assert_eq!(policy.for_row(false), Disposal::Stop);
        assert_eq!(
            policy.for_refused("orders"),
            Disposal::DeadLetter(&dead_letters)
        );
        assert_eq!(policy.for_refused("dlq"), Disposal::LetterRefused);
        assert_eq!(ErrorPolicy::Fail.for_row(true), Disposal::Stop);
        assert_eq!(ErrorPolicy::Fail.for_refused("orders"), Disposal::Stop);
    }
}
