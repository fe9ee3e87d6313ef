//! Command-line options of the benchmark.

use clap::Parser;
use std::path::PathBuf;

/// Measures Siphon against the physical limit of a logical replication slot: drains one
/// backlog with pg_recvlogical, with Siphon to Kafka (at-least-once and exactly-once), with
/// Siphon's discard sink, with Siphon writing Avro through a schema registry and with
/// Debezium's embedded engine (when Java and its jars are installed), optionally again under a CPU hog (--contention), then measures commit-to-ack
/// latency under a steady load next to the broker's own produce latency, at-least-once and
/// then exactly-once. Prints a table and writes JSON.
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

    /// Events per second in the latency phase (the latency target is stated at 10,000).
    #[arg(long, default_value_t = 10_000)]
    pub latency_rate: u64,

    /// Events per second in the exactly-once latency phase (its p99 is stated at 5,000).
    #[arg(long, default_value_t = 5_000)]
    pub eos_latency_rate: u64,

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

    /// Use this Kafka bootstrap list instead of starting an Apache Kafka node of the bench's own.
    /// Its broker's CPU time and memory are reported when its first address is this host's
    /// loopback (the process listening on that port).
    #[arg(long)]
    pub bootstrap: Option<String>,

    /// What the result tables call the broker, e.g. "Apache Kafka 3.9.1, 3 nodes" for a
    /// --bootstrap one (default: "Apache Kafka <version> ..." for the bench's own node, the
    /// bootstrap list for another).
    #[arg(long)]
    pub broker_name: Option<String>,

    /// The pg_recvlogical binary (default: the newest /usr/lib/postgresql/*/bin/pg_recvlogical).
    #[arg(long)]
    pub pg_recvlogical: Option<PathBuf>,

    /// Also write the JSON result here (it always goes to target/bench/result.json).
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Give up on a drain after this many seconds.
    #[arg(long, default_value_t = 1_800)]
    pub drain_timeout_secs: u64,

    /// Also drain the backlog with pg_recvlogical, Siphon to the broker and Siphon's discard
    /// sink while a program of two busy threads competes for the CPU, and compare them.
    #[arg(long)]
    pub contention: bool,

    /// With --contention: run the two busy threads inside the bench process instead of a
    /// program of their own.
    #[arg(long)]
    pub hog_in_process: bool,

    /// Skip the Debezium row (it needs Java and the jars of scripts/install-debezium.sh).
    #[arg(long)]
    pub no_debezium: bool,

    /// Skip the Avro rows (Siphon writing `format.value = "avro"` through a rivven-schema
    /// registry the bench starts, with expanded payloads and without) and the expanded JSON row
    /// they are compared with.
    #[arg(long)]
    pub no_avro: bool,

    /// Skip the exactly-once rows: the drain with `kafka.delivery = "exactly-once"` and its
    /// latency phase.
    #[arg(long)]
    pub no_exactly_once: bool,

    /// Skip the Debezium-on-Connect rows (a standalone Kafka Connect worker with Debezium's
    /// connector, from scripts/install-connect.sh).
    #[arg(long)]
    pub no_connect: bool,

    /// Skip the all-operations publication's drains (publish = 'insert, update, delete': the
    /// DELETE of every outbox row crosses the wire), run beside the insert-only ones.
    #[arg(long)]
    pub no_all_operations: bool,

    /// Also measure pg_recvlogical's events/s with 1, 2 and 4 slots drained in parallel on
    /// the server, each behind its own outbox table and publication (see "Scaling past one
    /// slot" in docs/performance.md).
    #[arg(long)]
    pub slots_scaling: bool,

    /// Events behind each slot in the --slots-scaling rounds (default: --events).
    #[arg(long)]
    pub scaling_events: Option<u64>,

    /// Records written to the bench's own broker before anything is measured, to warm its JVM
    /// up (see "The backlog" in docs/performance.md).
    #[arg(long, default_value_t = crate::warm_up::WARM_UP_RECORDS)]
    pub warm_up_records: u64,

    /// Then Siphon drains backlogs of its own to the bench's own broker, round after round,
    /// until the broker's JIT compiler threads took at most 10 % of its CPU in two rounds in a
    /// row, at most this many rounds (0: none).
    #[arg(long, default_value_t = crate::warm_up::MAX_DRAINS)]
    pub warm_up_drains: u32,

    /// Events behind each warm-up drain.
    #[arg(long, default_value_t = crate::warm_up::DRAIN_EVENTS)]
    pub warm_up_drain_events: u64,
}

impl Args {
    /// Checks the combinations clap cannot express.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.events > 0, "--events must be positive");
        anyhow::ensure!(self.txn_events > 0, "--txn-events must be positive");
        anyhow::ensure!(
            self.scaling_events != Some(0),
            "--scaling-events must be positive"
        );
        anyhow::ensure!(
            self.latency_txn_events > 0 && self.latency_writers > 0 && self.latency_rate > 0,
            "--latency-rate, --latency-txn-events and --latency-writers must be positive"
        );
        anyhow::ensure!(
            self.latency_rate >= self.latency_txn_events,
            "--latency-rate must be at least --latency-txn-events (one transaction per second)"
        );
        anyhow::ensure!(
            self.eos_latency_rate >= self.latency_txn_events,
            "--eos-latency-rate must be at least --latency-txn-events (one transaction per second)"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
    }

    #[test]
    fn defaults() -> anyhow::Result<()> {
        let a = parse(&[])?;
        assert_eq!(a.events, 1_000_000);
        assert_eq!(a.latency_secs, 60);
        assert!(!a.contention);
        assert!(!a.no_debezium);
        assert_eq!(a.eos_latency_rate, 5_000);
        assert!(!a.no_exactly_once);
        a.validate()
    }

    #[test]
    fn contention_and_debezium_switches() -> anyhow::Result<()> {
        let a = parse(&["--events", "20000", "--latency-secs", "5", "--contention"])?;
        assert_eq!((a.events, a.latency_secs), (20_000, 5));
        assert!(a.contention);
        let a = parse(&["--no-debezium"])?;
        assert!(a.no_debezium && !a.contention && !a.no_avro);
        assert!(parse(&["--no-avro"])?.no_avro);
        assert!(a.bootstrap.is_none() && a.broker_name.is_none());
        let a = parse(&[
            "--bootstrap",
            "127.0.0.1:9092",
            "--broker-name",
            "Kafka 3.9",
        ])?;
        assert_eq!(a.bootstrap.as_deref(), Some("127.0.0.1:9092"));
        assert_eq!(a.broker_name.as_deref(), Some("Kafka 3.9"));
        assert!(parse(&["--contention=yes"]).is_err());
        let a = parse(&["--slots-scaling", "--scaling-events", "5000"])?;
        assert!(a.slots_scaling && a.scaling_events == Some(5000));
        assert!(!a.no_connect && !a.no_all_operations);
        assert!(parse(&["--scaling-events", "0"])?.validate().is_err());
        let a = parse(&["--no-exactly-once", "--eos-latency-rate", "2000"])?;
        assert!(a.no_exactly_once && a.eos_latency_rate == 2_000);
        Ok(())
    }

    #[test]
    fn rejects_what_clap_cannot() -> anyhow::Result<()> {
        assert!(parse(&["--events", "0"])?.validate().is_err());
        assert!(
            parse(&["--latency-rate", "10", "--latency-txn-events", "100"])?
                .validate()
                .is_err()
        );
        assert!(parse(&["--eos-latency-rate", "0"])?.validate().is_err());
        Ok(())
    }
}
