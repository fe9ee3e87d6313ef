//! The schema-registry formats end to end, against real PostgreSQL, real Kafka and a real
//! schema registry (rivven-schema, serving Confluent's REST API). With `format.value = "avro"`
//! every outbox event's value, decoded by Confluent's Python deserializer with its own
//! registry client, equals its payload; keys and partitions are those of the JSON format; the
//! initial snapshot writes what the stream writes. A registry that is down holds events back
//! (the slot does not pass them) and loses none; a schema the registry refuses is
//! dead-lettered with its reason, or stops Siphon naming the subject and the fix. With
//! registered schemas (Avro, and JSON Schema with `format.value = "json-sr"`) the payloads that
//! fit are written with the registered schema's id and the others dead-lettered with the
//! reason.

use anyhow::{Context, Result};
use siphon_tests::outbox::{current_insert_lsn, siphon_config_at, slot_active};
use siphon_tests::outbox::{slot_confirmed_lsn, wait_for_slot_past};
use siphon_tests::partition::partition_for_key;
use siphon_tests::{read_topic_async, wait_for, wait_until, ConsumedRecord};
use siphon_tests::{Broker, Postgres, RegistryServer, SiphonProcess};
use std::time::Duration;

const OUTBOX: &str = "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb)";

/// Payloads of every shape the expansion knows: nested objects and arrays, numbers at the
/// edges of int32 and int64, doubles (jsonb writes exponents out in full, so a huge one is an
/// integer beyond 64 bits, which the expansion refuses as Debezium does), unicode (escaped and not), and members Debezium leaves
/// out (null, an empty array).
const CORPUS: [&str; 6] = [
    r#"{"id": 1, "name": "Ünïcode ✓ 😀", "price": 9.5, "ok": true, "tags": ["a", "b"], "order": {"lines": [{"sku": "s1", "qty": 2}, {"sku": "s2", "qty": 1}], "note": "n"}}"#,
    r#"{"id": -7, "name": "", "price": -0.25, "ok": false, "tags": [], "gone": null}"#,
    r#"{"small": 2147483647, "big": 9007199254740993, "neg": -9223372036854775808, "tiny": 5e-324, "wide": 123456789.875}"#,
    r#"{"text": "line\nbreak \"quoted\" \u00e9 \ud83d\ude00 tab\t"}"#,
    r#"{"deep": {"a": {"b": {"c": {"d": [[1, 2], [3]]}}}}}"#,
    r#"{"id": 2, "name": "second of its shape", "price": 1.25, "ok": true, "tags": ["c"], "order": {"lines": [{"sku": "s3", "qty": 5}], "note": "m"}}"#,
];

fn insert(n: usize, key: &str, payload: Option<&str>) -> String {
    let payload = payload.map_or_else(|| "NULL".to_owned(), |p| format!("'{p}'"));
    format!(
        "INSERT INTO outbox VALUES ('00000000-0000-4000-8000-{n:012}', 'Order', '{key}', 'T', {payload});"
    )
}

/// The payload as the deserializer gives it back: the members Debezium's expansion leaves
/// out (null, an empty array) are not there.
fn expected(payload: &str) -> serde_json::Value {
    let mut value: serde_json::Value = serde_json::from_str(payload).expect("a JSON payload");
    if let Some(members) = value.as_object_mut() {
        members.retain(|_, v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()));
    }
    value
}

/// Siphon's configuration: Avro values of expanded payloads registered with `registry_url`,
/// `pipeline` added to `[pipeline]`, `source` to `[source]`.
fn avro_config(
    pg: &Postgres,
    broker: &Broker,
    slot: &str,
    registry_url: &str,
    pipeline: &str,
    source: &str,
) -> String {
    let pipeline = format!(
        "{pipeline}\n\n[router]\n{}\n\"table.expand.json.payload\" = true\n\n[format]\nvalue = \"avro\"\n\n[schema_registry]\nurl = \"{registry_url}\"\n",
        siphon_tests::outbox::route_replacement(broker)
    );
    siphon_config_at(pg, broker, slot, "", &pipeline).replacen(
        "[source]\n",
        &format!("[source]\n{source}\n"),
        1,
    )
}

/// `config` with exactly-once delivery (Kafka transactions of 100 ms at most).
fn exactly_once(config: &str, broker: &Broker) -> String {
    siphon_tests::outbox::with_exactly_once(config, broker).replacen(
        "delivery = \"exactly-once\"",
        "delivery = \"exactly-once\"\ntransaction_interval_ms = 100",
        1,
    )
}

