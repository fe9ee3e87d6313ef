//! Deterministic simulation of the session core against a model of PostgreSQL and a Kafka
//! producer with gap-less idempotence.
//!
//! Each seed draws an interleaving of source events, broker writes, delivery reports, producer
//! failures (timeouts that may or may not have persisted the batch), refused batches (a
//! "poison" record fails every record of its batch and, gap-less, the producer), lookups
//! answered late, reconnects and shutdowns. After every step it checks:
//! - the confirmed position never passes a transaction with a record that is not written (or
//!   dead-lettered);
//! - per partition and key, first deliveries are in commit order, across producer replacement
//!   and sessions;
//! - memory is bounded by the window (records in flight, transactions kept, records held);
//! - a producer is replaced only once all its records reported (none waits for a topic).
//!
//! Records go through the topic gate as in the driver: a record for a topic the broker does not
//! have waits, with every record after it, while the topic is created; a creation may fail for
//! now (the record it was for is not taken, the others come back), and a purge hands the
//! waiting records back. The delivery deadline (5 s) is overrun now and then by the model's
//! time jumps, purging and replacing the producer.
//!
//! At the end, with faults stopped, every event must have arrived (poison ones in the
//! dead-letter topic, no innocent one there) and the slot must be confirmed to the end.
//!
//! `SIPHON_SIM_SEEDS=N` runs more seeds; `SIPHON_SIM_SEED=S` runs one, printing its trace.

use super::core::{Action, Answer, CoreSettings, Input, Lookup, Now, SessionCore};
use super::{ErrorPolicy, NonTransactionalPolicy, RoutedKind, Routers};
use crate::dead_letter::DeadLetters;
use crate::error::PipelineError;
use crate::telemetry::Metrics;
use bytes::Bytes;
use pgoutput::{Column, Lsn, Relation, RelationColumn, ReplicaIdentity, Text, TupleData};
use siphon_core::topic_gate::{Creation, Step, TopicGate};
use siphon_kafka_sink::RDKafkaErrorCode;
use siphon_kafka_sink::{
    Delivered, Delivery, DeliveryError, DeliveryFailure, Operation, SinkError,
};
use siphon_router::{EventRouter, Format, RoutedRecord, RouterOptions};
use siphon_source::{RowChange, SourceEvent, TableName};
use siphon_tests::rng::SplitMix64 as Rng;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

const PARTITIONS: usize = 3;
const KEYS: u64 = 5;
const WINDOW: usize = 8;
const DEAD_LETTER_TOPIC: &str = "dead.letters";

/// One committed transaction of the modelled database.
#[derive(Debug, Clone)]
struct Txn {
    begin_lsn: Lsn,
    end_lsn: Lsn,
    /// Inserted events: (event number, key, poison); plus deletes of earlier rows.
    events: Vec<(u64, u64, bool)>,
    deletes: usize,
}

fn relation() -> Arc<Relation> {
    let column = |name: &'static str, type_oid: u32| RelationColumn {
        flags: 0,
        name: Text::from_static(name),
        type_oid,
        type_modifier: -1,
    };
    Arc::new(Relation {
        xid: None,
        id: 16_400,
        namespace: Text::from_static("public"),
        name: Text::from_static("outbox"),
        replica_identity: ReplicaIdentity::Default,
        columns: vec![
            column("id", 2950),
            column("aggregatetype", 1043),
            column("aggregateid", 1043),
            column("type", 1043),
            column("payload", 3802),
        ],
    })
}

fn row(event: u64, key: u64, poison: bool) -> TupleData {
    let text = |s: String| Column::Text(Bytes::from(s));
    TupleData {
        columns: vec![
            text(format!("00000000-0000-0000-0000-{event:012x}")),
            // Three aggregate types, so three topics to create as their first records come.
            text(["order", "invoice", "payment"][key as usize % 3].to_owned()),
            text(format!("k{key}")),
            text("Created".to_owned()),
            text(if poison {
                format!("{{\"n\":{event},\"poison\":\"POISON\"}}")
            } else {
                format!("{{\"n\":{event}}}")
            }),
        ],
    }
}

fn event_of(record: &RoutedRecord) -> Option<u64> {
    let id = record.headers.iter().find(|h| &*h.name == "id")?;
    let text = std::str::from_utf8(id.value.as_deref()?).ok()?;
    u64::from_str_radix(text.rsplit('-').next()?, 16).ok()
}

fn is_poison(record: &RoutedRecord) -> bool {
    record.topic != DEAD_LETTER_TOPIC
        && record
            .value
            .as_deref()
            .is_some_and(|v| v.windows(6).any(|w| w == b"POISON"))
}

fn partition_of(record: &RoutedRecord) -> usize {
    let key = record.key.as_deref().unwrap_or_default();
    key.iter().map(|&b| b as usize).sum::<usize>() % PARTITIONS
}

