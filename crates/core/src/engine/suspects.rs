//! Exactly-once: the records the broker refused in a Kafka transaction, carried from session to
//! session so that the guilty one is found and dead-lettered while the innocent are delivered.
//!
//! # Invariants
//! - A record is named by its position (commit LSN of its transaction, index among the
//!   transaction's records): the same on every replay of the transaction.
//! - A suspect refused in a shared batch is sent alone next; one refused alone is guilty.

use pgoutput::Lsn;
use std::collections::BTreeMap;

/// Exactly-once: how the broker refused a record of a Kafka transaction (`F`: why).
#[derive(Debug, Clone)]
pub enum Suspect<F> {
    /// Refused in a batch it may only have shared with the guilty record: it is sent alone,
    /// in a Kafka transaction of its own, next time.
    Shared(F),
    /// Refused while sent alone: guilty, dead-lettered next time.
    Alone(F),
}

/// Exactly-once: records the broker refused, by position (commit LSN, index in the transaction).
pub type Suspects<F> = BTreeMap<(Lsn, u32), Suspect<F>>;
