//! `table.expand.json.payload`: a JSON text payload parsed and turned into a Connect struct
//! whose schema is inferred from the document, as Debezium's outbox `JsonSchemaData` does.
//!
//! Parsing follows Jackson's defaults (`ObjectMapper.readTree`): strict JSON, numbers typed as
//! int when they fit 32 bits, long when they fit 64 bits, a big integer beyond that and a
//! double when they have a fraction or exponent; a repeated object key keeps its first
//! position and its last value; anything after the first value is not read. Strings are Java
//! strings: a `\uD800`-style escape of an unpaired surrogate is kept (as UTF-16 code units),
//! and written back as Jackson writes it; a member *name* holding one is refused
//! ([`Expansion::Unsupported`]).
//!
//! Schema inference:
//! - string, boolean: optional string, optional boolean;
//! - number: optional int32, int64 or (big integer, double) float64;
//! - object: an optional struct named by the dotted path from the payload column name
//!   (`payload`, `payload.order`, …) with one field per member in document order, where
//!   a member named `""` with a schema fails the inference (Connect refuses the name), and
//!   members whose schema is unknown (`null`, `[]`) are left out unless
//!   `table.json.payload.null.behavior=optional_bytes` /
//!   `table.json.payload.empty.array.behavior=optional_string` type them;
//! - array: an optional array of the schema of its first non-null element; object elements
//!   are merged into one struct, fields in order of appearance; the merge of two or more
//!   different object schemas is a *required* struct (Debezium copies only name and version),
//!   so a `null` element then does not fit; elements of different JSON types, or numbers of
//!   different schemas, make the inference fail.
//!
//! # Outcomes
//! Debezium logs a warning and keeps the payload unchanged when the text does not start with
//! `{` or `[`, does not parse, or the inference fails ([`Expansion::Unchanged`]). When the
//! schema is inferred but the value cannot be built (a top-level array, a big integer, an
//! element that does not fit the merged schema), Debezium has already replaced the schema and
//! keeps the string value, which the JSON converters then refuse ([`Expansion::Broken`]).
//!
//! # Read limits
//! Jackson's default `StreamReadConstraints` (version 2.21.2, which Debezium 3.6.3 ships) fail
//! the parse, so the payload stays unchanged, past each of these limits (at the limit it
//! parses):
//! - [`MAX_DEPTH`] nested objects and arrays;
//! - [`MAX_NUMBER_LENGTH`] digits in a number: integer, fraction and exponent digits (sign,
//!   point, `e` and the exponent's sign not counted). A number starting with `0` (`0.5`,
//!   `-0e7`) takes Jackson's slower reading, where an absent fraction or exponent counts -1,
//!   so `0.` with 1000 fraction digits parses where `1.` with 1000 does not;
//! - [`MAX_NAME_LENGTH`] Java characters (UTF-16 code units, escapes decoded) in a member
//!   name, and [`MAX_STRING_LENGTH`] in a string value.
//!
//! Documents and token counts are not limited. One case follows Jackson only mostly: in a
//! payload longer than 32,768 Java characters Jackson reads through a buffer of 4,000 or more
//! characters (the size depends on what the thread parsed before), and a number that crosses
//! its end takes the slower reading; Siphon always counts a number not starting with `0` the
//! fast way, which differs only for a number with exactly 1001 counted digits and no
//! fraction or no exponent.
//!
//! # Invariants
//! - Never panics; past any read limit the parse fails, as Jackson's does.

use crate::format::connect::{Schema, SchemaType, Value};
use crate::format::json::MAX_WRITE_DEPTH;
use std::io;

/// Why a payload cannot be written with `table.expand.json.payload`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpansionError {
    /// A member name is not valid Unicode text.
    #[error("a member name holds an unpaired surrogate (a \\uD800-style escape), which Siphon does not write as a field name")]
    UnpairedSurrogateName,
    /// The payload is an array, not an object.
    #[error("the payload is a JSON array, and only a JSON object can be expanded into a struct")]
    TopLevelArray,
    /// A null where the merged schema of differing array elements is required.
    #[error("a JSON null is an element of an array whose objects differ, whose merged schema is required")]
    NullInRequired,
    /// An integer past 64 bits, which Jackson reads as a decimal.
    #[error("an integer beyond 64 bits becomes a decimal, which does not fit the float64 schema inferred for it")]
    BigInteger,
    /// A value of one JSON type where the inferred schema has another.
    #[error("a JSON {found} does not fit the schema inferred for its place ({inferred:?})")]
    Mismatch {
        /// The JSON type found: `string`, `boolean`, `number`, `array` or `object`.
        found: &'static str,
        /// The type inferred for the place.
        inferred: SchemaType,
    },
    /// No envelope schema could be built for the payload.
    #[error("the payload has no schema")]
    NoSchema,
    /// The payload does not fit the envelope schema built for it.
    #[error("the payload does not fit its envelope schema")]
    EnvelopeMismatch,
    /// The written JSON would nest deeper than Jackson writes.
    #[error("the record's JSON nests {depth} levels deep, and Jackson (behind Kafka Connect's JsonConverter) writes at most {max}", max = MAX_WRITE_DEPTH)]
    TooDeepToWrite {
        /// How deep it nests.
        depth: usize,
    },
    /// The thread that expands deeply nested payloads could not be started.
    #[error("the payload nests deeply and no thread could be started to expand it: {}", io_error_text(.kind, .os_error))]
    NoDeepThread {
        /// The kind of the spawn error.
        kind: io::ErrorKind,
        /// The operating system's error code, if it gave one.
        os_error: Option<i32>,
    },
    /// The thread that expands deeply nested payloads panicked.
    #[error("the payload nests deeply and expanding it failed unexpectedly")]
    DeepThreadFailed,
}

