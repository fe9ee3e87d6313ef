//! Turns the configuration into the pieces the pipeline runs with; logging and signals.
//!
//! # Invariants
//! - Everything that can be checked without connecting is checked here, before any connection.

use crate::config::{
    option_strings, CloudEventsModeName, Config, DeliveryMode, EncodingName, LogFormat,
    NonTransactional, OnError, SchemaSource, SinkKind, SubjectNameStrategy,
};
use crate::dead_letter::DeadLetters;
use crate::session::{ErrorPolicy, ExactlyOnce, NonTransactionalPolicy, PipelineSettings, Routers};
use anyhow::Context;
use siphon_kafka_sink::{ProgressTopic, SinkConfig, StateTopic, TopicCreation};
use siphon_record::registered::SubjectStrategy;
use siphon_record::RegistrySchemaKind;
use siphon_router::{
    default_cloudevents_source, CloudEventsMode, CloudEventsOptions, Encoding, EventExtensions,
    EventRouter, Format, JavaNumbers, OwnTopicRole, OwnTopics, RouterContext, RouterOptions,
    TraceOptions,
};
use siphon_schema_registry::{BasicAuth, RegistryConfig};
use siphon_source::{SourceConfig, TableName};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tokio::sync::watch;
use tracing::info;

/// The most bytes of undecoded messages read from the replication stream ahead of the
/// in-flight window (the window's size when that is smaller). Records wait in the window, so
/// a large window needs no more read ahead: 4 MiB is still 4,096 messages of 1 kB (the count
/// limit), and 8 rows of 512 KB. A read-ahead as large as the default 32 MiB window would
/// hold a second window's worth of large rows behind a broker that takes nothing.
pub const READ_AHEAD_MAX_BYTES: usize = 4 * 1024 * 1024;

/// The Debezium encoding; `protobuf` values are written by the router's extension, which
/// replaces the value, so the Debezium side keeps `json` (it accepts every payload column).
fn encoding(name: EncodingName) -> Encoding {
    match name {
        EncodingName::Json | EncodingName::Protobuf => Encoding::Json,
        EncodingName::String => Encoding::String,
        EncodingName::JsonSchemas => Encoding::JsonSchemas,
        EncodingName::Binary => Encoding::Binary,
        EncodingName::Avro => Encoding::Avro,
        EncodingName::JsonSr => Encoding::Registered(RegistrySchemaKind::Json),
    }
}

/// The value encoding: `avro` is written with registered schemas under
/// `schema_registry.schemas = "registered"`.
fn value_encoding(config: &Config) -> Encoding {
    match (config.format.value, config.schema_registry.schemas) {
        (EncodingName::Avro, SchemaSource::Registered) => {
            Encoding::Registered(RegistrySchemaKind::Avro)
        }
        (name, _) => encoding(name),
    }
}

/// Whether values are written with the schemas registered for them (not derived): with
/// `schema_registry.schemas = "registered"`, and always with `json-sr`.
fn writes_registered_schemas(config: &Config) -> bool {
    config.schema_registry.schemas == SchemaSource::Registered
        || config.format.value == EncodingName::JsonSr
}

/// `schema_registry.versions`: the subjects written with a version of their own.
fn pinned_versions(config: &Config) -> anyhow::Result<HashMap<String, i32>> {
    let section = &config.schema_registry;
    if !section.versions.is_empty() && !writes_registered_schemas(config) {
        anyhow::bail!("schema_registry.versions pins the schemas payloads are written with, which needs schemas = \"registered\"; remove it, or set schema_registry.schemas = \"registered\"");
    }
    section
        .versions
        .iter()
        .map(|(subject, version)| match i32::try_from(*version) {
            Ok(v) if v >= 1 => Ok((subject.clone(), v)),
            _ => anyhow::bail!("schema_registry.versions.\"{subject}\" = {version}: a version is 1 or more (the registry numbers a subject's versions from 1)"),
        })
        .collect()
}

