//! The schemas expected here were derived by hand from Confluent's `AvroData.fromConnectSchema`
//! and Avro's Java `Schema.toString()`; the values are decoded with the `apache-avro` crate.

use super::*;
use crate::format::expand::{expand, Expansion, JsonEmptyArrayBehavior, JsonNullBehavior};
use bytes::Bytes;
use proptest::prelude::*;

fn expanded(text: &str) -> (Schema, Value) {
    match expand(
        "payload",
        text,
        JsonNullBehavior::Ignore,
        JsonEmptyArrayBehavior::Ignore,
    ) {
        Expansion::Expanded { schema, value } => (schema, value),
        other => panic!("{text} did not expand: {other:?}"),
    }
}

fn named(mut schema: Schema, name: &str, version: Option<i32>) -> Schema {
    schema.name = Some(name.to_owned());
    schema.version = version;
    schema
}

#[test]
fn expanded_payload_schema() {
    let (schema, _) = expanded(
        r#"{"id":1,"big":5000000000,"price":9.5,"name":"a","ok":true,"tags":["x"],"order":{"lines":[{"sku":"s"}],"note":{"t":"n"}},"gone":null,"none":[]}"#,
    );
    let avro = AvroSchema::from_connect(&schema).unwrap();
    assert_eq!(
        avro.json(),
        concat!(
            r#"["null",{"type":"record","name":"payload","fields":["#,
            r#"{"name":"id","type":["null","int"],"default":null},"#,
            r#"{"name":"big","type":["null","long"],"default":null},"#,
            r#"{"name":"price","type":["null","double"],"default":null},"#,
            r#"{"name":"name","type":["null","string"],"default":null},"#,
            r#"{"name":"ok","type":["null","boolean"],"default":null},"#,
            r#"{"name":"tags","type":["null",{"type":"array","items":["null","string"]}],"default":null},"#,
            r#"{"name":"order","type":["null",{"type":"record","name":"order","namespace":"payload","fields":["#,
            r#"{"name":"lines","type":["null",{"type":"array","items":["null",{"type":"record","name":"lines","namespace":"payload.order","fields":["#,
            r#"{"name":"sku","type":["null","string"],"default":null}],"connect.name":"payload.order.lines"}]}],"default":null},"#,
            r#"{"name":"note","type":["null",{"type":"record","name":"note","namespace":"payload.order","fields":["#,
            r#"{"name":"t","type":["null","string"],"default":null}],"connect.name":"payload.order.note"}],"default":null}"#,
            r#"],"connect.name":"payload.order"}],"default":null}"#,
            r#"],"connect.name":"payload"}]"#,
        )
    );
}

#[test]
fn unexpanded_payloads_are_strings() {
    let plain = Schema::new(SchemaType::String, true);
    assert_eq!(
        AvroSchema::from_connect(&plain).unwrap().json(),
        r#"["null","string"]"#
    );
    let json = named(
        Schema::new(SchemaType::String, true),
        "io.debezium.data.Json",
        Some(1),
    );
    let avro = AvroSchema::from_connect(&json).unwrap();
    assert_eq!(
        avro.json(),
        r#"["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}]"#
    );
    assert_eq!(
        avro.encode(&Value::Str("{}".to_owned()), 7).unwrap(),
        [0, 0, 0, 0, 7, 2, 4, b'{', b'}']
    );
    assert_eq!(avro.encode(&Value::Null, 7).unwrap(), [0, 0, 0, 0, 7, 0]);
}

