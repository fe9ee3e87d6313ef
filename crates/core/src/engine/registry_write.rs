//! What a record in a registry format still needs from the schema registry before it is sent,
//! one question at a time, and what a refusal makes of its row. The stream's session and the
//! transfers (snapshots, re-sends) both go through it: one rule for both.
//!
//! A [`RegistryWrite`] is advanced against a [`SchemaCache`]: a step answered by the cache is
//! taken at once; the first one it cannot answer comes back as an [`Ask`] for the caller to put
//! to the registry, whose answer goes into the cache ([`RegistryWrite::answered`]) before the
//! write is advanced again. The key's id is asked first, then the value's.
//!
//! # Invariants
//! - A record comes out ([`Step::Ready`]) only with every placeholder id replaced and a
//!   registered-schema value written: never half written.
//! - The cache holds at most [`SCHEMA_CACHE_CAPACITY`] ids and as many latest schemas; full, it
//!   is emptied (each entry is asked again once).
//! - A latest schema is used for at most the cache's time to live after it was fetched.
//! - [`Refusal::dead_letterable`] is the one rule for whether `pipeline.on_error =
//!   "dead-letter"` applies to a refusal.
//! - No IO and no clock: time comes in as a parameter.

use rustc_hash::FxHashMap;
use siphon_record::registered::{
    key_subject, misfit_reason, refusal_reason, with_schema_id, SchemaAsk, SubjectStrategy,
};
use siphon_record::{RegistrySchema, RegistrySchemaKind, RoutedRecord};
use siphon_router::{Misfit, RegisteredSchema, RegistryRecord, RegistryValue};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How many schema ids, and how many latest schemas, a [`SchemaCache`] keeps.
pub const SCHEMA_CACHE_CAPACITY: usize = 1000;

/// Which side of a record a schema is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordPart {
    /// The key, registered under `<topic>-key`.
    Key,
    /// The value, registered under `<topic>-value`.
    Value,
}

/// A topic and, with a record name strategy, the record's name: what a value subject is
/// named after.
type SubjectOf = (Arc<str>, Option<Arc<str>>);

/// What the registry has answered so far: schema ids, and the latest schemas of subjects.
#[derive(Debug)]
pub struct SchemaCache {
    ids: FxHashMap<(Arc<str>, RecordPart, RegistrySchema), u32>,
    latest: FxHashMap<SubjectOf, (Arc<RegisteredSchema>, Instant)>,
    latest_ttl: Duration,
    strategy: SubjectStrategy,
}

impl SchemaCache {
    /// An empty cache whose latest schemas are used for `latest_ttl` after they are fetched,
    /// for value subjects named by `strategy`.
    pub fn new(latest_ttl: Duration, strategy: SubjectStrategy) -> Self {
        SchemaCache {
            ids: FxHashMap::default(),
            latest: FxHashMap::default(),
            latest_ttl,
            strategy,
        }
    }

    /// The subject of `part` of a record of `topic` named `record_name`: `<topic>-key` for
    /// keys, the strategy's subject for values.
    fn subject(&self, part: RecordPart, topic: &str, record_name: Option<&str>) -> String {
        match part {
            RecordPart::Key => key_subject(topic),
            RecordPart::Value => self.strategy.value_subject(topic, record_name),
        }
    }

    fn id(&self, topic: &Arc<str>, part: RecordPart, schema: &RegistrySchema) -> Option<u32> {
        self.ids
            .get(&(Arc::clone(topic), part, schema.clone()))
            .copied()
    }

    fn latest(
        &self,
        subject: &SubjectOf,
        kind: RegistrySchemaKind,
        now: Instant,
    ) -> Option<Arc<RegisteredSchema>> {
        self.latest
            .get(subject)
            .filter(|(schema, fetched)| {
                schema.kind() == kind && now.saturating_duration_since(*fetched) <= self.latest_ttl
            })
            .map(|(schema, _)| Arc::clone(schema))
    }

    fn learn_id(&mut self, topic: Arc<str>, part: RecordPart, schema: RegistrySchema, id: u32) {
        if self.ids.len() >= SCHEMA_CACHE_CAPACITY {
            self.ids.clear();
        }
        self.ids.insert((topic, part, schema), id);
    }

