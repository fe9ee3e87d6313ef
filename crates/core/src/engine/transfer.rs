//! A transfer's rows (an initial snapshot's, a re-send's) through the session's rules: each
//! row becomes the record the stream makes of its INSERT, goes through the same registry
//! steps, and what cannot be delivered as it is goes where `pipeline.on_error` sends the
//! stream's. The driver reads the rows, hands the records to a producer and brings back the
//! reports and the registry's answers; every decision is taken here.
//!
//! A [`TransferSession`] is driven as the stream's engine is: [`TransferSession::handle`] an
//! input, then [`TransferSession::poll_action`] until it has none, and
//! [`TransferSession::poll_note`] for the telemetry.
//!
//! # Invariants
//! - A row is routed by its table's router as an INSERT, its registry format written through
//!   [`RegistryWrite`], and a row or record that cannot be delivered disposed of by
//!   [`ErrorPolicy::for_row`] and [`ErrorPolicy::for_refused`]: the stream's rules, not a copy
//!   of them.
//! - At most `max_records` records of at most `max_bytes` bytes are in flight; a record larger
//!   than the whole window goes alone.
//! - A row is taken only when nothing waits ([`TransferSession::can_take_row`]): no registry
//!   answer outstanding, no record waiting for room in the window. So a transfer holds one
//!   row beyond its window at most.
//! - [`TransferSession::is_settled`] only once every record and dead letter handed over was
//!   acknowledged: progress written then names only acknowledged rows.
//! - A failure that is not the record's own fault stops the transfer ([`TransferStop`]); it
//!   resumes from its last progress, never skipping a row.
//! - In a Kafka transaction (`in_transaction`), a record the broker refused is never followed
//!   by its dead letter in that transaction: the refusal aborts it, so nothing sent with it can
//!   be committed. With dead letters the refused record becomes a suspect, named by its row's
//!   index (the stream's rule, [`suspects::refused`]), and the transfer stops
//!   ([`TransferStop::Aborted`]) to run again from its last committed progress with the
//!   suspects ([`TransferSession::with_suspects`]): a suspect's record goes alone, in a Kafka
//!   transaction of its own between two commits ([`TransferAction::Commit`]); refused alone,
//!   its dead letter takes its place next time. A record the producer would not take (refused
//!   before it left) leaves the transaction sound, and is dead-lettered in it.
//! - No IO and no clock: time comes in as a parameter.

use super::dead_letter::Stage;
use super::note::Note;
use super::policy::{Disposal, ErrorPolicy};
use super::position::PositionHeaders;
use super::registry_write::{Answered, Ask, Refusal, RegistryWrite, SchemaCache, Step};
use super::suspects::{self, Suspect, Suspects};
use super::vocabulary::{DeliveryReading, Vocabulary};
use bytes::Bytes;
use pgoutput::{Lsn, Relation, TupleData};
use rustc_hash::FxHashMap;
use siphon_record::{record_bytes, Delivery, Header, RoutedRecord};
use siphon_router::{Change, EventRouter, RouteError, Routed, TableBinding};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

/// The header a re-sent record carries, its value the re-send's id.
pub const RESEND_HEADER: &str = "siphon.resend";

/// The headers appended to each record of a transfer (not to dead letters).
pub enum Stamp {
    /// Initial snapshot: with `format.position_headers`, the position `0:<index>` (before every
    /// streamed record), counted on from the rows sent before (the index of the next row).
    Snapshot(Option<(PositionHeaders, u32)>),
    /// Re-send: [`RESEND_HEADER`] with the re-send's id.
    Resend(Bytes),
}

impl Stamp {
    fn apply(&mut self, record: &mut RoutedRecord) {
        match self {
            Stamp::Snapshot(Some((position, next))) => {
                position.stamp(Lsn::ZERO, *next, record);
                *next = next.saturating_add(1);
            }
            Stamp::Snapshot(None) => {}
            Stamp::Resend(id) => record.headers.push(Header {
                name: Arc::from(RESEND_HEADER),
                value: Some(id.clone()),
            }),
        }
    }
}

/// A transfer's fixed settings.
pub struct TransferSettings<'a> {
    pub on_error: &'a ErrorPolicy,
    /// The window: records and bytes in flight at most.
    pub max_records: usize,
    pub max_bytes: usize,
    /// The position dead-lettered rows name (the consistent point for a snapshot).
    pub lsn: Lsn,
    pub stamp: Stamp,
    /// What the registry answered (empty at first).
    pub schemas: SchemaCache,
    /// Whether the records go in Kafka transactions (exactly-once delivery).
    pub in_transaction: bool,
    /// The index of the first row to come among the transfer's rows (the rows handled before
    /// it, in earlier runs): a refused record is named by its row's index.
    pub first_row: u64,
}

/// What happened, for a transfer.
pub enum TransferInput<V: Vocabulary> {
    /// A row of the table begun last ([`TransferSession::begin_table`]).
    Row(TupleData),
    /// The producer reported a record.
    Delivery(Delivery<V::DeliveryError>),
    /// The producer did not take a record ([`TransferAction::Send`] failed).
    SendRefused {
        token: usize,
        record: RoutedRecord,
        error: V::SendError,
    },
    /// The registry answered the last [`TransferAction::Ask`].
    Answer(Answered<V::RegistryError>),
    /// The Kafka transaction a [`TransferAction::Commit`] asked for committed.
    Committed,
}

