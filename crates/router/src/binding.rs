//! Resolving the configured columns in a table, once per `Relation` message.
//!
//! # Invariants
//! - A [`TableBinding`] only exists for a table that has all four configured columns, each of
//!   a supported type, with a text-like routing column.
//! - Column indexes in a binding are below its column count.

use crate::encode::{type_name, ValueKind};
use crate::error::RouteError;
use crate::options::{
    RouterOptions, FIELD_EVENT_ID, FIELD_EVENT_KEY, FIELD_EVENT_PAYLOAD, ROUTE_BY_FIELD,
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
}

impl ColumnRole {
    /// The option that names the column.
    pub fn option(self) -> &'static str {
        match self {
            ColumnRole::EventId => FIELD_EVENT_ID,
            ColumnRole::EventKey => FIELD_EVENT_KEY,
            ColumnRole::Payload => FIELD_EVENT_PAYLOAD,
            ColumnRole::RouteBy => ROUTE_BY_FIELD,
        }
    }

    /// What the column holds, for messages.
    pub fn holds(self) -> &'static str {
        match self {
            ColumnRole::EventId => "the event id",
            ColumnRole::EventKey => "the aggregate id",
            ColumnRole::Payload => "the event payload",
            ColumnRole::RouteBy => "the aggregate type",
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

pub(crate) fn bind(
    options: &RouterOptions,
    relation: &Relation,
) -> Result<TableBinding, RouteError> {
    let table = table_name(relation);
    let find = |role: ColumnRole, name: &str| -> Result<BoundColumn, RouteError> {
        let Some((index, column)) = relation
            .columns
            .iter()
            .enumerate()
            .find(|(_, c)| c.name.as_str() == name)
        else {
            return Err(RouteError::MissingColumn {
                table: table.clone(),
                column: name.to_owned(),
                option: role.option(),
                holds: role.holds(),
            });
        };
        let kind = match ValueKind::of(column.type_oid) {
            Some(ValueKind::Text) => ValueKind::Text,
            // Debezium reads the routing value as a string.
            _ if role == ColumnRole::RouteBy => {
                return Err(RouteError::RoutingColumnNotText {
                    table: table.clone(),
                    column: name.to_owned(),
                    type_name: type_name(column.type_oid),
                    type_oid: column.type_oid,
                })
            }
            Some(kind) => kind,
            None => {
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
        })
    };
    let route_by = find(ColumnRole::RouteBy, options.route_by_column())?;
    let event_id = find(ColumnRole::EventId, options.event_id_column())?;
    let event_key = find(ColumnRole::EventKey, options.event_key_column())?;
    let payload = find(ColumnRole::Payload, options.payload_column())?;
    Ok(TableBinding {
        table: Arc::from(table),
        relation_id: relation.id,
        column_count: relation.columns.len(),
        event_id,
        event_key,
        payload,
        route_by,
    })
}
