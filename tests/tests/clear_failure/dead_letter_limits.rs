//! A dead-letter record stays under the producer's message limit however large the row it
//! stands for: a poison row with many large columns is dead-lettered (with the columns that do
//! not fit named), not refused by the producer.

use anyhow::{Context, Result};
use siphon_tests::outbox::{current_insert_lsn, siphon_config, slot_active, wait_for_slot_past};
use siphon_tests::{read_topic_async, wait_until, Broker, Postgres, SiphonProcess};
use std::time::Duration;

const COLUMNS: usize = 12;
const COLUMN_BYTES: usize = 40_000;
const MESSAGE_MAX_BYTES: usize = 200_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_row_with_many_large_columns_is_dead_lettered_under_the_limit() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    let extra_columns: String = (0..COLUMNS).map(|i| format!(", c{i} text")).collect();
    client
        .batch_execute(&format!(
            "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload jsonb{extra_columns})"
        ))
        .await?;
    let dead_letter_topic = broker.topic("outbox.dlq");
    let pipeline =
        format!("on_error = \"dead-letter\"\ndead_letter_topic = \"{dead_letter_topic}\"");
    let config = siphon_config(&pg, &broker, "wide", &pipeline).replace(
        "\"message.timeout.ms\" = \"10000\"",
        &format!(
            "\"message.timeout.ms\" = \"10000\"\n\"message.max.bytes\" = \"{MESSAGE_MAX_BYTES}\""
        ),
    );
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "wide").await },
    )
    .await?;
    // 12 columns of 40 kB: each under the per-column cap, 480 kB together.
    let values: String = (0..COLUMNS)
        .map(|i| format!(", repeat('{}', {COLUMN_BYTES})", (b'a' + i as u8) as char))
        .collect();
    client
        .batch_execute(&format!(
            "INSERT INTO outbox VALUES ('00000000-0000-4000-8000-000000000001', NULL, 'order-1', 'Created', '{{}}'{values});
             DELETE FROM outbox;"
        ))
        .await?;
    let end = current_insert_lsn(&client).await?;
    wait_for_slot_past(&client, "wide", end, Duration::from_secs(60))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    let dead = read_topic_async(
        &broker.bootstrap(),
        &dead_letter_topic,
        Duration::from_secs(20),
    )
    .await?;
    assert_eq!(dead.len(), 1, "{}", siphon.log());
    let record = &dead[0];
    let size = record.key.as_ref().map_or(0, Vec::len)
        + record.value.as_ref().map_or(0, Vec::len)
        + record
            .headers
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
            .sum::<usize>();
    assert!(size < MESSAGE_MAX_BYTES, "{size} bytes");
    let omitted =
        String::from_utf8_lossy(record.header("siphon.error.omitted").unwrap_or_default())
            .into_owned();
    assert!(omitted.contains("c11 (40000 bytes)"), "{omitted}");
    let row: serde_json::Value =
        serde_json::from_slice(record.value.as_deref().unwrap_or_default())?;
    assert_eq!(
        row["c0"].as_str().map(str::len),
        Some(COLUMN_BYTES),
        "the first columns are kept"
    );
    assert_eq!(row["c11"], serde_json::Value::Null);
    assert!(siphon.is_running(), "{}", siphon.log());
    Ok(())
}
