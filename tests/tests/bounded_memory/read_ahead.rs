//! Memory stays bounded by bytes with large rows: a backlog of 512 KB outbox rows behind a
//! broker that takes nothing does not pile up in the replication client's read-ahead. The peak
//! RSS of the siphon process stays within the in-flight window plus a fixed overhead, and once
//! the broker answers again every event arrives, once.
//!
//! The broker stops answering a Siphon that already delivers (its producer connected, its topic
//! known): a broker stopped while the producer is still being set up makes the client time its
//! connection set-up out, which is another fault, with its own repeats.

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    event, insert_large_rows, insert_transaction, siphon_config_at, start_streaming,
    wait_for_each_once, OUTBOX_DDL,
};
use siphon_tests::proxy::ProxiedBroker;
use siphon_tests::Postgres;
use std::collections::BTreeSet;
use std::time::Duration;

/// Rows of 512 KB each: 100 MB of backlog.
const ROWS: i64 = 200;
const ROW_BYTES: i64 = 512 * 1024;
/// The in-flight window (`pipeline.max_in_flight_bytes`).
const WINDOW_BYTES: u64 = 8 * 1024 * 1024;
/// What the process may hold beyond the window: its code, runtime, librdkafka's and the SQL
/// client's buffers (25-30 MB of RSS when idle here), the rows read ahead of the window (at
/// most one more window: 8 MB, plus 6 rows inside the replication client: 3 MB) and the
/// allocator's slack. A read-ahead not bounded by bytes would read the whole 100 MB backlog
/// ahead, far above the bound.
const FIXED_OVERHEAD_BYTES: u64 = 48 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_rows_behind_a_stopped_broker_stay_within_the_byte_window() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = ProxiedBroker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let config = siphon_config_at(
        &pg,
        &broker,
        "large",
        "\"message.timeout.ms\" = \"120000\"",
        &format!("max_in_flight_bytes = {WINDOW_BYTES}"),
    );
    let siphon = start_streaming(&client, &config, "large").await?;
    // One small `Order` event (sequence numbers after the large rows') delivered first.
    let first = event(ROWS as u64 + 2, true);
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
    // 200 rows of 512 KB in 20 transactions.
    insert_large_rows(&client, 20, ROW_BYTES as i32).await?;
    // Long enough for the stream to read whatever it would read ahead.
    let mut peak = 0;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        peak = peak.max(siphon.memory()?.1);
    }
    let bound = WINDOW_BYTES + FIXED_OVERHEAD_BYTES;
    let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
    eprintln!(
        "{ROWS} rows of {} KB ({:.0} MB) behind a stopped broker: VmRSS before {:.1} MB, VmHWM {:.1} MB; \
         bound {:.0} MB (window {:.0} MB + {:.0} MB fixed)",
        ROW_BYTES / 1024,
        mb((ROWS * ROW_BYTES) as u64),
        mb(rss_before),
        mb(peak),
        mb(bound),
        mb(WINDOW_BYTES),
        mb(FIXED_OVERHEAD_BYTES)
    );
    assert!(
        peak <= bound,
        "peak RSS {:.1} MB exceeds the window plus the fixed overhead ({:.0} MB)",
        mb(peak),
        mb(bound)
    );

    eprintln!("the broker answered nothing for {:?}", paused.elapsed());
    broker.proxy().resume();
    let mut expected: BTreeSet<String> = (1..=ROWS as u64).map(|s| event(s, true).id).collect();
    expected.insert(first.id);
    wait_for_each_once(&broker, &expected, Duration::from_secs(120))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    assert!(siphon.is_running());
    Ok(())
}