/// PostgreSQL with the outbox table, the broker and a registry of a test's own.
async fn servers() -> Result<(Postgres, Broker, RegistryServer, tokio_postgres::Client)> {
    let (pg, broker, registry) = (
        Postgres::start()?,
        Broker::start()?,
        RegistryServer::start()?,
    );
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX).await?;
    Ok((pg, broker, registry, client))
}

/// Siphon started with `config`, once it holds its slot on `client`'s server.
async fn started(
    client: &tokio_postgres::Client,
    config: &str,
    slot: &str,
) -> Result<SiphonProcess> {
    let siphon = SiphonProcess::start(config)?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_active(client, slot).await },
    )
    .await
    .with_context(|| siphon.log())?;
    Ok(siphon)
}

/// Checks, after a while, that `topic` still holds only `sent` records and that `slot` has
/// not passed `end`: the rest wait for the registry.
async fn held_back(
    broker: &Broker,
    topic: &str,
    client: &tokio_postgres::Client,
    slot: &str,
    end: u64,
    sent: usize,
    why: &str,
) -> Result<()> {
    tokio::time::sleep(Duration::from_secs(4)).await;
    let records = read_topic_async(&broker.bootstrap(), topic, Duration::from_secs(5)).await?;
    assert_eq!(records.len(), sent, "{why}");
    assert!(
        slot_confirmed_lsn(client, slot).await?.unwrap_or(0) < end,
        "the slot waits for the events"
    );
    Ok(())
}

/// Waits until `topic` holds `count` records, and returns them.
async fn records(
    broker: &Broker,
    topic: &str,
    count: usize,
    siphon: &SiphonProcess,
) -> Result<Vec<ConsumedRecord>> {
    siphon_tests::kafka_read::wait_for_topic_records(
        &broker.bootstrap(),
        topic,
        count,
        Duration::from_secs(90),
        Duration::from_secs(30),
    )
    .await
    .with_context(|| siphon.log())
}

/// The records of `topic` in offset order per partition, as `(aggregate id, payload)` pairs
/// of the values decoded with Confluent's deserializer, and their schema ids.
fn decode(
    python: &std::path::PathBuf,
    registry: &RegistryServer,
    topic: &str,
    records: &[ConsumedRecord],
) -> Result<Vec<(serde_json::Value, u64)>> {
    let with_values: Vec<ConsumedRecord> = records
        .iter()
        .filter(|r| r.value.is_some())
        .cloned()
        .collect();
    let decoded =
        siphon_tests::python::decode_avro(python, &registry.url(), topic, &with_values, false)?;
    Ok(decoded
        .into_iter()
        .map(|d| (d["value"].clone(), d["schema_id"].as_u64().unwrap_or(0)))
        .collect())
}

/// Asserts that some dead letter of `letters` gives a reason holding each of `needles`.
fn dead_letters_say(letters: &[ConsumedRecord], needles: &[&str]) {
    let reasons: Vec<String> = letters
        .iter()
        .map(|l| {
            String::from_utf8_lossy(l.header("siphon.error.message").unwrap_or_default())
                .into_owned()
        })
        .collect();
    for needle in needles {
        assert!(
            reasons.iter().any(|r| r.contains(needle)),
            "a dead letter says {needle:?}: {reasons:#?}"
        );
    }
}

