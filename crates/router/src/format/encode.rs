//! Column values encoded as Kafka Connect's converters encode what Debezium makes of them.
//!
//! Debezium's PostgreSQL connector turns each column into a Kafka Connect value whose type
//! follows the column type; the converters then write that value. [`ValueKind`] is that
//! mapping for the types the router supports:
//!
//! | PostgreSQL type (oid)                                   | Connect type | JSON (`JsonConverter`)        | String (`StringConverter`, headers) |
//! |---------------------------------------------------------|--------------|-------------------------------|-------------------------------------|
//! | text 25, varchar 1043, bpchar 1042, name 19, "char" 18, uuid 2950, json 114, jsonb 3802, user-defined types | STRING | string literal of the text (`"order-1"`) | the text |
//! | int2 21, int4 23, int8 20, oid 26                       | INT16/32/64  | the digits (`42`)             | the digits                          |
//! | bool 16                                                 | BOOLEAN      | `true` / `false`              | `true` / `false`                    |
//! | float4 700                                              | FLOAT32      | Java `Float.toString`         | Java `Float.toString`               |
//! | float8 701                                              | FLOAT64      | Java `Double.toString`        | Java `Double.toString`              |
//!
//! Non-finite floats are JSON strings (`"NaN"`, `"Infinity"`, `"-Infinity"`), as Jackson
//! writes them by default. Other built-in types (bytea, numeric, dates and times, …) are
//! rejected: Debezium encodes them in ways the router does not reproduce yet. User-defined
//! types (oid >= 16384: enums, domains, extension types such as citext) are taken as text,
//! as Debezium does for enums and text-like extension types.
//!
//! # Invariants
//! - JSON output is one valid JSON value.
//! - Every value owns its bytes, never a slice of the column: a column is a slice of the buffer
//!   the row was received into, and a record waits for its acknowledgement far longer than the
//!   rest of that buffer is needed.

use crate::format::encoding::JavaNumbers;
use crate::format::javanum::{java_double, java_float, FloatText};
use crate::format::json::{json_string_bytes, write_json_string};
use bytes::Bytes;
use pgoutput::Oid;

/// The first oid PostgreSQL gives to user-defined objects (`FirstNormalObjectId`).
pub const FIRST_USER_OID: Oid = 16384;

/// PostgreSQL type oids the router knows.
pub mod oid {
    use pgoutput::Oid;
    pub const BOOL: Oid = 16;
    pub const BYTEA: Oid = 17;
    pub const CHAR: Oid = 18;
    pub const NAME: Oid = 19;
    pub const INT8: Oid = 20;
    pub const INT2: Oid = 21;
    pub const INT4: Oid = 23;
    pub const TEXT: Oid = 25;
    pub const OID: Oid = 26;
    pub const JSON: Oid = 114;
    pub const FLOAT4: Oid = 700;
    pub const FLOAT8: Oid = 701;
    pub const BPCHAR: Oid = 1042;
    pub const VARCHAR: Oid = 1043;
    pub const DATE: Oid = 1082;
    pub const TIME: Oid = 1083;
    pub const TIMESTAMP: Oid = 1114;
    pub const TIMESTAMPTZ: Oid = 1184;
    pub const INTERVAL: Oid = 1186;
    pub const NUMERIC: Oid = 1700;
    pub const UUID: Oid = 2950;
    pub const JSONB: Oid = 3802;
}

/// How a column's values are encoded, from its PostgreSQL type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    /// Text-like: written as a string.
    Text,
    /// int2, int4, int8, oid: written as the digits.
    Integer,
    /// bool: `true` / `false`.
    Boolean,
    /// float4: Java `Float.toString`.
    Float32,
    /// float8: Java `Double.toString`.
    Float64,
    /// bytea (hex text `\\x…`): raw bytes; base64 in JSON. Only for the key and payload
    /// columns: [`ValueKind::of`] does not return it.
    Bytes,
}

impl ValueKind {
    /// The kind for a type oid, or `None` for a built-in type the router does not support.
    pub fn of(type_oid: Oid) -> Option<Self> {
        match type_oid {
            oid::TEXT
            | oid::VARCHAR
            | oid::BPCHAR
            | oid::NAME
            | oid::CHAR
            | oid::UUID
            | oid::JSON
            | oid::JSONB => Some(ValueKind::Text),
            oid::INT2 | oid::INT4 | oid::INT8 | oid::OID => Some(ValueKind::Integer),
            oid::BOOL => Some(ValueKind::Boolean),
            oid::FLOAT4 => Some(ValueKind::Float32),
            oid::FLOAT8 => Some(ValueKind::Float64),
            t if t >= FIRST_USER_OID => Some(ValueKind::Text),
            _ => None,
        }
    }

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            ValueKind::Text => "text",
            ValueKind::Integer => "integer",
            ValueKind::Boolean => "boolean",
            ValueKind::Float32 => "real",
            ValueKind::Float64 => "double precision",
            ValueKind::Bytes => "bytea",
        }
    }
}