#[test]
fn envelope_with_column_values() {
    let schema = named(
        Schema::new(
            SchemaType::Struct(vec![
                (
                    "payload".to_owned(),
                    named(
                        Schema::new(SchemaType::String, true),
                        "io.debezium.data.Json",
                        Some(1),
                    ),
                ),
                ("n".to_owned(), Schema::new(SchemaType::Int16, false)),
                ("f".to_owned(), Schema::new(SchemaType::Float32, true)),
            ]),
            false,
        ),
        "orders.Value",
        Some(3),
    );
    let avro = AvroSchema::from_connect(&schema).unwrap();
    assert_eq!(
        avro.json(),
        concat!(
            r#"{"type":"record","name":"Value","namespace":"orders","fields":["#,
            r#"{"name":"payload","type":["null",{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}],"default":null},"#,
            r#"{"name":"n","type":{"type":"int","connect.type":"int16"}},"#,
            r#"{"name":"f","type":["null","float"],"default":null}"#,
            r#"],"connect.version":3,"connect.name":"orders.Value"}"#,
        )
    );
    let encoded = |s: &str| Value::Encoded {
        json: Bytes::from(s.to_owned()),
        text: Bytes::from(s.to_owned()),
    };
    let value = Value::Struct(vec![
        Value::Encoded {
            json: Bytes::from_static(br#""{}""#),
            text: Bytes::from_static(b"{}"),
        },
        encoded("-2"),
        encoded("1.5"),
    ]);
    let bytes = avro.encode(&value, 0x0102_0304).unwrap();
    // payload: branch 1, length 2, "{}"; n: zigzag(-2) = 3; f: branch 1, 1.5f32 little-endian.
    assert_eq!(
        bytes,
        [0, 1, 2, 3, 4, 2, 4, b'{', b'}', 3, 2, 0, 0, 0xc0, 0x3f]
    );
}

#[test]
fn unnamed_structs_take_default_names_and_references() {
    let inner = Schema::new(
        SchemaType::Struct(vec![(
            "a".to_owned(),
            Schema::new(SchemaType::Int64, false),
        )]),
        false,
    );
    let other = Schema::new(
        SchemaType::Struct(vec![(
            "b".to_owned(),
            Schema::new(SchemaType::Boolean, false),
        )]),
        true,
    );
    let schema = Schema::new(
        SchemaType::Struct(vec![
            ("x".to_owned(), inner.clone()),
            ("y".to_owned(), inner),
            ("z".to_owned(), other),
        ]),
        false,
    );
    assert_eq!(
        AvroSchema::from_connect(&schema).unwrap().json(),
        concat!(
            r#"{"type":"record","name":"ConnectDefault","namespace":"io.confluent.connect.avro","fields":["#,
            r#"{"name":"x","type":{"type":"record","name":"ConnectDefault2","fields":[{"name":"a","type":"long"}]}},"#,
            r#"{"name":"y","type":"ConnectDefault2"},"#,
            r#"{"name":"z","type":["null",{"type":"record","name":"ConnectDefault3","fields":[{"name":"b","type":"boolean"}]}],"default":null}"#,
            r#"]}"#,
        )
    );
}

#[test]
fn a_record_in_no_namespace_inside_one_says_so() {
    let inner = named(
        Schema::new(SchemaType::Struct(vec![]), false),
        "Inner",
        None,
    );
    let schema = named(
        Schema::new(SchemaType::Struct(vec![("i".to_owned(), inner)]), false),
        "a.Outer",
        None,
    );
    assert_eq!(
        AvroSchema::from_connect(&schema).unwrap().json(),
        concat!(
            r#"{"type":"record","name":"Outer","namespace":"a","fields":["#,
            r#"{"name":"i","type":{"type":"record","name":"Inner","namespace":"","fields":[],"connect.name":"Inner"}}"#,
            r#"],"connect.name":"a.Outer"}"#,
        )
    );
}

#[test]
fn names_avro_refuses_are_errors() {
    let (schema, _) = expanded(r#"{"order-id":1}"#);
    assert_eq!(
        AvroSchema::from_connect(&schema).unwrap_err(),
        AvroError::InvalidName {
            name: "order-id".to_owned()
        }
    );
    let (schema, _) = expanded(r#"{"1st":{"a":1}}"#);
    assert_eq!(
        AvroSchema::from_connect(&schema).unwrap_err(),
        AvroError::InvalidName {
            name: "1st".to_owned()
        }
    );
    let (schema, _) = expanded(r#"{"a.b":1}"#);
    assert_eq!(
        AvroSchema::from_connect(&schema).unwrap_err(),
        AvroError::InvalidName {
            name: "a.b".to_owned()
        }
    );
    // Paths of valid names never collide; hand-made schemas can.
    let struct_named = |field: &str, ty: SchemaType| {
        named(
            Schema::new(
                SchemaType::Struct(vec![(field.to_owned(), Schema::new(ty, false))]),
                false,
            ),
            "x.Same",
            None,
        )
    };
    let schema = Schema::new(
        SchemaType::Struct(vec![
            ("a".to_owned(), struct_named("f", SchemaType::Int32)),
            ("b".to_owned(), struct_named("f", SchemaType::String)),
        ]),
        false,
    );
    assert_eq!(
        AvroSchema::from_connect(&schema).unwrap_err(),
        AvroError::Redefined {
            name: "x.Same".to_owned()
        }
    );
}

#[test]
fn merged_array_elements_are_a_required_record() {
    let (schema, value) = expanded(r#"{"xs":[{"a":1},{"b":"s"}]}"#);
    let avro = AvroSchema::from_connect(&schema).unwrap();
    assert_eq!(
        avro.json(),
        concat!(
            r#"["null",{"type":"record","name":"payload","fields":["#,
            r#"{"name":"xs","type":["null",{"type":"array","items":{"type":"record","name":"xs","namespace":"payload","fields":["#,
            r#"{"name":"a","type":["null","int"],"default":null},{"name":"b","type":["null","string"],"default":null}"#,
            r#"],"connect.name":"payload.xs"}}],"default":null}"#,
            r#"],"connect.name":"payload"}]"#,
        )
    );
    // payload, xs: branch 1; a block of 2 records: (a=1, b=null), (a=null, b="s"); end.
    assert_eq!(
        avro.datum(&value).unwrap(),
        [2, 2, 4, 2, 2, 0, 0, 2, 2, b's', 0]
    );
}

#[test]
fn expanded_value_bytes() {
    let (schema, value) = expanded(r#"{"id":1,"name":"a","xs":[true,false],"gone":null}"#);
    let avro = AvroSchema::from_connect(&schema).unwrap();
    assert_eq!(
        avro.encode(&value, 42).unwrap(),
        [
            0, 0, 0, 0, 42, // frame
            2,  // payload: branch 1 (the record)
            2, 2, // id: branch 1, zigzag(1)
            2, 2, b'a', // name: branch 1, length 1, "a"
            2, 4, 2, 1, 2, 0,
            0, // xs: branch 1, block of 2, branch 1 true, branch 1 false, end
        ]
    );
}

#[test]
fn unpaired_surrogates_are_written_as_question_marks() {
    let (schema, value) = expanded(r#"{"s":"a\ud800b"}"#);
    let avro = AvroSchema::from_connect(&schema).unwrap();
    assert_eq!(avro.datum(&value).unwrap(), [2, 2, 6, b'a', b'?', b'b']);
}

#[test]
fn values_that_do_not_fit_are_errors() {
    let schema = Schema::new(SchemaType::Int32, false);
    let avro = AvroSchema::from_connect(&schema).unwrap();
    assert!(matches!(
        avro.datum(&Value::Null),
        Err(AvroError::Mismatch { .. })
    ));
    assert!(matches!(
        avro.datum(&Value::Int(1 << 40)),
        Err(AvroError::Mismatch { .. })
    ));
    assert!(matches!(
        avro.datum(&Value::Str("1".to_owned())),
        Err(AvroError::Mismatch { .. })
    ));
}

/// The decoded Avro value as JSON: unions unwrapped, records as objects without their null
/// fields (the documents hold no nulls: a null is a member an array element lacks).
fn as_json(value: &AvroValue) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        AvroValue::Null => J::Null,
        AvroValue::Boolean(b) => J::Bool(*b),
        AvroValue::Int(i) => J::from(*i),
        AvroValue::Long(i) => J::from(*i),
        AvroValue::Double(f) => J::from(*f),
        AvroValue::String(s) => J::String(s.clone()),
        AvroValue::Union(_, inner) => as_json(inner),
        AvroValue::Array(items) => J::Array(items.iter().map(as_json).collect()),
        AvroValue::Record(fields) => J::Object(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), as_json(v)))
                .filter(|(_, v)| !v.is_null())
                .collect(),
        ),
        other => panic!("unexpected {other:?}"),
    }
}

fn avro_name() -> impl Strategy<Value = String> {
    "[a-zA-Z_][a-zA-Z0-9_]{0,6}"
}

/// JSON documents whose expansion Avro can name: member names are Avro names, arrays hold
/// one kind of scalar, numbers are finite.
fn document() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value as J;
    let scalar = prop_oneof![
        any::<bool>().prop_map(J::Bool),
        any::<i64>().prop_map(J::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(J::from),
        ".{0,12}".prop_map(J::String),
    ];
    let array = prop_oneof![
        prop::collection::vec(any::<bool>().prop_map(J::Bool), 1..4),
        prop::collection::vec(any::<i32>().prop_map(J::from), 1..4),
        prop::collection::vec(".{0,6}".prop_map(J::String), 1..4),
        // Objects of one shape, members present or not: merged into one record.
        prop::collection::vec(
            (any::<Option<i32>>(), proptest::option::of(".{0,6}")).prop_map(|(a, b)| {
                let mut members = serde_json::Map::new();
                if let Some(a) = a {
                    members.insert("a".to_owned(), J::from(a));
                }
                if let Some(b) = b {
                    members.insert("b".to_owned(), J::String(b));
                }
                J::Object(members)
            }),
            1..4,
        ),
    ]
    .prop_map(J::Array);
    let leaf = prop_oneof![scalar, array];
    leaf.prop_recursive(4, 32, 6, move |inner| {
        prop::collection::vec((avro_name(), inner), 0..6)
            .prop_map(|members| J::Object(members.into_iter().collect()))
    })
    .prop_flat_map(|v| match v {
        J::Object(_) => Just(v).boxed(),
        other => prop::collection::vec((avro_name(), Just(other)), 1..3)
            .prop_map(|members| J::Object(members.into_iter().collect()))
            .boxed(),
    })
}

proptest! {
    #[test]
    fn encoded_payloads_decode_to_the_document(doc in document()) {
        let text = doc.to_string();
        let (schema, value) = expanded(&text);
        let avro = AvroSchema::from_connect(&schema).unwrap();
        let framed = avro.encode(&value, 9).unwrap();
        prop_assert_eq!(&framed[..5], &[0, 0, 0, 0, 9]);
        let mut datum = &framed[5..];
        let decoded = apache_avro::reader::datum::GenericDatumReader::builder(&avro.parsed)
            .build()
            .unwrap()
            .read_value(&mut datum)
            .unwrap();
        prop_assert!(datum.is_empty(), "bytes left after the datum");
        prop_assert_eq!(as_json(&decoded), doc);
    }

}

/// `depth` objects nested in the payload.
fn nested(depth: usize) -> String {
    format!("{}{{}}{}", "{\"n\":".repeat(depth), "}".repeat(depth))
}

#[test]
fn deep_payloads_up_to_what_jackson_writes() {
    // Each object nests its schema 4 levels deeper: the union, the record, its fields, the
    // field. Payloads this deep take the router's deep-stack thread, as for the JSON writers.
    let deepest = std::thread::Builder::new()
        .stack_size(64 * 1024 * 1024)
        .spawn(|| {
            let fits = |d: usize| {
                let (schema, _) = expanded(&nested(d));
                // The text's depth alone decides: the schema is not built past the limit.
                let mut out = Vec::new();
                SchemaWriter::default().schema(&mut out, &schema).unwrap();
                nesting_depth(&out) <= MAX_WRITE_DEPTH
            };
            // The deepest payload that fits, by bisection.
            let (mut fitting, mut too_deep) = (1, 300);
            while too_deep - fitting > 1 {
                let mid = (fitting + too_deep) / 2;
                if fits(mid) {
                    fitting = mid;
                } else {
                    too_deep = mid;
                }
            }
            let deepest = fitting;
            let (schema, value) = expanded(&nested(deepest));
            let avro = AvroSchema::from_connect(&schema).unwrap();
            assert!(nesting_depth(avro.json().as_bytes()) <= MAX_WRITE_DEPTH);
            assert_eq!(avro.encode(&value, 1).unwrap().len(), 5 + deepest + 1);
            let (schema, _) = expanded(&nested(deepest + 1));
            assert!(matches!(
                AvroSchema::from_connect(&schema),
                Err(AvroError::TooDeep { depth }) if depth > MAX_WRITE_DEPTH
            ));
            deepest
        })
        .unwrap()
        .join()
        .unwrap();
    assert!(deepest >= 240, "{deepest}");
}

#[test]
fn payloads_the_router_expands_in_place_fit_the_default_stack() {
    // The router expands payloads nesting up to 64 levels on the calling thread.
    let (schema, value) = expanded(&nested(63));
    let avro = AvroSchema::from_connect(&schema).unwrap();
    assert_eq!(avro.encode(&value, 1).unwrap().len(), 5 + 63 + 1);
}
