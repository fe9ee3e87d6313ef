//! Formats beyond Debezium's: protobuf values, CloudEvents and W3C trace context.
//!
//! [`EventExtensions`] is what the user configured; [`EventRouter::with_extensions`] checks it
//! against the router options. Binding a table resolves the extra columns it needs (the event
//! type column for protobuf and CloudEvents, the trace columns); routing a row first builds
//! the Debezium record, then `Extensions::finish` rewrites its value (protobuf, structured
//! CloudEvents) and appends headers (`ce_*`, `content-type`, `traceparent`, `tracestate`).
//!
//! A malformed trace context is left out of the record and counted
//! ([`EventRouter::malformed_trace_contexts`]); it never fails the row.
//!
//! [`EventRouter::with_extensions`]: crate::EventRouter::with_extensions
//! [`EventRouter::malformed_trace_contexts`]: crate::EventRouter::malformed_trace_contexts
//!
//! # Invariants
//! - With the default [`EventExtensions`] no column is bound and records are unchanged:
//!   Debezium compatibility is untouched.
//! - Headers the Debezium record has are kept, in order; new ones are appended after them.
//! - Trace context never fails a row.

pub(crate) mod cloudevents;
pub(crate) mod position;
pub(crate) mod protobuf;
pub(crate) mod trace;

use crate::extension::cloudevents::{Attributes, CloudEventsMode, CloudEventsOptions, DataForm};
use crate::extension::position::SourcePosition;
use crate::extension::protobuf::{timestamp_from_micros, v1};
use crate::extension::trace::{TraceOptions, TraceRead};
use crate::format::encode::{decode_bytea, oid, to_string, type_name, BadValue, ValueKind};
use crate::format::encoding::{Encoding, Format};
use crate::format::timestamp::epoch_micros;
use crate::routing::binding::{
    table_name, BoundColumn, ColumnRole, ExtensionColumns, TableBinding,
};
use crate::routing::error::RouteError;
use crate::routing::options::{Placement, RouterOptions};
use crate::routing::route::{cell, invalid};
use bytes::Bytes;
use pgoutput::{Relation, TupleData};
use siphon_record::{Header, RoutedRecord};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use thiserror::Error;

/// The formats configured beyond Debezium's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventExtensions {
    /// Write values as `siphon.outbox.v1.OutboxEvent` protobuf messages (`format.value =
    /// "protobuf"`) instead of the Debezium value encoding.
    pub protobuf_value: bool,
    /// The column holding the event type (read with protobuf values, CloudEvents and record
    /// name subjects only).
    pub event_type_column: String,
    /// Write CloudEvents.
    pub cloudevents: Option<CloudEventsOptions>,
    /// Carry the W3C trace context from these columns.
    pub trace: Option<TraceOptions>,
    /// Read the event type as the record name of registry subjects
    /// (`schema_registry.subject_name_strategy` naming subjects by record).
    pub registry_record_names: bool,
}

impl Default for EventExtensions {
    fn default() -> Self {
        EventExtensions {
            protobuf_value: false,
            event_type_column: "type".to_owned(),
            cloudevents: None,
            trace: None,
            registry_record_names: false,
        }
    }
}

impl EventExtensions {
    /// Whether anything is configured.
    pub fn is_active(&self) -> bool {
        self.protobuf_value || self.cloudevents.is_some() || self.trace.is_some()
    }

    fn needs_event_type(&self) -> bool {
        self.protobuf_value || self.cloudevents.is_some() || self.registry_record_names
    }

