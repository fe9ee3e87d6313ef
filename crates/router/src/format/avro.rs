//! Avro, as the schema-registry converters write a Kafka Connect schema and value:
//! Confluent's `AvroConverter` (its `AvroData.fromConnectSchema` / `fromConnectData`) and
//! Apicurio's, which follows it. The registry itself is not touched here: the caller registers
//! [`AvroSchema::json`] and passes the id it got back to [`AvroSchema::encode`].
//!
//! The schema, from a Connect schema:
//! - `boolean`, `int16`, `int32`, `int64`, `float`, `double`, `string`, `bytes` become `boolean`,
//!   `int` (with `"connect.type":"int16"`), `int`, `long`, `float`, `double`, `string`, `bytes`;
//!   an array becomes an Avro array of its element's schema;
//! - a struct becomes a record named by the struct's name split at its last dot into namespace
//!   and name (`payload.order` is the record `order` in the namespace `payload`); an unnamed
//!   struct is `io.confluent.connect.avro.ConnectDefault`, then `ConnectDefault2`, … in the
//!   order met;
//! - an optional schema becomes the union `["null", schema]`, the top-level one included, and an
//!   optional field gets `"default": null`;
//! - a named schema carries `"connect.name"`, a versioned one `"connect.version"` (in that
//!   order after `connect.version`, as `AvroData` adds them), on the record or primitive rather
//!   than on the union;
//! - a record met a second time, equal, is written as a reference to its name.
//!
//! The text is written as Avro's Java `Schema.toString()` writes it: `type`, `name`,
//! `namespace` (left out when it is the enclosing record's), `fields` (each `name`, `type`,
//! `default`), then the properties; a primitive without properties is just its name.
//!
//! The value: the Avro binary encoding of the Connect value, written by the `apache-avro`
//! crate, framed as the converters frame it: magic byte 0, the schema id as 4 bytes big-endian,
//! then the datum.
//!
//! # Differences from the converters
//! - A name Avro refuses (a field or record name that is not letters, digits and `_`, or starts
//!   with a digit) is an error, as it is with the converters' default
//!   `avro.scrub.invalid.names=false`; Siphon has no scrubbing. Names are the specification's
//!   ASCII ones: Avro's Java library also takes other Unicode letters and digits, which Siphon
//!   refuses.
//! - A Java string holding an unpaired surrogate is written with `?` in its place, as Java's
//!   UTF-8 encoder (under Avro's `Utf8`) writes it.
//! - A schema whose text nests deeper than Jackson's 1000 levels (a payload about 250 objects
//!   deep) is an error, as Jackson's limit makes it one for the converters and registries.
//!
//! # Invariants
//! - Recursion is bounded: a schema is refused before it is parsed when its text nests deeper
//!   than [`MAX_WRITE_DEPTH`]. A payload the router expands on the calling thread (nesting up
//!   to 64 levels) is written within a thread's default 2 MiB stack; deeper ones need the
//!   router's deep-stack thread, as its JSON writers do.
//! - [`AvroSchema::json`] is a schema that the `apache-avro` crate parses ([`AvroSchema`] holds
//!   it parsed), and every value [`AvroSchema::encode`] accepts is written against it.
//! - Nothing here performs IO or keeps state between calls.

use crate::format::connect::{Schema, SchemaType, Value};
use crate::format::json::{java_utf8, nesting_depth, write_json_string, MAX_WRITE_DEPTH};
use apache_avro::types::Value as AvroValue;
use siphon_record::{RegistrySchema, RegistrySchemaKind};

/// The namespace of the records of unnamed structs (`AvroData.NAMESPACE`).
pub const DEFAULT_NAMESPACE: &str = "io.confluent.connect.avro";
/// The name of the record of an unnamed struct (`AvroData.DEFAULT_SCHEMA_NAME`).
pub const DEFAULT_NAME: &str = "ConnectDefault";

