//! Arbitrary router options, outbox relations and row changes through the router.
//!
//! Option names, option values, column names, type oids and column texts are mostly drawn
//! from small alphabets of meaningful values (the router's own option names, Debezium's
//! defaults, the outbox column names, common type oids, values as PostgreSQL prints them),
//! with arbitrary values mixed in, so the fuzzer reaches a bound table and a routed record
//! quickly.
//!
//! Besides "never panics", the target checks the documented router invariants:
//! - routing is deterministic: the same inputs give the same output;
//! - a routed record's topic is a legal Kafka topic name.
//!
//! `fuzz/make_seeds.py` encodes a few hand-made inputs of this shape: keep the two in step.

#![no_main]

use arbitrary::Arbitrary;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use pgoutput::{Column, Relation, RelationColumn, ReplicaIdentity, Text, TupleData};
use siphon_router::check_topic_name;
use siphon_router::RegistrySchemaKind;
use siphon_router::{oid, FIRST_USER_OID};
use siphon_router::{
    Change, Encoding, EventRouter, Format, RegistryRecord, RegistryValue, Routed, RouterContext,
    RouterOptions, SkipReason,
};
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// Option names besides the router's own (`supported_options` and `ignored_options`).
const EXTRA_OPTION_NAMES: &[&str] = &[
    "transforms.outbox.route.by.field",
    "route.by.field ",
    "ROUTE.BY.FIELD",
    "",
];

const COLUMN_NAMES: &[&str] = &[
    "id",
    "aggregatetype",
    "aggregateid",
    "payload",
    "type",
    "created_at",
    "version",
    "part",
    "event_id",
    "kind",
    "",
];

const OPTION_VALUES: &[&str] = &[
    // route.topic.replacement
    "outbox.event.${routedByValue}",
    "${routedByValue}",
    "events.$1",
    "$0",
    "x.${routedByValue}.y",
    "\\$",
    "\\",
    "$",
    "${",
    "${type}",
    "$2",
    // route.topic.regex
    "(?<routedByValue>.*)",
    "(.*)",
    "(?<routedByValue>.*)Created",
    "([a-z]+)\\.(.*)",
    "(?i)order",
    "(",
    "a{1000}{1000}",
    "\\p{Greek}+",
    // behaviours and booleans
    "warn",
    "error",
    "fatal",
    "FATAL",
    " Warn ",
    "ignore",
    "optional_bytes",
    "optional_string",
    "true",
    "false",
    "TRUE",
    "yes",
    // table.fields.additional.placement
    "type:header",
    "type:header:eventType",
    "type:envelope",
    "type:envelope:payload",
    "aggregateid:partition",
    "part:partition",
    "type:envelope:t,version:envelope:t",
    "type:header,aggregateid:envelope:agg,part:partition",
    "type",
    "type:nowhere",
    ":header",
    ",,",
    // topic.prefix
    "siphon",
    " ",
    "",
];

const OIDS: &[u32] = &[
    oid::BOOL,
    oid::BYTEA,
    oid::CHAR,
    oid::NAME,
    oid::INT8,
    oid::INT2,
    oid::INT4,
    oid::TEXT,
    oid::OID,
    oid::JSON,
    oid::FLOAT4,
    oid::FLOAT8,
    oid::BPCHAR,
    oid::VARCHAR,
    oid::DATE,
    oid::TIME,
    oid::TIMESTAMP,
    oid::TIMESTAMPTZ,
    oid::INTERVAL,
    oid::NUMERIC,
    oid::UUID,
    oid::JSONB,
    FIRST_USER_OID,
    FIRST_USER_OID - 1,
    u32::MAX,
    0,
];

const TEXTS: &[&str] = &[
    // routing values and topics
    "Order",
    "order-events",
    "a.b_c-d",
    ".",
    "..",
    "bad topic",
    "line\nbreak",
    // numbers
    "0",
    "-1",
    "42",
    "+7",
    "007",
    "2147483648",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "1.5",
    "-0",
    "1e10",
    "1e309",
    "3.4028235e38",
    "1.17549435e-38",
    "4.9e-324",
    "NaN",
    "Infinity",
    "-Infinity",
    // booleans
    "t",
    "f",
    "true",
    // JSON
    "{\"a\": [1, 2.5, null, \"\\u00e9\"]}",
    "{\"a\":{\"b\":[1,{\"c\":null}],\"d\":[],\"e\":true,\"f\":1e400}}",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
    "{\"k\": 12345678901234567890, \"s\": \"\\ud800\"}",
    "[]",
    "{}",
    "null",
    "\"\u{2028}\u{1F600}\"",
    // timestamps
    "2024-01-02 03:04:05.123456+00",
    "2024-01-02 03:04:05",
    "2024-02-30 25:61:61+14:59",
    "294276-12-31 23:59:59.999999+00",
    "0001-01-01 00:00:00+00 BC",
    "infinity",
    "-infinity",
    // bytea
    "\\xdeadbeef",
    "\\x",
    "\\xZZ",
    "abc\\\\000\\001",
    // uuid
    "f81d4fae-7dec-11d0-a765-00a0c91e6bf6",
    "",
];