/// What the driver must do, in order.
#[derive(Debug)]
pub enum TransferAction {
    /// Hand `record` to the producer; its report carries `token`.
    Send { token: usize, record: RoutedRecord },
    /// Put the question to the registry; answer with [`TransferInput::Answer`].
    Ask(Ask),
    /// In a Kafka transaction: once every record handed over is acknowledged, commit the open
    /// transaction with the progress through the row handled last (`with_last_row`) or the one
    /// before it, and answer with [`TransferInput::Committed`]. Nothing is sent meanwhile.
    Commit { with_last_row: bool },
}

/// Why a transfer stops. A row's stop is about the row handled last.
#[derive(Debug)]
pub enum TransferStop<V: Vocabulary> {
    /// A row the router cannot route, with `on_error = "fail"`.
    Row(RouteError),
    /// The table's columns do not fit the router's options, with `on_error = "fail"`.
    Unbindable(RouteError),
    /// The registry refused the row's record, and `on_error` does not take the refusal.
    Registry(Refusal<V::RegistryError>),
    /// Kafka refused a record: with `on_error = "fail"`, or a refusal only the operator can
    /// lift.
    Refused { topic: Arc<str>, fault: V::Fault },
    /// Even the dead-letter topic refused a record.
    DeadLetterRefused(V::Fault),
    /// The broker refused a record for its own sake inside a Kafka transaction, which the
    /// refusal aborts, with dead letters: the record is a suspect now
    /// ([`TransferSession::take_suspects`]). The transfer runs again from its last committed
    /// progress, with the suspects.
    Aborted { topic: Arc<str>, fault: V::Fault },
    /// A record was not delivered, for a reason sending again may cure.
    Undelivered {
        topic: Arc<str>,
        error: V::DeliveryError,
    },
    /// The producer did not take a record, not for the record's own sake.
    NotTaken(V::SendError),
}

/// The table whose rows come now.
struct TableRoute<'a> {
    router: &'a EventRouter,
    relation: Arc<Relation>,
    /// Its binding, or (with dead letters) why its rows cannot be routed.
    binding: Result<TableBinding, RouteError>,
}

/// A row whose record waits for the registry.
struct Held {
    write: RegistryWrite,
    row: TupleData,
    /// The row's index.
    index: u64,
}

/// A transfer's decisions: rows in, records out, within one window.
pub struct TransferSession<'a, V: Vocabulary> {
    settings: TransferSettings<'a>,
    table: Option<TableRoute<'a>>,
    held: Option<Held>,
    /// Records waiting for room in the window, dead letters first, with their row's index.
    waiting: VecDeque<(RoutedRecord, u64)>,
    /// The size and the row's index of each record in flight, by token.
    in_flight: FxHashMap<usize, (usize, u64)>,
    in_flight_bytes: usize,
    next_token: usize,
    actions: VecDeque<TransferAction>,
    notes: VecDeque<Note>,
    /// The index of the next row.
    next_row: u64,
    /// In a Kafka transaction: records the broker refused, by their row's index, carried from
    /// run to run (see [`Suspect`]).
    suspects: Suspects<V::Fault, u64>,
    /// A suspect's record waiting for the open Kafka transaction to commit, to go alone after
    /// it (its row's index, the record).
    parked: Option<(u64, RoutedRecord)>,
    /// The suspect's row sent alone in the Kafka transaction now open.
    solo: Option<u64>,
    /// In a Kafka transaction: why the open transaction cannot commit (a record failed),
    /// held until every record in flight reported, so that every refusal among them is known.
    doomed: Option<TransferStop<V>>,
    _vocabulary: std::marker::PhantomData<V>,
}

impl<'a, V: Vocabulary> TransferSession<'a, V> {
    pub fn new(settings: TransferSettings<'a>) -> Self {
        let next_row = settings.first_row;
        TransferSession {
            settings: TransferSettings {
                max_records: settings.max_records.max(1),
                max_bytes: settings.max_bytes.max(1),
                ..settings
            },
            table: None,
            held: None,
            waiting: VecDeque::new(),
            in_flight: FxHashMap::default(),
            in_flight_bytes: 0,
            next_token: 0,
            actions: VecDeque::new(),
            notes: VecDeque::new(),
            next_row,
            suspects: Suspects::new(),
            parked: None,
            solo: None,
            doomed: None,
            _vocabulary: std::marker::PhantomData,
        }
    }

    /// The transfer with the `suspects` an earlier run of it left
    /// ([`TransferSession::take_suspects`]), when it runs again from its last committed
    /// progress in the same rows.
    #[must_use]
    pub fn with_suspects(mut self, suspects: Suspects<V::Fault, u64>) -> Self {
        self.suspects = suspects;
        self
    }

    /// In a Kafka transaction: the records the broker refused so far, for the next run.
    pub fn take_suspects(&mut self) -> Suspects<V::Fault, u64> {
        std::mem::take(&mut self.suspects)
    }

