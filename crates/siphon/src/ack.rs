//! The acknowledgement watermark.
//!
//! Transactions enter in commit order; each holds a count of records not yet acknowledged by
//! Kafka. Acknowledgements may arrive in any order across partitions; the watermark only moves
//! over a prefix of fully acknowledged, committed transactions (a finalizer per transaction,
//! folded in source order).
//!
//! # Invariants
//! - The watermark is the end LSN of a committed transaction such that it and every earlier
//!   transaction have all their records acknowledged, or a keepalive position reached while no
//!   transaction was pending, or the start position.
//! - The watermark never moves backwards.

use pgoutput::Lsn;
use std::collections::VecDeque;

/// Identifies a transaction within one tracker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TxnId(u64);

impl TxnId {
    /// The token given to the producer for a record of this transaction.
    pub fn token(self) -> usize {
        // Tokens round-trip through a usize; the id space of one session never exceeds it on
        // 64-bit targets, which the build requires.
        self.0 as usize
    }

    /// The transaction a producer token belongs to.
    pub fn from_token(token: usize) -> Self {
        TxnId(token as u64)
    }
}

#[derive(Debug, Clone, Copy)]
struct PendingTxn {
    unacked: u64,
    commit_lsn: Lsn,
    end_lsn: Option<Lsn>,
}

/// Why an acknowledgement or event does not fit the tracker's state (a bug, never ignored).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AckError {
    #[error("acknowledgement for unknown transaction {0:?}")]
    UnknownTransaction(TxnId),
    #[error("more acknowledgements than records for transaction {0:?}")]
    TooManyAcks(TxnId),
    #[error("no open transaction")]
    NoOpenTransaction,
    #[error("a transaction is already open")]
    AlreadyOpen,
}

/// Folds per-record acknowledgements into one confirmable LSN.
#[derive(Debug)]
pub struct AckTracker {
    /// Transactions not yet folded into the watermark, oldest first; `first` is the id of the
    /// front one.
    pending: VecDeque<PendingTxn>,
    first: u64,
    open: bool,
    watermark: Lsn,
}

impl AckTracker {
    /// A tracker whose watermark starts at `start` (the slot's confirmed position).
    pub fn new(start: Lsn) -> Self {
        AckTracker {
            pending: VecDeque::new(),
            first: 0,
            open: false,
            watermark: start,
        }
    }

    /// The position that may be confirmed to PostgreSQL.
    pub fn watermark(&self) -> Lsn {
        self.watermark
    }

    /// Transactions begun but not yet folded into the watermark.
    pub fn pending_transactions(&self) -> usize {
        self.pending.len()
    }

    /// Records handed to Kafka and not yet acknowledged.
    pub fn unacked_records(&self) -> u64 {
        self.pending.iter().map(|t| t.unacked).sum()
    }

    /// A transaction begins.
    pub fn begin(&mut self, commit_lsn: Lsn) -> Result<TxnId, AckError> {
        if self.open {
            return Err(AckError::AlreadyOpen);
        }
        self.open = true;
        self.pending.push_back(PendingTxn {
            unacked: 0,
            commit_lsn,
            end_lsn: None,
        });
        Ok(TxnId(self.first + self.pending.len() as u64 - 1))
    }

    /// A record of the open transaction was handed to Kafka.
    pub fn record(&mut self) -> Result<TxnId, AckError> {
        if !self.open {
            return Err(AckError::NoOpenTransaction);
        }
        let id = TxnId(self.first + self.pending.len() as u64 - 1);
        let txn = self.pending.back_mut().ok_or(AckError::NoOpenTransaction)?;
        txn.unacked += 1;
        Ok(id)
    }

    /// The commit LSN of a pending transaction.
    pub fn commit_lsn(&self, txn: TxnId) -> Option<Lsn> {
        let index = usize::try_from(txn.0.checked_sub(self.first)?).ok()?;
        self.pending.get(index).map(|t| t.commit_lsn)
    }

