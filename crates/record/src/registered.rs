//! A record key or value written against a schema that must be registered before the record is
//! sent: the schema-registry formats (`format.value = "avro"`, `format.key = "avro"`).
//!
//! The router writes such a key or value framed as the registry's serializers frame it (magic byte
//! `0`, the schema id as 4 bytes big-endian, the datum) with a placeholder id, and hands the
//! schema beside it as a [`RegistrySchema`]. The session looks the id up (registering the
//! schema under the key or value subject of the record's topic) and writes it into the frame with
//! [`with_schema_id`] before the record is sent.
//!
//! # Invariants
//! - Two [`RegistrySchema`]s are equal when their kinds and texts are; the hash is the text's
//!   fingerprint, computed once, so a lookup by schema never hashes the text again.
//! - [`with_schema_id`] changes the four id bytes and nothing else.

use bytes::{Bytes, BytesMut};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// The first byte of a registry frame.
pub const MAGIC_BYTE: u8 = 0;
/// The bytes before the datum: the magic byte and the schema id.
pub const FRAME_HEADER_LEN: usize = 5;

/// Which registry schema type a schema is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegistrySchemaKind {
    /// `AVRO`.
    Avro,
    /// `JSON` (JSON Schema).
    Json,
}

/// A schema to register, as text.
#[derive(Debug, Clone)]
pub struct RegistrySchema {
    kind: RegistrySchemaKind,
    text: Arc<str>,
    fingerprint: u64,
}

impl RegistrySchema {
    /// The schema `text` of `kind`.
    pub fn new(kind: RegistrySchemaKind, text: Arc<str>) -> Self {
        // FNV-1a: stable, and cheap for the few kilobytes a schema holds.
        let mut fingerprint: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in text.as_bytes() {
            fingerprint ^= u64::from(*byte);
            fingerprint = fingerprint.wrapping_mul(0x0100_0000_01b3);
        }
        RegistrySchema {
            kind,
            text,
            fingerprint,
        }
    }

    /// The schema type.
    pub fn kind(&self) -> RegistrySchemaKind {
        self.kind
    }

    /// The schema's text, as registered.
    pub fn text(&self) -> &str {
        &self.text
    }
}

impl PartialEq for RegistrySchema {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.fingerprint == other.fingerprint
            && (Arc::ptr_eq(&self.text, &other.text) || self.text == other.text)
    }
}

impl Eq for RegistrySchema {}

impl Hash for RegistrySchema {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.kind.hash(state);
        state.write_u64(self.fingerprint);
    }
}

/// How value subjects are named (the serializers' `value.subject.name.strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SubjectStrategy {
    /// `TopicNameStrategy`: `<topic>-value`, one subject per topic.
    #[default]
    Topic,
    /// `TopicRecordNameStrategy`: `<topic>-<record name>`, one subject per event type of a topic.
    TopicRecord,
    /// `RecordNameStrategy`: `<record name>`, one subject per event type across topics.
    Record,
}

impl SubjectStrategy {
    /// Whether subjects are named by the record name (the event type).
    pub fn needs_record_name(self) -> bool {
        self != SubjectStrategy::Topic
    }

    /// The value subject of a record of `topic` whose record name is `record_name` (used
    /// only by the record name strategies, which the caller gives one).
    pub fn value_subject(self, topic: &str, record_name: Option<&str>) -> String {
        match (self, record_name) {
            (SubjectStrategy::TopicRecord, Some(name)) => format!("{topic}-{name}"),
            (SubjectStrategy::Record, Some(name)) => name.to_owned(),
            _ => value_subject(topic),
        }
    }
}

/// The subject a topic's value schemas are registered under: the registry serializers'
/// default `TopicNameStrategy`, `<topic>-value`.
pub fn value_subject(topic: &str) -> String {
    format!("{topic}-value")
}

/// The subject of a topic's key schemas under `TopicNameStrategy`: `<topic>-key`.
pub fn key_subject(topic: &str) -> String {
    format!("{topic}-key")
}

/// `body` framed as the registry serializers frame a value: [`MAGIC_BYTE`], `schema_id` as 4
/// bytes big-endian, then the body.
pub fn framed(schema_id: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_HEADER_LEN + body.len());
    out.push(MAGIC_BYTE);
    out.extend_from_slice(&schema_id.to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// A framed value with a placeholder id: [`MAGIC_BYTE`], four zero bytes, then `datum`.
pub fn unframed_value(datum: &[u8]) -> Bytes {
    Bytes::from(framed(0, datum))
}

/// What Siphon asked the registry for a record key or value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaAsk {
    /// The id of its schema, registering it.
    Register,
    /// The latest schema registered for its subject.
    Latest,
}

/// Why a row is not sent: the registry refused what was asked for its key or value under
/// `subject`.
/// The stream and the transfers dead-letter or stop with this text.
pub fn refusal_reason(ask: SchemaAsk, subject: &str, error: &dyn std::fmt::Display) -> String {
    match ask {
        SchemaAsk::Register => {
            format!("the schema registry refused the schema under subject {subject:?}: {error}")
        }
        SchemaAsk::Latest => {
            format!("the schema registry has no schema for subject {subject:?}: {error}")
        }
    }
}

/// Why a row is not sent: its payload does not fit the schema registered under `subject`.
pub fn misfit_reason(subject: &str, misfit: &dyn std::fmt::Display) -> String {
    format!("subject {subject:?}: {misfit}")
}

/// `value`, a frame [`unframed_value`] made, with `schema_id` in it. A value too short to be a
/// frame is left as it is (the router never makes one).
pub fn with_schema_id(value: Bytes, schema_id: u32) -> Bytes {
    if value.len() < FRAME_HEADER_LEN {
        return value;
    }
    let mut framed = match value.try_into_mut() {
        Ok(unique) => unique,
        Err(shared) => BytesMut::from(&shared[..]),
    };
    framed[1..FRAME_HEADER_LEN].copy_from_slice(&schema_id.to_be_bytes());
    framed.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn the_id_is_written_big_endian_after_the_magic_byte_and_nothing_else_changes() {
        let value = unframed_value(b"datum");
        assert_eq!(&value[..], b"\0\0\0\0\0datum");
        let framed = with_schema_id(value, 0x0102_0304);
        assert_eq!(&framed[..], b"\0\x01\x02\x03\x04datum");
        let shared = framed.clone();
        let again = with_schema_id(shared, 7);
        assert_eq!(&again[..], b"\0\0\0\0\x07datum");
        assert_eq!(
            &framed[..],
            b"\0\x01\x02\x03\x04datum",
            "a shared value is copied"
        );
    }

    #[test]
    fn equal_texts_are_one_key_and_different_ones_two() {
        let a = RegistrySchema::new(RegistrySchemaKind::Avro, Arc::from("\"string\""));
        let b = RegistrySchema::new(RegistrySchemaKind::Avro, Arc::from("\"string\""));
        let c = RegistrySchema::new(RegistrySchemaKind::Avro, Arc::from("\"long\""));
        let mut ids = HashMap::new();
        ids.insert(a, 1);
        assert_eq!(ids.get(&b), Some(&1));
        assert_eq!(ids.get(&c), None);
    }
}