    /// Refuses combinations that cannot work, naming the fix.
    ///
    /// # Errors
    /// See [`ExtensionConfigError`].
    pub fn check(&self, options: &RouterOptions) -> Result<(), ExtensionConfigError> {
        if self.needs_event_type() && self.event_type_column.trim().is_empty() {
            return Err(ExtensionConfigError::EmptyTypeColumn);
        }
        if self.protobuf_value && options.expand_json_payload() {
            return Err(ExtensionConfigError::ProtobufExpand);
        }
        if let Some(ce) = &self.cloudevents {
            if !cloudevents::is_uri_reference(&ce.source) {
                return Err(ExtensionConfigError::InvalidSource {
                    source_attribute: ce.source.clone(),
                });
            }
            if ce.mode == CloudEventsMode::Structured && options.tombstone_on_empty_payload() {
                return Err(ExtensionConfigError::StructuredTombstone);
            }
        }
        if let Some(t) = &self.trace {
            if t.column.trim().is_empty() {
                return Err(ExtensionConfigError::EmptyTraceColumn);
            }
            if t.state_column.as_deref() == Some(t.column.as_str()) {
                return Err(ExtensionConfigError::SameTraceColumns {
                    column: t.column.clone(),
                });
            }
        }
        Ok(())
    }
}

/// A configuration of the extra formats that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ExtensionConfigError {
    /// The event type column name is empty.
    #[error("router.\"table.field.event.type\" is empty, but protobuf values and CloudEvents need the event type column; name it, or remove the option to use the default \"type\"")]
    EmptyTypeColumn,
    /// Protobuf values carry the payload column's bytes; expansion would change nothing.
    #[error("format.value = \"protobuf\" writes the payload column's bytes as they are, so router.\"table.expand.json.payload\" = true would have no effect; remove that option or choose another value format")]
    ProtobufExpand,
    /// `cloudevents.source` is not a URI-reference.
    #[error("cloudevents.source = {source_attribute:?} is not a URI-reference (RFC 3986: no spaces or non-ASCII characters, % followed by two hex digits); use e.g. \"/siphon/<database>/<slot>\" or \"urn:example:orders\", or remove it for the default")]
    InvalidSource { source_attribute: String },
    /// Structured mode has no way to write a tombstone.
    #[error("cloudevents.mode = \"structured\" writes every record as an event, so it cannot write the tombstones router.\"route.tombstone.on.empty.payload\" = true asks for; use cloudevents.mode = \"binary\" (which keeps tombstones) or remove that option")]
    StructuredTombstone,
    /// CloudEvents and protobuf values replace the value a registry format writes.
    #[error("format.value = \"avro\" writes the value for a schema registry, and CloudEvents or protobuf values would replace it; remove the [cloudevents] section or choose another value format")]
    RegistryValue,
    /// `trace.column` is empty.
    #[error("trace.column is empty; name the column holding the W3C traceparent (e.g. \"traceparent\"), or remove the [trace] section")]
    EmptyTraceColumn,
    /// Both trace columns are the same.
    #[error("trace.state_column names the same column as trace.column ({column:?}); the tracestate needs a column of its own")]
    SameTraceColumns { column: String },
}

impl ExtensionConfigError {
    /// What the error means for the process: the configuration must be changed.
    pub fn consequence(&self) -> siphon_record::Consequence {
        siphon_record::Consequence::Fix
    }
}

/// The extra formats of a router, with the count of malformed trace contexts.
#[derive(Debug, Clone, Default)]
pub(crate) struct Extensions {
    pub(crate) config: EventExtensions,
    /// Shared by the router's clones.
    pub(crate) malformed_trace: Arc<AtomicU64>,
}

/// A text-like column for an extra role.
fn text_column(
    relation: &Relation,
    name: &str,
    role: ColumnRole,
) -> Result<BoundColumn, RouteError> {
    let table = table_name(relation);
    let Some((index, column)) = relation
        .columns
        .iter()
        .enumerate()
        .find(|(_, c)| c.name.as_str() == name)
    else {
        return Err(RouteError::MissingColumn {
            table,
            column: name.to_owned(),
            option: role.option(),
            holds: role.holds(),
        });
    };
    if ValueKind::of(column.type_oid) != Some(ValueKind::Text) {
        return Err(RouteError::UnsupportedColumnType {
            table,
            column: name.to_owned(),
            option: role.option(),
            type_name: type_name(column.type_oid),
            type_oid: column.type_oid,
        });
    }
    Ok(BoundColumn {
        index,
        name: Arc::from(name),
        kind: ValueKind::Text,
        role,
        type_oid: column.type_oid,
        type_modifier: column.type_modifier,
        not_null: column.is_key(),
    })
}

