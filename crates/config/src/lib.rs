//! `siphon.toml`: the user's configuration, with environment overrides. The crate's one job is
//! to read the file and the environment into a checked [`Config`]; it connects to nothing, and
//! the binary turns the [`Config`] into the pieces the pipeline runs with.
//!
//! Doc comments on the fields below are the reference for every key (docs/configuration.md
//! lists them; a test keeps the two in step).
//!
//! # Invariants
//! - Unknown keys are an error naming the key; missing required keys name what is missing.
//! - Every key can be overridden by an environment variable `SIPHON_<SECTION>_<KEY>`.
//! - Every integer key is within its range ([`ranges::RANGES`]), checked before anything else
//!   reads it.

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

pub mod ranges;

/// Rows read per chunk by default (`source.snapshot_chunk_rows`).
pub const DEFAULT_SNAPSHOT_CHUNK_ROWS: usize = 1000;

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where the events come from.
    pub source: SourceSection,
    /// Where the records go.
    pub kafka: KafkaSection,
    /// Debezium Outbox Event Router options, under their Debezium names.
    #[serde(default)]
    pub router: BTreeMap<String, toml::Value>,
    /// How keys and values are encoded.
    #[serde(default)]
    pub format: FormatSection,
    /// CloudEvents (Kafka protocol binding 1.0).
    #[serde(default)]
    pub cloudevents: CloudEventsSection,
    /// W3C trace context carried from outbox columns to record headers.
    #[serde(default)]
    pub trace: TraceSection,
    /// Flow control and shutdown.
    #[serde(default)]
    pub pipeline: PipelineSection,
    /// Logging.
    #[serde(default)]
    pub log: LogSection,
    /// The Prometheus and health endpoint.
    #[serde(default)]
    pub metrics: MetricsSection,
    /// The schema registry of the `avro` value format.
    #[serde(default)]
    pub schema_registry: SchemaRegistrySection,
}

/// `[schema_registry]`: the Confluent-compatible schema registry (Confluent's, Apicurio's
/// `/apis/ccompat/v7`) that `format.value = "avro"` registers its schemas with.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaRegistrySection {
    /// The registry's URL (`http://` or `https://`, with the API's base path); empty: none.
    #[serde(default)]
    pub url: String,
    /// Basic auth user; empty: no auth.
    #[serde(default)]
    pub username: String,
    /// Basic auth password.
    #[serde(default)]
    pub password: String,
    /// PEM file of the CA certificates to trust (`https`); empty: the public CAs.
    #[serde(default)]
    pub ssl_ca_location: String,
    /// The client certificate (PEM), with `ssl_key_location`.
    #[serde(default)]
    pub ssl_certificate_location: String,
    /// The client certificate's unencrypted key (PEM).
    #[serde(default)]
    pub ssl_key_location: String,
    /// How long one request may take.
    #[serde(default = "default_registry_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// `derived` (default): each value's schema is made from it, as Debezium's converters do,
    /// and registered; `registered`: each payload is checked against and written with the
    /// latest schema registered for its topic's values.
    #[serde(default)]
    pub schemas: SchemaSource,
    /// With `schemas = "registered"`: how long a subject's latest schema is used before the
    /// registry is asked again (a new version is picked up within this time).
    #[serde(default = "default_latest_ttl_secs")]
    pub latest_ttl_secs: u64,
    /// How value subjects are named: `topic` (default, `<topic>-value`), `topic-record`
    /// (`<topic>-<event type>`) or `record` (`<event type>`); the record name strategies need
    /// `schemas = "registered"`.
    #[serde(default)]
    pub subject_name_strategy: SubjectNameStrategy,
    /// With `schemas = "registered"`: subjects whose values are written with the version
    /// given here (1 or more), not with the subject's latest.
    #[serde(default)]
    pub versions: BTreeMap<String, i64>,
}

/// `schema_registry.subject_name_strategy`: the serializers' subject name strategies, the
/// record name being the event type column's value.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum SubjectNameStrategy {
    /// `TopicNameStrategy`: `<topic>-value`.
    #[default]
    Topic,
    /// `TopicRecordNameStrategy`: `<topic>-<event type>`.
    TopicRecord,
    /// `RecordNameStrategy`: `<event type>`.
    Record,
}

/// Where the schemas of `avro` values come from.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum SchemaSource {
    /// Made from each value, as Debezium's converters make them, and registered.
    #[default]
    Derived,
    /// The latest registered for the topic's values; payloads that do not fit are refused.
    Registered,
}

fn default_latest_ttl_secs() -> u64 {
    60
}

impl Default for SchemaRegistrySection {
    fn default() -> Self {
        SchemaRegistrySection {
            url: String::new(),
            username: String::new(),
            password: String::new(),
            ssl_ca_location: String::new(),
            ssl_certificate_location: String::new(),
            ssl_key_location: String::new(),
            request_timeout_ms: default_registry_request_timeout_ms(),
            schemas: SchemaSource::Derived,
            latest_ttl_secs: default_latest_ttl_secs(),
            subject_name_strategy: SubjectNameStrategy::Topic,
            versions: BTreeMap::new(),
        }
    }
}

