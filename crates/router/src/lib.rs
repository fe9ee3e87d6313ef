//! Outbox routing with the semantics of Debezium's outbox Event Router
//! (`io.debezium.transforms.outbox.EventRouter`) followed by Kafka Connect's converters.
//!
//! The crate turns an outbox row, as pgoutput delivers it, into the Kafka record Debezium
//! would have written, byte for byte; the only state it keeps is Debezium's envelope schema
//! cache (`schema_cache`), which Debezium's bytes depend on:
//!
//! ```text
//! RouterOptions::from_map(options) ─┐
//!                                   ├─ EventRouter::new ─ bind(Relation) ─ TableBinding
//! Format { key, value, numbers } ───┘                                         │
//!                                     route(&binding, Change::Insert(row)) ─ Routed::Record
//! ```
//!
//! Three layers of modules, each using only the layers below it (`tests/layers.rs` checks it,
//! and that no modules import each other round a circle):
//! - `format`: the bytes, as Kafka Connect's converters and the JVM under them write them:
//!   `encoding` (the converters: [`Encoding`], [`Format`], [`JavaNumbers`]), `encode`
//!   (column values as `JsonConverter` / `StringConverter` write them), `connect` (Connect
//!   schemas and values, envelopes and expanded payloads, schemas included), `expand`
//!   (`table.expand.json.payload`: JSON text to a struct with an inferred schema), `avro`
//!   (a Connect schema and value as the schema-registry Avro converters write them, the
//!   schema id a parameter: [`AvroSchema`]), `json`
//!   (JSON strings escaped exactly as Jackson escapes them), `javanum` and `javanum_legacy`
//!   (floating-point numbers printed as Java 19+ and Java 17 print them), `timestamp`
//!   (PostgreSQL timestamp text to milliseconds), `text` (the UTF-8 check of column text).
//! - `routing`: Debezium's routing policy: `options` (the Debezium option names, defaults and
//!   validation, with their behaviour values in `policy`), `binding` (finding the configured
//!   columns in a table), `topic` (`route.topic.regex`, `route.topic.replacement` and Kafka's
//!   topic name rules) with `topic_cache`, `own_topics` (Siphon's own topics, which no row may
//!   be routed to), `avro_schemas` (the Avro schemas of the Connect schemas met, cached as the
//!   Avro converter caches them), `schema_cache` (the envelope schema Debezium builds
//!   once and reuses, name included), `route` (a change to Debezium's record or a skip) and
//!   `error` (configuration and routing errors, each naming the fix).
//! - `extension`: the formats beyond Debezium's, applied to the Debezium record: `protobuf`
//!   values, `cloudevents` and W3C `trace` context, with the `position` of the change.
//!
//! On top, `router` puts routing and the extensions together as the [`EventRouter`]. The record
//! itself ([`RoutedRecord`], [`Header`], [`record_bytes`]) is the `siphon-record` crate's, which
//! the Kafka sink shares without depending on the router.
//!
//! # Invariants
//! - Routing never panics (a deeply nested payload is expanded on a thread with a large
//!   stack); every row is either a record, a skip with a [`SkipReason`], or a [`RouteError`]
//!   that names the table. Its only side effect is filling the envelope schema cache, shared
//!   by a router's clones, as one Debezium task shares it.
//! - Input text is never re-serialized unless `table.expand.json.payload` is on: a jsonb
//!   payload reaches Kafka as PostgreSQL printed it (as a JSON string literal with the Json
//!   encoding, unchanged with the String encoding).
//!
//! # Differences from Debezium
//! - A configured column missing from the table, or a NULL event id, is an error; Debezium
//!   uses a null key for a missing key column and a null `id` header for a NULL id.
//! - Text that is not valid UTF-8 is an error; Java would replace the bad bytes with U+FFFD.
//! - A topic name Kafka would refuse is an error when routing, rather than when producing.
//! - A configured column (additional ones included, with `table.field.additional.missing=error`)
//!   missing from the table, or of a type that does not fit its use, is an error when the
//!   table is bound; Debezium fails on the first event.
//! - A `timestamptz` event timestamp column is read; Debezium fails on it (its schema is a
//!   string), and reads `timestamp` columns only.
//! - Expanded arrays of objects whose elements differ merge their fields in order of
//!   appearance; Debezium merges them in hash-set order, which varies between JVM runs.
//! - An expanded payload with an unpaired surrogate escape in a member *name* is an error.
//! - Doubles are printed as Java 19 and later print them (Debezium's official 3.x images run
//!   Java 21), or as Java 17 and earlier with [`JavaNumbers::Java17`].
//! - `table.json.payload.empty.array.behavior` is Siphon's own option (Debezium 3.x has no
//!   such option); its default, `ignore`, is what Debezium does.
//!
//! The bytes are checked against a real Debezium by `tests/tests/debezium_bytes/differential.rs`.

mod extension;
mod format;
mod router;
mod routing;

pub use extension::cloudevents::{CloudEventsMode, CloudEventsOptions};
pub use extension::position::SourcePosition;
pub use extension::trace::TraceOptions;
pub use extension::{default_cloudevents_source, EventExtensions, ExtensionConfigError};
pub use format::avro::{AvroError, AvroSchema};
pub use format::connect::{
    Schema as ConnectSchema, SchemaType as ConnectSchemaType, Value as ConnectValue,
};
pub use format::encode::{oid, ValueKind, FIRST_USER_OID};
pub use format::encoding::{Encoding, Format, JavaNumbers};
pub use format::expand::{expand as expand_json_payload, Expansion, ExpansionError};
pub use format::json::json_string;
pub use format::registered::{Misfit, RegisteredAvro, RegisteredJson, RegisteredSchema};
pub use router::EventRouter;
pub use routing::avro_schemas::AvroSchemas;
pub use routing::binding::{ColumnRole, TableBinding};
pub use routing::error::{
    EncodingMismatch, PlacementEntryError, ReplacementError, RouteError, RouterConfigError,
};
pub use routing::options::{
    AdditionalField, AdditionalMissingBehavior, InvalidOperationBehavior, JsonEmptyArrayBehavior,
    JsonNullBehavior, Placement, RouterOptions,
};
pub use routing::own_topics::{OwnTopicRole, OwnTopics};
pub use routing::route::{
    Change, LogLevel, RegistryRecord, RegistryValue, Routed, RouterContext, SkipReason,
};
pub use routing::topic::{check_topic_name, java_regex, JavaRegexError, TopicRouter};
pub use siphon_record::{record_bytes, Header, RegistrySchema, RegistrySchemaKind, RoutedRecord};