impl Extensions {
    /// Resolves the extra columns of a table.
    pub(crate) fn bind(&self, relation: &Relation) -> Result<ExtensionColumns, RouteError> {
        let config = &self.config;
        let event_type = config
            .needs_event_type()
            .then(|| text_column(relation, &config.event_type_column, ColumnRole::EventType))
            .transpose()?;
        let (traceparent, tracestate) = match &config.trace {
            None => (None, None),
            Some(t) => (
                Some(text_column(relation, &t.column, ColumnRole::TraceParent)?),
                t.state_column
                    .as_deref()
                    .map(|c| text_column(relation, c, ColumnRole::TraceState))
                    .transpose()?,
            ),
        };
        Ok(ExtensionColumns {
            event_type,
            traceparent,
            tracestate,
        })
    }

    /// The row's event type: its column's text (NULL is an error naming the column); `None`
    /// when no format reads it, so the column is not bound.
    pub(crate) fn event_type<'r>(
        binding: &TableBinding,
        row: &'r TupleData,
    ) -> Result<Option<&'r str>, RouteError> {
        let Some(column) = &binding.extensions.event_type else {
            return Ok(None);
        };
        match cell(binding, column, row)? {
            Some((_, text)) => Ok(Some(text)),
            None => Err(RouteError::NullColumn {
                table: binding.table().to_owned(),
                column: column.name.to_string(),
                option: column.role.option(),
                holds: column.role.holds(),
            }),
        }
    }

    /// Applies the extra formats to the Debezium record of a row.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn finish(
        &self,
        format: Format,
        options: &RouterOptions,
        binding: &TableBinding,
        row: &TupleData,
        position: &SourcePosition,
        routed_value: &str,
        mut record: RoutedRecord,
    ) -> Result<RoutedRecord, RouteError> {
        let config = &self.config;
        let text_of = |column: &BoundColumn| -> Result<Option<String>, RouteError> {
            match cell(binding, column, row)? {
                None => Ok(None),
                // A bytea key reads as PostgreSQL prints it (`\x…`).
                Some((_, text)) if column.kind == ValueKind::Bytes => Ok(Some(text.to_owned())),
                Some((raw, text)) => {
                    let bytes = to_string(column.kind, raw, text)
                        .map_err(|BadValue| invalid(binding, column, raw))?;
                    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
                }
            }
        };

        let id = text_of(&binding.event_id)?.unwrap_or_default();
        let aggregate_id = text_of(&binding.event_key)?;
        let event_type = Self::event_type(binding, row)?
            .unwrap_or_default()
            .to_owned();
        let event_time_us = match &binding.timestamp {
            Some(column) => match cell(binding, column, row)? {
                Some((_, text)) => epoch_micros(text).ok(),
                None => None,
            },
            None => None,
        }
        .or(position.commit_time_us);
        // Read last, so that a row failing for another reason is not counted.
        let trace = self.read_trace(binding, row)?;

        if config.protobuf_value {
            let (payload, content_type, has_payload) = self.payload(binding, row)?;
            let mut fields = BTreeMap::new();
            for extra in &binding.additional {
                if let Some(text) = text_of(&extra.column)? {
                    fields.insert(extra.alias.to_string(), text);
                }
            }
            let event = v1::OutboxEvent {
                id: id.clone(),
                aggregate_type: routed_value.to_owned(),
                aggregate_id: aggregate_id.clone().unwrap_or_default(),
                r#type: event_type.clone(),
                payload,
                content_type: content_type.to_owned(),
                timestamp: event_time_us.map(timestamp_from_micros),
                source: Some(v1::SourcePosition {
                    commit_lsn: position.commit_lsn.0,
                    lsn: position.lsn.0,
                    xid: position.xid,
                    table: binding.table().to_owned(),
                }),
                fields,
                has_payload,
            };
            // `route.tombstone.on.empty.payload` as Debezium reads it: NULL, or text made only
            // of characters up to U+0020.
            let empty = !has_payload
                || (binding.payload.kind == ValueKind::Text
                    && event.payload.iter().all(|&b| b <= b' '));
            record.value = if empty && options.tombstone_on_empty_payload() {
                None
            } else {
                Some(protobuf::encode(&event))
            };
        }

        let (parent, state) = match trace {
            TraceRead::Valid { parent, state, .. } => (Some(parent), state),
            TraceRead::Absent | TraceRead::Malformed => (None, None),
        };

        if let Some(ce) = &config.cloudevents {
            let (content_type, form) = self.data_form(format, options, binding);
            let attributes = Attributes {
                id: &id,
                source: &ce.source,
                event_type: &event_type,
                subject: aggregate_id.as_deref(),
                time: event_time_us.map(|us| timestamp_from_micros(us).to_string()),
                data_content_type: content_type,
                traceparent: parent,
                tracestate: state,
            };
            match ce.mode {
                CloudEventsMode::Binary => {
                    record
                        .headers
                        .extend(cloudevents::binary_headers(&attributes));
                }
                CloudEventsMode::Structured => {
                    let (value, content_type) =
                        cloudevents::structured(&attributes, record.value.as_deref(), form);
                    record.value = Some(value);
                    record.headers.push(content_type);
                }
            }
        }

        if let Some(parent) = parent {
            record.headers.push(text_header(trace::TRACEPARENT, parent));
            if let Some(state) = state {
                record.headers.push(text_header(trace::TRACESTATE, state));
            }
        }
        Ok(record)
    }

    /// The trace context of a row; counts a malformed one.
    fn read_trace<'r>(
        &self,
        binding: &TableBinding,
        row: &'r TupleData,
    ) -> Result<TraceRead<'r>, RouteError> {
        let bound = &binding.extensions;
        let Some(parent_column) = &bound.traceparent else {
            return Ok(TraceRead::Absent);
        };
        let parent = cell(binding, parent_column, row)?.map(|(_, t)| t);
        let state = match &bound.tracestate {
            Some(column) => cell(binding, column, row)?.map(|(_, t)| t),
            None => None,
        };
        let read = trace::read(parent, state);
        match read {
            TraceRead::Malformed
            | TraceRead::Valid {
                state_malformed: true,
                ..
            } => {
                self.malformed_trace.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        Ok(read)
    }

    /// The payload column's bytes, media type, and whether it was not NULL.
    fn payload(
        &self,
        binding: &TableBinding,
        row: &TupleData,
    ) -> Result<(Bytes, &'static str, bool), RouteError> {
        let column = &binding.payload;
        let content_type = payload_content_type(column);
        let Some((raw, text)) = cell(binding, column, row)? else {
            return Ok((Bytes::new(), content_type, false));
        };
        let bytes = match column.kind {
            ValueKind::Text => raw.clone(),
            ValueKind::Bytes => {
                decode_bytea(text).map_err(|BadValue| invalid(binding, column, raw))?
            }
            kind => to_string(kind, raw, text).map_err(|BadValue| invalid(binding, column, raw))?,
        };
        Ok((bytes, content_type, true))
    }

    /// The media type of the record value and how a structured event embeds it.
    fn data_form(
        &self,
        format: Format,
        options: &RouterOptions,
        binding: &TableBinding,
    ) -> (&'static str, DataForm) {
        if self.config.protobuf_value {
            return (protobuf::CONTENT_TYPE, DataForm::Binary);
        }
        let payload_is_json = matches!(binding.payload.type_oid, oid::JSON | oid::JSONB);
        let has_envelope = binding
            .additional
            .iter()
            .any(|a| a.placement == Placement::Envelope);
        match format.value {
            Encoding::Json | Encoding::JsonSchemas => (JSON, DataForm::Json),
            // The string encoding writes a json column's text as PostgreSQL printed it, but
            // an expanded payload or an envelope as Java's Struct.toString.
            Encoding::String
                if payload_is_json && !has_envelope && !options.expand_json_payload() =>
            {
                (JSON, DataForm::Json)
            }
            Encoding::String => (TEXT, DataForm::Text),
            // The router refuses extensions that rewrite a registry format's value.
            Encoding::Binary | Encoding::Avro | Encoding::Registered(_) => {
                (OCTET_STREAM, DataForm::Binary)
            }
        }
    }
}

