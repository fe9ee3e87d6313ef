//! Reading outbox rows outside the stream: the initial snapshot of a slot Siphon creates, and
//! re-sends of rows still in a table.
//!
//! Rows are read over a replication connection (`replication=database`, which also runs SQL),
//! so their values are printed by a walsender with the same session settings (`client_encoding`
//! UTF8, `DateStyle`, `TimeZone`, `extra_float_digits` ...) as the values pgoutput sends: the
//! text of a column read here is the text the stream would have carried, and the router makes
//! the same bytes of it.
//!
//! - [`RowReader::create_slot_in_snapshot`] opens a `REPEATABLE READ` transaction and creates
//!   the slot as its first command with `SNAPSHOT 'use'` (`USE_SNAPSHOT` before PostgreSQL 15):
//!   the transaction then sees exactly the rows committed before the slot's consistent point,
//!   and the slot streams exactly those committed after it.
//! - [`RowReader::describe`] describes a table as pgoutput's `Relation` message would (the
//!   published columns in attribute order, their types and modifiers, the replica identity
//!   flags), and finds the key rows are read in (`order_by`, then the primary key's columns).
//! - [`RowReader::read_chunk`] reads the next rows after a key, in key order, `limit` at a time
//!   (keyset pagination: no cursor kept between chunks, memory bounded by one chunk).
//!
//! # Invariants
//! - A chunk is read with one statement: inside the snapshot's transaction every chunk sees the
//!   same rows; outside it each chunk sees what is committed when it runs.
//! - The key is unique (it ends with the primary key) and NOT NULL, so reading "after the last
//!   key" neither repeats nor skips a row that stays in the table.
//! - A condition reaches SQL only as a [`RowCondition`]: one expression printed from its parse
//!   tree, in parentheses. A condition PostgreSQL refuses is a definite error naming the table.
//! - The publication's row filter of the table (PostgreSQL 15 on) is a condition of every read:
//!   a transfer sends only rows the stream would have sent.
//! - Every transaction of the connection is read-only (`default_transaction_read_only`).
//! - A chunk holds at most `max_bytes` of values (or one row, whatever its size): rows past
//!   that are dropped as they arrive and read by the next chunk.

use crate::config::{quote_ident, quote_literal, Endpoint};
use crate::error::{LoginTls, Query, SetupProblem, SourceOperation, Subject};
use crate::row_condition::RowCondition;
use crate::wire::{QueryRow, Session};
use crate::{ConnectionParams, SourceConfig, SourceError, TableName};
use bytes::Bytes;
use pgoutput::{Column, Lsn, Relation, RelationColumn, ReplicaIdentity, Text, TupleData};
use std::collections::HashSet;
use std::sync::Arc;
use tracing::info;

/// The first version with `CREATE_REPLICATION_SLOT ... ( SNAPSHOT 'use' )` and
/// `pg_publication_tables.attnames`.
const OPTION_LIST_VERSION: i32 = 150_000;

pub use crate::names::OrderProblem;

/// One column of the key rows are read in.
#[derive(Debug, Clone, PartialEq, Eq)]
struct KeyColumn {
    name: String,
    /// The column's type as SQL (`format_type`), to cast the last key's text back.
    type_sql: String,
}

/// An outbox table as the stream describes it, and how its rows are read.
#[derive(Debug, Clone)]
pub struct OutboxTable {
    pub table: TableName,
    /// What pgoutput's `Relation` message would say of the table.
    pub relation: Arc<Relation>,
    /// The columns declared NOT NULL (as the session's binding reads them).
    pub not_null: HashSet<String>,
    key: Vec<KeyColumn>,
    /// The publication's row filter of the table (PostgreSQL 15 on), as the server prints it:
    /// rows it does not pass are never streamed, so transfers do not read them either.
    publication_filter: Option<String>,
}

impl OutboxTable {
    /// The names of the key's columns, in order.
    pub fn key_columns(&self) -> Vec<&str> {
        self.key.iter().map(|k| k.name.as_str()).collect()
    }

    /// Whether the rows are read in the order of a `uuid` column first: random UUIDs are not
    /// in the order rows were written, so neither are the events of one aggregate.
    pub fn ordered_by_uuid(&self) -> bool {
        self.key.first().is_some_and(|k| k.type_sql == "uuid")
    }

