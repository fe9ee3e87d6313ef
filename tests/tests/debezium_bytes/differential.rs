//! Differential test: a generated corpus of hostile outbox rows through a real Debezium
//! (embedded engine, PostgreSQL connector, outbox Event Router, Kafka Connect converters)
//! and through Siphon, compared byte for byte (see `siphon_tests::differential`).
//!
//! The corpus holds rows at and just past the read limits of the JSON parser Debezium expands
//! payloads with (Jackson's default `StreamReadConstraints`): numbers and member names in the
//! corpus table, strings of 20 MB in a table of their own read by one variant.
//!
//! The small corpus runs with every test run. The large one runs with
//! `SIPHON_DIFFERENTIAL_ROWS=<n>` (e.g. 5000); `SIPHON_DIFFERENTIAL_SEED` picks another
//! corpus. `SIPHON_ORACLE_JAVA=/usr/lib/jvm/java-17-openjdk-amd64/bin/java
//! SIPHON_ORACLE_JAVA_VERSION=17` runs the oracle on Java 17 and Siphon with
//! `format.java_version = 17`. Without a JDK (`java` and `javac` on `PATH` or in `JAVA_HOME`) the test is skipped
//! with a message; `scripts/install-deps.sh` installs one.

use anyhow::Result;
use siphon_tests::corpus;
use siphon_tests::differential::{self, Suite, Variant};
use siphon_tests::oracle::Converter;

/// Rows in the corpus that runs by default.
const SMALL_CORPUS: usize = 300;

fn variants() -> Vec<Variant> {
    let headers = (
        "table.fields.additional.placement",
        "type:header:eventType,tenant:header",
    );
    vec![
        Variant {
            name: "plain",
            key: Converter::Json,
            value: Converter::Json,
            router: vec![headers, ("table.field.event.timestamp", "created_at")],
        },
        Variant {
            name: "strings",
            key: Converter::String,
            value: Converter::String,
            router: vec![headers],
        },
        Variant {
            name: "schemas",
            key: Converter::JsonSchemas,
            value: Converter::JsonSchemas,
            router: vec![(
                "table.fields.additional.placement",
                "type:envelope:eventType,tenant:envelope,tenant:header",
            )],
        },
        Variant {
            name: "keyfield",
            key: Converter::String,
            value: Converter::JsonSchemas,
            router: vec![
                ("table.field.event.key", "type"),
                ("extended.headers.enabled", "false"),
                ("route.tombstone.on.empty.payload", "true"),
                (
                    "table.fields.additional.placement",
                    "tenant:header:t,type:envelope:kind",
                ),
            ],
        },
        Variant {
            name: "regex",
            key: Converter::Json,
            value: Converter::String,
            router: vec![
                ("route.topic.regex", "(?<routedByValue>[A-Z])(.*)"),
                ("route.tombstone.on.empty.payload", "true"),
            ],
        },
        Variant {
            name: "partition",
            key: Converter::Json,
            value: Converter::Json,
            router: vec![(
                "table.fields.additional.placement",
                "part:partition,ver:header",
            )],
        },
        Variant {
            name: "jsonb",
            key: Converter::Json,
            value: Converter::Json,
            router: vec![("table.field.event.payload", "payload_b")],
        },
        Variant {
            name: "expjsonb",
            key: Converter::JsonSchemas,
            value: Converter::JsonSchemas,
            router: vec![
                ("table.field.event.payload", "payload_b"),
                ("table.expand.json.payload", "true"),
            ],
        },
        Variant {
            name: "binary",
            key: Converter::String,
            value: Converter::Binary,
            router: vec![("table.field.event.payload", "payload_bin")],
        },
        Variant {
            name: "bytesschemas",
            key: Converter::Json,
            value: Converter::JsonSchemas,
            router: vec![
                ("table.field.event.payload", "payload_bin"),
                ("table.fields.additional.placement", "tenant:envelope"),
            ],
        },
        Variant {
            name: "versioned",
            key: Converter::Json,
            value: Converter::JsonSchemas,
            router: vec![
                ("table.expand.json.payload", "true"),
                ("table.field.event.schema.version", "ver"),
                (
                    "table.fields.additional.placement",
                    "type:envelope:eventType",
                ),
            ],
        },
        Variant {
            name: "floats",
            key: Converter::Json,
            value: Converter::JsonSchemas,
            router: vec![(
                "table.fields.additional.placement",
                "score:header,ratio:header,score:envelope,ratio:envelope:r",
            )],
        },
        Variant {
            name: "floatstr",
            key: Converter::String,
            value: Converter::String,
            router: vec![
                ("table.field.event.payload", "score"),
                ("table.fields.additional.placement", "ratio:envelope"),
            ],
        },
        Variant {
            name: "fatalupdates",
            key: Converter::Json,
            value: Converter::Json,
            router: vec![("table.op.invalid.behavior", "fatal")],
        },
        Variant {
            name: "expjson",
            key: Converter::String,
            value: Converter::Json,
            router: vec![("table.expand.json.payload", "true"), headers],
        },
        Variant {
            name: "expschemas",
            key: Converter::Json,
            value: Converter::JsonSchemas,
            router: vec![("table.expand.json.payload", "true")],
        },
        Variant {
            name: "expstring",
            key: Converter::Json,
            value: Converter::String,
            router: vec![("table.expand.json.payload", "true")],
        },
        Variant {
            name: "expnulls",
            key: Converter::Json,
            value: Converter::JsonSchemas,
            router: vec![
                ("table.expand.json.payload", "true"),
                ("table.json.payload.null.behavior", "optional_bytes"),
            ],
        },
        Variant {
            name: "expenvelope",
            key: Converter::Json,
            value: Converter::JsonSchemas,
            router: vec![
                ("table.expand.json.payload", "true"),
                (
                    "table.fields.additional.placement",
                    "type:envelope:eventType",
                ),
            ],
        },
    ]
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn siphon_writes_what_debezium_writes() -> Result<()> {
    let seed = env_number("SIPHON_DIFFERENTIAL_SEED").unwrap_or(20_240_501);
    let count = env_number("SIPHON_DIFFERENTIAL_ROWS").map_or(SMALL_CORPUS, |n| n as usize);
    let mut rows = corpus::generate(seed, count, true);
    rows.extend(corpus::read_limit_rows());
    let large = corpus::string_limit_rows();
    let suites = [
        // First: the oracle runs four connectors at a time, in this order, and this one takes
        // longest.
        Suite {
            table: "outbox_large",
            rows: &large,
            variants: vec![Variant {
                name: "explarge",
                key: Converter::Json,
                value: Converter::JsonSchemas,
                router: vec![("table.expand.json.payload", "true")],
            }],
            max_record_bytes: Some(32 << 20),
            // Only `payload` is read: 20 MB less to carry per row.
            payload_copies: false,
        },
        Suite {
            table: "outbox",
            rows: &rows,
            variants: variants(),
            max_record_bytes: None,
            payload_copies: true,
        },
    ];
    let Some(report) = differential::run(&suites).await? else {
        return siphon_tests::prerequisite_missing(
            "siphon_writes_what_debezium_writes",
            "no JDK found (java and javac on PATH or in JAVA_HOME); scripts/install-deps.sh installs one",
        );
    };
    let summary = report.summary(3);
    eprintln!("differential (seed {seed}): {summary}");
    assert!(report.differences.is_empty(), "{summary}");
    Ok(())
}
