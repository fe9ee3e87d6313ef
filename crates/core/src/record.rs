//! What the core needs to know of a record it hands to the producer, without knowing its type.
//!
//! # Invariants
//! - The core never looks inside a record but through [`Records`]: it keeps, counts and hands
//!   back values of the driver's record type, statically dispatched (no boxing, no vtable on
//!   the per-record path).

/// A kind of record: its type and how to read its topic and size.
pub trait Records {
    /// The record the driver hands to the producer.
    type Record;
    /// The topic it goes to.
    fn topic(record: &Self::Record) -> &str;
    /// Key, value and header bytes: what it holds in the in-flight window.
    fn size(record: &Self::Record) -> usize;
}
