//! Turns the configuration into the pieces the pipeline runs with; logging and signals.
//!
//! # Invariants
//! - Everything that can be checked without connecting is checked here, before any connection.

use crate::config::{option_strings, Config, EncodingName, LogFormat};
use crate::pipeline::PipelineSettings;
use anyhow::Context;
use siphon_kafka_sink::{SinkConfig, TopicCreation};
use siphon_router::{Encoding, EventRouter, Format, RouterOptions};
use siphon_source::{SourceConfig, TableName};
use std::time::Duration;
use tokio::sync::watch;
use tracing::info;

fn encoding(name: EncodingName) -> Encoding {
    match name {
        EncodingName::Json => Encoding::Json,
        EncodingName::String => Encoding::String,
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
    let router_options =
        RouterOptions::from_map(&option_strings(&config.router, "router")?).context("[router]")?;
    let router = EventRouter::new(
        router_options,
        Format {
            key: encoding(config.format.key),
            value: encoding(config.format.value),
        },
    );
    let sink = SinkConfig {
        bootstrap_servers: config.kafka.bootstrap_servers.clone(),
        properties: option_strings(&config.kafka.properties, "kafka.properties")?,
        topic_creation: TopicCreation {
            enabled: config.kafka.topic_creation.enabled,
            partitions: config.kafka.topic_creation.partitions,
            replication_factor: config.kafka.topic_creation.replication_factor,
        },
    };
    sink.client_properties()?;
    Ok(PipelineSettings {
        source,
        sink,
        router,
        max_in_flight_records: config.pipeline.max_in_flight_records,
        max_in_flight_bytes: config.pipeline.max_in_flight_bytes,
        shutdown_timeout: Duration::from_secs(config.pipeline.shutdown_timeout_secs),
    })
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
