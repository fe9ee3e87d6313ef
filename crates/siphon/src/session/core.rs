//! The session core: a pure state machine between the replication stream and the producer.
//!
//! It takes [`Input`]s (a source event, a delivery report, a catalog answer, a tick, a shutdown
//! request), each with the current time, and queues [`Action`]s (send a record, confirm a
//! position, look something up, purge or replace the producer, finish). It does no IO and reads
//! no clock: the driver ([`super::driver`]) does both, and the simulation tests drive it with
//! seeded interleavings.
//!
//! # Invariants
//! - The only position ever confirmed is the [`Ledger`] watermark.
//! - The stream is read only while the window has room, no catalog lookup is outstanding, no
//!   fence is up and the session is not stopping ([`SessionCore::can_read`]).
//! - **Fence.** When a record fails (the producer failed, or the broker refused it), nothing new
//!   is sent until every record handed to the producer has reported; the failed ones are then
//!   sent again in their original order (a record the broker refused is sent *alone*, to tell a
//!   guilty record from the innocent ones that shared its batch); only then does reading resume.
//!   With librdkafka's gap-less idempotence, a failure also stops the failed producer from
//!   writing anything after it, so the first delivery of every record of a partition is in send
//!   order, across producer replacement.
//! - A producer is replaced only after all its records reported, and replacements without a
//!   delivery in between back off (capped, with jitter): no loop without backoff.
//! - A row is routed, skipped by a documented rule (DELETE, UPDATE, another table),
//!   dead-lettered (with `on_error = "dead-letter"`), or stops the session with an error naming
//!   the fix: never dropped silently.

use super::ledger::{Ledger, LedgerError, Seq, TxnId};
use super::message::MessageRows;
use super::{NonTransactionalPolicy, Routers};
use crate::dead_letter::Stage;
use crate::error::{PipelineError, RecordFault};
use crate::session::ErrorPolicy;
use crate::telemetry::{pg_timestamp, Event, Metrics, ProducerErrorKind, TopicMetrics};
use pgoutput::{Lsn, Oid, Relation, TupleData};
use rustc_hash::FxHashMap;
use siphon_core::Backoff;
use siphon_kafka_sink::producer::record_bytes;
use siphon_kafka_sink::{Delivery, DeliveryError, SinkError};
use siphon_router::{
    Change, EventRouter, RouteError, Routed, RoutedRecord, SourcePosition, TableBinding,
};
use siphon_source::queries::OutboxColumns;
use siphon_source::{DatabaseEncoding, RowChange, SourceError, SourceEvent, TableName};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tracing::{debug, info, warn};

/// The current time, as the driver read it.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    /// For timers (shutdown deadline, producer replacement backoff).
    pub instant: Instant,
    /// For commit-to-acknowledgement latency (commit times are wall-clock times).
    pub wall: SystemTime,
}

impl Now {
    /// The machine's clocks.
    pub fn read() -> Self {
        Now {
            instant: Instant::now(),
            wall: SystemTime::now(),
        }
    }
}

/// A catalog lookup the core needs answered before it reads on.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// The NOT NULL columns of an outbox table (for `json-schemas` optional fields), and the
    /// generated columns the stream leaves out (named in a binding error instead of "missing").
    NotNullColumns(Arc<Relation>),
    /// Whether a relation that is not an outbox table is a partition of one (its changes are
    /// then the outbox table's, never "another table's").
    OutboxRelation(Arc<Relation>),
}

/// The answer to a [`Lookup`].
#[derive(Debug)]
pub enum Answer {
    NotNullColumns {
        relation: Arc<Relation>,
        columns: Result<OutboxColumns, SourceError>,
    },
    /// `Some`: the relation renamed to the outbox table it is a partition of.
    OutboxRelation {
        relation: Arc<Relation>,
        outbox: Result<Option<Relation>, SourceError>,
    },
}

