//! Debezium compatibility end to end: router options and encodings as they reach the broker,
//! partitions as the Java client chooses them, and taking over a slot Debezium created.

use anyhow::{Context, Result};
use siphon_tests::http::metric;
use siphon_tests::outbox::{
    event, insert_transaction, siphon_config, slot_active, Event, OUTBOX_DDL,
};
use siphon_tests::partition::partition_for_key;
use siphon_tests::{
    read_topic_async, wait_for, wait_until, Broker, ConsumedRecord, Postgres, SiphonProcess,
};
use std::collections::BTreeMap;
use std::time::Duration;

/// Waits until topic `topic` of the test's namespace holds at least `expected` records, and
/// returns them.
async fn records(
    broker: &Broker,
    topic: &str,
    expected: usize,
    siphon: &SiphonProcess,
) -> Result<Vec<ConsumedRecord>> {
    let topic = &broker.topic(topic);
    wait_for(
        Duration::from_secs(90),
        Duration::from_millis(300),
        || async {
            let r = read_topic_async(&broker.bootstrap(), topic, Duration::from_secs(30)).await?;
            anyhow::ensure!(
                r.len() >= expected,
                "{} of {expected} records on {topic}",
                r.len()
            );
            Ok(Some(r))
        },
    )
    .await
    .with_context(|| format!("siphon log:\n{}", siphon.log()))
}

fn text(bytes: &Option<Vec<u8>>) -> String {
    String::from_utf8_lossy(bytes.as_deref().unwrap_or(b"<null>")).into_owned()
}

/// Options Debezium users commonly set, with the bytes Debezium's EventRouter and Kafka
/// Connect's converters produce for them (see crates/router/tests for each rule's source).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_options_reach_the_broker_byte_for_byte() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client
        .batch_execute(
            "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
                                  type varchar(255) NOT NULL, payload jsonb, created_at timestamp(6) NOT NULL, tenant text)",
        )
        .await?;
    let extra = format!(
        r#"
[router]
"table.fields.additional.placement" = "type:header:eventType,tenant:header"
"table.field.event.timestamp" = "created_at"
"route.topic.replacement" = "{}"
"#,
        broker.topic("${routedByValue}.events")
    );
    let siphon = SiphonProcess::start(&siphon_config(&pg, &broker, "opts", &extra))?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "opts").await },
    )
    .await?;
    client
        .batch_execute(
            r#"BEGIN;
               INSERT INTO outbox VALUES ('11111111-1111-4111-8111-111111111111', 'Order', 'order-1', 'OrderCreated',
                   '{"note": "tab\there \"quoted\" \\ back", "city": "Zürich", "n": 1}', '2024-05-01 12:34:56.789012', 'acme');
               INSERT INTO outbox VALUES ('22222222-2222-4222-8222-222222222222', 'Order', 'order-2', 'OrderPaid', NULL,
                   '1999-12-31 23:59:59', NULL);
               UPDATE outbox SET type = 'Changed' WHERE aggregateid = 'order-1';
               DELETE FROM outbox;
               COMMIT;"#,
        )
        .await?;
    let got = records(&broker, "Order.events", 2, &siphon).await?;
    assert_eq!(got.len(), 2, "the UPDATE and the DELETEs make no records");
    assert!(
        siphon.log().contains("UPDATE of an outbox row skipped"),
        "the UPDATE is logged"
    );
    let by_key: BTreeMap<String, &ConsumedRecord> = got.iter().map(|r| (text(&r.key), r)).collect();

    let first = by_key["\"order-1\""];
    assert_eq!(
        text(&first.value),
        r#""{\"n\": 1, \"city\": \"Zürich\", \"note\": \"tab\\there \\\"quoted\\\" \\\\ back\"}""#,
        "jsonb text as a JSON string, escaped as Jackson does"
    );
    let headers: Vec<(String, String)> = first
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), text(v)))
        .collect();
    assert_eq!(
        headers,
        [
            (
                "id".to_owned(),
                "11111111-1111-4111-8111-111111111111".to_owned()
            ),
            ("eventType".to_owned(), "OrderCreated".to_owned()),
            ("tenant".to_owned(), "acme".to_owned()),
        ]
    );
    assert_eq!(
        first.timestamp,
        Some(1_714_566_896_789),
        "timestamp(6) truncated to milliseconds"
    );

    let second = by_key["\"order-2\""];
    assert_eq!(
        second.value.as_deref(),
        Some(&b"null"[..]),
        "a NULL payload is JsonConverter's null"
    );
    assert_eq!(second.timestamp, Some(946_684_799_000));
    assert_eq!(second.header("tenant"), None, "a NULL header value");
    assert!(second
        .headers
        .iter()
        .any(|(k, v)| k == "tenant" && v.is_none()));

    // The Java client's partitioner: murmur2 of the serialized key.
    for r in &got {
        assert_eq!(
            r.partition,
            partition_for_key(r.key.as_deref().unwrap_or_default(), 3),
            "{}",
            text(&r.key)
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schemas_value_and_string_key() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    let extra = r#"
[format]
key = "string"
value = "json-schemas"
"#;
    let siphon = SiphonProcess::start(&siphon_config(&pg, &broker, "schemas", extra))?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "schemas").await },
    )
    .await?;
    client
        .batch_execute(
            r#"BEGIN;
               INSERT INTO outbox VALUES ('33333333-3333-4333-8333-333333333333', 'Order', 'order-9', 'T', '{"a": [1, 2]}');
               DELETE FROM outbox;
               COMMIT;"#,
        )
        .await?;
    let got = records(&broker, "outbox.event.Order", 1, &siphon).await?;
    assert_eq!(text(&got[0].key), "order-9", "StringConverter key");
    assert_eq!(
        text(&got[0].value),
        r#"{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":"{\"a\": [1, 2]}"}"#
    );
    Ok(())
}

