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
//! - Across restarts (a gap while Siphon was not running), nothing is stored: at start, before
//!   anything is decoded, [`added_since_resume`] compares the transaction that created each row
//!   publishing an outbox table (its `xmin`) with the slot's `catalog_xmin`. A table with no
//!   row older than `catalog_xmin` may have been unpublished after the resume position: a
//!   definite error naming the table, the publication and the way out. A transaction before
//!   `catalog_xmin` ended before a confirmed position, so no gap goes unreported; the reverse
//!   errs on the safe side: `catalog_xmin` lags the confirmed position (about 20 s measured,
//!   longer behind an open transaction), and a table added in that window before Siphon
//!   stopped, or added while it was stopped, is reported too. Rows made by the transaction that
//!   created the publication never count: a publication created with its tables just before a
//!   slot would look like a gap (a new slot's `catalog_xmin` can precede transactions that
//!   ended before it), and a publication created again while Siphon was stopped is caught by
//!   the stream (PostgreSQL refuses, or from 18 warns about, changes written while it was
//!   missing). Stored state was weighed and
//!   left out: no place belongs to the slot, survives restarts and needs neither new
//!   privileges nor files. A publication dropped while Siphon was stopped and a start that
//!   made the slot or the publication are left to the stream (see [`crate::wire`]).

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

/// How the outbox's publication membership changed between two looks, in a way that leaves
/// events unpublished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The publication is another one with the same name: it was dropped and created again.
    PublicationRecreated,
    /// Every row that published `table` is gone, and other rows publish it now: it was taken
    /// out of the publication and added back.
    TableAddedBack(TableName),
}

impl Change {
    /// The definite error for this change of `publication`, naming what was lost and what to do.
    pub fn into_error(self, publication: &str) -> SourceError {
        let (what, restart) = match self {
            Change::PublicationRecreated => (
                format!(
                    "publication \"{publication}\" was dropped and created again while Siphon streamed (it is another publication now)"
                ),
                // PostgreSQL before 18 refuses to decode a change written while a publication
                // of the stream was missing; that error names the way past it.
                " (on PostgreSQL before 18 the server may then stop at the first change written while the publication was missing, saying it does not exist; that error names how to move the slot past it)",
            ),
            Change::TableAddedBack(table) => (
                format!(
                    "outbox table {} was taken out of publication \"{publication}\" and added back while Siphon streamed",
                    table.quoted()
                ),
                "",
            ),
        };
        SourceError::Definite(format!(
            "{what}: PostgreSQL did not publish the events committed in between, so they cannot be read from this slot and were not sent to Kafka; re-send them from the application if consumers need them (the outbox rows committed around that time), then restart Siphon, which continues with the publication as it is now{restart}"
        ))
    }
}

