//! What makes the outbox tables published, by catalog identity, so that a publication dropped
//! and created again, or an outbox table taken out of it and added back, between two looks is
//! still noticed.
//!
//! A look at the publication by name only sees its state at that moment. PostgreSQL decodes
//! each change with the publication as it was when the change was written: while the
//! publication was missing (PostgreSQL 18 skips it without an error on the stream) or the table
//! was out of it, nothing was published, and a later look finds everything healthy again. The
//! catalog rows behind the membership tell: every `CREATE PUBLICATION`, `ADD TABLE` or
//! `ADD TABLES IN SCHEMA` makes a row with a new oid.
//!
//! # Invariants
//! - An outbox table's membership is the set of catalog rows that publish it: its own
//!   `pg_publication_rel` row and those of its partition ancestors, and (PostgreSQL 15+) the
//!   `pg_publication_namespace` rows of their schemas; a `FOR ALL TABLES` publication has none
//!   (its own oid is all there is).
//! - A table stayed published between two looks when some row publishing it at the first look
//!   still exists at the second (an oid is not reused while the row lives). When none does, the
//!   table may have been unpublished in between, and [`change`] reports it: a change from one
//!   set of rows to a disjoint one within one look's interval is taken for a gap, since the two
//!   looks cannot tell it from one (`ALTER PUBLICATION ... SET TABLE` changing an outbox
//!   table's row filter or column list replaces its row in one transaction: reported too).
//! - Rows of other tables never count: adding or removing another table changes nothing here.
//! - Without outbox tables (a logical-message outbox) nothing is reported: PostgreSQL sends
//!   logical messages whatever the publication holds.

use crate::error::ProtocolFault;
pub use crate::names::MembershipChange;
use crate::{SourceError, TableName};
use pgoutput::Oid;
use std::collections::{BTreeMap, BTreeSet};
use tokio_postgres::Client;

/// The first PostgreSQL version (`server_version_num`) with `FOR TABLES IN SCHEMA`.
const SCHEMA_PUBLICATION_VERSION: i32 = 150_000;

/// A catalog row that makes an outbox table published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Publisher {
    /// A `pg_publication_rel` row (`FOR TABLE` the table or one of its partition ancestors).
    Table(Oid),
    /// A `pg_publication_namespace` row (`FOR TABLES IN SCHEMA` of its or an ancestor's schema).
    Schema(Oid),
}

/// The publication and the catalog rows that publish each outbox table, at one look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// `pg_publication.oid`: a new one after `DROP PUBLICATION` and `CREATE PUBLICATION`.
    pub publication: Oid,
    /// The rows publishing each outbox table (empty for `FOR ALL TABLES`).
    pub tables: BTreeMap<TableName, BTreeSet<Publisher>>,
}

impl MembershipChange {
    /// The definite error for this change of `publication`, naming what was lost and what to do.
    pub fn into_error(self, publication: &str) -> SourceError {
        crate::error::SetupProblem::PublicationChanged {
            publication: publication.to_owned(),
            change: self,
        }
        .into()
    }
}

/// How the membership changed from `before` to `now` (both looks of the same publication
/// name), if events may have gone unpublished in between. See the module's invariants.
pub fn change(before: &Membership, now: &Membership) -> Option<MembershipChange> {
    if before.tables.is_empty() {
        return None;
    }
    if before.publication != now.publication {
        return Some(MembershipChange::PublicationRecreated);
    }
    before.tables.iter().find_map(|(table, rows_before)| {
        let rows_now = now.tables.get(table)?;
        (!rows_before.is_empty() && !rows_now.is_empty() && rows_before.is_disjoint(rows_now))
            .then(|| MembershipChange::TableAddedBack(table.clone()))
    })
}

/// Reads the membership of `tables` in `publication`; `None` when the publication does not
/// exist. One statement, so one catalog snapshot.
pub async fn read(
    client: &Client,
    publication: &str,
    tables: &[TableName],
    version: i32,
) -> Result<Option<Membership>, SourceError> {
    let rows = client
        .query(
            &membership_sql(version),
            &[&publication, &quoted_names(tables)],
        )
        .await
        .map_err(|e| SourceError::from_sql(crate::error::Query::PublicationMembership, e))?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let mut membership = Membership {
        publication: first.get(0),
        tables: BTreeMap::new(),
    };
    for row in &rows {
        let Some(ordinal) = row.get::<_, Option<i64>>(1) else {
            continue;
        };
        let table = usize::try_from(ordinal - 1)
            .ok()
            .and_then(|i| tables.get(i))
            .ok_or_else(|| {
                SourceError::from(ProtocolFault::MembershipOrdinal {
                    ordinal,
                    tables: tables.len(),
                })
            })?;
        let by_table: Vec<Oid> = row.get::<_, Option<Vec<Oid>>>(2).unwrap_or_default();
        let by_schema: Vec<Oid> = row.get::<_, Option<Vec<Oid>>>(3).unwrap_or_default();
        membership.tables.insert(
            table.clone(),
            by_table
                .into_iter()
                .map(Publisher::Table)
                .chain(by_schema.into_iter().map(Publisher::Schema))
                .collect(),
        );
    }
    Ok(Some(membership))
}

