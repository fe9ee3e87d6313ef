//! What `siphon import-debezium` writes passes `siphon check-config`: the imported
//! configuration builds the pipeline's settings (`siphon::settings::build`), the check the
//! import crate cannot make itself, as it sits below the binary.
//!
//! The import crate's own tests check that the output parses as a `siphon_config::Config` and
//! what each key becomes; these check only that the binary accepts the result.

use siphon::config::Config;
use siphon_import_debezium::{import_debezium, Import};

const FIXTURE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/debezium/outbox-connector.json"
));

/// A minimal connector with an outbox router, plus `extra` entries.
fn minimal(extra: &str) -> String {
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

/// Parses the imported TOML as Siphon does, then builds the settings as `check-config` does.
fn check_config(import: &Import) -> Config {
    let doc: toml::Table = import
        .toml
        .parse()
        .unwrap_or_else(|e| panic!("not TOML: {e}\n{}", import.toml));
    let config = Config::from_table(doc)
        .unwrap_or_else(|e| panic!("not a Siphon configuration: {e:#}\n{}", import.toml));
    siphon::settings::build(&config).unwrap_or_else(|e| panic!("{e:#}\n{}", import.toml));
    config
}

#[test]
fn the_imported_fixture_passes_check_config() {
    let import = import_debezium(FIXTURE).unwrap();
    let c = check_config(&import);
    assert_eq!(c.source.slot, "orders_outbox");
}

#[test]
fn a_connector_with_supported_router_options_passes_check_config() {
    let import = import_debezium(&minimal(
        r#", "topic.prefix": "shop",
           "transforms.outbox.route.by.field": "kind",
           "transforms.outbox.table.op.invalid.behavior": "fatal",
           "key.converter": "org.apache.kafka.connect.storage.StringConverter",
           "value.converter": "org.apache.kafka.connect.storage.StringConverter""#,
    ))
    .unwrap();
    check_config(&import);
}

#[test]
fn a_legacy_logical_name_passes_check_config() {
    let import = import_debezium(&minimal(r#", "database.server.name": "legacy""#)).unwrap();
    check_config(&import);
}