fn default_registry_request_timeout_ms() -> u64 {
    30_000
}

/// `[metrics]`: `/metrics` (Prometheus), `/health` (liveness), `/ready` (readiness).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    /// Serve the endpoint.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Address to listen on (`host:port`; port 0 picks a free one, logged at start).
    #[serde(default = "default_metrics_listen")]
    pub listen: String,
}

impl Default for MetricsSection {
    fn default() -> Self {
        MetricsSection {
            enabled: true,
            listen: default_metrics_listen(),
        }
    }
}

fn default_metrics_listen() -> String {
    "127.0.0.1:9187".into()
}

/// `[source]`: the PostgreSQL side.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSection {
    /// PostgreSQL URL, e.g. `postgres://siphon:secret@127.0.0.1:5432/app`. Required.
    pub url: String,
    /// Logical replication slot; created with the pgoutput plugin if missing.
    #[serde(default = "default_slot")]
    pub slot: String,
    /// Publication; created `FOR TABLE <tables>` if missing.
    #[serde(default = "default_publication")]
    pub publication: String,
    /// Outbox tables, `schema.table` (schema `public` if omitted).
    #[serde(default = "default_tables")]
    pub tables: Vec<String>,
    /// How often, at most, the confirmed position is reported to PostgreSQL, in milliseconds.
    #[serde(default = "default_status_interval_ms")]
    pub status_interval_ms: u64,
    /// `application_name` of Siphon's connections (shown in `pg_stat_replication`).
    #[serde(default = "default_application_name")]
    pub application_name: String,
    /// A replication connection that receives nothing for this long, in seconds, while the
    /// server has newer WAL, is considered stalled and reconnected.
    #[serde(default = "default_stall_timeout_secs")]
    pub stall_timeout_secs: u64,
    /// Prefixes of transactional logical decoding messages
    /// (`pg_logical_emit_message(true, prefix, content)`) whose content is an outbox event.
    #[serde(default)]
    pub message_prefixes: Vec<String>,
    /// What to do with a non-transactional message of one of those prefixes (not atomic with
    /// the business change): `error` (default) or `skip` (with a warning).
    #[serde(default)]
    pub non_transactional_messages: NonTransactional,
    /// Keep the slot as a failover slot (PostgreSQL 17+), so that a physical standby with
    /// `sync_replication_slots = on` holds a synchronized copy to resume from after a failover.
    #[serde(default)]
    pub failover: bool,
    // -- Initial snapshot and re-sends (the binary's `snapshot` and `signal` modules) --
    /// `never` (default) or `initial`: when Siphon creates the slot, send the rows already in
    /// the outbox tables (those matching `snapshot_filter`) before streaming.
    #[serde(default)]
    pub snapshot: SnapshotMode,
    /// SQL condition the initial snapshot reads the rows of every outbox table with, e.g.
    /// `published_at IS NULL`; empty: every row.
    #[serde(default)]
    pub snapshot_filter: String,
    /// Rows read (and acknowledged) per chunk by the initial snapshot and by `siphon resend`.
    #[serde(default = "default_snapshot_chunk_rows")]
    pub snapshot_chunk_rows: usize,
    /// Per outbox table (`"schema.table"`): a `filter` replacing `snapshot_filter` and the
    /// `order_by` columns rows are read in (then the primary key).
    #[serde(default)]
    pub snapshot_tables: BTreeMap<String, SnapshotTableSection>,
    /// A table (`schema.table`) of Debezium's signalling shape (`id`, `type`, `data`) whose
    /// `execute-snapshot` rows ask the running Siphon for a re-send; `""`: none.
    #[serde(default)]
    pub signal_table: String,
}

/// `source.snapshot`.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotMode {
    /// Stream only what is committed after the slot exists.
    #[default]
    Never,
    /// Send the rows in the outbox tables when Siphon creates the slot, then stream.
    Initial,
}

/// `[source.snapshot_tables."schema.table"]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SnapshotTableSection {
    /// Replaces `source.snapshot_filter` for this table (`""`: every row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Unique NOT NULL columns to read the rows in, before the primary key's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub order_by: Vec<String>,
}

fn default_snapshot_chunk_rows() -> usize {
    DEFAULT_SNAPSHOT_CHUNK_ROWS
}

/// `source.non_transactional_messages`.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum NonTransactional {
    /// Stop with an error naming the fix.
    #[default]
    Error,
    /// Skip it with a warning, counted.
    Skip,
}

