//! The values of the routing options that choose a behaviour: what an update does
//! (`table.op.invalid.behavior`), where an additional column goes
//! (`table.fields.additional.placement`), what a missing one does
//! (`table.field.additional.missing`).
//!
//! # Invariants
//! - Each value is one Debezium accepts; parsing ignores case as Debezium does.

use std::fmt;

/// What to do when an outbox row is updated (`table.op.invalid.behavior`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InvalidOperationBehavior {
    /// `warn`: skip the update; the caller logs a warning.
    #[default]
    Warn,
    /// `error`: skip the update; the caller logs an error.
    Error,
    /// `fatal`: routing fails with [`crate::RouteError::InvalidOperation`].
    Fatal,
}

impl InvalidOperationBehavior {
    /// The option value (`warn`, `error` or `fatal`).
    pub fn as_str(self) -> &'static str {
        match self {
            InvalidOperationBehavior::Warn => "warn",
            InvalidOperationBehavior::Error => "error",
            InvalidOperationBehavior::Fatal => "fatal",
        }
    }

    /// Parses an option value, ignoring case as Debezium does.
    pub fn parse(value: &str) -> Option<Self> {
        [Self::Warn, Self::Error, Self::Fatal]
            .into_iter()
            .find(|b| b.as_str().eq_ignore_ascii_case(value))
    }
}

impl fmt::Display for InvalidOperationBehavior {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to do when a column named in `table.fields.additional.placement` is not in the table
/// (`table.field.additional.missing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AdditionalMissingBehavior {
    /// `error`: binding the table fails.
    #[default]
    Error,
    /// `ignore`: the placement is left out for that table.
    Ignore,
}

/// Where an additional column goes (`table.fields.additional.placement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// `header`: a record header named by the alias.
    Header,
    /// `envelope`: a field of the value, which becomes `{"payload": …, alias: …}`.
    Envelope,
    /// `partition`: the record's partition (an `integer` column).
    Partition,
}

/// One entry of `table.fields.additional.placement`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdditionalField {
    /// The column.
    pub column: String,
    /// Where it goes.
    pub placement: Placement,
    /// The header or envelope field name (the column name when no alias is given).
    pub alias: String,
}
