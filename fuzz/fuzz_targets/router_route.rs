//! Arbitrary router options, outbox relations and row changes through the router.
//!
//! Option names, column names, type oids and column texts are mostly drawn from small
//! alphabets of meaningful values (Debezium's option names and defaults, the outbox column
//! names, common type oids, numbers and booleans as PostgreSQL prints them), with arbitrary
//! values mixed in, so the fuzzer reaches a bound table and a routed record quickly.
//!
//! Besides "never panics", the target checks the documented router invariants:
//! - routing is deterministic: the same inputs give the same output;
//! - a routed record's topic is a legal Kafka topic name.

#![no_main]

use arbitrary::Arbitrary;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use pgoutput::{Column, Relation, RelationColumn, ReplicaIdentity, Text, TupleData};
use siphon_router::encode::oid;
use siphon_router::topic::check_topic_name;
use siphon_router::{
    partition_for_key, Change, Encoding, EventRouter, Format, Routed, RouterOptions, SkipReason,
};
use std::collections::BTreeMap;

const OPTION_NAMES: &[&str] = &[
    "table.field.event.id",
    "table.field.event.key",
    "table.field.event.payload",
    "route.by.field",
    "route.topic.replacement",
    "table.op.invalid.behavior",
    "route.topic.regex",
    "transforms.outbox.route.by.field",
    "",
];

const COLUMN_NAMES: &[&str] = &[
    "id",
    "aggregatetype",
    "aggregateid",
    "payload",
    "type",
    "event_id",
    "aggregate_type",
    "aggregate_id",
    "body",
    "",
];

const OPTION_VALUES: &[&str] = &[
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
    "warn",
    "error",
    "fatal",
    "FATAL",
    " Warn ",
    "ignore",
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
    siphon_router::encode::FIRST_USER_OID,
    siphon_router::encode::FIRST_USER_OID - 1,
    u32::MAX,
    0,
];

const TEXTS: &[&str] = &[
    "Order",
    "order-events",
    "a.b_c-d",
    ".",
    "..",
    "bad topic",
    "line\nbreak",
    "0",
    "-1",
    "42",
    "+7",
    "007",
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
    "t",
    "f",
    "true",
    "false",
    "{\"a\": [1, 2.5, null, \"\\u00e9\"]}",
    "\"\u{2028}\u{1F600}\"",
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
}

#[derive(Arbitrary, Debug)]
enum Value {
    Null,
    UnchangedToast,
    KnownText(u8),
    Text(Vec<u8>),
    Binary(Vec<u8>),
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

#[derive(Arbitrary, Debug)]
struct Input {
    options: Vec<(Pick, OptionValue)>,
    key_string: bool,
    value_string: bool,
    relation_id: u32,
    namespace: String,
    table: String,
    replica_identity: u8,
    columns: Vec<ColumnSpec>,
    changes: Vec<ChangeSpec>,
    partitions: i32,
}

fn encoding(string: bool) -> Encoding {
    if string {
        Encoding::String
    } else {
        Encoding::Json
    }
}

fn tuple(row: &Row, column_count: usize) -> TupleData {
    let mut columns: Vec<Column> = row
        .values
        .iter()
        .map(|v| match v {
            Value::Null => Column::Null,
            Value::UnchangedToast => Column::UnchangedToast,
            Value::KnownText(i) => {
                Column::Text(Bytes::from_static(TEXTS[usize::from(*i) % TEXTS.len()].as_bytes()))
            }
            Value::Text(b) => Column::Text(Bytes::copy_from_slice(b)),
            Value::Binary(b) => Column::Binary(Bytes::copy_from_slice(b)),
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
            (name.get(OPTION_NAMES), value)
        })
        .collect();
    let options = match RouterOptions::from_map(&map) {
        Ok(options) => options,
        Err(error) => {
            let _ = error.to_string();
            // Carry on with the defaults, so a bad option map still reaches routing.
            RouterOptions::default()
        }
    };

    let relation = Relation {
        xid: None,
        id: input.relation_id,
        namespace: Text::new(Bytes::from(input.namespace.clone().into_bytes()))
            .expect("a String is UTF-8"),
        name: Text::new(Bytes::from(input.table.clone().into_bytes())).expect("a String is UTF-8"),
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
                name: Text::new(Bytes::from(c.name.get(COLUMN_NAMES).into_bytes()))
                    .expect("a String is UTF-8"),
                type_oid: match c.type_oid {
                    TypeOid::Known(i) => OIDS[usize::from(i) % OIDS.len()],
                    TypeOid::Random(o) => o,
                },
                type_modifier: c.type_modifier,
            })
            .collect(),
    };

    let router = EventRouter::new(
        options,
        Format {
            key: encoding(input.key_string),
            value: encoding(input.value_string),
        },
    );
    let binding = match router.bind(&relation) {
        Ok(binding) => binding,
        Err(error) => {
            let _ = error.to_string();
            return;
        }
    };
    assert_eq!(binding.column_count(), relation.columns.len());

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
        assert_eq!(routed, router.route(&binding, change), "routing is not deterministic");
        match &routed {
            Ok(Routed::Record(record)) => {
                if let Err(reason) = check_topic_name(&record.topic) {
                    panic!("routed to an illegal topic {:?}: {reason}", record.topic);
                }
                if let Some(key) = &record.key {
                    let p = partition_for_key(key, input.partitions);
                    assert!(p >= 0 && (input.partitions <= 0 || p < input.partitions));
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