impl ExpansionError {
    /// The error of a failed spawn of the deep-payload thread.
    pub fn no_deep_thread(error: &io::Error) -> Self {
        ExpansionError::NoDeepThread {
            kind: error.kind(),
            os_error: error.raw_os_error(),
        }
    }
}

/// An I/O error's text from its kind and code, as `io::Error` prints it.
fn io_error_text(kind: &io::ErrorKind, os_error: &Option<i32>) -> String {
    match *os_error {
        Some(code) => io::Error::from_raw_os_error(code).to_string(),
        None => io::Error::from(*kind).to_string(),
    }
}

/// How JSON expansion types a `null` member (`table.json.payload.null.behavior`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JsonNullBehavior {
    /// `ignore`: members whose value is `null` are left out of the expanded value.
    #[default]
    Ignore,
    /// `optional_bytes`: they are kept, typed as optional bytes, and written as `null`.
    OptionalBytes,
}

/// How JSON expansion types an empty array (`table.json.payload.empty.array.behavior`).
///
/// Siphon's own option: Debezium 3.x has none, and always leaves empty arrays out (`Ignore`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JsonEmptyArrayBehavior {
    /// `ignore`: members whose value is `[]` are left out of the expanded value.
    #[default]
    Ignore,
    /// `optional_string`: they are kept as an array of optional strings.
    OptionalString,
}

/// Jackson's default maximum nesting depth.
pub const MAX_DEPTH: usize = 1000;

/// Jackson's default maximum number length, in digits (see the module docs).
pub const MAX_NUMBER_LENGTH: usize = 1000;

/// Jackson's default maximum member name length, in UTF-16 code units.
pub const MAX_NAME_LENGTH: usize = 50_000;

/// Jackson's default maximum string value length, in UTF-16 code units.
pub const MAX_STRING_LENGTH: usize = 20_000_000;

/// A parsed JSON value, typed as Jackson's tree model types it.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    Null,
    Bool(bool),
    Int(i32),
    Long(i64),
    BigInt,
    Double(f64),
    Str(String),
    /// A string holding an unpaired surrogate (`"\ud800"`), as Java's UTF-16 code units.
    JavaStr(Vec<u16>),
    Array(Vec<Node>),
    Object(Vec<(String, Node)>),
}

/// What expanding a payload gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Expansion {
    /// The payload stays as it is (not JSON, or no schema could be inferred).
    Unchanged,
    /// The payload became this struct.
    Expanded {
        /// The inferred schema.
        schema: Schema,
        /// The value.
        value: Value,
    },
    /// Debezium expands the payload, but Siphon cannot write what it makes of it.
    Unsupported {
        /// Why.
        reason: ExpansionError,
    },
    /// The schema was replaced (by this one, or by none) but the value stayed the string.
    Broken {
        /// The inferred schema, or `None` for a top-level `[]`.
        schema: Option<Schema>,
        /// Why the value could not be built.
        reason: ExpansionError,
    },
}

/// Expands `text`, the payload column's value, named `column`.
pub fn expand(
    column: &str,
    text: &str,
    null_behavior: JsonNullBehavior,
    empty_array: JsonEmptyArrayBehavior,
) -> Expansion {
    if !(text.starts_with('{') || text.starts_with('[')) {
        return Expansion::Unchanged;
    }
    let mut parser = Parser {
        bytes: text.as_bytes(),
        pos: 0,
        unpaired_surrogate_in_name: false,
    };
    let Some(node) = parser.value(0) else {
        return Expansion::Unchanged;
    };
    if parser.unpaired_surrogate_in_name {
        return Expansion::Unsupported {
            reason: ExpansionError::UnpairedSurrogateName,
        };
    }
    let inference = Inference {
        null_behavior,
        empty_array,
    };
    let schema = match inference.schema(Some(column), &node) {
        Ok(schema) => schema,
        Err(()) => return Expansion::Unchanged,
    };
    let schema = match schema {
        Some(schema) if matches!(schema.ty, SchemaType::Struct(_)) => schema,
        other => {
            return Expansion::Broken {
                reason: ExpansionError::TopLevelArray,
                schema: other,
            }
        }
    };
    match to_value(&node, &schema) {
        Ok(value) => Expansion::Expanded { schema, value },
        Err(reason) => Expansion::Broken {
            schema: Some(schema),
            reason,
        },
    }
}

