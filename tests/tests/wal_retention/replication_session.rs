//! The replication session itself, against a real PostgreSQL: while the pipeline takes no
//! events (its window is full of records the broker does not answer), Siphon stops taking
//! events from the stream but does not let its session time out: status updates keep reaching
//! the walsender.

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    event, insert_transaction, siphon_config_at, start_streaming, OUTBOX_DDL,
};
use siphon_tests::proxy::{ProduceFault, ProxiedBroker};
use siphon_tests::{read_topic_async, wait_for, Postgres};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio_postgres::Client;

/// The ids (the `id` header) of the records of `outbox.event.Order`.
async fn order_ids(broker: &ProxiedBroker) -> Result<BTreeSet<String>> {
    let records = read_topic_async(
        &broker.bootstrap(),
        &broker.topic("outbox.event.Order"),
        Duration::from_secs(60),
    )
    .await?;
    Ok(records
        .iter()
        .map(|r| String::from_utf8_lossy(r.header("id").unwrap_or_default()).into_owned())
        .collect())
}

/// The pid of the walsender streaming from `slot`.
async fn walsender(client: &Client, slot: &str) -> Result<Option<i32>> {
    Ok(client
        .query_one(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?
        .get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_pipeline_keeps_its_replication_session_alive() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = ProxiedBroker::start_kafka_aware()?;
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    // The walsender ends a session that sends no status update for this long.
    client
        .batch_execute("ALTER SYSTEM SET wal_sender_timeout = '2s'")
        .await?;
    client.batch_execute("SELECT pg_reload_conf()").await?;
    let config = siphon_config_at(
        &pg,
        &broker,
        "paused",
        "\"message.timeout.ms\" = \"120000\"",
        // A window of 5 records and a read-ahead of 2 KiB: both fill long before the events
        // below are all read.
        "max_in_flight_records = 5\nmax_in_flight_bytes = 2048",
    );
    let siphon = start_streaming(&client, &config, "paused").await?;
    insert_transaction(&mut client, &[event(1, true)], true).await?;
    let first = BTreeSet::from([event(1, true).id]);
    wait_for(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { Ok(order_ids(&broker).await?.is_superset(&first).then_some(())) },
    )
    .await?;

    // The broker stops answering (its Produce requests are held) and more events than the
    // window holds are committed: the pipeline stops taking events from the stream.
    broker.proxy().set_produce_fault(Some(ProduceFault::hold(
        &broker.topic("outbox.event.Order"),
    )));
    // Sequence numbers that are not multiples of 3 are `Order` events.
    let seqs: Vec<u64> = (2u64..=40).filter(|s| s % 3 != 0).collect();
    for &seq in &seqs {
        insert_transaction(&mut client, &[event(seq, true)], true).await?;
    }
    let before = walsender(&client, "paused")
        .await?
        .context("no walsender for the slot")?;
    // Five walsender timeouts: without status updates the session would end (and a new
    // walsender would serve the reconnection).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = walsender(&client, "paused").await?;
    assert_eq!(
        after,
        Some(before),
        "the replication session was ended while the pipeline was paused; log:\n{}",
        siphon.log()
    );
    assert!(
        !siphon.log().contains("replication timeout"),
        "log:\n{}",
        siphon.log()
    );

    assert!(broker.proxy().held_requests() > 0, "no request was held");
    broker.proxy().set_produce_fault(None);
    tokio::task::block_in_place(|| broker.proxy().release_held(Duration::from_secs(10)))?;
    let mut expected: BTreeSet<String> = seqs.iter().map(|&s| event(s, true).id).collect();
    expected.extend(first);
    wait_for(
        Duration::from_secs(120),
        Duration::from_millis(500),
        || async {
            Ok(order_ids(&broker)
                .await?
                .is_superset(&expected)
                .then_some(()))
        },
    )
    .await
    .with_context(|| format!("not every event arrived; log:\n{}", siphon.log()))?;
    Ok(())
}