/// Why a Connect schema has no Avro schema, or a value cannot be written with one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AvroError {
    /// A field, record or namespace name that Avro refuses.
    #[error("{name:?} is not a valid Avro name (letters, digits and _, not starting with a digit); rename the JSON member or column it comes from")]
    InvalidName {
        /// The name as it is in the Connect schema.
        name: String,
    },
    /// Two different structs carry the same name.
    #[error("two different structs are both named {name:?}, which Avro cannot tell apart; rename one of the JSON members they come from")]
    Redefined {
        /// The full name.
        name: String,
    },
    /// The schema's text would nest deeper than Jackson writes (behind the converters).
    #[error("the Avro schema of the payload nests {depth} levels deep, and Jackson (behind the Avro converters and registries) writes at most {max}; flatten the payload", max = MAX_WRITE_DEPTH)]
    TooDeep {
        /// How deep it nests.
        depth: usize,
    },
    /// A value does not fit its Connect schema.
    #[error("a value does not fit its schema: {what}")]
    Mismatch {
        /// What did not fit.
        what: String,
    },
    /// The `apache-avro` crate refused the schema text.
    #[error("the Avro schema is not valid: {reason}")]
    Schema {
        /// The crate's message.
        reason: String,
    },
    /// The `apache-avro` crate refused to write the value.
    #[error("the value cannot be written as Avro: {reason}")]
    Write {
        /// The crate's message.
        reason: String,
    },
}

impl AvroError {
    /// What the error means: a name Avro refuses is the payload's to fix; a value that does
    /// not fit the schema made of it, or a schema the Avro crate refuses, is Siphon's bug.
    pub fn consequence(&self) -> siphon_record::Consequence {
        match self {
            AvroError::InvalidName { .. }
            | AvroError::Redefined { .. }
            | AvroError::TooDeep { .. } => siphon_record::Consequence::Fix,
            AvroError::Mismatch { .. } | AvroError::Schema { .. } | AvroError::Write { .. } => {
                siphon_record::Consequence::Bug
            }
        }
    }
}

/// The Avro schema of a Connect schema: its text to register (with its fingerprint, computed
/// once here rather than for every record written with it) and its parsed form.
#[derive(Debug, Clone)]
pub struct AvroSchema {
    connect: Schema,
    registry: RegistrySchema,
    parsed: apache_avro::Schema,
}

impl AvroSchema {
    /// The Avro schema `AvroData.fromConnectSchema` makes of `connect`.
    ///
    /// # Errors
    /// [`AvroError::InvalidName`] or [`AvroError::Redefined`] when Avro cannot name a part of it.
    pub fn from_connect(connect: &Schema) -> Result<AvroSchema, AvroError> {
        let mut writer = SchemaWriter::default();
        let mut out = Vec::new();
        writer.schema(&mut out, connect)?;
        // Every byte written is ASCII or comes from a `String`.
        let json = String::from_utf8(out).map_err(|e| AvroError::Schema {
            reason: e.to_string(),
        })?;
        let depth = nesting_depth(json.as_bytes());
        if depth > MAX_WRITE_DEPTH {
            return Err(AvroError::TooDeep { depth });
        }
        let parsed = parse_schema(&json)?;
        Ok(AvroSchema {
            connect: connect.clone(),
            registry: RegistrySchema::new(RegistrySchemaKind::Avro, json.into()),
            parsed,
        })
    }

    /// The schema's text, as Avro's Java `Schema.toString()` writes it: what to register.
    pub fn json(&self) -> &str {
        self.registry.text()
    }

    /// The schema to register, as the session looks its id up: [`AvroSchema::json`] with its
    /// fingerprint. Cloning it shares the text.
    pub fn registry_schema(&self) -> &RegistrySchema {
        &self.registry
    }

    /// The Connect schema this was made of.
    pub fn connect(&self) -> &Schema {
        &self.connect
    }