    /// The SQL text reading up to `limit` rows matching `filter` after key `after`, up to key
    /// `until` (included).
    fn chunk_sql(
        &self,
        filter: Option<&RowCondition>,
        after: Option<&[String]>,
        until: Option<&[String]>,
        limit: usize,
    ) -> String {
        let mut columns: Vec<String> = self
            .relation
            .columns
            .iter()
            .map(|c| quote_ident(c.name.as_str()))
            .collect();
        let key: Vec<String> = self.key.iter().map(|k| quote_ident(&k.name)).collect();
        columns.extend(key.iter().cloned());
        let mut conditions = Vec::new();
        if let Some(filter) = &self.publication_filter {
            conditions.push(format!("({filter})"));
        }
        if let Some(filter) = filter {
            conditions.push(format!("({})", filter.sql()));
        }
        for (bound, operator) in [(after, ">"), (until, "<=")] {
            if let Some(bound) = bound {
                conditions.push(format!(
                    "({}) {operator} ({})",
                    key.join(", "),
                    self.literals(bound).join(", ")
                ));
            }
        }
        let filter = if conditions.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", conditions.join(" AND "))
        };
        format!(
            "SELECT {} FROM {}{filter} ORDER BY {} LIMIT {limit}",
            columns.join(", "),
            self.table.quoted(),
            key.join(", ")
        )
    }

    /// A key's values as literals of the key columns' types.
    fn literals(&self, key: &[String]) -> Vec<String> {
        self.key
            .iter()
            .zip(key)
            .map(|(k, v)| format!("{}::{}", quote_literal(v), k.type_sql))
            .collect()
    }

    /// The SQL text reading the key of the last row matching `filter`.
    fn last_key_sql(&self, filter: Option<&RowCondition>) -> String {
        let key: Vec<String> = self.key.iter().map(|k| quote_ident(&k.name)).collect();
        let chunk = self.chunk_sql(filter, None, None, 1);
        let from = chunk
            .find(" FROM ")
            .map_or(chunk.as_str(), |at| &chunk[at..]);
        let from = from.rfind(" ORDER BY ").map_or(from, |at| &from[..at]);
        let descending: Vec<String> = key.iter().map(|k| format!("{k} DESC")).collect();
        format!(
            "SELECT {}{from} ORDER BY {} LIMIT 1",
            key.join(", "),
            descending.join(", ")
        )
    }

    /// The SQL text counting the rows matching `filter` after key `after`, up to `until`.
    fn count_sql(
        &self,
        filter: Option<&RowCondition>,
        after: Option<&[String]>,
        until: Option<&[String]>,
    ) -> String {
        let chunk = self.chunk_sql(filter, after, until, 1);
        // The same conditions, without the order and the limit.
        let from = chunk
            .find(" FROM ")
            .map_or(chunk.as_str(), |at| &chunk[at..]);
        let from = from.rfind(" ORDER BY ").map_or(from, |at| &from[..at]);
        format!("SELECT count(*){from}")
    }
}

/// One row read: its values as the stream carries them, and its key (as text) to read on after.
#[derive(Debug, Clone)]
pub struct Row {
    pub tuple: TupleData,
    pub key: Vec<String>,
}

/// A replication connection used for SQL: reads outbox rows, in the slot's snapshot or not.
pub struct RowReader {
    session: Session,
    slot: String,
    user: String,
    login: LoginTls,
    version: i32,
    in_snapshot: bool,
}

impl RowReader {
    /// Opens the connection to `endpoint` (a host of `config.url`).
    pub async fn connect(config: &SourceConfig, endpoint: &Endpoint) -> Result<Self, SourceError> {
        let params = ConnectionParams::from_url(&config.url)?;
        let login = crate::stream::replication_login(config, &params, endpoint)?;
        let tls = LoginTls {
            mode: params.tls.mode,
            client_certificate: params.tls.client_cert.is_some(),
        };
        let subject = Subject {
            slot: Some(&config.slot),
            user: Some(&params.user),
            login: Some(tls),
        };
        let session = Session::connect(login).await.map_err(|e| {
            SourceError::from_replication_about(SourceOperation::ReplicationLogin, subject, e)
        })?;
        let mut reader = RowReader {
            session,
            slot: config.slot.clone(),
            user: params.user.clone(),
            login: tls,
            version: 0,
            in_snapshot: false,
        };
        // A snapshot waits idle in its transaction while Kafka acknowledges a chunk, and a
        // count of a large table takes a while: timeouts set for applications must not end them.
        // Every transaction of the connection is read-only: a transfer only reads.
        reader
            .query(
                Query::SnapshotTransaction,
                "SET idle_in_transaction_session_timeout = 0; SET statement_timeout = 0; \
                 SET default_transaction_read_only = on",
            )
            .await?;
        let rows = reader
            .query(
                Query::ServerVersion,
                "SELECT current_setting('server_version_num')",
            )
            .await?;
        reader.version = first(&rows).and_then(|v| v.parse().ok()).unwrap_or(0);
        Ok(reader)
    }

