//! What the session engine learns from the catalog about an outbox table, beyond the stream's
//! description of it: the source reads it, the engine binds the table's router with it.
//!
//! # Invariants
//! - Plain values: the source's query fills them, nothing here reads the catalog.

use pgoutput::unpublished::Unpublished;
use std::collections::{HashMap, HashSet};

/// What the catalog says about an outbox table's columns, beyond the stream's description.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboxColumns {
    /// The columns declared NOT NULL.
    pub not_null: HashSet<String>,
    /// Columns of the table that the stream leaves out (generated columns the publication does
    /// not publish, columns the rows being read did not have), each with why and the fix
    /// (boxed, as it travels in the router's error).
    pub unpublished: HashMap<String, Box<Unpublished>>,
}
