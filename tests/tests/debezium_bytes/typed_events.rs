//! Protobuf values, CloudEvents and W3C trace context end to end: outbox rows in a real
//! PostgreSQL, records read back from a real broker, decoded by independent implementations
//! (Python's protobuf runtime with the .proto compiled by grpcio-tools, and the CloudEvents
//! SDK's Kafka binding), every field checked.

use anyhow::{Context, Result};
use serde_json::{json, Value};
use siphon_tests::outbox::{route_replacement, siphon_config, start_streaming};
use siphon_tests::python::{decode_records, python};
use siphon_tests::{read_topic_async, wait_for, Broker, ConsumedRecord, Postgres, SiphonProcess};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use tokio_postgres::Client;

const DDL: &str = "CREATE TABLE outbox (
    id uuid PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255),
    type varchar(255) NOT NULL,
    payload jsonb,
    created timestamptz NOT NULL,
    traceparent text,
    tracestate text,
    tenant text)";

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TOPIC: &str = "outbox.event.Order";

/// One row as the test writes it.
struct Row {
    id: String,
    aggregate_id: Option<&'static str>,
    event_type: &'static str,
    payload: Option<&'static str>,
    /// Seconds after 2024-05-01 12:34:56.123456 UTC.
    created_offset: i64,
    traceparent: Option<&'static str>,
    tracestate: Option<&'static str>,
    tenant: Option<&'static str>,
    /// The trace context headers the record must carry.
    expect_trace: (Option<&'static str>, Option<&'static str>),
}

