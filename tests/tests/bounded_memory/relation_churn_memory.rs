//! Memory stays flat while the database creates and drops tables under a `FOR ALL TABLES`
//! publication.
//!
//! A publication `FOR ALL TABLES` (Debezium's default, and what a takeover inherits) publishes
//! every table the application ever creates: staging tables created, written once and dropped
//! make pgoutput describe each of them (a `Relation` message) before its row. Siphon keeps a
//! description only while it needs it (the outbox tables and their partitions): the rows of the
//! others are skipped by their relation id. Here a warm-up of 2,000 such tables comes first,
//! then Siphon's resident memory is compared before and after 6,000 more; an outbox event after
//! each phase shows that Siphon read through it, and every event arrives once.

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    event, insert_transaction, siphon_config, start_streaming, wait_for_each_once, OUTBOX_DDL,
};
use siphon_tests::{Broker, Postgres, SiphonProcess};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio_postgres::Client;

/// Tables created and dropped before the first measurement (the allocator settles).
const WARM_UP_TABLES: usize = 2_000;
/// Tables created and dropped between the two measurements.
const TABLES: usize = 6_000;
/// Tables per transaction (created and written in one, dropped in the next).
const BATCH: usize = 200;
/// The growth of resident memory per table that fails the test. Keeping only the outbox
/// tables' descriptions grows 12-47 bytes per table (a fixed 0.1-0.3 MB, the same over 18,000
/// tables); caching every `Relation` message for the whole session would grow about 590 bytes
/// per table (3.5 MB over 6,000 tables).
const MAX_GROWTH_PER_TABLE: f64 = 200.0;

/// Creates tables `from..to` (`stage_<n>`), writes one row into each, then drops them, `BATCH`
/// at a time.
async fn churn(client: &Client, from: usize, to: usize) -> Result<()> {
    let mut start = from;
    while start < to {
        let end = (start + BATCH).min(to);
        client
            .batch_execute(&format!(
                "DO $$ BEGIN FOR i IN {start}..{last} LOOP \
                   EXECUTE format('CREATE TABLE stage_%s (id bigint PRIMARY KEY, body text)', i); \
                   EXECUTE format('INSERT INTO stage_%s VALUES (1, ''staged'')', i); \
                 END LOOP; END $$",
                last = end - 1
            ))
            .await
            .context("creating staging tables")?;
        client
            .batch_execute(&format!(
                "DO $$ BEGIN FOR i IN {start}..{last} LOOP \
                   EXECUTE format('DROP TABLE stage_%s', i); \
                 END LOOP; END $$",
                last = end - 1
            ))
            .await
            .context("dropping staging tables")?;
        start = end;
    }
    Ok(())
}

/// Writes the outbox event `seq`, waits until every event so far arrived once, lets the process
/// settle and returns its resident memory.
async fn event_then_memory(
    client: &mut Client,
    broker: &Broker,
    siphon: &SiphonProcess,
    expected: &mut BTreeSet<String>,
    seq: u64,
) -> Result<u64> {
    let e = event(seq, true);
    insert_transaction(client, std::slice::from_ref(&e), true).await?;
    expected.insert(e.id);
    wait_for_each_once(broker, expected, Duration::from_secs(180))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(siphon.memory()?.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_created_and_dropped_under_a_publication_for_all_tables_do_not_grow_memory(
) -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    client
        .batch_execute("CREATE PUBLICATION churn_pub FOR ALL TABLES")
        .await?;
    let config = siphon_config(&pg, &broker, "churn", "");
    let siphon = start_streaming(&client, &config, "churn").await?;
    let mut expected = BTreeSet::new();

    churn(&client, 0, WARM_UP_TABLES).await?;
    let before = event_then_memory(&mut client, &broker, &siphon, &mut expected, 1).await?;
    let started = std::time::Instant::now();
    churn(&client, WARM_UP_TABLES, WARM_UP_TABLES + TABLES).await?;
    let after = event_then_memory(&mut client, &broker, &siphon, &mut expected, 2).await?;

    let growth = after as f64 - before as f64;
    let per_table = growth / TABLES as f64;
    eprintln!(
        "{TABLES} tables created, written and dropped in {:?}: VmRSS {:.1} MB -> {:.1} MB, \
         {per_table:.0} bytes per table (limit {MAX_GROWTH_PER_TABLE})",
        started.elapsed(),
        before as f64 / 1048576.0,
        after as f64 / 1048576.0,
    );
    assert!(
        per_table < MAX_GROWTH_PER_TABLE,
        "resident memory grew by {per_table:.0} bytes per table created and dropped \
         ({growth:.0} bytes over {TABLES} tables): something is kept per relation"
    );
    assert!(
        siphon.is_running(),
        "siphon stopped; log:\n{}",
        siphon.log()
    );
    Ok(())
}