    /// The rows that come next are `relation`'s (its NOT NULL columns `not_null`), routed by
    /// `router`.
    ///
    /// # Errors
    /// The table's columns do not fit the router, with `on_error = "fail"`.
    pub fn begin_table(
        &mut self,
        router: &'a EventRouter,
        relation: Arc<Relation>,
        not_null: &HashSet<String>,
    ) -> Result<(), TransferStop<V>> {
        let binding = router.bind_with_not_null(&relation, &|column| not_null.contains(column));
        if let Err(error) = &binding {
            if !matches!(
                self.settings.on_error.for_row(true),
                Disposal::DeadLetter(_)
            ) {
                return Err(TransferStop::Unbindable(error.clone()));
            }
            self.notes.push_back(Note::TableUnroutable {
                table: table_name(&relation),
                error: Box::new(error.clone()),
            });
        }
        self.table = Some(TableRoute {
            router,
            relation,
            binding,
        });
        Ok(())
    }

    /// Whether a row may be handled now: no registry answer outstanding, no record waiting
    /// for room in the window, no suspect waiting to go alone or sent alone and not committed.
    pub fn can_take_row(&self) -> bool {
        self.held.is_none()
            && self.waiting.is_empty()
            && self.parked.is_none()
            && self.solo.is_none()
            && self.doomed.is_none()
    }

    /// Whether every record handed over was acknowledged, and none waits.
    pub fn is_settled(&self) -> bool {
        self.can_take_row() && self.in_flight.is_empty()
    }

    /// Records and bytes in flight.
    pub fn in_flight(&self) -> (usize, usize) {
        (self.in_flight.len(), self.in_flight_bytes)
    }

    /// The next thing the driver must do.
    pub fn poll_action(&mut self) -> Option<TransferAction> {
        self.actions.pop_front()
    }

    /// The next thing noticed, for the log and the metrics.
    pub fn poll_note(&mut self) -> Option<Note> {
        self.notes.pop_front()
    }

    /// Takes in what happened.
    ///
    /// # Errors
    /// Why the transfer stops (see [`TransferStop`]).
    pub fn handle(&mut self, now: Instant, input: TransferInput<V>) -> Result<(), TransferStop<V>> {
        if self.doomed.is_some() {
            return self.on_doomed(input);
        }
        let handled = self.on_input(now, input);
        match handled {
            Err(stop) if self.settings.in_transaction && !self.in_flight.is_empty() => {
                self.doom(stop);
                Ok(())
            }
            handled => handled,
        }
    }

    /// In a Kafka transaction that cannot commit: `stop` is why. It holds until every record
    /// in flight reported (the producer purges those it had not sent, and their reports may
    /// come before a refusal's); nothing new is sent meanwhile.
    fn doom(&mut self, stop: TransferStop<V>) {
        self.waiting.clear();
        self.held = None;
        self.parked = None;
        self.actions
            .retain(|action| !matches!(action, TransferAction::Send { .. }));
        self.doomed = Some(stop);
    }

    /// An input while the open Kafka transaction is doomed: reports are taken (a refusal makes
    /// a suspect, and is the stop unless an operator's fix is needed), the rest ignored; the
    /// stop once nothing is in flight.
    fn on_doomed(&mut self, input: TransferInput<V>) -> Result<(), TransferStop<V>> {
        let failed = match input {
            TransferInput::Delivery(delivery) => self.on_delivery(delivery).err(),
            TransferInput::SendRefused { token, error, .. } => {
                self.settle(token);
                V::enqueue_fault(error).err().map(TransferStop::NotTaken)
            }
            _ => None,
        };
        if let Some(failed) = failed {
            let held_back = self.doomed.as_ref().is_some_and(|held| {
                matches!(
                    held,
                    TransferStop::Undelivered { .. } | TransferStop::NotTaken(_)
                )
            });
            if held_back
                && !matches!(
                    failed,
                    TransferStop::Undelivered { .. } | TransferStop::NotTaken(_)
                )
            {
                self.doomed = Some(failed);
            }
        }
        self.actions.clear();
        self.waiting.clear();
        if self.in_flight.is_empty() {
            return self.doomed.take().map_or(Ok(()), Err);
        }
        Ok(())
    }

    fn on_input(&mut self, now: Instant, input: TransferInput<V>) -> Result<(), TransferStop<V>> {
        match input {
            TransferInput::Row(row) => self.on_row(now, row),
            TransferInput::Delivery(delivery) => self.on_delivery(delivery),
            TransferInput::SendRefused {
                token,
                record,
                error,
            } => {
                let row = self.settle(token);
                match V::enqueue_fault(error) {
                    Ok(fault) => self.refused(record, fault, row.unwrap_or(self.next_row)),
                    Err(error) => Err(TransferStop::NotTaken(error)),
                }
            }
            TransferInput::Answer(answer) => self.on_answer(now, answer),
            TransferInput::Committed => {
                self.on_committed();
                Ok(())
            }
        }?;
        self.hand_waiting();
        Ok(())
    }

