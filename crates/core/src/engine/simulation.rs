//! Deterministic simulation of the session core against a model of PostgreSQL and a Kafka
//! producer with gap-less idempotence.
//!
//! Each seed draws an interleaving of source events, broker writes, delivery reports, producer
//! failures (timeouts that may or may not have persisted the batch), refused batches (a
//! "poison" record fails every record of its batch and, gap-less, the producer), lookups
//! answered late (in one seed in three the values are Avro with derived schemas, and each
//! record of a schema the session has not met waits for its id; in another, Avro with the
//! registered schema, which a poison payload does not fit), reconnects and shutdowns. After every step it checks:
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
//! # Exactly-once sessions
//!
//! The exactly-once mode ([`Mode::ExactlyOnce`]: no poison events, but some the producer
//! refuses at enqueue and now and then a topic whose creation is refused, their events
//! dead-lettered in the transaction) gives the core [`KafkaTransactions`]
//! with small bounds (commits every 50-300 ms or few records, some in the middle of a
//! PostgreSQL transaction) and models the broker's transactions:
//! - a record is handed to the producer only inside a Kafka transaction the core began, and
//!   never while a commit is due or runs; what is written in it is seen by a read_uncommitted
//!   consumer at once, by a read_committed one only once it committed;
//! - a beginning may fail (the producer then takes no record), and always fails on a producer
//!   the session replaced (the driver's `rebuild` does not register it);
//! - a commit starts as in the driver (once no record waits for a topic and the core's actions
//!   are carried out, and only if the session did not fail), writes the progress and flushes
//!   the producer: it succeeds only if
//!   no record of the transaction failed in the producer (a record never taken is unknown to
//!   it); with faults it also fails, times out (the coordinator perhaps committed it anyway)
//!   or finds the producer fenced, and a failure ends the session;
//! - a session's end leaves its producer as a zombie: its queued records (and those of batches
//!   that timed out, which may still land) may be written into its open transaction until the
//!   next session's `init_transactions`, which completes a commit the coordinator had and
//!   aborts every other open transaction; after it, the zombie's writes are refused (fenced).
//!   After a failure the driver may abort the transaction itself.
//! - each session reads the last committed progress (read_committed) and starts from it and
//!   the core's confirmed position.
//!
//! It checks that the confirmed position never passes an event outside a committed Kafka
//! transaction; that the progress read at each start covers exactly the committed events the
//! session would read again; that a read_committed consumer never sees an event twice; and at
//! the end that it sees every event exactly once, first deliveries per key in commit order and
//! positions rising per partition. Repeats only a read_uncommitted consumer sees are counted.
//! It runs over the same seeds as the other modes (a few seconds in a debug build), and again
//! with poison events ([`Mode::ExactlyOnceRefused`]): a batch the broker refuses aborts its
//! transaction; its records are carried to the next session as suspects and sent alone, each
//! in a transaction of its own, and one refused alone is dead-lettered by the session after:
//! every poison event ends in the dead-letter topic once, every innocent one in its topic once.
//!
//! `SIPHON_SIM_SEEDS=N` runs more seeds; `SIPHON_SIM_SEED=S` runs one, printing its trace.

pub(super) mod model;

use super::dead_letter::DeadLetters;
use super::note::Note;
use super::policy::{ErrorPolicy, NonTransactionalPolicy, RoutedKind};
use super::routers::Routers;
use super::session;
use super::table::TableName;
use crate::assembly::{RowChange, SourceEvent};
use crate::exactly_once::{KafkaTransactions, Progress, Through, TransactionBounds};
use crate::topic_gate::{Creation, Step, TopicGate};
use bytes::Bytes;
use model::{DeliveryError, Model, Operation, PipelineError, RDKafkaErrorCode, SinkError};
use pgoutput::{Column, Lsn, Relation, RelationColumn, ReplicaIdentity, Text, TupleData};
use siphon_record::Delivered;
use siphon_router::{Encoding, EventRouter, Format, RoutedRecord, RouterOptions};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

pub use session::{Lookup, Now};
type SessionCore<'a> = session::SessionCore<'a, Model>;
type Input = session::Input<Model>;
type Action = session::Action<Model>;
type CoreSettings<'a> = session::CoreSettings<'a, Model>;
type Answer = session::Answer<Model>;
type Delivery = siphon_record::Delivery<DeliveryError>;
type DeliveryFailure = siphon_record::DeliveryFailure<DeliveryError>;
type Suspects = super::suspects::Suspects<model::RecordFault>;

/// The schema the model's registry holds for every topic: innocent payloads fit it.
pub(super) const REGISTERED_SCHEMA: &str =
    r#"{"type":"record","name":"Event","fields":[{"name":"n","type":"long"}]}"#;

/// The seeded generator of the simulation's interleavings (SplitMix64).
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % (n as u64).max(1)) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }
}

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