fn rows() -> Vec<Row> {
    let id = |n: u32| format!("00000000-0000-4000-8000-{n:012}");
    vec![
        Row {
            id: id(1),
            aggregate_id: Some("order-1"),
            event_type: "OrderCreated",
            payload: Some(r#"{"n": 1, "text": "zürich \"quoted\""}"#),
            created_offset: 0,
            traceparent: Some(PARENT),
            tracestate: Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
            tenant: Some("acme"),
            expect_trace: (
                Some(PARENT),
                Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
            ),
        },
        Row {
            id: id(2),
            aggregate_id: None,
            event_type: "OrderShipped",
            payload: Some(r#"[1, 2.5, null]"#),
            created_offset: 1,
            traceparent: None,
            tracestate: None,
            tenant: None,
            expect_trace: (None, None),
        },
        Row {
            id: id(3),
            aggregate_id: Some("order-3"),
            event_type: "OrderPaid",
            payload: Some(r#"{"n": 3}"#),
            created_offset: 2,
            traceparent: Some("not-a-trace-parent"),
            tracestate: Some("a=1"),
            tenant: Some("acme"),
            expect_trace: (None, None),
        },
        Row {
            id: id(4),
            aggregate_id: Some("order-4"),
            event_type: "OrderPaid",
            payload: Some(r#"{"n": 4}"#),
            created_offset: 3,
            traceparent: Some(PARENT),
            tracestate: Some("NOT VALID"),
            tenant: Some("beta"),
            expect_trace: (Some(PARENT), None),
        },
    ]
}

/// The seconds and RFC 3339 text of a row's `created` value.
fn created(row: &Row) -> (i64, String) {
    let seconds = 1_714_566_896 + row.created_offset;
    (
        seconds,
        format!("2024-05-01T12:34:{:02}.123456Z", 56 + row.created_offset),
    )
}

/// Inserts the rows in two transactions; returns the id of each row's transaction.
async fn insert(client: &mut Client, rows: &[Row]) -> Result<BTreeMap<String, u32>> {
    let mut xids = BTreeMap::new();
    for chunk in rows.chunks(2) {
        let tx = client.transaction().await?;
        let xid: i64 = tx
            .query_one("SELECT pg_current_xact_id()::text::bigint", &[])
            .await?
            .get(0);
        for row in chunk {
            let created = format!("2024-05-01 12:34:{:02}.123456+00", 56 + row.created_offset);
            tx.execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created, traceparent, tracestate, tenant) \
                 VALUES ($1::text::uuid, 'Order', $2, $3, $4::text::jsonb, $5::text::timestamptz, $6, $7, $8)",
                &[&row.id, &row.aggregate_id, &row.event_type, &row.payload, &created, &row.traceparent, &row.tracestate, &row.tenant],
            )
            .await?;
            xids.insert(row.id.clone(), u32::try_from(xid)?);
        }
        tx.execute("DELETE FROM outbox", &[]).await?;
        tx.commit().await?;
    }
    Ok(xids)
}

/// PostgreSQL's text of a jsonb value (what pgoutput sends).
async fn jsonb_text(client: &Client, text: &str) -> Result<String> {
    Ok(client
        .query_one("SELECT $1::text::jsonb::text", &[&text])
        .await?
        .get(0))
}

struct Run {
    records: Vec<ConsumedRecord>,
    xids: BTreeMap<String, u32>,
    client: Client,
    _siphon: SiphonProcess,
    _broker: Broker,
    _pg: Postgres,
}

/// Starts the services, Siphon with `extra` configuration, writes the rows and reads them back.
/// A `[router]` section in `extra` gets the test's topic namespace (`route.topic.replacement`).
async fn run(slot: &str, extra: &str) -> Result<Run> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let mut client = pg.connect().await?;
    client.batch_execute(DDL).await?;
    let extra = extra.replace(
        "[router]\n",
        &format!("[router]\n{}\n", route_replacement(&broker)),
    );
    let siphon = start_streaming(&client, &siphon_config(&pg, &broker, slot, &extra), slot).await?;
    let rows = rows();
    let xids = insert(&mut client, &rows).await?;
    let (bootstrap, topic) = (broker.bootstrap(), broker.topic(TOPIC));
    let records = wait_for(
        Duration::from_secs(90),
        Duration::from_millis(500),
        || async {
            let records = read_topic_async(&bootstrap, &topic, Duration::from_secs(30)).await?;
            Ok((records.len() >= rows.len()).then_some(records))
        },
    )
    .await
    .with_context(|| format!("siphon log:\n{}", siphon.log()))?;
    anyhow::ensure!(records.len() == rows.len(), "{} records", records.len());
    Ok(Run {
        records,
        xids,
        client,
        _siphon: siphon,
        _broker: broker,
        _pg: pg,
    })
}

/// The decoder, or `None` when python3 is missing (an error under CI: the test must not pass by
/// skipping there).
fn decoder() -> Result<Option<PathBuf>> {
    let python = python()?;
    if python.is_none() {
        siphon_tests::prerequisite_missing(
            "typed events",
            "python3 is not installed; the independent decoders need it",
        )?;
    }
    Ok(python)
}

fn header<'r>(record: &'r ConsumedRecord, name: &str) -> Option<&'r str> {
    record
        .headers
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| v.as_deref())
        .map(|v| std::str::from_utf8(v).expect("UTF-8 header"))
}

fn row_of<'a>(rows: &'a [Row], record: &ConsumedRecord) -> &'a Row {
    let id = header(record, "id").expect("id header");
    rows.iter().find(|r| r.id == id).expect("a row of the test")
}

fn check_trace_headers(record: &ConsumedRecord, row: &Row) {
    assert_eq!(
        header(record, "traceparent"),
        row.expect_trace.0,
        "{}",
        row.id
    );
    assert_eq!(
        header(record, "tracestate"),
        row.expect_trace.1,
        "{}",
        row.id
    );
}

