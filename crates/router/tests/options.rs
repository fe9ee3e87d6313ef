//! Every EventRouter option and encoding beyond the defaults, with exact expected bytes.
//!
//! Expected bytes follow these sources (read, not copied):
//! - Debezium `EventRouterDelegate.apply` (debezium-connect-plugins,
//!   io/debezium/transforms/outbox): header order (record headers, then `id`, then header
//!   placements), the envelope struct `{payload, alias…}` and its schema name, tombstones for a
//!   NULL or blank payload, the partition placement, `getEventTimestampMs`.
//! - Debezium `JsonSchemaData`: the schema inferred for an expanded payload.
//! - Debezium `DebeziumHeaderProducer.contextHeaders` and `EventDispatcher`: the four
//!   `__debezium.context.*` headers, in that order, before the transform runs.
//! - Kafka `JsonConverter.asJsonSchema` / `convertToJson` / `fromConnectData`: schema member
//!   order `type, items|fields, optional, name, version`, `field` last in struct fields, and
//!   `{"schema":…,"payload":…}`.
//! - Kafka `Struct.toString`: `Struct{a=1,b=x}` with null fields left out (StringConverter).
//! - Debezium `BinaryDataConverter.fromConnectData`: byte arrays as they are.

use bytes::Bytes;
use pgoutput::{Column, Relation, RelationColumn, ReplicaIdentity, Text, TupleData};
use proptest::prelude::*;
use siphon_router::{
    Change, Encoding, EventRouter, Format, Header, RegistryRecord, RegistryValue, RouteError,
    Routed, RoutedRecord, RouterConfigError, RouterContext, RouterOptions, SkipReason,
    TableBinding,
};
use std::collections::BTreeMap;

const UUID: u32 = 2950;
const VARCHAR: u32 = 1043;
const TEXT: u32 = 25;
const JSONB: u32 = 3802;
const INT2: u32 = 21;
const INT4: u32 = 23;
const INT8: u32 = 20;
const BOOL: u32 = 16;
const FLOAT8: u32 = 701;
const BYTEA: u32 = 17;
const TIMESTAMP: u32 = 1114;
const TIMESTAMPTZ: u32 = 1184;

const EVENT_ID: &str = "4d47e190-0402-4048-bc2c-89dd54343cdc";