struct Parser<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// A member name held an unpaired surrogate.
    unpaired_surrogate_in_name: bool,
}

/// A JSON string as Jackson reads it into a Java string: UTF-8 text until an unpaired
/// surrogate shows up, UTF-16 code units from then on.
enum Text {
    Utf8(String),
    Utf16(Vec<u16>),
}

impl Text {
    fn push_str(&mut self, s: &str) {
        match self {
            Text::Utf8(out) => out.push_str(s),
            Text::Utf16(units) => units.extend(s.encode_utf16()),
        }
    }

    fn push(&mut self, c: char) {
        match self {
            Text::Utf8(out) => out.push(c),
            Text::Utf16(units) => {
                let mut buf = [0u16; 2];
                units.extend_from_slice(c.encode_utf16(&mut buf));
            }
        }
    }

    fn push_unpaired(&mut self, unit: u16) {
        if let Text::Utf8(out) = self {
            *self = Text::Utf16(out.encode_utf16().collect());
        }
        if let Text::Utf16(units) = self {
            units.push(unit);
        }
    }

    /// Whether the text is longer than `limit` Java characters (UTF-16 code units).
    fn longer_than(&self, limit: usize) -> bool {
        match self {
            // UTF-8 takes at least one byte per UTF-16 code unit: count only when needed.
            Text::Utf8(s) => s.len() > limit && s.encode_utf16().count() > limit,
            Text::Utf16(units) => units.len() > limit,
        }
    }

