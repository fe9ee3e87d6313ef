//! The routers of a session: `[router]` for every outbox table and logical-message prefix, and
//! a table's own where its options add to it.
//!
//! # Invariants
//! - Every table has a router: its own, or the default one.

use super::table::TableName;
use siphon_router::EventRouter;
use std::collections::HashMap;

/// The routers: `[router]` for every outbox table (and logical-message outbox), and for a table
/// with `[router.tables."schema.table"]` options, those on top of `[router]`.
pub struct Routers {
    default: EventRouter,
    tables: HashMap<TableName, EventRouter>,
}

impl Routers {
    /// `default` for every table but those in `tables`.
    pub fn new(default: EventRouter, tables: HashMap<TableName, EventRouter>) -> Self {
        Routers { default, tables }
    }

    /// The router for rows of `table`.
    pub fn for_table(&self, table: &TableName) -> &EventRouter {
        self.tables.get(table).unwrap_or(&self.default)
    }

    /// The `[router]` router (logical messages use it).
    pub fn default_router(&self) -> &EventRouter {
        &self.default
    }

    /// Malformed trace contexts left out so far, by all routers.
    pub fn malformed_trace_contexts(&self) -> u64 {
        self.tables
            .values()
            .map(EventRouter::malformed_trace_contexts)
            .sum::<u64>()
            + self.default.malformed_trace_contexts()
    }
}
