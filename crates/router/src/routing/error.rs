//! Errors of configuration ([`RouterConfigError`]) and of routing one row ([`RouteError`]).
//!
//! Every message says what is wrong and how to fix it. Routing errors always name the table
//! (`schema.table`) and, where one is involved, the column and the option that selects it.
//!
//! Variants carry typed fields (names, values, counts, typed reasons such as
//! [`ReplacementError`] or [`crate::ExpansionError`], and [`RouteError::UnpublishedColumn`]'s
//! [`Unpublished`], which the source finds in the catalog); the text is rendered only by
//! `Display`.
//!
//! # Invariants
//! - Each [`RouteError`] variant carries the table name.
//! - Each error says what it means for the process through `consequence()`.
//! - Messages never contain more than [`MAX_SHOWN_VALUE`] characters of row data.

use crate::format::expand::ExpansionError;
use crate::routing::own_topics::OwnTopicRole;
use crate::routing::policy::InvalidOperationBehavior;
use pgoutput::unpublished::Unpublished;
use siphon_record::Consequence;
use thiserror::Error;

/// How many characters of a column value an error message shows at most.
pub const MAX_SHOWN_VALUE: usize = 64;

/// A router option that is unknown or has an unusable value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RouterConfigError {
    /// The option is not one the router knows.
    #[error("unknown outbox router option \"{option}\"{}; supported options: {}", did_you_mean(.suggestion), .supported.join(", "))]
    UnknownOption {
        option: String,
        /// The supported option the name ends with (`transforms.outbox.route.by.field`), if any.
        suggestion: Option<&'static str>,
        /// The supported option names.
        supported: Vec<&'static str>,
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
    InvalidTopicReplacement {
        value: String,
        reason: ReplacementError,
    },
    /// `route.topic.regex` does not compile.
    #[error("outbox router option route.topic.regex has the value \"{value}\", which is not a supported regular expression: {}; Java syntax is accepted except lookaround, backreferences and possessive quantifiers", last_line(.reason))]
    InvalidTopicRegex {
        value: String,
        reason: JavaRegexError,
    },
    /// An entry of `table.fields.additional.placement` is malformed.
    #[error("outbox router option table.fields.additional.placement has the entry \"{entry}\": {reason}; write entries as column:header, column:envelope, column:partition, optionally followed by :alias, separated by commas")]
    InvalidAdditionalPlacement {
        entry: String,
        reason: PlacementEntryError,
    },
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
        cause: Box<Unpublished>,
    },
    /// A configured column has a type the router cannot encode as Debezium does.
    #[error("column \"{column}\" of table {table} (the column named by {option}) has type {type_name} (oid {type_oid}), which the outbox router does not support; use a column of type text, varchar, char, uuid, json, jsonb, smallint, integer, bigint, boolean, real or double precision")]
    UnsupportedColumnType {
        table: String,
        column: String,
        option: &'static str,
        type_name: &'static str,
        type_oid: u32,
    },
    /// The routing column is not text, so its value cannot become part of a topic name.
    #[error("column \"{column}\" of table {table} (the column named by route.by.field) has type {type_name} (oid {type_oid}), but the routing column must be text-like; change its type to text or varchar, or set route.by.field to a text column")]
    RoutingColumnNotText {
        table: String,
        column: String,
        type_name: &'static str,
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
    /// The topic built from `route.topic.replacement` is one of Siphon's own
    /// ([`crate::routing::own_topics`]).
    #[error("the value \"{value}\" of column \"{column}\" of table {table} (route.by.field) gives the topic name \"{topic}\", which is Siphon's {role}; Siphon refuses to write an outbox record there: store another routing value, or change route.topic.replacement or {}", role.option())]
    OwnTopic {
        table: String,
        column: String,
        /// The routing value, cut to [`MAX_SHOWN_VALUE`] characters.
        value: String,
        /// The topic, whole (a topic name has at most 249 characters).
        topic: String,
        role: OwnTopicRole,
    },
    /// A configured column's type does not fit what the column is used for.
    #[error("column \"{column}\" of table {table} (the column named by {option}) has type {type_name} (oid {type_oid}), but {expected}; change the column type or the option")]
    ColumnTypeMismatch {
        table: String,
        column: String,
        option: &'static str,
        type_name: &'static str,
        type_oid: u32,
        /// What the column must be, e.g. "the partition column must be integer".
        expected: &'static str,
    },
    /// The configured encodings cannot write this table's records.
    #[error("table {table}: {reason}")]
    UnsupportedEncoding {
        table: String,
        reason: EncodingMismatch,
    },
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
        reason: ExpansionError,
    },
    /// The payload cannot be written as Avro (a name Avro refuses, a schema nested too deep).
    #[error(
        "the payload in column \"{column}\" of table {table} cannot be written as Avro: {reason}"
    )]
    Avro {
        table: String,
        column: String,
        reason: crate::format::avro::AvroError,
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

impl RouterConfigError {
    /// What the error means for the process: the configuration must be changed.
    pub fn consequence(&self) -> Consequence {
        Consequence::Fix
    }
}

impl RouteError {
    /// What the error means for the process: most name a table, column or row to fix; a row
    /// PostgreSQL should never have sent is retried from the confirmed position; a value of a
    /// type the router reads, or a row that does not match its binding, is Siphon's bug.
    pub fn consequence(&self) -> Consequence {
        match self {
            RouteError::UnchangedToast { .. } => Consequence::Retry,
            RouteError::JsonExpansion {
                reason: ExpansionError::NoDeepThread { .. },
                ..
            } => Consequence::Retry,
            RouteError::Avro { reason, .. } => reason.consequence(),
            RouteError::InvalidValue { .. }
            | RouteError::ColumnCountMismatch { .. }
            | RouteError::JsonExpansion {
                reason: ExpansionError::DeepThreadFailed,
                ..
            } => Consequence::Bug,
            RouteError::MissingColumn { .. }
            | RouteError::UnpublishedColumn { .. }
            | RouteError::UnsupportedColumnType { .. }
            | RouteError::RoutingColumnNotText { .. }
            | RouteError::NullColumn { .. }
            | RouteError::BinaryColumn { .. }
            | RouteError::InvalidUtf8 { .. }
            | RouteError::InvalidTopic { .. }
            | RouteError::OwnTopic { .. }
            | RouteError::ColumnTypeMismatch { .. }
            | RouteError::UnsupportedEncoding { .. }
            | RouteError::InfiniteTimestamp { .. }
            | RouteError::JsonExpansion { .. }
            | RouteError::EnvelopeVersionMismatch { .. }
            | RouteError::InvalidOperation { .. } => Consequence::Fix,
        }
    }
}

/// Why the configured key or value encoding cannot write a table's records.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EncodingMismatch {
    /// `BinaryDataConverter` cannot write the struct an envelope placement makes.
    #[error("the binary value encoding (BinaryDataConverter) cannot write the struct value that an envelope placement in table.fields.additional.placement makes; use json or json-schemas")]
    BinaryEnvelope,
    /// `BinaryDataConverter` writes bytea columns only.
    #[error("the binary {side} encoding (BinaryDataConverter) writes bytea columns only, and column \"{column}\" has type {type_name}; use the json, json-schemas or string encoding")]
    BinaryNeedsBytea {
        /// `key` or `value`.
        side: &'static str,
        column: String,
        type_name: &'static str,
    },
    /// A registered schema takes the payload's JSON, not an envelope around it.
    #[error("registered schemas write the payload's JSON with the schema registered for it, and cannot write the envelope an envelope placement in table.fields.additional.placement makes; use header placements, or derived schemas")]
    RegisteredEnvelope,
    /// A registered schema takes the payload's JSON, which a bytea column does not hold.
    #[error("registered schemas write the payload's JSON with the schema registered for it, and column \"{column}\" is bytea; store the payload as json, jsonb or text")]
    RegisteredBytes { column: String },
    /// Registered schemas write values only.
    #[error("registered schemas (json-sr, schema_registry.schemas = \"registered\") write record values; write keys with the avro, json or string encoding (format.key)")]
    RegisteredKey,
    /// `StringConverter` cannot write a bytea column.
    #[error("the string {side} encoding (StringConverter) cannot write the bytea column \"{column}\" (Java would write an object identity); use the binary or json encoding")]
    StringOfBytea {
        /// `key` or `value`.
        side: &'static str,
        column: String,
    },
}

