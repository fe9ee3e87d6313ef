//! Decoding errors.

/// Why a buffer is not a valid pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The buffer ended before the message did.
    #[error("pgoutput message truncated: needed {needed} more byte(s) at offset {offset} while reading {field}")]
    Truncated {
        field: &'static str,
        offset: usize,
        needed: usize,
    },
    /// The first byte names no known message.
    #[error("unknown pgoutput message tag {tag:#04x} ({:?})", *tag as char)]
    UnknownTag { tag: u8 },
    /// The buffer was empty.
    #[error("empty pgoutput message")]
    Empty,
    /// Bytes were left after a complete message.
    #[error("{count} trailing byte(s) after a complete pgoutput {message} message")]
    TrailingBytes { message: &'static str, count: usize },
    /// A name or other text field is not UTF-8.
    #[error("pgoutput field {field} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 { field: &'static str, offset: usize },
    /// A C string had no terminating NUL.
    #[error("pgoutput field {field} at offset {offset} has no terminating NUL")]
    UnterminatedString { field: &'static str, offset: usize },
    /// A field holds a value the protocol does not allow.
    #[error("pgoutput field {field} has invalid value {value:#x}")]
    InvalidValue { field: &'static str, value: u64 },
    /// A length field is negative or larger than the buffer.
    #[error("pgoutput field {field} has invalid length {length}")]
    InvalidLength { field: &'static str, length: i64 },
    /// A message that is only valid in a later protocol version, or in another stream state.
    #[error("pgoutput {message} message not allowed here: {reason}")]
    Unexpected { message: &'static str, reason: &'static str },
}
