//! Sans-IO decoder of PostgreSQL's `pgoutput` logical replication protocol.
//!
//! The crate turns the payload of one `XLogData` message into a typed [`Message`]. It does no
//! IO and has no async runtime: callers feed it [`bytes::Bytes`] and get values that borrow
//! (by reference count) from that buffer, so tuple data and names are never copied.
//!
//! # Invariants
//! - [`parse`] never panics, whatever the input; malformed input is a [`DecodeError`].
//! - A message must be consumed exactly: trailing bytes are an error.
//! - Text fields are validated UTF-8 when decoded; column values are handed over raw.

mod error;
mod lsn;
mod message;
mod parse;
mod text;

pub use error::DecodeError;
pub use lsn::{Lsn, ParseLsnError};
pub use message::*;
pub use parse::{parse, Decoder, DecoderOptions, StreamState};
pub use text::Text;
