//! Exactly-once: the records the broker refused in a Kafka transaction, carried from attempt to
//! attempt (the stream's sessions, a transfer's runs from its last committed progress) so that
//! the guilty one is found and dead-lettered while the innocent are delivered.
//!
//! # Invariants
//! - A record is named by its position, the same on every replay: in the stream, the commit
//!   LSN of its transaction and its index among the transaction's records; in a transfer, the
//!   index of its row among the transfer's rows.
//! - A suspect refused in a shared batch is sent alone next; one refused alone is guilty
//!   ([`refused`], the one rule both the stream and the transfers follow).

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

/// Exactly-once: records the broker refused, by position (`P`; in the stream: commit LSN,
/// index in the transaction).
pub type Suspects<F, P = (Lsn, u32)> = BTreeMap<P, Suspect<F>>;

/// The broker refused the record at `position` for `fault`, in a Kafka transaction the
/// refusal aborts. Sent `alone` (a suspect sent in a transaction of its own), it is guilty;
/// otherwise it becomes a suspect, unless it is one already.
pub fn refused<F: Clone, P: Ord>(
    suspects: &mut Suspects<F, P>,
    position: P,
    alone: bool,
    fault: &F,
) {
    if alone {
        suspects.insert(position, Suspect::Alone(fault.clone()));
    } else {
        suspects
            .entry(position)
            .or_insert_with(|| Suspect::Shared(fault.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_refused_alone_is_guilty_and_one_refused_with_others_a_suspect() {
        let mut suspects: Suspects<&str, u64> = Suspects::new();
        refused(&mut suspects, 7, false, &"too large");
        assert!(matches!(suspects.get(&7), Some(Suspect::Shared(_))));
        // Refused with others again: still only a suspect.
        refused(&mut suspects, 7, false, &"too large");
        assert!(matches!(suspects.get(&7), Some(Suspect::Shared(_))));
        refused(&mut suspects, 7, true, &"too large");
        assert!(matches!(suspects.get(&7), Some(Suspect::Alone(_))));
        // Guilty stays guilty.
        refused(&mut suspects, 7, false, &"too large");
        assert!(matches!(suspects.get(&7), Some(Suspect::Alone(_))));
    }
}