/// How value subjects are named.
fn subject_strategy(config: &Config) -> SubjectStrategy {
    match config.schema_registry.subject_name_strategy {
        SubjectNameStrategy::Topic => SubjectStrategy::Topic,
        SubjectNameStrategy::TopicRecord => SubjectStrategy::TopicRecord,
        SubjectNameStrategy::Record => SubjectStrategy::Record,
    }
}

/// The schema registry client's settings (`[schema_registry]`): `None` without a URL. The
/// `avro` formats and `json-sr` need one; a registry no format uses is refused as a mistake.
pub fn registry_config(config: &Config) -> anyhow::Result<Option<RegistryConfig>> {
    let section = &config.schema_registry;
    let needed = matches!(
        config.format.value,
        EncodingName::Avro | EncodingName::JsonSr
    ) || config.format.key == EncodingName::Avro;
    if section.url.trim().is_empty() {
        if needed {
            anyhow::bail!("format.key = \"avro\", format.value = \"avro\" and \"json-sr\" take their schemas from a schema registry: set schema_registry.url (e.g. \"http://127.0.0.1:8081\"; Apicurio: \".../apis/ccompat/v7\")");
        }
        return Ok(None);
    }
    if !needed {
        anyhow::bail!("schema_registry.url is set but no format uses the registry; set format.value = \"avro\" or \"json-sr\" (or format.key = \"avro\"), or remove the [schema_registry] section");
    }
    if section.subject_name_strategy != SubjectNameStrategy::Topic
        && !writes_registered_schemas(config)
    {
        anyhow::bail!("schema_registry.subject_name_strategy names value subjects by event type, which needs the schemas registered for them: set schema_registry.schemas = \"registered\", or subject_name_strategy = \"topic\" (derived schemas are registered under <topic>-value)");
    }
    if config.format.value == EncodingName::JsonSr && section.schemas != SchemaSource::Registered {
        anyhow::bail!("format.value = \"json-sr\" writes each payload with the JSON Schema registered for it: set schema_registry.schemas = \"registered\" (JSON Schemas are not derived from payloads)");
    }
    let path = |value: &str| (!value.is_empty()).then(|| std::path::PathBuf::from(value));
    let mut registry = RegistryConfig::new(section.url.trim());
    if !section.username.is_empty() {
        registry.basic_auth = Some(BasicAuth {
            username: section.username.clone(),
            password: section.password.clone(),
        });
    } else if !section.password.is_empty() {
        anyhow::bail!("schema_registry.password is set without schema_registry.username; set both for basic auth, or neither");
    }
    registry.tls.ca_location = path(&section.ssl_ca_location);
    registry.tls.certificate_location = path(&section.ssl_certificate_location);
    registry.tls.key_location = path(&section.ssl_key_location);
    if registry.tls.certificate_location.is_some() != registry.tls.key_location.is_some() {
        anyhow::bail!("schema_registry.ssl_certificate_location and schema_registry.ssl_key_location go together: set both for a client certificate, or neither");
    }
    registry.request_timeout = Duration::from_millis(section.request_timeout_ms);
    registry.latest_ttl = Some(Duration::from_secs(section.latest_ttl_secs));
    Ok(Some(registry))
}

/// The router option naming the event type column, which Debezium declares but never reads.
const EVENT_TYPE_OPTION: &str = "table.field.event.type";