fn relation(columns: &[(&'static str, u32, i32)]) -> Relation {
    Relation {
        xid: None,
        id: 16_400,
        namespace: Text::from_static("public"),
        name: Text::from_static("outbox"),
        replica_identity: ReplicaIdentity::Default,
        columns: columns
            .iter()
            .map(|&(name, type_oid, type_modifier)| RelationColumn {
                flags: 0,
                name: Text::from_static(name),
                type_oid,
                type_modifier,
            })
            .collect(),
    }
}

/// Debezium's example outbox table plus columns for the extra options.
fn table() -> Relation {
    relation(&[
        ("id", UUID, -1),
        ("aggregatetype", VARCHAR, 259),
        ("aggregateid", VARCHAR, 259),
        ("type", VARCHAR, 259),
        ("payload", JSONB, -1),
        ("created_at", TIMESTAMP, -1),
        ("created_tz", TIMESTAMPTZ, -1),
        ("created_ms", TIMESTAMP, 3),
        ("part", INT4, -1),
        ("version", INT4, -1),
        ("tenant", TEXT, -1),
    ])
}

fn t(text: &str) -> Column {
    Column::Text(Bytes::copy_from_slice(text.as_bytes()))
}

struct Row {
    aggregatetype: Column,
    aggregateid: Column,
    kind: Column,
    payload: Column,
    created_at: Column,
    created_tz: Column,
    created_ms: Column,
    part: Column,
    version: Column,
    tenant: Column,
}

impl Default for Row {
    fn default() -> Self {
        Row {
            aggregatetype: t("Order"),
            aggregateid: t("1"),
            kind: t("OrderCreated"),
            payload: t(r#"{"id": 1, "note": "café \"quoted\"\ttab"}"#),
            created_at: t("2024-05-01 12:34:56.123456"),
            created_tz: t("2024-05-01 12:34:56.123456+00"),
            created_ms: t("2024-05-01 12:34:56.123"),
            part: t("3"),
            version: t("7"),
            tenant: Column::Null,
        }
    }
}

impl Row {
    fn tuple(self) -> TupleData {
        TupleData {
            columns: vec![
                t(EVENT_ID),
                self.aggregatetype,
                self.aggregateid,
                self.kind,
                self.payload,
                self.created_at,
                self.created_tz,
                self.created_ms,
                self.part,
                self.version,
                self.tenant,
            ],
        }
    }
}

fn options(pairs: &[(&str, &str)]) -> RouterOptions {
    let map: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    match RouterOptions::from_map(&map) {
        Ok(o) => o,
        Err(e) => panic!("{e}"),
    }
}

fn format(key: Encoding, value: Encoding) -> Format {
    Format {
        key,
        value,
        ..Format::default()
    }
}

/// NOT NULL as in Debezium's example table: all but payload.
fn bind(router: &EventRouter, rel: &Relation) -> TableBinding {
    match router.bind_with_not_null(rel, &|c| {
        matches!(c, "id" | "aggregatetype" | "aggregateid" | "type")
    }) {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    }
}

fn route(pairs: &[(&str, &str)], fmt: Format, row: Row) -> RoutedRecord {
    let r = EventRouter::new(options(pairs), fmt);
    let b = bind(&r, &table());
    match r.route(&b, Change::Insert(&row.tuple())) {
        Ok(Routed::Record(rec)) => rec,
        other => panic!("expected a record, got {other:?}"),
    }
}

fn route_err(pairs: &[(&str, &str)], fmt: Format, row: Row) -> RouteError {
    let r = EventRouter::new(options(pairs), fmt);
    let b = bind(&r, &table());
    match r.route(&b, Change::Insert(&row.tuple())) {
        Err(e) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

fn text(bytes: &Option<Bytes>) -> String {
    match bytes {
        Some(b) => String::from_utf8(b.to_vec()).unwrap_or_else(|_| format!("{b:?}")),
        None => "<null>".to_owned(),
    }
}

fn header(name: &str, value: Option<&str>) -> Header {
    Header {
        name: name.into(),
        value: value.map(|v| Bytes::copy_from_slice(v.as_bytes())),
    }
}

fn id_header() -> Header {
    header("id", Some(EVENT_ID))
}

const JSON: Encoding = Encoding::Json;
const SCHEMAS: Encoding = Encoding::JsonSchemas;
const STRING: Encoding = Encoding::String;

// ---------------------------------------------------------------- timestamps

#[test]
fn event_timestamp_columns() {
    // 2024-05-01 12:34:56 UTC = 1714566896 s.
    for (column, expected) in [
        ("created_at", 1_714_566_896_123),
        ("created_tz", 1_714_566_896_123),
        ("created_ms", 1_714_566_896_123),
    ] {
        let rec = route(
            &[("table.field.event.timestamp", column)],
            format(JSON, JSON),
            Row::default(),
        );
        assert_eq!(rec.timestamp_ms, Some(expected), "{column}");
    }
    let rec = route(
        &[("table.field.event.timestamp", "created_tz")],
        format(JSON, JSON),
        Row {
            created_tz: t("2024-05-01 14:34:56.999+02"),
            ..Row::default()
        },
    );
    assert_eq!(rec.timestamp_ms, Some(1_714_566_896_999));
    // NULL: Debezium falls back to the processing time.
    let rec = route(
        &[("table.field.event.timestamp", "created_at")],
        format(JSON, JSON),
        Row {
            created_at: Column::Null,
            ..Row::default()
        },
    );
    assert_eq!(rec.timestamp_ms, None);
    // Without the option: processing time.
    assert_eq!(
        route(&[], format(JSON, JSON), Row::default()).timestamp_ms,
        None
    );
}

#[test]
fn event_timestamp_errors() {
    let err = route_err(
        &[("table.field.event.timestamp", "created_at")],
        format(JSON, JSON),
        Row {
            created_at: t("infinity"),
            ..Row::default()
        },
    );
    assert!(
        matches!(err, RouteError::InfiniteTimestamp { .. }),
        "{err:?}"
    );
    let r = EventRouter::new(
        options(&[("table.field.event.timestamp", "part")]),
        Format::default(),
    );
    let err = r.bind(&table());
    assert!(
        matches!(&err, Err(RouteError::ColumnTypeMismatch { column, .. }) if column == "part"),
        "{err:?}"
    );
    let r = EventRouter::new(
        options(&[("table.field.event.timestamp", "nope")]),
        Format::default(),
    );
    assert!(matches!(
        r.bind(&table()),
        Err(RouteError::MissingColumn { .. })
    ));
}

// ---------------------------------------------------------------- additional placements

#[test]
fn header_placements_follow_the_id_header_in_order() {
    let rec = route(
        &[(
            "table.fields.additional.placement",
            "type:header:eventType,tenant:header,aggregateid:header",
        )],
        format(JSON, JSON),
        Row::default(),
    );
    assert_eq!(
        rec.headers,
        vec![
            id_header(),
            header("eventType", Some("OrderCreated")),
            // A NULL column gives a null header value.
            header("tenant", None),
            header("aggregateid", Some("1")),
        ]
    );
    // Headers never change the value.
    assert_eq!(
        text(&rec.value),
        r#""{\"id\": 1, \"note\": \"café \\\"quoted\\\"\\ttab\"}""#
    );
}

#[test]
fn envelope_placement_in_every_encoding() {
    let opts = [(
        "table.fields.additional.placement",
        "type:envelope:eventType,tenant:envelope",
    )];
    let rec = route(&opts, format(JSON, JSON), Row::default());
    assert_eq!(
        text(&rec.value),
        r#"{"payload":"{\"id\": 1, \"note\": \"café \\\"quoted\\\"\\ttab\"}","eventType":"OrderCreated","tenant":null}"#
    );
    assert_eq!(rec.headers, vec![id_header()]);

    let rec = route(
        &[
            (
                "table.fields.additional.placement",
                "type:envelope:eventType,tenant:envelope",
            ),
            ("topic.prefix", "dbserver1"),
        ],
        format(SCHEMAS, SCHEMAS),
        Row::default(),
    );
    assert_eq!(
        text(&rec.value),
        concat!(
            r#"{"schema":{"type":"struct","fields":["#,
            r#"{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1,"field":"payload"},"#,
            r#"{"type":"string","optional":false,"field":"eventType"},"#,
            r#"{"type":"string","optional":true,"field":"tenant"}"#,
            r#"],"optional":false,"name":"dbserver1.public.outbox.Order.Value"},"#,
            r#""payload":{"payload":"{\"id\": 1, \"note\": \"café \\\"quoted\\\"\\ttab\"}","eventType":"OrderCreated","tenant":null}}"#
        )
    );
    assert_eq!(
        text(&rec.key),
        r#"{"schema":{"type":"string","optional":false},"payload":"1"}"#
    );

    let rec = route(&opts, format(STRING, STRING), Row::default());
    assert_eq!(
        text(&rec.value),
        r#"Struct{payload={"id": 1, "note": "café \"quoted\"\ttab"},eventType=OrderCreated}"#
    );
}

#[test]
fn schema_version_applies_to_the_envelope_schema() {
    let opts = [
        ("table.fields.additional.placement", "type:envelope"),
        ("table.field.event.schema.version", "version"),
        ("topic.prefix", "srv"),
    ];
    let rec = route(&opts, format(STRING, SCHEMAS), Row::default());
    assert_eq!(
        text(&rec.value),
        concat!(
            r#"{"schema":{"type":"struct","fields":["#,
            r#"{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1,"field":"payload"},"#,
            r#"{"type":"string","optional":false,"field":"type"}"#,
            r#"],"optional":false,"name":"srv.public.outbox.Order.Value","version":7},"#,
            r#""payload":{"payload":"{\"id\": 1, \"note\": \"café \\\"quoted\\\"\\ttab\"}","type":"OrderCreated"}}"#
        )
    );
    // Without an envelope the option changes nothing and says so.
    let o = options(&[("table.field.event.schema.version", "version")]);
    assert_eq!(o.warnings().len(), 1);
}

/// The name of a json-schemas envelope, from the record's value.
fn envelope_name(rec: &RoutedRecord) -> String {
    let value: serde_json::Value =
        match serde_json::from_slice(rec.value.as_deref().unwrap_or_default()) {
            Ok(v) => v,
            Err(e) => panic!("{e}"),
        };
    value["schema"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn route_with(r: &EventRouter, row: Row) -> Result<Routed, RouteError> {
    let b = bind(r, &table());
    r.route(&b, Change::Insert(&row.tuple()))
}

fn record_of(routed: Result<Routed, RouteError>) -> RoutedRecord {
    match routed {
        Ok(Routed::Record(rec)) => rec,
        other => panic!("expected a record, got {other:?}"),
    }
}

// Debezium 3.6.3 names the envelope schema after the first record of a payload schema and
// reuses it (differential test, variant "schemas": later Customer records carry
// `dbz.public.outbox.Order.Value`).
#[test]
fn envelope_schema_name_is_the_first_records_per_payload_schema() {
    let opts = [
        ("table.fields.additional.placement", "type:envelope"),
        ("topic.prefix", "dbz"),
        ("table.expand.json.payload", "true"),
    ];
    let r = EventRouter::new(options(&opts), format(JSON, SCHEMAS));
    let order = record_of(route_with(&r, Row::default()));
    assert_eq!(envelope_name(&order), "dbz.public.outbox.Order.Value");
    let customer = Row {
        aggregatetype: t("Customer"),
        ..Row::default()
    };
    assert_eq!(
        envelope_name(&record_of(route_with(&r, customer))),
        "dbz.public.outbox.Order.Value",
        "same payload schema: the cached name"
    );
    let other_shape = Row {
        aggregatetype: t("Customer"),
        payload: t(r#"{"other": true}"#),
        ..Row::default()
    };
    assert_eq!(
        envelope_name(&record_of(route_with(&r, other_shape))),
        "dbz.public.outbox.Customer.Value",
        "another payload schema: a new name"
    );
    // A clone of the router shares the cache, as one Debezium task does.
    let clone = r.clone();
    let invoice = Row {
        aggregatetype: t("Invoice"),
        ..Row::default()
    };
    assert_eq!(
        envelope_name(&record_of(route_with(&clone, invoice))),
        "dbz.public.outbox.Order.Value"
    );
    // A new router starts empty, as a restarted task does.
    let fresh = EventRouter::new(options(&opts), format(JSON, SCHEMAS));
    let invoice = Row {
        aggregatetype: t("Invoice"),
        ..Row::default()
    };
    assert_eq!(
        envelope_name(&record_of(route_with(&fresh, invoice))),
        "dbz.public.outbox.Invoice.Value"
    );
}

// A payload whose expansion Debezium cannot finish still caches the envelope schema of its
// inferred payload schema (differential test, variant "expenvelope").
#[test]
fn failed_expansion_still_names_the_envelope_schema() {
    let opts = [
        ("table.fields.additional.placement", "type:envelope"),
        ("topic.prefix", "dbz"),
        ("table.expand.json.payload", "true"),
    ];
    let r = EventRouter::new(options(&opts), format(JSON, SCHEMAS));
    let broken = Row {
        aggregatetype: t("Order"),
        payload: t(r#"{"n": [{"a": 1}, {"b": 2}, null]}"#),
        ..Row::default()
    };
    assert!(matches!(
        route_with(&r, broken),
        Err(RouteError::JsonExpansion { .. })
    ));
    let fits = Row {
        aggregatetype: t("Customer"),
        payload: t(r#"{"n": [{"a": 1}, {"b": 2}]}"#),
        ..Row::default()
    };
    assert_eq!(
        envelope_name(&record_of(route_with(&r, fits))),
        "dbz.public.outbox.Order.Value"
    );
}

#[test]
fn versioned_envelope_schema_is_cached_per_version() {
    let opts = [
        ("table.fields.additional.placement", "type:envelope"),
        ("table.field.event.schema.version", "version"),
        ("topic.prefix", "dbz"),
        ("table.expand.json.payload", "true"),
    ];
    let r = EventRouter::new(options(&opts), format(JSON, SCHEMAS));
    record_of(route_with(&r, Row::default()));
    let customer = Row {
        aggregatetype: t("Customer"),
        ..Row::default()
    };
    assert_eq!(
        envelope_name(&record_of(route_with(&r, customer))),
        "dbz.public.outbox.Order.Value"
    );
    let other_shape = Row {
        payload: t(r#"{"other": true}"#),
        ..Row::default()
    };
    assert!(matches!(
        route_with(&r, other_shape),
        Err(RouteError::EnvelopeVersionMismatch {
            version: Some(7),
            ..
        })
    ));
}

// Differential test, variant "versioned" (Debezium 3.6.3): the version's cached schema is
// used whatever this record's payload schema is; a payload whose expansion failed is the
// original text, which fits a cached text payload schema; a NULL version is a key too.
#[test]
fn versioned_envelope_takes_failed_expansions_as_text() {
    let opts = [
        ("table.fields.additional.placement", "type:envelope"),
        ("table.field.event.schema.version", "version"),
        ("topic.prefix", "dbz"),
        ("table.expand.json.payload", "true"),
    ];
    let r = EventRouter::new(options(&opts), format(JSON, SCHEMAS));
    let text_first = Row {
        payload: t(r#""not an object""#),
        version: t("2"),
        ..Row::default()
    };
    let rec = record_of(route_with(&r, text_first));
    assert!(text(&rec.value).contains(r#""name":"io.debezium.data.Json""#));
    let big = Row {
        aggregatetype: t("Customer"),
        payload: t(r#"{"n": 123456789012345678901234567890}"#),
        version: t("2"),
        ..Row::default()
    };
    let rec = record_of(route_with(&r, big));
    assert_eq!(
        text(&rec.value),
        concat!(
            r#"{"schema":{"type":"struct","fields":["#,
            r#"{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1,"field":"payload"},"#,
            r#"{"type":"string","optional":false,"field":"type"}"#,
            r#"],"optional":false,"name":"dbz.public.outbox.Order.Value","version":2},"#,
            r#""payload":{"payload":"{\"n\": 123456789012345678901234567890}","type":"OrderCreated"}}"#
        )
    );
    let expanded = Row {
        version: t("2"),
        ..Row::default()
    };
    assert!(matches!(
        route_with(&r, expanded),
        Err(RouteError::EnvelopeVersionMismatch {
            version: Some(2),
            ..
        })
    ));
    let null_version = Row {
        aggregatetype: t("Invoice"),
        version: Column::Null,
        ..Row::default()
    };
    let rec = record_of(route_with(&r, null_version));
    assert_eq!(envelope_name(&rec), "dbz.public.outbox.Invoice.Value");
    assert!(!text(&rec.value).contains(r#""version":2}"#));
}

// Debezium builds the envelope before it checks for an empty payload: a tombstone names the
// schema for the records after it.
#[test]
fn a_tombstone_names_the_envelope_schema() {
    let opts = [
        ("table.fields.additional.placement", "type:envelope"),
        ("topic.prefix", "dbz"),
        ("route.tombstone.on.empty.payload", "true"),
    ];
    let r = EventRouter::new(options(&opts), format(JSON, SCHEMAS));
    let empty = Row {
        aggregatetype: t("Gone"),
        payload: Column::Null,
        ..Row::default()
    };
    assert_eq!(record_of(route_with(&r, empty)).value, None);
    assert_eq!(
        envelope_name(&record_of(route_with(&r, Row::default()))),
        "dbz.public.outbox.Gone.Value"
    );
}

// Expected bytes: Debezium 3.6.3 with JsonConverter on Java 21 and on Java 17.
#[test]
fn numbers_follow_the_workers_java() {
    let payload = || Row {
        payload: t(r#"{"a": 8.41E21, "b": 1.0E23, "c": 0.5}"#),
        ..Row::default()
    };
    let opts = [EXPAND];
    let rec = route(&opts, format(JSON, JSON), payload());
    assert_eq!(text(&rec.value), r#"{"a":8.41E21,"b":1.0E23,"c":0.5}"#);
    let java17 = Format {
        numbers: siphon_router::JavaNumbers::Java17,
        ..format(JSON, JSON)
    };
    let rec = route(&opts, java17, payload());
    assert_eq!(
        text(&rec.value),
        r#"{"a":8.409999999999999E21,"b":9.999999999999999E22,"c":0.5}"#
    );
    let java17_text = Format {
        numbers: siphon_router::JavaNumbers::Java17,
        ..format(JSON, STRING)
    };
    let rec = route(&opts, java17_text, payload());
    assert_eq!(
        text(&rec.value),
        "Struct{a=8.409999999999999E21,b=9.999999999999999E22,c=0.5}"
    );
}

// Expected from Debezium 3.6.3 (Jackson 2.21's stream constraints): 1000 nested objects are
// expanded and written without schemas; with schemas the output nests deeper than the
// 1000 levels Jackson writes, and the JsonConverter fails.
#[test]
fn deep_payloads_expand_without_exhausting_the_stack() {
    let nested = |levels: usize| format!("{}1{}", "{\"n\": ".repeat(levels), "}".repeat(levels));
    let deep = || Row {
        payload: t(&nested(1000)),
        ..Row::default()
    };
    let rec = route(&[EXPAND], format(JSON, JSON), deep());
    assert_eq!(
        text(&rec.value),
        format!("{}1{}", "{\"n\":".repeat(1000), "}".repeat(1000))
    );
    assert!(matches!(
        route_err(&[EXPAND], format(JSON, SCHEMAS), deep()),
        RouteError::JsonExpansion { .. }
    ));
    let shallow_enough = Row {
        payload: t(&nested(499)),
        ..Row::default()
    };
    route(&[EXPAND], format(JSON, SCHEMAS), shallow_enough);
    let too_deep = Row {
        payload: t(&nested(500)),
        ..Row::default()
    };
    assert!(matches!(
        route_err(&[EXPAND], format(JSON, SCHEMAS), too_deep),
        RouteError::JsonExpansion { .. }
    ));
}

#[test]
fn partition_placement() {
    let rec = route(
        &[("table.fields.additional.placement", "part:partition")],
        format(JSON, JSON),
        Row::default(),
    );
    assert_eq!(rec.partition, Some(3));
    assert_eq!(rec.headers, vec![id_header()]);
    let rec = route(
        &[("table.fields.additional.placement", "part:partition")],
        format(JSON, JSON),
        Row {
            part: Column::Null,
            ..Row::default()
        },
    );
    assert_eq!(rec.partition, None);
    assert_eq!(
        route(&[], format(JSON, JSON), Row::default()).partition,
        None
    );
    let r = EventRouter::new(
        options(&[("table.fields.additional.placement", "aggregateid:partition")]),
        Format::default(),
    );
    assert!(matches!(
        r.bind(&table()),
        Err(RouteError::ColumnTypeMismatch { .. })
    ));
}

#[test]
fn missing_additional_columns() {
    let placement = (
        "table.fields.additional.placement",
        "type:header,absent:header,absent:envelope",
    );
    let r = EventRouter::new(options(&[placement]), Format::default());
    assert!(
        matches!(r.bind(&table()), Err(RouteError::MissingColumn { column, option: "table.fields.additional.placement", .. }) if column == "absent")
    );
    let rec = route(
        &[placement, ("table.field.additional.missing", "ignore")],
        format(JSON, JSON),
        Row::default(),
    );
    assert_eq!(
        rec.headers,
        vec![id_header(), header("type", Some("OrderCreated"))]
    );
    // The only envelope field is gone, so the value is the plain payload.
    assert_eq!(
        text(&rec.value),
        r#""{\"id\": 1, \"note\": \"café \\\"quoted\\\"\\ttab\"}""#
    );
}

// ---------------------------------------------------------------- topics

#[test]
fn topic_regex() {
    let opts = [
        (
            "route.topic.regex",
            "(?<routedByValue>[A-Za-z]+)-(?<region>[a-z]{2})",
        ),
        (
            "route.topic.replacement",
            "${region}.events.${routedByValue}.$2",
        ),
    ];
    let rec = route(
        &opts,
        format(JSON, JSON),
        Row {
            aggregatetype: t("Order-eu"),
            ..Row::default()
        },
    );
    assert_eq!(&*rec.topic, "eu.events.Order.eu");
    // No whole match: RegexRouter keeps the routing value as the topic.
    let rec = route(
        &opts,
        format(JSON, JSON),
        Row {
            aggregatetype: t("Order-eu1"),
            ..Row::default()
        },
    );
    assert_eq!(&*rec.topic, "Order-eu1");
    // Java's `.` stops at line terminators, so the value is not matched and, as a topic, refused.
    let err = route_err(
        &[
            ("route.topic.regex", "(.*)"),
            ("route.topic.replacement", "t.$1"),
        ],
        format(JSON, JSON),
        Row {
            aggregatetype: t("a\u{85}b"),
            ..Row::default()
        },
    );
    assert!(matches!(err, RouteError::InvalidTopic { .. }), "{err:?}");
    let rec = route(
        &[
            ("route.by.field", "type"),
            ("route.topic.regex", "(?<routedByValue>.*)Created"),
            ("route.topic.replacement", "created.${routedByValue}"),
        ],
        format(JSON, JSON),
        Row::default(),
    );
    assert_eq!(&*rec.topic, "created.Order");
}

// ---------------------------------------------------------------- null payloads and tombstones

#[test]
fn null_payload_per_encoding() {
    let null = || Row {
        payload: Column::Null,
        ..Row::default()
    };
    assert_eq!(text(&route(&[], format(JSON, JSON), null()).value), "null");
    assert_eq!(
        text(&route(&[], format(JSON, SCHEMAS), null()).value),
        r#"{"schema":{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1},"payload":null}"#
    );
    assert_eq!(route(&[], format(JSON, STRING), null()).value, None);
    let key_null = Row {
        aggregateid: Column::Null,
        ..Row::default()
    };
    let r = EventRouter::new(options(&[]), format(SCHEMAS, JSON));
    let b = match r.bind(&table()) {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    };
    match r.route(&b, Change::Insert(&key_null.tuple())) {
        Ok(Routed::Record(rec)) => assert_eq!(
            text(&rec.key),
            r#"{"schema":{"type":"string","optional":true},"payload":null}"#
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn tombstone_on_empty_payload() {
    let opts = [("route.tombstone.on.empty.payload", "true")];
    for payload in [Column::Null, t(""), t(" \t\n\u{1}")] {
        for fmt in [
            format(JSON, JSON),
            format(JSON, SCHEMAS),
            format(STRING, STRING),
        ] {
            let rec = route(
                &opts,
                fmt,
                Row {
                    payload: payload.clone(),
                    ..Row::default()
                },
            );
            assert_eq!(rec.value, None, "{payload:?} {fmt:?}");
            assert_eq!(rec.headers, vec![id_header()]);
        }
    }
    // U+00A0 is not trimmed by Java's String.trim.
    let rec = route(
        &opts,
        format(JSON, STRING),
        Row {
            payload: t("\u{a0}"),
            ..Row::default()
        },
    );
    assert_eq!(text(&rec.value), "\u{a0}");
    // Without the option a blank payload is written.
    let rec = route(
        &[],
        format(JSON, JSON),
        Row {
            payload: t(" "),
            ..Row::default()
        },
    );
    assert_eq!(text(&rec.value), r#"" ""#);
    // With an envelope, an empty payload still makes a tombstone.
    let rec = route(
        &[
            ("route.tombstone.on.empty.payload", "true"),
            ("table.fields.additional.placement", "type:envelope"),
        ],
        format(JSON, JSON),
        Row {
            payload: Column::Null,
            ..Row::default()
        },
    );
    assert_eq!(rec.value, None);
}

// ---------------------------------------------------------------- JSON expansion

const EXPAND: (&str, &str) = ("table.expand.json.payload", "true");

#[test]
fn expanded_payload_json_and_string() {
    let payload = t("{\"id\": 1, \"total\": 39.98, \"big\": 3000000000, \"ok\": true, \"gone\": null, \"none\": [], \"note\": \"é\\u00e9 \\\"q\\\"\\n\", \"lines\": [{\"sku\": \"a\"}, {\"sku\": \"b\", \"qty\": 2}]}");
    let rec = route(
        &[EXPAND],
        format(JSON, JSON),
        Row {
            payload: payload.clone(),
            ..Row::default()
        },
    );
    assert_eq!(
        text(&rec.value),
        "{\"id\":1,\"total\":39.98,\"big\":3000000000,\"ok\":true,\"note\":\"éé \\\"q\\\"\\n\",\"lines\":[{\"sku\":\"a\",\"qty\":null},{\"sku\":\"b\",\"qty\":2}]}"
    );
    let rec = route(
        &[EXPAND],
        format(JSON, STRING),
        Row {
            payload,
            ..Row::default()
        },
    );
    assert_eq!(
        text(&rec.value),
        "Struct{id=1,total=39.98,big=3000000000,ok=true,note=éé \"q\"\n,lines=[Struct{sku=a}, Struct{sku=b,qty=2}]}"
    );
}

#[test]
fn expanded_payload_with_schemas() {
    let rec = route(
        &[
            EXPAND,
            ("table.json.payload.null.behavior", "optional_bytes"),
            ("table.json.payload.empty.array.behavior", "optional_string"),
        ],
        format(JSON, SCHEMAS),
        Row {
            payload: t(r#"{"a": null, "b": [], "c": {"d": 1.0E2}}"#),
            ..Row::default()
        },
    );
    assert_eq!(
        text(&rec.value),
        concat!(
            r#"{"schema":{"type":"struct","fields":["#,
            r#"{"type":"bytes","optional":true,"field":"a"},"#,
            r#"{"type":"array","items":{"type":"string","optional":true},"optional":true,"field":"b"},"#,
            r#"{"type":"struct","fields":[{"type":"double","optional":true,"field":"d"}],"optional":true,"name":"payload.c","field":"c"}"#,
            r#"],"optional":true,"name":"payload"},"payload":{"a":null,"b":[],"c":{"d":100.0}}}"#
        )
    );
    // With an envelope the expanded struct is the payload field.
    let rec = route(
        &[
            EXPAND,
            ("table.fields.additional.placement", "type:envelope"),
            ("topic.prefix", "srv"),
        ],
        format(JSON, SCHEMAS),
        Row {
            payload: t(r#"{"x": "y"}"#),
            ..Row::default()
        },
    );
    assert_eq!(
        text(&rec.value),
        concat!(
            r#"{"schema":{"type":"struct","fields":["#,
            r#"{"type":"struct","fields":[{"type":"string","optional":true,"field":"x"}],"optional":true,"name":"payload","field":"payload"},"#,
            r#"{"type":"string","optional":false,"field":"type"}"#,
            r#"],"optional":false,"name":"srv.public.outbox.Order.Value"},"payload":{"payload":{"x":"y"},"type":"OrderCreated"}}"#
        )
    );
}

#[test]
fn expansion_failures() {
    // Not JSON, or a heterogeneous array: Debezium warns and leaves the payload alone.
    for payload in ["not json", "{\"a\": [1, \"x\"]}", "{broken"] {
        let rec = route(
            &[EXPAND],
            format(JSON, JSON),
            Row {
                payload: t(payload),
                ..Row::default()
            },
        );
        let mut expected = b"\"".to_vec();
        expected.extend_from_slice(payload.replace('"', "\\\"").as_bytes());
        expected.push(b'"');
        assert_eq!(rec.value, Some(Bytes::from(expected)), "{payload}");
    }
    // A top-level array: the JSON converters fail, StringConverter writes the text.
    let err = route_err(
        &[EXPAND],
        format(JSON, JSON),
        Row {
            payload: t("[1, 2]"),
            ..Row::default()
        },
    );
    assert!(matches!(err, RouteError::JsonExpansion { .. }), "{err:?}");
    let err = route_err(
        &[EXPAND],
        format(JSON, SCHEMAS),
        Row {
            payload: t("[1, 2]"),
            ..Row::default()
        },
    );
    assert!(matches!(err, RouteError::JsonExpansion { .. }), "{err:?}");
    let rec = route(
        &[EXPAND],
        format(JSON, STRING),
        Row {
            payload: t("[1, 2]"),
            ..Row::default()
        },
    );
    assert_eq!(text(&rec.value), "[1, 2]");
    // `[]` has no schema at all: the value stays a string and the schema is null.
    let rec = route(
        &[EXPAND],
        format(JSON, SCHEMAS),
        Row {
            payload: t("[]"),
            ..Row::default()
        },
    );
    assert_eq!(text(&rec.value), r#"{"schema":null,"payload":"[]"}"#);
    let rec = route(
        &[EXPAND],
        format(JSON, JSON),
        Row {
            payload: t("[]"),
            ..Row::default()
        },
    );
    assert_eq!(text(&rec.value), r#""[]""#);
    // An integer beyond 64 bits.
    let err = route_err(
        &[EXPAND],
        format(JSON, JSON),
        Row {
            payload: t(r#"{"n": 123456789012345678901234567890}"#),
            ..Row::default()
        },
    );
    assert!(matches!(err, RouteError::JsonExpansion { .. }), "{err:?}");
    // With an envelope any such failure is fatal.
    let err = route_err(
        &[
            EXPAND,
            ("table.fields.additional.placement", "type:envelope"),
        ],
        format(JSON, STRING),
        Row {
            payload: t("[1]"),
            ..Row::default()
        },
    );
    assert!(matches!(err, RouteError::JsonExpansion { .. }), "{err:?}");
}

// ---------------------------------------------------------------- json-schemas and binary

#[test]
fn json_schemas_for_column_types() {
    let rel = relation(&[
        ("id", INT8, -1),
        ("aggregatetype", TEXT, -1),
        ("aggregateid", INT2, -1),
        ("payload", FLOAT8, -1),
        ("flag", BOOL, -1),
    ]);
    let r = EventRouter::new(
        options(&[(
            "table.fields.additional.placement",
            "flag:envelope,id:envelope:eventId",
        )]),
        format(SCHEMAS, SCHEMAS),
    );
    let b = match r.bind(&rel) {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    };
    let row = TupleData {
        columns: vec![t("9"), t("Order"), t("-3"), t("1e+100"), t("t")],
    };
    match r.route(&b, Change::Insert(&row)) {
        Ok(Routed::Record(rec)) => {
            assert_eq!(
                text(&rec.key),
                r#"{"schema":{"type":"int16","optional":true},"payload":-3}"#
            );
            assert_eq!(
                text(&rec.value),
                concat!(
                    r#"{"schema":{"type":"struct","fields":["#,
                    r#"{"type":"double","optional":true,"field":"payload"},"#,
                    r#"{"type":"boolean","optional":true,"field":"flag"},"#,
                    r#"{"type":"int64","optional":true,"field":"eventId"}"#,
                    r#"],"optional":false,"name":"public.outbox.Order.Value"},"payload":{"payload":1.0E100,"flag":true,"eventId":9}}"#
                )
            );
            assert_eq!(rec.headers, vec![header("id", Some("9"))]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn json_schemas_escape_payload_text() {
    let rec = route(
        &[],
        format(SCHEMAS, SCHEMAS),
        Row {
            payload: t("{\"k\": \"\u{1}\\u0001 日本 \\\\ /\"}"),
            ..Row::default()
        },
    );
    assert_eq!(
        text(&rec.value),
        "{\"schema\":{\"type\":\"string\",\"optional\":true,\"name\":\"io.debezium.data.Json\",\"version\":1},\"payload\":\"{\\\"k\\\": \\\"\\u0001\\\\u0001 日本 \\\\\\\\ /\\\"}\"}"
    );
}

#[test]
fn binary_payload() {
    let rel = relation(&[
        ("id", UUID, -1),
        ("aggregatetype", VARCHAR, -1),
        ("aggregateid", VARCHAR, -1),
        ("payload", BYTEA, -1),
    ]);
    let row = |payload: Column| TupleData {
        columns: vec![t(EVENT_ID), t("Order"), t("1"), payload],
    };
    let r = EventRouter::new(options(&[]), format(STRING, Encoding::Binary));
    let b = match r.bind(&rel) {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    };
    match r.route(&b, Change::Insert(&row(t("\\x00ff0a22")))) {
        Ok(Routed::Record(rec)) => {
            assert_eq!(rec.value, Some(Bytes::from_static(b"\x00\xff\x0a\x22")));
            assert_eq!(text(&rec.key), "1");
        }
        other => panic!("{other:?}"),
    }
    match r.route(&b, Change::Insert(&row(Column::Null))) {
        Ok(Routed::Record(rec)) => assert_eq!(rec.value, None),
        other => panic!("{other:?}"),
    }
    // JsonConverter writes bytes as base64.
    let r = EventRouter::new(options(&[]), format(JSON, SCHEMAS));
    let b = match r.bind(&rel) {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    };
    match r.route(&b, Change::Insert(&row(t("\\x666f6f")))) {
        Ok(Routed::Record(rec)) => assert_eq!(
            text(&rec.value),
            r#"{"schema":{"type":"bytes","optional":true},"payload":"Zm9v"}"#
        ),
        other => panic!("{other:?}"),
    }
    // Binary needs a bytea column; String cannot write one.
    let r = EventRouter::new(options(&[]), format(JSON, Encoding::Binary));
    assert!(matches!(
        r.bind(&table()),
        Err(RouteError::UnsupportedEncoding { .. })
    ));
    let r = EventRouter::new(options(&[]), format(JSON, STRING));
    assert!(matches!(
        r.bind(&rel),
        Err(RouteError::UnsupportedEncoding { .. })
    ));
    let r = EventRouter::new(
        options(&[("table.fields.additional.placement", "aggregateid:envelope")]),
        format(JSON, Encoding::Binary),
    );
    assert!(matches!(
        r.bind(&rel),
        Err(RouteError::UnsupportedEncoding { .. })
    ));
}

// ---------------------------------------------------------------- context headers

#[test]
fn context_headers_come_first_in_debezium_order() {
    let r = EventRouter::new_with_context(
        options(&[
            ("topic.prefix", "dbserver1"),
            ("table.fields.additional.placement", "type:header"),
        ]),
        Format::default(),
        RouterContext::postgresql("6f1c1b4e-9a53-4d4b-8f0e-2f4a4f6f1e11"),
    );
    let r = match r {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    let b = bind(&r, &table());
    match r.route(&b, Change::Insert(&Row::default().tuple())) {
        Ok(Routed::Record(rec)) => assert_eq!(
            rec.headers,
            vec![
                header("__debezium.context.connectorLogicalName", Some("dbserver1")),
                header("__debezium.context.taskId", Some("0")),
                header("__debezium.context.connectorName", Some("postgresql")),
                header(
                    "__debezium.context.runId",
                    Some("6f1c1b4e-9a53-4d4b-8f0e-2f4a4f6f1e11")
                ),
                id_header(),
                header("type", Some("OrderCreated")),
            ]
        ),
        other => panic!("{other:?}"),
    }
    let err = EventRouter::new_with_context(
        options(&[]),
        Format::default(),
        RouterContext::postgresql("x"),
    );
    assert!(matches!(
        err,
        Err(RouterConfigError::MissingOption {
            option: "topic.prefix",
            ..
        })
    ));
    let r = EventRouter::new_with_context(
        options(&[("extended.headers.enabled", "false")]),
        Format::default(),
        RouterContext::postgresql("x"),
    );
    let r = match r {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    let b = bind(&r, &table());
    match r.route(&b, Change::Insert(&Row::default().tuple())) {
        Ok(Routed::Record(rec)) => assert_eq!(rec.headers, vec![id_header()]),
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------- updates and deletes

#[test]
fn updates_and_deletes_with_every_option_still_skip() {
    let opts = options(&[
        EXPAND,
        (
            "table.fields.additional.placement",
            "type:envelope,part:partition,tenant:header",
        ),
        ("table.field.event.timestamp", "created_at"),
        ("route.tombstone.on.empty.payload", "true"),
    ]);
    let r = EventRouter::new(opts, format(SCHEMAS, SCHEMAS));
    let b = bind(&r, &table());
    let row = Row::default().tuple();
    assert_eq!(
        r.route(&b, Change::Delete(&row)),
        Ok(Routed::Skipped(SkipReason::Delete))
    );
    assert_eq!(
        r.route(
            &b,
            Change::Update {
                old: None,
                new: &row
            }
        ),
        Ok(Routed::Skipped(SkipReason::Update))
    );
}

// ---------------------------------------------------------------- no panics

const OPTION_VALUES: &[(&str, &[&str])] = &[
    (
        "table.field.event.timestamp",
        &["created_at", "created_tz", "created_ms", "part", "absent"],
    ),
    (
        "table.field.event.schema.version",
        &["version", "part", "type", "absent"],
    ),
    (
        "table.fields.additional.placement",
        &[
            "type:header",
            "type:envelope:t,tenant:envelope",
            "part:partition",
            "absent:header",
            "tenant:header:h,payload:envelope:p",
        ],
    ),
    ("table.field.additional.missing", &["error", "ignore"]),
    (
        "route.topic.regex",
        &[
            "(?<routedByValue>.*)",
            "(?<routedByValue>[a-z]+)(.*)",
            "(.)(.)",
            "a|b",
        ],
    ),
    (
        "route.topic.replacement",
        &["${routedByValue}", "x.$1", "$0"],
    ),
    ("route.tombstone.on.empty.payload", &["true", "false"]),
    ("table.expand.json.payload", &["true", "false"]),
    (
        "table.json.payload.null.behavior",
        &["ignore", "optional_bytes"],
    ),
    (
        "table.json.payload.empty.array.behavior",
        &["ignore", "optional_string"],
    ),
    ("topic.prefix", &["srv"]),
];

fn any_column() -> impl Strategy<Value = Column> {
    prop_oneof![
        Just(Column::Null),
        "[ -~]{0,12}".prop_map(|s| t(&s)),
        "[\\[\\]{}\",:0-9a-z. -]{0,24}".prop_map(|s| t(&s)),
        Just(t("2024-05-01 12:34:56.5+05:30")),
        Just(t("-2147483648")),
        Just(t("\\x0aff")),
        Just(t(r#"{"a": [{"b": null}, {"b": 1}], "c": []}"#)),
    ]
}

fn encoding() -> impl Strategy<Value = Encoding> {
    prop_oneof![
        Just(JSON),
        Just(SCHEMAS),
        Just(STRING),
        Just(Encoding::Binary)
    ]
}

proptest! {
    #[test]
    fn no_option_set_or_row_panics(
        picks in proptest::collection::vec((0..OPTION_VALUES.len(), 0..8usize), 0..8),
        cells in proptest::collection::vec(any_column(), 11),
        key in encoding(),
        value in encoding(),
    ) {
        let mut map = BTreeMap::new();
        for (option, value) in picks {
            let (name, values) = OPTION_VALUES[option];
            map.insert(name.to_owned(), values[value % values.len()].to_owned());
        }
        let Ok(opts) = RouterOptions::from_map(&map) else { return Ok(()); };
        let _ = opts.warnings();
        let r = EventRouter::new(opts, format(key, value));
        let Ok(b) = r.bind(&table()) else { return Ok(()); };
        let mut columns = cells;
        columns[0] = t(EVENT_ID);
        let row = TupleData { columns };
        let first = r.route(&b, Change::Insert(&row));
        prop_assert_eq!(first.clone(), r.route(&b, Change::Insert(&row)));
        if let Ok(Routed::Record(rec)) = first {
            prop_assert!(siphon_router::check_topic_name(&rec.topic).is_ok());
            if value == SCHEMAS {
                if let Some(v) = &rec.value {
                    prop_assert!(serde_json::from_slice::<serde_json::Value>(v).is_ok());
                }
            }
        }
    }
}

// ---------------------------------------------------------------- avro (schema registry)

fn registered(pairs: &[(&str, &str)], row: Row) -> (RoutedRecord, siphon_record::RegistrySchema) {
    let r = EventRouter::new(options(pairs), format(JSON, Encoding::Avro));
    let b = bind(&r, &table());
    match r.route(&b, Change::Insert(&row.tuple())) {
        Ok(Routed::Registry(RegistryRecord {
            record,
            key: None,
            value: RegistryValue::Derived(schema),
            ..
        })) => (record, schema),
        other => panic!("expected a record to register, got {other:?}"),
    }
}

/// The Avro binary of a string: its length as a zig-zag varint, then its bytes.
fn avro_string(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut n = (text.len() as u64) << 1;
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out.extend_from_slice(text.as_bytes());
    out
}

// AvroConverter writes a jsonb payload (Debezium's `io.debezium.data.Json`, optional string)
// as the union's string branch, framed with the schema id the caller writes in.
#[test]
fn avro_value_of_an_unexpanded_payload_is_its_json_string_in_a_frame() {
    let (record, schema) = registered(&[], Row::default());
    assert_eq!(
        schema.text(),
        r#"["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}]"#
    );
    let mut expected = vec![0, 0, 0, 0, 0, 2];
    expected.extend(avro_string(r#"{"id": 1, "note": "café \"quoted\"\ttab"}"#));
    assert_eq!(record.value.as_deref(), Some(&expected[..]));
    assert_eq!(
        record.key.as_deref(),
        Some(&b"\"1\""[..]),
        "keys keep their encoding"
    );
    assert_eq!(record.headers, vec![id_header()]);
}

#[test]
fn avro_value_of_an_expanded_payload_is_a_record_of_its_schema() {
    let (record, schema) = registered(&[("table.expand.json.payload", "true")], Row::default());
    assert_eq!(
        schema.text(),
        r#"["null",{"type":"record","name":"payload","fields":[{"name":"id","type":["null","int"],"default":null},{"name":"note","type":["null","string"],"default":null}],"connect.name":"payload"}]"#
    );
    let mut expected = vec![0, 0, 0, 0, 0, 2, 2, 2, 2];
    expected.extend(avro_string("café \"quoted\"\ttab"));
    assert_eq!(record.value.as_deref(), Some(&expected[..]));
}

// AvroConverter as `key.converter`: the key column's Connect schema as Avro, framed; its schema
// to register under the key subject; the value keeps its own encoding.
#[test]
fn avro_key_is_the_key_column_in_a_frame_with_its_schema() {
    let r = EventRouter::new(options(&[]), format(Encoding::Avro, JSON));
    let b = bind(&r, &table());
    let routed = r.route(&b, Change::Insert(&Row::default().tuple()));
    let Ok(Routed::Registry(RegistryRecord {
        record,
        key: Some(schema),
        value: RegistryValue::AsIs,
        ..
    })) = routed
    else {
        panic!("expected a key to register, got {routed:?}");
    };
    assert_eq!(schema.text(), r#""string""#);
    let mut expected = vec![0, 0, 0, 0, 0];
    expected.extend(avro_string("1"));
    assert_eq!(record.key.as_deref(), Some(&expected[..]));
    let json = route(&[], format(JSON, JSON), Row::default());
    assert_eq!(record.value, json.value, "the value keeps its encoding");
}

#[test]
fn avro_key_of_a_null_key_column_is_a_null_key_with_nothing_to_register() {
    let row = Row {
        aggregateid: Column::Null,
        ..Row::default()
    };
    let r = EventRouter::new(options(&[]), format(Encoding::Avro, JSON));
    let b = bind(&r, &table());
    let routed = r.route(&b, Change::Insert(&row.tuple()));
    match routed {
        Ok(Routed::Record(record)) => assert_eq!(record.key, None),
        other => panic!("expected a record with a null key, got {other:?}"),
    }
}

#[test]
fn avro_of_a_null_payload_is_a_tombstone_with_nothing_to_register() {
    let row = Row {
        payload: Column::Null,
        ..Row::default()
    };
    let r = route(&[], format(JSON, Encoding::Avro), row);
    assert_eq!(r.value, None);
}

#[test]
fn avro_names_a_member_avro_cannot_name() {
    let row = Row {
        payload: t(r#"{"not a name": 1}"#),
        ..Row::default()
    };
    let e = route_err(
        &[("table.expand.json.payload", "true")],
        format(JSON, Encoding::Avro),
        row,
    );
    assert!(
        matches!(&e, RouteError::Avro { column, .. } if column == "payload"),
        "{e}"
    );
    assert!(e.to_string().contains("\"not a name\""), "{e}");
}

#[test]
fn registered_keys_are_refused_when_bound() {
    let registered = Encoding::Registered(siphon_record::RegistrySchemaKind::Avro);
    let r = EventRouter::new(options(&[]), format(registered, Encoding::Avro));
    let e = r.bind(&table()).expect_err("a registered key");
    assert!(e.to_string().contains("format.key"), "{e}");
    let r = EventRouter::new(options(&[]), format(Encoding::Avro, Encoding::Avro));
    assert!(r.bind(&table()).is_ok(), "avro keys are bound");
}
