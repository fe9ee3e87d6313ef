//! The session engine: a pure state machine between the replication stream and the producer.
//!
//! It takes [`Input`]s (a source event, a delivery report, records handed back by a purge, a
//! catalog answer, a tick, a shutdown request), each with the current time, and queues
//! [`Action`]s (send a record, confirm a position, look something up, purge or replace the
//! producer, begin or commit a Kafka transaction, finish), polled with
//! [`SessionCore::poll_action`], and says when it wants a tick ([`SessionCore::next_timeout`]).
//! It does no IO and reads no clock: the binary's driver does both, and the simulation tests
//! drive it with seeded interleavings.
//!
//! The errors around it (the producer's, the catalog's, the session's own) are the associated
//! types of a [`Vocabulary`]; the engine reads them through its methods only, and raises its
//! own as [`EngineError`]s.
//!
//! This layer decides what becomes of each row (binding, routing, skipping, dead letters) and
//! maps the producer's reports into the flow's [`Outcome`]s; everything about delivery
//! (the ledger, the fence, the delivery deadline, replacement pacing, the stop) is decided by
//! [`Flow`], whose invariants are stated there.
//!
//! It holds no metrics: what it notices is queued as [`Note`]s ([`SessionCore::poll_note`]),
//! which the driver logs and counts.
//!
//! # Invariants
//! - The only position ever confirmed is the ledger's watermark (the flow's).
//! - The stream is read only while no lookup (catalog, schema id) is outstanding and the flow
//!   can take more (window room, no fence, not stopping: [`SessionCore::can_read`]).
//! - A record waiting for its schema id holds reading back until it is sent; it is sent (or
//!   dead-lettered) only while the Kafka transactions take records (never while a commit is
//!   due or runs), and never once the session stops (its row is read again by the next).
//! - With librdkafka's gap-less idempotence, a failure stops the failed producer from writing
//!   anything after it, so with the flow's fence the first delivery of every record of a
//!   partition is in send order, across producer replacement.
//! - Every row read, record routed or produced, skip, dead letter and failed delivery is one
//!   [`Note`], queued in the order it happened.
//! - A row is routed, skipped by a documented rule (DELETE, UPDATE, another table),
//!   dead-lettered (with `on_error = "dead-letter"`), or stops the session with an error naming
//!   the fix: never dropped silently.

use super::catalog::OutboxColumns;
use super::dead_letter::{DeadLetters, Stage};
use super::elapsed::LastElapsed;
use super::encoding::DatabaseEncoding;
use super::message::MessageRows;
use super::note::{FailureKind, Note};
use super::policy::{Disposal, ErrorPolicy, NonTransactionalPolicy, RoutedKind};
use super::position::PositionHeaders;
use super::registry_write::{Answered, Ask, Refusal, RegistryWrite, SchemaCache, Step};
use super::routers::Routers;
use super::suspects::{self, Suspect, Suspects};
use super::table::TableName;
use super::vocabulary::{AbortCause, DeliveryReading, EngineError, Vocabulary};
use crate::assembly::{RowChange, SourceEvent};
use crate::exactly_once::{KafkaTransactions, Progress, TransactionStep};
use crate::flow::{Flow, FlowAction, FlowError, FlowSettings, Outcome, ToDeadLetter};
use crate::ledger::{LedgerError, Seq, TxnId};
use pgoutput::{pg_timestamp, Lsn, Oid, Relation, TupleData};
use rustc_hash::FxHashMap;
use siphon_record::{record_bytes, Classified, Delivery, Verdict};
use siphon_router::{
    Change, EventRouter, RegistryRecord, RouteError, Routed, RoutedRecord, SkipReason,
    SourcePosition, TableBinding,
};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tracing::{debug, info};

pub use crate::Now;

/// The target of the engine's log lines: the session's, as operators filter them
/// (`RUST_LOG=siphon::session=debug`).
const LOG_TARGET: &str = "siphon::session::core";

pub use super::catalog::Lookup;

/// The answer to a [`Lookup`], a failure the catalog's.
pub type Answer<V> =
    super::catalog::Answer<<V as Vocabulary>::CatalogError, <V as Vocabulary>::RegistryError>;

/// What happened.
pub enum Input<V: Vocabulary> {
    /// The replication stream produced an event.
    Source(SourceEvent),
    /// The replication stream failed or ended.
    SourceFailed(V::Error),
    /// The producer reported a record.
    Delivery(Delivery<V::DeliveryError>),
    /// A purge of the producer handed back a record it had not taken yet (one waiting for its
    /// topic to be created): sent again on the replacement.
    Purged { token: usize, record: RoutedRecord },
    /// The producer refused to take a record ([`Action::Send`] failed).
    SendRefused {
        token: usize,
        record: RoutedRecord,
        error: V::SendError,
    },
    /// A lookup was answered.
    Answer(Answer<V>),
    /// The replication connection is stalled (what was seen).
    Stalled(V::Stall),
    /// Exactly-once: the commit of [`Action::Commit`] ended.
    Committed(Result<(), V::SendError>),
    /// Stop reading, wait for what is in flight, then finish.
    Shutdown,
    /// Time passed (see [`SessionCore::next_timeout`]).
    Tick,
}

/// What the driver must do, in order.
#[derive(Debug)]
pub enum Action<V: Vocabulary> {
    /// Hand `record` to the current producer; its report carries `token`.
    Send { token: usize, record: RoutedRecord },
    /// Everything before this position is delivered: report it as flushed.
    Confirm(Lsn),
    /// Answer with [`Input::Answer`].
    Lookup(Lookup),
    /// The source need not keep this relation's description: not an outbox table (its rows
    /// come as [`SourceEvent::OtherTableChange`] from then on).
    ForgetRelation(Oid),
    /// The source need not decode the old row of this relation's DELETEs: a bound outbox table,
    /// whose router skips every DELETE (they come as [`SourceEvent::OutboxDelete`] from then on,
    /// until the relation is described again).
    SkipDeletes(Oid),
    /// Purge the current producer: its queued and in-flight records come back as failed
    /// reports.
    PurgeProducer,
    /// Replace the producer with a new one (its records have all reported).
    ReplaceProducer,
    /// Exactly-once: begin a Kafka transaction (before the next [`Action::Send`]).
    BeginTransaction,
    /// Exactly-once: write `progress` to the progress topic in the open Kafka transaction and
    /// commit it; answer with [`Input::Committed`]. Everything sent before it is in it.
    Commit(Progress),
    /// The session is over.
    Finish(Result<(), V::Error>),
}