    /// Creates the slot (`config.slot`, pgoutput, failover when `config.failover`) as the first
    /// command of a `REPEATABLE READ` transaction that then reads in its snapshot; returns the
    /// slot's consistent point. Creating the slot waits for the transactions running now.
    ///
    /// # Errors
    /// A slot created meanwhile by another process is [`crate::error::Interruption::SlotBeingCreated`]
    /// (transient: the next attempt finds it).
    pub async fn create_slot_in_snapshot(
        &mut self,
        config: &SourceConfig,
    ) -> Result<Lsn, SourceError> {
        self.query(
            Query::SnapshotTransaction,
            "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY",
        )
        .await?;
        let slot = quote_ident(&config.slot);
        let sql = if self.version >= OPTION_LIST_VERSION {
            let failover = if config.failover {
                ", FAILOVER true"
            } else {
                ""
            };
            format!("CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput (SNAPSHOT 'use'{failover})")
        } else {
            format!("CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput USE_SNAPSHOT")
        };
        info!(slot = %config.slot, "creating the replication slot with a snapshot of the outbox tables (waits for the transactions running now)");
        let rows = match self.session.simple_query(&sql).await {
            Ok(rows) => rows,
            Err(crate::wire::WireError::Server(server))
                if server.code == crate::sqlstate::SqlState::DUPLICATE_OBJECT
                    || server.code == crate::sqlstate::SqlState::UNIQUE_VIOLATION =>
            {
                return Err(crate::error::Interruption::SlotBeingCreated {
                    slot: config.slot.clone(),
                }
                .into());
            }
            Err(e) => {
                return Err(SourceError::from_replication_about(
                    SourceOperation::CreateReplicationSlot,
                    self.subject(),
                    e,
                ))
            }
        };
        self.in_snapshot = true;
        let consistent_point = rows
            .first()
            .and_then(|row| row.get(1).cloned().flatten())
            .and_then(|text| text.parse::<Lsn>().ok())
            .ok_or(crate::error::ProtocolFault::MissingConsistentPoint)?;
        info!(slot = %config.slot, %consistent_point, "created replication slot; reading the outbox tables in its snapshot");
        Ok(consistent_point)
    }

    /// Whether reads see the slot's snapshot (see [`RowReader::create_slot_in_snapshot`]).
    pub fn in_snapshot(&self) -> bool {
        self.in_snapshot
    }

    /// Ends the snapshot's transaction (nothing was written) and closes the connection.
    pub async fn finish(mut self) -> Result<(), SourceError> {
        if self.in_snapshot {
            self.query(Query::SnapshotTransaction, "COMMIT").await?;
        }
        Ok(())
    }

