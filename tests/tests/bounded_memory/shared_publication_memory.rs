//! Memory stays bounded by the window when the publication carries more than the outbox.
//!
//! A publication `FOR ALL TABLES` (a takeover from Debezium, or a publication shared with other
//! consumers) streams the rows of every table: Siphon reads and drops them. Here each of 600
//! transactions writes a 130 KB row into one of 300 other tables and one outbox row, behind a
//! broker that takes nothing. The stream is then about 80 MB of other tables' rows around
//! 600 small outbox records and 300 `Relation` messages of the other tables.
//!
//! Nothing Siphon keeps for long may hold on to the receive buffer a message was read into: a
//! record key cut out of its row, or a cached relation's names, would keep a whole buffer
//! (128 KB or more) alive per record or per table, outside the byte window. The peak RSS must
//! stay within the window plus the fixed overhead of `read_ahead.rs`, and once the broker
//! answers every event arrives once. As in `read_ahead.rs`, the broker stops answering a Siphon
//! that already delivers (its producer connected, its topic known).

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    event, insert_transaction, siphon_config_at, start_streaming, wait_for_each_once, OUTBOX_DDL,
};
use siphon_tests::proxy::ProxiedBroker;
use siphon_tests::Postgres;
use std::collections::BTreeSet;
use std::time::Duration;

/// Tables besides the outbox, all in the publication.
const OTHER_TABLES: usize = 300;
/// Transactions, each with one row of another table and one outbox row.
const TRANSACTIONS: usize = 600;
/// Bytes of each other table's row: more than one receive buffer.
const OTHER_ROW_BYTES: i32 = 130_000;
/// The in-flight window (`pipeline.max_in_flight_bytes`).
const WINDOW_BYTES: u64 = 8 * 1024 * 1024;
/// What the process may hold beyond the window, as in `read_ahead.rs`. A healthy process peaks
/// at 27-39 MB; one whose outbox records (their keys) and cached relations (their names) kept
/// the buffer they were received into would reach about 89 MB.
const FIXED_OVERHEAD_BYTES: u64 = 48 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_other_tables_in_the_publication_do_not_stay_in_memory() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = ProxiedBroker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let others: String = (0..OTHER_TABLES)
        .map(|t| format!("CREATE TABLE other_{t} (id bigint PRIMARY KEY, body text);\n"))
        .collect();
    client.batch_execute(&others).await?;
    client
        .batch_execute("CREATE PUBLICATION shared_pub FOR ALL TABLES")
        .await?;
    let config = siphon_config_at(
        &pg,
        &broker,
        "shared",
        "\"message.timeout.ms\" = \"120000\"",
        &format!("max_in_flight_bytes = {WINDOW_BYTES}"),
    );
    let siphon = start_streaming(&client, &config, "shared").await?;
    // One `Order` event (a sequence number after the transactions') delivered first.
    let first = event(TRANSACTIONS as u64 + 1, true);
    insert_transaction(&mut client, std::slice::from_ref(&first), true).await?;
    wait_for_each_once(
        &broker,
        &BTreeSet::from([first.id.clone()]),
        Duration::from_secs(60),
    )
    .await
    .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    let (rss_before, _) = siphon.memory()?;

    broker.proxy().pause();
    let paused = std::time::Instant::now();
    for seq in 1..=TRANSACTIONS {
        let other = format!("other_{}", seq % OTHER_TABLES);
        client
            .execute(
                &format!(
                    "WITH other AS (INSERT INTO {other} (id, body) VALUES ($1, repeat('x', $2))) \
                     INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
                     VALUES (format('00000000-0000-4000-8000-%s', lpad($1::text, 12, '0'))::uuid, \
                             'Order', 'order-' || $1, 'Event', jsonb_build_object('seq', $1))"
                ),
                &[&(seq as i64), &OTHER_ROW_BYTES],
            )
            .await?;
    }
    // Long enough for the stream to read all of it: the records wait in the window.
    let mut peak = 0;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        peak = peak.max(siphon.memory()?.1);
    }
    let bound = WINDOW_BYTES + FIXED_OVERHEAD_BYTES;
    let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
    eprintln!(
        "{TRANSACTIONS} outbox rows among {:.0} MB of {OTHER_TABLES} other tables' rows behind a \
         stopped broker: VmRSS before {:.1} MB, VmHWM {:.1} MB; bound {:.0} MB",
        mb(TRANSACTIONS as u64 * OTHER_ROW_BYTES as u64),
        mb(rss_before),
        mb(peak),
        mb(bound),
    );
    assert!(
        peak <= bound,
        "peak RSS {:.1} MB exceeds the window plus the fixed overhead ({:.0} MB): something \
         kept its receive buffer",
        mb(peak),
        mb(bound)
    );

    eprintln!("the broker answered nothing for {:?}", paused.elapsed());
    broker.proxy().resume();
    let mut expected: BTreeSet<String> = (1..=TRANSACTIONS as u64)
        .map(|s| event(s, true).id)
        .collect();
    expected.insert(first.id);
    wait_for_each_once(&broker, &expected, Duration::from_secs(120))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    assert!(
        siphon.is_running(),
        "siphon stopped; log:\n{}",
        siphon.log()
    );
    Ok(())
}
