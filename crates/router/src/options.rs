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

use crate::error::ConfigError;
use crate::topic::TopicTemplate;
use std::collections::BTreeMap;
use std::fmt;

/// What to do when an outbox row is updated (`table.op.invalid.behavior`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InvalidOperationBehavior {
    /// `warn`: skip the update; the caller logs a warning.
    #[default]
    Warn,
    /// `error`: skip the update; the caller logs an error.
    Error,
    /// `fatal`: routing fails with [`crate::RouteError::InvalidOperation`].
    Fatal,
}

impl InvalidOperationBehavior {
    /// The option value (`warn`, `error` or `fatal`).
    pub fn as_str(self) -> &'static str {
        match self {
            InvalidOperationBehavior::Warn => "warn",
            InvalidOperationBehavior::Error => "error",
            InvalidOperationBehavior::Fatal => "fatal",
        }
    }

    /// Parses an option value, ignoring case as Debezium does.
    pub fn parse(value: &str) -> Option<Self> {
        [Self::Warn, Self::Error, Self::Fatal]
            .into_iter()
            .find(|b| b.as_str().eq_ignore_ascii_case(value))
    }
}

impl fmt::Display for InvalidOperationBehavior {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `table.field.event.id`
pub const FIELD_EVENT_ID: &str = "table.field.event.id";
/// `table.field.event.key`
pub const FIELD_EVENT_KEY: &str = "table.field.event.key";
/// `table.field.event.payload`
pub const FIELD_EVENT_PAYLOAD: &str = "table.field.event.payload";
/// `route.by.field`
pub const ROUTE_BY_FIELD: &str = "route.by.field";
/// `route.topic.replacement`
pub const ROUTE_TOPIC_REPLACEMENT: &str = "route.topic.replacement";
/// `table.op.invalid.behavior`
pub const TABLE_OP_INVALID_BEHAVIOR: &str = "table.op.invalid.behavior";

const DEFAULT_EVENT_ID: &str = "id";
const DEFAULT_EVENT_KEY: &str = "aggregateid";
const DEFAULT_EVENT_PAYLOAD: &str = "payload";
const DEFAULT_ROUTE_BY_FIELD: &str = "aggregatetype";
const DEFAULT_TOPIC_REPLACEMENT: &str = "outbox.event.${routedByValue}";

/// The outbox router's settings.
///
/// Build it with [`RouterOptions::from_map`] from Debezium option names (without the
/// `transforms.<name>.` prefix), or take [`RouterOptions::default`] for Debezium's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterOptions {
    event_id_column: String,
    event_key_column: String,
    payload_column: String,
    route_by_column: String,
    topic_replacement: String,
    topic_template: TopicTemplate,
    invalid_operation: InvalidOperationBehavior,
}

/// One supported option.
struct OptionSpec {
    name: &'static str,
    default: &'static str,
    set: fn(&mut RouterOptions, &'static OptionSpec, &str) -> Result<(), ConfigError>,
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
        name: ROUTE_BY_FIELD,
        default: DEFAULT_ROUTE_BY_FIELD,
        set: |o, spec, v| column_name(spec, v).map(|c| o.route_by_column = c),
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
            o.topic_template =
                TopicTemplate::parse(v).map_err(|reason| ConfigError::InvalidTopicReplacement {
                    value: v.to_owned(),
                    reason,
                })?;
            o.topic_replacement = v.to_owned();
            Ok(())
        },
    },
    OptionSpec {
        name: TABLE_OP_INVALID_BEHAVIOR,
        default: "warn",
        set: |o, spec, v| {
            o.invalid_operation =
                InvalidOperationBehavior::parse(v).ok_or_else(|| ConfigError::InvalidValue {
                    option: spec.name,
                    value: v.to_owned(),
                    expected: "warn, error, fatal",
                })?;
            Ok(())
        },
    },
];

fn empty(spec: &'static OptionSpec, expected: &'static str) -> ConfigError {
    ConfigError::EmptyValue {
        option: spec.name,
        expected,
        default: spec.default,
    }
}

fn column_name(spec: &'static OptionSpec, value: &str) -> Result<String, ConfigError> {
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
            topic_replacement: DEFAULT_TOPIC_REPLACEMENT.to_owned(),
            topic_template: default_template(),
            invalid_operation: InvalidOperationBehavior::Warn,
        }
    }
}

