//! Routing one outbox row change to a Kafka record.
//!
//! An INSERT becomes a record:
//! - topic: the `route.by.field` value through `route.topic.regex` and
//!   `route.topic.replacement` (the value itself when the regex does not match it whole);
//! - key: the `table.field.event.key` column, encoded per [`Format::key`];
//! - value: the `table.field.event.payload` column, expanded from JSON text when
//!   `table.expand.json.payload` is on, wrapped in a `{payload, alias…}` struct when
//!   `table.fields.additional.placement` has envelope entries, encoded per [`Format::value`];
//!   `None` (a tombstone) for a NULL or blank payload with `route.tombstone.on.empty.payload`;
//! - headers: Debezium's four context headers (with [`crate::EventRouter::new_with_context`]), then
//!   `id` (the `table.field.event.id` column as `SimpleHeaderConverter` writes it), then the
//!   header placements in order (a NULL column gives a null header value);
//! - timestamp: the `table.field.event.timestamp` column in milliseconds, or none (the
//!   producer uses the time of sending, as close as we get to Debezium's processing time);
//! - partition: the last `partition` placement's value, or none.
//!
//! A DELETE is skipped ([`SkipReason::Delete`]); an UPDATE is skipped or fails according to
//! `table.op.invalid.behavior`.
//!
//! # Invariants
//! - [`crate::EventRouter::route`] never panics; a row it cannot route is a [`RouteError`], never a
//!   silently dropped record.
//! - Routing reads nothing but its arguments: the same inputs give the same output.
//! - A record owns its bytes: no key, value or header shares memory with the row (see
//!   [`crate::format::encode`]).

use crate::format::connect::{java_text, write_envelope, write_json, Schema, SchemaType, Value};
use crate::format::encode::{decode_bytea, to_json_with, to_string_with, BadValue, ValueKind};
use crate::format::encoding::{Encoding, Format, JavaNumbers};
use crate::format::expand::{expand, Expansion, ExpansionError};
use crate::format::json::{nesting_depth, MAX_WRITE_DEPTH};
use crate::format::timestamp::{record_timestamp_ms, TimestampError};
use crate::routing::avro_schemas::AvroSchemas;
use crate::routing::binding::{bind, BoundColumn, TableBinding};
use crate::routing::error::{shown, shown_bytes, RouteError, RouterConfigError};
use crate::routing::options::{Placement, RouterOptions, TOPIC_PREFIX};
use crate::routing::own_topics::OwnTopics;
use crate::routing::schema_cache::{CacheKey, EnvelopeSchemas};
use crate::routing::topic::check_topic_name;
use crate::routing::topic_cache::TopicCache;
use bytes::Bytes;
use pgoutput::{Column, Relation, TupleData};
use siphon_record::registered::unframed_value;
use siphon_record::{Header, RegistrySchema, RegistrySchemaKind, RoutedRecord};
use std::sync::Arc;

/// One change to an outbox row, as pgoutput delivers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change<'a> {
    /// A row was inserted: the only change that produces a record.
    Insert(&'a TupleData),
    /// A row was updated.
    Update {
        /// The old row or its key, when the replica identity provides one.
        old: Option<&'a TupleData>,
        /// The new row.
        new: &'a TupleData,
    },
    /// A row was deleted (its key or whole old row).
    Delete(&'a TupleData),
}

/// The level at which a skipped change should be logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// Log at `info` or lower: nothing is wrong.
    Info,
    /// Log a warning.
    Warn,
    /// Log an error (and carry on).
    Error,
}

/// Why a change produced no record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// A DELETE: applications delete sent outbox rows, and Debezium ignores these deletes.
    Delete,
    /// An UPDATE, skipped because `table.op.invalid.behavior` is `warn` or `error`. Debezium
    /// logs it as a warning or as an error respectively and carries on;
    /// [`crate::EventRouter::log_level`] says which.
    Update,
}