/// A string from an alphabet, or an arbitrary one.
#[derive(Arbitrary, Debug)]
enum Pick {
    Known(u8),
    Padded(u8),
    Random(String),
}

impl Pick {
    fn get(&self, alphabet: &[&str]) -> String {
        match self {
            Pick::Known(i) => alphabet[usize::from(*i) % alphabet.len()].to_owned(),
            Pick::Padded(i) => format!(" {} ", alphabet[usize::from(*i) % alphabet.len()]),
            Pick::Random(s) => s.clone(),
        }
    }
}

#[derive(Arbitrary, Debug)]
enum OptionValue {
    Column(Pick),
    Other(Pick),
}

#[derive(Arbitrary, Debug)]
enum TypeOid {
    Known(u8),
    Random(u32),
}

#[derive(Arbitrary, Debug)]
struct ColumnSpec {
    name: Pick,
    type_oid: TypeOid,
    flags: u8,
    type_modifier: i32,
    not_null: bool,
}

/// Bytes taken as one length-prefixed run (cheaper for the fuzzer than a `Vec<u8>`, which
/// spends a continuation byte per element).
#[derive(Debug)]
struct Raw(Vec<u8>);

impl<'a> Arbitrary<'a> for Raw {
    fn arbitrary(u: &mut arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
        <&[u8]>::arbitrary(u).map(|b| Raw(b.to_vec()))
    }
}

#[derive(Arbitrary, Debug)]
enum Value {
    Null,
    UnchangedToast,
    KnownText(u8),
    Text(Raw),
    Binary(Raw),
}

#[derive(Arbitrary, Debug)]
struct Row {
    values: Vec<Value>,
    /// Pad or cut the row to the relation's column count (null padding).
    fit: bool,
}

#[derive(Arbitrary, Debug)]
enum ChangeSpec {
    Insert(Row),
    Update { old: Option<Row>, new: Row },
    Delete(Row),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum EncodingSpec {
    Json,
    String,
    JsonSchemas,
    Binary,
    Avro,
    RegisteredAvro,
    RegisteredJson,
}

#[derive(Arbitrary, Debug)]
struct Input {
    options: Vec<(Pick, OptionValue)>,
    key: EncodingSpec,
    value: EncodingSpec,
    /// Numbers printed as Java 17 prints them rather than Java 19+.
    java17_numbers: bool,
    /// The run id of Debezium's context headers; `None` builds the router without them.
    context: Option<String>,
    relation_id: u32,
    namespace: String,
    table: String,
    replica_identity: u8,
    columns: Vec<ColumnSpec>,
    changes: Vec<ChangeSpec>,
}

fn option_names() -> &'static [&'static str] {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    NAMES.get_or_init(|| {
        RouterOptions::supported_options()
            .chain(RouterOptions::ignored_options())
            .chain(EXTRA_OPTION_NAMES.iter().copied())
            .collect()
    })
}

fn encoding(spec: EncodingSpec) -> Encoding {
    match spec {
        EncodingSpec::Json => Encoding::Json,
        EncodingSpec::String => Encoding::String,
        EncodingSpec::JsonSchemas => Encoding::JsonSchemas,
        EncodingSpec::Binary => Encoding::Binary,
        EncodingSpec::Avro => Encoding::Avro,
        EncodingSpec::RegisteredAvro => Encoding::Registered(RegistrySchemaKind::Avro),
        EncodingSpec::RegisteredJson => Encoding::Registered(RegistrySchemaKind::Json),
    }
}

fn text(s: String) -> Text {
    Text::new(Bytes::from(s.into_bytes())).expect("a String is UTF-8")
}

fn tuple(row: &Row, column_count: usize) -> TupleData {
    let mut columns: Vec<Column> = row
        .values
        .iter()
        .map(|v| match v {
            Value::Null => Column::Null,
            Value::UnchangedToast => Column::UnchangedToast,
            Value::KnownText(i) => Column::Text(Bytes::from_static(
                TEXTS[usize::from(*i) % TEXTS.len()].as_bytes(),
            )),
            Value::Text(Raw(b)) => Column::Text(Bytes::copy_from_slice(b)),
            Value::Binary(Raw(b)) => Column::Binary(Bytes::copy_from_slice(b)),
        })
        .collect();
    if row.fit {
        columns.resize(column_count, Column::Null);
    }
    TupleData { columns }
}

