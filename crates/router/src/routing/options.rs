//! Router options, named and defaulted as Debezium's outbox `EventRouter` names them.
//!
//! Each supported option is one entry of the `OPTIONS` table: its name, default and a setter. Adding
//! an option means adding a field to [`RouterOptions`] and an entry to the table.
//!
//! Values are trimmed, as Kafka's `ConfigDef` trims string values.
//!
//! # Invariants
//! - A [`RouterOptions`] only holds valid values: column names are non-empty and the topic
//!   replacement is a parsed template.
//! - Every option not in the `OPTIONS` table is rejected.

pub use crate::format::expand::{JsonEmptyArrayBehavior, JsonNullBehavior};
use crate::routing::error::{PlacementEntryError, RouterConfigError};
pub use crate::routing::policy::{
    AdditionalField, AdditionalMissingBehavior, InvalidOperationBehavior, Placement,
};
use crate::routing::topic::{TopicRouter, DEFAULT_TOPIC_REGEX};
use std::collections::BTreeMap;

/// `trace.column`: not an option of Debezium's router but of Siphon's `[trace]` section.
pub const TRACE_COLUMN: &str = "trace.column";
/// `trace.state_column`: as [`TRACE_COLUMN`].
pub const TRACE_STATE_COLUMN: &str = "trace.state_column";
/// `table.field.event.id`
pub const FIELD_EVENT_ID: &str = "table.field.event.id";
/// `table.field.event.key`
pub const FIELD_EVENT_KEY: &str = "table.field.event.key";
/// `table.field.event.type` (declared by Debezium, read by nothing)
pub const FIELD_EVENT_TYPE: &str = "table.field.event.type";
/// `table.field.event.payload`
pub const FIELD_EVENT_PAYLOAD: &str = "table.field.event.payload";
/// `table.field.event.timestamp`
pub const FIELD_EVENT_TIMESTAMP: &str = "table.field.event.timestamp";
/// `table.field.event.schema.version`
pub const FIELD_SCHEMA_VERSION: &str = "table.field.event.schema.version";
/// `table.fields.additional.placement`
pub const FIELDS_ADDITIONAL_PLACEMENT: &str = "table.fields.additional.placement";
/// `table.field.additional.missing`
pub const FIELDS_ADDITIONAL_MISSING: &str = "table.field.additional.missing";
/// `route.by.field`
pub const ROUTE_BY_FIELD: &str = "route.by.field";
/// `route.topic.regex`
pub const ROUTE_TOPIC_REGEX: &str = "route.topic.regex";
/// `route.topic.replacement`
pub const ROUTE_TOPIC_REPLACEMENT: &str = "route.topic.replacement";
/// `route.tombstone.on.empty.payload`
pub const ROUTE_TOMBSTONE_ON_EMPTY_PAYLOAD: &str = "route.tombstone.on.empty.payload";
/// `table.op.invalid.behavior`
pub const TABLE_OP_INVALID_BEHAVIOR: &str = "table.op.invalid.behavior";
/// `table.expand.json.payload`
pub const TABLE_EXPAND_JSON_PAYLOAD: &str = "table.expand.json.payload";
/// `table.json.payload.null.behavior`
pub const TABLE_JSON_PAYLOAD_NULL_BEHAVIOR: &str = "table.json.payload.null.behavior";
/// `table.json.payload.empty.array.behavior`
pub const TABLE_JSON_PAYLOAD_EMPTY_ARRAY_BEHAVIOR: &str = "table.json.payload.empty.array.behavior";
/// `extended.headers.enabled` (a connector option)
pub const EXTENDED_HEADERS_ENABLED: &str = "extended.headers.enabled";
/// `topic.prefix` (a connector option: the logical name)
pub const TOPIC_PREFIX: &str = "topic.prefix";

const DEFAULT_EVENT_ID: &str = "id";
const DEFAULT_EVENT_KEY: &str = "aggregateid";
const DEFAULT_EVENT_PAYLOAD: &str = "payload";
const DEFAULT_ROUTE_BY_FIELD: &str = "aggregatetype";
/// Debezium's default `route.topic.regex`.
const DEFAULT_TOPIC_REPLACEMENT: &str = "outbox.event.${routedByValue}";