    /// The Avro binary of `value` alone, without the frame.
    ///
    /// # Errors
    /// [`AvroError::Mismatch`] when the value does not fit the Connect schema,
    /// [`AvroError::Write`] when the `apache-avro` crate refuses it.
    pub fn datum(&self, value: &Value) -> Result<Vec<u8>, AvroError> {
        let avro = to_avro(&self.connect, value)?;
        let write = |e: apache_avro::Error| AvroError::Write {
            reason: e.to_string(),
        };
        apache_avro::writer::datum::GenericDatumWriter::builder(&self.parsed)
            .build()
            .map_err(write)?
            .write_value_to_vec(avro)
            .map_err(write)
    }

    /// `value` framed as the converters frame it (`siphon_record::registered::framed`): the magic
    /// byte, `schema_id` as 4 bytes big-endian, then its Avro binary.
    ///
    /// # Errors
    /// As [`AvroSchema::datum`].
    pub fn encode(&self, value: &Value, schema_id: u32) -> Result<Vec<u8>, AvroError> {
        Ok(siphon_record::registered::framed(
            schema_id,
            &self.datum(value)?,
        ))
    }
}

/// The schema text parsed by `apache-avro`, as deep as [`AvroSchema::from_connect`] lets it
/// nest (`Schema::parse_str` stops at serde_json's default of 128 levels).
pub(crate) fn parse_schema(json: &str) -> Result<apache_avro::Schema, AvroError> {
    use serde::Deserialize as _;
    let invalid = |reason: String| AvroError::Schema { reason };
    let mut deserializer = serde_json::Deserializer::from_str(json);
    deserializer.disable_recursion_limit();
    let value =
        serde_json::Value::deserialize(&mut deserializer).map_err(|e| invalid(e.to_string()))?;
    apache_avro::Schema::parse(&value).map_err(|e| invalid(e.to_string()))
}

/// Whether `name` is an Avro name: `[A-Za-z_][A-Za-z0-9_]*`.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn check_name(name: &str, whole: &str) -> Result<(), AvroError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(AvroError::InvalidName {
            name: whole.to_owned(),
        })
    }
}

/// The state of one schema's writing (`AvroData.FromConnectContext` and Avro's `Names`).
#[derive(Default)]
struct SchemaWriter {
    /// The records written so far: their (required) Connect schema and full name.
    records: Vec<(Schema, String)>,
    /// The unnamed structs named so far.
    unnamed: usize,
    /// The namespace of the record being written.
    space: Option<String>,
}

impl SchemaWriter {
    fn schema(&mut self, out: &mut Vec<u8>, schema: &Schema) -> Result<(), AvroError> {
        if schema.optional {
            out.extend_from_slice(b"[\"null\",");
            self.required(out, schema)?;
            out.push(b']');
            Ok(())
        } else {
            self.required(out, schema)
        }
    }

    /// The schema as if it were required.
    fn required(&mut self, out: &mut Vec<u8>, schema: &Schema) -> Result<(), AvroError> {
        let primitive = match &schema.ty {
            SchemaType::Struct(fields) => return self.record(out, schema, fields),
            SchemaType::Array(items) => {
                out.extend_from_slice(b"{\"type\":\"array\",\"items\":");
                self.schema(out, items)?;
                Self::props(out, schema);
                out.push(b'}');
                return Ok(());
            }
            SchemaType::Boolean => "boolean",
            SchemaType::Int16 | SchemaType::Int32 => "int",
            SchemaType::Int64 => "long",
            SchemaType::Float32 => "float",
            SchemaType::Float64 => "double",
            SchemaType::String => "string",
            SchemaType::Bytes => "bytes",
        };
        if schema.name.is_none() && schema.version.is_none() && schema.ty != SchemaType::Int16 {
            write_json_string(out, primitive);
        } else {
            out.extend_from_slice(b"{\"type\":");
            write_json_string(out, primitive);
            Self::props(out, schema);
            out.push(b'}');
        }
        Ok(())
    }

