//! Resolving the configured columns in a table, once per `Relation` message.
//!
//! # Invariants
//! - A [`TableBinding`] only exists for a table that has all four configured columns, each of
//!   a supported type, with a text-like routing column.
//! - Column indexes in a binding are below its column count.

use crate::format::connect::{Schema, SchemaType};
use crate::format::encode::{oid, type_name, ValueKind};
use crate::format::encoding::{Encoding, Format};
use crate::routing::error::{EncodingMismatch, RouteError};
use crate::routing::options::{
    AdditionalMissingBehavior, Placement, RouterOptions, FIELDS_ADDITIONAL_PLACEMENT,
    FIELD_EVENT_ID, FIELD_EVENT_KEY, FIELD_EVENT_PAYLOAD, FIELD_EVENT_TIMESTAMP, FIELD_EVENT_TYPE,
    FIELD_SCHEMA_VERSION, ROUTE_BY_FIELD, TRACE_COLUMN, TRACE_STATE_COLUMN,
};
use pgoutput::{Oid, Relation};
use std::sync::Arc;

/// What a configured column is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnRole {
    /// `table.field.event.id`: the `id` header.
    EventId,
    /// `table.field.event.key`: the record key.
    EventKey,
    /// `table.field.event.payload`: the record value.
    Payload,
    /// `route.by.field`: the topic.
    RouteBy,
    /// `table.field.event.timestamp`: the record timestamp.
    EventTimestamp,
    /// `table.field.event.schema.version`: the value schema's version.
    SchemaVersion,
    /// An entry of `table.fields.additional.placement`.
    Additional(Placement),
    /// `table.field.event.type`: the event type of protobuf values and CloudEvents.
    EventType,
    /// `trace.column`: the W3C `traceparent`.
    TraceParent,
    /// `trace.state_column`: the W3C `tracestate`.
    TraceState,
}

impl ColumnRole {
    /// The option that names the column.
    pub fn option(self) -> &'static str {
        match self {
            ColumnRole::EventId => FIELD_EVENT_ID,
            ColumnRole::EventKey => FIELD_EVENT_KEY,
            ColumnRole::Payload => FIELD_EVENT_PAYLOAD,
            ColumnRole::RouteBy => ROUTE_BY_FIELD,
            ColumnRole::EventTimestamp => FIELD_EVENT_TIMESTAMP,
            ColumnRole::SchemaVersion => FIELD_SCHEMA_VERSION,
            ColumnRole::Additional(_) => FIELDS_ADDITIONAL_PLACEMENT,
            ColumnRole::EventType => FIELD_EVENT_TYPE,
            ColumnRole::TraceParent => TRACE_COLUMN,
            ColumnRole::TraceState => TRACE_STATE_COLUMN,
        }
    }

    /// What the column holds, for messages.
    pub fn holds(self) -> &'static str {
        match self {
            ColumnRole::EventId => "the event id",
            ColumnRole::EventKey => "the aggregate id",
            ColumnRole::Payload => "the event payload",
            ColumnRole::RouteBy => "the aggregate type",
            ColumnRole::EventTimestamp => "the event timestamp",
            ColumnRole::SchemaVersion => "the event schema version",
            ColumnRole::Additional(Placement::Header) => "a header value",
            ColumnRole::Additional(Placement::Envelope) => "an envelope field",
            ColumnRole::Additional(Placement::Partition) => "the partition number",
            ColumnRole::EventType => "the event type",
            ColumnRole::TraceParent => "the W3C traceparent",
            ColumnRole::TraceState => "the W3C tracestate",
        }
    }
}

/// One configured column, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BoundColumn {
    pub(crate) index: usize,
    pub(crate) name: Arc<str>,
    pub(crate) kind: ValueKind,
    pub(crate) role: ColumnRole,
    pub(crate) type_oid: Oid,
    pub(crate) type_modifier: i32,
    pub(crate) not_null: bool,
}

impl BoundColumn {
    /// The Connect schema Debezium's PostgreSQL connector gives the column.
    pub(crate) fn schema(&self) -> Schema {
        let (ty, name) = match (self.kind, self.type_oid) {
            (ValueKind::Integer, oid::INT2) => (SchemaType::Int16, None),
            (ValueKind::Integer, oid::INT4) => (SchemaType::Int32, None),
            (ValueKind::Integer, _) => (SchemaType::Int64, None),
            (ValueKind::Boolean, _) => (SchemaType::Boolean, None),
            (ValueKind::Float32, _) => (SchemaType::Float32, None),
            (ValueKind::Float64, _) => (SchemaType::Float64, None),
            (ValueKind::Bytes, _) => (SchemaType::Bytes, None),
            (ValueKind::Text, oid::UUID) => (SchemaType::String, Some("io.debezium.data.Uuid")),
            (ValueKind::Text, oid::JSON | oid::JSONB) => {
                (SchemaType::String, Some("io.debezium.data.Json"))
            }
            (ValueKind::Text, _) => (SchemaType::String, None),
        };
        Schema {
            ty,
            optional: !self.not_null,
            name: name.map(str::to_owned),
            version: name.map(|_| 1),
        }
    }
}

