//! Kafka Connect schemas and values, written as `JsonConverter` (with and without schemas)
//! and `StringConverter` write them.
//!
//! Only what outbox records need: the column types the router supports, the struct of an
//! envelope and the structs, arrays and scalars of an expanded JSON payload.
//!
//! # Invariants
//! - [`write_schema`] writes the members of a schema in `JsonConverter.asJsonSchema` order:
//!   `type`, then `items` or `fields`, then `optional`, `name`, `version`; a struct field adds
//!   `field` last.
//! - [`write_json`] of a value that fits its schema is one valid JSON value.

use crate::format::javanum::java_double;
use crate::format::json::{java_utf8, write_json_string, write_json_utf16};
use bytes::Bytes;

/// The type of a Connect schema.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SchemaType {
    /// `boolean`
    Boolean,
    /// `int16`
    Int16,
    /// `int32`
    Int32,
    /// `int64`
    Int64,
    /// `float`
    Float32,
    /// `double`
    Float64,
    /// `string`
    String,
    /// `bytes`
    Bytes,
    /// `array` with its element schema.
    Array(Box<Schema>),
    /// `struct` with its fields in order.
    Struct(Vec<(String, Schema)>),
}

/// A Connect schema.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Schema {
    /// The type.
    pub ty: SchemaType,
    /// Whether null is allowed.
    pub optional: bool,
    /// The schema name (`io.debezium.data.Json`, …).
    pub name: Option<String>,
    /// The schema version.
    pub version: Option<i32>,
}

impl Schema {
    /// An unnamed schema.
    pub fn new(ty: SchemaType, optional: bool) -> Self {
        Schema {
            ty,
            optional,
            name: None,
            version: None,
        }
    }
}

/// A Connect value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// null
    Null,
    /// A column value already written both ways: as JSON and as Java's `toString`.
    Encoded {
        /// `JsonConverter` text.
        json: Bytes,
        /// `StringConverter` text.
        text: Bytes,
    },
    /// A boolean.
    Bool(bool),
    /// An int16, int32 or int64.
    Int(i64),
    /// A float64.
    Float64(f64),
    /// A string.
    Str(String),
    /// A Java string that holds an unpaired surrogate, as UTF-16 code units (only from an
    /// expanded payload: JSON text can escape one, UTF-8 cannot hold one).
    JavaStr(Vec<u16>),
    /// Bytes (base64 in JSON).
    Bytes(Bytes),
    /// An array.
    Array(Vec<Value>),
    /// A struct: one value per schema field, in order.
    Struct(Vec<Value>),
}

impl Value {
    /// The value with every float printed as Java 17 prints it (`Encoded` text instead of a
    /// number the writers would print the Java 19+ way).
    pub fn with_java17_numbers(self) -> Value {
        let encoded = |f: crate::format::javanum::FloatText| {
            let mut json = Vec::with_capacity(f.text.len() + 2);
            write_float(&mut json, f.clone());
            Value::Encoded {
                json: Bytes::from(json),
                text: Bytes::from(f.text),
            }
        };
        match self {
            Value::Float64(f) => encoded(crate::format::javanum_legacy::java17_double(f)),
            Value::Array(items) => {
                Value::Array(items.into_iter().map(Value::with_java17_numbers).collect())
            }
            Value::Struct(values) => {
                Value::Struct(values.into_iter().map(Value::with_java17_numbers).collect())
            }
            other => other,
        }
    }
}

/// Appends `schema` as `JsonConverter.asJsonSchema` writes it.
pub fn write_schema(out: &mut Vec<u8>, schema: &Schema) {
    write_schema_field(out, schema, None);
}