    fn learn_latest(&mut self, subject: SubjectOf, schema: Arc<RegisteredSchema>, now: Instant) {
        if self.latest.len() >= SCHEMA_CACHE_CAPACITY {
            self.latest.clear();
        }
        self.latest.insert(subject, (schema, now));
    }
}

/// A question for the registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    /// The id of `schema` under `subject`, registering it when new.
    SchemaId {
        subject: String,
        schema: RegistrySchema,
    },
    /// The latest schema registered under `subject`.
    LatestSchema { subject: String },
}

/// The registry's answer to an [`Ask`], or its refusal `R`.
#[derive(Debug)]
pub enum Answered<R> {
    /// To [`Ask::SchemaId`].
    SchemaId(Result<u32, R>),
    /// To [`Ask::LatestSchema`]: the id, kind and text of the schema.
    LatestSchema(Result<(u32, RegistrySchemaKind, Arc<str>), R>),
}

/// Why a record in a registry format is not sent.
#[derive(Debug)]
pub enum Refusal<R> {
    /// The registry refused what was asked under `subject`.
    Registry {
        ask: SchemaAsk,
        subject: String,
        error: R,
    },
    /// The payload does not fit the schema registered under `subject`.
    Misfit { subject: String, error: Misfit },
    /// The latest schema of `subject` cannot write values of this format (another kind, or
    /// one that cannot be read): no payload of the subject can be written.
    Unreadable { subject: String, error: Misfit },
}

impl<R: std::fmt::Display> Refusal<R> {
    /// Whether `pipeline.on_error = "dead-letter"` sends the row to the dead-letter topic: a
    /// schema the registry refuses (per `schema_refused`) and a payload that does not fit; never
    /// a refusal of Siphon itself (credentials, the URL) nor a subject whose schema cannot be
    /// read, which no row escapes.
    pub fn dead_letterable(&self, schema_refused: impl Fn(&R) -> bool) -> bool {
        match self {
            Refusal::Registry { error, .. } => schema_refused(error),
            Refusal::Misfit { .. } => true,
            Refusal::Unreadable { .. } => false,
        }
    }

    /// Whether the payload did not fit the schema registered for it (what
    /// `siphon_schema_misfits_total` counts).
    pub fn is_misfit(&self) -> bool {
        matches!(self, Refusal::Misfit { .. })
    }

    /// The subject the refusal is about.
    pub fn subject(&self) -> &str {
        match self {
            Refusal::Registry { subject, .. }
            | Refusal::Misfit { subject, .. }
            | Refusal::Unreadable { subject, .. } => subject,
        }
    }
}

impl<R: std::fmt::Display> std::fmt::Display for Refusal<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Registry {
                ask,
                subject,
                error,
            } => f.write_str(&refusal_reason(*ask, subject, error)),
            Refusal::Misfit { subject, error } | Refusal::Unreadable { subject, error } => {
                f.write_str(&misfit_reason(subject, error))
            }
        }
    }
}

/// Where [`RegistryWrite::advance`] got to.
#[derive(Debug)]
pub enum Step<R> {
    /// Written: the record to send.
    Ready(RoutedRecord),
    /// The write waits for the registry's answer to the ask.
    Waiting(RegistryWrite, Ask),
    /// The record cannot be written.
    Refused(Refusal<R>),
}

/// A record on its way through the registry.
#[derive(Debug)]
pub struct RegistryWrite {
    record: RoutedRecord,
    key: Option<RegistrySchema>,
    value: RegistryValue,
    record_name: Option<Arc<str>>,
    /// What was last asked, for [`RegistryWrite::answered`].
    asked: Option<(RecordPart, Option<RegistrySchema>)>,
}

impl RegistryWrite {
    /// The write of a routed record in a registry format.
    pub fn new(routed: RegistryRecord) -> Self {
        RegistryWrite {
            record: routed.record,
            key: routed.key,
            value: routed.value,
            record_name: routed.record_name,
            asked: None,
        }
    }

    /// The record's topic.
    pub fn topic(&self) -> &str {
        &self.record.topic
    }