const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";
const OCTET_STREAM: &str = "application/octet-stream";

fn payload_content_type(column: &BoundColumn) -> &'static str {
    match (column.kind, column.type_oid) {
        (ValueKind::Bytes, _) => OCTET_STREAM,
        (_, oid::JSON | oid::JSONB) => JSON,
        _ => TEXT,
    }
}

fn text_header(name: &str, value: &str) -> Header {
    Header {
        name: Arc::from(name),
        value: Some(Bytes::copy_from_slice(value.as_bytes())),
    }
}

/// The default `cloudevents.source`: `/siphon/<database>/<slot>`, each part percent-encoded
/// where RFC 3986 needs it.
pub fn default_cloudevents_source(database: &str, slot: &str) -> String {
    fn encode(part: &str) -> String {
        let mut out = String::with_capacity(part.len());
        for b in part.bytes() {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        out
    }
    format!("/siphon/{}/{}", encode(database), encode(slot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_source_is_a_uri_reference() {
        assert_eq!(
            default_cloudevents_source("app", "siphon"),
            "/siphon/app/siphon"
        );
        let odd = default_cloudevents_source("my db/é", "s");
        assert_eq!(odd, "/siphon/my%20db%2F%C3%A9/s");
        assert!(cloudevents::is_uri_reference(&odd));
    }

    #[test]
    fn combinations_are_checked() {
        let options = |pairs: &[(&str, &str)]| {
            RouterOptions::from_map(
                &pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
            .expect("valid options")
        };
        let structured = EventExtensions {
            cloudevents: Some(CloudEventsOptions {
                mode: CloudEventsMode::Structured,
                source: "/s".into(),
            }),
            ..EventExtensions::default()
        };
        assert_eq!(structured.check(&options(&[])), Ok(()));
        assert_eq!(
            structured.check(&options(&[("route.tombstone.on.empty.payload", "true")])),
            Err(ExtensionConfigError::StructuredTombstone)
        );
        let bad_source = EventExtensions {
            cloudevents: Some(CloudEventsOptions {
                mode: CloudEventsMode::Binary,
                source: "not a uri".into(),
            }),
            ..EventExtensions::default()
        };
        assert!(matches!(
            bad_source.check(&options(&[])),
            Err(ExtensionConfigError::InvalidSource { .. })
        ));
        let protobuf = EventExtensions {
            protobuf_value: true,
            ..EventExtensions::default()
        };
        assert_eq!(
            protobuf.check(&options(&[("table.expand.json.payload", "true")])),
            Err(ExtensionConfigError::ProtobufExpand)
        );
        let trace = EventExtensions {
            trace: Some(TraceOptions {
                column: "tp".into(),
                state_column: Some("tp".into()),
            }),
            ..EventExtensions::default()
        };
        assert!(matches!(
            trace.check(&options(&[])),
            Err(ExtensionConfigError::SameTraceColumns { .. })
        ));
    }
}
