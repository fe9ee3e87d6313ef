//! `[format]`: the key and value encodings, from the connector's `key.converter`,
//! `value.converter` and `header.converter`.
//!
//! # Invariants
//! - Both `format.key` and `format.value` are always written; a converter Siphon cannot
//!   reproduce is written as `json` with a note saying the bytes differ.
//! - A JsonConverter without `schemas.enable` is taken as Kafka's default, true (json-schemas),
//!   since a converter set on the connector does not inherit the worker's options.
//! - Converter options are notes (Siphon's encodings have none), except a UTF-8 `encoding`,
//!   which is what Siphon writes anyway, and an Avro converter's registry URL and basic auth
//!   user, which become `[schema_registry]` (the password never goes into the file; keys and
//!   values share one registry, the first converter's).

use super::output::{string, Output};
use super::props::{keyed, Props};

const JSON_CONVERTER: &str = "org.apache.kafka.connect.json.JsonConverter";
const STRING_CONVERTER: &str = "org.apache.kafka.connect.storage.StringConverter";
const BYTE_ARRAY_CONVERTER: &str = "org.apache.kafka.connect.converters.ByteArrayConverter";
const BINARY_DATA_CONVERTER: &str = "io.debezium.converters.BinaryDataConverter";
const SIMPLE_HEADER_CONVERTER: &str = "org.apache.kafka.connect.storage.SimpleHeaderConverter";
const CONFLUENT_AVRO_CONVERTER: &str = "io.confluent.connect.avro.AvroConverter";

/// Fills `[format]` from the key, value and header converters.
pub(super) fn section(props: &mut Props, out: &mut Output, notes: &mut Vec<String>) {
    for (side, key) in [("key", "key.converter"), ("value", "value.converter")] {
        let encoding = converter_encoding(props, side, key, out, notes);
        out.format.insert(side.into(), string(encoding));
    }
    if let Some(class) = props.take("header.converter") {
        if class != SIMPLE_HEADER_CONVERTER {
            notes.push(format!(
                "`header.converter` = `{class}`: Siphon writes headers as {SIMPLE_HEADER_CONVERTER} does (the `id` header as UTF-8 text); consumers reading headers may see different bytes"
            ));
        }
    }
    for key in props.keys_with_prefix("header.converter.") {
        let value = props.take(&key).unwrap_or_default();
        notes.push(keyed(
            &key,
            &value,
            "header converter option; not carried over",
        ));
    }
}

/// The `[format]` encoding for one converter, with notes for what Siphon cannot reproduce.
fn converter_encoding(
    props: &mut Props,
    side: &str,
    key: &str,
    out: &mut Output,
    notes: &mut Vec<String>,
) -> &'static str {
    let class = props.take(key);
    let schemas_key = format!("{key}.schemas.enable");
    let schemas = props.take(&schemas_key);
    let mut options = Vec::new();
    for option in props.keys_with_prefix(&format!("{key}.")) {
        let value = props.take(&option).unwrap_or_default();
        options.push((option, value));
    }
    let Some(class) = class else {
        notes.push(format!(
            "`{key}` is not set, so the Connect worker's {key} applied (Kafka's own default is {JSON_CONVERTER} with schemas.enable=true): \
             written as json (JsonConverter with schemas.enable=false); check the worker configuration and set format.{side} to match it"
        ));
        return "json";
    };
    let encoding = match class.as_str() {
        JSON_CONVERTER => {
            let with_schemas = match schemas.as_deref() {
                None => {
                    notes.push(format!(
                        "`{schemas_key}` is not set: JsonConverter's default, true, is assumed (json-schemas), since a converter set in the connector \
                         configuration does not take the worker's converter options"
                    ));
                    true
                }
                Some(v) => !v.eq_ignore_ascii_case("false"),
            };
            if with_schemas {
                "json-schemas"
            } else {
                "json"
            }
        }
        STRING_CONVERTER => "string",
        BYTE_ARRAY_CONVERTER | BINARY_DATA_CONVERTER => "binary",
        CONFLUENT_AVRO_CONVERTER => {
            registry_options(key, &mut options, out, notes);
            "avro"
        }
        other => {
            let what = if other.contains("Avro") {
                "Avro"
            } else if other.contains("Protobuf") {
                "Protobuf"
            } else if other.contains("JsonSchema") {
                "JSON Schema"
            } else if other.contains("CloudEvents") {
                "CloudEvents"
            } else {
                "this converter's"
            };
            notes.push(format!(
                "`{key}` = `{other}`: Siphon does not support {what} encoding yet. Written as json (JsonConverter with schemas.enable=false), \
                 which produces different bytes: do not switch until the consumers accept them (or Siphon supports it)"
            ));
            "json"
        }
    };
    if class != JSON_CONVERTER {
        if let Some(v) = schemas {
            options.push((schemas_key, v));
        }
    }
    for (option, value) in options {
        let utf8 = value.eq_ignore_ascii_case("UTF-8") || value.eq_ignore_ascii_case("UTF8");
        if option.ends_with(".encoding") && utf8 {
            continue; // StringConverter's default: what Siphon writes.
        }
        notes.push(keyed(
            &option,
            &value,
            "converter option; Siphon's encodings have no options",
        ));
    }
    encoding
}