/// The session's fixed settings.
pub struct CoreSettings<'a, V: Vocabulary> {
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
    /// Stamps every routed record with its source position (`None`: no such headers).
    pub position_headers: Option<PositionHeaders>,
    /// Exactly-once delivery: the Kafka transactions, from the last committed progress
    /// (`None`: at-least-once).
    pub transactions: Option<KafkaTransactions>,
    /// Exactly-once: records the broker refused in earlier sessions.
    pub suspects: Suspects<V::Fault>,
    /// How long a schema fetched from the registry (`schema_registry.schemas = "registered"`)
    /// is used before the registry is asked for the subject's latest again.
    pub registered_schema_ttl: Duration,
    /// How value subjects are named (`schema_registry.subject_name_strategy`).
    pub subject_strategy: siphon_record::registered::SubjectStrategy,
}

/// A record held while the registry is asked about its key or value, with the row it came
/// from (for its dead letter, should the registry refuse it). Only a record that waits is held:
/// one whose answers are known is sent without copying its row.
struct HeldRecord<'a> {
    txn: TxnId,
    relation: Arc<Relation>,
    row: TupleData,
    lsn: Lsn,
    /// The write, until the registry answered every question of it.
    write: Option<RegistryWrite>,
    /// What it became, once written or refused.
    resolved: Option<Resolved<'a>>,
}

/// The row a record came from, and its position: for its dead letter.
type RowSource<'r> = (&'r Arc<Relation>, &'r TupleData, Lsn);

/// What becomes of a registry-format record once the registry answered.
enum Resolved<'a> {
    /// Sent, written.
    Send(RoutedRecord),
    /// Its row dead-lettered for this reason.
    DeadLetter {
        dead_letters: &'a DeadLetters,
        reason: String,
    },
}

/// A table's binding, or why it cannot be bound (its rows then fail or are dead-lettered).
enum Binding<'a> {
    Bound {
        binding: Box<TableBinding>,
        router: &'a EventRouter,
    },
    Unbindable(RouteError),
}

/// An entry of the one action queue, the flow's and the engine's own in their order, before
/// [`SessionCore::poll_action`] reads it out as an [`Action`].
#[derive(Debug)]
enum Queued<V: Vocabulary> {
    /// The flow's: hand `record` to the producer.
    Send {
        token: usize,
        record: RoutedRecord,
    },
    /// The flow's: everything before this position is delivered (with exactly-once delivery,
    /// confirmed once a commit covers it).
    Delivered(Lsn),
    /// The flow's: purge the producer.
    PurgeProducer,
    /// The flow's: the producer is about to be replaced, `resend` records sent again.
    Replacing {
        resend: usize,
    },
    /// The flow's: replace the producer.
    ReplaceProducer,
    /// The flow's: the oldest record is overdue, `unacked` records with the producer.
    Overdue {
        unacked: usize,
    },
    /// The flow's: the session is over (with exactly-once delivery, after its last commit).
    Stopped(Result<(), V::Error>),
    Lookup(Lookup),
    ForgetRelation(Oid),
    SkipDeletes(Oid),
    BeginTransaction,
    /// A position a commit covered.
    Committed(Lsn),
    /// The session's end, held until its last commit.
    Finish(Result<(), V::Error>),
}

impl<V: Vocabulary> From<FlowAction<RoutedRecord, V::Error>> for Queued<V> {
    fn from(action: FlowAction<RoutedRecord, V::Error>) -> Self {
        match action {
            FlowAction::Send { token, record } => Queued::Send { token, record },
            FlowAction::Confirm(lsn) => Queued::Delivered(lsn),
            FlowAction::PurgeProducer => Queued::PurgeProducer,
            FlowAction::Replacing { resend } => Queued::Replacing { resend },
            FlowAction::ReplaceProducer => Queued::ReplaceProducer,
            FlowAction::Overdue { unacked } => Queued::Overdue { unacked },
            FlowAction::Finish(result) => Queued::Stopped(result),
        }
    }
}

/// The session state machine.
pub struct SessionCore<'a, V: Vocabulary> {
    settings: CoreSettings<'a, V>,
    /// What happened, for the driver's log and metrics (see [`SessionCore::poll_note`]).
    notes: VecDeque<Note>,
    /// Records between the stream and the producer: ledger, fence, deadline, stop.
    flow: Flow<RoutedKind, V::Fault, V::Error, Queued<V>>,
    /// By relation OID, with an integer hasher (one lookup per row change).
    bindings: FxHashMap<Oid, Binding<'a>>,
    /// Logical messages of outbox prefixes, as rows of synthetic relations.
    messages: MessageRows,
    awaiting_lookup: bool,
    /// What the registry answered: schema ids, and latest schemas.
    schemas: SchemaCache,
    /// The record waiting for the registry's answer (reading waits with it).
    held: Option<HeldRecord<'a>>,
    /// The open transaction, if any.
    txn: Option<TxnId>,
    /// Its Begin: commit LSN, transaction id and commit time (for the source position).
    begin: (Lsn, u32, i64),
    /// Stamps routed records with position headers.
    position: Option<PositionHeaders>,
    /// The index of the next record of the open transaction (routed records and dead letters
    /// of rows, in routing order: the same on every replay).
    next_index: u32,
    /// Exactly-once: the Kafka transactions (`None`: at-least-once).
    transactions: Option<KafkaTransactions>,
    /// Exactly-once: the session's end, held until the open Kafka transaction committed.
    finish: Option<Result<(), V::Error>>,
    /// Exactly-once: an error while the session was stopping (a shutdown): its end.
    failed: Option<V::Error>,
    /// Records not sent again because an earlier session committed them.
    skipped_committed: u64,
    /// Exactly-once: records the broker refused in a Kafka transaction, by position, carried
    /// from session to session (see [`Suspect`]).
    suspects: Suspects<V::Fault>,
    /// Exactly-once: the position of each record with the producer (to name a refused one).
    positions: FxHashMap<usize, (Lsn, u32)>,
    /// Exactly-once: a suspect waiting for the open Kafka transaction to commit, to be sent
    /// alone after it (its transaction, its index, the record).
    parked: Option<(TxnId, u32, RoutedRecord)>,
    /// Exactly-once: the suspect sent alone in the Kafka transaction now open.
    solo: Option<(Lsn, u32)>,
    /// The last commit->acknowledgement latency, by (commit time, arrival).
    commit_to_ack: LastElapsed<(i64, SystemTime)>,
    /// The last hand-over->acknowledgement latency, by (hand-over, arrival).
    send_to_ack: LastElapsed<(Instant, Instant)>,
    /// The first delivery failure since the last producer replacement that calls for one:
    /// named in the replacement's warning.
    replacement_cause: Option<String>,
}