    fn into_node(self) -> Node {
        match self {
            Text::Utf8(s) => Node::Str(s),
            Text::Utf16(units) => Node::JavaStr(units),
        }
    }
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.pos) {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        if self.bytes.get(self.pos..self.pos + word.len()) == Some(word) {
            self.pos += word.len();
            // Jackson rejects a keyword run into letters or digits (`truex`).
            match self.peek() {
                Some(c) if c.is_ascii_alphanumeric() || c == b'_' => None,
                _ => Some(()),
            }
        } else {
            None
        }
    }

    /// A value inside `depth` containers.
    fn value(&mut self, depth: usize) -> Option<Node> {
        self.skip_ws();
        let opens = matches!(self.peek()?, b'{' | b'[');
        // Jackson counts containers: the 1001st nested object or array is refused.
        if opens && depth + 1 > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'{' => {
                self.pos += 1;
                let mut members: Vec<(String, Node)> = Vec::new();
                self.skip_ws();
                if self.peek() == Some(b'}') {
                    self.pos += 1;
                    return Some(Node::Object(members));
                }
                loop {
                    self.skip_ws();
                    if self.peek() != Some(b'"') {
                        return None;
                    }
                    let key = match self.string(MAX_NAME_LENGTH)? {
                        Text::Utf8(key) => key,
                        Text::Utf16(units) => {
                            self.unpaired_surrogate_in_name = true;
                            String::from_utf16_lossy(&units)
                        }
                    };
                    self.skip_ws();
                    if self.peek() != Some(b':') {
                        return None;
                    }
                    self.pos += 1;
                    let value = self.value(depth + 1)?;
                    match members.iter_mut().find(|(k, _)| *k == key) {
                        Some(slot) => slot.1 = value,
                        None => members.push((key, value)),
                    }
                    self.skip_ws();
                    match self.peek()? {
                        b',' => self.pos += 1,
                        b'}' => {
                            self.pos += 1;
                            return Some(Node::Object(members));
                        }
                        _ => return None,
                    }
                }
            }
            b'[' => {
                self.pos += 1;
                let mut items = Vec::new();
                self.skip_ws();
                if self.peek() == Some(b']') {
                    self.pos += 1;
                    return Some(Node::Array(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    self.skip_ws();
                    match self.peek()? {
                        b',' => self.pos += 1,
                        b']' => {
                            self.pos += 1;
                            return Some(Node::Array(items));
                        }
                        _ => return None,
                    }
                }
            }
            b'"' => self.string(MAX_STRING_LENGTH).map(Text::into_node),
            b't' => self.literal(b"true").map(|()| Node::Bool(true)),
            b'f' => self.literal(b"false").map(|()| Node::Bool(false)),
            b'n' => self.literal(b"null").map(|()| Node::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn number(&mut self) -> Option<Node> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        let int_start = self.pos;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.pos += 1;
        }
        let int_digits = self.pos - int_start;
        let leading_zero = self.bytes.get(int_start) == Some(&b'0');
        if int_digits == 0 || (int_digits > 1 && leading_zero) {
            return None;
        }
        let mut frac_digits = None;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            let frac_start = self.pos;
            while self.peek().is_some_and(|b| b.is_ascii_digit()) {
                self.pos += 1;
            }
            if self.pos == frac_start {
                return None;
            }
            frac_digits = Some(self.pos - frac_start);
        }
        let mut exp_digits = None;
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            let exp_start = self.pos;
            while self.peek().is_some_and(|b| b.is_ascii_digit()) {
                self.pos += 1;
            }
            if self.pos == exp_start {
                return None;
            }
            exp_digits = Some(self.pos - exp_start);
        }
        let is_float = frac_digits.is_some() || exp_digits.is_some();
        // Jackson's count (see the module docs): an absent part counts 0 on its fast reading
        // and -1 on the slower one, which a leading zero takes.
        let absent = usize::from(leading_zero);
        let length = if is_float {
            (int_digits + frac_digits.unwrap_or(0) + exp_digits.unwrap_or(0))
                .saturating_sub(absent * usize::from(frac_digits.is_none()))
                .saturating_sub(absent * usize::from(exp_digits.is_none()))
        } else {
            int_digits
        };
        if length > MAX_NUMBER_LENGTH {
            return None;
        }
        let text = std::str::from_utf8(&self.bytes[start..self.pos]).ok()?;
        if is_float {
            return text.parse::<f64>().ok().map(Node::Double);
        }
        Some(match text.parse::<i64>() {
            Ok(v) => match i32::try_from(v) {
                Ok(i) => Node::Int(i),
                Err(_) => Node::Long(v),
            },
            Err(_) => Node::BigInt,
        })
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.bytes.get(self.pos..self.pos + 4)?;
        let text = std::str::from_utf8(digits).ok()?;
        if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        self.pos += 4;
        u32::from_str_radix(text, 16).ok()
    }

    /// The 4 hex digits of a `\uXXXX` escape starting at `at`, without moving.
    fn escaped_unit_at(&self, at: usize) -> Option<u32> {
        if self.bytes.get(at..at + 2) != Some(b"\\u") {
            return None;
        }
        let digits = std::str::from_utf8(self.bytes.get(at + 2..at + 6)?).ok()?;
        if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(digits, 16).ok()
    }

    /// A string of at most `limit` UTF-16 code units; `None` past it.
    fn string(&mut self, limit: usize) -> Option<Text> {
        // At the opening quote.
        self.pos += 1;
        let mut out = Text::Utf8(String::new());
        loop {
            let run_start = self.pos;
            while let Some(&b) = self.bytes.get(self.pos) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            out.push_str(std::str::from_utf8(&self.bytes[run_start..self.pos]).ok()?);
            match self.peek()? {
                b'"' => {
                    self.pos += 1;
                    return (!out.longer_than(limit)).then_some(out);
                }
                b'\\' => {
                    self.pos += 1;
                    let escaped = self.peek()?;
                    self.pos += 1;
                    match escaped {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let first = self.hex4()?;
                            // Jackson builds a Java string unit by unit: a surrogate escape
                            // need not be paired.
                            if (0xD800..0xDC00).contains(&first) {
                                match self.escaped_unit_at(self.pos) {
                                    Some(second) if (0xDC00..0xE000).contains(&second) => {
                                        self.pos += 6;
                                        let code =
                                            0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00);
                                        out.push(char::from_u32(code)?);
                                    }
                                    _ => out.push_unpaired(u16::try_from(first).ok()?),
                                }
                            } else if (0xDC00..0xE000).contains(&first) {
                                out.push_unpaired(u16::try_from(first).ok()?);
                            } else {
                                out.push(char::from_u32(first)?);
                            }
                        }
                        _ => return None,
                    }
                }
                // A raw control character.
                _ => return None,
            }
        }
    }
}

/// The JSON types Jackson compares for array homogeneity.
fn node_type(node: &Node) -> u8 {
    match node {
        Node::Null => 0,
        Node::Bool(_) => 1,
        Node::Int(_) | Node::Long(_) | Node::BigInt | Node::Double(_) => 2,
        Node::Str(_) | Node::JavaStr(_) => 3,
        Node::Array(_) => 4,
        Node::Object(_) => 5,
    }
}

fn optional(ty: SchemaType) -> Schema {
    Schema::new(ty, true)
}

struct Inference {
    null_behavior: JsonNullBehavior,
    empty_array: JsonEmptyArrayBehavior,
}

