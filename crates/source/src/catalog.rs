//! Typed catalog look-ups the pipeline needs while streaming.
//!
//! # Invariants
//! - A relation that pgoutput names, that is a partition (at any depth) of a configured outbox
//!   table, while the publication names partitions (`publish_via_partition_root` off), is never
//!   taken for "another table": [`ensure_not_an_outbox_partition`] turns it into a definite
//!   error naming the `ALTER PUBLICATION` that makes PostgreSQL name the outbox table instead.
//!   Its rows would otherwise be skipped and the slot would move past them.
//! - The look-ups read the current catalog, not the one the change was decoded with: a
//!   partition detached and dropped before its description is read can no longer be traced to
//!   its root, and a publication switched to `publish_via_partition_root = true` while Siphon
//!   still reads changes decoded before the switch is taken at its new value. The setup check
//!   ([`crate::setup`]) refuses a publication that names partitions, so these only matter when
//!   the publication is changed while Siphon runs.

use crate::config::quote_ident;
use crate::{SourceError, TableName};
use pgoutput::Oid;
use tokio_postgres::Client;

/// The partitioned tables `relation` belongs to, nearest first (empty when it is no partition,
/// or no longer exists).
pub async fn partition_ancestors(
    client: &Client,
    relation: Oid,
) -> Result<Vec<TableName>, SourceError> {
    // pg_inherits rather than pg_partition_ancestors (PostgreSQL 12+), so this works on every
    // version with partitioning; only partition links are followed, not plain inheritance.
    let rows = client
        .query(
            "WITH RECURSIVE up(relid, depth) AS ( \
                 SELECT i.inhparent, 1 FROM pg_inherits i \
                 JOIN pg_class c ON c.oid = i.inhrelid \
                 WHERE i.inhrelid = $1::oid AND c.relispartition \
               UNION ALL \
                 SELECT i.inhparent, up.depth + 1 FROM up \
                 JOIN pg_inherits i ON i.inhrelid = up.relid \
                 JOIN pg_class c ON c.oid = i.inhrelid \
                 WHERE c.relispartition) \
             SELECT n.nspname::text, c.relname::text FROM up \
             JOIN pg_class c ON c.oid = up.relid \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             ORDER BY up.depth",
            &[&relation],
        )
        .await
        .map_err(|e| SourceError::from_sql("looking up the partition ancestors of a table", e))?;
    Ok(rows
        .iter()
        .map(|r| TableName {
            schema: r.get(0),
            name: r.get(1),
        })
        .collect())
}

/// The configured outbox table that `relation` is a partition of, if any.
pub async fn outbox_partition_root(
    client: &Client,
    relation: Oid,
    outbox_tables: &[TableName],
) -> Result<Option<TableName>, SourceError> {
    let ancestors = partition_ancestors(client, relation).await?;
    Ok(ancestors.into_iter().find(|a| outbox_tables.contains(a)))
}

/// The command that makes a publication name the partitioned table instead of its partitions.
pub fn publish_via_root_fix(publication: &str) -> String {
    format!(
        "ALTER PUBLICATION {} SET (publish_via_partition_root = true)",
        quote_ident(publication)
    )
}

/// Whether publication `publication` publishes partitions under their root's name
/// (`publish_via_partition_root`); `false` when it does not exist.
pub async fn publishes_via_root(client: &Client, publication: &str) -> Result<bool, SourceError> {
    let row = client
        .query_opt(
            // Through jsonb: before PostgreSQL 13 the column does not exist (reads as off).
            "SELECT coalesce((to_jsonb(p) ->> 'pubviaroot')::bool, false) FROM pg_publication p WHERE pubname = $1",
            &[&publication],
        )
        .await
        .map_err(|e| SourceError::from_sql("looking up the publication", e))?;
    Ok(row.is_some_and(|r| r.get(0)))
}

/// Fails with a definite error when `relation` (named `name` by pgoutput, not an outbox table)
/// is a partition of one of the outbox tables and the publication names partitions
/// (`publish_via_partition_root` off): its rows would come under the partition's name, and
/// skipping them would lose events.
///
/// With `publish_via_partition_root` on, pgoutput also describes the partition (right after the
/// outbox table) before a change, but sends the change under the outbox table's OID: the
/// partition's description is then harmless and passes.
pub async fn ensure_not_an_outbox_partition(
    client: &Client,
    relation: Oid,
    name: &TableName,
    outbox_tables: &[TableName],
    publication: &str,
) -> Result<(), SourceError> {
    let Some(root) = outbox_partition_root(client, relation, outbox_tables).await? else {
        return Ok(());
    };
    if publishes_via_root(client, publication).await? {
        return Ok(());
    }
    Err(leaf_published(publication, name, &root))
}

/// The error for a change that PostgreSQL named by the partition `leaf` of outbox table `root`.
pub fn leaf_published(publication: &str, leaf: &TableName, root: &TableName) -> SourceError {
    SourceError::Definite(format!(
        "publication \"{publication}\" names the changes of outbox table {root} by its partition {leaf} (publish_via_partition_root is off), so they cannot be routed: run {} and restart Siphon; nothing was skipped, streaming resumes at the first unacknowledged transaction",
        publish_via_root_fix(publication)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fix_quotes_the_publication() {
        assert_eq!(
            publish_via_root_fix("my \"pub\""),
            r#"ALTER PUBLICATION "my ""pub""" SET (publish_via_partition_root = true)"#
        );
        let leaf = TableName::parse("public.outbox_2026_01").expect("valid name");
        let root = TableName::parse("public.outbox").expect("valid name");
        let err = leaf_published("siphon", &leaf, &root);
        assert!(!err.is_transient());
        assert!(err
            .to_string()
            .contains(r#"ALTER PUBLICATION "siphon" SET (publish_via_partition_root = true)"#));
    }
}
