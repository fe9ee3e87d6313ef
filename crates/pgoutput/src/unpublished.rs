//! Why PostgreSQL leaves a column of an outbox table out of the replication stream, and the fix
//! for the server's version: the source finds it in the catalog, the router's error carries it
//! ([`Unpublished`]), and only `Display` renders it.
//!
//! pgoutput describes a table with the columns it publishes. A generated column is not among
//! them before PostgreSQL 18; from 18 only a stored one is, and only when the publication has
//! `publish_generated_columns = stored` (or names it in a column list). The same holds for a
//! column the table has now but did not have as a published column when the rows being read
//! were written, and for one a publication's column list leaves out.
//!
//! # Invariants
//! - Each cause names a fix for the server's version, and what happens to the rows written
//!   before it (PostgreSQL decodes them with the catalog as it was, so they stay without the
//!   column): the dead-letter policy sends them aside.
//! - Every name put into SQL is quoted.

use std::fmt;

/// The first PostgreSQL version (`server_version_num`) that can publish generated columns.
pub const PUBLISH_GENERATED_VERSION: i32 = 180_000;

/// How a column is generated (`pg_attribute.attgenerated`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Generated {
    /// Not generated: a column the stream should carry.
    No,
    /// `s`: computed when the row is written and stored.
    Stored,
    /// `v` (PostgreSQL 18): computed when read; never published.
    Virtual,
}

/// What the server and the publication do with generated columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Publishing {
    /// `server_version_num`.
    pub version: i32,
    /// `publish_generated_columns = stored` (PostgreSQL 18).
    pub publishes_stored: bool,
}

/// A column of a table that the stream's description of the table lacks, and what the server
/// and the publication do with it. Displayed as the end of a sentence that starts "it is ".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpublished {
    /// The table's schema.
    pub schema: String,
    /// The table's name.
    pub table: String,
    /// The column.
    pub column: String,
    /// How the column is generated.
    pub generated: Generated,
    /// What the server and the publication do with generated columns.
    pub publishing: Publishing,
    /// The publication of the stream.
    pub publication: String,
}

impl fmt::Display for Unpublished {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Unpublished {
            column,
            generated,
            publishing,
            publication,
            ..
        } = self;
        let generated = *generated;
        let table = format!("{}.{}", self.schema, self.table);
        let quoted_table = format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.table));
        let set_option = format!(
            "ALTER PUBLICATION {} SET (publish_generated_columns = stored)",
            quote_ident(publication)
        );
        let regular = format!(
            "make it a regular column that the INSERT (or a BEFORE INSERT trigger) fills: ALTER TABLE {} ALTER COLUMN {} DROP EXPRESSION",
            quoted_table,
            quote_ident(column)
        );
        let what = match generated {
            Generated::No => format!(
                "a column the table has now but the stream's description of these rows lacks: it was added, or (before PostgreSQL 18) stopped being a generated column, after they were written, or publication \"{publication}\"'s column list for {table} leaves it out (name it with ALTER PUBLICATION {} SET TABLE ..., or drop the column list)",
                quote_ident(publication)
            ),
            Generated::Virtual => format!(
                "a virtual generated column, which PostgreSQL never publishes: make it a STORED generated column (drop it and add it again with GENERATED ALWAYS AS (...) STORED) and run {set_option}, or {regular}"
            ),
            Generated::Stored if publishing.version < PUBLISH_GENERATED_VERSION => format!(
                "a generated column, which PostgreSQL before 18 never publishes: {regular}; or upgrade to PostgreSQL 18 and run {set_option}"
            ),
            Generated::Stored if !publishing.publishes_stored => format!(
                "a generated column, which publication \"{publication}\" does not publish (publish_generated_columns = none, the default): run {set_option}"
            ),
            Generated::Stored => format!(
                "a generated column that publication \"{publication}\" leaves out here although it publishes generated columns: its column list for {table} does not name the column (add it with ALTER PUBLICATION {} SET TABLE ...), or the rows were written before publish_generated_columns was set",
                quote_ident(publication)
            ),
        };
        write!(
            f,
            "{what}. Rows written before the fix stay without the column in the slot (PostgreSQL decodes them with the catalog as it was): set pipeline.on_error = \"dead-letter\" to send them to the dead-letter topic, then re-send them from the application if consumers need them"
        )
    }
}

/// Quotes an identifier for SQL.
fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}