/// Takes the Avro converter's registry URL and basic auth user out of `options` into
/// `[schema_registry]`.
fn registry_options(
    key: &str,
    options: &mut Vec<(String, String)>,
    out: &mut Output,
    notes: &mut Vec<String>,
) {
    let url_key = format!("{key}.schema.registry.url");
    let user_key = format!("{key}.basic.auth.user.info");
    let source_key = format!("{key}.basic.auth.credentials.source");
    let mut rest = Vec::new();
    for (option, value) in options.drain(..) {
        if option == url_key {
            let mut urls = value.split(',').map(str::trim).filter(|u| !u.is_empty());
            if let Some(first) = urls.next() {
                match out.schema_registry.get("url").and_then(toml::Value::as_str) {
                    None => out.schema_registry.insert("url".into(), string(first)),
                    Some(taken) if taken == first => {}
                    Some(taken) => notes.push(format!(
                        "`{url_key}` = `{first}`: Siphon writes keys and values through one registry, {taken}"
                    )),
                }
            }
            if urls.next().is_some() {
                notes.push(format!(
                    "`{url_key}` lists several registry URLs; Siphon takes one, the first"
                ));
            }
        } else if option == user_key {
            let user = value.split_once(':').map_or(value.as_str(), |(u, _)| u);
            if out.schema_registry.contains("username") {
                continue;
            }
            out.schema_registry.insert("username".into(), string(user));
            notes.push(format!(
                "`{user_key}`: the user is in [schema_registry]; set the password with SIPHON_SCHEMA_REGISTRY_PASSWORD (it is not written to the file)"
            ));
        } else if option != source_key || !value.eq_ignore_ascii_case("USER_INFO") {
            rest.push((option, value));
        }
    }
    *options = rest;
    if !out.schema_registry.contains("url") && !notes.iter().any(|n| n.contains(&url_key)) {
        notes.push(format!(
            "`{url_key}` is not set: set schema_registry.url to the registry the converter used"
        ));
    }
}

#[cfg(test)]
mod tests {
    use crate::import_debezium;
    use crate::tests::{minimal, note_with, parse};
    use siphon_config::EncodingName;

    #[test]
    fn converters_map_to_encodings() {
        let import = import_debezium(&minimal(
            r#", "key.converter": "org.apache.kafka.connect.json.JsonConverter",
               "value.converter": "io.debezium.converters.BinaryDataConverter""#,
        ))
        .unwrap();
        let c = parse(&import);
        assert_eq!(c.format.key, EncodingName::JsonSchemas);
        assert_eq!(c.format.value, EncodingName::Binary);
        note_with(&import, &["key.converter.schemas.enable", "assumed"]);

        let import = import_debezium(&minimal(
            r#", "key.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
               "value.converter": "org.apache.kafka.connect.json.JsonConverter",
               "value.converter.schemas.enable": "true""#,
        ))
        .unwrap();
        let c = parse(&import);
        assert_eq!(c.format.key, EncodingName::Binary);
        assert_eq!(c.format.value, EncodingName::JsonSchemas);
        assert!(
            !import.notes.iter().any(|n| n.contains("converter")),
            "{:#?}",
            import.notes
        );
    }

    #[test]
    fn an_avro_value_converter_becomes_avro_values_and_its_registry() {
        let import = import_debezium(&minimal(
            r#", "key.converter": "org.apache.kafka.connect.storage.StringConverter",
               "value.converter": "io.confluent.connect.avro.AvroConverter",
               "value.converter.schema.registry.url": "https://r1:8081,https://r2:8081",
               "value.converter.basic.auth.credentials.source": "USER_INFO",
               "value.converter.basic.auth.user.info": "siphon:s3cret",
               "value.converter.auto.register.schemas": "true""#,
        ))
        .unwrap();
        let c = parse(&import);
        assert_eq!(c.format.value, EncodingName::Avro);
        assert_eq!(c.schema_registry.url, "https://r1:8081");
        assert_eq!(c.schema_registry.username, "siphon");
        assert!(c.schema_registry.password.is_empty());
        assert!(!import.toml.contains("s3cret"), "{}", import.toml);
        note_with(&import, &["SIPHON_SCHEMA_REGISTRY_PASSWORD"]);
        note_with(&import, &["several registry URLs"]);
        note_with(&import, &["auto.register.schemas"]);
    }

    #[test]
    fn avro_key_and_value_converters_become_avro_keys_and_values_through_one_registry() {
        let import = import_debezium(&minimal(
            r#", "key.converter": "io.confluent.connect.avro.AvroConverter",
               "key.converter.schema.registry.url": "http://registry:8081",
               "value.converter": "io.confluent.connect.avro.AvroConverter",
               "value.converter.schema.registry.url": "http://registry:8081""#,
        ))
        .unwrap();
        let c = parse(&import);
        assert_eq!(c.format.key, EncodingName::Avro);
        assert_eq!(c.format.value, EncodingName::Avro);
        assert_eq!(c.schema_registry.url, "http://registry:8081");
        assert!(
            !import.notes.iter().any(|n| n.contains("registry")),
            "{:#?}",
            import.notes
        );

        let import = import_debezium(&minimal(
            r#", "key.converter": "io.confluent.connect.avro.AvroConverter",
               "key.converter.schema.registry.url": "http://keys:8081",
               "value.converter": "io.confluent.connect.avro.AvroConverter",
               "value.converter.schema.registry.url": "http://values:8081""#,
        ))
        .unwrap();
        assert_eq!(parse(&import).schema_registry.url, "http://keys:8081");
        note_with(
            &import,
            &["value.converter.schema.registry.url", "one registry"],
        );
    }
}