/// `[kafka]`: the broker side.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSection {
    /// Comma-separated `host:port` list. Required.
    pub bootstrap_servers: String,
    /// Any librdkafka property, passed through (`enable.idempotence` and `acks` are fixed).
    #[serde(default)]
    pub properties: BTreeMap<String, toml::Value>,
    /// How Siphon creates output topics that do not exist yet.
    #[serde(default)]
    pub topic_creation: TopicCreationSection,
    /// `kafka` (default) sends records to the brokers. `discard` acknowledges every record at
    /// once without sending it, to measure the rest of the pipeline: never use it for real, the
    /// slot moves past records that went nowhere.
    #[serde(default)]
    pub sink: SinkKind,
    /// A compacted topic where Siphon keeps what it must know across restarts (the
    /// publication's membership as last seen); "" keeps nothing, and a publication gap that
    /// opens and closes while Siphon is stopped then goes unnoticed.
    #[serde(default = "default_state_topic")]
    pub state_topic: String,
    /// `at-least-once` (default) or `exactly-once` (a transactional producer; see
    /// docs/reliability.md).
    #[serde(default)]
    pub delivery: DeliveryMode,
    /// Exactly-once: the producer's `transactional.id`; "" (default) derives it from the
    /// server's system identifier, the database and the slot.
    #[serde(default)]
    pub transactional_id: String,
    /// Exactly-once: the compacted topic where each Kafka transaction ends with the progress it
    /// commits.
    #[serde(default = "default_progress_topic")]
    pub progress_topic: String,
    /// Exactly-once: a Kafka transaction is committed once it has been open this long
    /// (between PostgreSQL transactions).
    #[serde(default = "default_transaction_interval_ms")]
    pub transaction_interval_ms: u64,
    /// Exactly-once: ... or once its records reach this many bytes.
    #[serde(default = "default_transaction_max_bytes")]
    pub transaction_max_bytes: usize,
}

fn default_state_topic() -> String {
    "siphon.state".into()
}

fn default_progress_topic() -> String {
    "siphon.progress".into()
}

fn default_transaction_interval_ms() -> u64 {
    100
}

fn default_transaction_max_bytes() -> usize {
    16 * 1024 * 1024
}

/// `kafka.delivery`.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DeliveryMode {
    /// Every event reaches Kafka at least once; repeats after failures carry the same event id.
    #[default]
    AtLeastOnce,
    /// Kafka transactions: a read_committed consumer sees every event once.
    ExactlyOnce,
}

/// `kafka.sink`.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// Send records to Kafka.
    #[default]
    Kafka,
    /// Acknowledge records without sending them (benchmarks only).
    Discard,
}

/// `[kafka.topic_creation]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TopicCreationSection {
    /// Create missing output topics before the first record is sent to them.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Partitions of a created topic; -1 takes the broker's default.
    #[serde(default = "minus_one")]
    pub partitions: i32,
    /// Replication factor of a created topic; -1 takes the broker's default.
    #[serde(default = "minus_one")]
    pub replication_factor: i32,
}

impl Default for TopicCreationSection {
    fn default() -> Self {
        TopicCreationSection {
            enabled: true,
            partitions: -1,
            replication_factor: -1,
        }
    }
}

/// The encoding of keys or values.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum EncodingName {
    /// As Kafka Connect's JsonConverter with `schemas.enable=false`.
    #[default]
    Json,
    /// As Kafka Connect's StringConverter.
    String,
    /// As Kafka Connect's JsonConverter with `schemas.enable=true`: `{"schema":...,"payload":...}`.
    #[serde(rename = "json-schemas")]
    JsonSchemas,
    /// As Debezium's BinaryDataConverter: a `bytea` payload written as raw bytes.
    Binary,
    /// Values only: the `siphon.outbox.v1.OutboxEvent` message of `proto/siphon/outbox/v1/event.proto`.
    Protobuf,
    /// As a schema-registry Avro converter (Confluent's `AvroConverter`), the schema
    /// registered with `[schema_registry]`: for values, and for keys.
    Avro,
    /// Values only: the payload's JSON, checked against the JSON Schema registered for it
    /// (`schema_registry.schemas = "registered"`) and framed with its id, as Confluent's JSON
    /// Schema serializer writes it.
    #[serde(rename = "json-sr")]
    JsonSr,
}

/// `[format]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FormatSection {
    /// Key encoding: `json` (default), `json-schemas`, `string` or `binary`.
    #[serde(default)]
    pub key: EncodingName,
    /// Value encoding: `json` (default), `json-schemas`, `string`, `binary` or `protobuf`.
    #[serde(default)]
    pub value: EncodingName,
    /// The Java version of the Kafka Connect worker being replaced: floating-point numbers are
    /// printed as its `Double.toString` prints them (Java 18 and earlier differ). Default 21.
    #[serde(default = "default_java_version")]
    pub java_version: u32,
    /// Every record also carries its source position as headers: `siphon.source` (server and
    /// slot) and `siphon.position` (commit LSN and index in the transaction, as text that
    /// sorts as positions do), for consumers that drop repeats. `auto` (default): on with
    /// exactly-once delivery, off with at-least-once (Debezium's records carry neither).
    #[serde(default)]
    pub position_headers: PositionHeadersSetting,
}

fn default_java_version() -> u32 {
    21
}

impl Default for FormatSection {
    fn default() -> Self {
        FormatSection {
            key: EncodingName::default(),
            value: EncodingName::default(),
            java_version: default_java_version(),
            position_headers: PositionHeadersSetting::default(),
        }
    }
}