pub(super) fn relation() -> Arc<Relation> {
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

pub(super) fn row(event: u64, key: u64, poison: bool) -> TupleData {
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

/// The event a record is for: its `id` header, or for the dead letter of a row (which has
/// none), the `id` column in its value.
fn event_of(record: &RoutedRecord) -> Option<u64> {
    let id = match record.headers.iter().find(|h| &*h.name == "id") {
        Some(header) => std::str::from_utf8(header.value.as_deref()?)
            .ok()?
            .to_owned(),
        None if &*record.topic == DEAD_LETTER_TOPIC => {
            let row: serde_json::Value = serde_json::from_slice(record.value.as_deref()?).ok()?;
            row.get("id")?.as_str()?.to_owned()
        }
        None => return None,
    };
    u64::from_str_radix(id.rsplit('-').next()?, 16).ok()
}

fn is_poison(record: &RoutedRecord) -> bool {
    &*record.topic != DEAD_LETTER_TOPIC
        && record
            .value
            .as_deref()
            .is_some_and(|v| v.windows(6).any(|w| w == b"POISON"))
}

/// Whether a key or value in a registry format still holds the router's placeholder id.
fn placeholder_id(record: &RoutedRecord, format: Format) -> bool {
    let unframed = |bytes: Option<&[u8]>| bytes.is_some_and(|b| b.get(..5) == Some(&[0; 5]));
    (format.key == Encoding::Avro && unframed(record.key.as_deref()))
        || (format.value == Encoding::Avro && unframed(record.value.as_deref()))
}

fn partition_of(record: &RoutedRecord) -> usize {
    let key = record.key.as_deref().unwrap_or_default();
    key.iter().map(|&b| b as usize).sum::<usize>() % PARTITIONS
}

/// A record with the modelled producer.
struct Queued {
    token: usize,
    record: RoutedRecord,
    /// Exactly-once: the Kafka transaction it was sent in.
    txn: Option<usize>,
}

/// A Kafka transaction of the modelled broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxnState {
    Open,
    Committed,
    Aborted,
}

/// The modelled Kafka transactions of the source's transactional id (exactly-once sessions).
#[derive(Default)]
struct Transactions {
    /// Each Kafka transaction's state, by id.
    states: Vec<TxnState>,
    /// The transaction the current producer has open.
    open: Option<usize>,
    /// A record of the open transaction failed in the producer: its commit fails.
    doomed: bool,
    /// A commit the core asked for, run once no record waits for a topic (as the driver does).
    asked: Option<Progress>,
    /// The commit running: its transaction and progress.
    committing: Option<(usize, Progress)>,
    /// The progress of the last committed transaction.
    progress: Option<Progress>,
    /// The previous session's producer ("zombie"): the records it still holds (partition,
    /// record), the commit it was running and whether a record of its transaction failed.
    zombie: Vec<(usize, Queued)>,
    /// Records of a transaction whose batch timed out unwritten: the request may still land
    /// (the zombie's, once the session ended).
    late: Vec<(usize, Queued)>,
    zombie_commit: Option<(usize, Progress)>,
    zombie_doomed: bool,
    /// The session was asked to shut down with a transaction open.
    shutdown_open: bool,
    /// Beginning the current transaction failed: the producer takes no record.
    begin_failed: bool,
    /// The session replaced its producer: the new one is not registered (no
    /// `init_transactions`), so it can begin no transaction.
    unregistered: bool,
}

/// A record written to a partition: topic, key, event, Kafka transaction.
type Written = (String, Vec<u8>, u64, Option<usize>);

/// A record's position header: topic, event, position, Kafka transaction.
type Positioned = (String, u64, String, Option<usize>);

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
    /// What reached each partition: (topic, key, event, Kafka transaction).
    log: Vec<Vec<Written>>,
    /// Events that reached the dead-letter topic.
    dead: BTreeSet<u64>,
    /// Events written to their own topic.
    written: BTreeSet<u64>,
    /// The `siphon.position` of each record written, per partition, in write order (and its
    /// Kafka transaction).
    positions: Vec<Vec<Positioned>>,
    /// The topics that exist.
    topics: HashSet<String>,
    /// The topic creation running (its id and topic).
    creation: Option<(u64, String)>,
    /// A topic creation failed for now since the producer was put in place.
    creation_failed: bool,
    /// Exactly-once: the Kafka transactions.
    kafka: Transactions,
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

    /// Whether what the records of Kafka transaction `txn` show to a read_committed consumer
    /// (records outside transactions always).
    fn visible(&self, txn: Option<usize>) -> bool {
        txn.is_none_or(|t| self.kafka.states[t] == TxnState::Committed)
    }

    /// How often each event is in its own topic or the dead-letter topic for a read_committed
    /// consumer.
    fn committed_events(&self) -> HashMap<u64, usize> {
        let mut events = HashMap::new();
        for (_, _, event, txn) in self.log.iter().flatten() {
            if self.visible(*txn) {
                *events.entry(*event).or_default() += 1;
            }
        }
        events
    }

    fn report(&mut self, p: usize, q: Queued, result: Result<(), RDKafkaErrorCode>) {
        if result.is_err() && q.txn.is_some() {
            // librdkafka fails the transaction of a record that failed.
            self.kafka.doomed = true;
        }
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

    fn persist(&mut self, p: usize, record: &RoutedRecord, txn: Option<usize>) {
        let Some(event) = event_of(record) else {
            return;
        };
        let key = record.key.as_deref().unwrap_or_default().to_vec();
        self.log[p].push((record.topic.to_string(), key, event, txn));
        if let Some(position) = record
            .headers
            .iter()
            .find(|h| &*h.name == super::position::POSITION_HEADER)
            .and_then(|h| h.value.as_deref())
        {
            self.positions[p].push((
                record.topic.to_string(),
                event,
                String::from_utf8_lossy(position).into_owned(),
                txn,
            ));
        }
        if &*record.topic == DEAD_LETTER_TOPIC {
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
                    self.persist(p, &q.record, q.txn);
                } else if q.txn.is_some() {
                    self.kafka.late.push((
                        p,
                        Queued {
                            token: q.token,
                            record: q.record.clone(),
                            txn: q.txn,
                        },
                    ));
                }
                self.report(p, q, Err(RDKafkaErrorCode::MessageTimedOut));
            }
            self.failed = true;
            self.fail_all(RDKafkaErrorCode::GaplessGuarantee);
            return;
        }
        for q in batch {
            self.persist(p, &q.record, q.txn);
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
    /// Exactly-once sessions (Kafka transactions, no poison events).
    exactly_once: bool,
    /// Exactly-once: events the producer refuses to take (too large): dead-lettered.
    oversized: HashSet<u64>,
    /// Exactly-once: a topic whose creation is refused for good for its name (its events
    /// dead-lettered: the name is the record's).
    refused_topic: Option<&'static str>,
    /// A broken promise or a model rule the core broke, found while carrying out its actions.
    violation: Option<String>,
}

impl World {
    /// A database of `txn_count` transactions; `poison`: some events are refused by the broker.
    fn new(seed: u64, txn_count: usize, with_poison: bool) -> Self {
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
                let is_poison = rng.chance(3) && with_poison;
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
            exactly_once: false,
            oversized: HashSet::new(),
            refused_topic: None,
            violation: None,
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
        if self.exactly_once {
            // Only what a read_committed consumer sees counts.
            let committed = self.broker.committed_events();
            for (&event, &end) in &self.end_of {
                if end <= lsn && !committed.contains_key(&event) {
                    return Err(format!(
                        "confirmed {lsn} passes event {event} (transaction ending {end}) that is in no committed Kafka transaction"
                    ));
                }
            }
            return Ok(());
        }
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
            for (topic, event, position, txn) in log {
                if !self.broker.visible(*txn) {
                    continue;
                }
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
            for (topic, key, event, txn) in log {
                if topic == DEAD_LETTER_TOPIC || !self.broker.visible(*txn) {
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

/// The modelled broker's side of exactly-once sessions: Kafka transactions, their commits,
/// the registration of a new session's producer and the previous one's late writes.
impl World {
    /// [`Action::BeginTransaction`]; with `faults` it may fail (the producer then takes no
    /// record).
    fn begin_transaction(&mut self, faults: bool) -> Result<(), SinkError> {
        if self.broker.kafka.unregistered {
            self.trace
                .push("begin Kafka transaction failed: producer not registered".into());
            self.saw("begin on a replaced producer");
            self.broker.kafka.begin_failed = true;
            return Err(SinkError::Transaction {
                operation: Operation::BeginTransaction,
                transactional_id: "sim".into(),
                code: RDKafkaErrorCode::State,
            });
        }
        if faults && self.rng.chance(2) {
            self.trace.push("begin Kafka transaction failed".into());
            self.saw("begin failed");
            self.broker.kafka.begin_failed = true;
            return Err(SinkError::Transaction {
                operation: Operation::BeginTransaction,
                transactional_id: "sim".into(),
                code: RDKafkaErrorCode::CoordinatorNotAvailable,
            });
        }
        let kafka = &mut self.broker.kafka;
        if kafka.open.is_some() || kafka.committing.is_some() || kafka.asked.is_some() {
            self.violation.get_or_insert(format!(
                "a Kafka transaction begun with one open ({:?}) or committing",
                kafka.open
            ));
            return Ok(());
        }
        kafka.open = Some(kafka.states.len());
        kafka.states.push(TxnState::Open);
        kafka.doomed = false;
        self.trace.push(format!(
            "begin Kafka transaction {}",
            kafka.states.len() - 1
        ));
        Ok(())
    }

    /// [`Action::Commit`]: run once no record waits for a topic.
    fn ask_commit(&mut self, progress: Progress) {
        let kafka = &mut self.broker.kafka;
        self.trace.push(format!(
            "commit asked for {:?} with progress {}/{:?}",
            kafka.open, progress.commit_lsn, progress.through
        ));
        if kafka.open.is_none() || kafka.committing.is_some() || kafka.asked.is_some() {
            self.violation
                .get_or_insert("a commit asked for with no Kafka transaction open".into());
            return;
        }
        kafka.asked = Some(progress);
    }

    /// Starts the commit asked for once `gate_empty` (the driver's `start_commit`): the
    /// progress record is written in the transaction, and the commit flushes the producer.
    fn start_commit(&mut self, gate_empty: bool) {
        let kafka = &mut self.broker.kafka;
        if !gate_empty {
            return;
        }
        let (Some(progress), Some(txn)) = (kafka.asked, kafka.open) else {
            return;
        };
        kafka.asked = None;
        kafka.committing = Some((txn, progress));
        self.trace.push(format!("commit of {txn} runs"));
    }

    /// Whether the running commit can end: librdkafka flushed every record first.
    fn commit_flushed(&self) -> bool {
        self.broker.kafka.committing.is_some()
            && self.broker.unwritten.iter().all(VecDeque::is_empty)
    }

    /// The running commit ends: it succeeds only if no record of its transaction failed; with
    /// `faults`, it may also fail, time out (perhaps after the coordinator committed) or find
    /// the producer fenced.
    fn end_commit(&mut self, faults: bool) -> Option<Result<(), SinkError>> {
        let (txn, progress) = self.broker.kafka.committing.take()?;
        let error = |code| SinkError::Transaction {
            operation: Operation::CommitTransaction,
            transactional_id: "sim".into(),
            code,
        };
        let doomed = self.broker.kafka.doomed || self.broker.failed;
        let (committed, result) = if doomed {
            self.trace
                .push(format!("commit of {txn} fails: a record of it failed"));
            (
                false,
                Err(error(RDKafkaErrorCode::InvalidTransactionalState)),
            )
        } else if faults && self.rng.chance(15) {
            match self.rng.below(3) {
                0 => {
                    self.trace.push(format!("commit of {txn} failed"));
                    (
                        false,
                        Err(error(RDKafkaErrorCode::CoordinatorLoadInProgress)),
                    )
                }
                1 => {
                    let through = self.rng.chance(50);
                    self.trace.push(format!(
                        "commit of {txn} timed out (committed by the coordinator: {through})"
                    ));
                    if through {
                        self.saw("commit timed out after the coordinator committed");
                    }
                    (through, Err(error(RDKafkaErrorCode::OperationTimedOut)))
                }
                _ => {
                    self.trace.push(format!("commit of {txn}: producer fenced"));
                    self.saw("producer fenced at commit");
                    (false, Err(error(RDKafkaErrorCode::ProducerFenced)))
                }
            }
        } else {
            self.trace.push(format!(
                "commit of {txn} ok: progress {}/{:?}",
                progress.commit_lsn, progress.through
            ));
            (true, Ok(()))
        };
        if committed {
            self.commit(txn, progress);
        } else {
            self.saw("failed commit");
        }
        Some(result)
    }

    fn commit(&mut self, txn: usize, progress: Progress) {
        let kafka = &mut self.broker.kafka;
        kafka.states[txn] = TxnState::Committed;
        kafka.progress = Some(progress);
        if kafka.open == Some(txn) {
            kafka.open = None;
        }
        self.saw("commit");
        if matches!(progress.through, Through::Record(_)) {
            self.saw("mid-transaction split");
        }
    }

    /// The session ended: its producer lives on as a zombie (its queued records, a running
    /// commit); after a failure the driver may abort the open transaction itself.
    fn end_session(&mut self, failed: bool) {
        let kafka = &mut self.broker.kafka;
        kafka.zombie.append(&mut kafka.late);
        for (p, queue) in self.broker.unwritten.iter_mut().enumerate() {
            kafka.zombie.extend(queue.drain(..).map(|q| (p, q)));
        }
        kafka.zombie_commit = kafka.committing.take();
        kafka.zombie_doomed = kafka.doomed || self.broker.failed;
        kafka.asked = None;
        kafka.shutdown_open = false;
        kafka.begin_failed = false;
        kafka.unregistered = false;
        if failed && kafka.zombie_commit.is_none() && self.rng.chance(50) {
            if let Some(txn) = kafka.open.take() {
                self.trace
                    .push(format!("the driver aborts Kafka transaction {txn}"));
                kafka.states[txn] = TxnState::Aborted;
                kafka.zombie.clear();
                self.saw("aborted transaction");
            }
        }
    }

    /// The zombie producer writes its next batch: into its transaction while it is open (before
    /// the next producer's registration), refused (fenced) after.
    fn zombie_writes(&mut self) {
        let kafka = &mut self.broker.kafka;
        let Some((p, _)) = kafka.zombie.first() else {
            return;
        };
        let p = *p;
        let n = 1 + self.rng.below(3);
        let mut batch = Vec::new();
        while batch.len() < n {
            let Some(i) = kafka.zombie.iter().position(|(q, _)| *q == p) else {
                break;
            };
            batch.push(kafka.zombie.remove(i).1);
        }
        for q in batch {
            let open = q
                .txn
                .is_some_and(|t| self.broker.kafka.states[t] == TxnState::Open);
            if open {
                self.trace.push(format!(
                    "zombie writes #{} event {:?} in Kafka transaction {:?}",
                    q.token,
                    event_of(&q.record),
                    q.txn
                ));
                self.broker.persist(p, &q.record, q.txn);
            } else {
                self.trace.push(format!(
                    "zombie's #{} event {:?} refused: producer fenced",
                    q.token,
                    event_of(&q.record)
                ));
                self.saw("fenced zombie");
            }
        }
    }

    /// A new session's `init_transactions`: the zombie may write before it is fenced; a commit
    /// it was running completes if the coordinator had it, every other open transaction is
    /// aborted. Then the progress is read read_committed.
    fn init_transactions(&mut self) -> Option<Progress> {
        while !self.broker.kafka.zombie.is_empty() && self.rng.chance(30) {
            self.zombie_writes();
        }
        if let Some((txn, progress)) = self.broker.kafka.zombie_commit.take() {
            let flushed = self
                .broker
                .kafka
                .zombie
                .iter()
                .all(|(_, q)| q.txn != Some(txn));
            if flushed && !self.broker.kafka.zombie_doomed && self.rng.chance(50) {
                self.trace.push(format!(
                    "the coordinator completes the commit of {txn} the ended session ran"
                ));
                self.saw("commit completed after its session ended");
                self.commit(txn, progress);
            }
        }
        let kafka = &mut self.broker.kafka;
        kafka.open = None;
        kafka.doomed = false;
        for (txn, state) in kafka.states.iter_mut().enumerate() {
            if *state == TxnState::Open {
                *state = TxnState::Aborted;
                self.trace
                    .push(format!("init_transactions aborts Kafka transaction {txn}"));
                let written = self
                    .broker
                    .log
                    .iter()
                    .flatten()
                    .any(|(_, _, _, t)| *t == Some(txn));
                if written {
                    *self.seen.entry("aborted transaction").or_default() += 1;
                }
            }
        }
        let progress = self.broker.kafka.progress;
        self.trace.push(format!(
            "progress read: {:?}",
            progress.map(|p| (p.commit_lsn, p.through))
        ));
        progress
    }

    /// The progress read at a session's start (resuming at `resume`) is exact: it covers an
    /// event the session reads again if and only if the event is committed.
    fn check_progress(&self, progress: Option<Progress>, resume: Lsn) -> Result<(), String> {
        let committed = self.broker.committed_events();
        for txn in &self.txns {
            for (index, &(event, _, _)) in txn.events.iter().enumerate() {
                let is_committed = committed.contains_key(&event);
                let covered = progress.is_some_and(|p| p.covers(txn.begin_lsn, index as u32));
                if txn.end_lsn <= resume {
                    if !is_committed {
                        return Err(format!(
                            "resuming at {resume} after event {event}, which is in no committed Kafka transaction"
                        ));
                    }
                } else if covered != is_committed {
                    return Err(format!(
                        "the progress {progress:?} covers event {event} ({}, record {index}): {covered}, but it is committed: {is_committed}",
                        txn.begin_lsn
                    ));
                }
            }
        }
        Ok(())
    }

    /// No event twice for a read_committed consumer.
    fn check_at_most_once(&self) -> Result<(), String> {
        match self
            .broker
            .committed_events()
            .into_iter()
            .find(|&(_, n)| n > 1)
        {
            Some((event, n)) => Err(format!(
                "event {event} {n} times in committed Kafka transactions"
            )),
            None => Ok(()),
        }
    }
}

/// [`session_core`] from position 0 that fails on a bad row, at-least-once, with a 30 s
/// shutdown timeout.
fn plain_core<'a>(router: &'a Routers, prefixes: &'a HashSet<String>) -> SessionCore<'a> {
    session_core(
        router,
        prefixes,
        &ErrorPolicy::Fail,
        Duration::from_secs(30),
        Lsn(0),
        None,
    )
}

/// A core over the modelled outbox table, with a window of [`WINDOW`] records.
fn session_core<'a>(
    router: &'a Routers,
    prefixes: &'a HashSet<String>,
    on_error: &'a ErrorPolicy,
    shutdown_timeout: Duration,
    start: Lsn,
    exactly_once: Option<(KafkaTransactions, Suspects)>,
) -> SessionCore<'a> {
    let (transactions, suspects) = match exactly_once {
        Some((transactions, suspects)) => (Some(transactions), suspects),
        None => (None, Default::default()),
    };
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
            transactions,
            suspects,
            registered_schema_ttl: Duration::from_secs(60),
            subject_strategy: siphon_record::registered::SubjectStrategy::default(),
        },
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
    if w.exactly_once
        && &*record.topic != DEAD_LETTER_TOPIC
        && event_of(&record).is_some_and(|e| w.oversized.contains(&e))
    {
        w.trace
            .push(format!("#{token} refused at enqueue: too large"));
        w.saw("refused at enqueue");
        let topic = record.topic.to_string();
        core.handle(
            w.now(),
            Input::SendRefused {
                token,
                record,
                error: SinkError::Kafka {
                    operation: Operation::Enqueue,
                    topic,
                    code: RDKafkaErrorCode::MessageSizeTooLarge,
                },
            },
        );
        return;
    }
    if w.exactly_once && w.broker.kafka.begin_failed && w.broker.kafka.open.is_none() {
        // librdkafka takes no record outside a transaction.
        w.trace.push(format!("#{token} not taken: no transaction"));
        let topic = record.topic.to_string();
        core.handle(
            w.now(),
            Input::SendRefused {
                token,
                record,
                error: SinkError::Kafka {
                    operation: Operation::Enqueue,
                    topic,
                    code: RDKafkaErrorCode::State,
                },
            },
        );
        return;
    }
    if w.exactly_once {
        let kafka = &w.broker.kafka;
        if kafka.open.is_none() || kafka.committing.is_some() {
            w.violation.get_or_insert(format!(
                "record #{token} handed to the producer outside an open Kafka transaction (open: {:?}, committing: {:?})",
                kafka.open, kafka.committing
            ));
        }
    }
    if w.broker.failed {
        let record_topic = record.topic.to_string();
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
        let txn = w.broker.kafka.open;
        w.broker.unwritten[p].push_back(Queued { token, record, txn });
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
    // As in the driver, a commit the gate held starts only once the core's actions these steps
    // caused are carried out (a dead letter of a record refused here joins the transaction
    // before it commits).
}

/// The outcome of one seed.
struct Outcome {
    error: Option<PipelineError>,
    /// How often each path of interest was taken.
    seen: BTreeMap<&'static str, u64>,
}

/// What a seed runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// At-least-once, poison events dead-lettered.
    DeadLetter,
    /// At-least-once, a poison event stops the session.
    Fail,
    /// Exactly-once (Kafka transactions), no poison events.
    ExactlyOnce,
    /// Exactly-once, poison events (refused by the broker in a transaction) dead-lettered.
    ExactlyOnceRefused,
}

fn run_seed(seed: u64, mode: Mode) -> Result<(Outcome, Vec<String>), (String, Vec<String>)> {
    let txn_count = 40;
    let fail_on_poison = mode == Mode::Fail;
    let exactly_once = matches!(mode, Mode::ExactlyOnce | Mode::ExactlyOnceRefused);
    let mut w = World::new(seed, txn_count, mode != Mode::ExactlyOnce);
    w.exactly_once = exactly_once;
    if mode == Mode::ExactlyOnce {
        // Some events are refused at enqueue: dead-lettered in the Kafka transaction.
        let events: Vec<u64> = w
            .txns
            .iter()
            .flat_map(|t| t.events.iter().map(|e| e.0))
            .collect();
        for event in events {
            if w.rng.chance(3) {
                w.oversized.insert(event);
                w.poison.insert(event);
            }
        }
        // Now and then a topic the brokers refuse to create: its events are dead-lettered.
        if w.rng.chance(20) {
            w.refused_topic = Some("outbox.event.payment");
            let payments: Vec<u64> = w
                .txns
                .iter()
                .flat_map(|t| t.events.iter().filter(|e| e.1 % 3 == 2).map(|e| e.0))
                .collect();
            w.poison.extend(payments);
        }
    }
    // Small bounds: commits often, and some in the middle of a PostgreSQL transaction.
    let bounds = exactly_once.then(|| TransactionBounds {
        max_age: Duration::from_millis(50 + w.rng.below(251) as u64),
        max_bytes: 50 + w.rng.below(800),
    });
    // One seed in three writes Avro values with derived schemas, one with the registered
    // one: a record waits, and reading with it, for its schema id or its topic's schema, which
    // the model's registry answers late. The registered schema has no `poison` field, so a
    // poison payload does not fit it and is dead-lettered (or stops the session) before the
    // broker sees it.
    let value = match seed % 3 {
        1 => Encoding::Avro,
        2 => Encoding::Registered(siphon_record::RegistrySchemaKind::Avro),
        _ => Encoding::Json,
    };
    // Every other seed of each kind writes Avro keys too: a record then waits for two ids.
    let key = if (seed / 3) % 2 == 1 {
        Encoding::Avro
    } else {
        Encoding::Json
    };
    let format = Format {
        key,
        value,
        ..Format::default()
    };
    let router = Routers::new(
        EventRouter::new(
            RouterOptions::from_map(&BTreeMap::new()).map_err(|e| (e.to_string(), Vec::new()))?,
            format,
        ),
        HashMap::new(),
    );
    let prefixes = HashSet::new();
    let policy = if fail_on_poison {
        ErrorPolicy::Fail
    } else {
        ErrorPolicy::DeadLetter(DeadLetters::new(DEAD_LETTER_TOPIC.to_owned(), 1_000_000))
    };
    let last_end = w.txns.last().map_or(Lsn(0), |t| t.end_lsn);
    let mut resume = Lsn(0);
    let mut sessions = 0;
    let mut outcome_error = None;
    let fault_steps = 1_500;
    let mut step = 0usize;
    // Records the broker refused in a Kafka transaction, carried from session to session as
    // the driver carries them.
    let mut suspects = Suspects::default();
    // Each record the broker refuses in a Kafka transaction costs up to two sessions.
    let session_cap = if mode == Mode::ExactlyOnceRefused {
        40 + 2 * w.poison.len()
    } else {
        40
    };
    'sessions: loop {
        sessions += 1;
        if sessions > session_cap {
            return Err((
                format!("more than {session_cap} sessions: no progress"),
                w.trace,
            ));
        }
        w.trace.push(format!("session {sessions} from {resume}"));
        let mut source = w.source_from(resume);
        let transactions = match bounds {
            Some(bounds) => {
                let progress = w.init_transactions();
                w.check_progress(progress, resume)
                    .map_err(|e| (e, w.trace.clone()))?;
                Some(KafkaTransactions::new(bounds, resume, progress))
            }
            None => None,
        };
        let mut core = session_core(
            &router,
            &prefixes,
            &policy,
            Duration::from_secs(5),
            resume,
            transactions.map(|t| (t, std::mem::take(&mut suspects))),
        );
        w.broker.failed = false;
        w.broker.generation += 1;
        w.broker.creation = None;
        w.broker.creation_failed = false;
        let mut gate = TopicGate::<RoutedKind>::default();
        let mut lookups: VecDeque<Lookup> = VecDeque::new();
        let mut stopping = false;
        // The source's model skims the DELETEs of the relations the core names (as the
        // assembler does, until the relation is described again), in three sessions of four;
        // in the others it decodes them all, which the core must take as well.
        let skims = !(seed + sessions as u64).is_multiple_of(4);
        let mut skimmed: HashSet<u32> = HashSet::new();
        loop {
            step += 1;
            if step > 60_000 {
                return Err(("no progress after 60,000 steps".into(), w.trace));
            }
            let faults = step < fault_steps;
            // Execute what the core asked for.
            while let Some(action) = core.poll_action() {
                // As the driver does: the notes are taken as each action is.
                while core.poll_note().is_some() {}
                match action {
                    Action::Send { token, record } => {
                        if w.broker.kafka.committing.is_some() {
                            w.violation.get_or_insert(format!(
                                "record #{token} handed over while a commit runs"
                            ));
                        }
                        if placeholder_id(&record, format) {
                            w.violation.get_or_insert(format!(
                                "record #{token} handed over without its schema id"
                            ));
                        }
                        let topics = &w.broker.topics;
                        let step = gate.offer(token, record, |topic| !topics.contains(topic));
                        carry_out(&mut w, &mut core, &gate, step.into_iter().collect());
                    }
                    Action::Confirm(lsn) => {
                        w.trace.push(format!("confirm {lsn}"));
                        w.check_confirm(lsn).map_err(|e| (e, w.trace.clone()))?;
                    }
                    Action::Lookup(lookup) => lookups.push_back(lookup),
                    Action::ForgetRelation(relation) => {
                        skimmed.remove(&relation);
                    }
                    Action::SkipDeletes(relation) => {
                        if skims {
                            skimmed.insert(relation);
                        }
                    }
                    Action::BeginTransaction | Action::Commit(_) if !exactly_once => {
                        return Err((
                            "a Kafka transaction in an at-least-once session".into(),
                            w.trace,
                        ))
                    }
                    Action::BeginTransaction => {
                        if let Err(e) = w.begin_transaction(faults) {
                            core.handle(w.now(), Input::Committed(Err(e)));
                        }
                    }
                    Action::Commit(progress) => w.ask_commit(progress),
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
                        if exactly_once {
                            // `rebuild` creates a transactional producer without registering it.
                            w.broker.kafka.unregistered = true;
                        }
                    }
                    Action::Finish(result) => {
                        w.trace.push(format!("finish {result:?}"));
                        resume = resume.max(core.watermark());
                        suspects = core.take_suspects();
                        if !suspects.is_empty() {
                            w.saw("records the broker refused carried to the next session");
                        }
                        if exactly_once {
                            if core.skipped_committed() > 0 {
                                w.saw("skipped already committed records");
                            }
                            let kafka = &w.broker.kafka;
                            if result.is_ok() {
                                if kafka.open.is_some() || kafka.committing.is_some() {
                                    return Err((
                                        format!(
                                            "finished with Kafka transaction {:?} open",
                                            kafka.open
                                        ),
                                        w.trace,
                                    ));
                                }
                                if kafka.shutdown_open {
                                    w.saw("shutdown committed the open transaction");
                                }
                            }
                            w.end_session(result.is_err());
                        }
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
            if let Some(violation) = w.violation.take() {
                return Err((violation, w.trace));
            }
            if exactly_once {
                // As the driver: once no record waits for a topic, and the session did not fail.
                w.start_commit(gate.is_empty() && core.may_commit());
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
                if exactly_once {
                    w.check_at_most_once().map_err(|e| (e, w.trace.clone()))?;
                }
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
                let event = match event {
                    SourceEvent::Relation(relation) => {
                        skimmed.remove(&relation.id);
                        SourceEvent::Relation(relation)
                    }
                    SourceEvent::Change {
                        relation,
                        change: RowChange::Delete(_),
                        lsn,
                    } if skimmed.contains(&relation.id) => {
                        w.saw("delete read without its old row");
                        SourceEvent::OutboxDelete {
                            relation_id: relation.id,
                            lsn,
                        }
                    }
                    event @ SourceEvent::Change {
                        change: RowChange::Delete(_),
                        ..
                    } => {
                        w.saw("delete read with its old row");
                        event
                    }
                    event => event,
                };
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
            } else if exactly_once && choice < 87 && !w.broker.kafka.zombie.is_empty() {
                w.zombie_writes();
            } else if exactly_once && choice < 89 && w.commit_flushed() {
                if let Some(result) = w.end_commit(faults) {
                    core.handle(w.now(), Input::Committed(result));
                }
            } else if choice < 90 && w.broker.creation.is_some() && w.rng.chance(50) {
                let Some((id, topic)) = w.broker.creation.take() else {
                    continue;
                };
                let outcome = if w.refused_topic == Some(topic.as_str()) {
                    w.trace.push(format!("creation of {topic} refused"));
                    w.saw("topic creation refused");
                    Creation::Refused(SinkError::Kafka {
                        operation: Operation::CreateTopic,
                        topic: topic.to_owned(),
                        code: RDKafkaErrorCode::InvalidTopic,
                    })
                } else if faults && w.rng.chance(25) {
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
                    Some(Lookup::LatestSchema { subject }) => {
                        w.saw("registered schema fetched");
                        Some(Answer::LatestSchema {
                            subject,
                            schema: Ok((
                                2,
                                siphon_record::RegistrySchemaKind::Avro,
                                Arc::from(REGISTERED_SCHEMA),
                            )),
                        })
                    }
                    Some(Lookup::SchemaId { subject, schema }) => {
                        w.saw("schema id looked up");
                        Some(Answer::SchemaId {
                            subject,
                            schema,
                            id: Ok(1),
                        })
                    }
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
                if w.broker.kafka.open.is_some() {
                    w.broker.kafka.shutdown_open = true;
                    w.saw("shutdown with a Kafka transaction open");
                }
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
    if exactly_once {
        // What a next session would start from is exact, whatever stopped this one.
        w.check_at_most_once().map_err(|e| (e, w.trace.clone()))?;
        let progress = w.init_transactions();
        w.check_progress(progress, resume)
            .map_err(|e| (e, w.trace.clone()))?;
    }
    if exactly_once && outcome_error.is_none() {
        // A read_committed consumer sees every event exactly once, in order, positions rising;
        // a read_uncommitted one may see repeats (what the transactions save).
        w.check_positions().map_err(|e| (e, w.trace.clone()))?;
        let committed = w.broker.committed_events();
        for &event in w.end_of.keys() {
            let n = committed.get(&event).copied().unwrap_or(0);
            if n != 1 {
                return Err((
                    format!("event {event} {n} times for a read_committed consumer"),
                    w.trace,
                ));
            }
        }
        let written = w.broker.log.iter().flatten().count();
        let repeats = (written - w.end_of.len()) as u64;
        *w.seen
            .entry("repeats only read_uncommitted consumers see")
            .or_default() += repeats;
    }
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

/// Runs every seed in `mode`, failing on any broken promise or stop; returns how often each
/// path of interest was taken, over all seeds.
fn run_every_seed(mode: Mode, label: &str) -> BTreeMap<&'static str, u64> {
    let seeds = seeds();
    let mut seen: BTreeMap<&'static str, u64> = BTreeMap::new();
    for &seed in &seeds {
        match run_seed(seed, mode) {
            Ok((outcome, trace)) => {
                if let Some(e) = outcome.error {
                    fail(seed, label, &format!("stopped: {e}"), &trace);
                }
                if seeds.len() == 1 {
                    eprintln!("{}", trace.join("\n"));
                }
                for (what, n) in outcome.seen {
                    *seen.entry(what).or_default() += n;
                }
            }
            Err((reason, trace)) => fail(seed, label, &reason, &trace),
        }
    }
    seen
}

/// The seeds together take every path in `paths` (checked when at least 100 seeds ran).
fn assert_paths_taken(seen: &BTreeMap<&'static str, u64>, paths: &[&str]) {
    if seeds().len() < 100 {
        return;
    }
    for what in paths {
        assert!(
            seen.get(what).is_some_and(|&n| n > 0),
            "never seen: {what} ({seen:?})"
        );
    }
}

#[test]
fn simulation_dead_letter_policy_keeps_every_promise() {
    let seen = run_every_seed(Mode::DeadLetter, "dead-letter");
    assert_paths_taken(
        &seen,
        &[
            "topic creation",
            "topic creation failed for now",
            "handed back by a purge",
            "purge",
            "producer replaced",
            "delivery deadline overrun",
            "delete read without its old row",
            "delete read with its old row",
            "schema id looked up",
            "registered schema fetched",
        ],
    );
}

#[test]
fn simulation_fail_policy_stops_on_a_refused_record_without_loss() {
    for seed in seeds() {
        match run_seed(seed, Mode::Fail) {
            Ok((outcome, trace)) => {
                let any_poison = World::new(seed, 40, true).poison.iter().next().is_some();
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

#[test]
fn simulation_exactly_once_keeps_every_promise() {
    let seen = run_every_seed(Mode::ExactlyOnce, "exactly-once");
    assert_paths_taken(
        &seen,
        &[
            "commit",
            "mid-transaction split",
            "failed commit",
            "aborted transaction",
            "skipped already committed records",
            "fenced zombie",
            "shutdown with a Kafka transaction open",
            "shutdown committed the open transaction",
            "commit timed out after the coordinator committed",
            "commit completed after its session ended",
            "begin failed",
            "refused at enqueue",
            "topic creation refused",
            "repeats only read_uncommitted consumers see",
            "delete read without its old row",
            "delete read with its old row",
            "schema id looked up",
            "registered schema fetched",
        ],
    );
}

#[test]
fn simulation_exactly_once_dead_letters_records_the_broker_refuses() {
    let seen = run_every_seed(Mode::ExactlyOnceRefused, "exactly-once refused");
    assert_paths_taken(
        &seen,
        &["records the broker refused carried to the next session"],
    );
}

/// Binds the outbox table (answering the core's lookup) and feeds one transaction of one event,
/// committed at 100 and ending at 110.
fn bind_and_read_one_transaction(core: &mut SessionCore<'_>, now: Now) {
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
    // Carried out before the stream is read on, as the driver does.
    assert!(matches!(
        core.poll_action(),
        Some(Action::SkipDeletes(16_400))
    ));
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
}

/// A record the producer refused to take (enqueue failed) is not waited for at shutdown: the
/// stop is immediate, not the whole shutdown timeout later, and the record's transaction is not
/// confirmed.
#[test]
fn a_record_the_producer_did_not_take_does_not_hold_up_shutdown() {
    let router = default_routers();
    let prefixes = HashSet::new();
    let mut core = plain_core(&router, &prefixes);
    let start = Instant::now();
    let now = Now {
        instant: start,
        wall: SystemTime::now(),
    };
    bind_and_read_one_transaction(&mut core, now);
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
                    topic: record.topic.to_string(),
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
    let router = default_routers();
    let prefixes = HashSet::new();
    let mut recorder = Notes::default();
    let mut core = plain_core(&router, &prefixes);
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
    recorder.drain(&mut core);
    assert_eq!(recorder.count("OtherTableRow"), 1, "{:?}", recorder.0);

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

/// The notes a core gave, taken as the driver takes them.
#[derive(Default)]
struct Notes(Vec<Note>);

impl Notes {
    /// Takes every note `core` has.
    fn drain(&mut self, core: &mut SessionCore<'_>) {
        while let Some(note) = core.poll_note() {
            self.0.push(note);
        }
    }

    /// How many notes of `kind` (the variant's name) were taken.
    fn count(&self, kind: &str) -> usize {
        self.0.iter().filter(|note| kind_of(note) == kind).count()
    }
}

/// The variant's name of `note`.
fn kind_of(note: &Note) -> String {
    let text = format!("{note:?}");
    text.split('(').next().unwrap_or_default().to_owned()
}

/// The counted notes (every kind, with how many), as `kind count` lines.
fn counter_lines(notes: &Notes) -> Vec<String> {
    let mut counts = BTreeMap::<String, usize>::new();
    for note in &notes.0 {
        *counts.entry(kind_of(note)).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|(kind, count)| format!("{kind} {count}"))
        .collect()
}

/// Binds the outbox table as `core` asks (its lookup answered), returning the actions that
/// follow the answer.
fn bind_outbox(core: &mut SessionCore<'_>, now: Now, relation: Arc<Relation>) -> Vec<Action> {
    core.handle(now, Input::Source(SourceEvent::Relation(relation)));
    let Some(Action::Lookup(Lookup::NotNullColumns(relation))) = core.poll_action() else {
        panic!("a lookup of the outbox table's columns");
    };
    core.handle(
        now,
        Input::Answer(Answer::NotNullColumns {
            relation,
            columns: Ok(Default::default()),
        }),
    );
    std::iter::from_fn(|| core.poll_action()).collect()
}

/// A DELETE of the outbox table is skipped alike whether the source decoded its old row or
/// skimmed it (as it does once the core says the table's DELETEs are skipped): the same
/// counters, the same records and confirmations, a transaction of DELETEs only included.
#[test]
fn a_delete_read_without_its_row_is_skipped_as_one_read_with_it() {
    let router = default_routers();
    let prefixes = HashSet::new();
    let now = Now {
        instant: Instant::now(),
        wall: SystemTime::now(),
    };
    let outcomes = [false, true].map(|skimmed| {
        let mut recorder = Notes::default();
        let mut core = plain_core(&router, &prefixes);
        let relation = relation();
        let after_binding = bind_outbox(&mut core, now, Arc::clone(&relation));
        assert!(
            matches!(after_binding[..], [Action::SkipDeletes(16_400)]),
            "{after_binding:?}"
        );
        let delete = |lsn| match skimmed {
            true => SourceEvent::OutboxDelete {
                relation_id: relation.id,
                lsn: Lsn(lsn),
            },
            false => SourceEvent::Change {
                relation: Arc::clone(&relation),
                change: RowChange::Delete(pgoutput::OldTuple::Key(TupleData {
                    columns: vec![Column::Text(Bytes::from_static(b"k"))],
                })),
                lsn: Lsn(lsn),
            },
        };
        let mut trace = Vec::new();
        let mut take = |core: &mut SessionCore<'_>| {
            let mut token = None;
            for action in std::iter::from_fn(|| core.poll_action()) {
                match action {
                    Action::Send { token: t, record } => {
                        trace.push(format!("send #{t} to {}", record.topic));
                        token = Some(t);
                    }
                    other => trace.push(format!("{other:?}")),
                }
            }
            token
        };
        for event in [
            SourceEvent::Begin {
                xid: 1,
                final_lsn: Lsn(100),
                commit_time_us: 0,
            },
            SourceEvent::Change {
                relation: Arc::clone(&relation),
                change: RowChange::Insert(row(1, 1, false)),
                lsn: Lsn(90),
            },
            delete(95),
            SourceEvent::Commit {
                commit_lsn: Lsn(100),
                end_lsn: Lsn(110),
                commit_time_us: 0,
            },
            // DELETEs only: nothing to send, confirmed once the transaction before it is.
            SourceEvent::Begin {
                xid: 2,
                final_lsn: Lsn(200),
                commit_time_us: 0,
            },
            delete(190),
            delete(195),
            SourceEvent::Commit {
                commit_lsn: Lsn(200),
                end_lsn: Lsn(210),
                commit_time_us: 0,
            },
        ] {
            core.handle(now, Input::Source(event));
        }
        let token = take(&mut core).expect("the inserted row's record");
        core.handle(
            now,
            Input::Delivery(Delivery {
                token,
                generation: 0,
                result: Ok(Delivered {
                    partition: 0,
                    offset: 0,
                }),
            }),
        );
        take(&mut core);
        assert_eq!(core.watermark(), Lsn(210), "{trace:?}");
        recorder.drain(&mut core);
        (trace, counter_lines(&recorder))
    });
    assert_eq!(outcomes[0], outcomes[1]);
    let counters = &outcomes[1].1;
    for series in ["EventRead 4", "Transaction 2", "DeleteSkipped 3"] {
        assert!(
            counters.iter().any(|l| l == series),
            "{series}: {counters:?}"
        );
    }
}

/// With dead letters, an outbox table the router cannot bind has its rows dead-lettered, its
/// DELETEs too, with their row: the source is not told to skim them. A DELETE read without its
/// row for a relation that has no binding skipping it cannot be handled: the session ends with
/// an error that reconnects (the next session reads it again, decoded).
#[test]
fn deletes_that_need_their_row_are_not_skimmed() {
    let router = default_routers();
    let prefixes = HashSet::new();
    let policy = ErrorPolicy::DeadLetter(DeadLetters::new(DEAD_LETTER_TOPIC.to_owned(), 1_000_000));
    let now = Now {
        instant: Instant::now(),
        wall: SystemTime::now(),
    };
    // No payload column: unbindable.
    let unbindable = {
        let mut relation = (*relation()).clone();
        relation.columns.retain(|c| c.name != "payload");
        Arc::new(relation)
    };
    for delete_without_row_of in [unbindable.id, 31_000] {
        let mut core = session_core(
            &router,
            &prefixes,
            &policy,
            Duration::from_secs(30),
            Lsn(0),
            None,
        );
        let after_binding = bind_outbox(&mut core, now, Arc::clone(&unbindable));
        assert!(
            !after_binding
                .iter()
                .any(|a| matches!(a, Action::SkipDeletes(_))),
            "{after_binding:?}"
        );
        for event in [
            SourceEvent::Begin {
                xid: 1,
                final_lsn: Lsn(100),
                commit_time_us: 0,
            },
            SourceEvent::Change {
                relation: Arc::clone(&unbindable),
                change: RowChange::Delete(pgoutput::OldTuple::Key(row(1, 1, false))),
                lsn: Lsn(95),
            },
        ] {
            core.handle(now, Input::Source(event));
        }
        let sent: Vec<(usize, RoutedRecord)> = std::iter::from_fn(|| core.poll_action())
            .filter_map(|action| match action {
                Action::Send { token, record } => Some((token, record)),
                _ => None,
            })
            .collect();
        assert_eq!(sent.len(), 1, "the DELETE is dead-lettered");
        assert_eq!(&*sent[0].1.topic, DEAD_LETTER_TOPIC);
        core.handle(
            now,
            Input::Delivery(Delivery {
                token: sent[0].0,
                generation: 0,
                result: Ok(Delivered {
                    partition: 0,
                    offset: 0,
                }),
            }),
        );

        core.handle(
            now,
            Input::Source(SourceEvent::OutboxDelete {
                relation_id: delete_without_row_of,
                lsn: Lsn(96),
            }),
        );
        let finished = std::iter::from_fn(|| core.poll_action()).find_map(|action| match action {
            Action::Finish(result) => Some(result),
            _ => None,
        });
        let Some(Err(error)) = finished else {
            panic!("the session ends with an error: {finished:?}");
        };
        assert!(error.is_transient(), "{error}");
        assert!(error.to_string().contains("without its old row"), "{error}");
        assert_eq!(core.watermark(), Lsn(0));
    }
}

/// An exactly-once core (Kafka transactions of at most 100 ms) that has handed over one record
/// of a transaction ending at 110, in a Kafka transaction it began: the record's token.
fn exactly_once_core_with_one_record<'a>(
    router: &'a Routers,
    prefixes: &'a HashSet<String>,
    now: Now,
) -> (SessionCore<'a>, usize) {
    let bounds = TransactionBounds {
        max_age: Duration::from_millis(100),
        max_bytes: 1_000_000,
    };
    let mut core = session_core(
        router,
        prefixes,
        &ErrorPolicy::Fail,
        Duration::from_secs(30),
        Lsn(0),
        Some((
            KafkaTransactions::new(bounds, Lsn(0), None),
            Default::default(),
        )),
    );
    bind_and_read_one_transaction(&mut core, now);
    assert!(matches!(core.poll_action(), Some(Action::BeginTransaction)));
    let Some(Action::Send { token, .. }) = core.poll_action() else {
        panic!("the record is sent in the Kafka transaction");
    };
    assert!(core.poll_action().is_none(), "no commit due yet");
    (core, token)
}

fn default_routers() -> Routers {
    Routers::new(
        EventRouter::new(
            RouterOptions::from_map(&BTreeMap::new()).expect("default options"),
            Format::default(),
        ),
        HashMap::new(),
    )
}

fn not_taken(token: usize) -> Input {
    let record = RoutedRecord {
        topic: "outbox.event.invoice".into(),
        key: None,
        value: None,
        headers: Vec::new(),
        timestamp_ms: None,
        partition: None,
    };
    Input::SendRefused {
        token,
        record,
        error: SinkError::Kafka {
            operation: Operation::CreateTopic,
            topic: "outbox.event.invoice".into(),
            code: RDKafkaErrorCode::OperationTimedOut,
        },
    }
}

/// Exactly-once: a record that never reached the producer (its topic's creation failed while
/// it waited) fails the session, and no commit follows: the transaction would commit without
/// the record, and its progress, covering it, would make the next session skip it.
#[test]
fn exactly_once_commits_nothing_after_a_record_was_not_taken() {
    let router = default_routers();
    let prefixes = HashSet::new();
    let t0 = Instant::now();
    let now = |ms| Now {
        instant: t0 + Duration::from_millis(ms),
        wall: SystemTime::now(),
    };
    let (mut core, token) = exactly_once_core_with_one_record(&router, &prefixes, now(0));
    core.handle(now(1), not_taken(token));
    assert!(!core.may_commit());
    // The Kafka transaction's age bound passes: still no commit.
    core.handle(now(500), Input::Tick);
    let actions: Vec<Action> = std::iter::from_fn(|| core.poll_action()).collect();
    assert!(
        actions.iter().all(|a| !matches!(a, Action::Commit(_))),
        "{actions:?}"
    );
    assert!(
        matches!(actions.last(), Some(Action::Finish(Err(e))) if e.is_transient()),
        "{actions:?}"
    );
    assert_eq!(core.watermark(), Lsn(0));

    // During a shutdown the commit is asked for at once; the record is then not taken: the
    // commit is no longer to run, and the shutdown ends with the failure.
    let (mut core, token) = exactly_once_core_with_one_record(&router, &prefixes, now(0));
    core.handle(now(1), Input::Shutdown);
    assert!(matches!(core.poll_action(), Some(Action::Commit(_))));
    core.handle(now(2), not_taken(token));
    assert!(!core.may_commit(), "the driver drops the commit it holds");
    let finished = std::iter::from_fn(|| core.poll_action()).find_map(|action| match action {
        Action::Finish(result) => Some(result),
        _ => None,
    });
    assert!(
        matches!(&finished, Some(Err(e)) if e.is_transient()),
        "{finished:?}"
    );

    // The record waits for its topic past the stop's deadline: the stop waits for the commit
    // alone. The record is then not taken: no commit, the session ends with the failure.
    let (mut core, token) = exactly_once_core_with_one_record(&router, &prefixes, now(0));
    core.handle(now(1), Input::Shutdown);
    assert!(matches!(core.poll_action(), Some(Action::Commit(_))));
    core.handle(now(31_000), Input::Tick);
    assert!(core.is_finished() && core.poll_action().is_none());
    core.handle(now(31_001), not_taken(token));
    assert!(!core.may_commit(), "the driver drops the commit it holds");
    let finished = std::iter::from_fn(|| core.poll_action()).find_map(|action| match action {
        Action::Finish(result) => Some(result),
        _ => None,
    });
    assert!(
        matches!(&finished, Some(Err(e)) if e.is_transient()),
        "{finished:?}"
    );
    assert_eq!(core.watermark(), Lsn(0));
}

/// Exactly-once: a record refused at enqueue during a shutdown (it waited for its topic) is
/// given up by the stopping flow without a dead letter: the transaction, whose progress counts
/// it, must not commit, and the session ends with the failure.
#[test]
fn exactly_once_a_record_refused_at_enqueue_during_a_shutdown_fails_it() {
    let router = default_routers();
    let prefixes = HashSet::new();
    let now = Now {
        instant: Instant::now(),
        wall: SystemTime::now(),
    };
    let (mut core, token) = exactly_once_core_with_one_record(&router, &prefixes, now);
    core.handle(now, Input::Shutdown);
    assert!(matches!(core.poll_action(), Some(Action::Commit(_))));
    let record = RoutedRecord {
        topic: "outbox.event.invoice".into(),
        key: None,
        value: None,
        headers: Vec::new(),
        timestamp_ms: None,
        partition: None,
    };
    core.handle(
        now,
        Input::SendRefused {
            token,
            record,
            error: SinkError::Kafka {
                operation: Operation::Enqueue,
                topic: "outbox.event.invoice".into(),
                code: RDKafkaErrorCode::MessageSizeTooLarge,
            },
        },
    );
    assert!(!core.may_commit(), "the driver drops the commit it holds");
    let finished = std::iter::from_fn(|| core.poll_action()).find_map(|action| match action {
        Action::Finish(result) => Some(result),
        _ => None,
    });
    assert!(
        matches!(&finished, Some(Err(e)) if e.is_transient()),
        "{finished:?}"
    );
}

/// Exactly-once: a commit that fails during a shutdown, before the last reports came, ends the
/// session with the failure once they came (it is not lost, and the stop does not wait for a
/// second commit outcome that never comes).
#[test]
fn exactly_once_a_commit_failed_during_a_shutdown_ends_it() {
    let router = default_routers();
    let prefixes = HashSet::new();
    let t0 = Instant::now();
    let now = Now {
        instant: t0,
        wall: SystemTime::now(),
    };
    let (mut core, token) = exactly_once_core_with_one_record(&router, &prefixes, now);
    core.handle(now, Input::Shutdown);
    assert!(matches!(core.poll_action(), Some(Action::Commit(_))));
    core.handle(
        now,
        Input::Committed(Err(SinkError::Transaction {
            operation: Operation::CommitTransaction,
            transactional_id: "t".into(),
            code: RDKafkaErrorCode::OperationTimedOut,
        })),
    );
    core.handle(
        now,
        Input::Delivery(Delivery {
            token,
            generation: 0,
            result: Ok(Delivered {
                partition: 0,
                offset: 0,
            }),
        }),
    );
    let finished = std::iter::from_fn(|| core.poll_action()).find_map(|action| match action {
        Action::Finish(result) => Some(result),
        _ => None,
    });
    assert!(
        matches!(&finished, Some(Err(e)) if e.is_transient()),
        "{finished:?}"
    );
    assert_eq!(core.watermark(), Lsn(0));
}

/// A transaction is timed from its commit to the moment the session reads its BEGIN
/// ([`Note::CommitToRead`], once per transaction) and, for each of its records, to Kafka's
/// acknowledgement ([`Note::CommitToAck`]); each record also from its hand-over to the
/// producer to that acknowledgement ([`Note::SendToAck`]). All on the clocks the core is
/// given.
#[test]
fn a_transaction_is_timed_from_its_commit_and_each_record_from_its_send() {
    let router = default_routers();
    let prefixes = HashSet::new();
    let mut recorder = Notes::default();
    let mut core = plain_core(&router, &prefixes);
    let commit_time_us = 800_000_000_000_000;
    let committed = pgoutput::pg_timestamp(commit_time_us);
    let start = Instant::now();
    let at = |after_commit| Now {
        instant: start + after_commit,
        wall: committed + after_commit,
    };
    let relation = relation();
    bind_outbox(&mut core, at(Duration::ZERO), Arc::clone(&relation));
    for event in [
        SourceEvent::Begin {
            xid: 1,
            final_lsn: Lsn(100),
            commit_time_us,
        },
        SourceEvent::Change {
            relation: Arc::clone(&relation),
            change: RowChange::Insert(row(1, 1, false)),
            lsn: Lsn(90),
        },
        SourceEvent::Change {
            relation: Arc::clone(&relation),
            change: RowChange::Insert(row(2, 1, false)),
            lsn: Lsn(95),
        },
        SourceEvent::Commit {
            commit_lsn: Lsn(100),
            end_lsn: Lsn(110),
            commit_time_us,
        },
    ] {
        core.handle(at(Duration::from_millis(7)), Input::Source(event));
    }
    let tokens: Vec<_> = std::iter::from_fn(|| core.poll_action())
        .filter_map(|action| match action {
            Action::Send { token, .. } => Some(token),
            _ => None,
        })
        .collect();
    assert_eq!(tokens.len(), 2);
    for token in tokens {
        core.handle(
            at(Duration::from_millis(40)),
            Input::Delivery(Delivery {
                token,
                generation: 0,
                result: Ok(Delivered {
                    partition: 0,
                    offset: 0,
                }),
            }),
        );
    }
    recorder.drain(&mut core);
    let ms = Duration::from_millis;
    let timed = |pick: fn(&Note) -> Option<Duration>| -> Vec<Duration> {
        recorder.0.iter().filter_map(pick).collect()
    };
    let read = timed(|n| match n {
        Note::CommitToRead(d) => Some(*d),
        _ => None,
    });
    let acked = timed(|n| match n {
        Note::CommitToAck(d) => Some(*d),
        _ => None,
    });
    let sent = timed(|n| match n {
        Note::SendToAck(d) => Some(*d),
        _ => None,
    });
    // Read at 7 ms, once for the transaction; acknowledged at 40 ms, each record.
    assert_eq!(read, [ms(7)], "{:?}", recorder.0);
    assert_eq!(acked, [ms(40), ms(40)], "{:?}", recorder.0);
    // Sent at 7 ms, acknowledged at 40 ms.
    assert_eq!(sent, [ms(33), ms(33)], "{:?}", recorder.0);
}
