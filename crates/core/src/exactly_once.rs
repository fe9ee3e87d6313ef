//! Exactly-once delivery: Kafka transactions around whole PostgreSQL transactions, and the
//! progress that says where the last committed one ended.
//!
//! The session hands records to a transactional producer. A Kafka transaction opens before its
//! first record ([`KafkaTransactions::before_send`]), takes whole PostgreSQL transactions (a
//! transaction larger than [`TransactionBounds::max_bytes`] is split at a record), and is
//! committed when it is old or large enough, or when the session stops, together with a
//! progress record naming its last record ([`Progress`]). A new session reads the last
//! committed progress and skips every record at or before it ([`Progress::covers`]), so a
//! read_committed consumer sees each record once, whatever failed in between.
//!
//! # Invariants
//! - **No confirmation past an uncommitted record.** A position is confirmed to the slot only
//!   if every record before it is in a committed Kafka transaction: while a Kafka transaction
//!   is open or committing, the flow's watermark is capped by the end of the last PostgreSQL
//!   transaction a successful commit covered; with none open, nothing sent is uncommitted and
//!   the watermark passes as it is (so a quiet outbox still moves the slot).
//! - **Progress is exact.** The progress committed with a Kafka transaction names the last
//!   record handed over in it (its PostgreSQL commit LSN and its index among the transaction's
//!   records), and whether its PostgreSQL transaction was complete: a record is covered by it
//!   if and only if it was committed in this or an earlier Kafka transaction.
//! - Nothing is handed over while a commit runs: the session reads nothing new from the moment
//!   a commit is due until its outcome is known.
//! - A failed commit is never retried on the same producer: the session ends, and the next one
//!   starts from the last committed progress.
//! - Nothing is committed once the session failed ([`KafkaTransactions::abandon`]): a record
//!   counted in the progress may never have reached the producer (not taken, or handed back
//!   while it waited for its topic), and librdkafka would commit the transaction without it.

use pgoutput::Lsn;
use std::time::{Duration, Instant};

/// How far past a bound a Kafka transaction grows before it is committed in the middle of a
/// PostgreSQL transaction.
pub const SPLIT_FACTOR: u32 = 4;

/// When a Kafka transaction is committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransactionBounds {
    /// Committed once it has been open this long (and its records were handed over).
    pub max_age: Duration,
    /// Committed once its records reach this many bytes.
    pub max_bytes: usize,
}

/// How much of a PostgreSQL transaction a progress covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Through {
    /// Its records up to this index (from 0), the rest not yet.
    Record(u32),
    /// All of it (it was complete when the Kafka transaction committed).
    All,
}

/// A position in the stream of records: everything at or before it was committed to Kafka.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// The commit LSN of the PostgreSQL transaction of the last committed record.
    pub commit_lsn: Lsn,
    /// How much of that transaction was committed.
    pub through: Through,
    /// Where that transaction ended, when it was complete.
    pub end_lsn: Option<Lsn>,
}

impl Progress {
    /// Whether the record `index` of the transaction committed at `commit_lsn` was committed
    /// to Kafka at or before this progress (transactions reach the stream in commit order).
    pub fn covers(&self, commit_lsn: Lsn, index: u32) -> bool {
        if commit_lsn != self.commit_lsn {
            return commit_lsn < self.commit_lsn;
        }
        match self.through {
            Through::All => true,
            Through::Record(last) => index <= last,
        }
    }

    /// The progress that covers every transaction committed before `lsn` and none committed
    /// at or after it, `lsn` being where a WAL record ends (a timeline's switchpoint): it names
    /// `lsn - 1`, where no commit record can start (no record is one byte long).
    pub fn everything_before(lsn: Lsn) -> Progress {
        Progress {
            commit_lsn: Lsn(lsn.0.saturating_sub(1)),
            through: Through::All,
            end_lsn: Some(lsn),
        }
    }

    /// Whether the whole transaction committed at `commit_lsn` was committed to Kafka.
    pub fn covers_all_of(&self, commit_lsn: Lsn) -> bool {
        commit_lsn < self.commit_lsn
            || (commit_lsn == self.commit_lsn && self.through == Through::All)
    }
}

/// What the session must do about the Kafka transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionStep {
    /// Begin a Kafka transaction before the next record.
    Begin,
    /// Write `progress` in the open transaction and commit it; answer with
    /// [`KafkaTransactions::committed`].
    Commit(Progress),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No Kafka transaction: everything handed over is committed.
    Idle,
    /// Open since `since`, with `bytes` of records.
    Open { since: Instant, bytes: usize },
    /// Open, and to be committed as soon as the records queued so far are handed over.
    Due,
    /// The commit runs.
    Committing,
}