    /// Describes `table` as pgoutput would (its columns published by `publication`), with the
    /// key rows are read in: `order_by` (NOT NULL columns), then the primary key's columns not
    /// named there.
    ///
    /// # Errors
    /// [`SetupProblem::MissingTable`]; [`SetupProblem::SnapshotOrder`] when no stable order can be
    /// had.
    pub async fn describe(
        &mut self,
        table: &TableName,
        publication: &str,
        order_by: &[String],
    ) -> Result<OutboxTable, SourceError> {
        let rows = self
            .query(
                Query::OutboxColumns,
                &format!(
                    "SELECT c.oid::text, c.relreplident::text FROM pg_class c WHERE c.oid = to_regclass({})",
                    quote_literal(&table.quoted())
                ),
            )
            .await?;
        let Some(row) = rows.first() else {
            return Err(SetupProblem::MissingTable {
                table: table.clone(),
            }
            .into());
        };
        let oid: u32 = cell(row, 0).parse().unwrap_or(0);
        let identity = cell(row, 1)
            .bytes()
            .next()
            .and_then(ReplicaIdentity::from_byte)
            .unwrap_or(ReplicaIdentity::Default);
        let (published, publication_filter) = match self.published(table, publication).await? {
            Some((columns, filter)) => (Some(columns), filter),
            None => (None, None),
        };
        let generated = if self.version >= 120_000 {
            "a.attgenerated <> ''"
        } else {
            "false"
        };
        // Key flags as pgoutput sets them: every column with REPLICA IDENTITY FULL, the
        // columns of the primary key (DEFAULT) or of the chosen index (INDEX).
        let columns = self
            .query(
                Query::OutboxColumns,
                &format!(
                    "SELECT a.attname::text, a.atttypid::text, a.atttypmod::text, a.attnotnull::text, \
                            format_type(a.atttypid, a.atttypmod), {generated} AS generated, \
                            (c.relreplident = 'f' OR EXISTS (SELECT 1 FROM pg_index i \
                              WHERE i.indrelid = c.oid AND a.attnum = ANY (i.indkey::int2[]) \
                                AND ((c.relreplident = 'd' AND i.indisprimary) \
                                  OR (c.relreplident = 'i' AND i.indisreplident))))::text \
                     FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
                     WHERE a.attrelid = {oid} AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"
                ),
            )
            .await?;
        let mut relation_columns = Vec::new();
        let mut not_null = HashSet::new();
        let mut types = Vec::new();
        for column in &columns {
            let name = cell(column, 0).to_owned();
            let is_not_null = cell(column, 3) == "true";
            if is_not_null {
                not_null.insert(name.clone());
            }
            types.push((name.clone(), cell(column, 4).to_owned(), is_not_null));
            let included = match &published {
                Some(published) => published.contains(&name),
                None => cell(column, 5) != "true",
            };
            if !included {
                continue;
            }
            relation_columns.push(RelationColumn {
                flags: u8::from(cell(column, 6) == "true"),
                name: text(&name),
                type_oid: cell(column, 1).parse().unwrap_or(0),
                type_modifier: cell(column, 2).parse().unwrap_or(-1),
            });
        }
        let primary = self
            .query(
                Query::OutboxColumns,
                &format!(
                    "SELECT a.attname::text FROM pg_index i \
                     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey::int2[]) \
                     WHERE i.indrelid = {oid} AND i.indisprimary \
                     ORDER BY array_position(i.indkey::int2[], a.attnum)"
                ),
            )
            .await?;
        let primary: Vec<String> = primary.iter().map(|r| cell(r, 0).to_owned()).collect();
        let key = order_key(table, &types, order_by, &primary)?;
        let relation = Relation {
            xid: None,
            id: oid,
            namespace: text(&table.schema),
            name: text(&table.name),
            replica_identity: identity,
            columns: relation_columns,
        };
        Ok(OutboxTable {
            table: table.clone(),
            relation: Arc::new(relation),
            not_null,
            key,
            publication_filter,
        })
    }

    /// The columns `publication` publishes of `table` (PostgreSQL 15 on: column lists and
    /// published generated columns) and its row filter; `None` before 15 (all columns but
    /// generated ones, no row filter) or when the table is not published (yet).
    async fn published(
        &mut self,
        table: &TableName,
        publication: &str,
    ) -> Result<Option<(HashSet<String>, Option<String>)>, SourceError> {
        if self.version < OPTION_LIST_VERSION {
            return Ok(None);
        }
        // A row a published column, each with the table's row filter.
        let rows = self
            .query(
                Query::PublicationTables,
                &format!(
                    "SELECT unnest(attnames)::text, rowfilter FROM pg_publication_tables \
                     WHERE pubname = {} AND schemaname = {} AND tablename = {}",
                    quote_literal(publication),
                    quote_literal(&table.schema),
                    quote_literal(&table.name)
                ),
            )
            .await?;
        let Some(first) = rows.first() else {
            // Not (yet) published: the stream would carry every column but generated ones.
            return Ok(None);
        };
        let filter = first.get(1).cloned().flatten().filter(|f| !f.is_empty());
        Ok(Some((
            rows.iter().map(|r| cell(r, 0).to_owned()).collect(),
            filter,
        )))
    }

