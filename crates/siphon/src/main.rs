//! The `siphon` binary: transactional-outbox events from a PostgreSQL logical replication slot
//! to Kafka, with the slot confirmed only after Kafka acknowledged every record before it.

mod ack;
mod config;
mod dead_letter;
mod error;
mod pipeline;
mod settings;
mod supervisor;
mod window;

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
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
    /// Check a configuration file and print the effective settings, without connecting.
    CheckConfig {
        /// Configuration file (TOML).
        #[arg(long, short, env = "SIPHON_CONFIG")]
        config: PathBuf,
    },
}

/// Exit status for a definite runtime error (the log says what to fix).
const EXIT_DEFINITE: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run { config } => run(&config),
        Command::CheckConfig { config } => match config::Config::load(&config)
            .and_then(|c| settings::build(&c).map(|_| c))
        {
            Ok(c) => {
                println!(
                    "configuration OK: slot {} publication {} tables {:?} -> {}",
                    c.source.slot, c.source.publication, c.source.tables, c.kafka.bootstrap_servers
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

fn run(path: &std::path::Path) -> ExitCode {
    let config = match config::Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    settings::init_logging(config.log.format);
    let result = (|| -> anyhow::Result<Result<(), error::PipelineError>> {
        let settings = settings::build(&config)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        Ok(runtime.block_on(async move {
            let (stop_tx, stop_rx) = watch::channel(false);
            tokio::spawn(settings::forward_signals(stop_tx));
            info!(version = env!("CARGO_PKG_VERSION"), "siphon starting");
            if settings.sink.discard {
                tracing::warn!("kafka.sink = \"discard\": records are acknowledged without being sent anywhere (for measurements only)");
            }
            supervisor::supervise(
                settings,
                std::time::Duration::from_secs(config.pipeline.max_backoff_secs),
                stop_rx,
            )
            .await
        }))
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