impl Inference {
    /// `Ok(None)`: no schema (the member is left out); `Err`: inference fails.
    fn schema(&self, key: Option<&str>, node: &Node) -> Result<Option<Schema>, ()> {
        Ok(match node {
            Node::Str(_) | Node::JavaStr(_) => Some(optional(SchemaType::String)),
            Node::Bool(_) => Some(optional(SchemaType::Boolean)),
            Node::Int(_) => Some(optional(SchemaType::Int32)),
            Node::Long(_) => Some(optional(SchemaType::Int64)),
            Node::BigInt | Node::Double(_) => Some(optional(SchemaType::Float64)),
            Node::Null => match self.null_behavior {
                JsonNullBehavior::OptionalBytes => Some(optional(SchemaType::Bytes)),
                JsonNullBehavior::Ignore => None,
            },
            Node::Array(items) if items.is_empty() => match self.empty_array {
                JsonEmptyArrayBehavior::OptionalString => Some(optional(SchemaType::Array(
                    Box::new(optional(SchemaType::String)),
                ))),
                JsonEmptyArrayBehavior::Ignore => None,
            },
            Node::Array(items) => {
                let element = self.element_schema(key, items)?;
                Some(optional(SchemaType::Array(Box::new(element))))
            }
            Node::Object(members) => {
                let mut fields: Vec<(String, Schema)> = Vec::new();
                for (name, value) in members {
                    let field_key = match key {
                        Some(k) if !k.trim().is_empty() => format!("{k}.{name}"),
                        _ => name.clone(),
                    };
                    if let Some(schema) = self.schema(Some(&field_key), value)? {
                        // Connect's `SchemaBuilder.field` refuses an empty name, which fails
                        // the whole inference (a member without a schema is never added).
                        if name.is_empty() {
                            return Err(());
                        }
                        if !fields.iter().any(|(n, _)| n == name) {
                            fields.push((name.clone(), schema));
                        }
                    }
                }
                let mut schema = optional(SchemaType::Struct(fields));
                schema.name = key.map(str::to_owned);
                Some(schema)
            }
        })
    }

    fn element_schema(&self, key: Option<&str>, items: &[Node]) -> Result<Schema, ()> {
        // The first non-null element; all non-null elements must have its JSON type, and
        // numbers its schema.
        let mut sample = &Node::Null;
        let mut sample_schema: Option<Schema> = None;
        for item in items {
            if matches!(item, Node::Null) {
                continue;
            }
            if matches!(sample, Node::Null) {
                sample = item;
            }
            if node_type(item) != node_type(sample) {
                return Err(());
            }
            if node_type(sample) == 2 {
                if sample_schema.is_none() {
                    sample_schema = self.schema(None, sample)?;
                }
                if self.schema(None, item)? != sample_schema {
                    return Err(());
                }
            }
        }
        if let Node::Object(_) = sample {
            let mut distinct: Vec<Schema> = Vec::new();
            for item in items {
                if let Node::Object(_) = item {
                    if let Some(schema) = self.schema(key, item)? {
                        if !distinct.contains(&schema) {
                            distinct.push(schema);
                        }
                    }
                }
            }
            let mut merged: Option<Schema> = None;
            for schema in distinct {
                merged = Some(match merged {
                    None => schema,
                    Some(left) => merge(left, schema),
                });
            }
            merged.ok_or(())
        } else {
            self.schema(None, sample)?.ok_or(())
        }
    }
}

/// Merges two struct schemas: fields of the left in order, then new fields of the right; a
/// left bytes field (from a `null`) gives way to a typed right one. The result is not
/// optional, so a `null` element of an array whose objects differ does not fit it.
fn merge(left: Schema, right: Schema) -> Schema {
    let SchemaType::Struct(mut fields) = left.ty else {
        return left;
    };
    if let SchemaType::Struct(right_fields) = right.ty {
        for (name, schema) in right_fields {
            match fields.iter_mut().find(|(n, _)| *n == name) {
                None => fields.push((name, schema)),
                Some(slot) => {
                    if slot.1 != schema
                        && slot.1.ty == SchemaType::Bytes
                        && schema.ty != SchemaType::Bytes
                    {
                        slot.1 = schema;
                    }
                }
            }
        }
    }
    // Debezium rebuilds the merged schema with `SchemaUtil.copySchemaBasics`, which copies
    // the name and version but not `optional`: a merged element schema is required.
    Schema {
        ty: SchemaType::Struct(fields),
        optional: false,
        name: left.name,
        version: left.version,
    }
}