    /// Reads up to `limit` rows of `table` matching `filter` after key `after` (from the first
    /// when `None`) up to key `until` (to the last when `None`), in key order, and keeps the
    /// first of them whose values add up to at most `max_bytes` (the first row whatever its
    /// size): the rows after those kept are read again by the next chunk.
    pub async fn read_chunk(
        &mut self,
        table: &OutboxTable,
        filter: Option<&RowCondition>,
        after: Option<&[String]>,
        until: Option<&[String]>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Row>, SourceError> {
        let sql = table.chunk_sql(filter, after, until, limit);
        let subject = Subject {
            slot: Some(&self.slot),
            user: Some(&self.user),
            login: Some(self.login),
        };
        let (rows, _) = self
            .session
            .simple_query_within(&sql, max_bytes)
            .await
            .map_err(|e| {
                SourceError::from_replication_about(
                    SourceOperation::Query(Query::OutboxRows),
                    subject,
                    e,
                )
            })?;
        let published = table.relation.columns.len();
        Ok(rows
            .into_iter()
            .map(|mut values| {
                let key: Vec<String> = values
                    .split_off(published.min(values.len()))
                    .into_iter()
                    .map(Option::unwrap_or_default)
                    .collect();
                let columns = values
                    .into_iter()
                    .map(|v| match v {
                        Some(text) => Column::Text(Bytes::from(text)),
                        None => Column::Null,
                    })
                    .collect();
                Row {
                    tuple: TupleData { columns },
                    key,
                }
            })
            .collect())
    }

    /// How many rows of `table` match `filter` after key `after` up to `until` (for progress
    /// estimates).
    pub async fn count(
        &mut self,
        table: &OutboxTable,
        filter: Option<&RowCondition>,
        after: Option<&[String]>,
        until: Option<&[String]>,
    ) -> Result<u64, SourceError> {
        let rows = self
            .query(Query::OutboxRows, &table.count_sql(filter, after, until))
            .await?;
        Ok(first(&rows).and_then(|v| v.parse().ok()).unwrap_or(0))
    }

    /// The key of the last row of `table` matching `filter` now (`None`: no row). Reading up to
    /// it, outside a snapshot, ends: rows inserted meanwhile with keys after it are not chased
    /// (they are streamed).
    pub async fn last_key(
        &mut self,
        table: &OutboxTable,
        filter: Option<&RowCondition>,
    ) -> Result<Option<Vec<String>>, SourceError> {
        let rows = self
            .query(Query::OutboxRows, &table.last_key_sql(filter))
            .await?;
        Ok(rows
            .into_iter()
            .next()
            .map(|row| row.into_iter().map(Option::unwrap_or_default).collect()))
    }

    fn subject(&self) -> Subject<'_> {
        Subject {
            slot: Some(&self.slot),
            user: Some(&self.user),
            login: Some(self.login),
        }
    }

    async fn query(&mut self, query: Query, sql: &str) -> Result<Vec<QueryRow>, SourceError> {
        let subject = Subject {
            slot: Some(&self.slot),
            user: Some(&self.user),
            login: Some(self.login),
        };
        self.session.simple_query(sql).await.map_err(|e| {
            SourceError::from_replication_about(SourceOperation::Query(query), subject, e)
        })
    }
}

/// The key rows are read in: `order_by`, then the primary key's columns not in it. `columns`:
/// every column's name, type and whether it is NOT NULL.
fn order_key(
    table: &TableName,
    columns: &[(String, String, bool)],
    order_by: &[String],
    primary: &[String],
) -> Result<Vec<KeyColumn>, SourceError> {
    let problem = |problem| SetupProblem::SnapshotOrder {
        table: table.clone(),
        problem,
    };
    if primary.is_empty() {
        return Err(problem(OrderProblem::NoPrimaryKey).into());
    }
    let mut key = Vec::new();
    for name in order_by.iter().chain(primary) {
        if key.iter().any(|k: &KeyColumn| &k.name == name) {
            continue;
        }
        let Some((_, type_sql, not_null)) = columns.iter().find(|(n, _, _)| n == name) else {
            return Err(problem(OrderProblem::MissingColumn {
                column: name.clone(),
            })
            .into());
        };
        if !not_null {
            return Err(problem(OrderProblem::NullableColumn {
                column: name.clone(),
            })
            .into());
        }
        key.push(KeyColumn {
            name: name.clone(),
            type_sql: type_sql.clone(),
        });
    }
    Ok(key)
}

fn first(rows: &[QueryRow]) -> Option<&str> {
    rows.first()?.first()?.as_deref()
}

fn cell(row: &QueryRow, column: usize) -> &str {
    row.get(column).and_then(|v| v.as_deref()).unwrap_or("")
}