/// A slot and publication created as Debezium creates them (pgoutput, `dbz_publication` for all
/// tables), with a backlog Debezium never read: Siphon started on them delivers all of it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taking_over_a_debezium_slot_delivers_the_backlog_once() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    client
        .batch_execute("CREATE TABLE orders (id int PRIMARY KEY, status text)")
        .await?;
    client
        .batch_execute("CREATE PUBLICATION dbz_publication FOR ALL TABLES")
        .await?;
    client
        .batch_execute("SELECT pg_create_logical_replication_slot('debezium', 'pgoutput')")
        .await?;
    let mut committed: Vec<Event> = Vec::new();
    for txn in 0..40u64 {
        client
            .execute("INSERT INTO orders VALUES ($1, 'new')", &[&(txn as i32)])
            .await?;
        let events: Vec<Event> = (0..10)
            .map(|i| event(txn * 10 + i + 1, true))
            .filter(|e| e.aggregatetype == "Order")
            .collect();
        insert_transaction(&mut client, &events, true).await?;
        committed.extend(events);
    }
    let config = siphon_config(&pg, &broker, "debezium", "").replace(
        "publication = \"debezium_pub\"",
        "publication = \"dbz_publication\"",
    );
    let siphon = SiphonProcess::start(&config)?;
    let got = records(&broker, "outbox.event.Order", committed.len(), &siphon).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got_again = read_topic_async(
        &broker.bootstrap(),
        &broker.topic("outbox.event.Order"),
        Duration::from_secs(30),
    )
    .await?;
    assert_eq!(got_again.len(), got.len(), "nothing more arrives");
    let mut ids: Vec<String> = got
        .iter()
        .map(|r| String::from_utf8_lossy(r.header("id").unwrap_or_default()).into_owned())
        .collect();
    ids.sort();
    let mut expected: Vec<String> = committed.iter().map(|e| e.id.clone()).collect();
    expected.sort();
    assert_eq!(ids, expected, "the whole backlog, each event once");
    assert!(
        !siphon.log().contains("created replication slot"),
        "the existing slot was used"
    );
    Ok(())
}

