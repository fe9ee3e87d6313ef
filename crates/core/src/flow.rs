//! The session's delivery state machine: records between the stream and the producer, the
//! fence around producer failures, the delivery deadline, replacement pacing and the stop.
//!
//! The session engine routes rows into records and hands them here; it maps the producer's
//! reports into [`Outcome`]s, and reads out the [`FlowAction`]s queued here in order. The
//! queue holds the engine's own entries (`A`, which every [`FlowAction`] converts into): its
//! own actions, such as catalog lookups, are queued here too, so every action keeps its
//! place. Nothing here does IO or reads a clock: time comes with each
//! call as a [`Now`].
//!
//! # Invariants
//! - The only position ever confirmed is the [`Ledger`] watermark.
//! - **Fence.** When a record fails (the producer failed, or the broker refused it), nothing new
//!   is sent until every record handed to the producer has reported; the failed ones are then
//!   sent again in their original order (a record the broker refused is sent *alone*, to tell a
//!   guilty record from the innocent ones that shared its batch); only then does reading resume.
//! - A producer is purged at most once per fence, and replaced only after all its records
//!   reported; replacements without a delivery in between back off (capped, with jitter): no
//!   loop without backoff.
//! - **Delivery deadline.** While no fence is up and the session is not stopping, the oldest
//!   record with the producer (timed from the current producer's start when it was sent again)
//!   overdue by the delivery timeout raises the fence, replacing the producer.
//! - Records handed back by a purge are held and sent again like failed ones, never lost.
//! - Once stopping, nothing is sent again: held records are abandoned (the next session repeats
//!   them), and the stop finishes when every record reported or at its deadline.

use crate::backoff::Backoff;
use crate::ledger::{Ledger, LedgerError, Seq, Settled, TxnId};
use crate::record::Records;
use pgoutput::Lsn;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};
use tracing::{debug, warn};

/// The current time, as the driver read it.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    /// For timers (shutdown deadline, producer replacement backoff, delivery deadline).
    pub instant: Instant,
    /// For commit-to-acknowledgement latency (commit times are wall-clock times).
    pub wall: SystemTime,
}

impl Now {
    /// The machine's clocks (for the driver; the core itself never reads them).
    pub fn read() -> Self {
        Now {
            instant: Instant::now(),
            wall: SystemTime::now(),
        }
    }
}

/// The delivery state machine's fixed settings.
#[derive(Debug, Clone, Copy)]
pub struct FlowSettings {
    pub max_in_flight_records: usize,
    pub max_in_flight_bytes: usize,
    pub shutdown_timeout: Duration,
    /// How long a record may wait for its acknowledgement before the producer is given up:
    /// purged (nothing queued after the late record is sent by it), replaced, and everything
    /// unacknowledged sent again in order. `None`: no deadline.
    pub delivery_timeout: Option<Duration>,
    /// The first and the longest pause between two producer replacements without a delivery
    /// in between.
    pub replacement_backoff: (Duration, Duration),
    /// A record refused for good is dead-lettered (else the session stops with the refusal).
    pub dead_letters: bool,
}

/// What happened to a record handed to the producer (but its acknowledgement, see
/// [`Flow::delivered`]).
#[derive(Debug)]
pub enum Outcome<R, F> {
    /// The record cannot be written as it is (`fault` says why). `at_enqueue`: the producer
    /// refused it alone, at enqueue; otherwise the broker refused its batch, which it may only
    /// have shared with the guilty record.
    Refused {
        token: usize,
        record: R,
        fault: F,
        at_enqueue: bool,
    },
    /// The producer failed it, or did not take it: send it again, after replacing the
    /// producer if `replace`.
    Failed {
        token: usize,
        record: R,
        replace: bool,
    },
    /// A purge of the producer handed it back: sent again on the replacement.
    Purged { token: usize, record: R },
}

/// Why the flow stops the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlowError<F> {
    /// A record refused for good with no dead letters configured.
    Refused(F),
    /// The ledger was used against its rules (a bug).
    Ledger(LedgerError),
}

impl<F> From<LedgerError> for FlowError<F> {
    fn from(e: LedgerError) -> Self {
        FlowError::Ledger(e)
    }
}