    /// Takes every step `cache` answers: the record once written, else the first question
    /// for the registry, or why the record cannot be written.
    pub fn advance<R>(mut self, cache: &SchemaCache, now: Instant) -> Step<R> {
        if let Some(schema) = self.key.take() {
            match cache.id(&self.record.topic, RecordPart::Key, &schema) {
                Some(id) => {
                    self.record.key = self.record.key.take().map(|k| with_schema_id(k, id));
                }
                None => {
                    let ask = Ask::SchemaId {
                        subject: cache.subject(RecordPart::Key, &self.record.topic, None),
                        schema: schema.clone(),
                    };
                    self.asked = Some((RecordPart::Key, Some(schema.clone())));
                    self.key = Some(schema);
                    return Step::Waiting(self, ask);
                }
            }
        }
        match std::mem::replace(&mut self.value, RegistryValue::AsIs) {
            RegistryValue::AsIs => Step::Ready(self.record),
            RegistryValue::Derived(schema) => {
                match cache.id(&self.record.topic, RecordPart::Value, &schema) {
                    Some(id) => {
                        self.record.value = self.record.value.take().map(|v| with_schema_id(v, id));
                        Step::Ready(self.record)
                    }
                    None => {
                        let ask = Ask::SchemaId {
                            subject: cache.subject(RecordPart::Value, &self.record.topic, None),
                            schema: schema.clone(),
                        };
                        self.asked = Some((RecordPart::Value, Some(schema.clone())));
                        self.value = RegistryValue::Derived(schema);
                        Step::Waiting(self, ask)
                    }
                }
            }
            RegistryValue::Registered(kind) => match cache.latest(&self.subject_of(), kind, now) {
                Some(schema) => self.written_with(cache, &schema),
                None => {
                    let ask = Ask::LatestSchema {
                        subject: cache.subject(
                            RecordPart::Value,
                            &self.record.topic,
                            self.record_name.as_deref(),
                        ),
                    };
                    self.asked = Some((RecordPart::Value, None));
                    self.value = RegistryValue::Registered(kind);
                    Step::Waiting(self, ask)
                }
            },
        }
    }

    /// What the value's subject is named after.
    fn subject_of(&self) -> SubjectOf {
        (Arc::clone(&self.record.topic), self.record_name.clone())
    }

    /// The payload written with `schema`; a NULL payload stays a null value.
    fn written_with<R>(mut self, cache: &SchemaCache, schema: &RegisteredSchema) -> Step<R> {
        let Some(payload) = self.record.value.take() else {
            return Step::Ready(self.record);
        };
        match schema.encode(&payload) {
            Ok(written) => {
                self.record.value = Some(written.into());
                Step::Ready(self.record)
            }
            Err(error) => Step::Refused(Refusal::Misfit {
                subject: cache.subject(
                    RecordPart::Value,
                    &self.record.topic,
                    self.record_name.as_deref(),
                ),
                error,
            }),
        }
    }

