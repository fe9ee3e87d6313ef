//! The `siphon` binary: transactional-outbox events from a PostgreSQL logical replication slot
//! to Kafka, with the slot confirmed only after Kafka acknowledged every record before it.
//!
//! # Invariants
//! - Exit status: 0 after a requested stop, 1 for invalid configuration or arguments, 2 for a
//!   definite runtime error; a transient error never ends the process.

use anyhow::Context;
use clap::{Parser, Subcommand};
use siphon::status::Render as _;
use siphon::{
    alloc, config, error, progress_record, publication_record, resend, settings, status,
    supervisor, telemetry, transfer,
};
use siphon_record::registered::key_subject;
use siphon_source::row_condition::{ConditionSource, RowCondition};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use tokio::sync::watch;
use tracing::info;

/// Transactional-outbox CDC: PostgreSQL logical replication to Kafka, Debezium-compatible.
#[derive(Parser, Debug)]
#[command(name = "siphon", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Stream outbox events to Kafka until SIGTERM/SIGINT.
    Run {
        /// Configuration file (TOML).
        #[arg(long, short, env = "SIPHON_CONFIG")]
        config: PathBuf,
    },
    /// Check a configuration file and the environment, without connecting (but to the schema
    /// registry, when one is configured).
    CheckConfig {
        /// Configuration file (TOML).
        #[arg(long, short, env = "SIPHON_CONFIG")]
        config: PathBuf,
    },
    /// Show the slot and the publication: position, retained WAL, lag, whether all is healthy.
    /// Exits 0 when healthy, 1 otherwise.
    Status {
        /// Configuration file (TOML).
        #[arg(long, short, env = "SIPHON_CONFIG")]
        config: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// After a publication gap (an outbox table taken out of the publication and added back, or
    /// the publication created again) was dealt with: record the publication as it is now, so
    /// that Siphon starts again. Creates no slot: when the slot does not exist (dropped to take
    /// a snapshot again, or not created yet), Siphon's next start creates it and needs nothing
    /// accepted, since a new slot has no gap.
    AcceptPublicationChange {
        /// Configuration file (TOML).
        #[arg(long, short, env = "SIPHON_CONFIG")]
        config: PathBuf,
    },
    /// Send the rows of an outbox table matching a condition again (same records, plus a
    /// `siphon.resend` header), chunk by chunk, while the running Siphon keeps streaming. Its
    /// progress is kept in the state topic: after a stop (even kill -9) run it again with the
    /// same arguments to resume. Exits 0 once every row was acknowledged by Kafka.
    Resend {
        /// Configuration file (TOML).
        #[arg(long, short, env = "SIPHON_CONFIG")]
        config: PathBuf,
        /// The outbox table, `schema.table` (one of source.tables).
        #[arg(long)]
        table: String,
        /// SQL condition on the table's rows, e.g. "created_at >= '2026-12-01'" (default:
        /// every row).
        #[arg(long = "where")]
        condition: Option<String>,
        /// Start this re-send even if one of the table with another condition is unfinished.
        #[arg(long)]
        restart: bool,
        /// At most this many rows a second (0: as fast as Kafka acknowledges).
        #[arg(long, default_value_t = 0)]
        max_rows_per_second: u64,
        /// Serve /metrics (the siphon_transfer_* series) on this address while it runs.
        #[arg(long)]
        metrics_listen: Option<String>,
    },
    /// Convert a Debezium connector configuration (Kafka Connect JSON) into a siphon.toml,
    /// printed on stdout; what cannot be carried over is listed on stderr.
    ImportDebezium {
        /// The connector configuration: `{"name": .., "config": {..}}` or the bare config map.
        file: PathBuf,
    },
}