/// A record with the modelled producer.
struct Queued {
    token: usize,
    record: RoutedRecord,
}

/// The modelled broker and producer.
#[derive(Default)]
struct Broker {
    /// Records handed to the current producer and not yet written or failed, per partition.
    unwritten: Vec<VecDeque<Queued>>,
    /// Reports not yet delivered to the session, per partition (in order, as librdkafka).
    reports: Vec<VecDeque<Delivery>>,
    /// The producer failed (gap-less): it writes nothing more.
    failed: bool,
    generation: u64,
    /// What reached each partition: (topic, key, event).
    log: Vec<Vec<(String, Vec<u8>, u64)>>,
    /// Events that reached the dead-letter topic.
    dead: BTreeSet<u64>,
    /// Events written to their own topic.
    written: BTreeSet<u64>,
    /// The `siphon.position` of each record written, per partition, in write order.
    positions: Vec<Vec<(String, u64, String)>>,
    /// The topics that exist.
    topics: HashSet<String>,
    /// The topic creation running (its id and topic).
    creation: Option<(u64, String)>,
    /// A topic creation failed for now since the producer was put in place.
    creation_failed: bool,
}

impl Broker {
    fn new() -> Self {
        Broker {
            unwritten: (0..PARTITIONS).map(|_| VecDeque::new()).collect(),
            reports: (0..PARTITIONS).map(|_| VecDeque::new()).collect(),
            log: vec![Vec::new(); PARTITIONS],
            positions: vec![Vec::new(); PARTITIONS],
            ..Broker::default()
        }
    }

    fn outstanding(&self) -> usize {
        self.unwritten.iter().map(VecDeque::len).sum::<usize>()
            + self.reports.iter().map(VecDeque::len).sum::<usize>()
    }

    fn report(&mut self, p: usize, q: Queued, result: Result<(), RDKafkaErrorCode>) {
        self.reports[p].push_back(Delivery {
            token: q.token,
            generation: self.generation,
            result: match result {
                Ok(()) => Ok(Delivered {
                    partition: p as i32,
                    offset: 0,
                }),
                Err(code) => Err(Box::new(DeliveryFailure {
                    error: DeliveryError::from_code(&q.record.topic, code),
                    record: q.record,
                })),
            },
        });
    }

    fn persist(&mut self, p: usize, record: &RoutedRecord) {
        let Some(event) = event_of(record) else {
            return;
        };
        let key = record.key.as_deref().unwrap_or_default().to_vec();
        self.log[p].push((record.topic.clone(), key, event));
        if let Some(position) = record
            .headers
            .iter()
            .find(|h| &*h.name == super::position::POSITION_HEADER)
            .and_then(|h| h.value.as_deref())
        {
            self.positions[p].push((
                record.topic.clone(),
                event,
                String::from_utf8_lossy(position).into_owned(),
            ));
        }
        if record.topic == DEAD_LETTER_TOPIC {
            self.dead.insert(event);
        } else {
            self.written.insert(event);
        }
    }

    /// Fails every record the producer still holds (purge, or a failed gap-less producer).
    fn fail_all(&mut self, code: RDKafkaErrorCode) {
        for p in 0..PARTITIONS {
            while let Some(q) = self.unwritten[p].pop_front() {
                self.report(p, q, Err(code));
            }
        }
    }

    /// Writes (or fails) the next batch of partition `p`.
    fn write_batch(&mut self, rng: &mut Rng, p: usize, faults: bool, trace: &mut Vec<String>) {
        let n = (1 + rng.below(3)).min(self.unwritten[p].len());
        let batch: Vec<Queued> = self.unwritten[p].drain(..n).collect();
        if self.failed {
            for q in batch {
                self.report(p, q, Err(RDKafkaErrorCode::Fatal));
            }
            return;
        }
        if batch.iter().any(|q| is_poison(&q.record)) {
            trace.push(format!("broker: batch of {n} refused on p{p}"));
            for q in batch {
                self.report(p, q, Err(RDKafkaErrorCode::PolicyViolation));
            }
            self.failed = true;
            self.fail_all(RDKafkaErrorCode::GaplessGuarantee);
            return;
        }
        if faults && rng.chance(3) {
            let persisted = rng.chance(50);
            trace.push(format!(
                "broker: batch of {n} timed out on p{p} (persisted: {persisted})"
            ));
            for q in batch {
                if persisted {
                    self.persist(p, &q.record);
                }
                self.report(p, q, Err(RDKafkaErrorCode::MessageTimedOut));
            }
            self.failed = true;
            self.fail_all(RDKafkaErrorCode::GaplessGuarantee);
            return;
        }
        for q in batch {
            self.persist(p, &q.record);
            self.report(p, q, Ok(()));
        }
    }
}