/// The name of a type oid for messages.
pub fn type_name(type_oid: Oid) -> &'static str {
    match type_oid {
        oid::BOOL => "boolean",
        oid::BYTEA => "bytea",
        oid::CHAR => "\"char\"",
        oid::NAME => "name",
        oid::INT8 => "bigint",
        oid::INT2 => "smallint",
        oid::INT4 => "integer",
        oid::TEXT => "text",
        oid::OID => "oid",
        oid::JSON => "json",
        oid::FLOAT4 => "real",
        oid::FLOAT8 => "double precision",
        oid::BPCHAR => "character",
        oid::VARCHAR => "character varying",
        oid::DATE => "date",
        oid::TIME => "time",
        oid::TIMESTAMP => "timestamp",
        oid::TIMESTAMPTZ => "timestamp with time zone",
        oid::INTERVAL => "interval",
        oid::NUMERIC => "numeric",
        oid::UUID => "uuid",
        oid::JSONB => "jsonb",
        t if t >= FIRST_USER_OID => "a user-defined type",
        _ => "a built-in type",
    }
}

/// The text is not valid for the column's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadValue;

/// The value as `JsonConverter` (schemas disabled) writes it.
///
/// `raw` is the column's bytes and `text` the same bytes as `str`.
pub fn to_json(kind: ValueKind, raw: &Bytes, text: &str) -> Result<Bytes, BadValue> {
    match kind {
        ValueKind::Text => Ok(json_string_bytes(text)),
        ValueKind::Integer => check_integer(text).map(|()| Bytes::copy_from_slice(raw)),
        ValueKind::Boolean => boolean(text),
        ValueKind::Float32 => float32(text).map(json_number),
        ValueKind::Float64 => float64(text).map(json_number),
        ValueKind::Bytes => {
            let bytes = decode_bytea(text)?;
            let mut out = Vec::with_capacity(bytes.len() * 4 / 3 + 4);
            out.push(b'"');
            crate::format::connect::base64(&mut out, &bytes);
            out.push(b'"');
            Ok(Bytes::from(out))
        }
    }
}

/// [`to_json`] with numbers printed as `numbers` says.
pub fn to_json_with(
    kind: ValueKind,
    raw: &Bytes,
    text: &str,
    numbers: JavaNumbers,
) -> Result<Bytes, BadValue> {
    match (kind, numbers) {
        (ValueKind::Float32, JavaNumbers::Java17) => float32_17(text).map(json_number),
        (ValueKind::Float64, JavaNumbers::Java17) => float64_17(text).map(json_number),
        _ => to_json(kind, raw, text),
    }
}

/// [`to_string`] with numbers printed as `numbers` says.
pub fn to_string_with(
    kind: ValueKind,
    raw: &Bytes,
    text: &str,
    numbers: JavaNumbers,
) -> Result<Bytes, BadValue> {
    match (kind, numbers) {
        (ValueKind::Float32, JavaNumbers::Java17) => float32_17(text).map(|f| Bytes::from(f.text)),
        (ValueKind::Float64, JavaNumbers::Java17) => float64_17(text).map(|f| Bytes::from(f.text)),
        _ => to_string(kind, raw, text),
    }
}

fn float32_17(text: &str) -> Result<FloatText, BadValue> {
    text.parse::<f32>()
        .map(crate::format::javanum_legacy::java17_float)
        .map_err(|_| BadValue)
}

fn float64_17(text: &str) -> Result<FloatText, BadValue> {
    text.parse::<f64>()
        .map(crate::format::javanum_legacy::java17_double)
        .map_err(|_| BadValue)
}

