//! A long silent decode is not a stall: while PostgreSQL decodes a transaction of millions of rows
//! on a table outside the publication (as it is written, then its commit; or all of it when
//! Siphon restarts behind it), the stream carries nothing, for far longer than
//! `stall_timeout_secs = 1`. Siphon asks the server, sees the walsender working, keeps the
//! connection, and the outbox events written afterwards arrive. The other side: a connection
//! that carries nothing is a stall, and a start of replication never answered is tried again.

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    event, insert_transaction, siphon_config, slot_active, start_streaming, wait_for_each_once,
    Event, OUTBOX_DDL,
};
use siphon_tests::proxy::ThrottlingProxy;
use siphon_tests::{siphon_bin, wait_until, Broker, Postgres, SiphonProcess};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Rows of the transaction on the other table: about 700 MB of WAL, some 15 s to write and
/// several more to decode here.
const ROWS: i64 = 4_000_000;

/// One transaction of [`ROWS`] rows into the table outside the publication, ids from `first`.
async fn insert_rows(client: &tokio_postgres::Client, first: i64) -> Result<()> {
    client
        .execute(
            "INSERT INTO busy SELECT g, md5(g::text) FROM generate_series($1::bigint, $2::bigint) g",
            &[&first, &(first + ROWS - 1)],
        )
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_decode_of_another_table_is_not_taken_for_a_stall() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    client
        .batch_execute("CREATE TABLE busy (id bigint, filler text)")
        .await?;
    let config = siphon_config(&pg, &broker, "silent", "").replace(
        "status_interval_ms = 200\n",
        "status_interval_ms = 200\nstall_timeout_secs = 1\n",
    );
    anyhow::ensure!(config.contains("stall_timeout_secs = 1"));
    // The stall checks' verdicts are logged at debug level.
    let siphon = SiphonProcess::start_with(
        &siphon_bin()?,
        &config,
        &[("RUST_LOG", "info,siphon_source::stream=debug")],
    )?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "silent").await },
    )
    .await
    .with_context(|| format!("siphon did not start streaming; log:\n{}", siphon.log()))?;
    let before: Vec<Event> = (1..=10).map(|s| event(s, true)).collect();
    insert_transaction(&mut client, &before, true).await?;
    let mut expected: BTreeSet<String> = before.iter().map(|e| e.id.clone()).collect();
    wait_for_each_once(&broker, &expected, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;

    // While Siphon streams: the transaction is decoded as it is written, then its commit.
    let started = Instant::now();
    insert_rows(&client, 1).await?;
    let written_in = started.elapsed();
    let after: Vec<Event> = (11..=30).map(|s| event(s, true)).collect();
    insert_transaction(&mut client, &after, true).await?;
    expected.extend(after.iter().map(|e| e.id.clone()));
    wait_for_each_once(&broker, &expected, Duration::from_secs(90))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    let delivered_in = started.elapsed();

    // While Siphon is stopped: on restart the walsender catches up on all of it in silence.
    siphon.terminate()?;
    siphon.wait_exit(Duration::from_secs(30))?;
    insert_rows(&client, ROWS + 1).await?;
    let later: Vec<Event> = (31..=50).map(|s| event(s, true)).collect();
    insert_transaction(&mut client, &later, true).await?;
    expected.extend(later.iter().map(|e| e.id.clone()));
    let restarted = Instant::now();
    siphon.start_again()?;
    wait_for_each_once(&broker, &expected, Duration::from_secs(90))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    let caught_up_in = restarted.elapsed();

    let log = siphon.log();
    let stalls = log.lines().filter(|l| l.contains("stalled:")).count();
    let reconnects = log
        .lines()
        .filter(|l| l.contains("pipeline interrupted; reconnecting"))
        .count();
    let busy_checks = log
        .lines()
        .filter(|l| l.contains("not stalled") && l.contains("walsender"))
        .count();
    eprintln!(
        "{ROWS} rows written in {written_in:?}, the events after them delivered {delivered_in:?} after \
         the start; after a restart behind {ROWS} more, all delivered in {caught_up_in:?}; \
         {busy_checks} silent checks judged not stalled, {stalls} stall(s), {reconnects} reconnect(s)"
    );
    assert_eq!(stalls, 0, "no stall was declared:\n{log}");
    assert_eq!(reconnects, 0, "the connection was kept:\n{log}");
    assert!(
        busy_checks > 0,
        "the silent stream was checked with the server:\n{log}"
    );
    assert!(siphon.is_running());
    Ok(())
}

/// The other side: a replication connection that is really broken (every byte between Siphon
/// and PostgreSQL held by a paused proxy) is still found stalled, and Siphon recovers once the
/// path is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_carries_nothing_is_still_a_stall() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let proxy = ThrottlingProxy::start(format!("127.0.0.1:{}", pg.port()).parse()?)?;
    let config = siphon_config(&pg, &broker, "cut", "")
        .replace(
            "status_interval_ms = 200\n",
            "status_interval_ms = 200\nstall_timeout_secs = 2\n",
        )
        .replace(&format!("127.0.0.1:{}", pg.port()), &proxy.address());
    let siphon = start_streaming(&client, &config, "cut").await?;
    // The slot is taken before Siphon reads the server's answer: paused in between, this
    // would test the start's timeout instead (a_replication_start_that_is_never_answered_…).
    siphon
        .wait_for_log("streaming", Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;

    proxy.pause();
    let first: Vec<Event> = (1..=10).map(|s| event(s, true)).collect();
    insert_transaction(&mut client, &first, true).await?;
    siphon
        .wait_for_log("replication connection stalled", Duration::from_secs(60))
        .await?;
    proxy.resume();
    let later: Vec<Event> = (11..=20).map(|s| event(s, true)).collect();
    insert_transaction(&mut client, &later, true).await?;
    let expected: BTreeSet<String> = first.iter().chain(&later).map(|e| e.id.clone()).collect();
    wait_for_each_once(&broker, &expected, Duration::from_secs(90))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    let log = siphon.log();
    let stall = log
        .lines()
        .find(|l| l.contains("replication connection stalled"))
        .unwrap_or_default();
    eprintln!("{stall}");
    assert!(siphon.is_running());
    Ok(())
}

/// A path that black-holes right after the server took the slot (`START_REPLICATION` passed
/// on, its answer held): the start is given up at the connect timeout and tried again, so the
/// session neither hangs before its stall checks run nor keeps the slot's WAL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replication_start_that_is_never_answered_is_tried_again() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let proxy = ThrottlingProxy::start(format!("127.0.0.1:{}", pg.port()).parse()?)?;
    let direct = format!("127.0.0.1:{}/siphon", pg.port());
    let config = siphon_config(&pg, &broker, "unanswered", "").replace(
        &direct,
        &format!("{}/siphon?connect_timeout=3", proxy.address()),
    );
    proxy.pause_after_client_sends(b"START_REPLICATION");
    let siphon = SiphonProcess::start(&config)?;
    siphon
        .wait_for_log(
            "did not answer the start of replication within 3 s",
            Duration::from_secs(60),
        )
        .await
        .with_context(|| siphon.log())?;
    proxy.resume();
    let events: Vec<Event> = (1..=10).map(|s| event(s, true)).collect();
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { slot_active(&client, "unanswered").await },
    )
    .await
    .with_context(|| siphon.log())?;
    insert_transaction(&mut client, &events, true).await?;
    let expected: BTreeSet<String> = events.iter().map(|e| e.id.clone()).collect();
    wait_for_each_once(&broker, &expected, Duration::from_secs(90))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    assert!(siphon.is_running());
    Ok(())
}