/// A record refused for good, sent alone, with dead letters configured: the session layer
/// writes its dead letter ([`Flow::dead_lettered`]) or stops.
#[derive(Debug)]
pub struct ToDeadLetter<R, F> {
    pub seq: Seq,
    pub txn: TxnId,
    pub record: R,
    pub fault: F,
}

/// What the flow asks for, in order.
#[derive(Debug)]
pub enum FlowAction<R, E> {
    /// Hand `record` to the current producer; its report carries `token`.
    Send { token: usize, record: R },
    /// Everything before this position is delivered: report it as flushed.
    Confirm(Lsn),
    /// Purge the current producer: its queued and in-flight records come back as failed
    /// reports (and the records waiting for a topic as [`Outcome::Purged`]).
    PurgeProducer,
    /// The producer is about to be replaced; `resend` records are sent again (for telemetry).
    Replacing { resend: usize },
    /// Replace the producer with a new one (its records have all reported).
    ReplaceProducer,
    /// The oldest record is overdue; `unacked` records are with the producer (for telemetry).
    Overdue { unacked: usize },
    /// The session is over.
    Finish(Result<(), E>),
}

/// A record taken back from the producer, to be sent again when the fence allows.
#[derive(Debug)]
struct Held<R, F> {
    record: R,
    /// The broker refused it (why), perhaps only because it shared a batch with a record the
    /// broker refuses: it is sent alone next.
    refused: Option<F>,
}

/// Nothing new is sent while a fence is up.
#[derive(Debug, Clone, Copy)]
struct Fence {
    /// The producer must be replaced before anything is sent again.
    replace: bool,
    /// The producer was asked to purge (once per fence).
    purged: bool,
}

/// Replacement pacing: replacements without a delivery in between back off.
#[derive(Debug)]
struct Pacer {
    backoff: Backoff,
    not_before: Option<Instant>,
    /// A record was delivered (or dead-lettered) since the last replacement.
    progress: bool,
    jitter: u64,
}

impl Pacer {
    fn new((initial, max): (Duration, Duration)) -> Self {
        Pacer {
            backoff: Backoff::new(initial, max),
            not_before: None,
            progress: true,
            jitter: 0x9E37_79B9_7F4A_7C15,
        }
    }

    /// Whether a replacement may happen at `now`; if so, books it.
    fn try_book(&mut self, now: Instant) -> bool {
        if self.progress {
            self.backoff.reset();
            self.not_before = None;
        }
        if self.not_before.is_some_and(|t| now < t) {
            return false;
        }
        // A small deterministic jitter source (xorshift): the core reads no randomness.
        self.jitter ^= self.jitter << 13;
        self.jitter ^= self.jitter >> 7;
        self.jitter ^= self.jitter << 17;
        let unit = (self.jitter >> 11) as f64 / (1u64 << 53) as f64;
        self.not_before = Some(now + self.backoff.next_delay(unit));
        self.progress = false;
        true
    }
}

#[derive(Debug)]
struct Stopping<E> {
    deadline: Instant,
    result: Result<(), E>,
}

/// The delivery state machine over records of kind `K`, refusal reasons `F`, the session's
/// error `E`, queueing its actions as the engine's queue entries `A`.
pub struct Flow<K: Records, F, E, A = FlowAction<<K as Records>::Record, E>> {
    settings: FlowSettings,
    ledger: Ledger,
    /// Records handed to the producer whose report has not arrived.
    with_producer: usize,
    fence: Option<Fence>,
    held: BTreeMap<Seq, Held<K::Record, F>>,
    /// The refused record being sent alone, and why it was refused.
    probing: Option<(Seq, F)>,
    pacer: Pacer,
    /// When the current producer was put in place (`None`: the session's first producer); a
    /// record sent again is timed from here, not from its first hand-over.
    producer_since: Option<Instant>,
    stopping: Option<Stopping<E>>,
    finished: bool,
    actions: VecDeque<A>,
}