/// What routing a change gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Routed {
    /// The change becomes this record.
    Record(RoutedRecord),
    /// The change becomes this record once the schema registry has answered for its key or
    /// value (a registry format): see [`RegistryRecord`].
    Registry(RegistryRecord),
    /// The change is deliberately not sent.
    Skipped(SkipReason),
}

/// A record whose key or value is written in a registry format: framed for a schema registry
/// with a placeholder id (see [`siphon_record::registered`]), or still the payload's JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryRecord {
    /// The record, its ids still to be written.
    pub record: RoutedRecord,
    /// The key's schema, to register under the key subject of the record's topic (`None`: the
    /// key is not in a registry format, or is null).
    pub key: Option<RegistrySchema>,
    /// What the value still needs.
    pub value: RegistryValue,
    /// The event type column's value, when value subjects are named by record name
    /// ([`siphon_record::registered::SubjectStrategy`]).
    pub record_name: Option<Arc<str>>,
}

/// What a [`RegistryRecord`]'s value still needs from the registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryValue {
    /// Nothing: it is sent as it is (a null value, or a format without a registry).
    AsIs,
    /// Its schema, made from the value, registered under the value subject of the record's topic.
    Derived(RegistrySchema),
    /// It is the payload's JSON, to be written with the latest schema of this kind registered
    /// under the value subject of the record's topic ([`crate::RegisteredSchema`]).
    Registered(RegistrySchemaKind),
}

/// A record value and, for a registry format, what it still needs.
pub(crate) type Encoded = (Option<Bytes>, RegistryValue);

/// Who is running the router, for Debezium's context headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterContext {
    /// `__debezium.context.connectorName`: the connector plugin name; Debezium's PostgreSQL
    /// connector writes `postgresql`.
    pub connector_name: String,
    /// `__debezium.context.taskId`: Debezium's PostgreSQL connector writes `0`.
    pub task_id: String,
    /// `__debezium.context.runId`: an id of this run, a random UUID in Debezium, made anew each
    /// time the task starts.
    pub run_id: String,
}

impl RouterContext {
    /// The context Debezium's PostgreSQL connector has, with this run id.
    pub fn postgresql(run_id: impl Into<String>) -> Self {
        RouterContext {
            connector_name: "postgresql".to_owned(),
            task_id: "0".to_owned(),
            run_id: run_id.into(),
        }
    }
}

/// Payloads nested at most this deep are expanded on the calling thread.
const SHALLOW_NESTING: usize = 64;

/// The header that carries the event id.
const ID_HEADER: &str = "id";

/// Debezium's outbox `EventRouter` followed by Kafka Connect's converters, as a pure function:
/// the record of a row before the formats beyond Debezium's (which [`crate::EventRouter`]
/// applies to it).
#[derive(Debug, Clone)]
pub(crate) struct Debezium {
    options: RouterOptions,
    format: Format,
    id_header: Arc<str>,
    context_headers: Vec<Header>,
    /// Envelope schema names as Debezium caches them; shared by clones.
    envelope_schemas: EnvelopeSchemas,
    /// The topic of each routing value seen; shared by clones.
    topics: TopicCache,
    /// Siphon's own topics, which no record may be routed to.
    own_topics: OwnTopics,
    /// The Avro schemas of the Connect schemas met; shared by clones.
    avro_schemas: AvroSchemas,
}

impl Debezium {
    /// Debezium's router with these options and encodings, without the context headers.
    pub(crate) fn new(options: RouterOptions, format: Format) -> Self {
        Debezium {
            options,
            format,
            id_header: Arc::from(ID_HEADER),
            context_headers: Vec::new(),
            envelope_schemas: EnvelopeSchemas::default(),
            topics: TopicCache::default(),
            own_topics: OwnTopics::default(),
            avro_schemas: AvroSchemas::default(),
        }
    }

    /// The router refusing rows routed to `own_topics` (see
    /// [`crate::EventRouter::with_own_topics`]); topics cached before are forgotten.
    pub(crate) fn with_own_topics(mut self, own_topics: OwnTopics) -> Self {
        self.own_topics = own_topics;
        self.topics = TopicCache::default();
        self
    }