/// The Kafka transaction of an exactly-once session.
#[derive(Debug)]
pub struct KafkaTransactions {
    bounds: TransactionBounds,
    state: State,
    /// The last record handed over in the open transaction.
    last: Option<Progress>,
    /// The end of the last PostgreSQL transaction read completely while the Kafka transaction
    /// was open (everything before it is in the Kafka transaction or an earlier one).
    read_through: Lsn,
    /// The end of the last PostgreSQL transaction a successful commit covered.
    committed_through: Lsn,
    /// The last committed progress (read at the start, then each commit's).
    committed: Option<Progress>,
    /// The flow's watermark (acknowledged, perhaps not committed).
    acknowledged: Lsn,
    /// The last position given to confirm.
    confirmed: Lsn,
    /// The session stops once the open transaction is committed.
    stopping: bool,
    /// The session failed: no commit starts.
    abandoned: bool,
}

impl KafkaTransactions {
    /// A session that starts at `start` (confirmed: nothing before it is needed again), after
    /// the progress `committed` read from Kafka (`None`: none recorded).
    pub fn new(bounds: TransactionBounds, start: Lsn, committed: Option<Progress>) -> Self {
        KafkaTransactions {
            bounds,
            state: State::Idle,
            last: None,
            read_through: start,
            committed_through: start,
            committed,
            acknowledged: start,
            confirmed: start,
            stopping: false,
            abandoned: false,
        }
    }

    /// The last committed progress.
    pub fn committed(&self) -> Option<Progress> {
        self.committed
    }

    /// Whether records may be read and handed over (no commit due or running).
    pub fn can_send(&self) -> bool {
        matches!(self.state, State::Idle | State::Open { .. })
    }

    /// Whether a Kafka transaction is open (records handed over, not yet committed).
    pub fn is_open(&self) -> bool {
        !matches!(self.state, State::Idle)
    }

    /// Whether the record `index` of the transaction committed at `commit_lsn` is already in
    /// Kafka (committed by an earlier session): it is not sent again.
    pub fn already_committed(&self, commit_lsn: Lsn, index: u32) -> bool {
        self.committed
            .is_some_and(|progress| progress.covers(commit_lsn, index))
    }

    /// A record of `bytes` is about to be handed over: [`TransactionStep::Begin`] when no
    /// Kafka transaction is open.
    pub fn before_send(&mut self, now: Instant) -> Option<TransactionStep> {
        match self.state {
            State::Idle => {
                self.state = State::Open {
                    since: now,
                    bytes: 0,
                };
                Some(TransactionStep::Begin)
            }
            _ => None,
        }
    }

    /// The record `index` of the transaction committed at `commit_lsn`, of `bytes`, was handed
    /// over (after [`KafkaTransactions::before_send`]).
    pub fn sent(&mut self, commit_lsn: Lsn, index: u32, bytes: usize) {
        if let State::Open { bytes: total, .. } = &mut self.state {
            *total = total.saturating_add(bytes);
        }
        let through = match self.last {
            // A dead letter that replaces an earlier record keeps the furthest position.
            Some(last) if last.commit_lsn == commit_lsn => match last.through {
                Through::Record(i) if i >= index => last.through,
                _ => Through::Record(index),
            },
            _ => Through::Record(index),
        };
        self.last = Some(Progress {
            commit_lsn,
            through,
            end_lsn: None,
        });
    }

    /// The PostgreSQL transaction committed at `commit_lsn` ended at `end_lsn`: all its
    /// records were handed over.
    pub fn transaction_read(&mut self, commit_lsn: Lsn, end_lsn: Lsn) {
        if !self.is_open() {
            return;
        }
        self.read_through = self.read_through.max(end_lsn);
        if let Some(last) = &mut self.last {
            if last.commit_lsn == commit_lsn {
                last.through = Through::All;
                last.end_lsn = Some(end_lsn);
            }
        }
    }

    /// The flow's watermark moved to `watermark`: the position to confirm, if any.
    pub fn acknowledged(&mut self, watermark: Lsn) -> Option<Lsn> {
        self.acknowledged = self.acknowledged.max(watermark);
        self.confirmable()
    }

    fn confirmable(&mut self) -> Option<Lsn> {
        let limit = match self.state {
            State::Idle => self.acknowledged,
            _ => self.acknowledged.min(self.committed_through),
        };
        (limit > self.confirmed).then(|| {
            self.confirmed = limit;
            limit
        })
    }

    /// The position confirmed so far (what a next session may start from).
    pub fn confirmed(&self) -> Lsn {
        self.confirmed
    }