/// The outbox router's settings.
///
/// Build it with [`RouterOptions::from_map`] from Debezium option names (without the
/// `transforms.<name>.` prefix), or take [`RouterOptions::default`] for Debezium's defaults.
#[derive(Debug, Clone)]
pub struct RouterOptions {
    event_id_column: String,
    event_key_column: String,
    payload_column: String,
    route_by_column: String,
    timestamp_column: Option<String>,
    schema_version_column: Option<String>,
    additional: Vec<AdditionalField>,
    additional_missing: AdditionalMissingBehavior,
    topic_regex: String,
    topic_replacement: String,
    topic_router: TopicRouter,
    tombstone_on_empty_payload: bool,
    invalid_operation: InvalidOperationBehavior,
    expand_json_payload: bool,
    json_null: JsonNullBehavior,
    json_empty_array: JsonEmptyArrayBehavior,
    extended_headers: bool,
    topic_prefix: Option<String>,
    warnings: Vec<String>,
}

impl PartialEq for RouterOptions {
    fn eq(&self, other: &Self) -> bool {
        // The topic router is derived from the regex and replacement strings.
        self.event_id_column == other.event_id_column
            && self.event_key_column == other.event_key_column
            && self.payload_column == other.payload_column
            && self.route_by_column == other.route_by_column
            && self.timestamp_column == other.timestamp_column
            && self.schema_version_column == other.schema_version_column
            && self.additional == other.additional
            && self.additional_missing == other.additional_missing
            && self.topic_regex == other.topic_regex
            && self.topic_replacement == other.topic_replacement
            && self.tombstone_on_empty_payload == other.tombstone_on_empty_payload
            && self.invalid_operation == other.invalid_operation
            && self.expand_json_payload == other.expand_json_payload
            && self.json_null == other.json_null
            && self.json_empty_array == other.json_empty_array
            && self.extended_headers == other.extended_headers
            && self.topic_prefix == other.topic_prefix
            && self.warnings == other.warnings
    }
}

impl Eq for RouterOptions {}

/// One supported option.
struct OptionSpec {
    name: &'static str,
    default: &'static str,
    set: fn(&mut RouterOptions, &'static OptionSpec, &str) -> Result<(), RouterConfigError>,
}

/// An option Debezium accepts but whose value changes nothing here.
struct IgnoredOption {
    name: &'static str,
    why: &'static str,
}

/// Options that are accepted and reported by [`RouterOptions::warnings`].
const IGNORED: &[IgnoredOption] = &[
    IgnoredOption {
        name: FIELD_EVENT_TYPE,
        why: "Debezium declares it (default \"type\") but the event router never reads it; add the column with table.fields.additional.placement (e.g. type:header:eventType) to pass it on",
    },
    IgnoredOption {
        name: "table.field.payload.id",
        why: "Debezium 2.0 removed it; the record key comes from table.field.event.key only",
    },
    IgnoredOption {
        name: "debezium.op.invalid.behavior",
        why: "Debezium 2.0 removed it in favour of table.op.invalid.behavior; set that option instead",
    },
    IgnoredOption {
        name: "tracing.span.context.field",
        why: "it configures OpenTelemetry tracing spans, which are not produced; records are unchanged by it in Debezium too",
    },
    IgnoredOption {
        name: "tracing.operation.name",
        why: "it configures OpenTelemetry tracing spans, which are not produced; records are unchanged by it in Debezium too",
    },
    IgnoredOption {
        name: "tracing.with.context.field.only",
        why: "it configures OpenTelemetry tracing spans, which are not produced; records are unchanged by it in Debezium too",
    },
];

fn boolean(spec: &'static OptionSpec, v: &str) -> Result<bool, RouterConfigError> {
    // Kafka's ConfigDef accepts true/false in any case.
    if v.eq_ignore_ascii_case("true") {
        Ok(true)
    } else if v.eq_ignore_ascii_case("false") {
        Ok(false)
    } else {
        Err(RouterConfigError::InvalidValue {
            option: spec.name,
            value: v.to_owned(),
            expected: "true, false",
        })
    }
}

fn choice<T: Copy>(
    spec: &'static OptionSpec,
    v: &str,
    values: &[(&str, T)],
    expected: &'static str,
) -> Result<T, RouterConfigError> {
    values
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(v))
        .map(|(_, value)| *value)
        .ok_or_else(|| RouterConfigError::InvalidValue {
            option: spec.name,
            value: v.to_owned(),
            expected,
        })
}