/// The node as a value of `schema`, checked as Connect's `Struct.put` checks it.
fn to_value(node: &Node, schema: &Schema) -> Result<Value, ExpansionError> {
    let mismatch = |found: &'static str| {
        Err(ExpansionError::Mismatch {
            found,
            inferred: schema.ty.clone(),
        })
    };
    match (node, &schema.ty) {
        // Connect's `Struct.put` refuses null for a required schema.
        (Node::Null, _) if !schema.optional => Err(ExpansionError::NullInRequired),
        (Node::Null, _) => Ok(Value::Null),
        (Node::Str(s), SchemaType::String) => Ok(Value::Str(s.clone())),
        (Node::JavaStr(units), SchemaType::String) => Ok(Value::JavaStr(units.clone())),
        (Node::Bool(b), SchemaType::Boolean) => Ok(Value::Bool(*b)),
        (Node::Int(i), SchemaType::Int32) => Ok(Value::Int(i64::from(*i))),
        (Node::Long(l), SchemaType::Int64) => Ok(Value::Int(*l)),
        (Node::Double(d), SchemaType::Float64) => Ok(Value::Float64(*d)),
        (Node::BigInt, _) => Err(ExpansionError::BigInteger),
        (Node::Array(items), SchemaType::Array(element)) => items
            .iter()
            .map(|item| to_value(item, element))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        (Node::Object(members), SchemaType::Struct(fields)) => fields
            .iter()
            .map(
                |(name, field_schema)| match members.iter().find(|(k, _)| k == name) {
                    Some((_, member)) => to_value(member, field_schema),
                    None => Ok(Value::Null),
                },
            )
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Struct),
        (Node::Str(_) | Node::JavaStr(_), _) => mismatch("string"),
        (Node::Bool(_), _) => mismatch("boolean"),
        (Node::Int(_) | Node::Long(_) | Node::Double(_), _) => mismatch("number"),
        (Node::Array(_), _) => mismatch("array"),
        (Node::Object(_), _) => mismatch("object"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::connect::{write_json, write_schema};

    fn run(
        text: &str,
        nulls: JsonNullBehavior,
        arrays: JsonEmptyArrayBehavior,
    ) -> (String, String) {
        match expand("payload", text, nulls, arrays) {
            Expansion::Expanded { schema, value } => {
                let mut s = Vec::new();
                write_schema(&mut s, &schema);
                let mut v = Vec::new();
                write_json(&mut v, &value, Some(&schema));
                (
                    String::from_utf8(s).unwrap_or_default(),
                    String::from_utf8(v).unwrap_or_default(),
                )
            }
            other => panic!("{text}: {other:?}"),
        }
    }

    fn dflt(text: &str) -> (String, String) {
        run(
            text,
            JsonNullBehavior::Ignore,
            JsonEmptyArrayBehavior::Ignore,
        )
    }

    #[test]
    fn object_with_every_scalar_type() {
        let (schema, value) = dflt(
            r#"{"s": "a\"b\u00e9\n", "i": 1, "l": 3000000000, "d": 39.98, "e": 1E2, "b": true, "n": null, "z": -0}"#,
        );
        assert_eq!(
            schema,
            r#"{"type":"struct","fields":[{"type":"string","optional":true,"field":"s"},{"type":"int32","optional":true,"field":"i"},{"type":"int64","optional":true,"field":"l"},{"type":"double","optional":true,"field":"d"},{"type":"double","optional":true,"field":"e"},{"type":"boolean","optional":true,"field":"b"},{"type":"int32","optional":true,"field":"z"}],"optional":true,"name":"payload"}"#
        );
        assert_eq!(
            value,
            "{\"s\":\"a\\\"b\u{e9}\\n\",\"i\":1,\"l\":3000000000,\"d\":39.98,\"e\":100.0,\"b\":true,\"z\":0}"
        );
    }

    #[test]
    fn null_and_empty_array_behaviors() {
        let (schema, value) = run(
            r#"{"n": null, "a": []}"#,
            JsonNullBehavior::OptionalBytes,
            JsonEmptyArrayBehavior::OptionalString,
        );
        assert_eq!(
            schema,
            r#"{"type":"struct","fields":[{"type":"bytes","optional":true,"field":"n"},{"type":"array","items":{"type":"string","optional":true},"optional":true,"field":"a"}],"optional":true,"name":"payload"}"#
        );
        assert_eq!(value, r#"{"n":null,"a":[]}"#);
        let (schema, value) = dflt(r#"{"n": null, "a": []}"#);
        assert_eq!(
            schema,
            r#"{"type":"struct","fields":[],"optional":true,"name":"payload"}"#
        );
        assert_eq!(value, "{}");
    }

    #[test]
    fn nested_objects_and_merged_array_elements() {
        // Expected bytes from Debezium 3.6.3's JsonSchemaData and JsonConverter.
        let (schema, value) = dflt(r#"{"o": {"x": 1}, "items": [{"id": 1}, {"id": 2, "q": "a"}]}"#);
        assert_eq!(
            schema,
            r#"{"type":"struct","fields":[{"type":"struct","fields":[{"type":"int32","optional":true,"field":"x"}],"optional":true,"name":"payload.o","field":"o"},{"type":"array","items":{"type":"struct","fields":[{"type":"int32","optional":true,"field":"id"},{"type":"string","optional":true,"field":"q"}],"optional":false,"name":"payload.items"},"optional":true,"field":"items"}],"optional":true,"name":"payload"}"#
        );
        assert_eq!(
            value,
            r#"{"o":{"x":1},"items":[{"id":1,"q":null},{"id":2,"q":"a"}]}"#
        );
        // Equal element schemas are not merged: the element schema stays optional.
        let (_, value) = dflt(r#"{"items": [{"id": 1}, {"id": 1}, null]}"#);
        assert_eq!(value, r#"{"items":[{"id":1},{"id":1},null]}"#);
    }

    // Expected bytes from Debezium 3.6.3 (differential test): the merged element struct is
    // required, and a null element no longer fits it.
    #[test]
    fn merged_array_elements_are_required() {
        let (schema, value) = dflt(r#"{"f0": [{"f1": null}, {"f1": 1.0E-4}]}"#);
        assert_eq!(
            schema,
            r#"{"type":"struct","fields":[{"type":"array","items":{"type":"struct","fields":[{"type":"double","optional":true,"field":"f1"}],"optional":false,"name":"payload.f0"},"optional":true,"field":"f0"}],"optional":true,"name":"payload"}"#
        );
        assert_eq!(value, r#"{"f0":[{"f1":null},{"f1":1.0E-4}]}"#);
        assert!(matches!(
            expand(
                "payload",
                r#"{"f0": [{"a": 1}, {"b": 2}, null]}"#,
                JsonNullBehavior::Ignore,
                JsonEmptyArrayBehavior::Ignore
            ),
            Expansion::Broken { .. }
        ));
    }

    #[test]
    fn empty_member_name_without_a_schema_is_left_out() {
        let (schema, value) = dflt(r#"{"": null, "a": {"": []}}"#);
        assert_eq!(
            schema,
            r#"{"type":"struct","fields":[{"type":"struct","fields":[],"optional":true,"name":"payload.a","field":"a"}],"optional":true,"name":"payload"}"#
        );
        assert_eq!(value, r#"{"a":{}}"#);
    }

    #[test]
    fn duplicate_keys_keep_first_position_and_last_value() {
        let (_, value) = dflt(r#"{"a": 1, "b": 2, "a": 3}"#);
        assert_eq!(value, r#"{"a":3,"b":2}"#);
    }

    #[test]
    fn unchanged_and_broken() {
        let n = JsonNullBehavior::Ignore;
        let a = JsonEmptyArrayBehavior::Ignore;
        for text in [
            "",
            " {}",
            "\"s\"",
            "1",
            "{",
            "{\"a\":01}",
            "{\"a\":[1,\"x\"]}",
            "{\"a\":[1,3000000000]}",
            "{\"a\":[null]}",
            "{\"a\":\"\u{1}\"}",
            // Expected from Debezium 3.6.3 (differential test): an empty member name with a
            // schema leaves the payload as it is.
            "{\"\": 1}",
            "{\"a\": {\"\": \"x\"}}",
            "{\"a\": [{\"\": true}]}",
        ] {
            assert_eq!(
                expand("payload", text, n, a),
                Expansion::Unchanged,
                "{text:?}"
            );
        }
        assert!(matches!(
            expand("payload", "[1,2]", n, a),
            Expansion::Broken {
                schema: Some(_),
                ..
            }
        ));
        assert!(matches!(
            expand("payload", "[]", n, a),
            Expansion::Broken { schema: None, .. }
        ));
        assert!(matches!(
            expand("payload", "{\"a\":123456789012345678901234567890}", n, a),
            Expansion::Broken {
                schema: Some(_),
                ..
            }
        ));
        assert!(matches!(
            expand("payload", "{\"a\":[{\"x\":1},{\"x\":\"s\"}]}", n, a),
            Expansion::Broken {
                schema: Some(_),
                ..
            }
        ));
    }

    // Expected bytes from Debezium 3.6.3 (differential test): Jackson reads unpaired
    // surrogate escapes into the Java string; JsonConverter escapes them again.
    #[test]
    fn unpaired_surrogates_are_kept() {
        let (schema, value) = dflt(
            r#"{"a": "x\uDC00y", "b": "\udfff\ud800", "c": "\ud83d\ude00", "d": "\udbff\u0041"}"#,
        );
        assert_eq!(
            schema,
            r#"{"type":"struct","fields":[{"type":"string","optional":true,"field":"a"},{"type":"string","optional":true,"field":"b"},{"type":"string","optional":true,"field":"c"},{"type":"string","optional":true,"field":"d"}],"optional":true,"name":"payload"}"#
        );
        assert_eq!(
            value,
            r#"{"a":"x\uDC00y","b":"\uDFFF\uD800","c":"\uD83D\uDE00","d":"\uDBFFA"}"#
        );
        assert!(matches!(
            expand(
                "payload",
                r#"{"\ud800": 1}"#,
                JsonNullBehavior::Ignore,
                JsonEmptyArrayBehavior::Ignore
            ),
            Expansion::Unsupported { .. }
        ));
    }

    // Jackson 2.21's StreamReadConstraints (Debezium 3.6.3): 1000 nested containers parse,
    // 1001 do not, whatever the innermost value.
    #[test]
    fn nesting_limit_counts_containers() {
        // Deep recursion: on a thread with a stack as large as the router gives deep payloads.
        let checks = || {
            let nested = |levels: usize, inner: &str| {
                format!("{}{inner}{}", "{\"n\": ".repeat(levels), "}".repeat(levels))
            };
            let n = JsonNullBehavior::Ignore;
            let a = JsonEmptyArrayBehavior::Ignore;
            let expanded =
                |text: &str| matches!(expand("payload", text, n, a), Expansion::Expanded { .. });
            assert!(expanded(&nested(1000, "1")));
            assert!(!expanded(&nested(1001, "1")));
            assert!(expanded(&nested(999, "{}")));
            assert!(!expanded(&nested(1000, "{}")));
            assert!(!expanded(&nested(1000, "[]")));
        };
        let worker = std::thread::Builder::new()
            .stack_size(64 * 1024 * 1024)
            .spawn(checks)
            .map(std::thread::JoinHandle::join);
        assert!(matches!(worker, Ok(Ok(()))));
    }

    // Jackson 2.21's StreamReadConstraints (Debezium 3.6.3), checked against Debezium by the
    // differential test's limit rows.
    #[test]
    fn number_length_limit_counts_digits_as_jackson_does() {
        let n = JsonNullBehavior::Ignore;
        let a = JsonEmptyArrayBehavior::Ignore;
        let parses = |number: String| {
            !matches!(
                expand("payload", &format!("{{\"n\": {number}}}"), n, a),
                Expansion::Unchanged
            )
        };
        let d = |k: usize| "1".repeat(k);
        let max = MAX_NUMBER_LENGTH;
        for (at, past) in [
            (d(max), d(max + 1)),
            (format!("-{}", d(max)), format!("-{}", d(max + 1))),
            (format!("1.{}", d(max - 1)), format!("1.{}", d(max))),
            (
                format!("{}E-990", d(max - 3)),
                format!("{}E-990", d(max - 2)),
            ),
            (format!("{}e+5", d(max - 1)), format!("{}e+5", d(max))),
            // A leading zero: an absent exponent or fraction counts -1.
            (format!("0.{}", d(max)), format!("0.{}", d(max + 1))),
            (format!("-0.{}", d(max)), format!("-0.{}", d(max + 1))),
            (
                format!("0.{}e-5", d(max - 2)),
                format!("0.{}e-5", d(max - 1)),
            ),
            (format!("0e{}", d(max)), format!("0e{}", d(max + 1))),
        ] {
            assert!(parses(at.clone()), "{}…", &at[..12]);
            assert!(!parses(past.clone()), "{}…", &past[..12]);
        }
    }

    #[test]
    fn name_and_string_limits_count_java_characters() {
        let n = JsonNullBehavior::Ignore;
        let a = JsonEmptyArrayBehavior::Ignore;
        let expanded =
            |text: &str| matches!(expand("payload", text, n, a), Expansion::Expanded { .. });
        let name = |s: &str| format!("{{\"{s}\": 1}}");
        assert!(expanded(&name(&"n".repeat(MAX_NAME_LENGTH))));
        assert!(!expanded(&name(&"n".repeat(MAX_NAME_LENGTH + 1))));
        // 50,000 UTF-16 code units in 100,000 bytes; then one more.
        assert!(expanded(&name(&"😀".repeat(MAX_NAME_LENGTH / 2))));
        assert!(!expanded(&name(&format!(
            "n{}",
            "😀".repeat(MAX_NAME_LENGTH / 2)
        ))));
        // Escapes count decoded, and so do unpaired surrogates.
        assert!(expanded(&name(&format!(
            "\\n{}",
            "n".repeat(MAX_NAME_LENGTH - 1)
        ))));
        let string = |s: &str| format!("{{\"s\": \"{s}\"}}");
        assert!(!expanded(&string(&format!(
            "\\ud800{}",
            "x".repeat(MAX_STRING_LENGTH)
        ))));
        assert!(matches!(
            expand(
                "payload",
                &string(&format!("\\ud800{}", "x".repeat(MAX_STRING_LENGTH - 1))),
                n,
                a
            ),
            Expansion::Expanded { .. }
        ));
        assert!(expanded(&string(&"x".repeat(MAX_STRING_LENGTH))));
        assert!(!expanded(&string(&"x".repeat(MAX_STRING_LENGTH + 1))));
        assert!(expanded(&string(&format!(
            "{}😀",
            "x".repeat(MAX_STRING_LENGTH - 2)
        ))));
        assert!(!expanded(&string(&format!(
            "{}😀",
            "x".repeat(MAX_STRING_LENGTH - 1)
        ))));
    }

    #[test]
    fn trailing_text_is_not_read_and_depth_is_bounded() {
        let (_, value) = dflt(r#"{"a": 1} trailing"#);
        assert_eq!(value, r#"{"a":1}"#);
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 5), "]".repeat(MAX_DEPTH + 5));
        assert_eq!(
            expand(
                "payload",
                &format!("{{\"a\":{deep}}}"),
                JsonNullBehavior::Ignore,
                JsonEmptyArrayBehavior::Ignore
            ),
            Expansion::Unchanged
        );
    }
}