    /// After each input: whether the open transaction is due for a commit at `now`.
    /// `between`: no PostgreSQL transaction is being read. A Kafka transaction ends between
    /// PostgreSQL transactions once a bound is reached; one PostgreSQL transaction is split only
    /// when it alone goes well past a bound ([`SPLIT_FACTOR`] times).
    pub fn check(&mut self, now: Instant, between: bool) {
        if let State::Open { since, bytes } = self.state {
            let factor = if between { 1 } else { SPLIT_FACTOR };
            let age = now.saturating_duration_since(since);
            if self.stopping
                || bytes >= self.bounds.max_bytes.saturating_mul(factor as usize)
                || age >= self.bounds.max_age * factor
            {
                self.state = State::Due;
            }
        }
    }

    /// When [`KafkaTransactions::check`] can next find the open transaction due, with
    /// `between` as [`KafkaTransactions::check`] takes it: the age bound between PostgreSQL
    /// transactions, the split bound within one. A time at which `check` would change nothing
    /// is never returned (a caller that wakes up at it would wake up again at once, and a
    /// loop that serves timers first would read nothing meanwhile).
    pub fn next_timeout(&self, between: bool) -> Option<Instant> {
        let factor = if between { 1 } else { SPLIT_FACTOR };
        match self.state {
            State::Open { since, .. } => Some(since + self.bounds.max_age * factor),
            _ => None,
        }
    }

    /// The session stops: the open transaction is committed at once. Returns whether one is
    /// open (the stop then waits for [`KafkaTransactions::committed`]).
    pub fn stop(&mut self) -> bool {
        self.stopping = true;
        if let State::Open { .. } = self.state {
            self.state = State::Due;
        }
        self.is_open()
    }

    /// Commits the open transaction as soon as everything queued is handed over (a record that
    /// must travel alone is next, or has just been sent).
    pub fn force_commit(&mut self) {
        if let State::Open { .. } = self.state {
            self.state = State::Due;
        }
    }

    /// The session failed: the open transaction is left to be aborted, no commit starts (one
    /// running ends as it ends).
    pub fn abandon(&mut self) {
        self.abandoned = true;
    }

    /// Whether a commit may start (the session did not fail).
    pub fn may_commit(&self) -> bool {
        !self.abandoned
    }

    /// The commit to run now, if one is due (call once everything queued is handed over).
    pub fn commit_step(&mut self) -> Option<TransactionStep> {
        if self.state != State::Due || self.abandoned {
            return None;
        }
        self.state = State::Committing;
        let progress = self.last.or(self.committed)?;
        Some(TransactionStep::Commit(progress))
    }