fn optional_column(
    spec: &'static OptionSpec,
    v: &str,
) -> Result<Option<String>, RouterConfigError> {
    // An empty value is Debezium's "not set".
    let _ = spec;
    Ok((!v.is_empty()).then(|| v.to_owned()))
}

/// The supported options, in the order the error message lists them.
const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: FIELD_EVENT_ID,
        default: DEFAULT_EVENT_ID,
        set: |o, spec, v| column_name(spec, v).map(|c| o.event_id_column = c),
    },
    OptionSpec {
        name: FIELD_EVENT_KEY,
        default: DEFAULT_EVENT_KEY,
        set: |o, spec, v| column_name(spec, v).map(|c| o.event_key_column = c),
    },
    OptionSpec {
        name: FIELD_EVENT_PAYLOAD,
        default: DEFAULT_EVENT_PAYLOAD,
        set: |o, spec, v| column_name(spec, v).map(|c| o.payload_column = c),
    },
    OptionSpec {
        name: FIELD_EVENT_TIMESTAMP,
        default: "",
        set: |o, spec, v| optional_column(spec, v).map(|c| o.timestamp_column = c),
    },
    OptionSpec {
        name: FIELD_SCHEMA_VERSION,
        default: "",
        set: |o, spec, v| optional_column(spec, v).map(|c| o.schema_version_column = c),
    },
    OptionSpec {
        name: FIELDS_ADDITIONAL_PLACEMENT,
        default: "",
        set: |o, _, v| parse_additional(v).map(|a| o.additional = a),
    },
    OptionSpec {
        name: FIELDS_ADDITIONAL_MISSING,
        default: "error",
        set: |o, spec, v| {
            o.additional_missing = choice(
                spec,
                v,
                &[
                    ("error", AdditionalMissingBehavior::Error),
                    ("ignore", AdditionalMissingBehavior::Ignore),
                ],
                "error, ignore",
            )?;
            Ok(())
        },
    },
    OptionSpec {
        name: ROUTE_BY_FIELD,
        default: DEFAULT_ROUTE_BY_FIELD,
        set: |o, spec, v| column_name(spec, v).map(|c| o.route_by_column = c),
    },
    OptionSpec {
        name: ROUTE_TOPIC_REGEX,
        default: DEFAULT_TOPIC_REGEX,
        set: |o, spec, v| {
            if v.is_empty() {
                return Err(empty(
                    spec,
                    "a Java regular expression such as (?<routedByValue>.*)",
                ));
            }
            o.topic_regex = v.to_owned();
            Ok(())
        },
    },
    OptionSpec {
        name: ROUTE_TOPIC_REPLACEMENT,
        default: DEFAULT_TOPIC_REPLACEMENT,
        set: |o, spec, v| {
            if v.is_empty() {
                return Err(empty(
                    spec,
                    "a topic name such as outbox.event.${routedByValue}",
                ));
            }
            o.topic_replacement = v.to_owned();
            Ok(())
        },
    },
    OptionSpec {
        name: ROUTE_TOMBSTONE_ON_EMPTY_PAYLOAD,
        default: "false",
        set: |o, spec, v| boolean(spec, v).map(|b| o.tombstone_on_empty_payload = b),
    },
    OptionSpec {
        name: TABLE_OP_INVALID_BEHAVIOR,
        default: "warn",
        set: |o, spec, v| {
            o.invalid_operation = InvalidOperationBehavior::parse(v).ok_or_else(|| {
                RouterConfigError::InvalidValue {
                    option: spec.name,
                    value: v.to_owned(),
                    expected: "warn, error, fatal",
                }
            })?;
            Ok(())
        },
    },
    OptionSpec {
        name: TABLE_EXPAND_JSON_PAYLOAD,
        default: "false",
        set: |o, spec, v| boolean(spec, v).map(|b| o.expand_json_payload = b),
    },
    OptionSpec {
        name: TABLE_JSON_PAYLOAD_NULL_BEHAVIOR,
        default: "ignore",
        set: |o, spec, v| {
            o.json_null = choice(
                spec,
                v,
                &[
                    ("ignore", JsonNullBehavior::Ignore),
                    ("optional_bytes", JsonNullBehavior::OptionalBytes),
                ],
                "ignore, optional_bytes",
            )?;
            Ok(())
        },
    },
    OptionSpec {
        name: TABLE_JSON_PAYLOAD_EMPTY_ARRAY_BEHAVIOR,
        default: "ignore",
        set: |o, spec, v| {
            o.json_empty_array = choice(
                spec,
                v,
                &[
                    ("ignore", JsonEmptyArrayBehavior::Ignore),
                    ("optional_string", JsonEmptyArrayBehavior::OptionalString),
                ],
                "ignore, optional_string",
            )?;
            Ok(())
        },
    },
    OptionSpec {
        name: EXTENDED_HEADERS_ENABLED,
        default: "true",
        set: |o, spec, v| boolean(spec, v).map(|b| o.extended_headers = b),
    },
    OptionSpec {
        name: TOPIC_PREFIX,
        default: "",
        set: |o, spec, v| optional_column(spec, v).map(|p| o.topic_prefix = p),
    },
];

