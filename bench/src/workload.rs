//! The benchmark's database objects and the SQL that writes outbox events.
//!
//! Everything lives in schema `siphon_bench` (table `siphon_bench.outbox`, Debezium's outbox
//! shape), publication `siphon_bench_pub` and slots named `siphon_bench_*`, so the benchmark
//! can also run against an existing server without touching anything else.
//!
//! Event ids are UUIDs `RRRRRRRR-0000-4000-8000-SSSSSSSSSSSS`: `R` is the run's nonce (hex) and
//! `S` the event's sequence number (decimal), so a reader can tell which event it got.

use anyhow::{Context as _, Result};
use tokio_postgres::Client;

pub const SCHEMA: &str = "siphon_bench";
pub const TABLE: &str = "siphon_bench.outbox";
pub const PUBLICATION: &str = "siphon_bench_pub";
/// The all-operations publication: `publish = 'insert, update, delete'`, what a deployment
/// taking over from Debezium inherits (Debezium creates its publications so).
pub const PUBLICATION_ALL: &str = "siphon_bench_pub_all";

/// The shape of the publication a drain reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `publish = 'insert, update'`, as Siphon creates its own: the outbox's DELETEs do not
    /// cross the wire.
    InsertOnly,
    /// `publish = 'insert, update, delete'`: the DELETE of every outbox row crosses the wire
    /// too, and the client drops it.
    AllOperations,
}

impl Shape {
    pub fn publication(self) -> &'static str {
        match self {
            Shape::InsertOnly => PUBLICATION,
            Shape::AllOperations => PUBLICATION_ALL,
        }
    }

    /// What the tables call it.
    pub fn title(self) -> &'static str {
        match self {
            Shape::InsertOnly => "insert-only publication (publish = 'insert, update', as Siphon creates it)",
            Shape::AllOperations => "all-operations publication (publish = 'insert, update, delete', as Debezium creates it)",
        }
    }

    /// A short name for slots, files and JSON.
    pub fn slug(self) -> &'static str {
        match self {
            Shape::InsertOnly => "insert_only",
            Shape::AllOperations => "all_operations",
        }
    }
}
pub const SLOT_PREFIX: &str = "siphon_bench_";

/// Drops what an earlier run may have left (inactive bench slots, the publications, the
/// schema), then creates the schema, the outbox table and its two publications: the
/// insert-only one, as Siphon creates its own (INSERTs and UPDATEs only, so the outbox's
/// DELETEs do not cross the wire), and the all-operations one ([`Shape::AllOperations`]).
pub async fn prepare(db: &Client) -> Result<()> {
    drop_objects(db).await?;
    db.batch_execute(&format!(
        "CREATE SCHEMA {SCHEMA};
         CREATE TABLE {TABLE} (
             id uuid PRIMARY KEY,
             aggregatetype varchar(255) NOT NULL,
             aggregateid varchar(255) NOT NULL,
             type varchar(255) NOT NULL,
             payload jsonb);
         CREATE PUBLICATION {PUBLICATION} FOR TABLE {TABLE} WITH (publish = 'insert, update');
         CREATE PUBLICATION {PUBLICATION_ALL} FOR TABLE {TABLE} WITH (publish = 'insert, update, delete');"
    ))
    .await
    .context("creating the benchmark's schema, table and publication")
}

/// Drops the benchmark's inactive slots, its publications and its schema.
pub async fn drop_objects(db: &Client) -> Result<()> {
    db.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
         WHERE slot_name LIKE $1 AND NOT active",
        &[&format!("{SLOT_PREFIX}%")],
    )
    .await
    .context("dropping the benchmark's replication slots")?;
    // Every publication named after the bench's (the scaling rounds' too).
    let publications = db
        .query(
            "SELECT pubname::text FROM pg_publication WHERE pubname LIKE $1",
            &[&format!("{PUBLICATION}%")],
        )
        .await
        .context("listing the benchmark's publications")?;
    for row in publications {
        let name: String = row.get(0);
        db.batch_execute(&format!("DROP PUBLICATION IF EXISTS \"{name}\""))
            .await
            .with_context(|| format!("dropping publication {name}"))?;
    }
    db.batch_execute(&format!("DROP SCHEMA IF EXISTS {SCHEMA} CASCADE;"))
        .await
        .context("dropping the benchmark's schema")
}

/// Creates logical slot `name` with pgoutput at the current position.
pub async fn create_slot(db: &Client, name: &str) -> Result<()> {
    db.execute(
        "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
        &[&name],
    )
    .await
    .with_context(|| format!("creating slot {name}"))?;
    Ok(())
}

/// Drops slot `name` if it exists and is not in use.
pub async fn drop_slot(db: &Client, name: &str) -> Result<()> {
    db.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
         WHERE slot_name = $1 AND NOT active",
        &[&name],
    )
    .await
    .with_context(|| format!("dropping slot {name}"))?;
    Ok(())
}

