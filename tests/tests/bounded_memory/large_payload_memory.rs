//! Memory with large payloads at the default settings, without any tuning of the environment:
//! a backlog of 600 outbox rows of 512 KB (300 MB) behind a broker that takes nothing (the
//! proxy paused), with the default in-flight window (`pipeline.max_in_flight_bytes`, 32 MiB),
//! then drained once the broker answers again. Every event arrives, once; the test prints how
//! long the drain took.
//!
//! The bound is 72 MB of peak RSS for the release binary, which idles at about 20 MB here:
//! the test bounds what the backlog adds to the idle process ([`GROWTH_BOUND_BYTES`]), so it
//! holds the debug binary the test command builds (which idles at about 32 MB) to the same
//! bound. It refuses to run with allocator variables in its environment (`MALLOC_*`,
//! `GLIBC_TUNABLES`), which Siphon would inherit.
//!
//! What the bound guards: the stream's read-ahead is at most 4 MiB (`READ_AHEAD_MAX_BYTES`
//! in `crates/siphon/src/settings.rs`), and glibc's mmap threshold is fixed
//! (`crates/siphon/src/alloc.rs`) so that freed record memory does not stay resident during
//! the drain. A read-ahead of one more window of undecoded rows (32 MiB) together with a
//! raised mmap threshold takes the release binary to 85-93 MB, above the bound. The C allocator's
//! per-thread arenas play no part (`MALLOC_ARENA_MAX` changes nothing). The threshold is
//! 1 MiB, so records of 512 KB come from the heap: a healthy release binary peaks at about
//! 58 MB while the broker takes nothing and 64 MB at the end of the drain (the debug binary
//! grows 39-43 MB), below 72 MB.

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    event, insert_large_rows, insert_transaction, siphon_config_at, start_streaming,
    wait_for_each_once, OUTBOX_DDL,
};
use siphon_tests::proxy::ProxiedBroker;
use siphon_tests::Postgres;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Rows of 512 KB each, in transactions of 10: 300 MB of backlog.
const ROWS: i64 = 600;
const ROW_BYTES: i64 = 512 * 1024;
/// The peak RSS bound for the release binary.
const BOUND_BYTES: u64 = 72 * 1024 * 1024;
/// The release binary's RSS when idle (19.6-20.9 MB here).
const RELEASE_IDLE_BYTES: u64 = 20 * 1024 * 1024;
/// What the backlog may add to the idle process.
const GROWTH_BOUND_BYTES: u64 = BOUND_BYTES - RELEASE_IDLE_BYTES;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_payloads_behind_a_stopped_broker_stay_under_72_mb_at_the_default_window(
) -> Result<()> {
    let tuning: Vec<String> = std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("MALLOC_") || k == "GLIBC_TUNABLES")
        .collect();
    anyhow::ensure!(
        tuning.is_empty(),
        "unset {tuning:?}: this test measures Siphon without allocator tuning"
    );
    let pg = Postgres::start()?;
    let broker = ProxiedBroker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    // The default window: no `max_in_flight_bytes`.
    let config = siphon_config_at(
        &pg,
        &broker,
        "largemem",
        "\"message.timeout.ms\" = \"300000\"",
        "",
    );
    let siphon = start_streaming(&client, &config, "largemem").await?;
    // One small `Order` event (sequence numbers after the large rows') delivered first, so the
    // producer is connected and the topic known when the broker stops answering.
    let first = event(ROWS as u64 + 2, true);
    insert_transaction(&mut client, std::slice::from_ref(&first), true).await?;
    wait_for_each_once(
        &broker,
        &BTreeSet::from([first.id.clone()]),
        Duration::from_secs(60),
    )
    .await
    .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    let (rss_idle, _) = siphon.memory()?;

    broker.proxy().pause();
    let paused = Instant::now();
    insert_large_rows(&client, ROWS / 10, ROW_BYTES as i32).await?;
    // Long enough for the stream to read whatever it would read ahead.
    let mut peak_stopped = 0;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        peak_stopped = peak_stopped.max(siphon.memory()?.1);
    }
    eprintln!("the broker answered nothing for {:?}", paused.elapsed());
    broker.proxy().resume();
    let resumed = Instant::now();
    let mut expected: BTreeSet<String> = (1..=ROWS as u64).map(|s| event(s, true).id).collect();
    expected.insert(first.id);
    wait_for_each_once(&broker, &expected, Duration::from_secs(180))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    let drained = resumed.elapsed();
    let (_, peak) = siphon.memory()?;
    assert!(siphon.is_running());

    let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
    eprintln!(
        "{ROWS} rows of {} KB ({:.0} MB) behind a stopped broker, default window: VmRSS idle \
         {:.1} MB, VmHWM {:.1} MB while stopped, {:.1} MB after the drain ({:.1} s); growth \
         {:.1} MB, bound {:.0} MB ({:.0} MB in all for a release binary idle at {:.0} MB)",
        ROW_BYTES / 1024,
        mb((ROWS * ROW_BYTES) as u64),
        mb(rss_idle),
        mb(peak_stopped),
        mb(peak),
        drained.as_secs_f64(),
        mb(peak.saturating_sub(rss_idle)),
        mb(GROWTH_BOUND_BYTES),
        mb(BOUND_BYTES),
        mb(RELEASE_IDLE_BYTES),
    );
    assert!(
        peak.saturating_sub(rss_idle) <= GROWTH_BOUND_BYTES,
        "peak RSS {:.1} MB is {:.1} MB above the idle {:.1} MB, more than {:.0} MB",
        mb(peak),
        mb(peak.saturating_sub(rss_idle)),
        mb(rss_idle),
        mb(GROWTH_BOUND_BYTES)
    );
    Ok(())
}
