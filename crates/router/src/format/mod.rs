//! The bytes of a record, as Kafka Connect's converters and the JVM under them write them:
//! the converters' encodings ([`encoding`]), Avro as the schema-registry converters write it
//! ([`avro`]), column values ([`encode`]), Connect schemas and
//! values ([`connect`]), expanded JSON payloads ([`expand`]), JSON strings as Jackson escapes
//! them ([`json`]), Java's floating-point numbers ([`javanum`], [`javanum_legacy`]),
//! PostgreSQL's timestamp text ([`timestamp`]) and the UTF-8 check of column text ([`text`]).
//!
//! # Invariants
//! - The lowest layer of the router: nothing here uses `crate::routing` or
//!   `crate::extension` (`tests/layers.rs` checks it). Routing policy reaches these modules
//!   only as arguments (an [`encoding::Encoding`], a [`expand::JsonNullBehavior`], …).

pub(crate) mod avro;
pub(crate) mod connect;
pub(crate) mod encode;
pub(crate) mod encoding;
pub(crate) mod expand;
pub(crate) mod javanum;
pub(crate) mod javanum_legacy;
pub(crate) mod json;
pub(crate) mod registered;
pub(crate) mod text;
pub(crate) mod timestamp;
