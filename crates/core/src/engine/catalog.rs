//! What the session engine asks the catalog ([`Lookup`]) and learns from it ([`Answer`]) about
//! a relation the stream describes: the source reads it, the engine binds the table's router
//! with it. A schema registry is asked the same way for the id of a record value's schema.
//!
//! # Invariants
//! - Plain values: the source's queries (or the registry's answers) fill them, nothing here
//!   reads the catalog.
//! - An answer names the relation or the subject and schema its lookup was for.

use pgoutput::unpublished::Unpublished;
use pgoutput::Relation;
use siphon_record::RegistrySchema;
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
    /// The id `schema` has under `subject` in the schema registry, registering it if it is not
    /// there yet. Unreachable registries are retried by the asker: the answer is an id or a
    /// refusal.
    SchemaId {
        subject: String,
        schema: RegistrySchema,
    },
    /// The latest schema registered under `subject`, with its id (asked again once the
    /// session's copy is older than its time to live).
    LatestSchema { subject: String },
}

/// The answer to a [`Lookup`]; `E`: why the catalog could not be read, `R`: why the registry
/// refused a schema.
#[derive(Debug)]
pub enum Answer<E, R> {
    NotNullColumns {
        relation: Arc<Relation>,
        columns: Result<OutboxColumns, E>,
    },
    /// `Some`: the relation renamed to the outbox table it is a partition of.
    OutboxRelation {
        relation: Arc<Relation>,
        outbox: Result<Option<Relation>, E>,
    },
    SchemaId {
        subject: String,
        schema: RegistrySchema,
        id: Result<u32, R>,
    },
    /// The schema's id, kind and text.
    LatestSchema {
        subject: String,
        schema: Result<(u32, siphon_record::RegistrySchemaKind, Arc<str>), R>,
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