struct World {
    rng: Rng,
    trace: Vec<String>,
    txns: Vec<Txn>,
    /// Event -> end LSN of its transaction.
    end_of: HashMap<u64, Lsn>,
    poison: HashSet<u64>,
    broker: Broker,
    confirmed: Lsn,
    now: Instant,
    wall: SystemTime,
    /// How often each path of interest was taken.
    seen: BTreeMap<&'static str, u64>,
}

impl World {
    fn new(seed: u64, txn_count: usize) -> Self {
        let mut rng = Rng(seed);
        let mut txns = Vec::new();
        let mut lsn = 1_000u64;
        let mut event = 0u64;
        let mut end_of = HashMap::new();
        let mut poison = HashSet::new();
        for _ in 0..txn_count {
            let begin_lsn = Lsn(lsn);
            let mut events = Vec::new();
            for _ in 0..rng.below(4) {
                event += 1;
                let is_poison = rng.chance(3);
                if is_poison {
                    poison.insert(event);
                }
                events.push((event, rng.below(KEYS as usize) as u64, is_poison));
            }
            let deletes = rng.below(2);
            lsn += 100 + 10 * (events.len() + deletes) as u64;
            let end_lsn = Lsn(lsn);
            for &(e, _, _) in &events {
                end_of.insert(e, end_lsn);
            }
            txns.push(Txn {
                begin_lsn,
                end_lsn,
                events,
                deletes,
            });
            lsn += 10;
        }
        World {
            rng,
            trace: Vec::new(),
            txns,
            end_of,
            poison,
            broker: Broker::new(),
            confirmed: Lsn(0),
            now: Instant::now(),
            wall: SystemTime::now(),
            seen: BTreeMap::new(),
        }
    }

    fn saw(&mut self, what: &'static str) {
        *self.seen.entry(what).or_default() += 1;
    }

    fn now(&self) -> Now {
        Now {
            instant: self.now,
            wall: self.wall,
        }
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
        self.wall += by;
    }

    /// The source events of a session resuming after `from`.
    fn source_from(&self, from: Lsn) -> VecDeque<SourceEvent> {
        let relation = relation();
        let mut events = VecDeque::new();
        events.push_back(SourceEvent::Relation(Arc::clone(&relation)));
        for txn in self.txns.iter().filter(|t| t.end_lsn > from) {
            events.push_back(SourceEvent::Begin {
                xid: 1,
                final_lsn: txn.begin_lsn,
                commit_time_us: 0,
            });
            for (i, &(event, key, poison)) in txn.events.iter().enumerate() {
                events.push_back(SourceEvent::Change {
                    relation: Arc::clone(&relation),
                    change: RowChange::Insert(row(event, key, poison)),
                    lsn: Lsn(txn.begin_lsn.0 + 10 * (i as u64 + 1)),
                });
            }
            for _ in 0..txn.deletes {
                events.push_back(SourceEvent::Change {
                    relation: Arc::clone(&relation),
                    change: RowChange::Delete(pgoutput::OldTuple::Key(row(0, 0, false))),
                    lsn: txn.end_lsn,
                });
            }
            events.push_back(SourceEvent::Commit {
                commit_lsn: txn.end_lsn,
                end_lsn: txn.end_lsn,
                commit_time_us: 0,
            });
            events.push_back(SourceEvent::Idle {
                wal_end: Lsn(txn.end_lsn.0 + 5),
            });
        }
        events
    }

    fn check_confirm(&mut self, lsn: Lsn) -> Result<(), String> {
        if lsn < self.confirmed {
            return Err(format!(
                "confirmed position moved back: {lsn} < {}",
                self.confirmed
            ));
        }
        self.confirmed = lsn;
        for (&event, &end) in &self.end_of {
            if end <= lsn
                && !self.broker.written.contains(&event)
                && !self.broker.dead.contains(&event)
            {
                return Err(format!(
                    "confirmed {lsn} passes event {event} (transaction ending {end}) that is not written"
                ));
            }
        }
        Ok(())
    }

    /// Per topic and partition, first deliveries carry increasing positions and a repeat the
    /// position of its first delivery (what a consumer dropping repeats relies on).
    fn check_positions(&self) -> Result<(), String> {
        for (p, log) in self.broker.positions.iter().enumerate() {
            let mut last: HashMap<&str, &str> = HashMap::new();
            let mut first: HashMap<u64, &str> = HashMap::new();
            for (topic, event, position) in log {
                match first.get(event) {
                    Some(earlier) if earlier != position => {
                        return Err(format!(
                            "p{p} {topic}: event {event} repeated at {position}, first at {earlier}"
                        ))
                    }
                    Some(_) => {}
                    None => {
                        if let Some(previous) = last.get(topic.as_str()) {
                            if position.as_str() <= *previous {
                                return Err(format!(
                                    "p{p} {topic}: event {event} first delivered at {position}, after {previous}"
                                ));
                            }
                        }
                        last.insert(topic, position);
                        first.insert(*event, position);
                    }
                }
            }
        }
        Ok(())
    }