/// What happened.
#[derive(Debug)]
pub enum Input {
    /// The replication stream produced an event.
    Source(SourceEvent),
    /// The replication stream failed or ended.
    SourceFailed(PipelineError),
    /// The producer reported a record.
    Delivery(Delivery),
    /// The producer refused to take a record ([`Action::Send`] failed).
    SendRefused {
        token: usize,
        record: RoutedRecord,
        error: SinkError,
    },
    /// A lookup was answered.
    Answer(Answer),
    /// The replication connection is stalled (what was seen).
    Stalled(siphon_source::stall::Seen),
    /// Stop reading, wait for what is in flight, then finish.
    Shutdown,
    /// Time passed (see [`SessionCore::next_timeout`]).
    Tick,
}

/// What the driver must do, in order.
#[derive(Debug)]
pub enum Action {
    /// Hand `record` to the current producer; its report carries `token`.
    Send { token: usize, record: RoutedRecord },
    /// Everything before this position is delivered: report it as flushed.
    Confirm(Lsn),
    /// Answer with [`Input::Answer`].
    Lookup(Lookup),
    /// The source need not keep this relation's description: not an outbox table (its rows
    /// come as [`SourceEvent::OtherTableChange`] from then on).
    ForgetRelation(Oid),
    /// Purge the current producer: its queued and in-flight records come back as failed
    /// reports.
    PurgeProducer,
    /// Replace the producer with a new one (its records have all reported).
    ReplaceProducer,
    /// The session is over.
    Finish(Result<(), PipelineError>),
}

/// The session's fixed settings.
pub struct CoreSettings<'a> {
    pub router: &'a Routers,
    /// Prefixes of logical messages that carry outbox events.
    pub message_prefixes: &'a HashSet<String>,
    /// The database encoding, which logical message contents are text in.
    pub database_encoding: DatabaseEncoding,
    pub non_transactional: NonTransactionalPolicy,
    pub on_error: &'a ErrorPolicy,
    pub tables: HashSet<TableName>,
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
}

/// A table's binding, or why it cannot be bound (its rows then fail or are dead-lettered).
enum Binding<'a> {
    Bound {
        binding: Box<TableBinding>,
        router: &'a EventRouter,
    },
    Unbindable(RouteError),
}

/// A record taken back from the producer, to be sent again when the fence allows.
struct Held {
    record: RoutedRecord,
    /// The broker refused it (why), perhaps only because it shared a batch with a record the
    /// broker refuses: it is sent alone next.
    refused: Option<RecordFault>,
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

struct Stopping {
    deadline: Instant,
    result: Result<(), PipelineError>,
}

/// Counts with the counters of `topic` from `cache`, taken from `metrics` the first time
/// (one lookup when cached).
fn count_topic(
    cache: &mut FxHashMap<String, TopicMetrics>,
    metrics: &Metrics,
    topic: &str,
    count: impl FnOnce(&TopicMetrics),
) {
    if let Some(counters) = cache.get(topic) {
        count(counters);
        return;
    }
    let counters = metrics.topic(topic);
    count(&counters);
    cache.insert(topic.to_owned(), counters);
}

/// The session state machine.
pub struct SessionCore<'a> {
    settings: CoreSettings<'a>,
    metrics: Arc<Metrics>,
    ledger: Ledger,
    /// By relation OID, with an integer hasher (one lookup per row change).
    bindings: FxHashMap<Oid, Binding<'a>>,
    /// Logical messages of outbox prefixes, as rows of synthetic relations.
    messages: MessageRows,
    awaiting_lookup: bool,
    /// The open transaction, if any.
    txn: Option<TxnId>,
    /// Its Begin: commit LSN, transaction id and commit time (for the source position).
    begin: (Lsn, u32, i64),
    /// Records handed to the producer whose report has not arrived.
    with_producer: usize,
    fence: Option<Fence>,
    held: BTreeMap<Seq, Held>,
    /// The refused record being sent alone, and why it was refused.
    probing: Option<(Seq, RecordFault)>,
    pacer: Pacer,
    /// When the current producer was put in place (`None`: the session's first producer); a
    /// record sent again is timed from here, not from its first hand-over.
    producer_since: Option<Instant>,
    stopping: Option<Stopping>,
    finished: bool,
    actions: VecDeque<Action>,
    /// Per-topic counters, looked up once per topic (no lock on the per-record path).
    topics: FxHashMap<String, TopicMetrics>,
    /// The oldest unacknowledged hand-over last given to the metrics (`None`: not given yet):
    /// the gauge is set only when it changes.
    oldest_reported: Option<Option<Instant>>,
}