/// `format.position_headers`: `true`, `false` or `"auto"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PositionHeadersSetting {
    /// On with exactly-once delivery, off with at-least-once.
    #[default]
    Auto,
    On,
    Off,
}

impl PositionHeadersSetting {
    /// Whether records carry the headers under `delivery`.
    pub fn enabled(self, delivery: DeliveryMode) -> bool {
        match self {
            PositionHeadersSetting::Auto => delivery == DeliveryMode::ExactlyOnce,
            PositionHeadersSetting::On => true,
            PositionHeadersSetting::Off => false,
        }
    }
}

impl Serialize for PositionHeadersSetting {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            PositionHeadersSetting::Auto => serializer.serialize_str("auto"),
            PositionHeadersSetting::On => serializer.serialize_bool(true),
            PositionHeadersSetting::Off => serializer.serialize_bool(false),
        }
    }
}

impl<'de> Deserialize<'de> for PositionHeadersSetting {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Flag(bool),
            Word(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Flag(true) => Ok(PositionHeadersSetting::On),
            Raw::Flag(false) => Ok(PositionHeadersSetting::Off),
            Raw::Word(word) => match word.as_str() {
                "auto" => Ok(PositionHeadersSetting::Auto),
                "true" => Ok(PositionHeadersSetting::On),
                "false" => Ok(PositionHeadersSetting::Off),
                other => Err(serde::de::Error::custom(format!(
                    "format.position_headers = {other:?}: expected true, false or \"auto\""
                ))),
            },
        }
    }
}

/// `cloudevents.mode`.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum CloudEventsModeName {
    /// No CloudEvents.
    #[default]
    Off,
    /// Attributes as `ce_*` headers, the value as the value format writes it.
    Binary,
    /// The whole event as an `application/cloudevents+json` value.
    Structured,
}

/// `[cloudevents]`.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CloudEventsSection {
    /// `off` (default), `binary` or `structured`.
    #[serde(default)]
    pub mode: CloudEventsModeName,
    /// The `source` attribute, a URI-reference; empty (default) derives
    /// `/siphon/<database>/<slot>`.
    #[serde(default)]
    pub source: String,
}

/// `[trace]`.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TraceSection {
    /// The column holding a W3C `traceparent`; empty (default) carries no trace context.
    #[serde(default)]
    pub column: String,
    /// The column holding a W3C `tracestate`; empty (default) for none.
    #[serde(default)]
    pub state_column: String,
}

/// `[pipeline]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSection {
    /// Most records handed to Kafka and not yet acknowledged; reading pauses at the limit.
    #[serde(default = "default_max_in_flight_records")]
    pub max_in_flight_records: usize,
    /// Most bytes (keys, values, headers) handed to Kafka and not yet acknowledged.
    #[serde(default = "default_max_in_flight_bytes")]
    pub max_in_flight_bytes: usize,
    /// On SIGTERM/SIGINT, how long to wait for in-flight records to be acknowledged, in seconds.
    #[serde(default = "default_shutdown_timeout_secs")]
    pub shutdown_timeout_secs: u64,
    /// Longest wait between reconnection attempts after a transient failure, in seconds.
    #[serde(default = "default_max_backoff_secs")]
    pub max_backoff_secs: u64,
    /// What to do with a row or record that can never be delivered as it is (payload not JSON
    /// where JSON is required, NULL key or routing field, missing column, record larger than the
    /// broker accepts, topic refused): `fail` (stop, naming the fix) or `dead-letter`.
    #[serde(default)]
    pub on_error: OnError,
    /// The topic dead-lettered rows and records go to, with `on_error = "dead-letter"`.
    #[serde(default = "default_dead_letter_topic")]
    pub dead_letter_topic: String,
}

/// `pipeline.on_error`.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum OnError {
    /// Stop with an error naming the fix.
    #[default]
    Fail,
    /// Write it to `pipeline.dead_letter_topic` with the error in its headers and go on.
    DeadLetter,
}