/// The CloudEvents attributes a row must have (datacontenttype excluded).
fn expected_attributes(row: &Row, source: &str) -> Value {
    let mut attributes = json!({
        "specversion": "1.0",
        "id": row.id,
        "source": source,
        "type": row.event_type,
        "time": created(row).1,
    });
    if let Some(subject) = row.aggregate_id {
        attributes["subject"] = json!(subject);
    }
    if let Some(parent) = row.expect_trace.0 {
        attributes["traceparent"] = json!(parent);
    }
    if let Some(state) = row.expect_trace.1 {
        attributes["tracestate"] = json!(state);
    }
    attributes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_values_in_binary_cloudevents_with_trace_context() -> Result<()> {
    let Some(python) = decoder()? else {
        return Ok(());
    };
    let slot = "typed_binary";
    let run = run(
        slot,
        r#"
[router]
"table.field.event.timestamp" = "created"
"table.fields.additional.placement" = "tenant:header"

[format]
key = "string"
value = "protobuf"

[cloudevents]
mode = "binary"

[trace]
column = "traceparent"
state_column = "tracestate"
"#,
    )
    .await?;
    let rows = rows();
    let source = format!("/siphon/siphon/{slot}");

    // The value itself, decoded as protobuf.
    let plain = decode_records(&python, &run.records, &["--protobuf"])?;
    // The same records through the CloudEvents SDK's binary-mode Kafka binding.
    let events = decode_records(
        &python,
        &run.records,
        &["--protobuf", "--cloudevents", "binary"],
    )?;

    for ((record, plain), event) in run.records.iter().zip(&plain).zip(&events) {
        let row = row_of(&rows, record);
        let (seconds, rfc3339) = created(row);
        let payload = jsonb_text(&run.client, row.payload.expect("payload")).await?;
        let message = &plain["protobuf"];
        let mut fields = serde_json::Map::new();
        if let Some(tenant) = row.tenant {
            fields.insert("tenant".into(), json!(tenant));
        }
        // The source position of the row: its transaction's commit LSN, its own LSN before it,
        // and the transaction id the application saw.
        let commit_lsn = message["commit_lsn"].as_u64().expect("number");
        let lsn = message["lsn"].as_u64().expect("number");
        assert!(lsn > 0 && lsn < commit_lsn, "{message}");
        let (commit_lsn, lsn, xid) = (json!(commit_lsn), json!(lsn), json!(run.xids[&row.id]));
        assert_eq!(
            message,
            &json!({
                "id": row.id,
                "aggregate_type": "Order",
                "aggregate_id": row.aggregate_id.unwrap_or(""),
                "type": row.event_type,
                "payload_hex": payload.as_bytes().iter().map(|b| format!("{b:02x}")).collect::<String>(),
                "content_type": "application/json",
                "has_timestamp": true,
                "timestamp_seconds": seconds,
                "timestamp_nanos": 123_456_000,
                "timestamp_rfc3339": rfc3339,
                "commit_lsn": commit_lsn,
                "lsn": lsn,
                "xid": xid,
                "table": "public.outbox",
                "fields": fields,
                "has_payload": true,
            }),
            "{}",
            row.id
        );
        // CloudEvents: the attributes, and the data is the same protobuf message.
        let mut attributes = expected_attributes(row, &source);
        attributes["datacontenttype"] = json!("application/protobuf");
        assert_eq!(event["cloudevent"]["attributes"], attributes, "{}", row.id);
        assert_eq!(&event["protobuf"], message, "{}", row.id);
        // The key stays as configured; the Debezium headers stay.
        assert_eq!(record.key.as_deref(), row.aggregate_id.map(str::as_bytes));
        assert_eq!(header(record, "tenant"), row.tenant);
        check_trace_headers(record, row);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_cloudevents_embed_json_and_carry_the_trace() -> Result<()> {
    let Some(python) = decoder()? else {
        return Ok(());
    };
    let run = run(
        "typed_structured",
        r#"
[router]
"table.field.event.timestamp" = "created"

[format]
value = "string"

[cloudevents]
mode = "structured"
source = "urn:example:orders"

[trace]
column = "traceparent"
state_column = "tracestate"
"#,
    )
    .await?;
    let rows = rows();
    let events = decode_records(&python, &run.records, &["--cloudevents", "structured"])?;
    for (record, event) in run.records.iter().zip(&events) {
        let row = row_of(&rows, record);
        let payload = jsonb_text(&run.client, row.payload.expect("payload")).await?;
        let mut attributes = expected_attributes(row, "urn:example:orders");
        attributes["datacontenttype"] = json!("application/json");
        assert_eq!(event["cloudevent"]["attributes"], attributes, "{}", row.id);
        assert_eq!(
            event["cloudevent"]["data"],
            serde_json::from_str::<Value>(&payload)?,
            "{}",
            row.id
        );
        assert_eq!(
            header(record, "content-type"),
            Some("application/cloudevents+json; charset=UTF-8")
        );
        check_trace_headers(record, row);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_cloudevents_carry_protobuf_as_base64() -> Result<()> {
    let Some(python) = decoder()? else {
        return Ok(());
    };
    let run = run(
        "typed_structured_pb",
        r#"
[format]
value = "protobuf"

[cloudevents]
mode = "structured"
"#,
    )
    .await?;
    let rows = rows();
    let events = decode_records(
        &python,
        &run.records,
        &["--protobuf", "--cloudevents", "structured"],
    )?;
    for (record, event) in run.records.iter().zip(&events) {
        let row = row_of(&rows, record);
        assert_eq!(
            event["cloudevent"]["attributes"]["datacontenttype"],
            json!("application/protobuf")
        );
        assert_eq!(event["cloudevent"]["attributes"]["id"], json!(row.id));
        assert_eq!(
            event["cloudevent"]["attributes"]["type"],
            json!(row.event_type)
        );
        let message = &event["protobuf"];
        assert_eq!(message["id"], json!(row.id), "{event}");
        assert_eq!(message["type"], json!(row.event_type));
        assert_eq!(message["table"], json!("public.outbox"));
        // No timestamp column: the event time is the commit time.
        let attributes = &event["cloudevent"]["attributes"];
        assert_eq!(message["xid"], json!(run.xids[&row.id]));
        assert_eq!(message["has_timestamp"], json!(true));
        assert_eq!(attributes["time"], message["timestamp_rfc3339"], "{event}");
        // No trace configured: no trace headers.
        assert_eq!(header(record, "traceparent"), None);
    }
    Ok(())
}

#[test]
fn impossible_combinations_are_refused_before_connecting() -> Result<()> {
    let bin = siphon_tests::siphon_bin()?;
    let dir = tempfile::tempdir()?;
    let cases = [
        ("[format]\nkey = \"protobuf\"\n", "format.key = \"protobuf\""),
        ("[cloudevents]\nmode = \"envelope\"\n", "unknown variant `envelope`"),
        (
            "[router]\n\"route.tombstone.on.empty.payload\" = true\n[cloudevents]\nmode = \"structured\"\n",
            "cannot write the tombstones",
        ),
        (
            "[cloudevents]\nmode = \"binary\"\nsource = \"not a uri\"\n",
            "is not a URI-reference",
        ),
        ("[trace]\nstate_column = \"tracestate\"\n", "trace.column"),
    ];
    for (extra, needle) in cases {
        let path = dir.path().join("siphon.toml");
        std::fs::write(
            &path,
            format!("[source]\nurl = \"postgres://siphon@127.0.0.1:1/app\"\n[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n{extra}"),
        )?;
        let output = std::process::Command::new(&bin)
            .args(["check-config", "--config"])
            .arg(&path)
            .output()?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{extra} was accepted");
        assert!(stderr.contains(needle), "{extra}: {stderr}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_trace_column_is_named() -> Result<()> {
    let pg = Postgres::start()?;
    let broker = Broker::start()?;
    let client = pg.connect().await?;
    client
        .batch_execute(
            "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, \
             aggregateid text, type text NOT NULL, payload jsonb)",
        )
        .await?;
    let siphon = SiphonProcess::start(&siphon_config(
        &pg,
        &broker,
        "typed_missing_trace",
        "[trace]\ncolumn = \"traceparent\"\n",
    ))?;
    siphon
        .wait_for_log("streaming", Duration::from_secs(60))
        .await?;
    client
        .batch_execute(
            "INSERT INTO outbox VALUES (gen_random_uuid(), 'Order', 'o-1', 'Created', '{}')",
        )
        .await?;
    let status = siphon.wait_exit(Duration::from_secs(60))?;
    assert!(!status.success(), "siphon went on without the trace column");
    let log = siphon.log();
    assert!(
        log.contains("\"traceparent\"") && log.contains("trace.column"),
        "{log}"
    );
    Ok(())
}