    /// The router with Debezium's context headers, unless `extended.headers.enabled=false`
    /// (see [`crate::EventRouter::new_with_context`]).
    pub(crate) fn with_context(
        mut self,
        context: &RouterContext,
    ) -> Result<Self, RouterConfigError> {
        if self.options.extended_headers() {
            let Some(logical_name) = self.options.topic_prefix() else {
                return Err(RouterConfigError::MissingOption {
                    option: TOPIC_PREFIX,
                    needed_by: "the __debezium.context.connectorLogicalName header needs it (extended.headers.enabled is true)",
                });
            };
            let header = |name: &str, value: &str| Header {
                name: Arc::from(name),
                value: Some(Bytes::copy_from_slice(value.as_bytes())),
            };
            self.context_headers = vec![
                header("__debezium.context.connectorLogicalName", logical_name),
                header("__debezium.context.taskId", &context.task_id),
                header("__debezium.context.connectorName", &context.connector_name),
                header("__debezium.context.runId", &context.run_id),
            ];
        }
        Ok(self)
    }

    /// The options.
    pub(crate) fn options(&self) -> &RouterOptions {
        &self.options
    }

    /// The key and value encodings.
    pub(crate) fn format(&self) -> Format {
        self.format
    }

    /// The configured columns of a table (see [`crate::EventRouter::bind_with_not_null`]).
    pub(crate) fn bind(
        &self,
        relation: &Relation,
        not_null: &dyn Fn(&str) -> bool,
    ) -> Result<TableBinding, RouteError> {
        bind(&self.options, self.format, relation, not_null)
    }

    /// Whether the row's payload is expanded and nests deeper than a thread's default stack
    /// comfortably recurses (expansion, writing and dropping the value recurse per level).
    pub(crate) fn needs_deep_stack(&self, binding: &TableBinding, row: &TupleData) -> bool {
        self.options.expand_json_payload()
            && matches!(
                cell(binding, &binding.payload, row),
                Ok(Some((_, text))) if nesting_depth(text.as_bytes()) > SHALLOW_NESTING
            )
    }