/// The formats beyond Debezium's (`format.value = "protobuf"`, `[cloudevents]`, `[trace]`),
/// taking the event type column out of `router` when they read it.
fn build_extensions(
    config: &Config,
    router_options: &mut std::collections::BTreeMap<String, String>,
) -> anyhow::Result<EventExtensions> {
    if config.format.key == EncodingName::Protobuf {
        anyhow::bail!("format.key = \"protobuf\" is not supported: the protobuf message is the whole event and is written as the value; keep the key json, json-schemas, string or binary");
    }
    let protobuf_value = config.format.value == EncodingName::Protobuf;
    let cloudevents = match config.cloudevents.mode {
        CloudEventsModeName::Off => None,
        mode => Some(CloudEventsOptions {
            mode: if mode == CloudEventsModeName::Binary {
                CloudEventsMode::Binary
            } else {
                CloudEventsMode::Structured
            },
            source: if config.cloudevents.source.is_empty() {
                let database =
                    siphon_source::ConnectionParams::from_url(&config.source.url)?.database;
                default_cloudevents_source(&database, &config.source.slot)
            } else {
                config.cloudevents.source.clone()
            },
        }),
    };
    if config.cloudevents.mode == CloudEventsModeName::Off && !config.cloudevents.source.is_empty()
    {
        anyhow::bail!("cloudevents.source is set but cloudevents.mode is \"off\"; set cloudevents.mode = \"binary\" or \"structured\", or remove cloudevents.source");
    }
    let trace = match (config.trace.column.as_str(), config.trace.state_column.as_str()) {
        ("", "") => None,
        ("", _) => anyhow::bail!("trace.state_column is set but trace.column is not; name the traceparent column in trace.column"),
        (column, state) => Some(TraceOptions {
            column: column.to_owned(),
            state_column: (!state.is_empty()).then(|| state.to_owned()),
        }),
    };
    let registry_record_names = subject_strategy(config).needs_record_name();
    let mut extensions = EventExtensions {
        protobuf_value,
        cloudevents,
        trace,
        registry_record_names,
        ..EventExtensions::default()
    };
    // Debezium ignores the event type option (the router warns about it); these formats read it.
    if protobuf_value || extensions.cloudevents.is_some() || registry_record_names {
        if let Some(column) = router_options.remove(EVENT_TYPE_OPTION) {
            extensions.event_type_column = column.trim().to_owned();
        }
    }
    Ok(extensions)
}