impl<'a> SessionCore<'a> {
    /// A session resuming at `start` (everything before it is delivered).
    pub fn new(settings: CoreSettings<'a>, metrics: Arc<Metrics>, start: Lsn) -> Self {
        // Twice the window: only a record whose report is later than a window's worth of
        // records after it leaves the ledger's constant-time span.
        let span = 2 * settings.max_in_flight_records.max(1);
        let messages = MessageRows::new(settings.database_encoding.clone());
        let pacer = Pacer::new(settings.replacement_backoff);
        SessionCore {
            settings,
            metrics,
            ledger: Ledger::with_span(start, span),
            bindings: FxHashMap::default(),
            messages,
            awaiting_lookup: false,
            txn: None,
            begin: (Lsn::ZERO, 0, 0),
            with_producer: 0,
            fence: None,
            held: BTreeMap::new(),
            probing: None,
            pacer,
            producer_since: None,
            stopping: None,
            finished: false,
            actions: VecDeque::new(),
            topics: FxHashMap::default(),
            oldest_reported: None,
        }
    }

    /// Whether the driver may read the next source event.
    pub fn can_read(&self) -> bool {
        !self.finished
            && self.stopping.is_none()
            && self.fence.is_none()
            && !self.awaiting_lookup
            && self.ledger.records() < self.settings.max_in_flight_records.max(1)
            && self.ledger.bytes() < self.settings.max_in_flight_bytes.max(1)
    }

    /// When the core wants an [`Input::Tick`] at the latest.
    pub fn next_timeout(&self) -> Option<Instant> {
        let rebuild = self.fence.filter(|f| f.replace).and(self.pacer.not_before);
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
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Whether [`Action::Finish`] was emitted.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The acknowledged position (what the next session may resume from).
    pub fn watermark(&self) -> Lsn {
        self.ledger.watermark()
    }

    /// Records in flight and their bytes (the window).
    pub fn in_flight(&self) -> (usize, usize) {
        (self.ledger.records(), self.ledger.bytes())
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

    /// Feeds one input.
    pub fn handle(&mut self, now: Now, input: Input) {
        if self.finished {
            return;
        }
        let outcome = match input {
            Input::Source(event) => self.on_source(now, event),
            Input::SourceFailed(e) => Err(e),
            Input::Delivery(delivery) => self.on_delivery(now, delivery),
            Input::SendRefused {
                token,
                record,
                error,
            } => self.on_send_refused(now, Seq::from_token(token), record, error),
            Input::Answer(answer) => self.on_answer(answer),
            Input::Stalled(seen) => Err(PipelineError::Stalled(seen)),
            Input::Shutdown => {
                info!("shutting down: waiting for in-flight records");
                self.stop(now, Ok(()));
                Ok(())
            }
            Input::Tick => Ok(()),
        };
        if let Err(e) = outcome {
            self.stop(now, Err(e));
        }
        if self
            .delivery_deadline()
            .is_some_and(|deadline| now.instant >= deadline)
        {
            Event::DeliveryOverdue {
                unacked: self.with_producer,
            }
            .emit(&self.metrics);
            self.raise_fence(true);
        }
        self.advance(now);
        self.metrics
            .set_in_flight(self.ledger.records(), self.ledger.bytes());
        let oldest = self.ledger.oldest_sent();
        if self.oldest_reported != Some(oldest) {
            self.metrics.set_oldest_unacked_since(oldest);
            self.oldest_reported = Some(oldest);
        }
    }

    fn stop(&mut self, now: Now, result: Result<(), PipelineError>) {
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

    /// Moves the fence and the stop along as far as the state allows.
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
                    self.actions.push_back(Action::Finish(stopping.result));
                }
            }
            return;
        }
        let Some(mut fence) = self.fence else { return };
        if self.with_producer > 0 {
            if fence.replace && !fence.purged {
                fence.purged = true;
                self.fence = Some(fence);
                self.actions.push_back(Action::PurgeProducer);
            }
            return;
        }
        if fence.replace {
            if !self.pacer.try_book(now.instant) {
                return;
            }
            Event::ProducerReplaced {
                resend: self.held.len(),
            }
            .emit(&self.metrics);
            self.actions.push_back(Action::ReplaceProducer);
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
                debug!(topic = %held.record.topic, "sending a refused record alone to tell whether the broker refuses it");
                self.probing = Some((seq, reason));
            }
            self.with_producer += 1;
            self.actions.push_back(Action::Send {
                token: seq.token(),
                record: held.record,
            });
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