    fn on_row(&mut self, now: Instant, row: TupleData) -> Result<(), TransferStop<V>> {
        let index = self.next_row;
        self.next_row = self.next_row.saturating_add(1);
        let Some(table) = &self.table else {
            return Ok(());
        };
        let routed = match &table.binding {
            Ok(binding) => table.router.route(binding, Change::Insert(&row)),
            Err(error) => Err(error.clone()),
        };
        match routed {
            Ok(Routed::Record(record)) => self.send_row_record(record, index),
            Ok(Routed::Registry(routed)) => {
                let step = RegistryWrite::new(routed).advance(&self.settings.schemas, now);
                self.notes.push_back(Note::SchemaId {
                    known: !matches!(step, Step::Waiting(..)),
                });
                self.on_step(step, row, index)
            }
            Ok(Routed::Skipped(reason)) => {
                let level = table.router.log_level(reason);
                self.notes
                    .push_back(Note::skipped(table_name(&table.relation), reason, level));
                Ok(())
            }
            Err(error) => match self.settings.on_error.for_row(true) {
                Disposal::DeadLetter(_) => {
                    self.dead_letter_row(&row, &error, index);
                    Ok(())
                }
                Disposal::Stop | Disposal::LetterRefused => Err(TransferStop::Row(error)),
            },
        }
    }

    /// Where the registry write of `row`'s (row `index`'s) record got to.
    fn on_step(
        &mut self,
        step: Step<V::RegistryError>,
        row: TupleData,
        index: u64,
    ) -> Result<(), TransferStop<V>> {
        match step {
            Step::Ready(record) => self.send_row_record(record, index),
            Step::Waiting(write, ask) => {
                self.held = Some(Held { write, row, index });
                self.actions.push_back(TransferAction::Ask(ask));
                Ok(())
            }
            Step::Refused(refusal) => {
                if refusal.is_misfit() {
                    self.notes.push_back(Note::SchemaMisfit);
                }
                match self
                    .settings
                    .on_error
                    .for_row(refusal.dead_letterable(V::schema_refused))
                {
                    Disposal::DeadLetter(_) => {
                        self.dead_letter_row(&row, &refusal, index);
                        Ok(())
                    }
                    Disposal::Stop | Disposal::LetterRefused => {
                        Err(TransferStop::Registry(refusal))
                    }
                }
            }
        }
    }

    fn on_answer(
        &mut self,
        now: Instant,
        answer: Answered<V::RegistryError>,
    ) -> Result<(), TransferStop<V>> {
        let Some(Held { write, row, index }) = self.held.take() else {
            return Ok(());
        };
        let step = match write.answered(&mut self.settings.schemas, now, answer) {
            Ok(write) => write.advance(&self.settings.schemas, now),
            Err(refusal) => Step::Refused(refusal),
        };
        self.on_step(step, row, index)
    }

    fn on_delivery(&mut self, delivery: Delivery<V::DeliveryError>) -> Result<(), TransferStop<V>> {
        let row = self.settle(delivery.token);
        let Err(failure) = delivery.result else {
            return Ok(());
        };
        let failure = *failure;
        match V::read_delivery(failure.error) {
            DeliveryReading::Refused {
                fault,
                on_error_applies: true,
            } if self.settings.in_transaction
                && matches!(
                    self.settings.on_error.for_refused(&failure.record.topic),
                    Disposal::DeadLetter(_)
                ) =>
            {
                if let Some(row) = row {
                    suspects::refused(&mut self.suspects, row, self.solo == Some(row), &fault);
                }
                Err(TransferStop::Aborted {
                    topic: failure.record.topic,
                    fault,
                })
            }
            DeliveryReading::Refused {
                fault,
                on_error_applies: true,
            } => self.refused(failure.record, fault, row.unwrap_or(self.next_row)),
            DeliveryReading::Refused { fault, .. } => Err(TransferStop::Refused {
                topic: failure.record.topic,
                fault,
            }),
            DeliveryReading::Transient { error, .. } => Err(TransferStop::Undelivered {
                topic: failure.record.topic,
                error,
            }),
        }
    }

    /// A Kafka transaction asked for committed: a suspect committed alone was innocent; a
    /// parked one goes now, alone, and its transaction is committed at once.
    fn on_committed(&mut self) {
        if let Some(row) = self.solo.take() {
            self.suspects.remove(&row);
        }
        if let Some((row, record)) = self.parked.take() {
            self.hand(record, row);
            self.solo = Some(row);
            self.actions.push_back(TransferAction::Commit {
                with_last_row: true,
            });
        }
    }

    /// `record` (of row `row`) was refused for its own sake: its dead letter goes next, or the
    /// transfer stops.
    fn refused(
        &mut self,
        record: RoutedRecord,
        fault: V::Fault,
        row: u64,
    ) -> Result<(), TransferStop<V>> {
        match self.settings.on_error.for_refused(&record.topic) {
            Disposal::DeadLetter(dead_letters) => {
                self.notes.push_back(Note::RecordDeadLettered {
                    topic: Arc::clone(&record.topic),
                    error: Box::new(fault.clone()),
                });
                let letter = dead_letters.for_record(record, &fault, Stage::Produce, None);
                self.waiting.push_front((letter, row));
                Ok(())
            }
            Disposal::Stop => Err(TransferStop::Refused {
                topic: record.topic,
                fault,
            }),
            Disposal::LetterRefused => Err(TransferStop::DeadLetterRefused(fault)),
        }
    }