/// An additional column, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BoundAdditional {
    pub(crate) placement: Placement,
    pub(crate) alias: Arc<str>,
    pub(crate) column: BoundColumn,
}

/// The extra columns of one table for the formats beyond Debezium's, bound by
/// `crate::extension` (none unless they are configured).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ExtensionColumns {
    pub(crate) event_type: Option<BoundColumn>,
    pub(crate) traceparent: Option<BoundColumn>,
    pub(crate) tracestate: Option<BoundColumn>,
}

/// The configured columns of one table, resolved from its `Relation` message by
/// [`crate::EventRouter::bind`]. Bind again when a new `Relation` message for the table
/// arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableBinding {
    pub(crate) table: Arc<str>,
    pub(crate) relation_id: Oid,
    pub(crate) column_count: usize,
    pub(crate) event_id: BoundColumn,
    pub(crate) event_key: BoundColumn,
    pub(crate) payload: BoundColumn,
    pub(crate) route_by: BoundColumn,
    pub(crate) timestamp: Option<BoundColumn>,
    pub(crate) schema_version: Option<BoundColumn>,
    pub(crate) additional: Vec<BoundAdditional>,
    /// The Debezium value schema name of the table's rows, `<topic.prefix>.<schema>.<table>.Value`.
    pub(crate) row_schema_name: String,
    /// The columns of the formats beyond Debezium's (see [`crate::extension`]).
    pub(crate) extensions: ExtensionColumns,
}

impl TableBinding {
    /// The table as `schema.table`.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The relation oid the binding was made for.
    pub fn relation_id(&self) -> Oid {
        self.relation_id
    }

    /// How many columns the table had.
    pub fn column_count(&self) -> usize {
        self.column_count
    }
}

/// `schema.table`; pgoutput sends an empty schema for `pg_catalog`.
pub(crate) fn table_name(relation: &Relation) -> String {
    let schema = relation.namespace.as_str();
    let schema = if schema.is_empty() {
        "pg_catalog"
    } else {
        schema
    };
    format!("{schema}.{}", relation.name.as_str())
}

/// What types a role accepts, beyond the text/number/boolean kinds.
fn kind_for(role: ColumnRole, type_oid: Oid) -> Result<ValueKind, Option<&'static str>> {
    let scalar = ValueKind::of(type_oid);
    match role {
        ColumnRole::RouteBy => match scalar {
            Some(ValueKind::Text) => Ok(ValueKind::Text),
            _ => Err(None),
        },
        ColumnRole::EventTimestamp => match type_oid {
            oid::TIMESTAMP | oid::TIMESTAMPTZ => Ok(ValueKind::Text),
            _ => Err(Some("the event timestamp column must be timestamp or timestamptz")),
        },
        ColumnRole::SchemaVersion => match type_oid {
            oid::INT4 => Ok(ValueKind::Integer),
            _ => Err(Some("the schema version column must be integer (int4), which Debezium reads as an int32")),
        },
        ColumnRole::Additional(Placement::Partition) => match type_oid {
            oid::INT4 => Ok(ValueKind::Integer),
            _ => Err(Some("a partition column must be integer (int4), which Debezium reads as an int32")),
        },
        ColumnRole::EventKey | ColumnRole::Payload if type_oid == oid::BYTEA => Ok(ValueKind::Bytes),
        _ => scalar.ok_or(Some("")),
    }
}

