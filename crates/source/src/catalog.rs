//! Typed catalog look-ups the pipeline needs while streaming.
//!
//! # Invariants
//! - A relation that pgoutput names and that is a partition (at any depth) of a configured
//!   outbox table is never taken for "another table" ([`outbox_relation_for`]): while the
//!   publication names partitions (`publish_via_partition_root` off) it is a definite error
//!   naming the `ALTER PUBLICATION` that makes PostgreSQL name the outbox table instead; once
//!   the publication names the outbox table, changes still named by the partition (decoded
//!   before the switch) are routed as the outbox table's. Its rows are never skipped, so the
//!   slot never moves past them undelivered.
//! - The look-ups read the current catalog, not the one the change was decoded with: a
//!   partition detached and dropped before its description is read can no longer be traced to
//!   its root. The setup check ([`crate::setup`]) refuses a publication that names partitions,
//!   so this only matters when the publication is switched off while Siphon runs and a
//!   partition is dropped before Siphon reads its rows.

pub use crate::error::fixes::publish_via_root_fix;
use crate::error::ProtocolFault;
use crate::{SourceError, TableName};
use bytes::Bytes;
use pgoutput::{Oid, Relation, Text};
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
        .map_err(|e| SourceError::from_sql(crate::error::Query::PartitionAncestors, e))?;
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
        .map_err(|e| SourceError::from_sql(crate::error::Query::Publication, e))?;
    Ok(row.is_some_and(|r| r.get(0)))
}

/// What to do with `relation`, which pgoutput named but which is not an outbox table:
///
/// - `Ok(None)`: another table; its changes are ignored.
/// - `Ok(Some(outbox))`: a partition of an outbox table while the publication names changes by
///   the outbox table (`publish_via_partition_root` on): `relation` renamed to that outbox
///   table, to be bound and routed like it. Changes still come under the partition's name when
///   they were decoded before the publication was switched on (the decoder reads the
///   publication as it was when they were written); with the option on from the start,
///   pgoutput only describes the partition (right after the outbox table) and sends nothing
///   under its name.
/// - `Err(Definite)`: a partition of an outbox table while the publication names partitions:
///   skipping its rows would lose events; the error names the `ALTER PUBLICATION` to run.
pub async fn outbox_relation_for(
    client: &Client,
    relation: &Relation,
    outbox_tables: &[TableName],
    publication: &str,
) -> Result<Option<Relation>, SourceError> {
    let Some(root) = outbox_partition_root(client, relation.id, outbox_tables).await? else {
        return Ok(None);
    };
    let leaf = TableName {
        schema: relation.namespace.to_string(),
        name: relation.name.to_string(),
    };
    if !publishes_via_root(client, publication).await? {
        return Err(leaf_published(publication, &leaf, &root));
    }
    let text = |s: &str| {
        Text::new(Bytes::copy_from_slice(s.as_bytes()))
            .map_err(|e| SourceError::from(ProtocolFault::TableNameNotUtf8(e)))
    };
    Ok(Some(Relation {
        namespace: text(&root.schema)?,
        name: text(&root.name)?,
        ..relation.clone()
    }))
}

/// The error for a change that PostgreSQL named by the partition `leaf` of outbox table `root`.
pub fn leaf_published(publication: &str, leaf: &TableName, root: &TableName) -> SourceError {
    crate::error::SetupProblem::LeafPublished {
        publication: publication.to_owned(),
        leaf: leaf.clone(),
        root: root.clone(),
    }
    .into()
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