    /// The dead letter of the current table's `row` (of index `index`), which cannot be sent
    /// for `error`.
    fn dead_letter_row(
        &mut self,
        row: &TupleData,
        error: &(impl std::fmt::Display + ?Sized),
        index: u64,
    ) {
        let (Some(table), ErrorPolicy::DeadLetter(dead_letters)) =
            (&self.table, self.settings.on_error)
        else {
            return;
        };
        let letter = dead_letters.for_row(&table.relation, row, error, self.settings.lsn, None);
        self.notes.push_back(Note::RowDeadLettered {
            table: table_name(&table.relation),
            lsn: self.settings.lsn,
            error: Box::new(error.to_string()),
            dead_letter_topic: dead_letters.topic().to_owned(),
        });
        self.waiting.push_back((letter, index));
    }

    /// Row `index`'s record, stamped, in line for the window. In a Kafka transaction, a
    /// suspect's record waits to go alone, and a guilty one's dead letter takes its place.
    fn send_row_record(
        &mut self,
        mut record: RoutedRecord,
        index: u64,
    ) -> Result<(), TransferStop<V>> {
        self.settings.stamp.apply(&mut record);
        if self.settings.in_transaction {
            match self.suspects.get(&index) {
                None => {}
                Some(Suspect::Alone(fault)) => {
                    let fault = fault.clone();
                    return self.refused(record, fault, index);
                }
                Some(Suspect::Shared(_)) => {
                    self.parked = Some((index, record));
                    self.actions.push_back(TransferAction::Commit {
                        with_last_row: false,
                    });
                    return Ok(());
                }
            }
        }
        self.waiting.push_back((record, index));
        Ok(())
    }

    /// Hands the records waiting to the producer while the window has room (a record larger
    /// than the window when nothing is in flight).
    fn hand_waiting(&mut self) {
        while let Some((record, _)) = self.waiting.front() {
            let size = record_bytes(record);
            let full = self.in_flight.len() >= self.settings.max_records
                || self.in_flight_bytes + size > self.settings.max_bytes;
            if full && !self.in_flight.is_empty() {
                return;
            }
            let Some((record, row)) = self.waiting.pop_front() else {
                return;
            };
            self.hand(record, row);
        }
    }

    /// Hands `record` (of row `row`) to the producer.
    fn hand(&mut self, record: RoutedRecord, row: u64) {
        let size = record_bytes(&record);
        let token = self.next_token;
        self.next_token = self.next_token.wrapping_add(1);
        self.in_flight.insert(token, (size, row));
        self.in_flight_bytes += size;
        self.actions
            .push_back(TransferAction::Send { token, record });
    }

    /// The record of `token` left the window: its row's index.
    fn settle(&mut self, token: usize) -> Option<u64> {
        let (size, row) = self.in_flight.remove(&token)?;
        self.in_flight_bytes -= size;
        Some(row)
    }
}

fn table_name(relation: &Relation) -> String {
    format!("{}.{}", relation.namespace, relation.name)
}

#[cfg(test)]
mod tests {
    use super::super::dead_letter::DeadLetters;
    use super::super::simulation::model::{
        DeliveryError, Model, Operation, RDKafkaErrorCode, SinkError,
    };
    use super::super::simulation::{relation, row, REGISTERED_SCHEMA};
    use super::*;
    use siphon_record::{Delivered, DeliveryFailure, RegistrySchemaKind};
    use siphon_router::{Encoding, Format, RouterOptions};
    use std::collections::BTreeMap;
    use std::time::Duration;

    const DLQ: &str = "dlq";

    fn router(value: Encoding) -> EventRouter {
        let options = RouterOptions::from_map(&BTreeMap::new()).expect("default options");
        EventRouter::new(
            options,
            Format {
                value,
                ..Format::default()
            },
        )
    }

    fn dead_letters() -> ErrorPolicy {
        ErrorPolicy::DeadLetter(DeadLetters::new(DLQ.to_owned(), 1_000_000))
    }

    /// `on_error = "dead-letter"` or `"fail"`.
    fn on_error(dead_lettering: bool) -> ErrorPolicy {
        if dead_lettering {
            dead_letters()
        } else {
            ErrorPolicy::Fail
        }
    }

    /// A transfer of `outbox` rows routed by `router`, within a window of 10 records.
    fn begun<'a>(on_error: &'a ErrorPolicy, router: &'a EventRouter) -> TransferSession<'a, Model> {
        let mut s = session(on_error, 10, Stamp::Snapshot(None));
        s.begin_table(router, relation(), &HashSet::new())
            .expect("binds");
        s
    }

