//! Zero-copy UTF-8 text.
//!
//! # Invariants
//! - The bytes of a [`Text`] are valid UTF-8 (checked once, when it is built).

use bytes::Bytes;
use std::fmt;

/// UTF-8 text that shares the buffer it was decoded from.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Text(Bytes);

impl Text {
    /// Wraps `bytes` after checking they are UTF-8.
    pub fn new(bytes: Bytes) -> Result<Self, std::str::Utf8Error> {
        std::str::from_utf8(&bytes)?;
        Ok(Text(bytes))
    }

    /// Copies a string into a new `Text`.
    pub fn from_static(s: &'static str) -> Self {
        Text(Bytes::from_static(s.as_bytes()))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        // Invariant: the bytes were validated as UTF-8 in `new` / `from_static`.
        match std::str::from_utf8(&self.0) {
            Ok(s) => s,
            Err(_) => unreachable!("Text holds validated UTF-8"),
        }
    }

    /// The underlying bytes.
    pub fn as_bytes(&self) -> &Bytes {
        &self.0
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for Text {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Text {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}
