//! The ledger: every transaction and record between the replication stream and Kafka's
//! acknowledgement, in one place.
//!
//! Records are numbered in the order they were first handed to the producer (their [`Seq`]);
//! transactions in commit order (their [`TxnId`]). The ledger folds acknowledgements into the
//! watermark, the one position that may be confirmed to PostgreSQL, and holds what the in-flight
//! window and the latency metrics need (bytes, commit time, first hand-over time). Records are
//! kept in an [`InFlightRecords`]: constant time for the many acknowledged about in order.
//!
//! # Invariants
//! - The watermark is the end LSN of a committed transaction such that it and every earlier
//!   transaction have all their records acknowledged (or replaced by an acknowledged dead
//!   letter), or a keepalive position reached while nothing was pending, or the start position.
//!   It never moves backwards.
//! - A transaction is kept only while it has a record not yet acknowledged, or is the open one:
//!   a settled transaction is folded into the one before it (or into the watermark if it is the
//!   oldest). So the ledger holds at most one transaction per record in flight, plus the open
//!   one, whatever the stream holds (DELETE-only cleanups, other tables' transactions, records
//!   acknowledged behind a stuck one).
//! - A record abandoned (not delivered before the session ends) keeps its transaction pending
//!   for the rest of the session: the watermark never passes it.

use crate::in_flight::InFlightRecords;
pub use crate::in_flight::{InFlight, Seq, TxnId};
use pgoutput::Lsn;
use std::collections::BTreeMap;
use std::time::Instant;

/// The span of record numbers the ledgers of the tests find in constant time: small, so that
/// they also take records out of the span.
#[cfg(test)]
const TEST_SPAN: usize = 4;

/// Why an event or acknowledgement does not fit the ledger (a bug, never ignored).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("no open transaction")]
    NoOpenTransaction,
    #[error("a transaction is already open")]
    AlreadyOpen,
    #[error("transaction {0:?} is not pending")]
    UnknownTransaction(TxnId),
    #[error("record {0:?} is not in flight")]
    UnknownRecord(Seq),
}

#[derive(Debug, Clone, Copy)]
struct Txn {
    unacked: u64,
    commit_lsn: Lsn,
    commit_time_us: i64,
    /// `None` while the transaction is open.
    end_lsn: Option<Lsn>,
}

/// What settling a record tells the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    pub record: InFlight,
    /// Commit time of its transaction (microseconds since 2000-01-01, as pgoutput sends it).
    pub commit_time_us: i64,
    /// The new watermark, if it moved.
    pub watermark: Option<Lsn>,
}

/// Transactions and records between the stream and Kafka's acknowledgement.
#[derive(Debug)]
pub struct Ledger {
    txns: BTreeMap<TxnId, Txn>,
    open: Option<TxnId>,
    next_txn: u64,
    records: InFlightRecords,
    bytes: usize,
    /// Records abandoned this session (their transactions stay pending).
    abandoned: u64,
    watermark: Lsn,
}

impl Ledger {
    /// An empty ledger for the tests, whose watermark starts at `start`.
    #[cfg(test)]
    pub fn new(start: Lsn) -> Self {
        Self::with_span(start, TEST_SPAN)
    }

    /// An empty ledger whose watermark starts at `start` (the slot's confirmed position),
    /// finding the records of the last `span` numbers handed over in
    /// constant time (older ones still in flight in logarithmic time): a few times the
    /// in-flight window keeps nearly every record in that span.
    pub fn with_span(start: Lsn, span: usize) -> Self {
        Ledger {
            txns: BTreeMap::new(),
            open: None,
            next_txn: 0,
            records: InFlightRecords::new(span),
            bytes: 0,
            abandoned: 0,
            watermark: start,
        }
    }

    /// The position that may be confirmed to PostgreSQL.
    pub fn watermark(&self) -> Lsn {
        self.watermark
    }