/// Splits as Java's `String.split` does: trailing empty pieces are dropped.
fn java_split(text: &str, separator: char) -> Vec<&str> {
    let mut parts: Vec<&str> = text.split(separator).collect();
    while parts.len() > 1 && parts.last().is_some_and(|p| p.is_empty()) {
        parts.pop();
    }
    if parts.len() == 1 && parts[0].is_empty() {
        parts.clear();
    }
    parts
}

/// Parses `table.fields.additional.placement`: `column:placement[:alias]`, comma separated.
fn parse_additional(value: &str) -> Result<Vec<AdditionalField>, RouterConfigError> {
    let bad = |entry: &str, reason| RouterConfigError::InvalidAdditionalPlacement {
        entry: entry.to_owned(),
        reason,
    };
    let mut fields: Vec<AdditionalField> = Vec::new();
    for entry in java_split(value, ',') {
        let parts = java_split(entry, ':');
        if parts.len() != 2 && parts.len() != 3 {
            return Err(bad(entry, PlacementEntryError::Shape));
        }
        let column = parts[0].trim();
        if column.is_empty() {
            return Err(bad(entry, PlacementEntryError::EmptyColumn));
        }
        let placement = match parts[1].trim().to_ascii_lowercase().as_str() {
            "header" => Placement::Header,
            "envelope" => Placement::Envelope,
            "partition" => Placement::Partition,
            _ => return Err(bad(entry, PlacementEntryError::UnknownPlacement)),
        };
        let alias = parts.get(2).map_or(column, |a| a.trim()).to_owned();
        if placement == Placement::Envelope {
            if alias == "payload" {
                return Err(bad(entry, PlacementEntryError::PayloadAlias));
            }
            if fields
                .iter()
                .any(|f| f.placement == Placement::Envelope && f.alias == alias)
            {
                return Err(bad(entry, PlacementEntryError::DuplicateEnvelopeField));
            }
        }
        fields.push(AdditionalField {
            column: column.to_owned(),
            placement,
            alias,
        });
    }
    Ok(fields)
}

fn empty(spec: &'static OptionSpec, expected: &'static str) -> RouterConfigError {
    RouterConfigError::EmptyValue {
        option: spec.name,
        expected,
        default: spec.default,
    }
}

fn column_name(spec: &'static OptionSpec, value: &str) -> Result<String, RouterConfigError> {
    if value.is_empty() {
        return Err(empty(spec, "the name of a column of the outbox table"));
    }
    Ok(value.to_owned())
}