impl Default for PipelineSection {
    fn default() -> Self {
        PipelineSection {
            max_in_flight_records: default_max_in_flight_records(),
            max_in_flight_bytes: default_max_in_flight_bytes(),
            shutdown_timeout_secs: default_shutdown_timeout_secs(),
            max_backoff_secs: default_max_backoff_secs(),
            on_error: OnError::default(),
            dead_letter_topic: default_dead_letter_topic(),
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `[log]`. Levels come from `RUST_LOG` (default `info`).
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    /// `text` (default) or `json`.
    #[serde(default)]
    pub format: LogFormat,
}

fn default_slot() -> String {
    "siphon".into()
}
fn default_publication() -> String {
    "siphon_outbox".into()
}
fn default_tables() -> Vec<String> {
    vec!["public.outbox".into()]
}
fn default_status_interval_ms() -> u64 {
    1000
}
fn default_application_name() -> String {
    "siphon".into()
}
fn yes() -> bool {
    true
}
fn minus_one() -> i32 {
    -1
}
fn default_max_in_flight_records() -> usize {
    10_000
}
fn default_max_in_flight_bytes() -> usize {
    32 * 1024 * 1024
}
fn default_shutdown_timeout_secs() -> u64 {
    30
}
fn default_max_backoff_secs() -> u64 {
    30
}
fn default_stall_timeout_secs() -> u64 {
    120
}
fn default_dead_letter_topic() -> String {
    "siphon.dead-letter".into()
}

/// Flattens a table of scalar option values into strings (`true` -> `"true"`, `5` -> `"5"`).
pub fn option_strings(
    table: &BTreeMap<String, toml::Value>,
    section: &str,
) -> anyhow::Result<BTreeMap<String, String>> {
    table
        .iter()
        .map(|(key, value)| {
            let text = match value {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                other => bail!(
                    "{section}.\"{key}\" must be a string, number or boolean, not {}",
                    other.type_str()
                ),
            };
            Ok((key.clone(), text))
        })
        .collect()
}

/// Where an environment variable lands in the document.
struct EnvSection {
    prefix: &'static str,
    path: &'static [&'static str],
    /// Keys of this table use dots (librdkafka and Debezium names): `_` in the variable stands
    /// for `.`.
    dotted: bool,
}

/// Longest prefixes first, so `KAFKA_PROPERTIES_` wins over `KAFKA_`.
const ENV_SECTIONS: &[EnvSection] = &[
    EnvSection {
        prefix: "KAFKA_PROPERTIES_",
        path: &["kafka", "properties"],
        dotted: true,
    },
    EnvSection {
        prefix: "KAFKA_TOPIC_CREATION_",
        path: &["kafka", "topic_creation"],
        dotted: false,
    },
    EnvSection {
        prefix: "KAFKA_",
        path: &["kafka"],
        dotted: false,
    },
    EnvSection {
        prefix: "SOURCE_",
        path: &["source"],
        dotted: false,
    },
    EnvSection {
        prefix: "ROUTER_",
        path: &["router"],
        dotted: true,
    },
    EnvSection {
        prefix: "FORMAT_",
        path: &["format"],
        dotted: false,
    },
    EnvSection {
        prefix: "CLOUDEVENTS_",
        path: &["cloudevents"],
        dotted: false,
    },
    EnvSection {
        prefix: "TRACE_",
        path: &["trace"],
        dotted: false,
    },
    EnvSection {
        prefix: "PIPELINE_",
        path: &["pipeline"],
        dotted: false,
    },
    EnvSection {
        prefix: "METRICS_",
        path: &["metrics"],
        dotted: false,
    },
    EnvSection {
        prefix: "LOG_",
        path: &["log"],
        dotted: false,
    },
    EnvSection {
        prefix: "SCHEMA_REGISTRY_",
        path: &["schema_registry"],
        dotted: false,
    },
];

/// The configuration with every default filled in, as a TOML tree: the one source of truth
/// for the type of each key an environment variable sets (a key without a default, like
/// `source.url`, and the option maps are strings).
fn defaults_tree() -> toml::Table {
    let minimal = "[source]\nurl = \"\"\n[kafka]\nbootstrap_servers = \"\"\n";
    minimal
        .parse::<toml::Table>()
        .ok()
        .and_then(|doc| toml::Value::Table(doc).try_into::<Config>().ok())
        .and_then(|config| toml::Value::try_from(config).ok())
        .and_then(|value| match value {
            toml::Value::Table(table) => Some(table),
            _ => None,
        })
        .unwrap_or_default()
}

/// The default at `path`.
fn default_at<'t>(tree: &'t toml::Table, path: &[&str], key: &str) -> Option<&'t toml::Value> {
    let mut table = tree;
    for part in path {
        table = table.get(*part)?.as_table()?;
    }
    table.get(key)
}

/// Applies `SIPHON_<SECTION>_<KEY>` variables to a parsed document.
///
/// `SIPHON_SOURCE_URL` sets `source.url`; `SIPHON_SOURCE_TABLES` takes a comma-separated list;
/// `SIPHON_KAFKA_PROPERTIES_LINGER_MS` sets `kafka.properties."linger.ms"`;
/// `SIPHON_ROUTER_ROUTE_BY_FIELD` sets `router."route.by.field"`.
pub fn apply_env(
    doc: &mut toml::Table,
    vars: impl IntoIterator<Item = (String, String)>,
) -> anyhow::Result<()> {
    let defaults = defaults_tree();
    for (name, value) in vars {
        let Some(rest) = name.strip_prefix("SIPHON_") else {
            continue;
        };
        // Variables that name no section (SIPHON_CONFIG, tooling's own) are not configuration.
        let Some(section) = ENV_SECTIONS.iter().find(|s| rest.starts_with(s.prefix)) else {
            continue;
        };
        let raw_key = rest[section.prefix.len()..].to_ascii_lowercase();
        if raw_key.is_empty() {
            bail!("environment variable {name} names no key");
        }
        let key = if section.dotted {
            raw_key.replace('_', ".")
        } else {
            raw_key
        };
        let full = format!("{}.{key}", section.path.join("."));
        let parsed = match default_at(&defaults, section.path, &key) {
            // A list of strings: comma-separated.
            Some(toml::Value::Array(_)) => toml::Value::Array(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(|t| toml::Value::String(t.to_owned()))
                    .collect(),
            ),
            Some(toml::Value::String(_)) | None => toml::Value::String(value),
            // A number or a boolean: the variable's text as a TOML value.
            Some(_) => format!("v = {value}")
                .parse::<toml::Table>()
                .ok()
                .and_then(|mut t| t.remove("v"))
                .with_context(|| {
                    format!(
                        "environment variable {name}: {value:?} is not a valid value for {full}"
                    )
                })?,
        };
        let mut table = &mut *doc;
        for part in section.path {
            let entry = table
                .entry((*part).to_owned())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            table = match entry {
                toml::Value::Table(t) => t,
                _ => bail!(
                    "{} is not a table in the configuration file",
                    section.path.join(".")
                ),
            };
        }
        table.insert(key, parsed);
    }
    Ok(())
}

