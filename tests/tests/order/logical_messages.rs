//! The table-less outbox: events written with `pg_logical_emit_message(true, prefix, content)`
//! reach Kafka as the records the same row would give, in commit order with the table rows of
//! their transaction; rolled-back and non-transactional ones never do.

use anyhow::{Context, Result};
use siphon_tests::outbox::{
    current_insert_lsn, siphon_config, slot_active, wait_for_slot_past, OUTBOX_DDL,
};
use siphon_tests::{
    read_topic_async, wait_for, wait_until, Broker, ConsumedRecord, Postgres, SiphonProcess,
};
use std::time::Duration;
use tokio_postgres::Client;

fn id(n: u32) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

fn message_sql(prefix: &str, transactional: bool, n: u32, aggregate: &str) -> String {
    format!(
        "SELECT pg_logical_emit_message({transactional}, '{prefix}', json_build_object('id', '{id}', 'aggregatetype', 'Order', 'aggregateid', '{aggregate}', 'type', 'Created', 'payload', json_build_object('n', {n}))::text)",
        id = id(n)
    )
}

fn row_sql(n: u32, aggregate: &str) -> String {
    format!(
        "INSERT INTO outbox VALUES ('{id}', 'Order', '{aggregate}', 'Created', '{{\"n\": {n}}}')",
        id = id(n)
    )
}

fn ids(records: &[ConsumedRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| String::from_utf8_lossy(r.header("id").unwrap_or_default()).into_owned())
        .collect()
}

async fn start(extra_source: &str) -> Result<(Postgres, Broker, Client, SiphonProcess)> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let config = siphon_config(&pg, &broker, "msgs", "").replace(
        "[source]\n",
        &format!("[source]\nmessage_prefixes = [\"outbox\"]\n{extra_source}"),
    );
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "msgs").await },
    )
    .await?;
    Ok((pg, broker, client, siphon))
}

async fn wait_for_ids(
    broker: &Broker,
    count: usize,
    siphon: &SiphonProcess,
) -> Result<Vec<ConsumedRecord>> {
    let bootstrap = broker.bootstrap();
    let topic = broker.topic("outbox.event.Order");
    wait_for(
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            let records = read_topic_async(&bootstrap, &topic, Duration::from_secs(10))
                .await
                .unwrap_or_default();
            Ok((records.len() >= count).then_some(records))
        },
    )
    .await
    .with_context(|| format!("waiting for {count} records\n{}", siphon.log()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_and_rows_arrive_once_in_commit_order_and_rolled_back_ones_never() -> Result<()> {
    let (_pg, broker, client, siphon) = start("").await?;
    client
        .batch_execute(&format!(
            "BEGIN; {m1}; {r2}; {m3}; DELETE FROM outbox; COMMIT;
             BEGIN; {m4}; {r5}; ROLLBACK;
             {m6};
             {other};
             BEGIN; {m8}; COMMIT;",
            m1 = message_sql("outbox", true, 1, "o-1"),
            r2 = row_sql(2, "o-1"),
            m3 = message_sql("outbox", true, 3, "o-1"),
            m4 = message_sql("outbox", true, 4, "o-1"),
            r5 = row_sql(5, "o-1"),
            m6 = message_sql("outbox", true, 6, "o-1"),
            other = message_sql("elsewhere", true, 7, "o-1"),
            m8 = message_sql("outbox", true, 8, "o-2"),
        ))
        .await?;
    wait_for_ids(&broker, 5, &siphon).await?;
    // Let anything that should not come have the time to come.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let records = read_topic_async(
        &broker.bootstrap(),
        &broker.topic("outbox.event.Order"),
        Duration::from_secs(10),
    )
    .await?;
    let o1: Vec<&str> = records
        .iter()
        .filter(|r| r.key_str().unwrap_or_default().contains("o-1"))
        .map(|r| std::str::from_utf8(r.header("id").unwrap_or_default()).unwrap_or_default())
        .collect();
    assert_eq!(
        o1,
        [id(1), id(2), id(3), id(6)],
        "aggregate o-1 in commit order, once each"
    );
    assert_eq!(ids(&records).len(), 5, "{:?}", ids(&records));
    assert!(ids(&records).contains(&id(8)));
    // A message routes exactly like the equivalent row: same key, value and headers.
    let message = records
        .iter()
        .find(|r| r.header("id") == Some(id(1).as_bytes()))
        .context("1")?;
    let row = records
        .iter()
        .find(|r| r.header("id") == Some(id(2).as_bytes()))
        .context("2")?;
    assert_eq!(message.key, row.key);
    // The payload member as the application wrote it (json_build_object's text), as a JSON
    // string, as a jsonb column's text would be.
    assert_eq!(message.value_str().as_deref(), Some(r#""{\"n\" : 1}""#));
    assert_eq!(row.value_str().as_deref(), Some(r#""{\"n\": 2}""#));
    assert!(siphon.is_running(), "{}", siphon.log());
    // The publication Siphon created carries INSERTs (and UPDATEs, to warn about them), not the
    // DELETEs that clean the outbox up.
    let ops = client
        .query_one(
            "SELECT pubinsert, pubupdate, pubdelete FROM pg_publication WHERE pubname = 'msgs_pub'",
            &[],
        )
        .await?;
    assert_eq!(
        (
            ops.get::<_, bool>(0),
            ops.get::<_, bool>(1),
            ops.get::<_, bool>(2)
        ),
        (true, true, false)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_transactional_message_stops_siphon_naming_the_fix() -> Result<()> {
    let (_pg, _broker, client, siphon) = start("").await?;
    client
        .batch_execute(&message_sql("outbox", false, 1, "o-1"))
        .await?;
    let status = siphon.wait_exit(Duration::from_secs(60))?;
    assert_eq!(status.code(), Some(2), "{}", siphon.log());
    let log = siphon.log();
    assert!(log.contains("pg_logical_emit_message(true"), "{log}");
    assert!(log.contains("non_transactional_messages"), "{log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_transactional_messages_can_be_skipped_with_a_warning() -> Result<()> {
    let (_pg, broker, client, siphon) = start("non_transactional_messages = \"skip\"\n").await?;
    client
        .batch_execute(&format!(
            "{}; {};",
            message_sql("outbox", false, 1, "o-1"),
            message_sql("outbox", true, 2, "o-1")
        ))
        .await?;
    let records = wait_for_ids(&broker, 1, &siphon).await?;
    assert_eq!(ids(&records), [id(2)]);
    assert!(siphon
        .log()
        .contains("non-transactional logical message skipped"));
    assert!(siphon.is_running());
    Ok(())
}

/// No outbox table at all: `source.tables = []` with a message prefix. The events arrive and the
/// slot moves past them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_less_outbox_delivers_and_the_slot_follows() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    let config = siphon_config(&pg, &broker, "tableless", "")
        .replace("tables = [\"public.outbox\"]", "tables = []")
        .replace("[source]\n", "[source]\nmessage_prefixes = [\"outbox\"]\n");
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "tableless").await },
    )
    .await
    .with_context(|| siphon.log())?;
    client
        .batch_execute(&format!(
            "BEGIN; {}; {}; COMMIT;",
            message_sql("outbox", true, 1, "o-1"),
            message_sql("outbox", true, 2, "o-1")
        ))
        .await?;
    let end = current_insert_lsn(&client).await?;
    let records = wait_for_ids(&broker, 2, &siphon).await?;
    assert_eq!(ids(&records), [id(1), id(2)]);
    wait_for_slot_past(&client, "tableless", end, Duration::from_secs(30))
        .await
        .with_context(|| siphon.log())?;
    Ok(())
}