/// Why `route.topic.replacement` is not a valid replacement template.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReplacementError {
    /// A `\` at the end escapes nothing.
    #[error("it ends with a lone \\")]
    LoneBackslash,
    /// `${` without its `}`.
    #[error("a ${{ group reference is not closed by }}")]
    UnclosedName,
    /// `${name}` names no group of the regex.
    #[error("${{{name}}} names no group of route.topic.regex (named groups: {})", .known.join(", "))]
    UnknownName {
        name: String,
        /// The regex's named groups.
        known: Vec<String>,
    },
    /// `$n` is past the regex's groups.
    #[error("${group} names no group; route.topic.regex has {group_count} group(s)")]
    NoSuchGroup { group: usize, group_count: usize },
    /// A `$` without a group after it.
    #[error("a $ is not followed by a group reference such as ${{routedByValue}}")]
    NoGroupReference,
}

/// Why an entry of `table.fields.additional.placement` is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum PlacementEntryError {
    /// Not two or three parts separated by `:`.
    #[error("expected column:placement or column:placement:alias")]
    Shape,
    /// The column part is empty.
    #[error("the column name is empty")]
    EmptyColumn,
    /// The placement is not one of the three.
    #[error("the placement must be header, envelope or partition")]
    UnknownPlacement,
    /// An envelope field would be named `payload`.
    #[error("the envelope already has a field named payload; give the column another alias")]
    PayloadAlias,
    /// Two envelope fields would have the same name.
    #[error("two envelope fields have the same name")]
    DuplicateEnvelopeField,
}

