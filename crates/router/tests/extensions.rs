//! Protobuf values, CloudEvents and W3C trace context through the public API, with exact
//! expected bytes.

use bytes::Bytes;
use pgoutput::{Column, Lsn, Relation, RelationColumn, ReplicaIdentity, Text, TupleData};
use siphon_router::{
    Change, CloudEventsMode, CloudEventsOptions, Encoding, EventExtensions, EventRouter, Format,
    RouteError, Routed, RoutedRecord, RouterOptions, SourcePosition, TraceOptions,
};
use std::collections::BTreeMap;

const UUID: u32 = 2950;
const VARCHAR: u32 = 1043;
const TEXT: u32 = 25;
const JSONB: u32 = 3802;
const BYTEA: u32 = 17;
const TIMESTAMPTZ: u32 = 1184;

const EVENT_ID: &str = "4d47e190-0402-4048-bc2c-89dd54343cdc";
const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn relation(payload_type: u32) -> Relation {
    let columns = [
        ("id", UUID),
        ("aggregatetype", VARCHAR),
        ("aggregateid", VARCHAR),
        ("type", VARCHAR),
        ("payload", payload_type),
        ("created", TIMESTAMPTZ),
        ("traceparent", TEXT),
        ("tracestate", TEXT),
        ("tenant", TEXT),
    ];
    Relation {
        xid: None,
        id: 16_400,
        namespace: Text::from_static("public"),
        name: Text::from_static("outbox"),
        replica_identity: ReplicaIdentity::Default,
        columns: columns
            .iter()
            .map(|&(name, type_oid)| RelationColumn {
                flags: 0,
                name: Text::from_static(name),
                type_oid,
                type_modifier: -1,
            })
            .collect(),
    }
}

fn t(text: &str) -> Column {
    Column::Text(Bytes::copy_from_slice(text.as_bytes()))
}

fn row(payload: Column, parent: Column, state: Column) -> TupleData {
    TupleData {
        columns: vec![
            t(EVENT_ID),
            t("Order"),
            t("order-1"),
            t("OrderCreated"),
            payload,
            t("2024-05-01 12:34:56.123456+00"),
            parent,
            state,
            t("acme"),
        ],
    }
}

const POSITION: SourcePosition = SourcePosition {
    commit_lsn: Lsn(0x0100_0000_0200),
    lsn: Lsn(0x0100_0000_0100),
    xid: 731,
    commit_time_us: Some(1_714_566_900_000_000),
};

fn router(options: &[(&str, &str)], value: Encoding, extensions: EventExtensions) -> EventRouter {
    let map: BTreeMap<String, String> = options
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let options = RouterOptions::from_map(&map).expect("valid options");
    EventRouter::new(
        options,
        Format {
            key: Encoding::String,
            value,
            ..Format::default()
        },
    )
    .with_extensions(extensions)
    .expect("a valid combination")
}

fn route(router: &EventRouter, payload_type: u32, row: &TupleData) -> RoutedRecord {
    let binding = router.bind(&relation(payload_type)).expect("binds");
    match router.route_at(&binding, Change::Insert(row), &POSITION) {
        Ok(Routed::Record(record)) => record,
        other => panic!("expected a record, got {other:?}"),
    }
}

fn headers(record: &RoutedRecord) -> Vec<(String, String)> {
    record
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value.as_deref().unwrap_or(b"<null>")).into_owned(),
            )
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect()
}

fn protobuf() -> EventExtensions {
    EventExtensions {
        protobuf_value: true,
        ..EventExtensions::default()
    }
}

fn cloudevents(mode: CloudEventsMode) -> EventExtensions {
    EventExtensions {
        cloudevents: Some(CloudEventsOptions {
            mode,
            source: "/siphon/app/slot".into(),
        }),
        ..EventExtensions::default()
    }
}

fn trace() -> Option<TraceOptions> {
    Some(TraceOptions {
        column: "traceparent".into(),
        state_column: Some("tracestate".into()),
    })
}

/// Appends a length-delimited field.
fn field(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    out.push(tag);
    assert!(bytes.len() < 128);
    out.push(bytes.len() as u8);
    out.extend_from_slice(bytes);
}

