//! Routing one outbox row change to a Kafka record.
//!
//! An INSERT becomes a record:
//! - topic: `route.topic.replacement` with the `route.by.field` value substituted, case kept;
//! - key: the `table.field.event.key` column, encoded per [`Format::key`];
//! - value: the `table.field.event.payload` column, encoded per [`Format::value`];
//! - one header `id`: the `table.field.event.id` column as `SimpleHeaderConverter` writes it;
//! - no timestamp (the producer uses the time of sending).
//!
//! A DELETE is skipped ([`SkipReason::Delete`]); an UPDATE is skipped or fails according to
//! `table.op.invalid.behavior`.
//!
//! # Invariants
//! - [`EventRouter::route`] never panics; a row it cannot route is a [`RouteError`], never a
//!   silently dropped record.
//! - Routing reads nothing but its arguments: the same inputs give the same output.

use crate::binding::{bind, BoundColumn, TableBinding};
use crate::encode::{to_json, to_string, BadValue};
use crate::error::{shown, shown_bytes, RouteError};
use crate::options::{InvalidOperationBehavior, RouterOptions};
use crate::topic::check_topic_name;
use bytes::Bytes;
use pgoutput::{Column, Relation, TupleData};
use std::sync::Arc;

/// How a record key or value is serialized, as the Kafka Connect converter would.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// `org.apache.kafka.connect.json.JsonConverter` with `schemas.enable=false`.
    ///
    /// Text columns (including json and jsonb) become JSON string literals, so a jsonb
    /// payload is written as a string holding the document; numbers and booleans are written
    /// as JSON numbers and booleans; NULL is the four bytes `null`.
    #[default]
    Json,
    /// `org.apache.kafka.connect.storage.StringConverter`: the value's text as UTF-8
    /// (booleans as `true` / `false`); NULL is no bytes at all (a tombstone value or a null
    /// key).
    String,
}

/// The key and value encodings (Kafka Connect's `key.converter` and `value.converter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Format {
    /// How the record key is written.
    pub key: Encoding,
    /// How the record value is written.
    pub value: Encoding,
}

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
    /// [`EventRouter::log_level`] says which.
    Update,
}

/// A Kafka record header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The header key.
    pub name: Arc<str>,
    /// The header value.
    pub value: Bytes,
}

/// A record ready to be produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedRecord {
    /// The destination topic; a legal Kafka topic name.
    pub topic: String,
    /// The serialized key; `None` is a null key.
    pub key: Option<Bytes>,
    /// The serialized value; `None` is a null value (a tombstone).
    pub value: Option<Bytes>,
    /// The headers, in order.
    pub headers: Vec<Header>,
    /// The record timestamp in milliseconds since the Unix epoch; `None` lets the producer
    /// use the time of sending.
    pub timestamp_ms: Option<i64>,
}

/// What routing a change gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Routed {
    /// The change becomes this record.
    Record(RoutedRecord),
    /// The change is deliberately not sent.
    Skipped(SkipReason),
}

/// The header that carries the event id.
const ID_HEADER: &str = "id";

/// Debezium's outbox `EventRouter` followed by Kafka Connect's converters, as a pure function.
#[derive(Debug, Clone)]
pub struct EventRouter {
    options: RouterOptions,
    format: Format,
    id_header: Arc<str>,
}

impl EventRouter {
    /// A router with these options and encodings.
    pub fn new(options: RouterOptions, format: Format) -> Self {
        EventRouter {
            options,
            format,
            id_header: Arc::from(ID_HEADER),
        }
    }

    /// The options.
    pub fn options(&self) -> &RouterOptions {
        &self.options
    }

    /// The key and value encodings.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The level at which Debezium logs a skipped change: `info` for a DELETE, and for an
    /// UPDATE `warn` or `error` as `table.op.invalid.behavior` says.
    pub fn log_level(&self, reason: SkipReason) -> LogLevel {
        match (reason, self.options.invalid_operation()) {
            (SkipReason::Delete, _) => LogLevel::Info,
            (SkipReason::Update, InvalidOperationBehavior::Error) => LogLevel::Error,
            (SkipReason::Update, _) => LogLevel::Warn,
        }
    }

