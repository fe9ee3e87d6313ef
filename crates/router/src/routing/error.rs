//! Errors of configuration ([`ConfigError`]) and of routing one row ([`RouteError`]).
//!
//! Every message says what is wrong and how to fix it. Routing errors always name the table
//! (`schema.table`) and, where one is involved, the column and the option that selects it.
//!
//! # Invariants
//! - Each [`RouteError`] variant carries the table name.
//! - Messages never contain more than [`MAX_SHOWN_VALUE`] characters of row data.

use crate::routing::policy::InvalidOperationBehavior;
use thiserror::Error;

/// How many characters of a column value an error message shows at most.
pub const MAX_SHOWN_VALUE: usize = 64;

/// A router option that is unknown or has an unusable value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// The option is not one the router knows.
    #[error("unknown outbox router option \"{option}\"{hint}; supported options: {supported}")]
    UnknownOption {
        option: String,
        /// A suggestion such as ` (did you mean "route.by.field"?)`, or empty.
        hint: String,
        /// The supported option names, comma separated.
        supported: String,
    },
    /// The option needs a non-empty value.
    #[error("outbox router option {option} is empty; set it to {expected} or remove it to use the default \"{default}\"")]
    EmptyValue {
        option: &'static str,
        expected: &'static str,
        default: &'static str,
    },
    /// The value is not one of the accepted values.
    #[error(
        "outbox router option {option} has the value \"{value}\"; accepted values: {expected}"
    )]
    InvalidValue {
        option: &'static str,
        value: String,
        expected: &'static str,
    },
    /// `route.topic.replacement` is not a valid replacement template.
    #[error("outbox router option route.topic.replacement has the value \"{value}\", which is not a valid replacement: {reason}; use ${{routedByValue}} for the value of the route.by.field column and write a literal $ or \\ as \\$ or \\\\")]
    InvalidTopicReplacement { value: String, reason: String },
    /// `route.topic.regex` does not compile.
    #[error("outbox router option route.topic.regex has the value \"{value}\", which is not a supported regular expression: {reason}; Java syntax is accepted except lookaround, backreferences and possessive quantifiers")]
    InvalidTopicRegex { value: String, reason: String },
    /// An entry of `table.fields.additional.placement` is malformed.
    #[error("outbox router option table.fields.additional.placement has the entry \"{entry}\": {reason}; write entries as column:header, column:envelope, column:partition, optionally followed by :alias, separated by commas")]
    InvalidAdditionalPlacement { entry: String, reason: String },
    /// An option another option needs is not set.
    #[error("outbox router option {option} is not set, but {needed_by}; set {option}")]
    MissingOption {
        option: &'static str,
        needed_by: &'static str,
    },
}