impl Default for RouterOptions {
    /// Debezium's defaults.
    fn default() -> Self {
        RouterOptions {
            event_id_column: DEFAULT_EVENT_ID.to_owned(),
            event_key_column: DEFAULT_EVENT_KEY.to_owned(),
            payload_column: DEFAULT_EVENT_PAYLOAD.to_owned(),
            route_by_column: DEFAULT_ROUTE_BY_FIELD.to_owned(),
            timestamp_column: None,
            schema_version_column: None,
            additional: Vec::new(),
            additional_missing: AdditionalMissingBehavior::Error,
            topic_regex: DEFAULT_TOPIC_REGEX.to_owned(),
            topic_replacement: DEFAULT_TOPIC_REPLACEMENT.to_owned(),
            topic_router: TopicRouter::default(),
            tombstone_on_empty_payload: false,
            invalid_operation: InvalidOperationBehavior::Warn,
            expand_json_payload: false,
            json_null: JsonNullBehavior::Ignore,
            json_empty_array: JsonEmptyArrayBehavior::Ignore,
            extended_headers: true,
            topic_prefix: None,
            warnings: Vec::new(),
        }
    }
}

impl RouterOptions {
    /// Reads options named as Debezium names them (`route.by.field`, …), without the
    /// `transforms.<name>.` prefix. Options left out keep Debezium's defaults. The connector
    /// options `topic.prefix` and `extended.headers.enabled` are read from the same map.
    ///
    /// Options that Debezium accepts but that change nothing (see [`RouterOptions::warnings`])
    /// are accepted.
    ///
    /// # Errors
    /// [`RouterConfigError::UnknownOption`] for any other key; the other variants for unusable
    /// values.
    pub fn from_map(map: &BTreeMap<String, String>) -> Result<Self, RouterConfigError> {
        let mut options = RouterOptions::default();
        for (key, value) in map {
            if let Some(ignored) = IGNORED.iter().find(|i| i.name == key.as_str()) {
                options.warnings.push(format!(
                    "option {} is ignored: {}",
                    ignored.name, ignored.why
                ));
                continue;
            }
            let Some(spec) = OPTIONS.iter().find(|spec| spec.name == key.as_str()) else {
                return Err(unknown_option(key));
            };
            (spec.set)(&mut options, spec, value.trim())?;
        }
        options.topic_router = TopicRouter::new(&options.topic_regex, &options.topic_replacement)?;
        if options.schema_version_column.is_some() && !options.has_envelope() {
            options.warnings.push(format!(
                "option {FIELD_SCHEMA_VERSION} has no effect: the value schema only carries a version when table.fields.additional.placement puts a column in the envelope"
            ));
        }
        Ok(options)
    }

    /// The names of the supported options (ignored ones excluded).
    pub fn supported_options() -> impl Iterator<Item = &'static str> {
        OPTIONS.iter().map(|spec| spec.name)
    }

    /// The names of the options that are accepted but change nothing.
    pub fn ignored_options() -> impl Iterator<Item = &'static str> {
        IGNORED.iter().map(|i| i.name)
    }

    /// One line for each option given that changes nothing, saying why.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }

    /// `table.field.event.id`: the column whose value becomes the `id` header.
    pub fn event_id_column(&self) -> &str {
        &self.event_id_column
    }

    /// `table.field.event.key`: the column whose value becomes the record key.
    pub fn event_key_column(&self) -> &str {
        &self.event_key_column
    }

    /// `table.field.event.payload`: the column whose value becomes the record value.
    pub fn payload_column(&self) -> &str {
        &self.payload_column
    }

    /// `route.by.field`: the column whose value selects the topic.
    pub fn route_by_column(&self) -> &str {
        &self.route_by_column
    }

    /// `table.field.event.timestamp`: the column whose value becomes the record timestamp.
    pub fn timestamp_column(&self) -> Option<&str> {
        self.timestamp_column.as_deref()
    }

    /// `table.field.event.schema.version`: the column whose value versions the value schema.
    pub fn schema_version_column(&self) -> Option<&str> {
        self.schema_version_column.as_deref()
    }

    /// `table.fields.additional.placement`, in order.
    pub fn additional_fields(&self) -> &[AdditionalField] {
        &self.additional
    }

    /// `table.field.additional.missing`.
    pub fn additional_missing(&self) -> AdditionalMissingBehavior {
        self.additional_missing
    }

    /// Whether some additional column goes to the envelope (the value is then a struct).
    pub fn has_envelope(&self) -> bool {
        self.additional
            .iter()
            .any(|f| f.placement == Placement::Envelope)
    }

    /// `route.topic.regex` as configured.
    pub fn topic_regex(&self) -> &str {
        &self.topic_regex
    }

    /// `route.topic.replacement` as configured.
    pub fn topic_replacement(&self) -> &str {
        &self.topic_replacement
    }

    /// `route.topic.regex` and `route.topic.replacement`, compiled.
    pub fn topic_router(&self) -> &TopicRouter {
        &self.topic_router
    }

    /// `route.tombstone.on.empty.payload`.
    pub fn tombstone_on_empty_payload(&self) -> bool {
        self.tombstone_on_empty_payload
    }

    /// `table.op.invalid.behavior`.
    pub fn invalid_operation(&self) -> InvalidOperationBehavior {
        self.invalid_operation
    }

    /// `table.expand.json.payload`.
    pub fn expand_json_payload(&self) -> bool {
        self.expand_json_payload
    }

    /// `table.json.payload.null.behavior`.
    pub fn json_null_behavior(&self) -> JsonNullBehavior {
        self.json_null
    }

    /// `table.json.payload.empty.array.behavior`.
    pub fn json_empty_array_behavior(&self) -> JsonEmptyArrayBehavior {
        self.json_empty_array
    }

    /// `extended.headers.enabled` (default `true`).
    pub fn extended_headers(&self) -> bool {
        self.extended_headers
    }

    /// `topic.prefix`, the connector's logical name, when given.
    pub fn topic_prefix(&self) -> Option<&str> {
        self.topic_prefix.as_deref()
    }
}

