//! Command-line options of the benchmark.

use clap::Parser;
use std::path::PathBuf;

/// Measures Siphon against the physical limit of a logical replication slot: drains one
/// backlog with pg_recvlogical, with Siphon to Kafka and with Siphon's discard sink, then
/// measures commit-to-ack latency under a steady load. Prints a table and writes JSON.
#[derive(Debug, Parser)]
#[command(name = "bench")]
pub struct Args {
    /// Outbox events in the backlog.
    #[arg(long, default_value_t = 1_000_000)]
    pub events: u64,

    /// Events per backlog transaction (each transaction also deletes its rows).
    #[arg(long, default_value_t = 1_000)]
    pub txn_events: u64,

    /// Seconds of steady load in the latency phase (0 skips the phase).
    #[arg(long, default_value_t = 60)]
    pub latency_secs: u64,

    /// Events per second in the latency phase.
    #[arg(long, default_value_t = 5_000)]
    pub latency_rate: u64,

    /// Events per transaction in the latency phase.
    #[arg(long, default_value_t = 100)]
    pub latency_txn_events: u64,

    /// Client connections writing in the latency phase.
    #[arg(long, default_value_t = 4)]
    pub latency_writers: u64,

    /// Use this PostgreSQL (a superuser or a user with REPLICATION that may create a schema)
    /// instead of starting a scratch cluster. Its server needs wal_level=logical.
    #[arg(long)]
    pub pg_url: Option<String>,

    /// Use this Kafka bootstrap list instead of starting a Tansu broker.
    #[arg(long)]
    pub bootstrap: Option<String>,

    /// The pg_recvlogical binary (default: the newest /usr/lib/postgresql/*/bin/pg_recvlogical).
    #[arg(long)]
    pub pg_recvlogical: Option<PathBuf>,

    /// Also write the JSON result here (it always goes to target/bench/result.json).
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Give up on a drain after this many seconds.
    #[arg(long, default_value_t = 1_800)]
    pub drain_timeout_secs: u64,
}

impl Args {
    /// Checks the combinations clap cannot express.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.events > 0, "--events must be positive");
        anyhow::ensure!(self.txn_events > 0, "--txn-events must be positive");
        anyhow::ensure!(
            self.latency_txn_events > 0 && self.latency_writers > 0 && self.latency_rate > 0,
            "--latency-rate, --latency-txn-events and --latency-writers must be positive"
        );
        anyhow::ensure!(
            self.latency_rate >= self.latency_txn_events,
            "--latency-rate must be at least --latency-txn-events (one transaction per second)"
        );
        Ok(())
    }
}
