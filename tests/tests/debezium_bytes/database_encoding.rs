//! A database whose encoding is not UTF-8, with a logical-message outbox.
//!
//! PostgreSQL converts what it sends of table rows to the replication connection's
//! `client_encoding` (UTF8), but not the content of a logical decoding message: that is the
//! bytes of the text the application passed, in the database encoding. Siphon converts it from
//! the encoding the server reports (`server_encoding`), so a message and a row with the same
//! text give the same UTF-8 bytes; content it cannot convert stops Siphon with an error naming
//! the database encoding and the fix, or goes to the dead-letter topic.

use anyhow::{Context, Result};
use siphon_tests::outbox::{current_insert_lsn, siphon_config, slot_active, slot_confirmed_lsn};
use siphon_tests::{
    read_topic_async, wait_for, wait_until, Broker, ConsumedRecord, Postgres, SiphonProcess,
};
use std::time::Duration;
use tokio_postgres::Client;

/// The outbox table, in the encoding test databases.
const OUTBOX: &str = "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, \
                      aggregateid text NOT NULL, type text NOT NULL, payload jsonb)";

/// Text with Latin-1 letters and U+0085 (NEL), which is byte 0x85 in LATIN1 (ISO 8859-1) and
/// would be "…" if LATIN1 were read as windows-1252.
const NOTE: &str = "café über \u{85}";

fn id(n: u32) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

/// Creates database `name` with encoding `encoding` on `pg` and connects to it (the connection
/// speaks UTF8; the server converts to and from the database encoding).
async fn database(pg: &Postgres, name: &str, encoding: &str) -> Result<(String, Client)> {
    let admin = pg.connect().await?;
    admin
        .batch_execute(&format!(
            "CREATE DATABASE {name} ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' \
             TEMPLATE template0"
        ))
        .await?;
    let url = format!("{}/{name}", pg.url().trim_end_matches("/siphon"));
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client.batch_execute(OUTBOX).await?;
    let encoding_now: String = client.query_one("SHOW server_encoding", &[]).await?.get(0);
    anyhow::ensure!(encoding_now == encoding, "database encoding {encoding_now}");
    Ok((url, client))
}

/// Siphon on the database at `url`, with logical messages of prefix `outbox`; waits until it
/// streams.
async fn start_siphon(
    pg: &Postgres,
    broker: &Broker,
    client: &Client,
    url: &str,
    slot: &str,
    extra: &str,
) -> Result<SiphonProcess> {
    let config = siphon_config(pg, broker, slot, extra)
        .replace(
            &format!("url = \"{}\"", pg.url()),
            &format!("url = \"{url}\""),
        )
        .replace("[source]\n", "[source]\nmessage_prefixes = [\"outbox\"]\n");
    let siphon = SiphonProcess::start(&config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(client, slot).await },
    )
    .await
    .with_context(|| format!("siphon did not start streaming; log:\n{}", siphon.log()))?;
    Ok(siphon)
}

/// Emits event `n` as a transactional logical message with `aggregateid` and a payload whose
/// `note` is `note`, passed as UTF-8 parameters (the server converts them).
async fn emit(client: &Client, n: u32, aggregateid: &str, note: &str) -> Result<()> {
    client
        .execute(
            "SELECT pg_logical_emit_message(true, 'outbox', json_build_object('id', $1::text, \
             'aggregatetype', 'Order', 'aggregateid', $2::text, 'type', 'Created', \
             'payload', json_build_object('note', $3::text))::text)",
            &[&id(n), &aggregateid, &note],
        )
        .await?;
    Ok(())
}

/// Inserts event `n` as an outbox row, then deletes it.
async fn insert(client: &Client, n: u32, aggregateid: &str, note: &str) -> Result<()> {
    client
        .batch_execute("BEGIN")
        .await
        .context("beginning a transaction")?;
    client
        .execute(
            "INSERT INTO outbox VALUES ($1::text::uuid, 'Order', $2, 'Created', \
             jsonb_build_object('note', $3::text))",
            &[&id(n), &aggregateid, &note],
        )
        .await?;
    client.batch_execute("DELETE FROM outbox; COMMIT").await?;
    Ok(())
}