fn unknown_option(key: &str) -> RouterConfigError {
    let supported: Vec<&'static str> = OPTIONS
        .iter()
        .map(|spec| spec.name)
        .chain(IGNORED.iter().map(|i| i.name))
        .collect();
    let suggestion = supported
        .iter()
        .copied()
        .find(|name| key.ends_with(&format!(".{name}")));
    RouterConfigError::UnknownOption {
        option: key.to_owned(),
        suggestion,
        supported,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_are_debeziums() {
        let o = RouterOptions::default();
        assert_eq!(o.event_id_column(), "id");
        assert_eq!(o.event_key_column(), "aggregateid");
        assert_eq!(o.payload_column(), "payload");
        assert_eq!(o.route_by_column(), "aggregatetype");
        assert_eq!(o.topic_replacement(), "outbox.event.${routedByValue}");
        assert_eq!(o.invalid_operation(), InvalidOperationBehavior::Warn);
        assert_eq!(o.topic_regex(), "(?<routedByValue>.*)");
        assert_eq!(o.timestamp_column(), None);
        assert_eq!(o.schema_version_column(), None);
        assert!(o.additional_fields().is_empty());
        assert_eq!(o.additional_missing(), AdditionalMissingBehavior::Error);
        assert!(!o.tombstone_on_empty_payload());
        assert!(!o.expand_json_payload());
        assert_eq!(o.json_null_behavior(), JsonNullBehavior::Ignore);
        assert_eq!(
            o.json_empty_array_behavior(),
            JsonEmptyArrayBehavior::Ignore
        );
        assert!(o.extended_headers());
        assert_eq!(o.topic_prefix(), None);
        assert!(o.warnings().is_empty());
        assert_eq!(o.topic_router().route("Order"), "outbox.event.Order");
        assert_eq!(RouterOptions::from_map(&BTreeMap::new()), Ok(o));
    }

    #[test]
    fn every_option_is_read_and_trimmed() {
        let o = RouterOptions::from_map(&map(&[
            ("table.field.event.id", " event_id "),
            ("table.field.event.key", "aggregate_id"),
            ("table.field.event.payload", "body"),
            ("route.by.field", "aggregate_type"),
            ("route.topic.replacement", "events.${routedByValue}"),
            ("table.op.invalid.behavior", "FATAL"),
        ]));
        let o = match o {
            Ok(o) => o,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(o.event_id_column(), "event_id");
        assert_eq!(o.event_key_column(), "aggregate_id");
        assert_eq!(o.payload_column(), "body");
        assert_eq!(o.route_by_column(), "aggregate_type");
        assert_eq!(o.topic_router().route("X"), "events.X");
        assert_eq!(o.invalid_operation(), InvalidOperationBehavior::Fatal);
    }

    #[test]
    fn unknown_option_is_named_with_the_supported_list() {
        let err = RouterOptions::from_map(&map(&[("route.topic.regexp", "(.*)")]));
        let Err(err) = err else {
            panic!("accepted an unknown option")
        };
        assert!(
            matches!(&err, RouterConfigError::UnknownOption { option, .. } if option == "route.topic.regexp")
        );
        let msg = err.to_string();
        assert!(msg.contains("\"route.topic.regexp\""), "{msg}");
        for name in RouterOptions::supported_options() {
            assert!(msg.contains(name), "{msg}");
        }
    }

    #[test]
    fn prefixed_option_gets_a_hint() {
        let err = RouterOptions::from_map(&map(&[("transforms.outbox.route.by.field", "t")]));
        let Err(err) = err else {
            panic!("accepted a prefixed option")
        };
        assert!(
            err.to_string().contains("did you mean \"route.by.field\""),
            "{err}"
        );
    }

    #[test]
    fn invalid_values() {
        let err = RouterOptions::from_map(&map(&[("table.op.invalid.behavior", "ignore")]));
        assert!(matches!(
            err,
            Err(RouterConfigError::InvalidValue {
                option: TABLE_OP_INVALID_BEHAVIOR,
                ..
            })
        ));
        let err = RouterOptions::from_map(&map(&[("table.field.event.key", "  ")]));
        assert!(matches!(
            err,
            Err(RouterConfigError::EmptyValue {
                option: FIELD_EVENT_KEY,
                ..
            })
        ));
        let err = RouterOptions::from_map(&map(&[("route.topic.replacement", "t.${type}")]));
        assert!(matches!(
            err,
            Err(RouterConfigError::InvalidTopicReplacement { .. })
        ));
        let err = RouterOptions::from_map(&map(&[("route.topic.replacement", "")]));
        assert!(matches!(err, Err(RouterConfigError::EmptyValue { .. })));
        for (option, value) in [
            (ROUTE_TOMBSTONE_ON_EMPTY_PAYLOAD, "yes"),
            (TABLE_EXPAND_JSON_PAYLOAD, "1"),
            (EXTENDED_HEADERS_ENABLED, ""),
            (FIELDS_ADDITIONAL_MISSING, "skip"),
            (TABLE_JSON_PAYLOAD_NULL_BEHAVIOR, "null"),
            // Debezium's values are ignore and optional_string.
            (TABLE_JSON_PAYLOAD_EMPTY_ARRAY_BEHAVIOR, "optional_bytes"),
        ] {
            let err = RouterOptions::from_map(&map(&[(option, value)]));
            assert!(
                matches!(&err, Err(RouterConfigError::InvalidValue { option: o, .. }) if *o == option),
                "{option}={value}: {err:?}"
            );
        }
        let err = RouterOptions::from_map(&map(&[(ROUTE_TOPIC_REGEX, "(?<=a)b")]));
        assert!(
            matches!(err, Err(RouterConfigError::InvalidTopicRegex { .. })),
            "{err:?}"
        );
        let err = RouterOptions::from_map(&map(&[
            (ROUTE_TOPIC_REGEX, "(?<kind>[a-z]+)"),
            (ROUTE_TOPIC_REPLACEMENT, "t.${routedByValue}"),
        ]));
        assert!(
            matches!(err, Err(RouterConfigError::InvalidTopicReplacement { .. })),
            "{err:?}"
        );
    }

    #[test]
    fn new_options_are_read() {
        let o = RouterOptions::from_map(&map(&[
            (FIELD_EVENT_TIMESTAMP, "created_at"),
            (FIELD_SCHEMA_VERSION, "v"),
            (
                FIELDS_ADDITIONAL_PLACEMENT,
                "type:header:eventType, type : envelope : kind ,p:PARTITION,",
            ),
            (FIELDS_ADDITIONAL_MISSING, "IGNORE"),
            (ROUTE_TOPIC_REGEX, "(?<routedByValue>[a-z]+)_(?<rest>.*)"),
            (ROUTE_TOPIC_REPLACEMENT, "${rest}.$1"),
            (ROUTE_TOMBSTONE_ON_EMPTY_PAYLOAD, "TRUE"),
            (TABLE_EXPAND_JSON_PAYLOAD, "true"),
            (TABLE_JSON_PAYLOAD_NULL_BEHAVIOR, "optional_bytes"),
            (TABLE_JSON_PAYLOAD_EMPTY_ARRAY_BEHAVIOR, "optional_string"),
            (EXTENDED_HEADERS_ENABLED, "false"),
            (TOPIC_PREFIX, "dbserver1"),
        ]));
        let o = match o {
            Ok(o) => o,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(o.timestamp_column(), Some("created_at"));
        assert_eq!(o.schema_version_column(), Some("v"));
        assert_eq!(
            o.additional_fields(),
            &[
                AdditionalField {
                    column: "type".to_owned(),
                    placement: Placement::Header,
                    alias: "eventType".to_owned()
                },
                AdditionalField {
                    column: "type".to_owned(),
                    placement: Placement::Envelope,
                    alias: "kind".to_owned()
                },
                AdditionalField {
                    column: "p".to_owned(),
                    placement: Placement::Partition,
                    alias: "p".to_owned()
                },
            ]
        );
        assert!(o.has_envelope());
        assert_eq!(o.additional_missing(), AdditionalMissingBehavior::Ignore);
        assert_eq!(o.topic_router().route("order_eu"), "eu.order");
        // Not a whole match: the value itself, as RegexRouter leaves the record alone.
        assert_eq!(o.topic_router().route("Order_eu"), "Order_eu");
        assert!(o.tombstone_on_empty_payload());
        assert!(o.expand_json_payload());
        assert_eq!(o.json_null_behavior(), JsonNullBehavior::OptionalBytes);
        assert_eq!(
            o.json_empty_array_behavior(),
            JsonEmptyArrayBehavior::OptionalString
        );
        assert!(!o.extended_headers());
        assert_eq!(o.topic_prefix(), Some("dbserver1"));
        assert!(o.warnings().is_empty());
    }

    #[test]
    fn bad_additional_placements() {
        for value in [
            "type",
            "type:header:a:b",
            "type:body",
            ":header",
            "a:header,,b:header",
            "a::header",
            "a:envelope:payload",
            "a:envelope:x,b:envelope:x",
        ] {
            let err = RouterOptions::from_map(&map(&[(FIELDS_ADDITIONAL_PLACEMENT, value)]));
            assert!(
                matches!(
                    err,
                    Err(RouterConfigError::InvalidAdditionalPlacement { .. })
                ),
                "{value}: {err:?}"
            );
        }
        // A header and an envelope field may share a name; so may two headers.
        assert!(RouterOptions::from_map(&map(&[(
            FIELDS_ADDITIONAL_PLACEMENT,
            "a:header:x,b:header:x,c:envelope:x"
        )]))
        .is_ok());
    }

    #[test]
    fn ignored_options_are_accepted_with_a_warning() {
        let o = RouterOptions::from_map(&map(&[
            ("table.field.event.type", "type"),
            ("table.field.payload.id", "aggregateid"),
            ("debezium.op.invalid.behavior", "fatal"),
            ("tracing.span.context.field", "tracingspancontext"),
            ("tracing.operation.name", "debezium-read"),
            ("tracing.with.context.field.only", "false"),
            (FIELD_SCHEMA_VERSION, "v"),
        ]));
        let o = match o {
            Ok(o) => o,
            Err(e) => panic!("{e}"),
        };
        let warnings = o.warnings();
        assert_eq!(warnings.len(), 7, "{warnings:?}");
        for name in RouterOptions::ignored_options() {
            assert!(
                warnings
                    .iter()
                    .any(|w| w.starts_with(&format!("option {name} is ignored: "))),
                "{name}: {warnings:?}"
            );
        }
        assert!(warnings
            .iter()
            .any(|w| w.contains("table.field.event.schema.version has no effect")));
        // debezium.op.invalid.behavior does not override the default.
        assert_eq!(o.invalid_operation(), InvalidOperationBehavior::Warn);
    }
}