    /// The Debezium record of an inserted row, with what a registry format still needs for it,
    /// and the row's routing value; without a value unless `encode_value` (a protobuf value
    /// replaces it).
    pub(crate) fn record<'r>(
        &self,
        binding: &TableBinding,
        row: &'r TupleData,
        encode_value: bool,
    ) -> Result<(RegistryRecord, &'r str), RouteError> {
        if row.columns.len() != binding.column_count {
            return Err(RouteError::ColumnCountMismatch {
                table: binding.table().to_owned(),
                expected: binding.column_count,
                actual: row.columns.len(),
            });
        }

        let (routed_value, topic) = {
            let column = &binding.route_by;
            let (_, value) = required(binding, column, row)?;
            let topic = self.topics.topic(value, |value| {
                let topic = self.options.topic_router().route(value);
                if let Err(reason) = check_topic_name(&topic) {
                    return Err(RouteError::InvalidTopic {
                        table: binding.table().to_owned(),
                        column: column.name.to_string(),
                        value: shown(value),
                        topic: shown(&topic),
                        reason,
                    });
                }
                match self.own_topics.check(&topic) {
                    None => Ok(topic),
                    Some(role) => Err(RouteError::OwnTopic {
                        table: binding.table().to_owned(),
                        column: column.name.to_string(),
                        value: shown(value),
                        topic,
                        role,
                    }),
                }
            })?;
            (value, topic)
        };

        let id = {
            let column = &binding.event_id;
            let (raw, text) = required(binding, column, row)?;
            to_string_with(column.kind, raw, text, self.format.numbers)
                .map_err(|BadValue| invalid(binding, column, raw))?
        };

        let timestamp_ms = match &binding.timestamp {
            None => None,
            Some(column) => match cell(binding, column, row)? {
                // Debezium falls back to the event's processing time.
                None => None,
                Some((raw, text)) => match record_timestamp_ms(text, column.type_modifier) {
                    Ok(ms) => Some(ms),
                    Err(TimestampError::Infinite) => {
                        return Err(RouteError::InfiniteTimestamp {
                            table: binding.table().to_owned(),
                            column: column.name.to_string(),
                            value: text.to_owned(),
                        })
                    }
                    Err(TimestampError::Malformed) => {
                        return Err(invalid_as(binding, column, raw, "timestamp"))
                    }
                },
            },
        };

        let (key, key_schema) = self.key(binding, row)?;

        let mut headers = Vec::with_capacity(self.context_headers.len() + 1);
        headers.extend(self.context_headers.iter().cloned());
        headers.push(Header {
            name: Arc::clone(&self.id_header),
            value: Some(id),
        });
        let mut partition = None;
        for extra in &binding.additional {
            match extra.placement {
                Placement::Header => {
                    let value = match cell(binding, &extra.column, row)? {
                        None => None,
                        Some((raw, text)) => Some(
                            to_string_with(extra.column.kind, raw, text, self.format.numbers)
                                .map_err(|BadValue| invalid(binding, &extra.column, raw))?,
                        ),
                    };
                    headers.push(Header {
                        name: Arc::clone(&extra.alias),
                        value,
                    });
                }
                Placement::Partition => {
                    // The last partition placement wins, a NULL one included.
                    partition = match cell(binding, &extra.column, row)? {
                        None => None,
                        Some((raw, text)) => Some(
                            text.parse::<i32>()
                                .map_err(|_| invalid(binding, &extra.column, raw))?,
                        ),
                    };
                }
                Placement::Envelope => {}
            }
        }

        // A protobuf value replaces the Debezium value: it is not encoded at all.
        let (value, value_schema) = if encode_value {
            self.encode_value(binding, row, routed_value)?
        } else {
            (None, RegistryValue::AsIs)
        };

        let record = RoutedRecord {
            topic,
            key,
            value,
            headers,
            timestamp_ms,
            partition,
        };
        let record = RegistryRecord {
            record,
            key: key_schema,
            value: value_schema,
            record_name: None,
        };
        Ok((record, routed_value))
    }

    /// The record value: the payload, expanded or wrapped in an envelope as configured; for a
    /// registry format, with the schema it is written with.
    fn encode_value(
        &self,
        binding: &TableBinding,
        row: &TupleData,
        routed_value: &str,
    ) -> Result<Encoded, RouteError> {
        let column = &binding.payload;
        let encoding = self.format.value;
        let payload = cell(binding, column, row)?;
        if let Encoding::Registered(kind) = encoding {
            // Binding refuses envelopes and bytea with it, and settings refuse the expansion.
            return Ok(match payload {
                None => (None, RegistryValue::AsIs),
                Some((raw, _)) => (Some(raw.clone()), RegistryValue::Registered(kind)),
            });
        }
        let has_envelope = binding
            .additional
            .iter()
            .any(|a| a.placement == Placement::Envelope);

        let expansion = match payload {
            Some((_, text))
                if self.options.expand_json_payload() && column.kind == ValueKind::Text =>
            {
                expand(
                    &column.name,
                    text,
                    self.options.json_null_behavior(),
                    self.options.json_empty_array_behavior(),
                )
            }
            _ => Expansion::Unchanged,
        };
        let expansion = match (expansion, self.format.numbers) {
            (Expansion::Expanded { schema, value }, JavaNumbers::Java17) => Expansion::Expanded {
                schema,
                value: value.with_java17_numbers(),
            },
            (other, _) => other,
        };

        // `payload.toString().trim().isEmpty()` in Debezium: NULL, or text made only of
        // characters up to U+0020.
        let empty = match (&payload, &expansion) {
            (None, _) => true,
            (
                Some((_, text)),
                Expansion::Unchanged | Expansion::Broken { .. } | Expansion::Unsupported { .. },
            ) => column.kind == ValueKind::Text && text.chars().all(|c| c <= ' '),
            _ => false,
        };

        if let Expansion::Unsupported { reason } = &expansion {
            return Err(RouteError::JsonExpansion {
                table: binding.table().to_owned(),
                column: column.name.to_string(),
                reason: reason.clone(),
            });
        }

        if has_envelope {
            // Debezium builds the envelope (and checks that the payload fits it) before it
            // looks at an empty payload.
            let (schema, value) = self.envelope(binding, row, routed_value, &expansion)?;
            if empty && self.options.tombstone_on_empty_payload() {
                return Ok((None, RegistryValue::AsIs));
            }
            return self.written(binding, &value, &schema, encoding);
        }

        if let Expansion::Broken { schema, reason } = &expansion {
            let text = payload.map(|(_, t)| t).unwrap_or_default();
            let fail = || RouteError::JsonExpansion {
                table: binding.table().to_owned(),
                column: column.name.to_string(),
                reason: reason.clone(),
            };
            // The schema was replaced but the value is still the string: only a converter
            // that ignores the schema can write it.
            return match (encoding, schema) {
                (Encoding::String, _) => Ok((
                    Some(Bytes::copy_from_slice(text.as_bytes())),
                    RegistryValue::AsIs,
                )),
                (Encoding::Json, None) => Ok((
                    Some(crate::format::json::json_string_bytes(text)),
                    RegistryValue::AsIs,
                )),
                (Encoding::JsonSchemas, None) => {
                    let mut out = Vec::new();
                    write_envelope(&mut out, &Value::Str(text.to_owned()), None);
                    Ok((Some(Bytes::from(out)), RegistryValue::AsIs))
                }
                // The value is still the column's string, written with the column's schema.
                (Encoding::Avro, None) => {
                    self.avro(binding, &Value::Str(text.to_owned()), &column.schema())
                }
                _ => Err(fail()),
            };
        }

        if empty && self.options.tombstone_on_empty_payload() {
            return Ok((None, RegistryValue::AsIs));
        }

        match expansion {
            Expansion::Expanded { schema, value } => {
                self.written(binding, &value, &schema, encoding)
            }
            // The registry converters write a NULL payload as a null value.
            _ if encoding == Encoding::Avro => match payload {
                None => Ok((None, RegistryValue::AsIs)),
                Some(_) => {
                    let value = column_value(binding, column, row, self.format.numbers)?;
                    self.avro(binding, &value, &column.schema())
                }
            },
            _ => Ok((
                encode_cell(binding, column, payload, encoding, self.format.numbers)?,
                RegistryValue::AsIs,
            )),
        }
    }

    /// The payload's `value` written as Avro with the Avro schema of `schema`, framed with a
    /// placeholder schema id.
    fn avro(
        &self,
        binding: &TableBinding,
        value: &Value,
        schema: &Schema,
    ) -> Result<Encoded, RouteError> {
        let (framed, schema) = self.avro_of(binding, &binding.payload, value, schema)?;
        Ok((Some(framed), RegistryValue::Derived(schema)))
    }

    /// `value` of `column` written as Avro with the Avro schema of `schema`, framed with a
    /// placeholder schema id, and that schema.
    fn avro_of(
        &self,
        binding: &TableBinding,
        column: &BoundColumn,
        value: &Value,
        schema: &Schema,
    ) -> Result<(Bytes, RegistrySchema), RouteError> {
        let fail = |reason: crate::format::avro::AvroError| RouteError::Avro {
            table: binding.table().to_owned(),
            column: column.name.to_string(),
            reason,
        };
        let avro = self.avro_schemas.get(schema).map_err(fail)?;
        let datum = avro.datum(value).map_err(fail)?;
        Ok((unframed_value(&datum), avro.registry_schema().clone()))
    }

    /// The record key: the event key column per [`Format::key`]; for Avro, with the schema to
    /// register (none for a NULL key, which the converters write as a null key).
    fn key(
        &self,
        binding: &TableBinding,
        row: &TupleData,
    ) -> Result<(Option<Bytes>, Option<RegistrySchema>), RouteError> {
        let column = &binding.event_key;
        if self.format.key != Encoding::Avro {
            let key = encode_column(binding, column, row, self.format.key, self.format.numbers)?;
            return Ok((key, None));
        }
        let value = column_value(binding, column, row, self.format.numbers)?;
        if matches!(value, Value::Null) {
            return Ok((None, None));
        }
        let (framed, schema) = self.avro_of(binding, column, &value, &column.schema())?;
        Ok((Some(framed), Some(schema)))
    }

    /// A struct value written per encoding, refused where Jackson would refuse to write it
    /// (nested deeper than [`MAX_WRITE_DEPTH`]).
    fn written(
        &self,
        binding: &TableBinding,
        value: &Value,
        schema: &Schema,
        encoding: Encoding,
    ) -> Result<Encoded, RouteError> {
        if encoding == Encoding::Avro {
            return self.avro(binding, value, schema);
        }
        let out = write_value(value, schema, encoding);
        if matches!(encoding, Encoding::Json | Encoding::JsonSchemas) {
            let depth = out.as_deref().map_or(0, nesting_depth);
            if depth > MAX_WRITE_DEPTH {
                return Err(RouteError::JsonExpansion {
                    table: binding.table().to_owned(),
                    column: binding.payload.name.to_string(),
                    reason: ExpansionError::TooDeepToWrite { depth },
                });
            }
        }
        Ok((out, RegistryValue::AsIs))
    }

    /// The envelope `{payload, aliases…}` and its schema, as Debezium builds it: the schema
    /// from its cache (see [`crate::routing::schema_cache`]), the payload put into it as Connect's
    /// `Struct.put` checks it.
    fn envelope(
        &self,
        binding: &TableBinding,
        row: &TupleData,
        routed_value: &str,
        expansion: &Expansion,
    ) -> Result<(Schema, Value), RouteError> {
        let column = &binding.payload;
        let expansion_failure = |reason: &ExpansionError| RouteError::JsonExpansion {
            table: binding.table().to_owned(),
            column: column.name.to_string(),
            reason: reason.clone(),
        };
        // The payload's own schema (replaced by the inferred one when the expansion failed
        // after inferring it) and the value that is put into the envelope.
        let (own_schema, payload_value) = match expansion {
            Expansion::Expanded { schema, value } => (Some(schema.clone()), value.clone()),
            Expansion::Broken { schema, .. } => (
                schema.clone(),
                column_value(binding, column, row, self.format.numbers)?,
            ),
            _ => (
                Some(column.schema()),
                column_value(binding, column, row, self.format.numbers)?,
            ),
        };
        let key = match &binding.schema_version {
            None => CacheKey::PayloadSchema,
            Some(_) => CacheKey::Version(self.schema_version(binding, row)?),
        };
        let version = match key {
            CacheKey::Version(v) => v,
            CacheKey::PayloadSchema => None,
        };
        // Debezium builds the envelope schema once per payload schema (or per version) and
        // reuses it, name included: the first record's routing value names it.
        let Some((payload_schema, name)) =
            self.envelope_schemas.lookup(own_schema.as_ref(), key, || {
                envelope_schema_name(&binding.row_schema_name, routed_value)
            })
        else {
            return Err(match expansion {
                Expansion::Broken { reason, .. } => expansion_failure(reason),
                _ => expansion_failure(&ExpansionError::NoSchema),
            });
        };
        // Connect's `Struct.put`: a struct only into the identical struct schema, null only
        // into an optional schema, any other value into a schema of its column's type.
        let fits = match (&payload_value, expansion) {
            (Value::Null, _) => payload_schema.optional,
            (_, Expansion::Expanded { schema, .. }) => *schema == payload_schema,
            _ => payload_schema.ty == column.schema().ty,
        };
        if !fits {
            return Err(match (version, key, expansion) {
                (_, CacheKey::Version(_), _) => RouteError::EnvelopeVersionMismatch {
                    table: binding.table().to_owned(),
                    column: column.name.to_string(),
                    version,
                },
                (_, _, Expansion::Broken { reason, .. }) => expansion_failure(reason),
                _ => expansion_failure(&ExpansionError::EnvelopeMismatch),
            });
        }
        let mut fields = vec![("payload".to_owned(), payload_schema)];
        let mut values = vec![payload_value];
        for extra in binding
            .additional
            .iter()
            .filter(|a| a.placement == Placement::Envelope)
        {
            fields.push((extra.alias.to_string(), extra.column.schema()));
            values.push(column_value(
                binding,
                &extra.column,
                row,
                self.format.numbers,
            )?);
        }
        let schema = Schema {
            ty: SchemaType::Struct(fields),
            optional: false,
            name: Some(name),
            version,
        };
        Ok((schema, Value::Struct(values)))
    }
}

