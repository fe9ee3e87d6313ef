//! A JSON payload written with a schema registered by someone else (`schema_registry.schemas =
//! "registered"`): the payload is checked against the schema its subject holds, and written
//! with it, framed with that schema's id. A payload that does not fit is refused with the
//! reason, never written in part.
//!
//! With an Avro schema ([`RegisteredAvro`]) a payload fits when it is a JSON object whose
//! members are all fields of the record (at
//! every level: a member the schema does not name would be dropped silently), whose values
//! resolve to the fields' types as Avro's schema resolution has them (an integer for `int`
//! and `long`, any number for `float` and `double`, a symbol for an `enum`, the branch of a
//! union that takes the value), and where every field it leaves out has a default.
//!
//! With a JSON Schema ([`RegisteredJson`]) a payload fits when the schema validates it; it is
//! written as it is (the JSON text PostgreSQL keeps), framed as Confluent's JSON Schema
//! serializer frames it. References to other documents are not fetched: a schema that needs
//! one cannot be read.
//!
//! # Invariants
//! - Nothing here performs IO; a [`RegisteredAvro`] is parsed once per schema id.
//! - [`RegisteredAvro::encode`] returns a whole frame or an error: a payload that does not fit
//!   is never written in part, and no member of it is dropped.

use apache_avro::schema::{Name, ResolvedSchema, Schema};
use apache_avro::types::Value as AvroValue;
use serde_json::Value as JsonValue;
use siphon_record::registered::framed;
use siphon_record::RegistrySchemaKind;
use std::collections::HashMap;

/// The longest reason a misfit carries (the Avro library's messages quote whole values).
const MAX_REASON: usize = 1000;

/// Why a payload does not fit the registered schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the payload does not fit the schema registered with id {id}: {reason}")]
pub struct Misfit {
    /// The schema's id.
    pub id: u32,
    /// What does not fit.
    pub reason: String,
}

/// A schema registered for a subject, read.
#[derive(Debug)]
pub enum RegisteredSchema {
    /// An Avro schema.
    Avro(RegisteredAvro),
    /// A JSON Schema.
    Json(RegisteredJson),
}

impl RegisteredSchema {
    /// The schema `text` of `kind` registered with `id`.
    ///
    /// # Errors
    /// The text is not a schema of that kind that can be read.
    pub fn parse(kind: RegistrySchemaKind, id: u32, text: &str) -> Result<Self, Misfit> {
        Ok(match kind {
            RegistrySchemaKind::Avro => RegisteredSchema::Avro(RegisteredAvro::parse(id, text)?),
            RegistrySchemaKind::Json => RegisteredSchema::Json(RegisteredJson::parse(id, text)?),
        })
    }

    /// Its kind.
    pub fn kind(&self) -> RegistrySchemaKind {
        match self {
            RegisteredSchema::Avro(_) => RegistrySchemaKind::Avro,
            RegisteredSchema::Json(_) => RegistrySchemaKind::Json,
        }
    }

    /// The JSON `payload` checked and written with the schema, framed with its id.
    ///
    /// # Errors
    /// A [`Misfit`] naming what does not fit.
    pub fn encode(&self, payload: &[u8]) -> Result<Vec<u8>, Misfit> {
        match self {
            RegisteredSchema::Avro(schema) => schema.encode(payload),
            RegisteredSchema::Json(schema) => schema.encode(payload),
        }
    }
}

/// A registered JSON Schema: its id and its validator.
#[derive(Debug)]
pub struct RegisteredJson {
    id: u32,
    validator: jsonschema::Validator,
}

impl RegisteredJson {
    /// The JSON Schema `text` registered with `id`.
    ///
    /// # Errors
    /// The text is not a JSON Schema, or refers to a document it does not hold.
    pub fn parse(id: u32, text: &str) -> Result<RegisteredJson, Misfit> {
        let unreadable = |reason: String| Misfit {
            id,
            reason: shortened(format!("the schema cannot be read: {reason}")),
        };
        let schema: JsonValue =
            serde_json::from_str(text).map_err(|e| unreadable(e.to_string()))?;
        let validator =
            jsonschema::validator_for(&schema).map_err(|e| unreadable(e.to_string()))?;
        Ok(RegisteredJson { id, validator })
    }