/// Through a publication of every operation (what a takeover from Debezium inherits), every
/// DELETE of the outbox crosses the wire: each is read and skipped (counted as read and as a
/// skipped DELETE, no record), another table's rows are skipped as such, and a transaction of
/// DELETEs only is confirmed like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_through_an_all_operations_publication_are_read_and_skipped() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let mut client = pg.connect().await?;
    client.batch_execute(OUTBOX_DDL).await?;
    client
        .batch_execute(
            "CREATE TABLE orders (id int PRIMARY KEY, status text);
             CREATE PUBLICATION alldel_pub FOR ALL TABLES",
        )
        .await?;
    let port = siphon_tests::free_port();
    let listen = format!("127.0.0.1:{port}");
    let siphon = SiphonProcess::start_with(
        &siphon_tests::siphon_bin()?,
        &siphon_config(&pg, &broker, "alldel", ""),
        &[("SIPHON_METRICS_LISTEN", listen.as_str())],
    )?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "alldel").await },
    )
    .await?;

    // Ten transactions: an order, ten events, their DELETE.
    let mut expected = std::collections::BTreeSet::new();
    for txn in 0..10u64 {
        client
            .execute("INSERT INTO orders VALUES ($1, 'new')", &[&(txn as i32)])
            .await?;
        let events: Vec<Event> = (0..10).map(|i| event(txn * 10 + i + 1, true)).collect();
        insert_transaction(&mut client, &events, true).await?;
        expected.extend(events.into_iter().map(|e| e.id));
    }
    // Ten events inserted in one transaction and deleted in the next, which has nothing else.
    let events: Vec<Event> = (101..=110).map(|seq| event(seq, true)).collect();
    let tx = client.transaction().await?;
    for e in &events {
        tx.execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1::text::uuid, $2, $3, 'Event', $4::text::jsonb)",
            &[&e.id, &e.aggregatetype, &e.aggregateid, &e.payload],
        )
        .await?;
    }
    tx.commit().await?;
    client.batch_execute("DELETE FROM outbox").await?;
    expected.extend(events.into_iter().map(|e| e.id));

    siphon_tests::outbox::wait_for_all(&broker, &expected, Duration::from_secs(90))
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    siphon_tests::outbox::wait_for_slot_caught_up(&client, "alldel")
        .await
        .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    let (_, body) = siphon_tests::http::get(port, "/metrics")?;
    for (series, value) in [
        ("siphon_events_read_total", 230.0),
        ("siphon_rows_skipped_total{reason=\"delete\"}", 110.0),
        ("siphon_rows_skipped_total{reason=\"other_table\"}", 10.0),
        ("siphon_rows_skipped_total{reason=\"update\"}", 0.0),
        ("siphon_transactions_total", 22.0),
        ("siphon_reconnects_total{cause=\"source\"}", 0.0),
    ] {
        assert_eq!(metric(&body, series), Some(value), "{series}\n{body}");
    }
    let routed: f64 = body
        .lines()
        .filter(|l| l.starts_with("siphon_records_routed_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(routed, 110.0, "{body}");
    Ok(())
}

/// A realistic Debezium connector configuration, converted by `siphon import-debezium`, runs
/// as it is (with the connection details a connector file cannot carry given by environment).
/// Its router names topics `${routedByValue}.events`: the row's aggregate type carries the
/// test's topic namespace, so the record lands in the namespace unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_debezium_configuration_runs() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client
        .batch_execute(
            "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
                                  type text NOT NULL, payload jsonb)",
        )
        .await?;
    let bin = siphon_tests::siphon_bin()?;
    let fixture =
        siphon_tests::workspace_root().join("tests/fixtures/debezium/outbox-connector.json");
    let output = std::process::Command::new(&bin)
        .arg("import-debezium")
        .arg(&fixture)
        .output()?;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let toml = String::from_utf8(output.stdout)?;
    let notes = String::from_utf8(output.stderr)?;
    assert!(toml.contains("slot = \"orders_outbox\""), "{toml}");
    assert!(
        notes.contains("password"),
        "the password is left to the operator: {notes}"
    );

    let bootstrap = broker.bootstrap();
    let url = pg.url();
    let siphon = SiphonProcess::start_with(
        &bin,
        &toml,
        &[
            ("SIPHON_SOURCE_URL", url.as_str()),
            ("SIPHON_KAFKA_BOOTSTRAP_SERVERS", bootstrap.as_str()),
            ("SIPHON_KAFKA_TOPIC_CREATION_REPLICATION_FACTOR", "1"),
            ("SIPHON_METRICS_LISTEN", "127.0.0.1:0"),
        ],
    )?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "orders_outbox").await },
    )
    .await
    .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    client
        .batch_execute(&format!(
            r#"BEGIN;
               INSERT INTO outbox VALUES ('44444444-4444-4444-8444-444444444444', '{}', 'order-1', 'OrderCreated', '{{"total": 12.5, "lines": [{{"sku": "A"}}]}}');
               DELETE FROM outbox;
               COMMIT;"#,
            broker.topic("Order")
        ))
        .await?;
    let got = records(&broker, "Order.events", 1, &siphon).await?;
    let r = &got[0];
    assert_eq!(text(&r.key), "order-1", "StringConverter key");
    assert_eq!(
        text(&r.value),
        r#"{"lines":[{"sku":"A"}],"total":12.5}"#,
        "expanded, compact, in jsonb's key order"
    );
    let names: Vec<&str> = r.headers.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "__debezium.context.connectorLogicalName",
            "__debezium.context.taskId",
            "__debezium.context.connectorName",
            "__debezium.context.runId",
            "id",
            "eventType"
        ]
    );
    assert_eq!(
        r.header("__debezium.context.connectorLogicalName"),
        Some(&b"orders"[..])
    );
    assert_eq!(r.header("eventType"), Some(&b"OrderCreated"[..]));
    Ok(())
}