    fn session<'a>(
        on_error: &'a ErrorPolicy,
        max_records: usize,
        stamp: Stamp,
    ) -> TransferSession<'a, Model> {
        TransferSession::new(TransferSettings {
            on_error,
            max_records,
            max_bytes: 1 << 20,
            lsn: Lsn(0x100),
            stamp,
            schemas: SchemaCache::new(
                Duration::from_secs(60),
                siphon_record::registered::SubjectStrategy::Topic,
            ),
            in_transaction: false,
            first_row: 0,
        })
    }

    fn sends(session: &mut TransferSession<'_, Model>) -> Vec<(usize, RoutedRecord)> {
        let mut sent = Vec::new();
        while let Some(action) = session.poll_action() {
            match action {
                TransferAction::Send { token, record } => sent.push((token, record)),
                action => panic!("unexpected {action:?}"),
            }
        }
        sent
    }

    fn acked(token: usize) -> TransferInput<Model> {
        TransferInput::Delivery(Delivery {
            token,
            generation: 0,
            result: Ok(Delivered {
                partition: 0,
                offset: 0,
            }),
        })
    }

    fn failed(token: usize, record: RoutedRecord, code: RDKafkaErrorCode) -> TransferInput<Model> {
        TransferInput::Delivery(Delivery {
            token,
            generation: 0,
            result: Err(Box::new(DeliveryFailure {
                error: DeliveryError::from_code(&record.topic, code),
                record,
            })),
        })
    }

    fn header<'r>(record: &'r RoutedRecord, name: &str) -> Option<&'r [u8]> {
        record
            .headers
            .iter()
            .find(|h| &*h.name == name)
            .and_then(|h| h.value.as_deref())
    }

    fn notes(session: &mut TransferSession<'_, Model>) -> Vec<String> {
        std::iter::from_fn(|| session.poll_note())
            .map(|n| format!("{n:?}"))
            .collect()
    }

    #[test]
    fn rows_become_stamped_records_within_the_window() {
        let on_error = ErrorPolicy::Fail;
        let router = router(Encoding::Json);
        let mut s = session(&on_error, 2, Stamp::Resend(Bytes::from_static(b"r1")));
        s.begin_table(&router, relation(), &HashSet::new())
            .expect("binds");
        let now = Instant::now();
        let mut sent = Vec::new();
        for event in 0..3 {
            assert!(s.can_take_row());
            s.handle(now, TransferInput::Row(row(event, event, false)))
                .expect("routed");
            sent.extend(sends(&mut s));
        }
        // The third waits for room: no fourth row is taken meanwhile.
        assert_eq!(sent.len(), 2);
        assert!(!s.can_take_row());
        assert_eq!(s.in_flight().0, 2);
        s.handle(now, acked(sent[0].0)).expect("acknowledged");
        sent.extend(sends(&mut s));
        assert_eq!(sent.len(), 3);
        assert!(s.can_take_row() && !s.is_settled());
        for (token, record) in &sent[1..] {
            assert_eq!(header(record, RESEND_HEADER), Some(&b"r1"[..]));
            s.handle(now, acked(*token)).expect("acknowledged");
        }
        assert!(s.is_settled());
        assert_eq!(&*sent[0].1.topic, "outbox.event.order");
    }

    #[test]
    fn a_refused_record_is_dead_lettered_or_stops_the_transfer_as_on_error_says() {
        let router = router(Encoding::Json);
        let now = Instant::now();
        for dead_lettering in [true, false] {
            let policy = on_error(dead_lettering);
            let mut s = begun(&policy, &router);
            s.handle(now, TransferInput::Row(row(1, 1, false)))
                .expect("routed");
            let (token, record) = sends(&mut s).remove(0);
            let refused = s.handle(
                now,
                failed(token, record, RDKafkaErrorCode::MessageSizeTooLarge),
            );
            if !dead_lettering {
                assert!(matches!(refused, Err(TransferStop::Refused { .. })));
                continue;
            }
            refused.expect("dead-lettered");
            let (token, letter) = sends(&mut s).remove(0);
            assert_eq!(&*letter.topic, DLQ);
            assert_eq!(
                header(&letter, "siphon.original.topic"),
                Some(&b"outbox.event.invoice"[..])
            );
            assert!(
                !s.is_settled(),
                "settled before its letter was acknowledged"
            );
            assert!(notes(&mut s)
                .iter()
                .any(|n| n.starts_with("RecordDeadLettered")));
            // A letter the dead-letter topic refuses ends the transfer.
            assert!(matches!(
                s.handle(
                    now,
                    failed(token, letter, RDKafkaErrorCode::PolicyViolation)
                ),
                Err(TransferStop::DeadLetterRefused(_))
            ));
        }
    }

    /// A transfer in Kafka transactions with `on_error`, from row `first_row` on, with the
    /// `suspects` of an earlier run, given rows `rows` (event numbers).
    fn transactional<'a>(
        on_error: &'a ErrorPolicy,
        router: &'a EventRouter,
        first_row: u64,
        suspects: Suspects<<Model as Vocabulary>::Fault, u64>,
    ) -> TransferSession<'a, Model> {
        let mut s = session(on_error, 10, Stamp::Snapshot(None)).with_suspects(suspects);
        s.settings.in_transaction = true;
        s.settings.first_row = first_row;
        s.next_row = first_row;
        s.begin_table(router, relation(), &HashSet::new())
            .expect("binds");
        s
    }

    fn actions(session: &mut TransferSession<'_, Model>) -> Vec<TransferAction> {
        std::iter::from_fn(|| session.poll_action()).collect()
    }

    #[test]
    fn in_a_kafka_transaction_a_refused_record_goes_alone_then_is_dead_lettered() {
        let router = router(Encoding::Json);
        let now = Instant::now();
        let on_error = dead_letters();
        let mut s = transactional(&on_error, &router, 0, Suspects::new());
        for event in 0..3 {
            s.handle(now, TransferInput::Row(row(event, event, false)))
                .expect("routed");
        }
        let mut sent = sends(&mut s);
        // Not taken at enqueue: the transaction is sound, the letter goes in it.
        let (token, record) = sent.remove(0);
        let too_large = SinkError::Kafka {
            operation: Operation::Enqueue,
            topic: record.topic.to_string(),
            code: RDKafkaErrorCode::MessageSizeTooLarge,
        };
        s.handle(
            now,
            TransferInput::SendRefused {
                token,
                record,
                error: too_large,
            },
        )
        .expect("dead-lettered");
        let (letter, dead) = sends(&mut s).remove(0);
        assert_eq!(&*dead.topic, DLQ);
        // Refused by the broker: the transaction is aborted with it, no letter follows; row 1
        // is a suspect, and the transfer stops once the records in flight reported.
        let (token, record) = sent.remove(0);
        s.handle(
            now,
            failed(token, record, RDKafkaErrorCode::MessageSizeTooLarge),
        )
        .expect("held until every record reported");
        assert!(sends(&mut s).is_empty());
        s.handle(now, acked(letter)).expect("one still in flight");
        assert!(matches!(
            s.handle(now, acked(sent.remove(0).0)),
            Err(TransferStop::Aborted { .. })
        ));
        let suspects = s.take_suspects();
        assert!(matches!(suspects.get(&1), Some(Suspect::Shared(_))));

        // Run again from row 1 (row 0 committed): the suspect goes alone, between commits.
        let mut s = transactional(&on_error, &router, 1, suspects.clone());
        s.handle(now, TransferInput::Row(row(1, 1, false)))
            .expect("parked");
        assert!(matches!(
            actions(&mut s)[..],
            [TransferAction::Commit {
                with_last_row: false
            }]
        ));
        assert!(!s.can_take_row(), "a row is taken while a suspect waits");
        s.handle(now, TransferInput::Committed).expect("committed");
        let alone = actions(&mut s);
        let [TransferAction::Send { token, record }, TransferAction::Commit {
            with_last_row: true,
        }] = &alone[..]
        else {
            panic!("the suspect alone, then its commit: {alone:?}");
        };
        assert_eq!(&*record.topic, "outbox.event.invoice");
        // Refused alone: guilty.
        assert!(matches!(
            s.handle(
                now,
                failed(
                    *token,
                    record.clone(),
                    RDKafkaErrorCode::MessageSizeTooLarge
                )
            ),
            Err(TransferStop::Aborted { .. })
        ));
        let guilty = s.take_suspects();
        assert!(matches!(guilty.get(&1), Some(Suspect::Alone(_))));
        // Next time its dead letter takes its place, in a transaction with what follows.
        let mut s = transactional(&on_error, &router, 1, guilty);
        for event in 1..3 {
            s.handle(now, TransferInput::Row(row(event, event, false)))
                .expect("routed");
        }
        let sent = sends(&mut s);
        let topics: Vec<&str> = sent.iter().map(|(_, r)| &*r.topic).collect();
        assert_eq!(topics.len(), 2);
        assert_eq!(topics[0], DLQ);
        assert_ne!(topics[1], DLQ);
        assert_eq!(
            header(&sent[0].1, "siphon.original.topic"),
            Some(&b"outbox.event.invoice"[..])
        );
        assert!(notes(&mut s)
            .iter()
            .any(|n| n.starts_with("RecordDeadLettered")));

        // Acknowledged alone instead: innocent, and the rows go on.
        let mut s = transactional(&on_error, &router, 1, suspects);
        s.handle(now, TransferInput::Row(row(1, 1, false)))
            .expect("parked");
        actions(&mut s);
        s.handle(now, TransferInput::Committed).expect("committed");
        let Some(TransferAction::Send { token, .. }) = s.poll_action() else {
            panic!("the suspect goes alone");
        };
        s.handle(now, acked(token)).expect("acknowledged");
        assert!(
            !s.can_take_row(),
            "a row is taken before the suspect committed"
        );
        s.handle(now, TransferInput::Committed).expect("committed");
        assert!(s.is_settled() && s.take_suspects().is_empty());

        // With on_error = "fail" the refusal stops it as outside a transaction.
        let mut s = transactional(&ErrorPolicy::Fail, &router, 0, Suspects::new());
        s.handle(now, TransferInput::Row(row(1, 1, false)))
            .expect("routed");
        let (token, record) = sends(&mut s).remove(0);
        assert!(matches!(
            s.handle(
                now,
                failed(token, record, RDKafkaErrorCode::MessageSizeTooLarge)
            ),
            Err(TransferStop::Refused { .. })
        ));
    }

    #[test]
    fn in_a_kafka_transaction_every_report_is_taken_before_the_transfer_stops() {
        let router = router(Encoding::Json);
        let now = Instant::now();
        let on_error = dead_letters();
        let mut s = transactional(&on_error, &router, 0, Suspects::new());
        for event in 0..3 {
            s.handle(now, TransferInput::Row(row(event, event, false)))
                .expect("routed");
        }
        let mut sent = sends(&mut s);
        // The producer purged a record it had not sent before the refusal reported.
        let (token, record) = sent.remove(0);
        s.handle(
            now,
            failed(token, record, RDKafkaErrorCode::MessageTimedOut),
        )
        .expect("held until every record reported");
        assert!(!s.can_take_row() && sends(&mut s).is_empty());
        let (token, record) = sent.remove(0);
        s.handle(
            now,
            failed(token, record, RDKafkaErrorCode::MessageSizeTooLarge),
        )
        .expect("held until every record reported");
        let (token, _) = sent.remove(0);
        assert!(matches!(
            s.handle(now, acked(token)),
            Err(TransferStop::Aborted { .. })
        ));
        assert!(matches!(
            s.take_suspects().get(&1),
            Some(Suspect::Shared(_))
        ));
    }

    #[test]
    fn only_the_records_own_fault_is_dead_lettered() {
        let on_error = dead_letters();
        let router = router(Encoding::Json);
        let now = Instant::now();
        let mut s = begun(&on_error, &router);
        for event in 0..3 {
            s.handle(now, TransferInput::Row(row(event, event, false)))
                .expect("routed");
        }
        let mut sent = sends(&mut s);
        let (token, record) = sent.remove(0);
        // Not taken at enqueue for its size: dead-lettered.
        let too_large = SinkError::Kafka {
            operation: Operation::Enqueue,
            topic: record.topic.to_string(),
            code: RDKafkaErrorCode::MessageSizeTooLarge,
        };
        s.handle(
            now,
            TransferInput::SendRefused {
                token,
                record,
                error: too_large,
            },
        )
        .expect("dead-lettered");
        assert_eq!(&*sends(&mut s)[0].1.topic, DLQ);
        // A failed producer: the transfer stops and resumes from its progress.
        let (token, record) = sent.remove(0);
        assert!(matches!(
            s.handle(
                now,
                failed(token, record, RDKafkaErrorCode::MessageTimedOut)
            ),
            Err(TransferStop::Undelivered { .. })
        ));
        // Refused until the operator acts: no dead letter cures it.
        let (token, record) = sent.remove(0);
        assert!(matches!(
            s.handle(now, failed(token, record, RDKafkaErrorCode::State)),
            Err(TransferStop::Refused { .. })
        ));
    }

    #[test]
    fn an_unroutable_table_dead_letters_its_rows_or_stops_the_transfer() {
        let router = router(Encoding::Json);
        let mut without_payload = (*relation()).clone();
        without_payload.columns.pop();
        let without_payload = Arc::new(without_payload);
        let stopped: TransferStop<Model> = session(&ErrorPolicy::Fail, 10, Stamp::Snapshot(None))
            .begin_table(&router, Arc::clone(&without_payload), &HashSet::new())
            .expect_err("the table does not fit the router");
        assert!(matches!(stopped, TransferStop::Unbindable(_)));

        let on_error = dead_letters();
        let mut s = session(&on_error, 10, Stamp::Snapshot(None));
        s.begin_table(&router, without_payload, &HashSet::new())
            .expect("its rows are dead-lettered");
        s.handle(Instant::now(), TransferInput::Row(row(7, 7, false)))
            .expect("dead-lettered");
        let (_, letter) = sends(&mut s).remove(0);
        assert_eq!(&*letter.topic, DLQ);
        assert_eq!(header(&letter, "siphon.source.lsn"), Some(&b"0/100"[..]));
        let noted = notes(&mut s);
        assert!(noted[0].starts_with("TableUnroutable"), "{noted:?}");
        assert!(noted[1].starts_with("RowDeadLettered"), "{noted:?}");
    }

    #[test]
    fn a_payload_that_misfits_its_registered_schema_follows_on_error() {
        let router = router(Encoding::Registered(RegistrySchemaKind::Avro));
        let now = Instant::now();
        for dead_lettering in [true, false] {
            let policy = on_error(dead_lettering);
            let mut s = begun(&policy, &router);
            s.handle(now, TransferInput::Row(row(1, 1, false)))
                .expect("asks");
            let Some(TransferAction::Ask(Ask::LatestSchema { .. })) = s.poll_action() else {
                panic!("the subject's schema is asked first");
            };
            assert!(!s.can_take_row(), "a row is taken while one waits");
            let schema = Answered::LatestSchema(Ok((
                2,
                RegistrySchemaKind::Avro,
                Arc::from(REGISTERED_SCHEMA),
            )));
            s.handle(now, TransferInput::Answer(schema))
                .expect("written");
            let (_, record) = sends(&mut s).remove(0);
            assert_eq!(
                record.value.as_deref().map(|v| v[..5].to_vec()),
                Some(vec![0, 0, 0, 0, 2])
            );
            // The poison field is not in the registered schema.
            let misfit = s.handle(now, TransferInput::Row(row(2, 1, true)));
            if dead_lettering {
                misfit.expect("dead-lettered");
                assert_eq!(&*sends(&mut s)[0].1.topic, DLQ);
                assert!(notes(&mut s).iter().any(|n| n == "SchemaMisfit"));
            } else {
                assert!(matches!(
                    misfit,
                    Err(TransferStop::Registry(Refusal::Misfit { .. }))
                ));
            }
        }
    }
}