/// The bytes of PostgreSQL's hex bytea text (`\x0aff`, the default `bytea_output`).
pub fn decode_bytea(text: &str) -> Result<Bytes, BadValue> {
    let hex = text.strip_prefix("\\x").ok_or(BadValue)?.as_bytes();
    if hex.len() % 2 != 0 {
        return Err(BadValue);
    }
    let nibble = |b: u8| match b {
        b'0'..=b'9' => Ok(b - b'0'),
        b'a'..=b'f' => Ok(b - b'a' + 10),
        b'A'..=b'F' => Ok(b - b'A' + 10),
        _ => Err(BadValue),
    };
    hex.chunks_exact(2)
        .map(|pair| Ok(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect::<Result<Vec<u8>, BadValue>>()
        .map(Bytes::from)
}

/// The value as `StringConverter` writes it (Java's `toString` of the Connect value); also
/// what `SimpleHeaderConverter` writes for a header.
pub fn to_string(kind: ValueKind, raw: &Bytes, text: &str) -> Result<Bytes, BadValue> {
    match kind {
        ValueKind::Text => Ok(Bytes::copy_from_slice(raw)),
        ValueKind::Integer => check_integer(text).map(|()| Bytes::copy_from_slice(raw)),
        ValueKind::Boolean => boolean(text),
        ValueKind::Float32 => float32(text).map(|f| Bytes::from(f.text)),
        ValueKind::Float64 => float64(text).map(|f| Bytes::from(f.text)),
        // Java's text of a byte array is an object identity, not its content.
        ValueKind::Bytes => Err(BadValue),
    }
}

/// PostgreSQL prints integers as an optional `-` and digits.
fn check_integer(text: &str) -> Result<(), BadValue> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        Ok(())
    } else {
        Err(BadValue)
    }
}

fn boolean(text: &str) -> Result<Bytes, BadValue> {
    match text {
        "t" => Ok(Bytes::from_static(b"true")),
        "f" => Ok(Bytes::from_static(b"false")),
        _ => Err(BadValue),
    }
}

fn float32(text: &str) -> Result<FloatText, BadValue> {
    text.parse::<f32>().map(java_float).map_err(|_| BadValue)
}

fn float64(text: &str) -> Result<FloatText, BadValue> {
    text.parse::<f64>().map(java_double).map_err(|_| BadValue)
}