    /// `,"connect.version":…,"connect.name":…,"connect.type":…` as far as they apply.
    fn props(out: &mut Vec<u8>, schema: &Schema) {
        if let Some(version) = schema.version {
            out.extend_from_slice(format!(",\"connect.version\":{version}").as_bytes());
        }
        if let Some(name) = &schema.name {
            out.extend_from_slice(b",\"connect.name\":");
            write_json_string(out, name);
        }
        if schema.ty == SchemaType::Int16 {
            out.extend_from_slice(b",\"connect.type\":\"int16\"");
        }
    }

    fn record(
        &mut self,
        out: &mut Vec<u8>,
        schema: &Schema,
        fields: &[(String, Schema)],
    ) -> Result<(), AvroError> {
        let required = Schema {
            optional: false,
            ..schema.clone()
        };
        let (space, name) = match &schema.name {
            Some(full) => {
                let (space, name) = match full.rsplit_once('.') {
                    Some((space, name)) => (Some(space.to_owned()), name.to_owned()),
                    None => (None, full.clone()),
                };
                check_name(&name, full)?;
                if let Some(space) = &space {
                    for part in space.split('.') {
                        check_name(part, full)?;
                    }
                }
                (space, name)
            }
            None => {
                if let Some((_, full)) = self.records.iter().find(|(s, _)| *s == required) {
                    let full = full.clone();
                    self.reference(out, &full);
                    return Ok(());
                }
                self.unnamed += 1;
                let name = match self.unnamed {
                    1 => DEFAULT_NAME.to_owned(),
                    n => format!("{DEFAULT_NAME}{n}"),
                };
                (Some(DEFAULT_NAMESPACE.to_owned()), name)
            }
        };
        let full = match &space {
            Some(space) => format!("{space}.{name}"),
            None => name.clone(),
        };
        if let Some((defined, _)) = self.records.iter().find(|(_, f)| *f == full) {
            if *defined == required {
                self.reference(out, &full);
                return Ok(());
            }
            return Err(AvroError::Redefined { name: full });
        }
        self.records.push((required, full));

        out.extend_from_slice(b"{\"type\":\"record\",\"name\":");
        write_json_string(out, &name);
        match (&space, &self.space) {
            (Some(space), current) if current.as_ref() != Some(space) => {
                out.extend_from_slice(b",\"namespace\":");
                write_json_string(out, space);
            }
            (None, Some(_)) => out.extend_from_slice(b",\"namespace\":\"\""),
            _ => {}
        }
        let enclosing = std::mem::replace(&mut self.space, space);
        out.extend_from_slice(b",\"fields\":[");
        let mut result = Ok(());
        for (i, (field, field_schema)) in fields.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            if let Err(e) = check_name(field, field) {
                result = Err(e);
                break;
            }
            out.extend_from_slice(b"{\"name\":");
            write_json_string(out, field);
            out.extend_from_slice(b",\"type\":");
            if let Err(e) = self.schema(out, field_schema) {
                result = Err(e);
                break;
            }
            if field_schema.optional {
                out.extend_from_slice(b",\"default\":null");
            }
            out.push(b'}');
        }
        self.space = enclosing;
        result?;
        out.push(b']');
        Self::props(out, schema);
        out.push(b'}');
        Ok(())
    }

    /// A record already written: its name, short when it is in the current namespace.
    fn reference(&self, out: &mut Vec<u8>, full: &str) {
        let short = match (full.rsplit_once('.'), &self.space) {
            (Some((space, name)), Some(current)) if space == current => name,
            _ => full,
        };
        write_json_string(out, short);
    }
}

fn mismatch(schema: &Schema, value: &Value) -> AvroError {
    let kind = match value {
        Value::Null => "null",
        Value::Encoded { .. } => "column value",
        Value::Bool(_) => "boolean",
        Value::Int(_) => "integer",
        Value::Float64(_) => "double",
        Value::Str(_) | Value::JavaStr(_) => "string",
        Value::Bytes(_) => "bytes",
        Value::Array(_) => "array",
        Value::Struct(_) => "struct",
    };
    AvroError::Mismatch {
        what: format!(
            "a {kind} where the schema is {}{:?}",
            if schema.optional { "optional " } else { "" },
            schema.ty
        ),
    }
}

