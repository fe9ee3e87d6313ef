//! The connector configuration as Kafka Connect reads it: the config map out of either
//! accepted JSON shape, every value as a string, and which keys the conversion has read.
//! Also what a note may show of a value: secrets are never repeated, and config-provider
//! references (`${file:...}`) are described rather than resolved.
//!
//! # Invariants
//! - A key is marked read only by [`Props::take`]; [`Props::unread`] yields every key that was
//!   not, so each key ends up either in the output or in a note.
//! - Values are trimmed when read, as Kafka Connect trims them; JSON numbers and booleans read
//!   as their text, `null` as not set.
//! - [`keyed`] never shows the value of a key [`is_secret`] flags.

use std::collections::{BTreeMap, BTreeSet};

use super::ImportError;

/// Picks the config map out of either accepted shape, with the connector name if given.
pub(super) fn connector_config(
    document: &serde_json::Value,
) -> Result<(Option<String>, &serde_json::Map<String, serde_json::Value>), ImportError> {
    let object = document.as_object().ok_or(ImportError::NotAnObject)?;
    if !object.contains_key("connector.class") {
        if let Some(config) = object.get("config") {
            let config = config.as_object().ok_or(ImportError::NotAnObject)?;
            let name = object
                .get("name")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned);
            return Ok((name, config));
        }
    }
    Ok((None, object))
}

/// The connector configuration as Kafka Connect sees it: every value a string. Keys read by the
/// conversion are marked, so the rest can be noted at the end.
pub(super) struct Props {
    values: BTreeMap<String, String>,
    used: BTreeSet<String>,
}

impl Props {
    pub(super) fn new(
        config: &serde_json::Map<String, serde_json::Value>,
        notes: &mut Vec<String>,
    ) -> Props {
        let mut values = BTreeMap::new();
        for (key, value) in config {
            let text = match value {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::Bool(b) => b.to_string(),
                serde_json::Value::Null => {
                    notes.push(format!(
                        "`{key}` is null: treated as not set (Kafka Connect then uses its default)"
                    ));
                    continue;
                }
                serde_json::Value::Array(_) | serde_json::Value::Object(_) => {
                    notes.push(format!(
                        "`{key}` is a JSON {}, not a string, number or boolean: Kafka Connect would refuse it; ignored",
                        if value.is_array() { "array" } else { "object" }
                    ));
                    continue;
                }
            };
            values.insert(key.clone(), text);
        }
        Props {
            values,
            used: BTreeSet::new(),
        }
    }

    /// The value, trimmed (Kafka Connect trims configuration values), marking the key as read.
    pub(super) fn take(&mut self, key: &str) -> Option<String> {
        let value = self.values.get(key)?.trim().to_owned();
        self.used.insert(key.to_owned());
        Some(value)
    }

    pub(super) fn peek(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(|v| v.trim())
    }

    /// Keys starting with `prefix` not read yet, in order.
    pub(super) fn keys_with_prefix(&self, prefix: &str) -> Vec<String> {
        self.values
            .keys()
            .filter(|k| k.starts_with(prefix) && !self.used.contains(*k))
            .cloned()
            .collect()
    }

    /// The keys no section read, with their values, in order.
    pub(super) fn unread(&self) -> impl Iterator<Item = (&str, &str)> {
        self.values
            .iter()
            .filter(|(key, _)| !self.used.contains(*key))
            .map(|(key, value)| (key.as_str(), value.as_str()))
    }
}

/// Whether a value must not be repeated in a note.
fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "jaas",
        "token",
        "credential",
        "api.key",
    ]
    .iter()
    .any(|s| key.contains(s))
}

/// `${provider:path:key}` or `${provider:key}`: a Kafka Connect config-provider reference,
/// resolved by the worker, never by Siphon. Returns `(provider, rest)`.
pub(super) fn provider_reference(value: &str) -> Option<(&str, &str)> {
    let start = value.find("${")?;
    let inner = &value[start + 2..];
    let inner = &inner[..inner.find('}')?];
    let (provider, rest) = inner.split_once(':')?;
    let valid_name = !provider.is_empty()
        && provider
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    valid_name.then_some((provider, rest))
}

/// A `${...}` that is not a config-provider reference: a template placeholder (envsubst and
/// the like) that was meant to be filled in before the configuration reached Kafka Connect.
pub(super) fn is_placeholder(value: &str) -> bool {
    value.contains("${") && provider_reference(value).is_none()
}

pub(super) fn describe_reference(provider: &str, rest: &str) -> String {
    match provider {
        "file" => match rest.rsplit_once(':') {
            Some((path, key)) => {
                format!("Kafka Connect's file config provider (key `{key}` of {path})")
            }
            None => format!("Kafka Connect's file config provider ({rest})"),
        },
        "env" => format!("Kafka Connect's env config provider (environment variable {rest})"),
        "directory" => format!("Kafka Connect's directory config provider ({rest})"),
        other => format!("the Kafka Connect config provider `{other}` ({rest})"),
    }
}

/// A note about a key that does not carry over, with its value unless the key looks secret.
pub(super) fn keyed(key: &str, value: &str, reason: &str) -> String {
    if is_secret(key) {
        format!("`{key}` (value not shown): {reason}")
    } else {
        format!("`{key}` = `{value}`: {reason}")
    }
}