impl Debezium {
    /// The `table.field.event.schema.version` column's value, if configured and not NULL.
    fn schema_version(
        &self,
        binding: &TableBinding,
        row: &TupleData,
    ) -> Result<Option<i32>, RouteError> {
        let Some(v) = &binding.schema_version else {
            return Ok(None);
        };
        match cell(binding, v, row)? {
            None => Ok(None),
            Some((raw, text)) => text
                .parse::<i32>()
                .map(Some)
                .map_err(|_| invalid(binding, v, raw)),
        }
    }
}

/// Debezium's envelope schema name: the routing value inserted before the last part of the
/// table's value schema name (`server.public.outbox.Value` -> `server.public.outbox.Order.Value`).
fn envelope_schema_name(row_schema_name: &str, routed_value: &str) -> String {
    match row_schema_name.rfind('.') {
        Some(dot) => format!(
            "{}{routed_value}.{}",
            &row_schema_name[..=dot],
            &row_schema_name[dot + 1..]
        ),
        None => format!("{routed_value}.{row_schema_name}"),
    }
}

/// A value with its schema, written per encoding (not used for plain columns, whose bytes
/// [`encode_column`] writes).
fn write_value(value: &Value, schema: &Schema, encoding: Encoding) -> Option<Bytes> {
    let mut out = Vec::new();
    match encoding {
        Encoding::Json => write_json(&mut out, value, Some(schema)),
        Encoding::JsonSchemas => write_envelope(&mut out, value, Some(schema)),
        // Binding refuses bytes for String and structs for Binary; Avro is written by
        // `Debezium::avro` and never comes here.
        Encoding::String | Encoding::Binary | Encoding::Avro | Encoding::Registered(_) => {
            return java_text(value, Some(schema))
                .ok()
                .flatten()
                .map(Bytes::from)
        }
    }
    Some(Bytes::from(out))
}

