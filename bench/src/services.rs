//! The PostgreSQL server and Kafka broker the benchmark runs against: given by URL and
//! bootstrap list, or started here (and stopped when [`Services`] is dropped); and the schema
//! registry of the Avro rows, a rivven-schema started here.
//!
//! The broker started here is an Apache Kafka node of the bench's own (one KRaft node in
//! combined mode with the test harness's single-node settings, [`Broker::start_own`]), whose JVM
//! runs with [`KAFKA_JVM_OPTS`], the options of Kafka's own start scripts, instead of the
//! harness's quick-start ones: the broker is measured as it runs in production.

use super::procstat;
use anyhow::{bail, Context as _, Result};
use siphon_tests::kafka::KAFKA_VERSION;
use siphon_tests::{Broker, Postgres, RegistryServer};
use std::path::PathBuf;

/// JVM options of the broker the bench starts (`$SIPHON_BENCH_KAFKA_JVM_OPTS` replaces them):
/// those `bin/kafka-server-start.sh` and `bin/kafka-run-class.sh` give a broker, a 1 GiB heap,
/// G1 and the full JIT (the harness's test nodes stop at the client compiler).
pub const KAFKA_JVM_OPTS: &str = "-Xms1g -Xmx1g -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
     -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true";

/// The JVM options the bench's own broker gets.
pub fn kafka_jvm_opts() -> String {
    std::env::var("SIPHON_BENCH_KAFKA_JVM_OPTS")
        .ok()
        .filter(|o| !o.trim().is_empty())
        .unwrap_or_else(|| KAFKA_JVM_OPTS.to_owned())
}

pub struct Services {
    /// Kept only to be stopped on drop.
    _pg: Option<Postgres>,
    /// Kept only to be stopped on drop.
    _broker: Option<Broker>,
    pub pg_url: String,
    pub bootstrap: String,
    pub recvlogical: PathBuf,
    /// What the result tables call the broker.
    pub broker_name: String,
    /// The broker's process on this host, when known: its CPU time and memory are reported.
    pub broker_pid: Option<u32>,
    /// The GC log of the bench's own broker ([`super::gc_log`]).
    pub broker_gc_log: Option<PathBuf>,
    /// The schema registry of the Avro rows, or why there is none.
    pub registry: std::result::Result<RegistryServer, String>,
}

impl Services {
    /// Starts what was not given. Blocks while the services start. A broker given with
    /// `bootstrap` is called `broker_name` in the tables; its process is the one listening on
    /// the first address's port, when that address is this host's loopback.
    ///
    /// The bench's own broker gets the JVM options of `SIPHON_BROKER_JVM_OPTS`, which the
    /// bench's `main` sets to [`kafka_jvm_opts`].
    ///
    /// With `registry`, a rivven-schema registry is started too ([`start_registry`]); when it
    /// cannot be, [`Services::registry`] says why and the run goes on without it.
    pub fn start(
        pg_url: Option<String>,
        bootstrap: Option<String>,
        broker_name: Option<String>,
        recvlogical: Option<PathBuf>,
        registry: bool,
    ) -> Result<Services> {
        let recvlogical = match recvlogical {
            Some(p) => p,
            None => find_recvlogical()?,
        };
        let (pg, pg_url) = match pg_url {
            Some(url) => (None, url),
            None => {
                let pg = Postgres::start().context("starting a scratch PostgreSQL")?;
                let url = pg.url();
                (Some(pg), url)
            }
        };
        let (broker, bootstrap, broker_name, broker_pid, broker_gc_log) = match bootstrap {
            Some(b) => {
                let name = broker_name.unwrap_or_else(|| format!("Kafka at {b} (--bootstrap)"));
                let pid = loopback_port(&b).and_then(procstat::listener_pid);
                (None, b, name, pid, None)
            }
            None => {
                let broker = Broker::start_own(&[]).context("starting Apache Kafka")?;
                let pid = broker.own_node()?.pid();
                let gc_log = broker.own_node()?.dir().join(super::gc_log::FILE);
                let name = broker_name.unwrap_or_else(|| {
                    format!(
                        "Apache Kafka {KAFKA_VERSION} (one KRaft node of the bench's own; JVM {})",
                        kafka_jvm_opts()
                    )
                });
                let b = broker.bootstrap();
                (Some(broker), b, name, pid, Some(gc_log))
            }
        };
        let registry = if registry {
            start_registry().map_err(|e| format!("skipped: {e:#}"))
        } else {
            Err("skipped: --no-avro".to_owned())
        };
        Ok(Services {
            _pg: pg,
            _broker: broker,
            pg_url,
            bootstrap,
            recvlogical,
            broker_name,
            broker_pid,
            broker_gc_log,
            registry,
        })
    }

    /// Whether the broker is the bench's own (not given with `--bootstrap`).
    pub fn owns_broker(&self) -> bool {
        self._broker.is_some()
    }

    /// Connects to the database; the connection runs on a spawned task.
    pub async fn connect(&self) -> Result<tokio_postgres::Client> {
        let (client, connection) = tokio_postgres::connect(&self.pg_url, tokio_postgres::NoTls)
            .await
            .with_context(|| format!("connecting to {}", self.pg_url))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }
}

/// A rivven-schema registry (from `scripts/install-deps.sh`) whose compatibility level is
/// `NONE`: the Avro rows register the expanded payload's record and, on the same subject, the
/// plain payload's string, which the registry's default `BACKWARD` level would refuse.
fn start_registry() -> Result<RegistryServer> {
    let registry = RegistryServer::start()?;
    let (status, body) =
        siphon_tests::http::put_json(registry.port(), "/config", r#"{"compatibility":"NONE"}"#)
            .context("setting the registry's compatibility level")?;
    if status != 200 {
        bail!("setting the registry's compatibility level: {status} {body}");
    }
    Ok(registry)
}

/// The port of a bootstrap list's first address if that address is this host's loopback.
fn loopback_port(bootstrap: &str) -> Option<u16> {
    let first = bootstrap.split(',').next()?.trim();
    let (host, port) = first.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    matches!(host, "127.0.0.1" | "localhost" | "::1")
        .then(|| port.parse().ok())
        .flatten()
}

/// `$SIPHON_PG_BIN/pg_recvlogical`, else the newest `/usr/lib/postgresql/*/bin/pg_recvlogical`.
fn find_recvlogical() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("SIPHON_PG_BIN").filter(|d| !d.is_empty()) {
        let p = PathBuf::from(dir).join("pg_recvlogical");
        if p.is_file() {
            return Ok(p);
        }
        bail!("{} does not exist", p.display());
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .context("listing /usr/lib/postgresql (is PostgreSQL installed? scripts/install-deps.sh)")?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let p = e.path().join("bin/pg_recvlogical");
            p.is_file().then_some((version, p))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, p)) => Ok(p),
        None => bail!("no /usr/lib/postgresql/*/bin/pg_recvlogical; pass --pg-recvlogical"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_loopback_bootstrap_names_a_local_port() {
        assert_eq!(loopback_port("127.0.0.1:9092"), Some(9092));
        assert_eq!(loopback_port("localhost:19092,other:9092"), Some(19092));
        assert_eq!(loopback_port("[::1]:9093"), Some(9093));
        assert_eq!(loopback_port("kafka:9092"), None);
        assert_eq!(loopback_port("127.0.0.1"), None);
    }
}