pub(crate) fn bind(
    options: &RouterOptions,
    format: Format,
    relation: &Relation,
    not_null: &dyn Fn(&str) -> bool,
) -> Result<TableBinding, RouteError> {
    let table = table_name(relation);
    let lookup = |name: &str| {
        relation
            .columns
            .iter()
            .enumerate()
            .find(|(_, c)| c.name.as_str() == name)
    };
    let resolve = |role: ColumnRole, index: usize| -> Result<BoundColumn, RouteError> {
        let column = &relation.columns[index];
        let name = column.name.as_str();
        let kind = match kind_for(role, column.type_oid) {
            Ok(kind) => kind,
            Err(None) => {
                return Err(RouteError::RoutingColumnNotText {
                    table: table.clone(),
                    column: name.to_owned(),
                    type_name: type_name(column.type_oid),
                    type_oid: column.type_oid,
                })
            }
            Err(Some(expected)) if !expected.is_empty() => {
                return Err(RouteError::ColumnTypeMismatch {
                    table: table.clone(),
                    column: name.to_owned(),
                    option: role.option(),
                    type_name: type_name(column.type_oid),
                    type_oid: column.type_oid,
                    expected,
                })
            }
            Err(Some(_)) => {
                return Err(RouteError::UnsupportedColumnType {
                    table: table.clone(),
                    column: name.to_owned(),
                    option: role.option(),
                    type_name: type_name(column.type_oid),
                    type_oid: column.type_oid,
                })
            }
        };
        Ok(BoundColumn {
            index,
            name: Arc::from(name),
            kind,
            role,
            type_oid: column.type_oid,
            type_modifier: column.type_modifier,
            not_null: column.is_key() || not_null(name),
        })
    };
    let find = |role: ColumnRole, name: &str| -> Result<BoundColumn, RouteError> {
        let Some((index, _)) = lookup(name) else {
            return Err(RouteError::MissingColumn {
                table: table.clone(),
                column: name.to_owned(),
                option: role.option(),
                holds: role.holds(),
            });
        };
        resolve(role, index)
    };
    let route_by = find(ColumnRole::RouteBy, options.route_by_column())?;
    let event_id = find(ColumnRole::EventId, options.event_id_column())?;
    let event_key = find(ColumnRole::EventKey, options.event_key_column())?;
    let payload = find(ColumnRole::Payload, options.payload_column())?;
    let timestamp = options
        .timestamp_column()
        .map(|c| find(ColumnRole::EventTimestamp, c))
        .transpose()?;
    let schema_version = match options.schema_version_column() {
        Some(c) if options.has_envelope() => Some(find(ColumnRole::SchemaVersion, c)?),
        _ => None,
    };
    let mut additional = Vec::new();
    for field in options.additional_fields() {
        let role = ColumnRole::Additional(field.placement);
        if lookup(&field.column).is_none()
            && options.additional_missing() == AdditionalMissingBehavior::Ignore
        {
            continue;
        }
        let column = find(role, &field.column)?;
        if column.kind == ValueKind::Bytes {
            return Err(RouteError::UnsupportedColumnType {
                table: table.clone(),
                column: field.column.clone(),
                option: role.option(),
                type_name: type_name(column.type_oid),
                type_oid: column.type_oid,
            });
        }
        additional.push(BoundAdditional {
            placement: field.placement,
            alias: Arc::from(field.alias.as_str()),
            column,
        });
    }
    let has_envelope = additional
        .iter()
        .any(|a| a.placement == Placement::Envelope);
    check_encodings(&table, format, &event_key, &payload, has_envelope)?;
    let row_schema_name = match options.topic_prefix() {
        Some(prefix) => format!(
            "{prefix}.{}.{}.Value",
            relation.namespace.as_str(),
            relation.name.as_str()
        ),
        None => format!(
            "{}.{}.Value",
            relation.namespace.as_str(),
            relation.name.as_str()
        ),
    };
    Ok(TableBinding {
        table: Arc::from(table),
        relation_id: relation.id,
        column_count: relation.columns.len(),
        event_id,
        event_key,
        payload,
        route_by,
        timestamp,
        schema_version,
        additional,
        row_schema_name,
        extensions: ExtensionColumns::default(),
    })
}

/// Refuses the combinations Kafka Connect's converters fail on for every row.
fn check_encodings(
    table: &str,
    format: Format,
    key: &BoundColumn,
    payload: &BoundColumn,
    has_envelope: bool,
) -> Result<(), RouteError> {
    let fail = |reason: EncodingMismatch| {
        Err(RouteError::UnsupportedEncoding {
            table: table.to_owned(),
            reason,
        })
    };
    for (what, column, encoding) in [("key", key, format.key), ("value", payload, format.value)] {
        let bytes = column.kind == ValueKind::Bytes;
        match encoding {
            Encoding::Binary if what == "value" && has_envelope => {
                return fail(EncodingMismatch::BinaryEnvelope);
            }
            Encoding::Binary if !bytes => {
                return fail(EncodingMismatch::BinaryNeedsBytea {
                    side: what,
                    column: column.name.to_string(),
                    type_name: type_name(column.type_oid),
                });
            }
            Encoding::Registered(_) if what == "key" => {
                return fail(EncodingMismatch::RegisteredKey);
            }
            Encoding::Registered(_) if has_envelope => {
                return fail(EncodingMismatch::RegisteredEnvelope);
            }
            Encoding::Registered(_) if bytes => {
                return fail(EncodingMismatch::RegisteredBytes {
                    column: column.name.to_string(),
                });
            }
            Encoding::String if bytes => {
                return fail(EncodingMismatch::StringOfBytea {
                    side: what,
                    column: column.name.to_string(),
                });
            }
            _ => {}
        }
    }
    Ok(())
}
