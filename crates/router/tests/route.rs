//! Routing outbox rows through the public API, with exact expected bytes.

use bytes::Bytes;
use pgoutput::{Column, Relation, RelationColumn, ReplicaIdentity, Text, TupleData};
use proptest::prelude::*;
use siphon_router::{
    Change, Encoding, EventRouter, Format, LogLevel, RouteError, Routed, RoutedRecord,
    RouterConfigError, RouterOptions, SkipReason, TableBinding,
};
use std::collections::BTreeMap;

const UUID: u32 = 2950;
const VARCHAR: u32 = 1043;
const TEXT: u32 = 25;
const JSONB: u32 = 3802;
const INT4: u32 = 23;
const INT8: u32 = 20;
const BOOL: u32 = 16;
const FLOAT8: u32 = 701;
const BYTEA: u32 = 17;
const NUMERIC: u32 = 1700;
const TIMESTAMPTZ: u32 = 1184;

fn relation(columns: &[(&'static str, u32)]) -> Relation {
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

/// Debezium's example outbox table.
fn outbox() -> Relation {
    relation(&[
        ("id", UUID),
        ("aggregatetype", VARCHAR),
        ("aggregateid", VARCHAR),
        ("type", VARCHAR),
        ("payload", JSONB),
    ])
}

fn t(text: &str) -> Column {
    Column::Text(Bytes::copy_from_slice(text.as_bytes()))
}

fn row(columns: Vec<Column>) -> TupleData {
    TupleData { columns }
}

const EVENT_ID: &str = "4d47e190-0402-4048-bc2c-89dd54343cdc";

fn outbox_row(aggregatetype: Column, aggregateid: Column, payload: Column) -> TupleData {
    row(vec![
        t(EVENT_ID),
        aggregatetype,
        aggregateid,
        t("OrderCreated"),
        payload,
    ])
}

fn router(options: &[(&str, &str)], format: Format) -> EventRouter {
    let map: BTreeMap<String, String> = options
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    match RouterOptions::from_map(&map) {
        Ok(options) => EventRouter::new(options, format),
        Err(e) => panic!("{e}"),
    }
}

fn bound(router: &EventRouter, relation: &Relation) -> TableBinding {
    match router.bind(relation) {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    }
}

fn record(router: &EventRouter, binding: &TableBinding, tuple: &TupleData) -> RoutedRecord {
    match router.route(binding, Change::Insert(tuple)) {
        Ok(Routed::Record(r)) => r,
        other => panic!("expected a record, got {other:?}"),
    }
}

fn route_err(router: &EventRouter, binding: &TableBinding, tuple: &TupleData) -> RouteError {
    match router.route(binding, Change::Insert(tuple)) {
        Err(e) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

fn json() -> Format {
    Format::default()
}

fn strings() -> Format {
    Format {
        key: Encoding::String,
        value: Encoding::String,
        ..Format::default()
    }
}

fn b(bytes: &'static [u8]) -> Option<Bytes> {
    Some(Bytes::from_static(bytes))
}

#[test]
fn default_format_is_json_for_key_and_value() {
    assert_eq!(
        Format::default(),
        Format {
            key: Encoding::Json,
            value: Encoding::Json,
            numbers: siphon_router::JavaNumbers::Java19,
        }
    );
}

/// The example of Debezium's outbox documentation.
#[test]
fn debezium_documentation_example() {
    let r = router(&[], json());
    let binding = bound(&r, &outbox());
    let payload = r#"{"id": 1, "lineItems": [{"id": 1, "item": "Debezium in Action", "status": "ENTERED", "quantity": 2, "totalPrice": 39.98}, {"id": 2, "item": "Debezium for Dummies", "status": "ENTERED", "quantity": 1, "totalPrice": 29.99}], "orderDate": "2019-01-31T12:13:01", "customerId": 123}"#;
    let rec = record(&r, &binding, &outbox_row(t("Order"), t("1"), t(payload)));
    assert_eq!(&*rec.topic, "outbox.event.Order");
    assert_eq!(rec.key, b(b"\"1\""));
    let expected = r#""{\"id\": 1, \"lineItems\": [{\"id\": 1, \"item\": \"Debezium in Action\", \"status\": \"ENTERED\", \"quantity\": 2, \"totalPrice\": 39.98}, {\"id\": 2, \"item\": \"Debezium for Dummies\", \"status\": \"ENTERED\", \"quantity\": 1, \"totalPrice\": 29.99}], \"orderDate\": \"2019-01-31T12:13:01\", \"customerId\": 123}""#;
    assert_eq!(rec.value.as_deref(), Some(expected.as_bytes()));
    assert_eq!(rec.headers.len(), 1);
    assert_eq!(&*rec.headers[0].name, "id");
    assert_eq!(
        rec.headers[0].value,
        Some(Bytes::from_static(EVENT_ID.as_bytes()))
    );
    assert_eq!(rec.timestamp_ms, None);
}

#[test]
fn topic_keeps_the_case_of_the_routing_value() {
    let r = router(&[], json());
    let binding = bound(&r, &outbox());
    for (value, topic) in [
        ("Order", "outbox.event.Order"),
        ("order", "outbox.event.order"),
        ("ORDER_items-2", "outbox.event.ORDER_items-2"),
    ] {
        let rec = record(&r, &binding, &outbox_row(t(value), t("1"), t("{}")));
        assert_eq!(&*rec.topic, topic);
    }
}

#[test]
fn custom_columns_and_topic_replacement() {
    let r = router(
        &[
            ("table.field.event.id", "event_id"),
            ("table.field.event.key", "aggregate_id"),
            ("table.field.event.payload", "body"),
            ("route.by.field", "aggregate_type"),
            ("route.topic.replacement", "${routedByValue}.events"),
        ],
        json(),
    );
    let rel = relation(&[
        ("body", TEXT),
        ("aggregate_type", TEXT),
        ("event_id", INT8),
        ("aggregate_id", INT4),
    ]);
    let binding = bound(&r, &rel);
    assert_eq!(binding.table(), "public.outbox");
    let rec = record(
        &r,
        &binding,
        &row(vec![t("hi"), t("Customer"), t("77"), t("-5")]),
    );
    assert_eq!(&*rec.topic, "Customer.events");
    assert_eq!(rec.key, b(b"-5"));
    assert_eq!(rec.value, b(b"\"hi\""));
    assert_eq!(rec.headers[0].value, b(b"77"));
}

#[test]
fn payload_escaping_is_jacksons() {
    let r = router(&[], json());
    let binding = bound(&r, &outbox());
    let cases: [(&str, &[u8]); 10] = [
        ("", b"\"\""),
        (
            r#"{"a": 1, "b": [1, 2]}"#,
            br#""{\"a\": 1, \"b\": [1, 2]}""#,
        ),
        (r#"{"path": "C:\\dir"}"#, br#""{\"path\": \"C:\\\\dir\"}""#),
        ("tab\there", br#""tab\there""#),
        ("line1\nline2\r\n", br#""line1\nline2\r\n""#),
        ("\u{8}\u{c}", br#""\b\f""#),
        ("unit\u{1f}sep\u{0}", br#""unit\u001Fsep\u0000""#),
        ("del\u{7f}/slash", b"\"del\x7f/slash\""),
        ("café 日本 \u{2028}", "\"café 日本 \u{2028}\"".as_bytes()),
        // Jackson writes a character above U+FFFF as its two surrogates, escaped (bytes
        // taken from Debezium 3.6.3's JsonConverter in the differential test).
        ("🎉", br#""\uD83C\uDF89""#),
    ];
    for (payload, expected) in cases {
        let rec = record(&r, &binding, &outbox_row(t("Order"), t("1"), t(payload)));
        assert_eq!(rec.value.as_deref(), Some(expected), "payload {payload:?}");
    }
}

#[test]
fn key_escaping_and_non_ascii() {
    let r = router(&[], json());
    let binding = bound(&r, &outbox());
    let rec = record(&r, &binding, &outbox_row(t("Order"), t("ü\"1\\"), t("{}")));
    assert_eq!(rec.key.as_deref(), Some("\"ü\\\"1\\\\\"".as_bytes()));
}

#[test]
fn null_payload_and_key_with_json() {
    let r = router(&[], json());
    let binding = bound(&r, &outbox());
    let rec = record(
        &r,
        &binding,
        &outbox_row(t("Order"), Column::Null, Column::Null),
    );
    assert_eq!(rec.key, b(b"null"));
    assert_eq!(rec.value, b(b"null"));
}

#[test]
fn null_payload_and_key_with_strings() {
    let r = router(&[], strings());
    let binding = bound(&r, &outbox());
    let rec = record(
        &r,
        &binding,
        &outbox_row(t("Order"), Column::Null, Column::Null),
    );
    assert_eq!(rec.key, None);
    assert_eq!(rec.value, None);
}

#[test]
fn string_encoding_passes_text_through_unchanged() {
    let r = router(&[], strings());
    let binding = bound(&r, &outbox());
    let payload = Bytes::from_static(br#"{"a": "x\ty", "b": [1, 2]}"#);
    let tuple = outbox_row(t("Order"), t("order-1"), Column::Text(payload.clone()));
    let rec = record(&r, &binding, &tuple);
    assert_eq!(rec.key, b(b"order-1"));
    let value = rec.value.unwrap_or_default();
    assert_eq!(value, payload);
    // A copy: the record outlives the buffer the row was received into.
    assert_ne!(value.as_ptr(), payload.as_ptr());
}

#[test]
fn mixed_key_and_value_encodings() {
    let r = router(
        &[],
        Format {
            key: Encoding::String,
            value: Encoding::Json,
            ..Format::default()
        },
    );
    let binding = bound(&r, &outbox());
    let rec = record(
        &r,
        &binding,
        &outbox_row(t("Order"), t("k"), t("{\"a\": 1}")),
    );
    assert_eq!(rec.key, b(b"k"));
    assert_eq!(rec.value, b(br#""{\"a\": 1}""#));
}

#[test]
fn typed_key_and_payload_columns() {
    let rel = relation(&[
        ("id", UUID),
        ("aggregatetype", TEXT),
        ("aggregateid", BOOL),
        ("payload", FLOAT8),
    ]);
    let r = router(&[], json());
    let binding = bound(&r, &rel);
    let tuple = row(vec![t(EVENT_ID), t("T"), t("t"), t("1e+100")]);
    let rec = record(&r, &binding, &tuple);
    assert_eq!(rec.key, b(b"true"));
    assert_eq!(rec.value, b(b"1.0E100"));

    let tuple = row(vec![t(EVENT_ID), t("T"), t("f"), t("NaN")]);
    let rec = record(&r, &binding, &tuple);
    assert_eq!(rec.key, b(b"false"));
    assert_eq!(rec.value, b(b"\"NaN\""));

    let r = router(&[], strings());
    let rec = record(&r, &binding, &tuple);
    assert_eq!(rec.key, b(b"false"));
    assert_eq!(rec.value, b(b"NaN"));
}

#[test]
fn typed_event_id_header() {
    let rel = relation(&[
        ("id", BOOL),
        ("aggregatetype", TEXT),
        ("aggregateid", TEXT),
        ("payload", TEXT),
    ]);
    let r = router(&[], json());
    let binding = bound(&r, &rel);
    let rec = record(&r, &binding, &row(vec![t("t"), t("T"), t("k"), t("p")]));
    assert_eq!(rec.headers[0].value, b(b"true"));
}

#[test]
fn delete_is_skipped() {
    let r = router(&[], json());
    let binding = bound(&r, &outbox());
    let tuple = outbox_row(t("Order"), t("1"), t("{}"));
    assert_eq!(
        r.route(&binding, Change::Delete(&tuple)),
        Ok(Routed::Skipped(SkipReason::Delete))
    );
    assert_eq!(r.log_level(SkipReason::Delete), LogLevel::Info);
    assert!(r.skips_deletes());
    // Whatever the options: the session then skips a DELETE without decoding its old row.
    for options in [
        &[("table.op.invalid.behavior", "fatal")][..],
        &[("table.op.invalid.behavior", "error")],
        &[("route.tombstone.on.empty.payload", "true")],
        &[("table.expand.json.payload", "true")],
    ] {
        let r = router(options, json());
        let binding = bound(&r, &outbox());
        assert!(r.skips_deletes(), "{options:?}");
        for old in [
            row(vec![]),
            outbox_row(t("Order"), Column::Null, Column::Null),
        ] {
            assert_eq!(
                r.route(&binding, Change::Delete(&old)),
                Ok(Routed::Skipped(SkipReason::Delete)),
                "{options:?}"
            );
        }
        assert_eq!(r.log_level(SkipReason::Delete), LogLevel::Info);
    }
}

#[test]
fn update_follows_table_op_invalid_behavior() {
    let tuple = outbox_row(t("Order"), t("1"), t("{}"));
    let update = Change::Update {
        old: None,
        new: &tuple,
    };
    for (behavior, level) in [("warn", LogLevel::Warn), ("error", LogLevel::Error)] {
        let r = router(&[("table.op.invalid.behavior", behavior)], json());
        let binding = bound(&r, &outbox());
        assert_eq!(
            r.route(&binding, update),
            Ok(Routed::Skipped(SkipReason::Update))
        );
        assert_eq!(r.log_level(SkipReason::Update), level);
    }
    let r = router(&[("table.op.invalid.behavior", "fatal")], json());
    let binding = bound(&r, &outbox());
    let err = r.route(&binding, update);
    assert!(
        matches!(&err, Err(RouteError::InvalidOperation { table, .. }) if table == "public.outbox"),
        "{err:?}"
    );
    // The default is warn.
    let r = router(&[], json());
    assert_eq!(
        r.route(&binding, update),
        Ok(Routed::Skipped(SkipReason::Update))
    );
    assert_eq!(r.log_level(SkipReason::Update), LogLevel::Warn);
}

#[test]
fn missing_column_names_the_column_the_option_and_the_table() {
    let r = router(&[], json());
    let rel = relation(&[("id", UUID), ("aggregatetype", VARCHAR), ("payload", JSONB)]);
    let err = r.bind(&rel);
    let Err(err) = err else {
        panic!("bound a table without a key column")
    };
    assert_eq!(
        err.to_string(),
        "table public.outbox has no column \"aggregateid\" (the column named by table.field.event.key); add it or set table.field.event.key to the column that holds the aggregate id"
    );
    for (missing, option) in [
        ("id", "table.field.event.id"),
        ("aggregatetype", "route.by.field"),
        ("payload", "table.field.event.payload"),
    ] {
        let columns: Vec<_> = [
            ("id", UUID),
            ("aggregatetype", VARCHAR),
            ("aggregateid", VARCHAR),
            ("payload", JSONB),
        ]
        .into_iter()
        .filter(|(n, _)| *n != missing)
        .collect();
        let err = r.bind(&relation(&columns));
        assert!(
            matches!(&err, Err(RouteError::MissingColumn { table, column, option: o, .. })
                if table == "public.outbox" && column == missing && *o == option),
            "{err:?}"
        );
    }
}

#[test]
fn column_names_are_case_sensitive() {
    let r = router(&[], json());
    let rel = relation(&[
        ("id", UUID),
        ("AggregateType", VARCHAR),
        ("aggregateid", VARCHAR),
        ("payload", JSONB),
    ]);
    assert!(matches!(
        r.bind(&rel),
        Err(RouteError::MissingColumn { .. })
    ));
}

#[test]
fn empty_namespace_is_pg_catalog() {
    let mut rel = outbox();
    rel.namespace = Text::from_static("");
    let r = router(&[], json());
    assert_eq!(bound(&r, &rel).table(), "pg_catalog.outbox");
}

#[test]
fn unsupported_column_types_are_refused_at_bind() {
    let r = router(&[], json());
    let rel = relation(&[
        ("id", UUID),
        ("aggregatetype", VARCHAR),
        ("aggregateid", VARCHAR),
        ("payload", NUMERIC),
    ]);
    let err = r.bind(&rel);
    assert!(
        matches!(&err, Err(RouteError::UnsupportedColumnType { column, type_oid: 1700, .. }) if column == "payload"),
        "{err:?}"
    );
    // bytea is accepted for the key and payload only.
    let rel = relation(&[
        ("id", BYTEA),
        ("aggregatetype", VARCHAR),
        ("aggregateid", VARCHAR),
        ("payload", BYTEA),
    ]);
    let err = r.bind(&rel);
    assert!(
        matches!(&err, Err(RouteError::UnsupportedColumnType { column, type_oid: 17, .. }) if column == "id"),
        "{err:?}"
    );
    let rel = relation(&[
        ("id", TIMESTAMPTZ),
        ("aggregatetype", VARCHAR),
        ("aggregateid", VARCHAR),
        ("payload", JSONB),
    ]);
    assert!(matches!(
        r.bind(&rel),
        Err(RouteError::UnsupportedColumnType { .. })
    ));
    let rel = relation(&[
        ("id", UUID),
        ("aggregatetype", INT4),
        ("aggregateid", VARCHAR),
        ("payload", JSONB),
    ]);
    let err = r.bind(&rel);
    assert!(
        matches!(&err, Err(RouteError::RoutingColumnNotText { column, .. }) if column == "aggregatetype"),
        "{err:?}"
    );
}

#[test]
fn user_defined_types_are_text() {
    let r = router(&[], json());
    let rel = relation(&[
        ("id", UUID),
        ("aggregatetype", 16_500),
        ("aggregateid", 16_501),
        ("payload", JSONB),
    ]);
    let binding = bound(&r, &rel);
    let rec = record(
        &r,
        &binding,
        &row(vec![t(EVENT_ID), t("Order"), t("k"), t("{}")]),
    );
    assert_eq!(&*rec.topic, "outbox.event.Order");
    assert_eq!(rec.key, b(b"\"k\""));
}

#[test]
fn null_event_id_and_routing_value_are_errors() {
    let r = router(&[], json());
    let binding = bound(&r, &outbox());
    let tuple = row(vec![Column::Null, t("Order"), t("1"), t("x"), t("{}")]);
    let err = route_err(&r, &binding, &tuple);
    assert!(
        matches!(&err, RouteError::NullColumn { column, table, .. } if column == "id" && table == "public.outbox"),
        "{err:?}"
    );
    let tuple = outbox_row(Column::Null, t("1"), t("{}"));
    let err = route_err(&r, &binding, &tuple);
    assert!(
        matches!(&err, RouteError::NullColumn { column, .. } if column == "aggregatetype"),
        "{err:?}"
    );
    assert!(err.to_string().contains("route.by.field"), "{err}");
}

#[test]
fn illegal_topics_are_errors() {
    let r = router(&[], json());
    let binding = bound(&r, &outbox());
    for value in ["has space", "a/b", "ünï", "multi\nline"] {
        let err = route_err(&r, &binding, &outbox_row(t(value), t("1"), t("{}")));
        assert!(
            matches!(&err, RouteError::InvalidTopic { column, .. } if column == "aggregatetype"),
            "{err:?}"
        );
    }
    let r = router(&[("route.topic.replacement", "${routedByValue}")], json());
    let err = route_err(&r, &binding, &outbox_row(t(""), t("1"), t("{}")));
    assert!(matches!(err, RouteError::InvalidTopic { .. }), "{err:?}");
    // An empty routing value with the default replacement is a legal topic.
    let r = router(&[], json());
    assert_eq!(
        &*record(&r, &binding, &outbox_row(t(""), t("1"), t("{}"))).topic,
        "outbox.event."
    );
}

#[test]
fn unchanged_toast_binary_and_bad_utf8_are_errors() {
    let r = router(&[], json());
    let binding = bound(&r, &outbox());
    let err = route_err(
        &r,
        &binding,
        &outbox_row(t("Order"), t("1"), Column::UnchangedToast),
    );
    assert!(
        matches!(&err, RouteError::UnchangedToast { column, table } if column == "payload" && table == "public.outbox"),
        "{err:?}"
    );
    let err = route_err(
        &r,
        &binding,
        &outbox_row(
            t("Order"),
            Column::Binary(Bytes::from_static(b"\0\0")),
            t("{}"),
        ),
    );
    assert!(
        matches!(&err, RouteError::BinaryColumn { column, .. } if column == "aggregateid"),
        "{err:?}"
    );
    let err = route_err(
        &r,
        &binding,
        &outbox_row(
            t("Order"),
            t("1"),
            Column::Text(Bytes::from_static(b"\xff")),
        ),
    );
    assert!(
        matches!(&err, RouteError::InvalidUtf8 { column, .. } if column == "payload"),
        "{err:?}"
    );
}

#[test]
fn invalid_typed_text_is_an_error() {
    let rel = relation(&[
        ("id", INT8),
        ("aggregatetype", TEXT),
        ("aggregateid", TEXT),
        ("payload", TEXT),
    ]);
    let r = router(&[], json());
    let binding = bound(&r, &rel);
    let err = route_err(&r, &binding, &row(vec![t("12x"), t("T"), t("k"), t("p")]));
    assert!(
        matches!(&err, RouteError::InvalidValue { column, .. } if column == "id"),
        "{err:?}"
    );
}

#[test]
fn rows_that_do_not_match_the_binding_are_errors() {
    let r = router(&[], json());
    let binding = bound(&r, &outbox());
    let err = route_err(&r, &binding, &row(vec![t(EVENT_ID), t("Order")]));
    assert!(
        matches!(
            err,
            RouteError::ColumnCountMismatch {
                expected: 5,
                actual: 2,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn unknown_option_is_a_config_error() {
    let map = BTreeMap::from([("table.expand.json.payloads".to_owned(), "true".to_owned())]);
    let err = RouterOptions::from_map(&map);
    assert!(
        matches!(&err, Err(RouterConfigError::UnknownOption { option, .. }) if option == "table.expand.json.payloads"),
        "{err:?}"
    );
}

fn any_column() -> impl Strategy<Value = Column> {
    prop_oneof![
        Just(Column::Null),
        Just(Column::UnchangedToast),
        proptest::collection::vec(any::<u8>(), 0..24).prop_map(|v| Column::Text(Bytes::from(v))),
        "[a-zA-Z0-9._-]{0,12}".prop_map(|s| Column::Text(Bytes::from(s))),
        "-?[0-9]{1,5}(\\.[0-9]{1,3})?|t|f|NaN|-?Infinity"
            .prop_map(|s| Column::Text(Bytes::from(s))),
        proptest::collection::vec(any::<u8>(), 0..8).prop_map(|v| Column::Binary(Bytes::from(v))),
    ]
}

fn any_type() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(16u32),
        Just(17),
        Just(18),
        Just(19),
        Just(20),
        Just(21),
        Just(23),
        Just(25),
        Just(26),
        Just(114),
        Just(700),
        Just(701),
        Just(1042),
        Just(1043),
        Just(1700),
        Just(2950),
        Just(3802),
        any::<u32>(),
    ]
}

proptest! {
    #[test]
    fn routing_never_panics(
        types in proptest::collection::vec(any_type(), 4),
        columns in proptest::collection::vec(any_column(), 0..7),
        json_key in any::<bool>(),
        json_value in any::<bool>(),
        op in 0u8..3,
    ) {
        let names = ["id", "aggregatetype", "aggregateid", "payload"];
        let rel = relation(&names.iter().copied().zip(types.iter().copied()).collect::<Vec<_>>());
        let encoding = |json| if json { Encoding::Json } else { Encoding::String };
        let r = router(&[], Format { key: encoding(json_key), value: encoding(json_value), ..Format::default() });
        if let Ok(binding) = r.bind(&rel) {
            let tuple = row(columns);
            let change = match op {
                0 => Change::Insert(&tuple),
                1 => Change::Update { old: None, new: &tuple },
                _ => Change::Delete(&tuple),
            };
            let routed = r.route(&binding, change);
            if op == 2 && r.skips_deletes() {
                prop_assert_eq!(&routed, &Ok(Routed::Skipped(SkipReason::Delete)));
            }
            if let Ok(Routed::Record(rec)) = routed {
                prop_assert!(rec.topic.starts_with("outbox.event."));
                for bytes in [&rec.key, &rec.value].into_iter().flatten() {
                    if json_key && json_value {
                        prop_assert!(serde_json::from_slice::<serde_json::Value>(bytes).is_ok());
                    }
                }
            }
        }
    }

    #[test]
    fn json_payload_reads_back_as_the_column_text(payload in any::<String>()) {
        let r = router(&[], json());
        let binding = bound(&r, &outbox());
        let rec = record(&r, &binding, &outbox_row(t("Order"), t("1"), t(&payload)));
        let value = rec.value.unwrap_or_default();
        let back: String = serde_json::from_slice(&value).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(back, payload);
    }
}

/// A row whose columns are slices of one buffer, as rows read from the replication stream are
/// slices of the buffer they were received into; the buffer for the range check.
fn row_in_one_buffer(texts: &[&str]) -> (TupleData, Bytes) {
    let buffer = Bytes::from(texts.concat().into_bytes());
    let mut at = 0;
    let columns = texts
        .iter()
        .map(|text| {
            let column = Column::Text(buffer.slice(at..at + text.len()));
            at += text.len();
            column
        })
        .collect();
    (TupleData { columns }, buffer)
}

/// Whether `bytes` lies inside `buffer`'s memory.
fn shares_memory(bytes: &Bytes, buffer: &Bytes) -> bool {
    let start = buffer.as_ptr() as usize;
    let at = bytes.as_ptr() as usize;
    !bytes.is_empty() && at >= start && at < start + buffer.len()
}

proptest! {
    /// A routed record owns its bytes: a key, value or header that kept a slice of the row would
    /// keep the whole receive buffer alive for as long as the record waits for its
    /// acknowledgement, outside the byte window that bounds memory.
    #[test]
    fn records_never_share_memory_with_the_row(
        json_key in any::<bool>(),
        json_value in any::<bool>(),
        integer_key in any::<bool>(),
        headers in any::<bool>(),
    ) {
        let encoding = |json| if json { Encoding::Json } else { Encoding::String };
        let placements = [("table.fields.additional.placement", "type:header:eventType,aggregateid:header:aggregate,aggregatetype:envelope:kind")];
        let r = router(
            if headers { &placements } else { &[] },
            Format { key: encoding(json_key), value: encoding(json_value), ..Format::default() },
        );
        let rel = relation(&[
            ("id", UUID),
            ("aggregatetype", VARCHAR),
            ("aggregateid", if integer_key { INT8 } else { VARCHAR }),
            ("type", VARCHAR),
            ("payload", TEXT),
        ]);
        let binding = bound(&r, &rel);
        let (tuple, buffer) = row_in_one_buffer(&[EVENT_ID, "Order", "4711", "OrderCreated", "plain text payload"]);
        let rec = record(&r, &binding, &tuple);
        for bytes in [&rec.key, &rec.value].into_iter().flatten() {
            prop_assert!(!shares_memory(bytes, &buffer), "{rec:?}");
        }
        for header in &rec.headers {
            if let Some(value) = &header.value {
                prop_assert!(!shares_memory(value, &buffer), "header {}: {rec:?}", header.name);
            }
        }
    }
}