    fn on_source(&mut self, now: Now, event: SourceEvent) -> Result<(), PipelineError> {
        match event {
            SourceEvent::Begin {
                final_lsn,
                commit_time_us,
                xid,
            } => {
                self.txn = Some(self.ledger.begin(final_lsn, commit_time_us)?);
                self.begin = (final_lsn, xid, commit_time_us);
            }
            SourceEvent::Relation(relation) => self.on_relation(relation),
            SourceEvent::Change {
                relation,
                change,
                lsn,
            } => self.on_change(now, &relation, change, lsn)?,
            SourceEvent::OtherTableChange { relation_id, lsn } => {
                self.on_other_table_change(relation_id, lsn)?
            }
            SourceEvent::Commit { end_lsn, .. } => {
                self.metrics.transaction();
                self.txn = None;
                if let Some(watermark) = self.ledger.commit(end_lsn)? {
                    self.confirm(watermark);
                }
            }
            SourceEvent::Idle { wal_end } => {
                if let Some(watermark) = self.ledger.idle(wal_end) {
                    self.confirm(watermark);
                }
            }
            SourceEvent::Message {
                transactional,
                lsn,
                prefix,
                content,
            } => self.on_message(now, transactional, lsn, &prefix, &content)?,
        }
        Ok(())
    }

    fn confirm(&mut self, lsn: Lsn) {
        self.actions.push_back(Action::Confirm(lsn));
    }

    fn on_relation(&mut self, relation: Arc<Relation>) {
        let name = TableName {
            schema: relation.namespace.to_string(),
            name: relation.name.to_string(),
        };
        self.awaiting_lookup = true;
        let lookup = if self.settings.tables.contains(&name) {
            Lookup::NotNullColumns(relation)
        } else {
            // Perhaps a partition of an outbox table: never skipped as another table's.
            Lookup::OutboxRelation(relation)
        };
        self.actions.push_back(Action::Lookup(lookup));
    }

    fn on_answer(&mut self, answer: Answer) -> Result<(), PipelineError> {
        match answer {
            Answer::NotNullColumns { relation, columns } => {
                self.awaiting_lookup = false;
                let columns = columns?;
                let table = TableName {
                    schema: relation.namespace.to_string(),
                    name: relation.name.to_string(),
                };
                let router = self.settings.router.for_table(&table);
                let binding = self.bind(router, &relation, &columns)?;
                self.bindings.insert(relation.id, binding);
            }
            Answer::OutboxRelation { relation, outbox } => match outbox? {
                Some(outbox) => {
                    debug!(partition = %format_args!("{}.{}", relation.namespace, relation.name), table = %format_args!("{}.{}", outbox.namespace, outbox.name), "changes named by a partition are routed as its outbox table's");
                    self.actions
                        .push_back(Action::Lookup(Lookup::NotNullColumns(Arc::new(outbox))));
                }
                None => {
                    self.awaiting_lookup = false;
                    debug!(table = %format_args!("{}.{}", relation.namespace, relation.name), "table is published but not an outbox table; its changes are ignored");
                    self.bindings.remove(&relation.id);
                    // Nothing is kept for it: a publication `FOR ALL TABLES` describes every
                    // table ever written, staging tables created and dropped by the thousand.
                    self.actions.push_back(Action::ForgetRelation(relation.id));
                }
            },
        }
        Ok(())
    }

