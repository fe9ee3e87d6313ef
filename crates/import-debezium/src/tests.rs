//! The conversion as a whole, on the realistic fixture and on small connector configurations;
//! also the helpers the sections' own tests use.
//!
//! That the output passes `siphon check-config` (the pipeline's settings build from it) is the
//! binary's check, so the binary tests it: `crates/siphon/tests/import_debezium.rs`.

use std::collections::BTreeMap;

use super::*;
use siphon_config::{Config, EncodingName};

const FIXTURE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/debezium/outbox-connector.json"
));

/// Parses the imported TOML as Siphon does.
pub(super) fn parse(import: &Import) -> Config {
    let doc: toml::Table = import
        .toml
        .parse()
        .unwrap_or_else(|e| panic!("not TOML: {e}\n{}", import.toml));
    Config::from_table(doc)
        .unwrap_or_else(|e| panic!("not a Siphon configuration: {e:#}\n{}", import.toml))
}

pub(super) fn router(config: &Config) -> BTreeMap<String, String> {
    siphon_config::option_strings(&config.router, "router").unwrap()
}

pub(super) fn note_with<'a>(import: &'a Import, needles: &[&str]) -> &'a str {
    import
        .notes
        .iter()
        .find(|n| needles.iter().all(|needle| n.contains(needle)))
        .unwrap_or_else(|| panic!("no note with {needles:?} in {:#?}", import.notes))
}

/// A minimal connector with an outbox router, plus `extra` entries.
pub(super) fn minimal(extra: &str) -> String {
    format!(
        r#"{{
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "database.hostname": "db", "database.user": "app", "database.dbname": "shop",
            "plugin.name": "pgoutput", "table.include.list": "public.outbox",
            "transforms": "outbox",
            "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter"
            {extra}
        }}"#
    )
}

#[test]
fn the_fixture_converts_into_a_valid_configuration() {
    let import = import_debezium(FIXTURE).unwrap();
    let c = parse(&import);
    assert_eq!(
        c.source.url,
        "postgres://orders_cdc@orders-db.internal:5432/orders"
    );
    assert_eq!(c.source.slot, "orders_outbox");
    assert_eq!(c.source.publication, "orders_outbox_pub");
    assert_eq!(c.source.tables, vec!["public.outbox".to_owned()]);
    assert_eq!(c.kafka.bootstrap_servers, BOOTSTRAP_PLACEHOLDER);
    let props = siphon_config::option_strings(&c.kafka.properties, "p").unwrap();
    assert_eq!(props["compression.type"], "zstd");
    assert_eq!(props["linger.ms"], "20");
    assert_eq!(props["message.max.bytes"], "2097152");
    assert!(c.kafka.topic_creation.enabled);
    assert_eq!(c.kafka.topic_creation.partitions, 6);
    assert_eq!(c.kafka.topic_creation.replication_factor, 3);
    let r = router(&c);
    assert_eq!(r["route.by.field"], "aggregate_type");
    assert_eq!(r["table.field.event.key"], "aggregate_id");
    assert_eq!(r["route.topic.replacement"], "${routedByValue}.events");
    assert_eq!(
        r["table.fields.additional.placement"],
        "type:header:eventType"
    );
    assert_eq!(r["table.expand.json.payload"], "true");
    assert!(!r.contains_key("type") && !r.contains_key("predicate"));
    assert_eq!(r["topic.prefix"], "orders");
    assert_eq!(c.format.key, EncodingName::String);
    assert_eq!(c.format.value, EncodingName::Json);
    assert!(import.toml.starts_with(
        "# Siphon configuration imported from the Debezium connector \"orders-outbox\""
    ));
}

#[test]
fn the_fixture_notes_explain_what_does_not_carry_over() {
    let import = import_debezium(FIXTURE).unwrap();
    let password = note_with(&import, &["password", "SIPHON_SOURCE_URL"]);
    assert!(password.contains("file config provider"), "{password}");
    assert!(password.contains("/secrets.properties"), "{password}");
    note_with(&import, &["bootstrap", BOOTSTRAP_PLACEHOLDER]);
    let predicate = note_with(&import, &["predicate `isOutbox`"]);
    assert!(predicate.contains("orders.public.outbox"), "{predicate}");
    assert!(
        predicate.contains("the same records are routed"),
        "{predicate}"
    );
    note_with(&import, &["snapshot.mode", "no snapshot"]);
    note_with(&import, &["heartbeat.interval.ms"]);
    note_with(&import, &["tombstones.on.delete", "ignores deletes"]);
    note_with(&import, &["database.sslmode", "TLS"]);
    note_with(&import, &["topic.prefix", "extended.headers.enabled"]);
    note_with(
        &import,
        &["producer.override.buffer.memory", "max_in_flight_bytes"],
    );
    note_with(
        &import,
        &["topic.creation.default.cleanup.policy", "create the topics"],
    );
}

#[test]
fn the_bare_config_map_is_accepted_and_named_defaults_apply() {
    let import = import_debezium(&minimal("")).unwrap();
    let c = parse(&import);
    assert_eq!(c.source.url, "postgres://app@db:5432/shop");
    assert_eq!(c.source.slot, "debezium");
    assert_eq!(c.source.publication, "dbz_publication");
    assert!(c.router.is_empty());
    assert!(import.toml.contains("a Debezium connector configuration"));
    note_with(&import, &["all_tables", "Debezium's default"]);
    note_with(&import, &["value.converter", "not set"]);
}