    fn check_order(&self) -> Result<(), String> {
        for (p, log) in self.broker.log.iter().enumerate() {
            type FirstDeliveries = (u64, HashSet<u64>);
            let mut seen: HashMap<(&str, &[u8]), FirstDeliveries> = HashMap::new();
            for (topic, key, event) in log {
                if topic == DEAD_LETTER_TOPIC {
                    continue;
                }
                let (last, firsts) = seen.entry((topic, key)).or_default();
                if firsts.insert(*event) {
                    if *event < *last {
                        return Err(format!(
                            "p{p} key {}: first delivery of event {event} after event {last}",
                            String::from_utf8_lossy(key)
                        ));
                    }
                    *last = *event;
                }
            }
        }
        Ok(())
    }
}

/// A core over the modelled outbox table, with a window of [`WINDOW`] records.
fn session_core<'a>(
    router: &'a Routers,
    prefixes: &'a HashSet<String>,
    on_error: &'a ErrorPolicy,
    shutdown_timeout: Duration,
    metrics: Arc<Metrics>,
    start: Lsn,
) -> SessionCore<'a> {
    SessionCore::new(
        CoreSettings {
            router,
            message_prefixes: prefixes,
            database_encoding: Default::default(),
            non_transactional: NonTransactionalPolicy::Error,
            on_error,
            tables: [TableName {
                schema: "public".into(),
                name: "outbox".into(),
            }]
            .into_iter()
            .collect(),
            max_in_flight_records: WINDOW,
            max_in_flight_bytes: usize::MAX,
            shutdown_timeout,
            // Short enough that stuck reports (the model's time jumps up to 2 s a step) overrun
            // it now and then: a purge and replacement forced by the session itself.
            delivery_timeout: Some(Duration::from_secs(5)),
            replacement_backoff: (Duration::from_millis(200), Duration::from_secs(30)),
            position_headers: Some(super::position::PositionHeaders::new(Some("1"), "s")),
            transactions: None,
            suspects: Default::default(),
        },
        metrics,
        start,
    )
}

/// Hands `record` to the modelled producer (one that failed does not take it).
fn send(w: &mut World, core: &mut SessionCore<'_>, token: usize, record: RoutedRecord) {
    w.trace.push(format!(
        "send #{token} event {:?} {}",
        event_of(&record),
        record.topic
    ));
    if w.broker.failed {
        let record_topic = record.topic.clone();
        core.handle(
            w.now(),
            Input::SendRefused {
                token,
                record,
                error: SinkError::Kafka {
                    operation: Operation::Enqueue,
                    topic: record_topic,
                    code: RDKafkaErrorCode::Fatal,
                },
            },
        );
    } else {
        let p = partition_of(&record);
        w.broker.unwritten[p].push_back(Queued { token, record });
    }
}

/// Carries out the topic gate's steps, as the driver does.
fn carry_out(
    w: &mut World,
    core: &mut SessionCore<'_>,
    gate: &TopicGate<RoutedKind>,
    steps: Vec<Step<RoutedRecord, SinkError>>,
) {
    for step in steps {
        match step {
            Step::Send { token, record } => send(w, core, token, record),
            Step::Create { id, topic } => {
                w.trace.push(format!("create topic {topic} (#{id})"));
                w.saw("topic creation");
                w.broker.creation = Some((id, topic));
            }
            Step::Refuse {
                token,
                record,
                error,
            } => {
                w.trace.push(format!("#{token} not taken: {error}"));
                core.handle(
                    w.now(),
                    Input::SendRefused {
                        token,
                        record,
                        error,
                    },
                );
            }
            Step::HandBack { token, record } => {
                w.trace.push(format!("#{token} handed back"));
                w.saw("handed back by a purge");
                core.handle(w.now(), Input::Purged { token, record });
            }
        }
    }
    // A creation the gate no longer waits for is stopped.
    if w.broker.creation.as_ref().map(|(id, _)| *id) != gate.creating() {
        w.broker.creation = None;
    }
}

/// The outcome of one seed.
struct Outcome {
    error: Option<PipelineError>,
    /// How often each path of interest was taken.
    seen: BTreeMap<&'static str, u64>,
}