    /// Binds `relation` with `router`: a binding, or (dead letters configured) why its rows
    /// cannot be routed. A configured column the stream leaves out (a generated column) is named
    /// as such, with the catalog's cause, not as missing.
    fn bind(
        &self,
        router: &'a EventRouter,
        relation: &Relation,
        columns: &OutboxColumns,
    ) -> Result<Binding<'a>, PipelineError> {
        let bound = router
            .bind_with_not_null(relation, &|column| columns.not_null.contains(column))
            .map_err(|e| match e {
                RouteError::MissingColumn {
                    table,
                    column,
                    option,
                    holds,
                } => match columns.unpublished.get(&column) {
                    Some(cause) => RouteError::UnpublishedColumn {
                        cause: cause.clone(),
                        table,
                        column,
                        option,
                    },
                    None => RouteError::MissingColumn {
                        table,
                        column,
                        option,
                        holds,
                    },
                },
                e => e,
            });
        match bound {
            Ok(binding) => Ok(Binding::Bound {
                binding: Box::new(binding),
                router,
            }),
            Err(e) if matches!(self.settings.on_error, ErrorPolicy::DeadLetter(_)) => {
                Event::TableUnroutable {
                    table: &format_args!("{}.{}", relation.namespace, relation.name),
                    error: &e,
                }
                .emit(&self.metrics);
                Ok(Binding::Unbindable(e))
            }
            Err(e) => Err(PipelineError::Unbindable(Box::new(e))),
        }
    }

    /// A logical decoding message: an outbox event if its prefix is configured.
    fn on_message(
        &mut self,
        now: Now,
        transactional: bool,
        lsn: Lsn,
        prefix: &str,
        content: &[u8],
    ) -> Result<(), PipelineError> {
        if !self.settings.message_prefixes.contains(prefix) {
            debug!(prefix, "logical message of another prefix ignored");
            return Ok(());
        }
        if !transactional {
            return match self.settings.non_transactional {
                NonTransactionalPolicy::Error => Err(PipelineError::NonTransactionalMessage {
                    prefix: prefix.to_owned(),
                    lsn,
                }),
                NonTransactionalPolicy::Skip => {
                    Event::NonTransactionalMessageSkipped { prefix, lsn }.emit(&self.metrics);
                    Ok(())
                }
            };
        }
        let (relation, row) = match self.messages.row(prefix, content) {
            Ok((relation, row, new)) => {
                if new {
                    let router = self.settings.router.default_router();
                    let binding = self.bind(router, &relation, &OutboxColumns::default())?;
                    self.bindings.insert(relation.id, binding);
                }
                (relation, row)
            }
            Err(e) => {
                self.metrics.event_read();
                return match self.settings.on_error {
                    ErrorPolicy::Fail => Err(e.into()),
                    ErrorPolicy::DeadLetter(dead_letters) => {
                        // Dead-lettered as a row of its own, its content as text.
                        let txn = self.txn.ok_or(LedgerError::NoOpenTransaction)?;
                        let (relation, row) = self.messages.unreadable(prefix, content);
                        Event::RowDeadLettered {
                            table: &format_args!("{}.{}", relation.namespace, relation.name),
                            lsn,
                            error: &e,
                            dead_letter_topic: dead_letters.topic(),
                        }
                        .emit(&self.metrics);
                        let record = dead_letters.for_row(
                            &relation,
                            &row,
                            &e,
                            lsn,
                            self.ledger.commit_lsn(txn),
                        );
                        self.send_new(now, txn, record)
                    }
                };
            }
        };
        self.on_change(now, &relation, RowChange::Insert(row), lsn)
    }

    /// A row of a relation the source does not keep: another table's, skipped by rule. One
    /// with a binding would be an outbox row without its description: the session reconnects,
    /// and the new one is described its tables again.
    fn on_other_table_change(&mut self, relation_id: Oid, lsn: Lsn) -> Result<(), PipelineError> {
        self.metrics.event_read();
        self.txn.ok_or(LedgerError::NoOpenTransaction)?;
        if self.bindings.contains_key(&relation_id) {
            return Err(SourceError::Protocol(format!(
                "row change of outbox relation {relation_id} at {lsn} without its description"
            ))
            .into());
        }
        Event::OtherTableRow.emit(&self.metrics);
        Ok(())
    }

    fn on_change(
        &mut self,
        now: Now,
        relation: &Arc<Relation>,
        change: RowChange,
        lsn: Lsn,
    ) -> Result<(), PipelineError> {
        let (change, row): (Change<'_>, &TupleData) = match &change {
            RowChange::Insert(new) => (Change::Insert(new), new),
            RowChange::Update { old, new } => (
                Change::Update {
                    old: old.as_ref().map(|o| o.tuple()),
                    new,
                },
                new,
            ),
            RowChange::Delete(old) => (Change::Delete(old.tuple()), old.tuple()),
        };
        self.metrics.event_read();
        let txn = self.txn.ok_or(LedgerError::NoOpenTransaction)?;
        let routed = match self.bindings.get(&relation.id) {
            None => {
                Event::OtherTableRow.emit(&self.metrics);
                return Ok(());
            }
            Some(Binding::Bound { binding, router }) => {
                let (final_lsn, xid, commit_time_us) = self.begin;
                let position = SourcePosition::from_pgoutput(final_lsn, lsn, xid, commit_time_us);
                router
                    .route_at(binding, change, &position)
                    .map(|routed| (routed, *router))
            }
            Some(Binding::Unbindable(reason)) => Err(reason.clone()),
        };
        match routed {
            Ok((Routed::Record(record), _)) => self.send_routed(now, txn, record),
            Ok((Routed::Skipped(reason), router)) => {
                Event::RowSkipped {
                    table: &format_args!("{}.{}", relation.namespace, relation.name),
                    reason,
                    level: router.log_level(reason),
                }
                .emit(&self.metrics);
                Ok(())
            }
            Err(reason) => match self.settings.on_error {
                ErrorPolicy::Fail => Err(PipelineError::Row {
                    error: Box::new(reason),
                    lsn,
                }),
                ErrorPolicy::DeadLetter(dead_letters) => {
                    Event::RowDeadLettered {
                        table: &format_args!("{}.{}", relation.namespace, relation.name),
                        lsn,
                        error: &reason,
                        dead_letter_topic: dead_letters.topic(),
                    }
                    .emit(&self.metrics);
                    let record = dead_letters.for_row(
                        relation,
                        row,
                        &reason,
                        lsn,
                        self.ledger.commit_lsn(txn),
                    );
                    self.send_new(now, txn, record)
                }
            },
        }
    }

    /// Hands a newly routed record of `txn` to the producer: [`SessionCore::send_new`] with
    /// the record also counted as routed, its topic's counters looked up once.
    fn send_routed(
        &mut self,
        now: Now,
        txn: TxnId,
        record: RoutedRecord,
    ) -> Result<(), PipelineError> {
        let added = self.ledger.add(txn, record_bytes(&record), now.instant);
        count_topic(&mut self.topics, &self.metrics, &record.topic, |counters| {
            counters.routed();
            if added.is_ok() {
                counters.produced();
            }
        });
        self.hand_over(added?, record);
        Ok(())
    }

    /// Hands a new record of `txn` to the producer.
    fn send_new(
        &mut self,
        now: Now,
        txn: TxnId,
        record: RoutedRecord,
    ) -> Result<(), PipelineError> {
        let seq = self.ledger.add(txn, record_bytes(&record), now.instant)?;
        count_topic(&mut self.topics, &self.metrics, &record.topic, |counters| {
            counters.produced()
        });
        self.hand_over(seq, record);
        Ok(())
    }

    /// Queues the sending of `record`, which the ledger holds as `seq`.
    fn hand_over(&mut self, seq: Seq, record: RoutedRecord) {
        self.with_producer += 1;
        self.actions.push_back(Action::Send {
            token: seq.token(),
            record,
        });
    }

    fn on_delivery(&mut self, now: Now, delivery: Delivery) -> Result<(), PipelineError> {
        let seq = Seq::from_token(delivery.token);
        self.with_producer = self.with_producer.saturating_sub(1);
        let probe = self.take_probe(seq);
        match delivery.result {
            Ok(_) => {
                self.pacer.progress = true;
                let settled = self.ledger.settle(seq)?;
                if let Ok(latency) = now
                    .wall
                    .duration_since(pg_timestamp(settled.commit_time_us))
                {
                    self.metrics.observe_commit_to_ack(latency);
                }
                if let Some(watermark) = settled.watermark {
                    self.confirm(watermark);
                }
                Ok(())
            }
            Err(failure) => {
                let failure = *failure;
                Event::DeliveryFailed {
                    topic: &failure.record.topic,
                    error: &failure.error,
                    kind: match failure.error {
                        DeliveryError::Definite(_) => ProducerErrorKind::Definite,
                        DeliveryError::Transient(_) => ProducerErrorKind::Transient,
                    },
                }
                .emit(&self.metrics);
                match failure.error {
                    DeliveryError::Definite(refusal) if !refusal.on_error_applies() => {
                        Err(PipelineError::Refused(RecordFault::Broker(refusal)))
                    }
                    DeliveryError::Definite(refusal) => self.on_refused(
                        now,
                        seq,
                        failure.record,
                        RecordFault::Broker(refusal),
                        probe.is_some(),
                    ),
                    DeliveryError::Transient(failure_kind) => {
                        self.hold(seq, failure.record, probe, failure_kind.needs_rebuild())
                    }
                }
            }
        }
    }

    /// If `seq` is the record being sent alone, ends the probe and returns why it was refused.
    fn take_probe(&mut self, seq: Seq) -> Option<RecordFault> {
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
        record: RoutedRecord,
        refused: Option<RecordFault>,
        replace: bool,
    ) -> Result<(), PipelineError> {
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
    fn on_refused(
        &mut self,
        now: Now,
        seq: Seq,
        record: RoutedRecord,
        reason: RecordFault,
        alone: bool,
    ) -> Result<(), PipelineError> {
        if self.stopping.is_some() {
            self.ledger.abandon(seq)?;
            return Ok(());
        }
        let dead_letters = match self.settings.on_error {
            ErrorPolicy::DeadLetter(d) => d,
            // The refused batch holds the record at fault: stop, naming it.
            ErrorPolicy::Fail => return Err(PipelineError::Refused(reason)),
        };
        if !alone {
            // Perhaps innocent: find out by sending it alone once everything before it settled.
            // A refused batch leaves a gap-less producer failed, so it is replaced first.
            self.held.insert(
                seq,
                Held {
                    record,
                    refused: Some(reason),
                },
            );
            self.raise_fence(true);
            return Ok(());
        }
        if record.topic == dead_letters.topic() {
            return Err(PipelineError::DeadLetterRefused(reason));
        }
        let txn = self
            .ledger
            .get(seq)
            .map(|r| r.txn)
            .ok_or(LedgerError::UnknownRecord(seq))?;
        Event::RecordDeadLettered {
            topic: &record.topic,
            error: &reason,
        }
        .emit(&self.metrics);
        self.pacer.progress = true;
        let letter =
            dead_letters.for_record(record, &reason, Stage::Produce, self.ledger.commit_lsn(txn));
        // The letter joins the transaction before the refused record settles.
        self.send_new(now, txn, letter)?;
        if let Some(watermark) = self.ledger.settle(seq)?.watermark {
            self.confirm(watermark);
        }
        Ok(())
    }

    fn on_send_refused(
        &mut self,
        now: Now,
        seq: Seq,
        record: RoutedRecord,
        error: SinkError,
    ) -> Result<(), PipelineError> {
        self.with_producer = self.with_producer.saturating_sub(1);
        let probe = self.take_probe(seq);
        match error {
            // Refused at enqueue: this record alone is at fault.
            error @ SinkError::Definite(_) => {
                Event::DeliveryFailed {
                    topic: &record.topic,
                    error: &error,
                    kind: ProducerErrorKind::Definite,
                }
                .emit(&self.metrics);
                self.on_refused(now, seq, record, RecordFault::Enqueue(error), true)
            }
            error @ (SinkError::Transient(_) | SinkError::RetiredStillReporting { .. }) => {
                Event::RecordNotTaken {
                    topic: &record.topic,
                    error: &error,
                }
                .emit(&self.metrics);
                self.hold(seq, record, probe, true)
            }
            error @ SinkError::Config(_) => Err(error.into()),
        }
    }
}