#[test]
fn numbers_and_booleans_are_taken_as_kafka_connect_takes_them() {
    let import = import_debezium(&minimal(
        r#", "database.port": 6543, "slot.drop.on.stop": false,
           "topic.creation.default.partitions": 12,
           "topic.creation.default.replication.factor": -1,
           "status.update.interval.ms": 500,
           "transforms.outbox.table.expand.json.payload": true,
           "producer.override.linger.ms": 10,
           "key.converter": "org.apache.kafka.connect.json.JsonConverter",
           "key.converter.schemas.enable": false"#,
    ))
    .unwrap();
    let c = parse(&import);
    assert_eq!(c.source.url, "postgres://app@db:6543/shop");
    assert_eq!(c.source.status_interval_ms, 500);
    assert_eq!(c.kafka.topic_creation.partitions, 12);
    assert_eq!(c.kafka.topic_creation.replication_factor, -1);
    assert_eq!(router(&c)["table.expand.json.payload"], "true");
    assert_eq!(
        siphon_config::option_strings(&c.kafka.properties, "p").unwrap()["linger.ms"],
        "10"
    );
    assert_eq!(c.format.key, EncodingName::Json);
    assert!(
        !import.notes.iter().any(|n| n.contains("slot.drop.on.stop")),
        "{:#?}",
        import.notes
    );
}

/// A number Siphon's key does not accept is left out with a note naming the range, so the
/// converted file still passes `check-config`.
#[test]
fn numbers_out_of_siphons_range_are_noted_not_carried_over() {
    let import = import_debezium(&minimal(
        r#", "status.update.interval.ms": 0,
           "topic.creation.default.partitions": 0"#,
    ))
    .unwrap();
    let c = parse(&import);
    assert_eq!(c.source.status_interval_ms, 1000);
    assert_eq!(c.kafka.topic_creation.partitions, -1);
    note_with(
        &import,
        &["status.update.interval.ms", "it must be 10 to 3600000"],
    );
    note_with(
        &import,
        &[
            "topic.creation.default.partitions",
            "-1 (the broker's default) or 1 to 100000",
        ],
    );
}

#[test]
fn other_connectors_and_configurations_without_an_event_router_are_errors() {
    let mysql = r#"{"name": "m", "config": {"connector.class": "io.debezium.connector.mysql.MySqlConnector"}}"#;
    let err = import_debezium(mysql).unwrap_err();
    assert!(
        matches!(&err, ImportError::NotPostgres { found } if found.ends_with("MySqlConnector"))
    );
    assert!(err.to_string().contains(POSTGRES_CONNECTOR), "{err}");

    let err = import_debezium(r#"{"name": "x", "config": {"topic.prefix": "a"}}"#).unwrap_err();
    assert!(matches!(err, ImportError::MissingConnectorClass), "{err}");

    let unwrap_only = minimal("").replace(
        "io.debezium.transforms.outbox.EventRouter",
        "io.debezium.transforms.ExtractNewRecordState",
    );
    let err = import_debezium(&unwrap_only).unwrap_err();
    assert!(matches!(err, ImportError::NoEventRouter { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("outbox (io.debezium.transforms.ExtractNewRecordState)"),
        "{err}"
    );

    let no_transforms =
        r#"{"connector.class": "io.debezium.connector.postgresql.PostgresConnector"}"#;
    let err = import_debezium(no_transforms).unwrap_err();
    assert!(err.to_string().contains("no transforms"), "{err}");

    assert!(matches!(
        import_debezium("{"),
        Err(ImportError::InvalidJson(_))
    ));
    assert!(matches!(
        import_debezium("[1]"),
        Err(ImportError::NotAnObject)
    ));
}

#[test]
fn table_regexes_and_unsupported_transforms_and_converters_are_noted() {
    let import = import_debezium(&minimal(
        r#", "table.include.list": "app\\.outbox, public.outbox_.*",
           "transforms": "unwrap,outbox,route",
           "transforms.route.type": "io.debezium.transforms.ByLogicalTableRouter",
           "transforms.route.topic.regex": "(.*)",
           "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
           "transforms.unwrap.predicate": "isOutbox",
           "transforms.unwrap.negate": "true",
           "topic.prefix": "shop",
           "predicates": "isOutbox",
           "predicates.isOutbox.type": "org.apache.kafka.connect.transforms.predicates.TopicNameMatches",
           "predicates.isOutbox.pattern": "shop\\.app\\.outbox",
           "value.converter": "io.confluent.connect.avro.AvroConverter",
           "value.converter.schema.registry.url": "http://registry:8081",
           "database.password": "${env:PGPASSWORD}",
           "snapshot.mode": "never",
           "some.future.option": "x""#,
    ))
    .unwrap();
    let c = parse(&import);
    assert_eq!(c.source.tables, vec!["app.outbox".to_owned()]);
    assert_eq!(c.format.value, EncodingName::Avro);
    assert_eq!(c.schema_registry.url, "http://registry:8081");
    note_with(&import, &["public.outbox_.*", "regular expression"]);
    note_with(&import, &["`route`", "ByLogicalTableRouter", "after"]);
    note_with(&import, &["`unwrap`", "never touched the outbox events"]);
    note_with(&import, &["env config provider", "PGPASSWORD"]);
    note_with(&import, &["some.future.option", "not carried over"]);
    assert!(
        !import
            .notes
            .iter()
            .any(|n| n.contains("predicate not used")),
        "{:#?}",
        import.notes
    );
}