/// How the membership changed from `before` to `now` (both looks of the same publication
/// name), if events may have gone unpublished in between. See the module's invariants.
pub fn change(before: &Membership, now: &Membership) -> Option<Change> {
    if before.tables.is_empty() {
        return None;
    }
    if before.publication != now.publication {
        return Some(Change::PublicationRecreated);
    }
    before.tables.iter().find_map(|(table, rows_before)| {
        let rows_now = now.tables.get(table)?;
        (!rows_before.is_empty() && !rows_now.is_empty() && rows_before.is_disjoint(rows_now))
            .then(|| Change::TableAddedBack(table.clone()))
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
        .map_err(|e| SourceError::from_sql("reading the publication's membership", e))?;
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
                SourceError::Protocol(format!(
                    "the publication's membership named table number {ordinal} of {}",
                    tables.len()
                ))
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

/// An outbox table whose catalog rows in the publication are all younger than the position the
/// slot resumes from: found at start, before anything is decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddedSinceResume {
    /// The table.
    pub table: TableName,
    /// The transaction that created the oldest row publishing it now (`pg_publication_rel` or
    /// `pg_publication_namespace` `xmin`).
    pub xid: String,
    /// The slot's `catalog_xmin`: transactions before it ended before the resume position.
    pub catalog_xmin: String,
}

impl AddedSinceResume {
    /// The definite error, naming the table, the publication and the ways out.
    pub fn into_error(self, publication: &str, slot: &str) -> SourceError {
        let table = self.table.quoted();
        SourceError::Definite(format!(
            "outbox table {table} was added to publication \"{publication}\" after the position the slot resumes from (by transaction {xid}; the slot's catalog_xmin is {catalog_xmin}): it was taken out of the publication and added back, or the publication was created again, while Siphon was not running, and PostgreSQL did not publish the events committed to it in between, so they cannot be read from this slot. To go on: re-send those events from the application, then move the slot on with SELECT pg_replication_slot_advance({slot_literal}, pg_current_wal_lsn()) (this skips every event not yet sent: re-send those too) and restart Siphon. If {table} is new in source.tables and nothing was written to it before it was added to the publication, nothing was lost: start Siphon once with the previous source.tables, and name {table} again once Siphon has streamed for a minute (add an outbox table to the publication before naming it in source.tables, while Siphon runs, to avoid this stop)",
            xid = self.xid,
            catalog_xmin = self.catalog_xmin,
            slot_literal = crate::config::quote_literal(slot),
        ))
    }
}

/// Finds an outbox table that may have been unpublished after the position slot `slot` resumes
/// from: every catalog row publishing it now was created by a transaction that does not precede
/// the slot's `catalog_xmin`. `None` when every published table has an older row, for a
/// `FOR ALL TABLES` publication, or when the publication or the slot is missing.
///
/// A transaction that precedes `catalog_xmin` ended before a position at or before the slot's
/// `confirmed_flush_lsn` (the server moves `catalog_xmin` only to the oldest transaction still
/// running at a position the client confirmed), so a row it created published the table for
/// everything decoded from there on. The converse does not hold: `catalog_xmin` lags, so a row
/// created shortly before Siphon stopped (or while an older transaction stayed open) is taken
/// for a gap too.
pub async fn added_since_resume(
    client: &Client,
    publication: &str,
    tables: &[TableName],
    slot: &str,
    version: i32,
) -> Result<Option<AddedSinceResume>, SourceError> {
    if tables.is_empty() {
        return Ok(None);
    }
    let rows = client
        .query(
            &added_since_resume_sql(version),
            &[&publication, &quoted_names(tables), &slot],
        )
        .await
        .map_err(|e| SourceError::from_sql("comparing the publication's rows with the slot", e))?;
    for row in &rows {
        let ordinal: i64 = row.get(0);
        let Some(table) = usize::try_from(ordinal - 1)
            .ok()
            .and_then(|i| tables.get(i))
        else {
            continue;
        };
        return Ok(Some(AddedSinceResume {
            table: table.clone(),
            xid: row.get(1),
            catalog_xmin: row.get(2),
        }));
    }
    Ok(None)
}

/// `$1`: the publication's name; `$2`: the outbox tables' quoted names; `$3`: the slot. One row
/// per outbox table published only by rows whose creating transaction does not precede the
/// slot's `catalog_xmin` (`age` compares transaction ids across wraparound; a frozen row is the
/// oldest of all) and added to the publication after it was created. A row made by the
/// transaction that created the publication does not count: a publication created with its
/// tables shortly before the slot (as a provisioning script does) would otherwise look like a
/// gap, since a new slot's `catalog_xmin` can be older than transactions that ended before it;
/// a publication created again after the resume position is reported by the stream instead
/// (PostgreSQL refuses, or from 18 warns about, changes written while it was missing).
fn added_since_resume_sql(version: i32) -> String {
    let lineage = "SELECT to_regclass(t.name)::oid \
                   UNION SELECT relid FROM pg_partition_ancestors(to_regclass(t.name))";
    let by_schema = if version >= SCHEMA_PUBLICATION_VERSION {
        format!(
            " UNION ALL SELECT pn.xmin FROM pg_publication_namespace pn \
               WHERE pn.pnpubid = p.oid \
                 AND pn.pnnspid IN (SELECT c.relnamespace FROM pg_class c WHERE c.oid IN ({lineage}))"
        )
    } else {
        String::new()
    };
    format!(
        "SELECT t.ordinal, (array_agg(r.xmin::text ORDER BY age(r.xmin) DESC))[1], s.xmin_text \
         FROM pg_publication p \
         CROSS JOIN (SELECT catalog_xmin::text AS xmin_text, age(catalog_xmin) AS xmin_age \
                     FROM pg_replication_slots \
                     WHERE slot_name = $3 AND catalog_xmin IS NOT NULL) s \
         CROSS JOIN unnest($2::text[]) WITH ORDINALITY AS t(name, ordinal) \
         JOIN LATERAL (SELECT pr.xmin FROM pg_publication_rel pr \
                       WHERE pr.prpubid = p.oid AND pr.prrelid IN ({lineage}){by_schema}) r ON true \
         WHERE p.pubname = $1 \
         GROUP BY t.ordinal, s.xmin_text, s.xmin_age \
         HAVING bool_and(age(r.xmin) <= s.xmin_age AND NOT (r.xmin = p.xmin)) \
         ORDER BY t.ordinal"
    )
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
        assert_eq!(change(&before, &now), Some(Change::PublicationRecreated));
        // FOR ALL TABLES: no rows, only the publication.
        let before = membership(10, &[("outbox", &[])]);
        let now = membership(11, &[("outbox", &[])]);
        assert_eq!(change(&before, &now), Some(Change::PublicationRecreated));
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
            Some(Change::TableAddedBack(table("other.outbox")))
        );
        // Published through its schema, which was dropped and added again.
        let before = membership(10, &[("outbox", &[Schema(40)])]);
        let now = membership(10, &[("outbox", &[Schema(41)])]);
        assert_eq!(
            change(&before, &now),
            Some(Change::TableAddedBack(table("outbox")))
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
        let err = Change::PublicationRecreated.into_error("p");
        assert!(!err.is_transient());
        let text = err.to_string();
        assert!(
            text.contains(r#"publication "p" was dropped and created again"#),
            "{text}"
        );
        assert!(text.contains("cannot be read from this slot"), "{text}");
        assert!(text.contains("re-send them from the application"), "{text}");
        assert!(text.contains("restart Siphon"), "{text}");
        let text = Change::TableAddedBack(table("outbox"))
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