    /// Records in flight (handed to the producer, not settled).
    pub fn records(&self) -> usize {
        self.records.len()
    }

    /// Bytes of the records in flight.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Transactions kept (pending or open).
    pub fn transactions(&self) -> usize {
        self.txns.len()
    }

    /// The open transaction, if any.
    pub fn open(&self) -> Option<TxnId> {
        self.open
    }

    /// When the oldest record in flight was first handed over (records are numbered in the
    /// order they were first handed over, and a record sent again keeps its number).
    pub fn oldest_sent(&self) -> Option<Instant> {
        self.records.first().map(|r| r.first_sent)
    }

    /// The record `seq`, if in flight.
    pub fn get(&self, seq: Seq) -> Option<&InFlight> {
        self.records.get(seq)
    }

    /// The commit LSN of a pending transaction.
    pub fn commit_lsn(&self, txn: TxnId) -> Option<Lsn> {
        self.txns.get(&txn).map(|t| t.commit_lsn)
    }

    /// A transaction begins.
    pub fn begin(&mut self, commit_lsn: Lsn, commit_time_us: i64) -> Result<TxnId, LedgerError> {
        if self.open.is_some() {
            return Err(LedgerError::AlreadyOpen);
        }
        let id = TxnId(self.next_txn);
        self.next_txn += 1;
        self.txns.insert(
            id,
            Txn {
                unacked: 0,
                commit_lsn,
                commit_time_us,
                end_lsn: None,
            },
        );
        self.open = Some(id);
        Ok(id)
    }

    /// A record of `txn` (open, or pending: a dead letter replacing a failed record) is handed
    /// to the producer; returns its number.
    pub fn add(&mut self, txn: TxnId, bytes: usize, now: Instant) -> Result<Seq, LedgerError> {
        let entry = self
            .txns
            .get_mut(&txn)
            .ok_or(LedgerError::UnknownTransaction(txn))?;
        entry.unacked += 1;
        let seq = self.records.push(InFlight {
            txn,
            bytes,
            first_sent: now,
        });
        self.bytes += bytes;
        Ok(seq)
    }

    /// The open transaction committed at `end_lsn`. Returns the new watermark if it moved.
    pub fn commit(&mut self, end_lsn: Lsn) -> Result<Option<Lsn>, LedgerError> {
        let id = self.open.take().ok_or(LedgerError::NoOpenTransaction)?;
        let txn = self
            .txns
            .get_mut(&id)
            .ok_or(LedgerError::UnknownTransaction(id))?;
        txn.end_lsn = Some(end_lsn);
        Ok(self.fold_if_settled(id))
    }

    /// Record `seq` was acknowledged by Kafka (or replaced by a dead letter that was added to
    /// its transaction first).
    pub fn settle(&mut self, seq: Seq) -> Result<Settled, LedgerError> {
        let record = self
            .records
            .remove(seq)
            .ok_or(LedgerError::UnknownRecord(seq))?;
        self.bytes -= record.bytes;
        let txn = self
            .txns
            .get_mut(&record.txn)
            .ok_or(LedgerError::UnknownTransaction(record.txn))?;
        txn.unacked -= 1;
        let commit_time_us = txn.commit_time_us;
        Ok(Settled {
            record,
            commit_time_us,
            watermark: self.fold_if_settled(record.txn),
        })
    }

    /// Record `seq` will not be delivered in this session: it leaves the window, but its
    /// transaction stays pending, so the watermark never passes it.
    pub fn abandon(&mut self, seq: Seq) -> Result<InFlight, LedgerError> {
        let record = self
            .records
            .remove(seq)
            .ok_or(LedgerError::UnknownRecord(seq))?;
        self.bytes -= record.bytes;
        self.abandoned += 1;
        Ok(record)
    }

    /// Records abandoned this session.
    pub fn abandoned(&self) -> u64 {
        self.abandoned
    }