/// Why a Java regular expression cannot be compiled by [`crate::java_regex`].
#[derive(Debug, Clone, Error)]
pub enum JavaRegexError {
    /// A possessive quantifier (`*+`, `++`, `?+`, `{n}+`): the `regex` crate would read it as a
    /// repetition of a repetition and match texts Java does not (`a*+a` never matches in Java).
    #[error("possessive quantifiers (such as *+) are not supported")]
    Possessive,
    /// The `regex` crate refused the translated pattern.
    #[error(transparent)]
    Regex(#[from] regex::Error),
}

impl PartialEq for JavaRegexError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (JavaRegexError::Possessive, JavaRegexError::Possessive) => true,
            (JavaRegexError::Regex(a), JavaRegexError::Regex(b)) => a == b,
            _ => false,
        }
    }
}

// `regex::Error` compares its message and size limit, which is an equivalence.
impl Eq for JavaRegexError {}

/// ` (did you mean "name"? ...)` for a suggested option, or nothing.
fn did_you_mean(suggestion: &Option<&'static str>) -> String {
    suggestion
        .map(|name| format!(" (did you mean \"{name}\"? leave out the transforms.<name>. prefix)"))
        .unwrap_or_default()
}

/// The last line of a regex error (the `regex` crate's messages show the pattern above it).
fn last_line(error: &JavaRegexError) -> String {
    error
        .to_string()
        .lines()
        .last()
        .unwrap_or("invalid")
        .trim()
        .to_owned()
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

    #[test]
    fn typed_reasons_render_the_messages_they_replaced() {
        let unknown = |suggestion| RouterConfigError::UnknownOption {
            option: "transforms.outbox.route.by.field".to_owned(),
            suggestion,
            supported: vec!["route.by.field", "topic.prefix"],
        };
        assert_eq!(
            unknown(Some("route.by.field")).to_string(),
            "unknown outbox router option \"transforms.outbox.route.by.field\" (did you mean \"route.by.field\"? leave out the transforms.<name>. prefix); supported options: route.by.field, topic.prefix"
        );
        assert_eq!(
            unknown(None).to_string(),
            "unknown outbox router option \"transforms.outbox.route.by.field\"; supported options: route.by.field, topic.prefix"
        );
        let replacements = [
            (ReplacementError::LoneBackslash, "it ends with a lone \\"),
            (
                ReplacementError::UnclosedName,
                "a ${ group reference is not closed by }",
            ),
            (
                ReplacementError::UnknownName {
                    name: "x".to_owned(),
                    known: vec!["a".to_owned(), "b".to_owned()],
                },
                "${x} names no group of route.topic.regex (named groups: a, b)",
            ),
            (
                ReplacementError::NoSuchGroup {
                    group: 3,
                    group_count: 1,
                },
                "$3 names no group; route.topic.regex has 1 group(s)",
            ),
            (
                ReplacementError::NoGroupReference,
                "a $ is not followed by a group reference such as ${routedByValue}",
            ),
        ];
        for (reason, text) in replacements {
            assert_eq!(reason.to_string(), text);
        }
        assert_eq!(
            RouterConfigError::InvalidAdditionalPlacement {
                entry: "a:b".to_owned(),
                reason: PlacementEntryError::UnknownPlacement,
            }
            .to_string(),
            "outbox router option table.fields.additional.placement has the entry \"a:b\": the placement must be header, envelope or partition; write entries as column:header, column:envelope, column:partition, optionally followed by :alias, separated by commas"
        );
        assert_eq!(
            RouteError::UnsupportedEncoding {
                table: "public.outbox".to_owned(),
                reason: EncodingMismatch::BinaryNeedsBytea {
                    side: "key",
                    column: "id".to_owned(),
                    type_name: "integer",
                },
            }
            .to_string(),
            "table public.outbox: the binary key encoding (BinaryDataConverter) writes bytea columns only, and column \"id\" has type integer; use the json, json-schemas or string encoding"
        );
        let expansions = [
            (
                ExpansionError::UnpairedSurrogateName,
                "a member name holds an unpaired surrogate (a \\uD800-style escape), which Siphon does not write as a field name".to_owned(),
            ),
            (
                ExpansionError::Mismatch {
                    found: "string",
                    inferred: crate::format::connect::SchemaType::Int32,
                },
                "a JSON string does not fit the schema inferred for its place (Int32)".to_owned(),
            ),
            (
                ExpansionError::TooDeepToWrite { depth: 1200 },
                format!("the record's JSON nests 1200 levels deep, and Jackson (behind Kafka Connect's JsonConverter) writes at most {}", crate::format::json::MAX_WRITE_DEPTH),
            ),
            (
                ExpansionError::no_deep_thread(&std::io::Error::from_raw_os_error(11)),
                format!(
                    "the payload nests deeply and no thread could be started to expand it: {}",
                    std::io::Error::from_raw_os_error(11)
                ),
            ),
            (
                ExpansionError::DeepThreadFailed,
                "the payload nests deeply and expanding it failed unexpectedly".to_owned(),
            ),
        ];
        for (reason, text) in expansions {
            assert_eq!(reason.to_string(), text);
        }
    }

    #[test]
    fn consequences() {
        let table = || "public.outbox".to_owned();
        let column = || "payload".to_owned();
        assert_eq!(
            RouterConfigError::MissingOption {
                option: "topic.prefix",
                needed_by: "a header",
            }
            .consequence(),
            Consequence::Fix
        );
        assert_eq!(
            RouteError::NullColumn {
                table: table(),
                column: column(),
                option: "table.field.event.id",
                holds: "the event id",
            }
            .consequence(),
            Consequence::Fix
        );
        assert_eq!(
            RouteError::UnchangedToast {
                table: table(),
                column: column(),
            }
            .consequence(),
            Consequence::Retry
        );
        assert_eq!(
            RouteError::ColumnCountMismatch {
                table: table(),
                expected: 4,
                actual: 5,
            }
            .consequence(),
            Consequence::Bug
        );
        let expansion = |reason| RouteError::JsonExpansion {
            table: table(),
            column: column(),
            reason,
        };
        assert_eq!(
            expansion(ExpansionError::TopLevelArray).consequence(),
            Consequence::Fix
        );
        assert_eq!(
            expansion(ExpansionError::DeepThreadFailed).consequence(),
            Consequence::Bug
        );
    }
}