/// Why a table cannot be bound or a row cannot be routed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RouteError {
    /// A configured column is not in the table.
    #[error("table {table} has no column \"{column}\" (the column named by {option}); add it or set {option} to the column that holds {holds}")]
    MissingColumn {
        table: String,
        column: String,
        option: &'static str,
        /// What the column is for, e.g. "the aggregate id".
        holds: &'static str,
    },
    /// A configured column is in the table, but PostgreSQL leaves it out of the replication
    /// stream (a generated column the publication does not publish): `cause` says why and
    /// what to change, for the server's version.
    #[error("column \"{column}\" of table {table} (the column named by {option}) is not in the replication stream: it is {cause}")]
    UnpublishedColumn {
        table: String,
        column: String,
        option: &'static str,
        cause: String,
    },
    /// A configured column has a type the router cannot encode as Debezium does.
    #[error("column \"{column}\" of table {table} (the column named by {option}) has type {type_name} (oid {type_oid}), which the outbox router does not support; use a column of type text, varchar, char, uuid, json, jsonb, smallint, integer, bigint, boolean, real or double precision")]
    UnsupportedColumnType {
        table: String,
        column: String,
        option: &'static str,
        type_name: String,
        type_oid: u32,
    },
    /// The routing column is not text, so its value cannot become part of a topic name.
    #[error("column \"{column}\" of table {table} (the column named by route.by.field) has type {type_name} (oid {type_oid}), but the routing column must be text-like; change its type to text or varchar, or set route.by.field to a text column")]
    RoutingColumnNotText {
        table: String,
        column: String,
        type_name: String,
        type_oid: u32,
    },
    /// A column that every outbox event needs is NULL.
    #[error("column \"{column}\" of table {table} (the column named by {option}) is NULL in an inserted row; every outbox event needs {holds}: declare the column NOT NULL and fill it when inserting")]
    NullColumn {
        table: String,
        column: String,
        option: &'static str,
        holds: &'static str,
    },
    /// The server sent an unchanged-TOAST marker instead of a value; this does not happen for
    /// inserted rows, so the stream is inconsistent.
    #[error("column \"{column}\" of table {table} arrived as an unchanged TOAST value in an inserted row, which PostgreSQL never sends for an INSERT; the replication stream is inconsistent, restart replication from the last confirmed position")]
    UnchangedToast { table: String, column: String },
    /// The column arrived in PostgreSQL's binary format.
    #[error("column \"{column}\" of table {table} arrived in binary format; the outbox router reads the text format only, so do not enable the binary option of pgoutput")]
    BinaryColumn { table: String, column: String },
    /// The column's text is not UTF-8.
    #[error("column \"{column}\" of table {table} holds text that is not valid UTF-8; create the database with UTF8 encoding (or convert the stored values) so the value can be written to Kafka unchanged")]
    InvalidUtf8 { table: String, column: String },
    /// The column's text is not a valid value of its type.
    #[error("column \"{column}\" of table {table} has type {type_name} but holds \"{value}\", which is not valid text for that type; the replication stream is inconsistent")]
    InvalidValue {
        table: String,
        column: String,
        type_name: &'static str,
        /// The value, cut to [`MAX_SHOWN_VALUE`] characters.
        value: String,
    },
    /// The row has a different number of columns than the table had when it was bound.
    #[error("a row of table {table} has {actual} columns but the table had {expected} when it was bound; bind the table again from its latest Relation message")]
    ColumnCountMismatch {
        table: String,
        expected: usize,
        actual: usize,
    },
    /// The topic built from `route.topic.replacement` is not a legal Kafka topic name.
    #[error("the value \"{value}\" of column \"{column}\" of table {table} (route.by.field) gives the topic name \"{topic}\", which Kafka does not accept: {reason}; store a routing value made of ASCII letters, digits, '.', '_' and '-', or change route.topic.replacement")]
    InvalidTopic {
        table: String,
        column: String,
        /// The routing value, cut to [`MAX_SHOWN_VALUE`] characters.
        value: String,
        /// The topic, cut to [`MAX_SHOWN_VALUE`] characters.
        topic: String,
        reason: &'static str,
    },
    /// A configured column's type does not fit what the column is used for.
    #[error("column \"{column}\" of table {table} (the column named by {option}) has type {type_name} (oid {type_oid}), but {expected}; change the column type or the option")]
    ColumnTypeMismatch {
        table: String,
        column: String,
        option: &'static str,
        type_name: String,
        type_oid: u32,
        /// What the column must be, e.g. "the partition column must be integer".
        expected: &'static str,
    },
    /// The configured encodings cannot write this table's records.
    #[error("table {table}: {reason}")]
    UnsupportedEncoding { table: String, reason: String },
    /// The event timestamp column holds infinity, which is no record timestamp.
    #[error("column \"{column}\" of table {table} (the column named by table.field.event.timestamp) holds \"{value}\", which cannot be a Kafka record timestamp; store a finite timestamp")]
    InfiniteTimestamp {
        table: String,
        column: String,
        value: String,
    },
    /// `table.expand.json.payload` turned the payload into a schema its value does not fit;
    /// Debezium's converter fails the task here.
    #[error("the payload in column \"{column}\" of table {table} cannot be written with table.expand.json.payload=true: {reason}; store a JSON object whose arrays hold values of one type, or turn the expansion off")]
    JsonExpansion {
        table: String,
        column: String,
        reason: String,
    },
    /// The payload does not fit the envelope schema cached for its schema version (built for
    /// the first record of that version); Debezium's router fails the task here.
    #[error("the payload in column \"{column}\" of table {table} does not fit the envelope schema built for the first payload of schema version {}, and the envelope schema is cached per version (table.field.event.schema.version); give payloads of another shape a new version", version.map_or_else(|| "NULL".to_owned(), |v| v.to_string()))]
    EnvelopeVersionMismatch {
        table: String,
        column: String,
        version: Option<i32>,
    },
    /// An UPDATE reached an outbox table while `table.op.invalid.behavior` is `fatal`.
    #[error("a row of outbox table {table} was updated, and table.op.invalid.behavior is {behavior}; outbox rows must only be inserted (and deleted): stop updating them, or set table.op.invalid.behavior to warn or error to skip updates")]
    InvalidOperation {
        table: String,
        behavior: InvalidOperationBehavior,
    },
}

/// `value` cut to [`MAX_SHOWN_VALUE`] characters, with `…` when cut.
pub(crate) fn shown(value: &str) -> String {
    match value.char_indices().nth(MAX_SHOWN_VALUE) {
        Some((cut, _)) => format!("{}…", &value[..cut]),
        None => value.to_owned(),
    }
}

/// Lossy text of raw column bytes, cut to [`MAX_SHOWN_VALUE`] characters.
pub(crate) fn shown_bytes(value: &[u8]) -> String {
    shown(&String::from_utf8_lossy(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_cuts_long_values_on_char_boundaries() {
        assert_eq!(shown("abc"), "abc");
        let long = "é".repeat(MAX_SHOWN_VALUE + 5);
        let cut = shown(&long);
        assert_eq!(cut.chars().count(), MAX_SHOWN_VALUE + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(shown_bytes(b"a\xffb"), "a\u{fffd}b");
    }
}