impl<'a, V: Vocabulary> SessionCore<'a, V> {
    /// A session resuming at `start` (everything before it is delivered).
    pub fn new(mut settings: CoreSettings<'a, V>, start: Lsn) -> Self {
        let messages = MessageRows::new(settings.database_encoding.clone());
        let position = settings.position_headers.clone();
        let transactions = settings.transactions.take();
        let suspects = std::mem::take(&mut settings.suspects);
        let schemas = SchemaCache::new(settings.registered_schema_ttl, settings.subject_strategy);
        let flow = Flow::new(
            FlowSettings {
                max_in_flight_records: settings.max_in_flight_records,
                max_in_flight_bytes: settings.max_in_flight_bytes,
                shutdown_timeout: settings.shutdown_timeout,
                delivery_timeout: settings.delivery_timeout,
                replacement_backoff: settings.replacement_backoff,
                dead_letters: matches!(settings.on_error, ErrorPolicy::DeadLetter(_)),
            },
            start,
        );
        SessionCore {
            settings,
            notes: VecDeque::new(),
            flow,
            bindings: FxHashMap::default(),
            messages,
            awaiting_lookup: false,
            schemas,
            held: None,
            txn: None,
            begin: (Lsn::ZERO, 0, 0),
            position,
            next_index: 0,
            transactions,
            finish: None,
            failed: None,
            skipped_committed: 0,
            suspects,
            positions: FxHashMap::default(),
            parked: None,
            solo: None,
            commit_to_ack: LastElapsed::default(),
            send_to_ack: LastElapsed::default(),
            replacement_cause: None,
        }
    }

    /// The next thing the core noticed, for the log and the metrics, in order.
    pub fn poll_note(&mut self) -> Option<Note> {
        self.notes.pop_front()
    }

    /// When the oldest record the producer has not acknowledged was handed over (`None`:
    /// none in flight).
    pub fn oldest_sent(&self) -> Option<Instant> {
        self.flow.oldest_sent()
    }

    /// Whether the driver may read the next source event.
    pub fn can_read(&self) -> bool {
        !self.awaiting_lookup
            && self.parked.is_none()
            && self.solo.is_none()
            && self.flow.can_read()
            && self
                .transactions
                .as_ref()
                .is_none_or(KafkaTransactions::can_send)
    }

    /// When the core wants an [`Input::Tick`] at the latest.
    pub fn next_timeout(&self) -> Option<Instant> {
        let between = self.txn.is_none();
        let commit = self
            .transactions
            .as_ref()
            .and_then(|t| t.next_timeout(between));
        [self.flow.next_timeout(), commit]
            .into_iter()
            .flatten()
            .min()
    }

    /// Exactly-once: the last committed progress (`None`: at-least-once, or nothing
    /// committed yet).
    pub fn committed_progress(&self) -> Option<Progress> {
        self.transactions.as_ref()?.committed()
    }

    /// Exactly-once: whether a commit may start (the session did not fail: a record counted
    /// in the progress may not have reached the producer). A commit asked for and not started
    /// yet (waiting for a topic) is dropped when this turns false.
    pub fn may_commit(&self) -> bool {
        self.transactions
            .as_ref()
            .is_some_and(KafkaTransactions::may_commit)
    }

    /// Records not sent again because an earlier session had committed them.
    pub fn skipped_committed(&self) -> u64 {
        self.skipped_committed
    }

    /// Exactly-once: the records the broker refused so far, for the next session.
    pub fn take_suspects(&mut self) -> Suspects<V::Fault> {
        std::mem::take(&mut self.suspects)
    }

    /// The next action, in order.
    pub fn poll_action(&mut self) -> Option<Action<V>> {
        loop {
            let Some(action) = self.flow.poll_action() else {
                // Everything queued is handed over: a due commit runs now.
                return match self.transactions.as_mut()?.commit_step() {
                    Some(TransactionStep::Commit(progress)) => Some(Action::Commit(progress)),
                    Some(TransactionStep::Begin) | None => None,
                };
            };
            return Some(match action {
                Queued::Send { token, record } => Action::Send { token, record },
                Queued::Delivered(lsn) => match &mut self.transactions {
                    None => Action::Confirm(lsn),
                    Some(transactions) => match transactions.acknowledged(lsn) {
                        Some(lsn) => Action::Confirm(lsn),
                        None => continue,
                    },
                },
                // A shutdown that failed before the flow finished ends with the failure.
                Queued::Stopped(Ok(())) if self.failed.is_some() => {
                    Action::Finish(self.failed.take().map_or(Ok(()), Err))
                }
                Queued::Stopped(Ok(()))
                    if self
                        .transactions
                        .as_ref()
                        .is_some_and(KafkaTransactions::is_open) =>
                {
                    // The open Kafka transaction is committed first.
                    self.finish = Some(Ok(()));
                    continue;
                }
                Queued::BeginTransaction => Action::BeginTransaction,
                Queued::Committed(lsn) => Action::Confirm(lsn),
                Queued::Finish(result) => Action::Finish(result),
                Queued::PurgeProducer => Action::PurgeProducer,
                Queued::ReplaceProducer => Action::ReplaceProducer,
                Queued::Stopped(result) => Action::Finish(result),
                Queued::Lookup(lookup) => Action::Lookup(lookup),
                Queued::ForgetRelation(oid) => Action::ForgetRelation(oid),
                Queued::SkipDeletes(oid) => Action::SkipDeletes(oid),
                Queued::Replacing { resend } => {
                    let cause = self.replacement_cause.take();
                    self.notes
                        .push_back(Note::ProducerReplaced { resend, cause });
                    continue;
                }
                Queued::Overdue { unacked } => {
                    self.notes.push_back(Note::DeliveryOverdue { unacked });
                    // The purge that follows fails the records; the deadline is the cause.
                    self.replacement_cause.get_or_insert_with(|| {
                        "a record was not acknowledged within the delivery deadline \
                         (kafka.properties.\"message.timeout.ms\")"
                            .to_owned()
                    });
                    continue;
                }
            });
        }
    }

    /// Whether [`Action::Finish`] was emitted.
    pub fn is_finished(&self) -> bool {
        self.flow.is_finished()
    }

    /// The acknowledged position (what the next session may resume from); with exactly-once
    /// delivery, the committed one.
    pub fn watermark(&self) -> Lsn {
        match &self.transactions {
            Some(transactions) => transactions.confirmed(),
            None => self.flow.watermark(),
        }
    }