/// The column as a Connect value, written both ways.
fn column_value(
    binding: &TableBinding,
    column: &BoundColumn,
    row: &TupleData,
    numbers: JavaNumbers,
) -> Result<Value, RouteError> {
    let Some((raw, text)) = cell(binding, column, row)? else {
        return Ok(Value::Null);
    };
    let bad = |BadValue| invalid(binding, column, raw);
    if column.kind == ValueKind::Bytes {
        return decode_bytea(text).map(Value::Bytes).map_err(bad);
    }
    Ok(Value::Encoded {
        json: to_json_with(column.kind, raw, text, numbers).map_err(bad)?,
        text: to_string_with(column.kind, raw, text, numbers).map_err(bad)?,
    })
}

/// The column's text, or `None` for NULL.
pub(crate) fn cell<'r>(
    binding: &TableBinding,
    column: &BoundColumn,
    row: &'r TupleData,
) -> Result<Option<(&'r Bytes, &'r str)>, RouteError> {
    let table = || binding.table().to_owned();
    let name = || column.name.to_string();
    match row.columns.get(column.index) {
        None => Err(RouteError::ColumnCountMismatch {
            table: table(),
            expected: binding.column_count,
            actual: row.columns.len(),
        }),
        Some(Column::Null) => Ok(None),
        Some(Column::UnchangedToast) => Err(RouteError::UnchangedToast {
            table: table(),
            column: name(),
        }),
        Some(Column::Binary(_)) => Err(RouteError::BinaryColumn {
            table: table(),
            column: name(),
        }),
        Some(Column::Text(raw)) => match crate::format::text::utf8(raw) {
            Some(text) => Ok(Some((raw, text))),
            None => Err(RouteError::InvalidUtf8 {
                table: table(),
                column: name(),
            }),
        },
    }
}