/// Topic regex with a named group, a value envelope, an explicit partition column and
/// tombstones for empty payloads, together. The aggregate types carry the test's topic
/// namespace, so both the regex's topic and an unmatched value's own name land in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regex_routing_envelope_partition_and_tombstones() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client
        .batch_execute(
            "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL,
                                  type text NOT NULL, payload jsonb, part int4 NOT NULL)",
        )
        .await?;
    let extra = r#"
[router]
"route.topic.regex" = "(?<kind>.*)Aggregate"
"route.topic.replacement" = "${kind}.events"
"table.fields.additional.placement" = "type:envelope:eventType,part:partition"
"route.tombstone.on.empty.payload" = true
"#;
    let siphon = SiphonProcess::start(&siphon_config(&pg, &broker, "regex", extra))?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "regex").await },
    )
    .await?;
    client
        .batch_execute(&format!(
            r#"BEGIN;
               INSERT INTO outbox VALUES ('55555555-5555-4555-8555-555555555551', '{order}', 'order-1', 'Created', '{{"a": 1}}', 2);
               INSERT INTO outbox VALUES ('55555555-5555-4555-8555-555555555552', '{order}', 'order-2', 'Deleted', NULL, 1);
               INSERT INTO outbox VALUES ('55555555-5555-4555-8555-555555555553', '{other}', 'x', 'T', '{{}}', 0);
               DELETE FROM outbox;
               COMMIT;"#,
            order = broker.topic("OrderAggregate"),
            other = broker.topic("Other"),
        ))
        .await?;
    let orders = records(&broker, "Order.events", 2, &siphon).await?;
    let by_key: BTreeMap<String, &ConsumedRecord> =
        orders.iter().map(|r| (text(&r.key), r)).collect();
    let created = by_key["\"order-1\""];
    assert_eq!(created.partition, 2, "the partition column decides");
    assert_eq!(
        text(&created.value),
        r#"{"payload":"{\"a\": 1}","eventType":"Created"}"#,
        "envelope: payload, then the placed field"
    );
    let deleted = by_key["\"order-2\""];
    assert_eq!(deleted.partition, 1);
    assert_eq!(deleted.value, None, "a NULL payload is a tombstone");
    // A routing value the regex does not match keeps its own name as the topic.
    let other = records(&broker, "Other", 1, &siphon).await?;
    assert_eq!(text(&other[0].key), "\"x\"");
    Ok(())
}

/// A bytea payload written as raw bytes (BinaryDataConverter), with a string key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_payloads_are_written_raw() -> Result<()> {
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let client = pg.connect().await?;
    client
        .batch_execute(
            "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL,
                                  type text NOT NULL, payload bytea)",
        )
        .await?;
    let extra = "\n[format]\nkey = \"string\"\nvalue = \"binary\"\n";
    let siphon = SiphonProcess::start(&siphon_config(&pg, &broker, "bin", extra))?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(&client, "bin").await },
    )
    .await?;
    client
        .batch_execute(
            r#"BEGIN;
               INSERT INTO outbox VALUES ('66666666-6666-4666-8666-666666666666', 'Blob', 'b-1', 'T', '\x00ff0a22'::bytea);
               DELETE FROM outbox;
               COMMIT;"#,
        )
        .await?;
    let got = records(&broker, "outbox.event.Blob", 1, &siphon).await?;
    assert_eq!(text(&got[0].key), "b-1");
    assert_eq!(
        got[0].value.as_deref(),
        Some(&[0x00u8, 0xff, 0x0a, 0x22][..])
    );
    Ok(())
}