/// `$1`: the publication's name; `$2`: the outbox tables' quoted names. One row per table (one
/// row with a NULL ordinal without tables), none when the publication is missing.
fn membership_sql(version: i32) -> String {
    // The table itself and its partition ancestors (pg_partition_ancestors lists nothing for a
    // table that is no partition).
    let lineage = "SELECT to_regclass(t.name)::oid \
                   UNION SELECT relid FROM pg_partition_ancestors(to_regclass(t.name))";
    let by_schema = if version >= SCHEMA_PUBLICATION_VERSION {
        format!(
            "ARRAY(SELECT pn.oid FROM pg_publication_namespace pn \
                   WHERE pn.pnpubid = p.oid \
                     AND pn.pnnspid IN (SELECT c.relnamespace FROM pg_class c WHERE c.oid IN ({lineage})))"
        )
    } else {
        "NULL::oid[]".to_owned()
    };
    format!(
        "SELECT p.oid, t.ordinal, \
                ARRAY(SELECT pr.oid FROM pg_publication_rel pr \
                      WHERE pr.prpubid = p.oid AND pr.prrelid IN ({lineage})), \
                {by_schema} \
         FROM pg_publication p \
         LEFT JOIN unnest($2::text[]) WITH ORDINALITY AS t(name, ordinal) ON true \
         WHERE p.pubname = $1"
    )
}

fn quoted_names(tables: &[TableName]) -> Vec<String> {
    tables.iter().map(TableName::quoted).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(name: &str) -> TableName {
        TableName::parse(name).expect("valid name")
    }

    fn membership(publication: Oid, tables: &[(&str, &[Publisher])]) -> Membership {
        Membership {
            publication,
            tables: tables
                .iter()
                .map(|(name, rows)| (table(name), rows.iter().copied().collect()))
                .collect(),
        }
    }

    use Publisher::{Schema, Table};

    #[test]
    fn the_same_rows_are_no_change() {
        let m = membership(10, &[("outbox", &[Table(20)])]);
        assert_eq!(change(&m, &m.clone()), None);
    }

    #[test]
    fn a_new_publication_oid_is_a_recreated_publication() {
        let before = membership(10, &[("outbox", &[Table(20)])]);
        let now = membership(11, &[("outbox", &[Table(21)])]);
        assert_eq!(
            change(&before, &now),
            Some(MembershipChange::PublicationRecreated)
        );
        // FOR ALL TABLES: no rows, only the publication.
        let before = membership(10, &[("outbox", &[])]);
        let now = membership(11, &[("outbox", &[])]);
        assert_eq!(
            change(&before, &now),
            Some(MembershipChange::PublicationRecreated)
        );
        assert_eq!(change(&before, &before.clone()), None);
    }

    #[test]
    fn a_new_row_for_the_table_is_a_table_added_back() {
        let before = membership(
            10,
            &[("outbox", &[Table(20)]), ("other.outbox", &[Table(30)])],
        );
        let now = membership(
            10,
            &[("outbox", &[Table(20)]), ("other.outbox", &[Table(31)])],
        );
        assert_eq!(
            change(&before, &now),
            Some(MembershipChange::TableAddedBack(table("other.outbox")))
        );
        // Published through its schema, which was dropped and added again.
        let before = membership(10, &[("outbox", &[Schema(40)])]);
        let now = membership(10, &[("outbox", &[Schema(41)])]);
        assert_eq!(
            change(&before, &now),
            Some(MembershipChange::TableAddedBack(table("outbox")))
        );
    }

    #[test]
    fn a_row_that_stayed_keeps_the_table_published() {
        // Added through its schema as well, then its own row removed: never unpublished.
        let before = membership(10, &[("outbox", &[Table(20)])]);
        let both = membership(10, &[("outbox", &[Table(20), Schema(40)])]);
        let schema_only = membership(10, &[("outbox", &[Schema(40)])]);
        assert_eq!(change(&before, &both), None);
        assert_eq!(change(&both, &schema_only), None);
    }

    #[test]
    fn a_table_not_published_now_is_left_to_the_membership_check() {
        let before = membership(10, &[("outbox", &[Table(20)])]);
        let now = membership(10, &[("outbox", &[])]);
        assert_eq!(change(&before, &now), None);
    }

    #[test]
    fn without_outbox_tables_the_publication_does_not_matter() {
        let before = membership(10, &[]);
        let now = membership(11, &[]);
        assert_eq!(change(&before, &now), None);
    }

    #[test]
    fn the_error_names_the_loss_and_the_fix() {
        let err = MembershipChange::PublicationRecreated.into_error("p");
        assert!(!err.is_transient());
        let text = err.to_string();
        assert!(
            text.contains(r#"publication "p" was dropped and created again"#),
            "{text}"
        );
        assert!(text.contains("cannot be read from this slot"), "{text}");
        assert!(text.contains("re-send them from the application"), "{text}");
        assert!(text.contains("siphon accept-publication-change"), "{text}");
        let text = MembershipChange::TableAddedBack(table("outbox"))
            .into_error("p")
            .to_string();
        assert!(
            text.contains(
                r#"outbox table "public"."outbox" was taken out of publication "p" and added back"#
            ),
            "{text}"
        );
    }
}