    /// The commit of [`TransactionStep::Commit`] succeeded: the position to confirm, if any.
    pub fn committed_ok(&mut self) -> Option<Lsn> {
        if self.state != State::Committing {
            return None;
        }
        self.state = State::Idle;
        if let Some(last) = self.last.take() {
            self.committed = Some(last);
        }
        self.committed_through = self.committed_through.max(self.read_through);
        self.confirmable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds() -> TransactionBounds {
        TransactionBounds {
            max_age: Duration::from_millis(100),
            max_bytes: 1_000,
        }
    }

    fn progress(commit: u64, through: Through) -> Progress {
        Progress {
            commit_lsn: Lsn(commit),
            through,
            end_lsn: None,
        }
    }

    #[test]
    fn a_progress_covers_what_was_committed_and_nothing_after() {
        let whole = progress(200, Through::All);
        assert!(whole.covers(Lsn(100), 7));
        assert!(whole.covers(Lsn(200), 1_000));
        assert!(!whole.covers(Lsn(300), 0));
        assert!(whole.covers_all_of(Lsn(200)));
        let part = progress(200, Through::Record(3));
        assert!(part.covers(Lsn(200), 3));
        assert!(!part.covers(Lsn(200), 4));
        assert!(!part.covers_all_of(Lsn(200)));
        assert!(part.covers_all_of(Lsn(199)));
    }

    #[test]
    fn everything_before_a_switchpoint_is_every_transaction_committed_before_it() {
        let before = Progress::everything_before(Lsn(0x300_0158));
        assert!(before.covers(Lsn(0x300_0100), 9));
        assert!(before.covers_all_of(Lsn(0x300_0130)));
        assert!(!before.covers(Lsn(0x300_0158), 0));
        assert!(!before.covers(Lsn(0x300_0160), 0));
        assert!(!Progress::everything_before(Lsn(0)).covers(Lsn(1), 0));
    }

    #[test]
    fn nothing_uncommitted_is_confirmed_and_a_quiet_stream_still_moves() {
        let t0 = Instant::now();
        let mut txns = KafkaTransactions::new(bounds(), Lsn(10), None);
        // A quiet stream: nothing open, the watermark passes.
        assert_eq!(txns.acknowledged(Lsn(20)), Some(Lsn(20)));
        assert_eq!(txns.before_send(t0), Some(TransactionStep::Begin));
        txns.sent(Lsn(30), 0, 10);
        txns.transaction_read(Lsn(30), Lsn(40));
        // Acknowledged, not committed: capped.
        assert_eq!(txns.acknowledged(Lsn(40)), None);
        txns.check(t0 + Duration::from_millis(50), true);
        assert!(txns.can_send());
        // Within a PostgreSQL transaction only well past the bound.
        txns.check(t0 + Duration::from_millis(100), false);
        assert!(txns.can_send());
        txns.check(t0 + Duration::from_millis(100), true);
        assert!(!txns.can_send());
        assert_eq!(
            txns.commit_step(),
            Some(TransactionStep::Commit(Progress {
                commit_lsn: Lsn(30),
                through: Through::All,
                end_lsn: Some(Lsn(40)),
            }))
        );
        assert_eq!(txns.committed_ok(), Some(Lsn(40)));
        assert_eq!(txns.confirmed(), Lsn(40));
    }

    #[test]
    fn a_large_transaction_is_split_at_a_record_and_its_end_waits() {
        let t0 = Instant::now();
        let mut txns = KafkaTransactions::new(bounds(), Lsn(10), None);
        txns.before_send(t0);
        for i in 0..13 {
            txns.sent(Lsn(30), i, 300);
            txns.check(t0, false);
            assert!(txns.can_send(), "{i}");
        }
        txns.sent(Lsn(30), 13, 300);
        txns.check(t0, false);
        assert_eq!(
            txns.commit_step(),
            Some(TransactionStep::Commit(progress(30, Through::Record(13))))
        );
        // The records are acknowledged, the transaction is not complete: nothing to confirm.
        assert_eq!(txns.acknowledged(Lsn(10)), None);
        assert_eq!(txns.committed_ok(), None);
        assert!(txns.already_committed(Lsn(30), 13));
        assert!(!txns.already_committed(Lsn(30), 14));
        assert_eq!(txns.before_send(t0), Some(TransactionStep::Begin));
        txns.sent(Lsn(30), 14, 10);
        txns.transaction_read(Lsn(30), Lsn(50));
        assert_eq!(txns.acknowledged(Lsn(50)), None);
        txns.stop();
        assert!(matches!(
            txns.commit_step(),
            Some(TransactionStep::Commit(Progress {
                through: Through::All,
                ..
            }))
        ));
        assert_eq!(txns.committed_ok(), Some(Lsn(50)));
    }

    #[test]
    fn an_abandoned_session_commits_nothing() {
        let t0 = Instant::now();
        let mut txns = KafkaTransactions::new(bounds(), Lsn(10), None);
        txns.before_send(t0);
        txns.sent(Lsn(30), 0, 10);
        txns.transaction_read(Lsn(30), Lsn(40));
        txns.abandon();
        assert!(!txns.may_commit());
        txns.stop();
        assert_eq!(txns.commit_step(), None);
        assert_eq!(txns.acknowledged(Lsn(40)), None);
    }

    #[test]
    fn the_timeout_is_one_at_which_the_check_commits() {
        let t0 = Instant::now();
        let mut txns = KafkaTransactions::new(bounds(), Lsn(10), None);
        assert_eq!(txns.next_timeout(true), None);
        txns.before_send(t0);
        txns.sent(Lsn(30), 0, 1);
        // Within a PostgreSQL transaction the age bound changes nothing: the timeout is the
        // split bound, and the check at the age bound leaves the transaction open.
        let within = txns.next_timeout(false).expect("open");
        assert_eq!(within, t0 + bounds().max_age * SPLIT_FACTOR);
        txns.check(t0 + bounds().max_age, false);
        assert!(txns.can_send());
        txns.check(within, false);
        assert!(!txns.can_send(), "due at the split bound");
        let mut txns = KafkaTransactions::new(bounds(), Lsn(10), None);
        txns.before_send(t0);
        let between = txns.next_timeout(true).expect("open");
        txns.check(between, true);
        assert!(
            !txns.can_send(),
            "due at the age bound between transactions"
        );
    }

    #[test]
    fn a_dead_letter_for_an_earlier_record_keeps_the_furthest_position() {
        let t0 = Instant::now();
        let mut txns = KafkaTransactions::new(bounds(), Lsn(10), None);
        txns.before_send(t0);
        txns.sent(Lsn(30), 0, 1);
        txns.sent(Lsn(30), 1, 1);
        txns.sent(Lsn(30), 0, 1);
        txns.stop();
        assert_eq!(
            txns.commit_step(),
            Some(TransactionStep::Commit(progress(30, Through::Record(1))))
        );
    }
}