    /// One more record of `txn` (still pending) was handed to Kafka: a dead-letter record that
    /// replaces a failed one. Call it before acknowledging the failed record, so the transaction
    /// cannot fold in between.
    pub fn add_to(&mut self, txn: TxnId) -> Result<(), AckError> {
        let index = txn
            .0
            .checked_sub(self.first)
            .ok_or(AckError::UnknownTransaction(txn))?;
        let entry = usize::try_from(index)
            .ok()
            .and_then(|i| self.pending.get_mut(i))
            .ok_or(AckError::UnknownTransaction(txn))?;
        entry.unacked += 1;
        Ok(())
    }

    /// The open transaction committed at `end_lsn`. Returns the new watermark if it moved.
    pub fn commit(&mut self, end_lsn: Lsn) -> Result<Option<Lsn>, AckError> {
        if !self.open {
            return Err(AckError::NoOpenTransaction);
        }
        self.open = false;
        let txn = self.pending.back_mut().ok_or(AckError::NoOpenTransaction)?;
        txn.end_lsn = Some(end_lsn);
        Ok(self.fold())
    }

    /// One record of `txn` was acknowledged. Returns the new watermark if it moved.
    pub fn ack(&mut self, txn: TxnId) -> Result<Option<Lsn>, AckError> {
        let index = txn
            .0
            .checked_sub(self.first)
            .ok_or(AckError::UnknownTransaction(txn))?;
        let entry = usize::try_from(index)
            .ok()
            .and_then(|i| self.pending.get_mut(i))
            .ok_or(AckError::UnknownTransaction(txn))?;
        entry.unacked = entry
            .unacked
            .checked_sub(1)
            .ok_or(AckError::TooManyAcks(txn))?;
        Ok(self.fold())
    }

    /// The server has sent everything up to `wal_end` outside any transaction. When nothing is
    /// pending, the watermark may move there (keeps the slot moving while the outbox is quiet).
    pub fn idle(&mut self, wal_end: Lsn) -> Option<Lsn> {
        if self.pending.is_empty() && !self.open && wal_end > self.watermark {
            self.watermark = wal_end;
            return Some(wal_end);
        }
        None
    }

    /// Forgets the open transaction (its stream broke before Commit; it will be replayed).
    pub fn abandon_open(&mut self) {
        if self.open {
            self.open = false;
            self.pending.pop_back();
        }
    }

