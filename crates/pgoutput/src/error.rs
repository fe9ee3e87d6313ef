//! Decoding errors.
//!
//! # Invariants
//! - Every error names the field or tag at fault, and offsets are byte offsets into the message.

/// Why a buffer is not a valid pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The buffer ended before the message did.
    #[error("pgoutput message truncated: needed {needed} more byte(s) at offset {offset} while reading {field}")]
    Truncated {
        /// The field being read.
        field: &'static str,
        /// Offset of the field in the message.
        offset: usize,
        /// How many bytes were missing.
        needed: usize,
    },
    /// The first byte names no known message.
    #[error("unknown pgoutput message tag {tag:#04x} ({:?})", *tag as char)]
    UnknownTag {
        /// The tag byte.
        tag: u8,
    },
    /// The buffer was empty.
    #[error("empty pgoutput message")]
    Empty,
    /// Bytes were left after a complete message.
    #[error("{count} trailing byte(s) after a complete pgoutput {message} message")]
    TrailingBytes {
        /// Name of the decoded message.
        message: &'static str,
        /// How many bytes were left.
        count: usize,
    },
    /// A name or other text field is not UTF-8.
    #[error("pgoutput field {field} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// The field being read.
        field: &'static str,
        /// Offset of the text in the message.
        offset: usize,
    },
    /// A C string had no terminating NUL.
    #[error("pgoutput field {field} at offset {offset} has no terminating NUL")]
    UnterminatedString {
        /// The field being read.
        field: &'static str,
        /// Offset of the string in the message.
        offset: usize,
    },
    /// A field holds a value the protocol does not allow.
    #[error("pgoutput field {field} has invalid value {value:#x}")]
    InvalidValue {
        /// The field read.
        field: &'static str,
        /// The value found.
        value: u64,
    },
    /// A length or count field is negative. (A length larger than what is left of the buffer
    /// is [`DecodeError::Truncated`].)
    #[error("pgoutput field {field} has invalid length {length}")]
    InvalidLength {
        /// The length field.
        field: &'static str,
        /// The value found.
        length: i64,
    },
    /// A message that is only valid in a later protocol version, or in another stream state.
    #[error("pgoutput {message} message not allowed here: {reason}")]
    Unexpected {
        /// Name of the message.
        message: &'static str,
        /// Why it is not allowed.
        reason: &'static str,
    },
}