fn json_number(f: FloatText) -> Bytes {
    if f.finite {
        Bytes::from(f.text)
    } else {
        let mut out = Vec::with_capacity(f.text.len() + 2);
        write_json_string(&mut out, &f.text);
        Bytes::from(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(kind: ValueKind, text: &str) -> Result<Bytes, BadValue> {
        to_json(kind, &Bytes::copy_from_slice(text.as_bytes()), text)
    }

    fn string(kind: ValueKind, text: &str) -> Result<Bytes, BadValue> {
        to_string(kind, &Bytes::copy_from_slice(text.as_bytes()), text)
    }

    #[test]
    fn kinds_of_oids() {
        for t in [25, 1043, 1042, 19, 18, 2950, 114, 3802, 16384, 99999] {
            assert_eq!(ValueKind::of(t), Some(ValueKind::Text), "oid {t}");
        }
        for t in [21, 23, 20, 26] {
            assert_eq!(ValueKind::of(t), Some(ValueKind::Integer), "oid {t}");
        }
        assert_eq!(ValueKind::of(16), Some(ValueKind::Boolean));
        assert_eq!(ValueKind::of(700), Some(ValueKind::Float32));
        assert_eq!(ValueKind::of(701), Some(ValueKind::Float64));
        for t in [17, 1700, 1082, 1114, 1184, 0, 16383] {
            assert_eq!(ValueKind::of(t), None, "oid {t}");
        }
    }

    #[test]
    fn text_json_is_a_string_literal() {
        assert_eq!(
            json(ValueKind::Text, "order-1"),
            Ok(Bytes::from_static(b"\"order-1\""))
        );
        assert_eq!(
            json(ValueKind::Text, r#"{"a": 1, "b": [1, 2]}"#),
            Ok(Bytes::from_static(br#""{\"a\": 1, \"b\": [1, 2]}""#))
        );
    }

    #[test]
    fn string_values_own_their_bytes() {
        let raw = Bytes::from_static(b"order-1");
        let out = to_string(ValueKind::Text, &raw, "order-1").unwrap();
        assert_eq!(out, raw);
        assert_ne!(out.as_ptr(), raw.as_ptr());
        let raw = Bytes::from_static(b"4711");
        for out in [
            to_string(ValueKind::Integer, &raw, "4711").unwrap(),
            to_json(ValueKind::Integer, &raw, "4711").unwrap(),
        ] {
            assert_eq!(out, raw);
            assert_ne!(out.as_ptr(), raw.as_ptr());
        }
    }

    #[test]
    fn integers() {
        assert_eq!(
            json(ValueKind::Integer, "42"),
            Ok(Bytes::from_static(b"42"))
        );
        assert_eq!(
            json(ValueKind::Integer, "-9223372036854775808"),
            Ok(Bytes::from_static(b"-9223372036854775808"))
        );
        assert_eq!(
            string(ValueKind::Integer, "7"),
            Ok(Bytes::from_static(b"7"))
        );
        for bad in ["", "-", "1.5", "+1", "1e3", " 1", "abc"] {
            assert_eq!(json(ValueKind::Integer, bad), Err(BadValue), "{bad:?}");
        }
    }

    #[test]
    fn booleans() {
        assert_eq!(
            json(ValueKind::Boolean, "t"),
            Ok(Bytes::from_static(b"true"))
        );
        assert_eq!(
            json(ValueKind::Boolean, "f"),
            Ok(Bytes::from_static(b"false"))
        );
        assert_eq!(
            string(ValueKind::Boolean, "t"),
            Ok(Bytes::from_static(b"true"))
        );
        assert_eq!(json(ValueKind::Boolean, "true"), Err(BadValue));
    }

    #[test]
    fn floats() {
        assert_eq!(
            json(ValueKind::Float64, "1.5"),
            Ok(Bytes::from_static(b"1.5"))
        );
        assert_eq!(
            json(ValueKind::Float64, "100"),
            Ok(Bytes::from_static(b"100.0"))
        );
        assert_eq!(
            json(ValueKind::Float64, "1e+100"),
            Ok(Bytes::from_static(b"1.0E100"))
        );
        assert_eq!(
            json(ValueKind::Float64, "1.2345e-05"),
            Ok(Bytes::from_static(b"1.2345E-5"))
        );
        assert_eq!(
            json(ValueKind::Float32, "0.1"),
            Ok(Bytes::from_static(b"0.1"))
        );
        assert_eq!(
            json(ValueKind::Float32, "3.4028235e+38"),
            Ok(Bytes::from_static(b"3.4028235E38"))
        );
        assert_eq!(
            json(ValueKind::Float64, "-0"),
            Ok(Bytes::from_static(b"-0.0"))
        );
        assert_eq!(json(ValueKind::Float64, "x"), Err(BadValue));
    }

    #[test]
    fn non_finite_floats_are_quoted_in_json_only() {
        assert_eq!(
            json(ValueKind::Float64, "NaN"),
            Ok(Bytes::from_static(b"\"NaN\""))
        );
        assert_eq!(
            json(ValueKind::Float64, "Infinity"),
            Ok(Bytes::from_static(b"\"Infinity\""))
        );
        assert_eq!(
            json(ValueKind::Float32, "-Infinity"),
            Ok(Bytes::from_static(b"\"-Infinity\""))
        );
        assert_eq!(
            string(ValueKind::Float64, "NaN"),
            Ok(Bytes::from_static(b"NaN"))
        );
        assert_eq!(
            string(ValueKind::Float64, "-Infinity"),
            Ok(Bytes::from_static(b"-Infinity"))
        );
    }

    #[test]
    fn bytea_hex_text() {
        assert_eq!(decode_bytea("\\x"), Ok(Bytes::new()));
        assert_eq!(
            decode_bytea("\\x00ff7F"),
            Ok(Bytes::from_static(b"\x00\xff\x7f"))
        );
        for bad in ["", "00", "\\x0", "\\xzz", "\\000"] {
            assert_eq!(decode_bytea(bad), Err(BadValue), "{bad}");
        }
        assert_eq!(
            json(ValueKind::Bytes, "\\x666f6f"),
            Ok(Bytes::from_static(b"\"Zm9v\""))
        );
        assert_eq!(string(ValueKind::Bytes, "\\x66"), Err(BadValue));
    }

    #[test]
    fn json_output_is_valid_json() {
        let cases = [
            (ValueKind::Text, "a\"b"),
            (ValueKind::Integer, "-12"),
            (ValueKind::Boolean, "f"),
            (ValueKind::Float64, "NaN"),
            (ValueKind::Float64, "6.02214076e+23"),
            (ValueKind::Float32, "1e-45"),
        ];
        for (kind, text) in cases {
            let out = json(kind, text);
            let Ok(out) = out else {
                panic!("{kind:?} {text}")
            };
            assert!(
                serde_json::from_slice::<serde_json::Value>(&out).is_ok(),
                "{kind:?} {text}"
            );
        }
    }
}