#[test]
fn protobuf_value_exact_bytes() {
    let router = router(
        &[
            ("table.field.event.timestamp", "created"),
            ("table.fields.additional.placement", "tenant:header"),
        ],
        Encoding::Json,
        protobuf(),
    );
    let record = route(
        &router,
        JSONB,
        &row(t(r#"{"a": 1}"#), Column::Null, Column::Null),
    );
    let mut expected = Vec::new();
    field(&mut expected, 0x0a, EVENT_ID.as_bytes());
    field(&mut expected, 0x12, b"Order");
    field(&mut expected, 0x1a, b"order-1");
    field(&mut expected, 0x22, b"OrderCreated");
    field(&mut expected, 0x2a, br#"{"a": 1}"#);
    field(&mut expected, 0x32, b"application/json");
    // Timestamp {seconds: 1714566896, nanos: 123456000}.
    field(
        &mut expected,
        0x3a,
        b"\x08\xf0\xed\xc8\xb1\x06\x10\x80\x94\xef\x3a",
    );
    // SourcePosition {commit_lsn, lsn, xid: 731, table}.
    let mut source = Vec::new();
    source.extend_from_slice(b"\x08\x80\x84\x80\x80\x80\x20");
    source.extend_from_slice(b"\x10\x80\x82\x80\x80\x80\x20");
    source.extend_from_slice(b"\x18\xdb\x05");
    field(&mut source, 0x22, b"public.outbox");
    field(&mut expected, 0x42, &source);
    field(&mut expected, 0x4a, b"\x0a\x06tenant\x12\x04acme");
    expected.extend_from_slice(b"\x50\x01");
    assert_eq!(record.value.as_deref(), Some(expected.as_slice()));
    // The key and the Debezium headers stay.
    assert_eq!(record.key.as_deref(), Some(&b"order-1"[..]));
    assert_eq!(
        headers(&record),
        pairs(&[("id", EVENT_ID), ("tenant", "acme")])
    );
}

#[test]
fn protobuf_value_of_a_bytea_payload_and_an_unknown_position() {
    let router = router(&[], Encoding::Json, protobuf());
    let binding = router.bind(&relation(BYTEA)).expect("binds");
    let row = row(t("\\x00ff"), Column::Null, Column::Null);
    let Ok(Routed::Record(record)) = router.route(&binding, Change::Insert(&row)) else {
        panic!("expected a record");
    };
    let mut expected = Vec::new();
    field(&mut expected, 0x0a, EVENT_ID.as_bytes());
    field(&mut expected, 0x12, b"Order");
    field(&mut expected, 0x1a, b"order-1");
    field(&mut expected, 0x22, b"OrderCreated");
    field(&mut expected, 0x2a, b"\x00\xff");
    field(&mut expected, 0x32, b"application/octet-stream");
    // No timestamp column and no commit time: no timestamp; a zero position.
    field(&mut expected, 0x42, b"\x22\x0dpublic.outbox");
    expected.extend_from_slice(b"\x50\x01");
    assert_eq!(record.value.as_deref(), Some(expected.as_slice()));
}

#[test]
fn cloudevents_binary_mode_keeps_the_value_and_adds_headers() {
    let mut extensions = cloudevents(CloudEventsMode::Binary);
    extensions.trace = trace();
    let router = router(
        &[("table.field.event.timestamp", "created")],
        Encoding::String,
        extensions,
    );
    let record = route(
        &router,
        JSONB,
        &row(t(r#"{"a": 1}"#), t(PARENT), t("rojo=00f067aa0ba902b7")),
    );
    assert_eq!(record.value.as_deref(), Some(&br#"{"a": 1}"#[..]));
    assert_eq!(
        headers(&record),
        pairs(&[
            ("id", EVENT_ID),
            ("ce_specversion", "1.0"),
            ("ce_id", EVENT_ID),
            ("ce_source", "/siphon/app/slot"),
            ("ce_type", "OrderCreated"),
            ("ce_subject", "order-1"),
            ("ce_time", "2024-05-01T12:34:56.123456Z"),
            ("ce_traceparent", PARENT),
            ("ce_tracestate", "rojo=00f067aa0ba902b7"),
            ("content-type", "application/json"),
            ("traceparent", PARENT),
            ("tracestate", "rojo=00f067aa0ba902b7"),
        ])
    );
    assert_eq!(router.malformed_trace_contexts(), 0);
}

#[test]
fn cloudevents_binary_mode_content_types_follow_the_value_format() {
    let content_type = |value: Encoding, payload_type: u32, payload: &str| {
        let router = router(&[], value, cloudevents(CloudEventsMode::Binary));
        let record = route(
            &router,
            payload_type,
            &row(t(payload), Column::Null, Column::Null),
        );
        headers(&record)
            .into_iter()
            .find(|(n, _)| n == "content-type")
            .map(|(_, v)| v)
    };
    let json = Some("application/json".to_owned());
    assert_eq!(content_type(Encoding::Json, TEXT, "x"), json);
    assert_eq!(content_type(Encoding::JsonSchemas, JSONB, "{}"), json);
    assert_eq!(content_type(Encoding::String, JSONB, "{}"), json);
    assert_eq!(
        content_type(Encoding::String, TEXT, "x"),
        Some("text/plain; charset=utf-8".to_owned())
    );
    assert_eq!(
        content_type(Encoding::Binary, BYTEA, "\\x00"),
        Some("application/octet-stream".to_owned())
    );
    let router = router(
        &[],
        Encoding::Json,
        EventExtensions {
            protobuf_value: true,
            ..cloudevents(CloudEventsMode::Binary)
        },
    );
    let record = route(&router, JSONB, &row(t("{}"), Column::Null, Column::Null));
    assert!(headers(&record).contains(&("content-type".into(), "application/protobuf".into())));
}

#[test]
fn cloudevents_structured_mode_exact_values() {
    // No event timestamp column: the commit time is the event time.
    let router_for = |value| router(&[], value, cloudevents(CloudEventsMode::Structured));
    let attributes = format!(
        r#"{{"specversion":"1.0","id":"{EVENT_ID}","source":"/siphon/app/slot","type":"OrderCreated","subject":"order-1","time":"2024-05-01T12:35:00Z","#
    );
    let cases: [(Encoding, u32, &str, String); 4] = [
        (
            Encoding::String,
            JSONB,
            r#"{"a": 1}"#,
            r#""datacontenttype":"application/json","data":{"a": 1}}"#.to_owned(),
        ),
        (
            Encoding::Json,
            JSONB,
            r#"{"a": 1}"#,
            r#""datacontenttype":"application/json","data":"{\"a\": 1}"}"#.to_owned(),
        ),
        (
            Encoding::String,
            TEXT,
            "hi \"you\"",
            r#""datacontenttype":"text/plain; charset=utf-8","data":"hi \"you\""}"#.to_owned(),
        ),
        (
            Encoding::Binary,
            BYTEA,
            "\\x00ff10",
            r#""datacontenttype":"application/octet-stream","data_base64":"AP8Q"}"#.to_owned(),
        ),
    ];
    for (value, payload_type, payload, rest) in cases {
        let record = route(
            &router_for(value),
            payload_type,
            &row(t(payload), Column::Null, Column::Null),
        );
        assert_eq!(
            record.value_str(),
            format!("{attributes}{rest}"),
            "{value:?} {payload_type}"
        );
        assert_eq!(
            headers(&record),
            pairs(&[
                ("id", EVENT_ID),
                (
                    "content-type",
                    "application/cloudevents+json; charset=UTF-8"
                ),
            ])
        );
    }
}

trait ValueStr {
    fn value_str(&self) -> String;
}

impl ValueStr for RoutedRecord {
    fn value_str(&self) -> String {
        String::from_utf8_lossy(self.value.as_deref().unwrap_or_default()).into_owned()
    }
}

#[test]
fn cloudevents_structured_protobuf_data_is_base64() {
    let router = router(
        &[],
        Encoding::Json,
        EventExtensions {
            protobuf_value: true,
            ..cloudevents(CloudEventsMode::Structured)
        },
    );
    let plain = {
        let r = self::router(&[], Encoding::Json, protobuf());
        route(&r, JSONB, &row(t("{}"), Column::Null, Column::Null))
    };
    let record = route(&router, JSONB, &row(t("{}"), Column::Null, Column::Null));
    let value = record.value_str();
    let mut b64 = String::new();
    {
        // Standard base64 with padding, written out independently of the router.
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let data = plain.value.as_deref().unwrap_or_default();
        for chunk in data.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
            for i in 0..4 {
                if i <= chunk.len() {
                    b64.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    b64.push('=');
                }
            }
        }
    }
    assert!(
        value.ends_with(&format!(
            r#""datacontenttype":"application/protobuf","data_base64":"{b64}"}}"#
        )),
        "{value}"
    );
}

#[test]
fn trace_context_headers_and_malformed_values() {
    let router = router(
        &[],
        Encoding::String,
        EventExtensions {
            trace: trace(),
            ..EventExtensions::default()
        },
    );
    let record = route(&router, JSONB, &row(t("{}"), t(PARENT), t("a=1,b=2")));
    assert_eq!(
        headers(&record),
        pairs(&[
            ("id", EVENT_ID),
            ("traceparent", PARENT),
            ("tracestate", "a=1,b=2")
        ])
    );
    assert_eq!(record.value.as_deref(), Some(&b"{}"[..]));

    // NULL and empty: nothing written, nothing counted.
    for parent in [Column::Null, t("")] {
        let record = route(&router, JSONB, &row(t("{}"), parent, t("a=1")));
        assert_eq!(headers(&record), pairs(&[("id", EVENT_ID)]));
    }
    assert_eq!(router.malformed_trace_contexts(), 0);

    // A malformed parent drops both; a malformed state drops only itself. Both counted.
    let record = route(&router, JSONB, &row(t("{}"), t("00-nope"), t("a=1")));
    assert_eq!(headers(&record), pairs(&[("id", EVENT_ID)]));
    let record = route(&router, JSONB, &row(t("{}"), t(PARENT), t("NOT VALID")));
    assert_eq!(
        headers(&record),
        pairs(&[("id", EVENT_ID), ("traceparent", PARENT)])
    );
    assert_eq!(router.malformed_trace_contexts(), 2);
    // Clones share the count.
    assert_eq!(router.clone().malformed_trace_contexts(), 2);
}

#[test]
fn without_extensions_records_are_unchanged() {
    let map = BTreeMap::new();
    let plain = EventRouter::new(
        RouterOptions::from_map(&map).expect("defaults"),
        Format::default(),
    );
    let extended = plain
        .clone()
        .with_extensions(EventExtensions::default())
        .expect("defaults");
    let binding = plain.bind(&relation(JSONB)).expect("binds");
    let row = row(t("{}"), t(PARENT), Column::Null);
    assert_eq!(
        plain.route(&binding, Change::Insert(&row)),
        extended.route_at(&binding, Change::Insert(&row), &POSITION)
    );
}

#[test]
fn missing_and_null_extra_columns_are_errors_naming_the_option() {
    let router = router(&[], Encoding::Json, cloudevents(CloudEventsMode::Binary));
    let mut without_type = relation(JSONB);
    without_type.columns.retain(|c| c.name.as_str() != "type");
    match router.bind(&without_type) {
        Err(RouteError::MissingColumn { option, column, .. }) => {
            assert_eq!(
                (option, column.as_str()),
                ("table.field.event.type", "type")
            );
        }
        other => panic!("expected a missing column, got {other:?}"),
    }
    let binding = router.bind(&relation(JSONB)).expect("binds");
    let mut null_type = row(t("{}"), Column::Null, Column::Null);
    null_type.columns[3] = Column::Null;
    match router.route(&binding, Change::Insert(&null_type)) {
        Err(e @ RouteError::NullColumn { .. }) => {
            assert!(e.to_string().contains("table.field.event.type"), "{e}");
        }
        other => panic!("expected a NULL column error, got {other:?}"),
    }
    let tracing = self::router(
        &[],
        Encoding::Json,
        EventExtensions {
            trace: Some(TraceOptions {
                column: "missing_trace".into(),
                state_column: None,
            }),
            ..EventExtensions::default()
        },
    );
    assert!(matches!(
        tracing.bind(&relation(JSONB)),
        Err(RouteError::MissingColumn {
            option: "trace.column",
            ..
        })
    ));
}

#[test]
fn protobuf_values_keep_tombstones_when_asked() {
    let null_payload = row(Column::Null, Column::Null, Column::Null);
    let blank_payload = row(t(" "), Column::Null, Column::Null);
    let tombstones = router(
        &[("route.tombstone.on.empty.payload", "true")],
        Encoding::Json,
        protobuf(),
    );
    assert_eq!(route(&tombstones, TEXT, &null_payload).value, None);
    assert_eq!(route(&tombstones, TEXT, &blank_payload).value, None);
    // Without the option a NULL payload is a message with has_payload = false.
    let messages = router(&[], Encoding::Json, protobuf());
    let value = route(&messages, TEXT, &null_payload)
        .value
        .expect("a message");
    // The last field is the source position: has_payload (false) is left out.
    assert!(value.ends_with(b"\x22\x0dpublic.outbox"), "{value:?}");
}
