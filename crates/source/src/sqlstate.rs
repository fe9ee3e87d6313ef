//! SQLSTATE codes: the five characters PostgreSQL sends with every error, in every language.
//! A value type both connections' errors are keyed by; it imports nothing of the crate.
//!
//! # Invariants
//! - A [`SqlState`] is exactly five bytes; anything the server sends that is not five ASCII
//!   letters or digits becomes [`SqlState::MALFORMED`], whose class no table knows.

use std::fmt;

/// A SQLSTATE code (`"42704"`), its first two characters being its class (`"42"`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SqlState([u8; 5]);

impl SqlState {
    /// Not a SQLSTATE (the server sent none, or not five letters or digits).
    pub const MALFORMED: SqlState = SqlState(*b"?????");

    pub const CONNECTION_FAILURE: SqlState = SqlState(*b"08006");
    pub const PROTOCOL_VIOLATION: SqlState = SqlState(*b"08P01");
    pub const FEATURE_NOT_SUPPORTED: SqlState = SqlState(*b"0A000");
    pub const UNIQUE_VIOLATION: SqlState = SqlState(*b"23505");
    pub const READ_ONLY_SQL_TRANSACTION: SqlState = SqlState(*b"25006");
    pub const INVALID_AUTHORIZATION_SPECIFICATION: SqlState = SqlState(*b"28000");
    pub const INVALID_PASSWORD: SqlState = SqlState(*b"28P01");
    pub const INVALID_CATALOG_NAME: SqlState = SqlState(*b"3D000");
    pub const SERIALIZATION_FAILURE: SqlState = SqlState(*b"40001");
    pub const DEADLOCK_DETECTED: SqlState = SqlState(*b"40P01");
    pub const INSUFFICIENT_PRIVILEGE: SqlState = SqlState(*b"42501");
    pub const SYNTAX_ERROR: SqlState = SqlState(*b"42601");
    pub const UNDEFINED_OBJECT: SqlState = SqlState(*b"42704");
    pub const DUPLICATE_OBJECT: SqlState = SqlState(*b"42710");
    pub const TOO_MANY_CONNECTIONS: SqlState = SqlState(*b"53300");
    pub const CONFIGURATION_LIMIT_EXCEEDED: SqlState = SqlState(*b"53400");
    pub const OBJECT_NOT_IN_PREREQUISITE_STATE: SqlState = SqlState(*b"55000");
    pub const OBJECT_IN_USE: SqlState = SqlState(*b"55006");
    pub const LOCK_NOT_AVAILABLE: SqlState = SqlState(*b"55P03");
    pub const QUERY_CANCELED: SqlState = SqlState(*b"57014");
    pub const ADMIN_SHUTDOWN: SqlState = SqlState(*b"57P01");
    pub const CRASH_SHUTDOWN: SqlState = SqlState(*b"57P02");
    pub const CANNOT_CONNECT_NOW: SqlState = SqlState(*b"57P03");
    pub const DATABASE_DROPPED: SqlState = SqlState(*b"57P04");
    pub const IO_ERROR: SqlState = SqlState(*b"58030");
    pub const UNDEFINED_FILE: SqlState = SqlState(*b"58P01");
    pub const INTERNAL_ERROR: SqlState = SqlState(*b"XX000");
    pub const DATA_CORRUPTED: SqlState = SqlState(*b"XX001");
    pub const INDEX_CORRUPTED: SqlState = SqlState(*b"XX002");

    /// The code the server sent (`C` field); [`SqlState::MALFORMED`] when it is not one.
    pub fn parse(code: &str) -> SqlState {
        match <[u8; 5]>::try_from(code.as_bytes()) {
            Ok(bytes) if bytes.iter().all(u8::is_ascii_alphanumeric) => SqlState(bytes),
            _ => SqlState::MALFORMED,
        }
    }

    /// The code, e.g. `"42704"`.
    pub fn as_str(&self) -> &str {
        // Five ASCII bytes by construction.
        std::str::from_utf8(&self.0).unwrap_or("?????")
    }

    /// The class: the first two characters, e.g. `"42"`.
    pub fn class(&self) -> &str {
        &self.as_str()[..2]
    }
}

impl From<&tokio_postgres::error::SqlState> for SqlState {
    fn from(code: &tokio_postgres::error::SqlState) -> Self {
        SqlState::parse(code.code())
    }
}

impl fmt::Display for SqlState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for SqlState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SqlState({})", self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_five_letters_or_digits() {
        assert_eq!(SqlState::parse("42704"), SqlState::UNDEFINED_OBJECT);
        assert_eq!(SqlState::parse("57P01").class(), "57");
        assert_eq!(SqlState::parse(""), SqlState::MALFORMED);
        assert_eq!(SqlState::parse("4270"), SqlState::MALFORMED);
        assert_eq!(SqlState::parse("42 04"), SqlState::MALFORMED);
        assert_eq!(SqlState::parse("427041"), SqlState::MALFORMED);
        assert_eq!(SqlState::parse("ÄÖ"), SqlState::MALFORMED);
        assert_eq!(SqlState::MALFORMED.class(), "??");
    }
}