impl Config {
    /// Parses a configuration document (after environment overrides).
    pub fn from_table(doc: toml::Table) -> anyhow::Result<Config> {
        ranges::check(&doc)?;
        let config: Config = toml::Value::Table(doc)
            .try_into()
            .map_err(|e: toml::de::Error| anyhow::anyhow!("{}", e.message()))?;
        config.validate()?;
        Ok(config)
    }

    /// Reads `path`, applies the process environment and parses the result.
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut doc: toml::Table = text
            .parse()
            .with_context(|| format!("{} is not valid TOML", path.display()))?;
        apply_env(&mut doc, std::env::vars())?;
        Config::from_table(doc)
            .with_context(|| format!("invalid configuration in {}", path.display()))
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.source.tables.is_empty() && self.source.message_prefixes.is_empty() {
            bail!(
                "source.tables is empty and no source.message_prefixes are set: list the outbox tables, e.g. tables = [\"public.outbox\"], or the prefixes of a logical-message outbox, e.g. message_prefixes = [\"outbox\"]"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
        [source]
        url = "postgres://siphon@127.0.0.1:5432/app"
        [kafka]
        bootstrap_servers = "127.0.0.1:9092"
    "#;

    fn parse(text: &str, env: &[(&str, &str)]) -> anyhow::Result<Config> {
        let mut doc: toml::Table = text.parse()?;
        apply_env(
            &mut doc,
            env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        )?;
        Config::from_table(doc)
    }

    #[test]
    fn defaults_fill_a_minimal_file() {
        let c = parse(MINIMAL, &[]).unwrap();
        assert_eq!(c.source.slot, "siphon");
        assert_eq!(c.source.publication, "siphon_outbox");
        assert_eq!(c.source.tables, vec!["public.outbox".to_owned()]);
        assert_eq!(c.format.key, EncodingName::Json);
        assert_eq!(c.pipeline.max_in_flight_records, 10_000);
        assert!(c.kafka.topic_creation.enabled);
    }

    #[test]
    fn the_schema_registry_section_reads_its_keys_and_their_variables() {
        let c = parse(
            &format!("{MINIMAL}\n[schema_registry]\nurl = \"https://r:8081\"\nusername = \"u\"\n"),
            &[("SIPHON_SCHEMA_REGISTRY_PASSWORD", "secret")],
        )
        .unwrap();
        assert_eq!(c.schema_registry.url, "https://r:8081");
        assert_eq!(c.schema_registry.username, "u");
        assert_eq!(c.schema_registry.password, "secret");
        assert_eq!(c.schema_registry.request_timeout_ms, 30_000);
        let err = parse(
            &format!("{MINIMAL}\n[schema_registry]\nrequest_timeout_ms = 0\n"),
            &[],
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("request_timeout_ms"), "{err:#}");
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = parse(&format!("{MINIMAL}\n[pipeline]\nmax_in_flight = 3\n"), &[]).unwrap_err();
        assert!(format!("{err:#}").contains("max_in_flight"), "{err:#}");
        let err = parse(
            "[source]\nurl='x'\nslott='a'\n[kafka]\nbootstrap_servers='b'\n",
            &[],
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("slott"), "{err:#}");
    }

    #[test]
    fn missing_required_keys_are_named() {
        let err = parse("[source]\nurl='x'\n", &[]).unwrap_err();
        assert!(format!("{err:#}").contains("kafka"), "{err:#}");
        let err = parse("[source]\n[kafka]\nbootstrap_servers='b'\n", &[]).unwrap_err();
        assert!(format!("{err:#}").contains("url"), "{err:#}");
    }

    #[test]
    fn environment_overrides_every_kind_of_key() {
        let c = parse(
            MINIMAL,
            &[
                ("SIPHON_SOURCE_URL", "postgres://other@127.0.0.1/db"),
                ("SIPHON_SOURCE_TABLES", "public.a, app.b"),
                ("SIPHON_KAFKA_PROPERTIES_LINGER_MS", "20"),
                ("SIPHON_KAFKA_TOPIC_CREATION_PARTITIONS", "3"),
                ("SIPHON_ROUTER_ROUTE_BY_FIELD", "type"),
                ("SIPHON_FORMAT_VALUE", "string"),
                ("SIPHON_PIPELINE_MAX_IN_FLIGHT_RECORDS", "7"),
                ("SIPHON_CLOUDEVENTS_MODE", "structured"),
                ("SIPHON_TRACE_STATE_COLUMN", "tracestate"),
                ("SIPHON_FORMAT_JAVA_VERSION", "17"),
                ("SIPHON_SOURCE_MESSAGE_PREFIXES", "outbox,audit"),
                ("SIPHON_SOURCE_SLOT", "1234"),
                ("SIPHON_METRICS_ENABLED", "false"),
                ("SIPHON_CONFIG", "ignored.toml"),
                ("OTHER_VAR", "x"),
            ],
        )
        .unwrap();
        assert_eq!(c.source.url, "postgres://other@127.0.0.1/db");
        assert_eq!(
            c.source.tables,
            vec!["public.a".to_owned(), "app.b".to_owned()]
        );
        assert_eq!(
            option_strings(&c.kafka.properties, "kafka.properties").unwrap()["linger.ms"],
            "20"
        );
        assert_eq!(c.kafka.topic_creation.partitions, 3);
        assert_eq!(
            option_strings(&c.router, "router").unwrap()["route.by.field"],
            "type"
        );
        assert_eq!(c.format.value, EncodingName::String);
        assert_eq!(c.pipeline.max_in_flight_records, 7);
        assert_eq!(c.cloudevents.mode, CloudEventsModeName::Structured);
        assert_eq!(c.trace.state_column, "tracestate");
        // Types come from the configuration itself: a number, a list, a string that looks like a
        // number, a boolean.
        assert_eq!(c.format.java_version, 17);
        assert_eq!(c.source.message_prefixes, ["outbox", "audit"]);
        assert_eq!(c.source.slot, "1234");
        assert!(!c.metrics.enabled);
    }

    #[test]
    fn unknown_cloudevents_mode_names_the_accepted_ones() {
        let err = parse(
            &format!("{MINIMAL}\n[cloudevents]\nmode = \"batch\"\n"),
            &[],
        )
        .unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("batch") && text.contains("structured"),
            "{text}"
        );
    }

    #[test]
    fn bad_environment_is_named() {
        assert!(
            parse(MINIMAL, &[("SIPHON_BOGUS_KEY", "1")]).is_ok(),
            "no section: not configuration"
        );
        let err = parse(
            MINIMAL,
            &[("SIPHON_PIPELINE_MAX_IN_FLIGHT_RECORDS", "many")],
        )
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("max_in_flight_records"),
            "{err:#}"
        );
        let err = parse(MINIMAL, &[("SIPHON_SOURCE_NOPE", "1")]).unwrap_err();
        assert!(format!("{err:#}").contains("nope"), "{err:#}");
    }

