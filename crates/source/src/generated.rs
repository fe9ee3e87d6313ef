//! Columns of an outbox table that the replication stream leaves out, and why.
//!
//! pgoutput describes a table with the columns it publishes. A generated column is not among
//! them before PostgreSQL 18; from 18 only a stored one is, and only when the publication has
//! `publish_generated_columns = stored` (or names it in a column list). A router option that
//! names such a column would otherwise read "has no column ... add it", which is wrong: the
//! column exists. The same holds for a column the table has now but did not have as a published
//! column when the rows being read were written (PostgreSQL describes them with the catalog as
//! it was then), and for one a publication's column list leaves out. The causes found here
//! ([`Unpublished`], typed in `siphon-core` so the router's error carries them) say what
//! PostgreSQL does and what to change for the server's version.
//!
//! # Invariants
//! - Only columns that the catalog has now and that the stream's description of the table lacks
//!   get a cause; a column the table does not have is left to the router's own check.
//! - Each cause names a fix for the server's version, and what happens to the rows written
//!   before it (PostgreSQL decodes them with the catalog as it was, so they stay without the
//!   column): the dead-letter policy sends them aside.
//! - The catalog is read, never changed.

use crate::{SourceError, TableName};
use pgoutput::Relation;
use std::collections::{HashMap, HashSet};
use tokio_postgres::Client;

pub use siphon_core::unpublished::{Generated, Publishing, Unpublished, PUBLISH_GENERATED_VERSION};

/// Why generated `column` of `table` is not in the stream, and the fix (see [`Unpublished`]).
pub fn cause(
    table: &TableName,
    column: &str,
    generated: Generated,
    publishing: Publishing,
    publication: &str,
) -> Unpublished {
    Unpublished {
        schema: table.schema.clone(),
        table: table.name.clone(),
        column: column.to_owned(),
        generated,
        publishing,
        publication: publication.to_owned(),
    }
}

/// The columns of `relation`'s table that the stream's description of it (`relation`) lacks,
/// each with its [`cause`]; empty when there are none.
pub async fn unpublished(
    client: &Client,
    relation: &Relation,
    publication: &str,
) -> Result<HashMap<String, Box<Unpublished>>, SourceError> {
    let rows = client
        .query(
            "SELECT attname::text, attgenerated::text FROM pg_attribute \
             WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped",
            &[&relation.id],
        )
        .await
        .map_err(|e| SourceError::from_sql(crate::error::Query::GeneratedColumns, e))?;
    let described: HashSet<&str> = relation.columns.iter().map(|c| c.name.as_str()).collect();
    let missing: Vec<(String, Generated)> = rows
        .iter()
        .filter_map(|r| {
            let name: String = r.get(0);
            let kind: String = r.get(1);
            let generated = match kind.as_str() {
                "" => Generated::No,
                "v" => Generated::Virtual,
                _ => Generated::Stored,
            };
            (!described.contains(name.as_str())).then_some((name, generated))
        })
        .collect();
    if missing.is_empty() {
        return Ok(HashMap::new());
    }
    let row = client
        .query_one(
            // Through jsonb: before PostgreSQL 18 the column does not exist (reads as none).
            "SELECT current_setting('server_version_num')::int, \
                    coalesce((SELECT to_jsonb(p) ->> 'pubgencols' FROM pg_publication p WHERE pubname = $1), 'n')",
            &[&publication],
        )
        .await
        .map_err(|e| SourceError::from_sql(crate::error::Query::PublicationOptions, e))?;
    let publishing = Publishing {
        version: row.get(0),
        publishes_stored: row.get::<_, String>(1) == "s",
    };
    let table = TableName {
        schema: relation.namespace.to_string(),
        name: relation.name.to_string(),
    };
    Ok(missing
        .into_iter()
        .map(|(name, generated)| {
            let cause = Box::new(cause(&table, &name, generated, publishing, publication));
            (name, cause)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outbox() -> TableName {
        TableName::parse("public.outbox").expect("valid name")
    }

    #[test]
    fn each_version_gets_its_own_fix() {
        let before_18 = cause(
            &outbox(),
            "aggregateid",
            Generated::Stored,
            Publishing {
                version: 150_004,
                publishes_stored: false,
            },
            "p",
        )
        .to_string();
        for needle in [
            "before 18",
            r#"ALTER TABLE "public"."outbox" ALTER COLUMN "aggregateid" DROP EXPRESSION"#,
            r#"upgrade to PostgreSQL 18 and run ALTER PUBLICATION "p" SET (publish_generated_columns = stored)"#,
            "pipeline.on_error = \"dead-letter\"",
        ] {
            assert!(before_18.contains(needle), "{needle:?}: {before_18}");
        }
        let on_18 = cause(
            &outbox(),
            "aggregateid",
            Generated::Stored,
            Publishing {
                version: 180_001,
                publishes_stored: false,
            },
            "p",
        )
        .to_string();
        assert!(
            on_18.contains(
                r#"does not publish (publish_generated_columns = none, the default): run ALTER PUBLICATION "p" SET (publish_generated_columns = stored)"#
            ),
            "{on_18}"
        );
        assert!(!on_18.contains("DROP EXPRESSION"), "{on_18}");
        let listed = cause(
            &outbox(),
            "aggregateid",
            Generated::Stored,
            Publishing {
                version: 180_001,
                publishes_stored: true,
            },
            "p",
        )
        .to_string();
        assert!(listed.contains("column list"), "{listed}");
        let virtual_ = cause(
            &outbox(),
            "aggregateid",
            Generated::Virtual,
            Publishing {
                version: 180_001,
                publishes_stored: true,
            },
            "p",
        )
        .to_string();
        assert!(
            virtual_.contains("virtual generated column, which PostgreSQL never publishes"),
            "{virtual_}"
        );
        let later = cause(
            &outbox(),
            "aggregateid",
            Generated::No,
            Publishing {
                version: 150_004,
                publishes_stored: false,
            },
            "p",
        )
        .to_string();
        assert!(
            later.contains("stopped being a generated column") && later.contains("column list"),
            "{later}"
        );
    }
}