fn text(value: &str) -> Text {
    // A Rust string is valid UTF-8.
    Text::new(Bytes::copy_from_slice(value.as_bytes())).unwrap_or_else(|_| Text::from_static(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outbox() -> OutboxTable {
        let table = TableName::parse("public.outbox").expect("valid name");
        let types = vec![
            ("id".to_owned(), "uuid".to_owned(), true),
            (
                "created_at".to_owned(),
                "timestamp with time zone".to_owned(),
                true,
            ),
            ("note".to_owned(), "text".to_owned(), false),
        ];
        let key = order_key(
            &table,
            &types,
            &["created_at".to_owned()],
            &["id".to_owned()],
        )
        .expect("a key");
        OutboxTable {
            relation: Arc::new(Relation {
                xid: None,
                id: 1,
                namespace: text("public"),
                name: text("outbox"),
                replica_identity: ReplicaIdentity::Default,
                columns: vec![RelationColumn {
                    flags: 1,
                    name: text("id"),
                    type_oid: 2950,
                    type_modifier: -1,
                }],
            }),
            table,
            not_null: HashSet::new(),
            key,
            publication_filter: None,
        }
    }

    #[test]
    fn chunks_are_read_after_the_last_key_in_key_order() {
        let table = outbox();
        assert_eq!(table.key_columns(), ["created_at", "id"]);
        let condition = |text: &str| {
            RowCondition::parse(text, crate::row_condition::ConditionSource::Operator)
                .expect("one expression")
        };
        let first = table.chunk_sql(Some(&condition("published_at IS NULL")), None, None, 100);
        assert_eq!(
            first,
            r#"SELECT "id", "created_at", "id" FROM "public"."outbox" WHERE (published_at IS NULL) ORDER BY "created_at", "id" LIMIT 100"#
        );
        let next = table.chunk_sql(
            None,
            Some(&["2026-12-01 00:00:00+00".to_owned(), "it's".to_owned()]),
            None,
            10,
        );
        assert_eq!(
            next,
            r#"SELECT "id", "created_at", "id" FROM "public"."outbox" WHERE ("created_at", "id") > ('2026-12-01 00:00:00+00'::timestamp with time zone, 'it''s'::uuid) ORDER BY "created_at", "id" LIMIT 10"#
        );
        assert_eq!(
            table.count_sql(
                Some(&condition("x > 1")),
                None,
                Some(&["t".to_owned(), "9".to_owned()])
            ),
            r#"SELECT count(*) FROM "public"."outbox" WHERE (x > 1) AND ("created_at", "id") <= ('t'::timestamp with time zone, '9'::uuid)"#
        );
        assert_eq!(
            table.last_key_sql(Some(&condition("x > 1"))),
            r#"SELECT "created_at", "id" FROM "public"."outbox" WHERE (x > 1) ORDER BY "created_at" DESC, "id" DESC LIMIT 1"#
        );
    }

    #[test]
    fn the_publication_s_row_filter_is_a_condition_of_every_read() {
        let mut table = outbox();
        table.publication_filter = Some("((aggregatetype)::text <> 'Internal'::text)".to_owned());
        let condition = RowCondition::parse("x > 1", crate::row_condition::ConditionSource::Signal)
            .expect("one expression");
        assert_eq!(
            table.chunk_sql(Some(&condition), None, None, 5),
            r#"SELECT "id", "created_at", "id" FROM "public"."outbox" WHERE (((aggregatetype)::text <> 'Internal'::text)) AND (x > 1) ORDER BY "created_at", "id" LIMIT 5"#
        );
        assert!(table
            .count_sql(None, None, None)
            .ends_with(r#"WHERE (((aggregatetype)::text <> 'Internal'::text))"#));
        assert!(table.last_key_sql(None).contains("'Internal'"));
    }

    #[test]
    fn the_order_needs_a_primary_key_and_not_null_columns() {
        let table = TableName::parse("outbox").expect("valid name");
        let types = vec![
            ("id".to_owned(), "bigint".to_owned(), true),
            ("note".to_owned(), "text".to_owned(), false),
        ];
        assert!(order_key(&table, &types, &[], &[]).is_err());
        let message = order_key(&table, &types, &["note".to_owned()], &["id".to_owned()])
            .expect_err("nullable")
            .to_string();
        assert!(message.contains("may be NULL"), "{message}");
        assert!(order_key(&table, &types, &["nope".to_owned()], &["id".to_owned()]).is_err());
        let key = order_key(&table, &types, &["id".to_owned()], &["id".to_owned()]).expect("key");
        assert_eq!(key.len(), 1);
    }
}