/// A random id for this run (`__debezium.context.runId`), formatted as a version-4 UUID.
fn run_id() -> String {
    let bits: u128 = rand::random();
    let bits = (bits & !(0xF << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let hex = format!("{bits:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Siphon's own topics as configured, which no outbox row may be routed to (the progress topic
/// even with at-least-once delivery: another source may share it).
fn own_topics(config: &Config) -> OwnTopics {
    OwnTopics::new([
        (
            config.kafka.progress_topic.trim().to_owned(),
            OwnTopicRole::Progress,
        ),
        (
            config.kafka.state_topic.trim().to_owned(),
            OwnTopicRole::State,
        ),
        (
            config.pipeline.dead_letter_topic.clone(),
            OwnTopicRole::DeadLetter,
        ),
    ])
}

/// One router from `options`: with Debezium's context headers when `topic.prefix` (the logical
/// name they carry) is set or `extended.headers.enabled` is explicitly true, as in Debezium 3.2+.
fn build_router(
    config: &Config,
    options: &BTreeMap<String, toml::Value>,
    section: &str,
    run_id: &str,
) -> anyhow::Result<EventRouter> {
    let mut map = option_strings(options, section)?;
    let extensions = build_extensions(config, &mut map)?;
    let options = RouterOptions::from_map(&map).with_context(|| format!("[{section}]"))?;
    for warning in options.warnings() {
        tracing::warn!("[{section}] {warning}");
    }
    if matches!(value_encoding(config), Encoding::Registered(_)) && options.expand_json_payload() {
        anyhow::bail!("[{section}] \"table.expand.json.payload\" = true has no effect with schema_registry.schemas = \"registered\": the payload's JSON is written with the schema registered for it; remove the option, or use schemas = \"derived\"");
    }
    let format = Format {
        key: encoding(config.format.key),
        value: value_encoding(config),
        numbers: if config.format.java_version >= 19 {
            JavaNumbers::Java19
        } else {
            JavaNumbers::Java17
        },
    };
    let wants_context = map.contains_key("topic.prefix")
        || map
            .get("extended.headers.enabled")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let router = if wants_context {
        EventRouter::new_with_context(
            options,
            format,
            RouterContext::postgresql(run_id.to_owned()),
        )
        .with_context(|| format!("[{section}]"))?
    } else {
        EventRouter::new(options, format)
    };
    Ok(router
        .with_own_topics(own_topics(config))
        .with_extensions(extensions)?)
}

/// The routers: `[router]`, and for each `[router.tables."schema.table"]` its options on top of
/// `[router]` (the table must be one of `source.tables`).
fn build_routers(config: &Config, tables: &[TableName]) -> anyhow::Result<Routers> {
    let mut base = config.router.clone();
    let per_table = match base.remove("tables") {
        None => toml::Table::new(),
        Some(toml::Value::Table(t)) => t,
        Some(_) => anyhow::bail!(
            "router.tables must hold one table of options per outbox table, e.g. [router.tables.\"billing.outbox\"]"
        ),
    };
    let run_id = run_id();
    let default = build_router(config, &base, "router", &run_id)?;
    let mut by_table = HashMap::new();
    for (name, overrides) in per_table {
        let section = format!("router.tables.\"{name}\"");
        let toml::Value::Table(overrides) = overrides else {
            anyhow::bail!("[{section}] must be a table of router options");
        };
        let table = TableName::parse(&name).with_context(|| format!("[{section}]"))?;
        if !tables.contains(&table) {
            anyhow::bail!("[{section}] names a table that is not in source.tables; add it there or remove the section");
        }
        let mut merged = base.clone();
        merged.extend(overrides);
        by_table.insert(table, build_router(config, &merged, &section, &run_id)?);
    }
    Ok(Routers::new(default, by_table))
}

/// Builds the pipeline settings, checking every option.
pub fn build(config: &Config) -> anyhow::Result<PipelineSettings> {
    let tables = config
        .source
        .tables
        .iter()
        .map(|t| TableName::parse(t).map_err(anyhow::Error::from))
        .collect::<anyhow::Result<Vec<_>>>()
        .context("source.tables")?;
    siphon_source::ConnectionParams::from_url(&config.source.url)?;
    let source = SourceConfig {
        url: config.source.url.clone(),
        slot: config.source.slot.clone(),
        publication: config.source.publication.clone(),
        tables,
        status_interval: Duration::from_millis(config.source.status_interval_ms),
        idle_wakeup_interval: Duration::from_secs(10),
        // Read-ahead of the replication stream: at most one more in-flight window of bytes,
        // and at most READ_AHEAD_MAX_BYTES.
        read_ahead_bytes: config
            .pipeline
            .max_in_flight_bytes
            .min(READ_AHEAD_MAX_BYTES),
        application_name: config.source.application_name.clone(),
        failover: config.source.failover,
    };
    let router = build_routers(config, &source.tables)?;
    let sink = SinkConfig {
        bootstrap_servers: config.kafka.bootstrap_servers.clone(),
        properties: option_strings(&config.kafka.properties, "kafka.properties")?,
        topic_creation: TopicCreation {
            enabled: config.kafka.topic_creation.enabled,
            partitions: config.kafka.topic_creation.partitions,
            replication_factor: config.kafka.topic_creation.replication_factor,
        },
        discard: config.kafka.sink == SinkKind::Discard,
        transactional_id: None,
    };
    sink.client_properties()?;
    let exactly_once = exactly_once(config, &sink)?;
    // Exactly-once: librdkafka times records out within the transaction's timeout, and a
    // record that fails aborts the transaction (the session's own deadline is not needed).
    let delivery_timeout = match exactly_once {
        Some(_) => None,
        None => sink.delivery_timeout()?,
    };
    let on_error = match config.pipeline.on_error {
        OnError::Fail => ErrorPolicy::Fail,
        OnError::DeadLetter => ErrorPolicy::DeadLetter(DeadLetters::new(
            config.pipeline.dead_letter_topic.clone(),
            producer_max_bytes(&sink)?,
        )),
    };
    let state_topic = state_topic(config, &sink)?;
    let snapshot = crate::snapshot::Plan::from_config(config, &source.tables)?;
    let pinned = pinned_versions(config)?;
    let registry = registry_config(config)?
        .map(|c| {
            crate::registry::SchemaIds::new(&c, writes_registered_schemas(config))
                .map(|ids| ids.with_pinned(pinned))
        })
        .transpose()
        .context("[schema_registry]")?;
    if config.format.key == EncodingName::JsonSr {
        anyhow::bail!("format.key = \"json-sr\" is not supported: json-sr writes payloads with the JSON Schemas registered for them; write keys avro, json, json-schemas, string or binary");
    }
    Ok(PipelineSettings {
        registry,
        subject_strategy: subject_strategy(config),
        source,
        sink,
        router,
        message_prefixes: config.source.message_prefixes.iter().cloned().collect(),
        non_transactional: match config.source.non_transactional_messages {
            NonTransactional::Error => NonTransactionalPolicy::Error,
            NonTransactional::Skip => NonTransactionalPolicy::Skip,
        },
        on_error,
        stall_timeout: Duration::from_secs(config.source.stall_timeout_secs),
        max_in_flight_records: config.pipeline.max_in_flight_records,
        max_in_flight_bytes: config.pipeline.max_in_flight_bytes,
        shutdown_timeout: Duration::from_secs(config.pipeline.shutdown_timeout_secs),
        delivery_timeout,
        state_topic,
        position_headers: config
            .format
            .position_headers
            .enabled(config.kafka.delivery),
        intervals: siphon_core::Intervals::default(),
        exactly_once,
        snapshot,
    })
}

/// Exactly-once delivery's settings (`kafka.delivery = "exactly-once"`), `None` for
/// at-least-once.
fn exactly_once(config: &Config, sink: &SinkConfig) -> anyhow::Result<Option<ExactlyOnce>> {
    if config.kafka.delivery != DeliveryMode::ExactlyOnce {
        return Ok(None);
    }
    if sink.discard {
        anyhow::bail!("kafka.delivery = \"exactly-once\" needs a broker: it cannot be combined with kafka.sink = \"discard\"");
    }
    let progress = config.kafka.progress_topic.trim();
    if progress.is_empty() {
        anyhow::bail!("kafka.progress_topic is \"\": exactly-once delivery commits its progress there; name a topic (default \"siphon.progress\")");
    }
    let transaction_timeout = sink.transaction_timeout()?;
    let interval = Duration::from_millis(config.kafka.transaction_interval_ms);
    // A transaction may grow to SPLIT_FACTOR times its interval before the broker times it out.
    if interval * siphon_core::exactly_once::SPLIT_FACTOR * 2 > transaction_timeout {
        anyhow::bail!(
            "kafka.transaction_interval_ms = {} is too close to the transaction timeout ({} ms): keep it at most an eighth of kafka.properties.\"transaction.timeout.ms\"",
            config.kafka.transaction_interval_ms,
            transaction_timeout.as_millis()
        );
    }
    let id = config.kafka.transactional_id.trim();
    Ok(Some(ExactlyOnce {
        transactional_id: (!id.is_empty()).then(|| id.to_owned()),
        progress_topic: ProgressTopic::new(
            progress,
            &sink.client_properties()?,
            sink.topic_creation.clone(),
        ),
        bounds: siphon_core::exactly_once::TransactionBounds {
            max_age: interval,
            max_bytes: config.kafka.transaction_max_bytes,
        },
    }))
}

/// The state topic (`kafka.state_topic`): none when it is set to "" or records are discarded.
pub fn state_topic(config: &Config, sink: &SinkConfig) -> anyhow::Result<Option<StateTopic>> {
    let topic = config.kafka.state_topic.trim();
    if topic.is_empty() || sink.discard {
        return Ok(None);
    }
    Ok(Some(StateTopic::new(
        topic,
        &sink.client_properties()?,
        sink.topic_creation.clone(),
    )))
}

/// The producer's `message.max.bytes` (librdkafka's default when unset).
fn producer_max_bytes(sink: &SinkConfig) -> anyhow::Result<usize> {
    match sink.properties.get("message.max.bytes") {
        None => Ok(1_000_000),
        Some(v) => v.parse().with_context(|| {
            format!("kafka.properties.\"message.max.bytes\" = {v:?} is not a number of bytes")
        }),
    }
}

/// Logs to stderr, human-readable or JSON; levels from `RUST_LOG` (default `info`).
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Sets `stop` on the first SIGTERM or SIGINT.
pub async fn forward_signals(stop: std::sync::Arc<watch::Sender<bool>>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!(
            "cannot install signal handlers; stop Siphon with SIGKILL (it resumes safely)"
        );
        return;
    };
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    info!(signal = name, "stop requested");
    let _ = stop.send(true);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        let text = format!(
            "[source]\nurl = \"postgres://siphon@127.0.0.1:5432/app db\"\nslot = \"s1\"\n[kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n{extra}"
        );
        Config::from_table(text.parse().expect("toml")).expect("valid configuration")
    }

    fn router_of(c: &Config) -> anyhow::Result<EventRouter> {
        build_router(c, &c.router, "router", "run")
    }

    fn tables(names: &[&str]) -> Vec<TableName> {
        names
            .iter()
            .map(|n| TableName::parse(n).expect("name"))
            .collect()
    }

    #[test]
    fn pinned_versions_need_registered_schemas_and_a_version_of_1_or_more() {
        let registry =
            "[format]\nvalue = \"avro\"\n[schema_registry]\nurl = \"http://127.0.0.1:8081\"\n";
        let pin = "[schema_registry.versions]\n\"orders-value\" = 3\n";
        let err = build(&config(&format!("{registry}{pin}")))
            .err()
            .expect("derived schemas are not pinned");
        assert!(format!("{err:#}").contains("registered"), "{err:#}");
        let registered = format!("{registry}schemas = \"registered\"\n");
        let settings = build(&config(&format!("{registered}{pin}"))).expect("valid");
        let ids = settings.registry.expect("a registry");
        assert_eq!(ids.pinned().get("orders-value"), Some(&3));
        let err = build(&config(&format!(
            "{registered}[schema_registry.versions]\n\"orders-value\" = 0\n"
        )))
        .err()
        .expect("versions start at 1");
        assert!(format!("{err:#}").contains("orders-value"), "{err:#}");
    }

    #[test]
    fn record_name_subjects_need_registered_schemas_and_read_the_event_type() {
        let registry = "[schema_registry]\nurl = \"http://127.0.0.1:8081\"\n";
        let strategy = "subject_name_strategy = \"topic-record\"\n";
        let err = build(&config(&format!(
            "[format]\nvalue = \"avro\"\n{registry}{strategy}"
        )))
        .err()
        .expect("derived schemas are named by topic");
        assert!(format!("{err:#}").contains("registered"), "{err:#}");
        let settings = build(&config(&format!(
            "[format]\nvalue = \"avro\"\n{registry}{strategy}schemas = \"registered\"\n[router]\n\"table.field.event.type\" = \"kind\"\n"
        )))
        .expect("valid");
        assert_eq!(settings.subject_strategy, SubjectStrategy::TopicRecord);
        let extensions = settings.router.default_router().extensions();
        assert!(extensions.registry_record_names);
        assert_eq!(extensions.event_type_column, "kind");
    }

    #[test]
    fn avro_values_need_a_registry_and_a_registry_needs_avro_values() {
        let avro = "[format]\nvalue = \"avro\"\n";
        let registry = "[schema_registry]\nurl = \"http://127.0.0.1:8081\"\n";
        let err = build(&config(avro)).err().expect("no registry");
        assert!(
            format!("{err:#}").contains("schema_registry.url"),
            "{err:#}"
        );
        let err = build(&config(registry)).err().expect("nothing uses it");
        assert!(
            format!("{err:#}").contains("format.value = \"avro\""),
            "{err:#}"
        );
        let settings = build(&config(&format!("{avro}{registry}"))).expect("valid");
        assert!(settings.registry.is_some());
        let settings = build(&config(&format!(
            "[format]\nkey = \"avro\"\nvalue = \"avro\"\n{registry}"
        )))
        .expect("avro keys");
        assert_eq!(
            settings.router.default_router().format().key,
            Encoding::Avro
        );
        let settings = build(&config(&format!("[format]\nkey = \"avro\"\n{registry}")))
            .expect("avro keys beside json values");
        assert!(settings.registry.is_some());
        let err = build(&config("[format]\nkey = \"avro\"\n"))
            .err()
            .expect("avro keys need a registry");
        assert!(
            format!("{err:#}").contains("schema_registry.url"),
            "{err:#}"
        );
        let err = build(&config(&format!(
            "[format]\nkey = \"json-sr\"\nvalue = \"json-sr\"\n{registry}schemas = \"registered\"\n"
        )))
        .err()
        .expect("json-sr keys");
        assert!(format!("{err:#}").contains("format.key"), "{err:#}");
        let err = build(&config(&format!("{avro}{registry}password = \"p\"\n")))
            .err()
            .expect("a password without a user");
        assert!(format!("{err:#}").contains("username"), "{err:#}");
        let err = build(&config(&format!(
            "{avro}[schema_registry]\nurl = \"ftp://registry\"\n"
        )))
        .err()
        .expect("not http");
        assert!(format!("{err:#}").contains("schema_registry"), "{err:#}");
        let err = build(&config(&format!(
            "[format]\nvalue = \"json-sr\"\n{registry}"
        )))
        .err()
        .expect("json-sr needs registered schemas");
        assert!(format!("{err:#}").contains("registered"), "{err:#}");
        let registered = "schemas = \"registered\"\n";
        let settings = build(&config(&format!("{avro}{registry}{registered}"))).expect("valid");
        assert!(settings.registry.as_ref().is_some_and(|r| r.registered()));
        let err = build(&config(&format!(
            "{avro}{registry}{registered}[router]\n\"table.expand.json.payload\" = true\n"
        )))
        .err()
        .expect("expansion has no effect");
        assert!(format!("{err:#}").contains("no effect"), "{err:#}");
        let err = build(&config(&format!(
            "{avro}{registry}[cloudevents]\nmode = \"binary\"\n"
        )))
        .err()
        .expect("cloudevents would replace the value");
        assert!(format!("{err:#}").contains("cloudevents"), "{err:#}");
    }

    #[test]
    fn a_table_section_overrides_the_router_options_for_that_table() {
        let c = config(
            "[router]\n\"route.topic.replacement\" = \"events.${routedByValue}\"\n[router.tables.\"billing.outbox\"]\n\"table.field.event.key\" = \"invoice_id\"\n\"route.by.field\" = \"kind\"\n",
        );
        let routers =
            build_routers(&c, &tables(&["public.outbox", "billing.outbox"])).expect("valid");
        let billing = routers.for_table(&TableName::parse("billing.outbox").expect("name"));
        let public = routers.for_table(&TableName::parse("public.outbox").expect("name"));
        assert_eq!(billing.options().route_by_column(), "kind");
        assert_eq!(public.options().route_by_column(), "aggregatetype");
        assert_eq!(billing.options().event_key_column(), "invoice_id");
        assert_eq!(
            billing.options().topic_replacement(),
            public.options().topic_replacement(),
            "the defaults carry over"
        );
        let err = build_routers(&c, &tables(&["public.outbox"]))
            .err()
            .expect("unknown table");
        assert!(
            format!("{err:#}").contains("not in source.tables"),
            "{err:#}"
        );
    }

    fn error(extra: &str) -> String {
        match router_of(&config(extra)) {
            Ok(_) => panic!("expected an error for {extra}"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn extensions_are_read_from_their_sections() {
        let router = router_of(&config(
            "[router]\n\"table.field.event.type\" = \"kind\"\n[format]\nvalue = \"protobuf\"\n[cloudevents]\nmode = \"binary\"\n[trace]\ncolumn = \"tp\"\nstate_column = \"ts\"\n",
        ))
        .expect("valid");
        let extensions = router.extensions();
        assert!(extensions.protobuf_value);
        assert_eq!(extensions.event_type_column, "kind");
        assert_eq!(
            extensions.cloudevents,
            Some(CloudEventsOptions {
                mode: CloudEventsMode::Binary,
                source: "/siphon/app%20db/s1".to_owned(),
            })
        );
        assert_eq!(
            extensions.trace,
            Some(TraceOptions {
                column: "tp".to_owned(),
                state_column: Some("ts".to_owned()),
            })
        );
        // Without protobuf or CloudEvents the type option stays Debezium's ignored one.
        let plain =
            router_of(&config("[router]\n\"table.field.event.type\" = \"kind\"\n")).expect("valid");
        assert!(!plain.extensions().is_active());
        assert!(plain
            .options()
            .warnings()
            .iter()
            .any(|w| w.contains("table.field.event.type")));
    }

    #[test]
    fn impossible_combinations_name_the_fix() {
        assert!(error("[format]\nkey = \"protobuf\"\n").contains("format.key"));
        assert!(error(
            "[router]\n\"route.tombstone.on.empty.payload\" = true\n[cloudevents]\nmode = \"structured\"\n"
        )
        .contains("cloudevents.mode = \"binary\""));
        assert!(
            error("[cloudevents]\nmode = \"binary\"\nsource = \"has space\"\n")
                .contains("URI-reference")
        );
        assert!(error("[cloudevents]\nsource = \"/x\"\n").contains("cloudevents.mode"));
        assert!(error("[trace]\nstate_column = \"ts\"\n").contains("trace.column"));
        assert!(error("[trace]\ncolumn = \"t\"\nstate_column = \"t\"\n").contains("same column"));
        assert!(error(
            "[router]\n\"table.expand.json.payload\" = true\n[format]\nvalue = \"protobuf\"\n"
        )
        .contains("table.expand.json.payload"));
    }

    #[test]
    fn a_signal_table_keeps_a_share_of_the_window_for_resends_beside_the_stream() {
        let with = |source: &str| {
            let text = format!(
                "[source]\nurl = \"postgres://siphon@127.0.0.1:5432/app\"\nslot = \"s1\"\n{source}[kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n[pipeline]\nmax_in_flight_records = 1000\nmax_in_flight_bytes = 4000\n"
            );
            build(&Config::from_table(text.parse().expect("toml")).expect("valid")).expect("valid")
        };
        let window = |records, bytes| crate::pipeline::Window { records, bytes };
        let plain = with("");
        assert_eq!(plain.stream_window(), window(1000, 4000));
        assert_eq!(plain.transfer_window(false), window(1000, 4000));
        let signals = with("signal_table = \"public.siphon_signal\"\n");
        assert_eq!(signals.stream_window(), window(750, 3000));
        assert_eq!(signals.transfer_window(true), window(250, 1000));
        // `siphon resend` and the initial snapshot run without the stream beside them.
        assert_eq!(signals.transfer_window(false), window(1000, 4000));
    }
}