fn run_seed(
    seed: u64,
    fail_on_poison: bool,
) -> Result<(Outcome, Vec<String>), (String, Vec<String>)> {
    let txn_count = 40;
    let mut w = World::new(seed, txn_count);
    let router = Routers::new(
        EventRouter::new(
            RouterOptions::from_map(&BTreeMap::new()).map_err(|e| (e.to_string(), Vec::new()))?,
            Format::default(),
        ),
        HashMap::new(),
    );
    let prefixes = HashSet::new();
    let policy = if fail_on_poison {
        ErrorPolicy::Fail
    } else {
        ErrorPolicy::DeadLetter(DeadLetters::new(DEAD_LETTER_TOPIC.to_owned(), 1_000_000))
    };
    let metrics = Arc::new(Metrics::new());
    let last_end = w.txns.last().map_or(Lsn(0), |t| t.end_lsn);
    let mut resume = Lsn(0);
    let mut sessions = 0;
    let mut outcome_error = None;
    let fault_steps = 1_500;
    let mut step = 0usize;
    'sessions: loop {
        sessions += 1;
        if sessions > 40 {
            return Err(("more than 40 sessions: no progress".into(), w.trace));
        }
        w.trace.push(format!("session {sessions} from {resume}"));
        let mut source = w.source_from(resume);
        let mut core = session_core(
            &router,
            &prefixes,
            &policy,
            Duration::from_secs(5),
            Arc::clone(&metrics),
            resume,
        );
        w.broker.failed = false;
        w.broker.generation += 1;
        w.broker.creation = None;
        w.broker.creation_failed = false;
        let mut gate = TopicGate::<RoutedKind>::default();
        let mut lookups: VecDeque<Lookup> = VecDeque::new();
        let mut stopping = false;
        loop {
            step += 1;
            if step > 60_000 {
                return Err(("no progress after 60,000 steps".into(), w.trace));
            }
            let faults = step < fault_steps;
            // Execute what the core asked for.
            while let Some(action) = core.poll_action() {
                match action {
                    Action::Send { token, record } => {
                        let topics = &w.broker.topics;
                        let step = gate.offer(token, record, |topic| !topics.contains(topic));
                        carry_out(&mut w, &mut core, &gate, step.into_iter().collect());
                    }
                    Action::Confirm(lsn) => {
                        w.trace.push(format!("confirm {lsn}"));
                        w.check_confirm(lsn).map_err(|e| (e, w.trace.clone()))?;
                    }
                    Action::Lookup(lookup) => lookups.push_back(lookup),
                    Action::ForgetRelation(_) => {}
                    Action::BeginTransaction | Action::Commit(_) => {
                        return Err((
                            "a Kafka transaction in an at-least-once session".into(),
                            w.trace,
                        ))
                    }
                    Action::PurgeProducer => {
                        w.trace.push("purge".into());
                        w.saw("purge");
                        if !w.broker.failed && !w.broker.creation_failed {
                            // Nothing failed: the session's own delivery deadline purges.
                            w.saw("delivery deadline overrun");
                        }
                        w.broker.fail_all(RDKafkaErrorCode::PurgeInflight);
                        let steps = gate.purge();
                        carry_out(&mut w, &mut core, &gate, steps);
                    }
                    Action::ReplaceProducer => {
                        w.trace.push("replace producer".into());
                        w.saw("producer replaced");
                        w.broker.creation_failed = false;
                        if gate.creating().is_some() {
                            return Err((
                                "producer replaced with records waiting for a topic".into(),
                                w.trace,
                            ));
                        }
                        if w.broker.outstanding() > 0 {
                            return Err((
                                format!(
                                    "producer replaced with {} records not reported",
                                    w.broker.outstanding()
                                ),
                                w.trace,
                            ));
                        }
                        w.broker.failed = false;
                        w.broker.generation += 1;
                    }
                    Action::Finish(result) => {
                        w.trace.push(format!("finish {result:?}"));
                        resume = resume.max(core.watermark());
                        // The old producer is gone with its session.
                        for p in 0..PARTITIONS {
                            w.broker.unwritten[p].clear();
                            w.broker.reports[p].clear();
                        }
                        match result {
                            Err(e) if !e.is_transient() => {
                                outcome_error = Some(e);
                                break 'sessions;
                            }
                            _ if resume >= last_end => break 'sessions,
                            _ => continue 'sessions,
                        }
                    }
                }
            }
            // Bounds.
            let (records, _) = core.in_flight();
            if records > WINDOW + 2 {
                return Err((
                    format!("{records} records in flight, window {WINDOW}"),
                    w.trace,
                ));
            }
            if core.pending_transactions() > records + core.abandoned() as usize + 1 {
                return Err((
                    format!(
                        "{} transactions kept for {records} records in flight",
                        core.pending_transactions()
                    ),
                    w.trace,
                ));
            }
            if step.is_multiple_of(64) {
                w.check_order().map_err(|e| (e, w.trace.clone()))?;
                w.check_positions().map_err(|e| (e, w.trace.clone()))?;
                w.check_positions().map_err(|e| (e, w.trace.clone()))?;
            }
            if core.watermark() >= last_end && !stopping && source.is_empty() {
                stopping = true;
                core.handle(w.now(), Input::Shutdown);
                continue;
            }
            // Choose what happens next.
            let choice = w.rng.below(100);
            let partitions_with_work: Vec<usize> = (0..PARTITIONS)
                .filter(|&p| !w.broker.unwritten[p].is_empty())
                .collect();
            let partitions_with_reports: Vec<usize> = (0..PARTITIONS)
                .filter(|&p| !w.broker.reports[p].is_empty())
                .collect();
            if choice < 30 && core.can_read() && !source.is_empty() {
                let event = source
                    .pop_front()
                    .ok_or_else(|| ("empty".to_owned(), Vec::new()))?;
                core.handle(w.now(), Input::Source(event));
            } else if choice < 55 && !partitions_with_work.is_empty() {
                let p = partitions_with_work[w.rng.below(partitions_with_work.len())];
                w.broker.write_batch(&mut w.rng, p, faults, &mut w.trace);
            } else if choice < 85 && !partitions_with_reports.is_empty() {
                let p = partitions_with_reports[w.rng.below(partitions_with_reports.len())];
                if let Some(report) = w.broker.reports[p].pop_front() {
                    w.trace.push(format!(
                        "report #{} {}",
                        report.token,
                        match &report.result {
                            Ok(_) => "ok".to_owned(),
                            Err(f) => format!("failed: {}", f.error),
                        }
                    ));
                    core.handle(w.now(), Input::Delivery(report));
                }
            } else if choice < 90 && w.broker.creation.is_some() && w.rng.chance(50) {
                let Some((id, topic)) = w.broker.creation.take() else {
                    continue;
                };
                let outcome = if faults && w.rng.chance(25) {
                    w.trace.push(format!("creation of {topic} failed for now"));
                    w.saw("topic creation failed for now");
                    w.broker.creation_failed = true;
                    Creation::FailedForNow(SinkError::Kafka {
                        operation: Operation::CreateTopic,
                        topic: topic.to_owned(),
                        code: RDKafkaErrorCode::OperationTimedOut,
                    })
                } else {
                    w.trace.push(format!("{topic} created"));
                    w.broker.topics.insert(topic);
                    Creation::Created
                };
                let topics = &w.broker.topics;
                let steps = gate.created(id, outcome, |topic| !topics.contains(topic));
                carry_out(&mut w, &mut core, &gate, steps);
            } else if choice < 90 && !lookups.is_empty() {
                let answer = match lookups.pop_front() {
                    Some(Lookup::NotNullColumns(relation)) => Some(Answer::NotNullColumns {
                        relation,
                        columns: Ok(Default::default()),
                    }),
                    Some(Lookup::OutboxRelation(relation)) => Some(Answer::OutboxRelation {
                        relation,
                        outbox: Ok(None),
                    }),
                    None => None,
                };
                if let Some(answer) = answer {
                    core.handle(w.now(), Input::Answer(answer));
                }
            } else if faults && choice == 90 && w.rng.chance(20) && !stopping {
                w.trace.push("source connection lost".into());
                stopping = true;
                core.handle(w.now(), Input::SourceFailed(PipelineError::StreamEnded));
            } else if faults && choice == 91 && w.rng.chance(10) && !stopping {
                w.trace.push("shutdown".into());
                stopping = true;
                core.handle(w.now(), Input::Shutdown);
            } else {
                let cap = Duration::from_millis(1 + w.rng.below(2_000) as u64);
                let wait = match core.next_timeout() {
                    Some(at) if at > w.now => at - w.now,
                    _ => Duration::from_millis(1 + w.rng.below(50) as u64),
                };
                w.advance(wait.min(cap));
                if w.trace.last().is_none_or(|l| !l.starts_with("tick")) {
                    w.trace.push(format!(
                        "tick (held {}, in flight {:?}, can read {}, timer {:?})",
                        core.held(),
                        core.in_flight(),
                        core.can_read(),
                        core.next_timeout()
                            .map(|t| t.saturating_duration_since(w.now))
                    ));
                }
                core.handle(w.now(), Input::Tick);
            }
        }
    }
    w.check_order().map_err(|e| (e, w.trace.clone()))?;
    // Everything arrived: each innocent event in its topic, each poison one dead-lettered.
    if outcome_error.is_none() {
        for &event in w.end_of.keys() {
            let poison = w.poison.contains(&event);
            if poison && !w.broker.dead.contains(&event) {
                return Err((format!("poison event {event} not dead-lettered"), w.trace));
            }
            if !poison && !w.broker.written.contains(&event) {
                return Err((format!("event {event} never written"), w.trace));
            }
            if !poison && w.broker.dead.contains(&event) {
                return Err((format!("innocent event {event} dead-lettered"), w.trace));
            }
        }
        if w.confirmed < last_end && resume < last_end {
            return Err((
                format!("stopped at {} before the end {last_end}", w.confirmed),
                w.trace,
            ));
        }
    }
    Ok((
        Outcome {
            error: outcome_error,
            seen: std::mem::take(&mut w.seen),
        },
        w.trace,
    ))
}

