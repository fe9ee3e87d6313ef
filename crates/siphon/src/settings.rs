//! Turns the configuration into the pieces the pipeline runs with; logging and signals.
//!
//! # Invariants
//! - Everything that can be checked without connecting is checked here, before any connection.

use crate::config::{option_strings, Config, EncodingName, LogFormat, OnError, SinkKind};
use crate::dead_letter::DeadLetters;
use crate::pipeline::{ErrorPolicy, PipelineSettings};
use anyhow::Context;
use siphon_kafka_sink::{SinkConfig, TopicCreation};
use siphon_router::{Encoding, EventRouter, Format, JavaNumbers, RouterContext, RouterOptions};
use siphon_source::{SourceConfig, TableName};
use std::time::Duration;
use tokio::sync::watch;
use tracing::info;

fn encoding(name: EncodingName) -> Encoding {
    match name {
        EncodingName::Json => Encoding::Json,
        EncodingName::String => Encoding::String,
        EncodingName::JsonSchemas => Encoding::JsonSchemas,
        EncodingName::Binary => Encoding::Binary,
    }
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

/// The router: with Debezium's context headers when `topic.prefix` (the logical name they
/// carry) is set or `extended.headers.enabled` is explicitly true, as in Debezium 3.2+.
fn build_router(config: &Config) -> anyhow::Result<EventRouter> {
    let map = option_strings(&config.router, "router")?;
    let options = RouterOptions::from_map(&map).context("[router]")?;
    for warning in options.warnings() {
        tracing::warn!("[router] {warning}");
    }
    let format = Format {
        key: encoding(config.format.key),
        value: encoding(config.format.value),
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
    if wants_context {
        EventRouter::new_with_context(options, format, RouterContext::postgresql(run_id()))
            .context("[router]")
    } else {
        Ok(EventRouter::new(options, format))
    }
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
        status_interval: Duration::from_millis(config.source.status_interval_ms.max(10)),
        idle_wakeup_interval: Duration::from_secs(10),
        buffer_events: 4096,
        application_name: config.source.application_name.clone(),
    };
    let router = build_router(config)?;
    let sink = SinkConfig {
        bootstrap_servers: config.kafka.bootstrap_servers.clone(),
        properties: option_strings(&config.kafka.properties, "kafka.properties")?,
        topic_creation: TopicCreation {
            enabled: config.kafka.topic_creation.enabled,
            partitions: config.kafka.topic_creation.partitions,
            replication_factor: config.kafka.topic_creation.replication_factor,
        },
        discard: config.kafka.sink == SinkKind::Discard,
    };
    sink.client_properties()?;
    let on_error = match config.pipeline.on_error {
        OnError::Fail => ErrorPolicy::Fail,
        OnError::DeadLetter => ErrorPolicy::DeadLetter(DeadLetters::new(
            config.pipeline.dead_letter_topic.clone(),
            producer_max_bytes(&sink)?,
        )),
    };
    Ok(PipelineSettings {
        source,
        sink,
        router,
        on_error,
        stall_timeout: Duration::from_secs(config.source.stall_timeout_secs.max(1)),
        max_in_flight_records: config.pipeline.max_in_flight_records,
        max_in_flight_bytes: config.pipeline.max_in_flight_bytes,
        shutdown_timeout: Duration::from_secs(config.pipeline.shutdown_timeout_secs),
    })
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
pub async fn forward_signals(stop: watch::Sender<bool>) {
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