/// Exit status for a definite runtime error (the log says what to fix).
const EXIT_DEFINITE: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Run { config } => return run(&config),
        Command::CheckConfig { config } => check_config(&config),
        Command::Status { config, json } => status(&config, json),
        Command::AcceptPublicationChange { config } => accept_publication_change(&config),
        Command::ImportDebezium { file } => import_debezium(&file),
        Command::Resend {
            config,
            table,
            condition,
            restart,
            max_rows_per_second,
            metrics_listen,
        } => {
            return resend(
                &config,
                &table,
                resend::Request {
                    table: match siphon_source::TableName::parse(&table) {
                        Ok(table) => table,
                        Err(e) => {
                            eprintln!("error: --table {table:?}: {e}");
                            return ExitCode::FAILURE;
                        }
                    },
                    condition: match condition
                        .as_deref()
                        .map(str::trim)
                        .filter(|c| !c.is_empty())
                    {
                        None => None,
                        Some(text) => match RowCondition::parse(text, ConditionSource::Operator) {
                            Ok(condition) => Some(condition),
                            Err(e) => {
                                eprintln!("error: --where: {e}");
                                return ExitCode::from(EXIT_DEFINITE);
                            }
                        },
                    },
                    signal: None,
                    restart,
                    max_rows_per_second,
                },
                metrics_listen.as_deref(),
            )
        }
    };
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn check_config(path: &Path) -> anyhow::Result<ExitCode> {
    let config = config::Config::load(path)?;
    let settings = settings::build(&config)?;
    println!(
        "configuration OK: slot {} publication {} tables {:?} -> {}",
        config.source.slot,
        config.source.publication,
        config.source.tables,
        config.kafka.bootstrap_servers
    );
    // The registry is the one server asked: a wrong URL or password would otherwise show only
    // at the first event.
    if let Some(registry) = &settings.registry {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        let url = &config.schema_registry.url;
        let level = runtime
            .block_on(registry.registry().compatibility())
            .with_context(|| format!("asking the schema registry at {url}"))?;
        let values = settings
            .subject_strategy
            .value_subject("<topic>", Some("<event type>"));
        let keys = if config.format.key == config::EncodingName::Avro {
            format!(", key schemas under {}", key_subject("<topic>"))
        } else {
            String::new()
        };
        println!(
            "schema registry {url} answers (compatibility {level}); value schemas are under {values}{keys}"
        );
        for (subject, version) in registry.pinned() {
            let found = runtime
                .block_on(registry.registry().version(subject, *version))
                .with_context(|| {
                    format!("schema_registry.versions: subject {subject:?} version {version}")
                })?;
            println!("{subject} version {version} is schema id {}", found.id);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn status(path: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let config = config::Config::load(path)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = runtime.block_on(status::slot_status(
        &config.source.url,
        &config.source.slot,
        &config.source.publication,
    ))?;
    let delivery = runtime.block_on(delivery_status(&config))?;
    // The initial snapshot's and the re-sends' progress, from the state topic (not part of
    // the verdict: a broker that does not answer only leaves them out).
    let transfers = match settings::build(&config) {
        Ok(settings) => runtime.block_on(transfer::recorded(&settings)),
        Err(_) => Ok(Vec::new()),
    };
    if json {
        let mut value: serde_json::Value = serde_json::from_str(&report.render_json()?)?;
        if let Some(object) = value.as_object_mut() {
            object.insert("delivery".into(), serde_json::to_value(&delivery)?);
        }
        if let (serde_json::Value::Object(map), Ok(transfers)) = (&mut value, &transfers) {
            map.insert("transfers".into(), serde_json::to_value(transfers)?);
        }
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{}", report.render_text());
        print!("{}", delivery.render_text());
        match &transfers {
            Ok(list) => {
                for progress in list {
                    println!("transfer: {}", transfer::describe(progress));
                }
            }
            Err(e) => println!("transfer: progress not read from the state topic: {e}"),
        }
    }
    Ok(if report.healthy().0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The delivery mode and, with exactly-once delivery, the last committed progress.
async fn delivery_status(
    config: &config::Config,
) -> anyhow::Result<progress_record::DeliveryStatus> {
    let settings = settings::build(config)?;
    let Some(exactly_once) = &settings.exactly_once else {
        return Ok(progress_record::DeliveryStatus::at_least_once());
    };
    let located = siphon_source::locate::locate(&settings.source.url).await?;
    let server = siphon_source::locate::identity(&located.client).await;
    let source =
        siphon::session::transactional::Source::new(&settings, exactly_once, server.as_ref())?;
    let value = exactly_once
        .progress_topic
        .read_committed(source.key.as_bytes())
        .await?;
    let committed = match value {
        Some(value) => Some(progress_record::Recorded::parse(&source.key, &value)?),
        None => None,
    };
    Ok(progress_record::DeliveryStatus::exactly_once(
        &source.transactional_id,
        exactly_once.progress_topic.topic(),
        committed,
    ))
}

fn accept_publication_change(path: &Path) -> anyhow::Result<ExitCode> {
    let config = config::Config::load(path)?;
    let settings = settings::build(&config)?;
    let Some(state) = &settings.state_topic else {
        anyhow::bail!("kafka.state_topic is \"\": Siphon keeps no record of the publication, so there is nothing to accept");
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let slot =
            siphon_source::prepare(&settings.source, siphon_source::MissingSlot::Leave).await?;
        publication_record::accept(
            state,
            slot.identity.as_ref().map(|s| s.system_id.as_str()),
            &settings.source.slot,
            &settings.source.publication,
            &slot.publication,
        )
        .await?;
        println!(
            "recorded publication {} as it is now for slot {} (in Kafka topic {}); Siphon starts from it",
            settings.source.publication,
            settings.source.slot,
            state.topic()
        );
        if !slot.exists {
            println!(
                "slot {} does not exist: Siphon's next start creates it (and takes the initial snapshot if source.snapshot = \"initial\"); a new slot has no publication gap, so that start records the publication itself",
                settings.source.slot
            );
        }
        anyhow::Ok(ExitCode::SUCCESS)
    })
}

fn resend(
    path: &Path,
    table: &str,
    request: resend::Request,
    metrics_listen: Option<&str>,
) -> ExitCode {
    let config = match load_with_logging(path) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let result = (|| -> anyhow::Result<Result<u64, resend::ResendError>> {
        let settings = settings::build(&config)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        runtime.block_on(async move {
            let metrics = Arc::new(telemetry::Metrics::new());
            // Kept until the re-send ends: the endpoint serves while it runs.
            let (_stop_tx, stop_rx) = watch::channel(false);
            if let Some(listen) = metrics_listen {
                let listener = telemetry::bind(listen)
                    .await
                    .with_context(|| format!("--metrics-listen {listen:?}"))?;
                if let Ok(address) = listener.local_addr() {
                    info!(%address, "metrics endpoint listening");
                }
                let server =
                    telemetry::serve(listener, Arc::clone(&metrics), metrics.health(), stop_rx);
                tokio::spawn(server);
            }
            Ok(resend::run(
                &settings,
                &metrics,
                &request,
                std::time::Duration::from_secs(config.pipeline.max_backoff_secs),
            )
            .await)
        })
    })();
    match result {
        Ok(Ok(rows)) => {
            println!("re-sent {rows} rows of {table}; every one acknowledged by Kafka");
            ExitCode::SUCCESS
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "re-send stopped");
            eprintln!("error: {e}");
            ExitCode::from(EXIT_DEFINITE)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn import_debezium(path: &Path) -> anyhow::Result<ExitCode> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let imported = siphon_import_debezium::import_debezium(&text)?;
    print!("{}", imported.toml);
    for note in &imported.notes {
        eprintln!("note: {note}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The configuration at `path`, with logging set up as it says; a configuration that does not
/// load is told on stderr (no logging yet) as exit status 1.
fn load_with_logging(path: &Path) -> Result<config::Config, ExitCode> {
    match config::Config::load(path) {
        Ok(config) => {
            settings::init_logging(config.log.format);
            Ok(config)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            Err(ExitCode::FAILURE)
        }
    }
}

fn run(path: &Path) -> ExitCode {
    // Before any thread starts.
    let allocator_tuned = alloc::tune();
    let config = match load_with_logging(path) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let result = (|| -> anyhow::Result<Result<(), error::PipelineError>> {
        let settings = settings::build(&config)?;
        // One thread for the data path: the replication reader, the session and its SQL tasks
        // hand events to each other as task switches, not cross-thread wake-ups (librdkafka
        // keeps its own threads; blocking work goes to the blocking pool).
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        runtime.block_on(async move {
            let (stop_tx, stop_rx) = watch::channel(false);
            let stop_tx = Arc::new(stop_tx);
            tokio::spawn(settings::forward_signals(Arc::clone(&stop_tx)));
            info!(version = env!("CARGO_PKG_VERSION"), "siphon starting");
            if allocator_tuned {
                tracing::debug!(
                    mmap_bytes = alloc::MMAP_THRESHOLD_BYTES,
                    trim_bytes = alloc::TRIM_THRESHOLD_BYTES,
                    "allocations of the first size or more are mapped on their own; free heap beyond the second is given back"
                );
            }
            if settings.sink.discard {
                tracing::warn!("kafka.sink = \"discard\": records are acknowledged without being sent anywhere (for measurements only)");
            }
            let metrics = Arc::new(telemetry::Metrics::new());
            if config.metrics.enabled {
                let listener = telemetry::bind(&config.metrics.listen)
                    .await
                    .with_context(|| format!("metrics.listen = {:?}", config.metrics.listen))?;
                if let Ok(address) = listener.local_addr() {
                    info!(%address, "metrics and health endpoint listening");
                }
                let server = telemetry::serve(listener, Arc::clone(&metrics), metrics.health(), stop_rx.clone());
                tokio::spawn(async move {
                    if let Err(e) = server.await {
                        tracing::error!(error = %e, "metrics endpoint stopped");
                    }
                });
            }
            // Re-sends asked for in the signal table, beside the stream (with settings of their
            // own: the supervisor owns these).
            let signals = match settings.snapshot.signal_table.clone() {
                Some(signals) => {
                    let own = settings::build(&config)?;
                    let max_backoff = std::time::Duration::from_secs(config.pipeline.max_backoff_secs);
                    Some(tokio::spawn(siphon::signal::watch(own, Arc::clone(&metrics), signals, max_backoff, stop_rx.clone())))
                }
                None => None,
            };
            let supervised = supervisor::supervise(
                settings,
                metrics,
                std::time::Duration::from_secs(config.pipeline.max_backoff_secs),
                stop_rx,
            );
            tokio::pin!(supervised);
            let refused = async {
                match signals {
                    Some(watcher) => match watcher.await {
                        Ok(Err(e)) => e,
                        _ => std::future::pending().await,
                    },
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                result = &mut supervised => Ok(result),
                // The signal table refused what only the operator can cure: stop, naming it.
                e = refused => {
                    tracing::error!(error = %e, "the signal table cannot be used; stopping");
                    let _ = stop_tx.send(true);
                    let _ = supervised.await;
                    Ok(Err(error::PipelineError::Source(e)))
                }
            }
        })
    })();
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(_)) => ExitCode::from(EXIT_DEFINITE),
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}