    /// The JSON `payload`, validated, framed with the schema's id.
    ///
    /// # Errors
    /// A [`Misfit`] naming where the payload breaks the schema.
    pub fn encode(&self, payload: &[u8]) -> Result<Vec<u8>, Misfit> {
        let json = payload_json(self.id, payload)?;
        if let Err(error) = self.validator.validate(&json) {
            let at = error.instance_path().to_string();
            let at = if at.is_empty() { "/".to_owned() } else { at };
            return Err(Misfit {
                id: self.id,
                reason: shortened(format!("at {at}: {error}")),
            });
        }
        Ok(framed(self.id, payload))
    }
}

/// The payload parsed as JSON, or the misfit of a payload that is not JSON.
fn payload_json(id: u32, payload: &[u8]) -> Result<JsonValue, Misfit> {
    serde_json::from_slice(payload).map_err(|e| Misfit {
        id,
        reason: shortened(format!("the payload is not JSON ({e})")),
    })
}

/// A registered Avro schema: its id and its parsed form.
#[derive(Debug, Clone)]
pub struct RegisteredAvro {
    id: u32,
    schema: Schema,
    names: HashMap<Name, Schema>,
}

impl RegisteredAvro {
    /// The schema `text` registered with `id`.
    ///
    /// # Errors
    /// The text is not an Avro schema the `apache-avro` crate reads.
    pub fn parse(id: u32, text: &str) -> Result<RegisteredAvro, Misfit> {
        let unreadable = |reason: String| Misfit { id, reason };
        let schema = crate::format::avro::parse_schema(text)
            .map_err(|e| unreadable(format!("the schema cannot be read: {e}")))?;
        let names = ResolvedSchema::try_from(&schema)
            .map_err(|e| unreadable(format!("the schema cannot be read: {e}")))?
            .get_names()
            .iter()
            .map(|(name, schema)| (name.clone(), (*schema).clone()))
            .collect();
        Ok(RegisteredAvro { id, schema, names })
    }

    /// The schema's id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The JSON `payload` written with the schema, framed with its id.
    ///
    /// # Errors
    /// A [`Misfit`] naming what does not fit.
    pub fn encode(&self, payload: &[u8]) -> Result<Vec<u8>, Misfit> {
        let misfit = |reason: String| Misfit {
            id: self.id,
            reason: shortened(reason),
        };
        let json = payload_json(self.id, payload)?;
        let mut path = String::from("$");
        if let Some(reason) = self.unknown_member(&self.schema, &json, &mut path) {
            return Err(misfit(reason));
        }
        let value = AvroValue::try_from(json).map_err(|e| misfit(e.to_string()))?;
        let value = value
            .resolve_with_names(&self.schema, &self.names)
            .map_err(|e| misfit(e.to_string()))?;
        let datum = apache_avro::writer::datum::GenericDatumWriter::builder(&self.schema)
            .build()
            .and_then(|writer| writer.write_value_to_vec(value))
            .map_err(|e| misfit(e.to_string()))?;
        Ok(framed(self.id, &datum))
    }

