//! Poison rows and records go to the dead-letter topic with headers naming the error, and the
//! pipeline goes on; with the default policy they stop Siphon instead (never a silent skip).

use anyhow::{Context, Result};
use siphon_tests::outbox::{current_insert_lsn, siphon_config, slot_active, wait_for_slot_past};
use siphon_tests::{
    read_topic_async, wait_for, wait_until, Broker, ConsumedRecord, Postgres, SiphonProcess,
};
use std::time::Duration;

/// An outbox whose routing column may be NULL (so a row can be unroutable).
const LENIENT_OUTBOX: &str = "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload jsonb)";

fn header(record: &ConsumedRecord, name: &str) -> String {
    String::from_utf8_lossy(record.header(name).unwrap_or_default()).into_owned()
}

async fn write_rows(client: &tokio_postgres::Client) -> Result<()> {
    let big = format!("{{\"blob\": \"{}\"}}", "x".repeat(30_000));
    client
        .batch_execute(&format!(
            "BEGIN;
             INSERT INTO outbox VALUES ('00000000-0000-4000-8000-000000000001', 'Order', 'order-1', 'Created', '{{\"n\": 1}}');
             INSERT INTO outbox VALUES ('00000000-0000-4000-8000-000000000002', NULL, 'order-2', 'Created', '{{\"n\": 2}}');
             INSERT INTO outbox VALUES ('00000000-0000-4000-8000-000000000003', 'Order', 'order-3', 'Created', '{big}');
             INSERT INTO outbox VALUES ('00000000-0000-4000-8000-000000000004', 'Order', 'order-1', 'Shipped', '{{\"n\": 4}}');
             DELETE FROM outbox;
             COMMIT;"
        ))
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_rows_and_records_are_dead_lettered_and_the_pipeline_goes_on() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(LENIENT_OUTBOX).await?;
    let dead_letter_topic = broker.topic("outbox.dlq");
    let extra = format!("on_error = \"dead-letter\"\ndead_letter_topic = \"{dead_letter_topic}\"");
    let config = siphon_config(&pg, &broker, "dlq", &extra).replace(
        "\"message.timeout.ms\" = \"10000\"",
        "\"message.timeout.ms\" = \"10000\"\n\"message.max.bytes\" = \"20000\"",
    );
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "dlq").await },
    )
    .await?;
    write_rows(&client).await?;
    let end = current_insert_lsn(&client).await?;

    let dead = wait_for(
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            let r = read_topic_async(
                &broker.bootstrap(),
                &dead_letter_topic,
                Duration::from_secs(20),
            )
            .await?;
            Ok((r.len() >= 2).then_some(r))
        },
    )
    .await
    .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    assert_eq!(dead.len(), 2);
    let routed = read_topic_async(
        &broker.bootstrap(),
        &broker.topic("outbox.event.Order"),
        Duration::from_secs(20),
    )
    .await?;
    let ids: Vec<String> = routed.iter().map(|r| header(r, "id")).collect();
    assert_eq!(ids.len(), 2, "the good rows arrive: {ids:?}");

    let unroutable = dead
        .iter()
        .find(|r| header(r, "siphon.error.stage") == "route")
        .context("route-stage dead letter")?;
    assert!(
        header(unroutable, "siphon.error.message").contains("aggregatetype"),
        "{}",
        header(unroutable, "siphon.error.message")
    );
    assert_eq!(header(unroutable, "siphon.source.table"), "public.outbox");
    assert!(header(unroutable, "siphon.source.lsn").contains('/'));
    let row: serde_json::Value =
        serde_json::from_slice(unroutable.value.as_deref().unwrap_or_default())?;
    assert_eq!(row["id"], "00000000-0000-4000-8000-000000000002");
    assert_eq!(row["aggregatetype"], serde_json::Value::Null);
    assert_eq!(row["payload"], "{\"n\": 2}");

    let refused = dead
        .iter()
        .find(|r| header(r, "siphon.error.stage") == "produce")
        .context("produce-stage dead letter")?;
    assert_eq!(
        header(refused, "siphon.original.topic"),
        broker.topic("outbox.event.Order")
    );
    assert_eq!(
        header(refused, "id"),
        "00000000-0000-4000-8000-000000000003"
    );
    assert_eq!(refused.key.as_deref(), Some(&b"\"order-3\""[..]));
    assert!(header(refused, "siphon.error.message").contains("message.max.bytes"));
    assert_eq!(refused.value, None, "the oversized value is left out");
    assert!(!header(refused, "siphon.error.omitted").is_empty());

    // The transaction is confirmed once its dead letters are acknowledged.
    wait_for_slot_past(&client, "dlq", end, Duration::from_secs(30)).await?;
    assert!(siphon.is_running());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_poison_row_stops_siphon_naming_the_fix() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(LENIENT_OUTBOX).await?;
    let siphon = SiphonProcess::start(&siphon_config(&pg, &broker, "strict", ""))?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "strict").await },
    )
    .await?;
    write_rows(&client).await?;
    let status = siphon.wait_exit(Duration::from_secs(60))?;
    let log = siphon.log();
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("aggregatetype") && log.contains("on_error = \"dead-letter\""),
        "{log}"
    );
    Ok(())
}
