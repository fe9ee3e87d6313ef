//! The records in flight, by number: a ring for the recent span and an ordered map for the
//! few left behind.
//!
//! Records are numbered in the order they are handed over and are mostly acknowledged in about
//! that order, so a ring indexed by number finds, adds and removes one in constant time. A
//! record still in flight when the ring's span is full (one whose report is late while
//! thousands after it were acknowledged) moves to an ordered map, so the ring's size never
//! depends on how long a record waits.
//!
//! # Invariants
//! - Numbers are given out by [`InFlightRecords::push`], one more each time.
//! - The ring holds the numbers `base..next` (slot `i` is number `base + i`), at most `span`
//!   of them; its first slot holds a record whenever it is not empty.
//! - Every number in `stragglers` is below `base`.
//! - `len` counts the records in the ring and in `stragglers`.
//!
//! So memory is at most `span` slots plus one entry per record in flight.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

/// A transaction within one ledger (commit order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TxnId(pub u64);

/// A record within one ledger, in the order it was first handed to the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seq(pub u64);

impl Seq {
    /// The token given to the producer for this record (64-bit targets: lossless).
    pub fn token(self) -> usize {
        self.0 as usize
    }

    /// The record a producer token names.
    pub fn from_token(token: usize) -> Self {
        Seq(token as u64)
    }
}

/// A record handed to the producer and not yet settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    pub txn: TxnId,
    /// Key, value and header bytes: what the record holds in the window.
    pub bytes: usize,
    /// When it was first handed to the producer.
    pub first_sent: Instant,
}

/// Records in flight, by number.
#[derive(Debug)]
pub struct InFlightRecords {
    ring: VecDeque<Option<InFlight>>,
    /// The number of the ring's first slot.
    base: u64,
    /// The number the next record gets.
    next: u64,
    /// The most slots the ring holds.
    span: usize,
    /// Records older than the ring's span.
    stragglers: BTreeMap<Seq, InFlight>,
    len: usize,
}

impl InFlightRecords {
    /// No records; the ring spans at most `span` numbers (at least one).
    pub fn new(span: usize) -> Self {
        InFlightRecords {
            ring: VecDeque::new(),
            base: 0,
            next: 0,
            span: span.max(1),
            stragglers: BTreeMap::new(),
            len: 0,
        }
    }

    /// Records in flight.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Adds `record` under the next number, which it returns.
    pub fn push(&mut self, record: InFlight) -> Seq {
        if self.ring.len() == self.span {
            if let Some(Some(oldest)) = self.ring.pop_front() {
                self.stragglers.insert(Seq(self.base), oldest);
            }
            self.base += 1;
            self.trim();
        }
        if self.ring.is_empty() {
            self.base = self.next;
        }
        let seq = Seq(self.next);
        self.next += 1;
        self.ring.push_back(Some(record));
        self.len += 1;
        seq
    }

    /// The record `seq`, if in flight.
    pub fn get(&self, seq: Seq) -> Option<&InFlight> {
        match self.slot(seq) {
            Some(index) => self.ring.get(index)?.as_ref(),
            None => self.stragglers.get(&seq),
        }
    }

    /// Takes the record `seq` out, if in flight.
    pub fn remove(&mut self, seq: Seq) -> Option<InFlight> {
        let record = match self.slot(seq) {
            Some(index) => {
                let record = self.ring.get_mut(index)?.take()?;
                if index == 0 {
                    self.trim();
                }
                record
            }
            None => self.stragglers.remove(&seq)?,
        };
        self.len -= 1;
        Some(record)
    }

    /// The record with the lowest number (the oldest handed over).
    pub fn first(&self) -> Option<&InFlight> {
        match self.stragglers.first_key_value() {
            Some((_, record)) => Some(record),
            None => self.ring.front()?.as_ref(),
        }
    }

    /// The ring's slot of `seq`, or `None` below the ring (a straggler, or settled).
    fn slot(&self, seq: Seq) -> Option<usize> {
        seq.0.checked_sub(self.base).map(|offset| offset as usize)
    }

    /// Drops the empty slots at the ring's front.
    fn trim(&mut self) {
        while let Some(None) = self.ring.front() {
            self.ring.pop_front();
            self.base += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(n: usize) -> InFlight {
        InFlight {
            txn: TxnId(0),
            bytes: n,
            first_sent: Instant::now(),
        }
    }

    #[test]
    fn a_late_record_moves_out_of_the_ring_and_the_ring_stays_within_its_span() {
        let mut records = InFlightRecords::new(4);
        let late = records.push(record(7));
        for n in 0..1_000 {
            let seq = records.push(record(n));
            assert_eq!(records.remove(seq).map(|r| r.bytes), Some(n));
            assert!(records.ring.len() <= 4);
        }
        assert_eq!(records.len(), 1);
        assert_eq!(records.first().map(|r| r.bytes), Some(7));
        assert_eq!(records.get(late).map(|r| r.bytes), Some(7));
        assert_eq!(records.remove(late).map(|r| r.bytes), Some(7));
        assert_eq!((records.len(), records.first()), (0, None));
    }

    proptest! {
        /// Against an ordered map: any order of adding and removing, any span.
        #[test]
        fn behaves_as_an_ordered_map(span in 1usize..6, steps in prop::collection::vec((any::<bool>(), 0usize..8), 0..200)) {
            let mut records = InFlightRecords::new(span);
            let mut model: BTreeMap<Seq, usize> = BTreeMap::new();
            let mut given = Vec::new();
            for (n, (add, pick)) in steps.into_iter().enumerate() {
                if add || given.is_empty() {
                    let seq = records.push(record(n));
                    prop_assert!(given.last().is_none_or(|last: &Seq| seq.0 == last.0 + 1));
                    given.push(seq);
                    model.insert(seq, n);
                } else {
                    // Removes a number given out, in flight or not.
                    let seq = given[given.len() - 1 - pick % given.len()];
                    prop_assert_eq!(records.remove(seq).map(|r| r.bytes), model.remove(&seq));
                }
                prop_assert_eq!(records.len(), model.len());
                prop_assert_eq!(records.first().map(|r| r.bytes), model.values().next().copied());
                prop_assert!(records.ring.len() <= span);
                for seq in &given {
                    prop_assert_eq!(records.get(*seq).map(|r| r.bytes), model.get(seq).copied());
                }
            }
        }
    }
}