/// The value as `apache-avro` takes it for the schema [`SchemaWriter`] writes: an optional
/// schema's value is a branch of the union `["null", schema]`.
fn to_avro(schema: &Schema, value: &Value) -> Result<AvroValue, AvroError> {
    match (schema.optional, value) {
        (true, Value::Null) => Ok(AvroValue::Union(0, Box::new(AvroValue::Null))),
        (true, value) => Ok(AvroValue::Union(1, Box::new(required(schema, value)?))),
        (false, value) => required(schema, value),
    }
}

fn required(schema: &Schema, value: &Value) -> Result<AvroValue, AvroError> {
    let fail = || mismatch(schema, value);
    let text = |v: &Value| -> Option<String> {
        match v {
            Value::Encoded { text, .. } => String::from_utf8(text.to_vec()).ok(),
            _ => None,
        }
    };
    Ok(match (&schema.ty, value) {
        (_, Value::Null) => return Err(fail()),
        (SchemaType::Struct(fields), Value::Struct(values)) if fields.len() == values.len() => {
            let mut record = Vec::with_capacity(fields.len());
            for ((name, field_schema), value) in fields.iter().zip(values) {
                record.push((name.clone(), to_avro(field_schema, value)?));
            }
            AvroValue::Record(record)
        }
        (SchemaType::Array(items), Value::Array(values)) => AvroValue::Array(
            values
                .iter()
                .map(|v| to_avro(items, v))
                .collect::<Result<_, _>>()?,
        ),
        (SchemaType::Boolean, Value::Bool(b)) => AvroValue::Boolean(*b),
        (SchemaType::Boolean, v) => match text(v).as_deref() {
            Some("true") => AvroValue::Boolean(true),
            Some("false") => AvroValue::Boolean(false),
            _ => return Err(fail()),
        },
        (SchemaType::Int16 | SchemaType::Int32, Value::Int(i)) => {
            AvroValue::Int(i32::try_from(*i).map_err(|_| fail())?)
        }
        (SchemaType::Int16 | SchemaType::Int32, v) => {
            AvroValue::Int(text(v).and_then(|t| t.parse().ok()).ok_or_else(fail)?)
        }
        (SchemaType::Int64, Value::Int(i)) => AvroValue::Long(*i),
        (SchemaType::Int64, v) => {
            AvroValue::Long(text(v).and_then(|t| t.parse().ok()).ok_or_else(fail)?)
        }
        // Connect's float: the double narrowed as Java's `(float)` narrows it.
        (SchemaType::Float32, Value::Float64(f)) => AvroValue::Float(*f as f32),
        (SchemaType::Float32, v) => {
            AvroValue::Float(text(v).and_then(|t| java_float_text(&t)).ok_or_else(fail)? as f32)
        }
        (SchemaType::Float64, Value::Float64(f)) => AvroValue::Double(*f),
        (SchemaType::Float64, v) => {
            AvroValue::Double(text(v).and_then(|t| java_float_text(&t)).ok_or_else(fail)?)
        }
        (SchemaType::String, Value::Str(s)) => AvroValue::String(s.clone()),
        (SchemaType::String, Value::JavaStr(units)) => {
            // Java's UTF-8 encoder writes `?` for an unpaired surrogate: valid UTF-8.
            AvroValue::String(String::from_utf8(java_utf8(units)).map_err(|_| fail())?)
        }
        (SchemaType::String, v) => AvroValue::String(text(v).ok_or_else(fail)?),
        (SchemaType::Bytes, Value::Bytes(b)) => AvroValue::Bytes(b.to_vec()),
        _ => return Err(fail()),
    })
}

/// A double from Java's `Double.toString` / `Float.toString` text.
fn java_float_text(text: &str) -> Option<f64> {
    match text {
        "NaN" => Some(f64::NAN),
        "Infinity" => Some(f64::INFINITY),
        "-Infinity" => Some(f64::NEG_INFINITY),
        other => other.parse().ok(),
    }
}

#[cfg(test)]
mod tests;