    /// The registry's answer to the last [`Ask`] of [`RegistryWrite::advance`], kept in
    /// `cache` (fetched at `now`); advance the write again after it.
    ///
    /// # Errors
    /// The registry's refusal; a latest schema of another kind than the value's format, or
    /// one that cannot be read.
    pub fn answered<R>(
        mut self,
        cache: &mut SchemaCache,
        now: Instant,
        answer: Answered<R>,
    ) -> Result<Self, Refusal<R>> {
        let (part, schema) = self.asked.take().unwrap_or((RecordPart::Value, None));
        let record_name = match part {
            RecordPart::Key => None,
            RecordPart::Value => self.record_name.as_deref(),
        };
        let subject = cache.subject(part, &self.record.topic, record_name);
        let topic: Arc<str> = Arc::clone(&self.record.topic);
        match answer {
            Answered::SchemaId(Err(error)) => Err(Refusal::Registry {
                ask: SchemaAsk::Register,
                subject,
                error,
            }),
            Answered::LatestSchema(Err(error)) => Err(Refusal::Registry {
                ask: SchemaAsk::Latest,
                subject,
                error,
            }),
            Answered::SchemaId(Ok(id)) => {
                if let Some(schema) = schema {
                    cache.learn_id(topic, part, schema, id);
                }
                Ok(self)
            }
            Answered::LatestSchema(Ok((id, kind, text))) => {
                let expected = match self.value {
                    RegistryValue::Registered(expected) => expected,
                    _ => kind,
                };
                let parsed = if expected == kind {
                    RegisteredSchema::parse(kind, id, &text)
                } else {
                    Err(Misfit {
                        id,
                        reason: format!(
                            "the subject holds a {kind:?} schema, and the value format writes {expected:?}"
                        ),
                    })
                };
                match parsed {
                    Ok(schema) => {
                        cache.learn_latest(self.subject_of(), Arc::new(schema), now);
                        Ok(self)
                    }
                    Err(error) => Err(Refusal::Unreadable { subject, error }),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use siphon_record::registered::unframed_value;

    const EVENT: &str = r#"{"type":"record","name":"Event","fields":[{"name":"n","type":"long"}]}"#;

    fn schema(text: &str) -> RegistrySchema {
        RegistrySchema::new(RegistrySchemaKind::Avro, Arc::from(text))
    }

    fn record(value: Option<Bytes>) -> RoutedRecord {
        RoutedRecord {
            topic: Arc::from("orders"),
            key: Some(unframed_value(b"k")),
            value,
            headers: Vec::new(),
            timestamp_ms: None,
            partition: None,
        }
    }

    fn waiting(step: Step<String>) -> (RegistryWrite, Ask) {
        match step {
            Step::Waiting(write, ask) => (write, ask),
            other => panic!("expected a question, got {other:?}"),
        }
    }

    #[test]
    fn the_key_id_is_asked_first_then_the_value_id_and_both_are_written() {
        let now = Instant::now();
        let mut cache = SchemaCache::new(Duration::from_secs(60), SubjectStrategy::Topic);
        let routed = RegistryRecord {
            record: record(Some(unframed_value(b"v"))),
            key: Some(schema("\"string\"")),
            value: RegistryValue::Derived(schema("\"bytes\"")),
            record_name: None,
        };
        let (write, ask) = waiting(RegistryWrite::new(routed.clone()).advance(&cache, now));
        assert_eq!(
            ask,
            Ask::SchemaId {
                subject: "orders-key".into(),
                schema: schema("\"string\"")
            }
        );
        let write = write
            .answered(&mut cache, now, Answered::<String>::SchemaId(Ok(7)))
            .expect("an id");
        let (write, ask) = waiting(write.advance(&cache, now));
        assert!(matches!(&ask, Ask::SchemaId { subject, .. } if subject == "orders-value"));
        let write = write
            .answered(&mut cache, now, Answered::<String>::SchemaId(Ok(9)))
            .expect("an id");
        let Step::<String>::Ready(sent) = write.advance(&cache, now) else {
            panic!("written");
        };
        assert_eq!(sent.key.as_deref(), Some(&b"\0\0\0\0\x07k"[..]));
        assert_eq!(sent.value.as_deref(), Some(&b"\0\0\0\0\x09v"[..]));
        // The next record of the same schemas needs no question.
        let Step::<String>::Ready(again) = RegistryWrite::new(routed).advance(&cache, now) else {
            panic!("answered by the cache");
        };
        assert_eq!(again, sent);
    }

    #[test]
    fn a_latest_schema_is_used_for_its_time_to_live_then_asked_again() {
        let now = Instant::now();
        let ttl = Duration::from_secs(60);
        let mut cache = SchemaCache::new(ttl, SubjectStrategy::Topic);
        let routed = RegistryRecord {
            record: record(Some(Bytes::from_static(br#"{"n": 1}"#))),
            key: None,
            value: RegistryValue::Registered(RegistrySchemaKind::Avro),
            record_name: None,
        };
        let (write, ask) = waiting(RegistryWrite::new(routed.clone()).advance(&cache, now));
        assert_eq!(
            ask,
            Ask::LatestSchema {
                subject: "orders-value".into()
            }
        );
        let answer =
            Answered::<String>::LatestSchema(Ok((3, RegistrySchemaKind::Avro, EVENT.into())));
        let write = write.answered(&mut cache, now, answer).expect("readable");
        let Step::<String>::Ready(sent) = write.advance(&cache, now) else {
            panic!("written");
        };
        assert_eq!(sent.value.as_deref(), Some(&b"\0\0\0\0\x03\x02"[..]));
        assert!(matches!(
            RegistryWrite::new(routed.clone()).advance::<String>(&cache, now + ttl),
            Step::Ready(_)
        ));
        waiting(RegistryWrite::new(routed).advance(&cache, now + ttl + Duration::from_millis(1)));
    }

    #[test]
    fn misfits_and_schema_refusals_are_dead_letterable_unreadable_subjects_and_other_refusals_not()
    {
        let now = Instant::now();
        let mut cache = SchemaCache::new(Duration::from_secs(60), SubjectStrategy::Topic);
        let registered = |payload: &'static [u8]| RegistryRecord {
            record: record(Some(Bytes::from_static(payload))),
            key: None,
            value: RegistryValue::Registered(RegistrySchemaKind::Avro),
            record_name: None,
        };
        let (write, _) = waiting(RegistryWrite::new(registered(b"{}")).advance(&cache, now));
        let json = Answered::<String>::LatestSchema(Ok((3, RegistrySchemaKind::Json, "{}".into())));
        let refusal = write
            .answered(&mut cache, now, json)
            .expect_err("a JSON Schema");
        assert!(matches!(refusal, Refusal::Unreadable { .. }));
        assert!(!refusal.dead_letterable(|_| true));

        let (write, _) = waiting(RegistryWrite::new(registered(b"{}")).advance(&cache, now));
        let avro =
            Answered::<String>::LatestSchema(Ok((3, RegistrySchemaKind::Avro, EVENT.into())));
        let write = write.answered(&mut cache, now, avro).expect("readable");
        let Step::Refused(misfit) = write.advance::<String>(&cache, now) else {
            panic!("no n: a misfit");
        };
        assert!(misfit.dead_letterable(|_| false));
        assert!(misfit.to_string().contains("orders-value"), "{misfit}");

        let (write, _) = waiting(
            RegistryWrite::new(RegistryRecord {
                record: record(None),
                key: Some(schema("\"string\"")),
                value: RegistryValue::AsIs,
                record_name: None,
            })
            .advance(&cache, now),
        );
        let refused = write
            .answered(&mut cache, now, Answered::SchemaId(Err("409".to_owned())))
            .expect_err("refused");
        assert_eq!(refused.subject(), "orders-key");
        assert!(refused.dead_letterable(|e: &String| e == "409"));
        assert!(!refused.dead_letterable(|e: &String| e == "401"));
    }

    #[test]
    fn with_a_record_name_strategy_each_event_type_has_its_subject_and_its_schema() {
        let now = Instant::now();
        let mut cache = SchemaCache::new(Duration::from_secs(60), SubjectStrategy::TopicRecord);
        let typed = |name: &str| RegistryRecord {
            record: record(Some(Bytes::from_static(br#"{"n": 1}"#))),
            key: None,
            value: RegistryValue::Registered(RegistrySchemaKind::Avro),
            record_name: Some(Arc::from(name)),
        };
        let (write, ask) = waiting(RegistryWrite::new(typed("OrderCreated")).advance(&cache, now));
        assert_eq!(
            ask,
            Ask::LatestSchema {
                subject: "orders-OrderCreated".into()
            }
        );
        let answer =
            Answered::<String>::LatestSchema(Ok((3, RegistrySchemaKind::Avro, EVENT.into())));
        let write = write.answered(&mut cache, now, answer).expect("readable");
        assert!(matches!(
            write.advance::<String>(&cache, now),
            Step::Ready(_)
        ));
        let (_, ask) = waiting(RegistryWrite::new(typed("OrderShipped")).advance(&cache, now));
        assert_eq!(
            ask,
            Ask::LatestSchema {
                subject: "orders-OrderShipped".into()
            },
            "another type, another subject"
        );
        let mut by_record = SchemaCache::new(Duration::from_secs(60), SubjectStrategy::Record);
        let (write, ask) =
            waiting(RegistryWrite::new(typed("OrderCreated")).advance(&by_record, now));
        assert_eq!(
            ask,
            Ask::LatestSchema {
                subject: "OrderCreated".into()
            }
        );
        let refused = write
            .answered(
                &mut by_record,
                now,
                Answered::LatestSchema(Err("404".to_owned())),
            )
            .expect_err("no subject");
        assert_eq!(refused.subject(), "OrderCreated");
    }
}