    fn fold(&mut self) -> Option<Lsn> {
        let before = self.watermark;
        while let Some(front) = self.pending.front() {
            match front.end_lsn {
                Some(end) if front.unacked == 0 => {
                    self.watermark = self.watermark.max(end);
                    self.pending.pop_front();
                    self.first += 1;
                }
                _ => break,
            }
        }
        (self.watermark > before).then_some(self.watermark)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn watermark_moves_only_over_fully_acked_committed_prefix() {
        let mut t = AckTracker::new(Lsn(10));
        let a = t.begin(Lsn(0)).unwrap();
        t.record().unwrap();
        t.record().unwrap();
        assert_eq!(t.commit(Lsn(100)).unwrap(), None);
        let b = t.begin(Lsn(0)).unwrap();
        t.record().unwrap();
        assert_eq!(t.commit(Lsn(200)).unwrap(), None);
        // The later transaction is acked first: nothing moves.
        assert_eq!(t.ack(b).unwrap(), None);
        assert_eq!(t.ack(a).unwrap(), None);
        assert_eq!(t.watermark(), Lsn(10));
        // The last record of the first transaction releases both.
        assert_eq!(t.ack(a).unwrap(), Some(Lsn(200)));
        assert_eq!(t.pending_transactions(), 0);
    }

    #[test]
    fn open_transaction_holds_the_watermark() {
        let mut t = AckTracker::new(Lsn(0));
        let a = t.begin(Lsn(0)).unwrap();
        t.record().unwrap();
        assert_eq!(t.ack(a).unwrap(), None, "acked but not committed");
        assert_eq!(
            t.idle(Lsn(500)),
            None,
            "no idle advance inside a transaction"
        );
        assert_eq!(t.commit(Lsn(50)).unwrap(), Some(Lsn(50)));
    }

    #[test]
    fn empty_transactions_and_idle_keepalives_advance() {
        let mut t = AckTracker::new(Lsn(5));
        t.begin(Lsn(0)).unwrap();
        assert_eq!(t.commit(Lsn(20)).unwrap(), Some(Lsn(20)));
        assert_eq!(t.idle(Lsn(90)), Some(Lsn(90)));
        assert_eq!(t.idle(Lsn(80)), None, "never backwards");
        assert_eq!(t.watermark(), Lsn(90));
    }

    #[test]
    fn idle_waits_for_pending_records() {
        let mut t = AckTracker::new(Lsn(0));
        let a = t.begin(Lsn(0)).unwrap();
        t.record().unwrap();
        t.commit(Lsn(30)).unwrap();
        assert_eq!(t.idle(Lsn(40)), None);
        assert_eq!(t.ack(a).unwrap(), Some(Lsn(30)));
        assert_eq!(t.idle(Lsn(40)), Some(Lsn(40)));
    }

    #[test]
    fn a_replacement_record_keeps_a_committed_transaction_pending() {
        let mut t = AckTracker::new(Lsn(0));
        let a = t.begin(Lsn(0)).unwrap();
        t.record().unwrap();
        t.commit(Lsn(10)).unwrap();
        // The record failed; its dead-letter replacement is added before the failure is settled.
        t.add_to(a).unwrap();
        assert_eq!(
            t.ack(a).unwrap(),
            None,
            "the replacement is still in flight"
        );
        assert_eq!(t.ack(a).unwrap(), Some(Lsn(10)));
        assert_eq!(
            t.add_to(a),
            Err(AckError::UnknownTransaction(a)),
            "folded transactions are gone"
        );
    }

    #[test]
    fn misuse_is_an_error() {
        let mut t = AckTracker::new(Lsn(0));
        assert_eq!(t.record(), Err(AckError::NoOpenTransaction));
        assert_eq!(t.commit(Lsn(1)), Err(AckError::NoOpenTransaction));
        let a = t.begin(Lsn(0)).unwrap();
        assert_eq!(t.begin(Lsn(0)), Err(AckError::AlreadyOpen));
        assert_eq!(t.ack(a), Err(AckError::TooManyAcks(a)));
        assert_eq!(
            t.ack(TxnId(99)),
            Err(AckError::UnknownTransaction(TxnId(99)))
        );
        t.abandon_open();
        assert_eq!(t.pending_transactions(), 0);
        assert!(t.begin(Lsn(0)).is_ok());
    }

    proptest! {
        /// Against a model: whatever order acks arrive in, the watermark is the end LSN of the
        /// longest committed prefix whose records are all acked.
        #[test]
        fn watermark_matches_model(sizes in prop::collection::vec(0u8..4, 1..12), seed in any::<u64>()) {
            let mut t = AckTracker::new(Lsn(0));
            let mut tokens = Vec::new();
            for (i, &n) in sizes.iter().enumerate() {
                let id = t.begin(Lsn(0)).unwrap();
                for _ in 0..n { t.record().unwrap(); tokens.push((i, id)); }
                t.commit(Lsn((i as u64 + 1) * 100)).unwrap();
            }
            // Deterministic shuffle.
            let mut state = seed | 1;
            for i in (1..tokens.len()).rev() {
                state ^= state << 13; state ^= state >> 7; state ^= state << 17;
                tokens.swap(i, (state % (i as u64 + 1)) as usize);
            }
            let mut acked = vec![0u8; sizes.len()];
            for (i, id) in tokens {
                t.ack(id).unwrap();
                acked[i] += 1;
                let prefix = sizes.iter().zip(&acked).take_while(|(s, a)| s == a).count();
                let expected = if prefix == 0 { Lsn(0) } else { Lsn(prefix as u64 * 100) };
                // Leading empty transactions fold at commit time.
                let leading_empty = sizes.iter().take_while(|&&s| s == 0).count();
                let expected = expected.max(Lsn(leading_empty as u64 * 100));
                prop_assert_eq!(t.watermark(), expected);
            }
            prop_assert_eq!(t.watermark(), Lsn(sizes.len() as u64 * 100));
        }
    }
}
