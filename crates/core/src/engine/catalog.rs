//! What the session engine asks the catalog ([`Lookup`]) and learns from it ([`Answer`]) about
//! a relation the stream describes: the source reads it, the engine binds the table's router
//! with it.
//!
//! # Invariants
//! - Plain values: the source's queries fill them, nothing here reads the catalog.
//! - An answer names the relation its lookup was for.

use pgoutput::unpublished::Unpublished;
use pgoutput::Relation;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A catalog lookup the engine needs answered before it reads on.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// The NOT NULL columns of an outbox table (for `json-schemas` optional fields), and the
    /// generated columns the stream leaves out (named in a binding error instead of "missing").
    NotNullColumns(Arc<Relation>),
    /// Whether a relation that is not an outbox table is a partition of one (its changes are
    /// then the outbox table's, never "another table's").
    OutboxRelation(Arc<Relation>),
}

/// The answer to a [`Lookup`]; `E`: why the catalog could not be read.
#[derive(Debug)]
pub enum Answer<E> {
    NotNullColumns {
        relation: Arc<Relation>,
        columns: Result<OutboxColumns, E>,
    },
    /// `Some`: the relation renamed to the outbox table it is a partition of.
    OutboxRelation {
        relation: Arc<Relation>,
        outbox: Result<Option<Relation>, E>,
    },
}

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