/// The parsed [`DEFAULT_TOPIC_REPLACEMENT`] (a test checks they agree).
fn default_template() -> TopicTemplate {
    TopicTemplate::prefixed("outbox.event.")
}

impl RouterOptions {
    /// Reads options named as Debezium names them (`route.by.field`, …), without the
    /// `transforms.<name>.` prefix. Options left out keep Debezium's defaults.
    ///
    /// Supported: `table.field.event.id` (default `id`), `table.field.event.key`
    /// (`aggregateid`), `table.field.event.payload` (`payload`), `route.by.field`
    /// (`aggregatetype`), `route.topic.replacement` (`outbox.event.${routedByValue}`) and
    /// `table.op.invalid.behavior` (`warn`, `error` or `fatal`; default `warn`).
    ///
    /// # Errors
    /// [`ConfigError::UnknownOption`] for any other key; the other variants for unusable
    /// values.
    pub fn from_map(map: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let mut options = RouterOptions::default();
        for (key, value) in map {
            let Some(spec) = OPTIONS.iter().find(|spec| spec.name == key.as_str()) else {
                return Err(unknown_option(key));
            };
            (spec.set)(&mut options, spec, value.trim())?;
        }
        Ok(options)
    }

    /// The names of the supported options.
    pub fn supported_options() -> impl Iterator<Item = &'static str> {
        OPTIONS.iter().map(|spec| spec.name)
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

    /// `route.topic.replacement` as configured.
    pub fn topic_replacement(&self) -> &str {
        &self.topic_replacement
    }

    /// `route.topic.replacement`, parsed.
    pub fn topic_template(&self) -> &TopicTemplate {
        &self.topic_template
    }

    /// `table.op.invalid.behavior`.
    pub fn invalid_operation(&self) -> InvalidOperationBehavior {
        self.invalid_operation
    }
}

fn unknown_option(key: &str) -> ConfigError {
    let supported = OPTIONS
        .iter()
        .map(|spec| spec.name)
        .collect::<Vec<_>>()
        .join(", ");
    let hint = OPTIONS
        .iter()
        .find(|spec| key.ends_with(&format!(".{}", spec.name)))
        .map(|spec| {
            format!(
                " (did you mean \"{}\"? leave out the transforms.<name>. prefix)",
                spec.name
            )
        })
        .unwrap_or_default();
    ConfigError::UnknownOption {
        option: key.to_owned(),
        hint,
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
        assert_eq!(RouterOptions::from_map(&BTreeMap::new()), Ok(o));
        assert_eq!(
            TopicTemplate::parse(DEFAULT_TOPIC_REPLACEMENT),
            Ok(default_template())
        );
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
        assert_eq!(o.topic_template().render("X"), "events.X");
        assert_eq!(o.invalid_operation(), InvalidOperationBehavior::Fatal);
    }

    #[test]
    fn unknown_option_is_named_with_the_supported_list() {
        let err = RouterOptions::from_map(&map(&[("route.topic.regex", "(.*)")]));
        let Err(err) = err else {
            panic!("accepted an unknown option")
        };
        assert!(
            matches!(&err, ConfigError::UnknownOption { option, .. } if option == "route.topic.regex")
        );
        let msg = err.to_string();
        assert!(msg.contains("\"route.topic.regex\""), "{msg}");
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
            Err(ConfigError::InvalidValue {
                option: TABLE_OP_INVALID_BEHAVIOR,
                ..
            })
        ));
        let err = RouterOptions::from_map(&map(&[("table.field.event.key", "  ")]));
        assert!(matches!(
            err,
            Err(ConfigError::EmptyValue {
                option: FIELD_EVENT_KEY,
                ..
            })
        ));
        let err = RouterOptions::from_map(&map(&[("route.topic.replacement", "t.${type}")]));
        assert!(matches!(
            err,
            Err(ConfigError::InvalidTopicReplacement { .. })
        ));
        let err = RouterOptions::from_map(&map(&[("route.topic.replacement", "")]));
        assert!(matches!(err, Err(ConfigError::EmptyValue { .. })));
    }
}
