//! The Kafka Connect converters a record's key and value are written with ([`Encoding`]), and
//! the Java whose number printing they follow ([`JavaNumbers`]).
//!
//! # Invariants
//! - The defaults are what a Debezium 3.x image writes: `JsonConverter` without schemas, on
//!   Java 21.

/// How a record key or value is serialized, as the Kafka Connect converter would.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// `org.apache.kafka.connect.json.JsonConverter` with `schemas.enable=false`.
    ///
    /// Text columns (including json and jsonb) become JSON string literals, so a jsonb
    /// payload is written as a string holding the document; numbers and booleans are written
    /// as JSON numbers and booleans; NULL is the four bytes `null`.
    #[default]
    Json,
    /// `org.apache.kafka.connect.storage.StringConverter`: the value's text as UTF-8
    /// (booleans as `true` / `false`); NULL is no bytes at all (a tombstone value or a null
    /// key).
    String,
    /// `org.apache.kafka.connect.json.JsonConverter` with `schemas.enable=true`:
    /// `{"schema":…,"payload":…}`, the schema being the one Debezium gives the column
    /// (`io.debezium.data.Json` version 1 for json and jsonb, …); NULL is the envelope with
    /// `"payload":null`.
    JsonSchemas,
    /// `io.debezium.converters.BinaryDataConverter`: a bytea column's bytes as they are; NULL
    /// is no bytes at all. Only bytea columns can be written.
    Binary,
    /// A schema-registry Avro converter (Confluent's `AvroConverter`, Apicurio's): the value
    /// as Avro binary, framed with the id its schema is registered under (magic byte `0`, the
    /// id as 4 bytes big-endian, the datum); NULL is a null value. Values only.
    Avro,
    /// Written with the schema of this kind registered for the value subject by someone else:
    /// the payload column's JSON, checked against it and written with it (see
    /// [`crate::RegisteredSchema`]); NULL is a null value. Values only.
    Registered(siphon_record::RegistrySchemaKind),
}

/// The key and value encodings (Kafka Connect's `key.converter` and `value.converter`), and
/// how the worker's JVM prints floating-point numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Format {
    /// How the record key is written.
    pub key: Encoding,
    /// How the record value is written.
    pub value: Encoding,
    /// The Java generation whose `Double.toString` / `Float.toString` the numbers follow.
    pub numbers: JavaNumbers,
}

/// Which Java's `Double.toString` / `Float.toString` floating-point numbers follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JavaNumbers {
    /// Java 19 and later (shortest decimal): Debezium's official 3.x images run Java 21.
    #[default]
    Java19,
    /// Java 18 and earlier (`FloatingDecimal`), which prints some numbers with more digits.
    Java17,
}