/// The column's text; NULL is an error.
fn required<'r>(
    binding: &TableBinding,
    column: &BoundColumn,
    row: &'r TupleData,
) -> Result<(&'r Bytes, &'r str), RouteError> {
    cell(binding, column, row)?.ok_or_else(|| RouteError::NullColumn {
        table: binding.table().to_owned(),
        column: column.name.to_string(),
        option: column.role.option(),
        holds: column.role.holds(),
    })
}

/// The key or value bytes for a column.
fn encode_column(
    binding: &TableBinding,
    column: &BoundColumn,
    row: &TupleData,
    encoding: Encoding,
    numbers: JavaNumbers,
) -> Result<Option<Bytes>, RouteError> {
    encode_cell(
        binding,
        column,
        cell(binding, column, row)?,
        encoding,
        numbers,
    )
}

/// The key or value bytes for a column's value as [`cell`] gave it (its text checked once).
fn encode_cell(
    binding: &TableBinding,
    column: &BoundColumn,
    value: Option<(&Bytes, &str)>,
    encoding: Encoding,
    numbers: JavaNumbers,
) -> Result<Option<Bytes>, RouteError> {
    let Some((raw, text)) = value else {
        return Ok(match encoding {
            // JsonConverter writes a null of an optional schema as the JSON literal.
            Encoding::Json => Some(Bytes::from_static(b"null")),
            Encoding::JsonSchemas => {
                let mut out = Vec::new();
                write_envelope(&mut out, &Value::Null, Some(&column.schema()));
                Some(Bytes::from(out))
            }
            // A registry format writes a NULL as a null value.
            Encoding::String | Encoding::Binary | Encoding::Avro | Encoding::Registered(_) => None,
        });
    };
    let encoded = match encoding {
        Encoding::Json => to_json_with(column.kind, raw, text, numbers),
        Encoding::String => to_string_with(column.kind, raw, text, numbers),
        Encoding::Binary => decode_bytea(text),
        // Avro keys are written by `Debezium::key` and values by `Debezium::avro`; binding
        // refuses registered keys.
        Encoding::Avro | Encoding::Registered(_) => Err(BadValue),
        Encoding::JsonSchemas => to_json_with(column.kind, raw, text, numbers).map(|json| {
            let mut out = Vec::with_capacity(json.len() + 96);
            out.extend_from_slice(b"{\"schema\":");
            crate::format::connect::write_schema(&mut out, &column.schema());
            out.extend_from_slice(b",\"payload\":");
            out.extend_from_slice(&json);
            out.push(b'}');
            Bytes::from(out)
        }),
    };
    encoded
        .map(Some)
        .map_err(|BadValue| invalid(binding, column, raw))
}

pub(crate) fn invalid(binding: &TableBinding, column: &BoundColumn, raw: &[u8]) -> RouteError {
    invalid_as(binding, column, raw, column.kind.name())
}

fn invalid_as(
    binding: &TableBinding,
    column: &BoundColumn,
    raw: &[u8],
    type_name: &'static str,
) -> RouteError {
    RouteError::InvalidValue {
        table: binding.table().to_owned(),
        column: column.name.to_string(),
        type_name,
        value: shown_bytes(raw),
    }
}
