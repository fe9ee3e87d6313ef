//! Memory stays bounded by bytes while large records are held through producer replacements.
//!
//! The Kafka-mode fault proxy answers every Produce of the outbox topic with
//! `PRODUCER_FENCED` for a while: each batch fails the producer, so the session fences, purges,
//! replaces the producer (backing off) and sends the same records again, over and over, with a
//! full window of 512 KB records taken back from the failed producers and held meanwhile. The
//! peak RSS of the siphon process must stay within a few in-flight windows (see
//! [`WINDOWS_HELD`]) plus the read-ahead and the fixed overhead of `read_ahead.rs`, far below the
//! backlog, and once the broker takes the records every event arrives, first deliveries in
//! commit order per key. (A repeat is allowed: the fault may be lifted while a failed
//! producer's request is on its way, which the broker then writes although the producer's purge
//! reported it undelivered, so its records are sent again: at-least-once delivery.)

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    check_first_deliveries_in_order, event, insert_large_rows, phantom_ids, siphon_config_at,
    start_streaming, wait_for_all, OUTBOX_DDL,
};
use siphon_tests::proxy::{ProduceFault, ProxiedBroker};
use siphon_tests::Postgres;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Rows of 512 KB each: 100 MB of backlog.
const ROWS: i64 = 200;
const ROW_BYTES: i64 = 512 * 1024;
/// The in-flight window (`pipeline.max_in_flight_bytes`).
const WINDOW_BYTES: u64 = 8 * 1024 * 1024;
/// What the process may hold beyond the windows below, as in `read_ahead.rs`: code, runtime
/// and client buffers, the rows read ahead of the window (at most one more window plus 6 rows)
/// and the allocator's slack.
const FIXED_OVERHEAD_BYTES: u64 = 48 * 1024 * 1024;
/// Windows of record bytes the process may hold at once through replacements: the records in
/// the producer (librdkafka's copy), the copies taken back from a failed producer, and the
/// freed copies the C library's allocator keeps in the arenas of the current and the retired
/// producer's delivery threads (one arena per thread: about 53 MB of peak RSS here with the
/// fixed mmap threshold, 70-74 MB with glibc's defaults), and one window of margin for
/// run-to-run variation. The backlog is 12.5 windows: without the byte window the peak would
/// be about 148 MB.
const WINDOWS_HELD: u64 = 5;
/// `PRODUCER_FENCED`: fails the producer's batch and, with gap-less idempotence, the producer.
const PRODUCER_FENCED: i16 = 90;
/// Replacements to sit through before the broker takes records again.
const REPLACEMENTS: usize = 4;
/// The log line Siphon writes each time it replaces its producer.
const REBUILD_LINE: &str = "Kafka producer failed; replacing it";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_records_held_through_producer_replacements_stay_within_the_byte_window() -> Result<()>
{
    let pg = Postgres::start()?;
    let broker = ProxiedBroker::start_kafka_aware()?;
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let config = siphon_config_at(
        &pg,
        &broker,
        "heldmem",
        "\"message.timeout.ms\" = \"120000\"",
        &format!("max_in_flight_bytes = {WINDOW_BYTES}"),
    );
    let siphon = start_streaming(&client, &config, "heldmem").await?;
    let (rss_before, _) = siphon.memory()?;

    broker.proxy().set_produce_fault(Some(ProduceFault::new(
        &broker.topic("outbox.event.Order"),
        PRODUCER_FENCED,
    )));
    insert_large_rows(&client, 20, ROW_BYTES as i32).await?;
    // The refused window is taken back and sent again on each new producer.
    let start = Instant::now();
    let mut rss_peak_sampled = 0;
    while siphon.log().matches(REBUILD_LINE).count() < REPLACEMENTS {
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(40),
            "fewer than {REPLACEMENTS} producer replacements; log:\n{}",
            siphon.log()
        );
        anyhow::ensure!(
            siphon.is_running(),
            "siphon stopped; log:\n{}",
            siphon.log()
        );
        rss_peak_sampled = rss_peak_sampled.max(siphon.memory()?.0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let replacements = siphon.log().matches(REBUILD_LINE).count();
    let refused = broker.proxy().faults_injected();
    let (_, peak_while_refused) = siphon.memory()?;

    broker.proxy().set_produce_fault(None);
    let expected: BTreeSet<String> = (1..=ROWS as u64).map(|s| event(s, true).id).collect();
    let records = wait_for_all(&broker, &expected, Duration::from_secs(120))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    let phantom = phantom_ids(&records, &expected);
    anyhow::ensure!(phantom.is_empty(), "events never written: {phantom:?}");
    check_first_deliveries_in_order(&records)?;
    let (_, peak) = siphon.memory()?;

    let bound = WINDOWS_HELD * WINDOW_BYTES + FIXED_OVERHEAD_BYTES;
    let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
    eprintln!(
        "{ROWS} rows of {} KB, {refused} Produce requests refused, {replacements} producer \
         replacements in {:.1} s, {} records read: VmRSS before {:.1} MB, VmHWM {:.1} MB while \
         refused, {:.1} MB at the end; bound {:.0} MB ({WINDOWS_HELD} x {:.0} MB window + {:.0} \
         MB fixed)",
        ROW_BYTES / 1024,
        start.elapsed().as_secs_f64(),
        records.len(),
        mb(rss_before),
        mb(peak_while_refused.max(rss_peak_sampled)),
        mb(peak),
        mb(bound),
        mb(WINDOW_BYTES),
        mb(FIXED_OVERHEAD_BYTES)
    );
    assert!(
        peak <= bound,
        "peak RSS {:.1} MB exceeds {WINDOWS_HELD} windows plus the fixed overhead ({:.0} MB)",
        mb(peak),
        mb(bound)
    );
    assert!(siphon.is_running(), "{}", siphon.log());
    Ok(())
}