fn write_schema_field(out: &mut Vec<u8>, schema: &Schema, field: Option<&str>) {
    let type_name = match &schema.ty {
        SchemaType::Boolean => "boolean",
        SchemaType::Int16 => "int16",
        SchemaType::Int32 => "int32",
        SchemaType::Int64 => "int64",
        SchemaType::Float32 => "float",
        SchemaType::Float64 => "double",
        SchemaType::String => "string",
        SchemaType::Bytes => "bytes",
        SchemaType::Array(_) => "array",
        SchemaType::Struct(_) => "struct",
    };
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(type_name.as_bytes());
    out.push(b'"');
    match &schema.ty {
        SchemaType::Array(items) => {
            out.extend_from_slice(b",\"items\":");
            write_schema(out, items);
        }
        SchemaType::Struct(fields) => {
            out.extend_from_slice(b",\"fields\":[");
            for (i, (name, field_schema)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_schema_field(out, field_schema, Some(name));
            }
            out.push(b']');
        }
        _ => {}
    }
    out.extend_from_slice(if schema.optional {
        b",\"optional\":true"
    } else {
        b",\"optional\":false"
    });
    if let Some(name) = &schema.name {
        out.extend_from_slice(b",\"name\":");
        write_json_string(out, name);
    }
    if let Some(version) = schema.version {
        out.extend_from_slice(format!(",\"version\":{version}").as_bytes());
    }
    if let Some(field) = field {
        out.extend_from_slice(b",\"field\":");
        write_json_string(out, field);
    }
    out.push(b'}');
}

/// Appends `value` as `JsonConverter` writes it (Jackson's compact output).
pub fn write_json(out: &mut Vec<u8>, value: &Value, schema: Option<&Schema>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Encoded { json, .. } => out.extend_from_slice(json),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Int(i) => out.extend_from_slice(i.to_string().as_bytes()),
        Value::Float64(f) => write_float(out, java_double(*f)),
        Value::Str(s) => write_json_string(out, s),
        Value::JavaStr(units) => write_json_utf16(out, units),
        Value::Bytes(b) => {
            out.push(b'"');
            base64(out, b);
            out.push(b'"');
        }
        Value::Array(items) => {
            let item_schema = match schema.map(|s| &s.ty) {
                Some(SchemaType::Array(items)) => Some(&**items),
                _ => None,
            };
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json(out, item, item_schema);
            }
            out.push(b']');
        }
        Value::Struct(values) => {
            let fields: &[(String, Schema)] = match schema.map(|s| &s.ty) {
                Some(SchemaType::Struct(fields)) => fields,
                _ => &[],
            };
            out.push(b'{');
            for (i, ((name, field_schema), value)) in fields.iter().zip(values).enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json_string(out, name);
                out.push(b':');
                write_json(out, value, Some(field_schema));
            }
            out.push(b'}');
        }
    }
}

fn write_float(out: &mut Vec<u8>, f: crate::format::javanum::FloatText) {
    if f.finite {
        out.extend_from_slice(f.text.as_bytes());
    } else {
        // Jackson quotes non-finite numbers by default.
        write_json_string(out, &f.text);
    }
}

/// `{"schema":…,"payload":…}`, as `JsonConverter` with `schemas.enable=true` writes it.
pub fn write_envelope(out: &mut Vec<u8>, value: &Value, schema: Option<&Schema>) {
    out.extend_from_slice(b"{\"schema\":");
    match schema {
        Some(schema) => write_schema(out, schema),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"payload\":");
    write_json(out, value, schema);
    out.push(b'}');
}

/// A value holds bytes, whose Java text is an object identity rather than their content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BytesHaveNoText;

/// Java's `toString` of the value (what `StringConverter` writes); `None` for null.
///
/// # Errors
/// [`BytesHaveNoText`] when the value holds bytes.
pub fn java_text(
    value: &Value,
    schema: Option<&Schema>,
) -> Result<Option<Vec<u8>>, BytesHaveNoText> {
    if matches!(value, Value::Null) {
        return Ok(None);
    }
    let mut out = Vec::new();
    write_java_text(&mut out, value, schema)?;
    Ok(Some(out))
}