    /// Every key of the configuration, as `section.key` paths (from the structs' defaults).
    fn all_keys() -> Vec<String> {
        fn walk(prefix: &str, table: &toml::Table, out: &mut Vec<String>) {
            for (k, v) in table {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match v {
                    toml::Value::Table(t)
                        if !matches!(path.as_str(), "router" | "kafka.properties") =>
                    {
                        walk(&path, t, out)
                    }
                    _ => out.push(path),
                }
            }
        }
        let config = parse(MINIMAL, &[]).unwrap();
        let doc = toml::Table::try_from(&config).unwrap();
        let mut keys = Vec::new();
        walk("", &doc, &mut keys);
        keys
    }

    /// `config` with `key` (`section.key`, `section.sub.key`) set to `value`.
    fn with_value(key: &str, value: i64) -> anyhow::Result<Config> {
        let mut doc: toml::Table = MINIMAL.parse()?;
        let parts: Vec<&str> = key.split('.').collect();
        let mut table = &mut doc;
        for part in &parts[..parts.len() - 1] {
            table = table
                .entry((*part).to_owned())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .expect("a table");
        }
        table.insert(
            parts[parts.len() - 1].to_owned(),
            toml::Value::Integer(value),
        );
        Config::from_table(doc)
    }

    /// Each integer key at its edges: 0, 1, the largest value allowed, one more, and
    /// `i64::MAX` (how Java users write "forever"); -1 too where it means the broker's default.
    /// A refusal names the key and its range.
    #[test]
    fn every_integer_key_is_range_checked_at_its_edges() {
        // (key, largest allowed, 0 accepted, 1 accepted, -1 accepted, the range in the message)
        let table: &[(&str, i64, bool, bool, bool, &str)] = &[
            (
                "source.status_interval_ms",
                3_600_000,
                false,
                false,
                false,
                "10 to 3600000",
            ),
            (
                "source.stall_timeout_secs",
                86_400,
                false,
                true,
                false,
                "1 to 86400",
            ),
            (
                "source.snapshot_chunk_rows",
                1_000_000,
                false,
                true,
                false,
                "1 to 1000000",
            ),
            (
                "kafka.topic_creation.partitions",
                100_000,
                false,
                true,
                true,
                "-1 (the broker's default) or 1 to 100000",
            ),
            (
                "kafka.topic_creation.replication_factor",
                32_767,
                false,
                true,
                true,
                "-1 (the broker's default) or 1 to 32767",
            ),
            (
                "kafka.transaction_interval_ms",
                3_600_000,
                false,
                true,
                false,
                "1 to 3600000",
            ),
            (
                "kafka.transaction_max_bytes",
                1 << 30,
                false,
                true,
                false,
                "1 to 1073741824",
            ),
            ("format.java_version", 99, false, false, false, "8 to 99"),
            (
                "pipeline.max_in_flight_records",
                1_000_000,
                false,
                true,
                false,
                "1 to 1000000",
            ),
            (
                "pipeline.max_in_flight_bytes",
                4 << 30,
                false,
                true,
                false,
                "1 to 4294967296",
            ),
            (
                "pipeline.shutdown_timeout_secs",
                86_400,
                true,
                true,
                false,
                "0 to 86400",
            ),
            (
                "pipeline.max_backoff_secs",
                3_600,
                false,
                true,
                false,
                "1 to 3600",
            ),
            (
                "schema_registry.request_timeout_ms",
                3_600_000,
                false,
                false,
                false,
                "100 to 3600000",
            ),
            (
                "schema_registry.latest_ttl_secs",
                86_400,
                false,
                true,
                false,
                "1 to 86400",
            ),
        ];
        let defaults = toml::Table::try_from(parse(MINIMAL, &[]).unwrap()).unwrap();
        let integer_keys: Vec<String> = all_keys()
            .into_iter()
            .filter(|key| {
                // `router` is a table of options, not a key.
                let Some((path, last)) = key.rsplit_once('.') else {
                    return false;
                };
                let mut node = &defaults;
                for part in path.split('.') {
                    node = node[part].as_table().unwrap();
                }
                node[last].is_integer()
            })
            .collect();
        let mut integer_keys = integer_keys;
        integer_keys.sort();
        let mut tested: Vec<&str> = table.iter().map(|row| row.0).collect();
        tested.sort_unstable();
        assert_eq!(integer_keys, tested, "every integer key is in the table");
        let mut ranged: Vec<&str> = ranges::RANGES.iter().map(|r| r.key).collect();
        ranged.sort_unstable();
        assert_eq!(ranged, tested, "every integer key has one range");
        for &(key, max, zero, one, minus_one, range) in table {
            for (value, accepted) in [
                (0, zero),
                (1, one),
                (-1, minus_one),
                (max, true),
                (max + 1, false),
                (i64::MAX, false),
                (i64::MIN, false),
            ] {
                match with_value(key, value) {
                    Ok(_) => assert!(accepted, "{key} = {value} was accepted"),
                    Err(e) => {
                        let text = format!("{e:#}");
                        assert!(!accepted, "{key} = {value}: {text}");
                        assert_eq!(
                            text,
                            format!("{key} = {value} is out of range: it must be {range}")
                        );
                    }
                }
            }
        }
        // An environment variable is checked the same way.
        let err = parse(
            MINIMAL,
            &[(
                "SIPHON_PIPELINE_SHUTDOWN_TIMEOUT_SECS",
                "9223372036854775807",
            )],
        )
        .unwrap_err();
        assert!(
            format!("{err:#}")
                .contains("pipeline.shutdown_timeout_secs = 9223372036854775807 is out of range"),
            "{err:#}"
        );
    }

