//! Sans-IO decoder of PostgreSQL's `pgoutput` logical replication protocol.
//!
//! The crate turns the payload of one `XLogData` message into a typed [`Message`]. It does no
//! IO and has no async runtime: callers feed it [`bytes::Bytes`] and get values that borrow
//! (by reference count) from that buffer, so tuple data and names are never copied.
//! [`pg_timestamp`] reads the commit times Begin and Commit carry as wall-clock times;
//! [`unpublished`] says why a column of a table is not in the stream, and the fix.
//!
//! # Invariants
//! - [`parse`] and [`Decoder::decode`] never panic, whatever the input; malformed input is a
//!   [`DecodeError`].
//! - No allocation is sized from a length field alone: vectors are bounded by what the rest of
//!   the buffer can hold.
//! - A message must be consumed exactly: trailing bytes are an error.
//! - Text fields are validated UTF-8 when decoded; column values are handed over raw.
//! - [`Decoder::decode_skimming`] accepts and refuses exactly what [`Decoder::decode`] does, with
//!   the same errors: a caller that has no use for a Delete's old row (Siphon skips the DELETEs
//!   of an outbox table) has it checked without it being built.

#![warn(missing_docs)]

mod body;
mod error;
mod kind;
mod lsn;
mod message;
mod parse;
mod reader;
mod text;
mod timestamp;
mod tuple;
pub mod unpublished;

pub use error::DecodeError;
pub use lsn::{Lsn, ParseLsnError};
pub use message::*;
pub use parse::{parse, Decoder, DecoderOptions, StreamState};
pub use text::Text;
pub use timestamp::pg_timestamp;