    /// The server has sent everything up to `wal_end` outside any transaction. When nothing is
    /// pending, the watermark moves there (keeps the slot moving while the outbox is quiet).
    pub fn idle(&mut self, wal_end: Lsn) -> Option<Lsn> {
        if self.txns.is_empty() && wal_end > self.watermark {
            self.watermark = wal_end;
            return Some(wal_end);
        }
        None
    }

    /// Removes `id` if it is committed and has nothing unacknowledged, folding its end into the
    /// transaction before it, or into the watermark when it is the oldest.
    fn fold_if_settled(&mut self, id: TxnId) -> Option<Lsn> {
        let txn = *self.txns.get(&id)?;
        let end = match txn.end_lsn {
            Some(end) if txn.unacked == 0 => end,
            _ => return None,
        };
        self.txns.remove(&id);
        if let Some((_, before)) = self.txns.range_mut(..id).next_back() {
            // Committed (only the newest transaction can be open); ends grow in commit order.
            before.end_lsn = before.end_lsn.map(|e| e.max(end));
            return None;
        }
        // The oldest: everything before it is settled. Its end may have absorbed later ones.
        if end > self.watermark {
            self.watermark = end;
            return Some(end);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn now() -> Instant {
        Instant::now()
    }

    #[test]
    fn watermark_moves_only_over_a_settled_committed_prefix() {
        let mut l = Ledger::new(Lsn(10));
        let a = l.begin(Lsn(1), 0).unwrap();
        let a1 = l.add(a, 5, now()).unwrap();
        let a2 = l.add(a, 5, now()).unwrap();
        assert_eq!(l.commit(Lsn(100)).unwrap(), None);
        let b = l.begin(Lsn(2), 0).unwrap();
        let b1 = l.add(b, 5, now()).unwrap();
        assert_eq!(l.commit(Lsn(200)).unwrap(), None);
        assert_eq!(l.settle(b1).unwrap().watermark, None, "later one first");
        assert_eq!(
            l.transactions(),
            1,
            "a settled transaction folds into the one before"
        );
        assert_eq!(l.settle(a1).unwrap().watermark, None);
        assert_eq!(l.settle(a2).unwrap().watermark, Some(Lsn(200)));
        assert_eq!((l.records(), l.bytes(), l.transactions()), (0, 0, 0));
    }

    #[test]
    fn empty_transactions_behind_a_stuck_record_do_not_accumulate() {
        let mut l = Ledger::new(Lsn(0));
        let a = l.begin(Lsn(1), 0).unwrap();
        let stuck = l.add(a, 1, now()).unwrap();
        l.commit(Lsn(10)).unwrap();
        for i in 0..10_000u64 {
            l.begin(Lsn(20 + i), 0).unwrap();
            l.commit(Lsn(21 + i)).unwrap();
        }
        assert_eq!(l.transactions(), 1);
        assert_eq!(l.settle(stuck).unwrap().watermark, Some(Lsn(21 + 9_999)));
    }

    #[test]
    fn acknowledged_transactions_behind_a_stuck_record_do_not_accumulate() {
        let mut l = Ledger::new(Lsn(0));
        let a = l.begin(Lsn(1), 0).unwrap();
        let stuck = l.add(a, 1, now()).unwrap();
        l.commit(Lsn(10)).unwrap();
        for i in 0..1_000u64 {
            let t = l.begin(Lsn(20 + 2 * i), 0).unwrap();
            let r = l.add(t, 1, now()).unwrap();
            l.commit(Lsn(21 + 2 * i)).unwrap();
            l.settle(r).unwrap();
        }
        assert_eq!(l.transactions(), 1);
        assert_eq!(l.watermark(), Lsn(0));
        assert_eq!(l.settle(stuck).unwrap().watermark, Some(Lsn(21 + 2 * 999)));
    }

    #[test]
    fn open_transaction_holds_the_watermark_and_idle_waits() {
        let mut l = Ledger::new(Lsn(0));
        let a = l.begin(Lsn(1), 0).unwrap();
        let r = l.add(a, 1, now()).unwrap();
        assert_eq!(
            l.settle(r).unwrap().watermark,
            None,
            "acked but not committed"
        );
        assert_eq!(l.idle(Lsn(500)), None);
        assert_eq!(l.commit(Lsn(50)).unwrap(), Some(Lsn(50)));
        assert_eq!(l.idle(Lsn(90)), Some(Lsn(90)));
        assert_eq!(l.idle(Lsn(80)), None, "never backwards");
    }

    #[test]
    fn an_abandoned_record_holds_the_watermark() {
        let mut l = Ledger::new(Lsn(0));
        let a = l.begin(Lsn(1), 0).unwrap();
        let r = l.add(a, 7, now()).unwrap();
        l.commit(Lsn(10)).unwrap();
        l.abandon(r).unwrap();
        assert_eq!((l.records(), l.bytes()), (0, 0));
        let b = l.begin(Lsn(11), 0).unwrap();
        let r2 = l.add(b, 1, now()).unwrap();
        l.commit(Lsn(20)).unwrap();
        assert_eq!(l.settle(r2).unwrap().watermark, None);
        assert_eq!(l.idle(Lsn(30)), None);
        assert_eq!(l.watermark(), Lsn(0));
    }

    #[test]
    fn a_dead_letter_joins_its_transaction_before_the_failed_record_settles() {
        let mut l = Ledger::new(Lsn(0));
        let a = l.begin(Lsn(1), 0).unwrap();
        let failed = l.add(a, 1, now()).unwrap();
        l.commit(Lsn(10)).unwrap();
        let letter = l.add(a, 1, now()).unwrap();
        assert_eq!(l.settle(failed).unwrap().watermark, None);
        assert_eq!(l.settle(letter).unwrap().watermark, Some(Lsn(10)));
        assert_eq!(l.add(a, 1, now()), Err(LedgerError::UnknownTransaction(a)));
    }

    #[test]
    fn misuse_is_an_error() {
        let mut l = Ledger::new(Lsn(0));
        assert_eq!(l.commit(Lsn(1)), Err(LedgerError::NoOpenTransaction));
        l.begin(Lsn(0), 0).unwrap();
        assert_eq!(l.begin(Lsn(0), 0), Err(LedgerError::AlreadyOpen));
        assert_eq!(l.settle(Seq(9)), Err(LedgerError::UnknownRecord(Seq(9))));
    }

    proptest! {
        /// Against a model: whatever order acknowledgements arrive in, the watermark is the end
        /// of the longest committed prefix whose records are all acknowledged, and the ledger
        /// keeps no more transactions than records in flight.
        #[test]
        fn watermark_matches_model(sizes in prop::collection::vec(0u8..4, 1..16), seed in any::<u64>()) {
            let mut l = Ledger::new(Lsn(0));
            let mut seqs = Vec::new();
            for (i, &n) in sizes.iter().enumerate() {
                let t = l.begin(Lsn(0), 0).unwrap();
                for _ in 0..n { seqs.push((i, l.add(t, 1, now()).unwrap())); }
                l.commit(Lsn((i as u64 + 1) * 100)).unwrap();
            }
            let mut state = seed | 1;
            for i in (1..seqs.len()).rev() {
                state ^= state << 13; state ^= state >> 7; state ^= state << 17;
                seqs.swap(i, (state % (i as u64 + 1)) as usize);
            }
            let mut acked = vec![0u8; sizes.len()];
            for (i, seq) in seqs {
                l.settle(seq).unwrap();
                acked[i] += 1;
                let prefix = sizes.iter().zip(&acked).take_while(|(s, a)| s == a).count();
                prop_assert_eq!(l.watermark(), Lsn(prefix as u64 * 100));
                prop_assert!(l.transactions() <= l.records());
            }
            prop_assert_eq!(l.watermark(), Lsn(sizes.len() as u64 * 100));
        }
    }
}