/// Waits until `topic` of `broker` holds `count` records.
async fn records(
    broker: &Broker,
    topic: &str,
    count: usize,
    siphon: &SiphonProcess,
) -> Result<Vec<ConsumedRecord>> {
    let (bootstrap, topic) = (broker.bootstrap(), broker.topic(topic));
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
    .with_context(|| format!("waiting for {count} records in {topic}\n{}", siphon.log()))
}

fn by_id(records: &[ConsumedRecord], n: u32) -> Result<&ConsumedRecord> {
    records
        .iter()
        .find(|r| r.header("id") == Some(id(n).as_bytes()))
        .with_context(|| format!("no record with id {}", id(n)))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latin1_database_delivers_messages_and_rows_as_utf8() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let (url, client) = database(&pg, "latin", "LATIN1").await?;
    let siphon = start_siphon(&pg, &broker, &client, &url, "latin", "").await?;
    emit(&client, 1, "zürich", NOTE).await?;
    insert(&client, 2, "zürich", NOTE).await?;
    let records = records(&broker, "outbox.event.Order", 2, &siphon).await?;
    let (message, row) = (by_id(&records, 1)?, by_id(&records, 2)?);
    // The key as the row gives it: the UTF-8 text as a JSON string.
    assert_eq!(
        row.key.as_deref(),
        Some("\"zürich\"".as_bytes()),
        "{:?}",
        row.key_str()
    );
    assert_eq!(message.key, row.key, "{:?}", message.key_str());
    for (what, record) in [("message", message), ("row", row)] {
        let value = record.value.as_deref().unwrap_or_default();
        assert!(
            contains(value, NOTE.as_bytes()),
            "the {what}'s payload carries {NOTE:?} in UTF-8: {:?}",
            String::from_utf8_lossy(value)
        );
    }
    assert!(siphon.is_running(), "{}", siphon.log());
    Ok(())
}

/// EUC_TW is a server encoding Siphon cannot convert: ASCII content (the same bytes in every
/// server encoding) still arrives; the first message with other characters stops Siphon,
/// naming the encoding and the fix, and is not confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_in_an_encoding_siphon_cannot_convert_stops_it_naming_the_encoding() -> Result<()>
{
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let (url, client) = database(&pg, "taiwan", "EUC_TW").await?;
    let siphon = start_siphon(&pg, &broker, &client, &url, "taiwan", "").await?;
    emit(&client, 1, "taipei", "plain ASCII").await?;
    insert(&client, 2, "臺北", "臺北").await?;
    records(&broker, "outbox.event.Order", 2, &siphon).await?;
    let before = current_insert_lsn(&client).await?;
    emit(&client, 3, "臺北", "臺北").await?;
    let status = siphon.wait_exit(Duration::from_secs(60))?;
    assert_eq!(status.code(), Some(2), "{}", siphon.log());
    let confirmed = slot_confirmed_lsn(&client, "taiwan")
        .await?
        .context("the slot")?;
    assert!(
        confirmed <= before,
        "the slot moved past the message ({confirmed} > {before})"
    );
    let log = siphon.log();
    assert!(log.contains("EUC_TW"), "{log}");
    assert!(log.contains("outbox table"), "names the fix: {log}");
    assert!(log.contains("dead-letter"), "{log}");
    Ok(())
}

/// Content that is not valid in the database encoding (bytes passed as `bytea`) goes to the
/// dead-letter topic with an error naming the encoding; the events after it arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_invalid_in_the_database_encoding_is_dead_lettered_naming_it() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX).await?;
    let dead_letter_topic = broker.topic("outbox.dlq");
    let siphon = start_siphon(
        &pg,
        &broker,
        &client,
        &pg.url(),
        "invalid",
        &format!("on_error = \"dead-letter\"\ndead_letter_topic = \"{dead_letter_topic}\""),
    )
    .await?;
    client
        .batch_execute(
            "SELECT pg_logical_emit_message(true, 'outbox', '\\x7b226964223a22ff227d'::bytea)",
        )
        .await?;
    emit(&client, 2, "o-2", NOTE).await?;
    records(&broker, "outbox.event.Order", 1, &siphon).await?;
    let dead = records(&broker, "outbox.dlq", 1, &siphon).await?;
    let error = String::from_utf8_lossy(dead[0].header("siphon.error.message").unwrap_or_default())
        .into_owned();
    assert!(error.contains("UTF8"), "{error}");
    assert!(siphon.is_running(), "{}", siphon.log());
    Ok(())
}