fn seeds() -> Vec<u64> {
    if let Some(seed) = std::env::var("SIPHON_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![seed];
    }
    let n = std::env::var("SIPHON_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400u64);
    (0..n).collect()
}

fn fail(seed: u64, mode: &str, reason: &str, trace: &[String]) -> ! {
    let tail = trace.len().saturating_sub(150);
    panic!(
        "seed {seed} ({mode}): {reason}\nreproduce: SIPHON_SIM_SEED={seed} cargo test -p siphon simulation\ntrace (last {} steps):\n{}",
        trace.len() - tail,
        trace[tail..].join("\n")
    );
}

#[test]
fn simulation_dead_letter_policy_keeps_every_promise() {
    let seeds = seeds();
    let mut seen: BTreeMap<&'static str, u64> = BTreeMap::new();
    for &seed in &seeds {
        match run_seed(seed, false) {
            Ok((outcome, trace)) => {
                if let Some(e) = outcome.error {
                    fail(seed, "dead-letter", &format!("stopped: {e}"), &trace);
                }
                if seeds.len() == 1 {
                    eprintln!("{}", trace.join("\n"));
                }
                for (what, n) in outcome.seen {
                    *seen.entry(what).or_default() += n;
                }
            }
            Err((reason, trace)) => fail(seed, "dead-letter", &reason, &trace),
        }
    }
    // The seeds together take every path the simulation is there to check.
    if seeds.len() >= 100 {
        for what in [
            "topic creation",
            "topic creation failed for now",
            "handed back by a purge",
            "purge",
            "producer replaced",
            "delivery deadline overrun",
        ] {
            assert!(
                seen.get(what).is_some_and(|&n| n > 0),
                "never seen: {what} ({seen:?})"
            );
        }
    }
}

#[test]
fn simulation_fail_policy_stops_on_a_refused_record_without_loss() {
    for seed in seeds() {
        match run_seed(seed, true) {
            Ok((outcome, trace)) => {
                let any_poison = World::new(seed, 40).poison.iter().next().is_some();
                match outcome.error {
                    Some(e) if !e.is_transient() => {}
                    Some(other) => fail(seed, "fail", &format!("unexpected error {other}"), &trace),
                    None if any_poison => fail(
                        seed,
                        "fail",
                        "a refused record did not stop the session",
                        &trace,
                    ),
                    None => {}
                }
            }
            Err((reason, trace)) => fail(seed, "fail", &reason, &trace),
        }
    }
}

/// A record the producer refused to take (enqueue failed) is not waited for at shutdown: the
/// stop is immediate, not the whole shutdown timeout later, and the record's transaction is not
/// confirmed.
#[test]
fn a_record_the_producer_did_not_take_does_not_hold_up_shutdown() {
    let router = Routers::new(
        EventRouter::new(
            RouterOptions::from_map(&BTreeMap::new()).expect("default options"),
            Format::default(),
        ),
        HashMap::new(),
    );
    let prefixes = HashSet::new();
    let metrics = Arc::new(Metrics::new());
    let mut core = session_core(
        &router,
        &prefixes,
        &ErrorPolicy::Fail,
        Duration::from_secs(30),
        metrics,
        Lsn(0),
    );
    let start = Instant::now();
    let now = Now {
        instant: start,
        wall: SystemTime::now(),
    };
    core.handle(now, Input::Source(SourceEvent::Relation(relation())));
    let Some(Action::Lookup(Lookup::NotNullColumns(relation))) = core.poll_action() else {
        panic!("a lookup of the outbox table's columns");
    };
    core.handle(
        now,
        Input::Answer(Answer::NotNullColumns {
            relation: Arc::clone(&relation),
            columns: Ok(Default::default()),
        }),
    );
    for event in [
        SourceEvent::Begin {
            xid: 1,
            final_lsn: Lsn(100),
            commit_time_us: 0,
        },
        SourceEvent::Change {
            relation,
            change: RowChange::Insert(row(1, 1, false)),
            lsn: Lsn(90),
        },
        SourceEvent::Commit {
            commit_lsn: Lsn(100),
            end_lsn: Lsn(110),
            commit_time_us: 0,
        },
    ] {
        core.handle(now, Input::Source(event));
    }
    // The producer does not take the record, twice: the first time the producer is replaced at
    // once and the record sent again; the second time the replacement waits (no delivery in
    // between), with the record held.
    for attempt in 0..2 {
        let send = std::iter::from_fn(|| core.poll_action()).find_map(|action| match action {
            Action::Send { token, record } => Some((token, record)),
            _ => None,
        });
        let Some((token, record)) = send else {
            panic!("the record is sent (attempt {attempt})");
        };
        core.handle(
            now,
            Input::SendRefused {
                token,
                error: SinkError::Kafka {
                    operation: Operation::Enqueue,
                    topic: record.topic.clone(),
                    code: RDKafkaErrorCode::AllBrokersDown,
                },
                record,
            },
        );
    }
    assert_eq!(core.held(), 1, "held while the replacement backs off");
    core.handle(now, Input::Shutdown);
    let mut finished = false;
    while let Some(action) = core.poll_action() {
        match action {
            Action::Finish(result) => {
                assert!(result.is_ok());
                finished = true;
            }
            Action::Confirm(lsn) => panic!("confirmed {lsn} past a record never delivered"),
            _ => {}
        }
    }
    assert!(
        finished,
        "the stop does not wait for a record the producer never took"
    );
    assert_eq!(core.watermark(), Lsn(0));
}

/// A table that is not an outbox table is looked up once, then forgotten by the source: the
/// core asks for it, skips its later rows by relation id (counted as another table's), and
/// confirms past them; a row of the outbox table without its description reconnects.
#[test]
fn a_table_that_is_not_an_outbox_table_is_forgotten_and_its_rows_skipped() {
    let router = Routers::new(
        EventRouter::new(
            RouterOptions::from_map(&BTreeMap::new()).expect("default options"),
            Format::default(),
        ),
        HashMap::new(),
    );
    let prefixes = HashSet::new();
    let metrics = Arc::new(Metrics::new());
    let mut core = session_core(
        &router,
        &prefixes,
        &ErrorPolicy::Fail,
        Duration::from_secs(30),
        Arc::clone(&metrics),
        Lsn(0),
    );
    let now = Now {
        instant: Instant::now(),
        wall: SystemTime::now(),
    };
    let staging = Arc::new(Relation {
        id: 20_000,
        name: Text::from_static("stage_1"),
        ..(*relation()).clone()
    });
    core.handle(
        now,
        Input::Source(SourceEvent::Relation(Arc::clone(&staging))),
    );
    let Some(Action::Lookup(Lookup::OutboxRelation(looked_up))) = core.poll_action() else {
        panic!("asks whether the table is a partition of an outbox table");
    };
    assert!(!core.can_read(), "reads on only once it knows");
    core.handle(
        now,
        Input::Answer(Answer::OutboxRelation {
            relation: looked_up,
            outbox: Ok(None),
        }),
    );
    assert!(matches!(
        core.poll_action(),
        Some(Action::ForgetRelation(20_000))
    ));
    assert!(core.can_read());
    for event in [
        SourceEvent::Begin {
            xid: 1,
            final_lsn: Lsn(100),
            commit_time_us: 0,
        },
        SourceEvent::OtherTableChange {
            relation_id: 20_000,
            lsn: Lsn(90),
        },
        SourceEvent::Commit {
            commit_lsn: Lsn(100),
            end_lsn: Lsn(110),
            commit_time_us: 0,
        },
    ] {
        core.handle(now, Input::Source(event));
    }
    assert!(matches!(
        core.poll_action(),
        Some(Action::Confirm(Lsn(110)))
    ));
    assert!(
        metrics
            .encode()
            .contains("siphon_rows_skipped_total{reason=\"other_table\"} 1"),
        "{}",
        metrics.encode()
    );

    // The outbox table is bound; a row of it the source no longer describes is no skip.
    core.handle(now, Input::Source(SourceEvent::Relation(relation())));
    let Some(Action::Lookup(Lookup::NotNullColumns(outbox))) = core.poll_action() else {
        panic!("a lookup of the outbox table's columns");
    };
    core.handle(
        now,
        Input::Answer(Answer::NotNullColumns {
            relation: outbox,
            columns: Ok(Default::default()),
        }),
    );
    for event in [
        SourceEvent::Begin {
            xid: 2,
            final_lsn: Lsn(200),
            commit_time_us: 0,
        },
        SourceEvent::OtherTableChange {
            relation_id: relation().id,
            lsn: Lsn(190),
        },
    ] {
        core.handle(now, Input::Source(event));
    }
    core.handle(now, Input::Shutdown);
    let finished = std::iter::from_fn(|| core.poll_action()).find_map(|action| match action {
        Action::Finish(result) => Some(result),
        _ => None,
    });
    let Some(Err(error)) = finished else {
        panic!("the session ends with an error: {finished:?}");
    };
    assert!(error.is_transient(), "{error}");
    assert_eq!(core.watermark(), Lsn(110));
}
