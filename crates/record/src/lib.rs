//! The Kafka record a routed outbox row becomes ([`RoutedRecord`], with its [`Header`]s), and
//! the size it holds in the sink's in-flight window ([`record_bytes`]); the schema a registry
//! format's value is written with ([`registered`]); [`RecentTopics`], which
//! spares lookups by topic name per record the hashing of the name; the delivery report a
//! producer gives for each record ([`delivery`]); the [`Consequence`] every error of the
//! router, the sink and the source maps into.
//!
//! The router makes records and the Kafka sink sends them; this crate is what they share, so
//! the sink does not depend on the router.
//!
//! # Invariants
//! - A record owns its bytes ([`Bytes`] and [`Arc<str>`] share nothing with the row it came
//!   from); cloning one copies no key, value or header bytes, nor the topic name.
//! - [`record_bytes`] counts key, value, header names and header values, nothing else: the
//!   same record always has the same size.

pub mod consequence;
pub mod delivery;
mod recent_topics;
pub mod registered;

pub use consequence::Consequence;
pub use delivery::{Classified, Delivered, Delivery, DeliveryFailure, Verdict};
pub use recent_topics::RecentTopics;
pub use registered::{RegistrySchema, RegistrySchemaKind};

use bytes::Bytes;
use std::sync::Arc;

/// A Kafka record header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The header key.
    pub name: Arc<str>,
    /// The header value; `None` is a null value (Kafka tells it apart from an empty one),
    /// which a header placement of a NULL column gives.
    pub value: Option<Bytes>,
}

/// A record ready to be produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedRecord {
    /// The destination topic; a legal Kafka topic name. Shared: the records of one topic hold
    /// the same name, so a record's topic is neither allocated nor copied.
    pub topic: Arc<str>,
    /// The serialized key; `None` is a null key.
    pub key: Option<Bytes>,
    /// The serialized value; `None` is a null value (a tombstone).
    pub value: Option<Bytes>,
    /// The headers, in order.
    pub headers: Vec<Header>,
    /// The record timestamp in milliseconds since the Unix epoch; `None` lets the producer
    /// use the time of sending.
    pub timestamp_ms: Option<i64>,
    /// The partition chosen by a `partition` placement; `None` leaves the choice to the
    /// producer's partitioner.
    pub partition: Option<i32>,
}

/// The size a record holds in the in-flight window (key, value and headers).
pub fn record_bytes(record: &RoutedRecord) -> usize {
    let headers: usize = record
        .headers
        .iter()
        .map(|h| h.name.len() + h.value.as_ref().map_or(0, |v| v.len()))
        .sum();
    record.key.as_ref().map_or(0, |k| k.len())
        + record.value.as_ref().map_or(0, |v| v.len())
        + headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_bytes_counts_key_value_and_headers() {
        let record = RoutedRecord {
            topic: Arc::from("a-long-topic-name-that-is-not-counted"),
            key: Some(Bytes::from_static(b"key")),
            value: Some(Bytes::from_static(b"value")),
            headers: vec![
                Header {
                    name: Arc::from("id"),
                    value: Some(Bytes::from_static(b"1234")),
                },
                Header {
                    name: Arc::from("null"),
                    value: None,
                },
            ],
            timestamp_ms: Some(1),
            partition: Some(2),
        };
        assert_eq!(record_bytes(&record), 3 + 5 + (2 + 4) + 4);
        let empty = RoutedRecord {
            key: None,
            value: None,
            headers: Vec::new(),
            ..record
        };
        assert_eq!(record_bytes(&empty), 0);
    }
}