    /// The first member of `json` (at `path`) that no field of its record names, if any.
    fn unknown_member(
        &self,
        schema: &Schema,
        json: &JsonValue,
        path: &mut String,
    ) -> Option<String> {
        match (self.named(schema), json) {
            (Schema::Record(record), JsonValue::Object(members)) => {
                if let Some(key) = members.keys().find(|k| !record.lookup.contains_key(*k)) {
                    return Some(format!(
                        "{path}.{key} is not a field of record {}",
                        record.name.fullname(None)
                    ));
                }
                record.fields.iter().find_map(|field| {
                    let value = members.get(&field.name)?;
                    let len = path.len();
                    path.push('.');
                    path.push_str(&field.name);
                    let found = self.unknown_member(&field.schema, value, path);
                    path.truncate(len);
                    found
                })
            }
            (Schema::Array(array), JsonValue::Array(items)) => {
                items.iter().enumerate().find_map(|(i, item)| {
                    let len = path.len();
                    path.push_str(&format!("[{i}]"));
                    let found = self.unknown_member(&array.items, item, path);
                    path.truncate(len);
                    found
                })
            }
            (Schema::Map(map), JsonValue::Object(members)) => {
                members.iter().find_map(|(key, value)| {
                    let len = path.len();
                    path.push('.');
                    path.push_str(key);
                    let found = self.unknown_member(&map.types, value, path);
                    path.truncate(len);
                    found
                })
            }
            // A union takes the value if one branch of its shape does.
            (Schema::Union(union), json) => {
                let mut first = None;
                for branch in union.variants() {
                    let shaped = matches!(
                        (self.named(branch), json),
                        (Schema::Record(_) | Schema::Map(_), JsonValue::Object(_))
                            | (Schema::Array(_), JsonValue::Array(_))
                    );
                    if !shaped {
                        continue;
                    }
                    match self.unknown_member(branch, json, path) {
                        None => return None,
                        Some(reason) => {
                            first.get_or_insert(reason);
                        }
                    }
                }
                first
            }
            _ => None,
        }
    }

    /// `schema`, a reference followed to the schema it names.
    fn named<'s>(&'s self, schema: &'s Schema) -> &'s Schema {
        match schema {
            Schema::Ref { name } => self
                .names
                .get(name)
                .or_else(|| {
                    self.names
                        .iter()
                        .find(|(n, _)| n.name() == name.name())
                        .map(|(_, s)| s)
                })
                .unwrap_or(schema),
            schema => schema,
        }
    }
}