impl<K: Records, F, E, A: From<FlowAction<K::Record, E>>> Flow<K, F, E, A> {
    /// A flow resuming at `start` (everything before it is delivered).
    pub fn new(settings: FlowSettings, start: Lsn) -> Self {
        // Twice the window: only a record whose report is later than a window's worth of
        // records after it leaves the ledger's constant-time span.
        let span = 2 * settings.max_in_flight_records.max(1);
        Flow {
            settings,
            ledger: Ledger::with_span(start, span),
            with_producer: 0,
            fence: None,
            held: BTreeMap::new(),
            probing: None,
            pacer: Pacer::new(settings.replacement_backoff),
            producer_since: None,
            stopping: None,
            finished: false,
            actions: VecDeque::new(),
        }
    }

    /// Whether new records may come: the window has room, no fence is up, not stopping.
    pub fn can_read(&self) -> bool {
        !self.finished
            && self.stopping.is_none()
            && self.fence.is_none()
            && self.ledger.records() < self.settings.max_in_flight_records.max(1)
            && self.ledger.bytes() < self.settings.max_in_flight_bytes.max(1)
    }

    /// When the flow wants to be called ([`Flow::after`]) at the latest.
    pub fn next_timeout(&self) -> Option<Instant> {
        // The replacement waits for its pacing only once every record reported: before that,
        // its time passing changes nothing (and a timer in the past would fire again at once).
        let rebuild = self
            .fence
            .filter(|f| f.replace && self.with_producer == 0)
            .and(self.pacer.not_before);
        let stop = self.stopping.as_ref().map(|s| s.deadline);
        [rebuild, stop, self.delivery_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// When the oldest record with the producer is overdue, if a deadline applies now.
    fn delivery_deadline(&self) -> Option<Instant> {
        let timeout = self.settings.delivery_timeout?;
        if self.fence.is_some() || self.stopping.is_some() || self.with_producer == 0 {
            return None;
        }
        let oldest = self.ledger.oldest_sent()?;
        let since = self.producer_since.map_or(oldest, |p| p.max(oldest));
        Some(since + timeout)
    }

    /// The next action, in order.
    pub fn poll_action(&mut self) -> Option<A> {
        self.actions.pop_front()
    }

    /// Queues an action of the session layer after those queued so far.
    pub fn push(&mut self, action: A) {
        self.actions.push_back(action);
    }

    /// Whether [`FlowAction::Finish`] was queued.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Whether the session is stopping (or stopped).
    pub fn is_stopping(&self) -> bool {
        self.stopping.is_some() || self.finished
    }

    /// The acknowledged position.
    pub fn watermark(&self) -> Lsn {
        self.ledger.watermark()
    }

    /// Records in flight and their bytes (the window).
    pub fn in_flight(&self) -> (usize, usize) {
        (self.ledger.records(), self.ledger.bytes())
    }

    /// When the oldest unacknowledged record was first handed over.
    pub fn oldest_sent(&self) -> Option<Instant> {
        self.ledger.oldest_sent()
    }

    /// Transactions the ledger keeps.
    pub fn pending_transactions(&self) -> usize {
        self.ledger.transactions()
    }

    /// Records given up this session (not delivered before it stopped).
    pub fn abandoned(&self) -> u64 {
        self.ledger.abandoned()
    }

    /// Records taken back from the producer and waiting to be sent again.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Records handed to the producer whose report has not arrived.
    pub fn with_producer(&self) -> usize {
        self.with_producer
    }

    /// The commit LSN of `txn`, if pending.
    pub fn commit_lsn(&self, txn: TxnId) -> Option<Lsn> {
        self.ledger.commit_lsn(txn)
    }

    /// A transaction begins.
    pub fn begin(&mut self, final_lsn: Lsn, commit_time_us: i64) -> Result<TxnId, LedgerError> {
        self.ledger.begin(final_lsn, commit_time_us)
    }

    /// The open transaction commits at `end_lsn`.
    pub fn commit(&mut self, end_lsn: Lsn) -> Result<(), LedgerError> {
        if let Some(watermark) = self.ledger.commit(end_lsn)? {
            self.confirm(watermark);
        }
        Ok(())
    }

    /// A keepalive outside any transaction at `wal_end`.
    pub fn idle(&mut self, wal_end: Lsn) {
        if let Some(watermark) = self.ledger.idle(wal_end) {
            self.confirm(watermark);
        }
    }

    /// Books a new record of `size` bytes in `txn` (hand it over with [`Flow::hand_over`]).
    pub fn add(&mut self, txn: TxnId, size: usize, now: Now) -> Result<Seq, LedgerError> {
        self.ledger.add(txn, size, now.instant)
    }

    /// Queues the sending of `record`, which the ledger holds as `seq`.
    pub fn hand_over(&mut self, seq: Seq, record: K::Record) {
        self.with_producer += 1;
        self.actions.push_back(
            FlowAction::Send {
                token: seq.token(),
                record,
            }
            .into(),
        );
    }

    /// Books and hands over a new record of `txn`.
    pub fn send_new(&mut self, now: Now, txn: TxnId, record: K::Record) -> Result<(), LedgerError> {
        let seq = self.add(txn, K::size(&record), now)?;
        self.hand_over(seq, record);
        Ok(())
    }

    /// The producer acknowledged the record of `token`: what settling it tells (the watermark
    /// is confirmed here if it moved).
    pub fn delivered(&mut self, token: usize) -> Result<Settled, LedgerError> {
        let seq = Seq::from_token(token);
        self.with_producer = self.with_producer.saturating_sub(1);
        self.take_probe(seq);
        self.pacer.progress = true;
        let settled = self.ledger.settle(seq)?;
        if let Some(watermark) = settled.watermark {
            self.confirm(watermark);
        }
        Ok(settled)
    }

    /// The record of `token` reported with an error the session stops on.
    pub fn reported_fatal(&mut self, token: usize) {
        self.with_producer = self.with_producer.saturating_sub(1);
        self.take_probe(Seq::from_token(token));
    }

    /// A record handed to the producer came back undelivered. `Ok(Some(_))`: it was refused
    /// for good while sent alone, with dead letters configured: the session layer writes its
    /// dead letter ([`Flow::dead_lettered`]).
    pub fn outcome(
        &mut self,
        outcome: Outcome<K::Record, F>,
    ) -> Result<Option<ToDeadLetter<K::Record, F>>, FlowError<F>> {
        match outcome {
            Outcome::Refused {
                token,
                record,
                fault,
                at_enqueue,
            } => {
                let seq = Seq::from_token(token);
                self.with_producer = self.with_producer.saturating_sub(1);
                let probe = self.take_probe(seq);
                self.refused(seq, record, fault, at_enqueue || probe.is_some())
            }
            Outcome::Failed {
                token,
                record,
                replace,
            } => {
                let seq = Seq::from_token(token);
                self.with_producer = self.with_producer.saturating_sub(1);
                let probe = self.take_probe(seq);
                self.hold(seq, record, probe, replace)?;
                Ok(None)
            }
            Outcome::Purged { token, record } => {
                let seq = Seq::from_token(token);
                self.with_producer = self.with_producer.saturating_sub(1);
                let probe = self.take_probe(seq);
                self.hold(seq, record, probe, true)?;
                Ok(None)
            }
        }
    }

    /// If `seq` is the record being sent alone, ends the probe and returns why it was refused.
    fn take_probe(&mut self, seq: Seq) -> Option<F> {
        match self.probing.take() {
            Some((probed, reason)) if probed == seq => Some(reason),
            other => {
                self.probing = other;
                None
            }
        }
    }

    /// Takes `record` back to send it again once the producer is replaced; a record being sent
    /// alone (`refused`) stays suspect.
    fn hold(
        &mut self,
        seq: Seq,
        record: K::Record,
        refused: Option<F>,
        replace: bool,
    ) -> Result<(), LedgerError> {
        if self.stopping.is_some() {
            debug!("record not delivered while stopping; it will be sent again");
            self.ledger.abandon(seq)?;
            return Ok(());
        }
        self.held.insert(seq, Held { record, refused });
        self.raise_fence(replace);
        Ok(())
    }

    /// The broker (or the producer, at enqueue) refused `record` for good. `alone`: it was the
    /// only record sent (else it may have been refused only for sharing a batch).
    fn refused(
        &mut self,
        seq: Seq,
        record: K::Record,
        fault: F,
        alone: bool,
    ) -> Result<Option<ToDeadLetter<K::Record, F>>, FlowError<F>> {
        if self.stopping.is_some() {
            self.ledger.abandon(seq)?;
            return Ok(None);
        }
        if !self.settings.dead_letters {
            // The refused batch holds the record at fault: stop, naming it.
            return Err(FlowError::Refused(fault));
        }
        if !alone {
            // Perhaps innocent: find out by sending it alone once everything before it settled.
            // A refused batch leaves a gap-less producer failed, so it is replaced first.
            self.held.insert(
                seq,
                Held {
                    record,
                    refused: Some(fault),
                },
            );
            self.raise_fence(true);
            return Ok(None);
        }
        let txn = self
            .ledger
            .get(seq)
            .map(|r| r.txn)
            .ok_or(LedgerError::UnknownRecord(seq))?;
        Ok(Some(ToDeadLetter {
            seq,
            txn,
            record,
            fault,
        }))
    }

    /// The dead letter `letter` replaces the refused record `seq` of `txn`: it joins the
    /// transaction before the refused record settles.
    pub fn dead_lettered(
        &mut self,
        now: Now,
        seq: Seq,
        txn: TxnId,
        letter: K::Record,
    ) -> Result<(), LedgerError> {
        self.pacer.progress = true;
        self.send_new(now, txn, letter)?;
        if let Some(watermark) = self.ledger.settle(seq)?.watermark {
            self.confirm(watermark);
        }
        Ok(())
    }

    /// Stops: nothing new is read or sent, what is in flight is waited for up to the shutdown
    /// timeout, then [`FlowAction::Finish`] with `result` (the first stop's).
    pub fn stop(&mut self, now: Now, result: Result<(), E>)
    where
        E: std::fmt::Display,
    {
        if self.stopping.is_some() {
            if let Err(e) = result {
                debug!(error = %e, "also failed while stopping");
            }
            return;
        }
        // Records waiting to be sent again are given up: the next session repeats them.
        for (seq, _) in std::mem::take(&mut self.held) {
            let _ = self.ledger.abandon(seq);
        }
        self.fence = None;
        self.probing = None;
        self.stopping = Some(Stopping {
            deadline: now.instant + self.settings.shutdown_timeout,
            result,
        });
    }

    /// After each input: the delivery deadline, then the fence and the stop moved along as far
    /// as the state allows.
    pub fn after(&mut self, now: Now) {
        if self.finished {
            return;
        }
        if self
            .delivery_deadline()
            .is_some_and(|deadline| now.instant >= deadline)
        {
            self.actions.push_back(
                FlowAction::Overdue {
                    unacked: self.with_producer,
                }
                .into(),
            );
            self.raise_fence(true);
        }
        self.advance(now);
    }

    fn advance(&mut self, now: Now) {
        if let Some(stopping) = &self.stopping {
            if self.with_producer == 0 || now.instant >= stopping.deadline {
                if self.with_producer > 0 {
                    warn!(
                        unacked = self.with_producer,
                        "gave up waiting for in-flight records; they will be sent again"
                    );
                }
                self.finished = true;
                if let Some(stopping) = self.stopping.take() {
                    self.actions
                        .push_back(FlowAction::Finish(stopping.result).into());
                }
            }
            return;
        }
        let Some(mut fence) = self.fence else { return };
        if self.with_producer > 0 {
            if fence.replace && !fence.purged {
                fence.purged = true;
                self.fence = Some(fence);
                self.actions.push_back(FlowAction::PurgeProducer.into());
            }
            return;
        }
        if fence.replace {
            if !self.pacer.try_book(now.instant) {
                return;
            }
            self.actions.push_back(
                FlowAction::Replacing {
                    resend: self.held.len(),
                }
                .into(),
            );
            self.actions.push_back(FlowAction::ReplaceProducer.into());
            self.producer_since = Some(now.instant);
            fence.replace = false;
            self.fence = Some(fence);
        }
        // Send the held records again, in their original order; a refused one alone.
        while let Some(entry) = self.held.first_entry() {
            let alone = entry.get().refused.is_some();
            if self.probing.is_some() || (alone && self.with_producer > 0) {
                return;
            }
            let (seq, held) = entry.remove_entry();
            if let Some(reason) = held.refused {
                debug!(topic = %K::topic(&held.record), "sending a refused record alone to tell whether the broker refuses it");
                self.probing = Some((seq, reason));
            }
            self.with_producer += 1;
            self.actions.push_back(
                FlowAction::Send {
                    token: seq.token(),
                    record: held.record,
                }
                .into(),
            );
        }
        if self.probing.is_none() {
            self.fence = None;
        }
    }

    fn raise_fence(&mut self, replace: bool) {
        let fence = self.fence.get_or_insert(Fence {
            replace: false,
            purged: false,
        });
        fence.replace |= replace;
    }

    fn confirm(&mut self, lsn: Lsn) {
        self.actions.push_back(FlowAction::Confirm(lsn).into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Records of the tests: their number; one topic, one byte each.
    struct Numbered;

    impl Records for Numbered {
        type Record = u64;
        fn topic(_: &u64) -> &str {
            "t"
        }
        fn size(_: &u64) -> usize {
            1
        }
    }

    type TestFlow = Flow<Numbered, &'static str, String>;

    const TIMEOUT: Duration = Duration::from_secs(5);

    fn flow() -> TestFlow {
        Flow::new(
            FlowSettings {
                max_in_flight_records: 4,
                max_in_flight_bytes: usize::MAX,
                shutdown_timeout: Duration::from_secs(10),
                delivery_timeout: Some(TIMEOUT),
                replacement_backoff: (Duration::from_millis(200), Duration::from_secs(2)),
                dead_letters: false,
            },
            Lsn(0),
        )
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A transaction of this many records, if the window has room.
        Txn(u8),
        /// The producer acknowledges its oldest record.
        Ack,
        /// The producer fails its oldest record (and, gap-less, everything after it).
        Fail,
        /// Time passes (milliseconds).
        Wait(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..3u8).prop_map(Op::Txn),
            4 => Just(Op::Ack),
            1 => Just(Op::Fail),
            2 => (1..4_000u16).prop_map(Op::Wait),
        ]
    }

    /// The modelled producer and what the flow asked of it.
    #[derive(Default)]
    struct Producer {
        /// (token, record) handed to the current producer, not reported yet.
        with: VecDeque<(usize, u64)>,
        /// The first delivery of each record, in order.
        delivered: Vec<u64>,
        confirmed: Lsn,
        overdue: usize,
    }

    impl Producer {
        /// Carries out the flow's actions; `ends`: each record's transaction end.
        fn run(
            &mut self,
            flow: &mut TestFlow,
            now: Now,
            ends: &BTreeMap<u64, Lsn>,
        ) -> Result<(), TestCaseError> {
            while let Some(action) = flow.poll_action() {
                match action {
                    FlowAction::Send { token, record } => self.with.push_back((token, record)),
                    FlowAction::Confirm(lsn) => {
                        prop_assert!(lsn >= self.confirmed, "confirmed backwards");
                        // Every record of a transaction at or before it was delivered.
                        for (record, end) in ends {
                            prop_assert!(
                                *end > lsn || self.delivered.contains(record),
                                "confirmed {lsn} past undelivered record {record}"
                            );
                        }
                        self.confirmed = lsn;
                    }
                    FlowAction::PurgeProducer => {
                        for (token, record) in std::mem::take(&mut self.with) {
                            flow.outcome(Outcome::Purged { token, record })
                                .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                        }
                        flow.after(now);
                    }
                    FlowAction::ReplaceProducer => {
                        prop_assert!(self.with.is_empty(), "replaced with records unreported");
                    }
                    FlowAction::Overdue { .. } => self.overdue += 1,
                    FlowAction::Replacing { .. } => {}
                    FlowAction::Finish(result) => {
                        prop_assert!(result.is_ok(), "{result:?}");
                    }
                }
            }
            Ok(())
        }
    }

    /// A replacement's pacing is no timer while the failed producer still has records to
    /// report: the timer would be in the past, firing again and again, changing nothing.
    #[test]
    fn no_timer_in_the_past_while_the_failed_producer_reports() {
        let mut flow = flow();
        let mut now = Now::read();
        let txn = flow.begin(Lsn(100), 0).expect("begin");
        for record in 0..4u64 {
            flow.send_new(now, txn, record).expect("send");
        }
        flow.commit(Lsn(150)).expect("commit");
        let tokens: Vec<usize> = std::iter::from_fn(|| flow.poll_action())
            .filter_map(|a| match a {
                FlowAction::Send { token, .. } => Some(token),
                _ => None,
            })
            .collect();
        // First failure: every record reports, the producer is replaced at once (booking the
        // pacing for the next replacement), the records are sent again.
        for (token, record) in tokens.iter().zip(0u64..) {
            flow.outcome(Outcome::Failed {
                token: *token,
                record,
                replace: true,
            })
            .expect("held");
        }
        flow.after(now);
        let resent: Vec<usize> = std::iter::from_fn(|| flow.poll_action())
            .filter_map(|a| match a {
                FlowAction::Send { token, .. } => Some(token),
                _ => None,
            })
            .collect();
        assert_eq!(resent.len(), 4);
        // Second failure of one record, the others still with the producer: purged, waiting.
        flow.outcome(Outcome::Failed {
            token: resent[0],
            record: 0,
            replace: true,
        })
        .expect("held");
        flow.after(now);
        now.instant += Duration::from_secs(60);
        flow.after(now);
        assert!(
            flow.next_timeout().is_none_or(|t| t > now.instant),
            "a timer in the past while records are with the producer"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// Whatever the interleaving of transactions, acknowledgements, producer failures and
        /// time: the watermark never passes an undelivered record, a producer is replaced only
        /// once all its records reported, records are first delivered in order, an overdue
        /// record purges the producer, and with the faults over everything is confirmed.
        #[test]
        fn the_flow_keeps_its_promises(ops in proptest::collection::vec(op(), 1..80)) {
            let mut flow = flow();
            let mut producer = Producer::default();
            let mut now = Now::read();
            let mut ends = BTreeMap::new();
            let mut next_record = 0u64;
            let mut lsn = 100u64;
            let mut last_end = Lsn(0);
            for op in ops {
                match op {
                    Op::Txn(n) => {
                        if !flow.can_read() {
                            continue;
                        }
                        let txn = flow.begin(Lsn(lsn), 0).map_err(|e| TestCaseError::fail(e.to_string()))?;
                        for _ in 0..n {
                            flow.send_new(now, txn, next_record).map_err(|e| TestCaseError::fail(e.to_string()))?;
                            ends.insert(next_record, Lsn(lsn + 50));
                            next_record += 1;
                        }
                        flow.commit(Lsn(lsn + 50)).map_err(|e| TestCaseError::fail(e.to_string()))?;
                        last_end = Lsn(lsn + 50);
                        lsn += 100;
                    }
                    Op::Ack => {
                        if let Some((token, record)) = producer.with.pop_front() {
                            if !producer.delivered.contains(&record) {
                                producer.delivered.push(record);
                            }
                            flow.delivered(token).map_err(|e| TestCaseError::fail(e.to_string()))?;
                        }
                    }
                    Op::Fail => {
                        for (token, record) in std::mem::take(&mut producer.with) {
                            flow.outcome(Outcome::Failed { token, record, replace: true })
                                .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                        }
                    }
                    Op::Wait(ms) => {
                        let overdue = flow
                            .delivery_deadline()
                            .is_some_and(|d| now.instant + Duration::from_millis(ms.into()) >= d);
                        now.instant += Duration::from_millis(ms.into());
                        now.wall += Duration::from_millis(ms.into());
                        let before = producer.overdue;
                        flow.after(now);
                        producer.run(&mut flow, now, &ends)?;
                        prop_assert_eq!(producer.overdue > before, overdue, "overdue when due, only then");
                        continue;
                    }
                }
                flow.after(now);
                producer.run(&mut flow, now, &ends)?;
            }
            // Faults over: acknowledge everything, letting time pass for replacements.
            for _ in 0..1_000 {
                if let Some((token, record)) = producer.with.pop_front() {
                    if !producer.delivered.contains(&record) {
                        producer.delivered.push(record);
                    }
                    flow.delivered(token).map_err(|e| TestCaseError::fail(e.to_string()))?;
                } else {
                    now.instant += Duration::from_millis(500);
                }
                flow.after(now);
                producer.run(&mut flow, now, &ends)?;
            }
            prop_assert!(producer.with.is_empty());
            let mut sorted = producer.delivered.clone();
            sorted.sort_unstable();
            prop_assert_eq!(&producer.delivered, &sorted, "first deliveries out of order");
            prop_assert_eq!(producer.delivered.len() as u64, next_record);
            prop_assert_eq!(flow.watermark(), last_end);
        }
    }
}