fn write_java_text(
    out: &mut Vec<u8>,
    value: &Value,
    schema: Option<&Schema>,
) -> Result<(), BytesHaveNoText> {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Encoded { text, .. } => out.extend_from_slice(text),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Int(i) => out.extend_from_slice(i.to_string().as_bytes()),
        Value::Float64(f) => out.extend_from_slice(java_double(*f).text.as_bytes()),
        Value::Str(s) => out.extend_from_slice(s.as_bytes()),
        Value::JavaStr(units) => out.extend_from_slice(&java_utf8(units)),
        Value::Bytes(_) => return Err(BytesHaveNoText),
        Value::Array(items) => {
            // java.util.AbstractCollection.toString
            let item_schema = match schema.map(|s| &s.ty) {
                Some(SchemaType::Array(items)) => Some(&**items),
                _ => None,
            };
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.extend_from_slice(b", ");
                }
                write_java_text(out, item, item_schema)?;
            }
            out.push(b']');
        }
        Value::Struct(values) => {
            // org.apache.kafka.connect.data.Struct.toString: non-null fields only.
            let fields: &[(String, Schema)] = match schema.map(|s| &s.ty) {
                Some(SchemaType::Struct(fields)) => fields,
                _ => &[],
            };
            out.extend_from_slice(b"Struct{");
            let mut first = true;
            for ((name, field_schema), value) in fields.iter().zip(values) {
                if matches!(value, Value::Null) {
                    continue;
                }
                if !first {
                    out.push(b',');
                }
                first = false;
                out.extend_from_slice(name.as_bytes());
                out.push(b'=');
                write_java_text(out, value, Some(field_schema))?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

/// Standard base64 with padding, as Jackson writes `byte[]`.
pub(crate) fn base64(out: &mut Vec<u8>, data: &[u8]) {
    use base64::Engine as _;
    let start = out.len();
    out.resize(start + data.len().div_ceil(3) * 4, 0);
    let written = base64::engine::general_purpose::STANDARD
        .encode_slice(data, &mut out[start..])
        // The buffer was sized for the padded encoding.
        .unwrap_or(0);
    out.truncate(start + written);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(bytes: Vec<u8>) -> String {
        String::from_utf8(bytes).unwrap_or_default()
    }

    #[test]
    fn scalar_schemas_in_json_converter_order() {
        let mut out = Vec::new();
        let mut schema = Schema::new(SchemaType::String, true);
        schema.name = Some("io.debezium.data.Json".to_owned());
        schema.version = Some(1);
        write_schema(&mut out, &schema);
        assert_eq!(
            s(out),
            r#"{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1}"#
        );
    }

    #[test]
    fn struct_and_array_schemas() {
        let schema = Schema::new(
            SchemaType::Struct(vec![
                ("a".to_owned(), Schema::new(SchemaType::Int32, true)),
                (
                    "b".to_owned(),
                    Schema::new(
                        SchemaType::Array(Box::new(Schema::new(SchemaType::String, true))),
                        true,
                    ),
                ),
            ]),
            false,
        );
        let mut out = Vec::new();
        write_schema(&mut out, &schema);
        assert_eq!(
            s(out),
            r#"{"type":"struct","fields":[{"type":"int32","optional":true,"field":"a"},{"type":"array","items":{"type":"string","optional":true},"optional":true,"field":"b"}],"optional":false}"#
        );
        let value = Value::Struct(vec![
            Value::Int(1),
            Value::Array(vec![Value::Str("x\"".to_owned()), Value::Null]),
        ]);
        let mut out = Vec::new();
        write_json(&mut out, &value, Some(&schema));
        assert_eq!(s(out), r#"{"a":1,"b":["x\"",null]}"#);
        assert_eq!(
            java_text(&value, Some(&schema)).map(|t| t.map(s)),
            Ok(Some("Struct{a=1,b=[x\", null]}".to_owned()))
        );
    }

    #[test]
    fn base64_padding() {
        for (input, expected) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"\xff\xfe\x00", "//4A"),
        ] {
            let mut out = Vec::new();
            base64(&mut out, input);
            assert_eq!(s(out), expected);
        }
    }
}