fn shortened(mut reason: String) -> String {
    if reason.len() > MAX_REASON {
        let mut end = MAX_REASON;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
        reason.push('…');
    }
    reason
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: &str = r#"{"type":"record","name":"Order","namespace":"shop","fields":[
        {"name":"id","type":"long"},
        {"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID"]}},
        {"name":"note","type":["null","string"],"default":null},
        {"name":"lines","type":{"type":"array","items":{"type":"record","name":"Line","fields":[
            {"name":"sku","type":"string"},{"name":"qty","type":"int"}]}}},
        {"name":"total","type":"double","default":0.0}
    ]}"#;

    fn order() -> RegisteredAvro {
        RegisteredAvro::parse(7, ORDER).expect("a schema")
    }

    #[test]
    fn a_fitting_payload_is_framed_with_the_schema_id() {
        let framed = order()
            .encode(
                br#"{"id": 3, "status": "PAID", "lines": [{"sku": "a", "qty": 2}], "total": 9}"#,
            )
            .expect("fits");
        assert_eq!(&framed[..5], &[0, 0, 0, 0, 7]);
        // id 3 (zig-zag 6), status 1 (2), note: null branch (0), one line: count 1 (2), "a"
        // (len 1: 2, 'a'), qty 2 (4), end of array (0), total 9.0 as a little-endian double.
        let mut expected = vec![6, 2, 0, 2, 2, b'a', 4, 0];
        expected.extend_from_slice(&9.0f64.to_le_bytes());
        assert_eq!(&framed[5..], &expected[..]);
    }

    #[test]
    fn misfits_name_what_does_not_fit() {
        let cases = [
            (
                r#"{"id": 1, "status": "NEW", "lines": [], "extra": 1}"#,
                "$.extra is not a field of record shop.Order",
            ),
            (
                r#"{"id": 1, "status": "NEW", "lines": [{"sku": "a", "qty": 1, "color": "red"}]}"#,
                "$.lines[0].color is not a field of record shop.Line",
            ),
            (r#"{"id": 1, "lines": []}"#, "status"),
            (r#"{"id": "one", "status": "NEW", "lines": []}"#, ""),
            (r#"{"id": 1, "status": "LOST", "lines": []}"#, ""),
            (r#"{"id": 1.5, "status": "NEW", "lines": []}"#, ""),
            (r#"[1, 2]"#, ""),
            (r#"not json"#, "not JSON"),
        ];
        for (payload, needle) in cases {
            let misfit = order().encode(payload.as_bytes()).expect_err(payload);
            assert_eq!(misfit.id, 7);
            assert!(misfit.to_string().contains(needle), "{payload}: {misfit}");
            assert!(
                misfit.reason.len() <= MAX_REASON + '…'.len_utf8(),
                "{misfit}"
            );
        }
    }

    #[test]
    fn defaults_fill_left_out_fields_and_nulls_take_the_null_branch() {
        let framed = order()
            .encode(br#"{"id": 1, "status": "NEW", "note": null, "lines": []}"#)
            .expect("fits");
        let mut expected = vec![0, 0, 0, 0, 7, 2, 0, 0, 0];
        expected.extend_from_slice(&0.0f64.to_le_bytes());
        assert_eq!(framed, expected);
    }

    #[test]
    fn a_record_named_once_and_referenced_again_is_checked_where_it_is_referenced() {
        let schema = r#"{"type":"record","name":"Move","fields":[
            {"name":"from","type":{"type":"record","name":"Place","fields":[{"name":"x","type":"int"}]}},
            {"name":"to","type":"Place"}]}"#;
        let moves = RegisteredAvro::parse(1, schema).expect("a schema");
        assert_eq!(
            moves
                .encode(br#"{"from": {"x": 1}, "to": {"x": -1}}"#)
                .expect("fits"),
            vec![0, 0, 0, 0, 1, 2, 1]
        );
        let misfit = moves
            .encode(br#"{"from": {"x": 1}, "to": {"x": 2, "y": 3}}"#)
            .expect_err("y");
        assert!(misfit.reason.contains("$.to.y"), "{misfit}");
    }

    const ORDER_JSON: &str = r#"{"$schema":"http://json-schema.org/draft-07/schema#","type":"object",
        "properties":{"id":{"type":"integer"},"note":{"type":"string"}},
        "required":["id"],"additionalProperties":false}"#;

    #[test]
    fn a_json_payload_that_validates_is_written_as_it_is_in_a_frame() {
        let schema =
            RegisteredSchema::parse(RegistrySchemaKind::Json, 9, ORDER_JSON).expect("a schema");
        assert_eq!(schema.kind(), RegistrySchemaKind::Json);
        let payload = br#"{"id": 1, "note": "gift"}"#;
        let framed = schema.encode(payload).expect("fits");
        assert_eq!(&framed[..5], &[0, 0, 0, 0, 9]);
        assert_eq!(&framed[5..], &payload[..]);
        for (payload, needle) in [
            (r#"{"note": "x"}"#, "\"id\" is a required property"),
            (r#"{"id": "one"}"#, "at /id"),
            (r#"{"id": 1, "extra": true}"#, "extra"),
            ("[]", "at /"),
        ] {
            let misfit = schema.encode(payload.as_bytes()).expect_err(payload);
            assert!(misfit.to_string().contains(needle), "{payload}: {misfit}");
        }
    }

    #[test]
    fn a_json_schema_with_a_remote_reference_is_not_fetched() {
        let e = RegisteredSchema::parse(
            RegistrySchemaKind::Json,
            4,
            r#"{"$ref":"https://example.com/other.json"}"#,
        )
        .expect_err("no fetching");
        assert!(e.to_string().contains("cannot be read"), "{e}");
    }

    #[test]
    fn a_text_that_is_not_an_avro_schema_is_named() {
        let e = RegisteredAvro::parse(3, r#"{"type":"object"}"#).expect_err("JSON Schema");
        assert!(e.to_string().contains("cannot be read"), "{e}");
    }
}