fuzz_target!(|input: Input| {
    let map: BTreeMap<String, String> = input
        .options
        .iter()
        .map(|(name, value)| {
            let value = match value {
                OptionValue::Column(p) => p.get(COLUMN_NAMES),
                OptionValue::Other(p) => p.get(OPTION_VALUES),
            };
            (name.get(option_names()), value)
        })
        .collect();
    let options = match RouterOptions::from_map(&map) {
        Ok(options) => {
            let _ = options.warnings();
            options
        }
        Err(error) => {
            let _ = error.to_string();
            // Carry on with the defaults, so a bad option map still reaches routing.
            RouterOptions::default()
        }
    };

    let relation = Relation {
        xid: None,
        id: input.relation_id,
        namespace: text(input.namespace.clone()),
        name: text(input.table.clone()),
        replica_identity: match input.replica_identity % 4 {
            0 => ReplicaIdentity::Default,
            1 => ReplicaIdentity::Nothing,
            2 => ReplicaIdentity::Full,
            _ => ReplicaIdentity::Index,
        },
        columns: input
            .columns
            .iter()
            .map(|c| RelationColumn {
                flags: c.flags,
                name: text(c.name.get(COLUMN_NAMES)),
                type_oid: match c.type_oid {
                    TypeOid::Known(i) => OIDS[usize::from(i) % OIDS.len()],
                    TypeOid::Random(o) => o,
                },
                type_modifier: c.type_modifier,
            })
            .collect(),
    };
    let not_null = |name: &str| {
        relation
            .columns
            .iter()
            .zip(&input.columns)
            .any(|(c, spec)| spec.not_null && c.name.as_str() == name)
    };

    let format = Format {
        key: encoding(input.key),
        value: encoding(input.value),
        numbers: if input.java17_numbers {
            siphon_router::JavaNumbers::Java17
        } else {
            siphon_router::JavaNumbers::Java19
        },
    };
    let router = match &input.context {
        None => EventRouter::new(options, format),
        Some(run_id) => {
            match EventRouter::new_with_context(
                options.clone(),
                format,
                RouterContext::postgresql(run_id.clone()),
            ) {
                Ok(router) => router,
                Err(error) => {
                    let _ = error.to_string();
                    EventRouter::new(options, format)
                }
            }
        }
    };
    let binding = match router.bind_with_not_null(&relation, &not_null) {
        Ok(binding) => binding,
        Err(error) => {
            let _ = error.to_string();
            return;
        }
    };
    assert_eq!(binding.column_count(), relation.columns.len());
    if let Ok(plain) = router.bind(&relation) {
        assert_eq!(plain.column_count(), binding.column_count());
    }

    let n = relation.columns.len();
    for spec in &input.changes {
        let (a, b);
        let change = match spec {
            ChangeSpec::Insert(row) => {
                a = tuple(row, n);
                Change::Insert(&a)
            }
            ChangeSpec::Update { old, new } => {
                a = old.as_ref().map(|r| tuple(r, n)).unwrap_or_default();
                b = tuple(new, n);
                Change::Update {
                    old: old.as_ref().map(|_| &a),
                    new: &b,
                }
            }
            ChangeSpec::Delete(row) => {
                a = tuple(row, n);
                Change::Delete(&a)
            }
        };
        let routed = router.route(&binding, change);
        assert_eq!(
            routed,
            router.route(&binding, change),
            "routing is not deterministic"
        );
        match &routed {
            Ok(Routed::Record(record)) => {
                if let Err(reason) = check_topic_name(&record.topic) {
                    panic!("routed to an illegal topic {:?}: {reason}", record.topic);
                }
            }
            Ok(Routed::Registry(RegistryRecord {
                record, key, value, ..
            })) => {
                if let Err(reason) = check_topic_name(&record.topic) {
                    panic!("routed to an illegal topic {:?}: {reason}", record.topic);
                }
                let framed = |bytes: &Option<Bytes>| {
                    bytes.as_deref().is_some_and(|v| v.len() >= 5 && v[0] == 0)
                };
                if let Some(schema) = key {
                    assert!(framed(&record.key), "an Avro key is framed");
                    assert!(!schema.text().is_empty());
                }
                if let RegistryValue::Derived(schema) = value {
                    assert!(framed(&record.value), "an Avro value is framed");
                    assert!(!schema.text().is_empty());
                }
            }
            Ok(Routed::Skipped(reason)) => {
                let _ = router.log_level(*reason);
                assert!(!matches!(
                    (reason, change),
                    (SkipReason::Delete, Change::Insert(_))
                ));
            }
            Err(error) => {
                let _ = error.to_string();
            }
        }
    }
});
