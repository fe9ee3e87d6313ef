//! pgoutput messages Siphon cannot use ([`crate::unhandled`]), kept as the message's kind, tag
//! and position; the message naming what to change is rendered in `Display`.
//!
//! # Invariants
//! - Every variant is a [`siphon_core::Consequence::Fix`]: the same message comes again after
//!   every reconnect.

use std::fmt;

use pgoutput::{DecodeError, Lsn};

/// A pgoutput message, sent at `lsn`, that Siphon cannot use.
#[derive(Debug)]
pub enum UnusableMessage {
    /// A two-phase message (protocol 3) from slot `slot` (`None`: not known).
    TwoPhase {
        name: &'static str,
        lsn: Lsn,
        slot: Option<String>,
    },
    /// A message of a streamed in-progress transaction (protocol 2).
    Streaming { name: &'static str, lsn: Lsn },
    /// A kind this build does not know.
    UnknownKind { lsn: Lsn, decode: DecodeError },
    /// A name in the message is not UTF-8.
    NotUtf8 { lsn: Lsn, decode: DecodeError },
    /// The message does not decode.
    Undecodable { lsn: Lsn, decode: DecodeError },
    /// It decoded, but Siphon does not handle its kind (`tag`).
    Unhandled { lsn: Lsn, tag: u8 },
    /// A message larger than the replication connection accepts (its
    /// [`crate::wire::ProtocolViolation::TooLarge`]).
    TooLarge(crate::wire::WireError),
}

impl std::error::Error for UnusableMessage {}

impl fmt::Display for UnusableMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnusableMessage::TwoPhase { name, lsn, slot } => {
                write!(f, "the server sent a pgoutput {name} message at {lsn}: ")?;
                super::fixes::two_phase_slot(slot.as_deref().unwrap_or("<source.slot>"), None, f)
            }
            UnusableMessage::Streaming { name, lsn } => write!(
                f,
                "the server sent a pgoutput {name} message at {lsn}: it streams transactions still in progress, which Siphon never asks for (its START_REPLICATION has proto_version '1' and no streaming option), so something between Siphon and PostgreSQL changed the command: point source.url at PostgreSQL itself, not at a proxy or pooler that rewrites replication commands"
            ),
            UnusableMessage::UnknownKind { lsn, decode } => write!(
                f,
                "the server sent a pgoutput message at {lsn} of a kind this version of Siphon does not know ({decode}): the server is newer than Siphon supports: upgrade Siphon"
            ),
            UnusableMessage::NotUtf8 { lsn, decode } => write!(
                f,
                "undecodable pgoutput message at {lsn}: {decode}: the names Siphon reads from the stream (schemas, tables, columns, types, message prefixes) must be UTF-8; if the database's encoding is not UTF-8, rename the object with non-ASCII characters in its name"
            ),
            UnusableMessage::Undecodable { lsn, decode } => write!(
                f,
                "undecodable pgoutput message at {lsn}: {decode}; reconnecting would read the same message again, so Siphon stops: report it as a bug with the server's version (SELECT version()) and this position"
            ),
            UnusableMessage::TooLarge(err) => err.fmt(f),
            UnusableMessage::Unhandled { lsn, tag } => write!(
                f,
                "the server sent a pgoutput message at {lsn} that Siphon does not handle (tag {:?}): report it as a bug with the server's version (SELECT version()) and this position",
                char::from(*tag)
            ),
        }
    }
}