    /// Records in flight and their bytes (the window).
    pub fn in_flight(&self) -> (usize, usize) {
        self.flow.in_flight()
    }

    /// Transactions the ledger keeps.
    pub fn pending_transactions(&self) -> usize {
        self.flow.pending_transactions()
    }

    /// Records given up this session (not delivered before it stopped).
    pub fn abandoned(&self) -> u64 {
        self.flow.abandoned()
    }

    /// Records taken back from the producer and waiting to be sent again.
    pub fn held(&self) -> usize {
        self.flow.held()
    }

    /// Feeds one input.
    pub fn handle(&mut self, now: Now, input: Input<V>) {
        // A finished flow waits only for the last commit's outcome (exactly-once).
        if self.flow.is_finished() {
            if self.finish.is_none() {
                return;
            }
            match input {
                Input::Committed(_) => {}
                // A record that waited for its topic past the stop's deadline never reached
                // the producer: the transaction must not commit without it.
                Input::SendRefused { record, error, .. } => {
                    return self
                        .uncommittable(record.topic.to_string(), AbortCause::NotTaken(error));
                }
                Input::Purged { record, .. } => {
                    return self.uncommittable(record.topic.to_string(), AbortCause::Purged);
                }
                _ => return,
            }
        }
        let outcome = match input {
            Input::Source(event) => self.on_source(now, event),
            Input::SourceFailed(e) => Err(e),
            Input::Delivery(delivery) => self.on_delivery(now, delivery),
            Input::Purged { token, record } => self.on_purged(now, token, record),
            Input::SendRefused {
                token,
                record,
                error,
            } => self.on_send_refused(now, token, record, error),
            Input::Answer(answer) => self.on_answer(now, answer),
            Input::Stalled(seen) => Err(EngineError::Stalled(seen).into()),
            Input::Committed(result) => self.on_committed(now, result),
            Input::Shutdown => {
                info!(target: LOG_TARGET, "shutting down: waiting for in-flight records");
                self.flow.stop(now, Ok(()));
                if let Some(transactions) = &mut self.transactions {
                    transactions.stop();
                }
                Ok(())
            }
            Input::Tick => Ok(()),
        };
        // A held record answered while a commit was due goes once the commit is over.
        let outcome = outcome.and_then(|()| self.release_held(now));
        if let Err(e) = outcome {
            match &mut self.transactions {
                Some(transactions) => {
                    // Exactly-once: nothing is committed after a failure, and a failure during a
                    // shutdown is its end (the flow keeps the first end it is given).
                    transactions.abandon();
                    if self.flow.is_stopping() {
                        self.failed.get_or_insert(e);
                    } else {
                        self.flow.stop(now, Err(e));
                    }
                }
                None => self.flow.stop(now, Err(e)),
            }
        }
        self.flow.after(now);
        if let Some(transactions) = &mut self.transactions {
            transactions.check(now.instant, self.txn.is_none());
        }
    }