    /// Resolves the configured columns in a table, once, when its `Relation` message arrives.
    ///
    /// # Errors
    /// [`RouteError::MissingColumn`] when a configured column is not in the table,
    /// [`RouteError::UnsupportedColumnType`] when its type cannot be encoded,
    /// [`RouteError::RoutingColumnNotText`] when the `route.by.field` column is not text-like.
    pub fn bind(&self, relation: &Relation) -> Result<TableBinding, RouteError> {
        bind(&self.options, relation)
    }

    /// Routes one change of a row of the bound table.
    ///
    /// # Errors
    /// A [`RouteError`] naming the table (and column) when the row cannot become a record:
    /// a NULL id or routing value, a topic Kafka would refuse, a value that is not valid text,
    /// an UPDATE with `table.op.invalid.behavior=fatal`, or a row that does not match the
    /// binding.
    pub fn route(&self, binding: &TableBinding, change: Change<'_>) -> Result<Routed, RouteError> {
        match change {
            Change::Insert(row) => self.route_insert(binding, row).map(Routed::Record),
            Change::Delete(_) => Ok(Routed::Skipped(SkipReason::Delete)),
            Change::Update { .. } => match self.options.invalid_operation() {
                InvalidOperationBehavior::Warn | InvalidOperationBehavior::Error => {
                    Ok(Routed::Skipped(SkipReason::Update))
                }
                behavior @ InvalidOperationBehavior::Fatal => Err(RouteError::InvalidOperation {
                    table: binding.table().to_owned(),
                    behavior,
                }),
            },
        }
    }

    fn route_insert(
        &self,
        binding: &TableBinding,
        row: &TupleData,
    ) -> Result<RoutedRecord, RouteError> {
        if row.columns.len() != binding.column_count {
            return Err(RouteError::ColumnCountMismatch {
                table: binding.table().to_owned(),
                expected: binding.column_count,
                actual: row.columns.len(),
            });
        }

        let topic = {
            let column = &binding.route_by;
            let (_, value) = required(binding, column, row)?;
            let topic = self.options.topic_template().render(value);
            if let Err(reason) = check_topic_name(&topic) {
                return Err(RouteError::InvalidTopic {
                    table: binding.table().to_owned(),
                    column: column.name.to_string(),
                    value: shown(value),
                    topic: shown(&topic),
                    reason,
                });
            }
            topic
        };

        let id = {
            let column = &binding.event_id;
            let (raw, text) = required(binding, column, row)?;
            to_string(column.kind, raw, text).map_err(|BadValue| invalid(binding, column, raw))?
        };

        let key = encode(binding, &binding.event_key, row, self.format.key)?;
        let value = encode(binding, &binding.payload, row, self.format.value)?;

        Ok(RoutedRecord {
            topic,
            key,
            value,
            headers: vec![Header {
                name: Arc::clone(&self.id_header),
                value: id,
            }],
            timestamp_ms: None,
        })
    }
}

/// The column's text, or `None` for NULL.
fn cell<'r>(
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
        Some(Column::Text(raw)) => match std::str::from_utf8(raw) {
            Ok(text) => Ok(Some((raw, text))),
            Err(_) => Err(RouteError::InvalidUtf8 {
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
fn encode(
    binding: &TableBinding,
    column: &BoundColumn,
    row: &TupleData,
    encoding: Encoding,
) -> Result<Option<Bytes>, RouteError> {
    let Some((raw, text)) = cell(binding, column, row)? else {
        return Ok(match encoding {
            // JsonConverter writes a null of an optional schema as the JSON literal.
            Encoding::Json => Some(Bytes::from_static(b"null")),
            Encoding::String => None,
        });
    };
    let encoded = match encoding {
        Encoding::Json => to_json(column.kind, raw, text),
        Encoding::String => to_string(column.kind, raw, text),
    };
    encoded
        .map(Some)
        .map_err(|BadValue| invalid(binding, column, raw))
}

fn invalid(binding: &TableBinding, column: &BoundColumn, raw: &[u8]) -> RouteError {
    RouteError::InvalidValue {
        table: binding.table().to_owned(),
        column: column.name.to_string(),
        type_name: column.kind.name(),
        value: shown_bytes(raw),
    }
}