    #[test]
    fn shipped_example_configurations_are_valid() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        for file in ["examples/siphon.toml", "examples/docker-siphon.toml"] {
            let text = std::fs::read_to_string(format!("{root}/{file}")).unwrap();
            let doc: toml::Table = text.parse().unwrap();
            Config::from_table(doc).unwrap_or_else(|e| panic!("{file}: {e:#}"));
        }
    }

    #[test]
    fn documentation_and_example_cover_every_key() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let docs = std::fs::read_to_string(format!("{root}/docs/configuration.md")).unwrap();
        let example_text = std::fs::read_to_string(format!("{root}/examples/siphon.toml")).unwrap();
        let example: toml::Table = example_text.parse().unwrap();
        Config::from_table(example.clone()).expect("examples/siphon.toml is a valid configuration");
        for key in all_keys() {
            assert!(
                docs.contains(&format!("`{key}`")),
                "docs/configuration.md does not document `{key}`"
            );
            let mut node = Some(&example);
            let parts: Vec<&str> = key.split('.').collect();
            for part in &parts[..parts.len() - 1] {
                node = node
                    .and_then(|t| t.get(*part))
                    .and_then(toml::Value::as_table);
            }
            assert!(
                node.is_some_and(|t| t.contains_key(parts[parts.len() - 1])),
                "examples/siphon.toml does not show `{key}`"
            );
        }
    }
}