    fn on_source(&mut self, now: Now, event: SourceEvent) -> Result<(), V::Error> {
        match event {
            SourceEvent::Begin {
                final_lsn,
                commit_time_us,
                xid,
            } => {
                self.txn = Some(self.flow.begin(final_lsn, commit_time_us)?);
                self.begin = (final_lsn, xid, commit_time_us);
                if let Ok(latency) = now.wall.duration_since(pg_timestamp(commit_time_us)) {
                    self.notes.push_back(Note::CommitToRead(latency));
                }
                self.next_index = 0;
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
            SourceEvent::OutboxDelete { relation_id, lsn } => {
                self.on_outbox_delete(relation_id, lsn)?
            }
            SourceEvent::Commit { end_lsn, .. } => {
                self.notes.push_back(Note::Transaction);
                self.txn = None;
                if let Some(transactions) = &mut self.transactions {
                    transactions.transaction_read(self.begin.0, end_lsn);
                }
                self.flow.commit(end_lsn)?;
            }
            SourceEvent::Idle { wal_end } => self.flow.idle(wal_end),
            SourceEvent::Message {
                transactional,
                lsn,
                prefix,
                content,
            } => self.on_message(now, transactional, lsn, &prefix, &content)?,
        }
        Ok(())
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
        self.flow.push(Queued::Lookup(lookup));
    }

    fn on_answer(&mut self, now: Now, answer: Answer<V>) -> Result<(), V::Error> {
        match answer {
            super::catalog::Answer::SchemaId { id, .. } => {
                return self.on_registry_answer(now, Answered::SchemaId(id));
            }
            super::catalog::Answer::LatestSchema { schema, .. } => {
                return self.on_registry_answer(now, Answered::LatestSchema(schema));
            }
            super::catalog::Answer::NotNullColumns { relation, columns } => {
                self.awaiting_lookup = false;
                let columns = columns.map_err(EngineError::Catalog)?;
                let table = TableName {
                    schema: relation.namespace.to_string(),
                    name: relation.name.to_string(),
                };
                let router = self.settings.router.for_table(&table);
                let binding = self.bind(router, &relation, &columns)?;
                // Its DELETEs are skipped without a row (an unbindable table's are
                // dead-lettered, with their row).
                let skips_deletes =
                    matches!(&binding, Binding::Bound { router, .. } if router.skips_deletes());
                self.bindings.insert(relation.id, binding);
                if skips_deletes {
                    self.flow.push(Queued::SkipDeletes(relation.id));
                }
            }
            super::catalog::Answer::OutboxRelation { relation, outbox } => {
                match outbox.map_err(EngineError::Catalog)? {
                    Some(outbox) => {
                        debug!(target: LOG_TARGET, partition = %format_args!("{}.{}", relation.namespace, relation.name), table = %format_args!("{}.{}", outbox.namespace, outbox.name), "changes named by a partition are routed as its outbox table's");
                        self.flow
                            .push(Queued::Lookup(Lookup::NotNullColumns(Arc::new(outbox))));
                    }
                    None => {
                        self.awaiting_lookup = false;
                        debug!(target: LOG_TARGET, table = %format_args!("{}.{}", relation.namespace, relation.name), "table is published but not an outbox table; its changes are ignored");
                        self.bindings.remove(&relation.id);
                        // Nothing is kept for it: a publication `FOR ALL TABLES` describes every
                        // table ever written, staging tables created and dropped by the thousand.
                        self.flow.push(Queued::ForgetRelation(relation.id));
                    }
                }
            }
        }
        Ok(())
    }

    /// Binds `relation` with `router`: a binding, or (dead letters configured) why its rows
    /// cannot be routed. A configured column the stream leaves out (a generated column) is named
    /// as such, with the catalog's cause, not as missing.
    fn bind(
        &mut self,
        router: &'a EventRouter,
        relation: &Relation,
        columns: &OutboxColumns,
    ) -> Result<Binding<'a>, V::Error> {
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
            Err(e)
                if matches!(
                    self.settings.on_error.for_row(true),
                    Disposal::DeadLetter(_)
                ) =>
            {
                self.notes.push_back(Note::TableUnroutable {
                    table: format!("{}.{}", relation.namespace, relation.name),
                    error: Box::new(e.clone()),
                });
                Ok(Binding::Unbindable(e))
            }
            Err(e) => Err(EngineError::Unbindable(Box::new(e)).into()),
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
    ) -> Result<(), V::Error> {
        if !self.settings.message_prefixes.contains(prefix) {
            debug!(target: LOG_TARGET, prefix, "logical message of another prefix ignored");
            return Ok(());
        }
        if !transactional {
            return match self.settings.non_transactional {
                NonTransactionalPolicy::Error => Err(EngineError::NonTransactionalMessage {
                    prefix: prefix.to_owned(),
                    lsn,
                }
                .into()),
                NonTransactionalPolicy::Skip => {
                    self.notes.push_back(Note::NonTransactionalMessageSkipped {
                        prefix: prefix.to_owned(),
                        lsn,
                    });
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
                self.notes.push_back(Note::EventRead);
                return match self.settings.on_error.for_row(true) {
                    Disposal::Stop | Disposal::LetterRefused => Err(EngineError::Message(e).into()),
                    Disposal::DeadLetter(dead_letters) => {
                        // Dead-lettered as a row of its own, its content as text.
                        let txn = self.txn.ok_or(LedgerError::NoOpenTransaction)?;
                        let (relation, row) = self.messages.unreadable(prefix, content);
                        let error = Box::new(e.to_string());
                        self.dead_letter_row(now, dead_letters, txn, &relation, &row, lsn, error)
                    }
                };
            }
        };
        self.on_change(now, &relation, RowChange::Insert(row), lsn)
    }

    /// A row of a relation the source does not keep: another table's, skipped by rule. One
    /// with a binding would be an outbox row without its description: the session reconnects,
    /// and the new one is described its tables again.
    fn on_other_table_change(&mut self, relation_id: Oid, lsn: Lsn) -> Result<(), V::Error> {
        self.notes.push_back(Note::EventRead);
        self.txn.ok_or(LedgerError::NoOpenTransaction)?;
        if self.bindings.contains_key(&relation_id) {
            return Err(EngineError::UndescribedOutboxRow {
                relation: relation_id,
                lsn,
            }
            .into());
        }
        self.notes.push_back(Note::OtherTableRow);
        Ok(())
    }

    /// A DELETE of a row of a bound outbox table, its old row not decoded (the source skims the
    /// DELETEs of the relations named by [`Action::SkipDeletes`]): skipped as
    /// [`SessionCore::on_change`] skips a DELETE, with the same counters and event. A relation
    /// without such a binding cannot come here (a new description of it ends the skimming
    /// before it is bound again); if one did, its DELETE may be due a dead letter, which needs
    /// the row: the session reconnects, and the new one decodes it.
    fn on_outbox_delete(&mut self, relation_id: Oid, lsn: Lsn) -> Result<(), V::Error> {
        self.notes.push_back(Note::EventRead);
        self.txn.ok_or(LedgerError::NoOpenTransaction)?;
        match self.bindings.get(&relation_id) {
            Some(Binding::Bound { binding, router }) if router.skips_deletes() => {
                let reason = SkipReason::Delete;
                self.notes.push_back(Note::skipped(
                    binding.table(),
                    reason,
                    router.log_level(reason),
                ));
                Ok(())
            }
            _ => Err(EngineError::DeleteWithoutRow {
                relation: relation_id,
                lsn,
            }
            .into()),
        }
    }

    fn on_change(
        &mut self,
        now: Now,
        relation: &Arc<Relation>,
        change: RowChange,
        lsn: Lsn,
    ) -> Result<(), V::Error> {
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
        self.notes.push_back(Note::EventRead);
        let txn = self.txn.ok_or(LedgerError::NoOpenTransaction)?;
        let routed = match self.bindings.get(&relation.id) {
            None => {
                self.notes.push_back(Note::OtherTableRow);
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
            Ok((Routed::Registry(routed), _)) => {
                self.send_registry(now, txn, routed, (relation, row, lsn))
            }
            Ok((Routed::Skipped(reason), router)) => {
                self.notes.push_back(Note::skipped(
                    format_args!("{}.{}", relation.namespace, relation.name),
                    reason,
                    router.log_level(reason),
                ));
                Ok(())
            }
            Err(reason) => match self.settings.on_error.for_row(true) {
                Disposal::Stop | Disposal::LetterRefused => Err(EngineError::Row {
                    error: Box::new(reason),
                    lsn,
                }
                .into()),
                Disposal::DeadLetter(dead_letters) => self.dead_letter_row(
                    now,
                    dead_letters,
                    txn,
                    relation,
                    row,
                    lsn,
                    Box::new(reason),
                ),
            },
        }
    }

    /// The row at `lsn` goes to the dead-letter topic in place of its record, with why.
    #[allow(clippy::too_many_arguments)]
    fn dead_letter_row(
        &mut self,
        now: Now,
        dead_letters: &DeadLetters,
        txn: TxnId,
        relation: &Relation,
        row: &TupleData,
        lsn: Lsn,
        error: super::note::Shown,
    ) -> Result<(), V::Error> {
        let letter = dead_letters.for_row(relation, row, &*error, lsn, self.flow.commit_lsn(txn));
        self.notes.push_back(Note::RowDeadLettered {
            table: format!("{}.{}", relation.namespace, relation.name),
            lsn,
            error,
            dead_letter_topic: dead_letters.topic().to_owned(),
        });
        self.send_new(now, txn, letter)
    }

    /// A record in a registry format: sent at once when the cache answers for it, else held
    /// (reading waits) while the registry is asked.
    fn send_registry(
        &mut self,
        now: Now,
        txn: TxnId,
        routed: RegistryRecord,
        source: RowSource<'_>,
    ) -> Result<(), V::Error> {
        let step = RegistryWrite::new(routed).advance(&self.schemas, now.instant);
        self.notes.push_back(Note::SchemaId {
            known: !matches!(step, Step::Waiting(..)),
        });
        match step {
            Step::Waiting(write, ask) => {
                let (relation, row, lsn) = source;
                self.awaiting_lookup = true;
                self.held = Some(HeldRecord {
                    txn,
                    relation: Arc::clone(relation),
                    row: row.clone(),
                    lsn,
                    write: Some(write),
                    resolved: None,
                });
                self.ask(ask);
                Ok(())
            }
            Step::Ready(record) => self.send_routed(now, txn, record),
            Step::Refused(refusal) => {
                let resolved = self.refused(refusal, source.2)?;
                self.carry_out(now, txn, resolved, source)
            }
        }
    }

    /// Puts `ask` to the registry.
    fn ask(&mut self, ask: Ask) {
        let lookup = match ask {
            Ask::SchemaId { subject, schema } => Lookup::SchemaId { subject, schema },
            Ask::LatestSchema { subject } => Lookup::LatestSchema { subject },
        };
        self.flow.push(Queued::Lookup(lookup));
    }

    /// The registry's answer for the held record: kept, and the record advanced (sent, or asked
    /// about again); or its refusal.
    fn on_registry_answer(
        &mut self,
        now: Now,
        answer: Answered<V::RegistryError>,
    ) -> Result<(), V::Error> {
        let Some(mut held) = self.held.take() else {
            self.awaiting_lookup = false;
            return Ok(());
        };
        let Some(write) = held.write.take() else {
            self.held = Some(held);
            return Ok(());
        };
        let step = match write.answered(&mut self.schemas, now.instant, answer) {
            Ok(write) => write.advance(&self.schemas, now.instant),
            Err(refusal) => Step::Refused(refusal),
        };
        let resolved = match step {
            Step::Waiting(write, ask) => {
                held.write = Some(write);
                self.held = Some(held);
                self.ask(ask);
                return Ok(());
            }
            Step::Ready(record) => Ok(Resolved::Send(record)),
            Step::Refused(refusal) => self.refused(refusal, held.lsn),
        };
        match resolved {
            Ok(resolved) => {
                held.resolved = Some(resolved);
                self.held = Some(held);
                self.release_held(now)
            }
            Err(error) => {
                self.awaiting_lookup = false;
                Err(error)
            }
        }
    }

    /// What a refused record becomes: its row's dead letter, when `on_error` sends such
    /// refusals there ([`Refusal::dead_letterable`]); otherwise the session's end, naming the
    /// subject.
    fn refused(
        &mut self,
        refusal: Refusal<V::RegistryError>,
        lsn: Lsn,
    ) -> Result<Resolved<'a>, V::Error> {
        if refusal.is_misfit() {
            self.notes.push_back(Note::SchemaMisfit);
        }
        let on_error = self.settings.on_error;
        if let Disposal::DeadLetter(dead_letters) =
            on_error.for_row(refusal.dead_letterable(V::schema_refused))
        {
            return Ok(Resolved::DeadLetter {
                dead_letters,
                reason: refusal.to_string(),
            });
        }
        Err(EngineError::RegistryRefusal { refusal, lsn }.into())
    }

    /// Sends the held record (or its dead letter) once its lookup is answered and records may
    /// be sent: not while a Kafka transaction's commit is due or runs (it would miss the
    /// transaction), nor once the session stops (the next session reads its row again).
    fn release_held(&mut self, now: Now) -> Result<(), V::Error> {
        let answered = self.held.as_ref().is_some_and(|h| h.resolved.is_some());
        let may_send = self
            .transactions
            .as_ref()
            .is_none_or(KafkaTransactions::can_send);
        if !answered || !may_send || self.flow.is_stopping() {
            return Ok(());
        }
        let Some(HeldRecord {
            txn,
            relation,
            row,
            lsn,
            resolved: Some(resolved),
            ..
        }) = self.held.take()
        else {
            return Ok(());
        };
        self.awaiting_lookup = false;
        self.carry_out(now, txn, resolved, (&relation, &row, lsn))
    }

    /// Carries out what the registry's answers made of a record: sent, or its row
    /// dead-lettered.
    fn carry_out(
        &mut self,
        now: Now,
        txn: TxnId,
        resolved: Resolved<'a>,
        (relation, row, lsn): RowSource<'_>,
    ) -> Result<(), V::Error> {
        match resolved {
            Resolved::Send(record) => self.send_routed(now, txn, record),
            Resolved::DeadLetter {
                dead_letters,
                reason,
            } => self.dead_letter_row(now, dead_letters, txn, relation, row, lsn, Box::new(reason)),
        }
    }

    /// The index of the next record of the open transaction, and whether an earlier session
    /// already committed it to Kafka (exactly-once: it is not sent again).
    fn next_record(&mut self) -> (u32, bool) {
        let index = self.next_index;
        self.next_index = self.next_index.saturating_add(1);
        let committed = self
            .transactions
            .as_ref()
            .is_some_and(|t| t.already_committed(self.begin.0, index));
        if committed {
            self.skipped_committed += 1;
        }
        (index, committed)
    }

    /// Hands a newly routed record of `txn` to the producer: [`SessionCore::send_new`] with
    /// the record also counted as routed, its topic's counters looked up once.
    fn send_routed(
        &mut self,
        now: Now,
        txn: TxnId,
        mut record: RoutedRecord,
    ) -> Result<(), V::Error> {
        let (index, committed) = self.next_record();
        if committed {
            return Ok(());
        }
        if let Some(position) = &self.position {
            position.stamp(self.begin.0, index, &mut record);
        }
        match self.suspects.get(&(self.begin.0, index)) {
            None => {}
            Some(Suspect::Alone(fault)) => {
                let fault = fault.clone();
                return self.dead_letter_refused(now, txn, index, record, fault);
            }
            Some(Suspect::Shared(_)) => return self.send_alone(now, txn, index, record),
        }
        let bytes = record_bytes(&record);
        let added = self.flow.add(txn, bytes, now);
        self.notes.push_back(Note::Routed {
            topic: Arc::clone(&record.topic),
            produced: added.is_ok(),
        });
        self.hand_over(now, added?, record, Some((index, bytes)));
        Ok(())
    }

    /// Exactly-once: the suspect record `index` of `txn` goes alone in a Kafka transaction of
    /// its own: after the open one commits (parked until then), and committed at once. Nothing
    /// is read meanwhile.
    fn send_alone(
        &mut self,
        now: Now,
        txn: TxnId,
        index: u32,
        record: RoutedRecord,
    ) -> Result<(), V::Error> {
        let Some(transactions) = &mut self.transactions else {
            return Ok(());
        };
        if transactions.is_open() {
            transactions.force_commit();
            self.parked = Some((txn, index, record));
            return Ok(());
        }
        debug!(target: LOG_TARGET, topic = %record.topic, "sending a record the broker refused alone, in a Kafka transaction of its own");
        let bytes = record_bytes(&record);
        let seq = self.flow.add(txn, bytes, now)?;
        self.hand_over(now, seq, record, Some((index, bytes)));
        self.solo = Some((self.begin.0, index));
        if let Some(transactions) = &mut self.transactions {
            transactions.force_commit();
        }
        Ok(())
    }

    /// Exactly-once: the record `index` of `txn` was refused when sent alone: its dead letter
    /// takes its place.
    fn dead_letter_refused(
        &mut self,
        now: Now,
        txn: TxnId,
        index: u32,
        record: RoutedRecord,
        fault: V::Fault,
    ) -> Result<(), V::Error> {
        let on_error = self.settings.on_error;
        let dead_letters = match on_error.for_refused(&record.topic) {
            Disposal::DeadLetter(dead_letters) => dead_letters,
            Disposal::Stop => return Err(EngineError::RefusedInTransaction(fault).into()),
            Disposal::LetterRefused => return Err(EngineError::DeadLetterRefused(fault).into()),
        };
        let letter = self.letter_for(dead_letters, txn, record, &fault);
        let bytes = record_bytes(&letter);
        let seq = self.flow.add(txn, bytes, now)?;
        self.notes.push_back(Note::Produced {
            topic: Arc::clone(&letter.topic),
        });
        self.hand_over(now, seq, letter, Some((index, bytes)));
        Ok(())
    }

    /// The dead letter of `record` of `txn`, which Kafka refuses for `fault` (told to the
    /// telemetry).
    fn letter_for(
        &mut self,
        dead_letters: &DeadLetters,
        txn: TxnId,
        record: RoutedRecord,
        fault: &V::Fault,
    ) -> RoutedRecord {
        self.notes.push_back(Note::RecordDeadLettered {
            topic: Arc::clone(&record.topic),
            error: Box::new(fault.clone()),
        });
        dead_letters.for_record(record, fault, Stage::Produce, self.flow.commit_lsn(txn))
    }

    /// Hands a new record of `txn` to the producer (a dead letter of a row).
    fn send_new(&mut self, now: Now, txn: TxnId, record: RoutedRecord) -> Result<(), V::Error> {
        let (index, committed) = self.next_record();
        if committed {
            return Ok(());
        }
        let bytes = record_bytes(&record);
        let seq = self.flow.add(txn, bytes, now)?;
        self.notes.push_back(Note::Produced {
            topic: Arc::clone(&record.topic),
        });
        self.hand_over(now, seq, record, Some((index, bytes)));
        Ok(())
    }

    /// Queues the sending of `record` (the record `index` of the open transaction, of `bytes`;
    /// `None` for a dead letter that replaces a record already counted), after beginning a
    /// Kafka transaction if exactly-once delivery has none open.
    fn hand_over(
        &mut self,
        now: Now,
        seq: Seq,
        record: RoutedRecord,
        counted: Option<(u32, usize)>,
    ) {
        if let Some(transactions) = &mut self.transactions {
            if transactions.before_send(now.instant).is_some() {
                self.flow.push(Queued::BeginTransaction);
            }
            if let Some((index, bytes)) = counted {
                transactions.sent(self.begin.0, index, bytes);
                self.positions.insert(seq.token(), (self.begin.0, index));
            }
        }
        self.flow.hand_over(seq, record);
    }

    /// Exactly-once: the finished flow waits for the last commit, and a record of its
    /// transaction did not reach the producer: no commit, the session ends with the failure.
    fn uncommittable(&mut self, topic: String, cause: AbortCause<V>) {
        if let Some(transactions) = &mut self.transactions {
            transactions.abandon();
        }
        if self.finish.take().is_some() {
            self.flow
                .push(Queued::Finish(Err(EngineError::TransactionAborted {
                    topic,
                    cause,
                }
                .into())));
        }
    }

    /// Exactly-once: the commit ended. Success confirms what it covered (and ends a stopping
    /// session); a failure ends the session.
    fn on_committed(&mut self, now: Now, result: Result<(), V::SendError>) -> Result<(), V::Error> {
        let Some(transactions) = &mut self.transactions else {
            return Ok(());
        };
        match result {
            Ok(()) => {
                if let Some(lsn) = transactions.committed_ok() {
                    self.flow.push(Queued::Committed(lsn));
                }
                if let Some(finish) = self.finish.take() {
                    self.flow.push(Queued::Finish(finish));
                }
                // A suspect committed alone was innocent; a parked one goes now.
                if let Some(position) = self.solo.take() {
                    self.suspects.remove(&position);
                }
                if let Some((txn, index, record)) = self.parked.take() {
                    self.send_alone(now, txn, index, record)?;
                }
                Ok(())
            }
            // The flow has finished already: the held end becomes the failure.
            Err(e) if self.finish.take().is_some() => {
                self.flow
                    .push(Queued::Finish(Err(EngineError::Sink(e).into())));
                Ok(())
            }
            Err(e) => Err(EngineError::Sink(e).into()),
        }
    }

    fn on_delivery(
        &mut self,
        now: Now,
        delivery: Delivery<V::DeliveryError>,
    ) -> Result<(), V::Error> {
        let token = delivery.token;
        if self.transactions.is_some() && delivery.result.is_ok() {
            self.positions.remove(&token);
        }
        let failure = match delivery.result {
            Ok(_) => {
                let settled = self.flow.delivered(token)?;
                let since_commit = self
                    .commit_to_ack
                    .get((settled.commit_time_us, now.wall), |(commit, arrival)| {
                        arrival.duration_since(pg_timestamp(commit)).ok()
                    });
                if let Some(latency) = since_commit {
                    self.notes.push_back(Note::CommitToAck(latency));
                }
                let since_send = self.send_to_ack.get(
                    (settled.record.first_sent, now.instant),
                    |(sent, arrival)| Some(arrival.saturating_duration_since(sent)),
                );
                if let Some(latency) = since_send {
                    self.notes.push_back(Note::SendToAck(latency));
                }
                return Ok(());
            }
            Err(failure) => *failure,
        };
        self.notes.push_back(Note::DeliveryFailed {
            topic: Arc::clone(&failure.record.topic),
            kind: match failure.error.verdict() {
                Verdict::RecordRefused | Verdict::OperatorFix => FailureKind::Definite,
                Verdict::Transient { .. } => FailureKind::Transient,
            },
            error: Box::new(failure.error.clone()),
        });
        if self.transactions.is_some() {
            // The open Kafka transaction cannot commit with a failed record in it.
            self.flow.reported_fatal(token);
            let position = self.positions.remove(&token);
            return Err(match V::read_delivery(failure.error) {
                DeliveryReading::Refused {
                    fault,
                    on_error_applies,
                } => self.refused_in_transaction(
                    position,
                    failure.record.topic.to_string(),
                    fault,
                    on_error_applies,
                ),
                DeliveryReading::Transient { error, .. } => EngineError::TransactionAborted {
                    topic: failure.record.topic.to_string(),
                    cause: AbortCause::Delivery(error),
                },
            }
            .into());
        }
        if self.replacement_cause.is_none()
            && failure.error.verdict() == (Verdict::Transient { replace: true })
        {
            self.replacement_cause = Some(failure.error.to_string());
        }
        let outcome = match V::read_delivery(failure.error) {
            DeliveryReading::Refused {
                fault,
                on_error_applies: true,
            } => Outcome::Refused {
                token,
                record: failure.record,
                fault,
                at_enqueue: false,
            },
            // Refused, but not for the record's sake: only the operator can cure it.
            DeliveryReading::Refused { fault, .. } => {
                self.flow.reported_fatal(token);
                return Err(EngineError::Refused(fault).into());
            }
            DeliveryReading::Transient { replace, .. } => Outcome::Failed {
                token,
                record: failure.record,
                replace,
            },
        };
        self.on_outcome(now, outcome)
    }

    /// Exactly-once: the broker refused the record at `position` in the open Kafka
    /// transaction. With dead letters it becomes a suspect (sent alone next session) or, refused
    /// alone, guilty (dead-lettered next session), and the session ends; otherwise the refusal
    /// stops Siphon.
    fn refused_in_transaction(
        &mut self,
        position: Option<(Lsn, u32)>,
        topic: String,
        fault: V::Fault,
        on_error_applies: bool,
    ) -> EngineError<V> {
        let dead_letters = matches!(self.settings.on_error, ErrorPolicy::DeadLetter(_));
        let (Some(position), true, true) = (position, dead_letters, on_error_applies) else {
            return EngineError::RefusedInTransaction(fault);
        };
        suspects::refused(
            &mut self.suspects,
            position,
            self.solo == Some(position),
            &fault,
        );
        EngineError::TransactionAborted {
            topic,
            cause: AbortCause::Refused(fault),
        }
    }

    /// A record handed back by a purge before the producer took it: counted as a transient
    /// producer error, as the producer's own purged records are.
    fn on_purged(&mut self, now: Now, token: usize, record: RoutedRecord) -> Result<(), V::Error> {
        self.notes.push_back(Note::DeliveryFailed {
            topic: Arc::clone(&record.topic),
            error: Box::new("purged with the producer before it took the record"),
            kind: FailureKind::Transient,
        });
        if self.transactions.is_some() {
            self.flow.reported_fatal(token);
            return Err(EngineError::TransactionAborted {
                topic: record.topic.to_string(),
                cause: AbortCause::Purged,
            }
            .into());
        }
        self.on_outcome(now, Outcome::Purged { token, record })
    }

    /// What the flow makes of a record that came back: held, abandoned, dead-lettered or the
    /// session's end.
    fn on_outcome(
        &mut self,
        now: Now,
        outcome: Outcome<RoutedRecord, V::Fault>,
    ) -> Result<(), V::Error> {
        let letter = match self.flow.outcome(outcome) {
            Ok(None) => return Ok(()),
            Ok(Some(letter)) => letter,
            Err(FlowError::Refused(fault)) => return Err(EngineError::Refused(fault).into()),
            Err(FlowError::Ledger(e)) => return Err(e.into()),
        };
        let ToDeadLetter {
            seq,
            txn,
            record,
            fault,
        } = letter;
        let on_error = self.settings.on_error;
        let dead_letters = match on_error.for_refused(&record.topic) {
            Disposal::DeadLetter(dead_letters) => dead_letters,
            Disposal::Stop => return Err(EngineError::Refused(fault).into()),
            Disposal::LetterRefused => return Err(EngineError::DeadLetterRefused(fault).into()),
        };
        let letter = self.letter_for(dead_letters, txn, record, &fault);
        self.notes.push_back(Note::Produced {
            topic: Arc::clone(&letter.topic),
        });
        // The letter joins the transaction before the refused record settles.
        self.flow.dead_lettered(now, seq, txn, letter)?;
        Ok(())
    }

    fn on_send_refused(
        &mut self,
        now: Now,
        token: usize,
        record: RoutedRecord,
        error: V::SendError,
    ) -> Result<(), V::Error> {
        let outcome = match V::enqueue_fault(error) {
            // Refused at enqueue: this record alone is at fault.
            Ok(fault) => {
                self.notes.push_back(Note::DeliveryFailed {
                    topic: Arc::clone(&record.topic),
                    error: Box::new(fault.clone()),
                    kind: FailureKind::Definite,
                });
                if self.transactions.is_some() && self.flow.is_stopping() {
                    // A stopping flow gives it up without a dead letter: the open Kafka
                    // transaction, whose progress counts it, must not commit.
                    self.flow.reported_fatal(token);
                    return Err(EngineError::TransactionAborted {
                        topic: record.topic.to_string(),
                        cause: match V::not_taken(fault) {
                            Ok(error) => AbortCause::NotTaken(error),
                            Err(fault) => AbortCause::Refused(fault),
                        },
                    }
                    .into());
                }
                Outcome::Refused {
                    token,
                    record,
                    fault,
                    at_enqueue: true,
                }
            }
            Err(error) if V::is_transient(&error) => {
                self.notes.push_back(Note::RecordNotTaken {
                    topic: Arc::clone(&record.topic),
                    error: Box::new(error.to_string()),
                });
                if self.transactions.is_some() {
                    self.flow.reported_fatal(token);
                    return Err(EngineError::TransactionAborted {
                        topic: record.topic.to_string(),
                        cause: AbortCause::NotTaken(error),
                    }
                    .into());
                }
                Outcome::Failed {
                    token,
                    record,
                    replace: true,
                }
            }
            Err(error) => {
                self.flow.reported_fatal(token);
                return Err(EngineError::Sink(error).into());
            }
        };
        self.on_outcome(now, outcome)
    }
}