/// The server's current WAL position, as text (`X/Y`) and as a number.
pub async fn current_lsn(db: &Client) -> Result<(String, u64)> {
    let row = db
        .query_one(
            "SELECT pg_current_wal_lsn()::text, (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint",
            &[],
        )
        .await?;
    Ok((row.get(0), u64::try_from(row.get::<_, i64>(1))?))
}

/// The slot's `confirmed_flush_lsn` as a number (0 if the slot or the value is missing).
pub async fn confirmed_lsn(db: &Client, slot: &str) -> Result<u64> {
    let row = db
        .query_opt(
            "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint FROM pg_replication_slots \
             WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    let value = row.and_then(|r| r.get::<_, Option<i64>>(0)).unwrap_or(0);
    Ok(u64::try_from(value).unwrap_or(0))
}

/// A run nonce: 8 hex digits from the clock and the process id.
pub fn run_nonce() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
        .unwrap_or(0);
    format!("{:08x}", nanos ^ std::process::id().rotate_left(16))
}

/// One transaction, as one simple-query string: insert events `first..first+count` (routed
/// by `aggregatetype_sql`, an SQL expression of `n`), then delete those rows by their ids, as
/// an application deletes the outbox rows it just wrote, commit.
///
/// The delete is an index range scan over the transaction's own ids (ids of one run sort by
/// sequence number: the last 12 hex digits are the decimal digits). A `DELETE FROM outbox` of
/// every row would instead scan every dead row left by earlier transactions until a vacuum:
/// each second of a 5,000 events/s load then costs the database more than the one before
/// (1.7 s of a backend per second's writes after 300,000 events), and that growing load, not
/// the pipeline, would set the latency measured.
///
/// Each payload is a ~300-byte JSON order document built from `n`.
pub fn transaction_sql(nonce: &str, aggregatetype_sql: &str, first: u64, count: u64) -> String {
    transaction_sql_into(TABLE, nonce, aggregatetype_sql, first, count)
}

/// [`transaction_sql`] into outbox table `table` (of the outbox's columns).
pub fn transaction_sql_into(
    table: &str,
    nonce: &str,
    aggregatetype_sql: &str,
    first: u64,
    count: u64,
) -> String {
    let last = first + count.saturating_sub(1);
    let first_id = event_id(nonce, first);
    let last_id = event_id(nonce, last);
    format!(
        "BEGIN;
         INSERT INTO {table} (id, aggregatetype, aggregateid, type, payload)
         SELECT ('{nonce}-0000-4000-8000-' || lpad(n::text, 12, '0'))::uuid,
                {aggregatetype_sql},
                'agg-' || (n % 1000),
                'OrderPlaced',
                jsonb_build_object(
                    'orderId', n,
                    'customerId', 'customer-' || (n % 1000),
                    'status', 'PLACED',
                    'amount', round((n % 100000) / 100.0, 2),
                    'lines', jsonb_build_array(
                        jsonb_build_object('sku', 'SKU-' || (n % 5000), 'qty', n % 7 + 1,
                                           'price', (n % 997) / 10.0),
                        jsonb_build_object('sku', 'SKU-' || (n % 4999), 'qty', n % 3 + 1,
                                           'price', (n % 991) / 10.0)),
                    'shipping', jsonb_build_object('street', 'Main Street ' || (n % 500),
                                                   'city', 'Springfield', 'zip', lpad((n % 99999)::text, 5, '0')))
           FROM generate_series({first}::bigint, {last}::bigint) AS n;
         DELETE FROM {table} WHERE id BETWEEN '{first_id}' AND '{last_id}';
         COMMIT;"
    )
}

/// The id of event `seq` written with `nonce` (the SQL of [`transaction_sql`] builds the same).
pub fn event_id(nonce: &str, seq: u64) -> String {
    format!("{nonce}-0000-4000-8000-{seq:012}")
}

/// The sequence number of an event id written with `nonce`, if it is one.
pub fn seq_of(nonce: &str, id: &str) -> Option<u64> {
    let rest = id.strip_prefix(nonce)?.strip_prefix("-0000-4000-8000-")?;
    rest.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        assert_eq!(
            seq_of("0a1b2c3d", "0a1b2c3d-0000-4000-8000-000000001234"),
            Some(1234)
        );
        assert_eq!(
            seq_of("0a1b2c3d", "ffffffff-0000-4000-8000-000000001234"),
            None
        );
        assert_eq!(run_nonce().len(), 8);
        assert_eq!(seq_of("0a1b2c3d", &event_id("0a1b2c3d", 1234)), Some(1234));
        // Ids sort by sequence number, so a transaction's ids are one range.
        assert!(event_id("0a1b2c3d", 999) < event_id("0a1b2c3d", 1000));
    }
}