fn python() -> Result<std::path::PathBuf> {
    siphon_tests::python::python()?
        .context("python3 with confluent-kafka is needed to decode Avro (scripts/install-deps.sh installs it)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_values_decode_to_their_payloads_with_json_keys_and_partitions_in_stream_and_snapshot(
) -> Result<()> {
    let python = python()?;
    let (pg, broker, registry, client) = servers().await?;
    // Written before Siphon's first start: the initial snapshot sends it.
    client
        .batch_execute(&insert(100, "order-0", Some(CORPUS[0])))
        .await?;
    let config = avro_config(
        &pg,
        &broker,
        "avro",
        &registry.url(),
        "",
        "snapshot = \"initial\"",
    );
    let siphon = started(&client, &config, "avro").await?;
    let mut sql = String::from("BEGIN;");
    for (n, payload) in CORPUS.iter().enumerate() {
        sql.push_str(&insert(n, &format!("order-{}", n % 2), Some(payload)));
    }
    sql.push_str(&insert(50, "order-1", None));
    sql.push_str("COMMIT; DELETE FROM outbox;");
    client.batch_execute(&sql).await?;
    let end = current_insert_lsn(&client).await?;

    let topic = broker.topic("outbox.event.Order");
    let records = records(&broker, &topic, CORPUS.len() + 2, &siphon).await?;
    wait_for_slot_past(&client, "avro", end, Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    assert_eq!(records.len(), CORPUS.len() + 2, "{records:?}");

    for record in &records {
        let key = record.key.as_deref().context("a key")?;
        assert!(
            key == b"\"order-0\"" || key == b"\"order-1\"",
            "keys keep the JSON encoding: {}",
            String::from_utf8_lossy(key)
        );
        assert_eq!(
            record.partition,
            partition_for_key(key, 3),
            "the partition of the key (murmur2)"
        );
    }
    let nulls = records.iter().filter(|r| r.value.is_none()).count();
    assert_eq!(nulls, 1, "a NULL payload is a null value");

    let decoded = decode(&python, &registry, &topic, &records)?;
    let id_of = |payload: &str| -> Vec<u64> {
        decoded
            .iter()
            .filter(|(value, _)| *value == expected(payload))
            .map(|(_, id)| *id)
            .collect()
    };
    // The snapshot's record and the stream's of the same payload: both there, one schema.
    let first = id_of(CORPUS[0]);
    assert_eq!(
        first.len(),
        2,
        "the snapshot's and the stream's: {decoded:?}"
    );
    assert_eq!(first[0], first[1], "one schema for one shape");
    for payload in &CORPUS[1..] {
        assert_eq!(
            id_of(payload).len(),
            1,
            "{payload} decodes to itself: {decoded:?}"
        );
    }
    assert_eq!(
        id_of(CORPUS[0])[0],
        id_of(CORPUS[5])[0],
        "payloads of one shape share their schema id"
    );
    // Per aggregate, the commit order: the snapshot's row first.
    let uuid = |n: u32| format!("00000000-0000-4000-8000-{n:012}");
    for (key, order) in [("order-0", [100, 0, 2, 4]), ("order-1", [1, 3, 5, 50])] {
        let json_key = format!("\"{key}\"");
        let ids: Vec<String> = records
            .iter()
            .filter(|r| r.key.as_deref() == Some(json_key.as_bytes()))
            .map(|r| String::from_utf8_lossy(r.header("id").unwrap_or_default()).into_owned())
            .collect();
        let expected: Vec<String> = order.into_iter().map(uuid).collect();
        assert_eq!(ids, expected, "{key}: commit order");
    }

    // Debezium's Avro path on the same payloads (its expansion, then Confluent's AvroData):
    // the schema the registry holds for each record is the one Java makes, and the datum
    // after the frame is Java's, byte for byte.
    let Some(oracle) = siphon_tests::oracle::Oracle::locate()? else {
        return siphon_tests::prerequisite_missing(
            "avro values against Java",
            "no JDK is installed",
        );
    };
    // Both read the payload as PostgreSQL prints the jsonb (its keys in jsonb's order).
    let mut payloads = Vec::new();
    for payload in CORPUS {
        let row = client
            .query_one("SELECT $1::text::jsonb::text", &[&payload])
            .await?;
        payloads.push(row.get::<_, String>(0));
    }
    let java = siphon_tests::oracle::run_avro_oracle(&oracle, &payloads)?;
    for record in records.iter().filter(|r| r.value.is_some()) {
        let id = String::from_utf8_lossy(record.header("id").unwrap_or_default()).into_owned();
        let n: usize = id.rsplit('-').next().unwrap_or_default().parse()?;
        let payload = if n == 100 { 0 } else { n };
        let value = record.value.as_deref().unwrap_or_default();
        let schema_id = u32::from_be_bytes(value[1..5].try_into()?);
        let (status, body) =
            siphon_tests::http::get(registry.port(), &format!("/schemas/ids/{schema_id}"))?;
        assert_eq!(status, 200, "{body}");
        let body: serde_json::Value = serde_json::from_str(&body)?;
        let registered: serde_json::Value =
            serde_json::from_str(body["schema"].as_str().context("a schema")?)?;
        match &java[payload] {
            siphon_tests::oracle::JavaAvro::Avro { schema, datum } => {
                let java_schema: serde_json::Value = serde_json::from_str(schema)?;
                assert_eq!(registered, java_schema, "event {n}: the registered schema");
                assert_eq!(&value[5..], &datum[..], "event {n}: the datum");
            }
            siphon_tests::oracle::JavaAvro::Refused(error) => {
                anyhow::bail!("Java refused payload {payload}: {error}")
            }
        }
    }

    // One request per schema: the snapshot registered the first shape, the stream the other
    // four, and every later record of a known shape costs none.
    let address = siphon.metrics_address().context("no metrics address")?;
    let port: u16 = address.rsplit(':').next().unwrap_or_default().parse()?;
    let metric = |body: &str, name: &str| -> Option<u64> {
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    };
    let body = wait_for(
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async {
            let (_, body) = siphon_tests::http::get(port, "/metrics")?;
            Ok((metric(&body, "siphon_schema_registry_requests_total") >= Some(5)).then_some(body))
        },
    )
    .await?;
    assert_eq!(
        metric(&body, "siphon_schema_registry_requests_total"),
        Some(5),
        "{body}"
    );
    // Records looked up: the snapshot's first, then the stream's five (the stream asks again
    // for the snapshot's shape; the client's cache answers that one without a request).
    assert_eq!(
        metric(&body, "siphon_schema_ids_looked_up_total"),
        Some(6),
        "{body}"
    );
    assert_eq!(
        metric(&body, "siphon_schema_ids_known_total"),
        Some(1),
        "{body}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_down_at_start_and_mid_stream_holds_events_back_and_loses_none() -> Result<()> {
    let python = python()?;
    let (pg, broker) = (Postgres::start()?, Broker::start()?);
    let port = siphon_tests::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let client = pg.connect().await?;
    client.batch_execute(OUTBOX).await?;
    let siphon = started(
        &client,
        &avro_config(&pg, &broker, "down", &url, "", ""),
        "down",
    )
    .await?;
    let topic = broker.topic("outbox.event.Order");

    // Down at start: nothing is sent, the slot stays before the events.
    let shape_a = |n: usize| format!(r#"{{"n": {n}, "a": "x"}}"#);
    let shape_b = |n: usize| format!(r#"{{"n": {n}, "b": [{n}]}}"#);
    client
        .batch_execute(&format!(
            "BEGIN; {} {} {} COMMIT;",
            insert(1, "k", Some(&shape_a(1))),
            insert(2, "k", Some(&shape_a(2))),
            insert(3, "k", Some(&shape_a(3))),
        ))
        .await?;
    let end = current_insert_lsn(&client).await?;
    siphon
        .wait_for_log("records wait for their schema id", Duration::from_secs(30))
        .await
        .with_context(|| siphon.log())?;
    held_back(
        &broker,
        &topic,
        &client,
        "down",
        end,
        0,
        "nothing is sent without its schema id",
    )
    .await?;
    let registry = RegistryServer::start_on(port)?;
    let first = records(&broker, &topic, 3, &siphon).await?;
    wait_for_slot_past(&client, "down", end, Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    let decoded = decode(&python, &registry, &topic, &first)?;
    let values: Vec<serde_json::Value> = decoded.into_iter().map(|(v, _)| v).collect();
    assert_eq!(
        values,
        (1..=3).map(|n| expected(&shape_a(n))).collect::<Vec<_>>()
    );

    // Down mid-stream: a shape whose id is known goes on; a new one waits for the registry.
    drop(registry);
    client
        .batch_execute(&format!(
            "BEGIN; {} COMMIT; BEGIN; {} {} COMMIT;",
            insert(4, "k", Some(&shape_a(4))),
            insert(5, "k", Some(&shape_b(5))),
            insert(6, "k", Some(&shape_a(6))),
        ))
        .await?;
    let end = current_insert_lsn(&client).await?;
    records(&broker, &topic, 4, &siphon).await?;
    held_back(
        &broker,
        &topic,
        &client,
        "down",
        end,
        4,
        "the new shape and what follows it wait",
    )
    .await?;
    let registry = RegistryServer::start_on(port)?;
    let all = records(&broker, &topic, 6, &siphon).await?;
    wait_for_slot_past(&client, "down", end, Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    assert_eq!(all.len(), 6, "no loss, no repeat");
    // The registry came back empty (it keeps schemas in memory): the held record's schema is
    // in it, under the id in its frame.
    let decoded = decode(&python, &registry, &topic, &all[4..5])?;
    assert_eq!(decoded[0].0, expected(&shape_b(5)));
    assert!(siphon.is_running(), "{}", siphon.log());
    Ok(())
}

/// The servers of a refused-schema test, Siphon and the end of the WAL written.
struct Incompatible {
    // Dropped first: Siphon stops before its database does.
    siphon: SiphonProcess,
    client: tokio_postgres::Client,
    _pg: Postgres,
    broker: Broker,
    registry: RegistryServer,
    dead_letter_topic: String,
    end: u64,
}

/// Siphon with a subject whose compatibility (the registry's default, backward) refuses a
/// changed field type, and three events: the second changes the type.
async fn incompatible(slot: &str, dead_letters: bool) -> Result<Incompatible> {
    let (pg, broker, registry, client) = servers().await?;
    let dead_letter_topic = broker.topic("outbox.avro.dlq");
    let pipeline = if dead_letters {
        format!("on_error = \"dead-letter\"\ndead_letter_topic = \"{dead_letter_topic}\"")
    } else {
        String::new()
    };
    let siphon = started(
        &client,
        &avro_config(&pg, &broker, slot, &registry.url(), &pipeline, ""),
        slot,
    )
    .await?;
    client
        .batch_execute(&format!(
            "BEGIN; {} COMMIT; BEGIN; {} {} COMMIT;",
            insert(1, "k", Some(r#"{"a": 1}"#)),
            insert(2, "k", Some(r#"{"a": "now text"}"#)),
            insert(3, "k", Some(r#"{"a": 3}"#)),
        ))
        .await?;
    let end = current_insert_lsn(&client).await?;
    Ok(Incompatible {
        siphon,
        client,
        _pg: pg,
        broker,
        registry,
        dead_letter_topic,
        end,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_the_registry_refuses_is_dead_lettered_with_its_reason() -> Result<()> {
    let python = python()?;
    let t = incompatible("refused", true).await?;
    let topic = t.broker.topic("outbox.event.Order");
    let letters = records(&t.broker, &t.dead_letter_topic, 1, &t.siphon).await?;
    let events = records(&t.broker, &topic, 2, &t.siphon).await?;
    wait_for_slot_past(&t.client, "refused", t.end, Duration::from_secs(60))
        .await
        .with_context(|| t.siphon.log())?;
    assert_eq!(letters.len(), 1);
    let reason = String::from_utf8_lossy(
        letters[0]
            .header("siphon.error.message")
            .unwrap_or_default(),
    )
    .into_owned();
    assert!(
        reason.contains("outbox.event.Order-value") && reason.contains("409"),
        "the reason names the subject and the refusal: {reason}"
    );
    let decoded = decode(&python, &t.registry, &topic, &events)?;
    let values: Vec<serde_json::Value> = decoded.into_iter().map(|(v, _)| v).collect();
    assert_eq!(
        values,
        vec![expected(r#"{"a": 1}"#), expected(r#"{"a": 3}"#)],
        "the events around it go on"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_on_error_fail_a_refused_schema_stops_siphon_naming_subject_and_fix() -> Result<()> {
    let Incompatible {
        siphon,
        client,
        _pg,
        broker,
        registry: _registry,
        end,
        ..
    } = incompatible("failing", false).await?;
    let status = siphon.wait_exit(Duration::from_secs(60))?;
    assert!(!status.success(), "{}", siphon.log());
    let log = siphon.log();
    assert!(
        log.contains("outbox.event.Order-value") && log.contains("compatib"),
        "the error names the subject and the fix: {log}"
    );
    assert!(
        slot_confirmed_lsn(&client, "failing").await?.unwrap_or(0) < end,
        "the refused event is not passed"
    );
    let topic = broker.topic("outbox.event.Order");
    let sent = read_topic_async(&broker.bootstrap(), &topic, Duration::from_secs(10)).await?;
    assert_eq!(
        sent.len(),
        1,
        "the event before it was sent, none after: {sent:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_exactly_once_a_read_committed_consumer_decodes_each_avro_event_and_key_once_across_kill_9(
) -> Result<()> {
    use siphon_tests::kafka_read::{read_topic_isolated_async, Isolation};
    let python = python()?;
    let (pg, broker, registry, client) = servers().await?;
    let config = exactly_once(
        &avro_config(&pg, &broker, "eos", &registry.url(), "", ""),
        &broker,
    )
    .replacen("[format]\n", "[format]\nkey = \"avro\"\n", 1);
    let topic = broker.topic("outbox.event.Order");
    // Two shapes, so that ids are looked up in both sessions.
    let payload = |n: usize| {
        if n.is_multiple_of(2) {
            format!(r#"{{"n": {n}, "even": true}}"#)
        } else {
            format!(r#"{{"n": {n}, "odd": "{n}"}}"#)
        }
    };
    let write = |from: usize| {
        let mut sql = String::new();
        for txn in 0..20 {
            sql.push_str("BEGIN;");
            for i in 0..5 {
                let n = from + txn * 5 + i;
                sql.push_str(&insert(n, &format!("order-{}", n % 7), Some(&payload(n))));
            }
            sql.push_str("COMMIT;");
        }
        sql
    };

    let first = started(&client, &config, "eos").await?;
    client.batch_execute(&write(0)).await?;
    wait_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let seen = read_topic_isolated_async(
                &broker.bootstrap(),
                &topic,
                Duration::from_secs(10),
                Isolation::ReadUncommitted,
            )
            .await?;
            Ok(seen.len() >= 30)
        },
    )
    .await
    .with_context(|| first.log())?;
    first.kill9()?;
    client.batch_execute(&write(100)).await?;
    let end = current_insert_lsn(&client).await?;
    let second = SiphonProcess::start(&config)?;
    wait_for_slot_past(&client, "eos", end, Duration::from_secs(120))
        .await
        .with_context(|| second.log())?;

    let committed = read_topic_isolated_async(
        &broker.bootstrap(),
        &topic,
        Duration::from_secs(30),
        Isolation::ReadCommitted,
    )
    .await?;
    let mut ids: Vec<String> = committed
        .iter()
        .map(|r| String::from_utf8_lossy(r.header("id").unwrap_or_default()).into_owned())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 200, "every event");
    assert_eq!(committed.len(), 200, "each once");
    let decoded =
        siphon_tests::python::decode_avro(&python, &registry.url(), &topic, &committed, true)?;
    let mut keys = std::collections::HashMap::new();
    for (record, decoded) in committed.iter().zip(&decoded) {
        let id = String::from_utf8_lossy(record.header("id").unwrap_or_default()).into_owned();
        let n: usize = id.rsplit('-').next().unwrap_or_default().parse()?;
        assert_eq!(decoded["value"], expected(&payload(n)), "event {n}");
        let aggregate = format!("order-{}", n % 7);
        assert_eq!(
            decoded["key"],
            serde_json::json!(aggregate),
            "event {n}: its key"
        );
        let key = record.key.clone().context("a key")?;
        assert_eq!(
            keys.entry(aggregate).or_insert_with(|| key.clone()),
            &key,
            "one aggregate, one key: the same bytes (and partition) in both sessions"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_schemas_write_the_payloads_that_fit_dead_letter_the_rest_and_follow_new_versions_exactly_once(
) -> Result<()> {
    use siphon_schema_registry::{value_subject, RegistryConfig, SchemaKind, SchemaRegistry};
    // The payload as it is: a registered schema keeps empty arrays.
    let json = |payload: &str| -> serde_json::Value {
        serde_json::from_str(payload).expect("a JSON payload")
    };
    let python = python()?;
    let (pg, broker, registry, client) = servers().await?;
    let topic = broker.topic("outbox.event.Order");
    let dead_letter_topic = broker.topic("outbox.registered.dlq");
    let owner = SchemaRegistry::new(&RegistryConfig::new(registry.url()))?;
    let v1 = r#"{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"long"},{"name":"lines","type":{"type":"array","items":{"type":"record","name":"Line","fields":[{"name":"sku","type":"string"},{"name":"qty","type":"int"}]}}}]}"#;
    let id1 = owner
        .register(&value_subject(&topic), SchemaKind::Avro, v1)
        .await?;
    // In Kafka transactions: the records and dead letters of one transaction commit together.
    let config = exactly_once(
        &avro_config(
            &pg,
            &broker,
            "registered",
            &registry.url(),
            &format!("on_error = \"dead-letter\"\ndead_letter_topic = \"{dead_letter_topic}\""),
            "",
        ),
        &broker,
    )
    .replace("\"table.expand.json.payload\" = true\n", "")
    .replace(
        "[schema_registry]\n",
        "[schema_registry]\nschemas = \"registered\"\nlatest_ttl_secs = 1\n",
    );
    let siphon = started(&client, &config, "registered").await?;
    let fits = [
        r#"{"id": 1, "lines": [{"sku": "a", "qty": 2}]}"#,
        r#"{"id": 4, "lines": []}"#,
    ];
    client
        .batch_execute(&format!(
            "BEGIN; {} {} {} {} INSERT INTO outbox VALUES ('00000000-0000-4000-8000-000000000005', 'Ghost', 'k', 'T', '{{}}'); COMMIT;",
            insert(1, "k", Some(fits[0])),
            insert(2, "k", Some(r#"{"id": 2, "lines": [], "color": "red"}"#)),
            insert(3, "k", Some(r#"{"id": "three", "lines": []}"#)),
            insert(4, "k", Some(fits[1])),
        ))
        .await?;
    let events = records(&broker, &topic, 2, &siphon).await?;
    let letters = records(&broker, &dead_letter_topic, 3, &siphon).await?;
    let decoded = decode(&python, &registry, &topic, &events)?;
    assert_eq!(
        decoded,
        fits.iter()
            .map(|p| (json(p), u64::from(id1)))
            .collect::<Vec<_>>(),
        "the payloads that fit, written with the registered schema"
    );
    dead_letters_say(
        &letters,
        &[
            "$.color is not a field of record shop.Order",
            "three",
            "no schema for subject",
        ],
    );

    // A new version is used within the time to live, without a restart.
    let v2 = v1.replace(
        r#"}}}]}"#,
        r#"}}},{"name":"note","type":["null","string"],"default":null}]}"#,
    );
    let id2 = owner
        .register(&value_subject(&topic), SchemaKind::Avro, &v2)
        .await?;
    assert_ne!(id1, id2);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let gift = r#"{"id": 6, "lines": [], "note": "gift"}"#;
    client
        .batch_execute(&format!("BEGIN; {} COMMIT;", insert(6, "k", Some(gift))))
        .await?;
    let end = current_insert_lsn(&client).await?;
    let events = records(&broker, &topic, 3, &siphon).await?;
    wait_for_slot_past(&client, "registered", end, Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    let decoded = decode(&python, &registry, &topic, &events[2..])?;
    assert_eq!(decoded, vec![(json(gift), u64::from(id2))]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_topic_record_subjects_each_event_type_is_written_with_its_schema_or_pinned_version(
) -> Result<()> {
    use siphon_schema_registry::{RegistryConfig, SchemaKind, SchemaRegistry};
    let python = python()?;
    let (pg, broker, registry, client) = servers().await?;
    let topic = broker.topic("outbox.event.Order");
    let dead_letter_topic = broker.topic("outbox.typed.dlq");
    let owner = SchemaRegistry::new(&RegistryConfig::new(registry.url()))?;
    let created = r#"{"type":"record","name":"OrderCreated","fields":[{"name":"id","type":"long"},{"name":"total","type":"double"}]}"#;
    let shipped = r#"{"type":"record","name":"OrderShipped","fields":[{"name":"id","type":"long"},{"name":"carrier","type":"string"}]}"#;
    let created_id = owner
        .register(&format!("{topic}-OrderCreated"), SchemaKind::Avro, created)
        .await?;
    let shipped_id = owner
        .register(&format!("{topic}-OrderShipped"), SchemaKind::Avro, shipped)
        .await?;
    // A second version of OrderCreated, which the configuration pins to its first.
    let created_v2 = created.replace(
        r#""type":"double"}]"#,
        r#""type":"double"},{"name":"note","type":["null","string"],"default":null}]"#,
    );
    owner
        .register(
            &format!("{topic}-OrderCreated"),
            SchemaKind::Avro,
            &created_v2,
        )
        .await?;
    let typed = |n: usize, kind: &str, payload: &str| {
        format!(
            "INSERT INTO outbox VALUES ('00000000-0000-4000-8000-{n:012}', 'Order', 'k', '{kind}', '{payload}');"
        )
    };
    // Written before Siphon's first start: the initial snapshot sends the first and
    // dead-letters the second, which lacks a field, as the stream would.
    client
        .batch_execute(&format!(
            "{} {}",
            typed(100, "OrderShipped", r#"{"id": 100, "carrier": "post"}"#),
            typed(101, "OrderShipped", r#"{"id": 101}"#)
        ))
        .await?;
    let config = avro_config(
        &pg,
        &broker,
        "typed",
        &registry.url(),
        &format!("on_error = \"dead-letter\"\ndead_letter_topic = \"{dead_letter_topic}\""),
        "snapshot = \"initial\"",
    )
    .replace("\"table.expand.json.payload\" = true\n", "")
    .replace(
        "[schema_registry]\n",
        "[schema_registry]\nschemas = \"registered\"\nsubject_name_strategy = \"topic-record\"\n",
    );
    let config = format!("{config}\n[schema_registry.versions]\n\"{topic}-OrderCreated\" = 1\n");
    let siphon = started(&client, &config, "typed").await?;
    client
        .batch_execute(&format!(
            "BEGIN; {} {} {} {} {} COMMIT;",
            typed(1, "OrderCreated", r#"{"id": 1, "total": 9.5}"#),
            typed(2, "OrderShipped", r#"{"id": 1, "carrier": "ups"}"#),
            typed(3, "OrderCreated", r#"{"id": 3, "carrier": "ups"}"#),
            typed(4, "OrderLost", r#"{"id": 4}"#),
            typed(
                5,
                "OrderCreated",
                r#"{"id": 5, "total": 1.5, "note": "gift"}"#
            ),
        ))
        .await?;
    let end = current_insert_lsn(&client).await?;
    let events = records(&broker, &topic, 3, &siphon).await?;
    let letters = records(&broker, &dead_letter_topic, 4, &siphon).await?;
    wait_for_slot_past(&client, "typed", end, Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    let decoded = decode(&python, &registry, &topic, &events)?;
    assert_eq!(
        decoded,
        vec![
            (
                serde_json::json!({"id": 100, "carrier": "post"}),
                u64::from(shipped_id)
            ),
            (
                serde_json::json!({"id": 1, "total": 9.5}),
                u64::from(created_id)
            ),
            (
                serde_json::json!({"id": 1, "carrier": "ups"}),
                u64::from(shipped_id)
            ),
        ],
        "each type with its subject's schema (OrderCreated's pinned first version), the snapshot's row as the stream's"
    );
    dead_letters_say(
        &letters,
        &[
            &format!("{topic}-OrderCreated"),
            &format!("{topic}-OrderLost"),
            "$.note is not a field of record OrderCreated",
        ],
    );
    // The three payloads that did not fit are counted, the snapshot's with the stream's; the
    // missing subject is not a misfit.
    let address = siphon.metrics_address().context("no metrics address")?;
    let port: u16 = address.rsplit(':').next().unwrap_or_default().parse()?;
    let (_, body) = siphon_tests::http::get(port, "/metrics")?;
    assert_eq!(
        siphon_tests::http::metric(&body, "siphon_schema_misfits_total"),
        Some(3.0),
        "{body}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_sr_values_are_the_payloads_that_fit_their_json_schema_framed_with_its_id(
) -> Result<()> {
    use siphon_schema_registry::{value_subject, RegistryConfig, SchemaKind, SchemaRegistry};
    let (pg, broker, registry, client) = servers().await?;
    let topic = broker.topic("outbox.event.Order");
    let dead_letter_topic = broker.topic("outbox.json-sr.dlq");
    let schema = r#"{"$schema":"http://json-schema.org/draft-07/schema#","title":"Order","type":"object","properties":{"id":{"type":"integer"},"lines":{"type":"array","items":{"type":"object","properties":{"sku":{"type":"string"}},"required":["sku"]}}},"required":["id"],"additionalProperties":false}"#;
    let id = SchemaRegistry::new(&RegistryConfig::new(registry.url()))?
        .register(&value_subject(&topic), SchemaKind::Json, schema)
        .await?;
    let config = avro_config(
        &pg,
        &broker,
        "jsonsr",
        &registry.url(),
        &format!("on_error = \"dead-letter\"\ndead_letter_topic = \"{dead_letter_topic}\""),
        "",
    )
    .replace("\"table.expand.json.payload\" = true\n", "")
    .replace("value = \"avro\"", "value = \"json-sr\"")
    .replace(
        "[schema_registry]\n",
        "[schema_registry]\nschemas = \"registered\"\n",
    );
    let siphon = started(&client, &config, "jsonsr").await?;
    let fits = [r#"{"id": 1, "lines": [{"sku": "a"}]}"#, r#"{"id": 3}"#];
    client
        .batch_execute(&format!(
            "BEGIN; {} {} {} {} COMMIT;",
            insert(1, "k", Some(fits[0])),
            insert(2, "k", Some(r#"{"id": "two"}"#)),
            insert(3, "k", Some(fits[1])),
            insert(4, "k", Some(r#"{"id": 4, "lines": [{}]}"#)),
        ))
        .await?;
    let end = current_insert_lsn(&client).await?;
    let events = records(&broker, &topic, 2, &siphon).await?;
    let letters = records(&broker, &dead_letter_topic, 2, &siphon).await?;
    wait_for_slot_past(&client, "jsonsr", end, Duration::from_secs(60))
        .await
        .with_context(|| siphon.log())?;
    for (event, payload) in events.iter().zip(fits) {
        let value = event.value.as_deref().context("a value")?;
        assert_eq!(value[0], 0, "the magic byte");
        assert_eq!(
            u32::from_be_bytes(value[1..5].try_into()?),
            id,
            "the schema id"
        );
        let written: serde_json::Value = serde_json::from_slice(&value[5..])?;
        let expected: serde_json::Value = serde_json::from_str(payload)?;
        assert_eq!(written, expected);
    }
    dead_letters_say(&letters, &["at /id", "at /lines/0"]);
    Ok(())
}
